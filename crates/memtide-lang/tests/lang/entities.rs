//! Host and guest fields, properties and controls.

use crate::{error_over, eval_with, input, list, s, value, value_over};
use memtide_lang::{Entity, Input, Limits, Value};
use serde_json::json;

fn snapshot() -> Input {
    input(json!({
        "host": {"stats": [
            {"mem_free": 100, "mem_available": 1000},
            {"mem_free": 200, "mem_available": 1000, "custom": 5}
        ]},
        "guests": [
            {"props": {"name": "vm1", "uuid": "u1", "pid": 42},
             "stats": [{"balloon_cur": 500, "mem_unused": 100}, {"balloon_cur": 600, "mem_unused": null}]},
            {"props": {"name": "vm2"}, "stats": []}
        ]
    }))
}

#[test]
fn fields_are_the_latest_sample() {
    assert_eq!(value_over("Host.mem_free", &snapshot()), Value::Int(200));
    assert_eq!(
        value_over("(with Guests g g.balloon_cur)", &snapshot()),
        list(vec![Value::Int(600), Value::Nil])
    );
}

#[test]
fn documented_fields_missing_from_the_input_are_nil() {
    assert_eq!(value_over("Host.swap_in", &snapshot()), Value::Nil);
    assert_eq!(
        value_over("(with Guests g g.rss)", &snapshot()),
        list(vec![Value::Nil, Value::Nil])
    );
    assert_eq!(value("Host.mem_available"), Value::Nil);
}

#[test]
fn undocumented_fields_present_in_the_input_can_be_read() {
    assert_eq!(value_over("Host.custom", &snapshot()), Value::Int(5));
    assert_eq!(
        value_over("(Host.Stat \"custom\")", &snapshot()),
        Value::Int(5)
    );
}

#[test]
fn a_field_present_only_in_older_samples_is_nil() {
    let input = input(json!({"host": {"stats": [{"custom": 1}, {}]}}));
    assert_eq!(value_over("Host.custom", &input), Value::Nil);
}

#[test]
fn unknown_fields_are_errors() {
    assert_eq!(
        error_over("Host.bogus", &snapshot()),
        "t.policy:1:1: unknown field 'bogus'"
    );
    assert_eq!(
        error_over("(Host.Stat \"bogus\")", &snapshot()),
        "t.policy:1:12: unknown field 'bogus'"
    );
    assert_eq!(
        error_over("(Host.StatAvg 'bogus')", &snapshot()),
        "t.policy:1:15: unknown field 'bogus'"
    );
    let guest_field = "(with Guests g g.ksm_run)";
    assert_eq!(
        error_over(guest_field, &snapshot()),
        "t.policy:1:16: unknown field 'ksm_run'"
    );
}

#[test]
fn stat_is_the_latest_value() {
    assert_eq!(
        value_over("(Host.Stat \"mem_free\")", &snapshot()),
        Value::Int(200)
    );
}

#[test]
fn stat_avg_is_the_mean_ignoring_nil() {
    assert_eq!(
        value_over("(Host.StatAvg \"mem_free\")", &snapshot()),
        Value::Float(150.0)
    );
    // As MOM's: 0.0 where every sample's is nil, an error where there is no sample.
    let unused = "(with Guests g (g.StatAvg \"mem_unused\"))";
    let input = input(json!({"guests": [
        {"stats": [{"mem_unused": 100}, {"mem_unused": null}]},
        {"stats": [{"mem_unused": null}, {"balloon_cur": 5}]}
    ]}));
    assert_eq!(
        value_over(unused, &input),
        list(vec![Value::Float(100.0), Value::Float(0.0)])
    );
    assert_eq!(
        error_over(unused, &snapshot()),
        "t.policy:1:27: statistic 'mem_unused' not available: no samples"
    );
}

#[test]
fn stat_avg_needs_numbers() {
    let input = input(json!({"host": {"stats": [{"mem_free": "lots"}]}}));
    assert_eq!(
        error_over("(Host.StatAvg \"mem_free\")", &input),
        "t.policy:1:15: statistic 'mem_free' needs numbers, got string"
    );
}

#[test]
fn props_are_read_by_name() {
    let uuids = "(with Guests g (g.Prop \"uuid\"))";
    assert_eq!(
        value_over(uuids, &snapshot()),
        list(vec![s("u1"), Value::Nil])
    );
    let pids = "(with Guests g (g.Prop \"pid\"))";
    assert_eq!(
        value_over(pids, &snapshot()),
        list(vec![Value::Int(42), Value::Nil])
    );
}

#[test]
fn unknown_props_are_errors() {
    let color = "(with Guests g (g.Prop \"color\"))";
    assert_eq!(
        error_over(color, &snapshot()),
        "t.policy:1:24: unknown property 'color'"
    );
    assert_eq!(
        error_over("(Host.Prop \"name\")", &snapshot()),
        "t.policy:1:12: unknown property 'name'"
    );
}

#[test]
fn controls_are_recorded_per_entity() {
    let text = "(with Guests g (g.Control \"balloon_target\" 1000))
                (Host.Control \"ksm_run\" 1)
                (Host.Control \"ksm_pages_to_scan\" 2.5)";
    let evaluation = eval_with(text, &snapshot(), &Limits::default()).unwrap();
    assert_eq!(
        evaluation.results,
        // Control yields nothing, as MOM's.
        vec![list(vec![Value::Nil, Value::Nil]), Value::Nil, Value::Nil]
    );
    assert_eq!(evaluation.controls.host.len(), 2);
    assert_eq!(evaluation.controls.host["ksm_run"], Value::Int(1));
    assert_eq!(
        evaluation.controls.host["ksm_pages_to_scan"],
        Value::Float(2.5)
    );
    assert_eq!(evaluation.controls.guests.len(), 2);
    assert_eq!(
        evaluation.controls.guests["vm1"]["balloon_target"],
        Value::Int(1000)
    );
    assert_eq!(
        evaluation.controls.guests["vm2"]["balloon_target"],
        Value::Int(1000)
    );
}

#[test]
fn every_documented_host_control_is_accepted() {
    for control in memtide_lang::HOST_CONTROLS {
        let evaluation = eval_with(
            &format!("(Host.Control '{control}' 1)"),
            &snapshot(),
            &Limits::default(),
        )
        .unwrap();
        assert_eq!(evaluation.controls.host[control], Value::Int(1));
    }
}

#[test]
fn a_later_request_replaces_an_earlier_one() {
    let text = "(Host.Control 'ksm_run' 1) (Host.Control 'ksm_run' 0)";
    let evaluation = eval_with(text, &snapshot(), &Limits::default()).unwrap();
    assert_eq!(evaluation.controls.host["ksm_run"], Value::Int(0));
}

#[test]
fn boolean_control_values_become_integers() {
    let evaluation = eval_with(
        "(Host.Control \"ksm_run\" (< 1 2))",
        &snapshot(),
        &Limits::default(),
    )
    .unwrap();
    assert_eq!(evaluation.controls.host["ksm_run"], Value::Int(1));
}

#[test]
fn guests_without_requests_are_absent_from_the_controls() {
    let text =
        "(with Guests g (if (== (g.Prop \"name\") \"vm2\") (g.Control \"balloon_target\" 5) 0))";
    let evaluation = eval_with(text, &snapshot(), &Limits::default()).unwrap();
    assert_eq!(
        evaluation.controls.guests.keys().collect::<Vec<_>>(),
        ["vm2"]
    );
}

#[test]
fn unknown_controls_are_errors() {
    assert_eq!(
        error_over("(Host.Control \"balloon_target\" 1)", &snapshot()),
        "t.policy:1:15: unknown control 'balloon_target'"
    );
    assert_eq!(
        error_over("(with Guests g (g.Control \"ksm_run\" 1))", &snapshot()),
        "t.policy:1:27: unknown control 'ksm_run'"
    );
    assert_eq!(
        error_over("(Host.GetControl \"swappiness\")", &snapshot()),
        "t.policy:1:18: unknown control 'swappiness'"
    );
}

#[test]
fn control_values_must_be_numbers() {
    assert_eq!(
        error_over("(Host.Control \"ksm_run\" \"on\")", &snapshot()),
        "t.policy:1:25: control 'ksm_run' needs a number, got string"
    );
}

#[test]
fn get_control_reads_what_this_evaluation_requested() {
    let text = "(defvar before (Host.GetControl \"ksm_run\"))
                (Host.Control \"ksm_run\" 1)
                (valid before)
                (Host.GetControl \"ksm_run\")";
    let evaluation = eval_with(text, &snapshot(), &Limits::default()).unwrap();
    assert_eq!(evaluation.results[2..], [Value::Bool(false), Value::Int(1)]);
    let per_guest = "(with Guests g (g.GetControl \"balloon_target\"))";
    assert_eq!(
        value_over(per_guest, &snapshot()),
        list(vec![Value::Nil, Value::Nil])
    );
}

#[test]
fn method_keys_must_be_strings() {
    assert_eq!(
        error_over("(Host.Stat 5)", &snapshot()),
        "t.policy:1:12: 'Host.Stat' needs a string, got int"
    );
}

#[test]
fn methods_take_a_fixed_number_of_arguments() {
    assert_eq!(
        error_over("(Host.Stat)", &snapshot()),
        "t.policy:1:1: 'Host.Stat' takes 1 argument, got 0"
    );
    assert_eq!(
        error_over("(Host.Control \"ksm_run\")", &snapshot()),
        "t.policy:1:1: 'Host.Control' takes 2 arguments, got 1"
    );
}

#[test]
fn unknown_methods_are_errors() {
    assert_eq!(
        error_over("(Host.Frob \"x\")", &snapshot()),
        "t.policy:1:1: unknown method 'Frob'"
    );
}

#[test]
fn fields_and_methods_need_an_entity() {
    assert_eq!(
        error_over("(defvar x 5) (x.Stat \"a\")", &snapshot()),
        "t.policy:1:14: cannot read 'Stat' of int"
    );
    assert_eq!(
        error_over("(defvar x nil) x.mem_free", &snapshot()),
        "t.policy:1:16: cannot read 'mem_free' of nil"
    );
    assert_eq!(
        error_over("nobody.mem_free", &snapshot()),
        "t.policy:1:1: unknown symbol 'nobody'"
    );
}

#[test]
fn entities_are_values() {
    assert_eq!(value("Host"), Value::Entity(Entity::Host));
    let guests = value_over("Guests", &snapshot());
    let Value::List(guests) = guests else {
        panic!("{guests:?}")
    };
    assert_eq!(
        guests.items()[1],
        Value::Entity(Entity::Guest {
            index: 1,
            name: "vm2".into()
        })
    );
    assert_eq!(
        value_over(
            "(def size (x) x.balloon_cur) (with Guests g (size g))",
            &snapshot()
        ),
        list(vec![Value::Int(600), Value::Nil])
    );
}

#[test]
fn host_and_guests_cannot_be_bound() {
    assert_eq!(
        crate::error("(defvar Host 1)"),
        "t.policy:1:9: cannot bind 'Host'"
    );
    assert_eq!(
        crate::error("(let ((Guests ())) 1)"),
        "t.policy:1:8: cannot bind 'Guests'"
    );
    assert_eq!(
        crate::error("(with Guests Host 1)"),
        "t.policy:1:14: cannot bind 'Host'"
    );
}

#[test]
fn guests_without_a_name_are_keyed_by_position() {
    let input = input(json!({"guests": [{"props": {"name": "a"}}, {"props": {"name": 7}}, {}]}));
    let text = "(with Guests g (g.Control \"balloon_target\" 1))";
    let evaluation = eval_with(text, &input, &Limits::default()).unwrap();
    assert_eq!(
        evaluation.controls.guests.keys().collect::<Vec<_>>(),
        ["#1", "#2", "a"]
    );
}

#[test]
fn input_json_rejects_unknown_keys_and_objects() {
    let unknown = serde_json::from_value::<Input>(json!({"hosts": {}}))
        .unwrap_err()
        .to_string();
    assert!(unknown.starts_with("unknown field `hosts`"), "{unknown}");
    let object = json!({"host": {"stats": [{"mem_free": {"kib": 1}}]}});
    let object = serde_json::from_value::<Input>(object)
        .unwrap_err()
        .to_string();
    assert_eq!(object, "objects are not policy values");
}

#[test]
fn input_json_keys_are_optional() {
    assert_eq!(input(json!({})), Input::default());
    assert_eq!(input(json!({"host": {}})), Input::default());
}

#[test]
fn input_numbers_keep_their_type() {
    let input =
        input(json!({"host": {"stats": [{"mem_free": 1.0, "swap_in": 18446744073709551615u64}]}}));
    assert_eq!(value_over("Host.mem_free", &input), Value::Float(1.0));
    assert_eq!(
        value_over("Host.swap_in", &input),
        Value::Float(18446744073709551615.0)
    );
}

#[test]
fn a_guest_entity_missing_from_the_input_reads_as_empty() {
    let ghost = Value::Entity(Entity::Guest {
        index: 9,
        name: "ghost".into(),
    });
    let mut input = Input::default();
    input
        .host
        .stats
        .push([("ref".to_string(), ghost)].into_iter().collect());
    assert_eq!(
        value_over("(defvar g Host.ref) g.balloon_cur", &input),
        Value::Nil
    );
}
