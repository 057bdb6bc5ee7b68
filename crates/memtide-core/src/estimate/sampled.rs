//! A host-side estimate in the manner of VMware ESX (Waldspurger, "Memory Resource
//! Management in VMware ESX Server"): how much guest memory was touched in each sampling
//! window, smoothed by a fast and a slow moving average; the estimate is the largest of
//! the two and the latest window, so that it rises at once and falls slowly. It needs no
//! guest cooperation, only the hypervisor's view of which pages were touched.

use super::{Estimate, Observation};
use crate::units::{Bytes, Percent};
use serde::{Deserialize, Serialize};

/// Smoothing constants.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SampledConfig {
    /// Weight of the newest window in the fast average.
    pub fast_weight: f64,
    /// Weight of the newest window in the slow average.
    pub slow_weight: f64,
}

impl Default for SampledConfig {
    fn default() -> Self {
        SampledConfig {
            fast_weight: 0.5,
            slow_weight: 0.1,
        }
    }
}

/// One VM's averages.
#[derive(Clone, Debug, Default)]
pub struct Sampled {
    averages: Option<(f64, f64)>,
}

impl Sampled {
    /// Fold in the latest window; `None` while the hypervisor gives no access data (under
    /// KVM without idle page tracking or DAMON, or before the first window closes).
    pub fn step(&mut self, cfg: &SampledConfig, obs: &Observation) -> Option<Estimate> {
        let touched = obs.referenced?.as_f64();
        let (fast, slow) = match self.averages {
            None => (touched, touched),
            Some((f, s)) => (
                f + cfg.fast_weight * (touched - f),
                s + cfg.slow_weight * (touched - s),
            ),
        };
        self.averages = Some((fast, slow));
        let wss = Bytes::from_f64(fast.max(slow).max(touched)).min(obs.configured);
        let active = if obs.size.0 > 0 {
            wss.as_f64() / obs.size.as_f64()
        } else {
            1.0
        };
        let detail = format!(
            "estimate {wss}: {} touched in the last window (fast avg {}, slow avg {}): {} active",
            Bytes::from_f64(touched),
            Bytes::from_f64(fast),
            Bytes::from_f64(slow),
            Percent(active.min(1.0))
        );
        Some(Estimate {
            wss,
            phase: "sampling",
            detail,
            keep: None,
            allocation: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(touched_mib: u64) -> Observation {
        Observation {
            need: None,
            free_page_reporting: false,
            backed: None,
            size: Bytes::from_mib(1000),
            configured: Bytes::from_mib(1000),
            referenced: Some(Bytes::from_mib(touched_mib)),
            ..Observation::default()
        }
    }

    #[test]
    fn rises_at_once_and_falls_slowly() {
        let cfg = SampledConfig::default();
        let mut s = Sampled::default();
        let series: Vec<f64> = [100, 400, 100, 100, 100]
            .iter()
            .map(|m| s.step(&cfg, &obs(*m)).unwrap().wss.mib_f64().round())
            .collect();
        // 400 at once; then the larger of the fast average (175, 137.5, 118.8) and the
        // slow one (127, 124.3, 121.9).
        assert_eq!(series, [100.0, 400.0, 175.0, 138.0, 122.0]);
    }

    #[test]
    fn no_access_data_no_estimate() {
        let mut o = obs(0);
        o.referenced = None;
        assert_eq!(Sampled::default().step(&SampledConfig::default(), &o), None);
    }
}
