//! A QMP client over a unix socket.
//!
//! Written here rather than taken from a crate: `qapi` binds its types to one QEMU schema
//! version (memtide must speak to QEMU 7.2 through 10, whose guest statistics differ) and
//! `qmp` is a young single release. The protocol itself is newline-delimited JSON; what
//! matters is done here explicitly: every command carries an `id`, a reader task routes
//! replies by id and queues events, and every call has a timeout, so a reply that arrives
//! after its caller gave up is discarded instead of being mistaken for the next answer.

use crate::framing::{Framed, Socket};
use serde_json::{Map, Value};
use std::collections::{HashMap, VecDeque};
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::timeout;

/// Longest line accepted from QEMU; a longer one means a broken peer.
const MAX_LINE: usize = 4 << 20;
/// Events queued between two drains; beyond that the oldest are dropped, but for
/// `SHUTDOWN` and `RESET` (see [`enqueue`]).
const EVENT_QUEUE: usize = 1024;
/// The events memtide acts on (`QmpVm`); others are dropped as they arrive, so a guest
/// or QEMU flooding events holds no memory (#18 defect 6).
pub const QUEUED_EVENTS: [&str; 4] = ["RESET", "SHUTDOWN", "BALLOON_CHANGE", "DEVICE_DELETED"];
/// Largest event data kept (serialized); larger data is dropped, the event kept: with
/// the queue's length this bounds what events hold to about 4 MiB.
pub const MAX_EVENT_DATA: usize = 4096;

/// A QMP failure.
#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    /// Connecting, reading or writing failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// No reply in time.
    #[error("no reply within {} ms", .0.as_millis())]
    Timeout(Duration),
    /// The connection is closed.
    #[error("connection closed: {0}")]
    Closed(String),
    /// QEMU refused the command.
    #[error("{class}: {desc}")]
    Command {
        /// QMP error class, e.g. `GenericError`, `DeviceNotActive`.
        class: String,
        /// QEMU's description.
        desc: String,
    },
    /// QEMU sent something that is not QMP.
    #[error("protocol error: {0}")]
    Protocol(String),
}

/// An asynchronous QMP event.
#[derive(Debug, Clone, PartialEq)]
pub struct QmpEvent {
    /// Event name, e.g. `BALLOON_CHANGE`.
    pub name: String,
    /// Event data (`null` when none).
    pub data: Value,
}

/// A call's outcome: its `return` value, or why there is none.
pub type Reply = Result<Value, QmpError>;

/// State shared with the reader task.
#[derive(Default)]
struct Shared {
    pending: HashMap<u64, oneshot::Sender<Reply>>,
    /// Why the connection closed, once it has.
    closed: Option<String>,
    /// Events not drained yet, at most [`EVENT_QUEUE`] (no room held while empty).
    events: VecDeque<QmpEvent>,
}

/// A connected, negotiated QMP session.
pub struct QmpClient {
    writer: OwnedWriteHalf,
    shared: Arc<Mutex<Shared>>,
    reader: JoinHandle<()>,
    next_id: u64,
    timeout: Duration,
    peer_pid: Option<i32>,
    socket: PathBuf,
}

impl Drop for QmpClient {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl QmpClient {
    /// Connect to a QMP socket, read the greeting and negotiate capabilities, each step
    /// bounded by `call_timeout`.
    pub async fn connect(path: &Path, call_timeout: Duration) -> Result<QmpClient, QmpError> {
        let stream = timeout(call_timeout, UnixStream::connect(path))
            .await
            .map_err(|_| QmpError::Timeout(call_timeout))??;
        let peer_pid = stream.peer_cred().ok().and_then(|c| c.pid());
        let peer_pid = peer_pid.and_then(crate::procfs::known_pid);
        let (read, writer) = stream.into_split();
        let mut reader = Framed::new(read);
        let greeting = timeout(call_timeout, read_line(&mut reader))
            .await
            .map_err(|_| QmpError::Timeout(call_timeout))??
            .ok_or_else(|| QmpError::Closed("no greeting".into()))?;
        if greeting.get("QMP").is_none() {
            return Err(QmpError::Protocol(format!(
                "expected a QMP greeting, got {greeting}"
            )));
        }
        let shared = Arc::new(Mutex::new(Shared::default()));
        let reader = tokio::spawn(read_loop(reader, shared.clone()));
        let mut client = QmpClient {
            writer,
            shared,
            reader,
            next_id: 0,
            timeout: call_timeout,
            peer_pid,
            socket: path.to_path_buf(),
        };
        client.execute("qmp_capabilities", None).await?;
        Ok(client)
    }

    /// The QEMU process id, from the socket's peer credentials (`None` when they give
    /// none, or 0: a peer in another pid namespace).
    pub fn peer_pid(&self) -> Option<i32> {
        self.peer_pid
    }

    /// The QMP socket it is connected to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Whether the QEMU behind this session has ended, for one that can no longer be
    /// asked (a call timed out and closed the session), given `grace` to end: its
    /// process gone (a zombie counts as gone) or, its pid unknown, its socket refusing
    /// connections or removed.
    pub async fn peer_ended(&self, grace: Duration) -> bool {
        let by = Instant::now() + grace;
        loop {
            let ended = match self.peer_pid {
                Some(pid) => !crate::procfs::process_runs(Path::new("/proc"), pid.unsigned_abs()),
                None => UnixStream::connect(&self.socket).await.is_err_and(|e| {
                    use std::io::ErrorKind::{ConnectionRefused, NotFound};
                    matches!(e.kind(), ConnectionRefused | NotFound)
                }),
            };
            if ended || Instant::now() >= by {
                return ended;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// True once the connection has closed.
    pub fn is_closed(&self) -> bool {
        self.shared.lock().expect("qmp state lock").closed.is_some()
    }

    /// Run a command and return its `return` value, within the call timeout.
    pub async fn execute(
        &mut self,
        command: &str,
        arguments: Option<Value>,
    ) -> Result<Value, QmpError> {
        let mut replies = self.execute_all(vec![(command, arguments)]).await?;
        replies.pop().expect("one reply per command")
    }

    /// Send `commands` in one write and wait for all their replies, within one call
    /// timeout: one round trip for all of them (QEMU answers each in turn). The outer
    /// error is the session's; each inner one, QEMU's answer to its command.
    pub async fn execute_all(
        &mut self,
        commands: Vec<(&str, Option<Value>)>,
    ) -> Result<Vec<Result<Value, QmpError>>, QmpError> {
        self.send(commands, None).await
    }

    /// Hand QEMU the open file `fd` under `name` (`getfd`, the descriptor passed with
    /// SCM_RIGHTS), for a later command to use as `fd:NAME`: QEMU then writes or reads a
    /// file memtide opened, with no path or shell in between.
    pub async fn pass_fd(&mut self, name: &str, fd: BorrowedFd<'_>) -> Result<(), QmpError> {
        let args = serde_json::json!({ "fdname": name });
        let mut replies = self.send(vec![("getfd", Some(args))], Some(fd)).await?;
        replies.pop().expect("one reply per command").map(drop)
    }

    /// Hand QEMU the open file `fd` in a new fd set (`add-fd`), for a later command to
    /// open as `/dev/fdset/N` (QEMU >= 9.0's `file:` migration takes no `fd:`), marked
    /// `opaque` (`query-fdsets` shows it); the set's number.
    pub async fn add_fd(&mut self, fd: BorrowedFd<'_>, opaque: &str) -> Result<u64, QmpError> {
        let args = serde_json::json!({ "opaque": opaque });
        let mut replies = self.send(vec![("add-fd", Some(args))], Some(fd)).await?;
        let added = replies.pop().expect("one reply per command")?;
        added["fdset-id"]
            .as_u64()
            .ok_or_else(|| QmpError::Protocol(format!("no fdset-id in {added}")))
    }

    /// Send `commands`, with `fd` attached to the first byte when given, and wait for
    /// their replies (see [`QmpClient::execute_all`]).
    async fn send(
        &mut self,
        commands: Vec<(&str, Option<Value>)>,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<Vec<Result<Value, QmpError>>, QmpError> {
        let first = self.next_id + 1;
        let mut lines = Vec::new();
        let mut receivers = Vec::with_capacity(commands.len());
        {
            let mut shared = self.shared.lock().expect("qmp state lock");
            if let Some(why) = &shared.closed {
                return Err(QmpError::Closed(why.clone()));
            }
            for (command, arguments) in commands {
                self.next_id += 1;
                let (tx, rx) = oneshot::channel();
                shared.pending.insert(self.next_id, tx);
                receivers.push(rx);
                let mut request = Map::new();
                request.insert("execute".into(), command.into());
                if let Some(args) = arguments {
                    request.insert("arguments".into(), args);
                }
                request.insert("id".into(), self.next_id.into());
                serde_json::to_writer(&mut lines, &request).expect("a JSON map serializes");
                lines.push(b'\n');
            }
        }
        let limit = self.timeout;
        // Until the replies arrive, a timeout here or the caller dropping this future
        // abandons the calls: the session is closed (half a command may be in the
        // socket, a reply may come late), and the owner reconnects (#18 defect 10).
        let mut abandoned = Abandoned {
            shared: &self.shared,
            ids: first..self.next_id + 1,
            armed: true,
        };
        let outcome = timeout(limit, async {
            let mut start = 0;
            if let Some(fd) = fd {
                let stream: &UnixStream = self.writer.as_ref();
                loop {
                    stream.writable().await?;
                    match stream.try_io(Interest::WRITABLE, || send_with_fd(stream, &lines, fd)) {
                        Ok(n) => break start = n,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            self.writer.write_all(&lines[start..]).await?;
            let mut replies = Vec::with_capacity(receivers.len());
            for rx in receivers {
                let reply = rx.await;
                replies
                    .push(reply.unwrap_or_else(|_| Err(QmpError::Closed("reader stopped".into()))));
            }
            Ok(replies)
        })
        .await;
        match outcome {
            Ok(replies) => {
                abandoned.armed = false;
                replies
            }
            Err(_) => Err(QmpError::Timeout(limit)),
        }
    }

    /// The events named `name` received since the last call, taken out of those
    /// [`QmpClient::drain_events`] gives.
    pub fn take_events(&mut self, name: &str) -> usize {
        let mut shared = self.shared.lock().expect("qmp state lock");
        let before = shared.events.len();
        shared.events.retain(|e| e.name != name);
        before - shared.events.len()
    }

    /// The events received since the last call.
    pub fn drain_events(&mut self) -> Vec<QmpEvent> {
        let mut shared = self.shared.lock().expect("qmp state lock");
        shared.events.drain(..).collect()
    }
}

/// `sendmsg` of `bytes` with `fd` as SCM_RIGHTS: how a unix socket hands a descriptor over.
fn send_with_fd(stream: &UnixStream, bytes: &[u8], fd: BorrowedFd<'_>) -> std::io::Result<usize> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds = [fd];
    control.push(SendAncillaryMessage::ScmRights(&fds));
    let iov = [std::io::IoSlice::new(bytes)];
    Ok(rustix::net::sendmsg(
        stream,
        &iov,
        &mut control,
        SendFlags::NOSIGNAL,
    )?)
}

/// Closes the session when calls are abandoned before their replies (see `execute_all`).
struct Abandoned<'a> {
    shared: &'a Mutex<Shared>,
    ids: std::ops::Range<u64>,
    armed: bool,
}

impl Drop for Abandoned<'_> {
    fn drop(&mut self) {
        if self.armed {
            let mut shared = self.shared.lock().expect("qmp state lock");
            for id in self.ids.clone() {
                shared.pending.remove(&id);
            }
            shared.closed.get_or_insert_with(|| {
                "QEMU did not answer a call in time (hung, stopped or overloaded): the \
                     connection is closed and made again"
                    .into()
            });
        }
    }
}

/// Read one JSON line; `None` at end of stream.
async fn read_line<R: Socket>(reader: &mut Framed<R>) -> Result<Option<Value>, QmpError> {
    let buf = reader.read_until(b'\n', MAX_LINE).await?;
    if buf.is_empty() {
        return Ok(None);
    }
    if buf.last() != Some(&b'\n') && buf.len() == MAX_LINE {
        return Err(QmpError::Protocol(format!(
            "line longer than {MAX_LINE} bytes"
        )));
    }
    serde_json::from_slice(&buf).map(Some).map_err(|e| {
        QmpError::Protocol(format!(
            "invalid JSON ({e}): {}",
            String::from_utf8_lossy(&buf).trim()
        ))
    })
}

/// What one message from QEMU is to the session.
#[derive(Debug)]
pub enum Message {
    /// An event memtide acts on, its data dropped when larger than `MAX_EVENT_DATA`.
    Event(QmpEvent),
    /// The answer to the call with this id.
    Reply(u64, Reply),
    /// Anything else: an event memtide does not act on, a message without an id.
    Ignored,
}

/// A command's outcome in a QAPI reply (QMP's and the guest agent's): its `return`
/// value, else its `error`'s class and description; `None` with neither.
pub fn qapi_outcome(reply: &Value) -> Option<Result<Value, (String, String)>> {
    match (reply.get("return"), reply.get("error")) {
        (Some(value), _) => Some(Ok(value.clone())),
        (None, Some(e)) => {
            let text = |key: &str, absent: &str| {
                e.get(key)
                    .and_then(Value::as_str)
                    .unwrap_or(absent)
                    .to_string()
            };
            Some(Err((text("class", "Unknown"), text("desc", ""))))
        }
        (None, None) => None,
    }
}

/// Classify one message from QEMU (a parsed line).
pub fn message(msg: &Value) -> Message {
    if let Some(name) = msg.get("event").and_then(Value::as_str) {
        if !QUEUED_EVENTS.contains(&name) {
            return Message::Ignored;
        }
        let data = msg
            .get("data")
            .filter(|d| d.to_string().len() <= MAX_EVENT_DATA)
            .cloned()
            .unwrap_or(Value::Null);
        return Message::Event(QmpEvent {
            name: name.to_string(),
            data,
        });
    }
    let Some(id) = msg.get("id").and_then(Value::as_u64) else {
        return Message::Ignored;
    };
    let reply = match qapi_outcome(msg) {
        Some(Ok(value)) => Ok(value),
        Some(Err((class, desc))) => Err(QmpError::Command { class, desc }),
        None => Err(QmpError::Protocol(format!(
            "reply without return or error: {msg}"
        ))),
    };
    Message::Reply(id, reply)
}

/// Queue `event` in `events`, at most [`EVENT_QUEUE`] long. A full queue means nobody
/// drained for a long time: the oldest event other than a `SHUTDOWN` or `RESET` is
/// dropped to make room, for these tell how the VM ended (a `SHUTDOWN` lost would have
/// a VM that was shut down judged crashed). A queue of nothing else drops its oldest for
/// one of them, and drops a new other event.
fn enqueue(events: &mut VecDeque<QmpEvent>, event: QmpEvent) {
    let kept = |e: &QmpEvent| matches!(e.name.as_str(), "SHUTDOWN" | "RESET");
    if events.len() >= EVENT_QUEUE {
        match events.iter().position(|e| !kept(e)) {
            Some(i) => drop(events.remove(i)),
            None if kept(&event) => drop(events.pop_front()),
            None => return,
        }
    }
    events.push_back(event);
}

/// Route replies to their callers and events to the queue until the connection ends.
async fn read_loop<R: Socket>(mut reader: Framed<R>, shared: Arc<Mutex<Shared>>) {
    let why = loop {
        let msg = match read_line(&mut reader).await {
            Ok(Some(msg)) => msg,
            Ok(None) => break "end of stream".to_string(),
            Err(e) => break e.to_string(),
        };
        let (id, reply) = match message(&msg) {
            Message::Event(event) => {
                enqueue(&mut shared.lock().expect("qmp state lock").events, event);
                continue;
            }
            Message::Reply(id, reply) => (id, reply),
            Message::Ignored => {
                tracing::debug!(%msg, "qmp message ignored");
                continue;
            }
        };
        let sender = shared.lock().expect("qmp state lock").pending.remove(&id);
        if let Some(tx) = sender {
            let _ = tx.send(reply);
        }
    };
    let mut shared = shared.lock().expect("qmp state lock");
    for (_, tx) in shared.pending.drain() {
        let _ = tx.send(Err(QmpError::Closed(why.clone())));
    }
    shared.closed = Some(why);
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;
    use tokio::io::{AsyncBufReadExt, BufReader};
    use tokio::net::UnixListener;

    /// Answer from a scripted server that makes it hang up.
    pub(crate) const HANG_UP: &str = "hang up";

    /// A scripted QMP server: greets, then answers each request with `respond`'s lines
    /// (closing the connection at [`HANG_UP`]).
    pub(crate) async fn serve(
        respond: impl Fn(Value) -> Vec<String> + Send + 'static,
    ) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qmp.sock");
        let listener = UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let (r, mut w) = stream.into_split();
            let mut r = BufReader::new(r);
            w.write_all(
                b"{\"QMP\": {\"version\": {\"qemu\": {\"major\": 7}}, \"capabilities\": []}}\n",
            )
            .await
            .unwrap();
            let mut line = String::new();
            while r.read_line(&mut line).await.unwrap() > 0 {
                let req: Value = serde_json::from_str(&line).unwrap();
                for out in respond(req) {
                    if out == HANG_UP {
                        return;
                    }
                    w.write_all(out.as_bytes()).await.unwrap();
                    w.write_all(b"\n").await.unwrap();
                }
                line.clear();
            }
        });
        (dir, path)
    }

    pub(crate) fn ok(req: &Value, ret: Value) -> String {
        json!({"return": ret, "id": req["id"]}).to_string()
    }

    const T: Duration = Duration::from_millis(500);

    #[tokio::test]
    async fn negotiates_and_routes_replies_around_events() {
        let (_d, path) = serve(|req| match req["execute"].as_str().unwrap() {
            "query-balloon" => vec![
                r#"{"event": "BALLOON_CHANGE", "data": {"actual": 268435456}, "timestamp": {"seconds": 1, "microseconds": 2}}"#.into(),
                ok(&req, json!({"actual": 268435456})),
            ],
            _ => vec![ok(&req, json!({}))],
        })
        .await;
        let mut c = QmpClient::connect(&path, T).await.unwrap();
        let r = c.execute("query-balloon", None).await.unwrap();
        assert_eq!(r["actual"], 268435456);
        let ev = c.drain_events();
        assert_eq!(
            ev,
            vec![QmpEvent {
                name: "BALLOON_CHANGE".into(),
                data: json!({"actual": 268435456})
            }]
        );
        assert!(c.drain_events().is_empty());
    }

    #[tokio::test]
    async fn events_memtide_does_not_use_and_huge_event_data_hold_no_memory() {
        // A flood of unused events (the audit's 200 of 4 MiB held 815 MiB until the next
        // sample; 20 of 256 KiB here) and a BALLOON_CHANGE with a huge payload: only the
        // events memtide acts on are queued, without their oversized data.
        let big = "x".repeat(256 << 10);
        let (_d, path) = serve(move |req| {
            if req["execute"] != "query-status" {
                return vec![ok(&req, json!({}))];
            }
            let mut out: Vec<String> = (0..20)
                .map(|_| json!({"event": "VSERPORT_CHANGE", "data": {"junk": big}}).to_string())
                .collect();
            out.push(
                json!({"event": "BALLOON_CHANGE", "data": {"actual": 1, "junk": big}}).to_string(),
            );
            out.push(json!({"event": "RESET", "data": {"guest": true}}).to_string());
            out.push(ok(&req, json!({})));
            out
        })
        .await;
        let mut c = QmpClient::connect(&path, Duration::from_secs(10))
            .await
            .unwrap();
        c.execute("query-status", None).await.unwrap();
        let ev = c.drain_events();
        let names: Vec<&str> = ev.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["BALLOON_CHANGE", "RESET"]);
        assert_eq!(ev[0].data, Value::Null, "oversized data dropped");
        assert_eq!(ev[1].data, json!({"guest": true}));
    }

    #[test]
    fn a_full_event_queue_keeps_every_shutdown_and_reset_and_drops_older_events() {
        let event = |name: &str, n: u64| QmpEvent {
            name: name.into(),
            data: json!({ "n": n }),
        };
        let mut q = VecDeque::new();
        enqueue(&mut q, event("RESET", 0));
        for n in 1..EVENT_QUEUE as u64 {
            enqueue(&mut q, event("BALLOON_CHANGE", n));
        }
        assert_eq!(q.len(), EVENT_QUEUE);
        // Full: the final SHUTDOWN takes the oldest BALLOON_CHANGE's place, the RESET stays.
        enqueue(&mut q, event("SHUTDOWN", 9999));
        assert_eq!(q.len(), EVENT_QUEUE);
        assert_eq!(q.front(), Some(&event("RESET", 0)));
        assert_eq!(q[1], event("BALLOON_CHANGE", 2), "the oldest other dropped");
        assert_eq!(q.back(), Some(&event("SHUTDOWN", 9999)));
        // A newer balloon value replaces an older one too.
        enqueue(&mut q, event("BALLOON_CHANGE", 10_000));
        assert_eq!(q[1], event("BALLOON_CHANGE", 3));
        assert_eq!(q.back(), Some(&event("BALLOON_CHANGE", 10_000)));
        // A queue of nothing but SHUTDOWN/RESET keeps the newest of them.
        let mut q: VecDeque<_> = (0..EVENT_QUEUE as u64).map(|n| event("RESET", n)).collect();
        enqueue(&mut q, event("BALLOON_CHANGE", 1));
        assert_eq!(q.back(), Some(&event("RESET", EVENT_QUEUE as u64 - 1)));
        enqueue(&mut q, event("SHUTDOWN", 1));
        assert_eq!(
            (q.len(), q.front()),
            (EVENT_QUEUE, Some(&event("RESET", 1)))
        );
        assert_eq!(q.back(), Some(&event("SHUTDOWN", 1)));
    }

    #[tokio::test]
    async fn command_errors_carry_class_and_description() {
        let (_d, path) = serve(|req| match req["execute"].as_str().unwrap() {
            "qmp_capabilities" => vec![ok(&req, json!({}))],
            _ => vec![json!({"error": {"class": "DeviceNotActive", "desc": "No balloon device has been activated"}, "id": req["id"]}).to_string()],
        })
        .await;
        let mut c = QmpClient::connect(&path, T).await.unwrap();
        let err = c.execute("query-balloon", None).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "DeviceNotActive: No balloon device has been activated"
        );
    }

    #[tokio::test]
    async fn commands_sent_at_once_get_their_own_replies() {
        // The server answers the first command only once the second has come, and in
        // reverse order: a client that waited for each reply before sending the next
        // command would time out.
        let (_d, path) = serve(|req| match req["execute"].as_str().unwrap() {
            "query-balloon" => vec![],
            "qom-get" => {
                let first = json!({"id": req["id"].as_u64().unwrap() - 1});
                vec![
                    json!({"error": {"class": "GenericError", "desc": "no such property"}, "id": req["id"]}).to_string(),
                    ok(&first, json!({"actual": 1024})),
                ]
            }
            _ => vec![ok(&req, json!({}))],
        })
        .await;
        let mut c = QmpClient::connect(&path, T).await.unwrap();
        let calls = vec![
            ("query-balloon", None),
            ("qom-get", Some(json!({"path": "/x", "property": "y"}))),
        ];
        let mut replies = c.execute_all(calls).await.unwrap().into_iter();
        assert_eq!(replies.next().unwrap().unwrap(), json!({"actual": 1024}));
        let err = replies.next().unwrap().unwrap_err();
        assert_eq!(err.to_string(), "GenericError: no such property");
        assert!(!c.is_closed(), "a refused command leaves the session open");
    }

    #[tokio::test]
    async fn a_call_that_times_out_closes_the_session() {
        // The first query-balloon is never answered: the session is closed (a late reply
        // or half a command may be in the socket), so the next call fails at once and the
        // owner reconnects (#18 defect 10: before, every tick waited the full timeout).
        let (_d, path) = serve(|req| {
            match (
                req["execute"].as_str().unwrap(),
                req["id"].as_u64().unwrap(),
            ) {
                ("qmp_capabilities", _) => vec![ok(&req, json!({}))],
                ("query-balloon", 2) => vec![],
                (_, id) => vec![
                    json!({"return": {"actual": 1}, "id": id - 1}).to_string(),
                    ok(&req, json!({"actual": 2})),
                ],
            }
        })
        .await;
        let mut c = QmpClient::connect(&path, T).await.unwrap();
        assert!(matches!(
            c.execute("query-balloon", None).await,
            Err(QmpError::Timeout(_))
        ));
        let started = std::time::Instant::now();
        let err = c.execute("query-balloon", None).await.unwrap_err();
        assert!(matches!(err, QmpError::Closed(_)), "{err}");
        assert!(started.elapsed() < T, "no second wait for the timeout");
        assert!(c.shared.lock().unwrap().pending.is_empty());
    }

    #[tokio::test]
    async fn a_call_cancelled_by_its_caller_leaves_nothing_behind() {
        // The daemon's own deadline drops the call's future: no pending entry stays, and
        // the session is closed rather than reused with half a command in the socket.
        let (_d, path) = serve(|req| match req["execute"].as_str().unwrap() {
            "qmp_capabilities" => vec![ok(&req, json!({}))],
            _ => vec![],
        })
        .await;
        let mut c = QmpClient::connect(&path, Duration::from_secs(10))
            .await
            .unwrap();
        let cancelled = timeout(Duration::from_millis(50), c.execute("balloon", None)).await;
        assert!(cancelled.is_err(), "the outer deadline fired");
        assert!(c.shared.lock().unwrap().pending.is_empty());
        let err = c.execute("query-balloon", None).await.unwrap_err();
        assert!(matches!(err, QmpError::Closed(_)), "{err}");
    }

    #[tokio::test]
    async fn a_silent_peer_times_out_at_greeting() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qmp.sock");
        let _listener = UnixListener::bind(&path).unwrap(); // accepts in backlog, never speaks
        let err = QmpClient::connect(&path, Duration::from_millis(100))
            .await
            .err()
            .unwrap();
        assert_eq!(err.to_string(), "no reply within 100 ms");
    }

    #[tokio::test]
    async fn a_closed_connection_fails_calls_and_is_reported() {
        let (_d, path) = serve(|req| match req["execute"].as_str().unwrap() {
            "qmp_capabilities" => vec![ok(&req, json!({}))],
            _ => vec![HANG_UP.into()],
        })
        .await;
        let mut c = QmpClient::connect(&path, T).await.unwrap();
        let err = c.execute("query-status", None).await.unwrap_err();
        assert!(matches!(err, QmpError::Closed(_)), "{err}");
        assert!(c.is_closed());
        assert!(matches!(
            c.execute("query-status", None).await,
            Err(QmpError::Closed(_))
        ));
    }

    #[tokio::test]
    async fn garbage_from_the_peer_is_a_protocol_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qmp.sock");
        let listener = UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            s.write_all(b"hello, I am not QEMU\n").await.unwrap();
            tokio::time::sleep(Duration::from_secs(1)).await;
        });
        let err = QmpClient::connect(&path, T)
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(err.starts_with("protocol error: invalid JSON"), "{err}");
    }
}
