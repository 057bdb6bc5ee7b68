//! The evaluator: walks the forms of a program over an input, within limits.

use crate::ast::{Expr, ExprKind, Loc};
use crate::builtins::{self, exactly};
use crate::entities::{self, Entity};
use crate::error::{ErrorKind, Fault};
use crate::evaluation::{Controls, Evaluation};
use crate::input::Input;
use crate::limits::Limits;
use crate::scope::Scopes;
use crate::value::{List, Value};
use std::collections::HashMap;
use std::rc::Rc;

/// A function defined with `def`.
#[derive(Clone)]
struct Function<'a> {
    params: Rc<[&'a str]>,
    body: &'a Expr,
}

/// The state of one evaluation.
struct Evaluator<'a> {
    files: &'a [String],
    input: &'a Input,
    limits: &'a Limits,
    scopes: Scopes<'a>,
    functions: HashMap<&'a str, Function<'a>>,
    /// The value of `Guests`.
    guests: Value,
    controls: Controls,
    debug: Vec<String>,
    steps: u64,
    depth: usize,
}

/// Evaluate `forms` (whose locations index `files`) over `input`. A failure comes
/// with the debug lines recorded before it.
pub(crate) fn evaluate(
    forms: &[Expr],
    files: &[String],
    input: &Input,
    limits: &Limits,
) -> Result<Evaluation, (Fault, Vec<String>)> {
    let guests = input
        .guests
        .iter()
        .enumerate()
        .map(|(index, guest)| {
            Value::Entity(Entity::Guest {
                index,
                name: guest.guest_name(index).into(),
            })
        })
        .collect::<Vec<_>>();
    let mut evaluator = Evaluator {
        files,
        input,
        limits,
        scopes: Scopes::default(),
        functions: HashMap::new(),
        guests: Value::from(guests),
        controls: Controls::default(),
        debug: Vec::new(),
        steps: 0,
        depth: 0,
    };
    let results = forms
        .iter()
        .map(|form| evaluator.eval(form))
        .collect::<Result<_, _>>();
    let results = match results {
        Ok(results) => results,
        Err(fault) => return Err((fault, evaluator.debug)),
    };
    Ok(Evaluation {
        results,
        controls: evaluator.controls,
        debug: evaluator.debug,
    })
}

/// A name in a binding position: a plain symbol other than `Host` and `Guests`.
pub(crate) fn name(expr: &Expr) -> Result<&str, Fault> {
    match &expr.kind {
        ExprKind::Symbol(s) if s == "Host" || s == "Guests" || s.contains('.') => {
            Err(Fault::at(expr.loc, ErrorKind::CannotBind(s.clone())))
        }
        ExprKind::Symbol(s) => Ok(s),
        _ => Err(Fault::at(expr.loc, ErrorKind::Malformed("expected a name"))),
    }
}

/// The name a call's head gives, or why every run of the call fails.
pub(crate) fn callee(head: &Expr) -> Result<&str, Fault> {
    match &head.kind {
        ExprKind::Symbol(callee) => Ok(callee),
        _ => Err(Fault::at(
            head.loc,
            ErrorKind::Malformed("expected a function name"),
        )),
    }
}

/// The bindings of `(let BINDINGS BODY…)`, or why every run of it fails.
pub(crate) fn let_bindings(bindings: &Expr) -> Result<&[Expr], Fault> {
    match &bindings.kind {
        ExprKind::List(bindings) => Ok(bindings),
        _ => Err(Fault::at(
            bindings.loc,
            ErrorKind::Malformed("expected a list of bindings"),
        )),
    }
}

/// One of `let`'s bindings, `(name value)`: its name and the value to evaluate, or why
/// evaluation stops at it.
pub(crate) fn let_binding(binding: &Expr) -> Result<(&str, &Expr), Fault> {
    match &binding.kind {
        ExprKind::List(pair) if pair.len() == 2 => Ok((name(&pair[0])?, &pair[1])),
        _ => Err(Fault::at(
            binding.loc,
            ErrorKind::Malformed("a let binding must be (name value)"),
        )),
    }
}

/// The name and parameters `(def FUNCTION PARAMS BODY)` defines, or why every run of it
/// fails: a name that cannot be bound or is built in, parameters that are no list of
/// names.
pub(crate) fn definition<'a>(
    function: &'a Expr,
    params: &'a Expr,
) -> Result<(&'a str, Rc<[&'a str]>), Fault> {
    let function_name = name(function)?;
    if builtins::is_builtin(function_name) {
        return Err(Fault::at(
            function.loc,
            ErrorKind::Redefine(function_name.to_string()),
        ));
    }
    let ExprKind::List(list) = &params.kind else {
        return Err(Fault::at(
            params.loc,
            ErrorKind::Malformed("expected a list of parameters"),
        ));
    };
    let params: Rc<[&str]> = list.iter().map(name).collect::<Result<_, _>>()?;
    // `(def f (x x) x)` would bind the second argument and drop the first unsaid.
    for (i, param) in list.iter().enumerate().skip(1) {
        if params[..i].contains(&params[i]) {
            return Err(Fault::at(
                param.loc,
                ErrorKind::Malformed("a parameter named twice"),
            ));
        }
    }
    Ok((function_name, params))
}

impl<'a> Evaluator<'a> {
    /// Count `steps` against the budget.
    fn charge(&mut self, steps: u64, loc: Loc) -> Result<(), Fault> {
        self.steps = self.steps.saturating_add(steps);
        if self.steps > self.limits.max_steps {
            return Err(Fault::at(loc, ErrorKind::StepBudget(self.limits.max_steps)));
        }
        Ok(())
    }

    /// Charge for traversing values of total size `size`.
    fn charge_size(&mut self, size: usize, loc: Loc) -> Result<(), Fault> {
        self.charge((size / 64) as u64, loc)
    }

    fn eval(&mut self, expr: &'a Expr) -> Result<Value, Fault> {
        self.charge(1, expr.loc)?;
        if self.depth == self.limits.max_depth {
            return Err(Fault::at(
                expr.loc,
                ErrorKind::DepthLimit(self.limits.max_depth),
            ));
        }
        self.depth += 1;
        let value = match &expr.kind {
            ExprKind::Int(n) => Ok(Value::Int(*n)),
            ExprKind::Float(x) => Ok(Value::Float(*x)),
            ExprKind::Str(s) => Ok(Value::from(s.as_str())),
            ExprKind::Nil => Ok(Value::Nil),
            ExprKind::Symbol(s) => self.lookup(s, expr.loc),
            ExprKind::Block(items) => self.eval_body(items),
            ExprKind::List(items) if items.is_empty() => Ok(Value::from(Vec::new())),
            ExprKind::List(items) => self.call(&items[0], &items[1..], expr.loc),
        };
        self.depth -= 1;
        value
    }

    /// Evaluate `items` in order; the last value, or nil when there is none.
    fn eval_body(&mut self, items: &'a [Expr]) -> Result<Value, Fault> {
        let mut last = Value::Nil;
        for item in items {
            last = self.eval(item)?;
        }
        Ok(last)
    }

    fn eval_args(&mut self, args: &'a [Expr]) -> Result<Vec<Value>, Fault> {
        let mut values = Vec::with_capacity(args.len());
        for arg in args {
            values.push(self.eval(arg)?);
        }
        Ok(values)
    }

    fn lookup(&mut self, symbol: &str, loc: Loc) -> Result<Value, Fault> {
        if let Some((base, field)) = symbol.split_once('.') {
            let entity = self.entity(base, field, loc)?;
            return entity
                .stat(self.input, field)
                .map_err(|kind| Fault::at(loc, kind));
        }
        match symbol {
            "Host" => Ok(Value::Entity(Entity::Host)),
            "Guests" => Ok(self.guests.clone()),
            _ => self
                .scopes
                .get(symbol)
                .cloned()
                .ok_or_else(|| Fault::at(loc, ErrorKind::UnknownSymbol(symbol.to_string()))),
        }
    }

    /// The entity that `base` names, for reading its field or method `member`.
    fn entity(&mut self, base: &str, member: &str, loc: Loc) -> Result<Entity, Fault> {
        match self.lookup(base, loc)? {
            Value::Entity(entity) => Ok(entity),
            other => Err(Fault::at(
                loc,
                ErrorKind::NotAnEntity {
                    name: member.to_string(),
                    got: other.type_name(),
                },
            )),
        }
    }

    fn call(&mut self, head: &'a Expr, args: &'a [Expr], loc: Loc) -> Result<Value, Fault> {
        let callee = callee(head)?;
        if builtins::FORMS.contains(&callee) {
            self.call_form(callee, args, loc)
        } else if callee.contains('.') {
            self.call_method(callee, args, loc)
        } else if builtins::is_function(callee) {
            self.call_builtin(callee, args, loc)
        } else {
            self.call_function(head, callee, args, loc)
        }
    }

    /// The forms that control evaluation or have effects.
    fn call_form(&mut self, form: &str, args: &'a [Expr], loc: Loc) -> Result<Value, Fault> {
        builtins::arity(form, args.len()).map_err(|kind| Fault::at(loc, kind))?;
        match form {
            // `setq` is MOM's alias of `set`.
            "defvar" | "set" | "setq" => self.eval_assignment(form, args),
            "let" => self.eval_let(&args[0], &args[1..]),
            "def" | "defun" => self.define_function(args),
            "if" => {
                let branch = if self.eval(&args[0])?.is_truthy() {
                    &args[1]
                } else {
                    &args[2]
                };
                self.eval(branch)
            }
            "with" => self.eval_with(args, loc),
            _ => self.eval_debug(args, loc),
        }
    }

    /// `(defvar name value)` or `(set name value)`.
    fn eval_assignment(&mut self, form: &str, args: &'a [Expr]) -> Result<Value, Fault> {
        let name = name(&args[0])?;
        let value = self.eval(&args[1])?;
        if form == "defvar" {
            Ok(self.scopes.define(name, value).clone())
        } else if self.scopes.set(name, value.clone()) {
            Ok(value)
        } else {
            Err(Fault::at(
                args[0].loc,
                ErrorKind::UnknownSymbol(name.to_string()),
            ))
        }
    }

    /// A built-in function or operator, charged for the sizes of its values.
    fn call_builtin(&mut self, callee: &str, args: &'a [Expr], loc: Loc) -> Result<Value, Fault> {
        let values = self.eval_args(args)?;
        let result = builtins::apply(callee, &values, self.limits.max_value_size)
            .map_err(|kind| Fault::at(loc, kind))?;
        let size = values.iter().map(Value::size).sum::<usize>() + result.size();
        self.charge_size(size, loc)?;
        self.shallow(result, loc)
    }

    /// `value`, unless it nests lists deeper than the depth limit: a list nested one level
    /// more at each step of a recursion would otherwise be within every other limit and
    /// overflow the stack when shown, compared or dropped.
    fn shallow(&self, value: Value, loc: Loc) -> Result<Value, Fault> {
        match value.depth() > self.limits.max_depth {
            true => Err(Fault::at(loc, ErrorKind::DepthLimit(self.limits.max_depth))),
            false => Ok(value),
        }
    }

    /// A function defined with `def`: its parameters are bound in a new scope.
    fn call_function(
        &mut self,
        head: &Expr,
        callee: &str,
        args: &'a [Expr],
        loc: Loc,
    ) -> Result<Value, Fault> {
        let Some(function) = self.functions.get(callee).cloned() else {
            return Err(Fault::at(
                head.loc,
                ErrorKind::UnknownFunction(callee.to_string()),
            ));
        };
        exactly(callee, args.len(), function.params.len()).map_err(|kind| Fault::at(loc, kind))?;
        // As MOM's call, a `let` of the parameters: each argument is evaluated in the
        // call's scope, after the parameters before it are bound.
        self.scopes.push();
        for (param, arg) in function.params.iter().zip(args) {
            let value = self.eval(arg)?;
            self.scopes.define(param, value);
        }
        let result = self.eval(function.body)?;
        self.scopes.pop();
        Ok(result)
    }

    /// `(let ((name value) …) body…)`: bind sequentially in a new scope.
    fn eval_let(&mut self, bindings: &'a Expr, body: &'a [Expr]) -> Result<Value, Fault> {
        let bindings = let_bindings(bindings)?;
        self.scopes.push();
        for binding in bindings {
            let (name, value) = let_binding(binding)?;
            let value = self.eval(value)?;
            self.scopes.define(name, value);
        }
        let result = self.eval_body(body)?;
        self.scopes.pop();
        Ok(result)
    }

    /// `(def name (params…) body)`: yields the name.
    fn define_function(&mut self, args: &'a [Expr]) -> Result<Value, Fault> {
        let (function_name, params) = definition(&args[0], &args[1])?;
        self.functions.insert(
            function_name,
            Function {
                params,
                body: &args[2],
            },
        );
        Ok(Value::from(function_name))
    }

    /// `(with list name body)`: the list of body's values with name bound to each element.
    fn eval_with(&mut self, args: &'a [Expr], loc: Loc) -> Result<Value, Fault> {
        let name = name(&args[1])?;
        let items = match self.eval(&args[0])? {
            Value::List(list) => list,
            other => {
                return Err(Fault::at(
                    args[0].loc,
                    ErrorKind::TypeMismatch {
                        what: "'with'".into(),
                        expected: "a list",
                        got: other.type_name(),
                    },
                ))
            }
        };
        let mut results = Vec::with_capacity(items.items().len());
        let mut size = 1usize;
        for item in items.items() {
            self.scopes.push();
            self.scopes.define(name, item.clone());
            let result = self.eval(&args[2])?;
            self.scopes.pop();
            size = size.saturating_add(result.size());
            if size > self.limits.max_value_size {
                return Err(Fault::at(
                    loc,
                    ErrorKind::TooLarge(self.limits.max_value_size),
                ));
            }
            results.push(result);
        }
        self.shallow(Value::List(List::new(results)), loc)
    }

    /// `(debug value…)`: record the values, yield the last.
    fn eval_debug(&mut self, args: &'a [Expr], loc: Loc) -> Result<Value, Fault> {
        let values = self.eval_args(args)?;
        let text = values
            .iter()
            .map(Value::to_string)
            .collect::<Vec<_>>()
            .join(" ");
        self.charge_size(text.len(), loc)?;
        let file = self.files.get(loc.file).map_or("", String::as_str);
        self.debug.push(format!("{file}:{}: {text}", loc.line));
        Ok(values.into_iter().last().unwrap_or(Value::Nil))
    }

    /// `(entity.Method args…)`.
    fn call_method(&mut self, callee: &str, args: &'a [Expr], loc: Loc) -> Result<Value, Fault> {
        let (base, method) = callee.split_once('.').unwrap_or((callee, ""));
        let entity = self.entity(base, method, loc)?;
        let Some(expected) = entities::method_arity(method) else {
            return Err(Fault::at(loc, ErrorKind::UnknownMethod(method.to_string())));
        };
        exactly(callee, args.len(), expected).map_err(|kind| Fault::at(loc, kind))?;
        let key = self.eval(&args[0])?;
        let Value::Str(key) = key else {
            let kind = ErrorKind::TypeMismatch {
                what: format!("'{callee}'"),
                expected: "a string",
                got: key.type_name(),
            };
            return Err(Fault::at(args[0].loc, kind));
        };
        let at_key = |kind| Fault::at(args[0].loc, kind);
        if matches!(method, "Control" | "GetControl") && !entity.controls().contains(&&*key) {
            return Err(at_key(ErrorKind::UnknownControl(key.to_string())));
        }
        match method {
            "Stat" => entity.stat(self.input, &key).map_err(at_key),
            "StatAvg" => entity.stat_avg(self.input, &key).map_err(at_key),
            "Prop" => entity.prop(self.input, &key).map_err(at_key),
            "GetControl" => {
                let controls = match &entity {
                    Entity::Host => Some(&self.controls.host),
                    Entity::Guest { name, .. } => self.controls.guests.get(&**name),
                };
                Ok(controls
                    .and_then(|c| c.get(&*key))
                    .cloned()
                    .unwrap_or(Value::Nil))
            }
            _ => {
                let value = match self.eval(&args[1])? {
                    Value::Bool(b) => Value::Int(i64::from(b)),
                    number @ (Value::Int(_) | Value::Float(_)) => number,
                    other => {
                        let kind = ErrorKind::TypeMismatch {
                            what: format!("control '{key}'"),
                            expected: "a number",
                            got: other.type_name(),
                        };
                        return Err(Fault::at(args[1].loc, kind));
                    }
                };
                let controls = match &entity {
                    Entity::Host => &mut self.controls.host,
                    Entity::Guest { name, .. } => {
                        self.controls.guests.entry(name.to_string()).or_default()
                    }
                };
                controls.insert(key.to_string(), value);
                // MOM's Control returns nothing.
                Ok(Value::Nil)
            }
        }
    }
}
