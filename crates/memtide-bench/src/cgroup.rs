//! The scenario's memory cgroup (v1 or v2): created below the harness's own memory
//! cgroup, holding every QEMU the harness starts, the daemon's VM memory domain, and
//! removed when dropped. Nothing outside it is touched.

use anyhow::{bail, Context};
use std::path::{Path, PathBuf};

/// A memory cgroup of the harness's own.
pub struct BenchCgroup {
    /// Its directory.
    pub dir: PathBuf,
    v2: bool,
}

/// The process's own memory cgroup directory, and whether it is v2.
fn own_cgroup() -> anyhow::Result<(PathBuf, bool)> {
    let text = std::fs::read_to_string("/proc/self/cgroup").context("reading /proc/self/cgroup")?;
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
    let Some(path) = text.lines().find_map(|l| l.strip_prefix("0::")) else {
        bail!("/proc/self/cgroup has neither a v1 memory line nor a v2 line");
    };
    Ok((
        Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/')),
        true,
    ))
}

impl BenchCgroup {
    /// Create `name-<pid>` below the process's own memory cgroup.
    pub fn create(name: &str) -> anyhow::Result<BenchCgroup> {
        let (parent, v2) = own_cgroup()?;
        let dir = parent.join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir(&dir).with_context(|| {
            format!(
                "creating cgroup {} (the harness needs a memory cgroup of its own: run as root)",
                dir.display()
            )
        })?;
        let cg = BenchCgroup { dir, v2 };
        if !cg.dir.join(cg.limit_file()).exists() {
            bail!("{}: no memory controller in this cgroup", cg.dir.display());
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
    pub fn usage(&self) -> anyhow::Result<u64> {
        let f = if self.v2 {
            "memory.current"
        } else {
            "memory.usage_in_bytes"
        };
        let path = self.dir.join(f);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        text.trim()
            .parse()
            .with_context(|| format!("{}: {text:?}", path.display()))
    }

    /// File cache charged to the cgroup (active + inactive file pages), in bytes.
    pub fn file_cache(&self) -> anyhow::Result<u64> {
        let path = self.dir.join("memory.stat");
        let stat = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let get = |k: &str| {
            stat.lines()
                .find_map(|l| {
                    l.strip_prefix(k)?
                        .strip_prefix(' ')?
                        .trim()
                        .parse::<u64>()
                        .ok()
                })
                .unwrap_or(0)
        };
        let prefix = if self.v2 { "" } else { "total_" };
        Ok(get(&format!("{prefix}active_file")) + get(&format!("{prefix}inactive_file")))
    }

    /// Set the memory limit, in bytes.
    pub fn set_limit(&self, bytes: u64) -> anyhow::Result<()> {
        let path = self.dir.join(self.limit_file());
        std::fs::write(&path, bytes.to_string())
            .with_context(|| format!("setting {} to {bytes}", path.display()))
    }

    /// Processes still in the cgroup.
    pub fn tasks(&self) -> Vec<u32> {
        std::fs::read_to_string(self.procs())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }
}

impl Drop for BenchCgroup {
    fn drop(&mut self) {
        // The guests are gone by now (dropped first); a cgroup with no tasks can be removed.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        eprintln!(
            "memtide-bench: warning: could not remove cgroup {} (tasks: {:?})",
            self.dir.display(),
            self.tasks()
        );
    }
}
