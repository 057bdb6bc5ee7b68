//! `memtide_vm_info`'s `policy` label: the policy that decides each VM (its own from its
//! `[[vm]]` entry, else the host's), not the fleet's name that lists every exception.

use memtide::config::Config;
use memtide::metrics::{classic, registry, render};
use memtide::policies::load_named;
use memtide::status::{SharedStatus, Status};
use memtide_core::testkit::{host, snapshot, vm};
use memtide_core::{Engine, EngineConfig};

/// The `policy` label of each `memtide_vm_info` line, by VM, in `text`.
fn policies(text: &str) -> Vec<(String, String)> {
    let label = |line: &str, name: &str| {
        let start = line.find(&format!("{name}=\""))? + name.len() + 2;
        let len = line[start..].find('"')?;
        Some(line[start..start + len].to_string())
    };
    text.lines()
        .filter(|l| l.starts_with("memtide_vm_info{"))
        .map(|l| (label(l, "vm").unwrap(), label(l, "policy").unwrap()))
        .collect()
}

#[test]
fn each_vm_s_info_names_the_policy_that_decides_it() {
    let config = Config::parse(
        "policy = \"memtide\"\n\
         [[vm]]\nname = \"db1\"\nqmp = \"/db1\"\npolicy = \"mom\"\n\
         [[vm]]\nname = \"web\"\nqmp = \"/web\"\n",
        "memtide.toml",
    )
    .unwrap();
    let (policy, names) = load_named(&config).unwrap();
    let mut engine = Engine::new(EngineConfig::default(), policy);
    let vms = vec![
        vm("db1", 1000, 800, 600),
        vm("web", 1000, 800, 600),
        vm("found", 1000, 800, 600),
    ];
    let decision = engine.tick(&snapshot(0, host(4000, 400), vms));
    assert_eq!(decision.policy, "memtide (mom for db1)");
    let status = Status {
        decision: Some(decision),
        policies: names,
        ..Status::default()
    };
    let text = classic(&render(&registry(SharedStatus::new(status))));
    let mut got = policies(&text);
    got.sort();
    let want = [("db1", "mom"), ("found", "memtide"), ("web", "memtide")];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(v, p)| (v.to_string(), p.to_string()))
        .collect();
    assert_eq!(got, want, "{text}");
}
