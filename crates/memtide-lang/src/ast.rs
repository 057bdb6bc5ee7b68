//! The syntax tree: source positions and the expressions a program is made of.

/// A position in the program's sources (all numbers 1-based except `file`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Loc {
    /// Index of the source file in the list given to [`crate::Program::parse`].
    pub file: usize,
    /// Line number, counting from 1.
    pub line: u32,
    /// Column number in characters, counting from 1.
    pub column: u32,
}

/// An expression with the position of its first character.
#[derive(Debug, Clone, PartialEq)]
pub struct Expr {
    /// What the expression is.
    pub kind: ExprKind,
    /// Where it starts.
    pub loc: Loc,
}

/// The kinds of expression.
#[derive(Debug, Clone, PartialEq)]
pub enum ExprKind {
    /// An integer literal.
    Int(i64),
    /// A floating-point literal.
    Float(f64),
    /// A string literal (the raw text between the quotes).
    Str(String),
    /// The `nil` literal.
    Nil,
    /// A name or operator, possibly dotted (`guest.balloon_cur`).
    Symbol(String),
    /// `( … )` or `[ … ]`: a call, or the empty list when it has no elements.
    List(Vec<Expr>),
    /// `{ … }`: its elements are evaluated in order and the last one is the result.
    Block(Vec<Expr>),
}
