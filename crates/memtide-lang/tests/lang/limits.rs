//! Hostile programs end in errors, never in hangs or crashes.

use crate::{eval_with, input, run, value};
use memtide_lang::{ErrorKind, Input, Limits, Value, MAX_NESTING};
use serde_json::json;

/// Run `f` on a thread with a stack of `bytes`.
fn on_stack<T: Send + 'static>(bytes: usize, f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(bytes)
        .spawn(f)
        .unwrap()
        .join()
        .unwrap()
}

/// Run `f` on a thread with a 2 MiB stack, the size of a tokio worker's.
fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    on_stack(2 << 20, f)
}

#[test]
fn infinite_recursion_hits_the_depth_limit() {
    let error = on_small_stack(|| run("(def f () (f))\n(f)").unwrap_err().to_string());
    assert_eq!(error, "t.policy:1:11: depth limit of 200 exceeded");
}

#[test]
fn deep_recursion_through_every_kind_of_form_stays_on_a_small_stack() {
    let text = "(def f (n) (let ((m (+ n 1))) { (if (valid m) (with (with Guests g g) g (and (f m))) nil) }))\n(f 0)";
    let input = input(json!({"guests": [{}]}));
    let error = on_small_stack(move || eval_with(text, &input, &Limits::default()).unwrap_err());
    assert_eq!(error.kind, ErrorKind::DepthLimit(200));
}

#[test]
fn lists_nested_a_level_a_call_hit_the_depth_limit_not_the_stack() {
    // Each leaf of a shallow recursion wraps x in one more list: 4096 levels in far fewer
    // steps than the budget, and, unbounded, a few more calls nest deeper than showing,
    // comparing or dropping them can go on a small stack (found by review).
    let text = "(defvar x 0)\n\
                (def f (d) (if (> d 0) { (f (- d 1)) (f (- d 1)) } (set x (with Guests g x))))\n\
                (f 12)\n(debug x)";
    let one_guest = input(json!({"guests": [{}]}));
    let guest = one_guest.clone();
    let error = on_small_stack(move || eval_with(text, &guest, &Limits::default()).unwrap_err());
    assert_eq!(error.kind, ErrorKind::DepthLimit(200));
    // Fewer levels are a value like any other.
    let text = "(defvar x 0)\n(def f (d) (if (> d 0) { (set x (with Guests g x)) (f (- d 1)) } x))\n(f 30)";
    let deep = on_small_stack(move || eval_with(text, &one_guest, &Limits::default()).unwrap());
    assert_eq!(deep.results.last().unwrap().depth(), 30);
}

#[test]
fn the_deepest_nesting_the_parser_accepts_evaluates_with_default_limits() {
    let text = format!(
        "{}0{}",
        "(+ 1 ".repeat(MAX_NESTING),
        ")".repeat(MAX_NESTING)
    );
    let result = on_small_stack(move || crate::value(&text));
    assert_eq!(result, Value::Int(MAX_NESTING as i64));
}

#[test]
fn a_hundred_thousand_open_brackets_are_a_parse_error() {
    let error = crate::error(&"(".repeat(100_000));
    assert_eq!(
        error,
        format!("t.policy:1:101: nesting deeper than {MAX_NESTING} levels")
    );
}

#[test]
fn exponential_recursion_exhausts_the_step_budget() {
    let text = "(def f (n) (if (<= n 0) 0 (+ (f (- n 1)) (f (- n 1)))))\n(f 40)";
    assert_eq!(
        run(text).unwrap_err().kind,
        ErrorKind::StepBudget(1_000_000)
    );
}

#[test]
fn the_step_budget_is_exact() {
    let limits = |max_steps| Limits {
        max_steps,
        ..Limits::default()
    };
    let text = "(+ 1 (+ 2 3))";
    assert_eq!(
        eval_with(text, &Input::default(), &limits(5))
            .unwrap()
            .results,
        vec![Value::Int(6)]
    );
    assert_eq!(
        eval_with(text, &Input::default(), &limits(4))
            .unwrap_err()
            .to_string(),
        "t.policy:1:11: step budget of 4 exhausted"
    );
}

#[test]
fn string_growth_is_bounded() {
    assert_eq!(
        run("(* \"x\" 2000000)").unwrap_err().to_string(),
        "t.policy:1:1: value larger than the size limit of 1048576"
    );
    let doubling = "(defvar s \"xxxxxxxxxxxxxxxx\")
                    (def grow (n) (if (<= n 0) s { (set s (+ s s)) (grow (- n 1)) }))
                    (grow 100)";
    assert_eq!(
        run(doubling).unwrap_err().kind,
        ErrorKind::TooLarge(1 << 20)
    );
}

#[test]
fn huge_repeat_counts_do_not_allocate() {
    assert_eq!(
        run("(* \"ab\" 9223372036854775807)").unwrap_err().kind,
        ErrorKind::TooLarge(1 << 20)
    );
}

#[test]
fn list_growth_is_bounded() {
    let text = "(def bomb (n l) (if (<= n 0) l (bomb (- n 1) (with l x l))))\n(bomb 60 Guests)";
    let input = input(json!({"guests": [{}, {}]}));
    let error = eval_with(text, &input, &Limits::default()).unwrap_err();
    assert_eq!(
        error.to_string(),
        "t.policy:1:46: value larger than the size limit of 1048576"
    );
}

#[test]
fn work_on_big_values_is_charged_to_the_step_budget() {
    let text = "(defvar big (* \"x\" 1000000))
                (def f (n) (if (<= n 0) (== big big) { (f (- n 1)) (f (- n 1)) }))
                (f 30)";
    assert_eq!(
        run(text).unwrap_err().kind,
        ErrorKind::StepBudget(1_000_000)
    );
}

#[test]
fn debug_output_is_charged_to_the_step_budget() {
    let text = "(defvar big (* \"x\" 1000000))
                (def f (n) (if (<= n 0) (debug big) { (f (- n 1)) (f (- n 1)) }))
                (f 30)";
    let error = run(text).unwrap_err();
    assert_eq!(error.kind, ErrorKind::StepBudget(1_000_000));
}

#[test]
fn limits_are_configurable() {
    let limits = Limits {
        max_steps: 10_000_000,
        max_depth: 1_000,
        max_value_size: 16,
    };
    let deep = "(def down (n) (if (<= n 0) 0 (down (- n 1)))) (down 300)";
    let result = on_stack(16 << 20, move || {
        eval_with(deep, &Input::default(), &limits).unwrap().results[1].clone()
    });
    assert_eq!(result, Value::Int(0));
    assert_eq!(run(deep).unwrap_err().kind, ErrorKind::DepthLimit(200));
    assert_eq!(
        value("(* \"x\" 100)"),
        Value::from("x".repeat(100).as_str())
    );
    assert_eq!(
        eval_with("(* \"x\" 100)", &Input::default(), &limits)
            .unwrap_err()
            .kind,
        ErrorKind::TooLarge(16)
    );
}

#[test]
fn limits_read_from_json_with_defaults() {
    let limits: Limits = serde_json::from_value(json!({"max_steps": 10})).unwrap();
    assert_eq!(
        limits,
        Limits {
            max_steps: 10,
            ..Limits::default()
        }
    );
    assert_eq!(
        Limits::default(),
        Limits {
            max_steps: 1_000_000,
            max_depth: 200,
            max_value_size: 1 << 20
        }
    );
}
