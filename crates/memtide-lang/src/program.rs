//! A parsed program: the entry points of the library.

use crate::ast::Expr;
use crate::error::PolicyError;
use crate::evaluation::Evaluation;
use crate::input::Input;
use crate::limits::Limits;
use crate::{check, eval, lexer, parser};

/// A named policy text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// The name errors show (usually the file name).
    pub name: String,
    /// The policy text.
    pub text: String,
}

impl Source {
    /// A source named `name` holding `text`.
    pub fn new(name: impl Into<String>, text: impl Into<String>) -> Source {
        Source {
            name: name.into(),
            text: text.into(),
        }
    }
}

/// The forms of one or more sources, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Program {
    files: Vec<String>,
    forms: Vec<Expr>,
}

impl Program {
    /// Parse `sources`, concatenated in the order given. This checks the syntax only;
    /// see [`Program::check`].
    pub fn parse(sources: &[Source]) -> Result<Program, PolicyError> {
        let files: Vec<String> = sources.iter().map(|s| s.name.clone()).collect();
        let mut forms = Vec::new();
        for (index, source) in sources.iter().enumerate() {
            let parsed = lexer::lex(&source.text, index).and_then(parser::parse);
            forms.extend(parsed.map_err(|fault| fault.into_policy_error(&files))?);
        }
        Ok(Program { files, forms })
    }

    /// Check every call that fails whenever it runs, as loading a policy does beyond
    /// [`Program::parse`]: a call of a name that is no built-in form, function or
    /// operator, no entity method (`X.Method`) and no function that a `def` or `defun`
    /// anywhere in the sources defines (before or after the call, in any file); a
    /// method no entity has; `Control`/`GetControl` of a literal control name that the
    /// receiver cannot have; a number of arguments the callee never takes. Fails at the
    /// first, in source order. It refuses no call that could run without such an
    /// error, but it does check calls that may never run (in an `if` branch, or a
    /// function never called).
    pub fn check(&self) -> Result<(), PolicyError> {
        check::check_calls(&self.forms).map_err(|fault| fault.into_policy_error(&self.files))
    }

    /// Evaluate the program over `input`. Pure: the only effects are in the result. An
    /// error carries the debug lines recorded before it ([`PolicyError::debug`]).
    pub fn evaluate(&self, input: &Input, limits: &Limits) -> Result<Evaluation, PolicyError> {
        eval::evaluate(&self.forms, &self.files, input, limits).map_err(|(fault, debug)| {
            PolicyError {
                debug,
                ..fault.into_policy_error(&self.files)
            }
        })
    }

    /// The top-level forms, in order.
    pub fn forms(&self) -> &[Expr] {
        &self.forms
    }

    /// The source names, indexed by [`crate::Loc::file`].
    pub fn files(&self) -> &[String] {
        &self.files
    }
}
