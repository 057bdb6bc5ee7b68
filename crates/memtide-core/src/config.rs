//! The engine's own settings (the policies' constants live beside each policy).

use serde::{Deserialize, Serialize};

/// Settings of the engine and its safeguards.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    /// Samples kept per host and per VM for averages (MOM averages over 10).
    pub history_len: usize,
    /// Seconds a guest has to reach a balloon target before it is reported as not reached.
    pub settle_s: u64,
    /// Let policies change KSM knobs.
    pub ksm_control: bool,
    /// Tune KSM also when the VM memory domain is a cgroup. KSM is host-wide: it then
    /// scans and merges memory outside the domain too, so by default it is tuned only
    /// when the domain is the whole host.
    pub ksm_in_cgroup_domain: bool,
}

/// The most samples kept per VM: a sample holds a VM's every figure, and a thousand VMs
/// keeping a thousand each hold half a GiB or more.
pub const MAX_HISTORY_LEN: usize = 1000;

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            history_len: 10,
            settle_s: 30,
            ksm_control: true,
            ksm_in_cgroup_domain: false,
        }
    }
}

impl EngineConfig {
    /// Check the settings, naming the first bad field.
    pub fn validate(&self) -> Result<(), String> {
        // Rates (swap-ins, refaults, stalls) and a VM's reset are told from two samples.
        if self.history_len < 2 {
            return Err("history_len: must be at least 2 (rates need two samples)".into());
        }
        if self.history_len > MAX_HISTORY_LEN {
            return Err(format!(
                "history_len: {} is above {MAX_HISTORY_LEN} (each VM keeps that many samples \
                 in memory)",
                self.history_len
            ));
        }
        Ok(())
    }
}
