//! `memtide policy check` and `memtide policy eval`: policies outside the daemon.

use crate::policies;
use memtide_lang::{Input, Limits, Program, Value};
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// Output format of `policy eval`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// `{"results": […], "controls": {…}}`, or `{"error": {…}}`.
    Json,
    /// A summary for people.
    Text,
}

/// Parse `files`; print each problem as `file:line:col: message` with the line and a
/// caret. Returns whether they are fine.
pub fn check(files: &[PathBuf]) -> bool {
    let result =
        policies::read(files).and_then(|sources| policies::parse(&sources).map(|_| sources));
    match result {
        Ok(sources) => {
            let names: Vec<_> = sources.iter().map(|s| s.name.as_str()).collect();
            println!("{}: ok", names.join(", "));
            true
        }
        Err(e) => {
            eprintln!("{e}");
            false
        }
    }
}

/// Evaluate `files` once over the snapshot in `input` (empty Host and Guests without it)
/// and print the results and requested controls. Returns whether evaluation succeeded.
pub fn eval(files: &[PathBuf], input: Option<&Path>, format: Format) -> anyhow::Result<bool> {
    let given = input.is_some();
    let input: Input = match input {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        }
        None => Input::default(),
    };
    let sources = policies::read(files)?;
    let loaded = Program::parse(&sources).and_then(|p| p.check().map(|()| p));
    let outcome = loaded.and_then(|p| {
        let evaluated = p.evaluate(&input, &Limits::default());
        if evaluated.is_err() && !given {
            // A policy made for a host fails on nothing, as MOM's would: say what was
            // missing.
            eprintln!(
                "note: evaluated without --input: Host has no figures and there are no \
                 guests (give a snapshot: --input FILE, docs/policy-language.md)"
            );
        }
        evaluated
    });
    match (outcome, format) {
        (Ok(e), Format::Json) => {
            for line in &e.debug {
                eprintln!("debug: {line}");
            }
            println!(
                "{}",
                serde_json::json!({"results": e.results, "controls": e.controls})
            );
            Ok(true)
        }
        (Ok(e), Format::Text) => {
            print!("{}", text(&e));
            Ok(true)
        }
        (Err(e), Format::Json) => {
            println!("{}", e.to_json());
            Ok(false)
        }
        (Err(e), Format::Text) => {
            eprintln!("{}", e.render(&sources));
            Ok(false)
        }
    }
}

fn show(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "?".into())
}

fn text(e: &memtide_lang::Evaluation) -> String {
    let mut out = String::new();
    for line in &e.debug {
        let _ = writeln!(out, "debug: {line}");
    }
    for (i, r) in e.results.iter().enumerate() {
        let _ = writeln!(out, "form {}: {}", i + 1, show(r));
    }
    for (name, v) in &e.controls.host {
        let _ = writeln!(out, "Host.{name} = {}", show(v));
    }
    for (guest, controls) in &e.controls.guests {
        for (name, v) in controls {
            let _ = writeln!(out, "{guest}.{name} = {}", show(v));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use memtide_lang::Source;

    #[test]
    fn text_lists_results_then_controls() {
        let sources = [Source::new(
            "p",
            "(defvar a 1)\n(Host.Control \"ksm_run\" 1)\n",
        )];
        let e = Program::parse(&sources)
            .unwrap()
            .evaluate(&Input::default(), &Limits::default())
            .unwrap();
        assert_eq!(text(&e), "form 1: 1\nform 2: 1\nHost.ksm_run = 1\n");
    }
}
