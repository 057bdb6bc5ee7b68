//! `memtide snapshot`: list, restore and delete the VM memory snapshots in the store
//! (a save goes through the running daemon, which holds the VMs' connections:
//! [`crate::control::request_save`]).

use crate::config::{Config, VmConfig};
use crate::snapshots::{self, Snapshot, Store};
use anyhow::{bail, Context};
use memtide_adapters::qmp::snapshot::{self as qmp_snapshot, Incoming, TemplateRam};
use memtide_adapters::{cloud_hypervisor, firecracker, vmm_snapshot};
use memtide_core::Bytes;
use std::path::Path;
use std::time::Duration;

/// A table of `snapshots` (every VM's when `vm` is `None`), or JSON.
pub fn list(config: &Config, vm: Option<&str>, json: bool) -> anyhow::Result<String> {
    let store = Store::new(&config.snapshots.dir);
    // Read once: a description that does not read is warned of once.
    let (found, newer) = store.listing(vm)?;
    if json {
        return Ok(serde_json::to_string_pretty(&found)? + "\n");
    }
    let mut out = format!(
        "{:<16} {:<22} {:>10} {:>8} {:>8}  {:<5} {:<12} {}\n",
        "VM", "ID", "SIZE", "SAVE s", "AGE", "THEN", "BY", "WOKEN"
    );
    let word = |v: serde_json::Value| v.as_str().unwrap_or_default().to_string();
    for s in &found {
        let age = snapshots::age(s).map_or("?".into(), humantime_short);
        let then = word(serde_json::to_value(s.then).expect("serializes"));
        let by = word(serde_json::to_value(s.by).expect("serializes"));
        // A hibernation not woken from is the one `restore` brings back without --force.
        let woken = match (&s.woken, s.asleep()) {
            (Some(at), _) => at.clone(),
            (None, true) => "asleep".to_string(),
            (None, false) => "-".to_string(),
        };
        out += &format!(
            "{:<16} {:<22} {:>10} {:>8.1} {:>8}  {:<5} {:<12} {woken}\n",
            s.vm,
            s.id,
            Bytes(s.bytes()).to_string(),
            s.save_s,
            age,
            then,
            by
        );
    }
    let dir = &config.snapshots.dir;
    match (found.is_empty() && newer.is_empty(), dir.exists()) {
        (false, _) => {}
        (true, true) => match vm {
            Some(vm) => out += &format!("(no snapshots of {vm} in {})\n", dir.display()),
            None => out += &format!("(no snapshots in {})\n", dir.display()),
        },
        // A mistyped `[snapshots] dir` is told from a store not used yet.
        (true, false) => {
            out += &format!(
                "(no snapshots: {} does not exist; the first save makes it)\n",
                dir.display()
            )
        }
    }
    let unfinished = store.unfinished()?;
    let unfinished: Vec<_> = match vm {
        Some(vm) => unfinished.into_iter().filter(|u| u.vm == vm).collect(),
        None => unfinished,
    };
    if !unfinished.is_empty() {
        out += "\nSaves not finished (cut short, or under way now):\n";
        for left in unfinished {
            out += &format!("- {}\n", left.describe());
        }
    }
    // Not in the table, whose columns this memtide cannot fill from them; not lost either.
    if !newer.is_empty() {
        out += "\nSnapshots of a newer memtide (not read here):\n";
        for newer in newer {
            out += &format!("- {newer}\n");
        }
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

/// How a VM is started again from a snapshot, by its `[[vm]]` entry.
#[derive(Debug, PartialEq)]
enum Starter<'a> {
    /// Its QEMU, by `launch`, over memtide's own monitor.
    Qemu { qmp: &'a Path, launch: &'a [String] },
    /// A Firecracker process, by `launch`, over its API socket.
    Firecracker {
        socket: &'a Path,
        launch: &'a [String],
    },
    /// A Cloud Hypervisor process, by `launch`, over its API socket.
    CloudHypervisor {
        socket: &'a Path,
        launch: &'a [String],
    },
    /// libvirt, which starts the domain itself.
    Libvirt { uri: &'a str },
}

/// How memtide starts VM `vm` again, or why it cannot (a VM it only discovered, one
/// without `launch`).
fn starter<'a>(config: &'a Config, vm: &str) -> anyhow::Result<Starter<'a>> {
    let Some(vm_config) = config.vms.iter().find(|v| v.name == vm) else {
        bail!(
            "VM {vm} is not among the configuration's [[vm]] entries: memtide restores only \
             VMs it knows how to start (`qmp`, `firecracker` or `cloud_hypervisor` with \
             `launch`, or `libvirt`)"
        );
    };
    Starter::of(vm_config)
}

/// Why memtide could not start VM `vm` again from a snapshot, if it could not: a
/// hibernation of it would end a VM memtide cannot wake.
pub fn cannot_restore(config: &Config, vm: &str) -> Option<String> {
    starter(config, vm).err().map(|e| format!("{e:#}"))
}

impl<'a> Starter<'a> {
    /// How `vm` is started, or why memtide cannot start it.
    fn of(vm: &'a VmConfig) -> anyhow::Result<Starter<'a>> {
        let name = &vm.name;
        let no_launch = |what: &str| {
            anyhow::anyhow!(
                "VM {name} has no `launch` command in the configuration: memtide cannot start \
                 its {what} to restore it into"
            )
        };
        let launch = vm.launch.as_deref();
        Ok(if let Some(qmp) = &vm.qmp {
            let launch = launch.ok_or_else(|| no_launch("QEMU"))?;
            Starter::Qemu { qmp, launch }
        } else if let Some(socket) = &vm.firecracker {
            let launch = launch.ok_or_else(|| no_launch("Firecracker process"))?;
            Starter::Firecracker { socket, launch }
        } else if let Some(socket) = &vm.cloud_hypervisor {
            let launch = launch.ok_or_else(|| no_launch("Cloud Hypervisor process"))?;
            Starter::CloudHypervisor { socket, launch }
        } else if let Some(uri) = &vm.libvirt {
            Starter::Libvirt { uri }
        } else {
            bail!("VM {name} has no connector in the configuration")
        })
    }

    /// The connector's word that begins the mechanism of the snapshots it saves.
    fn connector(&self) -> &'static str {
        match self {
            Starter::Qemu { .. } => "qmp",
            Starter::Firecracker { .. } => "firecracker",
            Starter::CloudHypervisor { .. } => "cloud-hypervisor",
            Starter::Libvirt { .. } => "libvirt",
        }
    }

    /// Why the VM cannot be restored now: its socket answers, it runs (libvirt checks
    /// its domain itself). Never blocks: a QEMU whose one monitor client is connected
    /// (the daemon's) and whose backlog is full counts as answering.
    fn running(&self) -> Option<String> {
        let (socket, what) = match self {
            Starter::Qemu { qmp, .. } => (qmp, "QMP socket"),
            Starter::Firecracker { socket, .. } | Starter::CloudHypervisor { socket, .. } => {
                (socket, "API socket")
            }
            Starter::Libvirt { .. } => return None,
        };
        qmp_snapshot::listening(socket).then(|| format!("its {what} {} answers", socket.display()))
    }
}

/// Start VM `vm` again from its snapshot `id` (its latest by default), through the
/// connector that saved it: QEMU, Firecracker and Cloud Hypervisor by the VM's `launch`
/// command, a libvirt domain by libvirt. The VM must not run; the snapshot's checksums
/// are verified first. Only a hibernation not woken from yet matches the guest's disk:
/// another snapshot (its guest ran on) is restored only with `force`. One restore of a
/// VM at a time (the operator's, the daemon's wake or crash recovery): the store's lock
/// is held from the check that the VM does not run until it runs.
pub async fn restore(
    config: &Config,
    vm: &str,
    id: Option<&str>,
    force: bool,
) -> anyhow::Result<Started> {
    let starter = starter(config, vm)?;
    let store = Store::new(&config.snapshots.dir);
    let _restoring = store.lock_restore(vm)?;
    if let Some(why) = starter.running() {
        bail!("VM {vm} is running ({why}): stop it before restoring it");
    }
    let snapshot = store.find(vm, id)?;
    let saved_by = saved_through(&snapshot);
    if saved_by != starter.connector() {
        bail!(
            "snapshot {} of {vm} was saved through {saved_by}, and the VM is configured \
             through {}: each connector restores only its own snapshots",
            snapshot.id,
            starter.connector()
        );
    }
    // Before its checksums, which take seconds a GiB.
    restorable(&snapshot, starter.connector())?;
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
    // A checksum of the whole memory file: off the runtime's workers (the daemon's wake
    // runs this on its single worker).
    let (verifying, of) = (store.clone(), snapshot.clone());
    tokio::task::spawn_blocking(move || verifying.verify(&of)).await??;
    start_from(config, vm, starter, &store, &snapshot).await
}

/// Start VM `vm` again after its QEMU died by itself (`[[vm]] restore_on_crash`), from
/// its newest snapshot whose files match their checksums, whoever took it (a damaged one
/// is skipped, and said): its guest ran on after it, so its disk has moved on since
/// (docs/snapshots.md).
pub async fn recover(config: &Config, vm: &str) -> anyhow::Result<Started> {
    let Some(vm_config) = config.vms.iter().find(|v| v.name == vm) else {
        bail!("VM {vm} is not among the configuration's [[vm]] entries");
    };
    let starter = Starter::of(vm_config)?;
    let store = Store::new(&config.snapshots.dir);
    let _restoring = store.lock_restore(vm)?;
    if let Some(why) = starter.running() {
        bail!("VM {vm} is running again ({why})");
    }
    let (snapshot, skipped) = {
        let (store, vm, connector) = (store.clone(), vm.to_string(), starter.connector());
        tokio::task::spawn_blocking(move || newest_good(&store, &vm, connector)).await??
    };
    let mut started = start_from(config, vm, starter, &store, &snapshot).await?;
    if !skipped.is_empty() {
        started.line = format!(
            "{}; newer ones damaged: {}",
            started.line,
            skipped.join("; ")
        );
    }
    Ok(started)
}

/// A VM started from a snapshot.
#[derive(Debug)]
pub struct Started {
    /// What was done.
    pub line: String,
    /// Why its hibernation could not be marked woken, if it could not: the VM runs all
    /// the same, and the hibernation must not be restored over it.
    pub unmarked: Option<String>,
}

/// Mark hibernation `snapshot` woken once its VM started from it (`line`).
fn woken(store: &Store, snapshot: &Snapshot, line: String) -> Started {
    let unmarked = match snapshot.asleep() {
        true => store.mark_woken(snapshot).err().map(|e| {
            format!(
                "it runs, but its hibernation {} could not be marked woken ({e:#}): do not \
                 restore it again while the guest runs",
                snapshot.id
            )
        }),
        false => None,
    };
    Started { line, unmarked }
}

/// The newest snapshot of `vm` saved through `connector` whose files match their
/// checksums, and why each newer one was passed over; an error where a newer memtide
/// wrote the newest ([`Store::history`]).
fn newest_good(
    store: &Store,
    vm: &str,
    connector: &str,
) -> anyhow::Result<(Snapshot, Vec<String>)> {
    let mut skipped = Vec::new();
    for s in store.history(vm)?.into_iter().rev() {
        if saved_through(&s) != connector {
            continue;
        }
        // Not passed over for an older one: this build would restore that in its place.
        restorable(&s, connector)?;
        match store.verify(&s) {
            Ok(()) => return Ok((s, skipped)),
            Err(e) => {
                store.uncache(&s);
                skipped.push(format!("{}: {e:#}", s.id));
            }
        }
    }
    match skipped.is_empty() {
        true => bail!("no snapshot of {vm} saved through {connector} in the store"),
        false => bail!(
            "no good snapshot of {vm} in the store: {}",
            skipped.join("; ")
        ),
    }
}

/// The connector that saved `s` (the first word of its mechanism).
fn saved_through(s: &Snapshot) -> &str {
    s.mechanism.split_whitespace().next().unwrap_or("")
}

/// Whether snapshot `s`, saved through `connector`, is in a form this build restores (a
/// QEMU snapshot's, [`qemu_format`]; the other connectors have one form each).
fn restorable(s: &Snapshot, connector: &str) -> anyhow::Result<()> {
    match connector {
        "qmp" => qemu_format(s).map(drop),
        _ => Ok(()),
    }
}

/// The form QEMU wrote snapshot `s` in, or an error where this build does not know it (a
/// newer memtide's way of saving: found by the compatibility audit, any was restored as
/// the plain stream).
fn qemu_format(s: &Snapshot) -> anyhow::Result<qmp_snapshot::Format> {
    qmp_snapshot::Format::of(&s.mechanism).with_context(|| {
        format!(
            "snapshot {} of {} was saved as '{}', which this memtide cannot restore: \
             upgrade memtide",
            s.id,
            s.vm,
            memtide_core::guest_text::clean(&s.mechanism)
        )
    })
}

/// Drops a snapshot's files from the host's page cache when it goes out of scope: its
/// check left them there for the restore or clone template that reads them next; after
/// that, started or failed, the cached copy only takes the host's memory.
struct Uncache<'a>(&'a Store, &'a Snapshot);

impl Drop for Uncache<'_> {
    fn drop(&mut self) {
        self.0.uncache(self.1);
    }
}

/// Start VM `vm` from `snapshot`, checked and verified, through `starter`; marks a
/// hibernation woken.
async fn start_from(
    config: &Config,
    vm: &str,
    starter: Starter<'_>,
    store: &Store,
    snapshot: &Snapshot,
) -> anyhow::Result<Started> {
    let _uncache = Uncache(store, snapshot);
    let dir = store.dir_of(snapshot);
    let vm_dir = store.vm_dir(vm);
    let log = vm_dir.join("restore.log");
    let limit = Duration::from_secs(config.snapshots.timeout_s);
    let resume = snapshot.was_running;
    let program = match starter {
        Starter::Firecracker { .. } => "Firecracker",
        Starter::CloudHypervisor { .. } => "Cloud Hypervisor",
        _ => "QEMU",
    };
    let vmm = |command, socket, ping| vmm_snapshot::Launch {
        command,
        socket,
        ping,
        log: &log,
        limit,
    };
    let restored = match starter {
        Starter::Qemu { launch, .. } => {
            let monitor = vm_dir.join("restore.qmp");
            let qemu = Incoming::new(launch, &monitor, &log, limit);
            let format = qemu_format(snapshot)?;
            qmp_snapshot::restore(&qemu, &dir, format, resume).await
        }
        Starter::Firecracker { socket, launch } => {
            firecracker::restore(&vmm(launch, socket, "/"), &dir, resume).await
        }
        Starter::CloudHypervisor { socket, launch } => {
            let ping = "/api/v1/vmm.ping";
            cloud_hypervisor::restore(&vmm(launch, socket, ping), &dir, resume).await
        }
        Starter::Libvirt { uri } => {
            let done = restore_domain(uri, vm, &dir, resume, limit)
                .await
                .with_context(|| format!("restoring {vm} from {}", snapshot.id))?;
            let line = format!(
                "{vm} restored from {} in {:.2} s by libvirt ({uri})",
                snapshot.id,
                done.as_secs_f64()
            );
            return Ok(woken(store, snapshot, line));
        }
    }
    .with_context(|| format!("restoring {vm} from {}", snapshot.id))?;
    let line = format!(
        "{vm} restored from {} in {:.2} s ({program} pid {}, its output in {})",
        snapshot.id,
        restored.elapsed.as_secs_f64(),
        restored.pid,
        log.display()
    );
    Ok(woken(store, snapshot, line))
}

/// libvirt domain `vm` on `uri` started again from the snapshot in `dir`.
#[cfg(feature = "libvirt")]
async fn restore_domain(
    uri: &str,
    vm: &str,
    dir: &Path,
    resume: bool,
    limit: Duration,
) -> anyhow::Result<Duration> {
    use memtide_adapters::libvirt::snapshot::{restore, MEMORY_FILE};
    Ok(restore(uri, vm, &dir.join(MEMORY_FILE), resume, limit).await?)
}

/// Without libvirt support, no domain is restored.
#[cfg(not(feature = "libvirt"))]
async fn restore_domain(
    _: &str,
    _: &str,
    _: &Path,
    _: bool,
    _: Duration,
) -> anyhow::Result<Duration> {
    bail!("this memtide was built without libvirt support (cargo feature `libvirt`)")
}

/// The most clones one `memtide snapshot clone` starts.
const MAX_CLONES: u32 = 1000;

/// Start `count` clones of VM `vm` from its snapshot `id` (its latest by default), each
/// by the VM's `clone_launch` with `{n}` its number, all sharing the snapshot's memory
/// until they write it: the snapshot is made a template first (its RAM in a file, kept in
/// the snapshot's directory for the next clones). Returns a line per clone. One clone
/// command of a VM at a time: a second waits for the first (which may be making the
/// template it would use, or starting the clones whose numbers it would take).
pub async fn clone(
    config: &Config,
    vm: &str,
    count: u32,
    id: Option<&str>,
) -> anyhow::Result<Vec<String>> {
    if count == 0 {
        bail!("no clone to start: give a count of 1 or more");
    }
    // Each clone is a QEMU of its own (found by an audit: 4 000 000 000 looked for that
    // many free numbers, a socket tried for each, before starting any).
    if count > MAX_CLONES {
        bail!("{count} clones: at most {MAX_CLONES} at a time");
    }
    let Some(vm_config) = config.vms.iter().find(|v| v.name == vm) else {
        bail!("VM {vm} is not among the configuration's [[vm]] entries");
    };
    if vm_config.qmp.is_none() {
        let connector = Starter::of(vm_config).map_or("its connector", |s| s.connector());
        bail!(
            "VM {vm} is reached through {connector}: memtide clones only QEMU VMs reached \
             through `qmp` (with `clone_launch`)"
        );
    }
    let Some(launch) = &vm_config.clone_launch else {
        bail!("VM {vm} has no `clone_launch` command in the configuration: memtide cannot start its clones");
    };
    let store = Store::new(&config.snapshots.dir);
    let snapshot = store.find(vm, id)?;
    let _cloning = {
        let lock = store.vm_dir(vm).join(snapshots::CLONE_LOCK);
        match snapshots::Lock::try_take(&lock)? {
            Some(held) => held,
            None => {
                tracing::info!("another clone of {vm} is under way: waiting for it to end");
                tokio::task::spawn_blocking(move || snapshots::Lock::take(&lock)).await??
            }
        }
    };
    // Before its checksums, which take seconds a GiB.
    let format = qemu_format(&snapshot)?;
    store.verify(&snapshot)?;
    let _uncache = Uncache(&store, &snapshot);
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
    let template = dir.join(crate::snapshots::TEMPLATE);
    // memtide's own making, never a link out of the store (found by an audit: a `ram`
    // linked to /etc/passwd was handed to the clones).
    for path in [
        template.clone(),
        template.join("ram"),
        template.join("devices"),
    ] {
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_symlink()) {
            bail!(
                "{}: a symbolic link in the snapshot's clone template: not used (delete the \
                 template directory; the next clone makes it again)",
                path.display()
            );
        }
    }
    if !template.join("devices").exists() {
        // The template's RAM file is as large as the guest.
        crate::snapshots::room_for(&dir, snapshot.configured).context("no clone template")?;
        let partial = dir.join(format!(
            "{}{}",
            crate::snapshots::TEMPLATE,
            crate::snapshots::PARTIAL
        ));
        let _ = std::fs::remove_dir_all(&partial);
        crate::snapshots::private_dirs(&partial)?;
        let (launch, monitor, log) = numbered("template", "template");
        let qemu = Incoming::new(&launch, &monitor, &log, limit);
        let ram = TemplateRam {
            file: &partial.join("ram"),
            size,
            id: ram_id,
        };
        qmp_snapshot::make_template(&qemu, &dir, format, &ram, &partial.join("devices"))
            .await
            .with_context(|| format!("making a clone template of {vm} from {}", snapshot.id))?;
        // Guest memory: for root alone, as every memory file of the store (QEMU creates
        // the RAM file by its umask).
        for name in ["ram", "devices"] {
            use std::os::unix::fs::PermissionsExt;
            let file = partial.join(name);
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))
                .with_context(|| format!("restricting {}", file.display()))?;
        }
        std::fs::rename(&partial, &template)
            .with_context(|| format!("renaming {}", partial.display()))?;
    }
    let mut lines = Vec::new();
    // The lowest numbers whose clone is not running (its monitor does not answer).
    let free = (1..).filter(|n| {
        let monitor = vm_dir.join(format!("clone-{n}.qmp"));
        !qmp_snapshot::listening(&monitor)
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

/// Delete VM `vm`'s snapshot `id`; with `force`, also one the store cannot read (a
/// damaged description: it may be a hibernation's).
pub fn delete(config: &Config, vm: &str, id: &str, force: bool) -> anyhow::Result<()> {
    let store = Store::new(&config.snapshots.dir);
    let snapshot = match store.find(vm, Some(id)) {
        Ok(snapshot) => snapshot,
        Err(none) => match store.unlisted(vm, id) {
            Some((dir, _)) if force => return store.remove(&dir),
            Some((_, why)) => bail!(
                "snapshot {id} of {vm} cannot be read ({why:#}); it may be a hibernation not \
                 woken from: --force deletes it anyway"
            ),
            None => return Err(none),
        },
    };
    if snapshot.asleep() && !force {
        bail!(
            "snapshot {id} is the hibernation of {vm}, not woken from: it holds the guest's \
             running state, lost with it (`memtide snapshot restore {vm}` wakes it); \
             --force deletes it anyway"
        );
    }
    store.delete(&snapshot)
}

/// A line describing a snapshot the daemon saved (its JSON description). A description
/// this build does not read (a daemon of another build: a field added since) still
/// names what was saved: the daemon said it saved it (found by the compatibility audit:
/// an older command said a save, and a hibernation, that worked had failed).
pub fn saved_line(snapshot: &serde_json::Value) -> String {
    if let Ok(s) = serde_json::from_value::<Snapshot>(snapshot.clone()) {
        return s.summary();
    }
    let text = |key: &str| {
        let value = snapshot.get(key).and_then(serde_json::Value::as_str);
        value.map_or_else(|| "?".to_string(), memtide_core::guest_text::clean)
    };
    let quit = match snapshot.get("then").and_then(serde_json::Value::as_str) {
        Some("quit") => "; its hypervisor process quit (hibernated)",
        _ => "",
    };
    format!(
        "{} saved as {}{quit} (described by a daemon of another build, in a form this \
         memtide does not read: `systemctl restart memtide` after an upgrade)",
        text("vm"),
        text("id")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshots::TakenBy;
    use memtide_core::backend::{AfterSave, Saved};

    /// A configuration with VM `a` reached as `keys` say, its store in `store`.
    fn config(store: &Path, keys: &str) -> Config {
        let text = format!("[snapshots]\ndir = {store:?}\n[[vm]]\nname = \"a\"\n{keys}");
        Config::parse(&text, "memtide.toml").unwrap()
    }

    /// What a QMP save of a running guest reports.
    fn saved() -> Saved {
        Saved {
            mechanism: "qmp migrate to fd".into(),
            was_running: true,
            downtime: Duration::ZERO,
            written: Duration::ZERO,
            ..Saved::default()
        }
    }

    #[test]
    fn the_list_says_who_took_each_snapshot_and_which_sleeps() {
        let dir = tempfile::tempdir().unwrap();
        let c = config(dir.path(), "qmp = \"/a.qmp\"\n");
        let store = Store::new(dir.path());
        for (then, by) in [
            (AfterSave::Run, TakenBy::Schedule),
            (AfterSave::Quit, TakenBy::Hibernation),
        ] {
            let pending = store.begin("a", Bytes::from_mib(1)).unwrap();
            std::fs::write(pending.dir().join("memory"), b"guest").unwrap();
            pending.finish(&saved(), then, by).unwrap();
        }
        let text = list(&c, Some("a"), false).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].ends_with("THEN  BY           WOKEN"), "{text}");
        assert!(lines[1].ends_with("run   schedule     -"), "{text}");
        assert!(lines[2].ends_with("quit  hibernation  asleep"), "{text}");
        // None: an empty store, and one not there (a mistyped dir, or no save yet).
        let text = list(&c, Some("b"), false).unwrap();
        let empty = format!("(no snapshots of b in {})", dir.path().display());
        assert_eq!(text.lines().nth(1), Some(empty.as_str()), "{text}");
        let gone = dir.path().join("typo");
        let c = config(&gone, "qmp = \"/a.qmp\"\n");
        let text = list(&c, None, false).unwrap();
        let missing = format!(
            "(no snapshots: {} does not exist; the first save makes it)",
            gone.display()
        );
        assert_eq!(text.lines().nth(1), Some(missing.as_str()), "{text}");
    }

    #[test]
    fn a_vm_is_started_by_its_connector_or_the_reason_it_cannot_be_is_given() {
        let store = Path::new("/store");
        for (keys, what) in [
            ("qmp = \"/a.qmp\"", "QEMU"),
            ("firecracker = \"/fc.sock\"", "Firecracker process"),
            (
                "cloud_hypervisor = \"/ch.sock\"",
                "Cloud Hypervisor process",
            ),
        ] {
            let c = config(store, &format!("{keys}\n"));
            assert_eq!(
                Starter::of(&c.vms[0]).unwrap_err().to_string(),
                format!(
                    "VM a has no `launch` command in the configuration: memtide cannot start \
                     its {what} to restore it into"
                )
            );
        }
        let c = config(
            store,
            "firecracker = \"/fc.sock\"\nlaunch = [\"firecracker\"]\n",
        );
        let launch = ["firecracker".to_string()];
        let socket = Path::new("/fc.sock");
        let expected = Starter::Firecracker {
            socket,
            launch: &launch,
        };
        assert_eq!(Starter::of(&c.vms[0]).unwrap(), expected);
        assert_eq!(expected.running(), None, "nothing answers on /fc.sock");
        // What a hibernation is refused for: memtide could not wake the VM after it.
        assert_eq!(cannot_restore(&c, "a"), None);
        let no_launch = cannot_restore(&config(store, "qmp = \"/a.qmp\"\n"), "a").unwrap();
        assert!(no_launch.contains("no `launch` command"), "{no_launch}");
        let discovered = cannot_restore(&c, "found").unwrap();
        assert!(discovered.starts_with("VM found is not among the configuration's [[vm]]"));
    }

    #[test]
    fn a_crashed_vm_is_restored_from_its_newest_snapshot_whose_checksums_hold() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let saved = saved();
        let mut taken = Vec::new();
        for memory in [&b"older"[..], b"newer"] {
            let pending = store.begin("a", Bytes::from_mib(1)).unwrap();
            std::fs::write(pending.dir().join("memory"), memory).unwrap();
            let by = snapshots::TakenBy::Schedule;
            taken.push(pending.finish(&saved, AfterSave::Run, by).unwrap());
            // Snapshot ids are timestamps to the millisecond.
            std::thread::sleep(Duration::from_millis(5));
        }
        let (found, skipped) = newest_good(&store, "a", "qmp").unwrap();
        assert_eq!(found.id, taken[1].id, "the newest");
        assert!(skipped.is_empty());
        std::fs::write(store.dir_of(&taken[1]).join("memory"), b"NEWER").unwrap();
        let (found, skipped) = newest_good(&store, "a", "qmp").unwrap();
        assert_eq!(found.id, taken[0].id, "the damaged newest passed over");
        assert_eq!(skipped.len(), 1);
        assert!(skipped[0].starts_with(&taken[1].id), "{skipped:?}");
        let e = newest_good(&store, "a", "firecracker")
            .unwrap_err()
            .to_string();
        assert_eq!(e, "no snapshot of a saved through firecracker in the store");
        std::fs::write(store.dir_of(&taken[0]).join("memory"), b"OLDER").unwrap();
        let e = newest_good(&store, "a", "qmp").unwrap_err().to_string();
        assert!(e.starts_with("no good snapshot of a in the store: "), "{e}");
    }

    #[test]
    fn a_vm_started_whose_hibernation_cannot_be_marked_woken_is_started_with_a_warning() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let saved = saved();
        let pending = store.begin("a", Bytes::from_mib(1)).unwrap();
        std::fs::write(pending.dir().join("memory"), b"m").unwrap();
        let asleep = pending
            .finish(&saved, AfterSave::Quit, snapshots::TakenBy::Hibernation)
            .unwrap();
        let started = woken(&store, &asleep, "a restored".into());
        assert_eq!(
            (started.line.as_str(), started.unmarked),
            ("a restored", None)
        );
        assert!(store.list("a").unwrap()[0].woken.is_some());
        // Its directory gone: the VM runs, and the failure is said beside it.
        std::fs::remove_dir_all(store.dir_of(&asleep)).unwrap();
        let started = woken(&store, &asleep, "a restored".into());
        assert_eq!(started.line, "a restored");
        let why = started.unmarked.expect("the mark failed");
        assert!(
            why.starts_with(&format!(
                "it runs, but its hibernation {} could not be marked woken",
                asleep.id
            )),
            "{why}"
        );
    }

    #[test]
    fn a_hibernation_not_woken_from_is_deleted_only_with_force() {
        let dir = tempfile::tempdir().unwrap();
        let c = config(dir.path(), "qmp = \"/a.qmp\"\n");
        let store = Store::new(dir.path());
        let pending = store.begin("a", Bytes::from_mib(1)).unwrap();
        std::fs::write(pending.dir().join("memory"), b"m").unwrap();
        let asleep = pending
            .finish(&saved(), AfterSave::Quit, snapshots::TakenBy::Hibernation)
            .unwrap();
        let e = delete(&c, "a", &asleep.id, false).unwrap_err().to_string();
        assert!(e.contains("is the hibernation of a, not woken from"), "{e}");
        assert_eq!(store.list("a").unwrap().len(), 1, "kept");
        delete(&c, "a", &asleep.id, true).unwrap();
        assert!(store.list("a").unwrap().is_empty());
    }

    #[test]
    fn a_snapshot_whose_description_does_not_read_is_deleted_only_with_force() {
        let dir = tempfile::tempdir().unwrap();
        let c = config(dir.path(), "qmp = \"/a.qmp\"\n");
        let store = Store::new(dir.path());
        let pending = store.begin("a", Bytes::from_mib(1)).unwrap();
        std::fs::write(pending.dir().join("memory"), b"m").unwrap();
        let s = pending
            .finish(&saved(), AfterSave::Run, snapshots::TakenBy::Operator)
            .unwrap();
        let damaged = store.dir_of(&s);
        std::fs::write(damaged.join("snapshot.json"), b"{\"vm\": ").unwrap();
        assert!(store.list("a").unwrap().is_empty(), "skipped by the store");
        let e = delete(&c, "a", &s.id, false).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("snapshot {} of a cannot be read (parsing ", s.id))
                && e.ends_with("--force deletes it anyway"),
            "{e}"
        );
        assert!(damaged.is_dir(), "kept");
        delete(&c, "a", &s.id, true).unwrap();
        assert!(!damaged.exists());
        // A link in a snapshot's place: the link goes, what it points at stays.
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("memory"), b"m").unwrap();
        std::os::unix::fs::symlink(outside.path(), &damaged).unwrap();
        let e = delete(&c, "a", &s.id, false).unwrap_err().to_string();
        assert!(e.contains("not a directory of the store"), "{e}");
        delete(&c, "a", &s.id, true).unwrap();
        assert!(!damaged.exists() && outside.path().join("memory").exists());
        // Nothing but a snapshot's own name in the VM's directory is deleted: not a lock,
        // nor a clone's monitor or log.
        std::fs::create_dir(dir.path().join("keep")).unwrap();
        let vm_dir = store.vm_dir("a");
        for file in ["clone.lock", "clone-1.log"] {
            std::fs::write(vm_dir.join(file), b"").unwrap();
        }
        for id in [
            "../keep",
            "restore.lock",
            "clone.lock",
            "clone-1.log",
            "x.partial",
            "",
            ".",
        ] {
            let e = delete(&c, "a", id, true).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("VM a has no snapshot {id} in")),
                "{e}"
            );
        }
        assert!(dir.path().join("keep").is_dir());
        assert!(vm_dir.join("clone.lock").exists() && vm_dir.join("clone-1.log").exists());
    }

    /// A save the daemon reports done is said done, whatever its description holds (found
    /// by the compatibility audit: a field added by a newer daemon made it a failure).
    #[test]
    fn a_save_is_said_done_even_described_with_a_field_this_build_does_not_know() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let pending = store.begin("a", Bytes::from_mib(1)).unwrap();
        std::fs::write(pending.dir().join("memory"), b"m").unwrap();
        let s = pending
            .finish(&saved(), AfterSave::Quit, TakenBy::Hibernation)
            .unwrap();
        let mut described = serde_json::to_value(&s).unwrap();
        assert_eq!(saved_line(&described), s.summary());
        described["new_field"] = 1.into();
        assert_eq!(
            saved_line(&described),
            format!(
                "a saved as {}; its hypervisor process quit (hibernated) (described by a daemon \
                 of another build, in a form this memtide does not read: `systemctl restart \
                 memtide` after an upgrade)",
                s.id
            )
        );
    }

    #[tokio::test]
    async fn a_vmm_whose_socket_answers_is_not_restored_over() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("fc.sock");
        let _listening = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let keys = format!("firecracker = {socket:?}\nlaunch = [\"firecracker\"]\n");
        let c = config(dir.path(), &keys);
        let e = restore(&c, "a", None, false).await.unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "VM a is running (its API socket {} answers): stop it before restoring it",
                socket.display()
            )
        );
    }

    #[tokio::test]
    async fn a_second_restore_of_a_vm_under_way_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let keys = "firecracker = \"/nonexistent/fc.sock\"\nlaunch = [\"firecracker\"]\n";
        let c = config(dir.path(), keys);
        // The first restore (the operator's, or the daemon's wake) holds the lock.
        let first = Store::new(dir.path()).lock_restore("a").unwrap();
        let e = restore(&c, "a", None, false).await.unwrap_err().to_string();
        assert!(e.starts_with("a restore of a is already under way"), "{e}");
        let e = recover(&c, "a").await.unwrap_err().to_string();
        assert!(e.starts_with("a restore of a is already under way"), "{e}");
        drop(first);
        let e = restore(&c, "a", None, false).await.unwrap_err().to_string();
        assert!(e.starts_with("VM a has no snapshot"), "{e}");
    }

    /// A hibernation a newer memtide wrote (found by the compatibility audit: skipped as
    /// damaged, and the snapshot before it restored in its place).
    #[tokio::test]
    async fn a_newer_memtides_hibernation_is_not_passed_over_for_an_older_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let keys = "firecracker = \"/nonexistent/fc.sock\"\nlaunch = [\"firecracker\"]\n";
        let c = config(dir.path(), keys);
        let store = Store::new(dir.path());
        let firecracker = Saved {
            mechanism: "firecracker snapshot/create".into(),
            ..saved()
        };
        let mut taken = Vec::new();
        for (then, by) in [
            (AfterSave::Run, TakenBy::Operator),
            (AfterSave::Quit, TakenBy::Hibernation),
        ] {
            let pending = store.begin("a", Bytes::from_mib(1)).unwrap();
            std::fs::write(pending.dir().join("memory"), b"m").unwrap();
            taken.push(pending.finish(&firecracker, then, by).unwrap());
        }
        let meta = store.dir_of(&taken[1]).join("snapshot.json");
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&meta).unwrap()).unwrap();
        v["format"] = 99.into();
        v["added_later"] = 1.into();
        std::fs::write(&meta, v.to_string()).unwrap();

        let e = restore(&c, "a", None, true).await.unwrap_err().to_string();
        assert!(
            e.contains(&taken[1].id) && e.contains("snapshot format 99; this one reads up to 1"),
            "{e}"
        );
        let e = restore(&c, "a", Some(&taken[1].id), false)
            .await
            .unwrap_err();
        let e = format!("{e:#}");
        assert!(e.contains("written by a newer memtide"), "{e}");
        let e = newest_good(&store, "a", "firecracker").unwrap_err();
        assert!(e.to_string().contains("snapshot format 99"), "{e}");
        let text = list(&c, None, false).unwrap();
        let named = text
            .split_once("\nSnapshots of a newer memtide (not read here):\n- ")
            .map(|(_, after)| after);
        assert!(
            named.is_some_and(|n| n.contains(&taken[1].id) && n.contains("format 99")),
            "{text}"
        );
    }

    /// A QEMU snapshot saved in a way this build does not know (a newer memtide's) is
    /// refused by name before its checksums are read or a QEMU started (found by the
    /// compatibility audit: it was handed to QEMU as the plain stream).
    #[tokio::test]
    async fn a_qemu_snapshot_saved_in_an_unknown_way_is_refused_before_it_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let keys = "qmp = \"/nonexistent/a.qmp\"\nlaunch = [\"/nonexistent/qemu\"]\n\
                    clone_launch = [\"/nonexistent/qemu-{n}\"]\n";
        let c = config(dir.path(), keys);
        let store = Store::new(dir.path());
        let multifd = Saved {
            mechanism: "qmp migrate multifd to fdset".into(),
            ..saved()
        };
        let pending = store.begin("a", Bytes::from_mib(1)).unwrap();
        std::fs::write(pending.dir().join("memory"), b"m").unwrap();
        let s = pending
            .finish(&multifd, AfterSave::Quit, TakenBy::Hibernation)
            .unwrap();
        // Damaged too: a check reached first would say so.
        std::fs::write(store.dir_of(&s).join("memory"), b"M").unwrap();
        let refused = format!(
            "snapshot {} of a was saved as 'qmp migrate multifd to fdset', which this memtide \
             cannot restore: upgrade memtide",
            s.id
        );
        let e = restore(&c, "a", None, false).await.unwrap_err();
        assert_eq!(format!("{e:#}"), refused);
        let e = recover(&c, "a").await.unwrap_err();
        assert_eq!(format!("{e:#}"), refused);
        let e = clone(&c, "a", 1, None).await.unwrap_err();
        assert_eq!(format!("{e:#}"), refused);
        assert!(
            !store.vm_dir("a").join("restore.log").exists(),
            "no QEMU started"
        );
    }

    #[tokio::test]
    async fn a_qemu_whose_monitor_is_busy_is_seen_running_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("a.qmp");
        // A QEMU whose one client (the daemon) is connected: the others wait in its
        // backlog, which fills; a blocking connect would wait there for ever.
        let listener = tokio::net::UnixSocket::new_stream().unwrap();
        listener.bind(&socket).unwrap();
        let _listening = listener.listen(1).unwrap();
        for _ in 0..16 {
            assert!(qmp_snapshot::listening(&socket));
        }
        let keys = format!("qmp = {socket:?}\nlaunch = [\"qemu\"]\n");
        let c = config(dir.path(), &keys);
        let restoring = restore(&c, "a", None, false);
        let e = tokio::time::timeout(Duration::from_secs(5), restoring)
            .await
            .expect("no wait")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("VM a is running (its QMP socket"), "{e}");
    }

    #[tokio::test]
    async fn no_clone_is_not_a_request_nor_more_than_a_thousand() {
        let dir = tempfile::tempdir().unwrap();
        let c = config(
            dir.path(),
            "qmp = \"/a.qmp\"\nclone_launch = [\"qemu-{n}\"]\n",
        );
        let e = clone(&c, "a", 0, None).await.unwrap_err().to_string();
        assert_eq!(e, "no clone to start: give a count of 1 or more");
        let e = clone(&c, "a", 4_000_000_000, None).await.unwrap_err();
        assert_eq!(e.to_string(), "4000000000 clones: at most 1000 at a time");
    }

    #[tokio::test]
    async fn a_snapshot_is_restored_only_by_the_connector_that_saved_it_and_clones_are_qemus() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let pending = store.begin("a", Bytes::from_mib(1)).unwrap();
        std::fs::write(pending.dir().join("memory"), b"qemu's stream").unwrap();
        let saved = saved();
        let taken = pending
            .finish(&saved, AfterSave::Quit, snapshots::TakenBy::Operator)
            .unwrap();
        let c = config(
            dir.path(),
            "cloud_hypervisor = \"/nonexistent/ch.sock\"\nlaunch = [\"cloud-hypervisor\"]\n",
        );
        let e = restore(&c, "a", None, false).await.unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "snapshot {} of a was saved through qmp, and the VM is configured through \
                 cloud-hypervisor: each connector restores only its own snapshots",
                taken.id
            )
        );
        let e = clone(&c, "a", 2, None).await.unwrap_err().to_string();
        assert_eq!(
            e,
            "VM a is reached through cloud-hypervisor: memtide clones only QEMU VMs reached \
             through `qmp` (with `clone_launch`)"
        );
    }
}
