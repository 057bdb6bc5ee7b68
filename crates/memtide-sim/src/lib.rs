//! memtide's simulator and replay.
//!
//! The simulator models guests (anonymous memory and page cache with an LRU
//! approximation, guest swap, balloon, reclaim and OOM), a host (machine memory, host
//! swap blind to what guests use, KSM, optionally a slower memory tier) and workloads described in TOML scenario files.
//! It implements memtide's adapter traits ([`SimVm`], [`SimHost`]), so the engine decides
//! for simulated VMs exactly as for real ones. Replay runs another policy over recordings
//! of what the daemon saw ([`Recorder`], [`replay`]). Reports come with SVG plots
//! ([`svg`], whose plot primitives memtide-bench shares). See `docs/simulator.md`.

pub mod backend;
pub mod density;
pub mod guest;
pub mod host;
pub mod lie;
pub mod pressure;
pub mod record;
pub mod replay;
pub mod report;
pub mod resize;
pub mod rng;
pub mod run;
pub mod scenario;
pub mod svg;
pub mod tiers;
pub mod workload;
pub mod world;

pub use backend::{SimHost, SimVm};
pub use density::{density, DensityReport};
pub use record::{recording_files, Record, RecordError, Recorder, RecorderConfig, Records};
pub use replay::{replay, ReplayReport};
pub use report::{CompareReport, Report, Summary, VmSummary};
pub use run::{compare, run, Simulation};
pub use scenario::{Scenario, ScenarioError};
