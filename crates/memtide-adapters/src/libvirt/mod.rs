//! libvirt: the running domains of a libvirt connection (`qemu:///system`, ...), their
//! memory statistics, balloon, bounds and guest agent (through libvirt's own agent
//! channel), and their lifecycle events.
//!
//! The domain XML and memory-statistics parsers are plain functions, always built; the
//! connection needs libvirt's C library and is behind the `libvirt` feature.

pub mod stats;
pub mod xml;

#[cfg(feature = "libvirt")]
mod session;
#[cfg(feature = "libvirt")]
pub mod snapshot;
#[cfg(feature = "libvirt")]
mod vm;

#[cfg(feature = "libvirt")]
pub use session::Libvirt;
#[cfg(feature = "libvirt")]
pub use vm::{LibvirtVm, LibvirtVmOptions};

#[cfg(feature = "libvirt")]
use memtide_core::BackendError;

/// The file, in a snapshot's directory, that libvirt saves the domain into.
pub const MEMORY_FILE: &str = "memory";

/// The first bytes of a libvirt QEMU save image once it is whole (libvirt writes
/// `LibvirtQemudPart` first and this when the save completes).
const SAVE_MAGIC: &[u8; 16] = b"LibvirtQemudSave";

/// Whether the file at `path` is a whole libvirt QEMU save image, by its header: a
/// regular file, not a link (nothing else is opened: a FIFO would block).
pub fn is_whole_save_image(path: &std::path::Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    if !std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file()) {
        return false;
    }
    let mut magic = [0u8; 16];
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
        .is_ok_and(|()| &magic == SAVE_MAGIC)
}

/// A libvirt connection failure.
#[cfg(feature = "libvirt")]
#[derive(Debug, thiserror::Error)]
pub enum LibvirtError {
    /// libvirt's event loop could not be started.
    #[error("libvirt event loop: {0}")]
    EventLoop(String),
    /// The connection could not be opened.
    #[error("{uri}: {error}")]
    Connect {
        /// The URI.
        uri: String,
        /// Why.
        error: BackendError,
    },
    /// A call on the connection failed.
    #[error("{uri}: {error}")]
    Call {
        /// The URI.
        uri: String,
        /// Why.
        error: BackendError,
    },
}

#[cfg(feature = "libvirt")]
impl From<LibvirtError> for BackendError {
    fn from(e: LibvirtError) -> Self {
        match e {
            LibvirtError::Connect { error, .. } | LibvirtError::Call { error, .. } => error,
            e @ LibvirtError::EventLoop(_) => BackendError::Protocol(e.to_string()),
        }
    }
}
