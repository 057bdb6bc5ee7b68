//! Memory snapshots of libvirt domains: `virDomainSaveFlags` writes the domain's state
//! (libvirt's header and domain XML, then QEMU's migration stream) to a file of the
//! store and stops the domain; `virDomainRestoreFlags` starts it again from that file.
//!
//! Not managed save: its file lives where libvirt keeps it (`.../qemu/save/NAME.save`),
//! outside memtide's store, so it could be neither checksummed, nor written under a
//! temporary name and renamed when whole, nor kept beside a VM's other snapshots; and
//! libvirt starts a domain from it by itself on the next `virDomainCreate`, whatever
//! became of the disks. A save stops the domain in both: a snapshot whose guest runs on
//! is a save and an immediate restore (the guest is stopped for both).
//!
//! libvirtd opens the file by path, as its own user: a session daemon of another user
//! (a `qemu+unix:///session?socket=PATH` URI, the daemon being the socket's owner) is
//! lent the snapshot's file for the call (see [`Lent`]).

use super::session::blocking;
use super::vm::LibvirtVm;
use super::Libvirt;
use memtide_core::backend::{AfterSave, Saved, Seal};
use memtide_core::BackendError;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use virt::connect::Connect;
use virt::domain::Domain;
use virt::error::Error;
use virt_sys as sys;

pub use super::MEMORY_FILE;

/// How many times a save whose abort was asked for is looked at for its job's end.
const ABORT_POLLS: u32 = 100;

/// The socket a libvirt URI names with `socket=` (a daemon other than the default one).
pub fn socket_param(uri: &str) -> Option<&str> {
    let (_, query) = uri.split_once('?')?;
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix("socket="))
        .filter(|s| !s.is_empty())
}

/// The user (uid, gid) libvirtd opens files as, where it is not memtide's own: the owner
/// of the socket the URI names. A system daemon runs as root; a session daemon reached
/// without `socket=` is the connecting user's. A daemon reached through another
/// process's root (`/proc/PID/root/...`: a KubeVirt launcher's) sees a file system of
/// its own, not memtide's store: refused before anything is lent.
fn daemon_user(uri: &str) -> Result<Option<(u32, u32)>, BackendError> {
    let Some(socket) = socket_param(uri) else {
        return Ok(None);
    };
    if socket.starts_with("/proc/") {
        return Err(BackendError::Protocol(format!(
            "libvirt daemon {socket} runs in a file system of its own (a KubeVirt launcher's): \
             memtide's snapshot store is not there"
        )));
    }
    let meta = std::fs::metadata(socket)
        .map_err(|e| BackendError::Io(format!("libvirt socket {socket}: {e}")))?;
    Ok((meta.uid() != euid()).then_some((meta.uid(), meta.gid())))
}

fn euid() -> u32 {
    // SAFETY: geteuid(2) cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

fn egid() -> u32 {
    // SAFETY: getegid(2) cannot fail and touches no memory.
    unsafe { libc::getegid() }
}

/// A snapshot's memory file lent to libvirtd's user for a save or a restore. memtide
/// opens it itself (a save creates it), never through a link, and gives it to that user
/// through the descriptor it holds; the file is given back, mode 0600, when this is
/// dropped. The directories stay memtide's: the snapshot's is opened to others for
/// traversal only (0711) while the file is lent, so libvirtd can open the file by its
/// path but can neither list the directory nor put anything in it (a directory lent
/// whole let its borrower plant links that memtide, as root, would have followed). The
/// VM's and the store's directories are made traversable by others for good (`o+x`: no
/// listing; each snapshot's directory is closed again after its call).
struct Lent {
    file: std::fs::File,
    dir: PathBuf,
}

impl Lent {
    /// Lend the file `path` to `user` (created empty if `create`); nothing to lend when
    /// libvirtd runs as memtide's user or root.
    fn new(
        path: &Path,
        create: bool,
        user: Option<(u32, u32)>,
    ) -> Result<Option<Lent>, BackendError> {
        let Some((uid, gid)) = user else {
            return Ok(None);
        };
        let dir = path.parent().expect("a snapshot file is in a directory");
        // The directory must be memtide's own (a crash during the directory lends of
        // earlier releases could have left one to libvirtd's user).
        let owner = std::fs::symlink_metadata(dir).map_err(io(dir))?.uid();
        if owner != euid() {
            return Err(BackendError::Io(format!(
                "{}: owned by uid {owner}, not memtide's: not lent",
                dir.display()
            )));
        }
        let file = open_own(path, create)?;
        for up in dir.ancestors().skip(1).take(2) {
            let mode = std::fs::metadata(up).map_err(io(up))?.permissions().mode();
            if mode & 0o001 == 0 {
                let traversable = std::fs::Permissions::from_mode(mode | 0o001);
                std::fs::set_permissions(up, traversable).map_err(io(up))?;
            }
        }
        // The guard first: whatever fails below is undone when it drops.
        let lent = Lent {
            file,
            dir: dir.to_path_buf(),
        };
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).map_err(io(dir))?;
        std::os::unix::fs::fchown(&lent.file, Some(uid), Some(gid)).map_err(|e| {
            BackendError::Io(format!(
                "{}: {e}: libvirtd runs as uid {uid}, and only root may lend it the snapshot's file",
                path.display()
            ))
        })?;
        Ok(Some(lent))
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Err(e) = std::os::unix::fs::fchown(&self.file, Some(euid()), Some(egid())) {
            tracing::warn!(
                "{}: {e}: the snapshot's file stays libvirtd's user's",
                self.dir.display()
            );
        }
        let owner_only = std::fs::Permissions::from_mode(0o600);
        if let Err(e) = self.file.set_permissions(owner_only) {
            tracing::warn!(
                "{}: {e}: the snapshot's file keeps its mode",
                self.dir.display()
            );
        }
        let closed = std::fs::Permissions::from_mode(0o700);
        if let Err(e) = std::fs::set_permissions(&self.dir, closed) {
            tracing::warn!(
                "{}: {e}: the snapshot's directory stays traversable",
                self.dir.display()
            );
        }
    }
}

/// The regular file `path`, opened without following a link (created, mode 0600, if
/// `create`); refused if it is anything else.
fn open_own(path: &Path, create: bool) -> Result<std::fs::File, BackendError> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(create)
        .create_new(create)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(io(path))?;
    let meta = file.metadata().map_err(io(path))?;
    if !meta.is_file() {
        return Err(BackendError::Io(format!(
            "{}: not a regular file",
            path.display()
        )));
    }
    Ok(file)
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> BackendError + '_ {
    move |e| BackendError::Io(format!("{}: {e}", path.display()))
}

fn c_path(path: &Path) -> Result<CString, BackendError> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| BackendError::Io(format!("{} holds a NUL byte", path.display())))
}

/// `virDomainSaveFlags`: the domain's state into `path`, the domain stopped.
fn save_to(domain: &Domain, path: &CString) -> Result<(), Error> {
    // SAFETY: a live domain and a NUL-terminated path; no XML override (null).
    let ret =
        unsafe { sys::virDomainSaveFlags(domain.as_ptr(), path.as_ptr(), std::ptr::null(), 0) };
    match ret {
        0.. => Ok(()),
        _ => Err(Error::last_error()),
    }
}

/// `virDomainRestoreFlags`: the domain started again from `path`, running or paused.
fn restore_from(conn: &Connect, path: &CString, running: bool) -> Result<(), Error> {
    let flags = match running {
        true => sys::VIR_DOMAIN_SAVE_RUNNING,
        false => sys::VIR_DOMAIN_SAVE_PAUSED,
    };
    // SAFETY: an open connection and a NUL-terminated path; no XML override (null).
    let ret = unsafe {
        sys::virDomainRestoreFlags(conn.as_ptr(), path.as_ptr(), std::ptr::null(), flags)
    };
    match ret {
        0.. => Ok(()),
        _ => Err(Error::last_error()),
    }
}

impl LibvirtVm {
    /// Start the domain again from the file `path` in the snapshot's directory (lent to
    /// libvirtd's user meanwhile), running or paused as it was.
    async fn restore_now(
        &self,
        path: &Path,
        running: bool,
        limit: Duration,
    ) -> Result<(), BackendError> {
        let _lent = Lent::new(path, false, daemon_user(&self.uri)?)?;
        let (session, path) = (self.session.clone(), c_path(path)?);
        blocking(limit, move || restore_from(&session.conn, &path, running)).await
    }

    /// Whether a save whose abort was asked for finished all the same: waited for until
    /// the domain has no job (at most ten call timeouts), then the domain shut off and the
    /// file's header libvirt's mark of a whole image (a partial one has another).
    async fn save_finished_after_abort(&self, path: &Path) -> bool {
        for _ in 0..ABORT_POLLS {
            let d = self.domain.clone();
            match blocking(self.call_timeout, move || super::session::job(&d)).await {
                Ok((kind, _)) if kind as u32 == sys::VIR_DOMAIN_JOB_NONE => break,
                _ => tokio::time::sleep(self.call_timeout / 10).await,
            }
        }
        let d = self.domain.clone();
        let state = blocking(self.call_timeout, move || d.get_state()).await;
        matches!(state, Ok((sys::VIR_DOMAIN_SHUTOFF, _))) && super::is_whole_save_image(path)
    }

    /// See `VmBackend::save`: the domain saved into `dir` by libvirt (which stops it),
    /// then started again from the file at once, or left stopped (hibernation) once the
    /// snapshot is sealed — started again from the file if the seal fails.
    pub(super) async fn save_into(
        &mut self,
        dir: &Path,
        then: AfterSave,
        limit: Duration,
        seal: Seal,
    ) -> Result<Saved, BackendError> {
        let d = self.domain.clone();
        let (state, _) = blocking(self.call_timeout, move || d.get_state()).await?;
        let running = state == sys::VIR_DOMAIN_RUNNING;
        let path = dir.join(MEMORY_FILE);
        let stopped = Instant::now();
        {
            let _lent = Lent::new(&path, true, daemon_user(&self.uri)?)?;
            let (d, c) = (self.domain.clone(), c_path(&path)?);
            let saved = blocking(limit, move || save_to(&d, &c)).await;
            match saved {
                Ok(()) => {}
                Err(e @ BackendError::Timeout(_)) => {
                    // libvirt resumes the domain once its save job is aborted.
                    let d = self.domain.clone();
                    // SAFETY: a live domain.
                    let abort = move || match unsafe { sys::virDomainAbortJob(d.as_ptr()) } {
                        0.. => Ok(()),
                        _ => Err(Error::last_error()),
                    };
                    let _ = blocking(self.call_timeout, abort).await;
                    // The abort only asks: the job ends when it ends, the domain paused
                    // meanwhile. Unless it ended by finishing the save (the domain shut off,
                    // a whole image in the file), its file is no snapshot.
                    if !self.save_finished_after_abort(&path).await {
                        return Err(e);
                    }
                    tracing::warn!("{e}, but the save ended before it could be aborted: kept");
                }
                Err(e) => return Err(e),
            }
        }
        let written = stopped.elapsed();
        let mut restarted = None;
        if then == AfterSave::Run {
            restarted = Some(self.restore_now(&path, running, limit).await);
        }
        let downtime = stopped.elapsed();
        let synced = std::fs::File::open(&path)
            .and_then(|f| f.sync_all())
            .map_err(|e| format!("reading {}: {e}", path.display()));
        let saved = Saved {
            mechanism: "libvirt virDomainSaveFlags".into(),
            was_running: running,
            downtime,
            written,
            ..Saved::default()
        };
        match (then, restarted) {
            (AfterSave::Run, Some(Err(e))) => {
                // The domain is stopped, its state only in the file: keep it whole.
                let kept = match synced {
                    Ok(()) => seal(saved).await,
                    Err(e) => Err(e),
                };
                let kept = match kept {
                    Ok(()) => {
                        "the snapshot is kept: restore it with `memtide snapshot restore --force`"
                            .into()
                    }
                    Err(why) => format!("and the snapshot could not be kept ({why})"),
                };
                Err(BackendError::Protocol(format!(
                    "saved, but the domain did not start again from its snapshot ({e}); {kept}"
                )))
            }
            (AfterSave::Run, _) => {
                synced.map_err(BackendError::Io)?;
                seal(saved.clone()).await.map_err(BackendError::Io)?;
                Ok(saved)
            }
            (AfterSave::Quit, _) => {
                // A failed seal removes the snapshot's directory: a second link to the
                // file, beside it, lets the guest run on from it.
                let rescue = dir.with_extension("rescue.partial");
                let linked = std::fs::DirBuilder::new()
                    .mode(0o700)
                    .create(&rescue)
                    .and_then(|()| std::fs::hard_link(&path, rescue.join(MEMORY_FILE)));
                let linked_ok = linked.is_ok();
                let sealed = match (synced, linked) {
                    (Ok(()), Ok(())) => seal(saved.clone()).await,
                    (Err(e), _) => Err(e),
                    (_, Err(e)) => Err(format!("linking {}: {e}", rescue.display())),
                };
                // The state to start the guest again from: the rescue link, or, if it
                // could not be made, the file itself (no seal ran to remove it).
                let state = match linked_ok {
                    true => rescue.join(MEMORY_FILE),
                    false => path.clone(),
                };
                let result = match sealed {
                    Ok(()) => Ok(saved),
                    Err(why) => match self.restore_now(&state, running, limit).await {
                        Ok(()) => Err(BackendError::Io(format!("{why}; the guest runs on"))),
                        Err(e) => Err(BackendError::Io(format!(
                            "{why}; and the domain did not start again from its state ({e})"
                        ))),
                    },
                };
                let _ = std::fs::remove_dir_all(&rescue);
                result
            }
        }
    }
}

/// Start libvirt domain `name` on `uri` again from the snapshot file `path` (lent to
/// libvirtd's user meanwhile), running or paused as it was saved,
/// within `limit`. Refused while the domain runs.
pub async fn restore(
    uri: &str,
    name: &str,
    path: &Path,
    running: bool,
    limit: Duration,
) -> Result<Duration, BackendError> {
    let start = Instant::now();
    let libvirt = Libvirt::new(uri, limit);
    let session = libvirt.session().await?;
    let (s, n) = (session.clone(), name.to_string());
    let active = blocking(limit, move || match Domain::lookup_by_name(&s.conn, &n) {
        Ok(d) => d.is_active(),
        Err(e) if matches!(e.code(), virt::error::ErrorNumber::NoDomain) => Ok(false),
        Err(e) => Err(e),
    })
    .await?;
    if active {
        return Err(BackendError::Protocol(format!(
            "domain {name} is running on {uri}: stop it before restoring it"
        )));
    }
    let _lent = Lent::new(path, false, daemon_user(uri)?)?;
    let c = c_path(path)?;
    blocking(limit, move || restore_from(&session.conn, &c, running))
        .await
        .map_err(|e| match e {
            BackendError::Disconnected(m) | BackendError::Protocol(m) => {
                BackendError::Protocol(format!("libvirt did not restore {name}: {m}"))
            }
            other => other,
        })?;
    Ok(start.elapsed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_socket_a_uri_names_is_found_in_its_query() {
        let uri = "qemu+unix:///session?socket=/tmp/x/libvirt-sock";
        assert_eq!(socket_param(uri), Some("/tmp/x/libvirt-sock"));
        let uri = "qemu+unix:///system?mode=direct&socket=/run/l.sock";
        assert_eq!(socket_param(uri), Some("/run/l.sock"));
        assert_eq!(socket_param("qemu:///system"), None);
        assert_eq!(socket_param("qemu:///session?socket="), None);
        assert_eq!(socket_param("qemu:///session?mode=legacy"), None);
    }

    #[test]
    fn no_directory_is_lent_when_libvirtd_runs_as_memtide() {
        let dir = tempfile::tempdir().unwrap();
        assert!(Lent::new(&dir.path().join("m"), true, None)
            .unwrap()
            .is_none());
        let socket = dir.path().join("sock");
        std::fs::write(&socket, "").unwrap();
        let uri = format!("qemu+unix:///session?socket={}", socket.display());
        assert_eq!(daemon_user(&uri).unwrap(), None, "the socket is ours");
        let e = daemon_user("qemu+unix:///session?socket=/nonexistent/sock").unwrap_err();
        assert!(e.to_string().contains("/nonexistent/sock"), "{e}");
        let launcher = "qemu+unix:///session?socket=/proc/7/root/var/run/libvirt/virtqemud-sock";
        let e = daemon_user(launcher).unwrap_err();
        assert!(e.to_string().contains("KubeVirt launcher"), "{e}");
    }

    #[test]
    fn only_the_file_is_lent_never_through_a_link_and_it_comes_back() {
        let store = tempfile::tempdir().unwrap();
        let dir = store.path().join("vm").join("snap.partial");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let nobody = Some((65534, 65534));
        // A link where the file should be is refused, and what it points to is untouched.
        let target = store.path().join("precious");
        std::fs::write(&target, "root's").unwrap();
        std::os::unix::fs::symlink(&target, dir.join("link")).unwrap();
        let e = Lent::new(&dir.join("link"), false, nobody)
            .err()
            .expect("refused");
        assert!(e.to_string().contains("link"), "{e}");
        assert_eq!(std::fs::metadata(&target).unwrap().uid(), euid());
        let file = dir.join(MEMORY_FILE);
        match Lent::new(&file, true, nobody) {
            Ok(lent) => {
                assert!(lent.is_some());
                let meta = std::fs::metadata(&file).unwrap();
                assert_eq!((meta.uid(), meta.gid()), (65534, 65534));
                let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
                assert_eq!(
                    mode & 0o777,
                    0o711,
                    "traversable, not writable nor listable"
                );
                drop(lent);
                let meta = std::fs::metadata(&file).unwrap();
                assert_eq!(
                    (meta.uid(), meta.permissions().mode() & 0o777),
                    (euid(), 0o600)
                );
                let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
                assert_eq!(mode & 0o777, 0o700, "closed again");
            }
            // Not root: the lend fails, and says why.
            Err(e) => assert!(e.to_string().contains("only root"), "{e}"),
        }
    }
}
