//! memknobs: keeps writing to every page of an anonymous buffer whose size
//! follows a phase pattern, and reports the MiB touched per second:
//!
//!     memknobs t=12 phase=1 size_mib=200 mib_per_s=1234.5
//!
//! `t` is seconds since start, `phase` the 1-based index of the current phase.
//! When a phase shrinks the buffer the excess pages go back to the kernel.

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use memtide_workloads::cli::{self, Command};
use memtide_workloads::pattern::Phase;
use memtide_workloads::region::Region;
use memtide_workloads::report::{self, Meter, Ticker};

const NAME: &str = "memknobs";
const MIB: usize = 1 << 20;

/// Written by the touching thread, read by the reporting thread. Reporting
/// runs separately so that lines keep coming while touching stalls on swap.
#[derive(Default)]
struct Progress {
    touched_mib: AtomicU64,
    phase: AtomicUsize,
    size_mib: AtomicU64,
}

fn main() -> ExitCode {
    let options = match cli::parse(std::env::args().skip(1)) {
        Ok(Command::Run(options)) => options,
        Ok(Command::Help) => {
            println!("{}", cli::usage(NAME));
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("{NAME}: {message}\n{}", cli::usage(NAME));
            return ExitCode::from(2);
        }
    };
    let peak = options
        .pattern
        .iter()
        .map(Phase::size_bytes)
        .max()
        .unwrap_or(0);
    let mut region = match Region::new(peak) {
        Ok(region) => region,
        Err(err) => {
            eprintln!("{NAME}: cannot map {peak} bytes: {err}");
            return ExitCode::FAILURE;
        }
    };

    let progress = Arc::new(Progress::default());
    thread::spawn({
        let progress = Arc::clone(&progress);
        move || report_forever(&progress, options.interval)
    });

    let runs = if options.once {
        options.pattern.len()
    } else {
        usize::MAX
    };
    let mut held = 0;
    for (index, phase) in options.pattern.iter().enumerate().cycle().take(runs) {
        let size = phase.size_bytes();
        if size < held {
            if let Err(err) = region.release(size..held) {
                eprintln!("{NAME}: cannot release memory: {err}");
                return ExitCode::FAILURE;
            }
        }
        held = size;
        progress.phase.store(index + 1, Relaxed);
        progress.size_mib.store(phase.size_mib, Relaxed);
        touch_until(
            &mut region,
            size,
            Instant::now() + phase.duration(),
            &progress.touched_mib,
        );
    }
    ExitCode::SUCCESS
}

/// Touches the first `size` bytes of `region` over and over, one MiB at a
/// time, until `deadline`.
fn touch_until(region: &mut Region, size: usize, deadline: Instant, touched_mib: &AtomicU64) {
    if size == 0 {
        thread::sleep(deadline.saturating_duration_since(Instant::now()));
        return;
    }
    let mut pass = 0;
    let mut offset = 0;
    while Instant::now() < deadline {
        // A new value on each pass keeps every page dirty.
        region.touch(offset..offset + MIB, pass);
        touched_mib.fetch_add(1, Relaxed);
        offset += MIB;
        if offset == size {
            (offset, pass) = (0, pass + 1);
        }
    }
}

fn report_forever(progress: &Progress, interval: Duration) {
    let mut ticker = Ticker::new(interval);
    let mut meter = Meter::new(Instant::now(), 0);
    loop {
        let t = ticker.wait();
        let mib_per_s = meter.rate(Instant::now(), progress.touched_mib.load(Relaxed));
        report::emit(&report::format_line(
            NAME,
            &[
                ("t", &t.as_secs()),
                ("phase", &progress.phase.load(Relaxed)),
                ("size_mib", &progress.size_mib.load(Relaxed)),
                ("mib_per_s", &format!("{mib_per_s:.1}")),
            ],
        ));
    }
}
