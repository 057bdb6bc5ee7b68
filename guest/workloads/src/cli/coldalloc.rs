//! coldalloc's options: `--cold-mib N --hot-mib M [--interval-s N]`.

use std::time::Duration;

use super::{mib, Args, Command, Flag, INTERVAL};

/// What coldalloc allocates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Written once, then left alone.
    pub cold_mib: u64,
    /// Written over and over.
    pub hot_mib: u64,
    /// How often a report line is printed.
    pub interval: Duration,
}

/// The usage text.
pub fn usage() -> String {
    "usage: coldalloc --cold-mib N --hot-mib M [--interval-s S]\n\
     \n\
     Allocates N MiB (counted in Committed_AS) and writes each page once, then\n\
     writes to every page of a separate M MiB buffer over and over, forever,\n\
     printing one report line every S seconds (default 1)."
        .to_string()
}

/// Parses the arguments after the program name.
pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<Command<Options>, String> {
    let flags = [
        Flag::Value("--cold-mib"),
        Flag::Value("--hot-mib"),
        INTERVAL,
    ];
    let Some(args) = Args::split(args, &flags)? else {
        return Ok(Command::Help);
    };
    args.no_positionals()?;
    Ok(Command::Run(Options {
        cold_mib: args.required("--cold-mib", |v| mib(v, 0))?,
        hot_mib: args.required("--hot-mib", |v| mib(v, 1))?,
        interval: args.interval()?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::words;

    fn parse_str(args: &str) -> Result<Command<Options>, String> {
        parse(words(args))
    }

    #[test]
    fn sizes_and_interval() {
        assert_eq!(
            parse_str("--hot-mib 16 --cold-mib=200 --interval-s 2"),
            Ok(Command::Run(Options {
                cold_mib: 200,
                hot_mib: 16,
                interval: Duration::from_secs(2),
            }))
        );
        let Ok(Command::Run(options)) = parse_str("--cold-mib 0 --hot-mib 1") else {
            panic!("rejected a valid command line");
        };
        assert_eq!(
            (options.cold_mib, options.interval),
            (0, Duration::from_secs(1))
        );
        assert_eq!(parse_str("--cold-mib 1 -h"), Ok(Command::Help));
        assert!(usage().starts_with("usage: coldalloc "));
    }

    fn err(args: &str) -> String {
        parse_str(args).unwrap_err()
    }

    #[test]
    fn usage_errors() {
        assert_eq!(err("--hot-mib 16"), "missing --cold-mib");
        assert_eq!(err("--cold-mib 16"), "missing --hot-mib");
        assert_eq!(
            err("--cold-mib 16 --hot-mib 0"),
            "--hot-mib \"0\": expected a whole number of MiB from 1 to 1048576"
        );
        assert_eq!(
            err("--cold-mib 1G --hot-mib 1"),
            "--cold-mib \"1G\": expected a whole number of MiB from 0 to 1048576"
        );
        assert_eq!(
            err("--cold-mib 1 --hot-mib 1 200:30"),
            "unexpected argument \"200:30\""
        );
        assert_eq!(
            err("--cold-mib 1 --hot-mib 1 --once"),
            "unknown option \"--once\""
        );
        assert_eq!(err("--cold-mib 1 --cold-mib 2"), "--cold-mib given twice");
        assert_eq!(err("--cold-mib"), "--cold-mib needs a value");
    }
}
