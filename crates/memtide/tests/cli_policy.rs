//! `memtide policy check`/`eval` and the policy settings as a MOM user meets them.

mod support;

use support::cli::{run_in, stderr, stdout};

/// A temporary directory holding `files`.
fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        let path = dir.path().join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    dir
}

#[test]
fn policy_eval_prints_the_debug_lines_of_a_failed_evaluation_before_the_error() {
    let dir = dir_with(&[
        ("dbg.policy", "(debug \"before the error\")\n(/ 1 0)\n"),
        ("empty.json", "{}"),
    ]);
    for format in ["text", "json"] {
        let o = run_in(
            dir.path(),
            &[
                "policy",
                "eval",
                "dbg.policy",
                "--input",
                "empty.json",
                "--format",
                format,
            ],
        );
        assert_eq!(o.status.code(), Some(1), "{format}");
        let err = stderr(&o);
        assert!(
            err.starts_with("debug: dbg.policy:1: before the error\n"),
            "{format}: {err}"
        );
        assert!(!stdout(&o).contains("debug"), "{format}: {}", stdout(&o));
    }
}

#[test]
fn policy_eval_refuses_an_input_that_is_no_snapshot_object() {
    let dir = dir_with(&[("d.policy", "1\n"), ("list.json", "[]"), ("n.json", "5")]);
    for input in ["list.json", "n.json"] {
        let o = run_in(
            dir.path(),
            &["policy", "eval", "d.policy", "--input", input],
        );
        assert!(!o.status.success(), "{input}");
        assert_eq!(
            stderr(&o),
            format!(
                "memtide: {input}: not a snapshot: a JSON object with \"host\" and \"guests\" \
                 expected\n"
            )
        );
    }
}

#[test]
fn policy_eval_prints_debug_lines_on_stderr_in_text_format_too() {
    let dir = dir_with(&[("d.policy", "(debug \"x\" 1)\n")]);
    let o = run_in(
        dir.path(),
        &["policy", "eval", "d.policy", "--format", "text"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "form 1: 1\n");
    assert_eq!(stderr(&o), "debug: d.policy:1: x 1\n");
}

#[test]
fn policy_check_reports_every_broken_file() {
    let dir = dir_with(&[
        ("a.policy", "(defvar x 1"),
        ("b.policy", "(defvar y 2)\n)"),
        ("c.policy", "(defvar z 3)"),
    ]);
    let o = run_in(
        dir.path(),
        &["policy", "check", "a.policy", "b.policy", "c.policy"],
    );
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("a.policy:1:1: unclosed '('"), "{err}");
    assert!(err.contains("b.policy:2:1: unexpected ')'"), "{err}");
    assert!(!err.contains("c.policy"), "{err}");
}

#[test]
fn policy_check_refuses_calls_that_fail_whenever_they_run() {
    for (text, error) in [
        (
            "(with Guests guest (guest.Contol \"balloon_target\" 1))",
            "p.policy:1:20: unknown method 'Contol'",
        ),
        (
            "(with Guests guest (guest.Control \"balloon_targt\" 1))",
            "p.policy:1:35: unknown control 'balloon_targt'",
        ),
        (
            "(Host.Control \"vcpu_quota\" 1)",
            "p.policy:1:15: unknown control 'vcpu_quota'",
        ),
        (
            "(def f (a b) 1)(f 1)",
            "p.policy:1:16: 'f' takes 2 arguments, got 1",
        ),
        ("(+ 1 2 3)", "p.policy:1:1: '+' takes 2 arguments, got 3"),
        ("(abs)", "p.policy:1:1: 'abs' takes 1 argument, got 0"),
    ] {
        let dir = dir_with(&[("p.policy", text)]);
        let o = run_in(dir.path(), &["policy", "check", "p.policy"]);
        assert_eq!(o.status.code(), Some(1), "{text}");
        assert!(stderr(&o).starts_with(error), "{text}: {}", stderr(&o));
        let config = "policy = \"p.policy\"\n";
        std::fs::write(dir.path().join("memtide.toml"), config).unwrap();
        let o = run_in(dir.path(), &["check-config", "--no-host", "memtide.toml"]);
        assert_eq!(o.status.code(), Some(1), "{text}: {}", stdout(&o));
        assert!(stderr(&o).contains(error), "{text}: {}", stderr(&o));
    }
}

#[test]
fn policy_eval_without_input_notes_it_only_where_it_may_be_the_cause() {
    let note = "note: evaluated without --input";
    let dir = dir_with(&[
        ("type.policy", "(+ 1 \"a\")"),
        ("nil.policy", "(+ Host.mem_free 1)"),
    ]);
    let o = run_in(dir.path(), &["policy", "eval", "type.policy"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(!stderr(&o).contains(note), "{}", stderr(&o));
    let o = run_in(dir.path(), &["policy", "eval", "nil.policy"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains(note), "{}", stderr(&o));
}

#[test]
fn policy_eval_warns_of_control_values_the_daemon_refuses() {
    let dir = dir_with(&[
        (
            "c.policy",
            "(Host.Control \"ksm_run\" 7)\n(with Guests g (g.Control \"balloon_target\" -1024))\n",
        ),
        ("in.json", r#"{"guests": [{"props": {"name": "vm1"}}]}"#),
    ]);
    let o = run_in(
        dir.path(),
        &[
            "policy", "eval", "c.policy", "--input", "in.json", "--format", "text",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("vm1.balloon_target = -1024"),
        "{}",
        stdout(&o)
    );
    assert_eq!(
        stderr(&o),
        "warning: Host: ksm_run: 7 is out of range (0, 1 or 2); the daemon would drop the \
         whole KSM proposal\nwarning: vm1: balloon_target: -1024 is negative; the daemon \
         would not apply it\n"
    );
}

#[test]
fn a_policy_named_as_an_existing_file_or_directory_is_loaded() {
    let dir = dir_with(&[
        // MOM's own extension.
        ("balloon.rules", "(defvar x 1)\n"),
        ("vdsm/10-a.policy", "(defvar a 1)\n"),
        ("vdsm/20-b.policy", "(set a (+ a 1))\n"),
        ("vdsm/.hidden.policy", "("),
    ]);
    for policy in ["balloon.rules", "vdsm", "vdsm/"] {
        std::fs::write(
            dir.path().join("memtide.toml"),
            format!("policy = {policy:?}\n"),
        )
        .unwrap();
        let o = run_in(dir.path(), &["check-config", "--no-host", "memtide.toml"]);
        assert!(o.status.success(), "{policy}: {}", stderr(&o));
    }
    let o = run_in(dir.path(), &["policy", "check", "vdsm"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "vdsm/10-a.policy, vdsm/20-b.policy: ok\n");
    let o = run_in(dir.path(), &["policy", "eval", "vdsm"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // Neither a built-in nor there.
    std::fs::write(
        dir.path().join("memtide.toml"),
        "policy = \"ballon.rules\"\n",
    )
    .unwrap();
    let o = run_in(dir.path(), &["check-config", "--no-host", "memtide.toml"]);
    // 2: a configuration error.
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains(
            "unknown policy \"ballon.rules\": no built-in policy has that name (memtide, mom,"
        ) && err.contains("and there is no such file or directory"),
        "{err}"
    );
}

#[test]
fn policy_and_policy_dir_together_are_refused() {
    let dir = dir_with(&[("d/a.policy", "(defvar a 1)\n")]);
    std::fs::write(
        dir.path().join("memtide.toml"),
        "policy = \"mom\"\npolicy_dir = \"d\"\n",
    )
    .unwrap();
    let o = run_in(dir.path(), &["check-config", "--no-host", "memtide.toml"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("policy_dir: set policy or policy_dir, not both"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn log_lines_carry_their_syslog_priority_only_on_the_journal_s_stream() {
    use std::os::unix::fs::MetadataExt;
    let dir = dir_with(&[("dbg.policy", "(debug \"hello\")\n")]);
    let log = dir.path().join("stderr");
    let other = dir.path().join("other");
    std::fs::write(&other, "").unwrap();
    let id = |p: &std::path::Path| {
        let m = std::fs::metadata(p).unwrap();
        format!("{}:{}", m.dev(), m.ino())
    };
    for (stream, prefixed) in [(&log, true), (&other, false)] {
        let file = std::fs::File::create(&log).unwrap();
        // A policy file is first evaluated MOM's interval (10 s, 10 ticks) after the start.
        let status = support::daemon::memtide()
            .current_dir(dir.path())
            .args(["sim", "quick", "--ticks", "11", "--policy", "dbg.policy"])
            .args(["--log-level", "debug"])
            .env("JOURNAL_STREAM", id(stream))
            .stdout(std::process::Stdio::null())
            .stderr(file)
            .status()
            .unwrap();
        assert!(status.success());
        let text = std::fs::read_to_string(&log).unwrap();
        let first = text.lines().next().unwrap_or_default();
        assert!(first.contains("hello"), "{text}");
        assert_eq!(first.starts_with("<7>"), prefixed, "{text}");
        // The error that ends a command, written by memtide itself, is one too.
        let file = std::fs::File::create(&log).unwrap();
        let status = support::daemon::memtide()
            .current_dir(dir.path())
            .args(["sim", "no-such-scenario"])
            .env("JOURNAL_STREAM", id(stream))
            .stderr(file)
            .status()
            .unwrap();
        assert!(!status.success());
        let text = std::fs::read_to_string(&log).unwrap();
        assert_eq!(text.starts_with("<3>memtide: "), prefixed, "{text}");
    }
}
