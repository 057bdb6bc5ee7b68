//! A process held by a pidfd (Linux 5.3): a signal sent through it reaches that process
//! or, once it has ended, none, never another that has taken its pid since.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

/// A process, by its pidfd.
#[derive(Debug)]
pub struct Pidfd(OwnedFd);

impl Pidfd {
    /// The process that `pid` names now.
    pub fn open(pid: i32) -> io::Result<Pidfd> {
        // SAFETY: pidfd_open(2) takes a pid and flags, and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = i32::try_from(fd).map_err(|_| io::Error::other("pidfd_open: no descriptor"))?;
        // SAFETY: `fd` was just opened and nothing else owns it.
        Ok(Pidfd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Process `pid` held, if it is the one that started at `started` (field 22 of its
    /// `/proc/PID/stat` under `proc`): held before the check, so that no process taking
    /// its pid after the check passes for it. `Ok(None)`: another process has its pid; an
    /// error (`ESRCH`) once it has ended.
    pub fn hold_started(proc: &Path, pid: i32, started: u64) -> io::Result<Option<Pidfd>> {
        let process = Pidfd::open(pid)?;
        match crate::procfs::start_time(proc, pid) {
            Some(s) if s == started => Ok(Some(process)),
            Some(_) => Ok(None),
            None => Err(io::Error::from_raw_os_error(libc::ESRCH)),
        }
    }

    /// Give the kernel `advice` (madvise(2)'s, e.g. `MADV_COLLAPSE`) for `len` bytes of
    /// its memory at `addr` (process_madvise(2), Linux 5.10; CAP_SYS_NICE).
    pub fn madvise(&self, addr: u64, len: u64, advice: i32) -> io::Result<()> {
        let iov = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: len as usize,
        };
        // SAFETY: process_madvise(2) reads one iovec that lives across the call; the
        // addresses are the other process's, never dereferenced here.
        let r = unsafe {
            libc::syscall(
                libc::SYS_process_madvise,
                self.0.as_raw_fd(),
                &iov as *const libc::iovec,
                1usize,
                advice,
                0u32,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Send it `signal`; `ESRCH` once it has ended.
    pub fn signal(&self, signal: i32) -> io::Result<()> {
        // SAFETY: pidfd_send_signal(2) with a descriptor this holds, a signal number, no
        // siginfo and no flags.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.0.as_raw_fd(),
                signal,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn a_signal_reaches_the_process_held_and_none_once_it_has_ended() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        let held = Pidfd::open(pid).unwrap();
        held.signal(0).unwrap();
        held.signal(libc::SIGKILL).unwrap();
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
        // Reaped: its pid is free for any new process, which the pidfd does not name.
        let e = held.signal(libc::SIGKILL).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ESRCH), "{e}");
        let e = Pidfd::open(pid).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ESRCH), "{e}");
    }
}
