//! Delimited messages (QMP's JSON lines, qemu-ga's lines and its 0xFF sync byte) read
//! from a socket with no buffer held while waiting: room is made only once the socket
//! has data, so a connection waiting for its peer holds no memory for reading, where a
//! `BufReader` holds 8 KiB (8 MiB for 500 VMs with a monitor and an agent each, and as
//! much again while all of them wait for their answers at once).

use std::future::Future;
use tokio::net::unix::OwnedReadHalf;
use tokio::net::UnixStream;

/// A socket read only once it has data: tokio's unix stream, or its read half.
pub trait Socket {
    /// Wait until it may be read.
    fn readable(&self) -> impl Future<Output = std::io::Result<()>> + Send;
    /// Read what it holds into `buf`'s spare room, without waiting.
    fn try_read_buf(&self, buf: &mut Vec<u8>) -> std::io::Result<usize>;
}

impl Socket for UnixStream {
    fn readable(&self) -> impl Future<Output = std::io::Result<()>> + Send {
        UnixStream::readable(self)
    }
    fn try_read_buf(&self, buf: &mut Vec<u8>) -> std::io::Result<usize> {
        UnixStream::try_read_buf(self, buf)
    }
}

impl Socket for OwnedReadHalf {
    fn readable(&self) -> impl Future<Output = std::io::Result<()>> + Send {
        OwnedReadHalf::readable(self)
    }
    fn try_read_buf(&self, buf: &mut Vec<u8>) -> std::io::Result<usize> {
        OwnedReadHalf::try_read_buf(self, buf)
    }
}

/// Room made for each read: one read takes a usual reply whole.
const READ: usize = 8 << 10;

/// A stream read message by message.
pub struct Framed<R> {
    inner: R,
    /// Bytes read past the last message: the start of the next.
    rest: Vec<u8>,
}

impl<R: Socket> Framed<R> {
    /// Read messages from `inner`.
    pub fn new(inner: R) -> Framed<R> {
        Framed {
            inner,
            rest: Vec::new(),
        }
    }

    /// The stream, to write to it.
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    /// The next bytes up to and including `delim`, `max` at the most: without the
    /// delimiter when `max` bytes or the end of the stream came first, empty at the end
    /// of the stream. Bytes read past it are kept for the next call. A read dropped
    /// before it ends loses what it read (both users then drop or resync the session).
    pub async fn read_until(&mut self, delim: u8, max: usize) -> std::io::Result<Vec<u8>> {
        let mut out = std::mem::take(&mut self.rest);
        let mut scanned = 0;
        loop {
            let end = out.len().min(max);
            if let Some(i) = out[scanned..end].iter().position(|&b| b == delim) {
                self.rest = out.split_off(scanned + i + 1);
                return Ok(out);
            }
            if out.len() >= max {
                self.rest = out.split_off(max);
                return Ok(out);
            }
            scanned = out.len();
            self.inner.readable().await?;
            out.reserve(READ.min(max - out.len()));
            match self.inner.try_read_buf(&mut out) {
                Ok(0) => return Ok(out),
                Ok(_) => {}
                // Readiness was stale: nothing read, no room kept while waiting again.
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && out.is_empty() => {
                    out = Vec::new();
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    fn text(read: std::io::Result<Vec<u8>>) -> String {
        String::from_utf8_lossy(&read.unwrap()).into_owned()
    }

    #[tokio::test]
    async fn messages_split_and_merged_across_reads_come_out_whole() {
        let (mut tx, rx) = UnixStream::pair().unwrap();
        let mut framed = Framed::new(rx);
        tokio::spawn(async move {
            // Two messages in one write, one split over three, then a message cut by
            // the end of the stream.
            tx.write_all(b"{\"a\": 1}\n{\"b\": 2}\n").await.unwrap();
            for part in [&b"{\"c\""[..], b": 3", b"}\n\xffsync\nlong line"] {
                tx.write_all(part).await.unwrap();
                tokio::task::yield_now().await;
            }
        });
        assert_eq!(text(framed.read_until(b'\n', 100).await), "{\"a\": 1}\n");
        assert_eq!(text(framed.read_until(b'\n', 100).await), "{\"b\": 2}\n");
        assert_eq!(text(framed.read_until(b'\n', 100).await), "{\"c\": 3}\n");
        assert_eq!(text(framed.read_until(0xFF, 100).await), "\u{fffd}");
        assert_eq!(text(framed.read_until(b'\n', 100).await), "sync\n");
        assert_eq!(
            text(framed.read_until(b'\n', 4).await),
            "long",
            "cut at the bound"
        );
        assert_eq!(
            text(framed.read_until(b'\n', 100).await),
            " line",
            "the rest, to the end"
        );
        assert_eq!(
            text(framed.read_until(b'\n', 100).await),
            "",
            "the end of the stream"
        );
    }

    #[tokio::test]
    async fn nothing_is_held_between_messages() {
        let (mut tx, rx) = UnixStream::pair().unwrap();
        let mut framed = Framed::new(rx);
        tx.write_all(&[b'x'; 20_000]).await.unwrap();
        tx.write_all(b"\n").await.unwrap();
        let line = framed.read_until(b'\n', 1 << 20).await.unwrap();
        assert_eq!(line.len(), 20_001);
        assert_eq!(framed.rest.capacity(), 0);
    }
}
