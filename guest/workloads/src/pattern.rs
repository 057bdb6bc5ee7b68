//! Phase patterns: `SIZE_MIB:SECONDS,SIZE_MIB:SECONDS,...`.
//!
//! Only digits, `:` and `,` are used so that a pattern can be passed on the
//! kernel command line unquoted.

use std::fmt;
use std::time::Duration;

/// One step of a pattern: hold `size_mib` MiB for `secs` seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Phase {
    pub size_mib: u64,
    pub secs: u64,
}

impl Phase {
    pub fn size_bytes(&self) -> usize {
        // `parse` guarantees this fits.
        (self.size_mib << 20) as usize
    }

    pub fn duration(&self) -> Duration {
        Duration::from_secs(self.secs)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PatternError {
    Empty,
    /// `index` is 1-based, like the `phase=` field of report lines.
    BadPhase {
        index: usize,
        text: String,
        reason: &'static str,
    },
}

impl fmt::Display for PatternError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PatternError::Empty => write!(
                f,
                "empty pattern (expected SIZE_MIB:SECONDS[,SIZE_MIB:SECONDS...])"
            ),
            PatternError::BadPhase {
                index,
                text,
                reason,
            } => {
                write!(
                    f,
                    "phase {index} {text:?}: {reason} (expected SIZE_MIB:SECONDS, e.g. 200:30)"
                )
            }
        }
    }
}

impl std::error::Error for PatternError {}

/// Largest size accepted, so that byte counts never overflow (1 TiB).
const MAX_SIZE_MIB: u64 = 1 << 20;

pub fn parse(text: &str) -> Result<Vec<Phase>, PatternError> {
    if text.is_empty() {
        return Err(PatternError::Empty);
    }
    text.split(',')
        .enumerate()
        .map(|(i, item)| {
            let bad = |reason| PatternError::BadPhase {
                index: i + 1,
                text: item.to_string(),
                reason,
            };
            let (size, secs) = item.split_once(':').ok_or_else(|| bad("missing ':'"))?;
            let size_mib =
                parse_number(size).ok_or_else(|| bad("size is not a whole number of MiB"))?;
            let secs = parse_number(secs)
                .ok_or_else(|| bad("duration is not a whole number of seconds"))?;
            if size_mib > MAX_SIZE_MIB {
                return Err(bad("size is larger than 1 TiB"));
            }
            if secs == 0 {
                return Err(bad("duration must be at least 1 second"));
            }
            Ok(Phase { size_mib, secs })
        })
        .collect()
}

/// Plain decimal digits only: `u64::from_str` would also accept a leading `+`.
fn parse_number(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
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
        assert_eq!(parse(""), Err(PatternError::Empty));
    }

    fn reason(text: &str) -> (usize, &'static str) {
        match parse(text) {
            Err(PatternError::BadPhase { index, reason, .. }) => (index, reason),
            other => panic!("{text:?} parsed as {other:?}"),
        }
    }

    #[test]
    fn rejects_bad_phases_with_their_index() {
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
    fn error_messages_name_the_phase_and_the_format() {
        let msg = parse("200:30,x").unwrap_err().to_string();
        assert_eq!(
            msg,
            "phase 2 \"x\": missing ':' (expected SIZE_MIB:SECONDS, e.g. 200:30)"
        );
    }
}
