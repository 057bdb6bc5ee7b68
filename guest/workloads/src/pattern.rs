//! Phase patterns: `SIZE_MIB:SECONDS,...` (memknobs) and
//! `KIND:SIZE_MIB:SECONDS,...` (mix).
//!
//! Only letters, digits, `:` and `,` are used so that a pattern can be passed
//! on the kernel command line unquoted.

use std::fmt;
use std::time::Duration;

use crate::cli::{whole_number, MAX_MIB};

/// One step of a pattern: hold `size_mib` MiB for `secs` seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Phase {
    pub size_mib: u64,
    pub secs: u64,
}

impl Phase {
    /// The size in bytes.
    pub fn size_bytes(&self) -> usize {
        // `parse` guarantees this fits.
        (self.size_mib << 20) as usize
    }

    /// How long the phase lasts.
    pub fn duration(&self) -> Duration {
        Duration::from_secs(self.secs)
    }
}

/// What a mix phase works on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Anonymous memory, written like memknobs does.
    Anon,
    /// Page cache: random reads of a file.
    File,
    /// Nothing: the process sleeps, holding no anonymous memory.
    Idle,
    /// Anonymous memory written once and then kept, untouched, until the
    /// program exits: a service's heap filled at start-up and never read again.
    Hold,
}

impl Kind {
    /// The name used in patterns and report lines.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Anon => "anon",
            Kind::File => "file",
            Kind::Idle => "idle",
            Kind::Hold => "hold",
        }
    }
}

/// One step of a mix pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MixPhase {
    pub kind: Kind,
    /// Its size (0 when idle) and duration.
    pub phase: Phase,
}

/// Why a pattern was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PatternError {
    /// The pattern is the empty string.
    Empty { expected: &'static str },
    /// `index` is 1-based, like the `phase=` field of report lines.
    BadPhase {
        index: usize,
        text: String,
        reason: &'static str,
        expected: &'static str,
    },
}

impl fmt::Display for PatternError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PatternError::Empty { expected } => write!(f, "empty pattern (expected {expected})"),
            PatternError::BadPhase {
                index,
                text,
                reason,
                expected,
            } => write!(f, "phase {index} {text:?}: {reason} (expected {expected})"),
        }
    }
}

impl std::error::Error for PatternError {}

const SIZED: &str = "SIZE_MIB:SECONDS[,SIZE_MIB:SECONDS...], e.g. 200:30";
const MIXED: &str =
    "KIND:SIZE_MIB:SECONDS[,...] with KIND anon, file, hold or idle, e.g. anon:120:30";

/// Parses a memknobs pattern, `SIZE_MIB:SECONDS[,SIZE_MIB:SECONDS...]`.
pub fn parse(text: &str) -> Result<Vec<Phase>, PatternError> {
    parse_items(text, SIZED, |item| {
        let (size, secs) = item.split_once(':').ok_or("missing ':'")?;
        sized(size, secs)
    })
}

/// Parses a mix pattern, `KIND:SIZE_MIB:SECONDS[,...]`: `anon`, `file` and
/// `hold` phases have a size of at least 1 MiB, `idle` ones a size of 0.
pub fn parse_mix(text: &str) -> Result<Vec<MixPhase>, PatternError> {
    parse_items(text, MIXED, |item| {
        let (kind, rest) = item.split_once(':').ok_or("missing ':'")?;
        let kind = match kind {
            "anon" => Kind::Anon,
            "file" => Kind::File,
            "idle" => Kind::Idle,
            "hold" => Kind::Hold,
            _ => return Err("unknown kind"),
        };
        let (size, secs) = rest.split_once(':').ok_or("missing second ':'")?;
        let phase = sized(size, secs)?;
        match (kind, phase.size_mib) {
            (Kind::Idle, 1..) => Err("an idle phase holds nothing: its size must be 0"),
            (Kind::Anon | Kind::File | Kind::Hold, 0) => Err("size must be at least 1 MiB"),
            _ => Ok(MixPhase { kind, phase }),
        }
    })
}

fn parse_items<T>(
    text: &str,
    expected: &'static str,
    item: impl Fn(&str) -> Result<T, &'static str>,
) -> Result<Vec<T>, PatternError> {
    if text.is_empty() {
        return Err(PatternError::Empty { expected });
    }
    text.split(',')
        .enumerate()
        .map(|(i, text)| {
            item(text).map_err(|reason| PatternError::BadPhase {
                index: i + 1,
                text: text.to_string(),
                reason,
                expected,
            })
        })
        .collect()
}

fn sized(size: &str, secs: &str) -> Result<Phase, &'static str> {
    let size_mib = whole_number(size).ok_or("size is not a whole number of MiB")?;
    let secs = whole_number(secs).ok_or("duration is not a whole number of seconds")?;
    if size_mib > MAX_MIB {
        return Err("size is larger than 1 TiB");
    }
    if secs == 0 {
        return Err("duration must be at least 1 second");
    }
    Ok(Phase { size_mib, secs })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phase(size_mib: u64, secs: u64) -> Phase {
        Phase { size_mib, secs }
    }

    #[test]
    fn parses_phases_in_order() {
        assert_eq!(
            parse("200:30,100:30").unwrap(),
            vec![phase(200, 30), phase(100, 30)]
        );
        assert_eq!(parse("0:5").unwrap(), vec![phase(0, 5)]);
    }

    #[test]
    fn phase_sizes_and_durations() {
        assert_eq!(phase(3, 7).size_bytes(), 3 * 1024 * 1024);
        assert_eq!(phase(3, 7).duration(), Duration::from_secs(7));
    }

    #[test]
    fn rejects_empty_pattern() {
        assert_eq!(parse(""), Err(PatternError::Empty { expected: SIZED }));
        assert_eq!(parse_mix(""), Err(PatternError::Empty { expected: MIXED }));
    }

    fn reason<T: fmt::Debug>(result: Result<T, PatternError>) -> (usize, &'static str) {
        match result {
            Err(PatternError::BadPhase { index, reason, .. }) => (index, reason),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn rejects_bad_phases_with_their_index() {
        let reason = |text| reason(parse(text));
        assert_eq!(reason("200"), (1, "missing ':'"));
        assert_eq!(reason("200:30,"), (2, "missing ':'"));
        assert_eq!(reason("200:30,,100:30").0, 2);
        assert_eq!(reason("abc:30"), (1, "size is not a whole number of MiB"));
        assert_eq!(reason(":30"), (1, "size is not a whole number of MiB"));
        assert_eq!(reason("-1:30"), (1, "size is not a whole number of MiB"));
        assert_eq!(reason("+1:30"), (1, "size is not a whole number of MiB"));
        assert_eq!(reason("1.5:30"), (1, "size is not a whole number of MiB"));
        assert_eq!(
            reason("200:1.5"),
            (1, "duration is not a whole number of seconds")
        );
        assert_eq!(
            reason("200:30:4"),
            (1, "duration is not a whole number of seconds")
        );
        assert_eq!(reason("200 :30"), (1, "size is not a whole number of MiB"));
        assert_eq!(reason("200:0"), (1, "duration must be at least 1 second"));
        assert_eq!(reason("2000000:1"), (1, "size is larger than 1 TiB"));
        assert_eq!(
            reason("99999999999999999999:1"),
            (1, "size is not a whole number of MiB")
        );
    }

    #[test]
    fn parses_mix_phases() {
        let mix = |kind, size_mib, secs| MixPhase {
            kind,
            phase: phase(size_mib, secs),
        };
        assert_eq!(
            parse_mix("anon:120:30,file:80:30,hold:64:5,idle:0:20").unwrap(),
            vec![
                mix(Kind::Anon, 120, 30),
                mix(Kind::File, 80, 30),
                mix(Kind::Hold, 64, 5),
                mix(Kind::Idle, 0, 20)
            ]
        );
        assert_eq!(
            [Kind::Anon, Kind::File, Kind::Hold, Kind::Idle].map(Kind::name),
            ["anon", "file", "hold", "idle"]
        );
    }

    #[test]
    fn rejects_bad_mix_phases() {
        let reason = |text| reason(parse_mix(text));
        assert_eq!(reason("anon:1:1,swap:1:1"), (2, "unknown kind"));
        assert_eq!(reason("Anon:1:1"), (1, "unknown kind"));
        assert_eq!(reason("120:30"), (1, "unknown kind"));
        assert_eq!(reason("anon"), (1, "missing ':'"));
        assert_eq!(reason("anon:120"), (1, "missing second ':'"));
        assert_eq!(reason("file:x:1"), (1, "size is not a whole number of MiB"));
        assert_eq!(
            reason("file:1:0"),
            (1, "duration must be at least 1 second")
        );
        assert_eq!(
            reason("file:1:1:1"),
            (1, "duration is not a whole number of seconds")
        );
        assert_eq!(
            reason("idle:5:20"),
            (1, "an idle phase holds nothing: its size must be 0")
        );
        assert_eq!(reason("anon:0:20"), (1, "size must be at least 1 MiB"));
        assert_eq!(reason("file:0:20"), (1, "size must be at least 1 MiB"));
        assert_eq!(reason("hold:0:20"), (1, "size must be at least 1 MiB"));
    }

    #[test]
    fn error_messages_name_the_phase_and_the_format() {
        assert_eq!(
            parse("200:30,x").unwrap_err().to_string(),
            "phase 2 \"x\": missing ':' (expected SIZE_MIB:SECONDS[,SIZE_MIB:SECONDS...], e.g. 200:30)"
        );
        assert_eq!(
            parse_mix("idle:1:1").unwrap_err().to_string(),
            "phase 1 \"idle:1:1\": an idle phase holds nothing: its size must be 0 \
             (expected KIND:SIZE_MIB:SECONDS[,...] with KIND anon, file, hold or idle, e.g. anon:120:30)"
        );
    }
}
