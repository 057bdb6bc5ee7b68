//! The policy language: the lexer, parser, pretty-printer and evaluator. A parsed
//! program must print to text that parses back to the same program, and every error
//! must render.

use memtide_lang::{pretty, Input, Limits, Program, Source};
use std::sync::OnceLock;

fn snapshot() -> &'static Input {
    static INPUT: OnceLock<Input> = OnceLock::new();
    INPUT.get_or_init(|| {
        serde_json::from_str(
            r#"{"host": {"stats": [{"mem_available": 1000, "mem_free": 300, "ksm_pages_to_scan": 100},
                                   {"mem_available": 1000, "mem_free": 200, "ksm_pages_to_scan": 100}]},
                "guests": [{"props": {"name": "vm1"}, "stats": [{"balloon_cur": 500, "balloon_max": 600, "mem_unused": 50}]},
                           {"props": {"name": "vm2"}, "stats": [{"balloon_cur": 400, "mem_unused": null}]}]}"#,
        )
        .expect("valid snapshot")
    })
}

pub fn run(data: &[u8]) {
    let sources = [Source::new("fuzz.policy", String::from_utf8_lossy(data))];
    let program = match Program::parse(&sources) {
        Ok(program) => program,
        Err(error) => {
            error.render(&sources);
            return;
        }
    };
    let printed = pretty(program.forms());
    let reparsed = Program::parse(&[Source::new("fuzz.policy", printed.as_str())])
        .expect("printed program parses");
    assert_eq!(pretty(reparsed.forms()), printed, "printing is not stable");
    let limits = Limits {
        max_steps: 100_000,
        max_value_size: 1 << 16,
        ..Limits::default()
    };
    if let Err(error) = program.evaluate(snapshot(), &limits) {
        error.render(&sources);
    }
}
