//! The control socket: a unix socket (mode 0600) answering one JSON request per line.
//! `{"command": "status"}` returns the daemon's status; `{"command": "reload"}` reloads
//! the policy and returns `{"ok": "..."}` or `{"error": "..."}`.

use crate::accept;
use crate::status::Status;
use anyhow::{bail, Context};
use serde_json::{json, Value};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
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
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
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
        bind_private(dir, path).with_context(|| format!("binding {}", path.display()))?;
    tokio::spawn(async move {
        let answer = |(stream, _)| {
            tokio::spawn(answer(stream, status.clone(), requests.clone()));
        };
        accept::serve("control socket", || listener.accept(), answer).await;
    });
    Ok(ControlSocket {
        path: path.to_path_buf(),
    })
}

/// Bind a unix socket at `path` (in `dir`) that has mode 0600 from the moment it exists
/// there: it is bound in a private directory (0700) in `dir`, made 0600, then renamed
/// into place. (Changing the umask around `bind` would race with the daemon's other
/// threads, which create files too.)
fn bind_private(dir: &Path, path: &Path) -> std::io::Result<UnixListener> {
    let private = dir.join(format!(".memtide-bind-{}", std::process::id()));
    std::fs::DirBuilder::new().mode(0o700).create(&private)?;
    let bound = private.join("s");
    let listener = UnixListener::bind(&bound).and_then(|listener| {
        std::fs::set_permissions(&bound, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&bound, path)?;
        Ok(listener)
    });
    let _ = std::fs::remove_file(&bound);
    let _ = std::fs::remove_dir(&private);
    listener
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

#[cfg(test)]
mod tests {
    use super::*;
    use inotify::{EventMask, Inotify, WatchMask};
    use std::ffi::OsStr;

    #[tokio::test]
    async fn the_socket_appears_with_mode_0600_under_a_permissive_umask() {
        // SAFETY: umask(2) cannot fail; it sets this test process's file creation mask.
        unsafe { libc::umask(0) };
        let dir = tempfile::tempdir().unwrap();
        let mut inotify = Inotify::init().unwrap();
        let mask = WatchMask::CREATE | WatchMask::ATTRIB | WatchMask::MOVED_TO;
        inotify.watches().add(dir.path(), mask).unwrap();
        let path = dir.path().join("memtide.sock");
        let (requests, _) = mpsc::channel(1);
        let _socket = serve(&path, Arc::default(), requests).await.unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let mut buffer = [0; 4096];
        let events: Vec<EventMask> = inotify
            .read_events(&mut buffer)
            .unwrap()
            .filter(|e| e.name == Some(OsStr::new("memtide.sock")))
            .map(|e| e.mask)
            .collect();
        // Bound then chmod-ed in place (CREATE, ATTRIB) leaves a window with the umask's mode.
        assert_eq!(events, [EventMask::MOVED_TO]);
        let status = request_status(&path).await.unwrap();
        assert_eq!(status, Status::default());
    }
}
