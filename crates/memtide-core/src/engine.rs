//! The engine: one pure decision path, `collect → estimate → policy → safeguards → actions`.
//!
//! `Engine::tick` depends only on the snapshot and the engine's own state (histories and
//! balloon-target tracking). The daemon, tests and offline tools all drive this function.

use crate::action::{Action, KsmSettings, Reason};
use crate::config::EngineConfig;
use crate::decision::{
    Decision, Diagnostic, DiagnosticKind, GuestTotals, HostReport, VmReport, VmState,
};
use crate::estimate::fused::FusedMemory;
use crate::history::History;
use crate::policy::{Policy, PolicyInput, Proposal, VmInput};
use crate::sanitize::{
    bounded_actual, fixed_memory, implausible_agent, sanitize, stale, undelivered,
};
use crate::signals::Signals;
use crate::snapshot::{Snapshot, VmEvent, VmLimits, VmSample, VmSnapshot};
use crate::stats::{DomainScope, HostStats, KsmState};
use crate::units::Bytes;
use rustc_hash::{FxHashMap, FxHashSet};
use std::time::Duration;

/// A balloon target the guest has not reached yet.
struct Unreached {
    target: Bytes,
    since: Duration,
    reported: bool,
}

/// What the engine remembers about one VM.
struct VmMemory {
    history: History<VmSample>,
    unreached: Option<Unreached>,
    /// Since when the host holds more than the guest's balloon size explains.
    undelivered_since: Option<Duration>,
    /// The guest kept memory its balloon claimed to give back for the settle time: it is
    /// released and no longer managed, until it resets.
    released: bool,
    /// The lowest target memtide asked for (sent, or had in force) lately, and when it
    /// last did: the guest may still be inflating to it for a while after a higher one
    /// was sent, and a command whose answer never came may have been carried out.
    asked: Option<(Bytes, Duration)>,
    /// Another manager moved the balloon: why memtide leaves the VM alone, until
    /// [`Engine::manage_again`].
    foreign: Option<String>,
    /// Its target is sent even if memtide's last one is still in force: managed again
    /// (the other manager's is QEMU's now), or its target not reached for the settle
    /// time (QEMU's may be another's).
    resend: bool,
    /// The guest reset this tick: its balloon is given back in full.
    reset: bool,
    /// When memtide began to watch for other managers: its first sight of the VM, or its
    /// first sample after the reload that let memtide manage it again.
    since: Option<Duration>,
}

/// Why VMs that went away were left to another manager, the most recent
/// [`LeftAlone::MAX`] of them (discovered VMs come and go under names of their own).
#[derive(Default)]
struct LeftAlone {
    by_vm: FxHashMap<String, (u64, String)>,
    kept: u64,
}

impl LeftAlone {
    const MAX: usize = 4096;

    /// Keep why `vm` is left alone, forgetting the VM kept longest ago when full.
    fn keep(&mut self, vm: &str, why: String) {
        if self.by_vm.len() >= Self::MAX {
            let oldest = self.by_vm.iter().min_by_key(|(_, (n, _))| *n);
            if let Some(oldest) = oldest.map(|(vm, _)| vm.clone()) {
                self.by_vm.remove(&oldest);
            }
        }
        self.kept += 1;
        self.by_vm.insert(vm.to_string(), (self.kept, why));
    }

    /// Why `vm` is left alone, if it is, taken out.
    fn take(&mut self, vm: &str) -> Option<String> {
        self.by_vm.remove(vm).map(|(_, why)| why)
    }

    fn clear(&mut self) {
        self.by_vm.clear();
    }
}

/// The decision engine.
pub struct Engine {
    config: EngineConfig,
    policy: Box<dyn Policy>,
    host: History<HostStats>,
    vms: FxHashMap<String, VmMemory>,
    /// Why VMs gone from the snapshots (a connection lost) were left alone to another
    /// manager: they are again when they come back, until [`Engine::manage_again`]
    /// (found by an audit: a reconnection forgot it, and memtide fought the other
    /// manager again).
    left_alone: LeftAlone,
    ksm: KsmWatch,
}

/// The KSM knobs as memtide last set them, and why it leaves KSM alone, if it does:
/// someone else set them otherwise since.
#[derive(Debug, Default)]
struct KsmWatch {
    set: KsmSettings,
    foreign: Option<String>,
    /// A write of memtide's is under way: the knobs may read half written.
    writing: bool,
    /// Writes the kernel refused since the last that worked.
    refusals: u32,
}

/// KSM writes refused in a row after which memtide leaves KSM alone until a reload
/// (found by an audit: a sysfs memtide may not write, in a container or without the
/// capability, failed a write at every tick, and its alert never cleared).
const KSM_REFUSALS: u32 = 3;

/// A VM that made it through ingestion this tick.
struct Sampled<'s> {
    index: usize,
    snap: &'s VmSnapshot,
    signals: Signals,
}

impl Engine {
    /// An engine running `policy`.
    pub fn new(config: EngineConfig, policy: Box<dyn Policy>) -> Self {
        let host = History::new(config.history_len);
        Engine {
            config,
            policy,
            host,
            vms: FxHashMap::default(),
            left_alone: LeftAlone::default(),
            ksm: KsmWatch::default(),
        }
    }

    /// The name of the policy in force.
    pub fn policy_name(&self) -> &str {
        self.policy.name()
    }

    /// What the policy must not forget about each VM across a restart, at `at`.
    pub fn memory(&self, at: Duration) -> std::collections::BTreeMap<String, FusedMemory> {
        self.policy.memory(at)
    }

    /// Take back what [`Engine::memory`] kept before a restart, each VM's with its
    /// configured size; used for each VM when first seen at that size.
    pub fn recall(&mut self, memory: std::collections::BTreeMap<String, (Bytes, FusedMemory)>) {
        self.policy.recall(memory);
    }

    /// Forget what [`Engine::recall`] gave for VM `vm`, and what was learnt from it since:
    /// it runs in another hypervisor process than the one it was kept for, and its next
    /// decision starts afresh.
    pub fn forget_recalled(&mut self, vm: &str) {
        self.policy.forget_recalled(vm);
    }

    /// KSM's knobs were written as `settings` asked (the daemon's word, once the write
    /// succeeded): from now on, knobs found otherwise were set by someone else, and
    /// memtide leaves KSM alone until [`Engine::manage_again`].
    pub fn ksm_applied(&mut self, settings: &KsmSettings) {
        self.ksm.refusals = 0;
        self.ksm_left(settings);
    }

    /// A KSM write failed (`why`), leaving `left` as memtide wrote them (those it could
    /// not set back). At the third failure in a row memtide leaves KSM alone until
    /// `memtide reload`: returns what to add to the failure's report then.
    pub fn ksm_failed(&mut self, left: &KsmSettings, why: &str) -> Option<String> {
        self.ksm_left(left);
        self.ksm.refusals += 1;
        if self.ksm.refusals < KSM_REFUSALS || self.ksm.foreign.is_some() {
            return None;
        }
        self.ksm.foreign = Some(format!(
            "{KSM_REFUSALS} KSM writes in a row failed, the last: {why}"
        ));
        Some(format!(
            "; {KSM_REFUSALS} in a row: memtide leaves KSM alone until `memtide reload` (set \
             [engine] ksm_control = false where it may not tune KSM)"
        ))
    }

    /// Note the knobs `settings` sets as memtide's.
    fn ksm_left(&mut self, settings: &KsmSettings) {
        let set = &mut self.ksm.set;
        for (mine, new) in [
            (&mut set.run, settings.run),
            (&mut set.pages_to_scan, settings.pages_to_scan),
            (&mut set.sleep_millisecs, settings.sleep_millisecs),
            (&mut set.merge_across_nodes, settings.merge_across_nodes),
        ] {
            if new.is_some() {
                *mine = new;
            }
        }
    }

    /// Whether a write of KSM's knobs is under way (the daemon's word, each tick): while it
    /// is, knobs that read otherwise than memtide set them are not someone else's doing.
    pub fn ksm_writing(&mut self, writing: bool) {
        self.ksm.writing = writing;
    }

    /// Manage again the VMs left alone because another manager moved their balloons,
    /// and KSM if someone else had set its knobs (the operator said so: `memtide
    /// reload`); returns the VMs' names.
    pub fn manage_again(&mut self) -> Vec<String> {
        self.ksm = KsmWatch::default();
        self.left_alone.clear();
        let mut names: Vec<String> = self
            .vms
            .iter_mut()
            .filter_map(|(name, m)| {
                m.foreign.take()?;
                (m.resend, m.since) = (true, None);
                Some(name.clone())
            })
            .collect();
        names.sort();
        names
    }

    /// Replace the policy at `at`; histories are kept, and what the old policy learnt of
    /// each VM ([`Policy::memory`]) is handed to the new one ([`Policy::take_over`], each
    /// VM's at its configured size, for the VMs still running at the next decision): a
    /// reload, logrotate's weekly one included, does not start every VM's estimate over.
    pub fn set_policy(&mut self, policy: Box<dyn Policy>, at: Duration) {
        let learnt = self.policy.memory(at).into_iter().filter_map(|(vm, m)| {
            let configured = self.vms.get(&vm)?.history.latest()?.configured;
            Some((vm, (configured, m)))
        });
        let learnt = learnt.collect();
        self.policy = policy;
        self.policy.take_over(learnt);
    }

    /// Decide one tick.
    pub fn tick(&mut self, snap: &Snapshot) -> Decision {
        let at = snap.at;
        self.host.push(at, snap.host.clone());
        let present: FxHashSet<&str> = snap.vms.iter().map(|v| v.name.as_str()).collect();
        let left_alone = &mut self.left_alone;
        self.vms.retain(|name, m| {
            let stays = present.contains(name.as_str());
            if let Some(why) = m.foreign.take_if(|_| !stays) {
                left_alone.keep(name, why);
            }
            stays
        });

        let mut diagnostics = Vec::new();
        let mut actions = Vec::new();
        let mut reports = Vec::with_capacity(snap.vms.len());
        let mut sampled = Vec::new();
        for (index, vm) in snap.vms.iter().enumerate() {
            let (report, signals) = self.ingest(at, vm, &mut diagnostics, &mut actions);
            if let Some(signals) = signals {
                sampled.push(Sampled {
                    index,
                    snap: vm,
                    signals,
                });
            }
            reports.push(report);
        }

        let inputs: Vec<VmInput<'_>> = sampled
            .iter()
            .map(|s| VmInput {
                name: &s.snap.name,
                limits: &s.snap.limits,
                history: &self.vms[&s.snap.name].history,
                actual: reports[s.index].actual.expect("managed VMs have a balloon"),
                // None where memtide sends its next target even if it is its last one (a
                // VM managed again, or one whose target is not reached: the one in force
                // may be another manager's).
                target: s.snap.target.filter(|_| !self.vms[&s.snap.name].resend),
                signals: &s.signals,
            })
            .collect();
        let unreachable: Vec<&str> = snap
            .vms
            .iter()
            .filter(|vm| vm.sample.is_err())
            .map(|vm| vm.name.as_str())
            .collect();
        let mut output = self.policy.decide(&PolicyInput {
            at,
            host: &self.host,
            vms: &inputs,
            unreachable: &unreachable,
        });
        drop(inputs);

        for fault in &output.faults {
            diagnostics.push(Diagnostic {
                vm: fault.vm.clone(),
                kind: DiagnosticKind::PolicyError,
                message: format!("policy {}: {}", self.policy.name(), fault.message),
            });
        }
        for claim in &output.unbacked {
            diagnostics.push(Diagnostic {
                vm: Some(claim.vm.clone()),
                kind: DiagnosticKind::UnbackedClaim,
                message: claim.message.clone(),
            });
        }
        let short = output
            .need
            .is_some_and(|n| n.level == crate::need::NeedLevel::Short);
        for s in &sampled {
            let report = &mut reports[s.index];
            let name = &s.snap.name;
            report.estimate = output.estimates.get(name).copied();
            // QEMU keeps a balloon's target across a guest reset, and the guest's driver
            // inflates to it again as it boots: a target chosen for the workload before
            // the reset, which the estimator would then take for the guest's size. Not
            // while the host is short: the policy decides then, its estimator started
            // afresh all the same.
            let reset = self
                .vms
                .get_mut(name)
                .is_some_and(|m| std::mem::take(&mut m.reset));
            if reset && !short {
                let then = output
                    .balloon
                    .remove(name)
                    .map(|p| p.reason)
                    .or_else(|| output.holds.remove(name));
                let target = s.snap.limits.max;
                let mut detail = format!(
                    "guest reset: its balloon given back ({target}) while it boots (QEMU keeps \
                     the target across a reset, and the guest would inflate to it again)"
                );
                if let Some(then) = then {
                    detail += &format!("; the policy, starting afresh: {then}");
                }
                let reason = Reason::new("safeguard.reset", detail);
                if let Some(m) = self.vms.get_mut(name) {
                    asked(m, target, at, Duration::from_secs(self.config.settle_s));
                }
                actions.push(Action::SetBalloon {
                    vm: name.clone(),
                    target,
                    reason: reason.clone(),
                });
                (report.target, report.reason) = (Some(target), Some(reason));
                continue;
            }
            // A VM the policy holds outside its bounds (raised by a reload, or found so
            // at connection) is brought within them all the same: the bounds are the
            // operator's, whatever the policy's pace (found in review: mom under host
            // pressure holds a guest whose floor is above its size for good).
            // So is a target to send again ([`VmMemory::resend`]) where the policy holds.
            let in_force = s.snap.target.or(report.actual);
            let again = s.snap.target.filter(|_| self.vms[name].resend);
            let proposal = output.balloon.remove(name).or_else(|| {
                let target = in_force
                    .filter(|t| !(s.snap.limits.min..=s.snap.limits.max).contains(t))
                    .or(again)?;
                let reason = output
                    .holds
                    .remove(name)
                    .unwrap_or_else(|| Reason::new("hold", "the policy proposes nothing"));
                Some(Proposal { target, reason })
            });
            if let Some(p) = proposal {
                let configured = s.snap.sample.as_ref().ok().map(|v| v.configured);
                let (target, mut reason) = clamp(p, &s.snap.limits, configured);
                // Where the backend knows no target (a VM first seen, or reconnected to)
                // the guest's size is QEMU's target only while it is whole: one ballooned
                // below its size is sent memtide's even where it is at it already, so
                // that QEMU's target is known (found in an audit: a QEMU reconnected
                // after a hang showed no target in status and metrics for as long as its
                // guest stayed at its minimum, though QEMU held one).
                let delivered = s.snap.target.or(report
                    .actual
                    .filter(|a| report.configured.is_some_and(|c| *a >= c)));
                let resend = self
                    .vms
                    .get_mut(name)
                    .is_some_and(|m| std::mem::take(&mut m.resend));
                if delivered == Some(target) && !resend {
                    reason.rule = "safeguard.unchanged".into();
                    reason.detail.push_str("; that is already the target");
                    report.reason = Some(reason);
                } else {
                    if delivered == Some(target) {
                        reason
                            .detail
                            .push_str("; sent again (QEMU's may be another's)");
                    }
                    if let Some(m) = self.vms.get_mut(name) {
                        let settle = Duration::from_secs(self.config.settle_s);
                        asked(m, target, at, settle);
                    }
                    actions.push(Action::SetBalloon {
                        vm: name.clone(),
                        target,
                        reason: reason.clone(),
                    });
                    report.target = Some(target);
                    report.reason = Some(reason);
                }
            } else if let Some(hold) = output.holds.remove(name) {
                report.reason = Some(hold);
            }
        }

        // A reset seen for a VM not decided this tick (left alone, its memory fixed) is
        // not carried to a later one.
        for m in self.vms.values_mut() {
            m.reset = false;
        }
        if let (None, Some(state), false) = (&self.ksm.foreign, &snap.host.ksm, self.ksm.writing) {
            self.ksm.foreign = foreign_ksm(&self.ksm.set, state);
            if let Some(why) = &self.ksm.foreign {
                diagnostics.push(Diagnostic {
                    vm: None,
                    kind: DiagnosticKind::OtherManager,
                    message: format!("{why}: memtide leaves KSM alone until `memtide reload`"),
                });
            }
        }
        let mut host = self.host_report(snap, output.ksm.as_ref().map(|k| &k.reason));
        host.need = output.need;
        // Two managers on the same knobs undo each other's work: KSM is left to a running
        // ksmtuned; one that sets balloon targets is reported (memtide cannot tell which
        // VMs it acts on).
        let others = &snap.host.other_managers;
        for other in others {
            let mut message = format!("{} (pid {}) {}", other.name, other.pid, other.what());
            if other.tunes_ksm() && self.config.ksm_control {
                message += ": memtide leaves KSM to it";
            }
            if other.sets_balloons() {
                message += "; each undoes the other's balloon targets: stop it, or leave the \
                            VMs it manages out of memtide's configuration";
            }
            diagnostics.push(Diagnostic {
                vm: None,
                kind: DiagnosticKind::OtherManager,
                message,
            });
        }
        let ksm_is_ours = !others.iter().any(|o| o.tunes_ksm())
            && self.ksm_domain(snap)
            && self.ksm.foreign.is_none();
        if let (Some(proposal), Some(state)) = (&output.ksm, &snap.host.ksm) {
            let mut changed = ksm_changes(&proposal.settings, state);
            // The kernel refuses a new merge_across_nodes (EBUSY) while pages are merged;
            // `run` 2 would unmerge them all first, and the host need that memory back at
            // once. Asked for, it would fail the other knobs' write with it every tick.
            if let Some(wanted) = changed
                .merge_across_nodes
                .filter(|_| state.pages_shared > 0)
            {
                changed.merge_across_nodes = None;
                if self.config.ksm_control && ksm_is_ours {
                    diagnostics.push(Diagnostic {
                        vm: None,
                        kind: DiagnosticKind::PolicyError,
                        message: format!(
                            "policy {} asks KSM's merge_across_nodes {wanted}: the kernel \
                             changes it only while no page is merged, and memtide does not \
                             unmerge them all (ksm run 2) to do it; left as it is",
                            self.policy.name()
                        ),
                    });
                }
            }
            // The kernel's advisor tunes pages_to_scan itself, and refuses writes of it:
            // asked for with the others, ksmd was never started again (found by an audit).
            if state.advisor.is_some() {
                changed.pages_to_scan = None;
            }
            if self.config.ksm_control && ksm_is_ours && !changed.is_empty() {
                actions.push(Action::SetKsm {
                    settings: changed,
                    reason: advised(&proposal.reason, Some(state)),
                });
            }
        }

        Decision {
            at,
            policy: self.policy.name().to_string(),
            host,
            vms: reports,
            actions,
            diagnostics,
        }
    }

    /// Take in one VM's sample: record it, follow its balloon target, report it.
    /// Returns the VM's signals when a policy may decide for it; a VM that keeps memory
    /// its balloon claims to have given back, or whose memory no balloon frees, gets,
    /// instead, its balloon released.
    fn ingest(
        &mut self,
        at: Duration,
        vm: &VmSnapshot,
        diagnostics: &mut Vec<Diagnostic>,
        actions: &mut Vec<Action>,
    ) -> (VmReport, Option<Signals>) {
        let settle = Duration::from_secs(self.config.settle_s);
        let history_len = self.config.history_len;
        if !self.vms.contains_key(&vm.name) {
            let fresh = VmMemory {
                history: History::new(history_len),
                unreached: None,
                undelivered_since: None,
                released: false,
                asked: None,
                foreign: self.left_alone.take(&vm.name),
                resend: false,
                reset: false,
                since: None,
            };
            self.vms.insert(vm.name.clone(), fresh);
        }
        let memory = self.vms.get_mut(&vm.name).expect("inserted above");
        let mut diag = |kind, message: String| {
            diagnostics.push(Diagnostic {
                vm: Some(vm.name.clone()),
                kind,
                message,
            });
        };
        let mut report = empty_report(vm);
        let sample = match &vm.sample {
            Err(e) => {
                let kind;
                (report.state, kind) = match e {
                    crate::BackendError::Busy(_) => (VmState::Busy, DiagnosticKind::Busy),
                    _ => (VmState::Unreachable, DiagnosticKind::Unreachable),
                };
                diag(kind, format!("not sampled: {e}"));
                report.error = Some(e.clone());
                return (report, None);
            }
            Ok(sample) => sample,
        };
        for event in &sample.events {
            match event {
                VmEvent::Reset => {
                    memory.history.clear();
                    memory.unreached = None;
                    (memory.undelivered_since, memory.released) = (None, false);
                    memory.reset = true;
                    diag(
                        DiagnosticKind::GuestReset,
                        "guest reset: its balloon is given back in full while it boots".into(),
                    );
                }
                VmEvent::Shutdown => diag(DiagnosticKind::GuestShutdown, "guest shut down".into()),
                // Going on where it was: what was learnt of it holds.
                VmEvent::Restored | VmEvent::Saved | VmEvent::BalloonChange { .. } => {}
            }
        }
        let mut clean = VmSample {
            events: Vec::new(),
            ..sample.clone()
        };
        for p in sanitize(&mut clean.stats, sample.configured) {
            diag(DiagnosticKind::ImplausibleStats, p);
        }
        if let Some(p) = stale(&mut clean.stats, at, &memory.history) {
            diag(DiagnosticKind::ImplausibleStats, p);
        }
        if let Some(Ok(a)) = &clean.agent {
            if let Some(p) = implausible_agent(&a.meminfo, sample.configured) {
                diag(DiagnosticKind::ImplausibleStats, p.clone());
                clean.agent = Some(Err(p));
            }
        }
        if let Some(actual) = clean.balloon {
            let (actual, why) = bounded_actual(actual, sample.configured);
            if let Some(p) = why {
                diag(DiagnosticKind::ImplausibleStats, p);
            }
            clean.balloon = Some(actual);
        }
        let before = memory.history.latest().and_then(|s| s.balloon);
        if let Some(was) = memory.history.latest().map(|s| s.configured) {
            if was != sample.configured {
                diag(
                    DiagnosticKind::MemoryResized,
                    format!(
                        "its memory went from {was} to {} while it ran (a memory device \
                         plugged or removed): sized by it from now on",
                        sample.configured
                    ),
                );
            }
        }
        memory.history.push(at, clean);
        let signals = Signals::derive(&memory.history);
        let latest = memory.history.latest().expect("just pushed");
        report.configured = Some(sample.configured);
        report.actual = latest.balloon;
        report.target = vm.target;
        report.guest_free = latest.stats.free;
        report.guest_available = latest.stats.available;
        report.used = signals.used;
        report.committed_as = signals.committed_as;
        report.guest_zram = signals.zram;
        report.guest_psi_some_avg10 = signals.psi_some_avg10;
        report.refaults_per_s = signals
            .refaults
            .zip(signals.interval.filter(|d| !d.is_zero()))
            .map(|(n, d)| n as f64 / d.as_secs_f64());
        if let Some(Err(e)) = &sample.agent {
            diag(DiagnosticKind::AgentUnavailable, e.clone());
        }
        report.plugged = sample.virtio_mem.as_ref().map(|m| m.plugged);
        report.free_page_reporting = sample.free_page_reporting;
        if let Some(offline) = sample
            .virtio_mem
            .as_ref()
            .and_then(|m| m.offline)
            .filter(|o| *o >= Bytes::from_mib(64))
        {
            let message = format!(
                "{offline} of virtio-mem memory is plugged but not onlined by the guest \
                 (boot it with memhp_default_state=online_movable)"
            );
            diag(DiagnosticKind::MemoryNotOnlined, message);
        }
        report.major_faults_per_s = signals.major_faults_per_s;
        report.swap_in_per_s = signals.swap_in_per_s;
        report.swap_out_per_s = signals.swap_out_per_s;
        report.totals = totals(latest);
        report.rss = sample.rss;
        report.hypervisor_own = sample.fixed.and_then(|f| f.own);
        report.host_swapped = sample.swapped;

        let Some(actual) = latest.balloon else {
            report.state = VmState::Unmanaged;
            diag(
                DiagnosticKind::NoBalloon,
                "no balloon device: memory cannot be changed".into(),
            );
            return (report, None);
        };
        // The host must see the memory a balloon takes (#18 defect 5, #14): a guest whose
        // memory no balloon frees (locked, pinned, in huge pages), or that keeps what its
        // balloon claims to have given back, is not managed, so that what it holds is never
        // divided among the others.
        let excess = undelivered(actual, latest.rss, sample.configured);
        memory.undelivered_since = excess.and(memory.undelivered_since.or(Some(at)));
        if let Some(since) = memory.undelivered_since {
            memory.released |= at.saturating_sub(since) >= settle;
        }
        let full = vm.limits.max;
        let fixed = sample
            .fixed
            .as_ref()
            .and_then(|f| fixed_memory(f, sample.configured));
        // A balloon is released to the full size when memtide moved it, or, for a guest
        // keeping what it gave, when anyone did.
        let moved = vm.target.is_some_and(|t| t != full);
        let unmanaged = if let Some(why) = fixed {
            let detail = format!("{why}: not managed, its memory not divided among the others");
            Some((
                DiagnosticKind::FixedMemory,
                "safeguard.fixed_memory",
                detail,
                moved,
            ))
        } else if memory.released {
            let detail = format!(
                "QEMU holds {} while the guest reports a balloon size of {actual}, more than \
                 QEMU's own overhead explains: the guest keeps memory its balloon claims to \
                 have given back; balloon released to {full}, no longer managed (until it \
                 resets), its memory not divided among the others",
                latest.rss.unwrap_or(actual)
            );
            let release = vm.target.unwrap_or(actual) != full;
            Some((
                DiagnosticKind::UndeliveredBalloon,
                "safeguard.undelivered",
                detail,
                release,
            ))
        } else {
            None
        };
        if let Some((kind, rule, detail, release)) = unmanaged {
            report.state = VmState::Unmanaged;
            diag(kind, detail.clone());
            let reason = Reason::new(rule, detail);
            if release {
                actions.push(Action::SetBalloon {
                    vm: vm.name.clone(),
                    target: full,
                    reason: reason.clone(),
                });
                report.target = Some(full);
            }
            report.reason = Some(reason);
            return (report, None);
        }
        if let Some(why) = foreign(memory, vm, actual, before, at, settle) {
            memory.foreign.get_or_insert(why);
        }
        if let Some(why) = &memory.foreign {
            report.state = VmState::Unmanaged;
            diag(DiagnosticKind::OtherManager, why.clone());
            report.reason = Some(Reason::new("safeguard.other_manager", why.clone()));
            return (report, None);
        }
        memory.unreached = match (vm.target, memory.unreached.take()) {
            (Some(target), _) if reached(actual, target) => None,
            (Some(target), Some(u)) if u.target == target => {
                let late = at.saturating_sub(u.since) >= settle;
                if late && !u.reported {
                    diag(
                        DiagnosticKind::TargetNotReached,
                        format!(
                            "balloon target {target} not reached after {} s: the guest is at \
                             {actual}; the target is to be sent again",
                            settle.as_secs()
                        ),
                    );
                    // QEMU's target may not be memtide's (found by an audit: one set by
                    // another manager within the settle time after a restart, never
                    // judged, held the guest below memtide's for good).
                    memory.resend = true;
                }
                Some(Unreached {
                    reported: u.reported || late,
                    ..u
                })
            }
            (Some(target), _) => Some(Unreached {
                target,
                since: at,
                reported: false,
            }),
            (None, _) => None,
        };
        (report, Some(signals))
    }

    /// KSM is host-wide: tuned for a domain that is the whole host, or a cgroup when the
    /// operator says so.
    fn ksm_domain(&self, snap: &Snapshot) -> bool {
        snap.host.domain.scope == DomainScope::Host || self.config.ksm_in_cgroup_domain
    }

    fn host_report(&self, snap: &Snapshot, ksm_reason: Option<&Reason>) -> HostReport {
        let domain = &snap.host.domain;
        let psi = snap.host.psi.map(|p| p.some.avg10);
        let tuner = snap.host.other_managers.iter().find(|o| o.tunes_ksm());
        let ksm_reason = ksm_reason.map(|r| {
            let r = advised(r, snap.host.ksm.as_ref());
            let why = match tuner {
                _ if !self.config.ksm_control => "ksm_control is off".to_string(),
                Some(o) => format!("{} (pid {}) tunes KSM", o.name, o.pid),
                None if self.ksm.foreign.is_some() => format!(
                    "{}; until `memtide reload`",
                    self.ksm.foreign.as_deref().unwrap_or_default()
                ),
                None if !self.ksm_domain(snap) => "KSM is host-wide and the domain is a cgroup \
                    (set [engine] ksm_in_cgroup_domain to tune it anyway)"
                    .to_string(),
                None => return r,
            };
            Reason::new(r.rule.clone(), format!("{} (not applied: {why})", r.detail))
        });
        HostReport {
            scope: domain.scope.clone(),
            total: domain.total,
            freeable: domain.freeable,
            free_ratio: domain.free_ratio(),
            // The mean of each sample's share, not MOM's mean freeable over the latest
            // total (`mom::host_free_ratio`, which the mom policy keeps): that left 0-1
            // for the history's length whenever the domain's size changed (an audit saw
            // 6697% after a cgroup's limit was lowered), and hibernation reads this.
            free_ratio_avg: self
                .host
                .mean(|h| Some(h.domain.free_ratio()))
                .unwrap_or(0.0),
            psi_some_avg10: psi,
            swap_in_per_s: self.host.rate(|h| h.vmstat.pswpin),
            swap_out_per_s: self.host.rate(|h| h.vmstat.pswpout),
            swapped_in_pages: snap.host.vmstat.pswpin,
            swapped_out_pages: snap.host.vmstat.pswpout,
            ksm: snap.host.ksm.clone(),
            ksm_reason,
            need: None,
        }
    }
}

/// Why the VM's balloon was moved by another manager, if it was: it shrank this tick to
/// below the lowest target memtide asked for lately (a guest never inflates its own
/// balloon; after memtide raised its target, the guest may go on inflating to the last
/// one for a while). Not judged within `settle` of the VM's first sight (a memtide killed
/// after sending a target and before saving it finds the guest inflating to a target it
/// does not know), nor of its first sample after it is managed again (the other
/// manager's inflation may still be under way).
fn foreign(
    memory: &mut VmMemory,
    vm: &VmSnapshot,
    actual: Bytes,
    before: Option<Bytes>,
    at: Duration,
    settle: Duration,
) -> Option<String> {
    let target = vm.target?;
    let lowest = asked(memory, target, at, settle);
    if at.saturating_sub(*memory.since.get_or_insert(at)) < settle {
        return None;
    }
    let slack = Bytes::from_mib(4).max(vm.limits.max.scale(0.02));
    // Shrinking by more than a page's rounding.
    let shrank = before.is_some_and(|b| actual + Bytes::from_mib(1) < b);
    (actual + slack < lowest && shrank).then(|| {
        format!(
            "its balloon was inflated to {actual}, below the {lowest} memtide asked for: \
             another manager sets its balloon target; memtide leaves this VM alone (its \
             memory not divided among the others) until `memtide reload`"
        )
    })
}

/// Note that memtide asked the VM for `target` at `at`; the lowest target asked for
/// within `settle`.
fn asked(memory: &mut VmMemory, target: Bytes, at: Duration, settle: Duration) -> Bytes {
    let lowest = match memory.asked {
        Some((low, when)) if at.saturating_sub(when) < settle && low < target => (low, when),
        _ => (target, at),
    };
    memory.asked = Some(lowest);
    lowest.0
}

/// A target is reached when the guest is within 1 MiB or 1% of it.
fn reached(actual: Bytes, target: Bytes) -> bool {
    actual.abs_diff(target) <= Bytes::from_mib(1).max(target.scale(0.01))
}

/// Keep a proposed target within the operator's bounds, saying so in the reason, and
/// say where a policy that keeps within them itself (memtide's) proposes one of them: a
/// max below the guest's `configured` size, a min above nothing (found by an audit: a
/// target held to a max read as the estimate's doing).
fn clamp(p: Proposal, limits: &VmLimits, configured: Option<Bytes>) -> (Bytes, Reason) {
    let (target, bound, verb) = if p.target < limits.min {
        (limits.min, "min", "raised to")
    } else if p.target > limits.max {
        (limits.max, "max", "capped at")
    } else {
        let bound = match p.target {
            t if t == limits.max && configured.is_some_and(|c| t < c) => "max",
            t if t == limits.min && t > Bytes::ZERO => "min",
            _ => return (p.target, p.reason),
        };
        let detail = format!("{}; the VM's {bound}", p.reason.detail);
        return (p.target, Reason { detail, ..p.reason });
    };
    let detail = format!("{}; {verb} {target} by the VM's {bound}", p.reason.detail);
    let reason = Reason {
        need: p.reason.need,
        ..Reason::new(format!("{}+safeguard.{bound}", p.reason.rule), detail)
    };
    (target, reason)
}

/// The knobs of `wanted` that differ from the kernel's current values.
/// Why KSM's knobs are not as memtide `set` them, if they are not: each knob it set
/// that `state` has otherwise.
fn foreign_ksm(set: &KsmSettings, state: &KsmState) -> Option<String> {
    let other = ksm_changes(set, state);
    let knobs: Vec<String> = [
        ("run", other.run, Some(state.run)),
        (
            "pages_to_scan",
            other.pages_to_scan,
            Some(state.pages_to_scan),
        ),
        (
            "sleep_millisecs",
            other.sleep_millisecs,
            Some(state.sleep_millisecs),
        ),
        (
            "merge_across_nodes",
            other.merge_across_nodes,
            state.merge_across_nodes,
        ),
    ]
    .into_iter()
    .filter_map(|(name, mine, now)| {
        let now = now.map_or("unreadable".to_string(), |n| n.to_string());
        Some(format!("{name} {} (memtide set {})", now, mine?))
    })
    .collect();
    (!knobs.is_empty()).then(|| {
        format!(
            "KSM's knobs were set by someone else since memtide set them: {}",
            knobs.join(", ")
        )
    })
}

/// A KSM proposal's `reason`, saying where `pages_to_scan` is left to the kernel's
/// advisor (found by a review: the action's reason told of a step not written).
fn advised(reason: &Reason, state: Option<&KsmState>) -> Reason {
    match state.and_then(|k| k.advisor.as_deref()) {
        Some(a) => Reason::new(
            reason.rule.clone(),
            format!(
                "{} (pages_to_scan left to the kernel's {a} advisor)",
                reason.detail
            ),
        ),
        None => reason.clone(),
    }
}

fn ksm_changes(wanted: &KsmSettings, state: &KsmState) -> KsmSettings {
    let differs = |want: Option<u64>, have: Option<u64>| want.filter(|w| Some(*w) != have);
    KsmSettings {
        run: differs(wanted.run, Some(state.run)),
        pages_to_scan: differs(wanted.pages_to_scan, Some(state.pages_to_scan)),
        sleep_millisecs: differs(wanted.sleep_millisecs, Some(state.sleep_millisecs)),
        merge_across_nodes: differs(wanted.merge_across_nodes, state.merge_across_nodes),
    }
}

fn empty_report(vm: &VmSnapshot) -> VmReport {
    VmReport {
        name: vm.name.clone(),
        state: VmState::Managed,
        error: None,
        configured: None,
        actual: None,
        target: vm.target,
        min: vm.limits.min,
        max: vm.limits.max,
        guest_free: None,
        guest_available: None,
        used: None,
        estimate: None,
        committed_as: None,
        refaults_per_s: None,
        guest_psi_some_avg10: None,
        major_faults_per_s: None,
        swap_in_per_s: None,
        swap_out_per_s: None,
        rss: None,
        hypervisor_own: None,
        host_swapped: None,
        guest_zram: None,
        plugged: None,
        free_page_reporting: false,
        reason: None,
        totals: GuestTotals::default(),
    }
}

/// The cumulative counters of a VM's (sanitized) sample.
fn totals(sample: &VmSample) -> GuestTotals {
    let agent = sample.agent.as_ref().and_then(|a| a.as_ref().ok());
    GuestTotals {
        swapped_in: sample.stats.swap_in,
        swapped_out: sample.stats.swap_out,
        major_faults: sample.stats.major_faults,
        refaults: agent.and_then(|a| a.vmstat.refaults()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vms_left_alone_longest_ago_are_forgotten_first_when_full() {
        let mut left = LeftAlone::default();
        for n in 0..LeftAlone::MAX {
            left.keep(&format!("ci-{n}"), format!("moved {n}"));
        }
        left.keep("web", "moved by momd".into());
        assert_eq!(left.by_vm.len(), LeftAlone::MAX);
        assert_eq!(left.take("ci-0"), None, "the oldest went");
        assert_eq!(left.take("ci-1").as_deref(), Some("moved 1"));
        assert_eq!(left.take("web").as_deref(), Some("moved by momd"));
        assert_eq!(left.take("web"), None, "taken out");
    }
}
