//! Pretty-printing then re-parsing any expression gives the same expression.

use crate::sources;
use memtide_lang::{pretty, Expr, ExprKind, Loc, Program};
use proptest::prelude::*;

const OPERATORS: [&str; 12] = [
    "+", "-", "*", "/", "<", ">", "<=", ">=", "==", "!=", "<<", ">>",
];

fn leaf(kind: ExprKind) -> Expr {
    Expr {
        kind,
        loc: Loc::default(),
    }
}

fn atom() -> impl Strategy<Value = Expr> {
    prop_oneof![
        any::<i64>().prop_map(ExprKind::Int),
        prop_oneof![
            any::<f64>().prop_filter("NaN has no literal", |x| !x.is_nan()),
            Just(f64::INFINITY),
            Just(f64::NEG_INFINITY),
            Just(-0.0),
            Just(1e-300),
        ]
        .prop_map(ExprKind::Float),
        // What the lexer reads: a backslash keeps the next character in the string.
        prop_oneof![r#"([^"\\]|\\.)*"#, r"([^'\\]|\\.)*"].prop_map(ExprKind::Str),
        Just(ExprKind::Nil),
        "[a-zA-Z_][a-zA-Z0-9_.-]{0,30}"
            .prop_filter("nil is a literal", |s| s != "nil")
            .prop_map(ExprKind::Symbol),
        proptest::sample::select(&OPERATORS[..]).prop_map(|op| ExprKind::Symbol(op.to_string())),
    ]
    .prop_map(leaf)
}

/// Expressions of up to 6 levels.
pub fn expr() -> impl Strategy<Value = Expr> {
    atom().prop_recursive(6, 200, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8)
                .prop_map(|items| leaf(ExprKind::List(items))),
            prop::collection::vec(inner, 0..8).prop_map(|items| leaf(ExprKind::Block(items))),
        ]
    })
}

fn forget_locations(expr: &mut Expr) {
    expr.loc = Loc::default();
    if let ExprKind::List(items) | ExprKind::Block(items) = &mut expr.kind {
        items.iter_mut().for_each(forget_locations);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn pretty_printing_round_trips(forms in prop::collection::vec(expr(), 0..5)) {
        let text = pretty(&forms);
        let program = Program::parse(&sources(&text));
        prop_assert!(program.is_ok(), "{:?} in\n{}", program.err(), text);
        let mut parsed = program.unwrap().forms().to_vec();
        parsed.iter_mut().for_each(forget_locations);
        prop_assert_eq!(parsed, forms, "{}", text);
    }
}

#[test]
fn long_forms_break_over_indented_lines() {
    let text = "(def shrink_guest (guest) (let ((size (* guest.balloon_cur (- 1 max_change)))) { (debug size) (guest.Control \"balloon_target\" size) }))";
    let program = Program::parse(&sources(text)).unwrap();
    assert_eq!(
        pretty(program.forms()),
        "(def shrink_guest
  (guest)
  (let ((size (* guest.balloon_cur (- 1 max_change))))
    {(debug size) (guest.Control \"balloon_target\" size)}))
"
    );
}

#[test]
fn long_blocks_put_each_form_on_its_own_line() {
    let form = "(defvar a_rather_long_name (+ another_long_name (* yet_another_name 12345)))";
    let program = Program::parse(&sources(&format!("{{ {form} {form} }}"))).unwrap();
    assert_eq!(
        pretty(program.forms()),
        format!("{{\n  {form}\n  {form}\n}}\n")
    );
}

#[test]
fn empty_lists_and_blocks_stay_whole_past_the_width() {
    let name = "n".repeat(70);
    let text = format!("(f ({name} (g {{}} () x)))");
    let program = Program::parse(&sources(&text)).unwrap();
    assert_eq!(
        pretty(program.forms()),
        format!("(f\n  ({name}\n    (g {{}} () x)))\n")
    );
    let deeper = format!("(f ({name} (g ({name} {{}} ()))))");
    let program = Program::parse(&sources(&deeper)).unwrap();
    assert_eq!(
        pretty(program.forms()),
        format!("(f\n  ({name}\n    (g\n      ({name} {{}}\n        ()))))\n")
    );
}

#[test]
fn atoms_print_as_literals() {
    let text = "12 -5 1.5 1e-7 1e999 0xff \"it's\" 'say \"hi\"' nil x.y <= () {}";
    let program = Program::parse(&sources(text)).unwrap();
    assert_eq!(
        pretty(program.forms()),
        "12\n-5\n1.5\n1e-7\n1e999\n255\n\"it's\"\n'say \"hi\"'\nnil\nx.y\n<=\n()\n{}\n"
    );
}
