//! memtide's I/O adapters: VM backends for QEMU (QMP), libvirt, Firecracker and Cloud
//! Hypervisor, and the Linux host backend (procfs, KSM sysfs, memory cgroups). Every
//! parser takes text, so it is tested on captured files.

pub mod access;
pub mod api_socket;
pub mod cgroup;
pub mod checksum;
pub mod cloud_hypervisor;
pub mod damon;
pub mod firecracker;
pub mod framing;
pub mod host;
pub mod hugepages;
pub mod ksm;
pub mod kubevirt;
pub mod libvirt;
pub mod migrate;
pub mod pidfd;
pub mod procfs;
pub mod proxmox;
pub mod qga;
pub mod qmp;
pub mod reclaim;
#[cfg(test)]
mod test_memory;
pub mod tiers;
pub mod virtio_mem;
pub mod vmm_snapshot;
pub mod write_behind;

/// Samples between two readings of a VM's devices when nothing told of a change (QEMU
/// sends no event for a device added; libvirt's device events are not watched): a device
/// plugged while the VM runs — a balloon, a virtio-mem device, a DIMM — is learnt within
/// as many samples, two minutes at the default interval (2 s).
pub const RELEARN_SAMPLES: u32 = 60;

/// When a VM's devices are read again with nothing said of a change: every
/// [`RELEARN_SAMPLES`] samples after the last reading.
#[derive(Debug)]
pub struct Relearn {
    left: u32,
}

impl Default for Relearn {
    /// Counting from a reading made now.
    fn default() -> Relearn {
        Relearn {
            left: RELEARN_SAMPLES,
        }
    }
}

impl Relearn {
    /// The next reading due `samples` samples from now (at most a full count): readings
    /// of many VMs connected together spread over the samples.
    pub fn after(samples: u32) -> Relearn {
        Relearn {
            left: samples.min(RELEARN_SAMPLES),
        }
    }

    /// Whether this sample is to read the devices again; counting starts over when it is.
    pub fn due(&mut self) -> bool {
        match self.left.checked_sub(1) {
            Some(left) => {
                self.left = left;
                false
            }
            None => {
                self.restart();
                true
            }
        }
    }

    /// The devices were read now (for another reason): count from here.
    pub fn restart(&mut self) {
        self.left = RELEARN_SAMPLES;
    }
}
