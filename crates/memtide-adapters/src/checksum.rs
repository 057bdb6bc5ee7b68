//! Snapshot files' SHA-256: of a file read afresh, or taken while another process writes
//! it from its start, in order (QEMU's migration stream into a snapshot's memory file),
//! so that the checksum is ready about when the file is synced rather than after a read
//! of the whole file.

use memtide_core::backend::FileSum;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

/// The size of each read; a file being written is read only in whole blocks below its end
/// until its writer is done, so that the page being written is left alone.
const BLOCK: u64 = 1 << 20;
/// How often a file that has not grown by a whole block is looked at again.
const EVERY: Duration = Duration::from_micros(500);

/// `file`'s size and SHA-256, read from its start.
pub fn file_sum(file: &File) -> io::Result<FileSum> {
    let mut summer = Summer::default();
    summer.read_to(file, None)?;
    Ok(summer.sum())
}

/// A thread taking the SHA-256 of a file as one writer fills it from its start, in
/// order, never going back over what it wrote (QEMU's migration stream, not a
/// `mapped-ram` file): each whole block below the file's end as it appears, and the rest
/// once the writer is done ([`SumBehind::finish`]). Dropped unfinished, it stops.
pub struct SumBehind {
    done: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<io::Result<FileSum>>>,
}

impl SumBehind {
    /// Start on `file`, a descriptor of the file open for reading, for the thread.
    pub fn start(file: File) -> io::Result<SumBehind> {
        let (done, told) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("sum-behind".into())
            .spawn(move || run(&file, &told))?;
        Ok(SumBehind {
            done: Some(done),
            thread: Some(thread),
        })
    }

    /// The file's size and SHA-256, once its writer is done: what is left is read up to
    /// the file's end now. An error if the file could not be read, or is shorter than
    /// what was read of it already.
    pub fn finish(mut self) -> io::Result<FileSum> {
        if let Some(done) = &self.done {
            let _ = done.send(());
        }
        let thread = self
            .thread
            .take()
            .expect("joined only here and when dropped");
        thread
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the checksum thread panicked")))
    }
}

impl Drop for SumBehind {
    fn drop(&mut self) {
        drop(self.done.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Hash `file` as it grows, a block at a time, until `told` says the writer is done
/// (then to its end) or is dropped (then stop, with an error no one reads). The thread
/// runs at the lowest priority (nice 19): while QEMU writes, the guest is stopped, and
/// on a busy host QEMU and the disk's writeback come first (in two runs on a loaded
/// 2-core machine, with the checksum at QEMU's priority, the guest stayed stopped
/// longer); what it did not reach by the end is read after the sync, at nice 0.
fn run(file: &File, told: &mpsc::Receiver<()>) -> io::Result<FileSum> {
    // SAFETY: setpriority(2) of this thread alone (its thread id); no memory is involved.
    // A failure leaves it at its priority.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19) };
    let mut summer = Summer::default();
    loop {
        let whole = file.metadata()?.len() / BLOCK * BLOCK;
        let before = summer.at;
        if summer.at < whole {
            summer.read_to(file, Some(summer.at + BLOCK))?;
        }
        // No wait while there is more to read: the writer may be far ahead.
        let wait = if summer.at == before {
            EVERY
        } else {
            Duration::ZERO
        };
        match told.recv_timeout(wait) {
            Ok(()) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(io::Error::new(io::ErrorKind::Interrupted, "abandoned"));
            }
        }
    }
    // The writer is done: what is left holds up the save (and a hibernated guest stays
    // stopped meanwhile), so it is read at nice 0 where allowed (CAP_SYS_NICE; else at 19).
    // SAFETY: as above.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 0) };
    let end = file.metadata()?.len();
    summer.read_to(file, Some(end))?;
    Ok(summer.sum())
}

/// The SHA-256 of a file's bytes up to `at`, read in blocks.
struct Summer {
    hash: Sha256,
    at: u64,
    buf: Vec<u8>,
}

impl Default for Summer {
    fn default() -> Summer {
        Summer {
            hash: Sha256::new(),
            at: 0,
            buf: vec![0; BLOCK as usize],
        }
    }
}

impl Summer {
    /// Read and hash `file` from `at` up to offset `to`, or to its end when `to` is
    /// `None`; an error if it ends before `to`, or `to` is behind what was read.
    fn read_to(&mut self, file: &File, to: Option<u64>) -> io::Result<()> {
        if let Some(to) = to.filter(|to| *to < self.at) {
            return Err(io::Error::other(format!(
                "the file shrank to {to} bytes; {} were read",
                self.at
            )));
        }
        while to != Some(self.at) {
            let left = to.map_or(BLOCK, |to| (to - self.at).min(BLOCK));
            let buf = &mut self.buf[..left as usize];
            let n = match file.read_at(buf, self.at) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => other?,
            };
            if n == 0 {
                return match to {
                    None => Ok(()),
                    Some(to) => Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("the file ends at {} bytes, before {to}", self.at),
                    )),
                };
            }
            self.hash.update(&buf[..n]);
            self.at += n as u64;
        }
        Ok(())
    }

    fn sum(self) -> FileSum {
        let sha256 = self
            .hash
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        FileSum {
            bytes: self.at,
            sha256,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// sha256 of `bytes`, in hex.
    fn sha256(bytes: &[u8]) -> String {
        Sha256::digest(bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// Bytes that differ from block to block and within one.
    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 4093) as u8).collect()
    }

    #[test]
    fn a_file_read_afresh_is_summed_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory");
        let bytes = data(2 * BLOCK as usize + 12345);
        std::fs::write(&path, &bytes).unwrap();
        let sum = file_sum(&File::open(&path).unwrap()).unwrap();
        assert_eq!(sum.bytes, bytes.len() as u64);
        assert_eq!(sum.sha256, sha256(&bytes));
        std::fs::write(&path, b"guest memory").unwrap();
        // From coreutils' sha256sum.
        let sum = file_sum(&File::open(&path).unwrap()).unwrap();
        assert_eq!(
            sum.sha256,
            "c787ab22685cefed1fcb16c45d663282786a1f0f5383873a4019028b966fdab4"
        );
    }

    /// A new file `memory` in `dir`, open for writing, as a save opens it.
    fn created(dir: &std::path::Path) -> (std::path::PathBuf, File) {
        let path = dir.join("memory");
        let file = File::options()
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        (path, file)
    }

    /// A file written by another thread in pieces of `pieces` bytes (a pause after each),
    /// summed as it is written; its sum and the same file read afresh after.
    fn written_and_summed(pieces: &[usize]) -> (FileSum, FileSum, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let (path, mut file) = created(dir.path());
        let bytes = data(pieces.iter().sum());
        let summing = SumBehind::start(File::open(&path).unwrap()).unwrap();
        let all = bytes.clone();
        let pieces = pieces.to_vec();
        let writer = std::thread::spawn(move || {
            let mut at = 0;
            for n in pieces {
                file.write_all(&all[at..at + n]).unwrap();
                at += n;
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        writer.join().unwrap();
        let summed = summing.finish().unwrap();
        let afresh = file_sum(&File::open(&path).unwrap()).unwrap();
        (summed, afresh, bytes)
    }

    #[test]
    fn a_file_summed_as_another_thread_writes_it_matches_the_file_read_afresh() {
        let mib = BLOCK as usize;
        for pieces in [
            // Whole blocks; writes that end mid-block and cross blocks; a last write
            // that ends mid-block; one write of it all; nothing written.
            vec![mib; 5],
            vec![100_000, mib + 3, 7, 2 * mib - 4096, 333_333, mib / 2],
            vec![3 * mib + 17],
            vec![4096; 300],
            vec![],
        ] {
            let (summed, afresh, bytes) = written_and_summed(&pieces);
            assert_eq!(summed, afresh, "pieces {pieces:?}");
            assert_eq!(summed.bytes, bytes.len() as u64);
            assert_eq!(summed.sha256, sha256(&bytes));
        }
    }

    #[test]
    fn a_sum_whose_writer_failed_is_dropped_and_a_file_cut_back_has_none() {
        let dir = tempfile::tempdir().unwrap();
        let (path, mut file) = created(dir.path());
        // A writer that stops mid-way: the sum is dropped unfinished, its thread ended (no
        // bound on how long that takes: at nice 19 on a loaded host it waits its turn).
        let summing = SumBehind::start(File::open(&path).unwrap()).unwrap();
        file.write_all(&data(3 * BLOCK as usize + 5)).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        drop(summing);
        // A file cut back below what was summed of it, or ending before where it was
        // seen to: no sum.
        let reading = File::open(&path).unwrap();
        let mut summer = Summer::default();
        summer.read_to(&reading, Some(3 * BLOCK)).unwrap();
        file.set_len(BLOCK).unwrap();
        let e = summer
            .read_to(&reading, Some(BLOCK))
            .unwrap_err()
            .to_string();
        assert!(e.contains("shrank to 1048576 bytes"), "{e}");
        let e = Summer::default()
            .read_to(&reading, Some(2 * BLOCK))
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
    }
}
