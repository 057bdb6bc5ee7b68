//! The host's memory tiers (#12): its NUMA nodes with the memory tier the kernel ranks
//! each in (`/sys/devices/virtual/memory_tiering`, Linux 6.1 and later: a node without
//! CPUs, such as a CXL memory expander, lands in a slower tier than DRAM), the access
//! latency and bandwidth the firmware gives for each (HMAT, `accessN/initiators`), and
//! the compressed tier (zswap) and swap. Read from sysfs and procfs; a file that is
//! missing means the kernel or the firmware does not say, never an error.

use memtide_core::Bytes;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The host's memory tiers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Tiers {
    /// Each NUMA node with memory, by id.
    pub nodes: Vec<Node>,
    /// zswap, when the kernel has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zswap: Option<Zswap>,
    /// Swap space, all devices together.
    pub swap_total: Bytes,
    /// Swap space free.
    pub swap_free: Bytes,
}

/// One NUMA node with memory.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// Its id.
    pub id: u32,
    /// It has CPUs (a memory-only node is usually far or slow memory).
    pub cpus: bool,
    /// Its memory.
    pub total: Bytes,
    /// Its free memory.
    pub free: Bytes,
    /// The memory tier the kernel put it in (a larger id is slower), when it ranks tiers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<u32>,
    /// Read latency from its nearest initiator, ns (HMAT).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_latency_ns: Option<u64>,
    /// Read bandwidth from its nearest initiator, MB/s (HMAT).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_bandwidth_mbps: Option<u64>,
}

/// The compressed tier.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Zswap {
    /// It takes pages now.
    pub enabled: bool,
    /// Its compressor (`lzo`, `zstd`, ...).
    pub compressor: String,
    /// The most of the host's memory its pool may use, percent.
    pub max_pool_percent: Option<u64>,
}

/// The tiers of the host whose sysfs is mounted at `sys` and procfs at `proc`.
pub fn read(sys: &Path, proc: &Path) -> Tiers {
    let node_dir = sys.join("devices/system/node");
    let text = |p: &Path| std::fs::read_to_string(p).ok();
    let with_memory = text(&node_dir.join("has_memory"))
        .and_then(|t| parse_list(&t))
        .unwrap_or_default();
    let with_cpus = text(&node_dir.join("has_cpu"))
        .and_then(|t| parse_list(&t))
        .unwrap_or_default();
    let tier_of = node_tiers(&sys.join("devices/virtual/memory_tiering"));
    let nodes = with_memory
        .into_iter()
        .map(|id| {
            let dir = node_dir.join(format!("node{id}"));
            let (total, free) = text(&dir.join("meminfo"))
                .map(|t| node_meminfo(&t))
                .unwrap_or_default();
            let hmat = dir.join("access0/initiators");
            let number = |name: &str| text(&hmat.join(name)).and_then(|t| t.trim().parse().ok());
            Node {
                id,
                cpus: with_cpus.contains(&id),
                total,
                free,
                tier: tier_of.iter().find(|(n, _)| *n == id).map(|(_, t)| *t),
                read_latency_ns: number("read_latency"),
                read_bandwidth_mbps: number("read_bandwidth"),
            }
        })
        .collect();
    let zswap_dir = sys.join("module/zswap/parameters");
    let zswap = text(&zswap_dir.join("enabled")).map(|enabled| Zswap {
        enabled: matches!(enabled.trim(), "Y" | "1"),
        compressor: text(&zswap_dir.join("compressor"))
            .map(|c| c.trim().to_string())
            .unwrap_or_default(),
        max_pool_percent: text(&zswap_dir.join("max_pool_percent"))
            .and_then(|t| t.trim().parse().ok()),
    });
    let (swap_total, swap_free) = text(&proc.join("meminfo"))
        .map(|t| {
            let kv = crate::procfs::key_values(&t);
            let kib = |k: &str| Bytes::from_kib(kv.get(k).copied().unwrap_or(0));
            (kib("SwapTotal:"), kib("SwapFree:"))
        })
        .unwrap_or_default();
    Tiers {
        nodes,
        zswap,
        swap_total,
        swap_free,
    }
}

/// A kernel list of ids (`0-3,8,10-11`); `None` when malformed.
pub fn parse_list(text: &str) -> Option<Vec<u32>> {
    let mut ids = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                // A node id is below 1024 (MAX_NUMNODES): a wider range is garbage.
                if a > b || b - a > 1024 {
                    return None;
                }
                ids.extend(a..=b);
            }
            None => ids.push(part.parse().ok()?),
        }
    }
    Some(ids)
}

/// Each node of the memory tiers under `dir` (`memory_tierN/nodelist`), with its tier.
fn node_tiers(dir: &Path) -> Vec<(u32, u32)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(tier) = name
            .strip_prefix("memory_tier")
            .and_then(|t| t.parse().ok())
        else {
            continue;
        };
        let list = std::fs::read_to_string(entry.path().join("nodelist")).unwrap_or_default();
        for node in parse_list(&list).unwrap_or_default() {
            found.push((node, tier));
        }
    }
    found
}

/// `MemTotal` and `MemFree` of a node's meminfo (`Node 1 MemTotal:  1048576 kB`).
pub fn node_meminfo(text: &str) -> (Bytes, Bytes) {
    let mut total_free = (Bytes::ZERO, Bytes::ZERO);
    for line in text.lines() {
        let mut words = line.split_whitespace().skip(2);
        let (Some(key), Some(kib)) = (words.next(), words.next().and_then(|v| v.parse().ok()))
        else {
            continue;
        };
        match key {
            "MemTotal:" => total_free.0 = Bytes::from_kib(kib),
            "MemFree:" => total_free.1 = Bytes::from_kib(kib),
            _ => {}
        }
    }
    total_free
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_lists_are_read_and_garbage_refused() {
        assert_eq!(
            parse_list("0-3,8,10-11\n"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_list("1\n"), Some(vec![1]));
        assert_eq!(parse_list("\n"), Some(vec![]));
        assert_eq!(parse_list("3-1"), None);
        assert_eq!(parse_list("0-4294967295"), None, "no billion-node range");
        assert_eq!(parse_list("a"), None);
    }

    #[test]
    fn a_node_meminfo_gives_its_total_and_free() {
        let text = "Node 1 MemTotal:       1048576 kB\nNode 1 MemFree:         524288 kB\n\
                    Node 1 MemUsed:         524288 kB\n";
        assert_eq!(
            node_meminfo(text),
            (Bytes::from_mib(1024), Bytes::from_mib(512))
        );
        assert_eq!(node_meminfo("garbage"), (Bytes::ZERO, Bytes::ZERO));
    }

    /// Write `files` (path under `root`, content).
    fn tree(root: &Path, files: &[(&str, &str)]) {
        for (path, content) in files {
            let path = root.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, content).unwrap();
        }
    }

    #[test]
    fn dram_and_a_memory_only_node_in_a_slower_tier_with_zswap() {
        let root = tempfile::tempdir().unwrap();
        let node = "sys/devices/system/node";
        let tiers = "sys/devices/virtual/memory_tiering";
        tree(
            root.path(),
            &[
                (&format!("{node}/has_memory"), "0-1\n"),
                (&format!("{node}/has_cpu"), "0\n"),
                (
                    &format!("{node}/node0/meminfo"),
                    "Node 0 MemTotal: 2097152 kB\nNode 0 MemFree: 1048576 kB\n",
                ),
                (
                    &format!("{node}/node1/meminfo"),
                    "Node 1 MemTotal: 4194304 kB\nNode 1 MemFree: 4000000 kB\n",
                ),
                (
                    &format!("{node}/node1/access0/initiators/read_latency"),
                    "240\n",
                ),
                (
                    &format!("{node}/node1/access0/initiators/read_bandwidth"),
                    "20000\n",
                ),
                (&format!("{tiers}/memory_tier4/nodelist"), "0\n"),
                (&format!("{tiers}/memory_tier22/nodelist"), "1\n"),
                ("sys/module/zswap/parameters/enabled", "Y\n"),
                ("sys/module/zswap/parameters/compressor", "zstd\n"),
                ("sys/module/zswap/parameters/max_pool_percent", "20\n"),
                (
                    "proc/meminfo",
                    "MemTotal: 6291456 kB\nSwapTotal: 1048576 kB\nSwapFree: 1000000 kB\n",
                ),
            ],
        );
        let t = read(&root.path().join("sys"), &root.path().join("proc"));
        let dram = Node {
            id: 0,
            cpus: true,
            total: Bytes::from_gib(2),
            free: Bytes::from_gib(1),
            tier: Some(4),
            read_latency_ns: None,
            read_bandwidth_mbps: None,
        };
        let far = Node {
            id: 1,
            cpus: false,
            total: Bytes::from_gib(4),
            free: Bytes::from_kib(4000000),
            tier: Some(22),
            read_latency_ns: Some(240),
            read_bandwidth_mbps: Some(20000),
        };
        assert_eq!(t.nodes, [dram, far]);
        let zswap = Zswap {
            enabled: true,
            compressor: "zstd".into(),
            max_pool_percent: Some(20),
        };
        assert_eq!(t.zswap, Some(zswap));
        assert_eq!(
            (t.swap_total, t.swap_free),
            (Bytes::from_gib(1), Bytes::from_kib(1000000))
        );
    }

    #[test]
    fn a_host_without_tiering_files_reads_as_what_it_has() {
        let root = tempfile::tempdir().unwrap();
        let t = read(&root.path().join("sys"), &root.path().join("proc"));
        assert_eq!(t, Tiers::default());
    }
}
