//! Variables, scoped dynamically: a function sees the variables of its callers.

use crate::value::Value;
use std::collections::HashMap;

/// The global scope and a stack of local scopes (from `let`, `with` and function calls).
#[derive(Default)]
pub(crate) struct Scopes<'a> {
    globals: HashMap<&'a str, Value>,
    /// Local bindings, innermost last.
    locals: Vec<(&'a str, Value)>,
    /// Where each local scope starts in `locals`.
    frames: Vec<usize>,
}

impl<'a> Scopes<'a> {
    /// Open a local scope.
    pub fn push(&mut self) {
        self.frames.push(self.locals.len());
    }

    /// Close the innermost local scope.
    pub fn pop(&mut self) {
        let start = self.frames.pop().unwrap_or(0);
        self.locals.truncate(start);
    }

    /// Bind `name` in the current scope (the innermost local one, else the global one)
    /// unless it has a binding there already, which is kept, as MOM's `defvar`, `let`,
    /// `with` and parameters do (its variable stack's `setdefault`); yields the value
    /// `name` has there now.
    pub fn define(&mut self, name: &'a str, value: Value) -> &Value {
        let Some(&start) = self.frames.last() else {
            return self.globals.entry(name).or_insert(value);
        };
        let at = match self.locals[start..].iter().position(|(n, _)| *n == name) {
            Some(at) => start + at,
            None => {
                self.locals.push((name, value));
                self.locals.len() - 1
            }
        };
        &self.locals[at].1
    }

    /// The value of the innermost binding of `name`.
    pub fn get(&self, name: &str) -> Option<&Value> {
        match self.locals.iter().rev().find(|(n, _)| *n == name) {
            Some((_, value)) => Some(value),
            None => self.globals.get(name),
        }
    }

    /// Assign to the innermost binding of `name`; false when there is none.
    pub fn set(&mut self, name: &str, value: Value) -> bool {
        let slot = match self.locals.iter_mut().rev().find(|(n, _)| *n == name) {
            Some((_, slot)) => Some(slot),
            None => self.globals.get_mut(name),
        };
        slot.map(|slot| *slot = value).is_some()
    }
}
