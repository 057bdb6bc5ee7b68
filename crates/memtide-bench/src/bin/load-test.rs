//! load-test: the release memtide daemon managing many VMs at once, each a QEMU monitor
//! and a guest agent served by the harness on unix sockets (answering like QEMU and
//! qemu-ga for a quiet 256 MiB guest). Measures the daemon's CPU per VM per tick, its peak
//! RSS and its late ticks; writes `bench/results/load-500.json`. See docs/benchmarks.md.

use clap::Parser;
use memtide_bench::daemon_process::{Daemon, Launch};
use memtide_bench::fake::agent::{self, Agent};
use memtide_bench::fake::qmp::{self, Qmp};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Duration;

/// Run the daemon against many fake VMs and measure what each costs it.
#[derive(Parser)]
#[command(version)]
struct Cli {
    /// How many VMs.
    #[arg(long, default_value_t = 500)]
    vms: usize,
    /// Seconds measured, once every VM is managed.
    #[arg(long, default_value_t = 600)]
    run_s: u64,
    /// The daemon's interval.
    #[arg(long, default_value_t = 1.0)]
    interval_s: f64,
    /// Where to write the results.
    #[arg(long, default_value = "bench/results/load-500.json")]
    out: PathBuf,
    /// Directory for sockets and the daemon's files, emptied first.
    #[arg(long, default_value = "target/bench-runs/load")]
    work_dir: PathBuf,
}

/// Issue #16's targets: CPU per VM per tick, and RSS as a base plus a share per VM.
const CPU_US_PER_VM_TICK: f64 = 50.0;
const RSS_BASE_MIB: f64 = 15.0;
const RSS_PER_VM_KIB: f64 = 20.0;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    raise_nofile()?;
    let memtide = memtide_bench::daemon_process::release_binary("bench/load-test.sh")?;
    let work = memtide_bench::fresh_dir(&cli.work_dir)?;
    let mut config = format!(
        "interval_s = {}\n[discovery]\nqmp_glob = []\n[engine]\nksm_control = false\n",
        cli.interval_s
    );
    for i in 0..cli.vms {
        let (monitor, guest_agent) = (work.join(format!("{i}.q")), work.join(format!("{i}.a")));
        // Under KVM, as on the hosts it stands for: with TCG the daemon would sample each
        // guest's accesses through its hypervisor's page tables, here all the harness's
        // (500 walks of one process a tick: 1.1 ms of CPU per VM per tick).
        qmp::serve(&monitor, Qmp::Honest, 256 << 20, true)?;
        agent::serve(&guest_agent, Agent::Honest)?;
        config.push_str(&format!(
            "[[vm]]\nname = \"vm{i:03}\"\nqmp = {:?}\nagent = {:?}\n",
            monitor.display().to_string(),
            guest_agent.display().to_string()
        ));
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let launch = Launch {
        nofile: None,
        record: false,
    };
    let daemon = Daemon::start(&memtide, &work, &config, port, &launch)?;
    eprintln!(
        "load-test: {} VMs, waiting until every one is managed",
        cli.vms
    );
    let all = cli.vms;
    let measured = tokio::task::block_in_place(|| {
        daemon.measure(
            |s| managed_count(s) == all,
            Duration::from_secs(300),
            Duration::from_secs(cli.run_s),
            None,
        )
    })?;
    let per_vm_tick_us = measured.cpu_s * 1e6 / (measured.ticks.max(1) as f64 * cli.vms as f64);
    let rss_target = RSS_BASE_MIB + RSS_PER_VM_KIB * cli.vms as f64 / 1024.0;
    eprintln!(
        "load-test: {} ticks, {per_vm_tick_us:.1} µs CPU per VM per tick, peak RSS {:.1} MiB, {} late ticks, longest {:.0} ms",
        measured.ticks, measured.peak_rss_mib, measured.late_ticks, measured.max_tick_ms
    );
    let doc = json!({
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "commit": memtide_bench::git(&["rev-parse", "--short", "HEAD"]),
        "dirty": memtide_bench::git(&["status", "--porcelain", "--untracked-files=no"]).map(|s| !s.is_empty()),
        "vms": cli.vms,
        "interval_ms": cli.interval_s * 1000.0,
        "run_s": cli.run_s,
        "cpu_us_per_vm_tick": per_vm_tick_us,
        "rss_mib": measured.peak_rss_mib,
        "late_ticks": measured.late_ticks,
        "max_tick_ms": measured.max_tick_ms,
        "ticks": measured.ticks,
        "cpu_share": measured.cpu_share,
        "targets": {"cpu_us_per_vm_tick": CPU_US_PER_VM_TICK, "rss_mib": rss_target, "late_ticks": 0},
        "met": per_vm_tick_us <= CPU_US_PER_VM_TICK && measured.peak_rss_mib <= rss_target && measured.late_ticks == 0,
    });
    memtide_bench::write_json("load-test", &cli.out, &doc)
}

/// VMs the status's last decision managed.
fn managed_count(status: &Value) -> usize {
    status["decision"]["vms"].as_array().map_or(0, |vms| {
        vms.iter().filter(|v| v["state"] == "managed").count()
    })
}

/// Two sockets per VM, and a connection on each: raise the soft descriptor limit to the
/// hard one.
fn raise_nofile() -> std::io::Result<()> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write `limit`.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        limit.rlim_cur = limit.rlim_max;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
