//! The accept loop of the daemon's listeners (control socket, HTTP). A failed accept —
//! typically EMFILE, out of descriptors, with the connection still pending — is logged
//! once and retried after a pause that doubles, instead of at once in a spin.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Pause after the first failed accept; doubled on each failure in a row.
const FIRST_PAUSE: Duration = Duration::from_millis(10);
/// Longest pause between two attempts.
const LONGEST_PAUSE: Duration = Duration::from_secs(1);

/// Accept connections with `accept` forever and hand each to `handle`; `what` names the
/// listener in the log.
pub async fn serve<T, A, F>(what: &str, mut accept: A, mut handle: impl FnMut(T))
where
    A: FnMut() -> F,
    F: Future<Output = std::io::Result<T>>,
{
    let mut pause: Option<Duration> = None;
    loop {
        match accept().await {
            Ok(connection) => {
                if pause.take().is_some() {
                    tracing::info!("{what}: accepting connections again");
                }
                handle(connection);
            }
            Err(e) => {
                let next = match pause {
                    None => {
                        tracing::warn!("{what}: cannot accept connections, retrying: {e}");
                        FIRST_PAUSE
                    }
                    Some(p) => (p * 2).min(LONGEST_PAUSE),
                };
                pause = Some(next);
                tokio::time::sleep(next).await;
            }
        }
    }
}

/// Like [`serve`], with at most `slots` connections served at once: a connection is
/// accepted only when a slot is free (the others wait in the kernel's queue, holding none
/// of the daemon's descriptors) and handed to `handle` with its slot, to drop when done.
pub async fn serve_capped<T, A, F>(
    what: &str,
    slots: usize,
    mut accept: A,
    handle: impl FnMut((T, OwnedSemaphorePermit)),
) where
    A: FnMut() -> F,
    F: Future<Output = std::io::Result<T>>,
{
    let slots = Arc::new(Semaphore::new(slots));
    let next = || {
        let (slots, accepted) = (slots.clone(), accept());
        async move {
            let slot = slots.acquire_owned().await.expect("never closed");
            Ok((accepted.await?, slot))
        }
    };
    serve(what, next, handle).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Error;
    use std::sync::{Arc, Mutex};
    use tokio::time::Instant;

    /// Captures what is logged while it is the thread's default subscriber.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn failed_accepts_back_off_and_are_logged_once() {
        let log = Captured::default();
        let writer = log.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        // 100 failures (out of descriptors), then one connection.
        let attempts = Arc::new(Mutex::new(Vec::new()));
        let seen = attempts.clone();
        let accept = move || {
            let mut seen = seen.lock().unwrap();
            seen.push(Instant::now());
            let n = seen.len();
            async move {
                match n {
                    ..=100 => Err(Error::from_raw_os_error(24)),
                    101 => Ok(n),
                    _ => std::future::pending().await,
                }
            }
        };
        let (done, mut accepted) = tokio::sync::mpsc::unbounded_channel();
        let start = Instant::now();
        let server = tokio::spawn(serve("test", accept, move |n| done.send(n).unwrap()));
        assert_eq!(accepted.recv().await, Some(101));
        server.abort();
        let attempts = attempts.lock().unwrap().clone();
        let in_first_second = attempts
            .iter()
            .filter(|t| **t - start < Duration::from_secs(1));
        // A spin retries at once; the back-off tries 10, 20, 40 … ms after, then each second.
        assert_eq!(in_first_second.count(), 7);
        let spacing = attempts[100] - attempts[99];
        assert_eq!(spacing, LONGEST_PAUSE);
        let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(
            lines[0].contains("test: cannot accept connections, retrying: Too many open files"),
            "{text}"
        );
        assert!(
            lines[1].contains("test: accepting connections again"),
            "{text}"
        );
    }
}
