//! A QEMU test guest (guest/build.sh's kernel and initramfs, guest/README.md's command
//! line) started in the scenario's cgroup, with two QMP sockets (one for the daemon, one
//! for the harness: QEMU serves one client per socket), the guest agent's channel, and
//! sparse swap and data disks. Killed, and its disk images removed, when dropped.

use crate::scenario::VmSpec;
use anyhow::{bail, Context};
use memtide_adapters::qga::GuestAgent;
use memtide_adapters::qmp::QmpClient;
use serde_json::json;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;

/// Set by SIGINT/SIGTERM: every wait gives up, and everything started is cleaned up.
pub static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Fail if the harness was interrupted.
pub fn check_interrupted() -> anyhow::Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(())
}

/// Sleep `d`, waking early (with an error) if interrupted.
pub fn sleep(d: Duration) -> anyhow::Result<()> {
    let end = Instant::now() + d;
    loop {
        check_interrupted()?;
        let now = Instant::now();
        if now >= end {
            return Ok(());
        }
        std::thread::sleep((end - now).min(Duration::from_millis(200)));
    }
}

const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// A running guest.
pub struct Guest {
    /// The VM's name.
    pub name: String,
    /// Its workload (`None`: idle).
    pub workload: Option<String>,
    /// QMP socket for the daemon.
    pub qmp_daemon: PathBuf,
    /// QMP socket for the harness.
    pub qmp_harness: PathBuf,
    /// The guest agent's socket, when attached.
    pub agent: Option<PathBuf>,
    /// The serial console log.
    pub serial: PathBuf,
    images: Vec<PathBuf>,
    child: Child,
    /// Console bytes already handed out as lines.
    read_to: u64,
    qmp: Option<QmpClient>,
}

impl Guest {
    /// Boot `spec` in `dir` with the kernel and initramfs of `kernel_dir`, joining the
    /// cgroup whose `cgroup.procs` is `procs`. `idle`: without its workload (to measure
    /// the guest's own base usage).
    pub fn boot(
        spec: &VmSpec,
        dir: &Path,
        kernel_dir: &Path,
        procs: &Path,
        idle: bool,
    ) -> anyhow::Result<Guest> {
        let name = &spec.name;
        let qmp_daemon = dir.join(format!("{name}.qmp"));
        let qmp_harness = dir.join(format!("{name}.hqmp"));
        let agent = spec.agent.then(|| dir.join(format!("{name}.qga")));
        let serial = dir.join(format!("{name}.serial"));
        for p in [&qmp_daemon, &qmp_harness, &serial] {
            let _ = std::fs::remove_file(p);
        }
        let mut images = Vec::new();
        let mut disks: Vec<String> = Vec::new();
        // Swap first (vda), then data (vdb): the serials decide, not the order.
        for (kind, mib, serial_no) in [
            ("swap", spec.swap_mib, "memtide-swap"),
            ("data", spec.data_mib, "memtide-data"),
        ] {
            if mib == 0 {
                continue;
            }
            let img = dir.join(format!("{name}.{kind}.img"));
            let f = std::fs::File::create(&img)
                .with_context(|| format!("creating {}", img.display()))?;
            f.set_len(mib << 20)?;
            disks.push("-drive".into());
            disks.push(format!(
                "if=none,id={kind},file={},format=raw",
                img.display()
            ));
            disks.push("-device".into());
            disks.push(format!("virtio-blk-pci,drive={kind},serial={serial_no}"));
            images.push(img);
        }
        let workload = if idle { None } else { spec.workload.clone() };
        let append = format!(
            "console=ttyS0 no_timer_check panic=-1 quiet cryptomgr.notests ipv6.disable=1 {}",
            if idle {
                String::new()
            } else {
                spec.kernel_args()
            }
        );
        let mut cmd = Command::new("sh");
        // Join the cgroup before exec, so every byte QEMU allocates is charged to it.
        cmd.args(["-c", "echo $$ > \"$0\" && exec \"$@\""])
            .arg(procs)
            .arg("qemu-system-x86_64")
            .args(["-accel", "tcg,tb-size=16", "-cpu", "qemu64,+rdrand"])
            .args(["-m", &spec.memory_mib.to_string(), "-smp", "1"])
            .args(["-nodefaults", "-display", "none", "-no-reboot"])
            .arg("-kernel")
            .arg(kernel_dir.join("vmlinuz"))
            .arg("-initrd")
            .arg(kernel_dir.join("initrd.img"))
            .args(["-append", append.trim_end()])
            .arg("-serial")
            .arg(format!("file:{}", serial.display()))
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", qmp_daemon.display()))
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", qmp_harness.display()))
            .args([
                "-device",
                "virtio-balloon-pci,id=balloon0,deflate-on-oom=on",
            ])
            .args(&disks);
        if let Some(agent) = &agent {
            let _ = std::fs::remove_file(agent);
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
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join(format!("{name}.qemu.log")))?);
        // SAFETY: prctl is async-signal-safe; it only asks the kernel to kill QEMU when
        // the harness's main thread (which spawns every guest) dies, so that no QEMU
        // outlives a harness killed with SIGKILL.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .context("starting qemu-system-x86_64 (is QEMU installed?)")?;
        Ok(Guest {
            name: name.clone(),
            workload,
            qmp_daemon,
            qmp_harness,
            agent,
            serial,
            images,
            child,
            read_to: 0,
            qmp: None,
        })
    }

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

    /// The last lines of the console, for error messages.
    pub fn console_tail(&self, n: usize) -> String {
        let text = self.console();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Complete console lines written since the last call.
    pub fn new_lines(&mut self) -> Vec<String> {
        let Ok(mut f) = std::fs::File::open(&self.serial) else {
            return Vec::new();
        };
        let mut buf = Vec::new();
        if f.seek(SeekFrom::Start(self.read_to)).is_err() || f.read_to_end(&mut buf).is_err() {
            return Vec::new();
        }
        let Some(end) = buf.iter().rposition(|b| *b == b'\n') else {
            return Vec::new();
        };
        self.read_to += end as u64 + 1;
        String::from_utf8_lossy(&buf[..end])
            .lines()
            .map(|l| l.trim_end_matches('\r').to_string())
            .collect()
    }

    /// Wait until the console holds `count` lines containing `needle`.
    pub fn wait_console(
        &mut self,
        needle: &str,
        count: usize,
        limit: Duration,
    ) -> anyhow::Result<()> {
        let end = Instant::now() + limit;
        loop {
            check_interrupted()?;
            if self.console().matches(needle).count() >= count {
                return Ok(());
            }
            if let Err(why) = self.alive() {
                bail!(
                    "guest {}: {why} while waiting for {needle:?}; console:\n{}",
                    self.name,
                    self.console_tail(30)
                );
            }
            if Instant::now() >= end {
                bail!(
                    "guest {}: no {count}× {needle:?} on the console within {limit:?}; console:\n{}",
                    self.name,
                    self.console_tail(30)
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The harness's own QMP session (connected on first use).
    fn qmp(&mut self, rt: &Runtime) -> anyhow::Result<&mut QmpClient> {
        if self.qmp.as_ref().is_some_and(|q| q.is_closed()) {
            self.qmp = None;
        }
        if self.qmp.is_none() {
            let end = Instant::now() + Duration::from_secs(20);
            let client = loop {
                check_interrupted()?;
                match rt.block_on(QmpClient::connect(&self.qmp_harness, CALL_TIMEOUT)) {
                    Ok(c) => break c,
                    Err(e) if Instant::now() >= end => {
                        bail!(
                            "guest {}: QMP {}: {e}",
                            self.name,
                            self.qmp_harness.display()
                        )
                    }
                    Err(_) => {
                        if let Err(why) = self.alive() {
                            bail!("guest {}: {why}", self.name);
                        }
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            };
            self.qmp = Some(client);
        }
        Ok(self.qmp.as_mut().expect("connected above"))
    }

    /// Ask the balloon for `mib` (returns at once; the guest gets there in its own time).
    pub fn balloon(&mut self, rt: &Runtime, mib: u64) -> anyhow::Result<()> {
        let name = self.name.clone();
        let qmp = self.qmp(rt)?;
        rt.block_on(qmp.execute("balloon", Some(json!({"value": mib << 20}))))
            .with_context(|| format!("guest {name}: balloon to {mib} MiB"))?;
        Ok(())
    }

    /// The balloon's `actual`, in MiB.
    pub fn actual_mib(&mut self, rt: &Runtime) -> anyhow::Result<f64> {
        let name = self.name.clone();
        let qmp = self.qmp(rt)?;
        let v = rt
            .block_on(qmp.execute("query-balloon", None))
            .with_context(|| format!("guest {name}: query-balloon"))?;
        v.get("actual")
            .and_then(serde_json::Value::as_u64)
            .map(|b| b as f64 / (1u64 << 20) as f64)
            .with_context(|| format!("guest {name}: query-balloon returned {v}"))
    }

    /// Read guest files through the agent (a session of its own: the daemon must not be
    /// holding the agent's socket, QEMU serves one client at a time).
    pub fn agent_read(&mut self, rt: &Runtime, files: &[&str]) -> anyhow::Result<Vec<String>> {
        let Some(path) = self.agent.clone() else {
            bail!("guest {}: no guest agent", self.name);
        };
        let mut last = None;
        for _ in 0..5 {
            check_interrupted()?;
            let result = rt.block_on(async {
                let mut agent = GuestAgent::connect(&path, CALL_TIMEOUT).await?;
                let mut out = Vec::new();
                for f in files {
                    out.push(agent.read_file(f).await?);
                }
                Ok::<_, memtide_adapters::qga::QgaError>(out)
            });
            match result {
                Ok(out) => return Ok(out),
                Err(e) => last = Some(e),
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        bail!(
            "guest {}: guest agent {}: {}",
            self.name,
            path.display(),
            last.map(|e| e.to_string()).unwrap_or_default()
        )
    }
}

/// QEMU processes on the host that are not in `ours`: other people's guests competing
/// for the same cores.
pub fn foreign_qemus(ours: &[u32]) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| !ours.contains(pid))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.starts_with("qemu-system"))
        })
        .count()
}

/// CPU time (user + system) of a process and its threads so far, in seconds.
pub fn process_cpu_s(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces: fields start after its closing parenthesis.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / clock_ticks())
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 {
        hz as f64
    } else {
        100.0
    }
}

/// Busy CPU time of the whole host so far (everything but idle and iowait; steal counts
/// as busy: the cores were not ours), in seconds.
pub fn host_busy_s() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    let busy: f64 = [0, 1, 2, 5, 6, 7].iter().filter_map(|i| v.get(*i)).sum();
    Some(busy / clock_ticks())
}

/// Measures the CPU the host spends on things that are not the harness or its guests.
#[derive(Default)]
pub struct CpuMeter {
    last: Option<(std::time::Instant, f64, f64)>,
}

impl CpuMeter {
    /// Cores used by others since the last call (`ours`: the guests' QEMU pids; the
    /// harness process counts as ours too).
    pub fn others(&mut self, ours: &[u32]) -> Option<f64> {
        let now = std::time::Instant::now();
        let busy = host_busy_s()?;
        let mine = process_cpu_s("self").unwrap_or(0.0)
            + ours
                .iter()
                .filter_map(|p| process_cpu_s(&p.to_string()))
                .sum::<f64>();
        let previous = self.last.replace((now, busy, mine));
        let (then, busy0, mine0) = previous?;
        let secs = now.duration_since(then).as_secs_f64();
        (secs > 0.0).then(|| (((busy - busy0) - (mine - mine0)) / secs).max(0.0))
    }
}

/// The host's 1-minute load average.
pub fn loadavg() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

impl Drop for Guest {
    fn drop(&mut self) {
        self.qmp = None;
        let _ = self.child.kill();
        let _ = self.child.wait();
        for img in &self.images {
            let _ = std::fs::remove_file(img);
        }
        for p in [&self.qmp_daemon, &self.qmp_harness] {
            let _ = std::fs::remove_file(p);
        }
        if let Some(a) = &self.agent {
            let _ = std::fs::remove_file(a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_read_for_the_host_and_for_a_process() {
        let mine = process_cpu_s("self").unwrap();
        assert!(mine >= 0.0);
        assert!(host_busy_s().unwrap() > 0.0);
        let mut m = CpuMeter::default();
        assert_eq!(m.others(&[]), None, "the first reading only sets the start");
        std::thread::sleep(Duration::from_millis(50));
        assert!(m.others(&[]).unwrap() >= 0.0);
        assert!(loadavg().is_some());
        assert_eq!(foreign_qemus(&[]), foreign_qemus(&[]).min(1000));
    }
}
