//! Tests of the policy language through its public API.

mod arithmetic;
mod checks;
mod entities;
mod errors;
mod forms;
mod json;
mod lexing;
mod limits;
mod policies;
mod robustness;
mod roundtrip;
mod scoping;

use memtide_lang::{Evaluation, Input, Limits, PolicyError, Program, Source, Value};

/// The single source the helpers evaluate, named `t.policy`.
pub fn sources(text: &str) -> Vec<Source> {
    vec![Source::new("t.policy", text)]
}

/// Parse and evaluate `text` over `input` within `limits`.
pub fn eval_with(text: &str, input: &Input, limits: &Limits) -> Result<Evaluation, PolicyError> {
    Program::parse(&sources(text))?.evaluate(input, limits)
}

/// Parse and evaluate `text` over an empty input with the default limits.
pub fn run(text: &str) -> Result<Evaluation, PolicyError> {
    eval_with(text, &Input::default(), &Limits::default())
}

/// The value of the last form of `text`; panics with the rendered error if it fails.
pub fn value(text: &str) -> Value {
    value_over(text, &Input::default())
}

/// The value of the last form of `text` over `input`.
pub fn value_over(text: &str, input: &Input) -> Value {
    match eval_with(text, input, &Limits::default()) {
        Ok(evaluation) => evaluation.results.last().cloned().expect("no form"),
        Err(e) => panic!("{}", e.render(&sources(text))),
    }
}

/// The error `text` fails with, as `file:line:col: message`.
pub fn error(text: &str) -> String {
    error_over(text, &Input::default())
}

/// The error `text` fails with over `input`.
pub fn error_over(text: &str, input: &Input) -> String {
    match eval_with(text, input, &Limits::default()) {
        Ok(evaluation) => panic!("expected an error, got {:?}", evaluation.results),
        Err(e) => e.to_string(),
    }
}

/// An input from its JSON form.
pub fn input(json: serde_json::Value) -> Input {
    serde_json::from_value(json).expect("valid input")
}

/// A string value.
pub fn s(text: &str) -> Value {
    Value::from(text)
}

/// A list value.
pub fn list(items: Vec<Value>) -> Value {
    Value::from(items)
}

/// The daemon keeps programs and results across threads.
#[test]
fn api_types_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Program>();
    send_sync::<Evaluation>();
    send_sync::<PolicyError>();
    send_sync::<Input>();
    send_sync::<Limits>();
}
