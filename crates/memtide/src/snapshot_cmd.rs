//! `memtide snapshot`: list, restore and delete the VM memory snapshots in the store
//! (a save goes through the running daemon, which holds the VMs' connections:
//! [`crate::control::request_save`]).

use crate::config::Config;
use crate::snapshots::{self, Snapshot, Store};
use anyhow::{bail, Context};
use memtide_adapters::qmp::snapshot as qmp_snapshot;
use memtide_core::Bytes;
use std::time::Duration;

/// A table of `snapshots` (every VM's when `vm` is `None`), or JSON.
pub fn list(config: &Config, vm: Option<&str>, json: bool) -> anyhow::Result<String> {
    let store = Store::new(&config.snapshots.dir);
    let found = match vm {
        Some(vm) => store.list(vm)?,
        None => store.list_all()?,
    };
    if json {
        return Ok(serde_json::to_string_pretty(&found)? + "\n");
    }
    let mut out = format!(
        "{:<16} {:<22} {:>10} {:>8} {:>8}  {}\n",
        "VM", "ID", "SIZE", "SAVE s", "AGE", "THEN"
    );
    for s in &found {
        let age = snapshots::age(s).map_or("?".into(), humantime_short);
        let then = serde_json::to_value(s.then).expect("serializes");
        out += &format!(
            "{:<16} {:<22} {:>10} {:>8.1} {:>8}  {}\n",
            s.vm,
            s.id,
            Bytes(s.bytes()).to_string(),
            s.save_s,
            age,
            then.as_str().unwrap_or_default()
        );
    }
    if found.is_empty() {
        out += &format!("(no snapshots in {})\n", config.snapshots.dir.display());
    }
    Ok(out)
}

/// Seconds, minutes, hours or days, whichever reads best.
fn humantime_short(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        7200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// Start VM `vm` again from its snapshot `id` (its latest by default): the VM must be
/// one reached through `qmp` with a `launch` command, and not running; the snapshot's
/// checksums are verified first. Returns a line saying what was done.
pub async fn restore(config: &Config, vm: &str, id: Option<&str>) -> anyhow::Result<String> {
    let Some(vm_config) = config.vms.iter().find(|v| v.name == vm) else {
        bail!(
            "VM {vm} is not among the configuration's [[vm]] entries: memtide restores only \
             VMs it knows how to start (`qmp` and `launch`)"
        );
    };
    let (Some(qmp), Some(launch)) = (&vm_config.qmp, &vm_config.launch) else {
        bail!("VM {vm} has no `launch` command (and `qmp` socket) in the configuration: memtide cannot start its QEMU");
    };
    if std::os::unix::net::UnixStream::connect(qmp).is_ok() {
        bail!(
            "VM {vm} is running (its QMP socket {} answers): stop it before restoring it",
            qmp.display()
        );
    }
    let store = Store::new(&config.snapshots.dir);
    let snapshot = store.find(vm, id)?;
    store.verify(&snapshot)?;
    let dir = store.dir_of(&snapshot);
    let vm_dir = store.vm_dir(vm);
    let (monitor, log) = (vm_dir.join("restore.qmp"), vm_dir.join("restore.log"));
    let limit = Duration::from_secs(config.snapshots.timeout_s);
    let restored = qmp_snapshot::restore(launch, &dir, &monitor, &log, snapshot.was_running, limit)
        .await
        .with_context(|| format!("restoring {vm} from {}", snapshot.id))?;
    Ok(format!(
        "{vm} restored from {} in {:.2} s (QEMU pid {}, its output in {})",
        snapshot.id,
        restored.elapsed.as_secs_f64(),
        restored.pid,
        log.display()
    ))
}

/// Delete VM `vm`'s snapshot `id`.
pub fn delete(config: &Config, vm: &str, id: &str) -> anyhow::Result<Snapshot> {
    let store = Store::new(&config.snapshots.dir);
    let snapshot = store.find(vm, Some(id))?;
    store.delete(&snapshot)?;
    Ok(snapshot)
}

/// A line describing a snapshot the daemon saved (its JSON description).
pub fn saved_line(snapshot: &serde_json::Value) -> anyhow::Result<String> {
    let s: Snapshot =
        serde_json::from_value(snapshot.clone()).context("unexpected snapshot description")?;
    Ok(s.summary())
}
