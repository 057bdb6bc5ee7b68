//! A hypervisor's guest RAM put back in huge pages after its balloon gave memory back.
//!
//! QEMU backs guest RAM with transparent huge pages. Each page the balloon takes is
//! discarded from the host in 4 KiB (MADV_DONTNEED), which splits the huge page around
//! it; when the balloon gives the memory back, the guest's new writes fault it in as
//! 4 KiB pages, and the kernel's khugepaged gathers them into huge pages again only
//! slowly (4 096 pages every 10 s by default). Under TCG, guests sharing a few cores then
//! run measurably slower (docs/benchmarks.md, "overcommit": 0.83 × no management with
//! memtide's balloon on a 2-core host, 1.15 × with the ranges collapsed again).
//!
//! This asks the kernel to collapse each 2 MiB range of the guest RAM whose 512 pages are
//! all resident (`MADV_COLLAPSE` through process_madvise(2), Linux 6.1). Ranges with a
//! page not resident are left alone: collapsing them would fill the holes with zeroes,
//! taking back memory the balloon freed or the guest never used.

use crate::access::{present_frame, private_writable, Mappings};
use crate::pidfd::Pidfd;
use memtide_core::Bytes;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// The size of a huge page, and of a range collapsed into one.
pub const HUGE: u64 = 2 << 20;
/// madvise(2)'s `MADV_COLLAPSE` (include/uapi/asm-generic/mman-common.h; not in the libc
/// crate).
const MADV_COLLAPSE: i32 = 25;
/// Base pages in a huge page.
const PAGES: usize = 512;

/// What one pass over a process's guest RAM did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Collapsed {
    /// Resident 2 MiB ranges the kernel was asked to collapse (those already one huge
    /// page it leaves as they are).
    pub asked: u64,
    /// Those the kernel could not collapse now (`EAGAIN`, `ENOMEM`: a page locked or in
    /// use, no free huge page).
    pub refused: u64,
    /// The process's memory in huge pages before the pass (`AnonHugePages`).
    pub huge_before: Bytes,
    /// And after.
    pub huge_after: Bytes,
}

/// Why a pass could not run at all.
#[derive(Debug, thiserror::Error)]
pub enum CollapseError {
    /// Reading the process's files or holding it failed (it ended, or no permission).
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: io::Error,
    },
    /// The kernel refused the advice itself: no `MADV_COLLAPSE` (before 6.1, or no
    /// transparent huge pages), or no CAP_SYS_NICE.
    #[error("the kernel refused MADV_COLLAPSE ({0}): it needs Linux 6.1 with transparent huge pages, and CAP_SYS_NICE")]
    Refused(io::Error),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> CollapseError {
    let what = what.into();
    move |source| CollapseError::Io { what, source }
}

/// Collapse the resident 2 MiB ranges of process `pid`'s `which` mappings (procfs at
/// `proc`) into huge pages.
pub fn collapse_resident(
    proc: &Path,
    pid: i32,
    which: Mappings,
) -> Result<Collapsed, CollapseError> {
    let dir = proc.join(pid.to_string());
    let maps = std::fs::read_to_string(dir.join("maps"))
        .map_err(io_err(format!("reading {}/maps", dir.display())))?;
    let pagemap = File::open(dir.join("pagemap"))
        .map_err(io_err(format!("opening {}/pagemap", dir.display())))?;
    let process = Pidfd::open(pid).map_err(io_err(format!("holding process {pid}")))?;
    let mut done = Collapsed {
        huge_before: anon_huge(&dir)?,
        ..Collapsed::default()
    };
    let mut entries = vec![0u8; PAGES * 8];
    for range in private_writable(&maps)
        .into_iter()
        .filter(|r| which.wants(r))
    {
        let mut start = range.start.next_multiple_of(HUGE);
        while start + HUGE <= range.end {
            let at = start;
            start += HUGE;
            pagemap
                .read_exact_at(&mut entries, at / 4096 * 8)
                .map_err(io_err(format!("reading {}/pagemap", dir.display())))?;
            let resident = entries
                .chunks_exact(8)
                .all(|e| present_frame(u64::from_le_bytes(e.try_into().unwrap())).is_some());
            if !resident {
                continue;
            }
            done.asked += 1;
            match process.madvise(at, HUGE, MADV_COLLAPSE) {
                Ok(()) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::ENOMEM)) => {
                    done.refused += 1
                }
                // The range changed under us (unmapped, no longer anonymous): next pass.
                Err(e) if e.raw_os_error() == Some(libc::EFAULT) => done.refused += 1,
                Err(e) => return Err(CollapseError::Refused(e)),
            }
        }
    }
    done.huge_after = anon_huge(&dir)?;
    Ok(done)
}

/// The process's anonymous memory in huge pages (`AnonHugePages` of smaps_rollup).
fn anon_huge(dir: &Path) -> Result<Bytes, CollapseError> {
    let path = dir.join("smaps_rollup");
    let text =
        std::fs::read_to_string(&path).map_err(io_err(format!("reading {}", path.display())))?;
    Ok(crate::procfs::key_values(&text)
        .get("AnonHugePages:")
        .map_or(Bytes::ZERO, |kib| Bytes(kib * 1024)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An anonymous mapping of `len` bytes aligned to a huge page, unmapped on drop.
    struct Mapping {
        base: *mut u8,
        reserved: usize,
        start: u64,
        len: usize,
    }

    impl Mapping {
        fn new(len: usize) -> Mapping {
            let reserved = len + HUGE as usize;
            // SAFETY: a fresh private anonymous mapping aliases nothing.
            let base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    reserved,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(base, libc::MAP_FAILED);
            let start = (base as u64).next_multiple_of(HUGE);
            Mapping {
                base: base.cast(),
                reserved,
                start,
                len,
            }
        }

        fn advise(&self, advice: i32) {
            // SAFETY: the range lies in this mapping.
            let r = unsafe { libc::madvise(self.start as *mut libc::c_void, self.len, advice) };
            assert_eq!(r, 0, "{}", io::Error::last_os_error());
        }

        /// Write every 4 KiB page of the first `len` bytes.
        fn touch(&self, len: usize) {
            for off in (0..len).step_by(4096) {
                // SAFETY: within the mapping, which is writable.
                unsafe { ((self.start as usize + off) as *mut u8).write_volatile(1) };
            }
        }
    }

    impl Drop for Mapping {
        fn drop(&mut self) {
            // SAFETY: the mapping made in `new`, unmapped once.
            unsafe { libc::munmap(self.base.cast(), self.reserved) };
        }
    }

    #[test]
    fn resident_ranges_are_collapsed_and_ranges_with_holes_left_alone() {
        if std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .is_ok_and(|t| t.contains("[never]"))
        {
            return eprintln!("skipped: transparent huge pages are off on this host");
        }
        // 8 MiB in 4 KiB pages (no huge page at fault time), the first 6 MiB written
        // and a hole punched into the third 2 MiB: two ranges resident, one with a hole,
        // one never touched.
        let m = Mapping::new(8 << 20);
        m.advise(libc::MADV_NOHUGEPAGE);
        m.touch(6 << 20);
        // SAFETY: one page inside the mapping.
        let hole = unsafe {
            libc::madvise(
                (m.start + (4 << 20) + 4096) as *mut libc::c_void,
                4096,
                libc::MADV_DONTNEED,
            )
        };
        assert_eq!(hole, 0);
        m.advise(libc::MADV_HUGEPAGE);
        let which = Mappings::GuestRam(Bytes(8 << 20));
        let me = std::process::id() as i32;
        let done = match collapse_resident(Path::new("/proc"), me, which) {
            Err(CollapseError::Refused(e)) => {
                return eprintln!("skipped: the kernel has no MADV_COLLAPSE here ({e})");
            }
            other => other.unwrap(),
        };
        assert_eq!(done.asked, 2, "{done:?}");
        assert_eq!(done.refused, 0, "{done:?}");
        assert!(
            done.huge_after.0 >= done.huge_before.0 + (4 << 20),
            "{done:?}"
        );
        // The hole is still one: collapsing did not fill it.
        let mut vec = [0u8; 1];
        // SAFETY: mincore on one page of the mapping, into a one-byte vector.
        let r = unsafe {
            libc::mincore(
                (m.start + (4 << 20) + 4096) as *mut libc::c_void,
                4096,
                vec.as_mut_ptr(),
            )
        };
        assert_eq!((r, vec[0] & 1), (0, 0), "the hole was filled");
        // Again: the ranges are huge pages now, and nothing more is gained.
        let again = collapse_resident(Path::new("/proc"), me, which).unwrap();
        assert_eq!(again.asked, 2);
        assert!(again.huge_after.0 >= done.huge_after.0 - (1 << 20));
    }

    #[test]
    fn a_process_that_is_gone_is_an_error_naming_it() {
        let e = collapse_resident(Path::new("/proc"), i32::MAX, Mappings::Private).unwrap_err();
        assert!(e.to_string().contains(&i32::MAX.to_string()), "{e}");
    }
}
