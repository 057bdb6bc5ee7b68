//! Builders for snapshots, for tests (enabled by the `testkit` feature).

use crate::action::Reason;
use crate::policy::ksmtuned::KsmConfig;
use crate::policy::mom::{Mom, MomConfig};
use crate::policy::{Policy, PolicyInput, PolicyOutput, Proposal};
use crate::snapshot::{Snapshot, VmLimits, VmSample, VmSnapshot};
use crate::stats::{
    DomainScope, GuestStats, HostStats, KsmState, MemInfo, MemoryDomain, SwapRoom, VmStat,
};
use crate::units::Bytes;
use std::time::Duration;

/// A host whose whole memory is the domain, with `freeable_mib` of `total_mib` freeable
/// and KSM stopped at the kernel's defaults.
pub fn host(total_mib: u64, freeable_mib: u64) -> HostStats {
    let total = Bytes::from_mib(total_mib);
    let freeable = Bytes::from_mib(freeable_mib);
    HostStats {
        meminfo: MemInfo {
            total,
            free: freeable,
            ..MemInfo::default()
        },
        vmstat: VmStat::default(),
        psi: None,
        ksm: Some(KsmState {
            pages_to_scan: 100,
            sleep_millisecs: 20,
            ..KsmState::default()
        }),
        domain: MemoryDomain {
            scope: DomainScope::Host,
            total,
            used: total - freeable,
            freeable,
            kept_free: Bytes::ZERO,
            swap_room: SwapRoom::Unknown,
        },
        swap_free_in_ram: Bytes::ZERO,
        other_managers: Vec::new(),
    }
}

/// A ballooned VM of `configured_mib`, currently `actual_mib`, whose guest reports
/// `free_mib` free; min 64 MiB, max its configured size.
pub fn vm(name: &str, configured_mib: u64, actual_mib: u64, free_mib: u64) -> VmSnapshot {
    VmSnapshot {
        name: name.to_string(),
        limits: VmLimits {
            min: Bytes::from_mib(64),
            max: Bytes::from_mib(configured_mib),
            shares: 1000,
        },
        target: None,
        sample: Ok(VmSample {
            ram_mappings: Vec::new(),
            configured: Bytes::from_mib(configured_mib),
            balloon: Some(Bytes::from_mib(actual_mib)),
            stats: GuestStats {
                free: Some(Bytes::from_mib(free_mib)),
                total: Some(Bytes::from_mib(actual_mib)),
                // Undated, as a fixture reused at any time must be (a fixed date would
                // make its statistics stale).
                last_update: None,
                ..GuestStats::default()
            },
            agent: None,
            rss: None,
            swapped: None,
            cpu_s: None,
            referenced: None,
            cold: None,
            virtio_mem: None,
            free_page_reporting: false,
            fixed: None,
            events: Vec::new(),
        }),
    }
}

/// A snapshot at `at_s` seconds.
pub fn snapshot(at_s: u64, host: HostStats, vms: Vec<VmSnapshot>) -> Snapshot {
    Snapshot {
        at: Duration::from_secs(at_s),
        host,
        vms,
    }
}

/// A policy that asks every VM it sees for the same size, with the reason `fixed: test`.
pub struct Fixed(pub Bytes);

impl Policy for Fixed {
    fn name(&self) -> &str {
        "fixed"
    }

    fn decide(&mut self, input: &PolicyInput<'_>) -> PolicyOutput {
        let mut out = PolicyOutput::default();
        for vm in input.vms {
            let proposal = Proposal {
                target: self.0,
                reason: Reason::new("fixed", "test"),
            };
            out.balloon.insert(vm.name.to_string(), proposal);
        }
        out
    }
}

/// MOM evaluating at every tick (not every 10 s, as MOM does) on the engine's history
/// (not its own samples every 5 s), for tests that follow the engine tick by tick.
pub fn mom_every_tick() -> Box<Mom> {
    let balloon = MomConfig {
        interval_s: 0.0,
        sample_interval_s: 0.0,
        ..MomConfig::default()
    };
    Box::new(Mom::new(balloon, KsmConfig::default()))
}
