//! Parsers for the /proc files memtide reads. Each takes the file's text, so it can be
//! tested on captured files and fuzzed; reading happens in [`crate::host`] and, for a
//! hypervisor process's memory, [`ProcessRss`].

use memtide_core::stats::{MemInfo, Psi, PsiLine, VmStat};
use memtide_core::{Bytes, FixedMemory};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A file that could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {message}")]
pub struct ParseError {
    /// Which file (its usual name, e.g. `meminfo`).
    pub file: &'static str,
    /// What was wrong.
    pub message: String,
}

impl ParseError {
    pub(crate) fn new(file: &'static str, message: impl Into<String>) -> Self {
        ParseError {
            file,
            message: message.into(),
        }
    }
}

/// `name value` pairs, one per line (vmstat, cgroup memory.stat, KSM-style files).
pub fn key_values(text: &str) -> HashMap<&str, u64> {
    text.lines()
        .filter_map(|line| {
            let mut it = line.split_whitespace();
            Some((it.next()?, it.next()?.parse().ok()?))
        })
        .collect()
}

/// The processes under `proc` (a procfs mount) whose name (`comm`) `wanted` accepts, as
/// (pid, name, the process's directory), by pid. A process that ends during the scan, or
/// whose files cannot be read, is passed over.
pub fn processes(proc: &Path, wanted: impl Fn(&str) -> bool) -> Vec<(u32, String, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(proc) else {
        return Vec::new();
    };
    let mut found: Vec<(u32, String, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
            let name = comm.trim_end();
            wanted(name).then(|| (pid, name.to_string(), e.path()))
        })
        .collect();
    found.sort_by_key(|(pid, ..)| *pid);
    found
}

/// The QEMU processes under `proc` (their name starting `qemu`: `qemu-system-x86`,
/// `qemu-kvm`) by the argument that follows `flag` on their command line, as libvirt
/// starts each domain's QEMU with `-uuid UUID`. A value two processes claim is left out
/// (a process made to look like a domain's QEMU then hides it rather than stands in for
/// it).
pub fn qemus_by_argument(proc: &Path, flag: &str) -> HashMap<String, u32> {
    let mut found: HashMap<String, Option<u32>> = HashMap::new();
    for (pid, _, dir) in processes(proc, |name| name.starts_with("qemu")) {
        let Ok(cmdline) = std::fs::read(dir.join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let values = args.windows(2).filter(|w| w[0] == flag.as_bytes());
        for value in values.filter_map(|w| std::str::from_utf8(w[1]).ok()) {
            found
                .entry(value.to_string())
                .and_modify(|p| *p = None)
                .or_insert(Some(pid));
        }
    }
    found
        .into_iter()
        .filter_map(|(value, pid)| Some((value, pid?)))
        .collect()
}

/// What the ZFS ARC would give back under memory pressure, from
/// `/proc/spl/kstat/zfs/arcstats` (`name type data` lines after a two-line header): its
/// size above its floor `c_min`. The ARC is kernel memory that /proc/meminfo counts as
/// neither free nor cache, yet the ARC shrinks to its floor when memory runs short.
/// `None` when either figure is missing.
pub fn zfs_arc_reclaimable(text: &str) -> Option<Bytes> {
    let figure = |name: &str| {
        text.lines().find_map(|line| {
            let mut it = line.split_whitespace();
            (it.next()? == name).then_some(())?;
            it.nth(1)?.parse::<u64>().ok()
        })
    };
    Some(Bytes(figure("size")?.saturating_sub(figure("c_min")?)))
}

/// The swap devices in /proc/swaps that are zram (compressed RAM, not disk: a device
/// named `zramN`, under whatever /dev the reader sees), each as its number and free space,
/// from its `Filename Type Size Used Priority` lines (sizes in KiB, after a header line).
pub fn zram_swaps(text: &str) -> Vec<(u32, Bytes)> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let name = f.next()?.rsplit('/').next()?;
            let device = name.strip_prefix("zram")?.parse::<u32>().ok()?;
            let size: u64 = f.nth(1)?.parse().ok()?;
            let used: u64 = f.next()?.parse().ok()?;
            Some((device, Bytes::from_kib(size.saturating_sub(used))))
        })
        .collect()
}

/// The free space of the zram swap devices in /proc/swaps ([`zram_swaps`]). Swapping to
/// them takes memory, so it is no room beyond it.
pub fn swaps_free_in_ram(text: &str) -> Bytes {
    zram_swaps(text).into_iter().map(|(_, free)| free).sum()
}

/// What a zram device stores and the memory it takes for it, from its
/// /sys/block/zramN/mm_stat (`orig_data_size compr_data_size mem_used_total ...`, bytes).
pub fn zram_mm_stat(text: &str) -> Option<(Bytes, Bytes)> {
    let mut f = text.split_whitespace().map(|w| w.parse::<u64>().ok());
    let stored = f.next()??;
    let used = f.nth(1)??;
    Some((Bytes(stored), Bytes(used)))
}

/// The sum of every zone's high watermark from /proc/zoneinfo, in pages (each zone's
/// `        high     N` line; the per-CPU pagesets' `high:` lines are other figures).
/// Below a zone's low watermark kswapd wakes and reclaims until it is above its high one,
/// so free memory down to their sum is memory the host keeps free. `None` when no zone
/// has the line.
pub fn zoneinfo_high_pages(text: &str) -> Option<u64> {
    let highs = text.lines().filter_map(|line| {
        let mut it = line.split_whitespace();
        (it.next()? == "high").then_some(())?;
        it.next()?.parse::<u64>().ok()
    });
    highs.fold(None, |sum, high| Some(sum.unwrap_or(0) + high))
}

/// [`zoneinfo_high_pages`] of node `node`'s zones only (those after a `Node N, zone`
/// line naming it).
pub fn zoneinfo_high_pages_on(text: &str, node: i32) -> Option<u64> {
    let mut ours = false;
    let mut zones = String::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("Node ") {
            ours = rest.split(',').next().and_then(|n| n.trim().parse().ok()) == Some(node);
        } else if ours {
            zones.push_str(line);
            zones.push('\n');
        }
    }
    zoneinfo_high_pages(&zones)
}

/// The kernel's page size, the unit of /proc/zoneinfo, statm and pagemap.
pub fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096)
}

/// Parse /proc/meminfo (`Name:   value kB` lines).
pub fn meminfo(text: &str) -> Result<MemInfo, ParseError> {
    let mut fields = HashMap::new();
    for line in text.lines() {
        let Some((name, rest)) = line.split_once(':') else {
            continue;
        };
        let mut it = rest.split_whitespace();
        let (Some(value), unit) = (it.next(), it.next()) else {
            continue;
        };
        let value: u64 = value.parse().map_err(|_| {
            ParseError::new("meminfo", format!("{name}: {value:?} is not a number"))
        })?;
        let bytes = match unit {
            Some("kB") => Bytes::from_kib(value),
            None => Bytes(value),
            Some(u) => {
                return Err(ParseError::new(
                    "meminfo",
                    format!("{name}: unknown unit {u:?}"),
                ))
            }
        };
        fields.insert(name.trim(), bytes);
    }
    let need = |name: &str| {
        fields
            .get(name)
            .copied()
            .ok_or_else(|| ParseError::new("meminfo", format!("no {name} line")))
    };
    Ok(MemInfo {
        total: need("MemTotal")?,
        free: need("MemFree")?,
        available: fields.get("MemAvailable").copied(),
        buffers: need("Buffers")?,
        cached: need("Cached")?,
        swap_total: fields.get("SwapTotal").copied().unwrap_or_default(),
        swap_free: fields.get("SwapFree").copied().unwrap_or_default(),
        anon_pages: fields.get("AnonPages").copied(),
        committed_as: fields.get("Committed_AS").copied(),
        active_anon: fields.get("Active(anon)").copied(),
        inactive_anon: fields.get("Inactive(anon)").copied(),
        active_file: fields.get("Active(file)").copied(),
        inactive_file: fields.get("Inactive(file)").copied(),
        shmem: fields.get("Shmem").copied(),
        slab_unreclaimable: fields.get("SUnreclaim").copied(),
        slab_reclaimable: fields.get("SReclaimable").copied(),
    })
}

/// Parse /proc/vmstat. Counters a kernel lacks stay `None`.
pub fn vmstat(text: &str) -> VmStat {
    let kv = key_values(text);
    let get = |k: &str| kv.get(k).copied();
    let allocstall = kv
        .iter()
        .filter(|(k, _)| k.starts_with("allocstall"))
        .map(|(_, v)| *v)
        .reduce(u64::saturating_add);
    VmStat {
        pswpin: get("pswpin"),
        pswpout: get("pswpout"),
        pgmajfault: get("pgmajfault"),
        pgfault: get("pgfault"),
        workingset_refault_anon: get("workingset_refault_anon"),
        workingset_refault_file: get("workingset_refault_file"),
        oom_kill: get("oom_kill"),
        allocstall,
    }
}

fn psi_line(line: &str) -> Result<PsiLine, ParseError> {
    let mut out = PsiLine::default();
    for field in line.split_whitespace().skip(1) {
        let (k, v) = field
            .split_once('=')
            .ok_or_else(|| ParseError::new("pressure", format!("bad field {field:?}")))?;
        let bad = || ParseError::new("pressure", format!("{k}: {v:?} is not a number"));
        // A share of time: Rust parses "NaN" and "inf" too, which no kernel writes
        // (#18 defect 9: a guest agent's PSI reached the engine as NaN).
        let share = || match v.parse::<f64>() {
            Ok(p) if (0.0..=100.0).contains(&p) => Ok(p),
            _ => Err(ParseError::new(
                "pressure",
                format!("{k}: {v:?} is not a share from 0 to 100"),
            )),
        };
        match k {
            "avg10" => out.avg10 = share()?,
            "avg60" => out.avg60 = share()?,
            "avg300" => out.avg300 = share()?,
            "total" => out.total_us = v.parse().map_err(|_| bad())?,
            _ => {}
        }
    }
    Ok(out)
}

/// Parse a PSI file (/proc/pressure/memory or a cgroup v2 memory.pressure).
pub fn psi(text: &str) -> Result<Psi, ParseError> {
    let mut some = None;
    let mut full = None;
    for line in text.lines() {
        match line.split_whitespace().next() {
            Some("some") => some = Some(psi_line(line)?),
            Some("full") => full = Some(psi_line(line)?),
            _ => {}
        }
    }
    let some = some.ok_or_else(|| ParseError::new("pressure", "no \"some\" line"))?;
    Ok(Psi { some, full })
}

/// Resident set size from /proc/PID/statm (its second field, in pages of `page` bytes):
/// the figure /proc/PID/status shows as `VmRSS`, which the kernel produces at a fraction
/// of status's cost (no signal masks, CPU lists or capabilities to format).
pub fn statm_rss(text: &str, page: Bytes) -> Option<Bytes> {
    let pages: u64 = text.split_whitespace().nth(1)?.parse().ok()?;
    Some(Bytes(pages.checked_mul(page.0)?))
}

/// Memory a balloon cannot give back, from a /proc/PID/status text: locked or pinned
/// (`VmLck`, `VmPin`: the larger, as VFIO accounts its pinning in one or the other
/// depending on the kernel) and hugetlbfs pages (`HugetlbPages`, since Linux 4.4).
/// `None` when the text has none of these fields (not a process's status).
pub fn status_fixed(text: &str) -> Option<FixedMemory> {
    let (mut locked, mut hugetlb, mut found) = (Bytes::ZERO, Bytes::ZERO, false);
    for line in text.lines() {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let kib = || {
            let mut words = value.split_whitespace();
            let n = words.next()?.parse::<u64>().ok()?;
            (words.next() == Some("kB")).then(|| Bytes::from_kib(n))
        };
        match name {
            "VmLck" | "VmPin" => {
                locked = locked.max(kib()?);
                found = true;
            }
            "HugetlbPages" => {
                hugetlb = kib()?;
                found = true;
            }
            _ => {}
        }
    }
    found.then_some(FixedMemory {
        locked,
        hugetlb,
        own: None,
    })
}

/// Its memory the host swapped out, from a /proc/PID/status text (`VmSwap`).
pub fn status_swap(text: &str) -> Option<Bytes> {
    let value = text.lines().find_map(|l| l.strip_prefix("VmSwap:"))?;
    let mut words = value.split_whitespace();
    let kib = words.next()?.parse::<u64>().ok()?;
    (words.next() == Some("kB")).then(|| Bytes::from_kib(kib))
}

/// How many reads of a process's RSS between two reads of its status: its fixed memory
/// (locked, pinned and huge-page memory change only when the hypervisor's backends or
/// devices do) and the memory the host swapped out of it. Status is read sooner when the
/// RSS moved by more than [`STATUS_MOVE`] of itself since: what the host swaps out or in
/// moves it, and the policy counts swapped memory as memory the guest touched, which a
/// stale figure would count twice or not at all (found in review).
const STATUS_EVERY: u32 = 60;

/// The share of its RSS a process's RSS may move by before its status is read again.
const STATUS_MOVE: f64 = 1.0 / 64.0;

/// A process's resident set size, read from /proc/PID/statm when asked. The file stays
/// open: each read is one `pread` (where reading it by path took five system calls and a
/// lookup of the process, 8% of the daemon's CPU at 500 VMs), and a process that ends
/// reads as gone even if its pid is reused. Its fixed memory ([`status_fixed`]) is read
/// from /proc/PID/status now and then.
#[derive(Debug)]
pub struct ProcessRss {
    statm: Option<std::fs::File>,
    stat: Option<std::fs::File>,
    page: Bytes,
    /// Clock ticks per second, the unit of /proc/PID/stat's CPU times.
    ticks: f64,
    status: PathBuf,
    /// What its status last said, and when.
    status_read: StatusRead,
}

/// What a hypervisor's /proc/PID/status says that a balloon cannot move: its fixed memory
/// and the memory the host swapped out of it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProcessStatus {
    /// Its locked, pinned and huge-page memory ([`status_fixed`]); `None` when unreadable.
    pub fixed: Option<FixedMemory>,
    /// Its memory the host swapped out ([`status_swap`]); `None` when unreadable.
    pub swapped: Option<Bytes>,
}

/// The status last read, the RSS then, and the reads of the RSS left before the next.
#[derive(Debug, Default)]
struct StatusRead {
    status: ProcessStatus,
    rss: Option<Bytes>,
    left: u32,
}

impl ProcessRss {
    /// The process `pid` under the procfs mount `proc`.
    pub fn new(proc: &Path, pid: i32) -> ProcessRss {
        // SAFETY: sysconf has no preconditions.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        let dir = proc.join(pid.to_string());
        ProcessRss {
            statm: std::fs::File::open(dir.join("statm")).ok(),
            stat: std::fs::File::open(dir.join("stat")).ok(),
            page: Bytes(page_size()),
            ticks: if ticks > 0 { ticks as f64 } else { 100.0 },
            status: dir.join("status"),
            status_read: StatusRead::default(),
        }
    }

    /// Its status, given its RSS just read ([`Self::read`]): read on the first call,
    /// every [`STATUS_EVERY`] calls after, and whenever the RSS moved ([`STATUS_MOVE`]);
    /// the last figures otherwise.
    pub fn status(&mut self, rss: Option<Bytes>) -> ProcessStatus {
        let last = &mut self.status_read;
        let moved = match (last.rss, rss) {
            (Some(then), Some(now)) => now.abs_diff(then) > then.scale(STATUS_MOVE),
            _ => false,
        };
        if last.left == 0 || moved {
            let text = std::fs::read_to_string(&self.status).ok();
            last.status = ProcessStatus {
                fixed: text.as_deref().and_then(status_fixed),
                swapped: text.as_deref().and_then(status_swap),
            };
            last.rss = rss;
            last.left = STATUS_EVERY;
        }
        last.left -= 1;
        last.status
    }

    /// Its resident set size now; `None` when the file is unreadable (the process ended).
    pub fn read(&self) -> Option<Bytes> {
        use std::os::unix::fs::FileExt;
        // Seven numbers of at most 20 digits.
        let mut buf = [0; 160];
        let n = self.statm.as_ref()?.read_at(&mut buf, 0).ok()?;
        statm_rss(std::str::from_utf8(&buf[..n]).ok()?, self.page)
    }

    /// The CPU time it has used (user and system), in seconds; `None` when unreadable.
    pub fn cpu_s(&self) -> Option<f64> {
        use std::os::unix::fs::FileExt;
        // 52 fields, the command name at most 16 bytes (TASK_COMM_LEN) in parentheses,
        // and any bytes at all: read as text whatever they are.
        let mut buf = [0; 1024];
        let n = self.stat.as_ref()?.read_at(&mut buf, 0).ok()?;
        stat_cpu_s(&String::from_utf8_lossy(&buf[..n]), self.ticks)
    }
}

/// How often a hypervisor's own memory is read again: it changes as its heap and
/// translation cache do, slowly.
const OWN_EVERY: Duration = Duration::from_secs(60);

/// A hypervisor's own resident memory beside its guest RAM ([`FixedMemory::own`]), read
/// from /proc/PID/smaps once a minute off the async runtime and never waited for (the
/// read walks the process's page tables, 27 ms per GiB of 4 KiB pages resident: seconds
/// for a large guest); the first is put off by the pid's share of a minute, so that VMs
/// found together are not read together.
/// A process whose smaps does not show its guest RAM as one mapping of each size given
/// (the base memory's, each memory device's backend) is not read again.
#[derive(Debug)]
pub struct OwnMemory {
    smaps: PathBuf,
    guest_ram: Vec<Bytes>,
    next: Option<Instant>,
    last: Option<Bytes>,
    /// The read under way.
    reading: Option<tokio::task::JoinHandle<Option<Bytes>>>,
}

impl OwnMemory {
    /// The process `pid` under `proc`, its guest RAM one private mapping of each size in
    /// `guest_ram`.
    pub fn new(proc: &Path, pid: i32, guest_ram: Vec<Bytes>) -> OwnMemory {
        let stagger = OWN_EVERY.mul_f64(f64::from(pid.unsigned_abs() % 60) / 60.0);
        OwnMemory {
            smaps: proc.join(pid.to_string()).join("smaps"),
            guest_ram,
            next: Some(Instant::now() + stagger),
            last: None,
            reading: None,
        }
    }

    /// Its own memory as last read: a read that has ended is taken, and one started (on a
    /// blocking thread) when due, its figure for a later sample.
    pub async fn sample(&mut self) -> Option<Bytes> {
        if let Some(read) = self.reading.take_if(|r| r.is_finished()) {
            self.store(read.await.ok().flatten());
        }
        if self.reading.is_none() && self.next.is_some_and(|next| Instant::now() >= next) {
            let (smaps, ram) = (self.smaps.clone(), self.guest_ram.clone());
            self.reading = Some(tokio::task::spawn_blocking(move || read_own(&smaps, &ram)));
        }
        self.last
    }

    /// Its guest RAM, changed (a memory device plugged): the reads under way or made of
    /// the old mappings are dropped, and the next read is due now.
    pub fn set_guest_ram(&mut self, guest_ram: Vec<Bytes>) {
        if guest_ram != self.guest_ram {
            self.guest_ram = guest_ram;
            self.reading = None;
            self.last = None;
            self.next = Some(Instant::now());
        }
    }

    fn store(&mut self, read: Option<Bytes>) {
        self.last = read;
        self.next = read.map(|_| Instant::now() + OWN_EVERY);
    }
}

/// [`smaps_own`] of the smaps file at `path`; `None` when it cannot be read.
fn read_own(path: &Path, guest_ram: &[Bytes]) -> Option<Bytes> {
    smaps_own(&std::fs::read_to_string(path).ok()?, guest_ram)
}

/// User plus system CPU time in /proc/PID/stat (fields 14 and 15, in clock ticks of
/// `ticks` per second), in seconds. The command name (field 2, in parentheses) may hold
/// spaces and parentheses: fields are counted after its last `)`.
pub fn stat_cpu_s(text: &str, ticks: f64) -> Option<f64> {
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime as f64 + stime as f64) / ticks)
}

/// A process id from a socket's peer credentials, if it names a process: a peer in
/// another pid namespace has pid 0 (and `waitpid(0)`, `kill(0)` mean this process's
/// whole group), so it is unknown, as is a negative one.
pub fn known_pid(pid: i32) -> Option<i32> {
    (pid > 0).then_some(pid)
}

/// Whether process `pid` runs: its /proc entry exists and it is not a zombie (a process
/// that exited and waits for its parent to reap it). One that is this process's own child
/// (a QEMU a restore started) is reaped if it has ended; pid 0 (or one beyond `i32`) is
/// no process, and reaps nothing.
pub fn process_runs(proc: &Path, pid: u32) -> bool {
    let Some(pid) = i32::try_from(pid).ok().filter(|p| *p > 0) else {
        return false;
    };
    // SAFETY: waitpid(2) without a status pointer; ECHILD for another's process.
    unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
    std::fs::read_to_string(proc.join(pid.to_string()).join("stat"))
        .ok()
        .and_then(|text| Some(stat_state(&text)? != 'Z'))
        .unwrap_or(false)
}

/// Whether process `pid` runs ([`process_runs`]) and is the one started `started` clock
/// ticks after boot ([`start_time`]), where that is known: a process that took the pid
/// since is not it.
pub fn process_runs_as(proc: &Path, pid: u32, started: Option<u64>) -> bool {
    process_runs(proc, pid)
        && started
            .is_none_or(|s| i32::try_from(pid).is_ok_and(|pid| start_time(proc, pid) == Some(s)))
}

/// The state letter in /proc/PID/stat (field 3, after the command name's last `)`).
fn stat_state(text: &str) -> Option<char> {
    text[text.rfind(')')? + 1..].trim_start().chars().next()
}

/// Process `pid`'s start time, in clock ticks after boot (`/proc/PID/stat` field 22):
/// with the pid, it names one process. `None` when there is no such process, or a
/// zombie.
pub fn start_time(proc: &Path, pid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(proc.join(format!("{pid}/stat"))).ok()?;
    if stat_state(&text)? == 'Z' {
        return None;
    }
    // Field 3 (the state) is the first after the command: field 22 is the 20th.
    text[text.rfind(')')? + 1..]
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

/// One mapping in /proc/PID/maps: its addresses, its permissions (`rw-p`: private and
/// writable) and its path (`None` for anonymous memory; `[heap]`, `[stack]` are paths).
#[derive(Debug, PartialEq, Eq)]
pub struct Mapping<'a> {
    /// Its addresses.
    pub range: std::ops::Range<u64>,
    /// Its permissions.
    pub perms: &'a str,
    /// Its path, or what stands for one.
    pub path: Option<&'a str>,
}

/// The mappings of /proc/PID/maps text; lines that do not parse, and empty ranges, left
/// out.
pub fn maps(text: &str) -> impl Iterator<Item = Mapping<'_>> {
    text.lines().filter_map(|line| {
        // Five fields a space apart, then the path after padding.
        let mut fields = line.splitn(6, ' ');
        let (range, perms) = (fields.next()?, fields.next()?);
        let path = fields.nth(3).map(str::trim).filter(|p| !p.is_empty());
        let (start, end) = range.split_once('-')?;
        let range = u64::from_str_radix(start, 16).ok()?..u64::from_str_radix(end, 16).ok()?;
        (range.start < range.end).then_some(Mapping { range, perms, path })
    })
}

/// Whether a mapping of `len` is guest RAM of one of `sizes`: of that size to 2 MiB of
/// alignment (QEMU rounds a RAM block's mapping up to its alignment).
pub(crate) fn guest_ram_sized(len: Bytes, sizes: &[Bytes]) -> bool {
    sizes
        .iter()
        .any(|&size| (size..=size + Bytes::from_mib(2)).contains(&len))
}

/// Each field of each mapping in /proc/PID/smaps text, in kB, with whether its mapping
/// is guest RAM of one of `sizes`: private writable (`rw-p`) and of that size to 2 MiB
/// of alignment. A mapping's `Size:` comes first among its fields.
fn smaps_fields<'a>(
    text: &'a str,
    sizes: &'a [Bytes],
) -> impl Iterator<Item = (bool, &'a str, u64)> + 'a {
    let (mut private, mut ram) = (false, false);
    text.lines().filter_map(move |line| {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or("");
        if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            (private, ram) = (words.next() == Some("rw-p"), false);
            return None;
        }
        let value = words.next().and_then(|v| v.parse::<u64>().ok())?;
        if first == "Size:" {
            ram = private && guest_ram_sized(Bytes::from_kib(value), sizes);
        }
        Some((ram, first, value))
    })
}

/// Referenced memory in the private writable mappings of each size in `guest_ram` (to
/// 2 MiB of alignment) in /proc/PID/smaps: for QEMU, the guest's RAM, its base memory's
/// and each memory device's backend. `None` when there is no such mapping.
pub fn smaps_referenced(text: &str, guest_ram: &[Bytes]) -> Option<Bytes> {
    smaps_ram_field(text, guest_ram, "Referenced:")
}

/// Memory in transparent huge pages (`AnonHugePages`) in the same mappings as
/// [`smaps_referenced`]: the guest RAM's. `None` when there is no such mapping.
pub fn smaps_ram_huge(text: &str, guest_ram: &[Bytes]) -> Option<Bytes> {
    smaps_ram_field(text, guest_ram, "AnonHugePages:")
}

/// A field summed over the private writable mappings of the sizes in `guest_ram`.
fn smaps_ram_field(text: &str, guest_ram: &[Bytes], name: &str) -> Option<Bytes> {
    smaps_fields(text, guest_ram)
        .filter(|(ram, field, _)| *ram && *field == name)
        .map(|(.., kib)| Bytes::from_kib(kib))
        .reduce(|a, b| a + b)
}

/// The resident memory of a hypervisor whose guest RAM is a private writable mapping of
/// each size in `guest_ram` (its base memory, each memory device's backend) in
/// /proc/PID/smaps, outside those mappings: its own heap, device memory and, under TCG,
/// its translation cache. `None` unless exactly as many mappings as sizes are of those
/// sizes: with more, which are guest RAM cannot be told; with fewer, some lies elsewhere.
pub fn smaps_own(text: &str, guest_ram: &[Bytes]) -> Option<Bytes> {
    let (mut own, mut found) = (Bytes::ZERO, 0);
    for (ram, field, kib) in smaps_fields(text, guest_ram) {
        match field {
            "Size:" if ram => found += 1,
            "Rss:" if !ram => own += Bytes::from_kib(kib),
            _ => {}
        }
    }
    (found == guest_ram.len()).then_some(own)
}

#[cfg(test)]
mod tests {
    /// A QEMU's /proc/PID/maps, cut down: its binary's mappings, a shared memfd, the heap,
    /// guest RAM and a read-only anonymous mapping, the stack, and a line that is no
    /// mapping.
    const QEMU_MAPS: &str = "\
55d0c8a00000-55d0c8a21000 r--p 00000000 08:01 131                        /usr/bin/qemu-system-x86_64
55d0c8c21000-55d0c8c42000 rw-p 00221000 08:01 131                        /usr/bin/qemu-system-x86_64
55d0ca000000-55d0ca400000 rw-p 00000000 00:00 0                          [heap]
7f2a40000000-7f2a50000000 rw-p 00000000 00:00 0 
7f2a50000000-7f2a50200000 rw-s 00000000 00:01 7                          /memfd:ram (deleted)
7f2a60000000-7f2a60200000 r--p 00000000 00:00 0
7ffd1c3de000-7ffd1c3ff000 rw-p 00000000 00:00 0                          [stack]
garbage
7f2a70000000-7f2a70000000 rw-p 00000000 00:00 0
";

    #[test]
    fn a_domains_qemu_is_the_one_process_named_qemu_with_its_uuid() {
        let proc = tempfile::tempdir().unwrap();
        let process = |pid: u32, comm: &str, args: &[&str]| {
            let dir = proc.path().join(pid.to_string());
            std::fs::create_dir(&dir).unwrap();
            std::fs::write(dir.join("comm"), format!("{comm}\n")).unwrap();
            std::fs::write(dir.join("cmdline"), args.join("\0") + "\0").unwrap();
        };
        let uuid = "5a1f2c3d-0000-4000-8000-000000000001";
        let qemu = ["/usr/bin/qemu-system-x86_64", "-name", "guest=a", "-uuid"];
        process(10, "qemu-system-x86", &[&qemu[..], &[uuid]].concat());
        // Another domain's, a shell quoting it in one argument, a process not named qemu.
        process(
            11,
            "qemu-system-x86",
            &[&qemu[..], &["5a1f-other"]].concat(),
        );
        process(12, "bash", &["bash", "-c", &format!("-uuid {uuid}")]);
        process(13, "sleep", &["sleep", "-uuid", uuid]);
        std::fs::create_dir(proc.path().join("self")).unwrap();
        let found = super::qemus_by_argument(proc.path(), "-uuid");
        assert_eq!(found.get(uuid), Some(&10));
        assert_eq!(found.get("5a1f-other"), Some(&11));
        assert_eq!(found.len(), 2, "{found:?}");
        // Two claiming one domain: neither is taken for it.
        process(14, "qemu-kvm", &["qemu-kvm", "-uuid", uuid]);
        let found = super::qemus_by_argument(proc.path(), "-uuid");
        assert_eq!(found.get(uuid), None);
        assert_eq!(found.get("5a1f-other"), Some(&11));
        assert!(super::qemus_by_argument(&proc.path().join("none"), "-uuid").is_empty());
    }

    #[test]
    fn only_zram_swap_counts_as_swap_in_ram() {
        use super::{swaps_free_in_ram, Bytes};
        let swaps = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n\
                     /dev/zram0                              partition\t8388604\t1048576\t100\n\
                     /dev/zram1                              partition\t1024\t\t0\t\t100\n\
                     /swapfile                               file\t\t2097148\t0\t\t-2\n\
                     /dev/zramfoo                            partition\t4096\t\t0\t\t1\n\
                     /dev/zram2                              partition\tgarbage\n\
                     /host/dev/zram3                         partition\t2048\t\t0\t\t1\n\
                     /dev/zram4 partition 18446744073709551615 0 1\n\
                     /dev/zram5 partition 18446744073709551615 0 1\n";
        let (zram, huge) = swaps.split_at(swaps.find("/dev/zram4").unwrap());
        assert_eq!(
            swaps_free_in_ram(zram),
            Bytes::from_kib(8388604 - 1048576 + 1024 + 2048)
        );
        // Sizes no device has saturate rather than overflow.
        assert_eq!(
            swaps_free_in_ram(&format!("header\n{huge}")),
            Bytes::from_kib(u64::MAX)
        );
        assert_eq!(swaps_free_in_ram(""), Bytes::ZERO);
        assert_eq!(
            super::zram_swaps(zram),
            [
                (0, Bytes::from_kib(8388604 - 1048576)),
                (1, Bytes::from_kib(1024)),
                (3, Bytes::from_kib(2048))
            ]
        );
    }

    #[test]
    fn a_zram_devices_stored_and_used_memory_are_read_from_mm_stat() {
        use super::{zram_mm_stat, Bytes};
        // A 6.1 kernel's zram0 holding 300 MiB in 100 MiB.
        let text =
            "314572800 98566144 104857600        0 104857600     1024        0        0        0\n";
        assert_eq!(
            zram_mm_stat(text),
            Some((Bytes::from_mib(300), Bytes::from_mib(100)))
        );
        assert_eq!(zram_mm_stat("314572800 98566144\n"), None, "too few fields");
        assert_eq!(zram_mm_stat("lots 1 2\n"), None);
        assert_eq!(zram_mm_stat(""), None);
    }

    #[test]
    fn maps_lines_give_range_permissions_and_path() {
        let maps: Vec<_> = super::maps(QEMU_MAPS)
            .map(|m| (m.range.start, m.perms, m.path))
            .collect();
        let qemu = Some("/usr/bin/qemu-system-x86_64");
        assert_eq!(
            maps,
            [
                (0x55d0c8a00000, "r--p", qemu),
                (0x55d0c8c21000, "rw-p", qemu),
                (0x55d0ca000000, "rw-p", Some("[heap]")),
                (0x7f2a40000000, "rw-p", None),
                (0x7f2a50000000, "rw-s", Some("/memfd:ram (deleted)")),
                (0x7f2a60000000, "r--p", None),
                (0x7ffd1c3de000, "rw-p", Some("[stack]")),
            ]
        );
        // Tracking takes every private writable mapping; collapsing the anonymous ones.
        assert_eq!(
            crate::access::private_writable(QEMU_MAPS),
            [
                0x55d0c8c21000..0x55d0c8c42000,
                0x55d0ca000000..0x55d0ca400000,
                0x7f2a40000000..0x7f2a50000000,
                0x7ffd1c3de000..0x7ffd1c3ff000,
            ]
        );
        let anonymous = crate::hugepages::anonymous(QEMU_MAPS, &crate::access::Mappings::Private);
        assert_eq!(anonymous.len(), 1, "{anonymous:x?}");
        assert_eq!(anonymous[0], 0x7f2a40000000..0x7f2a50000000);
    }

    #[test]
    fn the_start_time_is_field_22_whatever_the_command_holds() {
        let proc = tempfile::tempdir().unwrap();
        let stat = |pid: i32, text: &str| {
            std::fs::create_dir_all(proc.path().join(pid.to_string())).unwrap();
            std::fs::write(proc.path().join(format!("{pid}/stat")), text).unwrap();
        };
        // A command with a parenthesis, a space and digits: fields counted after the
        // last ')'.
        stat(
            7,
            "7 (qemu) 1 2 3) S 1 7 7 0 -1 4194560 100 0 0 0 5 6 0 0 20 0 3 0 424242 1000 \
             10 18446744073709551615\n",
        );
        stat(
            8,
            "8 (gone) Z 1 8 8 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 99 0 0\n",
        );
        stat(9, "9 (short) S 1 9\n");
        let p = proc.path();
        assert_eq!(super::start_time(p, 7), Some(424242));
        assert_eq!(super::start_time(p, 8), None, "a zombie");
        assert_eq!(super::start_time(p, 9), None, "no field 22");
        assert_eq!(super::start_time(p, 10), None, "no such process");
        // This process's, as the kernel writes it: the same at every read.
        let me = std::process::id() as i32;
        let started = super::start_time(Path::new("/proc"), me).unwrap();
        assert!(started > 0);
        assert_eq!(super::start_time(Path::new("/proc"), me), Some(started));
    }

    #[test]
    fn a_zombie_or_a_missing_process_does_not_run() {
        let proc = tempfile::tempdir().unwrap();
        let stat = |pid: &str, text: &str| {
            std::fs::create_dir(proc.path().join(pid)).unwrap();
            std::fs::write(proc.path().join(pid).join("stat"), text).unwrap();
        };
        stat("10", "10 (qemu (x) Z) S 1 10 10 0 -1 0");
        stat("11", "11 (qemu) Z 1 11 11 0 -1 0");
        assert!(super::process_runs(proc.path(), 10));
        assert!(!super::process_runs(proc.path(), 11), "a zombie");
        assert!(!super::process_runs(proc.path(), 12), "gone");
        // Known by its start time too (field 22): another process at the pid is not it.
        let fields = |started: u64| format!("13 (qemu) S{} {started} 0\n", " 0".repeat(18));
        stat("13", &fields(1000));
        assert!(super::process_runs_as(proc.path(), 13, Some(1000)));
        assert!(super::process_runs_as(proc.path(), 13, None));
        assert!(
            !super::process_runs_as(proc.path(), 13, Some(999)),
            "the pid taken"
        );
        assert!(!super::process_runs_as(proc.path(), 11, None), "a zombie");
    }

    #[test]
    fn pid_0_is_no_process_and_reaps_none_of_ours() {
        assert_eq!(super::known_pid(0), None, "a peer in another pid namespace");
        assert_eq!(super::known_pid(-1), None);
        assert_eq!(super::known_pid(42), Some(42));
        // A child of this process that has ended, a zombie until reaped: checking pid 0
        // (or one that would be a negative pid_t, a process group) must not reap it.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let stat = format!("/proc/{}/stat", child.id());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::fs::read_to_string(&stat).is_ok_and(|t| super::stat_state(&t) != Some('Z')) {
            assert!(
                std::time::Instant::now() < deadline,
                "the child did not end"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let proc = std::path::Path::new("/proc");
        assert!(!super::process_runs(proc, 0));
        assert!(!super::process_runs(proc, u32::MAX));
        let status = child.try_wait().expect("the child is still ours to reap");
        assert!(status.is_some_and(|s| s.success()));
    }

    use super::*;

    #[test]
    fn the_zones_high_watermarks_are_summed_and_the_pagesets_left_out() {
        // Captured on a 24 GiB Debian 12 host: DMA, DMA32, Normal, Movable and Device
        // zones, each with per-CPU pagesets whose `high:` lines are not watermarks.
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/proc/zoneinfo"
        ))
        .unwrap();
        assert!(text.contains("high:"), "the capture has pagesets");
        assert_eq!(zoneinfo_high_pages(&text), Some(30 + 6116 + 19195 + 32));
        let one = "Node 0, zone   Normal\n  pages free     1000\n        min      10\n        \
                   low      12\n        high     14\n    pagesets\n      high:  203\n";
        assert_eq!(zoneinfo_high_pages(one), Some(14));
        assert_eq!(zoneinfo_high_pages("      high:  203\n"), None);
        assert_eq!(zoneinfo_high_pages("        high     x\n"), None);
        assert_eq!(zoneinfo_high_pages(""), None);

        // A node's own zones only.
        assert_eq!(
            zoneinfo_high_pages_on(&text, 0),
            Some(30 + 6116 + 19195 + 32)
        );
        let two = format!("{one}Node 1, zone   Normal\n        high     40\n");
        assert_eq!(zoneinfo_high_pages_on(&two, 0), Some(14));
        assert_eq!(zoneinfo_high_pages_on(&two, 1), Some(40));
        assert_eq!(zoneinfo_high_pages_on(&two, 2), None);
    }

    #[test]
    fn the_arc_gives_back_what_it_holds_above_its_floor() {
        let text = "13 1 0x01 123 33456 8385094380 1245784290617\n\
                    name                            type data\n\
                    hits                            4    1000\n\
                    c_min                           4    1054351360\n\
                    c_max                           4    16869621760\n\
                    size                            4    4294967296\n";
        assert_eq!(
            zfs_arc_reclaimable(text),
            Some(Bytes(4294967296 - 1054351360))
        );
        let below = text.replace("4294967296", "1000");
        assert_eq!(zfs_arc_reclaimable(&below), Some(Bytes(0)));
        assert_eq!(zfs_arc_reclaimable("name type data\nsize 4 10\n"), None);
        assert_eq!(zfs_arc_reclaimable("size 4 x\nc_min 4 1\n"), None);
        assert_eq!(zfs_arc_reclaimable(""), None);
    }

    #[test]
    fn cpu_time_is_read_past_a_command_name_with_spaces_and_parentheses() {
        // A QEMU's stat as read on this host (utime 4520, stime 1310 ticks), its name
        // replaced by a hostile one.
        let real = "14291 (qemu-system-x86) S 14288 14288 14852 0 -1 4194624 98520 0 3 0 \
                    4520 1310 0 0 20 0 5 0 3233532 1636474880 93210 18446744073709551615 1 1 \
                    0 0 0 0 0 4096 17635 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(stat_cpu_s(real, 100.0), Some(58.3));
        let hostile = real.replace("(qemu-system-x86)", "(a) 1 2 3 4 5 6 7 8 9 10 11 12 (b)");
        assert_eq!(stat_cpu_s(&hostile, 100.0), Some(58.3));
        assert_eq!(stat_cpu_s("14291 (qemu) S 1 2", 100.0), None, "cut short");
        assert_eq!(stat_cpu_s("no parentheses", 100.0), None);
        let me = ProcessRss::new(Path::new("/proc"), std::process::id() as i32);
        assert!(me.cpu_s().is_some_and(|c| c >= 0.0));
    }

    const MEMINFO: &str = include_str!("../tests/data/proc/meminfo");

    /// A meminfo field's value, read independently of the parser.
    fn field(text: &str, name: &str) -> u64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{name}:")))
            .unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }
    const VMSTAT: &str = include_str!("../tests/data/proc/vmstat");

    #[test]
    fn parses_a_real_meminfo() {
        let m = meminfo(MEMINFO).unwrap();
        assert_eq!(m.total, Bytes::from_kib(24682416));
        assert_eq!(m.free, Bytes::from_kib(22992484));
        assert_eq!(m.available, Some(Bytes::from_kib(24269272)));
        assert_eq!(m.freeable(), Bytes::from_kib(22992484 + 24712 + 1435084));
        assert!(m.committed_as.is_some() && m.anon_pages.is_some());
        assert_eq!(
            m.active_file.map(|b| b.kib()),
            Some(field(MEMINFO, "Active(file)"))
        );
        assert_eq!(
            m.inactive_anon.map(|b| b.kib()),
            Some(field(MEMINFO, "Inactive(anon)"))
        );
    }

    #[test]
    fn meminfo_errors_name_the_problem() {
        assert_eq!(
            meminfo("MemFree: 1 kB\n").unwrap_err().to_string(),
            "meminfo: no MemTotal line"
        );
        assert_eq!(
            meminfo("MemTotal: lots kB\n").unwrap_err().to_string(),
            "meminfo: MemTotal: \"lots\" is not a number"
        );
        assert_eq!(
            meminfo("MemTotal: 1 MB\n").unwrap_err().to_string(),
            "meminfo: MemTotal: unknown unit \"MB\""
        );
    }

    #[test]
    fn parses_a_real_vmstat() {
        let v = vmstat(VMSTAT);
        assert_eq!(v.pswpin, Some(0));
        assert_eq!(v.pgmajfault, Some(1070));
        assert_eq!(v.allocstall, Some(0), "summed over zones");
        assert_eq!(v.workingset_refault_anon, Some(0));
        assert_eq!(
            vmstat("pgfault 5\nallocstall_normal 2\nallocstall_movable 3\n").allocstall,
            Some(5)
        );
        assert_eq!(vmstat("garbage\n").pswpin, None);
    }

    #[test]
    fn parses_psi_with_and_without_full() {
        let p = psi(include_str!("../tests/data/cgroup-v2/memory.pressure")).unwrap();
        assert_eq!(p.some.avg10, 1.25);
        assert_eq!(p.some.total_us, 5123456);
        assert_eq!(p.full.unwrap().avg60, 0.20);
        let old = psi("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n").unwrap();
        assert_eq!(old.full, None);
        assert!(psi("").is_err());
        assert_eq!(
            psi("some avg10=x\n").unwrap_err().to_string(),
            "pressure: avg10: \"x\" is not a share from 0 to 100"
        );
        assert_eq!(
            psi("some total=x\n").unwrap_err().to_string(),
            "pressure: total: \"x\" is not a number"
        );
        for v in ["NaN", "inf", "-1", "100.5"] {
            let text = format!("some avg10=0.00 avg60={v} avg300=0.00 total=0\n");
            assert!(psi(&text).is_err(), "avg60={v} accepted");
        }
    }

    #[test]
    fn finds_the_guest_ram_in_a_real_qemu_smaps() {
        let smaps = include_str!("../tests/data/proc/qemu-smaps");
        // A 192 MiB guest: its RAM mapping had 6 MiB referenced; TCG's 1 GiB rwx code
        // buffer and the guard mappings are not guest RAM.
        let mib = Bytes::from_mib;
        assert_eq!(smaps_referenced(smaps, &[mib(192)]), Some(mib(6)));
        assert_eq!(smaps_referenced(smaps, &[mib(4096)]), None);
        assert_eq!(smaps_referenced("", &[mib(192)]), None);
        // 6 MiB of it in huge pages; the code buffer's 2 MiB are not guest RAM's.
        assert_eq!(smaps_ram_huge(smaps, &[mib(192)]), Some(mib(6)));
        assert_eq!(smaps_ram_huge(smaps, &[mib(4096)]), None);
    }

    #[test]
    fn guest_ram_in_a_base_mapping_and_a_virtio_mem_backend_is_read_from_both() {
        // A 128 MiB base memory and a 256 MiB virtio-mem backend (2 MiB of alignment on
        // the latter), beside the heap: the guest's pages mostly in the device's memory,
        // which a guest onlines movable and fills with its processes' pages first.
        let smaps = "\
55d0ca000000-55d0ca400000 rw-p 00000000 00:00 0                          [heap]
Size:               4096 kB
Rss:                4096 kB
Referenced:         4096 kB
AnonHugePages:         0 kB
7f2a00000000-7f2a08000000 rw-p 00000000 00:00 0
Size:             131072 kB
Rss:               65536 kB
Referenced:        40960 kB
AnonHugePages:     32768 kB
7f2b00000000-7f2b10200000 rw-p 00000000 00:00 0
Size:             264192 kB
Rss:              204800 kB
Referenced:       163840 kB
AnonHugePages:    131072 kB
";
        let mib = Bytes::from_mib;
        let both = [mib(128), mib(256)];
        assert_eq!(smaps_referenced(smaps, &both), Some(mib(200)));
        assert_eq!(smaps_ram_huge(smaps, &both), Some(mib(160)));
        // The base memory alone, as the sampler read it before: the device's unseen.
        assert_eq!(smaps_referenced(smaps, &[mib(128)]), Some(mib(40)));
        assert_eq!(smaps_own(smaps, &both), Some(mib(4)));
    }

    #[test]
    fn a_qemus_own_memory_is_its_resident_memory_outside_guest_ram() {
        let smaps = include_str!("../tests/data/proc/qemu-smaps");
        // 14 396 kB resident in all, 6 MiB of it in the 192 MiB guest's RAM.
        let mib = Bytes::from_mib;
        assert_eq!(
            smaps_own(smaps, &[mib(192)]),
            Some(Bytes::from_kib(14_396 - 6_144))
        );
        // No mapping is the guest's RAM, or two might be: nothing can be told apart.
        assert_eq!(smaps_own(smaps, &[mib(4096)]), None);
        let twice = format!("{smaps}{}", &smaps[smaps.find("7ff7afe00000").unwrap()..]);
        assert_eq!(smaps_own(&twice, &[mib(192)]), None);
        assert_eq!(smaps_own("", &[mib(192)]), None);
        // Two mappings of guest RAM (base memory and a memory device's backend of the
        // same size here) where two are expected: both left out (the copy adds the RAM
        // mapping again and the 2 048 kB resident in the mappings after it).
        assert_eq!(
            smaps_own(&twice, &[mib(192), mib(192)]),
            Some(Bytes::from_kib(14_396 - 6_144 + 2_048))
        );
        // A memory device whose backend is no mapping found: nothing told apart.
        assert_eq!(smaps_own(smaps, &[mib(192), mib(256)]), None);
    }

    #[test]
    fn fixed_memory_is_read_from_status() {
        let status = "Name:\tqemu-system-x86\nVmPeak:\t 1200000 kB\nVmLck:\t  524288 kB\n\
                      VmPin:\t       0 kB\nVmRSS:\t  600000 kB\nHugetlbPages:\t       0 kB\n";
        let fixed = status_fixed(status).unwrap();
        assert_eq!(fixed.locked, Bytes::from_mib(512));
        assert_eq!(fixed.hugetlb, Bytes::ZERO);
        // VFIO's pinning on kernels that account it as pinned, and huge pages.
        let fixed = status_fixed("VmLck:\t0 kB\nVmPin:\t1048576 kB\nHugetlbPages:\t2048 kB\n");
        assert_eq!(
            fixed,
            Some(FixedMemory {
                locked: Bytes::from_mib(1024),
                hugetlb: Bytes::from_mib(2),
                own: None,
            })
        );
        assert_eq!(status_fixed("Name:\tx\nVmRSS:\t10 kB\n"), None);
        assert_eq!(status_fixed("VmLck:\tlots kB\n"), None);
        assert_eq!(status_fixed("VmLck:\t10 pages\n"), None);
        // A live process, read through ProcessRss: this test's own locks nothing.
        let mut own = ProcessRss::new(Path::new("/proc"), std::process::id() as i32);
        let rss = own.read();
        assert_eq!(own.status(rss).fixed.map(|f| f.locked), Some(Bytes::ZERO));
        let mut gone = ProcessRss::new(Path::new("/proc"), i32::MAX);
        assert_eq!(
            gone.status(None),
            ProcessStatus::default(),
            "no such process"
        );
    }

    #[test]
    fn swapped_out_memory_is_read_from_status_with_the_fixed_memory() {
        let status = "Name:\tqemu-system-x86\nVmRSS:\t  600000 kB\nVmSwap:\t  131072 kB\n";
        assert_eq!(status_swap(status), Some(Bytes::from_mib(128)));
        assert_eq!(
            status_swap("Name:\tx\nVmRSS:\t10 kB\n"),
            None,
            "a kernel thread"
        );
        assert_eq!(status_swap("VmSwap:\tlots kB\n"), None);
        // A live process: read on the first call, then when due or its RSS moved.
        let mut own = ProcessRss::new(Path::new("/proc"), std::process::id() as i32);
        let then = own.read();
        let first = own.status(then);
        assert!(first.swapped.is_some(), "every process's status has VmSwap");
        assert_eq!(own.status_read.rss, then);
        // Its RSS unchanged: the figures read then, one read fewer left.
        assert_eq!(own.status(then), first);
        assert_eq!(own.status_read.left, STATUS_EVERY - 2);
        // 41 MiB more resident: status read again at once.
        let ram = crate::test_memory::Buffer::new(41 << 8);
        let now = own.read();
        own.status(now);
        assert_eq!(own.status_read.rss, now);
        assert!(now > then, "{now:?} then {then:?}");
        assert_eq!(own.status_read.left, STATUS_EVERY - 1);
        drop(ram);
    }

    #[tokio::test]
    async fn a_live_processs_own_memory_leaves_out_its_guest_ram() {
        // 41 MiB standing in for guest RAM, each page written: resident.
        let ram = crate::test_memory::Buffer::new(41 << 8);
        let pid = std::process::id() as i32;
        let proc = Path::new("/proc");
        let mut own = OwnMemory::new(proc, pid, vec![Bytes::from_mib(41)]);
        own.next = Some(Instant::now());
        // Samples until the read a sample started has ended and been taken.
        async fn read_taken(own: &mut OwnMemory) -> Option<Bytes> {
            assert_eq!(own.sample().await, None, "nothing read before");
            assert!(own.reading.is_some(), "a read started, not waited for");
            while own.reading.is_some() {
                tokio::time::sleep(Duration::from_millis(5)).await;
                own.sample().await;
            }
            own.last
        }
        let read = read_taken(&mut own).await.expect("own memory told apart");
        let rss = ProcessRss::new(proc, pid).read().unwrap();
        drop(ram);
        // What is left of the process's RSS is the mapping, to what the test's other
        // threads allocate between the two reads.
        let ram = (rss - read).mib_f64();
        assert!((40.0..=45.0).contains(&ram), "rss {rss}, own {read}");
        assert!(
            own.next.is_some_and(|n| n > Instant::now()),
            "read again in a minute"
        );
        // No mapping of the size: nothing told apart, and smaps is not read again.
        let mut none = OwnMemory::new(proc, pid, vec![Bytes::from_mib(4099)]);
        none.next = Some(Instant::now());
        assert_eq!(read_taken(&mut none).await, None);
        assert_eq!(none.next, None);
        none.sample().await;
        assert!(none.reading.is_none());

        // A memory device plugged (a second mapping of guest RAM): the figure read of the
        // old mappings is dropped, the next read is due at once, and it leaves both out.
        let ram = crate::test_memory::Buffer::new(41 << 8);
        let dimm = crate::test_memory::Buffer::new(23 << 8);
        // Flagged apart, so that the kernel keeps it a mapping of its own where it was
        // placed beside the other.
        // SAFETY: the buffer's own mapping.
        assert_eq!(
            unsafe { libc::madvise(dimm.at.cast(), 23 << 20, libc::MADV_DONTFORK) },
            0
        );
        let mut own = OwnMemory::new(proc, pid, vec![Bytes::from_mib(41)]);
        own.next = Some(Instant::now());
        let before = read_taken(&mut own).await.expect("own memory told apart");
        own.set_guest_ram(vec![Bytes::from_mib(41)]);
        assert_eq!(own.last, Some(before), "the same mappings: the figure kept");
        own.set_guest_ram(vec![Bytes::from_mib(41), Bytes::from_mib(23)]);
        assert_eq!(own.last, None);
        assert!(own.next.is_some_and(|n| n <= Instant::now()), "due now");
        let after = read_taken(&mut own).await.expect("own memory told apart");
        drop((ram, dimm));
        let left_out = (before - after).mib_f64();
        assert!(
            (21.0..=25.0).contains(&left_out),
            "own {before} before, {after} after"
        );
    }

    #[test]
    fn reads_rss_from_statm_as_status_shows_it() {
        let page = Bytes::from_kib(4);
        assert_eq!(
            statm_rss("2435 410 330 1 0 129 0\n", page),
            Some(Bytes::from_kib(1640))
        );
        assert_eq!(statm_rss("2435\n", page), None);
        assert_eq!(statm_rss("1 18446744073709551615 0\n", page), None);
        // The live process: statm's figure is status's VmRSS (read around it, as the
        // process's memory may move in between).
        let vm_rss = || {
            let status = std::fs::read_to_string("/proc/self/status").unwrap();
            Bytes::from_kib(field(&status, "VmRSS"))
        };
        let before = vm_rss();
        let rss = ProcessRss::new(Path::new("/proc"), std::process::id() as i32)
            .read()
            .unwrap();
        let after = vm_rss();
        let slack = Bytes::from_mib(1);
        assert!(
            rss + slack >= before.min(after) && rss <= before.max(after) + slack,
            "statm {rss:?}, status {before:?} then {after:?}"
        );
        assert_eq!(ProcessRss::new(Path::new("/proc"), i32::MAX).read(), None);
        // A process that ends reads as gone.
        let mut child = std::process::Command::new("sleep")
            .arg("10")
            .spawn()
            .unwrap();
        let rss = ProcessRss::new(Path::new("/proc"), child.id() as i32);
        assert!(rss.read().is_some_and(|r| r.0 > 0));
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(rss.read(), None);
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    proptest! {
        /// Parsers take whatever a file holds without panicking.
        #[test]
        fn parsers_never_panic(text in "(?s).{0,400}") {
            let _ = super::meminfo(&text);
            let _ = super::vmstat(&text);
            let _ = super::psi(&text);
            let _ = super::statm_rss(&text, memtide_core::Bytes::from_kib(4));
            let _ = super::smaps_referenced(&text, &[memtide_core::Bytes::from_mib(1)]);
            let _ = crate::cgroup::parse_limit(&text);
        }

        /// Any meminfo with the required lines parses, in any order, with exact values.
        #[test]
        fn meminfo_values_round_trip(total in 0u64..1 << 40, free in 0u64..1 << 40, cached in 0u64..1 << 40) {
            let text = format!("Cached: {cached} kB\nMemFree: {free} kB\nBuffers: 0 kB\nMemTotal: {total} kB\n");
            let m = super::meminfo(&text).unwrap();
            prop_assert_eq!(m.total.kib(), total);
            prop_assert_eq!(m.freeable().kib(), free + cached);
        }
    }
}
