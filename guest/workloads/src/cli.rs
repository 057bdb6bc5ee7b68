//! Command-line parsing shared by the workloads: `--flag VALUE` or
//! `--flag=VALUE`, switches, `-h`/`--help` and positional arguments, checked
//! against the flags a workload declares. Each workload's options live in a
//! submodule. Errors are one-line messages meant to be printed with the
//! workload's usage text.

pub mod coldalloc;
pub mod filecache;
pub mod memknobs;
pub mod mix;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command<T> {
    /// Run the workload with these options.
    Run(T),
    /// Print the usage text.
    Help,
}

/// Parses the process's arguments with a workload's `parse`; on `--help`
/// prints `usage` and gives exit status 0, on a usage error prints the error
/// and `usage` to stderr and gives exit status 2.
pub fn from_env<T>(
    name: &str,
    parse: fn(std::iter::Skip<std::env::Args>) -> Result<Command<T>, String>,
    usage: fn() -> String,
) -> Result<T, ExitCode> {
    match parse(std::env::args().skip(1)) {
        Ok(Command::Run(options)) => Ok(options),
        Ok(Command::Help) => {
            println!("{}", usage());
            Err(ExitCode::SUCCESS)
        }
        Err(message) => {
            eprintln!("{name}: {message}\n{}", usage());
            Err(ExitCode::from(2))
        }
    }
}

/// Largest size accepted, so that byte counts never overflow (1 TiB).
pub const MAX_MIB: u64 = 1 << 20;

/// A flag a workload accepts.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Flag {
    /// `--name`, present or not.
    Switch(&'static str),
    /// `--name VALUE` or `--name=VALUE`.
    Value(&'static str),
}

impl Flag {
    fn name(self) -> &'static str {
        match self {
            Flag::Switch(name) | Flag::Value(name) => name,
        }
    }
}

/// `--interval-s N`, accepted by every workload.
pub(crate) const INTERVAL: Flag = Flag::Value("--interval-s");

/// The arguments, split into flags and positionals but not yet interpreted.
#[derive(Debug)]
pub(crate) struct Args {
    /// Flags given, with their value (`None` for switches), in order.
    flags: Vec<(&'static str, Option<String>)>,
    positionals: Vec<String>,
}

impl Args {
    /// Splits `args` by the `accepted` flags; `Ok(None)` when help is asked
    /// for. A flag may be given once.
    pub(crate) fn split<I: IntoIterator<Item = String>>(
        args: I,
        accepted: &[Flag],
    ) -> Result<Option<Args>, String> {
        let mut parsed = Args {
            flags: Vec::new(),
            positionals: Vec::new(),
        };
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            if arg == "-h" || arg == "--help" {
                return Ok(None);
            }
            if !arg.starts_with('-') {
                parsed.positionals.push(arg);
                continue;
            }
            let (name, inline_value) = match arg.split_once('=') {
                Some((name, value)) => (name, Some(value.to_string())),
                None => (arg.as_str(), None),
            };
            let flag = accepted
                .iter()
                .find(|flag| flag.name() == name)
                .filter(|flag| matches!(flag, Flag::Value(_)) || inline_value.is_none())
                .ok_or_else(|| format!("unknown option {arg:?}"))?;
            let value = match flag {
                Flag::Switch(_) => None,
                Flag::Value(name) => Some(
                    inline_value
                        .or_else(|| args.next())
                        .ok_or_else(|| format!("{name} needs a value"))?,
                ),
            };
            if parsed.flags.iter().any(|(seen, _)| *seen == flag.name()) {
                return Err(format!("{} given twice", flag.name()));
            }
            parsed.flags.push((flag.name(), value));
        }
        Ok(Some(parsed))
    }

    /// Whether switch `name` was given.
    pub(crate) fn switch(&self, name: &str) -> bool {
        self.flags.iter().any(|(seen, _)| *seen == name)
    }

    /// The value of flag `name` converted by `convert`, whose error says what
    /// is wrong with it (e.g. "expected ..."); `None` when the flag is absent.
    pub(crate) fn value<T>(
        &self,
        name: &str,
        convert: impl Fn(&str) -> Result<T, String>,
    ) -> Result<Option<T>, String> {
        let Some((_, Some(value))) = self.flags.iter().find(|(seen, _)| *seen == name) else {
            return Ok(None);
        };
        convert(value)
            .map(Some)
            .map_err(|problem| format!("{name} {value:?}: {problem}"))
    }

    /// Like `value`, but the flag must be given.
    pub(crate) fn required<T>(
        &self,
        name: &str,
        convert: impl Fn(&str) -> Result<T, String>,
    ) -> Result<T, String> {
        self.value(name, convert)?
            .ok_or_else(|| format!("missing {name}"))
    }

    /// The only positional argument, named `what` in errors.
    pub(crate) fn single_positional(&self, what: &str) -> Result<&str, String> {
        match self.positionals.as_slice() {
            [] => Err(format!("missing {what}")),
            [only] => Ok(only),
            [_, extra, ..] => Err(format!("unexpected extra argument {extra:?}")),
        }
    }

    /// Fails if there are positional arguments.
    pub(crate) fn no_positionals(&self) -> Result<(), String> {
        match self.positionals.first() {
            Some(extra) => Err(format!("unexpected argument {extra:?}")),
            None => Ok(()),
        }
    }

    /// `--interval-s`, 1 second when absent.
    pub(crate) fn interval(&self) -> Result<Duration, String> {
        let secs = self.value(INTERVAL.name(), |v| {
            at_least(v, 1, "a whole number of seconds >= 1")
        })?;
        Ok(Duration::from_secs(secs.unwrap_or(1)))
    }
}

/// Plain decimal digits only: `u64::from_str` would also accept a leading `+`.
pub(crate) fn whole_number(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// A whole number `>= min`; `what` describes it for the error.
pub(crate) fn at_least(s: &str, min: u64, what: &str) -> Result<u64, String> {
    whole_number(s)
        .filter(|n| *n >= min)
        .ok_or_else(|| format!("expected {what}"))
}

/// A size in MiB, at least `min`, at most [`MAX_MIB`].
pub(crate) fn mib(s: &str, min: u64) -> Result<u64, String> {
    whole_number(s)
        .filter(|n| (min..=MAX_MIB).contains(n))
        .ok_or_else(|| format!("expected a whole number of MiB from {min} to {MAX_MIB}"))
}

/// A non-empty path.
pub(crate) fn path(s: &str) -> Result<PathBuf, String> {
    if s.is_empty() {
        return Err("expected a path".to_string());
    }
    Ok(PathBuf::from(s))
}

/// Splits a test's command line at whitespace.
#[cfg(test)]
pub(crate) fn words(args: &str) -> Vec<String> {
    args.split_whitespace().map(String::from).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLAGS: &[Flag] = &[Flag::Switch("--once"), Flag::Value("--size"), INTERVAL];

    fn split(args: &str) -> Result<Option<Args>, String> {
        Args::split(words(args), FLAGS)
    }

    fn args(line: &str) -> Args {
        split(line).unwrap().expect("not help")
    }

    #[test]
    fn flags_in_both_forms_and_positionals_in_any_order() {
        let a = args("x --size 3 --once y");
        assert!(a.switch("--once"));
        assert_eq!(a.value("--size", |v| mib(v, 0)), Ok(Some(3)));
        assert_eq!(a.positionals, ["x", "y"]);
        assert_eq!(args("--size=4").required("--size", |v| mib(v, 0)), Ok(4));
        assert!(!args("").switch("--once"));
    }

    #[test]
    fn help_stops_parsing() {
        assert!(split("--bogus -h").is_err());
        assert!(split("-h --bogus").unwrap().is_none());
        assert!(split("x --help").unwrap().is_none());
    }

    #[test]
    fn unknown_repeated_or_incomplete_flags() {
        let err = |line| split(line).unwrap_err();
        assert_eq!(err("--fast"), "unknown option \"--fast\"");
        assert_eq!(err("-s 3"), "unknown option \"-s\"");
        assert_eq!(err("--once=yes"), "unknown option \"--once=yes\"");
        assert_eq!(err("--size"), "--size needs a value");
        assert_eq!(err("--once --once"), "--once given twice");
        assert_eq!(err("--size 1 --size=2"), "--size given twice");
    }

    #[test]
    fn values_are_checked() {
        let a = args("--size 12x");
        assert_eq!(
            a.value("--size", |v| mib(v, 0)),
            Err("--size \"12x\": expected a whole number of MiB from 0 to 1048576".into())
        );
        assert_eq!(
            args("").required("--size", |v| mib(v, 0)),
            Err("missing --size".into())
        );
        assert_eq!(
            args("--size=").value("--size", path),
            Err("--size \"\": expected a path".into())
        );
    }

    #[test]
    fn interval_defaults_to_a_second() {
        assert_eq!(args("").interval(), Ok(Duration::from_secs(1)));
        assert_eq!(
            args("--interval-s 5").interval(),
            Ok(Duration::from_secs(5))
        );
        for bad in ["0", "1.5", "-1", "+2", ""] {
            assert_eq!(
                args(&format!("--interval-s={bad}")).interval(),
                Err(format!(
                    "--interval-s {bad:?}: expected a whole number of seconds >= 1"
                ))
            );
        }
    }

    #[test]
    fn positionals() {
        assert_eq!(args("a").single_positional("X"), Ok("a"));
        assert_eq!(args("").single_positional("X"), Err("missing X".into()));
        assert_eq!(
            args("a b").single_positional("X"),
            Err("unexpected extra argument \"b\"".into())
        );
        assert_eq!(args("").no_positionals(), Ok(()));
        assert_eq!(
            args("a").no_positionals(),
            Err("unexpected argument \"a\"".into())
        );
    }

    #[test]
    fn numbers() {
        assert_eq!(whole_number("007"), Some(7));
        for bad in ["", "+1", "-1", "1.0", " 1", "99999999999999999999"] {
            assert_eq!(whole_number(bad), None, "{bad:?}");
        }
        assert_eq!(mib("1048576", 1), Ok(MAX_MIB));
        assert!(mib("1048577", 1).is_err());
        assert!(mib("0", 1).is_err());
        assert_eq!(at_least("3", 3, "x"), Ok(3));
        assert_eq!(at_least("2", 3, "x"), Err("expected x".into()));
    }
}
