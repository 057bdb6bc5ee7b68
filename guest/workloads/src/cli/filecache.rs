//! filecache's options: `--set-mib N [--file PATH] [--block-kib K] [--interval-s S]`,
//! and the file set options it shares with mix.

use std::path::PathBuf;
use std::time::Duration;

use super::{mib, path, whole_number, Args, Command, Flag, INTERVAL};

/// Where a file set lives and how it is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSetOptions {
    /// The file holding the set, on the data disk.
    pub path: PathBuf,
    /// Bytes per read, a power of two from 4 KiB to 1 MiB.
    pub block_bytes: usize,
}

/// The data disk's mount point in the guest, see guest/init.
pub const DEFAULT_FILE: &str = "/data/fileset";
/// Reads of one page: each miss in the page cache costs one disk read.
pub const DEFAULT_BLOCK_KIB: u64 = 4;

/// The flags of [`FileSetOptions`].
pub(crate) const FILE_SET_FLAGS: [Flag; 2] = [Flag::Value("--file"), Flag::Value("--block-kib")];

/// Usage lines for the flags of [`FileSetOptions`].
pub(crate) const FILE_SET_USAGE: &str =
    "  --file PATH     the file holding the set (default /data/fileset, the data\n\
     \x20                 disk); created, or extended, by writing it on start\n\
     \x20 --block-kib K   bytes per read, a power of two from 4 to 1024 (default 4)";

impl FileSetOptions {
    pub(crate) fn from_args(args: &Args) -> Result<FileSetOptions, String> {
        let block_kib = args
            .value("--block-kib", |v| {
                whole_number(v)
                    .filter(|k| k.is_power_of_two() && (4..=1024).contains(k))
                    .ok_or_else(|| "expected a power of two from 4 to 1024".to_string())
            })?
            .unwrap_or(DEFAULT_BLOCK_KIB);
        Ok(FileSetOptions {
            path: args
                .value("--file", path)?
                .unwrap_or_else(|| PathBuf::from(DEFAULT_FILE)),
            block_bytes: (block_kib << 10) as usize,
        })
    }
}

/// What filecache reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// The size of the working set, read at random.
    pub set_mib: u64,
    /// Where the set lives and how it is read.
    pub file_set: FileSetOptions,
    /// How often a report line is printed.
    pub interval: Duration,
}

/// The usage text.
pub fn usage() -> String {
    format!(
        "usage: filecache --set-mib N [--file PATH] [--block-kib K] [--interval-s S]\n\
         \n\
         Reads random blocks of the first N MiB of a file through the page cache,\n\
         forever, printing one report line every S seconds (default 1).\n\
         {FILE_SET_USAGE}"
    )
}

/// Parses the arguments after the program name.
pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<Command<Options>, String> {
    let flags = [Flag::Value("--set-mib"), INTERVAL];
    let Some(args) = Args::split(args, &[&flags[..], &FILE_SET_FLAGS].concat())? else {
        return Ok(Command::Help);
    };
    args.no_positionals()?;
    Ok(Command::Run(Options {
        set_mib: args.required("--set-mib", |v| mib(v, 1))?,
        file_set: FileSetOptions::from_args(&args)?,
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
    fn defaults_and_overrides() {
        assert_eq!(
            parse_str("--set-mib 200"),
            Ok(Command::Run(Options {
                set_mib: 200,
                file_set: FileSetOptions {
                    path: PathBuf::from("/data/fileset"),
                    block_bytes: 4096,
                },
                interval: Duration::from_secs(1),
            }))
        );
        assert_eq!(
            parse_str("--block-kib 64 --file=/mnt/x --set-mib 1 --interval-s 3"),
            Ok(Command::Run(Options {
                set_mib: 1,
                file_set: FileSetOptions {
                    path: PathBuf::from("/mnt/x"),
                    block_bytes: 65536,
                },
                interval: Duration::from_secs(3),
            }))
        );
        assert_eq!(parse_str("--help"), Ok(Command::Help));
        assert!(usage().starts_with("usage: filecache "));
        assert!(usage().contains("\n  --block-kib K   bytes per read"));
    }

    fn err(args: &str) -> String {
        parse_str(args).unwrap_err()
    }

    #[test]
    fn usage_errors() {
        assert_eq!(err(""), "missing --set-mib");
        assert_eq!(
            err("--set-mib 0"),
            "--set-mib \"0\": expected a whole number of MiB from 1 to 1048576"
        );
        for bad in ["3", "2048", "12", "0", "x"] {
            assert_eq!(
                err(&format!("--set-mib 1 --block-kib {bad}")),
                format!("--block-kib {bad:?}: expected a power of two from 4 to 1024")
            );
        }
        assert_eq!(err("--set-mib 1 --file="), "--file \"\": expected a path");
        assert_eq!(
            err("--set-mib 1 /data/x"),
            "unexpected argument \"/data/x\""
        );
        assert_eq!(err("--set-mib 1 --once"), "unknown option \"--once\"");
    }
}
