//! The results document (`bench/results/<scenario>.json`): per policy the summary numbers
//! (summed or averaged over the VMs), per VM the same, the per-second series, and the
//! targets checked.

use crate::measure::{self, round2};
use crate::run::{Base, PolicyRun, VmRun};
use crate::scenario::{Scenario, Target, BASELINE};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// The allocation band around the ideal that counts as converged.
pub const CONVERGE_TOLERANCE: f64 = 0.10;

/// Everything the document is made from.
pub struct Inputs<'a> {
    /// The scenario.
    pub scenario: &'a Scenario,
    /// Each VM's base usage.
    pub bases: &'a BTreeMap<String, Base>,
    /// The runs, baseline first.
    pub runs: &'a [PolicyRun],
    /// The domain's limit, MiB.
    pub limit_mib: Option<f64>,
    /// The host swap file the harness added for the runs, MiB.
    pub host_swap_mib: Option<u64>,
    /// The command line that produced it.
    pub command: String,
    /// Where and with what it ran.
    pub environment: Value,
}

fn opt(v: Option<f64>) -> Value {
    v.filter(|v| v.is_finite())
        .map_or(Value::Null, |v| json!(round2(v)))
}

fn series(v: &[Option<f64>]) -> Value {
    Value::Array(v.iter().map(|x| opt(*x)).collect())
}

/// Blocks for the throughput's standard error.
const SE_BLOCK_S: f64 = 10.0;

/// One VM's numbers in one run.
struct VmNumbers {
    converge_s: Option<f64>,
    mean: Option<f64>,
    max: Option<f64>,
    settled: Option<f64>,
    throughput: Option<f64>,
    throughput_se: Option<f64>,
    swap_ins: Option<u64>,
    refaults: Option<u64>,
    oom_kills: Option<u64>,
}

fn vm_numbers(s: &Scenario, run: &PolicyRun, vm: &VmRun, ideal: f64) -> VmNumbers {
    let end = f64::INFINITY;
    let delta = |key: &str| match (&vm.vmstat_before, &vm.vmstat_after) {
        (Some(b), Some(a)) => measure::vmstat_delta(b, a, key),
        _ => None,
    };
    VmNumbers {
        converge_s: measure::converge_time(&run.t_s, &vm.actual_mib, ideal, CONVERGE_TOLERANCE),
        mean: measure::mean_in(&run.t_s, &vm.actual_mib, 0.0, end),
        max: measure::max_of(&vm.actual_mib),
        settled: measure::mean_in(&run.t_s, &vm.actual_mib, s.run_s - s.settled_s, end),
        throughput: measure::throughput(&vm.lines, 0.0, end),
        throughput_se: measure::throughput_se(&vm.lines, 0.0, end, SE_BLOCK_S),
        swap_ins: delta("pswpin"),
        refaults: delta("workingset_refault_file"),
        oom_kills: delta("oom_kill"),
    }
}

fn rule_counts(vm: &VmRun) -> Value {
    let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
    for r in vm.rule.iter().flatten() {
        *counts.entry(r.as_str()).or_default() += 1;
    }
    json!(counts)
}

/// Guest /proc/vmstat counters worth seeing, as deltas over the run: swapping and
/// reclaim, and what the guest's kernel spends compacting memory for huge pages and
/// migrating its balloon's pages (each such page moved is a request to the host; kept to
/// tell whether they explain a guest stalling after its balloon moved: on the test
/// guests they did not, docs/benchmarks.md, overcommit-fpr run 11).
const VMSTAT_KEYS: [&str; 22] = [
    "pswpin",
    "pswpout",
    "pgmajfault",
    "workingset_refault_anon",
    "workingset_refault_file",
    "allocstall_dma32",
    "allocstall_normal",
    "allocstall_movable",
    "pgscan_kswapd",
    "pgscan_direct",
    "pgsteal_direct",
    "oom_kill",
    "compact_stall",
    "compact_migrate_scanned",
    "compact_daemon_migrate_scanned",
    "compact_isolated",
    "pgmigrate_success",
    "balloon_inflate",
    "balloon_deflate",
    "balloon_migrate",
    "thp_fault_alloc",
    "thp_fault_fallback",
];

/// The [`VMSTAT_KEYS`] counters' growth from `before` to `after` (/proc/vmstat texts).
fn vmstat_deltas(before: Option<&String>, after: Option<&String>) -> Value {
    let (Some(b), Some(a)) = (before, after) else {
        return Value::Null;
    };
    let m: Map<String, Value> = VMSTAT_KEYS
        .iter()
        .filter_map(|k| Some((k.to_string(), json!(measure::vmstat_delta(b, a, k)?))))
        .collect();
    Value::Object(m)
}

fn sum_u64(v: impl Iterator<Item = Option<u64>>) -> Option<u64> {
    v.sum()
}

/// The document.
pub fn document(inp: &Inputs<'_>) -> Value {
    let s = inp.scenario;
    let ideal = |name: &str, hot: f64| inp.bases.get(name).map(|b| hot + b.base_mib);
    let vms: Vec<Value> = s
        .vms
        .iter()
        .map(|v| {
            let base = inp.bases.get(&v.name);
            json!({
                "name": v.name,
                "memory_mib": v.memory_mib,
                "virtio_mem_mib": v.virtio_mem_mib,
                "workload": v.workload,
                "args": v.args,
                "start_mib": match v.start {
                    crate::scenario::Start::Full => json!("full"),
                    crate::scenario::Start::Mib(m) => json!(m),
                },
                "swap_mib": v.swap_mib,
                "data_mib": v.data_mib,
                "hot_set_mib": v.hot_set_mib,
                "base_mib": opt(base.map(|b| b.base_mib)),
                "base_mem_total_mib": opt(base.map(|b| b.mem_total_mib)),
                "base_committed_mib": opt(base.map(|b| b.committed_mib)),
                "ideal_mib": opt(ideal(&v.name, v.hot_set_mib)),
            })
        })
        .collect();
    let baseline = inp.runs.iter().find(|r| r.policy == BASELINE);
    // Each VM's full-memory throughput and its standard error.
    let baseline_tp: BTreeMap<&str, Option<(f64, f64)>> = s
        .vms
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let tp = baseline.and_then(|b| b.vms.get(i)).and_then(|vm| {
                let end = f64::INFINITY;
                let t = measure::throughput(&vm.lines, 0.0, end)?;
                let se = measure::throughput_se(&vm.lines, 0.0, end, SE_BLOCK_S).unwrap_or(0.0);
                Some((t, se))
            });
            (v.name.as_str(), tp)
        })
        .collect();
    let mut policies = Map::new();
    for run in inp.runs {
        let mut per_vm = Map::new();
        let mut series_vms = Map::new();
        let mut all = Vec::new();
        let mut ses = Vec::new();
        for (spec, vm) in s.vms.iter().zip(&run.vms) {
            let ideal_mib = ideal(&spec.name, spec.hot_set_mib).unwrap_or(f64::NAN);
            let n = vm_numbers(s, run, vm, ideal_mib);
            let (ratio, ratio_se) = match (n.throughput, baseline_tp[spec.name.as_str()]) {
                (Some(_), Some(_)) if run.policy == BASELINE => (Some(1.0), None),
                (Some(t), Some((b, b_se))) if b > 0.0 => (
                    Some(t / b),
                    Some(measure::ratio_se(
                        t,
                        n.throughput_se.unwrap_or(0.0),
                        b,
                        b_se,
                    )),
                ),
                _ => (None, None),
            };
            per_vm.insert(
                spec.name.clone(),
                json!({
                    "converge_s": opt(n.converge_s),
                    "memory_mib_mean": opt(n.mean),
                    "memory_mib_max": opt(n.max),
                    "memory_mib_settled": opt(n.settled),
                    "start_mib": opt(vm.start_actual_mib),
                    "ideal_mib": opt(Some(ideal_mib)),
                    "throughput_mib_per_s": opt(n.throughput),
                    "throughput_cv": opt(measure::rate_cv(&vm.lines, 0.0, f64::INFINITY)),
                    "cpu_mean": opt(measure::mean_in(&run.t_s, &vm.cpu, 0.0, f64::INFINITY)),
                    "throughput_ratio": ratio.map_or(Value::Null, |r| json!((r * 1000.0).round() / 1000.0)),
                    "throughput_ratio_se": ratio_se.map_or(Value::Null, |r| json!((r * 1000.0).round() / 1000.0)),
                    "swap_ins": n.swap_ins,
                    "refaults": n.refaults,
                    "oom_kills": n.oom_kills,
                    "console_oom_lines": vm.console_oom_lines,
                    "qemu_exit": vm.qemu_exit,
                    "rules": rule_counts(vm),
                    "vmstat_delta": vmstat_deltas(vm.vmstat_before.as_ref(), vm.vmstat_after.as_ref()),
                }),
            );
            series_vms.insert(
                spec.name.clone(),
                json!({
                    "actual_mib": series(&vm.actual_mib),
                    "target_mib": series(&vm.target_mib),
                    "estimate_mib": series(&vm.estimate_mib),
                    "available_mib": series(&vm.available_mib),
                    "committed_mib": series(&vm.committed_mib),
                    "rss_mib": series(&vm.rss_mib),
                    "huge_mib": series(&vm.huge_mib),
                    "cpu": series(&vm.cpu),
                    "swap_in_per_s": series(&vm.swap_in_per_s),
                    "refaults_per_s": series(&vm.refaults_per_s),
                    "psi_some_avg10": series(&vm.psi_some_avg10),
                    "throughput_mib_per_s": series(&vm.throughput),
                    "rule": vm.rule,
                    "reason": vm.reason,
                    "report_lines": {
                        "at_s": vm.lines.iter().map(|l| round2(l.at_s)).collect::<Vec<_>>(),
                        "t": vm.lines.iter().map(|l| l.t).collect::<Vec<_>>(),
                        "mib_per_s": vm.lines.iter().map(|l| round2(l.mib_per_s)).collect::<Vec<_>>(),
                    },
                }),
            );
            all.push((n, ratio, ideal_mib));
            ses.push(ratio_se);
        }
        let actuals: Vec<&[Option<f64>]> =
            run.vms.iter().map(|v| v.actual_mib.as_slice()).collect();
        let total = measure::sum_series(&actuals);
        let end = f64::INFINITY;
        let converge = all
            .iter()
            .map(|(n, _, _)| n.converge_s)
            .collect::<Option<Vec<f64>>>()
            .and_then(|v| v.into_iter().reduce(f64::max));
        let ratios: Option<Vec<f64>> = all.iter().map(|(_, r, _)| *r).collect();
        let ratio = ratios
            .filter(|r| !r.is_empty())
            .map(|r| r.iter().sum::<f64>() / r.len() as f64);
        // The mean of the VMs' ratios: its standard error from theirs.
        let ratio_se = ses
            .iter()
            .copied()
            .collect::<Option<Vec<f64>>>()
            .filter(|_| run.policy != BASELINE)
            .filter(|v| !v.is_empty())
            .map(|v| v.iter().map(|x| x * x).sum::<f64>().sqrt() / v.len() as f64);
        let hot: f64 = all.iter().map(|(_, _, i)| i).sum();
        let qemu_exits = run.vms.iter().filter(|v| v.qemu_exit.is_some()).count();
        policies.insert(
            run.policy.clone(),
            json!({
                "converge_s": opt(converge),
                "memory_mib_mean": opt(measure::mean_in(&run.t_s, &total, 0.0, end)),
                "memory_mib_max": opt(measure::max_of(&total)),
                "memory_mib_settled": opt(measure::mean_in(&run.t_s, &total, s.run_s - s.settled_s, end)),
                "hot_set_mib": opt(Some(hot)),
                "throughput_ratio": ratio.map_or(Value::Null, |r| json!((r * 1000.0).round() / 1000.0)),
                "throughput_ratio_se": ratio_se.map_or(Value::Null, |r| json!((r * 1000.0).round() / 1000.0)),
                "swap_ins": sum_u64(all.iter().map(|(n, _, _)| n.swap_ins)),
                "total_throughput": all
                    .iter()
                    .map(|(n, _, _)| n.throughput)
                    .sum::<Option<f64>>()
                    .map(round2),
                "guest_swap_ins": sum_u64(all.iter().map(|(n, _, _)| n.swap_ins)),
                "host_swap_ins": run
                    .host_vmstat
                    .as_ref()
                    .and_then(|(before, after)| measure::vmstat_delta(before, after, "pswpin")),
                "host_vmstat_delta": vmstat_deltas(
                    run.host_vmstat.as_ref().map(|v| &v.0),
                    run.host_vmstat.as_ref().map(|v| &v.1),
                ),
                "refaults": sum_u64(all.iter().map(|(n, _, _)| n.refaults)),
                "oom_kills": sum_u64(all.iter().map(|(n, _, _)| n.oom_kills)),
                "qemu_exits": qemu_exits,
                "loadavg_mean": opt(measure::mean_in(&run.t_s, &run.loadavg, 0.0, end)),
                "foreign_qemu_s": run.foreign_qemus.iter().flatten().filter(|n| **n > 0.0).count(),
                "other_cpu_mean": opt(measure::mean_in(&run.t_s, &run.other_cpu, 0.0, end)),
                "balloon_actions": run.balloon_actions,
                "action_rules": run.action_rules,
                "diagnostics": run.diagnostics,
                "error": run.error,
                "vms": per_vm,
                "series": {
                    "t_s": run.t_s.iter().map(|t| round2(*t)).collect::<Vec<_>>(),
                    "host_free_ratio": Value::Array(run.host_free_ratio.iter().map(|x| x.map_or(Value::Null, |x| json!((x * 10000.0).round() / 10000.0))).collect()),
                    "domain_usage_mib": series(&run.domain_usage_mib),
                    "loadavg": series(&run.loadavg),
                    "foreign_qemus": series(&run.foreign_qemus),
                    "other_cpu": series(&run.other_cpu),
                    "vms": series_vms,
                },
            }),
        );
    }
    let mut doc = json!({
        "scenario": s.name,
        "description": s.description,
        "command": inp.command,
        "environment": inp.environment,
        "settings": {
            "warmup_s": s.warmup_s,
            "run_s": s.run_s,
            "interval_s": s.interval_s,
            "settled_s": s.settled_s,
            "pressure_free": s.pressure_free,
            "domain_limit_mib": opt(inp.limit_mib),
            "host_swap_mib": inp.host_swap_mib,
            "converge_tolerance": CONVERGE_TOLERANCE,
            "config": s.config,
        },
        "order": inp.runs.iter().map(|r| r.policy.clone()).collect::<Vec<_>>(),
        "vms": vms.len(),
        "guests": vms,
        "policies": policies,
    });
    let targets: Vec<Value> = s.targets.iter().map(|t| check_target(&doc, t)).collect();
    doc["targets"] = Value::Array(targets);
    doc
}

/// Check a target against the document's numbers.
///
/// A null `converge_s` means "never": as a bound it is infinite (a policy that converges
/// beats one that never does); as a value it meets no bound.
pub fn check_target(doc: &Value, t: &Target) -> Value {
    let never = |v: &Value| t.metric == "converge_s" && v.is_null();
    let value = doc["policies"][&t.policy][&t.metric].as_f64();
    let bound = match &t.of {
        None => Some(t.value),
        Some(of) if of == "ideal" => doc["policies"][&t.policy]["hot_set_mib"]
            .as_f64()
            .map(|h| t.value * h),
        Some(of) if never(&doc["policies"][of][&t.metric]) => Some(f64::INFINITY),
        Some(of) => doc["policies"][of][&t.metric].as_f64().map(|v| t.value * v),
    };
    let met = t.met(value, bound);
    json!({
        "target": t.describe(),
        "policy": t.policy,
        "metric": t.metric,
        "value": opt(value),
        "bound": match bound {
            Some(b) if b.is_infinite() => json!("never"),
            b => opt(b),
        },
        "met": met,
    })
}

/// One line per checked target.
pub fn targets_text(doc: &Value) -> String {
    let num = |v: &Value| match v.as_f64() {
        Some(x) => format!("{x:.1}"),
        None => "-".into(),
    };
    let mut out = String::new();
    for t in doc["targets"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "target {}: {} (bound {}) {}\n",
            t["target"].as_str().unwrap_or("?"),
            num(&t["value"]),
            t["bound"]
                .as_str()
                .map_or_else(|| num(&t["bound"]), str::to_string),
            if t["met"] == true { "met" } else { "NOT met" }
        ));
    }
    out
}

/// JSON with objects indented and arrays of numbers, strings or nulls on one line.
pub fn to_text(v: &Value) -> String {
    fn write(out: &mut String, v: &Value, indent: usize) {
        let pad = |n: usize| "  ".repeat(n);
        match v {
            Value::Object(m) if !m.is_empty() => {
                out.push_str("{\n");
                for (i, (k, x)) in m.iter().enumerate() {
                    out.push_str(&pad(indent + 1));
                    out.push_str(&Value::String(k.clone()).to_string());
                    out.push_str(": ");
                    write(out, x, indent + 1);
                    if i + 1 < m.len() {
                        out.push(',');
                    }
                    out.push('\n');
                }
                out.push_str(&pad(indent));
                out.push('}');
            }
            Value::Array(a) if a.iter().any(|x| x.is_object() || x.is_array()) => {
                out.push_str("[\n");
                for (i, x) in a.iter().enumerate() {
                    out.push_str(&pad(indent + 1));
                    write(out, x, indent + 1);
                    if i + 1 < a.len() {
                        out.push(',');
                    }
                    out.push('\n');
                }
                out.push_str(&pad(indent));
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut out = String::new();
    write(&mut out, v, 0);
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::Line;

    fn scenario() -> Scenario {
        Scenario::parse(
            r#"
            description = "shape"
            warmup_s = 1
            run_s = 4
            settled_s = 2
            policies = ["memtide", "tws"]
            [[vm]]
            name = "a"
            memory_mib = 384
            workload = "memknobs"
            args = ["60:1000"]
            swap_mib = 128
            hot_set_mib = 60
            [[vm]]
            name = "b"
            memory_mib = 384
            workload = "memknobs"
            args = ["180:1000"]
            start_mib = 160
            swap_mib = 128
            hot_set_mib = 180
            [[target]]
            policy = "memtide"
            metric = "converge_s"
            at_most = 0.5
            of = "tws"
            [[target]]
            policy = "memtide"
            metric = "memory_mib_mean"
            at_most = 1.15
            of = "ideal"
            [[target]]
            policy = "memtide"
            metric = "oom_kills"
            at_most = 0
            "#,
            "shape",
        )
        .unwrap()
    }

    fn vm(name: &str, actual: &[f64], rate: f64, swap: u64) -> VmRun {
        VmRun {
            name: name.into(),
            actual_mib: actual.iter().map(|v| Some(*v)).collect(),
            rule: vec![Some("memtide.probe".into()); actual.len()],
            lines: (0..5)
                .map(|i| Line {
                    at_s: i as f64 - 0.5,
                    t: 10.0 + i as f64,
                    mib_per_s: rate,
                    refaults: None,
                })
                .collect(),
            vmstat_before: Some("pswpin 0\nworkingset_refault_file 0\noom_kill 0\n".into()),
            vmstat_after: Some(format!(
                "pswpin {swap}\nworkingset_refault_file 3\noom_kill 0\n"
            )),
            ..VmRun::default()
        }
    }

    fn run(policy: &str, a: &[f64], b: &[f64], rate: f64) -> PolicyRun {
        PolicyRun {
            policy: policy.into(),
            t_s: vec![1.0, 2.0, 3.0, 4.0],
            host_free_ratio: vec![Some(0.2); 4],
            domain_usage_mib: vec![Some(600.0); 4],
            vms: vec![vm("a", a, rate, 10), vm("b", b, rate, 20)],
            ..PolicyRun::default()
        }
    }

    #[test]
    fn the_document_has_the_documented_shape_and_numbers() {
        let s = scenario();
        let base = Base {
            base_mib: 40.0,
            mem_total_mib: 350.0,
            committed_mib: 20.0,
        };
        let bases: BTreeMap<String, Base> =
            [("a".to_string(), base.clone()), ("b".to_string(), base)].into();
        // Ideals: a 100, b 220.
        let mut runs = [
            run("none", &[384.0; 4], &[384.0; 4], 100.0),
            run(
                "memtide",
                &[200.0, 100.0, 100.0, 100.0],
                &[160.0, 220.0, 220.0, 220.0],
                99.0,
            ),
            run(
                "tws",
                &[300.0, 200.0, 105.0, 100.0],
                &[160.0, 160.0, 230.0, 220.0],
                90.0,
            ),
        ];
        let vmstat = |alloc: u64, fallback: u64| {
            format!("thp_fault_alloc {alloc}\nthp_fault_fallback {fallback}\npswpin 5\n")
        };
        runs[1].host_vmstat = Some((vmstat(10, 2), vmstat(25, 9)));
        let doc = document(&Inputs {
            scenario: &s,
            bases: &bases,
            runs: &runs,
            limit_mib: Some(700.0),
            host_swap_mib: None,
            command: "memtide-bench shape.toml".into(),
            environment: json!({}),
        });
        assert_eq!(doc["scenario"], "shape");
        assert_eq!(doc["command"], "memtide-bench shape.toml");
        assert_eq!(doc["order"], json!(["none", "memtide", "tws"]));
        assert_eq!(doc["guests"][1]["ideal_mib"], 220.0);
        assert_eq!(doc["vms"], 2);
        for p in ["none", "memtide", "tws"] {
            let r = &doc["policies"][p];
            for key in [
                "converge_s",
                "memory_mib_mean",
                "memory_mib_max",
                "hot_set_mib",
                "throughput_ratio",
                "swap_ins",
                "refaults",
                "oom_kills",
            ] {
                assert!(r.get(key).is_some(), "{p}.{key} is present");
            }
            assert!(r["converge_s"].is_number() || r["converge_s"].is_null());
            assert!(r["memory_mib_mean"].is_number());
            assert!(r["throughput_ratio"].is_number());
            assert!(r["swap_ins"].is_u64() && r["oom_kills"].is_u64());
            assert_eq!(r["series"]["t_s"].as_array().unwrap().len(), 4);
            assert_eq!(
                r["series"]["vms"]["a"]["actual_mib"]
                    .as_array()
                    .unwrap()
                    .len(),
                4
            );
        }
        let m = &doc["policies"]["memtide"];
        assert_eq!(m["converge_s"], 2.0, "a at 2 s, b at 2 s");
        assert_eq!(
            doc["policies"]["tws"]["converge_s"], 3.0,
            "a at 3 s, b at 3 s"
        );
        assert_eq!(doc["policies"]["none"]["converge_s"], Value::Null);
        assert_eq!(m["hot_set_mib"], 320.0);
        assert_eq!(m["memory_mib_mean"], (360.0 + 320.0 * 3.0) / 4.0);
        assert_eq!(m["memory_mib_max"], 360.0);
        assert_eq!(m["memory_mib_settled"], 320.0);
        assert_eq!(m["throughput_ratio"], 0.99);
        assert_eq!(doc["policies"]["none"]["throughput_ratio"], 1.0);
        assert_eq!(m["swap_ins"], 30);
        assert_eq!(m["refaults"], 6);
        assert_eq!(m["vms"]["a"]["rules"]["memtide.probe"], 4);
        // The host's huge page faults over the run, where it was read.
        assert_eq!(m["host_vmstat_delta"]["thp_fault_alloc"], 15);
        assert_eq!(m["host_vmstat_delta"]["thp_fault_fallback"], 7);
        assert_eq!(doc["policies"]["none"]["host_vmstat_delta"], Value::Null);
        let targets = doc["targets"].as_array().unwrap();
        assert_eq!(targets[0]["target"], "memtide converge_s ≤ 0.5 × tws");
        assert_eq!(
            (targets[0]["value"].clone(), targets[0]["bound"].clone()),
            (json!(2.0), json!(1.5))
        );
        assert_eq!(targets[0]["met"], false);
        assert_eq!(targets[1]["met"], true, "330 ≤ 1.15 × 320");
        assert_eq!(targets[2]["met"], true);
        // The text form is valid JSON with series on one line.
        let text = to_text(&doc);
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), doc);
        assert!(
            text.contains("\"t_s\": [1.0,2.0,3.0,4.0]"),
            "{}",
            &text[..400]
        );
    }

    #[test]
    fn a_policy_that_never_converges_is_beaten_by_one_that_does() {
        let s = scenario();
        let t = &s.targets[0];
        let doc =
            json!({"policies": {"memtide": {"converge_s": 40.0}, "tws": {"converge_s": null}}});
        let r = check_target(&doc, t);
        assert_eq!(
            (r["bound"].clone(), r["met"].clone()),
            (json!("never"), json!(true))
        );
        let doc =
            json!({"policies": {"memtide": {"converge_s": null}, "tws": {"converge_s": null}}});
        assert_eq!(check_target(&doc, t)["met"], false);
        let doc =
            json!({"policies": {"memtide": {"converge_s": null}, "tws": {"converge_s": 30.0}}});
        assert_eq!(check_target(&doc, t)["met"], false);
    }

    #[test]
    fn a_missing_counter_makes_the_sum_null_and_a_target_on_null_unmet() {
        let s = scenario();
        let bases = BTreeMap::new();
        let mut r = run("memtide", &[1.0; 4], &[1.0; 4], 1.0);
        r.vms[1].vmstat_after = None;
        let doc = document(&Inputs {
            scenario: &s,
            bases: &bases,
            runs: &[r],
            limit_mib: None,
            host_swap_mib: None,
            command: String::new(),
            environment: json!({}),
        });
        let m = &doc["policies"]["memtide"];
        assert_eq!(m["swap_ins"], Value::Null);
        assert_eq!(m["throughput_ratio"], Value::Null, "no baseline");
        assert_eq!(doc["targets"][2]["met"], false);
    }
}
