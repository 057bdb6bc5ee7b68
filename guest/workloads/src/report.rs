//! Report lines (`NAME key=value ...`) printed at a fixed interval.

use std::fmt::{Display, Write as _};
use std::io::Write as _;
use std::thread;
use std::time::{Duration, Instant};

/// Formats `name k1=v1 k2=v2 ...`.
pub fn format_line(name: &str, fields: &[(&str, &dyn Display)]) -> String {
    let mut line = name.to_string();
    for (key, value) in fields {
        write!(line, " {key}={value}").expect("writing to a String cannot fail");
    }
    line
}

/// Formats a throughput for report lines (`mib_per_s=1234.5`).
pub fn mib_per_s(value: f64) -> String {
    format!("{value:.1}")
}

/// Formats a byte count in MiB, to a tenth.
pub fn mib(bytes: usize) -> String {
    format!("{:.1}", bytes as f64 / f64::from(1 << 20))
}

/// Formats a value that could not be measured as `?`.
pub fn optional<T: Display>(value: Option<T>) -> String {
    value.map_or_else(|| "?".to_string(), |value| value.to_string())
}

/// Prints one line and flushes it so the console shows it immediately.
/// Write errors are ignored: losing the console must not stop the workload.
pub fn emit(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

/// Wakes up every `interval` after its creation.
#[derive(Debug)]
pub struct Ticker {
    start: Instant,
    interval: Duration,
    next: u32,
}

impl Ticker {
    /// Starts counting intervals now.
    pub fn new(interval: Duration) -> Self {
        Ticker {
            start: Instant::now(),
            interval,
            next: 1,
        }
    }

    /// Sleeps until the next tick and returns its offset from the start.
    /// After a stall (e.g. swapping) it returns the latest tick that has
    /// passed, skipping the missed ones rather than reporting them in a burst.
    pub fn wait(&mut self) -> Duration {
        thread::sleep((self.interval * self.next).saturating_sub(self.start.elapsed()));
        let tick = self.next.max(ticks_in(self.start.elapsed(), self.interval));
        self.next = tick + 1;
        self.interval * tick
    }
}

/// Phase deadlines on the ticker's timeline, without drift: a phase ends
/// when the previous one ended plus its duration, however late the worker
/// noticed. The first phase ends a tenth of an interval late, so that phase
/// changes fall just after report lines, not at the same moment: the line
/// at a phase's end covers that phase, the next line the next phase.
#[derive(Debug)]
pub struct Schedule {
    end: Instant,
}

impl Schedule {
    /// Starts the first phase now, on `ticker`'s timeline.
    pub fn new(ticker: &Ticker) -> Schedule {
        Schedule {
            end: ticker.start + ticker.interval / 10,
        }
    }

    /// The deadline of the next phase, which lasts `duration`.
    pub fn next(&mut self, duration: Duration) -> Instant {
        self.end += duration;
        self.end
    }
}

fn ticks_in(elapsed: Duration, interval: Duration) -> u32 {
    u32::try_from(elapsed.as_nanos() / interval.as_nanos()).expect("ticker ran for over a century")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_key_value_lines() {
        let line = format_line(
            "memknobs",
            &[
                ("t", &12),
                ("size_mib", &200),
                ("mib_per_s", &mib_per_s(1234.56)),
            ],
        );
        assert_eq!(line, "memknobs t=12 size_mib=200 mib_per_s=1234.6");
        assert_eq!(format_line("idle", &[]), "idle");
        assert_eq!(mib(3 << 19), "1.5");
        assert_eq!(optional(Some(3)), "3");
        assert_eq!(optional(None::<u64>), "?");
    }

    #[test]
    fn schedule_follows_the_ticker_without_drift() {
        let ticker = Ticker::new(Duration::from_secs(1));
        let mut schedule = Schedule::new(&ticker);
        let lag = Duration::from_millis(100);
        thread::sleep(Duration::from_millis(5)); // a late worker
        assert_eq!(
            schedule.next(Duration::from_secs(30)),
            ticker.start + lag + Duration::from_secs(30)
        );
        assert_eq!(
            schedule.next(Duration::from_secs(5)),
            ticker.start + lag + Duration::from_secs(35)
        );
    }

    #[test]
    fn ticker_counts_whole_intervals() {
        let second = Duration::from_secs(1);
        assert_eq!(ticks_in(Duration::from_millis(2999), second), 2);
        assert_eq!(ticks_in(Duration::from_secs(3), second), 3);
    }

    #[test]
    fn ticker_skips_ticks_missed_while_stalled() {
        let interval = Duration::from_millis(100);
        let mut ticker = Ticker::new(interval);
        let first = ticker.wait();
        assert!(first >= interval && first.as_nanos().is_multiple_of(interval.as_nanos()));
        thread::sleep(interval * 4);
        let after_stall = ticker.wait();
        assert!(
            after_stall >= first + interval * 4,
            "{after_stall:?} after {first:?}"
        );
        assert!(ticker.wait() > after_stall);
    }
}
