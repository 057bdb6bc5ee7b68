//! Every form of the language.

use crate::{error, input, list, run, s, value, value_over};
use memtide_lang::{Input, Value};
use serde_json::json;

fn two_guests() -> Input {
    input(json!({"guests": [{"props": {"name": "vm1"}}, {"props": {"name": "vm2"}}]}))
}

#[test]
fn a_program_yields_one_result_per_top_level_form() {
    let evaluation = run("1 \"two\" (+ 1 2) nil").unwrap();
    assert_eq!(
        evaluation.results,
        vec![Value::Int(1), s("two"), Value::Int(3), Value::Nil]
    );
}

#[test]
fn defvar_binds_and_yields_the_value() {
    assert_eq!(
        run("(defvar x 3) x").unwrap().results,
        vec![Value::Int(3), Value::Int(3)]
    );
}

#[test]
fn defvar_keeps_an_existing_binding_as_in_mom() {
    // MOM's c_defvar: `self.stack.set(name, value, True)`, which is the scope's
    // `setdefault`: the first binding stays, and is what the defvar yields (an audit
    // found the second replacing it).
    let evaluation = run("(defvar x 1) (defvar x 2) x").unwrap();
    assert_eq!(
        evaluation.results,
        vec![Value::Int(1), Value::Int(1), Value::Int(1)]
    );
}

#[test]
fn set_not_defvar_changes_a_bound_name() {
    assert_eq!(value("(defvar x 1) (defvar x (+ x 1)) x"), Value::Int(1));
    assert_eq!(value("(defvar x 1) (set x (+ x 1)) x"), Value::Int(2));
}

#[test]
fn set_assigns_and_yields_the_value() {
    assert_eq!(
        run("(defvar x 1) (set x 5) x").unwrap().results[1..],
        [Value::Int(5), Value::Int(5)]
    );
}

#[test]
fn set_of_an_unbound_name_is_an_error() {
    assert_eq!(error("(set y 1)"), "t.policy:1:6: unknown symbol 'y'");
}

#[test]
fn setq_is_set_as_in_mom() {
    // MOM's Parser.py: `c_setq = c_set` (Lisp's set would evaluate its first argument).
    assert_eq!(
        run("(defvar x 1) (setq x 5) x").unwrap().results[1..],
        [Value::Int(5), Value::Int(5)]
    );
    assert_eq!(error("(setq y 1)"), "t.policy:1:7: unknown symbol 'y'");
}

#[test]
fn let_binds_sequentially_and_yields_the_last_body_value() {
    assert_eq!(value("(let ((a 2) (b (+ a 1))) (* a b))"), Value::Int(6));
    assert_eq!(value("(let ((a 1)) 5 (+ a 1))"), Value::Int(2));
    assert_eq!(value("(let [[a 1] [b 2]] (+ a b))"), Value::Int(3));
}

#[test]
fn let_without_body_yields_nil() {
    assert_eq!(value("(let ((a 1)))"), Value::Nil);
    assert_eq!(value("(let ())"), Value::Nil);
}

#[test]
fn let_bindings_end_with_the_let() {
    assert_eq!(
        error("(let ((a 1)) a) a"),
        "t.policy:1:17: unknown symbol 'a'"
    );
    assert_eq!(value("(defvar a 1) (let ((a 2)) a)"), Value::Int(2));
    assert_eq!(value("(defvar a 1) (let ((a 2)) a) a"), Value::Int(1));
}

#[test]
fn def_defines_a_function_and_yields_its_name() {
    let evaluation = run("(def sq (x) (* x x)) (sq 7)").unwrap();
    assert_eq!(evaluation.results, vec![s("sq"), Value::Int(49)]);
    assert_eq!(value("(defun twice (x) (+ x x)) (twice 4)"), Value::Int(8));
    assert_eq!(value("(def answer () 42) (answer)"), Value::Int(42));
    assert_eq!(
        value("(def add3 (a b c) (+ a (+ b c))) (add3 1 2 3)"),
        Value::Int(6)
    );
}

#[test]
fn functions_may_recurse() {
    let fact = "(def fact (n) (if (<= n 1) 1 (* n (fact (- n 1))))) (fact 10)";
    assert_eq!(value(fact), Value::Int(3_628_800));
}

#[test]
fn a_later_def_replaces_the_function() {
    assert_eq!(value("(def f () 1) (def f () 2) (f)"), Value::Int(2));
}

#[test]
fn functions_and_variables_have_separate_names() {
    assert_eq!(
        value("(defvar f 10) (def f (x) (+ x f)) (f 1)"),
        Value::Int(11)
    );
}

#[test]
fn function_arguments_are_evaluated_before_the_call() {
    assert_eq!(
        value("(def f (a b) (- a b)) (f (+ 1 9) (* 2 2))"),
        Value::Int(6)
    );
}

#[test]
fn if_takes_the_branch_its_condition_selects_and_evaluates_only_it() {
    assert_eq!(value("(if 1 2 (undefined))"), Value::Int(2));
    assert_eq!(value("(if 0 (undefined) 3)"), Value::Int(3));
}

#[test]
fn false_values_are_zero_empty_nil_and_false() {
    for falsy in ["0", "0.0", "-0.0", "\"\"", "''", "nil", "()", "(< 2 1)"] {
        assert_eq!(
            value(&format!("(if {falsy} 1 2)")),
            Value::Int(2),
            "{falsy}"
        );
    }
    for truthy in ["1", "-1", "0.5", "\"0\"", "\" \"", "(< 1 2)", "Host"] {
        assert_eq!(
            value(&format!("(if {truthy} 1 2)")),
            Value::Int(1),
            "{truthy}"
        );
    }
}

#[test]
fn lists_are_true_unless_empty() {
    assert_eq!(
        value_over("(if (with Guests g 0) 1 2)", &two_guests()),
        Value::Int(1)
    );
    assert_eq!(value("(if (with Guests g 0) 1 2)"), Value::Int(2));
}

#[test]
fn and_yields_the_first_false_argument_or_the_last() {
    assert_eq!(value("(and 1 2 3)"), Value::Int(3));
    assert_eq!(value("(and 1 0 2)"), Value::Int(0));
    assert_eq!(value("(and 1 \"\" nil)"), s(""));
    assert_eq!(value("(and 7)"), Value::Int(7));
}

#[test]
fn or_yields_the_first_true_argument_or_the_last() {
    assert_eq!(value("(or 0 \"\" 5 6)"), Value::Int(5));
    assert_eq!(value("(or 0 nil)"), Value::Nil);
    assert_eq!(value("(or nil 0)"), Value::Int(0));
}

#[test]
fn and_and_or_evaluate_every_argument() {
    let evaluation = run("(and 0 (Host.Control \"ksm_run\" 1))").unwrap();
    assert_eq!(evaluation.results, vec![Value::Int(0)]);
    assert_eq!(evaluation.controls.host["ksm_run"], Value::Int(1));
    let evaluation = run("(or 1 (Host.Control \"ksm_run\" 0))").unwrap();
    assert_eq!(evaluation.results, vec![Value::Int(1)]);
    assert_eq!(evaluation.controls.host["ksm_run"], Value::Int(0));
}

#[test]
fn not_yields_a_boolean() {
    assert_eq!(value("(not 0)"), Value::Bool(true));
    assert_eq!(value("(not \"a\")"), Value::Bool(false));
    assert_eq!(value("(not nil)"), Value::Bool(true));
}

#[test]
fn min_and_max_yield_the_first_extreme_argument() {
    assert_eq!(value("(min 3 1 2)"), Value::Int(1));
    assert_eq!(value("(max 1 2.5 2)"), Value::Float(2.5));
    assert_eq!(value("(max 1 1.0)"), Value::Int(1));
    assert_eq!(value("(min 1.0 1)"), Value::Float(1.0));
    assert_eq!(value("(min 4)"), Value::Int(4));
    assert_eq!(value("(min \"b\" \"a\" \"c\")"), s("a"));
    assert_eq!(value("(max (< 1 2) 0)"), Value::Bool(true));
}

#[test]
fn min_and_max_refuse_values_without_order() {
    assert_eq!(
        error("(max 1 \"a\")"),
        "t.policy:1:1: cannot compare string and int"
    );
    assert_eq!(
        error("(min 1 nil)"),
        "t.policy:1:1: cannot compare nil and int"
    );
}

#[test]
fn null_is_true_when_every_argument_is_nil_or_empty() {
    assert_eq!(value("(null nil)"), Value::Bool(true));
    assert_eq!(value("(null nil () \"\")"), Value::Bool(true));
    assert_eq!(value("(null 0)"), Value::Bool(false));
    assert_eq!(value("(null nil 1)"), Value::Bool(false));
    assert_eq!(value("(null)"), Value::Bool(true), "MOM: all() of nothing");
    assert_eq!(
        value_over("(null (with Guests g 1))", &two_guests()),
        Value::Bool(false)
    );
}

#[test]
fn valid_is_true_when_no_argument_is_nil() {
    assert_eq!(value("(valid 1 0 \"\" ())"), Value::Bool(true));
    assert_eq!(value("(valid 1 nil)"), Value::Bool(false));
    assert_eq!(
        value("(valid)"),
        Value::Bool(true),
        "MOM: not any() of nothing"
    );
}

#[test]
fn abs_of_numbers() {
    assert_eq!(value("(abs -3)"), Value::Int(3));
    assert_eq!(value("(abs -2.5)"), Value::Float(2.5));
    assert_eq!(value("(abs (< 1 2))"), Value::Int(1));
    assert_eq!(
        error("(abs \"x\")"),
        "t.policy:1:1: 'abs' needs a number, got string"
    );
}

#[test]
fn int_truncates_toward_zero() {
    assert_eq!(value("(int 3.9)"), Value::Int(3));
    assert_eq!(value("(int -3.9)"), Value::Int(-3));
    assert_eq!(value("(int 7)"), Value::Int(7));
    assert_eq!(value("(int (> 2 1))"), Value::Int(1));
    assert_eq!(value("(int -9223372036854775808.0)"), Value::Int(i64::MIN));
    assert_eq!(
        error("(int 1e999)"),
        "t.policy:1:1: cannot convert inf to an integer"
    );
    assert_eq!(
        error("(int 9223372036854775808.0)"),
        "t.policy:1:1: integer overflow"
    );
    assert_eq!(
        error("(int nil)"),
        "t.policy:1:1: 'int' needs a number, got nil"
    );
}

#[test]
fn debug_records_its_arguments_and_yields_the_last() {
    let evaluation = run("(defvar r 0.25)\n(debug \"ratio\" r (+ 1 1))").unwrap();
    assert_eq!(evaluation.results[1], Value::Int(2));
    assert_eq!(
        evaluation.debug,
        vec!["t.policy:2: ratio 0.25 2".to_string()]
    );
}

#[test]
fn blocks_evaluate_in_order_and_yield_the_last() {
    assert_eq!(value("{ (defvar a 1) (set a (+ a 1)) a }"), Value::Int(2));
    assert_eq!(value("{}"), Value::Nil);
}

#[test]
fn blocks_open_no_scope() {
    assert_eq!(value("{ (defvar a 1) } a"), Value::Int(1));
}

#[test]
fn brackets_are_lists_too() {
    assert_eq!(value("[+ 1 2]"), Value::Int(3));
    assert_eq!(value("[if [< 1 2] 'y' 'n']"), s("y"));
}

#[test]
fn the_empty_list_is_a_value() {
    assert_eq!(value("()"), list(vec![]));
    assert_eq!(value("[]"), list(vec![]));
}

#[test]
fn with_yields_the_body_value_for_each_element() {
    let names = "(with Guests guest (guest.Prop \"name\"))";
    assert_eq!(
        value_over(names, &two_guests()),
        list(vec![s("vm1"), s("vm2")])
    );
    assert_eq!(value(names), list(vec![]));
}

#[test]
fn with_iterates_any_list() {
    let nested = "(with (with Guests g 2) x (* x 10))";
    assert_eq!(
        value_over(nested, &two_guests()),
        list(vec![Value::Int(20), Value::Int(20)])
    );
}

#[test]
fn with_binds_its_name_only_inside_the_body() {
    let text = "(with Guests g 1) (+ g 1)";
    assert_eq!(
        crate::error_over(text, &two_guests()),
        "t.policy:1:22: unknown symbol 'g'"
    );
}

#[test]
fn with_needs_a_list() {
    assert_eq!(
        error("(with 5 g g)"),
        "t.policy:1:7: 'with' needs a list, got int"
    );
}
