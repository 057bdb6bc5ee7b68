//! Endpoints served by the harness on unix sockets.

pub mod agent;
pub mod qmp;
pub mod vmm;
