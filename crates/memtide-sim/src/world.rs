//! The simulated world: the host, its guests and their workloads, advanced tick by tick.
//! Pure model code; [`crate::backend`] exposes it through memtide's adapter traits.

use crate::guest::{bytes, pages, Guest, GuestParams};
use crate::host::Host;
use crate::lie::Lie;
use crate::rng::Rng;
use crate::scenario::{Costs, Scenario};
use crate::tiers::Tiers;
use crate::workload::{Demand, Workload};
use memtide_core::snapshot::{VmEvent, VmSample};
use memtide_core::stats::HostStats;

/// Everything simulated.
#[derive(Clone, Debug)]
pub struct World {
    /// Simulated time (s).
    pub t: f64,
    costs: Costs,
    /// The host.
    pub host: Host,
    /// The guests' memory, in scenario order.
    pub guests: Vec<Guest>,
    /// Per guest: what runs in it and how it is connected.
    pub vms: Vec<VmSide>,
    /// The host's fast and slow tiers, on a two-tier host.
    pub tiers: Option<Tiers>,
}

/// A guest's workload, devices and what the host did to it.
#[derive(Clone, Debug)]
pub struct VmSide {
    workload: Workload,
    /// The workload's last demand.
    pub demand: Demand,
    /// Whether the VM has a balloon device.
    pub balloon_device: bool,
    /// Whether the guest runs an agent reporting its own /proc figures.
    pub agent: bool,
    /// How the guest misreports its memory, if it does.
    lie: Option<Lie>,
    /// Times the host killed this VM.
    pub host_oom_kills: u64,
    /// Time until the workload restarts after an OOM kill (s).
    down_s: f64,
    events: Vec<VmEvent>,
    /// When the VM was started (s); `None` while it waits to be admitted (it holds no
    /// memory and does not run). Its workload's timeline starts then.
    pub started_at: Option<f64>,
    /// Its guest's untouched pages over the last cold age.
    untouched: WindowMin,
}

/// How long guest memory must go untouched for the host's access tracking to count it
/// cold (memtide's tracker's default; Google's far-memory work uses 120 s, ASPLOS'19).
pub const COLD_AGE_S: f64 = 120.0;

/// The least of a figure over the last [`COLD_AGE_S`]: no more pages can have gone
/// untouched for that long than the fewest that were untouched at any moment of it.
#[derive(Clone, Debug, Default)]
struct WindowMin {
    /// (time, value), values rising from front to back: the front is the least.
    samples: std::collections::VecDeque<(f64, f64)>,
    since: f64,
}

impl WindowMin {
    fn restart(&mut self, t: f64) {
        self.samples.clear();
        self.since = t;
    }

    fn push(&mut self, t: f64, value: f64) {
        while self.samples.back().is_some_and(|(_, v)| *v >= value) {
            self.samples.pop_back();
        }
        self.samples.push_back((t, value));
        while self
            .samples
            .front()
            .is_some_and(|(at, _)| *at < t - COLD_AGE_S)
        {
            self.samples.pop_front();
        }
    }

    /// The least over the window ending at `t`; none before a whole window has passed.
    fn least(&self, t: f64) -> f64 {
        match self.samples.front() {
            Some((_, v)) if t - self.since >= COLD_AGE_S => *v,
            _ => 0.0,
        }
    }
}

impl World {
    /// The scenario's world at time 0, every random choice drawn from `seed`.
    pub fn new(scenario: &Scenario, seed: u64) -> World {
        let vms = scenario.expand();
        let mut guests = Vec::with_capacity(vms.len());
        let mut sides = Vec::with_capacity(vms.len());
        for (i, (_, spec)) in vms.iter().enumerate() {
            let stream = 2 * i as u64 + 1;
            let params = GuestParams {
                deflate_on_oom: scenario.host.deflate_on_oom,
                free_page_reporting: scenario.host.free_page_reporting,
                ..GuestParams::from_spec(spec)
            };
            let mut guest = Guest::boot(params, Rng::fork(seed, stream));
            if let Some(start) = spec.start_mib {
                guest.set_target(pages(start));
            }
            guests.push(guest);
            sides.push(VmSide {
                workload: Workload::new(&spec.workload, Rng::fork(seed, stream + 1)),
                demand: Demand::default(),
                balloon_device: spec.balloon,
                agent: spec.agent,
                lie: spec.lie,
                host_oom_kills: 0,
                down_s: 0.0,
                events: Vec::new(),
                started_at: Some(0.0),
                untouched: WindowMin::default(),
            });
        }
        World {
            t: 0.0,
            costs: scenario.costs.clone(),
            host: Host::new(&scenario.host, vms.len(), Rng::fork(seed, 0)),
            guests,
            vms: sides,
            tiers: Tiers::new(scenario),
        }
    }

    /// Stop every VM before it started: none holds memory until [`World::start`].
    pub fn hold_all(&mut self) {
        for (g, side) in self.guests.iter_mut().zip(&mut self.vms) {
            g.hold();
            side.started_at = None;
        }
    }

    /// Boot VM `i` now (a VM waiting to be admitted).
    pub fn start(&mut self, i: usize) {
        self.guests[i].reboot();
        self.vms[i].started_at = Some(self.t);
        self.vms[i].untouched.restart(self.t);
    }

    /// Advance by `dt` seconds: every workload runs in its guest, then the host settles.
    pub fn advance(&mut self, dt: f64) {
        self.t += dt;
        for (g, side) in self.guests.iter_mut().zip(&mut self.vms) {
            let Some(started_at) = side.started_at else {
                continue;
            };
            side.demand = if side.down_s > 0.0 {
                side.down_s -= dt;
                Demand {
                    stopped: true,
                    ..Demand::default()
                }
            } else {
                side.workload.demand(self.t - started_at)
            };
            g.step(dt, &side.demand, &self.costs);
            side.untouched.push(self.t, g.untouched_for(COLD_AGE_S));
            if g.last.oom_kills > 0 {
                side.down_s = side.workload.spec().oom_restart_s;
            }
        }
        for i in self.host.settle(&mut self.guests, dt) {
            let side = &mut self.vms[i];
            side.host_oom_kills += 1;
            side.events.push(VmEvent::Reset);
        }
        if let Some(tiers) = &mut self.tiers {
            tiers.step(&mut self.guests, dt);
        }
    }

    /// What VM `i`'s hypervisor reports now; events are reported once.
    pub fn sample(&mut self, i: usize) -> VmSample {
        let g = &self.guests[i];
        let side = &mut self.vms[i];
        let mut stats = g.stats(self.t as u64);
        let mut agent = side.agent.then(|| g.agent_stats());
        if let Some(lie) = side.lie {
            lie.balloon(&mut stats, self.t);
            if let Some(a) = &mut agent {
                lie.agent(a, self.t);
            }
        }
        VmSample {
            ram_mappings: Vec::new(),
            configured: bytes(g.params().configured),
            balloon: side.balloon_device.then(|| bytes(g.actual())),
            stats,
            agent: agent.map(Ok),
            rss: Some(bytes(g.host_resident())),
            swapped: Some(bytes(g.host_swapped())),
            cpu_s: None,
            referenced: Some(bytes(g.last.referenced as u64)),
            cold: Some(bytes(side.untouched.least(self.t) as u64)),
            virtio_mem: None,
            free_page_reporting: g.params().free_page_reporting,
            fixed: None,
            events: std::mem::take(&mut side.events),
        }
    }

    /// The host's statistics now.
    pub fn host_stats(&self) -> HostStats {
        self.host.stats(&self.guests)
    }
}
