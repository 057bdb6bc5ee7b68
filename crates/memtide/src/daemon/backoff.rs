//! Exponential backoff between reconnection attempts, reset by success; and how often a
//! failure that repeats is logged.

use std::time::Duration;
use tokio::time::Instant;

/// First delay after a failure.
const FIRST: Duration = Duration::from_secs(1);
/// Longest delay.
const LONGEST: Duration = Duration::from_secs(60);

/// When the next attempt may be made.
#[derive(Debug, Clone)]
pub struct Backoff {
    delay: Duration,
    next: Option<Instant>,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            delay: FIRST,
            next: None,
        }
    }
}

impl Backoff {
    /// True when an attempt may be made now.
    pub fn ready(&self, now: Instant) -> bool {
        self.next.is_none_or(|next| now >= next)
    }

    /// Record a failure at `now`: wait the current delay, then double it (up to a minute).
    pub fn failed(&mut self, now: Instant) {
        self.next = Some(now + self.delay);
        self.delay = (self.delay * 2).min(LONGEST);
    }

    /// Time until the next attempt may be made.
    pub fn remaining(&self, now: Instant) -> Duration {
        self.next
            .map_or(Duration::ZERO, |n| n.saturating_duration_since(now))
    }
}

/// A failure that repeats is logged at most this often.
pub const LOG_EVERY: Duration = Duration::from_secs(300);

/// When a repeating failure (a list, a listing) is logged: at the first, then every
/// [`LOG_EVERY`] while it lasts.
#[derive(Debug, Default)]
pub struct Failures {
    count: u64,
    logged: Option<Instant>,
}

impl Failures {
    /// It failed at `now`: the count of failures so far, if this one is logged.
    pub fn failed(&mut self, now: Instant) -> Option<u64> {
        self.count += 1;
        let due = self
            .logged
            .is_none_or(|at| now.duration_since(at) >= LOG_EVERY);
        due.then(|| {
            self.logged = Some(now);
            self.count
        })
    }

    /// It succeeded: the count of failures before it, if there were any.
    pub fn succeeded(&mut self) -> Option<u64> {
        let count = std::mem::take(self).count;
        (count > 0).then_some(count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_a_minute() {
        let t0 = Instant::now();
        let mut b = Backoff::default();
        assert!(b.ready(t0));
        let mut waits = Vec::new();
        for _ in 0..9 {
            b.failed(t0);
            waits.push(b.remaining(t0).as_secs());
        }
        assert_eq!(waits, vec![1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert!(!b.ready(t0 + Duration::from_secs(59)));
        assert!(b.ready(t0 + Duration::from_secs(60)));
    }

    #[test]
    fn a_repeating_failure_is_logged_at_first_then_every_five_minutes() {
        let mut f = Failures::default();
        let t0 = Instant::now();
        let logged: Vec<u64> = (0..25u64)
            .filter_map(|i| f.failed(t0 + Duration::from_secs(30 * i)))
            .collect();
        // At 0 s, 300 s (the 11th) and 600 s (the 21st).
        assert_eq!(logged, [1, 11, 21]);
        assert_eq!(f.succeeded(), Some(25));
        assert_eq!(f.succeeded(), None, "nothing failed since");
        assert_eq!(f.failed(t0 + Duration::from_secs(800)), Some(1), "afresh");
    }
}
