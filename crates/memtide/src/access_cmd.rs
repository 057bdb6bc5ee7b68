//! `memtide access`: page tracking (DAMON or idle page tracking) of one process in the
//! foreground, a JSON line a scan — what the daemon measures of a VM's guest RAM, tried
//! on any process.

use memtide_adapters::access::{Mappings, Method, Scan, Tracker};
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// What to track, and for how long.
pub struct Options {
    /// The process.
    pub pid: i32,
    /// Its mappings to track.
    pub mappings: Mappings,
    /// A page untouched this long is cold.
    pub cold_age: Duration,
    /// Between two scans.
    pub interval: Duration,
    /// Stop after this many scans.
    pub count: u64,
    /// How to track its accesses.
    pub method: Method,
    /// The procfs mount.
    pub proc: PathBuf,
    /// The sysfs mount.
    pub sys: PathBuf,
}

/// Scan `options.count` times, a line each to `out`:
/// `{"t":…,"tracker":…,"accessed":…,"cold":…,"resident":…,"scan_ms":…}` (`tracker`:
/// `"damon"` or `"idle"`; bytes; `accessed` null at the first scan, `cold` null until
/// the scans span the cold age). A failed scan is an error naming what could not be read.
pub fn run(options: &Options, out: &mut impl Write) -> anyhow::Result<()> {
    let mut tracker = Tracker::open(
        &options.proc,
        &options.sys,
        options.pid,
        options.mappings.clone(),
        options.cold_age,
        options.method,
    )?;
    let start = Instant::now();
    for n in 0..options.count {
        if n > 0 {
            std::thread::sleep(options.interval);
        }
        let at = start.elapsed();
        let scan = tracker.scan(at)?;
        let tracker = tracker.method().key();
        writeln!(out, "{}", line(at, start.elapsed() - at, tracker, &scan))?;
        out.flush()?;
    }
    Ok(())
}

fn line(at: Duration, took: Duration, tracker: &str, scan: &Scan) -> serde_json::Value {
    json!({
        "t": (at.as_secs_f64() * 1000.0).round() / 1000.0,
        "tracker": tracker,
        "accessed": scan.accessed.map(|b| b.0),
        "cold": scan.cold.map(|b| b.0),
        "resident": scan.resident.0,
        "scan_ms": (took.as_secs_f64() * 1e4).round() / 10.0,
    })
}
