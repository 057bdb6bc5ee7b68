//! memtide's estimator. It starts where the guest's own accounting says it stands — its
//! size minus MemAvailable, plus the page cache in active use and a margin — instead of
//! stepping down from Committed_AS, then probes below that the TWS way to find memory the
//! guest holds but does not use (cold anonymous memory, stale cache): fast until the
//! first sign of shortage, slowly after, each probe only once the balloon has brought
//! the guest to the last, and not while the guest agent is silent, nor below its floor, nor
//! below what it cannot give up and what the host saw it touch in each of its latest samples
//! over the share of its need it is taken to touch (at most its need and the page cache it
//! uses), where the hypervisor shows it (host-side access sampling), nor while sampling
//! has no sample in, nor within a step of a level that failed. Any sign of shortage —
//! swap-ins, refaults, OOM kills, and memory pressure and allocation stalls the balloon's
//! own inflation did not cause — backs it off within the same tick: after a failed probe
//! to near the last level that was fine; straight to Committed_AS on a new allocation, or
//! when the guest faults heavily unprobed or with its swap nearly full; to the guest's
//! full size on an OOM kill. Probing resumes after a cool-down that doubles while probes
//! keep failing at the same level; faults falling tick after tick after a back-off are the
//! guest recovering, not a new shortage. What the guest commits more is given at once,
//! what it frees taken back at once; when its need grows, probing restarts fast only if it
//! had found cold memory below Committed_AS. It never goes below the guest's
//! unreclaimable memory plus a floor. A guest first seen while the host does not need
//! memory is left at its size for a few seconds: it may be booting. A guest first seen
//! with its balloon already inflated (managed before: memtide restarted) starts from its
//! current size, held for a cool-down, not from its need afresh.

use super::{clamp, epochs, Allocation, Estimate, Keep, KeepWhy, Observation, TickInterval};
use crate::need::NeedLevel;
use crate::policy::peak::{Peak, WINDOW};
use crate::signals::{kernel_seen_touched, PAGE};
use crate::units::Bytes;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The constants.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FusedConfig {
    /// Margin above the guest's own need, as a share of its configured size.
    pub margin: f64,
    /// Smallest margin, in MiB.
    pub margin_min_mib: u64,
    /// Probing step per epoch, as a share of the configured size.
    pub probe_step: f64,
    /// Probing step per epoch until the first back-off since the guest's need last grew
    /// (TWS's FAST state), as a share of the configured size.
    pub probe_fast_step: f64,
    /// Extra memory given on a back-off, beyond the pages faulted back, as a share of
    /// the configured size.
    pub backoff_step: f64,
    /// The most the pages faulted back in one epoch add on a back-off, as a share of the
    /// configured size: a guest thrashing a little below its working set swaps the same
    /// pages in and out many times a second, so the raw count overshoots (seen on real
    /// guests: 45 MiB faulted back in a second by a guest 10 MiB short).
    pub backoff_max: f64,
    /// Pages faulted back per epoch, as a share of the configured size, that do not count
    /// as a shortage while the balloon inflates: reclaim forced by the balloon evicts a
    /// few pages that are touched again at once (seen on real guests: 119 pages, 0.1% of
    /// a 384 MiB guest, on a 60 MiB inflation far above its working set).
    pub inflation_fault_noise: f64,
    /// Pages faulted back per epoch, as a share of the configured size, that do not count
    /// as a shortage otherwise (seen on real guests: a 384 MiB guest fine at its size
    /// faulted back 1 to 6 pages now and then, and each such back-off cost it 8 MiB).
    pub fault_noise: f64,
    /// Free swap, as a share of the configured size, below which a guest faulting
    /// heavily is backed off to Committed_AS even right after a probe: with its swap
    /// nearly full it cannot absorb a shortage and the next allocation is an OOM kill.
    pub low_swap: f64,
    /// Seconds to hold after a back-off before probing again (doubles on each further
    /// back-off, up to `max_cool_down_s`), and for which a guest that committed more is
    /// taken to be still filling that allocation.
    pub cool_down_s: f64,
    /// Seconds a guest first seen while the host's need is ample is left at its size
    /// before its first estimate (it may be booting).
    pub arrive_s: f64,
    /// Longest hold, in seconds.
    pub max_cool_down_s: f64,
    /// Share of a tick (percent) some guest task may stall on memory (PSI) before the
    /// guest counts as short.
    pub psi_threshold: f64,
    /// Memory kept above the guest's unreclaimable memory, in MiB: by the estimate, and
    /// by the division of memory among VMs.
    pub floor_mib: u64,
    /// Length of an epoch in seconds (steps scale with the tick interval).
    pub epoch_s: f64,
    /// Growth of the guest's own need that counts as new demand: jump to it at once.
    pub rebase_change: f64,
    /// Free share of the domain, with every VM at its costless size, at or above which
    /// the host's need is ample: no probing below the costless size.
    pub ample_free: f64,
    /// Free share below which the host is short: probe at full speed (between the two:
    /// slowly).
    pub short_free: f64,
    /// Samples of host-side access sampling, where the hypervisor gives it, of which the
    /// least touched counts as the guest's hot memory: no probe goes below the bound it
    /// gives ([`FusedConfig::touched_share`]) and the margin (the least of a few, not the
    /// latest: the guest's own swap-out after a probe is read by the hypervisor and shows
    /// as touched for a tick). Until that many are in, the least of those in bounds
    /// probing: never less than the least of more.
    pub touched_samples: usize,
    /// The least share of what a guest needs beyond what it cannot give up that it is
    /// taken to touch in each sample: no probe goes below what it cannot give up
    /// (unreclaimable memory) and what the host saw it touch beyond the kernel's image and
    /// page structures ([`kernel_seen_touched`]) divided by this share, or its need and
    /// the page cache it uses where that is less, nor ever below its floor, nor below all
    /// it touched and what it cannot give up beyond that image and those page structures.
    /// What a guest needs without touching it every sample (programs it runs now and
    /// then, cache it rereads) is more than it touches. In (0, 1]; 1 takes what it touched
    /// as all it needs beyond what it cannot give up.
    pub touched_share: f64,
    /// Take the part of a guest's need the host's access tracking saw untouched for its
    /// cold age, at any level of need (off by default: in the simulator it frees 1.44 ×
    /// the memory MOM frees on cloud-mix at the same throughput, but costs quick 6%).
    pub take_cold: bool,
    /// Seconds after a guest's last allocation during which it keeps what it has
    /// committed even where the host saw memory of it untouched for the tracker's cold
    /// age: a program fills what it allocates at its own pace.
    pub fill_s: f64,
    /// Seconds a guest with free page reporting is given to report what it freed before
    /// the host's resident figure must show it: until then, or until it does, the freed
    /// memory counts as reported. The guest's driver reports 2 s after enough has been
    /// freed (Linux's `PAGE_REPORTING_DELAY`, mm/page_reporting.c), and the agent's figure
    /// and the host's may each lag a tick.
    pub report_wait_s: f64,
}

impl Default for FusedConfig {
    fn default() -> Self {
        FusedConfig {
            margin: 0.03,
            margin_min_mib: 8,
            probe_step: 0.01,
            probe_fast_step: 0.05,
            backoff_step: 0.02,
            backoff_max: 0.05,
            inflation_fault_noise: 0.0025,
            fault_noise: 0.0002,
            low_swap: 0.2,
            cool_down_s: 8.0,
            arrive_s: 8.0,
            max_cool_down_s: 120.0,
            psi_threshold: 1.0,
            floor_mib: 32,
            epoch_s: 1.0,
            rebase_change: 0.10,
            ample_free: 0.08,
            short_free: 0.04,
            touched_samples: 3,
            touched_share: 0.8,
            take_cold: false,
            fill_s: 120.0,
            report_wait_s: 4.0,
        }
    }
}

/// One VM's estimator state.
#[derive(Clone, Debug, Default)]
pub struct Fused {
    estimate: Option<Bytes>,
    /// When the guest was first seen.
    first_seen: Option<Duration>,
    /// The guest's own need at the last rebase.
    base: Bytes,
    /// The guest's own need and Committed_AS at their highest since the balloon last
    /// squeezed it or its estimate last followed its need (a rebase or a release), and
    /// what it swapped out since: what it frees is measured from there, also when it
    /// frees a little each tick.
    freed_from: Option<(Bytes, Option<Bytes>, Bytes)>,
    /// Probing resumes at this time.
    hold_until: Duration,
    /// What the hold is for, as its reason says it.
    hold_for: &'static str,
    /// Back-offs since the last rebase (the cool-down doubles with each).
    backoffs: u32,
    /// The guest's size at the previous tick.
    last_size: Option<Bytes>,
    /// Whether the guest shrank in the previous tick.
    shrank: bool,
    /// The previous tick's probe step, if it probed.
    last_probe: Option<Bytes>,
    /// The pages faulted back at the previous tick, if it backed off or recovered.
    last_backoff_faults: Option<u64>,
    /// Committed_AS at the last tick that had it, and how many ticks since lacked it.
    last_committed: Option<(Bytes, u32)>,
    /// The last failed probe failed as soon as it went below what the guest has
    /// committed: it touches all it allocates, so a rebase does not restart fast probing.
    exact: bool,
    /// The level at which a probe last failed since the guest's need last changed: no
    /// probe comes within a step of it again until it changes.
    failed_at: Option<Bytes>,
    /// Guest memory the hypervisor saw touched in the latest samples, oldest first.
    touched: std::collections::VecDeque<Bytes>,
    /// When the hypervisor last gave a sample of what the guest touched.
    sampled_at: Option<Duration>,
    /// When the guest last allocated more than a probe step, and how much it has
    /// allocated since it began filling (see [`Fused::filling`]).
    allocated_at: Option<Duration>,
    allocated: Bytes,
    /// When the guest last freed memory or committed less: it is no longer filling what
    /// it allocated before.
    released_at: Option<Duration>,
    /// When the guest last freed memory, what the host backed of it then and how much it
    /// freed: what its free page reporting has still to give back.
    freed_at: Option<(Duration, Option<Bytes>, Bytes)>,
    /// The needs (with their margins) the guest freed memory from over the last
    /// [`WINDOW`], and until when it may keep the most of them ([`WINDOW`] after it last
    /// freed): see [`Fused::freed_keep`].
    freed_peaks: Peak,
    freed_until: Option<Duration>,
    interval: TickInterval,
}

/// What a guest's estimator must not forget when the daemon restarts: where probing
/// stands, and the cool-down it has earned.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FusedMemory {
    /// The estimate.
    pub estimate: Bytes,
    /// The guest's own need at the last rebase.
    pub base: Bytes,
    /// Back-offs since the last rebase (the cool-down doubles with each).
    pub backoffs: u32,
    /// Seconds of cool-down left.
    pub hold_s: f64,
    /// The last failed probe found no cold memory below the guest's commitment.
    pub exact: bool,
    /// The hypervisor was sampling what the guest touches: the estimator recalled waits
    /// for a sample before it probes, as after a missed one (files written before this
    /// field read as false).
    #[serde(default)]
    pub sampling: bool,
    /// The need the guest last freed memory from, as far as it may still keep it
    /// ([`Fused::freed_keep`]), and for how many seconds more (none, 0, in files written
    /// before these fields existed).
    #[serde(default)]
    pub freed_peak: Bytes,
    /// Seconds left of [`FusedMemory::freed_peak`].
    #[serde(default)]
    pub freed_peak_s: f64,
}

/// Ticks without Committed_AS across which the last figure is still compared.
const COMMITTED_KEPT_TICKS: u32 = 3;

fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or_default()
}

/// The guest's own need (size − MemAvailable, or used memory), the margin kept above
/// it, and the floor never gone below.
fn need(cfg: &FusedConfig, obs: &Observation) -> Option<(Bytes, Bytes, Bytes)> {
    let s = &obs.signals;
    // size − MemAvailable is the guest's need whether or not its MemTotal shrinks
    // with the balloon (with deflate-on-oom it does not, and balloon pages count as
    // used); without MemAvailable, used memory (cache included) stands in.
    let need = match s.available {
        Some(avail) => obs.size - avail,
        None => s.used?,
    };
    let margin = obs
        .configured
        .scale(cfg.margin)
        .max(Bytes::from_mib(cfg.margin_min_mib));
    let floor =
        (s.unreclaimable.unwrap_or_default() + Bytes::from_mib(cfg.floor_mib)).min(obs.configured);
    Some((need, margin, floor))
}

/// The size that costs the guest nothing: its own need, the page cache it uses and a
/// margin. What lies above it is free memory, memory it freed and page cache it does
/// not use.
pub fn costless(cfg: &FusedConfig, obs: &Observation) -> Option<Bytes> {
    let (need, margin, floor) = need(cfg, obs)?;
    let cache = obs.signals.active_file.unwrap_or_default();
    let cold = cold_need(cfg, obs).unwrap_or_default();
    Some(clamp(need + cache + margin - cold, floor, obs.configured))
}

/// The least a guest needs by what the host saw it touch in each of its latest samples,
/// and the figures it is made of (for the reason).
#[derive(Debug, Clone, Copy, Default)]
struct TouchedBound {
    bound: Bytes,
    /// The least the host saw touched in each of the latest samples.
    touched: Bytes,
    /// What the guest cannot give up: its unreclaimable memory, or its whole floor where
    /// its lists are not read.
    kept: Bytes,
    /// The part of `kept` taken as in the touched memory: its kernel's image and page
    /// structures.
    seen: Bytes,
    /// The rest of `kept`, counted beside the touched memory.
    unseen: Bytes,
    /// The page cache counted with its need.
    cache: Bytes,
}

impl TouchedBound {
    /// For a guest needing `need`, with `floor`, seen touching `touched`: what it cannot
    /// give up and what it touched beyond the kernel's image and page structures, taken
    /// as the share it touches of what it needs (it needs more than it touches each
    /// sample), up to its need and the page cache it uses; never less than all it touched
    /// and what it cannot give up beyond that image and those page structures, nor than
    /// its floor.
    ///
    /// The image and page structures (`kernel_seen_touched`) are in the touched memory:
    /// counted beside it too, they were counted twice (found on real guests: the coldmem
    /// guest, 40 of its 58 MiB of kernel memory reserved at boot, was held at 216 MiB,
    /// 1.9 × its working set). The floor's margin for what the guest runs is not counted
    /// beside the touched memory either: that is what it runs, and the share the room for
    /// what it runs less often (found on real guests: the same guest, 114 MiB of working
    /// set, was held at 162 MiB by three margins stacked: the floor's 32 MiB, the share's
    /// 25% of the kernel's image and the 3% margin). What its lists name (slab,
    /// anonymous memory swap cannot take) is counted beside the touched memory, though
    /// the host may have seen part of it touched: a guest without swap touching its page
    /// cache looks the same as one touching its anonymous memory, and only the first
    /// would thrash if probed (found in review: not counting it, a swapless guest with
    /// 290 MiB of cold anonymous memory and 300 MiB of cache it rereads would have been
    /// probed 220 MiB into that cache). The page cache it uses counts with its need, as
    /// far as the host saw more touched than that need (found on real guests: the
    /// pagecache guest, rereading 150 MiB of files, 85 MiB needed, was probed 8 MiB into
    /// that cache and faulted 7 MiB back in two ticks); cache on the active list the host
    /// does not see touched does not (review). Without the guest's lists, its whole floor
    /// is counted beside the touched memory.
    fn new(
        cfg: &FusedConfig,
        obs: &Observation,
        need: Bytes,
        floor: Bytes,
        touched: Bytes,
    ) -> Self {
        let s = &obs.signals;
        // Without the lists the guest's figures give its unreclaimable memory as what they
        // name alone (`Signals::unreclaimable_listed`).
        let (kept, seen) = match (s.unreclaimable, s.unreclaimable_listed) {
            (Some(all), Some(listed)) if listed < all => {
                (all, kernel_seen_touched(obs.size).min(all - listed))
            }
            _ => (floor, Bytes::ZERO),
        };
        let unseen = kept - seen;
        let least = touched + unseen;
        let share = |b: Bytes| Bytes::from_f64(b.as_f64() / cfg.touched_share);
        let cache = s.active_file.unwrap_or_default().min(share(least - need));
        let bound = least
            .max((kept + share(touched - seen)).min(need + cache))
            .max(floor);
        TouchedBound {
            bound,
            touched,
            kept,
            seen,
            unseen,
            cache,
        }
    }
}

/// With free page reporting, the size a guest may keep while memory is ample: all of it
/// but what the host saw cold, as far as it is page cache or free memory the host does
/// not back.
/// What it has freed is back on the host already, in huge-page blocks (the guest
/// reports free blocks of 2 MiB and the hypervisor discards them), so the balloon would free
/// nothing more by taking it, and would cost the guest: its 4 KiB pages split the host's
/// huge pages, and the guest waits for a deflate when it allocates again (seen on real
/// guests: memknobs guests given their 200 MiB phase back by the balloon ran at a tenth of
/// their speed for 5-8 s after it, at full CPU, with no fault on either side). Its page
/// cache, inactive too, is what no management leaves it, read again when its files are
/// (found in the simulator with reporting: taken while memory was ample, it was read back
/// from disk, and memtide ran at 0.995 of no management's throughput on the host with no
/// overcommit and 0.997 on cloud-mix; kept, 1.000 and 0.999). The policy lets it keep
/// this only out of memory no VM wants, so the cache goes first when memory tightens.
/// Free memory the host still backs (a guest whose driver does not report, or free pages
/// in blocks smaller than it reports) is taken as without reporting, once the guest has had
/// `report_wait_s` to report it (`unreported`: what it freed that long ago or less, and its
/// host does not show given back yet). Its free memory is not read
/// from its balloon statistics, which lag its agent's figures by a tick (seen on real
/// guests: a guest that had just freed 170 MiB showed none of it free there, and was
/// ballooned to its need). `None` without reporting, the agent's page cache figure or
/// the host's resident figure.
fn reported_kept(cfg: &FusedConfig, obs: &Observation, unreported: Bytes) -> Option<Bytes> {
    if !obs.free_page_reporting {
        return None;
    }
    let unbacked = obs.size - obs.backed? + unreported;
    let cold = cold_need(cfg, obs).unwrap_or_default();
    let cache = obs.signals.inactive_file?;
    Some((obs.size - cold).min(costless(cfg, obs)? + unbacked + cache))
}

/// What of the guest's own need its host's access tracking saw untouched for the cold age:
/// the cold memory beyond all its page cache and free memory (which the tracker counts
/// too, and the other rules take or keep), no more than what writing its anonymous memory
/// to its free swap frees (hugetlb pages, shared memory and the like cannot go; on zram,
/// each page's compressed copy stays).
/// The guest gives it up at the cost of writing it out once. Cold page cache is left to
/// the other rules: read again after longer than the cold age, it would come from disk
/// (found in the simulator: web caches whose files came back every 15 min lost 2.5% of
/// their throughput); so is free memory the host does not back (taking it frees nothing
/// on the host, and memknobs guests lost the room they grew into). `None` without
/// tracking, without `take_cold`, or without every figure this needs from the guest's
/// agent (a guest whose cache and free memory are unknown would count them as its need:
/// found in review, a guest needing 300 MiB taken to 60).
fn cold_need(cfg: &FusedConfig, obs: &Observation) -> Option<Bytes> {
    if !cfg.take_cold {
        return None;
    }
    let s = &obs.signals;
    s.committed_as?;
    let cache = s.active_file? + s.inactive_file?;
    let free = obs.size - s.used?;
    s.swap_frees((obs.cold? - cache - free).min(s.anon?))
}

/// What the guest has committed less what of it is in its swap: the memory it has
/// allocated and keeps in RAM, touched or not yet. Its programs touch what they allocate
/// at their own pace, so what they have not touched yet shows as free (MemAvailable) for a
/// while; taking it makes them swap as they fill it (found in the simulator: on a host
/// 70% free, the balloons of two databases filling their 2.5 GiB buffer pools at 512 MiB/s
/// followed their growth down, 190k swap-ins where no management had none). What is in
/// swap is left out: giving it room would hand the guest memory it does not touch (found
/// in the simulator: a guest whose idle memory probing had pushed to swap got it all back
/// as free memory when the host's need turned ample, and its neighbours swapped).
fn committed_in_memory(obs: &Observation) -> Bytes {
    let s = &obs.signals;
    s.committed_as.map_or(Bytes::ZERO, |c| {
        (c - s.swap_used.unwrap_or_default()).min(obs.configured)
    })
}

impl Fused {
    /// What to keep across a restart, at `at`; none before the first estimate.
    pub fn memory(&self, at: Duration) -> Option<FusedMemory> {
        Some(FusedMemory {
            estimate: self.estimate?,
            base: self.base,
            backoffs: self.backoffs,
            hold_s: self.hold_until.saturating_sub(at).as_secs_f64(),
            exact: self.exact,
            sampling: !self.touched.is_empty(),
            freed_peak: self.freed_most(at).unwrap_or_default(),
            freed_peak_s: self
                .freed_until
                .map_or(0.0, |until| until.saturating_sub(at).as_secs_f64()),
        })
    }

    /// The estimator of a guest found again after a restart, at `at`, from what
    /// [`Fused::memory`] kept: its estimate, probing state and what is left of its
    /// cool-down (what it learnt from the guest's last ticks is learnt again; samples of
    /// what it touches are awaited as if one had come at `at`, since the new daemon's
    /// sampler gives none at its first tick).
    pub fn recall(m: &FusedMemory, at: Duration) -> Fused {
        Fused {
            sampled_at: m.sampling.then_some(at),
            estimate: Some(m.estimate),
            first_seen: Some(at),
            base: m.base,
            freed_from: Some((m.base, None, Bytes::ZERO)),
            hold_until: at + secs(m.hold_s),
            hold_for: "what was learnt before a restart or a reload",
            backoffs: m.backoffs,
            exact: m.exact,
            freed_peaks: {
                let mut peaks = Peak::default();
                peaks.observe(at, Some(m.freed_peak));
                peaks
            },
            freed_until: (m.freed_peak_s > 0.0).then(|| at + secs(m.freed_peak_s)),
            ..Fused::default()
        }
    }

    /// The most of the needs the guest freed memory from over the last [`WINDOW`], until
    /// [`WINDOW`] after it last freed.
    fn freed_most(&self, at: Duration) -> Option<Bytes> {
        self.freed_until
            .filter(|until| at < *until)
            .and_then(|_| self.freed_peaks.most(at))
    }

    /// How long ago the guest last allocated, while it may still be filling that: not
    /// since it freed memory, in that tick or within the cool-down after.
    fn filling(&self, cfg: &FusedConfig, at: Duration) -> Option<Duration> {
        self.allocated_at
            .filter(|a| self.released_at.is_none_or(|r| r < *a))
            .map(|a| at.saturating_sub(a))
            .filter(|ago| ago.is_zero() || *ago < secs(cfg.cool_down_s))
    }

    /// The cool-down after the back-offs so far: doubling with each, up to the longest.
    fn hold_s(&self, cfg: &FusedConfig) -> f64 {
        (cfg.cool_down_s * 2f64.powi(self.backoffs.max(1) as i32 - 1)).min(cfg.max_cool_down_s)
    }

    /// Take in a host-side access sample: what the guest touched in each of the latest
    /// [`FusedConfig::touched_samples`] samples (memory it uses, seen by the host), or in
    /// each of those in while fewer are; none without a sample since sampling began or
    /// last missed one.
    ///
    /// The least of fewer samples is never below the least of more, so a bound from the
    /// first sample is no deeper than the one the full count would give; waiting for them
    /// all only held a guest at its need meanwhile (found on a real guest: coldmem's
    /// 384 MiB guest held at 326 MiB, 211 MiB above its working set, two seconds longer).
    fn touched(&mut self, cfg: &FusedConfig, obs: &Observation) -> Option<Bytes> {
        match obs.referenced {
            Some(r) => {
                self.sampled_at = Some(obs.at);
                self.touched.push_back(r);
                while self.touched.len() > cfg.touched_samples {
                    self.touched.pop_front();
                }
            }
            None => self.touched.clear(),
        }
        self.touched.iter().copied().min()
    }

    /// Before a guest's first estimate, where the usual rules must wait: a guest found
    /// with its balloon already holding memory starts from the size it lives at
    /// (`adopt`), and one first seen while the host does not need memory is left at its
    /// size while it may still be starting (`arrive`). `None`: the usual rules apply.
    fn before_first_estimate(
        &mut self,
        cfg: &FusedConfig,
        obs: &Observation,
        (need, base, floor): (Bytes, Bytes, Bytes),
        level: NeedLevel,
        first_seen: Duration,
    ) -> Option<Estimate> {
        if self.estimate.is_some() {
            return None;
        }
        let s = &obs.signals;
        // A guest whose balloon already holds memory when first seen was managed before (a
        // memtide that restarted, or its operator): it starts from the size it lives at,
        // which probing may have brought below its need and cache, and is held for a
        // cool-down, as after a back-off, before the usual rules move it (its need from
        // scratch would undo what probing found cold, or squeeze it at once).
        if obs.size + Bytes::from_mib(1) < obs.configured {
            let wss = clamp(obs.size.max(base), floor, obs.configured);
            self.estimate = Some(wss);
            (self.base, self.freed_from) = (base, Some((base, s.committed_as, Bytes::ZERO)));
            self.last_size = Some(obs.size);
            self.last_committed = s.committed_as.map(|c| (c, 0));
            // Probing may have found its working set already: slowly, as after a back-off.
            (self.hold_until, self.backoffs) = (obs.at + secs(cfg.cool_down_s), 1);
            self.hold_for = "the guest was found with its balloon holding memory";
            let detail = format!(
                "estimate {wss}: found with its balloon at {}, below its configured {}: start \
                 from there, hold {:.0} s, then probe slowly; it counts {need} needed",
                obs.size, obs.configured, cfg.cool_down_s
            );
            return Some(Estimate {
                wss,
                phase: "adopt",
                detail,
                keep: None,
                allocation: None,
            });
        }
        // A guest first seen while the host does not need memory (ample at costless sizes,
        // and with every VM at its full size) is left at its size for `arrive_s` before its
        // first estimate: it may be booting, its agent answering before its programs
        // allocate (found on real guests in the density benchmark: a guest ballooned to
        // its 83 MiB boot-time need two seconds before its workload committed 192 MiB
        // thrashed for 40 s).
        let free_at_full = obs.need.map_or(0.0, |n| n.free_at_full);
        if level == NeedLevel::Ample
            && free_at_full >= cfg.ample_free
            && obs.at < first_seen + secs(cfg.arrive_s)
        {
            let wss = clamp(obs.size, floor, obs.configured);
            let detail = format!(
                "estimate {wss}: first seen {:.0} s ago, left at its size while it may still be starting; it counts {need} needed",
                (obs.at - first_seen).as_secs_f64()
            );
            return Some(Estimate {
                wss,
                phase: "arrive",
                detail,
                keep: None,
                allocation: None,
            });
        }
        None
    }

    /// What free page reporting lets a guest estimated at `wss` keep while memory is
    /// ample, on top of its estimate, as far as memory is not divided (the policy
    /// decides). What it freed lately counts as reported until its host shows it given
    /// back or the guest has had its time to report it (found on real guests: a guest that
    /// freed 168 MiB was ballooned to its need at the next tick, before its driver
    /// reported the memory, so the balloon took what reporting would have given back at no
    /// cost to the guest); never more than the free memory its host still backs, and not
    /// once it needs memory again (the caller forgets what it freed then).
    fn reported_keep(
        &self,
        cfg: &FusedConfig,
        obs: &Observation,
        level: NeedLevel,
        wss: Bytes,
    ) -> Option<Bytes> {
        let unreported = self
            .freed_at
            .filter(|(at, ..)| obs.at < *at + secs(cfg.report_wait_s))
            .zip(obs.backed.zip(obs.signals.used))
            .map_or(Bytes::ZERO, |((_, then, freed), (backed, used))| {
                let given_back = then.map_or(Bytes::ZERO, |then| then - backed);
                (freed - given_back).min(backed - used)
            });
        reported_kept(cfg, obs, unreported)
            .filter(|_| level == NeedLevel::Ample)
            .map(|k| k.min(obs.configured))
            .filter(|k| *k > wss)
    }

    /// What a guest that freed memory within [`WINDOW`] may keep while memory is ample, on
    /// top of its estimate `wss`, as far as memory is not divided (the policy decides):
    /// the most of the needs it freed from over the last [`WINDOW`], less what of it the
    /// host saw cold (and given back to it where a tighter spell took it since). A
    /// program that freed memory may allocate it again, and touch it
    /// within the tick, faster than any balloon deflates: taken back, the guest swaps it
    /// in, or is OOM-killed where its swap cannot hold it (found by an operator audit and
    /// reproduced in the simulator: a 384 MiB guest alternating a 240 MiB and a 60 MiB
    /// phase every minute on an idle 16 GiB host ran at 0.92 of no management's
    /// throughput, with 151 303 swap-ins and an OOM kill, where every baseline left it
    /// alone). Where memory is ample, nobody wants what taking it would free; after
    /// [`WINDOW`] without freeing more, the guest is taken to have stopped needing it.
    /// Not kept by raising the estimate: held at its peak, memknobs guests sharing a
    /// crowded host divided it by their peaks and churned (40 000 balloon actions,
    /// 2.2 million swap-ins, where keeping it out of memory no VM wants ran 250 and
    /// 94 000).
    fn freed_keep(
        &self,
        obs: &Observation,
        level: NeedLevel,
        cold: Option<Bytes>,
        wss: Bytes,
    ) -> Option<Keep> {
        let peak = self
            .freed_most(obs.at)
            .filter(|_| level == NeedLevel::Ample)?;
        let until = self.freed_until?;
        let size = (peak - cold.unwrap_or_default()).min(obs.configured);
        (size > wss).then(|| Keep {
            size,
            why: KeepWhy::Freed {
                ago: (obs.at + WINDOW).saturating_sub(until),
            },
        })
    }

    /// Advance one tick. Needs MemAvailable (guest agent or balloon statistics) or, at
    /// least, the guest's free memory.
    pub fn step(&mut self, cfg: &FusedConfig, obs: &Observation) -> Option<Estimate> {
        let s = &obs.signals;
        let (need, margin, floor) = need(cfg, obs)?;
        let base = need + margin;
        let hot = self.touched(cfg, obs);
        let level = obs.need.map_or(NeedLevel::Short, |n| n.level);
        let interval = self.interval.bounded(s.interval);
        let step = |share: f64| {
            obs.configured
                .scale(share * epochs(interval, secs(cfg.epoch_s)))
        };
        let first_seen = *self.first_seen.get_or_insert(obs.at);
        if let Some(first) =
            self.before_first_estimate(cfg, obs, (need, base, floor), level, first_seen)
        {
            return Some(first);
        }
        // The first estimate also keeps the page cache the guest used more than once
        // lately: MemAvailable counts it free, and dropping it at once is a refault
        // storm (seen on real guests: a 150 MiB cache working set squeezed to 94 MiB
        // took 9 back-offs to return). Probing finds what of it is not needed.
        let active_file = s.active_file.filter(|_| self.estimate.is_none());
        let mut estimate = self
            .estimate
            .unwrap_or(base + active_file.unwrap_or_default());
        let shrank = self.last_size.is_some_and(|last| obs.size < last);
        let inflating = shrank || self.shrank;
        (self.last_size, self.shrank) = (Some(obs.size), shrank);
        let rebase = self.estimate.is_none()
            || base.as_f64() > self.base.as_f64() * (1.0 + cfg.rebase_change);
        // The guest's own need fell as much while no balloon of ours squeezed it below
        // that need (there, a guest's need follows its size down): it freed memory — as much as
        // its commitment fell too, where it reports one (a program restarting frees its
        // buffer and allocates it again within the tick, then fills it over the next
        // seconds: found in the simulator, memknobs guests lost their memory at every
        // restart and swapped it back).
        // Measured from the need's highest since the balloon last squeezed the guest or
        // the estimate last followed it, not from the last tick: a guest freeing a little
        // each tick frees as much (found in the simulator: a CI builder whose compilers
        // rose and fell kept its balloon at their peak, 1.5 GiB above its working set at
        // the trough).
        // What it swapped out this tick, less what it swapped in (balloon statistics):
        // its need falls and rises by as much. Counted since the need's highest, and never
        // more than its fall since then (review: swapped out and back in, then freed in
        // earnest, nothing was taken back).
        let moved = |rate: Option<f64>| {
            rate.zip(s.interval).map_or(Bytes::ZERO, |(rate, d)| {
                Bytes::from_f64(rate * d.as_secs_f64())
            })
        };
        let (out, back) = (moved(s.swap_out_per_s), moved(s.swap_in_per_s));
        let (from, from_committed, swapped) = match self.freed_from {
            Some((b, c, _)) if base >= b => (base, c.max(s.committed_as), Bytes::ZERO),
            Some((b, c, swapped)) => (
                b,
                c.max(s.committed_as),
                ((swapped + out) - back).min(b - base),
            ),
            None => (base, s.committed_as, Bytes::ZERO),
        };
        // What it gave up of its commitment bounds what it freed; without Committed_AS
        // (no agent), what it swapped out is not freed: its need fell as the balloon
        // pushed its memory to swap (found on a real guest without an agent: ballooned
        // 384 -> 128 MiB in "releases" of what it had just swapped out, at 95% of the host
        // free).
        let uncommitted = match (s.committed_as, from_committed) {
            (Some(now), Some(last)) => last - now,
            _ => (from - base) - swapped,
        };
        // Squeezed: the balloon took the guest below its need's highest, which its need
        // then follows down. A balloon shrinking a guest that stays above it (memory
        // divided among VMs short of it, say) explains no fall of its need (found on real
        // guests: a guest whose phase ended while the division shrank it from 384 to
        // 304 MiB kept its 384 MiB estimate, its need down to 112, and the guest entering
        // its phase beside it was given too little and swapped).
        let squeezed = inflating && obs.size < from;
        let freed = (self.estimate.is_some()
            && !squeezed
            && base.as_f64() < from.as_f64() * (1.0 - cfg.rebase_change))
            .then(|| (from - base).min(uncommitted))
            .filter(|f| *f > Bytes::ZERO);
        self.freed_from = Some((from, from_committed, swapped));
        let last_base = std::mem::replace(&mut self.base, base);
        let faults = s.faults();
        // Allocation stalls and memory pressure while the balloon inflates (this tick or
        // the last: the guest's counters may lag its size by a tick) are its own reclaim,
        // the price of taking memory back; swap-ins and refaults say whether that memory
        // was needed (seen on real guests: every probe below a cold buffer stalled a few
        // times and pushed PSI above 1%).
        let noise = step(if inflating {
            cfg.inflation_fault_noise
        } else {
            cfg.fault_noise
        });
        let faults = if Bytes(faults.saturating_mul(PAGE)) > noise {
            faults
        } else {
            0
        };
        let faulted = Bytes(faults.saturating_mul(PAGE));
        // The guest allocated more than a probe step since the last tick: new demand,
        // which no probe of ours explains.
        // A tick or two without the figure (the agent late) keeps the last one: the jump
        // they missed still shows at the next (found on real guests: a sample lost at the
        // tick a guest committed 168 MiB more hid the allocation, and the guest was raised
        // by five back-offs over 5 s, swapping 5 000-8 000 pages a second). After longer
        // without it, growth over the silence is no jump.
        let last = self
            .last_committed
            .filter(|(_, missed)| *missed <= COMMITTED_KEPT_TICKS)
            .map(|(c, _)| c);
        let (committed, probe) = (s.committed_as.zip(last), step(cfg.probe_step));
        let allocation = committed
            .map(|(now, last)| now - last)
            .filter(|grown| *grown > probe);
        let allocated = allocation.is_some();
        if let Some(grown) = allocation {
            // One made while it still fills the last adds to it (review: a second,
            // smaller one replaced the first's size, and the guest kept only its room).
            self.allocated = match self.filling(cfg, obs.at) {
                Some(_) => self.allocated + grown,
                None => grown,
            };
            self.allocated_at = Some(obs.at);
        }
        // Committing less by as much ends the filling of what it allocated before, as a
        // release does (review: a guest mapping a probe step's worth every few seconds and
        // unmapping it untouched was otherwise filling all the time).
        if committed.is_some_and(|(now, last)| last - now > probe) {
            self.released_at = Some(obs.at);
        }
        // Memory of its need the host saw untouched for the cold age goes at any level of
        // the host's need, but not below what the guest has committed while it may still
        // be filling it (since it was first seen or last allocated).
        let cold = cold_need(cfg, obs);
        let filling =
            cold.is_none() || obs.at < self.allocated_at.unwrap_or(first_seen) + secs(cfg.fill_s);
        let committed_kept = if filling {
            committed_in_memory(obs) + margin
        } else {
            Bytes::ZERO
        };
        // Where cold memory is taken, no estimate leaves the guest more committed than its
        // RAM and half its swap hold: a burst within a tick is met from free swap until the
        // balloon deflates (found in the simulator: batch VMs whose idle memory had gone to
        // swap, their next phase's memory taken back when it ended, were OOM-killed when
        // it came again, 250 in fleet-1000; bounds by Committed_AS beyond free swap, or by
        // half the swap free at the time of the take, did not help).
        let swap_floor = s
            .committed_as
            .zip(s.swap_free.zip(s.swap_used))
            .filter(|_| cold.is_some())
            .map_or(Bytes::ZERO, |(c, (free, used))| {
                c - (free + used).scale(0.5) + margin
            });
        let cold_target = cold.map(|cold| {
            let kept = costless(cfg, obs).unwrap_or(base);
            (cold, kept.max(committed_kept).max(swap_floor))
        });
        self.last_committed = match (s.committed_as, self.last_committed) {
            (Some(c), _) => Some((c, 0)),
            (None, kept) => kept.map(|(c, missed)| (c, missed.saturating_add(1))),
        };
        // Reclaim is the balloon's own only while the guest asks for nothing new.
        let balloon_reclaim = inflating && !allocated;
        let stalls = s.alloc_stalls.filter(|_| !balloon_reclaim).unwrap_or(0);
        let kills = s.oom_kills.unwrap_or(0);
        let pressure = s.psi_some_stalled.filter(|_| !balloon_reclaim);
        let short = faults > 0
            || stalls > 0
            || kills > 0
            || pressure.is_some_and(|p| p > cfg.psi_threshold);
        // After a back-off, fewer pages faulted back each tick is the guest bringing back
        // what the failed probe evicted, not a new shortage (seen on real guests: 63 MiB,
        // then 23 MiB faulted back raised the estimate twice, 30 MiB above the level the
        // guest had been fine at; in the simulator a database touching its cold pages
        // now and then took a minute to fault them back, and every other tick of it
        // raised the estimate, to the guest's full size).
        // A new allocation is new demand, not recovery (found on real guests: a guest
        // entering a 200 MiB phase right after a back-off was held as recovering for a
        // tick while it thrashed).
        let recovering =
            kills == 0 && !allocated && self.last_backoff_faults.is_some_and(|last| faults < last);
        let mut hold_s = 0;
        // Where a release stopped short to leave room for allocating it again.
        let mut refilled = None;
        let touched_bound = hot.map(|h| TouchedBound::new(cfg, obs, need, floor, h));
        let touched_need = touched_bound.map(|t| t.bound);
        // Fast until the first back-off since the last rebase (TWS's FAST), then slowly;
        // only slowly while the host's need is merely tight.
        let fast = self.backoffs == 0 && level == NeedLevel::Short;
        let probe = step(if fast {
            cfg.probe_fast_step
        } else {
            cfg.probe_step
        });
        // How far a probe goes: a step; probing fast where the host's samples bound it,
        // half the way down to that bound, at least a step and never past it (found on
        // real guests: a guest holding 200 MiB it never touched again came down 19 MiB a
        // second for 9 s to the least the samples allowed).
        let probed = match touched_need.filter(|_| fast) {
            Some(lowest) => {
                let room = estimate - (lowest + margin);
                room.scale(0.5).max(probe).min(room)
            }
            None => probe,
        };
        let phase = if short && recovering {
            "recover"
        } else if short {
            // A shortage right after a probe, with no new allocation: the working set
            // lies between this level and the one before the probe (its faults may lag
            // a tick: two steps up).
            let after_probe = self.last_probe.filter(|_| !allocated);
            let raise = faulted
                .min(step(cfg.backoff_max))
                .min(after_probe.map_or(Bytes(u64::MAX), |p| p + p));
            estimate = estimate.max(obs.size) + raise + step(cfg.backoff_step);
            // A shortage that comes with a new allocation, or heavy faulting (more than
            // a probe step's worth this tick) that no shrinking of ours caused, means the
            // guest sits well below what it needs: jump to what it has committed. After
            // a probe alone, the working set lies just above the probe (seen on real
            // guests: a guest probed 10 MiB below its working set thrashed 66 MiB back in
            // a second; the jump to Committed_AS gave back the 200 MiB of cold memory the
            // probes had found).
            let heavy = faulted > step(cfg.probe_step);
            let swap_low = s
                .swap_free
                .is_some_and(|free| free < obs.configured.scale(cfg.low_swap));
            if allocated || (heavy && (!inflating || swap_low)) {
                if let Some(committed) = s.committed_as {
                    estimate = estimate.max(committed + margin);
                }
            }
            // What it committed more comes on top of what it needed before: Committed_AS
            // leaves out the kernel's own memory (found on real guests: a guest entering a
            // 200 MiB phase was raised to its Committed_AS and margin, 237 MiB, against the
            // 280 it needed, and faulted 34 000 pages back over the three back-offs after).
            if let Some(grown) = allocation {
                estimate = estimate.max(last_base + grown);
            }
            // An OOM kill is the shortage a guest does not recover from: the killed task's
            // memory is gone from every figure, so nothing tells what it needed. Give the
            // guest all it has and probe again from there (found in the simulator: a
            // guest whose phase grew past its size within a tick was killed on every
            // restart while bounded back-offs raised it 80 MiB at a time).
            if kills > 0 {
                estimate = estimate.max(obs.configured);
            }
            // The working set lies above the probed level: when the last level that was
            // fine was not below what the guest has committed, none of that was cold.
            if let Some(p) = after_probe {
                // Told by a step's probe only: a longer one failed anywhere along its way.
                self.exact = s.committed_as.is_some_and(|c| obs.size + p.min(probe) >= c);
                self.failed_at = Some(obs.size);
            }
            // A back-off that interrupts probing doubles the next hold (the probe failed
            // again at this level); one during a hold restarts the same hold.
            if obs.at >= self.hold_until {
                self.backoffs = self.backoffs.saturating_add(1);
            }
            let hold = self.hold_s(cfg);
            self.hold_until = obs.at + secs(hold);
            self.hold_for = "a back-off";
            hold_s = hold.round() as u64;
            "back_off"
        } else if rebase || allocated {
            // New demand is met before the guest touches it: what it committed more, at
            // once (as TWS re-initializes to Committed_AS on every change), held from
            // probing for a cool-down while it fills it (found on real guests: a guest
            // entering a 200 MiB phase was raised step by step as it swapped, for 15 s).
            if let Some(grown) = allocation {
                estimate += grown;
                let until = obs.at + secs(cfg.cool_down_s);
                if until > self.hold_until {
                    (self.hold_until, self.hold_for) = (until, "new demand");
                }
            }
            if rebase {
                estimate = estimate.max(base);
                // Fast again, as TWS restarts on every change of Committed_AS, unless the
                // last failed probe found no cold memory below the guest's commitment: hold
                // for the cool-down it has earned and probe slowly (found in the simulator:
                // memknobs guests touching all they allocate failed a fast probe after every
                // growth, swapping 40 times as much as under MOM).
                if self.exact {
                    let hold = self.hold_s(cfg);
                    let until = obs.at + secs(hold);
                    if until > self.hold_until {
                        (self.hold_until, self.hold_for) =
                            (until, "its need grew where a probe had failed");
                    }
                } else {
                    self.backoffs = 0;
                }
            }
            // A new need: what failed before says nothing of it.
            self.failed_at = None;
            if allocated {
                "allocate"
            } else if self.estimate.is_none() {
                "start"
            } else {
                // Told apart from the first estimate: after a restart a recalled
                // estimator goes on, and its first rule says so.
                "rebase"
            }
        } else if let Some(freed) = freed {
            // What the guest freed is free: take it back at once, down to what it still
            // counts as needed (or stay, where probing found less was enough), instead of
            // probing down to it a step at a time (found on real guests: a 384 MiB guest
            // that freed 170 MiB gave it back at 4 MiB a tick while its neighbours swapped).
            // Not so far that allocating it again would overflow the guest's RAM and half
            // its swap, as far as that is free (its other half for what it swaps beside,
            // as where cold memory is taken; probing may go deeper later, as for any
            // guest): a program may touch what it allocates within the tick, before the
            // balloon deflates (found in the simulator: a guest alternating a 240 MiB and a
            // 60 MiB phase, released to its 60 MiB need, was OOM-killed when its 240 MiB
            // phase came back 400 s later; bounded, it swapped for a tick).
            let refill = s
                .swap_free
                .zip(s.swap_used)
                .map_or(Bytes::ZERO, |(free, used)| {
                    from - free.min((free + used).scale(0.5))
                });
            let (released, bound) = (
                (estimate - freed).max(estimate.min(base)),
                estimate.min(refill),
            );
            refilled = (released < bound).then_some(bound);
            estimate = released.max(bound);
            self.failed_at = None;
            self.freed_at = Some((obs.at, obs.backed, freed));
            self.released_at = Some(obs.at);
            self.freed_peaks.observe(obs.at, Some(from));
            self.freed_until = Some(obs.at + WINDOW);
            "release"
        } else if obs.at < self.hold_until {
            "hold"
        } else if obs.size > estimate.max(obs.min) + probe {
            // A probe is tried by the guest living at that level: no deeper while the
            // balloon has not brought it there (found in the simulator: a 4 GiB guest
            // whose balloon took 7 ticks to inflate was probed down to its floor and
            // thrashed when it arrived).
            "settle"
        } else if estimate < obs.min {
            // Its operator's min holds the guest above the estimate: a deeper probe would
            // move no balloon (found in an audit: a guest at its 128 MiB min was said to
            // be held "until the guest comes down to" an estimate of 105 MiB, which it
            // never would).
            "at_min"
        } else if let Some((_, kept)) =
            cold_target.filter(|(cold, kept)| *cold > probe && estimate > *kept + probe)
        {
            // The host saw the rest untouched for its tracker's cold age: it goes at once
            // and at no cost but writing it out (found in the simulator: idle VMs that had
            // touched 1.5 GiB once kept it at every level of need, the host's need ample).
            estimate = kept;
            "cold"
        } else if level == NeedLevel::Ample {
            // The host has ample memory without probing: what probing would find is not
            // worth the guest's swap-ins and refaults.
            "ample"
        } else if s.agent_failed {
            // No probing blind (seen on real guests: the agent of a guest thrashing
            // below its working set stopped answering, its balloon statistics showed no
            // swap-ins, and the next probe went 9 MiB deeper).
            "no_agent"
        } else if self
            .failed_at
            .is_some_and(|failed| estimate - probe < failed + probe)
        {
            // A probe failed within a step below the next level, and the guest's need has
            // not changed since: the level that failed was reached by a step from one that
            // was fine, so probing closer to it would only fail again (seen on real guests:
            // a busy guest probed down to the same level after each hold, 254 MiB faulted
            // back each time, five times in four minutes; and, in the density benchmark, a
            // busy guest that failed at 271 MiB was probed to 272 MiB, then to 274 MiB
            // whenever the host's need fell from ample to tight, and ran at 0.8 of its solo
            // throughput there).
            "probed"
        } else if hot.is_none()
            && cfg.touched_samples > 0
            && self.sampled_at.is_some_and(|at| {
                // The time its samples span: sampling missed for longer has stopped.
                let span = s
                    .interval
                    .unwrap_or(secs(cfg.epoch_s))
                    .checked_mul(u32::try_from(cfg.touched_samples).unwrap_or(u32::MAX))
                    .unwrap_or(Duration::MAX);
                obs.at.saturating_sub(at) < span
            })
        {
            // Host-side access sampling gives figures but has no sample in (it has just
            // begun, or missed one): no probe before it can tell what the guest touches
            // (without this, a guest first seen while the host is short is probed before
            // its first sample).
            "sampling"
        } else if touched_need.is_some_and(|lowest| {
            estimate - probed < lowest + margin || probed < step(cfg.probe_step)
        }) {
            // The host saw the guest touch this much in each of its latest samples, beside
            // which it needs what it cannot give up beyond what the host sees touched and
            // what it touches less often than a sample (`TouchedBound`): probing below that
            // would only evict what the guest uses (seen on real guests: each probe into a
            // busy guest's hot set cost it a second or two of thrashing, 0.66 of its solo
            // throughput over the coldmem benchmark; in the density benchmark a busy guest
            // touching 230 MiB every 2 s, 277 MiB needed, probed to 271 MiB, faulted 186 MiB
            // back and ran at 0.7-0.8 of its solo throughput for the rest of the run, its
            // memory long given back). What it touched counts for the share it is taken to
            // touch of what it needs: it needs more than it touches each sample (seen on
            // real guests: on a host whose guest RAM was not in huge pages, the same busy
            // guest probed to 271 MiB, below touched + floor + margin, and ran at 0.76 of
            // its solo throughput for 20 s).
            "touched"
        } else {
            // Fine below what it has committed: there is cold memory to find.
            if s.committed_as.is_some_and(|c| obs.size < c) {
                self.exact = false;
            }
            estimate = estimate - probed;
            "probe"
        };
        // With ample memory the guest keeps all but what costs it nothing: earlier
        // probing (when the host was short) is undone at once.
        if level == NeedLevel::Ample {
            estimate = estimate
                .max(costless(cfg, obs).unwrap_or(base))
                .max(committed_kept);
        }
        if squeezed || matches!(phase, "start" | "rebase" | "allocate" | "release") {
            self.freed_from = Some((base, s.committed_as, Bytes::ZERO));
        }
        self.last_probe = (phase == "probe").then_some(probed);
        self.last_backoff_faults = matches!(phase, "back_off" | "recover").then_some(faults);
        let wss = clamp(estimate.max(swap_floor), floor, obs.configured);
        self.estimate = Some(wss);
        if allocated || rebase || short {
            self.freed_at = None;
        }
        let keep = self
            .reported_keep(cfg, obs, level, wss)
            .map(|size| Keep {
                size,
                why: KeepWhy::Reported,
            })
            .into_iter()
            .chain(self.freed_keep(obs, level, cold, wss))
            .max_by_key(|k| k.size);
        let told = Told {
            wss,
            need,
            floor,
            faults,
            stalls,
            kills,
            hold_s,
            hold_for: self.hold_for,
            hold_left_s: self.hold_until.saturating_sub(obs.at).as_secs_f64(),
            cache: active_file,
            size: obs.size,
            failed_at: self.failed_at,
            touched_bound,
            samples: self.touched.len(),
            cold,
            allocation,
            freed,
            refilled,
            min: obs.min,
        };
        let detail = told.detail(phase, cfg);
        let allocation = self.filling(cfg, obs.at).map(|ago| Allocation {
            ago,
            grown: self.allocated,
        });
        Some(Estimate {
            wss,
            phase,
            detail,
            keep,
            allocation,
        })
    }
}

/// What a tick's reason tells beside its phase: the figures its rule went by.
struct Told {
    wss: Bytes,
    need: Bytes,
    floor: Bytes,
    faults: u64,
    stalls: u64,
    kills: u64,
    hold_s: u64,
    /// What a hold is for, and how long it lasts yet.
    hold_for: &'static str,
    hold_left_s: f64,
    /// The page cache in use kept by a first estimate.
    cache: Option<Bytes>,
    size: Bytes,
    failed_at: Option<Bytes>,
    touched_bound: Option<TouchedBound>,
    /// Host-side access samples in.
    samples: usize,
    cold: Option<Bytes>,
    allocation: Option<Bytes>,
    freed: Option<Bytes>,
    /// How far a release went where it stopped short of the guest's need.
    refilled: Option<Bytes>,
    /// The VM's min.
    min: Bytes,
}

impl Told {
    /// The reason's text for `phase`: one format per tick and VM, as reasons are made for
    /// every VM every tick.
    fn detail(&self, phase: &str, cfg: &FusedConfig) -> String {
        let Told {
            wss,
            need,
            floor,
            faults,
            stalls,
            kills,
            hold_s,
            ..
        } = *self;
        match phase {
            "back_off" => format!(
                "estimate {wss}: short of memory ({faults} pages faulted back, {stalls} stalls, \
                 {kills} OOM kills): back off, hold {hold_s} s; the guest counts {need} needed, floor {floor}"
            ),
            "start" => match self.cache {
                Some(cache) => format!(
                    "estimate {wss}: the guest counts {need} needed and {cache} of page cache in use: start there; floor {floor}"
                ),
                None => format!("estimate {wss}: the guest counts {need} needed: start there; floor {floor}"),
            },
            "rebase" => format!(
                "estimate {wss}: the guest's need grew to {need}: go up to it; floor {floor}"
            ),
            "hold" => format!(
                "estimate {wss}: holding for a cool-down after {}, {:.0} s more",
                self.hold_for, self.hold_left_s
            ),
            "settle" => format!(
                "estimate {wss}: holding until the guest comes down to {} (now {})",
                wss.max(self.min),
                self.size
            ),
            "at_min" => format!(
                "estimate {wss}: holding: the VM's min, {}, keeps the guest above it; no probe \
                 goes below what the balloon may take",
                self.min
            ),
            "no_agent" => format!("estimate {wss}: holding: the guest agent did not answer"),
            "probed" => format!(
                "estimate {wss}: holding: a probe failed at {} and the guest's need has not changed since",
                self.failed_at.unwrap_or_default()
            ),
            "touched" => {
                let t = self.touched_bound.unwrap_or_default();
                format!(
                    "estimate {wss}: holding: the host saw {} of guest memory touched in {}: \
                     no probe below {} and the margin (the more of \
                     what it touched with {} it cannot give up beside it, and the {} it \
                     cannot give up with what it touched beyond {} of kernel image and page \
                     structures taken as {} of what it needs beyond them, up to its need \
                     {need} and {} of page cache it uses; never below its floor {floor}), nor \
                     by less than a step",
                    t.touched,
                    last_samples(self.samples),
                    t.bound,
                    t.unseen,
                    t.kept,
                    t.seen,
                    cfg.touched_share,
                    t.cache
                )
            }
            "sampling" => format!(
                "estimate {wss}: holding: host-side access sampling has no sample in (it has \
                 just begun or missed one); no probe before one tells what the guest touches"
            ),
            "cold" => format!(
                "estimate {wss}: the host saw {} of what the guest counts needed ({need}) \
                 untouched for the cold age: let it go",
                self.cold.unwrap_or_default()
            ),
            "ample" => format!(
                "estimate {wss}: no probing, memory is ample: only what costs the guest nothing (free memory it has not committed, page cache it does not use); it counts {need} needed"
            ),
            "allocate" => format!(
                "estimate {wss}: the guest committed {} more: give it at once; it counts {need} needed",
                self.allocation.unwrap_or_default()
            ),
            "release" => format!(
                "estimate {wss}: the guest freed {}: take it back{}; it counts {need} needed",
                self.freed.unwrap_or_default(),
                self.refilled.map_or(String::new(), |r| format!(
                    ", no lower than {r}, where allocating it again fits in its RAM and half its swap"
                ))
            ),
            "recover" => format!(
                "estimate {wss}: holding: {faults} pages faulted back, fewer than at the back-off (the guest recovers)"
            ),
            _ => match self.touched_bound {
                Some(t) => format!(
                    "estimate {wss}: no shortage: probe lower, no deeper than {} and the \
                     margin (floor {floor}; the guest counts {need} needed and touched at least \
                     {} in {}, beside {} it cannot give up)",
                    t.bound,
                    t.touched,
                    last_samples(self.samples),
                    t.unseen
                ),
                None => format!("estimate {wss}: no shortage: probe lower (floor {floor})"),
            },
        }
    }
}

/// "the last host-side access sample", or "each of the last N" of them.
fn last_samples(n: usize) -> String {
    match n {
        1 => "the last host-side access sample".to_owned(),
        n => format!("each of the last {n} host-side access samples"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signals::Signals;

    /// A 1000 MiB guest at `size` with `avail` MemAvailable and `faults` this tick.
    fn obs(t: u64, size: u64, avail: u64, faults: u64) -> Observation {
        Observation {
            need: None,
            at: Duration::from_secs(t),
            size: Bytes::from_mib(size),
            configured: Bytes::from_mib(1000),
            min: Bytes::ZERO,
            referenced: None,
            cold: None,
            free_page_reporting: false,
            backed: None,
            signals: Signals {
                available: Some(Bytes::from_mib(avail)),
                unreclaimable: Some(Bytes::from_mib(40)),
                swap_ins: Some(faults),
                refaults: Some(0),
                interval: Some(Duration::from_secs(1)),
                ..Signals::default()
            },
        }
    }

    /// The constants, with no delay before a guest's first estimate (see
    /// `a_guest_first_seen_with_memory_ample_is_left_at_its_size_for_a_while`).
    fn cfg() -> FusedConfig {
        FusedConfig {
            arrive_s: 0.0,
            ..FusedConfig::default()
        }
    }

    /// `o` with `mib` of Committed_AS.
    fn committed(mut o: Observation, mib: u64) -> Observation {
        o.signals.committed_as = Some(Bytes::from_mib(mib));
        o
    }

    fn mib(e: Option<Estimate>) -> f64 {
        e.unwrap().wss.mib_f64()
    }

    #[test]
    fn starts_at_the_guests_own_need_then_probes_down_fast_then_slowly() {
        let (cfg, mut f) = (cfg(), Fused::default());
        // need 1000 - 700 = 300, margin 30: 330 at once, then 50 MiB (5%) per tick.
        assert_eq!(mib(f.step(&cfg, &obs(0, 1000, 700, 0))), 330.0);
        assert_eq!(mib(f.step(&cfg, &obs(1, 330, 30, 0))), 280.0);
        assert_eq!(mib(f.step(&cfg, &obs(2, 280, 0, 0))), 230.0);
        // Faults: back off (230 + 4 + 20), hold 8 s, then 10 MiB (1%) per tick, but not
        // within a step of the 230 MiB that failed.
        assert_eq!(mib(f.step(&cfg, &obs(3, 230, 0, 1024))), 254.0);
        assert_eq!(mib(f.step(&cfg, &obs(12, 254, 0, 0))), 244.0);
        let held = f.step(&cfg, &obs(13, 244, 0, 0)).unwrap();
        assert_eq!((held.wss.mib_f64(), held.phase), (244.0, "probed"));
    }

    #[test]
    fn a_guest_its_min_holds_above_the_estimate_is_not_said_to_be_settling() {
        let cfg = cfg();
        let run = |min| {
            let mut f = Fused::default();
            let o = |t, size, avail| Observation {
                min: Bytes::from_mib(min),
                ..obs(t, size, avail, 0)
            };
            f.step(&cfg, &o(0, 1000, 700));
            assert_eq!(mib(f.step(&cfg, &o(1, 330, 30))), 280.0);
            // Probed to 280, the balloon leaves it at 300.
            f.step(&cfg, &o(2, 300, 0)).unwrap()
        };
        let e = run(300);
        assert_eq!((e.wss.mib_f64(), e.phase), (280.0, "at_min"));
        assert!(
            e.detail
                .contains("the VM's min, 300 MiB, keeps the guest above it"),
            "{}",
            e.detail
        );
        // Without that min, within a step of the estimate: probing goes on.
        assert_eq!(run(0).phase, "probe");
    }

    #[test]
    fn a_probe_after_missed_samples_takes_two_ticks_worth_not_the_gap() {
        let (cfg, mut f) = (cfg(), Fused::default());
        assert_eq!(mib(f.step(&cfg, &obs(0, 1000, 700, 0))), 330.0);
        assert_eq!(mib(f.step(&cfg, &obs(1, 330, 30, 0))), 280.0);
        // Ten seconds without a sample: 10 × 50 MiB would take it to its floor at once.
        let mut back = obs(11, 280, 0, 0);
        back.signals.interval = Some(Duration::from_secs(10));
        assert_eq!(mib(f.step(&cfg, &back)), 180.0);
        // The next tick is a tick again.
        assert_eq!(mib(f.step(&cfg, &obs(12, 180, 0, 0))), 130.0);
    }

    /// `o` seen with the host's need at `level`.
    fn at(mut o: Observation, level: NeedLevel) -> Observation {
        o.need = Some(crate::need::Need {
            level,
            free_share: 0.0,
            free_at_full: if level == NeedLevel::Ample { 0.5 } else { 0.0 },
        });
        o
    }

    #[test]
    fn probing_scales_with_the_hosts_need() {
        let cfg = cfg();
        // Ample: nothing probed below the costless size (need 300 + margin 30).
        let mut f = Fused::default();
        f.step(&cfg, &at(obs(0, 1000, 700, 0), NeedLevel::Ample));
        let e = f
            .step(&cfg, &at(obs(1, 330, 30, 0), NeedLevel::Ample))
            .unwrap();
        assert_eq!((e.wss.mib_f64(), e.phase), (330.0, "ample"));
        // Tight: slowly (1%) even before the first back-off; short: fast (5%).
        let e = f
            .step(&cfg, &at(obs(2, 330, 30, 0), NeedLevel::Tight))
            .unwrap();
        assert_eq!((e.wss.mib_f64(), e.phase), (320.0, "probe"));
        let e = f
            .step(&cfg, &at(obs(3, 320, 20, 0), NeedLevel::Short))
            .unwrap();
        assert_eq!(e.wss.mib_f64(), 270.0);
        // Ample again: no deeper, and a margin more than the squeezed guest now counts
        // as needed (its need follows its size down), every tick until it has room.
        let e = f
            .step(&cfg, &at(obs(4, 270, 0, 0), NeedLevel::Ample))
            .unwrap();
        assert_eq!((e.wss.mib_f64(), e.phase), (300.0, "ample"));
    }

    #[test]
    fn at_ample_a_guest_keeps_what_it_committed_and_has_not_touched_yet() {
        // A database filling a 600 MiB buffer: committed at once, touched over the
        // following ticks, so the guest counts 300 then 450 MiB needed. While memory is
        // ample its balloon does not follow that growth down (seen in the simulator:
        // 190k swap-ins on a host 70% free): the committed 600 + margin 30 are kept.
        let cfg = cfg();
        let mut f = Fused::default();
        let filling = |t, size, avail| at(committed(obs(t, size, avail, 0), 600), NeedLevel::Ample);
        let e = f.step(&cfg, &filling(0, 1000, 700)).unwrap();
        assert_eq!((e.wss.mib_f64(), e.phase), (630.0, "start"));
        let e = f.step(&cfg, &filling(1, 630, 180)).unwrap();
        assert_eq!(e.wss.mib_f64(), 630.0, "{}", e.detail);
        // When the host is short, probing is judged by faults as before: from the need
        // (300 + 30), not from the commitment.
        let mut g = Fused::default();
        let o = at(committed(obs(0, 1000, 700, 0), 600), NeedLevel::Short);
        assert_eq!(mib(g.step(&cfg, &o)), 330.0);
    }

    /// [`cfg`] taking cold memory.
    fn cold_cfg() -> FusedConfig {
        FusedConfig {
            take_cold: true,
            ..cfg()
        }
    }

    /// `o` with host-side tracking: `cold` MiB of guest memory untouched for the cold age;
    /// and the agent's figures it needs: no free memory, no page cache, all it holds
    /// anonymous, 1000 MiB of free swap unless `o` says.
    fn tracked(mut o: Observation, cold: u64) -> Observation {
        o.cold = Some(Bytes::from_mib(cold));
        let s = &mut o.signals;
        (s.used, s.anon) = (Some(o.size), Some(o.size));
        (s.active_file, s.inactive_file) = (Some(Bytes::ZERO), Some(Bytes::ZERO));
        s.swap_free.get_or_insert(Bytes::from_mib(1000));
        o
    }

    #[test]
    fn memory_the_host_saw_untouched_for_the_cold_age_goes_even_when_memory_is_ample() {
        // An idle guest that once filled 600 MiB (committed 700, it counts 800 needed):
        // without tracking it keeps its need and margin while memory is ample.
        let cfg = cold_cfg();
        let ample = |t, size, avail| at(committed(obs(t, size, avail, 0), 700), NeedLevel::Ample);
        let start = ample(0, 1000, 200);
        let mut f = Fused::default();
        assert_eq!(mib(f.step(&cfg, &start)), 830.0);
        // With 500 MiB untouched for the cold age (none of it free memory or page cache),
        // what lies above its commitment (700 + margin) goes while it may still be
        // filling that.
        let e = f.step(&cfg, &tracked(ample(10, 830, 30), 500)).unwrap();
        assert_eq!((e.wss.mib_f64(), e.phase), (730.0, "cold"), "{}", e.detail);
        // Once first seen `fill_s` ago with no allocation since, it keeps its need less
        // the cold memory, and the margin.
        let e = f.step(&cfg, &tracked(ample(121, 730, 0), 430)).unwrap();
        assert_eq!((e.wss.mib_f64(), e.phase), (330.0, "cold"), "{}", e.detail);
        // There, with 30 MiB cold, it stays.
        let e = f.step(&cfg, &tracked(ample(122, 330, 0), 30)).unwrap();
        assert_eq!((e.wss.mib_f64(), e.phase), (330.0, "ample"), "{}", e.detail);
        // Cold memory that is free memory or page cache is not its need's: left to the
        // other rules.
        let mut free = tracked(ample(123, 330, 0), 300);
        free.signals.used = Some(Bytes::from_mib(130));
        free.signals.inactive_file = Some(Bytes::from_mib(100));
        assert_eq!(cold_need(&cfg, &free), Some(Bytes::ZERO));
        // Nor is anything taken where a figure it needs is missing (no agent: cache and
        // free memory unknown), nor beyond its anonymous memory or its free swap.
        let mut blind = tracked(ample(123, 830, 30), 500);
        blind.signals.inactive_file = None;
        assert_eq!(cold_need(&cfg, &blind), None);
        let mut locked = tracked(ample(123, 830, 30), 500);
        locked.signals.anon = Some(Bytes::from_mib(200));
        assert_eq!(cold_need(&cfg, &locked), Some(Bytes::from_mib(200)));
        locked.signals.swap_free = Some(Bytes::from_mib(50));
        assert_eq!(cold_need(&cfg, &locked), Some(Bytes::from_mib(50)));
        // The same guest without tracking keeps its need: nothing is taken blind; nor
        // with tracking where `take_cold` is off (the default).
        let mut g = Fused::default();
        g.step(&cfg, &start);
        assert_eq!(mib(g.step(&cfg, &ample(121, 830, 30))), 830.0);
        let mut h = Fused::default();
        h.step(&super::tests::cfg(), &start);
        let e = h.step(&super::tests::cfg(), &tracked(ample(121, 830, 30), 500));
        assert_eq!(mib(e), 830.0);
    }

    #[test]
    fn an_allocation_is_being_filled_for_the_cool_down_after_it_unless_memory_is_freed() {
        let (cfg, mut f) = (cfg(), Fused::default());
        let mut step = |t, avail, committed_mib| {
            let e = f.step(&cfg, &committed(obs(t, 1000, avail, 0), committed_mib));
            let e = e.unwrap();
            (e.phase, e.allocation.map(|a| a.ago.as_secs()))
        };
        assert_eq!(step(0, 600, 400).1, None);
        assert_eq!(step(1, 600, 400).1, None);
        // 300 MiB more committed: filling it for the cool-down (8 s), whatever the phase.
        assert_eq!(step(2, 600, 700), ("allocate", Some(0)));
        assert_eq!(step(5, 400, 700).1, Some(3));
        assert_eq!(step(10, 300, 700).1, None, "the cool-down over");
        // Again, then freed within the cool-down: no longer filling.
        assert_eq!(step(11, 300, 1000), ("allocate", Some(0)));
        assert_eq!(step(12, 800, 300).0, "release");
        assert_eq!(step(13, 800, 300).1, None);
        // Or committing less by more than a probe step, though nothing shows freed.
        assert_eq!(step(14, 800, 600), ("allocate", Some(0)));
        assert_eq!(step(15, 800, 300).1, None);
    }

    #[test]
    fn allocations_made_while_it_fills_add_up_and_a_fall_within_a_probe_step_ends_nothing() {
        let (cfg, mut f) = (cfg(), Fused::default());
        let mut step = |t, committed_mib| {
            let e = f.step(&cfg, &committed(obs(t, 1000, 300, 0), committed_mib));
            e.unwrap()
                .allocation
                .map(|a| (a.ago.as_secs(), a.grown.mib()))
        };
        step(0, 400);
        step(1, 400);
        assert_eq!(step(2, 1000), Some((0, 600)));
        // 20 MiB more (over a probe step, 10 MiB) a second later: filling both.
        assert_eq!(step(3, 1020), Some((0, 620)));
        // 5 MiB less is no release.
        assert_eq!(step(4, 1015), Some((1, 620)));
        // After the cool-down, an allocation counts alone.
        assert_eq!(step(12, 1015), None);
        assert_eq!(step(13, 1100), Some((0, 85)));
    }

    /// `o` with `free` MiB of swap free of `total`.
    fn swap(mut o: Observation, free: u64, total: u64) -> Observation {
        o.signals.swap_free = Some(Bytes::from_mib(free));
        o.signals.swap_used = Some(Bytes::from_mib(total - free));
        o
    }

    #[test]
    fn a_release_leaves_room_to_allocate_it_again_in_the_guests_ram_and_half_its_swap() {
        let cfg = cfg();
        // Needing 700 MiB (730 with its margin), then 200: it freed 500.
        // Its swap: (free, total) MiB.
        let run = |swap_mib: Option<(u64, u64)>| {
            let mut f = Fused::default();
            let o = |t, avail, committed_mib| {
                let o = at(
                    committed(obs(t, 1000, avail, 0), committed_mib),
                    NeedLevel::Short,
                );
                swap_mib.map_or(o.clone(), |(free, total)| swap(o, free, total))
            };
            f.step(&cfg, &o(0, 300, 700));
            f.step(&cfg, &o(1, 800, 200)).unwrap()
        };
        // With 200 MiB of swap, allocating it again must fit in its RAM and 100 MiB of it.
        let e = run(Some((200, 200)));
        assert_eq!((e.wss.mib_f64(), e.phase), (630.0, "release"));
        assert!(
            e.detail.contains("no lower than 630 MiB, where allocating it again fits in its RAM and half its swap"),
            "{}",
            e.detail
        );
        // With 1 GiB of it, to its need: it fits its swap's half.
        let e = run(Some((1024, 1024)));
        assert_eq!((e.wss.mib_f64(), e.phase), (230.0, "release"));
        assert!(!e.detail.contains("no lower"), "{}", e.detail);
        // But not with 974 MiB of it used: 50 free.
        assert_eq!(run(Some((50, 1024))).wss.mib_f64(), 680.0);
        // Without swap, nothing: what it freed would come back as an OOM kill.
        assert_eq!(run(Some((0, 0))).wss.mib_f64(), 730.0);
        // Its swap unknown (no agent figures of it): to its need, as before.
        assert_eq!(run(None).wss.mib_f64(), 230.0);
    }

    #[test]
    fn what_a_guest_freed_it_keeps_while_memory_is_ample_for_the_window_after_it_last_frees() {
        let cfg = cfg();
        let mut f = Fused::default();
        let mut step = |t: u64, avail, committed_mib, level| {
            let o = at(committed(obs(t, 1000, avail, 0), committed_mib), level);
            let e = f.step(&cfg, &swap(o, 1024, 1024)).unwrap();
            (e.wss.mib_f64(), e.keep.map(|k| (k.size.mib_f64(), k.why)))
        };
        let freed = |mib, ago| {
            Some((
                mib,
                KeepWhy::Freed {
                    ago: Duration::from_secs(ago),
                },
            ))
        };
        // Needing 700 MiB, then 200: released to 230, it keeps the 730 it freed from.
        assert_eq!(step(0, 300, 700, NeedLevel::Ample), (730.0, None));
        assert_eq!(
            step(1, 800, 200, NeedLevel::Ample),
            (230.0, freed(730.0, 0))
        );
        // Not while the host's need is tight.
        assert_eq!(step(100, 800, 200, NeedLevel::Tight).1, None);
        assert_eq!(step(200, 800, 200, NeedLevel::Ample).1, freed(730.0, 199));
        // Allocating 100 MiB again raises its estimate, not what it may keep; freeing it
        // again, the larger need is kept for the window after its own release, the
        // smaller one for the window after the last.
        assert_eq!(
            step(250, 700, 300, NeedLevel::Ample),
            (330.0, freed(730.0, 249))
        );
        assert_eq!(
            step(251, 800, 200, NeedLevel::Ample),
            (230.0, freed(730.0, 0))
        );
        assert_eq!(step(301, 800, 200, NeedLevel::Ample).1, freed(730.0, 50));
        assert_eq!(step(302, 800, 200, NeedLevel::Ample).1, freed(330.0, 51));
        assert_eq!(step(550, 800, 200, NeedLevel::Ample).1, freed(330.0, 299));
        // The window past with nothing freed since: it keeps its estimate.
        assert_eq!(step(551, 800, 200, NeedLevel::Ample), (230.0, None));
    }

    #[test]
    fn what_a_guest_may_keep_of_what_it_freed_is_kept_across_a_restart() {
        let cfg = cfg();
        let mut f = Fused::default();
        let o = |t, avail, committed_mib| {
            let o = at(
                committed(obs(t, 1000, avail, 0), committed_mib),
                NeedLevel::Ample,
            );
            swap(o, 1024, 1024)
        };
        f.step(&cfg, &o(0, 300, 700));
        f.step(&cfg, &o(1, 800, 200));
        let m = f.memory(Duration::from_secs(101)).unwrap();
        assert_eq!((m.freed_peak.mib_f64(), m.freed_peak_s), (730.0, 200.0));
        let text = serde_json::to_string(&m).unwrap();
        let read: FusedMemory = serde_json::from_str(&text).unwrap();
        // Recalled at another clock (a new daemon's): 100 s after it freed, 200 s left.
        let mut g = Fused::recall(&read, Duration::from_secs(5));
        let mut late = o(6, 800, 200);
        late.size = Bytes::from_mib(230);
        let e = g.step(&cfg, &late).unwrap();
        assert_eq!(
            e.keep.map(|k| (k.size.mib_f64(), k.why)),
            Some((
                730.0,
                KeepWhy::Freed {
                    ago: Duration::from_secs(101)
                }
            ))
        );
        // A file written before the fields existed keeps nothing.
        let old = r#"{"estimate":300,"base":300,"backoffs":0,"hold_s":0.0,"exact":false}"#;
        let read: FusedMemory = serde_json::from_str(old).unwrap();
        let mut h = Fused::recall(&read, Duration::ZERO);
        assert_eq!(h.step(&cfg, &o(1, 700, 300)).unwrap().keep, None);
    }

    #[test]
    fn a_guest_that_allocated_within_fill_s_keeps_its_commitment_though_memory_looks_cold() {
        let cfg = cold_cfg();
        let mut f = Fused::default();
        let o = |t, size, avail, committed_mib| {
            at(
                committed(obs(t, size, avail, 0), committed_mib),
                NeedLevel::Ample,
            )
        };
        assert_eq!(mib(f.step(&cfg, &o(0, 1000, 600, 400))), 430.0);
        // 120 MiB of its need found cold: it keeps the rest and the margin.
        let e = f.step(&cfg, &tracked(o(130, 430, 30, 400), 120)).unwrap();
        assert_eq!((e.wss.mib_f64(), e.phase), (310.0, "cold"), "{}", e.detail);
        // It allocates 300 MiB more and fills it slowly: what it committed and the margin
        // stay for `fill_s`, though the host sees most of it untouched; then it goes.
        let e = f.step(&cfg, &tracked(o(200, 310, 0, 700), 30)).unwrap();
        assert_eq!(
            (e.wss.mib_f64(), e.phase),
            (730.0, "allocate"),
            "{}",
            e.detail
        );
        let filling = tracked(o(260, 730, 200, 700), 400);
        let e = f.step(&cfg, &filling).unwrap();
        assert_eq!(
            (e.wss.mib_f64(), e.phase),
            (730.0, "rebase"),
            "{}",
            e.detail
        );
        let mut later = filling;
        later.at = Duration::from_secs(321);
        let e = f.step(&cfg, &later).unwrap();
        assert_eq!((e.wss.mib_f64(), e.phase), (160.0, "cold"), "{}", e.detail);
    }

    #[test]
    fn where_cold_memory_is_taken_the_guest_keeps_half_its_swap_for_bursts() {
        // 900 MiB committed, 512 MiB of swap: no estimate leaves it more committed than
        // its RAM and half its swap hold (900 − 256 + margin 30 = 674), though 600 MiB of
        // its need is cold; without `take_cold` the bound does not apply (nor is anything
        // cold taken: it keeps what it committed, 900, and the margin).
        let ample = |t| {
            let mut o = at(committed(obs(t, 830, 30, 0), 900), NeedLevel::Ample);
            o.signals.swap_free = Some(Bytes::from_mib(512));
            o.signals.swap_used = Some(Bytes::ZERO);
            tracked(o, 600)
        };
        let mut f = Fused::default();
        f.step(&cold_cfg(), &ample(0));
        let e = f.step(&cold_cfg(), &ample(121)).unwrap();
        assert_eq!((e.wss.mib_f64(), e.phase), (674.0, "cold"), "{}", e.detail);
        let mut g = Fused::default();
        g.step(&cfg(), &ample(0));
        assert_eq!(mib(g.step(&cfg(), &ample(121))), 930.0);
    }

    #[test]
    fn at_ample_what_the_guest_keeps_in_swap_is_not_given_room() {
        // 600 MiB committed, 300 of it in swap (pushed there by probing while the host
        // was short): the guest keeps its need 300 + margin 30, not 630 of which half
        // would be free memory it does not touch (seen in the simulator: a guest given
        // its swapped idle memory back as free memory while its neighbours swapped).
        let cfg = cfg();
        let mut f = Fused::default();
        let mut o = at(committed(obs(0, 1000, 700, 0), 600), NeedLevel::Ample);
        o.signals.swap_used = Some(Bytes::from_mib(300));
        let e = f.step(&cfg, &o).unwrap();
        assert_eq!(e.wss.mib_f64(), 330.0, "{}", e.detail);
    }

    #[test]
    fn a_guest_first_seen_with_memory_ample_is_left_at_its_size_for_a_while() {
        // Booting: it counts 100 MiB needed when its agent first answers; 6 s later its
        // workload has committed 500. Nothing is taken before `arrive_s` (8 s) is over,
        // and the first estimate then starts from what it has committed (500 + 30).
        let cfg = FusedConfig::default();
        let mut f = Fused::default();
        let ample = |o| at(o, NeedLevel::Ample);
        for t in [0, 2, 6] {
            let committed_mib = if t < 6 { 100 } else { 500 };
            let e = f
                .step(&cfg, &ample(committed(obs(t, 1000, 900, 0), committed_mib)))
                .unwrap();
            assert_eq!((e.wss.mib_f64(), e.phase), (1000.0, "arrive"), "t = {t}");
        }
        let e = f
            .step(&cfg, &ample(committed(obs(8, 1000, 600, 0), 500)))
            .unwrap();
        assert_eq!((e.wss.mib_f64(), e.phase), (530.0, "start"));
        // When the host is short, or has little free as the VMs stand (ample only at
        // their costless sizes), the first estimate comes at once (found in the
        // simulator: 96 guests left at their full 2 GiB on a 96 GiB host, 38 killed).
        let mut g = Fused::default();
        let o = at(committed(obs(0, 1000, 900, 0), 100), NeedLevel::Short);
        assert_eq!(mib(g.step(&cfg, &o)), 130.0);
        let mut h = Fused::default();
        let mut o = ample(committed(obs(0, 1000, 900, 0), 100));
        o.need = o.need.map(|n| crate::need::Need {
            free_at_full: 0.02,
            ..n
        });
        assert_eq!(mib(h.step(&cfg, &o)), 130.0);
    }

    #[test]
    fn a_guest_found_ballooned_starts_from_its_size_not_its_need() {
        // memtide restarted: a 1000 MiB guest probed down to 600 MiB, where it counts 300
        // needed and uses 250 MiB of cache. Afresh it would start at need + cache + margin
        // (580, and more when the host is ample); adopted it stays at 600 for the
        // cool-down, then probes down from there.
        let cfg = cfg();
        for level in [NeedLevel::Short, NeedLevel::Tight, NeedLevel::Ample] {
            let mut f = Fused::default();
            let found = |t| {
                let mut o = at(committed(obs(t, 600, 300, 0), 400), level);
                o.signals.active_file = Some(Bytes::from_mib(250));
                o
            };
            let e = f.step(&cfg, &found(0)).unwrap();
            assert_eq!((e.wss.mib_f64(), e.phase), (600.0, "adopt"), "{level:?}");
            assert!(
                e.detail.contains("found with its balloon at 600 MiB"),
                "{}",
                e.detail
            );
            let e = f.step(&cfg, &found(2)).unwrap();
            assert_eq!(e.phase, "hold", "{level:?}");
            assert!(e.wss.mib_f64() <= 600.0, "{level:?}: {}", e.wss);
        }
        // Short after the cool-down: probe from 600, slowly (a step of 1%, not 5%).
        let mut f = Fused::default();
        let short = |t| at(committed(obs(t, 600, 300, 0), 400), NeedLevel::Short);
        f.step(&cfg, &short(0)).unwrap();
        let e = f.step(&cfg, &short(8)).unwrap();
        assert_eq!((e.wss.mib_f64(), e.phase), (590.0, "probe"));
        // Its need above its size (MemAvailable below the margin): raised to it at once.
        let mut g = Fused::default();
        let e = g
            .step(&cfg, &at(obs(0, 600, 10, 0), NeedLevel::Short))
            .unwrap();
        assert_eq!((e.wss.mib_f64(), e.phase), (620.0, "adopt"));
        // Found at its configured size: the usual start, at its need and margin.
        let mut h = Fused::default();
        let full = at(committed(obs(0, 1000, 700, 0), 400), NeedLevel::Short);
        assert_eq!(h.step(&cfg, &full).unwrap().phase, "start");
    }

    #[test]
    fn a_recalled_estimator_goes_on_where_the_last_one_stood() {
        // Probed to 560 MiB, then backed off: 3 s of an 8 s cool-down done.
        let cfg = cfg();
        let mut f = Fused::default();
        let short = |o| at(o, NeedLevel::Short);
        f.step(&cfg, &short(committed(obs(0, 1000, 700, 0), 400)));
        for t in 1..6 {
            f.step(&cfg, &short(committed(obs(t, 330, 30, 0), 400)));
        }
        let e = f
            .step(&cfg, &short(committed(obs(6, 300, 0, 2560), 400)))
            .unwrap();
        assert_eq!(e.phase, "back_off");
        let m = f.memory(Duration::from_secs(9)).unwrap();
        assert_eq!((m.estimate, m.backoffs, m.hold_s), (e.wss, 1, 5.0));
        // A new daemon, its clock at 0: the hold goes on for what was left of it.
        let mut g = Fused::recall(&m, Duration::ZERO);
        let held = g
            .step(&cfg, &short(committed(obs(2, 330, 30, 0), 400)))
            .unwrap();
        assert_eq!((held.phase, held.wss), ("hold", e.wss));
        let probe = g
            .step(&cfg, &short(committed(obs(5, 330, 30, 0), 400)))
            .unwrap();
        assert_eq!(probe.phase, "probe");
        assert!(probe.wss < e.wss, "slowly below the level that failed");
        assert_eq!(
            e.wss - probe.wss,
            Bytes::from_mib(10),
            "at 1% a tick: after a back-off"
        );
        // Its need grown by more than 10% by the time the new daemon first sees it: the
        // recalled estimate goes up to it, and says so; `start` is for a first estimate
        // only (found by the restart test on a real guest, whose first rule after a kill
        // read as a fresh start).
        let mut h = Fused::recall(&m, Duration::ZERO);
        let grown = h
            .step(&cfg, &short(committed(obs(1, 400, 0, 0), 400)))
            .unwrap();
        assert_eq!(grown.phase, "rebase", "{}", grown.detail);
        assert_eq!(grown.wss, Bytes::from_mib(400 + 30));
    }

    #[test]
    fn the_costless_size_keeps_the_page_cache_in_use_and_drops_the_rest() {
        let mut o = obs(0, 1000, 700, 0);
        o.signals.active_file = Some(Bytes::from_mib(150));
        // need 300 + active cache 150 + margin 30.
        let c = costless(&FusedConfig::default(), &o).unwrap();
        assert_eq!(c.mib_f64(), 480.0);
    }

    #[test]
    fn a_program_restarting_within_a_tick_has_not_freed_its_memory() {
        // memknobs restarts: its buffer is freed and committed again within the tick, and
        // MemAvailable shows the untouched part free. Committed_AS did not fall: no release.
        let cfg = cfg();
        // need 700: 730, held there (ample) until the balloon has settled; then the need
        // falls to 500, with Committed_AS falling as much (freed) or not (restarted).
        let last = |committed_mib: u64| {
            let mut f = Fused::default();
            for (t, size, avail) in [(0, 1000, 300), (1, 730, 30), (2, 730, 30)] {
                let o = committed(obs(t, size, avail, 0), 700);
                f.step(&cfg, &at(o, NeedLevel::Ample));
            }
            let o = committed(obs(3, 730, 230, 0), committed_mib);
            f.step(&cfg, &at(o, NeedLevel::Short)).unwrap()
        };
        let freed = last(500);
        assert_eq!((freed.wss.mib_f64(), freed.phase), (530.0, "release"));
        let restarted = last(700);
        assert_ne!(restarted.phase, "release", "{}", restarted.detail);
    }

    #[test]
    fn a_guest_shrunk_above_its_need_that_frees_memory_has_it_taken_back() {
        // Needing 600 MiB, then freeing 300 while memory divided among VMs shrinks it
        // 1000 → 900 → 800 MiB, above the 630 it needed with its margin: released. Shrunk
        // to 500 instead, below that need, the fall is the balloon's doing: not released.
        let cfg = cfg();
        let last = |size: u64| {
            let mut f = Fused::default();
            f.step(&cfg, &committed(obs(0, 1000, 400, 0), 600));
            f.step(&cfg, &committed(obs(1, 900, 300, 0), 600));
            f.step(&cfg, &committed(obs(2, size, size - 300, 0), 300))
                .unwrap()
        };
        let freed = last(800);
        assert_eq!(
            (freed.phase, freed.wss.mib()),
            ("release", 330),
            "{}",
            freed.detail
        );
        let squeezed = last(500);
        assert_ne!(squeezed.phase, "release", "{}", squeezed.detail);
    }

    #[test]
    fn an_allocation_that_meets_a_shortage_comes_on_top_of_what_the_guest_needed() {
        // Needing 300 MiB of which it has committed 200 (the rest is its kernel's), the
        // guest commits 300 more and stalls: it needs 600, and its margin. Committed_AS
        // and the margin, 530, would be 100 short.
        let (cfg, mut f) = (cfg(), Fused::default());
        f.step(
            &cfg,
            &at(committed(obs(0, 1000, 700, 0), 200), NeedLevel::Ample),
        );
        f.step(
            &cfg,
            &at(committed(obs(1, 330, 30, 0), 200), NeedLevel::Ample),
        );
        let e = f
            .step(&cfg, &committed(obs(2, 330, 30, 25_600), 500))
            .unwrap();
        assert_eq!((e.phase, e.wss.mib()), ("back_off", 630), "{}", e.detail);
        // The next tick it faults less, as a guest recovering would, but commits more:
        // new demand, not recovery.
        let e = f
            .step(&cfg, &committed(obs(3, 630, 30, 1000), 600))
            .unwrap();
        assert_eq!(e.phase, "back_off", "{}", e.detail);
        assert!(e.wss.mib() > 630, "{}", e.detail);
    }

    #[test]
    fn the_first_estimate_keeps_the_active_page_cache() {
        let (cfg, mut f) = (cfg(), Fused::default());
        let with_cache = |mut o: Observation| {
            o.signals.active_file = Some(Bytes::from_mib(150));
            o
        };
        // need 1000 - 700 = 300, active cache 150, margin 30.
        let e = f.step(&cfg, &with_cache(obs(0, 1000, 700, 0))).unwrap();
        assert_eq!((e.wss.mib_f64(), e.phase), (480.0, "start"));
        assert!(e.detail.contains("150 MiB of page cache"), "{}", e.detail);
        // Later the cache no longer counts: probing finds what of it is needed.
        assert_eq!(mib(f.step(&cfg, &with_cache(obs(1, 480, 180, 0)))), 430.0);
    }

    #[test]
    fn a_new_allocation_during_probing_jumps_to_committed_memory() {
        let (cfg, mut f) = (cfg(), Fused::default());
        f.step(&cfg, &committed(obs(0, 1000, 700, 0), 300));
        f.step(&cfg, &committed(obs(1, 330, 30, 0), 300)); // probe: 280
                                                           // 100 MiB faulted back while 200 MiB more was committed: Committed_AS 500 + 30.
        let e = f
            .step(&cfg, &committed(obs(2, 280, 0, 25_600), 500))
            .unwrap();
        assert_eq!((e.wss.mib_f64(), e.phase), (530.0, "back_off"));
        // Stalls alone while inflating, when the guest allocates, are a shortage too.
        let mut g = Fused::default();
        g.step(&cfg, &committed(obs(0, 1000, 700, 0), 300));
        g.step(&cfg, &committed(obs(1, 330, 30, 0), 300));
        let mut o = committed(obs(2, 280, 0, 0), 500);
        o.signals.alloc_stalls = Some(3);
        let e = g.step(&cfg, &o).unwrap();
        assert_eq!((e.wss.mib_f64(), e.phase), (530.0, "back_off"));
    }

    #[test]
    fn a_guest_with_its_swap_nearly_full_faulting_after_a_probe_gets_its_committed_memory() {
        let (cfg, mut f) = (cfg(), Fused::default());
        let with = |mut o: Observation, swap_free: u64| {
            o.signals.committed_as = Some(Bytes::from_mib(500));
            o.signals.swap_free = Some(Bytes::from_mib(swap_free));
            o
        };
        f.step(&cfg, &with(obs(0, 1000, 700, 0), 100));
        f.step(&cfg, &with(obs(1, 330, 30, 0), 100)); // probe: 280
                                                      // 100 MiB faulted back, 100 MiB of swap free (< 20%): Committed_AS 500 + 30.
        let e = f.step(&cfg, &with(obs(2, 280, 0, 25_600), 100)).unwrap();
        assert_eq!(e.wss.mib_f64(), 530.0);
        // With room in swap, the same shortage is a failed probe: 280 + 100 + 20.
        let mut g = Fused::default();
        g.step(&cfg, &with(obs(0, 1000, 700, 0), 600));
        g.step(&cfg, &with(obs(1, 330, 30, 0), 600));
        let e = g.step(&cfg, &with(obs(2, 280, 0, 25_600), 600)).unwrap();
        assert_eq!(e.wss.mib_f64(), 350.0);
    }

    #[test]
    fn no_probe_while_the_agent_does_not_answer() {
        let (cfg, mut f) = (cfg(), Fused::default());
        f.step(&cfg, &obs(0, 1000, 700, 0));
        let mut o = obs(1, 330, 30, 0);
        o.signals.agent_failed = true;
        let e = f.step(&cfg, &o).unwrap();
        assert_eq!((e.wss.mib_f64(), e.phase), (330.0, "no_agent"));
        // Faults from the balloon statistics still back off.
        let mut o = obs(2, 330, 30, 2560);
        o.signals.agent_failed = true;
        assert_eq!(f.step(&cfg, &o).unwrap().phase, "back_off");
    }

    #[test]
    fn stalls_and_pressure_while_the_balloon_inflates_are_not_a_shortage() {
        let cfg = cfg();
        for pressure in [false, true] {
            let mut f = Fused::default();
            let reclaim = |mut o: Observation| {
                if pressure {
                    o.signals.psi_some_stalled = Some(5.0);
                } else {
                    o.signals.alloc_stalls = Some(5);
                }
                o
            };
            f.step(&cfg, &obs(0, 1000, 700, 0));
            let e = f.step(&cfg, &reclaim(obs(1, 330, 30, 0))).unwrap();
            assert_eq!(e.phase, "probe", "the guest shrank (pressure: {pressure})");
            let e = f.step(&cfg, &reclaim(obs(2, 330, 30, 0))).unwrap();
            assert_eq!(
                e.phase, "probe",
                "it shrank a tick ago (pressure: {pressure})"
            );
            let e = f.step(&cfg, &reclaim(obs(3, 330, 30, 0))).unwrap();
            assert_eq!(e.phase, "back_off", "it did not (pressure: {pressure})");
        }
    }

    #[test]
    fn faults_while_the_balloon_inflates_back_off_above_the_noise_without_a_jump() {
        let cfg = cfg();
        // 0.25% of 1000 MiB (640 pages) is the inflation's own noise.
        let mut f = Fused::default();
        f.step(&cfg, &obs(0, 1000, 700, 0));
        assert_eq!(f.step(&cfg, &obs(1, 330, 30, 600)).unwrap().phase, "probe");
        // Not inflating: the same few pages are a shortage, a handful (0.02%) is not.
        // (Found at 330 MiB, adopted there: no cool-down, to probe at once.)
        let (adopted, mut g) = (
            FusedConfig {
                cool_down_s: 0.0,
                ..cfg.clone()
            },
            Fused::default(),
        );
        assert_eq!(
            g.step(&adopted, &obs(0, 330, 30, 0)).unwrap().phase,
            "adopt"
        );
        assert_eq!(
            g.step(&adopted, &obs(1, 330, 30, 50)).unwrap().phase,
            "probe"
        );
        let e = g.step(&adopted, &obs(2, 330, 30, 600)).unwrap();
        assert_eq!(e.phase, "back_off");
        // Heavy faulting right after a probe: raised by a bounded step (280 + 50 + 20),
        // not to Committed_AS (930).
        let mut h = Fused::default();
        h.step(&cfg, &obs(0, 1000, 700, 0));
        h.step(&cfg, &obs(1, 330, 30, 0));
        let mut o = obs(2, 280, 0, 25_600);
        o.signals.committed_as = Some(Bytes::from_mib(900));
        assert_eq!(mib(h.step(&cfg, &o)), 350.0);
    }

    #[test]
    fn backs_off_in_the_same_tick_and_holds_longer_each_time() {
        let (cfg, mut f) = (cfg(), Fused::default());
        f.step(&cfg, &obs(0, 1000, 700, 0));
        // 2560 pages (10 MiB) faulted back: the estimate (330, above the size 320) + 10 + 20 (2%).
        let e = f.step(&cfg, &obs(1, 320, 20, 2560)).unwrap();
        assert_eq!((e.wss.mib_f64(), e.phase), (360.0, "back_off"));
        assert_eq!(f.step(&cfg, &obs(8, 350, 50, 0)).unwrap().phase, "hold");
        assert_eq!(
            f.step(&cfg, &obs(9, 350, 50, 0)).unwrap().phase,
            "probe",
            "8 s after the first back-off"
        );
        f.step(&cfg, &obs(10, 340, 40, 1024));
        assert_eq!(
            f.step(&cfg, &obs(25, 360, 60, 0)).unwrap().phase,
            "hold",
            "second back-off holds 16 s"
        );
        assert_eq!(f.step(&cfg, &obs(26, 360, 60, 0)).unwrap().phase, "probe");
    }

    #[test]
    fn heavy_faulting_jumps_to_committed_memory() {
        let (cfg, mut f) = (cfg(), Fused::default());
        let mut o = obs(0, 160, 5, 0);
        o.signals.committed_as = Some(Bytes::from_mib(400));
        f.step(&cfg, &o);
        // 40 MiB faulted back in a tick (probe step: 10 MiB): Committed_AS 400 + margin 30.
        let mut o = obs(1, 160, 5, 10240);
        o.signals.committed_as = Some(Bytes::from_mib(400));
        assert_eq!(mib(f.step(&cfg, &o)), 430.0);
        // A trickle of faults only backs off by what came back plus 2%.
        let mut g = Fused::default();
        g.step(&cfg, &obs(0, 1000, 700, 0));
        let mut o = obs(1, 330, 30, 1024);
        o.signals.committed_as = Some(Bytes::from_mib(900));
        assert_eq!(mib(g.step(&cfg, &o)), 354.0);
    }

    #[test]
    fn a_thrashing_guest_is_raised_a_bounded_step_per_tick() {
        let (cfg, mut f) = (cfg(), Fused::default());
        f.step(&cfg, &obs(0, 1000, 700, 0));
        // 1000 MiB faulted back in a tick, no Committed_AS: 330 + 50 (5%) + 20 (2%).
        assert_eq!(mib(f.step(&cfg, &obs(1, 330, 0, 256_000))), 400.0);
        assert_eq!(mib(f.step(&cfg, &obs(2, 400, 0, 256_000))), 470.0);
    }

    #[test]
    fn a_failed_probe_returns_near_the_last_good_level_and_recovery_is_not_a_new_shortage() {
        let (cfg, mut f) = (cfg(), Fused::default());
        f.step(&cfg, &obs(0, 1000, 700, 0)); // 330
        f.step(&cfg, &obs(1, 330, 30, 0)); // fast probe: 280
        f.step(&cfg, &obs(2, 280, 0, 2560)); // back off: 280 + 10 + 20 = 310, hold 8 s
        f.step(&cfg, &obs(11, 310, 10, 0)); // slow probe: 300
                                            // 100 MiB faulted back after a 10 MiB probe: at most two probe steps (300 + 20 + 20).
        let e = f.step(&cfg, &obs(12, 300, 0, 25_600)).unwrap();
        assert_eq!((e.wss.mib_f64(), e.phase), (340.0, "back_off"));
        // Fewer pages the next tick: the guest brings back what the probe evicted.
        let e = f.step(&cfg, &obs(13, 340, 0, 2560)).unwrap();
        assert_eq!((e.wss.mib_f64(), e.phase), (340.0, "recover"));
        // As many again: a shortage still (340 + 10 + 20).
        let e = f.step(&cfg, &obs(14, 340, 0, 2560)).unwrap();
        assert_eq!((e.wss.mib_f64(), e.phase), (370.0, "back_off"));
    }

    #[test]
    fn a_level_where_a_probe_failed_is_not_probed_again_until_the_need_changes() {
        let (cfg, mut f) = (cfg(), Fused::default());
        f.step(&cfg, &obs(0, 1000, 700, 0));
        f.step(&cfg, &obs(1, 330, 30, 0));
        assert_eq!(f.step(&cfg, &obs(2, 330, 30, 0)).unwrap().phase, "probe");
        // Short at the probed level: back off, and hold.
        let back = f.step(&cfg, &obs(3, 320, 20, 2560)).unwrap();
        assert_eq!(back.phase, "back_off");
        // After the hold, probing goes down to the last level above the one that failed.
        let mut phases = Vec::new();
        let mut size = back.wss.mib();
        for t in 12..40 {
            let e = f.step(&cfg, &obs(t, size, 30, 0)).unwrap();
            size = e.wss.mib();
            phases.push(e.phase);
        }
        assert!(phases.contains(&"probe"), "{phases:?}");
        assert_eq!(phases.last(), Some(&"probed"), "{phases:?}");
        assert_eq!(size, 330, "a step above the 320 MiB that failed");
        assert!(f
            .step(&cfg, &obs(40, 330, 30, 0))
            .unwrap()
            .detail
            .contains("failed at 320 MiB"));
        // The guest's need changes (it commits 200 MiB more): probing may go anywhere again.
        f.step(&cfg, &committed(obs(41, 330, 30, 0), 300));
        let grown = f.step(&cfg, &committed(obs(42, 330, 30, 0), 500)).unwrap();
        assert_eq!(grown.phase, "allocate", "{}", grown.detail);
        assert_eq!(f.failed_at, None);
    }

    #[test]
    fn no_probe_comes_within_a_step_of_a_level_that_failed() {
        let (cfg, mut f) = (cfg(), Fused::default());
        f.step(&cfg, &obs(0, 1000, 700, 0));
        f.step(&cfg, &obs(1, 330, 30, 0));
        f.step(&cfg, &obs(2, 330, 30, 0));
        // The balloon stopped short of the probe's 320 MiB: the guest failed at 323 MiB,
        // 6 MiB faulted back: back off to 349 MiB.
        let back = f.step(&cfg, &obs(3, 323, 23, 1536)).unwrap();
        assert_eq!((back.wss.mib(), back.phase), (349, "back_off"));
        let mut size = back.wss.mib();
        for t in 12..40 {
            size = f.step(&cfg, &obs(t, size, 30, 0)).unwrap().wss.mib();
            // 10 MiB steps down from 349 MiB would stop at 329 MiB, 6 MiB above the failure.
            assert!(
                size >= 333,
                "tick {t}: probed to {size} MiB, within a step of 323 MiB"
            );
        }
        // Memory turns ample (the estimate rises to the costless size) and tight again:
        // probing stops at the same place.
        let ample = at(obs(40, size, 30, 0), NeedLevel::Ample);
        size = f.step(&cfg, &ample).unwrap().wss.mib();
        for t in 41..60 {
            let e = f
                .step(&cfg, &at(obs(t, size, 30, 0), NeedLevel::Tight))
                .unwrap();
            size = e.wss.mib();
            assert!(size >= 333, "tick {t}: {}", e.detail);
        }
    }

    #[test]
    fn no_probe_goes_below_what_the_host_saw_touched_in_each_latest_sample() {
        let (cfg, mut f) = (cfg(), Fused::default());
        // 200 MiB touched each tick, 400 once (the guest's swap-out after a probe, read by
        // the hypervisor): the least of the last three counts, 200 ÷ 0.8 + the 72 MiB floor
        // + the 30 MiB margin: 352 MiB.
        let touched = [200, 200, 400, 200, 200, 200, 200, 200, 200, 200];
        let mut size = 1000;
        let mut phases = Vec::new();
        for (t, mib) in touched.into_iter().enumerate() {
            let mut o = obs(t as u64, size, size.saturating_sub(400), 0);
            o.referenced = Some(Bytes::from_mib(mib));
            let e = f.step(&cfg, &o).unwrap();
            size = e.wss.mib();
            phases.push(e.phase);
            assert!(size >= 352, "tick {t}: {}", e.detail);
        }
        assert_eq!(phases.last(), Some(&"touched"), "{phases:?}");
        assert!(size < 402, "probed down to near it: {size} MiB");
        // Without sampling (for longer than its three samples span), probing goes on
        // below it.
        let mut o = obs(13, size, 0, 0);
        o.referenced = None;
        assert_eq!(f.step(&cfg, &o).unwrap().phase, "probe");
    }

    #[test]
    fn probing_fast_goes_half_the_way_down_to_what_the_host_saw_touched() {
        let (cfg, mut f) = (cfg(), Fused::default());
        // A 1000 MiB guest counting all but 10 MiB of its size needed (cold memory it
        // swaps out as the balloon comes), 100 MiB seen touched: no probe below its
        // floor (72 MiB) and 100 ÷ 0.8, 197 MiB, and the 30 MiB margin: 227 MiB.
        let mut size = 1000;
        let mut probes = Vec::new();
        for t in 0..12 {
            let mut o = obs(t, size, 10, 0);
            o.referenced = Some(Bytes::from_mib(100));
            let e = f.step(&cfg, &o).unwrap();
            if e.phase == "probe" {
                probes.push(e.wss.mib());
                assert!(
                    e.detail.contains("no deeper than 197 MiB and the margin"),
                    "{}",
                    e.detail
                );
            }
            size = e.wss.mib();
            assert!(size >= 227, "tick {t}: {}", e.detail);
        }
        // Half the way each tick (a 5% step would take 16 ticks), the last step the
        // rest of the way; a step where half is less: 1000, 613, 420, 323, 273, 227.
        assert_eq!(probes, [613, 420, 323, 273, 227], "{probes:?}");
        let mut o = obs(12, size, 10, 0);
        o.referenced = Some(Bytes::from_mib(100));
        let e = f.step(&cfg, &o).unwrap();
        assert_eq!((e.wss.mib(), e.phase), (227, "touched"), "{}", e.detail);
        // Its samples then allow 5 MiB less, less than a slow step (1%): no probe.
        for t in 13..16 {
            let mut o = obs(t, size, 10, 0);
            o.referenced = Some(Bytes::from_mib(96));
            let e = f.step(&cfg, &o).unwrap();
            assert_eq!((e.wss.mib(), e.phase), (227, "touched"), "{}", e.detail);
        }
        // Probing slowly (the host's need merely tight) goes a step at a time.
        let (mut f, mut size) = (Fused::default(), 1000);
        let mut sizes = Vec::new();
        for t in 0..8 {
            let mut o = at(obs(t, size, 10, 0), NeedLevel::Tight);
            o.referenced = Some(Bytes::from_mib(100));
            size = f.step(&cfg, &o).unwrap().wss.mib();
            sizes.push(size);
        }
        assert_eq!(sizes[1..], [990, 980, 970, 960, 950, 940, 930], "{sizes:?}");
    }

    #[test]
    fn what_the_host_sees_touched_is_counted_once_beside_the_kernels_memory() {
        // A 1000 MiB guest: of its kernel memory off its lists, at most 32 MiB of image and
        // the page structures of what it holds (1/64) are taken as seen touched. The size
        // it settles at (its last tick holding at what it touched) and the bound its
        // reason names.
        let settle = |kernel: u64, listed: Option<u64>, touched: u64| {
            let (cfg, mut f, mut size) = (cfg(), Fused::default(), 1000);
            let mut e = None;
            for t in 0..20 {
                let mut o = obs(t, size, 10, 0);
                o.signals.unreclaimable = Some(Bytes::from_mib(kernel));
                o.signals.unreclaimable_listed = listed.map(Bytes::from_mib);
                o.referenced = Some(Bytes::from_mib(touched));
                let told = f.step(&cfg, &o).unwrap();
                size = told.wss.mib();
                e = Some(told);
            }
            let e = e.unwrap();
            assert_eq!(e.phase, "touched", "{}", e.detail);
            let bound = e.detail.split("no probe below ").nth(1).unwrap();
            (size, bound.split(" and").next().unwrap().to_string())
        };
        // 50 MiB of kernel memory, 20 on its lists (slab), 100 MiB seen touched: the 30
        // off its lists are within the image, in the touched memory already. No probe
        // below the kernel's 50 MiB and the 70 touched beyond them ÷ 0.8 (137.5 MiB),
        // and the 30 MiB margin; the last step down (to 167.5) is less than a 1% step.
        assert_eq!(settle(50, Some(20), 100), (169, "138 MiB".into()));
        // Without the lists, the whole floor (50 + 32) and 100 ÷ 0.8; so too where the
        // guest's figures give its unreclaimable memory as what its lists name alone (as
        // they do without the page cache's lists).
        assert_eq!(settle(50, None, 100), (237, "207 MiB".into()));
        assert_eq!(settle(50, Some(50), 100), (237, "207 MiB".into()));
        // A 256 MiB crash kernel beside them is not touched: only the image and the page
        // structures of what it holds (near 400 MiB: 38 MiB) are taken as touched.
        let (size, bound) = settle(300, Some(20), 100);
        assert_eq!(bound, "377 MiB", "300 + 61.7 ÷ 0.8");
        assert_eq!(
            size, 406,
            "the bound when it probed (its page structures shrink with it) and the 30 MiB margin"
        );
        // Touching little, never below the floor and the margin (332 + 30).
        assert_eq!(settle(300, Some(20), 10), (362, "332 MiB".into()));
    }

    #[test]
    fn the_page_cache_a_guest_uses_counts_with_its_need_in_the_touched_bound() {
        // A 1000 MiB guest needing 100 MiB (50 of kernel memory, 20 of it slab) and
        // using 300 MiB of page cache. The size it settles at and its last reason, with
        // `touched` MiB seen touched each tick.
        let settle = |touched: u64| {
            let (cfg, mut f, mut size) = (cfg(), Fused::default(), 1000);
            let mut last = None;
            for t in 0..20 {
                let mut o = obs(t, size, size - 100, 0);
                o.signals.unreclaimable = Some(Bytes::from_mib(50));
                o.signals.unreclaimable_listed = Some(Bytes::from_mib(20));
                o.signals.active_file = Some(Bytes::from_mib(300));
                o.referenced = Some(Bytes::from_mib(touched));
                let e = f.step(&cfg, &o).unwrap();
                size = e.wss.mib();
                last = Some(e);
            }
            (size, last.unwrap())
        };
        // Rereading its files, 360 MiB seen touched: 20 MiB of kernel memory the host does
        // not see touched (the 30 off its lists are within the image), 30 of image and
        // 330 ÷ 0.8 beyond, up to its need and the cache it uses, 400 MiB, and the
        // margin: where it started (its need, cache and margin), no probe.
        let (size, e) = settle(360);
        assert_eq!((size, e.phase), (430, "touched"), "{}", e.detail);
        assert!(e.detail.contains("no probe below 400 MiB"), "{}", e.detail);
        // Touching 200 MiB, only what it touched (and the 20 MiB beside) beyond its need
        // counts of its cache, at the share: (220 − 100) ÷ 0.8, 150 MiB; probed down to
        // 250 MiB and the margin.
        let (size, e) = settle(200);
        assert_eq!((size, e.phase), (280, "touched"), "{}", e.detail);
        assert!(
            e.detail.contains("150 MiB of page cache it uses"),
            "{}",
            e.detail
        );
    }

    #[test]
    fn active_cache_not_seen_touched_does_not_raise_the_touched_bound_and_a_swapless_guests_does() {
        // A 1000 MiB guest needing 600 MiB, 560 seen touched each tick (500 of anonymous
        // memory, 30 of kernel image, 30 more), 300 MiB of page cache on its active list.
        // The size it settles at and its last reason; `swapless`: its anonymous memory
        // on its lists (swap cannot take it) beside 20 of slab and 30 of kernel memory.
        let settle = |swapless: bool| {
            let (cfg, mut f, mut size) = (cfg(), Fused::default(), 1000);
            let listed = if swapless { 520 } else { 20 };
            let mut e = None;
            for t in 0..30 {
                let mut o = obs(t, size, size - 600, 0);
                o.signals.unreclaimable = Some(Bytes::from_mib(listed + 30));
                o.signals.unreclaimable_listed = Some(Bytes::from_mib(listed));
                o.signals.active_file = Some(Bytes::from_mib(300));
                o.referenced = Some(Bytes::from_mib(560));
                let told = f.step(&cfg, &o).unwrap();
                if t == 0 {
                    assert_eq!(told.wss.mib(), 930, "need, cache, margin: {}", told.detail);
                }
                size = told.wss.mib();
                e = Some(told);
            }
            (size, e.unwrap())
        };
        // With swap, what it touched is within its need: its cache, though on the active
        // list, is not what the host saw touched, and it is probed down to its need (50 +
        // 530 ÷ 0.8, at most 600) and the margin.
        let (size, e) = settle(false);
        assert_eq!((size, e.phase), (630, "touched"), "{}", e.detail);
        assert!(e.detail.contains("no probe below 600 MiB"), "{}", e.detail);
        // Without swap, its anonymous memory counts beside what the host saw touched: of
        // that, the host may have seen its cache touched, not its anonymous memory.
        // No probe.
        let (size, e) = settle(true);
        assert_eq!((size, e.phase), (930, "touched"), "{}", e.detail);
    }

    #[test]
    fn a_guest_touching_nearly_all_it_needs_is_not_probed_below_its_need() {
        let (cfg, mut f) = (cfg(), Fused::default());
        // 400 MiB needed, 270 of it seen touched each tick. Touched + floor (72) is 342:
        // a probe to 380 would pass that and the 30 MiB margin. But 270 ÷ 0.8 above the
        // floor is 409, more than the need: the need and the margin hold, 430 MiB.
        let mut size = 1000;
        for t in 0..20 {
            let mut o = obs(t, size, size.saturating_sub(400), 0);
            o.referenced = Some(Bytes::from_mib(270));
            let e = f.step(&cfg, &o).unwrap();
            size = e.wss.mib();
            assert!(size >= 430, "tick {t}: {}", e.detail);
            if t >= 1 {
                assert_eq!(e.phase, "touched", "tick {t}: {}", e.detail);
                assert!(e.detail.contains("no probe below 400 MiB"), "{}", e.detail);
            }
        }
        // Touching less, it is probed down to its floor and the touched share: 72 + 100
        // ÷ 0.8 = 197 MiB, and the margin; each probe's reason names what it passed.
        for t in 20..60 {
            let mut o = obs(t, size, size.saturating_sub(400), 0);
            o.referenced = Some(Bytes::from_mib(100));
            let e = f.step(&cfg, &o).unwrap();
            size = e.wss.mib();
            if e.phase == "probe" {
                assert!(
                    e.detail
                        .contains("needed and touched at least 100 MiB in each of the last 3"),
                    "{}",
                    e.detail
                );
            }
        }
        assert!(
            (227..=280).contains(&size),
            "probed to near 227 MiB: {size}"
        );
    }

    #[test]
    fn the_first_access_sample_bounds_probing_and_none_goes_on_while_sampling_misses() {
        let (cfg, mut f) = (cfg(), Fused::default());
        // A guest needing 300 MiB, its balloon following at once.
        let mut size = 1000;
        let mut step = |t: u64, referenced: Option<u64>| {
            let mut o = obs(t, size, size.saturating_sub(300), 0);
            o.referenced = referenced.map(Bytes::from_mib);
            let e = f.step(&cfg, &o).unwrap();
            size = e.wss.mib();
            e
        };
        // The sampler's first call only starts its window.
        assert_eq!(step(0, None).phase, "start");
        // One sample in bounds probing at once: the guest touched all it needs.
        let e = step(1, Some(300));
        assert_eq!(e.phase, "touched", "{}", e.detail);
        assert!(
            e.detail.contains("in the last host-side access sample:"),
            "{}",
            e.detail
        );
        // The least of those in: touching 10 MiB now, it is probed.
        let e = step(2, Some(10));
        assert_eq!(e.phase, "probe", "{}", e.detail);
        assert!(
            e.detail.contains("in each of the last 2 host-side"),
            "{}",
            e.detail
        );
        // A sample missed: the history starts again, and no probe for the samples' span.
        for t in [3, 4] {
            let e = step(t, None);
            assert_eq!(e.phase, "sampling", "{}", e.detail);
            assert!(e.detail.contains("no sample in"), "{}", e.detail);
        }
        // Sampling gone for longer than that: probing goes on without it.
        assert_eq!(step(5, None).phase, "probe");
    }

    #[test]
    fn a_recalled_estimator_awaits_access_sampling_as_it_had_it() {
        let (cfg, mut f) = (cfg(), Fused::default());
        // A guest needing 300 MiB, touching all of it: started at 330 MiB, held there by
        // its samples when the daemon is killed.
        for (t, (size, avail)) in [(1000, 700), (330, 30)].into_iter().enumerate() {
            let mut o = obs(t as u64, size, avail, 0);
            o.referenced = Some(Bytes::from_mib(300));
            f.step(&cfg, &o);
        }
        let m = f.memory(Duration::from_secs(2)).unwrap();
        assert!(m.sampling);
        assert_eq!(m.estimate, Bytes::from_mib(330));
        // A new daemon: its sampler gives nothing at its first tick (it has just cleared
        // the guest's accessed bits), nor at the next when it misses: no probe meanwhile.
        let mut g = Fused::recall(&m, Duration::ZERO);
        for t in 0..3 {
            let e = g.step(&cfg, &obs(t, 330, 30, 0)).unwrap();
            assert_eq!(e.phase, "sampling", "tick {t}: {}", e.detail);
            assert_eq!(e.wss, m.estimate);
        }
        // Sampling gone for longer than its samples span: probing goes on without it.
        assert_eq!(g.step(&cfg, &obs(3, 330, 30, 0)).unwrap().phase, "probe");
        // An estimator that was not sampled is not held for it.
        let unsampled = FusedMemory {
            sampling: false,
            ..m.clone()
        };
        let mut h = Fused::recall(&unsampled, Duration::ZERO);
        assert_eq!(h.step(&cfg, &obs(0, 330, 30, 0)).unwrap().phase, "probe");
        // A state file written before the field existed reads as not sampled.
        let old = r#"{"estimate":300,"base":300,"backoffs":0,"hold_s":0.0,"exact":false}"#;
        let read: Result<FusedMemory, _> = serde_json::from_str(old);
        assert!(read.is_ok_and(|r| !r.sampling), "{old}");
    }

    #[test]
    fn an_allocation_across_a_tick_without_the_figure_is_still_seen() {
        let (cfg, mut f) = (cfg(), Fused::default());
        // 300 MiB needed, 300 committed; a tick whose sample lacks Committed_AS; then
        // 500 MiB more committed: new demand, given at once.
        f.step(&cfg, &committed(obs(0, 1000, 700, 0), 300));
        f.step(&cfg, &obs(1, 330, 30, 0));
        let e = f.step(&cfg, &committed(obs(2, 330, 30, 0), 800)).unwrap();
        assert_eq!(e.phase, "allocate", "{}", e.detail);
        assert!(e.wss >= Bytes::from_mib(300 + 500 - 30), "{}", e.detail);
        // Four ticks without the figure: growth over the silence is no jump.
        let mut g = Fused::default();
        g.step(&cfg, &committed(obs(0, 1000, 700, 0), 300));
        for t in 1..5 {
            g.step(&cfg, &obs(t, 330, 30, 0));
        }
        let e = g.step(&cfg, &committed(obs(5, 330, 30, 0), 800)).unwrap();
        assert_ne!(e.phase, "allocate", "{}", e.detail);
    }

    #[test]
    fn back_offs_during_a_hold_restart_it_without_doubling() {
        let (cfg, mut f) = (cfg(), Fused::default());
        f.step(&cfg, &obs(0, 1000, 700, 0));
        for t in 1..5 {
            let e = f.step(&cfg, &obs(t, 330, 30, 1024)).unwrap();
            assert_eq!(e.phase, "back_off");
            assert!(e.detail.contains("hold 8 s"), "tick {t}: {}", e.detail);
        }
        assert_eq!(f.step(&cfg, &obs(11, 400, 100, 0)).unwrap().phase, "hold");
        assert_eq!(
            f.step(&cfg, &obs(12, 400, 100, 0)).unwrap().phase,
            "probe",
            "8 s after the last"
        );
    }

    #[test]
    fn stalls_oom_kills_and_pressure_also_back_off() {
        let cfg = cfg();
        for signal in 0..3 {
            let mut f = Fused::default();
            f.step(&cfg, &obs(0, 330, 30, 0));
            let mut o = obs(1, 330, 30, 0);
            match signal {
                0 => o.signals.alloc_stalls = Some(1),
                1 => o.signals.oom_kills = Some(1),
                _ => o.signals.psi_some_stalled = Some(5.0),
            }
            assert_eq!(
                f.step(&cfg, &o).unwrap().phase,
                "back_off",
                "signal {signal}"
            );
        }
    }

    #[test]
    fn memory_the_guest_frees_is_taken_back_at_once() {
        let (cfg, mut f) = (cfg(), Fused::default());
        f.step(&cfg, &obs(0, 1000, 300, 0)); // need 700: 730
        f.step(&cfg, &obs(1, 730, 30, 0)); // probe: 680
        f.step(&cfg, &obs(2, 680, 0, 0)); // probe: 630
        f.step(&cfg, &obs(3, 630, 0, 0)); // probe: 580
                                          // While probing, the need falling with the size is our balloon's doing, not a
                                          // release, even when it falls by 300 MiB (580 - 250).
        let e = f.step(&cfg, &obs(4, 580, 250, 0)).unwrap();
        assert_eq!(e.phase, "probe", "the balloon inflated a tick ago");
        let e = f.step(&cfg, &obs(5, 530, 200, 0)).unwrap();
        assert_eq!(e.phase, "probe", "still inflating");
        // Unprobed (after a back-off, holding), the same release is taken at once.
        let mut g = Fused::default();
        g.step(&cfg, &obs(0, 1000, 300, 0)); // need 700: 730
        g.step(&cfg, &obs(1, 730, 30, 1024)); // back off: 730 + 4 + 20 = 754, hold
        g.step(&cfg, &obs(2, 754, 54, 0));
        let e = g.step(&cfg, &obs(3, 754, 354, 0)).unwrap();
        assert_eq!((e.wss.mib_f64(), e.phase), (454.0, "release"));
        assert!(e.detail.contains("freed 300 MiB"), "{}", e.detail);
        // It keeps what the back-off gave above its need (754 - 600 = 154, need 100)...
        let mut h = Fused::default();
        h.step(&cfg, &obs(0, 1000, 300, 0));
        h.step(&cfg, &obs(1, 730, 30, 1024));
        h.step(&cfg, &obs(2, 754, 54, 0));
        let e = h.step(&cfg, &obs(3, 754, 654, 0)).unwrap();
        assert_eq!((e.wss.mib_f64(), e.phase), (154.0, "release"));
        // ...and never goes below that need: a failed probe left the estimate 710 - 6
        // (need 680 + 30 margin), then the guest freed 580.
        let mut k = Fused::default();
        k.step(&cfg, &obs(0, 1000, 300, 0)); // 730
        k.step(&cfg, &obs(1, 730, 30, 0)); // probe: 680
        assert_eq!(mib(k.step(&cfg, &obs(2, 680, 0, 1024))), 704.0);
        k.step(&cfg, &obs(3, 704, 24, 0));
        let e = k.step(&cfg, &obs(4, 704, 604, 0)).unwrap();
        assert_eq!((e.wss.mib_f64(), e.phase), (130.0, "release"));
    }

    #[test]
    fn without_committed_as_what_the_guest_swapped_out_is_not_freed() {
        // As the unprobed release above (need 700, backed off to 754 and held), but the
        // need falls by 300 MiB as the guest swaps out: a guest without an agent, whose
        // balloon statistics give no Committed_AS, has freed only what it did not swap out.
        // Each tick after the back-off: MemAvailable, MiB swapped out, MiB swapped in.
        let run = |ticks: &[(u64, u64, u64)]| {
            let (cfg, mut g) = (cfg(), Fused::default());
            g.step(&cfg, &obs(0, 1000, 300, 0));
            g.step(&cfg, &obs(1, 730, 30, 1024));
            let mut last = None;
            for (t, &(avail, out, back)) in (2..).zip(ticks) {
                let mut o = obs(t, 754, avail, 0);
                o.signals.swap_out_per_s = Some(Bytes::from_mib(out).as_f64());
                o.signals.swap_in_per_s = Some(Bytes::from_mib(back).as_f64());
                last = g.step(&cfg, &o);
            }
            last.unwrap()
        };
        let e = run(&[(54, 0, 0), (354, 300, 0)]);
        assert_ne!(e.phase, "release", "{}", e.detail);
        assert!(e.wss.mib_f64() >= 700.0, "{}", e.wss);
        // Swapped out over two ticks after its need's highest, 100 then 100: 100 of the
        // 300 was freed.
        let e = run(&[(54, 0, 0), (154, 100, 0), (354, 100, 0)]);
        assert_eq!((e.wss.mib_f64(), e.phase), (654.0, "release"));
        assert!(e.detail.contains("freed 100 MiB"), "{}", e.detail);
        // Swapped out, then back in: what it frees after is freed (review: nothing was
        // taken back while the swap-outs were still counted).
        let e = run(&[(54, 0, 0), (354, 300, 0), (54, 0, 300), (354, 0, 0)]);
        assert_eq!((e.wss.mib_f64(), e.phase), (454.0, "release"));
    }

    #[test]
    fn with_free_page_reporting_and_memory_ample_a_guest_may_keep_the_free_memory_the_host_does_not_back(
    ) {
        // A 1000 MiB guest with `avail` available, `unused` MiB of it inactive page cache,
        // `backed` MiB of it resident on the host.
        let o = |t, avail, unused, backed, fpr, level| {
            let mut o = at(obs(t, 1000, avail, 0), level);
            o.signals.inactive_file = Some(Bytes::from_mib(unused));
            o.backed = Some(Bytes::from_mib(backed));
            o.free_page_reporting = fpr;
            o
        };
        let keep = |e: Option<Estimate>| e.unwrap().keep.map(|k| k.size.mib_f64());
        let (cfg, ample) = (cfg(), NeedLevel::Ample);
        // Needing 700 MiB, 300 free and reported: its estimate is its need and margin
        // either way; with reporting it may keep its size.
        let mut plain = Fused::default();
        assert_eq!(
            keep(plain.step(&cfg, &o(0, 300, 0, 700, false, ample))),
            None
        );
        let mut f = Fused::default();
        let e = f.step(&cfg, &o(0, 300, 0, 700, true, ample)).unwrap();
        assert_eq!(
            (e.wss.mib_f64(), e.keep),
            (
                730.0,
                Some(Keep {
                    size: Bytes::from_mib(1000),
                    why: KeepWhy::Reported
                })
            )
        );
        // It frees 300 MiB more: the estimate falls to its need, what it may keep does not.
        let e = f.step(&cfg, &o(1, 600, 0, 400, true, ample)).unwrap();
        assert_eq!((e.wss.mib_f64(), e.phase), (430.0, "release"));
        assert_eq!(
            e.keep.map(|k| (k.size, k.why)),
            Some((Bytes::from_mib(1000), KeepWhy::Reported))
        );
        // Free memory the host still backs (a driver that does not report) is not kept.
        let mut n = Fused::default();
        assert_eq!(keep(n.step(&cfg, &o(0, 300, 0, 1000, true, ample))), None);
        // Its page cache is kept (200 MiB of it inactive): all of it with 100 MiB free
        // and reported, all but the 100 MiB free and backed otherwise.
        let mut c = Fused::default();
        assert_eq!(
            keep(c.step(&cfg, &o(0, 300, 200, 900, true, ample))),
            Some(1000.0)
        );
        let mut b = Fused::default();
        assert_eq!(
            keep(b.step(&cfg, &o(0, 300, 200, 1000, true, ample))),
            Some(930.0)
        );
        // Once the host needs memory, nothing is kept beyond the estimate.
        assert_eq!(
            keep(f.step(&cfg, &o(2, 600, 0, 400, true, NeedLevel::Tight))),
            None
        );
    }

    #[test]
    fn what_a_reporting_guest_frees_is_kept_while_it_has_time_to_report_it() {
        // A 1000 MiB guest with `avail` available, `backed` MiB resident on the host.
        let o = |t, avail, backed| {
            let mut o = at(obs(t, 1000, avail, 0), NeedLevel::Ample);
            o.signals.inactive_file = Some(Bytes::ZERO);
            o.signals.used = Some(Bytes::from_mib(1000 - avail));
            o.signals.committed_as = Some(Bytes::from_mib(1000 - avail));
            o.backed = Some(Bytes::from_mib(backed));
            o.free_page_reporting = true;
            o
        };
        let keep = |e: Estimate| e.keep.map(|k| k.size.mib_f64());
        let cfg = cfg();
        // Needing 700 MiB, 100 of its 300 free not reported (the host backs 800): it
        // keeps its need, margin and the 200 reported (930).
        let mut f = Fused::default();
        assert_eq!(keep(f.step(&cfg, &o(0, 300, 800)).unwrap()), Some(930.0));
        // It frees 300 MiB more, not reported yet (the host still backs 800): released to
        // its need, it keeps them on top of its need, margin and the 200 reported, not
        // its need and the 200 alone (630).
        let e = f.step(&cfg, &o(1, 600, 800)).unwrap();
        assert_eq!((e.wss.mib_f64(), e.phase), (430.0, "release"));
        assert_eq!(keep(e), Some(930.0));
        // Half of them reported: what is given back is not counted twice.
        assert_eq!(keep(f.step(&cfg, &o(2, 600, 650)).unwrap()), Some(930.0));
        // The rest still not reported once its time is up (4 s): it is taken.
        assert_eq!(keep(f.step(&cfg, &o(5, 600, 650)).unwrap()), Some(780.0));
        // Freed and committed again within the wait: what it freed is in use again, and
        // it keeps its need, margin and the 200 reported (930), not its size.
        let mut a = Fused::default();
        a.step(&cfg, &o(0, 300, 800));
        assert_eq!(keep(a.step(&cfg, &o(1, 600, 800)).unwrap()), Some(930.0));
        assert_eq!(keep(a.step(&cfg, &o(2, 300, 800)).unwrap()), Some(930.0));
    }

    #[test]
    fn memory_the_guest_frees_a_little_each_tick_is_taken_back_once_it_adds_up() {
        // A CI builder's compilers wind down: need and Committed_AS fall 20 MiB a tick
        // (2.9%, below the 10% that counts as a release in one tick). Measured from their
        // highest (700), 80 MiB freed by the fourth tick is a release: 730 - 80 = 650,
        // the need 620 + margin 30 (before, the estimate stayed at 730 for good).
        let cfg = cfg();
        let mut f = Fused::default();
        let tick = |t: u64, size: u64, need: u64| {
            at(
                committed(obs(t, size, size - need, 0), need),
                NeedLevel::Ample,
            )
        };
        assert_eq!(mib(f.step(&cfg, &tick(0, 1000, 700))), 730.0);
        // The balloon inflated to 730 at tick 1: a fall is measured from tick 2 on.
        for t in [1, 2] {
            assert_eq!(f.step(&cfg, &tick(t, 730, 700)).unwrap().phase, "ample");
        }
        for (t, need) in [(3, 680), (4, 660), (5, 640)] {
            let e = f.step(&cfg, &tick(t, 730, need)).unwrap();
            assert_eq!((e.wss.mib_f64(), e.phase), (730.0, "ample"), "need {need}");
        }
        let e = f.step(&cfg, &tick(6, 730, 620)).unwrap();
        assert_eq!((e.wss.mib_f64(), e.phase), (650.0, "release"));
        assert!(e.detail.contains("freed 80 MiB"), "{}", e.detail);
        // The same fall with Committed_AS unchanged (a program that keeps its buffer and
        // lets the guest reclaim it) is not a release.
        let mut g = Fused::default();
        let kept =
            |t: u64, need: u64| at(committed(obs(t, 730, 730 - need, 0), 700), NeedLevel::Ample);
        g.step(&cfg, &tick(0, 1000, 700));
        for (t, need) in [(1, 700), (2, 700), (3, 680), (4, 660), (5, 640), (6, 620)] {
            assert_ne!(g.step(&cfg, &kept(t, need)).unwrap().phase, "release");
        }
    }

    #[test]
    fn memory_the_guest_commits_is_given_at_once_and_not_probed_while_it_fills_it() {
        let (cfg, mut f) = (cfg(), Fused::default());
        f.step(&cfg, &committed(obs(0, 1000, 700, 0), 300)); // 330
        f.step(&cfg, &committed(obs(1, 330, 30, 0), 300)); // probe: 280
                                                           // 200 MiB committed, none of it touched yet (need unchanged): 280 + 200.
        let e = f.step(&cfg, &committed(obs(2, 280, 0, 0), 500)).unwrap();
        assert_eq!((e.wss.mib_f64(), e.phase), (480.0, "allocate"));
        assert!(e.detail.contains("committed 200 MiB more"), "{}", e.detail);
        // Held 8 s while it touches it, then probed again.
        let e = f.step(&cfg, &committed(obs(9, 480, 200, 0), 500)).unwrap();
        assert_eq!(e.phase, "hold");
        let e = f.step(&cfg, &committed(obs(10, 480, 200, 0), 500)).unwrap();
        assert_eq!(e.phase, "probe");
        // A probe step's worth (10 MiB) is not new demand.
        let e = f.step(&cfg, &committed(obs(11, 470, 190, 0), 510)).unwrap();
        assert_eq!(e.phase, "probe");
    }

    #[test]
    fn an_oom_kill_gives_the_guest_all_it_has() {
        let (cfg, mut f) = (cfg(), Fused::default());
        f.step(&cfg, &obs(0, 1000, 700, 0));
        f.step(&cfg, &obs(1, 330, 30, 0));
        let mut o = obs(2, 280, 250, 0); // the killed task's memory is free again
        o.signals.oom_kills = Some(1);
        let e = f.step(&cfg, &o).unwrap();
        assert_eq!((e.wss.mib_f64(), e.phase), (1000.0, "back_off"));
    }

    #[test]
    fn no_probe_deeper_until_the_guest_comes_down_to_the_last_one() {
        let (cfg, mut f) = (cfg(), Fused::default());
        f.step(&cfg, &obs(0, 1000, 700, 0)); // 330
                                             // The balloon takes a few ticks to get there: hold the estimate meanwhile.
        for (t, size) in [(1, 800), (2, 600), (3, 400)] {
            let e = f.step(&cfg, &obs(t, size, size - 300, 0)).unwrap();
            assert_eq!((e.wss.mib_f64(), e.phase), (330.0, "settle"), "size {size}");
        }
        let e = f.step(&cfg, &obs(4, 340, 40, 0)).unwrap();
        assert_eq!((e.wss.mib_f64(), e.phase), (280.0, "probe"));
    }

    #[test]
    fn a_guest_that_touches_all_it_allocates_is_not_fast_probed_again_when_it_grows() {
        let cfg = cfg();
        // need 300, committed 300 or 400 (100 MiB of it cold): the fast probe to 280
        // fails, then the guest commits and touches 200 MiB more.
        let run = |cold: u64| {
            let mut f = Fused::default();
            f.step(&cfg, &committed(obs(0, 1000, 700, 0), 300 + cold)); // 330
            f.step(&cfg, &committed(obs(1, 330, 30, 0), 300 + cold)); // probe: 280
            f.step(&cfg, &committed(obs(2, 280, 0, 2560), 300 + cold));
            let grown = f.step(&cfg, &committed(obs(60, 600, 100, 0), 500 + cold));
            assert_eq!(grown.unwrap().phase, "allocate");
            let next = f.step(&cfg, &committed(obs(61, 530, 30, 0), 500 + cold));
            assert_eq!(next.unwrap().phase, "hold", "it fills what it allocated");
            let next = f.step(&cfg, &committed(obs(69, 530, 30, 0), 500 + cold));
            (next.unwrap(), f)
        };
        // Failed with 280 + 50 >= 300 committed: probe slowly after the growth (1%).
        let (e, mut f) = run(0);
        assert_eq!((e.wss.mib_f64(), e.phase), (520.0, "probe"));
        // Failed below its commitment (cold memory there): fast again (5%).
        let (e, _) = run(100);
        assert_eq!((e.wss.mib_f64(), e.phase), (480.0, "probe"));
        // Found fine below its commitment later: fast again after the next growth.
        for (t, size) in [(70, 520), (71, 510), (72, 500), (73, 490)] {
            assert_eq!(
                f.step(&cfg, &committed(obs(t, size, 30, 0), 500))
                    .unwrap()
                    .phase,
                "probe"
            );
        }
        f.step(&cfg, &committed(obs(120, 900, 200, 0), 700));
        let e = f.step(&cfg, &committed(obs(129, 730, 30, 0), 700)).unwrap();
        assert_eq!((e.wss.mib_f64(), e.phase), (680.0, "probe"));
    }

    #[test]
    fn new_demand_is_met_at_once_and_the_floor_holds() {
        let (cfg, mut f) = (cfg(), Fused::default());
        f.step(&cfg, &obs(0, 1000, 900, 0)); // need 100: 130
                                             // The guest allocated 400 MiB more: need 500 at size 600 (avail 100): jump to 530.
        assert_eq!(mib(f.step(&cfg, &obs(1, 600, 100, 0))), 530.0);
        // A guest needing nothing still keeps unreclaimable 40 + floor 32.
        let mut g = Fused::default();
        for t in 0..200 {
            g.step(&cfg, &obs(t, 80, 80, 0));
        }
        assert_eq!(mib(g.step(&cfg, &obs(200, 80, 80, 0))), 72.0);
    }
}
