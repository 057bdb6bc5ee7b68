//! The density benchmark: how many VMs a policy lets a host run at the same service level.
//!
//! The scenario's VMs arrive one after another (`arrive_every_s`) into a queue. One
//! admission rule serves every policy: the VM at the head is started when the domain's
//! free memory, as the policy leaves it, exceeds the VM's expected need (its mean working
//! set and kernel when it runs alone) plus a reserve; `none` is static partitioning (the
//! VMs' configured sizes must fit). After each admission the host settles for
//! `settle_s`. Every admitted VM runs its workload to the end of the run.
//!
//! Each VM's throughput is compared, window by window on its own timeline, with what it
//! does running alone on the host; a window below 95% of that is an SLO violation. Since
//! a larger reserve admits fewer VMs and hurts less, every reserve of the sweep is run,
//! and a policy's result is its run with the most VMs admitted among those that keep
//! violations at or below 5% of VM-time with no OOM kill.

use crate::guest::pages;
use crate::report::PolicyErrors;
use crate::run::Simulation;
use crate::scenario::{DensitySpec, Scenario};
use memtide_core::policy::Policy;
use memtide_core::EngineConfig;
use serde::Serialize;
use std::collections::BTreeMap;

/// Throughput below this share of the solo run's is an SLO violation.
pub const SLO: f64 = 0.95;
/// The most VM-time in violation a run may have to count.
pub const SLO_SHARE: f64 = 0.05;

/// Makes a fresh policy (each run starts with a new one).
pub type PolicyFactory<'a> = &'a dyn Fn() -> Box<dyn Policy>;

/// One run of the sweep.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DensityRun {
    /// The reserve, as a share of the domain (%).
    pub reserve_pct: f64,
    /// VMs started.
    pub vms_admitted: usize,
    /// VM-hours served.
    pub vm_hours: f64,
    /// Share of VM-time (windows) below 95% of solo throughput.
    pub slo_violation_share: f64,
    /// Processes (guest OOM) and VMs (host OOM) killed.
    pub oom_kills: u64,
    /// Times deflate-on-oom saved a guest (0 unless the scenario's host has it).
    pub oom_deflations: u64,
    /// Ticks in which the policy failed.
    #[serde(skip_serializing_if = "PolicyErrors::is_none")]
    pub policy_errors: PolicyErrors,
    /// Per admitted VM: when it was started (s) and its throughput relative to solo.
    pub vms: Vec<AdmittedVm>,
}

/// One admitted VM.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AdmittedVm {
    /// Its name.
    pub name: String,
    /// When it was started (s).
    pub admitted_s: f64,
    /// Its work done over its work done alone, over the same part of its timeline.
    pub relative_throughput: f64,
}

/// A policy's result: its best run meeting the SLO, and every run of the sweep.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PolicyDensity {
    /// VMs admitted in the best run meeting the SLO (0 if none did).
    pub vms_admitted: usize,
    /// VM-hours served in that run.
    pub vm_hours: f64,
    /// Its share of VM-time below 95% of solo throughput.
    pub slo_violation_share: f64,
    /// Its OOM kills.
    pub oom_kills: u64,
    /// Its reserve (%), if a run met the SLO.
    pub reserve_pct: Option<f64>,
    /// Every run.
    pub sweep: Vec<DensityRun>,
}

/// The benchmark's result.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DensityReport {
    /// The scenario.
    pub scenario: String,
    /// The seed.
    pub seed: u64,
    /// Simulated seconds.
    pub duration_s: f64,
    /// Ticks each run lasts.
    pub ticks: u64,
    /// VMs in the arrival queue.
    pub candidates: usize,
    /// The admission settings.
    pub density: DensitySpec,
    /// Results by policy label.
    pub policies: BTreeMap<String, PolicyDensity>,
    /// The labels in the order given, the table's order.
    #[serde(skip)]
    pub order: Vec<String>,
}

/// What each VM does alone on the host: work per tick (pages) and its expected need (pages).
struct Solo {
    work: Vec<Vec<f64>>,
    need: Vec<u64>,
}

fn solo(scenario: &Scenario, engine: &EngineConfig, seed: u64) -> Solo {
    let n = scenario.expand().len();
    let mut work = Vec::with_capacity(n);
    let mut need = Vec::with_capacity(n);
    for i in 0..n {
        let mut sim = Simulation::new(
            scenario,
            Box::new(memtide_core::policy::none::Unmanaged),
            engine.clone(),
            seed,
        );
        sim.hold_all();
        sim.admit(i);
        let mut w = Vec::with_capacity(scenario.ticks as usize);
        let mut used = 0.0;
        for tick in 1..=scenario.ticks {
            sim.step(tick);
            let world = sim.lock();
            let g = &world.guests[i];
            w.push(g.last.touched);
            used += (g.working_set() + g.kernel.pages) as f64;
        }
        work.push(w);
        need.push((used / scenario.ticks as f64) as u64);
    }
    Solo { work, need }
}

/// Run the benchmark for each policy (label, factory; `none` is static partitioning).
pub fn density(
    scenario: &Scenario,
    policies: &[(String, PolicyFactory<'_>)],
    engine: &EngineConfig,
    seed: u64,
) -> DensityReport {
    let spec = scenario.density.clone().unwrap_or_default();
    let solo = solo(scenario, engine, seed);
    let results = policies
        .iter()
        .map(|(label, make)| {
            let sweep: Vec<DensityRun> = spec
                .reserves_pct
                .iter()
                .map(|&r| {
                    run_one(
                        scenario,
                        &spec,
                        &solo,
                        label == "none",
                        make(),
                        engine,
                        seed,
                        r,
                    )
                })
                .collect();
            // The most VMs, then the most VM-hours, then the smallest reserve.
            let best = sweep
                .iter()
                .filter(|r| r.slo_violation_share <= SLO_SHARE && r.oom_kills == 0)
                .max_by(|a, b| {
                    (a.vms_admitted.cmp(&b.vms_admitted))
                        .then(a.vm_hours.total_cmp(&b.vm_hours))
                        .then(b.reserve_pct.total_cmp(&a.reserve_pct))
                });
            let result = PolicyDensity {
                vms_admitted: best.map_or(0, |r| r.vms_admitted),
                vm_hours: best.map_or(0.0, |r| r.vm_hours),
                slo_violation_share: best.map_or(0.0, |r| r.slo_violation_share),
                oom_kills: best.map_or(0, |r| r.oom_kills),
                reserve_pct: best.map(|r| r.reserve_pct),
                sweep: sweep.clone(),
            };
            (label.clone(), result)
        })
        .collect();
    DensityReport {
        scenario: scenario.name.clone(),
        seed,
        duration_s: scenario.ticks as f64 * scenario.tick_s,
        ticks: scenario.ticks,
        candidates: solo.need.len(),
        density: spec,
        policies: results,
        order: policies.iter().map(|(label, _)| label.clone()).collect(),
    }
}

#[allow(clippy::too_many_arguments)]
fn run_one(
    scenario: &Scenario,
    spec: &DensitySpec,
    solo: &Solo,
    static_partitioning: bool,
    policy: Box<dyn Policy>,
    engine: &EngineConfig,
    seed: u64,
    reserve_pct: f64,
) -> DensityRun {
    let vms = scenario.expand();
    let host = &scenario.host;
    let reserve = pages(host.memory_mib * reserve_pct / 100.0);
    let partition =
        pages(host.memory_mib - host.reserved_mib) - reserve.min(pages(host.memory_mib));
    let mut sim = Simulation::new(scenario, policy, engine.clone(), seed);
    sim.hold_all();
    let mut admitted: Vec<(usize, u64)> = Vec::new(); // (VM, tick started)
    let mut configured = 0;
    let mut last_admit: Option<f64> = None;
    let mut work: Vec<Vec<f64>> = vec![Vec::new(); vms.len()];
    for tick in 1..=scenario.ticks {
        let t = (tick - 1) as f64 * scenario.tick_s;
        let head = admitted.len();
        let arrived = head < vms.len() && t >= head as f64 * spec.arrive_every_s;
        let settled = last_admit.is_none_or(|at| t - at >= spec.settle_s);
        if arrived && settled {
            let size = pages(vms[head].1.memory_mib);
            let fits = if static_partitioning {
                configured + size <= partition
            } else {
                let world = sim.lock();
                world.host.free(&world.guests) >= solo.need[head] + reserve
            };
            if fits {
                sim.admit(head);
                admitted.push((head, tick));
                configured += size;
                last_admit = Some(t);
            }
        }
        sim.step(tick);
        let world = sim.lock();
        for &(i, _) in &admitted {
            work[i].push(world.guests[i].last.touched);
        }
    }
    let world = sim.lock();
    let window = ((spec.window_s / scenario.tick_s).round() as usize).max(1);
    let (mut windows, mut violations) = (0usize, 0usize);
    let mut out = Vec::with_capacity(admitted.len());
    for &(i, started) in &admitted {
        let mine = &work[i];
        let alone = &solo.work[i][..mine.len()];
        for (m, a) in mine.chunks(window).zip(alone.chunks(window)) {
            if m.len() < window {
                break; // a partial last window says little
            }
            let (m, a): (f64, f64) = (m.iter().sum(), a.iter().sum());
            windows += 1;
            if m < a * SLO {
                violations += 1;
            }
        }
        let (m, a): (f64, f64) = (mine.iter().sum(), alone.iter().sum());
        out.push(AdmittedVm {
            name: vms[i].0.clone(),
            admitted_s: (started - 1) as f64 * scenario.tick_s,
            relative_throughput: if a > 0.0 { m / a } else { 1.0 },
        });
    }
    let counters = admitted.iter().map(|&(i, _)| &world.guests[i].counters);
    let oom_kills: u64 = counters.clone().map(|c| c.oom_kills).sum::<u64>()
        + admitted
            .iter()
            .map(|&(i, _)| world.vms[i].host_oom_kills)
            .sum::<u64>();
    let active_ticks: usize = admitted.iter().map(|&(i, _)| work[i].len()).sum();
    DensityRun {
        reserve_pct,
        vms_admitted: admitted.len(),
        vm_hours: active_ticks as f64 * scenario.tick_s / 3600.0,
        slo_violation_share: if windows > 0 {
            violations as f64 / windows as f64
        } else {
            0.0
        },
        oom_kills,
        oom_deflations: counters.map(|c| c.oom_deflations).sum(),
        policy_errors: sim.policy_errors().clone(),
        vms: out,
    }
}

impl DensityReport {
    /// One line per policy: VMs admitted at the SLO, VM-hours, violations, OOM kills.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{:<10}  {:>12}  {:>8}  {:>14}  {:>9}  {:>8}\n",
            "policy", "VMs admitted", "VM-hours", "SLO violations", "OOM kills", "reserve"
        );
        let in_order = || self.order.iter().map(|l| (l, &self.policies[l]));
        for (label, p) in in_order() {
            out.push_str(&format!(
                "{label:<10}  {:>12}  {:>8.1}  {:>13.1}%  {:>9}  {:>8}\n",
                p.vms_admitted,
                p.vm_hours,
                p.slo_violation_share * 100.0,
                p.oom_kills,
                p.reserve_pct
                    .map_or("none met".to_string(), |r| format!("{r}%"))
            ));
        }
        for (label, p) in in_order() {
            let failed = p.sweep.iter().map(|r| &r.policy_errors);
            if let Some(w) = failed.filter_map(|e| e.warning(label, self.ticks)).next() {
                out.push_str(&w);
                out.push('\n');
            }
        }
        out
    }
}
