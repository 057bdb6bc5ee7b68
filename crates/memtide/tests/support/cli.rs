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
