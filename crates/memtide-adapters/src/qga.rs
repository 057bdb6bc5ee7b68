//! A client of the QEMU guest agent protocol (qemu-ga), used to read the guest's own
//! /proc files: `guest-file-open`, `guest-file-read` until EOF, `guest-file-close`.
//!
//! The agent answers requests in order and without ids, and its channel may hold stale
//! bytes from an earlier client, so the session starts — and restarts after any timeout —
//! with `guest-sync-delimited`: the answer is preceded by a 0xFF byte, everything before
//! it is discarded, and only the answer carrying our random token ends the sync.

use crate::framing::Framed;
use crate::procfs;
use crate::qmp::client::qapi_outcome;
use async_trait::async_trait;
use memtide_core::stats::{AgentStats, ZramSwap};
use memtide_core::Bytes;
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tokio::time::{timeout, Instant};

/// Bytes asked for per `guest-file-read`.
const CHUNK: u64 = 64 * 1024;
/// Largest file read; the /proc files read are a few KiB (meminfo, vmstat, pressure).
const MAX_FILE: usize = 256 << 10;
/// Most `guest-file-read` calls per file: a guest answering a byte at a time with `eof`
/// false must not hold the sample (#18 defect 4); files up to `MAX_FILE` need 4 chunks.
pub const MAX_READS: usize = 8;
/// Most bytes skipped while looking for the sync delimiter, and most stale replies read
/// after it: a guest streaming bytes with no 0xFF must not fill the daemon's memory
/// (#18 defect 3).
const MAX_SYNC_SKIP: usize = 64 << 10;
const MAX_STALE_REPLIES: usize = 16;
/// Longest reply line accepted (base64 of a chunk plus framing).
const MAX_LINE: usize = 2 * CHUNK as usize + 4096;

/// A guest agent failure.
#[derive(Debug, thiserror::Error)]
pub enum QgaError {
    /// The socket failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// No answer in time.
    #[error("guest agent: no reply within {} ms", .0.as_millis())]
    Timeout(Duration),
    /// The agent refused the command.
    #[error("guest agent: {class}: {desc}")]
    Command {
        /// Error class.
        class: String,
        /// The agent's description.
        desc: String,
    },
    /// The agent sent something unexpected.
    #[error("guest agent: protocol error: {0}")]
    Protocol(String),
}

/// A session with a guest agent.
pub struct GuestAgent {
    stream: Framed<UnixStream>,
    call_timeout: Duration,
    in_sync: bool,
}

impl GuestAgent {
    /// Connect to the agent's socket (QEMU's chardev for the virtio-serial port) and sync.
    pub async fn connect(path: &Path, call_timeout: Duration) -> Result<GuestAgent, QgaError> {
        let stream = timeout(call_timeout, UnixStream::connect(path))
            .await
            .map_err(|_| QgaError::Timeout(call_timeout))??;
        let mut agent = GuestAgent {
            stream: Framed::new(stream),
            call_timeout,
            in_sync: false,
        };
        agent.sync().await?;
        Ok(agent)
    }

    /// Flush stale data: send `guest-sync-delimited` with a fresh token, skip to the 0xFF
    /// sentinel, and read answers until the one echoing the token.
    async fn sync(&mut self) -> Result<(), QgaError> {
        let token = sync_token();
        let request = json!({"execute": "guest-sync-delimited", "arguments": {"id": token}});
        let limit = self.call_timeout;
        timeout(limit, async {
            self.send(&request).await?;
            for _ in 0..MAX_STALE_REPLIES {
                let skipped = self.stream.read_until(0xFF, MAX_SYNC_SKIP).await?;
                if skipped.last() != Some(&0xFF) {
                    return Err(QgaError::Protocol(if skipped.len() == MAX_SYNC_SKIP {
                        format!("no sync delimiter within {MAX_SYNC_SKIP} bytes")
                    } else {
                        "connection closed during sync".into()
                    }));
                }
                let reply = self.read_reply().await?;
                if reply.get("return").and_then(Value::as_u64) == Some(token) {
                    return Ok(());
                }
            }
            Err(QgaError::Protocol(format!(
                "no answer to the sync among {MAX_STALE_REPLIES} replies"
            )))
        })
        .await
        .map_err(|_| QgaError::Timeout(limit))??;
        self.in_sync = true;
        Ok(())
    }

    async fn send(&mut self, request: &Value) -> Result<(), QgaError> {
        let mut line = request.to_string();
        line.push('\n');
        self.stream.get_mut().write_all(line.as_bytes()).await?;
        Ok(())
    }

    async fn read_reply(&mut self) -> Result<Value, QgaError> {
        let line = self.stream.read_until(b'\n', MAX_LINE).await?;
        if line.is_empty() {
            return Err(QgaError::Protocol("connection closed".into()));
        }
        serde_json::from_slice(&line).map_err(|e| {
            QgaError::Protocol(format!(
                "invalid JSON ({e}): {}",
                String::from_utf8_lossy(&line).trim()
            ))
        })
    }

    /// Run a command and return its `return` value. A timeout leaves the stream out of
    /// sync; the next call syncs again first.
    pub async fn execute(&mut self, command: &str, arguments: Value) -> Result<Value, QgaError> {
        let mut replies = self.execute_all(&[(command, arguments)]).await?;
        replies.pop().expect("one reply per command")
    }

    /// Send `commands` in one write and read their replies, in order (the agent answers
    /// each in turn): one round trip for all of them. The outer error is the session's
    /// (it is then out of sync, and the next call syncs again first); each inner one is
    /// the agent's answer to its command.
    pub async fn execute_all(
        &mut self,
        commands: &[(&str, Value)],
    ) -> Result<Vec<Result<Value, QgaError>>, QgaError> {
        if !self.in_sync {
            self.sync().await?;
        }
        let limit = self.call_timeout;
        self.in_sync = false;
        let mut out = Vec::new();
        for (command, arguments) in commands {
            let request = json!({"execute": command, "arguments": arguments});
            serde_json::to_writer(&mut out, &request).expect("a JSON value serializes");
            out.push(b'\n');
        }
        let replies = timeout(limit, async {
            self.stream.get_mut().write_all(&out).await?;
            let mut replies = Vec::with_capacity(commands.len());
            for _ in commands {
                replies.push(self.read_reply().await?);
            }
            Ok::<_, QgaError>(replies)
        })
        .await
        .map_err(|_| QgaError::Timeout(limit))??;
        self.in_sync = true;
        Ok(replies.iter().map(reply_value).collect())
    }

    /// Read a whole guest file (not just a first chunk), closing it whatever happens
    /// (but the channel failing).
    pub async fn read_file(&mut self, path: &str) -> Result<String, QgaError> {
        read_file(self, path, &mut OpenHandles::default()).await
    }
}

#[async_trait]
impl AgentChannel for GuestAgent {
    async fn execute(&mut self, command: &str, arguments: Value) -> Result<Value, QgaError> {
        GuestAgent::execute(self, command, arguments).await
    }

    async fn execute_all(
        &mut self,
        commands: &[(&str, Value)],
    ) -> Result<Vec<Result<Value, QgaError>>, QgaError> {
        GuestAgent::execute_all(self, commands).await
    }
}

/// An agent's reply: its `return` value, or the error it carries.
pub fn reply_value(reply: &Value) -> Result<Value, QgaError> {
    match qapi_outcome(reply) {
        Some(Ok(value)) => Ok(value),
        Some(Err((class, desc))) => Err(QgaError::Command { class, desc }),
        None => Err(QgaError::Protocol(format!(
            "reply without return or error: {reply}"
        ))),
    }
}

/// A way to run guest agent commands: our own socket session, or a hypervisor manager's
/// agent channel (libvirt's `virDomainQemuAgentCommand`).
#[async_trait]
pub trait AgentChannel: Send {
    /// Run a command and return its `return` value.
    async fn execute(&mut self, command: &str, arguments: Value) -> Result<Value, QgaError>;

    /// Run `commands` in order: the outer error is the channel's (the rest are not run),
    /// each inner one the agent's refusal of its command. One after the other unless the
    /// channel can send them at once.
    async fn execute_all(
        &mut self,
        commands: &[(&str, Value)],
    ) -> Result<Vec<Result<Value, QgaError>>, QgaError> {
        let mut replies = Vec::with_capacity(commands.len());
        for (command, arguments) in commands {
            match self.execute(command, arguments.clone()).await {
                Err(e @ (QgaError::Io(_) | QgaError::Timeout(_))) => return Err(e),
                reply => replies.push(reply),
            }
        }
        Ok(replies)
    }
}

/// Guest file handles opened and not known closed. A read cut short (by its budget, or
/// its channel failing) leaves them open in the agent, a process that does not cap them:
/// a guest slow to answer would collect them until the agent could open no file. They
/// are closed before the next read.
#[derive(Debug, Default)]
pub struct OpenHandles(Vec<u64>);

impl OpenHandles {
    /// Close the handles left open: each closed, or unknown to the agent (closed
    /// already); where the channel fails, all are kept for the next time.
    async fn close(&mut self, agent: &mut impl AgentChannel) -> Result<(), QgaError> {
        if !self.0.is_empty() {
            let closes: Vec<_> = self.0.iter().map(|h| close_command(*h)).collect();
            agent.execute_all(&closes).await?;
            self.0.clear();
        }
        Ok(())
    }

    /// `handle`, opened, is owed a close.
    fn opened(&mut self, handle: u64) {
        self.0.push(handle);
    }

    /// `handle` was closed (or the agent answered its close).
    fn closed(&mut self, handle: u64) {
        self.0.retain(|h| *h != handle);
    }
}

/// The command that closes `handle`.
fn close_command(handle: u64) -> (&'static str, Value) {
    ("guest-file-close", json!({ "handle": handle }))
}

/// Read a whole guest file (not just a first chunk) with `guest-file-open`/`-read`/`-close`,
/// closing it whatever happens but the channel failing (its handle is then left in
/// `open`).
pub async fn read_file(
    agent: &mut impl AgentChannel,
    path: &str,
    open: &mut OpenHandles,
) -> Result<String, QgaError> {
    let opened = agent
        .execute("guest-file-open", json!({"path": path, "mode": "r"}))
        .await?;
    let handle = handle(opened)?;
    open.opened(handle);
    let content = read_all(agent, handle).await;
    let (command, arguments) = close_command(handle);
    let closed = agent.execute(command, arguments).await;
    if !matches!(closed, Err(QgaError::Io(_) | QgaError::Timeout(_))) {
        open.closed(handle);
    }
    let content = content?;
    closed?;
    utf8(path, content)
}

/// Read whole guest files in two round trips however many they are (where the channel
/// sends commands at once): all opened, then each read and closed. A file longer than
/// one chunk (not at its end after the first read) is read again on its own by
/// [`read_file`]. The outer error is the channel's; each inner one, its file's.
pub async fn read_files(
    agent: &mut impl AgentChannel,
    paths: &[&str],
    open: &mut OpenHandles,
) -> Result<Vec<Result<String, QgaError>>, QgaError> {
    let opens: Vec<_> = paths
        .iter()
        .map(|path| ("guest-file-open", json!({"path": path, "mode": "r"})))
        .collect();
    let handles: Vec<_> = agent.execute_all(&opens).await?;
    let handles: Vec<_> = handles.into_iter().map(|h| h.and_then(handle)).collect();
    let mut calls = Vec::new();
    for handle in handles.iter().flatten() {
        open.opened(*handle);
        calls.push(("guest-file-read", json!({"handle": handle, "count": CHUNK})));
        calls.push(close_command(*handle));
    }
    let mut replies = agent.execute_all(&calls).await?.into_iter();
    for handle in handles.iter().flatten() {
        open.closed(*handle);
    }
    let mut files = Vec::with_capacity(paths.len());
    for (path, handle) in paths.iter().zip(handles) {
        if let Err(e) = handle {
            files.push(Err(e));
            continue;
        }
        let (read, closed) = (replies.next(), replies.next());
        let (Some(read), Some(closed)) = (read, closed) else {
            return Err(QgaError::Protocol("fewer replies than commands".into()));
        };
        let file = match read.and_then(|r| chunk(&r)) {
            Err(e) => Err(e),
            Ok((content, true)) => closed.and_then(|_| utf8(path, content)),
            Ok((_, false)) => read_file(agent, path, open).await,
        };
        files.push(file);
    }
    Ok(files)
}

/// The handle `guest-file-open` returned.
fn handle(opened: Value) -> Result<u64, QgaError> {
    opened
        .as_u64()
        .ok_or_else(|| QgaError::Protocol(format!("guest-file-open returned {opened}")))
}

/// A file's content as text.
fn utf8(path: &str, content: Vec<u8>) -> Result<String, QgaError> {
    String::from_utf8(content).map_err(|_| QgaError::Protocol(format!("{path} is not UTF-8")))
}

/// The bytes a `guest-file-read` returned, and whether the file ended there (its `eof`,
/// or nothing read).
fn chunk(read: &Value) -> Result<(Vec<u8>, bool), QgaError> {
    use base64::Engine;
    let b64 = read.get("buf-b64").and_then(Value::as_str).unwrap_or("");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| QgaError::Protocol(format!("bad base64 from guest-file-read: {e}")))?;
    let eof = read.get("eof").and_then(Value::as_bool).unwrap_or(true) || bytes.is_empty();
    Ok((bytes, eof))
}

async fn read_all(agent: &mut impl AgentChannel, handle: u64) -> Result<Vec<u8>, QgaError> {
    let mut content = Vec::new();
    for _ in 0..MAX_READS {
        let r = agent
            .execute("guest-file-read", json!({"handle": handle, "count": CHUNK}))
            .await?;
        let (bytes, eof) = chunk(&r)?;
        content.extend_from_slice(&bytes);
        if content.len() > MAX_FILE {
            return Err(QgaError::Protocol(format!(
                "file larger than {MAX_FILE} bytes"
            )));
        }
        if eof {
            return Ok(content);
        }
    }
    Err(QgaError::Protocol(format!(
        "file not read in {MAX_READS} guest-file-read calls"
    )))
}

/// The guest files [`read_proc`] reads: meminfo, vmstat, (on kernels with PSI) memory
/// pressure, and its swap devices.
const PROC_FILES: [&str; 4] = [
    "/proc/meminfo",
    "/proc/vmstat",
    "/proc/pressure/memory",
    "/proc/swaps",
];

/// The guest's own /proc figures: meminfo, vmstat, (on kernels with PSI) memory pressure,
/// and what it swaps to zram, where it does (its devices' mm_stat read in two more round
/// trips).
pub async fn read_proc(
    agent: &mut impl AgentChannel,
    open: &mut OpenHandles,
) -> Result<AgentStats, String> {
    open.close(agent).await.map_err(|e| e.to_string())?;
    let files = read_files(agent, &PROC_FILES, open)
        .await
        .map_err(|e| e.to_string())?;
    let [meminfo, vmstat, psi, swaps] = <[_; 4]>::try_from(files).expect("one result per file");
    let meminfo = meminfo.map_err(|e| e.to_string())?;
    let vmstat = vmstat.map_err(|e| e.to_string())?;
    // Guest kernels without PSI have no such file: not an error.
    let psi = psi.ok();
    let zram = match swaps.map(|text| procfs::zram_swaps(&text)) {
        Ok(devices) if !devices.is_empty() => Some(zram(agent, devices, open).await),
        _ => None,
    };
    Ok(AgentStats {
        meminfo: procfs::meminfo(&meminfo).map_err(|e| format!("guest {e}"))?,
        vmstat: procfs::vmstat(&vmstat),
        psi: psi.and_then(|t| procfs::psi(&t).ok()),
        zram,
    })
}

/// The most zram devices whose mm_stat is read: a guest listing more (any number fits in
/// /proc/swaps' 256 KiB) would cost the daemon three agent commands for each, each sample.
const MAX_ZRAM_DEVICES: usize = 32;

/// The guest's zram swap `devices` (number, free swap), with what they store and the
/// memory they take from their mm_stat. Where that cannot be read (a device's file, any
/// of them when the guest lists more than [`MAX_ZRAM_DEVICES`], or the channel failing),
/// they count as storing nothing: their ratio is then assumed
/// ([`ZramSwap::ASSUMED_RATIO`]), and the figures already read are kept.
async fn zram(
    agent: &mut impl AgentChannel,
    mut devices: Vec<(u32, Bytes)>,
    open: &mut OpenHandles,
) -> ZramSwap {
    devices.sort_unstable_by_key(|(n, _)| *n);
    devices.dedup_by_key(|(n, _)| *n);
    let free = devices.iter().map(|(_, free)| *free).sum();
    if devices.len() > MAX_ZRAM_DEVICES {
        return ZramSwap {
            free,
            ..ZramSwap::default()
        };
    }
    let paths: Vec<String> = devices
        .iter()
        .map(|(n, _)| format!("/sys/block/zram{n}/mm_stat"))
        .collect();
    let paths: Vec<&str> = paths.iter().map(String::as_str).collect();
    let stats = read_files(agent, &paths, open).await.unwrap_or_default();
    let (stored, used) = stats
        .iter()
        .filter_map(|text| procfs::zram_mm_stat(text.as_ref().ok()?))
        .fold((Bytes::ZERO, Bytes::ZERO), |(s, u), (stored, used)| {
            (s + stored, u + used)
        });
    ZramSwap { free, stored, used }
}

/// Backoff between guest agent reads after failures, so that a guest without a running
/// agent costs nothing most ticks: 1 s doubling to 60 s, reset by a success.
pub struct AgentRetry {
    /// The agent, as named in messages (its socket, or the libvirt domain).
    what: String,
    retry_at: Option<Instant>,
    delay: Duration,
    last_error: String,
}

impl AgentRetry {
    /// No failure yet.
    pub fn new(what: String) -> AgentRetry {
        AgentRetry {
            what,
            retry_at: None,
            delay: Duration::from_secs(1),
            last_error: String::new(),
        }
    }

    /// `Err` with the last failure while the backoff lasts.
    pub fn ready(&self) -> Result<(), String> {
        match self.retry_at.filter(|at| Instant::now() < *at) {
            Some(at) => {
                let wait = at.saturating_duration_since(Instant::now()).as_secs();
                Err(format!("{}; retrying in {wait} s", self.last_error))
            }
            None => Ok(()),
        }
    }

    /// Read through `read` unless the backoff lasts, within `budget` for the whole read
    /// (every call, every file): a guest agent that answers slowly or dribbles its replies
    /// costs the sample at most `budget`, and its timeout feeds the backoff like any
    /// other failure (#18 defect 4).
    pub async fn read(
        &mut self,
        budget: Duration,
        read: impl std::future::Future<Output = Result<AgentStats, String>>,
    ) -> Result<AgentStats, String> {
        self.ready()?;
        let outcome = timeout(budget, read).await.unwrap_or_else(|_| {
            Err(format!(
                "no complete answer within the agent's budget of {budget:?}"
            ))
        });
        self.record(outcome)
    }

    /// Take in a read's outcome: a success resets the backoff, a failure extends it.
    fn record(&mut self, read: Result<AgentStats, String>) -> Result<AgentStats, String> {
        match read {
            Ok(stats) => {
                (self.retry_at, self.delay) = (None, Duration::from_secs(1));
                Ok(stats)
            }
            Err(e) => {
                self.last_error = format!("guest agent {}: {e}", self.what);
                self.retry_at = Some(Instant::now() + self.delay);
                self.delay = (self.delay * 2).min(Duration::from_secs(60));
                Err(self.last_error.clone())
            }
        }
    }
}

/// A token unlikely to appear in stale replies: time-derived, below 2^53 so that JSON
/// number handling never rounds it.
fn sync_token() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (nanos.as_nanos() as u64 ^ u64::from(std::process::id()) << 32) & ((1 << 53) - 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use memtide_core::Bytes;
    use tokio::io::{AsyncBufReadExt, BufReader};
    use tokio::net::UnixListener;

    /// The real Debian qemu-ga in unix-listen mode on the host, serving its own files.
    struct RealAgent {
        child: std::process::Child,
        path: std::path::PathBuf,
        _dir: tempfile::TempDir,
    }

    impl Drop for RealAgent {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    fn real_agent() -> RealAgent {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qga.sock");
        let child = std::process::Command::new("qemu-ga")
            .args(["-m", "unix-listen", "-p"])
            .arg(&path)
            .arg("-t")
            .arg(dir.path())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("qemu-ga (Debian package qemu-guest-agent; scripts/test.sh installs it)");
        for _ in 0..100 {
            if path.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        RealAgent {
            child,
            path,
            _dir: dir,
        }
    }

    const T: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn reads_whole_files_through_the_real_agent() {
        let agent = real_agent();
        let mut qga = GuestAgent::connect(&agent.path, T).await.unwrap();
        // Bigger than one chunk, with every byte value that survives UTF-8.
        let text: String = (0..200_000)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        let file = agent._dir.path().join("big.txt");
        std::fs::write(&file, &text).unwrap();
        assert_eq!(qga.read_file(file.to_str().unwrap()).await.unwrap(), text);
        let meminfo = qga.read_file("/proc/meminfo").await.unwrap();
        assert!(crate::procfs::meminfo(&meminfo).is_ok());
        let err = qga.read_file("/nonexistent").await.unwrap_err().to_string();
        assert!(
            err.starts_with("guest agent: GenericError: failed to open file '/nonexistent'"),
            "{err}"
        );
        // The session survives the error.
        assert!(qga
            .read_file("/proc/vmstat")
            .await
            .unwrap()
            .contains("pgmajfault"));
    }

    #[tokio::test]
    async fn reads_several_files_at_once_through_the_real_agent() {
        let agent = real_agent();
        let mut qga = GuestAgent::connect(&agent.path, T).await.unwrap();
        let small = agent._dir.path().join("small.txt");
        std::fs::write(&small, "some avg10=0.00\n").unwrap();
        // Longer than a chunk: read again on its own.
        let big = agent._dir.path().join("big.txt");
        let text: String = (0..150_000)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        std::fs::write(&big, &text).unwrap();
        let (small, big) = (small.to_str().unwrap(), big.to_str().unwrap());
        let descriptors = || {
            std::fs::read_dir(format!("/proc/{}/fd", agent.child.id()))
                .unwrap()
                .count()
        };
        let open_before = descriptors();
        let mut open = OpenHandles::default();
        let files = read_files(
            &mut qga,
            &[small, "/nonexistent", big, "/proc/meminfo"],
            &mut open,
        )
        .await
        .unwrap();
        assert_eq!(files[0].as_ref().unwrap(), "some avg10=0.00\n");
        let err = files[1].as_ref().unwrap_err().to_string();
        assert!(err.contains("failed to open file '/nonexistent'"), "{err}");
        assert_eq!(files[2].as_ref().unwrap(), &text);
        assert!(crate::procfs::meminfo(files[3].as_ref().unwrap()).is_ok());
        assert_eq!(descriptors(), open_before, "every file closed");
        assert!(open.0.is_empty(), "none owed a close");
        // The session is in sync after the batches.
        let stats = read_proc(&mut qga, &mut OpenHandles::default())
            .await
            .unwrap();
        assert!(stats.meminfo.total.0 > 0);
    }

    /// An agent channel serving `files` by path, running commands one at a time and
    /// counting its batches and calls.
    struct Files {
        files: Vec<(&'static str, &'static str)>,
        batches: usize,
        calls: usize,
        /// The handles closed, in order.
        closed: Vec<u64>,
        /// The batch (counted from 1) whose channel fails.
        failing: Option<usize>,
    }

    impl Files {
        fn new(files: Vec<(&'static str, &'static str)>) -> Files {
            Files {
                files,
                batches: 0,
                calls: 0,
                closed: Vec::new(),
                failing: None,
            }
        }
    }

    #[async_trait]
    impl AgentChannel for Files {
        async fn execute(&mut self, command: &str, args: Value) -> Result<Value, QgaError> {
            self.calls += 1;
            let missing = |what: &Value| QgaError::Command {
                class: "GenericError".into(),
                desc: format!("failed to open file {what}"),
            };
            Ok(match command {
                "guest-file-open" => {
                    let i = self
                        .files
                        .iter()
                        .position(|(path, _)| args["path"] == *path);
                    json!(i.ok_or_else(|| missing(&args["path"]))?)
                }
                "guest-file-read" => {
                    use base64::Engine;
                    let text = self.files[args["handle"].as_u64().unwrap() as usize].1;
                    let b64 = base64::engine::general_purpose::STANDARD.encode(text);
                    json!({"count": text.len(), "buf-b64": b64, "eof": true})
                }
                "guest-file-close" => {
                    self.closed.push(args["handle"].as_u64().unwrap());
                    json!({})
                }
                _ => json!({}),
            })
        }

        async fn execute_all(
            &mut self,
            commands: &[(&str, Value)],
        ) -> Result<Vec<Result<Value, QgaError>>, QgaError> {
            self.batches += 1;
            if self.failing == Some(self.batches) {
                return Err(QgaError::Timeout(Duration::from_millis(500)));
            }
            let mut replies = Vec::new();
            for (command, args) in commands {
                replies.push(self.execute(command, args.clone()).await);
            }
            Ok(replies)
        }
    }

    const MEMINFO: (&str, &str) = (
        "/proc/meminfo",
        "MemTotal: 100 kB\nMemFree: 50 kB\nBuffers: 0 kB\nCached: 10 kB\n",
    );
    const VMSTAT: (&str, &str) = ("/proc/vmstat", "pswpin 1\n");

    #[tokio::test]
    async fn the_proc_files_take_two_batches_of_calls() {
        // Before: twelve calls one after the other (open, read, close per file).
        let swaps = ("/proc/swaps", "Filename\tType\tSize\tUsed\tPriority\n");
        let mut agent = Files::new(vec![MEMINFO, VMSTAT, swaps]);
        let stats = read_proc(&mut agent, &mut OpenHandles::default())
            .await
            .unwrap();
        assert_eq!(stats.meminfo.total, Bytes::from_kib(100));
        assert_eq!(stats.psi, None, "no PSI file: not an error");
        assert_eq!(stats.zram, None, "no zram device among its swaps");
        assert_eq!((agent.batches, agent.calls), (2, 10));
    }

    #[tokio::test]
    async fn files_left_open_by_a_read_cut_short_are_closed_before_the_next() {
        let swaps = ("/proc/swaps", "Filename\tType\tSize\tUsed\tPriority\n");
        let mut agent = Files::new(vec![MEMINFO, VMSTAT, swaps]);
        // The channel fails after the opens, before the reads and closes.
        agent.failing = Some(2);
        let mut open = OpenHandles::default();
        assert!(read_proc(&mut agent, &mut open).await.is_err());
        assert!(agent.closed.is_empty());
        assert_eq!(open.0, [0, 1, 2], "owed a close");
        agent.failing = None;
        let stats = read_proc(&mut agent, &mut open).await.unwrap();
        assert_eq!(stats.meminfo.total, Bytes::from_kib(100));
        assert_eq!(
            agent.closed,
            [0, 1, 2, 0, 1, 2],
            "the three left, then this read's"
        );
        assert!(open.0.is_empty());
        // The channel failing at the closes keeps them owed.
        agent.failing = Some(agent.batches + 2);
        assert!(read_proc(&mut agent, &mut open).await.is_err());
        agent.failing = Some(agent.batches + 1);
        assert!(read_proc(&mut agent, &mut open).await.is_err());
        assert_eq!(open.0, [0, 1, 2]);
    }

    #[tokio::test]
    async fn a_guest_swapping_to_zram_tells_what_its_devices_store_and_take() {
        // Fedora's zram0 beside a swap file, and a second zram device whose mm_stat
        // cannot be read.
        let swaps = (
            "/proc/swaps",
            "Filename\tType\tSize\tUsed\tPriority\n\
             /dev/zram0 partition 409600 307200 100\n\
             /swapfile file 1048576 0 -2\n\
             /dev/zram1 partition 4096 0 100\n",
        );
        let mm_stat = (
            "/sys/block/zram0/mm_stat",
            "314572800 98566144 104857600 0 0 0 0 0 0\n",
        );
        let mut agent = Files::new(vec![MEMINFO, VMSTAT, swaps, mm_stat]);
        let stats = read_proc(&mut agent, &mut OpenHandles::default())
            .await
            .unwrap();
        assert_eq!(
            stats.zram,
            Some(ZramSwap {
                free: Bytes::from_kib(409600 - 307200 + 4096),
                stored: Bytes::from_mib(300),
                used: Bytes::from_mib(100),
            })
        );
        assert!((stats.zram.unwrap().ratio() - 1.0 / 3.0).abs() < 1e-9);
        // Its devices' mm_stat unreadable: what they store is unknown, the ratio assumed.
        let mut agent = Files::new(vec![MEMINFO, VMSTAT, swaps]);
        let zram = read_proc(&mut agent, &mut OpenHandles::default())
            .await
            .unwrap()
            .zram
            .unwrap();
        assert_eq!(zram.stored, Bytes::ZERO);
        assert_eq!(zram.ratio(), ZramSwap::ASSUMED_RATIO);
        // A device listed twice counts once; more devices than are read: none read.
        let twice = (
            "/proc/swaps",
            "Filename\tType\tSize\tUsed\tPriority\n\
             /dev/zram0 partition 409600 307200 100\n\
             /dev/zram0 partition 409600 307200 100\n",
        );
        let mut agent = Files::new(vec![MEMINFO, VMSTAT, twice, mm_stat]);
        let zram = read_proc(&mut agent, &mut OpenHandles::default())
            .await
            .unwrap()
            .zram
            .unwrap();
        assert_eq!(
            (zram.free, zram.stored),
            (Bytes::from_kib(102400), Bytes::from_mib(300))
        );
        let many: String = (0..=MAX_ZRAM_DEVICES)
            .map(|n| format!("/dev/zram{n} partition 1024 0 100\n"))
            .collect();
        let many = Box::leak(format!("Filename\n{many}").into_boxed_str());
        let mut agent = Files::new(vec![MEMINFO, VMSTAT, ("/proc/swaps", many), mm_stat]);
        let zram = read_proc(&mut agent, &mut OpenHandles::default())
            .await
            .unwrap()
            .zram
            .unwrap();
        assert_eq!(
            zram.free,
            Bytes::from_kib(1024 * (MAX_ZRAM_DEVICES as u64 + 1))
        );
        assert_eq!(zram.stored, Bytes::ZERO, "no mm_stat read");
        assert_eq!(agent.batches, 2, "one read of the /proc files");
        // No /proc/swaps (or no zram in it): no zram.
        let mut agent = Files::new(vec![MEMINFO, VMSTAT]);
        assert_eq!(
            read_proc(&mut agent, &mut OpenHandles::default())
                .await
                .unwrap()
                .zram,
            None
        );
    }

    #[tokio::test]
    async fn sync_discards_stale_replies() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qga.sock");
        let listener = UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            let mut s = BufReader::new(s);
            let mut line = String::new();
            s.read_line(&mut line).await.unwrap();
            let req: Value = serde_json::from_str(&line).unwrap();
            let token = req["arguments"]["id"].clone();
            // Stale bytes from an earlier client, an old sync answer, then ours.
            let out = format!("{{\"return\": 99}}\n\u{7}garbage\u{ff}{{\"return\": 7}}\n\u{ff}{{\"return\": {token}}}\n");
            let bytes: Vec<u8> = out.chars().map(|c| c as u32 as u8).collect();
            s.get_mut().write_all(&bytes).await.unwrap();
            line.clear();
            s.read_line(&mut line).await.unwrap();
            s.get_mut()
                .write_all(b"{\"return\": {\"version\": \"x\"}}\n")
                .await
                .unwrap();
        });
        let mut qga = GuestAgent::connect(&path, T).await.unwrap();
        let info = qga.execute("guest-info", json!({})).await.unwrap();
        assert_eq!(info["version"], "x");
    }

    #[tokio::test]
    async fn an_agent_streaming_bytes_without_a_delimiter_is_cut_off() {
        // A guest writes 1 MiB with no 0xFF: the sync gives up after 64 KiB, long before
        // the call timeout, instead of buffering all of it (#18 defect 3).
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qga.sock");
        let listener = UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let junk = vec![b'x'; 64 << 10];
            for _ in 0..16 {
                if s.write_all(&junk).await.is_err() {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_secs(30)).await;
        });
        let err = GuestAgent::connect(&path, T).await.err().unwrap();
        assert_eq!(
            err.to_string(),
            "guest agent: protocol error: no sync delimiter within 65536 bytes"
        );
    }

    /// An agent channel that answers every `guest-file-read` with one byte and `eof`
    /// false, counting the reads.
    struct Trickle {
        reads: usize,
    }

    #[async_trait]
    impl AgentChannel for Trickle {
        async fn execute(&mut self, command: &str, _: Value) -> Result<Value, QgaError> {
            Ok(match command {
                "guest-file-open" => json!(7),
                "guest-file-read" => {
                    self.reads += 1;
                    json!({"count": 1, "buf-b64": "eA==", "eof": false})
                }
                _ => json!({}),
            })
        }
    }

    #[tokio::test]
    async fn a_file_trickled_a_byte_at_a_time_is_given_up_after_a_few_reads() {
        // Before: 4 Mi calls (one per byte up to the 4 MiB bound) per file, per sample.
        let mut agent = Trickle { reads: 0 };
        let err = read_file(&mut agent, "/proc/meminfo", &mut OpenHandles::default())
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "guest agent: protocol error: file not read in 8 guest-file-read calls"
        );
        assert_eq!(agent.reads, MAX_READS);
    }

    /// An agent channel that takes `delay` over every call, counting them.
    struct Slow {
        delay: Duration,
        calls: usize,
    }

    #[async_trait]
    impl AgentChannel for Slow {
        async fn execute(&mut self, command: &str, _: Value) -> Result<Value, QgaError> {
            self.calls += 1;
            tokio::time::sleep(self.delay).await;
            Trickle { reads: 0 }.execute(command, Value::Null).await
        }
    }

    #[tokio::test]
    async fn a_slow_agent_costs_the_sample_its_budget_once_then_backs_off() {
        // Before: each call had its own limit and nothing bounded the whole read, which
        // the sample's deadline cancelled without ever reaching the backoff: the VM was
        // unreachable on every tick, each tick taking the full timeout (#18 defect 4).
        let mut retry = AgentRetry::new("slow".into());
        let mut agent = Slow {
            delay: Duration::from_millis(40),
            calls: 0,
        };
        let budget = Duration::from_millis(200);
        let started = Instant::now();
        let err = retry
            .read(budget, read_proc(&mut agent, &mut OpenHandles::default()))
            .await
            .unwrap_err();
        let took = started.elapsed();
        assert!(err.contains("within the agent's budget of 200ms"), "{err}");
        assert!(took < Duration::from_millis(400), "{took:?}");
        let calls = agent.calls;
        let started = Instant::now();
        let err = retry
            .read(budget, read_proc(&mut agent, &mut OpenHandles::default()))
            .await
            .unwrap_err();
        assert!(err.ends_with("retrying in 0 s"), "{err}");
        assert_eq!(agent.calls, calls, "no call while backing off");
        assert!(started.elapsed() < Duration::from_millis(50));
    }

    #[tokio::test]
    async fn a_silent_agent_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qga.sock");
        let _listener = UnixListener::bind(&path).unwrap();
        let err = GuestAgent::connect(&path, Duration::from_millis(100))
            .await
            .err()
            .unwrap();
        assert_eq!(err.to_string(), "guest agent: no reply within 100 ms");
    }
}
