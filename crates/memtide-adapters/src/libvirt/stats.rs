//! libvirt's domain memory statistics (`virDomainMemoryStats`), as tag and value pairs.
//!
//! Tags and units as documented for `virDomainMemoryStatTags`
//! (<https://libvirt.org/html/libvirt-libvirt-domain.html#virDomainMemoryStatTags>):
//! sizes in KiB, faults and hugetlb counters as counts, `LAST_UPDATE` in seconds.
//! `AVAILABLE` is the memory the guest sees in total (MemTotal), `USABLE` what it could
//! use without swapping (MemAvailable), `ACTUAL_BALLOON` the guest's logical size.

use memtide_core::stats::GuestStats;
use memtide_core::Bytes;

/// What one `virDomainMemoryStats` call tells.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DomainMemory {
    /// The guest's logical size (`ACTUAL_BALLOON`).
    pub balloon: Option<Bytes>,
    /// Resident memory of the QEMU process (`RSS`).
    pub rss: Option<Bytes>,
    /// The guest's balloon statistics.
    pub stats: GuestStats,
}

/// Interpret `(tag, value)` pairs. Unknown tags (newer libvirt) are kept in
/// `stats.other` as `libvirt-tag-N`.
pub fn parse(pairs: &[(u32, u64)]) -> DomainMemory {
    let mut m = DomainMemory::default();
    let s = &mut m.stats;
    for &(tag, v) in pairs {
        let kib = Some(Bytes::from_kib(v));
        match tag {
            0 => s.swap_in = kib,
            1 => s.swap_out = kib,
            2 => s.major_faults = Some(v),
            3 => s.minor_faults = Some(v),
            4 => s.free = kib,
            5 => s.total = kib,
            6 => m.balloon = kib,
            7 => m.rss = kib,
            8 => s.available = kib,
            9 => s.last_update = Some(v).filter(|t| *t > 0),
            10 => s.disk_caches = kib,
            11 => s.hugetlb_allocs = Some(v),
            12 => s.hugetlb_failures = Some(v),
            other => {
                s.other.insert(format!("libvirt-tag-{other}"), v);
            }
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_map_to_guest_stats_in_kib() {
        // As `virsh dommemstat` printed them for a 256 MiB test guest through libvirt 9.0:
        // actual 262144, swap_in 0, swap_out 0, major_fault 0, minor_fault 1398,
        // unused 184200, available 223764, usable 187508, last_update 1795326743,
        // disk_caches 13684, hugetlb_pgalloc 0, hugetlb_pgfail 0, rss 243920.
        let m = parse(&[
            (6, 262144),
            (0, 0),
            (1, 0),
            (2, 0),
            (3, 1398),
            (4, 184200),
            (5, 223764),
            (8, 187508),
            (9, 1795326743),
            (10, 13684),
            (11, 0),
            (12, 0),
            (7, 243920),
        ]);
        assert_eq!(m.balloon, Some(Bytes::from_mib(256)));
        assert_eq!(m.rss, Some(Bytes::from_kib(243920)));
        assert_eq!(m.stats.total, Some(Bytes::from_kib(223764)));
        assert_eq!(m.stats.available, Some(Bytes::from_kib(187508)));
        assert_eq!(m.stats.free, Some(Bytes::from_kib(184200)));
        assert_eq!(m.stats.minor_faults, Some(1398));
        assert_eq!(m.stats.last_update, Some(1795326743));
        assert!(m.stats.other.is_empty());
    }

    #[test]
    fn absent_tags_stay_none_and_unknown_ones_are_kept() {
        // A guest without a balloon driver: libvirt reports only the balloon and RSS.
        let m = parse(&[(6, 1024), (7, 2048), (42, 7)]);
        assert!(m.stats.free.is_none() && m.stats.last_update.is_none());
        assert_eq!(m.stats.other.get("libvirt-tag-42"), Some(&7));
    }
}
