//! Room for a burst in a guest without swap. Such a guest has no second chance: what it
//! allocates beyond what it holds is an OOM kill unless the balloon gives it back first,
//! and memtide sees a burst only at the tick after it began. So a guest without swap keeps
//! room above what it holds for as much as it has grown by within one tick over the last
//! [`WINDOW`], up to the most it held then (found in the simulator: eight guests without
//! swap bursting to 3 GiB at 2 GiB/s, four times the balloon's speed, all they held kept
//! while memory was ample, were OOM-killed 96 times in 30 minutes with this room a mere
//! want, none with it in the division's first round beside what their neighbours use; 104
//! times with the room alone). Room for the most a guest
//! held over the hour, however slowly it got there, held memory back from guests whose
//! use rose and fell slowly enough for the balloon to follow (small-vms with its swap
//! removed, which no policy runs without OOM kills, ran 5% slower with it).
//! What it holds counts only as far as its host backs it, so the room never exceeds
//! memory the host backed for it within the hour (to a step of rounding); but the jump may be in the guest's
//! figures alone (its Committed_AS), since memory it touched before is backed already.

use super::peak::Peak;
use crate::units::Bytes;
use std::time::Duration;

/// How far back a guest's bursts count.
pub const WINDOW: Duration = Duration::from_secs(3600);

/// One guest's bursts over the last [`WINDOW`].
#[derive(Clone, Debug)]
pub struct BurstRoom {
    /// The most it held.
    most: Peak,
    /// The most it grew by from one tick to the next.
    fastest: Peak,
    /// What it held at the last tick, when it was seen then.
    last: Option<Bytes>,
}

impl Default for BurstRoom {
    fn default() -> Self {
        BurstRoom {
            most: Peak::over(WINDOW),
            fastest: Peak::over(WINDOW),
            last: None,
        }
    }
}

impl BurstRoom {
    /// Feed what the guest holds at `at` (its commitment beyond reservations, as far as its
    /// host backs it; `None` on a tick without the figures, or while it has swap) and the
    /// size it is configured with; the room it keeps (zero without figures). Growth counts
    /// only from one tick's figures to the next's: across a gap it is no burst. Figures are
    /// rounded up to whole steps of 1/256 of its size, so that each window keeps at most
    /// 258 samples.
    pub fn observe(&mut self, at: Duration, held: Option<Bytes>, configured: Bytes) -> Bytes {
        let Some(held) = held else {
            self.last = None;
            return Bytes::ZERO;
        };
        let step = (configured.0 / 256).max(1);
        let held = Bytes(held.0.div_ceil(step) * step);
        let grown = self.last.map_or(Bytes::ZERO, |last| held - last);
        self.last = Some(held);
        let fastest = self.fastest.observe(at, Some(grown)).unwrap_or_default();
        let most = self.most.observe(at, Some(held)).unwrap_or_default();
        (held + fastest.max(grown)).min(most.max(held))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_for_the_fastest_growth_within_the_hour_up_to_the_most_held() {
        let mut room = BurstRoom::default();
        let at = Duration::from_secs;
        let mib = Bytes::from_mib;
        let mut feed = |t, held: Option<u64>| room.observe(at(t), held.map(mib), mib(1024)).mib();
        assert_eq!(feed(0, Some(98)), 100, "in steps of 4 MiB, rounded up");
        // A burst of 600 MiB within a tick, then 100 more: room for 600 above what it
        // holds, no more than the 800 it held.
        assert_eq!(feed(1, Some(700)), 700);
        assert_eq!(feed(2, Some(800)), 800);
        assert_eq!(feed(3, Some(100)), 700);
        assert_eq!(feed(3600, Some(100)), 700);
        // The burst at 1 s counts until 3601 s; then growth by 100 a tick earns 100.
        assert_eq!(feed(3601, Some(200)), 800);
        assert_eq!(feed(3602, Some(200)), 300);
        // Growth across a tick without figures is no burst.
        assert_eq!(feed(3603, None), 0);
        assert_eq!(feed(3604, Some(600)), 600);
        assert_eq!(
            feed(3605, Some(200)),
            300,
            "room for the 100 of 3601 s, not 400"
        );
    }
}
