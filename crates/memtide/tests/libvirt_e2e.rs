//! End to end through libvirt: a libvirt daemon of the test's own (session mode, as an
//! unprivileged user, all state in a temporary directory) runs two test guests as
//! `type='qemu'` domains (TCG) in a memory cgroup that is memtide's VM memory domain;
//! memtide finds them by listing the connection and manages them through libvirt alone:
//! memory statistics, balloon, bounds from the domain's metadata, the guest agent
//! through libvirt's agent channel, lifecycle events, and virtio-mem devices.
//!
//! Needs the `libvirt` feature, libvirtd and QEMU (scripts/test.sh installs them).

#![cfg(feature = "libvirt")]

mod support;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use support::cgroup::TestCgroup;
use support::daemon::{actual_mib, fixed_policy, memtide, mib, vm, Daemon};
use support::libvirtd::{Domain, Libvirtd};
use support::wait_for;

const GUEST_MIB: u64 = 384;
/// Anonymous memory each guest's workload keeps touching.
const WORKLOAD_MIB: u64 = 160;

fn managed(status: &Value, name: &str) -> bool {
    vm(status, name).is_some_and(|v| v["state"] == "managed" && v["actual"].is_u64())
}

#[test]
#[ignore = "starts libvirtd and boots real guests; run by scripts/test.sh"]
fn two_domains_through_libvirt() {
    let dir = tempfile::tempdir().unwrap();
    let cgroup = TestCgroup::create("memtide-libvirt-e2e");
    let libvirtd = Libvirtd::start(dir.path(), &cgroup.procs());
    let args = format!("{WORKLOAD_MIB}:100000");
    let limits = "<memtide:limits xmlns:memtide='urn:memtide:limits:1' min_mib='200'/>";
    let guest = |agent, metadata| Domain {
        mem_mib: GUEST_MIB,
        workload: "memknobs",
        args: &args,
        agent,
        metadata,
        ..Domain::default()
    };
    let consoles = [
        libvirtd.boot("a", &guest(true, limits)),
        libvirtd.boot("b", &guest(false, "")),
    ];
    for console in &consoles {
        let steady = wait_for(Duration::from_secs(180), || {
            let text = std::fs::read_to_string(console).unwrap_or_default();
            (text.matches("mib_per_s=").count() >= 2).then_some(())
        });
        assert!(
            steady.is_some(),
            "{}: the workload did not start; console:\n{}",
            console.display(),
            std::fs::read_to_string(console).unwrap_or_default()
        );
    }

    let port = support::free_port();
    // mom evaluating every second on the daemon's samples, not every 10 s on its own
    // every 5 s as MOM does: this test follows the daemon's work, not MOM's pace.
    let config = format!(
        "interval_s = 1\npolicy = \"mom\"\n\
         [host]\ndomain_cgroup = {:?}\n\
         [discovery]\nqmp_glob = []\n\
         [libvirt]\nuris = [{:?}]\n\
         [engine]\nksm_control = false\nsettle_s = 20\n\
         [mom]\ninterval_s = 1\nsample_interval_s = 0\n",
        cgroup.dir.display().to_string(),
        libvirtd.uri,
    );
    let daemon = Daemon::start(dir.path(), &config, port);
    let both = daemon.wait_until(
        "both domains managed with guest stats, a's agent figures in",
        Duration::from_secs(90),
        |s| {
            ["a", "b"]
                .iter()
                .all(|n| managed(s, n) && vm(s, n).unwrap()["guest_free"].is_u64())
                && vm(s, "a").unwrap()["committed_as"].is_u64()
        },
    );
    let a = vm(&both, "a").unwrap();
    assert_eq!(actual_mib(&both, "a"), GUEST_MIB as f64, "no pressure yet");
    assert_eq!(mib(a, "min"), Some(200.0), "min from the domain's metadata");
    assert_eq!(
        mib(vm(&both, "b").unwrap(), "min"),
        Some(128.0),
        "the default"
    );
    assert!(a["rss"].is_u64(), "QEMU's RSS as libvirt reports it");
    assert!(
        a["host_swapped"].is_u64(),
        "what the host swapped out of its QEMU, found by the domain's UUID"
    );
    assert!(
        vm(&both, "b").unwrap()["committed_as"].is_null(),
        "b has no agent channel"
    );
    let connected: Vec<_> = daemon
        .event_log()
        .into_iter()
        .filter(|e| e["kind"] == "vm_connected")
        .map(|e| e["message"].as_str().unwrap().to_string())
        .collect();
    assert!(
        connected.iter().any(|m| m.ends_with(" domain a")),
        "{connected:?}"
    );

    // Pressure: the domain's cgroup limited to leave about 10% freeable (MOM acts below 20%).
    let usage = cgroup.usage();
    let limit = ((usage - cgroup.file_cache()) as f64 / 0.90) as u64;
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
            "{n}: libvirt's actual {actual} follows target {target}"
        );
        assert!(actual > WORKLOAD_MIB as f64, "{n}: above the working set");
    }
    let (actual_kib, current) = libvirtd.balloon_kib("b");
    assert!(
        actual_kib < GUEST_MIB * 1024 * 9 / 10,
        "libvirt itself sees the balloon: {current}"
    );

    // Pressure ends: the balloons grow back.
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

    // A reset reaches memtide as libvirt's reboot event.
    libvirtd.virsh(&["reset", "b"]).unwrap();
    wait_for(Duration::from_secs(20), || {
        daemon
            .event_log()
            .into_iter()
            .any(|e| e["kind"] == "diagnostic" && e["rule"] == "guest_reset" && e["vm"] == "b")
            .then_some(())
    })
    .expect("a guest_reset diagnostic for b");

    // A destroyed domain disappears from status; the other carries on.
    libvirtd.virsh(&["destroy", "a"]).unwrap();
    let after = daemon.wait_until(
        "a destroyed domain disappears",
        Duration::from_secs(30),
        |s| vm(s, "a").is_none() && managed(s, "b"),
    );
    let lost = daemon
        .event_log()
        .into_iter()
        .any(|e| e["kind"] == "vm_lost" && e["vm"] == "a");
    assert!(lost, "the loss is in the event log");
    daemon.wait_until(
        "a is forgotten once libvirt no longer lists it, b is still sampled",
        Duration::from_secs(20),
        |s| {
            let ticks = s["counters"]["ticks"].as_u64().unwrap();
            ticks > after["counters"]["ticks"].as_u64().unwrap() + 2
                && managed(s, "b")
                && s["waiting"].as_array().unwrap().is_empty()
        },
    );
    let pid = libvirtd.qemu_pid("b");
    assert!(
        std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "b's QEMU survived"
    );
}

#[test]
#[ignore = "starts libvirtd and boots a real guest; run by scripts/test.sh"]
fn libvirtd_restarted_under_the_daemon() {
    // #16 item 5: libvirtd stopped for a few seconds while memtide manages a domain
    // through it, then started again (its domains go on running meanwhile).
    let dir = tempfile::tempdir().unwrap();
    let cgroup = TestCgroup::create("memtide-libvirt-restart");
    let mut libvirtd = Libvirtd::start(dir.path(), &cgroup.procs());
    let args = format!("{WORKLOAD_MIB}:100000");
    let console = libvirtd.boot(
        "r",
        &Domain {
            mem_mib: GUEST_MIB,
            workload: "memknobs",
            args: &args,
            agent: true,
            ..Domain::default()
        },
    );
    let ready = wait_for(Duration::from_secs(180), || {
        let text = std::fs::read_to_string(&console).unwrap_or_default();
        text.contains("mib_per_s=").then_some(())
    });
    assert!(ready.is_some(), "the guest's workload did not start");

    let policy = dir.path().join("fixed.policy");
    std::fs::write(&policy, fixed_policy(300)).unwrap();
    let config = format!(
        "interval_s = 1\npolicy = {:?}\n[discovery]\nqmp_glob = []\n\
         [libvirt]\nuris = [{:?}]\n[engine]\nksm_control = false\n",
        policy.display().to_string(),
        libvirtd.uri,
    );
    let mut daemon = Daemon::start(dir.path(), &config, support::free_port());
    let at = |mib: f64| move |s: &Value| managed(s, "r") && (actual_mib(s, "r") - mib).abs() < 4.0;
    daemon.wait_until(
        "the domain brought to 300 MiB",
        Duration::from_secs(60),
        at(300.0),
    );
    let qemu = libvirtd.qemu_pid("r");
    let fds = daemon.steady_fds();

    let stopped = Instant::now();
    libvirtd.restart(|| {
        daemon.wait_until(
            "the domain no longer managed while libvirtd is down",
            Duration::from_secs(20),
            |s| !managed(s, "r"),
        );
        std::thread::sleep(Duration::from_secs(3));
        assert_eq!(daemon.exited(), None, "the daemon exited");
    });
    let up = Instant::now();
    assert!(
        std::path::Path::new(&format!("/proc/{qemu}")).exists(),
        "the domain's QEMU survived libvirtd's restart"
    );
    // Managed again within one backoff of libvirtd's return (the outage plus 1 s, a call
    // timeout of 2 s and two ticks), at the size it was left at: not reset to full.
    let limit = (up - stopped) + Duration::from_secs(5);
    let again = daemon.wait_until(
        "the domain managed again after libvirtd's restart",
        limit.saturating_sub(up.elapsed()),
        |s| managed(s, "r"),
    );
    eprintln!(
        "libvirtd down {:.1} s; the domain managed again {:.1} s after it answered",
        (up - stopped).as_secs_f64(),
        up.elapsed().as_secs_f64()
    );
    assert!(
        (actual_mib(&again, "r") - 300.0).abs() < 4.0,
        "the balloon stayed where it was: {} MiB",
        actual_mib(&again, "r")
    );
    // And the new connection carries commands: a new target reaches the guest.
    std::fs::write(&policy, fixed_policy(260)).unwrap();
    daemon.reload();
    daemon.wait_until(
        "the domain brought to 260 MiB",
        Duration::from_secs(30),
        at(260.0),
    );
    let log = daemon.event_log();
    let kinds: Vec<&str> = log
        .iter()
        .filter(|e| e["vm"] == "r")
        .filter_map(|e| e["kind"].as_str())
        .collect();
    let lost = kinds.iter().rposition(|k| *k == "vm_lost");
    let connected = kinds.iter().rposition(|k| *k == "vm_connected");
    assert!(
        lost.is_some() && connected > lost,
        "the loss and the new connection are in the event log: {kinds:?}"
    );
    std::thread::sleep(Duration::from_secs(2));
    let after = support::wait_for(Duration::from_secs(5), || {
        let n = daemon.open_fds();
        (n <= fds).then_some(n)
    });
    assert!(
        after.is_some(),
        "descriptors grew from {fds} to {}",
        daemon.open_fds()
    );
    assert_eq!(daemon.exited(), None, "the daemon exited");
}

/// `name` has `plugged` MiB plugged and a logical size within 4 MiB of `actual`, as
/// memtide reports them.
fn sized(status: &Value, name: &str, plugged: f64, actual: f64) -> bool {
    vm(status, name).is_some_and(|v| {
        mib(v, "plugged") == Some(plugged) && (mib(v, "actual").unwrap_or(0.0) - actual).abs() < 4.0
    })
}

/// A libvirtd of the test's own in `dir` running `domain` as `name` in `cgroup`, booted,
/// and a daemon managing it under a policy giving it `mib`, written to the path returned
/// (rewrite it and reload to move the domain).
fn under_fixed_policy(
    dir: &Path,
    cgroup: &TestCgroup,
    name: &str,
    domain: &Domain,
    mib: u64,
) -> (Libvirtd, Daemon, PathBuf) {
    let libvirtd = Libvirtd::start(dir, &cgroup.procs());
    let console = libvirtd.boot(name, domain);
    let ready = wait_for(Duration::from_secs(180), || {
        let text = std::fs::read_to_string(&console).unwrap_or_default();
        text.contains("memtide-guest: ready").then_some(())
    });
    assert!(ready.is_some(), "the guest did not boot");
    let policy = dir.join("fixed.policy");
    std::fs::write(&policy, fixed_policy(mib)).unwrap();
    let config = format!(
        "interval_s = 1\npolicy = {:?}\n[discovery]\nqmp_glob = []\n\
         [libvirt]\nuris = [{:?}]\n[engine]\nksm_control = false\n",
        policy.display().to_string(),
        libvirtd.uri,
    );
    let daemon = Daemon::start(dir, &config, support::free_port());
    (libvirtd, daemon, policy)
}

/// The balloon's `actual` and the virtio-mem device's `<requested>` in KiB, as libvirt
/// reports them.
fn libvirt_sizes(libvirtd: &Libvirtd, name: &str) -> (u64, u64) {
    let xml = libvirtd.virsh(&["dumpxml", name]).unwrap();
    let number = |text: &str, prefix: &str, end: char| -> u64 {
        let at = text
            .find(prefix)
            .unwrap_or_else(|| panic!("{prefix} in {text}"))
            + prefix.len();
        text[at..]
            .split(end)
            .next()
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    (
        libvirtd.balloon_kib(name).0,
        number(&xml, "<requested unit='KiB'>", '<'),
    )
}

#[test]
#[ignore = "starts libvirtd and boots a real guest; run by scripts/test.sh"]
fn a_domain_resized_through_virtio_mem() {
    let dir = tempfile::tempdir().unwrap();
    let cgroup = TestCgroup::create("memtide-libvirt-virtio-mem");
    // 256 MiB of base memory and 512 MiB more through virtio-mem, onlined as plugged.
    let domain = Domain {
        mem_mib: 256,
        virtio_mem_mib: 512,
        append: "memhp_default_state=online_movable",
        ..Domain::default()
    };
    let (libvirtd, daemon, policy) = under_fixed_policy(dir.path(), &cgroup, "v", &domain, 640);

    // Growing past the base memory plugs whole blocks, 640 − 256 = 384 MiB; the balloon
    // keeps the whole base.
    let grown = daemon.wait_until(
        "the domain grows through virtio-mem",
        Duration::from_secs(60),
        |s| sized(s, "v", 384.0, 640.0),
    );
    assert_eq!(
        mib(vm(&grown, "v").unwrap(), "configured"),
        Some(768.0),
        "<memory>: base + the device's size"
    );
    assert_eq!(
        libvirt_sizes(&libvirtd, "v"),
        (256 << 10, 384 << 10),
        "libvirt's balloon counts the base memory only"
    );
    let onlined = daemon.wait_until(
        "the guest uses what was plugged",
        Duration::from_secs(30),
        |s| vm(s, "v").and_then(|v| mib(v, "guest_free")) > Some(400.0),
    );
    let diagnostics = &onlined["decision"]["diagnostics"];
    assert!(
        !diagnostics.to_string().contains("memory_not_onlined"),
        "the guest onlined what was plugged: {diagnostics}"
    );

    // Below the base memory: everything unplugged, the balloon takes the rest.
    std::fs::write(&policy, fixed_policy(200)).unwrap();
    daemon.reload();
    daemon.wait_until(
        "the domain shrinks through virtio-mem and the balloon",
        Duration::from_secs(60),
        |s| sized(s, "v", 0.0, 200.0),
    );
    let (actual, requested) = libvirt_sizes(&libvirtd, "v");
    assert_eq!(requested, 0);
    assert!(actual.abs_diff(200 << 10) < 4 << 10, "balloon {actual} KiB");
}

#[test]
#[ignore = "starts libvirtd and boots a real guest; run by scripts/test.sh"]
fn a_dimm_attached_live_is_followed() {
    let dir = tempfile::tempdir().unwrap();
    let cgroup = TestCgroup::create("memtide-libvirt-dimm");
    // 256 MiB, and room for a 128 MiB DIMM attached live, as oVirt hot-plugs memory; the
    // guest onlines it movable.
    let domain = Domain {
        mem_mib: 256,
        dimm_room_mib: 128,
        append: "memhp_default_state=online_movable",
        ..Domain::default()
    };
    let (libvirtd, daemon, policy) = under_fixed_policy(dir.path(), &cgroup, "d", &domain, 200);
    let at = |configured: f64, want: f64| {
        move |s: &Value| {
            vm(s, "d").is_some_and(|v| {
                mib(v, "configured") == Some(configured) && (actual_mib(s, "d") - want).abs() < 4.0
            })
        }
    };
    daemon.wait_until(
        "the domain at 200 MiB",
        Duration::from_secs(60),
        at(256.0, 200.0),
    );

    // The DIMM attached, the policy's 360 MiB then above what memtide knew of the domain:
    // within a minute of samples memtide reads its XML again, sizes it at 384 MiB and
    // gives it 360 through the balloon, which works on the DIMM too.
    let dimm = dir.path().join("dimm.xml");
    std::fs::write(
        &dimm,
        "<memory model='dimm'><target><size unit='MiB'>128</size><node>0</node></target></memory>",
    )
    .unwrap();
    let path = dimm.display().to_string();
    libvirtd
        .virsh(&["attach-device", "d", &path, "--live"])
        .unwrap();
    std::fs::write(&policy, fixed_policy(360)).unwrap();
    daemon.reload();
    daemon.wait_until(
        "the domain sized with its DIMM and at 360 MiB",
        Duration::from_secs(120),
        at(384.0, 360.0),
    );
    let resized = daemon.said("d", "memory_resized");
    assert_eq!(resized.len(), 1, "the change said once: {resized:?}");
}

#[test]
#[ignore = "starts libvirtd and boots a real guest; run by scripts/test.sh"]
fn a_min_set_in_the_metadata_live_is_followed() {
    let dir = tempfile::tempdir().unwrap();
    let cgroup = TestCgroup::create("memtide-libvirt-metadata");
    let domain = Domain {
        mem_mib: 256,
        ..Domain::default()
    };
    let (libvirtd, daemon, _) = under_fixed_policy(dir.path(), &cgroup, "m", &domain, 160);
    let at = |min: f64, want: f64| {
        move |s: &Value| {
            vm(s, "m").is_some_and(|v| {
                mib(v, "min") == Some(min) && (actual_mib(s, "m") - want).abs() < 4.0
            })
        }
    };
    daemon.wait_until(
        "the domain at 160 MiB, the default min",
        Duration::from_secs(60),
        at(128.0, 160.0),
    );
    // The operator raises its min in memtide's metadata while it runs: within 60 samples
    // (a minute at this test's interval) memtide reads the live XML again and holds the
    // domain at 224 MiB, above what the policy asks.
    libvirtd
        .virsh(&[
            "metadata",
            "m",
            "urn:memtide:limits:1",
            "--key",
            "memtide",
            "--set",
            "<limits min_mib='224'/>",
            "--live",
        ])
        .unwrap();
    daemon.wait_until(
        "the domain at its new min, 224 MiB",
        Duration::from_secs(120),
        at(224.0, 224.0),
    );
}

#[test]
fn a_bad_libvirt_uri_is_rejected_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("memtide.toml");
    std::fs::write(
        &path,
        "[libvirt]\nuris = [\"qemu:///system\", \"system\"]\n",
    )
    .unwrap();
    let out = memtide().arg("check-config").arg(&path).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("libvirt.uris[1]: \"system\" is not a libvirt URI"),
        "{err}"
    );
}
