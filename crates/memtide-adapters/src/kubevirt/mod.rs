//! KubeVirt's virt-launcher pods, found from the node: each pod runs a libvirt daemon of
//! its own (modular `virtqemud`) for its one VM, listening on
//! `/var/run/libvirt/virtqemud-sock` inside the pod, which a process of the node with the
//! host's PID namespace reaches through the daemon's root: `/proc/PID/root/...` (as
//! KubeVirt's own virt-handler does). A pod whose launcher runs as non-root (KubeVirt's
//! default, uid 107) runs the daemon in session mode; a root launcher in system mode.
//!
//! The pod owns the files below its root. The kernel resolves an absolute symbolic link
//! met below `/proc/PID/root` from memtide's own root, not the pod's, and `..` can climb
//! out of it: a pod whose `var/run` pointed at `/run` would hand memtide the node's own
//! libvirt socket. So the socket's path is resolved here, each link within the pod's root
//! ([`socket_in_root`]), and memtide connects through the resulting path, which holds no
//! link at all.
//!
//! Each launcher pod's memory request and limit, read from the Kubernetes API server
//! ([`api`], [`pods`]), give its VM's bounds.

pub mod api;
pub mod pods;

use crate::procfs;
use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

/// The daemon's process name (`comm`).
const DAEMON: &str = "virtqemud";
/// Its socket, relative to its root.
const SOCKET: &str = "var/run/libvirt/virtqemud-sock";

/// A virt-launcher's libvirt daemon found on the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launcher {
    /// Its libvirt URI: its socket by a path with no link in it ([`socket_in_root`]).
    pub uri: String,
    /// The UID of the pod it runs in, by its cgroup ([`pod_uid`]); `None` where its cgroup
    /// names no pod.
    pub pod: Option<String>,
}

/// The virt-launcher daemons running under `proc`, by URI: one per `virtqemud` process
/// whose socket exists below its root ([`socket_in_root`]). Processes that end during
/// the scan, or whose files cannot be read, are passed over.
pub fn launchers(proc: &Path) -> Vec<Launcher> {
    let mut found: Vec<Launcher> = procfs::processes(proc, |name| name == DAEMON)
        .into_iter()
        .filter_map(|(_, _, dir)| {
            let socket = socket_in_root(&dir.join("root"))?;
            let status = std::fs::read_to_string(dir.join("status")).ok()?;
            let mode = if real_uid(&status)? == 0 {
                "system"
            } else {
                "session"
            };
            let pod = std::fs::read_to_string(dir.join("cgroup"))
                .ok()
                .and_then(|text| pod_uid(&text));
            let uri = format!("qemu+unix:///{mode}?socket={}", socket.display());
            Some(Launcher { uri, pod })
        })
        .collect();
    found.sort_by(|a, b| a.uri.cmp(&b.uri));
    found.dedup_by(|a, b| a.uri == b.uri);
    found
}

/// The UID of the Kubernetes pod a process runs in, from its `/proc/PID/cgroup` text:
/// the kubelet puts each pod's containers below a cgroup named after the pod's UID:
/// `pod<UID>` with the cgroupfs driver, `kubepods[-QOS]-pod<UID>.slice` (the UID's `-`
/// written `_`) with the systemd one. A reader in a cgroup namespace of its own (memtide
/// in its pod) sees the path from its own cgroup (`/../../pod<UID>/…`), so the name is
/// looked for in any component, the outermost first: the kubelet made that one, and a
/// pod allowed to make cgroups of its own below it could name one after another pod. A
/// process cannot move itself into another pod's cgroup unless it is privileged, so this
/// names the pod whatever files the pod shapes. `None` where no line names a pod, or two
/// lines name different ones.
pub fn pod_uid(cgroup: &str) -> Option<String> {
    let mut found: Option<String> = None;
    for line in cgroup.lines() {
        let Some(path) = line.splitn(3, ':').nth(2) else {
            continue;
        };
        let uid = path.split('/').find_map(|c| {
            let uid = match c.strip_suffix(".slice") {
                Some(slice) => slice.rsplit_once("-pod")?.1.replace('_', "-"),
                None => c.strip_prefix("pod")?.to_string(),
            };
            is_uid(&uid).then_some(uid)
        });
        match (uid, &found) {
            (Some(uid), Some(seen)) if uid != *seen => return None,
            (Some(uid), None) => found = Some(uid),
            _ => {}
        }
    }
    found
}

/// True for a UID as Kubernetes writes one: 8-4-4-4-12 hexadecimal digits.
fn is_uid(text: &str) -> bool {
    let groups: Vec<&str> = text.split('-').collect();
    groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups
            .iter()
            .all(|g| g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The most symbolic links followed on the way to a socket, as the kernel's own limit.
const MAX_LINKS: u32 = 40;

/// The daemon's socket below `root` (a process's `/proc/PID/root`), by a path with no
/// symbolic link in it: each link on the way is resolved as if `root` were `/` (an
/// absolute target from `root`, `..` never above it). `None` when there is none, the
/// path meets something other than a directory on the way or a socket at its end, or
/// more than [`MAX_LINKS`] links.
pub fn socket_in_root(root: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::FileTypeExt;
    // The components still to walk, last first; and those walked.
    let mut todo: Vec<OsString> = components(Path::new(SOCKET)).rev().collect();
    let mut walked: Vec<OsString> = Vec::new();
    let mut links = 0;
    while let Some(name) = todo.pop() {
        if name == ".." {
            walked.pop();
            continue;
        }
        let path = walked
            .iter()
            .fold(root.to_path_buf(), |p, c| p.join(c))
            .join(&name);
        let kind = std::fs::symlink_metadata(&path).ok()?.file_type();
        if kind.is_symlink() {
            links += 1;
            if links > MAX_LINKS {
                return None;
            }
            let target = std::fs::read_link(&path).ok()?;
            if target.is_absolute() {
                walked.clear();
            }
            todo.extend(components(&target).rev());
        } else if kind.is_dir() && !todo.is_empty() || kind.is_socket() && todo.is_empty() {
            walked.push(name);
        } else {
            return None;
        }
    }
    // An empty walk is the root itself, not a socket.
    (!walked.is_empty()).then(|| walked.iter().fold(root.to_path_buf(), |p, c| p.join(c)))
}

/// A path's normal components and `..`, as names (`/` and `.` dropped).
fn components(path: &Path) -> impl DoubleEndedIterator<Item = OsString> + '_ {
    path.components().filter_map(|c| match c {
        Component::Normal(name) => Some(name.to_os_string()),
        Component::ParentDir => Some("..".into()),
        Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
    })
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
            bind(&root.join(SOCKET));
        }
    }

    /// A unix socket at `path` (its file stays when the listener is dropped).
    fn bind(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::os::unix::net::UnixListener::bind(path).unwrap();
    }

    fn link(target: impl AsRef<Path>, at: &Path) {
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(target, at).unwrap();
    }

    #[test]
    fn links_in_a_pods_root_are_followed_within_it_only() {
        let dir = tempfile::tempdir().unwrap();
        // A socket of the node's, outside every pod's root.
        let node = dir.path().join("node/run/libvirt/virtqemud-sock");
        bind(&node);
        let root = |name: &str| dir.path().join(name);

        // As in the launcher image: var/run -> ../run.
        let relative = root("relative");
        link("../run", &relative.join("var/run"));
        bind(&relative.join("run/libvirt/virtqemud-sock"));
        assert_eq!(
            socket_in_root(&relative),
            Some(relative.join("run/libvirt/virtqemud-sock"))
        );

        // An absolute link is the pod's own path, not the node's.
        let absolute = root("absolute");
        link("/run", &absolute.join("var/run"));
        assert_eq!(socket_in_root(&absolute), None, "no /run in this pod");
        bind(&absolute.join("run/libvirt/virtqemud-sock"));
        assert_eq!(
            socket_in_root(&absolute),
            Some(absolute.join("run/libvirt/virtqemud-sock"))
        );

        // Links that would reach the node's socket: by its absolute path, and by climbing.
        let escape = root("escape");
        link(&node, &escape.join(SOCKET));
        assert!(
            escape.join(SOCKET).exists(),
            "the kernel would follow it out"
        );
        assert_eq!(socket_in_root(&escape), None);
        let climb = root("climb");
        link("../../node/run", &climb.join("var/run"));
        assert!(
            climb.join(SOCKET).exists(),
            "the kernel would follow it out"
        );
        assert_eq!(socket_in_root(&climb), None);
        // Climbing stops at the root, as it does at `/`.
        let stop = root("stop");
        link("../../../run", &stop.join("var/run"));
        bind(&stop.join("run/libvirt/virtqemud-sock"));
        assert_eq!(
            socket_in_root(&stop),
            Some(stop.join("run/libvirt/virtqemud-sock"))
        );

        // Not a socket, a loop, a file on the way.
        let file = root("file");
        std::fs::create_dir_all(file.join("var/run/libvirt")).unwrap();
        std::fs::write(file.join(SOCKET), "").unwrap();
        assert_eq!(socket_in_root(&file), None);
        let looped = root("loop");
        link("../var/run", &looped.join("var/run"));
        assert_eq!(socket_in_root(&looped), None);
        let on_the_way = root("on-the-way");
        std::fs::create_dir_all(on_the_way.join("var")).unwrap();
        std::fs::write(on_the_way.join("var/run"), "").unwrap();
        assert_eq!(socket_in_root(&on_the_way), None);
        assert_eq!(socket_in_root(&root("missing")), None);
    }

    #[test]
    fn a_launcher_whose_socket_leads_out_of_its_root_is_not_reached() {
        let dir = tempfile::tempdir().unwrap();
        let proc = dir.path().join("proc");
        let node = dir.path().join("node-sock");
        bind(&node);
        process(&proc, 500, "virtqemud", 0, false);
        link(&node, &proc.join("500/root").join(SOCKET));
        process(&proc, 600, "virtqemud", 107, false);
        let root = proc.join("600/root");
        link("../run", &root.join("var/run"));
        bind(&root.join("run/libvirt/virtqemud-sock"));
        let uris: Vec<String> = launchers(&proc).into_iter().map(|l| l.uri).collect();
        assert_eq!(
            uris,
            [format!(
                "qemu+unix:///session?socket={}",
                root.join("run/libvirt/virtqemud-sock").display()
            )]
        );
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
        std::fs::write(
            proc.join("4100/cgroup"),
            format!("0::/kubepods/pod{POD}/c1\n"),
        )
        .unwrap();
        let socket = |pid: u32| proc.join(pid.to_string()).join("root").join(SOCKET);
        let launcher = |mode: &str, pid: u32, pod: Option<&str>| Launcher {
            uri: format!("qemu+unix:///{mode}?socket={}", socket(pid).display()),
            pod: pod.map(str::to_string),
        };
        assert_eq!(
            launchers(proc),
            [
                launcher("session", 4100, Some(POD)),
                launcher("system", 200, None),
            ]
        );
        assert!(launchers(&proc.join("missing")).is_empty());
    }

    const POD: &str = "6f1c2a3b-0d4e-4f5a-8b6c-7d8e9f0a1b2c";

    #[test]
    fn a_process_is_placed_in_its_pod_by_its_cgroup() {
        let systemd = "6f1c2a3b_0d4e_4f5a_8b6c_7d8e9f0a1b2c";
        for text in [
            // cgroup v2, systemd driver, burstable and guaranteed.
            format!("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{systemd}.slice/cri-containerd-ab12.scope\n"),
            format!("0::/kubepods.slice/kubepods-pod{systemd}.slice/crio-ab12.scope\n"),
            // cgroupfs driver, v2 and v1 (every controller's line agrees).
            format!("0::/kubepods/besteffort/pod{POD}/ab12\n"),
            format!("12:memory:/kubepods/burstable/pod{POD}/ab12\n11:cpu,cpuacct:/kubepods/burstable/pod{POD}/ab12\n1:name=systemd:/\n"),
            // Seen from memtide's own pod, in a cgroup namespace of its own.
            format!("0::/../../../besteffort/pod{POD}/ab12\n"),
            format!("0::/../../kubepods-besteffort-pod{systemd}.slice/cri-containerd-ab12.scope\n"),
        ] {
            assert_eq!(pod_uid(&text).as_deref(), Some(POD), "{text}");
        }
        for text in [
            "0::/system.slice/libvirtd.service\n".to_string(),
            // Not a UID.
            "0::/kubepods/burstable/podnot-a-uid/ab12\n".to_string(),
            "0::/kubepods.slice/kubepods-pod1234.slice/x\n".to_string(),
            // Two controllers naming two pods.
            format!(
                "12:memory:/kubepods/pod{POD}/a\n11:cpu:/kubepods/pod{}/a\n",
                POD.replace('6', "7")
            ),
            String::new(),
        ] {
            assert_eq!(pod_uid(&text), None, "{text}");
        }
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
