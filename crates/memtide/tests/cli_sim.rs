//! `memtide sim` as a capacity planner meets it: what a failing policy, a single
//! `--compare`, clashing report folders, a bad `--out` and a closed pipe do.

use std::path::Path;
use std::process::{Command, Output, Stdio};

/// `memtide ARGS` run in `dir`.
fn run_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memtide"))
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn a_policy_failing_every_tick_is_said_not_passed_off_as_doing_nothing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("bad.policy"), "(+ 1 \"a\")\n").unwrap();
    let o = run_in(
        dir.path(),
        &[
            "sim",
            "quick",
            "--ticks",
            "5",
            "--compare",
            "none",
            "bad.policy",
        ],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let table = text(&o.stdout);
    assert!(
        table.contains("warning: policy bad.policy failed in 5 of 5 ticks")
            && table.contains("bad.policy:1:"),
        "{table}"
    );
    let o = run_in(
        dir.path(),
        &["sim", "quick", "--ticks", "5", "--policy", "bad.policy"],
    );
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(summary["policy_errors"]["ticks"], 5);
    assert!(text(&o.stderr).contains("warning: policy bad.policy failed in 5 of 5 ticks"));
    // A policy that works says nothing of errors.
    let o = run_in(
        dir.path(),
        &["sim", "quick", "--ticks", "5", "--policy", "mom"],
    );
    assert!(
        !text(&o.stdout).contains("policy_errors"),
        "{}",
        text(&o.stdout)
    );
}

#[test]
fn compare_of_one_policy_writes_a_comparison_and_folders_do_not_clash() {
    let dir = tempfile::tempdir().unwrap();
    let o = run_in(
        dir.path(),
        &[
            "sim",
            "quick",
            "--ticks",
            "5",
            "--compare",
            "mom",
            "--out",
            "one",
        ],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).starts_with("policy "),
        "{}",
        text(&o.stdout)
    );
    assert!(dir.path().join("one/compare.json").exists());
    assert!(dir.path().join("one/mom/summary.json").exists());
    // Two files whose reports would share a folder.
    std::fs::create_dir(dir.path().join("a")).unwrap();
    std::fs::write(dir.path().join("a/b.policy"), "1\n").unwrap();
    std::fs::write(dir.path().join("a_b.policy"), "1\n").unwrap();
    let o = run_in(
        dir.path(),
        &[
            "sim",
            "quick",
            "--compare",
            "a/b.policy",
            "a_b.policy",
            "--out",
            "o",
        ],
    );
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(
        err.contains("a/b.policy and a_b.policy would both write their report to DIR/a_b.policy"),
        "{err}"
    );
}

#[test]
fn an_out_that_is_a_file_is_refused_before_the_runs() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("afile"), "").unwrap();
    let o = run_in(
        dir.path(),
        &["sim", "quick", "--compare", "none", "mom", "--out", "afile"],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("--out afile: not a folder"),
        "{}",
        text(&o.stderr)
    );
    assert!(o.stdout.is_empty(), "nothing ran: {}", text(&o.stdout));
}

#[test]
fn a_reader_that_goes_away_is_no_crash_and_the_report_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_memtide"))
        .current_dir(dir.path())
        .args(["sim", "quick", "--ticks", "5", "--out", "pt"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // `| true`: the reader is gone before the summary
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(!text(&o.stderr).contains("panicked"), "{}", text(&o.stderr));
    assert!(dir.path().join("pt/summary.json").exists());
}

#[test]
fn density_runs_with_one_policy_and_no_report_takes_the_comparison_s_file() {
    let dir = tempfile::tempdir().unwrap();
    for args in [&["--policy", "none"][..], &[]] {
        let o = run_in(
            dir.path(),
            &[&["sim", "quick", "--ticks", "20", "--density"][..], args].concat(),
        );
        assert!(o.status.success(), "{args:?}: {}", text(&o.stderr));
        assert!(
            text(&o.stdout).starts_with("policy      VMs admitted"),
            "{}",
            text(&o.stdout)
        );
    }
    std::fs::write(dir.path().join("compare.json"), "1\n").unwrap();
    let o = run_in(
        dir.path(),
        &[
            "sim",
            "quick",
            "--compare",
            "none",
            "compare.json",
            "--out",
            "o",
        ],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("compare.json would write its report to DIR/compare.json"),
        "{}",
        text(&o.stderr)
    );
    assert!(!dir.path().join("o").exists(), "refused before the runs");
}
