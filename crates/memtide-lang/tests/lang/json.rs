//! The JSON forms of values, evaluations and inputs.

use crate::{eval_with, input, list, run, s};
use memtide_lang::{Entity, Limits, Value};
use serde_json::json;

#[test]
fn values_keep_their_json_types() {
    let cases = [
        (Value::Int(3), "3"),
        (Value::Float(3.0), "3.0"),
        (Value::Float(0.25), "0.25"),
        (s("a\"b"), r#""a\"b""#),
        (Value::Nil, "null"),
        (Value::Bool(true), "true"),
        (
            list(vec![Value::Int(1), list(vec![]), Value::Nil]),
            "[1,[],null]",
        ),
        (Value::Entity(Entity::Host), r#""<host>""#),
        (
            Value::Entity(Entity::Guest {
                index: 0,
                name: "vm1".into(),
            }),
            r#""<guest vm1>""#,
        ),
    ];
    for (value, expected) in cases {
        assert_eq!(serde_json::to_string(&value).unwrap(), expected);
    }
}

#[test]
fn values_read_from_json() {
    let read = |text: &str| serde_json::from_str::<Value>(text).unwrap();
    assert_eq!(read("3"), Value::Int(3));
    assert_eq!(read("3.0"), Value::Float(3.0));
    assert_eq!(read("-3"), Value::Int(-3));
    assert_eq!(read("null"), Value::Nil);
    assert_eq!(read("false"), Value::Bool(false));
    assert_eq!(
        read(r#"["a", [1.5]]"#),
        list(vec![s("a"), list(vec![Value::Float(1.5)])])
    );
}

#[test]
fn evaluation_json_form() {
    let input = input(json!({"guests": [{"props": {"name": "vm1"}}, {"props": {"name": "vm2"}}]}));
    let text = "(Host.Control \"ksm_run\" 1)
                (with Guests g (g.Control \"balloon_target\" 1024.5))
                (debug \"done\" (/ 1 4))";
    let evaluation = eval_with(text, &input, &Limits::default()).unwrap();
    assert_eq!(
        evaluation.to_json(),
        json!({
            "results": [null, [null, null], 0.25],
            "controls": {
                "host": {"ksm_run": 1},
                "guests": {"vm1": {"balloon_target": 1024.5}, "vm2": {"balloon_target": 1024.5}}
            },
            "debug": ["t.policy:3: done 0.25"]
        })
    );
}

#[test]
fn integer_and_float_results_stay_distinct_in_json() {
    let evaluation = run("1 1.0 (/ 2 2)").unwrap();
    assert_eq!(
        serde_json::to_string(&evaluation.to_json()["results"]).unwrap(),
        "[1,1.0,1.0]"
    );
}

#[test]
fn empty_evaluation_json_form() {
    assert_eq!(
        run("# nothing").unwrap().to_json(),
        json!({"results": [], "controls": {"host": {}, "guests": {}}, "debug": []})
    );
}

#[test]
fn input_json_form_of_the_reference() {
    let input = input(json!({
        "host": {"props": {}, "stats": [{"mem_available": 16_000_000, "mem_free": 4_000_000}]},
        "guests": [{"props": {"name": "vm1", "uuid": "1234", "pid": 4321},
                    "stats": [{"balloon_cur": 2_097_152, "balloon_max": 4_194_304}]}]
    }));
    assert_eq!(
        input.host.latest().unwrap()["mem_free"],
        Value::Int(4_000_000)
    );
    assert_eq!(input.guests[0].props["uuid"], s("1234"));
    let back: memtide_lang::Input =
        serde_json::from_value(serde_json::to_value(&input).unwrap()).unwrap();
    assert_eq!(back, input);
}
