//! Files the daemon writes besides its event log — recordings, the state file — when a
//! write fails (a full disk): the failure is counted (`memtide_write_errors_total`),
//! logged once until writing works again, and the write tried again after a pause that
//! doubles from one tick to [`LONGEST_PAUSE`] ticks. The daemon never stops for it.

use super::events::EventLog;
use crate::status::Counters;

/// Longest pause between two tries, in ticks.
const LONGEST_PAUSE: u64 = 64;

/// One file's failures in a row and when to try it again.
#[derive(Debug, Default)]
pub struct Retry {
    /// Failures since the last write that worked.
    failed: u64,
    /// The tick of the first of them.
    since: u64,
    /// The pause after the last failure, in ticks.
    pause: u64,
    /// The first tick it may be tried again.
    next: u64,
}

impl Retry {
    /// Whether to write at `tick`.
    pub fn due(&self, tick: u64) -> bool {
        tick >= self.next
    }

    /// Take in the result of writing `what` at `tick`: count and log a failure (the first
    /// of a streak only), and log when writing works again, saying which ticks went
    /// unwritten (a recording's gap).
    pub fn outcome(
        &mut self,
        what: &'static str,
        tick: u64,
        result: Result<(), String>,
        events: &mut EventLog,
        counters: &mut Counters,
    ) {
        match result {
            Ok(()) if self.failed > 0 => {
                let message = format!(
                    "{what}: writing again after {} failures: not written for the {} ticks \
                     since tick {} of this daemon",
                    self.failed,
                    tick.saturating_sub(self.since),
                    self.since
                );
                events.log("write_resumed", None, Some(what), message);
                *self = Retry::default();
            }
            Ok(()) => {}
            Err(e) => {
                *counters.write_errors.entry(what.into()).or_default() += 1;
                if self.failed == 0 {
                    self.since = tick;
                    let message = format!("{what}: write failed, trying again later: {e}");
                    events.log("write_failed", None, Some(what), message);
                }
                self.failed += 1;
                self.pause = (self.pause * 2).clamp(1, LONGEST_PAUSE);
                self.next = tick + self.pause;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_counted_logged_once_and_tried_again_less_and_less_often() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let mut events = EventLog::open(&path).unwrap();
        let (mut retry, mut counters) = (Retry::default(), Counters::default());
        let mut tried = Vec::new();
        for tick in 0..200 {
            if retry.due(tick) {
                tried.push(tick);
                let full = Err("No space left on device (os error 28)".to_string());
                retry.outcome("recording", tick, full, &mut events, &mut counters);
            }
        }
        assert_eq!(tried, [0, 1, 3, 7, 15, 31, 63, 127, 191]);
        assert_eq!(counters.write_errors["recording"], 9);
        retry.outcome("recording", 255, Ok(()), &mut events, &mut counters);
        assert!(retry.due(256));
        let (logged, torn) = super::super::events::read_log(&path).unwrap();
        assert_eq!(torn, None);
        let messages: Vec<_> = logged.iter().map(|e| e.message.as_str()).collect();
        assert_eq!(
            messages,
            [
                "recording: write failed, trying again later: No space left on device (os error 28)",
                "recording: writing again after 9 failures: not written for the 255 ticks since tick 0 of this daemon",
            ]
        );
    }
}
