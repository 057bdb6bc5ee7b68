//! KubeVirt launcher pods' memory requests and limits, listed from the Kubernetes API
//! server by a task of their own, as their VMs' bounds
//! (`memtide_adapters::kubevirt::pods`). A list that fails keeps the last one in force
//! for a while, then the VMs take their domains' own bounds; the failure is logged once,
//! then every [`LOG_EVERY`] while it lasts, and the daemon goes on. A pod whose memory
//! cannot be read is logged once, and again only when why changes.

use super::backoff::{Failures, LOG_EVERY};
use memtide_adapters::kubevirt::api::ApiServer;
use memtide_adapters::kubevirt::pods::{LauncherPods, PodMemory};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// A list asked for early (a VM whose pod is not known yet) waits at least this long
/// after the previous one.
const EARLIEST: Duration = Duration::from_secs(2);
/// The last list stays in force for this many refresh periods after it, while lists
/// fail: an API server restarting does not drop every VM's minimum.
const KEEP_PERIODS: u32 = 10;

/// The pods' memory as last listed, shared by the listing task and the fleet.
pub struct PodBounds {
    known: Mutex<Known>,
    wake: Notify,
    keep: Duration,
}

#[derive(Default)]
struct Known {
    pods: BTreeMap<String, PodMemory>,
    /// Each running launcher pod's VM, by the pod's UID.
    vms: BTreeMap<String, String>,
    /// When the list was taken; `None` before the first that succeeded.
    at: Option<Instant>,
}

impl PodBounds {
    /// Pod bounds that a list keeps in force for `keep` after it was taken.
    pub fn new(keep: Duration) -> PodBounds {
        PodBounds {
            known: Mutex::default(),
            wake: Notify::new(),
            keep,
        }
    }

    /// The memory of VM `vm`'s pod, when a list no older than `keep` holds it.
    pub fn get(&self, vm: &str) -> Option<PodMemory> {
        let known = self.known.lock().expect("pod bounds lock");
        let fresh = known.at.is_some_and(|at| at.elapsed() <= self.keep);
        fresh.then(|| known.pods.get(vm).copied()).flatten()
    }

    /// The VM launcher pod `uid` runs, by the last list that held the pod, however old:
    /// a pod's UID is never given to another pod.
    pub fn vm_of(&self, uid: &str) -> Option<String> {
        let known = self.known.lock().expect("pod bounds lock");
        known.vms.get(uid).cloned()
    }

    /// Ask for a list soon: a VM connected whose pod the last list did not hold.
    pub fn ask(&self) {
        self.wake.notify_one();
    }

    fn set(&self, pods: LauncherPods, at: Instant) {
        let mut known = self.known.lock().expect("pod bounds lock");
        known.pods = pods.memory;
        // Pods ended since are forgotten only after the list that finds them gone.
        known.vms = pods.vms;
        known.at = Some(at);
    }
}

/// List the launcher pods on `node` from `api` every `every` (and soon after an
/// [`PodBounds::ask`]), until the returned bounds are dropped.
pub fn start(api: ApiServer, node: String, every: Duration) -> Arc<PodBounds> {
    let bounds = Arc::new(PodBounds::new(every * KEEP_PERIODS));
    tokio::spawn(list(api, node, every, Arc::downgrade(&bounds)));
    bounds
}

async fn list(api: ApiServer, node: String, every: Duration, weak: Weak<PodBounds>) {
    let mut failures = Failures::default();
    let mut unreadable = BTreeMap::new();
    loop {
        let result = api.launcher_pods(&node).await;
        let Some(bounds) = weak.upgrade() else {
            return; // the daemon stopped
        };
        let now = Instant::now();
        match result {
            Ok(mut pods) => {
                if let Some(failed) = failures.succeeded() {
                    tracing::info!(
                        "KubeVirt pod bounds: the Kubernetes API answers again after {failed} \
                         failed lists; {} launcher pods on {node}",
                        pods.memory.len()
                    );
                }
                let unreadable_now = std::mem::take(&mut pods.unreadable);
                for (pod, why) in newly_unreadable(&mut unreadable, unreadable_now) {
                    tracing::warn!(
                        "KubeVirt pod bounds: pod {pod}: {why}: its VM takes its domain's \
                         bounds (logged again only if this changes)"
                    );
                }
                bounds.set(pods, now);
            }
            Err(e) => {
                if let Some(n) = failures.failed(now) {
                    tracing::warn!(
                        "KubeVirt pod bounds: {e} ({n} failed lists; the last list that \
                         succeeded stays in force for {} s after it, then the VMs take their \
                         domains' bounds; a launcher whose pod no list has held is not \
                         managed until one does; retried every {} s, logged again in {} s \
                         while it fails)",
                        bounds.keep.as_secs(),
                        every.as_secs(),
                        LOG_EVERY.as_secs()
                    );
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep_until(now + every) => {}
            _ = bounds.wake.notified() => tokio::time::sleep_until(now + EARLIEST).await,
        }
    }
}

/// The pods of `now` (why each cannot be read) not in `logged` with the same why, which
/// becomes `now`: a pod is logged once while it stays unreadable for the same reason, and
/// again if it is fixed and breaks again.
fn newly_unreadable(
    logged: &mut BTreeMap<String, String>,
    now: BTreeMap<String, String>,
) -> Vec<(String, String)> {
    let new = now
        .iter()
        .filter(|&(pod, why)| logged.get(pod) != Some(why))
        .map(|(pod, why)| (pod.clone(), why.clone()))
        .collect();
    *logged = now;
    new
}

/// A fake Kubernetes API server on 127.0.0.1: HTTPS with a self-signed certificate,
/// answering `GET /api/v1/pods` with a pod list to a bearer token, 401 to others.
#[cfg(test)]
pub mod fake_api {
    use hyper::body::{Bytes, Incoming};
    use hyper::{Request, Response, StatusCode};
    use hyper_util::rt::TokioIo;
    use memtide_adapters::kubevirt::api::ApiServer;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    use std::net::SocketAddr;
    use std::path::Path;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    /// The token it takes.
    pub const TOKEN: &str = "memtide-test-token";

    /// The running server; dropped or [`FakeApi::stop`]ped, it refuses connections.
    pub struct FakeApi {
        addr: SocketAddr,
        /// Its certificate, PEM.
        pub ca: String,
        /// The path and query of each request that came with the token.
        pub requests: Arc<Mutex<Vec<String>>>,
        task: tokio::task::JoinHandle<()>,
    }

    impl FakeApi {
        /// A server answering pod lists with `pods` (a PodList's JSON).
        pub async fn start(pods: &str) -> FakeApi {
            let key = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).unwrap();
            let der = PrivatePkcs8KeyDer::from(key.signing_key.serialize_der());
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(
                    vec![CertificateDer::from(key.cert.der().to_vec())],
                    PrivateKeyDer::Pkcs8(der),
                )
                .unwrap();
            let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let requests = Arc::new(Mutex::new(Vec::new()));
            let (pods, seen) = (Bytes::from(pods.to_string()), requests.clone());
            let task = tokio::spawn(async move {
                let mut connections = tokio::task::JoinSet::new();
                loop {
                    let Ok((tcp, _)) = listener.accept().await else {
                        continue;
                    };
                    let (acceptor, pods, seen) = (acceptor.clone(), pods.clone(), seen.clone());
                    connections.spawn(async move {
                        let Ok(tls) = acceptor.accept(tcp).await else {
                            return; // a client that does not trust it
                        };
                        let service = hyper::service::service_fn(move |req| {
                            let answer = answer(&req, &pods, &seen);
                            async move { Ok::<_, std::convert::Infallible>(answer) }
                        });
                        let http = hyper::server::conn::http1::Builder::new();
                        let _ = http.serve_connection(TokioIo::new(tls), service).await;
                    });
                }
            });
            FakeApi {
                addr,
                ca: key.cert.pem(),
                requests,
                task,
            }
        }

        /// A client of this server, with the token in `token_file`.
        pub fn client(&self, token_file: &Path) -> ApiServer {
            self.client_trusting(&self.ca, token_file)
        }

        /// A client of this server that trusts the certificates in `ca` only.
        pub fn client_trusting(&self, ca: &str, token_file: &Path) -> ApiServer {
            let (host, port) = (self.addr.ip().to_string(), self.addr.port());
            let timeout = Duration::from_secs(5);
            ApiServer::new(&host, port, ca.as_bytes(), token_file.into(), timeout).unwrap()
        }

        /// Where it listens.
        pub fn addr(&self) -> SocketAddr {
            self.addr
        }

        /// Stop answering: connections are refused from now on.
        pub fn stop(&self) {
            self.task.abort();
        }
    }

    impl Drop for FakeApi {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    fn answer(
        req: &Request<Incoming>,
        pods: &Bytes,
        seen: &Mutex<Vec<String>>,
    ) -> Response<http_body_util::Full<Bytes>> {
        let token = req.headers().get(hyper::header::AUTHORIZATION);
        let (status, body) =
            if token.and_then(|t| t.to_str().ok()) != Some(&format!("Bearer {TOKEN}")) {
                let status =
                    r#"{"kind":"Status","status":"Failure","message":"Unauthorized","code":401}"#;
                (StatusCode::UNAUTHORIZED, Bytes::from(status))
            } else {
                let uri = req.uri();
                seen.lock().unwrap().push(uri.to_string());
                match uri.path() {
                    "/api/v1/pods" => (StatusCode::OK, pods.clone()),
                    _ => (StatusCode::NOT_FOUND, Bytes::from("404 page not found")),
                }
            };
        let mut response = Response::new(http_body_util::Full::new(body));
        *response.status_mut() = status;
        response
    }
}

#[cfg(test)]
mod tests {
    use super::fake_api::{FakeApi, TOKEN};
    use super::*;

    #[test]
    fn an_unreadable_pod_is_logged_once_per_reason() {
        let mut logged = BTreeMap::new();
        let list = |pods: &[(&str, &str)]| -> BTreeMap<String, String> {
            pods.iter()
                .map(|(p, w)| (p.to_string(), w.to_string()))
                .collect()
        };
        let bad = list(&[
            ("ns/a", "limits.memory: bad"),
            ("ns/b", "requests.memory: bad"),
        ]);
        assert_eq!(newly_unreadable(&mut logged, bad.clone()).len(), 2);
        for _ in 0..3 {
            assert_eq!(
                newly_unreadable(&mut logged, bad.clone()),
                [],
                "listed again"
            );
        }
        let changed = list(&[
            ("ns/a", "limits.memory: worse"),
            ("ns/b", "requests.memory: bad"),
        ]);
        assert_eq!(
            newly_unreadable(&mut logged, changed),
            list(&[("ns/a", "limits.memory: worse")])
                .into_iter()
                .collect::<Vec<_>>()
        );
        // b fixed, then broken again in the same way: logged again.
        assert_eq!(
            newly_unreadable(&mut logged, list(&[("ns/a", "limits.memory: worse")])),
            []
        );
        let again = newly_unreadable(&mut logged, list(&[("ns/b", "requests.memory: bad")]));
        assert_eq!(
            again,
            [("ns/b".to_string(), "requests.memory: bad".to_string())]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_list_is_in_force_until_it_is_too_old() {
        let bounds = PodBounds::new(Duration::from_secs(300));
        let web = PodMemory {
            request: Some(memtide_core::Bytes::from_mib(1024)),
            limit: None,
        };
        assert_eq!(bounds.get("default/web"), None, "nothing listed yet");
        let pods = LauncherPods {
            memory: BTreeMap::from([("default/web".into(), web)]),
            vms: BTreeMap::from([("uid-1".into(), "default/web".into())]),
            ..LauncherPods::default()
        };
        bounds.set(pods, Instant::now());
        assert_eq!(bounds.get("default/web"), Some(web));
        assert_eq!(bounds.get("default/db"), None);
        tokio::time::advance(Duration::from_secs(300)).await;
        assert_eq!(bounds.get("default/web"), Some(web));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            bounds.get("default/web"),
            None,
            "too old: the domain's bounds"
        );
        assert_eq!(
            bounds.vm_of("uid-1").as_deref(),
            Some("default/web"),
            "a pod's VM stays known: its UID is never another pod's"
        );
        assert_eq!(bounds.vm_of("uid-2"), None);
    }

    #[tokio::test]
    async fn the_client_lists_its_nodes_launchers_with_its_token_and_says_why_it_cannot() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
        let fixture =
            include_str!("../../../memtide-adapters/src/kubevirt/testdata/launcher-pods.json");
        let api = FakeApi::start(fixture).await;
        let pods = api.client(&token).launcher_pods("node-1").await.unwrap();
        assert_eq!(
            pods.memory.keys().collect::<Vec<_>>(),
            ["default/web", "team-a/db"]
        );
        assert_eq!(
            *api.requests.lock().unwrap(),
            ["/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1\
              &labelSelector=kubevirt.io%3Dvirt-launcher&resourceVersion=0"]
        );

        std::fs::write(&token, "stolen").unwrap();
        let e = api
            .client(&token)
            .launcher_pods("node-1")
            .await
            .unwrap_err();
        let at = format!("listing pods at https://{}", api.addr());
        assert_eq!(
            e.to_string(),
            format!("{at}: 401 Unauthorized: Unauthorized")
        );

        std::fs::remove_file(&token).unwrap();
        let e = api
            .client(&token)
            .launcher_pods("node-1")
            .await
            .unwrap_err();
        assert!(e.to_string().contains("the token "), "{e}");

        // A server whose certificate the client's CA did not sign.
        let other = FakeApi::start("{}").await;
        std::fs::write(&token, TOKEN).unwrap();
        let impostor = other.client_trusting(&api.ca, &token);
        let e = impostor
            .launcher_pods("node-1")
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains(": TLS: invalid peer certificate"), "{e}");

        api.stop();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let e = api
            .client(&token)
            .launcher_pods("node-1")
            .await
            .unwrap_err();
        assert!(e.to_string().contains(": connecting: "), "{e}");
    }
}
