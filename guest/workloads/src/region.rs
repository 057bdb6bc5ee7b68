//! A private anonymous mapping whose pages can be dirtied, handed back to
//! the kernel and checked for residency. The mapping is made directly with
//! mmap (not through the allocator) so that shrinking really frees guest
//! memory, immediately.

use std::ffi::{c_int, c_void};
use std::io;
use std::ops::Range;
use std::ptr;

#[cfg(not(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
)))]
compile_error!("region.rs hard-codes the mmap constants of Linux on x86_64/aarch64");

/// Base page size on the supported targets.
pub const PAGE: usize = 4096;

const PROT_READ: c_int = 0x1;
const PROT_WRITE: c_int = 0x2;
const MAP_PRIVATE: c_int = 0x02;
const MAP_ANONYMOUS: c_int = 0x20;
/// No commit accounting (not counted in Committed_AS).
const MAP_NORESERVE: c_int = 0x4000;
const MADV_DONTNEED: c_int = 4;

extern "C" {
    fn mmap(
        addr: *mut c_void,
        len: usize,
        prot: c_int,
        flags: c_int,
        fd: c_int,
        offset: i64,
    ) -> *mut c_void;
    fn munmap(addr: *mut c_void, len: usize) -> c_int;
    fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int;
    fn mincore(addr: *mut c_void, len: usize, vec: *mut u8) -> c_int;
}

/// An anonymous mapping, unmapped on drop.
pub struct Region {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the region owns its mapping and nothing else refers to it, so it
// may move to another thread.
unsafe impl Send for Region {}

impl Region {
    /// Reserves `len` bytes (rounded up to whole pages) without commit
    /// accounting, so that it may deliberately exceed what the guest can
    /// hold (to make it swap); no memory is used until pages are touched.
    pub fn new(len: usize) -> io::Result<Region> {
        Region::map(len, MAP_NORESERVE)
    }

    /// Like [`Region::new`], but counted in the guest's Committed_AS as a
    /// `malloc`'d buffer is.
    pub fn accounted(len: usize) -> io::Result<Region> {
        Region::map(len, 0)
    }

    fn map(len: usize, extra_flags: c_int) -> io::Result<Region> {
        let len = len.next_multiple_of(PAGE);
        if len == 0 {
            return Ok(Region {
                ptr: ptr::null_mut(),
                len,
            });
        }
        let flags = MAP_PRIVATE | MAP_ANONYMOUS | extra_flags;
        // SAFETY: a fresh anonymous mapping aliases nothing.
        let ptr = unsafe { mmap(ptr::null_mut(), len, PROT_READ | PROT_WRITE, flags, -1, 0) };
        if ptr as isize == -1 {
            return Err(io::Error::last_os_error());
        }
        Ok(Region {
            ptr: ptr.cast(),
            len,
        })
    }

    /// Writes `value` into the first word of every page in `bytes`, so each
    /// page must be backed (or swapped back in) and becomes dirty.
    pub fn touch(&mut self, bytes: Range<usize>, value: u64) {
        self.check(&bytes);
        for offset in bytes.step_by(PAGE) {
            // SAFETY: in bounds and page aligned (checked above), so aligned for u64.
            unsafe { self.ptr.add(offset).cast::<u64>().write_volatile(value) };
        }
    }

    /// Returns the pages in `bytes` to the kernel; they read as zero afterwards.
    pub fn release(&mut self, bytes: Range<usize>) -> io::Result<()> {
        self.check(&bytes);
        if bytes.is_empty() {
            return Ok(());
        }
        // SAFETY: the range lies inside our own mapping.
        let rc = unsafe { madvise(self.ptr.add(bytes.start).cast(), bytes.len(), MADV_DONTNEED) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// How many of the region's pages are in memory (not swapped out, nor
    /// never touched).
    pub fn resident_pages(&self) -> io::Result<usize> {
        if self.len == 0 {
            return Ok(0);
        }
        let mut vec = vec![0u8; self.len / PAGE];
        // SAFETY: our own mapping, and `vec` has one byte per page of it.
        let rc = unsafe { mincore(self.ptr.cast(), self.len, vec.as_mut_ptr()) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(vec.iter().filter(|&&page| page & 1 == 1).count())
    }

    fn check(&self, bytes: &Range<usize>) {
        assert!(
            bytes.start % PAGE == 0
                && bytes.end % PAGE == 0
                && bytes.start <= bytes.end
                && bytes.end <= self.len,
            "{bytes:?} is not a page-aligned range of a {}-byte region",
            self.len
        );
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: unmapping our own mapping, which nothing borrows any more.
            unsafe { munmap(self.ptr.cast(), self.len) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(region: &Region, offset: usize) -> u64 {
        region.check(&(offset..offset + PAGE));
        // SAFETY: in bounds and page aligned.
        unsafe { region.ptr.add(offset).cast::<u64>().read_volatile() }
    }

    #[test]
    fn touched_pages_keep_their_value_until_released() {
        let mut region = Region::new(8 * PAGE).unwrap();
        region.touch(0..8 * PAGE, 7);
        assert!((0..8).all(|page| read(&region, page * PAGE) == 7));
        region.release(4 * PAGE..8 * PAGE).unwrap();
        // Released pages come back zero-filled: the kernel really dropped them.
        assert!((0..4).all(|page| read(&region, page * PAGE) == 7));
        assert!((4..8).all(|page| read(&region, page * PAGE) == 0));
    }

    #[test]
    fn sizes_round_up_to_pages_and_may_be_zero() {
        assert_eq!(Region::new(1).unwrap().len, PAGE);
        assert_eq!(Region::accounted(PAGE + 1).unwrap().len, 2 * PAGE);
        let mut empty = Region::new(0).unwrap();
        assert_eq!(empty.len, 0);
        empty.touch(0..0, 1);
        empty.release(0..0).unwrap();
        assert_eq!(empty.resident_pages().unwrap(), 0);
    }

    #[test]
    fn counts_resident_pages() {
        let mut region = Region::accounted(8 * PAGE).unwrap();
        assert_eq!(region.resident_pages().unwrap(), 0);
        region.touch(2 * PAGE..5 * PAGE, 1);
        assert_eq!(region.resident_pages().unwrap(), 3);
        region.release(2 * PAGE..3 * PAGE).unwrap();
        assert_eq!(region.resident_pages().unwrap(), 2);
    }

    #[test]
    #[should_panic(expected = "is not a page-aligned range")]
    fn rejects_ranges_outside_the_region() {
        Region::new(PAGE).unwrap().touch(0..2 * PAGE, 1);
    }
}
