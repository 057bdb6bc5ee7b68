//! `memtide reclaim`: proactive reclaim of one cgroup in the foreground, with the
//! daemon's pacing and I/O ([`Reclaimer`]), a line per tick — to try the settings on a
//! process before the daemon does it for its VMs.

use crate::config::ReclaimConfig;
use crate::daemon::reclaim::{Done, Outcome, Place, Reclaimer, Target};
use memtide_adapters::reclaim::Reclaimed;
use memtide_core::reclaim::Keep;
use memtide_core::Bytes;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// What to reclaim from, and for how long.
pub struct Options {
    /// The cgroup (`Place::Cgroup`) or the process whose cgroup it is.
    pub place: Place,
    /// What the process keeps.
    pub keep: Keep,
    /// Between two ticks.
    pub interval: Duration,
    /// Stop after this many ticks.
    pub ticks: u64,
    /// Decide, write nothing.
    pub dry_run: bool,
}

/// Run `options.ticks` ticks with `config`'s pacing, writing a line per tick to `out`;
/// returns how many ticks failed.
pub fn run(
    config: &ReclaimConfig,
    proc: PathBuf,
    options: &Options,
    out: &mut impl Write,
) -> std::io::Result<u64> {
    let mut reclaimer = Reclaimer::new(config, proc);
    let target = Target {
        vm: "cgroup".into(),
        place: options.place.clone(),
        keep: options.keep,
    };
    let (start, mut failed) = (Instant::now(), 0);
    for tick in 0..options.ticks {
        if tick > 0 {
            std::thread::sleep(options.interval);
        }
        let at = start.elapsed();
        for o in reclaimer.pass(std::slice::from_ref(&target), at, options.dry_run) {
            failed += u64::from(matches!(o.done, Done::Failed(_)));
            writeln!(out, "{}", line(at, &o))?;
        }
        out.flush()?;
    }
    Ok(failed)
}

/// One tick's line: `t=SECONDS asked=BYTES result=… rule: detail`.
fn line(at: Duration, o: &Outcome) -> String {
    let asked = o.pace.as_ref().map_or(Bytes::ZERO, |p| p.reclaim);
    let result = match &o.done {
        Done::Held => "held".to_string(),
        Done::DryRun => "dry_run".into(),
        Done::Reclaimed(Reclaimed::All) => "ok".into(),
        Done::Reclaimed(Reclaimed::Partly) => "partly".into(),
        Done::Failed(why) => format!("error ({why})"),
    };
    let reason = o.pace.as_ref().map(|p| p.reason.to_string());
    format!(
        "t={:.1} asked={} result={result} {}",
        at.as_secs_f64(),
        asked.0,
        reason.unwrap_or_default()
    )
}
