//! Memory for tests that read a process's own mappings: a buffer whose pages are resident.

/// An anonymous mapping of `pages` pages written once each, without huge pages.
pub struct Buffer {
    /// Its first byte.
    pub at: *mut u8,
    len: usize,
}

impl Buffer {
    /// `pages` pages of 4 KiB, each written once.
    pub fn new(pages: usize) -> Buffer {
        let len = pages * 4096;
        // Unmapped on drop.
        let at = crate::hugepages::anonymous_mapping(len).unwrap();
        // SAFETY: the mapping just made; writing each page makes it resident.
        unsafe {
            assert_eq!(libc::madvise(at, len, libc::MADV_NOHUGEPAGE), 0);
            for p in 0..pages {
                at.cast::<u8>().add(p * 4096).write_volatile(1);
            }
        }
        Buffer { at: at.cast(), len }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`.
        unsafe { libc::munmap(self.at.cast(), self.len) };
    }
}
