//! Every kind of error, with its exact message and location, and how errors render.

use crate::{eval_with, sources};
use memtide_lang::{ErrorKind, Input, Limits, PolicyError, Program, Source, Value, MAX_NESTING};

fn fail(text: &str, limits: &Limits) -> PolicyError {
    let input: Input = crate::input(serde_json::json!({"guests": [{"props": {"name": "vm1"}}]}));
    match eval_with(text, &input, limits) {
        Ok(evaluation) => panic!("{text:?} gave {:?}", evaluation.results),
        Err(e) => e,
    }
}

#[test]
fn every_error_kind_has_its_message_and_location() {
    let small = Limits {
        max_steps: 3,
        max_depth: 2,
        max_value_size: 8,
    };
    let cases: &[(&str, &Limits, &str)] = &[
        ("  @", &Limits::default(), "1:3: unexpected character '@'"),
        ("(<> 1 2)", &Limits::default(), "1:2: unknown operator '<>'"),
        ("\n1x", &Limits::default(), "2:1: malformed number '1x'"),
        (
            "99999999999999999999",
            &Limits::default(),
            "1:1: integer literal '99999999999999999999' out of range",
        ),
        ("(debug 'a)", &Limits::default(), "1:8: unterminated string"),
        ("(+ 1 (+ 2 3)", &Limits::default(), "1:1: unclosed '('"),
        ("{ [ }", &Limits::default(), "1:5: '}' does not match '['"),
        ("(+ 1 2))", &Limits::default(), "1:8: unexpected ')'"),
        ("(defvar 5 1)", &Limits::default(), "1:9: expected a name"),
        ("(5 1)", &Limits::default(), "1:2: expected a function name"),
        (
            "(let 5 1)",
            &Limits::default(),
            "1:6: expected a list of bindings",
        ),
        (
            "(let (a 1) a)",
            &Limits::default(),
            "1:7: a let binding must be (name value)",
        ),
        (
            "(let ((a 1 2)) a)",
            &Limits::default(),
            "1:7: a let binding must be (name value)",
        ),
        (
            "(def f x x)",
            &Limits::default(),
            "1:8: expected a list of parameters",
        ),
        (
            "(def f (x 1) x)",
            &Limits::default(),
            "1:11: expected a name",
        ),
        ("(+ 1 x)", &Limits::default(), "1:6: unknown symbol 'x'"),
        ("(foo 1)", &Limits::default(), "1:2: unknown function 'foo'"),
        (
            "(Host.Frob)",
            &Limits::default(),
            "1:1: unknown method 'Frob'",
        ),
        ("Host.frob", &Limits::default(), "1:1: unknown field 'frob'"),
        (
            "(with Guests g (g.Prop 'x'))",
            &Limits::default(),
            "1:24: unknown property 'x'",
        ),
        (
            "(Host.Control 'x' 1)",
            &Limits::default(),
            "1:15: unknown control 'x'",
        ),
        (
            "(set Guests 1)",
            &Limits::default(),
            "1:6: cannot bind 'Guests'",
        ),
        (
            "(def a.b () 1)",
            &Limits::default(),
            "1:6: cannot bind 'a.b'",
        ),
        (
            "(def max (a b) a)",
            &Limits::default(),
            "1:6: cannot redefine built-in 'max'",
        ),
        (
            "(def + (a b) a)",
            &Limits::default(),
            "1:6: cannot redefine built-in '+'",
        ),
        (
            "(if 1 2)",
            &Limits::default(),
            "1:1: 'if' takes 3 arguments, got 2",
        ),
        (
            "(not)",
            &Limits::default(),
            "1:1: 'not' takes 1 argument, got 0",
        ),
        (
            "(def f (x) x) (f)",
            &Limits::default(),
            "1:15: 'f' takes 1 argument, got 0",
        ),
        (
            "(min)",
            &Limits::default(),
            "1:1: 'min' takes at least 1 argument, got 0",
        ),
        (
            "(let)",
            &Limits::default(),
            "1:1: 'let' takes at least 1 argument, got 0",
        ),
        (
            "(debug)",
            &Limits::default(),
            "1:1: 'debug' takes at least 1 argument, got 0",
        ),
        (
            "(abs nil)",
            &Limits::default(),
            "1:1: 'abs' needs a number, got nil",
        ),
        (
            "(- 'a' 1)",
            &Limits::default(),
            "1:1: unsupported operand types for -: string and int",
        ),
        (
            "(> 'a' 1)",
            &Limits::default(),
            "1:1: cannot compare string and int",
        ),
        (
            "(defvar n 1) n.mem_free",
            &Limits::default(),
            "1:14: cannot read 'mem_free' of int",
        ),
        ("(/ 5 0)", &Limits::default(), "1:1: division by zero"),
        (
            "(* 9223372036854775807 2)",
            &Limits::default(),
            "1:1: integer overflow",
        ),
        ("(>> 1 -2)", &Limits::default(), "1:1: negative shift count"),
        (
            "(int (- 1e999 1e999))",
            &Limits::default(),
            "1:1: cannot convert NaN to an integer",
        ),
        (
            "(+ 'abcd' 'efgh')",
            &small,
            "1:1: value larger than the size limit of 8",
        ),
        ("(+ 1 (+ 2 3))", &small, "1:9: step budget of 3 exhausted"),
        (
            "(+ 1 (+ 2 3))",
            &Limits {
                max_depth: 2,
                ..Limits::default()
            },
            "1:9: depth limit of 2 exceeded",
        ),
    ];
    for (text, limits, expected) in cases {
        assert_eq!(
            fail(text, limits).to_string(),
            format!("t.policy:{expected}"),
            "{text:?}"
        );
    }
}

#[test]
fn nesting_is_bounded_by_the_parser() {
    let text = "(".repeat(100_000);
    assert_eq!(
        crate::error(&text),
        format!(
            "t.policy:1:{}: nesting deeper than {MAX_NESTING} levels",
            MAX_NESTING + 1
        )
    );
}

#[test]
fn the_deepest_accepted_nesting_parses() {
    let text = format!("{}{}", "[".repeat(MAX_NESTING), "]".repeat(MAX_NESTING));
    let program = Program::parse(&sources(&text)).unwrap();
    assert_eq!(program.forms().len(), 1);
    let deeper = format!("({text})");
    assert_eq!(
        Program::parse(&sources(&deeper)).unwrap_err().kind,
        ErrorKind::TooDeep(MAX_NESTING)
    );
}

#[test]
fn the_innermost_unclosed_bracket_is_reported() {
    assert_eq!(
        crate::error("(a\n  (b\n    (c)"),
        "t.policy:2:3: unclosed '('"
    );
}

#[test]
fn errors_name_the_file_they_are_in() {
    let sources = [
        Source::new("00-consts.policy", "(defvar limit 10)\n"),
        Source::new("10-main.policy", "# main\n(+ limit\n   missing)"),
    ];
    let error = Program::parse(&sources)
        .unwrap()
        .evaluate(&Input::default(), &Limits::default())
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "10-main.policy:3:4: unknown symbol 'missing'"
    );
    let error = Program::parse(&[Source::new("a", "1"), Source::new("b", "\n )")]).unwrap_err();
    assert_eq!(error.to_string(), "b:2:2: unexpected ')'");
}

#[test]
fn sources_are_concatenated_in_order() {
    let sources = [
        Source::new("a", "(defvar x 1)"),
        Source::new("b", "(defvar x 2) (+ x 1)"),
    ];
    let evaluation = Program::parse(&sources)
        .unwrap()
        .evaluate(&Input::default(), &Limits::default())
        .unwrap();
    // The later file's defvar keeps x as the earlier one bound it, as MOM's does: a
    // file sorted first sets what the shipped files' defvars would.
    assert_eq!(
        evaluation.results,
        vec![Value::Int(1), Value::Int(1), Value::Int(2)]
    );
}

#[test]
fn error_fields_and_message() {
    let error = fail("\n  (+ 1 nope)", &Limits::default());
    assert_eq!(error.kind, ErrorKind::UnknownSymbol("nope".into()));
    assert_eq!(
        (error.file.as_str(), error.line, error.column),
        ("t.policy", 2, 8)
    );
    assert_eq!(error.message(), "unknown symbol 'nope'");
}

#[test]
fn render_shows_the_line_and_a_caret() {
    let text = "(defvar a 1)\n(+ a\n   (/ a 0))\n";
    let error = fail(text, &Limits::default());
    assert_eq!(
        error.render(&sources(text)),
        "t.policy:3:4: division by zero\n   (/ a 0))\n   ^"
    );
}

#[test]
fn render_keeps_tabs_so_the_caret_lines_up() {
    let text = "\t(+ 1 \"x\")";
    let error = fail(text, &Limits::default());
    assert_eq!(
        error.render(&sources(text)),
        "t.policy:1:2: unsupported operand types for +: int and string\n\t(+ 1 \"x\")\n\t^"
    );
}

#[test]
fn render_drops_a_carriage_return() {
    let text = "1\r\n  oops\r\n";
    assert_eq!(
        fail(text, &Limits::default()).render(&sources(text)),
        "t.policy:2:3: unknown symbol 'oops'\n  oops\n  ^"
    );
}

#[test]
fn render_without_the_source_is_the_first_line_only() {
    let error = fail("(+ 1 x)", &Limits::default());
    assert_eq!(error.render(&[]), "t.policy:1:6: unknown symbol 'x'");
}

#[test]
fn error_json_form() {
    let error = fail("\n (foo)", &Limits::default());
    assert_eq!(
        error.to_json(),
        serde_json::json!({"error": {"message": "unknown function 'foo'", "file": "t.policy", "line": 2, "column": 3}})
    );
}

#[test]
fn a_failed_evaluation_keeps_the_debug_lines_recorded_before_it() {
    let error = crate::run("(debug \"before\" 1)\n(/ 1 0)\n(debug \"after\")").unwrap_err();
    assert_eq!(error.to_string(), "t.policy:2:1: division by zero");
    assert_eq!(error.debug, ["t.policy:1: before 1"]);
}
