//! VM memory snapshots end to end (#13) on a real test guest managed by the daemon:
//! saved while it runs, hibernated (its QEMU quits), restored from the store by its
//! configured launch command with the state of its memory intact (a file in its RAM
//! and its checksum), and a save whose QEMU is killed midway leaves no snapshot.
//!
//! Boots a guest under TCG, so it is ignored by a plain `cargo test`; `scripts/test.sh`
//! runs it.

mod support;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use support::cgroup::TestCgroup;
use support::daemon::{snapshot, text, vm, Daemon};
use support::guest::Guest;
use support::harness::Agent;
use support::wait_for;

const GUEST_MIB: u64 = 384;

/// A TOML array of `args`.
fn toml_list(args: &[String]) -> String {
    let quoted: Vec<String> = args.iter().map(|a| format!("{a:?}")).collect();
    format!("[{}]", quoted.join(", "))
}

/// The daemon (policy `none`, its store in `dir/snapshots`, `sections` added) managing
/// `guest` as VM `name` (its `[[vm]]` entry with `vm_keys` added), and its configuration
/// file.
fn start_daemon(
    dir: &Path,
    guest: &Guest,
    name: &str,
    sections: &str,
    vm_keys: &str,
) -> (Daemon, PathBuf) {
    let text = format!(
        "interval_s = 1\npolicy = \"none\"\n[discovery]\nqmp_glob = []\n[engine]\nksm_control = false\n\
         {sections}[snapshots]\ndir = {:?}\n[[vm]]\nname = {name:?}\nqmp = {:?}\n{vm_keys}",
        dir.join("snapshots").display().to_string(),
        guest.qmp().display().to_string(),
    );
    (Daemon::start(dir, &text, 0), dir.join("memtide.toml"))
}

/// The store's snapshots of VM `s`.
fn listed(config: &Path) -> Vec<Value> {
    let out = snapshot(config, &["list", "s", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice::<Vec<Value>>(&out.stdout).unwrap()
}

/// A QEMU process started by a restore, killed when the test ends.
struct Restored(u32);

impl Drop for Restored {
    fn drop(&mut self) {
        // The test may have killed it already (and the host's init reaped it).
        // SAFETY: kill(2) of a pid; no memory is involved.
        unsafe { libc::kill(self.0 as i32, libc::SIGKILL) };
    }
}

/// The pid a restore printed ("... (QEMU pid N, ...").
fn restored_pid(out: &str) -> u32 {
    let after = out.split("QEMU pid ").nth(1).expect("a pid in the output");
    after
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

#[test]
#[ignore = "boots a real QEMU guest; run by scripts/test.sh"]
fn a_guest_saved_hibernated_and_restored_keeps_its_memory() {
    let dir = tempfile::tempdir().unwrap();
    let cgroup = TestCgroup::create("memtide-snapshot");
    let (mut guest, launch) = Guest::boot_restorable(
        "s",
        dir.path(),
        &cgroup.procs(),
        GUEST_MIB,
        "memknobs",
        "120:100000",
    );
    guest.wait_console("memtide-guest: ready", 1, Duration::from_secs(120));
    // 16 MiB of random bytes in the guest's RAM (its root is an initramfs) and their
    // checksum: the state a restore must bring back.
    let mut agent = Agent::connect(guest.agent());
    let made = agent.run_sh(
        "head -c 16777216 /dev/urandom > /state && md5sum /state > /state.md5",
        Duration::from_secs(60),
    );
    assert_eq!(made, 0, "the guest wrote its state");
    drop(agent);

    let store = dir.path().join("snapshots");
    let launch = format!("launch = {}\n", toml_list(&launch));
    let (daemon, config) = start_daemon(dir.path(), &guest, "s", "", &launch);
    daemon.wait_until("the guest sampled", Duration::from_secs(60), |s| {
        vm(s, "s").is_some_and(|v| v["configured"].is_u64())
    });

    // 1. A snapshot: the guest runs on.
    let out = snapshot(&config, &["save", "s"]);
    assert!(out.status.success(), "{}", text(&out));
    eprintln!("{}", text(&out).trim());
    assert!(guest.running(), "the guest runs on after a snapshot");
    let first = listed(&config);
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(first[0]["then"], "run");
    assert_eq!(first[0]["was_running"], true);
    let memory_bytes = first[0]["files"]["memory"]["bytes"].as_u64().unwrap();
    assert!(
        memory_bytes > 16 << 20,
        "the state holds the guest's RAM: {memory_bytes}"
    );
    // Checksummed as QEMU wrote it: the file read afresh, by coreutils, has that sum.
    let id = first[0]["id"].as_str().unwrap();
    let memory = store.join("s").join(id).join("memory");
    let sha256sum = Command::new("sha256sum").arg(&memory).output().unwrap();
    assert!(sha256sum.status.success(), "{}", text(&sha256sum));
    let afresh = String::from_utf8_lossy(&sha256sum.stdout);
    assert_eq!(
        afresh.split_whitespace().next(),
        first[0]["files"]["memory"]["sha256"].as_str()
    );
    let mut agent = Agent::connect(guest.agent());
    assert_eq!(
        agent.run_sh("md5sum -c /state.md5", Duration::from_secs(60)),
        0
    );
    drop(agent);

    // 2. Hibernation: saved, then its QEMU quits and its memory is freed.
    let rss_kib = |pid: u32| -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
            .unwrap_or(0)
    };
    let held = rss_kib(guest.pid());
    let out = snapshot(&config, &["save", "s", "--hibernate"]);
    assert!(out.status.success(), "{}", text(&out));
    eprintln!("{}", text(&out).trim());
    let quit = wait_for(Duration::from_secs(30), || (!guest.running()).then_some(()));
    assert!(quit.is_some(), "QEMU quit after the hibernation");
    eprintln!("hibernated: QEMU held {} MiB, now none", held / 1024);
    let both = listed(&config);
    assert_eq!(both.len(), 2, "{both:?}");
    assert_eq!(both[1]["then"], "quit");

    // 3. Restored from the latest, by the configured launch command: the state is intact.
    // Two restores asked at once start one QEMU: the other is refused (the restore lock,
    // or the VM already running).
    let t0 = Instant::now();
    let second = std::thread::spawn({
        let config = config.clone();
        move || snapshot(&config, &["restore", "s"])
    });
    let out = snapshot(&config, &["restore", "s"]);
    let wake = t0.elapsed();
    let other = second.join().unwrap();
    let (out, other) = match out.status.success() {
        true => (out, other),
        false => (other, out),
    };
    assert!(out.status.success(), "{}", text(&out));
    let _twice = other
        .status
        .success()
        .then(|| Restored(restored_pid(&text(&other))));
    assert!(!other.status.success(), "restored twice: {}", text(&other));
    let refused = text(&other);
    assert!(
        refused.contains("a restore of s is already under way") || refused.contains("is running"),
        "{refused}"
    );
    eprintln!(
        "{} (the command: {:.2} s)",
        text(&out).trim(),
        wake.as_secs_f64()
    );
    let restored = Restored(restored_pid(&text(&out)));
    assert!(alive(restored.0), "the restored QEMU runs");
    let mut agent = Agent::connect(guest.agent());
    assert_eq!(
        agent.run_sh("md5sum -c /state.md5", Duration::from_secs(60)),
        0,
        "the guest's memory came back intact"
    );
    drop(agent);
    // Its workload goes on, and the daemon manages it again.
    let console = dir.path().join("s.serial");
    let lines = wait_for(Duration::from_secs(60), || {
        let text = std::fs::read_to_string(&console).unwrap_or_default();
        text.contains("mib_per_s=").then_some(())
    });
    assert!(
        lines.is_some(),
        "the workload reports again after the restore"
    );
    daemon.wait_until("the restored guest managed", Duration::from_secs(90), |s| {
        vm(s, "s").is_some_and(|v| v["configured"].is_u64())
    });
    // A running VM is not restored over.
    let out = snapshot(&config, &["restore", "s"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("is running"), "{}", text(&out));

    // 4. A save whose QEMU dies midway: an error, and no snapshot that looks whole.
    let saving = std::thread::spawn({
        let config = config.clone();
        move || snapshot(&config, &["save", "s"])
    });
    // Killed as soon as the save's file appears: while QEMU writes its state into it.
    let vm_dir = store.join("s");
    let began = Instant::now();
    let writing = || {
        std::fs::read_dir(&vm_dir).ok()?.flatten().find(|e| {
            e.file_name().to_string_lossy().ends_with(".partial")
                && e.path().join("memory").exists()
        })
    };
    while writing().is_none() {
        if saving.is_finished() || began.elapsed() > Duration::from_secs(30) {
            let out = saving.join().unwrap();
            panic!("the save did not begin: {}", text(&out));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    // SAFETY: kill(2) of the QEMU this test restored; no memory is involved.
    assert_eq!(unsafe { libc::kill(restored.0 as i32, libc::SIGKILL) }, 0);
    let out = saving.join().unwrap();
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("not saved"), "{}", text(&out));
    assert_eq!(listed(&config).len(), 2, "no third snapshot");
    let partial = std::fs::read_dir(store.join("s"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".partial"))
        .count();
    assert_eq!(partial, 0, "what the failed save wrote was removed");
    // The guest was woken from its hibernation: that memory no longer matches its disk,
    // and is not restored again unless forced.
    let out = snapshot(&config, &["restore", "s"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("was woken from it"), "{}", text(&out));
    let listed = listed(&config);
    assert!(listed[1]["woken"].is_string(), "{listed:?}");

    // The event log tells each save.
    let log = daemon.event_log();
    let kinds: Vec<&str> = log
        .iter()
        .filter(|e| e["vm"] == "s")
        .filter_map(|e| e["kind"].as_str())
        .filter(|k| k.starts_with("snapshot"))
        .collect();
    assert_eq!(
        kinds,
        [
            "snapshot_started",
            "snapshot_saved",
            "snapshot_started",
            "snapshot_saved",
            "snapshot_started",
            "snapshot_failed"
        ]
    );
}

#[test]
#[ignore = "boots a real QEMU guest; run by scripts/test.sh"]
fn an_idle_guest_is_snapshotted_on_schedule_then_hibernated_while_the_host_is_short_and_woken() {
    let dir = tempfile::tempdir().unwrap();
    let cgroup = TestCgroup::create("memtide-hibernate");
    // No workload: the guest idles once booted.
    let (mut guest, launch) =
        Guest::boot_restorable("h", dir.path(), &cgroup.procs(), GUEST_MIB, "", "");
    guest.wait_console("memtide-guest: ready", 1, Duration::from_secs(120));
    // A snapshot every 10 s, the newest kept; hibernated after 25 s idle. The host counts
    // as short whatever it has free (`free_below = 1`); idle is below half a CPU (QEMU
    // under TCG spends a few percent on an idle guest's timers).
    let hibernate = "[hibernate]\nidle_cpu = 0.5\nfree_below = 1.0\n";
    let vm_keys = format!(
        "launch = {}\nhibernate_after_s = 25\nsnapshot_every_s = 10\nsnapshot_keep = 1\n",
        toml_list(&launch)
    );
    let (daemon, config) = start_daemon(dir.path(), &guest, "h", hibernate, &vm_keys);
    let quit = wait_for(Duration::from_secs(90), || (!guest.running()).then_some(()));
    assert!(
        quit.is_some(),
        "the idle guest was hibernated; the daemon's log:\n{}",
        daemon.log_text()
    );
    let log = daemon.event_log();
    let hibernate = log
        .iter()
        .find(|e| e["kind"] == "hibernate" && e["vm"] == "h")
        .expect("a hibernate event");
    let reason = hibernate["message"].as_str().unwrap();
    assert!(
        reason.starts_with("idle ") && reason.contains("hibernated to give back"),
        "{reason}"
    );
    let saved = wait_for(Duration::from_secs(30), || {
        let listed = snapshot(&config, &["list", "h", "--json"]);
        let all: Vec<Value> = serde_json::from_slice(&listed.stdout).ok()?;
        all.into_iter().find(|s| s["then"] == "quit")
    });
    assert!(saved.is_some(), "its snapshot is in the store");
    daemon.wait_until("the hibernated VM shown", Duration::from_secs(10), |s| {
        s["hibernated"][0]["vm"] == "h"
    });
    // Scheduled snapshots were taken meanwhile (the saves did not count as work), and
    // all but the newest deleted; the hibernation's is kept.
    let by: Vec<String> = {
        let listed = snapshot(&config, &["list", "h", "--json"]);
        let all: Vec<Value> = serde_json::from_slice(&listed.stdout).unwrap();
        all.iter()
            .map(|s| s["by"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(by, ["schedule", "hibernation"]);
    let deleted = log
        .iter()
        .filter(|e| e["kind"] == "snapshot_deleted")
        .count();
    assert!(deleted >= 1, "the older scheduled snapshots were deleted");

    // Woken by hand; the daemon, whose allowed VM is idle again, waits a whole idle time
    // before it could hibernate it again.
    let out = snapshot(&config, &["restore", "h"]);
    assert!(out.status.success(), "{}", text(&out));
    let restored = Restored(restored_pid(&text(&out)));
    assert!(alive(restored.0), "woken");
    daemon.wait_until(
        "the woken guest managed, no longer hibernated",
        Duration::from_secs(90),
        |s| {
            vm(s, "h").is_some_and(|v| v["configured"].is_u64())
                && s["hibernated"].as_array().is_some_and(|h| h.is_empty())
        },
    );
}

#[test]
#[ignore = "boots a real QEMU guest; run by scripts/test.sh"]
fn a_guest_whose_qemu_is_killed_is_restored_from_its_scheduled_snapshot_once_then_given_up() {
    let dir = tempfile::tempdir().unwrap();
    let cgroup = TestCgroup::create("memtide-recovery");
    let (mut guest, launch) =
        Guest::boot_restorable("c", dir.path(), &cgroup.procs(), GUEST_MIB, "", "");
    guest.wait_console("memtide-guest: ready", 1, Duration::from_secs(120));
    let mut agent = Agent::connect(guest.agent());
    let made = agent.run_sh(
        "head -c 16777216 /dev/urandom > /state && md5sum /state > /state.md5",
        Duration::from_secs(60),
    );
    assert_eq!(made, 0, "the guest wrote its state");
    drop(agent);
    // A snapshot every 20 s; one restore allowed per 10 minutes.
    let vm_keys = format!(
        "launch = {}\nsnapshot_every_s = 20\nsnapshot_keep = 1\nrestore_on_crash = true\n",
        toml_list(&launch)
    );
    let recovery = "[recovery]\nmax_restores = 1\nwindow_s = 600\n";
    let (daemon, config) = start_daemon(dir.path(), &guest, "c", recovery, &vm_keys);
    let scheduled = wait_for(Duration::from_secs(90), || {
        let out = snapshot(&config, &["list", "c", "--json"]);
        let all: Vec<Value> = serde_json::from_slice(&out.stdout).ok()?;
        all.into_iter().find(|s| s["by"] == "schedule")
    })
    .unwrap_or_else(|| panic!("no scheduled snapshot; the daemon:\n{}", daemon.log_text()));
    // Written after the snapshot: a restore from it brings back a RAM without it. Then
    // QEMU is killed, well before the next scheduled save.
    let mut agent = Agent::connect(guest.agent());
    assert_eq!(
        agent.run_sh("echo later > /after", Duration::from_secs(10)),
        0
    );
    drop(agent);
    guest.signal("KILL");
    assert!(
        wait_for(Duration::from_secs(10), || (!guest.running()).then_some(())).is_some(),
        "QEMU was killed"
    );

    // The daemon restores it, by its launch command, from that snapshot.
    let restored = wait_for(Duration::from_secs(120), || {
        let log = daemon.event_log();
        let failed = log.iter().find(|e| e["kind"] == "restore_failed");
        assert!(failed.is_none(), "{failed:?}");
        log.into_iter()
            .find(|e| e["kind"] == "restored" && e["vm"] == "c")
    })
    .unwrap_or_else(|| panic!("not restored; the daemon:\n{}", daemon.log_text()));
    let line = restored["message"].as_str().unwrap();
    eprintln!("{line}");
    let id = scheduled["id"].as_str().unwrap();
    assert!(
        line.starts_with(&format!("c restored from {id} in ")),
        "{line}"
    );
    let first = Restored(restored_pid(line));
    assert!(alive(first.0), "the restored QEMU runs");
    let mut agent = Agent::connect(guest.agent());
    assert_eq!(
        agent.run_sh("md5sum -c /state.md5", Duration::from_secs(60)),
        0,
        "the guest's memory is the snapshot's"
    );
    assert_ne!(
        agent.run_sh("test -e /after", Duration::from_secs(10)),
        0,
        "what the guest wrote after the snapshot is gone"
    );
    drop(agent);
    daemon.wait_until("the restored guest managed", Duration::from_secs(90), |s| {
        vm(s, "c").is_some_and(|v| v["configured"].is_u64())
    });

    // Killed again within the window: given up, left down.
    // SAFETY: kill(2) of the QEMU the daemon restored; no memory is involved.
    assert_eq!(unsafe { libc::kill(first.0 as i32, libc::SIGKILL) }, 0);
    let given_up = wait_for(Duration::from_secs(60), || {
        let log = daemon.event_log();
        log.into_iter().find(|e| e["kind"] == "restore_given_up")
    })
    .unwrap_or_else(|| panic!("not given up; the daemon:\n{}", daemon.log_text()));
    let why = given_up["message"].as_str().unwrap();
    assert!(
        why.starts_with("died again after 1 restores within 600 s"),
        "{why}"
    );
    std::thread::sleep(Duration::from_secs(3));
    let log = daemon.event_log();
    let kinds: Vec<&str> = log
        .iter()
        .filter(|e| e["vm"] == "c")
        .filter_map(|e| e["kind"].as_str())
        .filter(|k| k.starts_with("restore"))
        .collect();
    assert_eq!(kinds, ["restore_started", "restored", "restore_given_up"]);
    let out = snapshot(&config, &["restore", "c", "--force"]);
    assert!(out.status.success(), "{}", text(&out));
    let by_hand = Restored(restored_pid(&text(&out)));
    assert!(
        alive(by_hand.0),
        "the operator can still restore it by hand"
    );
    let metrics = daemon.wait_until("the restores counted", Duration::from_secs(10), |s| {
        s["counters"]["actions"]["restore"]["given_up"] == 1
    });
    assert_eq!(metrics["counters"]["actions"]["restore"]["ok"], 1);

    // Stopped by the operator (SIGTERM, whose shutdown QEMU announces): not a crash.
    daemon.wait_until(
        "the hand-restored guest managed",
        Duration::from_secs(90),
        |s| vm(s, "c").is_some_and(|v| v["configured"].is_u64()),
    );
    // SAFETY: kill(2) of the QEMU this test restored; no memory is involved.
    assert_eq!(unsafe { libc::kill(by_hand.0 as i32, libc::SIGTERM) }, 0);
    let skipped = wait_for(Duration::from_secs(60), || {
        let log = daemon.event_log();
        log.into_iter().find(|e| e["kind"] == "restore_skipped")
    })
    .unwrap_or_else(|| panic!("no restore_skipped; the daemon:\n{}", daemon.log_text()));
    let why = skipped["message"].as_str().unwrap();
    assert_eq!(
        why,
        "not restored: it shut down (its hypervisor announced it)"
    );
    assert!(!alive(by_hand.0), "the QEMU quit");
}

#[test]
#[ignore = "boots a real QEMU guest; run by scripts/test.sh"]
fn a_hibernated_guest_is_woken_at_its_wake_at_time_with_its_memory() {
    let dir = tempfile::tempdir().unwrap();
    let cgroup = TestCgroup::create("memtide-wake");
    let (mut guest, launch) =
        Guest::boot_restorable("w", dir.path(), &cgroup.procs(), GUEST_MIB, "", "");
    guest.wait_console("memtide-guest: ready", 1, Duration::from_secs(120));
    let mut agent = Agent::connect(guest.agent());
    let made = agent.run_sh(
        "head -c 16777216 /dev/urandom > /state && md5sum /state > /state.md5",
        Duration::from_secs(60),
    );
    assert_eq!(made, 0, "the guest wrote its state");
    drop(agent);
    // 40 s from now (UTC, to the second): the hibernation is done by then, with another
    // guest test running beside this one on a loaded machine (review: it took 20 s).
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let wake = now + 40;
    let hh_mm = format!(
        "{:02}:{:02}:{:02}",
        wake % 86_400 / 3600,
        wake % 3600 / 60,
        wake % 60
    );
    let vm_keys = format!("launch = {}\nwake_at = [\"{hh_mm}\"]\n", toml_list(&launch));
    let (daemon, config) = start_daemon(dir.path(), &guest, "w", "", &vm_keys);
    daemon.wait_until("the guest sampled", Duration::from_secs(60), |s| {
        vm(s, "w").is_some_and(|v| v["configured"].is_u64())
    });
    let out = snapshot(&config, &["save", "w", "--hibernate"]);
    assert!(out.status.success(), "{}", text(&out));
    let quit = wait_for(Duration::from_secs(30), || (!guest.running()).then_some(()));
    assert!(quit.is_some(), "QEMU quit after the hibernation");
    let slept = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(slept < wake, "hibernated before {hh_mm} UTC");
    assert!(
        daemon.event_log().iter().all(|e| e["kind"] != "wake"),
        "not woken before its time"
    );

    let restored = wait_for(Duration::from_secs(wake - slept + 60), || {
        let log = daemon.event_log();
        let failed = log.iter().find(|e| e["kind"] == "restore_failed");
        assert!(failed.is_none(), "{failed:?}");
        log.into_iter()
            .find(|e| e["kind"] == "restored" && e["vm"] == "w")
    })
    .unwrap_or_else(|| panic!("not woken; the daemon:\n{}", daemon.log_text()));
    let woke_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(woke_at >= wake, "woken at {hh_mm} UTC, not before");
    let line = restored["message"].as_str().unwrap();
    eprintln!("{line} ({} s after {hh_mm} UTC)", woke_at - wake);
    let woken = Restored(restored_pid(line));
    let log = daemon.event_log();
    let message = log
        .iter()
        .find(|e| e["kind"] == "wake")
        .and_then(|e| e["message"].as_str())
        .unwrap();
    assert!(message.starts_with("woken on schedule ("), "{message}");
    assert!(alive(woken.0), "the woken QEMU runs");
    let mut agent = Agent::connect(guest.agent());
    assert_eq!(
        agent.run_sh("md5sum -c /state.md5", Duration::from_secs(60)),
        0,
        "the guest's memory came back intact"
    );
    drop(agent);
    daemon.wait_until(
        "the woken guest managed, no longer hibernated",
        Duration::from_secs(90),
        |s| {
            vm(s, "w").is_some_and(|v| v["configured"].is_u64())
                && s["hibernated"].as_array().is_some_and(|h| h.is_empty())
        },
    );
    let wakes = daemon
        .event_log()
        .iter()
        .filter(|e| e["kind"] == "wake")
        .count();
    assert_eq!(wakes, 1, "woken once");
}

/// The newer QEMU `scripts/newer-qemu.sh` unpacks: its binary and firmware directory.
fn newer_qemu() -> (PathBuf, PathBuf) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/qemu10/root");
    let qemu = root.join("usr/bin/qemu-system-x86_64");
    assert!(
        qemu.exists(),
        "no {} (scripts/newer-qemu.sh fetches it; scripts/test.sh runs that)",
        qemu.display()
    );
    (qemu, root.join("usr/share/qemu"))
}

#[test]
#[ignore = "boots a real QEMU guest; run by scripts/test.sh"]
fn a_guest_under_qemu_10_is_hibernated_with_mapped_ram_and_woken_with_its_memory() {
    let (qemu, firmware) = newer_qemu();
    let dir = tempfile::tempdir().unwrap();
    let cgroup = TestCgroup::create("memtide-mapped-ram");
    let (mut guest, launch) = Guest::boot_restorable_on(
        &qemu,
        &firmware,
        "m",
        dir.path(),
        &cgroup.procs(),
        GUEST_MIB,
    );
    guest.wait_console("memtide-guest: ready", 1, Duration::from_secs(120));
    let mut agent = Agent::connect(guest.agent());
    let made = agent.run_sh(
        "head -c 16777216 /dev/urandom > /state && md5sum /state > /state.md5",
        Duration::from_secs(60),
    );
    assert_eq!(made, 0, "the guest wrote its state");
    drop(agent);
    // A clone's own sockets, console and swap disk: the guest's, numbered.
    let clone_launch: Vec<String> = launch.iter().map(|a| a.replace("/m.", "/m-{n}.")).collect();
    for n in ["template", "1"] {
        let img = dir.path().join(format!("m-{n}.swap.img"));
        std::fs::File::create(img)
            .unwrap()
            .set_len(128 << 20)
            .unwrap();
    }
    let keys = format!(
        "launch = {}\nclone_launch = {}\n",
        toml_list(&launch),
        toml_list(&clone_launch)
    );
    let (daemon, config) = start_daemon(dir.path(), &guest, "m", "", &keys);
    daemon.wait_until("the guest sampled", Duration::from_secs(60), |s| {
        vm(s, "m").is_some_and(|v| v["configured"].is_u64())
    });

    let out = snapshot(&config, &["save", "m", "--hibernate"]);
    assert!(out.status.success(), "{}", text(&out));
    eprintln!("{}", text(&out).trim());
    let quit = wait_for(Duration::from_secs(30), || (!guest.running()).then_some(()));
    assert!(quit.is_some(), "QEMU quit after the hibernation");
    let out = snapshot(&config, &["list", "m", "--json"]);
    let all: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(all.len(), 1, "{all:?}");
    assert_eq!(all[0]["mechanism"], "qmp migrate mapped-ram to fdset");
    // Each RAM page at its own offset: the file is as long as the guest's RAM and more,
    // its zero pages holes.
    let memory = dir
        .path()
        .join("snapshots/m")
        .join(all[0]["id"].as_str().unwrap())
        .join("memory");
    let meta = std::fs::metadata(&memory).unwrap();
    let written = std::os::unix::fs::MetadataExt::blocks(&meta) * 512;
    eprintln!(
        "mapped-ram file: {} bytes long, {written} written",
        meta.len()
    );
    assert!(meta.len() >= GUEST_MIB << 20, "{}", meta.len());
    assert!(written < meta.len(), "sparse: {written} of {}", meta.len());

    let out = snapshot(&config, &["restore", "m"]);
    assert!(out.status.success(), "{}", text(&out));
    eprintln!("{}", text(&out).trim());
    let restored = Restored(restored_pid(&text(&out)));
    assert!(alive(restored.0), "the restored QEMU runs");
    let mut agent = Agent::connect(guest.agent());
    assert_eq!(
        agent.run_sh("md5sum -c /state.md5", Duration::from_secs(60)),
        0,
        "the guest's memory came back intact"
    );
    drop(agent);
    daemon.wait_until("the restored guest managed", Duration::from_secs(90), |s| {
        vm(s, "m").is_some_and(|v| v["configured"].is_u64())
    });
    // Saved again (the guest runs on): mapped-ram was turned off after the restore's
    // migration, or this save's own turning it on would be all that is tested.
    let out = snapshot(&config, &["save", "m"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(alive(restored.0), "runs on after its save");
    // A clone of that mapped-ram snapshot: its template takes it in with the capability.
    let out = snapshot(&config, &["clone", "m", "1"]);
    assert!(out.status.success(), "{}", text(&out));
    eprintln!("{}", text(&out).trim());
    let clone = Restored(restored_pid(&text(&out)));
    let mut agent = Agent::connect(&dir.path().join("m-1.qga"));
    assert_eq!(
        agent.run_sh("md5sum -c /state.md5", Duration::from_secs(60)),
        0,
        "the clone has the guest's memory"
    );
    drop(agent);
    assert!(alive(clone.0));
}

#[test]
#[ignore = "boots a real QEMU guest; run by scripts/test.sh"]
fn four_clones_start_from_a_snapshot_with_its_memory_and_share_it() {
    let dir = tempfile::tempdir().unwrap();
    let cgroup = TestCgroup::create("memtide-clone");
    let (guest, launch) =
        Guest::boot_restorable("c", dir.path(), &cgroup.procs(), GUEST_MIB, "", "");
    let mut guest = guest;
    guest.wait_console("memtide-guest: ready", 1, Duration::from_secs(120));
    let mut agent = Agent::connect(guest.agent());
    let made = agent.run_sh(
        "head -c 16777216 /dev/urandom > /state && md5sum /state > /state.md5",
        Duration::from_secs(60),
    );
    assert_eq!(made, 0);
    drop(agent);
    // Each clone's own sockets, console and swap disk: the guest's, numbered.
    let clone_launch: Vec<String> = launch.iter().map(|a| a.replace("/c.", "/c-{n}.")).collect();
    for n in ["template", "1", "2", "3", "4"] {
        let img = dir.path().join(format!("c-{n}.swap.img"));
        std::fs::File::create(img)
            .unwrap()
            .set_len(128 << 20)
            .unwrap();
    }
    let clone_launch = format!("clone_launch = {}\n", toml_list(&clone_launch));
    let (daemon, config) = start_daemon(dir.path(), &guest, "c", "", &clone_launch);
    daemon.wait_until("the guest sampled", Duration::from_secs(60), |s| {
        vm(s, "c").is_some_and(|v| v["configured"].is_u64())
    });
    let out = snapshot(&config, &["save", "c"]);
    assert!(out.status.success(), "{}", text(&out));

    let out = snapshot(&config, &["clone", "c", "4"]);
    assert!(out.status.success(), "{}", text(&out));
    eprintln!("{}", text(&out).trim());
    let clones: Vec<Restored> = text(&out)
        .lines()
        .map(|l| Restored(restored_pid(l)))
        .collect();
    assert_eq!(clones.len(), 4);
    assert!(clones.iter().all(|c| alive(c.0)), "every clone runs");
    // A clone has the guest's memory as it was saved.
    let mut agent = Agent::connect(&dir.path().join("c-3.qga"));
    assert_eq!(
        agent.run_sh("md5sum -c /state.md5", Duration::from_secs(60)),
        0
    );
    drop(agent);
    // They share it: together they use far less than four copies of the guest.
    std::thread::sleep(Duration::from_secs(3));
    let one = memtide_testbed::pss(guest.pid());
    let four: u64 = clones.iter().map(|c| memtide_testbed::pss(c.0)).sum();
    eprintln!(
        "the guest {} MiB, its 4 clones {} MiB together",
        one >> 20,
        four >> 20
    );
    assert!(
        one > 0 && four < 2 * one,
        "the clones share their memory: {four} vs {one}"
    );
}
