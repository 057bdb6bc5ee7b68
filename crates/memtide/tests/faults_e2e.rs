//! Fault injection on a real test guest (#16 item 5): the daemon, a separate process
//! managing the guest with memtide's policy on a short host (so that it moves the
//! balloon), goes through a guest reset during an inflation, the guest agent killed
//! inside the guest, QEMU killed while an inflation is under way, and the balloon driver
//! unloaded in the guest. Each test checks that the daemon did not exit, that the VM is
//! managed again (sampled, given a reason) within one backoff of its recovery, and that
//! the daemon's open descriptors did not grow across the fault.
//!
//! Each boots a guest under TCG, so they are ignored by a plain `cargo test`;
//! `scripts/test.sh` runs them.

mod support;

use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};
use support::cgroup::TestCgroup;
use support::daemon::{mib, probing_config, vm, Daemon};
use support::guest::Guest;
use support::harness::{Agent, Qmp};

const GUEST_MIB: u64 = 384;
/// The configuration's tick and call timeout ([`Daemon::start`]).
const TICK: Duration = Duration::from_secs(1);
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
const READY: &str = "memtide-guest: ready";

/// Boot guest `g` (a steady 120 MiB working set) with the test's own QMP socket.
fn boot(dir: &Path, cgroup: &TestCgroup) -> Guest {
    let mut guest = Guest::boot_watched(
        "g",
        dir,
        &cgroup.procs(),
        GUEST_MIB,
        "memknobs",
        "120:100000",
    );
    guest.wait_console(READY, 1, Duration::from_secs(120));
    guest
}

/// The guest's report when it is managed: sampled and given a reason.
fn managed(status: &Value) -> Option<&Value> {
    vm(status, "g").filter(|v| v["state"] == "managed" && v["reason"]["rule"].is_string())
}

/// The rule behind the guest's latest decision, when managed.
fn rule(status: &Value) -> Option<&str> {
    managed(status)?["reason"]["rule"].as_str()
}

/// Wait until the daemon has asked for a smaller balloon than the guest has.
fn inflating(daemon: &Daemon) -> f64 {
    let s = daemon.wait_until("an inflation under way", Duration::from_secs(60), |s| {
        managed(s).is_some_and(
            |v| matches!((mib(v, "target"), mib(v, "actual")), (Some(t), Some(a)) if t + 4.0 < a),
        )
    });
    mib(managed(&s).unwrap(), "target").unwrap()
}

/// The longest a VM may wait to be managed again after a fault that began at `fault`
/// and ended at `recovered`: one backoff (doubling from 1 s, so at most the outage plus
/// 1 s when it is next tried), a call timeout, and two ticks.
fn one_backoff(fault: Instant, recovered: Instant) -> Duration {
    (recovered - fault) + Duration::from_secs(1) + CALL_TIMEOUT + 2 * TICK
}

/// Wait until the guest is managed again after recovering at `recovered`, within
/// [`one_backoff`]; returns the status and how long it took.
fn managed_again(
    daemon: &Daemon,
    fault: Instant,
    recovered: Instant,
    also: impl Fn(&Value) -> bool,
) -> (Value, Duration) {
    let limit = one_backoff(fault, recovered).saturating_sub(recovered.elapsed());
    let s = daemon.wait_until(
        &format!("managed again within one backoff ({limit:?} left)"),
        limit,
        |s| managed(s).is_some() && also(s),
    );
    let took = recovered.elapsed();
    eprintln!(
        "managed again {:.1} s after recovery ({:.1} s after the fault), rule {}",
        took.as_secs_f64(),
        fault.elapsed().as_secs_f64(),
        rule(&s).unwrap()
    );
    (s, took)
}

/// The daemon still runs, and is back to no more descriptors open than `before` within
/// a few ticks (one may be open for a moment: a connection being served).
fn no_exit_no_leak(daemon: &mut Daemon, before: usize) {
    std::thread::sleep(2 * TICK);
    assert_eq!(daemon.exited(), None, "the daemon exited");
    let back = support::wait_for(5 * TICK, || {
        let after = daemon.open_fds();
        (after <= before).then_some(after)
    });
    let after = back.unwrap_or_else(|| daemon.open_fds());
    eprintln!("daemon descriptors: {before} before the fault, {after} after");
    assert!(back.is_some(), "descriptors grew from {before} to {after}");
}

/// A rule of memtide's first decision about a guest it knows nothing of.
const FRESH: [&str; 3] = ["memtide.start", "memtide.arrive", "memtide.adopt"];

/// Whether `rule` is one of [`FRESH`].
fn is_fresh(rule: &Value) -> bool {
    FRESH.iter().any(|r| rule == r)
}

/// Events about the guest of `kind` whose message contains `text`.
fn logged(daemon: &Daemon, kind: &str, text: &str) -> usize {
    logged_since(daemon, 0, kind, text).len()
}

/// Events about the guest of `kind` whose message contains `text`, from the `from`th
/// event of the log on (its length before a fault: only what came after it).
fn logged_since(daemon: &Daemon, from: usize, kind: &str, text: &str) -> Vec<Value> {
    daemon
        .event_log()
        .into_iter()
        .skip(from)
        .filter(|e| {
            e["vm"] == "g" && e["kind"] == kind && e["message"].as_str().unwrap().contains(text)
        })
        .collect()
}

/// When an event was logged, in seconds since the Unix epoch.
fn unix_s(event: &Value) -> f64 {
    let ts = event["ts"].as_str().expect("an event's time");
    humantime::parse_rfc3339_weak(ts)
        .unwrap_or_else(|e| panic!("event time {ts}: {e}"))
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[test]
#[ignore = "boots a real QEMU guest; run by scripts/test.sh"]
fn a_guest_reset_during_an_inflation_starts_it_afresh() {
    let dir = tempfile::tempdir().unwrap();
    let cgroup = TestCgroup::create("memtide-faults");
    let mut guest = boot(dir.path(), &cgroup);
    let mut qmp = Qmp::connect(guest.harness_qmp());
    qmp.reset_on_reboot();
    let config = probing_config(&[("g", guest.qmp(), Some(guest.agent()))]);
    let mut daemon = Daemon::start(dir.path(), &config, 0);
    let target = inflating(&daemon);
    let fds = daemon.steady_fds();
    let at = qmp.balloon_mib().unwrap();
    // Only what is logged and decided from the reset on counts: the inflation under way
    // began with a fresh rule of its own.
    let before = daemon.event_log().len();
    qmp.execute("system_reset", None).expect("system_reset");
    let fault = Instant::now();
    eprintln!("reset with QEMU at {at:.0} MiB, inflating to {target:.0} MiB");

    // The reset is seen, the guest reboots, and memtide starts it afresh. Each status's
    // rule is kept with when its decision was published: the reset's own tick logs its
    // diagnostic before it publishes, so the decisions published from the diagnostic's
    // time on are those made with the reset known.
    let mut decided: Vec<(f64, String)> = Vec::new();
    let mut note = |s: Option<Value>| {
        if let Some(s) = s {
            if let (Some(at), Some(r)) = (s["last_decision_unix_s"].as_f64(), rule(&s)) {
                decided.push((at, r.to_string()));
            }
        }
    };
    let reset_at = support::wait_for(Duration::from_secs(30), || {
        note(daemon.try_status());
        logged_since(&daemon, before, "diagnostic", "guest reset")
            .first()
            .map(unix_s)
    });
    let reset_at = reset_at.expect("the reset is not in the event log");
    support::wait_for::<()>(3 * TICK, || {
        note(daemon.try_status());
        None
    });
    guest.wait_console(READY, 2, Duration::from_secs(120));
    let (again, _) = managed_again(&daemon, fault, Instant::now(), |_| true);
    note(Some(again));
    let mut rules: Vec<String> = decided
        .into_iter()
        .filter(|(at, _)| *at >= reset_at)
        .map(|(_, r)| r)
        .collect();
    let actions: Vec<Value> = daemon
        .event_log()
        .into_iter()
        .skip(before)
        .filter(|e| e["vm"] == "g" && e["kind"] == "action")
        .collect();
    let started: Vec<&str> = actions
        .iter()
        .filter(|e| is_fresh(&e["rule"]))
        .filter_map(|e| e["rule"].as_str())
        .collect();
    // Where the host is not short, the balloon is given back in full at the reset (QEMU
    // keeps its target across it, and the rebooting guest's driver would take it back),
    // the policy's own decision, made afresh, said in it (this test's host is short).
    let given_back: Vec<&str> = actions
        .iter()
        .filter(|e| e["rule"] == "safeguard.reset")
        .filter_map(|e| e["message"].as_str())
        .collect();
    let fresh = !started.is_empty()
        || rules.iter().any(|r| is_fresh(&Value::from(r.as_str())))
        || given_back.iter().any(|m| {
            FRESH
                .iter()
                .any(|r| m.contains(&format!("starting afresh: {r}")))
        });
    rules.dedup();
    eprintln!(
        "rules decided from the reset on: {rules:?}; fresh actions logged: {started:?}; \
         given back: {given_back:?}"
    );
    assert!(
        fresh,
        "no fresh start after the reset; rules decided from it on: {rules:?}"
    );
    no_exit_no_leak(&mut daemon, fds);
}

#[test]
#[ignore = "boots a real QEMU guest; run by scripts/test.sh"]
fn the_guest_agent_killed_in_the_guest_and_started_again() {
    const KILLED: &str = "memtide-test: agent killed";
    const BACK: &str = "memtide-test: agent back";
    let dir = tempfile::tempdir().unwrap();
    let cgroup = TestCgroup::create("memtide-faults");
    let mut guest = boot(dir.path(), &cgroup);
    // The agent serves one client: the test schedules the fault through it (the agent
    // runs the script, which kills the agent and later starts a new one), then leaves
    // the agent to the daemon.
    let mut agent = Agent::connect(guest.agent());
    agent.spawn_sh(&format!(
        "sleep 20; echo {KILLED} >/dev/console; kill -KILL $(cat /tmp/qemu-ga.pid); \
         sleep 10; qemu-ga -d -t /tmp -f /tmp/qemu-ga.pid && echo {BACK} >/dev/console"
    ));
    drop(agent);
    let config = probing_config(&[("g", guest.qmp(), Some(guest.agent()))]);
    let mut daemon = Daemon::start(dir.path(), &config, 0);
    let with_agent = |s: &Value| managed(s).is_some_and(|v| v["committed_as"].is_u64());
    daemon.wait_until(
        "managed with the agent's figures",
        Duration::from_secs(15),
        with_agent,
    );
    let fds = daemon.steady_fds();
    // Only the diagnostics from the fault on count (not one from before the agent first
    // answered): the log's length while the agent still serves.
    let before = daemon.event_log().len();

    guest.wait_console(KILLED, 1, Duration::from_secs(30));
    let fault = Instant::now();
    // Without its agent the guest is still managed, from its balloon statistics.
    let without = daemon.wait_until(
        "managed without the agent's figures",
        Duration::from_secs(15),
        |s| managed(s).is_some_and(|v| v["committed_as"].is_null()),
    );
    eprintln!("without its agent: rule {}", rule(&without).unwrap());
    guest.wait_console(BACK, 1, Duration::from_secs(30));
    let recovered = Instant::now();
    managed_again(&daemon, fault, recovered, with_agent);
    assert!(
        !logged_since(&daemon, before, "diagnostic", "guest agent").is_empty(),
        "the agent's failure is not in the event log after it was killed"
    );
    no_exit_no_leak(&mut daemon, fds);
}

#[test]
#[ignore = "boots a real QEMU guest; run by scripts/test.sh"]
fn qemu_killed_during_an_inflation_and_started_again() {
    let dir = tempfile::tempdir().unwrap();
    let cgroup = TestCgroup::create("memtide-faults");
    let guest = boot(dir.path(), &cgroup);
    let config = probing_config(&[("g", guest.qmp(), Some(guest.agent()))]);
    let mut daemon = Daemon::start(dir.path(), &config, 0);
    let target = inflating(&daemon);
    let fds = daemon.steady_fds();
    guest.signal("KILL");
    let fault = Instant::now();
    eprintln!("QEMU killed while inflating to {target:.0} MiB");
    drop(guest); // reaped, its sockets removed
    daemon.wait_until("the VM lost", Duration::from_secs(15), |s| {
        vm(s, "g").is_none()
    });

    // A new QEMU on the same sockets.
    let mut guest = boot(dir.path(), &cgroup);
    let recovered = Instant::now();
    managed_again(&daemon, fault, recovered, |_| true);
    assert!(
        logged(&daemon, "vm_lost", "has exited") > 0,
        "the loss is logged, and that its QEMU went with it"
    );
    assert!(
        logged(&daemon, "vm_connected", "") >= 2,
        "the reconnection is logged"
    );
    no_exit_no_leak(&mut daemon, fds);
    assert!(guest.running());
}

#[test]
#[ignore = "boots a real QEMU guest; run by scripts/test.sh"]
fn the_balloon_driver_unloaded_in_the_guest_and_loaded_again() {
    let dir = tempfile::tempdir().unwrap();
    let cgroup = TestCgroup::create("memtide-faults");
    let guest = boot(dir.path(), &cgroup);
    let mut qmp = Qmp::connect(guest.harness_qmp());
    // The test drives the guest through its agent: the daemon manages the guest from
    // its balloon statistics alone.
    let mut agent = Agent::connect(guest.agent());
    let config = probing_config(&[("g", guest.qmp(), None)]);
    let mut daemon = Daemon::start(dir.path(), &config, 0);
    daemon.wait_until("the balloon inflated", Duration::from_secs(60), |s| {
        managed(s)
            .and_then(|v| mib(v, "actual"))
            .is_some_and(|a| a < GUEST_MIB as f64 - 32.0)
    });
    let fds = daemon.steady_fds();

    let at = qmp.balloon_mib().unwrap();
    let rmmod = agent.run_sh(
        "rmmod virtio_balloon 2>/dev/console",
        Duration::from_secs(30),
    );
    assert_eq!(rmmod, 0, "rmmod virtio_balloon");
    let fault = Instant::now();
    // The driver gives its pages back as it goes.
    let popped = support::wait_for(Duration::from_secs(10), || {
        qmp.balloon_mib().filter(|m| *m >= GUEST_MIB as f64 - 1.0)
    });
    eprintln!("driver unloaded: QEMU's balloon {at:.0} -> {popped:?} MiB");
    assert!(
        popped.is_some(),
        "the balloon deflated with its driver gone"
    );
    // QEMU goes on answering with the driver's last statistics: memtide must see that
    // they stopped moving and stop using them.
    let without = daemon.wait_until(
        "the frozen balloon statistics dropped as stale",
        Duration::from_secs(30),
        |s| vm(s, "g").is_some_and(|v| v["guest_free"].is_null()),
    );
    eprintln!(
        "without the driver: {}",
        serde_json::to_string(&vm(&without, "g")).unwrap()
    );
    assert!(
        without["decision"]["diagnostics"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["kind"] == "implausible_stats"
                && d["message"].as_str().unwrap().contains("not updated")),
        "the stale statistics are reported: {}",
        without["decision"]["diagnostics"]
    );

    let insmod = agent.run_sh(
        "insmod /lib/modules/virtio_balloon.ko 2>/dev/console",
        Duration::from_secs(30),
    );
    assert_eq!(insmod, 0, "insmod virtio_balloon");
    let recovered = Instant::now();
    managed_again(&daemon, fault, recovered, |_| true);
    // The balloon works again: it is inflated below full.
    let again = daemon.wait_until("the balloon inflated again", Duration::from_secs(30), |s| {
        managed(s)
            .and_then(|v| mib(v, "actual"))
            .is_some_and(|a| a < GUEST_MIB as f64 - 8.0)
    });
    eprintln!(
        "driver loaded again: balloon {:.0} MiB",
        mib(managed(&again).unwrap(), "actual").unwrap()
    );
    no_exit_no_leak(&mut daemon, fds);
}

#[test]
#[ignore = "boots a real QEMU guest; run by scripts/test.sh"]
fn the_control_socket_and_http_port_flooded_from_loopback() {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::os::unix::net::UnixStream;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    /// Idle connections held open on each endpoint (more than the 64 each serves at
    /// once), and how long the flood lasts.
    const IDLE: usize = 100;
    const FLOOD: Duration = Duration::from_secs(10);

    let dir = tempfile::tempdir().unwrap();
    let cgroup = TestCgroup::create("memtide-faults");
    let guest = boot(dir.path(), &cgroup);
    let port = support::free_port();
    let config = probing_config(&[("g", guest.qmp(), Some(guest.agent()))]);
    let mut daemon = Daemon::start(dir.path(), &config, port);
    // The baseline with the agent's connection open (under load it may still be opening
    // when the VM is first managed, and count as a leak after the flood).
    let before = daemon.wait_until(
        "managed with the agent's figures",
        Duration::from_secs(30),
        |s| managed(s).is_some_and(|v| v["committed_as"].is_u64()),
    );
    let fds = daemon.steady_fds();

    // Idle connections that send nothing, and two clients asking as fast as they are
    // answered: one for the status on the control socket, one for /metrics.
    let fault = Instant::now();
    let idle_control: Vec<UnixStream> = (0..IDLE)
        .map(|_| UnixStream::connect(&daemon.socket).unwrap())
        .collect();
    let control_s = fault.elapsed().as_secs_f64();
    let idle_http: Vec<std::net::TcpStream> = (0..IDLE)
        .map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    eprintln!(
        "{IDLE} idle connections open on the control socket after {control_s:.1} s, on \
         the HTTP port after {:.1} s",
        fault.elapsed().as_secs_f64()
    );
    let flooding = Instant::now();
    let stop = AtomicBool::new(false);
    let (statuses, scrapes) = (AtomicU64::new(0), AtomicU64::new(0));
    let peak = std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(Ordering::SeqCst) {
                let mut s = UnixStream::connect(&daemon.socket).unwrap();
                s.write_all(b"{\"command\": \"status\"}\n").unwrap();
                let mut line = String::new();
                if BufReader::new(s).read_line(&mut line).is_ok() && line.contains("decision") {
                    statuses.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        scope.spawn(|| {
            while !stop.load(Ordering::SeqCst) {
                let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
                    continue;
                };
                let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
                let _ =
                    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
                let mut body = String::new();
                if s.read_to_string(&mut body).is_ok() && body.starts_with("HTTP/1.1 200") {
                    scrapes.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        let mut peak = 0;
        while flooding.elapsed() < FLOOD {
            peak = peak.max(daemon.open_fds());
            std::thread::sleep(Duration::from_millis(500));
        }
        stop.store(true, Ordering::SeqCst);
        peak
    });
    drop(idle_control);
    drop(idle_http);
    let recovered = Instant::now();
    let during = daemon
        .try_status()
        .expect("the daemon answers after the flood");
    let ticks = |s: &Value| s["counters"]["ticks"].as_u64().unwrap();
    let late = |s: &Value| s["counters"]["late_ticks"].as_u64().unwrap();
    eprintln!(
        "flood of {:.0} s: {} statuses and {} scrapes answered, descriptors {fds} -> peak {peak}, \
         {} ticks ({} late)",
        FLOOD.as_secs_f64(),
        statuses.load(Ordering::SeqCst),
        scrapes.load(Ordering::SeqCst),
        ticks(&during) - ticks(&before),
        late(&during) - late(&before),
    );
    assert!(
        ticks(&during) - ticks(&before) >= FLOOD.as_secs() - 2,
        "the daemon kept ticking"
    );
    // Each endpoint serves 64 connections at once; the others wait to be accepted.
    assert!(
        peak <= fds + 2 * 64 + 8,
        "descriptors {fds} before the flood, {peak} at its peak"
    );
    managed_again(&daemon, fault, recovered, |_| true);
    // The idle connections' descriptors are given back once their peers close.
    let back = support::wait_for(Duration::from_secs(15), || {
        (daemon.open_fds() <= fds).then_some(())
    });
    assert!(
        back.is_some(),
        "descriptors {} after the flood, {fds} before",
        daemon.open_fds()
    );
    assert!(support::http_get(port, "/metrics").contains("memtide_vm_actual_bytes"));
    no_exit_no_leak(&mut daemon, fds);
}

#[test]
#[ignore = "boots a real QEMU guest; run by scripts/test.sh"]
fn a_balloon_moved_by_another_manager_is_left_alone_until_reload() {
    // Another manager (pvestatd, momd, an operator's `virsh setmem`) sets the balloon
    // through its own QMP session, here the test's: memtide does not fight it.
    let dir = tempfile::tempdir().unwrap();
    let cgroup = TestCgroup::create("memtide-faults");
    let guest = boot(dir.path(), &cgroup);
    let mut qmp = Qmp::connect(guest.harness_qmp());
    let policy = dir.path().join("fixed.policy");
    std::fs::write(&policy, support::daemon::fixed_policy(300)).unwrap();
    let config = format!(
        "interval_s = 1\npolicy = {:?}\n[discovery]\nqmp_glob = []\n\
         [engine]\nksm_control = false\nsettle_s = 5\n\
         [[vm]]\nname = \"g\"\nqmp = {:?}\nagent = {:?}\n",
        policy.display().to_string(),
        guest.qmp().display().to_string(),
        guest.agent().display().to_string(),
    );
    let mut daemon = Daemon::start(dir.path(), &config, 0);
    let at_300 = |s: &Value| managed(s).is_some_and(|v| mib(v, "actual") == Some(300.0));
    daemon.wait_until(
        "memtide brings the guest to 300 MiB, with its agent's figures",
        Duration::from_secs(60),
        |s| at_300(s) && managed(s).is_some_and(|v| v["committed_as"].is_u64()),
    );
    let fds = daemon.steady_fds();
    // A balloon moving within settle_s of the VM's first sight is not judged (a restarted
    // memtide may not know the last target it sent).
    std::thread::sleep(Duration::from_secs(6));

    qmp.execute("balloon", Some(serde_json::json!({"value": 200u64 << 20})))
        .expect("balloon");
    let left = daemon.wait_until(
        "the guest left alone as another manager's",
        Duration::from_secs(20),
        |s| {
            vm(s, "g").is_some_and(|v| {
                v["state"] == "unmanaged" && v["reason"]["rule"] == "safeguard.other_manager"
            })
        },
    );
    eprintln!(
        "left alone: {}",
        vm(&left, "g").unwrap()["reason"]["detail"]
    );
    assert_eq!(
        logged(
            &daemon,
            "diagnostic",
            "another manager sets its balloon target"
        ),
        1,
        "reported once, as a condition"
    );
    // memtide does not undo the other manager's target.
    std::thread::sleep(4 * TICK);
    let held = qmp.balloon_mib().unwrap();
    assert!(
        (held - 200.0).abs() < 4.0,
        "the balloon stays at 200 MiB: {held}"
    );

    // A reload of a broken file is no word of the operator's: the guest stays left alone
    // (found by an audit: a rejected reload took it back).
    let file = dir.path().join("memtide.toml");
    let good = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, format!("{good}bogus = = 1\n")).unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_memtide"))
        .args(["reload", "--socket"])
        .arg(&daemon.socket)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "rejected");
    std::thread::sleep(3 * TICK);
    let held = qmp.balloon_mib().unwrap();
    assert!((held - 200.0).abs() < 4.0, "still 200 MiB: {held}");
    assert_eq!(logged(&daemon, "vm_managed_again", "managed again"), 0);
    std::fs::write(&file, good).unwrap();

    // `memtide reload`: the operator says memtide manages it again.
    daemon.reload();
    daemon.wait_until(
        "managed again after the reload, at memtide's 300 MiB",
        Duration::from_secs(30),
        at_300,
    );
    assert_eq!(
        logged(&daemon, "vm_managed_again", "managed again on reload"),
        1
    );
    no_exit_no_leak(&mut daemon, fds);
}
