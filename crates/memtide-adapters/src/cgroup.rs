//! Memory cgroups (v1 and v2): the VM memory domain when the VMs live in a slice.

use crate::procfs::{self, key_values, ParseError};
use memtide_core::stats::{Psi, SwapRoom};
use memtide_core::Bytes;
use std::path::Path;

/// Limits at or above this are the kernel's "no limit" in cgroup v1 (PAGE_COUNTER_MAX
/// rounded to pages, e.g. 9223372036854771712).
const V1_UNLIMITED: u64 = 1 << 62;

/// A memory cgroup's state.
#[derive(Debug, Clone, PartialEq)]
pub struct CgroupMemory {
    /// Hierarchy version, 1 or 2.
    pub version: u8,
    /// The limit; `None` when unlimited.
    pub limit: Option<Bytes>,
    /// Memory charged to the cgroup.
    pub usage: Bytes,
    /// File-backed page cache on the LRU lists (reclaimable; shmem excluded).
    pub file_cache: Bytes,
    /// Anonymous memory charged to the cgroup that no process maps: mostly transparent
    /// huge pages of which a balloon discarded 4 KiB pieces, kept whole until the
    /// kernel's deferred split frees the rest under memory pressure, and swap cache.
    /// The kernel gives it back on demand, so it is as good as free.
    pub unmapped_anon: Bytes,
    /// Memory pressure (v2 only).
    pub psi: Option<Psi>,
}

/// Which files a cgroup version uses.
struct Layout {
    version: u8,
    limit: &'static str,
    usage: &'static str,
    /// memory.stat keys for active and inactive file pages, preferred first.
    file_keys: &'static [(&'static str, &'static str)],
    /// memory.stat keys for the anonymous pages on the LRU lists (active, inactive; they
    /// include shmem), the mapped ones, and shmem, preferred first.
    anon_keys: &'static [[&'static str; 4]],
    /// The swap limit and usage files (v1: memory and swap together).
    swap: (&'static str, &'static str),
    /// The file whose 0 keeps the cgroup from swapping at its limit.
    never_swaps: &'static str,
}

const V1: Layout = Layout {
    version: 1,
    limit: "memory.limit_in_bytes",
    usage: "memory.usage_in_bytes",
    file_keys: &[
        ("total_active_file", "total_inactive_file"),
        ("active_file", "inactive_file"),
    ],
    anon_keys: &[
        [
            "total_active_anon",
            "total_inactive_anon",
            "total_rss",
            "total_shmem",
        ],
        ["active_anon", "inactive_anon", "rss", "shmem"],
    ],
    swap: ("memory.memsw.limit_in_bytes", "memory.memsw.usage_in_bytes"),
    never_swaps: "memory.swappiness",
};

const V2: Layout = Layout {
    version: 2,
    limit: "memory.max",
    usage: "memory.current",
    file_keys: &[("active_file", "inactive_file")],
    anon_keys: &[["active_anon", "inactive_anon", "anon", "shmem"]],
    swap: ("memory.swap.max", "memory.swap.current"),
    never_swaps: "memory.zswap.writeback",
};

/// An error reading a cgroup.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// There is no such directory (no cgroup of that name, or not mounted there).
    #[error("{0}: no such cgroup (the directory is not there)")]
    Missing(String),
    /// The directory is not a memory cgroup.
    #[error("{0}: not a memory cgroup (neither memory.max nor memory.limit_in_bytes is there)")]
    NotMemoryCgroup(String),
    /// A file could not be read.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        error: std::io::Error,
    },
    /// A file could not be understood.
    #[error("{path}: {error}")]
    Parse {
        /// The file.
        path: String,
        /// Why.
        error: ParseError,
    },
}

/// Parse a limit file: a number, `max` (v2) or a huge number (v1) meaning no limit.
pub fn parse_limit(text: &str) -> Result<Option<Bytes>, ParseError> {
    match text.trim() {
        "max" => Ok(None),
        t => {
            let v: u64 = t
                .parse()
                .map_err(|_| ParseError::new("limit", format!("{t:?} is not a number")))?;
            Ok((v < V1_UNLIMITED).then_some(Bytes(v)))
        }
    }
}

/// Parse a usage file (`memory.current`, `memory.usage_in_bytes`).
pub fn parse_usage(text: &str) -> Result<Bytes, ParseError> {
    let t = text.trim();
    t.parse()
        .map(Bytes)
        .map_err(|_| ParseError::new("usage", format!("{t:?} is not a number")))
}

fn file_cache(stat: &str, layout: &Layout) -> Bytes {
    let kv = key_values(stat);
    layout
        .file_keys
        .iter()
        .find_map(|(active, inactive)| Some(Bytes(kv.get(active)? + kv.get(inactive)?)))
        .unwrap_or_default()
}

fn unmapped_anon(stat: &str, layout: &Layout) -> Bytes {
    let kv = key_values(stat);
    layout
        .anon_keys
        .iter()
        .find_map(|keys| {
            let [active, inactive, mapped, shmem] = keys.map(|k| kv.get(k).copied());
            let lru = active? + inactive?;
            Some(Bytes(lru.saturating_sub(mapped? + shmem.unwrap_or(0))))
        })
        .unwrap_or_default()
}

/// What the memory cgroup at `dir` may still swap: the tightest room of the memory
/// cgroups its VMs' memory is charged under — it, its ancestors up to the first that is
/// not a memory cgroup (v2's root), and its descendants (a VM's own scope may forbid swap:
/// libvirt's `swap_hard_limit`, systemd's `MemorySwapMax=0`; which VM is in which is not
/// known here, so the tightest anywhere counts for all). A level without swap accounting
/// files bounds nothing; one whose files cannot be read or understood allows none: swap
/// the hypervisor might not get is not lent. `swappiness` is the host's
/// (`/proc/sys/vm/swappiness`, `None` where unreadable): reclaim at a v2 cgroup's limit
/// swaps as it says, and at 0 (or unknown) takes only page cache, memory beyond the limit
/// then being an OOM kill (v1 cgroups have their own, read at each level).
pub fn swap_room(dir: &Path, swappiness: Option<u32>) -> SwapRoom {
    let Some(layout) = layout(dir) else {
        return SwapRoom::Left(Bytes::ZERO);
    };
    if layout.version == 2 && swappiness.is_none_or(|s| s == 0) {
        return SwapRoom::Left(Bytes::ZERO);
    }
    // The walk up follows the real path (a link or `..` would walk another chain).
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let mut room = SwapRoom::Unlimited;
    let mut at = dir.parent();
    while let Some(level) = at.filter(|d| d.join(layout.limit).exists()) {
        room = tighter(room, level_swap_room(level, layout));
        at = level.parent();
    }
    let mut below = vec![dir];
    while let Some(level) = below.pop() {
        room = tighter(room, level_swap_room(&level, layout));
        match std::fs::read_dir(&level) {
            Ok(entries) => below.extend(
                entries
                    .filter_map(Result::ok)
                    .map(|e| e.path())
                    .filter(|p| p.join(layout.limit).exists()),
            ),
            Err(_) => return SwapRoom::Left(Bytes::ZERO),
        }
    }
    room
}

/// The tighter of two rooms.
fn tighter(a: SwapRoom, b: SwapRoom) -> SwapRoom {
    match (a, b) {
        (SwapRoom::Left(a), SwapRoom::Left(b)) => SwapRoom::Left(a.min(b)),
        (SwapRoom::Left(a), _) | (_, SwapRoom::Left(a)) => SwapRoom::Left(a),
        (a, _) => a,
    }
}

/// One cgroup's own room ([`swap_room`]): its swap limit less the swap charged under it
/// (v2: the lower of `memory.swap.max` and `memory.swap.high`, above which allocations are
/// throttled, less `memory.swap.current`; v1: the memory+swap limit less the memory limit,
/// less the swap charged, `memory.memsw.usage_in_bytes` less `memory.usage_in_bytes`).
/// None where the cgroup may not swap at its limit whatever its limits say: v1's
/// `memory.swappiness` 0 (reclaim at a cgroup's limit then takes only page cache; v2 has
/// the host's, read by the caller), v2's `memory.zswap.writeback` 0 (swapped pages stay
/// compressed in the cgroup's own memory).
fn level_swap_room(dir: &Path, layout: &Layout) -> SwapRoom {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
    if read(layout.never_swaps).is_some_and(|t| t.trim() == "0") {
        return SwapRoom::Left(Bytes::ZERO);
    }
    let (limit_file, usage_file) = layout.swap;
    if !dir.join(limit_file).exists() {
        return SwapRoom::Unlimited;
    }
    let room = || {
        let mut limit = parse_limit(&read(limit_file)?).ok()?;
        if layout.version == 2 && dir.join("memory.swap.high").exists() {
            let high = parse_limit(&read("memory.swap.high")?).ok()?;
            limit = match (limit, high) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        let Some(limit) = limit else {
            return Some(SwapRoom::Unlimited);
        };
        let usage = parse_usage(&read(usage_file)?).ok()?;
        let left = match layout.version {
            2 => limit - usage,
            _ => {
                let swapped = usage - parse_usage(&read(layout.usage)?).ok()?;
                match parse_limit(&read(layout.limit)?).ok()? {
                    Some(memory_limit) => (limit - memory_limit) - swapped,
                    None => limit - usage,
                }
            }
        };
        Some(SwapRoom::Left(left))
    };
    room().unwrap_or(SwapRoom::Left(Bytes::ZERO))
}

/// The files of the memory cgroup at `dir`, by its version; `None` if it is not one.
fn layout(dir: &Path) -> Option<&'static Layout> {
    [&V2, &V1].into_iter().find(|l| dir.join(l.limit).exists())
}

/// Read a memory cgroup directory, detecting its version.
pub fn read(dir: &Path) -> Result<CgroupMemory, CgroupError> {
    let named = || dir.display().to_string();
    let layout = layout(dir).ok_or_else(|| match dir.is_dir() {
        true => CgroupError::NotMemoryCgroup(named()),
        false => CgroupError::Missing(named()),
    })?;
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read_to_string(&path).map_err(|error| CgroupError::Io {
            path: path.display().to_string(),
            error,
        })
    };
    let parsed = |name: &str, error| CgroupError::Parse {
        path: dir.join(name).display().to_string(),
        error,
    };
    let limit = parse_limit(&read(layout.limit)?).map_err(|e| parsed(layout.limit, e))?;
    let usage = parse_usage(&read(layout.usage)?).map_err(|e| parsed(layout.usage, e))?;
    let stat = read("memory.stat")?;
    let file_cache = file_cache(&stat, layout);
    let unmapped_anon = unmapped_anon(&stat, layout);
    let psi = match layout.version {
        2 => read("memory.pressure")
            .ok()
            .and_then(|t| procfs::psi(&t).ok()),
        _ => None,
    };
    Ok(CgroupMemory {
        version: layout.version,
        limit,
        usage,
        file_cache,
        unmapped_anon,
        psi,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn data(dir: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data")
            .join(dir)
    }

    #[test]
    fn reads_a_v1_cgroup_captured_from_a_real_host() {
        let m = read(&data("cgroup-v1")).unwrap();
        assert_eq!(m.version, 1);
        assert_eq!(m.limit, Some(Bytes::from_gib(2)));
        assert_eq!(m.usage, Bytes(541306880));
        assert_eq!(
            m.file_cache,
            Bytes(129572864 + 360239104),
            "hierarchical total_ keys"
        );
        assert_eq!(m.psi, None);
    }

    #[test]
    fn reads_a_v2_cgroup() {
        let m = read(&data("cgroup-v2")).unwrap();
        assert_eq!(m.version, 2);
        assert_eq!(m.limit, Some(Bytes::from_gib(2)));
        assert_eq!(m.usage, Bytes::from_mib(1536));
        assert_eq!(
            m.file_cache,
            Bytes(83886080 + 314572800),
            "shmem is not counted as cache"
        );
        assert_eq!(m.psi.unwrap().some.avg10, 1.25);
    }

    #[test]
    fn anonymous_memory_no_process_maps_is_counted_apart() {
        // A 512 MiB TCG guest whose balloon took 384 MiB (figures from this host, v1):
        // its QEMU maps 179 MiB of anonymous memory, the cgroup holds 284 MiB of it on
        // its LRU lists, the rest being huge pages awaiting their deferred split.
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
        write("memory.limit_in_bytes", "9223372036854771712\n");
        write("memory.usage_in_bytes", &format!("{}\n", 448u64 << 20));
        let mib = |n: u64| n << 20;
        write(
            "memory.stat",
            &format!(
                "cache {}\nrss {}\nrss_huge {}\nshmem 0\ninactive_anon {}\nactive_anon 0\n\
                 inactive_file {}\nactive_file {}\n",
                mib(157),
                mib(179),
                mib(128),
                mib(284),
                mib(155),
                mib(2)
            ),
        );
        let m = read(dir.path()).unwrap();
        assert_eq!(m.unmapped_anon, Bytes::from_mib(105));
        // cgroup v2 names the mapped anonymous memory `anon`; shmem sits on the anon
        // lists without being anyone's anonymous memory.
        std::fs::remove_file(dir.path().join("memory.limit_in_bytes")).unwrap();
        write("memory.max", "max\n");
        write("memory.current", "100\n");
        write(
            "memory.stat",
            &format!(
                "anon {}\nshmem {}\ninactive_anon {}\nactive_anon {}\nactive_file 0\ninactive_file 0\n",
                mib(100),
                mib(20),
                mib(150),
                mib(10)
            ),
        );
        assert_eq!(read(dir.path()).unwrap().unmapped_anon, Bytes::from_mib(40));
        // Captured cgroups where every anonymous page is mapped.
        assert_eq!(read(&data("cgroup-v1")).unwrap().unmapped_anon, Bytes(0));
        assert_eq!(read(&data("cgroup-v2")).unwrap().unmapped_anon, Bytes(0));
    }

    #[test]
    fn unlimited_is_none_in_both_versions() {
        assert_eq!(parse_limit("max\n").unwrap(), None);
        assert_eq!(parse_limit("9223372036854771712\n").unwrap(), None);
        assert_eq!(
            parse_limit("1073741824\n").unwrap(),
            Some(Bytes::from_gib(1))
        );
        assert!(parse_limit("lots").is_err());
    }

    #[test]
    fn errors_name_the_directory_or_file() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("machine.slice");
        let err = read(&gone).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "{}: no such cgroup (the directory is not there)",
                gone.display()
            )
        );
        let err = read(dir.path()).unwrap_err().to_string();
        assert!(
            err.ends_with(
                "not a memory cgroup (neither memory.max nor memory.limit_in_bytes is there)"
            ),
            "{err}"
        );
        std::fs::write(dir.path().join("memory.max"), "max\n").unwrap();
        std::fs::write(dir.path().join("memory.current"), "soon\n").unwrap();
        let err = read(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("memory.current: usage: \"soon\" is not a number"),
            "{err}"
        );
        std::fs::write(dir.path().join("memory.current"), "10\n").unwrap();
        let err = read(dir.path()).unwrap_err().to_string();
        assert!(err.contains("memory.stat: No such file"), "{err}");
    }

    /// Write `files` (name, contents) into `dir`, creating it.
    fn cgroup_dir(dir: &Path, files: &[(&str, &str)]) {
        std::fs::create_dir_all(dir).unwrap();
        for (name, text) in files {
            std::fs::write(dir.join(name), text).unwrap();
        }
    }

    #[test]
    fn the_swap_room_is_the_tightest_of_the_cgroup_and_its_ancestors() {
        let root = tempfile::tempdir().unwrap();
        let (slice, vms) = (
            root.path().join("machine.slice"),
            root.path().join("machine.slice/vms"),
        );
        let v2 = [
            ("memory.max", "max\n"),
            ("memory.current", "0\n"),
            ("memory.stat", ""),
        ];
        cgroup_dir(&slice, &v2);
        cgroup_dir(&vms, &v2);
        // No swap accounting: nothing bounds it.
        assert_eq!(swap_room(&vms, Some(60)), SwapRoom::Unlimited);
        // The host's swappiness 0, or not known: reclaim at a v2 limit would not swap. Nor
        // is there anything to lend where the directory is no memory cgroup.
        let zero = SwapRoom::Left(Bytes::ZERO);
        assert_eq!(swap_room(&vms, Some(0)), zero);
        assert_eq!(swap_room(&vms, None), zero);
        assert_eq!(swap_room(root.path(), Some(60)), zero);
        // The slice allows 1 GiB, 256 MiB charged; the VMs' own cgroup no limit.
        let mib = |m: u64| (m << 20).to_string();
        cgroup_dir(
            &slice,
            &[
                ("memory.swap.max", &mib(1024)),
                ("memory.swap.current", &mib(256)),
            ],
        );
        cgroup_dir(
            &vms,
            &[
                ("memory.swap.max", "max\n"),
                ("memory.swap.current", &mib(200)),
            ],
        );
        assert_eq!(
            swap_room(&vms, Some(60)),
            SwapRoom::Left(Bytes::from_mib(768))
        );
        // Its own limit tighter: 100 MiB, 40 charged.
        cgroup_dir(
            &vms,
            &[
                ("memory.swap.max", &mib(100)),
                ("memory.swap.current", &mib(40)),
            ],
        );
        assert_eq!(
            swap_room(&vms, Some(60)),
            SwapRoom::Left(Bytes::from_mib(60))
        );
        // Throttled above memory.swap.high: the lower of it and the max counts.
        cgroup_dir(&vms, &[("memory.swap.high", &mib(90))]);
        assert_eq!(
            swap_room(&vms, Some(60)),
            SwapRoom::Left(Bytes::from_mib(50))
        );
        std::fs::remove_file(vms.join("memory.swap.high")).unwrap();
        // A VM's own cgroup below that may not swap (libvirt's swap_hard_limit 0): none
        // for anyone, which VM is where not being known here.
        let scope = vms.join("vm1.scope");
        cgroup_dir(&scope, &v2);
        cgroup_dir(
            &scope,
            &[("memory.swap.max", "0\n"), ("memory.swap.current", "0\n")],
        );
        assert_eq!(swap_room(&vms, Some(60)), SwapRoom::Left(Bytes::ZERO));
        std::fs::remove_dir_all(&scope).unwrap();
        // Swapped pages kept compressed in the cgroup's memory (zswap without writeback,
        // set on an ancestor): none.
        cgroup_dir(&slice, &[("memory.zswap.writeback", "0\n")]);
        assert_eq!(swap_room(&vms, Some(60)), SwapRoom::Left(Bytes::ZERO));
        cgroup_dir(&slice, &[("memory.zswap.writeback", "1\n")]);
        assert_eq!(
            swap_room(&vms, Some(60)),
            SwapRoom::Left(Bytes::from_mib(60))
        );
        // Over its limit (charged before it was lowered): none.
        cgroup_dir(&vms, &[("memory.swap.current", &mib(150))]);
        assert_eq!(swap_room(&vms, Some(60)), SwapRoom::Left(Bytes::ZERO));
        // A limit not understood, or its usage missing: none lent.
        cgroup_dir(&vms, &[("memory.swap.max", "lots\n")]);
        assert_eq!(swap_room(&vms, Some(60)), SwapRoom::Left(Bytes::ZERO));
        cgroup_dir(&vms, &[("memory.swap.max", &mib(100))]);
        std::fs::remove_file(vms.join("memory.swap.current")).unwrap();
        assert_eq!(swap_room(&vms, Some(60)), SwapRoom::Left(Bytes::ZERO));
        // v1: 3 GiB of memory and swap over a 2 GiB memory limit, 256 MiB swapped.
        let v1 = root.path().join("v1");
        cgroup_dir(
            &v1,
            &[
                ("memory.limit_in_bytes", &mib(2048)),
                ("memory.usage_in_bytes", &mib(1536)),
                ("memory.memsw.limit_in_bytes", &mib(3072)),
                ("memory.memsw.usage_in_bytes", &mib(1792)),
                ("memory.stat", ""),
            ],
        );
        assert_eq!(
            swap_room(&v1, Some(60)),
            SwapRoom::Left(Bytes::from_mib(768))
        );
        cgroup_dir(
            &v1,
            &[("memory.memsw.limit_in_bytes", "9223372036854771712\n")],
        );
        assert_eq!(swap_room(&v1, Some(60)), SwapRoom::Unlimited);
        assert_eq!(
            swap_room(&v1, None),
            SwapRoom::Unlimited,
            "v1: its own swappiness"
        );
        // Swappiness 0: reclaim at its limit takes page cache only.
        cgroup_dir(&v1, &[("memory.swappiness", "0\n")]);
        assert_eq!(swap_room(&v1, Some(60)), SwapRoom::Left(Bytes::ZERO));
        // The captured cgroups have no swap accounting files.
        assert_eq!(swap_room(&data("cgroup-v1"), Some(60)), SwapRoom::Unlimited);
        assert_eq!(swap_room(&data("cgroup-v2"), Some(60)), SwapRoom::Unlimited);
    }
}
