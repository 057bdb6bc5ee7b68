//! Guest statistics are untrusted input: a buggy or hostile guest can report anything.
//! Values that contradict what the host knows are dropped before any policy sees them.

use crate::history::History;
use crate::snapshot::{FixedMemory, VmSample};
use crate::stats::{GuestStats, MemInfo};
use crate::units::Bytes;
use std::time::Duration;

/// Balloon statistics whose update time has not moved for this long (and for three
/// sample intervals) are stale.
const STALE: Duration = Duration::from_secs(8);

/// Slack allowed above the configured size (guest kernels report MemTotal slightly below
/// the RAM size; never above it, but allow rounding).
const TOTAL_SLACK: f64 = 1.01;

/// Drop (in place) the memory figures a guest could not truthfully report, given its
/// configured size. Returns one message per problem found.
pub fn sanitize(stats: &mut GuestStats, configured: Bytes) -> Vec<String> {
    let clean = stats;
    let mut problems = Vec::new();
    let ceiling = configured.scale(TOTAL_SLACK);
    if let Some(total) = clean.total.filter(|t| *t > ceiling) {
        problems.push(format!(
            "guest reports total memory {total}, above its configured {configured}; memory figures ignored"
        ));
        clean.total = None;
        clean.free = None;
        clean.available = None;
        clean.disk_caches = None;
        return problems;
    }
    let bound = clean.total.unwrap_or(configured);
    for (name, field) in [
        ("free", &mut clean.free),
        ("available", &mut clean.available),
        ("disk caches", &mut clean.disk_caches),
    ] {
        if let Some(v) = field.filter(|v| *v > bound) {
            problems.push(format!(
                "guest reports {name} {v}, above its total {bound}; ignored"
            ));
            *field = None;
        }
    }
    problems
}

/// Balloon statistics that stopped being updated: QEMU answers with the last figures the
/// guest's driver sent, so a guest whose driver was unloaded, or which hangs, looks
/// unchanged forever (seen on a real guest: after `rmmod virtio_balloon` it kept
/// reporting 19 MiB free with its whole size back). Drops the figures (in place, keeping
/// their date) when the date `stats` carry at `at` has not moved since `STALE` ago and
/// three sample intervals; `history` holds the earlier samples. Returns why.
pub fn stale(stats: &mut GuestStats, at: Duration, history: &History<VmSample>) -> Option<String> {
    let date = stats.last_update?;
    let since = history
        .unchanged_since(&Some(date), |s| s.stats.last_update)
        .filter(|since| *since < at)?;
    let age = at - since;
    let spacing = history.interval().unwrap_or_default();
    if age < STALE.max(spacing * 3) {
        return None;
    }
    *stats = GuestStats {
        last_update: Some(date),
        ..GuestStats::default()
    };
    Some(format!(
        "balloon statistics not updated for {} s (the guest's balloon driver stopped reporting): ignored",
        age.as_secs()
    ))
}

/// The guest agent's /proc figures, checked like the balloon statistics: a MemTotal above
/// the configured size, or free, available, cached or swap figures beyond their totals,
/// make the whole report implausible. Returns what is wrong, if anything; the caller
/// then treats the agent as not answering (no probing on figures nobody can trust).
pub fn implausible_agent(m: &MemInfo, configured: Bytes) -> Option<String> {
    let ceiling = configured.scale(TOTAL_SLACK);
    if m.total > ceiling {
        return Some(format!(
            "guest agent reports MemTotal {}, above its configured {configured}; its figures ignored",
            m.total
        ));
    }
    let over = [
        ("MemFree", Some(m.free), m.total),
        ("MemAvailable", m.available, m.total),
        ("Cached", Some(m.cached), m.total),
        ("SwapFree", Some(m.swap_free), m.swap_total),
    ];
    over.into_iter().find_map(|(name, v, bound)| {
        v.filter(|v| *v > bound)
            .map(|v| format!("guest agent reports {name} {v}, above {bound}; its figures ignored"))
    })
}

/// The balloon's size as the guest reports it, bounded by its configured size: a guest
/// cannot hold more than it was given. Returns the bounded size and, when it had to be
/// bounded, why.
pub fn bounded_actual(actual: Bytes, configured: Bytes) -> (Bytes, Option<String>) {
    if actual > configured.scale(TOTAL_SLACK) {
        let why = format!(
            "balloon reports the guest at {actual}, above its configured {configured}; taken as {configured}"
        );
        (configured, Some(why))
    } else {
        (actual, None)
    }
}

/// What the hypervisor may hold beyond a guest's balloon size on its own account (device
/// memory, page tables, and under TCG a translation cache: up to 274 MiB measured on this
/// project's 384 MiB test guests).
fn overhead_allowance(configured: Bytes) -> Bytes {
    Bytes::from_mib(384).max(configured.scale(0.125))
}

/// How much more the hypervisor process holds than the balloon size the guest reports,
/// when that is more than its own overhead can explain: the guest claims to have given
/// memory back that the host never got (its balloon driver updated `actual` but kept the
/// pages). `None` while the host confirms the size, or cannot tell (no RSS).
pub fn undelivered(actual: Bytes, rss: Option<Bytes>, configured: Bytes) -> Option<Bytes> {
    let rss = rss?;
    (rss > actual + overhead_allowance(configured)).then(|| rss - actual)
}

/// Why a balloon frees nothing for the host, when the hypervisor holds the guest's memory
/// so: half its size or more locked or pinned (the kernel never reclaims it: QEMU's
/// `mem-lock`, or VFIO pinning all guest RAM for a passthrough device's DMA), or any of it
/// in hugetlbfs pages (a huge page is given back only whole, and QEMU's balloon discards
/// nothing in hugetlbfs-backed RAM). `None` for ordinary memory.
pub fn fixed_memory(fixed: &FixedMemory, configured: Bytes) -> Option<String> {
    if fixed.hugetlb >= Bytes::from_mib(2) {
        Some(format!(
            "the hypervisor maps {} of hugetlbfs pages: its guest RAM is backed by huge \
             pages, which a balloon does not give back",
            fixed.hugetlb
        ))
    } else if fixed.locked >= configured.scale(0.5) {
        Some(format!(
            "the hypervisor holds {} locked or pinned in RAM (mlock, as with QEMU's \
             mem-lock=on, or a VFIO passthrough device's DMA pinning): a balloon frees \
             nothing of it",
            fixed.locked
        ))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics_whose_date_stopped_moving_are_dropped_as_stale() {
        let stats = |date: u64| GuestStats {
            free: Some(Bytes::from_mib(19)),
            last_update: Some(date),
            ..GuestStats::default()
        };
        let sample = |date| VmSample {
            stats: stats(date),
            ..crate::testkit::vm("v", 384, 384, 19).sample.unwrap()
        };
        let s = Duration::from_secs;
        let mut h = History::new(10);
        // Updated every second: never stale.
        for t in 0..10 {
            h.push(s(t), sample(1000 + t));
        }
        assert_eq!(stale(&mut stats(1010), s(10), &h), None);
        // The driver stops at date 1002 (t = 2 s): stale 8 s later, the
        // figures dropped and the date kept.
        let mut h = History::new(10);
        for t in 0..10 {
            h.push(s(t), sample(1000 + t.min(2)));
        }
        let mut fresh = stats(1002);
        assert!(
            stale(&mut fresh, s(10), &h).is_some(),
            "unchanged since 2 s"
        );
        assert_eq!(fresh.free, None);
        assert_eq!(fresh.last_update, Some(1002));
        let mut h = History::new(10);
        for t in 0..10 {
            h.push(s(t), sample(1000 + t.min(5)));
        }
        assert_eq!(
            stale(&mut stats(1005), s(10), &h),
            None,
            "unchanged for 5 s only"
        );
        // Samples 4 s apart: three intervals (12 s) before the figures are called stale.
        let mut h = History::new(10);
        for t in 0..3 {
            h.push(s(4 * t), sample(1000));
        }
        assert_eq!(stale(&mut stats(1000), s(8), &h), None);
        assert!(stale(&mut stats(1000), s(12), &h).is_some());
        // No date: nothing to judge.
        let mut undated = GuestStats::default();
        assert_eq!(stale(&mut undated, s(100), &h), None);
    }

    #[test]
    fn memory_locked_pinned_or_in_huge_pages_is_fixed() {
        let mib = Bytes::from_mib;
        let fixed = |locked, hugetlb| FixedMemory {
            locked: mib(locked),
            hugetlb: mib(hugetlb),
            own: None,
        };
        assert_eq!(fixed_memory(&fixed(0, 0), mib(512)), None);
        // A few locked pages (QEMU's own, a vhost ring) are no reason.
        assert_eq!(fixed_memory(&fixed(8, 0), mib(512)), None);
        let locked = fixed_memory(&fixed(512, 0), mib(512)).unwrap();
        assert!(locked.contains("512 MiB locked or pinned"), "{locked}");
        let huge = fixed_memory(&fixed(0, 256), mib(512)).unwrap();
        assert!(huge.contains("256 MiB of hugetlbfs pages"), "{huge}");
    }

    #[test]
    fn undelivered_memory_is_what_the_host_holds_beyond_size_and_overhead() {
        let mib = Bytes::from_mib;
        // TCG's overhead as measured on the real test guests is not undelivered memory.
        assert_eq!(undelivered(mib(200), Some(mib(474)), mib(384)), None);
        // A 1 GiB guest claiming 300 MiB while QEMU holds all of it.
        assert_eq!(
            undelivered(mib(300), Some(mib(1030)), mib(1024)),
            Some(mib(730))
        );
        // Large guests are allowed an eighth of their size.
        assert_eq!(undelivered(mib(8192), Some(mib(9100)), mib(16384)), None);
        assert_eq!(
            undelivered(mib(300), None, mib(1024)),
            None,
            "no RSS: unknown"
        );
    }

    fn stats(total: u64, free: u64) -> GuestStats {
        GuestStats {
            total: Some(Bytes::from_mib(total)),
            free: Some(Bytes::from_mib(free)),
            available: Some(Bytes::from_mib(free)),
            ..GuestStats::default()
        }
    }

    #[test]
    fn agent_figures_beyond_their_totals_are_implausible() {
        let m = MemInfo {
            total: Bytes::from_mib(370),
            free: Bytes::from_mib(100),
            available: Some(Bytes::from_mib(200)),
            swap_total: Bytes::from_mib(100),
            swap_free: Bytes::from_mib(50),
            ..MemInfo::default()
        };
        let c = Bytes::from_mib(384);
        assert_eq!(implausible_agent(&m, c), None);
        let huge = MemInfo {
            total: Bytes(u64::MAX),
            ..m.clone()
        };
        assert!(implausible_agent(&huge, c).unwrap().contains("MemTotal"));
        let lying = MemInfo {
            available: Some(Bytes::from_mib(5000)),
            ..m.clone()
        };
        assert!(implausible_agent(&lying, c)
            .unwrap()
            .contains("MemAvailable"));
        let swap = MemInfo {
            swap_free: Bytes::from_mib(101),
            ..m
        };
        assert!(implausible_agent(&swap, c).unwrap().contains("SwapFree"));
    }

    #[test]
    fn a_balloon_size_above_the_configured_one_is_bounded() {
        let c = Bytes::from_mib(1024);
        assert_eq!(
            bounded_actual(Bytes::from_mib(512), c),
            (Bytes::from_mib(512), None)
        );
        let (actual, why) = bounded_actual(Bytes(1 << 50), c);
        assert_eq!(actual, c);
        assert!(why.unwrap().contains("taken as 1.0 GiB"));
    }

    #[test]
    fn plausible_stats_pass_unchanged() {
        let s = stats(370, 200);
        let mut clean = s.clone();
        let problems = sanitize(&mut clean, Bytes::from_mib(384));
        assert_eq!(clean, s);
        assert!(problems.is_empty());
    }

    #[test]
    fn total_above_configured_drops_the_memory_picture() {
        let mut clean = stats(4096, 4000);
        let problems = sanitize(&mut clean, Bytes::from_mib(384));
        assert_eq!(
            (clean.total, clean.free, clean.available),
            (None, None, None)
        );
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0].contains("above its configured 384 MiB"),
            "{}",
            problems[0]
        );
    }

    #[test]
    fn free_above_total_is_dropped_alone() {
        let mut clean = stats(370, 200);
        clean.free = Some(Bytes(u64::MAX));
        let problems = sanitize(&mut clean, Bytes::from_mib(384));
        assert_eq!(clean.free, None);
        assert_eq!(clean.available, Some(Bytes::from_mib(200)));
        assert_eq!(
            problems,
            vec!["guest reports free 17179869184.0 GiB, above its total 370 MiB; ignored"]
        );
    }
}
