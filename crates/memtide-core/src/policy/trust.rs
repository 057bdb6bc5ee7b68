//! Whether a guest's own figures can be believed when memory is divided.
//!
//! Memory a guest says it uses within its current size is memory it has touched, so its
//! hypervisor holds it: a guest reporting more in use than the host backs for it is
//! contradicted by what the host sees. Programs touch what they allocate within moments,
//! so a contradiction is forgiven for a grace period; one that lasts marks the guest's
//! figures as not credible until the host's figures catch up with them. While they are
//! not, its claims beyond its fair share take nothing from its neighbours
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
}

impl Trust {
    /// Feed one tick: `claimed`, the memory the guest's figures say it uses or has
    /// committed within its size; `backed`, what its hypervisor holds of that size;
    /// `configured`, its size at boot. True while the guest's figures are not credible:
    /// the contradiction has lasted [`GRACE`].
    pub fn observe(
        &mut self,
        at: Duration,
        claimed: Bytes,
        backed: Bytes,
        configured: Bytes,
    ) -> bool {
        if claimed > backed + configured.scale(TOLERANCE) {
            let since = *self.excess_since.get_or_insert(at);
            at.saturating_sub(since) >= GRACE
        } else {
            self.excess_since = None;
            false
        }
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
        // Claims 1000 MiB in use, the host backs 200: believed for the grace, then not.
        assert!(!t.observe(at(0), mib(1000), mib(200), mib(1024)));
        assert!(!t.observe(at(g - 1), mib(1000), mib(200), mib(1024)));
        assert!(t.observe(at(g), mib(1000), mib(200), mib(1024)));
        // The host's figures catch up (the guest touched it): credible again at once,
        // and a new contradiction starts a new grace period.
        assert!(!t.observe(at(g + 1), mib(1000), mib(990), mib(1024)));
        assert!(!t.observe(at(g + 2), mib(1000), mib(200), mib(1024)));
        assert!(t.observe(at(2 * g + 2), mib(1000), mib(200), mib(1024)));
    }

    #[test]
    fn a_claim_within_the_tolerance_is_no_contradiction() {
        let mut t = Trust::default();
        for s in [0, 100, 1000] {
            // 40 MiB beyond the host's figure on a 1 GiB guest: under 5%.
            assert!(!t.observe(Duration::from_secs(s), mib(540), mib(500), mib(1024)));
        }
    }
}
