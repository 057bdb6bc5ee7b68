//! memknobs' options: `[--once] [--interval-s N] SIZE_MIB:SECONDS[,...]`.

use std::time::Duration;

use super::{Args, Command, Flag, INTERVAL};
use crate::pattern::{self, Phase};

/// What memknobs runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// The buffer size of each phase.
    pub pattern: Vec<Phase>,
    /// How often a report line is printed.
    pub interval: Duration,
    /// Run the pattern once and exit instead of repeating it forever.
    pub once: bool,
}

/// The usage text.
pub fn usage() -> String {
    "usage: memknobs [--once] [--interval-s N] SIZE_MIB:SECONDS[,SIZE_MIB:SECONDS...]\n\
     \n\
     Writes to every page of the first SIZE_MIB MiB of an anonymous buffer, over\n\
     and over, for SECONDS per phase; runs the phases in order, repeating the\n\
     pattern forever unless --once, and prints one report line every N seconds\n\
     (default 1)."
        .to_string()
}

/// Parses the arguments after the program name.
pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<Command<Options>, String> {
    let Some(args) = Args::split(args, &[Flag::Switch("--once"), INTERVAL])? else {
        return Ok(Command::Help);
    };
    let interval = args.interval()?;
    let pattern = pattern::parse(args.single_positional("PATTERN")?).map_err(|e| e.to_string())?;
    Ok(Command::Run(Options {
        pattern,
        interval,
        once: args.switch("--once"),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::words;

    fn parse_str(args: &str) -> Result<Command<Options>, String> {
        parse(words(args))
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
        assert!(usage().starts_with("usage: memknobs "));
    }

    fn err(args: &str) -> String {
        parse_str(args).unwrap_err()
    }

    #[test]
    fn usage_errors() {
        assert_eq!(err(""), "missing PATTERN");
        assert_eq!(err("--once"), "missing PATTERN");
        assert_eq!(err("1:1 2:2"), "unexpected extra argument \"2:2\"");
        assert_eq!(err("--fast 1:1"), "unknown option \"--fast\"");
        assert_eq!(err("--once=yes 1:1"), "unknown option \"--once=yes\"");
        assert_eq!(err("1:1 --interval-s"), "--interval-s needs a value");
        assert!(err("--interval-s 0 1:1").contains(">= 1"));
        assert!(err("--interval-s 1.5 1:1").contains(">= 1"));
        assert!(err("200").starts_with("phase 1 \"200\": missing ':'"));
    }
}
