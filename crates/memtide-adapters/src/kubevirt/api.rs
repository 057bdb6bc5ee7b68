//! The Kubernetes API server as a pod reaches it, for the launcher pods of one node.
//!
//! Why the API server and not the kubelet, which knows its node's pods too: the kubelet's
//! pod list (`https://NODE:10250/pods`) takes the `nodes/proxy` permission, which also
//! lets its holder run commands in every pod of the node, and its unauthenticated
//! read-only port is off in current clusters. The API server answers a list filtered by
//! node (`fieldSelector=spec.nodeName=`) and label (`kubevirt.io=virt-launcher`) from its
//! cache (`resourceVersion=0`) to a service account that may only read pods.

use super::pods::{launcher_pods, LauncherPods, PodsError};
use http_body_util::{BodyExt, Empty, LengthLimitError, Limited};
use hyper::body::Bytes as Body;
use hyper::Request;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// Where Kubernetes mounts a pod's service account: `token`, `ca.crt`.
pub const SERVICE_ACCOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The most of a pod list read: a node's pods take a few MiB at most.
const MAX_BODY: usize = 64 << 20;

/// Why the API server could not be used or did not answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError(String);

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ApiError {}

impl From<PodsError> for ApiError {
    fn from(e: PodsError) -> ApiError {
        ApiError(e.to_string())
    }
}

/// A Kubernetes API server over HTTPS, with a service account's bearer token.
pub struct ApiServer {
    host: String,
    port: u16,
    /// `host:port` as the Host header and messages write it (an IPv6 host bracketed).
    authority: String,
    server_name: ServerName<'static>,
    tls: TlsConnector,
    token_file: PathBuf,
    timeout: Duration,
}

impl ApiServer {
    /// The API server of the cluster this pod runs in, as client-go's in-cluster
    /// configuration finds it: `KUBERNETES_SERVICE_HOST` and `KUBERNETES_SERVICE_PORT`,
    /// trusted by the service account's `ca.crt`, with its `token`.
    pub fn in_cluster(timeout: Duration) -> Result<ApiServer, ApiError> {
        let var = |name: &str| {
            std::env::var(name).map_err(|_| {
                ApiError(format!(
                    "{name} is not set: memtide is not running in a Kubernetes pod"
                ))
            })
        };
        let host = var("KUBERNETES_SERVICE_HOST")?;
        let port = var("KUBERNETES_SERVICE_PORT")?;
        let port = port
            .parse()
            .map_err(|_| ApiError(format!("KUBERNETES_SERVICE_PORT: bad port {port:?}")))?;
        let dir = Path::new(SERVICE_ACCOUNT);
        let ca = dir.join("ca.crt");
        let pem = std::fs::read(&ca).map_err(|e| {
            ApiError(format!(
                "the service account's CA {}: {e} (is a service account token mounted?)",
                ca.display()
            ))
        })?;
        ApiServer::new(&host, port, &pem, dir.join("token"), timeout)
    }

    /// The API server at `host:port`, trusted by the PEM certificates `ca`, with the
    /// bearer token in `token_file`, read at each request (the kubelet rotates it); each
    /// request is bounded by `timeout`.
    pub fn new(
        host: &str,
        port: u16,
        ca: &[u8],
        token_file: PathBuf,
        timeout: Duration,
    ) -> Result<ApiServer, ApiError> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca) {
            let cert = cert.map_err(|e| ApiError(format!("the API server's CA: {e}")))?;
            roots
                .add(cert)
                .map_err(|e| ApiError(format!("the API server's CA: {e}")))?;
        }
        if roots.is_empty() {
            return Err(ApiError("the API server's CA holds no certificate".into()));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| ApiError(format!("TLS: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let (server_name, authority) = match host.parse::<IpAddr>() {
            Ok(ip @ IpAddr::V6(_)) => (ServerName::IpAddress(ip.into()), format!("[{ip}]:{port}")),
            Ok(ip) => (ServerName::IpAddress(ip.into()), format!("{ip}:{port}")),
            Err(_) => (
                ServerName::try_from(host.to_string())
                    .map_err(|_| ApiError(format!("bad API server host {host:?}")))?,
                format!("{host}:{port}"),
            ),
        };
        Ok(ApiServer {
            host: host.to_string(),
            port,
            authority,
            server_name,
            tls: TlsConnector::from(Arc::new(config)),
            token_file,
            timeout,
        })
    }

    /// The memory of the running launcher pods on node `node` ([`launcher_pods`]).
    pub async fn launcher_pods(&self, node: &str) -> Result<LauncherPods, ApiError> {
        let path = launcher_pods_path(node);
        let body = tokio::time::timeout(self.timeout, self.get(&path))
            .await
            .unwrap_or_else(|_| {
                Err(ApiError(format!(
                    "no answer within {} ms",
                    self.timeout.as_millis()
                )))
            })
            .map_err(|e| ApiError(format!("listing pods at https://{}: {e}", self.authority)))?;
        Ok(launcher_pods(&body)?)
    }

    /// The body of a successful GET of `path`.
    async fn get(&self, path: &str) -> Result<Body, ApiError> {
        let token = tokio::fs::read_to_string(&self.token_file)
            .await
            .map_err(|e| ApiError(format!("the token {}: {e}", self.token_file.display())))?;
        let tcp = TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| ApiError(format!("connecting: {e}")))?;
        let tls = self
            .tls
            .connect(self.server_name.clone(), tcp)
            .await
            .map_err(|e| ApiError(format!("TLS: {e}")))?;
        let http = |e: hyper::Error| ApiError(format!("HTTP: {e}"));
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(http)?;
        let _driver = AbortOnDrop(tokio::spawn(connection));
        let request = Request::get(path)
            .header(hyper::header::HOST, &self.authority)
            .header(hyper::header::ACCEPT, "application/json")
            .header(
                hyper::header::AUTHORIZATION,
                format!("Bearer {}", token.trim()),
            )
            .body(Empty::<Body>::new())
            .map_err(|e| ApiError(format!("HTTP: {e}")))?;
        let response = sender.send_request(request).await.map_err(http)?;
        let status = response.status();
        let body = match Limited::new(response.into_body(), MAX_BODY).collect().await {
            Ok(body) => body.to_bytes(),
            Err(e) if e.is::<LengthLimitError>() => {
                return Err(ApiError(format!("answer larger than {MAX_BODY} bytes")));
            }
            Err(e) => return Err(ApiError(format!("HTTP: {e}"))),
        };
        if !status.is_success() {
            return Err(ApiError(format!("{status}: {}", status_message(&body))));
        }
        Ok(body)
    }
}

/// A task aborted when this is dropped: the connection's driver stops with the request,
/// however the request ends (its timeout included).
struct AbortOnDrop(tokio::task::JoinHandle<Result<(), hyper::Error>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The path of the list of launcher pods on `node`, served from the API server's cache.
fn launcher_pods_path(node: &str) -> String {
    let selector = format!("spec.nodeName={node}");
    format!(
        "/api/v1/pods?fieldSelector={}&labelSelector=kubevirt.io%3Dvirt-launcher&resourceVersion=0",
        percent_encode(&selector)
    )
}

/// `text` as a URL query value: every byte but the unreserved ones percent-encoded.
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The message of a Kubernetes `Status` answer, or the body, at most its first 200
/// characters either way (it is logged).
fn status_message(body: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct Status {
        message: String,
    }
    let text = match serde_json::from_slice::<Status>(body) {
        Ok(s) => s.message,
        Err(_) => String::from_utf8_lossy(&body[..body.len().min(800)]).into_owned(),
    };
    text.trim().chars().take(200).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_asks_for_this_nodes_launchers_from_the_cache() {
        assert_eq!(
            launcher_pods_path("node-1.example.com"),
            "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1.example.com\
             &labelSelector=kubevirt.io%3Dvirt-launcher&resourceVersion=0"
        );
        assert_eq!(percent_encode("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
    }

    #[test]
    fn a_refusal_is_told_by_its_status_message() {
        let body = br#"{"kind":"Status","apiVersion":"v1","status":"Failure",
            "message":"pods is forbidden: User \"system:serviceaccount:memtide:memtide\" cannot list resource \"pods\"","reason":"Forbidden","code":403}"#;
        assert!(status_message(body).starts_with("pods is forbidden: User"));
        assert_eq!(status_message(b" Unauthorized\n"), "Unauthorized");
        let long = format!(
            r#"{{"kind": "Status", "message": "{}"}}"#,
            "x".repeat(1 << 20)
        );
        assert_eq!(
            status_message(long.as_bytes()).len(),
            200,
            "what is logged is bounded"
        );
    }

    #[test]
    fn a_ca_without_certificates_is_refused() {
        let new = |ca: &[u8], host: &str| {
            ApiServer::new(host, 443, ca, "/t".into(), Duration::from_secs(1))
                .err()
                .map(|e| e.to_string())
        };
        assert_eq!(
            new(b"", "10.96.0.1").as_deref(),
            Some("the API server's CA holds no certificate")
        );
        let pem = b"-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n";
        assert!(new(pem, "10.96.0.1")
            .unwrap()
            .starts_with("the API server's CA: "));
    }
}
