//! A libvirt daemon of the test's own: `libvirtd` in session mode as user `nobody`, with
//! its configuration, sockets, state and domains under a temporary directory (nothing in
//! /etc/libvirt or /run/libvirt), started in a memory cgroup so that the QEMU processes it
//! spawns are charged there. Its domains are destroyed and the daemon stopped on drop.
//!
//! [`Libvirtd::start_as_launcher`] starts it as a KubeVirt virt-launcher pod's daemon
//! appears from the node: named `virtqemud`, in a mount namespace of its own where its
//! socket is `/var/run/libvirt/virtqemud-sock`.

use super::{guest_dir, signal, wait_for};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The unprivileged user the daemon and its QEMUs run as.
const USER: &str = "nobody";

/// A test domain: the test guest with `mem_mib` of RAM, a virtio balloon (statistics
/// every second) and a swap disk, running `workload` with `args`.
#[derive(Default)]
pub struct Domain<'a> {
    pub mem_mib: u64,
    pub workload: &'a str,
    pub args: &'a str,
    /// The guest agent's channel.
    pub agent: bool,
    /// XML inside `<metadata>`.
    pub metadata: &'a str,
    /// A virtio-mem device of this size beyond `mem_mib` (none when 0), with the memory
    /// slot and NUMA cell libvirt requires for one.
    pub virtio_mem_mib: u64,
    /// Room for DIMMs of this much in all to be attached live (none when 0), with the
    /// memory slots and NUMA cell libvirt requires for them.
    pub dimm_room_mib: u64,
    /// Added to the kernel command line.
    pub append: &'a str,
}

/// A running test libvirtd.
pub struct Libvirtd {
    /// Everything of the daemon's lives here.
    pub dir: PathBuf,
    /// The URI to reach it (`qemu+unix:///session?socket=...`).
    pub uri: String,
    /// The cgroup it (and so each QEMU it starts) joins.
    procs: PathBuf,
    /// It runs as a launcher pod's daemon ([`Libvirtd::start_as_launcher`]).
    launcher: bool,
    child: Child,
}

/// The name KubeVirt's launcher daemon runs under (its `comm`), and its socket's name.
pub const LAUNCHER_DAEMON: &str = "virtqemud";

fn chown(path: &Path) {
    let ok = Command::new("chown")
        .args(["-R", &format!("{USER}:")])
        .arg(path)
        .status()
        .unwrap();
    assert!(ok.success(), "chown {}", path.display());
}

impl Libvirtd {
    /// Start the daemon in `dir` (made accessible to `nobody`), joining the cgroup whose
    /// `cgroup.procs` is `procs`, and wait until it answers.
    pub fn start(dir: &Path, procs: &Path) -> Libvirtd {
        Libvirtd::start_in(dir, procs, false)
    }

    /// Start the daemon as [`Libvirtd::start`] does, but as a KubeVirt virt-launcher
    /// pod's daemon appears from the node (`memtide_adapters::kubevirt`): under the
    /// process name `virtqemud` (`libvirtd` exec'd through a link of that name: Debian
    /// bookworm has no modular daemons), in a mount namespace of its own (`unshare
    /// --mount --propagation private`) whose `/run` is a tmpfs of its own, as a pod's is,
    /// with the daemon's socket directory bound on `/run/libvirt` and, there,
    /// `virtqemud-sock` a relative link to its session socket. So the node reaches it
    /// through `/proc/PID/root/var/run/libvirt/virtqemud-sock`, by the host's absolute
    /// link `var/run -> /run` and that relative one; the host's own mounts and its
    /// `/run/libvirt` are untouched. The daemon and its QEMUs are the namespace's only
    /// processes: it ends with them.
    pub fn start_as_launcher(dir: &Path, procs: &Path) -> Libvirtd {
        let d = Libvirtd::start_in(dir, procs, true);
        let comm = std::fs::read_to_string(format!("/proc/{}/comm", d.pid())).unwrap();
        assert_eq!(
            comm.trim_end(),
            LAUNCHER_DAEMON,
            "the daemon's process name"
        );
        assert_ne!(
            d.mount_namespace(),
            std::fs::read_link("/proc/self/ns/mnt").unwrap(),
            "the daemon has a mount namespace of its own"
        );
        d
    }

    fn start_in(dir: &Path, procs: &Path, launcher: bool) -> Libvirtd {
        let dir = dir.join("libvirt");
        for sub in ["config/libvirt", "run", "cache", "home", "guest", "bin"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        // QEMU logs to files: no virtlogd to start and stop.
        std::fs::write(
            dir.join("config/libvirt/qemu.conf"),
            "stdio_handler = \"file\"\n",
        )
        .unwrap();
        let conf = dir.join("config/libvirt/libvirtd.conf");
        std::fs::write(
            &conf,
            format!(
                "unix_sock_dir = {:?}\n",
                dir.join("run").display().to_string()
            ),
        )
        .unwrap();
        // The guest's kernel and initrd, readable by the daemon's user wherever the
        // checkout is.
        for f in ["vmlinuz", "initrd.img"] {
            std::fs::copy(guest_dir().join(f), dir.join("guest").join(f)).unwrap();
        }
        if launcher {
            // The daemon is exec'd through this link, so its comm is `virtqemud`.
            let libvirtd = ["/usr/sbin/libvirtd", "/usr/bin/libvirtd"]
                .into_iter()
                .find(|p| Path::new(p).exists())
                .expect("libvirtd (Debian package libvirt-daemon; scripts/test.sh installs it)");
            std::os::unix::fs::symlink(libvirtd, dir.join("bin").join(LAUNCHER_DAEMON)).unwrap();
            // Where the pod's socket would be, a link to the session socket beside it.
            std::os::unix::fs::symlink(
                "libvirt-sock",
                dir.join("run").join(format!("{LAUNCHER_DAEMON}-sock")),
            )
            .unwrap();
        }
        chown(&dir);
        let mut up = dir.parent().unwrap().to_path_buf();
        loop {
            let mode = std::fs::metadata(&up).unwrap().permissions().mode();
            std::fs::set_permissions(&up, std::fs::Permissions::from_mode(mode | 0o711)).unwrap();
            if up
                .parent()
                .is_none_or(|p| p == Path::new("/tmp") || p == Path::new("/"))
            {
                break;
            }
            up = up.parent().unwrap().to_path_buf();
        }
        let uri = format!(
            "qemu+unix:///session?socket={}",
            dir.join("run/libvirt-sock").display()
        );
        let child = spawn(&dir, procs, launcher);
        let d = Libvirtd {
            dir,
            uri,
            procs: procs.to_path_buf(),
            launcher,
            child,
        };
        d.wait_answering();
        d
    }

    fn wait_answering(&self) {
        let answered = wait_for(Duration::from_secs(60), || self.virsh(&["version"]).ok());
        assert!(
            answered.is_some(),
            "libvirtd did not answer; its log:\n{}",
            std::fs::read_to_string(self.dir.join("libvirtd.log")).unwrap_or_default()
        );
    }

    /// Stop the daemon (SIGTERM: its domains go on running), run `while_down`, start it
    /// again on the same directory and wait until it answers.
    pub fn restart(&mut self, while_down: impl FnOnce()) {
        self.stop();
        while_down();
        self.child = spawn(&self.dir, &self.procs, self.launcher);
        self.wait_answering();
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its mount namespace (`/proc/PID/ns/mnt`'s link, `mnt:[INODE]`).
    pub fn mount_namespace(&self) -> PathBuf {
        std::fs::read_link(format!("/proc/{}/ns/mnt", self.pid())).unwrap()
    }

    /// Stop the daemon (SIGTERM: its domains go on running) and wait until it has exited.
    pub fn stop(&mut self) {
        signal(self.child.id(), "TERM");
        let stopped = wait_for(Duration::from_secs(30), || self.child.try_wait().unwrap());
        assert!(stopped.is_some(), "libvirtd did not stop on SIGTERM");
    }

    /// Run `virsh -c URI ARGS`: its output, or its error output.
    pub fn virsh(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new("virsh")
            .arg("-c")
            .arg(&self.uri)
            .args(args)
            .output()
            .unwrap();
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// Domain `name`'s balloon `actual` in KiB as libvirt reports it (`virsh
    /// dommemstat`), with the whole report for messages.
    pub fn balloon_kib(&self, name: &str) -> (u64, String) {
        let stats = self.virsh(&["dommemstat", name]).unwrap();
        let actual = stats
            .lines()
            .find_map(|l| l.strip_prefix("actual "))
            .unwrap_or_else(|| panic!("no actual in {stats}"))
            .trim()
            .parse()
            .unwrap();
        (actual, stats)
    }

    /// Define and start a domain running the test guest. Returns its console log's path.
    pub fn boot(&self, name: &str, domain: &Domain) -> PathBuf {
        let Domain {
            mem_mib,
            workload,
            args,
            agent,
            metadata,
            virtio_mem_mib,
            dimm_room_mib,
            append,
        } = *domain;
        let guest = self.dir.join("guest");
        let serial = guest.join(format!("{name}.serial"));
        let swap = guest.join(format!("{name}.swap"));
        std::fs::File::create(&swap)
            .unwrap()
            .set_len(128 << 20)
            .unwrap();
        chown(&swap);
        let channel = if agent {
            "<channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>"
        } else {
            ""
        };
        let (max_memory, numa) = if virtio_mem_mib + dimm_room_mib > 0 {
            (
                format!(
                    "<maxMemory slots='2' unit='MiB'>{}</maxMemory>",
                    mem_mib + virtio_mem_mib + dimm_room_mib
                ),
                format!("<numa><cell id='0' cpus='0' memory='{mem_mib}' unit='MiB'/></numa>"),
            )
        } else {
            Default::default()
        };
        let virtio_mem = if virtio_mem_mib > 0 {
            format!(
                "<memory model='virtio-mem'><target><size unit='MiB'>{virtio_mem_mib}</size>\
                 <node>0</node><block unit='MiB'>2</block><requested unit='MiB'>0</requested>\
                 </target></memory>"
            )
        } else {
            String::new()
        };
        let xml = format!(
            "<domain type='qemu'>
  <name>{name}</name>
  <metadata>{metadata}</metadata>
  {max_memory}
  <memory unit='MiB'>{memory}</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>{kernel}</kernel>
    <initrd>{initrd}</initrd>
    <cmdline>console=ttyS0 no_timer_check panic=-1 quiet cryptomgr.notests ipv6.disable=1 memtide.workload={workload} memtide.args={args} {append}</cmdline>
  </os>
  <features>{acpi}<tcg><tb-cache unit='MiB'>16</tb-cache></tcg></features>
  <cpu mode='custom' match='exact'><model fallback='allow'>qemu64</model><feature policy='require' name='rdrand'/>{numa}</cpu>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='{swap}'/><target dev='vda' bus='virtio'/></disk>
    <serial type='file'><source path='{serial}'/></serial>
    {channel}
    <memballoon model='virtio'><stats period='1'/></memballoon>
    {virtio_mem}
  </devices>
</domain>",
            memory = mem_mib + virtio_mem_mib,
            // QEMU plugs a DIMM through the guest's ACPI.
            acpi = if dimm_room_mib > 0 { "<acpi/>" } else { "" },
            kernel = guest.join("vmlinuz").display(),
            initrd = guest.join("initrd.img").display(),
            swap = swap.display(),
            serial = serial.display(),
        );
        let file = guest.join(format!("{name}.xml"));
        std::fs::write(&file, xml).unwrap();
        self.virsh(&["define", file.to_str().unwrap()])
            .unwrap_or_else(|e| panic!("virsh define {name}: {e}"));
        self.virsh(&["start", name])
            .unwrap_or_else(|e| panic!("virsh start {name}: {e}"));
        serial
    }

    /// The QEMU process of a running domain.
    pub fn qemu_pid(&self, name: &str) -> u32 {
        let file = self.dir.join(format!("run/libvirt/qemu/run/{name}.pid"));
        std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()))
            .trim()
            .parse()
            .unwrap()
    }
}

/// Start `libvirtd` as [`USER`] on the configuration in `dir`, joining the cgroup whose
/// `cgroup.procs` is `procs`; its log is appended to `dir/libvirtd.log`. As a `launcher`,
/// in a mount namespace of its own and as `virtqemud` ([`Libvirtd::start_as_launcher`]).
/// Every step execs the next: the child's pid is the daemon's.
fn spawn(dir: &Path, procs: &Path, launcher: bool) -> Child {
    let env = [
        ("HOME", dir.join("home")),
        ("XDG_CONFIG_HOME", dir.join("config")),
        ("XDG_RUNTIME_DIR", dir.join("run")),
        ("XDG_CACHE_HOME", dir.join("cache")),
    ];
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("libvirtd.log"))
        .unwrap();
    let mut command = Command::new("sh");
    command
        .args(["-c", "echo $$ > \"$0\" && exec \"$@\""])
        .arg(procs);
    if launcher {
        // Mounts made in the new namespace only (`-n`: no /etc/mtab written).
        command
            .args(["unshare", "--mount", "--propagation", "private"])
            .args([
                "sh",
                "-c",
                "mount -n -t tmpfs -o mode=0755,size=1m memtide-launcher /run && \
                 mkdir /run/libvirt && mount -n --bind \"$0\" /var/run/libvirt && exec \"$@\"",
            ])
            .arg(dir.join("run"));
    }
    command
        .args([
            "setpriv",
            "--reuid",
            USER,
            "--regid",
            "nogroup",
            "--clear-groups",
        ])
        .args(["env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"])
        .args(env.iter().map(|(k, v)| format!("{k}={}", v.display())))
        .arg(match launcher {
            true => dir.join("bin").join(LAUNCHER_DAEMON),
            false => PathBuf::from("libvirtd"),
        })
        .arg("--config")
        .arg(dir.join("config/libvirt/libvirtd.conf"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("starting libvirtd (Debian package libvirt-daemon; scripts/test.sh installs it)")
}

impl Drop for Libvirtd {
    fn drop(&mut self) {
        let names = self.virsh(&["list", "--all", "--name"]).unwrap_or_default();
        for name in names.lines().filter(|l| !l.trim().is_empty()) {
            let _ = self.virsh(&["destroy", name]);
            let _ = self.virsh(&["undefine", name]);
        }
        // QEMUs left behind (if libvirtd could not destroy them) by their pid files.
        let run = self.dir.join("run/libvirt/qemu/run");
        for pid in std::fs::read_dir(run).into_iter().flatten().flatten() {
            if pid.path().extension().is_some_and(|e| e == "pid") {
                if let Ok(pid) = std::fs::read_to_string(pid.path()) {
                    let _ = Command::new("kill")
                        .args(["-KILL", pid.trim()])
                        .stderr(Stdio::null())
                        .status();
                }
            }
        }
        if self.child.try_wait().unwrap().is_some() {
            return; // stopped already
        }
        signal(self.child.id(), "TERM");
        if wait_for(Duration::from_secs(10), || self.child.try_wait().unwrap()).is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
