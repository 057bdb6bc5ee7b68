//! Policies: given the host's and the guests' recent history, propose balloon targets
//! and KSM settings. Policies are pure; the engine applies safeguards to what they propose.

pub mod burst;
pub mod divide;
pub mod esx;
pub mod killed;
pub mod ksmtuned;
pub mod mom;
pub mod none;
pub mod peak;
pub mod proxmox;
pub mod reserved;
pub mod routed;
pub mod trust;
pub mod working_set;

use crate::action::{KsmSettings, Reason};
use crate::estimate::fused::FusedMemory;
use crate::history::History;
use crate::need::Need;
use crate::signals::Signals;
use crate::snapshot::{VmLimits, VmSample};
use crate::stats::HostStats;
use crate::units::Bytes;
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::BTreeMap;
use std::time::Duration;

/// One VM as a policy sees it: only VMs with a balloon and a fresh sample are shown.
#[derive(Clone, Copy)]
pub struct VmInput<'a> {
    /// The VM's name.
    pub name: &'a str,
    /// Operator bounds.
    pub limits: &'a VmLimits,
    /// Recent (sanitized) samples, the latest last; never empty.
    pub history: &'a History<VmSample>,
    /// The guest's current logical size (balloon actual).
    pub actual: Bytes,
    /// The balloon target in force (the last one delivered), when known: the size the
    /// guest is moving to.
    pub target: Option<Bytes>,
    /// Derived signals.
    pub signals: &'a Signals,
}

impl VmInput<'_> {
    /// The latest sample.
    pub fn latest(&self) -> &VmSample {
        self.history
            .latest()
            .expect("policy inputs have at least one sample")
    }
}

/// Everything a policy may look at.
pub struct PolicyInput<'a> {
    /// Time of the tick.
    pub at: Duration,
    /// Recent host samples, the latest last; never empty.
    pub host: &'a History<HostStats>,
    /// The VMs.
    pub vms: &'a [VmInput<'a>],
    /// The VMs that could not be sampled this tick (a late or lost connection): not
    /// decided, but what a policy learnt of them is kept.
    pub unreachable: &'a [&'a str],
}

impl PolicyInput<'_> {
    /// The latest host sample.
    pub fn host_latest(&self) -> &HostStats {
        self.host
            .latest()
            .expect("policy inputs have at least one host sample")
    }

    /// The VMs whose learnt state a policy keeps: those sampled this tick and those only
    /// unreachable for it (a late sample must not start them over).
    pub fn known(&self) -> FxHashSet<&str> {
        let sampled = self.vms.iter().map(|vm| vm.name);
        sampled.chain(self.unreachable.iter().copied()).collect()
    }
}

/// A proposed balloon target and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Proposal {
    /// The guest's proposed logical size.
    pub target: Bytes,
    /// Why.
    pub reason: Reason,
}

/// Proposed KSM settings and why.
#[derive(Clone, Debug, PartialEq)]
pub struct KsmProposal {
    /// The knobs the policy wants.
    pub settings: KsmSettings,
    /// Why.
    pub reason: Reason,
}

/// A policy failure, for one VM or (with no VM) for the whole evaluation.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyFault {
    /// The VM the failure concerns, if any.
    pub vm: Option<String>,
    /// What went wrong.
    pub message: String,
}

/// A VM whose own figures claimed, while memory was divided, more than its fair share and
/// than the host saw it use: the excess was not honoured.
#[derive(Clone, Debug, PartialEq)]
pub struct UnbackedClaim {
    /// The VM.
    pub vm: String,
    /// What it claimed and what it was credited, in words.
    pub message: String,
}

/// What a policy proposes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PolicyOutput {
    /// Balloon targets, by VM name; a VM without an entry keeps its size.
    pub balloon: FxHashMap<String, Proposal>,
    /// Why VMs without a proposal keep their size, by VM name.
    pub holds: FxHashMap<String, Reason>,
    /// The working set the policy estimated, by VM name (policies that estimate one).
    pub estimates: FxHashMap<String, Bytes>,
    /// KSM settings, if the policy manages KSM.
    pub ksm: Option<KsmProposal>,
    /// Failures; VMs not named here were still decided.
    pub faults: Vec<PolicyFault>,
    /// Claims not honoured for want of evidence (see [`divide::credible`]).
    pub unbacked: Vec<UnbackedClaim>,
    /// The host's need for memory, where the policy weighs one.
    pub need: Option<Need>,
}

impl PolicyOutput {
    /// An empty output with room for `vms` VMs' decisions.
    pub fn with_capacity(vms: usize) -> PolicyOutput {
        PolicyOutput {
            balloon: map(vms),
            holds: map(vms),
            estimates: map(vms),
            ..PolicyOutput::default()
        }
    }

    /// Every VM of `vms` keeps its size, for `reason` (a policy between its evaluations).
    pub fn hold_all(&mut self, vms: &[VmInput<'_>], reason: Reason) {
        for vm in vms {
            self.holds.insert(vm.name.to_string(), reason.clone());
        }
    }
}

fn map<V>(capacity: usize) -> FxHashMap<String, V> {
    FxHashMap::with_capacity_and_hasher(capacity, Default::default())
}

/// A memory policy.
pub trait Policy: Send {
    /// The policy's name, as shown in status and reasons.
    fn name(&self) -> &str;
    /// Decide one tick.
    fn decide(&mut self, input: &PolicyInput<'_>) -> PolicyOutput;
    /// What the policy must not forget about each VM when the daemon restarts, at `at`
    /// (memtide's estimator only, so far; other policies keep nothing).
    fn memory(&self, _at: Duration) -> BTreeMap<String, FusedMemory> {
        BTreeMap::new()
    }
    /// Take back what [`Policy::memory`] kept before a restart, each VM's with its
    /// configured size: used when the VM is first seen, at that size.
    fn recall(&mut self, _memory: BTreeMap<String, (Bytes, FusedMemory)>) {}
    /// Forget what [`Policy::recall`] gave for VM `vm`, and the estimate grown from it if
    /// it was used: the VM is not the one it was kept for (its next decision starts
    /// afresh).
    fn forget_recalled(&mut self, _vm: &str) {}
    /// Take over what the policy this one replaces (a reload) had learnt, each VM's with
    /// its configured size: used at the next decision for each VM still running at that
    /// size, and for no other (one that reset or left starts afresh).
    fn take_over(&mut self, _memory: BTreeMap<String, (Bytes, FusedMemory)>) {}
}
