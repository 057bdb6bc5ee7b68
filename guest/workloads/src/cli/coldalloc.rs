//! coldalloc's options: `--cold-mib N --hot-mib M [--cold-random-pct P] [--interval-s N]
//! [--resident-every K] [--cold-read-every R]`.

use std::time::Duration;

use super::{mib, whole_number, Args, Command, Flag, INTERVAL};

/// What coldalloc allocates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Written once, then left alone.
    pub cold_mib: u64,
    /// Written over and over.
    pub hot_mib: u64,
    /// Share of each cold page, in percent, filled with pseudo-random bytes (the rest
    /// zeros), so that a compressed swap tier sees data that compresses about as well
    /// as `100 / P` to one; 0 writes one word a page.
    pub cold_random_pct: u64,
    /// How often a report line is printed.
    pub interval: Duration,
    /// The cold part's residency is measured in every this many report lines (`?` in
    /// the others), never at 0: `mincore(2)` costs the process a lookup per page
    /// swapped out.
    pub resident_every: u64,
    /// A cold page is read after every this many MiB of hot pages written, the
    /// cold pages in turn; never at 0.
    pub cold_read_every: u64,
}

/// The usage text.
pub fn usage() -> String {
    "usage: coldalloc --cold-mib N --hot-mib M [--cold-random-pct P] [--interval-s S]\n\
     \x20                [--resident-every K] [--cold-read-every R]\n\
     \n\
     Allocates N MiB (counted in Committed_AS) and writes each page once (one\n\
     word, or P% of the page in pseudo-random bytes), then writes to every page\n\
     of a separate M MiB buffer over and over, forever, printing one report line\n\
     every S seconds (default 1), with how much of the N MiB is resident in every\n\
     Kth line (default 1; 0 never: measuring costs a lookup per page swapped out).\n\
     With R, one cold page is read after every R MiB of hot pages written, each\n\
     cold page in turn, so that cold memory comes back now and then (default 0:\n\
     never)."
        .to_string()
}

/// Parses the arguments after the program name.
pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<Command<Options>, String> {
    let flags = [
        Flag::Value("--cold-mib"),
        Flag::Value("--hot-mib"),
        Flag::Value("--cold-random-pct"),
        INTERVAL,
        Flag::Value("--resident-every"),
        Flag::Value("--cold-read-every"),
    ];
    let Some(args) = Args::split(args, &flags)? else {
        return Ok(Command::Help);
    };
    args.no_positionals()?;
    Ok(Command::Run(Options {
        cold_mib: args.required("--cold-mib", |v| mib(v, 0))?,
        hot_mib: args.required("--hot-mib", |v| mib(v, 1))?,
        cold_random_pct: args.value("--cold-random-pct", percent)?.unwrap_or(0),
        interval: args.interval()?,
        resident_every: args
            .value("--resident-every", |v| {
                whole_number(v).ok_or_else(|| "expected a whole number of lines".to_string())
            })?
            .unwrap_or(1),
        cold_read_every: args
            .value("--cold-read-every", |v| {
                whole_number(v).ok_or_else(|| "expected a whole number of MiB".to_string())
            })?
            .unwrap_or(0),
    }))
}

/// A whole percentage, 0 to 100.
fn percent(s: &str) -> Result<u64, String> {
    whole_number(s)
        .filter(|n| *n <= 100)
        .ok_or_else(|| "expected a whole percentage from 0 to 100".to_string())
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
            parse_str("--hot-mib 16 --cold-mib=200 --cold-random-pct 33 --interval-s 2"),
            Ok(Command::Run(Options {
                cold_mib: 200,
                hot_mib: 16,
                cold_random_pct: 33,
                interval: Duration::from_secs(2),
                resident_every: 1,
                cold_read_every: 0,
            }))
        );
        let Ok(Command::Run(options)) = parse_str("--cold-mib 0 --hot-mib 1") else {
            panic!("rejected a valid command line");
        };
        assert_eq!(
            (
                options.cold_mib,
                options.cold_random_pct,
                options.interval,
                options.resident_every
            ),
            (0, 0, Duration::from_secs(1), 1)
        );
        let Ok(Command::Run(options)) = parse_str("--cold-mib 0 --hot-mib 1 --resident-every 0")
        else {
            panic!("rejected a valid command line");
        };
        assert_eq!(options.resident_every, 0);
        let Ok(Command::Run(options)) = parse_str("--cold-mib 1 --hot-mib 1 --cold-read-every 512")
        else {
            panic!("rejected a valid command line");
        };
        assert_eq!(options.cold_read_every, 512);
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
        assert_eq!(
            err("--cold-mib 1 --hot-mib 1 --cold-random-pct 101"),
            "--cold-random-pct \"101\": expected a whole percentage from 0 to 100"
        );
        assert_eq!(err("--cold-mib"), "--cold-mib needs a value");
        assert_eq!(
            err("--cold-mib 1 --hot-mib 1 --resident-every -1"),
            "--resident-every \"-1\": expected a whole number of lines"
        );
    }
}
