//! End to end: a real guest without swap keeps all it holds while the host's memory is
//! ample (rule `memtide.no_swap`), and one swapping to zram keeps room for what its swap
//! would keep of its RAM (rule `memtide.zram`), where the same idle guest with swap on a
//! disk is ballooned down to what it uses. Their agent (Debian's qemu-ga) reads the
//! guest's own /proc/meminfo (`SwapTotal: 0 kB`), /proc/swaps and zram's `mm_stat`.
//!
//! Boots three guests under TCG (about a minute), so ignored by a plain `cargo test`;
//! `scripts/test.sh` builds the guest and runs it.

mod support;

use std::time::Duration;
use support::cgroup::TestCgroup;
use support::daemon::{actual_mib, ample_config, mib, vm, Daemon};
use support::guest::Guest;

const GUEST_MIB: u64 = 384;
/// The zram guest's swap: while zram stores too little to tell its ratio, half of each
/// page is assumed to stay, so it keeps 96 MiB beside its estimate.
const ZRAM_MIB: u64 = 192;

#[test]
#[ignore = "boots QEMU guests; run by scripts/test.sh"]
fn idle_guests_whose_swap_cannot_take_a_burst_keep_room_while_memory_is_ample() {
    let dir = tempfile::tempdir().unwrap();
    let cgroup = TestCgroup::create("memtide-no-swap");
    let procs = cgroup.procs();
    let mut swapping = Guest::boot("swap", dir.path(), &procs, GUEST_MIB, "", "");
    let mut swapless = Guest::boot_without_swap("noswap", dir.path(), &procs, GUEST_MIB);
    let mut zram = Guest::boot_with_zram("zram", dir.path(), &procs, GUEST_MIB, ZRAM_MIB);
    swapping.wait_console("memtide-guest: ready", 1, Duration::from_secs(120));
    swapless.wait_console("memtide-guest: ready", 1, Duration::from_secs(120));
    zram.wait_console(
        &format!("memtide-guest: swap on /dev/zram0 ({ZRAM_MIB} MiB)"),
        1,
        Duration::from_secs(120),
    );
    zram.wait_console("memtide-guest: ready", 1, Duration::from_secs(120));

    let port = support::free_port();
    let config = ample_config(
        &cgroup.dir,
        "",
        &[
            ("swap", swapping.qmp(), swapping.agent()),
            ("noswap", swapless.qmp(), swapless.agent()),
            ("zram", zram.qmp(), zram.agent()),
        ],
    );
    let daemon = Daemon::start(dir.path(), &config, port);
    // The guest with swap gives back the free memory it does not use.
    let taken = daemon.wait_until(
        "the guest with swap ballooned below 80% of its size",
        Duration::from_secs(90),
        |s| actual_mib(s, "swap") < GUEST_MIB as f64 * 0.8,
    );
    let (with, without) = (vm(&taken, "swap").unwrap(), vm(&taken, "noswap").unwrap());
    eprintln!(
        "with swap: {:.0} MiB ({}); without: {:.0} MiB ({})",
        actual_mib(&taken, "swap"),
        with["reason"],
        actual_mib(&taken, "noswap"),
        without["reason"]
    );
    assert!(
        actual_mib(&taken, "noswap") >= GUEST_MIB as f64 - 1.0,
        "the guest without swap keeps all it holds: {without}"
    );
    assert_eq!(without["reason"]["rule"], "memtide.no_swap", "{without}");
    // Its estimate is still its working set, well below its size.
    let estimate = mib(without, "estimate").unwrap();
    assert!(estimate < GUEST_MIB as f64 * 0.8, "{without}");

    // The zram guest keeps, beside its estimate (or its minimum, where that is more), half
    // its free zram: 96 MiB.
    let settled = daemon.wait_until(
        "the zram guest at its estimate and room for its swap's copies",
        Duration::from_secs(90),
        |s| {
            vm(s, "zram").is_some_and(|z| {
                let below = mib(z, "estimate")
                    .zip(mib(z, "min"))
                    .map_or(f64::MAX, |(e, min)| e.max(min));
                let room = actual_mib(s, "zram") - below;
                z["reason"]["rule"] == "memtide.zram" && (room - 96.0).abs() < 4.0
            })
        },
    );
    let zram = vm(&settled, "zram").unwrap();
    eprintln!(
        "on zram: {:.0} MiB ({})",
        actual_mib(&settled, "zram"),
        zram["reason"]
    );
    assert!(
        actual_mib(&settled, "zram") < GUEST_MIB as f64 * 0.9,
        "the zram guest gives back the rest: {zram}"
    );
    // Its zram as its agent read it from the guest's own /proc/swaps (KiB, less a header
    // page) and mm_stat: nothing stored yet, so nothing taken.
    let free = zram["guest_zram"]["free"].as_u64().unwrap_or(0) as f64 / (1 << 20) as f64;
    assert!(
        (free - ZRAM_MIB as f64).abs() < 1.0,
        "free zram {free:.1} MiB: {zram}"
    );
    assert!(
        zram["guest_zram"]["stored"]
            .as_u64()
            .is_some_and(|b| b < 1 << 20),
        "{zram}"
    );
    assert!(
        vm(&settled, "swap").is_some_and(|v| v["guest_zram"].is_null()),
        "no zram on the disk-swap guest"
    );
}
