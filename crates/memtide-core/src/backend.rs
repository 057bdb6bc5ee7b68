//! The traits behind which collection and actuation live. Real hypervisor and host
//! adapters, in-memory fakes and the simulator implement them; the engine never sees them.

use crate::action::KsmSettings;
use crate::snapshot::{BackendError, VmSample};
use crate::stats::HostStats;
use crate::units::Bytes;
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// A connection to one VM's hypervisor.
#[async_trait]
pub trait VmBackend: Send {
    /// Collect the VM's current state and the events since the last call.
    async fn sample(&mut self) -> Result<VmSample, BackendError>;
    /// Ask the guest to change its logical size.
    async fn set_balloon(&mut self, target: Bytes) -> Result<(), BackendError>;
    /// The last target delivered since connecting (cleared when the guest resets).
    fn target(&self) -> Option<Bytes>;
    /// Its hypervisor's process id as this connector knows it now, for connectors that
    /// find it after connecting or find it again after it restarted (libvirt's, by the
    /// domain's UUID); `None` where unknown or fixed at connection.
    fn pid(&self) -> Option<i32> {
        None
    }
    /// The operator's bounds, (min, max), as the hypervisor's description of the VM gives
    /// them now, for connectors that read them there and follow the description while the
    /// VM runs (libvirt's metadata, Proxmox VE's configuration); `None` where the
    /// connector gives none, or gives them once at connection.
    fn bounds(&self) -> Option<(Option<Bytes>, Option<Bytes>)> {
        None
    }
    /// What the connection found left stopped by a save or restore of memtide's cut short
    /// and resumed, said in a sentence: taken once, right after connecting.
    fn resumed_at_connection(&mut self) -> Option<String> {
        None
    }
    /// Save the guest's memory and device state into the files of the existing directory
    /// `dir`, the guest stopped meanwhile, within `limit`, then `seal` what was written
    /// (make the snapshot whole) and leave the guest as `then` says: a guest that runs on
    /// is resumed before the seal; a hibernated one's process quits only once the seal
    /// succeeded, and runs on when it failed. A save that fails leaves the guest as it
    /// was. Connectors that cannot save say so.
    async fn save(
        &mut self,
        _dir: &Path,
        _then: AfterSave,
        _limit: Duration,
        _seal: Seal,
    ) -> Result<Saved, BackendError> {
        Err(BackendError::Protocol(
            "this connector cannot save a VM's memory".into(),
        ))
    }
}

/// What makes a saved snapshot whole (checksums, its name): given what the save did,
/// it says whether it could.
pub type Seal = Box<
    dyn FnOnce(
            Saved,
        )
            -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>>
        + Send,
>;

/// What becomes of a VM once its memory is saved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AfterSave {
    /// It runs on (a snapshot).
    Run,
    /// Its hypervisor process quits, its memory freed (hibernation).
    Quit,
}

/// What a save did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Saved {
    /// How the state was written, e.g. "qmp migrate to fd".
    pub mechanism: String,
    /// The guest was running when the save began (a restore resumes it).
    pub was_running: bool,
    /// How long the guest was stopped (until it ran again, or its process quit).
    pub downtime: Duration,
    /// From stopping the guest to its state on disk, synced.
    pub written: Duration,
    /// The hypervisor's name for the guest's RAM (QEMU's memory backend, `pc.ram`), which
    /// a clone's RAM must take, when it says.
    pub ram_backend: Option<String>,
    /// The files the connector checksummed as they were written, by name: the seal takes
    /// these rather than reading the files again, when their sizes still match.
    pub summed: BTreeMap<String, FileSum>,
}

/// A file's size and checksum, as a snapshot's `snapshot.json` records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSum {
    /// Its size in bytes.
    pub bytes: u64,
    /// Its SHA-256, in hex.
    pub sha256: String,
}

/// The host's statistics and knobs.
pub trait HostBackend: Send {
    /// Collect the host's statistics.
    fn sample(&mut self) -> Result<HostStats, BackendError>;
    /// Write the KSM knobs that differ from the kernel's current values.
    fn apply_ksm(&mut self, settings: &KsmSettings) -> Result<(), BackendError>;
}
