//! The check made when a policy is loaded: every call names something callable.
//!
//! The evaluator only finds a call of an unknown function when it reaches it, so a
//! misspelt name would pass loading and then fail every cycle. This check walks the
//! forms as the evaluator would, without running them, and refuses a call whose head
//! is no built-in form, function or operator, no entity method (a dotted name) and no
//! function that some `def` or `defun` in the program defines. It is deliberately no
//! stricter than the evaluator:
//!
//! - Definitions count wherever they are, in any file, in any order, nested in a
//!   function body or not: `def` defines a global function when it runs, and a body
//!   may call a function defined further down (or in a later file).
//! - Only expressions the evaluator would evaluate are checked: not parameter lists,
//!   binding names or `let`'s binding pairs, and not the arguments of a form or call
//!   of the wrong shape or arity (the evaluator fails on those before evaluating any
//!   of their arguments, with an error of its own).
//! - Calls in code that may never run (an `if` branch, a function never called) are
//!   checked all the same: that is the point of checking at load.
//!
//! Variables cannot be called: functions live in their own namespace, so `(f)` with
//! `f` only a variable is refused, as the evaluator refuses it.

use crate::ast::{Expr, ExprKind};
use crate::builtins;
use crate::entities;
use crate::error::{ErrorKind, Fault};
use crate::eval::name;
use std::collections::HashMap;

/// Fail at the first call (in source order) of a name that is not callable.
pub(crate) fn check_calls(forms: &[Expr]) -> Result<(), Fault> {
    let mut checker = Checker {
        functions: HashMap::new(),
        collecting: true,
    };
    checker.visit_all(forms)?;
    checker.collecting = false;
    checker.visit_all(forms)
}

struct Checker<'a> {
    /// The names `def`/`defun` forms define, each with the numbers of parameters of
    /// its well-formed definitions (empty when none is well formed).
    functions: HashMap<&'a str, Vec<usize>>,
    /// The first pass only collects definitions and refuses nothing.
    collecting: bool,
}

impl<'a> Checker<'a> {
    fn visit_all(&mut self, exprs: &'a [Expr]) -> Result<(), Fault> {
        exprs.iter().try_for_each(|expr| self.visit(expr))
    }

    fn visit(&mut self, expr: &'a Expr) -> Result<(), Fault> {
        match &expr.kind {
            ExprKind::Block(items) => self.visit_all(items),
            ExprKind::List(items) => match items.split_first() {
                Some((head, args)) => self.call(head, args),
                None => Ok(()),
            },
            _ => Ok(()),
        }
    }

    /// A call, resolved in the evaluator's order (see `Evaluator::call`).
    fn call(&mut self, head: &'a Expr, args: &'a [Expr]) -> Result<(), Fault> {
        // Any other head is an error of its own, before the arguments are evaluated.
        let ExprKind::Symbol(callee) = &head.kind else {
            return Ok(());
        };
        if builtins::FORMS.contains(&callee.as_str()) {
            return self.form(callee, args);
        }
        if let Some((_, method)) = callee.split_once('.') {
            // A method of whatever entity the base names when it runs: the base is not
            // known here. Its arguments are evaluated once the method and its arity are
            // found right.
            return match entities::method_arity(method) {
                Some(arity) if arity == args.len() => self.visit_all(args),
                _ => Ok(()),
            };
        }
        if builtins::is_function(callee) {
            return self.visit_all(args);
        }
        match self.functions.get(callee.as_str()) {
            // The arguments are evaluated when some definition takes that many.
            Some(arities) if self.collecting || arities.contains(&args.len()) => {
                self.visit_all(args)
            }
            Some(_) => Ok(()),
            None if self.collecting => self.visit_all(args),
            None => Err(Fault::at(
                head.loc,
                ErrorKind::UnknownFunction(callee.clone()),
            )),
        }
    }

    /// The forms, shape by shape as the evaluator takes them (see `Evaluator::call_form`).
    fn form(&mut self, form: &str, args: &'a [Expr]) -> Result<(), Fault> {
        match (form, args) {
            ("defvar" | "set" | "setq", [target, value]) if name(target).is_ok() => {
                self.visit(value)
            }
            ("let", [bindings, body @ ..]) => {
                let ExprKind::List(bindings) = &bindings.kind else {
                    return Ok(());
                };
                for binding in bindings {
                    match &binding.kind {
                        ExprKind::List(pair) if pair.len() == 2 && name(&pair[0]).is_ok() => {
                            self.visit(&pair[1])?;
                        }
                        // Evaluation stops at a malformed binding.
                        _ => return Ok(()),
                    }
                }
                self.visit_all(body)
            }
            ("def" | "defun", [function, rest @ ..]) => {
                // A name only some malformed `def` defines is taken as defined: running
                // that `def` fails with an error that says what is wrong with it.
                let ExprKind::Symbol(function_name) = &function.kind else {
                    return Ok(());
                };
                let arity = match rest {
                    [params, body] => definition(function, params).map(|arity| (arity, body)),
                    _ => None,
                };
                if self.collecting {
                    let arities = self.functions.entry(function_name).or_default();
                    arities.extend(arity.map(|(arity, _)| arity));
                }
                match arity {
                    Some((_, body)) => self.visit(body),
                    None => Ok(()),
                }
            }
            ("if", [_, _, _]) | ("debug", _) => self.visit_all(args),
            ("with", [list, item, body]) if name(item).is_ok() => {
                self.visit(list)?;
                self.visit(body)
            }
            _ => Ok(()),
        }
    }
}

/// The number of parameters of `(def FUNCTION PARAMS BODY)`, or `None` when the
/// evaluator refuses the definition (and so never defines FUNCTION with it).
fn definition(function: &Expr, params: &Expr) -> Option<usize> {
    if !name(function).is_ok_and(|function| !builtins::is_builtin(function)) {
        return None;
    }
    let ExprKind::List(params) = &params.kind else {
        return None;
    };
    params
        .iter()
        .all(|param| name(param).is_ok())
        .then_some(params.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lexer::{self, OPERATORS};
    use crate::parser;

    fn check(text: &str) -> Result<(), Fault> {
        check_calls(&lexer::lex(text, 0).and_then(parser::parse).unwrap())
    }

    #[test]
    fn every_built_in_name_is_callable_with_any_arguments() {
        let names = builtins::FORMS
            .iter()
            .chain(&builtins::FUNCTIONS)
            .chain(&OPERATORS);
        for name in names {
            for args in ["", " 1", " x 1", " x () 1", " 1 2 3 4"] {
                let text = format!("({name}{args})");
                assert_eq!(check(&text), Ok(()), "{text}");
            }
        }
    }

    #[test]
    fn every_method_is_callable() {
        for method in ["Stat", "StatAvg", "Prop", "GetControl", "Control"] {
            let args = if method == "Control" { "'k' 1" } else { "'k'" };
            let text = format!("(Host.{method} {args}) (with Guests g (g.{method} {args}))");
            assert!(entities::method_arity(method).is_some());
            assert_eq!(check(&text), Ok(()), "{text}");
        }
    }
}
