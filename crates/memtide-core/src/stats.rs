//! Statistics as collected from a host and its guests, before any interpretation.
//!
//! Every value a guest reports is optional and untrusted: `None` means "not supplied"
//! (QEMU reports such stats as -1). Counters are cumulative; rates are derived by the
//! engine from its history.

use crate::units::Bytes;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The virtio-balloon statistics a guest reports through QEMU (`guest-stats`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GuestStats {
    /// Bytes swapped in since boot.
    pub swap_in: Option<Bytes>,
    /// Bytes swapped out since boot.
    pub swap_out: Option<Bytes>,
    /// Major page faults since boot.
    pub major_faults: Option<u64>,
    /// Minor page faults since boot.
    pub minor_faults: Option<u64>,
    /// Memory the guest is not using at all (MemFree).
    pub free: Option<Bytes>,
    /// Memory the guest sees in total (MemTotal, shrinks as the balloon inflates).
    pub total: Option<Bytes>,
    /// The guest's estimate of memory available without swapping (MemAvailable).
    pub available: Option<Bytes>,
    /// Page cache the guest could drop (Cached).
    pub disk_caches: Option<Bytes>,
    /// Successful hugetlb page allocations since boot.
    pub hugetlb_allocs: Option<u64>,
    /// Failed hugetlb page allocations since boot.
    pub hugetlb_failures: Option<u64>,
    /// OOM kills since boot (newer guest kernels and QEMUs).
    pub oom_kills: Option<u64>,
    /// Allocation stalls since boot (newer guest kernels and QEMUs).
    pub alloc_stalls: Option<u64>,
    /// Pages scanned by kswapd since boot (newer guest kernels and QEMUs).
    pub async_scans: Option<u64>,
    /// Pages scanned by direct reclaim since boot (newer guest kernels and QEMUs).
    pub direct_scans: Option<u64>,
    /// Pages reclaimed by kswapd since boot (newer guest kernels and QEMUs).
    pub async_reclaims: Option<u64>,
    /// Pages reclaimed by direct reclaim since boot (newer guest kernels and QEMUs).
    pub direct_reclaims: Option<u64>,
    /// Statistics this version of memtide does not know, by QEMU's name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub other: BTreeMap<String, u64>,
    /// Guest time (seconds) of the last stats update; `None` while the guest has sent none.
    pub last_update: Option<u64>,
}

impl GuestStats {
    /// True when the guest has not reported anything yet.
    pub fn is_empty(&self) -> bool {
        self.last_update.is_none() && *self == GuestStats::default()
    }
}

/// The host's /proc/meminfo, the fields memtide uses.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MemInfo {
    /// MemTotal.
    pub total: Bytes,
    /// MemFree.
    pub free: Bytes,
    /// MemAvailable (absent on very old kernels).
    pub available: Option<Bytes>,
    /// Buffers.
    pub buffers: Bytes,
    /// Cached.
    pub cached: Bytes,
    /// SwapTotal.
    pub swap_total: Bytes,
    /// SwapFree.
    pub swap_free: Bytes,
    /// AnonPages.
    pub anon_pages: Option<Bytes>,
    /// Committed_AS.
    pub committed_as: Option<Bytes>,
    /// Active(anon).
    pub active_anon: Option<Bytes>,
    /// Inactive(anon).
    pub inactive_anon: Option<Bytes>,
    /// Active(file).
    pub active_file: Option<Bytes>,
    /// Inactive(file).
    pub inactive_file: Option<Bytes>,
    /// Shmem (tmpfs and shared anonymous memory: not reclaimable without swap).
    pub shmem: Option<Bytes>,
    /// SUnreclaim (kernel slab that cannot be reclaimed).
    pub slab_unreclaimable: Option<Bytes>,
    /// SReclaimable (kernel slab the kernel frees under pressure: dentries, inodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slab_reclaimable: Option<Bytes>,
}

impl MemInfo {
    /// MOM's "freeable" memory: MemFree + Buffers + Cached.
    pub fn freeable(&self) -> Bytes {
        self.free + self.buffers + self.cached
    }
}

/// What a guest's own kernel reports, read through its guest agent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentStats {
    /// The guest's /proc/meminfo.
    pub meminfo: MemInfo,
    /// The guest's /proc/vmstat counters.
    pub vmstat: VmStat,
    /// The guest's /proc/pressure/memory (absent on kernels without PSI).
    pub psi: Option<Psi>,
    /// Its swap on zram devices, where it has any (/proc/swaps and their mm_stat).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zram: Option<ZramSwap>,
}

/// A guest's swap on zram (compressed RAM, as Fedora's guests swap by default), summed
/// over its devices: a page swapped there leaves its compressed copy in the guest's RAM,
/// so swapping frees less than it moves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ZramSwap {
    /// Their free swap (/proc/swaps: size less used).
    pub free: Bytes,
    /// What they store (mm_stat's `orig_data_size`).
    pub stored: Bytes,
    /// The memory they take for it (mm_stat's `mem_used_total`).
    pub used: Bytes,
}

impl ZramSwap {
    /// The memory a byte swapped to zram still takes where its devices store too little to
    /// tell (under [`Self::MEASURED_FROM`]): anonymous memory compresses 2-4:1 with lz4 or
    /// zstd, and not at all when it is already compressed or encrypted; half is the
    /// cautious end of the usual range.
    pub const ASSUMED_RATIO: f64 = 0.5;

    /// What its devices must store before their own ratio counts.
    pub const MEASURED_FROM: Bytes = Bytes::from_mib(16);

    /// The memory each byte swapped there takes, in [0, 1]: the devices' own ratio once
    /// they store enough, [`Self::ASSUMED_RATIO`] before.
    pub fn ratio(&self) -> f64 {
        if self.stored < Self::MEASURED_FROM {
            return Self::ASSUMED_RATIO;
        }
        (self.used.as_f64() / self.stored.as_f64()).clamp(0.0, 1.0)
    }
}

/// Cumulative counters from /proc/vmstat that memtide follows (`None`: not in this kernel).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct VmStat {
    /// Pages swapped in.
    pub pswpin: Option<u64>,
    /// Pages swapped out.
    pub pswpout: Option<u64>,
    /// Major faults.
    pub pgmajfault: Option<u64>,
    /// All page faults.
    pub pgfault: Option<u64>,
    /// Refaults of evicted anonymous pages.
    pub workingset_refault_anon: Option<u64>,
    /// Refaults of evicted file pages.
    pub workingset_refault_file: Option<u64>,
    /// OOM kills.
    pub oom_kill: Option<u64>,
    /// Direct-reclaim allocation stalls, summed over zones.
    pub allocstall: Option<u64>,
}

impl VmStat {
    /// Evicted pages faulted back, anonymous and file (the kernel has counted both apart
    /// since 5.9; `None` without the file count). Guest figures can be anything: the sum
    /// must not overflow (#18 defect 9).
    pub fn refaults(&self) -> Option<u64> {
        let anon = self.workingset_refault_anon.unwrap_or(0);
        Some(anon.saturating_add(self.workingset_refault_file?))
    }
}

/// One line of a PSI file: the share of time tasks stalled, and the total stall time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PsiLine {
    /// Percent of the last 10 s.
    pub avg10: f64,
    /// Percent of the last 60 s.
    pub avg60: f64,
    /// Percent of the last 300 s.
    pub avg300: f64,
    /// Total stall time in microseconds.
    pub total_us: u64,
}

/// Memory pressure stall information (/proc/pressure/memory or a cgroup's memory.pressure).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Psi {
    /// Some tasks stalled.
    pub some: PsiLine,
    /// All non-idle tasks stalled (absent in old kernels' system-wide file).
    pub full: Option<PsiLine>,
}

/// The kernel's KSM state (/sys/kernel/mm/ksm).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct KsmState {
    /// 0 stopped, 1 running, 2 stopped and unmerged.
    pub run: u64,
    /// Pages scanned per wake-up.
    pub pages_to_scan: u64,
    /// Sleep between wake-ups.
    pub sleep_millisecs: u64,
    /// Shared pages in use.
    pub pages_shared: u64,
    /// Sites sharing them (how much is saved).
    pub pages_sharing: u64,
    /// Unique pages checked repeatedly for merging.
    pub pages_unshared: u64,
    /// Pages changing too fast to be merged.
    pub pages_volatile: u64,
    /// Full scans completed.
    pub full_scans: u64,
    /// Merging across NUMA nodes (absent without NUMA).
    pub merge_across_nodes: Option<u64>,
    /// Bytes saved minus KSM's metadata cost (`general_profit`, Linux 6.4 and newer):
    /// the merged zero pages counted in, the rmap items of every page scanned taken out.
    pub general_profit: Option<i64>,
    /// Pages KSM merged with the kernel's zero page (`ksm_zero_pages`, with
    /// `use_zero_pages` on): saved as well, and not among `pages_sharing`.
    #[serde(default)]
    pub ksm_zero_pages: Option<u64>,
    /// The kernel's own tuner of `pages_to_scan`, when one is on (`advisor_mode`
    /// `scan-time`, Linux 6.8 and newer): the kernel refuses writes of that knob then.
    #[serde(default)]
    pub advisor: Option<String>,
}

/// Where the VMs' memory lives, and how full it is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DomainScope {
    /// The whole host.
    Host,
    /// A memory cgroup holding the VMs (e.g. machine.slice).
    Cgroup {
        /// Path of the cgroup directory.
        path: String,
        /// Cgroup hierarchy version (1 or 2).
        version: u8,
    },
}

/// The VM memory domain: the memory the VMs share, the whole host or a cgroup.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemoryDomain {
    /// Whole host or a cgroup.
    pub scope: DomainScope,
    /// Memory the domain may use: MemTotal, or the cgroup limit capped at MemTotal.
    pub total: Bytes,
    /// Memory charged to the domain.
    pub used: Bytes,
    /// Memory the domain could get back quickly: free plus its page cache.
    pub freeable: Bytes,
    /// Of `freeable`, what the kernel keeps free whatever the VMs do: on the whole host the
    /// zones' high watermarks (below them kswapd reclaims, host page cache first, then
    /// swap); none in a cgroup. Absent in recordings made before it was reported.
    #[serde(default)]
    pub kept_free: Bytes,
    /// Where the domain is a cgroup: the swap its cgroup may still use.
    /// Unknown in recordings made before it was reported.
    #[serde(default)]
    pub swap_room: SwapRoom,
}

/// The swap a cgroup domain may still use, as the swap limits of its cgroup, the cgroups
/// above it and those below it allow, and none where it would not swap at its limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SwapRoom {
    /// Not read (the whole host, or a recording made before it was reported).
    #[default]
    Unknown,
    /// No limit: the host's swap bounds it.
    Unlimited,
    /// The tightest limit's room: the limit less the swap charged under it.
    Left(Bytes),
}

impl MemoryDomain {
    /// Freeable memory as a fraction of the total (0 when the total is unknown).
    pub fn free_ratio(&self) -> f64 {
        if self.total == Bytes::ZERO {
            0.0
        } else {
            (self.freeable.as_f64() / self.total.as_f64()).clamp(0.0, 1.0)
        }
    }
}

/// Everything collected from the host in one tick.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostStats {
    /// /proc/meminfo.
    pub meminfo: MemInfo,
    /// /proc/vmstat counters.
    pub vmstat: VmStat,
    /// Memory pressure (of the domain's cgroup when it has one, else the host's).
    pub psi: Option<Psi>,
    /// KSM state; `None` when the kernel has no KSM.
    pub ksm: Option<KsmState>,
    /// The VM memory domain.
    pub domain: MemoryDomain,
    /// Of the host's free swap, what lies on zram devices: compressed RAM, not disk.
    /// Absent in recordings made before it was reported.
    #[serde(default)]
    pub swap_free_in_ram: Bytes,
    /// Other memory managers running on the host, which act on the same knobs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub other_managers: Vec<OtherManager>,
}

/// Another memory manager found running: a process of a known name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OtherManager {
    /// Its process name: `ksmtuned`, `momd` or `pvestatd`.
    pub name: String,
    /// Its process id.
    pub pid: u32,
}

impl OtherManager {
    /// The process names of the managers memtide knows (oVirt's MOM, ksmtuned, Proxmox
    /// VE's statistics daemon, which does its auto-ballooning).
    pub const KNOWN: [&'static str; 3] = ["ksmtuned", "momd", "pvestatd"];

    /// True for a manager that tunes KSM (memtide then leaves KSM to it).
    pub fn tunes_ksm(&self) -> bool {
        matches!(self.name.as_str(), "ksmtuned" | "momd")
    }

    /// True for a manager that sets balloon targets.
    pub fn sets_balloons(&self) -> bool {
        matches!(self.name.as_str(), "momd" | "pvestatd")
    }

    /// What it does that memtide does too.
    pub fn what(&self) -> &'static str {
        match self.name.as_str() {
            "ksmtuned" => "tunes KSM",
            "momd" => "sets balloon targets and tunes KSM (oVirt MOM)",
            _ => "sets balloon targets (Proxmox VE's auto-ballooning)",
        }
    }
}
