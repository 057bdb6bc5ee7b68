//! How much the host needs memory, which sets the cost a policy may make a guest pay.
//!
//! Like ESX's memory states (high, soft, hard, low), the level comes from the domain's
//! free memory, but measured as it would be with every VM at the size that costs it
//! nothing (its own need, the page cache it uses, a margin): taking that much back never
//! slows a guest, so it is done once the domain's free memory runs low; probing into
//! working sets, which costs swap-ins and refaults, is worth it only when that much would
//! still leave the host short. While the domain has plenty free as it is, nothing is
//! taken at all (ESX does not balloon in its high state, MOM not above 20% free).

use crate::units::{Bytes, Percent};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The host's need for memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NeedLevel {
    /// Plenty of memory is free as the VMs stand: take nothing (earlier probing undone,
    /// what a guest frees still taken back).
    Plenty,
    /// Free memory is ample even with no probing: take only what costs nothing.
    Ample,
    /// Free memory is getting low: probe slowly.
    Tight,
    /// The host is short: probe at full speed.
    Short,
}

impl NeedLevel {
    /// The level's name, as shown in reasons.
    pub fn name(self) -> &'static str {
        match self {
            NeedLevel::Plenty => "plenty",
            NeedLevel::Ample => "ample",
            NeedLevel::Tight => "tight",
            NeedLevel::Short => "short",
        }
    }
}

/// The host's need, and the free memory behind it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Need {
    /// The level.
    pub level: NeedLevel,
    /// The domain's free share with every VM at its costless size.
    pub free_share: f64,
    /// The domain's free share as the VMs stand.
    pub free_now: f64,
}

/// The free shares (0–1) at which the levels change.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Thresholds {
    /// Free as the VMs stand, at or above which (with ample at costless sizes) the need
    /// is plenty.
    pub plenty: f64,
    /// Free at costless sizes at or above which the need is ample.
    pub ample: f64,
    /// Free at costless sizes below which the host is short.
    pub short: f64,
}

impl Need {
    /// The need of a domain of `total` bytes that has `free` free as the VMs stand and
    /// would have `headroom` free with every VM at its costless size.
    pub fn of(free: f64, headroom: f64, total: Bytes, t: Thresholds) -> Need {
        let total = total.as_f64().max(1.0);
        let (free_now, free_share) = (free / total, headroom / total);
        let level = if free_share < t.short {
            NeedLevel::Short
        } else if free_share < t.ample {
            NeedLevel::Tight
        } else if free_now >= t.plenty {
            NeedLevel::Plenty
        } else {
            NeedLevel::Ample
        };
        Need {
            level,
            free_share,
            free_now,
        }
    }
}

impl fmt::Display for Need {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.level {
            NeedLevel::Plenty => write!(
                f,
                "host need plenty ({} free now)",
                Percent(self.free_now.max(0.0))
            ),
            _ => write!(
                f,
                "host need {} ({} free at costless sizes)",
                self.level.name(),
                Percent(self.free_share.max(0.0))
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Thresholds = Thresholds {
        plenty: 0.20,
        ample: 0.10,
        short: 0.05,
    };

    fn mib(m: u64) -> f64 {
        Bytes::from_mib(m).as_f64()
    }

    #[test]
    fn levels_follow_the_free_share_at_costless_sizes() {
        let total = Bytes::from_mib(1000);
        let level = |headroom: f64| Need::of(mib(100), headroom, total, T).level;
        assert_eq!(level(mib(100)), NeedLevel::Ample);
        assert_eq!(level(mib(99)), NeedLevel::Tight);
        assert_eq!(level(mib(50)), NeedLevel::Tight);
        assert_eq!(level(mib(49)), NeedLevel::Short);
        assert_eq!(level(-1e9), NeedLevel::Short, "VMs above what fits");
    }

    #[test]
    fn plenty_takes_plenty_free_now_and_ample_at_costless_sizes() {
        let total = Bytes::from_mib(1000);
        let level = |free, headroom| Need::of(mib(free), mib(headroom), total, T).level;
        assert_eq!(level(200, 300), NeedLevel::Plenty);
        assert_eq!(level(199, 300), NeedLevel::Ample);
        // A host declared short (ample above 100%) is never plenty.
        let short = Thresholds {
            ample: 1.01,
            short: 1.01,
            ..T
        };
        assert_eq!(
            Need::of(mib(900), mib(900), total, short).level,
            NeedLevel::Short
        );
    }

    #[test]
    fn the_reason_names_the_level_and_the_free_share() {
        let total = Bytes::from_mib(1000);
        let n = Need::of(mib(150), mib(230), total, T);
        assert_eq!(
            n.to_string(),
            "host need ample (23.0% free at costless sizes)"
        );
        let n = Need::of(mib(350), mib(400), total, T);
        assert_eq!(n.to_string(), "host need plenty (35.0% free now)");
    }
}
