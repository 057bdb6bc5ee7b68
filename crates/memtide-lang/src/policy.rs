//! Policy files as a memtide policy: the engine's view of the host and the guests becomes
//! the language's `Host` and `Guests` (MOM's statistic names and units, KiB), and the
//! controls a script requests become balloon and KSM proposals.

use crate::{Input, Limits, PolicyError, Program, Sample, Source, Value};
use memtide_core::action::{KsmSettings, Reason};
use memtide_core::history::History;
use memtide_core::policy::{
    KsmProposal, Policy, PolicyFault, PolicyInput, PolicyOutput, Proposal, VmInput,
};
use memtide_core::stats::HostStats;
use memtide_core::{Bytes, VmSample};
use std::collections::BTreeMap;

/// A policy written in the policy language.
pub struct ScriptPolicy {
    program: Program,
    name: String,
    limits: Limits,
}

impl ScriptPolicy {
    /// A policy from parsed sources; it is named after its files. Unlike
    /// [`ScriptPolicy::parse`], this does not [`Program::check`] the program.
    pub fn new(program: Program, limits: Limits) -> ScriptPolicy {
        let name = program.files().join(",");
        ScriptPolicy {
            program,
            name,
            limits,
        }
    }

    /// Parse sources into a policy, refusing calls that fail whenever they run (see
    /// [`Program::check`]).
    pub fn parse(sources: &[Source], limits: Limits) -> Result<ScriptPolicy, PolicyError> {
        let program = Program::parse(sources)?;
        program.check()?;
        Ok(ScriptPolicy::new(program, limits))
    }
}

fn kib(b: Bytes) -> Value {
    Value::Int(b.kib().min(i64::MAX as u64) as i64)
}

fn count(n: u64) -> Value {
    Value::Int(n.min(i64::MAX as u64) as i64)
}

fn put(sample: &mut Sample, name: &str, value: Option<Value>) {
    if let Some(v) = value {
        sample.insert(name.to_string(), v);
    }
}

/// The host's statistics under MOM's names. `swap_in`/`swap_out` are pages since the
/// previous sample; `ksm_shareable` is the guests' resident memory.
fn host_sample(prev: Option<&HostStats>, h: &HostStats, shareable: Option<Bytes>) -> Sample {
    let mut s = Sample::new();
    let d = &h.domain;
    put(&mut s, "mem_available", Some(kib(d.total)));
    put(&mut s, "mem_unused", Some(kib(d.total - d.used)));
    put(&mut s, "mem_free", Some(kib(d.freeable)));
    let delta = |f: fn(&HostStats) -> Option<u64>| Some(count(f(h)?.checked_sub(f(prev?)?)?));
    put(&mut s, "swap_in", delta(|h| h.vmstat.pswpin));
    put(&mut s, "swap_out", delta(|h| h.vmstat.pswpout));
    put(&mut s, "anon_pages", h.meminfo.anon_pages.map(kib));
    put(&mut s, "swap_total", Some(kib(h.meminfo.swap_total)));
    put(
        &mut s,
        "swap_usage",
        Some(kib(h.meminfo.swap_total - h.meminfo.swap_free)),
    );
    if let Some(k) = &h.ksm {
        for (name, v) in [
            ("ksm_run", k.run),
            ("ksm_pages_to_scan", k.pages_to_scan),
            ("ksm_sleep_millisecs", k.sleep_millisecs),
            ("ksm_pages_shared", k.pages_shared),
            ("ksm_pages_sharing", k.pages_sharing),
            ("ksm_pages_unshared", k.pages_unshared),
            ("ksm_pages_volatile", k.pages_volatile),
            ("ksm_full_scans", k.full_scans),
        ] {
            put(&mut s, name, Some(count(v)));
        }
        put(
            &mut s,
            "ksm_merge_across_nodes",
            k.merge_across_nodes.map(count),
        );
        put(&mut s, "ksm_shareable", shareable.map(kib));
    }
    s
}

/// A guest's statistics under MOM's names (KiB; faults are counts since boot).
fn guest_sample(vm: &VmInput<'_>, s: &VmSample) -> Sample {
    let mut out = Sample::new();
    let g = &s.stats;
    put(&mut out, "mem_available", g.total.map(kib));
    put(&mut out, "mem_unused", g.free.map(kib));
    put(
        &mut out,
        "mem_free",
        g.free.map(|f| kib(f + g.disk_caches.unwrap_or_default())),
    );
    put(&mut out, "major_fault", g.major_faults.map(count));
    put(&mut out, "minor_fault", g.minor_faults.map(count));
    put(&mut out, "swap_in", g.swap_in.map(kib));
    put(&mut out, "swap_out", g.swap_out.map(kib));
    put(&mut out, "balloon_cur", s.balloon.map(kib));
    put(&mut out, "balloon_max", Some(kib(vm.limits.max)));
    put(&mut out, "balloon_min", Some(kib(vm.limits.min)));
    put(&mut out, "rss", s.rss.map(kib));
    out
}

/// The language's input for one tick. Like MOM, only guests whose balloon statistics
/// have arrived are shown; the others are returned as faults.
fn input(policy: &PolicyInput<'_>) -> (Input, Vec<PolicyFault>) {
    let mut faults = Vec::new();
    let mut guests = Vec::new();
    for vm in policy.vms {
        if vm.latest().stats.free.is_none() {
            faults.push(PolicyFault {
                vm: Some(vm.name.to_string()),
                message: "not shown to the policy: no balloon statistics from the guest yet".into(),
            });
            continue;
        }
        let mut props = BTreeMap::new();
        props.insert("name".to_string(), Value::from(vm.name));
        let stats = vm.history.iter().map(|s| guest_sample(vm, s)).collect();
        guests.push(crate::EntityInput { props, stats });
    }
    let rss: Option<Bytes> = policy.vms.iter().map(|vm| vm.latest().rss).sum();
    let host_stats = host_history(policy.host, rss);
    let host = crate::EntityInput {
        props: BTreeMap::new(),
        stats: host_stats,
    };
    (Input { host, guests }, faults)
}

fn host_history(history: &History<HostStats>, shareable: Option<Bytes>) -> Vec<Sample> {
    let mut prev = None;
    history
        .iter()
        .map(|h| {
            let s = host_sample(prev, h, shareable);
            prev = Some(h);
            s
        })
        .collect()
}

/// The whole number memtide applies for control `name` requested as `value` (a float is
/// truncated toward zero, a boolean is 0 or 1), or why it refuses the request: a value
/// that is not a number, is negative or not finite, or is outside the control's range
/// (`ksm_run` 0, 1 or 2; `ksm_merge_across_nodes` 0 or 1; `ksm_pages_to_scan` and
/// `ksm_sleep_millisecs` at most 4294967295, as the kernel takes them).
pub fn control_value(name: &str, value: &Value) -> Result<u64, String> {
    let n = match value {
        Value::Int(n) => *n as f64,
        Value::Float(x) => *x,
        Value::Bool(b) => f64::from(u8::from(*b)),
        other => {
            return Err(format!(
                "{name}: expected a number, got {}",
                other.type_name()
            ))
        }
    };
    if !n.is_finite() {
        return Err(format!("{name}: {n} is not a finite number"));
    }
    if n < 0.0 {
        return Err(format!("{name}: {n} is negative"));
    }
    // Saturates: a balloon target beyond any VM's maximum is capped at it.
    let whole = n as u64;
    let (max, range) = match name {
        "ksm_run" => (2, "0, 1 or 2"),
        "ksm_merge_across_nodes" => (1, "0 or 1"),
        "ksm_pages_to_scan" | "ksm_sleep_millisecs" => (u64::from(u32::MAX), "at most 4294967295"),
        _ => (u64::MAX, ""),
    };
    if whole > max {
        return Err(format!("{name}: {n} is out of range ({range})"));
    }
    Ok(whole)
}

impl Policy for ScriptPolicy {
    fn name(&self) -> &str {
        &self.name
    }

    fn decide(&mut self, policy: &PolicyInput<'_>) -> PolicyOutput {
        let (input, faults) = input(policy);
        let mut out = PolicyOutput {
            faults,
            ..PolicyOutput::default()
        };
        let evaluation = self.program.evaluate(&input, &self.limits);
        let debug = match &evaluation {
            Ok(evaluation) => &evaluation.debug,
            Err(error) => &error.debug,
        };
        for line in debug {
            tracing::debug!(target: "memtide::policy", policy = %self.name, "{line}");
        }
        let evaluation = match evaluation {
            Ok(e) => e,
            Err(e) => {
                // Nothing is proposed: every VM keeps its current target.
                out.faults.push(PolicyFault {
                    vm: None,
                    message: e.to_string(),
                });
                return out;
            }
        };
        let rule = format!("script:{}", self.name);
        for (vm, controls) in &evaluation.controls.guests {
            let Some(v) = controls.get("balloon_target") else {
                continue;
            };
            match control_value("balloon_target", v) {
                Ok(k) => {
                    let reason = Reason::new(
                        rule.clone(),
                        format!("balloon_target {k} KiB requested by the policy"),
                    );
                    out.balloon.insert(
                        vm.clone(),
                        Proposal {
                            target: Bytes::from_kib(k),
                            reason,
                        },
                    );
                }
                Err(message) => out.faults.push(PolicyFault {
                    vm: Some(vm.clone()),
                    message,
                }),
            }
        }
        let host = &evaluation.controls.host;
        if !host.is_empty() {
            let mut settings = KsmSettings::default();
            let mut bad = Vec::new();
            for (name, v) in host {
                let slot = match name.as_str() {
                    "ksm_run" => &mut settings.run,
                    "ksm_pages_to_scan" => &mut settings.pages_to_scan,
                    "ksm_sleep_millisecs" => &mut settings.sleep_millisecs,
                    "ksm_merge_across_nodes" => &mut settings.merge_across_nodes,
                    _ => continue,
                };
                match control_value(name, v) {
                    Ok(n) => *slot = Some(n),
                    Err(e) => bad.push(e),
                }
            }
            if bad.is_empty() {
                let reason = Reason::new(rule, format!("{settings} requested by the policy"));
                out.ksm = Some(KsmProposal { settings, reason });
            } else {
                // Nothing half-applied: the other KSM settings may only make sense with it.
                out.faults.push(PolicyFault {
                    vm: None,
                    message: format!(
                        "{}; the whole KSM proposal is dropped (KSM keeps its settings)",
                        bad.join("; ")
                    ),
                });
            }
        }
        out
    }
}
