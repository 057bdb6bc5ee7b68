//! The memtide daemon, run in-process (`memtide::daemon::run`) on a thread and tokio
//! runtime of its own, with a configuration generated per policy run. Stopping drops
//! the runtime, which ends every task the daemon spawned (control socket, QMP readers,
//! guest agent sessions), so each policy starts from a clean slate and the guest agent's
//! socket is free again for the harness.

use crate::scenario::{Scenario, Start, VmSpec};
use anyhow::Context;
use memtide::config::Config;
use memtide::daemon::RunOptions;
use memtide::status::Status;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::runtime::Runtime;
use tokio::sync::oneshot;

/// The TOML configuration for one policy run: the scenario's `[config]` overrides merged
/// into what the harness sets (policy, interval, the VMs' sockets and bounds, the cgroup
/// domain, endpoints in `dir`), with `engine.ksm_control = false` always. With
/// `discover`, the daemon also finds VMs as their QMP sockets (`*.qmp`, agents `*.qga`)
/// appear in that directory, as guests arrive in the density benchmark.
pub fn config_text(
    scenario: &Scenario,
    policy: &str,
    dir: &Path,
    domain: &Path,
    vms: &[(&VmSpec, PathBuf, Option<PathBuf>)],
    discover: Option<&Path>,
) -> String {
    use toml::Value;
    let mut t = toml::Table::new();
    for (k, v) in &scenario.config {
        t.insert(k.clone(), v.clone());
    }
    t.insert("interval_s".into(), Value::Float(scenario.interval_s));
    t.insert(
        "policy".into(),
        Value::String(scenario.policy_setting(policy)),
    );
    let path = |p: &Path| Value::String(p.display().to_string());
    let section = |t: &mut toml::Table, name: &str| -> toml::Table {
        match t.remove(name) {
            Some(Value::Table(s)) => s,
            _ => toml::Table::new(),
        }
    };
    // The scenario's `record_dir` (for `memtide replay`) stays, a relative one below each
    // policy run's directory.
    let mut daemon = section(&mut t, "daemon");
    if let Some(Value::String(record)) = daemon.get("record_dir") {
        let record = path(&dir.join(record));
        daemon.insert("record_dir".into(), record);
    }
    daemon.insert("socket".into(), path(&dir.join("memtide.sock")));
    daemon.insert("event_log".into(), path(&dir.join("events.jsonl")));
    daemon.insert("state_file".into(), path(&dir.join("state.json")));
    daemon.insert("http".into(), Value::String(String::new()));
    daemon.insert("call_timeout_ms".into(), Value::Integer(2000));
    t.insert("daemon".into(), Value::Table(daemon));
    let mut host = section(&mut t, "host");
    host.insert("domain_cgroup".into(), path(domain));
    t.insert("host".into(), Value::Table(host));
    let mut discovery = toml::Table::new();
    let globs = discover.map(|d| path(&d.join("*.qmp")));
    discovery.insert("qmp_glob".into(), Value::Array(globs.into_iter().collect()));
    t.insert("discovery".into(), Value::Table(discovery));
    let mut engine = section(&mut t, "engine");
    engine.insert("ksm_control".into(), Value::Boolean(false));
    t.insert("engine".into(), Value::Table(engine));
    let mut list = Vec::new();
    for (spec, qmp, agent) in vms {
        let mut vm = toml::Table::new();
        vm.insert("name".into(), Value::String(spec.name.clone()));
        vm.insert("qmp".into(), path(qmp));
        if let Some(a) = agent {
            vm.insert("agent".into(), path(a));
        }
        for (k, v) in [("min_mib", spec.min_mib), ("max_mib", spec.max_mib)] {
            if let Some(v) = v {
                vm.insert(k.into(), Value::Integer(v as i64));
            }
        }
        if let Some(s) = spec.shares {
            vm.insert("shares".into(), Value::Integer(i64::from(s)));
        }
        list.push(Value::Table(vm));
    }
    t.insert("vm".into(), Value::Array(list));
    toml::to_string(&t).expect("a TOML table serializes")
}

/// Where a VM starts in a policy run (the baseline always at full size).
pub fn start_mib(spec: &VmSpec, baseline: bool) -> Option<u64> {
    match (baseline, spec.start) {
        (false, Start::Mib(m)) => Some(m),
        _ => None,
    }
}

/// Balloon actions the daemon has carried out, from its status.
pub fn balloon_actions(status: &Status) -> u64 {
    status
        .counters
        .actions
        .get("balloon")
        .and_then(|r| r.get("ok"))
        .copied()
        .unwrap_or(0)
}

/// A daemon running on its own thread.
pub struct Daemon {
    /// Its control socket.
    pub socket: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), String>>>,
}

impl Daemon {
    /// Check `text` with the daemon's own parser and start the daemon.
    pub fn start(text: &str, origin: &str) -> anyhow::Result<Daemon> {
        let config = Config::parse(text, origin).context("the generated daemon configuration")?;
        let socket = config.daemon.socket.clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("memtide-daemon".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                let result = rt.block_on(async move {
                    tokio::select! {
                        r = memtide::daemon::run(config, RunOptions::default()) => match r {
                            Ok(()) => Err("the daemon stopped by itself".to_string()),
                            Err(e) => Err(format!("{e:#}")),
                        },
                        _ = stopped => Ok(()),
                    }
                });
                rt.shutdown_timeout(Duration::from_secs(3));
                result
            })?;
        Ok(Daemon {
            socket,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// `Some(why)` once the daemon has ended without being asked to.
    pub fn failed(&mut self) -> Option<String> {
        if self.thread.as_ref().is_some_and(|t| t.is_finished()) {
            let t = self.thread.take().expect("checked");
            return Some(match t.join() {
                Ok(Ok(())) => "the daemon stopped".into(),
                Ok(Err(e)) => e,
                Err(_) => "the daemon panicked".into(),
            });
        }
        None
    }

    /// The daemon's status, or why not.
    pub fn status(&self, rt: &Runtime) -> anyhow::Result<Status> {
        rt.block_on(async {
            tokio::time::timeout(
                Duration::from_secs(2),
                memtide::control::request_status(&self.socket),
            )
            .await
            .map_err(|_| anyhow::anyhow!("no status within 2 s"))?
        })
    }

    /// Stop it and wait until its runtime is gone.
    pub fn stop(&mut self) -> Option<String> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(Err(e))) => Some(e),
            Some(Err(_)) => Some("the daemon panicked".into()),
            _ => None,
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generated_configuration_is_valid_and_keeps_the_hosts_ksm_alone() {
        let scenario = Scenario::parse(
            r#"
            warmup_s = 1
            run_s = 10
            policies = ["mom"]
            [config.engine]
            settle_s = 20
            [config.host]
            sample_access = true
            [config.memtide]
            margin = 0.05
            [config.daemon]
            record_dir = "recorded"
            [[vm]]
            name = "a"
            memory_mib = 384
            workload = "memknobs"
            args = ["60:100000"]
            hot_set_mib = 60
            min_mib = 64
            "#,
            "t",
        )
        .unwrap();
        let spec = &scenario.vms[0];
        let text = config_text(
            &scenario,
            "memtide",
            Path::new("/tmp/run"),
            Path::new("/sys/fs/cgroup/memory/x"),
            &[(spec, "/tmp/run/a.qmp".into(), Some("/tmp/run/a.qga".into()))],
            None,
        );
        let c = Config::parse(&text, "generated").unwrap();
        assert_eq!(c.policy, "memtide");
        assert!(!c.engine.ksm_control);
        assert_eq!(c.engine.settle_s, 20, "scenario overrides are kept");
        assert_eq!(c.memtide.margin, 0.05);
        assert_eq!(
            c.host.sample_access,
            Some(memtide::config::SampleAccess::Auto)
        );
        assert_eq!(
            c.host.domain_cgroup.as_deref(),
            Some(Path::new("/sys/fs/cgroup/memory/x"))
        );
        assert!(c.discovery.qmp_glob.is_empty());
        assert_eq!(c.daemon.http, "");
        assert_eq!(c.daemon.record_dir, Path::new("/tmp/run/recorded"));
        assert_eq!(c.vms[0].min_mib, Some(64));
        assert_eq!(c.vms[0].agent.as_deref(), Some(Path::new("/tmp/run/a.qga")));
        assert_eq!(start_mib(spec, false), None);
    }
}
