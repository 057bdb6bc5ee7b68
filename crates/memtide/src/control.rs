//! The control socket: a unix socket (mode 0600) answering one JSON request per line.
//! `{"command": "status"}` returns the daemon's status; `{"command": "reload"}` reloads
//! the policy and returns `{"ok": "..."}` or `{"error": "..."}`.

use crate::status::Status;
use anyhow::{bail, Context};
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};

/// A request the daemon itself must handle.
pub enum Request {
    /// Reload the policy; the reply says what was loaded, or why not.
    Reload(oneshot::Sender<Result<String, String>>),
}

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
pub async fn serve(
    path: &Path,
    status: Arc<RwLock<Status>>,
    requests: mpsc::Sender<Request>,
) -> anyhow::Result<ControlSocket> {
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
            tokio::spawn(answer(stream, status.clone(), requests.clone()));
        }
    });
    Ok(ControlSocket {
        path: path.to_path_buf(),
    })
}

async fn answer(stream: UnixStream, status: Arc<RwLock<Status>>, requests: mpsc::Sender<Request>) {
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
            Some("reload") => reload(&requests).await,
            Some(other) => json!({"error": format!("unknown command {other:?}")}),
            None => json!({"error": "no command"}),
        },
        Err(e) => json!({"error": format!("invalid request: {e}")}),
    };
    let mut out = reply.to_string();
    out.push('\n');
    let _ = write.write_all(out.as_bytes()).await;
}

async fn reload(requests: &mpsc::Sender<Request>) -> Value {
    let (tx, rx) = oneshot::channel();
    if requests.send(Request::Reload(tx)).await.is_err() {
        return json!({"error": "the daemon is stopping"});
    }
    match rx.await {
        Ok(Ok(loaded)) => json!({"ok": loaded}),
        Ok(Err(e)) => json!({"error": e}),
        Err(_) => json!({"error": "the daemon is stopping"}),
    }
}

/// Send one command to a running daemon and return its reply.
async fn request(path: &Path, command: &str) -> anyhow::Result<Value> {
    let stream = UnixStream::connect(path).await.with_context(|| {
        format!(
            "cannot reach memtide at {} (is `memtide run` running?)",
            path.display()
        )
    })?;
    let (read, mut write) = stream.into_split();
    write
        .write_all(format!("{}\n", json!({"command": command})).as_bytes())
        .await?;
    let mut line = String::new();
    BufReader::new(read).read_line(&mut line).await?;
    serde_json::from_str(&line).context("invalid reply from the daemon")
}

/// Ask a running daemon to reload its policy; returns what it loaded.
pub async fn request_reload(path: &Path) -> anyhow::Result<String> {
    let reply = request(path, "reload").await?;
    match (reply.get("ok"), reply.get("error")) {
        (Some(ok), _) => Ok(ok.as_str().unwrap_or_default().to_string()),
        (_, Some(e)) => bail!("policy not reloaded: {}", e.as_str().unwrap_or_default()),
        _ => bail!("unexpected reply from the daemon: {reply}"),
    }
}

/// Ask a running daemon for its status.
pub async fn request_status(path: &Path) -> anyhow::Result<Status> {
    let value = request(path, "status").await?;
    if let Some(e) = value.get("error") {
        bail!("the daemon refused: {e}");
    }
    serde_json::from_value(value).context("unexpected status from the daemon")
}
