//! The ksmtuned algorithm.
//!
//! ksmd is stopped when the VM memory domain has more than a threshold of freeable memory
//! and the VMs' committed memory plus that threshold fits in it. Otherwise it runs, scanning
//! more pages per wake-up while free memory is below the threshold and fewer above it,
//! within bounds, and sleeping for a time that shrinks with the domain's size. A step is
//! taken once per `interval_s`, ksmtuned's `KSM_MONITOR_INTERVAL` ([`Ksmtuned`]); MOM's
//! KSM rules take it at MOM's own pace ([`decide`]). Committed memory is the VMs' balloon
//! sizes, where ksmtuned sums the QEMU processes' RSS.

use super::{KsmProposal, PolicyInput};
use crate::action::{KsmSettings, Reason};
use crate::units::Bytes;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// 16 GiB in KiB: the memory size for which the baseline sleep applies.
const SLEEP_REFERENCE_KIB: u64 = 16 * 1024 * 1024;

/// The KSM tuning constants.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KsmConfig {
    /// Free memory threshold, as a share of the domain's total.
    pub free_ratio: f64,
    /// pages_to_scan increase while free memory is below the threshold.
    pub npages_boost: i64,
    /// pages_to_scan change (negative) while free memory is above it.
    pub npages_decay: i64,
    /// Lowest pages_to_scan.
    pub npages_min: u64,
    /// Highest pages_to_scan.
    pub npages_max: u64,
    /// Sleep between scans for a 16 GiB domain, in ms; scaled by 16 GiB / total.
    pub sleep_ms_baseline: u64,
    /// Shortest sleep, in ms.
    pub sleep_ms_min: u64,
    /// Seconds between two steps (ksmtuned's `KSM_MONITOR_INTERVAL`; 0: a step at every
    /// decision). Not MOM's, which steps at its own pace.
    pub interval_s: f64,
}

impl Default for KsmConfig {
    fn default() -> Self {
        KsmConfig {
            free_ratio: 0.20,
            npages_boost: 300,
            npages_decay: -50,
            npages_min: 64,
            npages_max: 1250,
            sleep_ms_baseline: 10,
            sleep_ms_min: 10,
            interval_s: 60.0,
        }
    }
}

impl KsmConfig {
    /// Check the constants, naming the first bad field.
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.free_ratio) {
            return Err(format!(
                "free_ratio: {} is not a ratio between 0 and 1",
                self.free_ratio
            ));
        }
        // ksmtuned adds the boost while memory is short and the decay while it is not.
        if self.npages_boost < 0 {
            return Err(format!(
                "npages_boost: {} is below 0: the pages to scan would fall as memory runs short",
                self.npages_boost
            ));
        }
        if self.npages_decay > 0 {
            return Err(format!(
                "npages_decay: {} is above 0: the pages to scan would grow while memory is ample",
                self.npages_decay
            ));
        }
        if !(0.0..=3600.0).contains(&self.interval_s) {
            return Err(format!(
                "interval_s: {} is not between 0 and 3600 seconds",
                self.interval_s
            ));
        }
        if self.npages_min > self.npages_max {
            return Err(format!(
                "npages_min: {} is above npages_max {}",
                self.npages_min, self.npages_max
            ));
        }
        // The kernel takes pages_to_scan and sleep_millisecs as 32-bit numbers (as the
        // policy language's KSM controls are bounded).
        let most = u64::from(u32::MAX);
        for (name, value) in [
            ("npages_boost", self.npages_boost.unsigned_abs()),
            ("npages_decay", self.npages_decay.unsigned_abs()),
            ("npages_max", self.npages_max),
            ("sleep_ms_baseline", self.sleep_ms_baseline),
            ("sleep_ms_min", self.sleep_ms_min),
        ] {
            if value > most {
                return Err(format!(
                    "{name}: {value} is above {most}, the most the kernel's KSM knobs take"
                ));
            }
        }
        Ok(())
    }
}

/// ksmtuned at its pace: a step every `interval_s` (found by an audit: a step at every
/// 2 s tick took `pages_to_scan` from 100 to 1250 in 8 s, which ksmtuned takes 5 minutes
/// for, and flipped ksmd on and off at each tick near the threshold); the last step's
/// settings are held in between.
#[derive(Clone, Debug)]
pub struct Ksmtuned {
    config: KsmConfig,
    /// The last step: when, and what it proposed.
    last: Option<(Duration, KsmProposal)>,
}

impl Ksmtuned {
    /// ksmtuned with these constants.
    pub fn new(config: KsmConfig) -> Ksmtuned {
        Ksmtuned { config, last: None }
    }

    /// This decision's KSM settings: a step when `interval_s` has passed since the last
    /// (or the clock went back), the last step's otherwise; `None` without KSM.
    pub fn decide(&mut self, input: &PolicyInput<'_>) -> Option<KsmProposal> {
        input.host_latest().ksm.as_ref()?;
        let interval = Duration::try_from_secs_f64(self.config.interval_s).unwrap_or_default();
        if let Some((at, last)) = &self.last {
            let next = *at + interval;
            if (*at..next).contains(&input.at) {
                let detail = format!(
                    "{}; next step in {} s",
                    last.reason.detail,
                    (next - input.at).as_secs_f64().ceil()
                );
                return Some(KsmProposal {
                    settings: last.settings.clone(),
                    reason: Reason::new(last.reason.rule.clone(), detail),
                });
            }
        }
        let step = decide(&self.config, input)?;
        self.last = Some((input.at, step.clone()));
        Some(step)
    }
}

/// One step of the algorithm: KSM settings, or `None` when the host has no KSM.
pub fn decide(cfg: &KsmConfig, input: &PolicyInput<'_>) -> Option<KsmProposal> {
    let host = input.host_latest();
    let ksm = host.ksm.as_ref()?;
    let total = host.domain.total.kib() as f64;
    let free = host.domain.freeable.kib() as f64;
    let thres = total * cfg.free_ratio;
    let committed: Bytes = input.vms.iter().map(|vm| vm.actual).sum();
    let committed_kib = committed.kib() as f64;
    let mib = |kib: f64| Bytes::from_kib(kib.max(0.0) as u64);

    if free > thres && committed_kib + thres < total {
        let detail = format!(
            "free {} > threshold {} and committed {} + threshold fit in {}: stop ksmd",
            mib(free),
            mib(thres),
            committed,
            mib(total)
        );
        return Some(KsmProposal {
            settings: KsmSettings {
                run: Some(0),
                ..KsmSettings::default()
            },
            reason: Reason::new("ksmtuned.stop", detail),
        });
    }
    let delta = if free < thres {
        cfg.npages_boost
    } else {
        cfg.npages_decay
    };
    let npages = (ksm.pages_to_scan as i64)
        .saturating_add(delta)
        .clamp(cfg.npages_min as i64, cfg.npages_max as i64) as u64;
    let sleep = if total > 0.0 {
        (cfg.sleep_ms_baseline.saturating_mul(SLEEP_REFERENCE_KIB) as f64 / total) as u64
    } else {
        cfg.sleep_ms_baseline
    }
    .max(cfg.sleep_ms_min)
    // Scaled up on a small domain, still what the kernel's 32-bit knob takes.
    .min(u64::from(u32::MAX));
    let detail = format!(
        "free {} {} threshold {} (committed {}): pages_to_scan {} {:+} → {npages}, sleep {sleep} ms",
        mib(free),
        if free < thres { "<" } else { "≥" },
        mib(thres),
        committed,
        ksm.pages_to_scan,
        delta
    );
    Some(KsmProposal {
        settings: KsmSettings {
            run: Some(1),
            pages_to_scan: Some(npages),
            sleep_millisecs: Some(sleep),
            merge_across_nodes: None,
        },
        reason: Reason::new("ksmtuned.run", detail),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::History;
    use crate::signals::Signals;
    use crate::snapshot::VmLimits;
    use crate::stats::HostStats;
    use crate::testkit;
    use std::time::Duration;

    fn decide_with(host: HostStats, committed_mib: &[u64]) -> Option<KsmProposal> {
        decide_under(&KsmConfig::default(), host, committed_mib)
    }

    fn decide_under(
        cfg: &KsmConfig,
        host: HostStats,
        committed_mib: &[u64],
    ) -> Option<KsmProposal> {
        decide_at(Duration::ZERO, host, committed_mib, |input| {
            decide(cfg, input)
        })
    }

    fn decide_at(
        at: Duration,
        host: HostStats,
        committed_mib: &[u64],
        decide: impl FnOnce(&PolicyInput<'_>) -> Option<KsmProposal>,
    ) -> Option<KsmProposal> {
        let mut h = History::new(10);
        h.push(at, host);
        let limits = VmLimits {
            min: Bytes::ZERO,
            max: Bytes::from_mib(100_000),
            shares: 1,
        };
        let history = History::new(1);
        let signals = Signals::default();
        let vms: Vec<_> = committed_mib
            .iter()
            .map(|m| crate::policy::VmInput {
                name: "vm",
                limits: &limits,
                history: &history,
                actual: Bytes::from_mib(*m),
                target: None,
                signals: &signals,
            })
            .collect();
        decide(&PolicyInput {
            at,
            host: &h,
            vms: &vms,
            unreachable: &[],
        })
    }

    #[test]
    fn a_step_is_taken_once_per_interval_and_held_in_between() {
        // 16 GiB host with 1 GiB free, a tick every 2 s for a minute, each step applied:
        // two steps of +300 (ksmtuned's once a minute), not one per tick.
        let mut tuned = Ksmtuned::new(KsmConfig::default());
        let mut host = testkit::host(16384, 1024);
        let mut reasons = Vec::new();
        for t in (0..=60).step_by(2) {
            let at = Duration::from_secs(t);
            let p = decide_at(at, host.clone(), &[8192], |i| tuned.decide(i)).unwrap();
            let ksm = host.ksm.as_mut().unwrap();
            ksm.pages_to_scan = p.settings.pages_to_scan.unwrap();
            reasons.push(p.reason.detail);
        }
        assert_eq!(host.ksm.unwrap().pages_to_scan, 700);
        assert!(
            reasons[1].ends_with("→ 400, sleep 10 ms; next step in 58 s"),
            "{}",
            reasons[1]
        );
        assert!(
            reasons[30].ends_with("→ 700, sleep 10 ms"),
            "{}",
            reasons[30]
        );
        // At every decision where the interval is 0, and none without KSM.
        let every = KsmConfig {
            interval_s: 0.0,
            ..KsmConfig::default()
        };
        let mut tuned = Ksmtuned::new(every);
        let mut host = testkit::host(16384, 1024);
        for t in 0..3 {
            let at = Duration::from_secs(t);
            let p = decide_at(at, host.clone(), &[8192], |i| tuned.decide(i)).unwrap();
            host.ksm.as_mut().unwrap().pages_to_scan = p.settings.pages_to_scan.unwrap();
        }
        assert_eq!(host.ksm.as_ref().unwrap().pages_to_scan, 1000);
        host.ksm = None;
        assert_eq!(
            decide_at(Duration::from_secs(3), host, &[], |i| tuned.decide(i)),
            None
        );
    }

    #[test]
    fn stops_ksm_when_free_and_vms_fit() {
        let p = decide_with(testkit::host(16384, 8000), &[4096, 4096]).unwrap();
        assert_eq!(
            p.settings,
            KsmSettings {
                run: Some(0),
                ..KsmSettings::default()
            }
        );
        assert_eq!(p.reason.rule, "ksmtuned.stop");
    }

    #[test]
    fn boosts_scanning_when_free_memory_is_low() {
        // 16 GiB host with 1 GiB free: below the 20% threshold; kernel at 100 pages.
        let p = decide_with(testkit::host(16384, 1024), &[8192, 8192]).unwrap();
        assert_eq!(p.settings.run, Some(1));
        assert_eq!(p.settings.pages_to_scan, Some(400));
        assert_eq!(p.settings.sleep_millisecs, Some(10));
    }

    #[test]
    fn decays_when_free_but_overcommitted_and_clamps() {
        // Plenty free but committed + threshold exceeds total: run, decay 100 − 50 = 50 → 64.
        let p = decide_with(testkit::host(4096, 3000), &[4096]).unwrap();
        assert_eq!(p.settings.run, Some(1));
        assert_eq!(p.settings.pages_to_scan, Some(64));
        // sleep scales with 16 GiB / total: 10 ms * 4 = 40 ms.
        assert_eq!(p.settings.sleep_millisecs, Some(40));
        let mut host = testkit::host(4096, 100);
        host.ksm.as_mut().unwrap().pages_to_scan = 1200;
        assert_eq!(
            decide_with(host, &[4096]).unwrap().settings.pages_to_scan,
            Some(1250)
        );
    }

    #[test]
    fn sleep_has_a_floor_on_large_hosts_and_a_ceiling_on_small_ones() {
        let p = decide_with(testkit::host(65536, 100), &[]).unwrap();
        assert_eq!(p.settings.sleep_millisecs, Some(10));
        // The largest baseline the configuration takes, scaled by 16 GiB / 1 GiB: no
        // more than the kernel's 32-bit knob takes.
        let cfg = KsmConfig {
            sleep_ms_baseline: u64::from(u32::MAX),
            ..KsmConfig::default()
        };
        let p = decide_under(&cfg, testkit::host(1024, 100), &[]).unwrap();
        assert_eq!(p.settings.sleep_millisecs, Some(u64::from(u32::MAX)));
    }

    #[test]
    fn no_proposal_without_ksm() {
        let mut host = testkit::host(4096, 100);
        host.ksm = None;
        assert!(decide_with(host, &[]).is_none());
    }
}
