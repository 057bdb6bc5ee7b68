//! Scenario files (TOML): the guests to boot, their workloads, how long to warm up and
//! run, the policies to compare, the host pressure, daemon settings and the targets to
//! check. Unknown keys are errors, and every error names the field it rejects.

use serde::Deserialize;
use std::path::Path;

/// Built-in policies a scenario may compare (`none` is the baseline and always runs);
/// a policy-language file (`*.policy`, relative to the scenario file) may be compared too.
pub const POLICIES: [&str; 7] = [
    "memtide",
    "tws",
    "selfballoon",
    "sampled",
    "esx",
    "mom",
    "proxmox",
];
/// Workloads of the test guest (guest/README.md).
pub const WORKLOADS: [&str; 4] = ["memknobs", "coldalloc", "filecache", "mix"];
/// The baseline policy: every VM at its full configured memory, nothing managed.
pub const BASELINE: &str = "none";
/// Metrics a target can check in a density scenario (fields of a policy's result there).
pub const DENSITY_METRICS: [&str; 5] = [
    "guests_at_slo",
    "vms_admitted",
    "vm_hours",
    "slo_violation_share",
    "oom_kills",
];
/// Metrics a target can check (fields of a policy's result).
pub const METRICS: [&str; 11] = [
    "converge_s",
    "memory_mib_mean",
    "memory_mib_max",
    "memory_mib_settled",
    "throughput_ratio",
    "total_throughput",
    "swap_ins",
    "guest_swap_ins",
    "host_swap_ins",
    "refaults",
    "oom_kills",
];
/// Daemon configuration sections the harness sets itself (of `daemon`, all but
/// `record_dir`).
const RESERVED_CONFIG: [&str; 5] = ["discovery", "vm", "policy", "policy_dir", "interval_s"];

/// A checked scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    /// Its name (the results are `<name>.json` and `<name>.svg`).
    pub name: String,
    /// What it shows, in words.
    pub description: String,
    /// Seconds between the workloads' first report and the daemon's start.
    pub warmup_s: f64,
    /// Seconds the daemon runs: the measured window.
    pub run_s: f64,
    /// The daemon's tick interval.
    pub interval_s: f64,
    /// Length of the window at the end of the run for `memory_mib_settled`.
    pub settled_s: f64,
    /// Policies compared, in order, after the baseline.
    pub policies: Vec<String>,
    /// Share of the domain cgroup's limit left freeable at full memory (0: no limit, or
    /// `domain_limit_mib`).
    pub pressure_free: f64,
    /// A fixed limit of the domain cgroup, set before the guests boot.
    pub domain_limit_mib: Option<u64>,
    /// The scenario needs host swap behind the domain (the harness's `--host-swap-mib`).
    pub host_swap: bool,
    /// The scenario file's directory: policy files are relative to it.
    pub dir: std::path::PathBuf,
    /// Daemon configuration overrides (memtide.toml sections), merged into what the
    /// harness generates.
    pub config: toml::Table,
    /// The guests (for a density scenario: the admission queue, in arrival order).
    pub vms: Vec<VmSpec>,
    /// Targets checked and reported.
    pub targets: Vec<Target>,
    /// With `[density]`: the density benchmark instead of a fixed set of guests.
    pub density: Option<Density>,
}

/// The density benchmark's admission settings (`[density]`; see `density.rs`).
#[derive(Debug, Clone, PartialEq)]
pub struct Density {
    /// The next VM in the queue arrives this long after the previous one.
    pub arrive_every_s: f64,
    /// At least this long between two admissions (the host settles).
    pub settle_s: f64,
    /// Busy guests' throughput is compared with their solo runs over windows this long.
    pub window_s: f64,
    /// Free memory kept beyond a VM's expected need before it is admitted, % of the domain.
    pub reserve_pct: f64,
    /// QEMU's own memory per guest beyond what the guest touches, MiB: part of a VM's
    /// expected need, and of its static partition under `none`.
    pub qemu_overhead_mib: f64,
    /// Length of each busy guest's solo run, s.
    pub solo_s: f64,
}

/// Where a VM's allocation starts in a policy run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Start {
    /// Its configured size.
    Full,
    /// Ballooned to this many MiB before the daemon starts.
    Mib(u64),
}

/// One guest.
#[derive(Debug, Clone, PartialEq)]
pub struct VmSpec {
    /// Its name (QMP socket stem, daemon VM name, plot panel).
    pub name: String,
    /// Configured memory: QEMU's `-m`, or its base memory and virtio-mem device together.
    pub memory_mib: u64,
    /// How much of `memory_mib` is a virtio-mem device's (0: none): the guest boots with
    /// the rest as base memory and this much plugged, onlined movable.
    pub virtio_mem_mib: u64,
    /// Workload program in the guest, or `None` for an idle guest.
    pub workload: Option<String>,
    /// Its arguments (joined with `+` on the kernel command line).
    pub args: Vec<String>,
    /// Allocation when the daemon starts (the baseline always runs at full size).
    pub start: Start,
    /// Swap disk size (0: none).
    pub swap_mib: u64,
    /// Data disk size (0: none).
    pub data_mib: u64,
    /// Whether the guest agent channel is attached and given to the daemon.
    pub agent: bool,
    /// The workload's true working set.
    pub hot_set_mib: f64,
    /// Kernel parameters of the guest's own beyond the workload's (e.g.
    /// `transparent_hugepage=never`), in every boot of it, solo runs included.
    pub extra_kernel_args: String,
    /// The balloon reports the guest's free memory (`free-page-reporting=on`): freed
    /// pages go back to the host by themselves, under every policy.
    pub free_page_reporting: bool,
    /// Daemon bounds for the VM.
    pub min_mib: Option<u64>,
    /// See `min_mib`.
    pub max_mib: Option<u64>,
    /// Shares.
    pub shares: Option<u32>,
}

impl VmSpec {
    /// The kernel command line's workload parameters.
    pub fn kernel_args(&self) -> String {
        match &self.workload {
            Some(w) if self.args.is_empty() => format!("memtide.workload={w}"),
            Some(w) => format!("memtide.workload={w} memtide.args={}", self.args.join("+")),
            None => String::new(),
        }
    }

    /// The key of guests that share a base measurement: same memory, disks and kernel
    /// parameters of their own.
    pub fn base_key(&self) -> (u64, u64, bool, bool, bool, &str) {
        (
            self.memory_mib,
            self.virtio_mem_mib,
            self.swap_mib > 0,
            self.data_mib > 0,
            self.agent,
            &self.extra_kernel_args,
        )
    }
}

/// A bound on one policy's metric.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// The policy whose result is checked.
    pub policy: String,
    /// The metric (one of [`METRICS`]).
    pub metric: String,
    /// Upper (`true`) or lower bound.
    pub at_most: bool,
    /// The bound, or the factor when relative.
    pub value: f64,
    /// Relative to: another policy's same metric, or `ideal` (the policy's `hot_set_mib`).
    pub of: Option<String>,
}

impl Target {
    /// In words, e.g. `memtide converge_s ≤ 0.5 × tws`.
    pub fn describe(&self) -> String {
        let op = if self.at_most { "≤" } else { "≥" };
        match &self.of {
            Some(of) => format!("{} {} {op} {} × {of}", self.policy, self.metric, self.value),
            None => format!("{} {} {op} {}", self.policy, self.metric, self.value),
        }
    }

    /// Whether `value` is within `bound` (an unknown one of either is not).
    pub fn met(&self, value: Option<f64>, bound: Option<f64>) -> bool {
        match (value, bound) {
            (Some(v), Some(b)) if self.at_most => v <= b,
            (Some(v), Some(b)) => v >= b,
            _ => false,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    name: Option<String>,
    #[serde(default)]
    description: String,
    warmup_s: f64,
    run_s: f64,
    #[serde(default = "one")]
    interval_s: f64,
    settled_s: Option<f64>,
    policies: Vec<String>,
    pressure_free: Option<f64>,
    domain_limit_mib: Option<u64>,
    #[serde(default)]
    host_swap: bool,
    #[serde(default)]
    config: toml::Table,
    #[serde(default)]
    vm: Vec<RawVm>,
    #[serde(default)]
    target: Vec<RawTarget>,
    density: Option<RawDensity>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDensity {
    #[serde(default = "twenty")]
    arrive_every_s: f64,
    #[serde(default = "twenty")]
    settle_s: f64,
    #[serde(default = "twenty")]
    window_s: f64,
    #[serde(default = "ten")]
    reserve_pct: f64,
    #[serde(default = "eighty")]
    qemu_overhead_mib: f64,
    #[serde(default = "sixty")]
    solo_s: f64,
}

fn twenty() -> f64 {
    20.0
}

fn ten() -> f64 {
    10.0
}

fn eighty() -> f64 {
    80.0
}

fn sixty() -> f64 {
    60.0
}

fn one() -> f64 {
    1.0
}

/// The default `pressure_free`.
const DEFAULT_PRESSURE: f64 = 0.12;

fn one_vm() -> u32 {
    1
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawVm {
    name: String,
    #[serde(default = "one_vm")]
    count: u32,
    memory_mib: u64,
    #[serde(default)]
    virtio_mem_mib: u64,
    workload: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    start_mib: Option<toml::Value>,
    #[serde(default)]
    swap_mib: u64,
    #[serde(default)]
    data_mib: u64,
    #[serde(default = "yes")]
    agent: bool,
    hot_set_mib: f64,
    #[serde(default)]
    kernel_args: String,
    #[serde(default)]
    free_page_reporting: bool,
    min_mib: Option<u64>,
    max_mib: Option<u64>,
    shares: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTarget {
    policy: String,
    metric: String,
    at_most: Option<f64>,
    at_least: Option<f64>,
    of: Option<String>,
}

/// A scenario that cannot be used: `field` names what is wrong (empty for TOML syntax).
#[derive(Debug, PartialEq)]
pub struct ScenarioError {
    /// The field, e.g. `vm[1].start_mib`.
    pub field: String,
    /// Why.
    pub message: String,
}

impl std::fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}

impl std::error::Error for ScenarioError {}

fn bad<T>(field: impl Into<String>, message: impl Into<String>) -> Result<T, ScenarioError> {
    Err(ScenarioError {
        field: field.into(),
        message: message.into(),
    })
}

impl Scenario {
    /// Read a scenario file; its stem is the default name.
    pub fn load(path: &Path) -> anyhow::Result<Scenario> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut scenario = Scenario::parse(&text, &stem)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        scenario.dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .canonicalize()?;
        for p in scenario.policies.iter().filter(|p| is_policy_file(p)) {
            let file = scenario.dir.join(p);
            if !file.is_file() {
                anyhow::bail!(
                    "{}: policy file {} not found",
                    path.display(),
                    file.display()
                );
            }
        }
        Ok(scenario)
    }

    /// What the daemon's `policy` key gets for `policy`: a built-in name, or the policy
    /// file's absolute path.
    pub fn policy_setting(&self, policy: &str) -> String {
        if is_policy_file(policy) {
            self.dir.join(policy).display().to_string()
        } else {
            policy.to_string()
        }
    }

    /// Parse and check scenario text; `default_name` is used when it has no `name`.
    pub fn parse(text: &str, default_name: &str) -> Result<Scenario, ScenarioError> {
        let raw: RawScenario = toml::from_str(text).map_err(|e| {
            // toml's messages name the key and line ("unknown field `x`", "missing field").
            ScenarioError {
                field: String::new(),
                message: e.to_string().trim_end().replace('\n', " "),
            }
        })?;
        let name = raw.name.unwrap_or_else(|| default_name.to_string());
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return bad(
                "name",
                format!("{name:?} is not a usable name (letters, digits, - and _)"),
            );
        }
        let seconds = |field: &str, v: f64, min: f64| {
            if v.is_finite() && v >= min {
                Ok(v)
            } else {
                bad(field, format!("{v} is not a number of seconds ≥ {min}"))
            }
        };
        let warmup_s = seconds("warmup_s", raw.warmup_s, 0.0)?;
        let run_s = seconds("run_s", raw.run_s, 1.0)?;
        let interval_s = seconds("interval_s", raw.interval_s, 0.1)?;
        let settled_s = seconds("settled_s", raw.settled_s.unwrap_or(run_s / 5.0), 1.0)?;
        if settled_s > run_s {
            return bad(
                "settled_s",
                format!("{settled_s} is longer than run_s {run_s}"),
            );
        }
        if raw.policies.is_empty() {
            return bad("policies", "no policy to compare");
        }
        let mut policies = Vec::new();
        for (i, p) in raw.policies.iter().enumerate() {
            let field = format!("policies[{i}]");
            if p == BASELINE {
                return bad(
                    field,
                    "\"none\" is the baseline (full memory) and always runs first: leave it out",
                );
            }
            if !POLICIES.contains(&p.as_str()) && !is_policy_file(p) {
                return bad(
                    field,
                    format!(
                        "unknown policy {p:?} (built-in policies: {}; or a *.policy file)",
                        POLICIES.join(", ")
                    ),
                );
            }
            if policies.contains(p) {
                return bad(field, format!("{p:?} is listed twice"));
            }
            policies.push(p.clone());
        }
        let pressure_free = match (raw.pressure_free, raw.domain_limit_mib) {
            (Some(_), Some(_)) => return bad(
                "domain_limit_mib",
                "give either pressure_free (a limit measured at full memory) or domain_limit_mib",
            ),
            (_, Some(l)) if l < 128 => {
                return bad(
                    "domain_limit_mib",
                    format!("{l} MiB is too small to boot a guest"),
                )
            }
            (_, Some(_)) => 0.0,
            (p, None) => p.unwrap_or(DEFAULT_PRESSURE),
        };
        if !(0.0..0.9).contains(&pressure_free) {
            return bad(
                "pressure_free",
                format!("{pressure_free} is not a share between 0 (no limit) and 0.9"),
            );
        }
        if raw.host_swap && raw.domain_limit_mib.is_none() && pressure_free == 0.0 {
            return bad(
                "host_swap",
                "host swap only matters behind a domain limit (domain_limit_mib or pressure_free)",
            );
        }
        check_config(&raw.config)?;
        if raw.vm.is_empty() {
            return bad("vm", "no [[vm]]");
        }
        let mut vms: Vec<VmSpec> = Vec::new();
        for (i, v) in raw.vm.into_iter().enumerate() {
            for vm in check_vm(i, v)? {
                if vms.iter().any(|o| o.name == vm.name) {
                    return bad(
                        format!("vm[{i}].name"),
                        format!("{:?} is named twice", vm.name),
                    );
                }
                vms.push(vm);
            }
        }
        let density = match raw.density {
            None => None,
            Some(d) => Some(check_density(d, raw.domain_limit_mib, raw.host_swap)?),
        };
        let mut targets = Vec::new();
        for (i, t) in raw.target.into_iter().enumerate() {
            targets.push(check_target(i, t, &policies, density.is_some())?);
        }
        Ok(Scenario {
            name,
            description: raw.description,
            warmup_s,
            run_s,
            interval_s,
            settled_s,
            policies,
            pressure_free,
            domain_limit_mib: raw.domain_limit_mib,
            host_swap: raw.host_swap,
            dir: std::path::PathBuf::from("."),
            config: raw.config,
            vms,
            targets,
            density,
        })
    }
}

fn check_density(
    d: RawDensity,
    domain_limit_mib: Option<u64>,
    host_swap: bool,
) -> Result<Density, ScenarioError> {
    if domain_limit_mib.is_none() {
        return bad(
            "density",
            "the density benchmark fills a fixed memory domain: give domain_limit_mib",
        );
    }
    if host_swap {
        return bad(
            "host_swap",
            "the density benchmark runs without host swap: memory that does not fit is an OOM kill",
        );
    }
    let seconds = |field: &str, v: f64| {
        if v.is_finite() && v >= 1.0 {
            Ok(v)
        } else {
            bad(
                format!("density.{field}"),
                format!("{v} is not a number of seconds ≥ 1"),
            )
        }
    };
    if !(d.reserve_pct.is_finite() && (0.0..50.0).contains(&d.reserve_pct)) {
        return bad(
            "density.reserve_pct",
            format!("{} is not a share between 0 and 50 %", d.reserve_pct),
        );
    }
    if !(d.qemu_overhead_mib.is_finite() && d.qemu_overhead_mib >= 0.0) {
        return bad(
            "density.qemu_overhead_mib",
            format!("{} is not a number of MiB ≥ 0", d.qemu_overhead_mib),
        );
    }
    Ok(Density {
        arrive_every_s: seconds("arrive_every_s", d.arrive_every_s)?,
        settle_s: seconds("settle_s", d.settle_s)?,
        window_s: seconds("window_s", d.window_s)?,
        reserve_pct: d.reserve_pct,
        qemu_overhead_mib: d.qemu_overhead_mib,
        solo_s: seconds("solo_s", d.solo_s)?,
    })
}

/// A policy-language file rather than a built-in policy.
pub fn is_policy_file(policy: &str) -> bool {
    policy.ends_with(".policy")
}

fn check_config(config: &toml::Table) -> Result<(), ScenarioError> {
    for key in RESERVED_CONFIG {
        if config.contains_key(key) {
            let why = match key {
                "interval_s" => "set by the scenario's own interval_s",
                "policy" | "policy_dir" => "the harness runs each policy of `policies` in turn",
                _ => "set by the harness",
            };
            return bad(format!("config.{key}"), why);
        }
    }
    if let Some(daemon) = config.get("daemon") {
        let Some(daemon) = daemon.as_table() else {
            return bad("config.daemon", "a table: [config.daemon] record_dir");
        };
        if let Some(key) = daemon.keys().find(|k| *k != "record_dir") {
            return bad(format!("config.daemon.{key}"), "set by the harness");
        }
    }
    if let Some(host) = config.get("host").and_then(toml::Value::as_table) {
        if host.contains_key("domain_cgroup") {
            return bad(
                "config.host.domain_cgroup",
                "set by the harness (the scenario's own cgroup)",
            );
        }
    }
    if let Some(engine) = config.get("engine").and_then(toml::Value::as_table) {
        if engine.get("ksm_control").and_then(toml::Value::as_bool) == Some(true) {
            return bad(
                "config.engine.ksm_control",
                "the harness never lets the daemon change the host's KSM settings",
            );
        }
    }
    Ok(())
}

/// A `[[vm]]` entry checked: `count` copies, named `NAME-01`, `NAME-02`, ... when more than
/// one.
fn check_vm(i: usize, v: RawVm) -> Result<Vec<VmSpec>, ScenarioError> {
    let field = |f: &str| format!("vm[{i}].{f}");
    if !(1..=64).contains(&v.count) {
        return bad(
            field("count"),
            format!("{} is not between 1 and 64", v.count),
        );
    }
    let longest = if v.count > 1 { 17 } else { 20 };
    if v.name.is_empty()
        || !v
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        || v.name.len() > longest
    {
        return bad(
            field("name"),
            format!(
                "{:?} is not a usable VM name (1-{longest} letters, digits, - and _)",
                v.name
            ),
        );
    }
    if !(128..=65536).contains(&v.memory_mib) {
        return bad(
            field("memory_mib"),
            format!("{} is not between 128 and 65536", v.memory_mib),
        );
    }
    if let Some(w) = &v.workload {
        if !WORKLOADS.contains(&w.as_str()) {
            return bad(
                field("workload"),
                format!(
                    "unknown workload {w:?} (the test guest has {})",
                    WORKLOADS.join(", ")
                ),
            );
        }
    } else if !v.args.is_empty() {
        return bad(field("args"), "arguments without a workload");
    }
    for (j, a) in v.args.iter().enumerate() {
        if a.is_empty() || a.chars().any(|c| c.is_whitespace() || c == '+' || c == '"') {
            return bad(
                format!("vm[{i}].args[{j}]"),
                format!("{a:?}: arguments go on the kernel command line: no spaces, '+' or quotes"),
            );
        }
    }
    let start = match &v.start_mib {
        None => Start::Full,
        Some(toml::Value::String(s)) if s == "full" => Start::Full,
        Some(toml::Value::Integer(n)) if *n >= 64 && (*n as u64) <= v.memory_mib => {
            Start::Mib(*n as u64)
        }
        Some(other) => {
            return bad(
                field("start_mib"),
                format!(
                    "{other} is neither \"full\" nor a number of MiB between 64 and memory_mib {}",
                    v.memory_mib
                ),
            )
        }
    };
    if v.virtio_mem_mib > 0 {
        // The guest uses the device's memory in whole memory blocks of its own (128 MiB
        // on x86-64 at these sizes: a 192 MiB device gave it 128), and keeps its kernel
        // in base memory, which cannot be unplugged (128 MiB boots the test guest).
        if !v.virtio_mem_mib.is_multiple_of(128) || v.virtio_mem_mib + 128 > v.memory_mib {
            return bad(
                field("virtio_mem_mib"),
                format!(
                    "{} is not a whole number of 128 MiB memory blocks leaving at least \
                     128 MiB of memory_mib {} as base memory",
                    v.virtio_mem_mib, v.memory_mib
                ),
            );
        }
        if start != Start::Full {
            return bad(
                field("start_mib"),
                "a guest with virtio-mem starts full (the harness balloons only base memory)",
            );
        }
    }
    if v.workload.as_deref().is_some_and(|w| w == "filecache") && v.data_mib == 0 {
        return bad(
            field("data_mib"),
            "filecache keeps its file set on the data disk: give it one",
        );
    }
    if !(v.hot_set_mib.is_finite() && v.hot_set_mib >= 0.0) {
        return bad(
            field("hot_set_mib"),
            format!("{} is not a number of MiB ≥ 0", v.hot_set_mib),
        );
    }
    if v.hot_set_mib > v.memory_mib as f64 {
        return bad(
            field("hot_set_mib"),
            format!("{} is more than memory_mib {}", v.hot_set_mib, v.memory_mib),
        );
    }
    if let Some(arg) = v
        .kernel_args
        .split_whitespace()
        .find(|a| a.starts_with("memtide."))
    {
        return bad(
            field("kernel_args"),
            format!("{arg}: the harness sets the memtide.* parameters from workload and args"),
        );
    }
    if let (Some(min), Some(max)) = (v.min_mib, v.max_mib) {
        if max < min {
            return bad(field("max_mib"), format!("{max} is below min_mib {min}"));
        }
    }
    let spec = VmSpec {
        name: v.name.clone(),
        memory_mib: v.memory_mib,
        virtio_mem_mib: v.virtio_mem_mib,
        workload: v.workload,
        args: v.args,
        start,
        swap_mib: v.swap_mib,
        data_mib: v.data_mib,
        agent: v.agent,
        hot_set_mib: v.hot_set_mib,
        extra_kernel_args: v
            .kernel_args
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" "),
        free_page_reporting: v.free_page_reporting,
        min_mib: v.min_mib,
        max_mib: v.max_mib,
        shares: v.shares,
    };
    if v.count == 1 {
        return Ok(vec![spec]);
    }
    Ok((1..=v.count)
        .map(|k| VmSpec {
            name: format!("{}-{k:02}", v.name),
            ..spec.clone()
        })
        .collect())
}

fn check_target(
    i: usize,
    t: RawTarget,
    policies: &[String],
    density: bool,
) -> Result<Target, ScenarioError> {
    let field = |f: &str| format!("target[{i}].{f}");
    let metrics: &[&str] = if density { &DENSITY_METRICS } else { &METRICS };
    let known = |p: &str| p == BASELINE || policies.iter().any(|q| q == p);
    if !known(&t.policy) {
        return bad(
            field("policy"),
            format!("{:?} is not among the scenario's policies", t.policy),
        );
    }
    if !metrics.contains(&t.metric.as_str()) {
        return bad(
            field("metric"),
            format!(
                "unknown metric {:?} (one of {})",
                t.metric,
                metrics.join(", ")
            ),
        );
    }
    let (at_most, value) = match (t.at_most, t.at_least) {
        (Some(v), None) => (true, v),
        (None, Some(v)) => (false, v),
        _ => return bad(field("at_most"), "give exactly one of at_most and at_least"),
    };
    if !value.is_finite() {
        return bad(
            field(if at_most { "at_most" } else { "at_least" }),
            "not a number",
        );
    }
    if let Some(of) = &t.of {
        if of != "ideal" && !known(of) {
            return bad(
                field("of"),
                format!("{of:?} is neither \"ideal\" nor one of the scenario's policies"),
            );
        }
    }
    Ok(Target {
        policy: t.policy,
        metric: t.metric,
        at_most,
        value,
        of: t.of,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
        description = "two guests"
        warmup_s = 10
        run_s = 60
        policies = ["memtide", "tws"]
        [config.memtide]
        margin = 0.05
        [[vm]]
        name = "small"
        memory_mib = 384
        workload = "memknobs"
        args = ["60:100000"]
        start_mib = 160
        swap_mib = 256
        hot_set_mib = 60
        min_mib = 64
        [[vm]]
        name = "big"
        memory_mib = 384
        workload = "coldalloc"
        args = ["--cold-mib", "200", "--hot-mib", "32"]
        start_mib = "full"
        hot_set_mib = 32
        kernel_args = " transparent_hugepage=never   quiet "
        free_page_reporting = true
        [[target]]
        policy = "memtide"
        metric = "converge_s"
        at_most = 0.5
        of = "tws"
    "#;

    fn err(text: &str) -> String {
        Scenario::parse(text, "x").unwrap_err().to_string()
    }

    /// GOOD with one line replaced.
    fn with(from: &str, to: &str) -> String {
        assert!(GOOD.contains(from), "{from}");
        GOOD.replacen(from, to, 1)
    }

    #[test]
    fn a_full_scenario_parses() {
        let s = Scenario::parse(GOOD, "converge").unwrap();
        assert_eq!(s.name, "converge");
        assert_eq!((s.warmup_s, s.run_s, s.interval_s), (10.0, 60.0, 1.0));
        assert_eq!(s.settled_s, 12.0, "a fifth of the run by default");
        assert_eq!(s.pressure_free, 0.12);
        assert_eq!(s.vms[0].start, Start::Mib(160));
        assert_eq!(s.vms[1].start, Start::Full);
        assert!(s.vms[0].agent, "agent on by default");
        assert_eq!(
            s.vms[1].kernel_args(),
            "memtide.workload=coldalloc memtide.args=--cold-mib+200+--hot-mib+32"
        );
        assert_eq!(s.vms[0].extra_kernel_args, "");
        assert_eq!(
            s.vms[1].extra_kernel_args,
            "transparent_hugepage=never quiet"
        );
        assert_eq!(s.vms[0].base_key(), (384, 0, true, false, true, ""));
        assert_eq!(s.vms[0].virtio_mem_mib, 0, "no virtio-mem by default");
        let vmem = Scenario::parse(
            &with("free_page_reporting = true", "virtio_mem_mib = 256"),
            "v",
        );
        let vmem = &vmem.unwrap().vms[1];
        assert_eq!(vmem.virtio_mem_mib, 256);
        assert_eq!(vmem.base_key().1, 256, "base usage measured apart");
        assert!(!s.vms[0].free_page_reporting, "off by default");
        assert!(s.vms[1].free_page_reporting);
        assert_eq!(s.targets[0].describe(), "memtide converge_s ≤ 0.5 × tws");
        assert_eq!(s.config["memtide"]["margin"].as_float(), Some(0.05));
    }

    #[test]
    fn the_scenario_files_parse() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/scenarios");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                Scenario::load(&path).unwrap();
                n += 1;
            }
        }
        assert!(
            n >= 3,
            "converge, coldmem and pagecache are in {}",
            dir.display()
        );
    }

    #[test]
    fn bad_values_name_their_field() {
        let cases = [
            (
                with("warmup_s = 10", "warmup_s = -1"),
                "warmup_s: -1 is not",
            ),
            (with("run_s = 60", "run_s = 0"), "run_s: 0 is not"),
            (
                with(
                    "policies = [\"memtide\", \"tws\"]",
                    "policies = [\"memtide\", \"magic\"]",
                ),
                "policies[1]: unknown policy \"magic\"",
            ),
            (
                with(
                    "policies = [\"memtide\", \"tws\"]",
                    "policies = [\"none\", \"tws\"]",
                ),
                "policies[0]: \"none\" is the baseline",
            ),
            (
                with("start_mib = 160", "start_mib = \"half\""),
                "vm[0].start_mib: \"half\" is neither \"full\" nor",
            ),
            (
                with("quiet \"", "memtide.args=x\""),
                "vm[1].kernel_args: memtide.args=x: the harness sets",
            ),
            (
                with("start_mib = 160", "start_mib = 999"),
                "vm[0].start_mib: 999 is neither",
            ),
            (
                with("free_page_reporting = true", "virtio_mem_mib = 192"),
                "vm[1].virtio_mem_mib: 192 is not a whole number of 128 MiB memory blocks",
            ),
            (
                with("free_page_reporting = true", "virtio_mem_mib = 384"),
                "vm[1].virtio_mem_mib: 384 is not a whole number of 128 MiB memory blocks leaving at least 128 MiB",
            ),
            (
                with("start_mib = 160", "start_mib = 160\nvirtio_mem_mib = 256"),
                "vm[0].start_mib: a guest with virtio-mem starts full",
            ),
            (
                with("workload = \"coldalloc\"", "workload = \"stress\""),
                "vm[1].workload: unknown workload \"stress\"",
            ),
            (
                with("args = [\"60:100000\"]", "args = [\"60 100000\"]"),
                "vm[0].args[0]: \"60 100000\"",
            ),
            (
                with("name = \"big\"", "name = \"small\""),
                "vm[1].name: \"small\" is named twice",
            ),
            (
                with("hot_set_mib = 32", "hot_set_mib = 400"),
                "vm[1].hot_set_mib: 400 is more than memory_mib 384",
            ),
            (
                with("metric = \"converge_s\"", "metric = \"speed\""),
                "target[0].metric: unknown metric \"speed\"",
            ),
            (
                with("of = \"tws\"", "of = \"esx\""),
                "target[0].of: \"esx\" is neither",
            ),
            (
                with(
                    "[config.memtide]",
                    "[config.engine]\nksm_control = true\n[config.memtide]",
                ),
                "config.engine.ksm_control:",
            ),
            (
                with(
                    "[config.memtide]",
                    "[config.daemon]\nsocket = \"/x\"\n[config.memtide]",
                ),
                "config.daemon.socket: set by the harness",
            ),
            (
                with("memory_mib = 384", "memory_mib = 64"),
                "vm[0].memory_mib: 64 is not between",
            ),
            (
                with(
                    "run_s = 60",
                    "run_s = 60\npressure_free = 0.1\ndomain_limit_mib = 900",
                ),
                "domain_limit_mib: give either",
            ),
            (
                with("run_s = 60", "run_s = 60\ndomain_limit_mib = 64"),
                "domain_limit_mib: 64 MiB is too small",
            ),
            (
                with(
                    "run_s = 60",
                    "run_s = 60\npressure_free = 0\nhost_swap = true",
                ),
                "host_swap: host swap only matters",
            ),
        ];
        for (text, expected) in cases {
            let e = err(&text);
            assert!(e.starts_with(expected), "expected {expected:?}, got {e:?}");
        }
    }

    #[test]
    fn unknown_missing_and_mistyped_keys_are_named() {
        let e = err(&with("swap_mib = 256", "swap_mb = 256"));
        assert!(e.contains("unknown field `swap_mb`"), "{e}");
        let e = err(&with("run_s = 60\n", ""));
        assert!(e.contains("missing field `run_s`"), "{e}");
        let e = err(&with("memory_mib = 384", "memory_mib = \"lots\""));
        assert!(e.contains("memory_mib") || e.contains("line"), "{e}");
        assert!(e.contains("invalid type"), "{e}");
        let e = err(&with("hot_set_mib = 60\n", ""));
        assert!(e.contains("missing field `hot_set_mib`"), "{e}");
    }

    #[test]
    fn a_fixed_limit_with_host_swap_and_a_policy_file() {
        let text = with(
            "run_s = 60",
            "run_s = 60\ndomain_limit_mib = 900\nhost_swap = true",
        )
        .replace("\"tws\"]", "\"tws\", \"mom.policy\"]");
        let s = Scenario::parse(&text, "x").unwrap();
        assert_eq!(
            (s.domain_limit_mib, s.pressure_free, s.host_swap),
            (Some(900), 0.0, true)
        );
        assert_eq!(s.policy_setting("memtide"), "memtide");
        assert_eq!(s.policy_setting("mom.policy"), "./mom.policy");

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("s.toml");
        std::fs::write(&file, &text).unwrap();
        let e = Scenario::load(&file).unwrap_err().to_string();
        assert!(e.contains("policy file") && e.contains("not found"), "{e}");
        std::fs::write(dir.path().join("mom.policy"), "").unwrap();
        let s = Scenario::load(&file).unwrap();
        assert_eq!(
            s.policy_setting("mom.policy"),
            dir.path()
                .canonicalize()
                .unwrap()
                .join("mom.policy")
                .display()
                .to_string()
        );
    }

    #[test]
    fn filecache_needs_a_data_disk() {
        let text = with("workload = \"coldalloc\"", "workload = \"filecache\"");
        assert_eq!(
            err(&text),
            "vm[1].data_mib: filecache keeps its file set on the data disk: give it one"
        );
    }

    const DENSITY: &str = r#"
        warmup_s = 10
        run_s = 300
        domain_limit_mib = 2048
        policies = ["mom", "memtide"]
        [density]
        reserve_pct = 12.5
        [[vm]]
        name = "busy"
        memory_mib = 512
        workload = "memknobs"
        args = ["192:100000"]
        hot_set_mib = 192
        [[vm]]
        name = "idle"
        count = 3
        memory_mib = 256
        hot_set_mib = 0
        [[target]]
        policy = "memtide"
        metric = "guests_at_slo"
        at_least = 1.5
        of = "none"
    "#;

    #[test]
    fn a_density_scenario_expands_counts_into_its_queue() {
        let s = Scenario::parse(DENSITY, "density").unwrap();
        let names: Vec<&str> = s.vms.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["busy", "idle-01", "idle-02", "idle-03"]);
        let d = s.density.unwrap();
        assert_eq!(d.reserve_pct, 12.5);
        assert_eq!(
            (d.arrive_every_s, d.settle_s, d.window_s),
            (20.0, 20.0, 20.0)
        );
        assert_eq!(d.qemu_overhead_mib, 80.0);
        assert!(Scenario::parse(GOOD, "c").unwrap().density.is_none());
    }

    #[test]
    fn density_errors_name_their_field() {
        let err = |text: &str| Scenario::parse(text, "d").unwrap_err().to_string();
        let cases = [
            (
                DENSITY.replace("domain_limit_mib = 2048", ""),
                "density: the density benchmark fills a fixed memory domain: give domain_limit_mib",
            ),
            (
                DENSITY.replace("reserve_pct = 12.5", "reserve_pct = 60"),
                "density.reserve_pct: 60 is not a share between 0 and 50 %",
            ),
            (
                DENSITY.replace("count = 3", "count = 0"),
                "vm[1].count: 0 is not between 1 and 64",
            ),
            (
                DENSITY.replace("name = \"idle\"", "name = \"idle-guests-of-a-host\""),
                "vm[1].name: \"idle-guests-of-a-host\" is not a usable VM name (1-17",
            ),
            (
                DENSITY.replace("guests_at_slo", "converge_s"),
                "target[0].metric: unknown metric \"converge_s\" (one of guests_at_slo",
            ),
            (
                DENSITY.replace("[density]", "[density]\nwindow = 3"),
                "unknown field `window`",
            ),
        ];
        for (text, want) in cases {
            let got = err(&text);
            assert!(
                got.contains(want) || got.starts_with(want),
                "{got}\nwanted: {want}"
            );
        }
        assert!(
            err(&GOOD.replace("metric = \"converge_s\"", "metric = \"guests_at_slo\""))
                .contains("unknown metric \"guests_at_slo\""),
            "density metrics only in density scenarios"
        );
    }
}
