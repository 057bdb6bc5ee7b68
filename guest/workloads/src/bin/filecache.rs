//! filecache: reads random blocks of a file set through the page cache,
//! forever, like a database whose working set is its buffer cache. Reports
//! the MiB read per second and the page cache refaults of the whole guest
//! (pages evicted and read back, from /proc/vmstat) since the previous line:
//!
//!     filecache setup file=/data/fileset wrote_mib=200 secs=3.1
//!     filecache t=12 set_mib=200 mib_per_s=345.6 refaults=0
//!
//! The setup line comes once, after the file was created or extended
//! (`wrote_mib=0` when it was long enough); `t` is seconds since it.

use std::process::ExitCode;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use memtide_workloads::cli::{self, filecache::Options};
use memtide_workloads::fileset::FileSet;
use memtide_workloads::progress::{PhaseMeter, Progress};
use memtide_workloads::report::{self, Ticker};
use memtide_workloads::vmstat::{self, Counter};

const NAME: &str = "filecache";

fn main() -> ExitCode {
    let options: Options = match cli::from_env(NAME, cli::filecache::parse, cli::filecache::usage) {
        Ok(options) => options,
        Err(code) => return code,
    };
    let set = options.set_mib << 20;
    let path = &options.file_set.path;
    let started = Instant::now();
    let mut file_set = match FileSet::prepare(path, set, options.file_set.block_bytes) {
        Ok((file_set, wrote)) => {
            report::emit(&report::format_line(
                &format!("{NAME} setup"),
                &[
                    ("file", &path.display()),
                    ("wrote_mib", &(wrote >> 20)),
                    ("secs", &format!("{:.1}", started.elapsed().as_secs_f64())),
                ],
            ));
            file_set
        }
        Err(err) => {
            eprintln!("{NAME}: cannot prepare {}: {err}", path.display());
            return ExitCode::FAILURE;
        }
    };

    let progress = Arc::new(Progress::new());
    thread::spawn({
        let progress = Arc::clone(&progress);
        move || report_forever(&progress, options.set_mib, options.interval)
    });
    match file_set.read_until(set, None, &progress) {
        Ok(()) => unreachable!("reading has no deadline"),
        Err(err) => {
            eprintln!("{NAME}: cannot read {}: {err}", path.display());
            ExitCode::FAILURE
        }
    }
}

fn report_forever(progress: &Progress, set_mib: u64, interval: Duration) {
    let mut ticker = Ticker::new(interval);
    let mut meter = PhaseMeter::default();
    let mut refaults = Counter::new(vmstat::REFAULT_FILE);
    loop {
        let t = ticker.wait();
        let mib_per_s = meter.mib_per_s(progress.snapshot());
        report::emit(&report::format_line(
            NAME,
            &[
                ("t", &t.as_secs()),
                ("set_mib", &set_mib),
                ("mib_per_s", &report::mib_per_s(mib_per_s)),
                ("refaults", &report::optional(refaults.delta())),
            ],
        ));
    }
}
