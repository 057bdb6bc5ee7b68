//! What a guest has committed and not touched for minutes. Linux counts in Committed_AS
//! every private writable mapping, touched or not: thread stacks, heaps reserved up front
//! (a JVM's `-Xms`), buffers mapped and never written. Such reservations may never be
//! touched, and protecting them as memory the guest is about to use held memory back from
//! guests that were using theirs (found in the simulator: honest guests with half their
//! size committed and never touched took memtide from 1.09 to 0.94 of no management on
//! mixed-8 and below it on burst, whose host then swapped 2.8 M pages). What a guest
//! committed lately and has not touched yet is still protected: the least of its untouched
//! commitment over the last [`WINDOW`] is taken as reserved, the rest as on its way.

use crate::units::Bytes;
use std::collections::VecDeque;
use std::time::Duration;

/// How long a commitment must stay untouched to count as a reservation.
pub const WINDOW: Duration = Duration::from_secs(300);

/// One guest's untouched commitment over the last [`WINDOW`].
#[derive(Clone, Debug, Default)]
pub struct Reserved {
    /// Samples that may still be the window's least, oldest first, each larger than the
    /// one before (a sliding-window minimum).
    samples: VecDeque<(Duration, Bytes)>,
}

impl Reserved {
    /// Feed the guest's untouched commitment at `at` (Committed_AS less its anonymous
    /// memory in RAM and in swap); the least of it over the last [`WINDOW`].
    pub fn observe(&mut self, at: Duration, untouched: Bytes) -> Bytes {
        while self.samples.back().is_some_and(|(_, b)| *b >= untouched) {
            self.samples.pop_back();
        }
        self.samples.push_back((at, untouched));
        while self.samples.front().is_some_and(|(t, _)| *t + WINDOW < at) {
            self.samples.pop_front();
        }
        self.samples.front().map_or(untouched, |(_, b)| *b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_untouched_commitment_over_the_window_is_reserved() {
        let mut r = Reserved::default();
        let at = Duration::from_secs;
        let mib = Bytes::from_mib;
        // A JVM's heap reserved up front: 2 GiB committed beyond what it touched, always.
        assert_eq!(r.observe(at(0), mib(2048)), mib(2048));
        assert_eq!(r.observe(at(100), mib(2048)), mib(2048));
        // It commits 1 GiB more, to touch over the next seconds: still 2 GiB reserved,
        // the new gigabyte protected as on its way.
        assert_eq!(r.observe(at(101), mib(3072)), mib(2048));
        assert_eq!(r.observe(at(105), mib(2500)), mib(2048));
        // The heap is touched at last: what is reserved falls with it at once.
        assert_eq!(r.observe(at(200), mib(500)), mib(500));
        // A commitment untouched for longer than the window becomes reserved.
        assert_eq!(r.observe(at(201), mib(1500)), mib(500));
        assert_eq!(r.observe(at(500), mib(1500)), mib(500));
        assert_eq!(r.observe(at(501), mib(1500)), mib(1500));
    }
}
