//! mix's options: `--phases KIND:SIZE_MIB:SECONDS,... [--once] [--file PATH]
//! [--block-kib K] [--interval-s S]`.

use std::time::Duration;

use super::filecache::{FileSetOptions, FILE_SET_FLAGS, FILE_SET_USAGE};
use super::{Args, Command, Flag, INTERVAL};
use crate::pattern::{self, MixPhase};

/// What mix runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// What each phase works on, how much and how long.
    pub phases: Vec<MixPhase>,
    /// Where file phases read; used only when there is one.
    pub file_set: FileSetOptions,
    /// How often a report line is printed.
    pub interval: Duration,
    /// Run the phases once and exit instead of repeating them forever.
    pub once: bool,
}

/// The usage text.
pub fn usage() -> String {
    format!(
        "usage: mix --phases KIND:SIZE_MIB:SECONDS[,...] [--once] [--file PATH]\n\
         \x20          [--block-kib K] [--interval-s S]\n\
         \n\
         Runs the phases in order, repeating them forever unless --once: anon:N:T\n\
         writes to every page of N MiB of anonymous memory for T seconds, file:N:T\n\
         reads random blocks of the first N MiB of a file through the page cache,\n\
         hold:N:T writes every page of N MiB of anonymous memory once and keeps it,\n\
         untouched, until the program exits, idle:0:T sleeps. An anon phase's memory\n\
         is freed when the phase ends. Prints one report line every S seconds (default 1).\n\
         {FILE_SET_USAGE}"
    )
}

/// Parses the arguments after the program name.
pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<Command<Options>, String> {
    let flags = [Flag::Value("--phases"), Flag::Switch("--once"), INTERVAL];
    let Some(args) = Args::split(args, &[&flags[..], &FILE_SET_FLAGS].concat())? else {
        return Ok(Command::Help);
    };
    args.no_positionals()?;
    Ok(Command::Run(Options {
        phases: args.required("--phases", |v| {
            pattern::parse_mix(v).map_err(|e| e.to_string())
        })?,
        file_set: FileSetOptions::from_args(&args)?,
        interval: args.interval()?,
        once: args.switch("--once"),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::words;
    use crate::pattern::{Kind, Phase};

    fn parse_str(args: &str) -> Result<Command<Options>, String> {
        parse(words(args))
    }

    #[test]
    fn phases_and_options() {
        let Ok(Command::Run(options)) =
            parse_str("--phases anon:120:30,idle:0:20 --once --block-kib 16")
        else {
            panic!("rejected a valid command line");
        };
        assert_eq!(
            options.phases,
            [
                MixPhase {
                    kind: Kind::Anon,
                    phase: Phase {
                        size_mib: 120,
                        secs: 30
                    }
                },
                MixPhase {
                    kind: Kind::Idle,
                    phase: Phase {
                        size_mib: 0,
                        secs: 20
                    }
                }
            ]
        );
        assert!(options.once);
        assert_eq!(options.file_set.block_bytes, 16384);
        assert_eq!(options.interval, Duration::from_secs(1));
        assert_eq!(parse_str("-h"), Ok(Command::Help));
        assert!(usage().starts_with("usage: mix "));
    }

    fn err(args: &str) -> String {
        parse_str(args).unwrap_err()
    }

    #[test]
    fn usage_errors() {
        assert_eq!(err(""), "missing --phases");
        assert_eq!(err("anon:1:1"), "unexpected argument \"anon:1:1\"");
        assert_eq!(
            err("--phases anon:1:1,disk:1:1"),
            "--phases \"anon:1:1,disk:1:1\": phase 2 \"disk:1:1\": unknown kind \
             (expected KIND:SIZE_MIB:SECONDS[,...] with KIND anon, file, hold or idle, e.g. anon:120:30)"
        );
        assert_eq!(
            err("--phases file:1:1 --block-kib 5"),
            "--block-kib \"5\": expected a power of two from 4 to 1024"
        );
        assert!(err("--phases idle:0:1 --interval-s 0").contains(">= 1"));
    }
}
