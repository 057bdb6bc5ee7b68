//! End to end on real components: two QEMU guests with the real virtio-balloon driver,
//! in a real memory cgroup that is the daemon's VM memory domain, managed by the real
//! daemon over QMP and observed through its control socket, HTTP endpoint and event log.
//!
//! These boot guests (about a minute under TCG), so they are ignored by a plain
//! `cargo test`; `scripts/test.sh` builds the guest and runs them.

mod support;

use serde_json::Value;
use std::time::{Duration, Instant};
use support::cgroup::TestCgroup;
use support::daemon::{actual_mib, mib, vm, Daemon};
use support::guest::Guest;
use support::harness::Qmp;

const GUEST_MIB: u64 = 384;
/// Anonymous memory each guest's workload keeps touching.
const WORKLOAD_MIB: u64 = 160;
const CALL_TIMEOUT_MS: f64 = 2000.0;

fn managed(status: &Value, name: &str) -> bool {
    vm(status, name).is_some_and(|v| v["state"] == "managed" && v["actual"].is_u64())
}

/// One observed decision: its tick number, time (s), whether `a` was sampled and managed,
/// whether `b` was marked stale, and how long the tick took (ms).
struct Seen {
    tick: u64,
    at: f64,
    a_managed: bool,
    b_stale: bool,
    tick_ms: f64,
}

#[test]
#[ignore = "boots real QEMU guests; run by scripts/test.sh"]
fn a_stopped_guest_delays_no_other_guests_decisions() {
    let dir = tempfile::tempdir().unwrap();
    let cgroup = TestCgroup::create("memtide-e2e-deadline");
    let boot = |name| {
        Guest::boot(
            name,
            dir.path(),
            &cgroup.procs(),
            GUEST_MIB,
            "memknobs",
            "32:100000",
        )
    };
    let (mut a, mut b) = (boot("a"), boot("b"));
    for g in [&mut a, &mut b] {
        g.wait_console("memtide-guest: ready", 1, Duration::from_secs(120));
    }
    let interval_s = 1.0;
    let config = format!(
        "interval_s = {interval_s}\npolicy = \"mom\"\n\
         [discovery]\nqmp_glob = []\n\
         [engine]\nksm_control = false\n\
         [[vm]]\nname = \"a\"\nqmp = {:?}\n\
         [[vm]]\nname = \"b\"\nqmp = {:?}\n",
        a.qmp().display().to_string(),
        b.qmp().display().to_string(),
    );
    let daemon = Daemon::start(dir.path(), &config, support::free_port());
    daemon.wait_until("both guests managed", Duration::from_secs(60), |s| {
        managed(s, "a") && managed(s, "b")
    });

    // b's QEMU stops: its monitor accepts bytes and never answers (then its connection
    // is dropped after the call timeout and retried in the background).
    b.signal("STOP");
    let start = Instant::now();
    let mut seen: Vec<Seen> = Vec::new();
    while start.elapsed() < Duration::from_secs(12) {
        let s = daemon.try_status().unwrap();
        let tick = s["counters"]["ticks"].as_u64().unwrap();
        if seen.last().is_none_or(|l| l.tick != tick) {
            let b_stale = s["sampling"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "b" && p["stale"] == true);
            seen.push(Seen {
                tick,
                at: s["decision"]["at"].as_f64().unwrap(),
                a_managed: managed(&s, "a"),
                b_stale,
                tick_ms: s["last_tick_ms"].as_f64().unwrap(),
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    b.signal("CONT");
    let spacing: Vec<f64> = seen
        .windows(2)
        .filter(|w| w[1].tick == w[0].tick + 1)
        .map(|w| w[1].at - w[0].at)
        .collect();
    let ticks_ms: Vec<f64> = seen.iter().map(|s| s.tick_ms).collect();
    eprintln!("decision spacing (s) with b stopped: {spacing:.3?}; ticks (ms): {ticks_ms:.0?}");
    assert!(
        seen.iter().any(|s| s.b_stale),
        "b is shown stale while stopped"
    );
    assert!(
        seen.iter().all(|s| s.a_managed),
        "a is decided on every tick"
    );
    assert!(
        spacing.len() >= 6,
        "enough consecutive decisions seen: {spacing:?}"
    );
    // The decision interval (the median spacing) within 10% of the configured one; no
    // single decision held back anywhere near the call timeout, as each tick waited for
    // the stopped monitor before (2 s). A loaded test machine may delay one tick's timer
    // a few hundred milliseconds (seen: 1.33 s once, with 4 TCG guests on 2 cores).
    let mut sorted = spacing.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    assert!(
        (median - interval_s).abs() <= 0.1 * interval_s,
        "a's decisions come every {interval_s} s within 10%: median {median}, {spacing:?}"
    );
    assert!(
        spacing.iter().all(|&d| d < 1.5 * interval_s),
        "no decision waited for the stopped guest: {spacing:?}"
    );
    assert!(
        ticks_ms.iter().all(|&t| t < 0.75 * interval_s * 1000.0),
        "no tick waits much beyond its sample deadline (half the interval): {ticks_ms:?}"
    );
    let log = daemon.event_log();
    assert!(
        log.iter().any(|e| e["vm"] == "b"
            && e["kind"] == "diagnostic"
            && e["message"]
                .as_str()
                .unwrap()
                .contains("not sampled: no answer within")),
        "b's late sample is reported"
    );
    daemon.wait_until(
        "a resumed guest is managed again",
        Duration::from_secs(30),
        |s| managed(s, "b"),
    );

    // Paused by its monitor (QEMU answers, the guest does not run): busy, left alone,
    // not taken for a guest whose driver or agent broke; managed again once it runs.
    let mut qmp = Qmp::connect(b.harness_qmp());
    qmp.execute("stop", None).unwrap();
    let busy = |s: &Value| vm(s, "b").is_some_and(|v| v["state"] == "busy");
    daemon.wait_until("a paused guest shown busy", Duration::from_secs(10), busy);
    qmp.execute("cont", None).unwrap();
    daemon.wait_until(
        "a guest running again managed",
        Duration::from_secs(10),
        |s| managed(s, "b"),
    );
    let log = daemon.event_log();
    let about_b = |kind: &str| {
        log.iter()
            .filter(|e| e["vm"] == "b" && e["kind"] == kind)
            .map(|e| e["rule"].as_str().unwrap_or_default().to_string())
            .collect::<Vec<_>>()
    };
    assert!(
        about_b("diagnostic").contains(&"busy".to_string()),
        "{:?}",
        about_b("diagnostic")
    );
}

#[test]
#[ignore = "boots real QEMU guests; run by scripts/test.sh"]
fn two_guests_in_a_cgroup_domain() {
    let dir = tempfile::tempdir().unwrap();
    let cgroup = TestCgroup::create("memtide-e2e");
    let args = format!("{WORKLOAD_MIB}:100000");
    let mut a = Guest::boot(
        "a",
        dir.path(),
        &cgroup.procs(),
        GUEST_MIB,
        "memknobs",
        &args,
    );
    let mut b = Guest::boot(
        "b",
        dir.path(),
        &cgroup.procs(),
        GUEST_MIB,
        "memknobs",
        &args,
    );
    for g in [&mut a, &mut b] {
        g.wait_console("memtide-guest: ready", 1, Duration::from_secs(120));
        // Two reports: the first pass over the buffer is done, the workload is steady.
        g.wait_console("mib_per_s=", 2, Duration::from_secs(120));
    }

    let port = support::free_port();
    // mom evaluating every second on the daemon's samples, not every 10 s on its own
    // every 5 s as MOM does: this test follows the daemon's work, not MOM's pace.
    let config = format!(
        "interval_s = 1\npolicy = \"mom\"\n\
         [host]\ndomain_cgroup = {:?}\n\
         [discovery]\nqmp_glob = []\n\
         [engine]\nksm_control = false\nsettle_s = 20\n\
         [mom]\ninterval_s = 1\nsample_interval_s = 0\n\
         [[vm]]\nname = \"a\"\nqmp = {:?}\nagent = {:?}\n\
         [[vm]]\nname = \"b\"\nqmp = {:?}\n",
        cgroup.dir.display().to_string(),
        a.qmp().display().to_string(),
        a.agent().display().to_string(),
        b.qmp().display().to_string(),
    );
    let daemon = Daemon::start(dir.path(), &config, port);
    let both = daemon.wait_until(
        "both guests managed with guest stats",
        Duration::from_secs(60),
        |s| {
            ["a", "b"]
                .iter()
                .all(|n| managed(s, n) && vm(s, n).unwrap()["guest_free"].is_u64())
                && vm(s, "a").unwrap()["committed_as"].is_u64()
        },
    );
    // a's figures come from its guest agent (Debian's qemu-ga reading the guest's /proc);
    // b has no agent configured and is managed from balloon statistics alone.
    let committed = mib(vm(&both, "a").unwrap(), "committed_as").unwrap();
    assert!(
        committed > WORKLOAD_MIB as f64,
        "Committed_AS {committed} MiB covers the workload"
    );
    assert!(vm(&both, "b").unwrap()["committed_as"].is_null());
    assert_eq!(
        actual_mib(&both, "a"),
        GUEST_MIB as f64,
        "no pressure yet: full size"
    );
    let domain = &both["decision"]["host"]["scope"];
    assert_eq!(domain["kind"], "cgroup", "{domain}");

    // Pressure: a limit leaving the domain about 10% freeable (MOM acts below 20%),
    // well above the guests' needs so that the kernel never OOM-kills QEMU.
    let usage = cgroup.usage();
    let cache = cgroup.file_cache();
    let limit = ((usage - cache) as f64 / 0.90) as u64;
    eprintln!(
        "domain usage {} MiB (file cache {} MiB): limit {} MiB",
        usage >> 20,
        cache >> 20,
        limit >> 20
    );
    cgroup.set_limit(limit);
    let shrunk = daemon.wait_until(
        "balloons shrink under pressure",
        Duration::from_secs(90),
        |s| {
            ["a", "b"]
                .iter()
                .all(|n| actual_mib(s, n) < GUEST_MIB as f64 * 0.90)
        },
    );
    for n in ["a", "b"] {
        let v = vm(&shrunk, n).unwrap();
        let (actual, target) = (mib(v, "actual").unwrap(), mib(v, "target").unwrap());
        assert!(
            (actual - target).abs() <= target * 0.05 + 2.0,
            "{n}: QEMU's actual {actual} follows target {target}"
        );
        assert!(
            actual > WORKLOAD_MIB as f64,
            "{n}: never below the working set under moderate pressure"
        );
    }
    let shrinks: Vec<_> = daemon
        .event_log()
        .into_iter()
        .filter(|e| e["kind"] == "action" && e["rule"] == "mom.shrink")
        .collect();
    assert!(
        shrinks.len() >= 2,
        "shrink actions are logged with their rule"
    );
    let message = shrinks[0]["message"].as_str().unwrap();
    assert!(
        message.contains("balloon target") && message.contains("host free"),
        "{message}"
    );
    // Each says exactly which size it moved the guest from and to: shrinks, down.
    let sizes: Vec<(u64, u64)> = shrinks
        .iter()
        .map(
            |e| match (e["target_bytes"].as_u64(), e["actual_bytes"].as_u64()) {
                (Some(target), Some(actual)) => (target, actual),
                _ => panic!("no sizes: {e}"),
            },
        )
        .collect();
    assert!(
        sizes.iter().any(|(target, actual)| target < actual),
        "{sizes:?}"
    );
    let metrics = support::http_get(port, "/metrics");
    assert!(
        metrics.contains("memtide_vm_actual_bytes{vm=\"a\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("memtide_actions_total{kind=\"balloon\",result=\"ok\"}"),
        "{metrics}"
    );
    // The live metrics follow Prometheus's conventions, and a's guest agent figures
    // arrive as counters.
    support::promtool_check_metrics(&metrics);
    for family in [
        "memtide_vm_info{vm=\"a\",connector=\"qmp\",policy=\"mom\",state=\"managed\",\
         min_from=\"default\",max_from=\"size\"} 1",
        "memtide_vm_refaults_total{vm=\"a\"}",
        "memtide_vm_swapped_in_bytes_total{vm=\"b\"}",
        "memtide_tick_duration_seconds_count",
    ] {
        assert!(metrics.contains(family), "{family} in {metrics}");
    }
    let api: Value = serde_json::from_str(&support::http_get(port, "/api/v1/status")).unwrap();
    assert!(api["decision"]["vms"].as_array().unwrap().len() == 2);
    assert!(
        a.console().contains("mib_per_s="),
        "the workload kept running"
    );

    // Pressure ends: the balloons grow back to full size.
    cgroup.set_limit(limit * 4);
    daemon.wait_until(
        "balloons grow back when pressure ends",
        Duration::from_secs(90),
        |s| {
            ["a", "b"]
                .iter()
                .all(|n| actual_mib(s, n) >= GUEST_MIB as f64 - 1.0)
        },
    );

    // A hung monitor (SIGSTOP) times out without holding up the other VM; its connection
    // is dropped (half a command may sit in the socket) and re-established later.
    b.signal("STOP");
    daemon.wait_until(
        "a stopped QEMU's connection is dropped",
        Duration::from_secs(30),
        |s| {
            vm(s, "b").is_none()
                && s["waiting"]
                    .as_array()
                    .is_some_and(|w| w.iter().any(|w| w["name"] == "b"))
        },
    );
    let log = daemon.event_log();
    let b_said = |kind: &str, text: &str| {
        log.iter().any(|e| {
            e["vm"] == "b" && e["kind"] == kind && e["message"].as_str().unwrap().contains(text)
        })
    };
    assert!(
        b_said("diagnostic", "not sampled: no answer within"),
        "the timeout is reported"
    );
    assert!(
        b_said("vm_lost", "QEMU did not answer a call in time"),
        "then the connection is dropped"
    );
    assert!(
        b_said("vm_lost", "still runs"),
        "its process is said to run on"
    );
    let start = Instant::now();
    let mut ticks = Vec::new();
    while start.elapsed() < Duration::from_secs(8) {
        let s = daemon.try_status().unwrap();
        assert!(
            managed(&s, "a"),
            "a is still sampled and managed while b hangs: {}",
            vm(&s, "a").map_or("not listed".into(), |v| format!(
                "{} ({})",
                v["state"], v["reason"]
            ))
        );
        ticks.push(s["last_tick_ms"].as_f64().unwrap());
        std::thread::sleep(Duration::from_millis(700));
    }
    let slowest = ticks.iter().copied().fold(0.0, f64::max);
    assert!(
        slowest <= CALL_TIMEOUT_MS + 1000.0,
        "ticks take at most the call timeout: {ticks:?}"
    );
    b.signal("CONT");
    daemon.wait_until(
        "a resumed QEMU is managed again",
        Duration::from_secs(30),
        |s| managed(s, "b"),
    );

    // A killed QEMU disappears from status; the other VM carries on.
    let a_pid = a.pid();
    support::signal(a_pid, "KILL");
    let after = daemon.wait_until("a killed VM disappears", Duration::from_secs(30), |s| {
        vm(s, "a").is_none() && managed(s, "b")
    });
    let waiting = after["waiting"].as_array().unwrap();
    assert!(
        waiting.iter().any(|w| w["name"] == "a"),
        "a configured VM that is down is listed as waiting"
    );
    let lost = daemon
        .event_log()
        .into_iter()
        .any(|e| e["kind"] == "vm_lost" && e["vm"] == "a");
    assert!(lost, "the loss is in the event log");
    daemon.wait_until("b keeps being sampled", Duration::from_secs(10), |s| {
        let ticks_now = s["counters"]["ticks"].as_u64().unwrap();
        ticks_now > after["counters"]["ticks"].as_u64().unwrap() + 2 && managed(s, "b")
    });
    assert!(b.running(), "b survived everything");
    let rss = std::fs::read_to_string(format!("/proc/{}/status", daemon.pid())).unwrap();
    eprintln!(
        "daemon {}",
        rss.lines().find(|l| l.starts_with("VmRSS")).unwrap()
    );
    drop(a);
}
