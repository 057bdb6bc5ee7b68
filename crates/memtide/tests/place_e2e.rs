//! Page placement between two NUMA nodes on a real kernel (#12 item 2): a test guest
//! boots the idle-tracking kernel (guest/build-idle-kernel.sh, built with NUMA and page
//! migration) with two NUMA nodes, the second memory-only, and runs coldalloc — a cold
//! buffer written once, a hot one written over and over, each a mapping of its own —
//! and `memtide place` (memtide's binary on a data disk) moves its pages between the
//! nodes with move_pages(2). Where the pages are is read from `/proc/PID/numa_maps`
//! (pages per node of each mapping: `N0=`, `N1=`; Documentation/filesystems/proc.rst).
//!
//! Boots a guest under TCG, so it is ignored by a plain `cargo test`; `scripts/test.sh`
//! runs it.

mod support;

use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;
use support::cgroup::TestCgroup;
use support::guest::Guest;
use support::harness::Agent;
use support::wait_for;

const COLD_MIB: u64 = 96;
const HOT_MIB: u64 = 32;
/// A third of coldalloc's buffers.
const BUDGET_MIB: u64 = (COLD_MIB + HOT_MIB) / 3;
const RATE_MIB_S: u64 = 32;
const INTERVALS: usize = 14;
const PAGES_PER_MIB: u64 = 256;

/// Pages on each node of the process's mapping of `mib` MiB starting at an address
/// found in `maps`, from `numa_maps`.
fn nodes_of(maps: &str, numa_maps: &str, mib: u64) -> BTreeMap<u32, u64> {
    let start = maps
        .lines()
        .find_map(|l| {
            let (range, rest) = l.split_once(' ')?;
            let (a, b) = range.split_once('-')?;
            let (a, b) = (
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
            );
            (rest.starts_with("rw-p") && b - a == mib << 20).then(|| format!("{a:x} "))
        })
        .unwrap_or_else(|| panic!("no {mib} MiB mapping in\n{maps}"));
    let line = numa_maps
        .lines()
        .find(|l| l.starts_with(&start))
        .unwrap_or_else(|| panic!("no {start} in\n{numa_maps}"));
    line.split_whitespace()
        .filter_map(|w| {
            let (node, pages) = w.strip_prefix('N')?.split_once('=')?;
            Some((node.parse().ok()?, pages.parse().ok()?))
        })
        .collect()
}

#[test]
#[ignore = "boots a real QEMU guest; run by scripts/test.sh"]
fn hot_pages_end_on_the_fast_node_and_the_fast_node_holds_the_budget() {
    let kernel = support::idle_kernel();
    let dir = tempfile::tempdir().unwrap();
    let image = support::data_disk(dir.path(), "");
    let cgroup = TestCgroup::create("memtide-place");
    let drive = format!("if=none,id=data,file={},format=raw", image.display());
    // Node 0 with the CPU, node 1 memory-only (as tiers_e2e boots it, without the HMAT:
    // under TCG both are as fast, and placement is what is measured here).
    let args = [
        "-drive",
        &drive,
        "-device",
        "virtio-blk-pci,drive=data,serial=memtide-data",
        "-object",
        "memory-backend-ram,id=m0,size=256M",
        "-object",
        "memory-backend-ram,id=m1,size=128M",
        "-numa",
        "node,nodeid=0,cpus=0,memdev=m0",
        "-numa",
        "node,nodeid=1,memdev=m1",
    ];
    let mut guest = Guest::boot_kernel("p", dir.path(), &cgroup.procs(), &kernel, 384, &args);
    guest.wait_console("memtide-guest: ready", 1, Duration::from_secs(180));
    let mut agent = Agent::connect(guest.agent());
    assert_eq!(
        agent.run_sh(
            "grep -qx 0-1 /sys/devices/system/node/has_memory",
            Duration::from_secs(10)
        ),
        0,
        "two NUMA nodes with memory:\n{}",
        guest.console()
    );
    let pid = agent.spawn_sh(&format!(
        "exec /bin/coldalloc --cold-mib {COLD_MIB} --hot-mib {HOT_MIB} --interval-s 1 \
         > /tmp/cold.log 2>&1"
    ));
    let written = "grep -q cold_resident_mib /tmp/cold.log";
    wait_for(Duration::from_secs(60), || {
        (agent.run_sh(written, Duration::from_secs(10)) == 0).then_some(())
    })
    .expect("coldalloc wrote its buffers");
    let maps = agent.read_file(&format!("/proc/{pid}/maps"));
    let numa = |agent: &mut Agent| {
        let numa_maps = agent.read_file(&format!("/proc/{pid}/numa_maps"));
        (
            nodes_of(&maps, &numa_maps, HOT_MIB),
            nodes_of(&maps, &numa_maps, COLD_MIB),
        )
    };
    let on = |nodes: &BTreeMap<u32, u64>, n: u32| nodes.get(&n).copied().unwrap_or(0);
    let hot_pages = HOT_MIB * PAGES_PER_MIB;
    let memtide = support::GUEST_MEMTIDE;
    let place = |agent: &mut Agent, fast: u32, slow: u32, budget: u64, log: &str| {
        let run = format!(
            "{memtide} place --config /data/memtide.toml --pid {pid} --fast-node {fast} \
             --slow-node {slow} --budget-mib {budget} --interval-s 1 --rate-mib-s {RATE_MIB_S} \
             --count {INTERVALS} > {log} 2>&1"
        );
        let status = agent.run_sh(&run, Duration::from_secs(300));
        let text = agent.read_file(log);
        eprintln!("{text}");
        assert_eq!(status, 0, "memtide place: {text}");
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
            .collect();
        assert_eq!(lines.len(), INTERVALS, "{text}");
        lines
    };

    // First touch put everything on node 0, the CPU's.
    let (hot, cold) = numa(&mut agent);
    eprintln!("first touch: hot {hot:?}, cold {cold:?}");
    assert!(on(&hot, 0) * 100 >= hot_pages * 95, "hot {hot:?}");
    // Set up the opposite: node 1 taken as the fast one, with a budget of twice the hot
    // buffer, so the pages accessed (the hot buffer) are promoted to it and nothing is
    // demoted.
    place(&mut agent, 1, 0, 2 * HOT_MIB, "/tmp/setup.log");
    let (hot, cold) = numa(&mut agent);
    eprintln!("set up: hot {hot:?}, cold {cold:?}");
    assert!(
        on(&hot, 1) * 100 >= hot_pages * 95,
        "hot buffer on node 1: {hot:?}"
    );
    assert!(
        on(&cold, 0) * 100 >= COLD_MIB * PAGES_PER_MIB * 95,
        "cold {cold:?}"
    );

    // Now node 0 is the fast one, with a third of the memory: the cold buffer must
    // leave it, the hot one come back.
    let lines = place(&mut agent, 0, 1, BUDGET_MIB, "/tmp/place.log");
    let (hot, cold) = numa(&mut agent);
    let cold_log = agent.read_file("/tmp/cold.log");
    eprintln!(
        "placed: hot {hot:?}, cold {cold:?}; {}",
        cold_log.lines().last().unwrap_or("no coldalloc report")
    );
    let sum = |key: &str| lines.iter().map(|l| l[key].as_u64().unwrap()).sum::<u64>();
    let (demoted, promoted, failed) = (sum("demoted"), sum("promoted"), sum("failed"));
    // Converged: the interval after which nothing more moved.
    let last_move = lines
        .iter()
        .rposition(|l| l["demoted"].as_u64() != Some(0) || l["promoted"].as_u64() != Some(0))
        .expect("pages moved");
    assert!(
        last_move + 3 < INTERVALS,
        "still moving at the end:\n{lines:?}"
    );
    let converged_s = lines[last_move]["t"].as_f64().unwrap();
    eprintln!(
        "converged at {converged_s} s; moved {demoted} pages down ({} MiB), {promoted} up \
         ({} MiB), {failed} not moved",
        demoted / PAGES_PER_MIB,
        promoted / PAGES_PER_MIB
    );
    assert!(
        on(&hot, 0) * 100 >= hot_pages * 95,
        "the hot buffer on the fast node: {hot:?}"
    );
    // The fast node holds the budget at most, a page of the process counted there being a
    // page of the budget: coldalloc's two buffers here (its heap, stacks and static data
    // are placed too, and count). The decision demotes to the budget exactly, in whole
    // pages, so beyond it there can be only pages the kernel did not move.
    let fast = on(&hot, 0) + on(&cold, 0);
    assert!(
        fast <= BUDGET_MIB * PAGES_PER_MIB + failed,
        "{fast} pages of the buffers on the fast node, budget {BUDGET_MIB} MiB"
    );
    let last = lines.last().unwrap();
    let fast_total = last["nodes"]["0"].as_u64().unwrap();
    assert!(
        fast_total <= BUDGET_MIB * PAGES_PER_MIB + failed,
        "{last}: beyond the budget"
    );
    assert!(
        promoted >= hot_pages * 95 / 100,
        "{promoted} pages promoted"
    );
}
