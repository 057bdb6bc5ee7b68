//! Which VMs' guest RAM to put back in huge pages, and when.
//!
//! A balloon that gives memory back leaves the guest writing into host memory faulted in
//! 4 KiB pages, where huge pages stood before it took them (memtide-adapters'
//! `hugepages` says why, and what a pass does). Only a VM given memory back recently has
//! ranges to collapse; scanning every VM's page map every tick would cost the host more
//! than it gains on a large one. So a VM is due from the tick its balloon grew until
//! [`WINDOW`] after, at most one pass every [`EVERY`]: long enough for its workload to
//! write what it was given, and for the pass after a pass to find what the guest wrote
//! since. A pass asks for at most [`PER_PASS`] of a VM's guest RAM; the next goes on
//! where it stopped.

use crate::units::Bytes;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// How long after its balloon last grew a VM stays due.
pub const WINDOW: Duration = Duration::from_secs(60);
/// The least time between two passes.
pub const EVERY: Duration = Duration::from_secs(5);
/// The most of a VM's guest RAM one pass asks to be collapsed. `MADV_COLLAPSE` copies
/// each range into a new huge page before it returns: unbounded, a pass over a guest of
/// hundreds of GiB would hold up the other VMs' collapses, and the next pass, as long as
/// it copies.
pub const PER_PASS: Bytes = Bytes(1 << 30);
/// A balloon that grew by less is taken as unchanged (its `actual` moves by a few pages
/// as the guest's driver settles).
const GROWTH: Bytes = Bytes(1 << 20);

/// Each VM's balloon size and when it last grew, and when the last pass started.
#[derive(Debug, Default)]
pub struct Restore {
    vms: HashMap<String, Seen>,
    last_pass: Option<Duration>,
}

#[derive(Debug)]
struct Seen {
    actual: Bytes,
    grew_at: Option<Duration>,
    /// Where its next pass starts: the address its last one stopped at.
    from: u64,
}

/// Where a VM's pass starts in its guest RAM, and how many huge-page ranges it may ask
/// to be collapsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    /// The address it starts at.
    pub from: u64,
    /// The most ranges it asks for.
    pub ranges: u64,
}

impl Restore {
    /// Take in each VM's balloon size at `at` (monotonic; `None` without a balloon or
    /// without a sample this tick) and return the VMs due for a pass now, by name: none
    /// within [`EVERY`] of the last pass [`Restore::started`]. A balloon that shrinks
    /// again ends its VM's window (the pass would race the inflation). VMs not given are
    /// forgotten.
    pub fn due<'a>(
        &mut self,
        at: Duration,
        vms: impl IntoIterator<Item = (&'a str, Option<Bytes>)>,
    ) -> Vec<String> {
        let mut present = HashSet::new();
        for (name, actual) in vms {
            present.insert(name);
            let Some(actual) = actual else { continue };
            match self.vms.get_mut(name) {
                // The size grown from moves only on a growth or a shrink, so that a
                // balloon growing a little every tick is seen growing.
                Some(seen) if actual.0 >= seen.actual.0 + GROWTH.0 => {
                    seen.grew_at = Some(at);
                    seen.actual = actual;
                }
                Some(seen) if actual < seen.actual => {
                    if actual.0 + GROWTH.0 <= seen.actual.0 {
                        seen.grew_at = None;
                    }
                    seen.actual = actual;
                }
                Some(_) => {}
                None => {
                    self.vms.insert(
                        name.to_string(),
                        Seen {
                            actual,
                            grew_at: None,
                            from: 0,
                        },
                    );
                }
            }
        }
        self.vms.retain(|name, _| present.contains(name.as_str()));
        if self
            .last_pass
            .is_some_and(|last| at.saturating_sub(last) < EVERY)
        {
            return Vec::new();
        }
        let mut due: Vec<String> = self
            .vms
            .iter()
            .filter(|(_, s)| s.grew_at.is_some_and(|g| at.saturating_sub(g) <= WINDOW))
            .map(|(name, _)| name.clone())
            .collect();
        due.sort();
        due
    }

    /// A pass started at `at`: the next is due [`EVERY`] later.
    pub fn started(&mut self, at: Duration) {
        self.last_pass = Some(at);
    }

    /// VM `vm`'s pass with huge pages of `huge`: from where its last one stopped, at
    /// most [`PER_PASS`] of ranges (one at least).
    pub fn bound(&self, vm: &str, huge: Bytes) -> Bound {
        Bound {
            from: self.vms.get(vm).map_or(0, |s| s.from),
            ranges: (PER_PASS.0 / huge.0.max(1)).max(1),
        }
    }

    /// VM `vm`'s pass stopped at address `next` (`None`: it reached the end of the guest
    /// RAM, and the next starts at its beginning again).
    pub fn stopped(&mut self, vm: &str, next: Option<u64>) {
        if let Some(seen) = self.vms.get_mut(vm) {
            seen.from = next.unwrap_or(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    #[test]
    fn a_vm_is_due_after_its_balloon_grew_every_pass_for_the_window_then_not() {
        let mut r = Restore::default();
        let mib = Bytes::from_mib;
        let sizes = |a, b| [("a", Some(mib(a))), ("b", Some(b))];
        assert!(r.due(s(0), sizes(128, mib(384))).is_empty());
        // Shrinking, or a growth under a MiB, is not giving memory back.
        assert!(r.due(s(1), sizes(100, Bytes(mib(384).0 + 4096))).is_empty());
        assert_eq!(r.due(s(2), sizes(300, mib(384))), ["a"]);
        // Due until a pass starts; then not before EVERY has passed since.
        assert_eq!(r.due(s(3), sizes(300, mib(384))), ["a"]);
        r.started(s(3));
        assert!(r.due(s(4), sizes(300, mib(384))).is_empty());
        assert_eq!(r.due(s(8), sizes(300, mib(384))), ["a"]);
        r.started(s(8));
        assert_eq!(r.due(s(62), sizes(300, mib(384))), ["a"]);
        r.started(s(62));
        assert!(
            r.due(s(68), sizes(300, mib(384))).is_empty(),
            "the window has passed"
        );
    }

    #[test]
    fn a_balloon_growing_a_little_every_tick_is_seen_and_one_shrinking_again_is_not_due() {
        let mut r = Restore::default();
        let kib = |k: u64| Some(Bytes(k << 10));
        r.due(s(0), [("a", kib(128 << 10))]);
        // 512 KiB a tick: a growth once a MiB has gathered.
        assert!(r.due(s(1), [("a", kib((128 << 10) + 512))]).is_empty());
        assert_eq!(r.due(s(2), [("a", kib((129 << 10) + 512))]), ["a"]);
        // Inflating again: the window ends.
        assert!(r.due(s(3), [("a", kib(100 << 10))]).is_empty());
    }

    #[test]
    fn a_pass_asks_for_a_gib_at_most_and_the_next_goes_on_where_it_stopped() {
        let mut r = Restore::default();
        let huge = Bytes(2 << 20);
        r.due(s(0), [("a", Some(Bytes::from_mib(128)))]);
        assert_eq!(
            r.bound("a", huge),
            Bound {
                from: 0,
                ranges: 512
            }
        );
        // A huge page larger than the bound (arm64's 512 MiB with 64 KiB pages, or more).
        assert_eq!(r.bound("a", Bytes(2 << 30)).ranges, 1);
        r.stopped("a", Some(0x7f00_4000_0000));
        assert_eq!(r.bound("a", huge).from, 0x7f00_4000_0000);
        r.stopped("a", None);
        assert_eq!(r.bound("a", huge).from, 0);
        // Unknown VMs start at the beginning.
        r.stopped("b", Some(1 << 30));
        assert_eq!(r.bound("b", huge).from, 0);
    }

    #[test]
    fn a_vm_without_a_balloon_or_a_sample_keeps_its_state_and_a_vm_gone_is_forgotten() {
        let mut r = Restore::default();
        let mib = Bytes::from_mib;
        r.due(s(0), [("a", Some(mib(128)))]);
        // A tick without a sample: no change, and it is not forgotten.
        assert!(r.due(s(1), [("a", None)]).is_empty());
        assert_eq!(r.due(s(2), [("a", Some(mib(300)))]), ["a"]);
        r.started(s(2));
        // Gone, then back at its old size: a fresh start, not a growth.
        assert!(r.due(s(10), std::iter::empty()).is_empty());
        assert!(r.due(s(20), [("a", Some(mib(300)))]).is_empty());
        assert!(r.vms["a"].grew_at.is_none());
    }
}
