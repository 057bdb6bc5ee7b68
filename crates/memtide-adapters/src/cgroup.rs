//! Memory cgroups (v1 and v2): the VM memory domain when the VMs live in a slice.

use crate::procfs::{self, key_values, ParseError};
use memtide_core::stats::Psi;
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
};

const V2: Layout = Layout {
    version: 2,
    limit: "memory.max",
    usage: "memory.current",
    file_keys: &[("active_file", "inactive_file")],
    anon_keys: &[["active_anon", "inactive_anon", "anon", "shmem"]],
};

/// An error reading a cgroup.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
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

/// Read a memory cgroup directory, detecting its version.
pub fn read(dir: &Path) -> Result<CgroupMemory, CgroupError> {
    let layout = if dir.join(V2.limit).exists() {
        &V2
    } else if dir.join(V1.limit).exists() {
        &V1
    } else {
        return Err(CgroupError::NotMemoryCgroup(dir.display().to_string()));
    };
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
}
