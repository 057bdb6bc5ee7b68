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

/// Prints one line and flushes it so the console shows it immediately.
/// Write errors are ignored: losing the console must not stop the workload.
pub fn emit(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

/// Wakes up every `interval` after its creation.
pub struct Ticker {
    start: Instant,
    interval: Duration,
    next: u32,
}

impl Ticker {
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

fn ticks_in(elapsed: Duration, interval: Duration) -> u32 {
    u32::try_from(elapsed.as_nanos() / interval.as_nanos()).expect("ticker ran for over a century")
}

/// Turns a growing counter into a per-second rate between successive calls.
pub struct Meter {
    at: Instant,
    count: u64,
}

impl Meter {
    pub fn new(at: Instant, count: u64) -> Self {
        Meter { at, count }
    }

    pub fn rate(&mut self, at: Instant, count: u64) -> f64 {
        let secs = at.saturating_duration_since(self.at).as_secs_f64();
        let delta = count.saturating_sub(self.count);
        (self.at, self.count) = (at, count);
        if secs > 0.0 {
            delta as f64 / secs
        } else {
            0.0
        }
    }
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
                ("mib_per_s", &format!("{:.1}", 1234.56)),
            ],
        );
        assert_eq!(line, "memknobs t=12 size_mib=200 mib_per_s=1234.6");
        assert_eq!(format_line("idle", &[]), "idle");
    }

    #[test]
    fn meter_reports_rate_since_previous_call() {
        let start = Instant::now();
        let mut meter = Meter::new(start, 100);
        assert_eq!(meter.rate(start + Duration::from_secs(2), 300), 100.0);
        assert_eq!(meter.rate(start + Duration::from_secs(3), 300), 0.0);
        assert_eq!(meter.rate(start + Duration::from_secs(3), 400), 0.0);
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
        assert!(first >= interval && first.as_nanos() % interval.as_nanos() == 0);
        thread::sleep(interval * 4);
        let after_stall = ticker.wait();
        assert!(
            after_stall >= first + interval * 4,
            "{after_stall:?} after {first:?}"
        );
        assert!(ticker.wait() > after_stall);
    }
}
