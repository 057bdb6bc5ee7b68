//! The memtide binary's library: configuration, the daemon, its endpoints and the CLI
//! renderers. A thin layer of glue over `memtide-core` (decisions) and
//! `memtide-adapters` (I/O).

pub mod accept;
pub mod access_cmd;
pub mod config;
pub mod control;
pub mod daemon;
pub mod http;
pub mod journal;
pub mod metrics;
pub mod place_cmd;
pub mod placement;
pub mod policies;
pub mod policy_cmd;
pub mod reclaim_cmd;
pub mod render;
pub mod sim_cmd;
pub mod snapshot_cmd;
pub mod snapshots;
pub mod status;
pub mod stdout;
pub mod text_file;
pub mod top;
