//! `memtide`: memory overcommitment manager for Linux/KVM hosts.

use anyhow::Context;
use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use memtide::config::Config;
use memtide::daemon::reclaim::Place;
use memtide::daemon::{self, RunOptions};
use memtide::policy_cmd::{self, Format};
use memtide::reclaim_cmd;
use memtide::sim_cmd;
use memtide::snapshot_cmd;
use memtide::{control, render, stdout};
use memtide_adapters::access::{Mappings, Method};
use memtide_core::backend::AfterSave;
use memtide_core::reclaim::Keep;
use memtide_core::tiering::age::AgeConfig;
use memtide_core::Bytes;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// The version, and whether the libvirt connector is built in (a build without it
/// refuses configurations that name libvirt or KubeVirt).
#[cfg(feature = "libvirt")]
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (with libvirt)");
#[cfg(not(feature = "libvirt"))]
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (without libvirt)");

/// How long `memtide snapshot restore` waits for a running daemon to take its word that
/// the VM was started (a stopped or hung daemon is not waited for).
const CONNECT_WAIT: Duration = Duration::from_secs(2);

/// Watches each VM, takes back the memory it does not use, and gives it back before the
/// guest suffers.
#[derive(Parser)]
#[command(name = "memtide", version = VERSION, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// What to log: a level (off, error, warn, info, debug, trace) or a tracing filter such as
    /// `info,memtide::daemon=debug` (default: $MEMTIDE_LOG, else info).
    #[arg(long, global = true, value_name = "FILTER")]
    log_level: Option<String>,
    /// How to log to stderr: text, or one JSON object a line (for journald and log
    /// shippers).
    #[arg(long, global = true, value_enum, default_value = "text")]
    log_format: LogFormat,
}

/// The format of the log on stderr.
#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Where every subcommand looks for its configuration when none is given (and
/// $MEMTIDE_CONFIG is unset): the Debian package's conffile.
const DEFAULT_CONFIG: &str = "/etc/memtide/memtide.toml";

/// `--tracker`: how `memtide access` and `memtide place` track a process's accesses.
#[derive(Clone, Copy, ValueEnum)]
enum TrackerArg {
    /// DAMON where the kernel has it and no other tool uses it, else idle page tracking.
    Auto,
    /// A kdamond of memtide's own (CONFIG_DAMON_SYSFS, CONFIG_DAMON_VADDR).
    Damon,
    /// Idle page tracking (CONFIG_IDLE_PAGE_TRACKING).
    Idle,
}

impl From<TrackerArg> for Method {
    fn from(t: TrackerArg) -> Method {
        match t {
            TrackerArg::Auto => Method::Auto,
            TrackerArg::Damon => Method::Damon,
            TrackerArg::Idle => Method::IdlePages,
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon: find VMs, decide every interval, act, and explain.
    Run {
        /// Configuration file (TOML) [default: /etc/memtide/memtide.toml if it exists, else
        /// built-in defaults].
        #[arg(long, short, env = "MEMTIDE_CONFIG")]
        config: Option<PathBuf>,
        /// Decide and log, but change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Stop after this many ticks (for trials and tests).
        #[arg(long)]
        ticks: Option<u64>,
    },
    /// Show what the running daemon sees and does.
    Status {
        /// Print the status as JSON.
        #[arg(long)]
        json: bool,
        /// The daemon's control socket (default: the one in the configuration, else
        /// /run/memtide/memtide.sock).
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Configuration file naming the control socket [default: /etc/memtide/memtide.toml
        /// if it exists].
        #[arg(long, short, env = "MEMTIDE_CONFIG")]
        config: Option<PathBuf>,
    },
    /// A full-screen live view of the running daemon: each VM's size, working set and
    /// last decision, refreshed every tick (q quits, s sorts, / filters by name).
    Top {
        /// The daemon's control socket (default: the one in the configuration, else
        /// /run/memtide/memtide.sock).
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Configuration file naming the control socket [default: /etc/memtide/memtide.toml
        /// if it exists].
        #[arg(long, short, env = "MEMTIDE_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Check a configuration file as `run` does at start (its settings, its policy files,
    /// the host's /proc, /sys and domain cgroup, tier placement's nodes) and exit.
    CheckConfig {
        /// The file [default: $MEMTIDE_CONFIG, else /etc/memtide/memtide.toml].
        file: Option<PathBuf>,
        /// The file, given as the other subcommands take it.
        #[arg(long, short, value_name = "FILE", conflicts_with = "file")]
        config: Option<PathBuf>,
        /// Check the file and its policy files only, not this host's /proc, /sys, domain
        /// cgroup and NUMA nodes (a configuration made for another host).
        #[arg(long)]
        no_host: bool,
    },
    /// Make the running daemon reload its policy, as SIGHUP does: the configuration file
    /// is read again for its policy settings and the VMs' bounds (what else changed waits
    /// for a restart) and the event log reopened.
    Reload {
        /// The daemon's control socket (default: the one in the configuration, else
        /// /run/memtide/memtide.sock).
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Configuration file naming the control socket [default: /etc/memtide/memtide.toml
        /// if it exists].
        #[arg(long, short, env = "MEMTIDE_CONFIG")]
        config: Option<PathBuf>,
        /// The daemon's process: where its control socket cannot be reached (`[daemon]
        /// socket` edited since it started, say), it is sent SIGHUP, which reloads it as
        /// this command does, unanswered: the event log tells the outcome (the systemd
        /// unit gives $MAINPID).
        #[arg(long)]
        pid: Option<i32>,
    },
    /// Track one process's memory accesses by DAMON or idle page tracking in the
    /// foreground, as the daemon tracks a VM's guest RAM (see docs/tiering.md): a JSON
    /// line a scan with the bytes accessed since the previous scan and the bytes cold.
    /// Needs root and a kernel with CONFIG_DAMON_SYSFS or CONFIG_IDLE_PAGE_TRACKING.
    Access {
        /// The process to track.
        #[arg(long)]
        pid: i32,
        /// How: `auto` DAMON where the kernel has it and no other tool uses it, else idle
        /// page tracking.
        #[arg(long, value_enum, default_value_t = TrackerArg::Auto)]
        tracker: TrackerArg,
        /// Track only its private writable mappings of this size (to 2 MiB), as the
        /// daemon picks a QEMU's guest RAM; again for each further mapping (a virtio-mem
        /// or DIMM backend beside the base memory); default: all of them.
        #[arg(long)]
        size_mib: Vec<u64>,
        /// Seconds a page must go untouched to be cold [default: `[host] cold_age_s`].
        #[arg(long)]
        cold_age_s: Option<f64>,
        /// Seconds between two scans.
        #[arg(long, default_value_t = 10.0)]
        interval_s: f64,
        /// Stop after this many scans.
        #[arg(long, default_value_t = 13)]
        count: u64,
        /// Configuration file (TOML) for `[host]` proc, sys and cold_age_s.
        #[arg(long, short, env = "MEMTIDE_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Place one process's pages between a fast and a slow NUMA node in the foreground
    /// (see docs/tiering.md): each interval, its pages least recently accessed beyond the
    /// fast budget go to the slow node and its pages accessed since the previous scan on
    /// the slow node come back, with move_pages(2); a JSON line an interval. Needs root,
    /// NUMA and a kernel with CONFIG_DAMON_SYSFS or CONFIG_IDLE_PAGE_TRACKING.
    Place {
        /// The process whose pages to place.
        #[arg(long)]
        pid: i32,
        /// How to track its accesses (as `memtide access --tracker`).
        #[arg(long, value_enum, default_value_t = TrackerArg::Auto)]
        tracker: TrackerArg,
        /// The fast tier's NUMA node.
        #[arg(long)]
        fast_node: i32,
        /// The slow tier's NUMA node.
        #[arg(long)]
        slow_node: i32,
        /// The most of the process's memory the fast node may hold (MiB).
        #[arg(long)]
        budget_mib: u64,
        /// Place only its private writable mappings of this size (to 2 MiB), as the
        /// daemon picks a QEMU's guest RAM; again for each further mapping (a virtio-mem
        /// or DIMM backend beside the base memory); default: all of them.
        #[arg(long)]
        size_mib: Vec<u64>,
        /// Seconds between two intervals' scans.
        #[arg(long, default_value_t = 5.0)]
        interval_s: f64,
        /// Most memory moved a second, both ways together (MiB/s).
        #[arg(long, default_value_t = 256.0)]
        rate_mib_s: f64,
        /// Seconds a page must go untouched before it is demoted, 0 for whatever is idle:
        /// the least, where the age adapts to the process's promotions
        /// [default: `[tiering] cold_age_s`].
        #[arg(long)]
        cold_age_s: Option<f64>,
        /// Stop after this many intervals.
        #[arg(long, default_value_t = 12)]
        count: u64,
        /// Configuration file (TOML) for `[host]` proc and sys, `[tiering]` cold_age_s,
        /// adaptive_age, max_cold_age_s and promotion_slo_pct_per_min.
        #[arg(long, short, env = "MEMTIDE_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Reclaim one cgroup v2's cold memory in the foreground, paced as the daemon paces
    /// its VMs' (`[reclaim]` of the configuration; see docs/tiering.md), a line a tick.
    #[command(group(clap::ArgGroup::new("target").required(true).args(["pid", "cgroup"])))]
    Reclaim {
        /// The process whose cgroup (holding it alone) to reclaim from.
        #[arg(long)]
        pid: Option<u32>,
        /// The cgroup v2 directory to reclaim from.
        #[arg(long)]
        cgroup: Option<PathBuf>,
        /// Its working set, in MiB: never reclaimed below this plus `[reclaim] floor_mib`.
        #[arg(long)]
        working_set_mib: Option<u64>,
        /// Never reclaimed below this many MiB.
        #[arg(long, default_value_t = 0)]
        min_mib: u64,
        /// Seconds between two ticks.
        #[arg(long, default_value_t = 1.0)]
        interval_s: f64,
        /// Stop after this many ticks.
        #[arg(long, default_value_t = 60)]
        ticks: u64,
        /// Decide and print, but write nothing.
        #[arg(long)]
        dry_run: bool,
        /// Configuration file (TOML) for `[reclaim]` and `[host] proc`.
        #[arg(long, short, env = "MEMTIDE_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Check or evaluate policy files (the policy language; see docs/policy-language.md).
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Save, list, restore and delete VM memory snapshots (see docs/snapshots.md).
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// Run a scenario in the simulator under one or more policies (see docs/simulator.md).
    Sim {
        /// A built-in scenario (memknobs-32, mixed-8, quick, fleet-1000, no-overcommit,
        /// burst, cloud-mix, small-vms, periodic, density, tiered-redis) or a scenario file.
        scenario: String,
        /// The policy: a built-in name or a policy file.
        #[arg(long, default_value = "memtide", conflicts_with = "compare")]
        policy: String,
        /// Run the same scenario under each of these policies and compare them.
        #[arg(long, num_args = 1..)]
        compare: Vec<String>,
        /// Write summary.json and plots (compare.json with --compare) here.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Seed for every random choice (default: the scenario's).
        #[arg(long)]
        seed: Option<u64>,
        /// Run this many ticks instead of the scenario's `ticks` (e.g. to see a scenario's
        /// steady state past its first hour).
        #[arg(long)]
        ticks: Option<u64>,
        /// Run the density benchmark instead: VMs arrive into an admission queue and
        /// each policy (--policy, or those of --compare) admits as many as it can at the
        /// same service level (writes density.json to --out).
        #[arg(long)]
        density: bool,
        /// Give the guests' balloons deflate-on-oom (the scenario's `host.deflate_on_oom`):
        /// OOM kills it prevents are counted apart.
        #[arg(long)]
        deflate_on_oom: bool,
        /// Give the guests' balloons free page reporting (the scenario's
        /// `host.free_page_reporting`): memory a guest keeps free for 2 s goes back to the
        /// host by itself, under every policy, none included.
        #[arg(long)]
        free_page_reporting: bool,
        /// Make the host two-tier: this share of its memory (0 to 1) is DRAM, the rest a
        /// slower tier (the scenario's `[tiers]`, see docs/tiering.md); 1 is all DRAM.
        #[arg(long, value_name = "FAST_SHARE")]
        tiers: Option<f64>,
        /// How a two-tier host places guest pages: memtide or first-touch.
        #[arg(long)]
        tier_placement: Option<memtide_sim::scenario::TierPlacement>,
        /// memtide's placement on a two-tier host: seconds memory in use must go untouched
        /// before it is demoted, the least where each VM's adapts (the scenario's
        /// `tiers.cold_age_s`).
        #[arg(long, value_name = "SECONDS")]
        cold_age_s: Option<f64>,
        /// memtide's placement on a two-tier host: adapt each VM's cold age to its own
        /// promotions, true or false (the scenario's `tiers.adaptive_age`).
        #[arg(long, value_name = "BOOL")]
        adaptive_age: Option<bool>,
        /// Configuration whose policy constants to use [default: /etc/memtide/memtide.toml if
        /// it exists].
        #[arg(long, short, env = "MEMTIDE_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Print a shell completion script for memtide (e.g. `memtide completions bash >
    /// /usr/share/bash-completion/completions/memtide`).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print memtide's man page (roff; `memtide man | man -l -`), or write it and one
    /// page for each subcommand (memtide-run.1, memtide-snapshot-save.1, ...) into a
    /// directory.
    Man {
        /// Write every page into this directory instead (made if it is not there).
        #[arg(long, value_name = "DIR")]
        out_dir: Option<PathBuf>,
    },
    /// Run another policy over recorded ticks and show where its decisions differ.
    Replay {
        /// Recording files (record-N.jsonl.gz) or directories of them.
        #[arg(required = true)]
        recordings: Vec<PathBuf>,
        /// The policy to replay: a built-in name or a policy file.
        #[arg(long)]
        policy: String,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// Configuration whose policy constants to use [default: /etc/memtide/memtide.toml if
        /// it exists].
        #[arg(long, short, env = "MEMTIDE_CONFIG")]
        config: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum SnapshotCommand {
    /// Save a VM's memory and device state into the store, through the running daemon:
    /// the guest is stopped meanwhile, then runs on (or, with --hibernate, its hypervisor
    /// process quits and its memory is freed).
    Save {
        /// The VM.
        vm: String,
        /// End the VM's hypervisor process once saved (libvirt: leave the domain stopped);
        /// restore it with `memtide snapshot restore`.
        #[arg(long)]
        hibernate: bool,
        /// The daemon's control socket (default: the one in the configuration, else
        /// /run/memtide/memtide.sock).
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Configuration file [default: /etc/memtide/memtide.toml if it exists].
        #[arg(long, short, env = "MEMTIDE_CONFIG")]
        config: Option<PathBuf>,
    },
    /// List the snapshots in the store.
    List {
        /// Only this VM's.
        vm: Option<String>,
        /// Print them as JSON.
        #[arg(long)]
        json: bool,
        /// Configuration file [default: /etc/memtide/memtide.toml if it exists].
        #[arg(long, short, env = "MEMTIDE_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Start a stopped VM again from a snapshot, its checksums verified first, through
    /// the connector that saved it (a `[[vm]]` with `qmp`, `firecracker` or
    /// `cloud_hypervisor` and `launch`, or with `libvirt`).
    Restore {
        /// The VM.
        vm: String,
        /// The snapshot (default: the VM's latest).
        #[arg(long)]
        id: Option<String>,
        /// Restore a snapshot whose guest ran on after it (or was woken from it): only
        /// safe when its disks were rolled back to that moment.
        #[arg(long)]
        force: bool,
        /// Configuration file [default: /etc/memtide/memtide.toml if it exists].
        #[arg(long, short, env = "MEMTIDE_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Start clones of a VM from a snapshot, sharing its memory until they write it (a
    /// VM with `qmp` and `clone_launch` in the configuration).
    Clone {
        /// The VM.
        vm: String,
        /// How many clones.
        #[arg(default_value_t = 1)]
        count: u32,
        /// The snapshot (default: the VM's latest).
        #[arg(long)]
        id: Option<String>,
        /// Configuration file [default: /etc/memtide/memtide.toml if it exists].
        #[arg(long, short, env = "MEMTIDE_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Delete a snapshot.
    Delete {
        /// The VM.
        vm: String,
        /// The snapshot.
        id: String,
        /// Delete a hibernation not woken from too (the guest's running state is lost),
        /// and a snapshot whose description does not read (it may be one).
        #[arg(long)]
        force: bool,
        /// Configuration file [default: /etc/memtide/memtide.toml if it exists].
        #[arg(long, short, env = "MEMTIDE_CONFIG")]
        config: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// Parse and check policy files: exit 0 if fine, 1 with located diagnostics.
    Check {
        /// Policy files, or directories of them (their *.policy files), evaluated in the
        /// order of their names.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Evaluate policy files once over a snapshot and print results and controls.
    Eval {
        /// Policy files, or directories of them (their *.policy files), evaluated in the
        /// order of their names.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Snapshot JSON: {"host": {"props", "stats"}, "guests": [...]}; without it, no entities.
        #[arg(long)]
        input: Option<PathBuf>,
        /// Output format.
        #[arg(long, value_enum, default_value = "json")]
        format: Format,
    },
}

/// The control socket: given, or the configuration's `[daemon] socket`, or the default.
/// A configuration with a fault elsewhere (being edited while the daemon runs on the
/// one it read) is read for that key alone, the fault said as a warning: status, top and
/// reload still reach the daemon, and a reload is refused by it, saying why.
fn socket(socket: Option<PathBuf>, config: Option<&PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(socket) = socket {
        return Ok(socket);
    }
    let fault = match load(config) {
        Ok(config) => return Ok(config.daemon.socket),
        Err(fault) => fault,
    };
    // A file that is there but wrong must not keep the operator from the daemon (its
    // status, a reload that reports why the file is refused).
    let Some(text) = config_file(config).and_then(|file| memtide::text_file::read(&file).ok())
    else {
        return Err(fault);
    };
    let default = Config::default().daemon.socket;
    let named = match text.parse::<toml::Table>() {
        Ok(table) => {
            let named = table.get("daemon").and_then(|d| d.get("socket")?.as_str());
            named.map(PathBuf::from)
        }
        // A syntax error (a line being edited) elsewhere: the line under `[daemon]`.
        Err(_) => daemon_socket_line(&text),
    };
    match named {
        Some(_) => tracing::warn!("{fault:#}; its [daemon] socket is used all the same"),
        None => {
            let tried = default.display();
            tracing::warn!("{fault:#}; the default socket {tried} is tried (or give --socket)");
        }
    }
    Ok(named.unwrap_or(default))
}

/// `socket = "…"` under the `[daemon]` header of configuration text that does not parse
/// as a whole, each line read alone (no crate parses a TOML file around its errors).
fn daemon_socket_line(text: &str) -> Option<PathBuf> {
    let mut in_daemon = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_daemon = line.split('#').next().map(str::trim) == Some("[daemon]");
        } else if in_daemon && line.starts_with("socket") {
            let table = line.parse::<toml::Table>().ok()?;
            return table.get("socket")?.as_str().map(PathBuf::from);
        }
    }
    None
}

/// The configuration file: `path`, else [`DEFAULT_CONFIG`] if there is one.
fn config_file(path: Option<&PathBuf>) -> Option<PathBuf> {
    let default = PathBuf::from(DEFAULT_CONFIG);
    path.cloned().or(default.exists().then_some(default))
}

/// The configuration at `path`, else at [`DEFAULT_CONFIG`] if there is one, else the
/// built-in defaults.
fn load(path: Option<&PathBuf>) -> anyhow::Result<Config> {
    Ok(match config_file(path) {
        Some(p) => Config::load(&p)?,
        None => Config::default(),
    })
}

async fn main_inner(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run {
            config,
            dry_run,
            ticks,
        } => {
            let config_file = config_file(config.as_ref());
            let config = load(config_file.as_ref())?;
            let options = RunOptions {
                dry_run,
                ticks,
                config_file,
            };
            // A task on the runtime's workers rather than `block_on`'s thread: the VMs'
            // answers then wake the tick without unparking another thread each time.
            let run = tokio::spawn(daemon::run(config, options));
            match run.await {
                Ok(result) => result,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(e) => Err(e.into()),
            }
        }
        Command::Status {
            json,
            socket,
            config,
        } => {
            let socket = self::socket(socket, config.as_ref())?;
            if json {
                let status = control::request_status_json(&socket).await?;
                stdout::println(serde_json::to_string_pretty(&status).context("encoding status")?)?;
            } else {
                let status = control::request_status(&socket).await?;
                stdout::print(render::status(&status))?;
            }
            Ok(())
        }
        Command::Top { socket, config } => {
            let socket = self::socket(socket, config.as_ref())?;
            memtide::top::run(socket).await
        }
        Command::CheckConfig {
            file,
            config,
            no_host,
        } => {
            let named = file
                .or(config)
                .or_else(|| std::env::var_os("MEMTIDE_CONFIG").map(PathBuf::from));
            let check = |config: &Config| -> anyhow::Result<()> {
                match no_host {
                    true => drop(memtide::policies::load(config).context("loading the policy")?),
                    false => drop(memtide::daemon::check(config)?),
                }
                Ok(())
            };
            // No file named and none at the default place: memtide runs on its built-in
            // defaults, which are checked as run would.
            let Some(file) = config_file(named.as_ref()) else {
                check(&Config::default())?;
                stdout::println(format_args!(
                    "no {DEFAULT_CONFIG}: the built-in defaults: ok"
                ))?;
                return Ok(());
            };
            check(&Config::load(&file)?)?;
            stdout::println(format_args!("{}: ok", file.display()))?;
            Ok(())
        }
        Command::Access {
            pid,
            tracker,
            size_mib,
            cold_age_s,
            interval_s,
            count,
            config,
        } => {
            let config = load(config.as_ref())?;
            let seconds = |flag: &str, s: f64| {
                Duration::try_from_secs_f64(s)
                    .map_err(|_| anyhow::anyhow!("{flag} {s} is not a duration"))
            };
            let options = memtide::access_cmd::Options {
                pid,
                mappings: mappings(&size_mib),
                cold_age: seconds("--cold-age-s", cold_age_s.unwrap_or(config.host.cold_age_s))?,
                interval: interval(interval_s)?,
                count,
                method: tracker.into(),
                proc: config.host.proc.clone(),
                sys: config.host.sys.clone(),
            };
            tokio::task::spawn_blocking(move || {
                memtide::access_cmd::run(&options, &mut stdout::Stdout)
            })
            .await?
        }
        Command::Place {
            pid,
            tracker,
            fast_node,
            slow_node,
            budget_mib,
            size_mib,
            interval_s,
            rate_mib_s,
            cold_age_s,
            count,
            config,
        } => {
            let config = load(config.as_ref())?;
            let cold_age_s = cold_age_s.unwrap_or(config.tiering.cold_age_s);
            if Duration::try_from_secs_f64(cold_age_s).is_err() {
                anyhow::bail!("--cold-age-s {cold_age_s} is not a duration");
            }
            // A longest age below the least is the least.
            let ages = AgeConfig {
                min_s: cold_age_s,
                ..config.tiering.ages()
            };
            let interval = interval(interval_s)?;
            // As the configuration's check.
            let beyond = memtide_adapters::access::age_beyond_scans(interval_s, ages.horizon_s());
            if let Some(why) = beyond {
                anyhow::bail!("--interval-s {interval_s}: {why}");
            }
            let options = memtide::place_cmd::Options {
                pid,
                fast_node,
                slow_node,
                budget: Bytes::from_mib(budget_mib),
                mappings: mappings(&size_mib),
                interval,
                rate_mib_s,
                ages,
                count,
                method: tracker.into(),
                proc: config.host.proc.clone(),
                sys: config.host.sys.clone(),
            };
            tokio::task::spawn_blocking(move || {
                memtide::place_cmd::run(&options, &mut stdout::Stdout)
            })
            .await?
        }
        Command::Reclaim {
            pid,
            cgroup,
            working_set_mib,
            min_mib,
            interval_s,
            ticks,
            dry_run,
            config,
        } => {
            let config = load(config.as_ref())?;
            let interval = interval(interval_s)?;
            let options = reclaim_cmd::Options {
                place: match (cgroup, pid) {
                    // Refused now, not by every tick's write.
                    (Some(dir), _) if !dir.join("memory.current").is_file() => anyhow::bail!(
                        "--cgroup {}: no cgroup v2 memory controller there (no memory.current)",
                        dir.display()
                    ),
                    (Some(dir), _) => Place::Cgroup(dir),
                    (None, Some(pid)) => {
                        let proc = &config.host.proc;
                        let started = i32::try_from(pid)
                            .ok()
                            .and_then(|p| memtide_adapters::procfs::start_time(proc, p))
                            .ok_or_else(|| anyhow::anyhow!("--pid {pid}: no such process"))?;
                        Place::Process { pid, started }
                    }
                    (None, None) => unreachable!("clap requires one"),
                },
                keep: Keep {
                    working_set: working_set_mib.map(Bytes::from_mib),
                    min: Bytes::from_mib(min_mib),
                },
                interval,
                ticks,
                dry_run,
            };
            let proc = config.host.proc.clone();
            let ticks = options.ticks;
            let failed = tokio::task::spawn_blocking(move || {
                reclaim_cmd::run(&config.reclaim, proc, &options, &mut stdout::Stdout)
            })
            .await??;
            match failed {
                0 => Ok(()),
                n => anyhow::bail!("{n} of {ticks} ticks failed"),
            }
        }
        Command::Reload {
            socket,
            config,
            pid,
        } => {
            let socket = self::socket(socket, config.as_ref())?;
            match (control::request_reload(&socket).await, pid) {
                (Ok(loaded), _) => stdout::println(loaded)?,
                (Err(e), Some(pid)) if control::unreached(&e) => {
                    let hup = rustix::process::Pid::from_raw(pid).map(|pid| {
                        rustix::process::kill_process(pid, rustix::process::Signal::HUP)
                    });
                    match hup {
                        Some(Ok(())) => {}
                        Some(Err(why)) => {
                            anyhow::bail!("{e:#}; nor could process {pid} be sent SIGHUP: {why}")
                        }
                        None => anyhow::bail!("{e:#}; and {pid} names no process"),
                    }
                    tracing::warn!(
                        "{e:#}; reload asked of process {pid} by SIGHUP instead: its outcome \
                         is in the event log (policy_reloaded or policy_rejected)"
                    );
                }
                (Err(e), _) => return Err(e),
            }
            Ok(())
        }
        Command::Sim {
            scenario,
            policy,
            compare,
            out,
            seed,
            ticks,
            density,
            deflate_on_oom,
            free_page_reporting,
            tiers,
            tier_placement,
            cold_age_s,
            adaptive_age,
            config,
        } => {
            let options = sim_cmd::SimOptions {
                seed,
                ticks,
                density,
                deflate_on_oom,
                free_page_reporting,
                fast_share: tiers,
                tier_placement,
                cold_age_s,
                adaptive_age,
            };
            let policies = match compare.is_empty() {
                true => sim_cmd::Policies::One(policy),
                false => sim_cmd::Policies::Compare(compare),
            };
            sim_cmd::sim(
                &scenario,
                &policies,
                out.as_deref(),
                options,
                &load(config.as_ref())?,
            )
        }
        Command::Replay {
            recordings,
            policy,
            json,
            config,
        } => sim_cmd::replay_cmd(&recordings, &policy, json, &load(config.as_ref())?),
        Command::Completions { shell } => {
            // Written whole, then printed: clap_complete panics on a failed write.
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "memtide", &mut script);
            stdout::Stdout.write_all(&script)?;
            Ok(())
        }
        Command::Man { out_dir } => {
            // The pages name each other as memtide-SUBCOMMAND(1): `help` is no page.
            let command = Cli::command().disable_help_subcommand(true);
            match out_dir {
                None => clap_mangen::Man::new(command)
                    .render(&mut stdout::Stdout)
                    .context("writing the man page"),
                Some(dir) => std::fs::create_dir_all(&dir)
                    .and_then(|()| clap_mangen::generate_to(command, &dir))
                    .with_context(|| format!("writing the man pages into {}", dir.display())),
            }
        }
        Command::Snapshot(command) => snapshot(command).await,
        Command::Policy(PolicyCommand::Check { files }) => ok_or_fail(policy_cmd::check(&files)),
        Command::Policy(PolicyCommand::Eval {
            files,
            input,
            format,
        }) => ok_or_fail(policy_cmd::eval(&files, input.as_deref(), format)?),
    }
}

/// The mappings `memtide access` and `memtide place` take: those of each `--size-mib`
/// given, or every private writable one.
fn mappings(size_mib: &[u64]) -> Mappings {
    match size_mib {
        [] => Mappings::Private,
        sizes => Mappings::GuestRam(sizes.iter().map(|&mib| Bytes::from_mib(mib)).collect()),
    }
}

/// A foreground command's `--interval-s`: a duration above 0 (at 0 it would loop
/// without a pause).
fn interval(s: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| anyhow::anyhow!("--interval-s {s} is not a number of seconds above 0"))
}

async fn snapshot(command: SnapshotCommand) -> anyhow::Result<()> {
    match command {
        SnapshotCommand::Save {
            vm,
            hibernate,
            socket,
            config,
        } => {
            let then = match hibernate {
                true => AfterSave::Quit,
                false => AfterSave::Run,
            };
            let socket = self::socket(socket, config.as_ref())?;
            let loaded = load(config.as_ref()).ok();
            // The daemon's own limit on a save, and a minute for it to be started and told.
            let limit = loaded.as_ref().map_or_else(
                || Config::default().snapshots.timeout_s,
                |c| c.snapshots.timeout_s,
            );
            let wait = Duration::from_secs(limit + 60);
            let saved = control::request_save(&socket, &vm, then, wait).await?;
            stdout::println(snapshot_cmd::saved_line(&saved))?;
            let why = loaded.and_then(|c| snapshot_cmd::cannot_restore(&c, &vm));
            if let Some(why) = why {
                eprintln!("note: `memtide snapshot restore` cannot start it again: {why}");
            }
        }
        SnapshotCommand::List { vm, json, config } => {
            stdout::print(snapshot_cmd::list(
                &load(config.as_ref())?,
                vm.as_deref(),
                json,
            )?)?;
        }
        SnapshotCommand::Restore {
            vm,
            id,
            force,
            config,
        } => {
            let config = load(config.as_ref())?;
            let restored = snapshot_cmd::restore(&config, &vm, id.as_deref(), force).await?;
            stdout::println(&restored.line)?;
            // A running daemon manages the VM at once, rather than at its next attempt
            // (its backoff grew while the VM was away); none running, nothing to tell.
            let told = control::request_connect(&config.daemon.socket, &vm, CONNECT_WAIT);
            if let Err(e) = told.await {
                tracing::debug!("the daemon was not told to connect to {vm}: {e:#}");
            }
            if let Some(why) = restored.unmarked {
                eprintln!("warning: {why}");
            }
        }
        SnapshotCommand::Clone {
            vm,
            count,
            id,
            config,
        } => {
            let config = load(config.as_ref())?;
            for line in snapshot_cmd::clone(&config, &vm, count, id.as_deref()).await? {
                stdout::println(line)?;
            }
        }
        SnapshotCommand::Delete {
            vm,
            id,
            force,
            config,
        } => {
            snapshot_cmd::delete(&load(config.as_ref())?, &vm, &id, force)?;
            stdout::println(format_args!("snapshot {id} of {vm} deleted"))?;
        }
    }
    Ok(())
}

/// A failure already reported on the output: exit 1 without another message.
#[derive(Debug, thiserror::Error)]
#[error("reported")]
struct Reported;

fn ok_or_fail(ok: bool) -> anyhow::Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Reported.into())
    }
}

/// The tracing filter `text` names: a level, or `target=level` directives. A bare word
/// is a level (a name, or 0 to 5), or a target to log everything of: only memtide's own
/// (`memtide…`) or a path (`a::b`) is taken as one. Any other is refused: tracing would
/// log that target alone and nothing else (`degub`, a typo of `debug`, silenced every
/// error).
fn log_filter(text: &str) -> Result<tracing_subscriber::EnvFilter, String> {
    const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
    // An empty filter logs errors alone, which no one asking for a level means.
    if text.split(',').all(|d| d.trim().is_empty()) {
        return Err(format!("no level: give one of {}", LEVELS.join(", ")));
    }
    for directive in text.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let bare = !directive.contains(['=', '[', '{']);
        let level = LEVELS.iter().any(|l| l.eq_ignore_ascii_case(directive))
            || matches!(directive, "0" | "1" | "2" | "3" | "4" | "5");
        let target = directive.starts_with("memtide") || directive.contains("::");
        if bare && !level && !target {
            return Err(format!(
                "{directive:?} is not a level (one of {}); a target's level is given as \
                 target=level, e.g. memtide::daemon=debug",
                LEVELS.join(", ")
            ));
        }
    }
    tracing_subscriber::EnvFilter::try_new(text).map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    // An empty $MEMTIDE_CONFIG counts as unset (clap would refuse the empty path as a
    // --config given without a value). Changed while this is the only thread.
    if std::env::var_os("MEMTIDE_CONFIG").is_some_and(|v| v.is_empty()) {
        std::env::remove_var("MEMTIDE_CONFIG");
    }
    let cli = Cli::parse();
    // One worker: the daemon's work per tick is milliseconds even at 500 VMs, and a
    // second worker cost more in cross-thread wake-ups than it gave (bench/load-test.sh,
    // see docs/benchmarks.md); blocking work (libvirt calls, the state file's fsyncs)
    // runs on the blocking pool.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build();
    match runtime {
        Ok(runtime) => {
            let code = runtime.block_on(run(cli));
            // Blocking work still under way (a read of a hung FUSE mount, a KSM write
            // unmerging every page) is not waited for past a few seconds: dropping the
            // runtime would wait for it without end.
            runtime.shutdown_timeout(std::time::Duration::from_secs(5));
            code
        }
        Err(e) => {
            eprintln!("memtide: starting the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> ExitCode {
    let writer = memtide::journal::LogWriter::new();
    let error = writer.error_prefix();
    let (filter, from) = match (&cli.log_level, std::env::var("MEMTIDE_LOG")) {
        (Some(f), _) => (f.clone(), "--log-level"),
        (None, Ok(f)) if !f.trim().is_empty() => (f, "MEMTIDE_LOG"),
        (None, _) => ("info".to_string(), ""),
    };
    let filter = match log_filter(&filter) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("{error}memtide: {from} {filter:?}: {e}");
            return ExitCode::from(2);
        }
    };
    let log = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match cli.log_format {
        LogFormat::Json => log.json().init(),
        LogFormat::Text => log
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
    }
    match main_inner(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if memtide::stdout::is_closed(&e) => ExitCode::SUCCESS,
        Err(e) if e.is::<Reported>() => ExitCode::from(1),
        Err(e) => {
            eprintln!("{error}memtide: {e:#}");
            ExitCode::from(if e.is::<memtide::config::ConfigError>() {
                2
            } else {
                1
            })
        }
    }
}
