//! The Firecracker and Cloud Hypervisor backends against in-process fake servers that
//! implement the documented APIs on a unix socket (KVM, which both need, does not work
//! on the build machines): field names, status codes and error bodies as documented,
//! plus the failures a real server shows (a refused connection, a slow answer).

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, put};
use axum::{Json, Router};
use memtide_adapters::api_socket::ApiVmOptions;
use memtide_adapters::cloud_hypervisor::{self, CloudHypervisorVm};
use memtide_adapters::firecracker::{self, FirecrackerVm};
use memtide_adapters::vmm_snapshot::{Launch, PAUSED_MARK};
use memtide_core::backend::{AfterSave, Seal, VmBackend};
use memtide_core::{BackendError, Bytes};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::UnixListener;

/// What the fake server holds and was asked.
#[derive(Default)]
struct Fake {
    /// Requests received with their bodies, as "METHOD /path body".
    log: Vec<String>,
    /// Balloon size in MiB (Firecracker) or bytes (Cloud Hypervisor).
    balloon: u64,
    /// Answer the next requests this late.
    delay: Duration,
    /// The guest is paused.
    paused: bool,
    /// Refuse snapshots with this error.
    refuse: Option<&'static str>,
    /// The VMM was told to end its process.
    shut_down: bool,
}

type Shared = Arc<Mutex<Fake>>;

fn opts(timeout_ms: u64) -> ApiVmOptions {
    ApiVmOptions {
        call_timeout: Duration::from_millis(timeout_ms),
        stats_interval_s: 2,
        proc: "/proc".into(),
    }
}

/// Serve `router` on a socket in `dir`.
fn serve(dir: &Path, router: Router) -> PathBuf {
    let path = dir.join("api.sock");
    let listener = UnixListener::bind(&path).unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    path
}

async fn record(fake: &Shared, what: String) -> Duration {
    let mut f = fake.lock().unwrap();
    f.log.push(what);
    f.delay
}

fn fault(status: StatusCode, message: &str) -> (StatusCode, Json<Value>) {
    (status, Json(json!({"fault_message": message})))
}

/// Firecracker with a 512 MiB guest and a balloon whose statistics are on (or not).
fn firecracker(fake: Shared, stats_on: bool) -> Router {
    let interval = if stats_on { 1 } else { 0 };
    Router::new()
        .route(
            "/machine-config",
            get(|| async { Json(json!({"vcpu_count": 1, "mem_size_mib": 512, "smt": false})) }),
        )
        .route(
            "/balloon",
            get(move |State(f): State<Shared>| async move {
                let amount = f.lock().unwrap().balloon;
                Json(json!({"amount_mib": amount, "deflate_on_oom": true,
                    "stats_polling_interval_s": interval}))
            })
            .patch(
                |State(f): State<Shared>, Json(body): Json<Value>| async move {
                    let delay = record(&f, format!("PATCH /balloon {body}")).await;
                    tokio::time::sleep(delay).await;
                    match body["amount_mib"].as_u64() {
                        Some(mib) if mib <= 512 => {
                            f.lock().unwrap().balloon = mib;
                            Err(StatusCode::NO_CONTENT)
                        }
                        _ => Ok(fault(
                            StatusCode::BAD_REQUEST,
                            "Amount of pages requested is too large.",
                        )),
                    }
                },
            ),
        )
        .route(
            "/balloon/statistics",
            get(move |State(f): State<Shared>| async move {
                let delay = record(&f, "GET /balloon/statistics".into()).await;
                tokio::time::sleep(delay).await;
                if !stats_on {
                    return Err(fault(
                        StatusCode::BAD_REQUEST,
                        "Statistics for the balloon device are not enabled",
                    ));
                }
                let mib = f.lock().unwrap().balloon;
                Ok(Json(json!({
                    "target_pages": mib * 256, "actual_pages": mib * 256,
                    "target_mib": mib, "actual_mib": mib,
                    "swap_in": 4096, "swap_out": 8192, "major_faults": 3, "minor_faults": 5000,
                    "free_memory": 300 << 20, "total_memory": 480 << 20,
                    "available_memory": 350 << 20, "disk_caches": 20 << 20,
                    "hugetlb_allocations": 0, "hugetlb_failures": 0
                })))
            })
            .patch(
                |State(f): State<Shared>, Json(body): Json<Value>| async move {
                    record(&f, format!("PATCH /balloon/statistics {body}")).await;
                    StatusCode::NO_CONTENT
                },
            ),
        )
        .route("/", get(firecracker_info))
        .route("/vm", axum::routing::patch(firecracker_vm_state))
        .route("/snapshot/create", put(firecracker_snapshot))
        .route("/snapshot/load", put(firecracker_load))
        .with_state(fake)
}

async fn firecracker_info(State(f): State<Shared>) -> Json<Value> {
    let state = if f.lock().unwrap().paused {
        "Paused"
    } else {
        "Running"
    };
    Json(
        json!({"app_name": "Firecracker", "id": "anonymous-instance", "state": state,
        "vmm_version": "1.7.0"}),
    )
}

async fn firecracker_vm_state(
    State(f): State<Shared>,
    Json(body): Json<Value>,
) -> Result<StatusCode, (StatusCode, Json<Value>)> {
    record(&f, format!("PATCH /vm {body}")).await;
    match body["state"].as_str() {
        Some("Paused") => f.lock().unwrap().paused = true,
        Some("Resumed") => f.lock().unwrap().paused = false,
        _ => return Err(fault(StatusCode::BAD_REQUEST, "unknown variant")),
    }
    Ok(StatusCode::NO_CONTENT)
}

/// Firecracker writes the microVM's state and memory by path, on a paused VM only.
async fn firecracker_snapshot(
    State(f): State<Shared>,
    Json(body): Json<Value>,
) -> Result<StatusCode, (StatusCode, Json<Value>)> {
    let delay = record(&f, format!("PUT /snapshot/create {body}")).await;
    tokio::time::sleep(delay).await;
    let (paused, refuse) = {
        let f = f.lock().unwrap();
        (f.paused, f.refuse)
    };
    if !paused {
        let why = "The requested operation is not supported while the microVM is running.";
        return Err(fault(StatusCode::BAD_REQUEST, why));
    }
    if let Some(why) = refuse {
        return Err(fault(StatusCode::BAD_REQUEST, why));
    }
    let write = |name: &str, bytes: Vec<u8>| std::fs::write(body[name].as_str().unwrap(), bytes);
    write("snapshot_path", b"firecracker microvm state".to_vec()).unwrap();
    write("mem_file_path", vec![0xa5; 1 << 20]).unwrap();
    Ok(StatusCode::NO_CONTENT)
}

/// A fresh Firecracker loads a snapshot whose files exist, then runs it if asked.
async fn firecracker_load(
    State(f): State<Shared>,
    Json(body): Json<Value>,
) -> Result<StatusCode, (StatusCode, Json<Value>)> {
    record(&f, format!("PUT /snapshot/load {body}")).await;
    let state = body["snapshot_path"].as_str().unwrap_or_default();
    let memory = body["mem_backend"]["backend_path"]
        .as_str()
        .unwrap_or_default();
    if !(Path::new(state).exists() && Path::new(memory).exists()) {
        let why = format!("Load microVM snapshot error: Cannot open snapshot file {state}");
        return Err(fault(StatusCode::BAD_REQUEST, &why));
    }
    f.lock().unwrap().paused = body["resume_vm"] != json!(true);
    Ok(StatusCode::NO_CONTENT)
}

/// The files a seal found and whether the guest was paused then (`None`: it did not run).
type Seen = Arc<Mutex<Option<(Vec<String>, bool)>>>;

/// A seal that finds the files of `dir` and whether `fake`'s guest was paused when it
/// ran (`None`: it did not run), and ends as `outcome` says.
fn seal(dir: &Path, fake: &Shared, outcome: Result<(), String>) -> (Seal, Seen) {
    let seen = Arc::new(Mutex::new(None));
    let (found, dir, fake) = (seen.clone(), dir.to_path_buf(), fake.clone());
    let seal: Seal = Box::new(move |_| {
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        *found.lock().unwrap() = Some((files, fake.lock().unwrap().paused));
        Box::pin(async move { outcome })
    });
    (seal, seen)
}

const LIMIT: Duration = Duration::from_secs(5);

#[tokio::test]
async fn firecracker_saves_paused_and_resumes_before_the_seal() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let fake = Shared::default();
    let socket = serve(dir.path(), firecracker(fake.clone(), true));
    let mut vm = FirecrackerVm::connect(&socket, &opts(1000), None)
        .await
        .unwrap();
    // A snapshot's directory in its VM's, where a save marks the guest it paused.
    let store = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir_in(store.path()).unwrap();
    let (sealed, seen) = seal(out.path(), &fake, Ok(()));
    let saved = vm
        .save(out.path(), AfterSave::Run, LIMIT, sealed)
        .await
        .unwrap();
    assert!(saved.was_running);
    assert_eq!(saved.mechanism, "firecracker snapshot/create");
    let files = ["memory".to_string(), "vmstate".to_string()];
    assert_eq!(
        *seen.lock().unwrap(),
        Some((files.to_vec(), false)),
        "resumed, then sealed"
    );
    let mode = std::fs::metadata(out.path().join("memory"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "guest memory for its owner alone");
    let create = json!({"snapshot_type": "Full",
        "snapshot_path": out.path().join("vmstate"), "mem_file_path": out.path().join("memory")});
    assert_eq!(
        fake.lock().unwrap().log[1..],
        [
            "PATCH /vm {\"state\":\"Paused\"}".to_string(),
            format!("PUT /snapshot/create {create}"),
            "PATCH /vm {\"state\":\"Resumed\"}".to_string(),
        ]
    );
}

#[tokio::test]
async fn firecracker_refusing_a_snapshot_leaves_the_guest_running_and_nothing_sealed() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Shared::default();
    fake.lock().unwrap().refuse = Some("Cannot write the memory file: No space left on device");
    let socket = serve(dir.path(), firecracker(fake.clone(), true));
    let mut vm = FirecrackerVm::connect(&socket, &opts(1000), None)
        .await
        .unwrap();
    // A snapshot's directory in its VM's, where a save marks the guest it paused.
    let store = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir_in(store.path()).unwrap();
    for then in [AfterSave::Run, AfterSave::Quit] {
        let (sealed, seen) = seal(out.path(), &fake, Ok(()));
        let e = vm.save(out.path(), then, LIMIT, sealed).await.unwrap_err();
        assert!(e.to_string().ends_with("No space left on device"), "{e}");
        assert_eq!(*seen.lock().unwrap(), None, "nothing to seal");
        let f = fake.lock().unwrap();
        assert!(!f.paused, "resumed");
        assert_eq!(f.log.last().unwrap(), "PATCH /vm {\"state\":\"Resumed\"}");
    }
}

#[tokio::test]
async fn a_firecracker_hibernation_whose_seal_fails_runs_on() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Shared::default();
    let socket = serve(dir.path(), firecracker(fake.clone(), true));
    let mut vm = FirecrackerVm::connect(&socket, &opts(1000), None)
        .await
        .unwrap();
    // A snapshot's directory in its VM's, where a save marks the guest it paused.
    let store = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir_in(store.path()).unwrap();
    // The process to kill would be this test's own (it serves the socket): the seal fails.
    let (sealed, seen) = seal(out.path(), &fake, Err("No space left on device".into()));
    let e = vm
        .save(out.path(), AfterSave::Quit, LIMIT, sealed)
        .await
        .unwrap_err();
    assert_eq!(e.to_string(), "No space left on device; the guest runs on");
    let seen = seen.lock().unwrap().clone().unwrap();
    assert!(
        seen.1,
        "still paused while sealing: a hibernation resumes only on failure"
    );
    assert!(!fake.lock().unwrap().paused);
}

/// A stand-in for Firecracker's process: a proxy to the fake's socket, so that the
/// socket's peer credentials name a process a hibernation may kill (not the test's own).
const PROXY: &str = "
import os, socket, sys, threading
def pipe(a, b):
    try:
        while True:
            d = a.recv(65536)
            if not d:
                break
            b.sendall(d)
    except OSError:
        pass
    try:
        b.shutdown(socket.SHUT_WR)
    except OSError:
        pass
listener = socket.socket(socket.AF_UNIX)
listener.bind(sys.argv[1] + '.binding')
listener.listen()
os.rename(sys.argv[1] + '.binding', sys.argv[1])
while True:
    c, _ = listener.accept()
    u = socket.socket(socket.AF_UNIX)
    u.connect(sys.argv[2])
    threading.Thread(target=pipe, args=(c, u), daemon=True).start()
    threading.Thread(target=pipe, args=(u, c), daemon=True).start()
";

#[tokio::test]
async fn a_firecracker_hibernation_kills_its_process_once_sealed() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let fake = Shared::default();
    let served = serve(dir.path(), firecracker(fake.clone(), true));
    let socket = dir.path().join("fc.sock");
    let mut process = stand_in(&socket, &served);
    let mut vm = FirecrackerVm::connect(&socket, &opts(1000), None)
        .await
        .unwrap();
    // A snapshot's directory in its VM's, where a save marks the guest it paused.
    let store = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir_in(store.path()).unwrap();
    let (sealed, seen) = seal(out.path(), &fake, Ok(()));
    let saved = vm.save(out.path(), AfterSave::Quit, LIMIT, sealed).await;
    let ended = (0..300).find_map(|_| {
        let status = process.try_wait().unwrap();
        if status.is_none() {
            std::thread::sleep(Duration::from_millis(10));
        }
        status
    });
    if ended.is_none() {
        let _ = process.kill();
        let _ = process.wait();
    }
    saved.unwrap();
    let files = ["memory".to_string(), "vmstate".to_string()];
    assert_eq!(
        *seen.lock().unwrap(),
        Some((files.to_vec(), true)),
        "sealed while paused"
    );
    let signal = ended.and_then(|status| status.signal());
    assert_eq!(signal, Some(9), "killed by the hibernation: {ended:?}");
    let log = fake.lock().unwrap().log.clone();
    assert!(
        log.last().unwrap().starts_with("PUT /snapshot/create"),
        "not resumed: {log:?}"
    );
}

/// A stand-in for Firecracker's process serving `socket` (a proxy to `served`); the socket
/// appears at its path only once it listens, so a connect as soon as it exists succeeds.
fn stand_in(socket: &Path, served: &Path) -> std::process::Child {
    let process = std::process::Command::new("python3")
        .args(["-c", PROXY])
        .args([socket, served])
        .spawn()
        .expect("python3, to stand in for Firecracker's process");
    let listening = (0..500).any(|_| {
        std::thread::sleep(Duration::from_millis(10));
        socket.exists()
    });
    assert!(listening, "the stand-in did not listen");
    process
}

#[tokio::test]
async fn a_firecracker_replaced_on_its_socket_is_not_killed_and_its_guest_runs_on() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Shared::default();
    let served = serve(dir.path(), firecracker(fake.clone(), true));
    let socket = dir.path().join("fc.sock");
    let mut first = stand_in(&socket, &served);
    let mut vm = FirecrackerVm::connect(&socket, &opts(1000), None)
        .await
        .unwrap();
    assert_eq!(vm.pid(), Some(i32::try_from(first.id()).unwrap()));
    // The process memtide connected to ends; another serves the same socket.
    first.kill().unwrap();
    first.wait().unwrap();
    std::fs::remove_file(&socket).unwrap();
    let mut second = stand_in(&socket, &served);
    // A snapshot's directory in its VM's, where a save marks the guest it paused.
    let store = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir_in(store.path()).unwrap();
    let (sealed, _) = seal(out.path(), &fake, Ok(()));
    let e = vm
        .save(out.path(), AfterSave::Quit, LIMIT, sealed)
        .await
        .unwrap_err()
        .to_string();
    let alive = second.try_wait().unwrap().is_none();
    let _ = second.kill();
    let _ = second.wait();
    assert!(alive, "the process serving the socket now is not killed");
    assert!(
        e.starts_with("saved, but the VMM did not quit (")
            && e.ends_with(") and still runs; the guest runs on"),
        "{e}"
    );
    let f = fake.lock().unwrap();
    assert!(!f.paused, "resumed");
    assert_eq!(f.log.last().unwrap(), "PATCH /vm {\"state\":\"Resumed\"}");
}

/// A launch command that "starts a VMM": its API socket becomes a link to `served` (the
/// fake's), and it waits.
fn linking_launch(served: &Path, socket: &Path) -> Vec<String> {
    let script = format!(
        "ln -s {} {} && exec sleep 30",
        served.display(),
        socket.display()
    );
    vec!["sh".into(), "-c".into(), script]
}

/// End the process a restore started.
fn kill(pid: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status();
}

#[tokio::test]
async fn firecracker_restores_into_a_fresh_process_by_its_launch_command() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Shared::default();
    fake.lock().unwrap().paused = true;
    let served = serve(dir.path(), firecracker(fake.clone(), true));
    let snap = tempfile::tempdir().unwrap();
    std::fs::write(snap.path().join("vmstate"), "state").unwrap();
    std::fs::write(snap.path().join("memory"), "memory").unwrap();
    let (socket, log) = (dir.path().join("fc.sock"), dir.path().join("fc.log"));
    let command = linking_launch(&served, &socket);
    let launch = Launch {
        command: &command,
        socket: &socket,
        ping: "/",
        log: &log,
        limit: LIMIT,
    };
    let restored = firecracker::restore(&launch, snap.path(), true)
        .await
        .unwrap();
    kill(restored.pid);
    let load = json!({"snapshot_path": snap.path().join("vmstate"), "resume_vm": true,
        "mem_backend": {"backend_type": "File", "backend_path": snap.path().join("memory")}});
    {
        let f = fake.lock().unwrap();
        assert_eq!(f.log, [format!("PUT /snapshot/load {load}")]);
        assert!(!f.paused, "resumed as it ran when saved");
    }

    // A snapshot Firecracker cannot load: the process is killed, the fault in the error.
    std::fs::remove_file(snap.path().join("vmstate")).unwrap();
    let e = firecracker::restore(&launch, snap.path(), true)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("Cannot open snapshot file"), "{e}");
    // A launch command that fails at once is reported with its output.
    let command = [
        "sh".to_string(),
        "-c".into(),
        "echo no KVM here >&2; exit 1".into(),
    ];
    let launch = Launch {
        command: &command,
        ..launch
    };
    let e = firecracker::restore(&launch, snap.path(), true)
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "disconnected: sh exited before its API socket answered (its output: no KVM here)"
    );
}

#[tokio::test]
async fn firecracker_balloon_size_is_the_inflation_not_the_guest() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Shared::default();
    let socket = serve(dir.path(), firecracker(fake.clone(), true));
    let mut vm = FirecrackerVm::connect(&socket, &opts(1000), None)
        .await
        .unwrap();
    let s = vm.sample().await.unwrap();
    assert_eq!(s.configured, Bytes::from_mib(512));
    assert_eq!(
        s.balloon,
        Some(Bytes::from_mib(512)),
        "no inflation: full size"
    );
    assert_eq!(s.stats.free, Some(Bytes::from_mib(300)));
    assert_eq!(s.stats.available, Some(Bytes::from_mib(350)));
    assert_eq!(s.stats.swap_out, Some(Bytes(8192)));
    assert_eq!(s.stats.minor_faults, Some(5000));
    assert!(
        s.rss.is_some(),
        "the VMM's RSS from its pid (this test process)"
    );

    vm.set_balloon(Bytes::from_mib(384)).await.unwrap();
    assert_eq!(vm.target(), Some(Bytes::from_mib(384)));
    let s = vm.sample().await.unwrap();
    assert_eq!(s.balloon, Some(Bytes::from_mib(384)));
    // A target between MiB: the guest keeps at least the target.
    vm.set_balloon(Bytes::from_mib(300) + Bytes(1))
        .await
        .unwrap();
    let log = fake.lock().unwrap().log.clone();
    assert_eq!(
        log,
        [
            "PATCH /balloon/statistics {\"stats_polling_interval_s\":2}",
            "GET /balloon/statistics",
            "PATCH /balloon {\"amount_mib\":128}",
            "GET /balloon/statistics",
            "PATCH /balloon {\"amount_mib\":211}",
        ]
    );
}

#[tokio::test]
async fn firecracker_without_statistics_reports_the_balloon_target() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Shared::default();
    fake.lock().unwrap().balloon = 100;
    let socket = serve(dir.path(), firecracker(fake.clone(), false));
    let mut vm = FirecrackerVm::connect(&socket, &opts(1000), None)
        .await
        .unwrap();
    let s = vm.sample().await.unwrap();
    assert_eq!(s.balloon, Some(Bytes::from_mib(412)));
    assert!(s.stats.is_empty());
    assert!(
        fake.lock().unwrap().log.is_empty(),
        "statistics cannot be turned on after boot: not asked"
    );
}

#[tokio::test]
async fn firecracker_errors_carry_the_fault_message() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Shared::default();
    let socket = serve(dir.path(), firecracker(fake.clone(), true));
    let mut vm = FirecrackerVm::connect(&socket, &opts(300), None)
        .await
        .unwrap();
    // A target above the guest's size asks for a negative balloon; clamp at zero...
    vm.set_balloon(Bytes::from_mib(4096)).await.unwrap();
    assert!(fake
        .lock()
        .unwrap()
        .log
        .last()
        .unwrap()
        .ends_with("{\"amount_mib\":0}"));

    // ...while the server's refusals surface with their fault message.
    let no_balloon = Router::new()
        .route(
            "/machine-config",
            get(|| async { Json(json!({"mem_size_mib": 256})) }),
        )
        .route(
            "/balloon",
            get(|| async {
                fault(
                    StatusCode::BAD_REQUEST,
                    "Invalid request method and/or path: GET /balloon.",
                )
            }),
        );
    let dir2 = tempfile::tempdir().unwrap();
    let socket2 = serve(dir2.path(), no_balloon);
    let mut bare = FirecrackerVm::connect(&socket2, &opts(300), None)
        .await
        .unwrap();
    assert_eq!(bare.sample().await.unwrap().balloon, None);
    assert_eq!(
        bare.set_balloon(Bytes::from_mib(128))
            .await
            .unwrap_err()
            .to_string(),
        "no balloon device: Invalid request method and/or path: GET /balloon."
    );

    // A slow answer is a timeout, not a hang.
    fake.lock().unwrap().delay = Duration::from_millis(800);
    let err = vm.sample().await.unwrap_err();
    assert_eq!(err, BackendError::Timeout(300));
    let err = vm.set_balloon(Bytes::from_mib(256)).await.unwrap_err();
    assert_eq!(err, BackendError::Timeout(300));
}

#[tokio::test]
async fn a_socket_nobody_listens_on_is_a_disconnect() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dead.sock");
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap()); // the file stays
    let err = FirecrackerVm::connect(&path, &opts(300), None)
        .await
        .err()
        .unwrap();
    assert!(
        matches!(&err, BackendError::Disconnected(m) if m.contains("Connection refused")),
        "{err}"
    );
    let err = CloudHypervisorVm::connect(&path, &opts(300), None)
        .await
        .err()
        .unwrap();
    assert!(matches!(err, BackendError::Disconnected(_)), "{err}");
}

/// Cloud Hypervisor with a 1 GiB guest; `stats` says whether this release has
/// `vm.balloon-stats`.
fn cloud_hypervisor(fake: Shared, state: &'static str, stats: bool) -> Router {
    let router = Router::new()
        .route(
            "/api/v1/vm.info",
            get(move |State(f): State<Shared>| async move {
                let balloon = f.lock().unwrap().balloon;
                Json(json!({
                    "config": {
                        "memory": {"size": 1u64 << 30, "hotplugged_size": 0, "mergeable": false},
                        "balloon": {"size": balloon, "deflate_on_oom": true, "free_page_reporting": true},
                        "payload": {"kernel": "/vmlinux"}
                    },
                    "state": if f.lock().unwrap().paused { "Paused" } else { state },
                    "memory_actual_size": (1u64 << 30) - balloon
                }))
            }),
        )
        .route(
            "/api/v1/vm.resize",
            put(|State(f): State<Shared>, Json(body): Json<Value>| async move {
                record(&f, format!("PUT /api/v1/vm.resize {body}")).await;
                match body["desired_balloon"].as_u64() {
                    Some(b) if b <= 1 << 30 => {
                        f.lock().unwrap().balloon = b;
                        (StatusCode::NO_CONTENT, String::new())
                    }
                    _ => (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "Error from API: The VM could not be resized".into(),
                    ),
                }
            }),
        );
    let router = router
        .route(
            "/api/v1/vm.pause",
            put(|State(f): State<Shared>| ch_pause(f, true)),
        )
        .route(
            "/api/v1/vm.resume",
            put(|State(f): State<Shared>| ch_pause(f, false)),
        )
        .route("/api/v1/vm.snapshot", put(ch_snapshot))
        .route("/api/v1/vm.restore", put(ch_restore))
        .route(
            "/api/v1/vmm.ping",
            get(|| async { Json(json!({"version": "v43.0"})) }),
        )
        .route(
            "/api/v1/vmm.shutdown",
            put(|State(f): State<Shared>| async move {
                record(&f, "PUT /api/v1/vmm.shutdown".into()).await;
                f.lock().unwrap().shut_down = true;
                StatusCode::NO_CONTENT
            }),
        );
    let router = if stats {
        router.route(
            "/api/v1/vm.balloon-stats",
            get(|State(f): State<Shared>| async move {
                let balloon = f.lock().unwrap().balloon;
                Json(
                    json!({"balloon_actual": balloon, "last_update": 1_700_000_000_123u64,
                    "stats": {"free_memory": 600u64 << 20, "available_memory": 700u64 << 20,
                        "total_memory": 1000u64 << 20, "major_faults": 9, "oom_kills": 1}}),
                )
            }),
        )
    } else {
        router
    };
    router.with_state(fake)
}

async fn ch_pause(f: Shared, pause: bool) -> (StatusCode, String) {
    let call = if pause { "vm.pause" } else { "vm.resume" };
    record(&f, format!("PUT /api/v1/{call}")).await;
    let mut f = f.lock().unwrap();
    if f.paused == pause {
        let why = format!("Error from API: The VM could not be {call}d: invalid state");
        return (StatusCode::INTERNAL_SERVER_ERROR, why);
    }
    f.paused = pause;
    (StatusCode::NO_CONTENT, String::new())
}

/// Cloud Hypervisor writes its files into the directory of a `file://` URL, of a paused
/// VM only.
async fn ch_snapshot(State(f): State<Shared>, Json(body): Json<Value>) -> (StatusCode, String) {
    record(&f, format!("PUT /api/v1/vm.snapshot {body}")).await;
    let (paused, refuse) = {
        let f = f.lock().unwrap();
        (f.paused, f.refuse)
    };
    let fail = |why: &str| {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("Error from API: {why}"),
        )
    };
    if !paused {
        return fail("The VM could not be snapshotted: the VM is not paused");
    }
    if let Some(why) = refuse {
        return fail(why);
    }
    let Some(dir) = body["destination_url"]
        .as_str()
        .and_then(|u| u.strip_prefix("file://"))
    else {
        return fail("The VM could not be snapshotted: invalid URL");
    };
    let dir = Path::new(dir);
    std::fs::write(dir.join("config.json"), "{}").unwrap();
    std::fs::write(dir.join("state.json"), "{}").unwrap();
    std::fs::write(dir.join("memory-ranges"), vec![0x5a; 1 << 20]).unwrap();
    (StatusCode::NO_CONTENT, String::new())
}

/// A fresh Cloud Hypervisor restores a snapshot whose files exist, paused.
async fn ch_restore(State(f): State<Shared>, Json(body): Json<Value>) -> (StatusCode, String) {
    record(&f, format!("PUT /api/v1/vm.restore {body}")).await;
    let dir = body["source_url"]
        .as_str()
        .unwrap_or_default()
        .trim_start_matches("file://");
    if !Path::new(dir).join("state.json").exists() {
        let why = "Error from API: The VM could not be restored: missing state.json";
        return (StatusCode::INTERNAL_SERVER_ERROR, why.into());
    }
    f.lock().unwrap().paused = true;
    (StatusCode::NO_CONTENT, String::new())
}

#[tokio::test]
async fn cloud_hypervisor_hibernates_paused_and_ends_its_process_once_sealed() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Shared::default();
    let socket = serve(dir.path(), cloud_hypervisor(fake.clone(), "Running", true));
    let mut vm = CloudHypervisorVm::connect(&socket, &opts(1000), None)
        .await
        .unwrap();
    // A snapshot's directory in its VM's, where a save marks the guest it paused.
    let store = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir_in(store.path()).unwrap();
    let (sealed, seen) = seal(out.path(), &fake, Ok(()));
    let saved = vm
        .save(out.path(), AfterSave::Quit, LIMIT, sealed)
        .await
        .unwrap();
    assert!(saved.was_running);
    let files = ["config.json", "memory-ranges", "state.json"].map(String::from);
    assert_eq!(
        *seen.lock().unwrap(),
        Some((files.to_vec(), true)),
        "sealed while paused"
    );
    let url = format!("file://{}", out.path().display());
    assert_eq!(
        fake.lock().unwrap().log,
        [
            "PUT /api/v1/vm.pause".to_string(),
            format!(
                "PUT /api/v1/vm.snapshot {}",
                json!({"destination_url": url})
            ),
            "PUT /api/v1/vmm.shutdown".to_string(),
        ]
    );

    // A snapshot that runs on: resumed before the seal, the process left alone.
    let fake = Shared::default();
    let dir = tempfile::tempdir().unwrap();
    let socket = serve(dir.path(), cloud_hypervisor(fake.clone(), "Running", true));
    let mut vm = CloudHypervisorVm::connect(&socket, &opts(1000), None)
        .await
        .unwrap();
    // A snapshot's directory in its VM's, where a save marks the guest it paused.
    let store = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir_in(store.path()).unwrap();
    let (sealed, seen) = seal(out.path(), &fake, Ok(()));
    vm.save(out.path(), AfterSave::Run, LIMIT, sealed)
        .await
        .unwrap();
    assert!(
        !seen.lock().unwrap().clone().unwrap().1,
        "resumed, then sealed"
    );
    let f = fake.lock().unwrap();
    assert_eq!(f.log.last().unwrap(), "PUT /api/v1/vm.resume");
    assert!(!f.shut_down);
}

#[tokio::test]
async fn cloud_hypervisor_refusals_and_failed_seals_leave_the_guest_running() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Shared::default();
    fake.lock().unwrap().refuse = Some("The VM could not be snapshotted: No space left on device");
    let socket = serve(dir.path(), cloud_hypervisor(fake.clone(), "Running", true));
    let mut vm = CloudHypervisorVm::connect(&socket, &opts(1000), None)
        .await
        .unwrap();
    // A snapshot's directory in its VM's, where a save marks the guest it paused.
    let store = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir_in(store.path()).unwrap();
    let (sealed, seen) = seal(out.path(), &fake, Ok(()));
    let e = vm
        .save(out.path(), AfterSave::Quit, LIMIT, sealed)
        .await
        .unwrap_err();
    assert!(e.to_string().ends_with("No space left on device"), "{e}");
    assert_eq!(*seen.lock().unwrap(), None, "nothing to seal");
    {
        let f = fake.lock().unwrap();
        assert!(!f.paused && !f.shut_down);
        assert_eq!(f.log.last().unwrap(), "PUT /api/v1/vm.resume");
    }
    // Written, but the seal fails (a full disk): the hibernation is called off.
    fake.lock().unwrap().refuse = None;
    let (sealed, _) = seal(out.path(), &fake, Err("No space left on device".into()));
    let e = vm
        .save(out.path(), AfterSave::Quit, LIMIT, sealed)
        .await
        .unwrap_err();
    assert_eq!(e.to_string(), "No space left on device; the guest runs on");
    let f = fake.lock().unwrap();
    assert!(!f.paused && !f.shut_down, "{:?}", f.log);
}

#[tokio::test]
async fn cloud_hypervisor_restores_into_a_fresh_process_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Shared::default();
    let served = serve(dir.path(), cloud_hypervisor(fake.clone(), "Running", true));
    let snap = tempfile::tempdir().unwrap();
    std::fs::write(snap.path().join("state.json"), "{}").unwrap();
    let (socket, log) = (dir.path().join("ch.sock"), dir.path().join("ch.log"));
    let command = linking_launch(&served, &socket);
    let ping = "/api/v1/vmm.ping";
    let launch = Launch {
        command: &command,
        socket: &socket,
        ping,
        log: &log,
        limit: LIMIT,
    };
    let restored = cloud_hypervisor::restore(&launch, snap.path(), true)
        .await
        .unwrap();
    kill(restored.pid);
    let url = format!("file://{}", snap.path().display());
    {
        let f = fake.lock().unwrap();
        assert_eq!(
            f.log,
            [
                format!("PUT /api/v1/vm.restore {}", json!({"source_url": url})),
                "PUT /api/v1/vm.resume".to_string(),
            ]
        );
        assert!(!f.paused);
    }
    std::fs::remove_file(snap.path().join("state.json")).unwrap();
    let e = cloud_hypervisor::restore(&launch, snap.path(), false)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("missing state.json"), "{e}");
}

#[tokio::test]
async fn cloud_hypervisor_resizes_the_balloon_in_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Shared::default();
    let socket = serve(dir.path(), cloud_hypervisor(fake.clone(), "Running", true));
    let mut vm = CloudHypervisorVm::connect(&socket, &opts(1000), None)
        .await
        .unwrap();
    let s = vm.sample().await.unwrap();
    assert_eq!(
        (s.configured, s.balloon),
        (Bytes::from_gib(1), Some(Bytes::from_gib(1)))
    );
    assert_eq!(s.stats.free, Some(Bytes::from_mib(600)));
    assert_eq!(s.stats.oom_kills, Some(1));
    assert_eq!(
        s.stats.last_update,
        Some(1_700_000_000),
        "milliseconds to seconds"
    );
    vm.set_balloon(Bytes::from_mib(768)).await.unwrap();
    assert_eq!(
        vm.sample().await.unwrap().balloon,
        Some(Bytes::from_mib(768))
    );
    assert_eq!(
        fake.lock().unwrap().log,
        ["PUT /api/v1/vm.resize {\"desired_balloon\":268435456}"]
    );
}

/// This process (serving the fakes) as a save's mark names it: its pid and start time.
fn me() -> String {
    let pid = std::process::id() as i32;
    let start = memtide_adapters::procfs::start_time(Path::new("/proc"), pid).unwrap();
    format!("{pid} {start}")
}

#[tokio::test]
async fn a_firecracker_guest_a_save_cut_short_left_paused_is_resumed_at_the_next_connection() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Shared::default();
    let socket = serve(dir.path(), firecracker(fake.clone(), true));
    let store = tempfile::tempdir().unwrap();
    let (out, mark) = (
        store.path().join("1.partial"),
        store.path().join(PAUSED_MARK),
    );
    std::fs::create_dir(&out).unwrap();
    let mut vm = FirecrackerVm::connect(&socket, &opts(1000), Some(&mark))
        .await
        .unwrap();
    // The snapshot takes long, and its save is cut short (as by memtide killed): the
    // guest stays paused, marked so.
    fake.lock().unwrap().delay = Duration::from_secs(30);
    let (sealed, _) = seal(&out, &fake, Ok(()));
    let cut = tokio::time::timeout(
        Duration::from_millis(300),
        vm.save(&out, AfterSave::Run, LIMIT, sealed),
    );
    assert!(cut.await.is_err());
    assert!(fake.lock().unwrap().paused);
    let marked = std::fs::read_to_string(&mark).unwrap();
    assert_eq!(marked, me(), "the fake's process");
    drop(vm);
    // Connected again, by the same process: resumed, the mark gone.
    fake.lock().unwrap().delay = Duration::ZERO;
    let mut vm = FirecrackerVm::connect(&socket, &opts(1000), Some(&mark))
        .await
        .unwrap();
    assert!(!fake.lock().unwrap().paused);
    let said = vm.resumed_at_connection().unwrap();
    assert!(said.contains("was resumed"), "{said}");
    assert_eq!(vm.resumed_at_connection(), None, "said once");
    assert_eq!(
        fake.lock().unwrap().log.last().unwrap(),
        "PATCH /vm {\"state\":\"Resumed\"}"
    );
    assert!(!mark.exists());
    // A guest paused by its operator, with no mark: left paused.
    fake.lock().unwrap().paused = true;
    let vm = FirecrackerVm::connect(&socket, &opts(1000), Some(&mark)).await;
    assert!(vm.is_ok());
    assert!(fake.lock().unwrap().paused);
}

#[tokio::test]
async fn a_cloud_hypervisor_guest_a_save_left_paused_is_resumed_and_connected_only_if_marked() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Shared::default();
    fake.lock().unwrap().paused = true;
    let socket = serve(dir.path(), cloud_hypervisor(fake.clone(), "Running", true));
    let store = tempfile::tempdir().unwrap();
    let mark = store.path().join(PAUSED_MARK);
    // Marked by a save of another process (Cloud Hypervisor restarted since): not
    // resumed, refused as paused, and the stale mark removed.
    std::fs::write(&mark, "1 1").unwrap();
    let err = CloudHypervisorVm::connect(&socket, &opts(1000), Some(&mark)).await;
    assert_eq!(
        err.err(),
        Some(BackendError::Busy("the VM is paused".into()))
    );
    assert!(fake.lock().unwrap().paused && !mark.exists());
    // Marked by a save of this one: resumed, and connected.
    std::fs::write(&mark, me()).unwrap();
    let vm = CloudHypervisorVm::connect(&socket, &opts(1000), Some(&mark)).await;
    assert!(vm.is_ok(), "{:?}", vm.err());
    assert!(!fake.lock().unwrap().paused && !mark.exists());
}

#[tokio::test]
async fn cloud_hypervisor_without_balloon_statistics_and_its_errors() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Shared::default();
    fake.lock().unwrap().balloon = 1 << 28;
    let socket = serve(dir.path(), cloud_hypervisor(fake.clone(), "Running", false));
    let mut vm = CloudHypervisorVm::connect(&socket, &opts(1000), None)
        .await
        .unwrap();
    let s = vm.sample().await.unwrap();
    assert_eq!(s.balloon, Some(Bytes::from_mib(768)));
    assert!(
        s.stats.is_empty(),
        "an older release: no statistics, no error"
    );

    let paused = tempfile::tempdir().unwrap();
    let socket = serve(
        paused.path(),
        cloud_hypervisor(fake.clone(), "Paused", false),
    );
    let err = CloudHypervisorVm::connect(&socket, &opts(1000), None)
        .await
        .err()
        .unwrap();
    assert_eq!(err, BackendError::Busy("the VM is paused".into()));
    let created = tempfile::tempdir().unwrap();
    let socket = serve(created.path(), cloud_hypervisor(fake, "Created", false));
    let err = CloudHypervisorVm::connect(&socket, &opts(1000), None)
        .await
        .err()
        .unwrap();
    assert_eq!(
        err,
        BackendError::Disconnected("the VM is not running (state Created)".into())
    );
}

#[tokio::test]
async fn an_endless_response_body_is_cut_off_at_the_limit_while_reading() {
    // A hostile VMM answers with a chunked body that does not end (64 MiB at most, then
    // it stops by itself). Before, the daemon collected the whole body first (886 MiB in
    // the audit) and here would have run into the call timeout; now it stops at 4 MiB.
    use memtide_adapters::api_socket::ApiSocket;
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("api.sock");
    let listener = UnixListener::bind(&path).unwrap();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
        if s.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        let mut chunk = format!("{:x}\r\n", 64 << 10).into_bytes();
        chunk.extend(vec![b' '; 64 << 10]);
        chunk.extend(b"\r\n");
        for _ in 0..1024 {
            if s.write_all(&chunk).await.is_err() {
                return; // the client hung up
            }
        }
    });
    let api = ApiSocket::new(&path, Duration::from_secs(30));
    let err = api
        .call(axum::http::Method::GET, "/vm.info", None)
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("response larger than 4194304 bytes"),
        "{err}"
    );
}
