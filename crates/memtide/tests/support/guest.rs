//! The QEMU test guest for a test: memtide-testbed's [`Boot`] with the tests' defaults
//! (a QMP socket, the guest agent, a 128 MiB swap disk, a workload), failing the test on
//! errors.

use super::{guest_dir, signal};
use memtide_testbed::{Boot, BALLOON};
use std::path::Path;
use std::time::Duration;

/// A running guest, killed on drop; its files and [`memtide_testbed::Guest::pid`] are
/// memtide-testbed's.
pub struct Guest(memtide_testbed::Guest);

impl Guest {
    /// Boot a guest of `mem_mib` with a balloon in the cgroup whose `cgroup.procs` is
    /// `procs`, running `workload` with `args` (guest/init's convention: '+' between
    /// arguments). Its sockets, disk and console go to `dir`.
    pub fn boot(
        name: &str,
        dir: &Path,
        procs: &Path,
        mem_mib: u64,
        workload: &str,
        args: &str,
    ) -> Guest {
        let balloon = ["-device", BALLOON];
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
    /// balloon and any other devices in `devices`, `append` added to the kernel command
    /// line, and a second QMP socket for the test itself ([`Guest::harness_qmp`]).
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
        let boot = Guest::with_workload(name, dir, mem, workload, args, append)
            .qmp("hqmp")
            .args(devices);
        Guest::spawn(boot, procs)
    }

    /// Like [`Guest::boot_with`] with no balloon, booting the kernel and initramfs in
    /// `kernel_dir` rather than the test guest's (e.g. guest/build-idle-kernel.sh's),
    /// `append` added to its command line.
    pub fn boot_kernel(
        name: &str,
        dir: &Path,
        procs: &Path,
        kernel_dir: &Path,
        mem_mib: u64,
        devices: &[&str],
        append: &str,
    ) -> Guest {
        let boot = Boot::new(name, dir, kernel_dir, mem_mib.to_string())
            .qmp("qmp")
            .args(devices)
            .kernel_args(append);
        Guest::spawn(boot, procs)
    }

    /// Like [`Guest::boot`], with a second QMP socket for the test itself
    /// ([`Guest::harness_qmp`]).
    pub fn boot_watched(
        name: &str,
        dir: &Path,
        procs: &Path,
        mem_mib: u64,
        workload: &str,
        args: &str,
    ) -> Guest {
        let mem = mem_mib.to_string();
        let boot = Guest::with_workload(name, dir, &mem, workload, args, "")
            .qmp("hqmp")
            .device(BALLOON);
        Guest::spawn(boot, procs)
    }

    /// Like [`Guest::boot`], and the command line that started it (program first), to
    /// start it again the same way (`[[vm]] launch`, for a snapshot's restore).
    pub fn boot_restorable(
        name: &str,
        dir: &Path,
        procs: &Path,
        mem_mib: u64,
        workload: &str,
        args: &str,
    ) -> (Guest, Vec<String>) {
        let boot = Guest::with_workload(name, dir, &mem_mib.to_string(), workload, args, "");
        Guest::restorable(boot, procs)
    }

    /// Like [`Guest::boot_restorable`] with no workload, under the QEMU `program` whose
    /// firmware is in `firmware` (another version than the system's).
    pub fn boot_restorable_on(
        program: &Path,
        firmware: &Path,
        name: &str,
        dir: &Path,
        procs: &Path,
        mem_mib: u64,
    ) -> (Guest, Vec<String>) {
        let boot = Guest::with_workload(name, dir, &mem_mib.to_string(), "", "", "")
            .program(program)
            .args([std::ffi::OsStr::new("-L"), firmware.as_os_str()]);
        Guest::restorable(boot, procs)
    }

    /// `boot` equipped and started, and the command line that started it.
    fn restorable(boot: Boot, procs: &Path) -> (Guest, Vec<String>) {
        let boot = Guest::equipped(boot.device(BALLOON));
        let command = boot.command(procs);
        let text = |s: &std::ffi::OsStr| s.to_str().expect("a UTF-8 argument").to_string();
        let launch = std::iter::once(text(command.get_program()))
            .chain(command.get_args().map(text))
            .collect();
        (Guest::started(boot, procs), launch)
    }

    /// Like [`Guest::boot`] with no workload and no swap disk: its agent reports no swap.
    pub fn boot_without_swap(name: &str, dir: &Path, procs: &Path, mem_mib: u64) -> Guest {
        let boot = Guest::with_workload(name, dir, &mem_mib.to_string(), "", "", "");
        Guest::started(boot.device(BALLOON).agent(), procs)
    }

    /// Like [`Guest::boot_without_swap`], swapping to zram of `zram_mib` instead (guest/init's
    /// `memtide.zram`).
    pub fn boot_with_zram(
        name: &str,
        dir: &Path,
        procs: &Path,
        mem_mib: u64,
        zram_mib: u64,
    ) -> Guest {
        let zram = format!("memtide.zram={zram_mib}");
        let boot = Guest::with_workload(name, dir, &mem_mib.to_string(), "", "", &zram);
        Guest::started(boot.device(BALLOON).agent(), procs)
    }

    /// The tests' guest running `workload` with `args`, with its QMP socket.
    fn with_workload(
        name: &str,
        dir: &Path,
        mem: &str,
        workload: &str,
        args: &str,
        append: &str,
    ) -> Boot {
        Boot::new(name, dir, &guest_dir(), mem)
            .kernel_args(&format!(
                "memtide.workload={workload} memtide.args={args} {append}"
            ))
            .qmp("qmp")
    }

    /// Start `boot` with the tests' swap disk and guest agent in the cgroup whose
    /// `cgroup.procs` is `procs`.
    fn spawn(boot: Boot, procs: &Path) -> Guest {
        Guest::started(Guest::equipped(boot), procs)
    }

    /// `boot` with the tests' swap disk and guest agent.
    fn equipped(boot: Boot) -> Boot {
        boot.disk("swap", 128).agent()
    }

    /// Start `boot` in the cgroup whose `cgroup.procs` is `procs`.
    fn started(boot: Boot, procs: &Path) -> Guest {
        Guest(boot.spawn(procs).unwrap_or_else(|e| panic!("{e}")))
    }

    /// The test's own QMP socket (see [`Guest::boot_watched`]).
    pub fn harness_qmp(&self) -> &Path {
        &self.0.qmp[1]
    }

    /// Its QMP socket.
    pub fn qmp(&self) -> &Path {
        &self.0.qmp[0]
    }

    /// The guest agent's socket (Debian's qemu-ga runs in the guest).
    pub fn agent(&self) -> &Path {
        self.0.agent.as_deref().expect("booted with the agent")
    }

    /// Wait until the console has `count` lines containing `needle`.
    pub fn wait_console(&mut self, needle: &str, count: usize, limit: Duration) {
        self.0
            .wait_console(needle, count, limit)
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// Send a signal to QEMU.
    pub fn signal(&self, sig: &str) {
        signal(self.pid(), sig);
    }

    /// True while QEMU runs.
    pub fn running(&mut self) -> bool {
        self.0.alive().is_ok()
    }
}

impl std::ops::Deref for Guest {
    type Target = memtide_testbed::Guest;

    fn deref(&self) -> &memtide_testbed::Guest {
        &self.0
    }
}
