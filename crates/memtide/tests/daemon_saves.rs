//! The daemon's saves, against a Firecracker API served by the test whose snapshot takes
//! seconds to write. memtide told to stop while it saves a VM: the save ends first (its
//! guest runs again, its snapshot is whole, its asker answered), and a second signal
//! stops it at once (the guest left paused is resumed by the next daemon, which says
//! where the save's files were left). Scheduled saves due together take turns.

mod support;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, patch, put};
use axum::{Json, Router};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::daemon::{snapshot, text, vm, Daemon};
use support::wait_for;

/// What the fake Firecracker holds and was asked.
#[derive(Default)]
struct Fake {
    paused: bool,
    /// The calls that change something, in order.
    log: Vec<String>,
    /// How long a snapshot takes to write.
    writing: Duration,
    /// The snapshots being written, shared by the fakes of one test.
    writers: Arc<Writers>,
}

/// How many snapshots are being written at once, and the most that ever were.
#[derive(Default)]
struct Writers {
    now: AtomicUsize,
    most: AtomicUsize,
}

type Shared = Arc<Mutex<Fake>>;

/// Serve a Firecracker API with a 256 MiB guest and a balloon at `socket`, from a thread
/// of its own, for as long as the test runs.
fn firecracker(socket: &Path, fake: Shared) {
    let socket = socket.to_path_buf();
    let (up, ready) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::UnixListener::bind(&socket).unwrap();
            up.send(()).unwrap();
            let one = Arc::new(tokio::sync::Mutex::new(()));
            let api = api(fake).layer(axum::middleware::from_fn_with_state(one, one_at_a_time));
            axum::serve(listener, api).await.unwrap();
        });
    });
    ready.recv().unwrap();
}

/// Firecracker serves its API one call at a time, and a call whose client went runs to
/// its end (a snapshot is written whole).
async fn one_at_a_time(
    State(one): State<Arc<tokio::sync::Mutex<()>>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let turn = one.lock_owned().await;
    let call = tokio::spawn(async move {
        let _turn = turn;
        next.run(request).await
    });
    call.await.unwrap()
}

fn api(fake: Shared) -> Router {
    Router::new()
        .route(
            "/machine-config",
            get(|| async { Json(json!({"vcpu_count": 1, "mem_size_mib": 256})) }),
        )
        .route(
            "/balloon",
            get(|| async {
                Json(
                    json!({"amount_mib": 0, "deflate_on_oom": true, "stats_polling_interval_s": 0}),
                )
            }),
        )
        .route(
            "/",
            get(|State(f): State<Shared>| async move {
                let state = if f.lock().unwrap().paused {
                    "Paused"
                } else {
                    "Running"
                };
                Json(json!({"id": "f", "state": state, "vmm_version": "1.7.0"}))
            }),
        )
        .route(
            "/vm",
            patch(
                |State(f): State<Shared>, Json(body): Json<Value>| async move {
                    let mut f = f.lock().unwrap();
                    f.log.push(format!("PATCH /vm {}", body["state"]));
                    f.paused = body["state"] == "Paused";
                    StatusCode::NO_CONTENT
                },
            ),
        )
        .route(
            "/snapshot/create",
            put(
                |State(f): State<Shared>, Json(body): Json<Value>| async move {
                    let (writing, writers) = {
                        let mut f = f.lock().unwrap();
                        f.log.push("PUT /snapshot/create".into());
                        (f.writing, f.writers.clone())
                    };
                    let now = writers.now.fetch_add(1, Ordering::SeqCst) + 1;
                    writers.most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(writing).await;
                    for (file, bytes) in [("snapshot_path", 64), ("mem_file_path", 1 << 20)] {
                        std::fs::write(body[file].as_str().unwrap(), vec![0x5a; bytes]).unwrap();
                    }
                    writers.now.fetch_sub(1, Ordering::SeqCst);
                    f.lock().unwrap().log.push("written".into());
                    StatusCode::NO_CONTENT
                },
            ),
        )
        .with_state(fake)
}

/// A daemon in `dir` managing the fake Firecracker at `socket` as VM `f`, its snapshot
/// store `store`.
fn start(dir: &Path, store: &Path, socket: &Path) -> (Daemon, PathBuf) {
    start_with(dir, store, &[("f", socket)], "")
}

/// A daemon in `dir` managing each fake Firecracker of `vms` (name, socket), each VM's
/// entry with `each` added, its snapshot store `store`.
fn start_with(dir: &Path, store: &Path, vms: &[(&str, &Path)], each: &str) -> (Daemon, PathBuf) {
    let mut config = format!(
        "interval_s = 1\npolicy = \"none\"\n[host]\nsample_access = false\n\
         restore_huge_pages = false\n[discovery]\nqmp_glob = []\n[engine]\n\
         ksm_control = false\n[snapshots]\ndir = {:?}\ntimeout_s = 60\n",
        store.display().to_string(),
    );
    for (name, socket) in vms {
        let socket = socket.display().to_string();
        config += &format!("[[vm]]\nname = {name:?}\nfirecracker = {socket:?}\n{each}");
    }
    let daemon = Daemon::start(dir, &config, 0);
    daemon.wait_until("the VMs sampled", Duration::from_secs(30), |s| {
        vms.iter()
            .all(|(name, _)| vm(s, name).is_some_and(|v| v["configured"].is_u64()))
    });
    (daemon, dir.join("memtide.toml"))
}

fn sigterm(daemon: &Daemon) {
    // SAFETY: kill(2) of the daemon's pid; no memory is involved.
    assert_eq!(unsafe { libc::kill(daemon.pid() as i32, libc::SIGTERM) }, 0);
}

/// A daemon managing a fake Firecracker, told to stop (SIGTERM) while a save of it asked
/// by `memtide snapshot save` (`asker`) writes for `writing`.
struct Stopped {
    dir: tempfile::TempDir,
    fake: Shared,
    socket: PathBuf,
    store: PathBuf,
    daemon: Daemon,
    asker: std::thread::JoinHandle<std::process::Output>,
}

fn stopped_while_saving(writing: Duration) -> Stopped {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("fc.sock");
    let fake = Shared::default();
    firecracker(&socket, fake.clone());
    let store = dir.path().join("snapshots");
    let (daemon, config) = start(dir.path(), &store, &socket);
    fake.lock().unwrap().writing = writing;
    let asker = std::thread::spawn(move || snapshot(&config, &["save", "f"]));
    let asked = wait_for(Duration::from_secs(20), || {
        let f = fake.lock().unwrap();
        f.log
            .iter()
            .any(|c| c == "PUT /snapshot/create")
            .then_some(())
    });
    assert!(
        asked.is_some(),
        "no snapshot asked: {:?}",
        fake.lock().unwrap().log
    );
    sigterm(&daemon);
    Stopped {
        dir,
        fake,
        socket,
        store,
        daemon,
        asker,
    }
}

#[test]
fn a_save_under_way_ends_before_the_daemon_stops_and_its_asker_is_answered() {
    let Stopped {
        dir,
        fake,
        mut daemon,
        asker,
        ..
    } = stopped_while_saving(Duration::from_secs(3));
    let exited = wait_for(Duration::from_secs(30), || daemon.exited());
    let log = daemon.log_text();
    assert!(exited.is_some_and(|e| e.success()), "{exited:?}\n{log}");
    assert!(
        log.contains("stopping once the saves and restores under way end"),
        "{log}"
    );
    // Written, then the guest resumed, before the daemon ended.
    assert_eq!(
        fake.lock().unwrap().log,
        [
            "PATCH /vm \"Paused\"",
            "PUT /snapshot/create",
            "written",
            "PATCH /vm \"Resumed\""
        ]
    );
    assert!(!fake.lock().unwrap().paused);
    let out = asker.join().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    // Its snapshot is whole, and the events say so before memtide stopped.
    let listed = snapshot(&dir.path().join("memtide.toml"), &["list", "f", "--json"]);
    let listed: Vec<Value> = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    let kinds: Vec<String> = daemon
        .event_log()
        .iter()
        .filter_map(|e| e["kind"].as_str().map(String::from))
        .filter(|k| k.starts_with("snapshot") || k == "stopped")
        .collect();
    assert_eq!(kinds, ["snapshot_started", "snapshot_saved", "stopped"]);
}

#[test]
fn a_second_signal_stops_at_once_and_the_next_daemon_resumes_the_guest_left_paused() {
    let Stopped {
        dir,
        fake,
        socket,
        store,
        mut daemon,
        asker,
    } = stopped_while_saving(Duration::from_secs(5));
    let waits = wait_for(Duration::from_secs(10), || {
        let log = daemon.log_text();
        log.contains("stopping once the saves and restores under way end")
            .then_some(())
    });
    assert!(waits.is_some(), "{}", daemon.log_text());
    sigterm(&daemon);
    let exited = wait_for(Duration::from_secs(10), || daemon.exited());
    assert!(exited.is_some(), "{}", daemon.log_text());
    assert!(daemon
        .log_text()
        .contains("stopping at once, with saves or restores under way"));
    // Its asker is told the outcome is unknown, and the guest stays paused: nothing
    // resumed it.
    let out = asker.join().unwrap();
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("memtide snapshot list"),
        "{}",
        text(&out)
    );
    assert!(fake.lock().unwrap().paused);
    // The next daemon resumes it once the snapshot's call is over.
    let again = dir.path().join("again");
    std::fs::create_dir(&again).unwrap();
    let (next, _) = start(&again, &store, &socket);
    let resumed = wait_for(Duration::from_secs(30), || {
        (!fake.lock().unwrap().paused).then_some(())
    });
    assert!(resumed.is_some(), "{:?}", fake.lock().unwrap().log);
    let log = fake.lock().unwrap().log.clone();
    assert_eq!(log[log.len() - 2..], ["written", "PATCH /vm \"Resumed\""]);
    // The operator is told, naming the VM.
    let told = wait_for(Duration::from_secs(10), || {
        let events = next.event_log();
        events
            .iter()
            .find(|e| e["kind"] == "vm_resumed" && e["vm"] == "f")
            .cloned()
    });
    let told = told.expect("a vm_resumed event");
    assert!(
        told["message"].as_str().unwrap().contains("cut short"),
        "{told}"
    );
    // What the save wrote is left where it was written (the VM's next save removes it),
    // and the next daemon and `memtide snapshot list` say where.
    let partial = std::fs::read_dir(store.join("f"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".partial"))
        .expect("the save's partial directory");
    assert!(partial.join("memory").is_file());
    let events = next.event_log();
    let left = events
        .iter()
        .find(|e| e["kind"] == "snapshot_unfinished" && e["vm"] == "f");
    let left = left.unwrap_or_else(|| panic!("no snapshot_unfinished: {events:?}"));
    let told = left["message"].as_str().unwrap();
    assert!(told.contains(&partial.display().to_string()), "{told}");
    let listed = snapshot(&dir.path().join("memtide.toml"), &["list", "f"]);
    assert!(
        text(&listed).contains("Saves not finished") && text(&listed).contains(".partial"),
        "{}",
        text(&listed)
    );
}

#[test]
fn scheduled_saves_due_together_take_turns() {
    let dir = tempfile::tempdir().unwrap();
    let writers = Arc::new(Writers::default());
    let mut vms = Vec::new();
    for name in ["a", "b", "c"] {
        let socket = dir.path().join(format!("{name}.sock"));
        let fake = Shared::new(Mutex::new(Fake {
            writing: Duration::from_secs(3),
            writers: writers.clone(),
            ..Fake::default()
        }));
        firecracker(&socket, fake.clone());
        vms.push((name, socket, fake));
    }
    let store = dir.path().join("snapshots");
    let named: Vec<(&str, &Path)> = vms.iter().map(|(n, s, _)| (*n, s.as_path())).collect();
    // All three due 10 s after they were first seen, within a tick or two of each other.
    let (daemon, config) = start_with(dir.path(), &store, &named, "snapshot_every_s = 10\n");
    let saved = wait_for(Duration::from_secs(60), || {
        let listed = snapshot(&config, &["list", "--json"]);
        let listed: Vec<Value> = serde_json::from_slice(&listed.stdout).ok()?;
        (listed.len() >= 3).then_some(listed)
    });
    let saved = saved.unwrap_or_else(|| panic!("not all saved: {}", daemon.log_text()));
    let mut by: Vec<&str> = saved.iter().map(|s| s["vm"].as_str().unwrap()).collect();
    by.sort_unstable();
    assert_eq!(by, ["a", "b", "c"], "{saved:?}");
    assert!(saved.iter().all(|s| s["by"] == "schedule"), "{saved:?}");
    // One written at a time, each guest running again after its own.
    assert_eq!(writers.most.load(Ordering::SeqCst), 1);
    for (name, _, fake) in &vms {
        let f = fake.lock().unwrap();
        assert!(!f.paused, "{name}: {:?}", f.log);
    }
}
