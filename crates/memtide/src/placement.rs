//! One process's pages placed between a fast and a slow NUMA node, an interval at a
//! time: the step `memtide place` and the daemon's placement pass share. Each interval
//! the access tracker scans the process's mappings, move_pages(2) says which node holds
//! each resident page ([`Placer::measure`]); the caller asks `tiering::place` how much
//! to demote and promote (for one process, or for every VM together); and
//! [`Placer::carry_out`] picks the pages (`tiering::pick_pages`: the longest untouched
//! fast pages down, of those untouched for the cold age, the slow pages accessed since
//! the previous scan up) and moves them; [`Placer::adapt_age`] then adapts the process's
//! cold age to the pages it demoted that came back (`tiering::age`). The caller keeps the
//! cold age, so that it outlives the tracker (the daemon keeps a VM's across a failed
//! scan).

use anyhow::Context;
use memtide_adapters::access::{Mappings, Method, Tracker};
use memtide_adapters::{migrate, procfs, tiers};
use memtide_core::action::Reason;
use memtide_core::tiering::age::{AgeConfig, ColdAge};
use memtide_core::tiering::{self, PageCounts, PageTier, Placement, TierVm};
use memtide_core::Bytes;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How far back a page's last touch counts it in the working set its promotions are
/// measured against.
const WORKING_SET_SPAN: Duration = Duration::from_secs(60);

/// The fast and the slow tier's NUMA nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Nodes {
    /// The fast tier's node.
    pub fast: i32,
    /// The slow tier's node.
    pub slow: i32,
}

/// Check that `nodes` are two nodes with memory (sysfs at `sys`).
pub fn check_nodes(sys: &Path, nodes: Nodes) -> anyhow::Result<()> {
    let Nodes { fast, slow } = nodes;
    if fast == slow {
        anyhow::bail!("--fast-node and --slow-node are both node {fast}");
    }
    let list = sys.join("devices/system/node/has_memory");
    let text = std::fs::read_to_string(&list)
        .with_context(|| format!("{}: no NUMA nodes to place pages on", list.display()))?;
    let with_memory = tiers::parse_list(&text)
        .with_context(|| format!("{}: not a node list: {text:?}", list.display()))?;
    for node in [fast, slow] {
        if !u32::try_from(node).is_ok_and(|n| with_memory.contains(&n)) {
            anyhow::bail!(
                "node {node} has no memory ({} lists {})",
                list.display(),
                text.trim()
            );
        }
    }
    Ok(())
}

/// Why placement would fight the kernel, if it would: automatic NUMA balancing on
/// (`kernel.numa_balancing`, procfs at `proc`) moves pages toward the CPUs that touch
/// them (mode 1) or promotes slow-tier pages it finds hot (mode 2) behind memtide's
/// placement: a hot page memtide keeps on the slow node is pulled to the CPU's node, and
/// placement moves it back (seen in a test guest booting Debian's 6.12 kernel, which has
/// it on by default). `None` where it is off or the kernel has none.
pub fn numa_balancing_fights(proc: &Path) -> Option<String> {
    let path = proc.join("sys/kernel/numa_balancing");
    let mode = std::fs::read_to_string(&path).ok()?;
    let mode = mode.trim();
    (mode != "0").then(|| {
        format!(
            "automatic NUMA balancing is on ({} is {mode}): the kernel moves pages behind \
             memtide's placement (toward the CPUs that touch them, or up from the slow \
             tier), and placement moves them back; set kernel.numa_balancing = 0 where \
             memtide places pages",
            path.display()
        )
    })
}

/// Free memory on node `node` that pages may be moved into: its sysfs `meminfo`'s
/// `MemFree` above its zones' high watermarks (`proc`'s zoneinfo; none taken where it
/// cannot be read). Below the low watermark kswapd reclaims, and the memory it would
/// take is other VMs' and the host's: moves never take the node there.
pub fn free_on(proc: &Path, sys: &Path, node: i32) -> anyhow::Result<Bytes> {
    let meminfo = sys.join(format!("devices/system/node/node{node}/meminfo"));
    let free = std::fs::read_to_string(&meminfo)
        .map(|t| tiers::node_meminfo(&t).1)
        .with_context(|| meminfo.display().to_string())?;
    let kept = std::fs::read_to_string(proc.join("zoneinfo"))
        .ok()
        .and_then(|t| procfs::zoneinfo_high_pages_on(&t, node))
        .map_or(Bytes::ZERO, |pages| {
            Bytes(pages.saturating_mul(procfs::page_size()))
        });
    Ok(free - kept)
}

/// A process's pages, tracked from one interval to the next.
pub struct Placer {
    pid: i32,
    /// The process's start time (clock ticks after boot): a pid reused by another
    /// process, or the process restarted under it, shows another.
    started: u64,
    nodes: Nodes,
    proc: PathBuf,
    tracker: Tracker,
    /// The cold-age settings.
    ages: AgeConfig,
    /// The pages this placer moved to the slow node: their promotions are the SLO's.
    demoted: Marks,
    /// The latest scan's time, and the time since the one before it (s).
    scanned: Option<Duration>,
    interval_s: f64,
}

/// A mark per page number, kept as bits in chunks of [`Marks::CHUNK`] pages allocated
/// when a page in them is first marked: 4 KiB for 128 MiB of 4 KiB pages.
#[derive(Default)]
struct Marks(HashMap<u64, Box<[u64; 512]>>);

impl Marks {
    const CHUNK: u64 = 512 * 64;

    fn mark(&mut self, page: u64) {
        let words = self
            .0
            .entry(page / Self::CHUNK)
            .or_insert_with(|| Box::new([0; 512]));
        words[(page % Self::CHUNK / 64) as usize] |= 1 << (page % 64);
    }

    /// Whether `page` was marked; it is not any more.
    fn take(&mut self, page: u64) -> bool {
        let Some(words) = self.0.get_mut(&(page / Self::CHUNK)) else {
            return false;
        };
        let (word, bit) = ((page % Self::CHUNK / 64) as usize, 1 << (page % 64));
        let was = words[word] & bit != 0;
        words[word] &= !bit;
        was
    }

    /// Keep only the marks of `pages`, those a scan found on the slow node: a demoted
    /// page found elsewhere, or not at all (discarded by the balloon or free page
    /// reporting, unplugged, moved by the kernel), did not come back through placement,
    /// and its address may hold another page later (found in review: such a page,
    /// promoted, counted as a return). Chunks left empty are freed.
    fn keep_only(&mut self, pages: impl Iterator<Item = u64>) {
        let mut kept = Marks::default();
        for page in pages {
            if self.take(page) {
                kept.mark(page);
            }
        }
        *self = kept;
    }
}

/// What an interval's scan found.
pub struct Measured {
    /// The first scan: it only marks pages for the tracker, and nothing is moved.
    pub first: bool,
    /// The resident pages by tier and heat (on either node).
    pub counts: PageCounts,
    /// The least age (scans) that spans the cold age; `None` until the scans span it.
    least: Option<u16>,
    /// The process's cold age (s).
    age_s: f64,
    page: u64,
    addrs: Vec<u64>,
    /// Each page's node, or the kernel's `-errno` (after the moves, their results).
    status: Vec<i32>,
    /// The pages on either node that can be moved (not shared), as indices into
    /// `addrs`.
    placed: Vec<usize>,
    /// How placement sees them, in `placed`'s order.
    pages: Vec<PageTier>,
}

impl Measured {
    /// The process as `tiering::place` sees it.
    pub fn vm<'a>(&self, name: &'a str, shares: u32, configured: Option<Bytes>) -> TierVm<'a> {
        let c = &self.counts;
        TierVm {
            name,
            resident: Bytes((c.fast + c.slow) * self.page),
            fast: Bytes(c.fast * self.page),
            hot: Bytes(c.hot * self.page),
            hot_on_slow: Bytes(c.hot_on_slow * self.page),
            // Which frames the guest has free is not known here (page ages only: free
            // page reporting would tell): none are kept out of demotion.
            free_fast: Bytes::ZERO,
            aged: Bytes(c.aged * self.page),
            cold_age_s: self.age_s,
            shares,
            configured,
        }
    }

    /// Pages on each node, or by `-errno` (not present, …), after the moves.
    pub fn tally(&self) -> BTreeMap<i32, u64> {
        migrate::tally(&self.status)
    }

    /// Resident pages on neither node, not present, or shared with other processes
    /// (left where they are).
    pub fn other(&self) -> usize {
        self.addrs.len() - self.placed.len()
    }

    /// Memory on node `node`, after the moves.
    pub fn on(&self, node: i32) -> Bytes {
        Bytes(self.tally().get(&node).copied().unwrap_or(0) * self.page)
    }

    /// The size of a page in bytes.
    pub fn page_size(&self) -> u64 {
        self.page
    }

    /// A scan that found `counts` in pages of `page` bytes, with no page to move.
    #[cfg(test)]
    pub fn found(first: bool, counts: PageCounts, page: u64) -> Measured {
        Measured {
            first,
            counts,
            least: None,
            age_s: 0.0,
            page,
            addrs: Vec::new(),
            status: Vec::new(),
            placed: Vec::new(),
            pages: Vec::new(),
        }
    }
}

/// Pages moved by an interval.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Moved {
    /// Pages moved to the slow node.
    pub demoted: u64,
    /// Pages moved to the fast node.
    pub promoted: u64,
    /// Pages the kernel did not move.
    pub failed: u64,
    /// Of the promoted pages, those this placer had demoted.
    pub returned: u64,
}

impl Placer {
    /// Track process `pid`'s `mappings` by `method` for placement between `nodes`, demoting pages
    /// only once untouched for its cold age (`ages`: from the least, 0 for whatever is
    /// idle, adapted to its promotions). Fails when the kernel cannot move its pages (no
    /// NUMA, the process gone, no permission) or cannot track them.
    pub fn open(
        proc: &Path,
        sys: &Path,
        pid: i32,
        mappings: Mappings,
        ages: AgeConfig,
        nodes: Nodes,
        method: Method,
    ) -> anyhow::Result<Placer> {
        // Asks the kernel nothing but whether it can: NUMA, the process, the permission.
        migrate::nodes(pid, &[])?;
        let horizon = Duration::try_from_secs_f64(ages.horizon_s()).unwrap_or(Duration::ZERO);
        let tracker = Tracker::open(proc, sys, pid, mappings, horizon, method)?;
        let started = procfs::start_time(proc, pid).ok_or(migrate::MoveError::Gone(pid))?;
        Ok(Placer {
            pid,
            started,
            nodes,
            proc: proc.to_path_buf(),
            tracker,
            ages,
            demoted: Marks::default(),
            scanned: None,
            interval_s: 0.0,
        })
    }

    /// How the process's accesses are tracked.
    pub fn method(&self) -> Method {
        self.tracker.method()
    }

    /// Scan at `at` (monotonic) and find each resident page's node, for demotion under
    /// the process's cold age `age` (0: every page may be demoted, whatever its age).
    pub fn measure(&mut self, at: Duration, age: &ColdAge) -> anyhow::Result<Measured> {
        let fast = self.nodes.fast;
        self.same()?;
        let scan = self.tracker.scan(at).map_err(|e| self.gone(e.into()))?;
        self.interval_s = self
            .scanned
            .map_or(0.0, |before| at.saturating_sub(before).as_secs_f64());
        self.scanned = Some(at);
        let pages: Vec<_> = self.tracker.pages().collect();
        let addrs: Vec<u64> = pages.iter().map(|p| p.addr).collect();
        let ages: Vec<u16> = pages.iter().map(|p| p.age).collect();
        let shared: Vec<bool> = pages.iter().map(|p| p.shared).collect();
        let status = migrate::nodes(self.pid, &addrs).map_err(|e| self.gone(e.into()))?;
        // The scan and the status are of the process opened, not of one that took its pid
        // meanwhile.
        self.same()?;
        let (slow, page) = (self.nodes.slow, self.tracker.page_size());
        self.demoted.keep_only(
            addrs
                .iter()
                .zip(&status)
                .filter(|(_, node)| **node == slow)
                .map(|(addr, _)| addr / page),
        );
        let placed = movable(&status, &shared, self.nodes);
        let pages: Vec<PageTier> = placed
            .iter()
            .map(|&i| PageTier {
                age: ages[i],
                fast: status[i] == fast,
            })
            .collect();
        let age_s = age.age_s();
        let least = match Duration::try_from_secs_f64(age_s) {
            Ok(age) if !age.is_zero() => self.tracker.scans_spanning(age),
            _ => Some(0),
        };
        Ok(Measured {
            first: scan.accessed.is_none(),
            counts: tiering::count_pages(&pages, least),
            least,
            age_s,
            page: self.tracker.page_size(),
            addrs,
            status,
            placed,
            pages,
        })
    }

    /// Move the pages that carry out `placement` (nothing after a first scan), and
    /// record where they went in `m`. Promotions count on the room the demotions make:
    /// as many fewer are made as demotions failed (pinned or busy pages).
    pub fn carry_out(&mut self, m: &mut Measured, placement: &Placement) -> anyhow::Result<Moved> {
        let mut moved = Moved::default();
        if m.first {
            return Ok(moved);
        }
        let (down, mut up) = tiering::pick_pages(
            &m.pages,
            placement.demote.0 / m.page,
            placement.promote.0 / m.page,
            m.least,
        );
        self.move_to(m, &down, self.nodes.slow, &mut moved)?;
        let short = down.len() - moved.demoted as usize;
        up.truncate(up.len().saturating_sub(short));
        self.move_to(m, &up, self.nodes.fast, &mut moved)?;
        Ok(moved)
    }

    /// Move the `chosen` pages of `m` to node `to`, counted in `moved`.
    fn move_to(
        &mut self,
        m: &mut Measured,
        chosen: &[usize],
        to: i32,
        moved: &mut Moved,
    ) -> anyhow::Result<()> {
        let which: Vec<usize> = chosen.iter().map(|&k| m.placed[k]).collect();
        if which.is_empty() {
            return Ok(());
        }
        let at: Vec<u64> = which.iter().map(|&i| m.addrs[i]).collect();
        self.same()?;
        let after = migrate::move_to(self.pid, &at, to).map_err(|e| self.gone(e.into()))?;
        for (&i, s) in which.iter().zip(after) {
            if s != to {
                moved.failed += 1;
                continue;
            }
            m.status[i] = s;
            let page = m.addrs[i] / m.page;
            if to == self.nodes.slow {
                moved.demoted += 1;
                self.demoted.mark(page);
            } else {
                moved.promoted += 1;
                if self.demoted.take(page) {
                    moved.returned += 1;
                }
            }
        }
        Ok(())
    }

    /// Adapt the process's cold age `age` to an interval's moves (`moved`, carried out on
    /// `m`):
    /// the pages it had demoted that came back, over its working set — the pages touched
    /// within the last minute, as the simulator counts it (not those touched since the
    /// last scan, which would make the rate depend on the scan interval: found in review).
    /// The reason says how the age changed and why, `None` when it stayed.
    pub fn adapt_age(&self, age: &mut ColdAge, m: &Measured, moved: &Moved) -> Option<Reason> {
        let returned = Bytes(moved.returned * m.page);
        let minute = self.tracker.scans_spanning(WORKING_SET_SPAN);
        let touched = m
            .pages
            .iter()
            .filter(|p| minute.is_none_or(|scans| p.age < scans))
            .count() as u64;
        let working_set = Bytes(touched * m.page);
        age.observe(&self.ages, returned, working_set, self.interval_s)
    }

    /// The process tracked.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The tracked process's start time (`/proc/PID/stat` field 22).
    pub fn started(&self) -> u64 {
        self.started
    }

    /// Fails unless process `pid` is still the one opened: gone, or another process
    /// (restarted, or its pid reused) with another start time.
    fn same(&self) -> anyhow::Result<()> {
        match procfs::start_time(&self.proc, self.pid) {
            None => Err(migrate::MoveError::Gone(self.pid).into()),
            Some(t) if t == self.started => Ok(()),
            Some(_) => Err(anyhow::anyhow!(
                "process {} is not the one placed (it was restarted or its pid reused)",
                self.pid
            )),
        }
    }

    /// `e`, or that the process is gone when it ended, whatever failed: until it is
    /// reaped, its maps read empty and move_pages fails with EINVAL, not ESRCH.
    fn gone(&self, e: anyhow::Error) -> anyhow::Error {
        if u32::try_from(self.pid).is_ok_and(|pid| procfs::process_runs(&self.proc, pid)) {
            e
        } else {
            migrate::MoveError::Gone(self.pid).into()
        }
    }
}

/// The pages of `status` on either of `nodes` that are not `shared` with other
/// processes: those placement may move.
fn movable(status: &[i32], shared: &[bool], nodes: Nodes) -> Vec<usize> {
    (0..status.len())
        .filter(|&i| !shared[i] && (status[i] == nodes.fast || status[i] == nodes.slow))
        .collect()
}

/// Process `pid`'s command name (`/proc/PID/comm`), or `?`.
pub fn comm(proc: &Path, pid: i32) -> String {
    std::fs::read_to_string(proc.join(format!("{pid}/comm")))
        .map(|c| c.trim_end().to_string())
        .unwrap_or_else(|_| "?".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fast_nodes_free_memory_is_what_is_above_its_high_watermarks() {
        let (proc, sys) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let node0 = sys.path().join("devices/system/node/node0");
        std::fs::create_dir_all(&node0).unwrap();
        std::fs::write(node0.join("meminfo"), "Node 0 MemFree: 1048576 kB\n").unwrap();
        let free = |proc: &Path| free_on(proc, sys.path(), 0).unwrap();
        assert_eq!(
            free(proc.path()),
            Bytes::from_gib(1),
            "no zoneinfo: MemFree"
        );
        let zoneinfo = "Node 0, zone   Normal\n        high     1000\n\
                        Node 1, zone   Normal\n        high     7\n";
        std::fs::write(proc.path().join("zoneinfo"), zoneinfo).unwrap();
        let page = procfs::page_size();
        assert_eq!(free(proc.path()), Bytes::from_gib(1) - Bytes(1000 * page));
        let missing = free_on(proc.path(), sys.path(), 3).unwrap_err();
        assert!(
            format!("{missing:#}").contains("node3/meminfo"),
            "{missing:#}"
        );
    }

    /// A page far into a sixth chunk.
    const FAR: u64 = 5 * Marks::CHUNK + 63;

    /// Marks of pages 0, 64 and [`FAR`]: two chunks.
    fn three_marks() -> Marks {
        let mut marks = Marks::default();
        for page in [0, 64, FAR] {
            marks.mark(page);
        }
        marks
    }

    #[test]
    fn a_demoted_page_counts_once_when_it_comes_back() {
        let (mut marks, far) = (three_marks(), FAR);
        assert_eq!(marks.0.len(), 2, "a chunk per marked range");
        assert!(marks.take(far) && !marks.take(far));
        assert!(marks.take(64) && !marks.take(1) && !marks.take(3 * Marks::CHUNK));
        assert!(marks.take(0));
    }

    #[test]
    fn a_demoted_page_no_longer_on_the_slow_node_is_forgotten() {
        let (mut marks, far) = (three_marks(), FAR);
        // The scan finds 64 on the slow node (and 7, never demoted); 0 and `far` gone.
        marks.keep_only([64, 7].into_iter());
        assert_eq!(marks.0.len(), 1, "the emptied chunk is freed");
        assert!(!marks.take(0) && !marks.take(far) && !marks.take(7));
        assert!(marks.take(64));
    }

    #[test]
    fn shared_pages_and_pages_on_other_nodes_are_not_placed() {
        let nodes = Nodes { fast: 0, slow: 1 };
        let status = [0, 1, 2, -libc::ENOENT, 0, 1];
        let shared = [false, false, false, false, true, true];
        assert_eq!(movable(&status, &shared, nodes), [0, 1]);
    }

    #[test]
    fn automatic_numa_balancing_on_is_said_to_fight_placement() {
        let proc = tempfile::tempdir().unwrap();
        assert_eq!(
            numa_balancing_fights(proc.path()),
            None,
            "a kernel without it"
        );
        let knob = proc.path().join("sys/kernel");
        std::fs::create_dir_all(&knob).unwrap();
        std::fs::write(knob.join("numa_balancing"), "0\n").unwrap();
        assert_eq!(numa_balancing_fights(proc.path()), None);
        for mode in ["1", "2", "3"] {
            std::fs::write(knob.join("numa_balancing"), format!("{mode}\n")).unwrap();
            let why = numa_balancing_fights(proc.path()).unwrap();
            assert!(
                why.contains(&format!("numa_balancing is {mode}"))
                    && why.contains("set kernel.numa_balancing = 0"),
                "{why}"
            );
        }
    }

    /// A placer whose process is not the one it opened (its start time differs, as when
    /// the pid is reused) refuses to scan or move anything.
    #[test]
    fn a_process_with_another_start_time_is_not_placed() {
        let sys = tempfile::tempdir().unwrap();
        let mm = sys.path().join("kernel/mm/page_idle");
        std::fs::create_dir_all(&mm).unwrap();
        std::fs::write(mm.join("bitmap"), b"").unwrap();
        let me = std::process::id() as i32;
        let nodes = Nodes { fast: 0, slow: 1 };
        let open = Placer::open(
            Path::new("/proc"),
            sys.path(),
            me,
            Mappings::Private,
            AgeConfig {
                adaptive: false,
                min_s: 1.0,
                ..AgeConfig::default()
            },
            nodes,
            Method::IdlePages,
        );
        let mut placer = match open {
            Ok(p) => p,
            // No NUMA in this kernel, or no kpageflags to read: nothing to check here.
            Err(e) => return eprintln!("skipped: {e:#}"),
        };
        assert_eq!(
            Some(placer.started()),
            procfs::start_time(Path::new("/proc"), me)
        );
        placer.started += 1;
        let age = ColdAge::new(&placer.ages);
        let why = format!("{:#}", placer.measure(Duration::ZERO, &age).err().unwrap());
        assert_eq!(
            why,
            format!("process {me} is not the one placed (it was restarted or its pid reused)")
        );
        let mut m = Measured {
            first: false,
            counts: PageCounts::default(),
            least: Some(0),
            age_s: 1.0,
            page: 4096,
            addrs: vec![0x1000],
            status: vec![0],
            placed: vec![0],
            pages: vec![PageTier { age: 9, fast: true }],
        };
        let demote = Placement {
            vm: String::new(),
            fast_budget: Bytes::ZERO,
            demote: Bytes(4096),
            demote_free: Bytes::ZERO,
            promote: Bytes::ZERO,
            reason: memtide_core::action::Reason::new("t", "t"),
        };
        let why = format!("{:#}", placer.carry_out(&mut m, &demote).err().unwrap());
        assert!(why.contains("is not the one placed"), "{why}");
        assert_eq!(m.status, [0], "nothing moved");
    }
}
