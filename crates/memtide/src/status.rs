//! The daemon's status: what `memtide status`, `/api/v1/status` and `/metrics` show.

use crate::daemon::events::Event;
use crate::daemon::fleet::{Sampling, Waiting};
use memtide_core::Decision;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Counters since the daemon started.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Counters {
    /// Ticks run.
    pub ticks: u64,
    /// Ticks skipped because host statistics could not be read.
    pub host_errors: u64,
    /// Ticks that took longer than the interval (the next one started late).
    #[serde(default)]
    pub late_ticks: u64,
    /// The longest tick, in milliseconds.
    #[serde(default)]
    pub max_tick_ms: f64,
    /// Actions carried out, by kind (`balloon`, `ksm`) and result (`ok`, `error`, `dry_run`).
    pub actions: BTreeMap<String, BTreeMap<String, u64>>,
    /// Diagnostics seen, by kind, one per VM and tick.
    pub diagnostics: BTreeMap<String, u64>,
    /// Failed writes, by file (`event_log`, `recording`, `state`): what they held is lost.
    #[serde(default)]
    pub write_errors: BTreeMap<String, u64>,
}

impl Counters {
    /// Count a tick that took `ms` at an interval of `interval_ms`.
    pub fn tick_took(&mut self, ms: f64, interval_ms: f64) {
        self.max_tick_ms = self.max_tick_ms.max(ms);
        self.late_ticks += u64::from(ms > interval_ms);
    }

    /// Count one action of `kind` with `result`.
    pub fn action(&mut self, kind: &str, result: &str) {
        *self
            .actions
            .entry(kind.into())
            .or_default()
            .entry(result.into())
            .or_default() += 1;
    }
}

/// Everything the daemon shows about itself.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Status {
    /// memtide's version.
    pub version: String,
    /// When the daemon started (RFC 3339).
    pub started: String,
    /// Seconds between ticks.
    pub interval_s: f64,
    /// Decisions are made and logged but not carried out.
    pub dry_run: bool,
    /// How long the last tick took, in milliseconds.
    pub last_tick_ms: f64,
    /// Why the last tick was skipped, if it was.
    pub host_error: Option<String>,
    /// Why the last policy reload was rejected, if it was.
    pub policy_error: Option<String>,
    /// The latest decision.
    pub decision: Option<Decision>,
    /// VMs known but not connected.
    pub waiting: Vec<Waiting>,
    /// How each managed VM's samples are arriving: stale ones and late counts.
    #[serde(default)]
    pub sampling: Vec<Sampling>,
    /// Counters.
    pub counters: Counters,
    /// The latest events, oldest first.
    pub recent_events: Vec<Event>,
}

#[cfg(test)]
mod tests {
    use super::Counters;

    #[test]
    fn ticks_longer_than_the_interval_are_counted_late() {
        let mut c = Counters::default();
        for ms in [12.0, 2150.0, 2000.0, 40.0] {
            c.tick_took(ms, 2000.0);
        }
        assert_eq!((c.late_ticks, c.max_tick_ms), (1, 2150.0));
    }
}
