//! Builds expressions from tokens, with bounded nesting.

use crate::ast::{Expr, ExprKind, Loc};
use crate::error::{ErrorKind, Fault};
use crate::lexer::Token;

/// The deepest bracket nesting the parser accepts.
pub const MAX_NESTING: usize = 100;

/// An open bracket waiting for its closing one.
struct Open {
    bracket: char,
    loc: Loc,
    items: Vec<Expr>,
}

/// Parse tokens into top-level forms. Works with an explicit stack, so hostile
/// nesting cannot exhaust the Rust stack.
pub(crate) fn parse(tokens: Vec<(Token, Loc)>) -> Result<Vec<Expr>, Fault> {
    let mut forms = Vec::new();
    let mut open: Vec<Open> = Vec::new();
    for (token, loc) in tokens {
        let leaf = |kind| Expr { kind, loc };
        let expr = match token {
            Token::Open(bracket) => {
                if open.len() == MAX_NESTING {
                    return Err(Fault::at(loc, ErrorKind::TooDeep(MAX_NESTING)));
                }
                open.push(Open {
                    bracket,
                    loc,
                    items: Vec::new(),
                });
                continue;
            }
            Token::Close(close) => {
                let Some(list) = open.pop() else {
                    return Err(Fault::at(loc, ErrorKind::UnexpectedClose(close)));
                };
                if closing(list.bracket) != close {
                    return Err(Fault::at(
                        loc,
                        ErrorKind::Mismatched {
                            open: list.bracket,
                            close,
                        },
                    ));
                }
                let kind = if list.bracket == '{' {
                    ExprKind::Block(list.items)
                } else {
                    ExprKind::List(list.items)
                };
                Expr {
                    kind,
                    loc: list.loc,
                }
            }
            Token::Int(n) => leaf(ExprKind::Int(n)),
            Token::Float(x) => leaf(ExprKind::Float(x)),
            Token::Str(s) => leaf(ExprKind::Str(s)),
            Token::Symbol(s) if s == "nil" => leaf(ExprKind::Nil),
            Token::Symbol(s) => leaf(ExprKind::Symbol(s)),
        };
        match open.last_mut() {
            Some(parent) => parent.items.push(expr),
            None => forms.push(expr),
        }
    }
    match open.pop() {
        Some(list) => Err(Fault::at(list.loc, ErrorKind::Unclosed(list.bracket))),
        None => Ok(forms),
    }
}

fn closing(open: char) -> char {
    match open {
        '(' => ')',
        '[' => ']',
        _ => '}',
    }
}
