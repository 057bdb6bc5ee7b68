//! Invariants of the memory model, under random workloads, balloon targets and host
//! pressure: every page is accounted for once, nothing is negative, the balloon and the
//! guest's host footprint never exceed its RAM, and the host never holds more than it has.

use memtide_sim::guest::{pages, Guest, GuestParams};
use memtide_sim::host::Host;
use memtide_sim::rng::Rng;
use memtide_sim::scenario::Costs;
use memtide_sim::workload::Demand;
use memtide_sim::world::World;
use memtide_sim::Scenario;
use proptest::prelude::*;

/// One thing that can happen to a guest.
#[derive(Clone, Debug)]
enum Op {
    Run {
        anon: u64,
        file: u64,
        idle: u64,
        restart: bool,
        stopped: bool,
    },
    Target(u64),
    HostEvict(u64),
    Reboot,
}

fn op(ram: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..ram * 2, 0..ram, 0..ram, any::<bool>(), prop::bool::weighted(0.1)).prop_map(
            |(anon, file, idle, restart, stopped)| Op::Run { anon, file, idle, restart, stopped }
        ),
        2 => (0..=ram).prop_map(Op::Target),
        2 => (0..ram).prop_map(Op::HostEvict),
        1 => Just(Op::Reboot),
    ]
}

fn check(g: &Guest) {
    g.check().unwrap();
    let ram = g.params().configured;
    assert!(g.balloon <= ram, "balloon above RAM");
    assert!(g.host_resident() <= ram, "host footprint above RAM");
    assert!(g.host_resident() + g.host_swapped() <= ram);
    assert!(g.actual() >= g.kernel.pages);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn guest_memory_is_conserved(
        ram_mib in 64u64..2048,
        swap_mib in 0u64..1024,
        hot in 1u32..=100,
        seed in any::<u64>(),
        ops in prop::collection::vec(op(pages(2048.0)), 1..60),
    ) {
        let params = GuestParams {
            configured: pages(ram_mib as f64),
            kernel: pages(ram_mib as f64 / 8.0),
            swap: pages(swap_mib as f64),
            untouched_commit: 0,
            kernel_shareable: 0.5,
            idle_shareable: 0.3,
            hot: f64::from(hot) / 100.0,
            hot_access: 0.9,
            base_pages_s: pages(512.0) as f64,
            deflate_on_oom: false,
            free_page_reporting: false,
            zram: None,
        };
        let ram = params.configured;
        let mut g = Guest::boot(params, Rng::new(seed));
        let costs = Costs::default();
        for op in ops {
            match op {
                Op::Run { anon, file, idle, restart, stopped } => {
                    let d = Demand { anon: anon % (2 * ram), file: file % ram, idle: idle % ram, heap: 0, restart, stopped };
                    g.step(1.0, &d, &costs);
                    prop_assert!(g.last.touched >= 0.0);
                }
                Op::Target(t) => g.set_target(t % (ram + 1)),
                Op::HostEvict(n) => {
                    let before = g.host_resident();
                    let out = g.host_evict(n);
                    prop_assert_eq!(g.host_resident(), before - out);
                }
                Op::Reboot => g.reboot(),
            }
            check(&g);
        }
    }

    #[test]
    fn the_host_never_holds_more_than_it_has(
        vms in 1usize..6,
        host_mib in 1024u64..6144,
        host_swap_mib in prop::sample::select(vec![0u64, 512, 4096]),
        seed in any::<u64>(),
        targets in prop::collection::vec((0usize..6, 64u64..1024), 0..40),
    ) {
        let text = format!(r#"
            name = "p"
            ticks = 60
            [host]
            memory_mib = {host_mib}
            reserved_mib = 256
            swap_mib = {host_swap_mib}
            cache_mib = 128
            [[vm]]
            name = "vm"
            count = {vms}
            memory_mib = 1024
            [vm.workload]
            anon = {{ kind = "walk", min_mib = 100, max_mib = 900, step_mib = 100, every_s = 3 }}
            file = {{ kind = "wave", min_mib = 0, max_mib = 300, period_s = 20, random_phase = true }}
            idle_mib = 100
            shareable_pct = 50
        "#);
        let scenario = Scenario::from_toml(&text).unwrap();
        let mut world = World::new(&scenario, seed);
        world.host.apply_ksm(&memtide_core::action::KsmSettings {
            run: Some(1),
            pages_to_scan: Some(5000),
            sleep_millisecs: Some(10),
            merge_across_nodes: None,
        });
        let mut targets = targets.into_iter();
        for _ in 0..60 {
            if let Some((i, mib)) = targets.next() {
                if i < vms {
                    world.guests[i].set_target(pages(mib as f64));
                }
            }
            world.advance(1.0);
            let used = world.host.reserved() + world.host.cache + world.host.guests_resident(&world.guests);
            prop_assert!(used <= world.host.total(), "host holds {used} of {}", world.host.total());
            prop_assert!(Host::swap_used(&world.guests) <= pages(host_swap_mib as f64));
            for g in &world.guests {
                check(g);
            }
        }
    }
}
