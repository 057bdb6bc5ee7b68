//! The plot, hand-written SVG in the style of the TWS paper's figures: one column per VM;
//! rows for the balloon allocation over time (one line per policy, the ideal allocation
//! dashed, the hot set dotted), the pages faulted back per second, and throughput as a
//! share of the baseline's; with rounds, a row of every run's total and each round's
//! ratio to the baseline. Drawn with the simulator's plot primitives
//! (`memtide_sim::svg::plot`).

use crate::scenario::BASELINE;
use memtide_sim::svg::plot::{
    document, fmt_tick, fmt_tick_k, tick_step, Axes, Legend, Panel, Scale, Ticks,
};
use serde_json::Value;
use std::fmt::Write as _;

const PALETTE: [&str; 8] = [
    "#7f7f7f", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
];
const PANEL_W: f64 = 400.0;
const PANEL_H: f64 = 150.0;
const LEFT: f64 = 70.0;
const GAP_X: f64 = 90.0;
const TOP: f64 = 70.0;
const GAP_Y: f64 = 60.0;

/// Every panel's ticks and grid.
const AXES: Axes = Axes {
    x: Ticks {
        count: 6.0,
        per: 1.0,
        label: fmt_tick_k,
    },
    y: Ticks {
        count: 4.0,
        per: 1.0,
        label: fmt_tick_k,
    },
    grid: "#e4e4e4",
};

/// A panel at `left`, `top`: time since the daemon started up to `x_max`, values up to
/// `y_max`.
fn panel(left: f64, top: f64, x_max: f64, y_max: f64, y_scale: Scale) -> Panel {
    Panel {
        left,
        top,
        width: PANEL_W,
        height: PANEL_H,
        x_max,
        y_max,
        y_scale,
    }
}

/// A panel's axes, its title and the axes' labels.
fn axes(f: &Panel, out: &mut String, title: &str, y_label: &str) {
    f.axes(out, &AXES);
    f.title(out, title, 6.0);
    f.x_label(out, "time since the daemon started (s)", 30.0);
    f.y_label(out, y_label, 48.0);
}

fn floats(v: &Value) -> Vec<Option<f64>> {
    v.as_array()
        .map(|a| a.iter().map(Value::as_f64).collect())
        .unwrap_or_default()
}

/// Centred moving mean over `w` samples (missing samples are skipped; none: missing).
fn moving_mean(v: &[Option<f64>], w: usize) -> Vec<Option<f64>> {
    let h = w / 2;
    (0..v.len())
        .map(|i| {
            let win: Vec<f64> = v[i.saturating_sub(h)..(i + h + 1).min(v.len())]
                .iter()
                .flatten()
                .copied()
                .collect();
            (!win.is_empty()).then(|| win.iter().sum::<f64>() / win.len() as f64)
        })
        .collect()
}

fn color(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

/// Render a results document: a density benchmark's (`density::document`) or a
/// scenario's (`results::document`).
pub fn render_any(doc: &Value) -> String {
    if doc["settings"]["arrive_every_s"].is_number() {
        render_density(doc)
    } else {
        render(doc)
    }
}

/// A horizontal reference line across `f` at `v`.
fn reference(f: &Panel, out: &mut String, v: f64) {
    let y = f.y(v);
    let _ = write!(
        out,
        r#"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="black" stroke-width="1.5" stroke-dasharray="8 4"/>"#,
        f.x(0.0),
        f.x(f.x_max)
    );
}

/// Whole-number ticks along the bottom, up to `x_max` (runs, rounds), at most 12; the y
/// axis as the other panels'.
fn counted(x_max: f64) -> Axes {
    Axes {
        x: Ticks {
            count: x_max.clamp(1.0, 12.0),
            per: 1.0,
            label: fmt_tick,
        },
        ..AXES
    }
}

/// A dot at `(x, v)` of `f`.
fn dot(f: &Panel, out: &mut String, x: f64, v: f64, color: &str) {
    let _ = write!(
        out,
        r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{color}"/>"#,
        f.x(x),
        f.y(v)
    );
}

/// The row of a run with rounds (`doc["rounds"]`, [`crate::rounds`]) at `top`: every
/// run's total throughput in the order run, the baseline's joined by a line (the host's
/// drift); and each round's total throughput over the baseline runs around it, a line a
/// policy, 1 dashed. False, and nothing drawn, without rounds.
fn rounds_row(doc: &Value, order: &[&str], top: f64, out: &mut String) -> bool {
    let rounds = &doc["rounds"];
    let Some(runs) = rounds["order"].as_array() else {
        return false;
    };
    let colour = |p: &str| color(order.iter().position(|o| *o == p).unwrap_or(order.len()));
    // Each run's policy, its place in the order run (from 1) and its total.
    let mut seen: std::collections::HashMap<&str, usize> = Default::default();
    let totals: Vec<(&str, f64, Option<f64>)> = runs
        .iter()
        .filter_map(Value::as_str)
        .enumerate()
        .map(|(i, p)| {
            let k = seen.entry(p).or_default();
            let total = rounds["policies"][p]["total_throughput"][*k].as_f64();
            *k += 1;
            (p, (i + 1) as f64, total)
        })
        .collect();
    let max = totals.iter().filter_map(|t| t.2).fold(1.0, f64::max) * 1.1;
    let step = tick_step(max, 4.0);
    let f = panel(
        LEFT,
        top,
        (totals.len() + 1) as f64,
        step * (max / step).ceil(),
        Scale::Linear,
    );
    f.axes(out, &counted(f.x_max));
    f.title(out, "every run in turn: total throughput", 6.0);
    f.x_label(out, "run, in the order run", 30.0);
    f.y_label(out, "MiB/s", 48.0);
    let (xs, values): (Vec<f64>, Vec<Option<f64>>) = totals
        .iter()
        .filter(|t| t.0 == BASELINE)
        .map(|t| (t.1, t.2))
        .unzip();
    f.line(out, &xs, values, colour(BASELINE), "");
    for (p, x, total) in &totals {
        if let Some(v) = total {
            dot(&f, out, *x, *v, colour(p));
        }
    }
    let count = rounds["count"].as_f64().unwrap_or(1.0);
    let ratios: Vec<(&str, Vec<Option<f64>>)> = order
        .iter()
        .filter(|p| **p != BASELINE)
        .map(|p| {
            (
                *p,
                floats(&rounds["policies"][*p]["total_throughput_ratio"]["each"]),
            )
        })
        .collect();
    let most = ratios
        .iter()
        .flat_map(|r| r.1.iter().flatten())
        .fold(1.2f64, |m, r| m.max(*r * 1.1));
    let g = panel(
        LEFT + PANEL_W + GAP_X,
        top,
        count + 1.0,
        (most * 5.0).ceil() / 5.0,
        Scale::Linear,
    );
    g.axes(out, &counted(g.x_max));
    g.title(
        out,
        "each round: total throughput × the none runs around it",
        6.0,
    );
    g.x_label(out, "round", 30.0);
    g.y_label(out, "× none", 48.0);
    reference(&g, out, 1.0);
    for (p, each) in &ratios {
        let xs: Vec<f64> = (1..=each.len()).map(|r| r as f64).collect();
        g.line(out, &xs, each.iter().copied(), colour(p), "");
        for (x, v) in xs.iter().zip(each) {
            if let Some(v) = v {
                dot(&g, out, *x, *v, colour(p));
            }
        }
    }
    true
}

/// The density benchmark: per policy (one line each) the guests running, the domain's
/// memory in use with its limit dashed, and the busy guests' throughput per window as a
/// share of their solo runs with the SLO dashed.
pub fn render_density(doc: &Value) -> String {
    let order: Vec<&str> = doc["order"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let run_s = doc["settings"]["run_s"].as_f64().unwrap_or(60.0);
    let limit = doc["settings"]["domain_limit_mib"]
        .as_f64()
        .unwrap_or(1024.0);
    let slo = doc["settings"]["slo"].as_f64().unwrap_or(0.95) * 100.0;
    let guests_max = order
        .iter()
        .flat_map(|p| floats(&doc["policies"][*p]["series"]["running"]))
        .flatten()
        .fold(4.0f64, f64::max)
        .ceil();
    let rows = [
        ("guests running", "guests", guests_max + 1.0),
        (
            "domain memory in use (page cache excepted)",
            "MiB",
            limit * 1.05,
        ),
        ("busy guests' throughput per window", "% of solo", 120.0),
    ];
    let mut body = String::new();
    let panels: Vec<Panel> = rows
        .iter()
        .enumerate()
        .map(|(r, (title, unit, max))| {
            let f = panel(
                LEFT,
                TOP + r as f64 * (PANEL_H + GAP_Y),
                run_s,
                *max,
                Scale::Linear,
            );
            axes(&f, &mut body, title, unit);
            f
        })
        .collect();
    reference(&panels[1], &mut body, limit);
    reference(&panels[2], &mut body, slo);
    for (i, p) in order.iter().enumerate() {
        let v = &doc["policies"][*p];
        let ts: Vec<f64> = floats(&v["series"]["t_s"])
            .into_iter()
            .map(|t| t.unwrap_or(f64::NAN))
            .collect();
        panels[0].line(
            &mut body,
            &ts,
            floats(&v["series"]["running"]),
            color(i),
            "",
        );
        panels[1].line(
            &mut body,
            &ts,
            floats(&v["series"]["domain_used_mib"]),
            color(i),
            "",
        );
        for vm in v["vms"].as_array().into_iter().flatten() {
            let w: Vec<(f64, f64)> = vm["windows"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| Some((p[0].as_f64()?, 100.0 * p[1].as_f64()?)))
                .collect();
            let (wt, wv): (Vec<f64>, Vec<Option<f64>>) =
                w.iter().map(|(t, r)| (*t, Some(*r))).unzip();
            panels[2].line(&mut body, &wt, wv, color(i), "");
        }
    }
    let legend = Legend {
        line: 22.0,
        width: 2.5,
        text: 27.0,
    };
    let mut x = LEFT;
    for (i, p) in order.iter().enumerate() {
        let label = if *p == "none" {
            "none (static partitioning)".to_string()
        } else {
            p.to_string()
        };
        legend.entry(&mut body, x, 42.0, color(i), "", &label);
        x += 40.0 + 6.5 * label.chars().count() as f64;
    }
    legend.entry(
        &mut body,
        x,
        42.0,
        "black",
        r#" stroke-dasharray="8 4""#,
        "domain limit, SLO (95% of solo)",
    );
    let title = format!(
        "memtide-bench density: {} — {}",
        doc["scenario"].as_str().unwrap_or("?"),
        doc["description"].as_str().unwrap_or("")
    );
    document(
        LEFT + PANEL_W + GAP_X + 200.0,
        TOP + 3.0 * (PANEL_H + GAP_Y) + 20.0,
        &title,
        &body,
    )
}

/// Render a results document (as written by `results::document`).
pub fn render(doc: &Value) -> String {
    let policies: Vec<(&String, &Value)> = doc["policies"]
        .as_object()
        .map(|m| m.iter().collect())
        .unwrap_or_default();
    let order: Vec<&str> = doc["order"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_else(|| policies.iter().map(|(p, _)| p.as_str()).collect());
    let vms: Vec<&Value> = doc["guests"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    let run_s = doc["settings"]["run_s"].as_f64().unwrap_or(60.0);
    let mut body = String::new();
    let rounds = rounds_row(doc, &order, TOP + 3.0 * (PANEL_H + GAP_Y), &mut body);
    let (cols, rows) = if rounds {
        (vms.len().max(2), 4.0)
    } else {
        (vms.len().max(1), 3.0)
    };
    let width = LEFT + cols as f64 * (PANEL_W + GAP_X);
    let height = TOP + rows * (PANEL_H + GAP_Y) + 20.0;
    for (c, vm) in vms.iter().enumerate() {
        let name = vm["name"].as_str().unwrap_or("?");
        let left = LEFT + c as f64 * (PANEL_W + GAP_X);
        let memory = vm["memory_mib"].as_f64().unwrap_or(1024.0);
        let ideal = vm["ideal_mib"].as_f64();
        let hot = vm["hot_set_mib"].as_f64();
        // Row 1: allocation.
        let f = panel(left, TOP, run_s, memory * 1.05, Scale::Linear);
        axes(
            &f,
            &mut body,
            &format!("{name}: balloon allocation ({} MiB guest)", memory),
            "allocation (MiB)",
        );
        for (value, dash) in [
            (ideal, r#" stroke-dasharray="8 4""#),
            (hot, r#" stroke-dasharray="2 3""#),
        ] {
            if let Some(v) = value {
                let y = f.y(v);
                let _ = write!(
                    body,
                    r#"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="black" stroke-width="1.5"{dash}/>"#,
                    f.x(0.0),
                    f.x(run_s)
                );
            }
        }
        // Rows 2 and 3 need their maxima first.
        let mut fault_max: f64 = 10.0;
        let mut tp_max: f64 = 120.0;
        let base_tp = doc["policies"]["none"]["vms"][name]["throughput_mib_per_s"].as_f64();
        for (p, v) in &policies {
            let s = &v["series"]["vms"][name];
            for x in floats(&s["swap_in_per_s"])
                .into_iter()
                .zip(floats(&s["refaults_per_s"]))
                .map(|(a, b)| a.unwrap_or(0.0) + b.unwrap_or(0.0))
            {
                fault_max = fault_max.max(x);
            }
            if let Some(b) = base_tp {
                for x in floats(&s["throughput_mib_per_s"]).into_iter().flatten() {
                    tp_max = tp_max.max((100.0 * x / b).min(300.0));
                }
            }
            let _ = p;
        }
        let fault_max = 10f64.powf(fault_max.log10().ceil());
        let tp_max = (tp_max / 50.0).ceil() * 50.0;
        let g = panel(left, TOP + PANEL_H + GAP_Y, run_s, fault_max, Scale::Log1p);
        axes(
            &g,
            &mut body,
            &format!("{name}: swap-ins + refaults"),
            "pages / s (log)",
        );
        let top = TOP + 2.0 * (PANEL_H + GAP_Y);
        let h = panel(left, top, run_s, tp_max, Scale::Linear);
        axes(
            &h,
            &mut body,
            &format!("{name}: throughput (5 s moving mean)"),
            "% of full-memory mean",
        );
        for (i, p) in order.iter().enumerate() {
            let v = &doc["policies"][*p];
            let ts = floats(&v["series"]["t_s"]);
            let ts: Vec<f64> = ts.into_iter().map(|t| t.unwrap_or(f64::NAN)).collect();
            let s = &v["series"]["vms"][name];
            f.line(&mut body, &ts, floats(&s["actual_mib"]), color(i), "");
            let faults: Vec<Option<f64>> = floats(&s["swap_in_per_s"])
                .into_iter()
                .zip(floats(&s["refaults_per_s"]))
                .map(|(a, b)| match (a, b) {
                    (None, None) => None,
                    (a, b) => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
                })
                .collect();
            g.line(&mut body, &ts, faults, color(i), "");
            if let Some(b) = base_tp.filter(|b| *b > 0.0) {
                let rel: Vec<Option<f64>> = moving_mean(&floats(&s["throughput_mib_per_s"]), 5)
                    .into_iter()
                    .map(|x| x.map(|x| 100.0 * x / b))
                    .collect();
                h.line(&mut body, &ts, rel, color(i), "");
            }
        }
    }
    // Legend across the top.
    let mut x = LEFT;
    let y = 42.0;
    let mut entries: Vec<(String, &str, &str)> = order
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let label = if *p == "none" {
                "none (full memory)".to_string()
            } else {
                p.to_string()
            };
            (label, color(i), "")
        })
        .collect();
    entries.push((
        "ideal: hot set + guest base".into(),
        "black",
        r#" stroke-dasharray="8 4""#,
    ));
    entries.push(("hot set".into(), "black", r#" stroke-dasharray="2 3""#));
    let legend = Legend {
        line: 22.0,
        width: 2.5,
        text: 27.0,
    };
    for (label, c, dash) in entries {
        legend.entry(&mut body, x, y, c, dash, &label);
        x += 40.0 + 6.5 * label.chars().count() as f64;
    }
    let title = format!(
        "memtide-bench: {} — {}",
        doc["scenario"].as_str().unwrap_or("?"),
        doc["description"].as_str().unwrap_or("")
    );
    document(width, height, &title, &body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_moving_mean_skips_gaps() {
        let v = [Some(1.0), None, Some(3.0), Some(5.0), None];
        assert_eq!(
            moving_mean(&v, 3),
            vec![Some(1.0), Some(2.0), Some(4.0), Some(4.0), Some(5.0)]
        );
        assert_eq!(moving_mean(&[None, None], 5), vec![None, None]);
    }

    #[test]
    fn renders_a_panel_per_vm_a_line_per_policy_and_the_ideal() {
        let series = |v: f64| {
            json!({"t_s": [1.0, 2.0, 3.0], "vms": {"a": {
                "actual_mib": [v, v, null], "swap_in_per_s": [0.0, 5.0, 0.0],
                "refaults_per_s": [0.0, 0.0, 1.0], "throughput_mib_per_s": [100.0, 90.0, 100.0]}}})
        };
        let doc = json!({
            "scenario": "t", "description": "test & check",
            "settings": {"run_s": 3.0},
            "order": ["none", "memtide"],
            "guests": [{"name": "a", "memory_mib": 384, "ideal_mib": 100.0, "hot_set_mib": 60.0}],
            "policies": {
                "none": {"vms": {"a": {"throughput_mib_per_s": 100.0}}, "series": series(384.0)},
                "memtide": {"vms": {"a": {"throughput_mib_per_s": 95.0}}, "series": series(120.0)}
            }
        });
        let svg = render(&doc);
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("test &amp; check"));
        assert!(svg.contains("allocation (MiB)") && svg.contains("pages / s (log)"));
        assert!(svg.contains("ideal: hot set + guest base"));
        assert!(svg.contains("stroke-dasharray=\"8 4\""));
        assert_eq!(
            svg.matches("<rect x=").count(),
            3,
            "three panels for one VM"
        );
        // Two policies × three rows of lines, none broken by the gap except the allocation.
        assert!(svg.matches("<polyline").count() >= 6);
        assert!(!svg.contains("each round"), "no rounds, no rounds row");
    }

    #[test]
    fn a_run_with_rounds_plots_every_run_and_each_rounds_ratio() {
        let series = json!({"t_s": [1.0], "vms": {"a": {"actual_mib": [384.0]}}});
        let doc = json!({
            "scenario": "t", "description": "rounds",
            "settings": {"run_s": 1.0},
            "order": ["none", "memtide"],
            "guests": [{"name": "a", "memory_mib": 384}],
            "policies": {"none": {"series": series}, "memtide": {"series": series}},
            "rounds": {
                "count": 2,
                "order": ["none", "memtide", "none", "memtide", "none"],
                "policies": {
                    "none": {"total_throughput": [100.0, 120.0, 110.0]},
                    "memtide": {
                        "total_throughput": [105.0, null],
                        "total_throughput_ratio": {"each": [0.955, null]}
                    }
                }
            }
        });
        let svg = render(&doc);
        assert!(svg.contains("every run in turn: total throughput"));
        assert!(svg.contains("each round: total throughput × the none runs around it"));
        assert_eq!(
            svg.matches("<rect x=").count(),
            5,
            "three VM panels, two rounds panels"
        );
        // Four runs with a total (one of memtide's is missing) and one round's ratio.
        assert_eq!(svg.matches("<circle").count(), 5);
        // The baseline's three runs joined, in grey, at runs 1, 3 and 5 of 5.
        let f = panel(
            LEFT,
            TOP + 3.0 * (PANEL_H + GAP_Y),
            6.0,
            150.0,
            Scale::Linear,
        );
        let drift = format!(
            "{:.1},{:.1} {:.1},{:.1} {:.1},{:.1}",
            f.x(1.0),
            f.y(100.0),
            f.x(3.0),
            f.y(120.0),
            f.x(5.0),
            f.y(110.0)
        );
        assert!(
            svg.contains(&format!(
                r#"points="{drift}" fill="none" stroke="{}""#,
                color(0)
            )),
            "{svg}"
        );
        // The ratio's reference at 1 (and the legend's ideal).
        assert_eq!(
            svg.matches("stroke-dasharray=\"8 4\"").count(),
            2,
            "the legend's and the reference"
        );
    }
}
