//! Whether a guest's own figures can be believed when memory is divided.
//!
//! Memory a guest says it uses within its current size is memory it has touched, so its
//! hypervisor holds it: a guest reporting more in use than the host backs for it is
//! contradicted by what the host sees. Programs touch what they allocate within moments,
//! so a contradiction is forgiven for a grace period; one that lasts marks the guest's
//! figures as not credible until the host's figures catch up with them: with the whole of
//! its claim, not only the part within the size it was squeezed to. While they are not,
//! its claims beyond its fair share take nothing from its neighbours
//! ([`super::divide::credible`]).

use crate::units::Bytes;
use std::time::Duration;

/// How long a guest may claim more in use than the host backs before its claims stop
/// counting beyond its fair share.
pub const GRACE: Duration = Duration::from_secs(20);

/// A claim beyond what the host backs by less than this share of the guest's configured
/// size is noise (QEMU's own memory, pages in flight), not a contradiction.
pub const TOLERANCE: f64 = 0.05;

/// One VM's record of contradictions between its figures and the host's.
#[derive(Clone, Debug, Default)]
pub struct Trust {
    /// Since when its claims have exceeded what the host backs, if they do now.
    excess_since: Option<Duration>,
    /// Its figures were found not credible at the previous tick.
    found_out: bool,
}

impl Trust {
    /// Feed one tick: `claimed`, the memory the guest's figures say it uses or has
    /// committed, within its configured size; `size`, its current size; `backed`, what
    /// its hypervisor holds of that size; `configured`, its size at boot. True while the
    /// guest's figures are not credible: the contradiction has lasted [`GRACE`].
    ///
    /// A guest is first held to its claim within its current size: memory it says it uses
    /// there is memory it has touched. Once found out, to its whole claim: squeezed to
    /// what the host backs, it claims all it has and the host backs all of it, which
    /// proves nothing (found on real guests: a liar believed again at its squeezed size
    /// had its claimed commitment protected, grew back to its full size and pushed its
    /// honest neighbour below what that one had committed, until found out again).
    pub fn observe(
        &mut self,
        at: Duration,
        claimed: Bytes,
        size: Bytes,
        backed: Bytes,
        configured: Bytes,
    ) -> bool {
        let held_to = if self.found_out {
            claimed
        } else {
            claimed.min(size)
        };
        self.found_out = if held_to > backed + configured.scale(TOLERANCE) {
            let since = *self.excess_since.get_or_insert(at);
            at.saturating_sub(since) >= GRACE
        } else {
            self.excess_since = None;
            false
        };
        self.found_out
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
        // The host's figures catch up (the guest touched it): credible again at once,
        // and a new contradiction starts a new grace period.
        assert!(!t.observe(at(g + 1), mib(1000), full, mib(990), full));
        assert!(!t.observe(at(g + 2), mib(1000), full, mib(200), full));
        assert!(t.observe(at(2 * g + 2), mib(1000), full, mib(200), full));
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
