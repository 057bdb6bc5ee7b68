//! The built-in functions that only compute with their (already evaluated) arguments.

use crate::error::ErrorKind;
use crate::lexer::OPERATORS;
use crate::ops;
use crate::value::Value;
use std::cmp::Ordering;

/// Forms that the evaluator handles itself (they control evaluation or have effects).
pub(crate) const FORMS: [&str; 9] = [
    "defvar", "set", "setq", "let", "def", "defun", "if", "with", "debug",
];

/// Functions that [`apply`] computes.
pub(crate) const FUNCTIONS: [&str; 9] = [
    "and", "or", "not", "min", "max", "null", "valid", "abs", "int",
];

/// Whether `name` is a built-in form, function or operator (which `def` may not redefine).
pub(crate) fn is_builtin(name: &str) -> bool {
    FORMS.contains(&name) || is_function(name)
}

/// Whether [`apply`] computes `name`.
pub(crate) fn is_function(name: &str) -> bool {
    FUNCTIONS.contains(&name) || OPERATORS.contains(&name)
}

/// Fail unless `args` has exactly `expected` elements.
pub(crate) fn exactly(name: &str, args: usize, expected: usize) -> Result<(), ErrorKind> {
    if args == expected {
        Ok(())
    } else {
        Err(ErrorKind::Arity {
            name: name.to_string(),
            expected,
            got: args,
        })
    }
}

/// Fail unless `args` has at least `min` elements.
fn at_least(name: &str, args: usize, min: usize) -> Result<(), ErrorKind> {
    if args >= min {
        Ok(())
    } else {
        Err(ErrorKind::ArityAtLeast {
            name: name.to_string(),
            min,
            got: args,
        })
    }
}

/// Fail unless the built-in form, function or operator `name` takes `args` arguments.
pub(crate) fn arity(name: &str, args: usize) -> Result<(), ErrorKind> {
    match name {
        "null" | "valid" => Ok(()),
        "not" | "abs" | "int" => exactly(name, args, 1),
        "and" | "or" | "min" | "max" | "let" | "debug" => at_least(name, args, 1),
        "defvar" | "set" | "setq" => exactly(name, args, 2),
        "def" | "defun" | "if" | "with" => exactly(name, args, 3),
        _ => exactly(name, args, 2),
    }
}

/// Apply the function or operator `name` (see [`is_function`]) to `args`.
pub(crate) fn apply(name: &str, args: &[Value], max_size: usize) -> Result<Value, ErrorKind> {
    arity(name, args.len())?;
    match name {
        // As MOM's: true of no arguments at all.
        "null" => return Ok(Value::Bool(args.iter().all(is_empty))),
        "valid" => return Ok(Value::Bool(!args.contains(&Value::Nil))),
        _ => {}
    }
    let last = &args[args.len() - 1];
    Ok(match name {
        "and" => args.iter().find(|v| !v.is_truthy()).unwrap_or(last).clone(),
        "or" => args.iter().find(|v| v.is_truthy()).unwrap_or(last).clone(),
        "not" => Value::Bool(!last.is_truthy()),
        "min" => extreme(args, Ordering::Less)?,
        "max" => extreme(args, Ordering::Greater)?,
        "abs" => abs(last)?,
        "int" => int(last)?,
        op => ops::binary(op, &args[0], last, max_size)?,
    })
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Nil => true,
        Value::Str(s) => s.is_empty(),
        Value::List(l) => l.items().is_empty(),
        _ => false,
    }
}

/// The first argument that no later one beats in direction `wanted`.
fn extreme(args: &[Value], wanted: Ordering) -> Result<Value, ErrorKind> {
    let mut best = &args[0];
    for candidate in &args[1..] {
        if ops::compare(candidate, best)? == Some(wanted) {
            best = candidate;
        }
    }
    Ok(best.clone())
}

fn needs_number(name: &str, got: &Value) -> ErrorKind {
    ErrorKind::TypeMismatch {
        what: format!("'{name}'"),
        expected: "a number",
        got: got.type_name(),
    }
}

fn abs(v: &Value) -> Result<Value, ErrorKind> {
    match v {
        Value::Bool(b) => Ok(Value::Int(i64::from(*b))),
        Value::Int(n) => n
            .checked_abs()
            .map(Value::Int)
            .ok_or(ErrorKind::IntegerOverflow),
        Value::Float(x) => Ok(Value::Float(x.abs())),
        other => Err(needs_number("abs", other)),
    }
}

/// Python's `int()` on numbers: floats are truncated toward zero.
fn int(v: &Value) -> Result<Value, ErrorKind> {
    const TWO_POW_63: f64 = 9_223_372_036_854_775_808.0;
    match v {
        Value::Bool(b) => Ok(Value::Int(i64::from(*b))),
        Value::Int(n) => Ok(Value::Int(*n)),
        Value::Float(x) if !x.is_finite() => Err(ErrorKind::NotConvertible(format!("{x:?}"))),
        Value::Float(x) if x.trunc() >= TWO_POW_63 || x.trunc() < -TWO_POW_63 => {
            Err(ErrorKind::IntegerOverflow)
        }
        Value::Float(x) => Ok(Value::Int(x.trunc() as i64)),
        other => Err(needs_number("int", other)),
    }
}
