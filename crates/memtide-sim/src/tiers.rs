//! A two-tier host: part of the host's memory is DRAM (the fast tier), the rest a slower
//! tier (a CXL memory expander). Each guest's host-resident pages are split between them.
//!
//! Fluid, like the guest model: per guest, its host-resident pages fall in four access
//! classes — *hot* (the hottest `hot_pct` of the working set), *warm* (the rest of the
//! resident working set), *idle* (resident pages in use outside the working set, never
//! accessed: the kernel, idle anonymous memory and page cache) and *free* (the guest's
//! free pages the host still backs) — and the model counts how many pages of each class
//! are on the slow tier. When pages change class (a working set grows or shrinks, a
//! program frees its buffer and allocates a new one, the guest swaps) they carry their
//! tier with them, mixed in proportion; pages entering the working set through other
//! frames than its growth (a program allocating afresh, a swap-in, a file read) take the
//! guest's free frames and the frames the pages leaving it freed alike, as the guest's
//! allocator does, never frames in use; pages the host backs for the
//! first time land in the fast tier while it has free memory, else in the slow tier
//! (first touch); pages the host frees or swaps out leave both tiers in proportion.
//!
//! Placement `first-touch` moves nothing more. Placement `memtide` asks
//! [`memtide_core::tiering::place`] each tick, with an exact access tracker's figures
//! (each VM's hot class and how much of it is on the slow tier, its free pages on the
//! fast tier, as free page reporting would tell them, and its fast pages in use untouched
//! for its cold age), and moves pages: demoted pages are the coldest fast pages in use
//! untouched for the cold age (idle, then warm, then hot), and the free ones the decision
//! names (it puts them after cold pages in use, before hot ones); promoted ones the hot
//! pages on the slow tier. Each guest's cold age adapts to its own promotions of demoted
//! pages ([`memtide_core::tiering::age`]), unless the scenario fixes it.
//!
//! How long pages have gone untouched: a working-set page is touched at random at its
//! part's access rate (as [`Guest::ws_missed_for`] has it), so the share of the hot or
//! warm class untouched for the cold age is the share every access missed for that long.
//! An idle page is never touched: its age is the time since it went idle (left the
//! working set, or was backed outside it). The idle class is kept in layers by that time,
//! one a tick back to the longest cold age and the older pages in one; pages leave it (back into
//! the working set as page-cache hits, freed, swapped) the most recently idle first, as
//! from an LRU list, each layer's tiers and marks in proportion.
//!
//! Promotions are counted twice: all of them, and those of pages memtide demoted that
//! still hold the data they held then (the far-memory SLO's promotions: memory judged
//! cold that turned out not to be). A demoted page loses that mark when the guest frees
//! it or reuses its frame for other data. Pages entering the working set on slow-tier
//! frames (fresh allocations into free frames or first touches there) are counted apart.
//!
//! Latency model: an access to a slow-tier page takes `latency_factor` times as long to
//! reach memory; a workload spends `memory_bound_pct` of its time waiting on memory with
//! everything in DRAM, so its time per access grows by `s · (latency_factor − 1) ·
//! memory_bound`, `s` being the share of its accesses that land on the slow tier.

use crate::guest::{bytes, pages, Guest};
use crate::scenario::{Scenario, TierPlacement, TierSpec};
use memtide_core::tiering::age::ColdAge;
use memtide_core::tiering::{place, FastTier, TierConfig, TierVm};
use memtide_core::units::Bytes;
use std::collections::VecDeque;

/// One guest's host-resident pages by access class: hot, warm, idle, free.
type Classes = [f64; 4];

/// The idle class: pages in use outside the working set.
const IDLE: usize = 2;
/// The free class: pages the guest does not use.
const FREE: usize = 3;

/// Pages, how many of them are on the slow tier, and of those how many memtide demoted
/// holding the data they hold now.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Layer {
    pages: f64,
    slow: f64,
    demoted: f64,
}

impl Layer {
    /// Take `n` pages out, slow and demoted ones in proportion.
    fn take(&mut self, n: f64) -> Layer {
        let n = n.min(self.pages).max(0.0);
        let share = if self.pages > 0.0 {
            n / self.pages
        } else {
            0.0
        };
        let out = Layer {
            pages: n,
            slow: self.slow * share,
            demoted: self.demoted * share,
        };
        self.pages -= n;
        self.slow -= out.slow;
        self.demoted -= out.demoted;
        out
    }

    fn add(&mut self, l: Layer) {
        self.pages += l.pages;
        self.slow += l.slow;
        self.demoted += l.demoted;
    }
}

/// The idle class by how long its pages have been idle: those idle for the longest cold
/// age or longer, and younger layers with the time each went idle, the newest last.
#[derive(Clone, Debug, Default)]
struct Idle {
    old: Layer,
    young: VecDeque<(f64, Layer)>,
}

impl Idle {
    /// Take `n` pages out, the most recently idle first.
    fn take(&mut self, mut n: f64) -> Layer {
        let mut out = Layer::default();
        while n > 0.0 {
            let Some((_, l)) = self.young.back_mut() else {
                break;
            };
            let got = l.take(n);
            n -= got.pages;
            out.add(got);
            if l.pages <= 0.0 {
                self.young.pop_back();
            }
        }
        out.add(self.old.take(n));
        out
    }

    /// Pages going idle at `at`.
    fn add(&mut self, at: f64, l: Layer) {
        match self.young.back_mut() {
            Some((t, last)) if *t == at => last.add(l),
            _ => self.young.push_back((at, l)),
        }
    }

    /// Count the pages idle since `since` or before as old.
    fn age(&mut self, since: f64) {
        while let Some(&(t, l)) = self.young.front() {
            if t > since {
                break;
            }
            self.old.add(l);
            self.young.pop_front();
        }
    }

    fn total(&self) -> Layer {
        self.aged(f64::INFINITY)
    }

    /// The pages idle since `since` or before.
    fn aged(&self, since: f64) -> Layer {
        let mut t = self.old;
        self.young
            .iter()
            .take_while(|e| e.0 <= since)
            .for_each(|(_, l)| t.add(*l));
        t
    }

    /// Demote `n` of the fast pages idle since `since` or before, the longest idle first;
    /// returns how many there were.
    fn demote(&mut self, since: f64, n: f64) -> f64 {
        let mut left = n.max(0.0);
        let aged = self.young.iter_mut().take_while(|e| e.0 <= since);
        for l in std::iter::once(&mut self.old).chain(aged.map(|(_, l)| l)) {
            let k = left.min(l.pages - l.slow).max(0.0);
            l.slow += k;
            l.demoted += k;
            left -= k;
        }
        n.max(0.0) - left
    }
}

/// One guest on the two-tier host.
#[derive(Clone, Debug, Default)]
struct GuestTiers {
    name: String,
    /// Its host-resident pages per class, as of the last tick.
    size: Classes,
    /// Of them, pages on the slow tier.
    slow: Classes,
    /// Of those, pages memtide demoted that still hold the data they held then.
    demoted: Classes,
    /// The idle class by how long its pages have been idle (its totals in `size`, `slow`
    /// and `demoted`).
    idle: Idle,
    /// Its cold age, adapted to its promotions.
    age: ColdAge,
    /// The shares of the hot and of the warm class untouched for its cold age.
    aged: [f64; 2],
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
    /// Of the promotions, pages memtide had demoted, holding the same data (the SLO's
    /// promotions).
    pub cold_promotions: f64,
    /// Of them, those in the second half of the run.
    pub cold_promotions_late: f64,
    /// Pages entering a working set on the slow tier other than demoted ones coming back
    /// (fresh allocations and reads into slow free frames, first touches there).
    pub fresh_on_slow: f64,
    /// Guest pages on the slow tier, summed over ticks.
    pub slow_sum: f64,
    /// Guest pages in host memory, summed over ticks.
    pub resident_sum: f64,
    /// The guests' mean cold age (s), summed over ticks.
    pub age_sum: f64,
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
    /// Time since the start (s).
    now: f64,
    /// Counters since the start.
    pub counters: TierCounters,
}

impl Tiers {
    /// The scenario's tiers, `None` for a one-tier host.
    pub fn new(scenario: &Scenario) -> Option<Tiers> {
        let spec = scenario.tiers.clone()?;
        let age = ColdAge::new(&spec.age_config());
        let guests = scenario
            .expand()
            .iter()
            .map(|(name, vm)| GuestTiers {
                name: name.clone(),
                bound: (spec.latency_factor - 1.0) * vm.workload.memory_bound_pct / 100.0,
                shares: vm.shares,
                configured: vm.fast_mib.map(|m| bytes(pages(m))),
                age: age.clone(),
                ..GuestTiers::default()
            })
            .collect();
        Some(Tiers {
            fast: pages(spec.fast_mib - scenario.host.reserved_mib) as f64,
            spec,
            guests,
            ticks: scenario.ticks,
            ticks_run: 0,
            now: 0.0,
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

    /// memtide's least cold age (s): every VM's where it is not adaptive.
    pub fn cold_age_s(&self) -> f64 {
        self.spec.cold_age_s
    }

    /// Whether each VM's cold age adapts to its promotions.
    pub fn adaptive_age(&self) -> bool {
        self.spec.adaptive_age
    }

    /// The guests' cold age (s), their mean over the ticks run.
    pub fn mean_cold_age_s(&self) -> f64 {
        self.counters.age_sum / self.ticks_run.max(1) as f64
    }

    /// Follow the guests' last tick (pages changing class, backed, freed), place, and
    /// set each guest's slowdown for the next tick.
    pub fn step(&mut self, guests: &mut [Guest], dt: f64) {
        self.ticks_run += 1;
        self.now += dt;
        let mut room = self.fast - self.guests.iter().map(fast_of).sum::<f64>();
        // First touch keeps the layers of a fixed age: its figures do not depend on
        // memtide's settings.
        let horizon = match self.spec.placement {
            TierPlacement::Memtide => self.spec.age_config().horizon_s(),
            TierPlacement::FirstTouch => self.spec.cold_age_s,
        };
        for (t, g) in self.guests.iter_mut().zip(guests.iter()) {
            let (size, churn) = classes(g);
            self.counters.fresh_on_slow += follow(t, size, churn, &mut room, self.now);
            t.idle.age(self.now - horizon);
            t.aged = g.ws_missed_for(t.age.age_s());
        }
        let ages: f64 = self.guests.iter().map(|t| t.age.age_s()).sum();
        self.counters.age_sum += ages / self.guests.len().max(1) as f64;
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
        let now = self.now;
        let idle_aged = |t: &GuestTiers| {
            let l = t.idle.aged(now - t.age.age_s());
            l.pages - l.slow
        };
        let vms: Vec<TierVm<'_>> = self
            .guests
            .iter()
            .map(|t| TierVm {
                name: &t.name,
                resident: bytes_of(t.size.iter().sum()),
                fast: bytes_of(fast_of(t)),
                hot: bytes_of(t.size[0]),
                hot_on_slow: bytes_of(t.slow[0]),
                free_fast: bytes_of(t.size[FREE] - t.slow[FREE]),
                aged: bytes_of(
                    (0..2)
                        .map(|c| (t.size[c] - t.slow[c]) * t.aged[c])
                        .sum::<f64>()
                        + idle_aged(t),
                ),
                cold_age_s: t.age.age_s(),
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
        let age_config = self.spec.age_config();
        let late = self.ticks_run * 2 > self.ticks;
        for (t, p) in self.guests.iter_mut().zip(placed) {
            let demote = pages_of(p.demote);
            let demote_free = pages_of(p.demote_free).min(demote);
            let promote = pages_of(p.promote);
            // Demote the coldest fast pages in use untouched for the cold age: idle, then
            // warm, then hot; and the guest's free pages the decision names (after those,
            // before hot ones).
            let mut left = demote - demote_free;
            for c in [IDLE, 1, 0] {
                let n = if c == IDLE {
                    t.idle.demote(now - t.age.age_s(), left)
                } else {
                    left.min((t.size[c] - t.slow[c]) * t.aged[c]).max(0.0)
                };
                t.slow[c] += n;
                t.demoted[c] += n;
                left -= n;
            }
            let n = demote_free.min(t.size[FREE] - t.slow[FREE]).max(0.0);
            t.slow[FREE] += n;
            left += demote_free - n;
            // Promote hot pages from the slow tier, demoted ones in proportion.
            let n = promote.min(t.slow[0]);
            let cold = if t.slow[0] > 0.0 {
                (t.demoted[0] * n / t.slow[0]).min(t.demoted[0])
            } else {
                0.0
            };
            t.slow[0] -= n;
            t.demoted[0] -= cold;
            self.counters.demotions += demote - left;
            self.counters.promotions += n;
            self.counters.cold_promotions += cold;
            let working_set = bytes_of(t.size[0] + t.size[1]);
            t.age.observe(&age_config, bytes_of(cold), working_set, dt);
            if late {
                self.counters.promotions_late += n;
                self.counters.cold_promotions_late += cold;
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
    let size_free = g.free_backed.host_resident() as f64;
    let size_idle = (g.host_resident() as f64 - size_hot - size_warm - size_free).max(0.0);
    let entered = (g.last.minor_faults + g.last.major_faults) as f64;
    ([size_hot, size_warm, size_idle, size_free], entered)
}

/// Carry a guest's slow-tier pages over to its new class sizes: pages leaving a class
/// (and, of `churn` pages entering the working set through freed frames, those that swap
/// frames with the guest's free pages) are pooled with their tier, pages newly
/// backed join the pool (fast while `room` lasts), pages freed leave it, and the growing
/// classes take from it, all in proportion. Returns the pages that entered the working
/// set on the slow tier other than demoted pages (fresh data in slow frames).
///
/// A demoted page keeps its mark while it stays in its class or moves between classes in
/// use keeping its data (into the working set only as a page-cache hit), and loses it in
/// the free class or when its frame is reused for pages entering the working set.
///
/// Idle pages leave the most recently idle first; pages going idle form a layer of time
/// `now`.
fn follow(t: &mut GuestTiers, size: Classes, churn: f64, room: &mut f64, now: f64) -> f64 {
    let old = t.size;
    let ws_old = old[0] + old[1];
    let ws_growth = size[0] + size[1] - ws_old;
    // Pages entering the working set (beyond its growth) while as many leave it take
    // frames from the guest's free pages and those the leaving pages freed alike: the
    // free frames' part of them swaps with working-set frames. Pages in use outside the
    // working set are not reallocated.
    let entering = (churn - ws_growth.max(0.0)).max(0.0);
    let exchange = if old[FREE] > 0.0 {
        (entering * old[FREE] / (old[FREE] + entering))
            .min(ws_old)
            .min(old[FREE])
    } else {
        0.0
    };
    let (mut pool, mut pool_slow, mut pool_demoted) = (0.0, 0.0, 0.0);
    let mut kept = old;
    for c in 0..4 {
        let swapped = match c {
            FREE => exchange,
            0 | 1 if ws_old > 0.0 => exchange * old[c] / ws_old,
            _ => 0.0,
        };
        let shrink = (old[c] - size[c]).max(0.0).min(old[c]);
        let out = (shrink + swapped).min(old[c]);
        let (slow_out, demoted_out) = if c == IDLE {
            let l = t.idle.take(out);
            (l.slow.min(t.slow[c]), l.demoted.min(t.demoted[c]))
        } else if old[c] > 0.0 {
            (t.slow[c] * out / old[c], t.demoted[c] * out / old[c])
        } else {
            (0.0, 0.0)
        };
        kept[c] -= out;
        t.slow[c] -= slow_out;
        t.demoted[c] -= demoted_out;
        pool += out;
        pool_slow += slow_out;
        // Pages swapped for fresh ones give up their data; pages only moving between
        // classes keep it.
        if out > 0.0 {
            pool_demoted += demoted_out * (out - swapped).max(0.0) / out;
        }
    }
    let backed = size.iter().sum::<f64>() - old.iter().sum::<f64>();
    if backed > 0.0 {
        let fast = backed.min(room.max(0.0));
        *room -= fast;
        pool += backed;
        pool_slow += backed - fast;
    } else if pool > 0.0 {
        let freed = (-backed).min(pool);
        let share = freed / pool;
        let slow_freed = pool_slow * share;
        pool -= freed;
        pool_slow -= slow_freed;
        pool_demoted -= pool_demoted * share;
        *room += freed - slow_freed;
    }
    // Pages already in memory join the working set only as page-cache hits: its growth
    // beyond the pages that entered it through faults. Only that many demoted pages can
    // come into it with their data; the other frames the pool gives it hold fresh data.
    let mut hits = (ws_growth - churn).max(0.0);
    let mut fresh_on_slow = 0.0;
    for c in 0..4 {
        let take = (size[c] - kept[c]).max(0.0).min(pool);
        let (slow_in, demoted_out) = if pool > 0.0 {
            (pool_slow * take / pool, pool_demoted * take / pool)
        } else {
            (0.0, 0.0)
        };
        let demoted_in = if c < 2 {
            let n = demoted_out.min(hits);
            hits -= n;
            n
        } else {
            demoted_out
        };
        pool -= take;
        pool_slow -= slow_in;
        pool_demoted -= demoted_out;
        t.slow[c] = (t.slow[c] + slow_in).clamp(0.0, size[c]);
        if c != FREE {
            t.demoted[c] = (t.demoted[c] + demoted_in).clamp(0.0, t.slow[c]);
        }
        // Only pages going idle make a layer (a tick without any would leave an empty
        // one, and the idle class one layer a tick back to the longest age).
        if c == IDLE && take > 0.0 {
            let layer = Layer {
                pages: take,
                slow: slow_in,
                demoted: demoted_in,
            };
            t.idle.add(now, layer);
        }
        if c < 2 {
            fresh_on_slow += (slow_in - demoted_in).max(0.0);
        }
    }
    t.demoted[FREE] = 0.0;
    t.size = size;
    // The layers hold the idle class's pages, as far as the pool gave them.
    let idle = t.idle.total();
    if (idle.pages - size[IDLE]).abs() > 1e-6 * size[IDLE].max(1.0) {
        let scale = if idle.pages > 0.0 {
            size[IDLE] / idle.pages
        } else {
            0.0
        };
        for l in std::iter::once(&mut t.idle.old).chain(t.idle.young.iter_mut().map(|(_, l)| l)) {
            *l = Layer {
                pages: l.pages * scale,
                slow: l.slow * scale,
                demoted: l.demoted * scale,
            };
        }
        if idle.pages <= 0.0 {
            t.idle.add(
                now,
                Layer {
                    pages: size[IDLE],
                    slow: t.slow[IDLE],
                    demoted: t.demoted[IDLE],
                },
            );
        }
    }
    let idle = t.idle.total();
    t.slow[IDLE] = idle.slow.clamp(0.0, size[IDLE]);
    t.demoted[IDLE] = idle.demoted.clamp(0.0, t.slow[IDLE]);
    fresh_on_slow
}

/// The share of the guest's accesses that land on slow-tier pages.
fn slow_access(t: &GuestTiers, g: &Guest) -> f64 {
    let ws = g.working_set() as f64;
    if ws <= 0.0 {
        return 0.0;
    }
    let [hot, warm, _, _] = t.size;
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
    use memtide_core::tiering::age::AgeConfig;

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
                for c in 0..4 {
                    assert!((0.0..=g.size[c] + 1e-6).contains(&g.slow[c]), "{g:?}");
                    assert!((0.0..=g.slow[c] + 1e-6).contains(&g.demoted[c]), "{g:?}");
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

    /// A program freeing its 400 MiB working set and allocating it afresh every 20 s
    /// (300 MiB and 400 MiB in turn) beside 600 MiB allocated once and never touched again,
    /// in a 1536 MiB guest without a balloon: 1000 MiB of DRAM hold the working set and
    /// every free frame, with 128 MiB kept free for fresh first touches; the idle memory
    /// goes to the slow tier, with no cold age (what is idle goes at once).
    fn restarting() -> Scenario {
        Scenario::from_toml(
            r#"
            name = "t"
            ticks = 300
            [host]
            memory_mib = 4096
            reserved_mib = 256
            [tiers]
            fast_mib = 1256
            reserve_mib = 128
            cold_age_s = 0
            [[vm]]
            name = "mk"
            memory_mib = 1536
            kernel_mib = 64
            [vm.workload]
            base_mib_s = 512
            idle_mib = 600
            restart = true
            anon = { kind = "phases", phases = [{ mib = 400, duration_s = 20 }, { mib = 300, duration_s = 20 }], repeat = true }
            "#,
        )
        .unwrap()
    }

    #[test]
    fn fresh_allocations_land_in_fast_memory_when_free_frames_are_not_demoted() {
        // Demoting the guest's free frames first (they are idle) put every fresh working
        // set partly on the slow tier and promoted it: 11% of the working set a minute,
        // as much in the second half. Free frames kept fast, nothing is promoted once the
        // first placement is done, and no demoted page ever comes back.
        let w = run(&restarting(), 300);
        let t = w.tiers.as_ref().unwrap();
        let c = t.counters;
        assert_eq!(c.promotions_late, 0.0, "{c:?}");
        assert_eq!(c.cold_promotions, 0.0, "{c:?}");
        assert!(c.demotions > pages(500.0) as f64, "{c:?}");
        // The idle memory is what went down, and the working set is in DRAM.
        let g = &t.guests[0];
        assert!(g.slow[2] > pages(500.0) as f64, "{g:?}");
        assert!(g.slow[0] < 1.0, "{g:?}");
    }

    /// A file working set waving between 200 and 600 MiB every 60 s beside 300 MiB of
    /// anonymous memory and 300 MiB allocated once and never touched, with DRAM for 500 MiB
    /// of the guest: memtide demotes idle memory, with a cold age of `cold_age_s` (the
    /// least, when `adaptive`).
    fn waving(cold_age_s: f64, adaptive: bool) -> Scenario {
        waving_every(cold_age_s, adaptive, 60.0)
    }

    /// `waving`'s guest, its page cache waving over `period_s`.
    fn waving_every(cold_age_s: f64, adaptive: bool, period_s: f64) -> Scenario {
        Scenario::from_toml(&format!(
            r#"
            name = "t"
            ticks = 300
            [host]
            memory_mib = 4096
            reserved_mib = 256
            [tiers]
            fast_mib = 756
            cold_age_s = {cold_age_s}
            adaptive_age = {adaptive}
            [[vm]]
            name = "w"
            memory_mib = 1536
            kernel_mib = 64
            [vm.workload]
            base_mib_s = 256
            idle_mib = 300
            anon = {{ kind = "const", mib = 300 }}
            file = {{ kind = "wave", min_mib = 200, max_mib = 600, period_s = {period_s} }}
            "#
        ))
        .unwrap()
    }

    #[test]
    fn idle_memory_is_demoted_only_once_idle_for_the_cold_age() {
        // Page cache leaving the working set comes back within 60 s. Demoting whatever is
        // idle demotes it and promotes it again; with a cold age of 120 s only memory idle
        // longer goes down (the memory never touched, the kernel), and nothing demoted
        // comes back.
        let now = run(&waving(0.0, false), 300);
        let aged = run(&waving(120.0, false), 300);
        let (c0, c120) = (
            now.tiers.as_ref().unwrap().counters,
            aged.tiers.as_ref().unwrap().counters,
        );
        assert!(c0.cold_promotions > pages(50.0) as f64, "{c0:?}");
        assert_eq!(c120.cold_promotions, 0.0, "{c120:?}");
        assert!(c120.demotions > pages(250.0) as f64, "{c120:?}");
        // Before the cold age has passed, nothing in use is demoted.
        let early = run(&waving(120.0, false), 100);
        let c = early.tiers.as_ref().unwrap().counters;
        assert_eq!(c.demotions, 0.0, "{c:?}");
    }

    #[test]
    fn a_vm_whose_idle_memory_comes_back_gets_a_longer_cold_age() {
        // At a fixed 30 s, page cache idle for longer is demoted and comes back with the
        // next wave, all along. Adapting, the VM's age rises with its promotions, past the
        // waves' period, within its bounds, and the promotions stop.
        let (fixed, adaptive) = (
            run(&waving(30.0, false), 300),
            run(&waving(30.0, true), 300),
        );
        let (f, a) = (
            fixed.tiers.as_ref().unwrap(),
            adaptive.tiers.as_ref().unwrap(),
        );
        let (fc, ac) = (f.counters, a.counters);
        assert!(fc.cold_promotions_late > pages(20.0) as f64, "{fc:?}");
        assert!(
            ac.cold_promotions_late < fc.cold_promotions_late / 4.0,
            "{ac:?} against {fc:?}"
        );
        assert_eq!(f.guests[0].age.age_s(), 30.0);
        let age = a.guests[0].age.age_s();
        assert!((60.0..=AgeConfig::MAX_COLD_AGE_S).contains(&age), "{age}");
    }

    #[test]
    fn a_cache_back_every_quarter_hour_stops_promoting_within_the_default_ages() {
        // Page cache waving over 15 min: idle spells of up to about 900 s. Over two hours,
        // the default longest age outlasts them and the second hour promotes nothing
        // demoted; held to 600 s, the VM's age stops short and its cache comes back every
        // cycle.
        let mut s = waving_every(30.0, true, 900.0);
        s.ticks = 7200;
        let mut short = s.clone();
        short.tiers.as_mut().unwrap().max_cold_age_s = 600.0;
        let (default, short) = (run(&s, 7200), run(&short, 7200));
        let (d, c) = (
            default.tiers.as_ref().unwrap(),
            short.tiers.as_ref().unwrap(),
        );
        assert!(
            c.counters.cold_promotions_late > pages(20.0) as f64,
            "{:?}",
            c.counters
        );
        assert!(
            d.counters.cold_promotions_late < c.counters.cold_promotions_late / 10.0,
            "{:?} against {:?}",
            d.counters,
            c.counters
        );
        assert_eq!(c.guests[0].age.age_s(), 600.0);
        assert!(
            d.guests[0].age.age_s() > 900.0,
            "{}",
            d.guests[0].age.age_s()
        );
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
