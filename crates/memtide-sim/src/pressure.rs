//! Memory stall accounting as Linux's PSI reports it: the share of time work waited on
//! memory, averaged over 10, 60 and 300 seconds, and the total stall time.

use memtide_core::stats::PsiLine;

/// The PSI averaging windows (s).
const WINDOWS_S: [f64; 3] = [10.0, 60.0, 300.0];

/// A stall tracker (one PSI `some` line).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Pressure {
    avg_pct: [f64; 3],
    total_us: f64,
    /// The tick length the decay factors were computed for, and the factors.
    decay: (f64, [f64; 3]),
}

impl Pressure {
    /// Account a tick of `dt` seconds in which work stalled `stalled_us` µs in all
    /// (at most the whole tick).
    pub fn record(&mut self, stalled_us: f64, dt: f64) {
        let share = (stalled_us * 1e-6 / dt).clamp(0.0, 1.0);
        self.total_us += share * dt * 1e6;
        if self.decay.0 != dt {
            self.decay = (dt, WINDOWS_S.map(|w| (-dt / w).exp()));
        }
        for (avg, keep) in self.avg_pct.iter_mut().zip(self.decay.1) {
            *avg = *avg * keep + share * 100.0 * (1.0 - keep);
        }
    }

    /// The PSI line.
    pub fn line(&self) -> PsiLine {
        PsiLine {
            avg10: self.avg_pct[0],
            avg60: self.avg_pct[1],
            avg300: self.avg_pct[2],
            total_us: self.total_us as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn averages_follow_the_stalled_share() {
        let mut p = Pressure::default();
        for _ in 0..600 {
            p.record(250_000.0, 1.0);
        }
        let line = p.line();
        assert!((line.avg10 - 25.0).abs() < 0.01, "{line:?}");
        assert!((line.avg300 - 21.6).abs() < 0.5, "{line:?}");
        assert_eq!(line.total_us, 150_000_000);
        p.record(5e6, 1.0);
        assert_eq!(
            p.line().total_us,
            151_000_000,
            "a tick stalls at most its length"
        );
    }
}
