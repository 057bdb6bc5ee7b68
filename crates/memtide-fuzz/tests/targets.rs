//! The short run of every fuzz target, on stable Rust: each target over its seeds, then
//! over mutations of them (bytes overwritten, inserted, removed, lines spliced from other
//! seeds), a few hundred inputs each. cargo-fuzz runs the same functions for long.

use memtide_fuzz::{seeds, seeds_dir, target, Target, TARGETS};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// Mutated inputs per target.
const CASES: u32 = 300;

/// One edit of an input.
#[derive(Clone, Debug)]
enum Edit {
    Set(usize, u8),
    Insert(usize, u8),
    Remove(usize, usize),
    /// Splice `len` bytes of another seed at `at` (from its offset `from`).
    Splice {
        seed: usize,
        from: usize,
        len: usize,
        at: usize,
    },
    /// An interesting number written at `at`: bounds of integer and size parsing.
    Number(usize, &'static str),
}

const NUMBERS: [&str; 8] = [
    "0",
    "-1",
    "18446744073709551615",
    "18446744073709551616",
    "9223372036854775807",
    "1e308",
    "NaN",
    "4294967296",
];

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Set(i, b)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Insert(i, b)),
        (any::<usize>(), 1..64usize).prop_map(|(i, n)| Edit::Remove(i, n)),
        (any::<usize>(), any::<usize>(), 1..256usize, any::<usize>()).prop_map(
            |(seed, from, len, at)| Edit::Splice {
                seed,
                from,
                len,
                at
            }
        ),
        (any::<usize>(), prop::sample::select(NUMBERS.to_vec()))
            .prop_map(|(i, n)| Edit::Number(i, n)),
    ]
}

fn mutate(seeds: &[Vec<u8>], seed: usize, edits: &[Edit]) -> Vec<u8> {
    let mut data = seeds
        .get(seed % seeds.len().max(1))
        .cloned()
        .unwrap_or_default();
    for e in edits {
        let at = |i: usize, data: &Vec<u8>| i % (data.len() + 1);
        match e {
            Edit::Set(i, b) if !data.is_empty() => {
                let i = i % data.len();
                data[i] = *b;
            }
            Edit::Set(..) => {}
            Edit::Insert(i, b) => data.insert(at(*i, &data), *b),
            Edit::Remove(i, n) => {
                let start = at(*i, &data);
                let end = (start + n).min(data.len());
                data.drain(start..end);
            }
            Edit::Splice {
                seed,
                from,
                len,
                at: i,
            } => {
                let other = &seeds[seed % seeds.len()];
                let from = from % (other.len() + 1);
                let piece = other[from..(from + len).min(other.len())].to_vec();
                let i = at(*i, &data);
                data.splice(i..i, piece);
            }
            Edit::Number(i, n) => {
                let i = at(*i, &data);
                data.splice(i..i, n.bytes());
            }
        }
    }
    data
}

fn short_run(t: &Target) {
    let seeds: Vec<Vec<u8>> = seeds(t.name)
        .unwrap_or_else(|e| panic!("seeds of {}: {e}", t.name))
        .into_iter()
        .map(|(_, bytes)| bytes)
        .collect();
    assert!(!seeds.is_empty(), "{} has no seeds", t.name);
    for seed in &seeds {
        (t.run)(seed);
    }
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (any::<usize>(), prop::collection::vec(edit(), 1..8));
    runner
        .run(&strategy, |(seed, edits)| {
            (t.run)(&mutate(&seeds, seed, &edits));
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{}: {e}", t.name));
}

/// cargo-fuzz knows every target: a `[[bin]]` of `fuzz/Cargo.toml` and its file.
#[test]
fn every_target_is_a_cargo_fuzz_target() {
    let fuzz = seeds_dir().join("..");
    let manifest = std::fs::read_to_string(fuzz.join("Cargo.toml")).expect("fuzz/Cargo.toml");
    for t in TARGETS {
        assert!(
            manifest.contains(&format!("name = \"{}\"", t.name)),
            "{}",
            t.name
        );
        let source = std::fs::read_to_string(fuzz.join(format!("fuzz_targets/{}.rs", t.name)))
            .unwrap_or_else(|e| panic!("{}: {e}", t.name));
        assert!(
            source.contains(&format!("target(\"{}\")", t.name)),
            "{}",
            t.name
        );
    }
}

macro_rules! short_runs {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                short_run(target(stringify!($name)).expect("a target"));
            }
        )*

        /// Every target has its short run here.
        #[test]
        fn every_target_has_a_short_run() {
            let tested = [$(stringify!($name)),*];
            for t in TARGETS {
                assert!(tested.contains(&t.name), "{} has no short run", t.name);
            }
        }
    };
}

short_runs!(
    qmp,
    qga,
    host,
    libvirt_xml,
    libvirt_memstats,
    firecracker,
    cloud_hypervisor,
    kubevirt_pods,
    config,
    recording,
    policy,
);
