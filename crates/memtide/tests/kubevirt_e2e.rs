//! KubeVirt's discovery end to end: a libvirt daemon placed where a virt-launcher pod's
//! would be, as the node sees it (`support::libvirtd::Libvirtd::start_as_launcher`: a
//! process named `virtqemud`, non-root, in a mount namespace of its own where its socket
//! is `/var/run/libvirt/virtqemud-sock`), runs one test guest as a domain named as
//! KubeVirt names them (`NAMESPACE_NAME`). memtide, with `[libvirt] kubevirt = true` and
//! nothing else to find, must find the daemon by scanning the host's /proc, reach it
//! through `/proc/PID/root` in session mode, manage its VM as `NAMESPACE/NAME` with the
//! domain's own bounds (no pod bounds), and forget the VM once the daemon has ended, as
//! when its pod ends.
//!
//! Needs the `libvirt` feature, libvirtd, QEMU, util-linux's `unshare` and root (for the
//! mount namespace and to reach another user's process's root; scripts/test.sh).

#![cfg(feature = "libvirt")]

mod support;

use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};
use support::cgroup::TestCgroup;
use support::daemon::{actual_mib, fixed_policy, mib, vm, Daemon};
use support::libvirtd::{Domain, Libvirtd};
use support::wait_for;

/// The libvirt domain, as KubeVirt names a VMI's: `NAMESPACE_NAME`.
const DOMAIN: &str = "team-a_web-1";
/// The VM, as memtide (and `kubectl`) name it.
const VM: &str = "team-a/web-1";
const GUEST_MIB: u64 = 384;
/// The balloon target the test's policy sets.
const TARGET_MIB: f64 = 300.0;

/// What the host itself shows of the launcher: the names in its own `/var/run/libvirt`
/// (`None` when it has none) and the lines of its mount table that name the launcher's
/// tmpfs or the test's directory (none: they are the namespace's alone).
fn host_view(dir: &Path) -> (Option<Vec<String>>, Vec<String>) {
    let names = std::fs::read_dir("/var/run/libvirt").ok().map(|entries| {
        let mut names: Vec<String> = entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    });
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let dir = dir.display().to_string();
    let ours = mounts
        .lines()
        .filter(|l| l.contains("memtide-launcher") || l.contains(&dir))
        .map(str::to_string)
        .collect();
    (names, ours)
}

/// The URIs of the launcher daemons on this host.
fn launcher_uris() -> Vec<String> {
    let found = memtide_adapters::kubevirt::launchers(Path::new("/proc"));
    found.into_iter().map(|l| l.uri).collect()
}

/// The processes in mount namespace `ns` (a `/proc/PID/ns/mnt` link).
fn in_namespace(ns: &Path) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            (std::fs::read_link(e.path().join("ns/mnt")).ok()? == ns).then_some(pid)
        })
        .collect()
}

fn managed(status: &Value) -> bool {
    vm(status, VM).is_some_and(|v| v["state"] == "managed" && v["actual"].is_u64())
}

/// `VM` in no part of the status: neither decided on, nor sampled, nor waiting.
fn forgotten(status: &Value) -> bool {
    let named = |list: &Value| {
        list.as_array()
            .is_some_and(|l| l.iter().any(|e| e["name"] == VM))
    };
    vm(status, VM).is_none() && !named(&status["sampling"]) && !named(&status["waiting"])
}

#[test]
#[ignore = "starts libvirtd as a launcher pod's virtqemud and boots a real guest; run by scripts/test.sh"]
fn a_launcher_pods_vm_is_found_through_its_root_managed_and_forgotten_when_it_ends() {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let host_before = host_view(dir.path());
    assert!(host_before.1.is_empty(), "{:?}", host_before.1);
    let cgroup = TestCgroup::create("memtide-kubevirt-e2e");
    let mut launcher = Libvirtd::start_as_launcher(dir.path(), &cgroup.procs());
    let (pid, namespace) = (launcher.pid(), launcher.mount_namespace());
    assert_eq!(
        host_view(dir.path()),
        host_before,
        "the launcher's mounts are its namespace's only"
    );
    // Reached through its root: /var/run -> /run (the host's absolute link, followed
    // within the root), the test's directory bound on /run/libvirt in the namespace, and
    // virtqemud-sock -> libvirt-sock there. Not root: session mode.
    let uri = format!("qemu+unix:///session?socket=/proc/{pid}/root/run/libvirt/libvirt-sock");
    let found = launcher_uris();
    assert!(found.contains(&uri), "{uri} not in {found:?}");

    let limits = "<memtide:limits xmlns:memtide='urn:memtide:limits:1' min_mib='200'/>";
    let console = launcher.boot(
        DOMAIN,
        &Domain {
            mem_mib: GUEST_MIB,
            metadata: limits,
            ..Domain::default()
        },
    );
    let qemu = launcher.qemu_pid(DOMAIN);

    // memtide starts while the guest boots: it finds the launcher by itself.
    let policy = dir.path().join("fixed.policy");
    std::fs::write(&policy, fixed_policy(TARGET_MIB as u64)).unwrap();
    let config = format!(
        "interval_s = 1\npolicy = {:?}\n[discovery]\nqmp_glob = []\n\
         [libvirt]\nkubevirt = true\n[engine]\nksm_control = false\n",
        policy.display().to_string(),
    );
    let daemon = Daemon::start(dir.path(), &config, support::free_port());
    let at_target = wait_for(Duration::from_secs(90), || {
        daemon
            .try_status()
            .filter(|s| managed(s) && (actual_mib(s, VM) - TARGET_MIB).abs() < 4.0)
    });
    let status = at_target.unwrap_or_else(|| {
        panic!(
            "{VM} not managed at {TARGET_MIB} MiB within 90 s\nstatus: {}\ndaemon log:\n{}\n\
             console:\n{}",
            serde_json::to_string_pretty(&daemon.try_status()).unwrap(),
            daemon.log_text(),
            std::fs::read_to_string(&console).unwrap_or_default()
        )
    });
    eprintln!(
        "{VM} managed at {TARGET_MIB} MiB {:.1} s after the test started",
        started.elapsed().as_secs_f64()
    );
    let v = vm(&status, VM).unwrap();
    assert_eq!(mib(v, "configured"), Some(GUEST_MIB as f64));
    assert_eq!(mib(v, "min"), Some(200.0), "min from the domain's metadata");
    let sampling = status["sampling"].as_array().unwrap();
    let ours = sampling.iter().find(|s| s["name"] == VM).unwrap();
    assert_eq!(ours["connector"], "libvirt");
    assert_eq!(
        ours["bounds_from"]["min"], "libvirt",
        "no pod bounds: the domain's"
    );
    assert_eq!(sampling.len(), 1, "the launcher's VM alone: {sampling:?}");
    let connected: Vec<Value> = daemon
        .event_log()
        .into_iter()
        .filter(|e| e["kind"] == "vm_connected")
        .collect();
    assert!(
        connected.iter().any(|e| e["vm"] == VM
            && e["message"]
                .as_str()
                .is_some_and(|m| m.ends_with(&format!("{uri} domain {DOMAIN}")))),
        "connected through the launcher's root: {connected:?}"
    );
    let (actual_kib, stats) = launcher.balloon_kib(DOMAIN);
    assert!(
        (actual_kib as f64 / 1024.0 - TARGET_MIB).abs() < 4.0,
        "libvirt itself sees the balloon: {stats}"
    );

    // The pod ends: its daemon stops, then its QEMU is killed.
    launcher.stop();
    let stopped = Instant::now();
    support::signal(qemu, "KILL");
    let gone = daemon.wait_until(
        "the launcher's VM forgotten once its daemon has ended",
        Duration::from_secs(30),
        forgotten,
    );
    eprintln!(
        "{VM} forgotten {:.1} s after its daemon stopped",
        stopped.elapsed().as_secs_f64()
    );
    assert!(
        gone["waiting"].as_array().unwrap().is_empty(),
        "{}",
        gone["waiting"]
    );
    let found = launcher_uris();
    assert!(!found.contains(&uri), "{found:?}");
    let lost = daemon
        .event_log()
        .into_iter()
        .any(|e| e["kind"] == "vm_lost" && e["vm"] == VM);
    assert!(lost, "the loss is in the event log");
    // And it stays forgotten: no candidate left to retry.
    std::thread::sleep(Duration::from_secs(3));
    let later = daemon.try_status().unwrap();
    assert!(forgotten(&later), "{}", later["waiting"]);
    assert!(later["waiting"].as_array().unwrap().is_empty());

    // Nothing left: the namespace ended with its processes, the host as it was.
    drop(daemon);
    drop(launcher);
    let left = wait_for(Duration::from_secs(10), || {
        in_namespace(&namespace).is_empty().then_some(())
    });
    assert!(
        left.is_some(),
        "processes left in the launcher's namespace: {:?}",
        in_namespace(&namespace)
    );
    assert_eq!(host_view(dir.path()), host_before);
    eprintln!("took {:.1} s", started.elapsed().as_secs_f64());
}
