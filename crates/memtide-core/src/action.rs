//! What the engine asks the world to do, each with the reason it was decided.

use crate::need::NeedLevel;
use crate::units::Bytes;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::fmt;

/// Why something was decided: the rule that fired and the inputs it saw.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reason {
    /// The rule, e.g. `mom.shrink` or `safeguard.min` (static for built-in rules: reasons
    /// are made for every VM every tick).
    pub rule: Cow<'static, str>,
    /// The inputs, in words an operator can check, e.g. `host free 14.2% < 20.0%`.
    pub detail: String,
    /// The level of the host's need for memory that drove the decision, where the policy
    /// weighs one (memtide's own; absent in older recordings).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub need: Option<NeedLevel>,
}

impl Reason {
    /// A reason from a rule name and its explanation.
    pub fn new(rule: impl Into<Cow<'static, str>>, detail: impl Into<String>) -> Self {
        Reason {
            rule: rule.into(),
            detail: detail.into(),
            need: None,
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.rule, self.detail)
    }
}

/// The KSM knobs memtide controls.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KsmSettings {
    /// 0 to stop ksmd, 1 to run it.
    pub run: Option<u64>,
    /// Pages scanned per wake-up.
    pub pages_to_scan: Option<u64>,
    /// Sleep between wake-ups.
    pub sleep_millisecs: Option<u64>,
    /// Merge pages across NUMA nodes.
    pub merge_across_nodes: Option<u64>,
}

impl KsmSettings {
    /// True when no knob is set.
    pub fn is_empty(&self) -> bool {
        *self == KsmSettings::default()
    }
}

impl fmt::Display for KsmSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let knobs = [
            ("run", self.run),
            ("pages_to_scan", self.pages_to_scan),
            ("sleep_millisecs", self.sleep_millisecs),
            ("merge_across_nodes", self.merge_across_nodes),
        ];
        let parts: Vec<String> = knobs
            .iter()
            .filter_map(|(k, v)| v.map(|v| format!("{k}={v}")))
            .collect();
        f.write_str(&parts.join(" "))
    }
}

/// One thing to do.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    /// Set a guest's balloon so that its logical size becomes `target`.
    SetBalloon {
        /// The VM.
        vm: String,
        /// The guest's new logical size.
        target: Bytes,
        /// Why.
        reason: Reason,
    },
    /// Change KSM knobs (only those that differ from the kernel's values).
    SetKsm {
        /// The knobs to write.
        settings: KsmSettings,
        /// Why.
        reason: Reason,
    },
}

impl Action {
    /// The reason the action was decided.
    pub fn reason(&self) -> &Reason {
        match self {
            Action::SetBalloon { reason, .. } | Action::SetKsm { reason, .. } => reason,
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::SetBalloon { vm, target, reason } => {
                write!(f, "{vm}: balloon target {target} ({reason})")
            }
            Action::SetKsm { settings, reason } => write!(f, "ksm: {settings} ({reason})"),
        }
    }
}
