//! The passes a tick starts off the runtime and does not wait for — proactive reclaim,
//! huge pages put back, tier placement — and their outcomes, logged and counted when a
//! pass has ended.

use super::{hugepages, place, reclaim, Daemon};
use crate::status::Placed;
use memtide_adapters::access::Mappings;
use memtide_core::need::{Need, NeedLevel};
use memtide_core::reclaim::Keep;
use memtide_core::{Bytes, Decision, Snapshot};
use std::collections::HashSet;
use std::time::Duration;
use tokio::time::Instant;

/// A reclaim pass running off the runtime: its pacers and what they did, when it ends.
pub(super) type ReclaimPass = tokio::task::JoinHandle<(reclaim::Reclaimer, Vec<reclaim::Outcome>)>;

/// How long a stopping daemon waits for a reclaim pass still running.
pub(super) const RECLAIM_WAIT_AT_STOP: Duration = Duration::from_secs(5);

/// A huge-page pass running off the runtime: what it did, when it ends.
pub(super) type CollapsePass = tokio::task::JoinHandle<Vec<hugepages::Outcome>>;
/// A placement pass running off the runtime: the trackers and what it did, when it ends
/// (or why it panicked).
pub(super) type PlacePass =
    tokio::task::JoinHandle<(place::TierPlacer, Result<Vec<place::Outcome>, String>)>;

impl Daemon {
    /// Proactive reclaim for the VMs it serves: one pass over their cgroups, run off the
    /// runtime and not waited for (a `memory.reclaim` write returns once the kernel has
    /// reclaimed, seconds for a large step): a pass still running from an earlier tick
    /// is let be, and none starts beside it; each reclaim and each failure is logged and
    /// counted when its pass has ended.
    pub(super) async fn reclaim(&mut self, snapshot: &Snapshot, decision: &Decision) {
        if self.reclaiming.as_ref().is_some_and(|p| !p.is_finished()) {
            return;
        }
        if let Some(pass) = self.reclaiming.take() {
            self.reclaimed(pass).await;
        }
        let config = &self.config.reclaim;
        let targets: Vec<reclaim::Target> = snapshot
            .vms
            .iter()
            .zip(&decision.vms)
            // Not while it is saved: its memory is being read whole (found by an audit); its
            // pacer is held for after.
            .filter(|(vm, _)| !self.saving.contains_key(&vm.name))
            .filter_map(|(vm, report)| {
                let (_, vm_config) = self.fleet.process(&vm.name)?;
                let process = self.fleet.hypervisor(&vm.name);
                reclaim::serves(config, vm_config, vm).then(|| reclaim::Target {
                    vm: vm.name.clone(),
                    place: match (vm_config.and_then(|c| c.reclaim_cgroup.clone()), process) {
                        (Some(dir), _) => reclaim::Place::Cgroup(dir),
                        (None, Some((pid, started))) => reclaim::Place::Process { pid, started },
                        (None, None) => reclaim::Place::Unknown,
                    },
                    keep: Keep {
                        working_set: report.estimate,
                        min: vm.limits.min,
                    },
                })
            })
            .collect();
        if targets.is_empty() {
            return;
        }
        let mut reclaimer = self.reclaimer.take().unwrap_or_else(|| {
            reclaim::Reclaimer::new(&self.config.reclaim, self.config.host.proc.clone())
        });
        reclaimer.hold(self.saving.keys().cloned().collect());
        let (at, dry_run) = (snapshot.at, self.options.dry_run);
        self.reclaiming = Some(tokio::task::spawn_blocking(move || {
            let outcomes = reclaimer.pass(&targets, at, dry_run);
            (reclaimer, outcomes)
        }));
    }

    /// A reclaim pass's outcomes logged and counted once it has ended, its pacers kept.
    pub(super) async fn reclaimed(&mut self, pass: ReclaimPass) {
        match pass.await {
            Ok((reclaimer, outcomes)) => {
                self.reclaimer = Some(reclaimer);
                for o in outcomes {
                    self.log_reclaim(o);
                }
            }
            // Its pacers are lost with it: the next pass starts afresh.
            Err(e) => tracing::error!("the reclaim pass ended abnormally: {e}"),
        }
    }

    /// Count and log one VM's reclaim (nothing when it held back).
    fn log_reclaim(&mut self, o: reclaim::Outcome) {
        let Some(e) = o.event() else {
            return;
        };
        if let Some(rule) = e.rule {
            self.counters.rule(rule);
        }
        self.counters.reclaim_asked_bytes += e.asked.0;
        self.counters.action("reclaim", e.result);
        self.events.log(e.kind, Some(&o.vm), e.rule, e.message);
    }

    /// Guest RAM back in huge pages (`[host] restore_huge_pages`) for the VMs whose
    /// balloon gave memory back lately: one pass over them off the runtime, not waited
    /// for, none beside one still running (in a dry run, counting what it would ask
    /// for); each is logged and counted when it has ended. None starts while the host is
    /// short (`need`): `MADV_COLLAPSE` finds each huge page by compaction and reclaim,
    /// whatever the THP settings. A kernel that refuses the advice (before 6.1, no
    /// CAP_SYS_NICE) turns it off.
    pub(super) async fn restore_huge_pages(&mut self, snapshot: &Snapshot, need: Option<Need>) {
        if self.collapsing.as_ref().is_some_and(|p| p.is_finished()) {
            if let Some(pass) = self.collapsing.take() {
                self.collapsed(pass).await;
            }
        }
        let Some((restore, sizes)) = &mut self.huge_pages else {
            return;
        };
        let sizes = *sizes;
        let actuals = snapshot.vms.iter().map(|vm| {
            let actual = vm.sample.as_ref().ok().and_then(|s| s.balloon);
            (vm.name.as_str(), actual)
        });
        let due = restore.due(snapshot.at, actuals);
        let short = need.is_some_and(|n| n.level == NeedLevel::Short);
        if self.collapsing.is_some() || short {
            return;
        }
        let targets: Vec<hugepages::Target> = snapshot
            .vms
            .iter()
            .filter(|vm| due.contains(&vm.name))
            .filter_map(|vm| {
                let (pid, started) = self.fleet.hypervisor(&vm.name)?;
                Some(hugepages::Target {
                    vm: vm.name.clone(),
                    pid: i32::try_from(pid).ok()?,
                    started,
                    mappings: Mappings::of(vm.sample.as_ref().ok()?),
                    bound: restore.bound(&vm.name, Bytes(sizes.huge)),
                })
            })
            .collect();
        if targets.is_empty() {
            return;
        }
        restore.started(snapshot.at);
        let (proc, dry_run) = (self.config.host.proc.clone(), self.options.dry_run);
        self.collapsing = Some(tokio::task::spawn_blocking(move || {
            hugepages::pass(&proc, sizes, &targets, dry_run)
        }));
    }

    /// A huge-page pass's outcomes logged and counted once it has ended.
    pub(super) async fn collapsed(&mut self, pass: CollapsePass) {
        match pass.await {
            Ok(outcomes) => outcomes.iter().for_each(|o| self.log_collapse(o)),
            Err(e) => tracing::error!("the huge-page pass ended abnormally: {e}"),
        }
    }

    /// Count and log one VM's huge-page pass, and keep where the next goes on; turn the
    /// passes off if the host cannot.
    fn log_collapse(&mut self, o: &hugepages::Outcome) {
        if let (Some((restore, _)), Ok(c)) = (&mut self.huge_pages, &o.done) {
            restore.stopped(&o.vm, c.next);
        }
        let Some((kind, result, gained, message)) = o.event() else {
            return;
        };
        self.counters.huge_pages_restored_bytes += gained.0;
        if let Some(result) = result {
            self.counters.action("huge_pages", result);
        }
        self.events.log(kind, Some(&o.vm), None, message);
        if o.unsupported() {
            tracing::warn!(
                "huge pages are not restored after a balloon gives memory back from now \
                 on ([host] restore_huge_pages = false silences this)"
            );
            self.huge_pages = None;
        }
    }

    /// Tier placement (`[tiering] place`): every `[tiering] interval_s`, one pass over
    /// the VMs with a process id (and those configured by `pid`), run off the runtime
    /// and not waited for (it scans each VM's memory and moves pages), as reclaim's
    /// passes are; each VM's moves and each failure are logged and counted when the pass
    /// has ended. At every tick, VMs no longer placed leave the status (and their gauges).
    pub(super) async fn place(&mut self, snapshot: &Snapshot) {
        let Some(nodes) = self.tier_nodes else {
            return;
        };
        let mut targets = self.place_targets(snapshot);
        if self.placing.as_ref().is_some_and(|p| p.is_finished()) {
            if let Some(pass) = self.placing.take() {
                self.placed(pass).await;
            }
        }
        self.placed
            .retain(|vm, _| targets.iter().any(|t| &t.vm == vm));
        if self.placing.is_some() {
            return;
        }
        // A VM being saved keeps its place and its tracker, moved by no pass while its
        // memory is read whole (found by an audit: the migration thread and move_pages on
        // one guest).
        targets.retain(|t| !self.saving.contains_key(&t.vm));
        let held: HashSet<String> = self.saving.keys().cloned().collect();
        if targets.is_empty() {
            // Nothing to place: no tracker kept, nor the cold age of a VM away for longer
            // than the longest age.
            if let Some(placer) = &mut self.tier_placer {
                placer.hold(held);
                placer.forget_gone(&targets, snapshot.at);
            }
            return;
        }
        let config = &self.config.tiering;
        let now = Instant::now();
        let every = Duration::from_secs_f64(config.interval_s);
        if self.place_started.is_some_and(|t| now < t + every) {
            return;
        }
        self.place_started = Some(now);
        let mut placer = self.tier_placer.take().unwrap_or_else(|| {
            let host = &self.config.host;
            place::TierPlacer::new(nodes, config, host.proc.clone(), host.sys.clone())
        });
        placer.hold(held);
        self.cold_ages = placer.ages();
        let (at, dry_run) = (snapshot.at, self.options.dry_run);
        self.placing = Some(tokio::task::spawn_blocking(move || {
            place::run_pass(placer, &targets, at, dry_run)
        }));
    }

    /// The VMs to place ([`place::targets`]).
    fn place_targets(&self, snapshot: &Snapshot) -> Vec<place::Target> {
        let known = |vm: &str| {
            let (_, config) = self.fleet.process(vm)?;
            Some(place::Known {
                process: self.fleet.hypervisor(vm),
                config,
                ram: self.fleet.ram(vm),
            })
        };
        place::targets(&snapshot.vms, known, &self.config)
    }

    /// A placement pass's outcomes logged and counted once it has ended, its trackers
    /// kept. A pass that panicked places nothing: no VM is shown placed.
    pub(super) async fn placed(&mut self, pass: PlacePass) {
        let failed = match pass.await {
            Ok((placer, outcomes)) => {
                self.tier_placer = Some(placer);
                match outcomes {
                    Ok(outcomes) => {
                        let mut seen = HashSet::new();
                        for o in outcomes {
                            // A VM named twice (refused the second time) keeps the first
                            // one's status.
                            let first = seen.insert(o.vm.clone());
                            self.log_place(o, first);
                        }
                        return;
                    }
                    Err(panic) => panic,
                }
            }
            // Its trackers are lost with it: the next pass starts afresh.
            Err(e) => e.to_string(),
        };
        tracing::error!("the placement pass ended abnormally: {failed}");
        self.placed.clear();
    }

    /// Count and log one VM's placement, and keep where its memory is (when `status`).
    fn log_place(&mut self, o: place::Outcome, status: bool) {
        match (o.done.resident(), &o.placement) {
            _ if !status => {}
            (Some(r), p) => {
                let placed = Placed {
                    vm: o.vm.clone(),
                    fast: r.fast,
                    slow: r.slow,
                    fast_budget: p.as_ref().map(|p| p.fast_budget),
                    cold_age: o.cold_age,
                };
                self.placed.insert(o.vm.clone(), placed);
            }
            (None, _) => {
                self.placed.remove(&o.vm);
            }
        }
        if let place::Done::Moved {
            demoted, promoted, ..
        } = o.done
        {
            self.counters.place_demoted_bytes += demoted.0;
            self.counters.place_promoted_bytes += promoted.0;
        }
        if let Some(age) = &o.age {
            let (rule, detail) = (Some(age.rule.as_ref()), age.detail.clone());
            self.events.log("cold_age", Some(&o.vm), rule, detail);
        }
        let Some(e) = o.event() else {
            return;
        };
        if let Some(rule) = e.rule {
            self.counters.rule(rule);
        }
        self.counters.action("place", e.result);
        self.events.log(e.kind, Some(&o.vm), e.rule, e.message);
    }
}
