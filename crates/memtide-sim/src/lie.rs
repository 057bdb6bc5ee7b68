//! Guests that lie: what a hostile guest reports instead of the truth, through its
//! balloon statistics and its agent, so that tests can check that its claims take nothing
//! from honest neighbours (`docs/security.md`). Each lie is consistent enough to pass the
//! engine's plausibility checks: absurd figures are refused at ingest, these are not.

use memtide_core::stats::{AgentStats, GuestStats, Psi, PsiLine, ZramSwap};
use memtide_core::Bytes;
use serde::{Deserialize, Serialize};

/// How a guest misreports its memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Lie {
    /// All its memory in use, all of it committed and its swap full: it needs everything
    /// it has and more.
    NeedsAll,
    /// [`Lie::NeedsAll`] with the figures that would give it away left out: no
    /// MemAvailable nor Committed_AS from its agent, no available memory in its balloon
    /// statistics (found by review: the claim its anonymous memory made was not held
    /// against the host without them).
    Silent,
    /// Swap-ins, refaults, allocation stalls and memory pressure that are not happening:
    /// it seems to thrash, whatever it is given.
    Thrashing,
    /// [`Lie::NeedsAll`], but the truth for one second in every 20: a guest that hopes
    /// each truthful report starts the host's doubt over.
    NowAndThen,
    /// No swap, where it has some: it keeps all it holds while memory is ample, and gets
    /// room for bursts, as a guest whose allocations would be OOM kills.
    NoSwap,
    /// Swap on zram four times its size that compresses nothing: all of it would stay in
    /// its RAM, so it claims room for all of it while memory is ample.
    IncompressibleZram,
    /// A commitment growing by 2% of its size every second, beside swap sixteen times its
    /// size: it seems to allocate anew every tick.
    CreepingCommit,
}

impl Lie {
    /// Whether it lies `at_s` seconds into the run.
    fn lies_at(self, at_s: f64) -> bool {
        self != Lie::NowAndThen || at_s.rem_euclid(20.0) < 19.0
    }
}

/// Pages per second of invented swap-ins and refaults (40 MiB/s).
const FAKE_FAULTS_PER_S: u64 = 10_240;

impl Lie {
    /// Rewrite the balloon statistics of a guest `at_s` seconds into the run.
    pub fn balloon(self, s: &mut GuestStats, at_s: f64) {
        if !self.lies_at(at_s) {
            return;
        }
        match self {
            Lie::NeedsAll | Lie::NowAndThen | Lie::Silent => {
                let little = s.total.map(|t| t.scale(0.01));
                s.free = little;
                s.available = little.filter(|_| self != Lie::Silent);
                s.disk_caches = Some(Bytes::ZERO);
            }
            Lie::Thrashing => {
                let fake = fake_count(at_s);
                s.swap_in = Some(s.swap_in.unwrap_or_default() + Bytes::from_kib(4 * fake));
                s.major_faults = Some(s.major_faults.unwrap_or_default() + fake);
                s.alloc_stalls = Some(s.alloc_stalls.unwrap_or_default() + fake / 64);
            }
            Lie::NoSwap | Lie::IncompressibleZram | Lie::CreepingCommit => {}
        }
    }

    /// Rewrite what the guest's agent reports `at_s` seconds into the run.
    pub fn agent(self, a: &mut AgentStats, at_s: f64) {
        if !self.lies_at(at_s) {
            return;
        }
        match self {
            Lie::NeedsAll | Lie::NowAndThen | Lie::Silent => {
                let m = &mut a.meminfo;
                let little = m.total.scale(0.01);
                let told = self != Lie::Silent;
                m.free = little;
                m.available = Some(little).filter(|_| told);
                m.cached = Bytes::ZERO;
                m.active_file = Some(Bytes::ZERO);
                m.inactive_file = Some(Bytes::ZERO);
                m.anon_pages = Some(m.total - little);
                m.active_anon = Some(m.total - little);
                m.inactive_anon = Some(Bytes::ZERO);
                m.committed_as = Some(m.total + m.swap_total).filter(|_| told);
                m.swap_free = Bytes::ZERO;
            }
            Lie::Thrashing => {
                let fake = fake_count(at_s);
                let v = &mut a.vmstat;
                let add = |c: &mut Option<u64>, n: u64| *c = Some(c.unwrap_or_default() + n);
                add(&mut v.pswpin, fake);
                add(&mut v.pgmajfault, fake);
                add(&mut v.workingset_refault_anon, fake);
                add(&mut v.allocstall, fake / 64);
                let line = PsiLine {
                    avg10: 40.0,
                    avg60: 40.0,
                    avg300: 40.0,
                    total_us: (at_s * 400_000.0) as u64,
                };
                a.psi = Some(Psi {
                    some: line,
                    full: Some(line),
                });
            }
            Lie::CreepingCommit => {
                let m = &mut a.meminfo;
                let used = m.swap_total - m.swap_free;
                m.swap_total = m.total.scale(16.0);
                m.swap_free = m.swap_total - used;
                let crept = m.total.scale(0.02 * at_s.max(0.0));
                m.committed_as = m.committed_as.map(|c| c + crept);
            }
            Lie::NoSwap => {
                let m = &mut a.meminfo;
                m.swap_total = Bytes::ZERO;
                m.swap_free = Bytes::ZERO;
                a.zram = None;
            }
            Lie::IncompressibleZram => {
                let m = &mut a.meminfo;
                let used = m.swap_total - m.swap_free;
                m.swap_total = m.total.scale(4.0);
                m.swap_free = m.swap_total - used;
                let stored = Bytes::from_mib(1024);
                a.zram = Some(ZramSwap {
                    free: m.swap_free,
                    stored,
                    used: stored,
                });
            }
        }
    }
}

/// Invented events so far, growing steadily with time.
fn fake_count(at_s: f64) -> u64 {
    (at_s.max(0.0) as u64).saturating_mul(FAKE_FAULTS_PER_S)
}

#[cfg(test)]
mod tests {
    use super::*;
    use memtide_core::stats::MemInfo;

    #[test]
    fn a_guest_that_needs_everything_reports_no_room_and_a_full_commitment() {
        let mut a = AgentStats {
            meminfo: MemInfo {
                total: Bytes::from_mib(1000),
                free: Bytes::from_mib(800),
                swap_total: Bytes::from_mib(500),
                swap_free: Bytes::from_mib(500),
                ..MemInfo::default()
            },
            vmstat: Default::default(),
            psi: None,
            zram: None,
        };
        Lie::NeedsAll.agent(&mut a, 10.0);
        assert_eq!(a.meminfo.available, Some(Bytes::from_mib(10)));
        assert_eq!(a.meminfo.committed_as, Some(Bytes::from_mib(1500)));
        assert_eq!(a.meminfo.swap_free, Bytes::ZERO);
    }

    #[test]
    fn now_and_then_a_liar_tells_the_truth_for_a_second() {
        let honest = AgentStats {
            meminfo: MemInfo {
                total: Bytes::from_mib(1000),
                free: Bytes::from_mib(800),
                ..MemInfo::default()
            },
            vmstat: Default::default(),
            psi: None,
            zram: None,
        };
        let told = |at_s| {
            let mut a = honest.clone();
            Lie::NowAndThen.agent(&mut a, at_s);
            a.meminfo.free
        };
        assert_eq!(told(18.5), Bytes::from_mib(10));
        assert_eq!(told(19.0), Bytes::from_mib(800));
        assert_eq!(told(20.0), Bytes::from_mib(10));
    }

    #[test]
    fn a_thrashing_guest_counts_faults_that_keep_growing() {
        let mut a = AgentStats {
            meminfo: MemInfo::default(),
            vmstat: Default::default(),
            psi: None,
            zram: None,
        };
        let mut b = a.clone();
        Lie::Thrashing.agent(&mut a, 10.0);
        Lie::Thrashing.agent(&mut b, 11.0);
        assert_eq!(
            b.vmstat.pswpin.unwrap() - a.vmstat.pswpin.unwrap(),
            FAKE_FAULTS_PER_S
        );
        assert!(b.psi.unwrap().some.avg10 > 10.0);
    }
}
