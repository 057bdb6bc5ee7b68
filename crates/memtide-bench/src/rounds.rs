//! Rounds (`--rounds N`): the baseline and the policies run in turn N times, and the
//! baseline once more at the end, so that every policy run has a baseline run right
//! before and right after it. On a shared host one run's ratio to one baseline run moves
//! with the host's speed (on the build machine, 2026-12-04, none's throughput drifted 27%
//! within 20 minutes while memtide's moved 5%): comparing each policy run with the mean
//! of the baseline runs around it cancels a drift linear in time, and the spread over
//! the rounds says how far one round's ratio can be trusted.

use crate::measure::round2;
use crate::scenario::{Target, BASELINE, METRICS};
use serde_json::{json, Map, Value};

/// The policies' order in round `r` (from 0): the scenario's, turned left by `r`. A run
/// leaves the host in a state the next one starts from, and a policy at a round's end
/// runs farther from the baseline before it than one at its start: turned round by round,
/// every policy follows the baseline and each other policy, and runs at each position,
/// equally often over every `policies.len()` rounds.
pub fn turn(policies: &[String], r: usize) -> impl Iterator<Item = &str> {
    let n = policies.len().max(1);
    policies
        .iter()
        .cycle()
        .skip(r % n)
        .take(policies.len())
        .map(String::as_str)
}

/// The mean of the values, `None` where one is missing or there are none.
fn mean(values: &[Option<f64>]) -> Option<f64> {
    let v: Option<Vec<f64>> = values.iter().copied().collect();
    v.filter(|v| !v.is_empty())
        .map(|v| v.iter().sum::<f64>() / v.len() as f64)
}

/// The sample standard deviation (0 for a single value), `None` where one is missing.
fn sd(values: &[Option<f64>]) -> Option<f64> {
    let m = mean(values)?;
    let n = values.len() as f64;
    if n < 2.0 {
        return Some(0.0);
    }
    Some(
        (values
            .iter()
            .flatten()
            .map(|x| (x - m).powi(2))
            .sum::<f64>()
            / (n - 1.0))
            .sqrt(),
    )
}

fn num(v: Option<f64>) -> Value {
    v.filter(|x| x.is_finite())
        .map_or(Value::Null, |x| json!((x * 1000.0).round() / 1000.0))
}

/// `{"each", "mean", "sd"}` of per-round ratios.
fn spread(each: &[Option<f64>]) -> Value {
    json!({
        "each": each.iter().map(|x| num(*x)).collect::<Vec<_>>(),
        "mean": num(mean(each)),
        "sd": num(sd(each)),
    })
}

/// Each VM's throughput in a results document's run of `policy`, by VM.
fn vm_throughputs(doc: &Value, policy: &str) -> Map<String, Value> {
    doc["policies"][policy]["vms"]
        .as_object()
        .map(|vms| {
            vms.iter()
                .map(|(name, v)| (name.clone(), v["throughput_mib_per_s"].clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// The summary of the rounds: `rounds` holds one results document per round (the
/// baseline's run first), `last_baseline` the document of the baseline's run after the
/// last round. Per policy, each round's value of every target metric; the baseline's
/// `R + 1` runs; and each policy run's total and per-VM throughput over the mean of the
/// baseline runs around it (`total_throughput_ratio`, `throughput_ratio`: `each`,
/// `mean`, `sd`).
pub fn summary(rounds: &[Value], last_baseline: &Value) -> Value {
    let baselines: Vec<&Value> = rounds.iter().chain([last_baseline]).collect();
    let values = |docs: &[&Value], policy: &str, metric: &str| -> Vec<Option<f64>> {
        docs.iter()
            .map(|d| d["policies"][policy][metric].as_f64())
            .collect()
    };
    let per_metric = |docs: &[&Value], policy: &str| -> Map<String, Value> {
        METRICS
            .iter()
            .filter(|m| **m != "throughput_ratio")
            .map(|m| {
                let each: Vec<Value> = values(docs, policy, m).into_iter().map(num).collect();
                (m.to_string(), Value::Array(each))
            })
            .collect()
    };
    let mut policies = Map::new();
    policies.insert(
        BASELINE.to_string(),
        Value::Object(per_metric(&baselines, BASELINE)),
    );
    let names: Vec<String> = rounds
        .first()
        .and_then(|d| d["order"].as_array())
        .into_iter()
        .flatten()
        .filter_map(|p| p.as_str())
        .filter(|p| *p != BASELINE)
        .map(str::to_string)
        .collect();
    let docs: Vec<&Value> = rounds.iter().collect();
    let none_totals = values(&baselines, BASELINE, "total_throughput");
    for name in names {
        let mut m = per_metric(&docs, &name);
        m.insert(
            "hot_set_mib".into(),
            rounds[0]["policies"][&name]["hot_set_mib"].clone(),
        );
        let totals = values(&docs, &name, "total_throughput");
        let total_ratio: Vec<Option<f64>> = (0..rounds.len())
            .map(|r| Some(totals[r]? / mean(&none_totals[r..r + 2]).filter(|b| *b > 0.0)?))
            .collect();
        let vm_ratio: Vec<Option<f64>> = (0..rounds.len())
            .map(|r| {
                let before = vm_throughputs(baselines[r], BASELINE);
                let after = vm_throughputs(baselines[r + 1], BASELINE);
                let ratios: Vec<Option<f64>> = vm_throughputs(&rounds[r], &name)
                    .iter()
                    .map(|(vm, t)| {
                        let b = mean(&[before.get(vm)?.as_f64(), after.get(vm)?.as_f64()])?;
                        Some(t.as_f64()? / Some(b).filter(|b| *b > 0.0)?)
                    })
                    .collect();
                mean(&ratios)
            })
            .collect();
        m.insert("total_throughput_ratio".into(), spread(&total_ratio));
        m.insert("throughput_ratio".into(), spread(&vm_ratio));
        policies.insert(name, Value::Object(m));
    }
    json!({
        "count": rounds.len(),
        "how": "the baseline and the policies in turn, round after round, the policies' order turned by one each \
                round, and the baseline once more at the end; a policy's ratios are to the mean of the baseline \
                runs of its round and the next",
        "order": rounds
            .iter()
            .flat_map(|d| d["order"].as_array().cloned().unwrap_or_default())
            .chain([json!(BASELINE)])
            .collect::<Vec<_>>(),
        "policies": policies,
    })
}

/// `t` checked over the rounds (`summary`'s document): the policy's mean over its runs
/// against the bound times the mean of what it is relative to — another policy's runs,
/// for the baseline the mean of the runs around each of the policy's, or the policy's
/// hot set — or the bound itself. A run missing the metric (a `converge_s` that never
/// came) leaves the value unknown, and the target unmet; an unknown figure of what it is
/// relative to, the bound.
pub fn check_target(rounds: &Value, t: &Target) -> Value {
    // Each run's value: a metric's runs, or a ratio's `each`.
    let runs = |policy: &str| -> Option<Vec<Option<f64>>> {
        let v = &rounds["policies"][policy][&t.metric];
        let a = v.as_array().or_else(|| v["each"].as_array())?;
        Some(a.iter().map(Value::as_f64).collect())
    };
    let value = runs(&t.policy).and_then(|v| mean(&v));
    let of = match t.of.as_deref() {
        None => Some(1.0),
        Some("ideal") => rounds["policies"][&t.policy]["hot_set_mib"].as_f64(),
        Some(BASELINE) => runs(BASELINE).and_then(|b| {
            let around: Vec<Option<f64>> = b.windows(2).map(mean).collect();
            mean(&around)
        }),
        Some(other) => runs(other).and_then(|v| mean(&v)),
    };
    let bound = of.map(|o| t.value * o);
    let met = t.met(value, bound);
    json!({
        "target": t.describe(),
        "policy": t.policy,
        "metric": t.metric,
        "value": value.map_or(Value::Null, |v| json!(round2(v))),
        "bound": bound.map_or(Value::Null, |b| json!(round2(b))),
        "met": met,
        "over_rounds": rounds["count"],
    })
}

/// One line per policy: its total and per-VM throughput over the baseline around it.
pub fn text(rounds: &Value) -> String {
    let mut out = String::new();
    let f = |v: &Value| v.as_f64().map_or("-".to_string(), |x| format!("{x:.3}"));
    for (name, p) in rounds["policies"].as_object().into_iter().flatten() {
        if name == BASELINE {
            continue;
        }
        let line = |key: &str| {
            let s = &p[key];
            let each: Vec<String> = s["each"].as_array().into_iter().flatten().map(f).collect();
            format!("{} ± {} ({})", f(&s["mean"]), f(&s["sd"]), each.join(", "))
        };
        out.push_str(&format!(
            "{name} over {} rounds, × none around each run: total throughput {}; per VM {}\n",
            rounds["count"],
            line("total_throughput_ratio"),
            line("throughput_ratio"),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One run: policy, total throughput, each VM's throughput, OOM kills.
    type Run<'a> = (&'a str, f64, &'a [(&'a str, f64)], u64);

    /// A results document with these runs.
    fn doc(runs: &[Run<'_>]) -> Value {
        let mut policies = Map::new();
        for (p, total, vms, oom) in runs {
            let vms: Map<String, Value> = vms
                .iter()
                .map(|(n, t)| (n.to_string(), json!({"throughput_mib_per_s": t})))
                .collect();
            policies.insert(
                p.to_string(),
                json!({"total_throughput": total, "oom_kills": oom, "hot_set_mib": 100.0,
                       "memory_mib_mean": 110.0, "converge_s": null, "vms": vms}),
            );
        }
        json!({"order": runs.iter().map(|r| r.0).collect::<Vec<_>>(), "policies": policies})
    }

    fn target(policy: &str, metric: &str, at_most: bool, value: f64, of: Option<&str>) -> Target {
        Target {
            policy: policy.into(),
            metric: metric.into(),
            at_most,
            value,
            of: of.map(str::to_string),
        }
    }

    #[test]
    fn each_round_turns_the_order_so_every_policy_runs_at_every_place_and_after_every_other() {
        let p: Vec<String> = ["mom", "proxmox", "memtide"].map(String::from).into();
        let order = |r| turn(&p, r).collect::<Vec<_>>();
        assert_eq!(order(0), ["mom", "proxmox", "memtide"]);
        assert_eq!(order(1), ["proxmox", "memtide", "mom"]);
        assert_eq!(order(2), ["memtide", "mom", "proxmox"]);
        assert_eq!(order(3), order(0));
        let two: Vec<String> = ["mom", "memtide"].map(String::from).into();
        assert_eq!(turn(&two, 1).collect::<Vec<_>>(), ["memtide", "mom"]);
        assert_eq!(turn(&[], 1).count(), 0);
    }

    /// The host slows down steadily: none runs at 100, 90, 80 across the two rounds'
    /// starts and the end, the policy at 95 and 85 between them — as fast as none
    /// around it, where against its own round's first none it looked 5.6% slower.
    fn drifting() -> Value {
        let rounds = [
            doc(&[
                ("none", 100.0, &[("a", 60.0), ("b", 40.0)], 0),
                ("memtide", 95.0, &[("a", 57.0), ("b", 38.0)], 0),
                ("mom", 80.0, &[("a", 50.0), ("b", 30.0)], 0),
            ]),
            doc(&[
                ("none", 90.0, &[("a", 54.0), ("b", 36.0)], 0),
                ("memtide", 85.0, &[("a", 51.0), ("b", 34.0)], 1),
                ("mom", 70.0, &[("a", 40.0), ("b", 30.0)], 0),
            ]),
        ];
        let last = doc(&[("none", 80.0, &[("a", 48.0), ("b", 32.0)], 0)]);
        summary(&rounds, &last)
    }

    #[test]
    fn each_run_is_compared_with_the_baseline_runs_around_it() {
        let s = drifting();
        assert_eq!(s["count"], 2);
        assert_eq!(
            s["order"],
            json!(["none", "memtide", "mom", "none", "memtide", "mom", "none"])
        );
        assert_eq!(
            s["policies"]["none"]["total_throughput"],
            json!([100.0, 90.0, 80.0])
        );
        let m = &s["policies"]["memtide"];
        assert_eq!(m["total_throughput"], json!([95.0, 85.0]));
        assert_eq!(m["total_throughput_ratio"]["each"], json!([1.0, 1.0]));
        assert_eq!(m["total_throughput_ratio"]["mean"], 1.0);
        assert_eq!(m["total_throughput_ratio"]["sd"], 0.0);
        // a: 57 / 57 and 51 / 51; b: 38 / 38 and 34 / 34.
        assert_eq!(m["throughput_ratio"]["each"], json!([1.0, 1.0]));
        let mom = &s["policies"]["mom"]["total_throughput_ratio"];
        // 80 / 95 and 70 / 85.
        assert_eq!(mom["each"], json!([0.842, 0.824]));
        assert_eq!(mom["mean"], 0.833);
        assert_eq!(mom["sd"], 0.013);
        assert!(text(&s).contains(
            "memtide over 2 rounds, × none around each run: total throughput 1.000 ± 0.000 (1.000, 1.000)"
        ));
    }

    #[test]
    fn targets_take_each_policys_mean_over_the_rounds() {
        let s = drifting();
        // memtide's (value, bound, met) for `metric`, `at_most` or at least `value` × `of`.
        let check = |metric: &str, at_most: bool, value: f64, of: Option<&str>| {
            let t = check_target(&s, &target("memtide", metric, at_most, value, of));
            assert_eq!(t["over_rounds"], 2);
            (t["value"].clone(), t["bound"].clone(), t["met"].clone())
        };
        // 90 against the mean of the baseline around each run (95, 85): met at 1.0 ×.
        assert_eq!(
            check("total_throughput", false, 1.0, Some("none")),
            (json!(90.0), json!(90.0), json!(true))
        );
        // mom 75 on average: memtide's 90 is 1.2 × of it.
        assert_eq!(
            check("total_throughput", false, 1.2, Some("mom")),
            (json!(90.0), json!(90.0), json!(true))
        );
        // One OOM kill in one round is a mean above 0: not met.
        assert_eq!(
            check("oom_kills", true, 0.0, None),
            (json!(0.5), json!(0.0), json!(false))
        );
        assert_eq!(
            check("memory_mib_mean", true, 1.15, Some("ideal")),
            (json!(110.0), json!(115.0), json!(true))
        );
        assert_eq!(
            check("throughput_ratio", false, 0.99, None),
            (json!(1.0), json!(0.99), json!(true))
        );
        // Never converged in a run: unknown, unmet.
        assert_eq!(
            check("converge_s", true, 30.0, None),
            (Value::Null, json!(30.0), json!(false))
        );
    }

    #[test]
    fn a_baseline_run_without_throughput_leaves_the_ratios_around_it_unknown() {
        let rounds = [
            doc(&[
                ("none", 100.0, &[("a", 100.0)], 0),
                ("memtide", 95.0, &[("a", 95.0)], 0),
            ]),
            doc(&[
                ("none", 90.0, &[("a", 90.0)], 0),
                ("memtide", 85.0, &[("a", 85.0)], 0),
            ]),
        ];
        let mut last = doc(&[("none", 0.0, &[("a", 0.0)], 0)]);
        last["policies"]["none"]["total_throughput"] = Value::Null;
        last["policies"]["none"]["vms"]["a"]["throughput_mib_per_s"] = Value::Null;
        let s = summary(&rounds, &last);
        let r = &s["policies"]["memtide"]["total_throughput_ratio"];
        assert_eq!(r["each"], json!([1.0, null]));
        assert_eq!(
            (r["mean"].clone(), r["sd"].clone()),
            (Value::Null, Value::Null)
        );
        assert_eq!(
            s["policies"]["memtide"]["throughput_ratio"]["each"],
            json!([1.0, null])
        );
        let t = check_target(
            &s,
            &target("memtide", "total_throughput", false, 1.0, Some("none")),
        );
        assert_eq!(
            (t["bound"].clone(), t["met"].clone()),
            (Value::Null, json!(false))
        );
    }
}
