//! One invocation: measure each guest kind's own base usage, then for the baseline and
//! each policy in turn boot fresh guests, warm up, start the daemon, sample every second
//! for the run, stop, read the guests' counters, and tear everything down.

use crate::daemon::{balloon_actions, config_text, start_mib, Daemon};
use crate::guest::{self, sleep, Guest};
use crate::measure::{self, parse_line, Line};
use crate::scenario::{Scenario, VmSpec, BASELINE};
use anyhow::{bail, Context};
use memtide_testbed::Cgroup;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;

/// How long a guest may take to boot, and its workload to print its first line.
const BOOT_LIMIT: Duration = Duration::from_secs(180);
const FIRST_LINE_LIMIT: Duration = Duration::from_secs(240);
/// Cores others may keep busy for the host to count as quiet.
const QUIET_CPU: f64 = 0.3;
/// Seconds an idle guest settles before its base usage is read.
const BASE_SETTLE: Duration = Duration::from_secs(5);

/// What the whole invocation works with.
pub struct Bench<'a> {
    /// The scenario.
    pub scenario: &'a Scenario,
    /// Runtime for the harness's QMP, agent and control-socket clients.
    pub rt: &'a Runtime,
    /// The scenario's cgroup (the daemon's VM memory domain).
    pub cgroup: &'a Cgroup,
    /// guest/build.sh's output.
    pub kernel_dir: PathBuf,
    /// Per-run files (consoles, daemon configuration, event logs).
    pub work_dir: PathBuf,
    /// Before each run, wait up to this long for other people's QEMUs to finish.
    pub quiet_wait: Duration,
}

/// A guest kind's own usage when idle.
#[derive(Debug, Clone)]
pub struct Base {
    /// Size − MemAvailable, MiB.
    pub base_mib: f64,
    /// The guest's MemTotal, MiB.
    pub mem_total_mib: f64,
    /// Its Committed_AS when idle, MiB.
    pub committed_mib: f64,
}

/// One VM's record in a policy run: per-sample series (aligned with the run's `t_s`),
/// its console report lines and its counters around the run.
#[derive(Debug, Clone, Default)]
pub struct VmRun {
    /// The VM.
    pub name: String,
    /// Balloon `actual` (harness QMP), MiB.
    pub actual_mib: Vec<Option<f64>>,
    /// The daemon's target, MiB.
    pub target_mib: Vec<Option<f64>>,
    /// The policy's estimate, MiB.
    pub estimate_mib: Vec<Option<f64>>,
    /// Guest MemAvailable, MiB.
    pub available_mib: Vec<Option<f64>>,
    /// Guest Committed_AS, MiB.
    pub committed_mib: Vec<Option<f64>>,
    /// QEMU's resident memory, MiB.
    pub rss_mib: Vec<Option<f64>>,
    /// Its QEMU's anonymous memory in huge pages (`AnonHugePages` of smaps_rollup), read
    /// every [`HUGE_EVERY`] samples (a walk of QEMU's page tables), else `None`.
    pub huge_mib: Vec<Option<f64>>,
    /// Cores QEMU used in the last second (a busy guest under TCG wants one).
    pub cpu: Vec<Option<f64>>,
    /// Pages swapped in per second (daemon's view of the guest).
    pub swap_in_per_s: Vec<Option<f64>>,
    /// Page-cache refaults per second.
    pub refaults_per_s: Vec<Option<f64>>,
    /// The guest's memory PSI, `some` avg10, percent.
    pub psi_some_avg10: Vec<Option<f64>>,
    /// Throughput of the lines read in each sample (mean), MiB/s.
    pub throughput: Vec<Option<f64>>,
    /// The rule behind the daemon's decision for this VM.
    pub rule: Vec<Option<String>>,
    /// The decision's inputs in words.
    pub reason: Vec<Option<String>>,
    /// Report lines (those read before the daemon started have `at_s` < 0).
    pub lines: Vec<Line>,
    /// `/proc/vmstat` right before the daemon started and right after it stopped.
    pub vmstat_before: Option<String>,
    /// See `vmstat_before`.
    pub vmstat_after: Option<String>,
    /// Balloon `actual` when the daemon started, MiB.
    pub start_actual_mib: Option<f64>,
    /// Why QEMU ended during the run, if it did.
    pub qemu_exit: Option<String>,
    /// OOM-killer messages on the console during the run.
    pub console_oom_lines: usize,
}

/// A policy run.
#[derive(Debug, Clone, Default)]
pub struct PolicyRun {
    /// The policy.
    pub policy: String,
    /// Sample times, seconds since the daemon started.
    pub t_s: Vec<f64>,
    /// The domain's free share as the daemon saw it.
    pub host_free_ratio: Vec<Option<f64>>,
    /// The cgroup's usage, MiB.
    pub domain_usage_mib: Vec<Option<f64>>,
    /// The host's 1-minute load average.
    pub loadavg: Vec<Option<f64>>,
    /// QEMU processes on the host that are not this run's (competing for the cores).
    pub foreign_qemus: Vec<Option<f64>>,
    /// Cores busy with anything but the harness and its guests.
    pub other_cpu: Vec<Option<f64>>,
    /// The VMs, in scenario order.
    pub vms: Vec<VmRun>,
    /// The host's /proc/vmstat when the daemon started and when it stopped: its swap-ins
    /// (the harness's guests are what the host runs), huge page faults and compaction,
    /// among others, over the run.
    pub host_vmstat: Option<(String, String)>,
    /// Balloon actions the daemon carried out.
    pub balloon_actions: u64,
    /// Diagnostics the daemon logged, by rule (e.g. `agent_unavailable`).
    pub diagnostics: BTreeMap<String, u64>,
    /// Balloon actions in the event log, by rule.
    pub action_rules: BTreeMap<String, u64>,
    /// What went wrong, if anything (the run is then incomplete).
    pub error: Option<String>,
}

/// Samples between two reads of each QEMU's huge pages.
pub const HUGE_EVERY: u64 = 5;

/// The host's /proc/vmstat.
fn host_vmstat() -> Option<String> {
    std::fs::read_to_string("/proc/vmstat").ok()
}

/// Diagnostics and actions, each by rule.
pub type Counts = (BTreeMap<String, u64>, BTreeMap<String, u64>);

/// Count diagnostics and actions by rule in a daemon event log (JSON lines).
pub fn count_events(text: &str) -> Counts {
    let (mut diagnostics, mut actions) = (BTreeMap::new(), BTreeMap::new());
    for line in text.lines() {
        let Ok(e) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let rule = e["rule"].as_str().unwrap_or("?").to_string();
        match e["kind"].as_str() {
            Some("diagnostic") => *diagnostics.entry(rule).or_default() += 1,
            Some("action") => *actions.entry(rule).or_default() += 1,
            _ => {}
        }
    }
    (diagnostics, actions)
}

fn mib(b: Option<memtide_core::Bytes>) -> Option<f64> {
    b.map(|b| b.as_f64() / (1u64 << 20) as f64)
}

impl<'a> Bench<'a> {
    /// The same bench with its per-run files under `sub` of its work directory.
    pub fn in_dir(&self, sub: &str) -> Bench<'a> {
        Bench {
            scenario: self.scenario,
            rt: self.rt,
            cgroup: self.cgroup,
            kernel_dir: self.kernel_dir.clone(),
            work_dir: self.work_dir.join(sub),
            quiet_wait: self.quiet_wait,
        }
    }

    /// An empty directory for one run's files in the work directory, named `name` — a
    /// policy file by its file name alone, so that the directory stays inside the work
    /// directory and its sockets' paths within a unix socket's 108 bytes.
    pub(crate) fn fresh_dir(&self, name: &str) -> anyhow::Result<PathBuf> {
        let dir = self.work_dir.join(run_dir_name(name));
        memtide_bench::fresh_dir(&dir).with_context(|| format!("emptying {}", dir.display()))
    }

    /// Boot one idle guest per kind (memory size and disks) and read size − MemAvailable.
    pub fn measure_bases(&self) -> anyhow::Result<BTreeMap<String, Base>> {
        let dir = self.fresh_dir("base")?;
        let mut kinds: Vec<&VmSpec> = Vec::new();
        for vm in &self.scenario.vms {
            if !kinds.iter().any(|k| k.base_key() == vm.base_key()) {
                kinds.push(vm);
            }
        }
        let mut guests = Vec::new();
        for spec in &kinds {
            if !spec.agent {
                bail!(
                    "vm {}: the base usage is read through the guest agent: set agent = true",
                    spec.name
                );
            }
            guests.push(Guest::boot(
                spec,
                &dir,
                &self.kernel_dir,
                &self.cgroup.procs(),
                true,
            )?);
        }
        for g in &mut guests {
            g.wait_console("memtide-guest: ready", 1, BOOT_LIMIT)?;
        }
        sleep(BASE_SETTLE)?;
        let mut out = BTreeMap::new();
        for (spec, g) in kinds.iter().zip(&mut guests) {
            let mut reads = Vec::new();
            for _ in 0..3 {
                let size = g.actual_mib(self.rt)?;
                let meminfo = g.agent_read(self.rt, &["/proc/meminfo"])?.remove(0);
                let kib = |k: &str| {
                    measure::proc_value(&meminfo, k)
                        .map(|v| v as f64 / 1024.0)
                        .with_context(|| format!("no {k} in the guest's /proc/meminfo"))
                };
                reads.push(Base {
                    base_mib: size - kib("MemAvailable")?,
                    mem_total_mib: kib("MemTotal")?,
                    committed_mib: kib("Committed_AS")?,
                });
                sleep(Duration::from_secs(1))?;
            }
            reads.sort_by(|a, b| a.base_mib.total_cmp(&b.base_mib));
            let median = reads[1].clone();
            log!(
                "base of a {} MiB guest (like {}): {:.1} MiB (size − MemAvailable; MemTotal {:.1} MiB)",
                spec.memory_mib, spec.name, median.base_mib, median.mem_total_mib
            );
            for vm in &self.scenario.vms {
                if vm.base_key() == spec.base_key() {
                    out.insert(vm.name.clone(), median.clone());
                }
            }
        }
        Ok(out)
    }

    /// Run the scenario under `policy`. `limit` is the domain's limit: measured and set
    /// in the baseline run (the first), kept for the others. Failures after the guests
    /// are up are recorded in the run's `error`, so that the other policies still run.
    pub fn run_policy(&self, policy: &str, limit: &mut Option<u64>) -> anyhow::Result<PolicyRun> {
        let baseline = policy == BASELINE;
        let dir = self.fresh_dir(policy)?;
        let s = self.scenario;
        self.wait_quiet(policy)?;
        if let Some(mib) = s.domain_limit_mib {
            self.cgroup.set_limit(mib << 20)?;
            *limit = Some(mib << 20);
        }
        log!("{} / {policy}: booting {} guest(s)", s.name, s.vms.len());
        let mut guests = Vec::new();
        for spec in &s.vms {
            guests.push(Guest::boot(
                spec,
                &dir,
                &self.kernel_dir,
                &self.cgroup.procs(),
                false,
            )?);
        }
        for (spec, g) in s.vms.iter().zip(&mut guests) {
            if let Some(m) = start_mib(spec, baseline) {
                g.balloon(self.rt, m)?;
            }
        }
        for g in &mut guests {
            g.wait_console("memtide-guest: ready", 1, BOOT_LIMIT)?;
        }
        log!("{} / {policy}: guests ready", s.name);
        for g in &mut guests {
            if let Some(w) = g.workload.clone() {
                g.wait_console(&format!("{w} t="), 1, FIRST_LINE_LIMIT)?;
            }
        }
        log!(
            "{} / {policy}: workloads running, warming up {} s",
            s.name,
            s.warmup_s
        );
        sleep(Duration::from_secs_f64(s.warmup_s))?;
        let mut run = PolicyRun {
            policy: policy.to_string(),
            ..PolicyRun::default()
        };
        for (spec, g) in s.vms.iter().zip(&mut guests) {
            let mut vm = VmRun {
                name: spec.name.clone(),
                ..VmRun::default()
            };
            if let Some(m) = start_mib(spec, baseline) {
                // The guest may still be inflating: give it up to 60 s more.
                let end = Instant::now() + Duration::from_secs(60);
                while (g.actual_mib(self.rt)? - m as f64).abs() > (m as f64 * 0.02).max(2.0)
                    && Instant::now() < end
                {
                    sleep(Duration::from_millis(500))?;
                }
            }
            vm.start_actual_mib = Some(g.actual_mib(self.rt)?);
            run.vms.push(vm);
        }
        if s.pressure_free > 0.0 {
            let bytes = match *limit {
                Some(l) => l,
                None => {
                    let usage = self.cgroup.usage()?;
                    let cache = self.cgroup.file_cache()?;
                    let l = ((usage - cache.min(usage)) as f64 / (1.0 - s.pressure_free)) as u64;
                    log!(
                        "domain usage at full memory {} MiB (file cache {} MiB): limit {} MiB ({:.0}% freeable)",
                        usage >> 20,
                        cache >> 20,
                        l >> 20,
                        s.pressure_free * 100.0
                    );
                    *limit = Some(l);
                    l
                }
            };
            self.cgroup.set_limit(bytes)?;
        }
        log!("{} / {policy}: start allocations reached", s.name);
        for (g, vm) in guests.iter_mut().zip(&mut run.vms) {
            if g.agent.is_some() {
                vm.vmstat_before = Some(g.agent_read(self.rt, &["/proc/vmstat"])?.remove(0));
            }
        }
        let daemon_vms: Vec<_> = s
            .vms
            .iter()
            .zip(&guests)
            .map(|(spec, g)| (spec, g.qmp_daemon.clone(), g.agent.clone()))
            .collect();
        let text = config_text(s, policy, &dir, &self.cgroup.dir, &daemon_vms, None);
        std::fs::write(dir.join("memtide.toml"), &text)?;
        let mut daemon = Daemon::start(&text, &dir.join("memtide.toml").display().to_string())?;
        let t0 = Instant::now();
        let host_before = host_vmstat();
        for (g, vm) in guests.iter_mut().zip(&mut run.vms) {
            if let Some(w) = &g.workload.clone() {
                vm.lines
                    .extend(g.new_lines().iter().filter_map(|l| parse_line(w, l, -1.0)));
            }
        }
        log!(
            "{} / {policy}: daemon started, sampling for {} s",
            s.name,
            s.run_s
        );
        if let Err(e) = self.sample(&mut run, &mut guests, &mut daemon, t0) {
            run.error = Some(format!("{e:#}"));
        }
        if let Some(e) = daemon.stop() {
            run.error.get_or_insert(e);
        }
        run.host_vmstat = host_before.zip(host_vmstat());
        for (g, vm) in guests.iter_mut().zip(&mut run.vms) {
            if g.agent.is_some() && g.alive().is_ok() {
                match g.agent_read(self.rt, &["/proc/vmstat"]) {
                    Ok(mut v) => vm.vmstat_after = Some(v.remove(0)),
                    Err(e) => {
                        run.error.get_or_insert(format!("{e:#}"));
                    }
                }
            }
        }
        drop(guests);
        (run.diagnostics, run.action_rules) = self.finish(&dir, policy, run.error.as_deref());
        Ok(run)
    }

    /// Log a run's end, and count its daemon's diagnostics and actions by rule from the
    /// event log in `dir`.
    pub(crate) fn finish(&self, dir: &Path, policy: &str, error: Option<&str>) -> Counts {
        log!("{} / {policy}: done", self.scenario.name);
        if let Some(e) = error {
            log!("{} / {policy}: {e}", self.scenario.name);
        }
        let events = std::fs::read_to_string(dir.join("events.jsonl")).unwrap_or_default();
        count_events(&events)
    }

    /// Wait up to `quiet_wait` while other QEMUs run or others keep a core busy.
    pub(crate) fn wait_quiet(&self, policy: &str) -> anyhow::Result<()> {
        if self.quiet_wait.is_zero() {
            return Ok(());
        }
        let by = Instant::now() + self.quiet_wait;
        let mut meter = guest::CpuMeter::default();
        meter.others(&[]);
        let mut logged = false;
        loop {
            sleep(Duration::from_secs(3))?;
            let others = meter.others(&[]).unwrap_or(0.0);
            let qemus = guest::foreign_qemus(&[]);
            if (qemus == 0 && others < QUIET_CPU) || Instant::now() >= by {
                if logged {
                    log!(
                        "{} / {policy}: going ahead ({qemus} other QEMUs, {others:.2} cores busy with others)",
                        self.scenario.name
                    );
                }
                return Ok(());
            }
            if !logged {
                log!(
                    "{} / {policy}: host busy ({qemus} other QEMUs, {others:.2} cores busy with others): waiting up to {} s",
                    self.scenario.name,
                    self.quiet_wait.as_secs()
                );
                logged = true;
            }
        }
    }

    fn sample(
        &self,
        run: &mut PolicyRun,
        guests: &mut [Guest],
        daemon: &mut Daemon,
        t0: Instant,
    ) -> anyhow::Result<()> {
        let s = self.scenario;
        let samples = s.run_s.round() as u64;
        let ours: Vec<u32> = guests.iter().map(Guest::pid).collect();
        let mut meter = guest::CpuMeter::default();
        meter.others(&ours);
        let mut qemu_cpu: Vec<Option<f64>> = ours
            .iter()
            .map(|p| guest::process_cpu_s(&p.to_string()))
            .collect();
        let mut last_at = 0.0;
        for k in 1..=samples {
            let due = t0 + Duration::from_secs(k);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                sleep(wait)?;
            }
            guest::check_interrupted()?;
            let at = t0.elapsed().as_secs_f64();
            if let Some(why) = daemon.failed() {
                bail!("the daemon ended at {at:.0} s: {why}");
            }
            let status = daemon.status(self.rt).ok();
            let decision = status.as_ref().and_then(|s| s.decision.as_ref());
            run.t_s.push(at);
            run.host_free_ratio
                .push(decision.map(|d| d.host.free_ratio));
            run.domain_usage_mib.push(
                self.cgroup
                    .usage()
                    .ok()
                    .map(|u| u as f64 / (1u64 << 20) as f64),
            );
            run.loadavg.push(guest::loadavg());
            run.foreign_qemus
                .push(Some(guest::foreign_qemus(&ours) as f64));
            run.other_cpu.push(meter.others(&ours));
            for ((vm, pid), last) in run.vms.iter_mut().zip(&ours).zip(&mut qemu_cpu) {
                vm.huge_mib.push(
                    (k % HUGE_EVERY == 0)
                        .then(|| guest::anon_huge_mib(*pid))
                        .flatten(),
                );
                let now = guest::process_cpu_s(&pid.to_string());
                vm.cpu.push(match (now, *last) {
                    (Some(n), Some(l)) if at > last_at => Some((n - l) / (at - last_at)),
                    _ => None,
                });
                *last = now;
            }
            last_at = at;
            if let Some(st) = &status {
                run.balloon_actions = balloon_actions(st);
            }
            for (g, vm) in guests.iter_mut().zip(&mut run.vms) {
                if let Err(why) = g.alive() {
                    vm.qemu_exit = Some(format!("{why} at {at:.0} s"));
                    bail!("guest {}: {why} at {at:.0} s", g.name);
                }
                vm.actual_mib.push(g.actual_mib(self.rt).ok());
                let report = decision.and_then(|d| d.vms.iter().find(|v| v.name == vm.name));
                let get =
                    |f: fn(&memtide_core::decision::VmReport) -> Option<f64>| report.and_then(f);
                vm.target_mib.push(get(|r| mib(r.target)));
                vm.estimate_mib.push(get(|r| mib(r.estimate)));
                vm.available_mib.push(get(|r| mib(r.guest_available)));
                vm.committed_mib.push(get(|r| mib(r.committed_as)));
                vm.rss_mib.push(get(|r| mib(r.rss)));
                vm.swap_in_per_s
                    .push(get(|r| r.swap_in_per_s.map(|b| b / 4096.0)));
                vm.refaults_per_s.push(get(|r| r.refaults_per_s));
                vm.psi_some_avg10.push(get(|r| r.guest_psi_some_avg10));
                let reason = report.and_then(|r| r.reason.as_ref());
                vm.rule.push(reason.map(|r| r.rule.to_string()));
                vm.reason.push(reason.map(|r| r.detail.clone()));
                let lines = g.new_lines();
                vm.console_oom_lines += lines
                    .iter()
                    .filter(|l| l.contains("Out of memory") || l.contains("oom-kill"))
                    .count();
                let parsed: Vec<Line> = match &g.workload {
                    Some(w) => lines.iter().filter_map(|l| parse_line(w, l, at)).collect(),
                    None => Vec::new(),
                };
                vm.throughput.push((!parsed.is_empty()).then(|| {
                    parsed.iter().map(|l| l.mib_per_s).sum::<f64>() / parsed.len() as f64
                }));
                vm.lines.extend(parsed);
            }
            if k % 10 == 0 {
                let now: Vec<String> = run
                    .vms
                    .iter()
                    .map(|v| {
                        format!(
                            "{} {:.0} MiB",
                            v.name,
                            v.actual_mib.last().copied().flatten().unwrap_or(f64::NAN)
                        )
                    })
                    .collect();
                log!("{} / {}: {at:.0} s: {}", s.name, run.policy, now.join(", "));
            }
        }
        Ok(())
    }
}

/// A run directory's name: a policy file's file name alone.
fn run_dir_name(name: &str) -> &std::ffi::OsStr {
    Path::new(name).file_name().unwrap_or(name.as_ref())
}

/// Where guest/build.sh put the kernel and initramfs.
pub fn kernel_dir(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    memtide_testbed::guest_dir(given).map_err(|e| anyhow::anyhow!("{e} (or pass --guest-dir)"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn events_are_counted_by_rule() {
        let log = r#"{"ts":"t","kind":"started","message":"m"}
{"ts":"t","kind":"diagnostic","vm":"a","rule":"agent_unavailable","message":"m"}
{"ts":"t","kind":"diagnostic","vm":"b","rule":"agent_unavailable","message":"m"}
{"ts":"t","kind":"action","vm":"a","rule":"mom.shrink","message":"m"}
not json
"#;
        let (d, a) = super::count_events(log);
        assert_eq!(d["agent_unavailable"], 2);
        assert_eq!(a["mom.shrink"], 1);
    }

    #[test]
    fn a_policy_file_runs_in_a_directory_named_after_its_file() {
        // Not target/crates/...: the run's directory stays in the work directory.
        let name = super::run_dir_name("../../crates/memtide-lang/policies/balloon.policy");
        assert_eq!(name, "balloon.policy");
        assert_eq!(super::run_dir_name("memtide"), "memtide");
    }
}
