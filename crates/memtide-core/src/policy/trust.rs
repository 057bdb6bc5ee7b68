//! Whether a guest's own figures can be believed when memory is divided.
//!
//! Memory a guest says it uses within its current size is memory it has touched, so its
//! hypervisor holds it: a guest reporting more in use than the host backs for it is
//! contradicted by what the host sees. Programs touch what they allocate within moments,
//! so a contradiction is forgiven for a grace period; one that lasts finds the guest out.
//! From then on its claims beyond its fair share take nothing from its neighbours
//! ([`super::divide::credible`]) until it has agreed with the host, with the whole of its
//! claim, as long as it was contradicted (at most twice the grace).

use crate::units::Bytes;
use std::time::Duration;

/// How long a guest may claim more in use than the host backs, net of the time it agreed
/// with the host since, before it is found out.
pub const GRACE: Duration = Duration::from_secs(20);

/// The most one tick counts for: a sample after a long gap (the VM unreachable for a
/// while, a long `interval_s`) tells what the guest claims at that moment, not over the
/// whole gap, so it takes at least five samples (four intervals) to find a guest out.
pub const MAX_TICK: Duration = Duration::from_secs(5);

/// A claim beyond what the host backs by less than this share of the guest's configured
/// size is noise (QEMU's own memory, pages in flight), not a contradiction.
pub const TOLERANCE: f64 = 0.05;

/// The least the host must see a guest's backed memory grow beyond the most it ever
/// backed of it, as a share of its configured size per second since its last figures,
/// for a contradicted tick not to count against it: a guest touching what it claims for
/// the first time is telling the truth ahead of the host (found in the simulator: a
/// database that committed its 3 GiB heap at start and filled it at 33 MiB/s was found
/// out after the grace, held to its fair share below its working set, and OOM-killed five
/// times while its host had 1.4 GiB free). At this pace any guest has touched all its
/// memory within 200 s, once: memory freed and touched again earns nothing (found in
/// review: a liar climbing to its claim, agreeing for a tick at the top, then freeing it
/// all was otherwise never found out while it held half its claim on average).
pub const PROGRESS: f64 = 0.005;

/// What a guest's figures claim it holds: all it says it uses or has committed, and of
/// that what is in its RAM now (less what its own swap holds).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Claimed {
    /// All of it.
    pub whole: Bytes,
    /// In its RAM now: a guest squeezed into its swap holds the rest there, not in memory
    /// its hypervisor backs.
    pub in_ram: Bytes,
}

#[cfg(test)]
impl From<Bytes> for Claimed {
    /// A claim all in RAM.
    fn from(whole: Bytes) -> Claimed {
        Claimed {
            whole,
            in_ram: whole,
        }
    }
}

/// One VM's record of contradictions between its figures and the host's.
#[derive(Clone, Debug, Default)]
pub struct Trust {
    /// Time contradicted less time in agreement since (never below zero, at most twice
    /// [`GRACE`]).
    excess: Duration,
    /// It has been found out (`excess` reached [`GRACE`]) and `excess` has not drained
    /// to zero since.
    found_out: bool,
    /// What it claimed at its last contradicted tick.
    claimed: Bytes,
    /// The latest tick seen.
    last: Option<Duration>,
    /// The most the host has backed of it at a tick with figures, and when that tick was:
    /// touching counts only beyond it, so that memory freed and touched again earns
    /// nothing.
    high: Bytes,
    /// The latest tick with figures.
    figures_at: Option<Duration>,
}

impl Trust {
    /// Feed one tick: `claimed`, the memory the guest's figures say it uses or has
    /// committed, within its configured size (`None` when it gave no figures this tick:
    /// nothing to hold against the host, neither a contradiction nor an agreement);
    /// `size`, its current size; `backed`, what its hypervisor holds of that size
    /// or the host swapped out of it;
    /// `configured`, its size at boot; `measured`, whether `backed` is the host's
    /// measure (its hypervisor's resident memory) rather than a stand-in. True while the
    /// guest is found out.
    ///
    /// A guest is first held to its claim in RAM within its current size: memory it says it
    /// uses there is memory it has touched (what its own swap holds is not: an honest
    /// guest squeezed into its swap and given memory back was found out while the pages
    /// stayed there, 75 s on a real guest in an audit). Once found out, to its whole
    /// claim, its swap's part too: squeezed to
    /// what the host backs, it claims all it has and the host backs all of it, which
    /// proves nothing (found on real guests: a liar believed again at its squeezed size
    /// had its claimed commitment protected, grew back to its full size and pushed its
    /// honest neighbour below what that one had committed, until found out again).
    ///
    /// The time since the previous tick (at most [`MAX_TICK`]) counts as what this tick
    /// shows. Agreement drains the doubt at full rate where the host now backs what the
    /// guest claimed when last contradicted (it was telling the truth early), at half
    /// rate where the guest claims less instead (a guest telling the truth one tick in 20
    /// started the grace over each time and was never found out; at half rate one that
    /// lies over a third of the time is found out). A tick in which the host sees the
    /// guest touch memory it never held before at [`PROGRESS`] or faster counts neither
    /// way.
    pub fn observe(
        &mut self,
        at: Duration,
        claimed: Option<Claimed>,
        size: Bytes,
        backed: Bytes,
        configured: Bytes,
        measured: bool,
    ) -> bool {
        let last = self.last.map_or(at, |l| l.max(at));
        let dt = at.saturating_sub(self.last.unwrap_or(at)).min(MAX_TICK);
        self.last = Some(last);
        let Some(claimed) = claimed else {
            return self.found_out;
        };
        let held_to = if self.found_out {
            claimed.whole
        } else {
            claimed.in_ram.min(size)
        };
        let tolerance = configured.scale(TOLERANCE);
        // Growth is measured over the whole time since the last figures (not capped as
        // `dt` is), beyond the most the host ever backed of it; only where the host
        // measured it (a tick without its hypervisor's resident memory takes the guest's
        // size as backed, which would end all credit).
        let touching = measured
            && self.figures_at.is_some_and(|then| {
                let since = at.saturating_sub(then).as_secs_f64();
                since > 0.0 && backed >= self.high + configured.scale(PROGRESS * since)
            });
        if measured {
            self.high = self.high.max(backed);
            self.figures_at = Some(self.figures_at.map_or(at, |then| then.max(at)));
        }
        if held_to > backed + tolerance && touching {
            // Catching up with its claim: neither a contradiction nor an agreement yet.
        } else if held_to > backed + tolerance {
            self.excess = (self.excess + dt).min(2 * GRACE);
            self.claimed = held_to;
        } else if backed + tolerance >= self.claimed {
            self.excess = self.excess.saturating_sub(dt);
        } else {
            self.excess = self.excess.saturating_sub(dt / 2);
        }
        self.found_out = if self.found_out {
            !self.excess.is_zero()
        } else {
            self.excess >= GRACE
        };
        self.found_out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mib(v: u64) -> Option<Claimed> {
        Some(Bytes::from_mib(v).into())
    }

    const FULL: Bytes = Bytes(1 << 30);

    /// Feed `t` one tick a second over `seconds`, the guest at its full size, claiming
    /// `claim(s)` with `backed(s)` MiB behind it; what each tick returned.
    fn feed(
        t: &mut Trust,
        seconds: std::ops::Range<u64>,
        claim: impl Fn(u64) -> Option<Claimed>,
        backed: impl Fn(u64) -> u64,
    ) -> Vec<bool> {
        seconds
            .map(|s| {
                let at = Duration::from_secs(s);
                t.observe(at, claim(s), FULL, Bytes::from_mib(backed(s)), FULL, true)
            })
            .collect()
    }

    #[test]
    fn a_claim_the_host_does_not_back_is_believed_only_for_the_grace_period() {
        let mut t = Trust::default();
        let g = GRACE.as_secs();
        // Claims 1000 MiB in use, the host backs 200: believed for the grace, then not.
        let d = feed(&mut t, 0..g + 1, |_| mib(1000), |_| 200);
        assert_eq!(d.iter().position(|d| *d), Some(g as usize));
        // The host's figures catch up (the guest touched it): the doubt drains as fast
        // as it came, and a new contradiction then has a new grace period.
        let d = feed(&mut t, g + 1..2 * g + 1, |_| mib(1000), |_| 990);
        assert!(d[..(g - 1) as usize].iter().all(|d| *d), "on probation");
        assert!(!d[g as usize - 1], "agreed as long as it was contradicted");
        // (Its first tick counts the second before it, as every tick does but the first.)
        let d = feed(&mut t, 2 * g + 1..3 * g + 2, |_| mib(1000), |_| 200);
        assert_eq!(d.iter().position(|d| *d), Some(g as usize - 1));
    }

    #[test]
    fn a_claim_within_the_tolerance_is_no_contradiction() {
        let mut t = Trust::default();
        // 40 MiB beyond the host's figure on a 1 GiB guest: under 5%.
        assert!(feed(&mut t, 0..1000, |_| mib(540), |_| 500)
            .iter()
            .all(|d| !d));
    }

    #[test]
    fn a_guest_found_out_stays_so_when_squeezed_to_what_the_host_backs() {
        let mut t = Trust::default();
        let at = |s: u64| Duration::from_secs(s);
        let (claim, mib_) = (mib(1000), Bytes::from_mib);
        let g = GRACE.as_secs();
        assert!(feed(&mut t, 0..g + 1, |_| claim, |_| 200)[g as usize]);
        // Ballooned to 250 MiB, of which the host backs 240: all of its size is in use
        // as it claims, but the rest of its claim is still not behind it.
        for s in g + 1..g + 100 {
            assert!(t.observe(at(s), claim, mib_(250), mib_(240), FULL, true));
        }
        // A guest not found out is held to its claim within its size: squeezed to 250 MiB
        // and using all of it, it is believed however much it has committed.
        let mut honest = Trust::default();
        for s in 0..1000 {
            assert!(!honest.observe(at(s), claim, mib_(250), mib_(240), FULL, true));
        }
    }

    #[test]
    fn a_guest_telling_the_truth_now_and_then_is_found_out() {
        // Lies for 19 s, then claims only what the host backs for one tick, over and
        // over: each truthful tick takes back half a second of the grace, not all of it.
        let mut t = Trust::default();
        let lie = |s: u64| if s % 20 != 19 { mib(1000) } else { mib(150) };
        let d = feed(&mut t, 0..400, lie, |_| 200);
        let first = d.iter().position(|d| *d).expect("found out");
        assert!(first <= 22, "found out after {first} s");
        assert!(d[first..].iter().all(|d| *d), "doubted from then on");
        // Lying half the time, in spells shorter than the grace: found out too.
        let mut half = Trust::default();
        let d = feed(
            &mut half,
            0..200,
            |s| mib(if s % 38 < 19 { 1000 } else { 150 }),
            |_| 200,
        );
        assert!(d.iter().any(|d| *d), "a liar half the time is found out");
    }

    #[test]
    fn an_honest_guest_touching_what_it_allocates_is_never_found_out() {
        // Its claims run 5 s ahead of the host's figures in every 20 (it allocates, then
        // touches), and it frees at the end of each cycle.
        let mut t = Trust::default();
        let claim = |s: u64| mib(if s % 20 == 19 { 200 } else { 1000 });
        let backed = |s: u64| if s % 20 < 5 { 200 } else { 990 };
        assert!(feed(&mut t, 0..2000, claim, backed).iter().all(|d| !d));
    }

    #[test]
    fn a_guest_filling_a_heap_it_committed_is_not_found_out_while_it_fills_it() {
        // Committed 900 MiB of its 1 GiB at start and touches 10 MiB a second: the host
        // backs less than it claims for 85 s, but sees it catch up every second.
        let mut t = Trust::default();
        let filling = feed(&mut t, 0..80, |_| mib(900), |s| 30 + 10 * s);
        assert!(filling.iter().all(|d| !d), "{filling:?}");
        // Stops touching short of its claim: found out after the grace.
        let stopped = feed(&mut t, 80..110, |_| mib(900), |_| 600);
        let g = GRACE.as_secs() as usize;
        assert_eq!(stopped.iter().position(|d| *d), Some(g - 1));
        // A tick whose backed memory the host could not measure (its size stood in for
        // it) neither counts as touching nor ends the credit.
        let mut t = Trust::default();
        feed(&mut t, 0..30, |_| mib(900), |s| 30 + 10 * s);
        let at = Duration::from_secs(30);
        assert!(!t.observe(at, mib(900), FULL, FULL, FULL, false));
        let rest = feed(&mut t, 31..80, |_| mib(900), |s| 30 + 10 * s);
        assert!(rest.iter().all(|d| !d), "{rest:?}");
        // Touching a MiB a second is not catching up.
        let mut t = Trust::default();
        let crawl = feed(&mut t, 0..30, |_| mib(900), |s| 30 + s);
        assert_eq!(crawl.iter().position(|d| *d), Some(g));
    }

    #[test]
    fn what_its_swap_holds_is_held_against_a_guest_only_once_it_is_found_out() {
        let claim = |in_ram| {
            Some(Claimed {
                whole: Bytes::from_mib(1000),
                in_ram: Bytes::from_mib(in_ram),
            })
        };
        // 1000 MiB committed, 700 of it in its swap since a squeeze: the host backs the
        // 300 in its RAM, and it is believed.
        let mut t = Trust::default();
        assert!(feed(&mut t, 0..60, |_| claim(300), |_| 300)
            .iter()
            .all(|d| !d));
        // Found out first (all of it claimed in RAM, 200 backed), then squeezed into its
        // swap: held to all it claims.
        let mut t = Trust::default();
        assert!(feed(&mut t, 0..30, |_| claim(1000), |_| 200)[29]);
        assert!(feed(&mut t, 30..90, |_| claim(300), |_| 300)
            .iter()
            .all(|d| *d));
    }

    #[test]
    fn a_liar_touching_its_claim_then_freeing_it_over_and_over_is_found_out() {
        // Claims 1000 MiB; climbs from 30 MiB to it at 10 MiB a second, agrees for a tick
        // at the top, frees it all (free page reporting), climbs again.
        let mut t = Trust::default();
        let cycle = |s: u64| 30 + 10 * (s % 99);
        let d = feed(&mut t, 0..400, |_| mib(1000), cycle);
        assert!(d[200..].iter().all(|d| *d), "found out on its second climb");
        // Figures one tick in ten, backed growing 1 MiB a second: no catching up.
        let mut t = Trust::default();
        let sparse = |s: u64| s.is_multiple_of(10).then(|| Bytes::from_mib(1000).into());
        let d = feed(&mut t, 0..400, sparse, |s| 30 + s);
        assert!(d.iter().any(|d| *d), "found out");
    }

    #[test]
    fn a_long_gap_and_silence_count_for_little() {
        // One contradicted sample after a minute away adds 5 s, not the minute.
        let mut t = Trust::default();
        let at = |s: u64| Duration::from_secs(s);
        let (claim, backed) = (mib(1000), Bytes::from_mib(200));
        assert!(!t.observe(at(0), claim, FULL, backed, FULL, true));
        assert!(!t.observe(at(60), claim, FULL, backed, FULL, true));
        assert!(!t.observe(at(120), claim, FULL, backed, FULL, true));
        assert!(!t.observe(at(180), claim, FULL, backed, FULL, true));
        assert!(
            t.observe(at(240), claim, FULL, backed, FULL, true),
            "the fifth sample"
        );
        // A tick without figures neither drains the doubt nor clears it.
        for s in 241..400 {
            assert!(t.observe(at(s), None, FULL, backed, FULL, true));
        }
        // A tick whose clock went back counts for nothing, and the next counts from the
        // latest tick: found out at 20 s, it agrees from 21 s on and is cleared at 40 s
        // (at 36 s had the tick at 10 s counted as the latest).
        let mut t = Trust::default();
        feed(&mut t, 0..21, |_| claim, |_| 200);
        assert!(t.observe(at(10), claim, FULL, Bytes::from_mib(990), FULL, true));
        let d = feed(&mut t, 21..41, |_| claim, |_| 990);
        assert_eq!(d.iter().position(|d| !d), Some(19), "{d:?}");
    }
}
