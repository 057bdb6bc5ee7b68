//! The command line as a user meets it: help, version, bad configuration, no daemon, and
//! the daemon itself on fake /proc and /sys trees (no VMs; root only for the test that
//! reads page frame numbers, ignored by a plain run).

mod support;

use proptest::prelude::*;
use std::path::Path;
use std::process::Output;
use std::time::Duration;
use support::cli::fake_host;
use support::daemon::memtide;

fn run(args: &[&str]) -> Output {
    memtide().args(args).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Whether the tests run as root (page frame numbers are shown only to CAP_SYS_ADMIN).
fn root() -> bool {
    // SAFETY: geteuid(2) cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn top_without_a_terminal_says_so_instead_of_panicking() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("memtide.sock");
    // Run from cron or `ssh host memtide top` without -t: no terminal on either side.
    let o = memtide()
        .args(["top", "--socket", socket.to_str().unwrap()])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("needs a terminal"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(o.stdout.is_empty(), "nothing drawn: {:?}", o.stdout);
}

#[test]
fn every_subcommand_has_help_and_there_is_a_version() {
    for sub in [
        &["--help"][..],
        &["run", "--help"],
        &["status", "--help"],
        &["check-config", "--help"],
        &["access", "--help"],
    ] {
        let o = run(sub);
        assert!(o.status.success(), "{sub:?}");
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("Usage: memtide"),
            "{sub:?}"
        );
    }
    let help = String::from_utf8_lossy(&run(&["--help"]).stdout).into_owned();
    assert!(help.starts_with("Memory overcommitment manager"), "{help}");
    // The version, and whether this build reaches libvirt (and KubeVirt) VMs.
    let o = run(&["--version"]);
    let libvirt = if cfg!(feature = "libvirt") {
        "with"
    } else {
        "without"
    };
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        format!("memtide {} ({libvirt} libvirt)", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn a_bad_config_is_rejected_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "[mom]\nmax_change = 2.0\n",
            "mom.max_change: 2 is not a ratio between 0 and 1",
        ),
        (
            "[[vm]]\nname = \"db\"\nqmp = \"/x\"\nmin_mib = 900\nmax_mib = 100\n",
            "vm[0].max_mib: 100 is below min_mib 900",
        ),
        ("[daemon]\nsokcet = \"/x\"\n", "unknown field `sokcet`"),
        (
            "interval_s = \"fast\"\n",
            "invalid type: string \"fast\", expected f64",
        ),
    ];
    for (text, expected) in cases {
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, text).unwrap();
        for args in [vec!["run", "--config"], vec!["check-config"]] {
            let mut args: Vec<&str> = args;
            args.push(path.to_str().unwrap());
            let o = run(&args);
            assert_eq!(o.status.code(), Some(2), "{args:?} on {text:?}");
            let err = stderr(&o);
            assert!(
                err.starts_with(&format!("memtide: {}: ", path.display())),
                "{err}"
            );
            assert!(
                err.contains(expected),
                "{args:?}: expected {expected:?} in {err}"
            );
        }
    }
    let o = run(&["check-config", "/no/such/memtide.toml"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr(&o).trim(),
        "memtide: /no/such/memtide.toml: No such file or directory (os error 2)"
    );
}

#[test]
fn status_without_a_daemon_says_so() {
    let o = run(&["status", "--socket", "/nonexistent/memtide.sock"]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains(
            "cannot reach memtide at /nonexistent/memtide.sock (is `memtide run` running?)"
        ),
        "{err}"
    );
}

/// Run the daemon for three ticks on fake trees in `root`, logging events to `events`.
fn run_on_fake_trees(root: &Path, events: &Path) -> std::process::Output {
    run_on_fake_trees_with(root, events, |_| {})
}

/// [`run_on_fake_trees`], with `configure` given the command before it runs.
fn run_on_fake_trees_with(
    root: &Path,
    events: &Path,
    configure: impl FnOnce(&mut std::process::Command),
) -> std::process::Output {
    fake_host(root);
    let config = format!(
        "interval_s = 0.2\n[host]\nproc = {:?}\nsys = {:?}\n[discovery]\nqmp_glob = [{:?}]\n\
         [daemon]\nsocket = {:?}\nevent_log = {:?}\nstate_file = \"\"\nhttp = \"\"\n",
        root.join("proc"),
        root.join("sys"),
        root.join("qmp/*.sock").display().to_string(),
        root.join("memtide.sock"),
        events,
    );
    std::fs::write(root.join("memtide.toml"), config).unwrap();
    let mut cmd = memtide();
    cmd.args(["run", "--ticks", "3", "--config"])
        .arg(root.join("memtide.toml"));
    configure(&mut cmd);
    cmd.output().unwrap()
}

#[test]
fn a_running_ksmtuned_keeps_ksm_and_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("proc/4242")).unwrap();
    std::fs::write(root.join("proc/4242/comm"), "ksmtuned\n").unwrap();
    let o = run_on_fake_trees(root, &root.join("events.jsonl"));
    assert!(o.status.success(), "{}", stderr(&o));
    // The knobs stay as the kernel (and ksmtuned) left them.
    let ksm = |k: &str| std::fs::read_to_string(root.join("sys/kernel/mm/ksm").join(k)).unwrap();
    assert_eq!(
        (ksm("run").trim(), ksm("pages_to_scan").trim()),
        ("0", "100")
    );
    let events = std::fs::read_to_string(root.join("events.jsonl")).unwrap();
    let reported: Vec<serde_json::Value> = events
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["rule"] == "other_manager")
        .collect();
    assert_eq!(reported.len(), 1, "logged once, as a condition: {events}");
    assert!(
        reported[0]["message"]
            .as_str()
            .unwrap()
            .contains("ksmtuned (pid 4242) tunes KSM: memtide leaves KSM to it"),
        "{events}"
    );
}

#[test]
fn problems_are_logged_as_warnings_and_a_log_level_that_is_no_level_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // Another memory manager (a warning-level diagnostic) on the fake host.
    std::fs::create_dir_all(root.join("proc/4242")).unwrap();
    std::fs::write(root.join("proc/4242/comm"), "ksmtuned\n").unwrap();
    let o = run_on_fake_trees_with(root, &root.join("events.jsonl"), |cmd| {
        cmd.args(["--log-level", "warn"]).env_remove("MEMTIDE_LOG");
    });
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("WARN"), "{err}");
    assert!(err.contains("ksmtuned (pid 4242) tunes KSM"), "{err}");
    assert!(!err.contains("started, policy"), "info left out: {err}");
    // A typo of a level is no target to log alone: refused, as a bad MEMTIDE_LOG is.
    for (flag, env) in [(Some("degub"), None), (None, Some("degub"))] {
        let mut cmd = memtide();
        cmd.arg("check-config").arg(root.join("memtide.toml"));
        match (flag, env) {
            (Some(f), _) => cmd.args(["--log-level", f]).env_remove("MEMTIDE_LOG"),
            (_, Some(e)) => cmd.env("MEMTIDE_LOG", e),
            _ => unreachable!(),
        };
        let o = cmd.output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{flag:?} {env:?}");
        let err = stderr(&o);
        assert!(err.contains("\"degub\" is not a level"), "{err}");
    }
    for empty in [" ", ", ,"] {
        let o = run(&["--log-level", empty, "check-config", "x.toml"]);
        assert_eq!(o.status.code(), Some(2));
        let said = format!("--log-level {empty:?}: no level: give one of off, error");
        assert!(stderr(&o).contains(&said), "{}", stderr(&o));
    }
    // Levels in any case or as numbers, target=level filters and memtide's own targets
    // are taken.
    for level in [
        "WARN",
        "3",
        "info,memtide::daemon=debug",
        "memtide_adapters",
    ] {
        let o = run(&[
            "--log-level",
            level,
            "check-config",
            root.join("memtide.toml").to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{level}: {}", stderr(&o));
    }
}

#[test]
fn check_config_refuses_a_sys_that_is_no_sysfs_and_warns_of_a_cgroup_root_without_v2() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    fake_host(root);
    let check = |sys: &Path, extra: &str| {
        let config = root.join("memtide.toml");
        let text = format!(
            "[host]\nproc = {:?}\nsys = {sys:?}\n{extra}",
            root.join("proc")
        );
        std::fs::write(&config, text).unwrap();
        memtide()
            .args(["--log-level", "warn", "check-config"])
            .arg(&config)
            .env_remove("MEMTIDE_LOG")
            .output()
            .unwrap()
    };
    // A typo there reads as a host without KSM: KSM control would be off, unsaid.
    let typo = root.join("sy");
    let o = check(&typo, "");
    assert!(!o.status.success());
    let said = format!(
        "[host] sys = {}: no kernel/mm there: not the host's sysfs",
        typo.display()
    );
    assert!(stderr(&o).contains(&said), "{}", stderr(&o));
    // An event log or state file that is a directory (found by an audit: check-config
    // said ok, then run failed on the one and wrote in vain every tick on the other).
    let sys = root.join("sys");
    for key in ["event_log", "state_file"] {
        let o = check(&sys, &format!("[daemon]\n{key} = {:?}\n", root));
        assert!(!o.status.success());
        let said = format!(
            "[daemon] {key} = {}: a directory: name a file (in it or elsewhere)",
            root.display()
        );
        assert!(stderr(&o).contains(&said), "{}", stderr(&o));
    }
    // A file the daemon writes below a file (found by an audit: check-config said ok,
    // and run failed binding its socket, or "File exists" on its event log; record_dir's
    // own check says it so).
    let blocker = root.join("blocker");
    std::fs::write(&blocker, "").unwrap();
    for key in ["socket", "event_log", "state_file"] {
        let below = blocker.join("deeper").join("file");
        let o = check(&sys, &format!("[daemon]\n{key} = {below:?}\n"));
        assert!(!o.status.success(), "{key}");
        let said = format!(
            "[daemon] {key} = {}: {} is a file, where a directory is needed",
            below.display(),
            blocker.display()
        );
        assert!(stderr(&o).contains(&said), "{}", stderr(&o));
    }
    // Reclaim finding VMs' cgroups under a root that is no cgroup v2: said, not refused
    // (a VM with a reclaim_cgroup of its own does not need it).
    let v1 = root.join("cgroup");
    std::fs::create_dir_all(&v1).unwrap();
    let reclaim = format!("[reclaim]\nvms = \"all\"\ncgroup_root = {v1:?}\n");
    let o = check(&sys, &reclaim);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("no cgroup v2 hierarchy there"),
        "{}",
        stderr(&o)
    );
    std::fs::write(v1.join("cgroup.controllers"), "memory\n").unwrap();
    let o = check(&sys, &reclaim);
    assert!(
        o.status.success() && !stderr(&o).contains("WARN"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn reload_reads_the_configuration_again_and_says_what_waits_for_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    fake_host(root);
    let config = format!(
        "interval_s = 0.2\npolicy = \"memtide\"\n[host]\nproc = {:?}\nsys = {:?}\n\
         [discovery]\nqmp_glob = []\n",
        root.join("proc"),
        root.join("sys"),
    );
    let daemon = support::daemon::Daemon::start(root, &config, support::free_port());
    let policy = |status: &serde_json::Value| status["decision"]["policy"].clone();
    daemon.wait_until("a first decision", Duration::from_secs(10), |s| {
        policy(s) == "memtide"
    });
    let file = root.join("memtide.toml");
    let edit = |from: &str, to: &str| {
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(text.contains(from), "{text}");
        std::fs::write(&file, text.replace(from, to)).unwrap();
    };
    let reload = || {
        memtide()
            .args(["reload", "--socket"])
            .arg(&daemon.socket)
            .output()
            .unwrap()
    };
    // The policy changed, and the interval, which a running daemon keeps.
    edit("policy = \"memtide\"", "policy = \"mom\"");
    edit("interval_s = 0.2", "interval_s = 0.3");
    let o = reload();
    assert!(o.status.success(), "{}", stderr(&o));
    let said = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(
        said.trim(),
        format!(
            "policy mom loaded from {}; not applied until memtide restarts: interval_s, \
             host-side access sampling (which the new policy changes)",
            file.display()
        )
    );
    let deciding = daemon.wait_until("the new policy deciding", Duration::from_secs(10), |s| {
        policy(s) == "mom"
    });
    // What waits for a restart stays in status (found by an audit: told once only).
    let pending = &deciding["restart_pending"];
    assert_eq!(pending[0], "interval_s", "{pending}");
    // A file that no longer parses leaves the policy in force, and says why.
    edit("policy = \"mom\"", "policy = ");
    let o = reload();
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("policy rejected, mom stays in force"), "{err}");
    assert!(err.contains("memtide.toml"), "{err}");
    // A value out of range while the daemon runs on the file it read: status still
    // reaches it (the fault a warning), and a reload is refused by the daemon, saying why.
    edit("policy = ", "policy = \"mom\"\n[memtide]\nmargin = -3\n#");
    let o = memtide()
        .args(["status", "-c"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("memtide.margin: -3 must be a share in [0, 1]"),
        "{}",
        stderr(&o)
    );
    let o = memtide()
        .args(["reload", "-c"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("policy rejected, mom stays in force") && err.contains("margin"),
        "{err}"
    );
    edit("[memtide]\nmargin = -3\n#", "");
    // A file memtide would not start from is refused now, not at the next restart (found
    // by an audit: a [host] typo was taken, and the restart failed).
    let sys = format!("sys = {:?}", root.join("sys"));
    edit(&sys, &format!("sys = {:?}", root.join("sys-typo")));
    let o = reload();
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("policy rejected, mom stays in force")
            && err.contains("memtide would not start from it")
            && err.contains("sys-typo"),
        "{err}"
    );
    edit(&format!("sys = {:?}", root.join("sys-typo")), &sys);
    // As SIGHUP, it reopens the event log that logrotate moved away.
    std::fs::rename(&daemon.events, root.join("events.jsonl.1")).unwrap();
    assert!(reload().status.success());
    let events = std::fs::read_to_string(&daemon.events).unwrap();
    assert!(events.contains("policy_reloaded"), "{events}");
    // Its socket not reached (edited in the file since it started, say), the process
    // named is sent SIGHUP instead, as the unit's ExecReload does.
    let o = memtide()
        .args(["reload", "--socket"])
        .arg(root.join("edited.sock"))
        .args(["--pid", &daemon.pid().to_string()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("by SIGHUP instead"), "{}", stderr(&o));
    let twice = || {
        let events = std::fs::read_to_string(&daemon.events).ok()?;
        (events.matches("policy_reloaded").count() == 2).then_some(())
    };
    assert!(support::wait_for(Duration::from_secs(10), twice).is_some());
    // A save of a VM that does not exist says so, and logs no event of it.
    let o = support::daemon::snapshot(&file, &["save", "nosuchvm"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("no VM named \"nosuchvm\""),
        "{}",
        stderr(&o)
    );
    let events = std::fs::read_to_string(&daemon.events).unwrap();
    assert!(!events.contains("nosuchvm"), "{events}");
}

#[test]
fn under_systemd_the_daemon_says_when_it_is_ready_and_when_it_stops() {
    // The unit's Type=notify: systemd's socket stands in as a datagram socket of ours.
    let dir = tempfile::tempdir().unwrap();
    let notify = dir.path().join("notify.sock");
    let systemd = std::os::unix::net::UnixDatagram::bind(&notify).unwrap();
    systemd
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let root = dir.path().join("host");
    let o = run_on_fake_trees_with(&root, &root.join("events.jsonl"), |cmd| {
        cmd.env("NOTIFY_SOCKET", &notify);
    });
    assert!(o.status.success(), "{}", stderr(&o));
    let mut said = Vec::new();
    let mut buf = [0u8; 256];
    while let Ok(n) = systemd.recv(&mut buf) {
        said.push(String::from_utf8_lossy(&buf[..n]).trim_end().to_string());
        if said.len() == 2 {
            break;
        }
    }
    assert_eq!(said, ["READY=1", "STOPPING=1"]);
}

#[test]
fn logs_can_be_json_lines_at_a_chosen_level() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let o = run_on_fake_trees_with(root, &root.join("events.jsonl"), |cmd| {
        cmd.args(["--log-format", "json", "--log-level", "info"]);
    });
    assert!(o.status.success(), "{}", stderr(&o));
    let lines: Vec<serde_json::Value> = stderr(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(
        lines.iter().any(|l| l["fields"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("memtide stopped")),
        "{lines:?}"
    );
    assert!(lines.iter().all(|l| l["level"].is_string()), "{lines:?}");
    // A level that is not one says so and stops before anything runs.
    let o = run(&["--log-level", "loud[", "status"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("--log-level \"loud[\""),
        "{}",
        stderr(&o)
    );
}

#[test]
fn every_subcommand_finds_its_configuration_without_flags() {
    // $MEMTIDE_CONFIG stands in for /etc/memtide/memtide.toml, the default.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("memtide.toml");
    let socket = dir.path().join("elsewhere.sock");
    std::fs::write(&config, format!("[daemon]\nsocket = {socket:?}\n")).unwrap();
    let with_env = |args: &[&str]| {
        memtide()
            .args(args)
            .env("MEMTIDE_CONFIG", &config)
            .output()
            .unwrap()
    };
    let o = with_env(&["check-config"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        format!("{}: ok", config.display())
    );
    // Given as every other subcommand takes it, too.
    let o = run(&["check-config", "-c", config.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = with_env(&["status"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains(&socket.display().to_string()),
        "status asks the socket the configuration names: {}",
        stderr(&o)
    );
    // No file named, none at the default place: the built-in defaults are what runs.
    if !Path::new("/etc/memtide/memtide.toml").exists() {
        let o = memtide()
            .arg("check-config")
            .env_remove("MEMTIDE_CONFIG")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(
            String::from_utf8_lossy(&o.stdout).trim(),
            "no /etc/memtide/memtide.toml: the built-in defaults: ok"
        );
    }
}

#[test]
fn completions_and_the_man_page_come_from_the_command_line_definition() {
    for shell in ["bash", "zsh", "fish"] {
        let o = run(&["completions", shell]);
        assert!(o.status.success(), "{shell}: {}", stderr(&o));
        let text = String::from_utf8_lossy(&o.stdout);
        for sub in ["run", "status", "check-config", "reload", "sim", "replay"] {
            assert!(text.contains(sub), "{shell} completes {sub}");
        }
    }
    let o = run(&["completions", "tcsh"]);
    assert!(!o.status.success(), "an unknown shell is refused");
    let o = run(&["man"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let page = String::from_utf8_lossy(&o.stdout);
    assert!(page.contains(".TH memtide 1"), "{page}");
    assert!(page.contains("check\\-config"), "{page}");
    // Every page a page names is written beside it: the subcommands' too, into a
    // directory made for them.
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("man1");
    let o = run(&["man", "--out-dir", dir.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let written = |name: &str| dir.join(name).exists();
    for name in [
        "memtide.1",
        "memtide-run.1",
        "memtide-snapshot-save.1",
        "memtide-policy-eval.1",
    ] {
        assert!(written(name), "{name}");
    }
    for page in std::fs::read_dir(&dir).unwrap() {
        let text = std::fs::read_to_string(page.unwrap().path()).unwrap();
        let named = text.lines().filter_map(|l| l.strip_suffix("(1)"));
        for name in named.filter(|n| n.starts_with("memtide\\-")) {
            let file = format!("{}.1", name.replace("\\-", "-"));
            assert!(written(&file), "{file} is named but not written");
        }
    }
}

#[test]
fn an_event_log_on_a_full_disk_is_logged_once_and_does_not_stop_the_daemon() {
    // /dev/full fails every write with ENOSPC.
    let dir = tempfile::tempdir().unwrap();
    let o = run_on_fake_trees(dir.path(), Path::new("/dev/full"));
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert_eq!(err.matches("write failed").count(), 1, "{err}");
    assert!(err.contains("No space left on device"), "{err}");
    assert!(err.contains("memtide stopped"), "{err}");
}

#[test]
fn the_daemon_runs_on_fake_trees_and_tunes_ksm_there() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let o = run_on_fake_trees(root, &root.join("events.jsonl"));
    assert!(o.status.success(), "{}", stderr(&o));
    // ~10% free: ksmtuned runs ksmd, boosting pages_to_scan by 300 from the kernel's
    // 100, once in the three ticks (a step a minute, as ksmtuned) — written only to the
    // fake sysfs.
    let ksm = |k: &str| std::fs::read_to_string(root.join("sys/kernel/mm/ksm").join(k)).unwrap();
    assert_eq!(ksm("run").trim(), "1");
    assert_eq!(ksm("pages_to_scan").trim(), "400", "one step of +300");
    assert_eq!(
        ksm("sleep_millisecs").trim(),
        "160",
        "10 ms × 16 GiB / 1 GiB"
    );
    let events = std::fs::read_to_string(root.join("events.jsonl")).unwrap();
    let kinds: Vec<String> = events
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["kind"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(kinds, ["started", "action", "stopped"]);
    assert!(events.contains("ksmtuned.run"), "{events}");
    assert!(
        !root.join("memtide.sock").exists(),
        "the control socket is removed on exit"
    );
}

/// A child process, killed when the test ends (or fails).
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn idle_http_clients_never_make_a_tick_skip() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    fake_host(root);
    let port = support::free_port();
    let config = format!(
        "interval_s = 0.1\n[host]\nproc = {:?}\nsys = {:?}\n[discovery]\nqmp_glob = []\n\
         [daemon]\nsocket = {:?}\nevent_log = {:?}\nstate_file = \"\"\nhttp = \"127.0.0.1:{port}\"\n",
        root.join("proc"),
        root.join("sys"),
        root.join("memtide.sock"),
        root.join("events.jsonl"),
    );
    std::fs::write(root.join("memtide.toml"), config).unwrap();
    // Started with a soft limit of 64 descriptors, as a user (or a unit file) may leave it.
    let daemon = std::process::Command::new("sh")
        .arg("-c")
        .arg("ulimit -Sn 64 && exec \"$0\" run --config \"$1\"")
        .arg(env!("CARGO_BIN_EXE_memtide"))
        .arg(root.join("memtide.toml"))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let _daemon = KillOnDrop(daemon);
    let socket = root.join("memtide.sock");
    // A daemon out of descriptors cannot accept `memtide status`: ask for 5 s at most.
    let status = || -> Option<serde_json::Value> {
        let o = std::process::Command::new("timeout")
            .arg("5")
            .arg(env!("CARGO_BIN_EXE_memtide"))
            .args(["status", "--json", "--socket"])
            .arg(&socket)
            .output()
            .unwrap();
        o.status
            .success()
            .then(|| serde_json::from_slice(&o.stdout).unwrap())
    };
    let wait = std::time::Duration::from_secs(10);
    let ticks = |s: &serde_json::Value| s["counters"]["ticks"].as_u64().unwrap();
    // Ticking, so serving HTTP.
    let before =
        support::wait_for(wait, || status().filter(|s| ticks(s) > 0)).expect("the daemon ticks");
    // 100 connections that never send a request (the audit's 300, scaled to the limit).
    let idle: Vec<_> = (0..100)
        .map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    let during = support::wait_for(wait, || {
        status().filter(|s| ticks(s) >= ticks(&before) + 10)
    })
    .expect("ten more ticks, and status answers, while the clients idle");
    drop(idle);
    assert_eq!(during["counters"]["host_errors"], 0, "{during}");
    let events = std::fs::read_to_string(root.join("events.jsonl")).unwrap();
    assert!(!events.contains("host_error"), "{events}");
}

/// Seconds as an operator may write them, NaN, infinities and 1e20 included.
fn any_seconds() -> impl Strategy<Value = f64> {
    prop_oneof![
        6 => 0.0..5000.0f64,
        1 => proptest::num::f64::ANY,
        1 => Just(1e20),
    ]
}

/// Integers as an operator may write them.
fn any_integer() -> impl Strategy<Value = i64> {
    prop_oneof![6 => 0..5000i64, 1 => any::<i64>(), 1 => Just(1 << 45)]
}

/// `config` written to `path`, then checked by `check-config` and run by `run` (a dry
/// run of one tick): what each did.
fn check_and_run(path: &Path, config: &str) -> (Output, Output) {
    std::fs::write(path, config).unwrap();
    let checked = memtide().arg("check-config").arg(path).output().unwrap();
    let ran = memtide()
        .args(["run", "--dry-run", "--ticks", "1", "--config"])
        .arg(path)
        .output()
        .unwrap();
    (checked, ran)
}

#[test]
fn idle_page_tracking_asked_of_a_kernel_without_it_is_warned_of_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    fake_host(root);
    for (access, then) in [
        ("\"idle\"", "there will be no host-side access sampling"),
        ("true", "falls back to clear_refs"),
    ] {
        let config = format!(
            "[host]\nproc = {:?}\nsys = {:?}\nsample_access = {access}\n",
            root.join("proc"),
            root.join("sys")
        );
        std::fs::write(root.join("memtide.toml"), config).unwrap();
        let o = memtide()
            .arg("check-config")
            .arg(root.join("memtide.toml"))
            .env("MEMTIDE_LOG", "warn")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains("page_idle/bitmap is missing") && err.contains(then),
            "{err}"
        );
    }
}

#[test]
fn check_config_refuses_what_run_would_refuse_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    fake_host(root);
    std::fs::create_dir_all(root.join("empty")).unwrap();
    std::fs::write(root.join("broken.policy"), "(defvar x (+ 1 2)\n").unwrap();
    let base = format!(
        "[discovery]\nqmp_glob = []\n[daemon]\nsocket = {:?}\nevent_log = \"\"\n\
         state_file = \"\"\nhttp = \"\"\n",
        root.join("memtide.sock"),
    );
    let host = |proc: &Path| format!("[host]\nproc = {proc:?}\nsys = {:?}\n", root.join("sys"));
    let fake = host(&root.join("proc"));
    let cases = [
        (
            format!("policy = {:?}\n{fake}", root.join("missing.policy")),
            "missing.policy: No such file",
        ),
        (
            format!("policy = {:?}\n{fake}", root.join("broken.policy")),
            "broken.policy",
        ),
        (
            format!("policy_dir = {:?}\n{fake}", root.join("empty")),
            "no *.policy file in it",
        ),
        (host(&root.join("nonexistent")), "meminfo"),
        (
            format!("{fake}domain_cgroup = {:?}\n", root.join("no-cgroup")),
            "no-cgroup",
        ),
    ];
    for (section, says) in cases {
        let config = format!("{section}{base}");
        let (checked, ran) = check_and_run(&root.join("memtide.toml"), &config);
        assert_eq!(
            checked.status.code(),
            Some(1),
            "{config}{}",
            stderr(&checked)
        );
        assert_eq!(ran.status.code(), Some(1), "{config}{}", stderr(&ran));
        assert!(
            stderr(&checked).contains(says),
            "{config}{}",
            stderr(&checked)
        );
        assert_eq!(stderr(&checked), stderr(&ran), "{config}");
        // Made for another host: only the file and its policy files are checked.
        let elsewhere = memtide()
            .args(["check-config", "--no-host"])
            .arg(root.join("memtide.toml"))
            .output()
            .unwrap();
        let policy_fault = config.starts_with("policy");
        assert_eq!(elsewhere.status.success(), !policy_fault, "{config}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever `check-config` accepts, `run` starts with (here in a dry run of one tick);
    /// whatever it rejects, `run` rejects the same way. Never a panic.
    #[test]
    fn a_config_that_passes_check_config_starts(
        interval_s in any_seconds(),
        call_timeout_ms in any_integer(),
        record_file_mib in any_integer(),
        settle_s in any_integer(),
        cool_down_s in any_seconds(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fake_host(root);
        let number = |v: toml::Value| v.to_string();
        let config = format!(
            "interval_s = {}\n[host]\nproc = {:?}\nsys = {:?}\n[discovery]\nqmp_glob = []\n\
             [daemon]\nsocket = {:?}\nevent_log = \"\"\nstate_file = \"\"\nhttp = \"\"\nrecord_dir = {:?}\n\
             call_timeout_ms = {}\nrecord_file_mib = {}\n[engine]\nsettle_s = {}\n\
             [memtide]\ncool_down_s = {}\n",
            number(interval_s.into()),
            root.join("proc"),
            root.join("sys"),
            root.join("memtide.sock"),
            root.join("rec"),
            number(call_timeout_ms.into()),
            number(record_file_mib.into()),
            number(settle_s.into()),
            number(cool_down_s.into()),
        );
        let (checked, ran) = check_and_run(&root.join("memtide.toml"), &config);
        prop_assert!(
            matches!(checked.status.code(), Some(0 | 2)),
            "check-config: {}\n{config}",
            stderr(&checked)
        );
        prop_assert_eq!(
            ran.status.code(),
            checked.status.code(),
            "run: {}\n{}",
            stderr(&ran),
            config
        );
    }
}

#[test]
fn a_missing_proc_file_stops_the_daemon_at_start_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[host]\nproc = {:?}\n[daemon]\nsocket = {:?}\nevent_log = \"\"\nstate_file = \"\"\nhttp = \"\"\n",
        dir.path().join("proc"),
        dir.path().join("s.sock")
    );
    std::fs::write(dir.path().join("c.toml"), config).unwrap();
    let o = memtide()
        .args(["run", "--config"])
        .arg(dir.path().join("c.toml"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.starts_with("memtide: reading host statistics: "),
        "{err}"
    );
    assert!(
        err.contains("proc/meminfo: No such file or directory"),
        "{err}"
    );
}

fn shipped(name: &str) -> String {
    format!(
        "{}/../memtide-lang/policies/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

#[test]
fn policy_check_accepts_the_shipped_policies_and_locates_errors() {
    let o = run(&[
        "policy",
        "check",
        &shipped("ksm.policy"),
        &shipped("balloon.policy"),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.policy");
    std::fs::write(
        &bad,
        "# comment\n(defvar limit 10)\n(if (> limit $5) 1 0)\n",
    )
    .unwrap();
    let o = run(&["policy", "check", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    let lines: Vec<&str> = err.lines().collect();
    assert!(
        lines[0].starts_with(&format!("{}:3:14: ", bad.display())),
        "{err}"
    );
    assert_eq!(lines[1..3], ["(if (> limit $5) 1 0)", "             ^"]);
    // A function that does not exist is found at load, not at every cycle after.
    std::fs::write(&bad, "(defun f (x) (foo x 2))\n").unwrap();
    for args in [
        &["policy", "check"][..],
        &["policy", "eval", "--format", "text"],
    ] {
        let o = memtide().args(args).arg(&bad).output().unwrap();
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        let err = stderr(&o);
        assert!(
            err.starts_with(&format!("{}:1:15: unknown function 'foo'", bad.display())),
            "{args:?}: {err}"
        );
    }
    // The shipped policy over no snapshot fails, and says what it lacked.
    let o = run(&["policy", "eval", &shipped("balloon.policy")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("note: evaluated without --input"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn policy_eval_prints_results_and_controls_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("snapshot.json");
    let snapshot = serde_json::json!({
        "host": {"props": {}, "stats": [{"mem_available": 1048576, "mem_free": 104857, "ksm_pages_to_scan": 100}]},
        "guests": [
            {"props": {"name": "vm1"}, "stats": [{"balloon_cur": 524288, "balloon_max": 524288, "mem_unused": 262144}]}
        ]
    });
    std::fs::write(&input, snapshot.to_string()).unwrap();
    let o = run(&[
        "policy",
        "eval",
        &shipped("balloon.policy"),
        "--input",
        input.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // Host free 10%: shrink by the 5% step, 524288 KiB × 0.95.
    assert_eq!(out["controls"]["guests"]["vm1"]["balloon_target"], 498073.6);
    assert_eq!(out["controls"]["host"], serde_json::json!({}));
    assert_eq!(
        out.as_object().unwrap().keys().collect::<Vec<_>>(),
        ["controls", "results"]
    );

    let broken = dir.path().join("broken.policy");
    std::fs::write(&broken, "(defvar x 1)\n(/ x 0)\n").unwrap();
    let o = run(&["policy", "eval", broken.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let err: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(err["error"]["line"], 2);
    assert_eq!(err["error"]["column"], 1);
    assert_eq!(err["error"]["file"], broken.display().to_string());
}

#[test]
fn a_policy_is_reloaded_and_a_broken_one_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    fake_host(root);
    let policy = root.join("ksm.policy");
    std::fs::write(&policy, "(Host.Control \"ksm_pages_to_scan\" 300)\n").unwrap();
    let config = format!(
        "interval_s = 0.2\npolicy = {:?}\n[host]\nproc = {:?}\nsys = {:?}\n[discovery]\nqmp_glob = []\n\
         [daemon]\nsocket = {:?}\nevent_log = {:?}\nstate_file = \"\"\nhttp = \"\"\n\
         [mom]\ninterval_s = 0\nsample_interval_s = 0\n",
        policy, root.join("proc"), root.join("sys"), root.join("memtide.sock"), root.join("events.jsonl"),
    );
    std::fs::write(root.join("memtide.toml"), config).unwrap();
    let mut daemon = memtide()
        .args(["run", "--config"])
        .arg(root.join("memtide.toml"))
        .spawn()
        .unwrap();
    let socket = root.join("memtide.sock");
    let pages = || std::fs::read_to_string(root.join("sys/kernel/mm/ksm/pages_to_scan")).unwrap();
    let reload = || {
        memtide()
            .args(["reload", "--socket"])
            .arg(&socket)
            .output()
            .unwrap()
    };
    assert!(
        support::wait_for(std::time::Duration::from_secs(10), || (pages().trim()
            == "300")
            .then_some(()))
        .is_some()
    );

    std::fs::write(&policy, "(Host.Control \"ksm_pages_to_scan\" 500))\n").unwrap();
    let o = reload();
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("policy not reloaded: policy rejected, ")
            && err.contains("ksm.policy:1:39: unexpected ')'"),
        "{err}"
    );
    let status = memtide()
        .args(["status", "--json", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert!(
        status["policy_error"]
            .as_str()
            .unwrap()
            .contains("ksm.policy:1:39"),
        "{status}"
    );
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert_eq!(pages().trim(), "300", "the running policy stays in force");

    std::fs::write(&policy, "(Host.Control \"ksm_pages_to_scan\" 500)\n").unwrap();
    // As logrotate does: move the event log away, then SIGHUP.
    let rotated = root.join("events.jsonl.1");
    std::fs::rename(root.join("events.jsonl"), &rotated).unwrap();
    support::signal(daemon.id(), "HUP");
    assert!(
        support::wait_for(std::time::Duration::from_secs(10), || (pages().trim()
            == "500")
            .then_some(()))
        .is_some()
    );
    support::signal(daemon.id(), "TERM");
    assert!(daemon.wait().unwrap().success());
    let before = std::fs::read_to_string(&rotated).unwrap();
    let after = std::fs::read_to_string(root.join("events.jsonl")).unwrap();
    assert!(
        before.contains("\"kind\":\"policy_rejected\"")
            && after.contains("\"kind\":\"policy_reloaded\""),
        "before SIGHUP:\n{before}\nafter:\n{after}"
    );
}

#[test]
fn sim_compares_policies_and_writes_reports() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report");
    let o = memtide()
        .args([
            "sim",
            "quick",
            "--compare",
            "none",
            "mom",
            "--seed",
            "7",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(
        table.lines().any(|l| l.starts_with("none")) && table.lines().any(|l| l.starts_with("mom")),
        "{table}"
    );
    let compare: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("compare.json")).unwrap()).unwrap();
    for p in ["none", "mom"] {
        let s = &compare["policies"][p];
        assert_eq!(
            (s["seed"].as_u64(), s["vms"].as_u64().is_some()),
            (Some(7), true),
            "{s}"
        );
        assert!(
            out.join(p).join("summary.json").exists()
                && out.join(p).join("allocation.svg").exists()
        );
    }
    let o = run(&["sim", "no-such-scenario"]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("(built in: memknobs-32, "), "{err}");
    assert_eq!(err.matches("memknobs-32").count(), 1, "listed once: {err}");
    assert!(err.contains("no scenario file of that name"), "{err}");
    let o = run(&["sim", "quick", "--compare", "none", "mom", "none"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("--compare: none named twice"),
        "{}",
        stderr(&o)
    );
    // A share of DRAM that is no share, or too little for the host's own memory.
    for (share, says) in [
        (
            "1.5",
            "the share of the host's memory that is DRAM, in (0, 1]",
        ),
        ("NaN", "in (0, 1]"),
        ("0.001", "the DRAM must hold the host's own memory"),
    ] {
        let o = run(&["sim", "quick", "--tiers", share]);
        assert_eq!(o.status.code(), Some(1), "{share}");
        let err = stderr(&o);
        assert!(
            err.contains(&format!("--tiers {share}")) && err.contains(says),
            "{err}"
        );
    }
}

#[test]
fn sim_free_page_reporting_gives_freed_memory_back_without_a_balloon() {
    let host_free = |args: &[&str]| {
        let o = run(&[&["sim", "quick", "--policy", "none"][..], args].concat());
        assert!(o.status.success(), "{}", stderr(&o));
        let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        s["host_free_mean_mib"].as_f64().unwrap()
    };
    // quick's guests free memory as their phases end: with no policy at all, reporting
    // alone gives it back to the host.
    let (plain, reporting) = (host_free(&[]), host_free(&["--free-page-reporting"]));
    assert!(
        reporting > plain + 100.0,
        "{plain} MiB free, {reporting} with reporting"
    );
}

#[test]
fn sim_tiers_make_any_scenario_two_tier() {
    let summary = |args: &[&str]| {
        let o = run(args);
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let one = summary(&["sim", "quick", "--policy", "none"]);
    assert!(one.get("tiers").is_none(), "{one}");
    let s = summary(&["sim", "quick", "--policy", "none", "--tiers", "0.5"]);
    assert_eq!(s["tiers"]["placement"], "memtide");
    assert_eq!(s["tiers"]["cold_age_s"], 30.0);
    assert_eq!(s["tiers"]["adaptive_age"], true);
    assert!(
        s["tiers"]["mean_cold_age_s"].as_f64().unwrap() >= 30.0,
        "{s}"
    );
    assert!(s["tiers"]["slow_share"].as_f64().unwrap() > 0.0, "{s}");
    let fixed = &["sim", "quick", "--policy", "none", "--tiers", "0.5"];
    let s = summary(&[&fixed[..], &["--adaptive-age", "false"]].concat());
    assert_eq!(s["tiers"]["adaptive_age"], false);
    assert_eq!(s["tiers"]["mean_cold_age_s"], 30.0);
    let s = summary(&[
        "sim",
        "quick",
        "--policy",
        "none",
        "--tiers",
        "0.5",
        "--tier-placement",
        "first-touch",
    ]);
    assert_eq!(s["tiers"]["placement"], "first-touch");
    for (args, says) in [
        (&["--tier-placement", "first-touch"][..], "needs --tiers"),
        (&["--tiers", "0.01"][..], "tiers.fast_mib"),
        (&["--cold-age-s", "30"][..], "--cold-age-s needs --tiers"),
        (
            &["--adaptive-age", "true"][..],
            "--adaptive-age needs --tiers",
        ),
        (
            &["--tiers", "0.5", "--cold-age-s=-1"][..],
            "tiers.cold_age_s",
        ),
    ] {
        let o = run(&[&["sim", "quick"][..], args].concat());
        assert_eq!(o.status.code(), Some(1));
        assert!(stderr(&o).contains(says), "{}", stderr(&o));
    }
}

#[test]
fn sim_ticks_runs_a_scenario_for_as_long_as_asked() {
    let o = run(&["sim", "quick", "--policy", "none", "--ticks", "20"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["ticks"], 20, "{s}");
    let o = run(&["sim", "quick", "--ticks", "0"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("--ticks") && stderr(&o).contains("ticks: must be at least 1"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn the_daemon_records_and_replay_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    fake_host(root);
    let config = format!(
        "interval_s = 0.2\n[host]\nproc = {:?}\nsys = {:?}\n[discovery]\nqmp_glob = []\n\
         [engine]\nksm_control = false\n\
         [daemon]\nsocket = {:?}\nevent_log = \"\"\nstate_file = \"\"\nhttp = \"\"\nrecord_dir = {:?}\n",
        root.join("proc"),
        root.join("sys"),
        root.join("memtide.sock"),
        root.join("rec"),
    );
    std::fs::write(root.join("memtide.toml"), config).unwrap();
    let o = memtide()
        .args(["run", "--ticks", "3", "--config"])
        .arg(root.join("memtide.toml"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let o = memtide()
        .args(["replay", "--policy", "none", "--json"])
        .arg(root.join("rec"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["ticks"], 3, "{report}");
    let o = memtide()
        .args(["replay", "--policy", "none"])
        .arg(root.join("rec"))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("cannot know"),
        "the caveat is printed"
    );
    let empty = root.join("empty");
    std::fs::create_dir(&empty).unwrap();
    let o = memtide()
        .args(["replay", "--policy", "mom"])
        .arg(&empty)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("no recording files in"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn replay_runs_another_policy_over_the_committed_recording() {
    let rec = format!(
        "{}/../memtide-sim/tests/data/quick-mom.jsonl.gz",
        env!("CARGO_MANIFEST_DIR")
    );
    let o = run(&["replay", "--policy", "mom", "--json", &rec]);
    assert!(o.status.success(), "{}", stderr(&o));
    let same: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let o = run(&["replay", "--policy", "none", "--json", &rec]);
    let other: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (same["ticks"].as_u64(), other["ticks"].as_u64()),
        (Some(120), Some(120))
    );
    assert_eq!(
        same["ticks_differing"], 0,
        "the recorded policy decides the same again"
    );
    // mom evaluates every 10 s from 10 s after it starts, and moved a guest at each of
    // the recording's 11 evaluations: there no management differs.
    assert_eq!(
        other["ticks_differing"], 11,
        "no management differs where mom moved a guest"
    );
}

#[test]
fn reclaim_paces_a_cgroup_a_line_a_tick_and_names_what_it_cannot_read() {
    // A cgroup v2 directory as the kernel shows it (this host has cgroup v1): 1 GiB
    // charged, no pressure, no refaults.
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
    write("memory.current", "1073741824\n");
    write(
        "memory.pressure",
        "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
    );
    write(
        "memory.stat",
        "workingset_refault_anon 0\nworkingset_refault_file 0\n",
    );
    write("memory.reclaim", "");
    let config = dir.path().join("memtide.toml");
    std::fs::write(&config, "[reclaim]\nstep_pct_per_s = 10\n").unwrap();
    let o = memtide()
        .args([
            "reclaim",
            "--ticks",
            "2",
            "--interval-s",
            "0.5",
            "--working-set-mib",
            "256",
        ])
        .arg("--cgroup")
        .arg(dir.path())
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(
        lines[0].ends_with("asked=0 result=held reclaim.first: first reading: no rates yet"),
        "{out}"
    );
    let written = std::fs::read_to_string(dir.path().join("memory.reclaim")).unwrap();
    assert!(
        lines[1].contains(&format!("asked={written} result=ok reclaim.probe: ")),
        "{out}"
    );
    assert!(
        lines[1].ends_with("keeping 320 MiB (working set 256 MiB + floor 64 MiB)"),
        "{out}"
    );
    // About 10% of 1 GiB a second for half a second.
    let written: u64 = written.parse().unwrap();
    assert!((40 << 20..80 << 20).contains(&written), "{written}");
    // A process that is not there (above the kernel's largest pid_max): refused before
    // any tick.
    let o = memtide()
        .args(["reclaim", "--ticks", "1", "--pid", "4999999"])
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert_eq!(stderr(&o), "memtide: --pid 4999999: no such process\n");
    assert!(o.stdout.is_empty());
    // So are a directory that is no cgroup v2 memory controller, and no interval.
    let refused = |args: &[&str], cgroup: &std::path::Path| {
        let o = memtide()
            .args(["reclaim", "--ticks", "1"])
            .args(args)
            .arg("--cgroup")
            .arg(cgroup)
            .arg("--config")
            .arg(&config)
            .output()
            .unwrap();
        assert!(!o.status.success() && o.stdout.is_empty());
        stderr(&o)
    };
    let typo = dir.path().join("typo");
    assert_eq!(
        refused(&[], &typo),
        format!(
            "memtide: --cgroup {}: no cgroup v2 memory controller there (no memory.current)\n",
            typo.display()
        )
    );
    assert_eq!(
        refused(&["--interval-s", "0"], dir.path()),
        "memtide: --interval-s 0 is not a number of seconds above 0\n"
    );
}

#[test]
#[ignore = "reads page frame numbers: needs root"]
fn access_prints_a_json_line_a_scan_and_says_when_the_kernel_cannot_track() {
    assert!(root(), "this test reads page frame numbers: it needs root");
    let (mut holder, stdin) = holding_a_buffer();
    let pid = holder.id().to_string();
    let sys = tempfile::tempdir().unwrap();
    let config = sys.path().join("memtide.toml");
    std::fs::write(&config, format!("[host]\nsys = {:?}\n", sys.path())).unwrap();
    let access = |extra: &[&str]| {
        memtide()
            .args([
                "access",
                "--pid",
                &pid,
                "--interval-s",
                "0.1",
                "--count",
                "3",
            ])
            .args(extra)
            .arg("--config")
            .arg(&config)
            .output()
            .unwrap()
    };
    // This host's kernel, like the fake sysfs, has no idle page tracking.
    let o = access(&[]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains(
            "kernel/mm/page_idle/bitmap is missing: the kernel has no idle page tracking \
             (CONFIG_IDLE_PAGE_TRACKING)"
        ),
        "{}",
        stderr(&o)
    );
    // A file standing in for the kernel's bitmap, which keeps every mark: after the first
    // scan nothing in a buffer no one touches is accessed. Only one mapping is tracked, as
    // the daemon tracks a guest's RAM: a file keeps the zero bits the tracker writes
    // around its marks where the kernel ignores them, so the marks of one mapping's pages
    // were overwritten by another's in the same words (found flaky: `sleep`'s own pages
    // all counted accessed at every scan where each shared a word with another mapping's).
    support::idle_bitmap_stand_in(sys.path());
    // `--size-mib` again for each mapping (a virtio-mem VM's base memory and backend):
    // the 64 MiB buffer is one of those sizes; dd has no mapping of the other.
    let o = access(&["--size-mib", "2048", "--size-mib", "64"]);
    drop(stdin);
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[0]["accessed"], serde_json::Value::Null);
    assert_eq!(lines[0]["cold"], serde_json::Value::Null);
    for line in &lines {
        let resident = line["resident"].as_u64().unwrap();
        assert!(resident >= 1 << 20, "the MiB read into it: {line}");
        assert!(resident <= 64 << 20, "one buffer of 64 MiB: {line}");
    }
    for line in &lines[1..] {
        assert_eq!(line["accessed"], 0, "{line}");
    }
    assert!(lines[1]["t"].as_f64().unwrap() >= 0.1, "{}", lines[1]);
}

/// `dd` holding a 64 MiB buffer with the first MiB read into it, blocked reading the
/// rest from the pipe returned: a mapping of its own that nothing touches until the pipe
/// is written or closed.
fn holding_a_buffer() -> (std::process::Child, std::process::ChildStdin) {
    use std::io::Write;
    let mut child = std::process::Command::new("dd")
        .args(["of=/dev/null", "bs=64M", "iflag=fullblock", "status=none"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&[0u8; 1 << 20]).unwrap();
    // Read all of it once it waits in read(2) (0) on its standard input for the other
    // 63 MiB (0x3f00000) of its block.
    blocked_in(&child, "dd never read the MiB", |call| {
        call.len() > 3 && call[0] == "0" && call[1] == "0x0" && call[3] == "0x3f00000"
    });
    (child, stdin)
}

/// Wait until `child` is blocked in the system call `is` recognizes from the fields of
/// its /proc/PID/syscall (the call's number, then its arguments), for 10 s at most.
fn blocked_in(child: &std::process::Child, never: &str, is: impl Fn(&[&str]) -> bool) {
    let syscall = format!("/proc/{}/syscall", child.id());
    let started = std::time::Instant::now();
    while !std::fs::read_to_string(&syscall)
        .is_ok_and(|s| is(&s.split_whitespace().collect::<Vec<_>>()))
    {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "{never}: {:?}",
            std::fs::read_to_string(&syscall)
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// `sleep 30`, once it sleeps: its loader has stopped touching new pages (found flaky
/// under load: pages it mapped between two scans 0.1 s apart counted as accessed).
fn sleeping() -> std::process::Child {
    let child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    // /proc/PID/syscall names the call a blocked task waits in: nanosleep (35) or
    // clock_nanosleep (230) on x86-64.
    blocked_in(&child, "sleep never slept", |call| {
        call.first().is_some_and(|n| *n == "35" || *n == "230")
    });
    child
}

/// `memtide place` on this host: a fake sysfs naming two nodes with memory and a file
/// standing in for the idle bitmap (nothing is seen accessed after the first scan), the
/// real move_pages(2) status of a process's pages.
#[test]
fn place_prints_a_json_line_an_interval_and_names_a_node_it_cannot_use() {
    // The slow node: one past the host's highest node with memory, which the host has
    // not, whatever its nodes (the fake sysfs lists it beside node 0).
    let host = std::fs::read_to_string("/sys/devices/system/node/has_memory").unwrap();
    let absent = host
        .trim()
        .split(',')
        .filter_map(|r| r.rsplit('-').next()?.parse::<u32>().ok())
        .max()
        .unwrap_or_else(|| panic!("no node in the host's has_memory: {host:?}"))
        + 1;
    let slow = absent.to_string();
    let mut sleeper = sleeping();
    let pid = sleeper.id().to_string();
    let sys = tempfile::tempdir().unwrap();
    let config = sys.path().join("memtide.toml");
    std::fs::write(&config, format!("[host]\nsys = {:?}\n", sys.path())).unwrap();
    // `memtide place` for the sleeper, between node 0 and the absent node.
    let placing = || {
        let mut c = memtide();
        c.args([
            "place",
            "--pid",
            &pid,
            "--fast-node",
            "0",
            "--slow-node",
            &slow,
        ]);
        c
    };
    let place = |budget_mib: &str| {
        placing()
            .args([
                "--budget-mib",
                budget_mib,
                "--interval-s",
                "0.1",
                "--count",
                "3",
                // Whatever is idle goes (the default cold age outlasts these scans).
                "--cold-age-s",
                "0",
            ])
            .arg("--config")
            .arg(&config)
            .output()
            .unwrap()
    };
    let o = placing()
        .args(["--budget-mib", "0", "--cold-age-s=-1"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("--cold-age-s -1 is not a duration"),
        "{}",
        stderr(&o)
    );
    // No pause between scans, and scans too short to count the longest cold age.
    for (interval, said) in [
        ("0", "--interval-s 0 is not a number of seconds above 0"),
        (
            "0.01",
            "--interval-s 0.01: scans count ages up to 655 s, below the longest cold age, 1800 s",
        ),
    ] {
        let o = placing()
            .args(["--budget-mib", "0", "--interval-s", interval])
            .arg("--config")
            .arg(&config)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1));
        assert!(stderr(&o).contains(said), "{}", stderr(&o));
    }
    let o = place("1024");
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("has_memory: no NUMA nodes"),
        "{}",
        stderr(&o)
    );
    let nodes = sys.path().join("devices/system/node");
    std::fs::create_dir_all(nodes.join("node0")).unwrap();
    std::fs::write(nodes.join("has_memory"), format!("0,{absent}\n")).unwrap();
    std::fs::write(nodes.join("node0/meminfo"), "Node 0 MemFree:  1048576 kB\n").unwrap();
    support::idle_bitmap_stand_in(sys.path());
    // Room for everything: nothing moves.
    let o = place("1024");
    if !root() && stderr(&o).contains("shows no page frame numbers") {
        sleeper.kill().unwrap();
        sleeper.wait().unwrap();
        return; // not root: that is all there is to see
    }
    assert!(o.status.success(), "{}", stderr(&o));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    assert!(lines[0]["reason"]
        .as_str()
        .unwrap()
        .starts_with("place.first"));
    for l in &lines[1..] {
        // (Pages the process faults in after a scan count as accessed at the next.)
        assert_eq!(
            (&l["demoted"], &l["promoted"]),
            (&0.into(), &0.into()),
            "{l}"
        );
        assert!(
            l["reason"].as_str().unwrap().starts_with("tier.configured"),
            "{l}"
        );
    }
    // A budget of nothing: every page is to leave node 0, for a node this host has not
    // (ENODEV, or EINVAL past the kernel's last node).
    let o = place("0");
    assert!(
        !o.status.success(),
        "moved to node {absent}, which the host has not"
    );
    assert!(
        stderr(&o).contains(&format!("move_pages: node {absent} has no memory (")),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).lines().count(),
        1,
        "the first line only"
    );
    // The process ends while it is placed: said, no panic.
    let run = placing()
        .args([
            "--budget-mib",
            "1024",
            "--interval-s",
            "0.1",
            "--count",
            "600",
        ])
        .arg("--config")
        .arg(&config)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    sleeper.kill().unwrap();
    let o = run.wait_with_output().unwrap();
    sleeper.wait().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("process {pid} is gone")),
        "{}",
        stderr(&o)
    );
    assert!(!o.stdout.is_empty(), "lines before it ended");
}

/// A fake sysfs NUMA node list: `nodes` with memory, node 0 with the CPUs.
fn fake_nodes(root: &Path, nodes: &[u32]) {
    let dir = root.join("sys/devices/system/node");
    std::fs::create_dir_all(&dir).unwrap();
    let list: Vec<String> = nodes.iter().map(u32::to_string).collect();
    std::fs::write(dir.join("has_memory"), list.join(",") + "\n").unwrap();
    std::fs::write(dir.join("has_cpu"), "0\n").unwrap();
    for n in nodes {
        std::fs::create_dir_all(dir.join(format!("node{n}"))).unwrap();
        std::fs::write(
            dir.join(format!("node{n}/meminfo")),
            format!("Node {n} MemTotal: 1048576 kB\nNode {n} MemFree: 102400 kB\n"),
        )
        .unwrap();
    }
}

#[test]
fn tier_placement_refuses_a_host_with_one_node_and_logs_a_process_it_cannot_place() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let events = root.join("events.jsonl");
    fake_host(root);
    fake_nodes(root, &[0]);
    let config = |vms: &str| {
        format!(
            "interval_s = 0.2\n[host]\nproc = {:?}\nsys = {:?}\n[discovery]\nqmp_glob = []\n\
             [daemon]\nsocket = {:?}\nevent_log = {:?}\nstate_file = \"\"\nhttp = \"\"\n\
             [tiering]\nplace = true\ninterval_s = 0.2\n{vms}",
            root.join("proc"),
            root.join("sys"),
            root.join("memtide.sock"),
            events,
        )
    };
    let run = |text: String| {
        std::fs::write(root.join("memtide.toml"), text).unwrap();
        memtide()
            .args(["run", "--ticks", "3", "--config"])
            .arg(root.join("memtide.toml"))
            .output()
            .unwrap()
    };
    let o = run(config(""));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_eq!(
        stderr(&o).trim_end(),
        "memtide: [tiering] place: the host has 1 NUMA node(s) with memory ([0]): placement \
         needs a fast and a slow one"
    );
    // Two nodes, and this test's process given by its pid: the fake sysfs has no idle
    // page tracking, so it cannot be tracked, and that is logged, not fatal.
    fake_nodes(root, &[0, 1]);
    let vm = format!("[[vm]]\nname = \"p\"\npid = {}\n", std::process::id());
    let o = run(config(&vm));
    assert!(o.status.success(), "{}", stderr(&o));
    let log = std::fs::read_to_string(&events).unwrap();
    let failed: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|e: &serde_json::Value| e["kind"] == "place_failed")
        .collect();
    assert!(!failed.is_empty(), "{log}");
    assert_eq!(failed[0]["vm"], "p");
    let message = failed[0]["message"].as_str().unwrap();
    assert!(message.starts_with("not placed: "), "{message}");
    assert!(message.contains("(CONFIG_IDLE_PAGE_TRACKING)"), "{message}");
}

#[test]
fn a_reader_that_goes_away_ends_a_command_quietly() {
    let policies = Path::new(env!("CARGO_MANIFEST_DIR")).join("../memtide-lang/policies");
    let balloon = policies
        .join("balloon.policy")
        .to_str()
        .unwrap()
        .to_string();
    let policies = policies.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("snapshot.json");
    let snapshot = serde_json::json!({
        "host": {"props": {}, "stats": [{"mem_available": 1048576, "mem_free": 104857}]},
        "guests": []
    });
    std::fs::write(&input, snapshot.to_string()).unwrap();
    let input = input.to_str().unwrap();
    let commands: [&[&str]; 4] = [
        &["completions", "bash"],
        &["man"],
        &["policy", "check", policies],
        &[
            "policy", "eval", "--format", "text", &balloon, "--input", input,
        ],
    ];
    for args in commands {
        let mut child = memtide()
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // `| head -0`: the reader gone before the first line.
        drop(child.stdout.take());
        let o = child.wait_with_output().unwrap();
        assert!(
            o.status.success(),
            "{args:?}: {:?} {}",
            o.status,
            stderr(&o)
        );
        assert!(!stderr(&o).contains("panicked"), "{args:?}: {}", stderr(&o));
        assert!(
            !stderr(&o).contains("Broken pipe"),
            "{args:?}: {}",
            stderr(&o)
        );
    }
}

#[test]
fn an_empty_memtide_config_counts_as_unset() {
    for args in [&["check-config"][..], &["check-config", "--no-host"]] {
        let o = memtide()
            .env("MEMTIDE_CONFIG", "")
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        assert!(String::from_utf8_lossy(&o.stdout).ends_with(": ok\n"));
    }
    // Where clap reads --config from it: not a --config given without a value.
    let o = memtide()
        .env("MEMTIDE_CONFIG", "")
        .args(["status", "--socket", "/nonexistent/memtide.sock"])
        .output()
        .unwrap();
    assert!(
        stderr(&o).contains("cannot reach memtide at"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_broken_configuration_does_not_keep_the_operator_from_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("memtide.toml");
    let socket = dir.path().join("memtide.sock");
    let asking = |command: &str| {
        let o = memtide()
            .args([command, "--config"])
            .arg(&config)
            .output()
            .unwrap();
        stderr(&o)
    };
    // An unknown key: the file's own socket is asked.
    let text = format!("bogus = 1\n[daemon]\nsocket = {socket:?}\n");
    std::fs::write(&config, text).unwrap();
    let err = asking("status");
    assert!(
        err.contains("its [daemon] socket is used all the same"),
        "{err}"
    );
    assert!(
        err.contains(&format!("cannot reach memtide at {}", socket.display())),
        "{err}"
    );
    // A line being edited elsewhere: the socket under [daemon] all the same.
    let text = format!("[daemon]\nsocket = {socket:?} # ours\n[memtide]\nmargin = [\n");
    std::fs::write(&config, text).unwrap();
    let err = asking("reload");
    assert!(
        err.contains("its [daemon] socket is used all the same")
            && err.contains(&format!("cannot reach memtide at {}", socket.display())),
        "{err}"
    );
    // Not TOML at all: the default socket is tried, and said so (status: a daemon there
    // is only read).
    std::fs::write(&config, "garbage [[[\n").unwrap();
    let err = asking("status");
    assert!(
        err.contains("the default socket /run/memtide/memtide.sock is tried"),
        "{err}"
    );
}

#[test]
fn policy_eval_refuses_two_guests_of_one_name() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("snapshot.json");
    let policy = dir.path().join("p.policy");
    std::fs::write(&policy, "(+ 1 1)\n").unwrap();
    let eval = |guests: serde_json::Value| {
        let snapshot = serde_json::json!({"host": {}, "guests": guests});
        std::fs::write(&input, snapshot.to_string()).unwrap();
        let o = memtide()
            .args(["policy", "eval", policy.to_str().unwrap(), "--input"])
            .arg(&input)
            .output()
            .unwrap();
        assert!(!o.status.success());
        stderr(&o)
    };
    let guest = serde_json::json!({"props": {"name": "vm1"}, "stats": []});
    assert_eq!(
        eval(serde_json::json!([guest, guest])),
        "memtide: --input: guests 0 and 1 are both named \"vm1\"\n"
    );
    // A guest without a name is keyed by its position, as `#0`: one named so is the same.
    let unnamed = serde_json::json!({"props": {}, "stats": []});
    let named = serde_json::json!({"props": {"name": "#0"}, "stats": []});
    assert_eq!(
        eval(serde_json::json!([unnamed, named])),
        "memtide: --input: guests 0 and 1 are both named \"#0\"\n"
    );
}
