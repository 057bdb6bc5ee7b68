//! Write-behind for a file another process fills (QEMU migrating a guest into a
//! snapshot): its dirty pages are sent to the disk as they are written, so that the disk
//! works while the writer produces and the `fsync` that ends the save finds little left.
//! Left to the kernel, a file smaller than its dirty threshold (10% of memory by default)
//! is written back only by that `fsync`, after the writer has finished: the two in turn.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the file's new pages are sent to the disk: often, so the disk is fed in
/// small pieces as QEMU writes (measured on this project's test guest, a 246 MiB save by
/// QEMU 7.2 into a file, three saves each: 1.41-1.62 GiB/s every 5 ms, 1.51-1.84 every
/// 2 ms, 1.85-1.94 every 0.5 ms, docs/snapshots.md; QEMU itself writes the stream into
/// /dev/null at 8-11 GiB/s, so the disk sets the pace). A pass that finds nothing new
/// costs a `fstat` and a walk of the file's dirty tags.
const EVERY: Duration = Duration::from_micros(500);
/// Writeback is started up to a multiple of this below the file's end: the page being
/// written is left alone (a device with stable writes would stall the writer on it).
const STEP: u64 = 1 << 20;

/// A thread starting writeback of `file`'s new pages (`sync_file_range`,
/// `SYNC_FILE_RANGE_WRITE`: started, not waited for) every half millisecond, until
/// dropped. It makes nothing durable: the file still needs its `fsync`.
pub struct WriteBehind {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl WriteBehind {
    /// Start write-behind of `file` (a descriptor of its own is kept for the thread); a
    /// file that cannot be duplicated is left to its `fsync`, with a debug message.
    pub fn start(file: &File) -> WriteBehind {
        let (stop, stopped) = mpsc::channel();
        let thread = match file.try_clone() {
            Ok(file) => std::thread::Builder::new()
                .name("write-behind".into())
                .spawn(move || run(&file, &stopped))
                .map_err(|e| tracing::debug!("no write-behind thread: {e}"))
                .ok(),
            Err(e) => {
                tracing::debug!("no write-behind: {e}");
                None
            }
        };
        WriteBehind {
            stop: Some(stop),
            thread,
        }
    }
}

impl Drop for WriteBehind {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Until `stopped` says so (its sender dropped), start writeback of the dirty pages below
/// the file's end, the whole range each pass: a `mapped-ram` file is not written in
/// order, and pages already clean or under writeback are skipped by the kernel (which
/// finds dirty pages by their tags, without waiting). A file system without
/// `sync_file_range` ends it at once.
fn run(file: &File, stopped: &mpsc::Receiver<()>) {
    while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(EVERY) {
        let Ok(meta) = file.metadata() else { return };
        let to = meta.len() / STEP * STEP;
        if to == 0 {
            continue;
        }
        // SAFETY: sync_file_range(2) on a descriptor this thread owns; no memory is
        // involved.
        let rc = unsafe {
            libc::sync_file_range(
                file.as_raw_fd(),
                0,
                to as libc::off64_t,
                libc::SYNC_FILE_RANGE_WRITE,
            )
        };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            tracing::debug!("write-behind stopped: sync_file_range: {e}");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::time::Instant;

    /// cachestat(2)'s number (Linux 6.5; the same on every architecture).
    const SYS_CACHESTAT: libc::c_long = 451;

    /// The dirty pages of `file` in `[off, off + len)`, by cachestat(2); None on a kernel
    /// without it.
    fn dirty(file: &File, off: u64, len: u64) -> Option<u64> {
        let range = [off, len];
        // cache, dirty, writeback, evicted, recently evicted
        let mut stat = [0u64; 5];
        // SAFETY: cachestat(2) reads `range` (struct cachestat_range: two u64s) and writes
        // `stat` (struct cachestat: five u64s), both live and that large.
        let rc = unsafe {
            libc::syscall(
                SYS_CACHESTAT,
                file.as_raw_fd(),
                range.as_ptr(),
                stat.as_mut_ptr(),
                0,
            )
        };
        (rc == 0).then_some(stat[1])
    }

    #[test]
    fn a_files_pages_go_to_the_disk_as_it_is_written_up_to_the_mib_being_written() {
        // A disk-backed directory (not a tmpfs /tmp, whose pages are never written back).
        let target = concat!(env!("CARGO_MANIFEST_DIR"), "/../../target");
        std::fs::create_dir_all(target).unwrap();
        let dir = tempfile::tempdir_in(target).unwrap();
        let mut file = File::create(dir.path().join("memory")).unwrap();
        let whole = 8 * STEP;
        file.write_all(&vec![7u8; (whole + 4096) as usize]).unwrap();
        let Some(before) = dirty(&file, 0, whole) else {
            return eprintln!("no cachestat(2): write-behind not observable");
        };
        // Dirty and left so: the file is far below the kernel's own writeback threshold.
        assert!(before > 0, "written pages are dirty");
        let behind = WriteBehind::start(&file);
        let start = Instant::now();
        while dirty(&file, 0, whole) != Some(0) {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "{:?} of the file's pages still dirty",
                dirty(&file, 0, whole)
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(behind);
        // The page past the last whole MiB, the one a writer would be writing, is not.
        assert_eq!(dirty(&file, whole, 4096), Some(1));
    }
}
