//! The MOM balloon policy (oVirt's Memory Overcommitment Manager, as described in the
//! IBM developerWorks article "Manage resources on overcommitted KVM hosts", and as its
//! balloon rules ship with MOM, `doc/balloon.rules`).
//!
//! When the host's freeable memory (MemFree + Buffers + Cached, averaged over recent
//! samples) falls below a threshold, every guest is shrunk toward its used memory plus
//! a free margin that scales with host pressure; under critical pressure the margin turns
//! negative and guests are pushed below their used memory. Each step is bounded, and no
//! guest is grown while the host is under pressure. When pressure ends, ballooned guests
//! grow back toward their maximum in bounded steps, at once to their used memory and a
//! free margin where they are below it. Arithmetic is done in KiB, MOM's unit, so that
//! policy-language versions of this policy produce the same targets.
//!
//! MOM evaluates its policy every `policy-engine-interval` seconds (10 in MOM's shipped
//! `doc/mom-balloon.conf` and its built-in defaults), the first an interval after it
//! starts, not every time it samples; between evaluations nothing moves, KSM included.
//! What it evaluates is what its collectors sampled: every 5 s, averaged over the last
//! 10 samples ([`collector`]). Policy files run at the same pace ([`Paced`]).

mod collector;
mod pace;

use self::pace::Pace;
pub use self::pace::Paced;
use super::ksmtuned::{self, KsmConfig};
use super::{Policy, PolicyFault, PolicyInput, PolicyOutput, Proposal, VmInput};
use crate::action::Reason;
use crate::history::History;
use crate::stats::HostStats;
use crate::units::{Bytes, Percent};
use serde::{Deserialize, Serialize};

/// The balloon policy's constants (ratios of 1), and MOM's pace: how often it evaluates,
/// how often it samples and over how many samples it averages.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MomConfig {
    /// Below this host free ratio, guests are shrunk.
    pub pressure_threshold: f64,
    /// At or below this host free ratio, guests are pushed below their used memory.
    pub pressure_critical: f64,
    /// Free margin a guest keeps (as a share of its size) when the host is just at the threshold.
    pub min_guest_free: f64,
    /// How far below used memory guests are pushed under critical pressure.
    pub critical_overshoot: f64,
    /// Largest change per decision, as a share of the guest's size.
    pub max_change: f64,
    /// Smallest change worth making, as a share of the guest's size.
    pub min_change: f64,
    /// Seconds between decisions (MOM's `policy-engine-interval`); 0 decides every tick.
    pub interval_s: f64,
    /// Seconds between samples of the host and of each guest (MOM's
    /// `host-monitor-interval` and `guest-monitor-interval`); 0 takes the engine's
    /// history as it is (every tick, its `history_len` ticks).
    pub sample_interval_s: f64,
    /// Samples its averages are taken over (MOM's `sample-history-length`).
    pub sample_history: usize,
}

impl Default for MomConfig {
    fn default() -> Self {
        MomConfig {
            pressure_threshold: 0.20,
            pressure_critical: 0.05,
            min_guest_free: 0.20,
            critical_overshoot: 0.05,
            max_change: 0.05,
            min_change: 0.0025,
            interval_s: 10.0,
            sample_interval_s: 5.0,
            sample_history: 10,
        }
    }
}

impl MomConfig {
    /// Check the constants, naming the first bad field.
    pub fn validate(&self) -> Result<(), String> {
        let ratios = [
            ("pressure_threshold", self.pressure_threshold),
            ("pressure_critical", self.pressure_critical),
            ("min_guest_free", self.min_guest_free),
            ("critical_overshoot", self.critical_overshoot),
            ("max_change", self.max_change),
            ("min_change", self.min_change),
        ];
        for (name, v) in ratios {
            if !(0.0..=1.0).contains(&v) {
                return Err(format!("{name}: {v} is not a ratio between 0 and 1"));
            }
        }
        for (name, v) in [
            ("interval_s", self.interval_s),
            ("sample_interval_s", self.sample_interval_s),
        ] {
            if !(v.is_finite() && (0.0..=86_400.0).contains(&v)) {
                return Err(format!(
                    "{name}: {v} is not a number of seconds (0 to 86400)"
                ));
            }
        }
        if !(2..=1000).contains(&self.sample_history) {
            return Err(format!(
                "sample_history: {} is not a number of samples (2 to 1000)",
                self.sample_history
            ));
        }
        if self.pressure_critical >= self.pressure_threshold {
            return Err(format!(
                "pressure_critical: {} must be below pressure_threshold {}",
                self.pressure_critical, self.pressure_threshold
            ));
        }
        Ok(())
    }
}

/// Host free ratio as MOM computes it: mean freeable memory over the history, divided by
/// the latest total (both in KiB).
pub fn host_free_ratio(host: &History<HostStats>) -> f64 {
    let total = host.latest().map_or(0, |h| h.domain.total.kib()) as f64;
    let free = host
        .mean(|h| Some(h.domain.freeable.kib() as f64))
        .unwrap_or(0.0);
    if total > 0.0 {
        free / total
    } else {
        0.0
    }
}

fn kib(b: Bytes) -> f64 {
    b.kib() as f64
}

fn pct(ratio: f64) -> Percent {
    Percent(ratio)
}

/// The guest's used memory in KiB, as MOM takes it: its balloon size less its free
/// memory, each averaged over the history.
fn used_kib(vm: &VmInput<'_>) -> Result<f64, String> {
    let avg_cur = vm
        .history
        .mean(|s| s.balloon.map(kib))
        .unwrap_or(kib(vm.actual));
    let avg_free = vm.history.mean(|s| s.stats.free.map(kib)).ok_or(
        "no free-memory statistic from the guest yet (is its balloon driver reporting stats?)",
    )?;
    Ok(avg_cur - avg_free)
}

/// A decision for one VM: a new target, a reason to hold, or a failure.
enum Step {
    Target(Proposal),
    Hold(Reason),
}

/// The MOM policy: the balloon rules, plus the ksmtuned rules when KSM is configured.
#[derive(Clone, Debug)]
pub struct Mom {
    rules: Rules,
    pace: Pace,
}

/// The balloon rules' and ksmtuned's constants.
#[derive(Clone, Debug)]
struct Rules {
    balloon: MomConfig,
    ksm: KsmConfig,
}

impl Default for Mom {
    fn default() -> Self {
        Mom::new(MomConfig::default(), KsmConfig::default())
    }
}

impl Mom {
    /// MOM with these balloon and KSM constants.
    pub fn new(balloon: MomConfig, ksm: KsmConfig) -> Mom {
        Mom {
            pace: Pace::new(&balloon),
            rules: Rules { balloon, ksm },
        }
    }
}

impl Rules {
    fn bounded(&self, rule: &'static str, vm: &VmInput<'_>, size_kib: f64, why: String) -> Step {
        let cur = kib(vm.actual);
        let change = (size_kib - cur).abs();
        if change > self.balloon.min_change * cur {
            let target = Bytes::from_kib(size_kib.max(0.0) as u64);
            Step::Target(Proposal {
                target,
                reason: Reason::new(rule, why),
            })
        } else {
            Step::Hold(Reason::new(
                rule,
                format!(
                    "{why}; change of {} is below the minimum {}",
                    Bytes::from_kib(change as u64),
                    pct(self.balloon.min_change)
                ),
            ))
        }
    }

    fn shrink(&self, host_ratio: f64, vm: &VmInput<'_>) -> Result<Step, String> {
        let c = &self.balloon;
        let cur = kib(vm.actual);
        let guest_free_ratio = if host_ratio <= c.pressure_critical {
            host_ratio - c.critical_overshoot
        } else {
            c.min_guest_free * (host_ratio / c.pressure_threshold)
        };
        let used = used_kib(vm)?;
        let floor = used + guest_free_ratio * cur;
        let size = (cur * (1.0 - c.max_change)).max(floor);
        let why = format!(
            "host free {} < {}: guest uses {} and keeps a free margin of {} → {}",
            pct(host_ratio),
            pct(c.pressure_threshold),
            Bytes::from_kib(used.max(0.0) as u64),
            pct(guest_free_ratio),
            Bytes::from_kib(size as u64),
        );
        // Under pressure MOM only ever shrinks: a guest whose floor is above its size
        // keeps its size.
        if size > cur {
            return Ok(Step::Hold(Reason::new(
                "mom.shrink",
                format!("{why}, above its size: under host pressure it keeps its size"),
            )));
        }
        Ok(self.bounded("mom.shrink", vm, size, why))
    }

    fn grow(&self, host_ratio: f64, vm: &VmInput<'_>) -> Result<Step, String> {
        let c = &self.balloon;
        let cur = kib(vm.actual);
        let max = kib(vm.limits.max);
        // At least its used memory and its free margin, at once; else one step.
        let used = used_kib(vm)?;
        let floor = used + c.min_guest_free * cur;
        let size = (cur * (1.0 + c.max_change)).max(floor).min(max);
        let why = format!(
            "host free {} ≥ {}: grow by {}, at least to its use {} and a free margin of {}, \
             toward the maximum {}",
            pct(host_ratio),
            pct(c.pressure_threshold),
            pct(c.max_change),
            Bytes::from_kib(used.max(0.0) as u64),
            pct(c.min_guest_free),
            vm.limits.max
        );
        Ok(self.bounded("mom.grow", vm, size, why))
    }

    /// One evaluation of the balloon and KSM rules.
    fn evaluate(&self, input: &PolicyInput<'_>) -> PolicyOutput {
        let mut out = PolicyOutput::with_capacity(input.vms.len());
        let host_ratio = host_free_ratio(input.host);
        let under_pressure = host_ratio < self.balloon.pressure_threshold;
        for vm in input.vms {
            let step = if under_pressure {
                self.shrink(host_ratio, vm)
            } else {
                self.grow(host_ratio, vm)
            };
            match step {
                Ok(Step::Target(p)) => {
                    out.balloon.insert(vm.name.to_string(), p);
                }
                Ok(Step::Hold(r)) => {
                    out.holds.insert(vm.name.to_string(), r);
                }
                Err(message) => out.faults.push(PolicyFault {
                    vm: Some(vm.name.to_string()),
                    message,
                }),
            }
        }
        out.ksm = ksmtuned::decide(&self.ksm, input);
        out
    }
}

impl Policy for Mom {
    fn name(&self) -> &str {
        "mom"
    }

    fn decide(&mut self, input: &PolicyInput<'_>) -> PolicyOutput {
        let rules = &self.rules;
        self.pace
            .run(input, "mom.wait", |input| rules.evaluate(input))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signals::Signals;
    use crate::snapshot::VmLimits;
    use crate::testkit;
    use std::time::Duration;

    /// Run the balloon rules for one guest, with `host_free` of 1000 MiB freeable.
    fn decide(host_free_mib: u64, actual_mib: u64, free_mib: u64) -> PolicyOutput {
        decide_at(
            &mut testkit::mom_every_tick(),
            0,
            host_free_mib,
            actual_mib,
            free_mib,
        )
    }

    /// MOM at its own pace, on the engine's history rather than samples of its own.
    fn on_engine_samples() -> Mom {
        let balloon = MomConfig {
            sample_interval_s: 0.0,
            ..MomConfig::default()
        };
        Mom::new(balloon, KsmConfig::default())
    }

    /// [`decide`] by `mom` at second `at`.
    fn decide_at(
        mom: &mut Mom,
        at: u64,
        host_free_mib: u64,
        actual_mib: u64,
        free_mib: u64,
    ) -> PolicyOutput {
        let mut host = History::new(10);
        host.push(Duration::ZERO, testkit::host(1000, host_free_mib));
        let vm = testkit::vm("a", 1000, actual_mib, free_mib);
        let mut history = History::new(10);
        history.push(Duration::ZERO, vm.sample.clone().unwrap());
        let limits = VmLimits {
            min: Bytes::ZERO,
            max: Bytes::from_mib(1000),
            shares: 1,
        };
        let signals = Signals::default();
        let vms = [VmInput {
            name: "a",
            limits: &limits,
            history: &history,
            actual: Bytes::from_mib(actual_mib),
            target: None,
            signals: &signals,
        }];
        mom.decide(&PolicyInput {
            at: Duration::from_secs(at),
            host: &host,
            vms: &vms,
            unreachable: &[],
        })
    }

    fn target_mib(out: &PolicyOutput) -> Option<f64> {
        out.balloon.get("a").map(|p| p.target.mib_f64())
    }

    #[test]
    fn shrinks_by_at_most_five_percent_under_pressure() {
        // host free 10%: margin 0.20 * 0.10/0.20 = 10%; floor = 200 used + 80 = 280 MiB,
        // so the 5% step (800 → 760) applies.
        let out = decide(100, 800, 600);
        assert_eq!(target_mib(&out), Some(760.0));
        assert_eq!(out.balloon["a"].reason.rule, "mom.shrink");
    }

    #[test]
    fn shrink_stops_at_used_plus_margin() {
        // host free 10% → margin 10% of 400 = 40; used 370 → floor 410 above the guest's
        // size: under pressure MOM only shrinks, so the guest keeps its size.
        let out = decide(100, 400, 30);
        assert_eq!(target_mib(&out), None);
        assert!(
            out.holds["a"].detail.contains("keeps its size"),
            "{:?}",
            out.holds
        );
        // floor 384 (used 344 + 40): within the 5% step, the floor wins.
        let out = decide(100, 400, 56);
        assert_eq!(target_mib(&out), Some(384.0));
    }

    #[test]
    fn critical_pressure_pushes_below_used_memory() {
        // host free 4%: margin 0.04 − 0.05 = −1% of 400 = −4; used 396 → floor 392 < 400.
        let out = decide(40, 400, 4);
        assert_eq!(target_mib(&out), Some(392.0));
    }

    #[test]
    fn grows_back_by_five_percent_up_to_max_without_pressure() {
        assert_eq!(target_mib(&decide(500, 600, 100)), Some(630.0));
        // At least its use and a 20% margin at once: used 590 + 120.
        assert_eq!(target_mib(&decide(500, 600, 10)), Some(710.0));
        assert_eq!(target_mib(&decide(500, 990, 100)), Some(1000.0));
        let at_max = decide(500, 1000, 100);
        assert_eq!(target_mib(&at_max), None);
        assert!(
            at_max.holds["a"].detail.contains("below the minimum"),
            "{:?}",
            at_max.holds
        );
    }

    #[test]
    fn it_evaluates_an_interval_after_it_starts_and_every_interval_after() {
        let mut mom = on_engine_samples();
        let held = |out: &PolicyOutput| {
            target_mib(out).is_none() && out.holds["a"].rule == "mom.wait" && out.ksm.is_none()
        };
        for at in [100, 105, 109] {
            assert!(held(&decide_at(&mut mom, at, 100, 800, 600)), "at {at} s");
        }
        assert_eq!(
            target_mib(&decide_at(&mut mom, 110, 100, 800, 600)),
            Some(760.0)
        );
        assert!(held(&decide_at(&mut mom, 119, 100, 760, 560)));
        // A tick a moment late: evaluated, and the schedule kept.
        let late = decide_at(&mut mom, 121, 100, 760, 560);
        assert_eq!(target_mib(&late), Some(722.0));
        assert!(held(&decide_at(&mut mom, 129, 100, 722, 522)));
        assert!(target_mib(&decide_at(&mut mom, 130, 100, 722, 522)).is_some());
        // Ticks that stopped for a while: one evaluation, then the schedule on from it.
        assert!(target_mib(&decide_at(&mut mom, 175, 100, 722, 522)).is_some());
        assert!(held(&decide_at(&mut mom, 179, 100, 722, 522)));
        assert!(target_mib(&decide_at(&mut mom, 180, 100, 722, 522)).is_some());
        let mut mom = testkit::mom_every_tick();
        for at in [0, 1] {
            assert!(target_mib(&decide_at(&mut mom, at, 100, 800, 600)).is_some());
        }
        // An interval that is not a duration (refused by `validate`): never, not always.
        let balloon = MomConfig {
            interval_s: f64::NAN,
            ..MomConfig::default()
        };
        let mut mom = Mom::new(balloon, KsmConfig::default());
        for at in [0, 1, 1_000_000] {
            assert!(held(&decide_at(&mut mom, at, 100, 800, 600)), "at {at} s");
        }
    }

    /// `mom` ticked every second from 0 to 60 s with an engine history of 10 ticks: a
    /// 800 MiB guest on a 1000 MiB host, the host's freeable and the guest's free MiB
    /// `before` 30 s and `after`; its target at 60 s.
    fn target_after_a_minute(mom: &mut Mom, before: (u64, u64), after: (u64, u64)) -> Option<f64> {
        let mut out = PolicyOutput::default();
        let figures = |t| if t < 30 { before } else { after };
        collector::tests::feed(0..=60, None, figures, |input| out = mom.decide(input));
        target_mib(&out)
    }

    #[test]
    fn it_averages_over_its_own_samples_every_5_s_for_50_s() {
        // The guest: sampled at 15, 20, …, 60, free 600 MiB three times, 100 seven
        // times, a mean of 250; used 550, its floor (and a 10% margin) 630 below a 5%
        // step: 760. On the engine's 10 ticks (all at 100 MiB free): used 700, the
        // floor 780.
        // The host: 500 MiB free three samples of ten, 100 seven, 22%: no pressure, the
        // guest (600 MiB free) grows by a step to 840. On the engine's, 10%: it shrinks.
        let cases = [
            ("guest", (100, 600), (100, 100), 760.0, 780.0),
            ("host", (500, 600), (100, 600), 840.0, 760.0),
        ];
        for (what, before, after, ours, engines) in cases {
            let mut mom = Mom::default();
            assert_eq!(
                target_after_a_minute(&mut mom, before, after),
                Some(ours),
                "{what}"
            );
            let on_engines = target_after_a_minute(&mut on_engine_samples(), before, after);
            assert_eq!(on_engines, Some(engines), "{what}");
        }
    }

    #[test]
    fn missing_guest_stats_is_a_fault_for_that_guest() {
        let mut host = History::new(10);
        host.push(Duration::ZERO, testkit::host(1000, 100));
        let mut sample = testkit::vm("a", 1000, 800, 0).sample.unwrap();
        sample.stats.free = None;
        let mut history = History::new(10);
        history.push(Duration::ZERO, sample);
        let limits = VmLimits {
            min: Bytes::ZERO,
            max: Bytes::from_mib(1000),
            shares: 1,
        };
        let signals = Signals::default();
        let vms = [VmInput {
            name: "a",
            limits: &limits,
            history: &history,
            actual: Bytes::from_mib(800),
            target: None,
            signals: &signals,
        }];
        let out = testkit::mom_every_tick().decide(&PolicyInput {
            at: Duration::ZERO,
            host: &host,
            vms: &vms,
            unreachable: &[],
        });
        assert!(out.balloon.is_empty());
        assert_eq!(out.faults.len(), 1);
        assert!(out.faults[0]
            .message
            .starts_with("no free-memory statistic"));
    }

    #[test]
    fn config_validation_names_the_field() {
        let bad = MomConfig {
            pressure_critical: 0.3,
            ..MomConfig::default()
        };
        assert_eq!(
            bad.validate().unwrap_err(),
            "pressure_critical: 0.3 must be below pressure_threshold 0.2"
        );
        let bad = MomConfig {
            max_change: 1.5,
            ..MomConfig::default()
        };
        assert!(bad.validate().unwrap_err().starts_with("max_change:"));
        for sample_history in [0, 1, 1001] {
            let bad = MomConfig {
                sample_history,
                ..MomConfig::default()
            };
            assert!(bad.validate().unwrap_err().starts_with("sample_history:"));
        }
        let bad = MomConfig {
            sample_interval_s: -5.0,
            ..MomConfig::default()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .starts_with("sample_interval_s:"));
        for interval_s in [-1.0, f64::NAN, 1e9] {
            let bad = MomConfig {
                interval_s,
                ..MomConfig::default()
            };
            assert!(bad.validate().unwrap_err().starts_with("interval_s:"));
        }
    }
}
