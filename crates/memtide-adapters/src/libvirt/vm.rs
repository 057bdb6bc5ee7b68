//! One libvirt domain as a memtide VM.

use super::session::{backend_error, blocking, job, Session};
use super::{stats, xml, Libvirt};
use crate::procfs;
use crate::qga::{self, AgentChannel, AgentRetry, QgaError};
use crate::virtio_mem::{self, Device, Follower};
use crate::Relearn;
use async_trait::async_trait;
use memtide_core::backend::{AfterSave, Saved, Seal, VmBackend};
use memtide_core::stats::GuestStats;
use memtide_core::{BackendError, Bytes, VmEvent, VmSample};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use virt::domain::Domain;
use virt_sys as sys;

/// How to manage a domain.
#[derive(Debug, Clone)]
pub struct LibvirtVmOptions {
    /// How often the guest should refresh its balloon statistics, in seconds.
    pub stats_interval_s: u64,
    /// The host's procfs, where a local domain's QEMU process is found.
    pub proc: PathBuf,
}

/// A running libvirt domain.
pub struct LibvirtVm {
    pub(super) session: Arc<Session>,
    pub(super) domain: Arc<Domain>,
    name: String,
    /// The connection's URI.
    pub(super) uri: String,
    pub(super) call_timeout: Duration,
    description: xml::DomainXml,
    /// When its live XML is read again for devices attached or detached.
    relearn: Relearn,
    /// How often its guest refreshes its balloon statistics (s).
    stats_period: i32,
    /// The memory the balloon works on: `<memory>` less the virtio-mem device's maximum.
    base: Bytes,
    /// What is learnt about the virtio-mem device from sample to sample.
    vmem_follower: Follower,
    target: Option<Bytes>,
    agent: Option<AgentRetry>,
    /// Guest files left open by agent reads cut short, closed at the next.
    agent_open: qga::OpenHandles,
    /// Its QEMU process, where the daemon is local and it was found
    /// ([`procfs::qemus_by_argument`]): what the host swapped out of it.
    process: Option<(i32, procfs::ProcessRss)>,
    /// How its QEMU is found again, where the daemon is local.
    find: Option<Finder>,
}

/// How long a local domain whose QEMU was not found waits before the next scan for it,
/// doubled after each scan that does not find it, up to [`LOOK_AGAIN_AT_MOST`].
const LOOK_AGAIN_AFTER: Duration = Duration::from_secs(60);
/// The longest wait between two scans for a domain's QEMU (one in another pid namespace
/// is never found).
const LOOK_AGAIN_AT_MOST: Duration = Duration::from_secs(3600);

/// A scan of a procfs for a domain's QEMU, running on a blocking thread.
type Scan = tokio::task::JoinHandle<Option<(i32, procfs::ProcessRss)>>;

/// How a local domain's QEMU process is found: by its UUID, in a procfs.
struct Finder {
    uuid: String,
    proc: PathBuf,
    /// While its QEMU is not found, when to scan for it again, and the wait after that.
    next: Option<(Instant, Duration)>,
    /// A scan given up on that has not ended yet (a hung procfs): no other starts.
    scan: Option<Scan>,
}

impl Finder {
    /// Finding the QEMU started with `uuid` in `proc`, scanning at the next call.
    fn new(uuid: String, proc: PathBuf) -> Finder {
        Finder {
            uuid,
            proc,
            next: None,
            scan: None,
        }
    }

    /// Follow `process` at `now`: one that ended is looked for again at once (a save that
    /// ran the domain again, a restart after a crash), one not found after
    /// [`LOOK_AGAIN_AFTER`] and longer after each scan that does not find it (a scan given
    /// up at connection, a procfs that did not show it yet). Each scan is off the
    /// runtime, given up after `limit`.
    async fn follow(
        &mut self,
        process: &mut Option<(i32, procfs::ProcessRss)>,
        now: Instant,
        limit: Duration,
    ) {
        if process.as_ref().is_some_and(|(_, p)| p.read().is_none()) {
            // It ended: nothing is read of it again, and it is looked for at once.
            (*process, self.next) = (None, None);
        }
        if process.is_some() {
            return;
        }
        // A scan given up on that has ended since: what it found, if it still runs.
        if let Some(scan) = self.scan.take_if(|s| s.is_finished()) {
            if let Ok(Some(found)) = scan.await {
                if found.1.read().is_some() {
                    (*process, self.next) = (Some(found), None);
                    return;
                }
            }
        }
        if self.scan.is_some() || self.next.is_some_and(|(at, _)| now < at) {
            return;
        }
        let (uuid, proc) = (self.uuid.clone(), self.proc.clone());
        let mut scan = tokio::task::spawn_blocking(move || {
            let pid = *procfs::qemus_by_argument(&proc, "-uuid").get(&uuid)?;
            own_process(&proc, pid)
        });
        *process = match tokio::time::timeout(limit, &mut scan).await {
            Ok(found) => found.ok().flatten(),
            Err(_) => {
                self.scan = Some(scan);
                None
            }
        };
        match process {
            Some(_) => self.next = None,
            None => self.missed(now),
        }
    }

    /// Its QEMU not found at `now`: the next scan after the wait due (at first
    /// [`LOOK_AGAIN_AFTER`]), the one after that twice as long, up to
    /// [`LOOK_AGAIN_AT_MOST`].
    fn missed(&mut self, now: Instant) {
        let wait = self.next.map_or(LOOK_AGAIN_AFTER, |(_, wait)| wait);
        self.next = Some((now + wait, (wait * 2).min(LOOK_AGAIN_AT_MOST)));
    }
}

/// What one sample reads from libvirt in a single blocking call.
struct Raw {
    state: (u32, i32),
    job: Option<(i32, Option<i32>)>,
    memory: Vec<(u32, u64)>,
    /// CPU time the domain has used, in nanoseconds (`virDomainGetInfo`).
    cpu_ns: Option<u64>,
    /// The live XML: for the virtio-mem device's sizes (when it has one), and every
    /// [`crate::RELEARN_SAMPLES`] samples for its devices (`None` where that reading failed).
    xml: Option<String>,
}

impl LibvirtVm {
    /// Find the running domain `name`, read its description and turn on its balloon
    /// statistics.
    pub async fn connect(
        libvirt: &Libvirt,
        name: &str,
        opts: &LibvirtVmOptions,
    ) -> Result<LibvirtVm, BackendError> {
        let session = libvirt.session().await?;
        let limit = libvirt.call_timeout();
        let (conn_session, domain_name) = (session.clone(), name.to_string());
        let period = opts.stats_interval_s.clamp(1, i32::MAX as u64) as i32;
        let local = local(libvirt.uri());
        let (domain, text, uuid) = blocking(limit, move || {
            let domain = Domain::lookup_by_name(&conn_session.conn, &domain_name)?;
            let text = domain.get_xml_desc(0)?;
            let uuid = if local {
                Some(domain.get_uuid_string()?)
            } else {
                None
            };
            Ok((domain, text, uuid))
        })
        .await?;
        // libvirt's API gives no pid: its QEMU is the process started with its UUID, and
        // a scan begun from now on finds it.
        let since = std::time::Instant::now();
        let process = match &uuid {
            Some(uuid) => libvirt.qemu(&opts.proc, uuid, since).await,
            None => None,
        };
        let process = process.and_then(|pid| own_process(&opts.proc, pid));
        let description = xml::parse(&text).map_err(|e| BackendError::Protocol(e.to_string()))?;
        let domain = Arc::new(domain);
        if description.balloon.is_some() {
            let d = domain.clone();
            blocking(limit, move || {
                d.set_memory_stats_period(period, sys::VIR_DOMAIN_AFFECT_LIVE)
            })
            .await?;
        }
        session.events.watch(name);
        Ok(LibvirtVm {
            agent: description
                .agent_channel
                .then(|| AgentRetry::new(format!("of libvirt domain {name}"))),
            session,
            domain,
            name: name.to_string(),
            uri: libvirt.uri().to_string(),
            call_timeout: limit,
            base: description.base_memory(),
            description,
            relearn: Relearn::default(),
            stats_period: period,
            vmem_follower: Follower::default(),
            target: None,
            agent_open: qga::OpenHandles::default(),
            find: uuid.map(|uuid| {
                let mut finder = Finder::new(uuid, opts.proc.clone());
                if process.is_none() {
                    finder.missed(since);
                }
                finder
            }),
            process,
        })
    }

    /// Take `new`, the domain's live description read again: where its memory, balloon
    /// or virtio-mem device changed (a DIMM or virtio-mem device attached or detached
    /// live, as oVirt hot-plugs memory), the target last sent is forgotten, a size of the
    /// memory known then, so that the next is sent; a balloon that came has its
    /// statistics turned on (a refusal warned of: the guest's figures are then missing),
    /// a guest agent channel that came or went is followed, and the operator's bounds are
    /// the new description's.
    async fn follow_description(&mut self, new: xml::DomainXml) {
        let change = Change::between(&self.description, &new);
        if change.memory {
            self.target = None;
        }
        if change.virtio_mem {
            self.vmem_follower = Follower::default();
        }
        if change.balloon_came {
            let (d, period) = (self.domain.clone(), self.stats_period);
            let set = blocking(self.call_timeout, move || {
                d.set_memory_stats_period(period, sys::VIR_DOMAIN_AFFECT_LIVE)
            })
            .await;
            if let Err(e) = set {
                tracing::warn!(
                    "libvirt domain {}: its balloon's statistics could not be turned on ({e})",
                    self.name
                );
            }
        }
        if new.agent_channel != self.agent.is_some() {
            self.agent = new
                .agent_channel
                .then(|| AgentRetry::new(format!("of libvirt domain {}", self.name)));
        }
        self.base = new.base_memory();
        self.description = new;
    }

    fn events(&mut self) -> Vec<VmEvent> {
        let events = self.session.events.take(&self.name);
        if events.contains(&VmEvent::Reset) {
            self.target = None;
        }
        events
    }
}

impl Drop for LibvirtVm {
    fn drop(&mut self) {
        self.session.events.unwatch(&self.name);
    }
}

/// What changed between two readings of a domain's description.
#[derive(Debug, Default, PartialEq)]
struct Change {
    /// Its memory, balloon or virtio-mem device: the target last sent no longer holds.
    memory: bool,
    /// Its virtio-mem device (another, or none).
    virtio_mem: bool,
    /// A balloon where there was none.
    balloon_came: bool,
}

impl Change {
    fn between(old: &xml::DomainXml, new: &xml::DomainXml) -> Change {
        // A virtio-mem device by its name and size: its requested and plugged sizes move
        // from sample to sample.
        let device = |d: &xml::DomainXml| d.virtio_mem.as_ref().map(|v| (v.alias.clone(), v.size));
        let virtio_mem = device(old) != device(new);
        let balloon = |d: &xml::DomainXml| d.balloon.is_some();
        Change {
            memory: old.memory != new.memory || balloon(old) != balloon(new) || virtio_mem,
            virtio_mem,
            balloon_came: !balloon(old) && balloon(new),
        }
    }
}

/// Whether `uri` reaches a QEMU driver's daemon on this host (no host name, or the
/// loopback's, as in `qemu:///system` and `qemu+unix:///session?socket=...`): only then
/// is a domain's QEMU one of this host's processes.
fn local(uri: &str) -> bool {
    let Some((scheme, rest)) = uri.split_once("://") else {
        return false;
    };
    let driver = scheme.split('+').next().unwrap_or_default();
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let host = authority.rsplit('@').next().unwrap_or_default();
    let host = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host.split(':').next().unwrap_or_default(),
    };
    driver == "qemu" && ["", "localhost", "127.0.0.1", "::1"].contains(&host)
}

/// Process `pid`, found under `proc`, as one this daemon can watch: the same process in
/// this daemon's own pid namespace (where `proc` is another namespace's procfs, its pid
/// there names another process here, or none), its memory readable.
fn own_process(proc: &Path, pid: u32) -> Option<(i32, procfs::ProcessRss)> {
    let pid = i32::try_from(pid).ok()?;
    let started = procfs::start_time(proc, pid)?;
    if procfs::start_time(Path::new("/proc"), pid) != Some(started) {
        return None;
    }
    let process = procfs::ProcessRss::new(proc, pid);
    process.read()?;
    Some((pid, process))
}

/// The virtio-mem device in a running domain's XML, and its sizes.
fn live_virtio_mem(text: &str) -> Result<(xml::VirtioMemDevice, Device), BackendError> {
    let element = xml::parse(text)
        .map_err(|e| BackendError::Protocol(e.to_string()))?
        .virtio_mem
        .ok_or_else(|| BackendError::Protocol("the virtio-mem device is gone".into()))?;
    let sizes = element.live().ok_or_else(|| {
        BackendError::Protocol("virtio-mem: no <current> in the running domain's XML".into())
    })?;
    Ok((element, sizes))
}

/// Why a domain in this state with this job is not sampled, if it is not: a domain
/// migrating, or paused by its user or for a migration, a save, a dump or a snapshot,
/// is busy, left alone until it runs (a paused guest's figures are stale and its
/// balloon is not served); one paused on an error (an I/O error, a crash, its watchdog)
/// is out of reach, as a fault.
fn held(state: (u32, i32), job: Option<(i32, Option<i32>)>) -> Option<BackendError> {
    let migrating = |op: i32| {
        op == sys::VIR_DOMAIN_JOB_OPERATION_MIGRATION_OUT as i32
            || op == sys::VIR_DOMAIN_JOB_OPERATION_MIGRATION_IN as i32
    };
    let busy = |why: &str| Some(BackendError::Busy(format!("{why}; left alone")));
    match (state, job) {
        ((sys::VIR_DOMAIN_PAUSED, reason), _) => match reason as u32 {
            sys::VIR_DOMAIN_PAUSED_MIGRATION | sys::VIR_DOMAIN_PAUSED_POSTCOPY => {
                busy("the domain is paused for migration")
            }
            sys::VIR_DOMAIN_PAUSED_IOERROR
            | sys::VIR_DOMAIN_PAUSED_WATCHDOG
            | sys::VIR_DOMAIN_PAUSED_CRASHED
            | sys::VIR_DOMAIN_PAUSED_POSTCOPY_FAILED
            | sys::VIR_DOMAIN_PAUSED_API_ERROR => Some(BackendError::Protocol(format!(
                "the domain is paused on an error (libvirt's reason {reason}: an I/O error, \
                 a crash, its watchdog, a failed migration or API call)"
            ))),
            sys::VIR_DOMAIN_PAUSED_USER => busy("the domain is paused by its user"),
            // A save, a dump, a snapshot, starting up or shutting down, or paused outside
            // libvirt (a QMP `stop`: reason unknown).
            _ => busy("the domain is paused"),
        },
        (_, Some((kind, Some(op)))) if kind != sys::VIR_DOMAIN_JOB_NONE as i32 && migrating(op) => {
            busy("the domain is migrating")
        }
        _ => None,
    }
}

#[async_trait]
impl VmBackend for LibvirtVm {
    async fn sample(&mut self) -> Result<VmSample, BackendError> {
        let d = self.domain.clone();
        let has_virtio_mem = self.description.virtio_mem.is_some();
        let relearn = self.relearn.due();
        let raw = blocking(self.call_timeout, move || {
            let (state, reason) = d.get_state()?;
            if state != sys::VIR_DOMAIN_RUNNING && state != sys::VIR_DOMAIN_PAUSED {
                return Ok(Raw {
                    state: (state, reason),
                    job: None,
                    memory: Vec::new(),
                    cpu_ns: None,
                    xml: None,
                });
            }
            let job = job(&d).ok();
            let memory = d.memory_stats(0)?;
            let xml = if has_virtio_mem {
                Some(d.get_xml_desc(0)?)
            } else if relearn {
                d.get_xml_desc(0).ok()
            } else {
                None
            };
            Ok(Raw {
                state: (state, reason),
                job,
                memory: memory.iter().map(|m| (m.tag, m.val)).collect(),
                cpu_ns: d.get_info().ok().map(|info| info.cpu_time),
                xml,
            })
        })
        .await?;
        if raw.state.0 != sys::VIR_DOMAIN_RUNNING && raw.state.0 != sys::VIR_DOMAIN_PAUSED {
            return Err(BackendError::Disconnected(
                "the domain is not running".into(),
            ));
        }
        if let Some(e) = held(raw.state, raw.job) {
            return Err(e);
        }
        if relearn {
            // Read again for devices attached or detached live (libvirt's device events
            // are not watched); a failed reading leaves the description known.
            match raw.xml.as_deref().map(xml::parse) {
                Some(Ok(new)) => self.follow_description(new).await,
                Some(Err(e)) => tracing::warn!(
                    "libvirt domain {}: its XML read again does not parse ({e}); sampled \
                     as described before",
                    self.name
                ),
                None => tracing::warn!(
                    "libvirt domain {}: reading its XML again failed; sampled as described \
                     before",
                    self.name
                ),
            }
        }
        let memory = stats::parse(&raw.memory);
        // A QEMU that ended while its domain runs on is followed to the new one, one not
        // found is looked for now and then: for the swap figure here, and for the daemon,
        // which takes the process found ([`VmBackend::pid`]) at its next sample for the
        // state file, reclaim, huge pages, placement and crash recovery, each checking it
        // still runs as it was.
        if let Some(finder) = &mut self.find {
            let limit = self.call_timeout / 4;
            finder
                .follow(&mut self.process, Instant::now(), limit)
                .await;
        }
        let swapped = self
            .process
            .as_mut()
            .and_then(|(_, p)| p.status(memory.rss).swapped);
        let events = self.events();
        let agent = match &mut self.agent {
            Some(retry) => {
                let mut channel = AgentCommands {
                    domain: self.domain.clone(),
                    limit: self.call_timeout / 4,
                };
                let budget = self.call_timeout / 2;
                let read = qga::read_proc(&mut channel, &mut self.agent_open);
                Some(retry.read(budget, read).await)
            }
            None => None,
        };
        let balloon = self.description.balloon.as_ref();
        let (actual, stats) = match balloon {
            Some(_) => (memory.balloon, memory.stats),
            None => (None, GuestStats::default()),
        };
        // Like QEMU's, libvirt's balloon works on the base memory: plugged memory comes
        // on top.
        let (size, virtio_mem) = match &raw.xml {
            Some(text) => {
                let (_, device) = live_virtio_mem(text)?;
                let deflate_on_oom = balloon.is_some_and(|b| b.autodeflate);
                let (size, state) =
                    self.vmem_follower
                        .follow(&device, self.base, actual, deflate_on_oom, &stats);
                (Some(size), Some(state))
            }
            None => (actual, None),
        };
        Ok(VmSample {
            ram_mappings: Vec::new(),
            configured: self.description.memory,
            balloon: size,
            stats,
            agent,
            rss: memory.rss,
            swapped,
            // The idle time a hibernation waits for.
            cpu_s: raw.cpu_ns.map(|ns| ns as f64 / 1e9),
            referenced: None,
            cold: None,
            virtio_mem,
            free_page_reporting: balloon.is_some_and(|b| b.free_page_reporting),
            fixed: Some(self.description.fixed),
            events,
        })
    }

    async fn set_balloon(&mut self, target: Bytes) -> Result<(), BackendError> {
        let has_balloon = self.description.balloon.is_some();
        if !has_balloon && self.description.virtio_mem.is_none() {
            return Err(BackendError::Protocol(
                "the domain has neither a balloon nor a virtio-mem device".into(),
            ));
        }
        let (mut update, mut balloon) = (None, target);
        if self.description.virtio_mem.is_some() {
            let d = self.domain.clone();
            let text = blocking(self.call_timeout, move || d.get_xml_desc(0)).await?;
            let (element, device) = live_virtio_mem(&text)?;
            let resize = virtio_mem::resize(target, self.base, &device);
            if resize.plug != device.requested {
                update = Some(element.update_xml(resize.plug));
            }
            // The balloon's share, relative to the base memory whatever is plugged now
            // (libvirt refuses more than the base memory).
            balloon = resize.balloon;
        }
        let d = self.domain.clone();
        blocking(self.call_timeout, move || {
            if let Some(xml) = update {
                d.update_device_flags(&xml, sys::VIR_DOMAIN_AFFECT_LIVE)?;
            }
            if has_balloon {
                d.set_memory_flags(balloon.kib(), sys::VIR_DOMAIN_AFFECT_LIVE)?;
            }
            Ok(())
        })
        .await?;
        self.target = Some(target);
        Ok(())
    }

    fn target(&self) -> Option<Bytes> {
        self.target
    }

    /// Its QEMU's, where found: at connection, or by a later scan.
    fn pid(&self) -> Option<i32> {
        self.process.as_ref().map(|(pid, _)| *pid)
    }

    /// From the domain's description as last read (`<memtune><min_guarantee>`, memtide's
    /// metadata), which follows its live XML every `RELEARN_SAMPLES` samples: bounds set
    /// with `virsh metadata --live` hold within 60 samples (two minutes at the default
    /// interval).
    fn bounds(&self) -> Option<(Option<Bytes>, Option<Bytes>)> {
        Some((self.description.min, self.description.max))
    }

    async fn save(
        &mut self,
        dir: &Path,
        then: AfterSave,
        limit: Duration,
        seal: Seal,
    ) -> Result<Saved, BackendError> {
        self.save_into(dir, then, limit, seal).await
    }
}

/// Guest agent commands through libvirt's own agent channel (`virDomainQemuAgentCommand`;
/// libvirt marks the domain tainted by `custom-ga-command` the first time).
struct AgentCommands {
    domain: Arc<Domain>,
    limit: Duration,
}

#[async_trait]
impl AgentChannel for AgentCommands {
    async fn execute(&mut self, command: &str, arguments: Value) -> Result<Value, QgaError> {
        let request = json!({"execute": command, "arguments": arguments}).to_string();
        let d = self.domain.clone();
        let seconds = self.limit.as_secs().max(1) as i32;
        let reply = tokio::time::timeout(
            self.limit,
            tokio::task::spawn_blocking(move || d.qemu_agent_command(&request, seconds, 0)),
        )
        .await
        .map_err(|_| QgaError::Timeout(self.limit))?
        .map_err(|e| QgaError::Protocol(e.to_string()))?
        .map_err(|e| QgaError::Command {
            class: format!("{:?}", e.code()),
            desc: backend_error(e).to_string(),
        })?;
        let reply: Value = serde_json::from_str(&reply)
            .map_err(|e| QgaError::Protocol(format!("invalid JSON from libvirt ({e})")))?;
        reply
            .get("return")
            .cloned()
            .ok_or_else(|| QgaError::Protocol(format!("reply without return: {reply}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Child, Command, Stdio};

    /// A process named like QEMU and started with `-uuid uuid`, once /proc shows it so: a
    /// shell, through a link named like QEMU, waiting in its own `read` (no child to
    /// outlive it; it ends when its stdin closes, the test's panic included).
    fn stand_in(link: &Path, uuid: &str) -> Child {
        let child = Command::new(link)
            .args(["-c", "read line", "-uuid", uuid])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        let comm = format!("/proc/{}/comm", child.id());
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read_to_string(&comm)
            .unwrap_or_default()
            .trim_end()
            != "qemu-stand-in"
        {
            assert!(Instant::now() < deadline, "{comm}");
            std::thread::sleep(Duration::from_millis(10));
        }
        child
    }

    /// A directory holding a link named like QEMU to /bin/sh, and a UUID of test `test`'s
    /// own (two processes claiming one hide each other).
    fn qemu_link(test: u32) -> (tempfile::TempDir, PathBuf, String) {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("qemu-stand-in");
        std::os::unix::fs::symlink("/bin/sh", &link).unwrap();
        let uuid = format!("0c5e3c1a-5b1e-4d0e-{test:04x}-{:012x}", std::process::id());
        (dir, link, uuid)
    }

    #[tokio::test]
    async fn what_a_scan_given_up_on_finds_is_taken_when_it_ends() {
        let (dir, link, uuid) = qemu_link(2);
        let mut qemu = stand_in(&link, &uuid);
        // A procfs holding the stand-in, whose `comm` hangs (a FIFO) until written.
        let proc = dir.path().join("proc");
        let own = proc.join(qemu.id().to_string());
        std::fs::create_dir_all(&own).unwrap();
        for file in ["stat", "statm", "status", "cmdline"] {
            let real = std::fs::read(format!("/proc/{}/{file}", qemu.id())).unwrap();
            std::fs::write(own.join(file), real).unwrap();
        }
        let comm = own.join("comm");
        let fifo = std::ffi::CString::new(comm.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let mut finder = Finder::new(uuid, proc);
        let (t0, limit, mut process) = (Instant::now(), Duration::from_millis(50), None);
        finder.follow(&mut process, t0, limit).await;
        assert!(process.is_none(), "given up on");
        assert!(finder.scan.is_some() && finder.next.is_some());
        // Due again while it hangs: no other scan starts.
        finder
            .follow(&mut process, t0 + LOOK_AGAIN_AFTER, limit)
            .await;
        assert!(process.is_none() && finder.scan.is_some());
        std::fs::write(&comm, "qemu-stand-in\n").unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !finder.scan.as_ref().unwrap().is_finished() {
            assert!(Instant::now() < deadline, "the scan ends");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // What it found is taken, before the next scan is due.
        finder.follow(&mut process, t0, limit).await;
        let found = process.as_ref().map(|(pid, _)| *pid as u32);
        assert_eq!(found, Some(qemu.id()));
        assert!(finder.scan.is_none() && finder.next.is_none());
        qemu.kill().unwrap();
        qemu.wait().unwrap();
    }

    #[tokio::test]
    async fn a_qemu_not_found_is_looked_for_again_and_one_that_ended_at_once() {
        let (_dir, link, uuid) = qemu_link(1);
        let mut finder = Finder::new(uuid.clone(), "/proc".into());
        let (t0, limit, mut process) = (Instant::now(), Duration::from_secs(10), None);
        let pid = |p: &Option<(i32, procfs::ProcessRss)>| p.as_ref().map(|(pid, _)| *pid as u32);
        let minute = LOOK_AGAIN_AFTER;
        finder.follow(&mut process, t0, limit).await;
        assert_eq!(pid(&process), None);
        assert_eq!(finder.next, Some((t0 + minute, minute * 2)));
        // Not found again: the wait doubles.
        finder.follow(&mut process, t0 + minute, limit).await;
        assert_eq!(finder.next, Some((t0 + minute * 3, minute * 4)));

        // It starts: found at the next scan, not before.
        let mut first = stand_in(&link, &uuid);
        let due = t0 + minute * 3;
        finder
            .follow(&mut process, due - Duration::from_secs(1), limit)
            .await;
        assert_eq!(pid(&process), None, "not scanned for before its time");
        finder.follow(&mut process, due, limit).await;
        assert_eq!(pid(&process), Some(first.id()));
        assert_eq!(finder.next, None);

        // It ends and the domain runs on in another: followed at the next sample.
        first.kill().unwrap();
        first.wait().unwrap();
        let mut second = stand_in(&link, &uuid);
        finder.follow(&mut process, due, limit).await;
        assert_eq!(pid(&process), Some(second.id()));
        second.kill().unwrap();
        second.wait().unwrap();
        finder.follow(&mut process, due, limit).await;
        assert_eq!(pid(&process), None);
        assert_eq!(finder.next, Some((due + minute, minute * 2)));
    }

    #[test]
    fn only_a_daemon_on_this_host_has_its_qemu_among_its_processes() {
        for uri in [
            "qemu:///system",
            "qemu+unix:///session?socket=/run/x/libvirt-sock",
            "qemu+ssh://root@localhost:22/system",
        ] {
            assert!(local(uri), "{uri}");
        }
        for uri in [
            "qemu+ssh://root@kvm1/system",
            "qemu+tcp://kvm1:16509/system",
            "qemu+tcp://[fe80::1]:16509/system",
            "test:///default",
            "xen:///system",
            "nonsense",
        ] {
            assert!(!local(uri), "{uri}");
        }
        for uri in [
            "qemu+tcp://127.0.0.1/system",
            "qemu+tcp://[::1]:16509/system",
        ] {
            assert!(local(uri), "{uri}");
        }
    }

    #[test]
    fn a_domain_read_again_tells_what_changed_of_its_memory() {
        let domain = |memory: u64, devices: &str| {
            xml::parse(&format!(
                "<domain><memory unit='MiB'>{memory}</memory><devices>{devices}</devices></domain>"
            ))
            .unwrap()
        };
        let balloon = "<memballoon model='virtio'/>";
        let vmem = |alias: &str, requested: u64| {
            format!(
                "<memory model='virtio-mem'><target><size unit='MiB'>512</size><node>0</node>\
                 <block unit='MiB'>2</block><requested unit='MiB'>{requested}</requested>\
                 </target><alias name='{alias}'/></memory>"
            )
        };
        let plain = domain(256, balloon);
        assert_eq!(Change::between(&plain, &plain), Change::default());
        // A DIMM attached live: <memory> grows by it.
        let memory_only = Change {
            memory: true,
            ..Change::default()
        };
        assert_eq!(Change::between(&plain, &domain(384, balloon)), memory_only);
        // A balloon where there was none.
        let none = domain(256, "<memballoon model='none'/>");
        let came = Change {
            memory: true,
            balloon_came: true,
            ..Change::default()
        };
        assert_eq!(Change::between(&none, &plain), came);
        assert_eq!(Change::between(&plain, &none), memory_only, "gone");
        // A virtio-mem device attached; the same device plugging more is no change.
        let with = domain(768, &format!("{balloon}{}", vmem("virtiomem0", 0)));
        let device = Change {
            memory: true,
            virtio_mem: true,
            ..Change::default()
        };
        assert_eq!(Change::between(&plain, &with), device);
        let plugging = domain(768, &format!("{balloon}{}", vmem("virtiomem0", 256)));
        assert_eq!(Change::between(&with, &plugging), Change::default());
        let other = domain(768, &format!("{balloon}{}", vmem("virtiomem1", 0)));
        assert_eq!(Change::between(&with, &other), device);
    }

    #[test]
    fn migrating_or_paused_domains_are_left_alone_and_those_paused_on_an_error_are_faults() {
        let busy = |why: &str| Some(BackendError::Busy(format!("{why}; left alone")));
        let running = (sys::VIR_DOMAIN_RUNNING, 1);
        assert_eq!(held(running, None), None);
        assert_eq!(
            held(running, Some((sys::VIR_DOMAIN_JOB_NONE as i32, None))),
            None
        );
        let out = Some((
            sys::VIR_DOMAIN_JOB_UNBOUNDED as i32,
            Some(sys::VIR_DOMAIN_JOB_OPERATION_MIGRATION_OUT as i32),
        ));
        assert_eq!(held(running, out), busy("the domain is migrating"));
        let dump = Some((
            sys::VIR_DOMAIN_JOB_UNBOUNDED as i32,
            Some(sys::VIR_DOMAIN_JOB_OPERATION_DUMP as i32),
        ));
        assert_eq!(held(running, dump), None, "a live dump lets the guest run");
        let paused = |reason: u32| (sys::VIR_DOMAIN_PAUSED, reason as i32);
        assert_eq!(
            held(paused(sys::VIR_DOMAIN_PAUSED_MIGRATION), None),
            busy("the domain is paused for migration")
        );
        assert_eq!(
            held(paused(sys::VIR_DOMAIN_PAUSED_USER), None),
            busy("the domain is paused by its user")
        );
        for reason in [
            sys::VIR_DOMAIN_PAUSED_SNAPSHOT,
            sys::VIR_DOMAIN_PAUSED_UNKNOWN,
        ] {
            assert_eq!(held(paused(reason), None), busy("the domain is paused"));
        }
        let e = held(paused(sys::VIR_DOMAIN_PAUSED_IOERROR), None).unwrap();
        assert!(
            matches!(&e, BackendError::Protocol(m) if m.starts_with("the domain is paused on an error")),
            "{e}"
        );
    }
}
