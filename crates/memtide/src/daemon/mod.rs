//! The daemon: collect → `Engine::tick` → actuate, every interval, with status, metrics
//! and an event log. Everything here is glue; decisions are made in `memtide-core`.

pub mod backoff;
pub mod connect;
pub mod endpoint;
pub mod events;
pub mod fleet;
pub mod hugepages;
mod lifecycle;
mod passes;
pub mod place;
pub mod pods;
pub mod pve;
pub mod reclaim;
pub mod state;
pub mod vm_task;
pub mod writes;

use crate::config::{Config, ReclaimVms};
use crate::control::Request;
use crate::policies;
use crate::snapshots::{self, Store, TakenBy};
use crate::status::{Counters, Placed, SharedStatus, Status};
use crate::{control, http};
use anyhow::Context;
use events::EventLog;
use fleet::{Answered, Fleet, FleetEvent, Sent};
use lifecycle::{Restoring, SaveDone};
use memtide_adapters::host::{HostPaths, LinuxHost};
use memtide_adapters::ksm;
use memtide_core::backend::AfterSave;
use memtide_core::backend::HostBackend;
use memtide_core::hibernate::{Idleness, Pace};
use memtide_core::recovery::{Recovery, Room};
use memtide_core::{
    guest_text, Action, BackendError, Bytes, Decision, Engine, KsmSettings, Snapshot, VmSample,
    VmSnapshot,
};
use memtide_sim::Recorder;
use passes::{CollapsePass, PlacePass, ReclaimPass, RECLAIM_WAIT_AT_STOP};
use state::{Restored, StateFile};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};
use tracing::Instrument;

/// A KSM write running off the runtime: its result, when it returns.
type KsmWrite = tokio::task::JoinHandle<Result<(), ksm::WriteError>>;

/// The share of the interval a tick waits for samples: a VM whose sample has not
/// arrived by then is left out of the decision.
const SAMPLE_SHARE: f64 = 0.5;
/// The share of the interval by which a tick stops waiting for balloon commands to be
/// answered: one answered later is reported by a later tick.
const ACTUATION_SHARE: f64 = 0.75;

/// Ticks between two readings of the host's memory tiers.
const TIERS_EVERY: u64 = 30;

/// How to run.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Decide and log, but change nothing.
    pub dry_run: bool,
    /// Stop after this many ticks.
    pub ticks: Option<u64>,
    /// The configuration file the daemon was started from, read again at each reload
    /// (none: the built-in defaults).
    pub config_file: Option<std::path::PathBuf>,
}

/// Everything a tick needs.
struct Daemon {
    config: Config,
    /// The host-side access sampling the VMs were connected with (the configuration's at
    /// start: a reload does not change it).
    sampling: memtide_adapters::qmp::AccessSampling,
    options: RunOptions,
    interval: Duration,
    host: LinuxHost,
    fleet: Fleet,
    engine: Engine,
    events: EventLog,
    status: SharedStatus,
    counters: Counters,
    /// Balloon commands sent and not answered yet, by VM.
    pending: HashMap<String, (Action, Option<Bytes>)>,
    /// A KSM write not returned by its tick, with its action: at most one runs.
    ksm_write: Option<(Action, KsmWrite)>,
    start: Instant,
    recorder: Option<Recorder>,
    recording: writes::Retry,
    state: Option<StateFile>,
    state_writes: writes::Retry,
    store: Store,
    /// Where a save's outcome comes back to the daemon, to be logged and answered.
    saves: mpsc::Sender<SaveDone>,
    /// How long each VM has been idle, for hibernation.
    idleness: Idleness,
    /// One hibernation at a time, each seen before the next.
    pace: Pace,
    /// When each VM with `snapshot_every_s` is due for its next snapshot.
    next_snapshot: HashMap<String, Instant>,
    /// The VMs being saved, from the save's start to its snapshot made whole, each with
    /// what becomes of it after.
    saving: HashMap<String, AfterSave>,
    /// The hibernated VMs may have changed: read the store again.
    recount_hibernated: bool,
    /// The hibernated VMs, as last read from the store: each VM's newest snapshot where
    /// it is a hibernation not woken from.
    asleep: Vec<snapshots::Snapshot>,
    /// The VMs a restore (after a crash, or a scheduled wake) runs for: one at a time.
    restores: HashSet<String>,
    /// The crashed VMs whose restore waits for the host to have room, with their size.
    waiting: HashMap<String, Bytes>,
    /// The host's memory at the last tick, for a restore to wait for room.
    room: Room,
    /// The restores made after crashes, for their limit.
    recovery: Recovery,
    /// Where crash recovery's and scheduled wakes' steps run off the loop come back.
    restoring: mpsc::Sender<Restoring>,
    /// The latest `wake_at` time (seconds since the epoch) each VM was woken for, or
    /// tried: a wake that failed is tried again only at its next time.
    woken_for: HashMap<String, u64>,
    /// Proactive reclaim's pacers (taken while a pass runs off the runtime).
    reclaimer: Option<reclaim::Reclaimer>,
    /// The reclaim pass running off the runtime, if any: the pacers and what they did.
    reclaiming: Option<ReclaimPass>,
    /// Which VMs' guest RAM to put back in huge pages (`[host] restore_huge_pages`), and
    /// the host's page sizes: `None` when off, where the host cannot, or once advice to
    /// another process was refused.
    huge_pages: Option<(hugepages::Restore, memtide_adapters::hugepages::Sizes)>,
    /// The huge-page pass running off the runtime, if any.
    collapsing: Option<CollapsePass>,
    /// The nodes placement moves pages between, when `[tiering] place` is on.
    tier_nodes: Option<crate::placement::Nodes>,
    /// Placement's trackers (taken while a pass runs off the runtime).
    tier_placer: Option<place::TierPlacer>,
    /// Each placed VM's cold age as the placer last told it, for the state file.
    cold_ages: BTreeMap<String, place::KeptAge>,
    /// The placement pass running off the runtime, if any.
    placing: Option<PlacePass>,
    /// When the latest placement pass started.
    place_started: Option<Instant>,
    /// Where each placed VM's memory is, after its latest pass.
    placed: BTreeMap<String, Placed>,
}

/// What the daemon needs before it starts, checked: `run` starts from it, and
/// `memtide check-config` checks it without starting anything.
pub struct Checked {
    settings: crate::config::Settings,
    host: LinuxHost,
    policy: Box<dyn memtide_core::policy::Policy>,
    /// Which of its policies decides each VM.
    policies: crate::status::Policies,
    tier_nodes: Option<crate::placement::Nodes>,
}

/// Check what the daemon needs from `config` and the host, changing nothing: the
/// settings, the host's statistics (its /proc, /sys and domain cgroup), every policy
/// (files parsed), and tier placement's nodes, so that a bad setup fails at once and
/// clearly — and fails `check-config` as it would fail `run`.
pub fn check(config: &Config) -> anyhow::Result<Checked> {
    let checked = check_quietly(config)?;
    warn_without_page_tracking(config);
    if let Some(nodes) = checked.tier_nodes {
        tracing::info!(
            "placing VMs' pages between node {} (fast) and node {} (slow)",
            nodes.fast,
            nodes.slow
        );
        if let Some(why) = crate::placement::numa_balancing_fights(&config.host.proc) {
            tracing::warn!("[tiering] place: {why}");
        }
    }
    Ok(checked)
}

/// [`check`], logging nothing: a reload's test of its file.
fn check_quietly(config: &Config) -> anyhow::Result<Checked> {
    let settings = config.settings()?;
    let mut host = LinuxHost::new(HostPaths {
        proc: config.host.proc.clone(),
        sys: config.host.sys.clone(),
        domain_cgroup: config.host.domain_cgroup.clone(),
    });
    host.sample().context("reading host statistics")?;
    check_paths(config)?;
    let (policy, vm_policies) = policies::load_named(config).context("loading the policy")?;
    let tier_nodes = match config.tiering.place {
        false => None,
        true => {
            let t = &config.tiering;
            let tiers = memtide_adapters::tiers::read(&config.host.sys, &config.host.proc);
            let nodes = place::choose_nodes(&tiers.nodes, t.fast_node, t.slow_node)
                .map_err(|e| anyhow::anyhow!("[tiering] place: {e}"))?;
            place::check_not_own(&config.vms, std::process::id() as i32)
                .map_err(|e| anyhow::anyhow!("[[vm]] pid: {e}"))?;
            Some(nodes)
        }
    };
    Ok(Checked {
        settings,
        host,
        policy,
        policies: vm_policies,
        tier_nodes,
    })
}

/// Refuse a `[host] sys` that is no sysfs (read as a host without KSM, a typo there would
/// turn KSM control off unsaid) and an event log or state file that is a directory (the
/// one failed `run` at start, the other every tick's write: `check-config` said ok), and
/// warn of a `[reclaim] cgroup_root` that is no cgroup v2 hierarchy where reclaim may
/// find a VM's cgroup through it (reclaim would fail at every tick; a VM with a
/// `reclaim_cgroup` of its own does not need it).
fn check_paths(config: &Config) -> anyhow::Result<()> {
    let sys = &config.host.sys;
    if !sys.join("kernel/mm").is_dir() {
        anyhow::bail!(
            "[host] sys = {}: no kernel/mm there: not the host's sysfs",
            sys.display()
        );
    }
    let d = &config.daemon;
    for (key, file) in [("event_log", &d.event_log), ("state_file", &d.state_file)] {
        if file.is_dir() {
            anyhow::bail!(
                "[daemon] {key} = {}: a directory: name a file (in it or elsewhere)",
                file.display()
            );
        }
    }
    // Each file the daemon writes, where there is one (a recording in its directory).
    let recording = d.record_dir.join("record-0.jsonl.gz");
    let written = [
        ("socket", &d.socket, &d.socket),
        ("event_log", &d.event_log, &d.event_log),
        ("state_file", &d.state_file, &d.state_file),
        ("record_dir", &d.record_dir, &recording),
    ];
    let set = written
        .into_iter()
        .filter(|(_, set, _)| !set.as_os_str().is_empty());
    for (key, shown, file) in set {
        if let Some(why) = unmakeable(file) {
            anyhow::bail!("[daemon] {key} = {}: {why}", shown.display());
        }
    }
    let root = &config.reclaim.cgroup_root;
    let own =
        |vm: &crate::config::VmConfig| vm.reclaim == Some(true) && vm.reclaim_cgroup.is_none();
    let used = config.reclaim.vms != ReclaimVms::Off || config.vms.iter().any(own);
    if used && !root.join("cgroup.controllers").is_file() {
        tracing::warn!(
            "[reclaim] cgroup_root = {}: no cgroup v2 hierarchy there (no \
             cgroup.controllers; where cgroup v1 is mounted beside it, v2 is often at \
             /sys/fs/cgroup/unified): reclaim of a VM without a reclaim_cgroup will fail",
            root.display()
        );
    }
    Ok(())
}

/// Why no file could be made at `path` (found by an audit: `check-config` said ok, and
/// `run` failed or wrote nothing): the nearest of its parents that is there is no
/// directory, or is on a read-only file system. Not whether the daemon's user may write
/// there, nor what a service manager's sandbox allows.
fn unmakeable(path: &std::path::Path) -> Option<String> {
    use std::io::ErrorKind;
    // A relative path's first parent is empty: the working directory.
    let here = |dir: &'_ std::path::Path| match dir.as_os_str().is_empty() {
        true => std::path::Path::new(".").to_path_buf(),
        false => dir.to_path_buf(),
    };
    let mut dir = path.parent()?;
    loop {
        let at = here(dir);
        match std::fs::metadata(&at) {
            Ok(m) if m.is_dir() => break,
            Ok(_) => {
                return Some(format!(
                    "{} is a file, where a directory is needed",
                    at.display()
                ))
            }
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => {
                dir = dir.parent()?;
            }
            // Not this user's to see (check-config run by another than the daemon's).
            Err(e) if e.kind() == ErrorKind::PermissionDenied => return None,
            Err(e) => return Some(format!("{}: {e}", at.display())),
        }
    }
    let at = here(dir);
    match rustix::fs::access(&at, rustix::fs::Access::WRITE_OK) {
        Err(rustix::io::Errno::ROFS) => {
            Some(format!("{} is on a read-only file system", at.display()))
        }
        _ => None,
    }
}

/// Say at once, not at the first VM, that page tracking was asked for on a kernel
/// without it: what sampling falls back to, or that there is none.
fn warn_without_page_tracking(config: &Config) {
    use memtide_adapters::access::{Method, TrackError};
    use memtide_adapters::qmp::vm::AccessSampling;
    let AccessSampling::Tracked {
        fallback, method, ..
    } = config.sample_access()
    else {
        return;
    };
    // The trackers' own errors, as a VM's tracker would say them.
    let bitmap = config.host.sys.join("kernel/mm/page_idle/bitmap");
    let no_idle = (!bitmap.exists()).then_some(bitmap);
    let admin = memtide_adapters::damon::admin_dir(&config.host.sys);
    let no_damon = memtide_adapters::damon::supported(&admin).err();
    let missing = match (method, no_idle, no_damon) {
        (Method::IdlePages, Some(idle), _) => TrackError::Unsupported(idle),
        (Method::Damon, _, Some(damon)) => TrackError::Damon(damon),
        (Method::Auto, Some(idle), Some(damon)) => TrackError::Neither { idle, damon },
        _ => return,
    };
    let then = match fallback {
        true => {
            "host-side access sampling falls back to clear_refs, which sees guest \
                 accesses under TCG only"
        }
        false => {
            "there will be no host-side access sampling (sample_access = true falls \
                  back to clear_refs)"
        }
    };
    tracing::warn!("[host] sample_access: {missing}; {then}");
}

/// How long the daemon, stopping, waits for its last answers to reach their askers.
const ANSWERS_WAIT_AT_STOP: Duration = Duration::from_secs(2);

/// Run the daemon until SIGTERM/SIGINT (or the requested number of ticks).
pub async fn run(config: Config, options: RunOptions) -> anyhow::Result<()> {
    // Check every resource before starting, so a bad setup fails at once and clearly.
    let Checked {
        settings,
        host,
        policy,
        policies: vm_policies,
        tier_nodes,
    } = check(&config)?;
    let nofile = raise_nofile_limit();
    let dir = &config.daemon.record_dir;
    let recorder = match settings.record {
        None => None,
        Some(rc) => Some(
            Recorder::open(dir, rc).with_context(|| format!("recording to {}", dir.display()))?,
        ),
    };
    let mut events = EventLog::open(&config.daemon.event_log).with_context(|| {
        format!(
            "opening the event log {}",
            config.daemon.event_log.display()
        )
    })?;
    let status = SharedStatus::new(Status {
        version: env!("CARGO_PKG_VERSION").into(),
        started: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
        interval_s: config.interval_s,
        dry_run: options.dry_run,
        last_tick_ms: 0.0,
        last_decision_unix_s: None,
        host_error: None,
        policy_error: None,
        restart_pending: Vec::new(),
        policies: vm_policies,
        decision: None,
        waiting: Vec::new(),
        sampling: Vec::new(),
        counters: Counters::default(),
        recent_events: Vec::new(),
        tiers: Default::default(),
        hibernated: Vec::new(),
        placed: Vec::new(),
    });
    let (requests, mut incoming) = mpsc::channel(8);
    let control = control::serve(
        &config.daemon.socket,
        &config.control,
        status.clone(),
        requests,
    )
    .await?;
    if let Some(addr) = settings.http {
        let addr = http::serve(addr, status.clone(), http::Limits::under(nofile)).await?;
        tracing::info!("serving /metrics and /api/v1/status on http://{addr}");
    }
    let mut fleet = Fleet::new(&config, Arc::new(connect::Connectors::new(&config)));
    if config.libvirt.kubevirt_pod_bounds {
        fleet.take_pod_bounds(start_pod_bounds(&config)?);
    }
    let mut engine = Engine::new(config.engine.clone(), policy);
    let mode = if options.dry_run {
        " (dry run: nothing is changed)"
    } else {
        ""
    };
    let version = env!("CARGO_PKG_VERSION");
    let message = format!(
        "memtide {version} started, policy {}{mode}",
        engine.policy_name()
    );
    events.log("started", None, None, message);
    let ages = tier_nodes.map(|_| config.tiering.ages());
    let mut state = state::open(
        &config.daemon.state_file,
        &options,
        &mut engine,
        ages.as_ref(),
        &mut events,
    );
    let tier_placer = tier_nodes.map(|nodes| {
        let host = &config.host;
        let mut placer =
            place::TierPlacer::new(nodes, &config.tiering, host.proc.clone(), host.sys.clone());
        if let Some(state) = &mut state {
            placer.resume(state.take_cold_ages());
        }
        placer
    });

    let (saves, mut saved) = mpsc::channel(8);
    let (restoring, mut restored) = mpsc::channel(8);
    let store = Store::new(&config.snapshots.dir);
    let unfinished = store.unfinished().unwrap_or_else(|e| {
        tracing::warn!("snapshot store: {e:#}");
        Vec::new()
    });
    for left in unfinished {
        let message = format!(
            "a save cut short (memtide stopped at once, or was killed, while it saved): {}",
            left.describe()
        );
        events.log("snapshot_unfinished", Some(&left.vm), None, message);
    }
    let huge_pages = config.host.restore_huge_pages.then(|| {
        memtide_adapters::hugepages::supported(&config.host.sys)
            .inspect_err(|e| {
                tracing::warn!(
                    "huge pages are not restored after a balloon gives memory back: {e} \
                     ([host] restore_huge_pages = false silences this)"
                )
            })
            .ok()
            .map(|sizes| (hugepages::Restore::default(), sizes))
    });
    let mut daemon = Daemon {
        sampling: config.sample_access(),
        config,
        options,
        interval: settings.interval,
        host,
        fleet,
        engine,
        events,
        status,
        counters: Counters::default(),
        pending: HashMap::new(),
        ksm_write: None,
        start: Instant::now(),
        recorder,
        recording: writes::Retry::default(),
        state,
        state_writes: writes::Retry::default(),
        store,
        saves,
        idleness: Idleness::default(),
        pace: Pace::default(),
        next_snapshot: HashMap::new(),
        saving: HashMap::new(),
        recount_hibernated: true,
        asleep: Vec::new(),
        restores: HashSet::new(),
        waiting: HashMap::new(),
        room: Room {
            total: Bytes::ZERO,
            freeable: Bytes::ZERO,
            size: Bytes::ZERO,
        },
        recovery: Recovery::default(),
        restoring,
        woken_for: HashMap::new(),
        reclaimer: None,
        reclaiming: None,
        huge_pages: huge_pages.flatten(),
        collapsing: None,
        tier_nodes,
        tier_placer,
        cold_ages: BTreeMap::new(),
        placing: None,
        place_started: None,
        placed: BTreeMap::new(),
    };
    let mut interval = tokio::time::interval(settings.interval);
    interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    // Under systemd (Type=notify) the unit is started once the control socket and HTTP
    // answer and the signals are handled; elsewhere NOTIFY_SOCKET is unset and this does
    // nothing.
    notify(sd_notify::NotifyState::Ready);
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = hup.recv() => {
                let _ = daemon.reload();
                continue;
            }
            Some(request) = incoming.recv() => {
                match request {
                    Request::Reload(reply) => drop(reply.send(daemon.reload())),
                    Request::Save { vm, then, reply } => {
                        daemon.save(vm, then, TakenBy::Operator, reply)
                    }
                    Request::Connect(vm) => daemon.fleet.reconnect_now(&vm),
                }
                continue;
            }
            Some(done) = saved.recv() => {
                daemon.saved(done);
                continue;
            }
            Some(step) = restored.recv() => {
                daemon.recover(step);
                continue;
            }
        }
        let n = daemon.counters.ticks + 1;
        daemon
            .tick()
            .instrument(tracing::info_span!("tick", n))
            .await;
        if daemon
            .options
            .ticks
            .is_some_and(|n| daemon.counters.ticks >= n)
        {
            break;
        }
    }
    notify(sd_notify::NotifyState::Stopping);
    let again = async {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    };
    let at_once = daemon
        .finish_under_way(&mut saved, &mut restored, &mut incoming, again)
        .await;
    // Requests asked from now on are answered that memtide stops; the answers given
    // (the saves that ended) are written to their askers before the daemon ends, but
    // where it was told to stop at once.
    incoming.close();
    while let Ok(request) = incoming.try_recv() {
        lifecycle::refuse_while_stopping(request);
    }
    if !at_once {
        control.answered(ANSWERS_WAIT_AT_STOP).await;
    }
    // The last reclaim and placement passes, if they run, are told before the daemon
    // says it stopped.
    if let Some(pass) = daemon.reclaiming.take() {
        let _ = tokio::time::timeout(RECLAIM_WAIT_AT_STOP, daemon.reclaimed(pass)).await;
    }
    if let Some(pass) = daemon.placing.take() {
        let _ = tokio::time::timeout(RECLAIM_WAIT_AT_STOP, daemon.placed(pass)).await;
    }
    if let Some(pass) = daemon.collapsing.take() {
        let _ = tokio::time::timeout(RECLAIM_WAIT_AT_STOP, daemon.collapsed(pass)).await;
    }
    daemon
        .events
        .log("stopped", None, None, "memtide stopped".into());
    Ok(())
}

/// Start listing this node's KubeVirt launcher pods from the Kubernetes API server
/// (`[libvirt] kubevirt_pod_bounds`). A pod without a service account, or without its
/// node's name in `NODE_NAME`, is a setup error, refused at start; an API server that
/// does not answer is not ([`pods`]).
fn start_pod_bounds(config: &Config) -> anyhow::Result<Arc<pods::PodBounds>> {
    let context = "[libvirt] kubevirt_pod_bounds";
    let node = std::env::var("NODE_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .with_context(|| {
            format!("{context}: NODE_NAME is not set (the DaemonSet sets it to spec.nodeName)")
        })?;
    let api = memtide_adapters::kubevirt::api::ApiServer::in_cluster(config.call_timeout() * 4)
        .context(context)?;
    let every = Duration::from_secs_f64(config.libvirt.kubevirt_pod_refresh_s);
    tracing::info!(
        "KubeVirt pod bounds: listing the launcher pods on {node} every {} s",
        every.as_secs_f64()
    );
    Ok(pods::start(api, node, every))
}

/// Tell systemd `state`; a failure is logged, never fatal (the daemon works without it).
fn notify(state: sd_notify::NotifyState) {
    if let Err(e) = sd_notify::notify(&[state]) {
        tracing::warn!("cannot notify systemd: {e}");
    }
}

/// Raise the soft limit on open descriptors to the hard one, and return the limit in
/// force: HTTP clients get a small share of it (`http::Limits`), VMs and the tick the rest.
fn raise_nofile_limit() -> u64 {
    rlimit::increase_nofile_limit(u64::MAX).unwrap_or_else(|e| {
        tracing::warn!("cannot raise the limit on open descriptors: {e}");
        rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(1024, |(soft, _)| soft)
    })
}

/// Bound and escape the text a VM sent (its sample's error, its agent's) before the
/// engine, the status and the logs keep it.
fn clean_guest_text(vm: &mut VmSnapshot) {
    match &mut vm.sample {
        Err(e) => guest_text::clean_error(e),
        Ok(VmSample {
            agent: Some(Err(e)),
            ..
        }) => *e = guest_text::clean(e),
        Ok(_) => {}
    }
}

impl Daemon {
    /// Reopen the event log (after logrotate moved it) and load the policy again from
    /// the configuration file read again (its policy settings and the VMs' bounds; what
    /// else changed in it is said to wait for a restart); a file or policy that fails to
    /// load is rejected and the running policy stays in force. SIGHUP and `memtide
    /// reload` alike.
    fn reload(&mut self) -> Result<String, String> {
        // Logged by the event log itself (an error on stderr).
        let unopened = self.events.reopen().err().map(|e| {
            format!(
                "; the event log {} could not be reopened: {e}: events are lost (counted in \
                 memtide_write_errors_total{{file=\"event_log\"}}) until it can be, tried \
                 again at each event",
                self.events.path().display()
            )
        });
        let result = self.reread().and_then(|(next, left, note)| {
            let (policy, vm_policies) = policies::load_named(&next).map_err(|e| e.to_string())?;
            let name = policy.name().to_string();
            self.engine.set_policy(policy, self.start.elapsed());
            self.status.write().policies = vm_policies;
            self.fleet.reload_bounds(&next);
            self.config = next;
            self.status.write().restart_pending = left.iter().map(|s| s.to_string()).collect();
            let mut message = match &self.options.config_file {
                Some(file) => format!("policy {name} loaded from {}", file.display()),
                None => format!(
                    "policy {name} loaded (memtide started without a configuration file: \
                     none is read)"
                ),
            };
            if !left.is_empty() {
                message += &format!("; not applied until memtide restarts: {}", left.join(", "));
            }
            Ok(message + note.as_deref().unwrap_or_default())
        });
        let result = result.map_err(|e| {
            format!(
                "policy rejected, {} stays in force: {e}",
                self.engine.policy_name()
            )
        });
        // The operator's word, where the reload stands (found by an audit: a rejected
        // one took them back too): VMs left alone because another manager moved their
        // balloons are managed again, and KSM if someone else had set its knobs.
        if result.is_ok() {
            for vm in self.engine.manage_again() {
                let message = "managed again on reload (another manager had moved its balloon)";
                self.events
                    .log("vm_managed_again", Some(&vm), None, message.into());
            }
        }
        self.status.write().policy_error = result.as_ref().err().cloned();
        // The answer, and the event status shows after a SIGHUP, say so too.
        let result = match unopened {
            Some(note) => result.map(|m| m + &note).map_err(|m| m + &note),
            None => result,
        };
        let (kind, message) = match &result {
            Ok(message) => ("policy_reloaded", message),
            Err(message) => ("policy_rejected", message),
        };
        self.events.log(kind, None, None, message.clone());
        result
    }

    /// The configuration to reload from: the file the daemon started from read again,
    /// its policy taken and what else changed in it named ([`Config::with_policy_of`]);
    /// the configuration in force where it started without a file. A file memtide would
    /// not start from ([`check`]: the host's paths, the daemon's files, tier placement's
    /// nodes) is refused as `check-config` refuses it, where the edit is at fault (found by
    /// an audit: a reload took a `[host]` typo, and the next restart failed); where the
    /// configuration in force would fail as well (the host changed: a node gone, a file
    /// system read-only), the reload goes on, its answer saying so (a `String` note).
    fn reread(&self) -> Result<(Config, Vec<&'static str>, Option<String>), String> {
        match &self.options.config_file {
            None => Ok((self.config.clone(), Vec::new(), None)),
            Some(file) => {
                let fresh = Config::load(file).map_err(|e| e.to_string())?;
                let note = match check_quietly(&fresh) {
                    Ok(_) => None,
                    Err(e) if check_quietly(&self.config).is_err() => Some(format!(
                        "; memtide would not start again from this file, nor from the \
                         configuration in force (the host changed?): {e:#}"
                    )),
                    Err(e) => return Err(format!("memtide would not start from it: {e:#}")),
                };
                let (next, left) = self.config.with_policy_of(&fresh, self.sampling);
                Ok((next, left, note))
            }
        }
    }

    async fn tick(&mut self) {
        let t0 = Instant::now();
        let connected = self.fleet.refresh();
        self.log_fleet(&connected);
        let host = match self.host.sample() {
            Ok(h) => h,
            Err(e) => {
                let message = format!("host statistics unreadable, tick skipped: {e}");
                self.events.log("host_error", None, None, message.clone());
                self.counters.host_errors += 1;
                self.publish(None, Some(message), t0);
                return;
            }
        };
        let mut sampled = self
            .fleet
            .sample(t0 + self.interval.mul_f64(SAMPLE_SHARE))
            .await;
        sampled.vms.iter_mut().for_each(clean_guest_text);
        if let Some(state) = &mut self.state {
            state.restore_targets(&mut sampled.vms);
        }
        self.log_fleet(&sampled.events);
        sampled.balloons.iter().for_each(|a| self.answered_late(a));
        // Dated when the samples were asked for: the tick's start, not when the slowest
        // answer came, so that a late VM shifts no one's timeline.
        let snapshot = Snapshot {
            at: t0.duration_since(self.start),
            host,
            vms: sampled.vms,
        };
        self.started_again(&snapshot);
        self.ksm_written();
        self.engine.ksm_writing(self.ksm_write.is_some());
        let decision = self.engine.tick(&snapshot);
        self.record(&snapshot, &decision);
        self.actuate(&decision, t0 + self.interval.mul_f64(ACTUATION_SHARE))
            .await;
        self.reclaim(&snapshot, &decision).await;
        self.restore_huge_pages(&snapshot, decision.host.need).await;
        self.place(&snapshot).await;
        self.hibernate_idle(&snapshot, &decision);
        self.restore_waiting(&decision.host);
        self.snapshot_on_schedule();
        self.reread_asleep();
        self.wake_on_schedule();
        self.save_state(&decision).await;
        self.events.diagnostics(&decision);
        for d in &decision.diagnostics {
            *self
                .counters
                .diagnostics
                .entry(d.kind.as_str().into())
                .or_default() += 1;
        }
        self.counters.ticks += 1;
        self.publish(Some(decision), None, t0);
    }

    /// Record the tick for replay; a failure (a full disk) pauses recording, not the daemon.
    fn record(&mut self, snapshot: &Snapshot, decision: &Decision) {
        let Some(recorder) = &mut self.recorder else {
            return;
        };
        let tick = self.counters.ticks;
        if self.recording.due(tick) {
            let result = recorder.record(snapshot, decision);
            let result = result.map_err(|e| e.to_string());
            let (events, counters) = (&mut self.events, &mut self.counters);
            self.recording
                .outcome("recording", tick, result, events, counters);
        }
    }

    /// Write the state file after the tick's actions; a failure (a full disk) is retried.
    async fn save_state(&mut self, decision: &Decision) {
        let Some(state) = &mut self.state else {
            return;
        };
        let tick = self.counters.ticks;
        if self.state_writes.due(tick) {
            if let Some(placer) = &self.tier_placer {
                self.cold_ages = placer.ages();
            }
            let bytes = state.encode(decision, &self.engine, &self.cold_ages);
            let result = state.write_off_worker(bytes).await;
            let result = result.map_err(|e| e.to_string());
            let (events, counters) = (&mut self.events, &mut self.counters);
            self.state_writes
                .outcome("state", tick, result, events, counters);
        }
    }

    fn log_fleet(&mut self, events: &[FleetEvent]) {
        // A VM (re)connected may have been woken from its hibernation.
        let connected = |e: &FleetEvent| matches!(e, FleetEvent::Connected { .. });
        self.recount_hibernated |= events.iter().any(connected);
        for e in events {
            match e {
                FleetEvent::Connected {
                    vm,
                    endpoint,
                    resumed,
                } => {
                    self.events.log(
                        "vm_connected",
                        Some(vm),
                        None,
                        format!("connected through {endpoint}"),
                    );
                    if let Some(resumed) = resumed {
                        self.events
                            .log("vm_resumed", Some(vm), None, resumed.clone());
                    }
                    if !self.restores.contains(vm) {
                        self.running_on(vm);
                    }
                    let restored = (self.state.as_mut())
                        .and_then(|s| s.connected(vm, self.fleet.hypervisor(vm)));
                    if let Some(restored) = restored {
                        self.state_restored(vm, restored);
                    }
                }
                FleetEvent::Lost {
                    vm,
                    why,
                    shut_down,
                    pid,
                    started,
                } => {
                    // Why it went, where that was no fault: its hypervisor announced a
                    // shutdown, or memtide was saving it (a hibernation ends its QEMU).
                    let rule = match () {
                        _ if *shut_down => Some("shut_down"),
                        _ if self.saving.contains_key(vm) => Some("saving"),
                        _ => None,
                    };
                    let mut message = format!("connection lost: {why}");
                    // Whether its process went with it (killed, crashed) or runs on (its
                    // monitor alone went away, or it hangs); not said of one that shut
                    // down or was saved, which may take a moment to end. Another process
                    // at its pid is not it.
                    if let (Some(pid), None) = (pid, rule) {
                        let proc = &self.config.host.proc;
                        let runs = memtide_adapters::procfs::process_runs_as(proc, *pid, *started);
                        message += &match runs {
                            true => format!("; its hypervisor process {pid} still runs"),
                            false => format!("; its hypervisor process {pid} has exited"),
                        };
                    }
                    self.events.log("vm_lost", Some(vm), rule, message);
                    if let Some(state) = &mut self.state {
                        state.forget_target(vm);
                    }
                    self.lost(vm, *shut_down, pid.map(|pid| (pid, *started)));
                }
                FleetEvent::Process { vm, pid, was } => {
                    let message = match was {
                        Some(was) => format!(
                            "its hypervisor process is now {pid} (was {was}): reclaim, \
                             huge pages and placement act on it"
                        ),
                        None => format!(
                            "its hypervisor process {pid} known after connecting: reclaim, \
                             huge pages and placement act on it"
                        ),
                    };
                    self.events.log("vm_process", Some(vm), None, message);
                    let found = match (&mut self.state, self.fleet.hypervisor(vm)) {
                        (Some(state), Some(h)) => state.process_found(vm, h),
                        _ => None,
                    };
                    if let Some(why) = found {
                        self.state_restored(vm, Restored::Afresh(why));
                    }
                }
            }
        }
    }

    /// Log what became of VM `vm`'s restored state, its estimator forgotten where it
    /// starts afresh.
    fn state_restored(&mut self, vm: &str, restored: Restored) {
        let why = match restored {
            Restored::Afresh(why) => {
                self.engine.forget_recalled(vm);
                why
            }
            Restored::Unchecked(why) => why,
        };
        self.events.log("state", Some(vm), None, why);
    }

    /// Carry out the decision's actions (unless in a dry run) and log each with its result;
    /// a balloon command not answered by `deadline` is logged when its answer comes.
    async fn actuate(&mut self, decision: &Decision, deadline: Instant) {
        let balloons: Vec<_> = decision
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::SetBalloon { vm, target, .. } => Some((vm.clone(), *target)),
                Action::SetKsm { .. } => None,
            })
            .collect();
        let mut balloon_results = if self.options.dry_run {
            Vec::new()
        } else {
            self.fleet.set_balloons(&balloons, deadline).await
        }
        .into_iter();
        self.ksm_written();
        // Each balloon's size when decided, looked up once per tick (not per action).
        let actuals: HashMap<&str, Bytes> = decision
            .vms
            .iter()
            .filter_map(|v| Some((v.name.as_str(), v.actual?)))
            .collect();
        for action in &decision.actions {
            let actual = match action {
                Action::SetBalloon { vm, .. } => actuals.get(vm.as_str()).copied(),
                Action::SetKsm { .. } => None,
            };
            let result = match action {
                _ if self.options.dry_run => None,
                Action::SetBalloon { .. } => balloon_results.next(),
                // Asked again once the write under way has returned.
                Action::SetKsm { .. } if self.ksm_write.is_some() => continue,
                Action::SetKsm { settings, .. } => Some(self.write_ksm(action, settings).await),
            };
            match (result, action) {
                (Some(Sent::InFlight), Action::SetBalloon { vm, .. }) => {
                    self.pending.insert(vm.clone(), (action.clone(), actual));
                }
                (Some(Sent::InFlight), Action::SetKsm { .. }) => {}
                (Some(Sent::Answered(result)), _) => {
                    self.log_action(action, actual, Some(&result), "");
                }
                _ => self.log_action(action, actual, None, ""),
            }
        }
    }

    /// Write KSM's knobs off the runtime (`run` 2 returns only once every merged page is
    /// unmerged, seconds to minutes), waiting up to the call timeout; a write still under
    /// way then is logged when it returns ([`Daemon::ksm_written`]).
    async fn write_ksm(&mut self, action: &Action, settings: &KsmSettings) -> Sent {
        let (dir, wanted) = (self.host.ksm_dir(), settings.clone());
        let mut write = tokio::task::spawn_blocking(move || ksm::write(&dir, &wanted));
        match tokio::time::timeout(self.config.call_timeout(), &mut write).await {
            Ok(done) => Sent::Answered(self.ksm_result(settings, done)),
            Err(_) => {
                self.ksm_write = Some((action.clone(), write));
                Sent::InFlight
            }
        }
    }

    /// Log a KSM write that returned after its tick.
    fn ksm_written(&mut self) {
        if !self
            .ksm_write
            .as_ref()
            .is_some_and(|(_, w)| w.is_finished())
        {
            return;
        }
        let Some((action, write)) = self.ksm_write.take() else {
            return;
        };
        let Action::SetKsm { settings, .. } = &action else {
            return;
        };
        let done = futures::FutureExt::now_or_never(write).expect("finished");
        let result = self.ksm_result(settings, done);
        self.log_action(&action, None, Some(&result), " (returned after its tick)");
    }

    /// A KSM write's result; the engine told of the knobs written (all of them, or those
    /// a failed write could not set back: otherwise they would read as someone else's)
    /// and of a failure (it gives up on KSM after a few in a row).
    fn ksm_result(
        &mut self,
        settings: &KsmSettings,
        done: Result<Result<(), ksm::WriteError>, tokio::task::JoinError>,
    ) -> Result<(), BackendError> {
        match done {
            Ok(Ok(())) => {
                self.engine.ksm_applied(settings);
                Ok(())
            }
            Ok(Err(e)) => {
                let why = e.to_string();
                let note = self.engine.ksm_failed(&e.left, &why);
                Err(BackendError::Io(why + note.as_deref().unwrap_or_default()))
            }
            Err(e) => Err(BackendError::Io(format!(
                "the KSM write ended abnormally: {e}"
            ))),
        }
    }

    /// Count and log a balloon command answered after the tick that sent it.
    fn answered_late(&mut self, a: &Answered) {
        if let Some((action, actual)) = self.pending.remove(&a.vm) {
            self.log_action(
                &action,
                actual,
                Some(&a.result),
                " (answered after its tick)",
            );
        }
    }

    /// Count and log an action decided when its VM's balloon stood at `actual`, with its
    /// result (`None`: a dry run), `note` added to it.
    fn log_action(
        &mut self,
        action: &Action,
        actual: Option<Bytes>,
        result: Option<&Result<(), BackendError>>,
        note: &str,
    ) {
        let (kind, vm, target) = match action {
            Action::SetBalloon { vm, target, .. } => ("balloon", Some(vm.as_str()), Some(*target)),
            Action::SetKsm { .. } => ("ksm", None, None),
        };
        let reason = action.reason();
        let decided = events::Decided {
            rule: Some(reason.rule.as_ref()),
            need: reason.need,
            target,
            actual,
        };
        self.counters.rule(&reason.rule);
        let (event, result, message) = match result {
            None => ("action", "dry_run", format!("would set {action} (dry run)")),
            Some(Ok(())) => ("action", "ok", format!("{action}{note}")),
            Some(Err(e)) => (
                "action_failed",
                "error",
                format!("{action} failed{note}: {e}"),
            ),
        };
        self.counters.action(kind, result);
        self.events.log_decided(event, vm, decided, message);
    }

    fn publish(&mut self, decision: Option<Decision>, host_error: Option<String>, t0: Instant) {
        // The host's tiers change only with hotplug: read at the first tick (`ticks` is 1
        // when it is published) and now and then after.
        let tiers = (self.counters.ticks % TIERS_EVERY == 1)
            .then(|| memtide_adapters::tiers::read(&self.config.host.sys, &self.config.host.proc));
        let hibernated = self.hibernated();
        let mut s = self.status.write();
        if let Some(tiers) = tiers {
            s.tiers = tiers;
        }
        s.hibernated = hibernated;
        s.placed = self.placed.values().cloned().collect();
        if decision.is_some() {
            s.decision = decision;
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
            s.last_decision_unix_s = now.ok().map(|d| d.as_secs_f64());
        }
        s.host_error = host_error;
        s.last_tick_ms = t0.elapsed().as_secs_f64() * 1000.0;
        self.counters
            .tick_took(s.last_tick_ms, s.interval_s * 1000.0);
        s.waiting = self.fleet.waiting();
        s.sampling = self.fleet.sampling();
        for w in &mut s.waiting {
            w.error = w.error.as_deref().map(guest_text::clean);
        }
        let lost = self.events.write_errors();
        if lost > 0 {
            self.counters.write_errors.insert("event_log".into(), lost);
        }
        s.counters = self.counters.clone();
        s.recent_events = self.events.recent();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memtide_core::policy::mom::Mom;
    use memtide_core::testkit::{host, snapshot, vm};
    use memtide_core::{BackendError, EngineConfig};

    #[test]
    fn guest_text_is_bounded_before_the_engine_keeps_it() {
        let mut agent = vm("agent", 1000, 800, 600);
        if let Ok(sample) = &mut agent.sample {
            sample.agent = Some(Err("\x1b[2J".repeat(30_000)));
        }
        let mut qmp = vm("qmp", 1000, 800, 600);
        qmp.sample = Err(BackendError::Protocol("x".repeat(130_000)));
        let mut vms = vec![agent, qmp];
        vms.iter_mut().for_each(clean_guest_text);
        let mut engine = Engine::new(EngineConfig::default(), Box::<Mom>::default());
        let decision = engine.tick(&snapshot(0, host(4000, 400), vms));
        let json = serde_json::to_string(&decision).unwrap();
        assert!(json.len() < 4096, "{} bytes", json.len());
        let messages: Vec<&str> = decision
            .diagnostics
            .iter()
            .map(|d| d.message.as_str())
            .collect();
        assert_eq!(messages.len(), 2, "{messages:?}");
        assert!(messages.iter().all(|m| !m.contains('\x1b')), "{messages:?}");
    }
}
