//! End to end: an operator raises a VM's floor in the configuration file and reloads
//! (`memtide reload`, as SIGHUP does): the running daemon gives the guest its new
//! minimum at the next tick, without a restart, and says where its bounds come from.
//!
//! Boots one guest under TCG, so ignored by a plain `cargo test`; `scripts/test.sh`
//! builds the guest and runs it.

mod support;

use std::time::Duration;
use support::cgroup::TestCgroup;
use support::daemon::{actual_mib, ample_config, mib, vm, Daemon};
use support::guest::Guest;

const GUEST_MIB: u64 = 384;
/// The floor the operator raises the idle guest to.
const MIN_MIB: u64 = 320;

#[test]
#[ignore = "boots a QEMU guest; run by scripts/test.sh"]
fn a_reload_gives_a_vm_its_new_minimum_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cgroup = TestCgroup::create("memtide-reload");
    let mut guest = Guest::boot("g", dir.path(), &cgroup.procs(), GUEST_MIB, "", "");
    guest.wait_console("memtide-guest: ready", 1, Duration::from_secs(120));

    let config = ample_config(&cgroup.dir, "", &[("g", guest.qmp(), guest.agent())]);
    let daemon = Daemon::start(dir.path(), &config, 0);
    // Idle, it gives back the free memory it does not use.
    let taken = daemon.wait_until(
        "the idle guest ballooned well below its new floor",
        Duration::from_secs(90),
        |s| actual_mib(s, "g") < MIN_MIB as f64 - 64.0,
    );
    eprintln!(
        "before: {:.0} MiB ({})",
        actual_mib(&taken, "g"),
        vm(&taken, "g").unwrap()["reason"]
    );

    // The operator's edit: the VM's own minimum, nothing else.
    let file = dir.path().join("memtide.toml");
    let text = std::fs::read_to_string(&file).unwrap();
    let entry = "name = \"g\"\n";
    assert!(text.contains(entry), "{text}");
    let text = text.replace(entry, &format!("{entry}min_mib = {MIN_MIB}\n"));
    std::fs::write(&file, text).unwrap();
    daemon.reload();
    let raised = daemon.wait_until(
        "the guest at its new minimum",
        Duration::from_secs(30),
        |s| actual_mib(s, "g") >= MIN_MIB as f64 - 1.0,
    );
    let g = vm(&raised, "g").unwrap();
    assert_eq!(mib(g, "min"), Some(MIN_MIB as f64), "{g}");
    let from = raised["sampling"]
        .as_array()
        .and_then(|vms| vms.iter().find(|v| v["name"] == "g"))
        .map(|v| v["bounds_from"]["min"].clone());
    assert_eq!(from, Some("config".into()), "{raised}");
    // The reload said nothing waits for a restart.
    let reloaded = daemon
        .event_log()
        .into_iter()
        .find(|e| e["kind"] == "policy_reloaded")
        .expect("a policy_reloaded event");
    let said = reloaded["message"].as_str().unwrap_or_default();
    assert!(!said.contains("not applied"), "{said}");
}
