//! What the engine sees in one tick: the host and every known VM.

use crate::stats::{AgentStats, GuestStats, HostStats};
use crate::units::Bytes;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The bounds an operator put on a VM's memory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VmLimits {
    /// Never balloon the guest below this.
    pub min: Bytes,
    /// Never give the guest more than this (at most its configured size).
    pub max: Bytes,
    /// Relative weight when memory is divided between VMs.
    pub shares: u32,
}

/// Something the hypervisor told us about a VM between two samples.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum VmEvent {
    /// The guest reset: its driver starts afresh (QEMU keeps the balloon's target, which
    /// the driver inflates to again unless it is changed).
    Reset,
    /// The guest shut down.
    Shutdown,
    /// The guest was started again from its saved memory (a libvirt restore, as after a
    /// save that lets it run on): it goes on where it was, its balloon as it was; not a
    /// new boot.
    Restored,
    /// memtide saved the guest's memory, or tried to, since the last sample (a snapshot):
    /// its hypervisor's CPU time since then is partly the save's.
    Saved,
    /// The balloon reached a new size.
    BalloonChange {
        /// The guest's new logical size.
        actual: Bytes,
    },
}

/// One VM's state as its backend collected it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VmSample {
    /// Guest RAM size the VM was started with.
    pub configured: Bytes,
    /// The guest's current logical size (balloon `actual`); `None` without a balloon device.
    pub balloon: Option<Bytes>,
    /// Guest-reported statistics.
    pub stats: GuestStats,
    /// The guest's own /proc figures through its agent: `None` when it has no agent
    /// configured, an error when the agent did not answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<Result<AgentStats, String>>,
    /// Resident memory of the hypervisor process, when known.
    pub rss: Option<Bytes>,
    /// Memory of the hypervisor process the host swapped out (VmSwap), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swapped: Option<Bytes>,
    /// CPU time the hypervisor process has used, in seconds, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_s: Option<f64>,
    /// Guest memory the hypervisor saw touched since the previous sample (host-side
    /// access sampling), when enabled and possible.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub referenced: Option<Bytes>,
    /// Guest memory the host backs that the hypervisor saw untouched for at least the
    /// access tracker's cold age (host-side access tracking), when enabled and possible:
    /// memory the guest can give up at the cost of writing it out once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold: Option<Bytes>,
    /// The VM's virtio-mem device, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtio_mem: Option<VirtioMem>,
    /// The sizes of the hypervisor's mappings of guest RAM (its base memory's, each
    /// memory device's backend's), where the connector knows them (QMP); empty elsewhere.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ram_mappings: Vec<Bytes>,
    /// Freed guest pages go back to the host by themselves (the balloon's free page
    /// reporting): the hypervisor's resident memory, not the guest's size, is what it holds.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub free_page_reporting: bool,
    /// Memory the hypervisor process holds in a way no balloon gives back, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fixed: Option<FixedMemory>,
    /// Events since the previous sample.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<VmEvent>,
}

/// Memory of the hypervisor process that a balloon cannot give back to the host: pages
/// locked or pinned in RAM (QEMU's `-overcommit mem-lock=on`, a VFIO device's DMA
/// mappings), hugetlbfs pages (a guest page freed inside a huge page frees nothing) and
/// the hypervisor's own memory beside guest RAM.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FixedMemory {
    /// Locked or pinned (`VmLck`, `VmPin` of /proc/PID/status, the larger).
    pub locked: Bytes,
    /// Hugetlbfs pages mapped (`HugetlbPages`).
    pub hugetlb: Bytes,
    /// The hypervisor's own resident memory beside guest RAM (its heap, device memory,
    /// under TCG its translation cache: 30-75 MiB for this project's test guests), where
    /// its mappings tell the two apart: its RSS less this is the guest memory it backs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub own: Option<Bytes>,
}

/// A virtio-mem device: memory plugged into the guest in blocks, beyond its base memory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VirtioMem {
    /// Memory plugged now.
    pub plugged: Bytes,
    /// Memory asked for.
    pub requested: Bytes,
    /// The most that can be plugged.
    pub max: Bytes,
    /// Plugged memory the guest does not use because it never onlined it (a guest
    /// kernel without `memhp_default_state=online_movable`), when measurable.
    pub offline: Option<Bytes>,
}

/// Why a VM could not be sampled this tick.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", content = "message", rename_all = "snake_case")]
pub enum BackendError {
    /// The hypervisor did not answer in time (hung or overloaded).
    #[error("no answer within {0} ms")]
    Timeout(u64),
    /// The connection is gone.
    #[error("disconnected: {0}")]
    Disconnected(String),
    /// The connection is gone after the hypervisor announced a shutdown (a guest
    /// poweroff, a `quit`, a SIGTERM): the VM was stopped, it did not crash.
    #[error("shut down: {0}")]
    ShutDown(String),
    /// The hypervisor answered with an error or something we could not understand.
    #[error("{0}")]
    Protocol(String),
    /// A local file or socket operation failed.
    #[error("{0}")]
    Io(String),
    /// The hypervisor is busy with the VM (e.g. migrating it); it is left alone meanwhile.
    #[error("busy: {0}")]
    Busy(String),
    /// memtide leaves the VM alone on purpose: another manager owns its balloon (Proxmox
    /// VE's auto-ballooning). Not a fault of the VM's.
    #[error("left alone: {0}")]
    LeftAlone(String),
}

impl BackendError {
    /// A timeout error for the given limit.
    pub fn timeout(limit: Duration) -> Self {
        BackendError::Timeout(limit.as_millis() as u64)
    }
}

/// One VM as the engine sees it in a tick.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VmSnapshot {
    /// The VM's name (unique on the host).
    pub name: String,
    /// Operator bounds.
    pub limits: VmLimits,
    /// The last balloon target the backend delivered, if any since it connected or the guest reset.
    pub target: Option<Bytes>,
    /// The sample, or why there is none.
    pub sample: Result<VmSample, BackendError>,
}

/// Everything collected in one tick.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Time on the injected monotonic clock.
    #[serde(with = "crate::serde_secs")]
    pub at: Duration,
    /// Host statistics.
    pub host: HostStats,
    /// Every VM currently connected, in a stable order.
    pub vms: Vec<VmSnapshot>,
}
