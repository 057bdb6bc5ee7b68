//! Turns source text into tokens.

use crate::ast::Loc;
use crate::error::{ErrorKind, Fault};

/// The operators, which are read as symbols.
pub(crate) const OPERATORS: [&str; 12] = [
    "+", "-", "*", "/", "<", ">", "<=", ">=", "==", "!=", "<<", ">>",
];

/// A token of the language.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Token {
    /// `(`, `[` or `{`.
    Open(char),
    /// `)`, `]` or `}`.
    Close(char),
    Int(i64),
    Float(f64),
    Str(String),
    /// A name or an operator.
    Symbol(String),
}

/// Split `text`, the source file numbered `file`, into located tokens.
pub(crate) fn lex(text: &str, file: usize) -> Result<Vec<(Token, Loc)>, Fault> {
    let mut cursor = Cursor {
        chars: text.chars().collect(),
        pos: 0,
        loc: Loc {
            file,
            line: 1,
            column: 1,
        },
    };
    let mut tokens = Vec::new();
    while let Some(c) = cursor.peek(0) {
        let loc = cursor.loc;
        if c.is_whitespace() {
            cursor.bump();
        } else if c == '#' {
            while cursor.peek(0).is_some_and(|c| c != '\n') {
                cursor.bump();
            }
        } else if matches!(c, '(' | '[' | '{') {
            cursor.bump();
            tokens.push((Token::Open(c), loc));
        } else if matches!(c, ')' | ']' | '}') {
            cursor.bump();
            tokens.push((Token::Close(c), loc));
        } else if c == '"' || c == '\'' {
            tokens.push((cursor.string(c)?, loc));
        } else {
            let word = cursor.word();
            tokens.push((classify(&word, loc)?, loc));
        }
    }
    Ok(tokens)
}

fn is_separator(c: char) -> bool {
    c.is_whitespace() || matches!(c, '(' | ')' | '[' | ']' | '{' | '}' | '#')
}

struct Cursor {
    chars: Vec<char>,
    pos: usize,
    loc: Loc,
}

impl Cursor {
    fn peek(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.pos + ahead).copied()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek(0)?;
        self.pos += 1;
        if c == '\n' {
            self.loc.line += 1;
            self.loc.column = 1;
        } else {
            self.loc.column += 1;
        }
        Some(c)
    }

    /// A string opened by `quote` at the cursor; a separator must follow it. As in MOM,
    /// a backslash keeps the character after it (a quote included) from ending the
    /// string, and both stay in the value: `"a\"b"` is the four characters `a\"b`.
    fn string(&mut self, quote: char) -> Result<Token, Fault> {
        let start = self.loc;
        self.bump();
        let mut text = String::new();
        loop {
            match self.bump() {
                None => return Err(Fault::at(start, ErrorKind::UnterminatedString)),
                Some(c) if c == quote => break,
                Some('\\') => {
                    text.push('\\');
                    match self.bump() {
                        None => return Err(Fault::at(start, ErrorKind::UnterminatedString)),
                        Some(c) => text.push(c),
                    }
                }
                Some(c) => text.push(c),
            }
        }
        match self.peek(0) {
            Some(c) if !is_separator(c) => Err(Fault::at(self.loc, ErrorKind::UnexpectedChar(c))),
            _ => Ok(Token::Str(text)),
        }
    }

    /// The characters up to the next separator.
    fn word(&mut self) -> String {
        let mut word = String::new();
        while let Some(c) = self.peek(0).filter(|&c| !is_separator(c)) {
            word.push(c);
            self.bump();
        }
        word
    }
}

/// Read a word (which holds no line break) starting at `loc` as a number, symbol or operator.
fn classify(word: &str, loc: Loc) -> Result<Token, Fault> {
    let chars: Vec<char> = word.chars().collect();
    let digit_at = |i: usize| chars.get(i).is_some_and(char::is_ascii_digit);
    let first = chars[0];
    if first.is_ascii_alphabetic() || first == '_' {
        let bad = chars
            .iter()
            .position(|&c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')));
        return match bad {
            Some(i) => {
                let at = Loc {
                    column: loc.column + i as u32,
                    ..loc
                };
                Err(Fault::at(at, ErrorKind::UnexpectedChar(chars[i])))
            }
            None => Ok(Token::Symbol(word.to_string())),
        };
    }
    let body = usize::from(first == '-');
    if digit_at(body) || (chars.get(body) == Some(&'.') && digit_at(body + 1)) {
        return number(word).map_err(|kind| Fault::at(loc, kind));
    }
    if "+-*/<>=!".contains(first) {
        return if OPERATORS.contains(&word) {
            Ok(Token::Symbol(word.to_string()))
        } else {
            Err(Fault::at(loc, ErrorKind::UnknownOperator(word.to_string())))
        };
    }
    Err(Fault::at(loc, ErrorKind::UnexpectedChar(first)))
}

/// Parse a numeric literal: decimal integer (without leading zeros, which MOM before
/// 2019 read as octal), float, `0x` hex or `0o` octal, with an optional leading `-`.
fn number(word: &str) -> Result<Token, ErrorKind> {
    let malformed = || ErrorKind::MalformedNumber(word.to_string());
    let out_of_range = || ErrorKind::IntegerOutOfRange(word.to_string());
    let (negative, body) = match word.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, word),
    };
    let radix = match body.get(..2) {
        Some("0x" | "0X") => Some(16),
        Some("0o" | "0O") => Some(8),
        _ => None,
    };
    if let Some(radix) = radix {
        let digits = &body[2..];
        if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
            return Err(malformed());
        }
        let magnitude = i128::from(u64::from_str_radix(digits, radix).map_err(|_| out_of_range())?);
        let value = if negative { -magnitude } else { magnitude };
        return i64::try_from(value)
            .map(Token::Int)
            .map_err(|_| out_of_range());
    }
    let bytes = body.as_bytes();
    let digits_from = |mut i: usize| {
        while bytes.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        i
    };
    let mut end = digits_from(0);
    let mut is_float = false;
    // MOM before 2019 read digits after a leading 0 as an octal integer, also before an
    // exponent (`010e2` was 8 then the name `e2`), and fails on them now: refused unless
    // a fraction follows (`010.5`).
    let octal = end > 1 && bytes[0] == b'0' && bytes.get(end) != Some(&b'.');
    if bytes.get(end) == Some(&b'.') {
        is_float = true;
        end = digits_from(end + 1);
    }
    if matches!(bytes.get(end), Some(b'e' | b'E')) {
        is_float = true;
        let sign = usize::from(matches!(bytes.get(end + 1), Some(b'+' | b'-')));
        let exponent_end = digits_from(end + 1 + sign);
        if exponent_end == end + 1 + sign {
            return Err(malformed());
        }
        end = exponent_end;
    }
    if end != bytes.len() {
        return Err(malformed());
    }
    if octal {
        Err(ErrorKind::LeadingZero(word.to_string()))
    } else if is_float {
        word.parse().map(Token::Float).map_err(|_| malformed())
    } else {
        word.parse().map(Token::Int).map_err(|_| out_of_range())
    }
}
