//! `memtide sim` and `memtide replay`: the same engine and policies, offline.

use crate::config::Config;
use crate::policies::PolicySource;
use anyhow::{bail, Context};
use memtide_core::policy::Policy;
use memtide_sim::scenario::{TierPlacement, TierSpec};
use memtide_sim::{compare, recording_files, replay, run, Scenario};
use std::path::{Path, PathBuf};

/// A scenario by built-in name or file path.
fn scenario(name: &str) -> anyhow::Result<Scenario> {
    let path = Path::new(name);
    if path.exists() {
        let text = crate::text_file::read(path).with_context(|| format!("reading {name}"))?;
        return Scenario::from_toml(&text).with_context(|| name.to_string());
    }
    Scenario::builtin(name).map_err(|e| anyhow::anyhow!("{e}, and no scenario file of that name"))
}

/// A policy by built-in name or policy file, with the configuration's constants.
fn policy(name: &str, config: &Config) -> anyhow::Result<Box<dyn Policy>> {
    Ok(PolicySource::from_config(name, None).load(config)?)
}

/// [`policy`] made again for another run, after it loaded once: a file changed since so
/// that it no longer loads ends the command as any error does.
fn remake(name: &str, config: &Config) -> Box<dyn Policy> {
    policy(name, config).unwrap_or_else(|e| {
        eprintln!("memtide: {e:#}");
        std::process::exit(1)
    })
}

/// How `memtide sim` runs a scenario.
#[derive(Clone, Copy, Debug, Default)]
pub struct SimOptions {
    /// Seed for every random choice (default: the scenario's).
    pub seed: Option<u64>,
    /// Ticks to run in place of the scenario's.
    pub ticks: Option<u64>,
    /// Run the density benchmark.
    pub density: bool,
    /// Give the guests' balloons deflate-on-oom.
    pub deflate_on_oom: bool,
    /// Give the guests' balloons free page reporting.
    pub free_page_reporting: bool,
    /// Make the host two-tier with this share of its memory fast.
    pub fast_share: Option<f64>,
    /// How a two-tier host places pages.
    pub tier_placement: Option<TierPlacement>,
    /// How long memtide's placement leaves memory in use untouched before demoting it (s):
    /// the least, where each VM's adapts.
    pub cold_age_s: Option<f64>,
    /// Whether each VM's cold age adapts to its promotions.
    pub adaptive_age: Option<bool>,
}

/// The scenario's tiers, for option `flag`.
fn tiers<'a>(scenario: &'a mut Scenario, flag: &str) -> anyhow::Result<&'a mut TierSpec> {
    scenario
        .tiers
        .as_mut()
        .with_context(|| format!("{flag} needs --tiers or a scenario with [tiers]"))
}

/// The policies `memtide sim` runs.
pub enum Policies {
    /// One run (`--policy`): its summary.
    One(String),
    /// A comparison (`--compare`), even of one policy: the table.
    Compare(Vec<String>),
}

impl Policies {
    /// The policies' names, in the order given.
    fn names(&self) -> &[String] {
        match self {
            Policies::One(one) => std::slice::from_ref(one),
            Policies::Compare(list) => list,
        }
    }
}

/// Print `text` to standard output; a reader that went away (`| head`) is no error.
fn print(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// `--out`: a folder, created now (before the runs) so that a path that cannot be one
/// fails at once.
fn out_dir(out: Option<&Path>) -> anyhow::Result<()> {
    let Some(dir) = out else { return Ok(()) };
    if dir.exists() && !dir.is_dir() {
        bail!("--out {}: not a folder", dir.display());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("--out {}", dir.display()))
}

/// Each compared policy once, each writing a report folder of its own beside the
/// comparison's own files.
fn distinct(policies: &[String]) -> anyhow::Result<()> {
    for (i, p) in policies.iter().enumerate() {
        let folder = memtide_sim::report::folder_name(p);
        if ["compare.json", "compare.txt", "density.json"].contains(&folder.as_str()) {
            bail!("--compare: {p} would write its report to DIR/{folder}, the comparison's own file: name it by another path");
        }
        if let Some(q) = policies[..i]
            .iter()
            .find(|q| memtide_sim::report::folder_name(q) == folder)
        {
            match q == p {
                true => bail!("--compare: {p} named twice"),
                false => {
                    bail!("--compare: {q} and {p} would both write their report to DIR/{folder}")
                }
            }
        }
    }
    Ok(())
}

/// Run a scenario under one policy, or compare several; print a summary (warnings to
/// standard error) and write the reports to `out`.
pub fn sim(
    scenario_name: &str,
    policies: &Policies,
    out: Option<&Path>,
    options: SimOptions,
    config: &Config,
) -> anyhow::Result<()> {
    if let Policies::Compare(list) = policies {
        distinct(list)?;
    }
    let mut scenario = scenario(scenario_name)?;
    if let Some(ticks) = options.ticks {
        scenario.ticks = ticks;
        scenario.validate().context("--ticks")?;
    }
    scenario.host.deflate_on_oom |= options.deflate_on_oom;
    scenario.host.free_page_reporting |= options.free_page_reporting;
    if let Some(share) = options.fast_share {
        if !(share > 0.0 && share <= 1.0) {
            anyhow::bail!(
                "--tiers {share}: the share of the host's memory that is DRAM, in (0, 1]"
            );
        }
        let context = || format!("--tiers {share}: the DRAM must hold the host's own memory");
        scenario.set_fast_share(share).with_context(context)?;
    }
    if let Some(placement) = options.tier_placement {
        tiers(&mut scenario, "--tier-placement")?.placement = placement;
    }
    if let Some(adaptive) = options.adaptive_age {
        tiers(&mut scenario, "--adaptive-age")?.adaptive_age = adaptive;
    }
    if let Some(age) = options.cold_age_s {
        let t = tiers(&mut scenario, "--cold-age-s")?;
        t.cold_age_s = age;
        // A least age above the longest makes it the longest too.
        t.max_cold_age_s = t.max_cold_age_s.max(age);
        scenario.validate().context("--cold-age-s")?;
    }
    let seed = options.seed.unwrap_or(scenario.seed);
    if options.density {
        return density(&scenario, policies.names(), out, seed, config);
    }
    match policies {
        Policies::One(one) => run_one(&scenario, one, out, seed, config),
        Policies::Compare(list) => run_compare(&scenario, list, out, seed, config),
    }
}

/// One run: its summary printed, its report written to `out`.
fn run_one(
    scenario: &Scenario,
    name: &str,
    out: Option<&Path>,
    seed: u64,
    config: &Config,
) -> anyhow::Result<()> {
    let loaded = policy(name, config)?;
    out_dir(out)?;
    let report = run(scenario, loaded, config.engine.clone(), seed);
    if let Some(dir) = out {
        report
            .write(dir)
            .with_context(|| format!("writing the report to {}", dir.display()))?;
        eprintln!(
            "report (summary.json and plots) written to {}",
            dir.display()
        );
    }
    let s = &report.summary;
    if let Some(w) = s.policy_errors.warning(name, s.ticks) {
        eprintln!("{w}");
    }
    print(&(report.summary_json() + "\n"))
}

/// A comparison: its table printed, its reports written to `out`.
fn run_compare(
    scenario: &Scenario,
    list: &[String],
    out: Option<&Path>,
    seed: u64,
    config: &Config,
) -> anyhow::Result<()> {
    let runs = list
        .iter()
        .map(|p| Ok((p.clone(), policy(p, config)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    out_dir(out)?;
    let report = compare(scenario, runs, config.engine.clone(), seed);
    if let Some(dir) = out {
        report
            .write(dir)
            .with_context(|| format!("writing the reports to {}", dir.display()))?;
        eprintln!(
            "compare.json and one report per policy written to {}",
            dir.display()
        );
    }
    print(&report.table())
}

/// The density benchmark under each policy: print the table, write `density.json`.
fn density(
    scenario: &Scenario,
    policies: &[String],
    out: Option<&Path>,
    seed: u64,
    config: &Config,
) -> anyhow::Result<()> {
    for p in policies {
        policy(p, config)?; // fail early on a bad name or file
    }
    out_dir(out)?;
    // One closure expression, so one type: a Vec of them, each making its policy afresh.
    let makers: Vec<_> = policies.iter().map(|p| move || remake(p, config)).collect();
    let refs: Vec<(String, memtide_sim::density::PolicyFactory<'_>)> = policies
        .iter()
        .zip(&makers)
        .map(|(label, make)| {
            (
                label.clone(),
                make as memtide_sim::density::PolicyFactory<'_>,
            )
        })
        .collect();
    let report = memtide_sim::density(scenario, &refs, &config.engine, seed);
    if let Some(dir) = out {
        let mut json = serde_json::to_value(&report)?;
        json["command"] = std::env::args().collect::<Vec<_>>().join(" ").into();
        let path = dir.join("density.json");
        std::fs::write(&path, serde_json::to_string_pretty(&json)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("density.json written to {}", dir.display());
    }
    print(&report.table())
}

/// Run `policy` over recorded ticks (files, or directories of them) and print how its
/// decisions differ from the recorded ones.
pub fn replay_cmd(
    recordings: &[PathBuf],
    policy_name: &str,
    json: bool,
    config: &Config,
) -> anyhow::Result<()> {
    let mut files = Vec::new();
    for r in recordings {
        if r.is_dir() {
            files.extend(recording_files(r).with_context(|| format!("reading {}", r.display()))?);
        } else {
            files.push(r.clone());
        }
    }
    if files.is_empty() {
        bail!(
            "no recording files in {}",
            recordings
                .iter()
                .map(|r| r.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    // Loaded once to fail early on a bad name or file, then made for each daemon run in
    // the recording.
    policy(policy_name, config)?;
    let make = || remake(policy_name, config);
    let report = replay(&files, &make, config.engine.clone())?;
    match json {
        true => print(&(serde_json::to_string_pretty(&report)? + "\n")),
        false => print(&report.text()),
    }
}
