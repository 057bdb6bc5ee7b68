//! The daemon: collect → `Engine::tick` → actuate, every interval, with status, metrics
//! and an event log. Everything here is glue; decisions are made in `memtide-core`.

pub mod backoff;
pub mod connect;
pub mod endpoint;
pub mod events;
pub mod fleet;
pub mod hugepages;
pub mod place;
pub mod pods;
pub mod reclaim;
pub mod state;
pub mod vm_task;
pub mod writes;

use crate::config::Config;
use crate::control::Request;
use crate::policies;
use crate::snapshots::{self, Store, TakenBy};
use crate::status::{Counters, Hibernated, Placed, Status};
use crate::{control, http};
use anyhow::Context;
use events::EventLog;
use fleet::{Answered, Fleet, FleetEvent, Sent};
use memtide_adapters::host::{HostPaths, LinuxHost};
use memtide_core::backend::HostBackend;
use memtide_core::backend::{AfterSave, Seal};
use memtide_core::hibernate::{self, Idleness};
use memtide_core::reclaim::Keep;
use memtide_core::recovery::{Gone, Recovery, Room, Verdict};
use memtide_core::{
    guest_text, Action, BackendError, Bytes, Decision, Engine, Snapshot, VmEvent, VmSample,
    VmSnapshot,
};
use memtide_sim::Recorder;
use state::StateFile;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, MissedTickBehavior};
use tracing::Instrument;
use vm_task::SaveJob;

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
}

/// A reclaim pass running off the runtime: its pacers and what they did, when it ends.
type ReclaimPass = tokio::task::JoinHandle<(reclaim::Reclaimer, Vec<reclaim::Outcome>)>;

/// How long a stopping daemon waits for a reclaim pass still running.
const RECLAIM_WAIT_AT_STOP: Duration = Duration::from_secs(5);

/// A huge-page pass running off the runtime: what it did, when it ends.
type CollapsePass = tokio::task::JoinHandle<Vec<hugepages::Outcome>>;
/// A placement pass running off the runtime: the trackers and what it did, when it ends
/// (or why it panicked).
type PlacePass = tokio::task::JoinHandle<(place::TierPlacer, Result<Vec<place::Outcome>, String>)>;
/// Everything a tick needs.
struct Daemon {
    config: Config,
    options: RunOptions,
    interval: Duration,
    host: LinuxHost,
    fleet: Fleet,
    engine: Engine,
    events: EventLog,
    status: Arc<RwLock<Status>>,
    counters: Counters,
    /// Balloon commands sent and not answered yet, by VM.
    pending: HashMap<String, Action>,
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
    /// When each VM with `snapshot_every_s` is due for its next snapshot.
    next_snapshot: HashMap<String, Instant>,
    /// The VMs being saved, from the save's start to its snapshot made whole.
    saving: HashSet<String>,
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

/// Where a VM's task hands over a save's result.
type SaveReply = oneshot::Receiver<Result<memtide_core::backend::Saved, BackendError>>;
/// Where a save's seal hands over the snapshot it made whole, or why it could not.
type SealReply = oneshot::Receiver<Result<snapshots::Snapshot, String>>;

/// A save that ended, and who waits for its outcome.
struct SaveDone {
    vm: String,
    by: TakenBy,
    result: Result<snapshots::Snapshot, String>,
    reply: oneshot::Sender<Result<serde_json::Value, String>>,
}

/// Crash recovery's (`[[vm]] restore_on_crash`) and scheduled wakes' (`wake_at`)
/// steps run off the loop.
enum Restoring {
    /// How VM `vm`'s QEMU went, and its configured memory (its newest snapshot's).
    Judged { vm: String, gone: Gone, size: Bytes },
    /// A restore ended: what was done, or why it failed.
    Restored {
        vm: String,
        result: Result<crate::snapshot_cmd::Started, String>,
    },
}

/// How long a QEMU whose connection closed is given to be gone before it counts as
/// running: its process ends just after its sockets close.
const EXIT_GRACE: Duration = Duration::from_secs(2);

/// Run the daemon until SIGTERM/SIGINT (or the requested number of ticks).
pub async fn run(config: Config, options: RunOptions) -> anyhow::Result<()> {
    // Check every resource before starting, so a bad setup fails at once and clearly.
    let settings = config.settings()?;
    let nofile = raise_nofile_limit();
    let mut host = LinuxHost::new(HostPaths {
        proc: config.host.proc.clone(),
        sys: config.host.sys.clone(),
        domain_cgroup: config.host.domain_cgroup.clone(),
    });
    host.sample().context("reading host statistics")?;
    let policy = policies::load(&config).context("loading the policy")?;
    let tier_nodes = match config.tiering.place {
        false => None,
        true => {
            let t = &config.tiering;
            let tiers = memtide_adapters::tiers::read(&config.host.sys, &config.host.proc);
            let nodes = place::choose_nodes(&tiers.nodes, t.fast_node, t.slow_node)
                .map_err(|e| anyhow::anyhow!("[tiering] place: {e}"))?;
            place::check_not_own(&config.vms, std::process::id() as i32)
                .map_err(|e| anyhow::anyhow!("[[vm]] pid: {e}"))?;
            tracing::info!(
                "placing VMs' pages between node {} (fast) and node {} (slow)",
                nodes.fast,
                nodes.slow
            );
            Some(nodes)
        }
    };
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
    let status = Arc::new(RwLock::new(Status {
        version: env!("CARGO_PKG_VERSION").into(),
        started: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
        interval_s: config.interval_s,
        dry_run: options.dry_run,
        last_tick_ms: 0.0,
        host_error: None,
        policy_error: None,
        decision: None,
        waiting: Vec::new(),
        sampling: Vec::new(),
        counters: Counters::default(),
        recent_events: Vec::new(),
        tiers: Default::default(),
        hibernated: Vec::new(),
        placed: Vec::new(),
    }));
    let (requests, mut incoming) = mpsc::channel(8);
    let _control = control::serve(
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
        start: Instant::now(),
        recorder,
        recording: writes::Retry::default(),
        state,
        state_writes: writes::Retry::default(),
        store,
        saves,
        idleness: Idleness::default(),
        next_snapshot: HashMap::new(),
        saving: HashSet::new(),
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
                if let Err(e) = daemon.events.reopen() {
                    tracing::error!("cannot reopen the event log: {e}");
                }
                let _ = daemon.reload();
                continue;
            }
            Some(request) = incoming.recv() => {
                match request {
                    Request::Reload(reply) => drop(reply.send(daemon.reload())),
                    Request::Save { vm, then, reply } => {
                        daemon.save(vm, then, TakenBy::Operator, reply)
                    }
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
    /// Load the policy again; a policy that fails to load is rejected and the running
    /// one stays in force.
    fn reload(&mut self) -> Result<String, String> {
        // The operator's word: VMs left alone because another manager moved their
        // balloons are managed again, and KSM if someone else had set its knobs.
        for vm in self.engine.manage_again() {
            let message = "managed again on reload (another manager had moved its balloon)";
            self.events
                .log("vm_managed_again", Some(&vm), None, message.into());
        }
        let result = match policies::load(&self.config) {
            Ok(policy) => {
                let name = policy.name().to_string();
                self.engine.set_policy(policy);
                self.events.log(
                    "policy_reloaded",
                    None,
                    None,
                    format!("policy {name} loaded"),
                );
                Ok(name)
            }
            Err(e) => {
                let message = format!(
                    "policy rejected, {} stays in force: {e}",
                    self.engine.policy_name()
                );
                self.events
                    .log("policy_rejected", None, None, message.clone());
                Err(message)
            }
        };
        self.status.write().expect("status lock").policy_error = result.as_ref().err().cloned();
        result
    }

    /// Start saving VM `vm`'s memory into the store; `reply` takes the outcome when the
    /// save ends ([`Daemon::saved`]), or at once why it cannot start (logged either way).
    fn save(
        &mut self,
        vm: String,
        then: AfterSave,
        by: TakenBy,
        reply: oneshot::Sender<Result<serde_json::Value, String>>,
    ) {
        let (saved, sealed) = match self.start_save(&vm, then, by) {
            Ok(started) => started,
            Err(why) => {
                let message = format!("not saved: {why}");
                self.events.log("snapshot_failed", Some(&vm), None, message);
                self.counters.action("snapshot", "error");
                return drop(reply.send(Err(why)));
            }
        };
        let (done, store) = (self.saves.clone(), self.store.clone());
        tokio::spawn(async move {
            let result = match saved.await {
                // The seal's outcome: the snapshot made whole, or why not.
                Ok(Ok(_)) => sealed
                    .await
                    .unwrap_or_else(|_| Err("the snapshot was not made whole".into())),
                Ok(Err(e)) => {
                    let sealed = sealed.await.ok().and_then(Result::ok);
                    let e = e.to_string();
                    let ran_on = move || failed_after_seal(&store, sealed, e);
                    Err(tokio::task::spawn_blocking(ran_on)
                        .await
                        .unwrap_or_else(|e| e.to_string()))
                }
                Err(_) => Err("the VM was lost before its save ended".into()),
            };
            let done_save = SaveDone {
                vm,
                by,
                result,
                reply,
            };
            let _ = done.send(done_save).await;
        });
    }

    /// The snapshot begun for VM `vm` and the save handed to its task, or why not: where
    /// the save's result and the seal's (the snapshot made whole) will come.
    fn start_save(
        &mut self,
        vm: &str,
        then: AfterSave,
        by: TakenBy,
    ) -> Result<(SaveReply, SealReply), String> {
        if self.options.dry_run {
            return Err("a dry run changes nothing".into());
        }
        // One save of a VM at a time, from its start to its snapshot made whole: a
        // second one would remove the first's files as half-written.
        if self.saving.contains(vm) {
            return Err(format!("VM {vm} is being saved already"));
        }
        let Some(configured) = self.fleet.configured(vm) else {
            return Err(format!("VM {vm} is not connected, or not sampled yet"));
        };
        let pending = self
            .store
            .begin(vm, configured)
            .map_err(|e| format!("{e:#}"))?;
        let (tx, saved) = oneshot::channel();
        let (sealed_tx, sealed) = oneshot::channel();
        let dir = pending.dir().to_path_buf();
        let seal: Seal = Box::new(move |saved| {
            Box::pin(async move {
                let finish = move || pending.finish(&saved, then, by);
                let result = match tokio::task::spawn_blocking(finish).await {
                    Ok(r) => r.map_err(|e| format!("{e:#}")),
                    Err(e) => Err(e.to_string()),
                };
                let outcome = result.as_ref().map(drop).map_err(Clone::clone);
                let _ = sealed_tx.send(result);
                outcome
            })
        });
        let job = SaveJob {
            dir: dir.clone(),
            then,
            limit: Duration::from_secs(self.config.snapshots.timeout_s),
            seal,
            reply: tx,
        };
        // An operator's save starts at once; one the tick decided (hibernation, a
        // schedule) waits for the next sample, so that it does not overlap the passes
        // (reclaim, huge pages, placement) this tick has just started over the VM.
        let at_once = by == TakenBy::Operator;
        self.fleet.save(vm, job, at_once).map_err(|(_, why)| why)?;
        self.saving.insert(vm.to_string());
        let message = match then {
            AfterSave::Run => format!("saving its memory into {}", dir.display()),
            AfterSave::Quit => format!(
                "hibernating: saving its memory into {}, then its hypervisor process quits",
                dir.display()
            ),
        };
        self.events.log("snapshot_started", Some(vm), None, message);
        Ok((saved, sealed))
    }

    /// Hibernate the VM that is due, if one is (`memtide_core::hibernate`: idle past its
    /// `hibernate_after_s` while the host is short); not in a dry run.
    fn hibernate_idle(&mut self, snapshot: &Snapshot, decision: &Decision) {
        let cpu = snapshot.vms.iter().map(|vm| {
            let cpu_s = vm.sample.as_ref().ok().and_then(|s| s.cpu_s);
            (vm.name.as_str(), cpu_s)
        });
        self.idleness
            .observe(snapshot.at, cpu, &self.config.hibernate);
        let allowed: Vec<(String, Duration, memtide_core::Bytes)> = self
            .config
            .vms
            .iter()
            .filter(|vm| !self.saving.contains(&vm.name))
            .filter_map(|vm| {
                let after = Duration::from_secs(vm.hibernate_after_s?);
                let report = decision.vms.iter().find(|r| r.name == vm.name)?;
                let held = report.rss.or(report.actual).unwrap_or_default();
                Some((vm.name.clone(), after, held))
            })
            .collect();
        if allowed.is_empty() || self.options.dry_run {
            return;
        }
        let free = decision.host.free_ratio_avg;
        let Some(due) = hibernate::due(&self.idleness, &allowed, free, &self.config.hibernate)
        else {
            return;
        };
        self.idleness.restart(&due.vm);
        self.events
            .log("hibernate", Some(&due.vm), None, due.reason);
        // Nobody waits for the outcome: it is logged as any save's.
        let (reply, _) = oneshot::channel();
        self.save(due.vm, AfterSave::Quit, TakenBy::Hibernation, reply);
    }

    /// Start the snapshots due by their VM's `snapshot_every_s` (the first one period
    /// after the VM is first seen connected); not in a dry run.
    fn snapshot_on_schedule(&mut self) {
        if self.options.dry_run {
            return;
        }
        let now = Instant::now();
        let scheduled: Vec<(String, Duration)> = self
            .config
            .vms
            .iter()
            .filter_map(|vm| Some((vm.name.clone(), Duration::from_secs(vm.snapshot_every_s?))))
            .collect();
        for (vm, every) in scheduled {
            if self.fleet.configured(&vm).is_none() || self.saving.contains(&vm) {
                continue;
            }
            let next = *self.next_snapshot.entry(vm.clone()).or_insert(now + every);
            if now < next {
                continue;
            }
            self.next_snapshot.insert(vm.clone(), now + every);
            let (reply, _) = oneshot::channel();
            self.save(vm, AfterSave::Run, TakenBy::Schedule, reply);
        }
    }

    /// VM `vm` was lost. Off the loop, its process `pid` is given [`EXIT_GRACE`] to be
    /// gone (reaped if it is the daemon's own child: a QEMU a restore or a wake started);
    /// then, if the VM opted in to crash recovery and this is no dry run, how it went
    /// (`shut_down`: it announced it; its process still runs; a hibernation not woken from
    /// in the store) goes to [`Daemon::recover`] to decide.
    fn lost(&mut self, vm: &str, shut_down: bool, pid: Option<u32>) {
        let opted_in = self
            .config
            .vms
            .iter()
            .any(|v| v.name == vm && v.restore_on_crash);
        let judge = opted_in && !self.options.dry_run;
        if !judge && pid.is_none() {
            return;
        }
        let (vm, store, tx) = (vm.to_string(), self.store.clone(), self.restoring.clone());
        let proc = self.config.host.proc.clone();
        tokio::spawn(async move {
            let runs = |pid: u32| memtide_adapters::procfs::process_runs(&proc, pid);
            let gone_by = Instant::now() + EXIT_GRACE;
            let mut alive = pid.is_some_and(runs);
            while alive && Instant::now() < gone_by {
                tokio::time::sleep(Duration::from_millis(50)).await;
                alive = pid.is_some_and(runs);
            }
            if !judge {
                return;
            }
            // Hibernated: its newest snapshot is a hibernation not woken from.
            let name = vm.clone();
            let newest = tokio::task::spawn_blocking(move || store.list(&name))
                .await
                .ok()
                .and_then(Result::ok)
                .and_then(|mut list| list.pop());
            let asleep = newest.as_ref().is_some_and(snapshots::Snapshot::asleep);
            let size = newest.map_or(Bytes::ZERO, |s| s.configured);
            let gone = match () {
                _ if shut_down => Gone::ShutDown,
                _ if alive => Gone::ProcessAlive,
                _ if asleep => Gone::Hibernated,
                _ => Gone::Died,
            };
            let _ = tx.send(Restoring::Judged { vm, gone, size }).await;
        });
    }

    /// Wake the hibernated VMs whose `wake_at` time has come since they were hibernated
    /// (`memtide_core::wake`), each as `memtide snapshot restore` would, its outcome
    /// logged as a restore's; not in a dry run. Only VMs not connected, whose newest
    /// snapshot is a hibernation not woken from, and not being restored are looked at.
    fn wake_on_schedule(&mut self) {
        if self.options.dry_run {
            return;
        }
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let scheduled: Vec<(String, Vec<memtide_core::wake::TimeOfDay>)> = self
            .config
            .vms
            .iter()
            .filter(|vm| {
                !vm.wake_at.is_empty()
                    && self.fleet.configured(&vm.name).is_none()
                    && !self.restores.contains(&vm.name)
            })
            .map(|vm| (vm.name.clone(), vm.wake_at.clone()))
            .collect();
        for (vm, times) in scheduled {
            let Some(asleep) = self.asleep.iter().find(|s| s.vm == vm).cloned() else {
                continue;
            };
            let Some(since) = humantime::parse_rfc3339(&asleep.created)
                .ok()
                .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
            else {
                continue;
            };
            let Some(due) = memtide_core::wake::due(&times, since.as_secs(), now) else {
                continue;
            };
            if self.woken_for.get(&vm).is_some_and(|at| *at >= due) {
                continue;
            }
            self.woken_for.insert(vm.clone(), due);
            let when = humantime::format_rfc3339_seconds(
                SystemTime::UNIX_EPOCH + Duration::from_secs(due),
            );
            let message = format!(
                "woken on schedule ({when}, `wake_at`): restoring its hibernation {}",
                asleep.id
            );
            self.events.log("wake", Some(&vm), None, message);
            self.restores.insert(vm.clone());
            let (config, tx) = (self.config.clone(), self.restoring.clone());
            tokio::spawn(async move {
                let restore = crate::snapshot_cmd::restore(&config, &vm, Some(&asleep.id), false);
                let result = restore.await.map_err(|e| format!("{e:#}"));
                let _ = tx.send(Restoring::Restored { vm, result }).await;
            });
        }
    }

    /// A step of crash recovery: a lost VM judged (restored from its newest good
    /// snapshot, left, or given up on: `memtide_core::recovery`); or a restore (after a
    /// crash, or a scheduled wake) ended. Each logged and counted
    /// (`memtide_actions_total{kind="restore"}`).
    fn recover(&mut self, step: Restoring) {
        match step {
            Restoring::Judged { vm, gone, size } => self.judge(vm, gone, size),
            Restoring::Restored { vm, result } => {
                self.restores.remove(&vm);
                self.recount_hibernated = true;
                match result {
                    Ok(started) => {
                        self.counters.action("restore", "ok");
                        self.events.log("restored", Some(&vm), None, started.line);
                        if let Some(why) = started.unmarked {
                            self.events.log("snapshot_failed", Some(&vm), None, why);
                        }
                    }
                    Err(e) => {
                        self.counters.action("restore", "error");
                        let message = format!("not restored: {e}");
                        self.events.log("restore_failed", Some(&vm), None, message);
                    }
                }
            }
        }
    }

    /// Decide about VM `vm`, gone as `gone`, of `size`, with the room the host had at
    /// the last tick, and carry it out: a restore that must wait for room is tried
    /// again each tick (its event logged once).
    fn judge(&mut self, vm: String, gone: Gone, size: Bytes) {
        if self.restores.contains(&vm) {
            self.waiting.remove(&vm);
            let why = "not restored again: a restore of it is under way".to_string();
            self.events.log("restore_skipped", Some(&vm), None, why);
            return;
        }
        let (at, cfg) = (self.start.elapsed(), &self.config.recovery);
        let room = Room { size, ..self.room };
        match self.recovery.decide(&vm, gone, at, room, cfg) {
            Verdict::Leave(why) => self.events.log("restore_skipped", Some(&vm), None, why),
            Verdict::GiveUp(why) => {
                self.waiting.remove(&vm);
                self.counters.action("restore", "given_up");
                self.events.log("restore_given_up", Some(&vm), None, why);
            }
            Verdict::Wait(why) => {
                if self.waiting.insert(vm.clone(), size).is_none() {
                    self.events.log("restore_waiting", Some(&vm), None, why);
                }
            }
            Verdict::Restore => {
                self.waiting.remove(&vm);
                let message = "its QEMU died without shutting down: restoring it from its \
                               newest good snapshot";
                self.events
                    .log("restore_started", Some(&vm), None, message.into());
                self.restores.insert(vm.clone());
                let (config, tx) = (self.config.clone(), self.restoring.clone());
                tokio::spawn(async move {
                    let result = crate::snapshot_cmd::recover(&config, &vm).await;
                    let result = result.map_err(|e| format!("{e:#}"));
                    let _ = tx.send(Restoring::Restored { vm, result }).await;
                });
            }
        }
    }

    /// Try again the restores waiting for room, with the host's room at this tick;
    /// one whose VM came back meanwhile waits no more.
    fn restore_waiting(&mut self, host: &memtide_core::decision::HostReport) {
        self.room = Room {
            total: host.total,
            freeable: host.freeable,
            size: Bytes::ZERO,
        };
        let waiting: Vec<(String, Bytes)> = self.waiting.drain().collect();
        for (vm, size) in waiting {
            if self.fleet.configured(&vm).is_none() {
                // Still waiting: kept so that its event is not logged again.
                self.waiting.insert(vm.clone(), size);
                self.judge(vm, Gone::Died, size);
            }
        }
    }

    /// Delete VM `vm`'s scheduled snapshots beyond its `snapshot_keep`, each logged.
    fn prune(&mut self, vm: &str) {
        let Some(keep) = self.config.vms.iter().find(|v| v.name == vm) else {
            return;
        };
        match self.store.prune(vm, keep.snapshot_keep) {
            Ok(deleted) => {
                for s in deleted {
                    let message = format!(
                        "scheduled snapshot {} deleted: {} newer kept",
                        s.id, keep.snapshot_keep
                    );
                    self.events.log("snapshot_deleted", Some(vm), None, message);
                }
            }
            Err(e) => {
                let message = format!("old scheduled snapshots not deleted: {e:#}");
                self.events.log("snapshot_failed", Some(vm), None, message);
            }
        }
    }

    /// Log and count a save that ended, and answer whoever asked for it.
    fn saved(&mut self, done: SaveDone) {
        let SaveDone {
            vm,
            by,
            result,
            reply,
        } = done;
        self.saving.remove(&vm);
        self.recount_hibernated |= result.as_ref().is_ok_and(snapshots::Snapshot::asleep);
        if result.is_ok() && by == TakenBy::Schedule {
            self.prune(&vm);
        }
        match &result {
            Ok(s) => {
                let message = s.summary();
                self.events.log("snapshot_saved", Some(&vm), None, message);
                self.counters.action("snapshot", "ok");
            }
            Err(e) => {
                let message = format!("not saved: {e}");
                self.events.log("snapshot_failed", Some(&vm), None, message);
                self.counters.action("snapshot", "error");
            }
        }
        let reply_value = result.map(|s| serde_json::to_value(s).expect("a snapshot serializes"));
        let _ = reply.send(reply_value);
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
        let decision = self.engine.tick(&snapshot);
        self.record(&snapshot, &decision);
        self.actuate(&decision, t0 + self.interval.mul_f64(ACTUATION_SHARE))
            .await;
        self.reclaim(&snapshot, &decision).await;
        self.restore_huge_pages(&snapshot).await;
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

    /// Read the hibernated VMs from the store again where they may have changed, and
    /// every [`TIERS_EVERY`] ticks (an unreadable store shows none, with a warning).
    fn reread_asleep(&mut self) {
        let due = std::mem::take(&mut self.recount_hibernated)
            | self.counters.ticks.is_multiple_of(TIERS_EVERY);
        if due {
            self.asleep = self.store.asleep().unwrap_or_else(|e| {
                tracing::warn!("snapshot store: {e:#}");
                Vec::new()
            });
        }
    }

    /// The VMs hibernated and not woken yet, as last read from the store.
    fn hibernated(&self) -> Vec<Hibernated> {
        self.asleep
            .iter()
            .map(|s| Hibernated {
                vm: s.vm.clone(),
                id: s.id.clone(),
                since: s.created.clone(),
                configured: s.configured,
            })
            .collect()
    }

    fn log_fleet(&mut self, events: &[FleetEvent]) {
        // A VM (re)connected may have been woken from its hibernation.
        let connected = |e: &FleetEvent| matches!(e, FleetEvent::Connected { .. });
        self.recount_hibernated |= events.iter().any(connected);
        for e in events {
            match e {
                FleetEvent::Connected { vm, endpoint } => {
                    self.events.log(
                        "vm_connected",
                        Some(vm),
                        None,
                        format!("connected through {endpoint}"),
                    );
                    if !self.restores.contains(vm) {
                        self.running_on(vm);
                    }
                }
                FleetEvent::Lost {
                    vm,
                    why,
                    shut_down,
                    pid,
                } => {
                    self.events
                        .log("vm_lost", Some(vm), None, format!("connection lost: {why}"));
                    self.lost(vm, *shut_down, *pid);
                }
            }
        }
    }

    /// VMs whose hypervisor reports them reset while their connection lasted run, as a
    /// (re)connected VM does: their hibernations are marked woken and the hibernated VMs
    /// read again, rather than listed asleep until the next periodic read. libvirt
    /// reports a domain started as a reset: one restored from its hibernation (by hand,
    /// or by `memtide snapshot restore`) before its connection noticed it stop.
    fn started_again(&mut self, snapshot: &Snapshot) {
        for (vm, marked) in woken_by_reset(&self.store, snapshot, &self.restores) {
            // Read again if one was asleep: marked now, or by the restore that started it.
            let listed = self.asleep.iter().any(|s| s.vm == vm);
            self.recount_hibernated |= listed || marked.as_ref().is_ok_and(|m| !m.is_empty());
            self.log_woken(&vm, marked);
        }
    }

    /// VM `vm` runs, and memtide is not restoring it: a hibernation of it not woken
    /// from is not its memory any more (it was started afresh, or restored by hand), so
    /// it is marked woken, each logged, and neither a wake nor a restore without
    /// `--force` brings it back over the guest's disk.
    fn running_on(&mut self, vm: &str) {
        let marked = self.store.mark_all_woken(vm);
        self.log_woken(vm, marked);
    }

    /// Log what marking VM `vm`'s hibernations woken did: `snapshot_woken` for each one
    /// marked, or `snapshot_failed`.
    fn log_woken(&mut self, vm: &str, marked: anyhow::Result<Vec<snapshots::Snapshot>>) {
        match marked {
            Ok(marked) => {
                for s in marked {
                    let message = format!(
                        "it runs: its hibernation {} is marked woken (no longer woken from)",
                        s.id
                    );
                    self.events.log("snapshot_woken", Some(vm), None, message);
                }
            }
            Err(e) => {
                let message = format!(
                    "it runs, but its hibernations could not be marked woken ({e:#}): do not \
                     restore them while the guest runs"
                );
                self.events.log("snapshot_failed", Some(vm), None, message);
            }
        }
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
        for action in &decision.actions {
            let result = match action {
                _ if self.options.dry_run => None,
                Action::SetBalloon { .. } => balloon_results.next(),
                Action::SetKsm { settings, .. } => {
                    let result = self.host.apply_ksm(settings);
                    if result.is_ok() {
                        self.engine.ksm_applied(settings);
                    }
                    Some(Sent::Answered(result))
                }
            };
            match (result, action) {
                (Some(Sent::InFlight), Action::SetBalloon { vm, .. }) => {
                    self.pending.insert(vm.clone(), action.clone());
                }
                (Some(Sent::Answered(result)), _) => self.log_action(action, Some(&result), ""),
                _ => self.log_action(action, None, ""),
            }
        }
    }

    /// Proactive reclaim for the VMs it serves: one pass over their cgroups, run off the
    /// runtime and not waited for (a `memory.reclaim` write returns once the kernel has
    /// reclaimed, seconds for a large step): a pass still running from an earlier tick
    /// is let be, and none starts beside it; each reclaim and each failure is logged and
    /// counted when its pass has ended.
    async fn reclaim(&mut self, snapshot: &Snapshot, decision: &Decision) {
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
            .filter_map(|(vm, report)| {
                let (pid, vm_config) = self.fleet.process(&vm.name)?;
                reclaim::serves(config, vm_config, vm).then(|| reclaim::Target {
                    vm: vm.name.clone(),
                    place: match (vm_config.and_then(|c| c.reclaim_cgroup.clone()), pid) {
                        (Some(dir), _) => reclaim::Place::Cgroup(dir),
                        (None, Some(pid)) => reclaim::Place::Process(pid),
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
        let (at, dry_run) = (snapshot.at, self.options.dry_run);
        self.reclaiming = Some(tokio::task::spawn_blocking(move || {
            let outcomes = reclaimer.pass(&targets, at, dry_run);
            (reclaimer, outcomes)
        }));
    }

    /// A reclaim pass's outcomes logged and counted once it has ended, its pacers kept.
    async fn reclaimed(&mut self, pass: ReclaimPass) {
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
    /// for); each is logged and counted when it has ended. A kernel that refuses the
    /// advice (before 6.1, no CAP_SYS_NICE) turns it off.
    async fn restore_huge_pages(&mut self, snapshot: &Snapshot) {
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
        if self.collapsing.is_some() {
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
                    configured: vm.sample.as_ref().ok()?.configured,
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
    async fn collapsed(&mut self, pass: CollapsePass) {
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
    async fn place(&mut self, snapshot: &Snapshot) {
        let Some(nodes) = self.tier_nodes else {
            return;
        };
        let targets = self.place_targets(snapshot);
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
        if targets.is_empty() {
            // Nothing to place: no tracker kept, nor the cold age of a VM away for longer
            // than the longest age.
            if let Some(placer) = &mut self.tier_placer {
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
        let placer = self.tier_placer.take().unwrap_or_else(|| {
            let host = &self.config.host;
            place::TierPlacer::new(nodes, config, host.proc.clone(), host.sys.clone())
        });
        self.cold_ages = placer.ages();
        let (at, dry_run) = (snapshot.at, self.options.dry_run);
        self.placing = Some(tokio::task::spawn_blocking(move || {
            place::run_pass(placer, &targets, at, dry_run)
        }));
    }

    /// The VMs to place ([`place::targets`]).
    fn place_targets(&self, snapshot: &Snapshot) -> Vec<place::Target> {
        let known = |vm: &str| {
            let (pid, config) = self.fleet.process(vm)?;
            Some(place::Known {
                pid,
                config,
                configured: self.fleet.configured(vm),
            })
        };
        place::targets(&snapshot.vms, known, &self.config)
    }

    /// A placement pass's outcomes logged and counted once it has ended, its trackers
    /// kept. A pass that panicked places nothing: no VM is shown placed.
    async fn placed(&mut self, pass: PlacePass) {
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

    /// Count and log a balloon command answered after the tick that sent it.
    fn answered_late(&mut self, a: &Answered) {
        if let Some(action) = self.pending.remove(&a.vm) {
            self.log_action(&action, Some(&a.result), " (answered after its tick)");
        }
    }

    /// Count and log an action with its result (`None`: a dry run), `note` added to it.
    fn log_action(
        &mut self,
        action: &Action,
        result: Option<&Result<(), BackendError>>,
        note: &str,
    ) {
        let (kind, vm) = match action {
            Action::SetBalloon { vm, .. } => ("balloon", Some(vm.as_str())),
            Action::SetKsm { .. } => ("ksm", None),
        };
        let rule = Some(action.reason().rule.as_ref());
        self.counters.rule(&action.reason().rule);
        match result {
            None => {
                self.counters.action(kind, "dry_run");
                self.events
                    .log("action", vm, rule, format!("would set {action} (dry run)"));
            }
            Some(Ok(())) => {
                self.counters.action(kind, "ok");
                self.events
                    .log("action", vm, rule, format!("{action}{note}"));
            }
            Some(Err(e)) => {
                self.counters.action(kind, "error");
                self.events.log(
                    "action_failed",
                    vm,
                    rule,
                    format!("{action} failed{note}: {e}"),
                );
            }
        }
    }

    fn publish(&mut self, decision: Option<Decision>, host_error: Option<String>, t0: Instant) {
        // The host's tiers change only with hotplug: read at the first tick (`ticks` is 1
        // when it is published) and now and then after.
        let tiers = (self.counters.ticks % TIERS_EVERY == 1)
            .then(|| memtide_adapters::tiers::read(&self.config.host.sys, &self.config.host.proc));
        let hibernated = self.hibernated();
        let mut s = self.status.write().expect("status lock");
        if let Some(tiers) = tiers {
            s.tiers = tiers;
        }
        s.hibernated = hibernated;
        s.placed = self.placed.values().cloned().collect();
        if decision.is_some() {
            s.decision = decision;
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

/// Why a save failed, for a save whose backend failed with `e` after `sealed` (if its
/// snapshot was sealed): a hibernation sealed whose VMM did not quit and still runs (one
/// that ended all the same is a hibernation that succeeded) has its snapshot marked
/// woken, and no restore without --force brings back memory the guest may have moved on
/// from.
fn failed_after_seal(store: &Store, sealed: Option<snapshots::Snapshot>, e: String) -> String {
    match sealed {
        Some(s) if s.asleep() => match store.mark_woken(&s) {
            Ok(()) => format!(
                "{e}; its snapshot is marked woken (to go back to it, stop the VM and restore \
                 it with --force, only if the guest has not run since)"
            ),
            Err(w) => format!(
                "{e}; and its snapshot could not be marked woken ({w:#}): do not restore it \
                 while the guest runs"
            ),
        },
        _ => e,
    }
}

/// The VMs of `snapshot` whose hypervisor reported them reset since their previous
/// sample, but for those memtide is restoring (`restoring`), each with its hibernations
/// not woken from marked woken in `store` (those marked, or why they could not be).
fn woken_by_reset(
    store: &Store,
    snapshot: &Snapshot,
    restoring: &HashSet<String>,
) -> Vec<(String, anyhow::Result<Vec<snapshots::Snapshot>>)> {
    snapshot
        .vms
        .iter()
        .filter(|vm| {
            let events = vm.sample.as_ref().map(|s| s.events.as_slice());
            events.is_ok_and(|e| e.contains(&VmEvent::Reset))
        })
        .filter(|vm| !restoring.contains(&vm.name))
        .map(|vm| (vm.name.clone(), store.mark_all_woken(&vm.name)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use memtide_core::policy::mom::Mom;
    use memtide_core::testkit::{host, snapshot, vm};
    use memtide_core::{BackendError, EngineConfig};

    /// A snapshot of VM `vm` sealed in `store`, its guest then left as `then`.
    fn stored(store: &Store, vm: &str, then: AfterSave, by: TakenBy) -> snapshots::Snapshot {
        let saved = memtide_core::backend::Saved {
            mechanism: "test".into(),
            was_running: true,
            downtime: Duration::from_secs(1),
            written: Duration::from_secs(1),
            ..memtide_core::backend::Saved::default()
        };
        let pending = store.begin(vm, memtide_core::Bytes::from_mib(1)).unwrap();
        std::fs::write(pending.dir().join("memory"), b"guest").unwrap();
        pending.finish(&saved, then, by).unwrap()
    }

    #[test]
    fn a_hibernation_whose_vm_did_not_stop_is_marked_woken() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let take = |then, by| stored(&store, "web", then, by);
        let asleep = take(AfterSave::Quit, TakenBy::Hibernation);
        assert!(asleep.asleep());
        let why = failed_after_seal(&store, Some(asleep), "the VMM did not quit".into());
        assert!(
            why.starts_with("the VMM did not quit; its snapshot is marked woken"),
            "{why}"
        );
        let listed = store.list("web").unwrap();
        assert!(
            !listed[0].asleep() && listed[0].woken.is_some(),
            "{listed:?}"
        );
        // A save that failed before its seal, or a snapshot whose guest ran on anyway,
        // is told as it failed.
        assert_eq!(failed_after_seal(&store, None, "refused".into()), "refused");
        let ran = take(AfterSave::Run, TakenBy::Operator);
        assert_eq!(failed_after_seal(&store, Some(ran), "x".into()), "x");
    }

    #[test]
    fn a_vm_reset_under_its_connection_wakes_its_hibernations_unless_memtide_restores_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let hibernate = |vm: &str| stored(&store, vm, AfterSave::Quit, TakenBy::Hibernation).id;
        let (woken, waking, shut) = (hibernate("woken"), hibernate("waking"), hibernate("shut"));
        let with_events = |name: &str, events: Vec<VmEvent>| {
            let mut v = vm(name, 1000, 800, 600);
            if let Ok(sample) = &mut v.sample {
                sample.events = events;
            }
            v
        };
        let mut lost = vm("lost", 1000, 800, 600);
        lost.sample = Err(BackendError::Disconnected("gone".into()));
        let vms = vec![
            with_events("woken", vec![VmEvent::Shutdown, VmEvent::Reset]),
            with_events("waking", vec![VmEvent::Reset]),
            with_events("shut", vec![VmEvent::Shutdown]),
            lost,
            vm("calm", 1000, 800, 600),
        ];
        let snap = snapshot(0, host(4000, 400), vms);
        let restoring = HashSet::from(["waking".to_string()]);

        let marked = woken_by_reset(&store, &snap, &restoring);
        assert_eq!(
            marked.len(),
            1,
            "only the reset VM memtide is not restoring"
        );
        assert_eq!(marked[0].0, "woken");
        let ids: Vec<&str> = marked[0]
            .1
            .as_ref()
            .unwrap()
            .iter()
            .map(|s| s.id.as_str())
            .collect();
        assert_eq!(ids, [woken.as_str()]);
        let asleep = || -> Vec<String> {
            let mut ids: Vec<String> = store.asleep().unwrap().into_iter().map(|s| s.id).collect();
            ids.sort();
            ids
        };
        let mut left = vec![waking, shut.clone()];
        left.sort();
        assert_eq!(asleep(), left);
        // Reported reset again: nothing left to mark.
        let again = woken_by_reset(&store, &snap, &restoring);
        assert!(again[0].1.as_ref().unwrap().is_empty());
        // Once memtide's own restore has ended, a reset of that VM marks it too.
        let marked = woken_by_reset(&store, &snap, &HashSet::new());
        assert_eq!(marked.len(), 2);
        assert_eq!(asleep(), [shut]);
    }

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
