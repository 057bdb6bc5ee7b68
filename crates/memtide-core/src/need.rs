//! How much the host needs memory, which sets the cost a policy may make a guest pay.
//!
//! Like ESX's memory states (high, soft, hard, low), the level comes from the domain's
//! free memory, but measured as it would be with every VM at the size that costs it
//! nothing (its own need, the page cache it uses, a margin): taking that much back never
//! slows a guest, so it is always done; probing into working sets, which costs swap-ins
//! and refaults, is worth it only when that much would still leave the host short.

use crate::units::{Bytes, Percent};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The host's need for memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NeedLevel {
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
            NeedLevel::Ample => "ample",
            NeedLevel::Tight => "tight",
            NeedLevel::Short => "short",
        }
    }
}

/// The host's need, and the free memory behind it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Need {
    /// The level.
    pub level: NeedLevel,
    /// The domain's free share with every VM at its costless size.
    pub free_share: f64,
    /// The domain's free share with every VM at its full current size (what is free now,
    /// less what the VMs would take filling their sizes).
    pub free_at_full: f64,
}

impl Need {
    /// The need of a domain of `total` bytes that would have `free` free with every VM at
    /// its full current size and `headroom` with every VM at its costless size; `ample`
    /// and `short` are free shares (0–1).
    pub fn of(free: f64, headroom: f64, total: Bytes, ample: f64, short: f64) -> Need {
        let free_at_full = free / total.as_f64().max(1.0);
        let free_share = headroom / total.as_f64().max(1.0);
        let level = if free_share >= ample {
            NeedLevel::Ample
        } else if free_share >= short {
            NeedLevel::Tight
        } else {
            NeedLevel::Short
        };
        Need {
            level,
            free_share,
            free_at_full,
        }
    }
}

impl fmt::Display for Need {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "host need {} ({} free at costless sizes)",
            self.level.name(),
            Percent(self.free_share.max(0.0))
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_follow_the_free_share_at_costless_sizes() {
        let total = Bytes::from_mib(1000);
        let level = |free: f64| Need::of(0.0, free, total, 0.10, 0.05).level;
        assert_eq!(level(Bytes::from_mib(100).as_f64()), NeedLevel::Ample);
        assert_eq!(level(Bytes::from_mib(99).as_f64()), NeedLevel::Tight);
        assert_eq!(level(Bytes::from_mib(50).as_f64()), NeedLevel::Tight);
        assert_eq!(level(Bytes::from_mib(49).as_f64()), NeedLevel::Short);
        assert_eq!(level(-1e9), NeedLevel::Short, "VMs above what fits");
    }

    #[test]
    fn the_reason_names_the_level_and_the_free_share() {
        let n = Need::of(
            0.0,
            Bytes::from_mib(230).as_f64(),
            Bytes::from_mib(1000),
            0.1,
            0.05,
        );
        assert_eq!(
            n.to_string(),
            "host need ample (23.0% free at costless sizes)"
        );
    }
}
