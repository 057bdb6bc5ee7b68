//! The memtide daemon, started as a process from the built binary.

use super::wait_for;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The memtide binary under test.
pub fn memtide() -> Command {
    Command::new(env!("CARGO_BIN_EXE_memtide"))
}

/// `memtide snapshot ARGS --config CONFIG`, run to its end.
pub fn snapshot(config: &std::path::Path, args: &[&str]) -> std::process::Output {
    memtide()
        .arg("snapshot")
        .args(args)
        .arg("--config")
        .arg(config)
        .output()
        .unwrap()
}

/// `memtide run --dry-run --ticks TICKS --config CONFIG`, run to its end, the
/// configuration recording to `record_dir`: each tick's sample of its first VM (ticks
/// where it had none left out) and what the daemon logged.
pub fn recorded_dry_run(
    config: &Path,
    record_dir: &Path,
    ticks: u32,
) -> (Vec<memtide_core::VmSample>, String) {
    let o = memtide()
        .args([
            "run",
            "--dry-run",
            "--ticks",
            &ticks.to_string(),
            "--config",
        ])
        .arg(config)
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{log}");
    let files = memtide_sim::recording_files(record_dir).unwrap();
    let samples = memtide_sim::Records::open(&files)
        .map(|r| r.unwrap().snapshot.vms)
        .filter_map(|vms| vms.into_iter().next()?.sample.ok())
        .collect();
    (samples, log)
}

/// What a command printed, stdout then stderr.
pub fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A running daemon; stopped with SIGTERM on drop.
pub struct Daemon {
    pub socket: PathBuf,
    pub log: PathBuf,
    pub events: PathBuf,
    /// The state file.
    pub state: PathBuf,
    child: Child,
}

impl Daemon {
    /// Start `memtide run` in `dir` with `config` (TOML) completed by the daemon section
    /// pointing at files in `dir`, and HTTP on `http_port`.
    pub fn start(dir: &Path, config: &str, http_port: u16) -> Daemon {
        let socket = dir.join("memtide.sock");
        let events = dir.join("events.jsonl");
        let log = dir.join("daemon.log");
        let state = dir.join("state.json");
        let text = format!(
            "{config}\n[daemon]\nsocket = {:?}\nevent_log = {:?}\nstate_file = {:?}\nhttp = \"127.0.0.1:{http_port}\"\ncall_timeout_ms = 2000\n",
            socket.display().to_string(),
            events.display().to_string(),
            state.display().to_string(),
        );
        let path = dir.join("memtide.toml");
        std::fs::write(&path, text).unwrap();
        let child = memtide()
            .arg("run")
            .arg("--config")
            .arg(&path)
            .env("MEMTIDE_LOG", "info")
            .stderr(std::fs::File::create(&log).unwrap())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let d = Daemon {
            socket,
            log,
            events,
            state,
            child,
        };
        let up = wait_for(Duration::from_secs(10), || d.try_status());
        assert!(
            up.is_some(),
            "daemon did not come up; its log:\n{}",
            d.log_text()
        );
        d
    }

    /// The daemon's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `memtide status --json`, or `None` if the daemon does not answer (yet).
    pub fn try_status(&self) -> Option<Value> {
        let out = memtide()
            .args(["status", "--json", "--socket"])
            .arg(&self.socket)
            .output()
            .unwrap();
        out.status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).unwrap())
    }

    /// Wait until the status satisfies `check`, or fail with `what`, the status and the log.
    pub fn wait_until(&self, what: &str, limit: Duration, check: impl Fn(&Value) -> bool) -> Value {
        let mut last = None;
        let found = wait_for(limit, || {
            let s = self.try_status()?;
            let ok = check(&s);
            last = Some(s.clone());
            ok.then_some(s)
        });
        found.unwrap_or_else(|| {
            panic!(
                "{what}: not within {limit:?}\nlast status: {}\ndaemon log tail:\n{}",
                last.map(|s| serde_json::to_string_pretty(&s["decision"]).unwrap())
                    .unwrap_or_default(),
                self.log_text()
                    .lines()
                    .rev()
                    .take(30)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect::<Vec<_>>()
                    .join("\n")
            )
        })
    }

    /// The daemon's event log, one JSON value per event (panics on a torn line).
    pub fn event_log(&self) -> Vec<Value> {
        if !self.events.exists() {
            return Vec::new();
        }
        let (events, torn) = memtide::daemon::events::read_log(&self.events).unwrap();
        assert_eq!(torn, None, "a torn line in the event log");
        events
            .into_iter()
            .map(|e| serde_json::to_value(e).unwrap())
            .collect()
    }

    /// The messages of `vm`'s events under `rule` in the event log, oldest first.
    pub fn said(&self, vm: &str, rule: &str) -> Vec<String> {
        self.event_log()
            .into_iter()
            .filter(|e| e["vm"] == vm && e["rule"] == rule)
            .map(|e| e["message"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `memtide reload`: the policy and configuration are read again (panics if refused).
    pub fn reload(&self) {
        let o = memtide()
            .args(["reload", "--socket"])
            .arg(&self.socket)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
}

impl Daemon {
    /// How many descriptors the daemon has open (/proc/PID/fd).
    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .expect("the daemon runs")
            .count()
    }

    /// Its open descriptors once the count holds for 2 s (its connections to a guest's
    /// monitor and agent may still be opening), or the most seen in 10 s.
    pub fn steady_fds(&self) -> usize {
        let mut seen = Vec::new();
        let steady = wait_for(Duration::from_secs(10), || {
            seen.push(self.open_fds());
            let last = &seen[seen.len().saturating_sub(10)..];
            (last.len() == 10 && last.iter().all(|n| *n == last[0])).then_some(last[0])
        });
        steady.unwrap_or_else(|| seen.into_iter().max().unwrap())
    }

    /// Its exit status, once it has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().unwrap()
    }
}

/// A configuration managing `vms` (name, QMP socket, guest agent socket) in the cgroup
/// `domain` with memtide's policy and its memory ample whatever the build machine holds
/// (no free share is too little): memtide takes only what costs the guests nothing.
/// `host` is added to the `[host]` table (e.g. `sample_access = false`).
pub fn ample_config(domain: &Path, host: &str, vms: &[(&str, &Path, &Path)]) -> String {
    let mut text = format!(
        "interval_s = 1\npolicy = \"memtide\"\n\
         [host]\ndomain_cgroup = {:?}\n{host}\n\
         [discovery]\nqmp_glob = []\n\
         [engine]\nksm_control = false\n\
         [memtide]\nample_free = 0.0\nshort_free = 0.0\narrive_s = 0.0\n",
        domain.display().to_string()
    );
    for (name, qmp, agent) in vms {
        text += &format!(
            "[[vm]]\nname = {name:?}\nqmp = {:?}\nagent = {:?}\n",
            qmp.display().to_string(),
            agent.display().to_string()
        );
    }
    text
}

/// A configuration managing `vms` (name, QMP socket, guest agent socket) with memtide's
/// policy and the host declared short (`ample_free`/`short_free` above 1, as
/// bench/scenarios/converge.toml does): it probes at once and the balloons keep moving.
/// Without host-side access sampling, which would stop probing above each guest's hot
/// set (under TCG it sees it): these tests need the balloons to move.
pub fn probing_config(vms: &[(&str, &Path, Option<&Path>)]) -> String {
    let mut text = String::from(
        "interval_s = 1\npolicy = \"memtide\"\n[discovery]\nqmp_glob = []\n\
         [host]\nsample_access = false\n[engine]\nksm_control = false\n\
         [memtide]\nample_free = 1.01\nshort_free = 1.01\n",
    );
    for (name, qmp, agent) in vms {
        text += &format!(
            "[[vm]]\nname = {name:?}\nqmp = {:?}\n",
            qmp.display().to_string()
        );
        if let Some(agent) = agent {
            text += &format!("agent = {:?}\n", agent.display().to_string());
        }
    }
    text
}

/// A policy (in the policy language) giving every guest `mib` (within its bounds).
pub fn fixed_policy(mib: u64) -> String {
    format!(
        "(with Guests guest (guest.Control \"balloon_target\" {}))\n",
        mib * 1024
    )
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.try_wait().unwrap().is_some() {
            return; // stopped by the test
        }
        super::signal(self.child.id(), "TERM");
        if wait_for(Duration::from_secs(5), || self.child.try_wait().unwrap()).is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The report of VM `name` in a status, if listed.
pub fn vm<'a>(status: &'a Value, name: &str) -> Option<&'a Value> {
    status["decision"]["vms"]
        .as_array()?
        .iter()
        .find(|v| v["name"] == name)
}

/// VM `name`'s balloon size in a status, in MiB (NaN when not reported).
pub fn actual_mib(status: &Value, name: &str) -> f64 {
    vm(status, name)
        .and_then(|v| mib(v, "actual"))
        .unwrap_or(f64::NAN)
}

/// A VM's size field (bytes) in MiB.
pub fn mib(vm: &Value, field: &str) -> Option<f64> {
    vm[field].as_u64().map(|b| b as f64 / (1 << 20) as f64)
}
