//! The configuration file (TOML): what to manage, where to find it, and every constant.
//! Unknown keys are errors, and every semantic check names the field it rejects.

use crate::policies::PolicySource;
use memtide_adapters::access::Method;
use memtide_adapters::qmp::AccessSampling;
use memtide_core::estimate::fused::FusedConfig;
use memtide_core::estimate::sampled::SampledConfig;
use memtide_core::estimate::selfballoon::SelfBalloonConfig;
use memtide_core::estimate::tws::TwsConfig;
use memtide_core::hibernate::HibernateConfig;
use memtide_core::policy::esx::EsxConfig;
use memtide_core::policy::ksmtuned::KsmConfig;
use memtide_core::policy::mom::MomConfig;
use memtide_core::policy::proxmox::ProxmoxConfig;
use memtide_core::policy::working_set::WorkingSetConfig;
use memtide_core::reclaim::PaceConfig;
use memtide_core::recovery::RecoveryConfig;
use memtide_core::tiering::age::AgeConfig;
use memtide_core::wake::TimeOfDay;
use memtide_core::{Bytes, EngineConfig, VmLimits};
use memtide_sim::RecorderConfig;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Seconds between two decisions.
    pub interval_s: f64,
    /// The policy: a built-in name (`mom`, `none`), a policy file or a directory of them.
    pub policy: String,
    /// A directory of `*.policy` files (read in name order); not with `policy`.
    pub policy_dir: Option<PathBuf>,
    /// The daemon's own endpoints.
    pub daemon: DaemonConfig,
    /// Who besides root may use the control socket.
    pub control: ControlConfig,
    /// Where the host's files are and what the VM memory domain is.
    pub host: HostConfig,
    /// Where to find QEMU VMs by their QMP sockets, besides the `[[vm]]` list.
    pub discovery: DiscoveryConfig,
    /// libvirt connections whose running domains are managed.
    pub libvirt: LibvirtConfig,
    /// Firecracker VMs found by their API sockets.
    pub firecracker: SocketDiscovery,
    /// Cloud Hypervisor VMs found by their API sockets.
    pub cloud_hypervisor: SocketDiscovery,
    /// Bounds for VMs that do not set their own.
    pub defaults: VmDefaults,
    /// VMs named explicitly.
    #[serde(rename = "vm")]
    pub vms: Vec<VmConfig>,
    /// Engine and safeguard settings.
    pub engine: EngineConfig,
    /// Constants of the MOM balloon policy.
    pub mom: MomConfig,
    /// Constants of the ksmtuned algorithm.
    pub ksm: KsmConfig,
    /// Settings shared by the working-set policies (memtide, tws, selfballoon, sampled).
    pub working_set: WorkingSetConfig,
    /// Constants of memtide's estimator.
    pub memtide: FusedConfig,
    /// Constants of the TWS probing machine.
    pub tws: TwsConfig,
    /// Constants of Xen self-ballooning.
    pub selfballoon: SelfBalloonConfig,
    /// Constants of the host-side sampled estimate.
    pub sampled: SampledConfig,
    /// Constants of the ESX policy.
    pub esx: EsxConfig,
    /// Constants of Proxmox VE's auto-ballooning.
    pub proxmox: ProxmoxConfig,
    /// Where VM memory snapshots are kept (`memtide snapshot`).
    pub snapshots: SnapshotConfig,
    /// When a VM that allows it (`[[vm]] hibernate_after_s`) is hibernated.
    pub hibernate: HibernateConfig,
    /// How often a VM with `[[vm]] restore_on_crash` is restored after crashes.
    pub recovery: RecoveryConfig,
    /// Proactive reclaim through cgroup v2 `memory.reclaim`, for VMs no balloon serves.
    pub reclaim: ReclaimConfig,
    /// Tier placement: each VM's pages between a fast and a slow NUMA node.
    pub tiering: TieringConfig,
}

/// Tier placement in the daemon (`docs/tiering.md`): every `interval_s`, each VM's
/// hot pages to the fast node and its cold ones to the slow node, within its fast budget.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TieringConfig {
    /// Place VMs' pages (default: no).
    pub place: bool,
    /// The fast tier's NUMA node (default: the node with CPUs in the fastest tier).
    pub fast_node: Option<u32>,
    /// The slow tier's NUMA node (default: the memory-only node in the slowest tier).
    pub slow_node: Option<u32>,
    /// Seconds between two placement passes (each scans every placed VM's memory).
    pub interval_s: f64,
    /// Most memory moved per VM a second, demotions and promotions together (MiB/s).
    pub rate_mib_s: f64,
    /// Fast memory given above a VM's hot set, in percent of it.
    pub margin_pct: f64,
    /// Fast memory kept free, in MiB.
    pub reserve_mib: u64,
    /// Seconds a page must go untouched before it is demoted (0: whatever is idle at the
    /// scan): each VM's least and starting age where ages adapt.
    pub cold_age_s: f64,
    /// Adapt each VM's cold age to its own promotions, between `cold_age_s` and
    /// `max_cold_age_s` (default: yes).
    pub adaptive_age: bool,
    /// The longest adaptive cold age, in seconds.
    pub max_cold_age_s: f64,
    /// The promotion SLO the adaptive age keeps each VM to: its pages demoted that come
    /// back a minute, in percent of its working set (what it touched in the last minute).
    pub promotion_slo_pct_per_min: f64,
}

impl TieringConfig {
    /// The cold-age settings.
    pub fn ages(&self) -> AgeConfig {
        AgeConfig {
            adaptive: self.adaptive_age,
            min_s: self.cold_age_s,
            max_s: self.max_cold_age_s,
            slo_pct_per_min: self.promotion_slo_pct_per_min,
        }
    }
}

impl Default for TieringConfig {
    fn default() -> Self {
        TieringConfig {
            place: false,
            fast_node: None,
            slow_node: None,
            interval_s: 10.0,
            rate_mib_s: 128.0,
            margin_pct: 10.0,
            reserve_mib: 0,
            cold_age_s: AgeConfig::default().min_s,
            adaptive_age: AgeConfig::default().adaptive,
            max_cold_age_s: AgeConfig::default().max_s,
            promotion_slo_pct_per_min: AgeConfig::default().slo_pct_per_min,
        }
    }
}

/// Which VMs proactive reclaim serves, unless a VM's own `reclaim` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReclaimVms {
    /// None.
    Off,
    /// Those without a balloon device.
    Unballooned,
    /// All of them.
    All,
}

/// Proactive reclaim (`docs/tiering.md`): each VM's cold memory pushed out of its own
/// cgroup v2 with `memory.reclaim`, paced by its memory pressure and refaults.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReclaimConfig {
    /// Which VMs it serves (default: none).
    pub vms: ReclaimVms,
    /// The memory stall, in percent of time, up to which reclaim goes on.
    pub target_stall_pct: f64,
    /// The largest step, in percent of the VM's usage per second.
    pub step_pct_per_s: f64,
    /// Refaulted memory, in percent of usage per second, above which reclaim stops.
    pub refault_pct_per_s: f64,
    /// MiB kept above the VM's working-set estimate.
    pub floor_mib: u64,
    /// Where the cgroup v2 hierarchy is mounted.
    pub cgroup_root: PathBuf,
}

impl Default for ReclaimConfig {
    fn default() -> Self {
        let pace = PaceConfig::default();
        ReclaimConfig {
            vms: ReclaimVms::Off,
            target_stall_pct: pace.target_stall * 100.0,
            step_pct_per_s: pace.step_per_s * 100.0,
            refault_pct_per_s: pace.refault_per_s * 100.0,
            floor_mib: pace.floor.mib(),
            cgroup_root: "/sys/fs/cgroup".into(),
        }
    }
}

impl ReclaimConfig {
    /// The pacing settings.
    pub fn pace(&self) -> PaceConfig {
        PaceConfig {
            target_stall: self.target_stall_pct / 100.0,
            step_per_s: self.step_pct_per_s / 100.0,
            refault_per_s: self.refault_pct_per_s / 100.0,
            floor: Bytes::from_mib(self.floor_mib),
        }
    }
}

/// VM memory snapshots (`docs/snapshots.md`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SnapshotConfig {
    /// The store: a directory per VM, one per snapshot in it.
    pub dir: PathBuf,
    /// The longest a save or a restore may take, in seconds.
    pub timeout_s: u64,
}

impl Default for SnapshotConfig {
    fn default() -> Self {
        SnapshotConfig {
            dir: "/var/lib/memtide/snapshots".into(),
            timeout_s: 600,
        }
    }
}

/// The daemon's endpoints and timeouts.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DaemonConfig {
    /// Control socket for `memtide status` (created with mode 0600).
    pub socket: PathBuf,
    /// Address of the HTTP endpoint (`/metrics`, `/api/v1/status`); empty to disable.
    pub http: String,
    /// JSON-lines event log; empty to disable.
    pub event_log: PathBuf,
    /// What a restarted daemon must not forget (balloon targets, estimator state),
    /// rewritten atomically every tick; empty to disable. Not used in a dry run.
    pub state_file: PathBuf,
    /// Limit for every call to a hypervisor, in milliseconds.
    pub call_timeout_ms: u64,
    /// Record every snapshot and decision here (gzip JSON lines, for `memtide replay`);
    /// empty to disable.
    pub record_dir: PathBuf,
    /// Start a new recording file past this many compressed MiB.
    pub record_file_mib: u64,
    /// Recording files kept (the oldest are deleted).
    pub record_keep: usize,
}

/// Who besides root (and the daemon's own user) may use the control socket: its peer's
/// uid, or its peer's primary gid, as the kernel reports them (SO_PEERCRED). With either
/// list set the socket is created mode 0666, and this check is what refuses the others.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ControlConfig {
    /// User ids allowed.
    pub allow_uids: Vec<u32>,
    /// Group ids allowed (a peer's primary group).
    pub allow_gids: Vec<u32>,
}

/// Where the host's files are.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HostConfig {
    /// The procfs mount.
    pub proc: PathBuf,
    /// The sysfs mount.
    pub sys: PathBuf,
    /// A memory cgroup holding the VMs (v1 or v2 directory); unset: the whole host.
    pub domain_cgroup: Option<PathBuf>,
    /// Measure the guest memory each QEMU touches between ticks: `"damon"` by a kdamond
    /// of memtide's own per QEMU (sees KVM guests too; needs CONFIG_DAMON_SYSFS and
    /// CONFIG_DAMON_VADDR, root, and no kdamond of another tool), `"idle"` by idle page
    /// tracking (sees KVM guests too; needs CONFIG_IDLE_PAGE_TRACKING and root),
    /// `"clear_refs"` by /proc/PID/smaps and clear_refs (TCG only), `true` DAMON, else
    /// idle page tracking, where the host has them and clear_refs elsewhere, `false`
    /// none. Unset: `"clear_refs"` when a policy uses it (memtide, sampled, esx), else
    /// `false`.
    pub sample_access: Option<SampleAccess>,
    /// Seconds a page of guest RAM must go untouched to count as cold (DAMON and idle
    /// page tracking).
    pub cold_age_s: f64,
    /// After a VM's balloon gave memory back, collapse its hypervisor's resident guest
    /// RAM into huge pages again (`MADV_COLLAPSE`, Linux 6.1, CAP_SYS_NICE): the balloon
    /// leaves it in 4 KiB pages, which slows the guest.
    pub restore_huge_pages: bool,
}

/// `[host] sample_access`: `true`, `false`, `"damon"`, `"idle"` or `"clear_refs"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "SampleAccessText")]
pub enum SampleAccess {
    /// None (`false`).
    Off,
    /// DAMON, else idle page tracking, where the host has them; clear_refs elsewhere
    /// (`true`).
    Auto,
    /// DAMON only (`"damon"`).
    Damon,
    /// Idle page tracking only (`"idle"`).
    Idle,
    /// clear_refs only (`"clear_refs"`).
    ClearRefs,
}

/// What `sample_access` is written as.
#[derive(Deserialize)]
#[serde(
    untagged,
    expecting = "true, false, \"damon\", \"idle\" or \"clear_refs\" for the host-side access sampling"
)]
enum SampleAccessText {
    Bool(bool),
    Name(String),
}

impl TryFrom<SampleAccessText> for SampleAccess {
    type Error = String;

    fn try_from(text: SampleAccessText) -> Result<Self, Self::Error> {
        match text {
            SampleAccessText::Bool(false) => Ok(SampleAccess::Off),
            SampleAccessText::Bool(true) => Ok(SampleAccess::Auto),
            SampleAccessText::Name(n) if n == "damon" => Ok(SampleAccess::Damon),
            SampleAccessText::Name(n) if n == "idle" => Ok(SampleAccess::Idle),
            SampleAccessText::Name(n) if n == "clear_refs" => Ok(SampleAccess::ClearRefs),
            SampleAccessText::Name(n) => Err(format!(
                "unknown access sampling {n:?}: true, false, \"damon\", \"idle\" or \"clear_refs\""
            )),
        }
    }
}

/// Discovery of VMs by their QMP sockets.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DiscoveryConfig {
    /// Glob patterns of QMP sockets; a VM is named after its socket's file stem.
    pub qmp_glob: Vec<String>,
    /// A discovered VM's guest agent socket is its QMP socket with this extension
    /// (`web1.sock` → `web1.qga`), when that file exists; empty: no agents.
    pub agent_extension: String,
    /// Proxmox VE's VM configuration directory (`/etc/pve/qemu-server`): a VM found
    /// through `qmp_glob` is named by its VMID (`101.sock`), and its `memory`, `balloon`
    /// and `shares` there are its bounds and shares, as PVE's own auto-ballooning would
    /// use them (`docs/connectors/proxmox.md`). Unset: not a Proxmox host.
    pub pve_config_dir: Option<PathBuf>,
}

/// libvirt connections.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LibvirtConfig {
    /// Connection URIs (`qemu:///system`); every running domain on them is managed, by
    /// its domain name.
    pub uris: Vec<String>,
    /// Also manage the VMs of KubeVirt's virt-launcher pods on this node, each through its
    /// pod's own libvirt daemon, found through `[host] proc` (memtide runs with the host's
    /// PID namespace: `docs/connectors/kubevirt.md`).
    pub kubevirt: bool,
    /// KubeVirt VMs take their bounds from their launcher pods: the pod's memory request
    /// as the VM's minimum, its limit as its maximum, listed from the Kubernetes API
    /// server with the pod's service account (needs `kubevirt`, and the node's name in
    /// `NODE_NAME`).
    pub kubevirt_pod_bounds: bool,
    /// Seconds between two lists of the node's launcher pods.
    pub kubevirt_pod_refresh_s: f64,
}

impl Default for LibvirtConfig {
    fn default() -> LibvirtConfig {
        LibvirtConfig {
            uris: Vec::new(),
            kubevirt: false,
            kubevirt_pod_bounds: false,
            kubevirt_pod_refresh_s: 30.0,
        }
    }
}

/// Discovery of VMs by their API sockets (Firecracker, Cloud Hypervisor).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SocketDiscovery {
    /// Glob patterns of API sockets; a VM is named after its socket's file stem.
    pub socket_glob: Vec<String>,
}

/// Bounds applied to VMs that do not set their own.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VmDefaults {
    /// Never balloon a guest below this many MiB.
    pub min_mib: u64,
    /// Relative weight when memory is divided.
    pub shares: u32,
}

/// One VM named in the configuration.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmConfig {
    /// Its name.
    pub name: String,
    /// Its QMP socket (QEMU).
    pub qmp: Option<PathBuf>,
    /// The libvirt URI of its domain, named `name` there.
    pub libvirt: Option<String>,
    /// Its Firecracker API socket.
    pub firecracker: Option<PathBuf>,
    /// Its Cloud Hypervisor API socket.
    pub cloud_hypervisor: Option<PathBuf>,
    /// Its guest agent socket (QEMU's chardev for `org.qemu.guest_agent.0`), if any.
    pub agent: Option<PathBuf>,
    /// Never balloon below this many MiB.
    pub min_mib: Option<u64>,
    /// Never give more than this many MiB (default: its configured size).
    pub max_mib: Option<u64>,
    /// Relative weight when memory is divided.
    pub shares: Option<u32>,
    /// This VM's own policy (a built-in name or a policy file), instead of the host's.
    pub policy: Option<String>,
    /// The command line that starts its hypervisor (program first), for `memtide
    /// snapshot restore`: for a VM reached through `qmp`, its QEMU (memtide adds
    /// `-incoming defer` and a monitor of its own); through `firecracker` or
    /// `cloud_hypervisor`, a VMM process serving the configured API socket, with no VM
    /// yet (memtide loads the snapshot into it). libvirt domains need none.
    pub launch: Option<Vec<String>>,
    /// The command line that starts a clone of the VM (`memtide snapshot clone`): as
    /// `launch`, with `{n}` (the clone's number, or `template`) in each path that must
    /// be the clone's own — its QMP socket, disks, console. memtide adds the RAM backend
    /// the clones share, `-incoming defer` and a monitor of its own.
    pub clone_launch: Option<Vec<String>>,
    /// Hibernate the VM (save it, then quit its QEMU) once it has been idle this many
    /// seconds while the host is short of memory (`[hibernate]`); needs `launch` (but
    /// for a libvirt domain), so that `memtide snapshot restore` can wake it. Unset: never.
    pub hibernate_after_s: Option<u64>,
    /// Save a snapshot of the VM (it runs on) every this many seconds, for rolling back.
    /// Unset: never.
    pub snapshot_every_s: Option<u64>,
    /// Snapshots taken every `snapshot_every_s` kept (the oldest deleted; hibernations
    /// and snapshots taken by hand are never deleted).
    #[serde(default = "default_snapshot_keep")]
    pub snapshot_keep: usize,
    /// Restore the VM from its newest good snapshot when its QEMU dies by itself (a
    /// crash, a SIGKILL: no `SHUTDOWN` announced, not hibernated), at most `[recovery]
    /// max_restores` times within `window_s`; needs `qmp`, `launch` and
    /// `snapshot_every_s`.
    #[serde(default)]
    pub restore_on_crash: bool,
    /// Times of day (`HH:MM` or `HH:MM:SS`, UTC) at which the VM, if it is hibernated, is
    /// woken (as by `memtide snapshot restore`); needs `launch` (but for a libvirt domain).
    #[serde(default)]
    pub wake_at: Vec<TimeOfDay>,
    /// Reclaim its memory proactively (`[reclaim]`), or never, whatever `[reclaim] vms`
    /// says.
    pub reclaim: Option<bool>,
    /// Its cgroup v2 directory for reclaim; unset: the cgroup its QEMU process is in,
    /// which must hold that process alone.
    pub reclaim_cgroup: Option<PathBuf>,
    /// The most of its memory the fast tier holds (`[tiering]`), in MiB; unset: its hot
    /// set plus `[tiering] margin_pct`, and a share of spare fast memory.
    pub fast_budget_mib: Option<u64>,
    /// `false`: its memory is left where it is by tier placement (`[tiering] place`),
    /// which places every other VM.
    #[serde(default = "placed")]
    pub place: bool,
    /// A process to place (`[tiering]`) in place of a hypervisor connection: a VM named
    /// by `pid` alone is neither sampled nor ballooned, only placed.
    pub pid: Option<i32>,
}

fn default_snapshot_keep() -> usize {
    3
}

fn placed() -> bool {
    true
}

impl Default for Config {
    fn default() -> Self {
        Config {
            interval_s: 2.0,
            policy: "memtide".into(),
            policy_dir: None,
            daemon: DaemonConfig::default(),
            control: ControlConfig::default(),
            host: HostConfig::default(),
            discovery: DiscoveryConfig::default(),
            libvirt: LibvirtConfig::default(),
            firecracker: SocketDiscovery::default(),
            cloud_hypervisor: SocketDiscovery::default(),
            defaults: VmDefaults::default(),
            vms: Vec::new(),
            engine: EngineConfig::default(),
            mom: MomConfig::default(),
            ksm: KsmConfig::default(),
            working_set: WorkingSetConfig::default(),
            memtide: FusedConfig::default(),
            tws: TwsConfig::default(),
            selfballoon: SelfBalloonConfig::default(),
            sampled: SampledConfig::default(),
            esx: EsxConfig::default(),
            proxmox: ProxmoxConfig::default(),
            snapshots: SnapshotConfig::default(),
            hibernate: HibernateConfig::default(),
            recovery: RecoveryConfig::default(),
            reclaim: ReclaimConfig::default(),
            tiering: TieringConfig::default(),
        }
    }
}

impl Default for DaemonConfig {
    fn default() -> Self {
        DaemonConfig {
            socket: "/run/memtide/memtide.sock".into(),
            http: "127.0.0.1:9315".into(),
            event_log: "/var/log/memtide/events.jsonl".into(),
            state_file: "/var/lib/memtide/state.json".into(),
            call_timeout_ms: 2000,
            record_dir: PathBuf::new(),
            record_file_mib: 64,
            record_keep: 8,
        }
    }
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            proc: "/proc".into(),
            sys: "/sys".into(),
            domain_cgroup: None,
            sample_access: None,
            cold_age_s: 120.0,
            restore_huge_pages: true,
        }
    }
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        DiscoveryConfig {
            qmp_glob: vec!["/run/memtide/qmp/*.sock".into()],
            agent_extension: "qga".into(),
            pve_config_dir: None,
        }
    }
}

impl Default for VmDefaults {
    fn default() -> Self {
        VmDefaults {
            min_mib: 128,
            shares: 1000,
        }
    }
}

/// What `run` takes from the configuration, converted to what it uses. Checking a
/// configuration makes this conversion, so one that passes `check-config` starts.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Between two ticks.
    pub interval: Duration,
    /// The HTTP endpoint, if on.
    pub http: Option<SocketAddr>,
    /// Recording, if on.
    pub record: Option<RecorderConfig>,
}

/// Shortest tick interval, in seconds.
const MIN_INTERVAL_S: f64 = 0.1;
/// Longest tick interval, in seconds: an hour (decisions made less often manage nothing).
const MAX_INTERVAL_S: f64 = 3600.0;
/// Longest call timeout, in milliseconds (an hour).
const MAX_CALL_TIMEOUT_MS: u64 = 3_600_000;
/// Longest duration in the file (`*_s`), in seconds: a day. The estimators add and
/// double their cool-downs, which must not overflow.
const MAX_DURATION_S: f64 = 86_400.0;

/// A field whose value cannot be used, and why.
#[derive(Debug, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    /// The field, e.g. `vm[1].min_mib`.
    pub field: String,
    /// Why.
    pub message: String,
}

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: {error}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        error: std::io::Error,
    },
    /// The file is not valid TOML or has unknown or mistyped fields.
    #[error("{path}: {message}")]
    Syntax {
        /// The file.
        path: String,
        /// The parser's message (with line, column and field).
        message: String,
    },
    /// A field has a value that cannot work.
    #[error("{path}: {field}: {message}")]
    Invalid {
        /// The file.
        path: String,
        /// The field, e.g. `vm[1].min_mib`.
        field: String,
        /// Why.
        message: String,
    },
}

impl Config {
    /// Read and check a configuration file. Policy files and directories it names by a
    /// relative path are found from the file's own directory, whatever directory memtide
    /// runs in (`check-config` by hand, the daemon from `/`).
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let display = path.display().to_string();
        let text = crate::text_file::read(path).map_err(|error| ConfigError::Read {
            path: display.clone(),
            error,
        })?;
        Config::parse_in(&text, &display, path.parent().unwrap_or(Path::new("")))
    }

    /// Parse and check configuration text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        Config::parse_in(text, origin, Path::new(""))
    }

    /// [`Config::parse`] of text whose relative policy paths are from `base`.
    fn parse_in(text: &str, origin: &str, base: &Path) -> Result<Config, ConfigError> {
        let mut config: Config = toml::from_str(text).map_err(|e| ConfigError::Syntax {
            path: origin.to_string(),
            message: e.to_string().trim_end().to_string(),
        })?;
        config.policy = policy_from(base, &config.policy);
        config.policy_dir = config.policy_dir.map(|dir| base.join(dir));
        for vm in &mut config.vms {
            vm.policy = vm.policy.as_deref().map(|p| policy_from(base, p));
        }
        let table: toml::Table = toml::from_str(text).expect("parsed above");
        config
            .validate()
            .and_then(|()| check_numbers(&table, ""))
            .and_then(
                |()| match table.contains_key("policy") && config.policy_dir.is_some() {
                    true => bad("policy_dir", "set policy or policy_dir, not both".into()),
                    false => Ok(()),
                },
            )
            .map_err(|FieldError { field, message }| ConfigError::Invalid {
                path: origin.to_string(),
                field,
                message,
            })?;
        Ok(config)
    }

    /// Convert what `run` uses, or say which field it cannot use.
    pub fn settings(&self) -> Result<Settings, FieldError> {
        if !(MIN_INTERVAL_S..=MAX_INTERVAL_S).contains(&self.interval_s) {
            let message = format!(
                "{} is not a number of seconds from {MIN_INTERVAL_S} to {MAX_INTERVAL_S}",
                self.interval_s
            );
            return bad("interval_s", message);
        }
        if !(1..=MAX_CALL_TIMEOUT_MS).contains(&self.daemon.call_timeout_ms) {
            let message = format!(
                "{} is not a number of milliseconds from 1 to {MAX_CALL_TIMEOUT_MS}",
                self.daemon.call_timeout_ms
            );
            return bad("daemon.call_timeout_ms", message);
        }
        let lv = &self.libvirt;
        if lv.kubevirt_pod_bounds && !lv.kubevirt {
            let message = "KubeVirt VMs' bounds come with kubevirt = true".to_string();
            return bad("libvirt.kubevirt_pod_bounds", message);
        }
        if !(1.0..=3600.0).contains(&lv.kubevirt_pod_refresh_s) {
            let message = format!(
                "{} is not a number of seconds from 1 to 3600",
                lv.kubevirt_pod_refresh_s
            );
            return bad("libvirt.kubevirt_pod_refresh_s", message);
        }
        let http = match self.daemon.http.as_str() {
            "" => None,
            http => match http.parse::<SocketAddr>() {
                Ok(addr) => Some(addr),
                Err(e) => {
                    return bad(
                        "daemon.http",
                        format!("{http:?} is not an address:port ({e})"),
                    )
                }
            },
        };
        let d = &self.daemon;
        // Recordings are files in a directory, made where there is none: a file in its
        // place fails `run` ("File exists").
        if !d.record_dir.as_os_str().is_empty() {
            let why = match std::fs::metadata(&d.record_dir) {
                Ok(m) if !m.is_dir() => Some("a file, not a directory"),
                Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => {
                    Some("below a file, where no directory can be made")
                }
                _ => None,
            };
            if let Some(why) = why {
                let message = format!(
                    "{} is {why}: recordings are written as files into a directory",
                    d.record_dir.display()
                );
                return bad("daemon.record_dir", message);
            }
        }
        let record = match d.record_dir.as_os_str().is_empty() {
            true => None,
            false => match d.record_file_mib.checked_mul(1 << 20).filter(|b| *b > 0) {
                Some(max_file_bytes) => Some(RecorderConfig {
                    max_file_bytes,
                    keep_files: d.record_keep,
                }),
                None => {
                    let message = format!("{} is not a number of MiB", d.record_file_mib);
                    return bad("daemon.record_file_mib", message);
                }
            },
        };
        Ok(Settings {
            interval: Duration::from_secs_f64(self.interval_s),
            http,
            record,
        })
    }

    fn validate(&self) -> Result<(), FieldError> {
        self.settings()?;
        let cold_age = self.host.cold_age_s;
        if !(cold_age.is_finite() && cold_age > 0.0 && cold_age <= 86_400.0) {
            return bad(
                "host.cold_age_s",
                format!("{cold_age} is not a number of seconds (0, 86400]"),
            );
        }
        let (ample, short) = (self.memtide.ample_free, self.memtide.short_free);
        if !(ample.is_finite() && short.is_finite() && (0.0..=ample).contains(&short)) {
            return bad(
                "memtide.short_free",
                format!("{short} must be between 0 and ample_free {ample}"),
            );
        }
        let share = self.memtide.touched_share;
        if !(share > 0.0 && share <= 1.0) {
            return bad(
                "memtide.touched_share",
                format!("{share} must be in (0, 1]"),
            );
        }
        if self.memtide.touched_samples == 0 {
            let message = "0: at least 1 (with none, host-side access sampling would bound \
                           nothing)";
            return bad("memtide.touched_samples", message.into());
        }
        let fill = self.memtide.fill_s;
        if !(fill.is_finite() && fill >= 0.0) {
            return bad(
                "memtide.fill_s",
                format!("{fill} is not a number of seconds"),
            );
        }
        let wait = self.memtide.report_wait_s;
        if !(0.0..=3600.0).contains(&wait) {
            return bad(
                "memtide.report_wait_s",
                format!("{wait} is not a number of seconds [0, 3600]"),
            );
        }
        if let Some(share) = self.working_set.host_reserve {
            if !(0.0..=0.5).contains(&share) {
                return bad(
                    "working_set.host_reserve",
                    format!("{share} must be a share of the domain in [0, 0.5]"),
                );
            }
        }
        let share = self.working_set.host_swap_share;
        if !(0.0..=1.0).contains(&share) {
            return bad(
                "working_set.host_swap_share",
                format!("{share} must be a share of the host's free swap in [0, 1]"),
            );
        }
        let p = &self.proxmox;
        if !(p.goal_used > 0.0 && p.goal_used <= 1.0) {
            return bad(
                "proxmox.goal_used",
                format!("{} must be in (0, 1]", p.goal_used),
            );
        }
        if !(p.cycle_s.is_finite() && p.cycle_s > 0.0 && p.cycle_s <= 86_400.0) {
            return bad(
                "proxmox.cycle_s",
                format!("{} is not a number of seconds", p.cycle_s),
            );
        }
        if !(p.starving.is_finite() && p.starving >= 0.0) {
            return bad(
                "proxmox.starving",
                format!("{} must be a share ≥ 0", p.starving),
            );
        }
        self.check_policy_constants()?;
        if self.defaults.shares == 0 {
            return bad("defaults.shares", SHARES_AT_LEAST_1.into());
        }
        if self.daemon.record_keep == 0 && !self.daemon.record_dir.as_os_str().is_empty() {
            let message = "0: at least 1, the file being written".to_string();
            return bad("daemon.record_keep", message);
        }
        // Relative, they would be found from whatever directory memtide runs in (the
        // daemon from /, `memtide status` from the operator's).
        let paths = [
            ("daemon.socket", &self.daemon.socket),
            ("snapshots.dir", &self.snapshots.dir),
            ("host.proc", &self.host.proc),
            ("host.sys", &self.host.sys),
        ];
        for (field, path) in paths {
            if !path.is_absolute() {
                return bad(field, format!("{path:?} is not an absolute path"));
            }
        }
        let extension = &self.discovery.agent_extension;
        if extension.contains('/') || extension.starts_with('.') {
            let message = format!(
                "{extension:?} is not a file name extension (web1.sock's agent at web1.qga: \
                 \"qga\"; \"\" for none)"
            );
            return bad("discovery.agent_extension", message);
        }
        // The agent's socket would be the QMP socket itself.
        let suffix = format!(".{extension}");
        let qmp = |glob: &&String| !extension.is_empty() && glob.ends_with(&suffix);
        if let Some(glob) = self.discovery.qmp_glob.iter().find(qmp) {
            let message = format!(
                "{extension:?} is the extension of the QMP sockets {glob:?} finds: each VM's \
                 guest agent would be looked for at its QMP socket"
            );
            return bad("discovery.agent_extension", message);
        }
        if let PolicySource::Builtin(name) = self.policy_source() {
            if !crate::policies::BUILTIN.contains(&name.as_str()) {
                return bad("policy", crate::policies::unknown(&name));
            }
        }
        let globs = [
            ("discovery.qmp_glob", &self.discovery.qmp_glob),
            ("firecracker.socket_glob", &self.firecracker.socket_glob),
            (
                "cloud_hypervisor.socket_glob",
                &self.cloud_hypervisor.socket_glob,
            ),
        ];
        for (field, patterns) in globs {
            for (i, pattern) in patterns.iter().enumerate() {
                if let Err(e) = glob::Pattern::new(pattern) {
                    return bad(&format!("{field}[{i}]"), format!("{pattern:?}: {e}"));
                }
            }
        }
        if self.libvirt.kubevirt && !cfg!(feature = "libvirt") {
            let message = "this memtide was built without libvirt support (cargo feature \
                           `libvirt`), through which KubeVirt VMs are reached";
            return bad("libvirt.kubevirt", message.into());
        }
        let uris = self.libvirt.uris.iter().map(Some);
        let vm_uris = self.vms.iter().map(|vm| vm.libvirt.as_ref());
        for (i, uri) in uris.chain(vm_uris).enumerate() {
            let Some(uri) = uri else { continue };
            let field = match i.checked_sub(self.libvirt.uris.len()) {
                None => format!("libvirt.uris[{i}]"),
                Some(vm) => format!("vm[{vm}].libvirt"),
            };
            if !uri.contains(':') {
                return bad(
                    &field,
                    format!("{uri:?} is not a libvirt URI (e.g. qemu:///system)"),
                );
            }
            if !cfg!(feature = "libvirt") {
                let message =
                    "this memtide was built without libvirt support (cargo feature `libvirt`)";
                return bad(&field, message.into());
            }
        }
        for (i, vm) in self.vms.iter().enumerate() {
            match &vm.launch {
                Some(launch) if launch.first().is_none_or(String::is_empty) => {
                    return bad(&format!("vm[{i}].launch"), "an empty command".into())
                }
                Some(_) if vm.libvirt.is_some() => {
                    let message = "libvirt starts its domains itself: memtide restores one \
                                   through libvirt, with no launch command";
                    return bad(&format!("vm[{i}].launch"), message.into());
                }
                _ => {}
            }
            if vm.snapshot_every_s.is_some_and(|s| s < 10) {
                let message = "must be at least 10 seconds: each save stops the guest".into();
                return bad(&format!("vm[{i}].snapshot_every_s"), message);
            }
            if vm.snapshot_keep == 0 {
                return bad(
                    &format!("vm[{i}].snapshot_keep"),
                    "must be at least 1".into(),
                );
            }
            if let Some(clone) = &vm.clone_launch {
                if vm.qmp.is_none() {
                    let message = "only a VM reached through `qmp` is cloned by memtide".into();
                    return bad(&format!("vm[{i}].clone_launch"), message);
                }
                if clone.first().is_none_or(String::is_empty) {
                    return bad(&format!("vm[{i}].clone_launch"), "an empty command".into());
                }
                if !clone.iter().any(|a| a.contains("{n}")) {
                    let message =
                        "no `{n}`: every clone would take the same sockets and disks".into();
                    return bad(&format!("vm[{i}].clone_launch"), message);
                }
            }
            if vm.restore_on_crash {
                let missing = [
                    ("qmp", vm.qmp.is_some()),
                    ("launch", vm.launch.is_some()),
                    ("snapshot_every_s", vm.snapshot_every_s.is_some()),
                ];
                if let Some((key, _)) = missing.iter().find(|(_, set)| !set) {
                    let message = format!(
                        "needs `{key}`: memtide restores a QEMU reached through `qmp`, by \
                         its `launch` command, from the snapshots it takes on a schedule"
                    );
                    return bad(&format!("vm[{i}].restore_on_crash"), message);
                }
            }
            let wakes = [
                ("hibernate_after_s", vm.hibernate_after_s.is_some()),
                ("wake_at", !vm.wake_at.is_empty()),
            ];
            for (key, set) in wakes {
                if set && vm.launch.is_none() && vm.libvirt.is_none() {
                    let message = "needs `launch`: a hibernated VM is woken by starting it again";
                    return bad(&format!("vm[{i}].{key}"), message.into());
                }
            }
        }
        let r = &self.reclaim;
        let pcts = [
            ("reclaim.target_stall_pct", r.target_stall_pct),
            ("reclaim.step_pct_per_s", r.step_pct_per_s),
            ("reclaim.refault_pct_per_s", r.refault_pct_per_s),
        ];
        for (field, pct) in pcts {
            if !(pct > 0.0 && pct <= 100.0) {
                return bad(field, format!("{pct} must be a percentage in (0, 100]"));
            }
        }
        self.check_tiering()?;
        let h = &self.hibernate;
        if !(h.idle_cpu > 0.0 && h.idle_cpu <= 1.0) {
            return bad(
                "hibernate.idle_cpu",
                format!("{} must be a share of one CPU in (0, 1]", h.idle_cpu),
            );
        }
        if !(0.0..=1.0).contains(&h.free_below) {
            return bad(
                "hibernate.free_below",
                format!("{} must be a share in [0, 1]", h.free_below),
            );
        }
        if !(1..=31_536_000).contains(&self.recovery.window_s) {
            let message = format!("{} is not 1 to 31536000 seconds", self.recovery.window_s);
            return bad("recovery.window_s", message);
        }
        if !(0.0..1.0).contains(&self.recovery.reserve) {
            let message = format!("{} must be a share in [0, 1)", self.recovery.reserve);
            return bad("recovery.reserve", message);
        }
        if !(1..=86_400).contains(&self.snapshots.timeout_s) {
            let message = format!("{} is not 1 to 86400 seconds", self.snapshots.timeout_s);
            return bad("snapshots.timeout_s", message);
        }
        let ids = [
            ("control.allow_uids", &self.control.allow_uids),
            ("control.allow_gids", &self.control.allow_gids),
        ];
        for (field, ids) in ids {
            if let Some(i) = ids.iter().position(|id| *id == u32::MAX) {
                return bad(
                    &format!("{field}[{i}]"),
                    "4294967295 is (uid_t)-1, no user or group".into(),
                );
            }
        }
        let sections = [
            ("engine", self.engine.validate()),
            ("mom", self.mom.validate()),
            ("ksm", self.ksm.validate()),
        ];
        for (section, result) in sections {
            if let Err(e) = result {
                let (field, message) = e.split_once(": ").unwrap_or(("", &e));
                return bad(&format!("{section}.{field}"), message.to_string());
            }
        }
        let mut names = std::collections::HashSet::new();
        let mut pids: std::collections::HashMap<i32, &str> = std::collections::HashMap::new();
        let mut sockets: std::collections::HashMap<&Path, &str> = std::collections::HashMap::new();
        for (i, vm) in self.vms.iter().enumerate() {
            let field = |f: &str| format!("vm[{i}].{f}");
            if vm.name.is_empty() || vm.name.chars().any(|c| c.is_control() || c == '/') {
                return bad(
                    &field("name"),
                    format!("{:?} is not a usable VM name", vm.name),
                );
            }
            if !names.insert(&vm.name) {
                return bad(&field("name"), format!("{:?} is named twice", vm.name));
            }
            if vm.shares == Some(0) {
                return bad(&field("shares"), SHARES_AT_LEAST_1.into());
            }
            let endpoints = [
                vm.qmp.is_some(),
                vm.libvirt.is_some(),
                vm.firecracker.is_some(),
                vm.cloud_hypervisor.is_some(),
            ];
            match (endpoints.iter().filter(|e| **e).count(), vm.pid) {
                (1, None) => {}
                (0, Some(pid)) => {
                    self.check_placed_only(i, vm, pid)?;
                    if let Some(other) = pids.insert(pid, &vm.name) {
                        let message = format!(
                            "process {pid} is given to VMs {other:?} and {:?}: a process is \
                             placed as one VM",
                            vm.name
                        );
                        return bad(&field("pid"), message);
                    }
                }
                (_, Some(_)) => {
                    let message = "a VM given by `pid` is only placed: a hypervisor connection \
                                   gives its own process";
                    return bad(&field("pid"), message.into());
                }
                _ => {
                    let message = "give exactly one of qmp, libvirt, firecracker, \
                                   cloud_hypervisor (or `pid` for a process only placed)";
                    return bad(&field("qmp"), message.into());
                }
            }
            // Relative, a socket would be found from the daemon's working directory (found
            // by an audit: `qmp = ""` was accepted, and failed at every connection with
            // "Invalid argument" naming no key).
            let hypervisor = [
                ("qmp", &vm.qmp),
                ("firecracker", &vm.firecracker),
                ("cloud_hypervisor", &vm.cloud_hypervisor),
            ];
            for (name, path) in hypervisor.iter().chain([("agent", &vm.agent)].iter()) {
                if let Some(path) = path.as_deref().filter(|p| !p.is_absolute()) {
                    return bad(&field(name), format!("{path:?} is not an absolute path"));
                }
            }
            if vm.agent.is_some() && vm.agent == vm.qmp {
                let message = "the same socket as qmp: the guest agent has a socket of its own";
                return bad(&field("agent"), message.into());
            }
            let socket = hypervisor
                .iter()
                .find_map(|(name, socket)| Some((*name, socket.as_deref()?)));
            if let Some((name, socket)) = socket {
                if let Some(other) = sockets.insert(socket, &vm.name) {
                    let message = format!(
                        "{} is given to VMs {other:?} and {:?}: one socket reaches one VM",
                        socket.display(),
                        vm.name
                    );
                    return bad(&field(name), message);
                }
            }
            if vm.agent.is_some() && vm.qmp.is_none() {
                return bad(
                    &field("agent"),
                    "an agent socket goes with qmp (libvirt reaches the agent itself)".into(),
                );
            }
            if let Some(PolicySource::Builtin(name)) = vm
                .policy
                .as_deref()
                .map(|p| PolicySource::from_config(p, None))
            {
                if !crate::policies::BUILTIN.contains(&name.as_str()) {
                    return bad(&field("policy"), crate::policies::unknown(&name));
                }
            }
            let min = vm.min_mib.unwrap_or(self.defaults.min_mib);
            if let Some(max) = vm.max_mib.filter(|max| *max < min) {
                return bad(&field("max_mib"), format!("{max} is below min_mib {min}"));
            }
        }
        Ok(())
    }

    /// `[tiering]`'s settings.
    fn check_tiering(&self) -> Result<(), FieldError> {
        let t = &self.tiering;
        if !(MIN_INTERVAL_S..=MAX_INTERVAL_S).contains(&t.interval_s) {
            let message = format!(
                "{} is not a number of seconds from {MIN_INTERVAL_S} to {MAX_INTERVAL_S}",
                t.interval_s
            );
            return bad("tiering.interval_s", message);
        }
        if !(t.rate_mib_s.is_finite() && t.rate_mib_s > 0.0) {
            let message = format!("{} is not a number of MiB a second above 0", t.rate_mib_s);
            return bad("tiering.rate_mib_s", message);
        }
        if !(0.0..=1000.0).contains(&t.margin_pct) {
            let message = format!("{} must be a percentage in [0, 1000]", t.margin_pct);
            return bad("tiering.margin_pct", message);
        }
        if !(0.0..=86_400.0).contains(&t.cold_age_s) {
            let message = format!("{} is not a number of seconds in [0, 86400]", t.cold_age_s);
            return bad("tiering.cold_age_s", message);
        }
        // The most only bounds an age that adapts (review: a fixed `cold_age_s` above the
        // default most was refused).
        if t.adaptive_age && !(t.cold_age_s..=86_400.0).contains(&t.max_cold_age_s) {
            let message = format!(
                "{} is not a number of seconds from cold_age_s ({}) to 86400",
                t.max_cold_age_s, t.cold_age_s
            );
            return bad("tiering.max_cold_age_s", message);
        }
        // Access tracking counts a page's age in scans, up to `MAX_AGE_SCANS`: an age the
        // scans cannot span would stop all demotion (found in review: 0.1 s scans span
        // 6 553 s, and an age that grew past it demoted nothing for hours).
        let longest = t.ages().horizon_s();
        if let Some(why) = memtide_adapters::access::age_beyond_scans(t.interval_s, longest) {
            return bad("tiering.interval_s", format!("{} s {why}", t.interval_s));
        }
        let slo = t.promotion_slo_pct_per_min;
        if !((0.0..=100.0).contains(&slo) && slo != 0.0) {
            let message =
                format!("{slo} is not a percentage of the working set a minute in (0, 100]");
            return bad("tiering.promotion_slo_pct_per_min", message);
        }
        if let (Some(fast), Some(slow)) = (t.fast_node, t.slow_node) {
            if fast == slow {
                let message = format!("node {slow} is the fast node too");
                return bad("tiering.slow_node", message);
            }
        }
        // Two trackers clearing the same pages' accessed bits (idle page tracking's
        // marks, DAMON's checks) each miss the accesses made between the other's scan
        // and their own: pages look colder than they are, and hot ones are demoted.
        if t.place && matches!(self.sample_access(), AccessSampling::Tracked { .. }) {
            let message = "placement tracks guest pages by page tracking, and so does \
                           this sampling: each would miss the accesses the other clears; set \
                           sample_access = \"clear_refs\" or false while [tiering] place is on";
            return bad("host.sample_access", message.into());
        }
        Ok(())
    }

    /// VM `i`, given by `pid` alone: only placed, so it needs `[tiering] place`, and
    /// nothing that needs a hypervisor connection.
    fn check_placed_only(&self, i: usize, vm: &VmConfig, pid: i32) -> Result<(), FieldError> {
        let field = |f: &str| format!("vm[{i}].{f}");
        if pid <= 0 {
            return bad(&field("pid"), format!("{pid} is not a process id"));
        }
        if pid == 1 {
            let message = "1 is init, not a VM's process".to_string();
            return bad(&field("pid"), message);
        }
        if !self.tiering.place {
            let message = "a VM given by `pid` is only placed: set [tiering] place = true";
            return bad(&field("pid"), message.into());
        }
        if !vm.place {
            let message = "a VM given by `pid` is only placed: place = false leaves it nothing";
            return bad(&field("place"), message.into());
        }
        let connected = [
            ("agent", vm.agent.is_some()),
            ("launch", vm.launch.is_some()),
            ("clone_launch", vm.clone_launch.is_some()),
            ("hibernate_after_s", vm.hibernate_after_s.is_some()),
            ("snapshot_every_s", vm.snapshot_every_s.is_some()),
            ("restore_on_crash", vm.restore_on_crash),
            ("wake_at", !vm.wake_at.is_empty()),
            ("reclaim", vm.reclaim.is_some()),
            ("reclaim_cgroup", vm.reclaim_cgroup.is_some()),
            ("policy", vm.policy.is_some()),
        ];
        if let Some((key, _)) = connected.iter().find(|(_, set)| *set) {
            let message = "a VM given by `pid` is only placed: this needs a hypervisor \
                           connection (qmp, libvirt, firecracker, cloud_hypervisor)";
            return bad(&field(key), message.into());
        }
        Ok(())
    }

    /// The built-in policies' constants, each within what its policy can use: shares of a
    /// guest's or the host's memory and steps in [0, 1] (ESX's growth any share ≥ 0),
    /// averaging weights in (0, 1], ESX's state thresholds not falling from low to high,
    /// its idle tax below 1, the hysteresis divisors at least 1.
    fn check_policy_constants(&self) -> Result<(), FieldError> {
        let (e, m, t) = (&self.esx, &self.memtide, &self.tws);
        let shares = [
            ("esx.high", e.high),
            ("esx.soft", e.soft),
            ("esx.hard", e.hard),
            ("esx.low", e.low),
            ("selfballoon.reserve", self.selfballoon.reserve),
            ("tws.reset_change", t.reset_change),
            ("memtide.margin", m.margin),
            ("memtide.probe_step", m.probe_step),
            ("memtide.probe_fast_step", m.probe_fast_step),
            ("memtide.inflation_fault_noise", m.inflation_fault_noise),
            ("memtide.fault_noise", m.fault_noise),
            ("memtide.low_swap", m.low_swap),
            ("memtide.rebase_change", m.rebase_change),
        ];
        for (field, v) in shares {
            if !(0.0..=1.0).contains(&v) {
                return bad(field, format!("{v} must be a share in [0, 1]"));
            }
        }
        // Steps of a guest's size a decision moves it by (0: that move is off); ESX's
        // growth is capped at the guest's entitlement, so any step of it is meaningful.
        let steps = [
            ("esx.soft_step", e.soft_step),
            ("esx.hard_step", e.hard_step),
            ("esx.low_step", e.low_step),
            ("tws.fast_step", t.fast_step),
            ("tws.slow_step", t.slow_step),
            ("memtide.backoff_step", m.backoff_step),
            ("memtide.backoff_max", m.backoff_max),
        ];
        for (field, v) in steps {
            if !(0.0..=1.0).contains(&v) {
                return bad(field, format!("{v} must be a share of the guest in [0, 1]"));
            }
        }
        if !(e.grow_step.is_finite() && e.grow_step >= 0.0) {
            return bad(
                "esx.grow_step",
                format!("{} must be a share ≥ 0", e.grow_step),
            );
        }
        // Averaging weights: 0 would never take in a new window.
        let weights = [
            ("esx.sampling.fast_weight", e.sampling.fast_weight),
            ("esx.sampling.slow_weight", e.sampling.slow_weight),
            ("sampled.fast_weight", self.sampled.fast_weight),
            ("sampled.slow_weight", self.sampled.slow_weight),
        ];
        for (field, v) in weights {
            if !(v > 0.0 && v <= 1.0) {
                return bad(field, format!("{v} must be in (0, 1]"));
            }
        }
        // Equal thresholds skip a state; a lower one above a higher one is no scale.
        if !(e.low <= e.hard && e.hard <= e.soft && e.soft <= e.high) {
            let message = format!(
                "the states' free shares must rise: low {} ≤ hard {} ≤ soft {} ≤ high {}",
                e.low, e.hard, e.soft, e.high
            );
            return bad("esx", message);
        }
        if !(0.0..1.0).contains(&e.idle_tax) {
            let message = format!(
                "{} must be in [0, 1): at 1 idle memory costs without bound",
                e.idle_tax
            );
            return bad("esx.idle_tax", message);
        }
        let hysteresis = [
            (
                "selfballoon.down_hysteresis",
                self.selfballoon.down_hysteresis,
            ),
            ("selfballoon.up_hysteresis", self.selfballoon.up_hysteresis),
        ];
        for (field, v) in hysteresis {
            if v == 0 {
                return bad(
                    field,
                    "0: at least 1 (1 closes the whole gap at once)".into(),
                );
            }
        }
        if !(0.0..=100.0).contains(&m.psi_threshold) {
            let message = format!("{} is not a percentage of time", m.psi_threshold);
            return bad("memtide.psi_threshold", message);
        }
        Ok(())
    }

    /// This configuration with the policy of `fresh`, the file read again at a reload:
    /// `policy`, `policy_dir`, the policies' own sections (`[memtide]`, `[mom]`, `[ksm]`,
    /// `[working_set]`, `[tws]`, `[selfballoon]`, `[sampled]`, `[esx]`, `[proxmox]`),
    /// and each VM's `policy`, `min_mib`, `max_mib` and `shares` with `[defaults]`, where
    /// the VMs are otherwise the same. With it, what else
    /// differs in `fresh`, and host-side access sampling where the new policy's differs
    /// from `sampling`, the one in force (set up at start): settings a running daemon does
    /// not change, which take effect when it restarts.
    pub fn with_policy_of(
        &self,
        fresh: &Config,
        sampling: AccessSampling,
    ) -> (Config, Vec<&'static str>) {
        let mut next = self.clone();
        next.policy.clone_from(&fresh.policy);
        next.policy_dir.clone_from(&fresh.policy_dir);
        next.mom = fresh.mom.clone();
        next.ksm = fresh.ksm.clone();
        next.working_set = fresh.working_set.clone();
        next.memtide = fresh.memtide.clone();
        next.tws = fresh.tws.clone();
        next.selfballoon = fresh.selfballoon.clone();
        next.sampled = fresh.sampled.clone();
        next.esx = fresh.esx.clone();
        next.proxmox = fresh.proxmox.clone();
        // What a running daemon applies at once beside the policy: each VM's policy and
        // bounds, and the defaults with them (the fleet reads them at each sample, tier
        // placement at each pass). Not the defaults alone: with the VMs of the start they
        // were never checked together (a default minimum above a VM's maximum). In any
        // order: entries sorted afresh by a tool are the same VMs (found by an audit).
        let live_aside = |vms: &[VmConfig]| -> Vec<VmConfig> {
            let aside = |vm: &VmConfig| VmConfig {
                policy: None,
                min_mib: None,
                max_mib: None,
                shares: None,
                ..vm.clone()
            };
            let mut vms: Vec<VmConfig> = vms.iter().map(aside).collect();
            vms.sort_by(|a, b| a.name.cmp(&b.name));
            vms
        };
        if live_aside(&self.vms) == live_aside(&fresh.vms) {
            next.vms.clone_from(&fresh.vms);
            next.defaults.clone_from(&fresh.defaults);
        }
        let mut left = Vec::new();
        macro_rules! differing {
            ($($field:ident => $name:literal),* $(,)?) => {
                $(if next.$field != fresh.$field {
                    left.push($name);
                })*
            };
        }
        differing!(
            interval_s => "interval_s",
            daemon => "[daemon]",
            control => "[control]",
            host => "[host]",
            discovery => "[discovery]",
            libvirt => "[libvirt]",
            firecracker => "[firecracker]",
            cloud_hypervisor => "[cloud_hypervisor]",
            defaults => "[defaults]",
            vms => "[[vm]]",
            engine => "[engine]",
            snapshots => "[snapshots]",
            hibernate => "[hibernate]",
            recovery => "[recovery]",
            reclaim => "[reclaim]",
            tiering => "[tiering]",
        );
        if left.is_empty() && next != *fresh {
            // A section this list does not name yet: said, not lost.
            left.push("other settings");
        }
        // Host-side access sampling follows the policy (memtide, sampled and esx use it)
        // and is set up when the VMs connect.
        if next.sample_access() != sampling {
            left.push("host-side access sampling (which the new policy changes)");
        }
        (next, left)
    }

    /// How to sample guest memory accesses on the host: as configured, else
    /// [`SampleAccess::Auto`] when a policy in use needs it.
    pub fn sample_access(&self) -> AccessSampling {
        let needs = |p: &str| matches!(p, "memtide" | "sampled" | "esx");
        let needed = needs(&self.policy)
            || self
                .vms
                .iter()
                .any(|vm| vm.policy.as_deref().is_some_and(needs));
        let cold_age = Duration::from_secs_f64(self.host.cold_age_s);
        match self.host.sample_access {
            Some(SampleAccess::Off) => AccessSampling::Off,
            None if !needed => AccessSampling::Off,
            // Unset: clear_refs, as before idle page tracking; idle tracking reads and
            // writes some bytes per guest page each tick, its cost on a large host not
            // measured yet, so it is the operator's choice.
            None => AccessSampling::ClearRefs,
            Some(SampleAccess::Auto) => AccessSampling::Tracked {
                cold_age,
                fallback: true,
                method: Method::Auto,
            },
            Some(SampleAccess::Damon) => AccessSampling::Tracked {
                cold_age,
                fallback: false,
                method: Method::Damon,
            },
            Some(SampleAccess::Idle) => AccessSampling::Tracked {
                cold_age,
                fallback: false,
                method: Method::IdlePages,
            },
            Some(SampleAccess::ClearRefs) => AccessSampling::ClearRefs,
        }
    }

    /// Where the policy comes from.
    pub fn policy_source(&self) -> PolicySource {
        PolicySource::from_config(&self.policy, self.policy_dir.as_deref())
    }

    /// Limit for every hypervisor call.
    pub fn call_timeout(&self) -> Duration {
        Duration::from_millis(self.daemon.call_timeout_ms)
    }
}

/// A field that cannot be used.
fn bad<T>(field: &str, message: String) -> Result<T, FieldError> {
    Err(FieldError {
        field: field.to_string(),
        message,
    })
}

/// Why a share of 0 is refused.
const SHARES_AT_LEAST_1: &str =
    "0: at least 1 (a VM's weight when memory is divided; 0 would leave it only its minimum)";

/// Check every number in `table` (whose fields are named after `prefix`), in its sections
/// (the `[[vm]]` list has neither floats nor durations): each must be finite (TOML has
/// `nan` and `inf`), and each duration (`*_s`) between 0 and a day.
fn check_numbers(table: &toml::Table, prefix: &str) -> Result<(), FieldError> {
    for (key, value) in table {
        let field = match prefix {
            "" => key.clone(),
            _ => format!("{prefix}.{key}"),
        };
        let number = match value {
            toml::Value::Table(t) => check_numbers(t, &field).map(|()| None)?,
            toml::Value::Float(f) => Some((*f, format!("{f:?}"))),
            toml::Value::Integer(i) => Some((*i as f64, i.to_string())),
            _ => None,
        };
        match number {
            Some((n, text)) if !n.is_finite() => {
                return bad(&field, format!("{text} is not a number"))
            }
            Some((n, text)) if key.ends_with("_s") && !(0.0..=MAX_DURATION_S).contains(&n) => {
                let message =
                    format!("{text} is not a number of seconds from 0 to {MAX_DURATION_S}");
                return bad(&field, message);
            }
            _ => {}
        }
    }
    Ok(())
}

/// Where one of a VM's bounds came from, as `memtide status` and `/metrics` show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BoundFrom {
    /// Its `[[vm]]` entry.
    Config,
    /// Its KubeVirt launcher pod: the memory request (min) or limit (max).
    Pod,
    /// Its libvirt domain's description.
    Libvirt,
    /// Its Proxmox VE configuration: `balloon:` (min) or `memory:` (max).
    Proxmox,
    /// `[defaults] min_mib` (a minimum only).
    Default,
    /// The VM's configured size: no maximum set, or one above it.
    Size,
}

impl BoundFrom {
    /// Its name in status and metrics.
    pub fn name(self) -> &'static str {
        match self {
            BoundFrom::Config => "config",
            BoundFrom::Pod => "pod",
            BoundFrom::Libvirt => "libvirt",
            BoundFrom::Proxmox => "proxmox",
            BoundFrom::Default => "default",
            BoundFrom::Size => "size",
        }
    }
}

/// A bound in bytes, and where it came from.
pub type Bound = (Bytes, BoundFrom);

/// Operator bounds for a VM, resolved against its configured size, each with where it
/// came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Bounds {
    /// Minimum in MiB.
    pub min_mib: (u64, BoundFrom),
    /// Maximum in MiB, if set.
    pub max_mib: Option<(u64, BoundFrom)>,
    /// Shares.
    pub shares: u32,
}

impl Bounds {
    /// The bounds for a VM given in the configuration, or the defaults for a discovered one.
    pub fn new(vm: Option<&VmConfig>, defaults: &VmDefaults) -> Bounds {
        let config = |m: Option<u64>| m.map(|m| (m, BoundFrom::Config));
        Bounds {
            min_mib: config(vm.and_then(|v| v.min_mib))
                .unwrap_or((defaults.min_mib, BoundFrom::Default)),
            max_mib: config(vm.and_then(|v| v.max_mib)),
            shares: vm.and_then(|v| v.shares).unwrap_or(defaults.shares),
        }
    }

    /// These bounds, with others (`min`, `max`: from a KubeVirt pod, a libvirt domain's
    /// description or a Proxmox VE configuration, each with where it came from; `shares`)
    /// for what the VM's configuration entry leaves unset.
    pub fn under(
        self,
        min: Option<Bound>,
        max: Option<Bound>,
        shares: Option<u32>,
        vm: Option<&VmConfig>,
    ) -> Bounds {
        let mib = |(b, from): Bound| (Bytes::mib(b), from);
        let set_min = vm.and_then(|v| v.min_mib).map(|m| (m, BoundFrom::Config));
        let set_shares = vm.and_then(|v| v.shares);
        Bounds {
            min_mib: set_min.or(min.map(mib)).unwrap_or(self.min_mib),
            max_mib: self.max_mib.or(max.map(mib)),
            shares: set_shares.or(shares).unwrap_or(self.shares),
        }
    }

    /// Limits for a VM of `configured` size: max at most the configured size, min at most
    /// max; and where each came from: a maximum above the size gives way to it, a minimum
    /// above the maximum to that.
    pub fn limits(&self, configured: Bytes) -> (VmLimits, BoundsFrom) {
        let max = match self.max_mib {
            Some((m, from)) if Bytes::from_mib(m) <= configured => (Bytes::from_mib(m), from),
            _ => (configured, BoundFrom::Size),
        };
        let min = (Bytes::from_mib(self.min_mib.0), self.min_mib.1);
        let min = if min.0 > max.0 { max } else { min };
        let limits = VmLimits {
            min: min.0,
            max: max.0,
            shares: self.shares,
        };
        (
            limits,
            BoundsFrom {
                min: min.1,
                max: max.1,
            },
        )
    }
}

/// Where a VM's bounds in force came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct BoundsFrom {
    /// The minimum's source.
    pub min: BoundFrom,
    /// The maximum's source.
    pub max: BoundFrom,
}

/// A `policy` setting of a configuration file in `base`: a built-in policy's name as it
/// is, a relative path to a policy file or directory joined to `base`.
fn policy_from(base: &Path, policy: &str) -> String {
    let joined = base.join(policy);
    match crate::policies::names_a_path(policy, &joined) {
        true => joined.to_string_lossy().into_owned(),
        false => policy.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        Config::parse(text, "memtide.toml").unwrap_err().to_string()
    }

    #[test]
    fn policy_paths_are_found_from_the_configuration_files_directory() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("memtide.toml");
        let vm = |name: &str, policy: &str| {
            format!("[[vm]]\nname = \"{name}\"\nqmp = \"/run/{name}.qmp\"\npolicy = \"{policy}\"\n")
        };
        let text = format!(
            "policy = \"my.policy\"\n{}{}{}",
            vm("a", "mom"),
            vm("b", "vms/b"),
            vm("c", "/etc/memtide/c.policy")
        );
        std::fs::write(&file, text).unwrap();
        let config = Config::load(&file).unwrap();
        let at = |p: &str| dir.path().join(p).to_string_lossy().into_owned();
        assert_eq!(config.policy, at("my.policy"));
        let vms: Vec<_> = config
            .vms
            .iter()
            .map(|v| v.policy.clone().unwrap())
            .collect();
        assert_eq!(
            vms,
            [
                String::from("mom"),
                at("vms/b"),
                "/etc/memtide/c.policy".into()
            ]
        );
        // A directory, and a name that is a file there; a built-in name stays one.
        std::fs::write(dir.path().join("tuned"), "").unwrap();
        std::fs::write(&file, "policy_dir = \"policies\"\n").unwrap();
        let config = Config::load(&file).unwrap();
        assert_eq!(config.policy_dir, Some(dir.path().join("policies")));
        std::fs::write(&file, "policy = \"tuned\"\n").unwrap();
        assert_eq!(Config::load(&file).unwrap().policy, at("tuned"));
        std::fs::write(dir.path().join("memtide"), "").unwrap();
        std::fs::write(&file, "policy = \"memtide\"\n").unwrap();
        assert_eq!(Config::load(&file).unwrap().policy, "memtide");
    }

    #[test]
    fn a_launch_command_goes_with_the_connectors_memtide_starts_a_vm_through() {
        for endpoint in [
            "qmp = \"/a\"",
            "firecracker = \"/fc.sock\"",
            "cloud_hypervisor = \"/ch.sock\"",
        ] {
            let text = format!(
                "[[vm]]\nname = \"a\"\n{endpoint}\nlaunch = [\"x\"]\nhibernate_after_s = 60\n"
            );
            Config::parse(&text, "x").unwrap();
            let text = format!("[[vm]]\nname = \"a\"\n{endpoint}\nhibernate_after_s = 60\n");
            assert!(
                err(&text).contains("hibernate_after_s: needs `launch`"),
                "{endpoint}"
            );
        }
        if cfg!(feature = "libvirt") {
            let domain = "[[vm]]\nname = \"a\"\nlibvirt = \"qemu:///system\"\n";
            Config::parse(&format!("{domain}hibernate_after_s = 60\n"), "x").unwrap();
            assert_eq!(
                err(&format!("{domain}launch = [\"virsh\"]\n")),
                "memtide.toml: vm[0].launch: libvirt starts its domains itself: memtide restores \
                 one through libvirt, with no launch command"
            );
        }
    }

    #[test]
    fn sample_access_takes_a_boolean_or_a_tracker_and_a_cold_age() {
        let sampling = |text: &str| Config::parse(text, "x").unwrap().sample_access();
        let tracked = |fallback, method| AccessSampling::Tracked {
            cold_age: Duration::from_secs(120),
            fallback,
            method,
        };
        // Unset: clear_refs for the policies that use it (idle tracking is chosen).
        assert_eq!(
            sampling("policy = \"memtide\"\n"),
            AccessSampling::ClearRefs
        );
        assert_eq!(sampling("policy = \"mom\"\n"), AccessSampling::Off);
        // `true`: the best tracking the host has, DAMON first.
        assert_eq!(
            sampling("[host]\nsample_access = true\n"),
            tracked(true, Method::Auto)
        );
        assert_eq!(
            sampling("[host]\nsample_access = \"damon\"\n"),
            tracked(false, Method::Damon)
        );
        assert_eq!(
            sampling("policy = \"esx\"\n[host]\nsample_access = false\n"),
            AccessSampling::Off
        );
        assert_eq!(
            sampling("[host]\nsample_access = \"idle\"\ncold_age_s = 30\n"),
            AccessSampling::Tracked {
                cold_age: Duration::from_secs(30),
                fallback: false,
                method: Method::IdlePages,
            }
        );
        assert_eq!(
            sampling("[host]\nsample_access = \"clear_refs\"\n"),
            AccessSampling::ClearRefs
        );
        let e = err("[host]\nsample_access = \"kstaled\"\n");
        assert!(
            e.contains(
                "unknown access sampling \"kstaled\": true, false, \"damon\", \"idle\" or \"clear_refs\""
            ),
            "{e}"
        );
        // Neither a boolean nor a string: the choices, not serde's enum.
        let e = err("[host]\nsample_access = 1\n");
        assert!(
            e.contains("true, false, \"damon\", \"idle\" or \"clear_refs\" for the host-side access sampling")
                && !e.contains("untagged"),
            "{e}"
        );
        assert!(
            err("[host]\ncold_age_s = 0\n")
                .contains("host.cold_age_s: 0 is not a number of seconds"),
            "cold age 0"
        );
    }

    #[test]
    fn an_empty_file_gives_the_defaults() {
        assert_eq!(Config::parse("", "x").unwrap(), Config::default());
    }

    #[test]
    fn a_reserve_share_set_before_the_sliding_scale_still_parses() {
        let c = Config::parse("[working_set]\nhost_reserve = 0.05\n", "x").unwrap();
        assert_eq!(c.working_set.host_reserve, Some(0.05));
    }

    #[test]
    fn the_packaged_configuration_is_the_defaults() {
        // /etc/memtide/memtide.toml as the Debian package ships it: every key commented,
        // so the service starts on any host.
        let c = Config::parse(include_str!("../../../contrib/memtide.toml"), "package").unwrap();
        assert_eq!(c, Config::default());
    }

    #[test]
    fn the_kubevirt_daemonsets_configuration_parses() {
        let yaml = include_str!("../../../contrib/kubevirt/memtide-daemonset.yaml");
        let block: String = yaml
            .lines()
            .skip_while(|l| !l.ends_with("memtide.toml: |"))
            .skip(1)
            .take_while(|l| l.is_empty() || l.starts_with("    "))
            .map(|l| format!("{}\n", l.get(4..).unwrap_or("")))
            .collect();
        let parsed = Config::parse(&block, "daemonset");
        if !cfg!(feature = "libvirt") {
            // Its image is built with the libvirt connector, which KubeVirt VMs need.
            let e = parsed.unwrap_err().to_string();
            assert!(e.contains("built without libvirt support"), "{e}");
            return;
        }
        let c = parsed.unwrap();
        assert!(c.libvirt.kubevirt && c.discovery.qmp_glob.is_empty());
        assert!(c.libvirt.kubevirt_pod_bounds && c.libvirt.kubevirt_pod_refresh_s == 30.0);
        assert_eq!(c.daemon.http, "0.0.0.0:9315");
        c.settings().expect("the daemon would start with it");
    }

    #[test]
    fn kubevirt_pod_bounds_need_kubevirt_and_a_sane_refresh() {
        assert_eq!(
            err("[libvirt]\nkubevirt_pod_bounds = true\n"),
            "memtide.toml: libvirt.kubevirt_pod_bounds: KubeVirt VMs' bounds come with \
             kubevirt = true"
        );
        let on = "[libvirt]\nkubevirt = true\nkubevirt_pod_bounds = true\n";
        assert_eq!(
            err(&format!("{on}kubevirt_pod_refresh_s = 0.5\n")),
            "memtide.toml: libvirt.kubevirt_pod_refresh_s: 0.5 is not a number of seconds \
             from 1 to 3600"
        );
        // KubeVirt itself needs the libvirt connector built in.
        if cfg!(feature = "libvirt") {
            let c = Config::parse(&format!("{on}kubevirt_pod_refresh_s = 60\n"), "x").unwrap();
            assert!(c.libvirt.kubevirt_pod_bounds && c.libvirt.kubevirt_pod_refresh_s == 60.0);
        }
    }

    #[test]
    fn a_reload_takes_the_policy_and_names_what_waits_for_a_restart() {
        let parse = |text: &str| Config::parse(text, "memtide.toml").unwrap();
        let vm = |policy: &str, min: u64| {
            format!("[[vm]]\nname = \"db\"\nqmp = \"/q\"\nmin_mib = {min}\n{policy}")
        };
        let vm_at = |qmp: &str| format!("[[vm]]\nname = \"db\"\nqmp = \"{qmp}\"\nmin_mib = 512\n");
        let running = parse(&format!("policy = \"mom\"\n{}", vm("", 512)));
        // The policy, its sections and a VM's own policy: all taken, nothing left.
        let fresh = parse(&format!(
            "policy = \"tws\"\n{}[mom]\npressure_threshold = 0.3\n",
            vm("policy = \"mom\"\n", 512)
        ));
        let (next, left) = running.with_policy_of(&fresh, running.sample_access());
        assert_eq!((next.clone(), left), (fresh.clone(), vec![]));
        // Its bounds and the defaults: taken too.
        let fresh = parse(&format!(
            "policy = \"mom\"\n[defaults]\nmin_mib = 200\nshares = 500\n{}shares = 2000\n\
             max_mib = 1024\n",
            vm("", 256)
        ));
        let (next, left) = running.with_policy_of(&fresh, running.sample_access());
        assert_eq!((next.clone(), left), (fresh.clone(), vec![]));
        // A VM changed otherwise (its socket) keeps its routing and its bounds, and the
        // defaults wait with it, and says so; the interval too.
        let fresh = parse(&format!(
            "interval_s = 5\npolicy = \"tws\"\n[defaults]\nmin_mib = 200\n{}policy = \"mom\"\n\
             max_mib = 1024\n",
            vm_at("/other")
        ));
        let (next, left) = running.with_policy_of(&fresh, running.sample_access());
        assert_eq!(left, ["interval_s", "[defaults]", "[[vm]]"]);
        assert_eq!(next.defaults, running.defaults);
        assert_eq!(next.policy, "tws");
        assert_eq!(
            (next.interval_s, &next.vms),
            (running.interval_s, &running.vms)
        );
        // To a policy that samples guest accesses from the host: not until a restart.
        let esx = parse(&format!("policy = \"esx\"\n{}", vm("", 512)));
        let (next, left) = running.with_policy_of(&esx, running.sample_access());
        assert_eq!(next.policy, "esx");
        assert_eq!(
            left,
            ["host-side access sampling (which the new policy changes)"]
        );
        // Back to the policy started with, after that reload: nothing waits, the sampling
        // in force being the start's (not the last reload's).
        let (back, left) = next.with_policy_of(&running, running.sample_access());
        assert_eq!((back, left), (running.clone(), vec![]));
        // The VMs' entries sorted afresh (a tool's doing), a bound changed: taken.
        let two = |first: &str| {
            let web = "[[vm]]\nname = \"web\"\nqmp = \"/w\"\nmin_mib = 128\n";
            let db = |min: u64| format!("[[vm]]\nname = \"db\"\nqmp = \"/q\"\nmin_mib = {min}\n");
            let entries = match first {
                "db" => format!("{}{web}", db(512)),
                _ => format!("{web}{}", db(600)),
            };
            parse(&format!("policy = \"mom\"\n{entries}"))
        };
        let running = two("db");
        let fresh = two("web");
        let (next, left) = running.with_policy_of(&fresh, running.sample_access());
        assert_eq!((next, left), (fresh, vec![]));
    }

    #[test]
    fn a_full_example_parses() {
        let c = Config::parse(include_str!("../../../examples/memtide.toml"), "example").unwrap();
        assert_eq!(c.vms.len(), 2);
        assert_eq!(c.vms[0].min_mib, Some(512));
        assert_eq!(
            c.host.domain_cgroup.as_deref(),
            Some(Path::new("/sys/fs/cgroup/machine.slice"))
        );
    }

    #[test]
    fn unknown_and_mistyped_fields_are_named_with_their_line() {
        let e = err("interval_s = 2\n[engine]\nhistory_length = 3\n");
        assert!(
            e.starts_with("memtide.toml: TOML parse error at line 3"),
            "{e}"
        );
        assert!(e.contains("unknown field `history_length`"), "{e}");
        let e = err("[[vm]]\nname = \"a\"\nqmp = \"/x\"\nmin_mib = \"lots\"\n");
        assert!(
            e.contains("line 4") && e.contains("invalid type: string \"lots\""),
            "{e}"
        );
        let e = err("[[vm]]\nmin_mib = 1\n");
        assert!(e.contains("missing field `name`"), "{e}");
    }

    #[test]
    fn semantic_errors_name_the_field() {
        assert_eq!(
            err("[[vm]]\nname = \"a\"\nqmp = \"/a\"\n[[vm]]\nname = \"b\"\nqmp = \"/b\"\nmin_mib = 512\nmax_mib = 256\n"),
            "memtide.toml: vm[1].max_mib: 256 is below min_mib 512"
        );
        assert_eq!(
            err("[[vm]]\nname = \"a\"\nqmp = \"/a\"\n[[vm]]\nname = \"a\"\nqmp = \"/b\"\n"),
            "memtide.toml: vm[1].name: \"a\" is named twice"
        );
        assert_eq!(
            err("[[vm]]\nname = \"a\"\nfirecracker = \"/s\"\n[[vm]]\nname = \"b\"\nfirecracker = \"/s\"\n"),
            "memtide.toml: vm[1].firecracker: /s is given to VMs \"a\" and \"b\": one socket \
             reaches one VM"
        );
        assert_eq!(
            err("[mom]\npressure_critical = 0.5\n"),
            "memtide.toml: mom.pressure_critical: 0.5 must be below pressure_threshold 0.2"
        );
        assert_eq!(
            err("interval_s = 0\n"),
            "memtide.toml: interval_s: 0 is not a number of seconds from 0.1 to 3600"
        );
        assert_eq!(
            err("[memtide]\nample_free = 0.05\nshort_free = 0.1\n"),
            "memtide.toml: memtide.short_free: 0.1 must be between 0 and ample_free 0.05"
        );
        assert_eq!(
            err("[memtide]\ntouched_share = 0\n"),
            "memtide.toml: memtide.touched_share: 0 must be in (0, 1]"
        );
        assert_eq!(
            err("[memtide]\ntouched_samples = 0\n"),
            "memtide.toml: memtide.touched_samples: 0: at least 1 (with none, host-side access \
             sampling would bound nothing)"
        );
        assert_eq!(
            err("[memtide]\nfill_s = -1\n"),
            "memtide.toml: memtide.fill_s: -1 is not a number of seconds"
        );
        assert_eq!(
            err("[memtide]\nreport_wait_s = inf\n"),
            "memtide.toml: memtide.report_wait_s: inf is not a number of seconds [0, 3600]"
        );
        assert_eq!(
            err("[working_set]\nhost_reserve = nan\n"),
            "memtide.toml: working_set.host_reserve: NaN must be a share of the domain in [0, 0.5]"
        );
        assert_eq!(
            err("[working_set]\nhost_reserve = 0.6\n"),
            "memtide.toml: working_set.host_reserve: 0.6 must be a share of the domain in [0, 0.5]"
        );
        assert_eq!(
            err("[working_set]\nhost_swap_share = 1.5\n"),
            "memtide.toml: working_set.host_swap_share: 1.5 must be a share of the host's free swap in [0, 1]"
        );
        assert_eq!(
            err("[proxmox]\ngoal_used = 1.5\n"),
            "memtide.toml: proxmox.goal_used: 1.5 must be in (0, 1]"
        );
        assert_eq!(
            err("policy = \"magic\"\n"),
            "memtide.toml: policy: unknown policy \"magic\": no built-in policy has that name (memtide, mom, tws, selfballoon, sampled, esx, proxmox, none) and there is no such file or directory"
        );
        assert!(err("[daemon]\nhttp = \"localhost\"\n")
            .starts_with("memtide.toml: daemon.http: \"localhost\" is not an address:port"));
        assert!(err("[discovery]\nqmp_glob = [\"/run/[x\"]\n")
            .starts_with("memtide.toml: discovery.qmp_glob[0]: "));
        assert_eq!(
            err("[[vm]]\nname = \"a\"\n"),
            "memtide.toml: vm[0].qmp: give exactly one of qmp, libvirt, firecracker, cloud_hypervisor \
             (or `pid` for a process only placed)"
        );
        assert_eq!(
            err("[[vm]]\nname = \"a\"\nqmp = \"/a\"\nfirecracker = \"/a.sock\"\n"),
            "memtide.toml: vm[0].qmp: give exactly one of qmp, libvirt, firecracker, cloud_hypervisor \
             (or `pid` for a process only placed)"
        );
        assert_eq!(
            err("[[vm]]\nname = \"a\"\nfirecracker = \"/a.sock\"\nagent = \"/a.qga\"\n"),
            "memtide.toml: vm[0].agent: an agent socket goes with qmp (libvirt reaches the agent itself)"
        );
        assert!(err("[firecracker]\nsocket_glob = [\"/run/[x\"]\n")
            .starts_with("memtide.toml: firecracker.socket_glob[0]: "));
        assert_eq!(
            err("[libvirt]\nuris = [\"qemu:///system\", \"system\"]\n"),
            if cfg!(feature = "libvirt") {
                "memtide.toml: libvirt.uris[1]: \"system\" is not a libvirt URI (e.g. qemu:///system)"
            } else {
                "memtide.toml: libvirt.uris[0]: this memtide was built without libvirt support (cargo feature `libvirt`)"
            }
        );
        // KubeVirt's VMs are reached through libvirt: without it, refused at once rather
        // than at each launcher pod's connection.
        let kubevirt = Config::parse("[libvirt]\nkubevirt = true\n", "memtide.toml");
        match cfg!(feature = "libvirt") {
            true => assert!(kubevirt.is_ok()),
            false => assert_eq!(
                kubevirt.unwrap_err().to_string(),
                "memtide.toml: libvirt.kubevirt: this memtide was built without libvirt \
                 support (cargo feature `libvirt`), through which KubeVirt VMs are reached"
            ),
        }
        assert_eq!(
            err("[engine]\nhistory_len = 1\n"),
            "memtide.toml: engine.history_len: must be at least 2 (rates need two samples)"
        );
    }

    #[test]
    fn what_run_cannot_use_is_rejected() {
        let cases = [
            (
                "interval_s = 1e20\n",
                "interval_s: 100000000000000000000 is not a number of seconds from 0.1 to 3600",
            ),
            (
                "interval_s = nan\n",
                "interval_s: NaN is not a number of seconds from 0.1 to 3600",
            ),
            (
                "interval_s = inf\n",
                "interval_s: inf is not a number of seconds from 0.1 to 3600",
            ),
            (
                "[daemon]\ncall_timeout_ms = 0\n",
                "daemon.call_timeout_ms: 0 is not a number of milliseconds from 1 to 3600000",
            ),
            (
                "[daemon]\nrecord_dir = \"/r\"\nrecord_file_mib = 17592186044416\n",
                "daemon.record_file_mib: 17592186044416 is not a number of MiB",
            ),
            (
                "[daemon]\nrecord_dir = \"/r\"\nrecord_file_mib = 0\n",
                "daemon.record_file_mib: 0 is not a number of MiB",
            ),
            (
                "[control]\nallow_uids = [1000, 4294967295]\n",
                "control.allow_uids[1]: 4294967295 is (uid_t)-1, no user or group",
            ),
            (
                "[memtide]\ncool_down_s = -1.0\n",
                "memtide.cool_down_s: -1.0 is not a number of seconds from 0 to 86400",
            ),
            (
                "[tws]\nepoch_s = 1e300\n",
                "tws.epoch_s: 1e300 is not a number of seconds from 0 to 86400",
            ),
            (
                "[engine]\nsettle_s = 9223372036854775807\n",
                "engine.settle_s: 9223372036854775807 is not a number of seconds from 0 to 86400",
            ),
            (
                "[mom]\nmax_change = nan\n",
                "mom.max_change: NaN is not a ratio between 0 and 1",
            ),
            (
                "[daemon]\nsocket = \"memtide.sock\"\n",
                "daemon.socket: \"memtide.sock\" is not an absolute path",
            ),
            (
                "[daemon]\nsocket = \"\"\n",
                "daemon.socket: \"\" is not an absolute path",
            ),
            (
                "[snapshots]\ndir = \"snaps\"\n",
                "snapshots.dir: \"snaps\" is not an absolute path",
            ),
            // An empty proc read "meminfo" from the working directory, naming no key.
            ("[host]\nproc = \"\"\n", "host.proc: \"\" is not an absolute path"),
            (
                "[[vm]]\nname = \"a\"\nqmp = \"\"\n",
                "vm[0].qmp: \"\" is not an absolute path",
            ),
            (
                "[[vm]]\nname = \"a\"\nqmp = \"/run/a.qmp\"\nagent = \"a.qga\"\n",
                "vm[0].agent: \"a.qga\" is not an absolute path",
            ),
            (
                "[[vm]]\nname = \"a\"\nqmp = \"/run/a.qmp\"\nagent = \"/run/a.qmp\"\n",
                "vm[0].agent: the same socket as qmp: the guest agent has a socket of its own",
            ),
            (
                "[[vm]]\nname = \"a\"\nqmp = \"/run/a.qmp\"\nlaunch = [\"\", \"-m\", \"1G\"]\n",
                "vm[0].launch: an empty command",
            ),
            (
                "[[vm]]\nname = \"a\"\nqmp = \"/run/a.qmp\"\nclone_launch = [\"\", \"{n}\"]\n",
                "vm[0].clone_launch: an empty command",
            ),
            (
                "[ksm]\nnpages_boost = -300\n",
                "ksm.npages_boost: -300 is below 0: the pages to scan would fall as memory \
                 runs short",
            ),
            (
                "[ksm]\nnpages_decay = 50\n",
                "ksm.npages_decay: 50 is above 0: the pages to scan would grow while memory \
                 is ample",
            ),
            // The kernel's KSM knobs are 32-bit: larger would be written as it is and
            // refused by the kernel at every tick (found by an audit).
            (
                "[ksm]\nnpages_max = 9000000000000\n",
                "ksm.npages_max: 9000000000000 is above 4294967295, the most the kernel's KSM \
                 knobs take",
            ),
            (
                "[ksm]\nsleep_ms_min = 4294967296\n",
                "ksm.sleep_ms_min: 4294967296 is above 4294967295, the most the kernel's KSM \
                 knobs take",
            ),
            // Samples kept per VM: an audit's 2^63 panicked the daemon, the simulator and
            // replay as they started (capacity overflow), 10^8 aborted them.
            (
                "[engine]\nhistory_len = 9223372036854775807\n",
                "engine.history_len: 9223372036854775807 is above 1000 (each VM keeps that \
                 many samples in memory)",
            ),
            // The other policies' constants, each as an operator got it wrong.
            (
                "[esx]\nhigh = 0.01\nsoft = 0.5\n",
                "esx: the states' free shares must rise: low 0.01 ≤ hard 0.02 ≤ soft 0.5 ≤ high 0.01",
            ),
            ("[esx]\nhard = 2\n", "esx.hard: 2 must be a share in [0, 1]"),
            ("[esx]\nlow = -1\n", "esx.low: -1 must be a share in [0, 1]"),
            (
                "[esx]\nidle_tax = 1\n",
                "esx.idle_tax: 1 must be in [0, 1): at 1 idle memory costs without bound",
            ),
            (
                "[esx]\nsoft_step = 1.5\n",
                "esx.soft_step: 1.5 must be a share of the guest in [0, 1]",
            ),
            ("[esx]\ngrow_step = -1\n", "esx.grow_step: -1 must be a share ≥ 0"),
            (
                "[esx.sampling]\nslow_weight = 1.5\n",
                "esx.sampling.slow_weight: 1.5 must be in (0, 1]",
            ),
            (
                "[selfballoon]\nreserve = -2\n",
                "selfballoon.reserve: -2 must be a share in [0, 1]",
            ),
            (
                "[selfballoon]\ndown_hysteresis = 0\n",
                "selfballoon.down_hysteresis: 0: at least 1 (1 closes the whole gap at once)",
            ),
            ("[sampled]\nfast_weight = 7\n", "sampled.fast_weight: 7 must be in (0, 1]"),
            ("[sampled]\nslow_weight = -1\n", "sampled.slow_weight: -1 must be in (0, 1]"),
            (
                "[tws]\nfast_step = -1\n",
                "tws.fast_step: -1 must be a share of the guest in [0, 1]",
            ),
            (
                "[tws]\nslow_step = 9\n",
                "tws.slow_step: 9 must be a share of the guest in [0, 1]",
            ),
            ("[memtide]\nmargin = -0.5\n", "memtide.margin: -0.5 must be a share in [0, 1]"),
            ("[memtide]\nprobe_step = -1\n", "memtide.probe_step: -1 must be a share in [0, 1]"),
            (
                "[memtide]\nbackoff_step = -3\n",
                "memtide.backoff_step: -3 must be a share of the guest in [0, 1]",
            ),
            (
                "[memtide]\npsi_threshold = 101\n",
                "memtide.psi_threshold: 101 is not a percentage of time",
            ),
            (
                "[defaults]\nshares = 0\n",
                "defaults.shares: 0: at least 1 (a VM's weight when memory is divided; 0 \
                 would leave it only its minimum)",
            ),
            (
                "[[vm]]\nname = \"a\"\nqmp = \"/a\"\nshares = 0\n",
                "vm[0].shares: 0: at least 1 (a VM's weight when memory is divided; 0 would \
                 leave it only its minimum)",
            ),
            (
                "[daemon]\nrecord_dir = \"/r\"\nrecord_keep = 0\n",
                "daemon.record_keep: 0: at least 1, the file being written",
            ),
            (
                "[discovery]\nqmp_glob = [\"/run/vms/*.sock\"]\nagent_extension = \"sock\"\n",
                "discovery.agent_extension: \"sock\" is the extension of the QMP sockets \
                 \"/run/vms/*.sock\" finds: each VM's guest agent would be looked for at its \
                 QMP socket",
            ),
            (
                "[discovery]\nagent_extension = \"../qga\"\n",
                "discovery.agent_extension: \"../qga\" is not a file name extension \
                 (web1.sock's agent at web1.qga: \"qga\"; \"\" for none)",
            ),
            (
                "[[vm]]\nname = \"a\"\nqmp = \"/a\"\nlaunch = []\n",
                "vm[0].launch: an empty command",
            ),
            (
                "[reclaim]\nvms = \"unballooned\"\nstep_pct_per_s = 0\n",
                "reclaim.step_pct_per_s: 0 must be a percentage in (0, 100]",
            ),
            (
                "[reclaim]\ntarget_stall_pct = nan\n",
                "reclaim.target_stall_pct: NaN must be a percentage in (0, 100]",
            ),
            (
                "[[vm]]\nname = \"a\"\nqmp = \"/a\"\nlaunch = [\"q\"]\nrestore_on_crash = true\n",
                "vm[0].restore_on_crash: needs `snapshot_every_s`: memtide restores a QEMU \
                 reached through `qmp`, by its `launch` command, from the snapshots it takes \
                 on a schedule",
            ),
            (
                "[[vm]]\nname = \"a\"\nqmp = \"/a\"\nwake_at = [\"07:30\"]\n",
                "vm[0].wake_at: needs `launch`: a hibernated VM is woken by starting it again",
            ),
            (
                "[tiering]\ninterval_s = 0\n",
                "tiering.interval_s: 0 is not a number of seconds from 0.1 to 3600",
            ),
            (
                "[tiering]\nrate_mib_s = 0\n",
                "tiering.rate_mib_s: 0 is not a number of MiB a second above 0",
            ),
            (
                "[tiering]\nmargin_pct = -1\n",
                "tiering.margin_pct: -1 must be a percentage in [0, 1000]",
            ),
            (
                "[tiering]\ncold_age_s = -1\n",
                "tiering.cold_age_s: -1 is not a number of seconds in [0, 86400]",
            ),
            (
                "[tiering]\ncold_age_s = nan\n",
                "tiering.cold_age_s: NaN is not a number of seconds in [0, 86400]",
            ),
            (
                "[tiering]\nmax_cold_age_s = 20\n",
                "tiering.max_cold_age_s: 20 is not a number of seconds from cold_age_s (30) to 86400",
            ),
            (
                "[tiering]\ncold_age_s = 2000\n",
                "tiering.max_cold_age_s: 1800 is not a number of seconds from cold_age_s (2000) to 86400",
            ),
            (
                "[tiering]\ninterval_s = 0.1\nmax_cold_age_s = 7000\n",
                "tiering.interval_s: 0.1 s scans count ages up to 6553 s, below the longest cold age, 7000 s",
            ),
            (
                "[tiering]\nmax_cold_age_s = inf\n",
                "tiering.max_cold_age_s: inf is not a number of seconds from cold_age_s (30) to 86400",
            ),
            (
                "[tiering]\npromotion_slo_pct_per_min = 0\n",
                "tiering.promotion_slo_pct_per_min: 0 is not a percentage of the working set a minute in (0, 100]",
            ),
            (
                "[tiering]\npromotion_slo_pct_per_min = nan\n",
                "tiering.promotion_slo_pct_per_min: NaN is not a percentage of the working set a minute in (0, 100]",
            ),
            (
                "[tiering]\nfast_node = 1\nslow_node = 1\n",
                "tiering.slow_node: node 1 is the fast node too",
            ),
            (
                "[host]\nsample_access = \"idle\"\n[tiering]\nplace = true\n",
                "host.sample_access: placement tracks guest pages by page tracking, and so \
                 does this sampling: each would miss the accesses the other clears; set \
                 sample_access = \"clear_refs\" or false while [tiering] place is on",
            ),
            (
                "[[vm]]\nname = \"a\"\npid = 7\n",
                "vm[0].pid: a VM given by `pid` is only placed: set [tiering] place = true",
            ),
            (
                "[tiering]\nplace = true\n[[vm]]\nname = \"a\"\npid = 0\n",
                "vm[0].pid: 0 is not a process id",
            ),
            (
                "[tiering]\nplace = true\n[[vm]]\nname = \"a\"\npid = 1\n",
                "vm[0].pid: 1 is init, not a VM's process",
            ),
            (
                "[tiering]\nplace = true\n[[vm]]\nname = \"a\"\npid = 7\n\
                 [[vm]]\nname = \"b\"\npid = 8\n[[vm]]\nname = \"c\"\npid = 7\n",
                "vm[2].pid: process 7 is given to VMs \"a\" and \"c\": a process is placed as \
                 one VM",
            ),
            (
                "[tiering]\nplace = true\n[[vm]]\nname = \"a\"\nqmp = \"/a\"\npid = 7\n",
                "vm[0].pid: a VM given by `pid` is only placed: a hypervisor connection gives \
                 its own process",
            ),
            (
                "[tiering]\nplace = true\n[[vm]]\nname = \"a\"\npid = 7\nlaunch = [\"q\"]\n",
                "vm[0].launch: a VM given by `pid` is only placed: this needs a hypervisor \
                 connection (qmp, libvirt, firecracker, cloud_hypervisor)",
            ),
            (
                "[recovery]\nwindow_s = 0\n",
                "recovery.window_s: 0 is not 1 to 31536000 seconds",
            ),
            (
                "[recovery]\nreserve = 1.0\n",
                "recovery.reserve: 1 must be a share in [0, 1)",
            ),
            (
                "[snapshots]\ntimeout_s = 0\n",
                "snapshots.timeout_s: 0 is not 1 to 86400 seconds",
            ),
            (
                "[[vm]]\nname = \"a\"\nqmp = \"/a\"\nclone_launch = [\"qemu\", \"-qmp\", \"/a\"]\n",
                "vm[0].clone_launch: no `{n}`: every clone would take the same sockets and disks",
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(err(text), format!("memtide.toml: {expected}"), "{text}");
        }
        let placed = "[tiering]\nplace = true\nfast_node = 0\nslow_node = 1\n\
                      [[vm]]\nname = \"a\"\npid = 7\nfast_budget_mib = 42\n";
        let c = Config::parse(placed, "x").unwrap();
        assert_eq!(
            (c.vms[0].pid, c.vms[0].fast_budget_mib),
            (Some(7), Some(42))
        );
        assert_eq!(c.tiering.interval_s, 10.0);
        assert_eq!(c.tiering.cold_age_s, 30.0);
        let c = Config::parse("[tiering]\ncold_age_s = 0\n", "x").unwrap();
        assert_eq!(c.tiering.cold_age_s, 0.0);
        // A fixed age above the adaptive one's default most is the operator's to choose.
        let c = Config::parse("[tiering]\nadaptive_age = false\ncold_age_s = 900\n", "x").unwrap();
        assert_eq!(c.tiering.cold_age_s, 900.0);
        let c = Config::parse("interval_s = 3600\n[daemon]\nrecord_dir = \"/r\"\n", "x").unwrap();
        let s = c.settings().unwrap();
        assert_eq!(s.interval, Duration::from_secs(3600));
        assert_eq!(s.record.map(|r| r.max_file_bytes), Some(64 << 20));
    }

    #[test]
    fn bounds_never_exceed_the_configured_size_and_say_where_they_came_from() {
        use BoundFrom::{Config, Default, Libvirt, Pod, Proxmox, Size};
        let from = |min, max| BoundsFrom { min, max };
        let d = VmDefaults::default();
        let (l, f) = Bounds::new(None, &d).limits(Bytes::from_mib(384));
        assert_eq!((l.min, l.max), (Bytes::from_mib(128), Bytes::from_mib(384)));
        assert_eq!(f, from(Default, Size));
        let vm = VmConfig {
            name: "a".into(),
            qmp: Some("/a".into()),
            libvirt: None,
            firecracker: None,
            cloud_hypervisor: None,
            agent: None,
            min_mib: Some(512),
            max_mib: Some(4096),
            shares: None,
            policy: None,
            launch: None,
            clone_launch: None,
            hibernate_after_s: None,
            snapshot_every_s: None,
            snapshot_keep: 3,
            restore_on_crash: false,
            wake_at: Vec::new(),
            reclaim: None,
            reclaim_cgroup: None,
            fast_budget_mib: None,
            place: true,
            pid: None,
        };
        // Both above the size: the size is both.
        let (l, f) = Bounds::new(Some(&vm), &d).limits(Bytes::from_mib(384));
        assert_eq!((l.min, l.max), (Bytes::from_mib(384), Bytes::from_mib(384)));
        assert_eq!(f, from(Size, Size));
        let (_, f) = Bounds::new(Some(&vm), &d).limits(Bytes::from_mib(4096));
        assert_eq!(
            f,
            from(Config, Config),
            "a maximum equal to the size is its own"
        );
        // The hypervisor's bounds fill in what the configuration leaves unset.
        let hv = (
            Some((Bytes::from_mib(200), Proxmox)),
            Some((Bytes::from_mib(300), Proxmox)),
        );
        let (l, f) = Bounds::new(None, &d)
            .under(hv.0, hv.1, Some(2000), None)
            .limits(Bytes::from_mib(384));
        assert_eq!(
            (l.min, l.max, l.shares),
            (Bytes::from_mib(200), Bytes::from_mib(300), 2000)
        );
        assert_eq!(f, from(Proxmox, Proxmox));
        // A pod's request above a domain's maximum: the request is capped at it.
        let (l, f) = Bounds::new(None, &d)
            .under(
                Some((Bytes::from_mib(600), Pod)),
                Some((Bytes::from_mib(500), Libvirt)),
                None,
                None,
            )
            .limits(Bytes::from_mib(1024));
        assert_eq!((l.min, l.max), (Bytes::from_mib(500), Bytes::from_mib(500)));
        assert_eq!(f, from(Libvirt, Libvirt));
        let shares_set = VmConfig {
            shares: Some(500),
            max_mib: None,
            ..vm.clone()
        };
        let pve_max = Some((Bytes::from_mib(1024), Proxmox));
        let (l, f) = Bounds::new(Some(&shares_set), &d)
            .under(hv.0, pve_max, Some(2000), Some(&shares_set))
            .limits(Bytes::from_mib(8192));
        assert_eq!(
            (l.min, l.max, l.shares),
            (Bytes::from_mib(512), Bytes::from_mib(1024), 500)
        );
        assert_eq!(f, from(Config, Proxmox), "each bound from its own source");
    }
}
