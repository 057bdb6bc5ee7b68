//! An operator's text file read whole (configuration, policy files, scenarios, policy
//! snapshots): a regular file of bounded size, so that a path naming a FIFO, a device or
//! a huge file gives an error instead of blocking the daemon's reload or filling memory
//! (found by an audit: `policy = "/dev/zero"` grew `memtide policy check` to 24 GB, and a
//! reload of a policy naming a FIFO held the daemon's runtime until someone wrote to it).

use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The largest text file read: far above any configuration, policy or scenario.
pub const MAX_BYTES: u64 = 64 << 20;

/// Whether [`open_regular`] follows a symbolic link at the path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Links {
    /// Followed (a configuration file kept elsewhere and linked).
    Follow,
    /// Refused (a snapshot's files: what the store holds is read, nothing else).
    Refuse,
}

/// The regular file at `path`, open for reading, without ever waiting to open it or
/// opening anything else.
pub fn open_regular(path: &Path, links: Links) -> io::Result<std::fs::File> {
    let not_regular = |what: &str| io::Error::new(io::ErrorKind::InvalidInput, what.to_string());
    use rustix::fs::OFlags;
    // A device is not even opened (opening some has effects: a watchdog arms).
    let (meta, mut flags) = match links {
        Links::Follow => (std::fs::metadata(path)?, OFlags::NONBLOCK),
        Links::Refuse => (
            std::fs::symlink_metadata(path)?,
            OFlags::NONBLOCK | OFlags::NOFOLLOW,
        ),
    };
    if meta.is_symlink() {
        return Err(not_regular("a symbolic link, not followed"));
    }
    if !meta.is_file() {
        return Err(not_regular("not a regular file"));
    }
    // Opened without blocking (a FIFO put in its place since would wait for a writer),
    // checked again by the descriptor itself, then read as any file is: the flag would
    // reach a FUSE or NFS file system's reads.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags.bits() as i32)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(not_regular("not a regular file"));
    }
    flags = rustix::fs::fcntl_getfl(&file)?;
    rustix::fs::fcntl_setfl(&file, flags - OFlags::NONBLOCK)?;
    Ok(file)
}

/// The text of the regular file at `path` (a link followed), at most [`MAX_BYTES`] long.
pub fn read(path: &Path) -> io::Result<String> {
    read_file(open_regular(path, Links::Follow)?)
}

/// The text of `file`, at most [`MAX_BYTES`] long.
pub fn read_file(file: std::fs::File) -> io::Result<String> {
    let mut bytes = Vec::new();
    file.take(MAX_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("larger than {} MiB", MAX_BYTES >> 20),
        ));
    }
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let line = e.as_bytes()[..at].iter().filter(|b| **b == b'\n').count() + 1;
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("not UTF-8 text: line {line} holds an invalid byte"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_regular_file_is_read_and_anything_else_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("a.toml");
        std::fs::write(&text, "interval_s = 2\n").unwrap();
        assert_eq!(read(&text).unwrap(), "interval_s = 2\n");

        let err = |path: &Path| read(path).unwrap_err().to_string();
        // A FIFO with no writer: refused without waiting for one.
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert_eq!(err(&fifo), "not a regular file");
        assert_eq!(err(Path::new("/dev/zero")), "not a regular file");
        assert_eq!(err(dir.path()), "not a regular file");
        // Too long: refused having read one byte past the limit, not the whole file.
        let big = dir.path().join("big");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(MAX_BYTES + 1)
            .unwrap();
        assert_eq!(err(&big), "larger than 64 MiB");
        std::fs::write(&text, b"a = 1\nb = \"\xff\"\n").unwrap();
        assert_eq!(err(&text), "not UTF-8 text: line 2 holds an invalid byte");
        assert!(err(&dir.path().join("none")).contains("No such file"));
    }
}
