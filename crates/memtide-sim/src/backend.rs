//! The simulated world behind memtide's adapter traits, so that the engine (or the
//! daemon) cannot tell simulated VMs from real ones. Every future completes at once.

use crate::guest::PAGE_SIZE;
use crate::world::World;
use async_trait::async_trait;
use memtide_core::action::KsmSettings;
use memtide_core::backend::{HostBackend, VmBackend};
use memtide_core::snapshot::{BackendError, VmEvent, VmSample};
use memtide_core::stats::HostStats;
use memtide_core::units::Bytes;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// The world, shared by the host and VM backends.
pub type SharedWorld = Arc<Mutex<World>>;

fn lock(world: &SharedWorld) -> MutexGuard<'_, World> {
    world.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One simulated VM's hypervisor connection.
pub struct SimVm {
    world: SharedWorld,
    index: usize,
    target: Option<Bytes>,
}

impl SimVm {
    /// The connection to VM number `index` of `world` (scenario order).
    pub fn new(world: SharedWorld, index: usize) -> Self {
        SimVm {
            world,
            index,
            target: None,
        }
    }
}

#[async_trait]
impl VmBackend for SimVm {
    async fn sample(&mut self) -> Result<VmSample, BackendError> {
        let sample = lock(&self.world).sample(self.index);
        if sample.events.contains(&VmEvent::Reset) {
            self.target = None;
        }
        Ok(sample)
    }

    async fn set_balloon(&mut self, target: Bytes) -> Result<(), BackendError> {
        let mut world = lock(&self.world);
        if !world.vms[self.index].balloon_device {
            return Err(BackendError::Protocol("no balloon device".into()));
        }
        world.guests[self.index].set_target(target.0 / PAGE_SIZE);
        self.target = Some(target);
        Ok(())
    }

    fn target(&self) -> Option<Bytes> {
        self.target
    }
}

/// The simulated host's statistics and KSM knobs.
pub struct SimHost {
    world: SharedWorld,
}

impl SimHost {
    /// The host of `world`.
    pub fn new(world: SharedWorld) -> Self {
        SimHost { world }
    }
}

impl HostBackend for SimHost {
    fn sample(&mut self) -> Result<HostStats, BackendError> {
        Ok(lock(&self.world).host_stats())
    }

    fn apply_ksm(&mut self, settings: &KsmSettings) -> Result<(), BackendError> {
        lock(&self.world).host.apply_ksm(settings);
        Ok(())
    }
}
