//! One process's pages placed between a fast and a slow NUMA node, an interval at a
//! time: the step `memtide place` and the daemon's placement pass share. Each interval
//! the access tracker scans the process's mappings, move_pages(2) says which node holds
//! each resident page ([`Placer::measure`]); the caller asks `tiering::place` how much
//! to demote and promote (for one process, or for every VM together); and
//! [`Placer::carry_out`] picks the pages (`tiering::pick_pages`: the longest untouched
//! fast pages down, the slow pages accessed since the previous scan up) and moves them.

use anyhow::Context;
use memtide_adapters::access::{Mappings, Tracker};
use memtide_adapters::{migrate, tiers};
use memtide_core::tiering::{self, PageCounts, PageTier, Placement, TierVm};
use memtide_core::Bytes;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

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

/// Free memory on node `node` (its sysfs `meminfo`'s `MemFree`).
pub fn free_on(sys: &Path, node: i32) -> anyhow::Result<Bytes> {
    let meminfo = sys.join(format!("devices/system/node/node{node}/meminfo"));
    std::fs::read_to_string(&meminfo)
        .map(|t| tiers::node_meminfo(&t).1)
        .with_context(|| meminfo.display().to_string())
}

/// A process's pages, tracked from one interval to the next.
pub struct Placer {
    pid: i32,
    nodes: Nodes,
    proc: PathBuf,
    tracker: Tracker,
}

/// What an interval's scan found.
pub struct Measured {
    /// The first scan: it only marks pages for the tracker, and nothing is moved.
    pub first: bool,
    /// The resident pages by tier and heat (on either node).
    pub counts: PageCounts,
    page: u64,
    addrs: Vec<u64>,
    /// Each page's node, or the kernel's `-errno` (after the moves, their results).
    status: Vec<i32>,
    /// The pages on either node, as indices into `addrs`.
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
            shares,
            configured,
        }
    }

    /// Pages on each node, or by `-errno` (not present, …), after the moves.
    pub fn tally(&self) -> BTreeMap<i32, u64> {
        migrate::tally(&self.status)
    }

    /// Resident pages on neither node, or not present.
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
}

impl Placer {
    /// Track process `pid`'s `mappings` for placement between `nodes`, scanned every
    /// `interval`. Fails when the kernel cannot move its pages (no NUMA, the process
    /// gone, no permission) or cannot track them.
    pub fn open(
        proc: &Path,
        sys: &Path,
        pid: i32,
        mappings: Mappings,
        interval: Duration,
        nodes: Nodes,
    ) -> anyhow::Result<Placer> {
        // Asks the kernel nothing but whether it can: NUMA, the process, the permission.
        migrate::nodes(pid, &[])?;
        let tracker = Tracker::open(proc, sys, pid, mappings, interval)?;
        Ok(Placer {
            pid,
            nodes,
            proc: proc.to_path_buf(),
            tracker,
        })
    }

    /// Scan at `at` (monotonic) and find each resident page's node.
    pub fn measure(&mut self, at: Duration) -> anyhow::Result<Measured> {
        let Nodes { fast, slow } = self.nodes;
        let scan = self.tracker.scan(at).map_err(|e| self.gone(e.into()))?;
        let (addrs, ages): (Vec<u64>, Vec<u16>) = self.tracker.pages().unzip();
        let status = migrate::nodes(self.pid, &addrs).map_err(|e| self.gone(e.into()))?;
        let placed: Vec<usize> = (0..addrs.len())
            .filter(|&i| status[i] == fast || status[i] == slow)
            .collect();
        let pages: Vec<PageTier> = placed
            .iter()
            .map(|&i| PageTier {
                age: ages[i],
                fast: status[i] == fast,
            })
            .collect();
        Ok(Measured {
            first: scan.accessed.is_none(),
            counts: tiering::count_pages(&pages),
            page: self.tracker.page_size(),
            addrs,
            status,
            placed,
            pages,
        })
    }

    /// Move the pages that carry out `placement` (nothing after a first scan), and
    /// record where they went in `m`.
    pub fn carry_out(&self, m: &mut Measured, placement: &Placement) -> anyhow::Result<Moved> {
        let mut moved = Moved::default();
        if m.first {
            return Ok(moved);
        }
        let Nodes { fast, slow } = self.nodes;
        let (down, up) = tiering::pick_pages(
            &m.pages,
            placement.demote.0 / m.page,
            placement.promote.0 / m.page,
        );
        for (chosen, to, count) in [
            (down, slow, &mut moved.demoted),
            (up, fast, &mut moved.promoted),
        ] {
            let which: Vec<usize> = chosen.iter().map(|&k| m.placed[k]).collect();
            let at: Vec<u64> = which.iter().map(|&i| m.addrs[i]).collect();
            let after = migrate::move_to(self.pid, &at, to).map_err(|e| self.gone(e.into()))?;
            for (&i, s) in which.iter().zip(after) {
                if s == to {
                    *count += 1;
                    m.status[i] = s;
                } else {
                    moved.failed += 1;
                }
            }
        }
        Ok(moved)
    }

    /// The process tracked.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// `e`, or that the process is gone when it ended, whatever failed: until it is
    /// reaped, its maps read empty and move_pages fails with EINVAL, not ESRCH.
    fn gone(&self, e: anyhow::Error) -> anyhow::Error {
        if alive(&self.proc, self.pid) {
            e
        } else {
            migrate::MoveError::Gone(self.pid).into()
        }
    }
}

/// Whether process `pid` is there and not a zombie (`/proc/PID/stat`'s state, after the
/// command's closing parenthesis; proc.rst).
fn alive(proc: &Path, pid: i32) -> bool {
    std::fs::read_to_string(proc.join(format!("{pid}/stat"))).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| !matches!(state, "Z" | "X"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zombie_is_not_alive() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        let proc = Path::new("/proc");
        assert!(alive(proc, std::process::id() as i32));
        // Exited, not yet waited for: a zombie until reaped.
        while std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| !s.contains(") Z "))
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!alive(proc, pid));
        child.wait().unwrap();
        assert!(!alive(proc, pid));
    }
}
