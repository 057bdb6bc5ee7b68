//! Crash recovery: a VM that opted in, whose hypervisor process died by itself (no
//! shutdown it announced, not hibernated by memtide), is started again from its newest
//! good snapshot — at most `max_restores` times within `window_s`, so that a VM that
//! dies again right after each restore does not loop: one more death within the window
//! and memtide gives up on it. A restore waits while the host cannot hold the VM (its
//! memory domain's freeable below the VM's size and a reserve), so as not to start it
//! into the shortage that may have killed it. Pure: the daemon tells how the VM went,
//! when and what the host has, and carries out what is decided.

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::time::Duration;

use crate::units::Bytes;

/// How often a VM is restored after crashes (`[recovery]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RecoveryConfig {
    /// Restores of one VM within `window_s`; a VM that dies once more within it is left
    /// down.
    pub max_restores: u32,
    /// The window, in seconds.
    pub window_s: u64,
    /// The share of the memory domain kept free beyond a VM restored (0–1): a restore
    /// waits until the domain's freeable memory holds the VM's size and this much.
    pub reserve: f64,
}

impl Default for RecoveryConfig {
    fn default() -> Self {
        RecoveryConfig {
            max_restores: 3,
            window_s: 3600,
            reserve: 0.05,
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
    /// Restore it later: the host cannot hold it now (the reason, for the event log).
    /// Nothing counts against its limit.
    Wait(String),
    /// Leave it: it did not crash (the reason, for the event log).
    Leave(String),
    /// It crashed too often: leave it down (the reason, for the event log).
    GiveUp(String),
}

/// What the host has for a VM to be restored, as last sampled.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Room {
    /// The memory domain's size.
    pub total: Bytes,
    /// What the domain could give back quickly: free plus its page cache.
    pub freeable: Bytes,
    /// The VM's configured memory.
    pub size: Bytes,
}

/// The restores made of each VM within the window.
#[derive(Debug, Default)]
pub struct Recovery {
    restores: FxHashMap<String, VecDeque<Duration>>,
}

impl Recovery {
    /// What to do about VM `vm`, gone as `gone` at `at` (a monotonic clock), the host
    /// having `room`; a restore decided counts against its limit from then.
    pub fn decide(
        &mut self,
        vm: &str,
        gone: Gone,
        at: Duration,
        room: Room,
        cfg: &RecoveryConfig,
    ) -> Verdict {
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
        let needed = room.size + room.total.scale(cfg.reserve);
        if room.freeable < needed {
            return Verdict::Wait(format!(
                "waits to be restored: the host has {} freeable, and the VM needs {} with \
                 the {:.0}% reserve (`[recovery] reserve`)",
                room.freeable,
                needed,
                cfg.reserve * 100.0
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

    /// A host of 16 GiB with 8 GiB freeable, for a 1 GiB VM.
    const ROOM: Room = Room {
        total: Bytes::from_mib(16384),
        freeable: Bytes::from_mib(8192),
        size: Bytes::from_mib(1024),
    };

    #[test]
    fn a_restore_waits_while_the_host_cannot_hold_the_vm_and_uses_none_of_its_restores() {
        let cfg = RecoveryConfig {
            max_restores: 1,
            window_s: 600,
            reserve: 0.05,
        };
        let mut r = Recovery::default();
        // 1 GiB and 5% of 16 GiB (819 MiB) do not fit in 1.5 GiB.
        let short = Room {
            freeable: Bytes::from_mib(1536),
            ..ROOM
        };
        let Verdict::Wait(why) = r.decide("a", Gone::Died, s(10), short, &cfg) else {
            panic!("no room: it waits");
        };
        assert_eq!(
            why,
            "waits to be restored: the host has 1.5 GiB freeable, and the VM needs 1.8 GiB \
             with the 5% reserve (`[recovery] reserve`)"
        );
        assert!(matches!(
            r.decide("a", Gone::Died, s(20), short, &cfg),
            Verdict::Wait(_)
        ));
        // Room again: restored, its one restore not spent on the waits.
        let enough = Room {
            freeable: Bytes::from_mib(1024 + 820),
            ..ROOM
        };
        assert_eq!(
            r.decide("a", Gone::Died, s(30), enough, &cfg),
            Verdict::Restore
        );
        // A VM that is not restored anyway does not wait.
        assert!(matches!(
            r.decide("b", Gone::ShutDown, s(30), short, &cfg),
            Verdict::Leave(_)
        ));
    }

    #[test]
    fn a_vm_that_keeps_dying_is_restored_up_to_the_limit_then_given_up_until_the_window_passes() {
        let cfg = RecoveryConfig {
            max_restores: 2,
            window_s: 600,
            ..RecoveryConfig::default()
        };
        let mut r = Recovery::default();
        assert_eq!(
            r.decide("a", Gone::Died, s(100), ROOM, &cfg),
            Verdict::Restore
        );
        assert_eq!(
            r.decide("a", Gone::Died, s(130), ROOM, &cfg),
            Verdict::Restore
        );
        let Verdict::GiveUp(why) = r.decide("a", Gone::Died, s(160), ROOM, &cfg) else {
            panic!("a third death within the window is given up");
        };
        assert!(
            why.starts_with("died again after 2 restores within 600 s: memtide gives up"),
            "{why}"
        );
        // Given up again while both restores are within the window; another VM is its own.
        assert!(matches!(
            r.decide("a", Gone::Died, s(699), ROOM, &cfg),
            Verdict::GiveUp(_)
        ));
        assert_eq!(
            r.decide("b", Gone::Died, s(699), ROOM, &cfg),
            Verdict::Restore
        );
        // The first restore left the window: one more is allowed.
        assert_eq!(
            r.decide("a", Gone::Died, s(700), ROOM, &cfg),
            Verdict::Restore
        );
        assert!(matches!(
            r.decide("a", Gone::Died, s(701), ROOM, &cfg),
            Verdict::GiveUp(_)
        ));
    }

    #[test]
    fn only_a_death_is_restored_and_a_vm_left_alone_uses_none_of_its_restores() {
        let cfg = RecoveryConfig {
            max_restores: 1,
            window_s: 600,
            ..RecoveryConfig::default()
        };
        let mut r = Recovery::default();
        for (gone, why) in [
            (Gone::ShutDown, "it shut down"),
            (Gone::ProcessAlive, "its hypervisor process runs"),
            (Gone::Hibernated, "memtide hibernated it"),
        ] {
            let Verdict::Leave(reason) = r.decide("a", gone, s(10), ROOM, &cfg) else {
                panic!("{gone:?} is left alone");
            };
            assert!(reason.contains(why), "{reason}");
        }
        assert_eq!(
            r.decide("a", Gone::Died, s(20), ROOM, &cfg),
            Verdict::Restore
        );
        assert!(matches!(
            r.decide("a", Gone::Died, s(30), ROOM, &cfg),
            Verdict::GiveUp(_)
        ));
        // A limit of none restores nothing.
        let never = RecoveryConfig {
            max_restores: 0,
            window_s: 600,
            ..RecoveryConfig::default()
        };
        assert!(matches!(
            Recovery::default().decide("a", Gone::Died, s(0), ROOM, &never),
            Verdict::GiveUp(_)
        ));
    }
}
