//! QEMU through QMP: the client, the guest-stats parser and the VM backend.

pub mod client;
pub mod stats;
pub mod virtio_mem;
pub mod vm;

pub use client::{QmpClient, QmpError, QmpEvent};
pub use vm::{QmpVm, QmpVmOptions};
