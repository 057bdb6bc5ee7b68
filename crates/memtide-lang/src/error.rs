//! Policy errors: what went wrong and where.

use crate::ast::Loc;
use crate::program::Source;
use thiserror::Error;

/// What went wrong, without the position.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ErrorKind {
    /// A character that cannot start or continue a token.
    #[error("unexpected character {}", shown(*.0))]
    UnexpectedChar(char),
    /// A run of operator characters that is not an operator.
    #[error("unknown operator '{0}'")]
    UnknownOperator(String),
    /// A word that starts like a number but is not one.
    #[error("malformed number '{0}'")]
    MalformedNumber(String),
    /// A decimal integer literal with a leading zero, which MOM before 2019 read as octal.
    #[error(
        "integer literal '{0}' has a leading zero: MOM before 2019 read it as octal, MOM \
         now fails on it, memtide refuses it (write it without the zero, or 0o… for octal)"
    )]
    LeadingZero(String),
    /// An integer literal that does not fit in 64 bits.
    #[error("integer literal '{0}' out of range")]
    IntegerOutOfRange(String),
    /// A string whose closing quote is missing.
    #[error("unterminated string")]
    UnterminatedString,
    /// An opening bracket whose closing bracket is missing.
    #[error("unclosed '{0}'")]
    Unclosed(char),
    /// A closing bracket with nothing open.
    #[error("unexpected '{0}'")]
    UnexpectedClose(char),
    /// A closing bracket of another kind than the open one.
    #[error("'{close}' does not match '{open}'")]
    Mismatched {
        /// The open bracket.
        open: char,
        /// The closing bracket found.
        close: char,
    },
    /// Brackets nested deeper than the parser accepts.
    #[error("nesting deeper than {0} levels")]
    TooDeep(usize),
    /// A form whose shape is wrong; the text says what was expected.
    #[error("{0}")]
    Malformed(&'static str),
    /// A name that is not bound.
    #[error("unknown symbol '{0}'")]
    UnknownSymbol(String),
    /// A call of a name that is neither a built-in nor a defined function.
    #[error("unknown function '{0}'")]
    UnknownFunction(String),
    /// An entity method that does not exist.
    #[error("unknown method '{0}'")]
    UnknownMethod(String),
    /// An entity field that is neither documented nor in the input.
    #[error("unknown field '{0}'")]
    UnknownField(String),
    /// An entity property that is neither documented nor in the input.
    #[error("unknown property '{0}'")]
    UnknownProperty(String),
    /// A control that the entity does not have.
    #[error("unknown control '{0}'")]
    UnknownControl(String),
    /// A name that a policy may not bind.
    #[error("cannot bind '{0}'")]
    CannotBind(String),
    /// A `def` of a built-in name.
    #[error("cannot redefine built-in '{0}'")]
    Redefine(String),
    /// A call with the wrong number of arguments.
    #[error("'{name}' takes {expected} {}, got {got}", arguments(.expected))]
    Arity {
        /// The called name.
        name: String,
        /// The number it takes.
        expected: usize,
        /// The number given.
        got: usize,
    },
    /// A call of a function whose definitions take different numbers of arguments,
    /// none of them the number given.
    #[error("'{name}' takes {} arguments (as defined in different places), got {got}", one_of(.expected))]
    ArityOneOf {
        /// The called name.
        name: String,
        /// The numbers its definitions take.
        expected: Vec<usize>,
        /// The number given.
        got: usize,
    },
    /// A call with too few arguments.
    #[error("'{name}' takes at least {min} {}, got {got}", arguments(.min))]
    ArityAtLeast {
        /// The called name.
        name: String,
        /// The least number it takes.
        min: usize,
        /// The number given.
        got: usize,
    },
    /// A value of the wrong type.
    #[error("{what} needs {expected}, got {got}")]
    TypeMismatch {
        /// What needed it (a quoted name, or a description).
        what: String,
        /// The type it needs, with its article.
        expected: &'static str,
        /// The type of the value given.
        got: &'static str,
    },
    /// An operator applied to values it does not combine.
    #[error("unsupported operand types for {op}: {left} and {right}")]
    Operands {
        /// The operator.
        op: String,
        /// Type of the left operand.
        left: &'static str,
        /// Type of the right operand.
        right: &'static str,
    },
    /// An ordering comparison between values that have no order.
    #[error("cannot compare {0} and {1}")]
    Incomparable(&'static str, &'static str),
    /// A field or method used on something that is not an entity.
    #[error("cannot read '{name}' of {got}")]
    NotAnEntity {
        /// The field or method name.
        name: String,
        /// The type of the value.
        got: &'static str,
    },
    /// `StatAvg` of an entity with no sample.
    #[error("statistic '{0}' not available: no samples")]
    NoSamples(String),
    /// Division by zero.
    #[error("division by zero")]
    DivisionByZero,
    /// An integer result that does not fit in 64 bits.
    #[error("integer overflow")]
    IntegerOverflow,
    /// A shift by a negative count.
    #[error("negative shift count")]
    NegativeShift,
    /// A float (infinite or not a number) that has no integer value.
    #[error("cannot convert {0} to an integer")]
    NotConvertible(String),
    /// A string or list larger than the size limit.
    #[error("value larger than the size limit of {0}")]
    TooLarge(usize),
    /// The evaluation took more steps than its budget.
    #[error("step budget of {0} exhausted")]
    StepBudget(u64),
    /// The evaluation nested deeper than its limit.
    #[error("depth limit of {0} exceeded")]
    DepthLimit(usize),
}

/// `'c'`, or `U+XXXX` for a character that does not show.
fn shown(c: char) -> String {
    let invisible = c.is_control()
        || matches!(c, '\u{ad}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}')
        || matches!(c, '\u{2060}'..='\u{2064}' | '\u{feff}');
    match c {
        '\u{feff}' => "U+FEFF (byte order mark: save the file without it)".to_string(),
        _ if invisible => format!("U+{:04X}", u32::from(c)),
        _ => format!("'{c}'"),
    }
}

fn arguments(n: &usize) -> &'static str {
    if *n == 1 {
        "argument"
    } else {
        "arguments"
    }
}

/// `1, 2 or 3`.
fn one_of(numbers: &[usize]) -> String {
    let words: Vec<String> = numbers.iter().map(usize::to_string).collect();
    match words.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// An error in a policy, located in its source.
#[derive(Debug, Clone, PartialEq, Error)]
#[error("{file}:{line}:{column}: {kind}")]
pub struct PolicyError {
    /// What went wrong.
    pub kind: ErrorKind,
    /// The source file's name.
    pub file: String,
    /// Line number, from 1.
    pub line: u32,
    /// Column number in characters, from 1.
    pub column: u32,
    /// The lines `debug` recorded before an evaluation failed (see
    /// [`crate::Evaluation::debug`]); empty for a parse or load error.
    pub debug: Vec<String>,
}

impl PolicyError {
    /// The message without the position.
    pub fn message(&self) -> String {
        self.kind.to_string()
    }

    /// `file:line:col: message`, then the offending source line and a caret under the
    /// column (the line is left out when `sources` has no such file or line).
    pub fn render(&self, sources: &[Source]) -> String {
        let mut out = self.to_string();
        let text = sources
            .iter()
            .find(|s| s.name == self.file)
            .map(|s| s.text.as_str());
        let line = text.and_then(|t| t.split('\n').nth(self.line.saturating_sub(1) as usize));
        if let Some(line) = line {
            let line = line.strip_suffix('\r').unwrap_or(line);
            let pad: String = line
                .chars()
                .take(self.column.saturating_sub(1) as usize)
                .map(|c| if c == '\t' { '\t' } else { ' ' })
                .collect();
            out.push('\n');
            out.push_str(line);
            out.push('\n');
            out.push_str(&pad);
            out.push('^');
        }
        out
    }

    /// `{"error": {"message": …, "file": …, "line": …, "column": …}}`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"error": {
            "message": self.message(),
            "file": self.file,
            "line": self.line,
            "column": self.column,
        }})
    }
}

/// An error with its position as an index into the program's files.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Fault {
    pub kind: ErrorKind,
    pub loc: Loc,
}

impl Fault {
    /// An error of `kind` at `loc`.
    pub fn at(loc: Loc, kind: ErrorKind) -> Fault {
        Fault { kind, loc }
    }

    /// Name the file, given the program's file names.
    pub fn into_policy_error(self, files: &[String]) -> PolicyError {
        PolicyError {
            kind: self.kind,
            file: files.get(self.loc.file).cloned().unwrap_or_default(),
            line: self.loc.line,
            column: self.loc.column,
            debug: Vec::new(),
        }
    }
}
