//! Crash safety end to end (#16 item 3): the daemon, a separate process managing a real
//! test guest with memtide's policy on a short host (so that it moves the balloon), is
//! killed with SIGKILL right after it adopted the guest, while an inflation it asked for
//! is under way, and at a random point (seeded, printed), and started again each time.
//! The test's own QMP session watches the balloon throughout.
//!
//! Boots a guest under TCG, so it is ignored by a plain `cargo test`; `scripts/test.sh`
//! runs it.

mod support;

use serde_json::Value;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use support::cgroup::TestCgroup;
use support::daemon::{mib, probing_config, vm, Daemon};
use support::guest::Guest;
use support::harness::{Agent, Qmp};

const GUEST_MIB: u64 = 384;
/// `[defaults] min_mib`.
const MIN_MIB: f64 = 128.0;
/// How long each daemon runs after a restart before the next kill, at least.
const AFTER_RESTART: Duration = Duration::from_secs(6);

/// The balloon's size every 100 ms, from the test's own QMP session, in a thread.
struct Watch {
    samples: Arc<Mutex<Vec<(Instant, f64)>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Watch {
    fn start(qmp: &std::path::Path) -> Watch {
        let mut qmp = Qmp::connect(qmp);
        let samples = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let (samples, stop) = (samples.clone(), stop.clone());
            move || {
                while !stop.load(Ordering::SeqCst) {
                    if let Some(m) = qmp.balloon_mib() {
                        samples.lock().unwrap().push((Instant::now(), m));
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        });
        Watch {
            samples,
            stop,
            thread: Some(thread),
        }
    }

    /// The sizes seen from `from` to `to`.
    fn between(&self, from: Instant, to: Instant) -> Vec<f64> {
        let samples = self.samples.lock().unwrap();
        samples
            .iter()
            .filter(|(t, _)| (from..=to).contains(t))
            .map(|(_, m)| *m)
            .collect()
    }

    /// The last size seen.
    fn last(&self) -> f64 {
        self.samples
            .lock()
            .unwrap()
            .last()
            .expect("a balloon size")
            .1
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The rule behind the guest's latest decision, once it has one.
fn rule(status: &Value) -> Option<String> {
    let v = vm(status, "r")?;
    (v["state"] == "managed").then_some(())?;
    Some(v["reason"]["rule"].as_str()?.to_string())
}

/// True when the state file holds memtide's estimator for the guest.
fn state_has_estimator(daemon: &Daemon) -> bool {
    std::fs::read(&daemon.state)
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .is_some_and(|s| s["vms"]["r"]["memtide"].is_object())
}

/// A number in 0..n from the seed (xorshift64*), for the random kill point.
fn pick(seed: u64, n: u64) -> u64 {
    let mut x = seed.max(1);
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    x.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
}

/// One kill and restart: when it was killed, the balloon then, when the new daemon
/// answered, and the rule of the guest's first decision after it.
struct Restart {
    what: &'static str,
    killed: Instant,
    balloon_at_kill: f64,
    up: Instant,
    first_rule: String,
}

/// SIGKILL the daemon, start a new one on the same files, and wait for its first
/// decision about the guest.
fn kill_and_restart(
    daemon: Daemon,
    dir: &std::path::Path,
    config: &str,
    watch: &Watch,
    what: &'static str,
) -> (Daemon, Restart) {
    support::signal(daemon.pid(), "KILL");
    let killed = Instant::now();
    let balloon_at_kill = watch.last();
    drop(daemon); // reaps it
    let daemon = Daemon::start(dir, config, 0);
    let up = Instant::now();
    let status = daemon.wait_until(
        &format!("a decision about the guest after the restart {what}"),
        Duration::from_secs(30),
        |s| rule(s).is_some(),
    );
    let first_rule = rule(&status).unwrap();
    eprintln!(
        "killed {what} at balloon {balloon_at_kill:.0} MiB; first rule after the restart {first_rule}"
    );
    (
        daemon,
        Restart {
            what,
            killed,
            balloon_at_kill,
            up,
            first_rule,
        },
    )
}

#[test]
#[ignore = "boots a real QEMU guest; run by scripts/test.sh"]
fn sigkill_and_restart_go_on_where_the_daemon_stood() {
    let seed = std::env::var("MEMTIDE_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    let random_ms = pick(seed, 6000);
    eprintln!("seed {seed} (MEMTIDE_TEST_SEED={seed} repeats it): random kill {random_ms} ms after a restart");

    let dir = tempfile::tempdir().unwrap();
    let cgroup = TestCgroup::create("memtide-restart");
    let mut guest = Guest::boot_watched(
        "r",
        dir.path(),
        &cgroup.procs(),
        GUEST_MIB,
        "memknobs",
        "120:100000",
    );
    guest.wait_console("memtide-guest: ready", 1, Duration::from_secs(120));
    guest.wait_console("mib_per_s=", 1, Duration::from_secs(120));
    let watch = Watch::start(guest.harness_qmp());
    // A second program takes 64 MiB for 6 s every 16 s: the guest's need rises and falls,
    // and the daemon inflates the balloon again each time it falls (probing alone may
    // settle before step 2: a level where a probe failed is not probed again). Started
    // through the agent, which serves one client, before the daemon takes it.
    let mut agent = Agent::connect(guest.agent());
    agent.spawn_sh("memknobs 64:6,1:10 >/dev/null 2>&1");
    drop(agent);
    let config = probing_config(&[("r", guest.qmp(), Some(guest.agent()))]);
    let port = 0; // no HTTP endpoint
    let daemon = Daemon::start(dir.path(), &config, port);
    let mut restarts = Vec::new();

    // 1. Right after adoption: the guest's first decision is made and saved.
    daemon.wait_until("the guest adopted", Duration::from_secs(60), |s| {
        rule(s).is_some() && state_has_estimator(&daemon)
    });
    let (daemon, r) = kill_and_restart(daemon, dir.path(), &config, &watch, "after adoption");
    restarts.push(r);

    // 2. While an inflation is under way: the daemon asked for less than the guest has,
    // and QEMU has not got there yet.
    let asked = daemon.wait_until("an inflation under way", Duration::from_secs(60), |s| {
        let Some(v) = vm(s, "r") else { return false };
        let (Some(actual), Some(target)) = (mib(v, "actual"), mib(v, "target")) else {
            return false;
        };
        target + 4.0 < actual && target + 4.0 < watch.last()
    });
    let target = mib(vm(&asked, "r").unwrap(), "target").unwrap();
    eprintln!(
        "inflation to {target:.0} MiB under way, QEMU at {:.0} MiB",
        watch.last()
    );
    let (daemon, r) = kill_and_restart(daemon, dir.path(), &config, &watch, "during an inflation");
    restarts.push(r);

    // 3. At a random point after the restart.
    std::thread::sleep(Duration::from_millis(random_ms));
    let (daemon, r) = kill_and_restart(daemon, dir.path(), &config, &watch, "at a random point");
    restarts.push(r);
    std::thread::sleep(AFTER_RESTART);

    // What the daemons diagnosed (a late sample, a lost agent), to explain a failure.
    let log = daemon.event_log();
    for e in log.iter().filter(|e| e["kind"] == "diagnostic") {
        eprintln!("{} diagnostic {}: {}", e["ts"], e["rule"], e["message"]);
    }
    for (i, r) in restarts.iter().enumerate() {
        let until = restarts
            .get(i + 1)
            .map_or(Instant::now(), |next| next.killed);
        let sizes = watch.between(r.killed, until);
        let (low, high) = sizes
            .iter()
            .fold((f64::MAX, 0f64), |(l, h), m| (l.min(*m), h.max(*m)));
        eprintln!(
            "restart {}: balloon {low:.0}..{high:.0} MiB from the kill on ({} samples, {:.1} s down)",
            r.what,
            sizes.len(),
            (r.up - r.killed).as_secs_f64()
        );
        assert!(!sizes.is_empty(), "the balloon was watched");
        if r.balloon_at_kill < GUEST_MIB as f64 - 1.0 {
            assert!(
                high < GUEST_MIB as f64 - 1.0,
                "restart {}: the guest was raised to full",
                r.what
            );
        }
        assert!(
            low > MIN_MIB + 1.0,
            "restart {}: the guest was dropped to its minimum",
            r.what
        );
        // A guest whose estimator was restored goes on: not adopted as if the daemon had
        // never seen it, nor started afresh.
        assert!(
            !["memtide.adopt", "memtide.start", "memtide.arrive"].contains(&r.first_rule.as_str()),
            "restart {}: the restored estimator was not used: first rule {}",
            r.what,
            r.first_rule
        );
    }
    assert!(
        restarts[1].balloon_at_kill < GUEST_MIB as f64 - 1.0,
        "the balloon had moved before the kill during an inflation"
    );

    // The event log: whole lines only (the reader fails on garbage), every start in it,
    // and each restart's state restored.
    let of_kind =
        |kind: &str| -> Vec<&Value> { log.iter().filter(|e| e["kind"] == kind).collect() };
    assert_eq!(of_kind("started").len(), 4, "four starts logged");
    let states: Vec<&str> = of_kind("state")
        .iter()
        .map(|e| e["message"].as_str().unwrap())
        .collect();
    assert_eq!(states.len(), 4, "{states:?}");
    assert!(states[0].contains("starting afresh"), "{}", states[0]);
    for s in &states[1..] {
        assert!(s.contains("1 estimator states"), "{s}");
    }
    assert!(guest.running(), "the guest survived");
}
