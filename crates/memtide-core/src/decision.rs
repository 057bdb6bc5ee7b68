//! The outcome of one tick: actions, and an explanation of every VM and of the host.

use crate::action::{Action, Reason};
use crate::need::Need;
use crate::snapshot::BackendError;
use crate::stats::{DomainScope, KsmState};
use crate::units::Bytes;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// What kind of problem a diagnostic reports (stable names for metrics and logs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DiagnosticKind {
    /// The VM could not be sampled (timeout, disconnect, protocol error).
    Unreachable,
    /// The VM was not sampled because its hypervisor holds it (a save, a migration, a
    /// pause): left alone meanwhile, as it should be.
    Busy,
    /// The VM has no balloon device; it cannot be resized.
    NoBalloon,
    /// The guest reported statistics that cannot be true; they were ignored.
    ImplausibleStats,
    /// The policy failed for this VM (or for all VMs).
    PolicyError,
    /// A balloon target was not reached in time.
    TargetNotReached,
    /// The hypervisor holds far more than the balloon size the guest reports: the guest
    /// keeps memory it claims to have given back. Its balloon is released and it is no
    /// longer managed.
    UndeliveredBalloon,
    /// Memory was divided, and the guest's own figures claimed more than its fair share
    /// and than the host saw it use: the excess was not honoured.
    UnbackedClaim,
    /// The VM's guest agent did not answer; its /proc figures are missing.
    AgentUnavailable,
    /// virtio-mem memory is plugged but the guest never onlined it.
    MemoryNotOnlined,
    /// The guest reset: its balloon is given back in full while it boots.
    GuestReset,
    /// The guest shut down.
    GuestShutdown,
    /// The VM's memory changed while it ran (a memory device plugged or removed).
    MemoryResized,
    /// Another memory manager runs on the host and acts on the same knobs.
    OtherManager,
    /// The guest's memory is locked, pinned or in huge pages: a balloon frees nothing.
    FixedMemory,
}

impl DiagnosticKind {
    /// True for conditions that hold tick after tick until they clear (an unreachable VM);
    /// false for one-off happenings (a guest reset), reported in the tick they occur.
    pub fn is_condition(self) -> bool {
        matches!(
            self,
            DiagnosticKind::Unreachable
                | DiagnosticKind::Busy
                | DiagnosticKind::AgentUnavailable
                | DiagnosticKind::MemoryNotOnlined
                | DiagnosticKind::NoBalloon
                | DiagnosticKind::ImplausibleStats
                | DiagnosticKind::PolicyError
                | DiagnosticKind::UndeliveredBalloon
                | DiagnosticKind::UnbackedClaim
                | DiagnosticKind::OtherManager
                | DiagnosticKind::FixedMemory
        )
    }

    /// The stable snake_case name, as in JSON and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            DiagnosticKind::Unreachable => "unreachable",
            DiagnosticKind::Busy => "busy",
            DiagnosticKind::NoBalloon => "no_balloon",
            DiagnosticKind::ImplausibleStats => "implausible_stats",
            DiagnosticKind::PolicyError => "policy_error",
            DiagnosticKind::TargetNotReached => "target_not_reached",
            DiagnosticKind::UndeliveredBalloon => "undelivered_balloon",
            DiagnosticKind::UnbackedClaim => "unbacked_claim",
            DiagnosticKind::AgentUnavailable => "agent_unavailable",
            DiagnosticKind::MemoryNotOnlined => "memory_not_onlined",
            DiagnosticKind::GuestReset => "guest_reset",
            DiagnosticKind::GuestShutdown => "guest_shutdown",
            DiagnosticKind::MemoryResized => "memory_resized",
            DiagnosticKind::OtherManager => "other_manager",
            DiagnosticKind::FixedMemory => "fixed_memory",
        }
    }
}

/// A problem found while deciding, attached to a VM or to the host.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Diagnostic {
    /// The VM concerned, if any.
    pub vm: Option<String>,
    /// What kind of problem.
    pub kind: DiagnosticKind,
    /// A sentence for the operator.
    pub message: String,
}

/// A VM's state this tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VmState {
    /// Sampled and managed.
    Managed,
    /// Sampled, but not managed: it has no balloon device, keeps the memory its balloon
    /// claims to have given back, or has memory no balloon frees (locked, pinned, huge
    /// pages).
    Unmanaged,
    /// Not sampled this tick.
    Unreachable,
    /// Not sampled this tick, its hypervisor holding it (a save, a migration, a pause).
    Busy,
}

impl VmState {
    /// Its name, as status, metrics and the live view show it.
    pub fn name(self) -> &'static str {
        match self {
            VmState::Managed => "managed",
            VmState::Unmanaged => "unmanaged",
            VmState::Unreachable => "unreachable",
            VmState::Busy => "busy",
        }
    }
}

/// One VM's line in the decision: its numbers, and what was decided and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VmReport {
    /// The VM's name.
    pub name: String,
    /// Managed, unmanaged, unreachable or busy.
    pub state: VmState,
    /// Why it is unreachable or busy, when it is.
    pub error: Option<BackendError>,
    /// Guest RAM size it was started with.
    pub configured: Option<Bytes>,
    /// Current logical size (balloon actual).
    pub actual: Option<Bytes>,
    /// The target in force after this tick.
    pub target: Option<Bytes>,
    /// Operator minimum.
    pub min: Bytes,
    /// Operator maximum.
    pub max: Bytes,
    /// Guest MemFree.
    pub guest_free: Option<Bytes>,
    /// Guest MemAvailable.
    pub guest_available: Option<Bytes>,
    /// Memory the guest uses (size minus free).
    pub used: Option<Bytes>,
    /// The working set the policy estimated.
    pub estimate: Option<Bytes>,
    /// Committed_AS (through the guest agent).
    pub committed_as: Option<Bytes>,
    /// Evicted pages faulted back per second (refaults with the agent, major faults without).
    pub refaults_per_s: Option<f64>,
    /// The guest's memory PSI, `some` over 10 s (percent).
    pub guest_psi_some_avg10: Option<f64>,
    /// Major faults per second.
    pub major_faults_per_s: Option<f64>,
    /// Bytes swapped in per second.
    pub swap_in_per_s: Option<f64>,
    /// Bytes swapped out per second.
    pub swap_out_per_s: Option<f64>,
    /// Resident memory of the hypervisor process.
    pub rss: Option<Bytes>,
    /// The hypervisor's own resident memory beside guest RAM, where told apart
    /// ([`crate::FixedMemory::own`]): `rss` less it is the guest memory the host backs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hypervisor_own: Option<Bytes>,
    /// Memory of the hypervisor process the host swapped out (its VmSwap): guest memory
    /// the guest touched that the host no longer holds in RAM, beside `rss`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_swapped: Option<Bytes>,
    /// The guest's swap on zram, as its agent reports it (the guest's word): free, stored
    /// and the memory it takes for what it stores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_zram: Option<crate::stats::ZramSwap>,
    /// Memory plugged through virtio-mem.
    pub plugged: Option<Bytes>,
    /// Freed guest pages return to the host by themselves (free page reporting).
    /// Absent in recordings made before it was reported.
    #[serde(default)]
    pub free_page_reporting: bool,
    /// What was decided for this VM and why (a new target, or why it holds).
    pub reason: Option<Reason>,
    /// The guest's cumulative counters as it last reported them. Absent in recordings
    /// made before they were reported.
    #[serde(default, skip_serializing_if = "GuestTotals::is_empty")]
    pub totals: GuestTotals,
}

/// A guest's cumulative counters since it booted, as it reports them (they start
/// again from zero when the guest reboots).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GuestTotals {
    /// Bytes swapped in.
    pub swapped_in: Option<Bytes>,
    /// Bytes swapped out.
    pub swapped_out: Option<Bytes>,
    /// Major page faults.
    pub major_faults: Option<u64>,
    /// Evicted pages faulted back (workingset refaults, through the guest agent).
    pub refaults: Option<u64>,
}

impl GuestTotals {
    /// Nothing reported.
    pub fn is_empty(&self) -> bool {
        *self == GuestTotals::default()
    }
}

/// The host's line in the decision.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostReport {
    /// What the VM memory domain is (the host or a cgroup).
    pub scope: DomainScope,
    /// Memory of the VM memory domain.
    pub total: Bytes,
    /// Freeable memory of the domain now.
    pub freeable: Bytes,
    /// Freeable share now.
    pub free_ratio: f64,
    /// Freeable share averaged over the history: the mean of each sample's share.
    pub free_ratio_avg: f64,
    /// Memory PSI, `some` line, 10 s average (percent).
    pub psi_some_avg10: Option<f64>,
    /// Pages swapped in per second on the host.
    pub swap_in_per_s: Option<f64>,
    /// Pages swapped out per second on the host.
    pub swap_out_per_s: Option<f64>,
    /// Pages swapped in on the host since it booted. Absent in older recordings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swapped_in_pages: Option<u64>,
    /// Pages swapped out on the host since it booted. Absent in older recordings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swapped_out_pages: Option<u64>,
    /// KSM state as read this tick.
    pub ksm: Option<KsmState>,
    /// What was decided for KSM and why.
    pub ksm_reason: Option<Reason>,
    /// The host's need for memory as the policy weighed it (memtide's own; absent for
    /// other policies and in older recordings).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub need: Option<Need>,
}

/// The result of `Engine::tick`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// Time of the tick.
    #[serde(with = "crate::serde_secs")]
    pub at: Duration,
    /// The policy that decided.
    pub policy: String,
    /// The host.
    pub host: HostReport,
    /// Every VM in the snapshot, in its order.
    pub vms: Vec<VmReport>,
    /// What to do.
    pub actions: Vec<Action>,
    /// Problems found.
    pub diagnostics: Vec<Diagnostic>,
}
