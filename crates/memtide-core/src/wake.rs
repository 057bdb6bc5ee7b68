//! Waking hibernated VMs on a schedule: times of day (UTC) at which a VM that is
//! hibernated is woken. Pure: the daemon gives the time the VM was hibernated and the
//! time now (seconds since the Unix epoch), and wakes it when a time of day fell between.

use serde::{Deserialize, Serialize};
use std::fmt;

const DAY: u64 = 86_400;

/// A time of day, UTC, written `HH:MM` (`00:00` to `23:59`), or `HH:MM:SS` to the second.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TimeOfDay {
    /// Seconds after midnight.
    secs: u32,
}

impl TimeOfDay {
    /// `text` as `HH:MM` or `HH:MM:SS`, or why it is neither.
    pub fn parse(text: &str) -> Result<TimeOfDay, String> {
        let bad =
            || format!("{text:?} is not a time of day HH:MM or HH:MM:SS (00:00 to 23:59:59, UTC)");
        let two_digits = |s: &str| -> Option<u32> {
            (s.len() == 2 && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse().ok())?
        };
        let fields: Vec<Option<u32>> = text.split(':').map(two_digits).collect();
        match fields[..] {
            [Some(h), Some(m)] if h < 24 && m < 60 => Ok(TimeOfDay {
                secs: h * 3600 + m * 60,
            }),
            [Some(h), Some(m), Some(s)] if h < 24 && m < 60 && s < 60 => Ok(TimeOfDay {
                secs: h * 3600 + m * 60 + s,
            }),
            _ => Err(bad()),
        }
    }
}

impl TryFrom<String> for TimeOfDay {
    type Error = String;
    fn try_from(text: String) -> Result<Self, String> {
        TimeOfDay::parse(&text)
    }
}

impl From<TimeOfDay> for String {
    fn from(t: TimeOfDay) -> String {
        t.to_string()
    }
}

impl fmt::Display for TimeOfDay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:02}:{:02}", self.secs / 3600, self.secs / 60 % 60)?;
        match self.secs % 60 {
            0 => Ok(()),
            s => write!(f, ":{s:02}"),
        }
    }
}

/// The latest moment (seconds since the epoch) in `(since, now]` at which one of `times`
/// fell, if any: a VM hibernated at `since` is due to be woken then.
pub fn due(times: &[TimeOfDay], since: u64, now: u64) -> Option<u64> {
    let midnight = now - now % DAY;
    times
        .iter()
        .map(|t| {
            // Today's, or yesterday's if today's is still to come.
            let today = midnight + u64::from(t.secs);
            if today <= now {
                today
            } else {
                today.saturating_sub(DAY)
            }
        })
        .filter(|at| *at > since)
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seconds since the epoch at `day` days past it, `h`:`m` UTC.
    fn at(day: u64, h: u64, m: u64) -> u64 {
        day * DAY + h * 3600 + m * 60
    }

    fn times(list: &[&str]) -> Vec<TimeOfDay> {
        list.iter().map(|t| TimeOfDay::parse(t).unwrap()).collect()
    }

    #[test]
    fn a_vm_is_due_once_a_time_of_day_has_passed_since_it_was_hibernated() {
        let wake = times(&["07:30", "13:00"]);
        let slept = at(100, 22, 15);
        // The night through: not due.
        assert_eq!(due(&wake, slept, at(100, 23, 59)), None);
        assert_eq!(due(&wake, slept, at(101, 7, 29)), None);
        // 07:30 the next morning, and any time after it.
        assert_eq!(due(&wake, slept, at(101, 7, 30)), Some(at(101, 7, 30)));
        assert_eq!(due(&wake, slept, at(101, 9, 0)), Some(at(101, 7, 30)));
        // Past 13:00 too (a daemon that was down): the latest time is given.
        assert_eq!(due(&wake, slept, at(101, 14, 0)), Some(at(101, 13, 0)));
        // Days later: still due, by the latest time passed.
        assert_eq!(due(&wake, slept, at(104, 8, 0)), Some(at(104, 7, 30)));
        // Hibernated at 07:30 exactly, or after: that morning's time does not count.
        assert_eq!(due(&wake, at(101, 7, 30), at(101, 12, 59)), None);
        assert_eq!(
            due(&wake, at(101, 7, 30), at(101, 13, 0)),
            Some(at(101, 13, 0))
        );
        // No times: never.
        assert_eq!(due(&[], slept, at(110, 0, 0)), None);
    }

    #[test]
    fn times_of_day_are_hh_mm_or_hh_mm_ss_within_a_day() {
        assert_eq!(TimeOfDay::parse("00:00").unwrap().to_string(), "00:00");
        assert_eq!(TimeOfDay::parse("23:59").unwrap().to_string(), "23:59");
        assert_eq!(
            TimeOfDay::parse("23:59:59").unwrap().to_string(),
            "23:59:59"
        );
        assert_eq!(
            TimeOfDay::parse("07:30:00").unwrap(),
            TimeOfDay::parse("07:30").unwrap()
        );
        let (m, s) = (
            TimeOfDay::parse("07:30").unwrap(),
            TimeOfDay::parse("07:30:20").unwrap(),
        );
        assert_eq!(due(&[s], at(1, 7, 30), at(1, 7, 30) + 19), None);
        assert_eq!(
            due(&[s, m], at(1, 7, 0), at(1, 7, 30) + 20),
            Some(at(1, 7, 30) + 20)
        );
        for bad in [
            "24:00",
            "7:30",
            "07:60",
            "0730",
            "07:3",
            "",
            "aa:bb",
            "+7:30",
            "07:30:60",
            "07:30:5",
            "07:30:00:00",
            "07:30:",
            "23:59:60",
        ] {
            let e = TimeOfDay::parse(bad).unwrap_err();
            assert!(
                e.contains("is not a time of day HH:MM or HH:MM:SS"),
                "{bad}: {e}"
            );
        }
        let t: TimeOfDay = serde_json::from_str("\"06:05\"").unwrap();
        assert_eq!(serde_json::to_string(&t).unwrap(), "\"06:05\"");
    }
}
