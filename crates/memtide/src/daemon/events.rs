//! The event log: every action with its reason and result, every VM that comes or goes,
//! and every diagnostic when it appears and when it clears — as JSON lines in a file, and
//! the latest few in memory for status. What others make happen (a VM lost, a guest
//! reset, a failed action) is logged at most five times a minute per VM and kind; the
//! rest are counted, and the count logged when the minute is over.
//!
//! Crash safety: each event is one `write()` to a file opened with O_APPEND, so a kill
//! leaves whole lines; a write the disk cuts short is taken back (the file truncated to
//! where it was), and a write that fails (ENOSPC) is counted, logged once until writing
//! works again, and never stops the daemon; a file that cannot be reopened on SIGHUP is
//! the same, never written to where logrotate moved it. [`read_log`] skips a torn last
//! line.

use memtide_core::need::NeedLevel;
use memtide_core::{guest_text, Bytes, Decision, Diagnostic, DiagnosticKind};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use tokio::time::Instant;

/// Events kept in memory for status.
const RECENT: usize = 50;
/// The longest event message kept: a decision's whole reason (the longest are about
/// 400 bytes), however long a VM's name.
const MESSAGE_MAX: usize = 4096;
/// Events of one kind, VM and rule logged per [`WINDOW`].
const BURST: u32 = 5;
/// The rate limit's window.
const WINDOW: Duration = Duration::from_secs(60);
/// Events never held back: memtide's own doings.
const ALWAYS: [&str; 20] = [
    "started",
    "stopped",
    "state",
    "action",
    "policy_reloaded",
    "policy_rejected",
    "hibernate",
    "snapshot_started",
    "snapshot_saved",
    "snapshot_failed",
    "snapshot_deleted",
    "snapshot_woken",
    "snapshot_unfinished",
    "restore_started",
    "restored",
    "restore_failed",
    "restore_skipped",
    "restore_waiting",
    "restore_given_up",
    "wake",
];

/// The level an event of `kind` (and, for a diagnostic, `rule`, its kind) is logged at
/// on stderr, for a `--log-level` or journald filter: errors where memtide failed at
/// something it was doing or asked to do (a tick skipped, a policy rejected or failing, a
/// snapshot or restore not made, a file not written); warnings where a VM or the host
/// keeps memtide from managing as it should (a VM lost or unreachable, an action that
/// failed, a guest whose figures are not believed), a guest a save or restore cut
/// short had left stopped, resumed at connection, and what a save cut short left in the
/// store; everything else is information (a
/// VM lost as it shut down or as memtide saved it, `rule` saying which, among them).
fn severity(kind: &str, rule: Option<&str>) -> tracing::Level {
    use tracing::Level;
    match kind {
        "host_error" | "policy_rejected" | "snapshot_failed" | "restore_failed"
        | "restore_given_up" | "write_failed" => Level::ERROR,
        // A VM that shut down, or that memtide was saving, went as it should.
        "vm_lost" if rule.is_some() => Level::INFO,
        "action_failed"
        | "place_failed"
        | "reclaim_failed"
        | "vm_lost"
        | "vm_resumed"
        | "snapshot_unfinished" => Level::WARN,
        "state" if rule == Some(super::state::UNREADABLE) => Level::WARN,
        "diagnostic" => match rule {
            Some("policy_error") => Level::ERROR,
            Some("guest_reset" | "guest_shutdown" | "memory_resized" | "busy") => Level::INFO,
            _ => Level::WARN,
        },
        _ => Level::INFO,
    }
}

/// What the rate limit tells events apart by: kind, VM, rule.
type Key = (&'static str, Option<String>, Option<String>);

/// One key's current window. (Hand-written: rate limiter crates such as governor say
/// whether to let an event through, not how many they held back.)
struct Window {
    start: Instant,
    logged: u32,
    held: u64,
}

impl Window {
    fn over(&self, now: Instant) -> bool {
        now - self.start >= WINDOW
    }
}

/// One event.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Event {
    /// Wall-clock time (RFC 3339, UTC).
    pub ts: String,
    /// What kind of event: `started`, `stopped`, `vm_connected`, `vm_lost`, `vm_process`,
    /// `action`,
    /// `action_failed`, `reclaim_failed`, `place_failed`, `huge_pages_skipped`, `diagnostic`,
    /// `diagnostic_cleared`, `host_error`, `hibernate`, `snapshot_started`,
    /// `snapshot_saved`, `snapshot_failed`, `snapshot_deleted`, `restore_started`, `restored`, `restore_failed`,
    /// `restore_skipped`, `restore_given_up`, `wake`.
    pub kind: String,
    /// The VM concerned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vm: Option<String>,
    /// The rule behind an action.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// The level of the host's need for memory that drove an action (`ample`, `tight`,
    /// `short`), where its policy weighs one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub need: Option<NeedLevel>,
    /// A balloon action's target: the guest's new logical size (bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_bytes: Option<u64>,
    /// The guest's logical size as its balloon last reported it when the action was
    /// decided (bytes): beside `target_bytes`, whether it grows or shrinks, and by how much.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actual_bytes: Option<u64>,
    /// A sentence for the operator.
    pub message: String,
}

/// What an event of a decision tells beside its message.
#[derive(Debug, Default, Clone, Copy)]
pub struct Decided<'r> {
    /// The rule behind it.
    pub rule: Option<&'r str>,
    /// The level of the host's need that drove it.
    pub need: Option<NeedLevel>,
    /// A balloon action's target.
    pub target: Option<Bytes>,
    /// The guest's logical size when it was decided.
    pub actual: Option<Bytes>,
}

/// Where events go.
pub struct EventLog {
    path: PathBuf,
    file: Option<File>,
    recent: VecDeque<Event>,
    /// Conditions in force, to log each once when it appears and once when it clears
    /// (not again when only its text changes, e.g. "retrying in 4 s").
    conditions: BTreeSet<(Option<String>, DiagnosticKind)>,
    /// The rate limit's windows.
    windows: HashMap<Key, Window>,
    /// Events that could not be written to the file.
    write_errors: u64,
    /// Failed writes since the last one that worked (the first is logged).
    failing: u64,
    /// The file could not be reopened: no event is written (nor to the file moved away)
    /// until it can be, tried again at each event.
    unopened: bool,
    /// The file's last line is an event without its newline, which the next write adds.
    newline_owed: bool,
}

impl EventLog {
    /// An event log appending to `path` (created with its directory); none when empty.
    pub fn open(path: &Path) -> std::io::Result<EventLog> {
        let mut log = EventLog {
            path: path.to_path_buf(),
            file: None,
            recent: VecDeque::new(),
            conditions: BTreeSet::new(),
            windows: HashMap::new(),
            write_errors: 0,
            failing: 0,
            unopened: false,
            newline_owed: false,
        };
        if !path.as_os_str().is_empty() {
            log.file = Some(log.open_file()?);
        }
        Ok(log)
    }

    /// Open the file again (on SIGHUP, after logrotate moved it away). Where it cannot be
    /// opened, nothing more is written to the file it had open (moved away, logrotate may
    /// compress or delete it): the failure is logged and counted in [`write_errors`], the
    /// events since lost are counted too, and each event tries to open it again.
    ///
    /// [`write_errors`]: EventLog::write_errors
    pub fn reopen(&mut self) -> std::io::Result<()> {
        if self.path.as_os_str().is_empty() {
            return Ok(());
        }
        self.file = None;
        match self.open_file() {
            Ok(file) => {
                (self.file, self.unopened) = (Some(file), false);
                Ok(())
            }
            Err(e) => {
                tracing::error!(
                    "event log {}: cannot reopen it, events are lost until it can be (tried \
                     again at each event; counted in memtide_write_errors_total): {e}",
                    self.path.display()
                );
                self.unopened = true;
                self.write_errors += 1;
                Err(e)
            }
        }
    }

    /// Open the file to append to, created with its directory (removed since, perhaps),
    /// its torn last line mended ([`mend_torn_line`]).
    fn open_file(&mut self) -> io::Result<File> {
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        self.newline_owed = mend_torn_line(&self.path, &file);
        Ok(file)
    }

    /// Record an event, unless its kind, VM and rule were logged [`BURST`] times in the
    /// current minute. Its VM name is cleaned ([`guest_text::clean`]), its message escaped
    /// and bounded by [`MESSAGE_MAX`]: memtide's own reasons are longer than outside text
    /// may be (outside text it quotes is escaped with it, and bounded by it).
    pub fn log(
        &mut self,
        kind: &'static str,
        vm: Option<&str>,
        rule: Option<&str>,
        message: String,
    ) {
        let decided = Decided {
            rule,
            ..Decided::default()
        };
        self.log_decided(kind, vm, decided, message);
    }

    /// [`EventLog::log`] of an action, with the level of the host's need behind it and,
    /// for a balloon's, its sizes.
    pub fn log_decided(
        &mut self,
        kind: &'static str,
        vm: Option<&str>,
        decided: Decided<'_>,
        message: String,
    ) {
        let vm = vm.map(guest_text::clean);
        let rule = decided.rule.map(str::to_string);
        if !ALWAYS.contains(&kind) {
            let now = Instant::now();
            let key = (kind, vm.clone(), rule.clone());
            if self.windows.get(&key).is_some_and(|w| w.over(now)) {
                self.close(key.clone());
            }
            let window = self.windows.entry(key).or_insert(Window {
                start: now,
                logged: 0,
                held: 0,
            });
            if window.logged == BURST {
                window.held += 1;
                return;
            }
            window.logged += 1;
        }
        self.write(Event {
            ts: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            kind: kind.to_string(),
            vm,
            rule,
            need: decided.need,
            target_bytes: decided.target.map(|b| b.0),
            actual_bytes: decided.actual.map(|b| b.0),
            message: guest_text::clean_to(&message, MESSAGE_MAX),
        });
    }

    /// End `key`'s window, saying how many events it held back.
    fn close(&mut self, key: Key) {
        let Some(window) = self.windows.remove(&key) else {
            return;
        };
        if window.held > 0 {
            let (kind, vm, rule) = key;
            self.write(Event {
                ts: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
                kind: kind.to_string(),
                vm,
                rule,
                need: None,
                target_bytes: None,
                actual_bytes: None,
                message: format!(
                    "{} more like this not logged (at most {BURST} a minute)",
                    window.held
                ),
            });
        }
    }

    fn write(&mut self, event: Event) {
        let vm = event.vm.as_deref().unwrap_or("-");
        let (kind, message) = (event.kind.as_str(), &event.message);
        match severity(kind, event.rule.as_deref()) {
            tracing::Level::ERROR => tracing::error!(kind, vm, "{message}"),
            tracing::Level::WARN => tracing::warn!(kind, vm, "{message}"),
            _ => tracing::info!(kind, vm, "{message}"),
        }
        // A file removed (with its directory, perhaps) takes what is written to it with
        // it: it is made again.
        let removed = self.file.as_ref().map(File::metadata);
        if removed.is_some_and(|m| m.is_ok_and(|m| m.nlink() == 0)) {
            self.file = None;
            match self.open_file() {
                Ok(file) => self.file = Some(file),
                Err(e) => {
                    tracing::error!(
                        "event log {}: removed, and it cannot be made again: events are lost \
                         until it can be (tried again at each event; counted in \
                         memtide_write_errors_total): {e}",
                        self.path.display()
                    );
                    self.unopened = true;
                }
            }
        }
        if self.unopened {
            if let Ok(file) = self.open_file() {
                (self.file, self.unopened) = (Some(file), false);
            } else {
                // Logged when the reopen failed; the first write that works says how
                // many were lost.
                self.failing += 1;
                self.write_errors += 1;
            }
        }
        if let Some(f) = &mut self.file {
            let written = append_line(f, &event, self.failing, self.newline_owed);
            self.newline_owed &= written.is_err();
            match written {
                Ok(()) if self.failing > 0 => {
                    tracing::warn!(
                        "event log {}: writing again, {} events lost",
                        self.path.display(),
                        self.failing
                    );
                    self.failing = 0;
                }
                Ok(()) => {}
                Err(e) => {
                    if self.failing == 0 {
                        tracing::error!(
                            "event log {}: write failed, events are lost until it works \
                             again (counted in memtide_write_errors_total): {e}",
                            self.path.display()
                        );
                    }
                    self.failing += 1;
                    self.write_errors += 1;
                }
            }
        }
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(event);
    }

    /// Log a decision's diagnostics: one-off ones each time, conditions when they appear
    /// and when they clear; and end the rate limit's windows that are over.
    pub fn diagnostics(&mut self, decision: &Decision) {
        let mut now = BTreeSet::new();
        for Diagnostic { vm, kind, message } in &decision.diagnostics {
            let key = (vm.clone(), *kind);
            let new = match kind.is_condition() {
                true => now.insert(key.clone()) && !self.conditions.contains(&key),
                false => true,
            };
            if new {
                self.log(
                    "diagnostic",
                    vm.as_deref(),
                    Some(kind.as_str()),
                    message.clone(),
                );
            }
        }
        let before = std::mem::take(&mut self.conditions);
        // A VM gone from the decision (its connection lost, logged as `vm_lost`) has not
        // recovered: its conditions end without a word that would read as if it had.
        let decided: BTreeSet<&str> = decision.vms.iter().map(|v| v.name.as_str()).collect();
        let still_here = |vm: &Option<String>| vm.as_deref().is_none_or(|v| decided.contains(v));
        for (vm, kind) in before.difference(&now).filter(|(vm, _)| still_here(vm)) {
            self.log(
                "diagnostic_cleared",
                vm.as_deref(),
                Some(kind.as_str()),
                format!("{} cleared", kind.as_str()),
            );
        }
        self.conditions = now;
        let t = Instant::now();
        let over: Vec<Key> = self
            .windows
            .iter()
            .filter(|(_, w)| w.over(t))
            .map(|(k, _)| k.clone())
            .collect();
        for key in over {
            self.close(key);
        }
    }

    /// The file it appends to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Events that could not be written to the file since the daemon started, and
    /// failures to reopen it.
    pub fn write_errors(&self) -> u64 {
        self.write_errors
    }

    /// The latest events, oldest first.
    pub fn recent(&self) -> Vec<Event> {
        self.recent.iter().cloned().collect()
    }
}

/// What is done with the torn last line of the regular file `file` at `path` (a crash
/// mid-write, a hand's edit), so that the next event is a line of its own: cut off where it
/// is no event (a crash's part of one: `read_log` reads a torn line only at the end), or
/// ended with a newline where it is one; returns whether that newline is owed to the next
/// write (not written now: a full disk). A file that is no regular file (a FIFO, a
/// device), or that cannot be read, is left as it is.
fn mend_torn_line(path: &Path, file: &File) -> bool {
    /// How much of the file's end is read: far more than an event's line.
    const TAIL: u64 = 64 << 10;
    let Ok(meta) = file.metadata() else {
        return false;
    };
    if !meta.is_file() || meta.len() == 0 {
        return false;
    }
    let len = meta.len();
    let window = len.min(TAIL);
    let mut tail = vec![0; usize::try_from(window).expect("at most 64 KiB")];
    // The file `file` is, whatever took its path since (read through the descriptor).
    let this = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(file));
    let read = std::fs::File::open(this).and_then(|r| r.read_exact_at(&mut tail, len - window));
    if read.is_err() {
        return false;
    }
    let torn = match tail.iter().rposition(|b| *b == b'\n') {
        Some(at) => &tail[at + 1..],
        None if window == len => &tail[..],
        // A line longer than any event: not judged, only ended.
        None => return (&*file).write_all(b"\n").is_err(),
    };
    if torn.is_empty() {
        return false;
    }
    if serde_json::from_slice::<Event>(torn).is_ok() {
        return (&*file).write_all(b"\n").is_err();
    }
    match file.set_len(len - torn.len() as u64) {
        Ok(()) => false,
        Err(e) => {
            // (An append-only file, say.) The next event on a line of its own at least.
            tracing::error!(
                "event log {}: its torn last line could not be cut off: {e}",
                path.display()
            );
            true
        }
    }
}

/// Write `events` as JSON lines in one `write` call, so that a line is never split nor
/// interleaved with another writer's, after a newline where `newline_first`; returns the
/// bytes written, fewer than the lines' when the disk is full.
fn write_lines(
    out: &mut impl Write,
    events: &[&Event],
    newline_first: bool,
) -> io::Result<(usize, usize)> {
    let mut lines = Vec::new();
    if newline_first {
        lines.push(b'\n');
    }
    for event in events {
        serde_json::to_writer(&mut lines, event).expect("events serialize");
        lines.push(b'\n');
    }
    Ok((out.write(&lines)?, lines.len()))
}

/// Append `event` to `file` (opened O_APPEND) whole or not at all, after an event that
/// says how many before it were `lost` where any were (`write_resumed`, rule
/// `event_log`: the file's gap is marked in it), and after a newline where one is
/// `owed`: what a short write left is cut off again, so that the next line does not
/// continue a torn one.
fn append_line(file: &mut File, event: &Event, lost: u64, owed: bool) -> io::Result<()> {
    // Made only where events were lost: every event comes this way.
    let gap = (lost > 0).then(|| Event {
        ts: event.ts.clone(),
        kind: "write_resumed".into(),
        vm: None,
        rule: Some("event_log".into()),
        need: None,
        target_bytes: None,
        actual_bytes: None,
        message: format!("event log: writing again, {lost} events before this one lost"),
    });
    let events: Vec<&Event> = gap.iter().chain([event]).collect();
    let (written, len) = write_lines(file, &events, owed)?;
    if written == len {
        return Ok(());
    }
    cut_back(file, written)?;
    Err(io::Error::new(
        io::ErrorKind::WriteZero,
        format!("short write ({written} of {len} bytes): the disk is full"),
    ))
}

/// Cut the last `written` bytes off `file`: what a short write appended.
fn cut_back(file: &File, written: usize) -> io::Result<()> {
    let end = file.metadata()?.len();
    file.set_len(end.saturating_sub(written as u64))
}

/// The events in the log at `path`, and a note on a torn last line (a write cut short
/// by a crash or a full disk) that was skipped. Any other line that is not an event is
/// an error naming its number.
pub fn read_log(path: &Path) -> io::Result<(Vec<Event>, Option<String>)> {
    let text = std::fs::read(path)?;
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut events = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        match serde_json::from_str(line) {
            Ok(e) => events.push(e),
            Err(_) if i + 1 == lines.len() && !line.ends_with('\n') => {
                let note = format!(
                    "{}: torn last line skipped ({} bytes, no newline)",
                    path.display(),
                    line.len()
                );
                return Ok((events, Some(note)));
            }
            Err(e) => {
                let message = format!("{}:{}: not an event: {e}", path.display(), i + 1);
                return Err(io::Error::new(io::ErrorKind::InvalidData, message));
            }
        }
    }
    Ok((events, None))
}

#[cfg(test)]
mod tests {
    use super::*;
    use memtide_core::policy::mom::Mom;
    use memtide_core::testkit::{host, snapshot, vm};
    use memtide_core::{BackendError, Engine, EngineConfig};

    /// An event log writing to `file` in a new directory.
    fn open(file: &str) -> (tempfile::TempDir, EventLog) {
        let dir = tempfile::tempdir().unwrap();
        let log = EventLog::open(&dir.path().join(file)).unwrap();
        (dir, log)
    }

    /// An engine running MOM.
    fn mom() -> Engine {
        Engine::new(EngineConfig::default(), Box::<Mom>::default())
    }

    #[test]
    fn what_went_wrong_is_logged_above_what_went_as_it_should() {
        use tracing::Level;
        let cases = [
            (("host_error", None), Level::ERROR),
            (("diagnostic", Some("policy_error")), Level::ERROR),
            (("vm_lost", None), Level::WARN),
            (("diagnostic", Some("unreachable")), Level::WARN),
            (("diagnostic", Some("busy")), Level::INFO),
            (("vm_lost", Some("shut_down")), Level::INFO),
            (("vm_lost", Some("saving")), Level::INFO),
            (("snapshot_unfinished", None), Level::WARN),
            (("state", Some("state_unreadable")), Level::WARN),
            (("state", None), Level::INFO),
            (("diagnostic", Some("guest_shutdown")), Level::INFO),
            (("action", Some("memtide.probe")), Level::INFO),
        ];
        for ((kind, rule), level) in cases {
            assert_eq!(severity(kind, rule), level, "{kind} {rule:?}");
        }
    }

    #[test]
    fn conditions_are_logged_when_they_appear_and_clear() {
        let (dir, mut log) = open("sub/events.jsonl");
        let path = dir.path().join("sub/events.jsonl");
        let mut engine = mom();
        let mut down = vm("a", 1000, 800, 600);
        down.sample = Err(BackendError::Timeout(100));
        for t in 0..3 {
            log.diagnostics(&engine.tick(&snapshot(t, host(4000, 400), vec![down.clone()])));
        }
        log.diagnostics(&engine.tick(&snapshot(3, host(4000, 400), vec![vm("a", 1000, 800, 600)])));
        let events = read(&path);
        let kinds: Vec<_> = events
            .iter()
            .map(|e| (e.kind.as_str(), e.rule.as_deref().unwrap()))
            .collect();
        assert_eq!(
            kinds,
            vec![
                ("diagnostic", "unreachable"),
                ("diagnostic_cleared", "unreachable")
            ]
        );
        assert_eq!(events[0].vm.as_deref(), Some("a"));
        assert_eq!(events[0].message, "not sampled: no answer within 100 ms");
        assert_eq!(log.recent().len(), 2);
        // Unreachable again, then gone from the decision (its connection lost): no
        // "cleared", which would read as if it had recovered.
        log.diagnostics(&engine.tick(&snapshot(4, host(4000, 400), vec![down.clone()])));
        log.diagnostics(&engine.tick(&snapshot(5, host(4000, 400), vec![])));
        let kinds: Vec<_> = read(&path)[2..]
            .iter()
            .map(|e| (e.kind.clone(), e.rule.clone().unwrap()))
            .collect();
        assert_eq!(
            kinds,
            [("diagnostic".to_string(), "unreachable".to_string())]
        );
    }

    /// The events in the file at `path` (which has no torn line).
    fn read(path: &Path) -> Vec<Event> {
        let (events, torn) = read_log(path).unwrap();
        assert_eq!(torn, None);
        events
    }

    #[test]
    fn a_condition_is_logged_once_while_only_its_text_changes() {
        let (dir, mut log) = open("events.jsonl");
        let path = dir.path().join("events.jsonl");
        let mut engine = mom();
        for t in 0..10 {
            let mut a = vm("a", 1000, 800, 600);
            if let Ok(sample) = &mut a.sample {
                let error = format!("guest-get-osinfo failed; retrying in {} s", 1 << t);
                sample.agent = Some(Err(error));
            }
            log.diagnostics(&engine.tick(&snapshot(t, host(4000, 400), vec![a])));
        }
        let events = read(&path);
        let agent: Vec<_> = events
            .iter()
            .filter(|e| e.rule.as_deref() == Some("agent_unavailable"))
            .collect();
        assert_eq!(agent.len(), 1, "{events:?}");
        assert_eq!(agent[0].message, "guest-get-osinfo failed; retrying in 1 s");
    }

    #[tokio::test(start_paused = true)]
    async fn repeated_events_are_held_back_and_counted() {
        let (dir, mut log) = open("events.jsonl");
        let path = dir.path().join("events.jsonl");
        let mut engine = mom();
        let idle = engine.tick(&snapshot(0, host(4000, 400), vec![]));
        // A guest that resets 30 times in 30 s, next to memtide's own actions.
        for i in 0..30 {
            log.log("vm_lost", Some("a"), None, format!("connection lost: {i}"));
            log.log("action", Some("b"), Some("r"), format!("balloon {i}"));
            log.diagnostics(&idle);
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        tokio::time::advance(Duration::from_secs(30)).await;
        log.diagnostics(&idle);
        log.log("vm_lost", Some("a"), None, "connection lost: again".into());
        let events = read(&path);
        let lost: Vec<&str> = events
            .iter()
            .filter(|e| e.kind == "vm_lost")
            .map(|e| e.message.as_str())
            .collect();
        assert_eq!(
            lost,
            [
                "connection lost: 0",
                "connection lost: 1",
                "connection lost: 2",
                "connection lost: 3",
                "connection lost: 4",
                "25 more like this not logged (at most 5 a minute)",
                "connection lost: again",
            ]
        );
        assert_eq!(events.iter().filter(|e| e.kind == "action").count(), 30);
    }

    #[test]
    fn the_log_is_reopened_after_logrotate_moved_it() {
        let (dir, mut log) = open("events.jsonl");
        let path = dir.path().join("events.jsonl");
        log.log("started", None, None, "one".into());
        std::fs::rename(&path, dir.path().join("events.jsonl.1")).unwrap();
        log.reopen().unwrap();
        log.log("stopped", None, None, "two".into());
        let messages = |p: &Path| read(p).into_iter().map(|e| e.message).collect::<Vec<_>>();
        assert_eq!(messages(&dir.path().join("events.jsonl.1")), ["one"]);
        assert_eq!(messages(&path), ["two"]);
    }

    #[test]
    fn a_guest_without_figures_yet_is_no_policy_error_until_the_grace_is_over() {
        use memtide_core::estimate::fused::FusedConfig;
        use memtide_core::policy::ksmtuned::KsmConfig;
        use memtide_core::policy::working_set::{EstimatorConfig, WorkingSet, WorkingSetConfig};
        let (dir, mut log) = open("events.jsonl");
        let path = dir.path().join("events.jsonl");
        let memtide = WorkingSet::new(
            EstimatorConfig::Fused(FusedConfig::default()),
            WorkingSetConfig::default(),
            KsmConfig::default(),
        );
        let mut engine = Engine::new(EngineConfig::default(), Box::new(memtide));
        // Just connected: its balloon statistics not polled yet.
        let mut mute = vm("a", 1000, 800, 600);
        mute.sample.as_mut().unwrap().stats.free = None;
        let errors = || {
            let events = read(&path).into_iter();
            let errors = events.filter(|e| e.rule.as_deref() == Some("policy_error"));
            errors.map(|e| e.message).collect::<Vec<_>>()
        };
        for t in (0..30).step_by(2) {
            let d = engine.tick(&snapshot(t, host(4000, 400), vec![mute.clone()]));
            assert!(d.diagnostics.is_empty(), "at {t} s: {:?}", d.diagnostics);
            let reason = d.vms[0].reason.as_ref().unwrap();
            assert_eq!(reason.rule, "memtide.no_figures", "at {t} s");
            log.diagnostics(&d);
        }
        assert_eq!(errors(), [] as [String; 0]);
        // Still none 30 s on: a policy error, logged once.
        for t in [30, 32] {
            log.diagnostics(&engine.tick(&snapshot(t, host(4000, 400), vec![mute.clone()])));
        }
        assert_eq!(
            errors(),
            [
                "policy memtide: no MemAvailable nor free-memory figures from the guest yet \
              (still none after 30 s)"
            ]
        );
    }

    #[test]
    fn a_log_that_cannot_be_reopened_is_not_written_where_it_was_moved_and_is_tried_again() {
        let (dir, mut log) = open("events.jsonl");
        let path = dir.path().join("events.jsonl");
        let rotated = dir.path().join("events.jsonl.2");
        log.log("started", None, None, "one".into());
        // As an operator's mistake does: the log moved away, a directory in its place.
        std::fs::rename(&path, &rotated).unwrap();
        std::fs::create_dir(&path).unwrap();
        let e = log.reopen().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::IsADirectory, "{e}");
        assert_eq!(log.write_errors(), 1, "the failure is counted");
        log.log("action", Some("a"), Some("r"), "lost".into());
        log.log("action", Some("a"), Some("r"), "lost too".into());
        assert_eq!((log.write_errors(), log.failing), (3, 2));
        let messages = |p: &Path| read(p).into_iter().map(|e| e.message).collect::<Vec<_>>();
        assert_eq!(
            messages(&rotated),
            ["one"],
            "nothing more where it was moved"
        );
        assert_eq!(log.recent().len(), 3, "status still shows them");
        // The path writable again: the next event opens it.
        std::fs::remove_dir(&path).unwrap();
        log.log("stopped", None, None, "two".into());
        let gap = "event log: writing again, 2 events before this one lost";
        assert_eq!(messages(&path), [gap, "two"]);
        assert_eq!(messages(&rotated), ["one"]);
        assert_eq!((log.write_errors(), log.failing), (3, 0));
    }

    #[test]
    fn guest_text_is_cut_and_escaped_and_each_event_is_one_write() {
        /// Keeps each write call apart.
        #[derive(Default)]
        struct Writes(Vec<Vec<u8>>);
        impl Write for Writes {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.push(buf.to_vec());
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let (_dir, mut log) = open("events.jsonl");
        let error = format!("\x1b[2J{}", "x".repeat(130_000));
        log.log("action_failed", Some("a\x1b"), None, error);
        let event = log.recent().pop().unwrap();
        assert!(
            event.message.starts_with("\\u{1b}[2Jxxx"),
            "{}",
            event.message
        );
        assert!(event.message.len() <= MESSAGE_MAX);
        assert_eq!(event.vm.as_deref(), Some("a\\u{1b}"));
        // A reason of memtide's own, longer than outside text may be, is kept whole.
        let reason = format!("db: balloon target 248 MiB ({})", "why ".repeat(100));
        log.log("action", Some("db"), Some("memtide.probe"), reason.clone());
        assert_eq!(log.recent().pop().unwrap().message, reason);
        let mut out = Writes::default();
        let (written, len) = write_lines(&mut out, &[&event], false).unwrap();
        assert_eq!(written, len);
        assert_eq!(out.0.len(), 1);
        assert!(out.0[0].ends_with(b"}\n"));
    }

    #[test]
    fn a_torn_last_line_is_skipped_with_a_note_and_other_garbage_is_an_error() {
        let (dir, mut log) = open("events.jsonl");
        let path = dir.path().join("events.jsonl");
        log.log("started", None, None, "one".into());
        log.log("stopped", None, None, "two".into());
        let whole = std::fs::read(&path).unwrap();
        let second = whole.len() - (whole.iter().position(|b| *b == b'\n').unwrap() + 1);
        // A kill (or a full disk) in the middle of the second line.
        let cut = whole.len() - 10;
        std::fs::write(&path, &whole[..cut]).unwrap();
        let (events, torn) = read_log(&path).unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].message, "one");
        let torn = torn.unwrap();
        let note = format!("torn last line skipped ({} bytes, no newline)", second - 10);
        assert!(torn.ends_with(&note), "{torn}");
        // A torn line followed by others is not a crash's doing: an error, with its line.
        let mut spliced = whole[..cut].to_vec();
        spliced.extend_from_slice(b"\n");
        spliced.extend_from_slice(&whole);
        std::fs::write(&path, spliced).unwrap();
        let error = read_log(&path).unwrap_err().to_string();
        assert!(error.contains("events.jsonl:2: not an event"), "{error}");
    }

    #[test]
    fn an_action_says_the_level_of_need_behind_it_and_the_sizes_it_moves_between() {
        let (dir, mut log) = open("events.jsonl");
        let path = dir.path().join("events.jsonl");
        let need = Some(NeedLevel::Tight);
        let decided = Decided {
            rule: Some("memtide.probe"),
            need,
            target: Some(Bytes::from_mib(151) + Bytes::from_kib(512)),
            actual: Some(Bytes::from_mib(199)),
        };
        log.log_decided("action", Some("a"), decided, "b".into());
        log.log("started", None, None, "s".into());
        let lines = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = lines.lines().collect();
        assert!(lines[0].contains(r#""need":"tight""#), "{}", lines[0]);
        for field in ["need", "target_bytes", "actual_bytes"] {
            assert!(!lines[1].contains(field), "{}", lines[1]);
        }
        let (events, _) = read_log(&path).unwrap();
        assert_eq!(events[0].need, need);
        // Exact, where the message rounds (an audit could not tell a move's size).
        assert_eq!(events[0].target_bytes, Some(158_859_264));
        assert_eq!(events[0].actual_bytes, Some(199 << 20));
    }

    #[test]
    fn a_full_disk_loses_events_counted_and_the_daemon_goes_on() {
        // /dev/full fails every write with ENOSPC.
        let mut log = EventLog::open(Path::new("/dev/full")).unwrap();
        for i in 0..10 {
            log.log("action", Some("a"), Some("r"), format!("balloon {i}"));
        }
        assert_eq!(log.write_errors(), 10);
        assert_eq!(log.failing, 10);
        assert_eq!(log.recent().len(), 10, "status still shows them");
        // Space again: writing resumes where the file stands.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        log.path = path.clone();
        log.reopen().unwrap();
        log.log("action", Some("a"), Some("r"), "balloon 10".into());
        assert_eq!((log.write_errors(), log.failing), (10, 0));
        // The gap is marked in the file, before the event that ends it.
        let written = read(&path);
        let kinds: Vec<_> = written
            .iter()
            .map(|e| (&*e.kind, e.rule.as_deref()))
            .collect();
        assert_eq!(
            kinds,
            [("write_resumed", Some("event_log")), ("action", Some("r"))]
        );
        assert!(written[0]
            .message
            .contains("10 events before this one lost"));
    }

    #[test]
    fn a_log_removed_with_its_directory_is_made_again_at_the_next_event_or_reopen() {
        // Found by an audit: events went on into the removed file, and a reload could not
        // reopen a log whose directory was gone.
        let (dir, mut log) = open("log/events.jsonl");
        let path = dir.path().join("log/events.jsonl");
        log.log("started", None, None, "one".into());
        std::fs::remove_dir_all(dir.path().join("log")).unwrap();
        log.log("action", Some("a"), Some("r"), "two".into());
        let messages = |p: &Path| read(p).into_iter().map(|e| e.message).collect::<Vec<_>>();
        assert_eq!(messages(&path), ["two"]);
        std::fs::remove_dir_all(dir.path().join("log")).unwrap();
        log.reopen().unwrap();
        log.log("stopped", None, None, "three".into());
        assert_eq!(messages(&path), ["three"]);
        assert_eq!(log.write_errors(), 0);
    }

    #[test]
    fn an_event_after_a_torn_line_is_a_line_of_its_own_and_the_log_reads_whole() {
        // Found by an audit: the next event was glued onto a torn line.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let messages = || {
            let (events, torn) = read_log(&path).unwrap();
            assert_eq!(torn, None);
            events.into_iter().map(|e| e.message).collect::<Vec<_>>()
        };
        // A crash's part of an event is cut off: nothing in it could be read.
        let mut log = EventLog::open(&path).unwrap();
        log.log("started", None, None, "one".into());
        drop(log);
        let whole = std::fs::read(&path).unwrap();
        std::fs::write(&path, [&whole[..], b"{\"ts\":\"torn"].concat()).unwrap();
        let mut log = EventLog::open(&path).unwrap();
        log.log("started", None, None, "two".into());
        assert_eq!(messages(), ["one", "two"]);
        // A whole event without its newline (a hand's edit) is ended, and kept.
        drop(log);
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.trim_end()).unwrap();
        let mut log = EventLog::open(&path).unwrap();
        log.log("started", None, None, "three".into());
        assert_eq!(messages(), ["one", "two", "three"]);
        // A whole file is left as it is.
        drop(log);
        let before = std::fs::read(&path).unwrap();
        drop(EventLog::open(&path).unwrap());
        assert_eq!(std::fs::read(&path).unwrap(), before);
    }

    #[test]
    fn what_a_short_write_left_is_cut_off() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        std::fs::write(&path, b"{\"whole\": 1}\n{\"torn").unwrap();
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        /// A file the disk fills after 6 more bytes.
        struct Short<'f>(&'f mut File);
        impl Write for Short<'_> {
            fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
                self.0.write(&buf[..6])
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let event = Event {
            ts: "t".into(),
            kind: "k".into(),
            vm: None,
            rule: None,
            need: None,
            target_bytes: None,
            actual_bytes: None,
            message: "m".into(),
        };
        let (written, len) = write_lines(&mut Short(&mut file), &[&event], false).unwrap();
        assert!(written < len);
        cut_back(&file, written).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{\"whole\": 1}\n{\"torn");
    }
}
