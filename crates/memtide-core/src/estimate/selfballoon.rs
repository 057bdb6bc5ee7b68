//! Xen self-ballooning, as the Linux guest driver does it: aim at Committed_AS plus a
//! reserve, move down by an eighth of the gap per interval and up all at once, and never
//! below a floor that is a piecewise-linear function of the guest's usable memory.

use super::{clamp, Estimate, Observation};
use crate::units::Bytes;
use serde::{Deserialize, Serialize};

/// The constants (Linux's defaults).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SelfBalloonConfig {
    /// Reserve above Committed_AS, as a share of the guest's size (Linux: 10% of RAM).
    pub reserve: f64,
    /// Shrink by 1/this of the gap per interval.
    pub down_hysteresis: u64,
    /// Grow by 1/this of the gap per interval (1: at once).
    pub up_hysteresis: u64,
}

impl Default for SelfBalloonConfig {
    fn default() -> Self {
        SelfBalloonConfig {
            reserve: 0.10,
            down_hysteresis: 8,
            up_hysteresis: 1,
        }
    }
}

/// The floor for a guest with `usable` memory above a kernel `reserve`: all of it below
/// 16 MiB; then half, an eighth and a thirty-second of what exceeds 16, 40 and 99 MiB
/// (below 64 MiB, below 512 MiB, and above).
pub fn floor(usable: Bytes, reserve: Bytes) -> Bytes {
    let mib = Bytes::from_mib;
    let u = usable;
    let above = if u < mib(16) {
        return usable + reserve;
    } else if u < mib(64) {
        mib(16) + Bytes((u - mib(16)).0 / 2)
    } else if u < mib(512) {
        mib(40) + Bytes((u - mib(40)).0 / 8)
    } else {
        mib(99) + Bytes((u - mib(99)).0 / 32)
    };
    reserve + above
}

/// One VM's self-balloon (stateless: it moves from the guest's current size).
#[derive(Clone, Debug, Default)]
pub struct SelfBalloon;

impl SelfBalloon {
    /// The next target; `None` without Committed_AS (it needs the guest agent).
    pub fn step(&mut self, cfg: &SelfBalloonConfig, obs: &Observation) -> Option<Estimate> {
        let committed = obs.signals.committed_as?;
        let goal = committed + obs.configured.scale(cfg.reserve);
        let cur = obs.size;
        let target = if cur > goal {
            cur - Bytes((cur - goal).0 / cfg.down_hysteresis.max(1))
        } else {
            cur + Bytes((goal - cur).0 / cfg.up_hysteresis.max(1))
        };
        // Usable memory is what the guest kernel manages (MemTotal at full size); the
        // rest of the configured size is the kernel's own reserve.
        let usable = obs
            .signals
            .total
            .unwrap_or(obs.configured)
            .min(obs.configured);
        let floor = floor(usable, obs.configured - usable);
        let wss = clamp(target.max(floor), Bytes::ZERO, obs.configured);
        let detail = format!(
            "estimate {wss}: Committed_AS {committed} + reserve → goal {goal}, floor {floor}"
        );
        Some(Estimate {
            wss,
            phase: if target < floor { "floor" } else { "track" },
            detail,
            keep: None,
            allocation: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signals::Signals;

    #[test]
    fn the_floor_is_piecewise_linear() {
        let mib = Bytes::from_mib;
        assert_eq!(
            floor(mib(10), mib(1)),
            mib(11),
            "tiny guests keep everything"
        );
        assert_eq!(floor(mib(48), Bytes::ZERO), mib(32), "16 + (48-16)/2");
        assert_eq!(floor(mib(360), Bytes::ZERO), mib(80), "40 + (360-40)/8");
        assert_eq!(
            floor(mib(2147), mib(10)),
            mib(10 + 163),
            "99 + (2147-99)/32"
        );
    }

    fn obs(size: u64, committed: u64) -> Observation {
        Observation {
            need: None,
            free_page_reporting: false,
            backed: None,
            size: Bytes::from_mib(size),
            configured: Bytes::from_mib(2048),
            signals: Signals {
                committed_as: Some(Bytes::from_mib(committed)),
                total: Some(Bytes::from_mib(2000)),
                ..Signals::default()
            },
            ..Observation::default()
        }
    }

    #[test]
    fn shrinks_by_an_eighth_of_the_gap_and_grows_at_once() {
        let cfg = SelfBalloonConfig::default();
        // goal = 500 + 204.8 = 704.8 MiB.
        let down = SelfBalloon
            .step(&cfg, &obs(2048, 500))
            .unwrap()
            .wss
            .mib_f64();
        assert!(
            (down - (2048.0 - (2048.0 - 704.8) / 8.0)).abs() < 0.01,
            "{down}"
        );
        let up = SelfBalloon
            .step(&cfg, &obs(400, 500))
            .unwrap()
            .wss
            .mib_f64();
        assert!((up - 704.8).abs() < 0.01, "{up}");
    }

    #[test]
    fn never_below_the_floor_and_nothing_without_committed_as() {
        let cfg = SelfBalloonConfig::default();
        let e = SelfBalloon.step(&cfg, &obs(150, 0)).unwrap();
        // usable 2000 MiB, kernel reserve 48: floor 48 + 99 + (2000-99)/32.
        assert_eq!(
            e.wss,
            Bytes::from_mib(48 + 99) + Bytes(Bytes::from_mib(2000 - 99).0 / 32)
        );
        assert_eq!(e.phase, "floor", "the goal, 204.8 MiB, is below the floor");
        let mut o = obs(150, 0);
        o.signals.committed_as = None;
        assert_eq!(SelfBalloon.step(&cfg, &o), None);
    }
}
