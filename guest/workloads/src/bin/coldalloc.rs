//! coldalloc: allocates a large buffer and writes each page once (the cold
//! part: committed, never used again), then writes to every page of a small
//! hot buffer over and over, forever (`--cold-random-pct` fills part of each
//! cold page with incompressible bytes, for a compressed swap tier). Reports
//! the hot loop's MiB of pages written per second and how much of the cold
//! part is still in memory:
//!
//!     coldalloc t=12 hot_mib=32 mib_per_s=1234.5 cold_mib=200 cold_resident_mib=187.3
//!
//! `t` is seconds since the hot loop started. The hot buffer is a mapping of its
//! own (`/proc/PID/numa_maps` shows it apart from the cold one).

use std::process::ExitCode;
use std::sync::Arc;
use std::thread;

use memtide_workloads::anon;
use memtide_workloads::cli::{self, coldalloc::Options};
use memtide_workloads::progress::{PhaseMeter, Progress};
use memtide_workloads::region::{Region, PAGE};
use memtide_workloads::report::{self, Ticker};

const NAME: &str = "coldalloc";

fn main() -> ExitCode {
    let options: Options = match cli::from_env(NAME, cli::coldalloc::parse, cli::coldalloc::usage) {
        Ok(options) => options,
        Err(code) => return code,
    };
    let (cold_bytes, hot_bytes) = (
        (options.cold_mib << 20) as usize,
        (options.hot_mib << 20) as usize,
    );
    let (mut cold, mut hot) = match (Region::new(cold_bytes), Region::new_apart(hot_bytes)) {
        (Ok(cold), Ok(hot)) => (cold, hot),
        (Err(err), _) | (_, Err(err)) => {
            eprintln!(
                "{NAME}: cannot map {} MiB: {err}",
                options.cold_mib + options.hot_mib
            );
            return ExitCode::FAILURE;
        }
    };
    if options.cold_random_pct == 0 {
        cold.touch(0..cold_bytes, 1);
    } else {
        cold.fill_random(
            0..cold_bytes,
            options.cold_random_pct,
            0x9e37_79b9_7f4a_7c15,
        );
    }

    let progress = Arc::new(Progress::new());
    thread::spawn({
        let progress = Arc::clone(&progress);
        move || report_forever(&progress, &cold, &options)
    });
    anon::touch_until(&mut hot, hot_bytes, None, &progress);
    unreachable!("the hot loop has no deadline");
}

fn report_forever(progress: &Progress, cold: &Region, options: &Options) {
    let mut ticker = Ticker::new(options.interval);
    let mut meter = PhaseMeter::default();
    for line in 1u64.. {
        let t = ticker.wait();
        let mib_per_s = meter.mib_per_s(progress.snapshot());
        let measured = options.resident_every > 0 && line % options.resident_every == 0;
        let cold_resident = measured
            .then(|| cold.resident_pages().ok())
            .flatten()
            .map(|pages| pages * PAGE);
        report::emit(&report::format_line(
            NAME,
            &[
                ("t", &t.as_secs()),
                ("hot_mib", &options.hot_mib),
                ("mib_per_s", &report::mib_per_s(mib_per_s)),
                ("cold_mib", &options.cold_mib),
                (
                    "cold_resident_mib",
                    &report::optional(cold_resident.map(report::mib)),
                ),
            ],
        ));
    }
}
