//! virtio-mem and free page reporting on real guests, through the daemon.
//!
//! Boots guests, so ignored by a plain `cargo test`; `scripts/test.sh` runs it.

mod support;

use serde_json::{json, Value};
use std::time::Duration;
use support::cgroup::TestCgroup;
use support::daemon::{fixed_policy, mib, vm, Daemon};
use support::guest::Guest;
use support::harness::Qmp;

/// A 256 MiB guest that can grow by 512 MiB through virtio-mem.
const VIRTIO_MEM: [&str; 6] = [
    "-object",
    "memory-backend-ram,id=vmem0,size=512M",
    "-device",
    "virtio-mem-pci,id=vmem0dev,memdev=vmem0,node=0,requested-size=0",
    "-device",
    "virtio-balloon-pci,id=balloon0,deflate-on-oom=on",
];

fn diagnosed(status: &Value, name: &str, kind: &str) -> bool {
    status["decision"]["diagnostics"]
        .as_array()
        .is_some_and(|d| d.iter().any(|x| x["vm"] == name && x["kind"] == kind))
}

/// A configuration managing `vms` (each with its `min_mib`, if any) through their QMP
/// sockets under a policy giving every guest `mib`, written to `dir/fixed.policy` and
/// evaluated at every tick (not at MOM's pace: the guests' workloads run on a clock);
/// returns the policy's path (to rewrite it and reload) and the configuration.
fn fixed_config(
    dir: &std::path::Path,
    mib: u64,
    vms: &[(&Guest, Option<u64>)],
) -> (std::path::PathBuf, String) {
    let policy = dir.join("fixed.policy");
    std::fs::write(&policy, fixed_policy(mib)).unwrap();
    let vms: String = vms
        .iter()
        .map(|(g, min)| {
            let qmp = g.qmp().display().to_string();
            let min = min.map_or(String::new(), |m| format!("min_mib = {m}\n"));
            format!("[[vm]]\nname = {:?}\nqmp = {qmp:?}\n{min}", g.name)
        })
        .collect();
    let config = format!(
        "interval_s = 1\npolicy = {:?}\n[discovery]\nqmp_glob = []\n[engine]\nksm_control = false\n\
         [mom]\ninterval_s = 0\nsample_interval_s = 0\n{vms}",
        policy.display().to_string()
    );
    (policy, config)
}

#[test]
#[ignore = "boots real QEMU guests; run by scripts/test.sh"]
fn virtio_mem_resizes_and_free_page_reporting_returns_memory() {
    let dir = tempfile::tempdir().unwrap();
    let cgroup = TestCgroup::create("memtide-devices");
    let procs = cgroup.procs();
    let online = "memhp_default_state=online_movable";
    let mut hot = Guest::boot_with(
        "hot",
        dir.path(),
        &procs,
        "256M,maxmem=1G",
        "",
        "",
        &VIRTIO_MEM,
        online,
    );
    // Booted without memhp_default_state: what gets plugged is never onlined.
    let mut cold = Guest::boot_with(
        "cold",
        dir.path(),
        &procs,
        "256M,maxmem=1G",
        "",
        "",
        &VIRTIO_MEM,
        "",
    );
    // Free page reporting: the workload holds 200 MiB for 25 s, then 16 MiB.
    let fpr_balloon = [
        "-device",
        "virtio-balloon-pci,id=balloon0,free-page-reporting=on",
    ];
    let mut fpr = Guest::boot_with(
        "fpr",
        dir.path(),
        &procs,
        "384",
        "memknobs",
        "200:25,16:100000",
        &fpr_balloon,
        "",
    );
    for g in [&mut hot, &mut cold, &mut fpr] {
        g.wait_console("memtide-guest: ready", 1, Duration::from_secs(120));
    }

    // The policy gives every guest the same size; the FPR guest's floor keeps it whole.
    let (policy, config) = fixed_config(
        dir.path(),
        640,
        &[(&hot, Some(128)), (&cold, Some(128)), (&fpr, Some(384))],
    );
    let daemon = Daemon::start(dir.path(), &config, support::free_port());

    // Growing past the base memory plugs whole blocks: 640 − 256 = 384 MiB.
    let grown = daemon.wait_until(
        "the guests grow through virtio-mem",
        Duration::from_secs(60),
        |s| {
            ["hot", "cold"].iter().all(|n| {
                vm(s, n).is_some_and(|v| {
                    mib(v, "plugged") == Some(384.0)
                        && (mib(v, "actual").unwrap_or(0.0) - 640.0).abs() < 4.0
                })
            })
        },
    );
    assert_eq!(
        mib(vm(&grown, "hot").unwrap(), "configured"),
        Some(768.0),
        "base + virtio-mem maximum"
    );
    let not_onlined = daemon.wait_until(
        "unonlined memory is reported",
        Duration::from_secs(30),
        |s| diagnosed(s, "cold", "memory_not_onlined"),
    );
    assert!(
        !diagnosed(&not_onlined, "hot", "memory_not_onlined"),
        "the guest booted with online_movable uses it: {:#}",
        not_onlined["decision"]
    );

    // Shrinking unplugs what is above 300 MiB; the balloon keeps the rest exact.
    std::fs::write(&policy, fixed_policy(300)).unwrap();
    daemon.reload();
    daemon.wait_until(
        "the guest shrinks through virtio-mem",
        Duration::from_secs(60),
        |s| {
            vm(s, "hot").is_some_and(|v| {
                mib(v, "plugged") == Some(44.0)
                    && (mib(v, "actual").unwrap_or(0.0) - 300.0).abs() < 4.0
            })
        },
    );

    // Free page reporting: once the workload frees its 200 MiB, QEMU's resident memory
    // falls without any balloon, and the guest keeps its full size.
    let busy = daemon.wait_until(
        "the workload holds its memory",
        Duration::from_secs(60),
        |s| {
            vm(s, "fpr").is_some_and(|v| {
                v["free_page_reporting"] == true && mib(v, "rss").unwrap_or(0.0) > 200.0
            })
        },
    );
    let peak = mib(vm(&busy, "fpr").unwrap(), "rss").unwrap();
    fpr.wait_console("phase=2", 1, Duration::from_secs(60));
    let freed = daemon.wait_until(
        "freed pages go back to the host",
        Duration::from_secs(60),
        |s| vm(s, "fpr").is_some_and(|v| mib(v, "rss").unwrap_or(f64::MAX) < peak - 120.0),
    );
    let fpr_now = vm(&freed, "fpr").unwrap();
    assert_eq!(mib(fpr_now, "actual"), Some(384.0), "no balloon was needed");

    // QEMU's own memory (heap, TCG's translation cache) is told apart from guest RAM with
    // a virtio-mem device too, its backend's mapping left out beside the base memory's:
    // read within a minute of the VM being found (each VM's first read is staggered by
    // its pid: checked last, so that the workloads' phases above are not waited past).
    let told = daemon.wait_until(
        "QEMU's own memory is read beside the virtio-mem device",
        Duration::from_secs(90),
        |s| vm(s, "hot").is_some_and(|v| v["hypervisor_own"].is_u64()),
    );
    let own = mib(vm(&told, "hot").unwrap(), "hypervisor_own").unwrap();
    assert!(
        own > 0.0 && own < 100.0,
        "QEMU's own memory {own} MiB: not its guest RAM"
    );
    drop(daemon);
}

#[test]
#[ignore = "boots real QEMU guests; run by scripts/test.sh"]
fn a_guest_whose_memory_is_locked_is_left_unmanaged() {
    // QEMU's `-overcommit mem-lock=on` locks all guest RAM, as VFIO's pinning does for a
    // passthrough device: a balloon would free nothing for the host (#14).
    let dir = tempfile::tempdir().unwrap();
    let cgroup = TestCgroup::create("memtide-locked");
    let procs = cgroup.procs();
    let locked = [
        "-device",
        memtide_testbed::BALLOON,
        "-overcommit",
        "mem-lock=on",
    ];
    let mut pinned = Guest::boot_with("pinned", dir.path(), &procs, "256", "", "", &locked, "");
    let mut plain = Guest::boot("plain", dir.path(), &procs, 256, "", "");
    for g in [&mut pinned, &mut plain] {
        g.wait_console("memtide-guest: ready", 1, Duration::from_secs(120));
    }
    let (_, config) = fixed_config(dir.path(), 160, &[(&pinned, None), (&plain, None)]);
    let daemon = Daemon::start(dir.path(), &config, support::free_port());
    let status = daemon.wait_until(
        "the plain guest is resized, the locked one left alone",
        Duration::from_secs(60),
        |s| {
            vm(s, "plain").is_some_and(|v| (mib(v, "actual").unwrap_or(0.0) - 160.0).abs() < 4.0)
                && diagnosed(s, "pinned", "fixed_memory")
        },
    );
    let v = vm(&status, "pinned").unwrap();
    assert_eq!(v["state"], "unmanaged", "{v:#}");
    assert_eq!(v["reason"]["rule"], "safeguard.fixed_memory", "{v:#}");
    let detail = v["reason"]["detail"].as_str().unwrap();
    assert!(detail.contains("locked or pinned"), "{detail}");
    assert_eq!(mib(v, "actual"), Some(256.0), "its balloon never moved");
    let events = daemon.event_log();
    assert!(
        !events
            .iter()
            .any(|e| e["vm"] == "pinned" && e["kind"] == "action"),
        "no action for the locked guest"
    );
    drop(daemon);
}

#[test]
#[ignore = "boots a real QEMU guest; run by scripts/test.sh"]
fn a_guest_given_memory_back_has_its_ram_collapsed_into_huge_pages_again() {
    // The balloon takes memory in 4 KiB pages, splitting QEMU's huge pages around them;
    // given back, it is faulted in again 4 KiB at a time as the guest writes. The daemon
    // collapses the resident 2 MiB ranges again ([host] restore_huge_pages, on by
    // default) within a minute of the balloon growing.
    let dir = tempfile::tempdir().unwrap();
    let cgroup = TestCgroup::create("memtide-hugepages");
    let mut guest = Guest::boot(
        "g",
        dir.path(),
        &cgroup.procs(),
        384,
        "memknobs",
        "32:30,200:100000",
    );
    guest.wait_console("memtide-guest: ready", 1, Duration::from_secs(120));
    let (policy, config) = fixed_config(dir.path(), 160, &[(&guest, Some(128))]);
    let port = support::free_port();
    let daemon = Daemon::start(dir.path(), &config, port);
    let at = |want: f64| {
        move |s: &Value| {
            vm(s, "g").is_some_and(|v| (mib(v, "actual").unwrap_or(0.0) - want).abs() < 4.0)
        }
    };
    daemon.wait_until(
        "the balloon takes memory",
        Duration::from_secs(30),
        at(160.0),
    );
    std::fs::write(&policy, fixed_policy(384)).unwrap();
    daemon.reload();
    daemon.wait_until(
        "the balloon gives it back",
        Duration::from_secs(30),
        at(384.0),
    );
    // The 200 MiB phase writes its buffer into the memory given back.
    guest.wait_console("phase=2", 1, Duration::from_secs(60));
    let restored = |m: &str| {
        m.lines()
            .find_map(|l| l.strip_prefix("memtide_huge_pages_restored_bytes_total "))
            .and_then(|v| v.parse::<f64>().ok())
    };
    let metrics = support::wait_for(Duration::from_secs(60), || {
        let m = support::http_get(port, "/metrics");
        restored(&m)
            .is_some_and(|b| b >= (64 << 20) as f64)
            .then_some(m)
    })
    .unwrap_or_else(|| {
        panic!(
            "no huge pages restored:\n{}",
            support::http_get(port, "/metrics")
        )
    });
    assert!(
        metrics.contains("memtide_actions_total{kind=\"huge_pages\",result=\"ok\"}")
            || metrics.contains("memtide_actions_total{kind=\"huge_pages\",result=\"partly\"}"),
        "{metrics}"
    );
    let events = daemon.event_log();
    let collapsed = events
        .iter()
        .find(|e| {
            e["kind"] == "action"
                && e["vm"] == "g"
                && e["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("huge pages:"))
        })
        .unwrap_or_else(|| panic!("no huge-page action logged: {events:#?}"));
    assert!(
        collapsed["message"]
            .as_str()
            .unwrap()
            .contains("memory had been given back to the guest"),
        "{collapsed}"
    );
    // What QEMU holds in huge pages now covers the workload's buffer.
    let rollup = std::fs::read_to_string(format!("/proc/{}/smaps_rollup", guest.pid())).unwrap();
    let huge_kib: u64 = rollup
        .lines()
        .find_map(|l| l.strip_prefix("AnonHugePages:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap();
    assert!(huge_kib >= 150 * 1024, "AnonHugePages {huge_kib} kB");
    drop(daemon);
}

#[test]
#[ignore = "boots a real QEMU guest; run by scripts/test.sh"]
fn a_virtio_mem_guests_accesses_are_sampled_in_the_devices_memory_too() {
    // 128 MiB of base memory and a 256 MiB virtio-mem device plugged whole, onlined
    // movable: the guest puts its processes' pages there first, so the workload's 200 MiB,
    // written over and over, lies mostly in the device's memory, a second mapping in QEMU
    // beside the base memory's. Host-side access sampling (clear_refs, which sees a TCG
    // guest's accesses) reads both: more referenced than the base memory holds.
    let dir = tempfile::tempdir().unwrap();
    let cgroup = TestCgroup::create("memtide-vmem-access");
    let devices = [
        "-object",
        "memory-backend-ram,id=vmem0,size=256M",
        "-device",
        "virtio-mem-pci,id=vmem0dev,memdev=vmem0,node=0,requested-size=256M",
        "-device",
        "virtio-balloon-pci,id=balloon0",
    ];
    let mut guest = Guest::boot_with(
        "v",
        dir.path(),
        &cgroup.procs(),
        "128M,maxmem=384M",
        "memknobs",
        "200:100000",
        &devices,
        "memhp_default_state=online_movable swiotlb=noforce",
    );
    guest.wait_console("memtide-guest: ready", 1, Duration::from_secs(120));
    guest.wait_console("phase=1", 1, Duration::from_secs(60));
    let rec = dir.path().join("rec");
    let config = format!(
        "interval_s = 1\npolicy = \"memtide\"\n[host]\nsample_access = \"clear_refs\"\n\
         [daemon]\nsocket = {:?}\nevent_log = \"\"\nstate_file = \"\"\nhttp = \"\"\n\
         record_dir = {rec:?}\n[discovery]\nqmp_glob = []\n[engine]\nksm_control = false\n\
         [[vm]]\nname = \"v\"\nqmp = {:?}\n",
        dir.path().join("memtide.sock"),
        guest.qmp(),
    );
    let path = dir.path().join("memtide.toml");
    std::fs::write(&path, config).unwrap();
    let (samples, log) = support::daemon::recorded_dry_run(&path, &rec, 8);
    // The sample names both mappings, for the passes that collapse or place guest RAM.
    let mappings = [128, 256].map(memtide_core::Bytes::from_mib);
    assert!(samples.iter().all(|s| s.ram_mappings == mappings), "{log}");
    let referenced: Vec<f64> = samples
        .iter()
        .filter_map(|s| s.referenced)
        .map(|b| b.0 as f64 / (1 << 20) as f64)
        .collect();
    eprintln!("referenced, MiB: {referenced:?}");
    assert!(referenced.len() >= 5, "{referenced:?}\n{log}");
    // The workload's 200 MiB each window, less what TCG's TLB kept unseen in a window.
    let most = referenced.iter().cloned().fold(0.0, f64::max);
    assert!(
        (160.0..=384.0).contains(&most),
        "{most} MiB referenced at most: the device's memory unseen? {referenced:?}"
    );
}

#[test]
#[ignore = "boots a real QEMU guest; run by scripts/test.sh"]
fn a_guest_with_a_dimm_is_sized_with_it() {
    // 256 MiB of base memory and a 128 MiB DIMM, as Proxmox VE's memory hot-plug builds a
    // VM: QEMU's balloon counts both (its `actual` reads 384 MiB), so the VM's size is
    // 384 MiB and a target of 320 leaves the guest 320, not at most the base memory.
    let dir = tempfile::tempdir().unwrap();
    let cgroup = TestCgroup::create("memtide-dimm");
    let devices = [
        "-object",
        "memory-backend-ram,id=d0,size=128M",
        "-device",
        "pc-dimm,id=dimm0,memdev=d0",
        "-device",
        "virtio-balloon-pci,id=balloon0,deflate-on-oom=on",
    ];
    let mut guest = Guest::boot_with(
        "dimm",
        dir.path(),
        &cgroup.procs(),
        "256M,slots=2,maxmem=1G",
        "",
        "",
        &devices,
        // Movable, so that the guest can give a DIMM up again.
        "memhp_default_state=online_movable",
    );
    guest.wait_console("memtide-guest: ready", 1, Duration::from_secs(120));
    let (policy, config) = fixed_config(dir.path(), 320, &[(&guest, Some(128))]);
    let daemon = Daemon::start(dir.path(), &config, support::free_port());
    let at = |want: f64| {
        move |s: &Value| {
            vm(s, "dimm").is_some_and(|v| {
                mib(v, "configured") == Some(384.0)
                    && (mib(v, "actual").unwrap_or(0.0) - want).abs() < 4.0
            })
        }
    };
    daemon.wait_until(
        "the balloon leaves 320 MiB",
        Duration::from_secs(60),
        at(320.0),
    );
    std::fs::write(&policy, fixed_policy(384)).unwrap();
    daemon.reload();
    daemon.wait_until(
        "the guest has all of it",
        Duration::from_secs(60),
        at(384.0),
    );

    // A second DIMM plugged while the VM runs, as Proxmox VE adds memory: the VM's size
    // grows with it, and so does the balloon's `actual` (it holds no page): the policy's
    // 384 MiB is sent again, and a target above the size known before is met.
    let mut qmp = Qmp::connect(guest.harness_qmp());
    let backend = json!({"qom-type": "memory-backend-ram", "id": "d1", "size": 128u64 << 20});
    qmp.execute("object-add", Some(backend)).unwrap();
    let dimm = json!({"driver": "pc-dimm", "id": "dimm1", "memdev": "d1"});
    qmp.execute("device_add", Some(dimm)).unwrap();
    let sized = |configured: f64, want: f64| {
        move |s: &Value| {
            vm(s, "dimm").is_some_and(|v| {
                mib(v, "configured") == Some(configured)
                    && (mib(v, "actual").unwrap_or(0.0) - want).abs() < 4.0
            })
        }
    };
    daemon.wait_until(
        "the VM is sized with the DIMM plugged",
        Duration::from_secs(30),
        sized(512.0, 384.0),
    );
    std::fs::write(&policy, fixed_policy(480)).unwrap();
    daemon.reload();
    daemon.wait_until(
        "the guest has 480 MiB",
        Duration::from_secs(60),
        sized(512.0, 480.0),
    );

    // The DIMM unplugged again (the guest offlines its memory, QEMU says DEVICE_DELETED):
    // the VM's size falls back to 384 MiB, and the policy's 480, now above it, is sent
    // again as the whole VM. QEMU's balloon kept the 32 MiB it held for the old target;
    // without the event followed, the size would stay 512 and the 32 MiB stay held.
    qmp.execute("device_del", Some(json!({"id": "dimm1"})))
        .unwrap();
    daemon.wait_until(
        "the VM is sized without the DIMM",
        Duration::from_secs(60),
        sized(384.0, 384.0),
    );

    // The balloon removed too: the VM goes on being sampled, unmanaged (nothing left to
    // resize it with), where every sample failed on query-balloon before.
    qmp.execute("device_del", Some(json!({"id": "balloon0"})))
        .unwrap();
    daemon.wait_until(
        "the VM is sampled without its balloon",
        Duration::from_secs(60),
        |s| vm(s, "dimm").is_some_and(|v| v["state"] == "unmanaged" && v["error"].is_null()),
    );

    // A balloon plugged again (`device_add`, of which QEMU says nothing): memtide reads
    // the VM's devices again within a minute of samples and resizes it with the new one.
    let balloon = json!({"driver": "virtio-balloon-pci", "id": "balloon1"});
    qmp.execute("device_add", Some(balloon)).unwrap();
    std::fs::write(&policy, fixed_policy(320)).unwrap();
    daemon.reload();
    daemon.wait_until(
        "the guest at 320 MiB through the balloon plugged",
        Duration::from_secs(120),
        sized(384.0, 320.0),
    );
    // Each change of the VM's size was said in the event log, once.
    let resized = daemon.said("dimm", "memory_resized");
    assert_eq!(resized.len(), 2, "{resized:?}");
    assert!(resized[0].contains("384 MiB to 512 MiB"), "{resized:?}");
    assert!(resized[1].contains("512 MiB to 384 MiB"), "{resized:?}");
    drop(daemon);
}
