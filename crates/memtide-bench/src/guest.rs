//! A QEMU test guest (memtide-testbed's) started in the scenario's cgroup, with two QMP
//! sockets (one for the daemon, one for the harness: QEMU serves one client per socket),
//! the guest agent's channel, and sparse swap and data disks. Killed, and its disk images
//! removed, when dropped. Also the host's CPU and load figures the harness records.

use crate::scenario::VmSpec;
use anyhow::{bail, Context};
use memtide_adapters::qga::GuestAgent;
use memtide_adapters::qmp::{virtio_mem, QmpClient};
use memtide_testbed::{Boot, BALLOON};
use serde_json::json;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::Stdio;
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

/// A running guest: memtide-testbed's (its process, files and console, through `Deref`)
/// with the harness's QMP session and console reader.
pub struct Guest {
    /// Its workload (`None`: idle).
    pub workload: Option<String>,
    /// QMP socket for the daemon.
    pub qmp_daemon: PathBuf,
    /// QMP socket for the harness.
    qmp_harness: PathBuf,
    /// Console bytes already handed out as lines.
    read_to: u64,
    /// Whether it has a virtio-mem device (its memory is the balloon's and the device's).
    virtio_mem: bool,
    /// The harness's QMP session; closed before QEMU is killed (fields drop in order).
    session: Option<QmpClient>,
    vm: memtide_testbed::Guest,
}

impl Guest {
    /// Boot `spec` in `dir` with the kernel and initramfs of `kernel_dir`, joining the
    /// cgroup whose `cgroup.procs` is `procs`. `idle`: without its workload (to measure
    /// the guest's own base usage). QEMU's stderr goes to `<dir>/<name>.qemu.log`.
    pub fn boot(
        spec: &VmSpec,
        dir: &Path,
        kernel_dir: &Path,
        procs: &Path,
        idle: bool,
    ) -> anyhow::Result<Guest> {
        let name = &spec.name;
        let balloon = match spec.free_page_reporting {
            true => format!("{BALLOON},free-page-reporting=on"),
            false => BALLOON.to_string(),
        };
        let memory = match spec.virtio_mem_mib {
            0 => spec.memory_mib.to_string(),
            plugged => format!("{}M,maxmem={}M", spec.memory_mib - plugged, spec.memory_mib),
        };
        let mut boot = Boot::new(name, dir, kernel_dir, memory)
            .qmp("qmp")
            .qmp("hqmp")
            .device(&balloon)
            // Swap first (vda), then data (vdb): the serials decide, not the order.
            .disk("swap", spec.swap_mib)
            .disk("data", spec.data_mib)
            .interruptible(&INTERRUPTED);
        if !idle {
            boot = boot.kernel_args(&spec.kernel_args());
        }
        boot = boot.kernel_args(&spec.extra_kernel_args);
        if spec.virtio_mem_mib > 0 {
            // Plugged whole at boot, onlined movable so that it can be unplugged again.
            let mib = spec.virtio_mem_mib;
            boot = boot
                .args([
                    "-object".to_string(),
                    format!("memory-backend-ram,id=vmem0,size={mib}M"),
                ])
                .device(&format!(
                    "virtio-mem-pci,id=vmem0dev,memdev=vmem0,requested-size={mib}M"
                ))
                // Without a bounce buffer: the device's memory lies above 4 GiB, where
                // the guest would otherwise set 64 MiB of its base memory aside for one
                // (its virtio devices need none).
                .kernel_args("memhp_default_state=online_movable swiotlb=noforce");
        }
        if spec.agent {
            boot = boot.agent();
        }
        let log = dir.join(format!("{name}.qemu.log"));
        let stderr =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let vm = boot.spawn_with(procs, |cmd| {
            cmd.stdout(Stdio::null()).stderr(stderr);
            // The harness's main thread spawns every guest.
            memtide_bench::dies_with_harness(cmd);
        })?;
        Ok(Guest {
            workload: if idle { None } else { spec.workload.clone() },
            qmp_daemon: vm.qmp[0].clone(),
            qmp_harness: vm.qmp[1].clone(),
            read_to: 0,
            virtio_mem: spec.virtio_mem_mib > 0,
            session: None,
            vm,
        })
    }

    /// The QEMU process id.
    pub fn pid(&self) -> u32 {
        self.vm.pid()
    }

    /// Complete console lines written since the last call.
    pub fn new_lines(&mut self) -> Vec<String> {
        let Ok(mut f) = std::fs::File::open(&self.vm.serial) else {
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

    /// The harness's own QMP session (connected on first use).
    fn qmp(&mut self, rt: &Runtime) -> anyhow::Result<&mut QmpClient> {
        if self.session.as_ref().is_some_and(|q| q.is_closed()) {
            self.session = None;
        }
        if self.session.is_none() {
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
            self.session = Some(client);
        }
        Ok(self.session.as_mut().expect("connected above"))
    }

    /// Ask the balloon for `mib` (returns at once; the guest gets there in its own time).
    pub fn balloon(&mut self, rt: &Runtime, mib: u64) -> anyhow::Result<()> {
        let name = self.name.clone();
        let qmp = self.qmp(rt)?;
        rt.block_on(qmp.execute("balloon", Some(json!({"value": mib << 20}))))
            .with_context(|| format!("guest {name}: balloon to {mib} MiB"))?;
        Ok(())
    }

    /// The guest's memory, in MiB: the balloon's `actual`, plus what its virtio-mem
    /// device has plugged (QEMU's balloon leaves virtio-mem's memory out).
    pub fn actual_mib(&mut self, rt: &Runtime) -> anyhow::Result<f64> {
        let name = self.name.clone();
        let virtio_mem = self.virtio_mem;
        let qmp = self.qmp(rt)?;
        let v = rt
            .block_on(qmp.execute("query-balloon", None))
            .with_context(|| format!("guest {name}: query-balloon"))?;
        let mut bytes = v
            .get("actual")
            .and_then(serde_json::Value::as_u64)
            .with_context(|| format!("guest {name}: query-balloon returned {v}"))?;
        if virtio_mem {
            let devices = rt
                .block_on(qmp.execute("query-memory-devices", None))
                .with_context(|| format!("guest {name}: query-memory-devices"))?;
            let (_, device) = virtio_mem::parse(&devices, None)
                .with_context(|| format!("guest {name}: no virtio-mem device in {devices}"))?;
            bytes += device.plugged.0;
        }
        Ok(bytes as f64 / (1u64 << 20) as f64)
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

/// Process `pid`'s anonymous memory in huge pages (`AnonHugePages` of its smaps_rollup),
/// in MiB.
pub fn anon_huge_mib(pid: u32) -> Option<f64> {
    let huge = memtide_adapters::hugepages::anon_huge(Path::new(&format!("/proc/{pid}"))).ok()?;
    Some(huge.as_f64() / (1u64 << 20) as f64)
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

impl std::ops::Deref for Guest {
    type Target = memtide_testbed::Guest;

    fn deref(&self) -> &memtide_testbed::Guest {
        &self.vm
    }
}

impl std::ops::DerefMut for Guest {
    fn deref_mut(&mut self) -> &mut memtide_testbed::Guest {
        &mut self.vm
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

    #[test]
    fn a_processs_huge_pages_are_read_from_its_smaps_rollup() {
        let huge = anon_huge_mib(std::process::id()).expect("AnonHugePages of this process");
        assert!(huge >= 0.0);
        assert_eq!(anon_huge_mib(u32::MAX), None, "no such process");
    }
}
