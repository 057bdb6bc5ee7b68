//! Memory snapshots of QEMU guests through QMP: the guest is stopped and its state (RAM
//! and devices) migrated into a file memtide opened and handed to QEMU (`getfd`, then
//! `migrate` to `fd:`, which works from QEMU 2.x on, with no path or shell that a VM's
//! name could break); a restore starts the VM's QEMU again with `-incoming defer` and a
//! monitor of memtide's own, and migrates the file back in.
//!
//! The disk is not part of a memory snapshot: restoring one is safe only onto the disk
//! state it was taken with (a hibernated guest's, untouched since).

use super::client::{QmpClient, QmpError};
use memtide_core::backend::{AfterSave, Saved, Seal};
use memtide_core::BackendError;
use serde_json::{json, Value};
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// The file, in a snapshot's directory, that holds QEMU's migration stream.
pub const MEMORY_FILE: &str = "memory";
/// How often a migration's progress is asked for: a save of a small guest takes a tenth
/// of a second, and every poll interval its end waits adds to the guest's downtime.
const POLL: Duration = Duration::from_millis(5);
/// A migration bandwidth no disk reaches (bytes/s): no cap.
const UNLIMITED: u64 = 1 << 40;
/// The name the snapshot file is handed to QEMU under.
const FD_NAME: &str = "memtide-snapshot";

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
    let path = dir.join(MEMORY_FILE);
    // Guest RAM: for root alone (the store's directories are too).
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| BackendError::Io(format!("creating {}: {e}", path.display())))?;
    let stopped = Instant::now();
    if running {
        client.execute("stop", None).await?;
    }
    if let Err(e) = migrate_out(client, &file, limit).await {
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
    let synced = file
        .sync_all()
        .map_err(|e| BackendError::Io(format!("writing {}: {e}", path.display())));
    let saved = Saved {
        mechanism: "qmp migrate to fd".into(),
        was_running: running,
        downtime: downtime.unwrap_or_else(|| stopped.elapsed()),
        written: stopped.elapsed(),
        ram_backend,
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

/// Migrate the stopped VM into `file`; the final `query-migrate` answer, or why it failed
/// (a migration that fails or outlasts `limit` is cancelled).
async fn migrate_out(
    client: &mut QmpClient,
    file: &std::fs::File,
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
    let result = async {
        client.pass_fd(FD_NAME, file.as_fd()).await?;
        let uri = format!("fd:{FD_NAME}");
        client
            .execute("migrate", Some(json!({ "uri": uri })))
            .await?;
        wait_for_migration(client, limit).await
    }
    .await;
    if result.is_err() {
        let _ = client.execute("migrate_cancel", None).await;
        // QEMU keeps a descriptor it was given until it uses or closes it.
        let _ = client
            .execute("closefd", Some(json!({ "fdname": FD_NAME })))
            .await;
    }
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

/// Start the VM again from the snapshot in `dir`: its launch command with `-incoming
/// defer` and memtide's monitor added, detached in a session of its own; the snapshot
/// migrated in; the guest resumed when it was running at the save. A QEMU that fails to
/// restore is killed, the last lines of its output in the error.
pub async fn restore(
    qemu: &Incoming<'_>,
    dir: &Path,
    resume: bool,
) -> Result<Restored, BackendError> {
    let file = open(&dir.join(MEMORY_FILE))?;
    let started = start_incoming(qemu, &file, false).await?;
    started.run(resume).await
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
            ram.display()
        ),
        "-machine".into(),
        format!("memory-backend={id}"),
    ]
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

/// Make a clone template of the snapshot in `dir`: started from it with its RAM in the
/// file `ram`, then its devices alone saved into `devices` (QEMU's `x-ignore-shared`:
/// the RAM is the file) and quit.
pub async fn make_template(
    qemu: &Incoming<'_>,
    dir: &Path,
    ram: &TemplateRam<'_>,
    devices: &Path,
) -> Result<(), BackendError> {
    let file = open(&dir.join(MEMORY_FILE))?;
    let qemu = Incoming {
        extra: file_ram(ram.file, ram.size, true, ram.id),
        ..*qemu
    };
    let mut started = start_incoming(&qemu, &file, false).await?;
    let saved = async {
        let out = std::fs::File::create(devices)
            .map_err(|e| BackendError::Io(format!("creating {}: {e}", devices.display())))?;
        ignore_shared(&mut started.client).await?;
        migrate_out(&mut started.client, &out, qemu.limit).await?;
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
    let started = start_incoming(&qemu, &file, true).await?;
    started.run(resume).await
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
}

impl Started {
    /// Resume the guest when `resume` (it ran when saved) and let the QEMU go on by
    /// itself; one whose guest cannot be resumed is killed.
    async fn run(mut self, resume: bool) -> Result<Restored, BackendError> {
        if resume {
            if let Err(e) = self.client.execute("cont", None).await {
                self.kill();
                return Err(e.into());
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

/// Start `qemu` waiting for its state and migrate `file` in (by reference for shared RAM
/// when `by_reference`), the guest left paused. A QEMU that fails is killed, the last
/// lines of its output in the error.
async fn start_incoming(
    qemu: &Incoming<'_>,
    file: &std::fs::File,
    by_reference: bool,
) -> Result<Started, BackendError> {
    let start = Instant::now();
    let (program, args) = qemu
        .launch
        .split_first()
        .ok_or_else(|| BackendError::Protocol("the launch command is empty".into()))?;
    let _ = std::fs::remove_file(qemu.monitor);
    let output = std::fs::File::create(qemu.log)
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
            qemu.monitor.display()
        ))
        .stdin(std::process::Stdio::null())
        .stdout(output.try_clone().map_err(io)?)
        .stderr(output);
    // Its own session: the VM outlives the command that started it.
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut child = command
        .spawn()
        .map_err(|e| BackendError::Io(format!("starting {program}: {e}")))?;
    match migrate_in(
        &mut child,
        qemu.monitor,
        file,
        by_reference,
        start,
        qemu.limit,
    )
    .await
    {
        Ok(client) => Ok(Started {
            child,
            client,
            start,
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

/// Connect to the new QEMU's monitor once it listens and migrate `file` in; a QEMU that
/// exits first (a bad command line) is reported at once.
async fn migrate_in(
    child: &mut std::process::Child,
    monitor: &Path,
    file: &std::fs::File,
    by_reference: bool,
    start: Instant,
    limit: Duration,
) -> Result<QmpClient, BackendError> {
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
    if by_reference {
        ignore_shared(&mut client).await?;
    }
    client.pass_fd(FD_NAME, file.as_fd()).await?;
    let uri = format!("fd:{FD_NAME}");
    client
        .execute("migrate-incoming", Some(json!({ "uri": uri })))
        .await?;
    wait_for_migration(&mut client, limit.saturating_sub(start.elapsed())).await?;
    Ok(client)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qmp::client::tests::{ok, serve, HANG_UP};
    use std::sync::{Arc, Mutex};

    /// A scripted QEMU whose migration ends as `migration` says (its `query-migrate`),
    /// and the commands it was sent.
    async fn qemu(migration: Value) -> (tempfile::TempDir, QmpClient, Arc<Mutex<Vec<String>>>) {
        scripted(migration, None).await
    }

    /// [`qemu`], refusing to quit when `refuses` is set: then it ends at `cont` if
    /// `refuses` is `Some(true)`, and answers it otherwise.
    async fn scripted(
        migration: Value,
        refuses: Option<bool>,
    ) -> (tempfile::TempDir, QmpClient, Arc<Mutex<Vec<String>>>) {
        let sent = Arc::new(Mutex::new(Vec::new()));
        let log = sent.clone();
        let (dir, path) = serve(move |req| {
            let command = req["execute"].as_str().unwrap().to_string();
            log.lock().unwrap().push(command.clone());
            match (command.as_str(), refuses) {
                ("query-status", _) => {
                    vec![ok(&req, json!({"running": true, "status": "running"}))]
                }
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
            "stop",
            "query-migrate-parameters",
            "migrate-set-parameters",
            "getfd",
            "migrate",
            "query-migrate",
            "migrate_cancel",
            "closefd",
            "migrate-set-parameters",
            "cont",
        ];
        assert_eq!(sent, expected, "resumed, not quit");
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
        assert!(dir.path().join(MEMORY_FILE).exists());
        let sent = sent.lock().unwrap().clone();
        let tail = ["query-migrate", "migrate-set-parameters", "quit"];
        assert_eq!(sent[sent.len() - 3..], tail, "the VM's cap put back");
    }

    #[tokio::test]
    async fn a_qemu_that_refuses_to_quit_is_hibernated_if_it_ends_and_runs_on_if_not() {
        let limit = Duration::from_secs(5);
        let (dir, mut client, sent) = scripted(json!({"status": "completed"}), Some(false)).await;
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
        assert_eq!(sent[sent.len() - 2..], ["quit", "cont"]);
        // It ends as it is asked to resume: the guest stopped at its snapshot, hibernated.
        let (dir, mut client, sent) = scripted(json!({"status": "completed"}), Some(true)).await;
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
        assert_eq!(sent.last().map(String::as_str), Some("cont"), "{sent:?}");
        assert!(!sent.iter().any(|c| c == "quit"), "{sent:?}");
    }
}
