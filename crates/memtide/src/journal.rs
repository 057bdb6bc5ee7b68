//! Standard error as the journal reads it: under systemd (`JOURNAL_STREAM` names the
//! stream standard error is), each log line starts with its syslog priority (`<3>` for
//! an error, `<4>` a warning, `<6>` information, `<7>` debugging), which journald takes as
//! the entry's priority and strips (`SyslogLevelPrefix=`, on by default): without it,
//! every line is stored at the unit's default priority and `journalctl -p warning` shows
//! none of memtide's warnings. tracing-subscriber's formatter writes each event with one
//! writer from [`MakeWriter::make_writer_for`], which sees the event's level: the prefix
//! is written there, so neither output format changes in a terminal or a pipe.

use std::io::{self, StderrLock, Write};
use tracing::{Level, Metadata};
use tracing_subscriber::fmt::MakeWriter;

/// Standard error, with syslog priority prefixes where it is the journal's stream.
#[derive(Clone, Copy, Debug)]
pub struct LogWriter {
    prefixed: bool,
}

impl LogWriter {
    /// Prefixed where `JOURNAL_STREAM` (`DEVICE:INODE`) is standard error's.
    pub fn new() -> LogWriter {
        let prefixed = std::env::var("JOURNAL_STREAM")
            .ok()
            .is_some_and(|stream| stream == stderr_id().unwrap_or_default());
        LogWriter { prefixed }
    }
}

impl LogWriter {
    /// What starts a line memtide writes on standard error itself (not through tracing)
    /// as an error: `<3>` on the journal's stream, nothing elsewhere.
    pub fn error_prefix(&self) -> &'static str {
        if self.prefixed {
            "<3>"
        } else {
            ""
        }
    }
}

impl Default for LogWriter {
    fn default() -> Self {
        LogWriter::new()
    }
}

/// Standard error's `DEVICE:INODE`, as systemd writes `JOURNAL_STREAM`.
fn stderr_id() -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata("/proc/self/fd/2").ok()?;
    Some(format!("{}:{}", m.dev(), m.ino()))
}

/// The syslog priority of a level (RFC 5424's numbers).
pub fn priority(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        _ => 7,
    }
}

/// One event's writer: its priority first, where prefixed. It holds standard error's
/// lock, so that no other thread's line comes between the prefix and its line.
pub struct EventWriter {
    prefix: Option<u8>,
    out: StderrLock<'static>,
}

impl Write for EventWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Some(p) = self.prefix.take() {
            write!(self.out, "<{p}>")?;
        }
        self.out.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

impl<'a> MakeWriter<'a> for LogWriter {
    type Writer = EventWriter;

    fn make_writer(&'a self) -> EventWriter {
        EventWriter {
            prefix: None,
            out: io::stderr().lock(),
        }
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> EventWriter {
        EventWriter {
            prefix: self.prefixed.then(|| priority(meta.level())),
            out: io::stderr().lock(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_map_to_syslog_priorities() {
        let p: Vec<u8> = [
            Level::ERROR,
            Level::WARN,
            Level::INFO,
            Level::DEBUG,
            Level::TRACE,
        ]
        .iter()
        .map(priority)
        .collect();
        assert_eq!(p, [3, 4, 6, 7, 7]);
    }
}
