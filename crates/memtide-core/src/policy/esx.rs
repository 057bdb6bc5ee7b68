//! The ESX policy (Waldspurger, "Memory Resource Management in VMware ESX Server").
//!
//! The host's free memory selects a state: high (at least 6% free) reclaims nothing and
//! lets ballooned guests grow back; soft (4%), hard (2%) and low (1%) reclaim toward each
//! VM's entitlement ever faster. Entitlements divide the memory the VMs may hold in
//! proportion to shares, where idle memory is taxed: an idle page costs 1/(1−τ) times an
//! active one (τ = 0.75: four times), with activity from host-side sampling.

use super::divide::{capacity, divide, Claim};
use super::ksmtuned::{KsmConfig, Ksmtuned};
use super::working_set::observe;
use super::{Policy, PolicyInput, PolicyOutput, Proposal};
use crate::action::Reason;
use crate::estimate::sampled::{Sampled, SampledConfig};
use crate::units::{Bytes, Percent};
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

/// The constants (ESX's published values by default).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EsxConfig {
    /// Free share at or above which the host is in the high state.
    pub high: f64,
    /// Soft state threshold.
    pub soft: f64,
    /// Hard state threshold.
    pub hard: f64,
    /// Low state threshold.
    pub low: f64,
    /// The idle memory tax rate τ.
    pub idle_tax: f64,
    /// Largest shrink per decision in the soft, hard and low states, as shares of the
    /// guest's size; and growth per decision in the high state.
    pub soft_step: f64,
    /// See `soft_step`.
    pub hard_step: f64,
    /// See `soft_step`.
    pub low_step: f64,
    /// See `soft_step`.
    pub grow_step: f64,
    /// Smoothing of the sampled activity.
    pub sampling: SampledConfig,
}

impl Default for EsxConfig {
    fn default() -> Self {
        EsxConfig {
            high: 0.06,
            soft: 0.04,
            hard: 0.02,
            low: 0.01,
            idle_tax: 0.75,
            soft_step: 0.05,
            hard_step: 0.20,
            low_step: 1.0,
            grow_step: 0.10,
            sampling: SampledConfig::default(),
        }
    }
}

/// The ESX policy.
pub struct Esx {
    config: EsxConfig,
    ksm: Ksmtuned,
    activity: FxHashMap<String, Sampled>,
}

impl Esx {
    /// The policy with its constants.
    pub fn new(config: EsxConfig, ksm: KsmConfig) -> Esx {
        Esx {
            config,
            ksm: Ksmtuned::new(ksm),
            activity: FxHashMap::default(),
        }
    }

    /// The host state for a free share, and the shrink step it allows.
    fn state(&self, free: f64) -> (&'static str, f64) {
        let c = &self.config;
        if free >= c.high {
            ("high", 0.0)
        } else if free >= c.soft {
            ("soft", c.soft_step)
        } else if free >= c.hard {
            ("hard", c.hard_step)
        } else {
            // Below `low` ESX also blocks VMs; here it means ballooning straight to entitlement.
            (
                if free >= c.low { "hard" } else { "low" },
                if free >= c.low {
                    c.hard_step
                } else {
                    c.low_step
                },
            )
        }
    }
}

impl Policy for Esx {
    fn name(&self) -> &str {
        "esx"
    }

    fn decide(&mut self, input: &PolicyInput<'_>) -> PolicyOutput {
        let mut out = PolicyOutput {
            ksm: self.ksm.decide(input),
            ..PolicyOutput::default()
        };
        let domain = &input.host_latest().domain;
        let free = domain.free_ratio();
        let (state, step) = self.state(free);
        let known = input.known();
        self.activity
            .retain(|name, _| known.contains(name.as_str()));
        // Entitlement: what the VMs hold plus what is free, less the high-state reserve,
        // divided by shares-per-page with idle memory taxed.
        let capacity = capacity(input, domain.total.scale(self.config.high));
        let idle_cost = 1.0 / (1.0 - self.config.idle_tax.clamp(0.0, 0.99));
        let mut active = Vec::new();
        let claims: Vec<Claim> = input
            .vms
            .iter()
            .map(|vm| {
                let sampler = self.activity.entry(vm.name.to_string()).or_default();
                let sampled = sampler.step(&self.config.sampling, &observe(input.at, vm));
                if let Some(e) = &sampled {
                    out.estimates.insert(vm.name.to_string(), e.wss);
                }
                let f =
                    sampled.map(|e| (e.wss.as_f64() / vm.actual.as_f64().max(1.0)).clamp(0.0, 1.0));
                active.push(f);
                let f = f.unwrap_or(1.0); // activity unknown: no idle tax
                Claim {
                    min: vm.limits.min,
                    want: vm.limits.max,
                    weight: f64::from(vm.limits.shares) / (f + idle_cost * (1.0 - f)),
                }
            })
            .collect();
        let entitled = divide(capacity, &claims);
        for ((vm, entitlement), f) in input.vms.iter().zip(entitled).zip(active) {
            let activity = f.map_or("activity unknown, no idle tax".to_string(), |f| {
                format!("{} active", Percent(f))
            });
            let why = format!(
                "host free {}: {state} state; entitlement {entitlement} ({activity}, {} shares)",
                Percent(free),
                vm.limits.shares
            );
            let target = if state == "high" {
                // No reclamation: give memory back up to the entitlement.
                (vm.actual + vm.actual.scale(self.config.grow_step)).min(entitlement.max(vm.actual))
            } else {
                // Reclaim only: toward the entitlement, by at most the state's step.
                entitlement
                    .max(vm.actual - vm.actual.scale(step))
                    .min(vm.actual)
            };
            if target.abs_diff(vm.actual) > Bytes::from_mib(1) {
                out.balloon.insert(
                    vm.name.to_string(),
                    Proposal {
                        target,
                        reason: Reason::new(format!("esx.{state}"), why),
                    },
                );
            } else {
                out.holds.insert(
                    vm.name.to_string(),
                    Reason::new(format!("esx.{state}"), why),
                );
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::History;
    use crate::policy::VmInput;
    use crate::signals::Signals;
    use crate::snapshot::{VmLimits, VmSample};
    use crate::testkit;
    use std::time::Duration;

    /// Two 1000 MiB VMs at `size` each, touching `touched` MiB each, on a 2000 MiB host
    /// with `free` MiB freeable.
    fn decide(free: u64, size: u64, touched: [Option<u64>; 2]) -> PolicyOutput {
        let mut host = History::new(10);
        host.push(Duration::ZERO, testkit::host(2000, free));
        let mut histories: Vec<History<VmSample>> = Vec::new();
        for t in touched {
            let mut s = testkit::vm("x", 1000, size, 0).sample.unwrap();
            s.referenced = t.map(Bytes::from_mib);
            let mut h = History::new(10);
            h.push(Duration::ZERO, s);
            histories.push(h);
        }
        let limits = VmLimits {
            min: Bytes::from_mib(100),
            max: Bytes::from_mib(1000),
            shares: 1000,
        };
        let signals = Signals::default();
        let names = ["busy", "idle"];
        let inputs: Vec<VmInput<'_>> = (0..2)
            .map(|i| VmInput {
                name: names[i],
                limits: &limits,
                history: &histories[i],
                actual: Bytes::from_mib(size),
                target: None,
                signals: &signals,
            })
            .collect();
        Esx::new(EsxConfig::default(), KsmConfig::default()).decide(&PolicyInput {
            at: Duration::ZERO,
            host: &host,
            vms: &inputs,
            unreachable: &[],
        })
    }

    #[test]
    fn states_follow_free_memory() {
        let rule = |free| {
            decide(free, 900, [None, None])
                .balloon
                .values()
                .next()
                .map(|p| p.reason.rule.clone())
        };
        assert_eq!(rule(30), Some("esx.hard".into()), "1.5% free");
        assert_eq!(rule(10), Some("esx.low".into()), "0.5% free");
        assert_eq!(rule(90), Some("esx.soft".into()), "4.5% free");
        let high = decide(200, 800, [None, None]);
        assert!(
            high.balloon
                .values()
                .all(|p| p.reason.rule == "esx.high" && p.target > Bytes::from_mib(800)),
            "grows back"
        );
    }

    #[test]
    fn idle_memory_is_taxed() {
        // Low state: straight to entitlement. 1800 held + 10 free − 120 reserve = 1690.
        // The busy VM (all active) weighs 4× the idle one (nothing active): shares 1:4
        // of 1490 above the minimums: idle 100+298, busy 100+1192 → capped at 1000.
        let o = decide(10, 900, [Some(900), Some(0)]);
        let (busy, idle) = (
            o.balloon.get("busy").map(|p| p.target.mib()),
            o.balloon["idle"].target.mib(),
        );
        assert_eq!(
            idle, 690,
            "what the busy VM cannot take flows back: 1690 − 1000"
        );
        assert_eq!(
            busy, None,
            "the busy VM keeps its 900 (entitled to 1000, nothing to reclaim)"
        );
        assert!(o.balloon["idle"].reason.detail.contains("0.00% active"));
    }
}
