//! After an OOM kill. A guest that has just OOM-killed a program needed more than it had,
//! and its figures now show the program gone: what it uses says nothing of what it needs
//! until the program, restarted, uses more than before. Until then, for at most [`WINDOW`],
//! the division serves its estimate right after what every guest uses, before anything
//! else anyone wants (found in the simulator: guests without swap whose programs were
//! restarted 30 s after each kill were divided down to what they used without them and
//! killed again at each restart, up to 84 times in an hour).

use crate::units::Bytes;
use std::time::Duration;

/// The longest a kill lifts a guest's claim: five minutes, the longest Kubernetes waits
/// before restarting a container that keeps crashing (its CrashLoopBackOff delay is capped
/// there).
pub const WINDOW: Duration = Duration::from_secs(300);

/// One guest's last OOM kill, while it has not used more than before it.
#[derive(Clone, Debug, Default)]
pub struct Killed {
    /// When, and what it used the tick before (`None` without the figures).
    kill: Option<(Duration, Option<Bytes>)>,
    /// What it used at the last tick.
    last: Option<Bytes>,
}

/// A kill the guest has not recovered from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Recovering {
    /// How long ago.
    pub ago: Duration,
    /// What it used the tick before, where known.
    pub used: Option<Bytes>,
}

impl Killed {
    /// Feed the guest's OOM kills since the last tick (`None` without the figures) and
    /// what it uses now; the kill it has not recovered from, if any: within [`WINDOW`] of
    /// the last kill, while it uses no more than it did the tick before that kill or any
    /// kill since the first it has not recovered from (a program killed within the tick
    /// it grew in leaves its use as it was; without either figure, for the whole window).
    pub fn observe(
        &mut self,
        at: Duration,
        kills: Option<u64>,
        used: Option<Bytes>,
    ) -> Option<Recovering> {
        if kills.is_some_and(|k| k > 0) {
            // Killed again before it recovered: it needs what it used before either.
            let before = self.kill.and_then(|(_, b)| b).max(self.last);
            self.kill = Some((at, before));
        }
        self.last = used;
        self.kill = self.kill.filter(|(when, before)| {
            at.saturating_sub(*when) < WINDOW && used.zip(*before).is_none_or(|(u, b)| u <= b)
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

    #[test]
    fn a_kill_counts_until_the_guest_uses_as_much_again_or_the_window_ends() {
        let mut k = Killed::default();
        let at = Duration::from_secs;
        let mib = |m| Some(Bytes::from_mib(m));
        assert_eq!(k.observe(at(0), Some(0), mib(500)), None);
        let r = k.observe(at(1), Some(1), mib(100)).unwrap();
        assert_eq!((r.ago, r.used), (at(0), mib(500)));
        assert_eq!(k.observe(at(31), Some(0), mib(500)).unwrap().ago, at(30));
        assert_eq!(
            k.observe(at(32), Some(0), mib(501)),
            None,
            "its program is back"
        );
        assert_eq!(
            k.observe(at(33), Some(0), mib(100)),
            None,
            "a fall is no kill"
        );
        // Killed, then killed again at its restart within a tick, and never back: it
        // counts for the window from the last kill, with what it used before the first.
        assert!(k.observe(at(40), Some(1), mib(100)).is_some());
        assert!(k.observe(at(41), Some(0), mib(100)).is_some());
        let r = k.observe(at(70), Some(1), mib(100)).unwrap();
        assert_eq!((r.ago, r.used), (at(0), mib(100)));
        assert!(k.observe(at(369), Some(0), mib(100)).is_some());
        assert_eq!(k.observe(at(370), Some(0), mib(100)), None);
    }

    #[test]
    fn without_figures_a_kill_counts_for_the_whole_window() {
        let mut k = Killed::default();
        let at = Duration::from_secs;
        // Nothing known of its use before the kill, then nothing after it.
        let r = k
            .observe(at(0), Some(1), Some(Bytes::from_mib(100)))
            .unwrap();
        assert_eq!(r.used, None);
        assert!(k
            .observe(at(1), Some(0), Some(Bytes::from_mib(900)))
            .is_some());
        k.observe(at(2), None, Some(Bytes::from_mib(900)));
        assert!(k.observe(at(3), Some(1), None).is_some());
        assert!(k
            .observe(at(299), None, Some(Bytes::from_mib(800)))
            .is_some());
        assert_eq!(k.observe(at(303), None, None), None);
        // No kill figures: nothing to go on.
        assert_eq!(Killed::default().observe(at(0), None, None), None);
    }
}
