//! Memory snapshots of QEMU guests through QMP: the guest is stopped and its state (RAM
//! and devices) migrated into a file memtide opened and handed to QEMU (`getfd`, then
//! `migrate` to `fd:`, which works from QEMU 2.x on, with no path or shell that a VM's
//! name could break); a restore starts the VM's QEMU again with `-incoming defer` and a
//! monitor of memtide's own, and migrates the file back in. A QEMU that has the
//! `mapped-ram` capability (9.0 on) is given the file in an fd set instead (`add-fd`) and
//! migrates to `file:/dev/fdset/N` with it: each RAM page at its own offset of the file,
//! which a restore reads straight into place (QEMU's docs/devel/migration/mapped-ram.rst).
//!
//! The disk is not part of a memory snapshot: restoring one is safe only onto the disk
//! state it was taken with (a hibernated guest's, untouched since).

use super::client::{QmpClient, QmpError};
use crate::checksum::SumBehind;
use crate::write_behind::WriteBehind;
use memtide_core::backend::{AfterSave, Saved, Seal};
use memtide_core::BackendError;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// The file, in a snapshot's directory, that holds QEMU's migration stream.
pub const MEMORY_FILE: &str = "memory";
/// How often a migration's progress is asked for: a save of a small guest takes a tenth
/// of a second, and every poll interval its end waits adds to the guest's downtime.
const POLL: Duration = Duration::from_millis(5);
/// How long a QEMU that did not answer `quit` is given to end before it counts as running.
const QUIT_GRACE: Duration = Duration::from_secs(2);
/// A migration bandwidth no disk reaches (bytes/s): no cap.
const UNLIMITED: u64 = 1 << 40;
/// The name the snapshot file is handed to QEMU under.
const FD_NAME: &str = "memtide-snapshot";
/// The `opaque` of the fd set that marks a guest stopped by a save of memtide's, for as
/// long as it is: left in QEMU by a daemon killed mid-save, it tells the next connection
/// to resume the guest ([`clean_up`]); a guest stopped otherwise (by its operator, or by a
/// migration to another host) bears none and is left stopped.
const STOPPED_MARK: &str = "memtide-save-stopped-the-guest";
/// The `opaque` of the fd set that marks a guest a restore of memtide's is to resume once
/// its state is in (it ran when saved), until it does: left in QEMU by a restore cut short
/// (the daemon or `memtide snapshot restore` killed), it tells the next connection to
/// resume the guest ([`clean_up`]).
const RESUME_MARK: &str = "memtide-restore-resumes-the-guest";
/// How a snapshot of the plain migration stream says it was saved.
const MECHANISM_STREAM: &str = "qmp migrate to fd";
/// How a `mapped-ram` snapshot says it was saved: its restore needs the capability.
pub const MECHANISM_MAPPED_RAM: &str = "qmp migrate mapped-ram to fdset";

/// The migration's form: QEMU's stream through `fd:`, or `mapped-ram` through a `file:`
/// URI naming an fd set.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Format {
    /// The plain stream.
    Stream,
    /// `mapped-ram`.
    MappedRam,
}

impl Format {
    /// The format a snapshot saved as `mechanism` was written in; `None` for a mechanism
    /// this build does not know (a newer memtide's: found by the compatibility audit, any
    /// was taken for the plain stream and handed to QEMU as one).
    pub fn of(mechanism: &str) -> Option<Format> {
        match mechanism {
            MECHANISM_STREAM => Some(Format::Stream),
            MECHANISM_MAPPED_RAM => Some(Format::MappedRam),
            _ => None,
        }
    }
}

/// Whether the QEMU behind `client` has migration capability `name`.
async fn has_capability(client: &mut QmpClient, name: &str) -> Result<bool, BackendError> {
    let caps = client.execute("query-migrate-capabilities", None).await?;
    Ok(caps
        .as_array()
        .is_some_and(|caps| caps.iter().any(|c| c["capability"] == name)))
}

/// Undo what a save or restore of memtide's cut short (a call timed out and closed its
/// session, or the daemon or command was killed) left in QEMU: a save's fd sets (`opaque`
/// [`FD_NAME`]) removed and `mapped-ram` turned off, lest they hold a descriptor of the
/// store's and bend the VM's next migration; a guest that save stopped ([`STOPPED_MARK`])
/// resumed: nobody else would, and QEMU refuses every later migration of it; and a guest
/// a restore was to resume ([`RESUME_MARK`]) resumed once its state is in. A guest stopped
/// otherwise (paused by its operator, or left `postmigrate` by a migration to another
/// host, where it runs now) is left stopped. Nothing is done while a migration runs or is
/// awaited (a save or restore under way); a guest whose restore's state is still coming
/// in, or whose resume QEMU refuses (its marks then kept), is refused as busy: its
/// connection is made again later, and resumes it; so is a QEMU whose restore was cut
/// short before the state was sent, saying so. The marks go only once the guest runs.
/// Best effort otherwise: a failure is logged (a command QEMU lacks, at debug level).
/// Returns what it resumed, said in a sentence, when it resumed the guest (for its caller
/// to log).
pub async fn clean_up(client: &mut QmpClient) -> Result<Option<String>, BackendError> {
    match try_clean_up(client).await {
        Ok(CleanUp::Resumed(resumed)) => return Ok(Some(resumed)),
        Ok(CleanUp::Refused(why)) => return Err(BackendError::Busy(why)),
        Ok(CleanUp::Restoring) => {
            return Err(BackendError::Busy(
                "a restore of memtide's is bringing its state in".into(),
            ))
        }
        Ok(CleanUp::Abandoned) => {
            return Err(BackendError::Busy(
                "a restore of memtide's was cut short before it sent the guest's state: \
                 this QEMU waits for one that will not come (kill it, and restore the VM \
                 again)"
                    .into(),
            ))
        }
        Ok(CleanUp::Nothing) => {}
        Err(e @ QmpError::Command { .. }) => {
            tracing::debug!("no clean-up of cut-short saves and restores: {e}");
        }
        Err(e) => {
            tracing::warn!(
                "what a cut-short save or restore left in QEMU could not be cleaned up: {e}"
            );
        }
    }
    Ok(None)
}

/// What [`try_clean_up`] found.
enum CleanUp {
    Nothing,
    /// The guest was resumed: said in a sentence.
    Resumed(String),
    /// QEMU refused to resume a guest a save or restore left stopped: why.
    Refused(String),
    /// A restore of memtide's is migrating the guest's state in.
    Restoring,
    /// A restore of memtide's was cut short before it sent the state: QEMU waits for it.
    Abandoned,
}

/// The run states (QAPI `RunState`) a save leaves a guest in: stopped for it (`paused`),
/// then by the migration (`finish-migrate`, `postmigrate`) until someone says `cont`.
const STOPPED_BY_SAVE: [&str; 3] = ["paused", "postmigrate", "finish-migrate"];

async fn try_clean_up(client: &mut QmpClient) -> Result<CleanUp, QmpError> {
    let status = client.execute("query-status", None).await?;
    let migration = client.execute("query-migrate", None).await?;
    let migration_status = migration.get("status").and_then(Value::as_str);
    let idle = matches!(
        migration_status,
        None | Some("none" | "completed" | "failed" | "cancelled")
    );
    let state = status.get("status").and_then(Value::as_str).unwrap_or("");
    let sets = match client.execute("query-fdsets", None).await {
        Err(QmpError::Command { .. }) => Value::Null, // a QEMU without fd sets
        other => other?,
    };
    let sets: Vec<&Value> = sets.as_array().into_iter().flatten().collect();
    let to_resume = sets.iter().any(|set| bears(set, RESUME_MARK));
    let stopped = sets.iter().any(|set| bears(set, STOPPED_MARK));
    if state == "inmigrate" || !idle {
        return Ok(match (to_resume, idle) {
            (false, _) => CleanUp::Nothing,
            (true, false) => CleanUp::Restoring,
            // Waiting at `-incoming defer` for a state nobody will send.
            (true, true) => CleanUp::Abandoned,
        });
    }
    let ended = migration_status.unwrap_or("none");
    let why = if stopped && STOPPED_BY_SAVE.contains(&state) {
        Some("by a save of memtide's cut short (memtide killed, or the save's call given up on)")
    } else if to_resume && state == "paused" {
        Some("by a restore of memtide's cut short before it resumed the guest")
    } else {
        None
    };
    // Resumed before its marks go: a `cont` QEMU refuses (its disk locked elsewhere, say)
    // keeps them for the next connection; and QEMU before 9.1 closes a removed fd only
    // once the guest runs.
    if let Some(why) = why {
        if let Err(e) = client.execute("cont", None).await {
            return match e {
                QmpError::Command { .. } => Ok(CleanUp::Refused(format!(
                    "the guest was left stopped ({state}) {why}, and QEMU refused to resume \
                     it ({e}): tried again at the next connection"
                ))),
                e => Err(e),
            };
        }
    }
    for set in sets {
        if [FD_NAME, STOPPED_MARK, RESUME_MARK]
            .iter()
            .any(|name| bears(set, name))
        {
            let args = json!({ "fdset-id": set["fdset-id"] });
            client.execute("remove-fd", Some(args)).await?;
        }
    }
    let caps = client.execute("query-migrate-capabilities", None).await?;
    let on = caps.as_array().is_some_and(|caps| {
        caps.iter()
            .any(|c| c["capability"] == "mapped-ram" && c["state"] == true)
    });
    if on {
        set_mapped_ram(client, false).await?;
    }
    Ok(match why {
        Some(why) => CleanUp::Resumed(format!(
            "the guest was left stopped ({state}, migration {ended}) {why}: resumed"
        )),
        None => CleanUp::Nothing,
    })
}

/// Whether something listens on the unix socket `path` (a VM's QMP or API socket): a
/// connection is accepted, or waits in a full backlog (QEMU's monitor takes one client,
/// its backlog one more). Never blocks: a plain `connect` to a listener whose backlog is
/// full waits until it is accepted, which may be never.
pub fn listening(path: &Path) -> bool {
    use rustix::io::Errno;
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let Ok(addr) = SocketAddrUnix::new(path) else {
        return false;
    };
    let flags = SocketFlags::NONBLOCK | SocketFlags::CLOEXEC;
    let Ok(socket) = rustix::net::socket_with(AddressFamily::UNIX, SocketType::STREAM, flags, None)
    else {
        return false;
    };
    match rustix::net::connect(&socket, &addr) {
        Ok(()) => true,
        // A full backlog: a listener, busy.
        Err(e) => e == Errno::AGAIN || e == Errno::INPROGRESS,
    }
}

/// Turn `mapped-ram` on or off.
async fn set_mapped_ram(client: &mut QmpClient, on: bool) -> Result<(), QmpError> {
    let caps = json!({"capabilities": [{"capability": "mapped-ram", "state": on}]});
    client
        .execute("migrate-set-capabilities", Some(caps))
        .await?;
    Ok(())
}

/// Migrate in or out (`command`: `migrate`, `migrate-incoming`) through `file` as
/// `format` says, within `limit`; an outgoing migration that fails is cancelled. After,
/// whatever became of it, the descriptor is given back and `mapped-ram` turned off again:
/// left on, it would bend the VM's next migration (one to another host) to it.
async fn migrate_through(
    client: &mut QmpClient,
    command: &str,
    file: &std::fs::File,
    format: Format,
    limit: Duration,
) -> Result<Value, BackendError> {
    let fdset = match format {
        Format::Stream => {
            client.pass_fd(FD_NAME, file.as_fd()).await?;
            None
        }
        Format::MappedRam => {
            set_mapped_ram(client, true).await?;
            match client.add_fd(file.as_fd(), FD_NAME).await {
                Ok(id) => Some(id),
                Err(e) => {
                    let _ = set_mapped_ram(client, false).await;
                    return Err(e.into());
                }
            }
        }
    };
    let uri = match fdset {
        None => format!("fd:{FD_NAME}"),
        Some(id) => format!("file:/dev/fdset/{id}"),
    };
    let result = async {
        client.execute(command, Some(json!({ "uri": uri }))).await?;
        wait_for_migration(client, limit).await
    }
    .await;
    if result.is_err() && command == "migrate" {
        let _ = client.execute("migrate_cancel", None).await;
        settle(client).await;
    }
    match fdset {
        // QEMU keeps a descriptor it was given until it uses or closes it.
        None if result.is_err() => {
            let args = json!({ "fdname": FD_NAME });
            let _ = client.execute("closefd", Some(args)).await;
        }
        None => {}
        Some(id) => {
            let _ = client
                .execute("remove-fd", Some(json!({ "fdset-id": id })))
                .await;
            if let Err(e) = set_mapped_ram(client, false).await {
                tracing::warn!("mapped-ram could not be turned off again: {e}");
            }
        }
    }
    result
}

/// Wait (up to a second) for a cancelled migration to end: QEMU refuses to change
/// capabilities while one is cancelling.
async fn settle(client: &mut QmpClient) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(1) {
        let Ok(info) = client.execute("query-migrate", None).await else {
            return;
        };
        if !matches!(
            info.get("status").and_then(Value::as_str),
            Some("active" | "setup" | "cancelling" | "device")
        ) {
            return;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Save the VM behind `client` into `dir` (which must exist), stopping it meanwhile, then
/// seal the snapshot and leave the VM as `then` says (see `VmBackend::save`): a VM that
/// runs on is resumed first; a hibernated one's QEMU quits only once the seal succeeded.
/// A save that fails or outlasts `limit` is cancelled and leaves the VM as it was.
pub async fn save(
    client: &mut QmpClient,
    dir: &Path,
    then: AfterSave,
    limit: Duration,
    seal: Seal,
) -> Result<Saved, BackendError> {
    let status = client.execute("query-status", None).await?;
    let running = status.get("running").and_then(Value::as_bool) == Some(true);
    let backend = json!({"path": "/machine", "property": "memory-backend"});
    let ram_backend = client
        .execute("qom-get", Some(backend))
        .await
        .ok()
        .and_then(|v| Some(v.as_str()?.trim_start_matches("/objects/").to_string()))
        .filter(|id| !id.is_empty());
    let format = match has_capability(client, "mapped-ram").await? {
        true => Format::MappedRam,
        false => Format::Stream,
    };
    let path = dir.join(MEMORY_FILE);
    // Guest RAM: for root alone (the store's directories are too). Write-only: QEMU
    // finds a descriptor in an fd set by its access mode (`file:` opens it O_WRONLY).
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| BackendError::Io(format!("creating {}: {e}", path.display())))?;
    // QEMU writes its stream in order from the file's start, so the file is checksummed
    // as it is written; a `mapped-ram` file (each page at its offset) is left to the seal.
    let summing = match format {
        Format::Stream => std::fs::File::open(&path)
            .and_then(SumBehind::start)
            .map_err(|e| tracing::debug!("no checksum as the snapshot is written: {e}"))
            .ok(),
        Format::MappedRam => None,
    };
    // While the guest is stopped for the save, an fd set says so (see [`clean_up`]).
    // Best effort: without it, a save cut short leaves the guest stopped, as before.
    let mark = match running {
        true => client
            .add_fd(file.as_fd(), STOPPED_MARK)
            .await
            .map_err(|e| tracing::debug!("no mark of the stopped guest: {e}"))
            .ok(),
        false => None,
    };
    let stopped = Stopped {
        running,
        ram_backend,
        format,
        summing,
    };
    let saved = save_stopped(client, &path, file, stopped, then, limit, seal).await;
    let gone = matches!((&saved, then), (Ok(_), AfterSave::Quit));
    // A guest a failed save left stopped (its `cont` refused) keeps its mark: the next
    // connection resumes it ([`left_stopped`]).
    let left_stopped = saved.is_err() && running && !runs(client).await;
    if let (Some(id), false) = (mark, gone || left_stopped) {
        let args = json!({ "fdset-id": id });
        if let Err(e) = client.execute("remove-fd", Some(args)).await {
            tracing::debug!("the save's mark could not be removed: {e}");
        }
    }
    saved
}

/// Whether the guest runs, as far as QEMU answers (`false` where it does not).
async fn runs(client: &mut QmpClient) -> bool {
    let status = client.execute("query-status", None).await;
    status.is_ok_and(|s| s.get("running").and_then(Value::as_bool) == Some(true))
}

/// Whether a save left the guest stopped, its mark kept ([`STOPPED_MARK`]): the
/// connection is then to be made again, which resumes it ([`clean_up`]).
pub async fn left_stopped(client: &mut QmpClient) -> bool {
    match client.execute("query-fdsets", None).await {
        Ok(sets) => sets
            .as_array()
            .into_iter()
            .flatten()
            .any(|set| bears(set, STOPPED_MARK)),
        Err(_) => false,
    }
}

/// Whether the fd set `set` (as `query-fdsets` lists it) holds a descriptor added as
/// `opaque`.
fn bears(set: &Value, opaque: &str) -> bool {
    set["fds"]
        .as_array()
        .is_some_and(|fds| fds.iter().any(|fd| fd["opaque"] == opaque))
}

/// What [`save`] learnt before stopping the guest.
struct Stopped {
    /// The guest ran: it is stopped, and resumed after unless it hibernates.
    running: bool,
    ram_backend: Option<String>,
    format: Format,
    /// The stream's checksum, taken as it is written.
    summing: Option<SumBehind>,
}

/// [`save`] from the stop on: the guest stopped if it ran, the snapshot written, sealed,
/// and the guest left as `then` says.
async fn save_stopped(
    client: &mut QmpClient,
    path: &Path,
    file: std::fs::File,
    stopped: Stopped,
    then: AfterSave,
    limit: Duration,
    seal: Seal,
) -> Result<Saved, BackendError> {
    let Stopped {
        running,
        ram_backend,
        format,
        summing,
    } = stopped;
    let stopped = Instant::now();
    if running {
        client.execute("stop", None).await?;
    }
    if let Err(e) = migrate_out(client, &file, format, limit).await {
        resume(client, running).await?;
        return Err(e);
    }
    // A guest that runs on is resumed as soon as its state is out of QEMU; a hibernated
    // one stays stopped until the snapshot is on disk and whole.
    let downtime = match then {
        AfterSave::Run => {
            resume(client, running).await?;
            Some(stopped.elapsed())
        }
        AfterSave::Quit => None,
    };
    // Off the runtime: the disk may take seconds to write what QEMU left in the page
    // cache, and the daemon's runtime has one worker for every VM.
    let synced = tokio::task::spawn_blocking(move || file.sync_all())
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)))
        .map_err(|e| BackendError::Io(format!("writing {}: {e}", path.display())));
    let written = stopped.elapsed();
    // What the checksum did not reach yet is read now, off the runtime; one that failed
    // is the seal's to take, from the file.
    let summed = match summing {
        Some(summing) => tokio::task::spawn_blocking(move || summing.finish())
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)))
            .map_err(|e| tracing::warn!("{}: checksum as written: {e}", path.display()))
            .ok(),
        None => None,
    };
    let saved = Saved {
        mechanism: match format {
            Format::Stream => MECHANISM_STREAM,
            Format::MappedRam => MECHANISM_MAPPED_RAM,
        }
        .into(),
        was_running: running,
        downtime: downtime.unwrap_or(written),
        written,
        ram_backend,
        summed: summed
            .map(|sum| BTreeMap::from([(MEMORY_FILE.to_string(), sum)]))
            .unwrap_or_default(),
    };
    match then {
        AfterSave::Run => {
            synced?;
            seal(saved.clone()).await.map_err(BackendError::Io)?;
        }
        AfterSave::Quit => {
            let sealed = match synced {
                Ok(()) => seal(saved.clone()).await,
                Err(e) => Err(e.to_string()),
            };
            if let Err(e) = sealed {
                resume(client, running).await?;
                return Err(BackendError::Io(format!("{e}; the guest runs on")));
            }
            // QEMU may close the connection before it answers: it quit all the same.
            match client.execute("quit", None).await {
                Ok(_) | Err(QmpError::Closed(_) | QmpError::Io(_)) => {}
                // No reply: the session is closed, so its process tells.
                Err(e @ QmpError::Timeout(_)) => {
                    if !client.peer_ended(QUIT_GRACE).await {
                        return Err(BackendError::Protocol(format!(
                            "saved, but QEMU did not answer `quit` ({e}) and still runs, \
                             the guest paused; memtide's connection to it is closed"
                        )));
                    }
                }
                Err(e) => return not_quit(client, running, e, saved).await,
            }
        }
    }
    Ok(saved)
}

/// A hibernation whose QEMU refused to quit with `e`: its guest resumed if it ran, and
/// the error says how it was left; a QEMU that closes the connection meanwhile has ended
/// all the same, its guest paused since the snapshot: hibernated.
async fn not_quit(
    client: &mut QmpClient,
    running: bool,
    e: QmpError,
    saved: Saved,
) -> Result<Saved, BackendError> {
    let e = format!("saved, but QEMU did not quit ({e}) and still runs");
    let command = if running { "cont" } else { "query-status" };
    let told = match client.execute(command, None).await {
        Err(QmpError::Closed(_) | QmpError::Io(_)) => return Ok(saved),
        Ok(_) if running => format!("{e}; the guest runs on"),
        Ok(_) => format!("{e}; the guest stays paused, as it was"),
        Err(r) => format!("{e}; the guest could not be resumed ({r}): it is paused"),
    };
    Err(BackendError::Protocol(told))
}

/// Let the guest run again if it ran before the save.
async fn resume(client: &mut QmpClient, running: bool) -> Result<(), BackendError> {
    if running {
        client.execute("cont", None).await?;
    }
    Ok(())
}

/// Migrate the stopped VM into `file` as `format` says; the final `query-migrate` answer,
/// or why it failed (a migration that fails or outlasts `limit` is cancelled).
async fn migrate_out(
    client: &mut QmpClient,
    file: &std::fs::File,
    format: Format,
    limit: Duration,
) -> Result<Value, BackendError> {
    // QEMU caps a migration at 128 MiB/s by default (it was made for networks): a save
    // to a file goes as fast as the disk, and the VM's own cap is put back after.
    let params = client.execute("query-migrate-parameters", None).await?;
    let cap = params.get("max-bandwidth").cloned();
    let unlimited = json!({ "max-bandwidth": UNLIMITED });
    client
        .execute("migrate-set-parameters", Some(unlimited))
        .await?;
    // The disk writes what QEMU wrote while QEMU writes on.
    let behind = WriteBehind::start(file);
    let result = migrate_through(client, "migrate", file, format, limit).await;
    // Its thread is joined off the runtime: its last pass may wait for the disk.
    let _ = tokio::task::spawn_blocking(move || drop(behind)).await;
    if let Some(cap) = cap {
        let back = json!({ "max-bandwidth": cap });
        if let Err(e) = client.execute("migrate-set-parameters", Some(back)).await {
            tracing::warn!("the VM's migration bandwidth cap could not be put back: {e}");
        }
    }
    result
}

/// Poll `query-migrate` until the migration completes, fails or `limit` passes.
async fn wait_for_migration(
    client: &mut QmpClient,
    limit: Duration,
) -> Result<Value, BackendError> {
    let start = Instant::now();
    loop {
        let info = client.execute("query-migrate", None).await?;
        match info.get("status").and_then(Value::as_str) {
            Some("completed") => return Ok(info),
            Some(s @ ("failed" | "cancelled")) => {
                let why = info["error-desc"].as_str().unwrap_or("no reason given");
                return Err(BackendError::Protocol(format!("migration {s}: {why}")));
            }
            _ if start.elapsed() > limit => {
                return Err(BackendError::timeout(limit));
            }
            _ => tokio::time::sleep(POLL).await,
        }
    }
}

pub use crate::vmm_snapshot::Restored;

/// A QEMU to start from saved state: its command line, what memtide adds to it, and
/// where its own monitor and output go.
pub struct Incoming<'a> {
    /// The VM's QEMU command line (program first), as configured.
    pub launch: &'a [String],
    /// Arguments added before memtide's `-incoming defer` and monitor.
    pub extra: Vec<String>,
    /// memtide's own monitor socket for it.
    pub monitor: &'a Path,
    /// Its output.
    pub log: &'a Path,
    /// The whole restore may take this long.
    pub limit: Duration,
}

impl<'a> Incoming<'a> {
    /// A QEMU started by `launch`, with memtide's monitor on `monitor`, its output in
    /// `log`, given `limit` to take its state in.
    pub fn new(launch: &'a [String], monitor: &'a Path, log: &'a Path, limit: Duration) -> Self {
        Incoming {
            launch,
            extra: Vec::new(),
            monitor,
            log,
            limit,
        }
    }
}

/// Start the VM again from the snapshot in `dir`, written in `format`: its launch command
/// with `-incoming defer` and memtide's monitor added, in a process group of its own; the snapshot
/// migrated in; the guest resumed when it was running at the save. A QEMU that fails to
/// restore is killed, the last lines of its output in the error.
pub async fn restore(
    qemu: &Incoming<'_>,
    dir: &Path,
    format: Format,
    resume: bool,
) -> Result<Restored, BackendError> {
    let file = open(&dir.join(MEMORY_FILE))?;
    let started = start_incoming(qemu, &file, format, false, resume).await?;
    started.run().await
}

/// The RAM backend memtide gives a template and its clones: guest RAM in the file `ram`,
/// shared (the template writes it) or private (a clone's writes are its own, copied on
/// write; what it only reads stays the file's pages, one copy for every clone).
fn file_ram(ram: &Path, size: u64, shared: bool, id: &str) -> Vec<String> {
    let share = if shared { "on" } else { "off" };
    vec![
        "-object".into(),
        format!(
            "memory-backend-file,id={id},size={size},mem-path={},share={share}",
            option_value(&ram.display().to_string())
        ),
        "-machine".into(),
        format!("memory-backend={id}"),
    ]
}

/// `value` as one value in a QEMU option list, where a comma ends a value unless doubled
/// (a store under a path with a comma would otherwise add options of its own).
fn option_value(value: &str) -> String {
    value.replace(',', ",,")
}

/// Guest RAM as a clone template gives it: a file, the size of the guest, under the name
/// the saved guest's RAM had (migration finds RAM by name).
pub struct TemplateRam<'a> {
    /// The file.
    pub file: &'a Path,
    /// The guest's RAM size, bytes.
    pub size: u64,
    /// QEMU's name for it (`pc.ram` on x86's machines).
    pub id: &'a str,
}

/// Make a clone template of the snapshot in `dir` (written in `format`): started from it with its RAM in the
/// file `ram`, then its devices alone saved into `devices` (QEMU's `x-ignore-shared`:
/// the RAM is the file) and quit.
pub async fn make_template(
    qemu: &Incoming<'_>,
    dir: &Path,
    format: Format,
    ram: &TemplateRam<'_>,
    devices: &Path,
) -> Result<(), BackendError> {
    let file = open(&dir.join(MEMORY_FILE))?;
    let qemu = Incoming {
        extra: file_ram(ram.file, ram.size, true, ram.id),
        ..*qemu
    };
    let mut started = start_incoming(&qemu, &file, format, false, false).await?;
    let saved = async {
        // Guest state: for root alone, as every memory file of the store.
        let out = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(devices)
            .map_err(|e| BackendError::Io(format!("creating {}: {e}", devices.display())))?;
        ignore_shared(&mut started.client).await?;
        migrate_out(&mut started.client, &out, Format::Stream, qemu.limit).await?;
        out.sync_all().map_err(io)
    }
    .await;
    // Its answer may not come before the connection closes; it is reaped either way.
    let _ = started.client.execute("quit", None).await;
    started.kill();
    saved
}

/// Start a clone from the template (`ram`, `devices`), by its own launch command; resumed
/// when the original ran when saved.
pub async fn clone(
    qemu: &Incoming<'_>,
    ram: &TemplateRam<'_>,
    devices: &Path,
    resume: bool,
) -> Result<Restored, BackendError> {
    let file = open(devices)?;
    let qemu = Incoming {
        extra: file_ram(ram.file, ram.size, false, ram.id),
        ..*qemu
    };
    let started = start_incoming(&qemu, &file, Format::Stream, true, resume).await?;
    started.run().await
}

/// Migrate RAM blocks backed by shared files by reference: not into the stream.
async fn ignore_shared(client: &mut QmpClient) -> Result<(), BackendError> {
    let caps = json!({"capabilities": [{"capability": "x-ignore-shared", "state": true}]});
    client
        .execute("migrate-set-capabilities", Some(caps))
        .await?;
    Ok(())
}

fn open(path: &Path) -> Result<std::fs::File, BackendError> {
    std::fs::File::open(path)
        .map_err(|e| BackendError::Io(format!("opening {}: {e}", path.display())))
}

fn io(e: std::io::Error) -> BackendError {
    BackendError::Io(e.to_string())
}

/// A QEMU that took its state in, its guest paused.
struct Started {
    child: std::process::Child,
    client: QmpClient,
    start: Instant,
    /// The guest is to be resumed (it ran when saved; marked so, [`RESUME_MARK`]).
    resume: bool,
}

impl Started {
    /// Resume the guest if it is to be, its mark then removed, and let the QEMU go on by
    /// itself; one whose guest cannot be resumed is killed.
    async fn run(mut self) -> Result<Restored, BackendError> {
        if self.resume {
            if let Err(e) = self.client.execute("cont", None).await {
                self.kill();
                return Err(e.into());
            }
            // Found by its name: a connection's clean-up may have resumed the guest and
            // removed it first, and its id been taken by another fd set since.
            if let Err(e) = remove_marked(&mut self.client, RESUME_MARK).await {
                tracing::debug!("the restore's mark could not be removed: {e}");
            }
        }
        Ok(Restored {
            pid: self.child.id(),
            elapsed: self.start.elapsed(),
        })
    }

    /// Kill the QEMU (if it has not ended) and reap it.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start `qemu` waiting for its state and migrate `file` in (written in `format`; by
/// reference for shared RAM when `by_reference`), the guest left paused, and marked to be
/// resumed ([`RESUME_MARK`]) when `resume`. A QEMU that fails is killed, the last lines of
/// its output in the error.
async fn start_incoming(
    qemu: &Incoming<'_>,
    file: &std::fs::File,
    format: Format,
    by_reference: bool,
    resume: bool,
) -> Result<Started, BackendError> {
    let start = Instant::now();
    let (program, args) = qemu
        .launch
        .split_first()
        .ok_or_else(|| BackendError::Protocol("the launch command is empty".into()))?;
    let _ = std::fs::remove_file(qemu.monitor);
    let output = crate::vmm_snapshot::log_file(qemu.log)
        .map_err(|e| BackendError::Io(format!("creating {}: {e}", qemu.log.display())))?;
    let mut command = std::process::Command::new(program);
    command
        .args(args)
        .args(&qemu.extra)
        .arg("-incoming")
        .arg("defer")
        .arg("-qmp")
        .arg(format!(
            "unix:{},server=on,wait=off",
            option_value(&qemu.monitor.display().to_string())
        ))
        .stdin(std::process::Stdio::null())
        .stdout(output.try_clone().map_err(io)?)
        .stderr(output);
    // Its own process group: a signal to the starting command's group (Ctrl-C) does not
    // reach it, and the VM outlives the command.
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut child = command
        .spawn()
        .map_err(|e| BackendError::Io(format!("starting {program}: {e}")))?;
    let into = StateIn {
        file,
        format,
        by_reference,
        resume,
    };
    match migrate_in(&mut child, qemu, &into, start).await {
        Ok(client) => Ok(Started {
            child,
            client,
            start,
            resume,
        }),
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            let log = std::fs::read_to_string(qemu.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(3).collect();
            Err(match tail.is_empty() {
                true => e,
                false => BackendError::Protocol(format!("{e} (QEMU: {})", tail.join("; "))),
            })
        }
    }
}

/// What a new QEMU takes in: its state's `file`, written in `format` (by reference for
/// shared RAM when `by_reference`), its guest to be resumed after when `resume`.
struct StateIn<'a> {
    file: &'a std::fs::File,
    format: Format,
    by_reference: bool,
    resume: bool,
}

/// Connect to the new QEMU's monitor once it listens, mark its guest to be resumed if it
/// is to be (best effort), and migrate the state in; a QEMU that exits first (a bad
/// command line) is reported at once.
async fn migrate_in(
    child: &mut std::process::Child,
    qemu: &Incoming<'_>,
    into: &StateIn<'_>,
    start: Instant,
) -> Result<QmpClient, BackendError> {
    let (monitor, limit) = (qemu.monitor, qemu.limit);
    let call = Duration::from_secs(5);
    let mut client = loop {
        match QmpClient::connect(monitor, call).await {
            Ok(c) => break c,
            Err(_) if child.try_wait().is_ok_and(|s| s.is_some()) => {
                let why = "QEMU exited before it took its state in".to_string();
                return Err(BackendError::Disconnected(why));
            }
            Err(_) if start.elapsed() < limit => tokio::time::sleep(POLL).await,
            Err(e) => {
                let why = format!("QEMU's monitor {} did not answer: {e}", monitor.display());
                return Err(BackendError::Disconnected(why));
            }
        }
    };
    if into.by_reference {
        ignore_shared(&mut client).await?;
    }
    if into.resume {
        if let Err(e) = client.add_fd(into.file.as_fd(), RESUME_MARK).await {
            tracing::debug!("no mark of the guest to resume: {e}");
        }
    }
    let left = limit.saturating_sub(start.elapsed());
    migrate_through(
        &mut client,
        "migrate-incoming",
        into.file,
        into.format,
        left,
    )
    .await?;
    Ok(client)
}

/// Remove the fd sets that bear `opaque`.
async fn remove_marked(client: &mut QmpClient, opaque: &str) -> Result<(), QmpError> {
    let sets = client.execute("query-fdsets", None).await?;
    for set in sets.as_array().into_iter().flatten() {
        if bears(set, opaque) {
            let args = json!({ "fdset-id": set["fdset-id"] });
            client.execute("remove-fd", Some(args)).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qmp::client::tests::{ok, serve, HANG_UP};
    use std::sync::{Arc, Mutex};

    #[test]
    fn a_path_with_a_comma_stays_one_value_of_qemus_options() {
        let args = file_ram(Path::new("/srv/a,share=on/ram"), 1 << 20, false, "pc.ram");
        assert_eq!(
            args[1],
            "memory-backend-file,id=pc.ram,size=1048576,mem-path=/srv/a,,share=on/ram,share=off"
        );
    }

    /// A scripted QEMU whose migration ends as `migration` says (its `query-migrate`),
    /// and the commands it was sent (a migration's with its URI, a capability change's
    /// with it).
    async fn qemu(migration: Value) -> (tempfile::TempDir, QmpClient, Arc<Mutex<Vec<String>>>) {
        scripted(migration, None, json!([])).await
    }

    /// [`qemu`] with the migration capabilities `caps` (`query-migrate-capabilities`).
    async fn qemu_with(
        migration: Value,
        caps: Value,
    ) -> (tempfile::TempDir, QmpClient, Arc<Mutex<Vec<String>>>) {
        scripted(migration, None, caps).await
    }

    /// [`qemu_with`], refusing to quit when `refuses` is set: then it ends at `cont` if
    /// `refuses` is `Some(true)`, and answers it otherwise.
    async fn scripted(
        migration: Value,
        refuses: Option<bool>,
        caps: Value,
    ) -> (tempfile::TempDir, QmpClient, Arc<Mutex<Vec<String>>>) {
        let sent = Arc::new(Mutex::new(Vec::new()));
        let log = sent.clone();
        let (dir, path) = serve(move |req| {
            let command = req["execute"].as_str().unwrap().to_string();
            let args = &req["arguments"];
            let logged = match command.as_str() {
                "migrate" => format!("migrate {}", args["uri"].as_str().unwrap()),
                "migrate-set-capabilities" => {
                    let cap = &args["capabilities"][0];
                    format!(
                        "{command} {} {}",
                        cap["capability"].as_str().unwrap(),
                        cap["state"]
                    )
                }
                _ => command.clone(),
            };
            log.lock().unwrap().push(logged);
            match (command.as_str(), refuses) {
                ("query-status", _) => {
                    vec![ok(&req, json!({"running": true, "status": "running"}))]
                }
                ("query-migrate-capabilities", _) => vec![ok(&req, caps.clone())],
                ("add-fd", _) => vec![ok(&req, json!({"fdset-id": 7, "fd": 30}))],
                ("query-migrate", _) => vec![ok(&req, migration.clone())],
                ("query-migrate-parameters", _) => {
                    vec![ok(&req, json!({"max-bandwidth": 134217728}))]
                }
                ("quit", None) | ("cont", Some(true)) => vec![HANG_UP.into()],
                ("quit", Some(_)) => {
                    let error = json!({"class": "GenericError", "desc": "not now"});
                    vec![json!({"error": error, "id": req["id"]}).to_string()]
                }
                _ => vec![ok(&req, json!({}))],
            }
        })
        .await;
        let client = QmpClient::connect(&path, Duration::from_secs(2))
            .await
            .unwrap();
        (dir, client, sent)
    }

    /// QEMU's refusal of `req` (a `cont` whose disk another process locked).
    fn refused(req: &Value) -> String {
        let error = json!({"class": "GenericError", "desc": "Failed to get \"write\" lock"});
        json!({"error": error, "id": req["id"]}).to_string()
    }

    /// A seal that says `outcome`, and whether it ran.
    fn seal(outcome: Result<(), String>) -> (Seal, Arc<Mutex<bool>>) {
        let ran = Arc::new(Mutex::new(false));
        let flag = ran.clone();
        let seal: Seal = Box::new(move |_| {
            *flag.lock().unwrap() = true;
            Box::pin(async move { outcome })
        });
        (seal, ran)
    }

    #[tokio::test]
    async fn a_failed_save_is_cancelled_and_the_guest_resumed() {
        let failed = json!({"status": "failed", "error-desc": "No space left on device"});
        let (dir, mut client, sent) = qemu(failed).await;
        let limit = Duration::from_secs(5);
        let (sealed, ran) = seal(Ok(()));
        let e = save(&mut client, dir.path(), AfterSave::Quit, limit, sealed)
            .await
            .unwrap_err();
        assert_eq!(e.to_string(), "migration failed: No space left on device");
        assert!(!*ran.lock().unwrap(), "nothing to seal");
        let sent = sent.lock().unwrap().clone();
        let expected = [
            "qmp_capabilities",
            "query-status",
            "qom-get",
            "query-migrate-capabilities",
            "add-fd",
            "stop",
            "query-migrate-parameters",
            "migrate-set-parameters",
            "getfd",
            "migrate fd:memtide-snapshot",
            "query-migrate",
            "migrate_cancel",
            "query-migrate",
            "closefd",
            "migrate-set-parameters",
            "cont",
            "query-status",
            "remove-fd",
        ];
        assert_eq!(
            sent, expected,
            "resumed, not quit; marked stopped meanwhile"
        );
    }

    #[tokio::test]
    async fn a_guest_whose_resume_is_refused_after_a_save_keeps_its_mark() {
        // QEMU refuses the `cont` after the snapshot (its disk locked elsewhere): the
        // guest stays stopped, marked, for the next connection to resume.
        let sent = Arc::new(Mutex::new(Vec::new()));
        let (log, running) = (sent.clone(), Arc::new(Mutex::new(true)));
        let (dir, path) = serve(move |req| {
            let command = req["execute"].as_str().unwrap().to_string();
            log.lock().unwrap().push(command.clone());
            let runs = *running.lock().unwrap();
            vec![match command.as_str() {
                "query-status" => ok(&req, json!({"running": runs})),
                "stop" => {
                    *running.lock().unwrap() = false;
                    ok(&req, json!({}))
                }
                "add-fd" => ok(&req, json!({"fdset-id": 7, "fd": 30})),
                "query-migrate" => ok(&req, json!({"status": "completed"})),
                "query-migrate-capabilities" => ok(&req, json!([])),
                "query-fdsets" => ok(
                    &req,
                    json!([{"fdset-id": 7, "fds": [{"fd": 30, "opaque": STOPPED_MARK}]}]),
                ),
                "cont" => refused(&req),
                _ => ok(&req, json!({})),
            }]
        })
        .await;
        let mut client = QmpClient::connect(&path, Duration::from_secs(2))
            .await
            .unwrap();
        let (sealed, _) = seal(Ok(()));
        let limit = Duration::from_secs(5);
        let e = save(&mut client, dir.path(), AfterSave::Run, limit, sealed).await;
        assert!(e.unwrap_err().to_string().contains("lock"));
        assert!(!sent.lock().unwrap().iter().any(|c| c == "remove-fd"));
        assert!(
            left_stopped(&mut client).await,
            "the connection is to be made again"
        );
    }

    #[tokio::test]
    async fn a_qemu_with_mapped_ram_saves_through_an_fd_set_and_turns_it_off_after() {
        let caps = json!([{"capability": "xbzrle", "state": false},
                          {"capability": "mapped-ram", "state": false}]);
        for (migration, saved) in [
            (json!({"status": "completed"}), true),
            (
                json!({"status": "failed", "error-desc": "No space left on device"}),
                false,
            ),
        ] {
            let (dir, mut client, sent) = qemu_with(migration, caps.clone()).await;
            let limit = Duration::from_secs(5);
            let (sealed, _) = seal(Ok(()));
            let result = save(&mut client, dir.path(), AfterSave::Run, limit, sealed).await;
            assert_eq!(result.is_ok(), saved, "{result:?}");
            if let Ok(s) = &result {
                assert_eq!(s.mechanism, MECHANISM_MAPPED_RAM);
                assert_eq!(Format::of(&s.mechanism), Some(Format::MappedRam));
                assert!(
                    s.summed.is_empty(),
                    "not written in order: the seal's to sum"
                );
            }
            let sent = sent.lock().unwrap().clone();
            let at = sent.iter().position(|c| c == "stop").unwrap();
            let mut expected = vec![
                "stop",
                "query-migrate-parameters",
                "migrate-set-parameters",
                "migrate-set-capabilities mapped-ram true",
                "add-fd",
                "migrate file:/dev/fdset/7",
                "query-migrate",
            ];
            if !saved {
                expected.extend(["migrate_cancel", "query-migrate"]);
            }
            expected.extend([
                "remove-fd",
                "migrate-set-capabilities mapped-ram false",
                "migrate-set-parameters",
                "cont",
            ]);
            if !saved {
                expected.push("query-status"); // the guest runs again: its mark goes
            }
            expected.push("remove-fd");
            assert_eq!(sent[at..], expected, "saved: {saved}");
        }
        assert_eq!(Format::of("qmp migrate to fd"), Some(Format::Stream));
        assert_eq!(Format::of("qmp migrate multifd to fdset"), None);
    }

    #[tokio::test]
    async fn a_hibernation_quits_only_once_its_snapshot_is_sealed() {
        let done = json!({"status": "completed"});
        let (dir, mut client, sent) = qemu(done).await;
        let limit = Duration::from_secs(5);
        // QEMU closes the connection as it quits, before answering: saved all the same.
        let (sealed, ran) = seal(Ok(()));
        let saved = save(&mut client, dir.path(), AfterSave::Quit, limit, sealed)
            .await
            .unwrap();
        assert!(saved.was_running && *ran.lock().unwrap());
        let file = std::fs::File::open(dir.path().join(MEMORY_FILE)).unwrap();
        // The stream (empty: this QEMU writes nothing) checksummed as it was written.
        let sum = crate::checksum::file_sum(&file).unwrap();
        assert_eq!(saved.summed, BTreeMap::from([(MEMORY_FILE.into(), sum)]));
        let sent = sent.lock().unwrap().clone();
        let tail = ["query-migrate", "migrate-set-parameters", "quit"];
        assert_eq!(sent[sent.len() - 3..], tail, "the VM's cap put back");
    }

    #[tokio::test]
    async fn a_qemu_that_refuses_to_quit_is_hibernated_if_it_ends_and_runs_on_if_not() {
        let limit = Duration::from_secs(5);
        let (dir, mut client, sent) =
            scripted(json!({"status": "completed"}), Some(false), json!([])).await;
        let e = save(
            &mut client,
            dir.path(),
            AfterSave::Quit,
            limit,
            seal(Ok(())).0,
        )
        .await
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "saved, but QEMU did not quit (GenericError: not now) and still runs; the guest \
             runs on"
        );
        let sent = sent.lock().unwrap().clone();
        let resumed = ["quit", "cont", "query-status", "remove-fd"];
        assert_eq!(sent[sent.len() - 4..], resumed);
        // It ends as it is asked to resume: the guest stopped at its snapshot, hibernated.
        let (dir, mut client, sent) =
            scripted(json!({"status": "completed"}), Some(true), json!([])).await;
        let saved = save(
            &mut client,
            dir.path(),
            AfterSave::Quit,
            limit,
            seal(Ok(())).0,
        )
        .await
        .unwrap();
        assert!(saved.was_running);
        let sent = sent.lock().unwrap().clone();
        assert_eq!(sent[sent.len() - 2..], ["quit", "cont"]);
    }

    #[tokio::test]
    async fn a_hibernation_whose_quit_times_out_while_qemu_runs_is_not_reported_saved() {
        // QEMU (this process, its pid the socket's peer) never answers `quit`: the
        // session memtide closed says nothing, the process runs.
        let (dir, path) = serve(|req| match req["execute"].as_str().unwrap() {
            "quit" => vec![],
            "query-status" => vec![ok(&req, json!({"running": true, "status": "running"}))],
            "query-migrate-capabilities" => vec![ok(&req, json!([]))],
            "query-migrate" => vec![ok(&req, json!({"status": "completed"}))],
            _ => vec![ok(&req, json!({}))],
        })
        .await;
        let mut client = QmpClient::connect(&path, Duration::from_millis(300))
            .await
            .unwrap();
        let (sealed, ran) = seal(Ok(()));
        let limit = Duration::from_secs(5);
        let e = save(&mut client, dir.path(), AfterSave::Quit, limit, sealed)
            .await
            .unwrap_err();
        assert!(*ran.lock().unwrap(), "sealed before the quit");
        assert_eq!(
            e.to_string(),
            "saved, but QEMU did not answer `quit` (no reply within 300 ms) and still runs, \
             the guest paused; memtide's connection to it is closed"
        );
    }

    #[tokio::test]
    async fn a_connection_removes_the_fd_sets_and_mapped_ram_a_cut_short_save_left() {
        // A save whose call timed out left its fd set (and another's, kept) and
        // mapped-ram on; a second QEMU is restoring (`inmigrate`): left alone.
        for incoming in [false, true] {
            let sent = Arc::new(Mutex::new(Vec::new()));
            let log = sent.clone();
            let (_dir, path) = serve(move |req| {
                let command = req["execute"].as_str().unwrap().to_string();
                log.lock()
                    .unwrap()
                    .push(format!("{command} {}", req["arguments"]));
                let status = if incoming { "inmigrate" } else { "paused" };
                vec![match command.as_str() {
                    "query-status" => ok(&req, json!({"running": false, "status": status})),
                    "query-migrate" => ok(&req, json!({"status": "cancelled"})),
                    "query-fdsets" => ok(
                        &req,
                        json!([{"fdset-id": 3, "fds": [{"fd": 30, "opaque": "libvirt"}]},
                               {"fdset-id": 7, "fds": [{"fd": 31, "opaque": FD_NAME}]}]),
                    ),
                    "query-migrate-capabilities" => ok(
                        &req,
                        json!([{"capability": "xbzrle", "state": true},
                               {"capability": "mapped-ram", "state": true}]),
                    ),
                    _ => ok(&req, json!({})),
                }]
            })
            .await;
            let mut client = QmpClient::connect(&path, Duration::from_secs(2))
                .await
                .unwrap();
            assert_eq!(clean_up(&mut client).await, Ok(None));
            let sent = sent.lock().unwrap().clone();
            let mut expected = vec![
                "qmp_capabilities null",
                "query-status null",
                "query-migrate null",
                "query-fdsets null",
            ];
            if !incoming {
                expected.extend([
                    r#"remove-fd {"fdset-id":7}"#,
                    "query-migrate-capabilities null",
                    r#"migrate-set-capabilities {"capabilities":[{"capability":"mapped-ram","state":false}]}"#,
                ]);
            }
            assert_eq!(sent, expected, "incoming: {incoming}");
        }
    }

    /// A QEMU in run state `state` after a migration whose `query-migrate` says
    /// `migration`, cleaned up on connection: the commands it was sent, and what the
    /// clean-up said it resumed.
    async fn cleaned_up(
        state: &'static str,
        migration: &'static str,
        mark: Option<&'static str>,
    ) -> (Vec<String>, Result<Option<String>, BackendError>) {
        cleaned_up_refusing(state, migration, mark, false).await
    }

    /// [`cleaned_up`], QEMU refusing `cont` when `refuses`.
    async fn cleaned_up_refusing(
        state: &'static str,
        migration: &'static str,
        mark: Option<&'static str>,
        refuses: bool,
    ) -> (Vec<String>, Result<Option<String>, BackendError>) {
        let sets = match mark {
            Some(mark) => json!([{"fdset-id": 3, "fds": [{"fd": 40, "opaque": mark}]}]),
            None => json!([]),
        };
        let sent = Arc::new(Mutex::new(Vec::new()));
        let log = sent.clone();
        let (_dir, path) = serve(move |req| {
            let command = req["execute"].as_str().unwrap().to_string();
            log.lock().unwrap().push(command.clone());
            vec![match command.as_str() {
                "query-status" => ok(&req, json!({"running": false, "status": state})),
                "query-migrate" => ok(&req, json!({"status": migration})),
                "query-fdsets" => ok(&req, sets.clone()),
                "query-migrate-capabilities" => ok(&req, json!([])),
                "cont" if refuses => refused(&req),
                _ => ok(&req, json!({})),
            }]
        })
        .await;
        let mut client = QmpClient::connect(&path, Duration::from_secs(2))
            .await
            .unwrap();
        let resumed = clean_up(&mut client).await;
        let sent = sent.lock().unwrap().clone();
        (sent, resumed)
    }

    #[tokio::test]
    async fn a_guest_a_cut_short_save_stopped_is_resumed_and_one_stopped_otherwise_is_not() {
        // The daemon killed mid-save, its mark left: the guest stopped for the save, then
        // by the migration QEMU finished by itself, waits for a `cont`.
        for state in ["paused", "postmigrate", "finish-migrate"] {
            let (sent, resumed) = cleaned_up(state, "completed", Some(STOPPED_MARK)).await;
            let at = |c: &str| sent.iter().position(|s| s == c);
            assert!(at("cont").is_some(), "{state}: {sent:?}");
            assert!(
                at("cont") < at("remove-fd"),
                "resumed, then unmarked: {sent:?}"
            );
            let resumed = resumed.unwrap().expect("said");
            assert!(
                resumed.contains(&format!("left stopped ({state}")) && resumed.contains("save"),
                "{resumed}"
            );
        }
        // Unmarked (paused by its operator, or left by a migration to another host, where
        // it runs now: resuming it would run it twice), or a migration still running:
        // left as it is.
        let saved = Some(STOPPED_MARK);
        for (state, migration, mark) in [
            ("paused", "completed", None),
            ("paused", "none", None),
            ("postmigrate", "completed", None),
            ("finish-migrate", "completed", None),
            ("postmigrate", "active", saved),
            ("finish-migrate", "device", saved),
            ("running", "completed", saved),
            // A restore's mark: only a guest paused once its state is in is resumed.
            ("running", "completed", Some(RESUME_MARK)),
            ("postmigrate", "completed", Some(RESUME_MARK)),
        ] {
            let (sent, resumed) = cleaned_up(state, migration, mark).await;
            assert!(
                !sent.iter().any(|c| c == "cont"),
                "{state}, {migration}: {sent:?}"
            );
            assert_eq!(resumed, Ok(None));
        }
    }

    #[tokio::test]
    async fn a_guest_a_cut_short_restore_left_paused_is_resumed_once_its_state_is_in() {
        // memtide (or its restore command) killed after the state came in: resumed.
        let (sent, resumed) = cleaned_up("paused", "completed", Some(RESUME_MARK)).await;
        let at = |c: &str| sent.iter().position(|s| s == c);
        assert!(
            at("cont") < at("remove-fd"),
            "resumed, then unmarked: {sent:?}"
        );
        let resumed = resumed.unwrap().expect("said");
        assert!(resumed.contains("restore"), "{resumed}");
        // Killed while the state comes in: refused as busy until it is in; killed
        // before it was sent, refused saying so (QEMU waits for it for good).
        for (state, migration, said) in [
            ("paused", "active", "bringing its state in"),
            ("inmigrate", "active", "bringing its state in"),
            ("inmigrate", "none", "kill it"),
        ] {
            let (sent, resumed) = cleaned_up(state, migration, Some(RESUME_MARK)).await;
            assert!(!sent.iter().any(|c| c == "cont" || c == "remove-fd"));
            let Err(BackendError::Busy(why)) = resumed else {
                panic!("{state} {migration}: {resumed:?}");
            };
            assert!(why.contains(said), "{why}");
        }
        // QEMU refuses to resume it: refused as busy, the mark kept for the next try.
        for mark in [RESUME_MARK, STOPPED_MARK] {
            let (sent, resumed) =
                cleaned_up_refusing("paused", "completed", Some(mark), true).await;
            assert!(!sent.iter().any(|c| c == "remove-fd"), "{sent:?}");
            let Err(BackendError::Busy(why)) = resumed else {
                panic!("{resumed:?}");
            };
            assert!(why.contains("write\" lock"), "{why}");
        }
        // Without its mark (a guest saved paused), a restored guest stays paused.
        let (sent, resumed) = cleaned_up("paused", "completed", None).await;
        assert!(!sent.iter().any(|c| c == "cont"));
        assert_eq!(resumed, Ok(None));
    }

    #[tokio::test]
    async fn a_socket_is_seen_listening_without_blocking_even_when_its_backlog_is_full() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qmp.sock");
        assert!(!listening(&path), "no socket");
        // QEMU's monitor: a backlog of one. Never accepted: the backlog fills, and each
        // probe still returns at once.
        let socket = tokio::net::UnixSocket::new_stream().unwrap();
        socket.bind(&path).unwrap();
        let listener = socket.listen(1).unwrap();
        let start = Instant::now();
        for _ in 0..100 {
            assert!(listening(&path));
        }
        assert!(start.elapsed() < Duration::from_secs(5));
        drop(listener);
        assert!(!listening(&path), "a socket file nobody listens on");
    }

    #[tokio::test]
    async fn a_hibernation_whose_snapshot_cannot_be_sealed_runs_on() {
        let done = json!({"status": "completed"});
        let (dir, mut client, sent) = qemu(done).await;
        let limit = Duration::from_secs(5);
        let (sealed, _) = seal(Err("No space left on device".into()));
        let e = save(&mut client, dir.path(), AfterSave::Quit, limit, sealed)
            .await
            .unwrap_err();
        assert_eq!(e.to_string(), "No space left on device; the guest runs on");
        let sent = sent.lock().unwrap().clone();
        let resumed = ["cont", "query-status", "remove-fd"];
        assert_eq!(sent[sent.len() - 3..], resumed, "{sent:?}");
        assert!(!sent.iter().any(|c| c == "quit"), "{sent:?}");
    }
}
