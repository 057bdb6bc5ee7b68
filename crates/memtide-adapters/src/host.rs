//! The Linux host backend: /proc, the KSM sysfs directory and the VM memory domain.

use crate::{cgroup, ksm, procfs};
use memtide_core::backend::HostBackend;
use memtide_core::stats::{DomainScope, HostStats, MemInfo, MemoryDomain, OtherManager, SwapRoom};
use memtide_core::{BackendError, Bytes, KsmSettings};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How often the process table is scanned for other memory managers (a scan reads one
/// file per process) and /proc/zoneinfo read for the watermarks (its per-CPU lines run to
/// hundreds of KiB on a large host, and the watermarks move only with
/// `vm.min_free_kbytes` or memory hot-plug).
const SCAN_EVERY: Duration = Duration::from_secs(30);

/// Where the host's files are. Tests point these at fake trees.
#[derive(Debug, Clone, PartialEq)]
pub struct HostPaths {
    /// The procfs mount (normally `/proc`).
    pub proc: PathBuf,
    /// The sysfs mount (normally `/sys`).
    pub sys: PathBuf,
    /// The memory cgroup holding the VMs, if the domain is not the whole host.
    pub domain_cgroup: Option<PathBuf>,
}

impl Default for HostPaths {
    fn default() -> Self {
        HostPaths {
            proc: "/proc".into(),
            sys: "/sys".into(),
            domain_cgroup: None,
        }
    }
}

/// A value read again when it is [`SCAN_EVERY`] old.
struct Scanned<T>(Option<(Instant, T)>);

impl<T: Clone> Scanned<T> {
    fn get(&mut self, read: impl FnOnce() -> T) -> T {
        match &self.0 {
            Some((at, value)) if at.elapsed() < SCAN_EVERY => value.clone(),
            _ => self.0.insert((Instant::now(), read())).1.clone(),
        }
    }
}

/// The host memtide runs on.
pub struct LinuxHost {
    paths: HostPaths,
    /// The other memory managers running.
    others: Scanned<Vec<OtherManager>>,
    /// What the kernel keeps free on the whole host: the zones' high watermarks.
    kept_free: Scanned<Bytes>,
}

impl LinuxHost {
    /// A host reading from `paths`.
    pub fn new(paths: HostPaths) -> Self {
        LinuxHost {
            paths,
            others: Scanned(None),
            kept_free: Scanned(None),
        }
    }

    /// The KSM sysfs directory.
    pub fn ksm_dir(&self) -> PathBuf {
        self.paths.sys.join("kernel/mm/ksm")
    }
}

/// The processes under `proc` whose name (`comm`) is one of [`OtherManager::KNOWN`], by pid.
fn other_managers(proc: &Path) -> Vec<OtherManager> {
    procfs::processes(proc, |name| OtherManager::KNOWN.contains(&name))
        .into_iter()
        .map(|(pid, name, _)| OtherManager { name, pid })
        .collect()
}

fn read(path: &Path) -> Result<String, BackendError> {
    std::fs::read_to_string(path).map_err(|e| BackendError::Io(format!("{}: {e}", path.display())))
}

/// Anonymous memory on the host's LRU lists that no process maps (shmem aside): huge
/// pages of which a balloon discarded 4 KiB pieces, awaiting their deferred split, and
/// swap cache. The kernel frees it on demand; MemFree does not count it.
fn unmapped_anon(m: &MemInfo) -> Bytes {
    let lru = m.active_anon.zip(m.inactive_anon).map(|(a, i)| a + i);
    let mapped = m.anon_pages.map(|a| a + m.shmem.unwrap_or_default());
    lru.zip(mapped).map_or(Bytes(0), |(lru, mapped)| {
        Bytes(lru.0.saturating_sub(mapped.0))
    })
}

/// What the whole host could free: MOM's freeable memory, what the ZFS ARC would give
/// back (`arc`), and anonymous memory no process maps, at most MemTotal.
fn host_freeable(m: &MemInfo, arc: Bytes) -> Bytes {
    (m.freeable() + arc + unmapped_anon(m)).min(m.total)
}

/// The domain when it is the whole host: what it could free (`freeable`) over MemTotal,
/// of which the kernel keeps `kept_free` free.
fn host_domain(m: &MemInfo, freeable: Bytes, kept_free: Bytes) -> MemoryDomain {
    MemoryDomain {
        scope: DomainScope::Host,
        total: m.total,
        used: m.total - m.free,
        freeable,
        kept_free,
        swap_room: SwapRoom::Unknown,
    }
}

/// The domain when it is a cgroup: its limit (at most MemTotal), with free memory being
/// the room below the limit plus the cgroup's file cache and the anonymous memory no
/// process maps — but never more than the whole host could free (`host_freeable`: the
/// ZFS ARC's reclaimable part included, which is not charged to the cgroup), since the
/// limit is no promise that memory exists.
fn cgroup_domain(
    dir: &Path,
    m: &MemInfo,
    host_freeable: Bytes,
    c: &cgroup::CgroupMemory,
    swap_room: SwapRoom,
) -> MemoryDomain {
    let total = c.limit.map_or(m.total, |l| l.min(m.total));
    let freeable = ((total - c.usage) + c.file_cache + c.unmapped_anon)
        .min(total)
        .min(host_freeable);
    MemoryDomain {
        scope: DomainScope::Cgroup {
            path: dir.display().to_string(),
            version: c.version,
        },
        total,
        used: c.usage,
        freeable,
        kept_free: Bytes::ZERO,
        swap_room,
    }
}

impl HostBackend for LinuxHost {
    fn sample(&mut self) -> Result<HostStats, BackendError> {
        let proc = &self.paths.proc;
        let meminfo = procfs::meminfo(&read(&proc.join("meminfo"))?)
            .map_err(|e| BackendError::Protocol(e.to_string()))?;
        let vmstat = procfs::vmstat(&read(&proc.join("vmstat"))?);
        // PSI is absent on kernels built without it or booted with psi=0: not an error.
        let host_psi = std::fs::read_to_string(proc.join("pressure/memory"))
            .ok()
            .and_then(|t| procfs::psi(&t).ok());
        // No ZFS on most hosts: no arcstats, nothing to add.
        let arc = std::fs::read_to_string(proc.join("spl/kstat/zfs/arcstats"))
            .ok()
            .and_then(|t| procfs::zfs_arc_reclaimable(&t))
            .unwrap_or_default();
        let host_freeable = host_freeable(&meminfo, arc);
        let (domain, psi) = match &self.paths.domain_cgroup {
            None => {
                // Without /proc/zoneinfo (a restricted /proc) nothing is counted as kept:
                // the policies' own reserves stand alone.
                let kept_free = self.kept_free.get(|| {
                    std::fs::read_to_string(proc.join("zoneinfo"))
                        .ok()
                        .and_then(|t| procfs::zoneinfo_high_pages(&t))
                        .map_or(Bytes::ZERO, |pages| {
                            Bytes(pages.saturating_mul(procfs::page_size()))
                        })
                });
                (host_domain(&meminfo, host_freeable, kept_free), host_psi)
            }
            Some(dir) => {
                let c = cgroup::read(dir)
                    .map_err(|e| BackendError::Io(format!("[host] domain_cgroup: {e}")))?;
                let swappiness = std::fs::read_to_string(proc.join("sys/vm/swappiness"))
                    .ok()
                    .and_then(|t| t.trim().parse().ok());
                let swap_room = cgroup::swap_room(dir, swappiness);
                (
                    cgroup_domain(dir, &meminfo, host_freeable, &c, swap_room),
                    c.psi.or(host_psi),
                )
            }
        };
        Ok(HostStats {
            meminfo,
            vmstat,
            psi,
            ksm: ksm::read(&self.ksm_dir()),
            domain,
            // Without /proc/swaps (a restricted /proc) no swap is known to be in RAM.
            swap_free_in_ram: std::fs::read_to_string(proc.join("swaps"))
                .map(|t| procfs::swaps_free_in_ram(&t))
                .unwrap_or_default(),
            other_managers: self.others.get(|| other_managers(proc)),
        })
    }

    fn apply_ksm(&mut self, settings: &KsmSettings) -> Result<(), BackendError> {
        ksm::write(&self.ksm_dir(), settings).map_err(|e| BackendError::Io(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake /proc and /sys built from captured files.
    fn fake_tree() -> (tempfile::TempDir, HostPaths) {
        let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
        let root = tempfile::tempdir().unwrap();
        let proc = root.path().join("proc");
        let ksm = root.path().join("sys/kernel/mm/ksm");
        std::fs::create_dir_all(proc.join("pressure")).unwrap();
        std::fs::create_dir_all(&ksm).unwrap();
        std::fs::copy(data.join("proc/meminfo"), proc.join("meminfo")).unwrap();
        std::fs::copy(data.join("proc/vmstat"), proc.join("vmstat")).unwrap();
        std::fs::copy(data.join("proc/zoneinfo"), proc.join("zoneinfo")).unwrap();
        std::fs::create_dir_all(proc.join("sys/vm")).unwrap();
        std::fs::write(proc.join("sys/vm/swappiness"), "60\n").unwrap();
        std::fs::write(
            proc.join("swaps"),
            "Filename\tType\tSize\tUsed\tPriority\n\
             /dev/zram0\tpartition\t4194300\t1024\t100\n\
             /swap.img\tfile\t8388604\t0\t-2\n",
        )
        .unwrap();
        std::fs::copy(
            data.join("proc/pressure-memory"),
            proc.join("pressure/memory"),
        )
        .unwrap();
        for f in std::fs::read_dir(data.join("ksm")).unwrap() {
            let f = f.unwrap();
            std::fs::copy(f.path(), ksm.join(f.file_name())).unwrap();
        }
        let paths = HostPaths {
            proc,
            sys: root.path().join("sys"),
            domain_cgroup: None,
        };
        (root, paths)
    }

    #[test]
    fn samples_the_whole_host_as_domain() {
        let (_root, paths) = fake_tree();
        let mut host = LinuxHost::new(paths.clone());
        let s = host.sample().unwrap();
        assert_eq!(s.domain.scope, DomainScope::Host);
        assert_eq!(s.domain.total, Bytes::from_kib(24682416));
        assert_eq!(
            s.domain.freeable,
            Bytes::from_kib(22992484 + 24712 + 1435084)
        );
        // The zones' high watermarks, in pages (procfs::tests has the sum).
        let pages = 30 + 6116 + 19195 + 32;
        assert_eq!(s.domain.kept_free, Bytes(pages * procfs::page_size()));
        assert_eq!(s.ksm.unwrap().pages_to_scan, 100);
        assert!(s.psi.is_some());
        assert_eq!(
            s.swap_free_in_ram,
            Bytes::from_kib(4194300 - 1024),
            "zram's alone"
        );
        // The watermarks are read again only when SCAN_EVERY old, not every tick.
        std::fs::remove_file(paths.proc.join("zoneinfo")).unwrap();
        let again = host.sample().unwrap();
        assert_eq!(again.domain.kept_free, s.domain.kept_free);
    }

    #[test]
    fn the_zfs_arc_above_its_floor_counts_as_freeable() {
        let (_root, paths) = fake_tree();
        let kstat = paths.proc.join("spl/kstat/zfs");
        std::fs::create_dir_all(&kstat).unwrap();
        let arc = |size_mib: u64| {
            let text = format!(
                "13 1 0x01 123 33456 1 2\nname type data\nc_min 4 {}\nsize 4 {}\n",
                1 << 20,
                (size_mib + 1) << 20
            );
            std::fs::write(kstat.join("arcstats"), text).unwrap();
        };
        let mut host = LinuxHost::new(paths);
        arc(100);
        assert_eq!(
            host.sample().unwrap().domain.freeable,
            Bytes::from_kib(22992484 + 24712 + 1435084) + Bytes::from_mib(100)
        );
        arc(64 << 10);
        assert_eq!(
            host.sample().unwrap().domain.freeable,
            Bytes::from_kib(24682416),
            "never more than the host's memory"
        );
    }

    #[test]
    fn anonymous_memory_no_process_maps_is_freeable() {
        let mib = |n| Some(Bytes::from_mib(n));
        let m = MemInfo {
            active_anon: mib(40),
            inactive_anon: mib(300),
            anon_pages: mib(200),
            shmem: mib(30),
            ..MemInfo::default()
        };
        assert_eq!(unmapped_anon(&m), Bytes::from_mib(110));
        let all_mapped = MemInfo {
            anon_pages: mib(400),
            ..m.clone()
        };
        assert_eq!(unmapped_anon(&all_mapped), Bytes(0));
        let old_kernel = MemInfo {
            anon_pages: None,
            ..m
        };
        assert_eq!(unmapped_anon(&old_kernel), Bytes(0), "unknown: nothing");
    }

    #[test]
    fn other_memory_managers_are_found_by_process_name() {
        let (_root, paths) = fake_tree();
        for (pid, comm) in [("123", "ksmtuned\n"), ("77", "pvestatd\n"), ("5", "bash\n")] {
            std::fs::create_dir_all(paths.proc.join(pid)).unwrap();
            std::fs::write(paths.proc.join(pid).join("comm"), comm).unwrap();
        }
        // A process that ended between the listing and the read has no comm.
        std::fs::create_dir_all(paths.proc.join("999")).unwrap();
        let s = LinuxHost::new(paths).sample().unwrap();
        let found: Vec<(&str, u32)> = s
            .other_managers
            .iter()
            .map(|o| (o.name.as_str(), o.pid))
            .collect();
        assert_eq!(found, [("pvestatd", 77), ("ksmtuned", 123)]);
    }

    #[test]
    fn a_cgroup_domain_uses_its_limit_and_cache() {
        let (_root, mut paths) = fake_tree();
        let v2 = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/cgroup-v2");
        paths.domain_cgroup = Some(v2);
        let s = LinuxHost::new(paths.clone()).sample().unwrap();
        assert_eq!(s.domain.total, Bytes::from_gib(2));
        assert_eq!(s.domain.used, Bytes::from_mib(1536));
        // 512 MiB below the limit + 380 MiB of file cache.
        assert_eq!(
            s.domain.freeable,
            Bytes::from_mib(512) + Bytes(83886080 + 314572800)
        );
        assert_eq!(s.psi.unwrap().some.avg10, 1.25, "the cgroup's own pressure");
        assert_eq!(s.domain.kept_free, Bytes::ZERO, "no watermark in a cgroup");
        assert_eq!(
            s.domain.swap_room,
            SwapRoom::Unlimited,
            "no swap limit files: swap not accounted"
        );
        // Swappiness 0, or not known: reclaim at the limit would not swap.
        let swappiness = paths.proc.join("sys/vm/swappiness");
        std::fs::write(&swappiness, "0\n").unwrap();
        let zero = SwapRoom::Left(Bytes::ZERO);
        assert_eq!(
            LinuxHost::new(paths.clone())
                .sample()
                .unwrap()
                .domain
                .swap_room,
            zero
        );
        std::fs::remove_file(&swappiness).unwrap();
        assert_eq!(
            LinuxHost::new(paths).sample().unwrap().domain.swap_room,
            zero
        );
        assert!(matches!(
            s.domain.scope,
            DomainScope::Cgroup { version: 2, .. }
        ));
    }

    #[test]
    fn missing_optional_files_fall_back_and_missing_meminfo_is_an_error() {
        let (root, paths) = fake_tree();
        std::fs::remove_file(paths.proc.join("pressure/memory")).unwrap();
        std::fs::remove_file(paths.proc.join("zoneinfo")).unwrap();
        std::fs::remove_file(paths.proc.join("swaps")).unwrap();
        std::fs::remove_dir_all(root.path().join("sys/kernel/mm/ksm")).unwrap();
        let mut host = LinuxHost::new(paths.clone());
        let s = host.sample().unwrap();
        assert_eq!((s.psi, s.ksm), (None, None));
        assert_eq!(
            s.swap_free_in_ram,
            Bytes::ZERO,
            "no /proc/swaps: none known in RAM"
        );
        assert_eq!(
            s.domain.kept_free,
            Bytes::ZERO,
            "no zoneinfo: nothing counted kept"
        );
        std::fs::remove_file(paths.proc.join("meminfo")).unwrap();
        let err = host.sample().unwrap_err().to_string();
        assert!(
            err.ends_with("proc/meminfo: No such file or directory (os error 2)"),
            "{err}"
        );
    }

    #[test]
    fn a_broken_domain_cgroup_is_an_error_naming_it() {
        let (root, mut paths) = fake_tree();
        paths.domain_cgroup = Some(root.path().join("no-such-slice"));
        let err = LinuxHost::new(paths).sample().unwrap_err().to_string();
        assert!(err.starts_with("[host] domain_cgroup: "), "{err}");
        assert!(err.contains("no-such-slice: no such cgroup"), "{err}");
    }

    #[test]
    fn ksm_writes_go_to_the_configured_sysfs() {
        let (root, paths) = fake_tree();
        let mut host = LinuxHost::new(paths);
        host.apply_ksm(&KsmSettings {
            run: Some(1),
            ..KsmSettings::default()
        })
        .unwrap();
        let run = std::fs::read_to_string(root.path().join("sys/kernel/mm/ksm/run")).unwrap();
        assert_eq!(run, "1\n");
    }
}
