//! Options shared by all workloads: `NAME [--once] [--interval-s N] PATTERN`.

use std::time::Duration;

use crate::pattern::{self, Phase};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub pattern: Vec<Phase>,
    /// How often a report line is printed.
    pub interval: Duration,
    /// Run the pattern once and exit instead of repeating it forever.
    pub once: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Run(Options),
    Help,
}

pub fn usage(name: &str) -> String {
    format!(
        "usage: {name} [--once] [--interval-s N] SIZE_MIB:SECONDS[,SIZE_MIB:SECONDS...]\n\
         \n\
         Runs the phases in order, repeating the pattern forever unless --once,\n\
         and prints one report line every N seconds (default 1)."
    )
}

/// Parses the arguments after the program name; errors are one-line messages
/// meant to be printed together with `usage`.
pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<Command, String> {
    let mut once = false;
    let mut interval_s = 1;
    let mut pattern = None;
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let (flag, inline_value) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => {
                (flag.to_string(), Some(value.to_string()))
            }
            _ => (arg.clone(), None),
        };
        match flag.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "--once" if inline_value.is_none() => once = true,
            "--interval-s" => {
                let value = inline_value
                    .or_else(|| args.next())
                    .ok_or("--interval-s needs a value")?;
                interval_s = match value.parse::<u64>() {
                    Ok(n) if n > 0 => n,
                    _ => {
                        return Err(format!(
                            "--interval-s {value:?}: expected a whole number of seconds >= 1"
                        ))
                    }
                };
            }
            _ if arg.starts_with('-') => return Err(format!("unknown option {arg:?}")),
            _ if pattern.is_some() => return Err(format!("unexpected extra argument {arg:?}")),
            _ => pattern = Some(pattern::parse(&arg).map_err(|e| e.to_string())?),
        }
    }
    let pattern = pattern.ok_or("missing PATTERN")?;
    Ok(Command::Run(Options {
        pattern,
        interval: Duration::from_secs(interval_s),
        once,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(args: &str) -> Result<Command, String> {
        parse(args.split_whitespace().map(String::from))
    }

    fn run(args: &str) -> Options {
        match parse_str(args) {
            Ok(Command::Run(options)) => options,
            other => panic!("{args:?} parsed as {other:?}"),
        }
    }

    #[test]
    fn defaults() {
        let options = run("200:30");
        assert_eq!(
            options.pattern,
            vec![Phase {
                size_mib: 200,
                secs: 30
            }]
        );
        assert_eq!(options.interval, Duration::from_secs(1));
        assert!(!options.once);
    }

    #[test]
    fn options_in_any_order_and_both_value_forms() {
        let options = run("--interval-s 5 200:30 --once");
        assert_eq!(options.interval, Duration::from_secs(5));
        assert!(options.once);
        assert_eq!(run("--interval-s=3 1:1").interval, Duration::from_secs(3));
    }

    #[test]
    fn help() {
        assert_eq!(parse_str("--help 1:1"), Ok(Command::Help));
        assert_eq!(parse_str("-h"), Ok(Command::Help));
    }

    #[test]
    fn usage_errors() {
        assert_eq!(parse_str(""), Err("missing PATTERN".into()));
        assert_eq!(parse_str("--once"), Err("missing PATTERN".into()));
        assert_eq!(
            parse_str("1:1 2:2"),
            Err("unexpected extra argument \"2:2\"".into())
        );
        assert_eq!(
            parse_str("--fast 1:1"),
            Err("unknown option \"--fast\"".into())
        );
        assert_eq!(
            parse_str("--once=yes 1:1"),
            Err("unknown option \"--once=yes\"".into())
        );
        assert_eq!(
            parse_str("1:1 --interval-s"),
            Err("--interval-s needs a value".into())
        );
        assert!(parse_str("--interval-s 0 1:1")
            .unwrap_err()
            .contains(">= 1"));
        assert!(parse_str("--interval-s 1.5 1:1")
            .unwrap_err()
            .contains(">= 1"));
        assert!(parse_str("200")
            .unwrap_err()
            .starts_with("phase 1 \"200\": missing ':'"));
    }

    #[test]
    fn usage_names_the_program() {
        assert!(usage("memknobs").starts_with("usage: memknobs "));
    }
}
