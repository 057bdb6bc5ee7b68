//! The density benchmark on real guests: how many VMs a policy lets a fixed memory domain
//! run at the same service level — the reason operators overcommit.
//!
//! The scenario's VMs arrive one after another (`arrive_every_s`) into a queue, in the
//! order of its `[[vm]]` entries. One admission rule serves every policy, as in the
//! simulator's density benchmark (`memtide_sim::density`): the VM at the head is booted
//! when the domain's free memory (its limit less what it holds, page cache and anonymous
//! memory no process maps excepted: the kernel gives both back on demand), as the policy
//! leaves it, covers the VM's expected need (its measured base, its hot set and
//! QEMU's own overhead) plus a reserve; under `none` the VMs' configured sizes (plus
//! QEMU's overhead) must fit the domain less the reserve: static partitioning. At least
//! `settle_s` passes between two admissions. There is no host swap behind the domain:
//! memory that does not fit is an OOM kill (of a guest's process, or of a QEMU).
//!
//! Busy guests (a `memknobs`, `coldalloc` or `filecache` workload) are compared, window
//! by window, with their own solo run (alone in the domain, at full memory, unmanaged); a
//! window below 95% of it is an SLO violation. The headline, `guests_at_slo`, is the most
//! guests that ran together before the first violation or OOM kill (all admitted if there
//! was none).

use crate::daemon::{balloon_actions, config_text, Daemon};
use crate::guest::{process_cpu_s, sleep, Guest};
use crate::measure::{self, parse_line, Line};
use crate::run::{Base, Bench};
use crate::scenario::{Density, Scenario, VmSpec, BASELINE};
use anyhow::Context;
use memtide_sim::density::{SLO, SLO_SHARE};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// A solo run's margin for its guest to boot and print its first report line, s.
const SOLO_BOOT_S: f64 = 30.0;

/// Workloads whose throughput is held to the SLO.
fn busy(spec: &VmSpec) -> bool {
    matches!(
        spec.workload.as_deref(),
        Some("memknobs" | "coldalloc" | "filecache")
    )
}

/// Each busy guest's solo run: its throughput (MiB/s), and what the run measured.
#[derive(Default)]
pub struct Solo {
    /// By guest, the reference its windows are compared with.
    pub mib_per_s: BTreeMap<String, f64>,
    /// By kind of busy guest (the first of each), its solo run's guest as in a policy's
    /// run, with its windows ÷ its solo throughput (`window_ratios`): the spread of its
    /// own rate.
    runs: BTreeMap<String, Value>,
}

/// The solo throughput of the guest `name` (of `memory_mib`) from its queue of one
/// `run`, and its guest's JSON with the spread of its windows: an error where the run
/// did not measure `solo_s` of it (the guest not admitted, ended, OOM-killed, or
/// reporting too late).
fn solo_of(
    name: &str,
    memory_mib: u64,
    run: &DensityRun,
    solo_s: f64,
) -> anyhow::Result<(f64, Value)> {
    if let Some(e) = &run.error {
        anyhow::bail!("solo run of {name}: {e}");
    }
    let mut vm = run.vms.first().cloned().with_context(|| {
        format!(
            "solo run of {name}: not admitted (its {memory_mib} MiB and QEMU's overhead do not \
             fit the domain less the reserve)"
        )
    })?;
    if run.oom_kills > 0 || !vm["exit"].is_null() {
        anyhow::bail!(
            "solo run of {name}: {} OOM kills, exit: {}",
            run.oom_kills,
            vm["exit"]
        );
    }
    let measured = vm["measured_s"].as_f64().unwrap_or(0.0);
    if measured + 1e-6 < solo_s {
        anyhow::bail!(
            "solo run of {name}: {measured:.0} s measured, not solo_s = {solo_s:.0} (its first \
             report line came {:.0} s late)",
            solo_s - measured
        );
    }
    let tp = vm["mib_per_s"]
        .as_f64()
        .with_context(|| format!("solo run of {name}: no report line"))?;
    let rates: Vec<(f64, f64)> = vm["window_mib_per_s"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|w| (w[0].as_f64().unwrap_or(0.0), w[1].as_f64().unwrap_or(0.0)))
        .collect();
    vm["window_ratios"] = pairs(&relative(&rates, tp));
    Ok((tp, vm))
}

/// What one admitted guest did.
struct Admitted {
    spec: VmSpec,
    guest: Guest,
    at_s: f64,
    ready: bool,
    first_line_s: Option<f64>,
    lines: Vec<Line>,
    oom_kills: u64,
    /// When the first of them was seen.
    first_kill_s: Option<f64>,
    exit: Option<(f64, String)>,
    /// Its balloon size each second once it is up, MiB.
    actual_mib: Vec<f64>,
    /// Its QEMU's CPU time so far (user + system, all threads), s, at the last reading.
    cpu_s: Option<f64>,
}

/// One policy's run.
#[derive(Default)]
pub struct DensityRun {
    policy: String,
    t_s: Vec<f64>,
    running: Vec<usize>,
    /// CPU the busy guests' QEMUs used each second, cores.
    busy_cpu: Vec<f64>,
    /// CPU the other guests' QEMUs used each second, cores.
    others_cpu: Vec<f64>,
    /// CPU this process used each second, cores: the daemon, run in-process, with the
    /// kernel work its system calls do (host-side access sampling, huge-page collapse),
    /// and the harness's own light polling.
    daemon_cpu: Vec<f64>,
    used_mib: Vec<Option<f64>>,
    allocated_mib: Vec<f64>,
    vms: Vec<Value>,
    /// Each busy guest's windows: (start, throughput ÷ solo).
    busy: Vec<Vec<(f64, f64)>>,
    oom_kills: u64,
    first_kill_s: Option<f64>,
    vm_seconds: f64,
    balloon_actions: u64,
    action_rules: BTreeMap<String, u64>,
    diagnostics: BTreeMap<String, u64>,
    error: Option<String>,
}

impl Bench<'_> {
    fn density(&self) -> &Density {
        self.scenario.density.as_ref().expect("a density scenario")
    }

    fn limit_mib(&self) -> f64 {
        self.scenario
            .domain_limit_mib
            .expect("checked with [density]") as f64
    }

    /// Each busy guest alone in the domain at full memory, unmanaged: its throughput
    /// (MiB/s) from `warmup_s` after its first report line, over at least `solo_s`.
    /// It runs as a queue of one under `none` — the daemon sampling it and the harness
    /// reading its balloon every second, as in every policy's run: under TCG a guest's
    /// rate depends on how often it switches processes (guest/README.md, "Under TCG:
    /// the software TLB"): a guest no one queried ran its solo at 173 k MiB/s where
    /// the same guest sampled ran at about 300 k (2026-11-27).
    pub fn solo_runs(&self, bases: &BTreeMap<String, Base>) -> anyhow::Result<Solo> {
        let d = self.density();
        let mut out = Solo::default();
        let mut kinds: Vec<&VmSpec> = Vec::new();
        for spec in self.scenario.vms.iter().filter(|s| busy(s)) {
            let same = kinds.iter().find(|k| {
                k.memory_mib == spec.memory_mib
                    && k.workload == spec.workload
                    && k.args == spec.args
            });
            if let Some(k) = same {
                let tp = out.mib_per_s[&k.name];
                out.mib_per_s.insert(spec.name.clone(), tp);
                continue;
            }
            kinds.push(spec);
            let run_s = SOLO_BOOT_S + self.scenario.warmup_s + d.solo_s;
            let run = self.run_queue(
                &format!("solo-{}", spec.name),
                BASELINE,
                std::slice::from_ref(spec),
                run_s,
                bases,
                &BTreeMap::new(),
            )?;
            let (tp, vm) = solo_of(&spec.name, spec.memory_mib, &run, d.solo_s)?;
            log!("{}: solo throughput {tp:.0} MiB/s", spec.name);
            out.mib_per_s.insert(spec.name.clone(), tp);
            out.runs.insert(spec.name.clone(), vm);
        }
        Ok(out)
    }

    /// What admitting `spec` is expected to take from the domain, MiB.
    fn need_mib(&self, spec: &VmSpec, bases: &BTreeMap<String, Base>) -> f64 {
        bases.get(&spec.name).map_or(0.0, |b| b.base_mib)
            + spec.hot_set_mib
            + self.density().qemu_overhead_mib
    }

    /// Run the scenario's admission queue under `policy` for its `run_s`.
    pub fn run_density(
        &self,
        policy: &str,
        bases: &BTreeMap<String, Base>,
        solo: &BTreeMap<String, f64>,
    ) -> anyhow::Result<DensityRun> {
        let s = self.scenario;
        self.run_queue(policy, policy, &s.vms, s.run_s, bases, solo)
    }

    /// Run `queue` as the admission queue under `policy` for `run_s`, in the work
    /// directory `name`.
    fn run_queue(
        &self,
        name: &str,
        policy: &str,
        queue: &[VmSpec],
        run_s: f64,
        bases: &BTreeMap<String, Base>,
        solo: &BTreeMap<String, f64>,
    ) -> anyhow::Result<DensityRun> {
        let s = self.scenario;
        let d = self.density();
        let dir = self.fresh_dir(name)?;
        self.wait_quiet(name)?;
        let limit = self.limit_mib();
        self.cgroup.set_limit((limit as u64) << 20)?;
        let reserve = limit * d.reserve_pct / 100.0;
        let text = config_text(s, policy, &dir, &self.cgroup.dir, &[], Some(&dir));
        std::fs::write(dir.join("memtide.toml"), &text)?;
        let mut daemon = Daemon::start(&text, &dir.join("memtide.toml").display().to_string())?;
        let t0 = Instant::now();
        let mut run = DensityRun {
            policy: policy.to_string(),
            ..DensityRun::default()
        };
        let mut admitted: Vec<Admitted> = Vec::new();
        let mut partitioned = 0.0;
        let mut last_admit: Option<f64> = None;
        let mut waiting_logged = false;
        let mut ours_before = process_cpu_s("self");
        let result = (|| -> anyhow::Result<()> {
            for k in 1..=run_s.round() as u64 {
                let due = t0 + Duration::from_secs(k);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    sleep(wait)?;
                }
                let t = t0.elapsed().as_secs_f64();
                if let Some(why) = daemon.failed() {
                    anyhow::bail!("the daemon ended at {t:.0} s: {why}");
                }
                let used = self
                    .cgroup
                    .held()
                    .ok()
                    .map(|held| held as f64 / (1u64 << 20) as f64);
                // Admission.
                let next = admitted.len();
                let arrived = next < queue.len() && t >= next as f64 * d.arrive_every_s;
                let settled = last_admit.is_none_or(|a| t - a >= d.settle_s);
                if arrived && settled {
                    let spec = &queue[next];
                    let (fits, why) = if policy == BASELINE {
                        let take = spec.memory_mib as f64 + d.qemu_overhead_mib;
                        (
                            partitioned + take <= limit - reserve,
                            format!(
                                "partitioned {partitioned:.0} + {take:.0} MiB > {:.0} MiB",
                                limit - reserve
                            ),
                        )
                    } else {
                        let free = limit - used.unwrap_or(limit);
                        let need = self.need_mib(spec, bases);
                        (
                            free >= need + reserve,
                            format!("free {free:.0} MiB < need {need:.0} + reserve {reserve:.0}"),
                        )
                    };
                    if fits {
                        let g =
                            Guest::boot(spec, &dir, &self.kernel_dir, &self.cgroup.procs(), false)?;
                        log!("{} / {name}: {t:.0} s: admitted {}", s.name, spec.name);
                        admitted.push(Admitted {
                            spec: spec.clone(),
                            guest: g,
                            at_s: t,
                            ready: false,
                            first_line_s: None,
                            lines: Vec::new(),
                            oom_kills: 0,
                            first_kill_s: None,
                            exit: None,
                            actual_mib: Vec::new(),
                            cpu_s: None,
                        });
                        partitioned += spec.memory_mib as f64 + d.qemu_overhead_mib;
                        last_admit = Some(t);
                        waiting_logged = false;
                    } else if !waiting_logged {
                        log!("{} / {name}: {t:.0} s: {} waits: {why}", s.name, spec.name);
                        waiting_logged = true;
                    }
                }
                // Sample.
                let mut allocated = 0.0;
                let dt = t - run.t_s.last().copied().unwrap_or(0.0);
                let (mut busy_cpu, mut others_cpu) = (0.0, 0.0);
                let ours = cpu_rate(&mut ours_before, process_cpu_s("self"), dt);
                run.daemon_cpu.push(ours.unwrap_or(0.0));
                for a in admitted.iter_mut().filter(|a| a.exit.is_none()) {
                    if let Err(why) = a.guest.alive() {
                        log!(
                            "{} / {name}: {t:.0} s: {} ended: {why}",
                            s.name,
                            a.spec.name
                        );
                        a.exit = Some((t, why));
                        // No host swap behind the domain: a QEMU that ends was killed
                        // for memory (the cgroup's OOM killer).
                        a.oom_kills += 1;
                        a.first_kill_s.get_or_insert(t);
                        continue;
                    }
                    for line in a.guest.new_lines() {
                        if line.contains("memtide-guest: ready") {
                            a.ready = true;
                        }
                        if line.contains("Out of memory: Killed process") {
                            a.oom_kills += 1;
                            a.first_kill_s.get_or_insert(t);
                        }
                        if let Some(l) = a
                            .spec
                            .workload
                            .as_deref()
                            .and_then(|w| parse_line(w, &line, t))
                        {
                            a.first_line_s.get_or_insert(t);
                            a.lines.push(l);
                        }
                    }
                    let cpu_s = process_cpu_s(&a.guest.pid().to_string());
                    if let Some(used) = cpu_rate(&mut a.cpu_s, cpu_s, dt) {
                        *if busy(&a.spec) {
                            &mut busy_cpu
                        } else {
                            &mut others_cpu
                        } += used;
                    }
                    if a.ready {
                        if let Ok(m) = a.guest.actual_mib(self.rt) {
                            a.actual_mib.push(m);
                            allocated += m;
                        }
                    }
                }
                run.t_s.push(t);
                run.running
                    .push(admitted.iter().filter(|a| a.exit.is_none()).count());
                run.used_mib.push(used);
                run.allocated_mib.push(allocated);
                run.busy_cpu.push(busy_cpu);
                run.others_cpu.push(others_cpu);
                if k % 30 == 0 {
                    log!(
                        "{} / {name}: {t:.0} s: {} guests, domain {:.0} of {limit:.0} MiB",
                        s.name,
                        run.running.last().copied().unwrap_or(0),
                        used.unwrap_or(f64::NAN)
                    );
                }
            }
            Ok(())
        })();
        if let Err(e) = result {
            run.error = Some(format!("{e:#}"));
        }
        if let Ok(st) = daemon.status(self.rt) {
            run.balloon_actions = balloon_actions(&st);
        }
        if let Some(e) = daemon.stop() {
            run.error.get_or_insert(e);
        }
        let end = t0.elapsed().as_secs_f64().min(run_s);
        for a in &admitted {
            let until = a.exit.as_ref().map_or(end, |(t, _)| *t);
            run.vm_seconds += (until - a.at_s).max(0.0);
            run.oom_kills += a.oom_kills;
            run.first_kill_s = run
                .first_kill_s
                .into_iter()
                .chain(a.first_kill_s)
                .min_by(f64::total_cmp);
            let mut vm = json!({
                "name": a.spec.name,
                "memory_mib": a.spec.memory_mib,
                "admitted_s": measure::round2(a.at_s),
                "allocation_mib_mean": mean(a.actual_mib.iter().copied()),
                "oom_kills": a.oom_kills,
                "exit": a.exit.as_ref().map(|(t, why)| format!("{why} at {t:.0} s")),
                "qemu_cpu_s": a.cpu_s.map(measure::round2),
            });
            let first = a.first_line_s.filter(|_| busy(&a.spec));
            let tp = first.and_then(|f| measure::throughput(&a.lines, f + s.warmup_s, until));
            vm["mib_per_s"] = json!(tp.map(measure::round2));
            if let Some(first) = first {
                let from = first + s.warmup_s;
                vm["measured_s"] = json!(measure::round2((until - from).max(0.0)));
                let rates = windows(&a.lines, from, until, d.window_s);
                vm["window_mib_per_s"] = pairs(&rates);
                if let Some(alone) = solo.get(&a.spec.name) {
                    let windows = relative(&rates, *alone);
                    vm["throughput_ratio"] = json!(tp.map(|tp| measure::round2(tp / alone)));
                    vm["windows"] = pairs(&windows);
                    run.busy.push(windows);
                }
            }
            run.vms.push(vm);
        }
        drop(admitted);
        (run.diagnostics, run.action_rules) = self.finish(&dir, name, run.error.as_deref());
        Ok(run)
    }
}

/// Throughput over consecutive windows of `window_s` from `from_s` to `to_s`: (start,
/// MiB/s).
fn windows(lines: &[Line], from_s: f64, to_s: f64, window_s: f64) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    let mut start = from_s;
    while start + window_s <= to_s + 1e-9 {
        if let Some(tp) = measure::throughput(lines, start + 1e-9, start + window_s) {
            out.push((start, tp));
        }
        start += window_s;
    }
    out
}

/// `windows`' throughputs ÷ `alone`.
fn relative(windows: &[(f64, f64)], alone: f64) -> Vec<(f64, f64)> {
    windows.iter().map(|(t, tp)| (*t, tp / alone)).collect()
}

/// `(start, value)` pairs as JSON `[[start, value], ...]`, rounded.
fn pairs(windows: &[(f64, f64)]) -> Value {
    let rounded = windows
        .iter()
        .map(|(t, v)| json!([measure::round2(*t), measure::round2(*v)]));
    json!(rounded.collect::<Vec<_>>())
}

/// `values`, each rounded.
fn rounded(values: &[f64]) -> Vec<f64> {
    values.iter().map(|v| measure::round2(*v)).collect()
}

/// CPU a process used since `last`, its previous reading (then set to `now` where that
/// was read), over `dt` seconds, in cores; `None` without both readings.
fn cpu_rate(last: &mut Option<f64>, now: Option<f64>, dt: f64) -> Option<f64> {
    let used = now
        .zip(*last)
        .map(|(now, before)| (now - before) / dt.max(1e-3));
    *last = now.or(*last);
    used
}

fn mean(values: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    (n > 0).then(|| measure::round2(sum / n as f64))
}

impl DensityRun {
    /// The first moment the service level broke: the start of the first window below
    /// the SLO, or the first OOM kill.
    fn broken_at(&self) -> Option<f64> {
        self.busy
            .iter()
            .flatten()
            .filter(|(_, r)| *r < SLO)
            .map(|(t, _)| *t)
            .chain(self.first_kill_s)
            .min_by(f64::total_cmp)
    }

    /// The policy's result, as JSON.
    pub fn to_json(&self) -> Value {
        let broken = self.broken_at();
        let guests_at_slo = self
            .t_s
            .iter()
            .zip(&self.running)
            .filter(|(t, _)| broken.is_none_or(|b| **t < b))
            .map(|(_, n)| *n)
            .max()
            .unwrap_or(0);
        let windows: usize = self.busy.iter().map(Vec::len).sum();
        let violations = self.busy.iter().flatten().filter(|(_, r)| *r < SLO).count();
        let share = if windows > 0 {
            violations as f64 / windows as f64
        } else {
            0.0
        };
        json!({
            "guests_at_slo": guests_at_slo,
            "vms_admitted": self.vms.len(),
            "vm_hours": measure::round2(self.vm_seconds / 3600.0),
            "slo_violation_share": measure::round2(share),
            "slo_met": share <= SLO_SHARE && self.oom_kills == 0,
            "slo_broken_at_s": broken.map(measure::round2),
            "oom_kills": self.oom_kills,
            "windows": windows,
            "allocation_mib_mean": mean(self.allocated_mib.iter().copied()),
            "domain_used_mib_mean": mean(self.used_mib.iter().flatten().copied()),
            "balloon_actions": self.balloon_actions,
            "action_rules": self.action_rules,
            "diagnostics": self.diagnostics,
            "error": self.error,
            "vms": self.vms,
            "series": {
                "t_s": rounded(&self.t_s),
                "running": self.running,
                "domain_used_mib": self.used_mib.iter().map(|v| v.map(measure::round2)).collect::<Vec<_>>(),
                "allocation_mib": rounded(&self.allocated_mib),
                "busy_qemu_cpu": rounded(&self.busy_cpu),
                "others_qemu_cpu": rounded(&self.others_cpu),
                "daemon_cpu": rounded(&self.daemon_cpu),
            },
        })
    }
}

/// The results document: `{scenario, description, command, commit, environment,
/// settings, candidates (with each one's expected need), solo_mib_per_s, solo_runs, order, policies:
/// {POLICY: {guests_at_slo, vms_admitted, vm_hours, slo_violation_share, oom_kills, ...}},
/// targets}`.
pub fn document(
    b: &Bench<'_>,
    bases: &BTreeMap<String, Base>,
    solo: &Solo,
    runs: &[DensityRun],
    command: String,
    environment: Value,
) -> Value {
    let s = b.scenario;
    let d = b.density();
    let mut doc = json!({
        "scenario": s.name,
        "description": s.description,
        "command": command,
        "commit": environment["git_commit"],
        "environment": environment,
        "settings": {
            "domain_limit_mib": s.domain_limit_mib,
            "run_s": s.run_s,
            "warmup_s": s.warmup_s,
            "interval_s": s.interval_s,
            "arrive_every_s": d.arrive_every_s,
            "settle_s": d.settle_s,
            "window_s": d.window_s,
            "reserve_pct": d.reserve_pct,
            "qemu_overhead_mib": d.qemu_overhead_mib,
            "solo_s": d.solo_s,
            "slo": SLO,
            "slo_share": SLO_SHARE,
            "config": s.config,
        },
        "candidates": s.vms.iter().map(|v| json!({
            "name": v.name,
            "memory_mib": v.memory_mib,
            "workload": v.workload,
            "args": v.args,
            "busy": busy(v),
            "need_mib": measure::round2(b.need_mib(v, bases)),
        })).collect::<Vec<_>>(),
        "solo_mib_per_s": solo.mib_per_s.iter().map(|(k, v)| (k.clone(), json!(measure::round2(*v)))).collect::<serde_json::Map<_, _>>(),
        "solo_runs": solo.runs,
        "order": runs.iter().map(|r| r.policy.clone()).collect::<Vec<_>>(),
        "policies": runs.iter().map(|r| (r.policy.clone(), r.to_json())).collect::<serde_json::Map<_, _>>(),
    });
    doc["targets"] = json!(s
        .targets
        .iter()
        .map(|t| crate::results::check_target(&doc, t))
        .collect::<Vec<_>>());
    doc
}

/// One document from those of harnesses that each ran some of a density scenario's
/// policies side by side (`--merge`): every policy in one table, each keeping the solo
/// throughput its own harness measured (its windows are relative to it) and that
/// harness's command and commit, and the scenario's targets checked over all of them; the
/// rest (settings, candidates, environment) is the first file's. Refused: a scenario
/// without `[density]`, files of another scenario or run under other settings, a file
/// with no policy list, a policy twice.
pub fn merge(scenario: &Scenario, docs: Vec<Value>, command: String) -> anyhow::Result<Value> {
    anyhow::ensure!(
        scenario.density.is_some(),
        "scenario {} has no [density] section: only density results are merged",
        scenario.name
    );
    let mut merged: Option<Value> = None;
    for mut d in docs {
        anyhow::ensure!(
            d["scenario"] == json!(scenario.name),
            "a results file of scenario {} is not one of {}",
            d["scenario"],
            scenario.name
        );
        let order = d["order"]
            .as_array()
            .cloned()
            .with_context(|| format!("a results file of {} lists no policies", scenario.name))?;
        // Each policy keeps what its own harness measured it against.
        for key in ["solo_mib_per_s", "solo_runs", "command", "commit"] {
            let value = d[key].take();
            for p in &order {
                d["policies"][p.as_str().unwrap_or_default()][key] = value.clone();
            }
        }
        let Some(m) = merged.as_mut() else {
            merged = Some(d);
            continue;
        };
        anyhow::ensure!(
            d["settings"] == m["settings"],
            "the results files ran {} under other settings: {} against {}",
            scenario.name,
            d["settings"],
            m["settings"]
        );
        for p in order {
            let name = p.as_str().unwrap_or_default();
            anyhow::ensure!(
                m["policies"].get(name).is_none(),
                "policy {name} is in two results files"
            );
            m["policies"][name] = d["policies"][name].take();
            m["order"].as_array_mut().context("no order")?.push(p);
        }
    }
    let mut doc = merged.context("no results file to merge")?;
    doc["command"] = json!(command);
    doc["commit"] = doc["environment"]["git_commit"].clone();
    doc["targets"] = json!(scenario
        .targets
        .iter()
        .map(|t| crate::results::check_target(&doc, t))
        .collect::<Vec<_>>());
    Ok(doc)
}

/// One line per policy, then the targets.
pub fn summary(doc: &Value) -> String {
    let mut out = format!(
        "{:<10} {:>13} {:>12} {:>8} {:>14} {:>9} {:>12}\n",
        "policy",
        "guests at SLO",
        "VMs admitted",
        "VM-hours",
        "SLO violations",
        "OOM kills",
        "alloc mean"
    );
    for p in doc["order"].as_array().into_iter().flatten() {
        let p = p.as_str().unwrap_or("?");
        let r = &doc["policies"][p];
        out.push_str(&format!(
            "{p:<10} {:>13} {:>12} {:>8.2} {:>13.1}% {:>9} {:>12.0}{}\n",
            r["guests_at_slo"].as_u64().unwrap_or(0),
            r["vms_admitted"].as_u64().unwrap_or(0),
            r["vm_hours"].as_f64().unwrap_or(0.0),
            r["slo_violation_share"].as_f64().unwrap_or(0.0) * 100.0,
            r["oom_kills"].as_u64().unwrap_or(0),
            r["allocation_mib_mean"].as_f64().unwrap_or(f64::NAN),
            r["error"]
                .as_str()
                .map_or(String::new(), |e| format!("  error: {e}"))
        ));
    }
    out.push_str(&crate::results::targets_text(doc));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(at_s: f64, mib_per_s: f64) -> Line {
        Line {
            at_s,
            t: at_s,
            mib_per_s,
            refaults: None,
        }
    }

    fn run(running: &[usize], windows: Vec<(f64, f64)>, kill: Option<f64>) -> DensityRun {
        DensityRun {
            t_s: (0..running.len()).map(|t| t as f64).collect(),
            running: running.to_vec(),
            busy: vec![windows],
            first_kill_s: kill,
            oom_kills: kill.map_or(0, |_| 1),
            vms: vec![json!({}); *running.iter().max().unwrap_or(&0)],
            ..DensityRun::default()
        }
    }

    #[test]
    fn a_solo_run_that_did_not_measure_its_length_is_refused() {
        let run_with = |vm: Value| DensityRun {
            vms: vec![vm],
            ..DensityRun::default()
        };
        let good = json!({"mib_per_s": 200.0, "measured_s": 120.0, "exit": null,
            "window_mib_per_s": [[10.0, 190.0], [30.0, 210.0]]});
        let (tp, vm) = solo_of("busy", 512, &run_with(good.clone()), 120.0).unwrap();
        assert_eq!(tp, 200.0);
        assert_eq!(vm["window_ratios"], json!([[10.0, 0.95], [30.0, 1.05]]));

        let refused =
            |run: DensityRun| format!("{:#}", solo_of("busy", 512, &run, 120.0).unwrap_err());
        assert!(refused(DensityRun::default()).contains("not admitted"));
        let mut short = good.clone();
        short["measured_s"] = json!(100.0);
        assert!(refused(run_with(short)).contains("100 s measured"));
        let mut ended = good.clone();
        ended["exit"] = json!("killed at 50 s");
        assert!(refused(run_with(ended)).contains("killed at 50 s"));
        let mut silent = good;
        silent["mib_per_s"] = Value::Null;
        assert!(refused(run_with(silent)).contains("no report line"));
    }

    #[test]
    fn windows_compare_each_stretch_with_the_solo_rate() {
        let lines: Vec<Line> = (1..=40)
            .map(|t| line(t as f64, if t <= 20 { 100.0 } else { 90.0 }))
            .collect();
        let w = relative(&windows(&lines, 0.5, 40.5, 20.0), 100.0);
        assert_eq!(w.len(), 2);
        assert!((w[0].1 - 1.0).abs() < 1e-9, "{w:?}");
        assert!((w[1].1 - 0.9).abs() < 1e-9, "{w:?}");
    }

    #[test]
    fn guests_at_slo_count_those_running_before_the_first_violation() {
        let r = run(&[1, 2, 3, 4, 5], vec![(0.0, 1.0), (2.5, 0.9)], None);
        let j = r.to_json();
        assert_eq!(j["guests_at_slo"], 3, "running at t = 0, 1, 2");
        assert_eq!(j["vms_admitted"], 5);
        assert_eq!(j["slo_violation_share"], 0.5);
        assert_eq!(j["slo_met"], false);
    }

    #[test]
    fn an_oom_kill_ends_the_count_like_a_violation() {
        let r = run(&[1, 2, 3, 4], vec![(0.0, 1.0), (2.0, 0.99)], Some(1.5));
        assert_eq!(r.to_json()["guests_at_slo"], 2);
        assert_eq!(r.to_json()["slo_met"], false);
    }

    /// A harness's document of one policy, as `document` writes it.
    fn harness_doc(policy: &str, guests_at_slo: u64, solo: f64, run_s: f64) -> Value {
        json!({
            "scenario": "density",
            "command": format!("memtide-bench density.toml --policies {policy}"),
            "commit": "abc1234",
            "settings": {"run_s": run_s},
            "solo_mib_per_s": {"busy": solo},
            "order": [policy],
            "policies": {policy: {"guests_at_slo": guests_at_slo}},
            "targets": [],
        })
    }

    #[test]
    fn merged_harnesses_are_one_table_with_the_targets_checked_over_all() {
        let scenario = Scenario::load(std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../bench/scenarios/density.toml"
        )))
        .unwrap();
        let docs = vec![
            harness_doc("mom", 5, 100.0, 300.0),
            harness_doc("memtide", 7, 98.0, 300.0),
        ];
        let m = merge(&scenario, docs, "merged".into()).unwrap();
        assert_eq!(m["order"], json!(["mom", "memtide"]));
        assert_eq!(m["policies"]["memtide"]["solo_mib_per_s"]["busy"], 98.0);
        assert_eq!(m["policies"]["mom"]["solo_mib_per_s"]["busy"], 100.0);
        assert_eq!(m["command"], "merged");
        let of_mom = &m["targets"][1];
        assert_eq!(of_mom["target"], "memtide guests_at_slo ≥ 1.2 × mom");
        assert_eq!(
            (&of_mom["bound"], &of_mom["met"]),
            (&json!(6.0), &json!(true))
        );
        // Another run length, or a policy twice, is not one comparison.
        let other = vec![
            harness_doc("mom", 5, 100.0, 300.0),
            harness_doc("memtide", 7, 98.0, 200.0),
        ];
        let e = merge(&scenario, other, "m".into()).unwrap_err().to_string();
        assert!(e.contains("other settings"), "{e}");
        let twice = vec![
            harness_doc("mom", 5, 100.0, 300.0),
            harness_doc("mom", 6, 98.0, 300.0),
        ];
        let e = merge(&scenario, twice, "m".into()).unwrap_err().to_string();
        assert!(e.contains("policy mom is in two results files"), "{e}");
        let mut unlisted = harness_doc("mom", 5, 100.0, 300.0);
        unlisted.as_object_mut().unwrap().remove("order");
        let e = merge(&scenario, vec![unlisted], "m".into())
            .unwrap_err()
            .to_string();
        assert!(e.contains("lists no policies"), "{e}");
    }

    #[test]
    fn a_run_that_keeps_the_slo_counts_every_guest() {
        let r = run(&[1, 2, 3], vec![(0.0, 0.97), (1.0, 1.02)], None);
        let j = r.to_json();
        assert_eq!(j["guests_at_slo"], 3);
        assert_eq!(j["slo_met"], true);
    }
}
