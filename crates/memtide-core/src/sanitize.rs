//! Guest statistics are untrusted input: a buggy or hostile guest can report anything.
//! Values that contradict what the host knows are dropped before any policy sees them.

use crate::stats::GuestStats;
use crate::units::Bytes;

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

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(total: u64, free: u64) -> GuestStats {
        GuestStats {
            total: Some(Bytes::from_mib(total)),
            free: Some(Bytes::from_mib(free)),
            available: Some(Bytes::from_mib(free)),
            ..GuestStats::default()
        }
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
