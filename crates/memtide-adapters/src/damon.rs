//! Host-side access tracking by DAMON's virtual address monitoring, through its sysfs
//! interface (Documentation/admin-guide/mm/damon/usage.rst): which parts of a process's
//! address space were accessed lately, as regions DAMON adapts to the access pattern.
//!
//! DAMON checks a sampled page's accessed bit with the mmu notifiers, so it sees a KVM
//! guest's accesses as idle page tracking does, at a cost bounded by its region count
//! rather than by the process's size. Debian's kernels have DAMON (6.12) but no idle page
//! tracking. Root only, as the sysfs files are root's.
//!
//! memtide runs a kdamond of its own per tracked process — a `stat` scheme over every
//! region, whose `tried_regions` hold the regions with their access counts and ages — and
//! never touches a kdamond it did not start: writing `nr_kdamonds` rebuilds every kdamond
//! directory (mm/damon/sysfs.c), so memtide only uses DAMON while every kdamond there is
//! its own. It records the kdamonds it runs (in /run/memtide), so that those a memtide
//! process left running when it ended without stopping them (killed, or crashed) are
//! known for its own by the next and taken back. Written by hand: no crate drives
//! DAMON's sysfs interface.

use crate::procfs;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// DAMON's sysfs interface under a sysfs mount.
pub fn admin_dir(sys: &Path) -> PathBuf {
    sys.join("kernel/mm/damon/admin")
}

/// Between two checks of a region's sampled page.
pub const SAMPLE: Duration = Duration::from_millis(10);
/// The interval a region's access count covers: ages count in these.
pub const AGGREGATION: Duration = Duration::from_millis(200);
/// Between two updates of the monitored address ranges from the process's mappings.
pub const UPDATE: Duration = Duration::from_secs(1);
/// The fewest and most regions DAMON splits a process's address space into.
pub const REGIONS: (u32, u32) = (10, 1000);

/// A region as DAMON's `stat` scheme last saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    /// Its start address.
    pub start: u64,
    /// Its end address (exclusive).
    pub end: u64,
    /// Checks of its sampled page that found it accessed, in the last aggregation interval.
    pub nr_accesses: u32,
    /// Aggregation intervals since its access count last changed much (or it was made).
    pub age: u32,
}

/// The address ranges of `regions` accessed within the last `within`: those found
/// accessed in the last aggregation interval, and those whose access count changed less
/// than `within` ago (ages count `aggregation` intervals) — idle now, but not for all of
/// `within`. Sorted by address, adjacent ones joined.
pub fn accessed_within(
    regions: &[Region],
    aggregation: Duration,
    within: Duration,
) -> Vec<Range<u64>> {
    let mut out: Vec<Range<u64>> = Vec::new();
    let mut accessed: Vec<&Region> = regions
        .iter()
        .filter(|r| r.start < r.end)
        .filter(|r| r.nr_accesses > 0 || aggregation * r.age < within)
        .collect();
    accessed.sort_by_key(|r| r.start);
    for r in accessed {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r.start..r.end),
        }
    }
    out
}

/// Whether the kernel has DAMON's sysfs interface under `admin`.
pub fn supported(admin: &Path) -> Result<(), DamonError> {
    let kdamonds = admin.join("kdamonds");
    match kdamonds.is_dir() {
        true => Ok(()),
        false => Err(DamonError::Unsupported(kdamonds)),
    }
}

/// Why DAMON cannot track a process.
#[derive(Debug, thiserror::Error)]
pub enum DamonError {
    /// The kernel has no DAMON sysfs interface.
    #[error("{0} is missing: the kernel has no DAMON sysfs interface (CONFIG_DAMON_SYSFS, CONFIG_DAMON_VADDR)")]
    Unsupported(PathBuf),
    /// Kdamonds memtide did not start are there.
    #[error("{path} is {found}, not memtide's {ours}: another tool uses DAMON, and memtide never touches a kdamond it did not start")]
    InUse {
        /// The `nr_kdamonds` file.
        path: PathBuf,
        /// Kdamonds there.
        found: u32,
        /// Kdamonds memtide started.
        ours: u32,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// A file held something else than a number.
    #[error("{path}: not a number: {text:?}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What it held.
        text: String,
    },
}

/// Write `value` to a sysfs file. The kernel takes one DAMON command at a time and
/// refuses a concurrent one with EBUSY (another tool's, as memtide's own are written one
/// at a time): tried again for up to a second.
fn write(path: &Path, value: impl std::fmt::Display) -> Result<(), DamonError> {
    let text = value.to_string();
    let once = || {
        // Sysfs files exist or the interface lacks them: never created.
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(path)?;
        std::io::Write::write_all(&mut file, text.as_bytes())
    };
    let mut tries = 0;
    loop {
        match once() {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && tries < 20 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            done => {
                return done.map_err(|source| DamonError::Io {
                    path: path.to_path_buf(),
                    source,
                })
            }
        }
    }
}

fn read_number<T: std::str::FromStr>(path: &Path) -> Result<T, DamonError> {
    let text = std::fs::read_to_string(path).map_err(|source| DamonError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    text.trim().parse().map_err(|_| DamonError::Parse {
        path: path.to_path_buf(),
        text: text.trim().to_string(),
    })
}

/// A kdamond memtide started: its process, its kernel thread (the kdamond's `pid` file
/// while it runs) and when it was last (re)started.
#[derive(Clone, Copy, Debug)]
struct Slot {
    pid: i32,
    kthread: Option<u32>,
    started: Instant,
}

/// memtide's kdamonds under one admin directory: a slot per kdamond directory, the
/// process it monitors while in use; and the process each was last set up for (0: never),
/// for the record.
#[derive(Default)]
struct Kdamonds {
    slots: Vec<Option<Slot>>,
    set_for: Vec<i32>,
}

impl Kdamonds {
    /// Set kdamond `i` (under `kdamonds`) up on process `pid` and turn it on: its slot in
    /// use; where that fails, the kdamond turned off and its slot free.
    fn start_slot(&mut self, kdamonds: &Path, i: usize, pid: i32) -> Result<(), DamonError> {
        let dir = kdamonds.join(i.to_string());
        self.set_for[i] = pid;
        match set_up(&dir, pid) {
            Ok(()) => {
                // -1 while off: no kernel thread.
                let kthread = read_number::<u32>(&dir.join("pid")).ok().filter(|p| *p > 0);
                self.slots[i] = Some(Slot {
                    pid,
                    kthread,
                    started: Instant::now(),
                });
                Ok(())
            }
            Err(e) => {
                let _ = turn_off(&dir);
                self.slots[i] = None;
                Err(e)
            }
        }
    }

    /// One directory more, free.
    fn grow(&mut self) {
        self.slots.push(None);
        self.set_for.push(0);
    }

    /// None: the directories are gone, or another tool's.
    fn clear(&mut self) {
        self.slots.clear();
        self.set_for.clear();
    }
}

/// memtide's kdamonds by admin directory (one in a daemon; tests use their own trees).
/// Held over every write to DAMON's files and the reads that follow: the kernel takes
/// one command at a time, so the VMs' scans take turns.
static KDAMONDS: Mutex<Option<HashMap<PathBuf, Kdamonds>>> = Mutex::new(None);

/// Whether kdamond directory `kdamond` is still the one memtide set up for `pid`: its
/// target that process, its operations `vaddr`. Another tool could have rebuilt the
/// directories while none of memtide's kdamonds ran (DAMON refuses only while one runs).
fn is_ours(kdamond: &Path, pid: i32) -> bool {
    let ctx = kdamond.join("contexts/0");
    let read = |f: &str| std::fs::read_to_string(ctx.join(f)).unwrap_or_default();
    read("targets/0/pid_target").trim() == pid.to_string() && read("operations").trim() == "vaddr"
}

/// Where memtide records the kdamonds it runs under `admin`: in memtide's runtime
/// directory for the kernel's own tree (the systemd unit's, on /run), in the tree itself
/// where it is a test's fake one.
fn record_path(admin: &Path) -> PathBuf {
    if admin == admin_dir(Path::new("/sys")) {
        PathBuf::from("/run/memtide/damon-kdamonds.json")
    } else {
        admin.join("memtide-kdamonds.json")
    }
}

/// What memtide records of its kdamonds under one admin directory ([`record_path`]).
#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Record {
    /// The boot it was written in (`/proc/sys/kernel/random/boot_id`).
    boot: String,
    /// The memtide process running them: its pid and start time ([`procfs::start_time`]).
    owner: (i32, u64),
    /// Each kdamond directory memtide made, in order: the process it was last set up for
    /// (0: never) and its kernel thread while memtide ran it.
    dirs: Vec<(i32, Option<u32>)>,
    /// Written as memtide grew the count by one, before the kernel did: it may not have.
    growing: bool,
}

/// This boot's id.
fn boot_id() -> Option<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    Some(id.trim().to_string())
}

/// This process, as a record names its owner.
fn this_process() -> Option<(i32, u64)> {
    let pid = i32::try_from(std::process::id()).ok()?;
    Some((pid, procfs::start_time(Path::new("/proc"), pid)?))
}

/// Whether process `pid`, started at `started`, has ended: no such process, a zombie, or
/// another process with its pid. Not where /proc cannot tell (where
/// [`procfs::process_runs_as`] takes a process it cannot read for gone: here that would
/// let kdamonds be taken back from a memtide that may still run).
fn ended(pid: i32, started: u64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
        Ok(_) => procfs::start_time(Path::new("/proc"), pid) != Some(started),
    }
}

fn read_record(path: &Path) -> Option<Record> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// memtide's hold, across processes (a daemon beside a `memtide access`), on the
/// kdamonds under `admin` and their record, while it starts or stops its own: a lock file
/// beside the record. None where that file cannot be made.
fn hold_across_processes(admin: &Path) -> Option<std::fs::File> {
    let path = record_path(admin).with_extension("lock");
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).ok()?;
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .ok()?;
    rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive).ok()?;
    Some(file)
}

/// Record memtide's kdamonds under `admin` as they are now (`growing`: with one more,
/// about to be made); the record removed with the last of them, unless it is another
/// memtide process's. Best effort: without it, kdamonds a killed memtide leaves are not
/// taken back, and DAMON is refused until they are removed by hand.
fn save_record(ours: &Kdamonds, admin: &Path, growing: bool) {
    let path = record_path(admin);
    let me = this_process();
    if ours.slots.is_empty() && !growing {
        if read_record(&path).is_none_or(|r| Some(r.owner) == me) {
            let _ = std::fs::remove_file(&path);
        }
        return;
    }
    let saved = || -> Result<(), String> {
        let owner = me.ok_or("this process's start time is unknown")?;
        let boot = boot_id().ok_or("the boot id is unknown")?;
        let mut dirs: Vec<(i32, Option<u32>)> = (ours.set_for.iter())
            .zip(&ours.slots)
            .map(|(pid, slot)| (*pid, slot.and_then(|s| s.kthread)))
            .collect();
        if growing {
            dirs.push((0, None));
        }
        let record = Record {
            boot,
            owner,
            dirs,
            growing,
        };
        let text = serde_json::to_vec(&record).map_err(|e| e.to_string())?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        }
        let tmp = path.with_extension(format!("json.{}", owner.0));
        std::fs::write(&tmp, text).map_err(|e| e.to_string())?;
        std::fs::rename(&tmp, &path).map_err(|e| e.to_string())
    };
    if let Err(e) = saved() {
        tracing::debug!(
            "DAMON: memtide's kdamonds not recorded in {}: {e}",
            path.display()
        );
    }
}

/// Stop and remove the kdamonds under `admin` that a memtide process which has ended
/// left (killed, or crashed, before it could stop them), leaving DAMON as that process
/// found it; whether it did. Only as its record names them: written in this boot, its
/// process ended, `nr_kdamonds` (`found`) the count it made, each kdamond on still the
/// one it ran (its kernel thread the one recorded, its target the same process) and each
/// one off never set up or set up on the process recorded. Only those on are turned off,
/// and the kernel refuses the count 0 while any other kdamond runs: another tool's are
/// never stopped.
fn take_back(admin: &Path, found: usize) -> Result<bool, DamonError> {
    let path = record_path(admin);
    let Some(record) = read_record(&path) else {
        return Ok(false);
    };
    let (owner, started) = record.owner;
    let made = record.dirs.len();
    let count = found == made || (record.growing && found + 1 == made);
    if boot_id() != Some(record.boot.clone()) || !count || !ended(owner, started) {
        return Ok(false);
    }
    let kdamonds = admin.join("kdamonds");
    let text = |p: PathBuf| std::fs::read_to_string(p).map(|t| t.trim().to_string());
    let mut on = Vec::new();
    for (i, &(pid, kthread)) in record.dirs.iter().enumerate().take(found) {
        let dir = kdamonds.join(i.to_string());
        let as_left = match text(dir.join("state")).as_deref() {
            Ok("off") => match text(dir.join("contexts/0/targets/0/pid_target")) {
                Ok(target) => target == "0" || target == pid.to_string(),
                // No context: never set up since the kernel made it.
                Err(e) => e.kind() == std::io::ErrorKind::NotFound,
            },
            Ok("on") => {
                let thread = text(dir.join("pid")).ok();
                on.push((i, pid));
                kthread.is_some_and(|k| thread == Some(k.to_string())) && is_ours(&dir, pid)
            }
            _ => false,
        };
        if !as_left {
            return Ok(false);
        }
    }
    for &(i, _) in &on {
        turn_off(&kdamonds.join(i.to_string()))?;
    }
    write(&kdamonds.join("nr_kdamonds"), 0)?;
    let _ = std::fs::remove_file(&path);
    tracing::warn!(
        "DAMON: memtide process {owner} ended without stopping its {} kdamond(s) on \
         process(es) {:?}: stopped and removed",
        on.len(),
        on.iter().map(|r| r.1).collect::<Vec<_>>()
    );
    Ok(true)
}

/// A kdamond's regions, and how long it has run.
#[derive(Debug)]
pub struct Regions {
    /// The regions, in no particular order.
    pub list: Vec<Region>,
    /// How long the kdamond has monitored its process since it last (re)started.
    pub ran: Duration,
}

/// A kdamond of memtide's own monitoring one process; turned off when dropped.
#[derive(Debug)]
pub struct Monitor {
    admin: PathBuf,
    index: usize,
    pid: i32,
}

impl Monitor {
    /// Start monitoring process `pid` with DAMON under `admin` (see [`admin_dir`]).
    ///
    /// Takes a kdamond directory memtide left free, or adds one: DAMON rebuilds them all
    /// then, so memtide's running kdamonds are stopped, set up again and restarted
    /// (their regions start afresh). Kdamonds a memtide process that has ended left
    /// behind are taken back first, as its record names them. Refused, touching nothing,
    /// while kdamonds memtide did not start are there.
    pub fn start(admin: &Path, pid: i32) -> Result<Monitor, DamonError> {
        supported(admin)?;
        let kdamonds = admin.join("kdamonds");
        let nr_path = kdamonds.join("nr_kdamonds");
        let mut all = KDAMONDS.lock().unwrap_or_else(PoisonError::into_inner);
        let _held = hold_across_processes(admin);
        let ours = all
            .get_or_insert_with(HashMap::new)
            .entry(admin.to_path_buf())
            .or_default();
        let mut found: u32 = read_number(&nr_path)?;
        if ours.slots.is_empty() && found > 0 && take_back(admin, found as usize)? {
            found = 0;
        }
        let running: Vec<(usize, i32)> = (0..)
            .zip(&ours.slots)
            .filter_map(|(i, s)| Some((i, s.as_ref()?.pid)))
            .collect();
        let theirs = running
            .iter()
            .any(|&(i, pid)| !is_ours(&kdamonds.join(i.to_string()), pid));
        if found as usize != ours.slots.len() || theirs {
            return Err(DamonError::InUse {
                path: nr_path,
                found,
                ours: running.len() as u32,
            });
        }
        let index = match ours.slots.iter().position(Option::is_none) {
            Some(free) => free,
            None => {
                // Stop ours, grow (which rebuilds every directory), set ours up again;
                // recorded before the kernel is asked, so that a memtide killed between
                // leaves a record of either count.
                for &(i, _) in &running {
                    turn_off(&kdamonds.join(i.to_string()))?;
                }
                save_record(ours, admin, true);
                let grown = write(&nr_path, ours.slots.len() + 1);
                match &grown {
                    Ok(()) => ours.grow(),
                    // The kernel removes every directory before it makes the new ones:
                    // unless the count stayed, memtide's are gone.
                    Err(_) if read_number::<usize>(&nr_path).ok() != Some(ours.slots.len()) => {
                        ours.slots.iter_mut().for_each(|s| *s = None);
                    }
                    Err(_) => {}
                }
                for (i, pid) in running {
                    if ours.slots[i].is_none() {
                        continue;
                    }
                    if let Err(e) = ours.start_slot(&kdamonds, i, pid) {
                        // Its process is likely gone: its tracker fails at its next scan.
                        tracing::debug!("DAMON: kdamond {i} (pid {pid}) not restarted: {e}");
                    }
                }
                if grown.is_err() {
                    save_record(ours, admin, false);
                }
                grown?;
                ours.slots.len() - 1
            }
        };
        let started = ours.start_slot(&kdamonds, index, pid);
        if started.is_err() {
            remove_if_unused(ours, admin);
        }
        save_record(ours, admin, false);
        started?;
        Ok(Monitor {
            admin: admin.to_path_buf(),
            index,
            pid,
        })
    }

    fn dir(&self) -> PathBuf {
        self.admin.join("kdamonds").join(self.index.to_string())
    }

    /// The regions as of DAMON's latest aggregation interval (asks the kdamond to update
    /// its scheme's `tried_regions`, which waits for the kdamond's next pass), and how
    /// long the kdamond has monitored its process since it last (re)started, read under
    /// the same lock as the regions: they are no older.
    pub fn regions(&self) -> Result<Regions, DamonError> {
        let all = KDAMONDS.lock().unwrap_or_else(PoisonError::into_inner);
        let ran = all
            .as_ref()
            .and_then(|a| a.get(&self.admin)?.slots.get(self.index).copied()?)
            .filter(|s| s.pid == self.pid)
            .map_or(Duration::ZERO, |s| s.started.elapsed());
        let dir = self.dir();
        if !is_ours(&dir, self.pid) {
            let nr_path = self.admin.join("kdamonds/nr_kdamonds");
            return Err(DamonError::InUse {
                found: read_number(&nr_path)?,
                path: nr_path,
                ours: 0,
            });
        }
        write(&dir.join("state"), "update_schemes_tried_regions")?;
        let tried = dir.join("contexts/0/schemes/0/tried_regions");
        let entries = std::fs::read_dir(&tried).map_err(|source| DamonError::Io {
            path: tried.clone(),
            source,
        })?;
        let mut list = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|source| DamonError::Io {
                path: tried.clone(),
                source,
            })?;
            // Numbered directories, beside files such as total_bytes.
            if entry
                .file_name()
                .to_str()
                .is_none_or(|n| n.parse::<u32>().is_err())
            {
                continue;
            }
            let r = entry.path();
            list.push(Region {
                start: read_number(&r.join("start"))?,
                end: read_number(&r.join("end"))?,
                nr_accesses: read_number(&r.join("nr_accesses"))?,
                age: read_number(&r.join("age"))?,
            });
        }
        Ok(Regions { list, ran })
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let mut all = KDAMONDS.lock().unwrap_or_else(PoisonError::into_inner);
        let _held = hold_across_processes(&self.admin);
        if let Some(ours) = all.as_mut().and_then(|a| a.get_mut(&self.admin)) {
            release(ours, &self.admin, self.index, self.pid);
        }
    }
}

/// Turn kdamond `index` (memtide's, for `pid`) off and free its slot; with the last of
/// memtide's, remove them all, leaving DAMON as memtide found it. A kdamond that is no
/// longer memtide's is left alone (and memtide forgets its others); one that would not
/// stop keeps its slot.
fn release(ours: &mut Kdamonds, admin: &Path, index: usize, pid: i32) {
    if ours.slots.get(index).copied().flatten().map(|s| s.pid) != Some(pid) {
        // Forgotten already (its directories were found another tool's).
        return;
    }
    let kdamonds = admin.join("kdamonds");
    let dir = kdamonds.join(index.to_string());
    if !is_ours(&dir, pid) {
        // Another tool rebuilt the directories (it could only while none of memtide's
        // ran): none of them is memtide's any more.
        ours.clear();
        save_record(ours, admin, false);
        return;
    }
    if let Err(e) = turn_off(&dir) {
        tracing::warn!("DAMON: memtide's kdamond {index} (pid {pid}) not stopped: {e}");
        return;
    }
    if let Some(slot) = ours.slots.get_mut(index) {
        *slot = None;
    }
    remove_if_unused(ours, admin);
    save_record(ours, admin, false);
}

/// With none of memtide's kdamonds in use, remove them all, leaving DAMON as memtide
/// found it.
fn remove_if_unused(ours: &mut Kdamonds, admin: &Path) {
    if ours.slots.iter().any(Option::is_some) {
        return;
    }
    let nr_path = admin.join("kdamonds/nr_kdamonds");
    if read_number::<usize>(&nr_path).ok() != Some(ours.slots.len()) {
        // Not the count memtide made: the directories are another tool's now.
        ours.clear();
        return;
    }
    match write(&nr_path, 0) {
        Ok(()) => ours.clear(),
        Err(e) => tracing::warn!("DAMON: memtide's kdamonds not removed: {e}"),
    }
}

/// Turn a kdamond off. One already off (its process gone) refuses with EINVAL or EPERM
/// (mm/damon's damon_stop), which is as good.
fn turn_off(kdamond: &Path) -> Result<(), DamonError> {
    match write(&kdamond.join("state"), "off") {
        Err(DamonError::Io { source, .. })
            if matches!(source.raw_os_error(), Some(libc::EINVAL | libc::EPERM)) =>
        {
            Ok(())
        }
        done => done,
    }
}

/// Set kdamond directory `kdamond` up to monitor `pid`'s virtual address space with a
/// `stat` scheme over every region, and turn it on.
fn set_up(kdamond: &Path, pid: i32) -> Result<(), DamonError> {
    write(&kdamond.join("contexts/nr_contexts"), 1)?;
    let ctx = kdamond.join("contexts/0");
    write(&ctx.join("operations"), "vaddr")?;
    let attrs = ctx.join("monitoring_attrs");
    write(&attrs.join("intervals/sample_us"), SAMPLE.as_micros())?;
    write(&attrs.join("intervals/aggr_us"), AGGREGATION.as_micros())?;
    write(&attrs.join("intervals/update_us"), UPDATE.as_micros())?;
    write(&attrs.join("nr_regions/min"), REGIONS.0)?;
    write(&attrs.join("nr_regions/max"), REGIONS.1)?;
    write(&ctx.join("targets/nr_targets"), 1)?;
    write(&ctx.join("targets/0/pid_target"), pid)?;
    write(&ctx.join("schemes/nr_schemes"), 1)?;
    let scheme = ctx.join("schemes/0");
    write(&scheme.join("action"), "stat")?;
    // Every region, whatever its size, access count and age.
    for (name, max) in [
        ("sz", u64::MAX),
        ("nr_accesses", u32::MAX.into()),
        ("age", u32::MAX.into()),
    ] {
        write(&scheme.join("access_pattern").join(name).join("min"), 0)?;
        write(&scheme.join("access_pattern").join(name).join("max"), max)?;
    }
    write(&kdamond.join("state"), "on")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const AGGR: Duration = Duration::from_millis(200);

    fn region(start: u64, end: u64, nr_accesses: u32, age: u32) -> Region {
        Region {
            start,
            end,
            nr_accesses,
            age,
        }
    }

    #[test]
    #[allow(clippy::single_range_in_vec_init)] // lists of address ranges, of one here
    fn regions_accessed_lately_or_changed_within_the_window_count_as_accessed() {
        let regions = [
            region(0x3000, 0x4000, 0, 100), // idle for 20 s
            region(0x1000, 0x2000, 5, 100), // accessed now
            region(0x2000, 0x3000, 0, 10),  // idle for 2 s: accessed within 5 s
            region(0x5000, 0x6000, 0, 25),  // idle for exactly 5 s: not
            region(0x7000, 0x7000, 3, 0),   // empty
        ];
        let within = |s| accessed_within(&regions, AGGR, Duration::from_secs(s));
        // Joined with the region accessed now.
        assert_eq!(within(5), [0x1000..0x3000]);
        // Over a second only the region accessed now.
        assert_eq!(within(1), [0x1000..0x2000]);
        assert_eq!(accessed_within(&[], AGGR, Duration::from_secs(1)), []);
    }

    /// A DAMON sysfs tree as the kernel shows it with `n` kdamonds, in a temporary
    /// directory.
    fn tree(n: usize) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        fake_kdamonds(dir.path(), n);
        std::fs::write(dir.path().join("kdamonds/nr_kdamonds"), format!("{n}\n")).unwrap();
        dir
    }

    /// Under `admin`, the directories of `n` kdamonds (one context, target and scheme
    /// each) as the kernel makes them, `nr_kdamonds` 0: as if memtide's write made them.
    pub(crate) fn fake_kdamonds(admin: &Path, n: usize) {
        let k = admin.join("kdamonds");
        std::fs::create_dir_all(&k).unwrap();
        std::fs::write(k.join("nr_kdamonds"), "0\n").unwrap();
        for i in 0..n {
            let d = k.join(i.to_string());
            let ctx = d.join("contexts/0");
            let scheme = ctx.join("schemes/0");
            for sub in [
                "monitoring_attrs/intervals",
                "monitoring_attrs/nr_regions",
                "targets/0",
                "schemes/0/access_pattern/sz",
                "schemes/0/access_pattern/nr_accesses",
                "schemes/0/access_pattern/age",
                "schemes/0/tried_regions",
            ] {
                std::fs::create_dir_all(ctx.join(sub)).unwrap();
            }
            let mut files = vec![
                d.join("state"),
                d.join("contexts/nr_contexts"),
                ctx.join("operations"),
                ctx.join("targets/nr_targets"),
                ctx.join("targets/0/pid_target"),
                ctx.join("schemes/nr_schemes"),
                scheme.join("action"),
            ];
            for f in ["sample_us", "aggr_us", "update_us"] {
                files.push(ctx.join("monitoring_attrs/intervals").join(f));
            }
            for f in ["min", "max"] {
                files.push(ctx.join("monitoring_attrs/nr_regions").join(f));
                for p in ["sz", "nr_accesses", "age"] {
                    files.push(scheme.join("access_pattern").join(p).join(f));
                }
            }
            for f in files {
                std::fs::write(f, "0\n").unwrap();
            }
            std::fs::write(d.join("state"), "off\n").unwrap();
            std::fs::write(d.join("pid"), "-1\n").unwrap();
            std::fs::write(scheme.join("tried_regions/total_bytes"), "0\n").unwrap();
        }
    }

    fn read(path: PathBuf) -> String {
        std::fs::read_to_string(path).unwrap()
    }

    #[test]
    fn a_monitor_sets_its_kdamond_up_on_the_process_and_reads_its_regions() {
        // nr_kdamonds 0 at first: the tree's kdamond 0 stands for the one the kernel
        // makes when memtide writes 1.
        let t = tree(1);
        std::fs::write(t.path().join("kdamonds/nr_kdamonds"), "0\n").unwrap();
        let monitor = Monitor::start(t.path(), 4242).unwrap();
        let k = t.path().join("kdamonds");
        assert_eq!(read(k.join("nr_kdamonds")), "1");
        let ctx = k.join("0/contexts/0");
        assert_eq!(read(ctx.join("operations")), "vaddr");
        assert_eq!(read(ctx.join("targets/0/pid_target")), "4242");
        assert_eq!(
            read(ctx.join("monitoring_attrs/intervals/aggr_us")),
            "200000"
        );
        assert_eq!(read(ctx.join("schemes/0/action")), "stat");
        let pattern = ctx.join("schemes/0/access_pattern");
        assert_eq!(read(pattern.join("age/max")), u32::MAX.to_string());
        assert_eq!(read(pattern.join("sz/max")), u64::MAX.to_string());
        assert_eq!(read(k.join("0/state")), "on");

        // The kernel's answer to update_schemes_tried_regions.
        let tried = ctx.join("schemes/0/tried_regions");
        for (i, (start, end, n, age)) in [(4096, 8192, 3, 1), (8192, 65536, 0, 40)]
            .into_iter()
            .enumerate()
        {
            let r = tried.join(i.to_string());
            std::fs::create_dir(&r).unwrap();
            for (f, v) in [
                ("start", start),
                ("end", end),
                ("nr_accesses", n),
                ("age", age),
            ] {
                std::fs::write(r.join(f), format!("{v}\n")).unwrap();
            }
        }
        let mut regions = monitor.regions().unwrap().list;
        regions.sort_by_key(|r| r.start);
        assert_eq!(
            regions,
            [region(4096, 8192, 3, 1), region(8192, 65536, 0, 40)]
        );
        assert_eq!(read(k.join("0/state")), "update_schemes_tried_regions");

        // A region file that is not a number: said, with the file.
        std::fs::write(tried.join("1/age"), "many\n").unwrap();
        let e = monitor.regions().unwrap_err().to_string();
        assert!(
            e.contains("tried_regions/1/age: not a number: \"many\""),
            "{e}"
        );

        // Dropped: off, and DAMON left as found.
        drop(monitor);
        assert_eq!(read(k.join("0/state")), "off");
        assert_eq!(read(k.join("nr_kdamonds")), "0");
    }

    /// A start under `admin`, where one kdamond is there and none is memtide's: refused.
    fn refused_beside_one_not_ours(admin: &Path) {
        let e = Monitor::start(admin, 7).unwrap_err();
        assert!(
            matches!(
                e,
                DamonError::InUse {
                    found: 1,
                    ours: 0,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("another tool uses DAMON"), "{e}");
    }

    #[test]
    fn kdamonds_memtide_did_not_start_are_never_touched() {
        let t = tree(1);
        std::fs::write(t.path().join("kdamonds/0/state"), "on\n").unwrap();
        refused_beside_one_not_ours(t.path());
        let k = t.path().join("kdamonds");
        assert_eq!(read(k.join("nr_kdamonds")), "1\n");
        assert_eq!(read(k.join("0/state")), "on\n");
        assert_eq!(read(k.join("0/contexts/0/targets/0/pid_target")), "0\n");
    }

    #[test]
    fn a_kdamond_another_tool_set_up_again_is_no_longer_written_to() {
        let t = tree(1);
        let k = t.path().join("kdamonds");
        std::fs::write(k.join("nr_kdamonds"), "0\n").unwrap();
        let monitor = Monitor::start(t.path(), 100).unwrap();
        // While memtide's kdamond was off (its process gone), another tool rebuilt the
        // directory for a process of its own and started it.
        let target = k.join("0/contexts/0/targets/0/pid_target");
        std::fs::write(&target, "555\n").unwrap();
        std::fs::write(k.join("0/state"), "on\n").unwrap();
        let e = monitor.regions().unwrap_err();
        assert!(matches!(e, DamonError::InUse { .. }), "{e}");
        drop(monitor);
        assert_eq!(read(k.join("0/state")), "on\n", "not turned off");
        assert_eq!(read(k.join("nr_kdamonds")), "1", "not removed");
        assert_eq!(read(target), "555\n");
        // Nor is it taken for memtide's at the next start.
        refused_beside_one_not_ours(t.path());
    }

    #[test]
    fn a_second_process_restarts_memtides_kdamonds_and_a_freed_one_is_reused() {
        let t = tree(2);
        let k = t.path().join("kdamonds");
        std::fs::write(k.join("nr_kdamonds"), "0\n").unwrap();
        let first = Monitor::start(t.path(), 100).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let second = Monitor::start(t.path(), 200).unwrap();
        assert_eq!(read(k.join("nr_kdamonds")), "2");
        // Rebuilt, the first is set up again on its own process.
        assert_eq!(read(k.join("0/contexts/0/targets/0/pid_target")), "100");
        assert_eq!(read(k.join("1/contexts/0/targets/0/pid_target")), "200");
        assert_eq!(read(k.join("0/state")), "on");
        // Restarted, its regions are no older than now.
        assert!(first.regions().unwrap().ran < Duration::from_millis(300));
        drop(first);
        assert_eq!(read(k.join("0/state")), "off");
        assert_eq!(read(k.join("nr_kdamonds")), "2", "kdamond 1 still runs");
        let third = Monitor::start(t.path(), 300).unwrap();
        assert_eq!(read(k.join("0/contexts/0/targets/0/pid_target")), "300");
        assert_eq!(read(k.join("nr_kdamonds")), "2");
        drop(second);
        drop(third);
        assert_eq!(read(k.join("nr_kdamonds")), "0");
    }

    /// The pid of a process that has ended.
    fn ended_pid() -> i32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        child.wait().unwrap();
        child.id() as i32
    }

    /// A record under `admin` by `owner`, written in this boot, of these directories.
    fn record(admin: &Path, owner: (i32, u64), dirs: &[(i32, Option<u32>)], growing: bool) {
        let r = Record {
            boot: boot_id().unwrap(),
            owner,
            dirs: dirs.to_vec(),
            growing,
        };
        std::fs::write(record_path(admin), serde_json::to_vec(&r).unwrap()).unwrap();
    }

    /// Kdamond `i` under `admin` set up as memtide sets it up on process `pid`, and on,
    /// its kernel thread `kthread`.
    fn running_on(admin: &Path, i: usize, pid: i32, kthread: u32) {
        let d = admin.join("kdamonds").join(i.to_string());
        std::fs::write(d.join("contexts/0/operations"), "vaddr\n").unwrap();
        let target = d.join("contexts/0/targets/0/pid_target");
        std::fs::write(target, format!("{pid}\n")).unwrap();
        std::fs::write(d.join("state"), "on\n").unwrap();
        std::fs::write(d.join("pid"), format!("{kthread}\n")).unwrap();
    }

    #[test]
    fn kdamonds_a_killed_memtide_left_running_are_taken_back_by_the_next() {
        // As a memtide killed while it tracked one process left them: kdamond 0 on,
        // kdamond 1 free; and as one killed while it grew the count (the kernel had).
        // Its pid may name another process since (started later).
        let me = this_process().unwrap();
        for (owner, dirs, growing) in [
            ((ended_pid(), 1), vec![(4242, Some(321)), (0, None)], false),
            ((me.0, me.1 + 1), vec![(4242, Some(321)), (0, None)], false),
            (
                (ended_pid(), 1),
                vec![(4242, Some(321)), (0, None), (0, None)],
                true,
            ),
        ] {
            let t = tree(2);
            running_on(t.path(), 0, 4242, 321);
            record(t.path(), owner, &dirs, growing);
            let monitor = Monitor::start(t.path(), 77).unwrap();
            // Stopped and removed, then made again for this process (a fake tree keeps
            // its directories where the kernel would make them anew).
            let k = t.path().join("kdamonds");
            assert_eq!(read(k.join("nr_kdamonds")), "1");
            assert_eq!(read(k.join("0/contexts/0/targets/0/pid_target")), "77");
            assert_eq!(read(k.join("0/state")), "on");
            assert_eq!(read(k.join("1/state")), "off\n");
            let recorded = read_record(&record_path(t.path())).unwrap();
            assert_eq!(recorded.owner, me);
            assert_eq!(recorded.dirs.iter().map(|d| d.0).collect::<Vec<_>>(), [77]);
            drop(monitor);
            assert_eq!(read(k.join("nr_kdamonds")), "0");
            assert!(
                !record_path(t.path()).exists(),
                "the record goes with the last kdamond"
            );
        }
    }

    #[test]
    fn kdamonds_are_taken_back_only_as_a_memtide_that_has_ended_recorded_them() {
        for case in [
            "its process runs",
            "another boot",
            "another count",
            "another kernel thread",
            "rebuilt",
            "another on",
            "none",
        ] {
            let t = tree(2);
            running_on(t.path(), 0, 4242, 321);
            let owner = match case {
                "its process runs" => this_process().unwrap(),
                _ => (ended_pid(), 1),
            };
            let mut dirs = vec![(4242, Some(321)), (0, None)];
            match case {
                "another count" => dirs.truncate(1),
                // Another tool started a kdamond on the same process since.
                "another kernel thread" => running_on(t.path(), 0, 4242, 654),
                "rebuilt" => running_on(t.path(), 0, 555, 321),
                "another on" => running_on(t.path(), 1, 999, 987),
                _ => {}
            }
            match case {
                "none" => {}
                _ => record(t.path(), owner, &dirs, false),
            }
            if case == "another boot" {
                let mut r = read_record(&record_path(t.path())).unwrap();
                r.boot = "an earlier boot".into();
                std::fs::write(record_path(t.path()), serde_json::to_vec(&r).unwrap()).unwrap();
            }
            let e = Monitor::start(t.path(), 77).unwrap_err();
            assert!(
                matches!(
                    e,
                    DamonError::InUse {
                        found: 2,
                        ours: 0,
                        ..
                    }
                ),
                "{case}: {e}"
            );
            let k = t.path().join("kdamonds");
            assert_eq!(read(k.join("nr_kdamonds")), "2\n", "{case}");
            assert_eq!(read(k.join("0/state")), "on\n", "{case}");
            let second = if case == "another on" {
                "on\n"
            } else {
                "off\n"
            };
            assert_eq!(read(k.join("1/state")), second, "{case}");
            // Another process's record is left as it was.
            assert_eq!(record_path(t.path()).exists(), case != "none", "{case}");
        }
    }

    #[test]
    fn a_kernel_without_damon_is_said_to_lack_it() {
        let t = tempfile::tempdir().unwrap();
        let e = Monitor::start(t.path(), 1).unwrap_err();
        assert!(matches!(e, DamonError::Unsupported(_)), "{e}");
        assert!(e.to_string().contains("CONFIG_DAMON_SYSFS"), "{e}");
    }
}
