//! memtide-bench: boots real QEMU test guests and runs a scenario under the baseline
//! (`none`, full memory) and each policy in turn, in one invocation, with the memtide
//! daemon running in-process; writes `<out>/<scenario>.json` and `<out>/<scenario>.svg`.
//! See docs/benchmarks.md.

/// Progress on stderr, with the seconds since the harness started.
macro_rules! log {
    ($($arg:tt)*) => {
        eprintln!("memtide-bench [{:>4.0} s]: {}", $crate::started().elapsed().as_secs_f64(), format_args!($($arg)*))
    };
}

mod daemon;
mod density;
mod guest;
mod host_swap;
mod measure;
mod resize;
mod results;
mod rounds;
mod run;
mod scenario;
mod svg;

use anyhow::Context;
use clap::Parser;
use scenario::{Scenario, BASELINE};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::Ordering;

/// Run a real-guest benchmark scenario under each policy and write its results and plot.
#[derive(Parser)]
#[command(version)]
struct Cli {
    /// The scenario file (bench/scenarios/*.toml).
    scenario: Option<PathBuf>,
    /// Directory for `<scenario>.json` and `<scenario>.svg` [default: bench/results;
    /// with --render, the results file's own].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Directory for per-run files (consoles, daemon configurations, event logs);
    /// default target/bench-runs/<scenario>.
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// The test guest's directory (default: $MEMTIDE_GUEST_DIR or target/guest).
    #[arg(long)]
    guest_dir: Option<PathBuf>,
    /// Only these policies (comma-separated), instead of the scenario's; for trials. The
    /// baseline `none` runs first all the same, except in a density scenario, where it
    /// runs only when named here.
    #[arg(long, value_delimiter = ',')]
    policies: Option<Vec<String>>,
    /// Override the scenario's run_s; for trials.
    #[arg(long)]
    run_s: Option<f64>,
    /// Before each policy run, wait up to this many seconds while QEMUs that are not the
    /// harness's run on the host (they compete for the cores and skew throughput).
    #[arg(long, default_value_t = 0)]
    quiet_wait_s: u64,
    /// For scenarios with `host_swap = true`: create a swap file of this many MiB in the
    /// work directory, enable it for the runs, and disable and remove it at the end (the
    /// only host-global setting the harness changes, and only when asked to).
    #[arg(long, value_name = "MIB")]
    host_swap_mib: Option<u64>,
    /// Run the baseline and the policies in turn this many times, and the baseline once
    /// more at the end: each policy's ratios are then taken to the baseline runs right
    /// before and after each of its runs (cancelling the host's drift), and the targets
    /// checked on the means over the rounds. Each round's own results go to
    /// `<work-dir>/round-<n>/results.json`; not for density scenarios.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// Re-render the plot of an existing results file instead of running.
    #[arg(long, value_name = "RESULTS_JSON", conflicts_with = "scenario")]
    render: Option<PathBuf>,
    /// Instead of running: each policy's resize latencies (pressure signal to a raised
    /// balloon target, to the end of the shortage; freed memory to taken back) in these
    /// results files, printed and written to `<out>/resize.json`.
    #[arg(long, value_name = "RESULTS_JSON", num_args = 1.., conflicts_with_all = ["scenario", "render"])]
    resize: Vec<PathBuf>,
    /// Instead of running: the density results of harnesses that each ran some of the
    /// scenario's policies side by side (`--policies`, one `--out` each), as one
    /// `<out>/<scenario>.json` and `.svg` with the scenario's targets checked over all.
    #[arg(long, value_name = "RESULTS_JSON", num_args = 1.., requires = "scenario", conflicts_with_all = ["render", "resize"])]
    merge: Vec<PathBuf>,
}

impl Cli {
    /// Where results go: `--out`, else `bench/results`.
    fn out(&self) -> PathBuf {
        self.out.clone().unwrap_or_else(|| "bench/results".into())
    }
}

static STARTED: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

/// When the harness started.
fn started() -> std::time::Instant {
    *STARTED.get_or_init(std::time::Instant::now)
}

fn command_line() -> String {
    std::env::args()
        .map(|a| {
            if a.chars()
                .all(|c| c.is_ascii_alphanumeric() || "/._-=,:".contains(c))
            {
                a
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn output_of(cmd: &str, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new(cmd).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// What the numbers depend on besides the scenario.
fn environment(kernel_dir: &Path) -> Value {
    let qemu = output_of("qemu-system-x86_64", &["--version"])
        .and_then(|v| v.lines().next().map(str::to_string));
    let commit = output_of("git", &["rev-parse", "--short", "HEAD"]);
    let dirty =
        output_of("git", &["status", "--porcelain", "--untracked-files=no"]).map(|s| !s.is_empty());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    json!({
        "qemu": qemu,
        "accel": "tcg",
        "host_kernel": output_of("uname", &["-r"]),
        "host_cpus": std::thread::available_parallelism().map(|n| n.get()).ok(),
        "host_mem_total_mib": measure::proc_value(&meminfo, "MemTotal").map(|k| k / 1024),
        "guest_stamp": std::fs::read_to_string(kernel_dir.join("stamp")).ok().map(|s| s.trim().to_string()),
        "git_commit": commit,
        "git_dirty": dirty,
        "started": humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
    })
}

fn write_outputs(out: &Path, name: &str, doc: &Value) -> anyhow::Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let json_path = out.join(format!("{name}.json"));
    std::fs::write(&json_path, results::to_text(doc))
        .with_context(|| format!("writing {}", json_path.display()))?;
    let svg_path = out.join(format!("{name}.svg"));
    std::fs::write(&svg_path, svg::render_any(doc))
        .with_context(|| format!("writing {}", svg_path.display()))?;
    log!("wrote {} and {}", json_path.display(), svg_path.display());
    Ok(())
}

/// One line per policy, then the targets.
fn summary(doc: &Value) -> String {
    let mut out = format!(
        "{:<12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9} {:>5}\n",
        "policy",
        "converge_s",
        "mem_mean",
        "mem_max",
        "mem_settl",
        "ideal",
        "tput±se",
        "swap_ins",
        "refaults",
        "ooms"
    );
    let num = |v: &Value| match v.as_f64() {
        Some(x) => format!("{x:.1}"),
        None => "-".into(),
    };
    for p in doc["order"].as_array().into_iter().flatten() {
        let p = p.as_str().unwrap_or("?");
        let r = &doc["policies"][p];
        out.push_str(&format!(
            "{:<12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9} {:>5}{}\n",
            p,
            num(&r["converge_s"]),
            num(&r["memory_mib_mean"]),
            num(&r["memory_mib_max"]),
            num(&r["memory_mib_settled"]),
            num(&r["hot_set_mib"]),
            match (
                r["throughput_ratio"].as_f64(),
                r["throughput_ratio_se"].as_f64()
            ) {
                (Some(x), Some(e)) => format!("{x:.2}±{e:.2}"),
                (Some(x), None) => format!("{x:.2}"),
                _ => "-".into(),
            },
            num(&r["swap_ins"]),
            num(&r["refaults"]),
            num(&r["oom_kills"]),
            r["error"]
                .as_str()
                .map_or(String::new(), |e| format!("  error: {e}"))
        ));
    }
    if doc["rounds"].is_object() {
        out.push_str(&rounds::text(&doc["rounds"]));
    }
    out.push_str(&results::targets_text(doc));
    out
}

/// `--resize`: latencies from results files, as a table and `<out>/resize.json`.
fn resize_report(cli: &Cli) -> anyhow::Result<bool> {
    let mut files = serde_json::Map::new();
    for path in &cli.resize {
        let doc = read_json(path)?;
        let name = doc["scenario"].as_str().unwrap_or("?").to_string();
        let mechanism = resize::mechanism(&doc);
        let policies = resize::latencies(&doc);
        for (policy, r) in &policies {
            let p = |x: &memtide_sim::resize::Percentiles| {
                format!("n={} p50 {} p90 {} max {}", x.count, x.p50, x.p90, x.max)
            };
            println!(
                "{name} ({mechanism}) {policy}: give {} (unanswered {}); shortage {}; take back {}",
                p(&r.give_reaction_s),
                r.give_unanswered,
                p(&r.shortage_s),
                p(&r.take_back_s)
            );
        }
        let commit = doc["environment"]["git_commit"].clone();
        files.insert(
            name,
            json!({"results_commit": commit, "mechanism": mechanism, "policies": policies}),
        );
    }
    let doc = json!({"command": command_line(), "scenarios": files});
    std::fs::create_dir_all(cli.out())
        .with_context(|| format!("creating {}", cli.out().display()))?;
    let path = cli.out().join("resize.json");
    std::fs::write(&path, serde_json::to_string_pretty(&doc)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!("memtide-bench: wrote {}", path.display());
    Ok(true)
}

/// A results file, parsed.
fn read_json(path: &Path) -> anyhow::Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Whether every policy of a density results document ran without an error.
fn all_ran(doc: &Value) -> bool {
    doc["policies"]
        .as_object()
        .is_some_and(|m| m.values().all(|r| r["error"].is_null()))
}

fn bench(cli: &Cli) -> anyhow::Result<bool> {
    if !cli.resize.is_empty() {
        return resize_report(cli);
    }
    if let Some(path) = &cli.render {
        let doc = read_json(path)?;
        if !doc["policies"].is_object() {
            anyhow::bail!(
                "{}: not a results file (it has no \"policies\")",
                path.display()
            );
        }
        let svg_path = match &cli.out {
            Some(dir) => dir.join(path.file_name().unwrap_or_default()),
            None => path.to_path_buf(),
        }
        .with_extension("svg");
        std::fs::write(&svg_path, svg::render_any(&doc))
            .with_context(|| format!("writing {}", svg_path.display()))?;
        eprintln!("memtide-bench: wrote {}", svg_path.display());
        return Ok(true);
    }
    let Some(path) = &cli.scenario else {
        anyhow::bail!("no scenario file given (see --help)");
    };
    let mut scenario = Scenario::load(path)?;
    if !cli.merge.is_empty() {
        let docs = cli
            .merge
            .iter()
            .map(|p| read_json(p))
            .collect::<Result<_, _>>()?;
        let doc = density::merge(&scenario, docs, command_line())?;
        write_outputs(&cli.out(), &scenario.name, &doc)?;
        print!("{}", density::summary(&doc));
        return Ok(all_ran(&doc));
    }
    if let Some(p) = &cli.policies {
        scenario.policies = p.iter().filter(|p| *p != BASELINE).cloned().collect();
        // The baseline runs anyway, except in a density scenario that does not name it.
        let baseline_runs = scenario.density.is_none() || p.iter().any(|q| q == BASELINE);
        let known = |x: &str| (x == BASELINE && baseline_runs) || p.iter().any(|q| q == x);
        scenario.targets.retain(|t| {
            let of_known = match t.of.as_deref() {
                None | Some("ideal") => true,
                Some(o) => known(o),
            };
            known(&t.policy) && of_known
        });
    }
    if cli.rounds > 1 && scenario.density.is_some() {
        anyhow::bail!(
            "--rounds is for scenarios that compare policies with the baseline; {} is a density scenario",
            scenario.name
        );
    }
    if let Some(r) = cli.run_s {
        scenario.run_s = r;
        scenario.settled_s = scenario.settled_s.min(r);
    }
    match (scenario.host_swap, cli.host_swap_mib) {
        (true, None) => anyhow::bail!(
            "scenario {} needs host swap behind its domain limit: pass --host-swap-mib N \
             (a swap file in the work directory, enabled for the runs and removed afterwards)",
            scenario.name
        ),
        (false, Some(_)) => anyhow::bail!(
            "--host-swap-mib is for scenarios with host_swap = true; {} has none",
            scenario.name
        ),
        _ => {}
    }
    let kernel_dir = run::kernel_dir(cli.guest_dir.as_deref())?;
    let work_dir = cli
        .work_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("target/bench-runs").join(&scenario.name));
    std::fs::create_dir_all(&work_dir)?;
    let work_dir = work_dir.canonicalize()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    // SIGINT/SIGTERM: stop waiting, tear down guests and the cgroup, exit.
    rt.spawn(async {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut int), Ok(mut term)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) else {
            return;
        };
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        log!("interrupted, cleaning up");
        guest::INTERRUPTED.store(true, Ordering::SeqCst);
    });
    // The domain swaps only where the scenario puts host swap behind it.
    let cgroup = memtide_testbed::Cgroup::create("memtide-bench")?
        .with_swap(cli.host_swap_mib.unwrap_or(0) << 20);
    let _host_swap = match cli.host_swap_mib {
        Some(mib) => Some(host_swap::HostSwap::enable(&work_dir, mib)?),
        None => None,
    };
    let b = run::Bench {
        scenario: &scenario,
        rt: &rt,
        cgroup: &cgroup,
        kernel_dir: kernel_dir.clone(),
        work_dir,
        quiet_wait: std::time::Duration::from_secs(cli.quiet_wait_s),
    };
    let environment = environment(&kernel_dir);
    let started = std::time::Instant::now();
    let bases = b.measure_bases()?;
    if scenario.density.is_some() {
        let solo = b.solo_runs(&bases)?;
        // Each busy guest's solo run is the reference, so `none` (static partitioning) is
        // a policy like the others here: with --policies it runs only when named, and
        // the policies can run in harnesses of their own side by side.
        let none = cli
            .policies
            .as_ref()
            .is_none_or(|p| p.iter().any(|x| x == BASELINE))
            .then_some(BASELINE);
        let mut runs = Vec::new();
        for policy in none
            .into_iter()
            .chain(scenario.policies.iter().map(String::as_str))
        {
            runs.push(b.run_density(policy, &bases, &solo.mib_per_s)?);
        }
        let mut environment = environment;
        environment["wall_s"] = json!(started.elapsed().as_secs());
        let doc = density::document(&b, &bases, &solo, &runs, command_line(), environment);
        write_outputs(&cli.out(), &scenario.name, &doc)?;
        print!("{}", density::summary(&doc));
        return Ok(all_ran(&doc));
    }
    let mut limit = None;
    let rounds = cli.rounds as usize;
    // Round `n`'s runs (the last baseline's: round N + 1) in a folder of their own.
    let round_dir = |n: usize| format!("round-{n}");
    let mut round_runs = Vec::new();
    for r in 0..rounds {
        let sub = if rounds > 1 {
            log!("{}: round {} of {rounds}", scenario.name, r + 1);
            round_dir(r + 1)
        } else {
            String::new()
        };
        let b = b.in_dir(&sub);
        let mut runs = Vec::new();
        for policy in std::iter::once(BASELINE).chain(rounds::turn(&scenario.policies, r)) {
            runs.push(b.run_policy(policy, &mut limit)?);
        }
        round_runs.push(runs);
    }
    // The baseline after the last round, for the ratios of that round's policy runs.
    let last_baseline = if rounds > 1 {
        log!("{}: the baseline after round {rounds}", scenario.name);
        let b = b.in_dir(&round_dir(rounds + 1));
        Some(b.run_policy(BASELINE, &mut limit)?)
    } else {
        None
    };
    let mut environment = environment;
    environment["wall_s"] = json!(started.elapsed().as_secs());
    let document = |runs: &[run::PolicyRun]| {
        results::document(&results::Inputs {
            scenario: &scenario,
            bases: &bases,
            runs,
            limit_mib: limit.map(|l| l as f64 / (1u64 << 20) as f64),
            host_swap_mib: cli.host_swap_mib,
            command: command_line(),
            environment: environment.clone(),
        })
    };
    let docs: Vec<Value> = round_runs.iter().map(|runs| document(runs)).collect();
    let mut doc = docs[0].clone();
    if let Some(last) = &last_baseline {
        let last = document(std::slice::from_ref(last));
        for (r, d) in docs.iter().chain([&last]).enumerate() {
            let path = b.work_dir.join(round_dir(r + 1)).join("results.json");
            std::fs::write(&path, results::to_text(d))
                .with_context(|| format!("writing {}", path.display()))?;
        }
        doc["rounds"] = rounds::summary(&docs, &last);
        let targets = scenario.targets.iter();
        doc["targets"] = targets
            .map(|t| rounds::check_target(&doc["rounds"], t))
            .collect();
    }
    write_outputs(&cli.out(), &scenario.name, &doc)?;
    print!("{}", summary(&doc));
    let all = round_runs.iter().flatten().chain(&last_baseline);
    Ok(all.into_iter().all(|r| r.error.is_none()))
}

fn main() -> ExitCode {
    started();
    let cli = Cli::parse();
    match bench(&cli) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("memtide-bench: some runs failed (see their \"error\")");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("memtide-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}
