//! One connection to a libvirt URI, shared by every domain found on it, with the domain
//! events memtide follows. libvirt's calls block: each runs on tokio's blocking pool under
//! the call timeout, and the connection's keepalive closes it when libvirtd stops
//! answering, so that a hung daemon does not pile up blocked calls for long.

use super::LibvirtError;
use crate::procfs;
use memtide_core::{BackendError, Bytes, VmEvent};
use std::collections::HashMap;
use std::os::raw::{c_int, c_ulonglong, c_void};
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::time::timeout;
use virt::connect::Connect;
use virt::error::{Error, ErrorDomain, ErrorNumber};
use virt_sys as sys;

/// Keepalive: a probe every 5 s, the connection closed after 3 unanswered ones.
const KEEPALIVE_INTERVAL_S: i32 = 5;
const KEEPALIVE_COUNT: u32 = 3;
/// Events kept per domain between two samples; older ones are dropped.
const EVENTS_PER_DOMAIN: usize = 64;

/// Run `f` on the blocking pool within `limit`. A call that overruns keeps its thread
/// until libvirt returns (at the latest when keepalive closes the connection).
pub(crate) async fn blocking<T: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, BackendError> {
    match timeout(limit, tokio::task::spawn_blocking(f)).await {
        Err(_) => Err(BackendError::timeout(limit)),
        Ok(Err(join)) => Err(BackendError::Protocol(format!(
            "libvirt call failed: {join}"
        ))),
        Ok(Ok(result)) => result.map_err(backend_error),
    }
}

/// What a libvirt error means for a VM: the domain or the connection is gone, or the
/// call failed.
pub(crate) fn backend_error(e: Error) -> BackendError {
    let message = e.message().to_string();
    match (e.code(), e.domain()) {
        (ErrorNumber::NoDomain | ErrorNumber::OperationInvalid, _) => {
            BackendError::Disconnected(message)
        }
        (_, ErrorDomain::Rpc) => BackendError::Disconnected(message),
        _ => BackendError::Protocol(message),
    }
}

/// The domain's current job: its type and, when libvirt tells, its operation
/// (`virDomainGetJobStats`; virt 0.4's wrapper mishandles the empty parameter list that
/// libvirt returns when no job runs).
pub(crate) fn job(domain: &virt::domain::Domain) -> Result<(i32, Option<i32>), Error> {
    let mut kind: c_int = 0;
    let mut params: sys::virTypedParameterPtr = std::ptr::null_mut();
    let mut nparams: c_int = 0;
    // SAFETY: out-pointers to locals; libvirt allocates `params`, freed below.
    let ret = unsafe {
        sys::virDomainGetJobStats(domain.as_ptr(), &mut kind, &mut params, &mut nparams, 0)
    };
    if ret < 0 {
        return Err(Error::last_error());
    }
    let mut operation: c_int = 0;
    // SAFETY: `params` holds `nparams` parameters (or is null with zero of them).
    let found = unsafe {
        let found = !params.is_null()
            && sys::virTypedParamsGetInt(
                params,
                nparams,
                sys::VIR_DOMAIN_JOB_OPERATION.as_ptr(),
                &mut operation,
            ) == 1;
        sys::virTypedParamsFree(params, nparams);
        found
    };
    Ok((kind, found.then_some(operation)))
}

/// Events received for each domain memtide watches (by name) since it was last drained.
/// Events of other domains are not kept: on a host that starts and removes domains of
/// other names all day, they would pile up for as long as the connection lives.
#[derive(Default)]
pub(crate) struct Events(Mutex<EventQueues>);

#[derive(Default)]
struct EventQueues {
    queues: HashMap<String, Vec<VmEvent>>,
    /// The domains watched, each with how many of memtide's VMs watch it.
    watched: HashMap<String, usize>,
}

impl Events {
    fn lock(&self) -> std::sync::MutexGuard<'_, EventQueues> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, domain: String, event: VmEvent) {
        let mut events = self.lock();
        if !events.watched.contains_key(&domain) {
            return;
        }
        let queue = events.queues.entry(domain).or_default();
        if queue.len() < EVENTS_PER_DOMAIN {
            queue.push(event);
        }
    }

    /// Keep the domain's events from now on (those before concern an earlier life of it).
    pub(crate) fn watch(&self, domain: &str) {
        let mut events = self.lock();
        *events.watched.entry(domain.to_string()).or_default() += 1;
        events.queues.remove(domain);
    }

    /// Stop keeping the domain's events, once no VM of memtide's watches it.
    pub(crate) fn unwatch(&self, domain: &str) {
        let mut events = self.lock();
        if let Some(n) = events.watched.get_mut(domain) {
            *n -= 1;
            if *n == 0 {
                events.watched.remove(domain);
                events.queues.remove(domain);
            }
        }
    }

    /// The domain's events since the last call.
    pub(crate) fn take(&self, domain: &str) -> Vec<VmEvent> {
        self.lock().queues.remove(domain).unwrap_or_default()
    }
}

/// An open connection and its event registrations.
pub(crate) struct Session {
    pub(crate) conn: Connect,
    pub(crate) events: Arc<Events>,
    callbacks: Vec<c_int>,
}

impl Drop for Session {
    fn drop(&mut self) {
        for id in self.callbacks.drain(..) {
            // SAFETY: the connection is open and `id` was returned by its registration.
            unsafe { sys::virConnectDomainEventDeregisterAny(self.conn.as_ptr(), id) };
        }
        let _ = self.conn.close();
    }
}

impl Session {
    /// Open `uri` (blocking), turn on keepalive and register the event callbacks. The
    /// event loop must be running.
    fn open(uri: &str) -> Result<Session, Error> {
        let mut conn = Connect::open(Some(uri))?;
        if let Err(e) = conn.set_keep_alive(KEEPALIVE_INTERVAL_S, KEEPALIVE_COUNT) {
            let _ = conn.close();
            return Err(e);
        }
        let mut session = Session {
            conn,
            events: Arc::new(Events::default()),
            callbacks: Vec::new(),
        };
        session.register()?;
        Ok(session)
    }

    /// True while the connection is usable (a local check: no call to libvirtd).
    pub(crate) fn is_alive(&self) -> bool {
        self.conn.is_alive().unwrap_or(false)
    }

    fn register(&mut self) -> Result<(), Error> {
        // Each callback is passed as libvirt's generic callback type, as the C API
        // prescribes (VIR_DOMAIN_EVENT_CALLBACK); libvirt calls it with the signature of
        // its event ID.
        type Generic = unsafe extern "C" fn(sys::virConnectPtr, sys::virDomainPtr, *mut c_void);
        type Lifecycle =
            unsafe extern "C" fn(sys::virConnectPtr, sys::virDomainPtr, c_int, c_int, *mut c_void);
        type Balloon =
            unsafe extern "C" fn(sys::virConnectPtr, sys::virDomainPtr, c_ulonglong, *mut c_void);
        // SAFETY: function pointers of the same ABI, called by libvirt with the argument
        // list of their event ID.
        let callbacks: [(u32, Generic); 3] = unsafe {
            [
                (
                    sys::VIR_DOMAIN_EVENT_ID_LIFECYCLE,
                    std::mem::transmute::<Lifecycle, Generic>(on_lifecycle),
                ),
                (sys::VIR_DOMAIN_EVENT_ID_REBOOT, on_reboot as Generic),
                (
                    sys::VIR_DOMAIN_EVENT_ID_BALLOON_CHANGE,
                    std::mem::transmute::<Balloon, Generic>(on_balloon),
                ),
            ]
        };
        for (id, callback) in callbacks {
            let opaque = Arc::into_raw(self.events.clone()) as *mut c_void;
            // SAFETY: `opaque` is a leaked Arc<Events>, released by `free_events` when
            // libvirt drops the registration (or below when registering fails).
            let ret = unsafe {
                sys::virConnectDomainEventRegisterAny(
                    self.conn.as_ptr(),
                    std::ptr::null_mut(),
                    id as c_int,
                    Some(callback),
                    opaque,
                    Some(free_events),
                )
            };
            if ret < 0 {
                // SAFETY: libvirt did not take the reference.
                unsafe { drop(Arc::from_raw(opaque as *const Events)) };
                return Err(Error::last_error());
            }
            self.callbacks.push(ret);
        }
        Ok(())
    }
}

/// libvirt's default event loop, started once per process on a thread of its own; it
/// delivers domain events and runs keepalive. Must run before a connection is opened.
fn event_loop() -> Result<(), LibvirtError> {
    static STARTED: OnceLock<Result<(), String>> = OnceLock::new();
    let started = STARTED.get_or_init(|| {
        virt::event::event_register_default_impl().map_err(|e| e.to_string())?;
        std::thread::Builder::new()
            .name("libvirt-events".into())
            .spawn(|| loop {
                if let Err(e) = virt::event::event_run_default_impl() {
                    tracing::warn!("libvirt event loop: {e}");
                    std::thread::sleep(Duration::from_secs(1));
                }
            })
            .map(drop)
            .map_err(|e| e.to_string())
    });
    started.clone().map_err(LibvirtError::EventLoop)
}

/// The domain's name (`None` if libvirt has none for it).
///
/// # Safety
/// `dom` must be a domain pointer libvirt passed to a callback.
unsafe fn domain_name(dom: sys::virDomainPtr) -> Option<String> {
    let name = sys::virDomainGetName(dom);
    (!name.is_null()).then(|| {
        std::ffi::CStr::from_ptr(name)
            .to_string_lossy()
            .into_owned()
    })
}

/// # Safety
/// Called by libvirt with an `opaque` registered in [`Session::register`].
unsafe fn events<'a>(opaque: *mut c_void) -> &'a Events {
    &*(opaque as *const Events)
}

/// Lifecycle ([`lifecycle`]). Migration is not taken from events: the domain's job and
/// state are checked at every sample.
unsafe extern "C" fn on_lifecycle(
    _: sys::virConnectPtr,
    dom: sys::virDomainPtr,
    event: c_int,
    detail: c_int,
    opaque: *mut c_void,
) {
    let Some(event) = lifecycle(event as u32, detail as u32) else {
        return;
    };
    if let Some(name) = domain_name(dom) {
        events(opaque).push(name, event);
    }
}

/// What a lifecycle event says of the guest: a domain booted (or reverted to a
/// snapshot) is a new boot, one restored from its saved memory goes on where it was, one
/// stopped has shut down — unless it was saved or migrated away, its guest going on
/// elsewhere (found by an audit: a save that let the guest run on, stopped and restored
/// by libvirt, was taken for a reboot, and its balloon given back in full).
fn lifecycle(event: u32, detail: u32) -> Option<VmEvent> {
    match (event, detail) {
        (sys::VIR_DOMAIN_EVENT_STARTED, sys::VIR_DOMAIN_EVENT_STARTED_RESTORED) => {
            Some(VmEvent::Restored)
        }
        (
            sys::VIR_DOMAIN_EVENT_STARTED,
            sys::VIR_DOMAIN_EVENT_STARTED_BOOTED | sys::VIR_DOMAIN_EVENT_STARTED_FROM_SNAPSHOT,
        ) => Some(VmEvent::Reset),
        (
            sys::VIR_DOMAIN_EVENT_STOPPED,
            sys::VIR_DOMAIN_EVENT_STOPPED_SAVED | sys::VIR_DOMAIN_EVENT_STOPPED_MIGRATED,
        ) => None,
        (sys::VIR_DOMAIN_EVENT_STOPPED, _) => Some(VmEvent::Shutdown),
        _ => None,
    }
}

unsafe extern "C" fn on_reboot(_: sys::virConnectPtr, dom: sys::virDomainPtr, opaque: *mut c_void) {
    if let Some(name) = domain_name(dom) {
        events(opaque).push(name, VmEvent::Reset);
    }
}

/// The balloon reached a new size (`actual` in KiB).
unsafe extern "C" fn on_balloon(
    _: sys::virConnectPtr,
    dom: sys::virDomainPtr,
    actual: c_ulonglong,
    opaque: *mut c_void,
) {
    if let Some(name) = domain_name(dom) {
        let actual = Bytes::from_kib(actual);
        events(opaque).push(name, VmEvent::BalloonChange { actual });
    }
}

unsafe extern "C" fn free_events(opaque: *mut c_void) {
    drop(Arc::from_raw(opaque as *const Events));
}

/// The connections memtide keeps, one per URI, reopened when one dies.
pub struct Libvirt {
    uri: String,
    call_timeout: Duration,
    session: tokio::sync::Mutex<Option<Arc<Session>>>,
    /// The last scan for this host's QEMU processes.
    qemus: tokio::sync::Mutex<Option<QemuScan>>,
}

/// A scan for this host's QEMU processes.
struct QemuScan {
    /// When it began.
    started: Instant,
    /// When it ended, or was given up.
    ended: Instant,
    /// The processes by their `-uuid`; `None` where the scan was given up.
    found: Option<HashMap<String, u32>>,
}

/// How long one scan for domains' QEMU processes serves: a daemon starting connects every
/// domain at once, one scan serves them all; a domain started again later has a new one.
const QEMU_SCAN_SERVES: Duration = Duration::from_secs(2);

impl Libvirt {
    /// Connections to `uri` (opened on first use), every call bounded by `call_timeout`.
    pub fn new(uri: &str, call_timeout: Duration) -> Libvirt {
        Libvirt {
            uri: uri.to_string(),
            call_timeout,
            session: tokio::sync::Mutex::new(None),
            qemus: tokio::sync::Mutex::default(),
        }
    }

    /// The QEMU process of the domain `uuid` under the procfs mount `proc`
    /// ([`procfs::qemus_by_argument`]) for a domain known to run at `since`: from the last
    /// scan where that ended within [`QEMU_SCAN_SERVES`] and found it, or began after
    /// `since` (its QEMU was there to be found); a new scan otherwise, off the runtime and
    /// given up after the call timeout. `None` where none or two claim it, and while a
    /// scan that was given up is recent (connections waiting for this one do not each
    /// start another on a /proc that hangs).
    pub(crate) async fn qemu(&self, proc: &Path, uuid: &str, since: Instant) -> Option<u32> {
        let mut last = self.qemus.lock().await;
        if let Some(scan) = last
            .as_ref()
            .filter(|s| s.ended.elapsed() < QEMU_SCAN_SERVES)
        {
            let found = scan.found.as_ref().map(|f| f.get(uuid));
            match found {
                None => return None,
                Some(Some(pid)) => return Some(*pid),
                Some(None) if scan.started >= since => return None,
                Some(None) => {}
            }
        }
        let started = Instant::now();
        let dir = proc.to_path_buf();
        let scan = tokio::task::spawn_blocking(move || procfs::qemus_by_argument(&dir, "-uuid"));
        let found = timeout(self.call_timeout, scan)
            .await
            .ok()
            .and_then(Result::ok);
        let pid = found.as_ref().and_then(|f| f.get(uuid).copied());
        *last = Some(QemuScan {
            started,
            ended: Instant::now(),
            found,
        });
        pid
    }

    /// The open session, opening one if there is none or the last one died.
    pub(crate) async fn session(&self) -> Result<Arc<Session>, LibvirtError> {
        let mut current = self.session.lock().await;
        if let Some(s) = current.as_ref().filter(|s| s.is_alive()) {
            return Ok(s.clone());
        }
        *current = None;
        event_loop()?;
        let uri = self.uri.clone();
        let session = blocking(self.call_timeout, move || Session::open(&uri))
            .await
            .map_err(|e| LibvirtError::Connect {
                uri: self.uri.clone(),
                error: e,
            })?;
        Ok(current.insert(Arc::new(session)).clone())
    }

    /// The names of the running domains.
    pub async fn running_domains(&self) -> Result<Vec<String>, LibvirtError> {
        let session = self.session().await?;
        blocking(self.call_timeout, move || {
            let domains = session
                .conn
                .list_all_domains(sys::VIR_CONNECT_LIST_DOMAINS_ACTIVE)?;
            domains.iter().map(|d| d.get_name()).collect()
        })
        .await
        .map_err(|error| LibvirtError::Call {
            uri: self.uri.clone(),
            error,
        })
    }

    /// The connection's URI.
    pub(crate) fn uri(&self) -> &str {
        &self.uri
    }

    /// The call timeout.
    pub(crate) fn call_timeout(&self) -> Duration {
        self.call_timeout
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_domain_saved_and_restored_goes_on_where_a_booted_one_starts_afresh() {
        use sys::*;
        let e = |event, detail| lifecycle(event, detail);
        assert_eq!(
            e(VIR_DOMAIN_EVENT_STOPPED, VIR_DOMAIN_EVENT_STOPPED_SAVED),
            None
        );
        assert_eq!(
            e(VIR_DOMAIN_EVENT_STARTED, VIR_DOMAIN_EVENT_STARTED_RESTORED),
            Some(VmEvent::Restored)
        );
        for detail in [
            VIR_DOMAIN_EVENT_STARTED_BOOTED,
            VIR_DOMAIN_EVENT_STARTED_FROM_SNAPSHOT,
        ] {
            assert_eq!(e(VIR_DOMAIN_EVENT_STARTED, detail), Some(VmEvent::Reset));
        }
        for detail in [
            VIR_DOMAIN_EVENT_STARTED_MIGRATED,
            VIR_DOMAIN_EVENT_STARTED_WAKEUP,
        ] {
            assert_eq!(e(VIR_DOMAIN_EVENT_STARTED, detail), None, "goes on");
        }
        assert_eq!(
            e(VIR_DOMAIN_EVENT_STOPPED, VIR_DOMAIN_EVENT_STOPPED_MIGRATED),
            None
        );
        for detail in [
            VIR_DOMAIN_EVENT_STOPPED_SHUTDOWN,
            VIR_DOMAIN_EVENT_STOPPED_DESTROYED,
        ] {
            assert_eq!(e(VIR_DOMAIN_EVENT_STOPPED, detail), Some(VmEvent::Shutdown));
        }
        assert_eq!(e(VIR_DOMAIN_EVENT_SUSPENDED, 0), None);
    }

    #[test]
    fn only_watched_domains_events_are_kept_and_each_queue_is_bounded() {
        let events = Events::default();
        // A domain of someone else's, started and removed: nothing kept of it.
        events.push("ci-1234".into(), VmEvent::Reset);
        events.push("ci-1234".into(), VmEvent::Shutdown);
        assert!(events.lock().queues.is_empty());
        assert!(events.take("ci-1234").is_empty());

        // Watched: kept, up to the bound, and drained by each take.
        events.watch("web");
        for _ in 0..EVENTS_PER_DOMAIN + 10 {
            events.push("web".into(), VmEvent::Reset);
        }
        assert_eq!(events.take("web").len(), EVENTS_PER_DOMAIN);
        assert!(events.take("web").is_empty());

        // Watched twice (a VM connected again before the old one went): kept until both
        // have let it go; a new watch drops what came before it.
        events.watch("web");
        events.push("web".into(), VmEvent::Shutdown);
        events.unwatch("web");
        events.push("web".into(), VmEvent::Reset);
        assert_eq!(events.take("web"), [VmEvent::Shutdown, VmEvent::Reset]);
        events.push("web".into(), VmEvent::Reset);
        events.watch("web");
        assert!(
            events.take("web").is_empty(),
            "events before a watch are an earlier life's"
        );
        events.unwatch("web");
        events.unwatch("web");
        events.push("web".into(), VmEvent::Reset);
        let e = events.lock();
        assert!(e.queues.is_empty() && e.watched.is_empty());
    }
}
