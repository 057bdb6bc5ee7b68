//! The traits behind which collection and actuation live. Real hypervisor and host
//! adapters, in-memory fakes and the simulator implement them; the engine never sees them.

use crate::action::KsmSettings;
use crate::snapshot::{BackendError, VmSample};
use crate::stats::HostStats;
use crate::units::Bytes;
use async_trait::async_trait;

/// A connection to one VM's hypervisor.
#[async_trait]
pub trait VmBackend: Send {
    /// Collect the VM's current state and the events since the last call.
    async fn sample(&mut self) -> Result<VmSample, BackendError>;
    /// Ask the guest to change its logical size.
    async fn set_balloon(&mut self, target: Bytes) -> Result<(), BackendError>;
    /// The last target delivered since connecting (cleared when the guest resets).
    fn target(&self) -> Option<Bytes>;
}

/// The host's statistics and knobs.
pub trait HostBackend: Send {
    /// Collect the host's statistics.
    fn sample(&mut self) -> Result<HostStats, BackendError>;
    /// Write the KSM knobs that differ from the kernel's current values.
    fn apply_ksm(&mut self, settings: &KsmSettings) -> Result<(), BackendError>;
}
