//! The host and guest entities: their fields, properties and controls.

use crate::error::ErrorKind;
use crate::input::{EntityInput, Input};
use crate::value::Value;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// Statistics of the host that are always known (nil when not collected).
pub const HOST_STATS: [&str; 18] = [
    "mem_available",
    "mem_unused",
    "mem_free",
    "swap_in",
    "swap_out",
    "anon_pages",
    "swap_total",
    "swap_usage",
    "ksm_run",
    "ksm_pages_to_scan",
    "ksm_sleep_millisecs",
    "ksm_pages_shared",
    "ksm_pages_sharing",
    "ksm_pages_unshared",
    "ksm_pages_volatile",
    "ksm_full_scans",
    "ksm_merge_across_nodes",
    "ksm_shareable",
];

/// Statistics of a guest that are always known (nil when not collected).
pub const GUEST_STATS: [&str; 11] = [
    "mem_available",
    "mem_unused",
    "mem_free",
    "major_fault",
    "minor_fault",
    "swap_in",
    "swap_out",
    "balloon_cur",
    "balloon_max",
    "balloon_min",
    "rss",
];

/// Properties of a guest that are always known (nil when not supplied).
pub const GUEST_PROPS: [&str; 3] = ["name", "uuid", "pid"];

/// Controls a policy may request on the host.
pub const HOST_CONTROLS: [&str; 4] = [
    "ksm_run",
    "ksm_pages_to_scan",
    "ksm_sleep_millisecs",
    "ksm_merge_across_nodes",
];

/// Controls a policy may request on a guest.
pub const GUEST_CONTROLS: [&str; 1] = ["balloon_target"];

/// The number of arguments of the entity method `method` (`(X.Method …)`), or `None`
/// when there is no such method.
pub(crate) fn method_arity(method: &str) -> Option<usize> {
    match method {
        "Stat" | "StatAvg" | "Prop" | "GetControl" => Some(1),
        "Control" => Some(2),
        _ => None,
    }
}

/// The host, or one guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entity {
    /// The host.
    Host,
    /// A guest.
    Guest {
        /// Position in the input's guests.
        index: usize,
        /// Its key in the controls (see [`EntityInput::guest_name`]).
        name: Arc<str>,
    },
}

/// `<host>` or `<guest NAME>`.
impl fmt::Display for Entity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Entity::Host => f.write_str("<host>"),
            Entity::Guest { name, .. } => write!(f, "<guest {name}>"),
        }
    }
}

/// What a guest missing from the input reads as.
static NO_DATA: EntityInput = EntityInput {
    props: BTreeMap::new(),
    stats: Vec::new(),
};

impl Entity {
    fn data<'i>(&self, input: &'i Input) -> &'i EntityInput {
        match self {
            Entity::Host => &input.host,
            Entity::Guest { index, .. } => input.guests.get(*index).unwrap_or(&NO_DATA),
        }
    }

    fn documented_stats(&self) -> &'static [&'static str] {
        match self {
            Entity::Host => &HOST_STATS,
            Entity::Guest { .. } => &GUEST_STATS,
        }
    }

    /// The controls this entity accepts.
    pub fn controls(&self) -> &'static [&'static str] {
        match self {
            Entity::Host => &HOST_CONTROLS,
            Entity::Guest { .. } => &GUEST_CONTROLS,
        }
    }

    /// Fail unless `name` is documented or appears in some sample.
    fn check_stat(&self, input: &Input, name: &str) -> Result<(), ErrorKind> {
        let known = self.documented_stats().contains(&name)
            || self
                .data(input)
                .stats
                .iter()
                .any(|sample| sample.contains_key(name));
        if known {
            Ok(())
        } else {
            Err(ErrorKind::UnknownField(name.to_string()))
        }
    }

    /// The latest value of statistic `name` (nil when the latest sample lacks it).
    pub(crate) fn stat(&self, input: &Input, name: &str) -> Result<Value, ErrorKind> {
        self.check_stat(input, name)?;
        let latest = self
            .data(input)
            .latest()
            .and_then(|sample| sample.get(name));
        Ok(latest.cloned().unwrap_or(Value::Nil))
    }

    /// The mean of statistic `name` over the history as a float, ignoring nil: 0.0 where
    /// every sample's is nil, an error where there is no sample, as MOM's.
    pub(crate) fn stat_avg(&self, input: &Input, name: &str) -> Result<Value, ErrorKind> {
        self.check_stat(input, name)?;
        if self.data(input).stats.is_empty() {
            return Err(ErrorKind::NoSamples(name.to_string()));
        }
        let (mut sum, mut count) = (0.0, 0u32);
        for value in self
            .data(input)
            .stats
            .iter()
            .filter_map(|sample| sample.get(name))
        {
            sum += match value {
                Value::Nil => continue,
                Value::Bool(b) => f64::from(u8::from(*b)),
                Value::Int(n) => *n as f64,
                Value::Float(x) => *x,
                other => {
                    return Err(ErrorKind::TypeMismatch {
                        what: format!("statistic '{name}'"),
                        expected: "numbers",
                        got: other.type_name(),
                    })
                }
            };
            count += 1;
        }
        Ok(Value::Float(if count == 0 {
            0.0
        } else {
            sum / f64::from(count)
        }))
    }

    /// Property `name` (nil when a documented property is not supplied).
    pub(crate) fn prop(&self, input: &Input, name: &str) -> Result<Value, ErrorKind> {
        match self.data(input).props.get(name) {
            Some(value) => Ok(value.clone()),
            None if matches!(self, Entity::Guest { .. }) && GUEST_PROPS.contains(&name) => {
                Ok(Value::Nil)
            }
            None => Err(ErrorKind::UnknownProperty(name.to_string())),
        }
    }
}
