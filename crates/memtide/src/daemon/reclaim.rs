//! Proactive reclaim in the daemon (`docs/tiering.md`): which VMs it serves, and one pass
//! a tick over them — find each one's cgroup v2, read it, pace (memtide-core's
//! [`Pacer`]), write `memory.reclaim` (memtide-adapters' `reclaim`).

use crate::config::{ReclaimConfig, ReclaimVms, VmConfig};
use memtide_adapters::pidfd::Pidfd;
use memtide_adapters::reclaim::{self as io, Reclaimed};
use memtide_core::reclaim::{Keep, Pace, PaceConfig, Pacer};
use memtide_core::{Bytes, VmSnapshot};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

/// Whether reclaim serves a VM: its own `reclaim` if set, else `[reclaim] vms` (for
/// `unballooned`, a VM sampled without a balloon device).
pub fn serves(config: &ReclaimConfig, vm_config: Option<&VmConfig>, vm: &VmSnapshot) -> bool {
    let unballooned = vm.sample.as_ref().is_ok_and(|s| s.balloon.is_none());
    vm_config
        .and_then(|c| c.reclaim)
        .unwrap_or(match config.vms {
            ReclaimVms::Off => false,
            ReclaimVms::Unballooned => unballooned,
            ReclaimVms::All => true,
        })
}

/// A VM to reclaim from this tick.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    /// Its name.
    pub vm: String,
    /// Its cgroup as configured, or its hypervisor's process to find the cgroup from.
    pub place: Place,
    /// What it keeps.
    pub keep: Keep,
}

/// Where a VM's cgroup is.
#[derive(Clone, Debug, PartialEq)]
pub enum Place {
    /// Configured (`[[vm]] reclaim_cgroup`).
    Cgroup(PathBuf),
    /// The cgroup of this process, started at this time (`procfs::start_time`): a pid
    /// reused by another process since the VM connected is not its.
    Process { pid: u32, started: u64 },
    /// Unknown: no process id from its connector and none configured.
    Unknown,
}

/// What a pass did for one VM.
#[derive(Debug, PartialEq)]
pub struct Outcome {
    /// The VM.
    pub vm: String,
    /// Its cgroup, when found.
    pub cgroup: Option<PathBuf>,
    /// The pacing decision, when the cgroup could be read.
    pub pace: Option<Pace>,
    /// What came of it.
    pub done: Done,
}

/// What came of a VM's pace.
#[derive(Debug, PartialEq)]
pub enum Done {
    /// Nothing to reclaim this tick.
    Held,
    /// A dry run: nothing written.
    DryRun,
    /// Written.
    Reclaimed(Reclaimed),
    /// The cgroup could not be found, read or written.
    Failed(String),
}

/// How an outcome is logged and counted.
#[derive(Debug, PartialEq)]
pub struct Logged<'a> {
    /// The event's kind: `action`, `action_failed` or `reclaim_failed`.
    pub kind: &'static str,
    /// The action's result (`memtide_actions_total{kind="reclaim"}`): `ok`, `partly`,
    /// `error`, `dry_run`.
    pub result: &'static str,
    /// The pace's rule, when there was one.
    pub rule: Option<&'a str>,
    /// Memory asked of the kernel (zero unless written).
    pub asked: Bytes,
    /// The event's text.
    pub message: String,
}

impl Outcome {
    /// How it is logged and counted; `None` when the VM held back (nothing to tell).
    pub fn event(&self) -> Option<Logged<'_>> {
        let what = |p: &Pace| {
            let dir = self.cgroup.as_deref().unwrap_or(std::path::Path::new("?"));
            format!(
                "reclaim {} from {} ({})",
                p.reclaim,
                dir.display(),
                p.reason
            )
        };
        let pace = self.pace.as_ref();
        let (kind, result, asked, message) = match (&self.done, pace) {
            (Done::Held, _) => return None,
            (Done::DryRun, Some(p)) => (
                "action",
                "dry_run",
                Bytes::ZERO,
                format!("would {} (dry run)", what(p)),
            ),
            (Done::Reclaimed(Reclaimed::All), Some(p)) => ("action", "ok", p.reclaim, what(p)),
            (Done::Reclaimed(Reclaimed::Partly), Some(p)) => (
                "action",
                "partly",
                p.reclaim,
                format!("{}: the kernel found less to reclaim", what(p)),
            ),
            (Done::Failed(why), Some(p)) => (
                "action_failed",
                "error",
                Bytes::ZERO,
                format!("{} failed: {why}", what(p)),
            ),
            (Done::Failed(why), None) => (
                "reclaim_failed",
                "error",
                Bytes::ZERO,
                format!("no reclaim: {why}"),
            ),
            (_, None) => unreachable!("a pace is made before anything is written"),
        };
        Some(Logged {
            kind,
            result,
            rule: pace.map(|p| p.reason.rule.as_ref()),
            asked,
            message,
        })
    }
}

/// The VMs' pacers and where their cgroups are looked for.
pub struct Reclaimer {
    pace: PaceConfig,
    proc: PathBuf,
    root: PathBuf,
    /// Each VM's pacer, with the cgroup its readings are of.
    pacers: HashMap<String, (PathBuf, Pacer)>,
    /// VMs left out of the passes for now that keep their pacers ([`Reclaimer::hold`]).
    held: HashSet<String>,
}

impl Reclaimer {
    /// A reclaimer with `config`'s settings, finding processes' cgroups through `proc`.
    pub fn new(config: &ReclaimConfig, proc: PathBuf) -> Reclaimer {
        Reclaimer {
            pace: config.pace(),
            proc,
            root: config.cgroup_root.clone(),
            pacers: HashMap::new(),
            held: HashSet::new(),
        }
    }

    /// The VMs the next passes leave out but do not forget (being saved).
    pub fn hold(&mut self, vms: HashSet<String>) {
        self.held = vms;
    }

    /// One pass at `at` over `targets` (blocking file I/O; a VM not among them nor held
    /// loses its pacer). In a dry run nothing is written.
    pub fn pass(&mut self, targets: &[Target], at: Duration, dry_run: bool) -> Vec<Outcome> {
        let held = &self.held;
        self.pacers
            .retain(|vm, _| held.contains(vm) || targets.iter().any(|t| &t.vm == vm));
        targets.iter().map(|t| self.one(t, at, dry_run)).collect()
    }

    fn one(&mut self, t: &Target, at: Duration, dry_run: bool) -> Outcome {
        let failed = |cgroup, why: String| Outcome {
            vm: t.vm.clone(),
            cgroup,
            pace: None,
            done: Done::Failed(why),
        };
        let dir = match &t.place {
            Place::Cgroup(dir) => dir.clone(),
            Place::Process { pid, started } => {
                // Held while its cgroup is found: the cgroup of the VM's process, never of
                // one that took its pid since.
                let held = i32::try_from(*pid)
                    .ok()
                    .map(|p| Pidfd::hold_started(&self.proc, p, *started));
                let Some(Ok(Some(_held))) = held else {
                    return failed(None, format!("its process {pid} has ended"));
                };
                match io::cgroup_of(&self.proc, &self.root, *pid) {
                    Ok(dir) => dir,
                    Err(e) => return failed(None, e.to_string()),
                }
            }
            Place::Unknown => {
                let why =
                    "its connector gives no process id, or its start time could not be read: \
                           set [[vm]] reclaim_cgroup";
                return failed(None, why.into());
            }
        };
        let reading = match io::read_cgroup(&dir, at) {
            Ok(r) => r,
            Err(e) => return failed(Some(dir), e.to_string()),
        };
        // A VM found in another cgroup (a new hypervisor process) starts a new pacer: the
        // old one's counters are not this cgroup's.
        let (of, pacer) = self
            .pacers
            .entry(t.vm.clone())
            .or_insert_with(|| (dir.clone(), Pacer::default()));
        if *of != dir {
            (*of, *pacer) = (dir.clone(), Pacer::default());
        }
        let pace = pacer.pace(reading, t.keep, &self.pace);
        let done = if pace.reclaim == Bytes::ZERO {
            Done::Held
        } else if dry_run {
            Done::DryRun
        } else {
            match io::reclaim(&dir, pace.reclaim) {
                Ok(r) => {
                    if r == Reclaimed::Partly {
                        pacer.fell_short(pace.reclaim);
                    }
                    Done::Reclaimed(r)
                }
                Err(e) => Done::Failed(e.to_string()),
            }
        };
        Outcome {
            vm: t.vm.clone(),
            cgroup: Some(dir),
            pace: Some(pace),
            done,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memtide_core::testkit::vm;

    fn cgroup(dir: &std::path::Path, current_mib: u64, stall_us: u64) {
        std::fs::create_dir_all(dir).unwrap();
        let write = |name: &str, text: String| std::fs::write(dir.join(name), text).unwrap();
        write("memory.current", format!("{}\n", current_mib << 20));
        write(
            "memory.pressure",
            format!("some avg10=0.00 avg60=0.00 avg300=0.00 total={stall_us}\n"),
        );
        write(
            "memory.stat",
            "workingset_refault_anon 0\nworkingset_refault_file 0\n".into(),
        );
        write("memory.reclaim", String::new());
    }

    fn target(vm: &str, place: Place) -> Target {
        Target {
            vm: vm.into(),
            place,
            keep: Keep {
                working_set: None,
                min: Bytes::from_mib(128),
            },
        }
    }

    #[test]
    fn only_configured_vms_or_unballooned_ones_are_served() {
        let ballooned = vm("a", 1024, 1024, 512);
        let mut bare = vm("b", 1024, 1024, 512);
        bare.sample.as_mut().unwrap().balloon = None;
        let mut config = ReclaimConfig::default();
        assert!(!serves(&config, None, &ballooned) && !serves(&config, None, &bare));
        config.vms = ReclaimVms::Unballooned;
        assert!(!serves(&config, None, &ballooned) && serves(&config, None, &bare));
        let opted: VmConfig = toml::from_str("name = \"a\"\nreclaim = true\n").unwrap();
        assert!(serves(&config, Some(&opted), &ballooned));
        let out: VmConfig = toml::from_str("name = \"b\"\nreclaim = false\n").unwrap();
        config.vms = ReclaimVms::All;
        assert!(!serves(&config, Some(&out), &bare));
    }

    #[test]
    fn a_pass_reclaims_after_its_first_reading_and_reports_what_it_could_not_do() {
        let root = tempfile::tempdir().unwrap();
        let a = root.path().join("a");
        cgroup(&a, 1024, 0);
        let config = ReclaimConfig {
            step_pct_per_s: 1.0,
            ..ReclaimConfig::default()
        };
        let mut r = Reclaimer::new(&config, root.path().join("proc"));
        // This process (held by a pidfd as the VM's would be), started at 1 as the fake
        // procfs tells (field 22 of its stat).
        let me = std::process::id();
        let dir = root.path().join(format!("proc/{me}"));
        std::fs::create_dir_all(&dir).unwrap();
        let stat = format!("{me} (qemu) S{} 1\n", " 0".repeat(18));
        std::fs::write(dir.join("stat"), stat).unwrap();
        let targets = [
            target("a", Place::Cgroup(a.clone())),
            target("b", Place::Unknown),
            target(
                "c",
                Place::Process {
                    pid: me,
                    started: 1,
                },
            ),
            // Started at 2 when its VM connected: the pid is another process's now.
            target(
                "d",
                Place::Process {
                    pid: me,
                    started: 2,
                },
            ),
            // Above the kernel's largest pid_max: ended.
            target(
                "e",
                Place::Process {
                    pid: 4_999_999,
                    started: 1,
                },
            ),
        ];
        let first = r.pass(&targets, Duration::from_secs(10), false);
        assert_eq!(first[0].done, Done::Held);
        assert!(matches!(&first[1].done, Done::Failed(w) if w.contains("reclaim_cgroup")));
        let no_cgroup = format!("{me}/cgroup");
        assert!(matches!(&first[2].done, Done::Failed(w) if w.contains(&no_cgroup)));
        let reused = Done::Failed(format!("its process {me} has ended"));
        assert_eq!(first[3].done, reused);
        let ended = Done::Failed("its process 4999999 has ended".into());
        assert_eq!(first[4].done, ended);
        let second = r.pass(&targets[..1], Duration::from_secs(15), false);
        // 1% of 1 GiB a second for 5 s.
        assert_eq!(second[0].done, Done::Reclaimed(Reclaimed::All));
        let asked = second[0].pace.as_ref().unwrap().reclaim;
        assert_eq!(asked, Bytes(Bytes::from_gib(1).scale(0.05).0 / 4096 * 4096));
        let written = std::fs::read_to_string(a.join("memory.reclaim")).unwrap();
        assert_eq!(written, asked.0.to_string());
        // Dry run: decided, not written; a VM gone loses its pacer (starts again).
        std::fs::write(a.join("memory.reclaim"), "").unwrap();
        let dry = r.pass(&targets[..1], Duration::from_secs(20), true);
        assert_eq!(dry[0].done, Done::DryRun);
        assert_eq!(
            std::fs::read_to_string(a.join("memory.reclaim")).unwrap(),
            ""
        );
        // Held (being saved): left out, its pacer kept.
        r.hold(HashSet::from(["a".to_string()]));
        r.pass(&[], Duration::from_secs(22), false);
        r.hold(HashSet::new());
        let kept = r.pass(&targets[..1], Duration::from_secs(24), false);
        assert_ne!(kept[0].done, Done::Held, "its pacer goes on");
        r.pass(&[], Duration::from_secs(25), false);
        let again = r.pass(&targets[..1], Duration::from_secs(30), false);
        assert_eq!(again[0].done, Done::Held);
        r.pass(&targets[..1], Duration::from_secs(35), false);
        // Found in another cgroup (a new hypervisor), with more stall than the old one
        // counted: a new pacer, no rates across the two.
        let moved = root.path().join("a2");
        cgroup(&moved, 1024, 1_000_000);
        let elsewhere = [target("a", Place::Cgroup(moved))];
        let first_there = r.pass(&elsewhere, Duration::from_secs(40), false);
        assert_eq!(
            first_there[0].pace.as_ref().unwrap().reason.rule,
            "reclaim.first"
        );
        let next = r.pass(&elsewhere, Duration::from_secs(45), false);
        assert_eq!(next[0].done, Done::Reclaimed(Reclaimed::All));
    }

    #[test]
    fn reclaims_and_failures_are_logged_with_their_rule_and_holding_back_is_not() {
        let root = tempfile::tempdir().unwrap();
        let a = root.path().join("a");
        cgroup(&a, 1024, 0);
        let mut r = Reclaimer::new(&ReclaimConfig::default(), root.path().join("proc"));
        let targets = [
            target("a", Place::Cgroup(a.clone())),
            target("b", Place::Unknown),
        ];
        let first = r.pass(&targets, Duration::from_secs(10), false);
        assert_eq!(first[0].event(), None);
        let failed = first[1].event().unwrap();
        assert_eq!(
            (failed.kind, failed.result, failed.rule, failed.asked),
            ("reclaim_failed", "error", None, Bytes::ZERO)
        );
        assert_eq!(
            failed.message,
            "no reclaim: its connector gives no process id, or its start time could not be \
             read: set [[vm]] reclaim_cgroup"
        );
        let second = r.pass(&targets[..1], Duration::from_secs(15), false);
        let done = second[0].event().unwrap();
        assert_eq!(
            (done.kind, done.result, done.rule),
            ("action", "ok", Some("reclaim.probe"))
        );
        assert_eq!(done.asked, second[0].pace.as_ref().unwrap().reclaim);
        let expected = format!("reclaim 10 MiB from {} (reclaim.probe: ", a.display());
        assert!(done.message.starts_with(&expected), "{}", done.message);
        // The file gone (a kernel without memory.reclaim): the write fails, named.
        std::fs::remove_file(a.join("memory.reclaim")).unwrap();
        let third = r.pass(&targets[..1], Duration::from_secs(20), false);
        let failed = third[0].event().unwrap();
        assert_eq!((failed.kind, failed.result), ("action_failed", "error"));
        assert!(
            failed.message.ends_with("memory.reclaim: missing (memory.reclaim needs Linux 5.19+ and the memory controller)"),
            "{}",
            failed.message
        );
    }
}
