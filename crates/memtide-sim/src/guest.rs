//! One guest's memory, in 4 KiB pages counted by role (a fluid model: no single page is
//! tracked, but every page is in exactly one place, so memory is conserved).
//!
//! The guest's RAM holds the balloon, kernel memory, anonymous memory (working set and
//! idle), page cache (working set and idle) and free pages. Free pages are either backed
//! by the host (touched since boot) or not (never touched, or given back by the balloon
//! and not touched since). Anonymous pages the guest evicted are in its swap; file pages
//! it evicted are on its disk. Independently, the host may have swapped out any page it
//! backs: each role counts how many of its pages are host-swapped, which the guest cannot
//! see. Reclaim follows the LRU order of Linux's inactive and active lists: idle page
//! cache, idle anonymous memory, working-set page cache, working-set anonymous memory.

use crate::pressure::Pressure;
use crate::rng::Rng;
use crate::scenario::{Costs, VmSpec};
use crate::workload::Demand;
use memtide_core::signals::kernel_seen_touched;
use memtide_core::stats::{AgentStats, GuestStats, MemInfo, Psi, VmStat, ZramSwap};
use memtide_core::units::Bytes;
use std::collections::VecDeque;

/// Bytes per page.
pub const PAGE_SIZE: u64 = 4096;
const PAGES_PER_MIB: f64 = 256.0;
/// Free page reporting's delay: Linux's driver reports 2 s after enough memory was freed
/// (`PAGE_REPORTING_DELAY`, mm/page_reporting.c).
const REPORT_DELAY_S: f64 = 2.0;
/// Free page reporting's unit: a pageblock, 2 MiB on x86 (pages).
const REPORT_BLOCK: u64 = 512;

/// The guest kernel's free-memory watermarks (pages), computed as Linux does from its RAM
/// (the balloon does not change them): `min` = √(16 · RAM in KiB) KiB (min_free_kbytes),
/// `low` and `high` one and two steps above it, a step being the larger of min/4 and 0.1%
/// of RAM (watermark_scale_factor 10). kswapd reclaims when free memory falls below `low`
/// until it reaches `high`; the balloon never takes memory below `min`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Watermarks {
    min: u64,
    low: u64,
    high: u64,
}

impl Watermarks {
    fn for_ram(pages: u64) -> Self {
        let kib = pages as f64 * (PAGE_SIZE / 1024) as f64;
        let min = ((16.0 * kib).sqrt() / 4.0) as u64;
        let step = (min / 4).max(pages / 1000);
        Watermarks {
            min,
            low: min + step,
            high: min + 2 * step,
        }
    }
}

/// MiB as pages (rounded; negative is zero).
pub fn pages(mib: f64) -> u64 {
    if mib > 0.0 {
        (mib * PAGES_PER_MIB).round() as u64
    } else {
        0
    }
}

/// Pages as MiB.
pub fn mib(pages: u64) -> f64 {
    pages as f64 / PAGES_PER_MIB
}

/// A fractional number of pages (a sum or a rate) as MiB.
pub fn mib_of(pages: f64) -> f64 {
    pages / PAGES_PER_MIB
}

/// Pages as bytes.
pub fn bytes(pages: u64) -> Bytes {
    Bytes(pages.saturating_mul(PAGE_SIZE))
}

/// Guest pages in one role, and how many of them the host has swapped out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pool {
    /// Pages in this role.
    pub pages: u64,
    /// Of them, pages the host swapped out (never more than `pages`).
    pub host_swapped: u64,
}

impl Pool {
    /// Pages of this role in host memory.
    pub fn host_resident(self) -> u64 {
        self.pages - self.host_swapped
    }

    /// Take `n` pages out (at most all), host-swapped ones in proportion.
    fn take(&mut self, n: u64, rng: &mut Rng) -> Pool {
        let n = n.min(self.pages);
        let swapped = rng
            .share(n, self.host_swapped, self.pages)
            .max(n.saturating_sub(self.host_resident()));
        self.pages -= n;
        self.host_swapped -= swapped;
        Pool {
            pages: n,
            host_swapped: swapped,
        }
    }

    fn add(&mut self, other: Pool) {
        self.pages += other.pages;
        self.host_swapped += other.host_swapped;
    }
}

/// Cumulative counters since boot, in pages or events.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GuestCounters {
    /// Pages read back from guest swap.
    pub swap_in: u64,
    /// Pages written to guest swap.
    pub swap_out: u64,
    /// Major faults (swap-ins and page-cache misses).
    pub major_faults: u64,
    /// Minor faults (first touches of fresh anonymous memory).
    pub minor_faults: u64,
    /// Swap-ins of evicted working-set pages (workingset_refault_anon).
    pub refault_anon: u64,
    /// Re-reads of evicted page-cache pages (workingset_refault_file).
    pub refault_file: u64,
    /// Processes killed because memory ran out.
    pub oom_kills: u64,
    /// Times virtio-balloon's deflate-on-oom gave balloon pages back to the guest instead
    /// of an OOM kill (each one an OOM kill without it).
    pub oom_deflations: u64,
    /// Allocations that had to reclaim before they could proceed.
    pub alloc_stalls: u64,
    /// Pages reclaimed in the background (kswapd).
    pub kswapd_reclaimed: u64,
    /// Pages reclaimed by allocating tasks and the balloon driver (direct reclaim).
    pub direct_reclaimed: u64,
    /// Pages the host read back from its swap for this guest (host swap-ins), including
    /// pages the guest only reallocated or wrote to its own swap.
    pub host_swap_in: u64,
    /// Pages of this guest the host swapped out.
    pub host_swap_out: u64,
    /// Guest pages the host backed for the first time (EPT faults).
    pub host_first_touch: u64,
    /// Time the workload waited on guest faults (swap-ins, disk reads) (µs).
    pub stall_us: f64,
    /// Of it, the time waiting on memory: swap-ins and re-reads of evicted working-set
    /// page cache, not first reads of file data (I/O, not memory): memory PSI as the
    /// guest sees it (Linux counts thrashing refaults and reclaim, not every read).
    pub memory_stall_us: f64,
    /// Time the vCPU waited on the host (host swap-ins, first touches) (µs), invisible to
    /// the guest.
    pub host_stall_us: f64,
    /// Pages the workload touched: its work done.
    pub touched: f64,
    /// Distinct pages touched, tick by tick, summed: what host-side access sampling
    /// (accessed bits) would see.
    pub referenced: f64,
}

/// The fixed parameters of a guest.
#[derive(Clone, Debug, PartialEq)]
pub struct GuestParams {
    /// RAM (pages).
    pub configured: u64,
    /// Kernel memory (pages).
    pub kernel: u64,
    /// Swap (pages).
    pub swap: u64,
    /// Memory committed and never touched (pages): thread stacks, heaps reserved up
    /// front. Linux counts it in Committed_AS; it holds no page.
    pub untouched_commit: u64,
    /// Share of kernel pages KSM can merge.
    pub kernel_shareable: f64,
    /// Share of idle pages KSM can merge.
    pub idle_shareable: f64,
    /// Share of working-set pages that are hot.
    pub hot: f64,
    /// Share of accesses going to the hot pages.
    pub hot_access: f64,
    /// Work rate with everything resident (pages/s); fresh memory is touched at this
    /// rate too.
    pub base_pages_s: f64,
    /// virtio-balloon's deflate-on-oom: before the OOM killer runs, the driver gives the
    /// guest balloon pages back.
    pub deflate_on_oom: bool,
    /// virtio-balloon's free page reporting: pages the guest has kept free for the
    /// driver's delay go back to the host in whole blocks, without a balloon.
    pub free_page_reporting: bool,
    /// Swap on zram: the share of each swapped page its compressed copy keeps in the
    /// guest's RAM. `None`: swap on a disk.
    pub zram: Option<f64>,
}

impl GuestParams {
    /// The parameters of a VM described in a scenario.
    pub fn from_spec(spec: &VmSpec) -> Self {
        let w = &spec.workload;
        GuestParams {
            configured: pages(spec.memory_mib),
            kernel: pages(spec.kernel_mib),
            swap: pages(spec.swap_mib),
            untouched_commit: pages(spec.untouched_commit_mib),
            kernel_shareable: spec.kernel_shareable_pct / 100.0,
            idle_shareable: w.shareable_pct / 100.0,
            hot: w.hot_pct / 100.0,
            hot_access: w.hot_access_pct / 100.0,
            base_pages_s: w.base_mib_s * PAGES_PER_MIB,
            deflate_on_oom: false,
            free_page_reporting: false,
            zram: spec.zram_pct.map(|pct| pct / 100.0),
        }
    }
}

/// A guest's memory.
#[derive(Clone, Debug)]
pub struct Guest {
    params: GuestParams,
    wmark: Watermarks,
    rng: Rng,
    /// Kernel memory (never freed).
    pub kernel: Pool,
    /// Resident anonymous working set.
    pub anon_ws: Pool,
    /// Resident idle anonymous memory.
    pub anon_idle: Pool,
    /// Cached page-cache working set.
    pub file_ws: Pool,
    /// Page cache outside the working set.
    pub file_idle: Pool,
    /// Free pages the host backs.
    pub free_backed: Pool,
    /// Pages holding what the guest swapped to zram, compressed (none on a disk).
    pub zram: Pool,
    /// Free pages the host does not back.
    pub free_unbacked: u64,
    /// Pages held by the balloon (given back to the host).
    pub balloon: u64,
    balloon_target: u64,
    /// Working-set anonymous pages in guest swap.
    pub swap_ws: u64,
    /// Idle anonymous pages in guest swap.
    pub swap_idle: u64,
    /// Working-set file pages never read since they joined the working set.
    pub file_unread: u64,
    /// Working-set file pages evicted from the cache.
    pub file_evicted: u64,
    /// Anonymous pages allocated (committed) but not touched yet: a program touches fresh
    /// memory at its work rate, not all at once.
    pub anon_pending: u64,
    /// Anonymous memory the workload has committed up front (its heap), counted in
    /// Committed_AS as far as it holds no page yet.
    pub heap: u64,
    /// Counters since boot.
    pub counters: GuestCounters,
    /// What happened in the last tick.
    pub last: GuestCounters,
    /// On a two-tier host: the extra time an access takes on average because part of the
    /// working set is in the slow tier, as a share of an access's time with it all in
    /// DRAM (set by [`crate::tiers`]; 0 on a one-tier host).
    pub tier_slowdown: f64,
    pressure: Pressure,
    /// With free page reporting: each step's length (s) and the free pages the host
    /// backed at its end, over the reporting delay.
    free_seen: VecDeque<(f64, u64)>,
}

impl Guest {
    /// A freshly booted guest: the kernel's pages touched, everything else free and not
    /// backed by the host.
    pub fn boot(params: GuestParams, rng: Rng) -> Self {
        let kernel = params.kernel.min(params.configured);
        Guest {
            kernel: Pool {
                pages: kernel,
                host_swapped: 0,
            },
            anon_ws: Pool::default(),
            anon_idle: Pool::default(),
            file_ws: Pool::default(),
            file_idle: Pool::default(),
            free_backed: Pool::default(),
            zram: Pool::default(),
            free_unbacked: params.configured - kernel,
            balloon: 0,
            balloon_target: 0,
            swap_ws: 0,
            swap_idle: 0,
            file_unread: 0,
            file_evicted: 0,
            anon_pending: 0,
            heap: 0,
            counters: GuestCounters::default(),
            last: GuestCounters::default(),
            tier_slowdown: 0.0,
            pressure: Pressure::default(),
            free_seen: VecDeque::new(),
            wmark: Watermarks::for_ram(params.configured),
            params,
            rng,
        }
    }

    /// The guest of a VM that has not started (yet): all its RAM free and not backed by
    /// the host. [`Guest::reboot`] starts it.
    pub fn hold(&mut self) {
        self.reboot();
        self.free_unbacked += self.kernel.pages;
        self.kernel = Pool::default();
    }

    /// Start again after the VM was killed and restarted: the balloon is gone, memory
    /// and counters start from boot. What it did in the tick it was killed in (`last`)
    /// still happened: it stays until its next step (found by a capacity planner: the
    /// tick of every host OOM kill was missing from the per-VM figures, which then fell
    /// short of the run's totals).
    pub fn reboot(&mut self) {
        let last = std::mem::take(&mut self.last);
        *self = Guest::boot(self.params.clone(), self.rng.clone());
        self.last = last;
    }

    /// The fixed parameters.
    pub fn params(&self) -> &GuestParams {
        &self.params
    }

    /// Free pages.
    pub fn free(&self) -> u64 {
        self.free_backed.pages + self.free_unbacked
    }

    /// The guest's logical size: RAM minus the balloon (balloon `actual`).
    pub fn actual(&self) -> u64 {
        self.params.configured - self.balloon
    }

    /// Ask the balloon driver for a logical size of `target` pages.
    pub fn set_target(&mut self, target: u64) {
        let target = target.clamp(self.kernel.pages, self.params.configured);
        self.balloon_target = self.params.configured - target;
    }

    /// Working-set pages out of guest memory: in guest swap, or file data not cached.
    pub fn ws_missing(&self) -> u64 {
        self.swap_ws + self.file_unread + self.file_evicted
    }

    /// The working set the workload wants resident (pages).
    pub fn working_set(&self) -> u64 {
        self.anon_ws.pages
            + self.swap_ws
            + self.file_ws.pages
            + self.file_unread
            + self.file_evicted
    }

    fn pools(&self) -> [Pool; 7] {
        [
            self.kernel,
            self.zram,
            self.anon_ws,
            self.anon_idle,
            self.file_ws,
            self.file_idle,
            self.free_backed,
        ]
    }

    /// Guest pages in host memory (the QEMU process's guest RAM resident set).
    pub fn host_resident(&self) -> u64 {
        self.pools().iter().map(|p| p.host_resident()).sum()
    }

    /// Host-backed pages an access tracker finds untouched for `age_s` at this moment's
    /// make-up: the idle pools (idle anonymous memory, page cache outside the working
    /// set, free pages) and the resident working-set pages the workload's accesses, at
    /// its base rate, miss for that long (its hot and cold parts each touched uniformly).
    pub fn untouched_for(&self, age_s: f64) -> f64 {
        let idle = self.anon_idle.host_resident()
            + self.file_idle.host_resident()
            + self.free_backed.host_resident();
        let resident = (self.anon_ws.host_resident() + self.file_ws.host_resident()) as f64;
        let hot = self.params.hot.clamp(0.0, 1.0);
        let [missed_hot, missed_cold] = self.ws_missed_for(age_s);
        idle as f64 + resident * (hot * missed_hot + (1.0 - hot) * missed_cold)
    }

    /// The shares of the working set's hot part and of its cold part that the workload's
    /// accesses, at its base rate, miss for `age_s` (each part touched uniformly).
    pub fn ws_missed_for(&self, age_s: f64) -> [f64; 2] {
        let ws = self.working_set() as f64;
        let touches = self.params.base_pages_s * age_s;
        // `part` of the working set, getting `access` of the touches.
        let missed = |part: f64, access: f64| {
            if part <= 0.0 || ws <= 0.0 {
                0.0
            } else {
                (-touches * access / (part * ws)).exp()
            }
        };
        let (hot, access) = (self.params.hot, self.params.hot_access);
        if hot <= 0.0 || hot >= 1.0 {
            [missed(1.0, 1.0); 2]
        } else {
            [missed(hot, access), missed(1.0 - hot, 1.0 - access)]
        }
    }

    /// Guest pages in host swap.
    pub fn host_swapped(&self) -> u64 {
        self.pools().iter().map(|p| p.host_swapped).sum()
    }

    /// Host-resident pages KSM could merge: part of the kernel and of the idle pages
    /// (pages written all the time change too fast to stay merged).
    pub fn shareable(&self) -> u64 {
        let idle = self.anon_idle.host_resident()
            + self.file_idle.host_resident()
            + self.free_backed.host_resident();
        (self.kernel.host_resident() as f64 * self.params.kernel_shareable
            + idle as f64 * self.params.idle_shareable) as u64
    }

    /// Check that every page is accounted for exactly once.
    pub fn check(&self) -> Result<(), String> {
        let in_use: u64 = self.pools().iter().map(|p| p.pages).sum();
        let total = in_use + self.free_unbacked + self.balloon;
        if total != self.params.configured {
            return Err(format!(
                "pages add up to {total}, not the configured {}",
                self.params.configured
            ));
        }
        if self.swap_ws + self.swap_idle > self.params.swap {
            return Err("guest swap holds more than its size".into());
        }
        if self.pools().iter().any(|p| p.host_swapped > p.pages) {
            return Err("more pages host-swapped than exist in a role".into());
        }
        Ok(())
    }

    /// Advance by `dt` seconds: the balloon moves toward its target, the workload resizes
    /// its memory to `demand` and runs, and kswapd restores the free watermark.
    pub fn step(&mut self, dt: f64, demand: &Demand, costs: &Costs) {
        let before = self.counters;
        self.move_balloon(dt, costs);
        self.resize(dt, demand);
        let c = &self.counters;
        let busy_us = (c.minor_faults - before.minor_faults) as f64 * costs.minor_fault_us
            + (c.host_first_touch - before.host_first_touch) as f64 * costs.host_fault_us
            + (c.host_swap_in - before.host_swap_in) as f64 * costs.host_swap_in_us;
        self.counters.host_stall_us += busy_us;
        // A workload that is stopped, or was just killed, does no work.
        if !demand.stopped && self.counters.oom_kills == before.oom_kills {
            self.run(dt, busy_us * 1e-6, costs);
        }
        // The kernel runs whatever its workload does: its image and page structures are
        // touched every tick.
        let kernel_touched = kernel_seen_touched(bytes(self.actual()));
        self.counters.referenced += self.kernel.pages.min(kernel_touched.0 / PAGE_SIZE) as f64;
        self.shrink_zram();
        let free = self.free();
        let low = self.wmark.low;
        if free < low {
            let got = self.reclaim(self.wmark.high - free);
            self.counters.kswapd_reclaimed += got;
        }
        self.report_free(dt);
        self.last = delta(&self.counters, &before);
        self.pressure.record(self.last.memory_stall_us, dt);
    }

    /// Free page reporting: the free pages the host has backed throughout the last
    /// [`REPORT_DELAY_S`] go back to the host, in whole [`REPORT_BLOCK`]s (the model has
    /// no fragmentation: every free page is in a block that can be reported).
    fn report_free(&mut self, dt: f64) {
        if !self.params.free_page_reporting {
            return;
        }
        self.free_seen.push_back((dt, self.free_backed.pages));
        let mut span: f64 = self.free_seen.iter().map(|(d, _)| d).sum();
        while self.free_seen.len() > 1 && span - self.free_seen[0].0 >= REPORT_DELAY_S {
            span -= self.free_seen.pop_front().map_or(0.0, |(d, _)| d);
        }
        if span < REPORT_DELAY_S {
            return;
        }
        let steady = self.free_seen.iter().map(|(_, p)| *p).min().unwrap_or(0);
        let n = steady / REPORT_BLOCK * REPORT_BLOCK;
        if n == 0 {
            return;
        }
        // Resident ones free host memory, host-swapped ones host swap, unread.
        self.free_backed.take(n, &mut self.rng);
        self.free_unbacked += n;
        for (_, p) in &mut self.free_seen {
            *p = p.saturating_sub(n);
        }
    }

    fn move_balloon(&mut self, dt: f64, costs: &Costs) {
        let step = pages(costs.balloon_mib_s * dt).max(1);
        if self.balloon_target > self.balloon {
            let want = (self.balloon_target - self.balloon).min(step);
            let min = self.wmark.min;
            let free = self.free();
            if free < want + min {
                let got = self.reclaim(want + min - free);
                self.counters.direct_reclaimed += got;
            }
            let free = self.free();
            let n = want.min(free.saturating_sub(min));
            let from_backed = self
                .rng
                .share(n, self.free_backed.pages, free)
                .max(n.saturating_sub(self.free_unbacked));
            // The pages go back to the host: resident ones free host memory, host-swapped
            // ones free host swap, without being read.
            self.free_backed.take(from_backed, &mut self.rng);
            self.free_unbacked -= n - from_backed;
            self.balloon += n;
        } else if self.balloon_target < self.balloon {
            let n = (self.balloon - self.balloon_target).min(step);
            self.balloon -= n;
            self.free_unbacked += n;
        }
    }

    /// Resize the workload's memory to what it wants now. What it allocates more is
    /// committed at once and touched at the work rate over the following ticks (a
    /// program writes its fresh buffer page by page: a guest growing by 2.5 GiB at
    /// 512 MiB/s takes 5 s, and a balloon deflating as fast keeps up with it).
    fn resize(&mut self, dt: f64, d: &Demand) {
        let mut budget = (self.params.base_pages_s * dt).max(1.0) as u64;
        self.anon_pending = 0;
        self.heap = d.heap;
        if d.restart {
            let all = self.anon_ws.pages + self.swap_ws;
            release(
                &mut self.anon_ws,
                &mut self.swap_ws,
                &mut self.free_backed,
                all,
                &mut self.rng,
            );
        }
        let idle = self.anon_idle.pages + self.swap_idle;
        if idle > d.idle {
            release(
                &mut self.anon_idle,
                &mut self.swap_idle,
                &mut self.free_backed,
                idle - d.idle,
                &mut self.rng,
            );
        } else if idle < d.idle {
            let n = (d.idle - idle).min(budget);
            budget -= n;
            self.anon_pending += d.idle - idle - n;
            if !self.populate(false, n) {
                return self.oom_kill();
            }
        }
        let ws = self.anon_ws.pages + self.swap_ws;
        if ws > d.anon {
            release(
                &mut self.anon_ws,
                &mut self.swap_ws,
                &mut self.free_backed,
                ws - d.anon,
                &mut self.rng,
            );
        } else if ws < d.anon {
            let n = (d.anon - ws).min(budget);
            self.anon_pending += d.anon - ws - n;
            if !self.populate(true, n) {
                return self.oom_kill();
            }
        }
        let missing = self.file_unread + self.file_evicted;
        let fws = self.file_ws.pages + missing;
        if fws > d.file {
            // Files leave the working set: cached pages stay cached (now idle).
            let n = fws - d.file;
            let cached = self
                .rng
                .share(n, self.file_ws.pages, fws)
                .max(n.saturating_sub(missing));
            let p = self.file_ws.take(cached, &mut self.rng);
            self.file_idle.add(p);
            let gone = n - cached;
            let evicted = self
                .rng
                .share(gone, self.file_evicted, missing)
                .max(gone.saturating_sub(self.file_unread));
            self.file_evicted -= evicted;
            self.file_unread -= gone - evicted;
        } else if fws < d.file {
            // Files join the working set: those still cached are hits, the rest is read.
            let n = d.file - fws;
            let p = self.file_idle.take(n, &mut self.rng);
            self.file_unread += n - p.pages;
            self.file_ws.add(p);
        }
    }

    /// Allocate and touch `n` fresh anonymous pages for the working set or the idle
    /// region, a batch at a time, so that reclaim can swap out pages touched before (of
    /// the same region too). False when memory and swap are exhausted.
    fn populate(&mut self, working_set: bool, n: u64) -> bool {
        let mut left = n;
        while left > 0 {
            let room = self.free().saturating_sub(self.wmark.low);
            let batch = if room > 0 {
                left.min(room)
            } else {
                left.min(self.wmark.high.max(1))
            };
            let Some(p) = self.alloc(batch) else {
                return false;
            };
            self.counters.minor_faults += batch;
            self.counters.referenced += batch as f64;
            if working_set {
                self.anon_ws.add(p);
            } else {
                self.anon_idle.add(p);
            }
            left -= batch;
        }
        true
    }

    /// The workload runs for what is left of the tick after allocating (`busy_s`).
    fn run(&mut self, dt: f64, busy_s: f64, costs: &Costs) {
        let time = (dt - busy_s).max(0.0);
        let resident = self.anon_ws.pages + self.file_ws.pages;
        let missing_file = self.file_unread + self.file_evicted;
        let missing = self.swap_ws + missing_file;
        let ws = resident + missing;
        let rate = self.params.base_pages_s;
        if ws == 0 {
            self.counters.touched += time * rate;
            return;
        }
        let miss = self.access_share(missing as f64 / ws as f64);
        let host_swapped = self.anon_ws.host_swapped + self.file_ws.host_swapped;
        let p_host = if resident > 0 {
            (1.0 - miss) * host_swapped as f64 / resident as f64
        } else {
            0.0
        };
        let (p_anon, p_file) = if missing > 0 {
            let a = miss * self.swap_ws as f64 / missing as f64;
            (a, miss - a)
        } else {
            (0.0, 0.0)
        };
        // A page read in needs a free frame; one the host swapped out is read back by the
        // host first (it cannot know the guest will overwrite it), one it never backed is
        // faulted in.
        let free = self.free();
        let frame_us = if free > 0 {
            (self.free_backed.host_swapped as f64 * costs.host_swap_in_us
                + self.free_unbacked as f64 * costs.host_fault_us)
                / free as f64
        } else {
            0.0
        };
        let swap_in_us = match self.params.zram {
            Some(_) => costs.zram_swap_in_us,
            None => costs.guest_swap_in_us,
        };
        let guest_us = p_anon * swap_in_us + p_file * costs.file_read_us;
        let host_us = p_host * costs.host_swap_in_us + (p_anon + p_file) * frame_us;
        let per_page_s = (1.0 + self.tier_slowdown) / rate + (guest_us + host_us) * 1e-6;
        let touched = time / per_page_s;
        self.counters.touched += touched;
        // Distinct pages among `touched` accesses spread over the working set.
        self.counters.referenced += ws as f64 * -(-touched / ws as f64).exp_m1();
        self.counters.stall_us += touched * guest_us;
        let p_refault = if missing_file > 0 {
            p_file * self.file_evicted as f64 / missing_file as f64
        } else {
            0.0
        };
        self.counters.memory_stall_us +=
            touched * (p_anon * swap_in_us + p_refault * costs.file_read_us);
        self.counters.host_stall_us += touched * host_us;

        // Host faults on working-set pages the host swapped out.
        let k = self.rng.round(touched * p_host).min(host_swapped);
        let from_anon = self
            .rng
            .share(k, self.anon_ws.host_swapped, host_swapped)
            .max(k.saturating_sub(self.file_ws.host_swapped));
        self.anon_ws.host_swapped -= from_anon;
        self.file_ws.host_swapped -= k - from_anon;
        self.counters.host_swap_in += k;

        // Guest swap-ins.
        let s = self.rng.round(touched * p_anon).min(self.swap_ws);
        if s > 0 {
            self.swap_ws -= s;
            match self.alloc(s) {
                Some(p) => {
                    self.anon_ws.add(p);
                    self.counters.swap_in += s;
                    self.counters.major_faults += s;
                    self.counters.refault_anon += s;
                }
                None => return self.oom_kill(),
            }
        }

        // Page-cache misses.
        let missing_file = self.file_unread + self.file_evicted;
        let f = self.rng.round(touched * p_file).min(missing_file);
        if f > 0 {
            let Some(p) = self.alloc(f).or_else(|| {
                self.oom_kill();
                self.alloc(f)
            }) else {
                return;
            };
            let evicted = self
                .rng
                .share(f, self.file_evicted, missing_file)
                .max(f.saturating_sub(self.file_unread));
            self.file_evicted -= evicted;
            self.file_unread -= f - evicted;
            self.file_ws.add(p);
            self.counters.major_faults += f;
            self.counters.refault_file += evicted;
        }
    }

    /// The share of accesses that go to the coldest `u` of the working set (the part the
    /// guest's LRU keeps out of memory).
    pub fn access_share(&self, u: f64) -> f64 {
        let (hot, access) = (self.params.hot, self.params.hot_access);
        let cold = 1.0 - hot;
        if cold <= 0.0 {
            return u;
        }
        if u <= cold {
            u * (1.0 - access) / cold
        } else {
            (1.0 - access) + (u - cold) * access / hot
        }
    }

    /// Take `n` free pages, reclaiming first when free memory would fall below the low
    /// watermark. `None` when not even reclaim can find them (the caller OOM-kills).
    fn alloc(&mut self, n: u64) -> Option<Pool> {
        if n == 0 {
            return Some(Pool::default());
        }
        let free = self.free();
        if free < n + self.wmark.low {
            if free < n + self.wmark.min {
                self.counters.alloc_stalls += 1;
            }
            let got = self.reclaim(n + self.wmark.high - free);
            self.counters.direct_reclaimed += got;
        }
        let free = self.free();
        if free < n {
            self.deflate_on_oom(n - free);
        }
        let free = self.free();
        if free < n {
            return None;
        }
        let from_backed = self
            .rng
            .share(n, self.free_backed.pages, free)
            .max(n.saturating_sub(self.free_unbacked));
        let backed = self.free_backed.take(from_backed, &mut self.rng);
        self.free_unbacked -= n - from_backed;
        self.counters.host_swap_in += backed.host_swapped;
        self.counters.host_first_touch += n - from_backed;
        Some(Pool {
            pages: n,
            host_swapped: 0,
        })
    }

    /// virtio-balloon's OOM notifier, where the device has deflate-on-oom: balloon pages
    /// go back to the guest, 1 MiB at a time (VIRTIO_BALLOON_OOM_NR_PAGES), as many as
    /// the allocation lacks. The balloon's target stays: the driver inflates again when
    /// it can.
    fn deflate_on_oom(&mut self, lacking: u64) {
        if !self.params.deflate_on_oom || self.balloon == 0 {
            return;
        }
        let n = lacking.div_ceil(256).saturating_mul(256).min(self.balloon);
        self.balloon -= n;
        self.free_unbacked += n;
        self.counters.oom_deflations += 1;
    }

    /// Free up to `want` pages in LRU order; returns how many were freed.
    fn reclaim(&mut self, want: u64) -> u64 {
        // Pages swapped in or freed since give back their compressed copies first.
        let mut left = want.saturating_sub(self.shrink_zram());
        let p = self.file_idle.take(left, &mut self.rng);
        left -= p.pages;
        self.free_backed.add(p);
        if left > 0 {
            left -= self.swap_out(false, left).min(left);
        }
        if left > 0 {
            let p = self.file_ws.take(left, &mut self.rng);
            left -= p.pages;
            self.file_evicted += p.pages;
            self.free_backed.add(p);
        }
        if left > 0 {
            left -= self.swap_out(true, left).min(left);
        }
        want - left
    }

    /// Write anonymous pages (working set or idle) to guest swap until `n` pages are
    /// free, or none is left to write; returns how many were freed (on zram, fewer than
    /// were written: their compressed copies stay).
    fn swap_out(&mut self, working_set: bool, n: u64) -> u64 {
        let room = self.params.swap - self.swap_ws - self.swap_idle;
        let written = match self.params.zram {
            Some(r) if r < 1.0 => (n as f64 / (1.0 - r)).ceil() as u64,
            _ => n,
        };
        let (pool, swap) = if working_set {
            (&mut self.anon_ws, &mut self.swap_ws)
        } else {
            (&mut self.anon_idle, &mut self.swap_idle)
        };
        let p = pool.take(written.min(room), &mut self.rng);
        *swap += p.pages;
        self.counters.swap_out += p.pages;
        // To write a page the host swapped out, the host must read it back first.
        self.counters.host_swap_in += p.host_swapped;
        // On zram, the compressed copies stay in the guest's RAM.
        let kept = self.zram_for(p.pages);
        self.zram.add(Pool {
            pages: kept,
            host_swapped: 0,
        });
        self.free_backed.add(Pool {
            pages: p.pages - kept,
            host_swapped: 0,
        });
        p.pages - kept
    }

    /// The pages zram takes for `swapped` pages (none on a disk).
    fn zram_for(&self, swapped: u64) -> u64 {
        self.params
            .zram
            .map_or(0, |r| ((swapped as f64 * r).ceil() as u64).min(swapped))
    }

    /// What zram holds beyond what the guest's swap now stores (pages swapped in, or
    /// freed, since) becomes free: before each reclaim and at the end of each step, as
    /// the kernel frees a slot's compressed copy when the slot is freed. Returns how
    /// many pages.
    fn shrink_zram(&mut self) -> u64 {
        let keep = self.zram_for(self.swap_ws + self.swap_idle);
        let freed = self
            .zram
            .take(self.zram.pages.saturating_sub(keep), &mut self.rng);
        self.free_backed.add(freed);
        freed.pages
    }

    /// Kill the workload: its anonymous memory and swap are freed.
    fn oom_kill(&mut self) {
        let n = self.anon_ws.pages + self.swap_ws;
        release(
            &mut self.anon_ws,
            &mut self.swap_ws,
            &mut self.free_backed,
            n,
            &mut self.rng,
        );
        let n = self.anon_idle.pages + self.swap_idle;
        release(
            &mut self.anon_idle,
            &mut self.swap_idle,
            &mut self.free_backed,
            n,
            &mut self.rng,
        );
        self.anon_pending = 0;
        self.heap = 0;
        self.counters.oom_kills += 1;
    }

    /// The host swaps out `n` of this guest's pages, chosen at random among the pages it
    /// backs: it cannot tell hot pages from cold or free ones. Returns how many.
    pub fn host_evict(&mut self, n: u64) -> u64 {
        let total = self.host_resident();
        let n = n.min(total);
        let (mut left, mut left_total) = (n, total);
        for pool in [
            &mut self.kernel,
            &mut self.zram,
            &mut self.anon_ws,
            &mut self.anon_idle,
            &mut self.file_ws,
            &mut self.file_idle,
            &mut self.free_backed,
        ] {
            let hr = pool.host_resident();
            let k = self
                .rng
                .share(left, hr, left_total)
                .max(left.saturating_sub(left_total - hr));
            pool.host_swapped += k;
            left -= k;
            left_total -= hr;
        }
        self.counters.host_swap_out += n;
        self.last.host_swap_out += n;
        n
    }

    /// The virtio-balloon statistics the guest reports through QEMU.
    pub fn stats(&self, at_s: u64) -> GuestStats {
        let c = &self.counters;
        let cache = self.file_ws.pages + self.file_idle.pages;
        let free = self.free();
        GuestStats {
            swap_in: Some(bytes(c.swap_in)),
            swap_out: Some(bytes(c.swap_out)),
            major_faults: Some(c.major_faults),
            minor_faults: Some(c.minor_faults),
            free: Some(bytes(free)),
            total: Some(bytes(self.actual())),
            available: Some(bytes(self.available())),
            disk_caches: Some(bytes(cache)),
            hugetlb_allocs: None,
            hugetlb_failures: None,
            oom_kills: Some(c.oom_kills),
            alloc_stalls: Some(c.alloc_stalls),
            async_scans: None,
            direct_scans: None,
            async_reclaims: Some(c.kswapd_reclaimed),
            direct_reclaims: Some(c.direct_reclaimed),
            other: Default::default(),
            last_update: Some(at_s),
        }
    }

    /// MemAvailable: free memory and page cache, less the low watermark.
    fn available(&self) -> u64 {
        (self.free() + self.file_ws.pages + self.file_idle.pages).saturating_sub(self.wmark.low)
    }

    /// What the guest's kernel shows its agent: /proc/meminfo, /proc/vmstat and
    /// /proc/pressure/memory. The working sets are the active lists, idle memory the
    /// inactive ones.
    pub fn agent_stats(&self) -> AgentStats {
        let c = &self.counters;
        let anon = self.anon_ws.pages + self.anon_idle.pages;
        let allocated = self.anon_ws.pages
            + self.swap_ws
            + self.anon_idle.pages
            + self.swap_idle
            + self.anon_pending;
        let committed = self.kernel.pages + allocated.max(self.heap) + self.params.untouched_commit;
        let line = self.pressure.line();
        AgentStats {
            meminfo: MemInfo {
                total: bytes(self.actual()),
                free: bytes(self.free()),
                available: Some(bytes(self.available())),
                buffers: Bytes::ZERO,
                cached: bytes(self.file_ws.pages + self.file_idle.pages),
                swap_total: bytes(self.params.swap),
                swap_free: bytes(self.params.swap - self.swap_ws - self.swap_idle),
                anon_pages: Some(bytes(anon)),
                committed_as: Some(bytes(committed)),
                active_anon: Some(bytes(self.anon_ws.pages)),
                inactive_anon: Some(bytes(self.anon_idle.pages)),
                active_file: Some(bytes(self.file_ws.pages)),
                inactive_file: Some(bytes(self.file_idle.pages)),
                shmem: Some(Bytes::ZERO),
                slab_unreclaimable: None,
                slab_reclaimable: None,
            },
            vmstat: VmStat {
                pswpin: Some(c.swap_in),
                pswpout: Some(c.swap_out),
                pgmajfault: Some(c.major_faults),
                pgfault: Some(c.major_faults + c.minor_faults),
                workingset_refault_anon: Some(c.refault_anon),
                workingset_refault_file: Some(c.refault_file),
                oom_kill: Some(c.oom_kills),
                allocstall: Some(c.alloc_stalls),
            },
            // One workload: when it stalls, all work stalls.
            psi: Some(Psi {
                some: line,
                full: Some(line),
            }),
            zram: self.params.zram.map(|_| ZramSwap {
                free: bytes(self.params.swap - self.swap_ws - self.swap_idle),
                stored: bytes(self.swap_ws + self.swap_idle),
                used: bytes(self.zram.pages),
            }),
        }
    }
}

/// Free `n` anonymous pages of a region, resident and swapped in proportion: resident
/// pages become free (the host still backs them), swap slots are released.
fn release(from: &mut Pool, swap: &mut u64, free: &mut Pool, n: u64, rng: &mut Rng) {
    let total = from.pages + *swap;
    let n = n.min(total);
    let resident = rng.share(n, from.pages, total).max(n.saturating_sub(*swap));
    free.add(from.take(resident, rng));
    *swap -= n - resident;
}

/// The counters of one tick.
fn delta(now: &GuestCounters, before: &GuestCounters) -> GuestCounters {
    GuestCounters {
        swap_in: now.swap_in - before.swap_in,
        swap_out: now.swap_out - before.swap_out,
        major_faults: now.major_faults - before.major_faults,
        minor_faults: now.minor_faults - before.minor_faults,
        refault_anon: now.refault_anon - before.refault_anon,
        refault_file: now.refault_file - before.refault_file,
        oom_kills: now.oom_kills - before.oom_kills,
        oom_deflations: now.oom_deflations - before.oom_deflations,
        alloc_stalls: now.alloc_stalls - before.alloc_stalls,
        kswapd_reclaimed: now.kswapd_reclaimed - before.kswapd_reclaimed,
        direct_reclaimed: now.direct_reclaimed - before.direct_reclaimed,
        host_swap_in: now.host_swap_in - before.host_swap_in,
        host_swap_out: now.host_swap_out - before.host_swap_out,
        host_first_touch: now.host_first_touch - before.host_first_touch,
        stall_us: now.stall_us - before.stall_us,
        memory_stall_us: now.memory_stall_us - before.memory_stall_us,
        host_stall_us: now.host_stall_us - before.host_stall_us,
        touched: now.touched - before.touched,
        referenced: now.referenced - before.referenced,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(mib_ram: f64) -> GuestParams {
        GuestParams {
            configured: pages(mib_ram),
            kernel: pages(64.0),
            swap: pages(256.0),
            untouched_commit: 0,
            kernel_shareable: 0.5,
            idle_shareable: 0.0,
            hot: 1.0,
            hot_access: 1.0,
            base_pages_s: pages(1000.0) as f64,
            deflate_on_oom: false,
            free_page_reporting: false,
            zram: None,
        }
    }

    fn demand(anon_mib: f64) -> Demand {
        Demand {
            anon: pages(anon_mib),
            ..Demand::default()
        }
    }

    #[test]
    fn watermarks_follow_linux() {
        // 4 GiB: min_free_kbytes 8192; steps of 0.1% of RAM (about 4 MiB).
        let w = Watermarks::for_ram(pages(4096.0));
        assert_eq!(w.min, 2048);
        assert_eq!((w.low - w.min, w.high - w.low), (1048, 1048));
    }

    #[test]
    fn a_fitting_working_set_runs_at_the_base_rate() {
        let mut g = Guest::boot(params(1024.0), Rng::new(1));
        let costs = Costs::default();
        g.step(1.0, &demand(500.0), &costs);
        for _ in 0..5 {
            g.step(1.0, &demand(500.0), &costs);
            assert_eq!(g.last.major_faults, 0);
            assert!((mib(g.last.touched as u64) - 1000.0).abs() < 1.0);
        }
        g.check().unwrap();
        assert_eq!(g.host_resident(), pages(564.0));
    }

    #[test]
    fn the_host_sees_the_kernels_image_and_page_structures_touched_every_tick() {
        // A 1 GiB guest: 32 MiB of image and 16 of page structures, of its 64 MiB kernel.
        let mut g = Guest::boot(params(1024.0), Rng::new(1));
        let costs = Costs::default();
        g.step(1.0, &demand(0.0), &costs);
        g.step(1.0, &demand(0.0), &costs);
        assert_eq!(
            g.last.referenced,
            pages(48.0) as f64,
            "idle: the kernel's alone"
        );
        g.step(1.0, &demand(300.0), &costs);
        g.step(1.0, &demand(300.0), &costs);
        let both = mib(g.last.referenced as u64);
        assert!(
            (48.0 + 250.0..=48.0 + 300.0).contains(&both),
            "and the workload's: {both}"
        );
        // A kernel smaller than that is all touched.
        let mut g = Guest::boot(params(4096.0), Rng::new(1));
        g.step(1.0, &demand(0.0), &costs);
        assert_eq!(g.last.referenced, pages(64.0) as f64);
    }

    #[test]
    fn a_balloon_below_the_working_set_makes_the_guest_swap() {
        let mut g = Guest::boot(params(1024.0), Rng::new(1));
        let costs = Costs::default();
        g.step(1.0, &demand(700.0), &costs);
        g.set_target(pages(600.0));
        for _ in 0..5 {
            g.step(1.0, &demand(700.0), &costs);
            g.check().unwrap();
        }
        assert_eq!(g.actual(), pages(600.0));
        assert!(g.swap_ws > pages(150.0), "{}", mib(g.swap_ws));
        assert!(g.last.swap_in > 0);
        assert!(mib(g.last.touched as u64) < 500.0);
    }

    /// A 1 GiB guest (swap on zram keeping `zram` of each page, or a disk) that used
    /// 600 MiB of anonymous memory for a second, its balloon then set to leave it 600 MiB.
    fn ballooned_to_600_mib(zram: Option<f64>, costs: &Costs) -> Guest {
        let mut g = Guest::boot(
            GuestParams {
                zram,
                ..params(1024.0)
            },
            Rng::new(1),
        );
        g.step(1.0, &demand(600.0), costs);
        g.set_target(pages(600.0));
        g
    }

    #[test]
    fn swap_on_zram_keeps_its_compressed_copies_in_the_guests_ram() {
        let costs = Costs::default();
        // 600 MiB of anonymous memory ballooned to 600 MiB: on a disk, the kernel's 64 MiB
        // and the watermarks' go to swap; on zram at a third, half as much again.
        let swapped = |zram: Option<f64>| {
            let mut g = ballooned_to_600_mib(zram, &costs);
            for _ in 0..5 {
                g.step(1.0, &demand(600.0), &costs);
                g.check().unwrap();
            }
            assert_eq!(g.counters.oom_kills, 0);
            let stored = g.swap_ws + g.swap_idle;
            assert_eq!(g.zram.pages, g.zram_for(stored), "{zram:?}");
            let told = g.agent_stats().zram;
            assert_eq!(told.map(|z| z.used), zram.map(|_| bytes(g.zram.pages)));
            assert_eq!(told.map(|z| z.stored), zram.map(|_| bytes(stored)));
            mib(stored)
        };
        let disk = swapped(None);
        let zram = swapped(Some(1.0 / 3.0));
        assert!(zram > disk * 1.4, "{zram} MiB on zram, {disk} on a disk");
        // What it swapped comes back: zram gives back what it held for it.
        let mut g = ballooned_to_600_mib(Some(0.5), &costs);
        g.step(1.0, &demand(600.0), &costs);
        assert!(g.zram.pages > 0);
        g.set_target(pages(1024.0));
        for _ in 0..30 {
            g.step(1.0, &demand(600.0), &costs);
        }
        g.check().unwrap();
        assert_eq!((g.swap_ws + g.swap_idle, g.zram.pages), (0, 0));
    }

    #[test]
    fn a_page_faulted_back_from_zram_costs_a_decompression_not_a_disk_read() {
        // 600 MiB of anonymous memory held at 600 MiB: part of its working set is in swap
        // and comes back as it is touched, each page costing what its swap device costs.
        let costs = Costs::default();
        let stall_per_swap_in = |zram: Option<f64>| {
            let mut g = ballooned_to_600_mib(zram, &costs);
            let before = g.counters;
            for _ in 0..5 {
                g.step(1.0, &demand(600.0), &costs);
            }
            let swap_ins = g.counters.swap_in - before.swap_in;
            assert!(swap_ins > 1000, "{zram:?}: {swap_ins} swap-ins");
            (g.counters.memory_stall_us - before.memory_stall_us) / swap_ins as f64
        };
        let disk = stall_per_swap_in(None);
        let zram = stall_per_swap_in(Some(0.5));
        // (Other stalls, reclaim's among them, add a little to each.)
        assert!(
            (disk / costs.guest_swap_in_us - 1.0).abs() < 0.1,
            "{disk} µs"
        );
        assert!(
            zram >= costs.zram_swap_in_us && zram < disk / 10.0,
            "{zram} µs on zram, {disk} on a disk"
        );
    }

    #[test]
    fn no_memory_and_no_swap_means_oom() {
        let mut p = params(512.0);
        p.swap = 0;
        let mut g = Guest::boot(p, Rng::new(1));
        g.step(1.0, &demand(600.0), &Costs::default());
        assert_eq!(g.counters.oom_kills, 1);
        g.check().unwrap();
    }

    #[test]
    fn free_page_reporting_gives_memory_kept_free_for_two_seconds_back_to_the_host() {
        // A 1024 MiB guest touches 600 MiB, then frees 400 of them (half-second ticks).
        for reporting in [false, true] {
            let mut p = params(1024.0);
            p.free_page_reporting = reporting;
            let mut g = Guest::boot(p, Rng::new(1));
            let costs = Costs::default();
            for _ in 0..4 {
                g.step(0.5, &demand(600.0), &costs);
            }
            assert_eq!(g.host_resident(), pages(664.0));
            // Freed: the host backs it until the driver's delay has passed.
            for _ in 0..3 {
                g.step(0.5, &demand(200.0), &costs);
                assert_eq!(g.host_resident(), pages(664.0), "reporting {reporting}");
            }
            g.step(0.5, &demand(200.0), &costs);
            let resident = if reporting { 264.0 } else { 664.0 };
            assert_eq!(g.host_resident(), pages(resident), "reporting {reporting}");
            g.check().unwrap();
        }
    }

    #[test]
    fn deflate_on_oom_gives_balloon_pages_back_instead_of_a_kill() {
        // 512 MiB, no swap, ballooned to 300 MiB: 200 MiB of anonymous memory fits; 400
        // does not. Without deflate-on-oom that is a kill, with it the balloon gives way.
        for (deflate, kills, deflated) in [(false, 1, false), (true, 0, true)] {
            let mut p = params(512.0);
            p.swap = 0;
            p.deflate_on_oom = deflate;
            let mut g = Guest::boot(p, Rng::new(1));
            g.set_target(pages(300.0));
            let costs = Costs::default();
            g.step(1.0, &demand(200.0), &costs);
            assert_eq!(g.actual(), pages(300.0));
            g.step(1.0, &demand(400.0), &costs);
            assert_eq!(
                (g.counters.oom_kills, g.counters.oom_deflations > 0),
                (kills, deflated),
                "deflate_on_oom = {deflate}"
            );
            g.check().unwrap();
        }
    }

    #[test]
    fn fresh_memory_is_committed_at_once_and_touched_at_the_work_rate() {
        // 1000 MiB/s: a 2500 MiB buffer takes three ticks to fill.
        let mut g = Guest::boot(params(4096.0), Rng::new(1));
        let costs = Costs::default();
        let committed = |g: &Guest| g.agent_stats().meminfo.committed_as.unwrap().mib();
        g.step(1.0, &demand(2500.0), &costs);
        assert_eq!((g.anon_ws.pages, committed(&g)), (pages(1000.0), 64 + 2500));
        g.step(1.0, &demand(2500.0), &costs);
        assert_eq!(g.anon_ws.pages, pages(2000.0));
        g.step(1.0, &demand(2500.0), &costs);
        assert_eq!((g.anon_ws.pages, g.anon_pending), (pages(2500.0), 0));
        // Memory committed and never touched is in Committed_AS and holds no page.
        let mut r = Guest::boot(
            GuestParams {
                untouched_commit: pages(1000.0),
                ..params(4096.0)
            },
            Rng::new(1),
        );
        for _ in 0..3 {
            r.step(1.0, &demand(2500.0), &costs);
        }
        assert_eq!(committed(&r), 64 + 2500 + 1000);
        assert_eq!(r.host_resident(), g.host_resident());
    }

    #[test]
    fn host_eviction_is_blind_to_what_pages_hold() {
        let mut g = Guest::boot(params(1024.0), Rng::new(1));
        let costs = Costs::default();
        g.step(1.0, &demand(800.0), &costs);
        g.step(1.0, &demand(200.0), &costs);
        let hr = g.host_resident();
        assert_eq!(g.host_evict(hr / 2), hr / 2);
        g.check().unwrap();
        // About half of each role went out, hot working set included.
        let share = g.anon_ws.host_swapped as f64 / g.anon_ws.pages as f64;
        assert!((0.4..0.6).contains(&share), "{share}");
        g.step(1.0, &demand(200.0), &costs);
        assert!(g.last.host_swap_in > 0);
    }
}
