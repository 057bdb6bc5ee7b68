//! Host-side access tracking by idle page tracking on a real kernel (#12 item 2). This
//! host's kernel has no idle page tracking, nor has any of Debian's kernel packages, so
//! a test guest boots a kernel built with it (guest/build-idle-kernel.sh) and runs a
//! process standing in for QEMU — coldalloc: a cold buffer written once, a hot one
//! written over and over — and memtide's own binary (`memtide access`, the tracker the
//! daemon runs on a VM's guest RAM) tracks it. The binary and the libraries it links
//! reach the guest on a data disk.
//!
//! Boots a guest under TCG, so it is ignored by a plain `cargo test`; `scripts/test.sh`
//! runs it.

mod support;

use std::time::Duration;
use support::cgroup::TestCgroup;
use support::guest::Guest;

const COLD_MIB: u64 = 96;
const HOT_MIB: u64 = 16;
const COLD_AGE_S: u64 = 20;
const INTERVAL_S: u64 = 5;
const SCANS: u64 = 9;
const MIB: u64 = 1 << 20;

#[test]
#[ignore = "boots a real QEMU guest; run by scripts/test.sh"]
fn idle_page_tracking_finds_the_cold_buffer_cold_and_the_hot_one_accessed() {
    let kernel = support::idle_kernel();
    let dir = tempfile::tempdir().unwrap();
    let cgroup = TestCgroup::create("memtide-access");
    let (_guest, mut agent) = support::guest_with_memtide("a", dir.path(), &cgroup, &kernel, "");
    assert_eq!(
        agent.run_sh(
            "test -e /sys/kernel/mm/page_idle/bitmap",
            Duration::from_secs(10)
        ),
        0,
        "the guest kernel has idle page tracking"
    );
    // The kernel leaves transparent huge pages off below 512 MiB of RAM
    // (mm/huge_memory.c); guest RAM on a host is mostly huge pages: turn them on here.
    let thp = "echo always > /sys/kernel/mm/transparent_hugepage/enabled";
    assert_eq!(agent.run_sh(thp, Duration::from_secs(10)), 0, "{thp}");
    let pid = support::coldalloc(&mut agent, COLD_MIB, HOT_MIB);
    // The kernel keeps a huge page's idle flag on its head page only, which the tracker
    // must follow: coldalloc's buffers are mostly huge pages.
    let rollup = agent.read_file(&format!("/proc/{pid}/smaps_rollup"));
    let huge_kib: u64 = rollup
        .lines()
        .find_map(|l| l.strip_prefix("AnonHugePages:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no AnonHugePages in {rollup}"));
    eprintln!("coldalloc's huge pages: {} MiB", huge_kib >> 10);
    assert!(
        huge_kib >= COLD_MIB / 2 * 1024,
        "the cold buffer is mostly huge pages: {huge_kib} KiB"
    );
    let args = format!("--pid {pid} --cold-age-s {COLD_AGE_S} --interval-s {INTERVAL_S}");
    let scans = support::coldalloc_access(&mut agent, &args, SCANS, COLD_MIB + HOT_MIB);
    let mut cold_seen = 0;
    for (n, scan) in scans.iter().enumerate() {
        assert_eq!(scan.tracker, "idle", "scan {n}: no DAMON in this kernel");
        let (t, resident) = (scan.t, scan.resident);
        if let Some(accessed) = scan.accessed {
            // The hot loop writes every hot page many times a scan. Beyond it: the
            // reporting thread's stack and heap, and where the two buffers' mappings
            // meet, one huge page of the cold buffer sharing a huge page with the hot one
            // (2 MiB).
            assert!(
                (HOT_MIB as f64..=HOT_MIB as f64 + 4.0).contains(&accessed),
                "scan {n}: {accessed} MiB accessed, the hot buffer is {HOT_MIB} MiB"
            );
        }
        let cold = scan.cold;
        // The scans span the cold age from the scan COLD_AGE_S after the first (the
        // interval is a little longer than asked: a scan takes time).
        if t < COLD_AGE_S as f64 {
            assert_eq!(cold, None, "scan {n} at {t} s is before the cold age");
            continue;
        }
        let cold = cold.unwrap_or_else(|| panic!("scan {n} at {t} s: no cold figure"));
        cold_seen += 1;
        // The cold buffer, less the huge page it may share with the hot one; beyond it,
        // static data written once and never again.
        assert!(
            ((COLD_MIB - 4) as f64..=COLD_MIB as f64 + 2.0).contains(&cold),
            "scan {n}: {cold} MiB cold, the cold buffer is {COLD_MIB} MiB"
        );
        assert!(
            resident - cold >= HOT_MIB as f64,
            "scan {n}: the hot buffer is never cold ({resident} MiB resident, {cold} cold)"
        );
    }
    assert!(
        cold_seen >= 3,
        "{cold_seen} scans past the cold age:\n{scans:?}"
    );
}

/// The daemon's side, on this host: a QEMU guest under TCG, its samples recorded. With a
/// file standing in for the kernel's idle bitmap (this host has none; the file keeps
/// every mark, as if nothing were touched again), the daemon tracks QEMU's real guest
/// RAM through pagemap and kpageflags: after the cold age the guest memory QEMU holds is
/// cold, and only pages newly backed count as referenced. Without the bitmap, or DAMON,
/// it says so once and samples by clear_refs as before: referenced, no cold. (A sysfs
/// of the test's own each time: the host's DAMON is never touched.)
#[test]
#[ignore = "boots a real QEMU guest; run by scripts/test.sh"]
fn the_daemon_fills_referenced_and_cold_from_idle_page_tracking_or_falls_back() {
    let dir = tempfile::tempdir().unwrap();
    let cgroup = TestCgroup::create("memtide-access-daemon");
    let mut guest = Guest::boot("d", dir.path(), &cgroup.procs(), 256, "", "");
    guest.wait_console("memtide-guest: ready", 1, Duration::from_secs(120));
    let run = |name: &str, sys: &std::path::Path, access: &str| {
        let rec = dir.path().join(format!("rec-{name}"));
        let config = format!(
            "interval_s = 1\npolicy = \"memtide\"\n\
             [host]\nsys = {:?}\nsample_access = {access}\ncold_age_s = 2\n\
             [daemon]\nsocket = {:?}\nevent_log = \"\"\nstate_file = \"\"\nhttp = \"\"\n\
             record_dir = {:?}\n[discovery]\nqmp_glob = []\n[engine]\nksm_control = false\n\
             [[vm]]\nname = \"d\"\nqmp = {:?}\n",
            sys,
            dir.path().join(format!("{name}.sock")),
            rec,
            guest.qmp(),
        );
        let path = dir.path().join(format!("{name}.toml"));
        std::fs::write(&path, config).unwrap();
        let (samples, log) = support::daemon::recorded_dry_run(&path, &rec, 6);
        assert!(samples.len() >= 4, "{} samples\n{log}", samples.len());
        (samples, log)
    };
    let mib = |b: Option<memtide_core::Bytes>| b.map(|b| b.0 as f64 / MIB as f64);

    // A sysfs with KSM's knobs and no idle page tracking or DAMON.
    let sys_of = |name: &str| {
        let sys = dir.path().join(name);
        std::fs::create_dir_all(sys.join("kernel/mm/ksm")).unwrap();
        for (knob, v) in [
            ("run", "0"),
            ("pages_to_scan", "100"),
            ("sleep_millisecs", "20"),
        ] {
            std::fs::write(sys.join("kernel/mm/ksm").join(knob), v).unwrap();
        }
        sys
    };
    // With a stand-in bitmap, sparse, a bit for every frame of up to 1 TiB.
    let sys = sys_of("sys");
    support::idle_bitmap_stand_in(&sys);
    let (samples, log) = run("idle", &sys, "\"idle\"");
    let held = std::fs::read_to_string(format!("/proc/{}/status", guest.pid())).unwrap();
    eprintln!(
        "idle: referenced {:?} MiB, cold {:?} MiB; QEMU {}",
        samples
            .iter()
            .map(|s| mib(s.referenced))
            .collect::<Vec<_>>(),
        samples.iter().map(|s| mib(s.cold)).collect::<Vec<_>>(),
        held.lines()
            .find(|l| l.starts_with("RssAnon"))
            .unwrap_or("")
    );
    assert!(!log.contains("no page tracking"), "{log}");
    assert!(log.contains("tracked by idle page tracking"), "{log}");
    for s in &samples {
        // Only pages backed since the previous scan are new to the tracker.
        let referenced = mib(s.referenced).expect("referenced every sample");
        assert!(referenced < 64.0, "{referenced} MiB referenced");
    }
    let last = samples.last().unwrap();
    let cold = mib(last.cold).expect("cold once the scans span 2 s");
    let rss = mib(last.rss).unwrap();
    // The guest RAM QEMU holds (its RSS less its own code and data), all of it cold.
    assert!(
        (16.0..=rss).contains(&cold),
        "{cold} MiB cold of QEMU's {rss} MiB resident"
    );

    // Neither: clear_refs, as before.
    let bare = sys_of("bare");
    let (samples, log) = run("fallback", &bare, "true");
    let said = format!(
        "no page tracking: {0}/kernel/mm/page_idle/bitmap is missing: the kernel has no idle \
         page tracking (CONFIG_IDLE_PAGE_TRACKING), and no DAMON: \
         {0}/kernel/mm/damon/admin/kdamonds is missing: the kernel has no DAMON sysfs \
         interface (CONFIG_DAMON_SYSFS, CONFIG_DAMON_VADDR); host-side access sampling falls \
         back to clear_refs",
        bare.display()
    );
    assert_eq!(log.matches(&said).count(), 1, "{log}");
    assert!(samples.iter().all(|s| s.cold.is_none()));
    assert!(
        samples.iter().skip(1).all(|s| s.referenced.is_some()),
        "clear_refs under TCG"
    );
}
