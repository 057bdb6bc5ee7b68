//! The operators, with Python's semantics on integers, floats, booleans and strings.

use crate::error::ErrorKind;
use crate::value::Value;
use std::cmp::Ordering;

/// A value seen as a number: booleans count as 0 and 1.
#[derive(Clone, Copy)]
enum Num {
    Int(i64),
    Float(f64),
}

fn num(v: &Value) -> Option<Num> {
    match v {
        Value::Bool(b) => Some(Num::Int(i64::from(*b))),
        Value::Int(n) => Some(Num::Int(*n)),
        Value::Float(x) => Some(Num::Float(*x)),
        _ => None,
    }
}

fn int(v: &Value) -> Option<i64> {
    match num(v) {
        Some(Num::Int(n)) => Some(n),
        _ => None,
    }
}

/// Apply binary operator `op` (one of the lexer's operators); strings longer than
/// `max_size` (see [`Value::size`]) are refused.
pub(crate) fn binary(op: &str, a: &Value, b: &Value, max_size: usize) -> Result<Value, ErrorKind> {
    let ordered =
        |accept: fn(Ordering) -> bool| Ok(Value::Bool(compare(a, b)?.is_some_and(accept)));
    match op {
        "+" | "-" | "*" | "/" => arithmetic(op, a, b, max_size),
        "<" => ordered(Ordering::is_lt),
        ">" => ordered(Ordering::is_gt),
        "<=" => ordered(Ordering::is_le),
        ">=" => ordered(Ordering::is_ge),
        "==" => Ok(Value::Bool(equal(a, b))),
        "!=" => Ok(Value::Bool(!equal(a, b))),
        _ => shift(op, a, b),
    }
}

fn operands(op: &str, a: &Value, b: &Value) -> ErrorKind {
    ErrorKind::Operands {
        op: op.to_string(),
        left: a.type_name(),
        right: b.type_name(),
    }
}

fn arithmetic(op: &str, a: &Value, b: &Value, max_size: usize) -> Result<Value, ErrorKind> {
    let (Some(x), Some(y)) = (num(a), num(b)) else {
        return match (op, a, b) {
            ("+", Value::Str(x), Value::Str(y)) => {
                check_size(1 + x.len() + y.len(), max_size)?;
                Ok(Value::from(format!("{x}{y}").as_str()))
            }
            ("*", Value::Str(s), n) | ("*", n, Value::Str(s)) => match int(n) {
                Some(count) => repeat(s, count, max_size),
                None => Err(operands(op, a, b)),
            },
            _ => Err(operands(op, a, b)),
        };
    };
    if let (Num::Int(x), Num::Int(y)) = (x, y) {
        let result = match op {
            "+" => x.checked_add(y),
            "-" => x.checked_sub(y),
            "*" => x.checked_mul(y),
            _ if y == 0 => return Err(ErrorKind::DivisionByZero),
            _ => return Ok(Value::Float(x as f64 / y as f64)),
        };
        return result.map(Value::Int).ok_or(ErrorKind::IntegerOverflow);
    }
    let (x, y) = (float(x), float(y));
    Ok(Value::Float(match op {
        "+" => x + y,
        "-" => x - y,
        "*" => x * y,
        _ if y == 0.0 => return Err(ErrorKind::DivisionByZero),
        _ => x / y,
    }))
}

fn float(n: Num) -> f64 {
    match n {
        Num::Int(i) => i as f64,
        Num::Float(x) => x,
    }
}

fn check_size(size: usize, max_size: usize) -> Result<(), ErrorKind> {
    if size > max_size {
        Err(ErrorKind::TooLarge(max_size))
    } else {
        Ok(())
    }
}

fn repeat(s: &str, count: i64, max_size: usize) -> Result<Value, ErrorKind> {
    let count = usize::try_from(count.max(0)).map_err(|_| ErrorKind::TooLarge(max_size))?;
    let len = s
        .len()
        .checked_mul(count)
        .ok_or(ErrorKind::TooLarge(max_size))?;
    check_size(len.saturating_add(1), max_size)?;
    Ok(Value::from(s.repeat(count).as_str()))
}

fn shift(op: &str, a: &Value, b: &Value) -> Result<Value, ErrorKind> {
    let (Some(x), Some(count)) = (int(a), int(b)) else {
        return Err(operands(op, a, b));
    };
    if count < 0 {
        return Err(ErrorKind::NegativeShift);
    }
    // Past 63 the result is 0 or -1 for `>>` and an overflow for `<<` of anything but 0.
    let count = u32::try_from(count).unwrap_or(u32::MAX);
    let result = if op == ">>" {
        x >> count.min(63)
    } else if x == 0 {
        0
    } else {
        let shifted = x.checked_shl(count).ok_or(ErrorKind::IntegerOverflow)?;
        if shifted >> count != x {
            return Err(ErrorKind::IntegerOverflow);
        }
        shifted
    };
    Ok(Value::Int(result))
}

/// Order two numbers (exactly, even between integers and floats) or two strings;
/// `None` when a float is NaN. Other pairs have no order.
pub(crate) fn compare(a: &Value, b: &Value) -> Result<Option<Ordering>, ErrorKind> {
    match (num(a), num(b), a, b) {
        (Some(x), Some(y), _, _) => Ok(compare_numbers(x, y)),
        (_, _, Value::Str(x), Value::Str(y)) => Ok(Some(x.cmp(y))),
        _ => Err(ErrorKind::Incomparable(a.type_name(), b.type_name())),
    }
}

fn compare_numbers(x: Num, y: Num) -> Option<Ordering> {
    match (x, y) {
        (Num::Int(a), Num::Int(b)) => Some(a.cmp(&b)),
        (Num::Float(a), Num::Float(b)) => a.partial_cmp(&b),
        (Num::Int(a), Num::Float(b)) => compare_int_float(a, b),
        (Num::Float(a), Num::Int(b)) => compare_int_float(b, a).map(Ordering::reverse),
    }
}

/// Compare without rounding the integer to a float.
fn compare_int_float(i: i64, f: f64) -> Option<Ordering> {
    const TWO_POW_63: f64 = 9_223_372_036_854_775_808.0;
    if f.is_nan() {
        return None;
    }
    if f >= TWO_POW_63 {
        return Some(Ordering::Less);
    }
    if f < -TWO_POW_63 {
        return Some(Ordering::Greater);
    }
    let whole = f.trunc();
    let fraction = if f > whole {
        Ordering::Less
    } else if f < whole {
        Ordering::Greater
    } else {
        Ordering::Equal
    };
    Some(i.cmp(&(whole as i64)).then(fraction))
}

/// Python's `==`: numbers by value (`1 == 1.0 == true`), strings, lists element by
/// element, nil with nil, an entity with itself; anything else is unequal.
pub(crate) fn equal(a: &Value, b: &Value) -> bool {
    if let (Some(x), Some(y)) = (num(a), num(b)) {
        return compare_numbers(x, y) == Some(Ordering::Equal);
    }
    match (a, b) {
        (Value::Nil, Value::Nil) => true,
        (Value::Str(x), Value::Str(y)) => x == y,
        (Value::List(x), Value::List(y)) => {
            x.items().len() == y.items().len()
                && x.items().iter().zip(y.items()).all(|(p, q)| equal(p, q))
        }
        (Value::Entity(x), Value::Entity(y)) => x == y,
        _ => false,
    }
}
