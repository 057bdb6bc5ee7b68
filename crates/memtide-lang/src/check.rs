//! The check made when a policy is loaded: every call could run.
//!
//! The evaluator only finds a bad call when it reaches it, so a misspelt name would
//! pass loading and then fail every cycle. This check walks the forms as the evaluator
//! would, without running them, and refuses a call that fails whenever it runs:
//!
//! - a head that is no built-in form, function or operator, no entity method (a
//!   dotted name) and no function that some `def` or `defun` in the program defines;
//! - a dotted head whose method (the part after the first dot) is no entity method,
//!   whatever the entity: the receiver may be any variable bound to one;
//! - `Control` or `GetControl` of a literal control name that no entity has, or that
//!   the host has not when the receiver is `Host` itself (which cannot be rebound);
//! - a built-in form, function, operator or method given a number of arguments it
//!   never takes, and a defined function given a number that none of its well-formed
//!   definitions takes;
//! - a form of a shape the evaluator refuses before it evaluates anything in it, with
//!   the evaluator's error: a head that is no name (`((f) 1)`), a `def`/`defun` of a
//!   built-in's name or without a list of parameter names, a `defvar`/`set`/`setq`/`with`
//!   whose name is none, a `let` without a list of `(name value)` bindings.
//!
//! It is deliberately no stricter than the evaluator:
//!
//! - Definitions count wherever they are, in any file, in any order, nested in a
//!   function body or not: `def` defines a global function when it runs, and a body
//!   may call a function defined further down (or in a later file).
//! - Only expressions the evaluator would evaluate are looked into for calls: not
//!   parameter lists or binding names, and nothing after a shape it refuses.
//! - Calls in code that may never run (an `if` branch, a function never called) are
//!   checked all the same: that is the point of checking at load.
//!
//! Variables cannot be called: functions live in their own namespace, so `(f)` with
//! `f` only a variable is refused, as the evaluator refuses it.

use crate::ast::{Expr, ExprKind, Loc};
use crate::builtins::{self, exactly};
use crate::entities::{self, GUEST_CONTROLS, HOST_CONTROLS};
use crate::error::{ErrorKind, Fault};
use crate::eval::{self, name};
use std::collections::HashMap;

/// Fail at the first bad call (in source order).
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
                Some((head, args)) => self.call(head, args, expr.loc),
                None => Ok(()),
            },
            _ => Ok(()),
        }
    }

    /// Refuse with `fault`; the first pass goes on without looking further into the call.
    fn refuse(&self, fault: Fault) -> Result<(), Fault> {
        if self.collecting {
            Ok(())
        } else {
            Err(fault)
        }
    }

    /// A call at `loc`, resolved in the evaluator's order (see `Evaluator::call`), its
    /// errors located where the evaluator locates them.
    fn call(&mut self, head: &'a Expr, args: &'a [Expr], loc: Loc) -> Result<(), Fault> {
        // Any other head fails before the arguments are evaluated.
        let callee = match eval::callee(head) {
            Ok(callee) => callee,
            Err(fault) => return self.refuse(fault),
        };
        if builtins::is_builtin(callee) {
            if let Err(kind) = builtins::arity(callee, args.len()) {
                return self.refuse(Fault::at(loc, kind));
            }
            return match builtins::FORMS.contains(&callee) {
                true => self.form(callee, args),
                false => self.visit_all(args),
            };
        }
        if let Some((base, method)) = callee.split_once('.') {
            return self.method(callee, base, method, args, loc);
        }
        match self.functions.get(callee) {
            // Definitions further down may take this many: the first pass looks on.
            _ if self.collecting => self.visit_all(args),
            None => Err(Fault::at(
                head.loc,
                ErrorKind::UnknownFunction(callee.to_string()),
            )),
            // Only malformed definitions: each is refused where it stands.
            Some(arities) if arities.is_empty() || arities.contains(&args.len()) => {
                self.visit_all(args)
            }
            Some(arities) => {
                let kind = match arities[..] {
                    [expected] => ErrorKind::Arity {
                        name: callee.to_string(),
                        expected,
                        got: args.len(),
                    },
                    _ => ErrorKind::ArityOneOf {
                        name: callee.to_string(),
                        expected: arities.clone(),
                        got: args.len(),
                    },
                };
                self.refuse(Fault::at(loc, kind))
            }
        }
    }

    /// `(BASE.METHOD args…)`: the entity BASE names is not known here, but the method,
    /// its arity and a literal control name are.
    fn method(
        &mut self,
        callee: &str,
        base: &str,
        method: &str,
        args: &'a [Expr],
        loc: Loc,
    ) -> Result<(), Fault> {
        let Some(arity) = entities::method_arity(method) else {
            return self.refuse(Fault::at(loc, ErrorKind::UnknownMethod(method.into())));
        };
        if let Err(kind) = exactly(callee, args.len(), arity) {
            return self.refuse(Fault::at(loc, kind));
        }
        if let ("Control" | "GetControl", ExprKind::Str(control)) = (method, &args[0].kind) {
            let host = HOST_CONTROLS.contains(&control.as_str());
            let known = host || (base != "Host" && GUEST_CONTROLS.contains(&control.as_str()));
            if !known {
                let kind = ErrorKind::UnknownControl(control.clone());
                return self.refuse(Fault::at(args[0].loc, kind));
            }
        }
        self.visit_all(args)
    }

    /// The forms, shape by shape as the evaluator takes them (see `Evaluator::call_form`),
    /// once their arity is known right: a shape the evaluator refuses is refused with its
    /// error, and what it would not evaluate after it is not looked into.
    fn form(&mut self, form: &str, args: &'a [Expr]) -> Result<(), Fault> {
        match (form, args) {
            ("defvar" | "set" | "setq", [target, value]) => match name(target) {
                Ok(_) => self.visit(value),
                Err(fault) => self.refuse(fault),
            },
            ("let", [bindings, body @ ..]) => {
                let bindings = match eval::let_bindings(bindings) {
                    Ok(bindings) => bindings,
                    Err(fault) => return self.refuse(fault),
                };
                for binding in bindings {
                    match eval::let_binding(binding) {
                        Ok((_, value)) => self.visit(value)?,
                        Err(fault) => return self.refuse(fault),
                    }
                }
                self.visit_all(body)
            }
            ("def" | "defun", [function, params, body]) => {
                // A malformed definition fails whenever it runs, with the evaluator's
                // error; the first pass takes the name it gives as defined (with no
                // arity), so that its calls are not refused before it is.
                let defined = eval::definition(function, params);
                if self.collecting {
                    if let ExprKind::Symbol(function_name) = &function.kind {
                        let arities = self.functions.entry(function_name).or_default();
                        let arity = defined.as_ref().ok().map(|(_, params)| params.len());
                        if let Some(arity) = arity.filter(|arity| !arities.contains(arity)) {
                            arities.push(arity);
                        }
                    }
                }
                match defined {
                    Ok(_) => self.visit(body),
                    Err(fault) => self.refuse(fault),
                }
            }
            ("if" | "debug", _) => self.visit_all(args),
            ("with", [list, item, body]) => match name(item) {
                Ok(_) => {
                    self.visit(list)?;
                    self.visit(body)
                }
                Err(fault) => self.refuse(fault),
            },
            _ => Ok(()),
        }
    }
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
    fn every_built_in_name_is_checked_as_the_evaluator_checks_its_arity() {
        let names = builtins::FORMS
            .iter()
            .chain(&builtins::FUNCTIONS)
            .chain(&OPERATORS);
        for name in names {
            for args in ["", " 1", " x 1", " x () 1", " 1 2 3 4"] {
                let text = format!("({name}{args})");
                let count = args.split_whitespace().count();
                match builtins::arity(name, count) {
                    Err(kind) => {
                        let at = Loc {
                            file: 0,
                            line: 1,
                            column: 1,
                        };
                        assert_eq!(check(&text), Err(Fault::at(at, kind)), "{text}");
                    }
                    // Right in number, only a form's shape may still be refused.
                    Ok(()) => assert!(
                        matches!(
                            check(&text),
                            Ok(())
                                | Err(Fault {
                                    kind: ErrorKind::Malformed(_),
                                    ..
                                })
                        ),
                        "{text}: {:?}",
                        check(&text)
                    ),
                }
            }
        }
    }

    #[test]
    fn every_method_is_callable() {
        for method in ["Stat", "StatAvg", "Prop", "GetControl", "Control"] {
            let args = |control| match method {
                "Control" => format!("'{control}' 1"),
                _ => format!("'{control}'"),
            };
            let text = format!(
                "(Host.{method} {}) (with Guests g (g.{method} {}))",
                args("ksm_run"),
                args("balloon_target")
            );
            assert!(entities::method_arity(method).is_some());
            assert_eq!(check(&text), Ok(()), "{text}");
        }
    }
}
