//! The simulator's scale measurement: run a scenario (by default `fleet-1000`, 1000 VMs
//! for 3600 one-second ticks) under one policy and print the wall time as JSON.
//!
//! cargo build --release -p memtide-sim --example scale
//! taskset -c 1 target/release/examples/scale [SCENARIO] [memtide|mom|none|model] [--ticks N]
//!
//! `model` runs the simulated world alone, sampled through the backends every tick as
//! the engine would be, but with no engine: the simulator's own share of the time.

use futures::FutureExt;
use memtide_core::backend::{HostBackend, VmBackend};
use memtide_core::estimate::fused::FusedConfig;
use memtide_core::policy::ksmtuned::KsmConfig;
use memtide_core::policy::mom::Mom;
use memtide_core::policy::none::Unmanaged;
use memtide_core::policy::working_set::{EstimatorConfig, WorkingSet, WorkingSetConfig};
use memtide_core::policy::Policy;
use memtide_core::EngineConfig;
use memtide_sim::backend::{SimHost, SimVm};
use memtide_sim::world::World;
use memtide_sim::{run, Scenario};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Advance the world and sample every VM and the host each tick, without an engine.
fn model_only(scenario: &Scenario) -> f64 {
    let start = Instant::now();
    let world = World::new(scenario, scenario.seed);
    let n = world.guests.len();
    let world = Arc::new(Mutex::new(world));
    let mut host = SimHost::new(world.clone());
    let mut vms: Vec<SimVm> = (0..n).map(|i| SimVm::new(world.clone(), i)).collect();
    let mut checksum = 0u64;
    for _ in 0..scenario.ticks {
        world.lock().unwrap().advance(scenario.tick_s);
        checksum ^= host.sample().unwrap().meminfo.free.0;
        for vm in &mut vms {
            let sample = vm.sample().now_or_never().unwrap().unwrap();
            checksum ^= sample.stats.free.map_or(0, |b| b.0);
        }
    }
    std::hint::black_box(checksum);
    start.elapsed().as_secs_f64()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut positional = args.iter().filter(|a| !a.starts_with("--"));
    let name = positional.next().map_or("fleet-1000", |s| s.as_str());
    let policy_name = positional.next().map_or("mom", |s| s.as_str());
    let mut scenario = Scenario::builtin(name)?;
    if let Some(i) = args.iter().position(|a| a == "--ticks") {
        scenario.ticks = args.get(i + 1).ok_or("--ticks needs a value")?.parse()?;
    }
    if policy_name == "model" {
        let wall_s = model_only(&scenario);
        let vm_ticks = scenario.expand().len() as f64 * scenario.ticks as f64;
        let out = serde_json::json!({
            "scenario": scenario.name,
            "policy": "model only (no engine)",
            "vms": scenario.expand().len(),
            "ticks": scenario.ticks,
            "wall_s": wall_s,
            "us_per_vm_tick": wall_s * 1e6 / vm_ticks,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    let policy: Box<dyn Policy> = match policy_name {
        "mom" => Box::new(Mom::default()),
        "none" => Box::new(Unmanaged),
        "memtide" => Box::new(WorkingSet::new(
            EstimatorConfig::Fused(FusedConfig::default()),
            WorkingSetConfig::default(),
            KsmConfig::default(),
        )),
        other => return Err(format!("unknown policy {other}").into()),
    };
    let seed = scenario.seed;
    let report = run(&scenario, policy, EngineConfig::default(), seed);
    let s = &report.summary;
    let vm_ticks = s.vms as f64 * s.ticks as f64;
    let out = serde_json::json!({
        "scenario": s.scenario,
        "policy": s.policy,
        "vms": s.vms,
        "ticks": s.ticks,
        "wall_s": s.wall_s,
        "us_per_vm_tick": s.wall_s * 1e6 / vm_ticks,
        "total_throughput": s.total_throughput,
        "host_swap_ins": s.host_swap_ins,
        "guest_swap_ins": s.guest_swap_ins,
        "oom_kills": s.oom_kills,
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
