//! The test's memory cgroup: memtide-testbed's [`Cgroup`], failing the test on errors.

use memtide_testbed::Cgroup;

/// A memory cgroup (v1 or v2) created for one test, removed on drop; its directory and
/// `procs()` are [`Cgroup`]'s.
pub struct TestCgroup(Cgroup);

impl TestCgroup {
    /// Create `name-<pid>` below the test process's memory cgroup.
    pub fn create(name: &str) -> TestCgroup {
        TestCgroup(Cgroup::create(name).unwrap_or_else(|e| panic!("{e}")))
    }

    /// Memory charged to the cgroup, in bytes.
    pub fn usage(&self) -> u64 {
        self.0.usage().unwrap_or_else(|e| panic!("{e}"))
    }

    /// File cache charged to the cgroup (active + inactive file pages), in bytes.
    pub fn file_cache(&self) -> u64 {
        self.0.file_cache().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Set the memory limit, in bytes, with no swap beyond it ([`Cgroup::set_limit`]):
    /// what does not fit is reclaimed or OOM-killed, whether or not the host has swap.
    pub fn set_limit(&self, bytes: u64) {
        self.0.set_limit(bytes).unwrap_or_else(|e| panic!("{e}"));
    }
}

impl std::ops::Deref for TestCgroup {
    type Target = Cgroup;

    fn deref(&self) -> &Cgroup {
        &self.0
    }
}
