//! QEMU through QMP: the client, the guest-stats parser, the VM backend and its memory
//! snapshots.

pub mod client;
pub mod snapshot;
pub mod stats;
pub mod virtio_mem;
pub mod vm;

pub use client::{QmpClient, QmpError, QmpEvent};
pub use vm::{AccessSampling, QmpVm, QmpVmOptions};
