//! `check-config` refuses a `record_dir` that is a file (which `run` cannot record to), and
//! a client the control socket's mode refuses is told who may use it, not asked whether
//! memtide runs.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;
use support::cli::stderr;
use support::daemon::memtide;

/// Fake /proc and /sys trees in `root`, and a configuration for them recording to
/// `record_dir`.
fn fake_host(root: &Path, record_dir: &Path) -> std::path::PathBuf {
    support::cli::fake_host(root);
    let config = format!(
        "[host]\nproc = {:?}\nsys = {:?}\n[discovery]\nqmp_glob = []\n[daemon]\n\
         socket = {:?}\nevent_log = \"\"\nstate_file = \"\"\nhttp = \"\"\nrecord_dir = {:?}\n",
        root.join("proc"),
        root.join("sys"),
        root.join("memtide.sock"),
        record_dir,
    );
    let file = root.join("memtide.toml");
    std::fs::write(&file, config).unwrap();
    file
}

fn check_config(file: &Path) -> Output {
    memtide().arg("check-config").arg(file).output().unwrap()
}

#[test]
fn check_config_refuses_a_record_dir_that_is_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let record = root.join("recordings");
    std::fs::write(&record, "not a directory").unwrap();
    let file = fake_host(root, &record);
    let o = check_config(&file);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains(&format!(
            "daemon.record_dir: {} is a file, not a directory",
            record.display()
        )),
        "{err}"
    );
    // `run` says the same, not "File exists".
    let o = memtide()
        .args(["run", "--dry-run", "--ticks", "1", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("daemon.record_dir: "), "{}", stderr(&o));
    // Below a file: no directory can be made there either.
    let file = fake_host(root, &record.join("x"));
    let o = check_config(&file);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("daemon.record_dir: "), "{}", stderr(&o));
    // A directory, or none yet: fine.
    std::fs::remove_file(&record).unwrap();
    let o = check_config(&fake_host(root, &record));
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::create_dir(&record).unwrap();
    let o = check_config(&fake_host(root, &record));
    assert!(o.status.success(), "{}", stderr(&o));
}

/// Whether this test runs as root.
fn root() -> bool {
    // SAFETY: geteuid(2) cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn a_client_the_socket_refuses_is_told_who_may_use_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = dir.path().join("memtide.sock");
    // A socket that is there (as the daemon's is) and this client may not connect to:
    // root's 0600 one for an ordinary user; as root, one nobody may write to, asked by
    // nobody.
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let mut status = match root() {
        false => {
            std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o000)).unwrap();
            memtide()
        }
        true => {
            std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600)).unwrap();
            let mut cmd = std::process::Command::new("setpriv");
            cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                .arg(env!("CARGO_BIN_EXE_memtide"));
            cmd
        }
    };
    let o = match status.arg("status").arg("--socket").arg(&socket).output() {
        Err(e) if root() && e.kind() == std::io::ErrorKind::NotFound => {
            panic!("as root, this test drops root with setpriv (util-linux), not found: {e}")
        }
        o => o.unwrap(),
    };
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains(&format!(
            "cannot reach memtide at {} (the control socket is for root and the daemon's user",
            socket.display()
        )) && err.contains("Permission denied"),
        "{err}"
    );
    assert!(!err.contains("running?"), "{err}");
}
