//! coldalloc: allocates a large buffer and writes each page once (the cold
//! part: committed, not used again unless asked), then writes to every page
//! of a small hot buffer over and over, forever (`--cold-random-pct` fills
//! part of each cold page with incompressible bytes, for a compressed swap
//! tier; `--cold-read-every R` reads a cold page after every R MiB of hot
//! pages written, so that cold memory comes back now and then). Reports
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
    let cold = Arc::new(cold);
    let read_every = options.cold_read_every;
    thread::spawn({
        let (progress, cold) = (Arc::clone(&progress), Arc::clone(&cold));
        move || report_forever(&progress, &cold, &options)
    });
    let (mut written, mut walk) = (0u64, ColdWalk::new(cold_bytes / PAGE));
    anon::touch_until_each(&mut hot, hot_bytes, None, &progress, || {
        written += 1;
        if read_every > 0 && written.is_multiple_of(read_every) {
            if let Some(page) = walk.next() {
                cold.read(page);
            }
        }
    });
    unreachable!("the hot loop has no deadline");
}

/// The cold pages in an order that visits each once a round, a stride apart (about
/// 0.618 of their number, coprime with it), so that neither the swap's readahead
/// nor a sequential pattern serves the reads: any two in a row, the round's last and
/// the next round's first too, at least 0.38 of the pages apart (fewer than a dozen
/// pages may be visited in order).
struct ColdWalk {
    pages: usize,
    stride: usize,
    at: usize,
}

impl ColdWalk {
    fn new(pages: usize) -> ColdWalk {
        let gcd = |mut a: usize, mut b: usize| {
            while b != 0 {
                (a, b) = (b, a % b);
            }
            a
        };
        // `pages - 1` is coprime with `pages`: found for any pages but none.
        let stride = (pages * 618 / 1000..pages)
            .find(|s| gcd(*s, pages) == 1)
            .unwrap_or(0);
        ColdWalk {
            pages,
            stride,
            at: 0,
        }
    }
}

impl Iterator for ColdWalk {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.pages == 0 {
            return None;
        }
        let page = self.at;
        self.at = (self.at + self.stride) % self.pages;
        Some(page)
    }
}

fn report_forever(progress: &Progress, cold: &Region, options: &Options) {
    let mut ticker = Ticker::new(options.interval);
    let mut meter = PhaseMeter::default();
    for line in 1u64.. {
        let t = ticker.wait();
        let mib_per_s = meter.mib_per_s(progress.snapshot());
        let measured = options.resident_every > 0 && line.is_multiple_of(options.resident_every);
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

#[cfg(test)]
mod tests {
    use super::ColdWalk;

    #[test]
    fn the_walk_visits_every_cold_page_once_a_round() {
        for pages in [1, 2, 3, 4, 6, 12, 4099, 4100, 24576, 30720] {
            let walk: Vec<usize> = ColdWalk::new(pages).take(2 * pages).collect();
            let mut round = walk[..pages].to_vec();
            round.sort_unstable();
            assert_eq!(round, (0..pages).collect::<Vec<_>>(), "{pages} pages");
            assert_eq!(
                walk[..pages],
                walk[pages..],
                "{pages} pages: the same each round"
            );
            if pages >= 12 {
                // Any two reads in a row, across rounds too, far apart either way round.
                let apart = |a: usize, b: usize| a.abs_diff(b).min(pages - a.abs_diff(b));
                let least = walk.windows(2).map(|w| apart(w[0], w[1])).min().unwrap();
                assert!(least * 100 >= pages * 38, "{pages} pages: {least} apart");
            }
        }
        assert_eq!(ColdWalk::new(0).next(), None);
    }
}
