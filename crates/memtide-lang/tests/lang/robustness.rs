//! Random input never panics, every error points inside the source, and loading's
//! check of calls agrees with the evaluator.

use crate::roundtrip::expr;
use crate::sources;
use memtide_lang::{pretty, ErrorKind, Expr, ExprKind, Input, Limits, PolicyError, Program};
use proptest::prelude::*;

fn snapshot() -> Input {
    crate::input(serde_json::json!({
        "host": {"stats": [{"mem_available": 1000, "mem_free": 300, "ksm_pages_to_scan": 100}]},
        "guests": [
            {"props": {"name": "vm1"}, "stats": [{"balloon_cur": 500, "balloon_max": 600, "mem_unused": 50}]},
            {"props": {"name": "vm2"}, "stats": [{"balloon_cur": 400, "mem_unused": null}]}
        ]
    }))
}

/// Fail unless `error` points at a character of `text` (or just past a line's end).
fn check_location(error: &PolicyError, text: &str) -> Result<(), TestCaseError> {
    let line = text.split('\n').nth(error.line as usize - 1);
    prop_assert!(line.is_some(), "{} beyond the text", error);
    let width = line.unwrap().chars().count() as u32;
    prop_assert!(
        error.column >= 1 && error.column <= width + 1,
        "{} outside its line",
        error
    );
    Ok(())
}

fn run_checked(text: &str) -> Result<(), TestCaseError> {
    let limits = Limits {
        max_steps: 20_000,
        max_depth: 64,
        max_value_size: 4096,
    };
    let program = match Program::parse(&sources(text)) {
        Err(error) => return check_location(&error, text),
        Ok(program) => program,
    };
    let checked = program.check();
    if let Err(error) = &checked {
        check_location(error, text)?;
    }
    match program.evaluate(&snapshot(), &limits) {
        Err(error) => {
            check_location(&error, text)?;
            // A call the evaluator finds unknown is one loading refuses, or one of a
            // function that some `def` defines (later than the call ran).
            if let (ErrorKind::UnknownFunction(name), Ok(())) = (&error.kind, &checked) {
                prop_assert!(defines(program.forms(), name), "{} passed the check", error);
            }
            Ok(())
        }
        Ok(_) => Ok(()),
    }
}

/// Whether some `(def NAME …)` or `(defun NAME …)` is among `forms`, at any depth.
fn defines(forms: &[Expr], name: &str) -> bool {
    forms.iter().any(|form| match &form.kind {
        ExprKind::List(items) => {
            let head = |i: usize| match items.get(i).map(|e| &e.kind) {
                Some(ExprKind::Symbol(s)) => Some(s.as_str()),
                _ => None,
            };
            (matches!(head(0), Some("def" | "defun")) && head(1) == Some(name))
                || defines(items, name)
        }
        ExprKind::Block(items) => defines(items, name),
        _ => false,
    })
}

const WORDS: [&str; 48] = [
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    "(",
    ")",
    "defvar",
    "set",
    "let",
    "def",
    "defun",
    "if",
    "with",
    "and",
    "or",
    "not",
    "min",
    "max",
    "null",
    "valid",
    "abs",
    "int",
    "debug",
    "+",
    "-",
    "*",
    "/",
    "<",
    "<<",
    "==",
    "x",
    "y",
    "f",
    "Host",
    "Guests",
    "guest",
    "Host.mem_free",
    "guest.balloon_cur",
    "(Host.StatAvg \"mem_free\")",
    "(guest.Control \"balloon_target\" 1)",
    "0",
    "-1",
    "2.5",
    "\"s\"",
    "nil",
    "#c\n",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn random_text_never_panics(text in "\\PC{0,200}") {
        run_checked(&text)?;
    }

    #[test]
    fn random_token_soup_never_panics(words in prop::collection::vec(proptest::sample::select(&WORDS[..]), 0..80)) {
        run_checked(&words.join(" "))?;
    }

    #[test]
    fn random_well_formed_programs_never_panic(forms in prop::collection::vec(expr(), 0..4)) {
        run_checked(&pretty(&forms))?;
    }
}
