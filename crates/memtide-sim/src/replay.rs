//! Replay: run another policy over recorded snapshots and compare its decisions with the
//! recorded ones.
//!
//! The recorded snapshots are fed unchanged to a fresh engine. Replay therefore answers
//! "what would this policy have decided, seeing exactly what the daemon saw?", not "what
//! would have happened": the guests' reaction to different decisions is not known.

use crate::record::{RecordError, Records};
use memtide_core::action::KsmSettings;
use memtide_core::policy::Policy;
use memtide_core::stats::KsmState;
use memtide_core::{Action, Bytes, Decision, Engine, EngineConfig};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What every replay report says first.
pub const CAVEAT: &str = "replay re-runs decisions on the recorded inputs: it cannot know \
how the guests would have reacted to different decisions, so every tick shows what the \
guests did under the recorded policy";

/// Ticks listed one by one in a report (all are counted).
const MAX_LISTED: usize = 200;

/// Balloon moves decided for one VM over the recording.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Moves {
    /// Balloon targets that changed the target in force.
    pub actions: u64,
    /// Memory taken back: the sum of every decrease of the target in force (MiB).
    pub reclaimed_mib: f64,
    /// Memory given: the sum of every increase of the target in force (MiB).
    pub given_mib: f64,
}

/// One VM over the whole replay.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VmReplay {
    /// VM name.
    pub name: String,
    /// What the recorded policy did.
    pub recorded: Moves,
    /// What the replayed policy would have done.
    pub replayed: Moves,
    /// Ticks where the two decided differently for this VM.
    pub ticks_differing: u64,
    /// Mean of (replayed target in force − recorded target in force) over the ticks the
    /// VM was seen (MiB); negative: the replayed policy keeps the VM smaller.
    pub mean_target_gap_mib: f64,
}

/// A VM whose balloon decision differs in one tick (`None`: no change of target).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VmDiff {
    /// VM name.
    pub vm: String,
    /// The guest's size then (MiB).
    pub actual_mib: Option<f64>,
    /// Target the recorded policy set (MiB).
    pub recorded_mib: Option<f64>,
    /// Target the replayed policy would have set (MiB).
    pub replayed_mib: Option<f64>,
    /// The replayed policy's reason, or why it held.
    pub replayed_reason: Option<String>,
}

/// One tick where the decisions differ.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TickDiff {
    /// Time of the tick (s).
    pub at_s: f64,
    /// Balloon differences.
    pub vms: Vec<VmDiff>,
    /// KSM knobs (recorded, replayed), when they differ.
    pub ksm: Option<(Option<KsmSettings>, Option<KsmSettings>)>,
}

/// The outcome of a replay.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReplayReport {
    /// What replay can and cannot tell ([`CAVEAT`]).
    pub caveat: String,
    /// The policy replayed.
    pub policy: String,
    /// The policy that made the recording (from its decisions; `A then B` where a daemon
    /// restarted or reloaded with another).
    pub recorded_policy: String,
    /// Ticks replayed.
    pub ticks: u64,
    /// Ticks where any decision differs.
    pub ticks_differing: u64,
    /// The first differing ticks, in order.
    pub differences: Vec<TickDiff>,
    /// Per VM, by name.
    pub per_vm: Vec<VmReplay>,
    /// Files that ended early (their complete lines were replayed).
    pub truncated_files: Vec<String>,
    /// Daemon runs replayed: each where the recorded time starts again, replayed by a
    /// fresh engine.
    #[serde(default)]
    pub runs: u64,
}

/// Targets in force per VM, as one policy's actions change them.
#[derive(Default)]
struct Side {
    in_force: BTreeMap<String, Bytes>,
    ksm: Option<KsmSettings>,
    moves: BTreeMap<String, Moves>,
}

impl Side {
    /// A daemon started again: what it sees in force starts afresh; what moved stays
    /// counted.
    fn restart(&mut self) {
        self.in_force.clear();
        self.ksm = None;
    }

    /// Apply a decision's actions; returns the balloon targets that change what is in
    /// force (a target equal to it is a resend, not a change) and the KSM change.
    fn apply(
        &mut self,
        decision: &Decision,
        ksm_now: Option<&KsmState>,
    ) -> (BTreeMap<String, Bytes>, Option<KsmSettings>) {
        let mut changes = BTreeMap::new();
        let mut ksm_change = None;
        for action in &decision.actions {
            match action {
                Action::SetBalloon { vm, target, .. } => {
                    let Some(before) = self.in_force.get(vm).copied() else {
                        continue;
                    };
                    if before == *target {
                        continue;
                    }
                    let m = self.moves.entry(vm.clone()).or_default();
                    m.actions += 1;
                    if *target < before {
                        m.reclaimed_mib += (before - *target).mib_f64();
                    } else {
                        m.given_mib += (*target - before).mib_f64();
                    }
                    self.in_force.insert(vm.clone(), *target);
                    changes.insert(vm.clone(), *target);
                }
                Action::SetKsm { settings, .. } => {
                    let now = self.ksm.clone().or_else(|| ksm_now.map(knobs));
                    let merged = merge(now.as_ref(), settings);
                    if now.as_ref() != Some(&merged) {
                        ksm_change = Some(settings.clone());
                        self.ksm = Some(merged);
                    }
                }
            }
        }
        (changes, ksm_change)
    }
}

fn knobs(k: &KsmState) -> KsmSettings {
    KsmSettings {
        run: Some(k.run),
        pages_to_scan: Some(k.pages_to_scan),
        sleep_millisecs: Some(k.sleep_millisecs),
        merge_across_nodes: k.merge_across_nodes,
    }
}

fn merge(now: Option<&KsmSettings>, change: &KsmSettings) -> KsmSettings {
    let now = now.cloned().unwrap_or_default();
    KsmSettings {
        run: change.run.or(now.run),
        pages_to_scan: change.pages_to_scan.or(now.pages_to_scan),
        sleep_millisecs: change.sleep_millisecs.or(now.sleep_millisecs),
        merge_across_nodes: change.merge_across_nodes.or(now.merge_across_nodes),
    }
}

/// Replay the recording files `paths` (in order) through a fresh engine running the
/// policy `make` makes. Where a file's first tick is no later than the tick before it, a
/// daemon started again (its clock starts at its start): replay starts a fresh engine
/// there too, as the daemon did. Time that goes back within a file, or a recording
/// with no tick, is an error.
pub fn replay(
    paths: &[PathBuf],
    make: &dyn Fn() -> Box<dyn Policy>,
    config: EngineConfig,
) -> Result<ReplayReport, RecordError> {
    let mut engine = Engine::new(config.clone(), make());
    let mut records = Records::open(paths);
    let (mut recorded, mut replayed) = (Side::default(), Side::default());
    let mut gaps: BTreeMap<String, (f64, u64)> = BTreeMap::new();
    let mut differing_by_vm: BTreeMap<String, u64> = BTreeMap::new();
    let mut report = ReplayReport {
        caveat: CAVEAT.to_string(),
        policy: engine.policy_name().to_string(),
        recorded_policy: String::new(),
        ticks: 0,
        ticks_differing: 0,
        differences: Vec::new(),
        per_vm: Vec::new(),
        truncated_files: Vec::new(),
        runs: 0,
    };
    let mut last: Option<Duration> = None;
    while let Some(record) = records.next() {
        let record = record?;
        let snap = &record.snapshot;
        match last {
            Some(at) if snap.at <= at && !records.first_of_file() => {
                return Err(RecordError::OutOfOrder {
                    path: records.path().map(Path::to_path_buf).unwrap_or_default(),
                    line: records.line(),
                    at_s: snap.at.as_secs_f64(),
                    before_s: at.as_secs_f64(),
                });
            }
            Some(at) if snap.at <= at => {
                engine = Engine::new(config.clone(), make());
                recorded.restart();
                replayed.restart();
                report.runs += 1;
            }
            Some(_) => {}
            None => report.runs = 1,
        }
        // A policy changed by a restart or a reload (found by an audit: a reload's was
        // not told, and its ticks were put down to the first policy).
        let policy = &record.decision.policy;
        if report.recorded_policy.rsplit(" then ").next() != Some(policy.as_str()) {
            report.recorded_policy = match report.recorded_policy.is_empty() {
                true => policy.clone(),
                false => format!("{} then {policy}", report.recorded_policy),
            };
        }
        last = Some(snap.at);
        report.ticks += 1;
        // A VM's target in force starts as the target delivered, else its size.
        for vm in &snap.vms {
            let now = vm.sample.as_ref().ok().and_then(|s| s.balloon);
            if let Some(start) = vm.target.or(now) {
                recorded.in_force.entry(vm.name.clone()).or_insert(start);
                replayed.in_force.entry(vm.name.clone()).or_insert(start);
            }
        }
        let decision = engine.tick(snap);
        let ksm_now = snap.host.ksm.as_ref();
        let (rec, rec_ksm) = recorded.apply(&record.decision, ksm_now);
        let (rep, rep_ksm) = replayed.apply(&decision, ksm_now);

        let mut diff = TickDiff {
            at_s: snap.at.as_secs_f64(),
            vms: Vec::new(),
            ksm: (rec_ksm != rep_ksm).then_some((rec_ksm, rep_ksm)),
        };
        for (i, vm) in snap.vms.iter().enumerate() {
            let (r, p) = (rec.get(&vm.name), rep.get(&vm.name));
            if r != p {
                *differing_by_vm.entry(vm.name.clone()).or_default() += 1;
                diff.vms.push(VmDiff {
                    vm: vm.name.clone(),
                    actual_mib: vm
                        .sample
                        .as_ref()
                        .ok()
                        .and_then(|s| s.balloon)
                        .map(Bytes::mib_f64),
                    recorded_mib: r.map(|b| b.mib_f64()),
                    replayed_mib: p.map(|b| b.mib_f64()),
                    replayed_reason: decision
                        .vms
                        .get(i)
                        .and_then(|v| v.reason.as_ref())
                        .map(ToString::to_string),
                });
            }
            if let (Some(a), Some(b)) = (
                recorded.in_force.get(&vm.name),
                replayed.in_force.get(&vm.name),
            ) {
                let g = gaps.entry(vm.name.clone()).or_default();
                g.0 += b.mib_f64() - a.mib_f64();
                g.1 += 1;
            }
        }
        if !diff.vms.is_empty() || diff.ksm.is_some() {
            report.ticks_differing += 1;
            if report.differences.len() < MAX_LISTED {
                report.differences.push(diff);
            }
        }
    }
    if report.ticks == 0 {
        return Err(RecordError::Io {
            path: paths.first().cloned().unwrap_or_default(),
            error: std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "no recorded tick to replay",
            ),
        });
    }
    report.truncated_files = records
        .truncated
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    report.per_vm = gaps
        .into_iter()
        .map(|(name, (sum, n))| VmReplay {
            recorded: recorded.moves.remove(&name).unwrap_or_default(),
            replayed: replayed.moves.remove(&name).unwrap_or_default(),
            ticks_differing: differing_by_vm.get(&name).copied().unwrap_or(0),
            mean_target_gap_mib: sum / n.max(1) as f64,
            name,
        })
        .collect();
    Ok(report)
}

impl ReplayReport {
    /// The report as text for a terminal.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "note: {}.", self.caveat);
        let _ = writeln!(
            out,
            "replayed {} over {} ticks recorded under {}: {} ticks decided differently",
            self.policy, self.ticks, self.recorded_policy, self.ticks_differing
        );
        if self.runs > 1 {
            let _ = writeln!(
                out,
                "{} daemon runs: the recorded time starts again where the daemon restarted \
                 (or where files were given out of their order), each run replayed by a fresh \
                 engine (a daemon that resumed from its state file began with estimates the \
                 recording does not hold: its first ticks may differ even under its policy)",
                self.runs
            );
        }
        for f in &self.truncated_files {
            let _ = writeln!(
                out,
                "warning: {f} ends early; its complete lines were replayed"
            );
        }
        let width = self
            .per_vm
            .iter()
            .map(|v| v.name.len())
            .max()
            .unwrap_or(2)
            .max(2);
        let _ = writeln!(
            out,
            "\n{:<width$}  {:>22}  {:>22}  {:>10}  {:>9}",
            "vm", "recorded: taken/given", "replayed: taken/given", "mean gap", "ticks"
        );
        let _ = writeln!(
            out,
            "{:<width$}  {:>22}  {:>22}  {:>10}  {:>9}",
            "", "MiB", "MiB", "MiB", "differing"
        );
        for v in &self.per_vm {
            let _ = writeln!(
                out,
                "{:<width$}  {:>22}  {:>22}  {:>+10.0}  {:>9}",
                v.name,
                format!(
                    "{:.0}/{:.0}",
                    v.recorded.reclaimed_mib, v.recorded.given_mib
                ),
                format!(
                    "{:.0}/{:.0}",
                    v.replayed.reclaimed_mib, v.replayed.given_mib
                ),
                v.mean_target_gap_mib,
                v.ticks_differing
            );
        }
        if !self.differences.is_empty() {
            let _ = writeln!(out, "\nfirst differing ticks:");
        }
        for d in self.differences.iter().take(20) {
            for v in &d.vms {
                let show = |t: Option<f64>| t.map_or("keep".to_string(), |m| format!("{m:.0} MiB"));
                let _ = writeln!(
                    out,
                    "  t={:.0}s {}: recorded {}, replayed {}{}",
                    d.at_s,
                    v.vm,
                    show(v.recorded_mib),
                    show(v.replayed_mib),
                    v.replayed_reason
                        .as_ref()
                        .map(|r| format!(" ({r})"))
                        .unwrap_or_default()
                );
            }
            if let Some((r, p)) = &d.ksm {
                let show = |k: &Option<KsmSettings>| {
                    k.as_ref().map_or("keep".to_string(), ToString::to_string)
                };
                let _ = writeln!(
                    out,
                    "  t={:.0}s ksm: recorded {}, replayed {}",
                    d.at_s,
                    show(r),
                    show(p)
                );
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_count_changes_of_the_target_in_force_only() {
        let mut side = Side::default();
        side.in_force.insert("a".into(), Bytes::from_mib(1024));
        let decision = |target_mib: u64| Decision {
            at: std::time::Duration::ZERO,
            policy: "p".into(),
            host: serde_json::from_value(serde_json::json!({
                "scope": {"kind": "host"}, "total": 0, "freeable": 0, "free_ratio": 0.0,
                "free_ratio_avg": 0.0, "psi_some_avg10": null, "swap_in_per_s": null,
                "swap_out_per_s": null, "ksm": null, "ksm_reason": null
            }))
            .unwrap(),
            vms: Vec::new(),
            actions: vec![Action::SetBalloon {
                vm: "a".into(),
                target: Bytes::from_mib(target_mib),
                reason: memtide_core::Reason::new("r", "d"),
            }],
            diagnostics: Vec::new(),
        };
        let (c, _) = side.apply(&decision(900), None);
        assert_eq!(c.len(), 1);
        let (c, _) = side.apply(&decision(900), None);
        assert!(c.is_empty(), "a resend is no change");
        side.apply(&decision(1000), None);
        let m = &side.moves["a"];
        assert_eq!(m.actions, 2);
        assert_eq!(m.reclaimed_mib, 124.0);
        assert_eq!(m.given_mib, 100.0);
    }
}
