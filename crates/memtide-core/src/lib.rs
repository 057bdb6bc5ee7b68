//! memtide's pure decision core: units, snapshots, the engine and the built-in policies.
//! Nothing here performs I/O; collection and actuation live behind the traits in
//! [`backend`], implemented by `memtide-adapters`.

pub mod action;
pub mod backend;
pub mod config;
pub mod decision;
pub mod engine;
pub mod estimate;
pub mod guest_text;
pub mod hibernate;
pub mod history;
pub mod hugepages;
pub mod need;
pub mod policy;
pub mod reclaim;
pub mod recovery;
pub mod sanitize;
pub mod serde_secs;
pub mod signals;
pub mod snapshot;
pub mod stats;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
pub mod tiering;
pub mod units;
pub mod wake;

pub use action::{Action, KsmSettings, Reason};
pub use config::EngineConfig;
pub use decision::{Decision, Diagnostic, DiagnosticKind};
pub use engine::Engine;
pub use snapshot::{
    BackendError, FixedMemory, Snapshot, VirtioMem, VmEvent, VmLimits, VmSample, VmSnapshot,
};
pub use units::Bytes;
