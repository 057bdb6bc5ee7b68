//! Literals, symbols, comments and the lexer's errors.

use crate::{error, run, s, value};
use memtide_lang::{Program, Value};

#[test]
fn integer_literals() {
    assert_eq!(value("12"), Value::Int(12));
    assert_eq!(value("-5"), Value::Int(-5));
    assert_eq!(value("0"), Value::Int(0));
    assert_eq!(value("-0"), Value::Int(0));
    assert_eq!(value("9223372036854775807"), Value::Int(i64::MAX));
    assert_eq!(value("-9223372036854775808"), Value::Int(i64::MIN));
}

#[test]
fn hex_and_octal_literals() {
    assert_eq!(value("0xFF"), Value::Int(255));
    assert_eq!(value("0X1f"), Value::Int(31));
    assert_eq!(value("-0x10"), Value::Int(-16));
    assert_eq!(value("0o11"), Value::Int(9));
    assert_eq!(value("0O777"), Value::Int(511));
    assert_eq!(value("-0x8000000000000000"), Value::Int(i64::MIN));
}

#[test]
fn float_literals() {
    assert_eq!(value(".3"), Value::Float(0.3));
    assert_eq!(value("1.5"), Value::Float(1.5));
    assert_eq!(value("-1.5"), Value::Float(-1.5));
    assert_eq!(value("-.5"), Value::Float(-0.5));
    assert_eq!(value("10.0e3"), Value::Float(10000.0));
    assert_eq!(value("2."), Value::Float(2.0));
    assert_eq!(value("1E3"), Value::Float(1000.0));
    assert_eq!(value("2.5e+2"), Value::Float(250.0));
}

#[test]
fn integer_with_exponent_is_a_float() {
    assert_eq!(value("100e-2"), Value::Float(1.0));
    assert_eq!(value("3e2"), Value::Float(300.0));
}

#[test]
fn huge_float_literal_is_infinite() {
    assert_eq!(value("1e999"), Value::Float(f64::INFINITY));
}

#[test]
fn minus_followed_by_space_is_the_operator() {
    assert_eq!(value("(- 5 3)"), Value::Int(2));
    assert_eq!(value("(- -5 3)"), Value::Int(-8));
}

#[test]
fn malformed_numbers_name_the_word() {
    assert_eq!(error("12abc"), "t.policy:1:1: malformed number '12abc'");
    assert_eq!(error("(+ 1 2x)"), "t.policy:1:6: malformed number '2x'");
    assert_eq!(error("1.2.3"), "t.policy:1:1: malformed number '1.2.3'");
    assert_eq!(error("0x"), "t.policy:1:1: malformed number '0x'");
    assert_eq!(error("0xG1"), "t.policy:1:1: malformed number '0xG1'");
    assert_eq!(error("0x+5"), "t.policy:1:1: malformed number '0x+5'");
    assert_eq!(error("0o8"), "t.policy:1:1: malformed number '0o8'");
    assert_eq!(error("0b101"), "t.policy:1:1: malformed number '0b101'");
    assert_eq!(error("1e"), "t.policy:1:1: malformed number '1e'");
    assert_eq!(error("1e+"), "t.policy:1:1: malformed number '1e+'");
    assert_eq!(error("-1-"), "t.policy:1:1: malformed number '-1-'");
}

#[test]
fn a_leading_zero_is_refused_as_mom_would_read_octal() {
    // MOM's int(tok, 0) reads 010 as 8: refused rather than read differently.
    // Before an exponent too: MOM reads `010e2` as 8 and then the name `e2`.
    for (text, word) in [
        ("010", "010"),
        ("(+ 1 -007)", "-007"),
        ("00", "00"),
        ("010e2", "010e2"),
        ("-01E5", "-01E5"),
    ] {
        let error = error(text);
        assert!(
            error.ends_with(&format!(
                "integer literal '{word}' has a leading zero: MOM before 2019 read it as octal, \
                 MOM now fails on it, memtide refuses it (write it without the zero, or 0o… \
                 for octal)"
            )),
            "{error}"
        );
    }
    // Floats are decimal in MOM too, and a lone zero takes an exponent.
    assert_eq!(value("007.5"), Value::Float(7.5));
    assert_eq!(value("0e1"), Value::Float(0.0));
}

#[test]
fn integer_literals_out_of_range_are_errors() {
    assert_eq!(
        error("9223372036854775808"),
        "t.policy:1:1: integer literal '9223372036854775808' out of range"
    );
    assert_eq!(
        error("\n  -9223372036854775809"),
        "t.policy:2:3: integer literal '-9223372036854775809' out of range"
    );
    assert_eq!(
        error("0x8000000000000000"),
        "t.policy:1:1: integer literal '0x8000000000000000' out of range"
    );
    assert_eq!(
        error("0x10000000000000000"),
        "t.policy:1:1: integer literal '0x10000000000000000' out of range"
    );
}

#[test]
fn strings_are_the_raw_text_between_quotes() {
    assert_eq!(value("\"hello 'x'\""), s("hello 'x'"));
    assert_eq!(value("'say \"hi\"'"), s("say \"hi\""));
    assert_eq!(value(r#""a\nb""#), s("a\\nb"));
    assert_eq!(value("\"# not a comment\""), s("# not a comment"));
    assert_eq!(value("\"\""), s(""));
}

#[test]
fn a_backslash_keeps_the_next_character_in_the_string_and_stays_as_in_mom() {
    // MOM's scanner: "([^"\\]|\\.)*", and the value is the text between the quotes.
    assert_eq!(value(r#""a\"b""#), s(r#"a\"b"#));
    assert_eq!(value(r"'it\'s'"), s(r"it\'s"));
    assert_eq!(value(r#""a\\""#), s(r"a\\"));
    // A backslash before the closing quote escapes it.
    assert_eq!(
        error(r#"(debug "C:\")"#),
        "t.policy:1:8: unterminated string"
    );
}

#[test]
fn strings_may_span_lines_and_lines_are_counted_inside() {
    assert_eq!(value("\"a\nb\""), s("a\nb"));
    assert_eq!(error("\"a\nb\" x"), "t.policy:2:4: unknown symbol 'x'");
}

#[test]
fn unterminated_string_points_at_its_opening_quote() {
    assert_eq!(error("(debug \"abc"), "t.policy:1:8: unterminated string");
    assert_eq!(error("\n 'abc\n\n"), "t.policy:2:2: unterminated string");
}

#[test]
fn a_token_must_follow_a_string_after_a_separator() {
    assert_eq!(error("\"a\"b"), "t.policy:1:4: unexpected character 'b'");
    assert_eq!(
        error("(+ \"a\"\"b\")"),
        "t.policy:1:7: unexpected character '\"'"
    );
    assert_eq!(value("(+ \"a\" \"b\")"), s("ab"));
}

#[test]
fn symbols_may_hold_digits_dashes_dots_and_underscores() {
    assert_eq!(value("(defvar _a-b_9 1) _a-b_9"), Value::Int(1));
    assert_eq!(value("(defvar x9-y 2) x9-y"), Value::Int(2));
    assert_eq!(value("Host.mem_free"), Value::Nil);
}

#[test]
fn bad_characters_in_symbols_are_pointed_at() {
    assert_eq!(error("(foo@bar)"), "t.policy:1:5: unexpected character '@'");
    assert_eq!(error("abc\"x\""), "t.policy:1:4: unexpected character '\"'");
}

#[test]
fn characters_that_do_not_show_are_named_by_code_point() {
    assert_eq!(
        error("\u{feff}(defvar x 1)"),
        "t.policy:1:1: unexpected character U+FEFF (byte order mark: save the file without it)"
    );
    assert_eq!(
        error("(+ 1 \0)"),
        "t.policy:1:6: unexpected character U+0000"
    );
    assert_eq!(
        error("x\u{200b}"),
        "t.policy:1:2: unexpected character U+200B"
    );
    assert_eq!(error("é"), "t.policy:1:1: unexpected character 'é'");
}

#[test]
fn characters_that_start_no_token_are_errors() {
    assert_eq!(error("$x"), "t.policy:1:1: unexpected character '$'");
    assert_eq!(error("(+ 1 ;2)"), "t.policy:1:6: unexpected character ';'");
    assert_eq!(error(".x"), "t.policy:1:1: unexpected character '.'");
}

#[test]
fn columns_count_characters_not_bytes() {
    assert_eq!(
        error("(debug \"é\" ü)"),
        "t.policy:1:12: unexpected character 'ü'"
    );
}

#[test]
fn unknown_operators_are_errors() {
    assert_eq!(error("(= 1 2)"), "t.policy:1:2: unknown operator '='");
    assert_eq!(error("(=> 1 2)"), "t.policy:1:2: unknown operator '=>'");
    assert_eq!(error("(+5 3)"), "t.policy:1:2: unknown operator '+5'");
    assert_eq!(error("(-x)"), "t.policy:1:2: unknown operator '-x'");
    assert_eq!(error("(! 1)"), "t.policy:1:2: unknown operator '!'");
}

#[test]
fn empty_and_comment_only_sources_do_nothing() {
    for text in ["", "   \n\t\n", "# just a comment", "# one\n# two\n"] {
        let evaluation = run(text).unwrap();
        assert!(evaluation.results.is_empty(), "{text:?}");
        assert!(evaluation.controls.host.is_empty() && evaluation.controls.guests.is_empty());
    }
}

#[test]
fn comments_run_to_the_end_of_the_line() {
    assert_eq!(value("(+ 1 2) # (+ 3 4) ("), Value::Int(3));
    assert_eq!(value("(+ 1 # inside a form\n 2)"), Value::Int(3));
    assert_eq!(value("(defvar x 4)x#comment"), Value::Int(4));
}

#[test]
fn line_numbers_are_right_after_comments() {
    assert_eq!(
        error("# c1\n# c2 (\n(+ 1 x)"),
        "t.policy:3:6: unknown symbol 'x'"
    );
    assert_eq!(
        error("(+ 1 2) # c\n\n   y # c"),
        "t.policy:3:4: unknown symbol 'y'"
    );
}

#[test]
fn carriage_returns_are_whitespace() {
    assert_eq!(
        error("(+ 1 2)\r\n(+ 1 y)\r\n"),
        "t.policy:2:6: unknown symbol 'y'"
    );
}

#[test]
fn tabs_count_as_one_column() {
    assert_eq!(error("\t\t(+ 1 z)"), "t.policy:1:8: unknown symbol 'z'");
}

#[test]
fn nil_is_a_literal() {
    assert_eq!(value("nil"), Value::Nil);
    let program = Program::parse(&crate::sources("nil")).unwrap();
    assert_eq!(program.forms()[0].kind, memtide_lang::ExprKind::Nil);
}
