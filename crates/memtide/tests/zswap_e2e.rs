//! The compressed tier on a real kernel (#12's compressed-tier target): proactive
//! reclaim into zswap against no reclaim and against the balloon alone, in one guest
//! boot. This host has cgroup v1 and no zswap, so a test guest boots
//! guest/build-idle-kernel.sh's kernel (zswap with lzo and zsmalloc, PSI, cgroup v2
//! memory) and plays the host: coldalloc stands in for a VM (a cold buffer written
//! once, a third of each page incompressible, and a hot one written over and over,
//! whose pages a second are the throughput) in a cgroup v2 of its own, and memtide's
//! own binary (`memtide reclaim --pid`, on a data disk) reclaims from it.
//!
//! The guest's clocks count its instructions ([`support::ICOUNT`]), so its rates do not follow
//! the host's load. A second coldalloc, the control, runs beside the VM on the same
//! vCPU in a cgroup of its own that nothing reclaims (its `memory.min` holds its memory
//! against the balloon's squeeze too), so that what the guest's vCPU spends on
//! reclaiming (the host's work, on a real host) is taken from both: each arm's
//! throughput is the VM's pages a second over the control's in the same seconds,
//! against that ratio with no reclaim (two windows of it, whose difference is the
//! noise; the median of the per-second ratios is printed beside the mean). The arms,
//! one after the other:
//!
//! - none: the VM's coldalloc all in memory;
//! - zswap: `memtide reclaim` with zswap on, then a steady window; the memory still
//!   used counts zswap's pool (`Zswap:` in /proc/meminfo: this kernel's slab cannot
//!   charge it to the cgroup);
//! - balloon: a fresh coldalloc with zswap off, its no-reclaim window again, then the
//!   guest's balloon inflated until the VM's cgroup is down to what the zswap arm kept,
//!   so the guest's own reclaim pushes it to the swap disk; then a steady window.
//!
//! It asserts what zswap did (the cold pages compressed in zswap's pool, not on the
//! swap disk; the hot set resident and never refaulted), never throughput, and prints
//! the figures docs/tiering.md and bench/results/tiering.json report.
//!
//! Boots a guest under TCG, so it is ignored by a plain `cargo test`; `scripts/test.sh`
//! runs it.

mod support;

use memtide_testbed::BALLOON;
use serde_json::json;
use std::thread::sleep;
use std::time::Duration;
use support::cgroup::TestCgroup;
use support::guest::Guest;
use support::harness::{Agent, Qmp};
use support::{field, reclaim_asked, wait_for};

const COLD_MIB: u64 = 96;
const HOT_MIB: u64 = 24;
/// A third of each cold page incompressible: lzo makes about 3 pages of 1.
const COLD_RANDOM_PCT: u64 = 33;
/// `[reclaim] floor_mib`: with the hot set given as the working set, reclaim never
/// takes the cgroup below HOT_MIB + FLOOR_MIB.
const FLOOR_MIB: u64 = 16;
const GUEST_MIB: u64 = 384;
/// Seconds of the guest's time measured in each steady window: 20 for the figures the
/// docs report (`MEMTIDE_ZSWAP_WINDOW_S=20`), 5 in CI, where only what zswap did is
/// asserted and the six windows would otherwise take two minutes of its time.
fn window_s() -> u64 {
    std::env::var("MEMTIDE_ZSWAP_WINDOW_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5)
}
const MIB: u64 = 1 << 20;
/// The VM's cgroup, and the control's.
const VM: &str = "/sys/fs/cgroup/vm";
const CTL: &str = "/sys/fs/cgroup/ctl";
const CTL_LOG: &str = "/tmp/ctl.log";

/// A `key=value` of a coldalloc report line.
fn value(line: &str, key: &str) -> Option<f64> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))?
        .parse()
        .ok()
}

/// coldalloc's `(t, mib_per_s)` report pairs.
fn rates(log: &str) -> Vec<(f64, f64)> {
    log.lines()
        .filter_map(|l| Some((value(l, "t")?, value(l, "mib_per_s")?)))
        .collect()
}

/// The rates of the reports after `from` seconds, within `span` seconds of it.
fn rates_after(log: &str, from: f64, span: f64) -> Vec<f64> {
    let rates: Vec<f64> = rates(log)
        .into_iter()
        .filter(|&(t, _)| t > from && t <= from + span)
        .map(|(_, r)| r)
        .collect();
    assert!(rates.len() >= 3, "{} reports after {from} s", rates.len());
    rates
}

/// The VM's and the control's rates over the same seconds.
#[derive(Debug, Clone, Copy)]
struct Window {
    /// The VM's mean rate.
    vm: f64,
    /// The control's.
    ctl: f64,
    /// The median of the VM's rate over the control's, report by report: a second out
    /// of the way weighs no more than any other.
    median: f64,
}

impl Window {
    fn new(vm: &[f64], ctl: &[f64]) -> Window {
        let mean = |r: &[f64]| r.iter().sum::<f64>() / r.len() as f64;
        let mut ratios: Vec<f64> = vm.iter().zip(ctl).map(|(v, c)| v / c).collect();
        ratios.sort_by(f64::total_cmp);
        Window {
            vm: mean(vm),
            ctl: mean(ctl),
            median: ratios[ratios.len() / 2],
        }
    }
}

/// The guest's view: files read through its agent.
struct View {
    agent: Agent,
}

impl View {
    fn meminfo(&mut self, name: &str) -> u64 {
        field(&self.agent.read_file("/proc/meminfo"), name, 1024)
    }

    /// Pages read from and written to the swap disk so far, from its block statistics
    /// (this kernel counts no `pswpin`/`pswpout`: no VM event counters).
    fn swap_disk(&mut self) -> (u64, u64) {
        let swaps = self.agent.read_file("/proc/swaps");
        let device = swaps
            .lines()
            .nth(1)
            .and_then(|l| l.split_whitespace().next()?.strip_prefix("/dev/"))
            .unwrap_or_else(|| panic!("no swap device in\n{swaps}"))
            .to_string();
        let stat = self.agent.read_file(&format!("/sys/block/{device}/stat"));
        let sectors: Vec<u64> = stat
            .split_whitespace()
            .map(|n| n.parse().unwrap())
            .collect();
        // Documentation/block/stat.rst: sectors read are the 3rd field, written the 7th.
        (sectors[2] / 8, sectors[6] / 8)
    }

    fn usage(&mut self, cgroup: &str) -> u64 {
        self.agent
            .read_file(&format!("{cgroup}/memory.current"))
            .trim()
            .parse()
            .unwrap()
    }

    fn refaulted(&mut self) -> u64 {
        let stat = self.agent.read_file(&format!("{VM}/memory.stat"));
        field(&stat, "workingset_refault_anon", 4096)
    }

    fn sh(&mut self, script: &str) {
        assert_eq!(
            self.agent.run_sh(script, Duration::from_secs(120)),
            0,
            "{script}"
        );
    }

    /// The latest report time of coldalloc's log at `log`.
    fn latest_t(&mut self, log: &str) -> f64 {
        rates(&self.agent.read_file(log))
            .last()
            .map_or(0.0, |r| r.0)
    }

    /// Start coldalloc in `cgroup`, logging to `log`, and wait until its buffers are
    /// written and it has reported for 3 s; its pid. It never measures its cold
    /// buffer's residency: `mincore(2)` looks up each page swapped out, which took 3%
    /// of the vCPU from both coldallocs once zswap held the VM's cold buffer (1.9% once
    /// the balloon had pushed it to the disk).
    fn start_coldalloc(&mut self, cgroup: &str, log: &str) -> u64 {
        let pid = self.agent.spawn_sh(&format!(
            "echo $$ > {cgroup}/cgroup.procs && exec /bin/coldalloc --cold-mib {COLD_MIB} \
             --hot-mib {HOT_MIB} --cold-random-pct {COLD_RANDOM_PCT} --interval-s 1 \
             --resident-every 0 > {log} 2>&1"
        ));
        let started = format!("test -e {log}");
        wait_for(Duration::from_secs(120), || {
            (self.agent.run_sh(&started, Duration::from_secs(10)) == 0 && self.latest_t(log) >= 3.0)
                .then_some(())
        })
        .unwrap_or_else(|| panic!("coldalloc did not run:\n{}", self.agent.read_file(log)));
        pid
    }

    /// Where the VM's coldalloc (logging to `log`) and the control have reported to.
    fn mark(&mut self, log: &str) -> (f64, f64) {
        (self.latest_t(log), self.latest_t(CTL_LOG))
    }

    /// Wait until the VM's coldalloc and the control have each reported `w` seconds past
    /// `mark`.
    fn wait_past(&mut self, log: &str, mark: (f64, f64), w: f64) {
        wait_for(Duration::from_secs(30 * window_s()), || {
            sleep(Duration::from_secs(1));
            (self.latest_t(log) >= mark.0 + w && self.latest_t(CTL_LOG) >= mark.1 + w).then_some(())
        })
        .unwrap_or_else(|| {
            panic!(
                "coldalloc stopped reporting:\n{}",
                self.agent.read_file(log)
            )
        });
    }

    /// The VM's rates and the control's since `mark`, within `span` seconds of it (once
    /// both have reported that far), and over 3 s at least: what happened since may
    /// have taken less than three reports.
    fn rates_since(&mut self, log: &str, mark: (f64, f64), span: f64) -> Window {
        let past = if span.is_finite() { span.max(3.0) } else { 3.0 };
        self.wait_past(log, mark, past);
        Window::new(
            &rates_after(&self.agent.read_file(log), mark.0, span),
            &rates_after(&self.agent.read_file(CTL_LOG), mark.1, span),
        )
    }

    /// The VM's rates and the control's over the next [`window_s`] seconds of the
    /// guest's time.
    fn window(&mut self, log: &str) -> Window {
        let mark = self.mark(log);
        self.rates_since(log, mark, window_s() as f64)
    }
}

/// The VM's mean rate over the control's.
fn over(w: Window) -> f64 {
    w.vm / w.ctl
}

fn mib(bytes: u64) -> f64 {
    (bytes as f64 / MIB as f64 * 10.0).round() / 10.0
}

fn ratio(a: f64, b: f64) -> f64 {
    (a / b * 10_000.0).round() / 10_000.0
}

#[test]
#[ignore = "boots a real QEMU guest; run by scripts/test.sh"]
fn zswap_takes_the_cold_pages_and_keeps_the_hot_set_against_no_reclaim_and_the_balloon() {
    let kernel = support::idle_kernel();
    let dir = tempfile::tempdir().unwrap();
    let config = format!("[reclaim]\nstep_pct_per_s = 10\nfloor_mib = {FLOOR_MIB}\n");
    let image = support::data_disk(dir.path(), &config);
    let cgroup = TestCgroup::create("memtide-zswap");
    let drive = support::data_drive(&image);
    let devices = [
        "-drive",
        &drive,
        "-device",
        support::DATA_DEVICE,
        "-device",
        BALLOON,
        support::ICOUNT[0],
        support::ICOUNT[1],
    ];
    let mut guest = Guest::boot_kernel(
        "z",
        dir.path(),
        &cgroup.procs(),
        &kernel,
        GUEST_MIB,
        &devices,
        "",
    );
    guest.wait_console("memtide-guest: ready", 1, Duration::from_secs(180));
    assert!(guest.console().contains("swap on"), "{}", guest.console());
    let mut qmp = Qmp::connect(guest.qmp());
    let mut g = View {
        agent: Agent::connect(guest.agent()),
    };
    g.sh(&format!(
        "mount -t cgroup2 none /sys/fs/cgroup && \
         echo +memory > /sys/fs/cgroup/cgroup.subtree_control && mkdir {VM} {CTL} && \
         echo 1 > /sys/module/zswap/parameters/enabled && \
         grep -qx Y /sys/module/zswap/parameters/enabled && \
         test -e {VM}/memory.reclaim && test -e {VM}/memory.pressure"
    ));
    let zswap_params = g
        .agent
        .read_file("/sys/module/zswap/parameters/compressor")
        .trim()
        .to_string()
        + "/"
        + g.agent
            .read_file("/sys/module/zswap/parameters/zpool")
            .trim();
    g.start_coldalloc(CTL, CTL_LOG);
    let ctl_usage = g.usage(CTL);
    g.sh(&format!("echo {ctl_usage} > {CTL}/memory.min"));

    // Arm none: all of the VM's coldalloc in memory.
    let log_a = "/tmp/vm-a.log";
    let pid = g.start_coldalloc(VM, log_a);
    // Two windows: how far the ratio moves with nothing changed is the noise.
    let (none_1, none_2) = (g.window(log_a), g.window(log_a));
    let none = (over(none_1) + over(none_2)) / 2.0;
    let none_median = (none_1.median + none_2.median) / 2.0;
    let usage_none = g.usage(VM);

    // Arm zswap: memtide reclaims; the cold pages go to zswap.
    let ((_, out_before), refaulted_before) = (g.swap_disk(), g.refaulted());
    let mark = g.mark(log_a);
    let memtide = support::GUEST_MEMTIDE;
    let run = format!(
        "{memtide} reclaim --config /data/memtide.toml --pid {pid} --working-set-mib {HOT_MIB} \
         --interval-s 1 --ticks 40 > /tmp/reclaim.log 2>&1"
    );
    let status = g.agent.run_sh(&run, Duration::from_secs(240));
    let log = g.agent.read_file("/tmp/reclaim.log");
    eprintln!("{log}");
    assert_eq!(status, 0, "memtide reclaim: {log}");
    let asked = reclaim_asked(&log);
    let reclaiming = g.rates_since(log_a, mark, f64::INFINITY);
    let zswap = g.window(log_a);
    let usage_zswap = g.usage(VM);
    let (pool, zswapped) = (g.meminfo("Zswap:"), g.meminfo("Zswapped:"));
    let disk_out = (g.swap_disk().1 - out_before) * 4096;
    let refaulted = g.refaulted() - refaulted_before;
    let status = g.agent.read_file(&format!("/proc/{pid}/status"));
    let anon = field(&status, "RssAnon:", 1024);
    let kept = usage_zswap + pool;
    eprintln!(
        "none: {:.4} and {:.4} of the control's rate, usage {} MiB; zswap: asked {} MiB, {:.4} \
         while reclaiming, then {:.4}, usage {} MiB + pool {} MiB holding {} MiB ({zswap_params}), \
         {} MiB to the swap disk, RssAnon {} MiB, {} KiB \
         refaulted",
        over(none_1),
        over(none_2),
        mib(usage_none),
        mib(asked),
        over(reclaiming),
        over(zswap),
        mib(usage_zswap),
        mib(pool),
        mib(zswapped),
        mib(disk_out),
        mib(anon),
        refaulted >> 10
    );
    assert!(
        zswapped >= COLD_MIB * MIB / 2,
        "at least half the cold buffer in zswap: {} MiB",
        mib(zswapped)
    );
    assert!(
        pool * 2 <= zswapped,
        "compressed at least 2 to 1: pool {} MiB for {} MiB",
        mib(pool),
        mib(zswapped)
    );
    assert!(
        disk_out * 4 <= zswapped,
        "zswap took the pages, not the swap disk: {} MiB written to it",
        mib(disk_out)
    );
    assert!(
        anon >= (HOT_MIB - 1) * MIB,
        "the hot buffer stays resident: RssAnon {} MiB",
        mib(anon)
    );
    assert!(
        anon <= (HOT_MIB + COLD_MIB / 2) * MIB,
        "at most half the cold buffer resident beside the hot one: RssAnon {} MiB",
        mib(anon)
    );
    assert!(
        refaulted <= 2 * MIB,
        "the hot buffer was not pushed out: {} KiB refaulted",
        refaulted >> 10
    );

    // Arm balloon: a fresh coldalloc with zswap off; the balloon squeezes the guest
    // until the VM's cgroup holds what the zswap arm kept.
    g.sh(&format!(
        "kill {pid} && echo 0 > /sys/module/zswap/parameters/enabled"
    ));
    wait_for(Duration::from_secs(60), || {
        (g.usage(VM) < 8 * MIB && g.meminfo("Zswapped:") < MIB).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "the first coldalloc's memory and zswap's pool not freed: usage {} MiB, {} MiB \
             in zswap",
            mib(g.usage(VM)),
            mib(g.meminfo("Zswapped:")),
        )
    });
    // A few pages in zswap outlive coldalloc (swap cache of pages it shared).
    let zswapped_left = g.meminfo("Zswapped:");
    let log_c = "/tmp/vm-c.log";
    let pid = g.start_coldalloc(VM, log_c);
    let (again_1, again_2) = (g.window(log_c), g.window(log_c));
    let none_again = (over(again_1) + over(again_2)) / 2.0;
    let again_median = (again_1.median + again_2.median) / 2.0;
    let usage_none_again = g.usage(VM);
    let ((in_before, out_before), refaulted_before) = (g.swap_disk(), g.refaulted());
    let mark = g.mark(log_c);
    let actual = |qmp: &mut Qmp| (qmp.balloon_mib().unwrap() * MIB as f64) as u64;
    let mut excess = g.usage(VM).saturating_sub(kept);
    for _ in 0..6 {
        if excess <= 2 * MIB {
            break;
        }
        let spare = g.meminfo("MemFree:").saturating_sub(8 * MIB);
        let target = actual(&mut qmp).saturating_sub(excess + spare);
        qmp.execute("balloon", Some(json!({ "value": target })))
            .unwrap();
        // Settled: the balloon at its target, or no longer moving.
        let mut last = 0;
        wait_for(Duration::from_secs(90), || {
            sleep(Duration::from_secs(2));
            let now = actual(&mut qmp);
            let settled = now <= target + MIB || now == last;
            last = now;
            settled.then_some(())
        });
        excess = g.usage(VM).saturating_sub(kept);
    }
    let squeezing = g.rates_since(log_c, mark, f64::INFINITY);
    let balloon = GUEST_MIB * MIB - actual(&mut qmp);
    let (in_now, out_now) = g.swap_disk();
    let (in_squeeze, out_squeeze) = (in_now - in_before, out_now - out_before);
    sleep(Duration::from_secs(3));
    let in_before = g.swap_disk().0;
    let ballooned = g.window(log_c);
    let usage_balloon = g.usage(VM);
    let in_steady = g.swap_disk().0 - in_before;
    let refaulted_balloon = g.refaulted() - refaulted_before;
    let status = g.agent.read_file(&format!("/proc/{pid}/status"));
    let anon_balloon = field(&status, "RssAnon:", 1024);
    let ctl_usage_end = g.usage(CTL);
    eprintln!(
        "balloon: none again {:.4} and {:.4}, usage {} MiB; balloon {} MiB, {:.4} while squeezing \
         ({in_squeeze} pages swapped in, {out_squeeze} out), then {:.4} ({in_steady} swapped \
         in), usage {} MiB, RssAnon {} MiB, {} KiB refaulted; control {} -> {} MiB",
        over(again_1),
        over(again_2),
        mib(usage_none_again),
        mib(balloon),
        over(squeezing),
        over(ballooned),
        mib(usage_balloon),
        mib(anon_balloon),
        refaulted_balloon >> 10,
        mib(ctl_usage),
        mib(ctl_usage_end),
    );
    assert!(
        excess <= 2 * MIB,
        "the balloon squeezed the VM to within 2 MiB of what the zswap arm kept ({} MiB): \
         {} MiB over after its last round",
        mib(kept),
        mib(excess)
    );
    assert!(balloon > 0, "the balloon took nothing from the guest");
    assert!(
        out_squeeze > 0,
        "the squeeze sent no pages to the swap disk ({in_squeeze} swapped in)"
    );
    assert!(
        g.meminfo("Zswapped:") <= zswapped_left,
        "the balloon arm put nothing in zswap"
    );

    let saved = |before: u64, after: u64| ratio((before - after.min(before)) as f64, before as f64);
    let figures = json!({
        "memory_saved_share": saved(usage_none, kept),
        "throughput_ratio": ratio(over(zswap), none),
        "throughput_ratio_while_reclaiming": ratio(over(reclaiming), none),
        "throughput_ratio_median": ratio(zswap.median, none_median),
        "no_reclaim": {
            "usage_mib": mib(usage_none),
            "mib_per_s": none_2.vm,
            "control_mib_per_s": none_2.ctl,
            "second_window_ratio": ratio(over(none_2), over(none_1)),
            "second_window_ratio_median": ratio(none_2.median, none_1.median),
        },
        "zswap": {
            "usage_mib": mib(usage_zswap),
            "pool_mib": mib(pool),
            "zswapped_mib": mib(zswapped),
            "asked_mib": mib(asked),
            "swap_disk_out_mib": mib(disk_out),
            "refaulted_kib": refaulted >> 10,
            "mib_per_s": zswap.vm,
            "control_mib_per_s": zswap.ctl,
        },
        "balloon": {
            "no_reclaim_usage_mib": mib(usage_none_again),
            "no_reclaim_mib_per_s": again_2.vm,
            "no_reclaim_control_mib_per_s": again_2.ctl,
            "mib_per_s": ballooned.vm,
            "control_mib_per_s": ballooned.ctl,
            "balloon_mib": mib(balloon),
            "usage_mib": mib(usage_balloon),
            "memory_saved_share": saved(usage_none_again, usage_balloon),
            "no_reclaim_second_window_ratio": ratio(over(again_2), over(again_1)),
            "no_reclaim_second_window_ratio_median": ratio(again_2.median, again_1.median),
            "throughput_ratio_median": ratio(ballooned.median, again_median),
            "throughput_ratio": ratio(over(ballooned), none_again),
            "throughput_ratio_while_squeezing": ratio(over(squeezing), none_again),
            "swap_ins_while_squeezing": in_squeeze,
            "swap_outs_while_squeezing": out_squeeze,
            "swap_ins_steady": in_steady,
            "refaulted_kib": refaulted_balloon >> 10,
        },
    });
    eprintln!("figures ({} s windows): {figures}", window_s());
}
