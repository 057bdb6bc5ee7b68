//! VM memory snapshots through libvirt end to end (#13): a test guest run by a libvirt
//! daemon of the test's own (session mode, as `nobody`, while memtide runs as root) is
//! saved while it runs, hibernated (libvirt stops the domain and its QEMU's memory goes
//! back), and restored by `memtide snapshot restore` with the state of its memory intact
//! (16 MiB of random bytes in its RAM and their MD5), all through memtide's store.
//!
//! Needs the `libvirt` feature, libvirtd and QEMU (scripts/test.sh installs them).

#![cfg(feature = "libvirt")]

mod support;

use serde_json::{json, Value};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;
use support::cgroup::TestCgroup;
use support::daemon::{snapshot, text, vm, Daemon};
use support::libvirtd::{Domain, Libvirtd};
use support::wait_for;

const GUEST_MIB: u64 = 384;

/// Run `sh -c script` in domain `name` through libvirt's agent channel: its exit code.
fn run_sh(libvirtd: &Libvirtd, name: &str, script: &str) -> i64 {
    let exec = json!({"execute": "guest-exec",
        "arguments": {"path": "/bin/sh", "arg": ["-c", script]}});
    let started = wait_for(Duration::from_secs(60), || {
        let out = libvirtd
            .virsh(&["qemu-agent-command", name, &exec.to_string()])
            .ok()?;
        serde_json::from_str::<Value>(&out).ok()?["return"]["pid"].as_u64()
    })
    .unwrap_or_else(|| panic!("guest-exec in {name}: the agent did not answer"));
    let status = json!({"execute": "guest-exec-status", "arguments": {"pid": started}});
    wait_for(Duration::from_secs(60), || {
        let out = libvirtd
            .virsh(&["qemu-agent-command", name, &status.to_string()])
            .ok()?;
        let s: Value = serde_json::from_str(&out).ok()?;
        (s["return"]["exited"] == true).then(|| s["return"]["exitcode"].as_i64().unwrap_or(-1))
    })
    .unwrap_or_else(|| panic!("sh -c {script:?} in {name} did not end"))
}

fn domstate(libvirtd: &Libvirtd, name: &str) -> String {
    libvirtd
        .virsh(&["domstate", name])
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// The store's snapshots of VM `s`.
fn listed(config: &Path) -> Vec<Value> {
    let out = snapshot(config, &["list", "s", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
#[ignore = "starts libvirtd and boots a real guest; run by scripts/test.sh"]
fn a_domain_saved_hibernated_and_restored_through_libvirt_keeps_its_memory() {
    let dir = tempfile::tempdir().unwrap();
    let cgroup = TestCgroup::create("memtide-libvirt-snapshot");
    let libvirtd = Libvirtd::start(dir.path(), &cgroup.procs());
    let console = libvirtd.boot(
        "s",
        &Domain {
            mem_mib: GUEST_MIB,
            workload: "memknobs",
            args: "120:100000",
            agent: true,
            ..Domain::default()
        },
    );
    let reports = |n: usize| {
        wait_for(Duration::from_secs(180), || {
            let text = std::fs::read_to_string(&console).unwrap_or_default();
            (text.matches("mib_per_s=").count() >= n).then_some(())
        })
    };
    assert!(reports(1).is_some(), "the guest's workload did not start");
    let made = run_sh(
        &libvirtd,
        "s",
        "head -c 16777216 /dev/urandom > /state && md5sum /state > /state.md5",
    );
    assert_eq!(made, 0, "the guest wrote its state");

    let store = dir.path().join("snapshots");
    let config_text = format!(
        "interval_s = 1\npolicy = \"none\"\n[discovery]\nqmp_glob = []\n\
         [engine]\nksm_control = false\n[snapshots]\ndir = {:?}\n\
         [[vm]]\nname = \"s\"\nlibvirt = {:?}\n",
        store.display().to_string(),
        libvirtd.uri
    );
    let daemon = Daemon::start(dir.path(), &config_text, 0);
    let config = dir.path().join("memtide.toml");
    daemon.wait_until("the domain sampled", Duration::from_secs(60), |s| {
        vm(s, "s").is_some_and(|v| v["configured"].is_u64())
    });

    // 1. A snapshot: libvirt saves the domain (stopping it) and starts it again at once.
    let out = snapshot(&config, &["save", "s"]);
    assert!(out.status.success(), "{}", text(&out));
    eprintln!("{}", text(&out).trim());
    assert_eq!(domstate(&libvirtd, "s"), "running");
    let first = listed(&config);
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(first[0]["mechanism"], "libvirt virDomainSaveFlags");
    assert_eq!(first[0]["then"], "run");
    let memory_bytes = first[0]["files"]["memory"]["bytes"].as_u64().unwrap();
    assert!(memory_bytes > 16 << 20, "the guest's RAM: {memory_bytes}");
    // libvirtd (nobody) wrote it; the store gave it back to memtide's user.
    let id = first[0]["id"].as_str().unwrap();
    let memory = store.join("s").join(id).join("memory");
    let meta = std::fs::metadata(&memory).unwrap();
    assert_eq!(
        (meta.uid(), meta.mode() & 0o777),
        (0, 0o600),
        "root's alone"
    );
    assert_eq!(
        std::fs::metadata(memory.parent().unwrap()).unwrap().uid(),
        0
    );
    assert_eq!(run_sh(&libvirtd, "s", "md5sum -c /state.md5"), 0);
    // Stopped and restored by libvirt, the guest went on: no reboot is seen (before, its
    // balloon was given back in full and what was learnt of it forgotten).
    let ticks = |s: &Value| s["counters"]["ticks"].as_u64().unwrap_or(0);
    let now = ticks(&daemon.try_status().unwrap());
    daemon.wait_until(
        "the saved domain sampled again",
        Duration::from_secs(30),
        |s| ticks(s) >= now + 3 && vm(s, "s").is_some_and(|v| v["state"] == "managed"),
    );
    let rules: Vec<String> = daemon
        .event_log()
        .iter()
        .filter(|e| e["vm"] == "s")
        .filter_map(|e| Some(e["rule"].as_str()?.to_string()))
        .collect();
    assert!(
        !rules
            .iter()
            .any(|r| r.contains("reset") || r == "guest_shutdown"),
        "{rules:?}"
    );

    // 2. Hibernation: the domain stays stopped, its QEMU gone with its memory.
    let qemu = libvirtd.qemu_pid("s");
    let before = cgroup.usage();
    let out = snapshot(&config, &["save", "s", "--hibernate"]);
    assert!(out.status.success(), "{}", text(&out));
    eprintln!("{}", text(&out).trim());
    assert_eq!(domstate(&libvirtd, "s"), "shut off");
    assert!(!Path::new(&format!("/proc/{qemu}")).exists(), "QEMU ended");
    let after = cgroup.usage();
    eprintln!(
        "hibernated: the domain's cgroup went from {} to {} MiB",
        before >> 20,
        after >> 20
    );
    assert!(
        before - after > (GUEST_MIB << 20) / 2,
        "the guest's memory went back: {before} -> {after}"
    );
    let both = listed(&config);
    assert_eq!(both.len(), 2, "{both:?}");
    assert_eq!(both[1]["then"], "quit");
    assert_eq!(both[1]["was_running"], true);

    // 3. Woken by libvirt from the store: the memory is intact, the workload goes on,
    // and the daemon manages the domain again.
    let out = snapshot(&config, &["restore", "s"]);
    assert!(out.status.success(), "{}", text(&out));
    eprintln!("{}", text(&out).trim());
    assert_eq!(domstate(&libvirtd, "s"), "running");
    assert_eq!(
        run_sh(&libvirtd, "s", "md5sum -c /state.md5"),
        0,
        "the guest's memory came back intact"
    );
    let seen = std::fs::read_to_string(&console)
        .unwrap_or_default()
        .matches("mib_per_s=")
        .count();
    assert!(reports(seen + 1).is_some(), "the workload reports again");
    daemon.wait_until("the woken domain managed", Duration::from_secs(90), |s| {
        vm(s, "s").is_some_and(|v| v["configured"].is_u64() && v["state"] == "managed")
    });
    assert!(listed(&config)[1]["woken"].is_string());
    // A running domain is not restored over.
    let out = snapshot(&config, &["restore", "s", "--force"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("is running"), "{}", text(&out));

    let kinds: Vec<String> = daemon
        .event_log()
        .iter()
        .filter(|e| e["vm"] == "s")
        .filter_map(|e| e["kind"].as_str())
        .filter(|k| k.starts_with("snapshot"))
        .map(String::from)
        .collect();
    assert_eq!(
        kinds,
        [
            "snapshot_started",
            "snapshot_saved",
            "snapshot_started",
            "snapshot_saved"
        ]
    );
}

#[test]
#[ignore = "starts libvirtd and boots a real guest; run by scripts/test.sh"]
fn an_idle_domain_is_hibernated_by_the_daemon_and_woken_through_libvirt() {
    let dir = tempfile::tempdir().unwrap();
    let cgroup = TestCgroup::create("memtide-libvirt-hibernate");
    let libvirtd = Libvirtd::start(dir.path(), &cgroup.procs());
    // No workload: the guest idles once booted.
    let console = libvirtd.boot(
        "h",
        &Domain {
            mem_mib: GUEST_MIB,
            ..Domain::default()
        },
    );
    let ready = wait_for(Duration::from_secs(180), || {
        let text = std::fs::read_to_string(&console).unwrap_or_default();
        text.contains("memtide-guest: ready").then_some(())
    });
    assert!(ready.is_some(), "the guest did not boot");
    // Hibernated after 25 s idle (its CPU time from libvirt), the host counting as short
    // whatever it has free; no `launch`: libvirt wakes the domain.
    let store = dir.path().join("snapshots");
    let config_text = format!(
        "interval_s = 1\npolicy = \"none\"\n[discovery]\nqmp_glob = []\n\
         [engine]\nksm_control = false\n[hibernate]\nidle_cpu = 0.5\nfree_below = 1.0\n\
         [snapshots]\ndir = {:?}\n\
         [[vm]]\nname = \"h\"\nlibvirt = {:?}\nhibernate_after_s = 25\n",
        store.display().to_string(),
        libvirtd.uri
    );
    let daemon = Daemon::start(dir.path(), &config_text, 0);
    let config = dir.path().join("memtide.toml");
    let asleep = wait_for(Duration::from_secs(120), || {
        (domstate(&libvirtd, "h") == "shut off").then_some(())
    });
    assert!(
        asleep.is_some(),
        "the idle domain was not hibernated; the daemon's log:\n{}",
        daemon.log_text()
    );
    let log = daemon.event_log();
    let hibernate = log
        .iter()
        .find(|e| e["kind"] == "hibernate" && e["vm"] == "h")
        .expect("a hibernate event");
    let reason = hibernate["message"].as_str().unwrap();
    assert!(reason.starts_with("idle "), "{reason}");
    let saved = wait_for(Duration::from_secs(30), || {
        let listed = snapshot(&config, &["list", "h", "--json"]);
        let all: Vec<Value> = serde_json::from_slice(&listed.stdout).ok()?;
        all.into_iter().find(|s| s["by"] == "hibernation")
    });
    let saved = saved.expect("the hibernation's snapshot in the store");
    assert_eq!(saved["then"], "quit");
    assert_eq!(saved["mechanism"], "libvirt virDomainSaveFlags");

    let out = snapshot(&config, &["restore", "h"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(domstate(&libvirtd, "h"), "running");
    daemon.wait_until("the woken domain managed", Duration::from_secs(90), |s| {
        vm(s, "h").is_some_and(|v| v["configured"].is_u64())
            && s["hibernated"].as_array().is_some_and(|h| h.is_empty())
    });
}
