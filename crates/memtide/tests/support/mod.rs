//! Test fixtures that start real things: QEMU guests in a memory cgroup of their own,
//! a libvirt daemon of the test's own, and the memtide daemon. Everything started is
//! stopped and removed on drop.

#![allow(dead_code)] // each test binary uses a different part of the support code

pub mod cgroup;
pub mod cli;
pub mod daemon;
pub mod guest;
pub mod libvirtd;
pub mod tmux;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The built test guest (`guest/build.sh`; `$MEMTIDE_GUEST_DIR` or target/guest): its
/// directory, or a panic saying how to build it.
pub fn guest_dir() -> PathBuf {
    memtide_testbed::guest_dir(None)
        .unwrap_or_else(|e| panic!("{e} (or scripts/test.sh, which does)"))
}

/// Poll `check` every 200 ms until it yields a value or `limit` passes.
pub fn wait_for<T>(limit: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let end = Instant::now() + limit;
    loop {
        if let Some(v) = check() {
            return Some(v);
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Send a signal by name (`STOP`, `CONT`, `KILL`, `TERM`) to a process.
pub fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(ok.success(), "kill -{sig} {pid} failed");
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// GET a path from a local HTTP server; returns the body.
pub fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "GET {path}: {head}");
    body.to_string()
}

/// Lints `metrics` (the classic text format, as `/metrics` serves it to clients that do
/// not ask for OpenMetrics) with `promtool check metrics`, from Debian's prometheus
/// package, which `scripts/test.sh` installs.
pub fn promtool_check_metrics(metrics: &str) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package; scripts/test.sh installs it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(metrics.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}\n{metrics}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The metric families `files` (paths from the workspace root: dashboards, rule files)
/// query: every `memtide_…` name in them.
pub fn families_queried(files: &[&str]) -> std::collections::BTreeSet<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut names = std::collections::BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        for (at, _) in text.match_indices("memtide_") {
            let name: String = text[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            names.insert(name);
        }
    }
    names
}

pub mod harness;

/// Start coldalloc in the guest (`cold_mib` written once, `hot_mib` written over and over,
/// a report a second into /tmp/cold.log) and wait until it has written its buffers: its
/// pid in the guest.
pub fn coldalloc(agent: &mut harness::Agent, cold_mib: u64, hot_mib: u64) -> u64 {
    let pid = agent.spawn_sh(&format!(
        "exec /bin/coldalloc --cold-mib {cold_mib} --hot-mib {hot_mib} --interval-s 1 \
         > /tmp/cold.log 2>&1"
    ));
    let written = "grep -q cold_resident_mib /tmp/cold.log";
    wait_for(Duration::from_secs(60), || {
        (agent.run_sh(written, Duration::from_secs(10)) == 0).then_some(())
    })
    .expect("coldalloc wrote its buffers");
    pid
}

/// One line of `memtide access`: its time (s), tracker and figures (MiB).
#[derive(Debug)]
pub struct AccessScan {
    pub t: f64,
    pub tracker: String,
    pub accessed: Option<f64>,
    pub cold: Option<f64>,
    pub resident: f64,
}

/// The guest's command line of `memtide access --config /data/memtide.toml ARGS`
/// (memtide's binary on its data disk).
pub fn guest_access_command(args: &str) -> String {
    format!("{GUEST_MEMTIDE} access --config /data/memtide.toml {args}")
}

/// [`guest_access_command`] run in the guest: its exit status and output.
pub fn guest_access(agent: &mut harness::Agent, args: &str) -> (i64, String) {
    let run = format!("{} > /tmp/access.log 2>&1", guest_access_command(args));
    let status = agent.run_sh(&run, Duration::from_secs(240));
    (status, agent.read_file("/tmp/access.log"))
}

/// `memtide access` on coldalloc for `count` scans (`args` naming its pid and the rest),
/// shown with coldalloc's last report: it succeeded, and its lines, each checked to find
/// coldalloc's buffers resident (`buffers_mib`, and a little heap, stack and static
/// data), the first to have counted no access (it only marks).
pub fn coldalloc_access(
    agent: &mut harness::Agent,
    args: &str,
    count: u64,
    buffers_mib: u64,
) -> Vec<AccessScan> {
    let (status, log) = guest_access(agent, &format!("{args} --count {count}"));
    let cold_log = agent.read_file("/tmp/cold.log");
    eprintln!(
        "{log}{}",
        cold_log.lines().last().unwrap_or("no coldalloc report")
    );
    assert_eq!(status, 0, "memtide access: {log}");
    let mib = |v: &serde_json::Value| v.as_u64().map(|b| b as f64 / (1 << 20) as f64);
    let scans: Vec<AccessScan> = log
        .lines()
        .map(|l| {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"));
            AccessScan {
                t: v["t"].as_f64().unwrap(),
                tracker: v["tracker"].as_str().unwrap().to_string(),
                accessed: mib(&v["accessed"]),
                cold: mib(&v["cold"]),
                resident: mib(&v["resident"]).unwrap(),
            }
        })
        .collect();
    assert_eq!(scans.len() as u64, count, "{log}");
    let buffers = buffers_mib as f64;
    for (n, scan) in scans.iter().enumerate() {
        assert!(
            (buffers..=buffers + 4.0).contains(&scan.resident),
            "scan {n}: {} MiB resident",
            scan.resident
        );
        assert_eq!(
            scan.accessed.is_none(),
            n == 0,
            "scan {n}: the first only marks"
        );
    }
    scans
}

/// A `NAME: N kB` (/proc/meminfo, /proc/PID/status) or `name N` (memory.stat,
/// /proc/vmstat) field of `text`, the line's first word being `name`, scaled by `unit`.
pub fn field(text: &str, name: &str, unit: u64) -> u64 {
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no {name} in\n{text}"));
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * unit
}

/// The bytes `memtide reclaim` asked for over its run, from its log (`… asked=N …`).
pub fn reclaim_asked(log: &str) -> u64 {
    log.lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.strip_prefix("asked="))
        .map(|n| n.parse::<u64>().unwrap())
        .sum()
}

/// memtide's binary on a [`data_disk`], as the guest runs it.
pub const GUEST_MEMTIDE: &str =
    "/data/lib/ld-linux-x86-64.so.2 --library-path /data/lib /data/memtide";

/// The `-drive` argument of a guest's data disk from [`data_disk`]'s `image`; the disk
/// itself is [`DATA_DEVICE`].
pub fn data_drive(image: &Path) -> String {
    format!("if=none,id=data,file={},format=raw", image.display())
}

/// QEMU's `-icount`, for a guest whose rates must not follow the host's load: its
/// clocks advance by its instructions (2^shift ns of its time each: 4 ns, 250 million
/// a second), so a rate in its seconds is work per instruction executed (in zswap_e2e,
/// without it, the VM's rate over the control's moved by up to 11% between two windows
/// with nothing changed; with it, by under 0.1%). What it counts is instructions:
/// reclaim's compressing, decompressing and bookkeeping, where the guest plays the
/// host; not what TCG does not model anyway (caches, TLB misses, memory bandwidth), nor
/// what would stall the vCPU on the host (a host page fault). A task waiting for a disk
/// costs the others' instructions meanwhile, or real time (`sleep=on`) where the vCPU
/// idles.
pub const ICOUNT: [&str; 2] = ["-icount", "shift=2,sleep=on"];
/// The `-device` argument of a guest's data disk: the serial guest/init mounts on /data.
pub const DATA_DEVICE: &str = "virtio-blk-pci,drive=data,serial=memtide-data";

/// A 384 MiB guest named `name` booting `kernel` (a directory holding `vmlinuz` and
/// `initrd.img`) in `cgroup`, `append` added to its command line, memtide's binary on
/// its data disk ([`GUEST_MEMTIDE`]): ready, with its agent.
pub fn guest_with_memtide(
    name: &str,
    dir: &Path,
    cgroup: &cgroup::TestCgroup,
    kernel: &Path,
    append: &str,
) -> (guest::Guest, harness::Agent) {
    let image = data_disk(dir, "");
    let drive = data_drive(&image);
    let devices = ["-drive", &drive, "-device", DATA_DEVICE];
    let mut guest =
        guest::Guest::boot_kernel(name, dir, &cgroup.procs(), kernel, 384, &devices, append);
    guest.wait_console("memtide-guest: ready", 1, Duration::from_secs(120));
    assert!(guest.console().contains("on /data"), "{}", guest.console());
    let agent = harness::Agent::connect(guest.agent());
    (guest, agent)
}

/// An ext2 image holding memtide's binary (debug info stripped), the shared libraries
/// it links against (the guest runs it through their loader, [`GUEST_MEMTIDE`]) and
/// `config` as memtide.toml, for a guest's data disk (mounted on /data).
pub fn data_disk(dir: &Path, config: &str) -> PathBuf {
    let root = dir.join("data");
    let lib = root.join("lib");
    std::fs::create_dir_all(&lib).unwrap();
    let memtide = env!("CARGO_BIN_EXE_memtide");
    let ok = std::process::Command::new("objcopy")
        .args(["--strip-debug", memtide])
        .arg(root.join("memtide"))
        .status()
        .unwrap();
    assert!(ok.success(), "objcopy --strip-debug {memtide}");
    let ldd = std::process::Command::new("ldd")
        .arg(memtide)
        .output()
        .unwrap();
    let ldd = String::from_utf8(ldd.stdout).unwrap();
    for path in ldd.split_whitespace().filter(|w| w.starts_with('/')) {
        let name = Path::new(path).file_name().unwrap();
        std::fs::copy(path, lib.join(name)).unwrap();
    }
    std::fs::write(root.join("memtide.toml"), config).unwrap();
    let size: u64 = walk(&root);
    const MIB: u64 = 1 << 20;
    let image = dir.join("data.img");
    let ok = std::process::Command::new("mke2fs")
        .args(["-q", "-t", "ext2", "-b", "4096", "-d"])
        .arg(&root)
        .arg(&image)
        .arg(format!("{}M", size / MIB * 5 / 4 + 16))
        .status()
        .unwrap();
    assert!(ok.success(), "mke2fs -d {}", root.display());
    image
}

fn walk(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            if m.is_dir() {
                walk(&e.path())
            } else {
                m.len()
            }
        })
        .sum()
}

/// A file standing in for the kernel's idle page bitmap under the sysfs mount `sys` (the
/// build host's kernel has none): a bit for every frame of up to 1 TiB of RAM, sparse; it
/// keeps every mark, as no access clears it.
pub fn idle_bitmap_stand_in(sys: &Path) -> PathBuf {
    let mm = sys.join("kernel/mm/page_idle");
    std::fs::create_dir_all(&mm).unwrap();
    let bitmap = mm.join("bitmap");
    std::fs::File::create(&bitmap)
        .unwrap()
        .set_len((1 << 40) / 4096 / 8)
        .unwrap();
    bitmap
}

/// The directory of the test-guest kernel with idle page tracking that
/// guest/build-idle-kernel.sh builds (none of Debian's has it).
pub fn idle_kernel() -> PathBuf {
    let kernel = guest_dir().join("idle");
    assert!(
        kernel.join("vmlinuz").exists(),
        "no {}/vmlinuz: run guest/build-idle-kernel.sh (scripts/test.sh does)",
        kernel.display()
    );
    kernel
}

/// The command line for a guest whose process DAMON tracks: under TCG a page's accessed
/// bit is set only when QEMU's software TLB misses on it, and DAMON clears the bit without
/// a TLB flush, so a hot page is seen again only after the guest flushes its TLB (a
/// context switch: tlbtick's wake-ups, every 500 ms by default). DAMON counts accesses
/// over 200 ms: tlbtick wakes every 20 ms, as a hardware TLB's entries come and go (and
/// under KVM, which has no such TLB).
pub const DAMON_GUEST_ARGS: &str = "memtide.tlbtick_ms=20";

/// The directory of the test guest with Debian's 6.12 cloud kernel, which has DAMON
/// (virtual address monitoring and its sysfs interface), that
/// `MEMTIDE_GUEST_KERNEL=6.12 guest/build.sh` builds (none of the 6.1 kernels has it).
pub fn damon_kernel() -> PathBuf {
    let kernel = guest_dir().join("linux-6.12");
    assert!(
        kernel.join("vmlinuz").exists() && kernel.join("initrd.img").exists(),
        "no {}/vmlinuz or initrd.img: run MEMTIDE_GUEST_KERNEL=6.12 guest/build.sh \
         (scripts/test.sh does)",
        kernel.display()
    );
    kernel
}
