//! `memtide place`: one process's pages placed between a fast and a slow NUMA node in
//! the foreground, a JSON line an interval. Each interval the access tracker scans the
//! process's mappings (all its private writable ones, or a QEMU's guest RAM), move_pages(2) says which node holds each resident page, `tiering::place`
//! decides how much to demote and promote within the fast budget and the rate limit,
//! `tiering::pick_pages` picks the pages (the longest untouched fast pages down, of those
//! untouched for the cold age, the slow pages accessed since the previous scan up), and
//! move_pages moves them.

use crate::placement::{self, Nodes, Placer};
use memtide_adapters::access::{Mappings, Method};
use memtide_core::tiering::age::{AgeConfig, ColdAge};
use memtide_core::tiering::{self, FastTier, TierConfig};
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
    /// How long a page must go untouched before it is demoted (0: whatever is idle): the
    /// least, where the age adapts to the process's promotions.
    pub ages: AgeConfig,
    /// Stop after this many intervals.
    pub count: u64,
    /// How to track the process's accesses.
    pub method: Method,
    /// The procfs mount.
    pub proc: PathBuf,
    /// The sysfs mount.
    pub sys: PathBuf,
}

/// Place for `options.count` intervals, a line each to `out`:
/// `{"t":…,"tracker":…,"nodes":{"0":…,"1":…},"other":…,"hot":…,"fast_budget":…,"demoted":…,
/// "promoted":…,"failed":…,"cold_age_s":…,"reason":…}` — pages on each node after the
/// interval's moves (from move_pages' statuses), resident pages on neither node or not
/// present, pages accessed since the previous scan, the budget in bytes, pages moved down
/// and up, pages the kernel did not move, the process's cold age for the next interval
/// (the reason says when and why it changed). The first interval only marks pages for
/// the tracker and moves nothing.
pub fn run(options: &Options, out: &mut impl Write) -> anyhow::Result<()> {
    let nodes = Nodes {
        fast: options.fast_node,
        slow: options.slow_node,
    };
    placement::check_nodes(&options.sys, nodes)?;
    if let Some(why) = placement::numa_balancing_fights(&options.proc) {
        tracing::warn!("{why}");
    }
    let mut placer = Placer::open(
        &options.proc,
        &options.sys,
        options.pid,
        options.mappings.clone(),
        options.ages,
        nodes,
        options.method,
    )?;
    let mut age = ColdAge::new(&options.ages);
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
        let mut m = placer.measure(at, &age)?;
        let tier = FastTier {
            free: placement::free_on(&options.proc, &options.sys, nodes.fast)?,
            reserve: Bytes::ZERO,
        };
        let vm = m.vm("", 1, Some(options.budget));
        let decision = tiering::place(&[vm], tier, config, options.interval.as_secs_f64())
            .pop()
            .expect("one placement for one VM");
        let moved = placer.carry_out(&mut m, &decision)?;
        let reason = if m.first {
            "place.first: the first scan only marks pages idle".to_string()
        } else {
            match placer.adapt_age(&mut age, &m, &moved) {
                Some(age) => format!("{}; {age}", decision.reason),
                None => decision.reason.to_string(),
            }
        };
        let nodes: serde_json::Map<String, serde_json::Value> = m
            .tally()
            .range(0..)
            .map(|(node, &count)| (node.to_string(), count.into()))
            .collect();
        let line = json!({
            "t": (at.as_secs_f64() * 1000.0).round() / 1000.0,
            "tracker": placer.method().key(),
            "nodes": nodes,
            "other": m.other(),
            "hot": m.counts.hot,
            "fast_budget": decision.fast_budget.0,
            "demoted": moved.demoted,
            "promoted": moved.promoted,
            "failed": moved.failed,
            "cold_age_s": age.age_s(),
            "reason": reason,
        });
        writeln!(out, "{line}")?;
        out.flush()?;
    }
    Ok(())
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
            ages: AgeConfig {
                min_s: 0.0,
                ..AgeConfig::default()
            },
            count: 2,
            method: Method::IdlePages,
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
