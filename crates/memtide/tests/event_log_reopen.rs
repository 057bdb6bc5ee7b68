//! An event log that cannot be reopened on reload: the answer says so, nothing more goes
//! to the file logrotate moved away, and writing resumes once the path is writable again.

mod support;

use std::path::Path;
use std::time::Duration;
use support::cli::{stderr, stdout};
use support::daemon::memtide;

/// Fake /proc and /sys trees in `root`, and a configuration for them.
fn fake_host(root: &Path) {
    support::cli::fake_host(root);
    let config = format!(
        "interval_s = 0.2\n[host]\nproc = {:?}\nsys = {:?}\n[discovery]\nqmp_glob = []\n\
         [daemon]\nsocket = {:?}\nevent_log = {:?}\nstate_file = \"\"\nhttp = \"\"\n",
        root.join("proc"),
        root.join("sys"),
        root.join("memtide.sock"),
        root.join("log/events.jsonl"),
    );
    std::fs::write(root.join("memtide.toml"), config).unwrap();
}

#[test]
fn a_failed_reopen_is_answered_and_nothing_more_goes_to_the_moved_log() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    fake_host(root);
    let mut daemon = memtide()
        .args(["run", "--config"])
        .arg(root.join("memtide.toml"))
        .spawn()
        .unwrap();
    let socket = root.join("memtide.sock");
    let reload = || {
        memtide()
            .args(["reload", "--socket"])
            .arg(&socket)
            .output()
            .unwrap()
    };
    let log = root.join("log/events.jsonl");
    let rotated = root.join("log/events.jsonl.2");
    let started = || {
        std::fs::read_to_string(&log)
            .ok()
            .filter(|t| t.contains("\"kind\":\"started\""))
    };
    assert!(support::wait_for(Duration::from_secs(10), started).is_some());
    assert!(support::wait_for(Duration::from_secs(10), || socket.exists().then_some(())).is_some());

    // The operator's mistake: the log moved away, a directory in its place.
    std::fs::rename(&log, &rotated).unwrap();
    std::fs::create_dir(&log).unwrap();
    let o = reload();
    let answer = stdout(&o);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        answer.contains("policy memtide loaded")
            && answer.contains(&format!(
                "the event log {} could not be reopened: Is a directory",
                log.display()
            ))
            && answer.contains("memtide_write_errors_total{file=\"event_log\"}"),
        "{answer}"
    );
    // Taken all the same, the host's doing rather than the file's: memtide would not
    // start again from the configuration in force either, and the answer says so.
    assert!(
        answer.contains("nor from the configuration in force")
            && answer.contains("a directory: name a file"),
        "{answer}"
    );
    let status = || {
        let o = memtide()
            .args(["status", "--json", "--socket"])
            .arg(&socket)
            .output()
            .unwrap();
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let counted = || {
        let lost = status()["counters"]["write_errors"]["event_log"].as_u64();
        lost.filter(|n| *n >= 1)
    };
    assert!(
        support::wait_for(Duration::from_secs(10), counted).is_some(),
        "{}",
        status()
    );
    let moved = std::fs::read_to_string(&rotated).unwrap();
    assert!(!moved.contains("policy_reloaded"), "{moved}");

    // Writable again: the next event opens it.
    std::fs::remove_dir(&log).unwrap();
    let o = reload();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        !stdout(&o).contains("could not be reopened"),
        "{}",
        stdout(&o)
    );
    support::signal(daemon.id(), "TERM");
    assert!(daemon.wait().unwrap().success());
    let after = std::fs::read_to_string(&log).unwrap();
    assert!(
        after.contains("\"kind\":\"policy_reloaded\"") && after.contains("\"kind\":\"stopped\""),
        "{after}"
    );
    assert_eq!(std::fs::read_to_string(&rotated).unwrap(), moved);
}
