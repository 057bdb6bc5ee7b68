//! A guest can report anything: arbitrary agent figures and balloon sizes, tick after
//! tick, must never panic the engine under any built-in policy (#18 defect 9), and a
//! balloon size beyond the configured one is bounded and reported.

use memtide_core::estimate::fused::FusedConfig;
use memtide_core::estimate::sampled::SampledConfig;
use memtide_core::estimate::selfballoon::SelfBalloonConfig;
use memtide_core::estimate::tws::TwsConfig;
use memtide_core::policy::esx::{Esx, EsxConfig};
use memtide_core::policy::ksmtuned::KsmConfig;
use memtide_core::policy::mom::Mom;
use memtide_core::policy::none::Unmanaged;
use memtide_core::policy::proxmox::{Proxmox, ProxmoxConfig};
use memtide_core::policy::working_set::{EstimatorConfig, WorkingSet, WorkingSetConfig};
use memtide_core::policy::Policy;
use memtide_core::stats::{AgentStats, MemInfo, Psi, PsiLine, VmStat, ZramSwap};
use memtide_core::testkit::{host, mom_every_tick, snapshot, vm};
use memtide_core::{Bytes, DiagnosticKind, Engine, EngineConfig};
use proptest::prelude::*;

fn policies() -> Vec<Box<dyn Policy>> {
    let ws = |e| -> Box<dyn Policy> {
        Box::new(WorkingSet::new(
            e,
            WorkingSetConfig::default(),
            KsmConfig::default(),
        ))
    };
    vec![
        ws(EstimatorConfig::Fused(FusedConfig::default())),
        ws(EstimatorConfig::Tws(TwsConfig::default())),
        ws(EstimatorConfig::SelfBalloon(SelfBalloonConfig::default())),
        ws(EstimatorConfig::Sampled(SampledConfig::default())),
        Box::new(Esx::new(EsxConfig::default(), KsmConfig::default())),
        // Evaluating at every tick, not every 10 s: its averages over the hostile
        // figures of several ticks are what is tried.
        mom_every_tick(),
        Box::new(Proxmox::new(ProxmoxConfig::default(), KsmConfig::default())),
        Box::new(Unmanaged),
    ]
}

/// An agent report made of arbitrary numbers.
fn agent(n: &[u64; 12], avg: f64, zram: Option<[u64; 3]>) -> AgentStats {
    let b = Bytes;
    AgentStats {
        meminfo: MemInfo {
            total: b(n[0]),
            free: b(n[1]),
            available: Some(b(n[2])),
            cached: b(n[3]),
            swap_total: b(n[4]),
            swap_free: b(n[5]),
            committed_as: Some(b(n[6])),
            active_anon: Some(b(n[7])),
            inactive_anon: Some(b(n[8])),
            active_file: Some(b(n[9])),
            ..MemInfo::default()
        },
        vmstat: VmStat {
            pswpin: Some(n[10]),
            workingset_refault_anon: Some(n[11]),
            workingset_refault_file: Some(n[10]),
            oom_kill: Some(n[11]),
            allocstall: Some(n[10]),
            ..VmStat::default()
        },
        psi: Some(Psi {
            some: PsiLine {
                avg10: avg,
                total_us: n[11],
                ..PsiLine::default()
            },
            full: None,
        }),
        // Any zram at all, or none.
        zram: zram.map(|[free, stored, used]| ZramSwap {
            free: Bytes(free),
            stored: Bytes(stored),
            used: Bytes(used),
        }),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn arbitrary_agent_figures_and_balloon_sizes_never_panic_a_policy(
        ticks in proptest::collection::vec(
            (
                proptest::array::uniform12(any::<u64>()),
                any::<u64>(),
                -1e9f64..1e9,
                proptest::option::of(proptest::array::uniform3(any::<u64>())),
            ),
            2..4,
        ),
    ) {
        for policy in policies() {
            let mut engine = Engine::new(EngineConfig::default(), policy);
            for (t, (figures, actual, avg, zram)) in ticks.iter().enumerate() {
                let mut liar = vm("liar", 1024, 512, 100);
                let s = liar.sample.as_mut().unwrap();
                s.balloon = Some(Bytes(*actual));
                s.agent = Some(Ok(agent(figures, *avg, *zram)));
                let vms = vec![liar, vm("honest", 1024, 800, 300)];
                engine.tick(&snapshot(t as u64, host(4096, 1000), vms));
            }
        }
    }
}

#[test]
fn a_balloon_size_beyond_the_configured_one_is_bounded_and_reported() {
    let mut engine = Engine::new(EngineConfig::default(), Box::<Mom>::default());
    let mut liar = vm("liar", 1024, 512, 100);
    liar.sample.as_mut().unwrap().balloon = Some(Bytes(1 << 50));
    let d = engine.tick(&snapshot(0, host(4096, 1000), vec![liar]));
    let report = d.vms.iter().find(|v| v.name == "liar").unwrap();
    assert_eq!(report.actual, Some(Bytes::from_mib(1024)));
    assert!(d
        .diagnostics
        .iter()
        .any(|x| x.kind == DiagnosticKind::ImplausibleStats && x.message.contains("1.0 GiB")));
}
