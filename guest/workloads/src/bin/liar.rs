//! liar: a hostile guest for memtide's tests. It mounts a second procfs to read the
//! truth, binds a file over /proc/meminfo — what the guest agent reads for memtide — and
//! rewrites it every second to claim that all the guest's memory is in use and
//! committed and its swap full ([`memtide_workloads::lie`]). It touches no memory of
//! its own. Reports what it claims:
//!
//!     liar t=12 total_mib=376 claimed_available_mib=3
//!
//! The balloon's statistics come from the kernel and stay true.

use std::fs;
use std::io::Write;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use memtide_workloads::lie;

const NAME: &str = "liar";
const TRUTH: &str = "/tmp/liar-truth";
const FAKE: &str = "/tmp/liar-meminfo";

fn main() -> ExitCode {
    let mount = |args: &[&str]| {
        Command::new("mount")
            .args(args)
            .status()
            .is_ok_and(|s| s.success())
    };
    if fs::create_dir_all(TRUTH).is_err() || !mount(&["-t", "proc", "proc", TRUTH]) {
        eprintln!("{NAME}: cannot mount a second procfs on {TRUTH}");
        return ExitCode::FAILURE;
    }
    let truth = format!("{TRUTH}/meminfo");
    if rewrite(&truth).is_none() || !mount(&["-o", "bind", FAKE, "/proc/meminfo"]) {
        eprintln!("{NAME}: cannot bind {FAKE} over /proc/meminfo");
        return ExitCode::FAILURE;
    }
    let start = Instant::now();
    loop {
        if let Some(total_kib) = rewrite(&truth) {
            println!(
                "{NAME} t={} total_mib={} claimed_available_mib={}",
                start.elapsed().as_secs(),
                total_kib >> 10,
                (total_kib / 100) >> 10
            );
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Rewrite the fake file in place (a bind mount follows the inode, not the name) from
/// the real figures, in one write; the real MemTotal in KiB.
fn rewrite(truth: &str) -> Option<u64> {
    let real = fs::read_to_string(truth).ok()?;
    let fake = lie::meminfo(&real)?;
    let mut file = fs::File::create(FAKE).ok()?;
    file.write_all(fake.as_bytes()).ok()?;
    lie::kib(&real, "MemTotal")
}
