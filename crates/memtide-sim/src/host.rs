//! The host: machine memory shared by the guests, host swap and KSM.
//!
//! The host sees each guest as the pages it backs. When they do not fit, it drops its own
//! page cache, then swaps out guest pages chosen at random: it cannot see which pages a
//! guest uses, so hot working-set pages go as readily as free ones (the guest pays with
//! host swap-ins when it touches them). When host swap is full too, the host's OOM killer
//! kills the VM with the most resident memory (the VM restarts). KSM merges identical
//! idle pages across guests at the rate its knobs allow.

use crate::guest::{bytes, pages, Guest};
use crate::pressure::Pressure;
use crate::rng::Rng;
use crate::scenario::HostSpec;
use memtide_core::action::KsmSettings;
use memtide_core::stats::{
    DomainScope, HostStats, KsmState, MemInfo, MemoryDomain, Psi, SwapRoom, VmStat,
};
use memtide_core::units::Bytes;

/// Cumulative host counters.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HostCounters {
    /// Guest pages read back from host swap.
    pub swap_in: u64,
    /// Guest pages written to host swap.
    pub swap_out: u64,
    /// VMs killed because host memory and swap ran out.
    pub oom_kills: u64,
}

/// KSM's knobs and what it has merged.
#[derive(Clone, Debug, PartialEq)]
struct Ksm {
    run: u64,
    pages_to_scan: u64,
    sleep_millisecs: u64,
    merge_across_nodes: u64,
    /// Merged pages per guest.
    merged: Vec<u64>,
    /// Their sum.
    merged_total: u64,
    full_scans: f64,
    /// Distinct merged pages kept (pages_shared).
    shared: u64,
    /// Pages saved by merging (pages_sharing).
    sharing: u64,
    unshared: u64,
    volatile: u64,
}

/// The host's memory.
#[derive(Clone, Debug)]
pub struct Host {
    total: u64,
    reserved: u64,
    swap: u64,
    min_free: u64,
    cache_max: u64,
    /// Host page cache now (pages).
    pub cache: u64,
    ksm: Option<Ksm>,
    /// vCPUs waiting on host memory (host swap-ins, first touches).
    pressure: Pressure,
    /// Counters since the start.
    pub counters: HostCounters,
    rng: Rng,
}

impl Host {
    /// A host as described, with `guests` VMs; KSM (when present) at the kernel's defaults.
    pub fn new(spec: &HostSpec, guests: usize, rng: Rng) -> Self {
        let ksm = spec.ksm.then(|| Ksm {
            run: 0,
            pages_to_scan: 100,
            sleep_millisecs: 20,
            merge_across_nodes: 1,
            merged: vec![0; guests],
            merged_total: 0,
            full_scans: 0.0,
            shared: 0,
            sharing: 0,
            unshared: 0,
            volatile: 0,
        });
        Host {
            total: pages(spec.memory_mib),
            reserved: pages(spec.reserved_mib),
            swap: pages(spec.swap_mib),
            min_free: pages(spec.min_free_mib),
            cache_max: pages(spec.cache_mib),
            cache: 0,
            ksm,
            pressure: Pressure::default(),
            counters: HostCounters::default(),
            rng,
        }
    }

    /// Machine memory (pages).
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Memory the host itself uses (pages).
    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    /// Pages KSM saves now.
    pub fn ksm_saved(&self) -> u64 {
        self.ksm.as_ref().map_or(0, |k| k.sharing)
    }

    /// Pages KSM saves that are counted to guest `i` (its share of the merged pages).
    pub fn ksm_saved_by(&self, i: usize) -> u64 {
        self.ksm.as_ref().map_or(0, |k| {
            if k.merged_total == 0 {
                0
            } else {
                (k.sharing as f64 * k.merged[i] as f64 / k.merged_total as f64) as u64
            }
        })
    }

    /// Memory the guests occupy in host RAM, after KSM's savings (pages).
    pub fn guests_resident(&self, guests: &[Guest]) -> u64 {
        let resident: u64 = guests.iter().map(Guest::host_resident).sum();
        resident.saturating_sub(self.ksm_saved())
    }

    /// Free machine memory (pages).
    pub fn free(&self, guests: &[Guest]) -> u64 {
        self.total
            .saturating_sub(self.reserved + self.cache + self.guests_resident(guests))
    }

    /// Guest pages in host swap.
    pub fn swap_used(guests: &[Guest]) -> u64 {
        guests.iter().map(Guest::host_swapped).sum()
    }

    /// Account for the guests' last tick, merge with KSM, and reclaim host memory until
    /// the guests fit: drop cache, swap out random guest pages, and as a last resort kill
    /// the largest VM. Returns the indices of the VMs killed (they have been rebooted).
    pub fn settle(&mut self, guests: &mut [Guest], dt: f64) -> Vec<usize> {
        let stall_us: f64 = guests.iter().map(|g| g.last.host_stall_us).sum();
        self.counters.swap_in += guests.iter().map(|g| g.last.host_swap_in).sum::<u64>();
        self.pressure.record(stall_us, dt);
        self.ksm_scan(guests, dt);

        let avail = self.total - self.reserved - self.min_free;
        let mut killed = Vec::new();
        loop {
            self.ksm_clamp(guests);
            let used = self.guests_resident(guests);
            if used <= avail {
                self.cache = self.cache_max.min(avail - used);
                break;
            }
            self.cache = 0;
            let excess = used - avail;
            let room = self.swap.saturating_sub(Self::swap_used(guests));
            let n = excess.min(room);
            if n > 0 {
                self.evict(guests, n);
                if n == excess {
                    continue;
                }
            }
            // Nothing left to swap to: the OOM killer takes the largest VM (once per VM
            // at most: freshly booted guests that still do not fit stay).
            if killed.len() >= guests.len() {
                break;
            }
            let Some(victim) = (0..guests.len()).max_by_key(|&i| (guests[i].host_resident(), i))
            else {
                break;
            };
            guests[victim].reboot();
            if let Some(k) = self.ksm.as_mut() {
                k.merged[victim] = 0;
            }
            self.counters.oom_kills += 1;
            killed.push(victim);
        }
        killed
    }

    /// Swap out `n` guest pages at random across all guests.
    fn evict(&mut self, guests: &mut [Guest], n: u64) {
        let total: u64 = guests.iter().map(Guest::host_resident).sum();
        let n = n.min(total);
        let (mut left, mut left_total) = (n, total);
        for g in guests.iter_mut() {
            let hr = g.host_resident();
            let k = self
                .rng
                .share(left, hr, left_total)
                .max(left.saturating_sub(left_total - hr));
            g.host_evict(k);
            left -= k;
            left_total -= hr;
        }
        self.counters.swap_out += n;
    }

    /// One tick of ksmd: merge part of what can be merged, at the rate of its knobs.
    fn ksm_scan(&mut self, guests: &[Guest], dt: f64) {
        let Some(k) = self.ksm.as_mut() else {
            return;
        };
        if k.run == 2 {
            k.merged.iter_mut().for_each(|m| *m = 0);
        }
        if k.run != 1 {
            return;
        }
        let scannable: u64 = guests.iter().map(Guest::host_resident).sum();
        if scannable == 0 {
            return;
        }
        let scanned = k.pages_to_scan as f64 * dt * 1000.0 / k.sleep_millisecs.max(1) as f64;
        let share = (scanned / scannable as f64).min(1.0);
        k.full_scans += scanned / scannable as f64;
        for (merged, g) in k.merged.iter_mut().zip(guests) {
            let can = g.shareable();
            if can > *merged {
                *merged += self.rng.round((can - *merged) as f64 * share);
            }
        }
    }

    /// Pages written or freed since they were merged are merged no more.
    fn ksm_clamp(&mut self, guests: &[Guest]) {
        let Some(k) = self.ksm.as_mut() else {
            return;
        };
        let mut total = 0;
        let mut largest = 0;
        for (merged, g) in k.merged.iter_mut().zip(guests) {
            *merged = (*merged).min(g.shareable());
            total += *merged;
            largest = largest.max(*merged);
        }
        // Guests of one image hold the same contents: the largest set is kept once.
        k.merged_total = total;
        k.shared = largest;
        k.sharing = total - largest;
        k.volatile = guests
            .iter()
            .map(|g| g.anon_ws.host_resident() + g.file_ws.host_resident())
            .sum();
        let resident: u64 = guests.iter().map(Guest::host_resident).sum();
        k.unshared = resident.saturating_sub(total + k.volatile);
    }

    /// Write KSM knobs.
    pub fn apply_ksm(&mut self, s: &KsmSettings) {
        if let Some(k) = self.ksm.as_mut() {
            k.run = s.run.unwrap_or(k.run);
            k.pages_to_scan = s.pages_to_scan.unwrap_or(k.pages_to_scan);
            k.sleep_millisecs = s.sleep_millisecs.unwrap_or(k.sleep_millisecs);
            k.merge_across_nodes = s.merge_across_nodes.unwrap_or(k.merge_across_nodes);
        }
    }

    /// The statistics a real host would show (/proc/meminfo, /proc/vmstat, PSI, KSM).
    pub fn stats(&self, guests: &[Guest]) -> HostStats {
        let free = self.free(guests);
        let swapped = Self::swap_used(guests);
        let first_touch: u64 = guests.iter().map(|g| g.counters.host_first_touch).sum();
        let total = bytes(self.total);
        let freeable = bytes(free + self.cache);
        let configured: u64 = guests.iter().map(|g| g.params().configured).sum();
        HostStats {
            meminfo: MemInfo {
                total,
                free: bytes(free),
                available: Some(freeable),
                buffers: Bytes::ZERO,
                cached: bytes(self.cache),
                swap_total: bytes(self.swap),
                swap_free: bytes(self.swap.saturating_sub(swapped)),
                anon_pages: Some(bytes(self.guests_resident(guests))),
                committed_as: Some(bytes(self.reserved + configured)),
                ..MemInfo::default()
            },
            vmstat: VmStat {
                pswpin: Some(self.counters.swap_in),
                pswpout: Some(self.counters.swap_out),
                pgmajfault: Some(self.counters.swap_in),
                pgfault: Some(self.counters.swap_in + first_touch),
                workingset_refault_anon: Some(self.counters.swap_in),
                workingset_refault_file: Some(0),
                oom_kill: Some(self.counters.oom_kills),
                allocstall: None,
            },
            psi: Some(Psi {
                some: self.pressure.line(),
                full: None,
            }),
            ksm: self.ksm.as_ref().map(|k| KsmState {
                run: k.run,
                pages_to_scan: k.pages_to_scan,
                sleep_millisecs: k.sleep_millisecs,
                pages_shared: k.shared,
                pages_sharing: k.sharing,
                pages_unshared: k.unshared,
                pages_volatile: k.volatile,
                full_scans: k.full_scans as u64,
                merge_across_nodes: Some(k.merge_across_nodes),
                // Each page KSM tracks costs an rmap item (about 64 bytes), merged or
                // not.
                general_profit: Some(
                    bytes(k.sharing).0 as i64
                        - 64 * (k.shared + k.sharing + k.unshared + k.volatile) as i64,
                ),
                ksm_zero_pages: None,
                advisor: None,
            }),
            domain: MemoryDomain {
                scope: DomainScope::Host,
                total,
                used: total - freeable,
                freeable,
                kept_free: bytes(self.min_free),
                swap_room: SwapRoom::Unknown,
            },
            swap_free_in_ram: Bytes::ZERO,
            other_managers: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest::GuestParams;
    use crate::scenario::Costs;
    use crate::workload::Demand;

    fn spec(memory_mib: f64, swap_mib: f64) -> HostSpec {
        HostSpec {
            memory_mib,
            reserved_mib: 0.0,
            swap_mib,
            min_free_mib: 0.0,
            cache_mib: 0.0,
            ksm: true,
            deflate_on_oom: false,
            free_page_reporting: false,
        }
    }

    fn guests(n: usize, anon_mib: f64) -> Vec<Guest> {
        (0..n)
            .map(|i| {
                let mut g = Guest::boot(
                    GuestParams {
                        configured: pages(1024.0),
                        kernel: pages(64.0),
                        swap: pages(256.0),
                        untouched_commit: 0,
                        kernel_shareable: 1.0,
                        idle_shareable: 0.0,
                        hot: 1.0,
                        hot_access: 1.0,
                        base_pages_s: 1e6,
                        deflate_on_oom: false,
                        free_page_reporting: false,
                        zram: None,
                    },
                    Rng::new(i as u64),
                );
                let d = Demand {
                    anon: pages(anon_mib),
                    ..Demand::default()
                };
                g.step(1.0, &d, &Costs::default());
                g
            })
            .collect()
    }

    #[test]
    fn overcommitted_guests_are_swapped_to_fit() {
        let mut gs = guests(4, 600.0);
        let mut host = Host::new(&spec(2048.0, 4096.0), 4, Rng::new(9));
        assert!(host.settle(&mut gs, 1.0).is_empty());
        assert!(host.guests_resident(&gs) <= pages(2048.0));
        assert_eq!(Host::swap_used(&gs), pages(4.0 * 664.0 - 2048.0));
        assert_eq!(host.counters.swap_out, Host::swap_used(&gs));
        for g in &gs {
            g.check().unwrap();
        }
    }

    #[test]
    fn without_swap_the_largest_vm_is_killed() {
        let mut gs = guests(3, 600.0);
        gs[1].step(
            1.0,
            &Demand {
                anon: pages(800.0),
                ..Demand::default()
            },
            &Costs::default(),
        );
        let mut host = Host::new(&spec(1800.0, 0.0), 3, Rng::new(9));
        assert_eq!(host.settle(&mut gs, 1.0), vec![1]);
        assert_eq!(gs[1].host_resident(), pages(64.0));
        assert_eq!(host.counters.oom_kills, 1);
    }

    #[test]
    fn ksm_merges_shareable_pages_while_running() {
        let mut gs = guests(4, 100.0);
        let mut host = Host::new(&spec(8192.0, 0.0), 4, Rng::new(9));
        host.settle(&mut gs, 1.0);
        assert_eq!(host.ksm_saved(), 0, "ksmd is stopped by default");
        host.apply_ksm(&KsmSettings {
            run: Some(1),
            pages_to_scan: Some(1250),
            sleep_millisecs: Some(10),
            merge_across_nodes: None,
        });
        for _ in 0..100 {
            host.settle(&mut gs, 1.0);
        }
        // Four kernels of 64 MiB, identical: three are saved.
        let saved = host.ksm_saved();
        assert!(saved > pages(180.0) && saved <= pages(192.0), "{}", saved);
        let stats = host.stats(&gs);
        assert_eq!(stats.ksm.unwrap().pages_sharing, saved);
    }
}
