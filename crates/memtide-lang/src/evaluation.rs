//! The result of evaluating a program.

use crate::value::Value;
use serde::Serialize;
use std::collections::BTreeMap;

/// The controls requested by an evaluation, by control name.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Controls {
    /// Host controls (`ksm_run`, …).
    pub host: BTreeMap<String, Value>,
    /// Guest controls (`balloon_target`), by guest name; guests without requests are absent.
    pub guests: BTreeMap<String, BTreeMap<String, Value>>,
}

/// What one evaluation produced.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Evaluation {
    /// The value of each top-level form, in order.
    pub results: Vec<Value>,
    /// The controls requested.
    pub controls: Controls,
    /// One line per `debug` call: `file:line: ` and its arguments.
    pub debug: Vec<String>,
}

impl Evaluation {
    /// `{"results": […], "controls": {"host": {…}, "guests": {…}}, "debug": […]}`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"results": self.results, "controls": self.controls, "debug": self.debug})
    }
}
