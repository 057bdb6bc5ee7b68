//! A Firecracker API socket served by the harness that answers every request with a
//! body far larger than any real reply.

use std::path::Path;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixListener;

/// Size of each reply body.
const BODY: usize = 256 << 20;

/// Serve on a new socket at `path` until the runtime ends.
pub fn serve(path: &Path) -> std::io::Result<()> {
    let listener = UnixListener::bind(path)?;
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = [0u8; 4096];
                while matches!(stream.read(&mut request).await, Ok(n) if n > 0) {
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {BODY}\r\n\r\n"
                    );
                    if stream.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    let chunk = vec![b'"'; 1 << 20];
                    for _ in 0..BODY >> 20 {
                        if stream.write_all(&chunk).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    Ok(())
}
