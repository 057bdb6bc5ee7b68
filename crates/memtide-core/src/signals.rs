//! Per-VM signals derived each tick from a VM's history: its memory picture and what
//! happened since the previous sample. The guest agent's /proc figures are preferred; the
//! virtio-balloon statistics stand in where the guest has no agent (major faults then
//! stand in for refaults).

use crate::history::History;
use crate::snapshot::VmSample;
use crate::stats::{AgentStats, MemInfo, ZramSwap};
use crate::units::Bytes;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The guest's base page size: swap-in and refault counts are pages.
pub const PAGE: u64 = 4096;

/// What the engine derives about a guest each tick.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Signals {
    /// Memory the guest uses: its current size minus what it reports free.
    pub used: Option<Bytes>,
    /// MemTotal as the guest sees it.
    pub total: Option<Bytes>,
    /// MemAvailable: what the guest could use without swapping.
    pub available: Option<Bytes>,
    /// Committed_AS (needs the agent; else `None`).
    pub committed_as: Option<Bytes>,
    /// SwapFree: room the guest has to absorb a shortage (needs the agent); what swapping
    /// there frees of its RAM is [`Signals::swap_frees`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap_free: Option<Bytes>,
    /// Its swap on zram, where it has any (needs the agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zram: Option<ZramSwap>,
    /// Swap in use: SwapTotal − SwapFree (needs the agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap_used: Option<Bytes>,
    /// Active(file): page cache the guest used more than once lately (needs the agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_file: Option<Bytes>,
    /// Inactive(file): the rest of its page cache (needs the agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inactive_file: Option<Bytes>,
    /// AnonPages: programs' anonymous memory, the only kind its swap takes (needs the
    /// agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anon: Option<Bytes>,
    /// Memory the guest has committed and not touched: Committed_AS less its anonymous
    /// memory in RAM and in swap and its shmem (reserved heaps, thread stacks; needs the
    /// agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub untouched: Option<Bytes>,
    /// Memory the guest cannot give up without an OOM kill: all its size holds but free
    /// memory, page cache, reclaimable slab and what swapping its anonymous memory frees
    /// ([`Signals::swap_frees`]: on zram, less the compressed copies; needs the agent).
    pub unreclaimable: Option<Bytes>,
    /// The part of `unreclaimable` the guest's lists name: unreclaimable slab and the
    /// anonymous memory beyond what swapping frees, without the kernel's other memory
    /// (what it reserved at boot, page tables, stacks; needs the agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreclaimable_listed: Option<Bytes>,
    /// Pages swapped in since the previous sample.
    pub swap_ins: Option<u64>,
    /// Evicted pages faulted back since the previous sample (refaults with the agent,
    /// major faults without it).
    pub refaults: Option<u64>,
    /// Direct-reclaim stalls since the previous sample (after guest agent replies
    /// missed, with neither count in the balloon statistics: since its previous reply).
    pub alloc_stalls: Option<u64>,
    /// OOM kills since the previous sample (as `alloc_stalls`).
    pub oom_kills: Option<u64>,
    /// The guest's memory PSI, `some` over 10 s (percent).
    pub psi_some_avg10: Option<f64>,
    /// Share of the time since the agent's previous reply during which some guest task
    /// stalled on memory (percent; from PSI's cumulative total, so it measures this tick,
    /// and the ticks of missed replies before it, only).
    pub psi_some_stalled: Option<f64>,
    /// The guest has an agent but it did not answer this tick: its /proc figures are
    /// missing and the balloon statistics (which a struggling guest may also leave
    /// stale) stand in.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub agent_failed: bool,
    /// Time since the previous sample.
    pub interval: Option<Duration>,
    /// Major faults per second.
    pub major_faults_per_s: Option<f64>,
    /// Bytes swapped in per second.
    pub swap_in_per_s: Option<f64>,
    /// Bytes swapped out per second.
    pub swap_out_per_s: Option<f64>,
}

fn agent(s: &VmSample) -> Option<&AgentStats> {
    s.agent.as_ref()?.as_ref().ok()
}

/// What the guest cannot give up without an OOM kill. Anonymous memory (shmem with it: it
/// is on the same lists) can go to swap as far as swap is free; page cache and reclaimable
/// slab can be dropped; everything else the guest's size holds stays: the kernel's own
/// memory (unreclaimable slab, page tables, stacks, what it reserved at boot), locked and
/// huge-TLB pages (found in the simulator: guests without swap sized to their anonymous
/// memory, the kernel's 128 MiB left out, were OOM-killed when neighbours burst).
/// Returns it with the part the guest's lists name (`Signals::unreclaimable_listed`).
fn unreclaimable(s: &VmSample, m: &MemInfo, frees: impl Fn(Bytes) -> Bytes) -> (Bytes, Bytes) {
    let size = s.balloon.unwrap_or(s.configured);
    let anon = m.active_anon.unwrap_or_default() + m.inactive_anon.unwrap_or_default();
    // What no reading of the other figures lowers: unreclaimable slab and the anonymous
    // memory beyond free swap. It stands alone without the page cache's lists, or while
    // virtio-mem memory is plugged that the guest may not have onlined; and it holds when
    // the balloon moved between the reads of its size and of the guest's figures (found in
    // review: a guest deflating by 300 MiB between them counted less than its anonymous
    // memory).
    let swappable = frees(anon);
    let lower = (m.slab_unreclaimable.unwrap_or_default() + (anon - swappable)).min(size);
    let (Some(active_file), Some(inactive_file)) = (m.active_file, m.inactive_file) else {
        return (lower, lower);
    };
    // Plugged memory the guest never onlined is in neither MemTotal nor MemFree.
    let offline = match &s.virtio_mem {
        None => Bytes::ZERO,
        Some(mem) => match mem.offline {
            Some(offline) => offline,
            None => return (lower, lower),
        },
    };
    // The guest's size less MemFree: MemTotal leaves out what the kernel reserved at boot
    // and, with deflate-on-oom, still counts the balloon's pages.
    let used = size - offline - m.free;
    let rest =
        used - active_file - inactive_file - m.slab_reclaimable.unwrap_or_default() - swappable;
    (rest.max(lower), lower)
}

/// The most of the kernel memory off its lists that host-side access sampling sees
/// touched in every sample of a guest of `size`: the kernel's image (taken as 32 MiB: the
/// test guest's Debian 6.1 kernel has 30 MiB of code, data and bss, by its boot log's
/// `Memory:` line) and the page structures of the memory it holds (64 bytes a 4 KiB page:
/// 1/64 of `size`; those of the memory in its balloon are not touched). What the kernel
/// reserved beyond that (a crash kernel, huge-page pools) is not touched by itself.
pub fn kernel_seen_touched(size: Bytes) -> Bytes {
    Bytes::from_mib(32) + Bytes(size.0 / 64)
}

/// What swapping out `x` of a guest's anonymous memory frees of its RAM, with `free` swap
/// free, `zram` of it on zram: zram first (its usual priority), each page there leaving its
/// compressed copy in RAM ([`ZramSwap::ratio`]), then the rest of its swap (found in
/// review: counting zram's free swap as room for whole pages left a guest swapping only to
/// zram divided below the memory its compressed copies take).
fn swap_frees(free: Bytes, zram: Option<ZramSwap>, x: Bytes) -> Bytes {
    let Some(zram) = zram else {
        return x.min(free);
    };
    let zram_free = zram.free.min(free);
    let on_zram = x.min(zram_free);
    let on_disk = (x - on_zram).min(free - zram_free);
    on_zram.scale(1.0 - zram.ratio()) + on_disk
}

impl Signals {
    /// Signals from a VM's (sanitized) history; the latest sample is the current one.
    pub fn derive(history: &History<VmSample>) -> Signals {
        let Some(s) = history.latest() else {
            return Signals::default();
        };
        let a = agent(s);
        let used = s
            .stats
            .free
            .map(|free| s.balloon.unwrap_or(s.configured) - free);
        let total = a.map(|a| a.meminfo.total).or(s.stats.total);
        let available = a.and_then(|a| a.meminfo.available).or(s.stats.available);
        let (unreclaimable, unreclaimable_listed) = a
            .map(|a| {
                let frees = |x| swap_frees(a.meminfo.swap_free, a.zram, x);
                unreclaimable(s, &a.meminfo, frees)
            })
            .unzip();
        // Counters from the agent when both samples have it, else from balloon stats.
        let agent_delta = |f: fn(&AgentStats) -> Option<u64>| history.delta(|s| f(agent(s)?));
        // Events, else from the agent's previous reply: one counted in the reply after a
        // missed one is not lost (found in review: an OOM kill then was never seen). Not
        // where the balloon statistics counted the missed ticks, which would count them
        // twice.
        let events = |f: fn(&AgentStats) -> Option<u64>, stats: fn(&VmSample) -> Option<u64>| {
            agent_delta(f)
                .or_else(|| history.delta(stats))
                .or_else(|| history.growth(|s| f(agent(s)?)).map(|(n, _)| n))
        };
        let swap_ins = agent_delta(|a| a.vmstat.pswpin)
            .or_else(|| history.delta(|s| s.stats.swap_in.map(|b| b.0 / PAGE)));
        let refaults = agent_delta(|a| a.vmstat.refaults())
            .or_else(|| history.delta(|s| s.stats.major_faults));
        Signals {
            used,
            total,
            available,
            committed_as: a.and_then(|a| a.meminfo.committed_as),
            active_file: a.and_then(|a| a.meminfo.active_file),
            inactive_file: a.and_then(|a| a.meminfo.inactive_file),
            anon: a.and_then(|a| a.meminfo.anon_pages),
            swap_free: a.map(|a| a.meminfo.swap_free),
            zram: a.and_then(|a| a.zram),
            swap_used: a.map(|a| a.meminfo.swap_total - a.meminfo.swap_free),
            untouched: a.and_then(|a| {
                let m = &a.meminfo;
                let swapped = m.swap_total - m.swap_free;
                Some(m.committed_as? - m.anon_pages? - swapped - m.shmem.unwrap_or_default())
            }),
            unreclaimable,
            unreclaimable_listed,
            swap_ins,
            refaults,
            alloc_stalls: events(|a| a.vmstat.allocstall, |s| s.stats.alloc_stalls),
            oom_kills: events(|a| a.vmstat.oom_kill, |s| s.stats.oom_kills),
            psi_some_avg10: a.and_then(|a| a.psi).map(|p| p.some.avg10),
            psi_some_stalled: history
                .growth(|s| Some(agent(s)?.psi?.some.total_us))
                .filter(|(_, d)| !d.is_zero())
                .map(|(us, d)| (us as f64 / d.as_micros() as f64 * 100.0).min(100.0)),
            agent_failed: matches!(s.agent, Some(Err(_))),
            interval: history.interval(),
            major_faults_per_s: history.rate(|s| s.stats.major_faults),
            swap_in_per_s: history.rate(|s| s.stats.swap_in.map(|b| b.0)),
            swap_out_per_s: history.rate(|s| s.stats.swap_out.map(|b| b.0)),
        }
    }

    /// What swapping out `x` of its anonymous memory would free of the guest's RAM, its
    /// free swap taking it ([`swap_frees`]); `None` without its agent's figures.
    pub fn swap_frees(&self, x: Bytes) -> Option<Bytes> {
        Some(swap_frees(self.swap_free?, self.zram, x))
    }

    /// What its free swap would keep of the guest's RAM once filled: the compressed copies
    /// of what it swaps to zram (nothing on a disk); `None` without its agent's figures.
    /// Kept free beside what it uses, it lets the guest swap as much of a burst as a disk
    /// as large would take: swapping `x` frees `x` less its copies, and the room holds
    /// the copies.
    pub fn swap_keeps(&self) -> Option<Bytes> {
        let free = self.swap_free?;
        Some(free - swap_frees(free, self.zram, free))
    }

    /// Whether the guest's agent says it has no swap at all: memory it allocates beyond
    /// what it holds is then an OOM kill unless the balloon gives it back first.
    pub fn no_swap(&self) -> bool {
        self.swap_free
            .zip(self.swap_used)
            .is_some_and(|(free, used)| free + used == Bytes::ZERO)
    }

    /// Evidence that the guest is short of memory now: pages faulted back, stalls, OOM
    /// kills. The sum of swap-ins and refaults, in pages, with stalls and kills as flags.
    pub fn faults(&self) -> u64 {
        self.swap_ins
            .unwrap_or(0)
            .saturating_add(self.refaults.unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::stats::VmStat;
    use crate::testkit;

    fn sample(pswpin: u64, refault_file: u64, majflt: u64, swap_total: u64) -> VmSample {
        let mut s = testkit::vm("a", 1024, 1024, 100).sample.unwrap();
        s.stats.major_faults = Some(majflt);
        s.agent = Some(Ok(AgentStats {
            meminfo: MemInfo {
                total: Bytes::from_mib(1000),
                available: Some(Bytes::from_mib(600)),
                committed_as: Some(Bytes::from_mib(300)),
                active_anon: Some(Bytes::from_mib(100)),
                inactive_anon: Some(Bytes::from_mib(50)),
                anon_pages: Some(Bytes::from_mib(120)),
                shmem: Some(Bytes::from_mib(10)),
                slab_unreclaimable: Some(Bytes::from_mib(20)),
                swap_total: Bytes::from_mib(swap_total),
                swap_free: Bytes::from_mib(swap_total),
                ..MemInfo::default()
            },
            vmstat: VmStat {
                pswpin: Some(pswpin),
                workingset_refault_anon: Some(0),
                workingset_refault_file: Some(refault_file),
                ..VmStat::default()
            },
            psi: Some(crate::stats::Psi {
                some: crate::stats::PsiLine {
                    avg10: 9.0,
                    total_us: pswpin.saturating_mul(10_000),
                    ..Default::default()
                },
                full: None,
            }),
            zram: None,
        }));
        s
    }

    #[test]
    fn guest_counters_at_their_limit_saturate_instead_of_overflowing() {
        // A hostile agent reports refault counters that sum past u64::MAX, and swap-ins
        // that add past it too (#18 defect 9: a debug build panicked, release wrapped).
        let mut h = History::new(4);
        for (t, n) in [(1, 0), (2, u64::MAX)] {
            let mut s = sample(n, u64::MAX, 0, 0);
            if let Some(Ok(a)) = &mut s.agent {
                a.vmstat.workingset_refault_anon = Some(n);
            }
            h.push(Duration::from_secs(t), s);
        }
        let signals = Signals::derive(&h);
        assert_eq!(signals.swap_ins, Some(u64::MAX));
        assert_eq!(signals.faults(), u64::MAX);
    }

    #[test]
    fn the_agent_is_preferred_and_counters_become_deltas() {
        let mut h = History::new(10);
        h.push(Duration::from_secs(1), sample(10, 5, 1000, 0));
        h.push(Duration::from_secs(2), sample(14, 9, 5000, 0));
        let s = Signals::derive(&h);
        assert_eq!(
            (s.swap_ins, s.refaults, s.faults()),
            (Some(4), Some(4), 8),
            "refaults, not major faults"
        );
        assert_eq!(s.committed_as, Some(Bytes::from_mib(300)));
        // Committed 300, 120 of it anonymous memory in RAM, none swapped, 10 shmem.
        assert_eq!(s.untouched, Some(Bytes::from_mib(170)));
        assert_eq!(s.available, Some(Bytes::from_mib(600)));
        assert_eq!(
            s.unreclaimable,
            Some(Bytes::from_mib(170)),
            "no swap: anon counts (shmem within it), with unreclaimable slab"
        );
        assert_eq!(s.interval, Some(Duration::from_secs(1)));
        // 40 ms of stall in a 1 s interval: 4%, whatever the lagging 10 s average says.
        assert_eq!(
            (s.psi_some_stalled, s.psi_some_avg10),
            (Some(4.0), Some(9.0))
        );
        let mut h = History::new(10);
        let mut swapping = sample(0, 0, 0, 512);
        if let Some(Ok(a)) = &mut swapping.agent {
            a.meminfo.swap_free = Bytes::from_mib(412);
        }
        h.push(Duration::from_secs(1), swapping);
        let s = Signals::derive(&h);
        assert_eq!(
            s.unreclaimable,
            Some(Bytes::from_mib(20)),
            "with swap, anon can go"
        );
        assert_eq!(s.swap_used, Some(Bytes::from_mib(100)), "512 - 412");
    }

    /// An answered reply, a missed one, an answered one again, whose agent counts one OOM
    /// kill in the second half.
    fn h_samples() -> [VmSample; 3] {
        let mut answered = sample(10, 5, 1000, 0);
        if let Some(Ok(a)) = &mut answered.agent {
            a.vmstat.oom_kill = Some(0);
        }
        let mut missed = sample(12, 6, 1000, 0);
        missed.agent = Some(Err("guest agent: no reply".into()));
        let mut killed = sample(14, 9, 5000, 0);
        if let Some(Ok(a)) = &mut killed.agent {
            a.vmstat.oom_kill = Some(1);
        }
        [answered, missed, killed]
    }

    #[test]
    fn counters_count_from_the_agents_previous_reply_over_a_missed_one() {
        // Before: the reply after a missed one had no delta, and the OOM kill in it was
        // never seen (nor the stalls).
        let mut h = History::new(10);
        for (t, s) in (1..).zip(h_samples()) {
            h.push(Duration::from_secs(t), s);
        }
        let s = Signals::derive(&h);
        assert_eq!(s.oom_kills, Some(1));
        // 40 ms of stall over the 2 s since its previous reply.
        assert_eq!(s.psi_some_stalled, Some(2.0));
        // Where the balloon statistics count kills too, the missed tick was counted from
        // them: the kill it saw is not counted again.
        let mut h = History::new(10);
        let mut kills = 0;
        for (t, mut s) in (1..).zip(h_samples()) {
            if t == 2 {
                kills = 1; // in the tick whose reply was missed
            }
            s.stats.oom_kills = Some(kills);
            h.push(Duration::from_secs(t), s);
            if t == 2 {
                assert_eq!(Signals::derive(&h).oom_kills, Some(1), "from the balloon");
            }
        }
        assert_eq!(Signals::derive(&h).oom_kills, Some(0), "not again");
    }

    /// A 1 GiB guest: 200 MiB free, 400 MiB of page cache, 50 of reclaimable slab, 150 of
    /// anonymous memory (20 of unreclaimable slab among the rest); `edit` changes it.
    fn unreclaimable_mib(swap_free: u64, edit: impl FnOnce(&mut VmSample)) -> Option<u64> {
        guest_1g(swap_free, edit).unreclaimable.map(Bytes::mib)
    }

    /// The signals of `unreclaimable_mib`'s guest.
    fn guest_1g(swap_free: u64, edit: impl FnOnce(&mut VmSample)) -> Signals {
        let mut s = sample(0, 0, 0, 512);
        s.balloon = Some(Bytes::from_mib(1024));
        if let Some(Ok(a)) = &mut s.agent {
            a.meminfo.free = Bytes::from_mib(200);
            a.meminfo.active_file = Some(Bytes::from_mib(300));
            a.meminfo.inactive_file = Some(Bytes::from_mib(100));
            a.meminfo.slab_reclaimable = Some(Bytes::from_mib(50));
            a.meminfo.swap_free = Bytes::from_mib(swap_free);
        }
        edit(&mut s);
        let mut h = History::new(2);
        h.push(Duration::from_secs(1), s);
        Signals::derive(&h)
    }

    #[test]
    fn the_kernels_own_memory_is_never_given_up() {
        // The 224 MiB beside the lists are the kernel's own.
        assert_eq!(
            unreclaimable_mib(512, |_| ()),
            Some(224),
            "anonymous memory goes to swap"
        );
        assert_eq!(
            unreclaimable_mib(100, |_| ()),
            Some(274),
            "what swap cannot take stays"
        );
        assert_eq!(
            unreclaimable_mib(0, |_| ()),
            Some(374),
            "no swap: all of it stays"
        );
    }

    #[test]
    fn the_part_the_lists_name_is_slab_and_anonymous_memory_swap_cannot_take() {
        let listed = |swap_free| guest_1g(swap_free, |_| ()).unreclaimable_listed;
        assert_eq!(listed(512), Some(Bytes::from_mib(20)), "the slab alone");
        assert_eq!(
            listed(100),
            Some(Bytes::from_mib(70)),
            "and the anon beyond swap"
        );
        assert_eq!(listed(0), Some(Bytes::from_mib(170)));
        // Without the page cache's lists nothing else can be told apart: both the same.
        let bare = guest_1g(512, |s| {
            if let Some(Ok(a)) = &mut s.agent {
                a.meminfo.active_file = None;
            }
        });
        assert_eq!(bare.unreclaimable, bare.unreclaimable_listed);
    }

    #[test]
    fn swap_on_zram_is_room_only_for_what_it_frees() {
        use crate::stats::ZramSwap;
        // 150 MiB of anonymous memory; `free` MiB of its free swap on zram.
        let zram = |free: u64, stored: u64, used: u64| {
            move |s: &mut VmSample| {
                if let Some(Ok(a)) = &mut s.agent {
                    a.zram = Some(ZramSwap {
                        free: Bytes::from_mib(free),
                        stored: Bytes::from_mib(stored),
                        used: Bytes::from_mib(used),
                    });
                }
            }
        };
        // 100 MiB of free swap.
        assert_eq!(
            unreclaimable_mib(100, |_| ()),
            Some(274),
            "on a disk: 100 go"
        );
        // On zram compressing 3:1, swapping frees 2/3 of what it moves.
        assert_eq!(unreclaimable_mib(100, zram(100, 300, 100)), Some(307));
        // Storing too little to tell, half assumed; not compressing at all, nothing freed.
        assert_eq!(unreclaimable_mib(100, zram(100, 1, 1)), Some(324));
        assert_eq!(unreclaimable_mib(100, zram(100, 300, 400)), Some(374));
        // Free zram larger than the anonymous memory (zram-generator sizes it as RAM):
        // all 150 MiB can go, their compressed 50 MiB stay.
        assert_eq!(unreclaimable_mib(512, |_| ()), Some(224), "on a disk");
        assert_eq!(unreclaimable_mib(512, zram(512, 300, 100)), Some(274));
        // zram first, then the disk: 100 MiB of 512 free on zram.
        let mut s = sample(0, 0, 0, 512);
        zram(100, 300, 100)(&mut s);
        let mut h = History::new(2);
        h.push(Duration::from_secs(1), s);
        let signals = Signals::derive(&h);
        assert_eq!(
            signals.swap_free,
            Some(Bytes::from_mib(512)),
            "SwapFree as told"
        );
        let frees = |mib| signals.swap_frees(Bytes::from_mib(mib)).map(Bytes::mib);
        assert_eq!(frees(60), Some(40));
        assert_eq!(frees(300), Some(266), "66 of 100 on zram, 200 on the disk");
        assert_eq!(frees(1000), Some(478), "all free swap taken");
        assert_eq!(Signals::default().swap_frees(Bytes::from_mib(1)), None);
        // Filled, its zram would keep a third of its 100 MiB; the disk keeps nothing.
        assert_eq!(signals.swap_keeps().map(Bytes::mib), Some(33));
        let disk = Signals::derive(&{
            let mut h = History::new(2);
            h.push(Duration::from_secs(1), sample(0, 0, 0, 512));
            h
        });
        assert_eq!(disk.swap_keeps(), Some(Bytes::ZERO));
        assert_eq!(Signals::default().swap_keeps(), None);
    }

    #[test]
    fn figures_read_apart_or_memory_not_onlined_never_count_against_the_guest() {
        // The balloon read before a 300 MiB deflate, the guest's figures after it: its
        // size looks 300 MiB smaller than what its figures describe, and only slab and
        // anonymous memory count.
        let torn = |s: &mut VmSample| s.balloon = Some(Bytes::from_mib(724));
        assert_eq!(unreclaimable_mib(0, torn), Some(170));
        // 512 MiB plugged through virtio-mem, 256 of it never onlined: not the guest's.
        let plugged = |offline: Option<u64>| {
            move |s: &mut VmSample| {
                s.balloon = Some(Bytes::from_mib(1536));
                s.virtio_mem = Some(crate::snapshot::VirtioMem {
                    plugged: Bytes::from_mib(512),
                    requested: Bytes::from_mib(512),
                    max: Bytes::from_mib(1024),
                    offline: offline.map(Bytes::from_mib),
                });
                if let Some(Ok(a)) = &mut s.agent {
                    a.meminfo.free = Bytes::from_mib(456);
                }
            }
        };
        assert_eq!(unreclaimable_mib(512, plugged(Some(256))), Some(224));
        assert_eq!(
            unreclaimable_mib(512, plugged(None)),
            Some(20),
            "offline unknown: slab and anonymous memory beyond swap only"
        );
        // A guest that leaves out its page cache's lists claims at most its size.
        let hostile = |s: &mut VmSample| {
            if let Some(Ok(a)) = &mut s.agent {
                a.meminfo.active_file = None;
                a.meminfo.active_anon = Some(Bytes(u64::MAX));
            }
        };
        assert_eq!(unreclaimable_mib(0, hostile), Some(1024));
    }

    #[test]
    fn without_an_agent_major_faults_stand_in_for_refaults() {
        let mut h = History::new(10);
        for (t, majflt) in [(1, 100), (2, 130)] {
            let mut s = testkit::vm("a", 1024, 1024, 100).sample.unwrap();
            s.stats.major_faults = Some(majflt);
            s.stats.swap_in = Some(Bytes(PAGE * t));
            h.push(Duration::from_secs(t), s);
        }
        let s = Signals::derive(&h);
        assert_eq!(
            (s.refaults, s.swap_ins, s.committed_as),
            (Some(30), Some(1), None)
        );
    }

    #[test]
    fn a_failed_agent_read_falls_back_to_balloon_stats() {
        let mut s = testkit::vm("a", 1024, 1024, 100).sample.unwrap();
        s.stats.available = Some(Bytes::from_mib(700));
        s.agent = Some(Err("guest agent: no reply".into()));
        let mut h = History::new(10);
        h.push(Duration::ZERO, s);
        let sig = Signals::derive(&h);
        assert_eq!(
            (sig.available, sig.committed_as, sig.unreclaimable),
            (Some(Bytes::from_mib(700)), None, None)
        );
        assert!(
            sig.agent_failed,
            "the estimators must know the figures are missing"
        );
        let mut h = History::new(10);
        h.push(
            Duration::ZERO,
            testkit::vm("b", 1024, 1024, 100).sample.unwrap(),
        );
        assert!(
            !Signals::derive(&h).agent_failed,
            "no agent configured is no failure"
        );
    }
}
