//! A two-tier host: part of the host's memory is DRAM (the fast tier), the rest a slower
//! tier (a CXL memory expander). Each guest's host-resident pages are split between them.
//!
//! Fluid, like the guest model: per guest, its host-resident pages fall in three access
//! classes — *hot* (the hottest `hot_pct` of the working set), *warm* (the rest of the
//! resident working set) and *idle* (resident pages outside the working set, never
//! accessed) — and the model counts how many pages of each class are on the slow tier.
//! When pages change class (a working set grows or shrinks, a program frees its buffer
//! and allocates a new one, the guest swaps) they carry their tier with them, mixed in
//! proportion; pages the host backs for the first time land in the fast tier while it
//! has free memory, else in the slow tier (first touch); pages the host frees or swaps
//! out leave both tiers in proportion.
//!
//! Placement `first-touch` moves nothing more. Placement `memtide` asks
//! [`memtide_core::tiering::place`] each tick, with an exact access tracker's figures
//! (each VM's hot class and how much of it is on the slow tier), and moves pages: demoted
//! pages are the coldest fast ones (idle, then warm, then hot), promoted ones the hot
//! pages on the slow tier.
//!
//! Latency model: an access to a slow-tier page takes `latency_factor` times as long to
//! reach memory; a workload spends `memory_bound_pct` of its time waiting on memory with
//! everything in DRAM, so its time per access grows by `s · (latency_factor − 1) ·
//! memory_bound`, `s` being the share of its accesses that land on the slow tier.

use crate::guest::{bytes, pages, Guest};
use crate::scenario::{Scenario, TierPlacement, TierSpec};
use memtide_core::tiering::{place, FastTier, TierConfig, TierVm};
use memtide_core::units::Bytes;

/// One guest's host-resident pages by access class: hot, warm, idle.
type Classes = [f64; 3];

/// One guest on the two-tier host.
#[derive(Clone, Debug, Default)]
struct GuestTiers {
    name: String,
    /// Its host-resident pages per class, as of the last tick.
    size: Classes,
    /// Of them, pages on the slow tier.
    slow: Classes,
    /// Extra time per access from slow-tier memory for `memory_bound = 1`.
    bound: f64,
    shares: u32,
    configured: Option<Bytes>,
}

/// What the two tiers did over a run.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TierCounters {
    /// Pages moved from the fast to the slow tier.
    pub demotions: f64,
    /// Pages moved from the slow to the fast tier.
    pub promotions: f64,
    /// Of the promotions, those in the second half of the run.
    pub promotions_late: f64,
    /// Guest pages on the slow tier, summed over ticks.
    pub slow_sum: f64,
    /// Guest pages in host memory, summed over ticks.
    pub resident_sum: f64,
    /// Pages the workloads touched.
    pub touched: f64,
    /// Of them, pages on the slow tier (estimated with each tick's slow-access share).
    pub touched_slow: f64,
}

/// The host's two tiers and where every guest's pages are.
#[derive(Clone, Debug)]
pub struct Tiers {
    spec: TierSpec,
    /// Fast memory the guests may use: the tier less the host's own memory (pages).
    fast: f64,
    guests: Vec<GuestTiers>,
    ticks: u64,
    ticks_run: u64,
    /// Counters since the start.
    pub counters: TierCounters,
}

impl Tiers {
    /// The scenario's tiers, `None` for a one-tier host.
    pub fn new(scenario: &Scenario) -> Option<Tiers> {
        let spec = scenario.tiers.clone()?;
        let guests = scenario
            .expand()
            .iter()
            .map(|(name, vm)| GuestTiers {
                name: name.clone(),
                bound: (spec.latency_factor - 1.0) * vm.workload.memory_bound_pct / 100.0,
                shares: vm.shares,
                configured: vm.fast_mib.map(|m| bytes(pages(m))),
                ..GuestTiers::default()
            })
            .collect();
        Some(Tiers {
            fast: pages(spec.fast_mib - scenario.host.reserved_mib) as f64,
            spec,
            guests,
            ticks: scenario.ticks,
            ticks_run: 0,
            counters: TierCounters::default(),
        })
    }

    /// How pages are placed.
    pub fn placement(&self) -> TierPlacement {
        self.spec.placement
    }

    /// Fast memory the guests may use (pages).
    pub fn fast_pages(&self) -> f64 {
        self.fast
    }

    /// Follow the guests' last tick (pages changing class, backed, freed), place, and
    /// set each guest's slowdown for the next tick.
    pub fn step(&mut self, guests: &mut [Guest], dt: f64) {
        self.ticks_run += 1;
        let mut room = self.fast - self.guests.iter().map(fast_of).sum::<f64>();
        for (t, g) in self.guests.iter_mut().zip(guests.iter()) {
            let (size, churn) = classes(g);
            follow(t, size, churn, &mut room);
        }
        if self.spec.placement == TierPlacement::Memtide {
            self.place(dt, room);
        }
        for (t, g) in self.guests.iter().zip(guests.iter_mut()) {
            let slow = slow_access(t, g);
            g.tier_slowdown = slow * t.bound;
            self.counters.touched += g.last.touched;
            self.counters.touched_slow += g.last.touched * slow;
            self.counters.slow_sum += t.slow.iter().sum::<f64>();
            self.counters.resident_sum += t.size.iter().sum::<f64>();
        }
    }

    /// memtide's placement: budgets and moves from `memtide_core::tiering`, applied.
    fn place(&mut self, dt: f64, room: f64) {
        let vms: Vec<TierVm<'_>> = self
            .guests
            .iter()
            .map(|t| TierVm {
                name: &t.name,
                resident: bytes_of(t.size.iter().sum()),
                fast: bytes_of(fast_of(t)),
                hot: bytes_of(t.size[0]),
                hot_on_slow: bytes_of(t.slow[0]),
                shares: t.shares,
                configured: t.configured,
            })
            .collect();
        let tier = FastTier {
            free: bytes_of(room),
            reserve: bytes(pages(self.spec.reserve_mib)),
        };
        let config = TierConfig {
            margin: self.spec.margin_pct / 100.0,
            rate_mib_s: self.spec.rate_mib_s,
        };
        let placed = place(&vms, tier, config, dt);
        let late = self.ticks_run * 2 > self.ticks;
        for (t, p) in self.guests.iter_mut().zip(placed) {
            let demote = pages_of(p.demote);
            let promote = pages_of(p.promote);
            // Demote the coldest fast pages: idle, then warm, then hot.
            let mut left = demote;
            for c in [2, 1, 0] {
                let n = left.min(t.size[c] - t.slow[c]).max(0.0);
                t.slow[c] += n;
                left -= n;
            }
            // Promote hot pages from the slow tier.
            let n = promote.min(t.slow[0]);
            t.slow[0] -= n;
            self.counters.demotions += demote - left;
            self.counters.promotions += n;
            if late {
                self.counters.promotions_late += n;
            }
        }
    }
}

/// A guest's host-resident pages per access class now, and how many pages entered its
/// working set through other frames than its net growth (a program freeing and
/// allocating again, swap-ins, file reads, while as many left).
fn classes(g: &Guest) -> (Classes, f64) {
    let ws = g.working_set() as f64;
    let in_memory = (g.anon_ws.pages + g.file_ws.pages) as f64;
    let host_swapped = (g.anon_ws.host_swapped + g.file_ws.host_swapped) as f64;
    let resident_share = if in_memory > 0.0 {
        1.0 - host_swapped / in_memory
    } else {
        0.0
    };
    let hot = (g.params().hot * ws).min(in_memory);
    let size_hot = hot * resident_share;
    let size_warm = (in_memory - hot) * resident_share;
    let size_idle = (g.host_resident() as f64 - size_hot - size_warm).max(0.0);
    let entered = (g.last.minor_faults + g.last.major_faults) as f64;
    ([size_hot, size_warm, size_idle], entered)
}

/// Carry a guest's slow-tier pages over to its new class sizes: pages leaving a class
/// (and `churn` pages swapping between the working set and idle memory) are pooled with
/// their tier, pages newly backed join the pool (fast while `room` lasts), pages freed
/// leave it, and the growing classes take from it, all in proportion.
fn follow(t: &mut GuestTiers, size: Classes, churn: f64, room: &mut f64) {
    let old = t.size;
    let ws_old = old[0] + old[1];
    let ws_growth = size[0] + size[1] - ws_old;
    let exchange = (churn - ws_growth.max(0.0)).clamp(0.0, ws_old.min(old[2]));
    let (mut pool, mut pool_slow) = (0.0, 0.0);
    let mut kept = old;
    for c in 0..3 {
        let swapped = if c == 2 {
            exchange
        } else if ws_old > 0.0 {
            exchange * old[c] / ws_old
        } else {
            0.0
        };
        let out = ((old[c] - size[c]).max(0.0) + swapped).min(old[c]);
        let slow_out = if old[c] > 0.0 {
            t.slow[c] * out / old[c]
        } else {
            0.0
        };
        kept[c] -= out;
        t.slow[c] -= slow_out;
        pool += out;
        pool_slow += slow_out;
    }
    let backed = size.iter().sum::<f64>() - old.iter().sum::<f64>();
    if backed > 0.0 {
        let fast = backed.min(room.max(0.0));
        *room -= fast;
        pool += backed;
        pool_slow += backed - fast;
    } else if pool > 0.0 {
        let freed = (-backed).min(pool);
        let slow_freed = pool_slow * freed / pool;
        pool -= freed;
        pool_slow -= slow_freed;
        *room += freed - slow_freed;
    }
    for c in 0..3 {
        let take = (size[c] - kept[c]).max(0.0).min(pool);
        let slow_in = if pool > 0.0 {
            pool_slow * take / pool
        } else {
            0.0
        };
        pool -= take;
        pool_slow -= slow_in;
        t.slow[c] = (t.slow[c] + slow_in).clamp(0.0, size[c]);
    }
    t.size = size;
}

/// The share of the guest's accesses that land on slow-tier pages.
fn slow_access(t: &GuestTiers, g: &Guest) -> f64 {
    let ws = g.working_set() as f64;
    if ws <= 0.0 {
        return 0.0;
    }
    let [hot, warm, _] = t.size;
    // Ranks from the coldest: the missing pages, then warm, then hot.
    let missing = g.ws_missing() as f64 / ws;
    let resident = hot + warm;
    let hot_from = 1.0 - hot / resident.max(1.0) * (1.0 - missing);
    let to_hot = 1.0 - g.access_share(hot_from);
    let to_warm = g.access_share(hot_from) - g.access_share(missing);
    let share = |accesses: f64, slow: f64, size: f64| {
        if size > 0.0 {
            accesses * slow / size
        } else {
            0.0
        }
    };
    share(to_hot, t.slow[0], hot) + share(to_warm, t.slow[1], warm)
}

fn fast_of(t: &GuestTiers) -> f64 {
    t.size.iter().sum::<f64>() - t.slow.iter().sum::<f64>()
}

fn bytes_of(pages: f64) -> Bytes {
    Bytes::from_f64(pages * crate::guest::PAGE_SIZE as f64)
}

fn pages_of(b: Bytes) -> f64 {
    b.as_f64() / crate::guest::PAGE_SIZE as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::world::World;

    /// A cache of 1000 MiB in a 1100 MiB guest, a quarter of it taking 90% of the
    /// accesses, on a host whose DRAM holds a third of the guest.
    fn cache(placement: &str, fast_mib: f64) -> Scenario {
        Scenario::from_toml(&format!(
            r#"
            name = "t"
            [host]
            memory_mib = 2048
            reserved_mib = 256
            [tiers]
            fast_mib = {fast_mib}
            placement = "{placement}"
            [[vm]]
            name = "cache"
            memory_mib = 1100
            kernel_mib = 64
            [vm.workload]
            base_mib_s = 500
            hot_pct = 25
            hot_access_pct = 90
            memory_bound_pct = 30
            anon = {{ kind = "const", mib = 1000 }}
            "#
        ))
        .unwrap()
    }

    fn run(scenario: &Scenario, secs: u32) -> World {
        let mut w = World::new(scenario, 1);
        for _ in 0..secs {
            w.advance(1.0);
            let t = w.tiers.as_ref().unwrap();
            let fast: f64 = t.guests.iter().map(fast_of).sum();
            assert!(
                fast <= t.fast + 1.0,
                "fast tier overfull: {fast} > {}",
                t.fast
            );
            for g in &t.guests {
                for c in 0..3 {
                    assert!((0.0..=g.size[c] + 1e-6).contains(&g.slow[c]), "{g:?}");
                }
            }
        }
        w
    }

    #[test]
    fn memtide_keeps_the_hot_set_in_dram_where_first_touch_spreads_it() {
        let (memtide, first) = (
            run(&cache("memtide", 256.0 + 1100.0 / 3.0), 120),
            run(&cache("first-touch", 256.0 + 1100.0 / 3.0), 120),
        );
        let t = memtide.tiers.as_ref().unwrap();
        // Everything hot is fast; two thirds of the guest is slow, holding a tenth of the
        // accesses at most.
        assert!(t.guests[0].slow[0] < 1.0, "{:?}", t.guests[0]);
        let slow = |w: &World| {
            let t = w.tiers.as_ref().unwrap();
            t.guests[0].slow.iter().sum::<f64>() / t.guests[0].size.iter().sum::<f64>()
        };
        assert!(slow(&memtide) > 0.6 && slow(&first) > 0.6);
        let access = |w: &World| slow_access(&w.tiers.as_ref().unwrap().guests[0], &w.guests[0]);
        assert!(access(&memtide) < 0.1, "{}", access(&memtide));
        assert!(access(&first) > 0.6, "{}", access(&first));
        // The slowdown follows: s · (2 − 1) · 0.3.
        let g = &memtide.guests[0];
        assert!((g.tier_slowdown - 0.3 * access(&memtide)).abs() < 1e-9);
        assert!(g.last.touched > first.guests[0].last.touched * 1.1);
        assert!(t.counters.promotions > 0.0 && t.counters.demotions > 0.0);
    }

    #[test]
    fn moves_keep_to_the_rate_limit() {
        let mut s = cache("memtide", 256.0 + 1100.0 / 3.0);
        s.tiers.as_mut().unwrap().rate_mib_s = 16.0;
        let mut w = World::new(&s, 1);
        let mut moved = 0.0;
        for _ in 0..10 {
            w.advance(1.0);
            let c = w.tiers.as_ref().unwrap().counters;
            let now = c.promotions + c.demotions;
            assert!(now - moved <= pages(16.0) as f64 + 1.0, "{}", now - moved);
            moved = now;
        }
        assert!(moved > 0.0);
    }

    #[test]
    fn a_host_all_in_dram_runs_as_a_one_tier_host() {
        let mut tiered = cache("memtide", 2048.0);
        let mut one = tiered.clone();
        one.tiers = None;
        let (a, b) = (run(&tiered, 30), {
            let mut w = World::new(&one, 1);
            (0..30).for_each(|_| w.advance(1.0));
            w
        });
        assert_eq!(a.guests[0].counters, b.guests[0].counters);
        assert_eq!(a.tiers.unwrap().counters.slow_sum, 0.0);
        // And with a third of it fast, the same guest does less work.
        tiered.tiers.as_mut().unwrap().fast_mib = 256.0 + 1100.0 / 3.0;
        let c = run(&tiered, 30);
        assert!(c.guests[0].counters.touched < b.guests[0].counters.touched);
    }
}
