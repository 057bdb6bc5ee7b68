//! Memory snapshots of QEMU guests through QMP: the guest is stopped and its state (RAM
//! and devices) migrated into a file memtide opened and handed to QEMU (`getfd`, then
//! `migrate` to `fd:`, which works from QEMU 2.x on, with no path or shell that a VM's
//! name could break); a restore starts the VM's QEMU again with `-incoming defer` and a
//! monitor of memtide's own, and migrates the file back in.
//!
//! The disk is not part of a memory snapshot: restoring one is safe only onto the disk
//! state it was taken with (a hibernated guest's, untouched since).

use super::client::{QmpClient, QmpError};
use memtide_core::backend::{AfterSave, Saved};
use memtide_core::BackendError;
use serde_json::{json, Value};
use std::os::fd::AsFd;
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

/// Save the VM behind `client` into `dir` (which must exist), stopping it meanwhile; it
/// then runs again or its QEMU quits (`then`). A save that fails leaves the VM as it was
/// (running again if it ran) and returns QEMU's reason. `limit` bounds the whole save.
pub async fn save(
    client: &mut QmpClient,
    dir: &Path,
    then: AfterSave,
    limit: Duration,
) -> Result<Saved, BackendError> {
    let status = client.execute("query-status", None).await?;
    let running = status.get("running").and_then(Value::as_bool) == Some(true);
    let file = std::fs::File::create(dir.join(MEMORY_FILE))
        .map_err(|e| BackendError::Io(format!("creating {}: {e}", dir.display())))?;
    let stopped = Instant::now();
    if running {
        client.execute("stop", None).await?;
    }
    let migrated = migrate_out(client, &file, limit).await;
    let resumed = match (&migrated, then) {
        (Ok(_), AfterSave::Quit) => client.execute("quit", None).await.map(drop),
        _ if running => client.execute("cont", None).await.map(drop),
        _ => Ok(()),
    };
    let downtime = stopped.elapsed();
    let stats = migrated?;
    // A quit may close the connection before its answer: the save is done either way.
    if let Err(e) = resumed {
        if then != AfterSave::Quit || !matches!(e, QmpError::Closed(_) | QmpError::Io(_)) {
            return Err(e.into());
        }
    }
    file.sync_all()
        .map_err(|e| BackendError::Io(format!("writing {}: {e}", dir.display())))?;
    Ok(Saved {
        mechanism: "qmp migrate to fd".into(),
        was_running: running,
        downtime,
        written: stopped.elapsed(),
        ram_bytes: stats.get("ram").and_then(|r| r["total"].as_u64()),
    })
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
    }
    if let Some(cap) = cap {
        let back = json!({ "max-bandwidth": cap });
        let _ = client.execute("migrate-set-parameters", Some(back)).await;
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

/// A restored VM: its new QEMU process and how long the restore took.
#[derive(Debug)]
pub struct Restored {
    /// The QEMU process.
    pub pid: u32,
    /// From starting QEMU to the guest running (or paused, as it was saved).
    pub elapsed: Duration,
}

/// Start the VM again from the snapshot in `dir`: `launch` (its QEMU command line, as
/// configured) with `-incoming defer` and a monitor on `monitor` added, detached in a
/// session of its own with its output in `log`; the snapshot migrated in; the guest
/// resumed when it was running at the save. A QEMU that fails to restore is killed.
pub async fn restore(
    launch: &[String],
    dir: &Path,
    monitor: &Path,
    log: &Path,
    resume: bool,
    limit: Duration,
) -> Result<Restored, BackendError> {
    let start = Instant::now();
    let (program, args) = launch
        .split_first()
        .ok_or_else(|| BackendError::Protocol("the launch command is empty".into()))?;
    let file = std::fs::File::open(dir.join(MEMORY_FILE))
        .map_err(|e| BackendError::Io(format!("opening {}: {e}", dir.display())))?;
    let _ = std::fs::remove_file(monitor);
    let output = std::fs::File::create(log)
        .map_err(|e| BackendError::Io(format!("creating {}: {e}", log.display())))?;
    let mut command = std::process::Command::new(program);
    command
        .args(args)
        .arg("-incoming")
        .arg("defer")
        .arg("-qmp")
        .arg(format!("unix:{},server=on,wait=off", monitor.display()))
        .stdin(std::process::Stdio::null())
        .stdout(output.try_clone().map_err(io)?)
        .stderr(output);
    // Its own session: the VM outlives the command that restored it.
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut child = command
        .spawn()
        .map_err(|e| BackendError::Io(format!("starting {program}: {e}")))?;
    let pid = child.id();
    let result = migrate_in(monitor, &file, resume, start, limit).await;
    if let Err(e) = result {
        let _ = child.kill();
        let _ = child.wait();
        let log_tail = std::fs::read_to_string(log).unwrap_or_default();
        let tail: String = log_tail
            .lines()
            .rev()
            .take(3)
            .collect::<Vec<_>>()
            .join("; ");
        return Err(match tail.is_empty() {
            true => e,
            false => BackendError::Protocol(format!("{e} (QEMU: {tail})")),
        });
    }
    Ok(Restored {
        pid,
        elapsed: start.elapsed(),
    })
}

fn io(e: std::io::Error) -> BackendError {
    BackendError::Io(e.to_string())
}

/// Connect to the new QEMU's monitor once it listens, migrate `file` in, and resume.
async fn migrate_in(
    monitor: &Path,
    file: &std::fs::File,
    resume: bool,
    start: Instant,
    limit: Duration,
) -> Result<(), BackendError> {
    let call = Duration::from_secs(5);
    let mut client = loop {
        match QmpClient::connect(monitor, call).await {
            Ok(c) => break c,
            Err(_) if start.elapsed() < limit => tokio::time::sleep(POLL).await,
            Err(e) => {
                let why = format!("QEMU's monitor {} did not answer: {e}", monitor.display());
                return Err(BackendError::Disconnected(why));
            }
        }
    };
    client.pass_fd(FD_NAME, file.as_fd()).await?;
    let uri = format!("fd:{FD_NAME}");
    client
        .execute("migrate-incoming", Some(json!({ "uri": uri })))
        .await?;
    wait_for_migration(&mut client, limit.saturating_sub(start.elapsed())).await?;
    if resume {
        client.execute("cont", None).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qmp::client::tests::{ok, serve, HANG_UP};
    use std::sync::{Arc, Mutex};

    /// A scripted QEMU whose migration ends as `migration` says (its `query-migrate`),
    /// and the commands it was sent.
    async fn qemu(migration: Value) -> (tempfile::TempDir, QmpClient, Arc<Mutex<Vec<String>>>) {
        let sent = Arc::new(Mutex::new(Vec::new()));
        let log = sent.clone();
        let (dir, path) = serve(move |req| {
            let command = req["execute"].as_str().unwrap().to_string();
            log.lock().unwrap().push(command.clone());
            match command.as_str() {
                "query-status" => vec![ok(&req, json!({"running": true, "status": "running"}))],
                "query-migrate" => vec![ok(&req, migration.clone())],
                "query-migrate-parameters" => {
                    vec![ok(&req, json!({"max-bandwidth": 134217728}))]
                }
                "quit" => vec![HANG_UP.into()],
                _ => vec![ok(&req, json!({}))],
            }
        })
        .await;
        let client = QmpClient::connect(&path, Duration::from_secs(2))
            .await
            .unwrap();
        (dir, client, sent)
    }

    #[tokio::test]
    async fn a_failed_save_is_cancelled_and_the_guest_resumed() {
        let failed = json!({"status": "failed", "error-desc": "No space left on device"});
        let (dir, mut client, sent) = qemu(failed).await;
        let limit = Duration::from_secs(5);
        let e = save(&mut client, dir.path(), AfterSave::Quit, limit)
            .await
            .unwrap_err();
        assert_eq!(e.to_string(), "migration failed: No space left on device");
        let sent = sent.lock().unwrap().clone();
        let expected = [
            "qmp_capabilities",
            "query-status",
            "stop",
            "query-migrate-parameters",
            "migrate-set-parameters",
            "getfd",
            "migrate",
            "query-migrate",
            "migrate_cancel",
            "migrate-set-parameters",
            "cont",
        ];
        assert_eq!(sent, expected, "resumed, not quit");
    }

    #[tokio::test]
    async fn a_hibernation_quits_once_the_state_is_written() {
        let done = json!({"status": "completed", "ram": {"total": 402653184u64}});
        let (dir, mut client, sent) = qemu(done).await;
        let limit = Duration::from_secs(5);
        // QEMU closes the connection as it quits, before answering: saved all the same.
        let saved = save(&mut client, dir.path(), AfterSave::Quit, limit)
            .await
            .unwrap();
        assert!(saved.was_running);
        assert_eq!(saved.ram_bytes, Some(402653184));
        assert!(dir.path().join(MEMORY_FILE).exists());
        let sent = sent.lock().unwrap().clone();
        let tail = ["query-migrate", "migrate-set-parameters", "quit"];
        assert_eq!(sent[sent.len() - 3..], tail, "the VM's cap put back");
    }
}
