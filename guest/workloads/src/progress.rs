//! Progress shared between a workload's worker thread, which counts the bytes
//! it touches or reads, and its reporting thread, which turns them into the
//! current phase's throughput. Reporting runs separately so that lines keep
//! coming while the worker stalls (on swap, or on disk reads).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Instant;

const MIB: f64 = (1 << 20) as f64;

/// Written by the worker, read by the reporter.
pub struct Progress {
    /// Bytes since the start, all phases together.
    bytes: AtomicU64,
    phase: Mutex<PhaseStart>,
}

/// Where the current phase began.
#[derive(Debug, Clone, Copy, PartialEq)]
struct PhaseStart {
    /// Counts phase starts, so that a repeated phase is a new one.
    serial: u64,
    /// 1-based index in the workload's pattern.
    index: usize,
    at: Instant,
    bytes: u64,
}

/// What the reporter sees at one moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Snapshot {
    /// 1-based index of the current phase in the workload's pattern.
    pub phase: usize,
    /// Bytes since the start, all phases together.
    pub bytes: u64,
    at: Instant,
    start: PhaseStart,
}

impl Progress {
    /// Nothing counted yet, in phase 1 from now on.
    pub fn new() -> Progress {
        Progress {
            bytes: AtomicU64::new(0),
            phase: Mutex::new(PhaseStart {
                serial: 0,
                index: 1,
                at: Instant::now(),
                bytes: 0,
            }),
        }
    }

    /// Marks the start of phase `index` (1-based): the bytes counted from now
    /// on belong to it.
    pub fn start_phase(&self, index: usize) {
        let mut phase = self.phase.lock().unwrap_or_else(|e| e.into_inner());
        *phase = PhaseStart {
            serial: phase.serial + 1,
            index,
            at: Instant::now(),
            bytes: self.bytes.load(Relaxed),
        };
    }

    /// Counts `bytes` more touched or read.
    pub fn add(&self, bytes: u64) {
        self.bytes.fetch_add(bytes, Relaxed);
    }

    /// The current phase and byte count.
    pub fn snapshot(&self) -> Snapshot {
        let start = *self.phase.lock().unwrap_or_else(|e| e.into_inner());
        Snapshot {
            phase: start.index,
            at: Instant::now(),
            bytes: self.bytes.load(Relaxed),
            start,
        }
    }
}

impl Default for Progress {
    fn default() -> Self {
        Progress::new()
    }
}

/// Turns successive snapshots into MiB per second of the current phase.
#[derive(Debug, Default)]
pub struct PhaseMeter {
    last: Option<Snapshot>,
}

impl PhaseMeter {
    /// MiB per second since the previous snapshot, or since the phase began
    /// when it began after the previous snapshot (so that a line never mixes
    /// two phases).
    pub fn mib_per_s(&mut self, now: Snapshot) -> f64 {
        let (since, bytes_then) = match self.last {
            Some(last) if last.start.serial == now.start.serial => (last.at, last.bytes),
            _ => (now.start.at, now.start.bytes),
        };
        self.last = Some(now);
        let secs = now.at.saturating_duration_since(since).as_secs_f64();
        if secs > 0.0 {
            now.bytes.saturating_sub(bytes_then) as f64 / MIB / secs
        } else {
            0.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A snapshot `secs` after `base` with `bytes` counted, in the phase
    /// that started at `start_secs` with `start_bytes`.
    fn snap(base: Instant, serial: u64, start: (u64, u64), secs: u64, bytes: u64) -> Snapshot {
        let at = |s| base + Duration::from_secs(s);
        Snapshot {
            phase: 1,
            at: at(secs),
            bytes,
            start: PhaseStart {
                serial,
                index: 1,
                at: at(start.0),
                bytes: start.1,
            },
        }
    }

    #[test]
    fn rate_since_previous_snapshot_within_a_phase() {
        let base = Instant::now();
        let mib = 1 << 20;
        let mut meter = PhaseMeter::default();
        assert_eq!(meter.mib_per_s(snap(base, 1, (0, 0), 2, 4 * mib)), 2.0);
        assert_eq!(meter.mib_per_s(snap(base, 1, (0, 0), 3, 10 * mib)), 6.0);
        assert_eq!(meter.mib_per_s(snap(base, 1, (0, 0), 4, 10 * mib)), 0.0);
        assert_eq!(meter.mib_per_s(snap(base, 1, (0, 0), 4, 10 * mib)), 0.0);
    }

    #[test]
    fn rate_restarts_with_each_phase() {
        let base = Instant::now();
        let mib = 1 << 20;
        let mut meter = PhaseMeter::default();
        meter.mib_per_s(snap(base, 1, (0, 0), 1, 100 * mib));
        // Phase 2 began at 2 s with 150 MiB counted: 30 MiB more by 3 s.
        assert_eq!(
            meter.mib_per_s(snap(base, 2, (2, 150 * mib), 3, 180 * mib)),
            30.0
        );
        // The same phase index again, but a new start.
        assert_eq!(
            meter.mib_per_s(snap(base, 3, (4, 200 * mib), 6, 204 * mib)),
            2.0
        );
    }

    #[test]
    fn progress_counts_bytes_per_phase() {
        let progress = Progress::new();
        assert_eq!(progress.snapshot().phase, 1);
        progress.add(5);
        progress.start_phase(2);
        progress.add(7);
        let snapshot = progress.snapshot();
        assert_eq!(snapshot.phase, 2);
        assert_eq!((snapshot.bytes, snapshot.start.bytes), (12, 5));
        progress.start_phase(2);
        assert_ne!(progress.snapshot().start.serial, snapshot.start.serial);
    }
}
