//! Scenario files (TOML): the host, the costs of faults, the VMs and their workloads.
//! Every field, its unit and its default are documented in `docs/simulator.md`.

use crate::workload::{WorkloadSpec, ABOVE_ZERO};
use memtide_core::tiering::age::AgeConfig;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// Why a scenario could not be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScenarioError {
    /// Not valid TOML, or a field of the wrong type, missing or unknown.
    #[error("scenario: {0}")]
    Parse(String),
    /// A field whose value cannot work.
    #[error("scenario: {field}: {message}")]
    Invalid {
        /// The field, as a path (`vm[2].workload.anon.period_s`).
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// No built-in scenario has this name.
    #[error("no built-in scenario {0:?} (built in: {1})")]
    UnknownBuiltin(String, String),
}

/// A simulation to run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Name, shown in reports.
    pub name: String,
    /// What the scenario shows.
    #[serde(default)]
    pub description: String,
    /// Number of ticks (engine decisions).
    #[serde(default = "default_ticks")]
    pub ticks: u64,
    /// Simulated seconds per tick.
    #[serde(default = "default_tick_s")]
    pub tick_s: f64,
    /// Seed used when the run names none.
    #[serde(default)]
    pub seed: u64,
    /// The host.
    pub host: HostSpec,
    /// What faults cost.
    #[serde(default)]
    pub costs: Costs,
    /// The VMs (`[[vm]]` tables); in a density run, the arrival queue, in order.
    #[serde(rename = "vm")]
    pub vms: Vec<VmSpec>,
    /// Admission settings of the density benchmark (`memtide sim --density`).
    #[serde(default)]
    pub density: Option<DensitySpec>,
    /// A two-tier host: part of its memory is a slower tier (see [`crate::tiers`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tiers: Option<TierSpec>,
}

/// How guest pages are placed between the fast and the slow tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TierPlacement {
    /// memtide's per-VM placement (`memtide_core::tiering`): fast budgets from each VM's
    /// hot set and shares, cold memory demoted, hot memory promoted, rate-limited.
    Memtide,
    /// The kernel's default with no per-VM knowledge: a page is placed where it is first
    /// backed, in the fast tier while it has free memory, and never moved.
    FirstTouch,
}

impl TierPlacement {
    /// The name used in scenario files and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            TierPlacement::Memtide => "memtide",
            TierPlacement::FirstTouch => "first-touch",
        }
    }
}

impl std::str::FromStr for TierPlacement {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        [TierPlacement::Memtide, TierPlacement::FirstTouch]
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| format!("no tier placement {s:?} (memtide, first-touch)"))
    }
}

/// A two-tier host: `fast_mib` of the host's memory is DRAM, the rest a slower tier.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierSpec {
    /// Fast memory (DRAM), the host's own memory (`host.reserved_mib`) included (MiB);
    /// the rest of `host.memory_mib` is the slow tier.
    pub fast_mib: f64,
    /// Slow-tier access latency over DRAM's (CXL memory: about 2).
    #[serde(default = "default_latency_factor")]
    pub latency_factor: f64,
    /// How pages are placed.
    #[serde(default = "default_placement")]
    pub placement: TierPlacement,
    /// memtide's placement: most memory moved per VM per second (MiB/s).
    #[serde(default = "default_tier_rate_mib_s")]
    pub rate_mib_s: f64,
    /// memtide's placement: fast memory given above a hot set (% of it).
    #[serde(default = "default_margin_pct")]
    pub margin_pct: f64,
    /// memtide's placement: fast memory kept free (MiB).
    #[serde(default)]
    pub reserve_mib: f64,
    /// memtide's placement: how long memory in use must go untouched before it is demoted
    /// (s; 0: whatever is idle now).
    #[serde(default = "default_cold_age_s")]
    pub cold_age_s: f64,
    /// memtide's placement: adapt each VM's cold age to its own promotions, from
    /// `cold_age_s` up to `max_cold_age_s` (else every VM keeps `cold_age_s`).
    #[serde(default = "default_adaptive_age")]
    pub adaptive_age: bool,
    /// memtide's placement: the longest adaptive cold age (s).
    #[serde(default = "default_max_cold_age_s")]
    pub max_cold_age_s: f64,
    /// memtide's placement: the promotion SLO the adaptive age keeps to (% of the working
    /// set a minute).
    #[serde(default = "default_promotion_slo_pct_per_min")]
    pub promotion_slo_pct_per_min: f64,
}

impl TierSpec {
    /// memtide's cold-age settings.
    pub fn age_config(&self) -> AgeConfig {
        AgeConfig {
            adaptive: self.adaptive_age,
            min_s: self.cold_age_s,
            max_s: self.max_cold_age_s,
            slo_pct_per_min: self.promotion_slo_pct_per_min,
        }
    }
}

fn default_cold_age_s() -> f64 {
    AgeConfig::default().min_s
}

fn default_adaptive_age() -> bool {
    AgeConfig::default().adaptive
}

fn default_max_cold_age_s() -> f64 {
    AgeConfig::default().max_s
}

fn default_promotion_slo_pct_per_min() -> f64 {
    AgeConfig::default().slo_pct_per_min
}

fn default_latency_factor() -> f64 {
    2.0
}

fn default_placement() -> TierPlacement {
    TierPlacement::Memtide
}

fn default_tier_rate_mib_s() -> f64 {
    256.0
}

fn default_margin_pct() -> f64 {
    10.0
}

/// How VMs arrive and are admitted in the density benchmark (see [`crate::density`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DensitySpec {
    /// Time between two VMs' arrivals in the queue (s).
    pub arrive_every_s: f64,
    /// Least time between two admissions, for the host to settle (s).
    pub settle_s: f64,
    /// The reserves tried, as shares of the domain (%).
    pub reserves_pct: Vec<f64>,
    /// The window over which a VM's throughput is compared with its solo run (s).
    pub window_s: f64,
}

impl Default for DensitySpec {
    fn default() -> Self {
        DensitySpec {
            arrive_every_s: 30.0,
            settle_s: 60.0,
            reserves_pct: vec![2.0, 5.0, 7.5, 10.0, 12.5, 15.0, 20.0, 30.0],
            window_s: 60.0,
        }
    }
}

fn default_ticks() -> u64 {
    3600
}

fn default_tick_s() -> f64 {
    1.0
}

/// The host's memory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostSpec {
    /// Machine memory (MiB), the VM memory domain.
    pub memory_mib: f64,
    /// Memory the host itself uses (kernel, QEMU processes' own memory), never given to guests (MiB).
    #[serde(default = "default_reserved_mib")]
    pub reserved_mib: f64,
    /// Host swap (MiB); 0 means none, and the host kills a VM when memory runs out.
    #[serde(default)]
    pub swap_mib: f64,
    /// The host reclaims (drops its page cache, then swaps) to keep this much free (MiB).
    #[serde(default = "default_min_free_mib")]
    pub min_free_mib: f64,
    /// Host page cache (disk images, logs) that fills otherwise free memory up to this size,
    /// and is dropped first under pressure (MiB).
    #[serde(default)]
    pub cache_mib: f64,
    /// Whether the host kernel has KSM.
    #[serde(default = "default_true")]
    pub ksm: bool,
    /// Whether the balloon devices have virtio-balloon's deflate-on-oom (the guest takes
    /// balloon pages back before its OOM killer runs). Off by default: a policy must not
    /// depend on it.
    #[serde(default)]
    pub deflate_on_oom: bool,
    /// Whether the balloon devices have virtio-balloon's free page reporting (memory a
    /// guest has kept free for 2 s goes back to the host by itself, as KubeVirt configures
    /// its VMs by default).
    #[serde(default)]
    pub free_page_reporting: bool,
}

fn default_reserved_mib() -> f64 {
    512.0
}

fn default_min_free_mib() -> f64 {
    128.0
}

fn default_true() -> bool {
    true
}

/// What memory events cost the workload, per 4 KiB page, and how fast balloons move.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Costs {
    /// A guest swap-in: the guest reads a page back from its swap device (µs).
    pub guest_swap_in_us: f64,
    /// A guest swap-in from zram: a fault and a page decompressed, no I/O (µs).
    pub zram_swap_in_us: f64,
    /// A host swap-in: the vCPU touches a page the host swapped out; the host reads it
    /// back while the vCPU waits (µs).
    pub host_swap_in_us: f64,
    /// A page-cache miss: the guest reads a file page from its disk (µs).
    pub file_read_us: f64,
    /// A first touch of fresh anonymous memory in the guest (zero-fill fault) (µs).
    pub minor_fault_us: f64,
    /// A guest page the host does not back yet is touched: the host allocates and zeroes
    /// a page (EPT violation) (µs).
    pub host_fault_us: f64,
    /// How fast a balloon inflates or deflates (MiB/s).
    pub balloon_mib_s: f64,
}

impl Default for Costs {
    fn default() -> Self {
        Costs {
            guest_swap_in_us: 100.0,
            // Assumed: about four times the 1.3 µs a page the author of "mm, swap: skip
            // swapcache for swapin of synchronous device" (Minchan Kim, 2017) measured
            // swapping 5 GiB in from lz4 zram, sequentially and without readahead, in
            // 1.64 s; random faults were not measured.
            zram_swap_in_us: 5.0,
            host_swap_in_us: 100.0,
            file_read_us: 100.0,
            minor_fault_us: 1.0,
            host_fault_us: 2.0,
            balloon_mib_s: 512.0,
        }
    }
}

/// One VM, or a group of identical VMs (`count`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmSpec {
    /// Name; with `count` > 1, VMs are named `NAME-01`, `NAME-02`, …
    pub name: String,
    /// Number of VMs with this description.
    #[serde(default = "default_count")]
    pub count: u32,
    /// Configured guest RAM (MiB).
    pub memory_mib: f64,
    /// Operator minimum: never balloon below (MiB); defaults to the kernel's memory plus 64 MiB.
    #[serde(default)]
    pub min_mib: Option<f64>,
    /// Operator maximum (MiB); defaults to `memory_mib`.
    #[serde(default)]
    pub max_mib: Option<f64>,
    /// Relative weight when memory is divided.
    #[serde(default = "default_shares")]
    pub shares: u32,
    /// Guest swap (MiB).
    #[serde(default = "default_swap_mib")]
    pub swap_mib: f64,
    /// The guest swaps to zram (compressed RAM, as Fedora's guests do by default): the
    /// share of each swapped page its compressed copy keeps in the guest's RAM (%).
    /// Absent: its swap is a disk's.
    #[serde(default)]
    pub zram_pct: Option<f64>,
    /// Memory the guest kernel and its services use and never free (MiB).
    #[serde(default = "default_kernel_mib")]
    pub kernel_mib: f64,
    /// Memory its programs have committed and never touch (MiB): thread stacks, heaps
    /// reserved up front. Counted in its Committed_AS, as Linux counts it; it holds no
    /// page.
    #[serde(default)]
    pub untouched_commit_mib: f64,
    /// Share of the kernel's pages identical across guests of the same OS (%).
    #[serde(default = "default_kernel_shareable_pct")]
    pub kernel_shareable_pct: f64,
    /// Whether the VM has a balloon device.
    #[serde(default = "default_true")]
    pub balloon: bool,
    /// The balloon's target at boot (MiB), as earlier management left it: the guest
    /// starts ballooned to it. Default: its configured size.
    #[serde(default)]
    pub start_mib: Option<f64>,
    /// Whether the guest runs an agent reporting its /proc/meminfo, /proc/vmstat and PSI.
    #[serde(default = "default_true")]
    pub agent: bool,
    /// The operator's fast-memory budget on a two-tier host (MiB), in place of one
    /// derived from the VM's hot set.
    #[serde(default)]
    pub fast_mib: Option<f64>,
    /// What runs in the guest.
    #[serde(default)]
    pub workload: WorkloadSpec,
    /// How the guest misreports its memory, if it is hostile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lie: Option<crate::lie::Lie>,
}

/// The largest size a scenario may give (MiB): 1 PiB, so that no sum of sizes in pages
/// overflows.
const MAX_MIB: f64 = (1u64 << 30) as f64;

/// What a size must be.
const SIZE: &str = "must be a size ≥ 0, at most 1 PiB (1073741824 MiB)";

/// The longest tick (s): a day.
const MAX_TICK_S: f64 = 86_400.0;

/// The longest run (s), ticks × tick_s: about three years. Within it a workload's clock
/// still moves by its shortest step ([`crate::workload::MIN_STEP_S`], and a thousandth
/// of a tick: a walk's or a hold's steps are counted one by one): an audit's walk
/// stepping every 1e-300 s never reached the next tick, and a tick of 1e300 s panicked.
const MAX_RUN_S: f64 = 1e8;

/// The most VMs a scenario may hold: the host's OOM killer looks at every VM for each
/// kill, so a host far too small for 100 000 VMs took minutes a tick.
const MAX_VMS: u64 = 10_000;

fn default_count() -> u32 {
    1
}

fn default_shares() -> u32 {
    1000
}

fn default_swap_mib() -> f64 {
    1024.0
}

fn default_kernel_mib() -> f64 {
    128.0
}

fn default_kernel_shareable_pct() -> f64 {
    50.0
}

impl VmSpec {
    /// The operator minimum (MiB).
    pub fn min_mib(&self) -> f64 {
        self.min_mib.unwrap_or(self.kernel_mib + 64.0)
    }

    /// The operator maximum (MiB).
    pub fn max_mib(&self) -> f64 {
        self.max_mib.unwrap_or(self.memory_mib)
    }
}

/// The built-in scenarios: name and TOML text.
const BUILTIN: [(&str, &str); 11] = [
    ("memknobs-32", include_str!("../scenarios/memknobs-32.toml")),
    ("mixed-8", include_str!("../scenarios/mixed-8.toml")),
    ("quick", include_str!("../scenarios/quick.toml")),
    ("fleet-1000", include_str!("../scenarios/fleet-1000.toml")),
    (
        "no-overcommit",
        include_str!("../scenarios/no-overcommit.toml"),
    ),
    ("burst", include_str!("../scenarios/burst.toml")),
    ("cloud-mix", include_str!("../scenarios/cloud-mix.toml")),
    ("small-vms", include_str!("../scenarios/small-vms.toml")),
    ("periodic", include_str!("../scenarios/periodic.toml")),
    ("density", include_str!("../scenarios/density.toml")),
    (
        "tiered-redis",
        include_str!("../scenarios/tiered-redis.toml"),
    ),
];

impl Scenario {
    /// Parse and check a scenario file.
    pub fn from_toml(text: &str) -> Result<Scenario, ScenarioError> {
        let scenario: Scenario =
            toml::from_str(text).map_err(|e| ScenarioError::Parse(e.to_string()))?;
        scenario.validate()?;
        Ok(scenario)
    }

    /// A built-in scenario by name.
    pub fn builtin(name: &str) -> Result<Scenario, ScenarioError> {
        let (_, text) = BUILTIN.iter().find(|(n, _)| *n == name).ok_or_else(|| {
            ScenarioError::UnknownBuiltin(name.to_string(), Self::builtin_names().join(", "))
        })?;
        Scenario::from_toml(text)
    }

    /// The names of the built-in scenarios.
    pub fn builtin_names() -> Vec<&'static str> {
        BUILTIN.iter().map(|(n, _)| *n).collect()
    }

    /// Make the host two-tier with `share` of its memory fast (the host's own memory
    /// included), keeping the scenario's other tier settings if it has them.
    pub fn set_fast_share(&mut self, share: f64) -> Result<(), ScenarioError> {
        let fast_mib = (share * self.host.memory_mib).round();
        self.tiers = Some(match self.tiers.take() {
            Some(t) => TierSpec { fast_mib, ..t },
            None => TierSpec {
                fast_mib,
                latency_factor: default_latency_factor(),
                placement: default_placement(),
                rate_mib_s: default_tier_rate_mib_s(),
                margin_pct: default_margin_pct(),
                reserve_mib: 0.0,
                cold_age_s: default_cold_age_s(),
                adaptive_age: default_adaptive_age(),
                max_cold_age_s: default_max_cold_age_s(),
                promotion_slo_pct_per_min: default_promotion_slo_pct_per_min(),
            },
        });
        self.validate()
    }

    /// Every VM, groups expanded: its name and description, in file order.
    pub fn expand(&self) -> Vec<(String, &VmSpec)> {
        let mut out = Vec::new();
        for spec in &self.vms {
            if spec.count == 1 {
                out.push((spec.name.clone(), spec));
            } else {
                let width = spec.count.to_string().len().max(2);
                for i in 1..=spec.count {
                    out.push((format!("{}-{i:0width$}", spec.name), spec));
                }
            }
        }
        out
    }

    /// Check every value, naming the first bad field.
    pub fn validate(&self) -> Result<(), ScenarioError> {
        let invalid = |field: String, message: &str| ScenarioError::Invalid {
            field,
            message: message.to_string(),
        };
        let positive = |v: f64| v.is_finite() && v > 0.0;
        let size = |v: f64| v.is_finite() && v >= 0.0;
        let mib = |v: f64| size(v) && v <= MAX_MIB;
        let pct = |v: f64| (0.0..=100.0).contains(&v);
        if self.ticks == 0 {
            return Err(invalid("ticks".into(), "must be at least 1"));
        }
        if !(positive(self.tick_s) && self.tick_s <= MAX_TICK_S) {
            return Err(invalid(
                "tick_s".into(),
                "must be a number of seconds above 0, at most 86400",
            ));
        }
        if self.ticks as f64 * self.tick_s > MAX_RUN_S {
            return Err(invalid(
                "ticks".into(),
                &format!(
                    "{} ticks of {} s run longer than {MAX_RUN_S} s (about three years)",
                    self.ticks, self.tick_s
                ),
            ));
        }
        let h = &self.host;
        for (name, v) in [
            ("reserved_mib", h.reserved_mib),
            ("swap_mib", h.swap_mib),
            ("min_free_mib", h.min_free_mib),
            ("cache_mib", h.cache_mib),
        ] {
            if !mib(v) {
                return Err(invalid(format!("host.{name}"), SIZE));
            }
        }
        if !(mib(h.memory_mib) && h.memory_mib > h.reserved_mib + h.min_free_mib) {
            return Err(invalid(
                "host.memory_mib".into(),
                "must be a size above reserved_mib + min_free_mib, at most 1 PiB",
            ));
        }
        let c = &self.costs;
        for (name, v) in [
            ("guest_swap_in_us", c.guest_swap_in_us),
            ("zram_swap_in_us", c.zram_swap_in_us),
            ("host_swap_in_us", c.host_swap_in_us),
            ("file_read_us", c.file_read_us),
            ("minor_fault_us", c.minor_fault_us),
            ("host_fault_us", c.host_fault_us),
        ] {
            if !size(v) {
                return Err(invalid(format!("costs.{name}"), "must be a time ≥ 0"));
            }
        }
        if !positive(c.balloon_mib_s) {
            return Err(invalid("costs.balloon_mib_s".into(), ABOVE_ZERO));
        }
        if self.vms.is_empty() {
            return Err(invalid("vm".into(), "needs at least one VM"));
        }
        let vms: u64 = self.vms.iter().map(|vm| u64::from(vm.count)).sum();
        if vms > MAX_VMS {
            return Err(invalid(
                "vm".into(),
                "at most 10000 VMs in all (counts included)",
            ));
        }
        let mut names = BTreeSet::new();
        for (i, vm) in self.vms.iter().enumerate() {
            let at = |f: &str| format!("vm[{i}].{f}");
            if vm.name.is_empty() {
                return Err(invalid(at("name"), "must not be empty"));
            }
            if vm.count == 0 {
                return Err(invalid(at("count"), "must be at least 1"));
            }
            // As the daemon's configuration says: a weight of 0 would give the VM no
            // share of memory divided beyond the minimums.
            if vm.shares == 0 {
                return Err(invalid(at("shares"), "must be at least 1"));
            }
            if !(mib(vm.memory_mib) && vm.memory_mib > vm.kernel_mib) {
                return Err(invalid(
                    at("memory_mib"),
                    "must be a size above kernel_mib, at most 1 PiB",
                ));
            }
            if !mib(vm.kernel_mib) {
                return Err(invalid(at("kernel_mib"), SIZE));
            }
            if !mib(vm.swap_mib) {
                return Err(invalid(at("swap_mib"), SIZE));
            }
            if vm.zram_pct.is_some_and(|z| !(z > 0.0 && z <= 100.0)) {
                return Err(invalid(at("zram_pct"), "must be above 0 and at most 100"));
            }
            if !mib(vm.untouched_commit_mib) {
                return Err(invalid(at("untouched_commit_mib"), SIZE));
            }
            if !(size(vm.min_mib()) && vm.min_mib() <= vm.memory_mib) {
                return Err(invalid(at("min_mib"), "must be between 0 and memory_mib"));
            }
            if !(vm.max_mib() >= vm.min_mib() && vm.max_mib() <= vm.memory_mib) {
                return Err(invalid(
                    at("max_mib"),
                    "must be between min_mib and memory_mib",
                ));
            }
            if let Some(start) = vm.start_mib {
                if !(start > vm.kernel_mib && start <= vm.memory_mib) {
                    return Err(invalid(
                        at("start_mib"),
                        "must exceed kernel_mib and be at most memory_mib",
                    ));
                }
                if !vm.balloon {
                    return Err(invalid(at("start_mib"), "needs a balloon"));
                }
            }
            if vm.lie == Some(crate::lie::Lie::NowAndThen) && self.tick_s > 1.0 {
                return Err(invalid(
                    at("lie"),
                    "now_and_then tells the truth for one second in 20: needs tick_s ≤ 1",
                ));
            }
            if !pct(vm.kernel_shareable_pct) {
                return Err(invalid(at("kernel_shareable_pct"), "must be 0 to 100"));
            }
            if let Some(fast) = vm.fast_mib {
                if !(size(fast) && fast <= vm.memory_mib) {
                    return Err(invalid(at("fast_mib"), "must be between 0 and memory_mib"));
                }
            }
            let w = &vm.workload;
            if !positive(w.base_mib_s) {
                return Err(invalid(at("workload.base_mib_s"), ABOVE_ZERO));
            }
            for (name, v) in [
                ("hot_pct", w.hot_pct),
                ("hot_access_pct", w.hot_access_pct),
                ("shareable_pct", w.shareable_pct),
                ("memory_bound_pct", w.memory_bound_pct),
            ] {
                if !pct(v) {
                    return Err(invalid(at(&format!("workload.{name}")), "must be 0 to 100"));
                }
            }
            if w.hot_pct == 0.0 {
                return Err(invalid(at("workload.hot_pct"), "must be above 0"));
            }
            for (name, v) in [
                ("idle_mib", w.idle_mib),
                ("idle_at_s", w.idle_at_s),
                ("heap_mib", w.heap_mib),
                ("hold_s", w.hold_s),
                ("oom_restart_s", w.oom_restart_s),
            ] {
                if !size(v) {
                    return Err(invalid(at(&format!("workload.{name}")), "must be ≥ 0"));
                }
            }
            // A hold's steps are counted one by one, as a walk's: a thousand a tick at most.
            let least_step = crate::workload::MIN_STEP_S.max(self.tick_s / 1000.0);
            if w.hold_s > 0.0 && w.hold_s < least_step {
                return Err(invalid(
                    at("workload.hold_s"),
                    "must be 0 (no hold) or at least 0.001 s and a thousandth of tick_s",
                ));
            }
            w.anon
                .validate(&at("workload.anon"), self.tick_s)
                .and_then(|()| w.file.validate(&at("workload.file"), self.tick_s))
                .map_err(|(field, message)| ScenarioError::Invalid { field, message })?;
        }
        for (name, _) in self.expand() {
            if !names.insert(name.clone()) {
                return Err(invalid("vm".into(), &format!("two VMs are named {name:?}")));
            }
        }
        if let Some(t) = &self.tiers {
            if !(size(t.fast_mib) && t.fast_mib > h.reserved_mib && t.fast_mib <= h.memory_mib) {
                return Err(invalid(
                    "tiers.fast_mib".into(),
                    "must exceed host.reserved_mib and be at most host.memory_mib",
                ));
            }
            if !(t.latency_factor.is_finite() && t.latency_factor >= 1.0) {
                return Err(invalid("tiers.latency_factor".into(), "must be at least 1"));
            }
            if !positive(t.rate_mib_s) {
                return Err(invalid("tiers.rate_mib_s".into(), ABOVE_ZERO));
            }
            // Bounded as the daemon's `[tiering]` is.
            if !(0.0..=1000.0).contains(&t.margin_pct) {
                return Err(invalid("tiers.margin_pct".into(), "must be 0 to 1000"));
            }
            if !mib(t.reserve_mib) {
                return Err(invalid("tiers.reserve_mib".into(), SIZE));
            }
            if !size(t.cold_age_s) {
                return Err(invalid("tiers.cold_age_s".into(), "must be a time ≥ 0"));
            }
            if t.adaptive_age && !(size(t.max_cold_age_s) && t.max_cold_age_s >= t.cold_age_s) {
                return Err(invalid(
                    "tiers.max_cold_age_s".into(),
                    "must be a time ≥ tiers.cold_age_s",
                ));
            }
            if !(positive(t.promotion_slo_pct_per_min) && t.promotion_slo_pct_per_min <= 100.0) {
                return Err(invalid(
                    "tiers.promotion_slo_pct_per_min".into(),
                    "must be above 0 and at most 100",
                ));
            }
        }
        if let Some(d) = &self.density {
            for (name, v) in [
                ("arrive_every_s", d.arrive_every_s),
                ("settle_s", d.settle_s),
            ] {
                if !size(v) {
                    return Err(invalid(format!("density.{name}"), "must be a time ≥ 0"));
                }
            }
            if !positive(d.window_s) {
                return Err(invalid("density.window_s".into(), ABOVE_ZERO));
            }
            if d.reserves_pct.is_empty() || !d.reserves_pct.iter().all(|&r| pct(r)) {
                return Err(invalid(
                    "density.reserves_pct".into(),
                    "must list at least one share from 0 to 100",
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: &str = r#"
        name = "t"
        [host]
        memory_mib = 4096
        [[vm]]
        name = "a"
        memory_mib = 1024
        [vm.workload]
        anon = { kind = "const", mib = 300 }
    "#;

    #[test]
    fn defaults_fill_in() {
        let s = Scenario::from_toml(SMALL).unwrap();
        assert_eq!(s.ticks, 3600);
        assert_eq!(s.tick_s, 1.0);
        assert_eq!(s.vms[0].min_mib(), 192.0);
        assert_eq!(s.vms[0].max_mib(), 1024.0);
        assert_eq!(s.costs, Costs::default());
    }

    #[test]
    fn groups_expand_with_numbered_names() {
        let text = SMALL.replace("name = \"a\"", "name = \"a\"\ncount = 3");
        let s = Scenario::from_toml(&text).unwrap();
        let names: Vec<String> = s.expand().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["a-01", "a-02", "a-03"]);
    }

    #[test]
    fn a_fast_share_makes_any_scenario_two_tier() {
        let mut s = Scenario::from_toml(SMALL).unwrap();
        s.set_fast_share(0.25).unwrap();
        let t = s.tiers.as_ref().unwrap();
        assert_eq!((t.fast_mib, t.latency_factor), (1024.0, 2.0));
        assert_eq!(t.placement, TierPlacement::Memtide);
        // The fast tier must hold at least the host's own memory.
        let e = s.set_fast_share(0.1).unwrap_err().to_string();
        assert!(e.contains("tiers.fast_mib"), "{e}");
        assert_eq!("first-touch".parse(), Ok(TierPlacement::FirstTouch));
        assert!("lru".parse::<TierPlacement>().is_err());
    }

    #[test]
    fn builtins_parse() {
        for name in Scenario::builtin_names() {
            Scenario::builtin(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        let e = Scenario::builtin("nope").unwrap_err().to_string();
        assert!(e.contains("memknobs-32"), "{e}");
    }
}
