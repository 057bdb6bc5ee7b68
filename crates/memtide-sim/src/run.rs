//! Running a scenario: the world advances, the engine decides through the same adapter
//! traits as the daemon, its actions are applied, and everything is measured.

use crate::backend::{SharedWorld, SimHost, SimVm};
use crate::guest::{bytes, mib, mib_of, pages, PAGE_SIZE};
use crate::report::{
    CompareReport, PolicyErrors, Report, Series, Summary, TierSummary, VmSeries, VmSummary,
};
use crate::resize::{ResizeTracker, Tick};
use crate::scenario::Scenario;
use crate::world::World;
use futures::FutureExt;
use memtide_core::backend::{HostBackend, VmBackend};
use memtide_core::policy::Policy;
use memtide_core::snapshot::{Snapshot, VmLimits, VmSnapshot};
use memtide_core::{Action, Decision, Engine, EngineConfig};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Points kept per time series (for plots), whatever the number of ticks.
const SERIES_POINTS: u64 = 600;

/// A scenario being run under one policy.
pub struct Simulation {
    scenario: String,
    seed: u64,
    tick_s: f64,
    ticks: u64,
    world: SharedWorld,
    host: SimHost,
    vms: Vec<SimVm>,
    by_name: BTreeMap<String, usize>,
    /// Every VM as the engine first sees it, in scenario order.
    unsampled: Vec<VmSnapshot>,
    /// The started VMs (indices into `vms`), in the order of `snapshot.vms`.
    started: Vec<usize>,
    engine: Engine,
    snapshot: Snapshot,
    measure: Measure,
}

/// Run `scenario` under `policy` with the engine settings `engine`, all random choices
/// drawn from `seed`.
pub fn run(
    scenario: &Scenario,
    policy: Box<dyn Policy>,
    engine: EngineConfig,
    seed: u64,
) -> Report {
    Simulation::new(scenario, policy, engine, seed).run_with(|_, _| {})
}

/// Run `scenario` under each policy (named by its label), with the same seed.
pub fn compare(
    scenario: &Scenario,
    policies: Vec<(String, Box<dyn Policy>)>,
    engine: EngineConfig,
    seed: u64,
) -> CompareReport {
    let runs = policies
        .into_iter()
        .map(|(label, policy)| (label, run(scenario, policy, engine.clone(), seed)))
        .collect();
    CompareReport { runs }
}

impl Simulation {
    /// Set up `scenario` under `policy`.
    pub fn new(
        scenario: &Scenario,
        policy: Box<dyn Policy>,
        engine: EngineConfig,
        seed: u64,
    ) -> Simulation {
        let world = World::new(scenario, seed);
        let specs = scenario.expand();
        let snapshot = Snapshot {
            at: Duration::ZERO,
            host: world.host_stats(),
            vms: specs
                .iter()
                .map(|(name, spec)| VmSnapshot {
                    name: name.clone(),
                    limits: VmLimits {
                        min: bytes(pages(spec.min_mib())),
                        max: bytes(pages(spec.max_mib())),
                        shares: spec.shares,
                    },
                    target: None,
                    sample: Err(memtide_core::BackendError::Disconnected(
                        "not sampled yet".into(),
                    )),
                })
                .collect(),
        };
        let measure = Measure::new(scenario, &specs);
        let world = Arc::new(Mutex::new(world));
        let unsampled = snapshot.vms.clone();
        Simulation {
            scenario: scenario.name.clone(),
            seed,
            tick_s: scenario.tick_s,
            ticks: scenario.ticks,
            host: SimHost::new(world.clone()),
            vms: (0..specs.len())
                .map(|i| SimVm::new(world.clone(), i))
                .collect(),
            by_name: specs
                .iter()
                .enumerate()
                .map(|(i, (name, _))| (name.clone(), i))
                .collect(),
            started: (0..unsampled.len()).collect(),
            unsampled,
            world,
            engine: Engine::new(engine, policy),
            snapshot,
            measure,
        }
    }

    /// Hold every VM before it starts: none runs or holds memory until admitted.
    pub(crate) fn hold_all(&mut self) {
        self.lock().hold_all();
        self.started.clear();
        self.snapshot.vms.clear();
    }

    /// Start VM `i` (scenario order) now; the engine sees it from the next tick.
    pub(crate) fn admit(&mut self, i: usize) {
        self.lock().start(i);
        self.started.push(i);
        self.snapshot.vms.push(self.unsampled[i].clone());
    }

    /// The world, locked.
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, World> {
        self.world.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Run every tick, showing each snapshot and decision to `observe` (e.g. a recorder).
    pub fn run_with(mut self, mut observe: impl FnMut(&Snapshot, &Decision)) -> Report {
        let start = Instant::now();
        for tick in 1..=self.ticks {
            let decision = self.step(tick);
            observe(&self.snapshot, &decision);
        }
        let wall_s = start.elapsed().as_secs_f64();
        let world = self.world.lock().unwrap_or_else(|e| e.into_inner());
        self.measure.finish(
            &world,
            self.scenario,
            self.engine.policy_name().to_string(),
            self.seed,
            wall_s,
        )
    }

    /// One tick: advance the world, collect through the backends, decide, act, measure.
    pub(crate) fn step(&mut self, tick: u64) -> Decision {
        self.world
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .advance(self.tick_s);
        self.snapshot.at = Duration::from_secs_f64(tick as f64 * self.tick_s);
        self.snapshot.host = self
            .host
            .sample()
            .expect("the simulated host always answers");
        for (&i, snap) in self.started.iter().zip(&mut self.snapshot.vms) {
            let vm = &mut self.vms[i];
            snap.sample = vm
                .sample()
                .now_or_never()
                .expect("simulated backends answer at once");
            snap.target = vm.target();
        }
        let decision = self.engine.tick(&self.snapshot);
        self.measure.policy_errors.observe(&decision);
        for action in &decision.actions {
            match action {
                Action::SetBalloon { vm, target, .. } => {
                    let i = self.by_name[vm];
                    self.vms[i]
                        .set_balloon(*target)
                        .now_or_never()
                        .expect("simulated backends answer at once")
                        .expect("the engine only resizes VMs with a balloon");
                    self.measure.balloon_actions += 1;
                }
                Action::SetKsm { settings, .. } => {
                    self.host
                        .apply_ksm(settings)
                        .expect("the simulated host accepts KSM knobs");
                    self.measure.ksm_actions += 1;
                }
            }
        }
        let world = self.world.lock().unwrap_or_else(|e| e.into_inner());
        let targets = self.vms.iter().map(|vm| vm.target());
        self.measure.observe(&world, tick, targets);
        decision
    }

    /// The ticks the policy failed in so far.
    pub(crate) fn policy_errors(&self) -> &PolicyErrors {
        &self.measure.policy_errors
    }
}

/// Running totals of one VM.
#[derive(Default)]
struct VmMeasure {
    touched: f64,
    given: f64,
    given_max: u64,
    working_set: f64,
    resident: f64,
    guest_swap_ins: u64,
    guest_swap_outs: u64,
    host_swap_ins: u64,
    guest_oom_kills: u64,
    oom_deflations: u64,
    resize: ResizeTracker,
    over_target: u64,
    short: u64,
}

/// What a run measures as it goes.
struct Measure {
    tick_s: f64,
    every: u64,
    vms: Vec<VmMeasure>,
    series: Series,
    host_free_sum: f64,
    host_free_min: u64,
    ksm_saved_sum: f64,
    balloon_actions: u64,
    ksm_actions: u64,
    policy_errors: PolicyErrors,
    ticks: u64,
}

impl Measure {
    fn new(scenario: &Scenario, specs: &[(String, &crate::scenario::VmSpec)]) -> Self {
        let every = scenario.ticks.div_ceil(SERIES_POINTS).max(1);
        Measure {
            tick_s: scenario.tick_s,
            every,
            vms: specs.iter().map(|_| VmMeasure::default()).collect(),
            series: Series {
                tick_s: scenario.tick_s,
                host_total_mib: scenario.host.memory_mib,
                host_reserved_mib: scenario.host.reserved_mib,
                t_s: Vec::new(),
                host_free_mib: Vec::new(),
                host_cache_mib: Vec::new(),
                host_swap_mib: Vec::new(),
                ksm_saved_mib: Vec::new(),
                vms: specs
                    .iter()
                    .map(|(name, _)| VmSeries {
                        name: name.clone(),
                        ..VmSeries::default()
                    })
                    .collect(),
            },
            host_free_sum: 0.0,
            host_free_min: u64::MAX,
            ksm_saved_sum: 0.0,
            balloon_actions: 0,
            ksm_actions: 0,
            policy_errors: PolicyErrors::default(),
            ticks: 0,
        }
    }

    fn observe(
        &mut self,
        world: &World,
        tick: u64,
        targets: impl Iterator<Item = Option<memtide_core::Bytes>>,
    ) {
        self.ticks += 1;
        let free = world.host.free(&world.guests);
        self.host_free_sum += free as f64;
        self.host_free_min = self.host_free_min.min(free);
        self.ksm_saved_sum += world.host.ksm_saved() as f64;
        let keep = tick.is_multiple_of(self.every);
        if keep {
            let s = &mut self.series;
            s.t_s.push(tick as f64 * self.tick_s);
            s.host_free_mib.push(mib(free) as f32);
            s.host_cache_mib.push(mib(world.host.cache) as f32);
            s.host_swap_mib
                .push(mib(crate::host::Host::swap_used(&world.guests)) as f32);
            s.ksm_saved_mib.push(mib(world.host.ksm_saved()) as f32);
        }
        for (i, ((m, g), target)) in self
            .vms
            .iter_mut()
            .zip(&world.guests)
            .zip(targets)
            .enumerate()
        {
            let actual = g.actual();
            let ws = g.working_set();
            let resident = g.host_resident().saturating_sub(world.host.ksm_saved_by(i));
            m.touched += g.last.touched;
            m.given += actual as f64;
            m.given_max = m.given_max.max(actual);
            m.working_set += ws as f64;
            m.resident += resident as f64;
            m.guest_swap_ins += g.last.swap_in;
            m.guest_swap_outs += g.last.swap_out;
            m.host_swap_ins += g.last.host_swap_in;
            m.guest_oom_kills += g.last.oom_kills;
            m.oom_deflations += g.last.oom_deflations;
            if let Some(t) = target {
                let t = t.0 / PAGE_SIZE;
                if actual > t + pages(1.0).max(t / 100) {
                    m.over_target += 1;
                }
            }
            let short = g.swap_ws + g.file_evicted > 0;
            if short {
                m.short += 1;
            }
            m.resize.observe(
                Tick {
                    tick,
                    short,
                    target: target.map(|t| t.0 / PAGE_SIZE),
                    actual,
                    configured: g.params().configured,
                    working_set: ws,
                },
                self.tick_s,
            );
            if keep {
                let v = &mut self.series.vms[i];
                v.given_mib.push(mib(actual) as f32);
                v.working_set_mib.push(mib(ws) as f32);
                v.resident_mib.push(mib(resident) as f32);
            }
        }
    }

    fn finish(
        self,
        world: &World,
        scenario: String,
        policy: String,
        seed: u64,
        wall_s: f64,
    ) -> Report {
        let n = self.ticks.max(1) as f64;
        let secs = n * self.tick_s;
        let per_vm: Vec<VmSummary> = self
            .vms
            .iter()
            .zip(&self.series.vms)
            .zip(&world.vms)
            .map(|((m, s), side)| VmSummary {
                name: s.name.clone(),
                throughput_mib_s: mib_of(m.touched / secs),
                given_mean_mib: mib_of(m.given / n),
                given_max_mib: mib(m.given_max),
                working_set_mean_mib: mib_of(m.working_set / n),
                host_resident_mean_mib: mib_of(m.resident / n),
                guest_swap_ins: m.guest_swap_ins,
                host_swap_ins: m.host_swap_ins,
                guest_oom_kills: m.guest_oom_kills,
                host_oom_kills: side.host_oom_kills,
                oom_kills: m.guest_oom_kills + side.host_oom_kills,
                oom_deflations: m.oom_deflations,
                over_target_s: m.over_target as f64 * self.tick_s,
                short_s: m.short as f64 * self.tick_s,
            })
            .collect();
        let host = &world.host.counters;
        let ws_mean: f64 = self.vms.iter().map(|m| m.working_set / n).sum();
        let tiers = world.tiers.as_ref().map(|t| {
            let c = &t.counters;
            let per_min_pct = |promoted: f64, minutes: f64| {
                100.0 * promoted / minutes.max(f64::MIN_POSITIVE) / ws_mean.max(1.0)
            };
            TierSummary {
                placement: t.placement().as_str().to_string(),
                fast_mib: mib_of(t.fast_pages()),
                cold_age_s: t.cold_age_s(),
                adaptive_age: t.adaptive_age(),
                mean_cold_age_s: t.mean_cold_age_s(),
                slow_share: c.slow_sum / c.resident_sum.max(1.0),
                slow_access_share: c.touched_slow / c.touched.max(1.0),
                demotions: c.demotions.round() as u64,
                promotions: c.promotions.round() as u64,
                cold_promotions: c.cold_promotions.round() as u64,
                promotions_ws_pct_min: per_min_pct(c.cold_promotions, secs / 60.0),
                promotions_ws_pct_min_late: per_min_pct(c.cold_promotions_late, secs / 120.0),
                all_promotions_ws_pct_min: per_min_pct(c.promotions, secs / 60.0),
                fresh_on_slow_ws_pct_min: per_min_pct(c.fresh_on_slow, secs / 60.0),
            }
        });
        let summary = Summary {
            scenario,
            policy,
            vms: per_vm.len(),
            ticks: self.ticks,
            tick_s: self.tick_s,
            seed,
            total_throughput: per_vm.iter().map(|v| v.throughput_mib_s).sum(),
            guest_swap_ins: per_vm.iter().map(|v| v.guest_swap_ins).sum(),
            guest_swap_outs: self.vms.iter().map(|m| m.guest_swap_outs).sum(),
            host_swap_ins: host.swap_in,
            host_swap_outs: host.swap_out,
            oom_kills: per_vm.iter().map(|v| v.oom_kills).sum(),
            oom_deflations: per_vm.iter().map(|v| v.oom_deflations).sum(),
            resize: ResizeTracker::summary(self.vms.iter().map(|m| &m.resize)),
            balloon_actions: self.balloon_actions,
            ksm_actions: self.ksm_actions,
            host_free_mean_mib: mib_of(self.host_free_sum / n),
            host_free_min_mib: mib(self.host_free_min),
            ksm_saved_mean_mib: mib_of(self.ksm_saved_sum / n),
            wall_s,
            tiers,
            policy_errors: self.policy_errors,
            per_vm,
        };
        Report {
            summary,
            series: self.series,
        }
    }
}
