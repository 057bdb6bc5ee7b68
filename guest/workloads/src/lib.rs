//! Shared building blocks for memtide's guest workloads.
//!
//! Every workload binary (`src/bin/*.rs`) runs inside a busybox initramfs,
//! parses its options with [`cli`], keeps a working set of anonymous memory
//! ([`anon`] over a [`region`]) or of page cache ([`fileset`]), and reports
//! progress as one `name t=SECONDS key=value ...` line per interval on
//! stdout ([`report`], from the counts in [`progress`]), which the guest's
//! init forwards to the serial console.

pub mod anon;
pub mod cli;
pub mod fileset;
pub mod lie;
pub mod pattern;
pub mod progress;
pub mod region;
pub mod report;
pub mod vmstat;
