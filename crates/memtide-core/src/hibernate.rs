//! Hibernation, the last rung of overcommit: a VM that allows it (its own idle time, set
//! by the operator) and has used less than a share of one CPU for that long, while the
//! host is short of memory, is saved to disk and its process quits, its memory given back
//! whole. Pure: the daemon feeds each VM's CPU time and carries out what is due.

use crate::units::Bytes;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// When hibernation applies.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HibernateConfig {
    /// A VM is idle while its hypervisor process uses less than this share of one CPU.
    pub idle_cpu: f64,
    /// The host is short while the domain's freeable share (averaged) is below this.
    pub free_below: f64,
}

impl Default for HibernateConfig {
    fn default() -> Self {
        HibernateConfig {
            idle_cpu: 0.03,
            free_below: 0.10,
        }
    }
}

/// One VM's CPU time as last seen, and since when it has been idle.
#[derive(Clone, Copy, Debug)]
struct Track {
    at: Duration,
    cpu_s: f64,
    idle_since: Option<Duration>,
    /// Its next sample is a new start for the CPU share, judging nothing.
    rebase: bool,
}

/// How long each VM has been idle, from its CPU time tick after tick.
#[derive(Debug, Default)]
pub struct Idleness {
    vms: FxHashMap<String, Track>,
}

/// A VM to hibernate now, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Due {
    /// The VM.
    pub vm: String,
    /// A sentence for the event log.
    pub reason: String,
}

impl Idleness {
    /// Take in the CPU time (seconds, cumulative) of each VM at `at`: a VM not sampled
    /// this tick (`None`: unreachable, or being saved) keeps what was seen of it; one
    /// whose CPU time went back (a new process) starts over; VMs not given are forgotten.
    pub fn observe<'a>(
        &mut self,
        at: Duration,
        vms: impl IntoIterator<Item = (&'a str, Option<f64>)>,
        cfg: &HibernateConfig,
    ) {
        let mut seen = FxHashMap::default();
        for (name, cpu_s) in vms {
            let Some(cpu_s) = cpu_s.filter(|c| c.is_finite() && *c >= 0.0) else {
                if let Some(t) = self.vms.get(name) {
                    seen.insert(name.to_string(), *t);
                }
                continue;
            };
            let idle_since = match self.vms.get(name) {
                Some(t) if t.rebase => t.idle_since,
                Some(t) if at > t.at && cpu_s >= t.cpu_s => {
                    let share = (cpu_s - t.cpu_s) / (at - t.at).as_secs_f64();
                    (share < cfg.idle_cpu).then(|| t.idle_since.unwrap_or(t.at))
                }
                _ => None,
            };
            seen.insert(
                name.to_string(),
                Track {
                    at,
                    cpu_s,
                    idle_since,
                    rebase: false,
                },
            );
        }
        self.vms = seen;
    }

    /// How long `vm` has been idle at its latest sample.
    pub fn idle_for(&self, vm: &str) -> Option<Duration> {
        let t = self.vms.get(vm)?;
        Some(t.at - t.idle_since?)
    }

    /// Count `vm`'s idle time from now on (it was hibernated, or tried to be: a save that
    /// failed is tried again only after another whole idle time).
    pub fn restart(&mut self, vm: &str) {
        if let Some(t) = self.vms.get_mut(vm) {
            t.idle_since = None;
        }
    }

    /// `vm` was saved and runs on: the CPU its hypervisor spent writing its memory (a
    /// migration thread at a whole CPU for the length of the write, found by an audit)
    /// falls between its last sample and its next, which is taken as a new start, idle
    /// time kept, instead of as the guest's work — as is a new process's CPU time (libvirt
    /// restores the saved domain in a new QEMU).
    pub fn saved(&mut self, vm: &str) {
        if let Some(t) = self.vms.get_mut(vm) {
            t.rebase = true;
        }
    }
}

/// One hibernation at a time, each seen before the next: none is due while one runs, nor
/// until the host's free memory, averaged over `settle` (the engine's history), counts
/// what the last one gave back (found by an audit: with the average still low, the next
/// idle VM went at the next tick, and the next).
#[derive(Debug, Default)]
pub struct Pace {
    /// A hibernation was started and not seen ended yet.
    begun: bool,
    /// When the last one was seen ended.
    ended: Option<Duration>,
}

impl Pace {
    /// A hibernation was started.
    pub fn begun(&mut self) {
        self.begun = true;
    }

    /// Whether another may start at `at`; `running` says whether a hibernation runs now.
    pub fn allows(&mut self, at: Duration, running: bool, settle: Duration) -> bool {
        if running {
            self.begun = true;
            return false;
        }
        if std::mem::take(&mut self.begun) {
            self.ended = Some(at);
        }
        self.ended.is_none_or(|ended| at >= ended + settle)
    }
}

/// The VM to hibernate now, if any: of `allowed` (each VM with its idle time and the
/// memory it holds), the one idle past its time that holds the most, while the host is
/// short (`free_ratio_avg` below the configured share). One at a time: the memory one
/// frees is seen before the next goes.
pub fn due(
    idle: &Idleness,
    allowed: &[(String, Duration, Bytes)],
    free_ratio_avg: f64,
    cfg: &HibernateConfig,
) -> Option<Due> {
    if free_ratio_avg >= cfg.free_below {
        return None;
    }
    let (vm, idle_for, held) = allowed
        .iter()
        .filter_map(|(vm, after, held)| {
            let idle_for = idle.idle_for(vm)?;
            (idle_for >= *after).then_some((vm, idle_for, *held))
        })
        .max_by_key(|(_, _, held)| *held)?;
    let reason = format!(
        "idle {:.0} s (its process under {:.0}% of a CPU) while the host is short ({:.1}% \
         freeable, below {:.0}%): hibernated to give back its {held}",
        idle_for.as_secs_f64(),
        cfg.idle_cpu * 100.0,
        free_ratio_avg * 100.0,
        cfg.free_below * 100.0,
    );
    Some(Due {
        vm: vm.clone(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    /// `a` busy (0.5 CPU), `b` idle (1% CPU) from the start, over `ticks` of 10 s.
    fn run(ticks: u64) -> Idleness {
        let cfg = HibernateConfig::default();
        let mut idle = Idleness::default();
        for t in 0..=ticks {
            let (a, b) = (t as f64 * 5.0, t as f64 * 0.1);
            idle.observe(s(t * 10), [("a", Some(a)), ("b", Some(b))], &cfg);
        }
        idle
    }

    #[test]
    fn only_a_vm_idle_past_its_time_goes_and_only_while_the_host_is_short() {
        let cfg = HibernateConfig::default();
        let idle = run(30);
        assert_eq!(idle.idle_for("a"), None, "busy");
        assert_eq!(idle.idle_for("b"), Some(s(300)));
        let allowed = |after| {
            vec![
                ("a".to_string(), s(60), Bytes::from_mib(900)),
                ("b".to_string(), s(after), Bytes::from_mib(400)),
            ]
        };
        let d = due(&idle, &allowed(200), 0.05, &cfg).unwrap();
        assert_eq!(d.vm, "b");
        assert!(d.reason.starts_with("idle 300 s"), "{}", d.reason);
        assert!(d.reason.contains("5.0% freeable"), "{}", d.reason);
        assert_eq!(
            due(&idle, &allowed(400), 0.05, &cfg),
            None,
            "not idle long enough"
        );
        assert_eq!(
            due(&idle, &allowed(200), 0.25, &cfg),
            None,
            "the host is not short"
        );
        // VMs not allowed are never due, however idle.
        assert_eq!(due(&idle, &[], 0.0, &cfg), None);
    }

    #[test]
    fn the_cpu_a_save_takes_is_not_the_guests_work() {
        let cfg = HibernateConfig::default();
        let mut idle = run(10);
        // Not sampled while saved (10 s at a whole CPU), then sampled again.
        idle.observe(s(110), [("b", None)], &cfg);
        idle.observe(s(120), [("b", None)], &cfg);
        idle.saved("b");
        idle.observe(s(130), [("b", Some(11.1))], &cfg);
        assert_eq!(idle.idle_for("b"), Some(s(130)), "idle all along");
        // Only the sample after the save is a new start.
        idle.observe(s(140), [("b", Some(11.2))], &cfg);
        assert_eq!(idle.idle_for("b"), Some(s(140)));
        idle.observe(s(150), [("b", Some(16.0))], &cfg);
        assert_eq!(idle.idle_for("b"), None, "work after it counts");
        // Restored in a new process (libvirt's save): its CPU time starts over, idle kept.
        idle.observe(s(155), [("b", Some(16.05))], &cfg);
        idle.saved("b");
        idle.observe(s(160), [("b", Some(0.2))], &cfg);
        idle.observe(s(170), [("b", Some(0.3))], &cfg);
        assert_eq!(
            idle.idle_for("b"),
            Some(s(20)),
            "idle since 150 s, across the restore"
        );
        // Without the mark, the save's CPU is the guest's.
        let mut idle = run(10);
        idle.observe(s(120), [("b", None)], &cfg);
        idle.observe(s(130), [("b", Some(11.1))], &cfg);
        assert_eq!(idle.idle_for("b"), None);
    }

    #[test]
    fn one_hibernation_at_a_time_each_seen_before_the_next() {
        let settle = s(20);
        let mut pace = Pace::default();
        assert!(pace.allows(s(0), false, settle), "none yet");
        pace.begun();
        assert!(!pace.allows(s(2), true, settle), "one runs");
        assert!(!pace.allows(s(10), false, settle), "ended: not yet seen");
        assert!(!pace.allows(s(28), false, settle));
        assert!(pace.allows(s(30), false, settle), "settled");
        // One begun and ended between two ticks is seen ended at the next.
        pace.begun();
        assert!(!pace.allows(s(32), false, settle));
        assert!(pace.allows(s(52), false, settle));
    }

    #[test]
    fn work_or_a_new_process_starts_the_idle_time_over() {
        let cfg = HibernateConfig::default();
        let mut idle = run(10);
        assert_eq!(idle.idle_for("b"), Some(s(100)));
        // One busy interval.
        idle.observe(s(110), [("b", Some(9.0))], &cfg);
        assert_eq!(idle.idle_for("b"), None);
        idle.observe(s(120), [("b", Some(9.0))], &cfg);
        assert_eq!(idle.idle_for("b"), Some(s(10)));
        // Tried: counted afresh.
        idle.restart("b");
        assert_eq!(idle.idle_for("b"), None);
        idle.observe(s(125), [("b", Some(9.0))], &cfg);
        assert_eq!(idle.idle_for("b"), Some(s(5)));
        // Its process restarted: CPU time went back.
        idle.observe(s(130), [("b", Some(0.1))], &cfg);
        assert_eq!(idle.idle_for("b"), None);
        // A tick without its CPU time (it was being saved) keeps what was seen; the
        // next interval spans it.
        idle.observe(s(140), [("b", Some(0.1))], &cfg);
        idle.observe(s(150), [("b", None)], &cfg);
        assert_eq!(idle.idle_for("b"), Some(s(10)));
        idle.observe(s(160), [("b", Some(0.3))], &cfg);
        assert_eq!(idle.idle_for("b"), Some(s(30)));
        // A VM no longer given: forgotten.
        idle.observe(s(170), [("a", Some(0.0))], &cfg);
        assert_eq!(idle.idle_for("b"), None);
        idle.observe(s(180), [("b", Some(0.3))], &cfg);
        assert_eq!(idle.idle_for("b"), None);
    }

    #[test]
    fn of_several_due_the_one_holding_most_goes_first() {
        let cfg = HibernateConfig::default();
        let mut idle = Idleness::default();
        for t in 0..=10 {
            idle.observe(s(t * 10), [("x", Some(0.0)), ("y", Some(0.0))], &cfg);
        }
        let allowed = [
            ("x".to_string(), s(50), Bytes::from_mib(300)),
            ("y".to_string(), s(50), Bytes::from_mib(700)),
        ];
        assert_eq!(due(&idle, &allowed, 0.0, &cfg).unwrap().vm, "y");
    }
}
