//! The daemon's status: what `memtide status`, `/api/v1/status` and `/metrics` show.

use crate::daemon::events::Event;
use crate::daemon::fleet::{Sampling, Waiting};
use crate::daemon::place::Age;
use memtide_adapters::tiers::Tiers;
use memtide_core::Decision;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

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
    /// How long ticks took.
    #[serde(default)]
    pub tick_durations: Durations,
    /// Actions carried out, by kind (`balloon`, `ksm`) and result (`ok`, `error`, `dry_run`).
    pub actions: BTreeMap<String, BTreeMap<String, u64>>,
    /// Actions, by the rule that decided them (whatever their result).
    #[serde(default)]
    pub rules: BTreeMap<String, u64>,
    /// Diagnostics seen, by kind, one per VM and tick.
    pub diagnostics: BTreeMap<String, u64>,
    /// Failed writes, by file (`event_log`, `recording`, `state`): what they held is lost.
    #[serde(default)]
    pub write_errors: BTreeMap<String, u64>,
    /// Memory asked of VMs' `memory.reclaim` (proactive reclaim), in bytes.
    #[serde(default)]
    pub reclaim_asked_bytes: u64,
    /// Guest RAM newly in huge pages after the daemon's huge-page passes.
    #[serde(default)]
    pub huge_pages_restored_bytes: u64,
    /// Memory moved to the slow tier by placement (`[tiering]`), in bytes.
    #[serde(default)]
    pub place_demoted_bytes: u64,
    /// Memory moved to the fast tier by placement, in bytes.
    #[serde(default)]
    pub place_promoted_bytes: u64,
}

impl Counters {
    /// Count a tick that took `ms` at an interval of `interval_ms`.
    pub fn tick_took(&mut self, ms: f64, interval_ms: f64) {
        self.max_tick_ms = self.max_tick_ms.max(ms);
        self.late_ticks += u64::from(ms > interval_ms);
        self.tick_durations.observe(ms / 1000.0);
    }

    /// Count one action decided by `rule`.
    pub fn rule(&mut self, rule: &str) {
        *self.rules.entry(rule.to_string()).or_default() += 1;
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

/// Which policy decides each VM, by the policies' names: the one its `[[vm]]` entry names
/// (`policy`), else the host's.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Policies {
    /// The host's policy: it decides every VM not in `vms`.
    pub host: String,
    /// The VMs with a policy of their own, and its name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub vms: BTreeMap<String, String>,
}

impl Policies {
    /// The name of the policy that decides `vm`.
    pub fn of(&self, vm: &str) -> &str {
        self.vms.get(vm).map_or(&self.host, String::as_str)
    }
}

/// The daemon's status, shared by the tick loop, which writes it, and the control socket
/// and HTTP endpoint, which read it. Each write is counted as a change
/// ([`SharedStatus::generation`]), so that what is rendered of it can be kept until the
/// next without any writer having to say so.
#[derive(Clone, Debug, Default)]
pub struct SharedStatus {
    status: Arc<RwLock<Status>>,
    generation: Arc<AtomicU64>,
}

impl SharedStatus {
    /// The status `status`, to be shared.
    pub fn new(status: Status) -> SharedStatus {
        SharedStatus {
            status: Arc::new(RwLock::new(status)),
            generation: Arc::default(),
        }
    }

    /// The status, to read.
    pub fn read(&self) -> RwLockReadGuard<'_, Status> {
        self.status.read().expect("status lock")
    }

    /// The status, to change: counted as a change, once the lock is held (a reader that
    /// sees the new count renders what this write leaves).
    pub fn write(&self) -> RwLockWriteGuard<'_, Status> {
        let status = self.status.write().expect("status lock");
        self.generation.fetch_add(1, Ordering::SeqCst);
        status
    }

    /// How many writes the status has had.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
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
    /// When the last decision was made (seconds since the Unix epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_decision_unix_s: Option<f64>,
    /// Why the last tick was skipped, if it was.
    pub host_error: Option<String>,
    /// Why the last policy reload was rejected, if it was.
    pub policy_error: Option<String>,
    /// What changed in the configuration file, as of the last reload that stood, and
    /// waits for a restart (`interval_s`, `[host]`, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restart_pending: Vec<String>,
    /// Which policy decides each VM, as of the policy last loaded.
    #[serde(default)]
    pub policies: Policies,
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
    /// The host's memory tiers: NUMA nodes, zswap, swap.
    #[serde(default)]
    pub tiers: Tiers,
    /// VMs hibernated and not woken yet, from the snapshot store.
    #[serde(default)]
    pub hibernated: Vec<Hibernated>,
    /// The VMs placed between the tiers (`[tiering] place`), as of each one's last pass.
    #[serde(default)]
    pub placed: Vec<Placed>,
}

impl Status {
    /// Whether memtide hibernated `vm` and has not woken it.
    pub fn is_hibernated(&self, vm: &str) -> bool {
        self.hibernated.iter().any(|h| h.vm == vm)
    }

    /// The VMs memtide knows and cannot reach (`memtide status`'s "not connected" as
    /// `top` and `memtide_vm_up` count them), each once, by name: not those connected
    /// under another endpoint, nor those hibernated.
    pub fn out_of_reach(&self) -> BTreeMap<&str, &Waiting> {
        let decided = |n: &str| {
            self.decision
                .iter()
                .flat_map(|d| &d.vms)
                .any(|v| v.name == n)
        };
        self.waiting
            .iter()
            .filter(|w| !decided(&w.name) && !self.is_hibernated(&w.name))
            .map(|w| (w.name.as_str(), w))
            .collect()
    }
}

/// Where a placed VM's memory is, after its last placement pass.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Placed {
    /// The VM.
    pub vm: String,
    /// Its memory on the fast node.
    pub fast: memtide_core::Bytes,
    /// Its memory on the slow node.
    pub slow: memtide_core::Bytes,
    /// The fast memory it may hold (`None` after its first scan, which decides none).
    #[serde(default)]
    pub fast_budget: Option<memtide_core::Bytes>,
    /// Its cold age after its last pass, and whether it adapts.
    #[serde(default)]
    pub cold_age: Option<Age>,
}

/// A VM hibernated and not woken yet.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Hibernated {
    /// The VM.
    pub vm: String,
    /// Its hibernation's snapshot.
    pub id: String,
    /// When it was hibernated (RFC 3339).
    pub since: String,
    /// The memory it held (its configured size).
    pub configured: memtide_core::Bytes,
}

/// A histogram of durations, in seconds, over [`Durations::BOUNDS`].
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Durations {
    /// How many fell in each bucket: at most its bound and above the previous one; the
    /// last counts those above every bound.
    pub counts: Vec<u64>,
    /// Their sum.
    pub sum_s: f64,
}

impl Durations {
    /// The buckets' upper bounds, in seconds: from a fast tick to several intervals.
    pub const BOUNDS: [f64; 11] = [
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ];

    /// Count one duration.
    pub fn observe(&mut self, secs: f64) {
        self.counts.resize(Self::BOUNDS.len() + 1, 0);
        let bucket = Self::BOUNDS.partition_point(|&bound| bound < secs);
        self.counts[bucket] += 1;
        self.sum_s += secs;
    }

    /// (upper bound, count) per bucket, the last one's bound `f64::MAX` (+Inf).
    pub fn buckets(&self) -> Vec<(f64, u64)> {
        let bounds = Self::BOUNDS.iter().copied().chain([f64::MAX]);
        bounds
            .zip(self.counts.iter().copied().chain(std::iter::repeat(0)))
            .collect()
    }

    /// How many were counted.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::{Counters, Durations};

    #[test]
    fn ticks_longer_than_the_interval_are_counted_late() {
        let mut c = Counters::default();
        for ms in [12.0, 2150.0, 2000.0, 40.0] {
            c.tick_took(ms, 2000.0);
        }
        assert_eq!((c.late_ticks, c.max_tick_ms), (1, 2150.0));
    }

    #[test]
    fn tick_durations_fall_in_the_bucket_of_their_bound() {
        let mut c = Counters::default();
        for ms in [4.0, 5.0, 5.1, 2150.0, 60_000.0] {
            c.tick_took(ms, 2000.0);
        }
        let d = &c.tick_durations;
        assert_eq!(d.count(), 5);
        assert!((d.sum_s - 62.1641).abs() < 1e-9, "{}", d.sum_s);
        let nonzero: Vec<(f64, u64)> = d.buckets().into_iter().filter(|b| b.1 > 0).collect();
        assert_eq!(nonzero, [(0.005, 2), (0.01, 1), (2.5, 1), (f64::MAX, 1)]);
        assert_eq!(
            Durations::default().buckets().len(),
            Durations::BOUNDS.len() + 1
        );
    }
}
