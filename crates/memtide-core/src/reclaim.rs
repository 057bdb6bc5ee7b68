//! Proactive reclaim pacing (Meta's Senpai, as in TMO): how much of a VM's memory to ask
//! its cgroup v2 `memory.reclaim` for this tick, for VMs whose memory no balloon takes.
//!
//! Pure: the caller reads the cgroup (usage, stall time, refaults) and writes the amount.
//! While the cgroup's memory pressure is under the target, the step is a share of its
//! usage per second, scaled down as pressure nears the target; at or above the target, or
//! when refaults show reclaimed memory coming back, nothing is reclaimed. Usage is never
//! pushed below what the VM keeps (its working set plus a floor, never under its minimum),
//! and a step takes at most half the way down to it.

use crate::action::Reason;
use crate::units::{Bytes, Percent};
use std::time::Duration;

/// Memory a refault brings back: one page (the base page of x86-64 and arm64 hosts).
const PAGE: u64 = 4096;
/// The least step taken near what a VM keeps: the kernel reclaims at least a batch of 32
/// pages whatever it is asked, and usage goes on falling for a while as pages written to
/// swap are freed (a test guest's cgroup went 60 KiB below it when asked for 60 KiB with
/// 150 KiB to go; with 1 MiB least steps it ended 0.4 and 1.3 MiB above it).
const MIN_STEP: Bytes = Bytes::from_mib(2);
/// Readings further apart than this, and than three times the gap before, start the
/// rates again: a stall or refaults averaged over a long gap (a pass skipped, a VM away)
/// would look diluted, while the step counts at most this long.
const LONG_GAP: Duration = Duration::from_secs(60);
/// How long reclaim holds after the kernel found less to take than it was asked, unless
/// usage grows by what was asked (at least [`MIN_STEP`]) first: what it could not take
/// then (anonymous memory with no swap or zswap to go to) it would not take at the next
/// tick either (found by an audit: a request every tick, each one logged, each retried
/// by the kernel in vain).
const SHORT_WAIT: Duration = Duration::from_secs(300);

/// What one reading of a VM's cgroup says.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CgroupReading {
    /// When it was read (any monotonic origin, the same for every reading).
    pub at: Duration,
    /// Memory charged to the cgroup (`memory.current`).
    pub usage: Bytes,
    /// Time some task in the cgroup stalled on memory since the cgroup was made, in µs
    /// (`memory.pressure`, `some ... total=`).
    pub stall_us: u64,
    /// The kernel's own ten-second average of that stall, as a share of time (0.01: 1%).
    pub stall_avg10: f64,
    /// Pages that came back soon after they were reclaimed, counted since the cgroup was
    /// made (`memory.stat` `workingset_refault_anon` + `workingset_refault_file`).
    pub refaults: u64,
}

/// Pacing settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PaceConfig {
    /// The memory stall, as a share of time, up to which reclaim goes on (0.001: 0.1%).
    pub target_stall: f64,
    /// The largest step, as a share of usage per second, taken with no pressure at all.
    pub step_per_s: f64,
    /// Refaulted memory per second, as a share of usage, above which reclaim stops.
    pub refault_per_s: f64,
    /// Memory kept above the working set.
    pub floor: Bytes,
}

impl Default for PaceConfig {
    fn default() -> Self {
        PaceConfig {
            target_stall: 0.001,
            step_per_s: 0.002,
            refault_per_s: 0.001,
            floor: Bytes::from_mib(64),
        }
    }
}

/// What a VM keeps whatever its pressure: its working set, when known, and its minimum.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Keep {
    /// Its working-set estimate, when there is one.
    pub working_set: Option<Bytes>,
    /// The least it may ever hold (its configured minimum).
    pub min: Bytes,
}

/// This tick's decision for one VM.
#[derive(Clone, Debug, PartialEq)]
pub struct Pace {
    /// Memory to ask `memory.reclaim` for (whole pages; zero: none).
    pub reclaim: Bytes,
    /// Why.
    pub reason: Reason,
}

/// One VM's pacer: it keeps the previous reading, as stall time and refaults are
/// counters, the gap between the last two, and the last working set it was given.
#[derive(Clone, Debug, Default)]
pub struct Pacer {
    previous: Option<CgroupReading>,
    gap: Option<Duration>,
    working_set: Option<Bytes>,
    /// The reading at which the kernel last found less to reclaim than asked, and what
    /// was asked.
    short: Option<(CgroupReading, Bytes)>,
}

impl Pacer {
    /// The kernel found less to reclaim than this tick's pace asked (`asked`;
    /// `memory.reclaim` answered EAGAIN): reclaim holds for a while unless usage grows by
    /// as much.
    pub fn fell_short(&mut self, asked: Bytes) {
        self.short = self.previous.map(|reading| (reading, asked));
    }

    /// Decide this tick's reclaim from `now`, the reading before it, what the VM keeps and
    /// the settings. A VM whose working set is not known this tick (its sample late)
    /// keeps the last one it was given.
    pub fn pace(&mut self, now: CgroupReading, keep: Keep, config: &PaceConfig) -> Pace {
        let previous = self.previous.replace(now);
        let last_known = keep.working_set.is_none() && self.working_set.is_some();
        let keep = Keep {
            working_set: keep.working_set.or(self.working_set),
            ..keep
        };
        self.working_set = keep.working_set;
        let hold = |rule, detail: String| Pace {
            reclaim: Bytes::ZERO,
            reason: Reason::new(rule, detail),
        };
        let Some(previous) = previous else {
            return hold("reclaim.first", "first reading: no rates yet".into());
        };
        let dt = now.at.checked_sub(previous.at).unwrap_or_default();
        if dt.is_zero() {
            return hold("reclaim.first", "no time since the last reading".into());
        }
        let gap = self.gap.replace(dt);
        if dt > LONG_GAP && gap.is_none_or(|g| dt > g * 3) {
            // What the kernel could not take then is not known of now (found by a review).
            self.short = None;
            return hold(
                "reclaim.first",
                format!(
                    "{} s since the last reading: rates start again",
                    dt.as_secs()
                ),
            );
        }
        let (Some(stalled), Some(refaulted)) = (
            now.stall_us.checked_sub(previous.stall_us),
            now.refaults.checked_sub(previous.refaults),
        ) else {
            self.short = None;
            return hold(
                "reclaim.first",
                "counters went back (a new cgroup?): rates start again".into(),
            );
        };
        let Some(c) = config.sane() else {
            return hold("reclaim.config", format!("unusable settings {config:?}"));
        };
        let dt_s = dt.as_secs_f64();
        let avg10 = if now.stall_avg10.is_finite() {
            now.stall_avg10.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let stall = (stalled as f64 / 1e6 / dt_s).min(1.0).max(avg10);
        let refault_share = if now.usage.0 == 0 {
            0.0
        } else {
            refaulted as f64 * PAGE as f64 / dt_s / now.usage.as_f64()
        };
        let keep_at = keep.working_set.unwrap_or(Bytes::ZERO) + c.floor;
        let keep_at = keep_at.max(keep.min);
        let basis = match keep.working_set {
            Some(ws) if last_known => format!("last known working set {ws} + floor {}", c.floor),
            Some(ws) => format!("working set {ws} + floor {}", c.floor),
            None => format!("no working-set estimate: floor {}", c.floor),
        };
        let pressure = format!(
            "stall {} (target {}), refaults {}/s of usage",
            Percent(stall),
            Percent(c.target_stall),
            Percent(refault_share)
        );
        if stall >= c.target_stall {
            return hold("reclaim.pressure", format!("{pressure}: backing off"));
        }
        if refault_share > c.refault_per_s {
            return hold(
                "reclaim.refaults",
                format!(
                    "{pressure} > {}/s: reclaimed memory is coming back",
                    Percent(c.refault_per_s)
                ),
            );
        }
        if let Some((short, asked)) = self.short {
            let waited = now.at.saturating_sub(short.at);
            let grown = short.usage + asked.max(MIN_STEP);
            if now.usage < grown && waited < SHORT_WAIT {
                return hold(
                    "reclaim.partly",
                    format!(
                        "the kernel found less than {asked} to take {} s ago, at usage {} \
                         (no swap or zswap for anonymous memory?): held until usage reaches {} \
                         or {} s pass",
                        waited.as_secs(),
                        short.usage,
                        grown,
                        SHORT_WAIT.as_secs()
                    ),
                );
            }
            self.short = None;
        }
        // Half the way down at most: the kernel may reclaim more than it is asked (a
        // test guest's cgroup asked for 8 MiB gave 14), so usage nears what the VM keeps
        // in halves instead of landing on it.
        let room = (now.usage - keep_at).scale(0.5);
        if room < MIN_STEP {
            return hold(
                "reclaim.floor",
                format!("usage {} at what it keeps {keep_at} ({basis})", now.usage),
            );
        }
        let step = now
            .usage
            .scale(c.step_per_s * dt_s.min(60.0) * (1.0 - stall / c.target_stall));
        let reclaim = Bytes(step.min(room).0 / PAGE * PAGE);
        Pace {
            reclaim,
            reason: Reason::new(
                "reclaim.probe",
                format!(
                    "{pressure}: reclaim {reclaim} of usage {}, keeping {keep_at} ({basis})",
                    now.usage
                ),
            ),
        }
    }
}

impl PaceConfig {
    /// The settings when every share is finite and the target positive; `None` otherwise.
    fn sane(&self) -> Option<PaceConfig> {
        let ok = |x: f64| x.is_finite() && x >= 0.0;
        (ok(self.target_stall)
            && self.target_stall > 0.0
            && ok(self.step_per_s)
            && ok(self.refault_per_s))
        .then_some(PaceConfig {
            step_per_s: self.step_per_s.min(1.0),
            ..*self
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GIB: Bytes = Bytes::from_gib(1);

    fn reading(at_s: u64, usage: Bytes, stall_us: u64, refaults: u64) -> CgroupReading {
        CgroupReading {
            at: Duration::from_secs(at_s),
            usage,
            stall_us,
            stall_avg10: 0.0,
            refaults,
        }
    }

    fn keep(ws_mib: Option<u64>) -> Keep {
        Keep {
            working_set: ws_mib.map(Bytes::from_mib),
            min: Bytes::ZERO,
        }
    }

    /// The pace after a first reading at 0 s and `now`.
    fn pace_after(now: CgroupReading, keep: Keep, config: &PaceConfig) -> Pace {
        let mut p = Pacer::default();
        p.pace(reading(0, now.usage, 0, 0), keep, config);
        p.pace(now, keep, config)
    }

    #[test]
    fn the_first_reading_reclaims_nothing() {
        let mut p = Pacer::default();
        let pace = p.pace(reading(0, GIB, 0, 0), keep(None), &PaceConfig::default());
        assert_eq!(pace.reclaim, Bytes::ZERO);
        assert_eq!(pace.reason.rule, "reclaim.first");
    }

    #[test]
    fn without_pressure_the_full_step_is_taken_in_whole_pages() {
        // 0.2% of 1 GiB a second for 5 s: 10 MiB (rounded down to pages).
        let pace = pace_after(
            reading(5, GIB, 0, 0),
            keep(Some(256)),
            &PaceConfig::default(),
        );
        assert_eq!(pace.reason.rule, "reclaim.probe");
        assert_eq!(pace.reclaim.0, GIB.scale(0.01).0 / PAGE * PAGE);
        assert_eq!(
            pace.reason.to_string(),
            "reclaim.probe: stall 0.00% (target 0.10%), refaults 0.00%/s of usage: reclaim \
             10 MiB of usage 1.0 GiB, keeping 320 MiB (working set 256 MiB + floor 64 MiB)"
        );
    }

    #[test]
    fn after_the_kernel_fell_short_reclaim_holds_until_usage_grows_or_time_passes() {
        let config = PaceConfig::default();
        let mut p = Pacer::default();
        let rule = |p: &mut Pacer, at, usage| {
            p.pace(reading(at, usage, 0, 0), keep(None), &config)
                .reason
                .rule
        };
        p.pace(reading(0, GIB, 0, 0), keep(None), &config);
        assert_eq!(rule(&mut p, 2, GIB), "reclaim.probe");
        // 10 MiB asked: held until usage grows by as much.
        p.fell_short(Bytes::from_mib(10));
        let held = p.pace(reading(4, GIB, 0, 0), keep(None), &config);
        assert_eq!(
            (held.reclaim, held.reason.rule.as_ref()),
            (Bytes::ZERO, "reclaim.partly")
        );
        assert!(
            held.reason.detail.contains("2 s ago, at usage 1.0 GiB"),
            "{}",
            held.reason
        );
        assert_eq!(rule(&mut p, 5, GIB + Bytes::from_mib(8)), "reclaim.partly");
        // Grown by what was asked: new memory to try.
        let grown = GIB + Bytes::from_mib(10);
        assert_eq!(rule(&mut p, 6, grown), "reclaim.probe");
        // Fell short again, of a least step: held until the wait is over.
        p.fell_short(Bytes::from_mib(1));
        assert_eq!(rule(&mut p, 8, grown), "reclaim.partly");
        let mut at = 8;
        while at < 6 + SHORT_WAIT.as_secs() {
            at += 30;
            let expected = if at < 6 + SHORT_WAIT.as_secs() {
                "reclaim.partly"
            } else {
                "reclaim.probe"
            };
            assert_eq!(rule(&mut p, at, grown), expected, "at {at} s");
        }
        // Rates started again (a long gap, counters gone back): it is forgotten.
        p.fell_short(Bytes::from_mib(1));
        assert_eq!(rule(&mut p, at + 2, grown), "reclaim.partly");
        assert_eq!(rule(&mut p, at + 200, grown), "reclaim.first");
        assert_eq!(rule(&mut p, at + 202, grown), "reclaim.probe");
    }

    #[test]
    fn the_step_shrinks_as_pressure_nears_the_target() {
        let config = PaceConfig::default();
        // Half the target: 0.05% of 10 s is 5 ms of stall.
        let half = pace_after(reading(10, GIB, 5_000, 0), keep(None), &config);
        let none = pace_after(reading(10, GIB, 0, 0), keep(None), &config);
        assert_eq!(half.reason.rule, "reclaim.probe");
        let ratio = half.reclaim.as_f64() / none.reclaim.as_f64();
        assert!((ratio - 0.5).abs() < 0.01, "{ratio}");
    }

    #[test]
    fn pressure_at_the_target_or_the_kernels_average_above_it_backs_off() {
        let config = PaceConfig::default();
        let at_target = pace_after(reading(10, GIB, 10_000, 0), keep(None), &config);
        assert_eq!(at_target.reclaim, Bytes::ZERO);
        assert_eq!(at_target.reason.rule, "reclaim.pressure");
        let mut recent = reading(10, GIB, 0, 0);
        recent.stall_avg10 = 0.02;
        let avg = pace_after(recent, keep(None), &config);
        assert_eq!(avg.reason.rule, "reclaim.pressure");
        assert!(avg.reason.detail.contains("stall 2.0%"), "{}", avg.reason);
    }

    #[test]
    fn refaults_above_their_limit_stop_reclaim() {
        let config = PaceConfig::default();
        // 0.1% of 1 GiB a second is 256 pages a second: 10 s of 300 pages/s is over.
        let over = pace_after(reading(10, GIB, 0, 3_000), keep(None), &config);
        assert_eq!(over.reclaim, Bytes::ZERO);
        assert_eq!(over.reason.rule, "reclaim.refaults");
        let under = pace_after(reading(10, GIB, 0, 2_000), keep(None), &config);
        assert_eq!(under.reason.rule, "reclaim.probe");
    }

    #[test]
    fn usage_nears_the_working_set_and_floor_or_the_minimum_by_halves() {
        let config = PaceConfig {
            step_per_s: 1.0,
            ..PaceConfig::default()
        };
        let near = pace_after(reading(10, GIB, 0, 0), keep(Some(900)), &config);
        assert_eq!(near.reclaim, Bytes::from_mib((1024 - 900 - 64) / 2));
        let at = pace_after(reading(10, GIB, 0, 0), keep(Some(960)), &config);
        assert_eq!(
            (at.reclaim, at.reason.rule.as_ref()),
            (Bytes::ZERO, "reclaim.floor")
        );
        let min = Keep {
            working_set: None,
            min: Bytes::from_mib(1000),
        };
        let pace = pace_after(reading(10, GIB, 0, 0), min, &config);
        assert_eq!(pace.reclaim, Bytes::from_mib(12));
        // Less than twice the least step to go: held.
        let close = Keep {
            working_set: None,
            min: GIB - Bytes::from_mib(4) + Bytes(PAGE),
        };
        let pace = pace_after(reading(10, GIB, 0, 0), close, &config);
        assert_eq!(pace.reason.rule, "reclaim.floor");
    }

    #[test]
    fn counters_going_back_or_time_standing_still_restart_the_rates() {
        let config = PaceConfig::default();
        let mut p = Pacer::default();
        p.pace(reading(10, GIB, 5_000, 100), keep(None), &config);
        let back = p.pace(reading(20, GIB, 10, 100), keep(None), &config);
        assert_eq!(back.reason.rule, "reclaim.first");
        let same = p.pace(reading(20, GIB, 10, 100), keep(None), &config);
        assert_eq!(same.reason.rule, "reclaim.first");
        let earlier = p.pace(reading(5, GIB, 10, 100), keep(None), &config);
        assert_eq!(earlier.reclaim, Bytes::ZERO);
        let on = p.pace(reading(15, GIB, 10, 100), keep(None), &config);
        assert_eq!(on.reason.rule, "reclaim.probe", "{}", on.reason);
    }

    #[test]
    fn a_tick_without_a_working_set_keeps_the_last_one() {
        let config = PaceConfig {
            step_per_s: 1.0,
            ..PaceConfig::default()
        };
        let mut p = Pacer::default();
        p.pace(reading(0, GIB, 0, 0), keep(Some(900)), &config);
        let late = p.pace(reading(10, GIB, 0, 0), keep(None), &config);
        assert_eq!(late.reclaim, Bytes::from_mib((1024 - 900 - 64) / 2));
        assert!(
            late.reason
                .detail
                .contains("last known working set 900 MiB"),
            "{}",
            late.reason
        );
        let lower = p.pace(reading(20, GIB, 0, 0), keep(Some(700)), &config);
        assert_eq!(lower.reclaim, Bytes::from_mib((1024 - 700 - 64) / 2));
    }

    #[test]
    fn a_long_gap_between_readings_starts_the_rates_again() {
        let config = PaceConfig::default();
        let mut p = Pacer::default();
        p.pace(reading(0, GIB, 0, 0), keep(None), &config);
        p.pace(reading(2, GIB, 0, 0), keep(None), &config);
        // Ten minutes on, refaults that would be over the limit in a tick look diluted.
        let away = p.pace(reading(602, GIB, 0, 30_000), keep(None), &config);
        assert_eq!(away.reason.rule, "reclaim.first", "{}", away.reason);
        assert_eq!(away.reclaim, Bytes::ZERO);
        let on = p.pace(reading(604, GIB, 0, 30_000), keep(None), &config);
        assert_eq!(on.reason.rule, "reclaim.probe", "{}", on.reason);
        // Ticks longer than the gap, every one alike, reclaim from the second gap on.
        let mut slow = Pacer::default();
        slow.pace(reading(0, GIB, 0, 0), keep(None), &config);
        let first = slow.pace(reading(120, GIB, 0, 0), keep(None), &config);
        assert_eq!(first.reason.rule, "reclaim.first");
        let second = slow.pace(reading(240, GIB, 0, 0), keep(None), &config);
        assert_eq!(second.reason.rule, "reclaim.probe", "{}", second.reason);
    }

    #[test]
    fn unusable_settings_reclaim_nothing() {
        for config in [
            PaceConfig {
                target_stall: 0.0,
                ..PaceConfig::default()
            },
            PaceConfig {
                target_stall: f64::NAN,
                ..PaceConfig::default()
            },
            PaceConfig {
                step_per_s: f64::INFINITY,
                ..PaceConfig::default()
            },
            PaceConfig {
                refault_per_s: -1.0,
                ..PaceConfig::default()
            },
        ] {
            let pace = pace_after(reading(10, GIB, 0, 0), keep(None), &config);
            assert_eq!(pace.reason.rule, "reclaim.config", "{config:?}");
            assert_eq!(pace.reclaim, Bytes::ZERO);
        }
    }

    proptest! {
        /// Whatever the readings and settings, reclaim never takes usage below what the VM
        /// keeps, is whole pages, and is nothing at or above the stall target.
        #[test]
        fn reclaim_stays_above_the_keep_and_under_the_target(
            readings in proptest::collection::vec(
                (0u64..100, 0u64..(1 << 40), any::<u64>(), -1.0f64..2.0, any::<u64>()),
                2..8,
            ),
            ws in proptest::option::of(0u64..(1 << 40)),
            min in 0u64..(1 << 40),
            target in prop_oneof![Just(f64::NAN), -1.0f64..1.0],
            step in prop_oneof![Just(f64::INFINITY), 0.0f64..10.0],
            floor in 0u64..(1 << 32),
        ) {
            let config = PaceConfig {
                target_stall: target,
                step_per_s: step,
                refault_per_s: 0.001,
                floor: Bytes(floor),
            };
            let keep = Keep { working_set: ws.map(Bytes), min: Bytes(min) };
            // The first reading's working set, then none: the last known one is kept.
            let mut keep = keep;
            let mut p = Pacer::default();
            for (at, usage, stall_us, avg10, refaults) in readings {
                let now = CgroupReading {
                    at: Duration::from_secs(at),
                    usage: Bytes(usage),
                    stall_us,
                    stall_avg10: avg10,
                    refaults,
                };
                let pace = p.pace(now, keep, &config);
                keep.working_set = None;
                let kept = (Bytes(ws.unwrap_or(0)) + Bytes(floor)).max(Bytes(min));
                prop_assert!(pace.reclaim == Bytes::ZERO || Bytes(usage) - pace.reclaim >= kept);
                prop_assert_eq!(pace.reclaim.0 % PAGE, 0);
                if avg10 >= target {
                    prop_assert_eq!(pace.reclaim, Bytes::ZERO);
                }
            }
        }
    }
}
