//! Standard output for the commands. A reader that goes away (`memtide status | head`)
//! ends a command quietly, as it ends any Unix tool, not with an error or a panic: Rust
//! ignores SIGPIPE, so without this each write fails with EPIPE and `println!` panics.

use std::fmt::Display;
use std::io::{self, Write};

/// Standard output's reader has gone.
#[derive(Debug, thiserror::Error)]
#[error("standard output's reader has gone")]
pub struct Closed;

/// Standard output, whose writes fail with [`Closed`] (inside an `io::Error`) once its
/// reader has gone.
pub struct Stdout;

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        io::stdout().write(buf).map_err(closed)
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stdout().flush().map_err(closed)
    }
}

fn closed(e: io::Error) -> io::Error {
    match e.kind() {
        io::ErrorKind::BrokenPipe => io::Error::new(io::ErrorKind::BrokenPipe, Closed),
        _ => e,
    }
}

/// Print `text` and a newline.
pub fn println(text: impl Display) -> io::Result<()> {
    writeln!(Stdout, "{text}")
}

/// Print `text`.
pub fn print(text: impl Display) -> io::Result<()> {
    write!(Stdout, "{text}")
}

/// Whether `e` came of standard output's reader having gone: the command's end, no error.
pub fn is_closed(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.is::<Closed>()
            || c.downcast_ref::<io::Error>()
                .and_then(io::Error::get_ref)
                .is_some_and(|inner| inner.is::<Closed>())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn only_standard_outputs_own_broken_pipe_is_its_reader_gone() {
        let gone = closed(io::Error::from(io::ErrorKind::BrokenPipe));
        assert!(is_closed(&anyhow::Error::new(gone).context("writing")));
        // A broken pipe elsewhere (the daemon's socket) is an error.
        let socket = io::Error::from(io::ErrorKind::BrokenPipe);
        assert!(!is_closed(&anyhow::Error::new(socket)));
        let other = closed(io::Error::from(io::ErrorKind::StorageFull));
        assert!(!is_closed(&Err::<(), _>(other).context("x").unwrap_err()));
    }
}
