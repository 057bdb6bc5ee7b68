//! Operators with Python's semantics.

use crate::{error, s, value};
use memtide_lang::Value;

#[test]
fn integer_arithmetic_stays_integer() {
    assert_eq!(value("(+ 1 2)"), Value::Int(3));
    assert_eq!(value("(- 5 8)"), Value::Int(-3));
    assert_eq!(value("(* 6 7)"), Value::Int(42));
}

#[test]
fn division_is_true_division() {
    assert_eq!(value("(/ 7 2)"), Value::Float(3.5));
    assert_eq!(value("(/ 6 3)"), Value::Float(2.0));
    assert_eq!(value("(/ -7 2)"), Value::Float(-3.5));
}

#[test]
fn mixing_integers_and_floats_gives_floats() {
    assert_eq!(value("(+ 1 2.0)"), Value::Float(3.0));
    assert_eq!(value("(* 1.5 2)"), Value::Float(3.0));
    assert_eq!(value("(- 0.5 1)"), Value::Float(-0.5));
}

#[test]
fn booleans_count_as_one_and_zero() {
    assert_eq!(value("(+ (< 1 2) (< 1 2))"), Value::Int(2));
    assert_eq!(value("(* (> 1 2) 5)"), Value::Int(0));
    assert_eq!(value("(/ 1 (< 1 2))"), Value::Float(1.0));
    assert_eq!(value("(+ (< 1 2) 0.5)"), Value::Float(1.5));
}

#[test]
fn plus_concatenates_strings_and_times_repeats_them() {
    assert_eq!(value("(+ \"ab\" \"cd\")"), s("abcd"));
    assert_eq!(value("(* \"ab\" 3)"), s("ababab"));
    assert_eq!(value("(* 2 \"x\")"), s("xx"));
    assert_eq!(value("(* \"x\" -1)"), s(""));
    assert_eq!(value("(* \"x\" (< 1 2))"), s("x"));
}

#[test]
fn operands_that_do_not_combine_are_errors() {
    assert_eq!(
        error("(+ \"a\" 1)"),
        "t.policy:1:1: unsupported operand types for +: string and int"
    );
    assert_eq!(
        error("(- \"a\" \"b\")"),
        "t.policy:1:1: unsupported operand types for -: string and string"
    );
    assert_eq!(
        error("(* \"x\" 2.0)"),
        "t.policy:1:1: unsupported operand types for *: string and float"
    );
    assert_eq!(
        error("(+ nil 1)"),
        "t.policy:1:1: unsupported operand types for +: nil and int"
    );
    assert_eq!(
        error(" (/ 1 ())"),
        "t.policy:1:2: unsupported operand types for /: int and list"
    );
    assert_eq!(
        error("(+ Host 1)"),
        "t.policy:1:1: unsupported operand types for +: entity and int"
    );
}

#[test]
fn division_by_zero_is_an_error() {
    assert_eq!(error("(/ 1 0)"), "t.policy:1:1: division by zero");
    assert_eq!(error("(/ 1.0 0.0)"), "t.policy:1:1: division by zero");
    assert_eq!(error("(/ 1 -0.0)"), "t.policy:1:1: division by zero");
    assert_eq!(
        error("(+ 1\n  (/ 1 (> 1 2)))"),
        "t.policy:2:3: division by zero"
    );
}

#[test]
fn integer_overflow_is_an_error() {
    assert_eq!(
        error("(+ 9223372036854775807 1)"),
        "t.policy:1:1: integer overflow"
    );
    assert_eq!(
        error("(- -9223372036854775808 1)"),
        "t.policy:1:1: integer overflow"
    );
    assert_eq!(
        error("(* 4611686018427387904 2)"),
        "t.policy:1:1: integer overflow"
    );
    assert_eq!(
        error("(abs -9223372036854775808)"),
        "t.policy:1:1: integer overflow"
    );
}

#[test]
fn float_overflow_gives_infinity_as_in_python() {
    assert_eq!(value("(* 1e308 10)"), Value::Float(f64::INFINITY));
}

#[test]
fn comparisons_yield_booleans() {
    assert_eq!(value("(< 1 2)"), Value::Bool(true));
    assert_eq!(value("(> 1 2)"), Value::Bool(false));
    assert_eq!(value("(<= 2 2)"), Value::Bool(true));
    assert_eq!(value("(>= 1 2)"), Value::Bool(false));
    assert_eq!(value("(>= 2 1.5)"), Value::Bool(true));
    assert_eq!(value("(<= 1.0 1)"), Value::Bool(true));
    assert_eq!(value("(< \"abc\" \"abd\")"), Value::Bool(true));
}

#[test]
fn integers_and_floats_compare_by_exact_value() {
    assert_eq!(value("(== 1 1.0)"), Value::Bool(true));
    assert_eq!(
        value("(== 9007199254740993 9007199254740992.0)"),
        Value::Bool(false)
    );
    assert_eq!(
        value("(< 9007199254740992.0 9007199254740993)"),
        Value::Bool(true)
    );
    assert_eq!(
        value("(> 9223372036854775807 9223372036854775808.0)"),
        Value::Bool(false)
    );
    assert_eq!(
        value("(< -9223372036854775808 -9223372036854775808.0)"),
        Value::Bool(false)
    );
    assert_eq!(value("(< -2 -1.5)"), Value::Bool(true));
    assert_eq!(value("(> -1 -1.5)"), Value::Bool(true));
}

#[test]
fn equality_is_pythons() {
    assert_eq!(value("(== 1 (< 0 1))"), Value::Bool(true));
    assert_eq!(value("(== \"a\" \"a\")"), Value::Bool(true));
    assert_eq!(value("(== \"1\" 1)"), Value::Bool(false));
    assert_eq!(value("(== nil nil)"), Value::Bool(true));
    assert_eq!(value("(!= nil 0)"), Value::Bool(true));
    assert_eq!(value("(== () ())"), Value::Bool(true));
    assert_eq!(value("(== Host Host)"), Value::Bool(true));
}

#[test]
fn nan_is_unordered_and_unequal() {
    let nan = "(defvar nan (- 1e999 1e999))";
    assert_eq!(value(&format!("{nan} (== nan nan)")), Value::Bool(false));
    assert_eq!(value(&format!("{nan} (!= nan nan)")), Value::Bool(true));
    assert_eq!(value(&format!("{nan} (< nan 1)")), Value::Bool(false));
    assert_eq!(value(&format!("{nan} (>= nan 1)")), Value::Bool(false));
}

#[test]
fn values_without_order_cannot_be_compared() {
    assert_eq!(
        error("(< 1 \"a\")"),
        "t.policy:1:1: cannot compare int and string"
    );
    assert_eq!(
        error("(>= nil 1)"),
        "t.policy:1:1: cannot compare nil and int"
    );
    assert_eq!(
        error("(< () ())"),
        "t.policy:1:1: cannot compare list and list"
    );
}

#[test]
fn shifts_are_integer_shifts() {
    assert_eq!(value("(<< 1 10)"), Value::Int(1024));
    assert_eq!(value("(>> -8 1)"), Value::Int(-4));
    assert_eq!(value("(>> 5 100)"), Value::Int(0));
    assert_eq!(value("(>> -5 100)"), Value::Int(-1));
    assert_eq!(value("(<< -1 63)"), Value::Int(i64::MIN));
    assert_eq!(value("(<< 0 1000)"), Value::Int(0));
    // Counts beyond 32 bits shift as far as Python's do (found by an audit: they were
    // called negative).
    assert_eq!(value("(>> 5 4294967296)"), Value::Int(0));
    assert_eq!(value("(>> -5 4294967296)"), Value::Int(-1));
    assert_eq!(value("(<< 0 9223372036854775807)"), Value::Int(0));
    assert_eq!(value("(<< (< 1 2) 3)"), Value::Int(8));
}

#[test]
fn shift_errors() {
    assert_eq!(error("(<< 1 63)"), "t.policy:1:1: integer overflow");
    assert_eq!(error("(<< 3 62)"), "t.policy:1:1: integer overflow");
    assert_eq!(error("(<< 1 64)"), "t.policy:1:1: integer overflow");
    assert_eq!(error("(<< 1 4294967296)"), "t.policy:1:1: integer overflow");
    assert_eq!(error("(<< 1 -1)"), "t.policy:1:1: negative shift count");
    assert_eq!(
        error("(<< 1.0 2)"),
        "t.policy:1:1: unsupported operand types for <<: float and int"
    );
}

#[test]
fn operators_take_two_arguments() {
    assert_eq!(error("(+ 1)"), "t.policy:1:1: '+' takes 2 arguments, got 1");
    assert_eq!(
        error("(< 1 2 3)"),
        "t.policy:1:1: '<' takes 2 arguments, got 3"
    );
}
