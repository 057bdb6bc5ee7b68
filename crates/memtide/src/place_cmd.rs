//! `memtide place`: one process's pages placed between a fast and a slow NUMA node in
//! the foreground, a JSON line an interval. Each interval the access tracker scans the
//! process's mappings (all its private writable ones, or a QEMU's guest RAM), move_pages(2) says which node holds each resident page, `tiering::place`
//! decides how much to demote and promote within the fast budget and the rate limit,
//! `tiering::pick_pages` picks the pages (the longest untouched fast pages down, the
//! slow pages accessed since the previous scan up), and move_pages moves them.

use anyhow::{bail, Context};
use memtide_adapters::access::{Mappings, Tracker};
use memtide_adapters::{migrate, tiers};
use memtide_core::tiering::{self, FastTier, PageTier, TierConfig, TierVm};
use memtide_core::Bytes;
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// What to place, where, and for how long.
pub struct Options {
    /// The process.
    pub pid: i32,
    /// The node of the fast tier.
    pub fast_node: i32,
    /// The node of the slow tier.
    pub slow_node: i32,
    /// The most of the process's memory the fast node may hold.
    pub budget: Bytes,
    /// Its mappings to place.
    pub mappings: Mappings,
    /// Between two intervals' scans.
    pub interval: Duration,
    /// Most memory moved a second, demotions and promotions together (MiB/s).
    pub rate_mib_s: f64,
    /// Stop after this many intervals.
    pub count: u64,
    /// The procfs mount.
    pub proc: PathBuf,
    /// The sysfs mount.
    pub sys: PathBuf,
}

/// Place for `options.count` intervals, a line each to `out`:
/// `{"t":…,"nodes":{"0":…,"1":…},"other":…,"hot":…,"fast_budget":…,"demoted":…,
/// "promoted":…,"failed":…,"reason":…}` — pages on each node after the interval's moves
/// (from move_pages' statuses), resident pages on neither node or not present,
/// pages accessed since the previous scan, the budget in bytes, pages moved down and up,
/// pages the kernel did not move. The first interval only marks pages for the tracker
/// and moves nothing.
pub fn run(options: &Options, out: &mut impl Write) -> anyhow::Result<()> {
    let Options {
        pid,
        fast_node: fast,
        slow_node: slow,
        ..
    } = *options;
    if fast == slow {
        bail!("--fast-node and --slow-node are both node {fast}");
    }
    let nodes_dir = options.sys.join("devices/system/node");
    let list = nodes_dir.join("has_memory");
    let text = std::fs::read_to_string(&list)
        .with_context(|| format!("{}: no NUMA nodes to place pages on", list.display()))?;
    let with_memory = tiers::parse_list(&text)
        .with_context(|| format!("{}: not a node list: {text:?}", list.display()))?;
    for node in [fast, slow] {
        if !u32::try_from(node).is_ok_and(|n| with_memory.contains(&n)) {
            bail!(
                "node {node} has no memory ({} lists {})",
                list.display(),
                text.trim()
            );
        }
    }
    // Asks the kernel nothing but whether it can: NUMA, the process, the permission.
    migrate::nodes(pid, &[])?;
    let mut tracker = Tracker::open(
        &options.proc,
        &options.sys,
        pid,
        options.mappings,
        options.interval,
    )?;
    let page = tracker.page_size();
    // A process that ended is said to be gone, whatever failed: until it is reaped, its
    // maps read empty and move_pages fails with EINVAL, not ESRCH.
    let gone = |e: anyhow::Error| {
        if alive(&options.proc, pid) {
            e
        } else {
            migrate::MoveError::Gone(pid).into()
        }
    };
    let meminfo = nodes_dir.join(format!("node{fast}/meminfo"));
    let config = TierConfig {
        margin: 0.0,
        rate_mib_s: options.rate_mib_s,
    };
    let start = Instant::now();
    for n in 0..options.count {
        if n > 0 {
            std::thread::sleep(options.interval);
        }
        let at = start.elapsed();
        let scan = tracker.scan(at).map_err(|e| gone(e.into()))?;
        let (addrs, ages): (Vec<u64>, Vec<u16>) = tracker.pages().unzip();
        let mut status = migrate::nodes(pid, &addrs).map_err(|e| gone(e.into()))?;
        // The pages on either node, as indices into `addrs`, and how placement sees them.
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
        let counts = tiering::count_pages(&pages);
        let free = std::fs::read_to_string(&meminfo)
            .map(|t| tiers::node_meminfo(&t).1)
            .with_context(|| meminfo.display().to_string())?;
        let vm = TierVm {
            name: "",
            resident: Bytes((counts.fast + counts.slow) * page),
            fast: Bytes(counts.fast * page),
            hot: Bytes(counts.hot * page),
            hot_on_slow: Bytes(counts.hot_on_slow * page),
            shares: 1,
            configured: Some(options.budget),
        };
        let tier = FastTier {
            free,
            reserve: Bytes::ZERO,
        };
        let decision = tiering::place(&[vm], tier, config, options.interval.as_secs_f64())
            .pop()
            .expect("one placement for one VM");
        let (mut demoted, mut promoted, mut failed) = (0, 0, 0);
        let reason = if scan.accessed.is_none() {
            "place.first: the first scan only marks pages idle".to_string()
        } else {
            let (down, up) =
                tiering::pick_pages(&pages, decision.demote.0 / page, decision.promote.0 / page);
            for (chosen, to, moved) in [(down, slow, &mut demoted), (up, fast, &mut promoted)] {
                let which: Vec<usize> = chosen.iter().map(|&k| placed[k]).collect();
                let at: Vec<u64> = which.iter().map(|&i| addrs[i]).collect();
                let after = migrate::move_to(pid, &at, to).map_err(|e| gone(e.into()))?;
                for (&i, s) in which.iter().zip(after) {
                    if s == to {
                        *moved += 1;
                        status[i] = s;
                    } else {
                        failed += 1;
                    }
                }
            }
            decision.reason.to_string()
        };
        let tally = migrate::tally(&status);
        let nodes: serde_json::Map<String, serde_json::Value> = tally
            .range(0..)
            .map(|(node, &count)| (node.to_string(), count.into()))
            .collect();
        let line = json!({
            "t": (at.as_secs_f64() * 1000.0).round() / 1000.0,
            "nodes": nodes,
            "other": addrs.len() - placed.len(),
            "hot": counts.hot,
            "fast_budget": decision.fast_budget.0,
            "demoted": demoted,
            "promoted": promoted,
            "failed": failed,
            "reason": reason,
        });
        writeln!(out, "{line}")?;
        out.flush()?;
    }
    Ok(())
}

/// Whether process `pid` is there and not a zombie (`/proc/PID/stat`'s state, after the
/// command's closing parenthesis; proc.rst).
fn alive(proc: &std::path::Path, pid: i32) -> bool {
    std::fs::read_to_string(proc.join(format!("{pid}/stat"))).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| !matches!(state, "Z" | "X"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(sys: &std::path::Path, pid: i32, fast: i32, slow: i32) -> Options {
        Options {
            pid,
            fast_node: fast,
            slow_node: slow,
            budget: Bytes::from_mib(64),
            mappings: Mappings::Private,
            interval: Duration::from_millis(10),
            rate_mib_s: 64.0,
            count: 2,
            proc: "/proc".into(),
            sys: sys.to_path_buf(),
        }
    }

    fn error(o: &Options) -> String {
        let mut out = Vec::new();
        let e = run(o, &mut out).unwrap_err().to_string();
        assert!(out.is_empty(), "nothing printed before the error");
        e
    }

    #[test]
    fn a_zombie_is_not_alive() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        let proc = std::path::Path::new("/proc");
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

    #[test]
    fn what_cannot_be_placed_is_named() {
        let sys = tempfile::tempdir().unwrap();
        let me = std::process::id() as i32;
        assert_eq!(
            error(&options(sys.path(), me, 0, 0)),
            "--fast-node and --slow-node are both node 0"
        );
        let e = error(&options(sys.path(), me, 0, 1));
        assert!(e.contains("has_memory: no NUMA nodes"), "{e}");
        let nodes = sys.path().join("devices/system/node");
        std::fs::create_dir_all(&nodes).unwrap();
        std::fs::write(nodes.join("has_memory"), "0\n").unwrap();
        let e = error(&options(sys.path(), me, 0, 1));
        assert!(e.starts_with("node 1 has no memory ("), "{e}");
        assert!(e.ends_with("has_memory lists 0)"), "{e}");
        std::fs::write(nodes.join("has_memory"), "0-1\n").unwrap();
        // Pid numbers stay below /proc/sys/kernel/pid_max (at most 2^22).
        let e = error(&options(sys.path(), 1 << 23, 0, 1));
        assert_eq!(e, format!("process {} is gone", 1 << 23));
        // This process, on a sysfs without idle page tracking.
        let e = error(&options(sys.path(), me, 0, 1));
        assert!(e.contains("CONFIG_IDLE_PAGE_TRACKING"), "{e}");
    }
}
