//! Exponential backoff between reconnection attempts, reset by success.

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
}
