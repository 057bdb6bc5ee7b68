//! Host-side access tracking: which of a process's resident pages were accessed between
//! two scans, and how long each has gone untouched — by idle page tracking, or by DAMON
//! ([`crate::damon`]) where the kernel has it.
//!
//! Each scan reads the pages' frame numbers from `/proc/PID/pagemap`; with idle page
//! tracking it asks
//! `/sys/kernel/mm/page_idle/bitmap` whether each frame is still idle, and marks the
//! resident frames idle again. The kernel clears a frame's idle flag when any page table
//! that maps it says it was accessed: the process's own and, through mmu notifiers,
//! KVM's (Documentation/admin-guide/mm/idle_page_tracking.rst). So unlike clear_refs,
//! which sees only the process's own page tables, this sees a KVM guest's accesses.
//! With DAMON a page counts as accessed when the region DAMON holds it in was accessed
//! since the previous scan: coarser (regions, sampled), at a cost bounded by the
//! region count rather than by the process's size.
//!
//! Root only: the bitmap and DAMON's files are root's, and pagemap shows frame numbers
//! only to CAP_SYS_ADMIN (Documentation/admin-guide/mm/pagemap.rst).

use crate::damon::{self, DamonError, Monitor};
use memtide_core::{Bytes, VmSample};
use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A page's age for one not marked idle at the previous scan (not resident then, or not
/// yet scanned): the next scan cannot tell whether it was accessed.
const UNMARKED: u16 = u16::MAX;
/// The most scans an age counts.
const OLDEST: u16 = u16::MAX - 1;
/// The most scans a cold age may span: a longer one is never reached.
pub const MAX_AGE_SCANS: u16 = OLDEST;

/// Why scans every `interval_s` cannot count a cold age of `longest_s`, if they cannot:
/// an age they never reach would stop all demotion.
pub fn age_beyond_scans(interval_s: f64, longest_s: f64) -> Option<String> {
    let most = interval_s * f64::from(MAX_AGE_SCANS);
    (longest_s > most).then(|| {
        format!("scans count ages up to {most:.0} s, below the longest cold age, {longest_s} s")
    })
}

/// What one scan saw of one page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// Not in memory (never touched, swapped out, given back).
    Absent,
    /// In memory, and idle since the previous scan marked it.
    Idle,
    /// In memory, and accessed since the previous scan (or that cannot be told).
    Accessed,
}

/// Update each page's age (consecutive scans that found it idle) with what a scan saw
/// of it, in order; returns how many pages were accessed since the previous scan: those
/// in memory that were not idle since it marked them, newly resident pages included.
pub fn age(ages: &mut [u16], seen: impl IntoIterator<Item = Seen>) -> u64 {
    let mut accessed = 0;
    for (a, s) in ages.iter_mut().zip(seen) {
        *a = match s {
            Seen::Absent => UNMARKED,
            Seen::Idle if *a != UNMARKED => (*a + 1).min(OLDEST),
            Seen::Idle | Seen::Accessed => {
                accessed += 1;
                0
            }
        };
    }
    accessed
}

/// Pages in memory whose age is at least `least` scans.
pub fn cold_pages(ages: &[u16], least: u16) -> u64 {
    ages.iter()
        .filter(|&&a| a != UNMARKED && a >= least)
        .count() as u64
}

/// The times of the latest scans, as far back as the cold age reaches: how many scans a
/// page must have been found idle in a row to have gone untouched for the cold age.
#[derive(Debug, Clone)]
pub struct ColdClock {
    cold_age: Duration,
    times: VecDeque<Duration>,
}

impl ColdClock {
    /// A clock for pages untouched for `cold_age`.
    pub fn new(cold_age: Duration) -> ColdClock {
        ColdClock {
            cold_age,
            times: VecDeque::new(),
        }
    }

    /// Record a scan at `at` (monotonic, not before the previous one). Returns the least
    /// age that spans the cold age now — a page of age `a` was last marked `a` scans ago
    /// and found idle at every scan since — or `None` while the scans so far span less
    /// (or the cold age needs more scans than an age counts).
    pub fn tick(&mut self, at: Duration) -> Option<u16> {
        self.times.push_back(at);
        // An age of 0 is a page marked now, never cold: at least one scan back.
        while self.times.len() > 2 && at.saturating_sub(self.times[1]) >= self.cold_age {
            self.times.pop_front();
        }
        if self.times.len() > usize::from(OLDEST) + 1 {
            self.times.pop_front();
        }
        let spanned = self.times.len() > 1 && at.saturating_sub(self.times[0]) >= self.cold_age;
        spanned.then(|| (self.times.len() - 1) as u16)
    }

    /// The least age that spans `age` (at most the clock's cold age) as of the latest
    /// scan, as [`ColdClock::tick`] gives it for the clock's own; `None` while the scans
    /// span less.
    pub fn spanning(&self, age: Duration) -> Option<u16> {
        let last = *self.times.back()?;
        (1..self.times.len())
            .find(|&k| last.saturating_sub(self.times[self.times.len() - 1 - k]) >= age)
            .map(|k| k as u16)
    }
}

/// A `/proc/PID/pagemap` entry's frame number, when the page is in memory (bit 63); zero
/// for a reader without CAP_SYS_ADMIN. `None` for a page not present, swapped out
/// (bit 62) included (Documentation/admin-guide/mm/pagemap.rst).
pub fn present_frame(entry: u64) -> Option<u64> {
    (entry >> 63 == 1).then_some(entry & ((1 << 55) - 1))
}

/// `/proc/kpageflags` bit of a compound page's tail (pagemap.rst: KPF_COMPOUND_TAIL).
const KPF_COMPOUND_TAIL: u64 = 1 << 16;
/// `/proc/kpageflags` bit of an anonymous page (pagemap.rst: KPF_ANON).
const KPF_ANON: u64 = 1 << 12;
/// `/proc/kpageflags` bit of a page KSM merged (pagemap.rst: KPF_KSM).
const KPF_KSM: u64 = 1 << 21;

/// The private writable mappings (`rw-p`) in `/proc/PID/maps` text, as address ranges.
pub fn private_writable(maps: &str) -> Vec<std::ops::Range<u64>> {
    crate::procfs::maps(maps)
        .filter(|m| m.perms == "rw-p")
        .map(|m| m.range)
        .collect()
}

/// Which of the process's mappings to track.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mappings {
    /// A hypervisor's guest RAM in mappings of these sizes: its base memory's, and each
    /// memory device's backend (a virtio-mem device's of its whole maximum, a DIMM's),
    /// each a private writable mapping of its size to 2 MiB of alignment, as
    /// `procfs::smaps_referenced` picks them.
    GuestRam(Vec<Bytes>),
    /// Every private writable mapping (a process standing in for a hypervisor).
    Private,
}

impl Mappings {
    /// A VM's guest RAM as its sample tells it: the mappings its connector names
    /// (`ram_mappings`: QMP's, from `query-memory-devices`, DIMMs included), else one of
    /// its configured size, or, with a virtio-mem device, its base memory's and the
    /// device backend's (the configured size counts both).
    pub fn of(sample: &VmSample) -> Mappings {
        if !sample.ram_mappings.is_empty() {
            return Mappings::GuestRam(sample.ram_mappings.clone());
        }
        match &sample.virtio_mem {
            Some(device) => Mappings::GuestRam(vec![sample.configured - device.max, device.max]),
            None => Mappings::GuestRam(vec![sample.configured]),
        }
    }

    /// The guest RAM's size: its mappings' summed (`None` for [`Mappings::Private`]).
    pub fn guest_ram(&self) -> Option<Bytes> {
        match self {
            Mappings::GuestRam(sizes) => Some(sizes.iter().fold(Bytes::ZERO, |a, b| a + *b)),
            Mappings::Private => None,
        }
    }

    /// Whether `range` of the process's private writable mappings is one of these.
    pub fn wants(&self, range: &std::ops::Range<u64>) -> bool {
        match self {
            Mappings::GuestRam(sizes) => {
                crate::procfs::guest_ram_sized(Bytes(range.end - range.start), sizes)
            }
            Mappings::Private => true,
        }
    }
}

/// How a tracker learns which pages were accessed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Method {
    /// DAMON where the kernel has it and no other tool uses it, else idle page tracking.
    #[default]
    Auto,
    /// Idle page tracking: exact, each page read and marked at every scan.
    IdlePages,
    /// DAMON: regions sampled by a kdamond of memtide's own.
    Damon,
}

impl Method {
    /// Its name in `memtide access` and `memtide place` (`--tracker`, their lines).
    pub fn key(&self) -> &'static str {
        match self {
            Method::Auto => "auto",
            Method::IdlePages => "idle",
            Method::Damon => "damon",
        }
    }
}

impl std::fmt::Display for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Method::Auto => "DAMON or idle page tracking",
            Method::IdlePages => "idle page tracking",
            Method::Damon => "DAMON",
        })
    }
}

/// Why a process's accesses cannot be tracked.
#[derive(Debug, thiserror::Error)]
pub enum TrackError {
    /// The kernel has no idle page tracking.
    #[error("{0} is missing: the kernel has no idle page tracking (CONFIG_IDLE_PAGE_TRACKING)")]
    Unsupported(PathBuf),
    /// The kernel has no idle page tracking, and DAMON cannot be had either.
    #[error("{idle} is missing: the kernel has no idle page tracking (CONFIG_IDLE_PAGE_TRACKING), and no DAMON: {damon}")]
    Neither {
        /// The idle page tracking's bitmap.
        idle: PathBuf,
        /// Why not DAMON.
        damon: DamonError,
    },
    /// DAMON cannot be had.
    #[error(transparent)]
    Damon(#[from] DamonError),
    /// pagemap hides frame numbers from this reader.
    #[error("{0} shows no page frame numbers: idle page tracking needs CAP_SYS_ADMIN")]
    NoFrames(PathBuf),
    /// Nothing to track in the process.
    #[error("{0}: no mapping to track ({1:?})")]
    NoMapping(PathBuf, Mappings),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TrackError + '_ {
    move |source| TrackError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// One scan's figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scan {
    /// Memory accessed since the previous scan; `None` at the first scan.
    pub accessed: Option<Bytes>,
    /// Memory in RAM untouched for at least the cold age; `None` until the scans span it.
    pub cold: Option<Bytes>,
    /// The least age ([`Page::age`]) that spans the cold age; `None` until the scans span
    /// it.
    pub cold_scans: Option<u16>,
    /// Memory of the tracked mappings in RAM.
    pub resident: Bytes,
}

/// A file and its path, for errors.
struct Named {
    file: File,
    path: PathBuf,
}

impl Named {
    fn open(path: PathBuf, write: bool) -> Result<Named, TrackError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(write)
            .open(&path)
            .map_err(io(&path))?;
        Ok(Named { file, path })
    }

    /// Read native-endian 64-bit words from word index `at` into `out`, as many as the
    /// file gives there: returns how many.
    fn read_words(&self, at: u64, out: &mut [u64]) -> Result<usize, TrackError> {
        let mut bytes = vec![0; out.len() * 8];
        let mut done = 0;
        while done < bytes.len() {
            match self.file.read_at(&mut bytes[done..], at * 8 + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io(&self.path)(e)),
            }
        }
        for (w, b) in out.iter_mut().zip(bytes[..done].chunks_exact(8)) {
            *w = u64::from_ne_bytes(b.try_into().expect("8 bytes"));
        }
        Ok(done / 8)
    }

    /// Read `out.len()` words from word index `at`, all of them or an error.
    fn read_all_words(&self, at: u64, out: &mut [u64]) -> Result<(), TrackError> {
        match self.read_words(at, out)? {
            n if n == out.len() => Ok(()),
            _ => Err(io(&self.path)(std::io::ErrorKind::UnexpectedEof.into())),
        }
    }

    /// Write words from word index `at`, as many as the file takes there.
    fn write_words(&self, at: u64, words: &[u64]) -> Result<(), TrackError> {
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
        let mut done = 0;
        while done < bytes.len() {
            match self.file.write_at(&bytes[done..], at * 8 + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io(&self.path)(e)),
            }
        }
        Ok(())
    }
}

/// Word indices read or written together when no more than this many apart: fewer
/// system calls, and every frame in a word read is checked by the kernel anyway.
const GAP: u64 = 8;

/// Runs of sorted, distinct word indices, each `(first, last)`, gaps of up to [`GAP`]
/// closed.
fn runs(words: &[u64]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &w in words {
        match out.last_mut() {
            Some((_, last)) if w <= *last + GAP => *last = w,
            _ => out.push((w, w)),
        }
    }
    out
}

/// What `/proc/kpageflags` says of a scan's frames, each list sorted.
#[derive(Default)]
struct Flagged {
    /// Compound pages' tails.
    tails: Vec<u64>,
    /// Frames other mappings share: merged by KSM, or not anonymous.
    shared: Vec<u64>,
}

/// Pages scanned at a time: their pagemap entries (8 bytes each) in one read.
const CHUNK: usize = 1 << 15;

/// One tracked mapping: its start address, its pages' ages, and which of its pages
/// were shared with other mappings at the last scan.
struct Tracked {
    start: u64,
    ages: Vec<u16>,
    shared: Vec<bool>,
}

/// A resident page of the tracked mappings, as the last scan saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Page {
    /// Its virtual address.
    pub addr: u64,
    /// The scans in a row that found it idle (0: accessed since the previous scan, or
    /// not seen before).
    pub age: u16,
    /// Its frame is shared with other mappings (merged by KSM, or not anonymous): it
    /// counts as accessed at every scan, and move_pages(2) will not move it while
    /// another process maps it.
    pub shared: bool,
}

/// Where a tracker learns which pages were accessed.
enum Source {
    /// Idle page tracking's bitmap.
    Idle(Named),
    /// A kdamond of memtide's own on the process.
    Damon(Monitor),
}

/// Tracks a process's accesses, one scan at a time.
pub struct Tracker {
    maps: PathBuf,
    /// `/proc/PID/ksm_merging_pages`.
    ksm_merging: PathBuf,
    pagemap: Named,
    source: Source,
    /// The previous scan's time.
    last: Option<Duration>,
    kpageflags: Named,
    which: Mappings,
    page: u64,
    tracked: Vec<Tracked>,
    clock: ColdClock,
    scans: u64,
}

impl Tracker {
    /// Track process `pid`'s `which` mappings (procfs at `proc`, sysfs at `sys`) by
    /// `method`, a page being cold once untouched for `cold_age`.
    pub fn open(
        proc: &Path,
        sys: &Path,
        pid: i32,
        which: Mappings,
        cold_age: Duration,
        method: Method,
    ) -> Result<Tracker, TrackError> {
        let dir = proc.join(pid.to_string());
        let bitmap = sys.join("kernel/mm/page_idle/bitmap");
        let idle = || match Named::open(bitmap.clone(), true) {
            Err(TrackError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                Err(TrackError::Unsupported(bitmap.clone()))
            }
            b => b.map(Source::Idle),
        };
        let idle_else = |damon| match idle() {
            Err(TrackError::Unsupported(idle)) => Err(TrackError::Neither { idle, damon }),
            source => source,
        };
        // What the kernel offers first, then the process's files, then a kdamond for it.
        let admin = damon::admin_dir(sys);
        let chosen = match method {
            Method::IdlePages => Some(idle()?),
            Method::Damon => {
                damon::supported(&admin)?;
                None
            }
            Method::Auto => match damon::supported(&admin) {
                Ok(()) => None,
                Err(e) => Some(idle_else(e)?),
            },
        };
        let pagemap = Named::open(dir.join("pagemap"), false)?;
        let kpageflags = Named::open(proc.join("kpageflags"), false)?;
        let source = match chosen {
            Some(source) => source,
            None => match Monitor::start(&admin, pid) {
                Ok(monitor) => Source::Damon(monitor),
                Err(e) if method == Method::Auto => idle_else(e)?,
                Err(e) => return Err(e.into()),
            },
        };
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        Ok(Tracker {
            maps: dir.join("maps"),
            ksm_merging: dir.join("ksm_merging_pages"),
            pagemap,
            source,
            last: None,
            kpageflags,
            which,
            page: u64::try_from(page).unwrap_or(4096),
            tracked: Vec::new(),
            clock: ColdClock::new(cold_age),
            scans: 0,
        })
    }

    /// Track `which` mappings from the next scan on (a memory device plugged or removed):
    /// the pages of a mapping still tracked keep their ages, a new one's are counted as
    /// accessed where resident at its first scan, as any newly resident page is.
    pub fn set_mappings(&mut self, which: Mappings) {
        self.which = which;
    }

    /// How it tracks: [`Method::IdlePages`] or [`Method::Damon`].
    pub fn method(&self) -> Method {
        match self.source {
            Source::Idle(_) => Method::IdlePages,
            Source::Damon(_) => Method::Damon,
        }
    }

    /// Scan at `at` (monotonic): read which pages were accessed since the previous scan,
    /// age them, mark them idle again.
    pub fn scan(&mut self, at: Duration) -> Result<Scan, TrackError> {
        // DAMON's regions accessed since the previous scan, as far back as its kdamond
        // has run (less two aggregation intervals: a region made at its start is not
        // taken as accessed).
        let damon = match &self.source {
            Source::Damon(monitor) => {
                let since = at.saturating_sub(self.last.unwrap_or(at));
                match monitor.regions() {
                    Ok(regions) => {
                        let ran = regions.ran.saturating_sub(damon::AGGREGATION * 2);
                        damon::accessed_within(&regions.list, damon::AGGREGATION, since.min(ran))
                    }
                    Err(e) => {
                        self.start_over();
                        return Err(e.into());
                    }
                }
            }
            Source::Idle(_) => Vec::new(),
        };
        let ksm = may_have_ksm_pages(&self.ksm_merging);
        let maps = std::fs::read_to_string(&self.maps).map_err(io(&self.maps))?;
        let ranges: Vec<_> = private_writable(&maps)
            .into_iter()
            .filter(|r| self.which.wants(r))
            .collect();
        if ranges.is_empty() {
            self.start_over();
            return Err(TrackError::NoMapping(self.maps.clone(), self.which.clone()));
        }
        // Ages follow a mapping by its start address, whatever its size now.
        let mut old = std::mem::take(&mut self.tracked);
        for r in &ranges {
            let pages = ((r.end - r.start) / self.page) as usize;
            let mut ages = match old.iter().position(|t| t.start == r.start) {
                Some(i) => old.swap_remove(i).ages,
                None => Vec::new(),
            };
            ages.resize(pages, UNMARKED);
            self.tracked.push(Tracked {
                start: r.start,
                ages,
                shared: vec![false; pages],
            });
        }
        let (mut accessed, mut resident) = (0, 0);
        let mut tracked = std::mem::take(&mut self.tracked);
        let scanned = tracked.iter_mut().try_for_each(|t| {
            let page = self.page;
            // The page before, carried across chunks: a huge page may straddle two.
            let mut before = None;
            let chunks = t.ages.chunks_mut(CHUNK).zip(t.shared.chunks_mut(CHUNK));
            for (i, (chunk, shared)) in chunks.enumerate() {
                let first = t.start / page + (i * CHUNK) as u64;
                let (a, r) = self.scan_chunk(first, chunk, shared, &mut before, &damon, ksm)?;
                accessed += a;
                resident += r;
            }
            Ok(())
        });
        self.tracked = tracked;
        if let Err(e) = scanned {
            // A partial scan leaves ages that no longer match the marks: start over.
            self.start_over();
            return Err(e);
        }
        let least = self.clock.tick(at);
        let cold = least.map(|least| {
            let pages: u64 = self
                .tracked
                .iter()
                .map(|t| cold_pages(&t.ages, least))
                .sum();
            Bytes(pages * self.page)
        });
        self.scans += 1;
        self.last = Some(at);
        Ok(Scan {
            accessed: (self.scans > 1).then_some(Bytes(accessed * self.page)),
            cold,
            cold_scans: least,
            resident: Bytes(resident * self.page),
        })
    }

    /// Forget every page's age after a failed scan: the next scan is a first one.
    fn start_over(&mut self) {
        self.tracked.clear();
        self.scans = 0;
    }

    /// The size of a page in bytes.
    pub fn page_size(&self) -> u64 {
        self.page
    }

    /// The least age that spans `age` (at most the tracker's cold age) at the last scan,
    /// as [`Scan::cold_scans`] gives it for the tracker's own.
    pub fn scans_spanning(&self, age: Duration) -> Option<u16> {
        self.clock.spanning(age)
    }

    /// The resident pages of the tracked mappings at the last scan, each with its
    /// address, its age and whether it is shared. None after a failed scan.
    pub fn pages(&self) -> impl Iterator<Item = Page> + '_ {
        self.tracked.iter().flat_map(move |t| {
            (0..)
                .zip(t.ages.iter().zip(&t.shared))
                .filter_map(move |(i, (&age, &shared))| {
                    (age != UNMARKED).then_some(Page {
                        addr: t.start + i * self.page,
                        age,
                        shared,
                    })
                })
        })
    }

    /// Scan `ages.len()` pages from virtual page number `first`, `before` the frame and
    /// state of the page before them (updated to the last one's), and note in `is_shared`
    /// which are shared; returns the pages accessed and the pages resident.
    fn scan_chunk(
        &self,
        first: u64,
        ages: &mut [u16],
        is_shared: &mut [bool],
        before: &mut Option<(u64, Seen)>,
        damon: &[std::ops::Range<u64>],
        ksm: bool,
    ) -> Result<(u64, u64), TrackError> {
        let mut entries = vec![0; ages.len()];
        self.pagemap.read_all_words(first, &mut entries)?;
        let frames: Vec<Option<u64>> = entries.iter().map(|&e| present_frame(e)).collect();
        if frames.contains(&Some(0)) {
            return Err(TrackError::NoFrames(self.pagemap.path.clone()));
        }
        let mut present: Vec<u64> = frames.iter().flatten().copied().collect();
        present.sort_unstable();
        present.dedup();
        let flagged = self.flagged(&present, ksm)?;
        let seen = match &self.source {
            Source::Idle(bitmap) => idle_seen(bitmap, &frames, &present, &flagged, before)?,
            Source::Damon(_) => {
                // Pages others map too count as accessed, as with idle page tracking.
                let page = self.page;
                (first..)
                    .zip(&frames)
                    .map(|(n, frame)| match *frame {
                        None => Seen::Absent,
                        Some(f) if flagged.shared.binary_search(&f).is_ok() => Seen::Accessed,
                        Some(_) if within(damon, n * page) => Seen::Accessed,
                        Some(_) => Seen::Idle,
                    })
                    .collect()
            }
        };
        let accessed = age(ages, seen);
        for (s, frame) in is_shared.iter_mut().zip(&frames) {
            *s = frame.is_some_and(|f| flagged.shared.binary_search(&f).is_ok());
        }
        let resident = frames.iter().flatten().count() as u64;
        Ok((accessed, resident))
    }

    /// Which of the sorted, distinct `frames` are compound pages' tails, and which are
    /// shared with other mappings (`/proc/kpageflags`); `ksm`: whether KPF_KSM is to be
    /// believed.
    fn flagged(&self, frames: &[u64], ksm: bool) -> Result<Flagged, TrackError> {
        let mut out = Flagged::default();
        for (lo, hi) in runs(frames) {
            let mut flags = vec![0; (hi - lo + 1) as usize];
            self.kpageflags.read_all_words(lo, &mut flags)?;
            let from = frames.partition_point(|&f| f < lo);
            let to = frames.partition_point(|&f| f <= hi);
            for &f in &frames[from..to] {
                let flags = flags[(f - lo) as usize];
                if flags & KPF_COMPOUND_TAIL != 0 {
                    out.tails.push(f);
                }
                if ksm && flags & KPF_KSM != 0 || flags & KPF_ANON == 0 {
                    out.shared.push(f);
                }
            }
        }
        Ok(out)
    }
}

/// Whether a process may have pages KSM merged, by its `ksm_merging_pages` file (Linux
/// 5.19): not when it says 0. Debian's 6.12 kernel sets KPF_KSM on every anonymous page
/// (seen in the test guest, 6.12.118), which would make all of them shared, never cold;
/// a process none of whose pages KSM merged shows that flag wrongly. Where the file is
/// missing (older kernels, which set the flag right) or unreadable, the flag is believed.
fn may_have_ksm_pages(ksm_merging_pages: &Path) -> bool {
    std::fs::read_to_string(ksm_merging_pages)
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
        .is_none_or(|pages| pages > 0)
}

/// Whether `addr` lies in one of the sorted, disjoint `ranges`.
fn within(ranges: &[std::ops::Range<u64>], addr: u64) -> bool {
    let i = ranges.partition_point(|r| r.end <= addr);
    ranges.get(i).is_some_and(|r| r.start <= addr)
}

/// What idle page tracking's `bitmap` says of a chunk's pages (their `frames`, the
/// sorted distinct `present` ones and what kpageflags says of them; `before` the frame
/// and state of the page before the chunk, updated to its last), marking every
/// resident frame idle again.
fn idle_seen(
    bitmap: &Named,
    frames: &[Option<u64>],
    present: &[u64],
    Flagged { tails, shared }: &Flagged,
    before: &mut Option<(u64, Seen)>,
) -> Result<Vec<Seen>, TrackError> {
    // Idle flags are kept on a compound page's head only: its tails read as not idle
    // and cannot be marked (idle_page_tracking.rst). Pages others map too — merged by
    // KSM, or not anonymous (a clone's template, shared memory) — count as accessed
    // and are not marked: another tracker's scan of the same frame marks it idle
    // again and would make it look cold here, and giving one up frees nothing.
    let heads: Vec<u64> = present
        .iter()
        .copied()
        .filter(|f| tails.binary_search(f).is_err() && shared.binary_search(f).is_err())
        .collect();
    let mut words: Vec<u64> = heads.iter().map(|f| f / 64).collect();
    words.dedup();
    // The kernel answers whole words below its highest frame only: the last word,
    // when that frame is not at a word's end, reads as nothing (and writes as nothing,
    // though its frames are marked) (mm/page_idle.c). Its frames count as accessed.
    let mut bits: Vec<Option<u64>> = vec![None; words.len()];
    for (lo, hi) in runs(&words) {
        let mut run = vec![0; (hi - lo + 1) as usize];
        let read = bitmap.read_words(lo, &mut run)?;
        let from = words.partition_point(|&w| w < lo);
        let to = words.partition_point(|&w| w <= hi);
        for (k, w) in words[from..to].iter().enumerate() {
            let i = (w - lo) as usize;
            bits[from + k] = (i < read).then_some(run[i]);
        }
    }
    let idle = |f: u64| {
        let k = words.binary_search(&(f / 64)).expect("word read");
        bits[k].is_some_and(|b| b >> (f % 64) & 1 == 1)
    };
    // A tail takes its head's state from the frame before it, the page before it
    // when mapped in order (a huge page mapped whole); otherwise it is taken as
    // accessed, never as cold.
    let seen: Vec<Seen> = frames
        .iter()
        .map(|frame| {
            let s = match *frame {
                None => Seen::Absent,
                Some(f) if shared.binary_search(&f).is_ok() => Seen::Accessed,
                Some(f) if tails.binary_search(&f).is_ok() => match *before {
                    Some((b, s)) if b + 1 == f => s,
                    _ => Seen::Accessed,
                },
                Some(f) if idle(f) => Seen::Idle,
                Some(_) => Seen::Accessed,
            };
            *before = frame.map(|f| (f, s));
            s
        })
        .collect();
    // Mark every resident frame idle again (writing a set bit marks; a clear one does
    // nothing, so gaps in a run are written as zeros).
    let mut marks = vec![0u64; words.len()];
    for f in heads {
        let k = words.binary_search(&(f / 64)).expect("word read");
        marks[k] |= 1 << (f % 64);
    }
    for (lo, hi) in runs(&words) {
        let mut run = vec![0; (hi - lo + 1) as usize];
        let from = words.partition_point(|&w| w < lo);
        let to = words.partition_point(|&w| w <= hi);
        for k in from..to {
            run[(words[k] - lo) as usize] = marks[k];
        }
        bitmap.write_words(lo, &run)?;
    }
    Ok(seen)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_memory::Buffer;
    use proptest::prelude::*;
    use Seen::*;

    fn fixture(name: &str) -> Vec<u64> {
        let path = format!(
            "{}/tests/data/proc/pagemap/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        let bytes = std::fs::read(path).unwrap();
        bytes
            .chunks_exact(8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn ksm_flags_are_believed_unless_the_process_says_ksm_merged_none_of_its_pages() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("ksm_merging_pages");
        assert!(may_have_ksm_pages(&file), "no file: an older kernel");
        for (text, may) in [("0\n", false), ("12\n", true), ("?\n", true)] {
            std::fs::write(&file, text).unwrap();
            assert_eq!(may_have_ksm_pages(&file), may, "{text:?}");
        }
    }

    #[test]
    fn pagemap_entries_give_frames_of_present_pages_only() {
        // Captured on x86-64 (little-endian): 8 anonymous pages, pages 0, 1 and 5 written.
        let frames: Vec<_> = fixture("root.bin").into_iter().map(present_frame).collect();
        assert_eq!(
            frames,
            [
                Some(0x33ec03),
                Some(0x417522),
                None,
                None,
                None,
                Some(0x59ecc4),
                None,
                None
            ]
        );
        // The same read without CAP_SYS_ADMIN: present, frame numbers zeroed.
        let hidden: Vec<_> = fixture("unprivileged.bin")
            .into_iter()
            .map(present_frame)
            .collect();
        assert_eq!(hidden[..2], [Some(0), Some(0)]);
        assert_eq!(hidden[5], Some(0));
        // Swapped out (bit 62, swap type and offset in bits 0–54): not in memory.
        assert_eq!(present_frame(1 << 62 | 0x1234 << 5 | 3), None);
    }

    #[test]
    fn maps_give_private_writable_ranges() {
        let maps = "\
55d0c8a00000-55d0c8a21000 r--p 00000000 08:01 131 /usr/bin/qemu-system-x86_64
55d0c8c21000-55d0c8c42000 rw-p 00221000 08:01 131 /usr/bin/qemu-system-x86_64
7f2a40000000-7f2a50000000 rw-p 00000000 00:00 0
7f2a50000000-7f2a50200000 rw-s 00000000 00:01 7 /memfd:ram (deleted)
7ffd1c3de000-7ffd1c3ff000 rw-p 00000000 00:00 0                          [stack]
garbage
";
        assert_eq!(
            private_writable(maps),
            [
                0x55d0c8c21000..0x55d0c8c42000,
                0x7f2a40000000..0x7f2a50000000,
                0x7ffd1c3de000..0x7ffd1c3ff000
            ]
        );
        let ram = Mappings::GuestRam(vec![Bytes::from_mib(256)]);
        assert!(ram.wants(&(0x7f2a40000000..0x7f2a50000000)));
        assert!(!ram.wants(&(0x7ffd1c3de000..0x7ffd1c3ff000)));
    }

    #[test]
    fn a_samples_guest_ram_is_its_connectors_mappings_else_worked_out_from_its_sizes() {
        let mut sample = memtide_core::testkit::vm("a", 384, 384, 100)
            .sample
            .unwrap();
        let mib = Bytes::from_mib;
        assert_eq!(Mappings::of(&sample), Mappings::GuestRam(vec![mib(384)]));
        sample.virtio_mem = Some(memtide_core::VirtioMem {
            plugged: mib(64),
            requested: mib(64),
            max: mib(256),
            offline: None,
        });
        let ram = Mappings::of(&sample);
        assert_eq!(ram, Mappings::GuestRam(vec![mib(128), mib(256)]));
        assert_eq!(ram.guest_ram(), Some(mib(384)));
        // The mappings a connector names (a DIMM's among them) go before the sizes.
        sample.ram_mappings = vec![mib(64), mib(64), mib(256)];
        assert_eq!(
            Mappings::of(&sample),
            Mappings::GuestRam(vec![mib(64), mib(64), mib(256)])
        );
        // Each mapping to 2 MiB of alignment; not one of the configured size.
        let at = |size: Bytes| 0x7f00_0000_0000..0x7f00_0000_0000 + size.0;
        assert!(ram.wants(&at(mib(128))) && ram.wants(&at(mib(258))));
        assert!(!ram.wants(&at(mib(384))) && !ram.wants(&at(mib(127))));
    }

    #[test]
    fn ages_count_idle_scans_and_reset_on_access_or_absence() {
        let mut ages = vec![UNMARKED; 4];
        // First scan: nothing was marked, so every resident page counts as accessed.
        assert_eq!(age(&mut ages, [Idle, Accessed, Absent, Idle]), 3);
        assert_eq!(ages, [0, 0, UNMARKED, 0]);
        assert_eq!(age(&mut ages, [Idle, Accessed, Idle, Idle]), 2);
        assert_eq!(ages, [1, 0, 0, 1]);
        assert_eq!(age(&mut ages, [Idle, Idle, Idle, Absent]), 0);
        assert_eq!(ages, [2, 1, 1, UNMARKED]);
        assert_eq!(cold_pages(&ages, 1), 3);
        assert_eq!(cold_pages(&ages, 2), 1);
        let mut old = vec![OLDEST];
        age(&mut old, [Idle]);
        assert_eq!(old, [OLDEST], "ages saturate");
    }

    #[test]
    fn the_cold_age_is_counted_in_scans_from_their_times() {
        let s = Duration::from_secs;
        let mut clock = ColdClock::new(s(120));
        // Scans every 30 s: an age of 4 (marked 120 s ago) spans the cold age at 120 s.
        assert_eq!(clock.tick(s(0)), None);
        assert_eq!(clock.tick(s(30)), None);
        assert_eq!(clock.tick(s(60)), None);
        assert_eq!(clock.tick(s(90)), None);
        assert_eq!(clock.tick(s(120)), Some(4));
        assert_eq!(clock.tick(s(150)), Some(4));
        // Shorter ages, for a VM whose own is shorter than the clock's: 60 s is 2 scans
        // back, and an age longer than the clock's is not spanned.
        assert_eq!(clock.spanning(s(60)), Some(2));
        assert_eq!(clock.spanning(s(61)), Some(3));
        assert_eq!(clock.spanning(s(120)), Some(4));
        assert_eq!(clock.spanning(s(200)), None);
        // A late scan: 3 scans back (105 s ago) is not enough, 4 (135 s) is.
        assert_eq!(clock.tick(s(195)), Some(4));
        // A long gap: the previous scan alone spans it.
        assert_eq!(clock.tick(s(400)), Some(1));
    }

    #[test]
    fn runs_close_small_gaps() {
        assert_eq!(runs(&[]), []);
        assert_eq!(runs(&[3, 4, 12, 21, 100]), [(3, 12), (21, 21), (100, 100)]);
    }

    /// A file standing in for the idle bitmap in `mm` (this host's kernel has none): a bit
    /// for every frame of up to 1 TiB of RAM, sparse, keeping every mark.
    fn stand_in_bitmap(mm: &Path) -> std::path::PathBuf {
        let bitmap = mm.join("bitmap");
        File::create(&bitmap)
            .unwrap()
            .set_len((1 << 40) / 4096 / 8)
            .unwrap();
        bitmap
    }

    /// The real pagemap and kpageflags of this process, with a file standing in for the
    /// idle bitmap (this host's kernel has none): the tracker reads and marks the bits of
    /// the right frames, and a frame whose bit is cleared — as the kernel clears it on an
    /// access — counts as accessed and starts its age over.
    #[test]
    #[ignore = "reads page frame numbers: needs root"]
    fn a_scan_reads_and_marks_the_idle_bits_of_the_mappings_frames() {
        let sys = tempfile::tempdir().unwrap();
        let mm = sys.path().join("kernel/mm/page_idle");
        std::fs::create_dir_all(&mm).unwrap();
        let open = |method| {
            Tracker::open(
                Path::new("/proc"),
                sys.path(),
                std::process::id() as i32,
                Mappings::Private,
                Duration::from_secs(2),
                method,
            )
            .err()
            .unwrap()
        };
        let err = open(Method::IdlePages);
        assert!(matches!(err, TrackError::Unsupported(_)), "{err}");
        assert!(
            err.to_string().contains("CONFIG_IDLE_PAGE_TRACKING"),
            "{err}"
        );
        // Neither DAMON: both said.
        let err = open(Method::Auto);
        assert!(matches!(err, TrackError::Neither { .. }), "{err}");
        assert!(
            err.to_string().contains("CONFIG_IDLE_PAGE_TRACKING")
                && err.to_string().contains("CONFIG_DAMON_SYSFS"),
            "{err}"
        );
        let bitmap = stand_in_bitmap(&mm);
        // 38 MiB, tracked as guest RAM of 37 MiB (to 2 MiB): sizes no other mapping of
        // the test process has.
        let pages = 38 * 256;
        let buffer = Buffer::new(pages);
        let mut tracker = Tracker::open(
            Path::new("/proc"),
            sys.path(),
            std::process::id() as i32,
            Mappings::GuestRam(vec![Bytes::from_mib(37)]),
            Duration::from_secs(2),
            Method::IdlePages,
        )
        .unwrap();
        let s = Duration::from_secs;
        let first = match tracker.scan(s(0)) {
            Err(e @ TrackError::NoFrames(_)) => {
                panic!("{e}: this test reads page frame numbers, it needs root")
            }
            scan => scan.unwrap(),
        };
        let size = Bytes((pages * 4096) as u64);
        assert_eq!(
            first,
            Scan {
                accessed: None,
                cold: None,
                cold_scans: None,
                resident: size
            }
        );
        // The stand-in bitmap keeps the marks: every page was idle since.
        let idle = tracker.scan(s(1)).unwrap();
        assert_eq!(idle.accessed, Some(Bytes::ZERO));
        assert_eq!(idle.cold, None);
        // Clear the bits of the buffer's first 100 pages, as accesses would.
        let pagemap = File::open("/proc/self/pagemap").unwrap();
        let bits = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&bitmap)
            .unwrap();
        for p in 0..100 {
            let mut e = [0; 8];
            pagemap
                .read_exact_at(&mut e, (buffer.at as u64 / 4096 + p) * 8)
                .unwrap();
            let frame = present_frame(u64::from_ne_bytes(e)).unwrap();
            let mut w = [0; 8];
            bits.read_exact_at(&mut w, frame / 64 * 8).unwrap();
            let word = u64::from_ne_bytes(w);
            assert_eq!(word >> (frame % 64) & 1, 1, "page {p}'s frame marked idle");
            bits.write_all_at(&(word & !(1 << (frame % 64))).to_ne_bytes(), frame / 64 * 8)
                .unwrap();
        }
        let touched = tracker.scan(s(2)).unwrap();
        assert_eq!(touched.accessed, Some(Bytes(100 * 4096)));
        // Idle since the first scan, 2 s ago: cold, but for the 100 pages accessed.
        assert_eq!(touched.cold, Some(Bytes((pages as u64 - 100) * 4096)));
        assert_eq!(touched.resident, size);
        // Page by page: the 100 pages accessed are of age 0, the others idle two scans.
        let ages: Vec<Page> = tracker.pages().collect();
        assert_eq!(ages.len(), pages);
        for (p, page) in ages.iter().enumerate() {
            assert_eq!(page.addr, buffer.at as u64 + p as u64 * 4096);
            assert_eq!(page.age, if p < 100 { 0 } else { 2 }, "page {p}");
            assert!(!page.shared, "page {p}: anonymous, this process's only");
        }
        // The mapping shrinks by 1 MiB: the pages left keep their ages.
        // SAFETY: the buffer's last MiB, which nothing refers to.
        assert_eq!(
            unsafe { libc::munmap(buffer.at.add(37 << 20).cast(), 1 << 20) },
            0
        );
        let shrunk = tracker.scan(s(3)).unwrap();
        assert_eq!(shrunk.resident, Bytes(37 << 20));
        assert_eq!(shrunk.accessed, Some(Bytes::ZERO));
        // Two scans back (2 s) reach the cold age now; the 100 pages are one scan old.
        assert_eq!(shrunk.cold, Some(Bytes((37 << 20) - 100 * 4096)));
        // A second mapping tracked from the next scan (a DIMM plugged): 43 MiB, tracked
        // as 42 (to 2 MiB). Its pages are newly resident: accessed, of age 0. (The
        // first's are not checked here: marking the second's frames writes zeros over
        // the stand-in's bits of the first's frames that share their words, where the
        // kernel's bitmap ignores them.)
        let plugged = Buffer::new(43 * 256);
        // Flags of its own, so that the kernel does not merge it with the first where
        // placed beside it.
        // SAFETY: the buffer's own mapping.
        assert_eq!(
            unsafe { libc::madvise(plugged.at.cast(), 43 << 20, libc::MADV_DONTFORK) },
            0
        );
        tracker.set_mappings(Mappings::GuestRam(vec![
            Bytes::from_mib(37),
            Bytes::from_mib(42),
        ]));
        let both = tracker.scan(s(4)).unwrap();
        assert_eq!(both.resident, Bytes((37 + 43) << 20));
        assert!(both.accessed >= Some(Bytes(43 << 20)), "{both:?}");
        let at = plugged.at as u64..plugged.at as u64 + (43 << 20);
        let new: Vec<Page> = tracker.pages().filter(|p| at.contains(&p.addr)).collect();
        assert_eq!(new.len(), 43 * 256);
        assert!(new.iter().all(|p| p.age == 0));
        drop(plugged);
        drop(buffer);
        let gone = tracker.scan(s(5)).err().unwrap();
        assert!(matches!(gone, TrackError::NoMapping(..)), "{gone}");
        assert_eq!(tracker.pages().count(), 0, "nothing after a failed scan");
    }

    /// The real pagemap and kpageflags of this process, with a tree standing in for
    /// DAMON's sysfs interface: pages of the regions DAMON found accessed since the
    /// previous scan start their age over, the others age, and pages DAMON's regions
    /// cover but that are not in memory count for nothing.
    #[test]
    #[ignore = "reads page frame numbers: needs root"]
    fn with_damon_the_regions_accessed_since_the_previous_scan_set_the_pages_ages() {
        let sys = tempfile::tempdir().unwrap();
        let admin = damon::admin_dir(sys.path());
        crate::damon::tests::fake_kdamonds(&admin, 1);
        // 34 MiB, tracked as guest RAM of 33 MiB (to 2 MiB): 30 MiB written, 4 not.
        let pages = 34 * 256;
        let buffer = Buffer::new(pages);
        // SAFETY: the buffer's last 4 MiB, given back.
        let unbacked = unsafe { buffer.at.add(30 << 20) };
        assert_eq!(
            unsafe { libc::madvise(unbacked.cast(), 4 << 20, libc::MADV_DONTNEED) },
            0
        );
        let mut tracker = Tracker::open(
            Path::new("/proc"),
            sys.path(),
            std::process::id() as i32,
            Mappings::GuestRam(vec![Bytes::from_mib(33)]),
            Duration::from_secs(4),
            Method::Auto,
        )
        .unwrap();
        assert_eq!(tracker.method(), Method::Damon);
        let tried = admin.join("kdamonds/0/contexts/0/schemes/0/tried_regions");
        let at = buffer.at as u64;
        let regions = |list: &[(u64, u64, u32, u32)]| {
            let _ = std::fs::remove_dir_all(&tried);
            std::fs::create_dir_all(&tried).unwrap();
            for (i, &(start, end, n, age)) in list.iter().enumerate() {
                let r = tried.join(i.to_string());
                std::fs::create_dir(&r).unwrap();
                for (f, v) in [
                    ("start", start),
                    ("end", end),
                    ("nr_accesses", n.into()),
                    ("age", age.into()),
                ] {
                    std::fs::write(r.join(f), v.to_string()).unwrap();
                }
            }
        };
        let mib = |m: u64| m << 20;
        let s = Duration::from_secs;
        regions(&[(at, at + mib(34), 0, 0)]);
        let first = match tracker.scan(s(0)) {
            Err(e @ TrackError::NoFrames(_)) => {
                panic!("{e}: this test reads page frame numbers, it needs root")
            }
            scan => scan.unwrap(),
        };
        assert_eq!(first.resident, Bytes(mib(30)));
        assert_eq!(first.accessed, None);
        // Two seconds on: the first 2 MiB accessed in the last aggregation interval, the
        // next 2 MiB idle for only 1 s (accessed within the 2 s), the rest idle for 10 s
        // (longer than the kdamond has run: aged from its start).
        // (Regions are taken as no older than the kdamond, which has run for as long.)
        std::thread::sleep(Duration::from_millis(2_500));
        let idle_1s = (1_000 / damon::AGGREGATION.as_millis()) as u32;
        regions(&[
            (at + mib(4), at + mib(34), 0, 50),
            (at, at + mib(2), 7, 3),
            (at + mib(2), at + mib(4), 0, idle_1s),
        ]);
        let second = tracker.scan(s(2)).unwrap();
        assert_eq!(second.accessed, Some(Bytes(mib(4))));
        let ages: Vec<u16> = tracker.pages().map(|p| p.age).collect();
        assert_eq!(ages.len(), pages - 4 * 256, "resident pages only");
        assert!(ages[..4 * 256].iter().all(|&a| a == 0));
        assert!(ages[4 * 256..].iter().all(|&a| a == 1));
        // Four seconds in, all idle since: the pages idle since the first scan are cold.
        regions(&[(at, at + mib(34), 0, 50)]);
        let third = tracker.scan(s(4)).unwrap();
        assert_eq!(third.accessed, Some(Bytes::ZERO));
        assert_eq!(third.cold, Some(Bytes(mib(26))));
        assert_eq!(
            std::fs::read_to_string(admin.join("kdamonds/0/contexts/0/targets/0/pid_target"))
                .unwrap(),
            std::process::id().to_string()
        );
        drop(tracker);
        assert_eq!(
            std::fs::read_to_string(admin.join("kdamonds/nr_kdamonds")).unwrap(),
            "0"
        );
        drop(buffer);
    }

    /// Pages a clone shares with its template — a private file mapping's pages it has
    /// only read, page cache other mappings hold too — are never cold and never marked;
    /// the pages it wrote (copied on write, anonymous) are tracked.
    #[test]
    #[ignore = "reads page frame numbers: needs root"]
    fn pages_shared_with_other_mappings_are_never_cold() {
        let sys = tempfile::tempdir().unwrap();
        let mm = sys.path().join("kernel/mm/page_idle");
        std::fs::create_dir_all(&mm).unwrap();
        stand_in_bitmap(&mm);
        // 27 MiB of a template file mapped privately: the first 3 MiB written, the rest
        // read only.
        let pages = 27 * 256;
        let template = tempfile::tempfile().unwrap();
        template.set_len((pages * 4096) as u64).unwrap();
        let len = pages * 4096;
        // SAFETY: a fresh private mapping of a file of that length, unmapped below.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE,
                std::os::fd::AsRawFd::as_raw_fd(&template),
                0,
            )
        };
        assert_ne!(at, libc::MAP_FAILED);
        let written = 3 * 256;
        // SAFETY: within the mapping just made.
        unsafe {
            for p in 0..pages {
                let page = at.cast::<u8>().add(p * 4096);
                if p < written {
                    page.write_volatile(1);
                } else {
                    page.read_volatile();
                }
            }
        }
        let mut tracker = Tracker::open(
            Path::new("/proc"),
            sys.path(),
            std::process::id() as i32,
            Mappings::GuestRam(vec![Bytes::from_mib(26)]),
            Duration::from_secs(1),
            Method::IdlePages,
        )
        .unwrap();
        let s = Duration::from_secs;
        let scans = (0..3).map(|t| tracker.scan(s(t))).collect::<Vec<_>>();
        let seen: Vec<Page> = tracker.pages().collect();
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(at, len) };
        let last = match scans.into_iter().last().unwrap() {
            Err(e @ TrackError::NoFrames(_)) => {
                panic!("{e}: this test reads page frame numbers, it needs root")
            }
            scan => scan.unwrap(),
        };
        // The written pages are the process's own; the read ones are reported shared
        // (placement leaves them where they are: move_pages(2) refuses them).
        assert_eq!(seen.len(), pages);
        for (p, page) in seen.iter().enumerate() {
            assert_eq!(page.addr, at as u64 + (p * 4096) as u64);
            assert_eq!(page.shared, p >= written, "page {p}");
        }
        // Only the written pages went idle for the cold age: the read ones, the
        // template's page cache, count as accessed at every scan.
        assert_eq!(last.cold, Some(Bytes((written * 4096) as u64)));
        assert_eq!(
            last.accessed,
            Some(Bytes(((pages - written) * 4096) as u64))
        );
    }

    proptest! {
        /// Against the definitions, page by page: a page is cold when it is in memory and
        /// some earlier scan at least the cold age ago found it in memory (and marked it)
        /// and every scan since found it idle; it was accessed when it is in memory and
        /// the previous scan did not find it in memory or this one did not find it idle.
        #[test]
        fn cold_and_accessed_match_their_definitions(
            scans in prop::collection::vec(
                (0u64..90, prop::collection::vec(0u8..3, 6)),
                1..40,
            ),
            cold_age in 0u64..300,
        ) {
            let mut clock = ColdClock::new(Duration::from_secs(cold_age));
            let mut ages = vec![UNMARKED; 6];
            let (mut times, mut history) = (Vec::new(), Vec::<Vec<Seen>>::new());
            let mut t = 0;
            for (step, pages) in scans {
                t += step;
                let seen: Vec<Seen> =
                    pages.iter().map(|&p| [Absent, Idle, Accessed][p as usize]).collect();
                let accessed = age(&mut ages, seen.iter().copied());
                times.push(t);
                history.push(seen.clone());
                let k = history.len() - 1;
                let expected_accessed = (0..6)
                    .filter(|&p| {
                        seen[p] != Absent
                            && (k == 0 || history[k - 1][p] == Absent || seen[p] != Idle)
                    })
                    .count() as u64;
                prop_assert_eq!(accessed, expected_accessed);
                let cold = clock
                    .tick(Duration::from_secs(t))
                    .map_or(0, |least| cold_pages(&ages, least));
                let expected_cold = (0..6)
                    .filter(|&p| {
                        seen[p] != Absent
                            && (0..k).any(|j| {
                                t - times[j] >= cold_age
                                    && history[j][p] != Absent
                                    && (j + 1..=k).all(|i| history[i][p] == Idle)
                            })
                    })
                    .count() as u64;
                prop_assert_eq!(cold, expected_cold);
            }
        }
    }
}
