//! HTTP/1.1 over a unix socket, for the JSON APIs of Firecracker and Cloud Hypervisor.
//! One connection per call (both servers allow it), every call bounded by a timeout.

use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Bytes as Body;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use memtide_core::stats::GuestStats;
use memtide_core::{BackendError, Bytes};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::net::UnixStream;
use tokio::time::timeout;

/// Longest response body accepted.
const MAX_BODY: usize = 4 << 20;

/// How to talk to a VMM over its API socket (Firecracker, Cloud Hypervisor).
#[derive(Debug, Clone)]
pub struct ApiVmOptions {
    /// Limit for every API call.
    pub call_timeout: Duration,
    /// How often the guest should refresh its balloon statistics, in seconds.
    pub stats_interval_s: u64,
    /// The procfs mount, to read the VMM process's RSS.
    pub proc: PathBuf,
}

/// An API call that failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The socket could not be reached (no server, connection refused).
    #[error("{path}: {error}")]
    Connect {
        /// The socket.
        path: String,
        /// Why.
        error: std::io::Error,
    },
    /// No complete answer in time.
    #[error("{0} {1}: no answer within {2} ms")]
    Timeout(Method, String, u128),
    /// The HTTP exchange broke off.
    #[error("{0} {1}: {2}")]
    Http(Method, String, String),
    /// The server refused the request.
    #[error("{method} {path}: {status}: {message}")]
    Status {
        /// The request method.
        method: Method,
        /// The request path.
        path: String,
        /// The response status.
        status: StatusCode,
        /// The server's reason (Firecracker's `fault_message`, else the body's text).
        message: String,
    },
    /// The answer is not the JSON expected.
    #[error("{0} {1}: {2}")]
    Body(Method, String, String),
}

impl ApiError {
    /// The status the server answered with, if it answered.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            ApiError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

impl From<ApiError> for BackendError {
    fn from(e: ApiError) -> Self {
        match e {
            ApiError::Connect { .. } => BackendError::Disconnected(e.to_string()),
            ApiError::Timeout(_, _, ms) => BackendError::Timeout(ms as u64),
            _ => BackendError::Protocol(e.to_string()),
        }
    }
}

/// A VMM's API socket.
#[derive(Debug, Clone)]
pub struct ApiSocket {
    path: PathBuf,
    call_timeout: Duration,
}

impl ApiSocket {
    /// The API at `path`, every call bounded by `call_timeout`.
    pub fn new(path: &Path, call_timeout: Duration) -> ApiSocket {
        ApiSocket {
            path: path.to_path_buf(),
            call_timeout,
        }
    }

    /// The same socket, its calls bounded by `call_timeout` (a snapshot takes longer
    /// than the other calls).
    pub fn with_timeout(&self, call_timeout: Duration) -> ApiSocket {
        ApiSocket {
            path: self.path.clone(),
            call_timeout,
        }
    }

    /// The VMM's process id, from the socket's peer credentials (`None` when they give
    /// none, or 0: a peer in another pid namespace).
    pub async fn peer_pid(&self) -> Result<Option<i32>, ApiError> {
        let stream = self.connect().await?;
        let pid = stream.peer_cred().ok().and_then(|c| c.pid());
        Ok(pid.and_then(crate::procfs::known_pid))
    }

    /// Whether nobody serves the socket: connections are refused, or it is gone. A VMM
    /// that answers, or is too slow to, has not ended.
    pub async fn refused(&self) -> bool {
        match self.connect().await {
            Err(ApiError::Connect { error, .. }) => matches!(
                error.kind(),
                std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound
            ),
            _ => false,
        }
    }

    async fn connect(&self) -> Result<UnixStream, ApiError> {
        let connect = timeout(self.call_timeout, UnixStream::connect(&self.path)).await;
        let error = match connect {
            Ok(Ok(stream)) => return Ok(stream),
            Ok(Err(e)) => e,
            Err(_) => std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"),
        };
        Err(ApiError::Connect {
            path: self.path.display().to_string(),
            error,
        })
    }

    /// Send `body` (JSON) with `method` to `path`; the response's JSON (`Null` for an
    /// empty body, as 204 No Content has).
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, ApiError> {
        let limit = self.call_timeout;
        let (m, p) = (method.clone(), path.to_string());
        match timeout(limit, self.exchange(method, path, body)).await {
            Ok(result) => result,
            Err(_) => Err(ApiError::Timeout(m, p, limit.as_millis())),
        }
    }

    async fn exchange(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, ApiError> {
        let broke =
            |e: hyper::Error| ApiError::Http(method.clone(), path.to_string(), e.to_string());
        let stream = self.connect().await?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(broke)?;
        let driver = tokio::spawn(connection);
        let mut request = Request::builder()
            .method(method.clone())
            .uri(path)
            .header("Host", "localhost")
            .header("Accept", "application/json");
        let payload = match body {
            Some(v) => {
                request = request.header("Content-Type", "application/json");
                Body::from(v.to_string())
            }
            None => Body::new(),
        };
        let request = request
            .body(Full::new(payload))
            .map_err(|e| ApiError::Http(method.clone(), path.to_string(), e.to_string()))?;
        let response = sender.send_request(request).await.map_err(broke)?;
        let status = response.status();
        // The limit holds while reading: a VMM sending an endless body is cut off at it
        // instead of filling the daemon's memory first (#18 defect 6).
        let collected = Limited::new(response.into_body(), MAX_BODY).collect().await;
        driver.abort();
        let bytes = match collected {
            Ok(body) => body.to_bytes(),
            Err(e) if e.is::<LengthLimitError>() => {
                let why = format!("response larger than {MAX_BODY} bytes");
                return Err(ApiError::Body(method, path.to_string(), why));
            }
            Err(e) => return Err(ApiError::Http(method, path.to_string(), e.to_string())),
        };
        decode_response(method, path, status, &bytes)
    }
}

/// A response's JSON (`Null` for an empty body, as 204 No Content has), or the error
/// its status and body tell.
pub fn decode_response(
    method: Method,
    path: &str,
    status: StatusCode,
    bytes: &[u8],
) -> Result<Value, ApiError> {
    let text = String::from_utf8_lossy(bytes);
    if !status.is_success() {
        // Firecracker answers errors with {"fault_message": "..."}; Cloud Hypervisor
        // with the error's text.
        let message = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v.get("fault_message")?.as_str().map(str::to_string))
            .unwrap_or_else(|| text.trim().to_string());
        return Err(ApiError::Status {
            method,
            path: path.to_string(),
            status,
            message,
        });
    }
    if text.trim().is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_str(&text)
        .map_err(|e| ApiError::Body(method, path.to_string(), format!("invalid JSON ({e})")))
}

/// Firecracker's and Cloud Hypervisor's balloon statistics (same names, sizes in bytes)
/// as memtide's guest statistics.
pub fn guest_stats(v: &Value) -> GuestStats {
    let mut s = GuestStats::default();
    let Some(fields) = v.as_object() else {
        return s;
    };
    for (name, raw) in fields {
        let Some(n) = raw.as_u64() else { continue };
        let bytes = Some(Bytes(n));
        match name.as_str() {
            "swap_in" => s.swap_in = bytes,
            "swap_out" => s.swap_out = bytes,
            "major_faults" => s.major_faults = Some(n),
            "minor_faults" => s.minor_faults = Some(n),
            "free_memory" => s.free = bytes,
            "total_memory" => s.total = bytes,
            "available_memory" => s.available = bytes,
            "disk_caches" => s.disk_caches = bytes,
            "hugetlb_allocations" => s.hugetlb_allocs = Some(n),
            "hugetlb_failures" => s.hugetlb_failures = Some(n),
            "oom_kill" | "oom_kills" => s.oom_kills = Some(n),
            "alloc_stall" | "alloc_stalls" => s.alloc_stalls = Some(n),
            "async_scans" => s.async_scans = Some(n),
            "direct_scans" => s.direct_scans = Some(n),
            "async_reclaims" => s.async_reclaims = Some(n),
            "direct_reclaims" => s.direct_reclaims = Some(n),
            // The balloon's own figures, not the guest's.
            "target_pages" | "actual_pages" | "target_mib" | "actual_mib" => {}
            other => {
                s.other.insert(other.to_string(), n);
            }
        }
    }
    s
}
