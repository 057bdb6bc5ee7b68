//! What loading a policy checks beyond its syntax: every call names something callable,
//! with a number of arguments it takes (and a control that exists).

use crate::{run, sources, value};
use memtide_lang::{ErrorKind, Limits, PolicyError, Program, ScriptPolicy, Source, Value};

/// Load `sources` as the daemon and `memtide policy check` do.
fn load_all(sources: &[Source]) -> Result<(), PolicyError> {
    ScriptPolicy::parse(sources, Limits::default()).map(|_| ())
}

/// Load `text` as `t.policy`.
fn load(text: &str) -> Result<(), PolicyError> {
    load_all(&sources(text))
}

/// The error loading `text` fails with, as `file:line:col: message`.
fn refused(text: &str) -> String {
    match load(text) {
        Ok(()) => panic!("{text:?} loaded"),
        Err(e) => e.to_string(),
    }
}

fn accepted(text: &str) {
    if let Err(e) = load(text) {
        panic!("{text:?}: {}", e.render(&sources(text)));
    }
}

#[test]
fn an_unknown_function_at_top_level_is_refused_at_load() {
    let text = "(defvar x 1)\n  (foo 1 2)\n";
    let error = load(text).unwrap_err();
    assert_eq!(error.kind, ErrorKind::UnknownFunction("foo".into()));
    assert_eq!(error.to_string(), "t.policy:2:4: unknown function 'foo'");
    assert_eq!(
        error.render(&sources(text)),
        "t.policy:2:4: unknown function 'foo'\n  (foo 1 2)\n   ^"
    );
    // Program::check is the same check, on a parsed program.
    let program = Program::parse(&sources(text)).unwrap();
    assert_eq!(program.check().unwrap_err(), error);
}

#[test]
fn an_unknown_function_in_a_function_body_is_refused_though_never_called() {
    let text = "(defun scale (x)\n  (* x (facter x)))\n";
    assert_eq!(refused(text), "t.policy:2:9: unknown function 'facter'");
    // Nested in the forms that evaluate their arguments, too.
    let cases = [
        ("(if 1 2 (nope))", "1:10"),
        ("(defvar a (nope))", "1:12"),
        ("(let ((a 1) (b (nope))) a)", "1:17"),
        ("(let ((a 1)) (nope))", "1:15"),
        ("(with Guests g (nope g))", "1:17"),
        ("(with (nope) g g)", "1:8"),
        ("{ 1 (nope) }", "1:6"),
        ("(debug 1 (nope))", "1:11"),
        ("(+ 1 (nope))", "1:7"),
        ("(Host.Control 'ksm_run' (nope))", "1:26"),
        ("(def f (a) a) (f (nope))", "1:19"),
    ];
    for (text, at) in cases {
        assert_eq!(
            refused(text),
            format!("t.policy:{at}: unknown function 'nope'"),
            "{text}"
        );
    }
}

#[test]
fn the_first_unknown_function_is_reported_in_its_file() {
    let sources = [
        Source::new("00-consts.policy", "(defvar limit 10)\n"),
        Source::new(
            "10-main.policy",
            "# main\n(if (toobig limit)\n  (other) 0)\n",
        ),
    ];
    let error = load_all(&sources).unwrap_err();
    assert_eq!(
        error.render(&sources),
        "10-main.policy:2:6: unknown function 'toobig'\n(if (toobig limit)\n     ^"
    );
}

#[test]
fn a_function_defined_after_its_first_use_is_accepted() {
    // In the same file: a body calls a function defined further down.
    let text = "(def outer (x) (inner x))\n(def inner (x) (* x 2))\n(outer 21)";
    accepted(text);
    assert_eq!(value(text), Value::Int(42));
    // In a later file, as MOM concatenates a policy directory.
    let sources = [
        Source::new("10-main.policy", "(def decide (g) (helper g))\n"),
        Source::new("20-lib.policy", "(defun helper (g) (+ g 1))\n(decide 1)\n"),
    ];
    load_all(&sources).unwrap();
    let evaluation = Program::parse(&sources)
        .unwrap()
        .evaluate(&Default::default(), &Limits::default())
        .unwrap();
    assert_eq!(evaluation.results.last(), Some(&Value::Int(2)));
}

#[test]
fn a_function_defined_by_a_def_inside_a_function_is_accepted() {
    let text = "(def setup () (def helper () 7))\n(setup)\n(helper)";
    accepted(text);
    assert_eq!(value(text), Value::Int(7));
}

#[test]
fn definition_order_at_top_level_is_left_to_evaluation() {
    // The check does not follow the order definitions run in: a call that runs before
    // its function is defined passes loading and fails when evaluated, as before.
    let text = "(f)\n(def f () 1)";
    accepted(text);
    assert_eq!(
        run(text).unwrap_err().to_string(),
        "t.policy:1:2: unknown function 'f'"
    );
}

#[test]
fn entity_calls_are_accepted() {
    accepted(
        "(Host.Stat \"mem_free\") (Host.StatAvg \"mem_free\") (Host.Prop \"x\")
         (Host.Control \"ksm_run\" 1) (Host.GetControl \"ksm_run\")
         (with Guests guest {
           (guest.Stat \"balloon_cur\") (guest.StatAvg \"mem_unused\") (guest.Prop \"name\")
           (guest.Control \"balloon_target\" (guest.GetControl \"balloon_target\"))
         })
         (def grow (guest) (guest.Control \"balloon_target\" guest.balloon_max))
         (let ((h Host)) (h.Stat \"mem_free\"))",
    );
    // An entity that is not one is the evaluator's to report (cannot read … of …), and
    // so is a control name that is not a literal string.
    accepted("(defvar n 1) (n.Stat \"x\") (nobody.Control 1 2) (Host.Control n 1)");
    // A host control through a variable bound to the host.
    accepted("(defvar h Host) (h.Control \"ksm_run\" 1)");
}

#[test]
fn a_method_that_does_not_exist_is_refused_on_any_receiver() {
    for (text, error) in [
        ("(Host.Frob 1)", "t.policy:1:1: unknown method 'Frob'"),
        (
            "(with Guests guest\n  (guest.Contol \"balloon_target\" 1))",
            "t.policy:2:3: unknown method 'Contol'",
        ),
        (
            "(def f (g) (g.stat \"rss\"))",
            "t.policy:1:12: unknown method 'stat'",
        ),
    ] {
        assert_eq!(refused(text), error, "{text}");
    }
    // The evaluator says the same when it gets there.
    assert_eq!(
        run("(Host.Frob 1)").unwrap_err().to_string(),
        "t.policy:1:1: unknown method 'Frob'"
    );
}

#[test]
fn a_literal_control_name_that_no_entity_has_is_refused() {
    for (text, error) in [
        (
            "(with Guests g (g.Control \"balloon_targt\" 1))",
            "t.policy:1:27: unknown control 'balloon_targt'",
        ),
        // vdsm's cputune controls are not memtide's.
        (
            "(Host.Control \"vcpu_quota\" 1)",
            "t.policy:1:15: unknown control 'vcpu_quota'",
        ),
        // The host has no balloon.
        (
            "(Host.Control 'balloon_target' 1)",
            "t.policy:1:15: unknown control 'balloon_target'",
        ),
        (
            "(Host.GetControl \"ksm_runn\")",
            "t.policy:1:18: unknown control 'ksm_runn'",
        ),
    ] {
        assert_eq!(refused(text), error, "{text}");
    }
    // Any other receiver may be the host or a guest: either's controls are accepted.
    accepted("(defvar h Host) (h.Control \"ksm_run\" 1) (h.GetControl 'balloon_target')");
}

#[test]
fn a_call_with_a_number_of_arguments_it_never_takes_is_refused() {
    // Each with whether evaluation reaches the call (and fails the same way).
    for (text, error, reached) in [
        (
            "(def f (a b) 1)\n(f 1)",
            "t.policy:2:1: 'f' takes 2 arguments, got 1",
            true,
        ),
        // Defined after the call, in a function body never called.
        (
            "(def g () (f 1 2 3))\n(defun f (a) a)",
            "t.policy:1:11: 'f' takes 1 argument, got 3",
            false,
        ),
        (
            "(def f (a) a) (def f (a b) b) (f)",
            "t.policy:1:31: 'f' takes 1 or 2 arguments (as defined in different places), got 0",
            false,
        ),
        (
            "(+ 1 2 3)",
            "t.policy:1:1: '+' takes 2 arguments, got 3",
            true,
        ),
        ("(abs)", "t.policy:1:1: 'abs' takes 1 argument, got 0", true),
        (
            "(if 0 (not 1 2) 3)",
            "t.policy:1:7: 'not' takes 1 argument, got 2",
            false,
        ),
        (
            "(max)",
            "t.policy:1:1: 'max' takes at least 1 argument, got 0",
            true,
        ),
        (
            "(if 1 2)",
            "t.policy:1:1: 'if' takes 3 arguments, got 2",
            true,
        ),
        (
            "(Host.Stat \"a\" \"b\")",
            "t.policy:1:1: 'Host.Stat' takes 1 argument, got 2",
            true,
        ),
    ] {
        assert_eq!(refused(text), error, "{text}");
        if reached {
            assert_eq!(run(text).unwrap_err().to_string(), error, "{text}");
        }
    }
    // Either definition's arity is accepted, and null and valid take any number.
    accepted("(def f (a) a) (def f (a b) b) (f 1) (f 1 2) (null) (valid 1 2 3)");
}

#[test]
fn every_built_in_is_accepted() {
    let text = "(defvar a 1) (set a 2) (setq a 3) (let ((b 1)) b) (def f (x) x) (defun g () 1)
        (if 1 2 3) (with () x x) (debug a)
        (and 1 2) (or 1 2) (not 1) (min 1 2) (max 1 2) (null nil) (valid 1) (abs -1) (int 1.5)
        (+ 1 2) (- 1 2) (* 1 2) (/ 1 2) (< 1 2) (> 1 2) (<= 1 2) (>= 1 2) (== 1 2) (!= 1 2)
        (<< 1 2) (>> 1 2) (f 1) (g)";
    accepted(text);
    run(text).unwrap();
}

#[test]
fn a_variable_is_not_a_function() {
    // Functions have their own namespace: the evaluator never calls a variable.
    let text = "(defvar f 1)\n(f)";
    assert_eq!(refused(text), "t.policy:2:2: unknown function 'f'");
    assert_eq!(
        run(text).unwrap_err().to_string(),
        "t.policy:2:2: unknown function 'f'"
    );
    assert_eq!(
        refused("(let ((g 1)) (g))"),
        "t.policy:1:15: unknown function 'g'"
    );
}

#[test]
fn a_form_that_fails_whenever_it_runs_is_refused_with_the_evaluators_error() {
    // Each fails when evaluated, before it evaluates anything in it: loading refuses it
    // with the same error, at the same place, though nothing calls it.
    let cases = [
        ("(let (nope 1) 1)", "a let binding must be (name value)"),
        ("(let x 1)", "expected a list of bindings"),
        ("(let ((5 1)) 1)", "expected a name"),
        ("(defvar 5 (nope))", "expected a name"),
        ("(set Host 1)", "cannot bind 'Host'"),
        ("(with Guests 5 (nope))", "expected a name"),
        ("(def f x (nope)) 0", "expected a list of parameters"),
        ("(def f (a 5) a) 0", "expected a name"),
        ("(def f (x y x) x) 0", "a parameter named twice"),
        ("(def max (a) (nope))", "cannot redefine built-in 'max'"),
        ("(defun abs (x) 42)", "cannot redefine built-in 'abs'"),
        ("((nope))", "expected a function name"),
    ];
    for (text, error) in cases {
        let at_load = refused(text);
        assert!(at_load.ends_with(error), "{text}: {at_load}");
        assert_eq!(run(text).unwrap_err().to_string(), at_load, "{text}");
    }
    // In a function never called, in a branch never taken.
    assert_eq!(
        refused("(def f () (if 0 (def if (x) 1) 2))"),
        "t.policy:1:22: cannot redefine built-in 'if'"
    );
    // Where the parameter comes again.
    assert_eq!(
        refused("(def f (x y x) x)"),
        "t.policy:1:13: a parameter named twice"
    );
    // A name only a malformed `def` defines: the `def` is refused, not its call.
    assert_eq!(
        refused("(g)\n(def g x x)"),
        "t.policy:2:8: expected a list of parameters"
    );
}

#[test]
fn what_the_evaluator_never_evaluates_is_not_checked() {
    // Parameter and binding names are names, not calls, and nothing after a form's
    // first error is evaluated.
    for text in ["(def f (nope other) 1) 0", "(let ((nope 1)) nope)"] {
        accepted(text);
        run(text).unwrap();
    }
    assert_eq!(
        refused("(let (x (nope)) 1)"),
        "t.policy:1:7: a let binding must be (name value)"
    );
}

#[test]
fn the_shipped_policies_load() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/policies");
    let mut all = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "policy") {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let source = Source::new(name, std::fs::read_to_string(&path).unwrap());
            if let Err(e) = load_all(std::slice::from_ref(&source)) {
                panic!("{}", e.render(&[source]));
            }
            all.push(source);
        }
    }
    assert!(all.len() >= 2, "{all:?}");
    all.sort_by(|a, b| a.name.cmp(&b.name));
    load_all(&all).unwrap();
}

#[test]
fn a_later_definition_of_another_arity_counts_for_an_earlier_call() {
    // g is defined in the arguments of a call that only the second f takes.
    let text = "(def f (a) a)\n(def h () (f 1 (def g () 1)))\n(def f (a b) b)\n(h)\n(g)";
    accepted(text);
    assert_eq!(value(text), Value::Int(1));
}
