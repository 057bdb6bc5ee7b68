//! The control socket: a unix socket (mode 0600) answering one JSON request per line.
//! `{"command": "status"}` returns the daemon's status.

use crate::status::Status;
use anyhow::{bail, Context};
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

/// Longest request accepted.
const MAX_REQUEST: u64 = 64 * 1024;

/// A bound control socket; the file is removed when this is dropped.
pub struct ControlSocket {
    path: PathBuf,
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Bind the control socket and serve status from `status`. Refuses to start when another
/// daemon answers on the socket; removes a stale socket file left by a dead one.
pub async fn serve(path: &Path, status: Arc<RwLock<Status>>) -> anyhow::Result<ControlSocket> {
    if let Some(dir) = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty() && !d.exists())
    {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    if path.exists() {
        if UnixStream::connect(path).await.is_ok() {
            bail!(
                "{}: another memtide daemon is answering on this socket",
                path.display()
            );
        }
        std::fs::remove_file(path).with_context(|| format!("removing stale {}", path.display()))?;
    }
    let listener =
        UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(answer(stream, status.clone()));
        }
    });
    Ok(ControlSocket {
        path: path.to_path_buf(),
    })
}

async fn answer(stream: UnixStream, status: Arc<RwLock<Status>>) {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut reader = BufReader::new(tokio::io::AsyncReadExt::take(read, MAX_REQUEST));
    if reader.read_line(&mut line).await.is_err() {
        return;
    }
    let reply = match serde_json::from_str::<Value>(&line) {
        Ok(req) => match req.get("command").and_then(Value::as_str) {
            Some("status") => serde_json::to_value(&*status.read().expect("status lock"))
                .expect("status serializes"),
            Some(other) => json!({"error": format!("unknown command {other:?}")}),
            None => json!({"error": "no command"}),
        },
        Err(e) => json!({"error": format!("invalid request: {e}")}),
    };
    let mut out = reply.to_string();
    out.push('\n');
    let _ = write.write_all(out.as_bytes()).await;
}

/// Ask a running daemon for its status.
pub async fn request_status(path: &Path) -> anyhow::Result<Status> {
    let stream = UnixStream::connect(path).await.with_context(|| {
        format!(
            "cannot reach memtide at {} (is `memtide run` running?)",
            path.display()
        )
    })?;
    let (read, mut write) = stream.into_split();
    write.write_all(b"{\"command\": \"status\"}\n").await?;
    let mut line = String::new();
    BufReader::new(read).read_line(&mut line).await?;
    let value: Value = serde_json::from_str(&line).context("invalid reply from the daemon")?;
    if let Some(e) = value.get("error") {
        bail!("the daemon refused: {e}");
    }
    serde_json::from_value(value).context("unexpected status from the daemon")
}
