//! hostile-guests: the memtide daemon (the release binary, as its own process at
//! RLIMIT_NOFILE 256) next to one honest real QEMU guest and, in each case, one hostile
//! endpoint of issue #18: a guest agent, QEMU monitor or Firecracker API that misbehaves,
//! or a local user holding HTTP connections open. Measures the daemon's peak RSS, its
//! longest tick, the log it writes, and whether the honest VM was managed on every tick;
//! writes `bench/results/hostile.json`. See docs/security.md.

use anyhow::Context;
use clap::Parser;
use memtide_bench::daemon_process::{managed, Daemon, Launch};
use memtide_bench::fake::agent::{self, Agent};
use memtide_bench::fake::qmp::{self, Qmp};
use memtide_bench::fake::vmm;
use memtide_testbed::{guest_dir, Boot, BALLOON};
use serde_json::{json, Value};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Run the daemon against hostile endpoints next to an honest guest.
#[derive(Parser)]
#[command(version)]
struct Cli {
    /// Where to write the results.
    #[arg(long, default_value = "bench/results/hostile.json")]
    out: PathBuf,
    /// The test guest's directory (default: $MEMTIDE_GUEST_DIR or target/guest).
    #[arg(long)]
    guest_dir: Option<PathBuf>,
    /// Seconds each case is measured.
    #[arg(long, default_value_t = 40)]
    run_s: u64,
    /// Directory for each case's files (daemon configuration, logs, sockets), emptied
    /// first.
    #[arg(long, default_value = "target/bench-runs/hostile")]
    work_dir: PathBuf,
    /// Only these cases (comma-separated).
    #[arg(long, value_delimiter = ',')]
    cases: Option<Vec<String>>,
}

/// The daemon's RLIMIT_NOFILE (soft and hard), as in the audit of issue #18.
const NOFILE: u64 = 256;
/// Seconds between ticks (the daemon's default), and the tick bound of the issue.
const INTERVAL_S: f64 = 2.0;
const MAX_TICK_SHARE: f64 = 1.1;
/// The bounds on peak RSS and on log bytes per minute per hostile guest.
const MAX_RSS_MIB: f64 = 64.0;
const MAX_LOG_PER_MIN: f64 = 10_240.0;
/// Every guest gets this balloon target (a policy in the policy language), so that
/// balloon commands go to the hostile VMs too.
const TARGET_MIB: u64 = 192;

/// The hostile part of one case.
enum Hostile {
    /// Nothing hostile: the reference.
    Nothing,
    /// A local user holds this many idle connections to the HTTP endpoint.
    HttpIdle(usize),
    /// A 256 MiB VM with this monitor and, if any, this guest agent.
    Vm(Qmp, Option<Agent>),
    /// A 1 GiB VM with this monitor.
    BigVm(Qmp),
    /// A VM found by discovery through a socket named to inject Prometheus series.
    InjectingName,
    /// A Firecracker VM whose API answers with 256 MiB bodies.
    HugeVmmReply,
}

/// The cases: the defect of issue #18 each one reproduces, and how.
fn cases() -> Vec<(&'static str, &'static str, Hostile)> {
    use Hostile::*;
    vec![
        ("baseline", "the honest guest alone", Nothing),
        (
            "http_idle_connections",
            "1: 300 idle HTTP connections",
            HttpIdle(300),
        ),
        (
            "agent_stream_without_delimiter",
            "3: an agent streaming bytes without 0xFF",
            Vm(Qmp::Honest, Some(Agent::StreamWithoutDelimiter)),
        ),
        (
            "agent_trickle",
            "4: an agent answering guest-file-read a byte at a time",
            Vm(Qmp::Honest, Some(Agent::Trickle)),
        ),
        (
            "agent_text_flood",
            "7: an agent answering with 128 KiB of terminal escapes",
            Vm(Qmp::Honest, Some(Agent::TextFlood)),
        ),
        (
            "absurd_figures",
            "9: u64::MAX counters, NaN PSI, a balloon of 1 PiB",
            Vm(Qmp::AbsurdFigures, Some(Agent::AbsurdFigures)),
        ),
        (
            "no_statistics",
            "5: a 1 GiB VM that gives no statistics",
            BigVm(Qmp::NoStatistics),
        ),
        (
            "qmp_event_flood",
            "6: a monitor sending a 4 MiB event every 50 ms",
            Vm(Qmp::EventFlood, None),
        ),
        (
            "vmm_huge_reply",
            "6: a Firecracker API answering with 256 MiB",
            HugeVmmReply,
        ),
        (
            "qmp_hung",
            "10: a monitor that stops answering",
            Vm(Qmp::Hung, None),
        ),
        (
            "qmp_ignores_balloon",
            "10: a monitor that never answers balloon",
            Vm(Qmp::IgnoresBalloon, None),
        ),
        (
            "discovered_name_injection",
            "8: a discovered socket named to inject a metric",
            InjectingName,
        ),
    ]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let memtide = memtide_bench::daemon_process::release_binary("bench/hostile-guests.sh")?;
    let work = memtide_bench::fresh_dir(&cli.work_dir)?;
    let procs = work.join("procs");
    let mut honest = Boot::new(
        "honest",
        &work,
        &guest_dir(cli.guest_dir.as_deref())?,
        "384",
    )
    .kernel_args("memtide.workload=memknobs memtide.args=32:100000")
    .qmp("qmp")
    .args(["-device", BALLOON])
    .agent()
    // The spawning thread is the main one, alive until the end.
    .spawn_with(&procs, memtide_bench::dies_with_harness)?;
    honest.wait_console("memtide-guest: ready", 1, Duration::from_secs(120))?;
    let honest_vm = format!(
        "[[vm]]\nname = \"honest\"\nqmp = {:?}\nagent = {:?}\n",
        honest.qmp[0].display().to_string(),
        honest
            .agent
            .as_ref()
            .context("agent socket")?
            .display()
            .to_string()
    );
    let policy = work.join("fixed.policy");
    std::fs::write(
        &policy,
        format!(
            "(with Guests guest (guest.Control \"balloon_target\" {}))\n",
            TARGET_MIB * 1024
        ),
    )?;

    let mut results = serde_json::Map::new();
    for (name, what, hostile) in cases() {
        if cli
            .cases
            .as_ref()
            .is_some_and(|c| !c.iter().any(|n| n == name))
        {
            continue;
        }
        eprintln!("hostile-guests: {name} ({what})");
        let dir = work.join(name);
        std::fs::create_dir(&dir)?;
        let config = hostile_part(&dir, &hostile)?;
        let config = format!(
            "interval_s = {INTERVAL_S}\npolicy = {:?}\n{config}[engine]\nksm_control = false\n{honest_vm}",
            policy.display().to_string()
        );
        let port = free_port()?;
        let daemon = Daemon::start(
            &memtide,
            &dir,
            &config,
            port,
            &Launch {
                nofile: Some(NOFILE),
                record: true,
            },
        )?;
        let connections: Vec<TcpStream> = match hostile {
            // Connections beyond the listen backlog wait for the handshake: give up on
            // those quickly.
            Hostile::HttpIdle(n) => {
                let addr = ([127, 0, 0, 1], port).into();
                (0..n)
                    .filter_map(|_| {
                        TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()
                    })
                    .collect()
            }
            _ => Vec::new(),
        };
        let held = connections.len();
        let run = Duration::from_secs(cli.run_s);
        let measured = tokio::task::block_in_place(|| {
            daemon.measure(
                |s| managed(s, "honest"),
                Duration::from_secs(60),
                run,
                Some("honest"),
            )
        })?;
        drop(connections);
        let met = measured.peak_rss_mib <= MAX_RSS_MIB
            && measured.max_tick_ms <= INTERVAL_S * 1000.0 * MAX_TICK_SHARE
            && measured.log_bytes_per_min <= MAX_LOG_PER_MIN
            && measured.honest_vm_managed == Some(true)
            && !measured.metrics_injected;
        eprintln!(
            "hostile-guests: {name}: peak RSS {:.1} MiB, max tick {:.0} ms, {:.0} log bytes/min, honest managed: {:?}, met: {met}",
            measured.peak_rss_mib, measured.max_tick_ms, measured.log_bytes_per_min, measured.honest_vm_managed
        );
        let mut case = serde_json::to_value(&measured)?;
        case["what"] = json!(what);
        if held > 0 {
            case["connections_held"] = json!(held);
        }
        case["met"] = json!(met);
        results.insert(name.to_string(), case);
    }
    let doc = json!({
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "commit": memtide_bench::git(&["rev-parse", "--short", "HEAD"]),
        "dirty": memtide_bench::git(&["status", "--porcelain", "--untracked-files=no"]).map(|s| !s.is_empty()),
        "interval_ms": INTERVAL_S * 1000.0,
        "run_s": cli.run_s,
        "daemon_nofile": 256,
        "targets": {"peak_rss_mib": MAX_RSS_MIB, "max_tick_ms": INTERVAL_S * 1000.0 * MAX_TICK_SHARE,
            "log_bytes_per_min": MAX_LOG_PER_MIN, "honest_vm_managed": true},
        "cases": Value::Object(results),
    });
    memtide_bench::write_json("hostile-guests", &cli.out, &doc)
}

/// Serve a case's hostile endpoints in `dir`; returns the configuration lines that point
/// the daemon at them (top-level tables before the honest VM's).
fn hostile_part(dir: &Path, hostile: &Hostile) -> anyhow::Result<String> {
    let quote = |p: &Path| format!("{:?}", p.display().to_string());
    let qmp = dir.join("hostile.qmp");
    let config = match hostile {
        Hostile::Nothing | Hostile::HttpIdle(_) => "[discovery]\nqmp_glob = []\n".to_string(),
        Hostile::Vm(behaviour, agent) => {
            qmp::serve(&qmp, *behaviour, 256 << 20, false)?;
            let mut vm = format!(
                "[discovery]\nqmp_glob = []\n[[vm]]\nname = \"hostile\"\nqmp = {}\n",
                quote(&qmp)
            );
            if let Some(agent) = agent {
                let socket = dir.join("hostile.agent");
                agent::serve(&socket, *agent)?;
                vm.push_str(&format!("agent = {}\n", quote(&socket)));
            }
            vm
        }
        Hostile::BigVm(behaviour) => {
            qmp::serve(&qmp, *behaviour, 1 << 30, false)?;
            format!(
                "[discovery]\nqmp_glob = []\n[[vm]]\nname = \"hostile\"\nqmp = {}\n",
                quote(&qmp)
            )
        }
        Hostile::InjectingName => {
            // Beside the case's directory: a unix socket's path has at most 107 bytes.
            let found = dir.with_file_name("d");
            std::fs::create_dir(&found)?;
            let name = "a\"} 1\nmemtide_injected_total{x=\"1.sock";
            qmp::serve(&found.join(name), Qmp::Honest, 256 << 20, false)?;
            format!(
                "[discovery]\nqmp_glob = [{}]\n",
                quote(&found.join("*.sock"))
            )
        }
        Hostile::HugeVmmReply => {
            let api = dir.join("hostile.fc");
            vmm::serve(&api)?;
            format!(
                "[discovery]\nqmp_glob = []\n[[vm]]\nname = \"hostile\"\nfirecracker = {}\n",
                quote(&api)
            )
        }
    };
    Ok(config)
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}
