//! What the `liar` workload makes the guest's /proc/meminfo say: every byte in use, all
//! of it and the swap committed, the swap full — a guest that claims to need everything,
//! consistent enough to pass memtide's plausibility checks.

/// The lying text for the real /proc/meminfo `real`: MemFree and MemAvailable 1% of
/// MemTotal, no page cache, the rest anonymous and active, SwapFree 0, Committed_AS
/// MemTotal + SwapTotal; other lines as they are. `None` without MemTotal.
pub fn meminfo(real: &str) -> Option<String> {
    let total = kib(real, "MemTotal")?;
    let swap = kib(real, "SwapTotal").unwrap_or(0);
    let little = total / 100;
    let lie = |name: &str| -> Option<u64> {
        Some(match name {
            "MemFree" | "MemAvailable" => little,
            "Cached" | "Buffers" | "Active(file)" | "Inactive(file)" | "Inactive(anon)"
            | "SwapFree" | "SwapCached" => 0,
            "AnonPages" | "Active(anon)" | "Active" => total - little,
            "Inactive" => 0,
            "Committed_AS" => total + swap,
            _ => return None,
        })
    };
    let mut out = String::with_capacity(real.len());
    for line in real.lines() {
        let name = line.split(':').next().unwrap_or_default();
        match lie(name) {
            Some(v) => out.push_str(&format!("{:<16}{v:>8} kB\n", format!("{name}:"))),
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    Some(out)
}

/// The value of `name` (KiB) in /proc/meminfo text.
pub fn kib(meminfo: &str, name: &str) -> Option<u64> {
    meminfo.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?.strip_prefix(':')?;
        rest.trim().trim_end_matches("kB").trim().parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const REAL: &str = "MemTotal:         376000 kB\nMemFree:          250000 kB\n\
        MemAvailable:     300000 kB\nCached:            40000 kB\nSwapTotal:        262140 kB\n\
        SwapFree:         262140 kB\nCommitted_AS:      60000 kB\nActive(file):      20000 kB\n\
        Slab:              9000 kB\n";

    #[test]
    fn the_guest_claims_to_need_everything_and_keeps_its_other_lines() {
        let fake = meminfo(REAL).unwrap();
        let get = |n: &str| {
            fake.lines()
                .find(|l| l.starts_with(&format!("{n}:")))
                .map(|l| l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap())
        };
        assert_eq!(get("MemTotal"), Some(376000));
        assert_eq!(get("MemAvailable"), Some(3760));
        assert_eq!(get("MemFree"), Some(3760));
        assert_eq!(get("Cached"), Some(0));
        assert_eq!(get("SwapFree"), Some(0));
        assert_eq!(get("Committed_AS"), Some(376000 + 262140));
        assert_eq!(get("Slab"), Some(9000));
        assert!(meminfo("Nothing: 1 kB\n").is_none());
    }
}
