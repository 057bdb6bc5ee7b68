//! The TWS probing machine (Chiang, Li, Chiueh, "Working Set-based Physical Memory
//! Ballooning"): start from Committed_AS and lower the estimate every epoch — by 5% of
//! Committed_AS in FAST, 1% in SLOW — until swap-ins or refaults appear; then raise it by
//! the pages faulted back and cool down for 8 s, restarting the cool-down on new faults.
//! A change of Committed_AS resets the machine to FAST at the new Committed_AS.

use super::{clamp, epochs, Estimate, Observation, TickInterval};
use crate::signals::PAGE;
use crate::units::Bytes;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The machine's constants (the paper's values by default).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TwsConfig {
    /// Share of Committed_AS removed per epoch in FAST.
    pub fast_step: f64,
    /// Share of Committed_AS removed per epoch in SLOW.
    pub slow_step: f64,
    /// Seconds without faults before COOL_DOWN turns SLOW.
    pub cool_down_s: f64,
    /// Length of an epoch in seconds (steps scale with the tick interval).
    pub epoch_s: f64,
    /// Relative change of Committed_AS that counts as a new working set (the paper
    /// resets on any change; Committed_AS drifts by pages all the time).
    pub reset_change: f64,
}

impl Default for TwsConfig {
    fn default() -> Self {
        TwsConfig {
            fast_step: 0.05,
            slow_step: 0.01,
            cool_down_s: 8.0,
            epoch_s: 1.0,
            reset_change: 0.05,
        }
    }
}

/// Where the machine is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Phase {
    /// Lowering fast.
    Fast,
    /// Waiting after faults, until the given time.
    CoolDown(Duration),
    /// Lowering slowly.
    Slow,
}

/// One VM's TWS machine.
#[derive(Clone, Debug, Default)]
pub struct Tws {
    /// Current state; `None` before the first observation.
    state: Option<(Phase, Bytes)>,
    /// Committed_AS at the last reset.
    committed: Bytes,
    interval: TickInterval,
}

impl Tws {
    /// The current phase (for tests and reports).
    pub fn phase(&self) -> Option<Phase> {
        self.state.map(|(p, _)| p)
    }

    /// Advance one epoch. Committed_AS comes from the agent; without one, the guest's
    /// used memory stands in. Without either there is no estimate.
    pub fn step(&mut self, cfg: &TwsConfig, obs: &Observation) -> Option<Estimate> {
        let s = &obs.signals;
        let committed = s.committed_as.or(s.used)?;
        let changed = committed.abs_diff(self.committed).as_f64()
            > cfg.reset_change * self.committed.as_f64();
        if self.state.is_none() || changed {
            self.committed = committed;
            self.state = Some((Phase::Fast, committed));
        }
        let (phase, wss) = self.state.expect("set above");
        let faults = s.faults();
        let interval = self.interval.bounded(s.interval);
        let step = |share: f64| {
            self.committed
                .scale(share * epochs(interval, secs(cfg.epoch_s)))
        };
        let (phase, wss, why) = if faults > 0 {
            let until = obs.at + secs(cfg.cool_down_s);
            let raised = wss + Bytes(faults.saturating_mul(PAGE));
            (
                Phase::CoolDown(until),
                raised,
                "pages faulted back: raise and cool down",
            )
        } else {
            match phase {
                Phase::Fast => (
                    Phase::Fast,
                    wss - step(cfg.fast_step),
                    "no faults: lower fast",
                ),
                Phase::CoolDown(until) if obs.at < until => (phase, wss, "cooling down"),
                Phase::CoolDown(_) | Phase::Slow => (
                    Phase::Slow,
                    wss - step(cfg.slow_step),
                    "no faults: lower slowly",
                ),
            }
        };
        let wss = clamp(wss, Bytes::from_mib(16), obs.configured);
        self.state = Some((phase, wss));
        let name = match phase {
            Phase::Fast => "fast",
            Phase::CoolDown(_) => "cool_down",
            Phase::Slow => "slow",
        };
        let committed = self.committed;
        let detail = format!("estimate {wss}: {why} ({faults} faults, Committed_AS {committed})");
        Some(Estimate {
            wss,
            phase: name,
            detail,
            keep: None,
            allocation: None,
        })
    }
}

fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signals::Signals;

    fn obs(t: u64, committed_mib: u64, faults: u64) -> Observation {
        Observation {
            need: None,
            free_page_reporting: false,
            backed: None,
            at: Duration::from_secs(t),
            size: Bytes::from_mib(1024),
            configured: Bytes::from_mib(2048),
            min: Bytes::ZERO,
            referenced: None,
            cold: None,
            signals: Signals {
                committed_as: Some(Bytes::from_mib(committed_mib)),
                swap_ins: Some(faults),
                refaults: Some(0),
                interval: Some(Duration::from_secs(1)),
                ..Signals::default()
            },
        }
    }

    fn run(tws: &mut Tws, steps: &[(u64, u64, u64)]) -> Vec<(f64, Phase)> {
        let cfg = TwsConfig::default();
        steps
            .iter()
            .map(|&(t, c, f)| {
                let e = tws.step(&cfg, &obs(t, c, f)).unwrap();
                (e.wss.mib_f64(), tws.phase().unwrap())
            })
            .collect()
    }

    #[test]
    fn fast_lowers_five_percent_of_committed_per_epoch() {
        let mut tws = Tws::default();
        let out = run(&mut tws, &[(0, 1000, 0), (1, 1000, 0), (2, 1000, 0)]);
        let wss: Vec<f64> = out.iter().map(|o| o.0).collect();
        assert_eq!(wss, [950.0, 900.0, 850.0]);
        assert!(out.iter().all(|o| o.1 == Phase::Fast));
    }

    #[test]
    fn faults_raise_the_estimate_and_cool_down_for_eight_seconds_then_slow() {
        let mut tws = Tws::default();
        // 2560 pages = 10 MiB faulted back at t=2.
        let out = run(
            &mut tws,
            &[
                (0, 1000, 0),
                (1, 1000, 0),
                (2, 1000, 2560),
                (9, 1000, 0),
                (10, 1000, 0),
                (11, 1000, 0),
            ],
        );
        assert_eq!(out[2], (910.0, Phase::CoolDown(Duration::from_secs(10))));
        assert_eq!(out[3].0, 910.0, "holds while cooling down");
        assert_eq!(
            out[4],
            (900.0, Phase::Slow),
            "cool-down over: 1% of Committed_AS per epoch"
        );
        assert_eq!(out[5], (890.0, Phase::Slow));
    }

    #[test]
    fn new_faults_restart_the_cool_down() {
        let mut tws = Tws::default();
        let out = run(
            &mut tws,
            &[
                (0, 1000, 0),
                (1, 1000, 256),
                (5, 1000, 256),
                (9, 1000, 0),
                (13, 1000, 0),
            ],
        );
        assert_eq!(out[2].1, Phase::CoolDown(Duration::from_secs(13)));
        assert_eq!(
            out[3].1,
            Phase::CoolDown(Duration::from_secs(13)),
            "still cooling at 9"
        );
        assert_eq!(out[4].1, Phase::Slow);
    }

    #[test]
    fn a_committed_as_change_resets_to_fast_at_the_new_value() {
        let mut tws = Tws::default();
        let out = run(
            &mut tws,
            &[
                (0, 1000, 0),
                (1, 1000, 256),
                (2, 1000, 0),
                (3, 1500, 0),
                (4, 1520, 0),
            ],
        );
        assert_eq!(
            out[3],
            (1425.0, Phase::Fast),
            "reset to 1500, then one fast step"
        );
        assert_eq!(
            out[4],
            (1350.0, Phase::Fast),
            "a 1.3% drift is not a new working set"
        );
    }

    #[test]
    fn steps_scale_with_the_tick_interval_and_stay_in_bounds() {
        let mut tws = Tws::default();
        let cfg = TwsConfig::default();
        let mut o = obs(0, 1000, 0);
        tws.step(&cfg, &o);
        o.signals.interval = Some(Duration::from_secs(2));
        assert_eq!(
            tws.step(&cfg, &o).unwrap().wss.mib_f64(),
            850.0,
            "two epochs: 10%"
        );
        o.signals.swap_ins = Some(u64::MAX / PAGE);
        assert_eq!(
            tws.step(&cfg, &o).unwrap().wss,
            o.configured,
            "never above the configured size"
        );
        let mut none = obs(0, 0, 0);
        none.signals.committed_as = None;
        assert_eq!(
            Tws::default().step(&cfg, &none),
            None,
            "nothing to start from"
        );
    }
}
