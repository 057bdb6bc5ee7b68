//! Run-time values.

use crate::entities::Entity;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::sync::Arc;

/// A value a policy computes with. Cloning is cheap: strings and lists are shared.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `nil`, the null value.
    Nil,
    /// The result of a comparison, `not`, `null` or `valid`.
    Bool(bool),
    /// A 64-bit integer.
    Int(i64),
    /// A 64-bit float.
    Float(f64),
    /// A string.
    Str(Arc<str>),
    /// A list.
    List(List),
    /// The host or a guest.
    Entity(Entity),
}

/// A list of values, with its size (see [`Value::size`]) and depth cached.
#[derive(Debug, Clone, PartialEq)]
pub struct List {
    items: Arc<[Value]>,
    size: usize,
    depth: usize,
}

impl List {
    /// A list of `items`.
    pub fn new(items: Vec<Value>) -> List {
        let size = items
            .iter()
            .fold(1usize, |sum, item| sum.saturating_add(item.size()));
        let depth = 1 + items.iter().map(Value::depth).max().unwrap_or(0);
        List {
            items: items.into(),
            size,
            depth,
        }
    }

    /// The elements.
    pub fn items(&self) -> &[Value] {
        &self.items
    }
}

impl Value {
    /// The type's name, as error messages show it.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Nil => "nil",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "string",
            Value::List(_) => "list",
            Value::Entity(_) => "entity",
        }
    }

    /// Whether the value counts as true: all but 0, 0.0, "", nil, false and the empty list.
    pub fn is_truthy(&self) -> bool {
        match self {
            Value::Nil => false,
            Value::Bool(b) => *b,
            Value::Int(n) => *n != 0,
            Value::Float(x) => *x != 0.0,
            Value::Str(s) => !s.is_empty(),
            Value::List(l) => !l.items.is_empty(),
            Value::Entity(_) => true,
        }
    }

    /// The value's size, which the evaluation limits: 1 plus the byte length of a
    /// string, 1 plus the sizes of a list's elements, 1 for anything else.
    pub fn size(&self) -> usize {
        match self {
            Value::Str(s) => 1 + s.len(),
            Value::List(l) => l.size,
            _ => 1,
        }
    }

    /// Lists within lists: 0 for anything but a list, 1 for a list of no list. Displaying,
    /// comparing and dropping a value go through its levels one by one, so evaluation
    /// bounds them ([`crate::Limits::max_depth`]).
    pub fn depth(&self) -> usize {
        match self {
            Value::List(l) => l.depth,
            _ => 0,
        }
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::Str(s.into())
    }
}

impl From<Vec<Value>> for Value {
    fn from(items: Vec<Value>) -> Value {
        Value::List(List::new(items))
    }
}

/// Strings show their raw text, lists their elements in parentheses.
impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Nil => f.write_str("nil"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Int(n) => write!(f, "{n}"),
            Value::Float(x) => write!(f, "{x:?}"),
            Value::Str(s) => f.write_str(s),
            Value::List(l) => {
                f.write_str("(")?;
                for (i, item) in l.items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(" ")?;
                    }
                    write!(f, "{item}")?;
                }
                f.write_str(")")
            }
            Value::Entity(e) => write!(f, "{e}"),
        }
    }
}

/// Integers and floats keep their type; nil is `null`; an entity is its display string.
impl Serialize for Value {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::Nil => s.serialize_unit(),
            Value::Bool(b) => s.serialize_bool(*b),
            Value::Int(n) => s.serialize_i64(*n),
            Value::Float(x) => s.serialize_f64(*x),
            Value::Str(text) => s.serialize_str(text),
            Value::List(l) => s.collect_seq(l.items.iter()),
            Value::Entity(e) => s.collect_str(e),
        }
    }
}

/// Reads JSON null, booleans, numbers (integers that fit in 64 bits stay integers),
/// strings and arrays; objects are refused.
impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
        from_json(serde_json::Value::deserialize(d)?).map_err(D::Error::custom)
    }
}

fn from_json(json: serde_json::Value) -> Result<Value, &'static str> {
    Ok(match json {
        serde_json::Value::Null => Value::Nil,
        serde_json::Value::Bool(b) => Value::Bool(b),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => Value::Int(i),
            None => Value::Float(n.as_f64().ok_or("unrepresentable number")?),
        },
        serde_json::Value::String(s) => Value::Str(s.into()),
        serde_json::Value::Array(items) => Value::from(
            items
                .into_iter()
                .map(from_json)
                .collect::<Result<Vec<_>, _>>()?,
        ),
        serde_json::Value::Object(_) => return Err("objects are not policy values"),
    })
}
