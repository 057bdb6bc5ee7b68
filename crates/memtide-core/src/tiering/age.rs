//! Each VM's cold age, adapted to its own promotions, as Google's far memory tunes its
//! threshold per job (Lagar-Cavilla et al., ASPLOS'19).
//!
//! A promotion of memory that placement demoted is memory judged cold too soon. Over each
//! window ([`WINDOW_S`], or the VM's age when longer: memory demoted under a shorter age
//! keeps coming back for about that long after a raise) a VM's promotions are compared
//! with the SLO, a share of its working set a minute: above it, the VM's age is multiplied
//! by [`RAISE`] (to [`AgeConfig::COLD_AGE_S`] at least), up to `max_s`; after
//! [`QUIET_WINDOWS`] windows in a row under a quarter of it, the age halves, down to `min_s`
//! (`[tiering] cold_age_s`, where every VM starts). One host-wide age cannot meet the SLO and the slowdown target
//! at once: a VM whose idle memory comes back minutes later needs minutes, and the same
//! age holds fast memory that other VMs' fresh allocations then miss (docs/tiering.md).
//!
//! Pure: the caller measures each VM's promotions and working set and gives them to
//! [`ColdAge::observe`]; [`ColdAge::age_s`] is the age it then measures `TierVm::aged` for.

use crate::action::Reason;
use crate::units::{Bytes, Percent};

/// The least window over which promotions are compared with the SLO (s): the SLO's
/// minute.
pub const WINDOW_S: f64 = 60.0;

/// How much a VM's age is raised at the end of a window above the SLO. Promotions come in
/// bursts (memory idle for minutes coming back at once): in the simulator (docs/tiering.md)
/// doubling met the SLO on none of the scenarios it did not meet already, ×4 on two more,
/// ×8 and ×20 did no better.
pub const RAISE: f64 = 4.0;

/// Windows in a row with promotions under a quarter of the SLO before the age is halved:
/// long enough that the lull between two bursts does not undo the raise (3 did, in the
/// simulator's mixed-8; 5 and 10 did not).
pub const QUIET_WINDOWS: u32 = 5;

/// The adaptive cold age's settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AgeConfig {
    /// Adapt each VM's age; else every VM keeps `min_s`.
    pub adaptive: bool,
    /// The starting and least age (s).
    pub min_s: f64,
    /// The longest age (s).
    pub max_s: f64,
    /// The promotion SLO: promotions of demoted memory a minute, in % of the working set.
    pub slo_pct_per_min: f64,
}

impl AgeConfig {
    /// The default least age, 30 s: with one host-wide age, the longest measured that kept
    /// every built-in scenario of the simulator within its slowdown target
    /// (docs/tiering.md, at 60% DRAM).
    pub const COLD_AGE_S: f64 = 30.0;
    /// The default longest age, 1800 s: longer than the idle spells of memory that comes
    /// back in cycles of up to half an hour (the simulator's web caches wave every 15 min).
    /// At 600 s such a VM's age stopped short of its spells and its page cache went on
    /// coming back every cycle: in two-hour runs at 60% DRAM, cloud-mix and small-vms
    /// promoted 0.19% and 0.50% of their working sets a minute in the second hour; at
    /// 1800 s, 0.02% and 0.002%, no slowdown above 3% (docs/tiering.md).
    pub const MAX_COLD_AGE_S: f64 = 1800.0;
    /// The default SLO, 0.2% of the working set a minute (Google's far memory).
    pub const SLO_PCT_PER_MIN: f64 = 0.2;

    /// How far back the caller must tell memory's age apart (s): the longest age a VM
    /// may be given.
    pub fn horizon_s(&self) -> f64 {
        if self.adaptive {
            self.max_s.max(self.min_s)
        } else {
            self.min_s
        }
    }

    /// The least and the longest age (s); settings that are not numbers count as 0 s for
    /// the least, the least for the longest.
    fn bounds(&self) -> (f64, f64) {
        let min = self.min_s.max(0.0);
        (min, self.max_s.max(min))
    }
}

impl Default for AgeConfig {
    fn default() -> Self {
        AgeConfig {
            adaptive: true,
            min_s: Self::COLD_AGE_S,
            max_s: Self::MAX_COLD_AGE_S,
            slo_pct_per_min: Self::SLO_PCT_PER_MIN,
        }
    }
}

/// One VM's cold age and the window of promotions being measured (by default an age of 0,
/// brought within the settings' bounds at the first observation).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ColdAge {
    age_s: f64,
    /// Seconds into the window.
    elapsed_s: f64,
    /// Promotions of demoted memory in it (bytes).
    promoted: f64,
    /// The working set summed over its seconds (byte-seconds).
    working_set_s: f64,
    /// Windows in a row under a quarter of the SLO.
    quiet: u32,
}

impl ColdAge {
    /// A VM's age at its start: `config`'s least.
    pub fn new(config: &AgeConfig) -> ColdAge {
        ColdAge {
            age_s: config.min_s.max(0.0),
            elapsed_s: 0.0,
            promoted: 0.0,
            working_set_s: 0.0,
            quiet: 0,
        }
    }

    /// A VM's age `age_s` learnt before (by a daemon before its restart), within
    /// `config`'s bounds, its window starting afresh.
    pub fn resume(config: &AgeConfig, age_s: f64) -> ColdAge {
        let (min, max) = config.bounds();
        ColdAge {
            age_s: age_s.clamp(min, max),
            ..ColdAge::new(config)
        }
    }

    /// The VM's cold age now (s).
    pub fn age_s(&self) -> f64 {
        self.age_s
    }

    /// Count `dt_s` seconds in which `promoted` of the memory placement demoted came back
    /// to the fast tier, the VM's working set being `working_set`. At the end of a window
    /// the age is raised or lowered; the reason says how and why, `None` when it stayed.
    pub fn observe(
        &mut self,
        config: &AgeConfig,
        promoted: Bytes,
        working_set: Bytes,
        dt_s: f64,
    ) -> Option<Reason> {
        let (min, max) = config.bounds();
        self.age_s = self.age_s.clamp(min, max);
        if !(config.adaptive && dt_s.is_finite() && dt_s > 0.0) {
            return None;
        }
        self.elapsed_s += dt_s;
        self.promoted += promoted.as_f64();
        self.working_set_s += working_set.as_f64() * dt_s;
        if self.elapsed_s < WINDOW_S.max(self.age_s) {
            return None;
        }
        let (promoted, window_s) = (self.promoted, self.elapsed_s);
        let working_set = self.working_set_s / window_s;
        (self.elapsed_s, self.promoted, self.working_set_s) = (0.0, 0.0, 0.0);
        let rate = if working_set > 0.0 {
            promoted / working_set / (window_s / 60.0)
        } else if promoted > 0.0 {
            f64::INFINITY
        } else {
            0.0
        };
        let slo = config.slo_pct_per_min / 100.0;
        let before = self.age_s;
        let (rule, why) = if rate > slo {
            self.quiet = 0;
            self.age_s = (before * RAISE).max(AgeConfig::COLD_AGE_S).min(max);
            (
                "tier.age_up",
                format!(
                    "promotions {} of the working set a minute over the last {} s, above \
                     the SLO's {}",
                    Percent(rate),
                    window_s.round(),
                    Percent(slo)
                ),
            )
        } else if rate < slo / 4.0 {
            self.quiet += 1;
            if self.quiet < QUIET_WINDOWS {
                return None;
            }
            self.quiet = 0;
            self.age_s = (before / 2.0).max(min);
            (
                "tier.age_down",
                format!(
                    "promotions under a quarter of the SLO's {} a minute for {QUIET_WINDOWS} \
                     windows (the last {} s: {})",
                    Percent(slo),
                    window_s.round(),
                    Percent(rate)
                ),
            )
        } else {
            self.quiet = 0;
            return None;
        };
        (self.age_s != before).then(|| {
            let bound = if self.age_s == max && rule == "tier.age_up" {
                " (the most)"
            } else if self.age_s == min && rule == "tier.age_down" {
                " (the least)"
            } else {
                ""
            };
            Reason::new(
                rule,
                format!("{why}: cold age {before} s → {} s{bound}", self.age_s),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: AgeConfig = AgeConfig {
        adaptive: true,
        min_s: 30.0,
        max_s: 600.0,
        slo_pct_per_min: 0.2,
    };

    /// Observe `secs` seconds a second at a time, `pct` of a 1000 MiB working set
    /// promoted a minute; the reasons given.
    fn run(age: &mut ColdAge, config: &AgeConfig, pct: f64, secs: u32) -> Vec<Reason> {
        let ws = Bytes::from_mib(1000);
        let each = Bytes::from_f64(ws.as_f64() * pct / 100.0 / 60.0);
        (0..secs)
            .filter_map(|_| age.observe(config, each, ws, 1.0))
            .collect()
    }

    #[test]
    fn a_vm_promoting_above_the_slo_gets_a_longer_age_up_to_the_most() {
        let mut age = ColdAge::new(&CONFIG);
        assert_eq!(age.age_s(), 30.0);
        // Nothing changes before a window ends.
        assert!(run(&mut age, &CONFIG, 2.0, 59).is_empty());
        let up = run(&mut age, &CONFIG, 2.0, 1);
        assert_eq!(age.age_s(), 120.0);
        assert_eq!(up[0].rule, "tier.age_up");
        assert_eq!(
            up[0].detail,
            "promotions 2.0% of the working set a minute over the last 60 s, above the \
             SLO's 0.20%: cold age 30 s → 120 s"
        );
        // A window lasts the age once that is longer than a minute: 120 s, then 480 s.
        run(&mut age, &CONFIG, 1.0, 120);
        assert_eq!(age.age_s(), 480.0);
        let up = run(&mut age, &CONFIG, 1.0, 480);
        assert_eq!(age.age_s(), 600.0);
        assert!(up[0].detail.ends_with("cold age 480 s → 600 s (the most)"));
        // At the most it stays, with nothing to say.
        assert!(run(&mut age, &CONFIG, 1.0, 3000).is_empty());
        assert_eq!(age.age_s(), 600.0);
    }

    #[test]
    fn a_quiet_vm_comes_back_down_to_the_least() {
        let mut age = ColdAge::new(&CONFIG);
        run(&mut age, &CONFIG, 1.0, 60);
        assert_eq!(age.age_s(), 120.0);
        // Within the SLO but not well under it: the age stays.
        assert!(run(&mut age, &CONFIG, 0.1, 1200).is_empty());
        assert_eq!(age.age_s(), 120.0);
        // Five quiet windows of 120 s, then halved.
        assert!(run(&mut age, &CONFIG, 0.01, 599).is_empty());
        let down = run(&mut age, &CONFIG, 0.01, 1);
        assert_eq!(age.age_s(), 60.0);
        assert_eq!(down[0].rule, "tier.age_down");
        assert_eq!(
            down[0].detail,
            "promotions under a quarter of the SLO's 0.20% a minute for 5 windows (the last \
             120 s: 0.01%): cold age 120 s → 60 s"
        );
        let down = run(&mut age, &CONFIG, 0.0, 300);
        assert_eq!(age.age_s(), 30.0);
        assert!(down[0].detail.ends_with("cold age 60 s → 30 s (the least)"));
        assert!(run(&mut age, &CONFIG, 0.0, 3600).is_empty());
        assert_eq!(age.age_s(), 30.0);
    }

    #[test]
    fn a_promoting_window_starts_the_quiet_count_again() {
        let mut age = ColdAge::new(&CONFIG);
        run(&mut age, &CONFIG, 1.0, 60);
        run(&mut age, &CONFIG, 0.0, 4 * 120);
        // A window within the SLO but not under a quarter of it breaks the quiet run.
        run(&mut age, &CONFIG, 0.1, 120);
        run(&mut age, &CONFIG, 0.0, 4 * 120);
        assert_eq!(age.age_s(), 120.0);
        run(&mut age, &CONFIG, 0.0, 120);
        assert_eq!(age.age_s(), 60.0);
    }

    #[test]
    fn an_age_resumed_is_kept_within_the_bounds_and_goes_on_adapting() {
        assert_eq!(ColdAge::resume(&CONFIG, 480.0).age_s(), 480.0);
        assert_eq!(ColdAge::resume(&CONFIG, 5000.0).age_s(), 600.0);
        assert_eq!(ColdAge::resume(&CONFIG, 5.0).age_s(), 30.0);
        // Its window starts afresh: a window of its age, then raised.
        let mut age = ColdAge::resume(&CONFIG, 120.0);
        assert!(run(&mut age, &CONFIG, 1.0, 119).is_empty());
        run(&mut age, &CONFIG, 1.0, 1);
        assert_eq!(age.age_s(), 480.0);
    }

    #[test]
    fn bounds_and_settings_are_kept() {
        // Not adaptive: the least age whatever is promoted.
        let fixed = AgeConfig {
            adaptive: false,
            ..CONFIG
        };
        let mut age = ColdAge::new(&fixed);
        assert!(run(&mut age, &fixed, 50.0, 600).is_empty());
        assert_eq!((age.age_s(), fixed.horizon_s()), (30.0, 30.0));
        assert_eq!(CONFIG.horizon_s(), 600.0);
        // A least age of 0 is raised to 30 s at first, and a longest below the least is
        // the least.
        let zero = AgeConfig {
            min_s: 0.0,
            max_s: 45.0,
            ..CONFIG
        };
        let mut age = ColdAge::new(&zero);
        run(&mut age, &zero, 1.0, 60);
        assert_eq!(age.age_s(), 30.0);
        run(&mut age, &zero, 1.0, 60);
        assert_eq!(age.age_s(), 45.0);
        let inverted = AgeConfig {
            max_s: 10.0,
            ..CONFIG
        };
        let mut age = ColdAge::new(&inverted);
        run(&mut age, &inverted, 1.0, 600);
        assert_eq!(age.age_s(), 30.0);
        // Settings that are not numbers: no panic, a least of 0 and a most of the least.
        let nan = AgeConfig {
            min_s: f64::NAN,
            max_s: f64::NAN,
            slo_pct_per_min: f64::NAN,
            ..CONFIG
        };
        let mut age = ColdAge::new(&nan);
        run(&mut age, &nan, 1.0, 600);
        assert_eq!(age.age_s(), 0.0);
        // Promotions with no working set are above any SLO; a tick of no length, or not a
        // number, counts nothing.
        let mut age = ColdAge::new(&CONFIG);
        for dt in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert_eq!(age.observe(&CONFIG, Bytes(1), Bytes::ZERO, dt), None);
        }
        assert!(age.observe(&CONFIG, Bytes(1), Bytes::ZERO, 60.0).is_some());
        assert_eq!(age.age_s(), 120.0);
        // A VM with neither is quiet.
        for _ in 0..QUIET_WINDOWS {
            age.observe(&CONFIG, Bytes::ZERO, Bytes::ZERO, 120.0);
        }
        assert_eq!(age.age_s(), 60.0);
    }
}
