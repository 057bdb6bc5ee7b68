//! The state file: what a restarted daemon must not forget about each VM — the balloon
//! target it asked for, what memtide's estimator learnt (its estimate, probing state
//! and cool-down), and its adaptive cold age in tier placement. Written every tick,
//! atomically (a temporary file, fsync, rename), as small versioned JSON; read at start.
//! A VM's state is used when the VM is found again under its name at the same configured
//! size, in the same hypervisor process where that is known (a VM configured by `pid`,
//! which has only a cold age, when it is the same process);
//! a file that is unreadable or of a newer version is ignored, with the reason logged (one
//! a newer memtide wrote, said as such: not as damaged), and so is one older than
//! [`MAX_AGE`] but for its cold ages, kept within the longest age.

use super::events::EventLog;
use super::place::{KeptAge, LearntFor};
use super::RunOptions;
use memtide_core::estimate::fused::FusedMemory;
use memtide_core::tiering::age::{AgeConfig, ColdAge};
use memtide_core::{Bytes, Decision, Engine, VmEvent, VmSnapshot};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The format's version; a file of a newer one is ignored, an older one's read. It goes
/// up whenever a field is added (here or in what the file holds of the estimator,
/// `FusedMemory`), with a default: an older memtide then says the file is a newer one's
/// rather than fail on the added field as if the file were damaged (found by the
/// compatibility audit). A field whose meaning changes is a new field, under a new name:
/// an older file's is read as it meant. `tests/formats` keeps a file of each version.
const VERSION: u32 = 1;
/// Balloon targets and estimator state older than this are ignored: what they say of the
/// guests no longer holds.
pub const MAX_AGE: Duration = Duration::from_secs(600);

/// The rule of a `state` event whose file could not be used for a fault of its own.
pub const UNREADABLE: &str = "state_unreadable";

/// How far in the future a file may be dated (clocks a little apart) before it is taken
/// for one written before the clock stepped back.
const FUTURE_SLACK_S: u64 = 60;

/// The daemon's state file at `path` (none when empty or in a dry run, whose decisions
/// are not carried out), with what it held given to `engine` (and kept for tier
/// placement under `ages`) and logged to `events`.
pub fn open(
    path: &Path,
    options: &RunOptions,
    engine: &mut Engine,
    ages: Option<&AgeConfig>,
    events: &mut EventLog,
) -> Option<StateFile> {
    if path.as_os_str().is_empty() || options.dry_run {
        return None;
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Err(e) = std::fs::create_dir_all(dir) {
            let message = format!("creating {}: {e}", dir.display());
            events.log("write_failed", None, Some("state"), message);
        }
    }
    let (state, message, rule) = StateFile::open(path, engine, ages);
    events.log("state", None, rule, message);
    Some(state)
}

/// The version of state file `text`, where it is newer than [`VERSION`].
fn newer_version(text: &str) -> Option<u64> {
    let probe: serde_json::Value = serde_json::from_str(text).ok()?;
    probe
        .get("version")?
        .as_u64()
        .filter(|&v| v > u64::from(VERSION))
}

/// The file's content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Saved {
    version: u32,
    /// When it was written, in seconds since the Unix epoch.
    written: u64,
    vms: BTreeMap<String, SavedVm>,
    /// The VMs configured by `pid`, which are in no decision (optional: a file without
    /// them still loads).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    processes: BTreeMap<String, SavedProcess>,
}

/// One VM's state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedVm {
    /// Its configured size: the state is used only for a VM of the same size.
    configured: Bytes,
    /// The balloon target in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    target: Option<Bytes>,
    /// memtide's estimator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    memtide: Option<FusedMemory>,
    /// Its adaptive cold age in tier placement (s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cold_age_s: Option<f64>,
    /// The hypervisor process it ran in, where known: its estimator and target are not
    /// used for a VM of that name found in another (the VM restarted meanwhile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hypervisor: Option<Hypervisor>,
}

/// What became of a VM's restored state when it connected ([`StateFile::connected`]), with
/// the sentence for the event log.
#[derive(Debug, PartialEq)]
pub enum Restored {
    /// Kept for another process than the one it runs in: forgotten.
    Afresh(String),
    /// Kept for a process, and the one it runs in is not known yet: used unchecked.
    Unchecked(String),
}

/// A hypervisor process: its pid and its start time (`/proc/PID/stat` field 22, clock
/// ticks after boot), which tells it from a later process given the pid.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hypervisor {
    pid: u32,
    started: u64,
}

impl From<(u32, u64)> for Hypervisor {
    fn from((pid, started): (u32, u64)) -> Hypervisor {
        Hypervisor { pid, started }
    }
}

/// A VM configured by `pid`'s cold age, with the process it was learnt for. Such a VM has
/// no configured size to check (all its private writable mappings are placed, however
/// they grow) and is, to placement, the process first seen at its pid: the age is resumed
/// only if the pid's process is the same, by its start time (`/proc/PID/stat` field 22),
/// not a later one given the pid (the workload restarted, or the pid reused) nor another
/// pid configured since.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedProcess {
    pid: i32,
    /// Its start time, in clock ticks after boot.
    started: u64,
    /// Its adaptive cold age in tier placement (s).
    cold_age_s: f64,
}

/// The state file, the targets restored from it for VMs not seen again yet, the cold
/// ages restored for tier placement, and what it holds now.
pub struct StateFile {
    path: PathBuf,
    targets: BTreeMap<String, (Bytes, Bytes)>,
    /// The VMs given their restored target at least once.
    given: BTreeSet<String>,
    cold_ages: BTreeMap<String, (LearntFor, ColdAge)>,
    last: BTreeMap<String, SavedVm>,
    /// The hypervisor each VM restored ran in, until the VM connects in a known one (or
    /// its own is found later: until then its restored state is used unchecked).
    restored_in: BTreeMap<String, Hypervisor>,
    /// The hypervisor each VM connected in, where known.
    hypervisors: BTreeMap<String, Hypervisor>,
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl StateFile {
    /// The state file at `path`, and what a previous daemon left there given to `engine`,
    /// the cold ages kept within `ages`' bounds (none without placement or where the age
    /// is fixed); returns a sentence for the event log saying what was restored or why
    /// nothing was, and [`UNREADABLE`] where the file is there but could not be used for
    /// a fault of its own (damaged, unreadable, dated in the future: a warning), not for
    /// its age or version.
    pub fn open(
        path: &Path,
        engine: &mut Engine,
        ages: Option<&AgeConfig>,
    ) -> (StateFile, String, Option<&'static str>) {
        let mut state = StateFile {
            path: path.to_path_buf(),
            targets: BTreeMap::new(),
            given: BTreeSet::new(),
            cold_ages: BTreeMap::new(),
            last: BTreeMap::new(),
            restored_in: BTreeMap::new(),
            hypervisors: BTreeMap::new(),
        };
        let saved = match crate::text_file::read(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let message = format!("no state file at {}: starting afresh", path.display());
                return (state, message, None);
            }
            Err(e) => Err(e.to_string()),
            Ok(text) => {
                // The version first, from whatever a newer memtide wrote around it: the
                // strict parse fails on a field added since.
                if let Some(newer) = newer_version(&text) {
                    let message = format!(
                        "state file {} was written by a newer memtide (state version \
                         {newer}; this one reads {VERSION}): starting afresh",
                        path.display()
                    );
                    return (state, message, None);
                }
                serde_json::from_str::<Saved>(&text).map_err(|e| e.to_string())
            }
        };
        let unreadable = saved.is_err();
        let now = unix_now();
        let age = |s: &Saved| now.saturating_sub(s.written);
        let ages = ages.filter(|a| a.adaptive);
        // A cold age is learnt from the workload's habits, which outlast the guests'
        // figures: a file is good for them within the longest age, where that is longer
        // than `MAX_AGE` (each VM then has the longest age from the start to be seen
        // again, as in placement).
        let kept_s = ages
            .map_or(0, |a| a.horizon_s() as u64)
            .max(MAX_AGE.as_secs());
        // A clock stepped back since: what it says of the guests' time is not to be had.
        let future = |s: &Saved| s.written.saturating_sub(now) > FUTURE_SLACK_S;
        let unreadable = unreadable || saved.as_ref().is_ok_and(future);
        let saved = match saved {
            Ok(s) if future(&s) => Err(format!(
                "written {} s in the future: the clock stepped back?",
                s.written - now
            )),
            // An older version's file reads: what it lacks takes its default (a newer
            // one's was told above).
            Ok(s) if s.version == 0 => Err(format!("version 0, not 1 to {VERSION}")),
            Ok(s) if age(&s) > kept_s => {
                Err(format!("written {} s ago, more than {kept_s} s", age(&s)))
            }
            other => other,
        };
        let mut saved = match saved {
            Ok(s) => s,
            Err(why) => {
                let message = format!(
                    "state file {} ignored ({why}): starting afresh",
                    path.display()
                );
                return (state, message, unreadable.then_some(UNREADABLE));
            }
        };
        let elapsed_s = age(&saved);
        let elapsed = elapsed_s as f64;
        // Older than `MAX_AGE`: the cold ages only.
        let only_ages = elapsed_s > MAX_AGE.as_secs();
        if only_ages {
            for vm in saved.vms.values_mut() {
                (vm.target, vm.memtide) = (None, None);
            }
        }
        let mut memory = BTreeMap::new();
        for (name, vm) in &saved.vms {
            if let Some(m) = &vm.memtide {
                let hold_s = (m.hold_s - elapsed).max(0.0);
                memory.insert(
                    name.clone(),
                    (
                        vm.configured,
                        FusedMemory {
                            hold_s,
                            ..m.clone()
                        },
                    ),
                );
            }
            if let Some(target) = vm.target {
                state.targets.insert(name.clone(), (vm.configured, target));
            }
            // Checked against the process it runs in where its estimator or target is
            // restored (neither is, past `MAX_AGE`).
            let restored = vm.memtide.is_some() || vm.target.is_some();
            if let Some(hypervisor) = vm.hypervisor.filter(|_| restored) {
                state.restored_in.insert(name.clone(), hypervisor);
            }
            if let (Some(ages), Some(age_s)) = (ages, vm.cold_age_s) {
                let age = ColdAge::resume(ages, age_s);
                let size = LearntFor::Size(vm.configured);
                state.cold_ages.insert(name.clone(), (size, age));
            }
        }
        if let Some(ages) = ages {
            for (name, p) in &saved.processes {
                let age = ColdAge::resume(ages, p.cold_age_s);
                let process = LearntFor::Process(p.pid, p.started);
                state.cold_ages.insert(name.clone(), (process, age));
            }
        }
        let only = if only_ages {
            format!(", more than {} s: its cold ages only", MAX_AGE.as_secs())
        } else {
            String::new()
        };
        let message = format!(
            "state of {} VMs restored from {} (written {elapsed} s ago{only}): {} estimator states, {} balloon targets, {} cold ages",
            saved.vms.len() + saved.processes.len(),
            path.display(),
            memory.len(),
            state.targets.len(),
            state.cold_ages.len()
        );
        engine.recall(memory);
        state.last = saved.vms;
        (state, message, None)
    }

    /// Give each VM the target restored for it (same configured size): at its first
    /// sight since the start (it may be inflating to it), then for as long as the guest
    /// is at it — the target QEMU holds, for the engine, status and /metrics — until its
    /// backend knows one of its own (memtide sent it one since), the guest resets or shuts
    /// down, or it is found elsewhere (a new QEMU under the name, a target set by hand):
    /// the engine then sends its own rather than take an old one as delivered.
    pub fn restore_targets(&mut self, vms: &mut [VmSnapshot]) {
        for vm in vms {
            let Some(&(configured, target)) = self.targets.get(&vm.name) else {
                continue;
            };
            // Unreachable this tick: kept for the next.
            let Ok(sample) = &vm.sample else {
                continue;
            };
            let reset = sample
                .events
                .iter()
                .any(|e| matches!(e, VmEvent::Reset | VmEvent::Shutdown));
            let first = self.given.insert(vm.name.clone());
            let at_it = sample.balloon.is_some_and(|actual| {
                actual.abs_diff(target) <= Bytes::from_mib(4).max(target.scale(0.01))
            });
            if vm.target.is_some() || sample.configured != configured || reset || !(first || at_it)
            {
                self.targets.remove(&vm.name);
            } else {
                vm.target = Some(target);
            }
        }
    }

    /// VM `vm` connected, in `hypervisor` where known: what became of the state restored
    /// for it, for the event log, at its first connection since the start where that
    /// state was kept for a process. In another process (the VM restarted while no daemon
    /// ran) the target restored for it is forgotten, and the caller forgets its estimator
    /// ([`Engine::forget_recalled`]). In a process not known yet the state is used
    /// unchecked until [`StateFile::process_found`].
    pub fn connected(&mut self, vm: &str, hypervisor: Option<(u32, u64)>) -> Option<Restored> {
        let Some(now) = hypervisor.map(Hypervisor::from) else {
            self.hypervisors.remove(vm);
            let then = self.restored_in.get(vm)?;
            return Some(Restored::Unchecked(format!(
                "its state restored unchecked: it was kept for hypervisor process {} \
                 (started {} clock ticks after boot), and the process the VM runs in is not \
                 known yet; checked if it becomes known",
                then.pid, then.started
            )));
        };
        self.hypervisors.insert(vm.to_string(), now);
        self.restarted(vm, now, "its state not restored")
            .map(Restored::Afresh)
    }

    /// VM `vm`'s hypervisor process became known after it connected: what is kept of it
    /// from now on is kept for that process. Where the state restored for it was kept for
    /// another (it was used unchecked meanwhile), it is forgotten as at
    /// [`StateFile::connected`], and why returned.
    pub fn process_found(&mut self, vm: &str, hypervisor: (u32, u64)) -> Option<String> {
        let now = Hypervisor::from(hypervisor);
        self.hypervisors.insert(vm.to_string(), now);
        self.restarted(vm, now, "its state restored unchecked is forgotten")
    }

    /// Whether VM `vm`, found in process `now`, ran in another when its restored state
    /// was kept: if so its restored target goes, and the sentence saying so begins with
    /// `what`.
    fn restarted(&mut self, vm: &str, now: Hypervisor, what: &str) -> Option<String> {
        let then = self.restored_in.remove(vm)?;
        if then == now {
            return None;
        }
        self.targets.remove(vm);
        Some(format!(
            "{what}: it was kept for hypervisor process {} (started {} clock ticks after \
             boot), and the VM runs in process {} (started {}): it restarted meanwhile, and \
             its estimator and balloon target start afresh",
            then.pid, then.started, now.pid, now.started
        ))
    }

    /// VM `vm` was lost: a target restored for it is no longer in force (its hypervisor
    /// may come back started afresh), nor is its restored state checked any more against
    /// the process it was kept for (what was learnt since is the VM's own).
    pub fn forget_target(&mut self, vm: &str) {
        self.targets.remove(vm);
        self.restored_in.remove(vm);
    }

    /// The cold ages restored, each with what it was learnt for, for
    /// [`super::place::TierPlacer::resume`].
    pub fn take_cold_ages(&mut self) -> BTreeMap<String, (LearntFor, ColdAge)> {
        std::mem::take(&mut self.cold_ages)
    }

    /// Write [`StateFile::encode`]'s bytes off the runtime's worker, which serves every
    /// VM's I/O: the two fsyncs take milliseconds.
    pub async fn write_off_worker(&self, bytes: Vec<u8>) -> std::io::Result<()> {
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || write_atomically(&path, &bytes))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)))
    }

    /// The state after `decision`, with `engine`'s memory at the decision's time and the
    /// placed VMs' cold `ages` (each only for a VM of the size it was learnt at, and those
    /// of the `pid` VMs with their process). A VM not sampled this tick (unreachable)
    /// keeps what the file held for it, with the estimator the engine still has and its
    /// age; a VM gone from the decision is dropped.
    pub fn encode(
        &mut self,
        decision: &Decision,
        engine: &Engine,
        ages: &BTreeMap<String, KeptAge>,
    ) -> Vec<u8> {
        let mut memory = engine.memory(decision.at);
        let vms: BTreeMap<String, SavedVm> = decision
            .vms
            .iter()
            .filter_map(|vm| {
                let memtide = memory.remove(&vm.name);
                let age = ages.get(&vm.name);
                let vm_state = match vm.configured {
                    Some(configured) => SavedVm {
                        configured,
                        target: vm.target,
                        memtide,
                        cold_age_s: age.and_then(|a| a.for_size(configured)),
                        // Until the process it runs in is known, the one its restored state is
                        // to be checked against: a restart meanwhile still checks it.
                        hypervisor: (self.hypervisors.get(&vm.name))
                            .or(self.restored_in.get(&vm.name))
                            .copied(),
                    },
                    None => {
                        let last = self.last.remove(&vm.name)?;
                        let age = age.and_then(|a| a.for_size(last.configured));
                        SavedVm {
                            memtide: memtide.or(last.memtide),
                            cold_age_s: age.or(last.cold_age_s),
                            ..last
                        }
                    }
                };
                Some((vm.name.clone(), vm_state))
            })
            .collect();
        let processes = ages
            .iter()
            .filter_map(|(vm, age)| {
                let (pid, started) = age.process?;
                let cold_age_s = age.age_s;
                let saved = SavedProcess {
                    pid,
                    started,
                    cold_age_s,
                };
                Some((vm.clone(), saved))
            })
            .collect();
        let saved = Saved {
            version: VERSION,
            written: unix_now(),
            vms,
            processes,
        };
        let bytes = serde_json::to_vec(&saved).expect("state serializes");
        self.last = saved.vms;
        bytes
    }
}

/// Replace `path` by `bytes` so that a crash at any point leaves the old file or the new
/// one, whole: write a temporary file beside it, fsync it, rename it over, fsync the
/// directory.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    let tmp = dir.join(name);
    let mut file = std::fs::File::create(&tmp)?;
    let written = file.write_all(bytes).and_then(|()| file.sync_all());
    if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use memtide_core::estimate::fused::FusedConfig;
    use memtide_core::policy::ksmtuned::KsmConfig;
    use memtide_core::policy::none::Unmanaged;
    use memtide_core::policy::working_set::{EstimatorConfig, WorkingSet, WorkingSetConfig};
    use memtide_core::snapshot::BackendError;
    use memtide_core::testkit::{host, snapshot, vm};
    use memtide_core::EngineConfig;

    fn memtide() -> Engine {
        let policy = WorkingSet::new(
            EstimatorConfig::Fused(FusedConfig::default()),
            WorkingSetConfig::default(),
            KsmConfig::default(),
        );
        Engine::new(EngineConfig::default(), Box::new(policy))
    }

    /// The rule behind the first decision about VM `a` of a new engine given `path`'s
    /// state, the message logged, and the target restored for `a` (configured 1000 MiB).
    fn restart(path: &Path, configured: u64) -> (String, String, Option<Bytes>) {
        restart_in(path, configured, None)
    }

    /// [`restart`], VM `a` connecting in `hypervisor`; the message is what its connection
    /// logged, if anything, else what opening the file did.
    fn restart_in(
        path: &Path,
        configured: u64,
        hypervisor: Option<(u32, u64)>,
    ) -> (String, String, Option<Bytes>) {
        let mut engine = memtide();
        let (mut state, mut message, _) = StateFile::open(path, &mut engine, None);
        match state.connected("a", hypervisor) {
            Some(Restored::Afresh(why)) => {
                engine.forget_recalled("a");
                message = why;
            }
            Some(Restored::Unchecked(why)) => message = why,
            None => {}
        }
        let mut vms = vec![vm("a", configured, 600, 200)];
        state.restore_targets(&mut vms);
        let target = vms[0].target;
        let d = engine.tick(&snapshot(0, host(4000, 1500), vms));
        let rule = d.vms[0].reason.as_ref().unwrap().rule.to_string();
        (rule, message, target)
    }

    /// An engine that shrank guest `a` from 1000 to 600 MiB over a few ticks, and its
    /// last decision.
    fn shrunk_from_1000_to_600() -> (Engine, Decision) {
        let mut engine = memtide();
        let mut d = None;
        for (t, size) in [(0, 1000), (2, 800), (4, 600), (6, 600)] {
            let mut a = vm("a", 1000, size, 200);
            a.target = Some(Bytes::from_mib(580));
            d = Some(engine.tick(&snapshot(t, host(4000, 1500), vec![a])));
        }
        (engine, d.expect("decided"))
    }

    #[test]
    fn each_state_version_still_reads() {
        // Written by version 1 with every optional field: a field added since must take a
        // default (an older file lacks it), and VERSION goes up with it.
        let frozen = include_str!("../../tests/formats/state-version-1.json");
        let saved: Saved = serde_json::from_str(frozen).expect("version 1 no longer reads");
        let vm = &saved.vms["a"];
        assert!(vm.memtide.is_some() && vm.hypervisor.is_some() && vm.cold_age_s.is_some());
        assert_eq!(saved.processes["batch"].cold_age_s, 120.0);
        assert_eq!(
            serde_json::to_string_pretty(&saved).unwrap() + "\n",
            frozen,
            "a field of the state file changed: bump daemon::state::VERSION, add \
             tests/formats/state-version-N.json and test it here, keeping the old ones"
        );
    }

    #[test]
    fn a_restarted_daemon_goes_on_where_the_last_one_stood() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        // A guest shrunk from 1000 to 600 MiB over a few ticks, then memtide killed.
        let (engine, d) = shrunk_from_1000_to_600();
        let in_force = d.vms[0].target;
        assert!(in_force.is_some());
        let mut file = StateFile::open(&path, &mut memtide(), None).0;
        write_atomically(&path, &file.encode(&d, &engine, &BTreeMap::new())).unwrap();
        let saved: Saved = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(saved.version, VERSION);
        let a = &saved.vms["a"];
        assert_eq!(a.configured, Bytes::from_mib(1000));
        assert!(a.memtide.is_some());
        assert!(!dir.path().join("state.json.tmp").exists());
        let (rule, message, target) = restart(&path, 1000);
        assert!(rule != "memtide.adopt" && rule != "memtide.start", "{rule}");
        assert!(
            message.starts_with("state of 1 VMs restored from"),
            "{message}"
        );
        assert_eq!(target, in_force);
        // The same name at another size is another VM: adopted as found.
        let (rule, _, target) = restart(&path, 2000);
        assert_eq!((rule.as_str(), target), ("memtide.adopt", None));

        // The restored target is the one in force at first sight (the guest may be
        // inflating to it), then while the guest is at it, until memtide sends one of
        // its own, the guest resets, or the VM is lost.
        let restored = |state: &mut StateFile, a: VmSnapshot| {
            let mut vms = vec![a];
            state.restore_targets(&mut vms);
            vms[0].target
        };
        let in_force_mib = in_force.unwrap().as_f64() as u64 >> 20;
        let at_it = || vm("a", 1000, in_force_mib, 200);
        let mut state = StateFile::open(&path, &mut memtide(), None).0;
        assert_eq!(restored(&mut state, vm("a", 1000, 600, 200)), in_force);
        for _ in 0..3 {
            assert_eq!(restored(&mut state, at_it()), in_force);
        }
        // Found at another size than it (a new QEMU under the name): memtide's own goes.
        assert_eq!(restored(&mut state, vm("a", 1000, 1000, 600)), None);
        assert_eq!(restored(&mut state, at_it()), None);
        let mut state = StateFile::open(&path, &mut memtide(), None).0;
        assert_eq!(restored(&mut state, at_it()), in_force);
        let mut own = vm("a", 1000, 600, 200);
        own.target = Some(Bytes::from_mib(550));
        assert_eq!(restored(&mut state, own), Some(Bytes::from_mib(550)));
        assert_eq!(restored(&mut state, vm("a", 1000, 600, 200)), None);
        let mut state = StateFile::open(&path, &mut memtide(), None).0;
        let mut reset = vm("a", 1000, 1000, 600);
        if let Ok(s) = &mut reset.sample {
            s.events = vec![VmEvent::Reset];
        }
        assert_eq!(restored(&mut state, reset), None);
        assert_eq!(restored(&mut state, vm("a", 1000, 600, 200)), None);
        let mut state = StateFile::open(&path, &mut memtide(), None).0;
        state.forget_target("a");
        assert_eq!(restored(&mut state, vm("a", 1000, 600, 200)), None);
    }

    #[test]
    fn a_vm_that_restarted_while_no_daemon_ran_starts_afresh() {
        // Before: a VM found under its name at its size after a restart had its estimate
        // and target recalled, whatever had become of it meanwhile.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let (engine, d) = shrunk_from_1000_to_600();
        let mut file = StateFile::open(&path, &mut memtide(), None).0;
        assert_eq!(
            file.connected("a", Some((4242, 1000))),
            None,
            "nothing kept"
        );
        write_atomically(&path, &file.encode(&d, &engine, &BTreeMap::new())).unwrap();
        // The same process: it goes on.
        let (rule, message, target) = restart_in(&path, 1000, Some((4242, 1000)));
        assert!(rule != "memtide.adopt" && rule != "memtide.start", "{rule}");
        assert!(message.starts_with("state of 1 VMs restored"), "{message}");
        assert!(target.is_some());
        // Where the process is not known, unchecked until it is (below), and said.
        let (rule, message, target) = restart_in(&path, 1000, None);
        assert!(rule != "memtide.adopt" && target.is_some(), "{rule}");
        assert_eq!(
            message,
            "its state restored unchecked: it was kept for hypervisor process 4242 (started \
             1000 clock ticks after boot), and the process the VM runs in is not known yet; \
             checked if it becomes known"
        );
        // Another process under the pid, started later: afresh, and said.
        let (rule, message, target) = restart_in(&path, 1000, Some((4242, 2000)));
        assert_eq!((rule.as_str(), target), ("memtide.adopt", None));
        assert_eq!(
            message,
            "its state not restored: it was kept for hypervisor process 4242 (started 1000 \
             clock ticks after boot), and the VM runs in process 4242 (started 2000): it \
             restarted meanwhile, and its estimator and balloon target start afresh"
        );
        // The file written after keeps the process it runs in now.
        let mut file = StateFile::open(&path, &mut memtide(), None).0;
        file.connected("a", Some((4300, 3000)));
        file.encode(&d, &engine, &BTreeMap::new());
        assert_eq!(
            file.last["a"].hypervisor,
            Some(Hypervisor::from((4300, 3000)))
        );
        // So does one whose process was found after it connected; until then, the one
        // its restored state is to be checked against (a restart meanwhile checks it).
        let mut file = StateFile::open(&path, &mut memtide(), None).0;
        file.connected("a", None);
        file.encode(&d, &engine, &BTreeMap::new());
        assert_eq!(
            file.last["a"].hypervisor,
            Some(Hypervisor::from((4242, 1000)))
        );
        assert!(file.process_found("a", (4400, 4000)).is_some());
        file.encode(&d, &engine, &BTreeMap::new());
        assert_eq!(
            file.last["a"].hypervisor,
            Some(Hypervisor::from((4400, 4000)))
        );
    }

    #[test]
    fn a_vm_whose_process_is_found_after_it_connected_is_checked_then() {
        // Before: a VM connected before its process was known (a libvirt domain whose QEMU
        // a scan found later) had its state restored, and never checked once the process
        // was known: a VM restarted while no daemon ran went on with another run's state.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let (engine, d) = shrunk_from_1000_to_600();
        let in_force_mib = d.vms[0].target.unwrap().as_f64() as u64 >> 20;
        let mut file = StateFile::open(&path, &mut memtide(), None).0;
        file.connected("a", Some((4242, 1000)));
        write_atomically(&path, &file.encode(&d, &engine, &BTreeMap::new())).unwrap();
        // Connected unknown, ticked on its restored state (the guest at its restored
        // target), then found in `found`.
        let found_later = |found: (u32, u64), lost: bool| {
            let mut engine = memtide();
            let mut state = StateFile::open(&path, &mut engine, None).0;
            assert!(matches!(
                state.connected("a", None),
                Some(Restored::Unchecked(_))
            ));
            let mut rules = Vec::new();
            let mut targets = Vec::new();
            let mut said = None;
            for t in 0..3 {
                if t == 2 {
                    if lost {
                        state.forget_target("a");
                    }
                    said = state.process_found("a", found);
                    if said.is_some() {
                        engine.forget_recalled("a");
                    }
                }
                let mut vms = vec![vm("a", 1000, in_force_mib, 200)];
                state.restore_targets(&mut vms);
                targets.push(vms[0].target);
                let d = engine.tick(&snapshot(t, host(4000, 1500), vms));
                rules.push(d.vms[0].reason.as_ref().unwrap().rule.to_string());
            }
            (rules, targets, said)
        };
        let afresh = |rule: &str| rule == "memtide.adopt" || rule == "memtide.start";
        // The process it was kept for: it goes on, unsaid.
        let (rules, targets, said) = found_later((4242, 1000), false);
        assert_eq!(said, None);
        assert!(!rules.iter().any(|r| afresh(r)), "{rules:?}");
        assert!(targets.iter().all(Option::is_some), "{targets:?}");
        // Another: its target and estimator are forgotten from then on, and said.
        let (rules, targets, said) = found_later((4242, 2000), false);
        assert_eq!(
            said.as_deref(),
            Some(
                "its state restored unchecked is forgotten: it was kept for hypervisor \
                 process 4242 (started 1000 clock ticks after boot), and the VM runs in \
                 process 4242 (started 2000): it restarted meanwhile, and its estimator and \
                 balloon target start afresh"
            )
        );
        assert!(!afresh(&rules[1]) && afresh(&rules[2]), "{rules:?}");
        assert!(targets[1].is_some() && targets[2].is_none(), "{targets:?}");
        // Lost before it was found: what it learnt meanwhile is its own.
        let (rules, _, said) = found_later((4242, 2000), true);
        assert_eq!(said, None);
        assert!(!afresh(&rules[2]), "{rules:?}");
        // Nothing of it restored (no estimator nor target: unmanaged): nothing said.
        let mut none = Engine::new(EngineConfig::default(), Box::new(Unmanaged));
        let d = none.tick(&snapshot(
            0,
            host(4000, 1500),
            vec![vm("a", 1000, 1000, 200)],
        ));
        write_atomically(&path, &file.encode(&d, &none, &BTreeMap::new())).unwrap();
        let mut state = StateFile::open(&path, &mut memtide(), None).0;
        assert_eq!(state.connected("a", None), None);
        assert_eq!(state.process_found("a", (4242, 2000)), None);
    }

    #[test]
    fn a_vm_not_sampled_for_a_tick_keeps_what_was_learnt_of_it() {
        // A guest shrunk to 600 MiB, then one tick whose sample came too late: its
        // estimator goes on afterwards, and the state file written then still holds it.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let mut engine = memtide();
        let mut file = StateFile::open(&path, &mut memtide(), None).0;
        let shrunk = || {
            let mut a = vm("a", 1000, 600, 200);
            a.target = Some(Bytes::from_mib(580));
            a
        };
        let aged = BTreeMap::from([("a".to_string(), kept(120.0, None))]);
        let mut in_force = None;
        for t in [0, 2, 4, 6] {
            let d = engine.tick(&snapshot(t, host(4000, 1500), vec![shrunk()]));
            in_force = d.vms[0].target;
            file.encode(&d, &engine, &aged);
        }
        assert!(in_force.is_some());
        let late = VmSnapshot {
            sample: Err(BackendError::timeout(std::time::Duration::from_secs(1))),
            ..shrunk()
        };
        let d = engine.tick(&snapshot(8, host(4000, 1500), vec![late]));
        write_atomically(&path, &file.encode(&d, &engine, &BTreeMap::new())).unwrap();
        let saved: Saved = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let a = &saved.vms["a"];
        assert_eq!(a.configured, Bytes::from_mib(1000));
        assert_eq!(a.target, in_force);
        assert!(a.memtide.is_some());
        assert_eq!(
            a.cold_age_s,
            Some(120.0),
            "its age while the placer is away"
        );
        let d = engine.tick(&snapshot(10, host(4000, 1500), vec![shrunk()]));
        let rule = d.vms[0].reason.as_ref().unwrap().rule.to_string();
        assert!(rule != "memtide.adopt" && rule != "memtide.start", "{rule}");
        // A VM gone from the decision is dropped from the file.
        let d = engine.tick(&snapshot(12, host(4000, 1500), vec![]));
        file.encode(&d, &engine, &BTreeMap::new());
        assert!(file.last.is_empty());
    }

    fn kept(age_s: f64, unchecked_size: Option<Bytes>) -> KeptAge {
        KeptAge {
            age_s,
            unchecked_size,
            process: None,
        }
    }

    /// Each VM's cold age as `ages` (`None`: no placement) restores it from `path`.
    fn restored_ages(path: &Path, ages: Option<&AgeConfig>) -> (Vec<(String, f64)>, String) {
        let (mut state, message, _) = StateFile::open(path, &mut memtide(), ages);
        let restored = state.take_cold_ages().into_iter();
        let restored = restored.map(|(vm, (learnt_for, age))| {
            assert_eq!(learnt_for, LearntFor::Size(Bytes::from_mib(1000)));
            (vm, age.age_s())
        });
        (restored.collect(), message)
    }

    #[test]
    fn a_vms_cold_age_is_restored_within_the_bounds_configured_now() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let mut engine = memtide();
        let vms = vec![vm("a", 1000, 600, 200), vm("b", 1000, 600, 200)];
        let d = engine.tick(&snapshot(0, host(4000, 1500), vms));
        let mut file = StateFile::open(&path, &mut memtide(), None).0;
        // b's age, restored and not yet checked against b, was learnt at another size:
        // it is not saved for b as it is now.
        let learnt = BTreeMap::from([
            ("a".to_string(), kept(480.0, None)),
            ("b".to_string(), kept(45.0, Some(Bytes::from_mib(2000)))),
        ]);
        write_atomically(&path, &file.encode(&d, &engine, &learnt)).unwrap();
        let saved: Saved = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(saved.vms["a"].cold_age_s, Some(480.0));
        assert_eq!(saved.vms["b"].cold_age_s, None);
        let learnt = BTreeMap::from([
            ("a".to_string(), kept(480.0, None)),
            ("b".to_string(), kept(45.0, Some(Bytes::from_mib(1000)))),
        ]);
        write_atomically(&path, &file.encode(&d, &engine, &learnt)).unwrap();
        let both = |a, b| vec![("a".to_string(), a), ("b".to_string(), b)];
        let (ages, message) = restored_ages(&path, Some(&AgeConfig::default()));
        assert_eq!(ages, both(480.0, 45.0));
        assert!(
            message.ends_with("0 balloon targets, 2 cold ages"),
            "{message}"
        );
        // The bounds changed since: each age is brought within them.
        let narrower = AgeConfig {
            min_s: 60.0,
            max_s: 300.0,
            ..AgeConfig::default()
        };
        assert_eq!(restored_ages(&path, Some(&narrower)).0, both(300.0, 60.0));
        // A fixed age, or no placement: none restored.
        let fixed = AgeConfig {
            adaptive: false,
            ..AgeConfig::default()
        };
        let (ages, message) = restored_ages(&path, Some(&fixed));
        assert!(
            ages.is_empty() && message.ends_with(", 0 cold ages"),
            "{message}"
        );
        assert!(restored_ages(&path, None).0.is_empty());
        // Written longer ago than the balloon state is kept, within the longest age: the
        // cold ages only (the estimator's and targets' figures no longer hold); past it,
        // nothing.
        let mut saved: Saved = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        saved.vms.get_mut("a").unwrap().target = Some(Bytes::from_mib(600));
        assert!(
            saved.vms["a"].memtide.is_some(),
            "the estimator's state was saved"
        );
        saved.written = unix_now() - MAX_AGE.as_secs() - 60;
        std::fs::write(&path, serde_json::to_vec(&saved).unwrap()).unwrap();
        let (mut state, message, _) =
            StateFile::open(&path, &mut memtide(), Some(&AgeConfig::default()));
        assert!(
            message.contains("more than 600 s: its cold ages only): 0 estimator states, 0 balloon targets, 2 cold ages"),
            "{message}"
        );
        assert!(state.targets.is_empty());
        assert!(state
            .last
            .values()
            .all(|vm| vm.target.is_none() && vm.memtide.is_none()));
        assert_eq!(state.take_cold_ages().len(), 2);
        // Where the age is fixed, or without placement, the file is just too old.
        for ages in [Some(&fixed), None] {
            let (_, message, _) = StateFile::open(&path, &mut memtide(), ages);
            assert!(message.contains("ignored (written 66"), "{message}");
        }
        saved.written = unix_now() - AgeConfig::default().max_s as u64 - 60;
        std::fs::write(&path, serde_json::to_vec(&saved).unwrap()).unwrap();
        let (ages, message) = restored_ages(&path, Some(&AgeConfig::default()));
        assert!(
            ages.is_empty() && message.contains("ignored ("),
            "{message}"
        );
    }

    /// A state file written now, of version 1, whose `vms` are `vms` (JSON), in a
    /// temporary directory: as an older daemon wrote it.
    fn older_file(vms: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let old = format!(r#"{{"version":1,"written":{},"vms":{vms}}}"#, unix_now());
        std::fs::write(&path, old).unwrap();
        (dir, path)
    }

    #[test]
    fn a_state_file_without_cold_ages_still_loads() {
        // As written before the ages were kept.
        let (_dir, path) = older_file(r#"{"a":{"configured":1048576000,"target":608174080}}"#);
        let (ages, message) = restored_ages(&path, Some(&AgeConfig::default()));
        assert!(ages.is_empty());
        assert!(
            message.starts_with("state of 1 VMs restored from")
                && message.ends_with("1 balloon targets, 0 cold ages"),
            "{message}"
        );
        let (_, _, target) = restart(&path, 1000);
        assert_eq!(target, Some(Bytes::from_mib(580)));
    }

    #[test]
    fn a_state_file_without_pid_vms_still_loads() {
        // As written before the `pid` VMs' ages were kept.
        let (_dir, path) = older_file(r#"{"a":{"configured":1048576000,"cold_age_s":120.0}}"#);
        let (ages, message) = restored_ages(&path, Some(&AgeConfig::default()));
        assert_eq!(ages, [("a".to_string(), 120.0)], "{message}");
        // Nor is there anything new in a file without them.
        let mut engine = memtide();
        let vms = vec![vm("a", 1000, 600, 200)];
        let d = engine.tick(&snapshot(0, host(4000, 1500), vms));
        let learnt = BTreeMap::from([("a".to_string(), kept(120.0, None))]);
        let bytes = StateFile::open(&path, &mut memtide(), None)
            .0
            .encode(&d, &engine, &learnt);
        assert!(!String::from_utf8(bytes).unwrap().contains("processes"));
    }

    /// The pid of the `[[vm]]` `batch` configured by `pid` in these tests: none on the
    /// host (above the kernel's most), so that its scans fail without a kernel.
    const PID: i32 = 1 << 23;

    /// A procfs at `proc` whose process [`PID`] started at `started`.
    fn batch_process(proc: &Path, started: u64) {
        let dir = proc.join(PID.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        let stat = format!(
            "{PID} (batch) S 1 {PID} {PID} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {started} 0 0\n"
        );
        std::fs::write(dir.join("stat"), stat).unwrap();
    }

    /// `batch`'s cold age as a daemon started on `path`'s state with the procfs at `proc`
    /// keeps it after its first pass over `batch`.
    fn batch_after_restart(path: &Path, proc: &Path) -> Option<KeptAge> {
        use crate::daemon::place::{Target, TierPlacer};
        let config = crate::config::TieringConfig::default();
        let (mut state, _, _) = StateFile::open(path, &mut memtide(), Some(&config.ages()));
        let sys = tempfile::tempdir().unwrap();
        let nodes = crate::placement::Nodes { fast: 0, slow: 1 };
        let mut placer = TierPlacer::new(nodes, &config, proc.into(), sys.path().into());
        placer.resume(state.take_cold_ages());
        let batch = Target {
            vm: "batch".into(),
            pid: PID,
            mappings: memtide_adapters::access::Mappings::Private,
            shares: 1000,
            budget: None,
            fixed: true,
            started: None,
        };
        placer.pass(&[batch], Duration::from_secs(1), false);
        placer.ages().get("batch").copied()
    }

    #[test]
    fn a_pid_vms_cold_age_is_resumed_for_the_same_process_only() {
        // A `[[vm]]` placed by `pid` alone is in no decision: its age is kept apart, with
        // its process (until issue #12, not at all).
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let proc = dir.path().join("proc");
        batch_process(&proc, 100);
        let mut engine = memtide();
        let vms = vec![vm("a", 1000, 600, 200)];
        let d = engine.tick(&snapshot(0, host(4000, 1500), vms));
        let batch = KeptAge {
            process: Some((PID, 100)),
            ..kept(240.0, None)
        };
        let learnt = BTreeMap::from([
            ("a".to_string(), kept(480.0, None)),
            ("batch".to_string(), batch),
        ]);
        let mut file = StateFile::open(&path, &mut memtide(), None).0;
        write_atomically(&path, &file.encode(&d, &engine, &learnt)).unwrap();
        let saved: Saved = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert!(!saved.vms.contains_key("batch"));
        let process = SavedProcess {
            pid: PID,
            started: 100,
            cold_age_s: 240.0,
        };
        assert_eq!(saved.processes["batch"], process);
        let ages = AgeConfig::default();
        let (mut state, message, _) = StateFile::open(&path, &mut memtide(), Some(&ages));
        assert!(
            message.starts_with("state of 2 VMs restored from")
                && message.ends_with("0 balloon targets, 2 cold ages"),
            "{message}"
        );
        let resumed = (LearntFor::Process(PID, 100), ColdAge::resume(&ages, 240.0));
        assert_eq!(state.take_cold_ages()["batch"], resumed);
        // The same process at the pid: its age from its first pass, kept with it again.
        assert_eq!(batch_after_restart(&path, &proc), Some(batch));
        // Another process given the pid since, or none there: the age is dropped.
        batch_process(&proc, 900);
        assert_eq!(batch_after_restart(&path, &proc), None);
        std::fs::remove_dir_all(&proc).unwrap();
        assert_eq!(batch_after_restart(&path, &proc), None);
        // A fixed age: none restored.
        let fixed = AgeConfig {
            adaptive: false,
            ..ages
        };
        let (mut state, _, _) = StateFile::open(&path, &mut memtide(), Some(&fixed));
        assert!(state.take_cold_ages().is_empty());
    }

    #[test]
    fn unusable_state_is_ignored_with_its_reason() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let (rule, message, _) = restart(&path, 1000);
        assert_eq!(rule, "memtide.adopt");
        assert!(message.starts_with("no state file at"), "{message}");
        let stale = Saved {
            version: VERSION,
            written: unix_now() - MAX_AGE.as_secs() - 5,
            vms: BTreeMap::new(),
            processes: BTreeMap::new(),
        };
        let other = Saved {
            version: VERSION + 1,
            written: unix_now(),
            ..stale.clone()
        };
        let ahead = Saved {
            written: unix_now() + 100_000,
            ..stale.clone()
        };
        let mut same_with_a_field_added: serde_json::Value = serde_json::to_value(&stale).unwrap();
        same_with_a_field_added["added_later"] = 1.into();
        let same_with_a_field_added = same_with_a_field_added.to_string().into_bytes();
        // A damaged file and one dated in the future (found by an audit: taken as
        // written 0 s ago) are warnings; an old one and another version's are not.
        let cases = [
            (
                b"{\"version\": 1, \"writ".to_vec(),
                "EOF while parsing",
                true,
            ),
            (
                serde_json::to_vec(&stale).unwrap(),
                "s ago, more than 600 s",
                false,
            ),
            (
                serde_json::to_vec(&Saved {
                    version: 0,
                    ..other.clone()
                })
                .unwrap(),
                "version 0, not 1 to 1",
                false,
            ),
            // A field this version does not know, in a file of its own version: damaged.
            (
                same_with_a_field_added.clone(),
                "unknown field `added_later`",
                true,
            ),
            (serde_json::to_vec(&ahead).unwrap(), "s in the future", true),
        ];
        for (bytes, why, warned) in cases {
            std::fs::write(&path, bytes).unwrap();
            let (rule, message, target) = restart(&path, 1000);
            assert_eq!((rule.as_str(), target), ("memtide.adopt", None));
            assert!(
                message.contains("ignored (") && message.contains(why),
                "{message}"
            );
            let (_, _, rule) = StateFile::open(&path, &mut memtide(), None);
            assert_eq!(rule, warned.then_some(UNREADABLE), "{why}");
        }
        // A newer memtide's file, with a field this one does not know (found by the
        // compatibility audit: warned of as damaged after a downgrade): said as a newer
        // one's, not as damaged.
        let mut newer: serde_json::Value = serde_json::to_value(&other).unwrap();
        newer["added_later"] = 1.into();
        for file in [
            serde_json::to_vec(&other).unwrap(),
            newer.to_string().into(),
        ] {
            std::fs::write(&path, file).unwrap();
            let (rule, message, target) = restart(&path, 1000);
            assert_eq!((rule.as_str(), target), ("memtide.adopt", None));
            let (_, told, rule) = StateFile::open(&path, &mut memtide(), None);
            assert_eq!(rule, None, "{told}");
            assert_eq!(
                told,
                format!(
                    "state file {} was written by a newer memtide (state version 2; this one \
                     reads 1): starting afresh",
                    path.display()
                )
            );
            assert_eq!(message, told);
        }
    }
}
