//! The HTTP endpoint: `/metrics` (OpenMetrics text to scrapers that ask for it, the
//! classic Prometheus text format to others) and `/api/v1/status` (JSON). It is
//! read-only: GET and HEAD only, no request body read, request headers at most
//! [`MAX_HEADERS`] bytes.

use crate::status::SharedStatus;
use crate::{accept, metrics};
use anyhow::Context;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Most bytes of a request's line and headers; a longer one is answered 431 and the
/// connection closed (hyper's smallest buffer is 8 KiB).
pub const MAX_HEADERS: usize = 16 * 1024;

#[derive(Clone)]
struct AppState {
    status: SharedStatus,
    registry: Arc<Registry>,
    /// The metrics, OpenMetrics and classic.
    metrics: Arc<Rendered<(Bytes, Bytes)>>,
    /// The status as JSON.
    json: Arc<Rendered<Bytes>>,
}

/// What was rendered of a status, kept until the status changes: the endpoint is open to
/// every local user, who may ask as fast as they like, and a render at 500 VMs takes the
/// daemon's one worker milliseconds. One render at a time; the others wait for it.
struct Rendered<T>(Mutex<Option<(u64, T)>>);

impl<T: Clone> Rendered<T> {
    fn new() -> Arc<Rendered<T>> {
        Arc::new(Rendered(Mutex::new(None)))
    }

    /// What `render` makes of the status of `generation` ([`SharedStatus::generation`]): kept,
    /// or made now.
    fn of(&self, generation: u64, render: impl FnOnce() -> T) -> T {
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match &*kept {
            Some((g, rendered)) if *g == generation => rendered.clone(),
            _ => {
                let rendered = render();
                *kept = Some((generation, rendered.clone()));
                rendered
            }
        }
    }
}

impl AppState {
    /// The status's generation now. Read before a render: a render of a newer status is
    /// kept under an older generation, and made again at the next request.
    fn generation(&self) -> u64 {
        self.status.generation()
    }
}

/// The metrics, in OpenMetrics when the client's `Accept` names it (Prometheus does),
/// else in the classic text format (curl, promtool, older scrapers).
async fn metrics_text(State(s): State<AppState>, headers: HeaderMap) -> impl IntoResponse {
    let (text, classic) = s.metrics.of(s.generation(), || {
        let text = metrics::render(&s.registry);
        let classic = metrics::classic(&text);
        (Bytes::from(text), Bytes::from(classic))
    });
    let openmetrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    if openmetrics {
        let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
        ([(header::CONTENT_TYPE, content_type)], text)
    } else {
        let content_type = "text/plain; version=0.0.4; charset=utf-8";
        ([(header::CONTENT_TYPE, content_type)], classic)
    }
}

/// Refuse what a read-only endpoint has no use for, before any handler runs: methods
/// other than GET and HEAD (405), and requests that announce a body (413; the body is
/// never read, and the connection is closed).
async fn read_only(request: Request, next: Next) -> Response {
    let reply = |code, text: &'static str| {
        let close = [(header::CONNECTION, "close")];
        (code, close, text).into_response()
    };
    if !matches!(*request.method(), Method::GET | Method::HEAD) {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "read-only endpoint: GET or HEAD only\n",
        );
    }
    let headers = request.headers();
    let length = headers
        .get(header::CONTENT_LENGTH)
        .is_some_and(|l| l.as_bytes() != b"0");
    if length || headers.contains_key(header::TRANSFER_ENCODING) {
        return reply(
            StatusCode::PAYLOAD_TOO_LARGE,
            "read-only endpoint: requests carry no body\n",
        );
    }
    next.run(request).await
}

/// The status, written as JSON while it is read (not copied first).
async fn status_json(State(s): State<AppState>) -> impl IntoResponse {
    let text = s.json.of(s.generation(), || {
        let status = s.status.read();
        Bytes::from(serde_json::to_vec(&*status).expect("status serializes"))
    });
    ([(header::CONTENT_TYPE, "application/json")], text)
}

/// What HTTP clients may hold, so that they cannot take the descriptors or the time the
/// tick needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Connections served at once; further ones wait in the kernel's accept queue,
    /// holding no descriptor of the daemon's.
    pub connections: usize,
    /// Time a connection has to send a request's headers, idle time before a kept-alive
    /// connection's next request included.
    pub header_timeout: Duration,
    /// The longest a connection is served (e.g. to a client that does not read its reply).
    pub lifetime: Duration,
}

impl Limits {
    /// The daemon's limits when it may open `nofile` descriptors: 64 connections at most,
    /// and never more than an eighth of the descriptors.
    pub fn under(nofile: u64) -> Limits {
        Limits {
            connections: (nofile / 8).clamp(1, 64) as usize,
            header_timeout: Duration::from_secs(10),
            lifetime: Duration::from_secs(60),
        }
    }
}

/// Bind `addr` and serve in the background within `limits`; returns the bound address.
pub async fn serve(
    addr: SocketAddr,
    status: SharedStatus,
    limits: Limits,
) -> anyhow::Result<SocketAddr> {
    let registry = Arc::new(metrics::registry(status.clone()));
    let app = Router::new()
        .route("/metrics", get(metrics_text))
        .route("/api/v1/status", get(status_json))
        .with_state(AppState {
            status,
            registry,
            metrics: Rendered::new(),
            json: Rendered::new(),
        })
        .layer(middleware::from_fn(read_only));
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding http {addr}"))?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        let serve = |((stream, _), slot)| {
            let service = TowerToHyperService::new(app.clone());
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .max_buf_size(MAX_HEADERS)
                .serve_connection(TokioIo::new(stream), service);
            tokio::spawn(async move {
                let _ = tokio::time::timeout(limits.lifetime, connection).await;
                drop(slot);
            });
        };
        let accept = || listener.accept();
        accept::serve_capped("http", limits.connections, accept, serve).await;
    });
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::Status;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// Limits for tests: `connections`, and a long or a short header timeout.
    fn limits(connections: usize, header_timeout_ms: u64) -> Limits {
        Limits {
            connections,
            header_timeout: Duration::from_millis(header_timeout_ms),
            lifetime: Duration::from_secs(60),
        }
    }

    async fn start(limits: Limits) -> SocketAddr {
        let addr = "127.0.0.1:0".parse().unwrap();
        serve(addr, SharedStatus::default(), limits).await.unwrap()
    }

    /// GET `/metrics` on `stream` and read the reply to its end.
    async fn scrape(stream: &mut TcpStream) -> String {
        scrape_with(stream, "").await
    }

    /// GET `/metrics` with `headers` (each line ending in CRLF) and read the reply.
    async fn scrape_with(stream: &mut TcpStream, headers: &str) -> String {
        let request =
            format!("GET /metrics HTTP/1.1\r\nHost: memtide\r\n{headers}Connection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut reply = String::new();
        let read = stream.read_to_string(&mut reply);
        tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .expect("an answer within 10 s")
            .unwrap();
        reply
    }

    /// GET `path` on a new connection to `addr`; the reply's body.
    async fn body(addr: SocketAddr, path: &str) -> String {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: memtide\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).await.unwrap();
        reply.split_once("\r\n\r\n").unwrap().1.to_string()
    }

    #[tokio::test]
    async fn what_is_rendered_is_kept_until_the_status_changes() {
        let status = SharedStatus::default();
        let addr = "127.0.0.1:0".parse().unwrap();
        let addr = serve(addr, status.clone(), limits(4, 60_000))
            .await
            .unwrap();
        let ticks = |text: &str| text.lines().any(|l| l == "memtide_ticks_total 7");
        assert!(!ticks(&body(addr, "/metrics").await));
        // Every write is a change: the next request renders it.
        status.write().counters.ticks = 7;
        let json: serde_json::Value =
            serde_json::from_str(&body(addr, "/api/v1/status").await).unwrap();
        assert_eq!(json["counters"]["ticks"], 7);
        assert!(ticks(&body(addr, "/metrics").await));
    }

    #[test]
    fn a_status_of_the_same_generation_is_rendered_once() {
        let status = SharedStatus::default();
        let rendered = Rendered::new();
        let renders = std::cell::Cell::new(0);
        let render = || {
            renders.set(renders.get() + 1);
            status.read().counters.ticks
        };
        let generation = || status.generation();
        assert_eq!(rendered.of(generation(), render), 0);
        assert_eq!(rendered.of(generation(), render), 0);
        assert_eq!(renders.get(), 1, "kept while the status is not written");
        status.write().counters.ticks = 7;
        assert_eq!(rendered.of(generation(), render), 7);
        assert_eq!(renders.get(), 2);
    }

    #[tokio::test]
    async fn openmetrics_to_scrapers_that_ask_for_it_the_classic_format_to_others() {
        let addr = start(limits(4, 60_000)).await;
        let connect = || TcpStream::connect(addr);
        let accept = "Accept: application/openmetrics-text;version=1.0.0,text/plain;q=0.5\r\n";
        let open = scrape_with(&mut connect().await.unwrap(), accept).await;
        assert!(
            open.contains("content-type: application/openmetrics-text; version=1.0.0")
                && open.contains("# TYPE memtide_ticks counter")
                && open.ends_with("# EOF\n"),
            "{open}"
        );
        let classic = scrape(&mut connect().await.unwrap()).await;
        assert!(
            classic.contains("content-type: text/plain; version=0.0.4")
                && classic.contains("# TYPE memtide_ticks_total counter")
                && !classic.contains("# EOF"),
            "{classic}"
        );
    }

    #[tokio::test]
    async fn idle_clients_cannot_hold_more_than_the_cap() {
        let addr = start(limits(2, 60_000)).await;
        let mut idle = vec![
            TcpStream::connect(addr).await.unwrap(),
            TcpStream::connect(addr).await.unwrap(),
        ];
        let mut client = TcpStream::connect(addr).await.unwrap();
        let reply = tokio::spawn(async move { scrape(&mut client).await });
        // Both slots are taken: the third connection is not even accepted.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!reply.is_finished(), "served beyond the cap of 2");
        drop(idle.pop());
        let reply = reply.await.unwrap();
        assert!(reply.starts_with("HTTP/1.1 200 OK"), "{reply}");
    }

    #[tokio::test]
    async fn silent_and_slow_clients_are_disconnected() {
        let addr = start(limits(4, 300)).await;
        let silent = TcpStream::connect(addr).await.unwrap();
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET /metrics HTTP/1.1\r\nHost: mem")
            .await
            .unwrap();
        for mut stream in [silent, slow] {
            let mut rest = Vec::new();
            let read = stream.read_to_end(&mut rest);
            let closed = tokio::time::timeout(Duration::from_secs(10), read).await;
            assert!(closed.is_ok(), "not closed by the server within 10 s");
        }
        // A client that asks in time is still served.
        let mut client = TcpStream::connect(addr).await.unwrap();
        assert!(scrape(&mut client).await.starts_with("HTTP/1.1 200 OK"));
    }

    /// Send `request` on a new connection and read the reply until the server closes it.
    async fn exchange(addr: SocketAddr, request: &[u8]) -> String {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        // The server may answer and close before reading all of a long request.
        let _ = stream.write_all(request).await;
        let mut reply = Vec::new();
        let read = stream.read_to_end(&mut reply);
        let done = tokio::time::timeout(Duration::from_secs(10), read).await;
        assert!(done.is_ok(), "not answered and closed within 10 s");
        String::from_utf8_lossy(&reply).into_owned()
    }

    #[tokio::test]
    async fn it_is_read_only_and_bounds_what_a_request_may_send() {
        let addr = start(limits(4, 10_000)).await;
        let post = b"POST /api/v1/status HTTP/1.1\r\nHost: m\r\nContent-Length: 2\r\n\r\n{}";
        let reply = exchange(addr, post).await;
        assert!(reply.starts_with("HTTP/1.1 405 "), "{reply}");
        for method in ["PUT", "DELETE", "PATCH"] {
            let request = format!("{method} /metrics HTTP/1.1\r\nHost: m\r\n\r\n");
            let reply = exchange(addr, request.as_bytes()).await;
            assert!(reply.starts_with("HTTP/1.1 405 "), "{method}: {reply}");
        }
        // A body announced on GET is refused before it is sent, not read then dropped.
        let announced = b"GET /metrics HTTP/1.1\r\nHost: m\r\nContent-Length: 1000000000\r\n\r\n";
        let reply = exchange(addr, announced).await;
        assert!(reply.starts_with("HTTP/1.1 413 "), "{reply}");
        let chunked = b"GET /metrics HTTP/1.1\r\nHost: m\r\nTransfer-Encoding: chunked\r\n\r\n";
        let reply = exchange(addr, chunked).await;
        assert!(reply.starts_with("HTTP/1.1 413 "), "{reply}");
        // Headers past the bound: refused whole, with no reply body built from them.
        let long = format!(
            "GET /metrics HTTP/1.1\r\nHost: m\r\nX-Pad: {}\r\n\r\n",
            "a".repeat(4 * MAX_HEADERS)
        );
        let reply = exchange(addr, long.as_bytes()).await;
        assert!(reply.starts_with("HTTP/1.1 431 "), "{reply}");
        // Just under the bound is served.
        let fits = format!(
            "GET /metrics HTTP/1.1\r\nHost: m\r\nConnection: close\r\nX-Pad: {}\r\n\r\n",
            "a".repeat(MAX_HEADERS / 2)
        );
        let reply = exchange(addr, fits.as_bytes()).await;
        assert!(reply.starts_with("HTTP/1.1 200 OK"), "{reply}");
        let head = b"HEAD /api/v1/status HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n";
        assert!(exchange(addr, head).await.starts_with("HTTP/1.1 200 OK"));
        let get = b"GET /api/v1/status HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n";
        let reply = exchange(addr, get).await;
        let (head, body) = reply.split_once("\r\n\r\n").unwrap();
        assert!(head.contains("content-type: application/json"), "{reply}");
        let status: Status = serde_json::from_str(body).expect("the status as JSON");
        assert_eq!(status, Status::default());
    }

    #[test]
    fn most_descriptors_are_left_to_the_tick() {
        assert_eq!(Limits::under(256).connections, 32);
        assert_eq!(Limits::under(1 << 20).connections, 64);
        assert_eq!(Limits::under(4).connections, 1);
    }
}
