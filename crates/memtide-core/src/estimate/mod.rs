//! Working-set estimators: small pure state machines, one instance per VM, fed one
//! [`Observation`] per tick. Each returns an [`Estimate`] of the memory the guest needs.
//!
//! - [`tws`]: the probing machine of "Working Set-based Physical Memory Ballooning"
//!   (Chiang, Li, Chiueh): FAST / COOL_DOWN / SLOW, driven by swap-ins and refaults.
//! - [`selfballoon`]: Xen self-ballooning: Committed_AS plus a reserve, with hysteresis
//!   and the kernel's piecewise floor.
//! - [`sampled`]: a host-side estimate from the guest memory the hypervisor process
//!   touched, as ESX samples pages; no guest cooperation needed.
//! - [`fused`]: memtide's own: jump to MemAvailable's view, probe below it, back off on
//!   any sign of shortage.

pub mod fused;
pub mod sampled;
pub mod selfballoon;
pub mod tws;

use crate::need::Need;
use crate::signals::Signals;
use crate::units::Bytes;
use serde::Serialize;
use std::time::Duration;

/// What an estimator sees of one VM in one tick.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observation {
    /// Time of the tick.
    pub at: Duration,
    /// The guest's current size (balloon actual).
    pub size: Bytes,
    /// The size it was started with.
    pub configured: Bytes,
    /// The least size its operator lets the balloon leave it (its `min`).
    pub min: Bytes,
    /// Guest memory the hypervisor saw touched in the last window, when sampled.
    pub referenced: Option<Bytes>,
    /// Guest memory the host backs that went untouched for the access tracker's cold
    /// age, when tracked.
    pub cold: Option<Bytes>,
    /// Derived guest signals.
    pub signals: Signals,
    /// How much the host needs memory, for estimators whose probing scales with it
    /// (none: probe as if it were short).
    pub need: Option<Need>,
    /// The guest's freed pages go back to the host by themselves (free page reporting).
    pub free_page_reporting: bool,
    /// What the host backs of the guest's memory (its hypervisor's resident memory,
    /// within its size), when known.
    pub backed: Option<Bytes>,
}

/// An estimate and how it was reached.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Estimate {
    /// The memory the guest needs.
    pub wss: Bytes,
    /// The estimator's state, e.g. `fast`, `cool_down`.
    pub phase: &'static str,
    /// The estimate and the inputs behind it, in words (formatted once: estimators run
    /// for every VM every tick).
    pub detail: String,
    /// A size above `wss` the guest may keep where memory is not divided.
    pub keep: Option<Keep>,
    /// The guest's last allocation, this tick or within the cool-down that follows new
    /// demand and not ended by a release since (memtide's estimator only): it may still
    /// be touching what it allocated.
    pub allocation: Option<Allocation>,
}

/// A size above its estimate a guest may keep out of memory no VM wants
/// ([`Estimate::keep`]), and why.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Keep {
    /// The size.
    pub size: Bytes,
    /// Why it may keep it.
    pub why: KeepWhy,
}

/// Why a guest may keep more than its estimate ([`Keep`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeepWhy {
    /// Its page cache and the free memory free page reporting gave back to the host.
    Reported,
    /// What it freed lately, `ago` ago: it may allocate it again.
    Freed {
        /// How long ago it last freed memory.
        ago: Duration,
    },
}

/// An allocation a guest may still be filling ([`Estimate::allocation`]).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Allocation {
    /// How long ago its Committed_AS grew.
    pub ago: Duration,
    /// By how much.
    pub grown: Bytes,
}

impl Allocation {
    /// Whether it was made in this tick.
    pub fn now(&self) -> bool {
        self.ago.is_zero()
    }
}

/// Keep `b` within `[lo, hi]` (with `hi` winning if they cross).
pub fn clamp(b: Bytes, lo: Bytes, hi: Bytes) -> Bytes {
    b.max(lo).min(hi)
}

/// The sample interval a tick's steps scale with, kept from tick to tick.
#[derive(Clone, Copy, Debug, Default)]
pub struct TickInterval(Option<Duration>);

impl TickInterval {
    /// `d`, at most twice the (bounded) interval before it: a VM whose samples were
    /// missed for a while (late, its agent away) probes no more than two ticks' worth when
    /// they come back, not the whole gap's (20 s of 5% steps was its whole size), and
    /// gaps one after another grow it by no more than twice each.
    pub fn bounded(&mut self, d: Option<Duration>) -> Option<Duration> {
        let bounded = match (d, self.0) {
            (Some(d), Some(before)) => Some(d.min(before * 2)),
            _ => d,
        };
        self.0 = bounded.or(self.0);
        bounded
    }
}

/// Seconds of `d` as a fraction of `epoch` (a missing interval counts as one epoch).
pub fn epochs(d: Option<Duration>, epoch: Duration) -> f64 {
    match d {
        Some(d) if !epoch.is_zero() => d.as_secs_f64() / epoch.as_secs_f64(),
        _ => 1.0,
    }
}
