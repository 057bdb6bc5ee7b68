//! Tier placement in the daemon (`[tiering]`, `docs/tiering.md`): which nodes are the
//! fast and the slow tier, and one pass over the placed VMs — each one's pages scanned
//! and located ([`placement::Placer::measure`]), the fast tier divided among them all by
//! `tiering::place`, and each one's moves carried out.

use crate::config::TieringConfig;
use crate::placement::{self, Measured, Moved, Nodes, Placer};
use memtide_adapters::access::{Mappings, Method};
use memtide_adapters::procfs;
use memtide_adapters::tiers::Node;
use memtide_core::action::Reason;
use memtide_core::tiering::age::{AgeConfig, ColdAge};
use memtide_core::tiering::{self, FastTier, Placement, TierConfig};
use memtide_core::Bytes;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

/// The fast and the slow node: as configured, else the node with CPUs in the fastest
/// tier (the lowest id among equals) and the memory-only node in the slowest tier.
/// Refused when the host has fewer than two nodes with memory, a configured node is not
/// one of them, or no memory-only node can be the slow tier.
pub fn choose_nodes(nodes: &[Node], fast: Option<u32>, slow: Option<u32>) -> Result<Nodes, String> {
    let ids: Vec<u32> = nodes.iter().map(|n| n.id).collect();
    if nodes.len() < 2 {
        return Err(format!(
            "the host has {} NUMA node(s) with memory ({ids:?}): placement needs a fast and a \
             slow one",
            nodes.len()
        ));
    }
    let known = |which: &str, id: u32| {
        if ids.contains(&id) {
            Ok(id)
        } else {
            Err(format!(
                "[tiering] {which}_node {id} is not a node with memory ({ids:?})"
            ))
        }
    };
    // A node without a memory tier (a kernel before 6.1) ranks as the fastest.
    let rank = |n: &Node| n.tier.unwrap_or(0);
    let fast = match fast {
        Some(id) => known("fast", id)?,
        None => nodes
            .iter()
            .filter(|n| n.cpus || nodes.iter().all(|m| !m.cpus))
            .min_by_key(|n| (rank(n), n.id))
            .map(|n| n.id)
            .expect("two nodes"),
    };
    let slow = match slow {
        Some(id) => known("slow", id)?,
        None => nodes
            .iter()
            .filter(|n| !n.cpus && n.id != fast)
            .max_by_key(|n| (rank(n), std::cmp::Reverse(n.id)))
            .map(|n| n.id)
            .ok_or_else(|| {
                format!(
                    "no memory-only node to be the slow tier (nodes {ids:?} all have CPUs): \
                     set [tiering] slow_node"
                )
            })?,
    };
    if fast == slow {
        return Err(format!(
            "node {fast} cannot be both the fast and the slow tier: set [tiering] fast_node \
             and slow_node"
        ));
    }
    let id = |n: u32| i32::try_from(n).map_err(|_| format!("node {n} is out of range"));
    Ok(Nodes {
        fast: id(fast)?,
        slow: id(slow)?,
    })
}

/// Refuses a VM configured by `pid` that is the daemon itself (process `own`): it would
/// scan and move its own pages.
pub fn check_not_own(vms: &[crate::config::VmConfig], own: i32) -> Result<(), String> {
    match vms.iter().find(|vm| vm.pid == Some(own)) {
        Some(vm) => Err(format!(
            "VM {:?}'s pid {own} is memtide's own process, not a VM's",
            vm.name
        )),
        None => Ok(()),
    }
}

/// A VM to place this pass.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    /// Its name.
    pub vm: String,
    /// Its hypervisor's process (or the process configured with `pid`).
    pub pid: i32,
    /// Its guest RAM among the process's mappings.
    pub mappings: Mappings,
    /// Its weight when the fast tier is short.
    pub shares: u32,
    /// Its configured fast budget (`[[vm]] fast_budget_mib`).
    pub budget: Option<Bytes>,
    /// Configured by `pid` (fixed until the daemon restarts), not a connected VM's
    /// hypervisor: another process at that pid is not placed.
    pub fixed: bool,
    /// A connected VM's hypervisor's start time when it became known: a process at its
    /// pid started at another time (its pid taken since) is not placed.
    pub started: Option<u64>,
}

/// One pass of `placer` over `targets`, as the daemon runs it off the runtime: a panic
/// in it is caught and told, and the trackers, which it may have left half updated,
/// start afresh (the processes first seen at the `pid` VMs' pids are kept).
pub fn run_pass(
    mut placer: TierPlacer,
    targets: &[Target],
    at: Duration,
    dry_run: bool,
) -> (TierPlacer, Result<Vec<Outcome>, String>) {
    let outcomes = caught(|| placer.pass(targets, at, dry_run));
    if outcomes.is_err() {
        placer.drop_trackers();
    }
    (placer, outcomes)
}

/// `f`'s result, or its panic's message.
fn caught<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|panic| {
        panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".into())
    })
}

/// A connected VM as the fleet knows it.
pub struct Known<'a> {
    /// Its hypervisor's process and its start time when it became known, when known.
    pub process: Option<(u32, u64)>,
    /// Its `[[vm]]` entry, if any.
    pub config: Option<&'a crate::config::VmConfig>,
    /// Its guest RAM's mappings as last sampled, if ever.
    pub ram: Option<Mappings>,
}

/// The VMs to place: each of the connected `vms` the fleet knows (`known`) whose
/// hypervisor's process and start time are known — one whose sample failed this tick keeps its place,
/// with the mappings last sampled — then each configured by `pid`; not one configured
/// `place = false` (found by an audit: a VM whose pages cannot move, pinned by a VFIO
/// device, had them asked to move at every pass).
pub fn targets<'a>(
    vms: &[memtide_core::VmSnapshot],
    known: impl Fn(&str) -> Option<Known<'a>>,
    config: &crate::config::Config,
) -> Vec<Target> {
    let budget = |c: &crate::config::VmConfig| c.fast_budget_mib.map(Bytes::from_mib);
    let connected = vms.iter().filter_map(|vm| {
        let k = known(&vm.name)?;
        if k.config.is_some_and(|c| !c.place) {
            return None;
        }
        // A VM whose sample failed: the mappings last sampled, which only a tracker opened
        // in this pass goes by (one open since keeps its mappings).
        let mappings = match &vm.sample {
            Ok(sample) => Mappings::of(sample),
            Err(_) => k.ram?,
        };
        let (pid, started) = k.process?;
        Some(Target {
            vm: vm.name.clone(),
            pid: i32::try_from(pid).ok()?,
            mappings,
            shares: vm.limits.shares,
            budget: k.config.and_then(budget),
            fixed: false,
            started: Some(started),
        })
    });
    let by_pid = config.vms.iter().filter_map(|c| {
        Some(Target {
            vm: c.name.clone(),
            pid: c.pid?,
            mappings: Mappings::Private,
            shares: c.shares.unwrap_or(config.defaults.shares),
            budget: budget(c),
            fixed: true,
            started: None,
        })
    });
    connected.chain(by_pid).collect()
}

/// Cut the `placements`' demotions, in order, to the `room` the slow node `node` has
/// above its high watermark (found by an audit: all the VMs' demotions together could
/// exceed it, the kernel then reclaiming the slow node's pages — other VMs' — before
/// failing with ENOMEM), and promotions by as much, as they counted on the fast memory
/// the demotions cut would have freed (a VM's own first, its exchanges; then the others',
/// in order): the reasons of those cut say so.
fn fit_demotions(placements: &mut [Option<Placement>], mut room: Bytes, node: i32) {
    let mut owed = Bytes::ZERO;
    for p in placements.iter_mut().flatten() {
        if p.demote <= room {
            room = room - p.demote;
            continue;
        }
        let cut = p.demote - room;
        p.reason.detail += &format!(
            "; demotion cut from {} to {room}: what slow node {node} has free",
            p.demote
        );
        p.demote = room;
        p.demote_free = p.demote_free.min(room);
        room = Bytes::ZERO;
        owed += less_promoted(p, cut);
    }
    for p in placements.iter_mut().flatten() {
        owed = less_promoted(p, owed);
    }
}

/// Cut `p`'s promotion by `by` at most, saying so; returns what it could not cut.
fn less_promoted(p: &mut Placement, by: Bytes) -> Bytes {
    let less = p.promote.min(by);
    if less > Bytes::ZERO {
        p.reason.detail += &format!(
            "; promotion cut from {} by {less}: the room cut demotions would have made",
            p.promote
        );
        p.promote = p.promote - less;
    }
    by - less
}

/// What a pass did for one VM.
#[derive(Debug, PartialEq)]
pub struct Outcome {
    /// The VM.
    pub vm: String,
    /// The decision, when its pages could be read and were placed (none at a first
    /// scan).
    pub placement: Option<Placement>,
    /// What came of it.
    pub done: Done,
    /// How the VM's cold age changed after its moves, and why (`tiering::age`).
    pub age: Option<Reason>,
    /// Its cold age after the pass (that of its next pass), when the pass scanned it and,
    /// moving pages, moved them.
    pub cold_age: Option<Age>,
}

/// A VM's cold age: its memory in use is demoted only once untouched for as long.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Age {
    /// The age (s).
    pub age_s: f64,
    /// Whether it adapts to the VM's promotions (`[tiering] adaptive_age`), else fixed.
    pub adaptive: bool,
}

impl std::fmt::Display for Age {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let how = if self.adaptive { "adaptive" } else { "fixed" };
        write!(f, "cold age {} s, {how}", self.age_s)
    }
}

/// Where a VM's memory is, after a pass's moves.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Resident {
    /// On the fast node.
    pub fast: Bytes,
    /// On the slow node.
    pub slow: Bytes,
}

/// What came of a VM's placement.
#[derive(Debug, PartialEq)]
pub enum Done {
    /// The first scan: it only marks pages, nothing moves, and the VM has no part in
    /// the division of the fast tier (nothing is known of its heat yet).
    First(Resident),
    /// A dry run: nothing moved.
    DryRun(Resident),
    /// Carried out: bytes moved down and up, pages the kernel did not move.
    Moved {
        /// Memory moved to the slow node.
        demoted: Bytes,
        /// Memory moved to the fast node.
        promoted: Bytes,
        /// Pages not moved.
        failed: u64,
        /// Where its memory is now.
        resident: Resident,
    },
    /// Its pages could not be read or moved.
    Failed(String),
}

impl Done {
    /// Where the VM's memory is, when its pages could be read.
    pub fn resident(&self) -> Option<Resident> {
        match self {
            Done::First(r) | Done::DryRun(r) | Done::Moved { resident: r, .. } => Some(*r),
            Done::Failed(_) => None,
        }
    }
}

/// How an outcome is logged and counted.
#[derive(Debug, PartialEq)]
pub struct Logged<'a> {
    /// The event's kind: `action`, `action_failed` or `place_failed`.
    pub kind: &'static str,
    /// The action's result (`memtide_actions_total{kind="place"}`): `ok`, `partly`,
    /// `error`, `dry_run`.
    pub result: &'static str,
    /// The placement's rule, when there was one.
    pub rule: Option<&'a str>,
    /// The event's text.
    pub message: String,
}

impl Outcome {
    /// How it is logged and counted; `None` when nothing moved (or would). Moves say the
    /// VM's cold age after them.
    pub fn event(&self) -> Option<Logged<'_>> {
        let p = self.placement.as_ref();
        let rule = p.map(|p| p.reason.rule.as_ref());
        let age = self.cold_age.map_or(String::new(), |a| format!("; {a}"));
        let budget = |p: &Placement| format!("fast budget {} ({}){age}", p.fast_budget, p.reason);
        let (kind, result, message) = match (&self.done, p) {
            (Done::First(_), _) => return None,
            (Done::DryRun(_), Some(p)) if p.demote.0 == 0 && p.promote.0 == 0 => return None,
            (Done::DryRun(_), Some(p)) => (
                "action",
                "dry_run",
                format!(
                    "would place: demote {}, promote {}, {} (dry run)",
                    p.demote,
                    p.promote,
                    budget(p)
                ),
            ),
            (
                Done::Moved {
                    demoted,
                    promoted,
                    failed,
                    ..
                },
                Some(p),
            ) => {
                if demoted.0 == 0 && promoted.0 == 0 && *failed == 0 {
                    return None;
                }
                let what = format!(
                    "place: demoted {demoted}, promoted {promoted}, {}",
                    budget(p)
                );
                match failed {
                    0 => ("action", "ok", what),
                    n => (
                        "action",
                        "partly",
                        format!("{what}; {n} pages the kernel did not move"),
                    ),
                }
            }
            (Done::Failed(why), Some(p)) => (
                "action_failed",
                "error",
                format!(
                    "place: demote {}, promote {} failed: {why}",
                    p.demote, p.promote
                ),
            ),
            (Done::Failed(why), None) => ("place_failed", "error", format!("not placed: {why}")),
            (_, None) => unreachable!("a placement is decided before anything moves"),
        };
        Some(Logged {
            kind,
            result,
            rule,
            message,
        })
    }
}

/// A VM's cold age as the state file keeps it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KeptAge {
    /// The age, in seconds.
    pub age_s: f64,
    /// The configured size of the VM it was learnt for, while that is not yet checked
    /// against the VM (an age restored, before the VM's first scan).
    pub unchecked_size: Option<Bytes>,
    /// For a VM configured by `pid`, which is in no decision, the process it was learnt
    /// for: its pid and start time.
    pub process: Option<(i32, u64)>,
}

impl KeptAge {
    /// The age, for a VM of `configured` size: none where it was learnt at another.
    pub fn for_size(&self, configured: Bytes) -> Option<f64> {
        self.unchecked_size
            .is_none_or(|size| size == configured)
            .then_some(self.age_s)
    }
}

/// What a cold age restored was learnt for: it is resumed only for the same.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LearntFor {
    /// A connected VM of this configured size.
    Size(Bytes),
    /// A VM configured by `pid`: this process, by its pid and start time, as placement
    /// tells the process first seen at the pid from another given it later.
    Process(i32, u64),
}

/// The placed VMs' trackers, and the settings.
pub struct TierPlacer {
    nodes: Nodes,
    config: TierConfig,
    ages: AgeConfig,
    reserve: Bytes,
    interval: Duration,
    proc: PathBuf,
    sys: PathBuf,
    placers: HashMap<String, Placer>,
    /// Each placed VM's cold age, by name, and when it was last among the VMs to place:
    /// kept whatever becomes of its tracker (a failed scan or move, its process restarted,
    /// a pass that panicked) and while the VM is away for less than the longest age (its
    /// QEMU restarting or its connector reconnecting takes it out of the targets for a
    /// tick or more), so that a transient failure does not undo what it learnt.
    learnt: HashMap<String, (ColdAge, Duration)>,
    /// What each age a daemon before this one learnt ([`TierPlacer::resume`]) was learnt
    /// for, until the VM's first scan: the age is its own only at that size, or for that
    /// process.
    resumed: HashMap<String, LearntFor>,
    /// Each `pid` VM's process as first seen: its pid and start time, kept when its
    /// tracker is dropped. Another process at that pid is refused; the state file keeps
    /// the VM's cold age with it.
    fixed: HashMap<String, (i32, u64)>,
    /// VMs left out of the passes for now that keep their trackers ([`TierPlacer::hold`]).
    held: HashSet<String>,
}

impl TierPlacer {
    /// The VMs the next passes leave out but do not forget (being saved).
    pub fn hold(&mut self, vms: HashSet<String>) {
        self.held = vms;
    }

    /// A placer between `nodes` with `config`'s settings (procfs at `proc`, sysfs at
    /// `sys`).
    pub fn new(nodes: Nodes, config: &TieringConfig, proc: PathBuf, sys: PathBuf) -> Self {
        TierPlacer {
            nodes,
            config: TierConfig {
                margin: config.margin_pct / 100.0,
                rate_mib_s: config.rate_mib_s,
            },
            ages: config.ages(),
            reserve: Bytes::from_mib(config.reserve_mib),
            interval: Duration::from_secs_f64(config.interval_s),
            proc,
            sys,
            placers: HashMap::new(),
            held: HashSet::new(),
            learnt: HashMap::new(),
            resumed: HashMap::new(),
            fixed: HashMap::new(),
        }
    }

    /// Take up the cold ages a daemon before this one learnt (the state file), each with
    /// what it was learnt for: a VM's is its age from its first scan if the VM is that
    /// size then (a `pid` VM: that process), and is forgotten as any other once the VM is
    /// away for longer than the longest age (counted from the start).
    pub fn resume(&mut self, ages: BTreeMap<String, (LearntFor, ColdAge)>) {
        for (vm, (learnt_for, age)) in ages {
            self.resumed.insert(vm.clone(), learnt_for);
            self.learnt.insert(vm, (age, Duration::ZERO));
        }
    }

    /// Each VM's cold age, by name, when it adapts: what the state file keeps.
    pub fn ages(&self) -> BTreeMap<String, KeptAge> {
        if !self.ages.adaptive {
            return BTreeMap::new();
        }
        self.learnt
            .iter()
            .map(|(vm, (age, _))| {
                let resumed = self.resumed.get(vm).copied();
                let kept = KeptAge {
                    age_s: age.age_s(),
                    unchecked_size: match resumed {
                        Some(LearntFor::Size(size)) => Some(size),
                        _ => None,
                    },
                    process: match resumed {
                        Some(LearntFor::Process(pid, started)) => Some((pid, started)),
                        _ => self.fixed.get(vm).copied(),
                    },
                };
                (vm.clone(), kept)
            })
            .collect()
    }

    /// Drop every tracker (the processes first seen and the cold ages are kept): the next
    /// pass over a VM is a first scan.
    pub fn drop_trackers(&mut self) {
        self.placers.clear();
    }

    /// At `at`, forget the trackers of the VMs not among `targets`, and the cold ages of
    /// those away for longer than the longest age.
    pub fn forget_gone(&mut self, targets: &[Target], at: Duration) {
        let held = &self.held;
        let listed = |vm: &String| held.contains(vm) || targets.iter().any(|t| &t.vm == vm);
        self.placers.retain(|vm, _| listed(vm));
        let away = Duration::try_from_secs_f64(self.ages.horizon_s()).unwrap_or(Duration::MAX);
        self.learnt.retain(|vm, (_, seen)| {
            if listed(vm) {
                *seen = at;
            }
            at.saturating_sub(*seen) <= away
        });
        let learnt = &self.learnt;
        self.resumed.retain(|vm, _| learnt.contains_key(vm));
    }

    /// VM `vm`'s cold age, once it has been scanned.
    pub fn cold_age(&self, vm: &str) -> Option<Age> {
        self.learnt.get(vm).map(|(age, _)| Age {
            age_s: age.age_s(),
            adaptive: self.ages.adaptive,
        })
    }

    /// Which of `targets` may be placed this pass, in order: a VM named as one before it
    /// is not (two processes for one name), nor is a process placed as a VM before it,
    /// nor a `pid` VM whose pid now belongs to another process than the one first seen
    /// there.
    fn admit(&mut self, targets: &[Target]) -> Vec<Result<(), String>> {
        let mut names: HashMap<&str, i32> = HashMap::new();
        let mut pids: HashMap<i32, &str> = HashMap::new();
        let mut admitted = Vec::with_capacity(targets.len());
        for t in targets {
            let verdict = if let Some(pid) = names.get(t.vm.as_str()) {
                Err(format!(
                    "the name {:?} is given to process {pid} and process {}: only process \
                     {pid} is placed under it",
                    t.vm, t.pid
                ))
            } else if let Some(other) = pids.get(&t.pid) {
                Err(format!("pid {} is already placed as VM {other}", t.pid))
            } else if t.fixed {
                self.same_fixed(t)
            } else {
                Ok(())
            };
            if verdict.is_ok() {
                names.insert(&t.vm, t.pid);
                pids.insert(t.pid, &t.vm);
            }
            admitted.push(verdict);
        }
        admitted
    }

    /// Whether `pid` VM `t`'s process is the one first seen at its pid (the first one
    /// seen is recorded; a process gone is left for the tracker to report).
    fn same_fixed(&mut self, t: &Target) -> Result<(), String> {
        let Some(started) = procfs::start_time(&self.proc, t.pid) else {
            return Ok(());
        };
        match self.fixed.get(&t.vm) {
            Some(&(pid, first)) if pid == t.pid && first != started => Err(format!(
                "pid {} now belongs to another process (comm {}): update the config",
                t.pid,
                placement::comm(&self.proc, t.pid)
            )),
            Some(&(pid, _)) if pid == t.pid => Ok(()),
            _ => {
                self.fixed.insert(t.vm.clone(), (t.pid, started));
                Ok(())
            }
        }
    }

    /// How the fast tier, `free` of it on its node, is divided among the VMs `measured`
    /// (in `targets`' order): a placement for each one measured, but for those on their
    /// first scan, which have no part in the division (every page of theirs looks hot).
    fn divide(
        &self,
        targets: &[Target],
        measured: &[Result<Measured, String>],
        free: Bytes,
    ) -> Vec<Option<Placement>> {
        let placed = |m: &Result<Measured, String>| m.as_ref().is_ok_and(|m| !m.first);
        let vms: Vec<_> = targets
            .iter()
            .zip(measured)
            .filter(|(_, m)| placed(m))
            .filter_map(|(t, m)| Some(m.as_ref().ok()?.vm(&t.vm, t.shares, t.budget)))
            .collect();
        let tier = FastTier {
            free,
            reserve: self.reserve,
        };
        let dt = self.interval.as_secs_f64();
        let mut placements = tiering::place(&vms, tier, self.config, dt).into_iter();
        measured
            .iter()
            .map(|m| match placed(m) {
                true => placements.next(),
                false => None,
            })
            .collect()
    }

    /// One pass at `at` over `targets` (blocking: scans and moves). A VM not among them,
    /// not admitted, or whose process changed or failed, loses its tracker (its next pass
    /// is a first scan again); only one away for longer than the longest age loses its
    /// cold age. In a dry run nothing moves.
    pub fn pass(&mut self, targets: &[Target], at: Duration, dry_run: bool) -> Vec<Outcome> {
        self.forget_gone(targets, at);
        let admitted = self.admit(targets);
        let proc = self.proc.clone();
        // A connected VM's new process (another pid, or the same pid restarted) is a new
        // tracker.
        let held = &self.held;
        self.placers.retain(|vm, p| {
            held.contains(vm)
                || targets.iter().zip(&admitted).any(|(t, a)| {
                    a.is_ok()
                        && &t.vm == vm
                        && t.pid == p.pid()
                        && t.started.is_none_or(|s| s == p.started())
                        && procfs::start_time(&proc, t.pid).is_none_or(|s| s == p.started())
                })
        });
        let mut measured: Vec<Result<Measured, String>> = targets
            .iter()
            .zip(admitted)
            .map(|(t, a)| a.and_then(|()| self.measure(t, at)))
            .collect();
        let free = placement::free_on(&self.proc, &self.sys, self.nodes.fast);
        let mut placements = match &free {
            Ok(free) => self.divide(targets, &measured, *free),
            Err(_) => vec![None; targets.len()],
        };
        // Unreadable, the slow node's room is not known: the moves say what fits.
        if let Ok(room) = placement::free_on(&self.proc, &self.sys, self.nodes.slow) {
            fit_demotions(&mut placements, room, self.nodes.slow);
        }
        let mut outcomes = Vec::with_capacity(targets.len());
        for ((t, m), placement) in targets.iter().zip(&mut measured).zip(placements) {
            let failed = |placement, why: String| Outcome {
                vm: t.vm.clone(),
                placement,
                done: Done::Failed(why),
                age: None,
                cold_age: None,
            };
            let m = match (m, &free) {
                (Err(why), _) => {
                    outcomes.push(failed(None, why.clone()));
                    continue;
                }
                (Ok(_), Err(e)) => {
                    outcomes.push(failed(None, format!("{e:#}")));
                    continue;
                }
                (Ok(m), Ok(_)) => m,
            };
            let resident = |m: &Measured| Resident {
                fast: m.on(self.nodes.fast),
                slow: m.on(self.nodes.slow),
            };
            let placement = match placement {
                Some(p) => p,
                None if m.first => {
                    outcomes.push(Outcome {
                        vm: t.vm.clone(),
                        placement: None,
                        done: Done::First(resident(m)),
                        age: None,
                        cold_age: self.cold_age(&t.vm),
                    });
                    continue;
                }
                None => {
                    outcomes.push(failed(None, "no placement was decided".into()));
                    continue;
                }
            };
            let mut age = None;
            let done = if dry_run {
                Done::DryRun(resident(m))
            } else {
                let carried = match (self.placers.get_mut(&t.vm), self.learnt.get_mut(&t.vm)) {
                    (Some(placer), Some((age, _))) => placer
                        .carry_out(m, &placement)
                        .map(|moved| (moved, placer.adapt_age(age, m, &moved))),
                    _ => Err(anyhow::anyhow!("its tracker is gone")),
                };
                match carried {
                    Ok((
                        Moved {
                            demoted,
                            promoted,
                            failed,
                            ..
                        },
                        changed,
                    )) => {
                        age = changed;
                        Done::Moved {
                            demoted: Bytes(demoted * m.page_size()),
                            promoted: Bytes(promoted * m.page_size()),
                            failed,
                            resident: resident(m),
                        }
                    }
                    Err(e) => {
                        self.placers.remove(&t.vm);
                        Done::Failed(format!("{e:#}"))
                    }
                }
            };
            let cold_age = done.resident().and_then(|_| self.cold_age(&t.vm));
            outcomes.push(Outcome {
                vm: t.vm.clone(),
                placement: Some(placement),
                done,
                age,
                cold_age,
            });
        }
        outcomes
    }

    /// Scan `t`'s pages, opening its tracker at its first pass (its cold age, if new or
    /// resumed for another size or process, at the least); a failure drops the tracker,
    /// not the age.
    fn measure(&mut self, t: &Target, at: Duration) -> Result<Measured, String> {
        let same = match self.resumed.remove(&t.vm) {
            None => true,
            Some(LearntFor::Size(size)) => t.mappings.guest_ram() == Some(size),
            // Admitted, a `pid` VM's process is the one recorded, if it could be read.
            Some(LearntFor::Process(pid, started)) => {
                self.fixed.get(&t.vm) == Some(&(pid, started))
            }
        };
        if !same {
            self.learnt.remove(&t.vm);
        }
        let placer = match self.placers.entry(t.vm.clone()) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let opened = Placer::open(
                    &self.proc,
                    &self.sys,
                    t.pid,
                    t.mappings.clone(),
                    self.ages,
                    self.nodes,
                    Method::Auto,
                );
                let opened = opened.map_err(|e| format!("{e:#}"))?;
                if t.started.is_some_and(|s| s != opened.started()) {
                    return Err(format!(
                        "process {} is not the hypervisor its VM is known by (it started at \
                         another time: its pid was taken since)",
                        t.pid
                    ));
                }
                e.insert(opened)
            }
        };
        let ages = &self.ages;
        let (age, _) = self
            .learnt
            .entry(t.vm.clone())
            .or_insert_with(|| (ColdAge::new(ages), at));
        placer.measure(at, age).map_err(|e| {
            self.placers.remove(&t.vm);
            format!("{e:#}")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: u32, cpus: bool, tier: Option<u32>) -> Node {
        Node {
            id,
            cpus,
            total: Bytes::from_gib(1),
            free: Bytes::from_gib(1),
            tier,
            read_latency_ns: None,
            read_bandwidth_mbps: None,
        }
    }

    #[test]
    fn the_fast_node_has_cpus_and_the_slow_one_is_memory_only_and_one_node_is_refused() {
        let nodes = |fast, slow| Nodes { fast, slow };
        let dram_cxl = [node(0, true, Some(4)), node(1, false, Some(22))];
        assert_eq!(choose_nodes(&dram_cxl, None, None), Ok(nodes(0, 1)));
        // Two sockets and a CXL expander in a slower tier, listed first.
        let host = [
            node(2, false, Some(22)),
            node(0, true, Some(4)),
            node(1, true, Some(4)),
            node(3, false, Some(4)),
        ];
        assert_eq!(choose_nodes(&host, None, None), Ok(nodes(0, 2)));
        assert_eq!(choose_nodes(&host, Some(1), Some(3)), Ok(nodes(1, 3)));
        // Linux 6.1 (every node in tier 4) and a kernel without tiers alike.
        let flat = [node(0, true, None), node(1, false, None)];
        assert_eq!(choose_nodes(&flat, None, None), Ok(nodes(0, 1)));
        let one = choose_nodes(&[node(0, true, Some(4))], None, None).unwrap_err();
        assert_eq!(
            one,
            "the host has 1 NUMA node(s) with memory ([0]): placement needs a fast and a slow one"
        );
        let sockets = [node(0, true, Some(4)), node(1, true, Some(4))];
        let e = choose_nodes(&sockets, None, None).unwrap_err();
        assert!(
            e.starts_with("no memory-only node to be the slow tier"),
            "{e}"
        );
        assert_eq!(choose_nodes(&sockets, None, Some(1)), Ok(nodes(0, 1)));
        let e = choose_nodes(&dram_cxl, Some(5), None).unwrap_err();
        assert_eq!(
            e,
            "[tiering] fast_node 5 is not a node with memory ([0, 1])"
        );
        let e = choose_nodes(&dram_cxl, Some(1), Some(1)).unwrap_err();
        assert!(e.starts_with("node 1 cannot be both"), "{e}");
    }

    fn placement(demote: u64, promote: u64) -> Placement {
        Placement {
            vm: "a".into(),
            fast_budget: Bytes::from_mib(42),
            demote: Bytes::from_mib(demote),
            demote_free: Bytes::ZERO,
            promote: Bytes::from_mib(promote),
            reason: Reason::new("tier.configured", "operator budget 42 MiB fits"),
        }
    }

    fn outcome(placement: Option<Placement>, done: Done) -> Outcome {
        Outcome {
            vm: "a".into(),
            placement,
            done,
            age: None,
            cold_age: Some(Age {
                age_s: 120.0,
                adaptive: true,
            }),
        }
    }

    #[test]
    fn moves_and_failures_are_logged_with_their_rule_and_a_pass_without_moves_is_not() {
        let resident = Resident {
            fast: Bytes::from_mib(42),
            slow: Bytes::from_mib(86),
        };
        let moved = |demoted: u64, promoted: u64, failed| Done::Moved {
            demoted: Bytes::from_mib(demoted),
            promoted: Bytes::from_mib(promoted),
            failed,
            resident,
        };
        assert_eq!(
            outcome(Some(placement(32, 0)), Done::First(resident)).event(),
            None
        );
        assert_eq!(outcome(Some(placement(0, 0)), moved(0, 0, 0)).event(), None);
        assert_eq!(
            outcome(Some(placement(0, 0)), Done::DryRun(resident)).event(),
            None
        );
        let done = outcome(Some(placement(16, 16)), moved(16, 16, 0));
        let e = done.event().unwrap();
        assert_eq!(
            (e.kind, e.result, e.rule),
            ("action", "ok", Some("tier.configured"))
        );
        assert_eq!(
            e.message,
            "place: demoted 16 MiB, promoted 16 MiB, fast budget 42 MiB (tier.configured: \
             operator budget 42 MiB fits); cold age 120 s, adaptive"
        );
        let partly = outcome(Some(placement(16, 0)), moved(15, 0, 256));
        let e = partly.event().unwrap();
        assert_eq!((e.kind, e.result), ("action", "partly"));
        assert!(
            e.message.ends_with("; 256 pages the kernel did not move"),
            "{}",
            e.message
        );
        let mut dry = outcome(Some(placement(8, 0)), Done::DryRun(resident));
        dry.cold_age = Some(Age {
            age_s: 30.0,
            adaptive: false,
        });
        let e = dry.event().unwrap();
        assert_eq!((e.kind, e.result), ("action", "dry_run"));
        assert_eq!(
            e.message,
            "would place: demote 8 MiB, promote 0 B, fast budget 42 MiB (tier.configured: \
             operator budget 42 MiB fits); cold age 30 s, fixed (dry run)"
        );
        let gone = outcome(None, Done::Failed("process 7 is gone".into()));
        let e = gone.event().unwrap();
        assert_eq!(
            (e.kind, e.result, e.rule, e.message.as_str()),
            (
                "place_failed",
                "error",
                None,
                "not placed: process 7 is gone"
            )
        );
        let refused = outcome(
            Some(placement(8, 0)),
            Done::Failed("move_pages: node 1 has no memory (ENODEV)".into()),
        );
        let e = refused.event().unwrap();
        assert_eq!((e.kind, e.result), ("action_failed", "error"));
        assert_eq!(
            e.message,
            "place: demote 8 MiB, promote 0 B failed: move_pages: node 1 has no memory (ENODEV)"
        );
    }

    #[test]
    fn a_pass_names_what_it_cannot_place_and_keeps_no_tracker_for_it() {
        let sys = tempfile::tempdir().unwrap();
        let config = TieringConfig::default();
        let nodes = Nodes { fast: 0, slow: 1 };
        let mut p = TierPlacer::new(nodes, &config, "/proc".into(), sys.path().into());
        let target = |vm: &str, pid| Target {
            vm: vm.into(),
            pid,
            mappings: Mappings::Private,
            shares: 1000,
            budget: None,
            fixed: false,
            started: None,
        };
        // A process that does not exist (pids stay below 2^22), and this one on a sysfs
        // without idle page tracking.
        let targets = [
            target("gone", 1 << 23),
            target("me", std::process::id() as i32),
        ];
        let outcomes = p.pass(&targets, Duration::from_secs(10), false);
        assert_eq!(outcomes.len(), 2);
        assert_eq!(
            outcomes[0].done,
            Done::Failed(format!("process {} is gone", 1 << 23))
        );
        assert!(
            matches!(&outcomes[1].done, Done::Failed(w) if w.contains("CONFIG_IDLE_PAGE_TRACKING")),
            "{:?}",
            outcomes[1].done
        );
        assert!(outcomes.iter().all(|o| o.placement.is_none()));
        assert!(p.placers.is_empty());
    }

    fn target(vm: &str, pid: i32, fixed: bool) -> Target {
        Target {
            vm: vm.into(),
            pid,
            mappings: Mappings::Private,
            shares: 1000,
            budget: None,
            fixed,
            started: None,
        }
    }

    /// A procfs with process `pid` of command `comm`, started at `started`.
    fn process(proc: &std::path::Path, pid: i32, comm: &str, started: u64) {
        let dir = proc.join(pid.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        let stat = format!(
            "{pid} ({comm}) S 1 {pid} {pid} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {started} 0 0\n"
        );
        std::fs::write(dir.join("stat"), stat).unwrap();
        std::fs::write(dir.join("comm"), format!("{comm}\n")).unwrap();
    }

    #[test]
    fn a_name_or_a_process_placed_twice_and_a_reused_pid_are_refused() {
        let proc = tempfile::tempdir().unwrap();
        let sys = tempfile::tempdir().unwrap();
        let nodes = Nodes { fast: 0, slow: 1 };
        let config = TieringConfig::default();
        let mut p = TierPlacer::new(nodes, &config, proc.path().into(), sys.path().into());
        process(proc.path(), 7, "qemu-kvm", 100);
        process(proc.path(), 8, "qemu-kvm", 100);
        let targets = [
            target("web", 8, false),
            target("x", 7, true),
            target("x", 8, false),
            target("db", 8, true),
        ];
        let admitted = p.admit(&targets);
        assert_eq!(admitted[..2], [Ok(()), Ok(())]);
        assert_eq!(
            admitted[2],
            Err(
                "the name \"x\" is given to process 7 and process 8: only process 7 is \
                 placed under it"
                    .into()
            )
        );
        assert_eq!(admitted[3], Err("pid 8 is already placed as VM web".into()));
        // The process configured by `pid` ends and another takes its pid: refused, and
        // still refused later. A connected VM's new process is only a new tracker.
        process(proc.path(), 7, "bash", 900);
        process(proc.path(), 8, "qemu-kvm", 901);
        let targets = [target("x", 7, true), target("web", 8, false)];
        let refused = "pid 7 now belongs to another process (comm bash): update the config";
        assert_eq!(p.admit(&targets), [Err(refused.into()), Ok(())]);
        std::fs::remove_dir_all(proc.path().join("7")).unwrap();
        assert_eq!(
            p.admit(&targets),
            [Ok(()), Ok(())],
            "gone: left to the tracker"
        );
        process(proc.path(), 7, "sshd", 950);
        let refused = "pid 7 now belongs to another process (comm sshd): update the config";
        assert_eq!(p.admit(&targets), [Err(refused.into()), Ok(())]);
        // A whole pass: the refusals are outcomes, nothing panics, no tracker is kept.
        let twice = [
            target("x", 1 << 23, false),
            target("x", (1 << 23) + 1, false),
        ];
        let outcomes = p.pass(&twice, Duration::from_secs(1), false);
        assert_eq!(outcomes.len(), 2);
        assert!(
            matches!(&outcomes[1].done, Done::Failed(w) if w.starts_with("the name \"x\"")),
            "{:?}",
            outcomes[1].done
        );
        let e = outcomes[1].event().unwrap();
        assert_eq!((e.kind, e.result), ("place_failed", "error"));
        assert!(p.placers.is_empty());
    }

    #[test]
    fn a_vm_whose_sample_failed_stays_a_target_with_its_last_mappings() {
        use memtide_core::testkit::vm;
        let config = crate::config::Config::parse(
            "[tiering]\nplace = true\n[[vm]]\nname = \"batch\"\npid = 7\nshares = 300\n\
             fast_budget_mib = 42\n",
            "x",
        )
        .unwrap();
        let mut late = vm("late", 512, 512, 100);
        late.sample = Err(memtide_core::BackendError::Timeout(500));
        let mut never = vm("never", 512, 512, 100);
        never.sample = Err(memtide_core::BackendError::Timeout(500));
        let vms = [
            vm("web", 1024, 1024, 100),
            late,
            never,
            vm("nopid", 256, 256, 1),
        ];
        let ram = |sizes: &[u64]| {
            Mappings::GuestRam(sizes.iter().map(|&mib| Bytes::from_mib(mib)).collect())
        };
        let known = |name: &str| {
            let (pid, mappings) = match name {
                "web" => (Some(100), Some(ram(&[1024]))),
                // Last sampled with a memory device (a DIMM, virtio-mem) beside its base.
                "late" => (Some(101), Some(ram(&[256, 128]))),
                "never" => (Some(102), None),
                "nopid" => (None, Some(ram(&[256]))),
                _ => return None,
            };
            Some(Known {
                process: pid.map(|pid| (pid, 7)),
                config: None,
                ram: mappings,
            })
        };
        let got = targets(&vms, known, &config);
        for t in &got {
            assert_eq!(t.started, (!t.fixed).then_some(7), "{}", t.vm);
        }
        let summary: Vec<_> = got
            .iter()
            .map(|t| {
                (
                    t.vm.as_str(),
                    t.pid,
                    t.mappings.clone(),
                    t.fixed,
                    t.shares,
                    t.budget,
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("web", 100, ram(&[1024]), false, 1000, None),
                ("late", 101, ram(&[256, 128]), false, 1000, None),
                (
                    "batch",
                    7,
                    Mappings::Private,
                    true,
                    300,
                    Some(Bytes::from_mib(42))
                ),
            ]
        );
    }

    #[test]
    fn demotions_together_fit_in_what_the_slow_node_has_free() {
        let placement = |vm: &str, demote: u64, free: u64, promote: u64| {
            Some(Placement {
                vm: vm.into(),
                fast_budget: Bytes::from_mib(100),
                demote: Bytes::from_mib(demote),
                demote_free: Bytes::from_mib(free),
                promote: Bytes::from_mib(promote),
                reason: Reason::new("tier.hot", "hot 100 MiB"),
            })
        };
        let mut placements = [
            placement("a", 6, 2, 7),
            None,
            placement("b", 8, 8, 1),
            placement("c", 5, 0, 2),
        ];
        fit_demotions(&mut placements, Bytes::from_mib(10), 1);
        let cut: Vec<(u64, u64, u64)> = placements
            .iter()
            .flatten()
            .map(|p| (p.demote.mib(), p.demote_free.mib(), p.promote.mib()))
            .collect();
        // 9 MiB of demotions cut: b's and c's own promotions first, then a's by the rest.
        assert_eq!(cut, [(6, 2, 1), (4, 4, 0), (0, 0, 0)]);
        let [Some(a), _, Some(b), Some(c)] = &placements else {
            panic!("{placements:?}")
        };
        assert_eq!(
            a.reason.detail,
            "hot 100 MiB; promotion cut from 7 MiB by 6 MiB: the room cut demotions would \
             have made"
        );
        assert_eq!(
            b.reason.detail,
            "hot 100 MiB; demotion cut from 8 MiB to 4 MiB: what slow node 1 has free; \
             promotion cut from 1 MiB by 1 MiB: the room cut demotions would have made"
        );
        assert!(
            c.reason
                .detail
                .contains("demotion cut from 5 MiB to 0 B: what slow node 1 has free"),
            "{}",
            c.reason
        );
    }

    #[test]
    fn a_vm_configured_out_is_not_placed() {
        use memtide_core::testkit::vm;
        let config = crate::config::Config::parse(
            "[tiering]\nplace = true\n[[vm]]\nname = \"kept\"\nqmp = \"/run/kept.sock\"\n\
             place = false\n[[vm]]\nname = \"batch\"\npid = 7\n",
            "x",
        )
        .unwrap();
        let vms = [vm("web", 1024, 1024, 100), vm("kept", 1024, 1024, 100)];
        let known = |name: &str| {
            Some(Known {
                process: Some((100, 7)),
                config: config.vms.iter().find(|c| c.name == name),
                ram: None,
            })
        };
        let placed: Vec<String> = targets(&vms, known, &config)
            .into_iter()
            .map(|t| t.vm)
            .collect();
        assert_eq!(placed, ["web", "batch"]);
        // A process given by pid alone has nothing else to do.
        let e = crate::config::Config::parse(
            "[tiering]\nplace = true\n[[vm]]\nname = \"batch\"\npid = 7\nplace = false\n",
            "x",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("vm[0].place") && e.contains("leaves it nothing"),
            "{e}"
        );
    }

    #[test]
    fn a_panic_in_a_pass_is_told_not_spread() {
        assert_eq!(caught(|| 7), Ok(7));
        assert_eq!(caught(|| -> u8 { panic!("at {}", 3) }), Err("at 3".into()));
        assert_eq!(caught(|| -> u8 { panic!("static") }), Err("static".into()));
        let odd = caught(|| -> u8 { std::panic::panic_any(5u8) });
        assert_eq!(odd, Err("a panic without a message".into()));
    }

    #[test]
    fn the_daemon_is_not_placed_as_a_vm() {
        let config = crate::config::Config::parse(
            "[tiering]\nplace = true\n[[vm]]\nname = \"a\"\npid = 7\n\
             [[vm]]\nname = \"me\"\npid = 42\n",
            "x",
        )
        .unwrap();
        assert_eq!(check_not_own(&config.vms, 9), Ok(()));
        assert_eq!(
            check_not_own(&config.vms, 42),
            Err("VM \"me\"'s pid 42 is memtide's own process, not a VM's".into())
        );
    }

    /// A VM whose scan fails loses its tracker, not its cold age: only a VM away for longer
    /// than the longest age loses that (the age lived in the tracker, and one failed scan
    /// sent the VM back to the least). This process is the VM, on a procfs that links to
    /// the real one.
    /// A placer over this process, on a procfs linking to the real one (the process and
    /// kpageflags: root reads page frame numbers) and a sysfs with an idle bitmap and node
    /// 0: the placer, the procfs and sysfs, and the process's link.
    fn placer_over_this_process() -> (TierPlacer, [tempfile::TempDir; 2], std::path::PathBuf) {
        let (proc, sys) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let me = std::process::id() as i32;
        let link = proc.path().join(me.to_string());
        std::os::unix::fs::symlink(format!("/proc/{me}"), &link).unwrap();
        std::os::unix::fs::symlink("/proc/kpageflags", proc.path().join("kpageflags")).unwrap();
        let idle = sys.path().join("kernel/mm/page_idle");
        std::fs::create_dir_all(&idle).unwrap();
        std::fs::write(idle.join("bitmap"), b"").unwrap();
        let node0 = sys.path().join("devices/system/node/node0");
        std::fs::create_dir_all(&node0).unwrap();
        std::fs::write(node0.join("meminfo"), "Node 0 MemFree: 1048576 kB\n").unwrap();
        let nodes = Nodes { fast: 0, slow: 1 };
        let config = TieringConfig::default();
        let p = TierPlacer::new(nodes, &config, proc.path().into(), sys.path().into());
        (p, [proc, sys], link)
    }

    /// A connected VM whose pid another process took since it connected is not placed:
    /// the process at the pid started at another time.
    #[test]
    #[ignore = "reads page frame numbers: needs root"]
    fn a_process_that_took_a_vms_pid_is_not_placed() {
        let (mut p, _dirs, _) = placer_over_this_process();
        let me = std::process::id() as i32;
        let started = procfs::start_time(std::path::Path::new("/proc"), me).unwrap();
        let vm = |started| Target {
            started: Some(started),
            ..target("vm", me, false)
        };
        let taken = p.pass(&[vm(started + 1)], Duration::from_secs(1), false);
        assert_eq!(
            taken[0].done,
            Done::Failed(format!(
                "process {me} is not the hypervisor its VM is known by (it started at \
                 another time: its pid was taken since)"
            ))
        );
        assert!(p.placers.is_empty());
        let own = p.pass(&[vm(started)], Duration::from_secs(2), false);
        assert!(matches!(own[0].done, Done::First(_)), "{:?}", own[0].done);
    }

    #[test]
    #[ignore = "reads page frame numbers: needs root"]
    fn a_failed_scan_keeps_the_vms_cold_age_until_the_vm_is_gone() {
        let (mut p, _dirs, link) = placer_over_this_process();
        let me = std::process::id() as i32;
        let vm = [target("vm", me, false)];
        let first = p.pass(&vm, Duration::from_secs(1), false);
        let least = Some(Age {
            age_s: 30.0,
            adaptive: true,
        });
        assert!(
            matches!(first[0].done, Done::First(_)),
            "{:?}",
            first[0].done
        );
        assert_eq!(first[0].cold_age, least);
        // The VM's promotions have raised its age.
        let (age, _) = p.learnt.get_mut("vm").unwrap();
        let (ws, dt) = (Bytes::from_mib(100), 60.0);
        assert!(age.observe(&p.ages, ws, ws, dt).is_some());
        let raised = Some(Age {
            age_s: 120.0,
            adaptive: true,
        });
        // A scan fails (the process looks gone for a pass): the tracker goes, the age stays.
        std::fs::remove_file(&link).unwrap();
        let failed = p.pass(&vm, Duration::from_secs(2), false);
        assert_eq!(
            failed[0].done,
            Done::Failed(format!("process {me} is gone"))
        );
        assert!(p.placers.is_empty());
        std::os::unix::fs::symlink(format!("/proc/{me}"), &link).unwrap();
        let again = p.pass(&vm, Duration::from_secs(3), false);
        assert!(matches!(again[0].done, Done::First(_)), "{:?}", again[0]);
        assert_eq!(again[0].cold_age, raised, "a new tracker, the age learnt");
        // A pass that panicked drops the trackers, not the ages.
        p.drop_trackers();
        assert_eq!(p.cold_age("vm"), raised);
        // A VM away for longer than the longest age is forgotten: it comes back at the
        // least.
        let longest = Duration::from_secs_f64(p.ages.max_s);
        p.pass(&[], Duration::from_secs(4 + 1) + longest, false);
        assert_eq!(p.cold_age("vm"), None);
        let back = p.pass(&vm, Duration::from_secs(6) + longest, false);
        assert_eq!(back[0].cold_age, least);
    }

    /// A VM out of the targets for a while (its QEMU restarting, its connector
    /// reconnecting) keeps its cold age for as long as the longest age (review: one tick
    /// away, the only VM placed, and it was back at the least); no kernel needed.
    #[test]
    fn a_vm_away_keeps_its_cold_age_for_the_longest_age() {
        let sys = tempfile::tempdir().unwrap();
        let nodes = Nodes { fast: 0, slow: 1 };
        let mut p = TierPlacer::new(
            nodes,
            &TieringConfig::default(),
            "/proc".into(),
            sys.path().into(),
        );
        let mut age = ColdAge::new(&p.ages);
        let ws = Bytes::from_mib(100);
        assert!(age.observe(&p.ages, ws, ws, 60.0).is_some());
        p.learnt.insert("vm".into(), (age, Duration::from_secs(10)));
        let raised = Some(Age {
            age_s: 120.0,
            adaptive: true,
        });
        let vm = [target("vm", 1, false)];
        // Away for the longest age: kept; seen again, its clock restarts.
        let longest = Duration::from_secs_f64(p.ages.max_s);
        let at = |s: u64| Duration::from_secs(s) + longest;
        p.forget_gone(&[], at(10));
        assert_eq!(p.cold_age("vm"), raised);
        p.forget_gone(&vm, at(100));
        p.forget_gone(&[], at(100) + longest);
        assert_eq!(p.cold_age("vm"), raised);
        // Held (being saved): left out of the passes, as if seen.
        p.hold(HashSet::from(["vm".to_string()]));
        p.forget_gone(&[], at(101) + longest);
        assert_eq!(p.cold_age("vm"), raised);
        p.hold(HashSet::new());
        // Away longer: forgotten.
        p.forget_gone(&[], at(102) + longest * 2);
        assert_eq!(p.cold_age("vm"), None);
    }

    /// A VM whose age a daemon before this one learnt starts from that age, not the
    /// least, if it is the same size at its first scan; else, or away for longer than
    /// the longest age, it starts at the least. No kernel needed: the scans fail.
    #[test]
    fn a_vm_takes_up_the_cold_age_learnt_before_a_restart() {
        let sys = tempfile::tempdir().unwrap();
        let nodes = Nodes { fast: 0, slow: 1 };
        let config = TieringConfig::default();
        let mut p = TierPlacer::new(nodes, &config, "/proc".into(), sys.path().into());
        let gib = Bytes::from_gib(1);
        let resumed = |age_s| (LearntFor::Size(gib), ColdAge::resume(&p.ages, age_s));
        let restored = BTreeMap::from([
            ("same".to_string(), resumed(480.0)),
            ("resized".to_string(), resumed(480.0)),
            ("away".to_string(), resumed(120.0)),
        ]);
        p.resume(restored);
        let adaptive = |age_s| {
            Some(Age {
                age_s,
                adaptive: true,
            })
        };
        assert_eq!(p.cold_age("same"), adaptive(480.0));
        let vm = |name: &str, pid, size| Target {
            mappings: Mappings::GuestRam(vec![size]),
            ..target(name, pid, false)
        };
        let gone = 1 << 23;
        let targets = [
            vm("same", gone, gib),
            vm("resized", gone + 1, Bytes::from_gib(2)),
        ];
        let outcomes = p.pass(&targets, Duration::from_secs(10), false);
        assert!(outcomes.iter().all(|o| matches!(o.done, Done::Failed(_))));
        assert_eq!(p.cold_age("same"), adaptive(480.0));
        assert_eq!(p.cold_age("resized"), None, "another size, another VM");
        let unchecked: Vec<_> = p.resumed.keys().collect();
        assert_eq!(unchecked, ["away"], "a size is checked once");
        // Until it is, the state file keeps an age only for a VM of the size it was for.
        let away = p.ages()["away"];
        assert_eq!(away.for_size(gib), Some(120.0));
        assert_eq!(away.for_size(Bytes::from_gib(2)), None);
        // The one never seen again is forgotten the longest age after the start.
        let longest = Duration::from_secs_f64(p.ages.max_s);
        p.forget_gone(&targets, longest);
        assert_eq!(p.cold_age("away"), adaptive(120.0));
        p.forget_gone(&targets, longest + Duration::from_secs(1));
        assert_eq!(p.cold_age("away"), None);
        assert!(p.resumed.is_empty());
        let ages: Vec<_> = p.ages().into_iter().collect();
        let same = KeptAge {
            age_s: 480.0,
            unchecked_size: None,
            process: None,
        };
        assert_eq!(ages, [("same".to_string(), same)]);
        // A fixed age is not kept.
        let fixed = TieringConfig {
            adaptive_age: false,
            ..TieringConfig::default()
        };
        let mut p = TierPlacer::new(nodes, &fixed, "/proc".into(), sys.path().into());
        let age = ColdAge::new(&p.ages);
        p.learnt.insert("same".into(), (age, Duration::ZERO));
        assert!(p.ages().is_empty());
    }

    /// A VM on its first scan — every page of it hot, nothing known yet — has no part in
    /// the division: the others are placed as if it were not there, and it gets nothing.
    #[test]
    fn a_vm_on_its_first_scan_has_no_part_in_the_division() {
        let sys = tempfile::tempdir().unwrap();
        let nodes = Nodes { fast: 0, slow: 1 };
        let config = TieringConfig::default();
        let p = TierPlacer::new(nodes, &config, "/proc".into(), sys.path().into());
        let mib = |n: u64| n * 256;
        let page = 4096;
        let counts = |fast, slow, hot, hot_on_slow| tiering::PageCounts {
            fast: mib(fast),
            slow: mib(slow),
            hot: mib(hot),
            hot_on_slow: mib(hot_on_slow),
            aged: mib(fast.saturating_sub(hot)),
        };
        let known = counts(600, 400, 300, 100);
        let measured = |first| {
            vec![
                Ok(Measured::found(first, counts(1000, 1000, 2000, 1000), page)),
                Ok(Measured::found(false, known, page)),
                Err("gone".to_string()),
            ]
        };
        let targets = [
            target("new", 7, false),
            target("old", 8, false),
            target("gone", 9, false),
        ];
        let free = Bytes::from_mib(200);
        let placements = p.divide(&targets, &measured(true), free);
        let old = Measured::found(false, known, page);
        let alone = tiering::place(
            &[old.vm("old", 1000, None)],
            FastTier {
                free,
                reserve: p.reserve,
            },
            p.config,
            p.interval.as_secs_f64(),
        );
        assert_eq!(placements.len(), 3);
        assert_eq!(placements[0], None, "no budget at a first scan");
        assert_eq!(placements[1].as_ref(), alone.first());
        assert_eq!(placements[2], None);
        // Had it taken part, the other's budget would have been another.
        let shared = p.divide(&targets, &measured(false), free);
        assert_ne!(shared[1], placements[1]);
    }
}
