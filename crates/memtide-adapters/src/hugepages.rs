//! A hypervisor's guest RAM put back in huge pages after its balloon gave memory back.
//!
//! QEMU backs guest RAM with transparent huge pages. Each page the balloon takes is
//! discarded from the host in 4 KiB (MADV_DONTNEED), which splits the huge page around
//! it; when the balloon gives the memory back, the guest's new writes fault it in as
//! 4 KiB pages, and the kernel's khugepaged gathers them into huge pages again only
//! slowly (4 096 pages every 10 s by default). Guests sharing a few cores under TCG then
//! pay host TLB misses the huge pages spared them (docs/benchmarks.md, "overcommit: huge
//! pages", which measures what it gains).
//!
//! This asks the kernel to collapse each huge-page range of the guest RAM whose pages are
//! all resident and the process's alone (`MADV_COLLAPSE` through process_madvise(2),
//! Linux 6.1).

use crate::access::Mappings;
use crate::pidfd::Pidfd;
use memtide_core::hugepages::Bound;
use memtide_core::Bytes;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// madvise(2)'s `MADV_COLLAPSE` (include/uapi/asm-generic/mman-common.h; not in the libc
/// crate).
const MADV_COLLAPSE: i32 = 25;
/// A page map entry's bits (Documentation/admin-guide/mm/pagemap.rst): the page is
/// present, mapped by this process alone (not KSM's, not the shared zero page), and
/// write-protected by userfaultfd.
const PM_PRESENT: u64 = 1 << 63;
const PM_MMAP_EXCLUSIVE: u64 = 1 << 56;
const PM_UFFD_WP: u64 = 1 << 57;
/// Huge pages' worth of page map read at once.
const CHUNK: u64 = 64;

/// What one pass over a process's guest RAM did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Collapsed {
    /// Ranges of a huge page whose pages were all resident and the process's alone, which
    /// the kernel was asked to hold in one huge page (those already one it leaves as they
    /// are).
    pub asked: u64,
    /// Those the kernel could not collapse now (a page changed since it was read, locked,
    /// or under writeback; no free huge page; the memory cgroup at its limit — the pass
    /// stops at the first of these two, which would only reclaim the guest's memory).
    pub refused: u64,
    /// The process's memory in huge pages before the pass (`AnonHugePages`).
    pub huge_before: Bytes,
    /// And after: the difference counts khugepaged's work and splits meanwhile too.
    pub huge_after: Bytes,
    /// Where the next pass goes on, when this one stopped short of the end (at its
    /// bound, or for want of huge pages).
    pub next: Option<u64>,
}

/// Why a pass could not run, for one process or at all.
#[derive(Debug, thiserror::Error)]
pub enum CollapseError {
    /// Reading the process's files or holding it failed (it ended, or is not ours to see).
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: io::Error,
    },
    /// This host cannot: no `MADV_COLLAPSE` (before Linux 6.1, or no transparent huge
    /// pages), or advice to another process is not allowed (no CAP_SYS_NICE).
    #[error("{0}")]
    Unsupported(String),
    /// The process at the pid is not the VM's hypervisor: that one ended, and another
    /// took its pid.
    #[error(
        "process {0} is not the VM's hypervisor: it started at another time (its pid was \
         reused); its memory is left alone"
    )]
    Replaced(i32),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> CollapseError {
    let what = what.into();
    move |source| CollapseError::Io { what, source }
}

/// The host's sizes: its base page, and its huge page (`hpage_pmd_size`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    /// Base page, bytes.
    pub page: u64,
    /// Huge page, bytes: the range collapsed into one.
    pub huge: u64,
}

/// Whether this host collapses memory into huge pages: transparent huge pages with a
/// PMD size (sysfs at `sys`) and `MADV_COLLAPSE` (tried on a mapping of memtide's own).
/// Advice to another process also needs CAP_SYS_NICE, which only a pass can tell.
pub fn supported(sys: &Path) -> Result<Sizes, CollapseError> {
    let thp = sys.join("kernel/mm/transparent_hugepage");
    let huge = std::fs::read_to_string(thp.join("hpage_pmd_size"))
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
        .ok_or_else(|| {
            CollapseError::Unsupported(format!(
                "{}/hpage_pmd_size is not readable: the kernel has no transparent huge pages",
                thp.display()
            ))
        })?;
    let page = crate::procfs::page_size();
    let len = (2 * huge) as usize;
    let base = anonymous_mapping(len)
        .map_err(|e| CollapseError::Unsupported(format!("no memory to try MADV_COLLAPSE: {e}")))?;
    let start = (base as u64).next_multiple_of(huge) as usize;
    // SAFETY: one huge page inside the mapping: written a page at a time, then advised.
    let r = unsafe {
        for off in (0..huge as usize).step_by(page as usize) {
            ((start + off) as *mut u8).write_volatile(1);
        }
        libc::madvise(start as *mut libc::c_void, huge as usize, MADV_COLLAPSE)
    };
    let e = io::Error::last_os_error();
    // SAFETY: the mapping made above, unmapped once.
    unsafe { libc::munmap(base, len) };
    match r {
        0 => Ok(Sizes { page, huge }),
        // Not now (no free huge page, the cgroup at its limit): the advice itself exists.
        _ if matches!(
            e.raw_os_error(),
            Some(libc::EAGAIN | libc::ENOMEM | libc::EBUSY)
        ) =>
        {
            Ok(Sizes { page, huge })
        }
        _ => Err(CollapseError::Unsupported(format!(
            "the kernel refuses MADV_COLLAPSE ({e}): it needs Linux 6.1 with transparent huge pages"
        ))),
    }
}

/// A fresh private anonymous mapping of `len` bytes, for its maker to unmap.
pub(crate) fn anonymous_mapping(len: usize) -> io::Result<*mut libc::c_void> {
    // SAFETY: a fresh private anonymous mapping aliases nothing.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(base)
}

/// The anonymous private writable mappings (`rw-p`, no path) in `/proc/PID/maps` text
/// that `which` wants: a file's private copy cannot be collapsed.
pub(crate) fn anonymous(maps: &str, which: &Mappings) -> Vec<std::ops::Range<u64>> {
    crate::procfs::maps(maps)
        .filter(|m| m.perms == "rw-p" && m.path.is_none() && which.wants(&m.range))
        .map(|m| m.range)
        .collect()
}

/// Collapse into huge pages the ranges of process `pid`'s `which` mappings (procfs at
/// `proc`) whose pages are all resident and its alone, within `bound`; in a `dry_run`,
/// only count them. A range with a page missing, swapped out, shared (KSM's merged pages,
/// the zero page) or write-protected by userfaultfd is left alone: collapsing it would
/// fill holes with zeroes or copy shared pages, taking memory the host has back. The
/// process is the one `pid` names now only if it `started` then (`/proc/PID/stat`).
pub fn collapse_resident(
    proc: &Path,
    pid: i32,
    started: u64,
    which: &Mappings,
    sizes: Sizes,
    bound: Bound,
    dry_run: bool,
) -> Result<Collapsed, CollapseError> {
    let dir = proc.join(pid.to_string());
    // Held first: the process checked is the one advised, never one taking its pid later.
    let process = match Pidfd::hold_started(proc, pid, started) {
        Ok(Some(process)) => process,
        Ok(None) => return Err(CollapseError::Replaced(pid)),
        Err(e) => return Err(io_err(format!("holding process {pid}"))(e)),
    };
    let maps = std::fs::read_to_string(dir.join("maps"))
        .map_err(io_err(format!("reading {}/maps", dir.display())))?;
    let pagemap = File::open(dir.join("pagemap"))
        .map_err(io_err(format!("opening {}/pagemap", dir.display())))?;
    let mut done = Collapsed {
        huge_before: anon_huge(&dir)?,
        ..Collapsed::default()
    };
    let per_huge = (sizes.huge / sizes.page) as usize;
    let mut entries = vec![0u8; per_huge * CHUNK as usize * 8];
    'ranges: for range in anonymous(&maps, which) {
        let first = range.start.max(bound.from).next_multiple_of(sizes.huge);
        let count = range.end.saturating_sub(first) / sizes.huge;
        let mut read = 0;
        while read < count {
            let n = CHUNK.min(count - read);
            let at = first + read * sizes.huge;
            let buf = &mut entries[..per_huge * n as usize * 8];
            pagemap
                .read_exact_at(buf, at / sizes.page * 8)
                .map_err(io_err(format!("reading {}/pagemap", dir.display())))?;
            for (k, huge) in buf.chunks_exact(per_huge * 8).enumerate() {
                let own = huge.chunks_exact(8).all(|e| {
                    let e = u64::from_le_bytes(e.try_into().unwrap());
                    e & (PM_PRESENT | PM_MMAP_EXCLUSIVE | PM_UFFD_WP)
                        == PM_PRESENT | PM_MMAP_EXCLUSIVE
                });
                if !own {
                    continue;
                }
                let start = at + k as u64 * sizes.huge;
                if done.asked == bound.ranges {
                    done.next = Some(start);
                    break 'ranges;
                }
                done.asked += 1;
                if dry_run {
                    continue;
                }
                match process.madvise(start, sizes.huge, MADV_COLLAPSE) {
                    Ok(()) => {}
                    Err(e) => match e.raw_os_error() {
                        // This range, now: changed since it was read, locked, or the like.
                        Some(libc::EINVAL | libc::EAGAIN) => done.refused += 1,
                        // No huge page to be had, or the cgroup at its limit: trying the
                        // rest would only reclaim the guest's memory.
                        Some(libc::ENOMEM | libc::EBUSY) => {
                            done.refused += 1;
                            done.next = Some(start);
                            break 'ranges;
                        }
                        Some(libc::EPERM) => {
                            return Err(CollapseError::Unsupported(format!(
                                "advice to another process refused ({e}): memtide needs \
                                 CAP_SYS_NICE"
                            )))
                        }
                        _ => return Err(io_err(format!("advising process {pid}"))(e)),
                    },
                }
            }
            read += n;
        }
    }
    done.huge_after = anon_huge(&dir)?;
    Ok(done)
}

/// The anonymous memory in huge pages (`AnonHugePages` of smaps_rollup) of the process
/// whose /proc directory is `dir`.
pub fn anon_huge(dir: &Path) -> Result<Bytes, CollapseError> {
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

    /// The huge page of x86_64 and of arm64 with 4 KiB pages.
    const HUGE: u64 = 2 << 20;

    /// This host's sizes, or `None` (the test is skipped, saying so) only where the
    /// kernel lacks `MADV_COLLAPSE`: madvise(2) refuses the advice with EINVAL before
    /// Linux 6.1 or without transparent huge pages (ENOSYS is taken the same way). Any
    /// other failure fails the test, as do huge pages of another size than the test's
    /// mappings are laid out for.
    fn sizes() -> Option<Sizes> {
        let m = Mapping::new(HUGE as usize);
        m.touch(HUGE as usize);
        // SAFETY: the huge page at the start of the mapping, written above.
        let r = unsafe { libc::madvise(m.start as *mut libc::c_void, m.len, MADV_COLLAPSE) };
        let e = io::Error::last_os_error();
        drop(m);
        if r != 0 && matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) {
            eprintln!(
                "skipped: the kernel lacks MADV_COLLAPSE ({e}): it needs Linux 6.1 with \
                 transparent huge pages"
            );
            return None;
        }
        let s = supported(Path::new("/sys")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            s.huge, HUGE,
            "the test's mappings are laid out for huge pages of {HUGE} bytes"
        );
        Some(s)
    }

    /// The whole guest RAM, as one pass may ask for no more.
    const ALL: Bound = Bound {
        from: 0,
        ranges: u64::MAX,
    };

    /// A pass over this process's `which` mappings.
    fn collapse_mine(
        which: &Mappings,
        sizes: Sizes,
        bound: Bound,
        dry_run: bool,
    ) -> Result<Collapsed, CollapseError> {
        let (proc, me) = (Path::new("/proc"), std::process::id() as i32);
        let started = crate::procfs::start_time(proc, me).unwrap();
        collapse_resident(proc, me, started, which, sizes, bound, dry_run)
    }

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
            let base = anonymous_mapping(reserved).unwrap();
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

    /// A mapping of `len` bytes whose first `written` bytes are written in 4 KiB pages,
    /// and whether huge pages come unasked (`always`: the mapping is then advised against
    /// them); elsewhere it is never advised, so khugepaged leaves it alone.
    fn small_pages(len: usize, written: usize) -> (Mapping, bool) {
        let always = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .is_ok_and(|t| t.contains("[always]"));
        let m = Mapping::new(len);
        if always {
            m.advise(libc::MADV_NOHUGEPAGE);
        }
        m.touch(written);
        (m, always)
    }

    impl Drop for Mapping {
        fn drop(&mut self) {
            // SAFETY: the mapping made in `new`, unmapped once.
            unsafe { libc::munmap(self.base.cast(), self.reserved) };
        }
    }

    #[test]
    #[ignore = "advises its own process through process_madvise(2): needs root"]
    fn resident_ranges_are_collapsed_and_ranges_with_holes_left_alone() {
        let Some(sizes) = sizes() else { return };
        // 8 MiB in 4 KiB pages (no huge page at fault time), the first 6 MiB written
        // and a hole punched into the third 2 MiB: two ranges resident, one with a hole,
        // one never touched. Where huge pages come only when asked for (`madvise`, the
        // default of Debian and most distributions), the mapping is never advised, so
        // that khugepaged does not collapse the range with the hole meanwhile (it fills
        // up to 511 holes); under `always` it has to be advised against them while it is
        // written, then for them again, and khugepaged may come first.
        let (m, always) = small_pages(8 << 20, 6 << 20);
        // SAFETY: one page inside the mapping.
        let hole = unsafe {
            libc::madvise(
                (m.start + (4 << 20) + 4096) as *mut libc::c_void,
                4096,
                libc::MADV_DONTNEED,
            )
        };
        assert_eq!(hole, 0);
        if always {
            m.advise(libc::MADV_HUGEPAGE);
        }
        let which = Mappings::GuestRam(vec![Bytes(8 << 20)]);
        let done = collapse_mine(&which, sizes, ALL, false).unwrap();
        if always {
            assert!((2..=3).contains(&done.asked), "{done:?}");
        } else {
            assert_eq!(done.asked, 2, "{done:?}");
        }
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
        // (Under `always`, khugepaged may have filled it first: then it asked for three.)
        if done.asked == 2 {
            assert_eq!((r, vec[0] & 1), (0, 0), "the hole was filled");
        }
        // Again: the ranges are huge pages now, and nothing more is gained.
        let again = collapse_mine(&which, sizes, ALL, false).unwrap();
        assert_eq!(again.asked, done.asked);
        assert!(again.huge_after.0 >= done.huge_after.0 - (1 << 20));
    }

    #[test]
    fn a_process_that_is_gone_is_an_error_naming_it() {
        let sizes = Sizes {
            page: 4096,
            huge: HUGE,
        };
        let proc = Path::new("/proc");
        let e = collapse_resident(proc, i32::MAX, 1, &Mappings::Private, sizes, ALL, false)
            .unwrap_err();
        assert!(matches!(e, CollapseError::Io { .. }), "{e}");
        assert!(e.to_string().contains(&i32::MAX.to_string()), "{e}");
    }

    #[test]
    fn a_process_that_took_the_pid_is_left_alone() {
        let sizes = Sizes {
            page: 4096,
            huge: HUGE,
        };
        let (proc, me) = (Path::new("/proc"), std::process::id() as i32);
        let started = crate::procfs::start_time(proc, me).unwrap();
        let e = collapse_resident(proc, me, started + 1, &Mappings::Private, sizes, ALL, false)
            .unwrap_err();
        assert!(
            matches!(e, CollapseError::Replaced(pid) if pid == me),
            "{e}"
        );
        assert!(e.to_string().contains("pid was reused"), "{e}");
    }

    /// A dry run counts what a pass would ask for, within its bound, and collapses
    /// nothing; each pass goes on where the last stopped.
    #[test]
    fn a_dry_run_counts_the_resident_ranges_a_bounded_pass_would_ask_for() {
        // SAFETY: sysconf has no preconditions.
        if unsafe { libc::sysconf(libc::_SC_PAGESIZE) } != 4096 {
            return eprintln!("skipped: pages are not of 4 KiB here");
        }
        let sizes = Sizes {
            page: 4096,
            huge: HUGE,
        };
        // 8 MiB in 4 KiB pages, its first 6 MiB written: three ranges (kept from
        // khugepaged as in the test above).
        let (m, _) = small_pages(8 << 20, 6 << 20);
        let which = Mappings::GuestRam(vec![Bytes(8 << 20)]);
        let all = collapse_mine(&which, sizes, ALL, true).unwrap();
        assert_eq!((all.asked, all.refused, all.next), (3, 0, None), "{all:?}");
        let two = Bound { from: 0, ranges: 2 };
        let first = collapse_mine(&which, sizes, two, true).unwrap();
        assert_eq!((first.asked, first.next), (2, Some(m.start + (4 << 20))));
        let from = first.next.unwrap();
        let rest = collapse_mine(&which, sizes, Bound { from, ranges: 2 }, true).unwrap();
        assert_eq!((rest.asked, rest.next), (1, None), "{rest:?}");
        for d in [all, first, rest] {
            assert!(d.huge_after.0 < d.huge_before.0 + HUGE, "collapsed: {d:?}");
        }
    }

    #[test]
    fn only_anonymous_private_writable_mappings_of_the_size_are_taken() {
        let maps = "7f0000000000-7f0018000000 rw-p 00000000 00:00 0 \n\
                    7f1000000000-7f1018000000 rw-p 00000000 08:01 1234 /srv/ram.img\n\
                    7f2000000000-7f2018200000 rw-p 00000000 00:00 0\n\
                    7f3000000000-7f3018000000 r--p 00000000 00:00 0\n\
                    7f4000000000-7f4001000000 rw-p 00000000 00:00 0\n";
        let ram = Mappings::GuestRam(vec![Bytes::from_mib(384)]);
        assert_eq!(
            anonymous(maps, &ram),
            [
                0x7f00_0000_0000..0x7f00_1800_0000,
                0x7f20_0000_0000..0x7f20_1820_0000
            ]
        );
        // Base memory of 16 MiB and a 384 MiB virtio-mem backend: both mappings.
        let with_device = Mappings::GuestRam(vec![Bytes::from_mib(16), Bytes::from_mib(384)]);
        assert_eq!(
            anonymous(maps, &with_device),
            [
                0x7f00_0000_0000..0x7f00_1800_0000,
                0x7f20_0000_0000..0x7f20_1820_0000,
                0x7f40_0000_0000..0x7f40_0100_0000
            ]
        );
    }
}
