//! Proactive reclaim's I/O on a VM's cgroup v2 (`docs/tiering.md`): find the cgroup of a
//! VM's process, read what pacing needs (`memory.current`, `memory.pressure`,
//! `memory.stat`'s refaults) and ask `memory.reclaim` for memory (Linux 5.19 and later).

use crate::procfs::{self, key_values, ParseError};
use memtide_core::reclaim::CgroupReading;
use memtide_core::Bytes;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// An error finding, reading or writing a VM's cgroup.
#[derive(Debug, thiserror::Error)]
pub enum ReclaimError {
    /// The process is in no cgroup v2 (a cgroup v1 host, or a hybrid one without
    /// memory in v2).
    #[error("process {0} is in no cgroup v2 (memory.reclaim needs cgroup v2)")]
    NotV2(u32),
    /// What is mounted there is not cgroup v2.
    #[error(
        "{0}: not a cgroup v2 mount (memory.reclaim needs cgroup v2; set [reclaim] cgroup_root)"
    )]
    NotV2Mount(PathBuf),
    /// Its cgroup, or one below it, holds other processes too: reclaim would take theirs.
    #[error(
        "{0}: the VM's cgroup holds other processes too (give its QEMU a cgroup of its own, \
         or set [[vm]] reclaim_cgroup)"
    )]
    Shared(PathBuf),
    /// The kernel has no `memory.reclaim` (before 5.19) or no memory controller there.
    #[error("{0}: missing (memory.reclaim needs Linux 5.19+ and the memory controller)")]
    Missing(PathBuf),
    /// The cgroup was removed since it was found (its VM stopped).
    #[error("{0}: the cgroup is gone (its VM stopped?)")]
    Gone(PathBuf),
    /// The kernel refused the amount.
    #[error("{path}: the kernel refused {amount}")]
    Refused {
        /// The file.
        path: PathBuf,
        /// What was asked.
        amount: Bytes,
    },
    /// A file could not be read or written.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// A file could not be understood.
    #[error("{path}: {error}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        error: ParseError,
    },
}

/// The cgroup v2 path of a process (the `0::` line of `/proc/PID/cgroup`), relative to
/// the hierarchy's root; `None` when it is in no cgroup v2.
pub fn parse_v2_path(text: &str) -> Option<&str> {
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim().trim_start_matches('/'))
}

/// The cgroup v2 directory of process `pid`, under the hierarchy mounted at `root`
/// (`/sys/fs/cgroup`), checked to hold that process alone. A process in a threaded
/// cgroup (libvirt on cgroup v2 keeps QEMU's main thread in a threaded `emulator` child
/// of the domain's) is charged to its threaded domain, the nearest ancestor that is not
/// threaded: that one is the VM's (Documentation/admin-guide/cgroup-v2.rst, "Threads").
pub fn cgroup_of(proc: &Path, root: &Path, pid: u32) -> Result<PathBuf, ReclaimError> {
    let text = read(&proc.join(pid.to_string()).join("cgroup"))?;
    let path = parse_v2_path(&text).ok_or(ReclaimError::NotV2(pid))?;
    // A hybrid host lists a v2 path too, with v1 mounted at `root`.
    if !root.join("cgroup.controllers").exists() {
        return Err(ReclaimError::NotV2Mount(root.to_path_buf()));
    }
    let mut dir = root.join(path);
    while threaded(&dir) && dir != root {
        dir.pop();
    }
    // A threaded domain's cgroup.procs lists the processes of its whole threaded subtree.
    let procs = read(&dir.join("cgroup.procs"))?;
    match procs.split_whitespace().collect::<Vec<_>>()[..] {
        [one] if one == pid.to_string() && !busy_below(&dir)? => Ok(dir),
        _ => Err(ReclaimError::Shared(dir)),
    }
}

/// True when `dir` is a threaded cgroup (`cgroup.type`; the root has none).
fn threaded(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("cgroup.type")).is_ok_and(|t| t.trim() == "threaded")
}

/// The most cgroups below a VM's looked through for processes.
const MAX_BELOW: usize = 4096;

/// True when a cgroup below `dir` holds a process (or there are more than [`MAX_BELOW`]
/// to look through): their memory is charged to `dir` too, and cgroup v2 allows
/// processes beside children that enable no controller. A child removed while it is
/// looked through held none (only an empty cgroup can be removed): found in review, it
/// made the whole look fail.
fn busy_below(dir: &Path) -> Result<bool, ReclaimError> {
    let mut todo = vec![dir.to_path_buf()];
    let mut seen = 0;
    while let Some(cgroup) = todo.pop() {
        let entries = match std::fs::read_dir(&cgroup) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && cgroup != dir => continue,
            entries => entries.map_err(|error| ReclaimError::Io {
                path: cgroup.clone(),
                error,
            })?,
        };
        for entry in entries.flatten() {
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            seen += 1;
            if seen > MAX_BELOW {
                return Ok(true);
            }
            let child = entry.path();
            // Its processes are listed by its threaded domain, `dir` or above it: reading
            // its own cgroup.procs fails (EOPNOTSUPP).
            if threaded(&child) {
                continue;
            }
            let procs = match std::fs::read_to_string(child.join("cgroup.procs")) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                procs => procs.map_err(|error| ReclaimError::Io {
                    path: child.join("cgroup.procs"),
                    error,
                })?,
            };
            if !procs.trim().is_empty() {
                return Ok(true);
            }
            todo.push(child);
        }
    }
    Ok(false)
}

/// Refaults counted in `memory.stat`: anonymous and file refaults (Linux 5.9+), or the
/// older kernels' single count.
pub fn parse_refaults(stat: &str) -> Option<u64> {
    let kv = key_values(stat);
    match (
        kv.get("workingset_refault_anon"),
        kv.get("workingset_refault_file"),
    ) {
        (Some(a), Some(f)) => Some(a.saturating_add(*f)),
        _ => kv.get("workingset_refault").copied(),
    }
}

/// Read the cgroup at `dir` for pacing, dated `at`.
pub fn read_cgroup(dir: &Path, at: Duration) -> Result<CgroupReading, ReclaimError> {
    let parsed = |name: &str, error| ReclaimError::Parse {
        path: dir.join(name),
        error,
    };
    let usage = crate::cgroup::parse_usage(&read(&dir.join("memory.current"))?)
        .map_err(|e| parsed("memory.current", e))?;
    let psi = procfs::psi(&read(&dir.join("memory.pressure"))?)
        .map_err(|e| parsed("memory.pressure", e))?;
    let refaults = parse_refaults(&read(&dir.join("memory.stat"))?).ok_or_else(|| {
        parsed(
            "memory.stat",
            ParseError::new("memory.stat", "no workingset_refault counts"),
        )
    })?;
    Ok(CgroupReading {
        at,
        usage,
        stall_us: psi.some.total_us,
        stall_avg10: psi.some.avg10 / 100.0,
        refaults,
    })
}

/// What a write to `memory.reclaim` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reclaimed {
    /// The kernel reclaimed all that was asked.
    All,
    /// It could not reclaim all of it (EAGAIN): nothing more was cold enough to take.
    Partly,
}

/// Ask the cgroup at `dir` to reclaim `amount` (`memory.reclaim`).
pub fn reclaim(dir: &Path, amount: Bytes) -> Result<Reclaimed, ReclaimError> {
    let path = dir.join("memory.reclaim");
    let io = |error: std::io::Error| match error.raw_os_error() {
        Some(libc::EAGAIN) => Ok(Reclaimed::Partly),
        // Not an old kernel where the cgroup itself went (found by an audit).
        Some(libc::ENOENT) if !dir.is_dir() => Err(ReclaimError::Gone(dir.to_path_buf())),
        Some(libc::ENOENT) => Err(ReclaimError::Missing(path.clone())),
        Some(libc::EINVAL) => Err(ReclaimError::Refused {
            path: path.clone(),
            amount,
        }),
        _ => Err(ReclaimError::Io {
            path: path.clone(),
            error,
        }),
    };
    let mut file = match std::fs::OpenOptions::new().write(true).open(&path) {
        Ok(f) => f,
        Err(e) => return io(e),
    };
    // A few bytes: one write, which the kernel parses whole.
    match file.write_all(amount.0.to_string().as_bytes()) {
        Ok(()) => Ok(Reclaimed::All),
        Err(e) => io(e),
    }
}

fn read(path: &Path) -> Result<String, ReclaimError> {
    std::fs::read_to_string(path).map_err(|error| ReclaimError::Io {
        path: path.to_path_buf(),
        error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cgroup(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        dir
    }

    /// `memory.pressure` and `memory.stat` as Linux 6.1 writes them (trimmed).
    const PRESSURE: &str = "some avg10=0.25 avg60=0.10 avg300=0.02 total=123456\n\
                            full avg10=0.00 avg60=0.00 avg300=0.00 total=4567\n";
    const STAT: &str = "anon 104857600\nfile 0\nworkingset_refault_anon 30\n\
                        workingset_refault_file 12\nworkingset_activate_anon 0\n";

    #[test]
    fn the_v2_path_is_the_zero_line() {
        let hybrid = "12:memory:/machine/vm1\n0::/machine.slice/vm1.scope\n";
        assert_eq!(parse_v2_path(hybrid), Some("machine.slice/vm1.scope"));
        assert_eq!(parse_v2_path("0::/\n"), Some(""));
        assert_eq!(parse_v2_path("4:memory:/user.slice\n"), None);
        assert_eq!(parse_v2_path(""), None);
    }

    #[test]
    fn a_process_alone_in_its_cgroup_is_found_and_a_shared_one_refused() {
        let root = cgroup(&[
            ("proc/42/cgroup", "0::/vms/a\n"),
            ("proc/43/cgroup", "0::/vms/b\n"),
            ("proc/44/cgroup", "3:memory:/x\n"),
            ("cg/vms/a/cgroup.procs", "42\n"),
            ("cg/vms/b/cgroup.procs", "43\n77\n"),
        ]);
        let (proc, cg) = (root.path().join("proc"), root.path().join("cg"));
        // cgroup v1 (or nothing) mounted there: said so.
        assert_eq!(
            cgroup_of(&proc, &cg, 42).unwrap_err().to_string(),
            format!(
                "{}: not a cgroup v2 mount (memory.reclaim needs cgroup v2; set [reclaim] cgroup_root)",
                cg.display()
            )
        );
        std::fs::write(cg.join("cgroup.controllers"), "cpu memory\n").unwrap();
        assert_eq!(cgroup_of(&proc, &cg, 42).unwrap(), cg.join("vms/a"));
        let shared = cgroup_of(&proc, &cg, 43).unwrap_err().to_string();
        assert!(shared.contains("holds other processes too"), "{shared}");
        assert_eq!(
            cgroup_of(&proc, &cg, 44).unwrap_err().to_string(),
            "process 44 is in no cgroup v2 (memory.reclaim needs cgroup v2)"
        );
        let gone = cgroup_of(&proc, &cg, 45).unwrap_err().to_string();
        assert!(gone.contains("45/cgroup: No such file"), "{gone}");

        // Children without processes are its own; a process below is charged to it too.
        std::fs::create_dir_all(cg.join("vms/a/idle/deeper")).unwrap();
        std::fs::write(cg.join("vms/a/idle/cgroup.procs"), "").unwrap();
        std::fs::write(cg.join("vms/a/idle/deeper/cgroup.procs"), "").unwrap();
        assert_eq!(cgroup_of(&proc, &cg, 42).unwrap(), cg.join("vms/a"));
        // A child removed as it is looked through (its directory listed, its files gone)
        // held no process; before, the look failed on it.
        std::fs::create_dir_all(cg.join("vms/a/removed")).unwrap();
        assert_eq!(cgroup_of(&proc, &cg, 42).unwrap(), cg.join("vms/a"));
        std::fs::write(cg.join("vms/a/idle/deeper/cgroup.procs"), "99\n").unwrap();
        let below = cgroup_of(&proc, &cg, 42).unwrap_err().to_string();
        assert!(below.contains("holds other processes too"), "{below}");
    }

    #[test]
    fn a_process_in_a_threaded_cgroup_is_reclaimed_in_its_threaded_domain() {
        // libvirt on cgroup v2: the domain's scope, the `libvirt` threaded domain newer
        // libvirt makes below it, QEMU's main thread in the threaded `emulator`, vCPU
        // threads in `vcpu0`. A threaded cgroup's own cgroup.procs cannot be read: none
        // here, and a directory in its place for `vcpu0`, which fails to read as the
        // kernel's file does.
        let scope = "cg/machine.slice/machine-qemu-1-a.scope";
        let root = cgroup(&[
            ("cg/cgroup.controllers", "cpu memory\n"),
            (
                "proc/42/cgroup",
                "0::/machine.slice/machine-qemu-1-a.scope/libvirt/emulator\n",
            ),
            ("proc/43/cgroup", "0::/solo/t\n"),
            (&format!("{scope}/cgroup.type"), "domain\n"),
            (&format!("{scope}/cgroup.procs"), ""),
            (&format!("{scope}/libvirt/cgroup.type"), "domain threaded\n"),
            (&format!("{scope}/libvirt/cgroup.procs"), "42\n"),
            (
                &format!("{scope}/libvirt/emulator/cgroup.type"),
                "threaded\n",
            ),
            (&format!("{scope}/libvirt/vcpu0/cgroup.type"), "threaded\n"),
            (
                &format!("{scope}/libvirt/vcpu0/cgroup.procs/unreadable"),
                "",
            ),
            ("cg/solo/cgroup.type", "domain threaded\n"),
            ("cg/solo/cgroup.procs", "43\n44\n"),
            ("cg/solo/t/cgroup.type", "threaded\n"),
        ]);
        let (proc, cg) = (root.path().join("proc"), root.path().join("cg"));
        let domain = cg.join("machine.slice/machine-qemu-1-a.scope/libvirt");
        assert_eq!(cgroup_of(&proc, &cg, 42).unwrap(), domain);
        // Another process in the same threaded subtree shares the domain's memory.
        let shared = cgroup_of(&proc, &cg, 43).unwrap_err().to_string();
        assert_eq!(
            shared,
            format!(
                "{}: the VM's cgroup holds other processes too (give its QEMU a cgroup of its \
                 own, or set [[vm]] reclaim_cgroup)",
                cg.join("solo").display()
            )
        );
    }

    #[test]
    fn a_cgroup_is_read_for_pacing() {
        let dir = cgroup(&[
            ("memory.current", "209715200\n"),
            ("memory.pressure", PRESSURE),
            ("memory.stat", STAT),
        ]);
        let r = read_cgroup(dir.path(), Duration::from_secs(7)).unwrap();
        assert_eq!(
            r,
            CgroupReading {
                at: Duration::from_secs(7),
                usage: Bytes::from_mib(200),
                stall_us: 123456,
                stall_avg10: 0.0025,
                refaults: 42,
            }
        );
        assert_eq!(parse_refaults("workingset_refault 9\n"), Some(9));
    }

    #[test]
    fn a_cgroup_without_pressure_or_refaults_is_an_error_naming_the_file() {
        let no_psi = cgroup(&[("memory.current", "1\n"), ("memory.stat", STAT)]);
        let e = read_cgroup(no_psi.path(), Duration::ZERO).unwrap_err();
        assert!(
            e.to_string().contains("memory.pressure: No such file"),
            "{e}"
        );
        let no_refaults = cgroup(&[
            ("memory.current", "1\n"),
            ("memory.pressure", PRESSURE),
            ("memory.stat", "anon 1\n"),
        ]);
        let e = read_cgroup(no_refaults.path(), Duration::ZERO).unwrap_err();
        assert!(
            e.to_string().ends_with("no workingset_refault counts"),
            "{e}"
        );
        let garbage = cgroup(&[
            ("memory.current", "lots\n"),
            ("memory.pressure", PRESSURE),
            ("memory.stat", STAT),
        ]);
        let e = read_cgroup(garbage.path(), Duration::ZERO).unwrap_err();
        assert!(e.to_string().contains("memory.current"), "{e}");
    }

    #[test]
    fn the_amount_is_written_in_bytes_and_a_missing_file_named() {
        let dir = cgroup(&[("memory.reclaim", "")]);
        assert_eq!(
            reclaim(dir.path(), Bytes::from_mib(3)).unwrap(),
            Reclaimed::All
        );
        let written = std::fs::read_to_string(dir.path().join("memory.reclaim")).unwrap();
        assert_eq!(written, "3145728");
        let none = tempfile::tempdir().unwrap();
        let e = reclaim(none.path(), Bytes(4096)).unwrap_err().to_string();
        assert!(e.ends_with("memory.reclaim: missing (memory.reclaim needs Linux 5.19+ and the memory controller)"), "{e}");
        // The cgroup removed between its reading and the write: no old kernel.
        let gone = none.path().join("machine.slice");
        let e = reclaim(&gone, Bytes(4096)).unwrap_err().to_string();
        assert!(
            e.ends_with("machine.slice: the cgroup is gone (its VM stopped?)"),
            "{e}"
        );
    }
}
