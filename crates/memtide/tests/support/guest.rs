//! A QEMU test guest (guest/build.sh's kernel and initramfs) started in a cgroup.

use super::{guest_dir, signal, wait_for};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running guest; killed on drop.
pub struct Guest {
    pub name: String,
    pub qmp: PathBuf,
    /// The guest agent's socket (Debian's qemu-ga runs in the guest).
    pub agent: PathBuf,
    pub serial: PathBuf,
    child: Child,
}

impl Guest {
    /// Boot a guest of `mem_mib` in the cgroup whose `cgroup.procs` is `procs`, running
    /// `workload` with `args` (guest/init's convention: '+' between arguments). Its QMP
    /// socket and serial log go to `dir`.
    pub fn boot(
        name: &str,
        dir: &Path,
        procs: &Path,
        mem_mib: u64,
        workload: &str,
        args: &str,
    ) -> Guest {
        let balloon = [
            "-device",
            "virtio-balloon-pci,id=balloon0,deflate-on-oom=on",
        ];
        Guest::boot_with(
            name,
            dir,
            procs,
            &mem_mib.to_string(),
            workload,
            args,
            &balloon,
            "",
        )
    }

    /// Like [`Guest::boot`], with QEMU's `-m` given as text (e.g. `256M,maxmem=1G`), the
    /// balloon and any other devices in `devices`, and `append` added to the kernel
    /// command line.
    #[allow(clippy::too_many_arguments)]
    pub fn boot_with(
        name: &str,
        dir: &Path,
        procs: &Path,
        mem: &str,
        workload: &str,
        args: &str,
        devices: &[&str],
        append: &str,
    ) -> Guest {
        let kernel = guest_dir();
        let qmp = dir.join(format!("{name}.qmp"));
        let agent = dir.join(format!("{name}.qga"));
        let serial = dir.join(format!("{name}.serial"));
        let swap = dir.join(format!("{name}.swap"));
        std::fs::File::create(&swap)
            .unwrap()
            .set_len(128 << 20)
            .unwrap();
        let append = format!(
            "console=ttyS0 no_timer_check panic=-1 quiet cryptomgr.notests ipv6.disable=1 \
             memtide.workload={workload} memtide.args={args} {append}"
        );
        // Join the cgroup before exec, so every byte QEMU allocates is charged to it.
        let child = Command::new("sh")
            .args(["-c", "echo $$ > \"$0\" && exec \"$@\""])
            .arg(procs)
            .arg("qemu-system-x86_64")
            .args([
                "-accel",
                "tcg,tb-size=16",
                "-cpu",
                "qemu64,+rdrand",
                "-smp",
                "1",
            ])
            .args(["-m", mem, "-nodefaults", "-display", "none", "-no-reboot"])
            .arg("-kernel")
            .arg(kernel.join("vmlinuz"))
            .arg("-initrd")
            .arg(kernel.join("initrd.img"))
            .args(["-append", &append])
            .arg("-serial")
            .arg(format!("file:{}", serial.display()))
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", qmp.display()))
            .args(devices)
            .arg("-chardev")
            .arg(format!(
                "socket,id=qga0,path={},server=on,wait=off",
                agent.display()
            ))
            .args(["-device", "virtio-serial-pci"])
            .args([
                "-device",
                "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0",
            ])
            .arg("-drive")
            .arg(format!(
                "if=none,id=swap,file={},format=raw",
                swap.display()
            ))
            .args(["-device", "virtio-blk-pci,drive=swap"])
            .stdin(Stdio::null())
            .spawn()
            .expect("starting qemu-system-x86_64 (is QEMU installed?)");
        Guest {
            name: name.to_string(),
            qmp,
            agent,
            serial,
            child,
        }
    }

    /// The QEMU process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The serial console so far.
    pub fn console(&self) -> String {
        std::fs::read_to_string(&self.serial).unwrap_or_default()
    }

    /// Wait until the console has `count` lines containing `needle`.
    pub fn wait_console(&self, needle: &str, count: usize, limit: Duration) {
        let seen = wait_for(limit, || {
            (self.console().matches(needle).count() >= count).then_some(())
        });
        assert!(
            seen.is_some(),
            "guest {}: no {count}× {needle:?} on the console within {limit:?}; console:\n{}",
            self.name,
            self.console()
        );
    }

    /// Send a signal to QEMU.
    pub fn signal(&self, sig: &str) {
        signal(self.pid(), sig);
    }

    /// True while QEMU runs.
    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        let _ = self.child.kill(); // SIGKILL also ends a SIGSTOPped QEMU
        let _ = self.child.wait();
    }
}
