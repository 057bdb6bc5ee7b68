//! Host files: /proc/meminfo, /proc/vmstat, PSI, /proc/swaps, /proc/PID/statm, status, stat, smaps and maps, NUMA
//! node lists and meminfo, cgroup limit, usage and memory.stat files (refaults among
//! them), /proc/PID/cgroup, KSM's one-number files. The same bytes go to every parser;
//! what parses must print back, in the file's own format, to itself.

use memtide_adapters::{access, cgroup, procfs, reclaim, tiers};
use memtide_core::stats::{MemInfo, Psi, PsiLine, VmStat};
use memtide_core::Bytes;
use std::fmt::Write as _;

/// Guest sizes smaps is searched for (the captured QEMU's 256 MiB among them).
const SIZES_MIB: [u64; 3] = [0, 256, 1 << 20];

pub fn run(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Ok(m) = procfs::meminfo(&text) {
        assert_eq!(procfs::meminfo(&meminfo_text(&m)), Ok(m));
    }
    let v = procfs::vmstat(&text);
    assert_eq!(procfs::vmstat(&vmstat_text(&v)), v);
    if let Ok(psi) = procfs::psi(&text) {
        check_psi(&psi);
        assert_eq!(procfs::psi(&psi_text(&psi)), Ok(psi));
    }
    let page = Bytes(4096);
    if let Some(rss) = procfs::statm_rss(&text, page) {
        assert_eq!(rss.0 % page.0, 0, "whole pages");
    }
    // Whole KiB that print back to themselves, or saturated.
    if let Some(swapped) = procfs::status_swap(&text) {
        let line = format!("VmSwap:\t{} kB\n", swapped.kib());
        assert!(
            swapped == Bytes::from_kib(u64::MAX) || procfs::status_swap(&line) == Some(swapped),
            "{swapped:?}"
        );
    }
    procfs::status_fixed(&text);
    if let Some(ids) = tiers::parse_list(&text) {
        assert!(
            ids.len() <= 1025 * text.len(),
            "a list no longer than its text allows"
        );
    }
    tiers::node_meminfo(&text);
    // No more zram free space than the text has digits for (each line's size, saturating).
    let in_ram = procfs::swaps_free_in_ram(&text);
    assert!(
        in_ram == Bytes::from_kib(u64::MAX) || in_ram.0.is_multiple_of(1024),
        "{in_ram:?}"
    );
    if let Some(cpu_s) = procfs::stat_cpu_s(&text, 100.0) {
        assert!(cpu_s.is_finite() && cpu_s >= 0.0, "{cpu_s}");
    }
    for mib in SIZES_MIB {
        procfs::smaps_referenced(&text, &[Bytes::from_mib(mib)]);
    }
    procfs::smaps_referenced(&text, &SIZES_MIB.map(Bytes::from_mib));
    for range in access::private_writable(&text) {
        assert!(range.start < range.end, "{range:?}: no empty mapping");
    }
    if let Ok(limit) = cgroup::parse_limit(&text) {
        assert!(
            !matches!(limit, Some(l) if l.0 >= 1 << 62),
            "v1's no-limit taken as a limit"
        );
    }
    if let Ok(usage) = cgroup::parse_usage(&text) {
        assert_eq!(cgroup::parse_usage(&usage.0.to_string()), Ok(usage));
    }
    if let Some(path) = reclaim::parse_v2_path(&text) {
        assert!(!path.starts_with('/'), "relative to the hierarchy's root");
        assert_eq!(reclaim::parse_v2_path(&format!("0::/{path}\n")), Some(path));
    }
    if let Some(n) = reclaim::parse_refaults(&text) {
        let kv = procfs::key_values(&text);
        let split = kv
            .get("workingset_refault_anon")
            .zip(kv.get("workingset_refault_file"));
        let expected = match split {
            Some((anon, file)) => anon.saturating_add(*file),
            None => kv["workingset_refault"],
        };
        assert_eq!(n, expected, "the split counts when there are both");
    }
    for (key, value) in procfs::key_values(&text) {
        assert!(!key.is_empty() && !key.contains(char::is_whitespace));
        assert_eq!(procfs::key_values(&format!("{key} {value}"))[key], value);
    }
}

/// Pressure shares are percentages.
pub fn check_psi(psi: &Psi) {
    for line in std::iter::once(&psi.some).chain(&psi.full) {
        for share in [line.avg10, line.avg60, line.avg300] {
            assert!((0.0..=100.0).contains(&share), "{share}");
        }
    }
}

/// meminfo as the kernel would write it (in bytes, without a unit).
fn meminfo_text(m: &MemInfo) -> String {
    let fields = [
        ("MemTotal", Some(m.total)),
        ("MemFree", Some(m.free)),
        ("MemAvailable", m.available),
        ("Buffers", Some(m.buffers)),
        ("Cached", Some(m.cached)),
        ("SwapTotal", Some(m.swap_total)),
        ("SwapFree", Some(m.swap_free)),
        ("AnonPages", m.anon_pages),
        ("Committed_AS", m.committed_as),
        ("Active(anon)", m.active_anon),
        ("Inactive(anon)", m.inactive_anon),
        ("Active(file)", m.active_file),
        ("Inactive(file)", m.inactive_file),
        ("Shmem", m.shmem),
        ("SUnreclaim", m.slab_unreclaimable),
        ("SReclaimable", m.slab_reclaimable),
    ];
    let fields = fields.map(|(name, value)| (name, value.map(|b| b.0)));
    fields_text(&fields, ": ")
}

fn vmstat_text(v: &VmStat) -> String {
    let fields = [
        ("pswpin", v.pswpin),
        ("pswpout", v.pswpout),
        ("pgmajfault", v.pgmajfault),
        ("pgfault", v.pgfault),
        ("workingset_refault_anon", v.workingset_refault_anon),
        ("workingset_refault_file", v.workingset_refault_file),
        ("oom_kill", v.oom_kill),
        ("allocstall", v.allocstall),
    ];
    fields_text(&fields, " ")
}

/// `name`, `separator`, value: a line per field that has a value.
fn fields_text(fields: &[(&str, Option<u64>)], separator: &str) -> String {
    let mut text = String::new();
    for (name, value) in fields {
        if let Some(value) = value {
            let _ = writeln!(text, "{name}{separator}{value}");
        }
    }
    text
}

fn psi_text(psi: &Psi) -> String {
    let line = |kind: &str, l: &PsiLine| {
        format!(
            "{kind} avg10={} avg60={} avg300={} total={}\n",
            l.avg10, l.avg60, l.avg300, l.total_us
        )
    };
    let mut text = line("some", &psi.some);
    if let Some(full) = &psi.full {
        text += &line("full", full);
    }
    text
}
