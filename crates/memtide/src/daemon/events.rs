//! The event log: every action with its reason and result, every VM that comes or goes,
//! and every diagnostic when it appears and when it clears — as JSON lines in a file, and
//! the latest few in memory for status.

use memtide_core::{Decision, Diagnostic, DiagnosticKind};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::time::SystemTime;

/// Events kept in memory for status.
const RECENT: usize = 50;

/// One event.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Event {
    /// Wall-clock time (RFC 3339, UTC).
    pub ts: String,
    /// What kind of event: `started`, `stopped`, `vm_connected`, `vm_lost`, `action`,
    /// `action_failed`, `diagnostic`, `diagnostic_cleared`, `host_error`.
    pub kind: String,
    /// The VM concerned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vm: Option<String>,
    /// The rule behind an action.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// A sentence for the operator.
    pub message: String,
}

/// Where events go.
pub struct EventLog {
    file: Option<File>,
    recent: VecDeque<Event>,
    /// Conditions in force, to log each once when it appears and once when it clears.
    conditions: BTreeMap<(Option<String>, DiagnosticKind), String>,
}

impl EventLog {
    /// An event log appending to `path` (created with its directory); none when empty.
    pub fn open(path: &Path) -> std::io::Result<EventLog> {
        let file = if path.as_os_str().is_empty() {
            None
        } else {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)?;
            }
            Some(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?,
            )
        };
        Ok(EventLog {
            file,
            recent: VecDeque::new(),
            conditions: BTreeMap::new(),
        })
    }

    /// Record an event.
    pub fn log(
        &mut self,
        kind: &'static str,
        vm: Option<&str>,
        rule: Option<&str>,
        message: String,
    ) {
        let event = Event {
            ts: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            kind: kind.to_string(),
            vm: vm.map(str::to_string),
            rule: rule.map(str::to_string),
            message,
        };
        tracing::info!(
            kind,
            vm = event.vm.as_deref().unwrap_or("-"),
            "{}",
            event.message
        );
        if let Some(f) = &mut self.file {
            let line = serde_json::to_string(&event).expect("events serialize");
            if let Err(e) = writeln!(f, "{line}") {
                tracing::error!("event log write failed: {e}");
            }
        }
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(event);
    }

    /// Log a decision's diagnostics: one-off ones each time, conditions when they appear
    /// and when they clear.
    pub fn diagnostics(&mut self, decision: &Decision) {
        let mut now = BTreeMap::new();
        for Diagnostic { vm, kind, message } in &decision.diagnostics {
            if kind.is_condition() {
                now.insert((vm.clone(), *kind), message.clone());
            } else {
                self.log(
                    "diagnostic",
                    vm.as_deref(),
                    Some(kind.as_str()),
                    message.clone(),
                );
            }
        }
        let before = std::mem::take(&mut self.conditions);
        for ((vm, kind), message) in &now {
            if before.get(&(vm.clone(), *kind)) != Some(message) {
                self.log(
                    "diagnostic",
                    vm.as_deref(),
                    Some(kind.as_str()),
                    message.clone(),
                );
            }
        }
        for (vm, kind) in before.keys().filter(|k| !now.contains_key(k)) {
            self.log(
                "diagnostic_cleared",
                vm.as_deref(),
                Some(kind.as_str()),
                format!("{} cleared", kind.as_str()),
            );
        }
        self.conditions = now;
    }

    /// The latest events, oldest first.
    pub fn recent(&self) -> Vec<Event> {
        self.recent.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memtide_core::policy::mom::Mom;
    use memtide_core::testkit::{host, snapshot, vm};
    use memtide_core::{BackendError, Engine, EngineConfig};

    #[test]
    fn conditions_are_logged_when_they_appear_and_clear() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/events.jsonl");
        let mut log = EventLog::open(&path).unwrap();
        let mut engine = Engine::new(EngineConfig::default(), Box::<Mom>::default());
        let mut down = vm("a", 1000, 800, 600);
        down.sample = Err(BackendError::Timeout(100));
        for t in 0..3 {
            log.diagnostics(&engine.tick(&snapshot(t, host(4000, 400), vec![down.clone()])));
        }
        log.diagnostics(&engine.tick(&snapshot(3, host(4000, 400), vec![vm("a", 1000, 800, 600)])));
        let lines: Vec<serde_json::Value> = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let kinds: Vec<_> = lines
            .iter()
            .map(|l| (l["kind"].as_str().unwrap(), l["rule"].as_str().unwrap()))
            .collect();
        assert_eq!(
            kinds,
            vec![
                ("diagnostic", "unreachable"),
                ("diagnostic_cleared", "unreachable")
            ]
        );
        assert_eq!(lines[0]["vm"], "a");
        assert_eq!(lines[0]["message"], "not sampled: no answer within 100 ms");
        assert_eq!(log.recent().len(), 2);
    }
}
