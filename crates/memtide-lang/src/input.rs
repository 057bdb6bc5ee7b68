//! What a policy evaluates over: the host's and the guests' properties and statistics.

use crate::value::Value;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One sample of statistics: field name to value.
pub type Sample = BTreeMap<String, Value>;

/// The input of one evaluation, as read from a snapshot's JSON.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Input {
    /// The host.
    pub host: EntityInput,
    /// The guests, in the order `Guests` lists them.
    pub guests: Vec<EntityInput>,
}

/// An entity's properties and statistics history.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EntityInput {
    /// Properties (a guest's `name`, `uuid`, `pid`, …).
    pub props: BTreeMap<String, Value>,
    /// Samples, oldest first; the last one is the latest.
    pub stats: Vec<Sample>,
}

impl EntityInput {
    /// The latest sample, if any.
    pub fn latest(&self) -> Option<&Sample> {
        self.stats.last()
    }

    /// The key of a guest in [`crate::Controls::guests`]: its `name` property when that
    /// is a string, else `#` and its position in `guests` (from 0).
    pub fn guest_name(&self, index: usize) -> String {
        match self.props.get("name") {
            Some(Value::Str(name)) => name.to_string(),
            _ => format!("#{index}"),
        }
    }
}
