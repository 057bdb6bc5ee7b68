//! memknobs: keeps writing to every page of an anonymous buffer whose size
//! follows a phase pattern, and reports the MiB of pages written per second:
//!
//!     memknobs t=12 phase=1 size_mib=200 mib_per_s=1234.5
//!
//! `t` is seconds since start, `phase` the 1-based index of the current phase.
//! Each phase allocates its own buffer (counted in Committed_AS, as MOM's memknobs
//! was run anew for each size), after the previous one went back to the kernel.

use std::process::ExitCode;
use std::sync::Arc;
use std::thread;

use memtide_workloads::anon;
use memtide_workloads::cli::{self, memknobs::Options};
use memtide_workloads::pattern::Phase;
use memtide_workloads::progress::{PhaseMeter, Progress};
use memtide_workloads::region::Region;
use memtide_workloads::report::{self, Schedule, Ticker};

const NAME: &str = "memknobs";

fn main() -> ExitCode {
    let options: Options = match cli::from_env(NAME, cli::memknobs::parse, cli::memknobs::usage) {
        Ok(options) => options,
        Err(code) => return code,
    };
    let progress = Arc::new(Progress::new());
    let ticker = Ticker::new(options.interval);
    let mut schedule = Schedule::new(&ticker);
    thread::spawn({
        let progress = Arc::clone(&progress);
        let pattern = options.pattern.clone();
        move || report_forever(&progress, &pattern, ticker)
    });

    let runs = if options.once {
        options.pattern.len()
    } else {
        usize::MAX
    };
    for (index, phase) in options.pattern.iter().enumerate().cycle().take(runs) {
        let size = phase.size_bytes();
        let mut region = match Region::new(size) {
            Ok(region) => region,
            Err(err) => {
                eprintln!("{NAME}: cannot map {size} bytes: {err}");
                return ExitCode::FAILURE;
            }
        };
        progress.start_phase(index + 1);
        let deadline = schedule.next(phase.duration());
        anon::touch_until(&mut region, size, Some(deadline), &progress);
    }
    ExitCode::SUCCESS
}

fn report_forever(progress: &Progress, pattern: &[Phase], mut ticker: Ticker) {
    let mut meter = PhaseMeter::default();
    loop {
        let t = ticker.wait();
        let now = progress.snapshot();
        report::emit(&report::format_line(
            NAME,
            &[
                ("t", &t.as_secs()),
                ("phase", &now.phase),
                ("size_mib", &pattern[now.phase - 1].size_mib),
                ("mib_per_s", &report::mib_per_s(meter.mib_per_s(now))),
            ],
        ));
    }
}
