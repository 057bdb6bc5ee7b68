//! Boots the test guest (`guest/build.sh`'s kernel and initramfs) in a memory cgroup of
//! our own; used by the e2e tests (`crates/memtide/tests/support`) and the benchmark
//! harness (`memtide-bench`).
//!
//! [`Cgroup`] creates a memory cgroup (v1 or v2) below the process's own, reads what is
//! charged to it, sets its limit and removes it when dropped. [`Boot`] builds
//! `guest/README.md`'s QEMU command line under TCG (the console in a file, QMP sockets,
//! the guest agent's channel, sparse disk images told apart by their serials) and starts
//! QEMU inside the cgroup, so that every byte it allocates is charged there; the
//! [`Guest`] it returns is killed, and its disk images and sockets removed, when dropped.
//! Nothing outside the cgroup and the given directory is touched.

pub mod cgroup;
pub mod guest;

pub use cgroup::Cgroup;
pub use guest::{guest_dir, Boot, Guest, BALLOON};

use std::path::PathBuf;

/// The proportional set size of process `pid` (its share of each page it maps, from
/// `/proc/PID/smaps_rollup`), in bytes; 0 when unreadable.
pub fn pss(pid: u32) -> u64 {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    rollup
        .lines()
        .find_map(|l| l.strip_prefix("Pss:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib << 10)
}

/// What went wrong setting up or watching the test bed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file operation failed.
    #[error("{what}: {error}")]
    Io {
        /// What was being done, with the path.
        what: String,
        /// Why it failed.
        error: std::io::Error,
    },
    /// The cgroup's memory figures could not be read.
    #[error(transparent)]
    Cgroup(#[from] memtide_adapters::cgroup::CgroupError),
    /// `/proc/self/cgroup` names no memory cgroup.
    #[error("/proc/self/cgroup has neither a v1 memory line nor a v2 line")]
    NoOwnCgroup,
    /// A cgroup was created where the memory controller is not enabled.
    #[error("{}: no memory controller in this cgroup", .0.display())]
    NoMemoryController(PathBuf),
    /// The test guest has not been built.
    #[error("no test guest in {}: run guest/build.sh", .0.display())]
    NoGuest(PathBuf),
    /// A guest did not show what was waited for on its console.
    #[error("guest {name}: {why}; console:\n{console}")]
    Console {
        /// The guest.
        name: String,
        /// What happened instead (QEMU exited, the time ran out, interrupted).
        why: String,
        /// The console's last lines.
        console: String,
    },
}

impl Error {
    /// An [`Error::Io`] saying what was being done.
    fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |error| Error::Io { what, error }
    }
}
