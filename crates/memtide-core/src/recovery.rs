//! Crash recovery: a VM that opted in, whose hypervisor process died by itself (no
//! shutdown it announced, not hibernated by memtide), is started again from its newest
//! good snapshot — at most `max_restores` times within `window_s`, so that a VM that
//! dies again right after each restore does not loop: one more death within the window
//! and memtide gives up on it. Pure: the daemon tells how the VM went and when, and
//! carries out what is decided.

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::time::Duration;

/// How often a VM is restored after crashes (`[recovery]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RecoveryConfig {
    /// Restores of one VM within `window_s`; a VM that dies once more within it is left
    /// down.
    pub max_restores: u32,
    /// The window, in seconds.
    pub window_s: u64,
}

impl Default for RecoveryConfig {
    fn default() -> Self {
        RecoveryConfig {
            max_restores: 3,
            window_s: 3600,
        }
    }
}

/// How a VM's hypervisor went away, as the daemon found it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gone {
    /// It announced a shutdown first (QEMU's `SHUTDOWN` event: a guest poweroff, a
    /// `quit`, a SIGTERM): someone stopped it.
    ShutDown,
    /// Its connection closed while its process still runs.
    ProcessAlive,
    /// memtide hibernated it (its newest snapshot is a hibernation not woken from).
    Hibernated,
    /// Its process is gone without a word: a crash, a SIGKILL, the OOM killer.
    Died,
}

/// What to do about a VM that went away.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Restore it from its newest good snapshot.
    Restore,
    /// Leave it: it did not crash (the reason, for the event log).
    Leave(String),
    /// It crashed too often: leave it down (the reason, for the event log).
    GiveUp(String),
}

/// The restores made of each VM within the window.
#[derive(Debug, Default)]
pub struct Recovery {
    restores: FxHashMap<String, VecDeque<Duration>>,
}

impl Recovery {
    /// What to do about VM `vm`, gone as `gone` at `at` (a monotonic clock); a restore
    /// decided counts against its limit from then.
    pub fn decide(&mut self, vm: &str, gone: Gone, at: Duration, cfg: &RecoveryConfig) -> Verdict {
        let leave = |why: &str| Verdict::Leave(format!("not restored: {why}"));
        match gone {
            Gone::ShutDown => return leave("it shut down (its hypervisor announced it)"),
            Gone::ProcessAlive => {
                return leave("its connection closed but its hypervisor process runs")
            }
            Gone::Hibernated => return leave("memtide hibernated it"),
            Gone::Died => {}
        }
        let window = Duration::from_secs(cfg.window_s);
        let times = self.restores.entry(vm.to_string()).or_default();
        while times
            .front()
            .is_some_and(|t| at.saturating_sub(*t) >= window)
        {
            times.pop_front();
        }
        if times.len() >= cfg.max_restores as usize {
            return Verdict::GiveUp(format!(
                "died again after {} restores within {} s: memtide gives up on it (restore \
                 it by hand once the cause is found; `[recovery] max_restores`)",
                times.len(),
                cfg.window_s
            ));
        }
        times.push_back(at);
        Verdict::Restore
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    #[test]
    fn a_vm_that_keeps_dying_is_restored_up_to_the_limit_then_given_up_until_the_window_passes() {
        let cfg = RecoveryConfig {
            max_restores: 2,
            window_s: 600,
        };
        let mut r = Recovery::default();
        assert_eq!(r.decide("a", Gone::Died, s(100), &cfg), Verdict::Restore);
        assert_eq!(r.decide("a", Gone::Died, s(130), &cfg), Verdict::Restore);
        let Verdict::GiveUp(why) = r.decide("a", Gone::Died, s(160), &cfg) else {
            panic!("a third death within the window is given up");
        };
        assert!(
            why.starts_with("died again after 2 restores within 600 s: memtide gives up"),
            "{why}"
        );
        // Given up again while both restores are within the window; another VM is its own.
        assert!(matches!(
            r.decide("a", Gone::Died, s(699), &cfg),
            Verdict::GiveUp(_)
        ));
        assert_eq!(r.decide("b", Gone::Died, s(699), &cfg), Verdict::Restore);
        // The first restore left the window: one more is allowed.
        assert_eq!(r.decide("a", Gone::Died, s(700), &cfg), Verdict::Restore);
        assert!(matches!(
            r.decide("a", Gone::Died, s(701), &cfg),
            Verdict::GiveUp(_)
        ));
    }

    #[test]
    fn only_a_death_is_restored_and_a_vm_left_alone_uses_none_of_its_restores() {
        let cfg = RecoveryConfig {
            max_restores: 1,
            window_s: 600,
        };
        let mut r = Recovery::default();
        for (gone, why) in [
            (Gone::ShutDown, "it shut down"),
            (Gone::ProcessAlive, "its hypervisor process runs"),
            (Gone::Hibernated, "memtide hibernated it"),
        ] {
            let Verdict::Leave(reason) = r.decide("a", gone, s(10), &cfg) else {
                panic!("{gone:?} is left alone");
            };
            assert!(reason.contains(why), "{reason}");
        }
        assert_eq!(r.decide("a", Gone::Died, s(20), &cfg), Verdict::Restore);
        assert!(matches!(
            r.decide("a", Gone::Died, s(30), &cfg),
            Verdict::GiveUp(_)
        ));
        // A limit of none restores nothing.
        let never = RecoveryConfig {
            max_restores: 0,
            window_s: 600,
        };
        assert!(matches!(
            Recovery::default().decide("a", Gone::Died, s(0), &never),
            Verdict::GiveUp(_)
        ));
    }
}
