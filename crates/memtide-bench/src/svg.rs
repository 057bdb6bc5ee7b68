//! The plot, hand-written SVG in the style of the TWS paper's figures: one column per VM;
//! rows for the balloon allocation over time (one line per policy, the ideal allocation
//! dashed, the hot set dotted), the pages faulted back per second, and throughput as a
//! share of the baseline's.

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

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A round step giving about `n` ticks up to `max`.
fn tick_step(max: f64, n: f64) -> f64 {
    if max <= 0.0 {
        return 1.0;
    }
    let raw = max / n;
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    let nice = match norm {
        x if x <= 1.0 => 1.0,
        x if x <= 2.0 => 2.0,
        x if x <= 5.0 => 5.0,
        _ => 10.0,
    };
    nice * mag
}

fn fmt_tick(v: f64) -> String {
    if v >= 1000.0 && (v / 1000.0).fract() == 0.0 {
        format!("{}k", v / 1000.0)
    } else if v.fract().abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// How values map to the vertical axis.
#[derive(Clone, Copy)]
enum Scale {
    Linear,
    /// log10(1 + v): zero stays visible.
    Log1p,
}

struct Frame {
    left: f64,
    top: f64,
    x_max: f64,
    y_max: f64,
    scale: Scale,
}

impl Frame {
    fn x(&self, t: f64) -> f64 {
        self.left + PANEL_W * (t / self.x_max).clamp(0.0, 1.0)
    }

    fn y(&self, v: f64) -> f64 {
        let (v, max) = match self.scale {
            Scale::Linear => (v, self.y_max),
            Scale::Log1p => ((1.0 + v.max(0.0)).log10(), (1.0 + self.y_max).log10()),
        };
        self.top + PANEL_H * (1.0 - (v / max.max(1e-9)).clamp(0.0, 1.0))
    }

    fn axes(&self, out: &mut String, title: &str, y_label: &str) {
        let bottom = self.top + PANEL_H;
        let right = self.left + PANEL_W;
        let ticks: Vec<f64> = match self.scale {
            Scale::Linear => {
                let step = tick_step(self.y_max, 4.0);
                (0..)
                    .map(|i| i as f64 * step)
                    .take_while(|v| *v <= self.y_max + 1e-9)
                    .collect()
            }
            Scale::Log1p => std::iter::once(0.0)
                .chain((0..).map(|e| 10f64.powi(e)))
                .take_while(|v| *v <= self.y_max * 1.0001)
                .collect(),
        };
        for v in ticks {
            let y = self.y(v);
            let _ = write!(
                out,
                r##"<line x1="{:.1}" y1="{y:.1}" x2="{right:.1}" y2="{y:.1}" stroke="#e4e4e4"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                self.left,
                self.left - 4.0,
                y + 4.0,
                fmt_tick(v)
            );
        }
        let step = tick_step(self.x_max, 6.0);
        let mut t = 0.0;
        while t <= self.x_max + 1e-9 {
            let x = self.x(t);
            let _ = write!(
                out,
                r##"<line x1="{x:.1}" y1="{bottom:.1}" x2="{x:.1}" y2="{:.1}" stroke="#333"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                bottom + 4.0,
                bottom + 15.0,
                fmt_tick(t)
            );
            t += step;
        }
        let _ = write!(
            out,
            r##"<rect x="{:.1}" y="{:.1}" width="{PANEL_W:.1}" height="{PANEL_H:.1}" fill="none" stroke="#333"/><text x="{:.1}" y="{:.1}" text-anchor="middle" font-weight="bold">{}</text><text x="{:.1}" y="{:.1}" text-anchor="middle">time since the daemon started (s)</text><text transform="translate({:.1},{:.1}) rotate(-90)" text-anchor="middle">{}</text>"##,
            self.left,
            self.top,
            self.left + PANEL_W / 2.0,
            self.top - 6.0,
            escape(title),
            self.left + PANEL_W / 2.0,
            bottom + 30.0,
            self.left - 48.0,
            self.top + PANEL_H / 2.0,
            escape(y_label)
        );
    }

    /// A polyline through the present points (a gap breaks it).
    fn line(&self, out: &mut String, ts: &[f64], vs: &[Option<f64>], color: &str, dash: &str) {
        let mut runs: Vec<String> = vec![String::new()];
        for (t, v) in ts.iter().zip(vs) {
            match v {
                Some(v) if v.is_finite() => {
                    let _ = write!(
                        runs.last_mut().expect("one run"),
                        "{:.1},{:.1} ",
                        self.x(*t),
                        self.y(*v)
                    );
                }
                _ => runs.push(String::new()),
            }
        }
        for points in runs.iter().filter(|p| !p.is_empty()) {
            let _ = write!(
                out,
                r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="1.5"{dash}/>"#,
                points.trim_end()
            );
        }
    }
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
    let cols = vms.len().max(1);
    let width = LEFT + cols as f64 * (PANEL_W + GAP_X);
    let height = TOP + 3.0 * (PANEL_H + GAP_Y) + 20.0;
    let mut body = String::new();
    for (c, vm) in vms.iter().enumerate() {
        let name = vm["name"].as_str().unwrap_or("?");
        let left = LEFT + c as f64 * (PANEL_W + GAP_X);
        let memory = vm["memory_mib"].as_f64().unwrap_or(1024.0);
        let ideal = vm["ideal_mib"].as_f64();
        let hot = vm["hot_set_mib"].as_f64();
        // Row 1: allocation.
        let f = Frame {
            left,
            top: TOP,
            x_max: run_s,
            y_max: memory * 1.05,
            scale: Scale::Linear,
        };
        f.axes(
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
        let g = Frame {
            left,
            top: TOP + PANEL_H + GAP_Y,
            x_max: run_s,
            y_max: fault_max,
            scale: Scale::Log1p,
        };
        g.axes(
            &mut body,
            &format!("{name}: swap-ins + refaults"),
            "pages / s (log)",
        );
        let h = Frame {
            left,
            top: TOP + 2.0 * (PANEL_H + GAP_Y),
            x_max: run_s,
            y_max: tp_max,
            scale: Scale::Linear,
        };
        h.axes(
            &mut body,
            &format!("{name}: throughput (5 s moving mean)"),
            "% of full-memory mean",
        );
        for (i, p) in order.iter().enumerate() {
            let v = &doc["policies"][*p];
            let ts = floats(&v["series"]["t_s"]);
            let ts: Vec<f64> = ts.into_iter().map(|t| t.unwrap_or(f64::NAN)).collect();
            let s = &v["series"]["vms"][name];
            f.line(&mut body, &ts, &floats(&s["actual_mib"]), color(i), "");
            let faults: Vec<Option<f64>> = floats(&s["swap_in_per_s"])
                .into_iter()
                .zip(floats(&s["refaults_per_s"]))
                .map(|(a, b)| match (a, b) {
                    (None, None) => None,
                    (a, b) => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
                })
                .collect();
            g.line(&mut body, &ts, &faults, color(i), "");
            if let Some(b) = base_tp.filter(|b| *b > 0.0) {
                let rel: Vec<Option<f64>> = moving_mean(&floats(&s["throughput_mib_per_s"]), 5)
                    .into_iter()
                    .map(|x| x.map(|x| 100.0 * x / b))
                    .collect();
                h.line(&mut body, &ts, &rel, color(i), "");
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
    for (label, c, dash) in entries {
        let _ = write!(
            body,
            r#"<line x1="{x:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{c}" stroke-width="2.5"{dash}/><text x="{:.1}" y="{:.1}">{}</text>"#,
            x + 22.0,
            x + 27.0,
            y + 4.0,
            escape(&label)
        );
        x += 40.0 + 6.5 * label.chars().count() as f64;
    }
    let title = format!(
        "memtide-bench: {} — {}",
        doc["scenario"].as_str().unwrap_or("?"),
        doc["description"].as_str().unwrap_or("")
    );
    format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="sans-serif" font-size="11"><rect width="100%" height="100%" fill="white"/><text x="{:.1}" y="20" text-anchor="middle" font-size="14">{}</text>{body}</svg>
"##,
        width / 2.0,
        escape(&title)
    )
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
    }
}
