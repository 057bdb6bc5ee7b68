//! memtide's I/O adapters: the QEMU QMP client and VM backend, the Linux host backend
//! (procfs, KSM sysfs, memory cgroups). Every parser takes text, so it is tested on
//! captured files.

pub mod cgroup;
pub mod host;
pub mod ksm;
pub mod procfs;
pub mod qga;
pub mod qmp;
