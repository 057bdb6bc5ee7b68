//! The control socket: a unix socket (mode 0600) answering one JSON request per line.
//! `{"command": "status"}` returns the daemon's status; `{"command": "reload"}` reloads
//! the policy and returns `{"ok": "..."}` or `{"error": "..."}`; `{"command":
//! "snapshot", "vm": NAME, "then": "run"|"quit"}` saves a VM's memory (root and the
//! daemon's user only) and returns the snapshot's description; `{"command": "connect",
//! "vm": NAME}` has the daemon connect to a VM at once, whatever its backoff (root and the
//! daemon's user only: `memtide snapshot restore` asks it for the VM it started). Each
//! peer is checked by
//! the credentials the kernel gives for it (SO_PEERCRED): root, the daemon's own user and
//! those `[control]` allows are served; the others get an error and a log line (at most
//! one a minute, with a count of the rest). At most [`MAX_CONNECTIONS`] are served at
//! once (the others wait to be accepted), and each has [`IO_TIMEOUT`] to send its request
//! and again to take its reply: idle clients cannot hold the daemon's descriptors.

use crate::accept;
use crate::config::ControlConfig;
use crate::status::{SharedStatus, Status};
use anyhow::{bail, Context};
use memtide_core::backend::AfterSave;
use serde_json::{json, Value};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit};

/// A request the daemon itself must handle.
pub enum Request {
    /// Reload the policy; the reply says what was loaded, or why not.
    Reload(oneshot::Sender<Result<String, String>>),
    /// Save a VM's memory into the snapshot store; the reply is the snapshot's
    /// description, or why there is none.
    Save {
        /// The VM.
        vm: String,
        /// What becomes of it after.
        then: AfterSave,
        /// Takes the outcome.
        reply: oneshot::Sender<Result<Value, String>>,
    },
    /// Connect to this VM at once, its reconnection backoff forgotten (it was just
    /// started).
    Connect(String),
}

/// What a request to a daemon that stops is answered.
pub const STOPPING: &str = "the daemon is stopping";

/// Longest request accepted.
const MAX_REQUEST: u64 = 64 * 1024;

/// Most connections served at once; more wait in the listen queue.
const MAX_CONNECTIONS: usize = 64;

/// Time a client has to send its request, and again to take its reply.
const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// Refusals logged per [`REFUSAL_WINDOW`]: one, then a count.
const REFUSAL_WINDOW: Duration = Duration::from_secs(60);

/// Who may use the socket: root, its owner (the daemon's user), and those configured.
#[derive(Debug, Clone, PartialEq)]
struct Access {
    owner: u32,
    uids: Vec<u32>,
    gids: Vec<u32>,
}

impl Access {
    /// Whether a peer of user `uid` and primary group `gid` may use the socket.
    fn admits(&self, uid: u32, gid: u32) -> bool {
        uid == 0 || uid == self.owner || self.uids.contains(&uid) || self.gids.contains(&gid)
    }
}

/// Refused peers: the first of each window logged, the rest counted.
#[derive(Default)]
struct Refusals {
    window: Option<(Instant, u64)>,
}

impl Refusals {
    /// The line to log for a refusal of `who` at `now`: none when one was logged less
    /// than a window ago (that refusal is counted, and the count given with the next).
    fn line(&mut self, who: &str, now: Instant) -> Option<String> {
        if let Some((start, held)) = &mut self.window {
            if now - *start < REFUSAL_WINDOW {
                *held += 1;
                return None;
            }
        }
        let more = match self.window.map_or(0, |(_, held)| held) {
            0 => String::new(),
            n => format!(" ({n} more refused since the last such line)"),
        };
        self.window = Some((now, 0));
        Some(format!(
            "control socket: refused {who}: only root and the users and groups in \
             [control] allow_uids and allow_gids may use it{more}"
        ))
    }
}

/// A bound control socket; the file is removed when this is dropped.
pub struct ControlSocket {
    path: PathBuf,
    /// How many requests for the daemon (a save, a reload) are being answered.
    answering: Arc<watch::Sender<usize>>,
}

impl ControlSocket {
    /// Wait, at most `limit`, until every request for the daemon asked so far has been
    /// answered: the daemon is stopping, and those it answered last (a save that ended
    /// as it stopped) are still being written to their askers.
    pub async fn answered(&self, limit: Duration) {
        let mut count = self.answering.subscribe();
        let _ = tokio::time::timeout(limit, count.wait_for(|n| *n == 0)).await;
    }
}

/// A request for the daemon being answered, counted until dropped.
struct Answering(Arc<watch::Sender<usize>>);

impl Answering {
    fn begin(count: &Arc<watch::Sender<usize>>) -> Answering {
        count.send_modify(|n| *n += 1);
        Answering(count.clone())
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Bind the control socket and serve status from `status` to the peers `allowed` admits
/// (and root). Refuses to start when another daemon answers on the socket; removes a
/// stale socket file left by a dead one.
pub async fn serve(
    path: &Path,
    allowed: &ControlConfig,
    status: SharedStatus,
    requests: mpsc::Sender<Request>,
) -> anyhow::Result<ControlSocket> {
    // Others reach the socket only when some are allowed; the peer check refuses the rest.
    let shared = !(allowed.allow_uids.is_empty() && allowed.allow_gids.is_empty());
    let (dir_mode, mode) = if shared {
        (0o755, 0o666)
    } else {
        (0o700, 0o600)
    };
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(dir_mode)
            .create(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
    }
    if path.exists() {
        if UnixStream::connect(path).await.is_ok() {
            bail!(
                "{}: another memtide daemon is answering on this socket",
                path.display()
            );
        }
        std::fs::remove_file(path).with_context(|| format!("removing stale {}", path.display()))?;
    }
    let listener =
        bind_private(dir, path, mode).with_context(|| format!("binding {}", path.display()))?;
    let access = Arc::new(Access {
        owner: std::fs::metadata(path)?.uid(),
        uids: allowed.allow_uids.clone(),
        gids: allowed.allow_gids.clone(),
    });
    let refusals = Arc::new(Mutex::new(Refusals::default()));
    let answering = Arc::new(watch::Sender::new(0));
    let counted = answering.clone();
    tokio::spawn(async move {
        let answer = |((stream, _), slot): ((UnixStream, _), OwnedSemaphorePermit)| {
            let peer = stream.peer_cred();
            let owner = peer
                .as_ref()
                .is_ok_and(|c| c.uid() == 0 || c.uid() == access.owner);
            let refused = match peer {
                Ok(c) if access.admits(c.uid(), c.gid()) => None,
                Ok(c) => Some(match c.pid() {
                    Some(pid) => format!("uid {} gid {} (pid {pid})", c.uid(), c.gid()),
                    None => format!("uid {} gid {}", c.uid(), c.gid()),
                }),
                Err(e) => Some(format!("a peer whose credentials are unknown ({e})")),
            };
            if let Some(who) = &refused {
                let line = refusals
                    .lock()
                    .expect("refusals lock")
                    .line(who, Instant::now());
                if let Some(line) = line {
                    tracing::warn!("{line}");
                }
                // Told at once, its request not read, its slot given back: a refused peer
                // holds nothing (one reconnecting in a loop would otherwise keep every
                // slot, each waiting for its request, and root's requests out).
                let mut told = refusal(who).to_string().into_bytes();
                told.push(b'\n');
                let _ = stream.try_write(&told);
                return;
            }
            let (asks, counted) = (requests.clone(), counted.clone());
            let answered = answer(stream, owner, status.clone(), asks, counted);
            tokio::spawn(async move {
                answered.await;
                drop(slot);
            });
        };
        let accept = || listener.accept();
        accept::serve_capped("control socket", MAX_CONNECTIONS, accept, answer).await;
    });
    Ok(ControlSocket {
        path: path.to_path_buf(),
        answering,
    })
}

/// Bind a unix socket at `path` (in `dir`) that has `mode` from the moment it exists
/// there: it is bound in a private directory (0700) in `dir`, given its mode, then
/// renamed into place. (Changing the umask around `bind` would race with the daemon's
/// other threads, which create files too.)
fn bind_private(dir: &Path, path: &Path, mode: u32) -> std::io::Result<UnixListener> {
    let private = dir.join(format!(".memtide-bind-{}", std::process::id()));
    std::fs::DirBuilder::new().mode(0o700).create(&private)?;
    let bound = private.join("s");
    let listener = UnixListener::bind(&bound).and_then(|listener| {
        std::fs::set_permissions(&bound, std::fs::Permissions::from_mode(mode))?;
        std::fs::rename(&bound, path)?;
        Ok(listener)
    });
    let _ = std::fs::remove_file(&bound);
    let _ = std::fs::remove_dir(&private);
    listener
}

/// Read one request and answer it. Only root and the daemon's own user (`owner`) may save
/// snapshots: a save stops the guest, and a hibernation ends its QEMU.
async fn answer(
    stream: UnixStream,
    owner: bool,
    status: SharedStatus,
    requests: mpsc::Sender<Request>,
    answering: Arc<watch::Sender<usize>>,
) {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut reader = BufReader::new(tokio::io::AsyncReadExt::take(read, MAX_REQUEST));
    let read = tokio::time::timeout(IO_TIMEOUT, reader.read_line(&mut line)).await;
    if !matches!(read, Ok(Ok(_))) {
        return;
    }
    let request = serde_json::from_str::<Value>(&line);
    let asks_status = |r: &Value| r.get("command").and_then(Value::as_str) == Some("status");
    let asks_status = request.as_ref().is_ok_and(asks_status);
    // A request for the daemon is counted until its answer is written.
    let _counted = (!asks_status).then(|| Answering::begin(&answering));
    let mut out = if asks_status {
        // Written as text straight from the status: a JSON value of it first took 4.6 MiB
        // of the daemon's heap at 500 VMs (heaptrack, the load benchmark).
        serde_json::to_vec(&*status.read()).expect("status serializes")
    } else {
        reply(request, owner, &requests)
            .await
            .to_string()
            .into_bytes()
    };
    out.push(b'\n');
    let _ = tokio::time::timeout(IO_TIMEOUT, write.write_all(&out)).await;
}

/// What a peer refused (`who`) is told.
fn refusal(who: &str) -> Value {
    let message = format!(
        "permission denied: {who} may not use the memtide control socket (root and the \
         users and groups in [control] allow_uids and allow_gids may)"
    );
    json!({ "error": message })
}

/// The answer to a request other than for the status.
async fn reply(
    request: serde_json::Result<Value>,
    owner: bool,
    requests: &mpsc::Sender<Request>,
) -> Value {
    match request {
        Ok(req) => match req.get("command").and_then(Value::as_str) {
            Some("reload") => reload(requests).await,
            Some("snapshot") if !owner => json!({"error": "permission denied: only root and \
                the daemon's own user may save snapshots"}),
            Some("snapshot") => save(requests, &req).await,
            Some("connect") if !owner => json!({"error": "permission denied: only root and \
                the daemon's own user may have it connect to a VM"}),
            Some("connect") => connect(requests, &req).await,
            Some(other) => json!({"error": format!("unknown command {other:?}")}),
            None => json!({"error": "no command"}),
        },
        Err(e) => json!({"error": format!("invalid request: {e}")}),
    }
}

/// `{"command": "connect", "vm": NAME}`: hand it to the daemon, which connects to the VM
/// at its next refresh.
async fn connect(requests: &mpsc::Sender<Request>, req: &Value) -> Value {
    let Some(vm) = req.get("vm").and_then(Value::as_str) else {
        return json!({"error": "no vm"});
    };
    match requests.send(Request::Connect(vm.to_string())).await {
        Ok(()) => json!({ "ok": format!("connecting to {vm}") }),
        Err(_) => json!({ "error": STOPPING }),
    }
}

async fn reload(requests: &mpsc::Sender<Request>) -> Value {
    let (tx, rx) = oneshot::channel();
    if requests.send(Request::Reload(tx)).await.is_err() {
        return json!({ "error": STOPPING });
    }
    match rx.await {
        Ok(Ok(loaded)) => json!({"ok": loaded}),
        Ok(Err(e)) => json!({"error": e}),
        Err(_) => json!({ "error": STOPPING }),
    }
}

/// `{"command": "snapshot", "vm": NAME, "then": "run"|"quit"}`: hand the save to the
/// daemon and wait for its outcome.
async fn save(requests: &mpsc::Sender<Request>, req: &Value) -> Value {
    let Some(vm) = req.get("vm").and_then(Value::as_str) else {
        return json!({"error": "no vm"});
    };
    let then = match req.get("then") {
        None => AfterSave::Run,
        Some(t) => match serde_json::from_value(t.clone()) {
            Ok(then) => then,
            Err(_) => return json!({"error": format!("then: {t} is not \"run\" or \"quit\"")}),
        },
    };
    let (reply, rx) = oneshot::channel();
    let vm = vm.to_string();
    if requests
        .send(Request::Save { vm, then, reply })
        .await
        .is_err()
    {
        return json!({ "error": STOPPING });
    }
    match rx.await {
        Ok(Ok(snapshot)) => json!({ "ok": snapshot }),
        Ok(Err(e)) => json!({ "error": e }),
        Err(_) => json!({"error": "the daemon stopped before the save ended: whether its \
            snapshot was made, memtide snapshot list tells"}),
    }
}

/// How long a client waits for the status: the daemon serves it at once, off its loop,
/// once one of its connections is free (an idle client holds one for [`IO_TIMEOUT`]).
const STATUS_WAIT: Duration = Duration::from_secs(30);
/// How long a client waits for a reload: the daemon takes it between two ticks.
const RELOAD_WAIT: Duration = Duration::from_secs(60);
/// The longest reply a client reads: a status of 10 000 VMs is some tens of MiB; what
/// answers at the socket with more is not a memtide (found by an audit: a peer flooding
/// its reply grew `memtide status` to 6 GB in 10 s).
const MAX_REPLY_BYTES: u64 = 256 << 20;

/// Send one command to a running daemon and return its reply, waiting for it at most
/// `wait`.
async fn request(path: &Path, command: &str, wait: Duration) -> anyhow::Result<Value> {
    send(path, &json!({ "command": command }), wait).await
}

/// Whether a request failed for its daemon's socket not being reached ([`not_reached`]),
/// rather than for the daemon's answer.
pub fn unreached(e: &anyhow::Error) -> bool {
    e.downcast_ref::<Unreached>().is_some()
}

/// A daemon's socket not reached: why, for the operator.
#[derive(Debug)]
struct Unreached(String);

impl std::fmt::Display for Unreached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why the daemon's socket at `path` could not be connected to: not running, or (refused
/// by the socket's mode) running for others than this user.
fn not_reached(path: &Path, e: std::io::Error) -> anyhow::Error {
    use std::os::unix::fs::FileTypeExt;
    let found = std::fs::metadata(path).ok().map(|m| m.file_type());
    let hint = match e.kind() {
        _ if found.is_some_and(|t| t.is_dir()) => {
            "a directory: name the socket in it, as `[daemon] socket` does"
        }
        _ if found.is_some_and(|t| !t.is_socket()) => {
            "not a socket: name the daemon's control socket, `[daemon] socket`"
        }
        std::io::ErrorKind::PermissionDenied => {
            "the control socket is for root and the daemon's user (and the users and groups \
             in `[control] allow_uids` / `allow_gids`): run this as one of them, e.g. with sudo"
        }
        _ => "is `memtide run` running?",
    };
    anyhow::Error::new(e).context(Unreached(format!(
        "cannot reach memtide at {} ({hint})",
        path.display()
    )))
}

/// The daemon took a request and closed the connection without answering it.
#[derive(Debug, thiserror::Error)]
#[error(
    "the daemon closed the connection without answering (did it stop? `systemctl status memtide`)"
)]
struct Unanswered;

/// Send one request to a running daemon and return its reply, waiting for it at most
/// `wait`: a daemon that was stopped (SIGSTOP) or hangs still accepts the connection
/// (the kernel does), so without a limit a client would wait forever.
async fn send(path: &Path, request: &Value, wait: Duration) -> anyhow::Result<Value> {
    let exchange = async {
        let stream = UnixStream::connect(path)
            .await
            .map_err(|e| not_reached(path, e))?;
        let (read, mut write) = stream.into_split();
        // A peer the daemon refuses is told so at once, and the connection closed, maybe
        // before the request is written: the reply is read all the same.
        let written = write.write_all(format!("{request}\n").as_bytes()).await;
        // Bytes: the limit may cut a character in two.
        let mut line = Vec::new();
        BufReader::new(read.take(MAX_REPLY_BYTES))
            .read_until(b'\n', &mut line)
            .await?;
        if line.is_empty() {
            written?;
            return Err(anyhow::Error::new(Unanswered));
        }
        if line.len() as u64 == MAX_REPLY_BYTES && line.last() != Some(&b'\n') {
            bail!(
                "the reply from {} is longer than {} MiB: not a memtide daemon's",
                path.display(),
                MAX_REPLY_BYTES >> 20
            );
        }
        serde_json::from_slice(&line).context("invalid reply from the daemon")
    };
    tokio::time::timeout(wait, exchange)
        .await
        .unwrap_or_else(|_| {
            bail!(
                "memtide at {} did not answer within {} s: the daemon is stopped or hangs",
                path.display(),
                wait.as_secs()
            )
        })
}

/// Ask a running daemon to reload its policy; returns what it loaded.
pub async fn request_reload(path: &Path) -> anyhow::Result<String> {
    let reply = request(path, "reload", RELOAD_WAIT).await?;
    match (reply.get("ok"), reply.get("error")) {
        (Some(ok), _) => Ok(ok.as_str().unwrap_or_default().to_string()),
        (_, Some(e)) => bail!("policy not reloaded: {}", e.as_str().unwrap_or_default()),
        _ => bail!("unexpected reply from the daemon: {reply}"),
    }
}

/// Ask a running daemon to save VM `vm`'s memory; returns the snapshot's description,
/// waited for at most `wait` (the daemon bounds a save by `[snapshots] timeout_s`; the
/// caller allows that and a margin).
pub async fn request_save(
    path: &Path,
    vm: &str,
    then: AfterSave,
    wait: Duration,
) -> anyhow::Result<Value> {
    let save = json!({"command": "snapshot", "vm": vm, "then": then});
    let reply = match send(path, &save, wait).await {
        Err(e) if e.is::<Unanswered>() => bail!(
            "{e}: whether {vm} was saved, `memtide snapshot list {vm}` tells (a save under way \
             when the daemon stopped at once may end by itself)"
        ),
        reply => reply?,
    };
    match (reply.get("ok"), reply.get("error")) {
        (Some(ok), _) => Ok(ok.clone()),
        (_, Some(e)) => bail!("{vm} not saved: {}", e.as_str().unwrap_or_default()),
        _ => bail!("unexpected reply from the daemon: {reply}"),
    }
}

/// Ask a running daemon to connect to VM `vm` at once (it was just started), waiting for
/// its answer at most `wait`.
pub async fn request_connect(path: &Path, vm: &str, wait: Duration) -> anyhow::Result<()> {
    let reply = send(path, &json!({"command": "connect", "vm": vm}), wait).await?;
    match reply.get("error") {
        Some(e) => bail!("{}", e.as_str().unwrap_or_default()),
        None => Ok(()),
    }
}

/// Ask a running daemon for its status.
pub async fn request_status(path: &Path) -> anyhow::Result<Status> {
    request_status_within(path, STATUS_WAIT).await
}

/// Ask a running daemon for its status, waiting for it at most `wait`.
pub async fn request_status_within(path: &Path, wait: Duration) -> anyhow::Result<Status> {
    status_of(request(path, "status", wait).await?)
}

/// Ask a running daemon for its status as it sent it (`memtide status --json`): not read
/// into this build's [`Status`], which drops the fields a newer daemon added and makes
/// up those an older one lacks (found by the compatibility audit).
pub async fn request_status_json(path: &Path) -> anyhow::Result<Value> {
    a_status(request(path, "status", STATUS_WAIT).await?)
}

/// `reply`, if it is a status (an object naming the daemon's `version`); an error,
/// or a reply of another kind, is refused.
fn a_status(reply: Value) -> anyhow::Result<Value> {
    if let Some(e) = reply.get("error") {
        bail!("the daemon refused: {e}");
    }
    if !reply.get("version").is_some_and(Value::is_string) {
        let shown = memtide_core::guest_text::clean_to(&reply.to_string(), 200);
        bail!("unexpected reply from the daemon, not a status: {shown}");
    }
    Ok(reply)
}

/// Status `reply` read as this build's [`Status`]; where it does not read, the daemon is
/// most likely another build than this command (found by the compatibility audit: an
/// upgrade not followed by a restart said only "unknown variant").
fn status_of(reply: Value) -> anyhow::Result<Status> {
    let reply = a_status(reply)?;
    let daemon = reply["version"].as_str().unwrap_or_default().to_string();
    serde_json::from_value(reply).map_err(|e| {
        anyhow::anyhow!(
            "the daemon's status does not read in this memtide ({e}): the daemon (memtide \
             {}) and this command (memtide {}) are likely different builds, as after an \
             upgrade without a restart: `systemctl restart memtide`, or run the memtide \
             binary the daemon runs",
            memtide_core::guest_text::clean(&daemon),
            env!("CARGO_PKG_VERSION")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use inotify::{EventMask, Inotify, WatchMask};
    use std::ffi::OsStr;

    /// A control socket served to its owner alone, in a directory of its own, and where
    /// the requests for the daemon come.
    async fn served() -> (
        tempfile::TempDir,
        PathBuf,
        ControlSocket,
        mpsc::Receiver<Request>,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memtide.sock");
        let (requests, incoming) = mpsc::channel(1);
        let config = ControlConfig::default();
        let socket = serve(&path, &config, SharedStatus::default(), requests)
            .await
            .unwrap();
        (dir, path, socket, incoming)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stopping_daemon_waits_for_the_answers_it_gave_to_be_written() {
        let (_dir, path, socket, mut incoming) = served().await;
        // Nothing asked: nothing to wait for.
        socket.answered(Duration::from_secs(60)).await;
        let asked = {
            let path = path.clone();
            tokio::task::spawn_blocking(move || {
                use std::io::{BufRead, Write};
                let mut stream = std::os::unix::net::UnixStream::connect(&path).unwrap();
                stream
                    .write_all(b"{\"command\": \"snapshot\", \"vm\": \"web\"}\n")
                    .unwrap();
                let mut line = String::new();
                std::io::BufReader::new(stream)
                    .read_line(&mut line)
                    .unwrap();
                line
            })
        };
        let Some(Request::Save { reply, .. }) = incoming.recv().await else {
            panic!("no save request reached the daemon");
        };
        let socket = Arc::new(socket);
        let waiting = tokio::spawn({
            let socket = socket.clone();
            async move { socket.answered(Duration::from_secs(60)).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !waiting.is_finished(),
            "a save not answered yet is waited for"
        );
        reply.send(Err("VM web is not connected".into())).unwrap();
        waiting.await.unwrap();
        let reply: Value = serde_json::from_str(&asked.await.unwrap()).unwrap();
        assert_eq!(reply["error"], "VM web is not connected");
    }

    #[tokio::test]
    async fn a_restore_has_the_daemon_connect_to_its_vm_at_once() {
        let (_dir, path, _socket, mut incoming) = served().await;
        let asked = tokio::spawn({
            let path = path.clone();
            async move { request_connect(&path, "web", Duration::from_secs(5)).await }
        });
        let Some(Request::Connect(vm)) = incoming.recv().await else {
            panic!("no connect request reached the daemon");
        };
        assert_eq!(vm, "web");
        asked.await.unwrap().unwrap();
        // A daemon that stops: the asker is told.
        drop(incoming);
        let e = request_connect(&path, "web", Duration::from_secs(5)).await;
        assert_eq!(e.unwrap_err().to_string(), STOPPING);
    }

    #[tokio::test]
    async fn a_daemon_that_never_answers_is_said_to_be_stopped_or_hung() {
        // A stopped daemon's socket: the kernel accepts the connection, nobody reads.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memtide.sock");
        let _listener = tokio::net::UnixListener::bind(&path).unwrap();
        let wait = Duration::from_millis(200);
        let e = request(&path, "status", wait)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.ends_with("did not answer within 0 s: the daemon is stopped or hangs"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_peer_answering_without_end_is_refused_at_the_reply_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memtide.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        // Not a memtide: it floods whatever it is asked, with no line's end.
        let flood = tokio::spawn(async move {
            let (mut peer, _) = listener.accept().await.unwrap();
            // Two-byte characters after one byte: the limit cuts one in two.
            let block = "é".repeat(1 << 19).into_bytes();
            let _ = peer.write_all(b"x").await;
            while peer.write_all(&block).await.is_ok() {}
        });
        let e = request(&path, "status", Duration::from_secs(60))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.ends_with("is longer than 256 MiB: not a memtide daemon's"),
            "{e}"
        );
        flood.abort();
    }

    #[tokio::test]
    async fn the_socket_appears_with_mode_0600_under_a_permissive_umask() {
        // SAFETY: umask(2) cannot fail; it sets this test process's file creation mask.
        unsafe { libc::umask(0) };
        let dir = tempfile::tempdir().unwrap();
        let mut inotify = Inotify::init().unwrap();
        let mask = WatchMask::CREATE | WatchMask::ATTRIB | WatchMask::MOVED_TO;
        inotify.watches().add(dir.path(), mask).unwrap();
        let path = dir.path().join("memtide.sock");
        let (requests, _) = mpsc::channel(1);
        let none = ControlConfig::default();
        let _socket = serve(&path, &none, SharedStatus::default(), requests)
            .await
            .unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let mut buffer = [0; 4096];
        let events: Vec<EventMask> = inotify
            .read_events(&mut buffer)
            .unwrap()
            .filter(|e| e.name == Some(OsStr::new("memtide.sock")))
            .map(|e| e.mask)
            .collect();
        // Bound then chmod-ed in place (CREATE, ATTRIB) leaves a window with the umask's mode.
        assert_eq!(events, [EventMask::MOVED_TO]);
        let status = request_status(&path).await.unwrap();
        assert_eq!(status, Status::default());
    }

    /// Send `line` (nothing if empty) to the socket at `path` from a thread running as
    /// `uid` and `gid`, and read the reply, within 5 s. Credentials belong to a thread in
    /// the kernel, and the raw system calls (unlike libc's wrappers) change only the
    /// calling thread's.
    fn ask_as(uid: u32, gid: u32, path: &Path, line: &str) -> std::io::Result<String> {
        use std::io::{BufRead, Write};
        let (path, line) = (path.to_path_buf(), line.to_string());
        std::thread::spawn(move || {
            // SAFETY: setresgid/setresuid change this thread's credentials only; it ends
            // right after.
            unsafe {
                assert_eq!(libc::syscall(libc::SYS_setresgid, gid, gid, gid), 0);
                assert_eq!(libc::syscall(libc::SYS_setresuid, uid, uid, uid), 0);
            }
            let mut stream = std::os::unix::net::UnixStream::connect(&path)?;
            stream.set_read_timeout(Some(Duration::from_secs(5)))?;
            // A refused peer may be answered, and closed, before its request is written.
            let written = stream.write_all(line.as_bytes());
            let mut reply = String::new();
            std::io::BufReader::new(stream).read_line(&mut reply)?;
            if reply.is_empty() {
                written?;
            }
            Ok(reply)
        })
        .join()
        .unwrap()
    }

    #[test]
    fn a_refused_connection_says_who_may_use_the_socket_not_whether_memtide_runs() {
        use std::io::{Error, ErrorKind};
        let path = Path::new("/run/memtide/memtide.sock");
        let denied = format!(
            "{:#}",
            not_reached(path, Error::from(ErrorKind::PermissionDenied))
        );
        assert!(
            denied.starts_with(
                "cannot reach memtide at /run/memtide/memtide.sock (the control socket is for \
                 root and the daemon's user"
            ) && !denied.contains("running?"),
            "{denied}"
        );
        let absent = format!("{:#}", not_reached(path, Error::from(ErrorKind::NotFound)));
        assert!(absent.contains("(is `memtide run` running?)"), "{absent}");
        let dir = tempfile::tempdir().unwrap();
        let refused = Error::from(ErrorKind::ConnectionRefused);
        let dir_named = format!("{:#}", not_reached(dir.path(), refused));
        assert!(
            dir_named.contains("(a directory: name the socket in it, as `[daemon] socket` does)"),
            "{dir_named}"
        );
        let file = dir.path().join("memtide.toml");
        std::fs::write(&file, "").unwrap();
        let refused = Error::from(ErrorKind::ConnectionRefused);
        let file_named = format!("{:#}", not_reached(&file, refused));
        assert!(
            file_named.contains("(not a socket: name the daemon's control socket")
                && !file_named.contains("running?"),
            "{file_named}"
        );
    }

    /// Whether this test runs as root (changing a thread's credentials needs it).
    fn root() -> bool {
        // SAFETY: geteuid(2) cannot fail.
        unsafe { libc::geteuid() == 0 }
    }

    /// A socket path in a directory other users may traverse, for a test that asks as
    /// other users (ignored unless run as root: it fails without root).
    fn socket_others_reach() -> (tempfile::TempDir, std::path::PathBuf) {
        assert!(
            root(),
            "this test changes a thread's uid: it needs root (run it as root, or leave it \
             ignored)"
        );
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.path().join("memtide.sock");
        (dir, path)
    }

    #[tokio::test]
    #[ignore = "changes a thread's uid: needs root"]
    async fn only_root_and_the_configured_users_and_groups_are_served() {
        let (_dir, path) = socket_others_reach();
        let allowed = ControlConfig {
            allow_uids: vec![4242],
            allow_gids: vec![777],
        };
        let (requests, _) = mpsc::channel(1);
        let _socket = serve(&path, &allowed, SharedStatus::default(), requests)
            .await
            .unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o666, "others must reach the peer check");
        let status = "{\"command\": \"status\"}\n";
        let ask = |uid, gid| {
            let path = path.clone();
            tokio::task::spawn_blocking(move || ask_as(uid, gid, &path, status))
        };
        for (uid, gid) in [(0, 0), (4242, 100), (5000, 777)] {
            let reply = ask(uid, gid).await.unwrap().unwrap();
            let reply: Value = serde_json::from_str(&reply).unwrap();
            assert!(reply.get("error").is_none(), "{uid}/{gid}: {reply}");
            assert!(reply.get("counters").is_some(), "{uid}/{gid}: {reply}");
        }
        let reply = ask(65534, 65534).await.unwrap().unwrap();
        let reply: Value = serde_json::from_str(&reply).unwrap();
        let error = reply["error"].as_str().unwrap();
        assert!(
            error.starts_with("permission denied: uid 65534 gid 65534 (pid "),
            "{error}"
        );
        // A refused peer that sends nothing is told at once (not after the 10 s a request
        // may take to come), and holds no slot: root is served while it stays connected.
        let path_silent = path.clone();
        let silent = tokio::task::spawn_blocking(move || ask_as(65534, 65534, &path_silent, ""));
        let reply: Value = serde_json::from_str(&silent.await.unwrap().unwrap()).unwrap();
        assert!(reply["error"]
            .as_str()
            .unwrap()
            .starts_with("permission denied"));
        let (release, held) = std::sync::mpsc::channel::<()>();
        let (path_held, (opened, all_open)) = (path.clone(), std::sync::mpsc::channel());
        let holder = std::thread::spawn(move || {
            // SAFETY: as in `ask_as`: this thread's credentials only.
            unsafe {
                assert_eq!(libc::syscall(libc::SYS_setresgid, 65534, 65534, 65534), 0);
                assert_eq!(libc::syscall(libc::SYS_setresuid, 65534, 65534, 65534), 0);
            }
            let streams: Vec<_> = (0..=MAX_CONNECTIONS)
                .map(|_| std::os::unix::net::UnixStream::connect(&path_held).unwrap())
                .collect();
            opened.send(()).unwrap();
            let _ = held.recv();
            drop(streams);
        });
        all_open.recv().unwrap();
        let path_root = path.clone();
        let root = tokio::task::spawn_blocking(move || ask_as(0, 0, &path_root, status));
        let reply = root.await.unwrap();
        release.send(()).unwrap();
        holder.join().unwrap();
        let reply: Value = serde_json::from_str(&reply.unwrap()).unwrap();
        assert!(reply.get("counters").is_some(), "{reply}");
    }

    #[tokio::test]
    #[ignore = "changes a thread's uid: needs root"]
    async fn allowed_users_may_not_save_snapshots_and_the_owner_is_answered_by_the_daemon() {
        let (_dir, path) = socket_others_reach();
        let allowed = ControlConfig {
            allow_uids: vec![4242],
            allow_gids: vec![],
        };
        let (requests, mut incoming) = mpsc::channel(1);
        let _socket = serve(&path, &allowed, SharedStatus::default(), requests)
            .await
            .unwrap();
        let save = "{\"command\": \"snapshot\", \"vm\": \"web\", \"then\": \"quit\"}\n";
        let ask = |uid| {
            let path = path.clone();
            tokio::task::spawn_blocking(move || ask_as(uid, uid, &path, save))
        };
        let reply: Value = serde_json::from_str(&ask(4242).await.unwrap().unwrap()).unwrap();
        let error = reply["error"].as_str().unwrap();
        assert!(
            error.contains("only root and the daemon's own user"),
            "{error}"
        );
        // Root's request reaches the daemon, whose answer comes back.
        let asked = ask(0);
        let Some(Request::Save { vm, then, reply }) = incoming.recv().await else {
            panic!("no save request reached the daemon");
        };
        assert_eq!((vm.as_str(), then), ("web", AfterSave::Quit));
        reply.send(Err("VM web is not connected".into())).unwrap();
        let reply: Value = serde_json::from_str(&asked.await.unwrap().unwrap()).unwrap();
        assert_eq!(reply["error"], "VM web is not connected");
        let bad = "{\"command\": \"snapshot\", \"vm\": \"web\", \"then\": \"later\"}\n";
        let path = path.clone();
        let reply = tokio::task::spawn_blocking(move || ask_as(0, 0, &path, bad));
        let reply: Value = serde_json::from_str(&reply.await.unwrap().unwrap()).unwrap();
        assert_eq!(reply["error"], "then: \"later\" is not \"run\" or \"quit\"");
    }

    #[tokio::test]
    #[ignore = "changes a thread's uid: needs root"]
    async fn without_allowed_users_the_socket_stays_private_to_root() {
        let (_dir, path) = socket_others_reach();
        let (requests, _) = mpsc::channel(1);
        let none = ControlConfig::default();
        let _socket = serve(&path, &none, SharedStatus::default(), requests)
            .await
            .unwrap();
        let refused = tokio::task::spawn_blocking(move || ask_as(4242, 4242, &path, "{}\n"));
        // Mode 0600: the kernel refuses the connection before the peer check sees it.
        let error = refused.await.unwrap().unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::PermissionDenied);
    }

    /// A status from a daemon of another build (found by the compatibility audit: said
    /// only "unknown variant"), and what is no status.
    #[test]
    fn a_status_this_build_does_not_read_says_the_daemon_is_another_build() {
        let mut newer = serde_json::to_value(Status::default()).unwrap();
        newer["version"] = "9.9.9".into();
        newer["added_later"] = json!({"x": 1});
        assert_eq!(
            a_status(newer.clone()).unwrap(),
            newer,
            "passed on as it came"
        );
        assert_eq!(status_of(newer.clone()).unwrap().version, "9.9.9");
        newer["interval_s"] = "a new form".into();
        let e = status_of(newer.clone()).unwrap_err().to_string();
        assert!(
            e.starts_with("the daemon's status does not read in this memtide (invalid type")
                && e.contains("the daemon (memtide 9.9.9) and this command (memtide ")
                && e.contains("`systemctl restart memtide`"),
            "{e}"
        );
        assert_eq!(a_status(newer.clone()).unwrap(), newer);
        let e = status_of(json!({"error": "not allowed"})).unwrap_err();
        assert_eq!(e.to_string(), "the daemon refused: \"not allowed\"");
        assert!(a_status(json!({"error": "not allowed"})).is_err());
        let e = a_status(json!({"ok": "reloaded"})).unwrap_err().to_string();
        assert!(
            e.starts_with("unexpected reply from the daemon, not a status"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn status_json_is_the_daemons_reply_as_it_came() {
        // A daemon of another build, whose status holds a field this one does not know.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memtide.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let reply = json!({"version": "9.9.9", "added_later": {"x": 1}});
        let sent = reply.clone();
        let daemon = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let (read, mut write) = stream.into_split();
            let mut line = String::new();
            BufReader::new(read).read_line(&mut line).await.unwrap();
            assert!(line.contains("\"status\""), "{line}");
            write
                .write_all(format!("{sent}\n").as_bytes())
                .await
                .unwrap();
        });
        assert_eq!(request_status_json(&path).await.unwrap(), reply);
        daemon.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn idle_clients_are_dropped_and_at_most_64_served_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memtide.sock");
        let (requests, _) = mpsc::channel(1);
        let none = ControlConfig::default();
        let _socket = serve(&path, &none, SharedStatus::default(), requests)
            .await
            .unwrap();
        let mut idle = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            idle.push(UnixStream::connect(&path).await.unwrap());
        }
        // One more waits to be accepted until an idle client is dropped (the paused
        // clock runs on to the timeout once nothing else is ready).
        let asked = tokio::time::Instant::now();
        let status = request_status(&path).await.unwrap();
        assert_eq!(status, Status::default());
        assert_eq!(asked.elapsed(), IO_TIMEOUT, "served once a slot was free");
        let mut byte = [0; 1];
        let read = idle[0].read(&mut byte).await.unwrap();
        assert_eq!(read, 0, "the idle client was hung up on");
    }

    #[test]
    fn refusals_are_logged_once_a_minute_with_a_count() {
        let mut refusals = Refusals::default();
        let t0 = Instant::now();
        let first = refusals.line("uid 7 gid 7", t0).unwrap();
        assert!(
            first.starts_with("control socket: refused uid 7 gid 7: only root"),
            "{first}"
        );
        assert!(!first.contains("more refused"), "{first}");
        for s in 1..=3 {
            assert_eq!(
                refusals.line("uid 7 gid 7", t0 + Duration::from_secs(s)),
                None
            );
        }
        let next = refusals.line("uid 8 gid 8", t0 + REFUSAL_WINDOW).unwrap();
        assert!(
            next.contains("refused uid 8 gid 8")
                && next.ends_with(" (3 more refused since the last such line)"),
            "{next}"
        );
    }
}
