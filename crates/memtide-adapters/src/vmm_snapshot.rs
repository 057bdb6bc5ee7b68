//! Memory snapshots through a VMM's own API (Firecracker, Cloud Hypervisor): the order a
//! save follows whatever the VMM — pause, write the snapshot, resume or quit, seal —, the
//! mark of a guest a save paused (`paused-by-save`) and its resume at the next connection
//! where the save was cut short, and a VMM process started by the VM's launch command for
//! a restore.
//!
//! The VMM writes the snapshot's files itself, by path, into the store's directory for
//! it: it must reach that path (not from a jail) with the right to create files there.

use crate::api_socket::ApiSocket;
use async_trait::async_trait;
use hyper::Method;
use memtide_core::backend::{AfterSave, Saved, Seal};
use memtide_core::BackendError;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How often a starting VMM's API socket is tried.
const POLL: Duration = Duration::from_millis(10);

/// What a VMM does for a save, each step one or two API calls.
#[async_trait]
pub trait SnapshotSteps: Send {
    /// How the state is written, for the snapshot's description.
    fn mechanism(&self) -> &'static str;
    /// Why the VMM's process cannot be made to quit (a hibernation), when it cannot.
    fn cannot_quit(&self) -> Option<String>;
    /// The guest's state now, in the VMM's words: "Running", "Paused", or another
    /// (Firecracker's "Not started", Cloud Hypervisor's "Created" or "Shutdown").
    async fn state(&mut self) -> Result<String, BackendError>;
    /// Whether the guest runs now.
    async fn running(&mut self) -> Result<bool, BackendError> {
        Ok(self.state().await? == "Running")
    }
    /// Whether the guest is paused now (neither running, nor shut down or not started).
    async fn paused(&mut self) -> Result<bool, BackendError> {
        Ok(self.state().await? == "Paused")
    }
    /// Pause the guest.
    async fn pause(&mut self) -> Result<(), BackendError>;
    /// Let the guest run again.
    async fn resume(&mut self) -> Result<(), BackendError>;
    /// Write the paused guest's snapshot into the files of `dir`, within `limit`.
    async fn write(&mut self, dir: &Path, limit: Duration) -> Result<(), BackendError>;
    /// End the VMM's process (the guest paused, its snapshot sealed).
    async fn quit(&mut self) -> Result<(), BackendError>;
    /// Whether the VMM's process has ended (its API socket refuses connections or is
    /// gone).
    async fn ended(&mut self) -> bool;
    /// The process serving the API socket now, as its pid and start time (`"PID START"`),
    /// where its peer credentials and /proc tell them.
    async fn serving(&mut self) -> Option<String>;
    /// A save left the guest paused, marked ([`PAUSED_MARK`]), for `why`: the connection
    /// is to be made again, which resumes it.
    fn left_paused(&mut self, why: String);
}

/// What a connection to a VM knows of saves and restores of memtide's cut short: what it
/// resumed as it connected, and why it is to be made again (a save left the guest
/// stopped, which a connection resumes). Kept by each connector's VM.
#[derive(Debug, Default)]
pub struct CutShort {
    resumed: Option<String>,
    reconnect: Option<String>,
}

impl CutShort {
    /// The connection resumed a guest a save or restore left stopped: `done`, said.
    pub fn resumed(done: Option<String>) -> CutShort {
        CutShort {
            resumed: done,
            reconnect: None,
        }
    }

    /// What the connection resumed, taken once ([`VmBackend::resumed_at_connection`]).
    ///
    /// [`VmBackend::resumed_at_connection`]: memtide_core::backend::VmBackend::resumed_at_connection
    pub fn take_resumed(&mut self) -> Option<String> {
        self.resumed.take()
    }

    /// A save left the guest stopped, for `why`: the connection is to be made again.
    pub fn left_stopped(&mut self, why: String) {
        self.reconnect = Some(why);
    }

    /// `Err` (disconnected: the fleet makes the connection again) once a save left the
    /// guest stopped; a VM's sample asks first.
    pub fn check(&self) -> Result<(), BackendError> {
        match &self.reconnect {
            Some(why) => Err(BackendError::Disconnected(format!(
                "{why}: its connection is made again to resume it"
            ))),
            None => Ok(()),
        }
    }
}

/// The file, in the VM's directory of the store (beside its snapshots' directories),
/// that says a save paused the guest of the VMM process it names (`"PID START"`: its pid
/// and start time). It is there from the pause until the guest runs again or the process
/// has ended: a save cut short (memtide killed, or its call given up on) leaves it, and
/// the VM's next connection resumes that guest ([`resume_after_cut_short_save`]). A VMM
/// whose process memtide cannot tell (another pid namespace) is not marked.
pub const PAUSED_MARK: &str = "paused-by-save";

/// A save's mark of the guest it paused ([`PAUSED_MARK`]).
struct Mark {
    path: PathBuf,
    /// Written by this save, and not removed yet.
    set: bool,
}

impl Mark {
    /// The mark of a save into `dir`: beside it.
    fn beside(dir: &Path) -> Result<Mark, BackendError> {
        let vm_dir = dir
            .parent()
            .ok_or_else(|| BackendError::Io(format!("{} has no parent", dir.display())))?;
        Ok(Mark {
            path: vm_dir.join(PAUSED_MARK),
            set: false,
        })
    }

    /// Mark the guest of process `serving` paused. Opened without following a link or
    /// blocking on a FIFO, and only a regular file is written.
    fn set(&mut self, serving: &str) -> Result<(), BackendError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let write = || {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(&self.path)?;
            if !file.metadata()?.is_file() {
                return Err(std::io::Error::other("not a regular file"));
            }
            file.set_len(0)?;
            file.write_all(serving.as_bytes())
        };
        write().map_err(|e| {
            BackendError::Io(format!(
                "cannot mark the guest paused by the save in {}: {e}",
                self.path.display()
            ))
        })?;
        self.set = true;
        Ok(())
    }

    /// Remove the mark this save wrote: the guest runs again, or its process ended.
    fn clear(&mut self) {
        if std::mem::take(&mut self.set) {
            unmark(&self.path);
        }
    }
}

/// Remove a mark of a guest paused by a save.
fn unmark(mark: &Path) {
    match std::fs::remove_file(mark) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            tracing::warn!("cannot remove {}: {e}", mark.display());
        }
        _ => {}
    }
}

/// What the mark of a guest paused by a save holds: `None` where there is none, else the
/// process it names, or why it could not be read.
fn read_mark(mark: &Path) -> Option<Result<String, String>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(mark);
    let read = |mut file: std::fs::File| {
        let mut text = String::new();
        file.by_ref().take(64).read_to_string(&mut text)?;
        Ok(text.trim().to_string())
    };
    match opened.and_then(read) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        read => Some(read.map_err(|e: std::io::Error| format!("{}: {e}", mark.display()))),
    }
}

/// The guest's state as the VMM's API answers it at `path` (its `state` field).
pub(crate) async fn state_at(api: &ApiSocket, path: &str) -> Result<String, BackendError> {
    let info = api.call(Method::GET, path, None).await?;
    Ok(info
        .get("state")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("")
        .to_string())
}

/// The process serving `api` now, as [`PAUSED_MARK`] names it (`"PID START"`), its start
/// time read from `proc`; `None` where unknown.
pub(crate) async fn serving(api: &ApiSocket, proc: &Path) -> Option<String> {
    let pid = api.peer_pid().await.ok().flatten()?;
    let start = crate::procfs::start_time(proc, pid)?;
    Some(format!("{pid} {start}"))
}

/// Resume the guest that a save of memtide's paused and that nothing let run again since
/// (the save was cut short: memtide killed, or the save's call given up on), as the mark
/// at `mark` says ([`PAUSED_MARK`]): only the guest of the process the mark names, and
/// only while it is paused. A mark of another process (the VMM was restarted since), or
/// of a guest that runs, is shut down or not started, is removed. Returns what was done,
/// said in a sentence, where the guest was resumed, or why a guest so marked stays
/// paused (its mark kept: its connection is refused and made again later).
pub(crate) async fn resume_after_cut_short_save(
    vmm: &mut dyn SnapshotSteps,
    mark: &Path,
) -> Result<Option<String>, String> {
    let marked = match read_mark(mark) {
        None => return Ok(None),
        Some(Ok(marked)) => marked,
        Some(Err(e)) => {
            tracing::warn!("a save's mark of a paused guest, removed: {e}");
            unmark(mark);
            return Ok(None);
        }
    };
    if vmm.serving().await.is_none_or(|serving| serving != marked) {
        unmark(mark);
        return Ok(None);
    }
    let cut_short = "the guest, paused by a save of memtide's that was cut short,";
    match vmm.paused().await {
        Ok(false) => {
            unmark(mark);
            Ok(None)
        }
        Ok(true) => match vmm.resume().await {
            Ok(()) => {
                unmark(mark);
                Ok(Some(format!(
                    "{cut_short} was resumed (memtide killed during the save, or the save \
                     given up on)"
                )))
            }
            Err(e) => Err(format!(
                "{cut_short} could not be resumed ({e}): it stays paused"
            )),
        },
        Err(e) => Err(format!(
            "whether {cut_short} is paused still could not be asked ({e})"
        )),
    }
}

/// Save the VM into `dir` as `VmBackend::save` says: the guest paused while its VMM
/// writes the snapshot, then resumed before the seal, or (`AfterSave::Quit`) its VMM
/// ended once the seal succeeded; a snapshot the VMM refuses, or a seal that fails,
/// leaves the guest running as it was. A VMM that did not quit when asked is hibernated
/// all the same if it has ended; one that still runs is asked to resume the guest, and
/// the error says whether it did. A running guest is marked paused meanwhile
/// ([`PAUSED_MARK`]); one left paused keeps its mark, and the VMM is told
/// ([`SnapshotSteps::left_paused`]).
pub async fn save(
    vmm: &mut dyn SnapshotSteps,
    dir: &Path,
    then: AfterSave,
    limit: Duration,
    seal: Seal,
) -> Result<Saved, BackendError> {
    let mut mark = Mark::beside(dir)?;
    let saved = save_marked(vmm, dir, then, limit, seal, &mut mark).await;
    if let (Err(e), true) = (&saved, mark.set) {
        vmm.left_paused(format!("a save left the guest paused ({e})"));
    }
    saved
}

async fn save_marked(
    vmm: &mut dyn SnapshotSteps,
    dir: &Path,
    then: AfterSave,
    limit: Duration,
    seal: Seal,
    mark: &mut Mark,
) -> Result<Saved, BackendError> {
    if then == AfterSave::Quit {
        if let Some(why) = vmm.cannot_quit() {
            return Err(BackendError::Protocol(format!("cannot hibernate: {why}")));
        }
    }
    let running = vmm.running().await?;
    let stopped = Instant::now();
    if running {
        if let Some(serving) = vmm.serving().await {
            mark.set(&serving)?;
        }
        if let Err(e) = vmm.pause().await {
            // A pause that timed out may have paused the guest all the same: its mark
            // stays unless the guest is seen to run.
            let timed_out = matches!(e, BackendError::Timeout(_));
            if !timed_out || matches!(vmm.running().await, Ok(true)) {
                mark.clear();
            }
            return Err(e);
        }
    }
    if let Err(e) = vmm.write(dir, limit).await {
        return Err(also(e, resume(vmm, running, limit, mark).await));
    }
    let downtime = match then {
        AfterSave::Run => {
            resume(vmm, running, limit, mark).await.map_err(|r| {
                BackendError::Protocol(format!(
                    "written, but the guest could not be resumed ({r}): it is paused"
                ))
            })?;
            Some(stopped.elapsed())
        }
        AfterSave::Quit => None,
    };
    // Off the runtime: the memory file may be gigabytes still in the page cache.
    let synced = {
        let dir = dir.to_path_buf();
        tokio::task::spawn_blocking(move || sync_files(&dir))
            .await
            .unwrap_or_else(|e| Err(BackendError::Io(format!("syncing: {e}"))))
    };
    let saved = Saved {
        mechanism: vmm.mechanism().into(),
        was_running: running,
        downtime: downtime.unwrap_or_else(|| stopped.elapsed()),
        written: stopped.elapsed(),
        ..Saved::default()
    };
    let sealed = match synced {
        Ok(()) => seal(saved.clone()).await.map_err(BackendError::Io),
        Err(e) => Err(e),
    };
    match (then, sealed) {
        (AfterSave::Run, sealed) => sealed?,
        (AfterSave::Quit, Err(e)) => {
            let e = BackendError::Io(format!("{e}; the guest runs on"));
            return Err(also(e, resume(vmm, running, limit, mark).await));
        }
        (AfterSave::Quit, Ok(())) => {
            if let Err(e) = vmm.quit().await {
                // Ended all the same, with its guest paused since the snapshot.
                if vmm.ended().await {
                    mark.clear();
                    return Ok(saved);
                }
                let e = format!("saved, but the VMM did not quit ({e}) and still runs");
                return Err(BackendError::Protocol(
                    match resume(vmm, running, limit, mark).await {
                        Ok(()) if running => format!("{e}; the guest runs on"),
                        Ok(()) => format!("{e}; the guest stays paused, as it was"),
                        Err(r) => {
                            format!("{e}; the guest could not be resumed ({r}): it is paused")
                        }
                    },
                ));
            }
            mark.clear();
        }
    }
    Ok(saved)
}

/// Let the guest run again if it ran before the save, its mark removed once it does:
/// asked again until `limit` while the VMM does not answer (it may still be writing a
/// snapshot whose call timed out).
async fn resume(
    vmm: &mut dyn SnapshotSteps,
    running: bool,
    limit: Duration,
    mark: &mut Mark,
) -> Result<(), BackendError> {
    if !running {
        return Ok(());
    }
    let deadline = Instant::now() + limit;
    loop {
        match vmm.resume().await {
            Err(BackendError::Timeout(_)) if Instant::now() < deadline => {
                tokio::time::sleep(RESUME_RETRY).await;
            }
            Ok(()) => {
                mark.clear();
                return Ok(());
            }
            other => return other,
        }
    }
}

/// How long to wait before asking a busy VMM again to resume.
const RESUME_RETRY: Duration = Duration::from_millis(200);

/// `e`, and the guest left paused if it could not be resumed after it.
fn also(e: BackendError, resumed: Result<(), BackendError>) -> BackendError {
    match resumed {
        Ok(()) => e,
        Err(r) => BackendError::Protocol(format!(
            "{e}; and the guest could not be resumed ({r}): it is paused"
        )),
    }
}

/// Sync every file the VMM wrote into `dir` (by path, with its own umask) and make it
/// readable by its owner alone, as every memory file in the store is. Each is opened
/// without following a link and must be a regular file: a VMM is not trusted to have
/// left only files there, and memtide, as root, must not change or read what a link
/// points to.
fn sync_files(dir: &Path) -> Result<(), BackendError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let fail = |e: std::io::Error| BackendError::Io(format!("syncing {}: {e}", dir.display()));
    for entry in std::fs::read_dir(dir).map_err(fail)? {
        let path = entry.map_err(fail)?.path();
        let failed =
            |e: std::io::Error| BackendError::Io(format!("syncing {}: {e}", path.display()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
            .map_err(failed)?;
        if !file.metadata().map_err(failed)?.is_file() {
            return Err(BackendError::Io(format!(
                "{}: not a regular file: the VMM left something else in the snapshot",
                path.display()
            )));
        }
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .and_then(|()| file.sync_all())
            .map_err(failed)?;
    }
    Ok(())
}

/// A restored VM: its new hypervisor process and how long the restore took.
#[derive(Debug)]
pub struct Restored {
    /// The hypervisor's process.
    pub pid: u32,
    /// From starting the process to the guest running (or paused, as it was saved).
    pub elapsed: Duration,
}

/// `path` as the UTF-8 text a VMM's JSON API takes.
pub fn utf8(path: &Path) -> Result<&str, BackendError> {
    path.to_str()
        .ok_or_else(|| BackendError::Io(format!("{} is not UTF-8", path.display())))
}

/// A VMM process to start for a restore: its command line, the API socket it serves,
/// the path that answers once it listens, its output.
pub struct Launch<'a> {
    /// The VM's configured launch command (program first); it must serve `socket`.
    pub command: &'a [String],
    /// The API socket.
    pub socket: &'a Path,
    /// A `GET` path the VMM answers as soon as it listens.
    pub ping: &'a str,
    /// Its output.
    pub log: &'a Path,
    /// The whole restore may take this long; each API call too.
    pub limit: Duration,
}

/// A VMM process started by [`start`], answering on its socket.
pub struct Started {
    /// The process.
    pub child: std::process::Child,
    /// Its API.
    pub api: ApiSocket,
    /// When it was started.
    pub start: Instant,
}

impl Started {
    /// The guest restored (by the caller's API calls): the process left to run.
    pub fn restored(self) -> Restored {
        Restored {
            pid: self.child.id(),
            elapsed: self.start.elapsed(),
        }
    }

    /// Kill the process and reap it, the last lines of its output in `e`.
    pub fn fail(mut self, e: BackendError, log: &Path) -> BackendError {
        let _ = self.child.kill();
        let _ = self.child.wait();
        with_log_tail(e, log)
    }
}

/// `e` with the last lines of the VMM's output in `log`, if it wrote any.
fn with_log_tail(e: BackendError, log: &Path) -> BackendError {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(3).collect();
    match tail.is_empty() {
        true => e,
        false => BackendError::Protocol(format!("{e} (its output: {})", tail.join("; "))),
    }
}

/// The file a started VMM writes its output to, made empty: never through a link (found
/// by an audit: a `restore.log` linked to a file outside the store truncated that file).
pub(crate) fn log_file(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// Start the VMM by `launch.command`, detached in a process group of its own (it outlives
/// the command), and wait until its API socket answers. A stale socket file is removed
/// first: the caller checked that nothing answers on it. A process that exits or does
/// not answer in time is killed, the last lines of its output in the error.
pub async fn start(launch: &Launch<'_>) -> Result<Started, BackendError> {
    let start = Instant::now();
    let (program, args) = launch
        .command
        .split_first()
        .ok_or_else(|| BackendError::Protocol("the launch command is empty".into()))?;
    let _ = std::fs::remove_file(launch.socket);
    let output = log_file(launch.log)
        .map_err(|e| BackendError::Io(format!("creating {}: {e}", launch.log.display())))?;
    let mut command = std::process::Command::new(program);
    command
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(
            output
                .try_clone()
                .map_err(|e| BackendError::Io(e.to_string()))?,
        )
        .stderr(output);
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let child = command
        .spawn()
        .map_err(|e| BackendError::Io(format!("starting {program}: {e}")))?;
    let mut started = Started {
        child,
        api: ApiSocket::new(launch.socket, launch.limit),
        start,
    };
    loop {
        match started.api.call(Method::GET, launch.ping, None).await {
            Ok(_) => return Ok(started),
            Err(_) if started.child.try_wait().is_ok_and(|s| s.is_some()) => {
                let why = format!("{program} exited before its API socket answered");
                return Err(started.fail(BackendError::Disconnected(why), launch.log));
            }
            Err(_) if start.elapsed() < launch.limit => tokio::time::sleep(POLL).await,
            Err(e) => {
                let why = format!("{program} did not answer on its API socket: {e}");
                return Err(started.fail(BackendError::Disconnected(why), launch.log));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_vmms_log_is_never_written_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let (log, outside) = (dir.path().join("restore.log"), dir.path().join("passwd"));
        std::fs::write(&outside, "root:x:0:0").unwrap();
        std::os::unix::fs::symlink(&outside, &log).unwrap();
        assert!(log_file(&log).is_err());
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "root:x:0:0");
        // A log of its own is made empty.
        std::fs::remove_file(&log).unwrap();
        std::fs::write(&log, "the last run's").unwrap();
        drop(log_file(&log).unwrap());
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "");
    }

    /// A VMM whose snapshot times out and which stays busy: it answers nothing but
    /// timeouts, `busy` times, then every call.
    struct Busy {
        busy: u32,
        resumed: bool,
    }

    #[async_trait::async_trait]
    impl SnapshotSteps for Busy {
        fn mechanism(&self) -> &'static str {
            "test"
        }
        fn cannot_quit(&self) -> Option<String> {
            None
        }
        async fn state(&mut self) -> Result<String, BackendError> {
            Ok("Running".into())
        }
        async fn pause(&mut self) -> Result<(), BackendError> {
            Ok(())
        }
        async fn resume(&mut self) -> Result<(), BackendError> {
            if self.busy > 0 {
                self.busy -= 1;
                return Err(BackendError::timeout(Duration::from_millis(1)));
            }
            self.resumed = true;
            Ok(())
        }
        async fn write(&mut self, _: &Path, limit: Duration) -> Result<(), BackendError> {
            Err(BackendError::timeout(limit))
        }
        async fn quit(&mut self) -> Result<(), BackendError> {
            Ok(())
        }
        async fn ended(&mut self) -> bool {
            false
        }
        async fn serving(&mut self) -> Option<String> {
            Some("7 70".into())
        }
        fn left_paused(&mut self, _: String) {}
    }

    /// A VMM whose quit fails: it has `ended` anyway or not, and resumes or not.
    struct NoQuit {
        ended: bool,
        resumes: bool,
        resumed: bool,
    }

    #[async_trait::async_trait]
    impl SnapshotSteps for NoQuit {
        fn mechanism(&self) -> &'static str {
            "test"
        }
        fn cannot_quit(&self) -> Option<String> {
            None
        }
        async fn state(&mut self) -> Result<String, BackendError> {
            Ok("Running".into())
        }
        async fn pause(&mut self) -> Result<(), BackendError> {
            Ok(())
        }
        async fn resume(&mut self) -> Result<(), BackendError> {
            if !self.resumes {
                return Err(BackendError::Protocol("no".into()));
            }
            self.resumed = true;
            Ok(())
        }
        async fn write(&mut self, _: &Path, _: Duration) -> Result<(), BackendError> {
            Ok(())
        }
        async fn quit(&mut self) -> Result<(), BackendError> {
            Err(BackendError::Io("killing it: EPERM".into()))
        }
        async fn ended(&mut self) -> bool {
            self.ended
        }
        async fn serving(&mut self) -> Option<String> {
            Some("7 70".into())
        }
        fn left_paused(&mut self, _: String) {}
    }

    /// A snapshot's directory in a VM's directory of a store, as a save is given one.
    fn snapshot_dir() -> (tempfile::TempDir, std::path::PathBuf) {
        let vm_dir = tempfile::tempdir().unwrap();
        let dir = vm_dir.path().join("1.partial");
        std::fs::create_dir(&dir).unwrap();
        (vm_dir, dir)
    }

    /// The mark beside `dir`: the process it names, if there is one.
    fn mark_of(dir: &Path) -> Option<String> {
        std::fs::read_to_string(dir.parent().unwrap().join(PAUSED_MARK)).ok()
    }

    #[tokio::test]
    async fn a_vmm_that_did_not_quit_is_hibernated_if_it_ended_and_told_as_it_runs_if_not() {
        let (_store, dir) = snapshot_dir();
        let limit = Duration::from_secs(1);
        let sealed = || -> Seal { Box::new(|_| Box::pin(async { Ok(()) })) };
        for (ended, resumes, told) in [
            (true, true, None),
            (
                false,
                true,
                Some("saved, but the VMM did not quit (killing it: EPERM) and still runs; the guest runs on"),
            ),
            (
                false,
                false,
                Some(
                    "saved, but the VMM did not quit (killing it: EPERM) and still runs; the guest \
                     could not be resumed (no): it is paused",
                ),
            ),
        ] {
            let mut vmm = NoQuit {
                ended,
                resumes,
                resumed: false,
            };
            let saved = save(&mut vmm, &dir, AfterSave::Quit, limit, sealed()).await;
            match told {
                None => {
                    assert!(saved.is_ok(), "{saved:?}");
                    assert!(!vmm.resumed, "an ended VMM is not asked to resume");
                }
                Some(told) => {
                    assert_eq!(saved.unwrap_err().to_string(), told);
                    assert_eq!(vmm.resumed, resumes);
                }
            }
            // Marked paused only while the guest is: not once it ended or runs again.
            let paused = !ended && !resumes;
            assert_eq!(mark_of(&dir), paused.then(|| "7 70".to_string()));
        }
    }

    fn no_seal() -> Seal {
        Box::new(|_| Box::pin(async { panic!("nothing to seal") }))
    }

    #[tokio::test]
    async fn a_snapshot_that_timed_out_resumes_the_guest_once_its_vmm_answers_or_says_it_is_paused()
    {
        let (_store, dir) = snapshot_dir();
        let limit = Duration::from_secs(1);
        let mut vmm = Busy {
            busy: 2,
            resumed: false,
        };
        let e = save(&mut vmm, &dir, AfterSave::Run, limit, no_seal()).await;
        let e = e.unwrap_err().to_string();
        assert!(vmm.resumed, "resumed once the VMM answered: {e}");
        assert!(!e.contains("paused"), "{e}");
        assert_eq!(mark_of(&dir), None);
        // A VMM that never answers again: both told, the guest said to be paused.
        let mut vmm = Busy {
            busy: u32::MAX,
            resumed: false,
        };
        let e = save(&mut vmm, &dir, AfterSave::Run, limit, no_seal()).await;
        let e = e.unwrap_err().to_string();
        assert!(!vmm.resumed);
        assert!(
            e.contains("could not be resumed") && e.contains("it is paused"),
            "{e}"
        );
        assert_eq!(
            mark_of(&dir).as_deref(),
            Some("7 70"),
            "left for the next connection"
        );
    }

    /// A VMM whose guest runs or is paused, served by process `serving`, that pauses and
    /// resumes it or refuses to (`pause` and `resume`: the error it answers with).
    struct Guest {
        serving: Option<&'static str>,
        running: bool,
        pause: Option<BackendError>,
        resume: Option<BackendError>,
        /// What the save told of a guest it left paused.
        left_paused: Option<String>,
    }

    impl Guest {
        fn new(serving: Option<&'static str>, running: bool) -> Guest {
            Guest {
                serving,
                running,
                pause: None,
                resume: None,
                left_paused: None,
            }
        }
    }

    #[async_trait::async_trait]
    impl SnapshotSteps for Guest {
        fn mechanism(&self) -> &'static str {
            "test"
        }
        fn cannot_quit(&self) -> Option<String> {
            None
        }
        async fn state(&mut self) -> Result<String, BackendError> {
            Ok(if self.running { "Running" } else { "Paused" }.into())
        }
        async fn pause(&mut self) -> Result<(), BackendError> {
            match self.pause.clone() {
                // A pause that timed out took effect all the same.
                Some(e @ BackendError::Timeout(_)) => {
                    self.running = false;
                    Err(e)
                }
                Some(e) => Err(e),
                None => {
                    self.running = false;
                    Ok(())
                }
            }
        }
        async fn resume(&mut self) -> Result<(), BackendError> {
            match self.resume.clone() {
                Some(e) => Err(e),
                None => {
                    self.running = true;
                    Ok(())
                }
            }
        }
        async fn write(&mut self, _: &Path, _: Duration) -> Result<(), BackendError> {
            Ok(())
        }
        async fn quit(&mut self) -> Result<(), BackendError> {
            unreachable!("no hibernation here")
        }
        async fn ended(&mut self) -> bool {
            false
        }
        async fn serving(&mut self) -> Option<String> {
            self.serving.map(String::from)
        }
        fn left_paused(&mut self, why: String) {
            self.left_paused = Some(why);
        }
    }

    #[tokio::test]
    async fn a_guest_a_cut_short_save_left_paused_is_resumed_only_if_it_is_that_process_and_paused()
    {
        let dir = tempfile::tempdir().unwrap();
        let mark = dir.path().join(PAUSED_MARK);
        let refused = || Some(BackendError::Protocol("no".into()));
        // (mark, serving now, paused, resume refused) -> resumed, mark kept
        for (marked, serving, paused, refuse, resumed, kept) in [
            (Some("7 70"), Some("7 70"), true, None, Ok(true), false),
            // Another process on the socket since (restarted, or the pid taken by
            // another): its guest is its own.
            (Some("7 70"), Some("7 71"), true, None, Ok(false), false),
            (Some("7 70"), Some("8 70"), true, None, Ok(false), false),
            (Some("7 70"), None, true, None, Ok(false), false),
            // Running again (resumed by hand): nothing to do.
            (Some("7 70"), Some("7 70"), false, None, Ok(false), false),
            // It would not resume: refused, tried again at the next connection.
            (Some("7 70"), Some("7 70"), true, refused(), Err(()), true),
            (None, Some("7 70"), true, None, Ok(false), false),
        ] {
            if let Some(text) = marked {
                std::fs::write(&mark, text).unwrap();
            }
            let mut vmm = Guest::new(serving, !paused);
            vmm.resume = refuse;
            let case = format!("{marked:?} {serving:?} paused {paused}");
            let done = resume_after_cut_short_save(&mut vmm, &mark).await;
            assert_eq!(done.map(|d| d.is_some()).map_err(drop), resumed, "{case}");
            assert_eq!(vmm.running, !paused || resumed == Ok(true), "{case}");
            assert_eq!(mark.exists(), kept, "{case}");
            let _ = std::fs::remove_file(&mark);
        }
        // A link in the mark's place is not followed, and is removed.
        let outside = dir.path().join("elsewhere");
        std::fs::write(&outside, "7 70").unwrap();
        std::os::unix::fs::symlink(&outside, &mark).unwrap();
        let mut vmm = Guest::new(Some("7 70"), false);
        assert_eq!(resume_after_cut_short_save(&mut vmm, &mark).await, Ok(None));
        assert!(!vmm.running);
        assert!(mark.symlink_metadata().is_err() && outside.exists());
    }

    #[tokio::test]
    async fn a_save_of_a_paused_guest_leaves_the_mark_an_earlier_save_left() {
        // A guest a cut-short save left paused, its resume refused at the connection:
        // saved paused, it keeps its mark (the next connection tries again).
        let (_store, dir) = snapshot_dir();
        std::fs::write(dir.parent().unwrap().join(PAUSED_MARK), "7 70").unwrap();
        let mut vmm = Guest::new(Some("7 70"), false);
        let sealed: Seal = Box::new(|_| Box::pin(async { Ok(()) }));
        let limit = Duration::from_secs(1);
        let saved = save(&mut vmm, &dir, AfterSave::Run, limit, sealed).await;
        assert!(!saved.unwrap().was_running);
        assert_eq!(mark_of(&dir).as_deref(), Some("7 70"));
    }

    #[tokio::test]
    async fn a_pause_refused_leaves_no_mark_one_that_timed_out_leaves_it_and_no_process_none() {
        let limit = Duration::from_secs(1);
        // Refused (the guest paused by its operator meanwhile, say): not this save's.
        let (_store, dir) = snapshot_dir();
        let mut vmm = Guest::new(Some("7 70"), true);
        vmm.pause = Some(BackendError::Protocol("invalid state".into()));
        let e = save(&mut vmm, &dir, AfterSave::Run, limit, no_seal()).await;
        assert_eq!(
            e.unwrap_err(),
            BackendError::Protocol("invalid state".into())
        );
        assert_eq!(mark_of(&dir), None);
        assert_eq!(vmm.left_paused, None);
        // Timed out, and paused all the same: marked, its connection made again.
        let mut vmm = Guest::new(Some("7 70"), true);
        vmm.pause = Some(BackendError::timeout(limit));
        let e = save(&mut vmm, &dir, AfterSave::Run, limit, no_seal()).await;
        assert_eq!(e, Err(BackendError::timeout(limit)));
        assert_eq!(mark_of(&dir).as_deref(), Some("7 70"));
        let told = vmm.left_paused.expect("told it left the guest paused");
        assert!(told.contains("no answer within 1000 ms"), "{told}");
        // A VMM whose process is unknown: no mark.
        std::fs::remove_file(dir.parent().unwrap().join(PAUSED_MARK)).unwrap();
        let mut vmm = Guest::new(None, true);
        let sealed: Seal = Box::new(|_| Box::pin(async { Ok(()) }));
        assert!(save(&mut vmm, &dir, AfterSave::Run, limit, sealed)
            .await
            .is_ok());
        assert_eq!(mark_of(&dir), None);
    }

    #[tokio::test]
    async fn a_save_that_cannot_mark_the_guest_paused_does_not_pause_it() {
        let (_store, dir) = snapshot_dir();
        std::fs::create_dir(dir.parent().unwrap().join(PAUSED_MARK)).unwrap();
        let mut vmm = Guest::new(Some("7 70"), true);
        vmm.pause = Some(BackendError::Protocol(
            "a pause would fail this test".into(),
        ));
        let limit = Duration::from_secs(1);
        // A pause fails the test's way, not as "cannot mark".
        let e = save(&mut vmm, &dir, AfterSave::Run, limit, no_seal()).await;
        let e = e.unwrap_err().to_string();
        assert!(e.contains("cannot mark the guest paused"), "{e}");
        assert!(vmm.running);
    }

    #[test]
    fn what_the_vmm_wrote_is_synced_and_closed_but_a_link_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::write(&state, "vm state").unwrap();
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o644)).unwrap();
        sync_files(dir.path()).unwrap();
        let mode = std::fs::metadata(&state).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // A link to a file outside the snapshot: refused, and the file left as it was.
        let outside = tempfile::NamedTempFile::new().unwrap();
        std::fs::set_permissions(outside.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("memory")).unwrap();
        let e = sync_files(dir.path()).unwrap_err();
        assert!(e.to_string().contains("memory"), "{e}");
        let mode = std::fs::metadata(outside.path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o644, "not followed");
    }
}
