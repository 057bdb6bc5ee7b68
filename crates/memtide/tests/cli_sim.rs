//! `memtide sim` as a capacity planner meets it: what a failing policy, a single
//! `--compare`, clashing report folders, a bad `--out` and a closed pipe do.

mod support;

use std::process::Stdio;
use support::cli::{run_in, stderr, stdout};

#[test]
fn a_policy_failing_at_every_evaluation_is_said_not_passed_off_as_doing_nothing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("bad.policy"), "(+ 1 \"a\")\n").unwrap();
    // Policy files are evaluated at MOM's pace, at 10 s and 20 s of 25 ticks: failing
    // at the first, they stand failed from then.
    let o = run_in(
        dir.path(),
        &[
            "sim",
            "quick",
            "--ticks",
            "25",
            "--compare",
            "none",
            "bad.policy",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let table = stdout(&o);
    assert!(
        table.contains("warning: policy bad.policy failed in 15 of 25 ticks")
            && table.contains("bad.policy:1:"),
        "{table}"
    );
    let o = run_in(
        dir.path(),
        &["sim", "quick", "--ticks", "25", "--policy", "bad.policy"],
    );
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(summary["policy_errors"]["ticks"], 15);
    assert!(stderr(&o).contains("warning: policy bad.policy failed in 15 of 25 ticks"));
    // A policy that works says nothing of errors (mom evaluates first at 10 s).
    let o = run_in(
        dir.path(),
        &["sim", "quick", "--ticks", "15", "--policy", "mom"],
    );
    assert!(!stdout(&o).contains("policy_errors"), "{}", stdout(&o));
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
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).starts_with("policy "), "{}", stdout(&o));
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
    let err = stderr(&o);
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
        stderr(&o).contains("--out afile: not a folder"),
        "{}",
        stderr(&o)
    );
    assert!(o.stdout.is_empty(), "nothing ran: {}", stdout(&o));
}

#[test]
fn a_reader_that_goes_away_is_no_crash_and_the_report_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = support::daemon::memtide()
        .current_dir(dir.path())
        .args(["sim", "quick", "--ticks", "5", "--out", "pt"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // `| true`: the reader is gone before the summary
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
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
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        assert!(
            stdout(&o).starts_with("policy      VMs admitted"),
            "{}",
            stdout(&o)
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
        stderr(&o).contains("compare.json would write its report to DIR/compare.json"),
        "{}",
        stderr(&o)
    );
    assert!(!dir.path().join("o").exists(), "refused before the runs");
}

#[test]
fn the_density_table_keeps_the_order_the_policies_were_given_in() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["sim", "quick", "--ticks", "20", "--density", "--compare"];
    let o = run_in(dir.path(), &[&args[..], &["none", "mom", "esx"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let labels: Vec<String> = stdout(&o)
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    assert_eq!(labels, ["none", "mom", "esx"], "{}", stdout(&o));
}
