//! Proactive reclaim on a real kernel (#12 item 3): this host has cgroup v1, so a test
//! guest (Debian's 6.1 kernel: cgroup v2 memory, PSI, `memory.reclaim`, a swap disk)
//! runs a process standing in for QEMU — coldalloc: a cold buffer written once, a hot
//! one written over and over — in a cgroup v2 of its own, and memtide's own binary
//! (`memtide reclaim`, the daemon's pacing and I/O) reclaims from that cgroup. The
//! binary and the libraries it links reach the guest on a data disk.
//!
//! Boots a guest under TCG, so it is ignored by a plain `cargo test`; `scripts/test.sh`
//! runs it.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;
use support::cgroup::TestCgroup;
use support::guest::Guest;
use support::harness::Agent;
use support::wait_for;

const COLD_MIB: u64 = 120;
const HOT_MIB: u64 = 32;
/// `[reclaim] floor_mib` in the guest's configuration: with the hot set given as the
/// working set, reclaim never takes the cgroup below HOT_MIB + FLOOR_MIB.
const FLOOR_MIB: u64 = 16;
const MIB: u64 = 1 << 20;

/// An ext2 image holding memtide's binary (debug info stripped), the shared libraries
/// it links against (the guest runs it through their loader) and its configuration.
fn data_disk(dir: &Path) -> std::path::PathBuf {
    let root = dir.join("data");
    let lib = root.join("lib");
    std::fs::create_dir_all(&lib).unwrap();
    let memtide = env!("CARGO_BIN_EXE_memtide");
    let ok = Command::new("objcopy")
        .args(["--strip-debug", memtide])
        .arg(root.join("memtide"))
        .status()
        .unwrap();
    assert!(ok.success(), "objcopy --strip-debug {memtide}");
    let ldd = Command::new("ldd").arg(memtide).output().unwrap();
    let ldd = String::from_utf8(ldd.stdout).unwrap();
    for path in ldd.split_whitespace().filter(|w| w.starts_with('/')) {
        let name = Path::new(path).file_name().unwrap();
        std::fs::copy(path, lib.join(name)).unwrap();
    }
    std::fs::write(
        root.join("memtide.toml"),
        format!("[reclaim]\nstep_pct_per_s = 10\nfloor_mib = {FLOOR_MIB}\n"),
    )
    .unwrap();
    let size: u64 = walk(&root);
    let image = dir.join("data.img");
    let ok = Command::new("mke2fs")
        .args(["-q", "-t", "ext2", "-b", "4096", "-d"])
        .arg(&root)
        .arg(&image)
        .arg(format!("{}M", size / MIB * 5 / 4 + 16))
        .status()
        .unwrap();
    assert!(ok.success(), "mke2fs -d {}", root.display());
    image
}

fn walk(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            if m.is_dir() {
                walk(&e.path())
            } else {
                m.len()
            }
        })
        .sum()
}

/// A mapping's `Rss` and `Swap` (bytes) in a smaps text, found by its size.
fn mapping(smaps: &str, size_mib: u64) -> Option<(u64, u64)> {
    let want = format!("Size: {} kB", size_mib * 1024);
    let mut lines = smaps.lines();
    lines.find(|l| l.split_whitespace().collect::<Vec<_>>().join(" ") == want)?;
    // The mapping's fields, up to the next mapping's address line.
    let fields: Vec<&str> = lines
        .take_while(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|k| k.ends_with(':'))
        })
        .collect();
    let field = |name: &str| -> Option<u64> {
        let l = fields.iter().find(|l| l.starts_with(name))?;
        let kib: u64 = l.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    };
    Some((field("Rss:")?, field("Swap:")?))
}

#[test]
#[ignore = "boots a real QEMU guest; run by scripts/test.sh"]
fn reclaim_pushes_a_cold_buffer_to_swap_and_keeps_the_hot_one_and_the_floor() {
    let dir = tempfile::tempdir().unwrap();
    let image = data_disk(dir.path());
    let cgroup = TestCgroup::create("memtide-reclaim");
    let drive = format!("if=none,id=data,file={},format=raw", image.display());
    let devices = [
        "-drive",
        &drive,
        "-device",
        "virtio-blk-pci,drive=data,serial=memtide-data",
    ];
    let mut guest = Guest::boot_with(
        "r",
        dir.path(),
        &cgroup.procs(),
        "384",
        "",
        "",
        &devices,
        "",
    );
    guest.wait_console("memtide-guest: ready", 1, Duration::from_secs(120));
    assert!(guest.console().contains("on /data"), "{}", guest.console());
    let mut agent = Agent::connect(guest.agent());
    let setup = "mount -t cgroup2 none /sys/fs/cgroup && \
                 echo +memory > /sys/fs/cgroup/cgroup.subtree_control && \
                 mkdir /sys/fs/cgroup/vm";
    assert_eq!(agent.run_sh(setup, Duration::from_secs(30)), 0);
    let pid = agent.spawn_sh(&format!(
        "echo $$ > /sys/fs/cgroup/vm/cgroup.procs && exec /bin/coldalloc --cold-mib {COLD_MIB} \
         --hot-mib {HOT_MIB} --interval-s 1 > /tmp/cold.log 2>&1"
    ));
    wait_for(Duration::from_secs(60), || {
        agent
            .read_file("/tmp/cold.log")
            .contains("cold_resident_mib")
            .then_some(())
    })
    .expect("coldalloc wrote its buffers");
    let before = agent.read_file(&format!("/proc/{pid}/smaps"));
    let (cold_rss_before, _) = mapping(&before, COLD_MIB).expect("the cold mapping");
    assert!(
        cold_rss_before >= (COLD_MIB - 4) * MIB,
        "cold all resident first"
    );
    // Watch the cgroup's usage apart from memtide, twice a second.
    agent.spawn_sh(
        "while :; do cat /sys/fs/cgroup/vm/memory.current >> /tmp/usage; usleep 500000; done",
    );
    let memtide = "/data/lib/ld-linux-x86-64.so.2 --library-path /data/lib /data/memtide";
    let run = format!(
        "{memtide} reclaim --config /data/memtide.toml --pid {pid} --working-set-mib {HOT_MIB} \
         --interval-s 1 --ticks 40 > /tmp/reclaim.log 2>&1"
    );
    let status = agent.run_sh(&run, Duration::from_secs(240));
    let log = agent.read_file("/tmp/reclaim.log");
    eprintln!("{log}");
    assert_eq!(status, 0, "memtide reclaim: {log}");
    assert!(!log.contains("error"), "{log}");
    let asked: u64 = log
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.strip_prefix("asked="))
        .map(|n| n.parse::<u64>().unwrap())
        .sum();
    assert!(log.contains("result=ok reclaim.probe"), "{log}");

    let after = agent.read_file(&format!("/proc/{pid}/smaps"));
    let (cold_rss, cold_swap) = mapping(&after, COLD_MIB).expect("the cold mapping");
    let (hot_rss, hot_swap) = mapping(&after, HOT_MIB).expect("the hot mapping");
    let status = agent.read_file(&format!("/proc/{pid}/status"));
    let vm_line = |k: &str| {
        status
            .lines()
            .find(|l| l.starts_with(k))
            .unwrap_or("")
            .to_string()
    };
    let usage: Vec<u64> = agent
        .read_file("/tmp/usage")
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    let least = *usage.iter().min().expect("usage watched");
    let cold_log = agent.read_file("/tmp/cold.log");
    eprintln!(
        "asked {} MiB; cold {} -> {} MiB resident, {} MiB swapped; hot {} MiB resident, {} \
         MiB swapped; {} {}; cgroup usage {} -> least {} MiB ({} readings)\n{}",
        asked / MIB,
        cold_rss_before / MIB,
        cold_rss / MIB,
        cold_swap / MIB,
        hot_rss / MIB,
        hot_swap / MIB,
        vm_line("VmRSS"),
        vm_line("VmSwap"),
        usage[0] / MIB,
        least / MIB,
        usage.len(),
        cold_log
            .lines()
            .rev()
            .take(3)
            .collect::<Vec<_>>()
            .join("\n"),
    );
    assert!(
        cold_swap >= COLD_MIB * MIB / 2,
        "at least half the cold buffer went to swap: {} MiB",
        cold_swap / MIB
    );
    assert!(
        hot_rss >= (HOT_MIB - 2) * MIB,
        "the hot buffer stays resident: {} MiB",
        hot_rss / MIB
    );
    // memory.reclaim reclaims in batches of 32 pages: it may overshoot by that much.
    let keep = (HOT_MIB + FLOOR_MIB) * MIB;
    assert!(
        least + MIB >= keep,
        "usage {} MiB went below the working set and floor, {} MiB",
        least / MIB,
        keep / MIB
    );
}
