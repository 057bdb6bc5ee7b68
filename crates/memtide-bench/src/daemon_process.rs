//! The daemon under test, as its own process (the release binary), and what is measured
//! of it while the harness's endpoints work on it. Tick lengths come from the daemon's own
//! counters (the longest tick, ticks longer than the interval); whether a watched VM was
//! managed in each tick, from its recording (every tick's decision), where polling the
//! status would miss a short tick right after a long one.

use anyhow::{bail, Context};
use serde::Serialize;
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The release `memtide` beside the running harness; an error naming `script`, which
/// builds both, when it is missing.
pub fn release_binary(script: &str) -> anyhow::Result<PathBuf> {
    let memtide = std::env::current_exe()?.with_file_name("memtide");
    anyhow::ensure!(
        memtide.exists(),
        "{} is missing: build it first ({script} does)",
        memtide.display()
    );
    Ok(memtide)
}

/// How the daemon is started.
pub struct Launch {
    /// RLIMIT_NOFILE, soft and hard (default: the harness's own).
    pub nofile: Option<u64>,
    /// Record every tick (needed to watch a VM in each).
    pub record: bool,
}

/// A running `memtide run`; stopped when dropped.
pub struct Daemon {
    child: Child,
    http_port: u16,
    socket: PathBuf,
    recordings: Option<PathBuf>,
    files: [PathBuf; 2],
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What one case measured.
#[derive(Serialize)]
pub struct Measured {
    /// The daemon's peak resident memory (VmHWM).
    pub peak_rss_mib: f64,
    /// The longest tick (sampling, deciding, acting) since the daemon started.
    pub max_tick_ms: f64,
    /// Ticks longer than the interval while measured.
    pub late_ticks: u64,
    /// Event log and stderr bytes written per minute while measuring.
    pub log_bytes_per_min: f64,
    /// The watched VM was sampled and managed on every tick (when one is watched).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub honest_vm_managed: Option<bool>,
    /// Ticks in which the watched VM was not managed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub honest_unmanaged_ticks: Option<u64>,
    /// Ticks measured.
    pub ticks: u64,
    /// The daemon's CPU seconds while measured.
    pub cpu_s: f64,
    /// The daemon's CPU time over wall time.
    pub cpu_share: f64,
    /// /metrics had a series that memtide does not export.
    pub metrics_injected: bool,
}

impl Daemon {
    /// Start `memtide` with `config` completed by a daemon section for files in `dir`.
    pub fn start(
        memtide: &Path,
        dir: &Path,
        config: &str,
        http_port: u16,
        launch: &Launch,
    ) -> anyhow::Result<Self> {
        let socket = dir.join("memtide.sock");
        let events = dir.join("events.jsonl");
        let log = dir.join("daemon.log");
        let recordings = launch.record.then(|| dir.join("recordings"));
        let mut text = format!(
            "{config}\n[daemon]\nsocket = {:?}\nevent_log = {:?}\nstate_file = {:?}\nhttp = \"127.0.0.1:{http_port}\"\n",
            socket.display().to_string(),
            events.display().to_string(),
            dir.join("state.json").display().to_string(),
        );
        if let Some(dir) = &recordings {
            text.push_str(&format!("record_dir = {:?}\n", dir.display().to_string()));
        }
        let path = dir.join("memtide.toml");
        std::fs::write(&path, text)?;
        let mut cmd = Command::new(memtide);
        cmd.arg("run")
            .arg("--config")
            .arg(&path)
            .env("MEMTIDE_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?);
        let limit = launch.nofile.map(|n| libc::rlimit {
            rlim_cur: n,
            rlim_max: n,
        });
        // SAFETY: setrlimit and prctl are async-signal-safe. The daemon dies with the
        // harness however it ends.
        unsafe {
            cmd.pre_exec(move || {
                if let Some(limit) = &limit {
                    if libc::setrlimit(libc::RLIMIT_NOFILE, limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", memtide.display()))?;
        let daemon = Daemon {
            child,
            http_port,
            socket,
            recordings,
            files: [events, log],
        };
        let up = Instant::now();
        while daemon.status().is_err() {
            if up.elapsed() > Duration::from_secs(10) {
                bail!("the daemon did not come up:\n{}", daemon.log_tail());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(daemon)
    }

    /// The status, through the control socket.
    pub fn status(&self) -> anyhow::Result<Value> {
        let mut stream = UnixStream::connect(&self.socket)?;
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        stream.write_all(b"{\"command\": \"status\"}\n")?;
        let mut line = String::new();
        BufReader::new(stream).read_line(&mut line)?;
        Ok(serde_json::from_str(&line)?)
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.files[1]).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    fn log_bytes(&self) -> u64 {
        self.files
            .iter()
            .map(|f| std::fs::metadata(f).map_or(0, |m| m.len()))
            .sum()
    }

    fn proc_file(&self, name: &str) -> String {
        std::fs::read_to_string(format!("/proc/{}/{name}", self.child.id())).unwrap_or_default()
    }

    /// CPU seconds used so far (0 when unreadable).
    fn cpu_s(&self) -> f64 {
        // SAFETY: sysconf has no preconditions.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        memtide_adapters::procfs::stat_cpu_s(&self.proc_file("stat"), ticks).unwrap_or(0.0)
    }

    /// Wait until the status is `ready` (at most `limit`), then measure for `run` and stop.
    /// With `watched`, the daemon records its ticks, and each is checked for that VM.
    pub fn measure(
        mut self,
        ready: impl Fn(&Value) -> bool,
        limit: Duration,
        run: Duration,
        watched: Option<&str>,
    ) -> anyhow::Result<Measured> {
        let settled = Instant::now();
        while !self.status().is_ok_and(|s| ready(&s)) {
            if settled.elapsed() > limit {
                bail!("not ready within {limit:?}:\n{}", self.log_tail());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let counters = self.status()?["counters"].clone();
        let (first, late) = (counters["ticks"].as_u64(), counters["late_ticks"].as_u64());
        let (start, bytes, cpu) = (Instant::now(), self.log_bytes(), self.cpu_s());
        while start.elapsed() < run {
            if let Some(exit) = self.child.try_wait()? {
                bail!("the daemon exited ({exit}):\n{}", self.log_tail());
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        let minutes = start.elapsed().as_secs_f64() / 60.0;
        let (log, cpu) = (self.log_bytes() - bytes, self.cpu_s() - cpu);
        let hwm_kib = self
            .proc_file("status")
            .lines()
            .find_map(|l| {
                l.strip_prefix("VmHWM:")?
                    .trim()
                    .strip_suffix("kB")?
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .context("the daemon's VmHWM")?;
        let counters = self.status()?["counters"].clone();
        let late_ticks = counters["late_ticks"]
            .as_u64()
            .zip(late)
            .map(|(b, a)| b - a);
        let max_tick_ms = counters["max_tick_ms"].as_f64();
        let metrics = self.http_get("/metrics").unwrap_or_default();
        // SIGTERM: the daemon finishes its recording file.
        // SAFETY: kill has no preconditions.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait()?;
        let ticks = counters["ticks"].as_u64().zip(first).map(|(b, a)| b - a);
        let watched = match (watched, &self.recordings) {
            (Some(vm), Some(dir)) => Some(managed_in_each_tick(dir, first.unwrap_or(0), vm)?),
            (Some(_), None) => bail!("watching a VM needs the daemon to record its ticks"),
            (None, _) => None,
        };
        Ok(Measured {
            peak_rss_mib: hwm_kib / 1024.0,
            max_tick_ms: max_tick_ms.context("the daemon's longest tick")?,
            late_ticks: late_ticks.context("the daemon's late ticks")?,
            log_bytes_per_min: log as f64 / minutes,
            honest_vm_managed: watched.map(|(ticks, unmanaged)| unmanaged == 0 && ticks > 0),
            honest_unmanaged_ticks: watched.map(|(_, unmanaged)| unmanaged),
            ticks: ticks.context("the daemon's ticks")?,
            cpu_s: cpu,
            cpu_share: cpu / (minutes * 60.0),
            metrics_injected: metrics.lines().any(|l| l.starts_with("memtide_injected")),
        })
    }

    /// A plain HTTP/1.0 GET's response.
    fn http_get(&self, path: &str) -> std::io::Result<String> {
        use std::io::Read;
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.http_port))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        Ok(text)
    }
}

/// The ticks recorded in `dir` after the first `skip`, and those in which `vm` was not
/// managed.
fn managed_in_each_tick(dir: &Path, skip: u64, vm: &str) -> anyhow::Result<(u64, u64)> {
    let files = memtide_sim::recording_files(dir)?;
    let (mut ticks, mut unmanaged) = (0, 0);
    for record in memtide_sim::Records::open(&files).skip(skip as usize) {
        let managed = record?
            .decision
            .vms
            .iter()
            .any(|v| v.name == vm && v.state == memtide_core::decision::VmState::Managed);
        (ticks, unmanaged) = (ticks + 1, unmanaged + u64::from(!managed));
    }
    Ok((ticks, unmanaged))
}

/// True when the status's last tick managed `vm` and was not skipped.
pub fn managed(status: &Value, vm: &str) -> bool {
    status["host_error"].is_null()
        && status["decision"]["vms"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|v| v["name"] == vm && v["state"] == "managed")
}
