//! memtide's policy language: a sandboxed interpreter compatible with oVirt MOM's
//! policy language (see docs/policy-language.md).
//!
//! [`Program::parse`] reads policy sources, [`Program::check`] refuses calls that
//! fail whenever they run (of functions nowhere defined, for one),
//! [`Program::evaluate`] runs them over an [`Input`] snapshot within [`Limits`] and
//! returns the requested [`Controls`];
//! [`ScriptPolicy`] runs a program as one of memtide's policies (and
//! [`ScriptPolicy::parse`] both parses and checks).

mod ast;
mod builtins;
mod check;
mod entities;
mod error;
mod eval;
mod evaluation;
mod input;
mod lexer;
mod limits;
mod ops;
mod parser;
mod policy;
mod pretty;
mod program;
mod scope;
mod value;

pub use ast::{Expr, ExprKind, Loc};
pub use entities::{Entity, GUEST_CONTROLS, GUEST_PROPS, GUEST_STATS, HOST_CONTROLS, HOST_STATS};
pub use error::{ErrorKind, PolicyError};
pub use evaluation::{Controls, Evaluation};
pub use input::{EntityInput, Input, Sample};
pub use limits::Limits;
pub use parser::MAX_NESTING;
pub use policy::{control_value, ScriptPolicy};
pub use pretty::pretty;
pub use program::{Program, Source};
pub use value::{List, Value};
