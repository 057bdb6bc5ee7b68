//! Times the evaluation of a generated 1000-line policy over 200 guests with 10 samples
//! each, and prints `{"lines": …, "guests": …, "samples": …, "parse_ms": …, "eval_ms": …}`
//! (eval_ms is the median of several runs). Run with `--release`.

use memtide_lang::{EntityInput, Input, Limits, Program, Source, Value};
use std::collections::BTreeMap;
use std::time::Instant;

const BLOCKS: usize = 100;
const GUESTS: usize = 200;
const SAMPLES: usize = 10;
const RUNS: usize = 15;

/// Ten lines of policy using variables, functions, `let`, `if`, `with`, the entity
/// methods and controls, with names made unique by `i`.
fn block(i: usize) -> String {
    format!(
        "(defvar a{i} (* {i} 1.5))
(defvar b{i} (+ a{i} (Host.StatAvg \"mem_free\")))
(def f{i} (guest x)
  (let ((used (- (guest.StatAvg \"balloon_cur\") (guest.StatAvg \"mem_unused\"))))
    (if (> used x) (- used x) (+ used x))))
(defvar r{i} (with Guests guest (f{i} guest b{i})))
(if (< (/ Host.mem_free Host.mem_available) 0.5)
    (set a{i} (max a{i} b{i}))
    (set a{i} (min a{i} b{i})))
(defvar s{i} (with Guests guest (guest.Control \"balloon_target\" (* guest.balloon_cur 0.99))))
"
    )
}

fn sample(fields: &[(&str, i64)]) -> BTreeMap<String, Value> {
    fields
        .iter()
        .map(|(name, value)| (name.to_string(), Value::Int(*value)))
        .collect()
}

fn input() -> Input {
    let host = EntityInput {
        props: BTreeMap::new(),
        stats: (0..SAMPLES as i64)
            .map(|t| {
                sample(&[
                    ("mem_available", 268_435_456),
                    ("mem_free", 100_000_000 + t * 1000),
                ])
            })
            .collect(),
    };
    let guests = (0..GUESTS as i64)
        .map(|g| EntityInput {
            props: BTreeMap::from([("name".to_string(), Value::from(format!("vm{g}").as_str()))]),
            stats: (0..SAMPLES as i64)
                .map(|t| {
                    sample(&[
                        ("balloon_cur", 4_194_304 - t * 100),
                        ("balloon_max", 4_194_304),
                        ("mem_unused", 1_000_000 + g * 10 + t),
                    ])
                })
                .collect(),
        })
        .collect();
    Input { host, guests }
}

fn main() {
    let text: String = (0..BLOCKS).map(block).collect();
    let lines = text.lines().count();
    let sources = [Source::new("bench.policy", text)];
    let input = input();
    let limits = Limits {
        max_steps: 100_000_000,
        ..Limits::default()
    };

    let start = Instant::now();
    let program = Program::parse(&sources).expect("generated policy parses");
    let parse_ms = start.elapsed().as_secs_f64() * 1000.0;

    let mut times: Vec<f64> = (0..RUNS)
        .map(|_| {
            let start = Instant::now();
            let evaluation = program
                .evaluate(&input, &limits)
                .unwrap_or_else(|e| panic!("{}", e.render(&sources)));
            let elapsed = start.elapsed().as_secs_f64() * 1000.0;
            assert_eq!(evaluation.controls.guests.len(), GUESTS);
            elapsed
        })
        .collect();
    times.sort_by(f64::total_cmp);
    let report = serde_json::json!({
        "lines": lines,
        "guests": GUESTS,
        "samples": SAMPLES,
        "parse_ms": (parse_ms * 1000.0).round() / 1000.0,
        "eval_ms": (times[RUNS / 2] * 1000.0).round() / 1000.0,
    });
    println!("{report}");
}
