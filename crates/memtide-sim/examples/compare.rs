//! Run a scenario (built-in name or TOML file) under `mom` and `none` with one seed,
//! print the comparison table and, with `--out DIR`, write the reports.
//!
//! cargo run --release -p memtide-sim --example compare -- memknobs-32 [--out DIR] [--seed N]

use memtide_core::policy::mom::Mom;
use memtide_core::policy::none::Unmanaged;
use memtide_core::policy::Policy;
use memtide_core::EngineConfig;
use memtide_sim::{compare, Scenario};
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let which = args
        .next()
        .ok_or("usage: compare SCENARIO [--out DIR] [--seed N]")?;
    let (mut out, mut seed) = (None, None);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--out" => out = Some(PathBuf::from(value)),
            "--seed" => seed = Some(value.parse()?),
            _ => return Err(format!("unknown flag {flag}").into()),
        }
    }
    let scenario = match Scenario::builtin(&which) {
        Ok(s) => s,
        Err(_) => Scenario::from_toml(&std::fs::read_to_string(&which)?)?,
    };
    let policies: Vec<(String, Box<dyn Policy>)> = vec![
        ("none".into(), Box::new(Unmanaged)),
        ("mom".into(), Box::new(Mom::default())),
    ];
    let seed = seed.unwrap_or(scenario.seed);
    let report = compare(&scenario, policies, EngineConfig::default(), seed);
    print!("{}", report.table());
    if let Some(dir) = out {
        report.write(&dir)?;
        println!("reports written to {}", dir.display());
    }
    Ok(())
}
