//! What a guest has committed and left untouched for minutes. Linux counts in Committed_AS
//! every private writable mapping, touched or not: thread stacks, heaps reserved up front
//! (a JVM's `-Xms`), buffers mapped and never written. Protecting such reservations as
//! memory the guest is about to use held memory back from guests using theirs (found in
//! the simulator: honest guests with half their size committed and never touched took
//! memtide from 1.09 to 0.94 of no management on mixed-8, and below it on burst, whose
//! host then swapped 2.8 M pages).
//!
//! Only what stayed untouched over a whole [`WINDOW`] of observation counts as reserved:
//! the least of the guest's untouched commitment over it. A commitment made lately (a
//! daemon started, a buffer about to be filled) stays protected until the window has seen
//! it untouched; one being touched stops counting as reserved at the tick its memory
//! shows, since the least falls with it at once, and the guest loading it is given room
//! for its next tick ([`super::divide::growth`]). Unlike a fresh allocation, whose
//! commitment is protected before it is touched, a reservation is protected only from the
//! sample that shows it touched: one loaded faster within a tick than the guest's free
//! memory, page cache and free swap absorb is an OOM kill. With an `interval_s` above
//! [`MAX_GAP`] nothing counts as reserved.

use crate::units::Bytes;
use std::collections::VecDeque;
use std::time::Duration;

/// How long a commitment must be seen untouched to count as reserved.
pub const WINDOW: Duration = Duration::from_secs(300);

/// The longest pause in a guest's figures the window bridges: after a longer one (the
/// agent silent, memtide stopped) what the guest did meanwhile is unknown, and the window
/// starts over.
pub const MAX_GAP: Duration = Duration::from_secs(60);

/// One guest's untouched commitment over the last [`WINDOW`].
#[derive(Clone, Debug, Default)]
pub struct Reserved {
    /// When the current unbroken run of figures began.
    since: Option<Duration>,
    /// The time of the latest figures.
    last: Option<Duration>,
    /// Samples that may still be the window's least, oldest first, each larger than the
    /// one before (a sliding-window minimum).
    samples: VecDeque<(Duration, Bytes)>,
}

impl Reserved {
    /// Feed the guest's untouched commitment at `at`; what it has kept untouched over the
    /// whole last [`WINDOW`], or nothing until its figures have covered one.
    pub fn observe(&mut self, at: Duration, untouched: Bytes) -> Bytes {
        let broken = self
            .last
            .is_none_or(|last| at < last || at - last > MAX_GAP);
        if broken {
            self.samples.clear();
            self.since = Some(at);
        }
        self.last = Some(at);
        while self.samples.back().is_some_and(|(_, b)| *b >= untouched) {
            self.samples.pop_back();
        }
        self.samples.push_back((at, untouched));
        while self.samples.front().is_some_and(|(t, _)| *t + WINDOW < at) {
            self.samples.pop_front();
        }
        let covered = self.since.is_some_and(|since| at - since >= WINDOW);
        match self.samples.front() {
            Some((_, least)) if covered => *least,
            _ => Bytes::ZERO,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn at(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn mib(m: u64) -> Bytes {
        Bytes::from_mib(m)
    }

    /// Feed `untouched` every 2 s from `from` to `to` (inclusive); the last answer.
    fn steady(r: &mut Reserved, from: u64, to: u64, untouched: Bytes) -> Bytes {
        (from..=to)
            .step_by(2)
            .map(|s| r.observe(at(s), untouched))
            .last()
            .unwrap()
    }

    #[test]
    fn nothing_is_reserved_before_a_whole_window_has_seen_it_untouched() {
        let mut r = Reserved::default();
        // A JVM's heap reserved at boot: 2 GiB committed beyond what it touched.
        assert_eq!(r.observe(at(0), mib(2048)), Bytes::ZERO);
        assert_eq!(steady(&mut r, 2, 298, mib(2048)), Bytes::ZERO);
        assert_eq!(r.observe(at(300), mib(2048)), mib(2048));
    }

    #[test]
    fn a_new_commitment_stays_protected_and_a_touched_one_at_once() {
        let mut r = Reserved::default();
        assert_eq!(steady(&mut r, 0, 400, mib(2048)), mib(2048));
        // It commits 1 GiB more, to touch over the next seconds: still 2 GiB reserved,
        // the new gigabyte protected as on its way.
        assert_eq!(r.observe(at(402), mib(3072)), mib(2048));
        assert_eq!(r.observe(at(404), mib(2500)), mib(2048));
        // The heap is touched at last: what is reserved falls with it at once.
        assert_eq!(r.observe(at(406), mib(500)), mib(500));
        // Untouched again (the heap freed, its mapping kept): reserved again only after a
        // window.
        assert_eq!(steady(&mut r, 408, 704, mib(1500)), mib(500));
        assert_eq!(r.observe(at(707), mib(1500)), mib(1500));
    }

    #[test]
    fn a_gap_in_the_figures_or_a_clock_going_back_starts_the_window_over() {
        let mut r = Reserved::default();
        assert_eq!(steady(&mut r, 0, 400, mib(1024)), mib(1024));
        // The agent was silent for two minutes: whatever it touched meanwhile is unknown.
        assert_eq!(r.observe(at(521), mib(1024)), Bytes::ZERO);
        assert_eq!(steady(&mut r, 523, 819, mib(1024)), Bytes::ZERO);
        assert_eq!(r.observe(at(821), mib(1024)), mib(1024));
        // A minute's pause is bridged.
        assert_eq!(r.observe(at(881), mib(1024)), mib(1024));
        // Time going back (a clock stepped) starts over as well.
        assert_eq!(r.observe(at(800), mib(1024)), Bytes::ZERO);
    }
}
