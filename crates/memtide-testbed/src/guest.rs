//! The QEMU test guest (`guest/build.sh`'s kernel and initramfs, `guest/README.md`'s
//! command line under TCG), started in a memory cgroup: [`Boot`] says what it gets,
//! [`Guest`] is the running QEMU, killed (and its disk images and sockets removed) when
//! dropped.

use crate::cgroup::command_in;
use crate::Error;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The balloon a test guest usually has (`-device`): deflated when the guest is out of
/// memory.
pub const BALLOON: &str = "virtio-balloon-pci,id=balloon0,deflate-on-oom=on";

/// The kernel command line every test guest boots with; [`Boot::kernel_args`] adds to it.
const KERNEL_ARGS: &str =
    "console=ttyS0 no_timer_check panic=-1 quiet cryptomgr.notests ipv6.disable=1";

/// Console lines quoted when a wait fails.
const CONSOLE_TAIL: usize = 30;

/// The built test guest's directory: `given`, else `$MEMTIDE_GUEST_DIR`, else the
/// workspace's `target/guest`; an error when its kernel or initramfs is missing.
pub fn guest_dir(given: Option<&Path>) -> Result<PathBuf, Error> {
    let dir = given
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("MEMTIDE_GUEST_DIR").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/guest"));
    if !(dir.join("vmlinuz").exists() && dir.join("initrd.img").exists()) {
        return Err(Error::NoGuest(dir));
    }
    Ok(dir)
}

/// How to boot one test guest: one CPU under TCG, no default devices, the console in a
/// file, and what is added here. Every file it gets lives in one directory and is named
/// after it.
#[derive(Debug, Clone)]
pub struct Boot {
    name: String,
    dir: PathBuf,
    kernel_dir: PathBuf,
    memory: String,
    kernel_args: String,
    qmp: Vec<PathBuf>,
    agent: Option<PathBuf>,
    /// (kind, MiB)
    disks: Vec<(String, u64)>,
    args: Vec<OsString>,
    /// The QEMU binary (`qemu-system-x86_64` from PATH unless [`Boot::program`] says).
    program: OsString,
    interrupted: Option<&'static AtomicBool>,
}

impl Boot {
    /// A guest called `name` with `memory` (QEMU's `-m`: MiB, or e.g. `256M,maxmem=1G`),
    /// booting the kernel and initramfs in `kernel_dir` (see [`guest_dir`]); its console
    /// goes to `<dir>/<name>.serial`.
    pub fn new(name: &str, dir: &Path, kernel_dir: &Path, memory: impl Into<String>) -> Boot {
        Boot {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            kernel_dir: kernel_dir.to_path_buf(),
            memory: memory.into(),
            kernel_args: String::new(),
            qmp: Vec::new(),
            agent: None,
            disks: Vec::new(),
            args: Vec::new(),
            program: "qemu-system-x86_64".into(),
            interrupted: None,
        }
    }

    /// Start `program` as QEMU rather than `qemu-system-x86_64` from PATH (another
    /// version; its firmware given with `-L` through [`Boot::args`]).
    pub fn program(mut self, program: impl Into<OsString>) -> Boot {
        self.program = program.into();
        self
    }

    /// Add to the kernel command line (guest/init reads `memtide.workload=` and
    /// `memtide.args=`, arguments joined by '+', from it).
    pub fn kernel_args(mut self, args: &str) -> Boot {
        if !args.trim().is_empty() {
            self.kernel_args.push(' ');
            self.kernel_args.push_str(args.trim());
        }
        self
    }

    /// A QMP socket, `<dir>/<name>.<ext>`. QEMU serves one client per socket: give one
    /// to each client (the daemon, the harness).
    pub fn qmp(mut self, ext: &str) -> Boot {
        self.qmp.push(self.file(ext));
        self
    }

    /// The guest agent's channel (Debian's qemu-ga runs in the guest), socket
    /// `<dir>/<name>.qga`.
    pub fn agent(mut self) -> Boot {
        self.agent = Some(self.file("qga"));
        self
    }

    /// A sparse disk image `<dir>/<name>.<kind>.img` of `mib` MiB (none when 0), with the
    /// serial `memtide-<kind>`: guest/init mounts the disk `memtide-data` for the
    /// workloads and swaps on the first other disk.
    pub fn disk(mut self, kind: &str, mib: u64) -> Boot {
        if mib > 0 {
            self.disks.push((kind.to_string(), mib));
        }
        self
    }

    /// A device (`-device spec`), e.g. [`BALLOON`].
    pub fn device(self, spec: &str) -> Boot {
        self.args(["-device", spec])
    }

    /// Other QEMU arguments (memory backends, devices), as given.
    pub fn args<I, S>(mut self, args: I) -> Boot
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Make [`Guest::wait_console`] give up as soon as `flag` is set (a SIGINT handler's).
    pub fn interruptible(mut self, flag: &'static AtomicBool) -> Boot {
        self.interrupted = Some(flag);
        self
    }

    fn file(&self, ext: &str) -> PathBuf {
        self.dir.join(format!("{}.{ext}", self.name))
    }

    fn image(&self, kind: &str) -> PathBuf {
        self.file(&format!("{kind}.img"))
    }

    /// The command that starts QEMU in the cgroup whose `cgroup.procs` is `procs`. It
    /// needs the disk images, which [`Boot::spawn`] creates.
    pub fn command(&self, procs: &Path) -> Command {
        let mut cmd = command_in(procs, &self.program);
        cmd.args(["-accel", "tcg,tb-size=16", "-cpu", "qemu64,+rdrand"])
            .args(["-m", &self.memory, "-smp", "1"])
            .args(["-nodefaults", "-display", "none", "-no-reboot"])
            .arg("-kernel")
            .arg(self.kernel_dir.join("vmlinuz"))
            .arg("-initrd")
            .arg(self.kernel_dir.join("initrd.img"))
            .arg("-append")
            .arg(format!("{KERNEL_ARGS}{}", self.kernel_args))
            .arg("-serial")
            .arg(format!("file:{}", self.file("serial").display()));
        for qmp in &self.qmp {
            cmd.arg("-qmp")
                .arg(format!("unix:{},server=on,wait=off", qmp.display()));
        }
        cmd.args(&self.args);
        for (kind, _) in &self.disks {
            cmd.arg("-drive")
                .arg(format!(
                    "if=none,id={kind},file={},format=raw",
                    self.image(kind).display()
                ))
                .arg("-device")
                .arg(format!("virtio-blk-pci,drive={kind},serial=memtide-{kind}"));
        }
        if let Some(agent) = &self.agent {
            cmd.arg("-chardev")
                .arg(format!(
                    "socket,id=qga0,path={},server=on,wait=off",
                    agent.display()
                ))
                .args(["-device", "virtio-serial-pci"])
                .args([
                    "-device",
                    "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0",
                ]);
        }
        cmd.stdin(Stdio::null());
        cmd
    }

    /// Create the disk images and start QEMU in the cgroup whose `cgroup.procs` is
    /// `procs` (its stdout and stderr are ours).
    pub fn spawn(self, procs: &Path) -> Result<Guest, Error> {
        self.spawn_with(procs, |_| {})
    }

    /// Like [`Boot::spawn`], with `configure` given the command last (for its output, or
    /// a `pre_exec`).
    pub fn spawn_with(
        self,
        procs: &Path,
        configure: impl FnOnce(&mut Command),
    ) -> Result<Guest, Error> {
        let serial = self.file("serial");
        for p in self.qmp.iter().chain(&self.agent).chain([&serial]) {
            let _ = std::fs::remove_file(p);
        }
        let mut images = Vec::new();
        for (kind, mib) in &self.disks {
            let img = self.image(kind);
            std::fs::File::create(&img)
                .and_then(|f| f.set_len(mib << 20))
                .map_err(Error::io(format!("creating {}", img.display())))?;
            images.push(img);
        }
        let mut cmd = self.command(procs);
        configure(&mut cmd);
        let what = format!(
            "starting {} (is QEMU installed?)",
            self.program.to_string_lossy()
        );
        let child = cmd.spawn().map_err(Error::io(what))?;
        Ok(Guest {
            name: self.name,
            qmp: self.qmp,
            agent: self.agent,
            serial,
            images,
            interrupted: self.interrupted,
            child,
        })
    }
}

/// A running test guest; killed, and its disk images and sockets removed, when dropped.
pub struct Guest {
    /// The VM's name.
    pub name: String,
    /// Its QMP sockets, in the order [`Boot::qmp`] added them.
    pub qmp: Vec<PathBuf>,
    /// The guest agent's socket, when it has the channel.
    pub agent: Option<PathBuf>,
    /// The serial console's file.
    pub serial: PathBuf,
    images: Vec<PathBuf>,
    interrupted: Option<&'static AtomicBool>,
    child: Child,
}

impl Guest {
    /// The QEMU process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `Err` with why, once QEMU has exited.
    pub fn alive(&mut self) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!("QEMU exited: {status}")),
            Err(e) => Err(format!("QEMU: {e}")),
        }
    }

    /// The whole console so far.
    pub fn console(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.serial).unwrap_or_default()).into_owned()
    }

    /// The last `n` lines of the console.
    pub fn console_tail(&self, n: usize) -> String {
        let text = self.console();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Wait until the console holds `count` lines containing `needle`; an error (with the
    /// console's last lines) when QEMU exits first, `limit` passes, or the flag given to
    /// [`Boot::interruptible`] is set.
    pub fn wait_console(
        &mut self,
        needle: &str,
        count: usize,
        limit: Duration,
    ) -> Result<(), Error> {
        let end = Instant::now() + limit;
        loop {
            let why = if self.interrupted.is_some_and(|f| f.load(Ordering::SeqCst)) {
                format!("interrupted while waiting for {needle:?}")
            } else if self.console().matches(needle).count() >= count {
                return Ok(());
            } else if let Err(why) = self.alive() {
                format!("{why} while waiting for {needle:?}")
            } else if Instant::now() >= end {
                format!("no {count}× {needle:?} on the console within {limit:?}")
            } else {
                std::thread::sleep(Duration::from_millis(200));
                continue;
            };
            return Err(Error::Console {
                name: self.name.clone(),
                why,
                console: self.console_tail(CONSOLE_TAIL),
            });
        }
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        let _ = self.child.kill(); // SIGKILL also ends a SIGSTOPped QEMU
        let _ = self.child.wait();
        for p in self.images.iter().chain(&self.qmp).chain(&self.agent) {
            let _ = std::fs::remove_file(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(cmd: &Command) -> Vec<String> {
        cmd.get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn the_command_line_joins_the_cgroup_and_names_files_after_the_guest() {
        let boot = Boot::new("a", Path::new("/run/t"), Path::new("/g"), "384")
            .kernel_args("memtide.workload=memknobs memtide.args=1+2 ")
            .qmp("qmp")
            .qmp("hqmp")
            .device(BALLOON)
            .disk("swap", 128)
            .disk("data", 0)
            .agent();
        let cmd = boot.command(Path::new("/cg/cgroup.procs"));
        assert_eq!(cmd.get_program(), "sh");
        let a = args(&cmd);
        assert_eq!(a[2..4], ["/cg/cgroup.procs", "qemu-system-x86_64"]);
        let newer = boot.clone().program("/opt/qemu10/qemu-system-x86_64");
        let newer = args(&newer.command(Path::new("/cg/cgroup.procs")));
        assert_eq!(newer[3], "/opt/qemu10/qemu-system-x86_64");
        assert_eq!(newer[4..], a[4..], "the rest as it was");
        let after = |flag: &str| {
            a.windows(2)
                .filter(|w| w[0] == flag)
                .map(|w| w[1].clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(after("-m"), ["384"]);
        assert_eq!(after("-kernel"), ["/g/vmlinuz"]);
        assert_eq!(
            after("-append"),
            [format!(
                "{KERNEL_ARGS} memtide.workload=memknobs memtide.args=1+2"
            )]
        );
        assert_eq!(after("-serial"), ["file:/run/t/a.serial"]);
        assert_eq!(
            after("-qmp"),
            [
                "unix:/run/t/a.qmp,server=on,wait=off",
                "unix:/run/t/a.hqmp,server=on,wait=off"
            ]
        );
        assert_eq!(
            after("-drive"),
            ["if=none,id=swap,file=/run/t/a.swap.img,format=raw"],
            "no image of 0 MiB"
        );
        assert_eq!(
            after("-device"),
            [
                BALLOON,
                "virtio-blk-pci,drive=swap,serial=memtide-swap",
                "virtio-serial-pci",
                "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0"
            ]
        );
        assert_eq!(
            after("-chardev"),
            ["socket,id=qga0,path=/run/t/a.qga,server=on,wait=off"]
        );
    }

    #[test]
    fn a_missing_guest_says_how_to_build_it() {
        let dir = tempfile::tempdir().unwrap();
        let e = guest_dir(Some(dir.path())).unwrap_err().to_string();
        assert!(e.contains("run guest/build.sh"), "{e}");
    }
}
