//! A memory cgroup (v1 or v2) of our own: created below the process's own memory cgroup,
//! holding the guests started in it, and removed, with whatever still runs in it, when
//! dropped.

use crate::Error;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A memory cgroup of our own, removed when dropped, its processes killed first.
pub struct Cgroup {
    /// Its directory.
    pub dir: PathBuf,
    v2: bool,
    /// Swap the cgroup may use beyond its limit, in bytes.
    swap: u64,
}

/// The process's own memory cgroup directory, and whether it is v2.
fn own_cgroup() -> Result<(PathBuf, bool), Error> {
    let text = std::fs::read_to_string("/proc/self/cgroup")
        .map_err(Error::io("reading /proc/self/cgroup"))?;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (
            parts.next(),
            parts.next().unwrap_or(""),
            parts.next().unwrap_or(""),
        );
        if controllers.split(',').any(|c| c == "memory") {
            let dir = Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/'));
            return Ok((dir, false));
        }
    }
    let path = text
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or(Error::NoOwnCgroup)?;
    Ok((
        Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/')),
        true,
    ))
}

impl Cgroup {
    /// Create `name-<pid>` below the process's own memory cgroup (which takes root),
    /// with no swap beyond its limit.
    pub fn create(name: &str) -> Result<Cgroup, Error> {
        let (parent, v2) = own_cgroup()?;
        let dir = parent.join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir(&dir).map_err(Error::io(format!(
            "creating cgroup {} (a memory cgroup of our own: run as root)",
            dir.display()
        )))?;
        let cg = Cgroup { dir, v2, swap: 0 };
        if !cg.dir.join(cg.limit_file()).exists() {
            return Err(Error::NoMemoryController(cg.dir.clone()));
        }
        Ok(cg)
    }

    fn limit_file(&self) -> &'static str {
        if self.v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        }
    }

    /// The file a process writes its pid to, to join the cgroup.
    pub fn procs(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// Memory charged to the cgroup, in bytes.
    pub fn usage(&self) -> Result<u64, Error> {
        Ok(memtide_adapters::cgroup::read(&self.dir)?.usage.0)
    }

    /// File cache charged to the cgroup (active + inactive file pages), in bytes.
    pub fn file_cache(&self) -> Result<u64, Error> {
        Ok(memtide_adapters::cgroup::read(&self.dir)?.file_cache.0)
    }

    /// What the cgroup holds that the kernel would not give back on demand, in bytes:
    /// its usage less its file cache and the anonymous memory no process maps (huge
    /// pages a balloon split, awaiting their deferred split). One read of the cgroup.
    pub fn held(&self) -> Result<u64, Error> {
        let m = memtide_adapters::cgroup::read(&self.dir)?;
        Ok(m.usage.0.saturating_sub(m.file_cache.0 + m.unmapped_anon.0))
    }

    /// Let the cgroup swap up to `bytes` beyond its limit, from the next
    /// [`Cgroup::set_limit`] (a domain with host swap behind it).
    pub fn with_swap(mut self, bytes: u64) -> Cgroup {
        self.swap = bytes;
        self
    }

    /// Set the memory limit, in bytes, and the swap beyond it to the cgroup's (none
    /// unless [`Cgroup::with_swap`] said otherwise), whether or not the host has swap;
    /// where the kernel does not account swap to cgroups, the memory limit alone. The
    /// swap is bounded before a lower limit reclaims, so that none is swapped on the way.
    pub fn set_limit(&self, bytes: u64) -> Result<(), Error> {
        if self.v2 {
            self.write_if_present("memory.swap.max", self.swap)?;
            return self.write(self.limit_file(), bytes);
        }
        // v1 bounds memory + swap, never below the memory limit: lower the memory limit
        // first, raise the other first. The lowering reclaims while memory + swap is
        // still bounded higher: with no swap allowed, swappiness 0 keeps that reclaim
        // from swapping.
        if self.swap == 0 {
            self.write_if_present("memory.swappiness", 0)?;
        }
        let now = memtide_adapters::cgroup::read(&self.dir)?.limit;
        let lowering = now.is_none_or(|now| bytes < now.0);
        if lowering {
            self.write(self.limit_file(), bytes)?;
        }
        self.write_if_present(
            "memory.memsw.limit_in_bytes",
            bytes.saturating_add(self.swap),
        )?;
        if !lowering {
            self.write(self.limit_file(), bytes)?;
        }
        Ok(())
    }

    fn write(&self, file: &str, value: u64) -> Result<(), Error> {
        let path = self.dir.join(file);
        std::fs::write(&path, value.to_string())
            .map_err(Error::io(format!("setting {} to {value}", path.display())))
    }

    /// Write `file` where the kernel has it.
    fn write_if_present(&self, file: &str, value: u64) -> Result<(), Error> {
        if self.dir.join(file).exists() {
            self.write(file, value)?;
        }
        Ok(())
    }

    /// Kill every process in the cgroup: at once through `cgroup.kill` (v2, Linux
    /// 5.14), else each pid it lists, never our own, nor 0 (a task exiting, or from
    /// outside our pid namespace: kill(0) would signal our own process group).
    fn kill_all(&self) {
        if self.v2 && std::fs::write(self.dir.join("cgroup.kill"), "1").is_ok() {
            return;
        }
        for pid in self.tasks() {
            match libc::pid_t::try_from(pid) {
                Ok(pid) if pid > 0 && pid.unsigned_abs() != std::process::id() => {
                    // SAFETY: kill(2) of a positive pid read from our own cgroup; no
                    // memory involved.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
                _ => {}
            }
        }
    }

    /// Processes in the cgroup.
    pub fn tasks(&self) -> Vec<u32> {
        std::fs::read_to_string(self.procs())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }
}

/// `program`, run so that it joins the cgroup whose `cgroup.procs` is `procs` before it
/// is exec'd (through `sh`), so that everything it allocates is charged to the cgroup.
/// Add its arguments to the command returned.
pub fn command_in(procs: &Path, program: impl AsRef<OsStr>) -> Command {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "echo $$ > \"$0\" && exec \"$@\""])
        .arg(procs)
        .arg(program);
    cmd
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // The guests are gone by now (dropped first); what is left was started in it by
        // another process (a daemon's restores and clones, when a harness stops early)
        // and is killed, again on each try, so that nothing outlives the test or
        // benchmark. A cgroup with no tasks can be removed.
        for _ in 0..50 {
            self.kill_all();
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        eprintln!(
            "warning: could not remove cgroup {} (tasks: {:?})",
            self.dir.display(),
            self.tasks()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::{command_in, Cgroup};

    #[test]
    #[ignore = "creates a memory cgroup: needs root"]
    fn a_process_left_in_the_cgroup_is_killed_when_it_is_dropped() {
        let cg = Cgroup::create("testbed-drop").unwrap();
        let dir = cg.dir.clone();
        let mut left = command_in(&cg.procs(), "sleep").arg("600").spawn().unwrap();
        let start = std::time::Instant::now();
        while cg.tasks().is_empty() {
            assert!(start.elapsed().as_secs() < 10, "the process never joined");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        drop(cg);
        let start = std::time::Instant::now();
        let status = loop {
            if let Some(status) = left.try_wait().unwrap() {
                break status;
            }
            if start.elapsed().as_secs() > 10 {
                left.kill().unwrap();
                panic!("the process outlived its cgroup");
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL)
        );
        assert!(!dir.exists(), "{} left behind", dir.display());
    }

    #[test]
    #[ignore = "creates a memory cgroup: needs root"]
    fn a_limit_lowered_or_raised_bounds_the_swap_beyond_it() {
        for swap_mib in [0u64, 32] {
            let cg = Cgroup::create("testbed-swap")
                .unwrap()
                .with_swap(swap_mib << 20);
            let read = |file: &str| std::fs::read_to_string(cg.dir.join(file)).ok();
            for mib in [256u64, 1024, 64] {
                let bytes = mib << 20;
                cg.set_limit(bytes).unwrap();
                assert_eq!(read(cg.limit_file()).unwrap().trim(), bytes.to_string());
                // v2 bounds the swap, v1 memory and swap together: the test needs a kernel
                // that accounts swap to cgroups, as the hosts the tests run on do.
                match (
                    cg.v2,
                    read("memory.swap.max"),
                    read("memory.memsw.limit_in_bytes"),
                ) {
                    (true, Some(swap), _) => assert_eq!(swap.trim(), (swap_mib << 20).to_string()),
                    (false, _, Some(both)) => {
                        assert_eq!(both.trim(), ((mib + swap_mib) << 20).to_string())
                    }
                    (v2, ..) => panic!(
                        "no swap accounting in {}: {} is missing (a kernel without \
                         CONFIG_MEMCG_SWAP, or booted with swapaccount=0), so the bound on \
                         swap cannot be checked",
                        cg.dir.display(),
                        if v2 {
                            "memory.swap.max"
                        } else {
                            "memory.memsw.limit_in_bytes"
                        }
                    ),
                }
                // v1 reclaims without swapping where no swap is allowed.
                if let (false, 0, Some(swappiness)) = (cg.v2, swap_mib, read("memory.swappiness")) {
                    assert_eq!(swappiness.trim(), "0");
                }
            }
        }
    }

    #[test]
    fn a_command_joins_the_cgroup_before_exec() {
        // A plain file stands in for cgroup.procs: the pid written is the one exec'd.
        let procs = tempfile::NamedTempFile::new().unwrap();
        let out = command_in(procs.path(), "sh")
            .args(["-c", "echo $$"])
            .output()
            .unwrap();
        assert!(out.status.success());
        let written = std::fs::read_to_string(procs.path()).unwrap();
        assert_eq!(written, String::from_utf8(out.stdout).unwrap());
    }
}
