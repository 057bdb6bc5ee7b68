//! snapshot-bench: VM memory snapshots (#13) on a real test guest, through the release
//! daemon and CLI as an operator runs them: save throughput against the disk's own
//! sequential write bandwidth measured beside it, the guest's downtime, hibernation (what
//! QEMU's memory cgroup was charged, given back) and the wake-up (restore to a running
//! guest, its RAM checked), and four clones started from a snapshot (their memory
//! against the guest's, and how fast each starts with its RAM mapped from the template),
//! and a memory-writing guest's rate over its first 10 s after an eager and a lazy
//! restore. Writes `bench/results/snapshots.json`; see docs/snapshots.md.

use anyhow::{bail, ensure, Context};
use clap::Parser;
use memtide_adapters::qga::GuestAgent;
use memtide_adapters::qmp::client::QmpClient;
use memtide_adapters::write_behind::WriteBehind;
use memtide_bench::daemon_process::{Daemon, Launch};
use memtide_testbed::{guest_dir, Boot, Cgroup, BALLOON};
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Measure snapshots of a real guest.
#[derive(Parser)]
#[command(version)]
struct Cli {
    /// Where to write the results.
    #[arg(long, default_value = "bench/results/snapshots.json")]
    out: PathBuf,
    /// The test guest's directory (default: $MEMTIDE_GUEST_DIR or target/guest).
    #[arg(long)]
    guest_dir: Option<PathBuf>,
    /// The guest's memory, MiB.
    #[arg(long, default_value_t = 384)]
    guest_mib: u64,
    /// Random bytes the guest holds in its RAM (the state saved and checked), MiB: a
    /// file in its root, a tmpfs of half its memory.
    #[arg(long, default_value_t = 128)]
    state_mib: u64,
    /// Snapshots taken (the guest runs on) before the hibernation.
    #[arg(long, default_value_t = 3)]
    saves: usize,
    /// Directory for the guest, the daemon and the store, emptied first.
    #[arg(long, default_value = "target/bench-runs/snapshots")]
    work_dir: PathBuf,
    /// A QEMU >= 9.0's qemu-system-x86_64 (e.g. Debian bookworm-backports' 10.0,
    /// unpacked by `dpkg -x`): its migration to a file with and without `mapped-ram` is
    /// measured on a second guest beside memtide's path on the system QEMU.
    #[arg(long)]
    newer_qemu: Option<PathBuf>,
    /// That QEMU's firmware directory, given to it with `-L` (ROOT/usr/share/qemu).
    #[arg(long, requires = "newer_qemu")]
    newer_qemu_firmware: Option<PathBuf>,
    /// multifd channels for the newer QEMU's `mapped-ram` save and restore with multifd.
    #[arg(long, default_value_t = 4)]
    multifd_channels: u32,
    /// The buffer a third guest's memknobs writes over and over, MiB (most of its
    /// memory): its rate is followed after an eager and a lazy restore.
    #[arg(long, default_value_t = 256)]
    slowdown_mib: u64,
}

const CALL: Duration = Duration::from_secs(10);

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let memtide = memtide_bench::daemon_process::release_binary("bench/snapshots.sh")?;
    let work = memtide_bench::fresh_dir(&cli.work_dir)?;
    let rt = tokio::runtime::Runtime::new()?;
    let boot = Boot::new(
        "snap",
        &work,
        &guest_dir(cli.guest_dir.as_deref())?,
        cli.guest_mib.to_string(),
    )
    .kernel_args("memtide.workload=memknobs memtide.args=32:100000")
    .qmp("qmp")
    .args(["-device", BALLOON])
    .agent();
    // QEMU (and the one a restore starts) in a memory cgroup of its own: what it holds
    // is what the cgroup is charged, page cache included.
    let cgroup = Cgroup::create("snapshot-bench")?;
    let procs = cgroup.procs();
    let launch = command_line(&boot.command(&procs));
    let mut guest = boot.spawn_with(&procs, memtide_bench::dies_with_harness)?;
    guest.wait_console("memtide-guest: ready", 1, Duration::from_secs(120))?;
    let agent = guest.agent.clone().context("the guest agent")?;
    let fill = format!(
        "head -c {} /dev/urandom > /state && md5sum /state > /state.md5",
        cli.state_mib << 20
    );
    ensure!(rt.block_on(run_sh(&agent, &fill, Duration::from_secs(300)))? == 0);

    let store = work.join("store");
    let (daemon, config_file) = daemon_for(&memtide, &work, "snap", &guest.qmp[0], &launch)?;

    let mut saves = Vec::new();
    let mut verified_s = Vec::new();
    for _ in 0..cli.saves {
        let (saved, verified) = timed_save(&memtide, &config_file, &store.join("snap"))?;
        saves.push(saved);
        verified_s.push(verified);
    }
    let bytes = saves[0]["files"]["memory"]["bytes"].as_u64().unwrap_or(0);
    // The disk's figure moves from one write to the next (others write too): medians,
    // taken between the saves' figures.
    let (disk, disk_each) = disk_bandwidth(&store, bytes)?;

    let held = cgroup.usage()?;
    let hibernated = cli_json(&memtide, &config_file, &["save", "snap", "--hibernate"])?;
    wait(Duration::from_secs(30), "QEMU to quit", || {
        Ok(guest.alive().is_err())
    })?;
    std::thread::sleep(Duration::from_secs(2));
    let left = cgroup.usage()?;
    let freed = held.saturating_sub(left);

    let t0 = Instant::now();
    let out = memtide_cmd(&memtide, &config_file, &["restore", "snap"])?;
    let wake_s = t0.elapsed().as_secs_f64();
    let (_, restored_pid) = started(&out).context("the restored QEMU's pid")?;
    let intact = rt.block_on(run_sh(
        &agent,
        "md5sum -c /state.md5",
        Duration::from_secs(120),
    ));
    let answered_s = t0.elapsed().as_secs_f64();
    // Clones of the woken guest's snapshot, beside it (after the hibernation: the
    // template's file pages would count in what QEMU's cgroup holds).
    let clones = clone4(&memtide, &config_file, restored_pid as u32)?;
    // SAFETY: kill(2) of the QEMU the restore started; no memory is involved.
    unsafe { libc::kill(restored_pid, libc::SIGKILL) };
    drop(daemon);
    ensure!(
        intact? == 0,
        "the restored guest's state does not match its checksum"
    );

    // The newer QEMU on a guest of its own, once the system QEMU's are gone.
    let newer = match &cli.newer_qemu {
        Some(qemu) => {
            let g = guest_dir(cli.guest_dir.as_deref())?;
            Some(newer_qemu(&cli, qemu, &work, &g, &procs, &rt)?)
        }
        None => None,
    };
    drop(guest);
    let g = guest_dir(cli.guest_dir.as_deref())?;
    let slowdown = restore_slowdown(&cli, &memtide, &work, &g, &procs)?;

    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let stat = |key: &str| -> Vec<f64> { saves.iter().filter_map(|s| s[key].as_f64()).collect() };
    let downtime = stat("downtime_s");
    let save_s = stat("save_s");
    let save_gib_s: Vec<f64> = stat("write_s").iter().map(|w| gib(bytes) / w).collect();
    let doc = json!({
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "commit": memtide_bench::git(&["rev-parse", "--short", "HEAD"]),
        "dirty": memtide_bench::git(&["status", "--porcelain", "--untracked-files=no"]).map(|s| !s.is_empty()),
        "qemu": qemu_version(),
        "mechanism": saves[0]["mechanism"],
        "guest_mib": cli.guest_mib,
        "state_mib": cli.state_mib,
        "snapshot_bytes": bytes,
        "save_gib_s": median(&save_gib_s),
        "save_gib_s_each": save_gib_s,
        "write_s_each": stat("write_s"),
        "downtime_s_each": downtime,
        "save_with_checksum_s_each": save_s,
        "save_verified_s": median(&verified_s),
        "save_verified_s_each": verified_s,
        "disk_write_gib_s": disk,
        "disk_write_gib_s_each": disk_each,
        "save_share_of_disk": median(&save_gib_s) / disk,
        "hibernate_held_mib": held as f64 / (1u64 << 20) as f64,
        "hibernate_left_mib": left as f64 / (1u64 << 20) as f64,
        "hibernate_freed_mib": freed as f64 / (1u64 << 20) as f64,
        "hibernate_freed_share": freed as f64 / held.max(1) as f64,
        "hibernate_save_s": hibernated["save_s"],
        "restore_s": wake_s,
        "wake_s": wake_s,
        "wake_to_agent_s": answered_s,
        "state_intact": true,
        "lazy_restore_s": clones.start_s,
        "clone_template_s": clones.template_s,
        "clone4_memory_ratio": clones.ratio,
        "clone4_pss_mib": clones.four_mib,
        "guest_pss_mib": clones.one_mib,
        "eager_restore_slowdown": slowdown["eager"]["slowdown"],
        "lazy_restore_slowdown": slowdown["lazy"]["slowdown"],
        "restore_first_10s": slowdown,
    });
    let mut doc = doc;
    match newer {
        Some(mut newer) => {
            for (_, v) in newer.as_object_mut().into_iter().flatten() {
                if let Some(save) = v["save_gib_s"].as_f64() {
                    v["save_share_of_disk"] = json!(save / disk);
                }
            }
            doc["newer_qemu"] = newer;
        }
        None => {
            doc["not_measured"]["mapped_ram"] =
                "no --newer-qemu given: the system QEMU 7.2 has no mapped-ram (QEMU >= 9.0)".into()
        }
    }
    memtide_bench::write_json("snapshot-bench", &cli.out, &doc)
}

/// The newer QEMU's saves to a file — the plain migration stream (`file:`, as memtide's
/// fd path writes it), `mapped-ram` (each RAM page at a fixed offset of a sparse file),
/// and `mapped-ram` with multifd channels — `cli.saves` of each from one guest holding
/// the same state, stopped for each as memtide stops it; then a restore of each into a
/// fresh QEMU (`-incoming defer`, the same capabilities), its state checked. Each save
/// is timed from the migration's start to the file synced.
fn newer_qemu(
    cli: &Cli,
    qemu: &Path,
    work: &Path,
    guest_dir: &Path,
    procs: &Path,
    rt: &tokio::runtime::Runtime,
) -> anyhow::Result<Value> {
    let mut boot = Boot::new("newer", work, guest_dir, cli.guest_mib.to_string())
        .program(qemu)
        .kernel_args("memtide.workload=memknobs memtide.args=32:100000")
        .qmp("qmp")
        .args(["-device", BALLOON])
        .agent();
    if let Some(firmware) = &cli.newer_qemu_firmware {
        boot = boot.args([std::ffi::OsStr::new("-L"), firmware.as_os_str()]);
    }
    let mut guest = boot
        .clone()
        .spawn_with(procs, memtide_bench::dies_with_harness)?;
    guest.wait_console("memtide-guest: ready", 1, Duration::from_secs(120))?;
    let agent = guest.agent.clone().context("the guest agent")?;
    let fill = format!(
        "head -c {} /dev/urandom > /state && md5sum /state > /state.md5",
        cli.state_mib << 20
    );
    ensure!(rt.block_on(run_sh(&agent, &fill, Duration::from_secs(300)))? == 0);
    let qmp = guest.qmp[0].clone();
    let mut client = rt.block_on(QmpClient::connect(&qmp, CALL))?;
    let version = rt.block_on(client.execute("query-version", None))?;
    let variants = [
        ("file", false, 0),
        ("mapped_ram", true, 0),
        ("mapped_ram_multifd", true, cli.multifd_channels),
    ];
    let dir = work.join("newer");
    std::fs::create_dir_all(&dir)?;
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let guest_bytes = cli.guest_mib << 20;
    let mut out = serde_json::Map::new();
    for (name, mapped, channels) in variants {
        let mut write_s = Vec::new();
        let (mut len, mut written) = (0, 0);
        for i in 0..cli.saves {
            let file = dir.join(format!("{name}-{i}"));
            let _ = std::fs::remove_file(&file);
            write_s.push(rt.block_on(save_to_file(&mut client, &file, mapped, channels))?);
            let meta = std::fs::metadata(&file)?;
            (len, written) = (
                meta.len(),
                std::os::unix::fs::MetadataExt::blocks(&meta) * 512,
            );
            // The first is kept for the restore; the others only take room.
            if i > 0 {
                std::fs::remove_file(&file)?;
            }
        }
        let save_gib_s: Vec<f64> = write_s.iter().map(|s| gib(written) / s).collect();
        out.insert(
            name.into(),
            json!({
                "mapped_ram": mapped,
                "multifd_channels": channels,
                "file_bytes": len,
                "written_bytes": written,
                "write_s_each": write_s,
                "save_gib_s": median(&save_gib_s),
                "save_gib_s_each": save_gib_s,
                "guest_gib_per_s": gib(guest_bytes) / median(&write_s),
            }),
        );
    }
    drop(client);
    drop(guest);
    for (name, mapped, channels) in variants {
        let file = dir.join(format!("{name}-0"));
        let t0 = Instant::now();
        let restored = boot
            .clone()
            .args(["-incoming", "defer"])
            .spawn_with(procs, memtide_bench::dies_with_harness)?;
        let (migrated_s, client) =
            rt.block_on(restore_from_file(&restored.qmp[0], &file, mapped, channels))?;
        let wake_s = t0.elapsed().as_secs_f64();
        let intact = rt.block_on(run_sh(
            &agent,
            "md5sum -c /state.md5",
            Duration::from_secs(120),
        ))?;
        drop(client);
        drop(restored);
        ensure!(
            intact == 0,
            "{name}: the restored guest's state does not match its checksum"
        );
        let entry = &mut out[name];
        entry["restore_s"] = json!(wake_s);
        entry["migrate_in_s"] = json!(migrated_s);
        entry["state_intact"] = json!(true);
    }
    std::fs::remove_dir_all(&dir)?;
    out.insert("qemu".into(), version);
    Ok(Value::Object(out))
}

/// The migration capabilities and parameters of a save or restore to a file: `mapped-ram`,
/// multifd with `channels` (none: off), no bandwidth cap.
async fn file_migration(client: &mut QmpClient, mapped: bool, channels: u32) -> anyhow::Result<()> {
    let caps = json!({"capabilities": [
        {"capability": "mapped-ram", "state": mapped},
        {"capability": "multifd", "state": channels > 0},
    ]});
    client
        .execute("migrate-set-capabilities", Some(caps))
        .await?;
    let mut params = json!({"max-bandwidth": 1u64 << 40});
    if channels > 0 {
        params["multifd-channels"] = json!(channels);
    }
    client
        .execute("migrate-set-parameters", Some(params))
        .await?;
    Ok(())
}

/// Stop the guest, migrate it to `file` (`file:` URI), sync the file and resume it; the
/// seconds from the migration's start to the file synced.
async fn save_to_file(
    client: &mut QmpClient,
    file: &Path,
    mapped: bool,
    channels: u32,
) -> anyhow::Result<f64> {
    file_migration(client, mapped, channels).await?;
    client.execute("stop", None).await?;
    let t0 = Instant::now();
    let uri = format!("file:{}", file.display());
    client
        .execute("migrate", Some(json!({ "uri": uri })))
        .await?;
    migration_done(client).await?;
    std::fs::File::open(file)?.sync_all()?;
    let s = t0.elapsed().as_secs_f64();
    client.execute("cont", None).await?;
    Ok(s)
}

/// Into the QEMU waiting on `monitor` (`-incoming defer`), migrate `file` in and resume
/// the guest; the seconds from the migration's start to its end, and the monitor.
async fn restore_from_file(
    monitor: &Path,
    file: &Path,
    mapped: bool,
    channels: u32,
) -> anyhow::Result<(f64, QmpClient)> {
    let start = Instant::now();
    let mut client = loop {
        match QmpClient::connect(monitor, CALL).await {
            Ok(c) => break c,
            Err(_) if start.elapsed() < Duration::from_secs(30) => {
                tokio::time::sleep(Duration::from_millis(5)).await
            }
            Err(e) => bail!("the incoming QEMU's monitor: {e}"),
        }
    };
    file_migration(&mut client, mapped, channels).await?;
    let t0 = Instant::now();
    let uri = format!("file:{}", file.display());
    client
        .execute("migrate-incoming", Some(json!({ "uri": uri })))
        .await?;
    migration_done(&mut client).await?;
    let s = t0.elapsed().as_secs_f64();
    client.execute("cont", None).await?;
    Ok((s, client))
}

/// Poll `query-migrate` every 5 ms until the migration completed; an error if it failed.
async fn migration_done(client: &mut QmpClient) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        let m = client.execute("query-migrate", None).await?;
        match m["status"].as_str() {
            Some("completed") => return Ok(()),
            Some("failed") | Some("cancelled") => bail!("migration {}: {m}", m["status"]),
            _ if start.elapsed() > Duration::from_secs(300) => bail!("migration stuck: {m}"),
            _ => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
}

/// A restored guest's first seconds after it resumed, compared with the steady rate
/// before the save and with its own next as many.
const FOLLOWED: u64 = 10;
/// Reports before the save whose mean is the workload's steady rate.
const STEADY: usize = 5;

/// A guest's memory-writing workload after an eager and a lazy restore (#13). A third
/// guest, memknobs writing a word to each page of a `cli.slowdown_mib` buffer over and
/// over (each page once a pass) and reporting its rate every second, is hibernated
/// through a daemon of its own; it is then restored eagerly (`memtide snapshot restore`:
/// the snapshot checked and read whole before the guest runs) and, once that QEMU is
/// gone, lazily (a clone, its RAM the template's file mapped private: each page read
/// from the file when first touched), each time with the file it reads dropped from the
/// page cache first. Per restore: its QEMU's start to the guest running, the command's
/// time (each checks the snapshot's checksum first), the rate of each report over the
/// first `2 × FOLLOWED` s after it resumed, the mean of the first `FOLLOWED` s against
/// the steady rate before the save and against the next `FOLLOWED` s, and the QEMU's
/// major page faults and bytes read from storage up to the end of the first.
fn restore_slowdown(
    cli: &Cli,
    memtide: &Path,
    work: &Path,
    guest_dir: &Path,
    procs: &Path,
) -> anyhow::Result<Value> {
    let dir = work.join("slowdown");
    std::fs::create_dir_all(&dir)?;
    let args = format!(
        "memtide.workload=memknobs memtide.args={}:1000000",
        cli.slowdown_mib
    );
    let boot = Boot::new("knobs", &dir, guest_dir, cli.guest_mib.to_string())
        .kernel_args(&args)
        .qmp("qmp")
        .args(["-device", BALLOON]);
    let launch = command_line(&boot.command(procs));
    let mut guest = boot.spawn_with(procs, memtide_bench::dies_with_harness)?;
    let (daemon, config) = daemon_for(memtide, &dir, "knobs", &guest.qmp[0], &launch)?;
    guest.wait_console("memknobs t=", 3 * STEADY, Duration::from_secs(180))?;
    // The save starts just after a report, so that the first report after the restore
    // covers little from before the guest stopped.
    let seen = reports(&guest.serial).len();
    let t0 = Instant::now();
    while reports(&guest.serial).len() == seen {
        ensure!(
            t0.elapsed() < Duration::from_secs(10),
            "memknobs stopped reporting"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let snapshot = cli_json(memtide, &config, &["save", "knobs", "--hibernate"])?;
    wait(Duration::from_secs(30), "QEMU to quit", || {
        Ok(guest.alive().is_err())
    })?;
    drop(daemon);
    let before = reports(&guest.serial);
    ensure!(before.len() >= STEADY, "too few reports before the save");
    let (stopped, _) = before[before.len() - 1];
    let steady = mean(&before[before.len() - STEADY..]);
    let id = snapshot["id"].as_str().context("the snapshot's id")?;
    let snapshot_dir = dir.join("store").join("knobs").join(id);

    let cached = drop_cached(&snapshot_dir.join("memory"))?;
    let t0 = Instant::now();
    let out = memtide_cmd(memtide, &config, &["restore", "knobs"])?;
    let command_s = t0.elapsed().as_secs_f64();
    let mut eager = follow(&out, &guest.serial, stopped, steady)?;
    eager["command_s"] = json!(command_s);
    eager["file_cached_share"] = json!(cached);

    // The first clone makes the template (the snapshot's RAM in a file); the second,
    // started once the first is gone and the file dropped, is the one followed. Making
    // the template may time out under load (a QMP call unanswered for 5 s): 3 tries.
    let mut tries = 0;
    let first = loop {
        tries += 1;
        match memtide_cmd(memtide, &config, &["clone", "knobs", "1"]) {
            Ok(out) => break started(&out).context("the first clone's pid")?.1,
            Err(e) if tries < 3 => eprintln!("snapshot-bench: trying again: {e:#}"),
            Err(e) => return Err(e),
        }
    };
    kill(&[first])?;
    let cached = drop_cached(&snapshot_dir.join("template").join("ram"))?;
    let t0 = Instant::now();
    let out = memtide_cmd(memtide, &config, &["clone", "knobs", "1"])?;
    let command_s = t0.elapsed().as_secs_f64();
    let mut lazy = follow(&out, &dir.join("knobs-1.serial"), stopped, steady)?;
    lazy["command_s"] = json!(command_s);
    lazy["file_cached_share"] = json!(cached);
    lazy["template_tries"] = json!(tries);
    drop(guest);
    Ok(json!({
        "buffer_mib": cli.slowdown_mib,
        "steady_mib_per_s": steady,
        "steady_mib_per_s_each": before[before.len() - STEADY..].iter().map(|r| r.1).collect::<Vec<f64>>(),
        "lazy_over_eager": eager["mib_per_s"].as_f64().zip(lazy["mib_per_s"].as_f64()).map(|(e, l)| e / l),
        "eager": eager,
        "lazy": lazy,
    }))
}

/// Follow the QEMU a restore or clone started (`out`, its line) until its guest has
/// reported on console `serial` for `2 × FOLLOWED` s after `stopped` (the last report
/// before the save, in the guest's time), then kill it.
fn follow(out: &str, serial: &Path, stopped: u64, steady: f64) -> anyhow::Result<Value> {
    let (to_running_s, pid) = started(out).context("the restored QEMU's start and pid")?;
    let reported = |t: u64| {
        wait(
            Duration::from_secs(180),
            "the restored guest's reports",
            || Ok(reports(serial).iter().any(|r| r.0 >= t)),
        )
    };
    let end = stopped + FOLLOWED;
    reported(end)?;
    let major_faults = proc_field(pid, "stat", |stat| {
        // The fields after the command's closing parenthesis start at the third, `state`.
        stat.rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(9)?
            .parse()
            .ok()
    });
    let read_bytes = proc_field(pid, "io", |io| {
        io.lines()
            .find_map(|l| l.strip_prefix("read_bytes: "))?
            .parse()
            .ok()
    });
    reported(end + FOLLOWED)?;
    kill(&[pid])?;
    let all = reports(serial);
    let within = |from: u64, to: u64| -> Vec<(u64, f64)> {
        all.iter()
            .copied()
            .filter(|r| r.0 > from && r.0 <= to)
            .collect()
    };
    let first = mean_since(&within(stopped, end), stopped);
    let next = mean_since(&within(end, end + FOLLOWED), end);
    let each: Vec<Value> = within(stopped, end + FOLLOWED)
        .iter()
        .map(|r| json!([r.0 - stopped, r.1]))
        .collect();
    Ok(json!({
        "to_running_s": to_running_s,
        "mib_per_s": first,
        "next_mib_per_s": next,
        "mib_per_s_each": each,
        "slowdown": steady / first,
        "slowdown_over_next": next / first,
        "qemu_major_faults": major_faults,
        "qemu_read_mib": read_bytes.map(|b| b as f64 / (1u64 << 20) as f64),
    }))
}

/// memknobs' reports on console `serial`: the guest's seconds since it started, and the
/// MiB written per second since its previous report.
fn reports(serial: &Path) -> Vec<(u64, f64)> {
    let text = std::fs::read_to_string(serial).unwrap_or_default();
    let field = |line: &str, key: &str| -> Option<String> {
        let value = line.split_whitespace().find_map(|w| w.strip_prefix(key))?;
        Some(value.to_string())
    };
    text.lines()
        .filter(|l| l.starts_with("memknobs t="))
        .filter_map(|l| {
            Some((
                field(l, "t=")?.parse().ok()?,
                field(l, "mib_per_s=")?.parse().ok()?,
            ))
        })
        .collect()
}

/// The mean rate of consecutive reports, each weighted by the seconds it covers (a
/// stalled guest skips reports); the first covers the time since `since`.
fn mean_since(reports: &[(u64, f64)], since: u64) -> f64 {
    let mut last = since;
    let (mut mib, mut secs) = (0.0, 0.0);
    for &(t, rate) in reports {
        mib += rate * (t - last) as f64;
        secs += (t - last) as f64;
        last = t;
    }
    mib / secs
}

/// The mean rate of reports that follow one another.
fn mean(reports: &[(u64, f64)]) -> f64 {
    mean_since(&reports[1..], reports[0].0)
}

/// Drop `path` from the page cache (written back first: a dirty page stays); the share
/// of its pages still cached after.
fn drop_cached(path: &Path) -> anyhow::Result<f64> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).with_context(|| format!("{}", path.display()))?;
    file.sync_all()?;
    let fd = file.as_raw_fd();
    // SAFETY: an advice on an open descriptor; no memory is involved.
    let rc = unsafe { libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED) };
    ensure!(rc == 0, "posix_fadvise {}: error {rc}", path.display());
    let len = file.metadata()?.len() as usize;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let mut resident = vec![0u8; len.div_ceil(page)];
    // SAFETY: a read-only mapping of the whole file, never read, unmapped below; mincore
    // writes one byte per page of it into `resident`, which has as many.
    let rc = unsafe {
        let map = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd,
            0,
        );
        ensure!(map != libc::MAP_FAILED, "mmap {}", path.display());
        let rc = libc::mincore(map, len, resident.as_mut_ptr());
        libc::munmap(map, len);
        rc
    };
    ensure!(rc == 0, "mincore {}", path.display());
    let cached = resident.iter().filter(|b| *b & 1 == 1).count();
    Ok(cached as f64 / resident.len().max(1) as f64)
}

/// A count `parse` finds in process `pid`'s `/proc/PID/FILE`.
fn proc_field(pid: i32, file: &str, parse: impl Fn(&str) -> Option<u64>) -> Option<u64> {
    parse(&std::fs::read_to_string(format!("/proc/{pid}/{file}")).ok()?)
}

/// A restore's or clone's line: the seconds from its QEMU's start to the guest running,
/// and the QEMU's pid.
fn started(line: &str) -> Option<(f64, i32)> {
    let after = |key: &str| line.split(key).nth(1)?.split([' ', ',']).next();
    Some((
        after(" in ")?.parse().ok()?,
        after("QEMU pid ")?.parse().ok()?,
    ))
}

/// SIGKILL the QEMUs `pids` this harness started and wait until they are gone.
fn kill(pids: &[i32]) -> anyhow::Result<()> {
    for pid in pids {
        // SAFETY: kill(2) of a QEMU a restore or clone started; no memory is involved.
        unsafe { libc::kill(*pid, libc::SIGKILL) };
    }
    wait(Duration::from_secs(10), "the QEMUs to end", || {
        Ok(pids
            .iter()
            .all(|p| !Path::new(&format!("/proc/{p}/exe")).exists()))
    })
}

/// A command's program and arguments as strings.
fn command_line(command: &Command) -> Vec<String> {
    std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

/// A daemon in `dir` managing VM `vm` (its monitor `qmp`, started by `launch`; clones by
/// the same with the VM's console and sockets numbered), its store `dir/store`, once it
/// has sampled the VM; and its configuration file.
fn daemon_for(
    memtide: &Path,
    dir: &Path,
    vm: &str,
    qmp: &Path,
    launch: &[String],
) -> anyhow::Result<(Daemon, PathBuf)> {
    let quoted = |args: &[String]| -> String {
        let quoted: Vec<String> = args.iter().map(|a| format!("{a:?}")).collect();
        quoted.join(", ")
    };
    // A clone's own sockets and console: the guest's, numbered.
    let clone_launch: Vec<String> = launch
        .iter()
        .map(|a| a.replace(&format!("/{vm}."), &format!("/{vm}-{{n}}.")))
        .collect();
    let config = format!(
        "interval_s = 2\npolicy = \"none\"\n[discovery]\nqmp_glob = []\n[engine]\nksm_control = false\n\
         [snapshots]\ndir = {:?}\n[[vm]]\nname = {vm:?}\nqmp = {:?}\nlaunch = [{}]\nclone_launch = [{}]\n",
        dir.join("store").display().to_string(),
        qmp.display().to_string(),
        quoted(launch),
        quoted(&clone_launch)
    );
    let launch_daemon = Launch {
        nofile: None,
        record: false,
    };
    let daemon = Daemon::start(memtide, dir, &config, 0, &launch_daemon)?;
    wait(Duration::from_secs(60), "the guest sampled", || {
        Ok(memtide_bench::daemon_process::managed(
            &daemon.status()?,
            vm,
        ))
    })?;
    Ok((daemon, dir.join("memtide.toml")))
}

/// What four clones of the guest cost, against the guest itself.
struct Clones {
    /// Median time from starting a clone's QEMU to the clone running (its RAM mapped from
    /// the template, read as it is touched): a lazy restore.
    start_s: f64,
    /// Making the template from the latest snapshot (once per snapshot).
    template_s: f64,
    /// The clones' proportional set sizes together, ÷ the guest's.
    ratio: f64,
    four_mib: f64,
    one_mib: f64,
}

/// Start 4 clones of the guest (QEMU pid `guest`) from its latest snapshot, measure them
/// after 3 s, and stop them.
fn clone4(memtide: &Path, config: &Path, guest: u32) -> anyhow::Result<Clones> {
    let t0 = Instant::now();
    let out = memtide_cmd(memtide, config, &["clone", "snap", "4"])?;
    let total_s = t0.elapsed().as_secs_f64();
    let (starts, pids): (Vec<f64>, Vec<i32>) = out
        .lines()
        .filter(|l| l.contains(" clone "))
        .map(started)
        .collect::<Option<Vec<_>>>()
        .context("a clone's start time and pid")?
        .into_iter()
        .unzip();
    ensure!(pids.len() == 4, "4 clones started: {out}");
    std::thread::sleep(Duration::from_secs(3));
    let four: u64 = pids.iter().map(|p| memtide_testbed::pss(*p as u32)).sum();
    let one = memtide_testbed::pss(guest);
    kill(&pids)?;
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    Ok(Clones {
        start_s: median(&starts),
        template_s: total_s - starts.iter().sum::<f64>(),
        ratio: four as f64 / one.max(1) as f64,
        four_mib: mib(four),
        one_mib: mib(one),
    })
}

/// `memtide snapshot ARGS --config CONFIG`, its output; an error with it when it fails.
fn memtide_cmd(memtide: &Path, config: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(memtide)
        .arg("snapshot")
        .args(args)
        .arg("--config")
        .arg(config)
        .output()?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!("memtide snapshot {}: {text}", args.join(" "));
    }
    eprintln!("snapshot-bench: {}", text.trim());
    Ok(text)
}

/// Run `memtide snapshot ARGS` (`ARGS[1]` the VM), then describe the VM's latest snapshot.
fn cli_json(memtide: &Path, config: &Path, args: &[&str]) -> anyhow::Result<Value> {
    memtide_cmd(memtide, config, args)?;
    let list = memtide_cmd(memtide, config, &["list", args[1], "--json"])?;
    let all: Vec<Value> = serde_json::from_str(list.trim())?;
    all.last().cloned().context("no snapshot listed")
}

/// Save VM `snap` as [`cli_json`] does, and time it from the outside: from its memory
/// file's creation in `vm_dir` (a `.partial` directory; memtide creates the file just
/// before it stops the guest) to the snapshot renamed whole, checksummed and described:
/// stop to verified, without the time from the request to the stop that `save_s` counts
/// (the wait for the daemon's next tick, before saves started at once).
fn timed_save(memtide: &Path, config: &Path, vm_dir: &Path) -> anyhow::Result<(Value, f64)> {
    let entries = |dir: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(dir)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default()
    };
    let before = entries(vm_dir);
    let watching = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let watcher = {
        let (vm_dir, watching) = (vm_dir.to_path_buf(), watching.clone());
        std::thread::spawn(move || {
            let (mut created, mut whole) = (None, None);
            // Once more after the save returned: it returns only once the snapshot is whole.
            loop {
                let last = !watching.load(std::sync::atomic::Ordering::Relaxed);
                for path in entries(&vm_dir).iter().filter(|p| !before.contains(p)) {
                    let partial = path.extension().is_some_and(|e| e == "partial");
                    if partial && created.is_none() && path.join("memory").exists() {
                        created = Some(Instant::now());
                    } else if !partial && created.is_some() {
                        whole = Some(Instant::now());
                    }
                }
                if last || whole.is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_micros(500));
            }
            Some(whole?.duration_since(created?).as_secs_f64())
        })
    };
    let saved = cli_json(memtide, config, &["save", "snap"]);
    watching.store(false, std::sync::atomic::Ordering::Relaxed);
    let verified = watcher.join().ok().flatten();
    Ok((saved?, verified.context("the save's files were not seen")?))
}

/// Run `sh -c script` in the guest through its agent; its exit status.
async fn run_sh(agent: &Path, script: &str, limit: Duration) -> anyhow::Result<i64> {
    let start = Instant::now();
    let mut session = loop {
        match GuestAgent::connect(agent, CALL).await {
            Ok(s) => break s,
            Err(_) if start.elapsed() < limit => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(e) => bail!("guest agent: {e}"),
        }
    };
    let args = json!({"path": "/bin/sh", "arg": ["-c", script]});
    let pid = session.execute("guest-exec", args).await?["pid"]
        .as_u64()
        .context("guest-exec returns a pid")?;
    while start.elapsed() < limit {
        let s = session
            .execute("guest-exec-status", json!({ "pid": pid }))
            .await?;
        if s["exited"] == true {
            return Ok(s["exitcode"].as_i64().unwrap_or(-1));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!("sh -c {script:?} did not end within {limit:?}")
}

/// Sequential write bandwidth of `dir`'s file system, `bytes` of incompressible data
/// written from memory in 1 MiB writes and synced, as a save writes its file, in each way
/// [`disk_write_gib_s`] has, by turns, `DISK_RUNS` times each: the faster way's median
/// (the disk's figure), and every write's.
fn disk_bandwidth(dir: &Path, bytes: u64) -> anyhow::Result<(f64, Value)> {
    let (mut behind, mut fsync_only) = (Vec::new(), Vec::new());
    for _ in 0..DISK_RUNS {
        behind.push(disk_write_gib_s(dir, bytes, true)?);
        fsync_only.push(disk_write_gib_s(dir, bytes, false)?);
    }
    let best = median(&behind).max(median(&fsync_only));
    Ok((
        best,
        json!({"write_behind": behind, "fsync_only": fsync_only}),
    ))
}

/// Writes of the disk in each way.
const DISK_RUNS: usize = 3;

/// One write of `bytes` into `dir`, then fsync, in GiB/s: with `behind`, written behind
/// as memtide writes a save (`WriteBehind`: writeback started while the writes go on);
/// without, the disk's writeback left to the fsync.
fn disk_write_gib_s(dir: &Path, bytes: u64, behind: bool) -> anyhow::Result<f64> {
    let path = dir.join("disk-bandwidth.tmp");
    let mut block = vec![0u8; 1 << 20];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for b in block.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let start = Instant::now();
    let mut file = std::fs::File::create(&path)?;
    let writing = behind.then(|| WriteBehind::start(&file));
    let mut left = bytes;
    while left > 0 {
        let n = left.min(block.len() as u64);
        file.write_all(&block[..n as usize])?;
        left -= n;
    }
    drop(writing);
    file.sync_all()?;
    let s = start.elapsed().as_secs_f64();
    std::fs::remove_file(&path)?;
    Ok(bytes as f64 / (1u64 << 30) as f64 / s)
}

fn qemu_version() -> Option<String> {
    let out = Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
        .ok()?;
    Some(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()?
            .to_string(),
    )
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Poll `check` every 200 ms until it is true; an error naming `what` after `limit`.
fn wait(
    limit: Duration,
    what: &str,
    mut check: impl FnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if check().unwrap_or(false) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    bail!("gave up waiting for {what} after {limit:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restores_and_a_clones_line_give_the_time_to_running_and_the_pid() {
        let restored = "knobs restored from 20261126T113621.708Z in 0.74 s (QEMU pid 4020, \
                        its output in /w/restore.log)";
        assert_eq!(started(restored), Some((0.74, 4020)));
        let cloned = "knobs clone 1 started from 20261126T113621.708Z in 0.10 s (QEMU pid 4584, \
                      its output in /w/clone-1.log)";
        assert_eq!(started(cloned), Some((0.10, 4584)));
        assert_eq!(started("knobs saved as 1 (342 MiB) in 1.0 s"), None);
    }

    #[test]
    fn memknobs_reports_are_read_from_the_console_and_averaged_over_the_seconds_they_cover() {
        let dir = tempfile::tempdir().unwrap();
        let serial = dir.path().join("g.serial");
        std::fs::write(
            &serial,
            "memtide-guest: ready\nmemknobs t=11 phase=1 size_mib=256 mib_per_s=100.0\n\
             memknobs t=12 phase=1 size_mib=256 mib_per_s=200.5\nnoise\n\
             memknobs t=15 phase=1 size_mib=256 mib_per_s=50\n",
        )
        .unwrap();
        let all = reports(&serial);
        assert_eq!(all, [(11, 100.0), (12, 200.5), (15, 50.0)]);
        // A report after a stall covers the seconds since the one before it.
        assert_eq!(mean_since(&all[1..], 11), (200.5 + 3.0 * 50.0) / 4.0);
        assert_eq!(mean(&all), mean_since(&all[1..], 11));
    }
}
