//! Which NUMA node holds each page of a process, and moving pages between nodes, with
//! `move_pages(2)`.
//!
//! With `nodes` NULL, move_pages only asks: each page's status is the node it is on, or
//! a negative errno (`-EFAULT`: not mapped or the zero page; `-ENOENT`: not present).
//! With a target node and `MPOL_MF_MOVE`, it moves the pages mapped by this process
//! alone, and each status is the node the page is on afterwards or why it was not moved
//! (`-EBUSY`, `-EACCES` for a shared page, `-ENOMEM`, …). The call itself fails with
//! `ESRCH` for no such process, `EPERM` without ptrace read access to it (since Linux
//! 4.13: CAP_SYS_PTRACE for another user's or a non-dumpable process; CAP_SYS_NICE only
//! for `MPOL_MF_MOVE_ALL`, not used here), `ENODEV` for a target node without memory,
//! `EACCES` for a node the process's cpuset does not allow, and `ENOSYS` on a kernel
//! without NUMA (move_pages(2)).

use std::collections::BTreeMap;

/// Move the pages mapped by this process alone (include/uapi/linux/mempolicy.h).
const MPOL_MF_MOVE: libc::c_int = 1 << 1;

/// Pages asked about or moved in one call.
const BATCH: usize = 4096;
/// A status the kernel did not write. Since Linux 4.17 a move that fails for some pages
/// returns how many it did not move and leaves the statuses of the pages it had queued
/// unwritten (found by an audit: read as node 0, failed promotions counted as made).
const UNWRITTEN: i32 = i32::MIN;

/// Why pages could not be asked about or moved.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MoveError {
    /// The kernel has no NUMA support.
    #[error(
        "move_pages: the kernel has no NUMA support (ENOSYS: CONFIG_NUMA and CONFIG_MIGRATION)"
    )]
    NoNuma,
    /// The process is gone.
    #[error("process {0} is gone")]
    Gone(i32),
    /// This process may not move the other's pages.
    #[error("move_pages: not permitted for process {0} (EPERM: needs ptrace read access to it, CAP_SYS_PTRACE for another user's)")]
    NotPermitted(i32),
    /// The target node has no memory, or is not a node.
    #[error("move_pages: node {0} has no memory ({1})")]
    NoNode(i32, &'static str),
    /// The process may not have memory on the target node: its cpuset binds it elsewhere.
    #[error(
        "move_pages: process {pid} may not use node {node} (EACCES: its cpuset.mems binds \
         it elsewhere, as libvirt's numatune mode 'strict' does): leave the VM out of \
         placement ([[vm]] place = false) or allow the node"
    )]
    NotAllowed {
        /// The process.
        pid: i32,
        /// The node.
        node: i32,
    },
    /// Any other failure of the call.
    #[error("move_pages for process {pid}: {}", std::io::Error::from_raw_os_error(*errno))]
    Other {
        /// The process.
        pid: i32,
        /// The errno.
        errno: i32,
    },
}

/// The error for a move_pages call on `pid` (to `node`, when moving) that failed with
/// `errno`.
pub fn error(errno: i32, pid: i32, node: Option<i32>) -> MoveError {
    match (errno, node) {
        (libc::ENOSYS, _) => MoveError::NoNuma,
        (libc::ESRCH, _) => MoveError::Gone(pid),
        (libc::EPERM, _) => MoveError::NotPermitted(pid),
        (libc::ENODEV, Some(n)) => MoveError::NoNode(n, "ENODEV"),
        (libc::EINVAL, Some(n)) => MoveError::NoNode(n, "EINVAL: not a node"),
        // Found by an audit: said as "Permission denied" alone.
        (libc::EACCES, Some(node)) => MoveError::NotAllowed { pid, node },
        _ => MoveError::Other { pid, errno },
    }
}

/// One move_pages call over `pages` (addresses), to `node` or, without one, a status
/// query; the statuses are written to `status`.
fn call(pid: i32, pages: &[u64], node: Option<i32>, status: &mut [i32]) -> Result<(), MoveError> {
    let addrs: Vec<*mut libc::c_void> = pages.iter().map(|&a| a as *mut libc::c_void).collect();
    let nodes = node.map(|n| vec![n; pages.len()]);
    let flags = if node.is_some() { MPOL_MF_MOVE } else { 0 };
    // SAFETY: `addrs`, `nodes` (when given) and `status` hold `pages.len()` entries each;
    // the kernel only reads the first two and writes the last.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_pages,
            libc::c_long::from(pid),
            pages.len() as libc::c_ulong,
            addrs.as_ptr(),
            nodes.as_ref().map_or(std::ptr::null(), |n| n.as_ptr()),
            status.as_mut_ptr(),
            libc::c_long::from(flags),
        )
    };
    if rc < 0 {
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        return Err(error(errno, pid, node));
    }
    Ok(())
}

fn batched(pid: i32, pages: &[u64], node: Option<i32>) -> Result<Vec<i32>, MoveError> {
    let mut status = vec![UNWRITTEN; pages.len()];
    if pages.is_empty() {
        // Still asks: the process, the permission and NUMA support are checked.
        return call(pid, pages, None, &mut status).map(|()| status);
    }
    for (p, s) in pages.chunks(BATCH).zip(status.chunks_mut(BATCH)) {
        call(pid, p, node, s)?;
        if node.is_some() {
            settle(p, s, |p, s| call(pid, p, None, s))?;
        }
    }
    Ok(status)
}

/// After a move of `pages`: those whose status the kernel left unwritten, or gave as
/// `-EBUSY` (a transparent huge page moves whole, and its other base pages read busy:
/// found by an audit), are asked where they are now (`ask`: a status query). One still
/// unknown was not moved (`-EBUSY`).
fn settle(
    pages: &[u64],
    status: &mut [i32],
    ask: impl FnOnce(&[u64], &mut [i32]) -> Result<(), MoveError>,
) -> Result<(), MoveError> {
    let unsure: Vec<usize> = (0..status.len())
        .filter(|&i| status[i] == UNWRITTEN || status[i] == -libc::EBUSY)
        .collect();
    if unsure.is_empty() {
        return Ok(());
    }
    let at: Vec<u64> = unsure.iter().map(|&i| pages[i]).collect();
    let mut now = vec![UNWRITTEN; at.len()];
    ask(&at, &mut now)?;
    for (&i, s) in unsure.iter().zip(now) {
        status[i] = if s == UNWRITTEN { -libc::EBUSY } else { s };
    }
    Ok(())
}

/// The node each of process `pid`'s pages (addresses) is on, or a negative errno
/// (`-EFAULT`, `-ENOENT`). With no pages, checks that the process can be asked.
pub fn nodes(pid: i32, pages: &[u64]) -> Result<Vec<i32>, MoveError> {
    batched(pid, pages, None)
}

/// Move process `pid`'s pages (addresses) to `node`: the node each is on afterwards,
/// or a negative errno for one that was not moved.
pub fn move_to(pid: i32, pages: &[u64], node: i32) -> Result<Vec<i32>, MoveError> {
    if pages.is_empty() {
        return Ok(Vec::new());
    }
    batched(pid, pages, Some(node))
}

/// Statuses counted: pages per node (keys ≥ 0) and per negative errno.
pub fn tally(status: &[i32]) -> BTreeMap<i32, u64> {
    let mut counts = BTreeMap::new();
    for &s in status {
        *counts.entry(s).or_insert(0) += 1;
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_a_move_left_unwritten_or_busy_are_asked_again() {
        // Moved to node 1: one page moved, one of a huge page read busy (moved with it),
        // two the kernel stopped at (one moved before it stopped, one not), one busy that
        // stays busy, one the query cannot place either.
        let pages = [0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000];
        let mut status = [
            1,
            -libc::EBUSY,
            UNWRITTEN,
            UNWRITTEN,
            -libc::EBUSY,
            UNWRITTEN,
        ];
        let mut asked = Vec::new();
        settle(&pages, &mut status, |p, s| {
            asked = p.to_vec();
            s.copy_from_slice(&[1, 1, 0, 0, UNWRITTEN]);
            Ok(())
        })
        .unwrap();
        assert_eq!(asked, [0x2000, 0x3000, 0x4000, 0x5000, 0x6000]);
        assert_eq!(status, [1, 1, 1, 0, 0, -libc::EBUSY]);
        // Nothing unsure: nothing asked.
        let mut sure = [1, -libc::EACCES];
        settle(&pages[..2], &mut sure, |_, _| panic!("asked")).unwrap();
        assert_eq!(sure, [1, -libc::EACCES]);
    }

    #[test]
    fn errors_name_what_is_missing() {
        assert_eq!(error(libc::ENOSYS, 7, None), MoveError::NoNuma);
        assert_eq!(error(libc::ESRCH, 7, Some(1)), MoveError::Gone(7));
        assert_eq!(error(libc::EPERM, 7, None), MoveError::NotPermitted(7));
        assert_eq!(
            error(libc::ENODEV, 7, Some(3)),
            MoveError::NoNode(3, "ENODEV")
        );
        let bound = error(libc::EACCES, 7, Some(1)).to_string();
        assert!(
            bound.starts_with("move_pages: process 7 may not use node 1 (EACCES: its cpuset.mems"),
            "{bound}"
        );
        assert_eq!(
            error(libc::EINVAL, 7, None),
            MoveError::Other {
                pid: 7,
                errno: libc::EINVAL
            }
        );
        assert_eq!(
            error(libc::EPERM, 7, None).to_string(),
            "move_pages: not permitted for process 7 (EPERM: needs ptrace read access to it, CAP_SYS_PTRACE for another user's)"
        );
        assert_eq!(error(libc::ESRCH, 7, None).to_string(), "process 7 is gone");
    }

    #[test]
    fn statuses_are_tallied_by_node_and_errno() {
        let t = tally(&[0, 1, 0, -libc::EFAULT, -libc::ENOENT, 1, 0]);
        assert_eq!(
            t.into_iter().collect::<Vec<_>>(),
            [(-libc::EFAULT, 1), (-libc::ENOENT, 1), (0, 3), (1, 2)]
        );
    }

    /// The kernel's answers for this process's own pages: a touched page is on a node
    /// with memory, an untouched one is not present, an unmapped address is a fault.
    #[test]
    fn the_kernel_reports_each_page_node_or_why_not() {
        let page = 4096;
        let mut buf = vec![0u8; 64 * page];
        let base = (buf.as_mut_ptr() as u64).next_multiple_of(page as u64);
        // SAFETY: an address inside `buf`, written through a volatile store.
        unsafe { std::ptr::write_volatile(base as *mut u8, 1) };
        // SAFETY: a fresh anonymous mapping, never touched, unmapped below.
        let untouched = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(untouched, libc::MAP_FAILED);
        let pid = std::process::id() as i32;
        let status = nodes(pid, &[base, untouched as u64, 0x1000]).unwrap();
        // SAFETY: our own mapping, no longer used.
        unsafe { libc::munmap(untouched, page) };
        let has_memory = std::fs::read_to_string("/sys/devices/system/node/has_memory").unwrap();
        let node_list = crate::tiers::parse_list(&has_memory).unwrap();
        assert!(
            node_list.contains(&(status[0] as u32)),
            "{status:?} {has_memory}"
        );
        assert_eq!(&status[1..], [-libc::ENOENT, -libc::EFAULT]);
        // Moving a page to the node it is on leaves it there.
        assert_eq!(move_to(pid, &[base], status[0]).unwrap(), [status[0]]);
        assert_eq!(nodes(pid, &[]).unwrap(), Vec::<i32>::new());
        // Not a node: EINVAL or ENODEV, as the kernel checks.
        assert!(matches!(
            move_to(pid, &[base], -1),
            Err(MoveError::NoNode(-1, _))
        ));
    }

    #[test]
    fn a_process_that_is_gone_is_named() {
        // Pid numbers wrap below /proc/sys/kernel/pid_max (at most 2^22).
        let gone = 1 << 23;
        assert_eq!(nodes(gone, &[0x1000]), Err(MoveError::Gone(gone)));
        assert_eq!(nodes(gone, &[]), Err(MoveError::Gone(gone)));
        assert_eq!(move_to(gone, &[0x1000], 0), Err(MoveError::Gone(gone)));
    }
}
