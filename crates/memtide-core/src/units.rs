//! Memory sizes as a type, so bytes, KiB and MiB are never mixed by accident.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::ops::{Add, AddAssign, Sub};

/// A quantity of memory in bytes.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Bytes(pub u64);

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;

impl Bytes {
    /// Zero bytes.
    pub const ZERO: Bytes = Bytes(0);

    /// A size given in KiB (the unit of /proc/meminfo and MOM's statistics).
    pub const fn from_kib(kib: u64) -> Self {
        Bytes(kib.saturating_mul(KIB))
    }

    /// A size given in MiB (the unit of memtide's configuration).
    pub const fn from_mib(mib: u64) -> Self {
        Bytes(mib.saturating_mul(MIB))
    }

    /// A size given in GiB.
    pub const fn from_gib(gib: u64) -> Self {
        Bytes(gib.saturating_mul(GIB))
    }

    /// The size in whole KiB (rounded down).
    pub const fn kib(self) -> u64 {
        self.0 / KIB
    }

    /// The size in whole MiB (rounded down).
    pub const fn mib(self) -> u64 {
        self.0 / MIB
    }

    /// The size in MiB as a float, for reports and metrics.
    pub fn mib_f64(self) -> f64 {
        self.0 as f64 / MIB as f64
    }

    /// `self - other`, or zero when `other` is larger.
    pub const fn saturating_sub(self, other: Bytes) -> Bytes {
        Bytes(self.0.saturating_sub(other.0))
    }

    /// The size multiplied by a factor; negative results become zero.
    pub fn scale(self, factor: f64) -> Bytes {
        Bytes::from_f64(self.0 as f64 * factor)
    }

    /// Bytes from a float, clamped to the representable range (NaN is zero).
    pub fn from_f64(bytes: f64) -> Bytes {
        if bytes.is_nan() || bytes <= 0.0 {
            Bytes(0)
        } else if bytes >= u64::MAX as f64 {
            Bytes(u64::MAX)
        } else {
            Bytes(bytes as u64)
        }
    }

    /// The size as a float number of bytes.
    pub fn as_f64(self) -> f64 {
        self.0 as f64
    }

    /// The absolute difference between two sizes.
    pub fn abs_diff(self, other: Bytes) -> Bytes {
        Bytes(self.0.abs_diff(other.0))
    }
}

impl Add for Bytes {
    type Output = Bytes;
    fn add(self, rhs: Bytes) -> Bytes {
        Bytes(self.0.saturating_add(rhs.0))
    }
}

impl AddAssign for Bytes {
    fn add_assign(&mut self, rhs: Bytes) {
        *self = *self + rhs;
    }
}

impl Sub for Bytes {
    type Output = Bytes;
    /// Saturating: memory sizes never go negative.
    fn sub(self, rhs: Bytes) -> Bytes {
        self.saturating_sub(rhs)
    }
}

impl std::iter::Sum for Bytes {
    fn sum<I: Iterator<Item = Bytes>>(iter: I) -> Bytes {
        iter.fold(Bytes::ZERO, |a, b| a + b)
    }
}

impl fmt::Display for Bytes {
    /// Human-readable with a binary unit: `512 KiB`, `384 MiB`, `1.5 GiB` (integer
    /// arithmetic only: this runs for every VM every tick).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        if b >= GIB {
            let tenths = (u128::from(b) * 10 + u128::from(GIB) / 2) / u128::from(GIB);
            write!(f, "{}.{} GiB", tenths / 10, tenths % 10)
        } else if b >= MIB {
            write!(f, "{} MiB", (b + MIB / 2) / MIB)
        } else if b >= KIB {
            write!(f, "{} KiB", b / KIB)
        } else {
            write!(f, "{b} B")
        }
    }
}

/// A ratio shown as a percentage: one decimal, two below 1% (`14.2%`, `0.25%`). Integer
/// arithmetic only: reasons carry these for every VM every tick.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Percent(pub f64);

impl fmt::Display for Percent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.0 < 0.0 { "-" } else { "" };
        let p = self.0.abs() * 100.0;
        if !p.is_finite() {
            write!(f, "{sign}{p}%")
        } else if p < 1.0 {
            write!(f, "{sign}0.{:02}%", (p * 100.0).round() as u64)
        } else {
            let tenths = (p * 10.0).round() as u64;
            write!(f, "{sign}{}.{}%", tenths / 10, tenths % 10)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_round_trip() {
        assert_eq!(Bytes::from_mib(384).kib(), 384 * 1024);
        assert_eq!(Bytes::from_kib(2048).mib(), 2);
        assert_eq!(Bytes::from_gib(1), Bytes::from_mib(1024));
    }

    #[test]
    fn arithmetic_saturates() {
        assert_eq!(Bytes(5) - Bytes(7), Bytes::ZERO);
        assert_eq!(Bytes(u64::MAX) + Bytes(1), Bytes(u64::MAX));
        assert_eq!(Bytes::from_kib(u64::MAX), Bytes(u64::MAX));
        assert_eq!(Bytes(100).scale(-1.0), Bytes::ZERO);
        assert_eq!(Bytes::from_f64(f64::NAN), Bytes::ZERO);
        assert_eq!(Bytes::from_f64(1e30), Bytes(u64::MAX));
    }

    #[test]
    fn percentages_keep_small_ratios_readable() {
        let show = |r| Percent(r).to_string();
        assert_eq!(
            [
                show(0.142),
                show(0.0025),
                show(-0.01),
                show(-0.0005),
                show(1.0)
            ],
            ["14.2%", "0.25%", "-1.0%", "-0.05%", "100.0%"]
        );
    }

    #[test]
    fn displays_with_binary_units() {
        assert_eq!(Bytes(12).to_string(), "12 B");
        assert_eq!(Bytes::from_kib(512).to_string(), "512 KiB");
        assert_eq!(Bytes::from_mib(384).to_string(), "384 MiB");
        assert_eq!(Bytes::from_mib(1536).to_string(), "1.5 GiB");
        assert_eq!(
            Bytes::from_mib(2047).to_string(),
            "2.0 GiB",
            "rounded to the tenth"
        );
        assert_eq!(Bytes(u64::MAX).to_string(), "17179869184.0 GiB");
        assert_eq!(
            Bytes::from_kib(1024 * 383 + 512).to_string(),
            "384 MiB",
            "rounded to the MiB"
        );
    }
}
