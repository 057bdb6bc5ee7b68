//! Shared building blocks for memtide's guest workloads.
//!
//! Every workload binary (`src/bin/*.rs`) runs inside a busybox initramfs,
//! takes a phase pattern (`SIZE_MIB:SECONDS,...`) plus common options, and
//! reports progress as one `name key=value ...` line per interval on stdout,
//! which the guest's init forwards to the serial console.

pub mod cli;
pub mod pattern;
pub mod region;
pub mod report;
