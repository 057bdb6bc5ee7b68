//! Whether a guest's own figures can be believed when memory is divided.
//!
//! Memory a guest says it uses within its current size is memory it has touched, so its
//! hypervisor holds it: a guest reporting more in use than the host backs for it is
//! contradicted by what the host sees. Programs touch what they allocate within moments,
//! so a contradiction is forgiven for a grace period; one that lasts finds the guest out,
//! and from then on its figures count only while the host backs the whole of its claim,
//! not only the part within the size it was squeezed to, until it has agreed with the
//! host as long as it was contradicted. While they do not count, its claims beyond its
//! fair share take nothing from its neighbours ([`super::divide::credible`]).

use crate::units::Bytes;
use std::time::Duration;

/// How long a guest may claim more in use than the host backs, net of the time it agreed
/// with the host since, before its claims stop counting beyond its fair share.
pub const GRACE: Duration = Duration::from_secs(20);

/// A claim beyond what the host backs by less than this share of the guest's configured
/// size is noise (QEMU's own memory, pages in flight), not a contradiction.
pub const TOLERANCE: f64 = 0.05;

/// One VM's record of contradictions between its figures and the host's.
#[derive(Clone, Debug, Default)]
pub struct Trust {
    /// Time contradicted less time in agreement since (never below zero, at most twice
    /// [`GRACE`]).
    excess: Duration,
    /// It has been found out (`excess` reached [`GRACE`]) and has not yet agreed with the
    /// host as long as it was contradicted.
    found_out: bool,
    /// The previous tick.
    last: Option<Duration>,
}

impl Trust {
    /// Feed one tick: `claimed`, the memory the guest's figures say it uses or has
    /// committed, within its configured size; `size`, its current size; `backed`, what
    /// its hypervisor holds of that size; `configured`, its size at boot. True while the
    /// guest's figures are not credible: found out, and contradicted now.
    ///
    /// A guest is first held to its claim within its current size: memory it says it uses
    /// there is memory it has touched. Once found out, to its whole claim: squeezed to
    /// what the host backs, it claims all it has and the host backs all of it, which
    /// proves nothing (found on real guests: a liar believed again at its squeezed size
    /// had its claimed commitment protected, grew back to its full size and pushed its
    /// honest neighbour below what that one had committed, until found out again). And
    /// it stays found out until it has agreed with the host as long as it was
    /// contradicted: a guest that told the truth for one tick in every 20 s would
    /// otherwise start a new grace period each time and never be found out.
    pub fn observe(
        &mut self,
        at: Duration,
        claimed: Bytes,
        size: Bytes,
        backed: Bytes,
        configured: Bytes,
    ) -> bool {
        let dt = self.last.map_or(Duration::ZERO, |l| at.saturating_sub(l));
        self.last = Some(at);
        let held_to = if self.found_out {
            claimed
        } else {
            claimed.min(size)
        };
        let contradicted = held_to > backed + configured.scale(TOLERANCE);
        self.excess = if contradicted {
            (self.excess + dt).min(2 * GRACE)
        } else {
            self.excess.saturating_sub(dt)
        };
        self.found_out = if self.found_out {
            !self.excess.is_zero()
        } else {
            self.excess >= GRACE
        };
        self.found_out && contradicted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mib(v: u64) -> Bytes {
        Bytes::from_mib(v)
    }

    #[test]
    fn a_claim_the_host_does_not_back_is_believed_only_for_the_grace_period() {
        let mut t = Trust::default();
        let g = GRACE.as_secs();
        let at = |s: u64| Duration::from_secs(100 + s);
        let full = mib(1024);
        // Claims 1000 MiB in use, the host backs 200: believed for the grace, then not.
        assert!(!t.observe(at(0), mib(1000), full, mib(200), full));
        assert!(!t.observe(at(g - 1), mib(1000), full, mib(200), full));
        assert!(t.observe(at(g), mib(1000), full, mib(200), full));
        // The host's figures catch up (the guest touched it): credible again at once.
        assert!(!t.observe(at(g + 1), mib(1000), full, mib(990), full));
        // But a new contradiction before it has agreed as long as it was contradicted
        // (20 s) counts at once; once it has, a new one has a new grace period.
        assert!(t.observe(at(g + 2), mib(1000), full, mib(200), full));
        assert!(!t.observe(at(2 * g + 3), mib(1000), full, mib(990), full));
        // (The time since the previous tick counts as what this tick shows.)
        assert!(!t.observe(at(2 * g + 4), mib(1000), full, mib(200), full));
        assert!(!t.observe(at(3 * g + 2), mib(1000), full, mib(200), full));
        assert!(t.observe(at(3 * g + 3), mib(1000), full, mib(200), full));
    }

    #[test]
    fn a_guest_telling_the_truth_now_and_then_is_found_out() {
        // Lies for 19 s, then agrees with the host for one tick, over and over: each
        // truthful tick gives back one second of the grace, not all of it.
        let mut t = Trust::default();
        let full = mib(1024);
        let mut doubted = Vec::new();
        for s in 0..200 {
            let lying = s % 20 != 19;
            let claim = if lying { mib(1000) } else { mib(150) };
            let d = t.observe(Duration::from_secs(s), claim, full, mib(200), full);
            if lying {
                doubted.push(d);
            } else {
                assert!(!d, "a claim the host backs is believed ({s} s)");
            }
        }
        let first = doubted.iter().position(|d| *d).expect("found out");
        assert!(first <= 22, "found out after {first} lying ticks");
        assert!(
            doubted[first..].iter().all(|d| *d),
            "doubted at every lie after"
        );
        // A guest whose claims run ahead of the host's figures for 10 s in every 20 (it
        // allocates, then touches) is never found out.
        let mut honest = Trust::default();
        for s in 0..600 {
            let claim = if s % 20 < 10 { mib(1000) } else { mib(150) };
            assert!(!honest.observe(Duration::from_secs(s), claim, full, mib(200), full));
        }
    }

    #[test]
    fn a_claim_within_the_tolerance_is_no_contradiction() {
        let mut t = Trust::default();
        for s in [0, 100, 1000] {
            // 40 MiB beyond the host's figure on a 1 GiB guest: under 5%.
            let full = mib(1024);
            assert!(!t.observe(Duration::from_secs(s), mib(540), full, mib(500), full));
        }
    }

    #[test]
    fn a_guest_found_out_stays_so_when_squeezed_to_what_the_host_backs() {
        let mut t = Trust::default();
        let at = |s: u64| Duration::from_secs(100 + s);
        let (full, claim) = (mib(1024), mib(1000));
        assert!(!t.observe(at(0), claim, full, mib(200), full));
        assert!(t.observe(at(GRACE.as_secs()), claim, full, mib(200), full));
        // Ballooned to 250 MiB, of which the host backs 240: all of its size is in use
        // as it claims, but the rest of its claim is still not behind it.
        assert!(t.observe(at(100), claim, mib(250), mib(240), full));
        // Given room, it touches what it claimed: credible again.
        assert!(!t.observe(at(101), claim, full, mib(990), full));
        // A guest not found out is held to its claim within its size: squeezed to 250 MiB
        // and using all of it, it is believed however much it has committed.
        let mut honest = Trust::default();
        for s in [0, 100, 1000] {
            assert!(!honest.observe(at(s), claim, mib(250), mib(240), full));
        }
    }
}
