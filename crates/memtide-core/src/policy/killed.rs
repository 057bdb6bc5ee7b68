//! After an OOM kill. A guest that has just OOM-killed a program needed more than it had,
//! and its figures now show the program gone: what it uses says nothing of what it needs
//! until the program, restarted, uses more than before. Until then, for at most [`WINDOW`],
//! the division serves its estimate, as far as its own word may claim, right after every
//! guest's use, burst room and minimum, before the rest of anyone's estimate (found in the
//! simulator: guests without swap whose programs were restarted 30 s after each kill were
//! divided down to what they used without them and killed again at each restart, up to 84
//! times in an hour).
//!
//! Only a kill of the whole guest counts: Linux counts in `oom_kill` the kills of a cgroup
//! that reached its own limit too (a container in a Kubernetes node), which say nothing of
//! the guest's memory. Those come without direct reclaim, which `allocstall` counts only
//! for the whole machine, so a kill counts when the guest stalled in that tick or the one
//! before (or gives no stall figures).

use crate::units::Bytes;
use std::time::Duration;

/// The longest a kill lifts a guest's claim: ten minutes, twice the longest Kubernetes
/// waits before restarting a container that keeps crashing (its CrashLoopBackOff delay is
/// capped at five), so that a program restarted that late still has time to grow back.
pub const WINDOW: Duration = Duration::from_secs(600);

/// One guest's last OOM kill, while it has not used more than before it.
#[derive(Clone, Debug, Default)]
pub struct Killed {
    /// When, and what it used the tick before (`None` without the figures).
    kill: Option<(Duration, Option<Bytes>)>,
    /// What it used at the last tick it said.
    last: Option<Bytes>,
    /// Its allocation stalls in the last tick.
    stalls: Option<u64>,
}

/// A kill the guest has not recovered from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Recovering {
    /// How long ago.
    pub ago: Duration,
    /// The most it used the tick before any kill since the first it has not recovered
    /// from, where known.
    pub used: Option<Bytes>,
}

/// What a guest said in one tick.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Tick {
    /// OOM kills since the last tick ([`Signals::oom_kills`](crate::signals::Signals)).
    pub kills: Option<u64>,
    /// Allocation stalls (direct reclaim of the whole guest) since the last tick.
    pub stalls: Option<u64>,
    /// What it uses, less what it could reclaim where it says (MemAvailable).
    pub used: Option<Bytes>,
}

impl Killed {
    /// Feed what the guest said at `at`; the kill it has not recovered from, if any: within
    /// [`WINDOW`] of the last kill, while it uses no more than it did the tick before that
    /// kill or any kill since the first it has not recovered from (a program killed within
    /// the tick it grew in leaves its use as it was; without either figure, for the whole
    /// window).
    pub fn observe(&mut self, at: Duration, tick: Tick) -> Option<Recovering> {
        let stalled = tick.stalls.is_none_or(|n| n > 0) || self.stalls.is_some_and(|n| n > 0);
        if stalled && tick.kills.is_some_and(|k| k > 0) {
            // Killed again before it recovered: it needs what it used before either.
            let before = self.kill.and_then(|(_, b)| b).max(self.last);
            self.kill = Some((at, before));
        }
        self.stalls = tick.stalls;
        self.last = tick.used.or(self.last);
        self.kill = self.kill.filter(|(when, before)| {
            at.saturating_sub(*when) < WINDOW && tick.used.zip(*before).is_none_or(|(u, b)| u <= b)
        });
        self.kill.map(|(when, before)| Recovering {
            ago: at.saturating_sub(when),
            used: before,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tick(kills: u64, stalls: Option<u64>, used: Option<u64>) -> Tick {
        Tick {
            kills: Some(kills),
            stalls,
            used: used.map(Bytes::from_mib),
        }
    }

    #[test]
    fn a_kill_counts_until_the_guest_uses_more_than_before_or_the_window_ends() {
        let mut k = Killed::default();
        let at = Duration::from_secs;
        let mut feed = |t, kills, used| k.observe(at(t), tick(kills, Some(kills), Some(used)));
        assert_eq!(feed(0, 0, 500), None);
        let r = feed(1, 1, 100).unwrap();
        assert_eq!((r.ago, r.used), (at(0), Some(Bytes::from_mib(500))));
        assert_eq!(feed(31, 0, 500).unwrap().ago, at(30));
        assert_eq!(feed(32, 0, 501), None, "its program is back");
        assert_eq!(feed(33, 0, 100), None, "a fall is no kill");
        // Killed, then killed again at its restart within a tick, and never back: it
        // counts for the window from the last kill, with what it used before the first.
        assert!(feed(40, 1, 100).is_some());
        assert!(feed(41, 0, 100).is_some());
        let r = feed(70, 1, 100).unwrap();
        assert_eq!((r.ago, r.used), (at(0), Some(Bytes::from_mib(100))));
        assert!(feed(669, 0, 100).is_some());
        assert_eq!(feed(670, 0, 100), None);
        // Killed using 500, restarted to 300 and killed again: it recovers above 500.
        assert!(feed(700, 0, 500).is_none());
        assert!(feed(701, 1, 100).is_some());
        assert!(feed(730, 0, 300).is_some());
        let r = feed(731, 1, 100).unwrap();
        assert_eq!((r.ago, r.used), (at(0), Some(Bytes::from_mib(500))));
        assert!(feed(760, 0, 500).is_some());
        assert_eq!(feed(761, 0, 501), None);
    }

    #[test]
    fn a_kill_without_a_stall_of_the_whole_guest_is_a_cgroups_own() {
        let mut k = Killed::default();
        let at = Duration::from_secs;
        let mib = Some(100);
        assert_eq!(k.observe(at(0), tick(0, Some(0), mib)), None);
        assert_eq!(
            k.observe(at(1), tick(1, Some(0), mib)),
            None,
            "a container's"
        );
        // A stall in the tick before, or no stall figures, and it counts.
        assert_eq!(k.observe(at(2), tick(0, Some(3), mib)), None);
        assert!(k.observe(at(3), tick(1, Some(0), mib)).is_some());
        assert!(Killed::default()
            .observe(at(0), tick(1, None, mib))
            .is_some());
    }

    #[test]
    fn without_figures_a_kill_counts_for_the_whole_window() {
        let mut k = Killed::default();
        let at = Duration::from_secs;
        // Nothing known of its use before the kill, then nothing after it.
        let r = k.observe(at(0), tick(1, Some(1), Some(100))).unwrap();
        assert_eq!(r.used, None);
        assert!(k.observe(at(1), tick(0, Some(0), Some(900))).is_some());
        // A tick without figures leaves the last one known: killed at 3, it used 900.
        k.observe(at(2), Tick::default());
        let r = k.observe(at(3), tick(1, Some(1), None)).unwrap();
        assert_eq!(r.used, Some(Bytes::from_mib(900)));
        assert!(k.observe(at(599), tick(0, Some(0), Some(800))).is_some());
        assert_eq!(k.observe(at(603), Tick::default()), None);
        // No kill figures: nothing to go on.
        assert_eq!(Killed::default().observe(at(0), Tick::default()), None);
    }
}
