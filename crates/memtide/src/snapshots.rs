//! The snapshot store: under `[snapshots] dir`, a directory per VM and, in it, one per
//! snapshot, named by when it was taken, holding the connector's files and
//! `snapshot.json` (what was saved, how, and each file's SHA-256). A snapshot is written
//! into `ID.partial` and renamed to `ID` once every file is on disk and checksummed: a
//! crash or a full disk mid-save leaves no snapshot that looks good, and the next save
//! of the VM removes what it left.

use anyhow::{bail, Context};
use memtide_adapters::checksum::file_sum;
pub use memtide_core::backend::FileSum;
use memtide_core::backend::{AfterSave, Saved};
use memtide_core::{guest_text, Bytes};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The description file in each snapshot's directory.
const META: &str = "snapshot.json";
/// The directory of a snapshot's clone template (and `template.partial` while made).
pub const TEMPLATE: &str = "template";
/// The suffix of a snapshot (or clone template) being written.
pub const PARTIAL: &str = ".partial";
/// Room left on the file system beyond the guest's size before a save starts.
const HEADROOM: Bytes = Bytes::from_mib(64);

/// The format of the descriptions this memtide writes, and the newest it reads. It goes
/// up whenever a field is added to [`Snapshot`] (with a default: an older description
/// lacks it), a field whose meaning changes taking a new name: a memtide that reads up
/// to an older format then refuses the description, naming its format, rather than take
/// it for damaged or read it wrong (found by the compatibility audit). Every format up to
/// this one stays readable; `tests/formats/` keeps a description of each.
pub const FORMAT: u32 = 1;

/// The format of a description that names none: what memtide wrote before it numbered
/// them.
fn unnumbered() -> u32 {
    1
}

/// One snapshot, as described by its `snapshot.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Snapshot {
    /// The format of its description ([`FORMAT`] for one written now).
    #[serde(default = "unnumbered")]
    pub format: u32,
    /// The VM's name.
    pub vm: String,
    /// Its identifier: when it was taken (UTC, `YYYYMMDDTHHMMSS.mmmZ`).
    pub id: String,
    /// Its place among the VM's snapshots, counted from 1 (0: taken before memtide
    /// counted them): their order whatever the clock did (one stepped back, at a boot
    /// before NTP, would have put a new hibernation behind an older snapshot).
    #[serde(default)]
    pub seq: u64,
    /// When it was taken (RFC 3339).
    pub created: String,
    /// How the connector wrote it.
    pub mechanism: String,
    /// What became of the VM: it ran on, or its process quit (hibernation).
    pub then: AfterSave,
    /// Who asked for it.
    #[serde(default)]
    pub by: TakenBy,
    /// When a hibernated guest was woken from it (RFC 3339): its disk has moved on since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub woken: Option<String>,
    /// The guest ran when it was saved: a restore resumes it.
    pub was_running: bool,
    /// The VM's configured memory.
    pub configured: Bytes,
    /// The hypervisor's name for the guest's RAM, when it said (QEMU: `pc.ram`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ram_backend: Option<String>,
    /// How long the guest was stopped, in seconds.
    pub downtime_s: f64,
    /// From stopping the guest to its state on disk, synced, in seconds.
    pub write_s: f64,
    /// From the request to the snapshot on disk, checksummed, in seconds.
    pub save_s: f64,
    /// Each file: its size and SHA-256.
    pub files: BTreeMap<String, FileSum>,
}

/// Who asked for a snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TakenBy {
    /// The operator (`memtide snapshot save`): kept until deleted by hand.
    #[default]
    Operator,
    /// The VM's `snapshot_every_s`: the oldest beyond `snapshot_keep` are deleted.
    Schedule,
    /// The daemon's hibernation of an idle VM: kept until deleted by hand.
    Hibernation,
}

impl Snapshot {
    /// The size of its files together.
    pub fn bytes(&self) -> u64 {
        self.files
            .values()
            .fold(0, |all, f| all.saturating_add(f.bytes))
    }

    /// What a description must hold before anything is read or started by it (found by
    /// an audit of hand-made descriptions: a file named `../../x` was read and its
    /// checksum shown, and a RAM name with a comma reached QEMU's options).
    fn check(&self) -> Result<(), String> {
        let plain = |name: &str| {
            !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0'])
        };
        if let Some(name) = self.files.keys().find(|n| !plain(n) || *n == META) {
            return Err(format!("names a file {name:?} that is not one of its own"));
        }
        // Shown by `snapshot list`: no terminal control reaches the screen.
        if let Some(name) = [&self.vm, &self.id]
            .into_iter()
            .find(|n| n.contains(char::is_control))
        {
            return Err(format!("names {name:?}, with control characters"));
        }
        // QEMU's identifiers: a letter, then letters, digits, `-`, `.` and `_`.
        let qemu_id = |id: &str| {
            id.starts_with(|c: char| c.is_ascii_alphabetic())
                && id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-._".contains(c))
        };
        if let Some(id) = self.ram_backend.as_deref().filter(|id| !qemu_id(id)) {
            return Err(format!("names its RAM {id:?}, which is no QEMU identifier"));
        }
        Ok(())
    }

    /// A hibernation no guest was woken from yet: its memory matches the guest's disk.
    pub fn asleep(&self) -> bool {
        self.then == AfterSave::Quit && self.woken.is_none()
    }

    /// A sentence saying what was saved.
    pub fn summary(&self) -> String {
        let quit = match self.then {
            AfterSave::Run => "",
            AfterSave::Quit => "; its hypervisor process quit (hibernated)",
        };
        format!(
            "{} saved as {} ({}) in {:.1} s, the guest stopped {:.1} s{quit}",
            self.vm,
            self.id,
            Bytes(self.bytes()),
            self.save_s,
            self.downtime_s
        )
    }
}

/// The file, in a VM's directory of the store, that a restore of it locks.
const RESTORE_LOCK: &str = "restore.lock";

/// The file, in a VM's directory of the store, that a clone command of it locks (and a
/// prune of its scheduled snapshots, which may be the one cloned).
pub const CLONE_LOCK: &str = "clone.lock";

/// The name of VM `vm`'s directory in the store: its name with every byte other than
/// ASCII letters, digits, `_`, `-` and a `.` not in first place written as `%XX`.
fn dir_name(vm: &str) -> String {
    let mut name = String::new();
    for (i, b) in vm.bytes().enumerate() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'-' => name.push(b as char),
            b'.' if i > 0 => name.push('.'),
            _ => name.push_str(&format!("%{b:02X}")),
        }
    }
    name
}

/// The VM whose directory in the store is named `name` ([`dir_name`] undone), if memtide
/// could have named it so.
fn vm_of_dir(name: &str) -> Option<String> {
    let mut bytes = Vec::new();
    let mut rest = name.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        rest = tail;
        if b != b'%' {
            bytes.push(b);
            continue;
        }
        let hex = std::str::from_utf8(rest.get(..2)?).ok()?;
        bytes.push(u8::from_str_radix(hex, 16).ok()?);
        rest = &rest[2..];
    }
    String::from_utf8(bytes)
        .ok()
        .filter(|vm| dir_name(vm) == name)
}

/// What a save cut short left in the store: its `ID.partial` directory, never made a
/// snapshot (memtide stopped at once, or was killed, while it was written).
#[derive(Debug, Clone, PartialEq)]
pub struct Unfinished {
    /// The VM it was a save of.
    pub vm: String,
    /// Its directory.
    pub dir: PathBuf,
    /// The bytes its files hold.
    pub bytes: u64,
    /// It holds a whole libvirt save image: libvirt finished the save after memtide
    /// stopped, and left the domain shut off with its memory only there.
    pub libvirt_image: bool,
}

impl Unfinished {
    /// What an operator is told of it (names escaped, paths quoted for a shell: a name
    /// in the store may be anyone's text).
    pub fn describe(&self) -> String {
        let raw = self.dir.to_string_lossy();
        let dir = guest_text::clean(&raw);
        // A command only where the path shows as it is (not escaped, nor cut).
        let command = |command: &str, path: &str| match dir == raw {
            true => format!("`{command} {}`", quoted(path)),
            false => command.split(' ').next().unwrap_or(command).to_string(),
        };
        let mut told = format!(
            "{dir} ({}) holds what a save of {} wrote and never finished: no snapshot to \
             restore; the VM's next save removes it, or remove it by hand ({}) once it is \
             not needed",
            Bytes(self.bytes),
            guest_text::clean(&self.vm),
            command("rm -r", &raw),
        );
        if self.libvirt_image {
            let image = self.dir.join(memtide_adapters::libvirt::MEMORY_FILE);
            told += &format!(
                ". It holds a whole libvirt save image: where the domain is shut off, its \
                 memory is there, and {} runs it again",
                command("virsh restore", &image.to_string_lossy()),
            );
        }
        told
    }
}

/// A snapshot whose description a newer memtide wrote, in a format this one does not
/// read: kept, named, and never passed over for an older one where it is the newest.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "{}: snapshot {} of {} was written by a newer memtide (snapshot format {format}; this \
     one reads up to {FORMAT}): upgrade memtide to restore it",
    dir.display(),
    guest_text::clean(id),
    guest_text::clean(vm)
)]
pub struct Newer {
    /// The VM it records.
    pub vm: String,
    /// Its identifier.
    pub id: String,
    /// Its place among the VM's snapshots (0 where it records none).
    pub seq: u64,
    /// The format of its description.
    pub format: u32,
    /// Its directory.
    pub dir: PathBuf,
}

/// The snapshots in one VM's directory: those this memtide reads, and those a newer one
/// wrote.
#[derive(Debug, Default)]
struct Found {
    read: Vec<Snapshot>,
    newer: Vec<Newer>,
}

impl Found {
    /// Of one VM's snapshots (each list oldest first), a newer memtide's that is the VM's
    /// newest, after every one this memtide reads.
    fn newer_newest(&self) -> Option<&Newer> {
        let newest = self.read.last().map(|s| (s.seq, s.id.as_str()));
        self.newer
            .last()
            .filter(|n| newest.is_none_or(|newest| (n.seq, n.id.as_str()) > newest))
    }
}

/// `text` between single quotes, as a shell reads it back.
fn quoted(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// An exclusive lock (`flock`) on a file, held until dropped or its process ends.
#[derive(Debug)]
pub struct Lock {
    _file: std::fs::File,
}

impl Lock {
    fn open(path: &Path) -> anyhow::Result<std::fs::File> {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))
    }

    /// The lock on `path` (created if missing), or `None` when another holds it.
    pub fn try_take(path: &Path) -> anyhow::Result<Option<Lock>> {
        let file = Lock::open(path)?;
        match file.try_lock() {
            Ok(()) => Ok(Some(Lock { _file: file })),
            Err(std::fs::TryLockError::WouldBlock) => Ok(None),
            Err(std::fs::TryLockError::Error(e)) => {
                Err(e).with_context(|| format!("locking {}", path.display()))
            }
        }
    }

    /// The lock on `path` (created if missing), waiting for whoever holds it.
    pub fn take(path: &Path) -> anyhow::Result<Lock> {
        let file = Lock::open(path)?;
        file.lock()
            .with_context(|| format!("locking {}", path.display()))?;
        Ok(Lock { _file: file })
    }
}

/// The store at a directory.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
    /// Snapshots being written are left where they are when given up on (memtide stops
    /// at once): shared by this store's clones and their [`Pending`] snapshots.
    left: Arc<AtomicBool>,
}

/// A snapshot being written: its directory, to hand to the connector.
#[derive(Debug)]
pub struct Pending {
    vm: String,
    id: String,
    seq: u64,
    dir: PathBuf,
    configured: Bytes,
    started: std::time::Instant,
    /// Made whole: not removed when dropped.
    done: bool,
    /// Not removed when dropped either ([`Store::leave_unfinished`]).
    left: Arc<AtomicBool>,
}

impl Store {
    /// The store at `dir` (created when the first snapshot is written).
    pub fn new(dir: &Path) -> Store {
        Store {
            dir: dir.to_path_buf(),
            left: Arc::default(),
        }
    }

    /// Leave the snapshots being written where they are from now on, rather than remove
    /// them when their save is given up on: memtide stops without waiting for their
    /// saves, which their hypervisor may finish (a libvirt domain shut off with its
    /// memory there). The next save of the VM removes them.
    pub fn leave_unfinished(&self) {
        self.left.store(true, Ordering::Relaxed);
    }

    /// The directory of VM `vm`'s snapshots: its name with every byte other than ASCII
    /// letters, digits, `_`, `-` and a `.` not in first place written as `%XX`, so that
    /// no name (`..`, `a/b`) leaves the store.
    pub fn vm_dir(&self, vm: &str) -> PathBuf {
        self.dir.join(dir_name(vm))
    }

    /// Take the lock that a restore of VM `vm` holds from its check that the VM is not
    /// running until its hypervisor runs it (`restore.lock` in its directory), or say
    /// that another restore of it (the operator's, the daemon's wake or crash recovery)
    /// holds it. Released when dropped, or when the process ends.
    pub fn lock_restore(&self, vm: &str) -> anyhow::Result<Lock> {
        let vm_dir = self.vm_dir(vm);
        private_dirs(&vm_dir)?;
        let path = vm_dir.join(RESTORE_LOCK);
        match Lock::try_take(&path)? {
            Some(lock) => Ok(lock),
            None => bail!(
                "a restore of {vm} is already under way (it holds {}): not started twice",
                path.display()
            ),
        }
    }

    /// The directory of snapshot `s`.
    pub fn dir_of(&self, s: &Snapshot) -> PathBuf {
        self.vm_dir(&s.vm).join(&s.id)
    }

    /// Start a snapshot of VM `vm`, `configured` large: what an earlier save left
    /// half-written is removed, and the save is refused when the file system has less
    /// room than the guest's size and a margin.
    pub fn begin(&self, vm: &str, configured: Bytes) -> anyhow::Result<Pending> {
        if vm.is_empty() {
            bail!("a VM with no name cannot be saved");
        }
        let vm_dir = self.vm_dir(vm);
        private_dirs(&vm_dir)?;
        for entry in std::fs::read_dir(&vm_dir)?.flatten() {
            if entry.file_name().to_string_lossy().ends_with(PARTIAL) {
                std::fs::remove_dir_all(entry.path())
                    .with_context(|| format!("removing {}", entry.path().display()))?;
            }
        }
        // Its caller says "not saved" (the daemon's event, `memtide snapshot save`).
        room_for(&vm_dir, configured)?;
        let stamp = humantime::format_rfc3339_millis(SystemTime::now()).to_string();
        let base: String = stamp.chars().filter(|c| *c != '-' && *c != ':').collect();
        let mut id = base.clone();
        for n in 2.. {
            if !vm_dir.join(&id).exists() {
                break;
            }
            id = format!("{base}-{n}");
        }
        let taken =
            snapshots_in(&vm_dir).with_context(|| format!("reading {}", vm_dir.display()))?;
        // A newer memtide's snapshots count: the next one is newer than them.
        let seqs = taken.read.iter().map(|s| s.seq);
        let seq = seqs
            .chain(taken.newer.iter().map(|n| n.seq))
            .max()
            .unwrap_or(0)
            + 1;
        let dir = vm_dir.join(format!("{id}{PARTIAL}"));
        private_dirs(&dir)?;
        Ok(Pending {
            vm: vm.to_string(),
            id,
            seq,
            dir,
            configured,
            started: std::time::Instant::now(),
            done: false,
            left: self.left.clone(),
        })
    }

    /// VM `vm`'s complete snapshots, oldest first; one whose description is unreadable
    /// is skipped with a warning.
    pub fn list(&self, vm: &str) -> anyhow::Result<Vec<Snapshot>> {
        Ok(self.found(vm)?.read)
    }

    /// VM `vm`'s snapshots, oldest first, as [`Store::list`]; an error naming its newest
    /// where a newer memtide wrote that one ([`Newer`]): what takes the newest (a restore
    /// of the latest, a wake, crash recovery) would otherwise take an older one, silently
    /// (found by the compatibility audit).
    pub fn history(&self, vm: &str) -> anyhow::Result<Vec<Snapshot>> {
        let found = self.found(vm)?;
        if let Some(newer) = found.newer_newest() {
            bail!("{newer} (it is the VM's newest: an older snapshot is used only by its ID)");
        }
        Ok(found.read)
    }

    /// VM `vm`'s snapshots, each list oldest first.
    fn found(&self, vm: &str) -> anyhow::Result<Found> {
        let vm_dir = self.vm_dir(vm);
        let mut found = match snapshots_in(&vm_dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Found::default()),
            other => other.with_context(|| format!("reading {}", vm_dir.display()))?,
        };
        found
            .read
            .sort_by(|a, b| (a.seq, &a.id).cmp(&(b.seq, &b.id)));
        found
            .newer
            .sort_by(|a, b| (a.seq, &a.id).cmp(&(b.seq, &b.id)));
        Ok(found)
    }

    /// Every VM's snapshots, by VM then oldest first; a VM's directory that cannot be
    /// read is skipped with a warning.
    pub fn list_all(&self) -> anyhow::Result<Vec<Snapshot>> {
        Ok(self.found_all()?.read)
    }

    /// VM `vm`'s snapshots (every VM's where `None`): those this memtide reads and
    /// those a newer one wrote ([`Newer`]), each by VM then oldest first.
    pub fn listing(&self, vm: Option<&str>) -> anyhow::Result<(Vec<Snapshot>, Vec<Newer>)> {
        let found = match vm {
            Some(vm) => self.found(vm)?,
            None => self.found_all()?,
        };
        Ok((found.read, found.newer))
    }

    /// Every VM's snapshots, each list by VM then oldest first.
    fn found_all(&self) -> anyhow::Result<Found> {
        let entries = match std::fs::read_dir(&self.dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Found::default()),
            other => other.with_context(|| format!("reading {}", self.dir.display()))?,
        };
        let mut all = Found::default();
        for entry in entries.flatten().filter(|e| e.path().is_dir()) {
            match snapshots_in(&entry.path()) {
                Ok(found) => {
                    all.read.extend(found.read);
                    all.newer.extend(found.newer);
                }
                Err(e) => tracing::warn!("{}: {e}, skipped", entry.path().display()),
            }
        }
        all.read
            .sort_by(|a, b| (&a.vm, a.seq, &a.id).cmp(&(&b.vm, b.seq, &b.id)));
        all.newer
            .sort_by(|a, b| (&a.vm, a.seq, &a.id).cmp(&(&b.vm, b.seq, &b.id)));
        Ok(all)
    }

    /// What saves cut short left in the store ([`Unfinished`]), by VM and time; a
    /// directory that cannot be read is skipped with a warning. Saves under way are among
    /// them.
    pub fn unfinished(&self) -> anyhow::Result<Vec<Unfinished>> {
        let entries = match std::fs::read_dir(&self.dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            other => other.with_context(|| format!("reading {}", self.dir.display()))?,
        };
        let mut found = Vec::new();
        let dirs = entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()));
        for vm_dir in dirs {
            let Some(vm) = vm_dir.file_name().to_str().and_then(vm_of_dir) else {
                continue;
            };
            let saves = match std::fs::read_dir(vm_dir.path()) {
                Ok(saves) => saves,
                Err(e) => {
                    tracing::warn!("{}: {e}, skipped", vm_dir.path().display());
                    continue;
                }
            };
            for save in saves.flatten() {
                let dir = save.path();
                let is_dir = save.file_type().is_ok_and(|t| t.is_dir());
                if !is_dir || !save.file_name().to_string_lossy().ends_with(PARTIAL) {
                    continue;
                }
                let bytes = std::fs::read_dir(&dir)
                    .map(|files| {
                        let sizes = files.flatten().filter_map(|f| f.metadata().ok());
                        sizes.filter(|m| m.is_file()).map(|m| m.len()).sum()
                    })
                    .unwrap_or(0);
                let image = dir.join(memtide_adapters::libvirt::MEMORY_FILE);
                found.push(Unfinished {
                    vm: vm.clone(),
                    libvirt_image: memtide_adapters::libvirt::is_whole_save_image(&image),
                    dir,
                    bytes,
                });
            }
        }
        found.sort_by(|a, b| (&a.vm, &a.dir).cmp(&(&b.vm, &b.dir)));
        Ok(found)
    }

    /// The VMs hibernated: each VM's newest snapshot, where it is a hibernation not
    /// woken from yet, by VM.
    pub fn asleep(&self) -> anyhow::Result<Vec<Snapshot>> {
        let all = self.found_all()?;
        let mut newest: Vec<Snapshot> = Vec::new();
        for s in all.read {
            match newest.last_mut() {
                Some(last) if last.vm == s.vm => *last = s,
                _ => newest.push(s),
            }
        }
        // Not one a newer memtide's snapshot followed (found by a review: an older
        // hibernation was listed, and woken, in the place of the VM's newest).
        let followed = |s: &Snapshot| {
            all.newer
                .iter()
                .any(|n| n.vm == s.vm && (n.seq, n.id.as_str()) > (s.seq, s.id.as_str()))
        };
        Ok(newest
            .into_iter()
            .filter(|s| s.asleep() && !followed(s))
            .collect())
    }

    /// Mark every hibernation of VM `vm` not woken from yet woken, for a VM found
    /// running that memtide did not start from it; returns those marked.
    /// A newer memtide's snapshot that is the VM's newest cannot be marked (its
    /// description is not read here): an error names it, once the others are marked.
    pub fn mark_all_woken(&self, vm: &str) -> anyhow::Result<Vec<Snapshot>> {
        let found = self.found(vm)?;
        let newer = found.newer_newest().cloned();
        let asleep: Vec<Snapshot> = found.read.into_iter().filter(Snapshot::asleep).collect();
        for s in &asleep {
            self.mark_woken(s)?;
        }
        if let Some(newer) = newer {
            let marked: Vec<&str> = asleep.iter().map(|s| s.id.as_str()).collect();
            bail!(
                "{newer}; where it is a hibernation, it is not marked woken here: do not wake or \
                 restore it while the guest's disk moves on{}",
                match marked.is_empty() {
                    true => String::new(),
                    false => format!(" ({} marked woken)", marked.join(", ")),
                }
            );
        }
        Ok(asleep)
    }

    /// VM `vm`'s snapshot `id`, or its latest when `id` is `None` (an error where a
    /// newer memtide wrote that one: [`Store::history`]). A snapshot `id` that does not
    /// read is said why ([`Store::unlisted`]).
    pub fn find(&self, vm: &str, id: Option<&str>) -> anyhow::Result<Snapshot> {
        let found = match id {
            Some(id) => self.list(vm)?.into_iter().find(|s| s.id == id),
            None => self.history(vm)?.pop(),
        };
        found.ok_or_else(|| match id {
            Some(id) => match self.unlisted(vm, id) {
                Some((_, why)) => why.context(format!("snapshot {id} of {vm} cannot be used")),
                None => anyhow::anyhow!("VM {vm} has no snapshot {id} in {}", self.dir.display()),
            },
            None => anyhow::anyhow!("VM {vm} has no snapshot in {}", self.dir.display()),
        })
    }

    /// Check every file of `s` against its checksum. Their pages stay in the host's page
    /// cache for the restore that reads them next ([`Store::uncache`] drops them after it):
    /// dropped here, a restore read the whole snapshot from disk a second time (found by
    /// the snapshot benchmark).
    pub fn verify(&self, s: &Snapshot) -> anyhow::Result<()> {
        let dir = self.dir_of(s);
        // Every file a restore may read is one the description checksums (found by an
        // audit: a description listing no file let a changed memory file be restored).
        let entries =
            std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let own = name == META || s.files.contains_key(&name);
            // The clone template beside it: memtide's own, made from the checked files.
            let template = (name == TEMPLATE || name == format!("{TEMPLATE}{PARTIAL}"))
                && entry.file_type().is_ok_and(|t| t.is_dir());
            if !own && !template {
                bail!(
                    "snapshot {} of {}: {name} is not among the files its description \
                     checksums: not used",
                    s.id,
                    s.vm
                );
            }
        }
        for (name, sum) in &s.files {
            let found = checksum(&dir.join(name), Cached::Keep)?;
            if found != *sum {
                bail!(
                    "snapshot {} of {}: {name} is {} bytes with SHA-256 {}, not {} bytes with {}: \
                     damaged, not used",
                    s.id,
                    s.vm,
                    found.bytes,
                    found.sha256,
                    sum.bytes,
                    sum.sha256
                );
            }
        }
        Ok(())
    }

    /// Drop the pages of `s`'s files from the host's page cache, once a restore has read
    /// them ([`Store::verify`] leaves them there).
    pub fn uncache(&self, s: &Snapshot) {
        let dir = self.dir_of(s);
        for name in s.files.keys() {
            if let Ok(file) = std::fs::File::open(dir.join(name)) {
                uncache(&file);
            }
        }
    }

    /// Record that a hibernated guest was woken from `s`, now.
    pub fn mark_woken(&self, s: &Snapshot) -> anyhow::Result<()> {
        let woken = Snapshot {
            woken: Some(humantime::format_rfc3339_millis(SystemTime::now()).to_string()),
            ..s.clone()
        };
        let meta = self.dir_of(s).join(META);
        // A temporary file of this process's own: the daemon and `memtide snapshot
        // restore` may both mark the same hibernation woken at once.
        let tmp = meta.with_extension(format!("json.{}.tmp", std::process::id()));
        let bytes = serde_json::to_vec_pretty(&woken).expect("a snapshot serializes");
        write_synced(&tmp, &bytes)?;
        std::fs::rename(&tmp, &meta).with_context(|| format!("writing {}", meta.display()))
    }

    /// Delete VM `vm`'s scheduled snapshots beyond the `keep` newest; returns those deleted.
    /// None while a clone of the VM runs (it may be making its template from one of them:
    /// found by an audit): they go at the next prune.
    pub fn prune(&self, vm: &str, keep: usize) -> anyhow::Result<Vec<Snapshot>> {
        let Some(_cloning) = Lock::try_take(&self.vm_dir(vm).join(CLONE_LOCK))? else {
            tracing::info!("a clone of {vm} is under way: its old scheduled snapshots are kept");
            return Ok(Vec::new());
        };
        let doomed = expired(self.list(vm)?, keep);
        for s in &doomed {
            self.delete(s)?;
        }
        Ok(doomed)
    }

    /// Delete `s`: renamed away first, so that a crash midway leaves no snapshot that
    /// looks whole.
    pub fn delete(&self, s: &Snapshot) -> anyhow::Result<()> {
        self.remove(&self.dir_of(s))
    }

    /// What stands in VM `vm`'s directory under snapshot `id` but is no snapshot the
    /// store lists ([`Store::list`] skips it with a warning: a description that does not
    /// read, a link), with why; `None` where nothing stands there, or a snapshot does.
    pub fn unlisted(&self, vm: &str, id: &str) -> Option<(PathBuf, anyhow::Error)> {
        // A plain name in the VM's directory, none of the store's own, and a directory or
        // a link in a snapshot's place: not a clone's monitor or log, nor a lock.
        let plain = Path::new(id).file_name() == Some(std::ffi::OsStr::new(id))
            && !id.ends_with(PARTIAL)
            && ![RESTORE_LOCK, CLONE_LOCK].contains(&id);
        let dir = self.vm_dir(vm).join(id);
        let kind = std::fs::symlink_metadata(&dir).map(|m| m.file_type());
        if !plain || !kind.is_ok_and(|t| t.is_dir() || t.is_symlink()) {
            return None;
        }
        let why = snapshot_at(&dir).err()?;
        Some((dir, why))
    }

    /// Remove the snapshot directory `dir` of the store, whatever it holds: renamed away
    /// first, so that a crash midway leaves nothing that looks whole.
    pub fn remove(&self, dir: &Path) -> anyhow::Result<()> {
        let id = dir.file_name().unwrap_or_default().to_string_lossy();
        let doomed = dir.with_file_name(format!("{id}{PARTIAL}"));
        // What a delete cut short left under that name goes first (found by an audit:
        // "Directory not empty", naming the snapshot, not the leftover in the way); a
        // link there is removed, not followed.
        match std::fs::symlink_metadata(&doomed) {
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&doomed),
            Ok(_) => std::fs::remove_file(&doomed),
            Err(_) => Ok(()),
        }
        .with_context(|| format!("removing {} left by a delete cut short", doomed.display()))?;
        std::fs::rename(dir, &doomed).with_context(|| format!("removing {}", dir.display()))?;
        std::fs::remove_dir_all(&doomed).with_context(|| format!("removing {}", dir.display()))
    }
}

impl Pending {
    /// The directory the connector writes into.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Checksum what the connector wrote (taking the checksums it took as it wrote, where
    /// the files' sizes still match), describe it, and make the snapshot whole; on
    /// failure (a full disk) what was written is removed.
    pub fn finish(
        mut self,
        saved: &Saved,
        then: AfterSave,
        by: TakenBy,
    ) -> anyhow::Result<Snapshot> {
        let finished = self.complete(saved, then, by);
        self.done = finished.is_ok();
        finished
    }

    fn complete(&self, saved: &Saved, then: AfterSave, by: TakenBy) -> anyhow::Result<Snapshot> {
        let mut files = BTreeMap::new();
        for entry in std::fs::read_dir(&self.dir)?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let sum = match saved.summed.get(&name) {
                Some(sum) => summed(&entry.path(), sum)?,
                None => checksum(&entry.path(), Cached::Drop)?,
            };
            files.insert(name, sum);
        }
        if files.is_empty() {
            bail!("the connector wrote nothing into {}", self.dir.display());
        }
        let snapshot = Snapshot {
            format: FORMAT,
            created: self.created(),
            vm: self.vm.clone(),
            id: self.id.clone(),
            seq: self.seq,
            mechanism: saved.mechanism.clone(),
            then,
            by,
            woken: None,
            was_running: saved.was_running,
            configured: self.configured,
            ram_backend: saved.ram_backend.clone(),
            downtime_s: saved.downtime.as_secs_f64(),
            write_s: saved.written.as_secs_f64(),
            save_s: self.started.elapsed().as_secs_f64(),
            files,
        };
        let meta = self.dir.join(META);
        let bytes = serde_json::to_vec_pretty(&snapshot).expect("a snapshot serializes");
        write_synced(&meta, &bytes)?;
        let done = self.dir.with_file_name(&self.id);
        std::fs::rename(&self.dir, &done)
            .with_context(|| format!("renaming {} to {}", self.dir.display(), done.display()))?;
        if let Err(e) = sync_dir(done.parent().expect("a snapshot's directory has a parent")) {
            // Whole but perhaps not durable: put back where a failed seal leaves nothing,
            // or a hibernation that then runs on would stand in the store as asleep.
            if let Err(back) = std::fs::rename(&done, &self.dir) {
                tracing::warn!(
                    "{}: {e:#}; left in place (moving it back failed: {back})",
                    done.display()
                );
                return Ok(snapshot);
            }
            return Err(e);
        }
        Ok(snapshot)
    }

    /// The time the save began, RFC 3339.
    fn created(&self) -> String {
        let ago = self.started.elapsed();
        let at = SystemTime::now() - ago;
        humantime::format_rfc3339_millis(at).to_string()
    }
}

/// A snapshot never made whole (its save failed, or its task ended) leaves nothing, unless
/// the store leaves it ([`Store::leave_unfinished`]).
impl Drop for Pending {
    fn drop(&mut self) {
        if !self.done && !self.left.load(Ordering::Relaxed) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The complete snapshots in one VM's directory, in no order; one whose description is
/// unreadable, or names another VM or snapshot than its directories do (copied or moved
/// by hand: the store finds, verifies and deletes a snapshot by what it records), is
/// skipped with a warning.
fn snapshots_in(vm_dir: &Path) -> std::io::Result<Found> {
    let mut found = Found::default();
    for entry in std::fs::read_dir(vm_dir)?.flatten() {
        // A name that is not UTF-8 is none memtide gave (read lossily, it would stand for
        // another directory's: found by an audit).
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if name.ends_with(PARTIAL) || !entry.path().join(META).exists() {
            continue;
        }
        match snapshot_at(&entry.path()) {
            Ok(s) => found.read.push(s),
            Err(e) => {
                tracing::warn!("{e:#}");
                if let Ok(newer) = e.downcast::<Newer>() {
                    found.newer.push(newer);
                }
            }
        }
    }
    Ok(found)
}

/// The snapshot whose directory is `dir`, or why it is none to use.
fn snapshot_at(dir: &Path) -> anyhow::Result<Snapshot> {
    // What the store holds, not what a link points at (found by an audit: a snapshot
    // directory linked to one outside was listed and restored from there).
    if !std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) {
        bail!(
            "{}: not a directory of the store (a symbolic link?): skipped",
            dir.display()
        );
    }
    let placed = |vm: &str, id: &str| -> anyhow::Result<()> {
        let names = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
        let vm_dir = dir.parent().unwrap_or(dir);
        if names(dir).as_deref() != Some(id)
            || names(vm_dir).as_deref() != Some(dir_name(vm).as_str())
        {
            bail!(
                "{}: records snapshot {} of VM {}, not what its directory says: skipped (a \
                 snapshot copied or moved by hand?)",
                dir.display(),
                guest_text::clean(id),
                guest_text::clean(vm)
            );
        }
        Ok(())
    };
    match read_meta(&dir.join(META)) {
        Ok(s) => placed(&s.vm, &s.id).map(|()| s),
        Err(e) => match e.downcast::<Newer>() {
            Ok(newer) => {
                placed(&newer.vm, &newer.id)?;
                Err(Newer {
                    dir: dir.to_path_buf(),
                    ..newer
                }
                .into())
            }
            Err(e) => Err(e),
        },
    }
}

/// Of `all` (oldest first), the scheduled snapshots beyond the `keep` newest of them.
fn expired(all: Vec<Snapshot>, keep: usize) -> Vec<Snapshot> {
    let mut scheduled: Vec<Snapshot> = all
        .into_iter()
        .filter(|s| s.by == TakenBy::Schedule)
        .collect();
    let n = scheduled.len().saturating_sub(keep);
    scheduled.truncate(n);
    scheduled
}

/// Create `dir` and the directories above it that are missing, for their owner alone
/// (mode 0700): snapshots hold guests' memory, keys and all.
pub fn private_dirs(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))
}

/// A snapshot's description: a regular file of the store (not a link, not a FIFO that
/// would hold `snapshot list`, bounded as any text file), whose names hold. One in a
/// newer format than [`FORMAT`] is a [`Newer`] error (its `dir` the description's own).
fn read_meta(path: &Path) -> anyhow::Result<Snapshot> {
    use crate::text_file::{open_regular, read_file, Links};
    let text = open_regular(path, Links::Refuse)
        .and_then(read_file)
        .with_context(|| format!("reading {}", path.display()))?;
    // Its format first, read from whatever a newer memtide wrote around it: the strict
    // parse below would fail on a field added since, as if the file were damaged.
    if let Some(newer) = newer_format(&text, path) {
        return Err(newer.into());
    }
    let s: Snapshot =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    s.check()
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(s)
}

/// The [`Newer`] snapshot that description `text` (at `path`) describes, if its format
/// is newer than [`FORMAT`] and it names its VM and id.
fn newer_format(text: &str, path: &Path) -> Option<Newer> {
    let probe: serde_json::Value = serde_json::from_str(text).ok()?;
    let format = u32::try_from(probe.get("format")?.as_u64()?).unwrap_or(u32::MAX);
    let name = |key: &str| probe.get(key)?.as_str().map(str::to_string);
    if format <= FORMAT {
        return None;
    }
    Some(Newer {
        vm: name("vm")?,
        id: name("id")?,
        seq: probe
            .get("seq")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0),
        format,
        dir: path.parent().unwrap_or(path).to_path_buf(),
    })
}

/// What becomes of a file's pages in the host's page cache once it is checksummed.
#[derive(Clone, Copy, PartialEq)]
enum Cached {
    /// Kept: it is read again at once.
    Keep,
    /// Dropped: it is on disk to free memory.
    Drop,
}

/// A file's size and SHA-256, read afresh.
fn checksum(path: &Path, cached: Cached) -> anyhow::Result<FileSum> {
    let file = crate::text_file::open_regular(path, crate::text_file::Links::Refuse)
        .with_context(|| format!("reading {}", path.display()))?;
    let sum = file_sum(&file).with_context(|| format!("reading {}", path.display()))?;
    if cached == Cached::Drop {
        uncache(&file);
    }
    Ok(sum)
}

/// `sum`, the checksum the connector took of `path` as it was written, if the file is
/// still the size it summed (its pages dropped from the page cache, as [`checksum`]
/// drops them); else the file's own, read afresh.
fn summed(path: &Path, sum: &FileSum) -> anyhow::Result<FileSum> {
    let file = std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let bytes = file
        .metadata()
        .with_context(|| format!("reading {}", path.display()))?
        .len();
    if bytes != sum.bytes {
        tracing::warn!(
            "{} is {bytes} bytes, not the {} checksummed as it was written: read again",
            path.display(),
            sum.bytes
        );
        return checksum(path, Cached::Drop);
    }
    uncache(&file);
    Ok(sum.clone())
}

/// Drop `file`'s pages from the host's page cache: a snapshot is on disk to free memory
/// (its pages are clean once the connector synced it; a failure costs only memory).
fn uncache(file: &std::fs::File) {
    let _ = rustix::fs::fadvise(file, 0, None, rustix::fs::Advice::DontNeed);
}

fn write_synced(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    let mut file =
        std::fs::File::create(path).with_context(|| format!("writing {}", path.display()))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", path.display()))
}

fn sync_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing {}", dir.display()))
}

/// An error unless the file system of `dir` has room for a guest's `memory` and a margin.
pub fn room_for(dir: &Path, memory: Bytes) -> anyhow::Result<()> {
    let free = free_space(dir)?;
    if free < memory + HEADROOM {
        bail!(
            "{} has {free} free, less than the guest's {memory} and {HEADROOM} to spare",
            dir.display()
        );
    }
    Ok(())
}

/// Room left for an unprivileged writer on the file system of `dir`.
fn free_space(dir: &Path) -> anyhow::Result<Bytes> {
    let st = rustix::fs::statvfs(dir).with_context(|| format!("statvfs {}", dir.display()))?;
    Ok(Bytes(st.f_bavail.saturating_mul(st.f_frsize)))
}

/// How long ago `s` was taken, when its time reads.
pub fn age(s: &Snapshot) -> Option<Duration> {
    let at = humantime::parse_rfc3339(&s.created).ok()?;
    SystemTime::now().duration_since(at).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn saved() -> Saved {
        Saved {
            mechanism: "test".into(),
            was_running: true,
            downtime: Duration::from_millis(1500),
            written: Duration::from_millis(2000),
            ..Saved::default()
        }
    }

    /// A snapshot of `vm` whose connector wrote `content` into its memory file.
    fn take(store: &Store, vm: &str, content: &[u8]) -> Snapshot {
        let pending = store.begin(vm, Bytes::from_mib(1)).unwrap();
        std::fs::write(pending.dir().join("memory"), content).unwrap();
        pending
            .finish(&saved(), AfterSave::Run, TakenBy::Operator)
            .unwrap()
    }

    /// Each format's description, frozen in `tests/formats` with every optional field
    /// present, still reads; the current one is what a snapshot of every field writes.
    #[test]
    fn each_snapshot_format_still_reads_and_the_current_one_is_frozen() {
        let frozen = include_str!("../tests/formats/snapshot-format-1.json");
        // Every field, named: a field added to `Snapshot` fails here first.
        let full = Snapshot {
            format: 1,
            vm: "web1".into(),
            id: "20261207T021406.123Z".into(),
            seq: 3,
            created: "2026-12-07T02:14:06.123Z".into(),
            mechanism: "qmp migrate mapped-ram to fdset".into(),
            then: AfterSave::Quit,
            by: TakenBy::Hibernation,
            woken: Some("2026-12-07T03:00:00.000Z".into()),
            was_running: true,
            configured: Bytes::from_gib(2),
            ram_backend: Some("pc.ram".into()),
            downtime_s: 1.5,
            write_s: 1.25,
            save_s: 2.75,
            files: BTreeMap::from([(
                "memory".into(),
                FileSum {
                    bytes: 2 << 30,
                    sha256: "c787ab22685cefed1fcb16c45d663282786a1f0f5383873a4019028b966fdab4"
                        .into(),
                },
            )]),
        };
        let dir = tempfile::tempdir().unwrap();
        let meta = dir.path().join(META);
        std::fs::write(&meta, frozen).unwrap();
        assert_eq!(read_meta(&meta).unwrap(), full, "format 1 no longer reads");
        assert_eq!(
            (
                full.format,
                serde_json::to_string_pretty(&full).unwrap() + "\n"
            ),
            (FORMAT, frozen.to_string()),
            "a field of snapshot.json was added or renamed: bump \
             snapshots::FORMAT, add tests/formats/snapshot-format-N.json for it and test \
             it here, keeping the old fixtures readable"
        );
        // Written before descriptions were numbered: format 1.
        let unnumbered = frozen.replace("  \"format\": 1,\n", "");
        std::fs::write(&meta, &unnumbered).unwrap();
        assert_eq!(read_meta(&meta).unwrap(), full);
    }

    /// A snapshot a newer memtide wrote (a format above [`FORMAT`], with a field this one
    /// does not know) is named, counted and never passed over for an older one (found by
    /// the compatibility audit: it was skipped as damaged, and the older one restored).
    #[test]
    fn a_newer_memtides_snapshot_is_named_and_never_passed_over_for_an_older_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let hibernate = |content: &[u8]| {
            let pending = store.begin("web", Bytes::from_mib(1)).unwrap();
            std::fs::write(pending.dir().join("memory"), content).unwrap();
            pending
                .finish(&saved(), AfterSave::Quit, TakenBy::Hibernation)
                .unwrap()
        };
        let old = hibernate(b"old");
        let asleep = hibernate(b"new");
        let meta = store.dir_of(&asleep).join(META);
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&meta).unwrap()).unwrap();
        v["format"] = 99.into();
        v["added_later"] = "x".into();
        std::fs::write(&meta, v.to_string()).unwrap();

        assert_eq!(store.list("web").unwrap(), std::slice::from_ref(&old));
        let (_, newer) = store.listing(None).unwrap();
        assert_eq!(newer, store.listing(Some("web")).unwrap().1);
        let [n] = &newer[..] else { panic!("{newer:?}") };
        assert_eq!(
            (n.vm.as_str(), n.id.as_str(), n.seq, n.format),
            ("web", asleep.id.as_str(), 2, 99)
        );
        assert_eq!(n.dir, store.dir_of(&asleep));
        let told = "was written by a newer memtide (snapshot format 99; this one reads up to \
                    1): upgrade memtide to restore it";
        // The older hibernation is not the VM's hibernation: not listed asleep, and not
        // what the latest is taken for; found running, the VM's readable hibernations are
        // marked woken and the newer one named.
        assert!(store.asleep().unwrap().is_empty());
        for e in [
            store.find("web", None).unwrap_err(),
            store.find("web", Some(&asleep.id)).unwrap_err(),
            store.mark_all_woken("web").unwrap_err(),
        ] {
            let e = format!("{e:#}");
            assert!(e.contains(&asleep.id) && e.contains(told), "{e}");
        }
        let found = store.find("web", Some(&old.id)).unwrap();
        assert!(
            !found.asleep() && found.id == old.id,
            "by its ID, marked woken"
        );
        // The next save is newer than it, and then the newest again.
        let next = take(&store, "web", b"next");
        assert_eq!(next.seq, 3);
        assert_eq!(store.find("web", None).unwrap(), next);
        // No longer the newest: nothing to say of it when the VM runs.
        assert_eq!(store.mark_all_woken("web").unwrap(), []);
    }

    #[test]
    fn snapshots_are_in_the_order_taken_whatever_the_clock_said() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        // Taken while the clock ran years ahead: its id sorts after any taken since.
        let ahead = take(&store, "web", b"then");
        let future = "29991231T000000.000Z";
        let mut moved = ahead.clone();
        moved.id = future.into();
        std::fs::rename(store.dir_of(&ahead), store.dir_of(&moved)).unwrap();
        let meta = serde_json::to_vec_pretty(&moved).unwrap();
        std::fs::write(store.dir_of(&moved).join(META), meta).unwrap();
        let pending = store.begin("web", Bytes::from_mib(1)).unwrap();
        std::fs::write(pending.dir().join("memory"), b"now").unwrap();
        let asleep = pending
            .finish(&saved(), AfterSave::Quit, TakenBy::Hibernation)
            .unwrap();
        assert_eq!((moved.seq, asleep.seq), (1, 2));
        let ids: Vec<String> = store
            .list("web")
            .unwrap()
            .into_iter()
            .map(|s| s.id)
            .collect();
        assert_eq!(ids, [future.to_string(), asleep.id.clone()]);
        assert_eq!(store.asleep().unwrap(), vec![asleep]);
    }

    #[test]
    fn only_a_newest_hibernation_is_woken_from_and_a_vm_seen_running_wakes_them_all() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let take = |vm, then, by| {
            let pending = store.begin(vm, Bytes::from_mib(1)).unwrap();
            std::fs::write(pending.dir().join("memory"), b"guest").unwrap();
            pending.finish(&saved(), then, by).unwrap()
        };
        // Hibernated, then booted fresh by hand and snapshotted on schedule: the old
        // hibernation's memory no longer matches the disk.
        let old = take("web", AfterSave::Quit, TakenBy::Hibernation);
        assert_eq!(store.asleep().unwrap(), std::slice::from_ref(&old));
        take("web", AfterSave::Run, TakenBy::Schedule);
        assert!(store.asleep().unwrap().is_empty());
        let db = take("db", AfterSave::Quit, TakenBy::Operator);
        assert_eq!(store.asleep().unwrap(), vec![db], "web's is not its newest");
        // Seen running: marked woken, and only once.
        let marked = store.mark_all_woken("web").unwrap();
        assert_eq!(marked.iter().map(|s| &s.id).collect::<Vec<_>>(), [&old.id]);
        assert!(store.list("web").unwrap()[0].woken.is_some());
        assert!(store.mark_all_woken("web").unwrap().is_empty());
        assert!(store.mark_all_woken("nobody").unwrap().is_empty());
    }

    #[test]
    fn a_snapshot_is_listed_only_once_whole_and_its_files_checksummed() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        assert!(store.list("web").unwrap().is_empty(), "no store yet");
        // A save in progress (or one a crash ended) is not a snapshot.
        let pending = store.begin("web", Bytes::from_mib(1)).unwrap();
        std::fs::write(pending.dir().join("memory"), b"half").unwrap();
        assert!(store.list("web").unwrap().is_empty());
        assert!(store.list_all().unwrap().is_empty());
        // The next save removes what it left.
        let s = take(&store, "web", b"guest memory");
        assert!(!pending.dir().exists(), "the half-written save was removed");
        assert_eq!(store.list("web").unwrap(), std::slice::from_ref(&s));
        assert_eq!(s.files["memory"].bytes, 12);
        // sha256("guest memory"), from coreutils' sha256sum.
        assert_eq!(
            s.files["memory"].sha256,
            "c787ab22685cefed1fcb16c45d663282786a1f0f5383873a4019028b966fdab4"
        );
        assert!(s.was_running);
        assert_eq!(s.downtime_s, 1.5);
        store.verify(&s).unwrap();
        assert_eq!(store.find("web", None).unwrap(), s);
        assert_eq!(store.find("web", Some(&s.id)).unwrap(), s);
        let e = store.find("web", Some("nope")).unwrap_err().to_string();
        assert!(e.contains("has no snapshot nope"), "{e}");
    }

    #[test]
    fn a_checksum_taken_as_the_file_was_written_is_kept_only_while_its_size_matches() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let guest = b"guest memory";
        let sum = |bytes: &[u8]| {
            let path = dir.path().join("sum");
            std::fs::write(&path, bytes).unwrap();
            file_sum(&std::fs::File::open(path).unwrap()).unwrap()
        };
        // A checksum of the right size is taken as it is, the file not read again: one
        // that is not the file's shows it was kept.
        let kept = FileSum {
            sha256: "00".repeat(32),
            ..sum(guest)
        };
        let cut_short = FileSum {
            sha256: "00".repeat(32),
            ..sum(b"guest")
        };
        for (summed, expected, why) in [
            (kept.clone(), kept, "the connector's, kept"),
            (
                cut_short,
                sum(guest),
                "one of a file cut short, taken again from the file",
            ),
        ] {
            let pending = store.begin("web", Bytes::from_mib(1)).unwrap();
            std::fs::write(pending.dir().join("memory"), guest).unwrap();
            let saved = Saved {
                summed: BTreeMap::from([("memory".into(), summed)]),
                ..saved()
            };
            let s = pending
                .finish(&saved, AfterSave::Run, TakenBy::Operator)
                .unwrap();
            assert_eq!(s.files["memory"], expected, "{why}");
        }
    }

    /// The share of `path`'s pages in the host's page cache (mincore on a mapping of it).
    fn cached_share(path: &Path) -> f64 {
        use std::os::fd::AsRawFd;
        let file = std::fs::File::open(path).unwrap();
        let len = usize::try_from(file.metadata().unwrap().len()).unwrap();
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap();
        let mut resident = vec![0u8; len.div_ceil(page)];
        // SAFETY: a read-only mapping of the whole file, never read, unmapped below;
        // mincore writes one byte per page of it into `resident`, which has as many.
        unsafe {
            let map = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            );
            assert_ne!(map, libc::MAP_FAILED);
            assert_eq!(libc::mincore(map, len, resident.as_mut_ptr()), 0);
            libc::munmap(map, len);
        }
        resident.iter().filter(|b| **b & 1 == 1).count() as f64 / resident.len() as f64
    }

    #[test]
    fn a_checked_snapshot_stays_cached_for_its_restore_and_leaves_the_cache_after() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let s = take(&store, "web", &vec![7u8; 4 << 20]);
        let memory = store.dir_of(&s).join("memory");
        // Synced, as a connector leaves it: clean pages, which the kernel drops when told.
        std::fs::File::open(&memory).unwrap().sync_all().unwrap();
        store.uncache(&s);
        assert!(
            cached_share(&memory) < 0.5,
            "dropped: {}",
            cached_share(&memory)
        );
        store.verify(&s).unwrap();
        assert!(
            cached_share(&memory) > 0.9,
            "kept for the restore: {}",
            cached_share(&memory)
        );
        store.uncache(&s);
        assert!(
            cached_share(&memory) < 0.5,
            "dropped after: {}",
            cached_share(&memory)
        );
    }

    #[test]
    fn a_damaged_snapshot_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let s = take(&store, "db", b"0123456789");
        let file = store.dir_of(&s).join("memory");
        std::fs::write(&file, b"0123456788").unwrap();
        let e = store.verify(&s).unwrap_err().to_string();
        assert!(
            e.contains("memory is 10 bytes") && e.contains("damaged"),
            "{e}"
        );
        std::fs::write(&file, b"01234").unwrap();
        let e = store.verify(&s).unwrap_err().to_string();
        assert!(e.contains("memory is 5 bytes"), "{e}");
        std::fs::remove_file(&file).unwrap();
        assert!(store.verify(&s).is_err());
    }

    /// A description made by hand reads, checks and starts nothing outside the snapshot
    /// (an audit's cases, as root: each once read a file elsewhere, restored memory no
    /// checksum covered, held `snapshot list`, or reached QEMU's options).
    #[test]
    fn a_hand_made_snapshot_reads_nothing_but_its_own_checked_files() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(&dir.path().join("store"));
        let s = take(&store, "db", b"0123456789");
        let snap = store.dir_of(&s);
        let meta = snap.join(META);
        let text = std::fs::read_to_string(&meta).unwrap();
        let rewrite = |edit: &dyn Fn(&mut serde_json::Value)| {
            let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
            edit(&mut v);
            std::fs::write(&meta, v.to_string()).unwrap();
        };
        let outside = dir.path().join("secret");
        std::fs::write(&outside, "not the store's").unwrap();
        // A file named out of the snapshot, or a RAM name with options in it: skipped.
        let escapes: [(&str, serde_json::Value); 2] = [
            (
                "/files/../../../secret",
                serde_json::json!({"bytes": 10, "sha256": "00"}),
            ),
            ("/ram_backend", "pc.ram,mem-path=/x".into()),
        ];
        for (key, value) in escapes {
            rewrite(&|v| match key.strip_prefix("/files/") {
                Some(name) => v["files"][name] = value.clone(),
                None => v["ram_backend"] = value.clone(),
            });
            assert!(store.list("db").unwrap().is_empty(), "{key}");
        }
        // Files left out of the description: the memory file it no longer checksums is
        // refused, not restored unchecked.
        rewrite(&|v| v["files"] = serde_json::json!({}));
        let unlisted = store.find("db", None).unwrap();
        let e = store.verify(&unlisted).unwrap_err().to_string();
        assert!(
            e.ends_with("memory is not among the files its description checksums: not used"),
            "{e}"
        );
        // The memory a link out of the store, with the very bytes: refused.
        std::fs::write(&meta, &text).unwrap();
        let memory = snap.join("memory");
        std::fs::write(&outside, b"0123456789").unwrap();
        std::fs::remove_file(&memory).unwrap();
        std::os::unix::fs::symlink(&outside, &memory).unwrap();
        let e = format!("{:#}", store.verify(&s).unwrap_err());
        assert!(e.contains("a symbolic link, not followed"), "{e}");
        // A FIFO in its place: refused at once.
        std::fs::remove_file(&memory).unwrap();
        rustix::fs::mkfifoat(rustix::fs::CWD, &memory, 0o600.into()).unwrap();
        let e = format!("{:#}", store.verify(&s).unwrap_err());
        assert!(e.contains("not a regular file"), "{e}");
        // The description a FIFO: `list` goes on without it.
        std::fs::remove_file(&meta).unwrap();
        rustix::fs::mkfifoat(rustix::fs::CWD, &meta, 0o600.into()).unwrap();
        assert!(store.list("db").unwrap().is_empty());
        // A snapshot directory linked to one outside the store: not listed.
        let elsewhere = dir.path().join("elsewhere");
        std::fs::rename(&snap, &elsewhere).unwrap();
        std::fs::remove_file(elsewhere.join(META)).unwrap();
        std::fs::write(elsewhere.join(META), &text).unwrap();
        std::fs::remove_file(elsewhere.join("memory")).unwrap();
        std::fs::write(elsewhere.join("memory"), b"0123456789").unwrap();
        std::os::unix::fs::symlink(&elsewhere, &snap).unwrap();
        assert!(store.list("db").unwrap().is_empty());
        // Names that would reach the terminal as controls: skipped.
        std::fs::remove_file(&snap).unwrap();
        std::fs::rename(&elsewhere, &snap).unwrap();
        assert_eq!(store.list("db").unwrap().len(), 1);
        let evil = "db\u{1b}[2J";
        rewrite(&|v| v["vm"] = evil.into());
        std::fs::create_dir_all(store.vm_dir(evil)).unwrap();
        std::fs::rename(&snap, store.vm_dir(evil).join(&s.id)).unwrap();
        assert!(store.list_all().unwrap().is_empty());
        // Sizes beyond any file add up without overflowing.
        let mut huge = s.clone();
        for name in ["a", "b"] {
            huge.files.insert(
                name.into(),
                FileSum {
                    bytes: u64::MAX,
                    sha256: String::new(),
                },
            );
        }
        assert_eq!(huge.bytes(), u64::MAX);
    }

    #[test]
    fn snapshots_are_kept_apart_by_vm_and_time_and_deleted_whole() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let a1 = take(&store, "a", b"1");
        let a2 = take(&store, "a", b"2");
        let b = take(&store, "b", b"3");
        assert!(a1.id < a2.id, "{} then {}", a1.id, a2.id);
        assert_eq!(store.find("a", None).unwrap(), a2, "the latest");
        assert_eq!(store.list_all().unwrap(), [a1.clone(), a2.clone(), b]);
        // A delete cut short left its partial behind (not empty), and a link in the
        // place of another's, pointing out of the store.
        let leftover = store.vm_dir("a").join(format!("{}{PARTIAL}", a1.id));
        std::fs::create_dir_all(&leftover).unwrap();
        std::fs::write(leftover.join("memory"), b"1").unwrap();
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("kept"), b"").unwrap();
        let link = store.vm_dir("a").join(format!("{}{PARTIAL}", a2.id));
        std::os::unix::fs::symlink(&outside, &link).unwrap();
        store.delete(&a1).unwrap();
        assert_eq!(store.list("a").unwrap(), std::slice::from_ref(&a2));
        assert!(!store.dir_of(&a1).exists() && !leftover.exists());
        store.delete(&a2).unwrap();
        assert!(store.list("a").unwrap().is_empty());
        assert!(
            outside.join("kept").exists(),
            "nothing followed out of the store"
        );
    }

    #[test]
    fn a_snapshot_copied_under_another_vm_or_id_is_skipped_not_taken_for_the_original() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let c = take(&store, "c", b"c's memory");
        let a = take(&store, "a", b"a's memory");
        let copy = |to: PathBuf| {
            std::fs::create_dir_all(&to).unwrap();
            for entry in std::fs::read_dir(store.dir_of(&c)).unwrap().flatten() {
                std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
            }
        };
        // c's snapshot copied into a's directory, under another id, and under its own.
        copy(store.vm_dir("a").join("20990101T000000.000Z"));
        copy(store.vm_dir("a").join(&c.id));
        // And into c's directory under another id.
        copy(store.vm_dir("c").join("20990101T000000.000Z"));
        assert_eq!(store.list("a").unwrap(), std::slice::from_ref(&a));
        assert_eq!(store.list("c").unwrap(), std::slice::from_ref(&c));
        assert_eq!(store.list_all().unwrap(), [a, c.clone()]);
        assert!(store.find("a", Some("20990101T000000.000Z")).is_err());
        assert_eq!(
            store.find("c", None).unwrap(),
            c,
            "not the copy, newer by its name"
        );
        assert!(store.dir_of(&c).exists());
    }

    #[test]
    fn one_restore_of_a_vm_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let held = store.lock_restore("c").unwrap();
        let e = store.lock_restore("c").unwrap_err().to_string();
        assert!(e.starts_with("a restore of c is already under way"), "{e}");
        let other = store.lock_restore("b").unwrap();
        drop(held);
        let again = store.lock_restore("c").unwrap();
        drop((other, again));
        // No snapshot is seen in the lock file.
        assert!(store.list("c").unwrap().is_empty());
        assert!(store.list_all().unwrap().is_empty());
    }

    #[test]
    fn only_the_oldest_scheduled_snapshots_beyond_the_kept_are_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let by = |by| {
            let pending = store.begin("ci", Bytes::from_mib(1)).unwrap();
            std::fs::write(pending.dir().join("memory"), b"x").unwrap();
            pending.finish(&saved(), AfterSave::Run, by).unwrap()
        };
        let hand = by(TakenBy::Operator);
        let s1 = by(TakenBy::Schedule);
        let slept = by(TakenBy::Hibernation);
        let s2 = by(TakenBy::Schedule);
        let s3 = by(TakenBy::Schedule);
        assert!(store.prune("ci", 3).unwrap().is_empty());
        // Not while a clone runs: it may be making its template from s1.
        let cloning = Lock::take(&store.vm_dir("ci").join(CLONE_LOCK)).unwrap();
        assert!(store.prune("ci", 2).unwrap().is_empty());
        drop(cloning);
        assert_eq!(store.prune("ci", 2).unwrap(), [s1]);
        assert_eq!(store.list("ci").unwrap(), [hand, slept, s2, s3]);
    }

    #[test]
    fn no_vm_name_leaves_the_store() {
        let store = Store::new(Path::new("/store"));
        let cases = [
            ("web-1.example", "web-1.example"),
            ("..", "%2E."),
            (".hidden", "%2Ehidden"),
            ("a/../../etc", "a%2F..%2F..%2Fetc"),
            ("x y'z", "x%20y%27z"),
        ];
        for (name, dir) in cases {
            assert_eq!(
                store.vm_dir(name),
                Path::new("/store").join(dir),
                "{name:?}"
            );
            assert_eq!(vm_of_dir(dir).as_deref(), Some(name), "{dir:?}");
        }
        // Names memtide never gives stand for no VM.
        for dir in ["a%2", "a%zz", "a%2f", ".x", "a%41", "%C3"] {
            assert_eq!(vm_of_dir(dir), None, "{dir:?}");
        }
        assert_eq!(vm_of_dir("%C3%A9t%C3%A9").as_deref(), Some("été"));
        let e = store.begin("", Bytes::from_mib(1)).unwrap_err().to_string();
        assert!(e.contains("no name"), "{e}");
    }

    #[test]
    fn saves_cut_short_are_found_naming_their_vm_and_a_whole_libvirt_image() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        assert_eq!(store.unfinished().unwrap(), [], "no store yet");
        take(&store, "web/1", b"whole");
        // A save the daemon stopped at once during, its files left as they were.
        let cut = store.begin("web/1", Bytes::from_mib(1)).unwrap();
        std::fs::write(cut.dir.join("memory"), [0u8; 3000]).unwrap();
        std::fs::write(cut.dir.join("state"), [0u8; 96]).unwrap();
        store.leave_unfinished();
        drop(cut);
        // libvirt finished one after memtide stopped; another it had only begun.
        let db = store.vm_dir("db");
        for (id, magic) in [
            ("1.partial", "LibvirtQemudSave"),
            ("2.partial", "LibvirtQemudPart"),
        ] {
            std::fs::create_dir_all(db.join(id)).unwrap();
            std::fs::write(db.join(id).join("memory"), format!("{magic}...")).unwrap();
        }
        // Not saves of memtide's: a clone template being made, a directory of no VM.
        std::fs::create_dir_all(dir.path().join("a%zz").join("3.partial")).unwrap();
        std::fs::create_dir_all(store.vm_dir("web/1").join("x").join("template.partial")).unwrap();

        let found = store.unfinished().unwrap();
        let seen: Vec<(&str, bool, u64)> = found
            .iter()
            .map(|u| (u.vm.as_str(), u.libvirt_image, u.bytes))
            .collect();
        assert_eq!(
            seen,
            [("db", true, 19), ("db", false, 19), ("web/1", false, 3096)]
        );
        assert!(found[2].dir.starts_with(store.vm_dir("web/1")));
        let told = found[0].describe();
        assert!(
            told.contains("virsh restore '") && told.contains("1.partial/memory'"),
            "{told}"
        );
        assert!(!found[2].describe().contains("virsh"));
        // Names anyone may have written are escaped, and a path quoted as a shell reads it.
        let hostile = store.vm_dir("\u{1b}[2J").join("it's.partial");
        std::fs::create_dir_all(&hostile).unwrap();
        std::os::unix::fs::symlink("/dev/zero", hostile.join("memory")).unwrap();
        let found = store.unfinished().unwrap();
        let told = found.iter().find(|u| u.vm == "\u{1b}[2J").unwrap();
        assert!(!told.libvirt_image, "a link is not read");
        let told = told.describe();
        assert!(!told.contains('\u{1b}'), "{told}");
        assert!(told.contains(r"it'\''s.partial'`"), "{told}");
        // The VM's next save (a daemon's of its own) removes what its cut-short save left.
        let next = Store::new(dir.path());
        drop(next.begin("web/1", Bytes::from_mib(1)).unwrap());
        let left: Vec<String> = store
            .unfinished()
            .unwrap()
            .into_iter()
            .map(|u| u.vm)
            .collect();
        assert_eq!(left, ["\u{1b}[2J", "db", "db"]);
    }

    #[test]
    fn a_save_is_refused_when_the_file_system_lacks_room() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let huge = Bytes::from_gib(1 << 30);
        let e = format!("{:#}", store.begin("big", huge).unwrap_err());
        // Its caller says "not saved": said once.
        assert!(
            !e.contains("not saved") && e.contains("free, less than the guest's"),
            "{e}"
        );
        let left: Vec<_> = std::fs::read_dir(store.vm_dir("big")).unwrap().collect();
        assert!(left.is_empty(), "nothing left behind");
    }
}
