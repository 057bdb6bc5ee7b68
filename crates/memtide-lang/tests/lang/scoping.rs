//! Dynamic scoping, as MOM's policies rely on it.

use crate::{error, value};
use memtide_lang::Value;

#[test]
fn a_function_sees_its_callers_variables() {
    let text = "(def show () x) (def caller (x) (show)) (caller 7)";
    assert_eq!(value(text), Value::Int(7));
}

#[test]
fn a_function_sees_variables_of_a_let_around_its_call() {
    assert_eq!(value("(def show () y) (let ((y 3)) (show))"), Value::Int(3));
}

#[test]
fn without_a_caller_binding_the_name_is_unknown_where_it_is_used() {
    assert_eq!(
        error("(def show () x) (show)"),
        "t.policy:1:14: unknown symbol 'x'"
    );
}

#[test]
fn set_in_a_callee_assigns_the_callers_binding() {
    let text = "(def bump () (set n (+ n 1)))
                (def outer () (let ((n 1)) (bump) (bump) n))
                (outer)";
    assert_eq!(value(text), Value::Int(3));
}

#[test]
fn set_assigns_the_innermost_binding_only() {
    let text = "(defvar n 1) (let ((n 10)) (set n 20)) n";
    assert_eq!(value(text), Value::Int(1));
}

#[test]
fn set_in_a_function_assigns_a_global() {
    let text = "(defvar total 0) (def add (v) (set total (+ total v))) (add 2) (add 3) total";
    assert_eq!(value(text), Value::Int(5));
}

#[test]
fn defvar_in_a_function_binds_in_the_call_only() {
    assert_eq!(
        error("(def f () (defvar y 1)) (f) y"),
        "t.policy:1:29: unknown symbol 'y'"
    );
}

#[test]
fn defvar_binds_in_the_current_scope_even_when_an_outer_one_has_the_name() {
    let text = "(defvar x 1) (let ((z 0)) (defvar x 2) x)";
    assert_eq!(value(text), Value::Int(2));
    assert_eq!(value(&format!("{text} x")), Value::Int(1));
}

#[test]
fn defvar_keeps_a_binding_of_the_current_local_scope() {
    assert_eq!(value("(let ((x 1)) (defvar x 2) x)"), Value::Int(1));
    assert_eq!(value("(let ((a 1) (a 2)) a)"), Value::Int(1));
    // MOM's test_scope: a defvar in a let whose binding it is keeps it.
    assert_eq!(
        value("(defvar a 1) (let ((a 5)) (defvar a 6) a)"),
        Value::Int(5)
    );
    // Only that scope's: the global is untouched once the let ends.
    assert_eq!(
        value("(defvar x 0) (let ((x 1)) (defvar x 2)) x"),
        Value::Int(0)
    );
}

#[test]
fn arguments_are_evaluated_in_the_call_after_the_parameters_before_them() {
    // MOM calls a function as a let of its parameters (found by an audit: memtide
    // evaluated them in the caller's scope first).
    let text = "(defvar x 1) (defvar y 2) (def f (x y) (- x y)) (f y x)";
    assert_eq!(value(text), Value::Int(0));
    assert_eq!(value("(def f (a b) (+ a b)) (f 1 a)"), Value::Int(2));
    // A parameter's argument still sees the caller's bindings of other names.
    assert_eq!(
        value("(defvar n 3) (def g (k) (* k 2)) (g n)"),
        Value::Int(6)
    );
}

#[test]
fn parameters_shadow_globals_for_the_call_only() {
    assert_eq!(value("(defvar x 1) (def f (x) x) (f 5)"), Value::Int(5));
    assert_eq!(value("(defvar x 1) (def f (x) x) (f 5) x"), Value::Int(1));
}

#[test]
fn functions_defined_anywhere_are_global() {
    assert_eq!(
        value("(def outer () (def inner () 42)) (outer) (inner)"),
        Value::Int(42)
    );
}

#[test]
fn with_can_accumulate_into_an_outer_variable() {
    let input = crate::input(serde_json::json!({"guests": [
        {"stats": [{"balloon_cur": 100}]},
        {"stats": [{"balloon_cur": 250}]}
    ]}));
    let text = "(defvar sum 0) (with Guests g (set sum (+ sum g.balloon_cur))) sum";
    assert_eq!(crate::value_over(text, &input), Value::Int(350));
}
