//! The Firecracker and Cloud Hypervisor backends against in-process fake servers that
//! implement the documented APIs on a unix socket (KVM, which both need, does not work
//! on the build machines): field names, status codes and error bodies as documented,
//! plus the failures a real server shows (a refused connection, a slow answer).

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, put};
use axum::{Json, Router};
use memtide_adapters::api_socket::ApiVmOptions;
use memtide_adapters::cloud_hypervisor::CloudHypervisorVm;
use memtide_adapters::firecracker::FirecrackerVm;
use memtide_core::backend::VmBackend;
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
        .with_state(fake)
}

#[tokio::test]
async fn firecracker_balloon_size_is_the_inflation_not_the_guest() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Shared::default();
    let socket = serve(dir.path(), firecracker(fake.clone(), true));
    let mut vm = FirecrackerVm::connect(&socket, &opts(1000)).await.unwrap();
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
    let mut vm = FirecrackerVm::connect(&socket, &opts(1000)).await.unwrap();
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
    let mut vm = FirecrackerVm::connect(&socket, &opts(300)).await.unwrap();
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
    let mut bare = FirecrackerVm::connect(&socket2, &opts(300)).await.unwrap();
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
    let err = FirecrackerVm::connect(&path, &opts(300))
        .await
        .err()
        .unwrap();
    assert!(
        matches!(&err, BackendError::Disconnected(m) if m.contains("Connection refused")),
        "{err}"
    );
    let err = CloudHypervisorVm::connect(&path, &opts(300))
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
                    "state": state,
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

#[tokio::test]
async fn cloud_hypervisor_resizes_the_balloon_in_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Shared::default();
    let socket = serve(dir.path(), cloud_hypervisor(fake.clone(), "Running", true));
    let mut vm = CloudHypervisorVm::connect(&socket, &opts(1000))
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

#[tokio::test]
async fn cloud_hypervisor_without_balloon_statistics_and_its_errors() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Shared::default();
    fake.lock().unwrap().balloon = 1 << 28;
    let socket = serve(dir.path(), cloud_hypervisor(fake.clone(), "Running", false));
    let mut vm = CloudHypervisorVm::connect(&socket, &opts(1000))
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
    let err = CloudHypervisorVm::connect(&socket, &opts(1000))
        .await
        .err()
        .unwrap();
    assert_eq!(err, BackendError::Busy("the VM is paused".into()));
    let created = tempfile::tempdir().unwrap();
    let socket = serve(created.path(), cloud_hypervisor(fake, "Created", false));
    let err = CloudHypervisorVm::connect(&socket, &opts(1000))
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
