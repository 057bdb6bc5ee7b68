//! Memory tiers read from a real kernel (#12): a test guest booted with two NUMA nodes,
//! the second memory-only and, in its firmware's HMAT, three times as far as the first;
//! its sysfs and procfs files are copied out through the guest agent and read by the
//! same code that reads the host's.
//!
//! Boots a guest under TCG, so it is ignored by a plain `cargo test`; `scripts/test.sh`
//! runs it.

mod support;

use memtide_adapters::tiers;
use memtide_core::Bytes;
use std::time::Duration;
use support::cgroup::TestCgroup;
use support::guest::Guest;
use support::harness::Agent;

/// The files memtide reads, copied out in one go: `@@ PATH` before each one's content.
const DUMP: &str = "cd / && for f in sys/devices/system/node/has_memory \
    sys/devices/system/node/has_cpu sys/devices/system/node/node*/meminfo \
    sys/devices/system/node/node*/access0/initiators/read_* \
    sys/devices/virtual/memory_tiering/memory_tier*/nodelist \
    sys/module/zswap/parameters/enabled sys/module/zswap/parameters/compressor \
    sys/module/zswap/parameters/max_pool_percent proc/meminfo; do \
    [ -f \"$f\" ] && echo \"@@ $f\" && cat \"$f\"; done > /tiers.txt";

#[test]
#[ignore = "boots a real QEMU guest; run by scripts/test.sh"]
fn a_guest_with_a_far_memory_only_node_shows_its_tiers() {
    let dir = tempfile::tempdir().unwrap();
    let cgroup = TestCgroup::create("memtide-tiers");
    let numa = [
        "-object",
        "memory-backend-ram,id=m0,size=256M",
        "-object",
        "memory-backend-ram,id=m1,size=128M",
        "-machine",
        "hmat=on",
        "-numa",
        "node,nodeid=0,cpus=0,memdev=m0",
        "-numa",
        "node,nodeid=1,memdev=m1,initiator=0",
        "-numa",
        "hmat-lb,initiator=0,target=0,hierarchy=memory,data-type=access-latency,latency=80",
        "-numa",
        "hmat-lb,initiator=0,target=0,hierarchy=memory,data-type=access-bandwidth,bandwidth=20G",
        "-numa",
        "hmat-lb,initiator=0,target=1,hierarchy=memory,data-type=access-latency,latency=240",
        "-numa",
        "hmat-lb,initiator=0,target=1,hierarchy=memory,data-type=access-bandwidth,bandwidth=5G",
    ];
    let mut guest = Guest::boot_with("t", dir.path(), &cgroup.procs(), "384", "", "", &numa, "");
    guest.wait_console("memtide-guest: ready", 1, Duration::from_secs(120));
    let mut agent = Agent::connect(guest.agent());
    assert_eq!(agent.run_sh(DUMP, Duration::from_secs(30)), 0);
    let dump = agent.read_file("/tiers.txt");
    let root = tempfile::tempdir().unwrap();
    for block in dump.split("@@ ").filter(|b| !b.is_empty()) {
        let (path, content) = block.split_once('\n').unwrap();
        let path = root.path().join(path.trim());
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }
    let t = tiers::read(&root.path().join("sys"), &root.path().join("proc"));
    eprintln!("{t:#?}");
    let [near, far] = &t.nodes[..] else {
        panic!("two nodes with memory: {t:?}\n{dump}");
    };
    assert!(near.cpus && !far.cpus, "node 1 is memory-only");
    // The kernel keeps some of the 384 MiB for itself, and where the boundary between
    // the nodes falls moves by some MiB from boot to boot (seen: 219 + 126, 251 + 94).
    let both = near.total + far.total;
    assert!(
        both > Bytes::from_mib(300) && both <= Bytes::from_mib(384),
        "{t:?}"
    );
    assert!(
        far.total > Bytes::from_mib(64) && near.total > far.total,
        "{t:?}"
    );
    assert!(far.free <= far.total);
    // The firmware's figures, as the kernel reports them (HMAT): ns and MB/s.
    assert_eq!(
        (near.read_latency_ns, far.read_latency_ns),
        (Some(80), Some(240))
    );
    assert_eq!(far.read_bandwidth_mbps, Some(5120));
    // Linux 6.1 ranks every node in the DRAM tier; HMAT-based tiers came in 6.7.
    assert!(near.tier.is_some() && far.tier >= near.tier, "{t:?}");
}
