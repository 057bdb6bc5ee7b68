//! The memtide binary run as a command, to its end, and what it printed.

use std::path::Path;
use std::process::Output;

/// `memtide ARGS` run in `dir`.
pub fn run_in(dir: &Path, args: &[&str]) -> Output {
    super::daemon::memtide()
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap()
}

/// What it printed on standard output.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// What it printed on standard error.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A fake /proc and /sys under `root`: the domain 1 GiB with 100 MiB free, KSM off.
pub fn fake_host(root: &Path) {
    let proc = root.join("proc");
    std::fs::create_dir_all(proc.join("pressure")).unwrap();
    std::fs::create_dir_all(root.join("sys/kernel/mm/ksm")).unwrap();
    std::fs::write(
        proc.join("meminfo"),
        "MemTotal: 1048576 kB\nMemFree: 102400 kB\nBuffers: 0 kB\nCached: 0 kB\n",
    )
    .unwrap();
    std::fs::write(proc.join("vmstat"), "pswpin 0\npswpout 0\n").unwrap();
    for (knob, v) in [
        ("run", "0"),
        ("pages_to_scan", "100"),
        ("sleep_millisecs", "20"),
    ] {
        std::fs::write(root.join("sys/kernel/mm/ksm").join(knob), v).unwrap();
    }
}
