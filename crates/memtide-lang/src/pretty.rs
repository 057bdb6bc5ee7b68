//! Prints expressions back as source text that parses to the same expressions.

use crate::ast::{Expr, ExprKind};

/// Lines longer than this are broken.
const WIDTH: usize = 80;

/// Source text for `forms`, one per line, long forms broken over indented lines.
///
/// Re-parsing the text gives the same forms (locations aside) for any forms the parser
/// can produce. Not representable, and so not round-tripped: NaN, and strings holding
/// both kinds of quote without a backslash before them.
pub fn pretty(forms: &[Expr]) -> String {
    let mut out = String::new();
    for form in forms {
        write(form, 0, &mut out);
        out.push('\n');
    }
    out
}

/// Write `expr`, whose first character is at column `indent` (from 0).
fn write(expr: &Expr, indent: usize, out: &mut String) {
    let one_line = flat(expr);
    let items = match &expr.kind {
        ExprKind::List(items) | ExprKind::Block(items)
            if !items.is_empty() && indent + one_line.len() > WIDTH =>
        {
            items
        }
        _ => return out.push_str(&one_line),
    };
    let child_indent = indent + 2;
    let newline = |out: &mut String| {
        out.push('\n');
        out.push_str(&" ".repeat(child_indent));
    };
    if let ExprKind::Block(_) = expr.kind {
        out.push('{');
        for item in items {
            newline(out);
            write(item, child_indent, out);
        }
        out.push('\n');
        out.push_str(&" ".repeat(indent));
        out.push('}');
    } else {
        out.push('(');
        write(&items[0], indent + 1, out);
        // A name keeps its first argument on its line when that fits there whole.
        let mut rest = &items[1..];
        if let (ExprKind::Symbol(head), Some(first)) = (&items[0].kind, rest.first()) {
            let column = indent + head.chars().count() + 2;
            let first = flat(first);
            if column + first.len() <= WIDTH {
                out.push(' ');
                out.push_str(&first);
                rest = &rest[1..];
            }
        }
        for item in rest {
            newline(out);
            write(item, child_indent, out);
        }
        out.push(')');
    }
}

/// `expr` on one line.
fn flat(expr: &Expr) -> String {
    match &expr.kind {
        ExprKind::Int(n) => n.to_string(),
        ExprKind::Float(x) if x.is_infinite() => {
            if *x > 0.0 { "1e999" } else { "-1e999" }.to_string()
        }
        ExprKind::Float(x) => format!("{x:?}"),
        ExprKind::Str(s) if holds_unescaped(s, '"') => format!("'{s}'"),
        ExprKind::Str(s) => format!("\"{s}\""),
        ExprKind::Nil => "nil".to_string(),
        ExprKind::Symbol(s) => s.clone(),
        ExprKind::List(items) => {
            format!("({})", items.iter().map(flat).collect::<Vec<_>>().join(" "))
        }
        ExprKind::Block(items) => format!(
            "{{{}}}",
            items.iter().map(flat).collect::<Vec<_>>().join(" ")
        ),
    }
}

/// Whether `s` holds `quote` where it would end a string (not after a backslash).
fn holds_unescaped(s: &str, quote: char) -> bool {
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                chars.next();
            }
            _ if c == quote => return true,
            _ => {}
        }
    }
    false
}
