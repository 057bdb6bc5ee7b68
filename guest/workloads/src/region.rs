//! A private anonymous mapping whose pages can be dirtied and checked for
//! residency. The mapping is made directly with mmap (not through the
//! allocator) so that dropping it really frees guest memory, immediately.

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
    fn mprotect(addr: *mut c_void, len: usize, prot: c_int) -> c_int;
    fn mincore(addr: *mut c_void, len: usize, vec: *mut u8) -> c_int;
}

/// An anonymous mapping, unmapped on drop.
pub struct Region {
    ptr: *mut u8,
    len: usize,
    /// Bytes mapped from `ptr - guard`: `len`, and for [`Region::new_apart`] a guard
    /// page each side.
    mapped: usize,
    guard: usize,
}

// SAFETY: the region owns its mapping and nothing else refers to it, so it
// may move to another thread.
unsafe impl Send for Region {}
// SAFETY: through a shared reference the mapping is only read (`read`,
// `resident_pages`); writing takes `&mut self`.
unsafe impl Sync for Region {}

impl Region {
    /// Maps `len` bytes (rounded up to whole pages), counted in the guest's
    /// Committed_AS as any application's `malloc`'d buffer is; no memory is
    /// used until pages are touched.
    pub fn new(len: usize) -> io::Result<Region> {
        let len = len.next_multiple_of(PAGE);
        if len == 0 {
            return Ok(Region {
                ptr: ptr::null_mut(),
                len,
                mapped: 0,
                guard: 0,
            });
        }
        let flags = MAP_PRIVATE | MAP_ANONYMOUS;
        // SAFETY: a fresh anonymous mapping aliases nothing.
        let ptr = unsafe { mmap(ptr::null_mut(), len, PROT_READ | PROT_WRITE, flags, -1, 0) };
        if ptr as isize == -1 {
            return Err(io::Error::last_os_error());
        }
        Ok(Region {
            ptr: ptr.cast(),
            len,
            mapped: len,
            guard: 0,
        })
    }

    /// Like [`Region::new`], between two guard pages that cannot be accessed, so that
    /// the region stays a mapping of its own: the kernel merges adjacent anonymous
    /// mappings of the same permissions (another buffer, a thread's stack), and
    /// `/proc/PID/numa_maps` and `smaps` would show them as one.
    pub fn new_apart(len: usize) -> io::Result<Region> {
        let len = len.next_multiple_of(PAGE);
        let mut region = Region::new(len + 2 * PAGE)?;
        // SAFETY: the first and last pages of our own mapping, which nothing borrows.
        unsafe {
            if mprotect(region.ptr.cast(), PAGE, 0) != 0
                || mprotect(region.ptr.add(PAGE + len).cast(), PAGE, 0) != 0
            {
                return Err(io::Error::last_os_error());
            }
            region.ptr = region.ptr.add(PAGE);
        }
        region.len = len;
        region.guard = PAGE;
        Ok(region)
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

    /// Fills the first `share_pct` percent of every page in `bytes` with
    /// pseudo-random words (xorshift64 from `seed`: incompressible), leaving the
    /// rest of each page as it is, so the pages compress about `100 / share_pct`
    /// to one; at least the first word of each page is written, as by
    /// [`Region::touch`].
    pub fn fill_random(&mut self, bytes: Range<usize>, share_pct: u64, seed: u64) {
        self.check(&bytes);
        let words = (PAGE / 8 * share_pct.min(100) as usize / 100).max(1);
        let mut state = seed | 1;
        for offset in bytes.step_by(PAGE) {
            for word in 0..words {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                // SAFETY: in bounds (checked above, `words` <= PAGE / 8) and page
                // aligned, so aligned for u64.
                unsafe {
                    self.ptr
                        .add(offset + word * 8)
                        .cast::<u64>()
                        .write_volatile(state)
                };
            }
        }
    }

    /// Reads the first word of page `page`, which must be backed (or swapped
    /// back in) for it.
    pub fn read(&self, page: usize) -> u64 {
        assert!(
            page < self.len / PAGE,
            "page {page} of a {}-byte region",
            self.len
        );
        // SAFETY: in bounds (checked above) and page aligned, so aligned for u64.
        unsafe { self.ptr.add(page * PAGE).cast::<u64>().read_volatile() }
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
            bytes.start.is_multiple_of(PAGE)
                && bytes.end.is_multiple_of(PAGE)
                && bytes.start <= bytes.end
                && bytes.end <= self.len,
            "{bytes:?} is not a page-aligned range of a {}-byte region",
            self.len
        );
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if self.mapped > 0 {
            // SAFETY: unmapping our own mapping, which nothing borrows any more.
            unsafe { munmap(self.ptr.sub(self.guard).cast(), self.mapped) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn touched_pages_keep_their_value() {
        let mut region = Region::new(8 * PAGE).unwrap();
        region.touch(0..4 * PAGE, 7);
        assert!((0..4).all(|page| region.read(page) == 7));
        assert!(
            (4..8).all(|page| region.read(page) == 0),
            "untouched pages read zero"
        );
    }

    #[test]
    fn random_fill_covers_its_share_of_each_page() {
        let mut region = Region::new(4 * PAGE).unwrap();
        region.fill_random(PAGE..3 * PAGE, 25, 7);
        let filled = |region: &Region, page: usize| {
            // SAFETY: whole words of the region's own page `page` (< 4).
            let words = unsafe {
                std::slice::from_raw_parts(region.ptr.add(page * PAGE).cast::<u64>(), PAGE / 8)
            };
            words.iter().filter(|&&w| w != 0).count()
        };
        assert_eq!(filled(&region, 0), 0);
        assert_eq!(
            (filled(&region, 1), filled(&region, 2)),
            (PAGE / 32, PAGE / 32)
        );
        assert_eq!(filled(&region, 3), 0);
        assert_ne!(region.read(1), region.read(2));
        region.fill_random(0..PAGE, 0, 7);
        assert_eq!(filled(&region, 0), 1, "at least one word a page");
    }

    #[test]
    fn sizes_round_up_to_pages_and_may_be_zero() {
        assert_eq!(Region::new(1).unwrap().len, PAGE);
        assert_eq!(Region::new(PAGE + 1).unwrap().len, 2 * PAGE);
        let mut empty = Region::new(0).unwrap();
        assert_eq!(empty.len, 0);
        empty.touch(0..0, 1);
        assert_eq!(empty.resident_pages().unwrap(), 0);
    }

    #[test]
    fn reads_what_was_written() {
        let mut region = Region::new(2 * PAGE).unwrap();
        region.touch(PAGE..2 * PAGE, 7);
        assert_eq!((region.read(0), region.read(1)), (0, 7));
    }

    #[test]
    #[should_panic(expected = "page 2 of a 8192-byte region")]
    fn reads_only_its_own_pages() {
        Region::new(2 * PAGE).unwrap().read(2);
    }

    #[test]
    fn counts_resident_pages() {
        let mut region = Region::new(8 * PAGE).unwrap();
        assert_eq!(region.resident_pages().unwrap(), 0);
        region.touch(2 * PAGE..5 * PAGE, 1);
        assert_eq!(region.resident_pages().unwrap(), 3);
    }

    #[test]
    fn a_region_apart_is_a_mapping_of_its_own() {
        let _before = Region::new(4 * PAGE).unwrap();
        let mut hot = Region::new_apart(2 * PAGE).unwrap();
        let _after = Region::new(4 * PAGE).unwrap();
        hot.touch(0..2 * PAGE, 1);
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let line = format!(
            "{:x}-{:x} rw-p",
            hot.ptr as usize,
            hot.ptr as usize + 2 * PAGE
        );
        assert!(
            maps.lines().any(|l| l.starts_with(&line)),
            "{line} in\n{maps}"
        );
        assert_eq!(hot.resident_pages().unwrap(), 2);
    }

    #[test]
    #[should_panic(expected = "is not a page-aligned range")]
    fn rejects_ranges_outside_the_region() {
        Region::new(PAGE).unwrap().touch(0..2 * PAGE, 1);
    }
}
