//! A QEMU VM managed through its QMP socket.

use super::client::{QmpClient, QmpError, QmpEvent};
use super::virtio_mem;
use crate::access::{Mappings, Method, TrackError, Tracker};
use crate::damon::DamonError;
use crate::procfs;
use crate::qga::{self, AgentRetry, GuestAgent};
use crate::vmm_snapshot::CutShort;
use crate::Relearn;
use async_trait::async_trait;
use memtide_core::backend::{AfterSave, Saved, Seal, VmBackend};
use memtide_core::stats::{AgentStats, GuestStats};
use memtide_core::{BackendError, Bytes, FixedMemory, VmEvent, VmSample};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::{Duration, Instant};

/// QOM containers where user-created devices live (with and without an `id`).
const DEVICE_CONTAINERS: [&str; 2] = ["/machine/peripheral", "/machine/peripheral-anon"];

/// How to talk to a VM.
#[derive(Debug, Clone)]
pub struct QmpVmOptions {
    /// Limit for every QMP call (and for connecting).
    pub call_timeout: Duration,
    /// How often the guest should refresh its balloon statistics, in seconds.
    pub stats_interval_s: u64,
    /// The procfs mount, to read the QEMU process's RSS.
    pub proc: PathBuf,
    /// The sysfs mount, for idle page tracking.
    pub sys: PathBuf,
    /// How to measure the guest memory touched between samples (host-side access
    /// sampling).
    pub sample_access: AccessSampling,
    /// The shortest window an access sample may cover (half the daemon's tick).
    pub least_sample_window: Duration,
}

/// Host-side access sampling of a QEMU VM's guest RAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessSampling {
    /// None.
    Off,
    /// The pages QEMU's own page tables saw referenced (smaps and clear_refs): TCG only.
    ClearRefs,
    /// Page tracking (`crate::access`: idle page tracking or DAMON, as `method` says),
    /// which sees KVM's accesses too, and cold memory: pages untouched for `cold_age`.
    /// With `fallback`, clear_refs where the kernel or memtide's privileges do not allow
    /// it.
    Tracked {
        /// How long a page goes untouched to be cold.
        cold_age: Duration,
        /// clear_refs where page tracking cannot be had.
        fallback: bool,
        /// How pages are tracked.
        method: Method,
    },
}

/// A QEMU VM.
pub struct QmpVm {
    client: QmpClient,
    /// How often the guest refreshes its balloon statistics, in seconds.
    stats_interval_s: u64,
    /// Its memory devices and balloon, as last learnt.
    devices: Devices,
    /// A device was removed (`DEVICE_DELETED`) since the devices were last learnt.
    removed: bool,
    /// When the devices are learnt again with nothing said of a change.
    relearn: Relearn,
    /// What is learnt about the virtio-mem device from sample to sample.
    vmem_follower: crate::virtio_mem::Follower,
    target: Option<Bytes>,
    /// The QEMU process, for its resident memory.
    process: Option<procfs::ProcessRss>,
    /// QEMU's own memory beside guest RAM, where they can be told apart.
    own: Option<procfs::OwnMemory>,
    agent: Option<AgentLink>,
    access: Option<Access>,
    /// QEMU announced a shutdown (`SHUTDOWN`) and no reset followed.
    shut_down: bool,
    /// What its connection knows of saves and restores cut short.
    cut_short: CutShort,
}

/// How a VM's accesses are sampled.
enum Access {
    /// Sampled on the blocking pool (smaps is a walk of QEMU's page tables).
    ClearRefs(Scans<AccessSampler>),
    /// Page tracking, scanned on the blocking pool.
    Tracked(Scans<PageTracking>),
}

/// What a scan found: guest RAM accessed since the one before, and cold.
type Scanned = (Option<Bytes>, Option<Bytes>);

/// A scan of a VM's memory, made on the blocking pool by [`Scans`].
trait Scan: Send + 'static {
    fn scan(&mut self) -> Scanned;
    /// Scan guest RAM in mappings of these sizes from the next scan on.
    fn set_ram(&mut self, ram: Vec<Bytes>);
}

impl Access {
    /// Sample guest RAM in mappings of these sizes from the next scan on (a memory
    /// device plugged or removed).
    fn set_ram(&mut self, ram: Vec<Bytes>) {
        match self {
            Access::ClearRefs(scans) => scans.set_ram(ram),
            Access::Tracked(scans) => scans.set_ram(ram),
        }
    }
}

/// Scans, one at a time, on the blocking pool: an idle page tracking scan reads and
/// writes some bytes per guest page (seconds for a guest of tens of GiB), a clear_refs
/// sample walks QEMU's page tables twice, and the daemon's runtime has one worker. A
/// sample waits for its scan up to `wait`; a scan that outlasts it runs on, its result
/// taken by a later sample, and no other starts meanwhile (waiting in line, scans of a VM
/// larger than a tick can scan would pile up on the pool).
struct Scans<T> {
    wait: Duration,
    state: ScanState<T>,
    /// Guest RAM's mappings, changed since the last scan started: the next one's.
    ram: Option<Vec<Bytes>>,
}

enum ScanState<T> {
    Ready(Box<T>),
    Running(tokio::task::JoinHandle<(Box<T>, Scanned)>),
    /// A scan panicked, and what it scanned with went with it.
    Lost,
}

impl<T: Scan> Scans<T> {
    fn new(scanner: T, wait: Duration) -> Scans<T> {
        Scans {
            wait,
            state: ScanState::Ready(Box::new(scanner)),
            ram: None,
        }
    }

    /// Scan guest RAM in mappings of these sizes from the next scan started on (one
    /// running goes on with those it had).
    fn set_ram(&mut self, ram: Vec<Bytes>) {
        self.ram = Some(ram);
    }

    /// The latest scan's result: a scan started now, or one started by an earlier sample
    /// that has ended; nothing while one runs on. A scan that outlasted its own sample is
    /// followed at once by the next, which the next sample takes: a VM whose scans take
    /// longer than the wait but less than a tick has a result every tick (one tick old),
    /// not every other.
    async fn sample(&mut self) -> Scanned {
        let started_now = matches!(self.state, ScanState::Ready(_));
        self.start();
        let ScanState::Running(scan) = &mut self.state else {
            return (None, None);
        };
        match tokio::time::timeout(self.wait, scan).await {
            Err(_) => (None, None),
            Ok(Ok((tracking, scanned))) => {
                self.state = ScanState::Ready(tracking);
                if !started_now {
                    self.start();
                }
                scanned
            }
            Ok(Err(e)) => {
                tracing::warn!("host-side access sampling stopped: its scan failed ({e})");
                self.state = ScanState::Lost;
                (None, None)
            }
        }
    }

    /// Start a scan on the blocking pool, unless one runs (or the scanner was lost).
    fn start(&mut self) {
        self.state = match std::mem::replace(&mut self.state, ScanState::Lost) {
            ScanState::Ready(mut scanner) => {
                if let Some(ram) = self.ram.take() {
                    scanner.set_ram(ram);
                }
                ScanState::Running(tokio::task::spawn_blocking(move || {
                    let scanned = scanner.scan();
                    (scanner, scanned)
                }))
            }
            state => state,
        };
    }
}

/// When a host-side access sample's window began, and the shortest it may be. A sample
/// asked for sooner is not taken and its window stays open: the daemon asks again at once
/// after a sample late for its tick, and what the host saw touched in a fraction of a
/// tick would bound the guest's probing below what it touches in one.
#[derive(Debug, Clone, Copy)]
struct SampleWindow {
    least: Duration,
    began: Option<Instant>,
}

impl SampleWindow {
    /// Whether a sample taken at `now` would cover less than the least window.
    fn too_short(&self, now: Instant) -> bool {
        self.began
            .is_some_and(|began| now.saturating_duration_since(began) < self.least)
    }
}

/// Idle page tracking of a VM's guest RAM.
struct PageTracking {
    /// The QMP socket, naming the VM in logs.
    socket: String,
    tracker: Tracker,
    since: Instant,
    window: SampleWindow,
    /// The latest scan's error, logged once until a scan succeeds.
    failed: Option<String>,
}

impl Scan for PageTracking {
    /// Guest RAM accessed since the previous scan, and cold; neither after a failed scan,
    /// nor without a scan where the last was too recent.
    fn scan(&mut self) -> Scanned {
        let now = Instant::now();
        if self.window.too_short(now) {
            return (None, None);
        }
        self.window.began = Some(now);
        match self.tracker.scan(now.saturating_duration_since(self.since)) {
            Ok(scan) => {
                self.failed = None;
                (scan.accessed, scan.cold)
            }
            Err(e) => {
                let e = e.to_string();
                if self.failed.as_ref() != Some(&e) {
                    tracing::warn!("{}: page tracking: {e}", self.socket);
                }
                self.failed = Some(e);
                (None, None)
            }
        }
    }

    fn set_ram(&mut self, ram: Vec<Bytes>) {
        self.tracker.set_mappings(Mappings::GuestRam(ram));
    }
}

/// Said once per process: the reason holds for every VM on the host.
static NO_PAGE_TRACKING: Once = Once::new();

/// Said once per process: a kernel that refuses one QEMU's soft-dirty clear refuses all.
static NO_TLB_FLUSH: Once = Once::new();

/// Host-side access sampling: the guest RAM pages QEMU's page tables saw referenced since
/// the last sample (/proc/PID/smaps), then cleared (/proc/PID/clear_refs). This sees the
/// guest's accesses only when QEMU makes them (TCG); under KVM they go through the
/// second-level page tables, which only page tracking ([`Access::Tracked`]: idle page tracking or DAMON)
/// see. Clearing the accessed bits flushes no TLB, and a CPU sets a page's accessed bit
/// only when it walks the page tables, so a thread that keeps its core touches huge pages
/// its TLB holds unseen (measured on a 16-core host, of 192 MiB read in a loop: 102-192
/// MiB seen referenced in huge pages, all of it in 4 KiB pages). Where guest RAM holds
/// huge pages, the sampler also clears the soft-dirty bits, the one clear_refs that
/// flushes the process's TLB on current kernels (on 6.18: 192 MiB seen each time, where
/// 128 were without; docs/benchmarks.md#density-on-16-cores; kernels before about 5.11
/// flushed on 1 too, and pay only the cost). It write-protects every page QEMU maps, not
/// only guest RAM, in a second walk of its address space, so each page written in the
/// next window faults once (a huge page once for its 2 MiB), a 2 MiB range none of whose
/// pages was written since is not collapsed into a huge page (khugepaged and
/// MADV_COLLAPSE want a writable page in it) until one is, and another user of QEMU's
/// soft-dirty bits (a CRIU pre-dump) would see them cleared.
struct AccessSampler {
    smaps: PathBuf,
    clear_refs: PathBuf,
    /// The sizes of the guest RAM's mappings (base memory, memory devices' backends).
    ram: Vec<Bytes>,
    /// Begun when the accessed bits were last cleared.
    window: SampleWindow,
    /// Guest RAM held huge pages at the last read of smaps (assumed before the first).
    huge: bool,
}

impl AccessSampler {
    fn new(dir: &Path, ram: Vec<Bytes>, least: Duration) -> AccessSampler {
        AccessSampler {
            smaps: dir.join("smaps"),
            clear_refs: dir.join("clear_refs"),
            ram,
            window: SampleWindow { least, began: None },
            huge: true,
        }
    }

    /// Referenced guest RAM since the accessed bits were last cleared, at `now` (`None`
    /// on the first call, which only starts the window, on any read or write failure, and
    /// where the window is too short: it then stays open).
    fn sample(&mut self, now: Instant) -> Option<Bytes> {
        if self.window.too_short(now) {
            return None;
        }
        let smaps = self
            .window
            .began
            .and_then(|_| std::fs::read_to_string(&self.smaps).ok());
        let referenced = smaps.as_ref().and_then(|t| {
            self.huge = procfs::smaps_ram_huge(t, &self.ram).is_some_and(|h| h > Bytes::ZERO);
            procfs::smaps_referenced(t, &self.ram)
        });
        let cleared = std::fs::write(&self.clear_refs, "1").is_ok();
        if cleared && self.huge {
            // Best effort: without the flush the next sample may undercount, no more.
            if let Err(e) = std::fs::write(&self.clear_refs, "4") {
                NO_TLB_FLUSH.call_once(|| {
                    tracing::warn!(
                        "{}: clearing soft-dirty bits failed ({e}): host-side access \
                         sampling may undercount guest memory in huge pages",
                        self.clear_refs.display()
                    )
                });
            }
        }
        self.window.began = cleared.then_some(now);
        referenced
    }
}

impl Scan for AccessSampler {
    fn scan(&mut self) -> Scanned {
        (self.sample(Instant::now()), None)
    }

    fn set_ram(&mut self, ram: Vec<Bytes>) {
        self.ram = ram;
    }
}

/// The VM's guest agent: a session when one is open, and backoff after failures.
struct AgentLink {
    socket: PathBuf,
    call_timeout: Duration,
    /// The most one sample's read may take, all calls together.
    budget: Duration,
    session: Option<GuestAgent>,
    retry: AgentRetry,
    /// Guest files left open by reads cut short, closed at the next.
    open: qga::OpenHandles,
}

impl AgentLink {
    fn new(socket: PathBuf, call_timeout: Duration, budget: Duration) -> AgentLink {
        AgentLink {
            retry: AgentRetry::new(socket.display().to_string()),
            socket,
            call_timeout,
            budget,
            session: None,
            open: qga::OpenHandles::default(),
        }
    }

    /// Read the guest's /proc figures within the budget, or say why not. After any
    /// failure, its timeout included, the session is dropped and reopened next time.
    async fn read(&mut self) -> Result<AgentStats, String> {
        let (socket, call_timeout, session) = (&self.socket, self.call_timeout, &mut self.session);
        let open = &mut self.open;
        let budget = self.budget;
        let read = self
            .retry
            .read(budget, async {
                let agent = match session {
                    Some(s) => s,
                    None => session.insert(
                        GuestAgent::connect(socket, call_timeout)
                            .await
                            .map_err(|e| e.to_string())?,
                    ),
                };
                qga::read_proc(agent, open).await
            })
            .await;
        if read.is_err() {
            self.session = None;
        }
        read
    }
}

impl From<QmpError> for BackendError {
    fn from(e: QmpError) -> Self {
        match e {
            QmpError::Timeout(d) => BackendError::timeout(d),
            QmpError::Closed(why) => BackendError::Disconnected(why),
            QmpError::Io(e) => BackendError::Disconnected(e.to_string()),
            e @ (QmpError::Command { .. } | QmpError::Protocol(_)) => {
                BackendError::Protocol(e.to_string())
            }
        }
    }
}

impl QmpVm {
    /// Connect, learn the VM's size and balloon device, and turn on guest statistics,
    /// once what a save or restore of memtide's cut short left in QEMU is cleaned up (a
    /// guest it left stopped resumed: [`super::snapshot::clean_up`], which refuses the
    /// connection as busy while a restore's state comes in). With `agent`, the guest agent's socket, each sample also reads the guest's own
    /// /proc figures (within a quarter of the call timeout per agent call, half of it
    /// for the whole read, so that the balloon is still sampled when the agent is slow).
    pub async fn connect(
        socket: &Path,
        agent: Option<&Path>,
        opts: &QmpVmOptions,
    ) -> Result<QmpVm, BackendError> {
        let mut client = QmpClient::connect(socket, opts.call_timeout).await?;
        let resumed = super::snapshot::clean_up(&mut client).await?;
        let summary = client.execute("query-memory-size-summary", None).await?;
        let memory = summary
            .get("base-memory")
            .and_then(Value::as_u64)
            .map(Bytes)
            .ok_or_else(|| BackendError::Protocol(format!("no base-memory in {summary}")))?;
        let devices = Devices::learn(&mut client, memory, opts.stats_interval_s).await?;
        let process = client
            .peer_pid()
            .map(|pid| procfs::ProcessRss::new(&opts.proc, pid));
        let own = client
            .peer_pid()
            .zip(devices.guest_ram.clone())
            .map(|(pid, ram)| procfs::OwnMemory::new(&opts.proc, pid, ram));
        let agent = agent.map(|a| {
            AgentLink::new(
                a.to_path_buf(),
                opts.call_timeout / 4,
                opts.call_timeout / 2,
            )
        });
        let access = match client.peer_pid() {
            Some(pid) => access(&mut client, socket, opts, pid, devices.ram_mappings()).await?,
            None => None,
        };
        Ok(QmpVm {
            client,
            stats_interval_s: opts.stats_interval_s,
            devices,
            removed: false,
            relearn: Relearn::default(),
            vmem_follower: Default::default(),
            target: None,
            process,
            own,
            agent,
            access,
            shut_down: false,
            cut_short: CutShort::resumed(resumed),
        })
    }

    /// The QEMU process id.
    pub fn pid(&self) -> Option<i32> {
        self.client.peer_pid()
    }

    /// The QOM path of the balloon device, when the VM has one QEMU lets us query.
    pub fn balloon_path(&self) -> Option<&str> {
        self.devices.balloon.as_ref()?.path.as_deref()
    }

    async fn send_balloon(&mut self, target: Bytes) -> Result<(), BackendError> {
        self.client
            .execute("balloon", Some(json!({"value": target.0})))
            .await?;
        Ok(())
    }

    /// The events since the last call; a device removed among them (`DEVICE_DELETED`,
    /// come while the sample was read) has the devices learnt at the next sample.
    fn events(&mut self) -> Vec<VmEvent> {
        let raw = self.client.drain_events();
        self.removed |= raw.iter().any(|e| e.name == DEVICE_DELETED);
        let events: Vec<VmEvent> = raw.iter().filter_map(vm_event).collect();
        for e in &events {
            match e {
                VmEvent::Shutdown => self.shut_down = true,
                VmEvent::Reset => self.shut_down = false,
                VmEvent::Restored | VmEvent::Saved | VmEvent::BalloonChange { .. } => {}
            }
        }
        if events.contains(&VmEvent::Reset) {
            // The guest's driver starts over; what it was last told is no longer known.
            self.target = None;
        }
        events
    }
}

/// The events memtide follows.
pub fn vm_event(e: &QmpEvent) -> Option<VmEvent> {
    match e.name.as_str() {
        "RESET" => Some(VmEvent::Reset),
        "SHUTDOWN" => Some(VmEvent::Shutdown),
        "BALLOON_CHANGE" => Some(VmEvent::BalloonChange {
            actual: Bytes(e.data.get("actual")?.as_u64()?),
        }),
        _ => None,
    }
}

/// A boolean property of the balloon device; false where it has none (older QEMU).
async fn balloon_flag(client: &mut QmpClient, balloon: &Option<String>, name: &str) -> bool {
    let Some(path) = balloon else { return false };
    let args = json!({"path": path, "property": name});
    client
        .execute("qom-get", Some(args))
        .await
        .ok()
        .and_then(|v| v.as_bool())
        .unwrap_or(false)
}

/// The VM's access sampling as `opts` asks for it and the host allows, its first scan
/// made (which starts the first window).
async fn access(
    client: &mut QmpClient,
    socket: &Path,
    opts: &QmpVmOptions,
    pid: i32,
    ram: Vec<Bytes>,
) -> Result<Option<Access>, BackendError> {
    // How long a sample waits for its scan: a quarter of its call.
    let wait = opts.call_timeout / 4;
    let fallback = match opts.sample_access {
        AccessSampling::Off => return Ok(None),
        AccessSampling::ClearRefs => true,
        AccessSampling::Tracked {
            cold_age,
            fallback,
            method,
        } => {
            let (proc, sys) = (opts.proc.clone(), opts.sys.clone());
            let mappings = Mappings::GuestRam(ram.clone());
            let since = Instant::now();
            let tracked = tokio::task::spawn_blocking(move || {
                let mut tracker = Tracker::open(&proc, &sys, pid, mappings, cold_age, method)?;
                tracker.scan(since.elapsed())?;
                Ok::<_, TrackError>(tracker)
            })
            .await
            .map_err(|e| BackendError::Io(format!("page tracking: {e}")))?;
            match tracked {
                Ok(tracker) => {
                    tracing::info!(
                        "{}: guest RAM accesses tracked by {}",
                        socket.display(),
                        tracker.method()
                    );
                    let tracking = PageTracking {
                        socket: socket.display().to_string(),
                        tracker,
                        since,
                        window: SampleWindow {
                            least: opts.least_sample_window,
                            began: Some(since),
                        },
                        failed: None,
                    };
                    return Ok(Some(Access::Tracked(Scans::new(tracking, wait))));
                }
                // The host's reasons, the same for every VM: said once.
                Err(
                    e @ (TrackError::Unsupported(_)
                    | TrackError::NoFrames(_)
                    | TrackError::Neither { .. }
                    | TrackError::Damon(DamonError::Unsupported(_) | DamonError::InUse { .. })),
                ) => {
                    NO_PAGE_TRACKING.call_once(|| {
                        if fallback {
                            tracing::info!("no page tracking: {e}; host-side access sampling falls back to clear_refs, which sees guest accesses under TCG only");
                        } else {
                            tracing::warn!("no host-side access sampling: {e}");
                        }
                    });
                }
                Err(e) => tracing::warn!(
                    "{}: no page tracking: {e}{}",
                    socket.display(),
                    if fallback {
                        "; falling back to clear_refs"
                    } else {
                        ""
                    }
                ),
            }
            fallback
        }
    };
    if !fallback {
        return Ok(None);
    }
    if uses_kvm(client).await? {
        // Logged, not warned: memtide's default policy asks for sampling where it can be
        // had, and clear_refs cannot see a KVM guest's accesses.
        tracing::info!(
            "{}: no host-side access sampling: under KVM, guest accesses are invisible to QEMU's page tables",
            socket.display()
        );
        return Ok(None);
    }
    let dir = opts.proc.join(pid.to_string());
    let sampler = AccessSampler::new(&dir, ram, opts.least_sample_window);
    Ok(Some(Access::ClearRefs(Scans::new(sampler, wait))))
}

/// True when the VM runs under KVM (`query-kvm`).
async fn uses_kvm(client: &mut QmpClient) -> Result<bool, BackendError> {
    let kvm = client.execute("query-kvm", None).await?;
    Ok(kvm.get("enabled").and_then(Value::as_bool).unwrap_or(false))
}

/// Find a device's QOM path rather than assuming an id: the first child among
/// user-created devices whose type starts with `kind` (e.g. `child<virtio-balloon`).
async fn find_device(client: &mut QmpClient, kind: &str) -> Result<Option<String>, BackendError> {
    for container in DEVICE_CONTAINERS {
        let list = match client
            .execute("qom-list", Some(json!({"path": container})))
            .await
        {
            Ok(list) => list,
            Err(QmpError::Command { .. }) => continue, // container absent in this machine type
            Err(e) => return Err(e.into()),
        };
        let found = list.as_array().into_iter().flatten().find_map(|child| {
            let ty = child.get("type")?.as_str()?;
            let name = child.get("name")?.as_str()?;
            ty.starts_with(kind).then(|| format!("{container}/{name}"))
        });
        if found.is_some() {
            return Ok(found);
        }
    }
    Ok(None)
}

/// QEMU's event for a device removed: a DIMM the guest gave up, a balloon unplugged.
const DEVICE_DELETED: &str = "DEVICE_DELETED";

/// What a VM's devices tell of its memory, as [`Devices::learn`] reads them: at the
/// connection, and again when a device came or went.
struct Devices {
    /// Base memory (`-m`), as `query-memory-size-summary` tells it.
    memory: Bytes,
    /// The memory the balloon works on ([`ballooned`]).
    base: Bytes,
    /// What the VM may be given: `base` and the virtio-mem device's maximum.
    configured: Bytes,
    /// The virtio-mem device's QOM path, when the VM has one.
    virtio_mem: Option<String>,
    /// Guest RAM's mappings ([`guest_ram`]), where QEMU's own memory can be told from
    /// them.
    guest_ram: Option<Vec<Bytes>>,
    /// The balloon, when QEMU has one.
    balloon: Option<Balloon>,
}

/// A VM's balloon device.
struct Balloon {
    /// Its QOM path, where found (needed for statistics).
    path: Option<String>,
    /// It gives memory back when the guest runs out (`deflate-on-oom`); its pages then
    /// stay in the guest's MemTotal.
    deflate_on_oom: bool,
    free_page_reporting: bool,
}

impl Devices {
    /// The devices of a VM whose base memory is `memory`, its balloon's statistics
    /// turned on every `stats_interval_s`.
    async fn learn(
        client: &mut QmpClient,
        memory: Bytes,
        stats_interval_s: u64,
    ) -> Result<Devices, BackendError> {
        let anonymous = find_device(client, "child<virtio-mem").await?;
        let devices = client.execute("query-memory-devices", None).await?;
        let base = ballooned(memory, &devices);
        let vmem = virtio_mem::parse(&devices, anonymous.as_deref());
        let configured = base + vmem.as_ref().map_or(Bytes::ZERO, |(_, d)| d.max);
        let balloon = match client.execute("query-balloon", None).await {
            Ok(_) => Some(Balloon::learn(client, stats_interval_s).await?),
            Err(QmpError::Command { class, .. }) if class == "DeviceNotActive" => None,
            Err(e) => return Err(e.into()),
        };
        Ok(Devices {
            memory,
            guest_ram: guest_ram(memory, &devices),
            base,
            configured,
            virtio_mem: vmem.map(|(path, _)| path),
            balloon,
        })
    }

    /// Guest RAM's mappings for access sampling, the passes and placement: the base
    /// memory's alone where they cannot be told.
    fn ram_mappings(&self) -> Vec<Bytes> {
        self.guest_ram.clone().unwrap_or_else(|| vec![self.memory])
    }
}

impl Balloon {
    /// The balloon QEMU has: its path, flags, and statistics every `stats_interval_s`.
    async fn learn(client: &mut QmpClient, stats_interval_s: u64) -> Result<Balloon, BackendError> {
        let path = find_device(client, "child<virtio-balloon").await?;
        let free_page_reporting = balloon_flag(client, &path, "free-page-reporting").await;
        let deflate_on_oom = balloon_flag(client, &path, "deflate-on-oom").await;
        if let Some(path) = &path {
            let args = json!({"path": path, "property": "guest-stats-polling-interval",
                "value": stats_interval_s.max(1)});
            client.execute("qom-set", Some(args)).await?;
        }
        Ok(Balloon {
            path,
            deflate_on_oom,
            free_page_reporting,
        })
    }
}

/// The memory QEMU's balloon works on: the base memory (`-m`) and each DIMM (as Proxmox
/// VE's memory hot-plug adds them), whose sizes its `actual` and the `balloon` command
/// count (checked with QEMU 7.2: a 256 MiB guest with a 128 MiB DIMM reads 384 MiB, and
/// `balloon 200M` leaves it 200; newer QEMU keeps the sum as `dimm_size`, NVDIMMs
/// left out as here), where a virtio-mem device's memory comes on top.
fn ballooned(base: Bytes, devices: &Value) -> Bytes {
    let dimms = devices.as_array().into_iter().flatten();
    dimms
        .filter(|d| d["type"] == "dimm")
        .filter_map(|d| d["data"]["size"].as_u64())
        .fold(base, |sum, size| sum + Bytes(size))
}

/// The sizes of a VM's guest RAM mappings in its QEMU, from `query-memory-devices`: its
/// base memory, and each memory device's backend (a virtio-mem device's whole maximum, a
/// DIMM's size, as Proxmox VE's memory hot-plug adds them). `None` for a device of any
/// other kind (NVDIMMs, virtio-pmem: files, whose memory QEMU's own would be mixed with).
fn guest_ram(base: Bytes, devices: &Value) -> Option<Vec<Bytes>> {
    let mut ram = vec![base];
    for device in devices.as_array()? {
        let size = match device["type"].as_str()? {
            "virtio-mem" => "max-size",
            "dimm" => "size",
            _ => return None,
        };
        ram.push(Bytes(device["data"][size].as_u64()?));
    }
    Some(ram)
}

impl QmpVm {
    /// A sample, read from QEMU.
    async fn read_sample(&mut self) -> Result<VmSample, BackendError> {
        // A device removed (a DIMM the guest gave up, as Proxmox VE unplugs memory; the
        // balloon): its devices are learnt again before they are queried. Taken from the
        // queue, the other events left for the sample; a failed read fails the sample and
        // is tried again at the next. Without an event (a device added), every
        // [`RELEARN_SAMPLES`] samples, where a failed read leaves the devices known, tried
        // again as many samples on; a DIMM plugged beside a balloon shows at once, in the
        // balloon's `actual`.
        self.removed |= self.client.take_events(DEVICE_DELETED) > 0;
        if self.removed {
            self.learn_devices().await?;
        } else if self.relearn.due() {
            if let Err(e) = self.learn_devices().await {
                tracing::warn!(
                    "{}: reading its devices again failed ({e}); sampled with those known",
                    self.client.socket().display()
                );
            }
        }
        let device = match self.devices.virtio_mem.clone() {
            Some(path) => Some(virtio_mem::query(&mut self.client, &path).await?),
            None => None,
        };
        // Whether the guest runs, the balloon and its statistics in one round trip.
        let mut calls = vec![("query-status", None)];
        let balloon = self.devices.balloon.as_ref();
        if balloon.is_some() {
            calls.push(("query-balloon", None));
        }
        if let Some(path) = balloon.and_then(|b| b.path.as_ref()) {
            let args = json!({"path": path, "property": "guest-stats"});
            calls.push(("qom-get", Some(args)));
        }
        let mut replies = self.client.execute_all(calls).await?.into_iter();
        let mut reply = || replies.next().expect("one reply per command");
        // A guest that does not run has stale figures and serves no balloon (found by an
        // audit: a paused guest's statistics were taken for a broken driver, its agent
        // for a missing one): stopped on an error (an I/O error, a panic, its watchdog),
        // it is out of reach, as a fault; otherwise (paused by its user, for a migration
        // or a save, shut down under `-no-shutdown`, in a debugger) busy, left alone
        // until it runs.
        let status = reply()?;
        if status.get("running").and_then(Value::as_bool) == Some(false) {
            let state = status
                .get("status")
                .and_then(Value::as_str)
                .unwrap_or("unknown");
            let why = format!("not running (QEMU's status: {state})");
            return Err(match state {
                "io-error" | "guest-panicked" | "internal-error" | "watchdog" => {
                    BackendError::Protocol(why)
                }
                _ => BackendError::Busy(format!("{why}: left alone until it runs")),
            });
        }
        // QEMU's balloon works on the base memory and DIMMs: virtio-mem's comes on top.
        let base_actual = if balloon.is_some() {
            let b = reply()?;
            let actual = b.get("actual").and_then(Value::as_u64);
            Some(Bytes(actual.ok_or_else(|| {
                BackendError::Protocol(format!("no actual in {b}"))
            })?))
        } else {
            None
        };
        let stats = match balloon.and_then(|b| b.path.as_ref()) {
            Some(_) => super::stats::parse(&reply()?),
            None => GuestStats::default(),
        };
        // More memory under the balloon than known: a DIMM plugged since (as Proxmox VE
        // adds memory to a running VM; QEMU says nothing).
        if base_actual.is_some_and(|actual| actual > self.devices.base) {
            self.learn_devices().await?;
        }
        let rss = self.process.as_ref().and_then(procfs::ProcessRss::read);
        let events = self.events();
        let agent = match &mut self.agent {
            Some(link) => Some(link.read().await),
            None => None,
        };
        // Guest RAM proper; virtio-mem memory is a mapping of its own.
        let (referenced, cold) = match &mut self.access {
            Some(Access::ClearRefs(scans)) => scans.sample().await,
            Some(Access::Tracked(scans)) => scans.sample().await,
            None => (None, None),
        };
        let (balloon, virtio_mem) = match &device {
            Some(d) => {
                let deflate_on_oom = self
                    .devices
                    .balloon
                    .as_ref()
                    .is_some_and(|b| b.deflate_on_oom);
                let (size, state) = self.vmem_follower.follow(
                    d,
                    self.devices.base,
                    base_actual,
                    deflate_on_oom,
                    &stats,
                );
                (Some(size), Some(state))
            }
            None => (base_actual, None),
        };
        let own = match &mut self.own {
            Some(own) => own.sample().await,
            None => None,
        };
        let status = self
            .process
            .as_mut()
            .map(|p| p.status(rss))
            .unwrap_or_default();
        Ok(VmSample {
            ram_mappings: self.devices.ram_mappings(),
            configured: self.devices.configured,
            balloon,
            stats,
            agent,
            rss,
            swapped: status.swapped,
            cpu_s: self.process.as_ref().and_then(procfs::ProcessRss::cpu_s),
            referenced,
            cold,
            virtio_mem,
            free_page_reporting: (self.devices.balloon.as_ref())
                .is_some_and(|b| b.free_page_reporting),
            fixed: status.fixed.map(|f| FixedMemory { own, ..f }),
            events,
        })
    }

    /// Learn the VM's devices again ([`Devices::learn`]): the target last sent is
    /// forgotten where the memory the balloon works on, the balloon or the virtio-mem
    /// device changed, so that the next is sent, and QEMU's own memory is told from the
    /// new guest RAM, whose accesses are sampled from the next scan on.
    async fn learn_devices(&mut self) -> Result<(), BackendError> {
        let devices =
            Devices::learn(&mut self.client, self.devices.memory, self.stats_interval_s).await?;
        let old = &self.devices;
        if devices.base != old.base
            || devices.balloon.is_some() != old.balloon.is_some()
            || devices.virtio_mem != old.virtio_mem
        {
            // The target was a size of the devices known then: no longer in force.
            self.target = None;
        }
        if devices.virtio_mem != old.virtio_mem {
            self.vmem_follower = Default::default();
        }
        if devices.ram_mappings() != old.ram_mappings() {
            if let Some(access) = &mut self.access {
                access.set_ram(devices.ram_mappings());
            }
        }
        match &devices.guest_ram {
            Some(ram) => {
                if let Some(own) = &mut self.own {
                    own.set_guest_ram(ram.clone());
                }
            }
            None => self.own = None,
        }
        self.devices = devices;
        self.removed = false;
        self.relearn.restart();
        Ok(())
    }

    /// Whether QEMU announced a shutdown (`SHUTDOWN`, its queued events included) with
    /// no reset since. A call can fail on the closed socket before the client's reader
    /// has read what QEMU sent before it closed: the reader is given up to 200 ms to
    /// reach the end.
    async fn announced_shutdown(&mut self) -> bool {
        for _ in 0..20 {
            if self.client.is_closed() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.events();
        self.shut_down
    }
}

#[async_trait]
impl VmBackend for QmpVm {
    fn resumed_at_connection(&mut self) -> Option<String> {
        self.cut_short.take_resumed()
    }

    async fn sample(&mut self) -> Result<VmSample, BackendError> {
        self.cut_short.check()?;
        match self.read_sample().await {
            // The connection closed after QEMU said it shut down: stopped, not crashed.
            Err(BackendError::Disconnected(why)) if self.announced_shutdown().await => {
                Err(BackendError::ShutDown(why))
            }
            sample => sample,
        }
    }

    async fn set_balloon(&mut self, target: Bytes) -> Result<(), BackendError> {
        if self.devices.balloon.is_none() && self.devices.virtio_mem.is_none() {
            return Err(BackendError::Protocol(
                "the VM has neither a balloon nor a virtio-mem device".into(),
            ));
        }
        let mut balloon = target;
        if let Some(path) = self.devices.virtio_mem.clone() {
            let device = virtio_mem::query(&mut self.client, &path).await?;
            let resize = crate::virtio_mem::resize(target, self.devices.base, &device);
            if resize.plug != device.requested {
                virtio_mem::request(&mut self.client, &path, resize.plug).await?;
            }
            balloon = resize.balloon;
        }
        if self.devices.balloon.is_some() {
            // The balloon's share, relative to the base memory whatever is plugged now.
            self.send_balloon(balloon).await?;
        }
        self.target = Some(target);
        Ok(())
    }

    fn target(&self) -> Option<Bytes> {
        self.target
    }

    async fn save(
        &mut self,
        dir: &Path,
        then: AfterSave,
        limit: Duration,
        seal: Seal,
    ) -> Result<Saved, BackendError> {
        let saved = super::snapshot::save(&mut self.client, dir, then, limit, seal).await;
        if let Err(e) = &saved {
            if super::snapshot::left_stopped(&mut self.client).await {
                (self.cut_short).left_stopped(format!("a save left the guest stopped ({e})"));
            }
        }
        saved
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qmp::client::tests::{ok, serve, HANG_UP};
    use crate::RELEARN_SAMPLES;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    #[test]
    fn guest_ram_is_the_base_memory_and_each_memory_devices_backend() {
        let mib = Bytes::from_mib;
        let device = |kind: &str, data: Value| json!({"type": kind, "data": data});
        assert_eq!(guest_ram(mib(512), &json!([])), Some(vec![mib(512)]));
        let devices = json!([
            device("virtio-mem", json!({"size": 0, "max-size": 256u64 << 20})),
            device("dimm", json!({"size": 1024u64 << 20})),
        ]);
        assert_eq!(
            guest_ram(mib(128), &devices),
            Some(vec![mib(128), mib(256), mib(1024)]),
            "virtio-mem's whole maximum, plugged or not"
        );
        let pmem = json!([device("virtio-pmem", json!({"size": 1u64 << 30}))]);
        assert_eq!(guest_ram(mib(128), &pmem), None, "a file backend");
        let broken = json!([device("virtio-mem", json!({"size": 0}))]);
        assert_eq!(guest_ram(mib(128), &broken), None, "no maximum");
        assert_eq!(guest_ram(mib(128), &json!({})), None);
    }

    #[test]
    fn the_balloon_works_on_the_base_memory_and_the_dimms_not_virtio_mem() {
        let mib = Bytes::from_mib;
        let device = |kind: &str, data: Value| json!({"type": kind, "data": data});
        assert_eq!(ballooned(mib(256), &json!([])), mib(256));
        let devices = json!([
            device("dimm", json!({"size": 128u64 << 20})),
            device(
                "virtio-mem",
                json!({"size": 64u64 << 20, "max-size": 256u64 << 20})
            ),
            device("dimm", json!({"size": 512u64 << 20})),
        ]);
        assert_eq!(ballooned(mib(256), &devices), mib(896));
        // Figures QEMU did not give are no memory.
        let odd = json!([
            device("dimm", json!({})),
            device("dimm", json!({"size": "1G"}))
        ]);
        assert_eq!(ballooned(mib(256), &odd), mib(256));
        assert_eq!(ballooned(mib(256), &json!({})), mib(256));
    }

    #[test]
    fn an_access_sample_of_a_short_window_is_not_taken_and_its_window_stays_open() {
        let dir = tempfile::tempdir().unwrap();
        let smaps = dir.path().join("smaps");
        // A 192 MiB guest with 6 MiB referenced (a real QEMU's smaps).
        std::fs::write(&smaps, include_str!("../../tests/data/proc/qemu-smaps")).unwrap();
        let t0 = Instant::now();
        let mut s = AccessSampler::new(
            dir.path(),
            vec![Bytes::from_mib(192)],
            Duration::from_millis(500),
        );
        let at = |ms| t0 + Duration::from_millis(ms);
        assert_eq!(s.sample(t0), None, "the first starts the window");
        // Asked again at once (after a late sample): not taken, the window left open.
        assert_eq!(s.sample(at(200)), None);
        assert_eq!(s.sample(at(600)), Some(Bytes::from_mib(6)));
        // The next window begins there.
        assert_eq!(s.sample(at(1000)), None);
        assert_eq!(s.sample(at(1100)), Some(Bytes::from_mib(6)));
        // Where the accessed bits cannot be cleared, no window begins.
        s.clear_refs = dir.path().join("gone/clear_refs");
        assert_eq!(s.sample(at(2000)), Some(Bytes::from_mib(6)));
        assert_eq!(s.sample(at(3000)), None);
    }

    #[test]
    fn access_sampling_flushes_the_tlb_where_guest_ram_holds_huge_pages() {
        let dir = tempfile::tempdir().unwrap();
        let (smaps, clear_refs) = (dir.path().join("smaps"), dir.path().join("clear_refs"));
        // A FIFO in its place, read write by write: the writes in order.
        let fifo = std::ffi::CString::new(clear_refs.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let written = Arc::new(std::sync::Mutex::new(String::new()));
        let reader = {
            let (path, written) = (clear_refs.clone(), Arc::clone(&written));
            std::thread::spawn(move || loop {
                let Ok(text) = std::fs::read_to_string(&path) else {
                    return;
                };
                if text == "end" {
                    return;
                }
                written.lock().unwrap().push_str(&text);
            })
        };
        // What was written since the last look, once `n` writes are in.
        let writes = |n: usize| {
            for _ in 0..500 {
                if written.lock().unwrap().len() >= n {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            std::mem::take(&mut *written.lock().unwrap())
        };
        // A 192 MiB guest with 6 MiB of its RAM in huge pages, and without.
        let huge = include_str!("../../tests/data/proc/qemu-smaps");
        let small = huge.replacen(
            "AnonHugePages:      6144 kB",
            "AnonHugePages:         0 kB",
            1,
        );
        assert_ne!(small, huge);
        std::fs::write(&smaps, &small).unwrap();
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        let mut s = AccessSampler::new(
            dir.path(),
            vec![Bytes::from_mib(192)],
            Duration::from_millis(500),
        );
        // 1 clears the accessed bits, then 4 the soft-dirty bits, which flushes the TLB.
        s.sample(t0);
        assert_eq!(
            writes(2),
            "14",
            "before any read of smaps, huge pages are assumed"
        );
        assert_eq!(s.sample(at(1)), Some(Bytes::from_mib(6)));
        assert_eq!(writes(1), "1", "no huge pages in guest RAM: no flush");
        std::fs::write(&smaps, huge).unwrap();
        assert_eq!(s.sample(at(2)), Some(Bytes::from_mib(6)));
        assert_eq!(writes(2), "14");
        // A failed read of smaps leaves what was last seen.
        std::fs::remove_file(&smaps).unwrap();
        assert_eq!(s.sample(at(3)), None);
        assert_eq!(writes(2), "14");
        std::fs::write(&clear_refs, "end").unwrap();
        reader.join().unwrap();
    }

    /// A scan that ends when the test says, counting those started.
    struct Gated {
        started: Arc<AtomicU32>,
        go: std::sync::mpsc::Receiver<()>,
    }

    impl Scan for Gated {
        fn scan(&mut self) -> Scanned {
            let n = self.started.fetch_add(1, Ordering::SeqCst) + 1;
            // The test may end with a scan waiting: its gate then closes.
            let _ = self.go.recv();
            (Some(Bytes::from_mib(n.into())), None)
        }

        fn set_ram(&mut self, _: Vec<Bytes>) {}
    }

    /// A scan that ends when the test says, of guest RAM in mappings of `ram`'s sizes,
    /// which it gives as the memory accessed.
    struct Sized {
        ram: Vec<Bytes>,
        go: std::sync::mpsc::Receiver<()>,
    }

    impl Scan for Sized {
        fn scan(&mut self) -> Scanned {
            let _ = self.go.recv();
            (Some(self.ram.iter().fold(Bytes::ZERO, |a, b| a + *b)), None)
        }

        fn set_ram(&mut self, ram: Vec<Bytes>) {
            self.ram = ram;
        }
    }

    #[tokio::test]
    async fn guest_ram_changed_is_scanned_from_the_next_scan_started() {
        let mib = Bytes::from_mib;
        let (go, gate) = std::sync::mpsc::channel();
        let sized = Sized {
            ram: vec![mib(256)],
            go: gate,
        };
        let mut scans = Scans::new(sized, Duration::from_millis(20));
        go.send(()).unwrap();
        // Samples until one takes a scan's result.
        async fn taken(scans: &mut Scans<Sized>) -> Scanned {
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut scanned = scans.sample().await;
            while scanned == (None, None) && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(5)).await;
                scanned = scans.sample().await;
            }
            scanned
        }
        let first = taken(&mut scans).await;
        assert_eq!(first, (Some(mib(256)), None));
        // A DIMM plugged while no scan runs: the next scan's.
        scans.set_ram(vec![mib(256), mib(128)]);
        go.send(()).unwrap();
        let second = taken(&mut scans).await;
        assert_eq!(second, (Some(mib(384)), None));
        // Removed while a scan runs: it goes on with what it had, the next has the change.
        assert_eq!(scans.sample().await, (None, None), "running");
        scans.set_ram(vec![mib(256)]);
        go.send(()).unwrap();
        let third = taken(&mut scans).await;
        assert_eq!(third, (Some(mib(384)), None));
        go.send(()).unwrap();
        let fourth = taken(&mut scans).await;
        assert_eq!(fourth, (Some(mib(256)), None));
    }

    #[tokio::test]
    async fn a_scan_that_outlasts_its_sample_runs_on_alone_and_a_later_sample_takes_it() {
        let started = Arc::new(AtomicU32::new(0));
        let (go, gate) = std::sync::mpsc::channel();
        let gated = Gated {
            started: Arc::clone(&started),
            go: gate,
        };
        let mut scans = Scans::new(gated, Duration::from_millis(20));
        assert_eq!(
            scans.sample().await,
            (None, None),
            "not waited for past 20 ms"
        );
        assert_eq!(scans.sample().await, (None, None), "still running");
        assert_eq!(started.load(Ordering::SeqCst), 1, "no second scan in line");
        // Samples until one takes a scan's result (within 10 s: the pool's thread may be
        // slow to run on a loaded host).
        async fn taken(scans: &mut Scans<Gated>) -> Scanned {
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut scanned = scans.sample().await;
            while scanned == (None, None) && Instant::now() < deadline {
                scanned = scans.sample().await;
            }
            scanned
        }
        go.send(()).unwrap();
        let first = taken(&mut scans).await;
        assert_eq!(
            first,
            (Some(Bytes::from_mib(1)), None),
            "taken by a later sample"
        );
        // The next scan was started as it was taken, and is the next sample's: a result
        // every sample, not every other.
        let deadline = Instant::now() + Duration::from_secs(10);
        while started.load(Ordering::SeqCst) < 2 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(
            started.load(Ordering::SeqCst),
            2,
            "started, no sample asking"
        );
        go.send(()).unwrap();
        assert_eq!(taken(&mut scans).await, (Some(Bytes::from_mib(2)), None));
        // A scan that ends within its own sample's wait is not followed by another: the
        // next sample starts the next.
        let started = Arc::new(AtomicU32::new(0));
        let (go, gate) = std::sync::mpsc::channel();
        let gated = Gated {
            started: Arc::clone(&started),
            go: gate,
        };
        let mut scans = Scans::new(gated, Duration::from_secs(10));
        go.send(()).unwrap();
        assert_eq!(scans.sample().await, (Some(Bytes::from_mib(1)), None));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(started.load(Ordering::SeqCst), 1);
        assert!(matches!(scans.state, ScanState::Ready(_)));
    }

    /// Options for a scripted QEMU: no access sampling.
    fn options() -> QmpVmOptions {
        QmpVmOptions {
            call_timeout: Duration::from_secs(2),
            stats_interval_s: 1,
            proc: "/proc".into(),
            sys: "/sys".into(),
            sample_access: AccessSampling::Off,
            least_sample_window: Duration::from_millis(500),
        }
    }

    /// A QEMU with a balloon that goes away at the second `query-balloon` (the first
    /// sample's), announcing its shutdown first when `announce`.
    async fn going_away(announce: bool) -> BackendError {
        let balloons = AtomicU32::new(0);
        let (_dir, path) = serve(move |req| match req["execute"].as_str().unwrap() {
            "query-memory-size-summary" => vec![ok(&req, json!({"base-memory": 1u64 << 30}))],
            "query-balloon" if balloons.fetch_add(1, Ordering::SeqCst) > 0 => {
                let shutdown = r#"{"event": "SHUTDOWN", "data": {"guest": false, "reason": "host-qmp-quit"}, "timestamp": {"seconds": 1, "microseconds": 2}}"#;
                let mut out = vec![HANG_UP.to_string()];
                if announce {
                    out.insert(0, shutdown.into());
                }
                out
            }
            "query-balloon" => vec![ok(&req, json!({"actual": 1u64 << 30}))],
            _ => vec![ok(&req, json!([]))],
        })
        .await;
        let mut vm = QmpVm::connect(&path, None, &options()).await.unwrap();
        vm.sample().await.unwrap_err()
    }

    /// QEMU's event for device `id` removed, as a line of the monitor.
    fn device_deleted(id: &str) -> String {
        json!({"event": "DEVICE_DELETED", "data": {"device": id,
            "path": format!("/machine/peripheral/{id}")},
            "timestamp": {"seconds": 1, "microseconds": 2}})
        .to_string()
    }

    #[tokio::test]
    async fn a_dimm_unplugged_shrinks_the_vm_at_the_next_sample() {
        // 256 MiB of base memory and a 128 MiB DIMM, which the guest gives up while the
        // second sample is read (QEMU's DEVICE_DELETED comes with its balloon reply):
        // QEMU lists no DIMM from then on, but fails the first listing after.
        let balloons = Arc::new(AtomicU32::new(0));
        let listings = Arc::new(AtomicU32::new(0));
        let (seen, listed) = (Arc::clone(&balloons), Arc::clone(&listings));
        let mib = |n: u64| n << 20;
        let (_dir, path) = serve(move |req| match req["execute"].as_str().unwrap() {
            "query-memory-size-summary" => vec![ok(&req, json!({"base-memory": mib(256)}))],
            // The connection's query-balloon, each sample's: the DIMM goes with the third.
            "query-memory-devices" if seen.load(Ordering::SeqCst) < 3 => {
                let dimm = json!({"type": "dimm", "data": {"id": "dimm0", "size": mib(128)}});
                vec![ok(&req, json!([dimm]))]
            }
            "query-memory-devices" if listed.fetch_add(1, Ordering::SeqCst) == 0 => {
                let error = json!({"class": "GenericError", "desc": "busy"});
                vec![json!({"error": error, "id": req["id"]}).to_string()]
            }
            "query-memory-devices" => vec![ok(&req, json!([]))],
            "query-balloon" => match seen.fetch_add(1, Ordering::SeqCst) {
                0 | 1 => vec![ok(&req, json!({"actual": mib(384)}))],
                2 => vec![
                    device_deleted("dimm0"),
                    ok(&req, json!({"actual": mib(256)})),
                ],
                _ => vec![ok(&req, json!({"actual": mib(256)}))],
            },
            _ => vec![ok(&req, json!([]))],
        })
        .await;
        let mut vm = QmpVm::connect(&path, None, &options()).await.unwrap();
        vm.set_balloon(Bytes::from_mib(384)).await.unwrap();
        let mappings = |s: &VmSample| {
            s.ram_mappings
                .iter()
                .map(|m| m.mib_f64())
                .collect::<Vec<_>>()
        };
        let first = vm.sample().await.unwrap();
        assert_eq!(first.configured, Bytes::from_mib(384));
        assert_eq!(mappings(&first), [256.0, 128.0]);
        let second = vm.sample().await.unwrap();
        assert_eq!(
            second.configured,
            Bytes::from_mib(384),
            "the event came late"
        );
        // Learnt at the next sample, whose listing fails: tried again at the one after.
        vm.sample().await.unwrap_err();
        let fourth = vm.sample().await.unwrap();
        assert_eq!(
            fourth.configured,
            Bytes::from_mib(256),
            "sized without the DIMM"
        );
        assert_eq!(mappings(&fourth), [256.0]);
        assert_eq!(listings.load(Ordering::SeqCst), 2);
        assert_eq!(vm.target, None, "the old target no longer in force");
        // Learnt once for the event, not at every sample since.
        vm.sample().await.unwrap();
        assert_eq!(listings.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_paused_guest_is_left_alone_as_busy_and_one_stopped_on_an_error_is_a_fault() {
        let paused = Arc::new(AtomicU32::new(1));
        let stopped = Arc::clone(&paused);
        let (_dir, path) = serve(move |req| match req["execute"].as_str().unwrap() {
            "query-memory-size-summary" => vec![ok(&req, json!({"base-memory": 512u64 << 20}))],
            "query-balloon" => vec![ok(&req, json!({"actual": 400u64 << 20}))],
            "query-status" if stopped.load(Ordering::SeqCst) == 1 => {
                vec![ok(&req, json!({"status": "paused", "running": false}))]
            }
            "query-status" if stopped.load(Ordering::SeqCst) == 2 => {
                vec![ok(&req, json!({"status": "io-error", "running": false}))]
            }
            "query-status" => vec![ok(&req, json!({"status": "running", "running": true}))],
            _ => vec![ok(&req, json!([]))],
        })
        .await;
        let mut vm = QmpVm::connect(&path, None, &options()).await.unwrap();
        let err = vm.sample().await.unwrap_err();
        assert_eq!(
            err,
            BackendError::Busy(
                "not running (QEMU's status: paused): left alone until it runs".into()
            )
        );
        paused.store(2, Ordering::SeqCst);
        assert_eq!(
            vm.sample().await.unwrap_err(),
            BackendError::Protocol("not running (QEMU's status: io-error)".into()),
            "a fault, not a pause"
        );
        paused.store(0, Ordering::SeqCst);
        assert_eq!(
            vm.sample().await.unwrap().balloon,
            Some(Bytes::from_mib(400))
        );
    }

    #[tokio::test]
    async fn a_balloon_unplugged_leaves_the_vm_sampled_without_it() {
        // A 512 MiB VM whose balloon is removed (`device_del`): QEMU says DEVICE_DELETED,
        // and query-balloon answers DeviceNotActive from then on.
        let gone = Arc::new(AtomicU32::new(0));
        let removed = Arc::clone(&gone);
        let (_dir, path) = serve(move |req| match req["execute"].as_str().unwrap() {
            "query-memory-size-summary" => vec![ok(&req, json!({"base-memory": 512u64 << 20}))],
            "query-balloon" if removed.load(Ordering::SeqCst) > 1 => {
                let error = json!({"class": "DeviceNotActive", "desc": "No balloon device has been activated"});
                vec![json!({"error": error, "id": req["id"]}).to_string()]
            }
            "query-balloon" => {
                let mut out = vec![ok(&req, json!({"actual": 400u64 << 20}))];
                if removed.fetch_add(1, Ordering::SeqCst) == 1 {
                    out.insert(0, device_deleted("balloon0"));
                }
                out
            }
            _ => vec![ok(&req, json!([]))],
        })
        .await;
        let mut vm = QmpVm::connect(&path, None, &options()).await.unwrap();
        let first = vm.sample().await.unwrap();
        assert_eq!(first.balloon, Some(Bytes::from_mib(400)));
        let second = vm.sample().await.unwrap();
        assert_eq!(
            second.balloon, None,
            "sampled without the balloon, not failing"
        );
        assert_eq!(second.configured, Bytes::from_mib(512));
        let err = vm.set_balloon(Bytes::from_mib(300)).await.unwrap_err();
        assert!(err.to_string().contains("neither a balloon"), "{err}");
    }

    #[tokio::test]
    async fn a_dimm_plugged_is_sampled_for_accesses_from_the_next_sample() {
        // 256 MiB of base memory, a 128 MiB DIMM plugged before the second sample (QEMU's
        // balloon counts it); host-side access sampling by clear_refs reads a QEMU's
        // smaps with 10 MiB referenced in the base memory's mapping, 20 in the DIMM's.
        let balloons = Arc::new(AtomicU32::new(0));
        let seen = Arc::clone(&balloons);
        let mib = |n: u64| n << 20;
        let (_dir, path) = serve(move |req| match req["execute"].as_str().unwrap() {
            "query-memory-size-summary" => vec![ok(&req, json!({"base-memory": mib(256)}))],
            // The connection's query-balloon, then each sample's: the DIMM with the third.
            "query-balloon" if seen.fetch_add(1, Ordering::SeqCst) < 2 => {
                vec![ok(&req, json!({"actual": mib(256)}))]
            }
            "query-balloon" => vec![ok(&req, json!({"actual": mib(384)}))],
            "query-memory-devices" if seen.load(Ordering::SeqCst) >= 3 => {
                let dimm = json!({"type": "dimm", "data": {"id": "dimm0", "size": mib(128)}});
                vec![ok(&req, json!([dimm]))]
            }
            _ => vec![ok(&req, json!([]))],
        })
        .await;
        let proc = tempfile::tempdir().unwrap();
        let dir = proc.path().join(std::process::id().to_string());
        std::fs::create_dir(&dir).unwrap();
        let mapping = |at: &str, kib: u64, referenced: u64| {
            format!(
                "{at} rw-p 00000000 00:00 0\nSize: {kib} kB\nRss: {kib} kB\n\
                 Referenced: {referenced} kB\nAnonHugePages: 0 kB\n"
            )
        };
        let smaps = mapping("7f0000000000-7f0010000000", 262144, 10240)
            + &mapping("7f0020000000-7f0028000000", 131072, 20480);
        std::fs::write(dir.join("smaps"), smaps).unwrap();
        let opts = QmpVmOptions {
            proc: proc.path().into(),
            sample_access: AccessSampling::ClearRefs,
            least_sample_window: Duration::ZERO,
            ..options()
        };
        let mut vm = QmpVm::connect(&path, None, &opts).await.unwrap();
        let first = vm.sample().await.unwrap();
        assert_eq!(first.referenced, None, "the first sample starts the window");
        let second = vm.sample().await.unwrap();
        assert_eq!(second.configured, Bytes::from_mib(384));
        assert_eq!(
            second.referenced,
            Some(Bytes::from_mib(30)),
            "the DIMM's mapping sampled too"
        );
    }

    #[tokio::test]
    async fn a_balloon_plugged_into_a_running_vm_is_learnt_within_the_relearn_samples() {
        // A 512 MiB VM started without a balloon; one is plugged (`device_add`, of which
        // QEMU says nothing) after memtide connected.
        let plugged = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let listings = Arc::new(AtomicU32::new(0));
        let (balloon, listed) = (Arc::clone(&plugged), Arc::clone(&listings));
        let (_dir, path) = serve(move |req| match req["execute"].as_str().unwrap() {
            "query-memory-size-summary" => vec![ok(&req, json!({"base-memory": 512u64 << 20}))],
            "query-balloon" if balloon.load(Ordering::SeqCst) => {
                vec![ok(&req, json!({"actual": 512u64 << 20}))]
            }
            "query-balloon" => {
                let error = json!({"class": "DeviceNotActive", "desc": "No balloon device has been activated"});
                vec![json!({"error": error, "id": req["id"]}).to_string()]
            }
            "query-memory-devices" => {
                listed.fetch_add(1, Ordering::SeqCst);
                vec![ok(&req, json!([]))]
            }
            _ => vec![ok(&req, json!([]))],
        })
        .await;
        let mut vm = QmpVm::connect(&path, None, &options()).await.unwrap();
        assert_eq!(vm.sample().await.unwrap().balloon, None);
        plugged.store(true, Ordering::SeqCst);
        // Samples since the connection, until one has the balloon.
        let mut taken = 1;
        loop {
            taken += 1;
            if vm.sample().await.unwrap().balloon.is_some() {
                break;
            }
            assert!(taken <= RELEARN_SAMPLES + 1, "never learnt");
        }
        assert_eq!(
            taken,
            RELEARN_SAMPLES + 1,
            "learnt again once, not every sample"
        );
        assert_eq!(
            listings.load(Ordering::SeqCst),
            2,
            "at the connection and once after"
        );
        vm.set_balloon(Bytes::from_mib(400)).await.unwrap();
    }

    #[tokio::test]
    async fn a_failed_reading_of_the_devices_with_none_removed_leaves_the_vm_sampled() {
        // QEMU lists its memory devices at the connection and fails every listing after:
        // the periodic reading fails, the samples go on with the devices known.
        let listings = Arc::new(AtomicU32::new(0));
        let listed = Arc::clone(&listings);
        let (_dir, path) = serve(move |req| match req["execute"].as_str().unwrap() {
            "query-memory-size-summary" => vec![ok(&req, json!({"base-memory": 512u64 << 20}))],
            "query-balloon" => vec![ok(&req, json!({"actual": 400u64 << 20}))],
            "query-memory-devices" if listed.fetch_add(1, Ordering::SeqCst) > 0 => {
                let error = json!({"class": "GenericError", "desc": "busy"});
                vec![json!({"error": error, "id": req["id"]}).to_string()]
            }
            _ => vec![ok(&req, json!([]))],
        })
        .await;
        let mut vm = QmpVm::connect(&path, None, &options()).await.unwrap();
        for _ in 0..=RELEARN_SAMPLES {
            let sample = vm.sample().await.unwrap();
            assert_eq!(sample.balloon, Some(Bytes::from_mib(400)));
        }
        assert_eq!(
            listings.load(Ordering::SeqCst),
            2,
            "tried once, not every sample after"
        );
        vm.sample().await.unwrap();
        assert_eq!(listings.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_qemu_that_announced_its_shutdown_is_told_from_one_that_vanished() {
        let err = going_away(true).await;
        assert!(matches!(err, BackendError::ShutDown(_)), "{err}");
        let err = going_away(false).await;
        assert!(matches!(err, BackendError::Disconnected(_)), "{err}");
    }
}
