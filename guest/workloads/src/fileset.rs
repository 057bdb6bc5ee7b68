//! A file set: a file on the data disk whose blocks are read at random
//! through the page cache, so that the page cache holds the working set.

use std::ffi::c_int;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::progress::Progress;

/// `statfs.f_type` of the file systems that keep files in RAM (the
/// initramfs is one): their pages are not a cache that can be dropped.
const TMPFS_MAGIC: i64 = 0x0102_1994;
const RAMFS_MAGIC: i64 = 0x8584_58f6;
/// Readahead off: a miss reads the block asked for, no more, as databases ask.
const POSIX_FADV_RANDOM: c_int = 1;
/// Bytes written per `write` when creating the set.
const WRITE_CHUNK: usize = 1 << 20;

extern "C" {
    fn fstatfs(fd: c_int, buf: *mut StatFs) -> c_int;
    fn posix_fadvise(fd: c_int, offset: i64, len: i64, advice: c_int) -> c_int;
}

/// `struct statfs` of Linux on x86_64/aarch64 (120 bytes), of which only
/// the first field, `f_type`, is used.
#[repr(C)]
struct StatFs {
    f_type: i64,
    rest: [u64; 15],
}

/// An open file set.
pub struct FileSet {
    file: File,
    len: u64,
    block: usize,
    rng: XorShift,
}

impl FileSet {
    /// Opens `path`, first creating it or writing it up to `len` bytes if it
    /// is shorter, and returns it with the number of bytes written. Reads
    /// will be of `block` bytes. Refuses files kept in RAM.
    pub fn prepare(path: &Path, len: u64, block: usize) -> io::Result<(FileSet, u64)> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|err| match err.kind() {
                io::ErrorKind::NotFound => io::Error::new(
                    err.kind(),
                    format!(
                        "no directory {} (in the guest: is the data disk attached?)",
                        path.parent().unwrap_or(path).display()
                    ),
                ),
                _ => err,
            })?;
        if in_ram(&file)? {
            return Err(io::Error::other(format!(
                "{} is kept in RAM, not in the page cache of a disk",
                path.display()
            )));
        }
        let had = file.metadata()?.len();
        if had < len {
            write_from(&file, had, len)?;
        }
        // SAFETY: plain system call on our own descriptor.
        let rc = unsafe { posix_fadvise(file.as_raw_fd(), 0, 0, POSIX_FADV_RANDOM) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        let fileset = FileSet {
            file,
            len: len.max(had),
            block,
            rng: XorShift::seeded(),
        };
        Ok((fileset, len.saturating_sub(had)))
    }

    /// Reads random blocks of the first `set` bytes (a multiple of the block
    /// size), until `deadline` (forever when `None`), counting the bytes read
    /// in `progress`.
    pub fn read_until(
        &mut self,
        set: u64,
        deadline: Option<Instant>,
        progress: &Progress,
    ) -> io::Result<()> {
        assert!(
            set <= self.len,
            "set of {set} bytes in a {}-byte file",
            self.len
        );
        let blocks = set / self.block as u64;
        let mut buf = vec![0; self.block];
        while deadline.is_none_or(|deadline| Instant::now() < deadline) {
            let offset = self.rng.below(blocks) * self.block as u64;
            self.file.read_exact_at(&mut buf, offset)?;
            progress.add(buf.len() as u64);
        }
        Ok(())
    }
}

fn in_ram(file: &File) -> io::Result<bool> {
    let mut stat = StatFs {
        f_type: 0,
        rest: [0; 15],
    };
    // SAFETY: `stat` is as large as the kernel's struct statfs.
    if unsafe { fstatfs(file.as_raw_fd(), &mut stat) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(matches!(stat.f_type, TMPFS_MAGIC | RAMFS_MAGIC))
}

/// Writes bytes `from..to` of `file` (no holes: every page is real data on
/// the disk) and waits until they are on the disk.
fn write_from(file: &File, from: u64, to: u64) -> io::Result<()> {
    let mut chunk = vec![0; WRITE_CHUNK];
    let mut offset = from;
    while offset < to {
        let n = (to - offset).min(WRITE_CHUNK as u64) as usize;
        chunk.fill((offset >> 20) as u8 | 1);
        file.write_all_at(&chunk[..n], offset)?;
        offset += n as u64;
    }
    file.sync_all()
}

/// xorshift64: fast, and good enough to pick blocks.
struct XorShift(u64);

impl XorShift {
    fn seeded() -> XorShift {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        XorShift(nanos | 1)
    }

    /// A number in `0..n` (`n` > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::path::PathBuf;
    use std::time::Duration;

    #[test]
    fn writes_the_set_once_and_reads_it() {
        let path = std::env::temp_dir().join(format!("fileset-test-{}", std::process::id()));
        let (mut set, wrote) = match FileSet::prepare(&path, 3 << 20, 4096) {
            Err(err) if err.to_string().contains("is kept in RAM") => {
                let _ = fs::remove_file(&path);
                eprintln!("skipped: the temporary directory is a tmpfs");
                return;
            }
            prepared => prepared.unwrap(),
        };
        assert_eq!(wrote, 3 << 20);
        assert_eq!(fs::metadata(&path).unwrap().len(), 3 << 20);
        assert!(fs::read(&path).unwrap().iter().all(|&b| b != 0));
        let progress = Progress::new();
        let deadline = Instant::now() + Duration::from_millis(20);
        set.read_until(2 << 20, Some(deadline), &progress).unwrap();
        let bytes = progress.snapshot().bytes;
        assert!(bytes > 0 && bytes.is_multiple_of(4096), "{bytes}");

        // Opened again: longer needs only the missing part, shorter nothing.
        assert_eq!(FileSet::prepare(&path, 4 << 20, 4096).unwrap().1, 1 << 20);
        assert_eq!(FileSet::prepare(&path, 1 << 20, 4096).unwrap().1, 0);
        assert_eq!(fs::metadata(&path).unwrap().len(), 4 << 20);
        fs::remove_file(&path).unwrap();
    }

    #[test]
    fn refuses_files_in_ram() {
        let mounts = fs::read_to_string("/proc/mounts").unwrap();
        if !mounts
            .lines()
            .any(|line| line.starts_with("tmpfs /dev/shm tmpfs "))
        {
            eprintln!("skipped: no tmpfs on /dev/shm");
            return;
        }
        let path = PathBuf::from(format!("/dev/shm/fileset-test-{}", std::process::id()));
        let err = FileSet::prepare(&path, 1 << 20, 4096).err().unwrap();
        let _ = fs::remove_file(&path);
        assert!(err.to_string().contains("is kept in RAM"), "{err}");
    }

    #[test]
    fn says_when_the_directory_is_missing() {
        let path = Path::new("/nonexistent-memtide-dir/fileset");
        let err = FileSet::prepare(path, 1 << 20, 4096).err().unwrap();
        assert_eq!(
            err.to_string(),
            "no directory /nonexistent-memtide-dir (in the guest: is the data disk attached?)"
        );
    }

    #[test]
    fn random_blocks_cover_the_range() {
        let mut rng = XorShift(1);
        let mut seen = [false; 8];
        for _ in 0..1000 {
            seen[rng.below(8) as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }
}
