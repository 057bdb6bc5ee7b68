//! QEMU's virtio-balloon `guest-stats` property, as returned by `qom-get`.

use memtide_core::stats::GuestStats;
use memtide_core::Bytes;
use serde_json::Value;

/// A statistic value: QEMU reports "not supplied" as -1 (older versions print it as
/// 2^64 − 1); both, and anything that is not a non-negative integer, are `None`.
fn value(v: &Value) -> Option<u64> {
    v.as_u64().filter(|v| *v != u64::MAX)
}

/// Parse `{"stats": {"stat-…": n, …}, "last-update": t}`. Unknown statistics are kept
/// by name in `other`, so nothing QEMU reports is lost.
pub fn parse(v: &Value) -> GuestStats {
    let mut s = GuestStats {
        last_update: v
            .get("last-update")
            .and_then(Value::as_u64)
            .filter(|t| *t > 0),
        ..GuestStats::default()
    };
    let Some(stats) = v.get("stats").and_then(Value::as_object) else {
        return s;
    };
    for (name, raw) in stats {
        let n = value(raw);
        let bytes = n.map(Bytes);
        match name.as_str() {
            "stat-swap-in" => s.swap_in = bytes,
            "stat-swap-out" => s.swap_out = bytes,
            "stat-major-faults" => s.major_faults = n,
            "stat-minor-faults" => s.minor_faults = n,
            "stat-free-memory" => s.free = bytes,
            "stat-total-memory" => s.total = bytes,
            "stat-available-memory" => s.available = bytes,
            "stat-disk-caches" => s.disk_caches = bytes,
            "stat-htlb-pgalloc" => s.hugetlb_allocs = n,
            "stat-htlb-pgfail" => s.hugetlb_failures = n,
            "stat-oom-kills" => s.oom_kills = n,
            "stat-alloc-stalls" => s.alloc_stalls = n,
            "stat-async-scans" => s.async_scans = n,
            "stat-direct-scans" => s.direct_scans = n,
            "stat-async-reclaims" => s.async_reclaims = n,
            "stat-direct-reclaims" => s.direct_reclaims = n,
            other => {
                if let Some(n) = n {
                    s.other.insert(other.to_string(), n);
                }
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn not_supplied_values_are_none() {
        let s = parse(
            &json!({"stats": {"stat-swap-in": -1, "stat-free-memory": 18446744073709551615u64,
            "stat-total-memory": 400000000}, "last-update": 0}),
        );
        assert_eq!((s.swap_in, s.free, s.last_update), (None, None, None));
        assert_eq!(s.total, Some(Bytes(400000000)));
    }

    #[test]
    fn unknown_stats_are_kept_and_garbage_is_ignored() {
        let s = parse(
            &json!({"stats": {"stat-future-thing": 7, "stat-major-faults": "many"}, "last-update": 5}),
        );
        assert_eq!(s.other.get("stat-future-thing"), Some(&7));
        assert_eq!(s.major_faults, None);
        assert_eq!(s.last_update, Some(5));
        assert!(parse(&json!("nonsense")).is_empty());
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;
    use serde_json::json;

    proptest! {
        /// Hostile stats values never panic the parser and never become huge bogus sizes.
        #[test]
        fn arbitrary_values_parse_safely(free in any::<i64>(), total in any::<u64>(), name in "[a-z-]{1,20}") {
            let s = super::parse(&json!({"stats": {"stat-free-memory": free, "stat-total-memory": total, name: free}, "last-update": 1}));
            prop_assert_eq!(s.free.map(|b| b.0), u64::try_from(free).ok());
            prop_assert!(s.total.is_none_or(|t| t.0 != u64::MAX));
        }
    }
}
