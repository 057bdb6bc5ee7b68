//! The VMs memtide manages: found from the configuration, socket globs and libvirt
//! connections, connected in the background with backoff, each sampled and actuated by
//! its own task (`vm_task`) under the tick's deadline, and dropped cleanly when their
//! hypervisor goes away.

use super::backoff::{Backoff, Failures, LOG_EVERY};
use super::endpoint::{Connection, Connector, Endpoint};
use super::pods::PodBounds;
use super::vm_task::{Answer, Call, SaveJob, VmTask};
use crate::config::{Bound, BoundFrom, Bounds, BoundsFrom, Config, VmConfig};
use futures::future::join_all;
use memtide_adapters::access::Mappings;
use memtide_adapters::kubevirt::Launcher;
use memtide_adapters::procfs;
use memtide_core::{BackendError, Bytes, VmSnapshot};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio::time::{timeout, Instant};

/// A VM connected at least this long when it is lost starts its reconnection backoff
/// afresh; one lost sooner keeps doubling it.
const STABLE: Duration = Duration::from_secs(60);

/// Something that happened to the fleet, for the event log.
#[derive(Debug, Clone, PartialEq)]
pub enum FleetEvent {
    /// A VM was connected and is now managed.
    Connected {
        /// Its name.
        vm: String,
        /// Where it was reached.
        endpoint: String,
        /// What the connection found left stopped by a save or restore of memtide's cut
        /// short and resumed, said in a sentence.
        resumed: Option<String>,
    },
    /// A managed VM went away.
    Lost {
        /// Its name.
        vm: String,
        /// Why.
        why: String,
        /// Its hypervisor announced a shutdown before it went.
        shut_down: bool,
        /// Its hypervisor process, when known.
        pid: Option<u32>,
        /// That process's start time, when known: another process at the pid is not it.
        started: Option<u64>,
    },
    /// A managed VM's hypervisor process became known after it connected: its connector
    /// found it, or found a new one (libvirt's QEMU, looked for by the domain's UUID), or
    /// its start time could be read at last.
    Process {
        /// Its name.
        vm: String,
        /// The process.
        pid: u32,
        /// The other process it was known by before, if any.
        was: Option<u32>,
    },
}

/// A VM known but not connected, shown in status.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Waiting {
    /// Its name.
    pub name: String,
    /// Where it is reached: a socket, or a libvirt URI and domain.
    pub endpoint: String,
    /// The last connection error.
    pub error: Option<String>,
    /// Left alone on purpose (another manager owns its balloon), not out of reach.
    #[serde(default)]
    pub left_alone: bool,
    /// Seconds until the next attempt.
    pub retry_in_s: f64,
}

/// A VM not connected yet.
struct Candidate {
    name: String,
    agent: Option<PathBuf>,
    /// Its `[[vm]]` entry, if it has one.
    config: Option<VmConfig>,
    /// Found by a glob or a libvirt listing (forgotten when it disappears from there),
    /// not named in the config.
    discovered: bool,
    backoff: Backoff,
    error: Option<String>,
    /// The last connection was refused on purpose ([`Waiting::left_alone`]).
    left_alone: bool,
    /// Kept while it reconnects: a VM does not escape the backoff by dropping its session.
    actuation: Actuation,
    /// Kept while it reconnects.
    late_samples: u64,
}

/// Balloon commands wait out this backoff after one fails (a VM that ignores them costs
/// one call timeout per backoff period, not one per tick).
#[derive(Default)]
struct Actuation {
    backoff: Backoff,
    /// Why the last command failed, while the backoff lasts.
    error: Option<String>,
    /// The last target sent.
    sent: Option<Bytes>,
}

impl Actuation {
    /// Take in a balloon command's result: a success clears the backoff, a failure
    /// starts or extends it.
    fn took(&mut self, result: &Result<(), BackendError>) {
        match result {
            Ok(()) => {
                self.backoff = Backoff::default();
                self.error = None;
            }
            Err(e) => {
                self.backoff.failed(Instant::now());
                self.error = Some(e.to_string());
            }
        }
    }

    /// Whether `target` may be sent at `now`: once the backoff after a failed command has
    /// passed, or at once when it gives the guest more than the last target sent (memory
    /// given back must not wait: the guest may be short of it, and each raise is sent
    /// once, so a VM that ignores commands is not asked every tick).
    fn may_send(&self, target: Bytes, now: Instant) -> bool {
        self.backoff.ready(now) || self.sent.is_some_and(|sent| target > sent)
    }
}

/// What a tick's sampling found.
#[derive(Debug, Default)]
pub struct Sampled {
    /// The managed VMs in name order, a late one with an error sample.
    pub vms: Vec<VmSnapshot>,
    /// VMs lost.
    pub events: Vec<FleetEvent>,
    /// Balloon commands answered after the deadline of the tick that sent them.
    pub balloons: Vec<Answered>,
}

/// A balloon command answered after its tick.
#[derive(Debug, PartialEq)]
pub struct Answered {
    /// The VM.
    pub vm: String,
    /// The target it was sent.
    pub target: Bytes,
    /// Its result.
    pub result: Result<(), BackendError>,
}

/// What became of a balloon command by the tick's deadline.
#[derive(Debug, Clone, PartialEq)]
pub enum Sent {
    /// Answered, or not sent (the error says why).
    Answered(Result<(), BackendError>),
    /// Sent, not answered yet: a later tick reports it.
    InFlight,
}

/// How a managed VM's samples are arriving, shown in status and metrics.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Sampling {
    /// Its name.
    pub name: String,
    /// How memtide reaches it: `qmp`, `libvirt`, `firecracker` or `cloud_hypervisor`.
    #[serde(default)]
    pub connector: String,
    /// Its sample missed the last tick's deadline: it was left out of that decision.
    pub stale: bool,
    /// Seconds since its latest sample arrived (`None`: none yet).
    pub age_s: Option<f64>,
    /// Samples that missed their tick's deadline since the daemon started.
    pub late_samples: u64,
    /// Where its bounds came from (`None`: its size is not known yet).
    #[serde(default)]
    pub bounds_from: Option<BoundsFrom>,
}

/// A connected VM.
struct Managed {
    endpoint: Endpoint,
    agent: Option<PathBuf>,
    config: Option<VmConfig>,
    /// The bounds its hypervisor gave when it connected: min, max, shares.
    own: (Option<Bound>, Option<Bound>, Option<u32>),
    /// Where the bounds its backend reports while it runs come from, where it reports
    /// them: they stand for `own`'s min and max.
    described: Option<BoundFrom>,
    /// Where its bounds at the latest sample came from.
    bounds_from: Option<BoundsFrom>,
    /// The VM of a KubeVirt launcher pod on this node.
    launcher: bool,
    discovered: bool,
    task: VmTask,
    /// The configured size, once a sample has told it.
    configured: Option<Bytes>,
    /// Guest RAM's mappings, as the latest sample that told them did.
    ram: Option<Mappings>,
    actuation: Actuation,
    /// Samples that missed their tick's deadline.
    late_samples: u64,
    /// When its latest sample with figures arrived.
    sampled: Option<Instant>,
    /// This tick's sample missed the deadline.
    stale: bool,
    /// The reconnection backoff it had when it connected, and when that was: a VM lost
    /// soon after connecting waits longer each time.
    reconnect: Backoff,
    connected: Instant,
    /// A save asked for while a call was in flight: the next sample starts it once that
    /// call has answered.
    save: Option<SaveJob>,
    /// Its hypervisor's process, when known.
    pid: Option<u32>,
    /// That process's start time when it became known: with the pid, it names the
    /// process (another may take the pid once it has ended).
    started: Option<u64>,
}

impl Managed {
    /// Take the hypervisor process its connector knows now where that is another pid than
    /// the VM's (found after connecting, or after a restart), or the VM's own whose start
    /// time was not read at connection, with its start time read from `proc`: what acts
    /// on the process (reclaim, huge pages, placement, crash recovery, the state file)
    /// acts on that one from now on. A start time not read (a process gone, a procfs that
    /// did not show it) is read again at the next sample, the process not taken
    /// meanwhile. A process the connector lost is not forgotten here: the start time kept
    /// tells a pid taken by another process since. Processes are told apart by pid at
    /// each sample; a start time is read only for a new pid, or for the VM's own until it
    /// is read.
    fn follow_process(&mut self, vm: &str, proc: &Path) -> Option<FleetEvent> {
        let pid = self.task.pid().and_then(procfs::known_pid)?;
        let own = self.pid == Some(pid.unsigned_abs());
        if own && self.started.is_some() {
            return None;
        }
        self.started = Some(procfs::start_time(proc, pid)?);
        let was = self.pid.replace(pid.unsigned_abs()).filter(|_| !own);
        Some(FleetEvent::Process {
            vm: vm.to_string(),
            pid: pid.unsigned_abs(),
            was,
        })
    }
}

type Attempt = (Endpoint, Result<Connection, BackendError>);
type Listing = (String, Result<Vec<String>, BackendError>);

/// How a glob's sockets are reached.
#[derive(Clone, Copy)]
enum SocketKind {
    Qmp,
    Firecracker,
    CloudHypervisor,
}

/// How often the process table is scanned for KubeVirt's launcher daemons.
const LAUNCHER_SCAN: Duration = Duration::from_secs(10);

/// A scan for launchers still running after this long is said to be late, once.
const LAUNCHER_SCAN_LATE: Duration = Duration::from_secs(60);

/// KubeVirt's launcher daemons found on this node: their libvirt URIs are listed as the
/// configured ones are.
struct Launchers {
    /// Where they are looked for (the host's `/proc`).
    proc: PathBuf,
    /// When the last look started.
    scanned: Option<Instant>,
    /// The look under way, off the runtime: at most one.
    scanning: JoinSet<Vec<Launcher>>,
    /// Whether the look under way has been said to be late.
    late: bool,
    /// The daemons the last look found.
    found: Vec<Launcher>,
    /// The domains refused from each daemon's last listing, with why (each said once).
    refused: HashMap<String, BTreeMap<String, String>>,
    /// The domains waiting for their pod in the pod list, by daemon (each said once).
    waiting: HashMap<String, HashSet<String>>,
}

impl Launchers {
    fn get(&self, uri: &str) -> Option<&Launcher> {
        self.found.iter().find(|l| l.uri == uri)
    }

    fn has(&self, uri: &str) -> bool {
        self.get(uri).is_some()
    }
}

/// All VMs, connected or not.
pub struct Fleet {
    connector: Arc<dyn Connector>,
    globs: Vec<(SocketKind, String)>,
    /// The configured libvirt URIs.
    libvirt_uris: Vec<String>,
    /// KubeVirt's launcher daemons on this node, when they are looked for.
    launchers: Option<Launchers>,
    /// Their pods' memory, when their VMs take their bounds from it.
    pods: Option<Arc<PodBounds>>,
    agent_extension: String,
    /// Sockets found by the globs and not managed (links, names another VM has), each said
    /// once while it is there.
    refused: HashSet<PathBuf>,
    defaults: crate::config::VmDefaults,
    call_timeout: Duration,
    /// The tick interval: a sample asked for at the previous tick is fresh.
    interval: Duration,
    candidates: BTreeMap<Endpoint, Candidate>,
    managed: BTreeMap<String, Managed>,
    /// The names of the VMs configured by `pid` alone: never connected, only placed, but
    /// taken all the same (a VM discovered under one would be placed as that process).
    placed_only: HashSet<String>,
    connecting: JoinSet<Attempt>,
    in_flight: HashSet<Endpoint>,
    listing: JoinSet<Listing>,
    listing_in_flight: HashSet<String>,
    /// libvirt URIs whose listing fails, each logged at first and then every
    /// [`LOG_EVERY`], not at every tick.
    listing_failures: HashMap<String, Failures>,
    /// The host's /proc, where a hypervisor's start time is read.
    proc: PathBuf,
}

impl Fleet {
    /// A fleet from the configuration's VM list, globs and libvirt connections.
    pub fn new(config: &Config, connector: Arc<dyn Connector>) -> Fleet {
        let candidates = config
            .vms
            .iter()
            .filter_map(|vm| {
                let c = Candidate {
                    name: vm.name.clone(),
                    agent: vm.agent.clone(),
                    config: Some(vm.clone()),
                    discovered: false,
                    backoff: Backoff::default(),
                    actuation: Actuation::default(),
                    late_samples: 0,
                    error: None,
                    left_alone: false,
                };
                Some((Endpoint::of(vm)?, c))
            })
            .collect();
        let globs = [
            (SocketKind::Qmp, &config.discovery.qmp_glob),
            (SocketKind::Firecracker, &config.firecracker.socket_glob),
            (
                SocketKind::CloudHypervisor,
                &config.cloud_hypervisor.socket_glob,
            ),
        ];
        Fleet {
            connector,
            globs: globs
                .into_iter()
                .flat_map(|(kind, patterns)| patterns.iter().map(move |p| (kind, p.clone())))
                .collect(),
            libvirt_uris: config.libvirt.uris.clone(),
            launchers: config.libvirt.kubevirt.then(|| Launchers {
                proc: config.host.proc.clone(),
                scanned: None,
                scanning: JoinSet::new(),
                late: false,
                found: Vec::new(),
                refused: HashMap::new(),
                waiting: HashMap::new(),
            }),
            pods: None,
            agent_extension: config.discovery.agent_extension.clone(),
            refused: HashSet::new(),
            defaults: config.defaults.clone(),
            call_timeout: config.call_timeout(),
            interval: Duration::try_from_secs_f64(config.interval_s).unwrap_or_default(),
            candidates,
            managed: BTreeMap::new(),
            placed_only: config
                .vms
                .iter()
                .filter(|vm| Endpoint::of(vm).is_none())
                .map(|vm| vm.name.clone())
                .collect(),
            connecting: JoinSet::new(),
            in_flight: HashSet::new(),
            listing: JoinSet::new(),
            listing_in_flight: HashSet::new(),
            listing_failures: HashMap::new(),
            proc: config.host.proc.clone(),
        }
    }

    /// Take in finished connection attempts and libvirt listings, discover new sockets,
    /// forget vanished VMs, and start attempts for candidates whose backoff has passed.
    /// Never waits on a VM or a libvirt daemon.
    pub fn refresh(&mut self) -> Vec<FleetEvent> {
        let now = Instant::now();
        let mut events = Vec::new();
        while let Some(done) = self.connecting.try_join_next() {
            let Ok((endpoint, result)) = done else {
                continue;
            }; // a panicked attempt is retried
            self.in_flight.remove(&endpoint);
            let Some(mut c) = self.candidates.remove(&endpoint) else {
                continue;
            };
            match result {
                Ok(mut connection) => {
                    events.push(FleetEvent::Connected {
                        vm: c.name.clone(),
                        endpoint: endpoint.to_string(),
                        resumed: connection.backend.resumed_at_connection(),
                    });
                    let launcher = matches!(&endpoint, Endpoint::Libvirt { uri, .. }
                        if self.launchers.as_ref().is_some_and(|l| l.has(uri)));
                    if let Some(pods) = self.pods.as_ref().filter(|_| launcher) {
                        if pods.get(&c.name).is_none() {
                            pods.ask(); // a pod started since the last list
                        }
                    }
                    let m = Managed {
                        endpoint,
                        agent: c.agent,
                        config: c.config,
                        own: (connection.min, connection.max, connection.shares),
                        described: connection.described,
                        bounds_from: None,
                        launcher,
                        discovered: c.discovered,
                        task: VmTask::new(&c.name, connection.backend, self.call_timeout),
                        configured: None,
                        ram: None,
                        actuation: c.actuation,
                        late_samples: c.late_samples,
                        sampled: None,
                        stale: false,
                        reconnect: c.backoff,
                        connected: now,
                        save: None,
                        pid: connection.pid,
                        started: connection.pid.and_then(|pid| {
                            procfs::start_time(&self.proc, i32::try_from(pid).ok()?)
                        }),
                    };
                    self.managed.insert(c.name, m);
                }
                Err(e) => {
                    c.error = Some(e.to_string());
                    c.left_alone = matches!(e, BackendError::LeftAlone(_));
                    c.backoff.failed(now);
                    self.candidates.insert(endpoint, c);
                }
            }
        }
        self.take_listings();
        self.discover();
        self.find_launchers(now);
        for (endpoint, c) in &self.candidates {
            if c.backoff.ready(now) && self.in_flight.insert(endpoint.clone()) {
                let (connector, endpoint, limit) =
                    (self.connector.clone(), endpoint.clone(), self.call_timeout);
                let (name, agent) = (c.name.clone(), c.agent.clone());
                self.connecting.spawn(async move {
                    // connect() makes several calls; bound the whole of it.
                    let connected = connector.connect(&name, &endpoint, agent.as_deref());
                    let result = timeout(limit * 4, connected)
                        .await
                        .unwrap_or_else(|_| Err(BackendError::timeout(limit * 4)));
                    (endpoint, result)
                });
            }
        }
        let launched = self
            .launchers
            .iter()
            .flat_map(|l| l.found.iter().map(|l| &l.uri));
        for uri in self.libvirt_uris.iter().chain(launched) {
            if self.listing_in_flight.insert(uri.clone()) {
                let (connector, uri, limit) =
                    (self.connector.clone(), uri.clone(), self.call_timeout);
                self.listing.spawn(async move {
                    let names = timeout(limit, connector.running_domains(&uri))
                        .await
                        .unwrap_or_else(|_| Err(BackendError::timeout(limit)));
                    (uri, names)
                });
            }
        }
        events
    }

    /// Take KubeVirt VMs' bounds from their launcher pods' memory: a pod's request as the
    /// VM's minimum and its limit as its maximum, where the last list holds the pod and
    /// the pod sets them; the domain's own bounds otherwise. A `[[vm]]` entry's bounds
    /// still win, and neither exceeds the VM's configured size
    /// ([`Bounds::limits`]).
    pub fn take_pod_bounds(&mut self, pods: Arc<PodBounds>) {
        self.pods = Some(pods);
    }

    /// Take the VMs' bounds of `config`, reloaded: each configured VM's `[[vm]]` entry
    /// (its bounds the only fields a reload changes in it) and the defaults, from the
    /// next sample on.
    pub fn reload_bounds(&mut self, config: &Config) {
        self.defaults.clone_from(&config.defaults);
        let entry = |name: &str| config.vms.iter().find(|vm| vm.name == name).cloned();
        let entries = self
            .candidates
            .values_mut()
            .map(|c| (c.name.as_str(), &mut c.config))
            .chain(
                self.managed
                    .iter_mut()
                    .map(|(n, m)| (n.as_str(), &mut m.config)),
            );
        for (name, config) in entries.filter(|(_, c)| c.is_some()) {
            *config = entry(name);
        }
    }

    /// Managed VM `name`'s bounds now: its configuration's, then its pod's, then its
    /// hypervisor's, then the defaults.
    fn bounds(&self, name: &str) -> Bounds {
        let m = &self.managed[name];
        let (mut min, mut max, shares) = m.own;
        if let Some(((now_min, now_max), from)) = m.task.bounds().zip(m.described) {
            let described = |b: Option<Bytes>| b.map(|b| (b, from));
            (min, max) = (described(now_min), described(now_max));
        }
        if let Some(pod) = self
            .pods
            .as_ref()
            .filter(|_| m.launcher)
            .and_then(|p| p.get(name))
        {
            let (pod_min, pod_max) = pod.bounds();
            let pod = |b: Option<Bytes>| b.map(|b| (b, BoundFrom::Pod));
            min = pod(pod_min).or(min);
            max = pod(pod_max).or(max);
        }
        Bounds::new(m.config.as_ref(), &self.defaults).under(min, max, shares, m.config.as_ref())
    }

    /// True when `name` is taken by a managed VM, another candidate, or a VM configured
    /// by `pid`.
    fn taken(&self, name: &str) -> bool {
        self.managed.contains_key(name)
            || self.placed_only.contains(name)
            || self.candidates.values().any(|c| c.name == name)
    }

    /// Whether VM `name` is reached through `socket`, by whatever path (the same file).
    fn reaches(&self, name: &str, socket: &Path) -> bool {
        use std::os::unix::fs::MetadataExt;
        let file = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
        let endpoint = self.managed.get(name).map(|m| &m.endpoint).or_else(|| {
            let mut named = self.candidates.iter().filter(|(_, c)| c.name == name);
            named.next().map(|(endpoint, _)| endpoint)
        });
        let own = endpoint.and_then(Endpoint::socket);
        own.is_some_and(|own| file(own).is_some_and(|f| file(socket) == Some(f)))
    }

    fn discovered(name: &str, agent: Option<PathBuf>) -> Candidate {
        Candidate {
            name: name.to_string(),
            agent,
            config: None,
            discovered: true,
            backoff: Backoff::default(),
            error: None,
            left_alone: false,
            actuation: Actuation::default(),
            late_samples: 0,
        }
    }

    /// Look for KubeVirt launcher daemons every [`LAUNCHER_SCAN`], off the runtime and one
    /// look at a time (a pod's hung mount below its root holds a look, not the tick), and
    /// take in the look that has ended.
    fn find_launchers(&mut self, now: Instant) {
        let Some(launchers) = &mut self.launchers else {
            return;
        };
        let found = launchers.scanning.try_join_next().and_then(Result::ok);
        let since = launchers.scanned.map(|at| now.duration_since(at));
        if launchers.scanning.is_empty() {
            if since.is_none_or(|s| s >= LAUNCHER_SCAN) {
                launchers.scanned = Some(now);
                launchers.late = false;
                let proc = launchers.proc.clone();
                launchers
                    .scanning
                    .spawn_blocking(move || memtide_adapters::kubevirt::launchers(&proc));
            }
        } else if since.is_some_and(|s| s >= LAUNCHER_SCAN_LATE) && !launchers.late {
            launchers.late = true;
            tracing::warn!(
                "the look for KubeVirt launchers in {} started {} s ago has not ended (a \
                 file below a process's root may hang): no launcher is found or forgotten \
                 until it does",
                launchers.proc.display(),
                since.unwrap_or_default().as_secs()
            );
        }
        if let Some(found) = found {
            self.found_launchers(found);
        }
    }

    /// Take in the launchers a look found: a new one is listed like a configured URI (and
    /// its pod asked for, where pods are listed and it is not known); the candidates of
    /// one that is gone are forgotten, and so is its connection (the pod ended; its
    /// managed VM is lost when its calls fail).
    fn found_launchers(&mut self, found: Vec<Launcher>) {
        let Some(launchers) = &mut self.launchers else {
            return;
        };
        let old = std::mem::replace(&mut launchers.found, found);
        let gone: Vec<String> = old
            .into_iter()
            .filter(|l| !launchers.has(&l.uri))
            .map(|l| l.uri)
            .collect();
        launchers.refused.retain(|uri, _| !gone.contains(uri));
        launchers.waiting.retain(|uri, _| !gone.contains(uri));
        if let Some(pods) = &self.pods {
            let unknown = |l: &Launcher| l.pod.as_ref().is_some_and(|p| pods.vm_of(p).is_none());
            if launchers.found.iter().any(unknown) {
                pods.ask();
            }
        }
        self.candidates.retain(
            |endpoint, _| !matches!(endpoint, Endpoint::Libvirt { uri, .. } if gone.contains(uri)),
        );
        for uri in &gone {
            self.connector.forget(uri);
            self.listing_failures.remove(uri);
        }
    }

    /// Say once that launcher `uri`'s `domain` waits for its pod in the pod list (a pod
    /// started since the last list, or a list that never came: the API server refusing
    /// or down, the node's name wrong).
    fn wait_for_pod(&mut self, uri: &str, domain: &str) {
        let Some(launchers) = self.launchers.as_mut() else {
            return;
        };
        if launchers
            .waiting
            .entry(uri.to_string())
            .or_default()
            .insert(domain.to_string())
        {
            tracing::info!(
                "KubeVirt launcher {uri}: domain {domain} is managed once the list of the \
                 node's launcher pods holds its pod (asked for; see the pod bounds' messages \
                 if it never comes)"
            );
        }
    }

    /// The name of the VM that launcher `uri`'s daemon runs as `domain`. Where the launcher
    /// pods are listed, it is the VM of the pod the daemon runs in, known by the pod's UID
    /// from the daemon's cgroup: a domain named otherwise is refused (`Err`, why), and
    /// `Ok(None)` means the pod is not listed yet. Otherwise it is the domain's name as
    /// KubeVirt writes it ([`memtide_adapters::kubevirt::vm_name`]), which is the pod's own
    /// claim.
    fn launcher_vm(&self, uri: &str, domain: &str) -> Result<Option<String>, String> {
        let claimed = memtide_adapters::kubevirt::vm_name(domain);
        let Some(pods) = &self.pods else {
            return Ok(Some(claimed));
        };
        let launcher = self.launchers.as_ref().and_then(|l| l.get(uri));
        let Some(pod) = launcher.and_then(|l| l.pod.as_deref()) else {
            return Err("its daemon's cgroup names no Kubernetes pod".into());
        };
        match pods.vm_of(pod) {
            None => Ok(None),
            Some(vm) if vm == claimed => Ok(Some(vm)),
            Some(vm) => Err(format!("its daemon runs in pod {pod}, whose VM is {vm}")),
        }
    }

    /// Take in finished libvirt listings: domains that appeared become candidates,
    /// discovered domains that are no longer running are forgotten. A listing of a
    /// KubeVirt launcher's daemon that the scan has found gone since it started is
    /// dropped: its domains have nothing to be reached through.
    fn take_listings(&mut self) {
        while let Some(done) = self.listing.try_join_next() {
            let Ok((uri, names)) = done else { continue };
            self.listing_in_flight.remove(&uri);
            let launcher = self.launchers.as_ref().is_some_and(|l| l.has(&uri));
            if !launcher && !self.libvirt_uris.contains(&uri) {
                continue;
            }
            let names = match names {
                Ok(names) => {
                    let failed = self.listing_failures.remove(&uri);
                    if let Some(n) = failed.and_then(|mut f| f.succeeded()) {
                        tracing::info!(
                            "listing the domains of {uri} works again after {n} failures"
                        );
                    }
                    names
                }
                Err(e) => {
                    let failures = self.listing_failures.entry(uri.clone()).or_default();
                    if let Some(n) = failures.failed(Instant::now()) {
                        tracing::warn!(
                            "listing the domains of {uri}: {e} ({n} failed listings; tried \
                             again every tick, logged again in {} s while it fails)",
                            LOG_EVERY.as_secs()
                        );
                    }
                    continue;
                }
            };
            let mut refused = BTreeMap::new();
            for domain in &names {
                let endpoint = Endpoint::Libvirt {
                    uri: uri.clone(),
                    domain: domain.clone(),
                };
                // A launcher's domain is named as KubeVirt names its VM: namespace/name.
                let name = match launcher {
                    true => match self.launcher_vm(&uri, domain) {
                        Ok(Some(name)) => name,
                        Ok(None) => {
                            self.wait_for_pod(&uri, domain);
                            continue;
                        }
                        Err(why) => {
                            refused.insert(domain.clone(), why);
                            continue;
                        }
                    },
                    false => domain.clone(),
                };
                let known = self.candidates.contains_key(&endpoint)
                    || self.managed.values().any(|m| m.endpoint == endpoint);
                if !known && !self.taken(&name) {
                    self.candidates
                        .insert(endpoint, Fleet::discovered(&name, None));
                }
            }
            self.candidates.retain(|endpoint, c| match endpoint {
                Endpoint::Libvirt { uri: u, domain } if c.discovered && *u == uri => {
                    names.contains(domain) && !refused.contains_key(domain)
                }
                _ => true,
            });
            if let Some(launchers) = self.launchers.as_mut().filter(|_| launcher) {
                let said = launchers.refused.remove(&uri).unwrap_or_default();
                for (domain, why) in &refused {
                    if said.get(domain) != Some(why) {
                        tracing::warn!(
                            "KubeVirt launcher {uri}: domain {domain} not managed: {why} \
                             (logged again only if this changes)"
                        );
                    }
                }
                if !refused.is_empty() {
                    launchers.refused.insert(uri, refused);
                }
            }
        }
    }

    /// Add sockets matching the globs; forget discovered candidates whose socket is gone.
    /// A symbolic link is refused: whoever may write to a discovery directory could
    /// otherwise have memtide, as root, manage a socket they cannot open themselves (a VM
    /// under another name, counted twice, below its own bounds), or read a guest agent
    /// of their making beside a real VM's.
    fn discover(&mut self) {
        let mut seen = HashSet::new();
        let mut refused = HashSet::new();
        // Said once while the socket is there.
        let mut refuse = |socket: PathBuf, why: &str| {
            if !self.refused.contains(&socket) {
                tracing::warn!("{}: {why}", socket.display());
            }
            refused.insert(socket);
        };
        for (kind, pattern) in &self.globs {
            for socket in glob::glob(pattern).into_iter().flatten().flatten() {
                if is_link(&socket) {
                    refuse(
                        socket,
                        "a symbolic link, not managed (discovery takes sockets only)",
                    );
                    continue;
                }
                let endpoint = match kind {
                    SocketKind::Qmp => Endpoint::Qmp(socket.clone()),
                    SocketKind::Firecracker => Endpoint::Firecracker(socket.clone()),
                    SocketKind::CloudHypervisor => Endpoint::CloudHypervisor(socket.clone()),
                };
                seen.insert(endpoint.clone());
                let known = self.candidates.contains_key(&endpoint)
                    || self.managed.values().any(|m| m.endpoint == endpoint);
                let Some(name) = socket.file_stem().and_then(|s| s.to_str()) else {
                    continue;
                };
                if known {
                    continue;
                }
                if self.taken(name) {
                    // Found silently skipped by an audit: a [[vm]] entry of that name
                    // whose own socket was not there kept this one unmanaged, unsaid.
                    // The VM's own socket under another path (/var/run for /run) is it.
                    if !self.reaches(name, &socket) {
                        let why = format!(
                            "not managed: VM {name:?} is another's (a [[vm]] entry, or a \
                             socket found first); rename the socket, or name it in that entry"
                        );
                        refuse(socket, &why);
                    }
                    continue;
                }
                let agent = matches!(kind, SocketKind::Qmp)
                    .then(|| socket.with_extension(&self.agent_extension))
                    .filter(|a| !self.agent_extension.is_empty() && a.exists() && !is_link(a));
                let c = Fleet::discovered(name, agent);
                self.candidates.insert(endpoint, c);
            }
        }
        self.refused = refused;
        self.candidates.retain(|endpoint, c| {
            !c.discovered || endpoint.socket().is_none() || seen.contains(endpoint)
        });
    }

    /// Ask every managed VM for a sample, each through its own task, and wait for them
    /// until `deadline`. A VM whose call (this sample, or an earlier call still in flight)
    /// has not answered by then is late: it goes into this decision with an error sample
    /// (so the policy decides nothing for it and divides none of its memory), is counted
    /// and marked stale, and keeps its call; nothing else waits for it. A call from an
    /// earlier tick is waited for first ([`VmTask::sample_by`]): a balloon command's
    /// result is returned for reporting, a save queued behind the call started before
    /// the sample, and a sample the previous tick asked for (since an interval and a half
    /// ago: a tick that ran late, not one before it) is this one's. VMs whose connection
    /// is gone are dropped (and reported); the rest are returned in name order.
    pub async fn sample(&mut self, deadline: Instant) -> Sampled {
        let start = Instant::now();
        let fresh = start
            .checked_sub(self.interval.mul_f64(1.5))
            .unwrap_or(start);
        let mut out = Sampled::default();
        let collected = join_all(self.managed.iter_mut().map(|(name, m)| async move {
            (
                name.clone(),
                m.task.sample_by(fresh, deadline, &mut m.save).await,
            )
        }))
        .await;
        for (name, collected) in collected {
            if let Some((target, result)) = collected.balloon {
                self.balloon_answered(&name, target, result, &mut out);
            }
            let sample = match collected.sample {
                Some(Err(BackendError::Disconnected(why))) => {
                    self.lose_reported(&name, why, false, &mut out);
                    continue;
                }
                Some(Err(BackendError::ShutDown(why))) => {
                    self.lose_reported(&name, format!("{why}, after it shut down"), true, &mut out);
                    continue;
                }
                sample => sample.map(|s| s.map(|s| *s)),
            };
            let bounds = self.bounds(&name);
            let m = self
                .managed
                .get_mut(&name)
                .expect("sampled VMs are managed");
            // Not sampled while it is saved, as it should be: busy, not late (found by an
            // audit: every scheduled snapshot read as the VM out of reach, and fed alerts).
            let saving = sample.is_none() && m.task.saving();
            m.stale = sample.is_none() && !saving;
            let sample = match sample {
                None if saving => Err(BackendError::Busy("being saved".into())),
                Some(sample) => {
                    if let Ok(s) = &sample {
                        // Figures: an answer that the guest is paused is none (found by an
                        // audit: a paused VM's sample age stayed at a fraction of a second).
                        m.sampled = m.task.answered();
                        m.configured = Some(s.configured);
                        m.ram = Some(Mappings::of(s));
                    }
                    if let Some(e) = m.follow_process(&name, &self.proc) {
                        out.events.push(e);
                    }
                    sample
                }
                None => {
                    m.late_samples += 1;
                    let waited = m.task.in_flight().map_or(deadline - start, |(_, age)| age);
                    Err(BackendError::timeout(waited))
                }
            };
            let (limits, from) = bounds.limits(m.configured.unwrap_or(Bytes::ZERO));
            m.bounds_from = m.configured.is_some().then_some(from);
            out.vms.push(VmSnapshot {
                limits,
                target: m.task.target(),
                name,
                sample,
            });
        }
        out
    }

    /// Take in the answer to a balloon command sent at an earlier tick.
    fn balloon_answered(
        &mut self,
        name: &str,
        target: Bytes,
        result: Result<(), BackendError>,
        out: &mut Sampled,
    ) {
        if let Some(m) = self.managed.get_mut(name) {
            m.actuation.took(&result);
        }
        out.balloons.push(Answered {
            vm: name.to_string(),
            target,
            result,
        });
    }

    /// [`Fleet::lose`], with its event.
    fn lose_reported(&mut self, name: &str, why: String, shut_down: bool, out: &mut Sampled) {
        let (pid, started) = self
            .managed
            .get(name)
            .map_or((None, None), |m| (m.pid, m.started));
        self.lose(name, why.clone());
        out.events.push(FleetEvent::Lost {
            vm: name.to_string(),
            why,
            shut_down,
            pid,
            started,
        });
    }

    /// Move a managed VM back to the candidates, to be reconnected with backoff (config
    /// VMs) or rediscovered while its socket exists or libvirt lists it (discovered VMs).
    /// A call it has in flight is abandoned. A KubeVirt launcher's VM whose daemon the
    /// last scan no longer found (its pod ended before its connection failed) is
    /// forgotten: that daemon is not listed again, so nothing would forget its candidate.
    fn lose(&mut self, name: &str, why: String) {
        let Some(m) = self.managed.remove(name) else {
            return;
        };
        if m.launcher
            && matches!(&m.endpoint, Endpoint::Libvirt { uri, .. }
                if !self.launchers.as_ref().is_some_and(|l| l.has(uri)))
        {
            return;
        }
        let now = Instant::now();
        let mut backoff = match now.duration_since(m.connected) < STABLE {
            true => m.reconnect,
            false => Backoff::default(),
        };
        backoff.failed(now);
        let c = Candidate {
            name: name.to_string(),
            agent: m.agent,
            config: m.config,
            discovered: m.discovered,
            backoff,
            error: Some(why),
            left_alone: false,
            actuation: m.actuation,
            late_samples: m.late_samples,
        };
        self.candidates.insert(m.endpoint, c);
    }

    /// Send balloon targets, each through its VM's task, and wait for the answers until
    /// `deadline`; one not in by then stays in flight and is reported by a later
    /// [`Fleet::sample`]. Nothing is sent to a VM with a call in flight, nor to one whose
    /// last balloon command failed until its backoff ends.
    pub async fn set_balloons(
        &mut self,
        targets: &[(String, Bytes)],
        deadline: Instant,
    ) -> Vec<Sent> {
        let now = Instant::now();
        let mut sent: Vec<Option<Sent>> = targets
            .iter()
            .map(|(name, target)| {
                let Some(m) = self.managed.get_mut(name) else {
                    return Some(Sent::Answered(Err(BackendError::Disconnected(
                        "the VM is no longer connected".into(),
                    ))));
                };
                let a = &m.actuation;
                if !a.may_send(*target, now) {
                    return Some(Sent::Answered(Err(BackendError::Protocol(format!(
                        "not sent: the last balloon command failed ({}); next attempt in {} s",
                        a.error.as_deref().unwrap_or("unknown"),
                        a.backoff.remaining(now).as_secs().max(1)
                    )))));
                }
                if !m.task.start(Call::Balloon(*target)) {
                    return Some(Sent::Answered(Err(BackendError::Busy(
                        "not sent: its previous call is still in flight".into(),
                    ))));
                }
                m.actuation.sent = Some(*target);
                None
            })
            .collect();
        let waiting: HashSet<&str> = targets
            .iter()
            .zip(&sent)
            .filter(|(_, s)| s.is_none())
            .map(|((name, _), _)| name.as_str())
            .collect();
        let answers: BTreeMap<String, Sent> = join_all(
            self.managed
                .iter_mut()
                .filter(|(name, _)| waiting.contains(name.as_str()))
                .map(|(name, m)| async move {
                    let sent = match m.task.answer_by(deadline).await {
                        Some(Answer::Balloon(_, result)) => {
                            m.actuation.took(&result);
                            Sent::Answered(result)
                        }
                        Some(Answer::Sample(_) | Answer::Saved) => {
                            unreachable!("a balloon command was started")
                        }
                        None => Sent::InFlight,
                    };
                    (name.clone(), sent)
                }),
        )
        .await
        .into_iter()
        .collect();
        for ((name, _), s) in targets.iter().zip(&mut sent) {
            if s.is_none() {
                *s = answers.get(name).cloned();
            }
        }
        sent.into_iter()
            .map(|s| s.expect("every target sent or refused"))
            .collect()
    }

    /// Save VM `vm`'s memory as `save` says: started at once if `at_once` and no call to
    /// the VM is in flight, else by the first sample after the VM's call has answered; the
    /// VM is left out of the decisions while it is saved (its samples wait). Refused for a
    /// VM not connected, or with a save already asked for or running.
    pub fn save(
        &mut self,
        vm: &str,
        save: SaveJob,
        at_once: bool,
    ) -> Result<(), (SaveJob, String)> {
        let Some(m) = self.managed.get_mut(vm) else {
            return Err((save, format!("VM {vm} is not connected")));
        };
        // A save that ended (the daemon told) but whose backend no sample took back yet
        // does not hold the next one up: it waits, queued, for the next sample.
        if m.save.is_some() || m.task.saving() {
            return Err((save, format!("VM {vm} is being saved already")));
        }
        if !at_once {
            m.save = Some(save);
            return Ok(());
        }
        match m.task.start_save(save) {
            Ok(()) => Ok(()),
            // Neither lent nor idle: its task ended with its connection.
            Err(save) if m.task.in_flight().is_none() => {
                Err((save, format!("VM {vm} is not connected")))
            }
            Err(save) => {
                m.save = Some(save);
                Ok(())
            }
        }
    }

    /// Give up the saves still waiting for a sample (memtide stops): each is answered
    /// that it was not begun.
    pub fn give_up_queued_saves(&mut self) {
        for save in self.managed.values_mut().filter_map(|m| m.save.take()) {
            let why = "memtide stopped before the save began";
            let _ = save.reply.send(Err(BackendError::Protocol(why.into())));
        }
    }

    /// VM `vm`'s configured size, once a sample told it.
    pub fn configured(&self, vm: &str) -> Option<Bytes> {
        self.managed.get(vm)?.configured
    }

    /// VM `vm`'s guest RAM mappings, as its latest sample that told them did.
    pub fn ram(&self, vm: &str) -> Option<Mappings> {
        self.managed.get(vm)?.ram.clone()
    }

    /// Connect to VM `vm` at the next refresh, its reconnection backoff forgotten: the
    /// daemon has just started it (a wake, a crash recovery), so its socket answers now
    /// (its backoff, grown while it was hibernated or gone, left it unmanaged up to a
    /// minute after its restore).
    pub fn reconnect_now(&mut self, vm: &str) {
        for c in self.candidates.values_mut().filter(|c| c.name == vm) {
            c.backoff = Backoff::default();
        }
    }

    /// VM `vm`'s hypervisor process, when known, and its `[[vm]]` entry, if any.
    pub fn process(&self, vm: &str) -> Option<(Option<u32>, Option<&VmConfig>)> {
        let m = self.managed.get(vm)?;
        Some((m.pid, m.config.as_ref()))
    }

    /// VM `vm`'s hypervisor process and its start time when it became known (at
    /// connection, or found later: [`Managed::follow_process`]), when both are known.
    pub fn hypervisor(&self, vm: &str) -> Option<(u32, u64)> {
        let m = self.managed.get(vm)?;
        Some((m.pid?, m.started?))
    }

    /// How each managed VM's samples are arriving.
    pub fn sampling(&self) -> Vec<Sampling> {
        self.managed
            .iter()
            .map(|(name, m)| Sampling {
                name: name.clone(),
                connector: m.endpoint.connector().into(),
                stale: m.stale,
                age_s: m.sampled.map(|t| t.elapsed().as_secs_f64()),
                late_samples: m.late_samples,
                bounds_from: m.bounds_from,
            })
            .collect()
    }

    /// VMs known but not connected.
    pub fn waiting(&self) -> Vec<Waiting> {
        let now = Instant::now();
        self.candidates
            .iter()
            .map(|(endpoint, c)| Waiting {
                name: c.name.clone(),
                endpoint: endpoint.to_string(),
                error: c.error.clone(),
                left_alone: c.left_alone,
                retry_in_s: c.backoff.remaining(now).as_secs_f64(),
            })
            .collect()
    }
}

/// Whether `path` is a symbolic link (not followed).
fn is_link(path: &std::path::Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;
    use memtide_core::backend::{AfterSave, Saved, Seal, VmBackend};
    use memtide_core::{VmEvent, VmSample};
    use std::collections::HashMap;
    use std::path::Path;
    use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
    use std::sync::Mutex;

    /// How a fake VM behaves.
    #[derive(Clone, Copy, PartialEq)]
    enum Behaviour {
        Healthy,
        Refuses,
        Hangs,
        /// Samples fine, never answers a balloon command.
        IgnoresBalloon,
        /// Samples fine, each sample taking [`SLOW_SAMPLE`].
        SlowSample,
        /// Answers each sample that it is busy (a paused guest).
        Paused,
        Dies,
    }

    /// Connects to fake VMs whose behaviour the test changes by socket path.
    #[derive(Default)]
    struct FakeConnector {
        behaviour: Mutex<HashMap<PathBuf, Behaviour>>,
        attempts: Mutex<Vec<PathBuf>>,
        /// Running domains by libvirt URI (a URI not listed: libvirtd is down).
        domains: Mutex<HashMap<String, Vec<String>>>,
        /// Balloon commands sent, by socket.
        balloons_sent: Mutex<HashMap<PathBuf, Arc<AtomicU32>>>,
        /// libvirt URIs forgotten.
        forgotten: Mutex<Vec<String>>,
        /// The hypervisor's process each connection gives.
        pid: Option<u32>,
        /// The hypervisor's process its VMs' connectors find after connecting (0: none).
        found: Arc<AtomicI32>,
    }

    /// A fake VM: how it behaves, the balloon commands sent to it, the process its
    /// connector finds (0: none).
    struct FakeVm(Behaviour, Arc<AtomicU32>, Arc<AtomicI32>);

    #[async_trait]
    impl VmBackend for FakeVm {
        async fn sample(&mut self) -> Result<VmSample, BackendError> {
            match self.0 {
                Behaviour::Hangs => std::future::pending().await,
                Behaviour::Dies => return Err(BackendError::Disconnected("end of stream".into())),
                Behaviour::SlowSample => tokio::time::sleep(SLOW_SAMPLE).await,
                Behaviour::Paused => return Err(BackendError::Busy("paused".into())),
                _ => {}
            }
            Ok(VmSample {
                ram_mappings: Vec::new(),
                configured: Bytes::from_mib(512),
                balloon: Some(Bytes::from_mib(512)),
                stats: Default::default(),
                agent: None,
                rss: None,
                swapped: None,
                cpu_s: None,
                referenced: None,
                cold: None,
                virtio_mem: None,
                free_page_reporting: false,
                fixed: None,
                events: Vec::new(),
            })
        }
        async fn set_balloon(&mut self, _: Bytes) -> Result<(), BackendError> {
            self.1.fetch_add(1, Ordering::SeqCst);
            if self.0 == Behaviour::IgnoresBalloon {
                std::future::pending::<()>().await;
            }
            Ok(())
        }
        fn target(&self) -> Option<Bytes> {
            None
        }
        fn pid(&self) -> Option<i32> {
            Some(self.2.load(Ordering::SeqCst)).filter(|pid| *pid != 0)
        }
        /// Takes [`SAVE_TAKES`], writes nothing.
        async fn save(
            &mut self,
            _: &Path,
            _: AfterSave,
            _: Duration,
            _: Seal,
        ) -> Result<Saved, BackendError> {
            tokio::time::sleep(SAVE_TAKES).await;
            Ok(Saved::default())
        }
    }

    /// How long a slow fake VM's sample takes: more than a tick waits, less than its
    /// interval.
    const SLOW_SAMPLE: Duration = Duration::from_millis(1400);

    /// How long a fake VM's save takes.
    const SAVE_TAKES: Duration = Duration::from_secs(1);

    /// The key of an endpoint in the fake's tables: its socket, or URI/domain.
    fn key(endpoint: &Endpoint) -> PathBuf {
        match endpoint {
            Endpoint::Libvirt { uri, domain } => PathBuf::from(format!("{uri}/{domain}")),
            e => e.socket().unwrap().to_path_buf(),
        }
    }

    impl FakeConnector {
        /// The count of balloon commands sent to the VM at `socket`.
        fn sent_to(&self, socket: &Path) -> Arc<AtomicU32> {
            let mut sent = self.balloons_sent.lock().unwrap();
            sent.entry(socket.to_path_buf()).or_default().clone()
        }
    }

    #[async_trait]
    impl Connector for FakeConnector {
        async fn connect(
            &self,
            _vm: &str,
            endpoint: &Endpoint,
            _agent: Option<&Path>,
        ) -> Result<Connection, BackendError> {
            let socket = key(endpoint);
            self.attempts.lock().unwrap().push(socket.clone());
            match self
                .behaviour
                .lock()
                .unwrap()
                .get(&socket)
                .copied()
                .unwrap_or(Behaviour::Healthy)
            {
                Behaviour::Refuses => Err(BackendError::Disconnected("connection refused".into())),
                b => Ok(Connection {
                    backend: Box::new(FakeVm(b, self.sent_to(&socket), self.found.clone())),
                    min: Some((Bytes::from_mib(200), BoundFrom::Libvirt)),
                    max: None,
                    shares: None,
                    pid: self.pid,
                    described: None,
                }),
            }
        }

        fn forget(&self, uri: &str) {
            self.forgotten.lock().unwrap().push(uri.into());
        }

        async fn running_domains(&self, uri: &str) -> Result<Vec<String>, BackendError> {
            match self.domains.lock().unwrap().get(uri) {
                Some(names) => Ok(names.clone()),
                None => Err(BackendError::Disconnected("libvirtd is down".into())),
            }
        }
    }

    fn names(vms: &[VmSnapshot]) -> Vec<&str> {
        vms.iter().map(|v| v.name.as_str()).collect()
    }

    /// One tick's sampling, waiting up to a second.
    async fn sample(fleet: &mut Fleet) -> (Vec<VmSnapshot>, Vec<FleetEvent>) {
        let sampled = fleet.sample(Instant::now() + Duration::from_secs(1)).await;
        (sampled.vms, sampled.events)
    }

    /// Balloon targets set, waiting up to a second.
    async fn set_balloons(fleet: &mut Fleet, targets: &[(String, Bytes)]) -> Vec<Sent> {
        fleet
            .set_balloons(targets, Instant::now() + Duration::from_secs(1))
            .await
    }

    /// Make the connected VM `name` behave as `behaviour` from now on.
    fn turn(fleet: &mut Fleet, name: &str, behaviour: Behaviour) {
        let backend = Box::new(FakeVm(behaviour, Arc::default(), Arc::default()));
        fleet.managed.get_mut(name).unwrap().task = VmTask::new(name, backend, fleet.call_timeout);
    }

    /// Let background connection attempts finish.
    async fn settle(fleet: &mut Fleet) -> Vec<FleetEvent> {
        fleet.refresh();
        tokio::time::sleep(Duration::from_millis(10)).await;
        fleet.refresh()
    }

    fn fleet(dir: &Path, connector: Arc<FakeConnector>) -> Fleet {
        fleet_timing_out(dir, connector, 100)
    }

    /// A fleet whose calls time out after `call_timeout_ms`.
    fn fleet_timing_out(dir: &Path, connector: Arc<FakeConnector>, call_timeout_ms: u64) -> Fleet {
        let mut config = Config::default();
        config.discovery.qmp_glob = vec![dir.join("*.sock").display().to_string()];
        config.daemon.call_timeout_ms = call_timeout_ms;
        Fleet::new(&config, connector)
    }

    /// What `tracing` logs on this thread until the guard is dropped, as text.
    fn captured_logs() -> (Arc<Mutex<Vec<u8>>>, tracing::subscriber::DefaultGuard) {
        #[derive(Clone)]
        struct Sink(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Sink {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let logs = Arc::new(Mutex::new(Vec::new()));
        let sink = Sink(logs.clone());
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || sink.clone())
            .with_ansi(false)
            .finish();
        (logs, tracing::subscriber::set_default(subscriber))
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_listing_is_logged_at_first_then_every_five_minutes_not_every_tick() {
        let (logs, _guard) = captured_logs();
        let count = |what: &str| {
            let text = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
            text.lines().filter(|l| l.contains(what)).count()
        };
        let uri = "qemu+unix:///session?socket=/launcher";
        let connector = Arc::new(FakeConnector::default()); // it lists nothing: down
        let mut config = Config::default();
        config.discovery.qmp_glob = Vec::new();
        config.libvirt.uris = vec![uri.into()];
        let mut fleet = Fleet::new(&config, connector.clone());
        let failed = format!("listing the domains of {uri}: disconnected: libvirtd is down (");
        for _ in 0..20 {
            settle(&mut fleet).await;
        }
        assert_eq!(count(&failed), 1, "logged once, not at each of 40 listings");
        tokio::time::advance(LOG_EVERY).await;
        settle(&mut fleet).await;
        assert_eq!(count(&failed), 2, "and again five minutes later");
        connector
            .domains
            .lock()
            .unwrap()
            .insert(uri.into(), vec!["web".into()]);
        for _ in 0..3 {
            settle(&mut fleet).await;
        }
        assert_eq!(
            count(&format!("listing the domains of {uri} works again after")),
            1
        );
        assert!(fleet.listing_failures.is_empty());
    }

    /// A VM configured by `pid` alone is never connected, but its name is taken: a
    /// socket of that name is not managed (it would be placed as the configured process).
    #[tokio::test(start_paused = true)]
    async fn a_name_configured_by_pid_is_not_given_to_a_discovered_vm() {
        let dir = tempfile::tempdir().unwrap();
        let connector = Arc::new(FakeConnector::default());
        let text = format!(
            "[discovery]\nqmp_glob = [\"{}/*.sock\"]\n[tiering]\nplace = true\n\
             [[vm]]\nname = \"web\"\npid = 4242\n",
            dir.path().display()
        );
        let config = Config::parse(&text, "x").unwrap();
        let mut fleet = Fleet::new(&config, connector.clone());
        std::fs::write(dir.path().join("web.sock"), "").unwrap();
        std::fs::write(dir.path().join("db.sock"), "").unwrap();
        for _ in 0..3 {
            settle(&mut fleet).await;
        }
        let (vms, _) = sample(&mut fleet).await;
        assert_eq!(names(&vms), ["db"]);
        assert!(fleet.process("web").is_none());
    }

    /// A symbolic link in a discovery directory is not managed, nor a guest agent that is
    /// one: anyone who may write there could point them at sockets they cannot open.
    #[tokio::test(start_paused = true)]
    async fn links_in_a_discovery_directory_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let connector = Arc::new(FakeConnector::default());
        let mut fleet = fleet(dir.path(), connector.clone());
        let (logs, _guard) = captured_logs();
        std::fs::write(dir.path().join("web.sock"), "").unwrap();
        std::fs::write(dir.path().join("elsewhere"), "").unwrap();
        let db = dir.path().join("db.sock");
        std::os::unix::fs::symlink(dir.path().join("web.sock"), &db).unwrap();
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), dir.path().join("web.qga"))
            .unwrap();
        for _ in 0..3 {
            settle(&mut fleet).await;
        }
        let (vms, _) = sample(&mut fleet).await;
        assert_eq!(names(&vms), ["web"]);
        let web = &fleet.managed["web"];
        assert_eq!(web.endpoint, Endpoint::Qmp(dir.path().join("web.sock")));
        assert_eq!(web.agent, None, "its agent a link: none");
        let logs = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
        let said = format!("{}: a symbolic link, not managed", db.display());
        assert_eq!(logs.matches(&said).count(), 1, "said once: {logs}");
    }

    /// A socket found under the name of a configured VM reached elsewhere is not managed,
    /// and said so once while it is there.
    #[tokio::test(start_paused = true)]
    async fn a_socket_found_under_a_configured_vms_name_is_said_not_managed() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "[discovery]\nqmp_glob = [\"{}/*.sock\"]\n[[vm]]\nname = \"web\"\nqmp = \"{}/gone/web.qmp\"\n",
            dir.path().display(),
            dir.path().display()
        );
        let config = Config::parse(&text, "x").unwrap();
        // The configured socket is not there.
        let connector = Arc::new(FakeConnector::default());
        let gone = dir.path().join("gone/web.qmp");
        connector
            .behaviour
            .lock()
            .unwrap()
            .insert(gone, Behaviour::Refuses);
        let mut fleet = Fleet::new(&config, connector);
        let (logs, _guard) = captured_logs();
        let found = dir.path().join("web.sock");
        std::fs::write(&found, "").unwrap();
        for _ in 0..3 {
            settle(&mut fleet).await;
        }
        assert!(!fleet.managed.contains_key("web"));
        assert!(!fleet.candidates.contains_key(&Endpoint::Qmp(found.clone())));
        let logs = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
        let said = format!(
            "{}: not managed: VM \"web\" is another's (a [[vm]] entry, or a socket found first)",
            found.display()
        );
        assert_eq!(logs.matches(&said).count(), 1, "said once: {logs}");

        // The entry's own socket, found under another path (a link to its directory, as
        // /var/run is to /run): it is that VM, nothing said.
        let dir = tempfile::tempdir().unwrap();
        let (run, var_run) = (dir.path().join("run"), dir.path().join("var-run"));
        std::fs::create_dir(&run).unwrap();
        std::os::unix::fs::symlink(&run, &var_run).unwrap();
        std::fs::write(run.join("db.sock"), "").unwrap();
        let text = format!(
            "[discovery]\nqmp_glob = [\"{}/*.sock\"]\n[[vm]]\nname = \"db\"\nqmp = \"{}/db.sock\"\n",
            run.display(),
            var_run.display()
        );
        let config = Config::parse(&text, "x").unwrap();
        let mut fleet = Fleet::new(&config, Arc::new(FakeConnector::default()));
        let (logs, _guard) = captured_logs();
        for _ in 0..3 {
            settle(&mut fleet).await;
        }
        assert_eq!(
            fleet.managed["db"].endpoint,
            Endpoint::Qmp(var_run.join("db.sock"))
        );
        let logs = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
        assert!(!logs.contains("not managed"), "{logs}");
    }

    /// Process `pid`'s stat under `dir`/proc, started `started` clock ticks after boot.
    fn qemu_stat(dir: &Path, pid: i32, started: u64) {
        let text =
            format!("{pid} (qemu) S 1 {pid} {pid} 0 -1 0 0 0 0 0 0 0 0 0 20 0 3 0 {started} 0 0\n");
        std::fs::create_dir_all(dir.join(format!("proc/{pid}"))).unwrap();
        std::fs::write(dir.join(format!("proc/{pid}/stat")), text).unwrap();
    }

    /// A fleet managing the VM `web` through a socket in `dir`, its processes read from
    /// `dir`/proc, once connected.
    async fn web_with_proc(dir: &Path, connector: Arc<FakeConnector>) -> Fleet {
        let text = format!(
            "[discovery]\nqmp_glob = [\"{}/*.sock\"]\n[host]\nproc = \"{}/proc\"\n",
            dir.display(),
            dir.display()
        );
        let mut fleet = Fleet::new(&Config::parse(&text, "x").unwrap(), connector);
        std::fs::write(dir.join("web.sock"), "").unwrap();
        settle(&mut fleet).await;
        fleet
    }

    /// What two ticks' sampling say (an answer the first found in flight comes with the
    /// second).
    async fn two_samples_say(fleet: &mut Fleet) -> Vec<FleetEvent> {
        let mut said = sample(fleet).await.1;
        said.extend(sample(fleet).await.1);
        said
    }

    /// A hypervisor is known by its pid and its start time when its VM connected: a
    /// process that took the pid since does not change them.
    #[tokio::test(start_paused = true)]
    async fn a_hypervisor_is_known_by_its_pid_and_its_start_time_at_connection() {
        let dir = tempfile::tempdir().unwrap();
        qemu_stat(dir.path(), 4242, 1000);
        let connector = Arc::new(FakeConnector {
            pid: Some(4242),
            ..FakeConnector::default()
        });
        let mut fleet = web_with_proc(dir.path(), connector.clone()).await;
        assert_eq!(fleet.hypervisor("web"), Some((4242, 1000)));
        qemu_stat(dir.path(), 4242, 2000);
        assert_eq!(fleet.hypervisor("web"), Some((4242, 1000)));
        assert_eq!(fleet.hypervisor("db"), None);
        // Its connector going on naming it (as libvirt's does) changes neither, and says
        // nothing: its start time is not read again.
        connector.found.store(4242, Ordering::SeqCst);
        assert_eq!(two_samples_say(&mut fleet).await, vec![]);
        assert_eq!(fleet.hypervisor("web"), Some((4242, 1000)));
    }

    /// A hypervisor whose start time could not be read at connection is known once it
    /// can be, and said.
    #[tokio::test(start_paused = true)]
    async fn a_hypervisor_whose_start_time_is_read_late_is_known_then() {
        let dir = tempfile::tempdir().unwrap();
        let connector = Arc::new(FakeConnector {
            pid: Some(4242),
            ..FakeConnector::default()
        });
        connector.found.store(4242, Ordering::SeqCst);
        let mut fleet = web_with_proc(dir.path(), connector).await;
        let said = two_samples_say(&mut fleet).await;
        assert_eq!((said, fleet.hypervisor("web")), (vec![], None));
        qemu_stat(dir.path(), 4242, 1000);
        let known = FleetEvent::Process {
            vm: "web".into(),
            pid: 4242,
            was: None,
        };
        assert_eq!(sample(&mut fleet).await.1, vec![known]);
        assert_eq!(fleet.hypervisor("web"), Some((4242, 1000)));
        assert_eq!(sample(&mut fleet).await.1, vec![]);
    }

    /// A hypervisor process its connector finds after connecting (libvirt's QEMU, by a
    /// later scan), or a new one it finds, is the VM's from the next sample, known by its
    /// start time then, and said once.
    #[tokio::test(start_paused = true)]
    async fn a_hypervisor_found_after_connecting_is_the_vms_from_the_next_sample() {
        let dir = tempfile::tempdir().unwrap();
        let connector = Arc::new(FakeConnector::default());
        let mut fleet = web_with_proc(dir.path(), connector.clone()).await;
        let (vms, events) = sample(&mut fleet).await;
        assert_eq!((names(&vms), events), (vec!["web"], vec![]));
        assert_eq!(fleet.hypervisor("web"), None, "not found at connection");

        let found = |pid: i32, started: u64| {
            qemu_stat(dir.path(), pid, started);
            connector.found.store(pid, Ordering::SeqCst);
        };
        let event = |pid: u32, was: Option<u32>| FleetEvent::Process {
            vm: "web".into(),
            pid,
            was,
        };
        found(4242, 1000);
        assert_eq!(two_samples_say(&mut fleet).await, vec![event(4242, None)]);
        assert_eq!(fleet.hypervisor("web"), Some((4242, 1000)));
        assert_eq!(sample(&mut fleet).await.1, vec![], "said once");

        found(4343, 3000);
        assert_eq!(
            two_samples_say(&mut fleet).await,
            vec![event(4343, Some(4242))]
        );
        assert_eq!(fleet.hypervisor("web"), Some((4343, 3000)));

        // A connector that no longer knows it: the VM keeps the one it had.
        connector.found.store(0, Ordering::SeqCst);
        assert_eq!(two_samples_say(&mut fleet).await, vec![]);
        assert_eq!(fleet.hypervisor("web"), Some((4343, 3000)));

        // One whose start time cannot be read (gone, or not shown yet) is not taken until
        // it can be.
        connector.found.store(4444, Ordering::SeqCst);
        assert_eq!(two_samples_say(&mut fleet).await, vec![]);
        assert_eq!(fleet.hypervisor("web"), Some((4343, 3000)));
        qemu_stat(dir.path(), 4444, 5000);
        assert_eq!(sample(&mut fleet).await.1, vec![event(4444, Some(4343))]);
        assert_eq!(fleet.hypervisor("web"), Some((4444, 5000)));
    }

    #[tokio::test(start_paused = true)]
    async fn sockets_that_appear_are_managed_and_vanished_ones_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let connector = Arc::new(FakeConnector::default());
        let mut fleet = fleet(dir.path(), connector.clone());
        assert!(settle(&mut fleet).await.is_empty());
        std::fs::write(dir.path().join("web.sock"), "").unwrap();
        let events = settle(&mut fleet).await;
        assert_eq!(
            events,
            vec![FleetEvent::Connected {
                vm: "web".into(),
                endpoint: dir.path().join("web.sock").display().to_string(),
                resumed: None,
            }]
        );
        let (vms, _) = sample(&mut fleet).await;
        assert_eq!(names(&vms), ["web"]);
        assert_eq!(
            vms[0].limits.max,
            Bytes::from_mib(512),
            "limits follow the configured size"
        );
        assert_eq!(
            vms[0].limits.min,
            Bytes::from_mib(200),
            "the hypervisor's min, the configuration setting none"
        );

        // QEMU dies: the VM leaves the managed set; the stale socket refuses; then it is removed.
        connector
            .behaviour
            .lock()
            .unwrap()
            .insert(dir.path().join("web.sock"), Behaviour::Refuses);
        turn(&mut fleet, "web", Behaviour::Dies);
        let (vms, events) = sample(&mut fleet).await;
        assert!(vms.is_empty());
        assert_eq!(
            events,
            vec![FleetEvent::Lost {
                vm: "web".into(),
                why: "end of stream".into(),
                shut_down: false,
                pid: None,
                started: None,
            }]
        );
        assert_eq!(fleet.waiting()[0].error.as_deref(), Some("end of stream"));
        std::fs::remove_file(dir.path().join("web.sock")).unwrap();
        settle(&mut fleet).await;
        assert!(
            fleet.waiting().is_empty(),
            "a discovered VM whose socket is gone is forgotten"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn failed_connections_are_retried_with_growing_delays() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("db.sock");
        std::fs::write(&socket, "").unwrap();
        let connector = Arc::new(FakeConnector::default());
        connector
            .behaviour
            .lock()
            .unwrap()
            .insert(socket.clone(), Behaviour::Refuses);
        let mut fleet = fleet(dir.path(), connector.clone());
        // Over 8 simulated seconds: attempts at 0, 1, 3 and 7 s (delays 1, 2, 4 s).
        for _ in 0..80 {
            settle(&mut fleet).await;
            tokio::time::advance(Duration::from_millis(100)).await;
        }
        assert_eq!(connector.attempts.lock().unwrap().len(), 4);
        assert_eq!(
            fleet.waiting()[0].error.as_deref(),
            Some("disconnected: connection refused")
        );
        // It comes up: the next attempt connects it.
        connector
            .behaviour
            .lock()
            .unwrap()
            .insert(socket, Behaviour::Healthy);
        tokio::time::advance(Duration::from_secs(8)).await;
        let events = settle(&mut fleet).await;
        assert!(matches!(&events[..], [FleetEvent::Connected { vm, .. }] if vm == "db"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_vm_the_daemon_just_started_is_connected_at_once_whatever_its_backoff() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("db.sock");
        std::fs::write(&socket, "").unwrap();
        let connector = Arc::new(FakeConnector::default());
        let refuse = |b| {
            connector
                .behaviour
                .lock()
                .unwrap()
                .insert(socket.clone(), b)
        };
        refuse(Behaviour::Refuses);
        let mut fleet = fleet(dir.path(), connector.clone());
        // A minute refused (hibernated): its next attempt is seconds away.
        for _ in 0..600 {
            settle(&mut fleet).await;
            tokio::time::advance(Duration::from_millis(100)).await;
        }
        let tried = connector.attempts.lock().unwrap().len();
        refuse(Behaviour::Healthy);
        // Restored by the daemon: connected at the next refresh.
        fleet.reconnect_now("db");
        let events = settle(&mut fleet).await;
        assert!(
            matches!(&events[..], [FleetEvent::Connected { vm, .. }] if vm == "db"),
            "{events:?}"
        );
        assert_eq!(connector.attempts.lock().unwrap().len(), tried + 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reload_gives_the_vms_their_new_bounds_at_the_next_sample() {
        let dir = tempfile::tempdir().unwrap();
        let connector = Arc::new(FakeConnector::default());
        for socket in ["db.qmp", "cache.qmp", "web.sock"] {
            std::fs::write(dir.path().join(socket), "").unwrap();
        }
        let (db, cache) = (dir.path().join("db.qmp"), dir.path().join("cache.qmp"));
        let glob = dir.path().join("*.sock");
        // cache's QEMU refuses until after the reload: it is still waiting then.
        let refuse = |b| connector.behaviour.lock().unwrap().insert(cache.clone(), b);
        refuse(Behaviour::Refuses);
        let config = |db_own: &str, cache_own: &str, defaults: &str| {
            let text = format!(
                "[discovery]\nqmp_glob = [{glob:?}]\n[defaults]\n{defaults}\n\
                 [[vm]]\nname = \"db\"\nqmp = {db:?}\n{db_own}\n\
                 [[vm]]\nname = \"cache\"\nqmp = {cache:?}\n{cache_own}\n"
            );
            Config::parse(&text, "memtide.toml").unwrap()
        };
        let running = config("min_mib = 300", "", "");
        let mut fleet = Fleet::new(&running, connector.clone());
        for _ in 0..3 {
            settle(&mut fleet).await;
        }
        let bounds = |vms: &[VmSnapshot]| -> Vec<(u64, u64, u32)> {
            let b = |v: &VmSnapshot| (v.limits.min.mib(), v.limits.max.mib(), v.limits.shares);
            vms.iter().map(b).collect()
        };
        let (vms, _) = sample(&mut fleet).await;
        assert_eq!(names(&vms), ["db", "web"]);
        // web's minimum is its hypervisor's (the fake's), its shares the default.
        assert_eq!(bounds(&vms), [(300, 512, 1000), (200, 512, 1000)]);
        // The configured VMs' own bounds, connected or waiting, and the default shares
        // the discovered one takes.
        let fresh = config(
            "min_mib = 400\nmax_mib = 450\nshares = 2000",
            "min_mib = 350",
            "shares = 500",
        );
        let (next, left) = running.with_policy_of(&fresh, running.sample_access());
        assert_eq!(left, Vec::<&str>::new());
        fleet.reload_bounds(&next);
        let (vms, _) = sample(&mut fleet).await;
        assert_eq!(bounds(&vms), [(400, 450, 2000), (200, 512, 500)]);
        assert_eq!(
            fleet.managed["db"].bounds_from.unwrap().max,
            BoundFrom::Config
        );
        refuse(Behaviour::Healthy);
        fleet.reconnect_now("cache");
        settle(&mut fleet).await;
        let (vms, _) = sample(&mut fleet).await;
        assert_eq!(names(&vms), ["cache", "db", "web"]);
        assert_eq!(bounds(&vms)[0], (350, 512, 500));
    }

    /// A fake VM whose hypervisor's description gives the bounds the test sets.
    struct Described(FakeVm, Arc<Mutex<(Option<Bytes>, Option<Bytes>)>>);

    #[async_trait]
    impl VmBackend for Described {
        async fn sample(&mut self) -> Result<VmSample, BackendError> {
            self.0.sample().await
        }
        async fn set_balloon(&mut self, target: Bytes) -> Result<(), BackendError> {
            self.0.set_balloon(target).await
        }
        fn target(&self) -> Option<Bytes> {
            None
        }
        fn bounds(&self) -> Option<(Option<Bytes>, Option<Bytes>)> {
            Some(*self.1.lock().unwrap())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn bounds_a_hypervisor_describes_follow_its_description_from_sample_to_sample() {
        let dir = tempfile::tempdir().unwrap();
        let mut fleet = fleet(dir.path(), Arc::new(FakeConnector::default()));
        std::fs::write(dir.path().join("db.sock"), "").unwrap();
        settle(&mut fleet).await;
        // Connected as a libvirt domain is: its bounds are those its backend describes.
        let described = Arc::new(Mutex::new((Some(Bytes::from_mib(300)), None)));
        let backend = Described(
            FakeVm(Behaviour::Healthy, Arc::default(), Arc::default()),
            described.clone(),
        );
        let m = fleet.managed.get_mut("db").unwrap();
        (m.task, m.described) = (
            VmTask::new("db", Box::new(backend), fleet.call_timeout),
            Some(BoundFrom::Libvirt),
        );
        let bounds = |fleet: &Fleet, vms: &[VmSnapshot]| {
            let from = fleet.managed["db"].bounds_from.unwrap();
            (
                vms[0].limits.min.mib(),
                vms[0].limits.max.mib(),
                from.min,
                from.max,
            )
        };
        let (vms, _) = sample(&mut fleet).await;
        assert_eq!(
            bounds(&fleet, &vms),
            (300, 512, BoundFrom::Libvirt, BoundFrom::Size),
            "the described min stands for the connection's (the fake's 200)"
        );
        // The operator sets a max and lowers the min in the description while it runs.
        *described.lock().unwrap() = (Some(Bytes::from_mib(250)), Some(Bytes::from_mib(400)));
        let (vms, _) = sample(&mut fleet).await;
        assert_eq!(
            bounds(&fleet, &vms),
            (250, 400, BoundFrom::Libvirt, BoundFrom::Libvirt)
        );
        // Both removed: the defaults' (`[defaults] min_mib`, 128).
        *described.lock().unwrap() = (None, None);
        let (vms, _) = sample(&mut fleet).await;
        assert_eq!(
            bounds(&fleet, &vms),
            (128, 512, BoundFrom::Default, BoundFrom::Size)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn libvirt_domains_are_followed_by_listing() {
        let dir = tempfile::tempdir().unwrap();
        let connector = Arc::new(FakeConnector::default());
        let uri = "qemu:///system";
        let set = |names: &[&str]| {
            let names = names.iter().map(|n| n.to_string()).collect();
            connector.domains.lock().unwrap().insert(uri.into(), names);
        };
        set(&["web", "db"]);
        let mut config = Config::default();
        config.discovery.qmp_glob = vec![dir.path().join("*.sock").display().to_string()];
        config.libvirt.uris = vec![uri.into()];
        config.vms = vec![VmConfig {
            name: "db".into(),
            qmp: None,
            libvirt: Some(uri.into()),
            firecracker: None,
            cloud_hypervisor: None,
            agent: None,
            min_mib: Some(300),
            max_mib: None,
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
        }];
        // A QMP socket whose name a libvirt domain also has: the first found keeps it.
        std::fs::write(dir.path().join("web.sock"), "").unwrap();
        let mut fleet = Fleet::new(&config, connector.clone());
        for _ in 0..3 {
            settle(&mut fleet).await;
        }
        let (vms, _) = sample(&mut fleet).await;
        assert_eq!(names(&vms), ["db", "web"]);
        assert_eq!(
            vms[0].limits.min,
            Bytes::from_mib(300),
            "the configuration's min wins over the domain's"
        );
        assert!(matches!(fleet.managed["web"].endpoint, Endpoint::Qmp(_)));
        assert_eq!(
            fleet.managed["db"].endpoint.to_string(),
            "qemu:///system domain db"
        );

        // A domain starts: it is found at the next listing.
        set(&["web", "db", "cache"]);
        settle(&mut fleet).await;
        settle(&mut fleet).await;
        let (vms, _) = sample(&mut fleet).await;
        assert_eq!(names(&vms), ["cache", "db", "web"]);

        // It stops: its sample fails, it waits, and it is forgotten when no longer listed.
        turn(&mut fleet, "cache", Behaviour::Dies);
        connector
            .behaviour
            .lock()
            .unwrap()
            .insert(PathBuf::from("qemu:///system/cache"), Behaviour::Refuses);
        let (vms, events) = sample(&mut fleet).await;
        assert_eq!(names(&vms), ["db", "web"]);
        assert!(matches!(&events[..], [FleetEvent::Lost { vm, .. }] if vm == "cache"));
        assert_eq!(fleet.waiting()[0].endpoint, "qemu:///system domain cache");
        set(&["web", "db"]);
        settle(&mut fleet).await;
        settle(&mut fleet).await;
        assert!(fleet.waiting().is_empty(), "{:?}", fleet.waiting());

        // libvirtd goes away: nothing is forgotten for that.
        connector.domains.lock().unwrap().clear();
        settle(&mut fleet).await;
        settle(&mut fleet).await;
        let (vms, _) = sample(&mut fleet).await;
        assert_eq!(names(&vms), ["db", "web"]);
    }

    /// A non-root KubeVirt launcher's virtqemud under `proc` (pid 4100), reached through
    /// its root: its /proc directory and the libvirt URI memtide finds for it.
    fn kubevirt_launcher(proc: &Path) -> (PathBuf, String) {
        kubevirt_launcher_in(proc, 4100, "")
    }

    /// A launcher daemon as process `pid` under `proc`, in pod `pod` (a UID's first group;
    /// `""` for none): its /proc entry and URI.
    fn kubevirt_launcher_in(proc: &Path, pid: u32, pod: &str) -> (PathBuf, String) {
        let launcher = proc.join(pid.to_string());
        let socket = launcher.join("root/var/run/libvirt/virtqemud-sock");
        std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
        std::os::unix::net::UnixListener::bind(&socket).unwrap();
        std::fs::write(launcher.join("comm"), "virtqemud\n").unwrap();
        std::fs::write(launcher.join("status"), "Uid:\t107\t107\t107\t107\n").unwrap();
        if !pod.is_empty() {
            let cgroup = format!("0::/kubepods/burstable/pod{}/c\n", pod_uid(pod));
            std::fs::write(launcher.join("cgroup"), cgroup).unwrap();
        }
        let uri = format!("qemu+unix:///session?socket={}", socket.display());
        (launcher, uri)
    }

    /// A pod's UID whose first group is `first` (8 hex digits).
    fn pod_uid(first: &str) -> String {
        format!("{first}-0000-4000-8000-000000000000")
    }

    /// Look for launchers now (an earlier look under way dropped) and take in what it finds.
    async fn scan_launchers(fleet: &mut Fleet) {
        let launchers = fleet.launchers.as_mut().unwrap();
        while launchers.scanning.join_next().await.is_some() {}
        launchers.scanned = None;
        fleet.find_launchers(Instant::now());
        let launchers = fleet.launchers.as_mut().unwrap();
        let found = launchers.scanning.join_next().await.unwrap().unwrap();
        fleet.found_launchers(found);
    }

    /// A fleet on a node (procfs below `dir`) with one KubeVirt launcher whose daemon
    /// runs domain `default_web`, settled and sampled once: the fleet, its connector, the
    /// launcher's /proc entry and URI, and the VMs sampled.
    async fn kubevirt_fleet(
        dir: &Path,
    ) -> (Fleet, Arc<FakeConnector>, PathBuf, String, Vec<VmSnapshot>) {
        let proc = dir.join("proc");
        let (launcher, uri) = kubevirt_launcher(&proc);
        let connector = Arc::new(FakeConnector::default());
        connector
            .domains
            .lock()
            .unwrap()
            .insert(uri.clone(), vec!["default_web".into()]);
        let mut config = Config::default();
        config.discovery.qmp_glob = Vec::new();
        config.host.proc = proc;
        config.libvirt.kubevirt = true;
        let mut fleet = Fleet::new(&config, connector.clone());
        scan_launchers(&mut fleet).await;
        for _ in 0..3 {
            settle(&mut fleet).await;
        }
        let (vms, _) = sample(&mut fleet).await;
        (fleet, connector, launcher, uri, vms)
    }

    #[tokio::test(start_paused = true)]
    async fn kubevirt_launchers_are_found_on_the_node_and_forgotten_when_they_end() {
        let dir = tempfile::tempdir().unwrap();
        let (mut fleet, connector, launcher, uri, vms) = kubevirt_fleet(dir.path()).await;
        assert_eq!(
            names(&vms),
            ["default/web"],
            "named as KubeVirt names its VMs"
        );
        assert_eq!(
            fleet.managed["default/web"].endpoint.to_string(),
            format!("{uri} domain default_web")
        );

        // The pod ends before its VM was connected again: at the next scan its URI is no
        // longer listed, its candidates are forgotten, and so is its connection.
        std::fs::remove_dir_all(&launcher).unwrap();
        fleet.candidates.insert(
            Endpoint::Libvirt {
                uri: uri.clone(),
                domain: "default_db".into(),
            },
            Fleet::discovered("default_db", None),
        );
        scan_launchers(&mut fleet).await;
        let listed = &fleet.launchers.as_ref().unwrap().found;
        assert!(
            fleet.libvirt_uris.is_empty() && listed.is_empty(),
            "{listed:?}"
        );
        assert!(fleet.waiting().is_empty(), "{:?}", fleet.waiting());
        assert_eq!(*connector.forgotten.lock().unwrap(), [uri]);
    }

    #[tokio::test]
    async fn a_look_for_launchers_that_hangs_holds_back_no_tick_and_starts_no_second() {
        let dir = tempfile::tempdir().unwrap();
        let proc = dir.path().join("proc");
        let (_, uri) = kubevirt_launcher(&proc);
        // A process whose name cannot be read until something writes it: a look blocks.
        let hung = proc.join("999");
        std::fs::create_dir_all(&hung).unwrap();
        rustix::fs::mkfifoat(rustix::fs::CWD, hung.join("comm"), 0o600.into()).unwrap();
        let mut config = Config::default();
        config.discovery.qmp_glob = Vec::new();
        config.host.proc = proc;
        config.libvirt.kubevirt = true;
        let mut fleet = Fleet::new(&config, Arc::new(FakeConnector::default()));
        let start = Instant::now();
        fleet.find_launchers(start);
        fleet.find_launchers(start + LAUNCHER_SCAN_LATE);
        let launchers = fleet.launchers.as_ref().unwrap();
        assert_eq!(launchers.scanning.len(), 1, "one look at a time");
        assert!(launchers.late && launchers.found.is_empty());

        // The name is written: the look ends, and what it found is taken in.
        std::fs::write(hung.join("comm"), "sleep\n").unwrap();
        let found = |fleet: &Fleet| fleet.launchers.as_ref().unwrap().found.clone();
        for _ in 0..500 {
            fleet.find_launchers(Instant::now());
            if !found(&fleet).is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let uris: Vec<String> = found(&fleet).into_iter().map(|l| l.uri).collect();
        assert_eq!(uris, [uri]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_kubevirt_vm_lost_after_its_launcher_is_gone_is_forgotten() {
        // The pod ends, the scan finds its daemon gone, and only then does its VM's
        // connection fail, and a listing of the daemon from before the scan come in.
        let dir = tempfile::tempdir().unwrap();
        let (mut fleet, connector, launcher, uri, vms) = kubevirt_fleet(dir.path()).await;
        assert_eq!(names(&vms), ["default/web"]);

        // A listing of the daemon, from when it still answered, not taken in yet.
        assert!(fleet.listing_in_flight.contains(&uri));
        std::fs::remove_dir_all(&launcher).unwrap();
        connector.domains.lock().unwrap().clear();
        scan_launchers(&mut fleet).await;
        turn(&mut fleet, "default/web", Behaviour::Dies);
        let (vms, events) = sample(&mut fleet).await;
        assert!(vms.is_empty());
        assert!(matches!(&events[..], [FleetEvent::Lost { vm, .. }] if vm == "default/web"));
        assert!(fleet.waiting().is_empty(), "{:?}", fleet.waiting());
        let attempts = connector.attempts.lock().unwrap().len();
        tokio::time::sleep(Duration::from_secs(120)).await;
        settle(&mut fleet).await;
        assert!(fleet.waiting().is_empty(), "{:?}", fleet.waiting());
        assert!(fleet.listing_in_flight.is_empty());
        let (vms, _) = sample(&mut fleet).await;
        assert!(vms.is_empty(), "{:?}", names(&vms));
        assert_eq!(
            connector.attempts.lock().unwrap().len(),
            attempts,
            "no attempt to reconnect through a daemon that is gone"
        );
    }

    #[tokio::test]
    async fn kubevirt_vms_take_their_pods_memory_as_bounds_and_their_domains_when_the_api_is_down()
    {
        use super::super::pods::fake_api::{FakeApi, TOKEN};
        let dir = tempfile::tempdir().unwrap();
        let proc = dir.path().join("proc");
        let connector = Arc::new(FakeConnector::default());
        // One daemon a pod, each running the domain given; the last three are not to be
        // managed: a domain not its pod's VM, a daemon in no pod, a pod not listed (yet).
        for (pid, pod, domain) in [
            (4100, "aaaaaaaa", "default_web"),
            (4200, "bbbbbbbb", "team-a_db"),
            (4300, "cccccccc", "default_new"),
            (4400, "dddddddd", "team-a_other"),
            (4500, "", "default_spare"),
            (4600, "eeeeeeee", "default_later"),
        ] {
            let (_, uri) = kubevirt_launcher_in(&proc, pid, pod);
            let domains = vec![domain.to_string()];
            connector.domains.lock().unwrap().insert(uri, domains);
        }
        // Each guest has 512 MiB; each domain says min 200 MiB (FakeConnector).
        let pod = |uid: &str, ns: &str, vmi: &str, resources: &str| {
            format!(
                r#"{{"metadata": {{"name": "virt-launcher-{vmi}-x", "namespace": "{ns}",
                    "uid": "{}",
                    "labels": {{"kubevirt.io": "virt-launcher"}},
                    "annotations": {{"kubevirt.io/domain": "{vmi}"}}}},
                  "spec": {{"nodeName": "node-1", "containers": [{{"name": "compute",
                    "resources": {resources}}}]}},
                  "status": {{"phase": "Running"}}}}"#,
                pod_uid(uid)
            )
        };
        let list = format!(
            r#"{{"kind": "PodList", "apiVersion": "v1", "items": [{}, {}, {}, {}]}}"#,
            pod(
                "aaaaaaaa",
                "default",
                "web",
                r#"{"requests": {"memory": "300Mi"}, "limits": {"memory": "400Mi"}}"#
            ),
            pod(
                "bbbbbbbb",
                "team-a",
                "db",
                r#"{"requests": {"memory": "1Gi"}}"#
            ),
            pod("cccccccc", "default", "new", "{}"),
            pod("dddddddd", "evil", "other", "{}"),
        );
        let api = FakeApi::start(&list).await;
        let token = dir.path().join("token");
        std::fs::write(&token, TOKEN).unwrap();
        let every = Duration::from_millis(100); // the last list kept 1 s
        let pods = super::super::pods::start(api.client(&token), "node-1".into(), every);
        let mut config = Config::default();
        config.discovery.qmp_glob = Vec::new();
        config.host.proc = proc;
        config.libvirt.kubevirt = true;
        let mut fleet = Fleet::new(&config, connector.clone());
        fleet.take_pod_bounds(pods.clone());
        for _ in 0..100 {
            if pods.get("default/web").is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        scan_launchers(&mut fleet).await;
        for _ in 0..3 {
            settle(&mut fleet).await;
        }
        let refused = &fleet.launchers.as_ref().unwrap().refused;
        let refused: BTreeMap<String, String> = refused
            .values()
            .flatten()
            .map(|(d, why)| (d.clone(), why.clone()))
            .collect();
        assert_eq!(
            refused,
            BTreeMap::from([
                (
                    "team-a_other".to_string(),
                    format!(
                        "its daemon runs in pod {}, whose VM is evil/other",
                        pod_uid("dddddddd")
                    )
                ),
                (
                    "default_spare".to_string(),
                    "its daemon's cgroup names no Kubernetes pod".to_string()
                ),
            ]),
            "a pod names only its own VM"
        );
        let limits = |vms: &[VmSnapshot]| -> Vec<(String, u64, u64)> {
            vms.iter()
                .map(|v| (v.name.clone(), v.limits.min.mib(), v.limits.max.mib()))
                .collect()
        };
        let (vms, _) = sample(&mut fleet).await;
        assert_eq!(
            limits(&vms),
            [
                ("default/new".into(), 200, 512), // no pod listed: its domain's
                ("default/web".into(), 300, 400), // its pod's request and limit
                ("team-a/db".into(), 512, 512),   // a request above its size: held there
            ]
        );
        let from = |fleet: &Fleet| -> Vec<(String, &str, &str)> {
            fleet
                .sampling()
                .into_iter()
                .map(|s| {
                    let f = s.bounds_from.expect("sampled");
                    (s.name, f.min.name(), f.max.name())
                })
                .collect()
        };
        assert_eq!(
            from(&fleet),
            [
                ("default/new".into(), "libvirt", "size"),
                ("default/web".into(), "pod", "pod"),
                ("team-a/db".into(), "size", "size"),
            ]
        );
        assert!(api.requests.lock().unwrap()[0].contains("spec.nodeName%3Dnode-1"));

        // The API server goes away: the last list holds for 1 s, then the domains' bounds.
        api.stop();
        let (vms, _) = sample(&mut fleet).await;
        assert_eq!(limits(&vms)[1], ("default/web".into(), 300, 400));
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let (vms, _) = sample(&mut fleet).await;
        assert_eq!(
            limits(&vms),
            [
                ("default/new".into(), 200, 512),
                ("default/web".into(), 200, 512),
                ("team-a/db".into(), 200, 512),
            ]
        );
        assert_eq!(from(&fleet)[1], ("default/web".into(), "libvirt", "size"));
    }

    /// A connected fleet of two VMs: `odd`, behaving as told, and a healthy `ok`.
    async fn odd_and_ok(dir: &Path, odd: &str, behaviour: Behaviour) -> Fleet {
        odd_and_ok_timing_out(dir, odd, behaviour, 100).await.0
    }

    /// [`odd_and_ok`], with calls timing out after `call_timeout_ms`, and the count of
    /// balloon commands sent to `odd`.
    async fn odd_and_ok_timing_out(
        dir: &Path,
        odd: &str,
        behaviour: Behaviour,
        call_timeout_ms: u64,
    ) -> (Fleet, Arc<AtomicU32>) {
        for name in [odd, "ok"] {
            std::fs::write(dir.join(format!("{name}.sock")), "").unwrap();
        }
        let connector = Arc::new(FakeConnector::default());
        connector
            .behaviour
            .lock()
            .unwrap()
            .insert(dir.join(format!("{odd}.sock")), behaviour);
        let sent = connector.sent_to(&dir.join(format!("{odd}.sock")));
        let mut fleet = fleet_timing_out(dir, connector, call_timeout_ms);
        settle(&mut fleet).await;
        (fleet, sent)
    }

    const INTERVAL: Duration = Duration::from_secs(2);

    #[tokio::test(start_paused = true)]
    async fn a_vm_that_never_answers_is_left_out_at_the_deadline_and_the_others_decided_every_tick()
    {
        // Before: every tick waited for the slowest VM, up to the call timeout.
        let dir = tempfile::tempdir().unwrap();
        let (mut fleet, _) =
            odd_and_ok_timing_out(dir.path(), "hung", Behaviour::Hangs, 30_000).await;
        for tick in 1..=10u64 {
            let t0 = Instant::now();
            let sampled = fleet.sample(t0 + INTERVAL / 2).await;
            assert_eq!(
                t0.elapsed(),
                INTERVAL / 2,
                "tick {tick}: the deadline bounds it"
            );
            assert!(sampled.events.is_empty(), "a late VM is kept");
            assert_eq!(names(&sampled.vms), ["hung", "ok"]);
            assert!(sampled.vms[1].sample.is_ok(), "ok decided at tick {tick}");
            // Its one sample call waits on (30 s), and says for how long.
            let waited = 1000 + 2000 * (tick - 1);
            assert_eq!(sampled.vms[0].sample, Err(BackendError::Timeout(waited)));
            let [hung, ok] = &fleet.sampling()[..] else {
                panic!("{:?}", fleet.sampling());
            };
            assert!(hung.stale && hung.late_samples == tick && hung.age_s.is_none());
            assert!(!ok.stale && ok.late_samples == 0 && ok.age_s == Some(1.0));
            tokio::time::sleep_until(t0 + INTERVAL).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_vm_answering_after_the_wait_but_within_the_interval_is_decided_every_other_tick() {
        // Before: each tick superseded the sample that came after the previous tick's
        // deadline and asked for one that came late again: never decided.
        let dir = tempfile::tempdir().unwrap();
        let (mut fleet, _) =
            odd_and_ok_timing_out(dir.path(), "laggard", Behaviour::SlowSample, 30_000).await;
        let mut decided = Vec::new();
        for tick in 1..=6 {
            let t0 = Instant::now();
            let sampled = fleet.sample(t0 + INTERVAL / 2).await;
            assert_eq!(names(&sampled.vms), ["laggard", "ok"]);
            assert!(sampled.vms[1].sample.is_ok(), "ok decided at tick {tick}");
            let on_time = sampled.vms[0].sample.is_ok();
            // Waited for it until the deadline, or not at all when its sample was in.
            let waited = if on_time {
                Duration::ZERO
            } else {
                INTERVAL / 2
            };
            assert_eq!(t0.elapsed(), waited, "tick {tick}");
            decided.push(on_time);
            // No second call was asked of it in a tick it is decided in: a balloon
            // command goes out at once.
            let target = [("laggard".into(), Bytes::from_mib(300))];
            let sent = fleet.set_balloons(&target, t0 + INTERVAL * 3 / 4).await;
            if on_time {
                assert_eq!(sent[0], Sent::Answered(Ok(())), "tick {tick}");
            }
            tokio::time::sleep_until(t0 + INTERVAL).await;
        }
        assert_eq!(decided, [false, true, false, true, false, true]);
        let laggard = &fleet.sampling()[0];
        assert_eq!(
            (laggard.name.as_str(), laggard.late_samples),
            ("laggard", 3)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_unanswered_balloon_command_holds_back_no_tick_and_is_never_sent_twice() {
        let dir = tempfile::tempdir().unwrap();
        let (mut fleet, sent) =
            odd_and_ok_timing_out(dir.path(), "deaf", Behaviour::IgnoresBalloon, 5_000).await;
        let targets = [
            ("deaf".to_string(), Bytes::from_mib(300)),
            ("ok".to_string(), Bytes::from_mib(300)),
        ];
        let mut deaf = Vec::new();
        let mut late = Vec::new();
        for tick in 1..=3 {
            let t0 = Instant::now();
            let sampled = fleet.sample(t0 + INTERVAL / 2).await;
            late.extend(sampled.balloons);
            assert!(sampled.vms[1].sample.is_ok(), "ok decided at tick {tick}");
            deaf.push(sampled.vms[0].sample.is_ok());
            let results = fleet.set_balloons(&targets, t0 + INTERVAL * 3 / 4).await;
            assert!(t0.elapsed() <= INTERVAL * 3 / 4, "tick {tick}");
            assert_eq!(
                results[1],
                Sent::Answered(Ok(())),
                "ok actuated at tick {tick}"
            );
            match tick {
                1 => assert_eq!(results[0], Sent::InFlight),
                _ => assert!(
                    matches!(&results[0], Sent::Answered(Err(BackendError::Busy(why)))
                        if why == "not sent: its previous call is still in flight"),
                    "tick {tick}: {:?}",
                    results[0]
                ),
            }
            assert_eq!(sent.load(Ordering::SeqCst), 1, "tick {tick}: sent once");
            tokio::time::sleep_until(t0 + INTERVAL).await;
        }
        assert_eq!(deaf, [true, false, false], "late while its command is out");
        // Its command times out at 5 s and is reported at the next tick (6 s); its sample
        // is asked for again, and the failure starts the balloon backoff.
        let t0 = Instant::now();
        let sampled = fleet.sample(t0 + INTERVAL / 2).await;
        assert_eq!(t0.elapsed(), Duration::ZERO, "nothing to wait for");
        assert_eq!(
            late.into_iter().chain(sampled.balloons).collect::<Vec<_>>(),
            [Answered {
                vm: "deaf".into(),
                target: Bytes::from_mib(300),
                result: Err(BackendError::Timeout(5000))
            }]
        );
        assert!(sampled.vms[0].sample.is_ok(), "deaf sampled again");
        assert!(fleet.managed["deaf"].actuation.error.is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_paused_vms_figures_age_while_it_answers_that_it_is_busy() {
        // Found by an audit: an answer that the guest was paused counted as a sample,
        // and its sample age stayed at a fraction of a second.
        let dir = tempfile::tempdir().unwrap();
        let (mut fleet, _) =
            odd_and_ok_timing_out(dir.path(), "paused", Behaviour::Paused, 5_000).await;
        for _ in 0..3 {
            let t0 = Instant::now();
            let sampled = fleet.sample(t0 + INTERVAL / 2).await;
            let paused = sampled.vms.iter().find(|v| v.name == "paused").unwrap();
            assert!(
                matches!(paused.sample, Err(BackendError::Busy(_))),
                "{:?}",
                paused.sample
            );
            tokio::time::sleep_until(t0 + INTERVAL).await;
        }
        let sampling = fleet.sampling();
        let ages: Vec<_> = sampling
            .iter()
            .map(|s| (s.name.as_str(), s.age_s))
            .collect();
        assert_eq!(
            ages,
            [("ok", Some(2.0)), ("paused", None)],
            "no figures yet"
        );
        assert!(!sampling[1].stale, "answered: not late");
    }

    #[tokio::test(start_paused = true)]
    async fn a_vm_whose_balloon_command_is_answered_during_the_tick_is_sampled_in_it() {
        let dir = tempfile::tempdir().unwrap();
        let (mut fleet, _) =
            odd_and_ok_timing_out(dir.path(), "deaf", Behaviour::IgnoresBalloon, 1_800).await;
        let t0 = Instant::now();
        let target = Bytes::from_mib(300);
        let sent = fleet
            .set_balloons(&[("deaf".into(), target)], t0 + INTERVAL * 3 / 4)
            .await;
        assert_eq!(sent, [Sent::InFlight]);
        // It times out 1.8 s after it was sent, inside the next sample window.
        let sampled = fleet.sample(Instant::now() + INTERVAL / 2).await;
        assert_eq!(t0.elapsed(), Duration::from_millis(1800));
        let failed = Err(BackendError::Timeout(1800));
        let answered = Answered {
            vm: "deaf".into(),
            target,
            result: failed,
        };
        assert_eq!(sampled.balloons, [answered]);
        assert!(sampled.vms[0].sample.is_ok(), "sampled once free");
        assert!(!fleet.sampling()[0].stale);
    }

    #[tokio::test(start_paused = true)]
    async fn a_save_asked_between_samples_starts_at_once_and_its_vm_is_left_out_meanwhile() {
        // Before: it waited, queued, for the next tick's sample (up to `interval_s`).
        let dir = tempfile::tempdir().unwrap();
        let mut fleet = odd_and_ok(dir.path(), "db", Behaviour::Healthy).await;
        sample(&mut fleet).await;
        let t0 = Instant::now();
        let (job, saved) = SaveJob::for_test();
        assert!(fleet.save("db", job, true).is_ok());
        assert!(fleet.managed["db"].task.saving(), "started, not queued");
        let Err((_, why)) = fleet.save("db", SaveJob::for_test().0, true) else {
            panic!("a second save taken");
        };
        assert_eq!(why, "VM db is being saved already");
        // A sample halfway through the save leaves db out and decides the other.
        tokio::time::sleep(SAVE_TAKES / 2).await;
        let sampled = fleet.sample(Instant::now() + SAVE_TAKES / 4).await;
        let busy = Err(BackendError::Busy("being saved".into()));
        assert_eq!(sampled.vms[0].sample, busy, "busy, not timed out");
        let db = &fleet.managed["db"];
        assert_eq!((db.stale, db.late_samples), (false, 0), "nor late");
        assert!(sampled.vms[1].sample.is_ok());
        assert_eq!(saved.await.unwrap(), Ok(Saved::default()));
        assert_eq!(t0.elapsed(), SAVE_TAKES, "it ran from the request");
        let (vms, _) = sample(&mut fleet).await;
        let events = &vms[0]
            .sample
            .as_ref()
            .expect("sampled again once saved")
            .events;
        assert_eq!(events, &[VmEvent::Saved], "said saved, for its CPU time");
    }

    #[tokio::test(start_paused = true)]
    async fn a_save_the_tick_decided_waits_for_the_next_sample() {
        // Hibernation and scheduled saves: not over the passes the tick started.
        let dir = tempfile::tempdir().unwrap();
        let mut fleet = odd_and_ok(dir.path(), "db", Behaviour::Healthy).await;
        sample(&mut fleet).await;
        let (job, saved) = SaveJob::for_test();
        assert!(fleet.save("db", job, false).is_ok());
        assert!(!fleet.managed["db"].task.saving(), "queued, not started");
        assert!(
            fleet.save("db", SaveJob::for_test().0, true).is_err(),
            "one at a time"
        );
        let sampled = fleet.sample(Instant::now() + SAVE_TAKES / 4).await;
        assert!(fleet.managed["db"].task.saving(), "started by the sample");
        let busy = Err(BackendError::Busy("being saved".into()));
        assert_eq!(sampled.vms[0].sample, busy, "and left out of it");
        assert_eq!(saved.await.unwrap(), Ok(Saved::default()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_save_waiting_for_a_sample_is_given_up_and_told_so_when_memtide_stops() {
        let dir = tempfile::tempdir().unwrap();
        let mut fleet = odd_and_ok(dir.path(), "db", Behaviour::Healthy).await;
        sample(&mut fleet).await;
        let (job, saved) = SaveJob::for_test();
        assert!(fleet.save("db", job, false).is_ok());
        fleet.give_up_queued_saves();
        let why = BackendError::Protocol("memtide stopped before the save began".into());
        assert_eq!(saved.await.unwrap(), Err(why));
        // Nothing is started by a later sample.
        fleet.sample(Instant::now() + SAVE_TAKES / 4).await;
        assert!(!fleet.managed["db"].task.saving());
    }

    #[tokio::test(start_paused = true)]
    async fn a_save_asked_while_a_call_is_in_flight_starts_in_the_next_sample_once_it_answered() {
        // Before: that sample took the call's answer and sampled the VM; the save waited
        // for a sample that found the VM free at its start, a tick later at the soonest.
        let dir = tempfile::tempdir().unwrap();
        let (mut fleet, _) =
            odd_and_ok_timing_out(dir.path(), "deaf", Behaviour::IgnoresBalloon, 800).await;
        let t0 = Instant::now();
        let target = Bytes::from_mib(300);
        let sent = fleet
            .set_balloons(&[("deaf".into(), target)], t0 + INTERVAL / 4)
            .await;
        assert_eq!(sent, [Sent::InFlight]);
        let (job, saved) = SaveJob::for_test();
        assert!(fleet.save("deaf", job, true).is_ok());
        assert!(fleet.managed["deaf"].save.is_some(), "queued");
        assert!(
            fleet.save("deaf", SaveJob::for_test().0, true).is_err(),
            "one at a time"
        );
        // The command times out 0.8 s after it was sent, within the next sample, which
        // takes its answer and starts the save: the VM is left out while it runs.
        let sampled = fleet.sample(Instant::now() + INTERVAL / 2).await;
        assert_eq!(sampled.balloons.len(), 1);
        assert!(fleet.managed["deaf"].task.saving());
        let busy = Err(BackendError::Busy("being saved".into()));
        assert_eq!(sampled.vms[0].sample, busy);
        assert!(sampled.vms[1].sample.is_ok());
        assert_eq!(saved.await.unwrap(), Ok(Saved::default()));
        assert_eq!(t0.elapsed(), Duration::from_millis(800) + SAVE_TAKES);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_vm_times_out_without_holding_the_others() {
        let dir = tempfile::tempdir().unwrap();
        let mut fleet = odd_and_ok(dir.path(), "hung", Behaviour::Hangs).await;
        let start = Instant::now();
        let (vms, events) = sample(&mut fleet).await;
        assert_eq!(
            start.elapsed(),
            Duration::from_millis(100),
            "bounded by the call timeout"
        );
        assert!(events.is_empty(), "a timeout is not a disconnect");
        assert_eq!(vms[0].sample, Err(BackendError::Timeout(100)));
        assert!(vms[1].sample.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_vm_that_ignores_balloon_commands_is_asked_again_only_after_a_backoff() {
        // Before: asked every tick, each tick waiting the full call timeout (#18 defect 10).
        let dir = tempfile::tempdir().unwrap();
        let mut fleet = odd_and_ok(dir.path(), "deaf", Behaviour::IgnoresBalloon).await;
        let targets = [
            ("deaf".to_string(), Bytes::from_mib(300)),
            ("ok".to_string(), Bytes::from_mib(300)),
        ];
        let start = Instant::now();
        let results = set_balloons(&mut fleet, &targets).await;
        assert_eq!(start.elapsed(), Duration::from_millis(100));
        assert_eq!(results[0], Sent::Answered(Err(BackendError::Timeout(100))));
        assert_eq!(results[1], Sent::Answered(Ok(())));
        // The next ticks within the backoff cost nothing and say why.
        for _ in 0..3 {
            let start = Instant::now();
            let results = set_balloons(&mut fleet, &targets).await;
            assert_eq!(start.elapsed(), Duration::ZERO, "no call timeout waited");
            let Sent::Answered(Err(BackendError::Protocol(why))) = &results[0] else {
                panic!("{results:?}");
            };
            assert!(
                why.starts_with(
                    "not sent: the last balloon command failed (no answer within 100 ms)"
                ),
                "{why}"
            );
            assert_eq!(
                results[1],
                Sent::Answered(Ok(())),
                "the other VM is not held back"
            );
            tokio::time::advance(Duration::from_millis(300)).await;
        }
        // Past the first second: asked again, and the backoff doubles after a new failure.
        tokio::time::advance(Duration::from_millis(200)).await;
        let results = set_balloons(&mut fleet, &targets).await;
        assert_eq!(results[0], Sent::Answered(Err(BackendError::Timeout(100))));
        // Dropping its session does not clear the backoff (the QMP client closes a session
        // after a timeout, and the VM reconnects a second later).
        fleet.lose("deaf", "a call timed out".into());
        tokio::time::advance(Duration::from_millis(1000)).await;
        settle(&mut fleet).await;
        assert!(fleet.managed.contains_key("deaf"), "reconnected");
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(matches!(
            set_balloons(&mut fleet, &targets).await[0],
            Sent::Answered(Err(BackendError::Protocol(_)))
        ));
        // Memory given back waits for no backoff: a raise is sent at once, once.
        let raise = [("deaf".to_string(), Bytes::from_mib(400))];
        let start = Instant::now();
        assert_eq!(
            set_balloons(&mut fleet, &raise).await[0],
            Sent::Answered(Err(BackendError::Timeout(100)))
        );
        assert_eq!(start.elapsed(), Duration::from_millis(100), "sent");
        assert!(matches!(
            set_balloons(&mut fleet, &raise).await[0],
            Sent::Answered(Err(BackendError::Protocol(_)))
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_vm_lost_soon_after_each_connection_waits_longer_each_time() {
        let dir = tempfile::tempdir().unwrap();
        let mut fleet = odd_and_ok(dir.path(), "flaky", Behaviour::Healthy).await;
        for wait in [1, 2, 4, 8] {
            fleet.lose("flaky", "end of stream".into());
            let retry = fleet.waiting()[0].retry_in_s;
            assert_eq!(retry, wait as f64, "the backoff doubles while it flaps");
            tokio::time::advance(Duration::from_secs(wait)).await;
            settle(&mut fleet).await;
            assert!(fleet.managed.contains_key("flaky"));
        }
        // Connected for a minute: the next loss starts afresh.
        tokio::time::advance(STABLE).await;
        fleet.lose("flaky", "end of stream".into());
        assert_eq!(fleet.waiting()[0].retry_in_s, 1.0);
    }
}
