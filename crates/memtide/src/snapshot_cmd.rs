//! `memtide snapshot`: list, restore and delete the VM memory snapshots in the store
//! (a save goes through the running daemon, which holds the VMs' connections:
//! [`crate::control::request_save`]).

use crate::config::Config;
use crate::snapshots::{self, Snapshot, Store};
use anyhow::{bail, Context};
use memtide_adapters::qmp::snapshot::{self as qmp_snapshot, Incoming, TemplateRam};
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
/// checksums are verified first. Only a hibernation not woken from yet matches the
/// guest's disk: another snapshot (its guest ran on) is restored only with `force`.
/// Returns a line saying what was done.
pub async fn restore(
    config: &Config,
    vm: &str,
    id: Option<&str>,
    force: bool,
) -> anyhow::Result<String> {
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
    let asleep = snapshot.asleep();
    if !asleep && !force {
        let why = match &snapshot.woken {
            Some(at) => format!("its guest was woken from it at {at}"),
            None => "its guest ran on after it".into(),
        };
        bail!(
            "snapshot {} of {vm}: {why}, so its disk has changed since; restoring this memory \
             over it can corrupt the guest's file systems. Pass --force if its disks were \
             rolled back to that moment",
            snapshot.id
        );
    }
    store.verify(&snapshot)?;
    let dir = store.dir_of(&snapshot);
    let vm_dir = store.vm_dir(vm);
    let (monitor, log) = (vm_dir.join("restore.qmp"), vm_dir.join("restore.log"));
    let limit = Duration::from_secs(config.snapshots.timeout_s);
    let qemu = Incoming::new(launch, &monitor, &log, limit);
    let restored = qmp_snapshot::restore(&qemu, &dir, snapshot.was_running)
        .await
        .with_context(|| format!("restoring {vm} from {}", snapshot.id))?;
    if asleep {
        store.mark_woken(&snapshot)?;
    }
    Ok(format!(
        "{vm} restored from {} in {:.2} s (QEMU pid {}, its output in {})",
        snapshot.id,
        restored.elapsed.as_secs_f64(),
        restored.pid,
        log.display()
    ))
}

/// Start `count` clones of VM `vm` from its snapshot `id` (its latest by default), each
/// by the VM's `clone_launch` with `{n}` its number, all sharing the snapshot's memory
/// until they write it: the snapshot is made a template first (its RAM in a file, kept in
/// the snapshot's directory for the next clones). Returns a line per clone.
pub async fn clone(
    config: &Config,
    vm: &str,
    count: u32,
    id: Option<&str>,
) -> anyhow::Result<Vec<String>> {
    let Some(vm_config) = config.vms.iter().find(|v| v.name == vm) else {
        bail!("VM {vm} is not among the configuration's [[vm]] entries");
    };
    let Some(launch) = &vm_config.clone_launch else {
        bail!("VM {vm} has no `clone_launch` command in the configuration: memtide cannot start its clones");
    };
    let store = Store::new(&config.snapshots.dir);
    let snapshot = store.find(vm, id)?;
    store.verify(&snapshot)?;
    let dir = store.dir_of(&snapshot);
    let vm_dir = store.vm_dir(vm);
    let limit = Duration::from_secs(config.snapshots.timeout_s);
    // The QEMU started as `name` (its monitor and output beside the snapshots) by the
    // clone command numbered `n`.
    let numbered = |name: &str, n: &str| {
        let launch: Vec<String> = launch.iter().map(|a| a.replace("{n}", n)).collect();
        let (monitor, log) = (
            vm_dir.join(format!("{name}.qmp")),
            vm_dir.join(format!("{name}.log")),
        );
        (launch, monitor, log)
    };
    let size = snapshot.configured.0;
    // QEMU names x86 machines' RAM `pc.ram` unless told otherwise.
    let ram_id = snapshot.ram_backend.as_deref().unwrap_or("pc.ram");
    let template = dir.join("template");
    if !template.join("devices").exists() {
        // The template's RAM file is as large as the guest.
        crate::snapshots::room_for(&dir, snapshot.configured).context("no clone template")?;
        let partial = dir.join("template.partial");
        let _ = std::fs::remove_dir_all(&partial);
        crate::snapshots::private_dirs(&partial)?;
        let (launch, monitor, log) = numbered("template", "template");
        let qemu = Incoming::new(&launch, &monitor, &log, limit);
        let ram = TemplateRam {
            file: &partial.join("ram"),
            size,
            id: ram_id,
        };
        qmp_snapshot::make_template(&qemu, &dir, &ram, &partial.join("devices"))
            .await
            .with_context(|| format!("making a clone template of {vm} from {}", snapshot.id))?;
        std::fs::rename(&partial, &template)
            .with_context(|| format!("renaming {}", partial.display()))?;
    }
    let mut lines = Vec::new();
    // The lowest numbers whose clone is not running (its monitor does not answer).
    let free = (1..).filter(|n| {
        let monitor = vm_dir.join(format!("clone-{n}.qmp"));
        std::os::unix::net::UnixStream::connect(monitor).is_err()
    });
    for n in free.take(count as usize).collect::<Vec<u32>>() {
        let (launch, monitor, log) = numbered(&format!("clone-{n}"), &n.to_string());
        let qemu = Incoming::new(&launch, &monitor, &log, limit);
        let ram = TemplateRam {
            file: &template.join("ram"),
            size,
            id: ram_id,
        };
        let devices = template.join("devices");
        let started = qmp_snapshot::clone(&qemu, &ram, &devices, snapshot.was_running)
            .await
            .with_context(|| format!("starting clone {n} of {vm}"))?;
        lines.push(format!(
            "{vm} clone {n} started from {} in {:.2} s (QEMU pid {}, its output in {})",
            snapshot.id,
            started.elapsed.as_secs_f64(),
            started.pid,
            log.display()
        ));
    }
    Ok(lines)
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
