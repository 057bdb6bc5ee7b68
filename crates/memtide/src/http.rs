//! The HTTP endpoint: `/metrics` (OpenMetrics text) and `/api/v1/status` (JSON).

use crate::metrics;
use crate::status::Status;
use anyhow::Context;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

#[derive(Clone)]
struct AppState {
    status: Arc<RwLock<Status>>,
    registry: Arc<Registry>,
}

async fn metrics_text(State(s): State<AppState>) -> impl IntoResponse {
    let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
    (
        [(header::CONTENT_TYPE, content_type)],
        metrics::render(&s.registry),
    )
}

async fn status_json(State(s): State<AppState>) -> Json<Status> {
    Json(s.status.read().expect("status lock").clone())
}

/// Bind `addr` and serve in the background; returns the bound address.
pub async fn serve(addr: SocketAddr, status: Arc<RwLock<Status>>) -> anyhow::Result<SocketAddr> {
    let registry = Arc::new(metrics::registry(status.clone()));
    let app = Router::new()
        .route("/metrics", get(metrics_text))
        .route("/api/v1/status", get(status_json))
        .with_state(AppState { status, registry });
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding http {addr}"))?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!("http server stopped: {e}");
        }
    });
    Ok(bound)
}
