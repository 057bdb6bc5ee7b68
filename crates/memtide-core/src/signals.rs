//! Per-VM signals derived from a VM's history: used memory and fault and swap rates.

use crate::history::History;
use crate::snapshot::VmSample;
use crate::units::Bytes;
use serde::{Deserialize, Serialize};

/// What the engine derives about a guest each tick.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Signals {
    /// Memory the guest uses: its current size minus what it reports free.
    pub used: Option<Bytes>,
    /// Major faults per second.
    pub major_faults_per_s: Option<f64>,
    /// Bytes swapped in per second.
    pub swap_in_per_s: Option<f64>,
    /// Bytes swapped out per second.
    pub swap_out_per_s: Option<f64>,
}

impl Signals {
    /// Signals from a VM's (sanitized) history; the latest sample is the current one.
    pub fn derive(history: &History<VmSample>) -> Signals {
        let used = history
            .latest()
            .and_then(|s| Some(s.balloon.unwrap_or(s.configured) - s.stats.free?));
        Signals {
            used,
            major_faults_per_s: history.rate(|s| s.stats.major_faults),
            swap_in_per_s: history.rate(|s| s.stats.swap_in.map(|b| b.0)),
            swap_out_per_s: history.rate(|s| s.stats.swap_out.map(|b| b.0)),
        }
    }
}
