//! KubeVirt's virt-launcher pods, found from the node: each pod runs a libvirt daemon of
//! its own (modular `virtqemud`) for its one VM, listening on
//! `/var/run/libvirt/virtqemud-sock` inside the pod, which a process of the node with the
//! host's PID namespace reaches through the daemon's root: `/proc/PID/root/...` (as
//! KubeVirt's own virt-handler does). A pod whose launcher runs as non-root (KubeVirt's
//! default, uid 107) runs the daemon in session mode; a root launcher in system mode.
//!
//! Each launcher pod's memory request and limit, read from the Kubernetes API server
//! ([`api`], [`pods`]), give its VM's bounds.

pub mod api;
pub mod pods;

use crate::procfs;
use std::path::Path;

/// The daemon's process name (`comm`).
const DAEMON: &str = "virtqemud";
/// Its socket, relative to its root.
const SOCKET: &str = "var/run/libvirt/virtqemud-sock";

/// The libvirt URIs of the virt-launcher daemons running under `proc`, sorted: one per
/// `virtqemud` process whose socket exists below its root. Processes that end during the
/// scan, or whose files cannot be read, are passed over.
pub fn launcher_uris(proc: &Path) -> Vec<String> {
    let mut uris: Vec<String> = procfs::processes(proc, |name| name == DAEMON)
        .into_iter()
        .filter_map(|(_, _, dir)| {
            let socket = dir.join("root").join(SOCKET);
            if !socket.exists() {
                return None;
            }
            let status = std::fs::read_to_string(dir.join("status")).ok()?;
            let mode = if real_uid(&status)? == 0 {
                "system"
            } else {
                "session"
            };
            Some(format!("qemu+unix:///{mode}?socket={}", socket.display()))
        })
        .collect();
    uris.sort();
    uris.dedup();
    uris
}

/// The name of the VM behind a launcher's libvirt domain: KubeVirt names the domain
/// `NAMESPACE_NAME`, and a namespace (a DNS label) has no `_`, so the first one is the
/// separator: `NAMESPACE/NAME`, as `kubectl` shows it.
pub fn vm_name(domain: &str) -> String {
    domain.replacen('_', "/", 1)
}

/// The real uid in a `/proc/PID/status` text.
fn real_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake /proc entry: `comm`, a status with `uid`, and a root holding the socket
    /// when `socket` is true.
    fn process(proc: &Path, pid: u32, comm: &str, uid: u32, socket: bool) {
        let dir = proc.join(pid.to_string());
        let root = dir.join("root");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(dir.join("comm"), format!("{comm}\n")).unwrap();
        let status = format!("Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n");
        std::fs::write(dir.join("status"), status).unwrap();
        if socket {
            let sock = root.join(SOCKET);
            std::fs::create_dir_all(sock.parent().unwrap()).unwrap();
            std::fs::write(sock, "").unwrap();
        }
    }

    #[test]
    fn each_launchers_daemon_is_reached_through_its_root_in_its_mode() {
        let dir = tempfile::tempdir().unwrap();
        let proc = dir.path();
        process(proc, 4100, "virtqemud", 107, true);
        process(proc, 200, "virtqemud", 0, true);
        process(proc, 300, "virtqemud", 107, false); // still starting: no socket yet
        process(proc, 400, "qemu-kvm", 107, true);
        std::fs::create_dir_all(proc.join("self")).unwrap();
        let uris = launcher_uris(proc);
        let socket = |pid: u32| proc.join(pid.to_string()).join("root").join(SOCKET);
        assert_eq!(
            uris,
            [
                format!("qemu+unix:///session?socket={}", socket(4100).display()),
                format!("qemu+unix:///system?socket={}", socket(200).display()),
            ]
        );
        assert!(launcher_uris(&proc.join("missing")).is_empty());
    }

    #[test]
    fn a_domain_is_named_as_kubevirt_names_its_vm() {
        assert_eq!(vm_name("default_web"), "default/web");
        assert_eq!(vm_name("team-a_db_replica_2"), "team-a/db_replica_2");
        assert_eq!(vm_name("plain"), "plain");
    }

    #[test]
    fn the_real_uid_is_the_first_of_the_four() {
        assert_eq!(real_uid("Name:\tx\nUid:\t107\t0\t0\t0\n"), Some(107));
        assert_eq!(real_uid("Name:\tx\n"), None);
        assert_eq!(real_uid("Uid:\tlots\n"), None);
    }
}
