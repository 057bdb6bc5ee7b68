//! Host-side access tracking by DAMON on a real kernel (#12 item 2). Debian's 6.12
//! kernel has DAMON (and no idle page tracking); this host's kdamond is not memtide's
//! and is never touched, so a test guest boots that kernel (`MEMTIDE_GUEST_KERNEL=6.12
//! guest/build.sh`) and runs a process standing in for QEMU — coldalloc: a cold buffer
//! written once, a hot one written over and over — and memtide's own binary
//! (`memtide access --tracker damon`, the tracker the daemon runs on a VM's guest RAM)
//! tracks it with a kdamond of its own. Then a memtide killed while it tracks: the next
//! takes its kdamond back. Last, a kdamond another tool started: memtide refuses DAMON
//! and leaves it as it was.
//!
//! Boots a guest under TCG, so it is ignored by a plain `cargo test`; `scripts/test.sh`
//! runs it.

mod support;

use std::time::Duration;
use support::cgroup::TestCgroup;

const COLD_MIB: u64 = 96;
const HOT_MIB: u64 = 16;
const COLD_AGE_S: u64 = 20;
const INTERVAL_S: u64 = 5;
const SCANS: u64 = 11;
/// By when DAMON's regions have converged on the two buffers (they start as a few large
/// regions, split and merged each aggregation interval) and the pages the early, coarse
/// regions took as accessed have gone untouched for the cold age.
const CONVERGED_S: f64 = (COLD_AGE_S + 2 * INTERVAL_S) as f64;
/// How much of the hot buffer a region at its edge may hide, found idle.
const EDGE_MIB: f64 = 1.0;
const KDAMONDS: &str = "/sys/kernel/mm/damon/admin/kdamonds";
/// Where memtide records its kdamonds.
const RECORD: &str = "/run/memtide/damon-kdamonds.json";

#[test]
#[ignore = "boots a real QEMU guest; run by scripts/test.sh"]
fn damon_finds_the_cold_buffer_cold_and_leaves_another_tools_kdamond_alone() {
    let kernel = support::damon_kernel();
    let dir = tempfile::tempdir().unwrap();
    let cgroup = TestCgroup::create("memtide-damon");
    let (_guest, mut agent) =
        support::guest_with_memtide("a", dir.path(), &cgroup, &kernel, support::DAMON_GUEST_ARGS);
    assert_eq!(
        kdamonds(&mut agent, "nr_kdamonds"),
        "0",
        "the guest kernel has DAMON, and no kdamond yet"
    );
    let pid = support::coldalloc(&mut agent, COLD_MIB, HOT_MIB);
    let args = |tracker: &str| {
        format!(
            "--tracker {tracker} --pid {pid} --cold-age-s {COLD_AGE_S} --interval-s {INTERVAL_S}"
        )
    };
    let scans = support::coldalloc_access(&mut agent, &args("damon"), SCANS, COLD_MIB + HOT_MIB);
    let mut cold_seen = 0;
    for (n, scan) in scans.iter().enumerate() {
        assert_eq!(scan.tracker, "damon", "scan {n}");
        let (t, resident) = (scan.t, scan.resident);
        if let Some(accessed) = scan.accessed {
            // The hot loop writes every hot page many times a scan. DAMON's regions are
            // sampled, a page of each per check, so their edges are approximate: the
            // region holding the hot buffer's edge may be found idle (up to EDGE_MIB of
            // it), and some cold memory may share regions with hot — much of it before
            // the regions converge, an eighth of the cold buffer at most after.
            let hot = HOT_MIB as f64;
            let most = match t < CONVERGED_S {
                true => (COLD_MIB + HOT_MIB) as f64 + 4.0,
                false => hot + COLD_MIB as f64 / 8.0,
            };
            assert!(
                (hot - EDGE_MIB..=most).contains(&accessed),
                "scan {n}: {accessed} MiB accessed, the hot buffer is {HOT_MIB} MiB"
            );
        }
        let cold = scan.cold;
        if t < COLD_AGE_S as f64 {
            assert_eq!(cold, None, "scan {n} at {t} s is before the cold age");
            continue;
        }
        let cold = cold.unwrap_or_else(|| panic!("scan {n} at {t} s: no cold figure"));
        // Never the hot buffer; once converged, most of the cold one.
        let least = match t < CONVERGED_S {
            true => 0.0,
            false => {
                cold_seen += 1;
                COLD_MIB as f64 * 0.9
            }
        };
        assert!(
            (least..=COLD_MIB as f64 + 2.0).contains(&cold),
            "scan {n}: {cold} MiB cold, the cold buffer is {COLD_MIB} MiB"
        );
        assert!(
            resident - cold >= HOT_MIB as f64 - EDGE_MIB,
            "scan {n}: the hot buffer is never cold ({resident} MiB resident, {cold} cold)"
        );
    }
    assert!(
        cold_seen >= 3,
        "{cold_seen} scans past convergence:\n{scans:?}"
    );
    assert_eq!(
        kdamonds(&mut agent, "nr_kdamonds"),
        "0",
        "memtide removes its kdamond when done"
    );

    // A memtide killed while it tracks (SIGKILL: no chance to stop its kdamond) leaves
    // the kdamond running; the next memtide takes it back, as its record names it.
    let killed = agent.spawn_sh(&format!(
        "exec {} > /tmp/killed.log 2>&1",
        support::guest_access_command(&format!("{} --count 1000", args("damon")))
    ));
    // Read in the guest's shell: a read while memtide's command is in flight is refused
    // (EBUSY). Its record kept for later (RECORD: it says the kdamond is on).
    let on = format!(
        "cd {KDAMONDS} && for i in $(seq 120); do \
         [ \"$(cat nr_kdamonds 2>/dev/null)\" = 1 ] && [ \"$(cat 0/state 2>/dev/null)\" = on ] \
         && grep -q '\"growing\":false' {RECORD} && cp {RECORD} /tmp/stale.json && exit 0; \
         sleep 0.5; done; exit 1"
    );
    let status = agent.run_sh(&on, Duration::from_secs(90));
    assert_eq!(status, 0, "{}", agent.read_file("/tmp/killed.log"));
    let kill = format!("kill -9 {killed}");
    assert_eq!(agent.run_sh(&kill, Duration::from_secs(10)), 0, "{kill}");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(kdamonds(&mut agent, "nr_kdamonds"), "1", "left behind");
    assert_eq!(kdamonds(&mut agent, "0/state"), "on", "left running");
    let (status, log) = support::guest_access(&mut agent, &format!("{} --count 2", args("damon")));
    assert_eq!(status, 0, "{log}");
    assert!(
        log.contains(&format!(
            "memtide process {killed} ended without stopping its 1 kdamond(s) on process(es) \
             [{pid}]: stopped and removed"
        )),
        "{log}"
    );
    assert_eq!(
        kdamonds(&mut agent, "nr_kdamonds"),
        "0",
        "the kdamond taken back, and its own removed when done"
    );

    // Another tool's kdamond, on coldalloc too, set up as memtide's was, beside the
    // record the killed memtide left (put back: its owner gone, the count and the process
    // the same): the kdamond's kernel thread is not the one recorded, so it is not taken.
    let stale = format!("mkdir -p /run/memtide && cp /tmp/stale.json {RECORD}");
    assert_eq!(agent.run_sh(&stale, Duration::from_secs(10)), 0, "{stale}");
    let theirs = format!(
        "cd {KDAMONDS} && echo 1 > nr_kdamonds && echo 1 > 0/contexts/nr_contexts && \
         echo vaddr > 0/contexts/0/operations && \
         echo 1 > 0/contexts/0/targets/nr_targets && \
         echo {pid} > 0/contexts/0/targets/0/pid_target && echo on > 0/state"
    );
    assert_eq!(
        agent.run_sh(&theirs, Duration::from_secs(10)),
        0,
        "{theirs}"
    );
    for tracker in ["damon", "auto"] {
        let (status, log) =
            support::guest_access(&mut agent, &format!("{} --count 1", args(tracker)));
        assert_ne!(status, 0, "--tracker {tracker}: {log}");
        assert!(
            log.contains(&format!(
                "{KDAMONDS}/nr_kdamonds is 1, not memtide's 0: another tool uses DAMON, \
                 and memtide never touches a kdamond it did not start"
            )),
            "--tracker {tracker}: {log}"
        );
        if tracker == "auto" {
            // Nor idle page tracking in Debian's kernels: both said.
            assert!(log.contains("CONFIG_IDLE_PAGE_TRACKING"), "{log}");
        }
    }
    assert_eq!(kdamonds(&mut agent, "nr_kdamonds"), "1");
    assert_eq!(kdamonds(&mut agent, "0/state"), "on");
    assert_eq!(
        agent.read_file(RECORD),
        agent.read_file("/tmp/stale.json"),
        "another process's record is left as it was"
    );
    assert_eq!(
        kdamonds(&mut agent, "0/contexts/0/targets/0/pid_target"),
        pid.to_string()
    );
}

/// A file under the guest's DAMON kdamonds directory, trimmed.
fn kdamonds(agent: &mut support::harness::Agent, file: &str) -> String {
    agent
        .read_file(&format!("{KDAMONDS}/{file}"))
        .trim()
        .to_string()
}
