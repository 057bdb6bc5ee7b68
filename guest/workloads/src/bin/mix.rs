//! mix: runs phases of different kinds in turn: an anonymous working set
//! (pages written over and over, as memknobs does), a page cache working set
//! (random block reads of a file set, as filecache does), anonymous memory
//! written once and held to the end (cold memory only a working-set estimate
//! finds) or idle. Reports the
//! current phase and its throughput (MiB of pages written or MiB read per
//! second), with the guest's page cache refaults since the previous line:
//!
//!     mix setup file=/data/fileset wrote_mib=80 secs=1.2
//!     mix t=12 phase=2 kind=file size_mib=80 mib_per_s=345.6 refaults=0
//!
//! The setup line comes once, when there is a file phase, after the file set
//! was created or extended. `t` is seconds since the first phase started.

use std::process::ExitCode;
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use memtide_workloads::anon;
use memtide_workloads::cli::{self, mix::Options};
use memtide_workloads::fileset::FileSet;
use memtide_workloads::pattern::{Kind, MixPhase};
use memtide_workloads::progress::{PhaseMeter, Progress};
use memtide_workloads::region::Region;
use memtide_workloads::report::{self, Schedule, Ticker};
use memtide_workloads::vmstat::{self, Counter};

const NAME: &str = "mix";

fn main() -> ExitCode {
    let options: Options = match cli::from_env(NAME, cli::mix::parse, cli::mix::usage) {
        Ok(options) => options,
        Err(code) => return code,
    };
    let peak = |kind| {
        options
            .phases
            .iter()
            .filter(|p| p.kind == kind)
            .map(|p| p.phase.size_bytes())
            .max()
    };
    let mut file_set = match peak(Kind::File).map(|bytes| prepare(&options, bytes as u64)) {
        Some(Ok(file_set)) => Some(file_set),
        Some(Err(code)) => return code,
        None => None,
    };

    let progress = Arc::new(Progress::new());
    let ticker = Ticker::new(options.interval);
    let mut schedule = Schedule::new(&ticker);
    thread::spawn({
        let progress = Arc::clone(&progress);
        let phases = options.phases.clone();
        move || report_forever(&progress, &phases, ticker)
    });

    // What hold phases wrote: kept, untouched, until the program exits.
    let mut held = Vec::new();
    let runs = if options.once {
        options.phases.len()
    } else {
        usize::MAX
    };
    for (index, MixPhase { kind, phase }) in options.phases.iter().enumerate().cycle().take(runs) {
        progress.start_phase(index + 1);
        let deadline = schedule.next(phase.duration());
        match kind {
            // Each anonymous phase allocates its own buffer, freed when the phase ends.
            Kind::Anon => {
                let size = phase.size_bytes();
                let Some(mut region) = map(size) else {
                    return ExitCode::FAILURE;
                };
                anon::touch_until(&mut region, size, Some(deadline), &progress)
            }
            Kind::File => {
                let file_set = file_set.as_mut().expect("prepared for the file phases");
                let set = phase.size_bytes() as u64;
                if let Err(err) = file_set.read_until(set, Some(deadline), &progress) {
                    eprintln!(
                        "{NAME}: cannot read {}: {err}",
                        options.file_set.path.display()
                    );
                    return ExitCode::FAILURE;
                }
            }
            Kind::Hold => {
                let size = phase.size_bytes();
                let Some(mut region) = map(size) else {
                    return ExitCode::FAILURE;
                };
                anon::touch_once(&mut region, size, &progress);
                held.push(region);
                thread::sleep(deadline.saturating_duration_since(Instant::now()));
            }
            Kind::Idle => thread::sleep(deadline.saturating_duration_since(Instant::now())),
        }
    }
    ExitCode::SUCCESS
}

/// Maps `size` bytes of anonymous memory, saying why when it cannot.
fn map(size: usize) -> Option<Region> {
    Region::new(size)
        .inspect_err(|err| eprintln!("{NAME}: cannot map {size} bytes: {err}"))
        .ok()
}

/// Opens the file set, writing it up to `bytes` if needed, with a setup line.
fn prepare(options: &Options, bytes: u64) -> Result<FileSet, ExitCode> {
    let path = &options.file_set.path;
    let started = Instant::now();
    match FileSet::prepare(path, bytes, options.file_set.block_bytes) {
        Ok((file_set, wrote)) => {
            report::emit(&report::format_line(
                &format!("{NAME} setup"),
                &[
                    ("file", &path.display()),
                    ("wrote_mib", &(wrote >> 20)),
                    ("secs", &format!("{:.1}", started.elapsed().as_secs_f64())),
                ],
            ));
            Ok(file_set)
        }
        Err(err) => {
            eprintln!("{NAME}: cannot prepare {}: {err}", path.display());
            Err(ExitCode::FAILURE)
        }
    }
}

fn report_forever(progress: &Progress, phases: &[MixPhase], mut ticker: Ticker) {
    let mut meter = PhaseMeter::default();
    let mut refaults = Counter::new(vmstat::REFAULT_FILE);
    loop {
        let t = ticker.wait();
        let now = progress.snapshot();
        let MixPhase { kind, phase } = phases[now.phase - 1];
        report::emit(&report::format_line(
            NAME,
            &[
                ("t", &t.as_secs()),
                ("phase", &now.phase),
                ("kind", &kind.name()),
                ("size_mib", &phase.size_mib),
                ("mib_per_s", &report::mib_per_s(meter.mib_per_s(now))),
                ("refaults", &report::optional(refaults.delta())),
            ],
        ));
    }
}
