//! A memory cgroup of the test's own, below the test process's cgroup, removed on drop.

use std::path::{Path, PathBuf};

/// A memory cgroup (v1 or v2) created for one test.
pub struct TestCgroup {
    pub dir: PathBuf,
    v2: bool,
}

/// The test process's own memory cgroup directory, and whether it is v2.
fn own_cgroup() -> (PathBuf, bool) {
    let text = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (
            parts.next(),
            parts.next().unwrap_or(""),
            parts.next().unwrap_or(""),
        );
        if controllers.split(',').any(|c| c == "memory") {
            return (
                Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/')),
                false,
            );
        }
    }
    let path = text
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .expect("a cgroup v1 memory or v2 line");
    (
        Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/')),
        true,
    )
}

impl TestCgroup {
    /// Create `name` below the test process's memory cgroup.
    pub fn create(name: &str) -> TestCgroup {
        let (parent, v2) = own_cgroup();
        let dir = parent.join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir(&dir)
            .unwrap_or_else(|e| panic!("creating cgroup {}: {e}", dir.display()));
        let limit = if v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        assert!(
            dir.join(limit).exists(),
            "{}: no memory controller in this cgroup",
            dir.display()
        );
        TestCgroup { dir, v2 }
    }

    /// The file a process writes its pid to, to join the cgroup.
    pub fn procs(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// Memory charged to the cgroup.
    pub fn usage(&self) -> u64 {
        let f = if self.v2 {
            "memory.current"
        } else {
            "memory.usage_in_bytes"
        };
        std::fs::read_to_string(self.dir.join(f))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    /// File cache charged to the cgroup (active + inactive file pages).
    pub fn file_cache(&self) -> u64 {
        let stat = std::fs::read_to_string(self.dir.join("memory.stat")).unwrap();
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
        get(&format!("{prefix}active_file")) + get(&format!("{prefix}inactive_file"))
    }

    /// Set the memory limit.
    pub fn set_limit(&self, bytes: u64) {
        let f = if self.v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        std::fs::write(self.dir.join(f), bytes.to_string())
            .unwrap_or_else(|e| panic!("setting {} to {bytes}: {e}", self.dir.join(f).display()));
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // The guests are gone by now (dropped first); a cgroup with no tasks can be removed.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        eprintln!("warning: could not remove cgroup {}", self.dir.display());
    }
}
