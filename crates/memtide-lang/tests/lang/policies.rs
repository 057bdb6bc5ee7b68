//! The MOM-equivalent policies shipped in policies/, on hand-made inputs with
//! hand-computed expected outputs (sizes in KiB).

use crate::input;
use memtide_lang::{Evaluation, Input, Limits, Program, Source, Value};
use serde_json::json;
use std::collections::BTreeMap;

fn policy(name: &str) -> Source {
    let path = format!("{}/policies/{name}", env!("CARGO_MANIFEST_DIR"));
    Source::new(name, std::fs::read_to_string(path).unwrap())
}

fn evaluate(names: &[&str], input: &Input) -> Evaluation {
    let sources: Vec<Source> = names.iter().map(|name| policy(name)).collect();
    let program = Program::parse(&sources).unwrap_or_else(|e| panic!("{}", e.render(&sources)));
    program
        .evaluate(input, &Limits::default())
        .unwrap_or_else(|e| panic!("{}", e.render(&sources)))
}

/// A guest with the same balloon_cur in every sample and the given mem_unused history.
fn guest(name: &str, cur: i64, max: i64, unused: &[i64]) -> serde_json::Value {
    let stats: Vec<_> = unused
        .iter()
        .map(|u| json!({"balloon_cur": cur, "balloon_max": max, "mem_unused": u}))
        .collect();
    json!({"props": {"name": name}, "stats": stats})
}

/// A host of `total` KiB with the given mem_free history.
fn host(total: i64, free: &[i64]) -> serde_json::Value {
    let stats: Vec<_> = free
        .iter()
        .map(|f| json!({"mem_available": total, "mem_free": f}))
        .collect();
    json!({"stats": stats})
}

/// The balloon targets requested, by guest.
fn targets(evaluation: &Evaluation) -> BTreeMap<String, f64> {
    let target = |controls: &BTreeMap<String, Value>| match controls["balloon_target"] {
        Value::Int(n) => n as f64,
        Value::Float(x) => x,
        ref other => panic!("{other:?}"),
    };
    evaluation
        .controls
        .guests
        .iter()
        .map(|(name, c)| (name.clone(), target(c)))
        .collect()
}

fn assert_targets(evaluation: &Evaluation, expected: &[(&str, f64)]) {
    let actual = targets(evaluation);
    assert_eq!(
        actual.keys().collect::<Vec<_>>(),
        expected.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    for (name, want) in expected {
        assert!(
            (actual[*name] - want).abs() < 1e-6,
            "{name}: {} != {want}",
            actual[*name]
        );
    }
}

#[test]
fn balloon_shrinks_under_pressure() {
    // Host free ratio: mean(100000, 140000) / 1000000 = 0.12, below 0.20 and above 0.05,
    // so guests keep a free margin of 0.20 × 0.12 / 0.20 = 0.12 of their size.
    let input = input(json!({
        "host": host(1_000_000, &[100_000, 140_000]),
        "guests": [
            // used 400000 − 110000 = 290000, floor 290000 + 48000 = 338000 < 380000: 5% step.
            guest("vm1", 400_000, 500_000, &[100_000, 120_000]),
            // used 360000, floor 408000 > 400000, its size: under pressure it keeps it.
            guest("vm2", 400_000, 500_000, &[40_000, 40_000]),
            // used 340000, floor 388000 > 380000: the floor, above the 5% step.
            guest("vm3", 400_000, 420_000, &[60_000, 60_000]),
            // used 352500, floor 400500: a change of 500 is below 0.25% of 400000: nothing.
            guest("vm4", 400_000, 500_000, &[47_500, 47_500]),
        ]
    }));
    let evaluation = evaluate(&["balloon.policy"], &input);
    assert_targets(&evaluation, &[("vm1", 380_000.0), ("vm3", 388_000.0)]);
    assert!(evaluation.controls.host.is_empty());
}

#[test]
fn balloon_pushes_below_used_memory_under_critical_pressure() {
    // Host free ratio 30000 / 1000000 = 0.03 ≤ 0.05: margin 0.03 − 0.05 = −0.02.
    let input = input(json!({
        "host": host(1_000_000, &[30_000]),
        "guests": [
            // used 300000, floor 300000 − 8000 = 292000 < 380000: 5% step.
            guest("vm1", 400_000, 500_000, &[100_000]),
            // used 400000 (nothing unused), floor 392000 > 380000: below its used memory.
            guest("vm2", 400_000, 500_000, &[0]),
        ]
    }));
    assert_targets(
        &evaluate(&["balloon.policy"], &input),
        &[("vm1", 380_000.0), ("vm2", 392_000.0)],
    );
}

#[test]
fn balloon_grows_without_pressure() {
    // Host free ratio 0.5: grow by 5%, capped at balloon_max.
    let input = input(json!({
        "host": host(1_000_000, &[500_000]),
        "guests": [
            guest("vm1", 400_000, 500_000, &[100_000]), // 420000
            guest("vm2", 490_000, 500_000, &[0]),       // 514500 capped to 500000
            guest("vm3", 499_000, 500_000, &[0]),       // capped to 500000: change 1000 ≤ 1247.5
            guest("vm4", 500_000, 500_000, &[0]),       // at its maximum
            // used 400000: at once to it and a 20% margin, 480000, not 420000.
            guest("vm5", 400_000, 500_000, &[0]),
        ]
    }));
    let evaluation = evaluate(&["balloon.policy"], &input);
    assert_targets(
        &evaluation,
        &[("vm1", 420_000.0), ("vm2", 500_000.0), ("vm5", 480_000.0)],
    );
    assert_eq!(
        evaluation.controls.guests["vm2"]["balloon_target"],
        Value::Int(500_000)
    );
}

#[test]
fn balloon_grows_at_exactly_the_threshold() {
    let input = input(
        json!({"host": host(1_000_000, &[200_000]), "guests": [guest("vm1", 400_000, 500_000, &[100_000])]}),
    );
    assert_targets(
        &evaluate(&["balloon.policy"], &input),
        &[("vm1", 420_000.0)],
    );
}

fn ksm_host(total: i64, free: i64, pages_to_scan: i64) -> serde_json::Value {
    json!({"stats": [{"mem_available": total, "mem_free": free, "ksm_pages_to_scan": pages_to_scan}]})
}

fn committed(curs: &[i64]) -> Vec<serde_json::Value> {
    curs.iter()
        .enumerate()
        .map(|(i, cur)| guest(&format!("vm{i}"), *cur, *cur, &[0]))
        .collect()
}

fn ksm_controls(input: &Input) -> Vec<(String, Value)> {
    let evaluation = evaluate(&["ksm.policy"], input);
    assert!(evaluation.controls.guests.is_empty());
    evaluation.controls.host.into_iter().collect()
}

fn expect(pairs: &[(&str, i64)]) -> Vec<(String, Value)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), Value::Int(*v)))
        .collect()
}

#[test]
fn ksm_stops_when_memory_is_plentiful() {
    // 16 GiB, free 8000000 > threshold 3355443.2, committed 8000000 + threshold < total.
    let input = input(
        json!({"host": ksm_host(16_777_216, 8_000_000, 100), "guests": committed(&[4_000_000, 4_000_000])}),
    );
    assert_eq!(ksm_controls(&input), expect(&[("ksm_run", 0)]));
}

#[test]
fn ksm_stops_without_guests_when_memory_is_plentiful() {
    let input = input(json!({"host": ksm_host(16_777_216, 8_000_000, 100)}));
    assert_eq!(ksm_controls(&input), expect(&[("ksm_run", 0)]));
}

#[test]
fn ksm_boosts_when_free_memory_is_short() {
    // free 2000000 < threshold: 100 + 300 pages; sleep 10 × 16 GiB / 16 GiB = 10 ms.
    let input = input(
        json!({"host": ksm_host(16_777_216, 2_000_000, 100), "guests": committed(&[1_000_000])}),
    );
    assert_eq!(
        ksm_controls(&input),
        expect(&[
            ("ksm_pages_to_scan", 400),
            ("ksm_run", 1),
            ("ksm_sleep_millisecs", 10)
        ])
    );
}

#[test]
fn ksm_runs_and_decays_when_commitment_is_high() {
    // 8 GiB, free 4000000 > threshold 1677721.6, but committed 7000000 + threshold > total:
    // 100 − 50 = 50 pages, raised to the minimum 64; sleep 10 × 16 / 8 = 20 ms.
    let input = input(
        json!({"host": ksm_host(8_388_608, 4_000_000, 100), "guests": committed(&[3_500_000, 3_500_000])}),
    );
    assert_eq!(
        ksm_controls(&input),
        expect(&[
            ("ksm_pages_to_scan", 64),
            ("ksm_run", 1),
            ("ksm_sleep_millisecs", 20)
        ])
    );
}

#[test]
fn ksm_caps_pages_and_keeps_the_minimum_sleep_on_big_hosts() {
    // 32 GiB: 1200 + 300 pages capped to 1250; sleep 10 × 16 / 32 = 5, raised to 10 ms.
    let input = input(json!({"host": ksm_host(33_554_432, 1_000_000, 1_200)}));
    assert_eq!(
        ksm_controls(&input),
        expect(&[
            ("ksm_pages_to_scan", 1250),
            ("ksm_run", 1),
            ("ksm_sleep_millisecs", 10)
        ])
    );
}

#[test]
fn ksm_sleep_is_the_integer_part() {
    // 167772160 / 10000000 = 16.777216 → 16 ms; free 1000000 < 2000000: 500 + 300 pages.
    let input = input(json!({"host": ksm_host(10_000_000, 1_000_000, 500)}));
    assert_eq!(
        ksm_controls(&input),
        expect(&[
            ("ksm_pages_to_scan", 800),
            ("ksm_run", 1),
            ("ksm_sleep_millisecs", 16)
        ])
    );
}

#[test]
fn both_policies_run_together() {
    let input = input(json!({
        "host": {"stats": [{"mem_available": 1_000_000, "mem_free": 100_000, "ksm_pages_to_scan": 100}]},
        "guests": [guest("vm1", 400_000, 500_000, &[100_000])]
    }));
    // Balloon: ratio 0.1, margin 0.1, used 300000, floor 340000 < 380000.
    // KSM: free 100000 < threshold 200000: 400 pages; sleep int(167.77216) = 167 ms.
    let evaluation = evaluate(&["balloon.policy", "ksm.policy"], &input);
    assert_targets(&evaluation, &[("vm1", 380_000.0)]);
    let host: Vec<_> = evaluation.controls.host.into_iter().collect();
    assert_eq!(
        host,
        expect(&[
            ("ksm_pages_to_scan", 400),
            ("ksm_run", 1),
            ("ksm_sleep_millisecs", 167)
        ])
    );
}
