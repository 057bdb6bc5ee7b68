//! End to end: a real guest that lies through its own guest agent takes nothing from an
//! honest neighbour. The liar's `liar` workload binds a file over its /proc/meminfo that
//! says all its memory is in use and committed and its swap full; Debian's qemu-ga reads
//! it for memtide. The host (QEMU's resident memory) sees it touch little.
//!
//! Boots two guests under TCG (about a minute), so ignored by a plain `cargo test`;
//! `scripts/test.sh` builds the guest and runs it.

mod support;

use serde_json::Value;
use std::time::Duration;
use support::cgroup::TestCgroup;
use support::daemon::{actual_mib, mib, vm, Daemon};
use support::guest::Guest;
use support::tmux::Screen;

const GUEST_MIB: u64 = 384;
/// Anonymous memory the honest guest's workload keeps touching.
const WORKLOAD_MIB: u64 = 160;

fn unbacked(status: &Value) -> Vec<&Value> {
    status["decision"]["diagnostics"]
        .as_array()
        .map(|d| d.iter().filter(|d| d["kind"] == "unbacked_claim").collect())
        .unwrap_or_default()
}

#[test]
#[ignore = "boots QEMU guests; run by scripts/test.sh"]
fn a_guest_lying_through_its_agent_takes_nothing_from_its_honest_neighbour() {
    let dir = tempfile::tempdir().unwrap();
    let cgroup = TestCgroup::create("memtide-liar");
    let procs = cgroup.procs();
    let honest_args = format!("{WORKLOAD_MIB}:100000");
    let mut honest = Guest::boot(
        "honest",
        dir.path(),
        &procs,
        GUEST_MIB,
        "memknobs",
        &honest_args,
    );
    let mut liar = Guest::boot("liar", dir.path(), &procs, GUEST_MIB, "liar", "");
    honest.wait_console("memtide-guest: ready", 1, Duration::from_secs(120));
    honest.wait_console("mib_per_s=", 2, Duration::from_secs(120));
    liar.wait_console("claimed_available_mib=", 2, Duration::from_secs(120));

    // The host is declared short (memtide probes and divides at once) and the honest
    // guest, which an operator weighs more, has three times the liar's shares.
    let port = support::free_port();
    let config = format!(
        "interval_s = 1\npolicy = \"memtide\"\n\
         [host]\ndomain_cgroup = {:?}\n\
         [discovery]\nqmp_glob = []\n\
         [engine]\nksm_control = false\n\
         [memtide]\nample_free = 1.01\nshort_free = 1.01\n\
         [[vm]]\nname = \"honest\"\nqmp = {:?}\nagent = {:?}\nshares = 3000\n\
         [[vm]]\nname = \"liar\"\nqmp = {:?}\nagent = {:?}\n",
        cgroup.dir.display().to_string(),
        honest.qmp().display().to_string(),
        honest.agent().display().to_string(),
        liar.qmp().display().to_string(),
        liar.agent().display().to_string(),
    );
    let daemon = Daemon::start(dir.path(), &config, port);
    let seen = daemon.wait_until("both guests managed", Duration::from_secs(60), |s| {
        ["honest", "liar"]
            .iter()
            .all(|n| vm(s, n).is_some_and(|v| v["state"] == "managed"))
    });
    // The liar's agent says it needs everything: 1% available.
    let liar_free = mib(vm(&seen, "liar").unwrap(), "guest_available").unwrap_or(f64::NAN);
    eprintln!("liar reports {liar_free:.0} MiB available");

    // Contention: the domain can hold the honest guest's working set and the liar's real
    // use with little to spare, not the liar's claim.
    let usage = cgroup.usage() - cgroup.file_cache();
    let limit = (usage as f64 / 0.97) as u64;
    eprintln!(
        "domain usage {} MiB: limit {} MiB",
        usage >> 20,
        limit >> 20
    );
    cgroup.set_limit(limit);

    let found = daemon.wait_until(
        "the liar's claim contradicted by the host",
        Duration::from_secs(90),
        |s| unbacked(s).iter().any(|d| d["vm"] == "liar"),
    );
    let message = unbacked(&found)[0]["message"].to_string();
    eprintln!("{message}");
    assert!(
        unbacked(&found).iter().all(|d| d["vm"] == "liar"),
        "only the liar is reported: {:?}",
        unbacked(&found)
    );

    // Once found out, its claim no longer holds its memory: it is brought down towards
    // what the host backs and its fair share, and the honest guest keeps its working set.
    let settled = daemon.wait_until(
        "the liar brought below its claim",
        Duration::from_secs(60),
        |s| {
            // Both agents answered this tick (one may time out on a loaded host).
            let answered = |n| vm(s, n).is_some_and(|v| mib(v, "committed_as").is_some());
            actual_mib(s, "liar") < GUEST_MIB as f64 * 0.8 && answered("honest") && answered("liar")
        },
    );
    // The honest guest keeps at least what its programs have committed; the liar, which
    // claims more than its whole size committed, is held to what the host sees it use
    // and a share of what is left.
    let (h, l) = (
        vm(&settled, "honest").unwrap(),
        vm(&settled, "liar").unwrap(),
    );
    let honest_committed = mib(h, "committed_as").unwrap();
    let honest_target = mib(h, "target").unwrap();
    let liar_claim = mib(l, "committed_as").unwrap();
    eprintln!(
        "honest: committed {honest_committed:.0} MiB, target {honest_target:.0} MiB; \
         liar: claims {liar_claim:.0} MiB committed, target {:.0} MiB",
        mib(l, "target").unwrap_or(f64::NAN)
    );
    assert!(
        liar_claim > GUEST_MIB as f64,
        "the liar's agent claims more than its size committed: {liar_claim}"
    );
    assert!(
        honest_target >= honest_committed,
        "the honest guest keeps what it committed: {honest_target} MiB of {honest_committed} ({})",
        h["reason"]
    );
    // And it stays found out beyond the grace period: squeezed to what the host backs, it
    // claims all it holds and the host backs all of it, which proves nothing (it was once
    // believed again there, grew back to its full size and pushed the honest guest below
    // its commitment).
    // Counted, so that a status that never answers, or an honest agent that never does,
    // cannot let the watch pass unchecked: most rounds must have checked each guest.
    let until = std::time::Instant::now() + Duration::from_secs(30);
    let (mut rounds, mut liar_checked, mut honest_checked) = (0u32, 0u32, 0u32);
    while std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_secs(1));
        rounds += 1;
        let Some(s) = daemon.try_status() else {
            continue;
        };
        let (h, l) = (vm(&s, "honest").unwrap(), vm(&s, "liar").unwrap());
        assert!(
            actual_mib(&s, "liar") < GUEST_MIB as f64 * 0.8,
            "the liar stays below its claim: {}",
            l["reason"]
        );
        liar_checked += 1;
        if let (Some(target), Some(committed)) = (mib(h, "target"), mib(h, "committed_as")) {
            assert!(
                target >= committed,
                "the honest guest keeps what it committed: {target} MiB of {committed} ({})",
                h["reason"]
            );
            honest_checked += 1;
        }
    }
    eprintln!(
        "stays found out: {rounds} rounds, the liar checked in {liar_checked}, the honest \
         guest in {honest_checked}"
    );
    assert!(
        liar_checked * 4 >= rounds * 3,
        "the liar checked in only {liar_checked} of {rounds} rounds (no status in the others)"
    );
    assert!(
        honest_checked * 2 > rounds,
        "the honest guest checked in only {honest_checked} of {rounds} rounds (no target or \
         committed figure in the others)"
    );
    let metrics = support::http_get(port, "/metrics");
    assert!(
        metrics.contains("memtide_diagnostics_total{kind=\"unbacked_claim\"}"),
        "the lie is counted in the metrics"
    );
    // Every family the shipped dashboard and alert rules query is on a live /metrics.
    let queried = support::families_queried(&[
        "contrib/grafana/memtide.json",
        "contrib/prometheus/memtide-alerts.yml",
    ]);
    assert!(queried.len() >= 15, "{queried:?}");
    for family in queried {
        assert!(
            metrics.lines().any(|l| l
                .strip_prefix(family.as_str())
                .is_some_and(|rest| rest.starts_with(['{', ' ']))),
            "{family} is queried but not on /metrics:\n{metrics}"
        );
    }
    let logged = daemon
        .event_log()
        .into_iter()
        .filter(|e| e.to_string().contains("unbacked_claim"))
        .count();
    assert!(logged >= 1, "the lie is in the event log");
    assert!(
        logged <= 3,
        "a condition is logged when it starts, not every tick: {logged} events"
    );

    // The live view shows both VMs with the rule of their last decision, filters by name,
    // sorts, and quits on q.
    let command = format!(
        "{} top --socket {}",
        env!("CARGO_BIN_EXE_memtide"),
        daemon.socket.display()
    );
    let screen = Screen::start(&command, 160, 30);
    let table = |text: &str, name: &str| text.lines().any(|l| l.starts_with(&format!("│{name} ")));
    let both = screen.wait_until("both VMs", |t| table(t, "honest") && table(t, "liar"));
    assert!(
        both.contains("memtide.") && both.contains("ACTUAL"),
        "{both}"
    );
    screen.keys(&["/", "lia", "Enter"]);
    let filtered = screen.wait_until("the filtered table", |t| {
        table(t, "liar") && !table(t, "honest") && t.contains("filter: lia")
    });
    assert!(
        filtered.contains(" liar "),
        "the selected VM's detail: {filtered}"
    );
    screen.keys(&["s"]);
    screen.wait_until("the next sort key", |t| t.contains("s sort (estimate)"));
    screen.keys(&["q"]);
    assert!(
        support::wait_for(Duration::from_secs(5), || screen.ended().then_some(())).is_some(),
        "q quits: {}",
        screen.text()
    );
}
