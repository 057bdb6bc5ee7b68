//! `memtide policy check` and `memtide policy eval`: policies outside the daemon.

use crate::{policies, stdout};
use memtide_lang::{control_value, Controls, ErrorKind, Input, Limits, Program, Value};
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

/// Parse and check `paths` (files, or directories of `*.policy` files); print each
/// problem as `file:line:col: message` with the line and a caret: each file's syntax
/// error, else the first error of the program they make. Returns whether they are fine.
pub fn check(paths: &[PathBuf]) -> bool {
    let sources = match policies::files(paths).and_then(|files| policies::read(&files)) {
        Ok(sources) => sources,
        Err(e) => {
            eprintln!("{e}");
            return false;
        }
    };
    // Each file on its own first, so that every broken file is reported.
    let errors: Vec<String> = sources
        .iter()
        .filter_map(|source| Program::parse(std::slice::from_ref(source)).err())
        .map(|e| e.render(&sources))
        .collect();
    let errors = match errors.is_empty() {
        true => policies::parse(&sources).err().map(|e| vec![e.0]),
        false => Some(errors),
    };
    match errors {
        None => {
            let names: Vec<_> = sources.iter().map(|s| s.name.as_str()).collect();
            // Checked whether or not anyone reads it (`| head`: crate::stdout).
            let _ = stdout::println(format_args!("{}: ok", names.join(", ")));
            true
        }
        Some(errors) => {
            for e in errors {
                eprintln!("{e}");
            }
            false
        }
    }
}

/// Evaluate `paths` (files, or directories of `*.policy` files) once over the snapshot
/// in `input` (empty Host and Guests without it) and print the results and requested
/// controls on standard output; `debug` lines, and warnings of controls the daemon
/// would refuse, go to standard error. Returns whether evaluation succeeded.
pub fn eval(paths: &[PathBuf], input: Option<&Path>, format: Format) -> anyhow::Result<bool> {
    let given = input.is_some();
    let input: Input = match input {
        Some(path) => {
            let text = crate::text_file::read(path)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            let json: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            // serde takes a struct from an array too, by position: `[]` read as empty.
            if !json.is_object() {
                anyhow::bail!(
                    "{}: not a snapshot: a JSON object with \"host\" and \"guests\" expected",
                    path.display()
                );
            }
            serde_json::from_value(json).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        }
        None => Input::default(),
    };
    // Controls are keyed by the guest's name (`#` and its position for a guest without
    // one): a second guest of a key would take the first's (found by an audit: a guest
    // named "#0" beside an unnamed first guest had their controls merged).
    let mut named = std::collections::BTreeMap::new();
    for (i, guest) in input.guests.iter().enumerate() {
        let name = guest.guest_name(i);
        if let Some(first) = named.insert(name.clone(), i) {
            anyhow::bail!("--input: guests {first} and {i} are both named {name:?}");
        }
    }
    let sources = policies::read(&policies::files(paths)?)?;
    let outcome = Program::parse(&sources)
        .and_then(|p| p.check().map(|()| p))
        .and_then(|p| p.evaluate(&input, &Limits::default()));
    let debug = match &outcome {
        Ok(e) => &e.debug,
        Err(e) => &e.debug,
    };
    for line in debug {
        eprintln!("debug: {line}");
    }
    let e = match outcome {
        Ok(e) => e,
        Err(e) => {
            match format {
                Format::Json => stdout::println(e.to_json())?,
                Format::Text => eprintln!("{}", e.render(&sources)),
            }
            if !given && may_come_from_no_input(&e.kind) {
                eprintln!(
                    "note: evaluated without --input: Host has no figures and there are no \
                     guests, which may be the cause (give a snapshot: --input FILE, \
                     docs/policy-language.md)"
                );
            }
            return Ok(false);
        }
    };
    match format {
        Format::Json => {
            stdout::println(serde_json::json!({"results": e.results, "controls": e.controls}))?
        }
        Format::Text => stdout::print(text(&e))?,
    }
    for warning in refused_controls(&e.controls) {
        eprintln!("warning: {warning}");
    }
    Ok(true)
}

/// Whether an evaluation over the empty input may have failed for want of figures: a
/// nil where a number or entity was wanted (a statistic not collected), a field or
/// property the input lacks, or a division by a count or sum of no guests.
fn may_come_from_no_input(kind: &ErrorKind) -> bool {
    match kind {
        ErrorKind::UnknownField(_) | ErrorKind::UnknownProperty(_) | ErrorKind::NoSamples(_) => {
            true
        }
        ErrorKind::DivisionByZero => true,
        ErrorKind::Operands { left, right, .. } => *left == "nil" || *right == "nil",
        ErrorKind::Incomparable(left, right) => *left == "nil" || *right == "nil",
        ErrorKind::TypeMismatch { got, .. } | ErrorKind::NotAnEntity { got, .. } => *got == "nil",
        _ => false,
    }
}

/// Why the daemon would refuse each control request it would refuse (see
/// [`control_value`]).
fn refused_controls(controls: &Controls) -> Vec<String> {
    let mut out = Vec::new();
    for (name, v) in &controls.host {
        if let Err(problem) = control_value(name, v) {
            out.push(format!(
                "Host: {problem}; the daemon would drop the whole KSM proposal"
            ));
        }
    }
    for (guest, requests) in &controls.guests {
        for (name, v) in requests {
            if let Err(problem) = control_value(name, v) {
                out.push(format!("{guest}: {problem}; the daemon would not apply it"));
            }
        }
    }
    out
}

fn show(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "?".into())
}

fn text(e: &memtide_lang::Evaluation) -> String {
    let mut out = String::new();
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
        assert_eq!(text(&e), "form 1: 1\nform 2: null\nHost.ksm_run = 1\n");
    }
}
