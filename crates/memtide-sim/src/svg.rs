//! Plots as hand-written SVG: per-VM allocation against working set, host memory over
//! time, and host memory stacked by VM.

use crate::report::Series;
use std::fmt::Write as _;

const PALETTE: [&str; 10] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];
/// Panels in the allocation grid.
const MAX_PANELS: usize = 16;
/// VMs drawn one by one in the stacked view; the rest are drawn together.
const MAX_LAYERS: usize = 10;

/// A unit for an axis: its name and how many of the data's units make one.
struct Unit {
    name: &'static str,
    per: f64,
}

fn time_unit(end_s: f64) -> Unit {
    if end_s > 7200.0 {
        Unit {
            name: "h",
            per: 3600.0,
        }
    } else if end_s > 600.0 {
        Unit {
            name: "min",
            per: 60.0,
        }
    } else {
        Unit {
            name: "s",
            per: 1.0,
        }
    }
}

fn memory_unit(max_mib: f64) -> Unit {
    if max_mib > 4096.0 {
        Unit {
            name: "GiB",
            per: 1024.0,
        }
    } else {
        Unit {
            name: "MiB",
            per: 1.0,
        }
    }
}

/// A round step giving about `n` ticks up to `max`.
fn tick_step(max: f64, n: f64) -> f64 {
    if max <= 0.0 {
        return 1.0;
    }
    let raw = max / n;
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    let nice = if norm <= 1.0 {
        1.0
    } else if norm <= 2.0 {
        2.0
    } else if norm <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

fn fmt_tick(v: f64) -> String {
    if v.fract().abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A plotting area: data (time in s, memory in MiB) mapped to pixels.
struct Frame {
    left: f64,
    top: f64,
    width: f64,
    height: f64,
    x_max: f64,
    y_max: f64,
}

impl Frame {
    fn x(&self, t: f64) -> f64 {
        self.left + self.width * (t / self.x_max).clamp(0.0, 1.0)
    }

    fn y(&self, v: f64) -> f64 {
        self.top + self.height * (1.0 - (v / self.y_max).clamp(0.0, 1.0))
    }

    /// Axes with ticks, grid lines and labels.
    fn axes(&self, out: &mut String, x_unit: &Unit, y_unit: &Unit, labels: bool) {
        let bottom = self.top + self.height;
        let right = self.left + self.width;
        let step = tick_step(self.y_max / y_unit.per, 4.0);
        let mut v = 0.0;
        while v <= self.y_max / y_unit.per + 1e-9 {
            let y = self.y(v * y_unit.per);
            let _ = write!(
                out,
                r##"<line x1="{:.1}" y1="{y:.1}" x2="{right:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                self.left,
                self.left - 4.0,
                y + 4.0,
                fmt_tick(v)
            );
            v += step;
        }
        let step = tick_step(self.x_max / x_unit.per, 5.0);
        let mut t = 0.0;
        while t <= self.x_max / x_unit.per + 1e-9 {
            let x = self.x(t * x_unit.per);
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
            r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="none" stroke="#333"/>"##,
            self.left, self.top, self.width, self.height
        );
        if labels {
            let _ = write!(
                out,
                r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">time ({})</text><text transform="translate({:.1},{:.1}) rotate(-90)" text-anchor="middle">memory ({})</text>"##,
                self.left + self.width / 2.0,
                bottom + 32.0,
                x_unit.name,
                self.left - 42.0,
                self.top + self.height / 2.0,
                y_unit.name
            );
        }
    }

    fn line(&self, out: &mut String, ts: &[f64], vs: &[f32], color: &str, dash: bool) {
        let mut points = String::new();
        for (t, v) in ts.iter().zip(vs) {
            let _ = write!(points, "{:.1},{:.1} ", self.x(*t), self.y(f64::from(*v)));
        }
        let dash = if dash {
            r#" stroke-dasharray="4 3""#
        } else {
            ""
        };
        let _ = write!(
            out,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="1.5"{dash}/>"#,
            points.trim_end()
        );
    }

    /// The area between two curves.
    fn band(&self, out: &mut String, ts: &[f64], lower: &[f64], upper: &[f64], color: &str) {
        let mut points = String::new();
        for (t, v) in ts.iter().zip(upper) {
            let _ = write!(points, "{:.1},{:.1} ", self.x(*t), self.y(*v));
        }
        for (t, v) in ts.iter().zip(lower).rev() {
            let _ = write!(points, "{:.1},{:.1} ", self.x(*t), self.y(*v));
        }
        let _ = write!(
            out,
            r#"<polygon points="{}" fill="{color}" stroke="none"/>"#,
            points.trim_end()
        );
    }
}

/// A legend: one line per entry (label, colour, dashed).
fn legend(out: &mut String, x: f64, y: f64, entries: &[(String, &str, bool)]) {
    for (i, (label, color, dash)) in entries.iter().enumerate() {
        let y = y + 16.0 * i as f64;
        let dash = if *dash {
            r#" stroke-dasharray="4 3""#
        } else {
            ""
        };
        let _ = write!(
            out,
            r#"<line x1="{x:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{color}" stroke-width="6"{dash}/><text x="{:.1}" y="{:.1}">{}</text>"#,
            x + 18.0,
            x + 24.0,
            y + 4.0,
            escape(label)
        );
    }
}

fn document(width: f64, height: f64, title: &str, body: &str) -> String {
    format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="sans-serif" font-size="11"><rect width="100%" height="100%" fill="white"/><text x="{:.1}" y="20" text-anchor="middle" font-size="14">{}</text>{body}</svg>
"##,
        width / 2.0,
        escape(title)
    )
}

fn max_of(values: &[f32]) -> f64 {
    values.iter().fold(0.0f64, |m, v| m.max(f64::from(*v)))
}

/// Per-VM memory given against the working set and host-resident memory, one small
/// panel per VM (the first 16).
pub fn allocation(series: &Series, title: &str) -> String {
    let shown = &series.vms[..series.vms.len().min(MAX_PANELS)];
    let cols = shown.len().clamp(1, 4);
    let rows = shown.len().div_ceil(cols).max(1);
    let (pw, ph) = (260.0, 150.0);
    let (left, top) = (70.0, 70.0);
    let width = left + cols as f64 * (pw + 30.0) + 10.0;
    let height = top + rows as f64 * (ph + 50.0) + 30.0;
    let end = series.t_s.last().copied().unwrap_or(1.0).max(1e-9);
    let y_max = shown
        .iter()
        .flat_map(|v| {
            [
                max_of(&v.given_mib),
                max_of(&v.working_set_mib),
                max_of(&v.resident_mib),
            ]
        })
        .fold(1.0, f64::max)
        * 1.05;
    let (tu, mu) = (time_unit(end), memory_unit(y_max));
    let mut body = String::new();
    let caption = if series.vms.len() > shown.len() {
        format!("first {} of {} VMs", shown.len(), series.vms.len())
    } else {
        format!("{} VMs", series.vms.len())
    };
    let _ = write!(
        body,
        r#"<text x="{:.1}" y="38" text-anchor="middle">memory given vs working set, {caption}</text>"#,
        width / 2.0
    );
    legend(
        &mut body,
        left,
        52.0,
        &[("given (balloon actual)".into(), PALETTE[0], false)],
    );
    legend(
        &mut body,
        left + 200.0,
        52.0,
        &[("working set".into(), PALETTE[1], true)],
    );
    legend(
        &mut body,
        left + 340.0,
        52.0,
        &[("in host memory".into(), PALETTE[2], false)],
    );
    for (i, vm) in shown.iter().enumerate() {
        let f = Frame {
            left: left + (i % cols) as f64 * (pw + 30.0),
            top: top + 20.0 + (i / cols) as f64 * (ph + 50.0),
            width: pw,
            height: ph,
            x_max: end,
            y_max,
        };
        let _ = write!(
            body,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-weight="bold">{}</text>"#,
            f.left + pw / 2.0,
            f.top - 5.0,
            escape(&vm.name)
        );
        f.axes(&mut body, &tu, &mu, false);
        f.line(&mut body, &series.t_s, &vm.resident_mib, PALETTE[2], false);
        f.line(
            &mut body,
            &series.t_s,
            &vm.working_set_mib,
            PALETTE[1],
            true,
        );
        f.line(&mut body, &series.t_s, &vm.given_mib, PALETTE[0], false);
    }
    let _ = write!(
        body,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">time ({}), memory ({})</text>"#,
        width / 2.0,
        height - 8.0,
        tu.name,
        mu.name
    );
    document(width, height, title, &body)
}

/// Host memory over time: free, freeable (free + cache), guest memory in host swap, and
/// KSM's savings.
pub fn host_memory(series: &Series, title: &str) -> String {
    let (width, height) = (900.0, 420.0);
    let f = Frame {
        left: 80.0,
        top: 50.0,
        width: 620.0,
        height: 310.0,
        x_max: series.t_s.last().copied().unwrap_or(1.0).max(1e-9),
        y_max: [
            &series.host_free_mib,
            &series.host_swap_mib,
            &series.ksm_saved_mib,
        ]
        .iter()
        .map(|s| max_of(s))
        .chain(
            series
                .host_free_mib
                .iter()
                .zip(&series.host_cache_mib)
                .map(|(a, b)| f64::from(a + b)),
        )
        .fold(1.0, f64::max)
            * 1.05,
    };
    let (tu, mu) = (time_unit(f.x_max), memory_unit(f.y_max));
    let mut body = String::new();
    f.axes(&mut body, &tu, &mu, true);
    let freeable: Vec<f32> = series
        .host_free_mib
        .iter()
        .zip(&series.host_cache_mib)
        .map(|(a, b)| a + b)
        .collect();
    f.line(&mut body, &series.t_s, &freeable, PALETTE[0], true);
    f.line(
        &mut body,
        &series.t_s,
        &series.host_free_mib,
        PALETTE[0],
        false,
    );
    f.line(
        &mut body,
        &series.t_s,
        &series.host_swap_mib,
        PALETTE[3],
        false,
    );
    f.line(
        &mut body,
        &series.t_s,
        &series.ksm_saved_mib,
        PALETTE[2],
        false,
    );
    legend(
        &mut body,
        720.0,
        60.0,
        &[
            ("free".into(), PALETTE[0], false),
            ("free + page cache".into(), PALETTE[0], true),
            ("guest memory in host swap".into(), PALETTE[3], false),
            ("saved by KSM".into(), PALETTE[2], false),
        ],
    );
    let _ = write!(
        body,
        r#"<text x="{:.1}" y="38" text-anchor="middle">host memory ({:.0} {} in all)</text>"#,
        f.left + f.width / 2.0,
        series.host_total_mib / mu.per,
        mu.name
    );
    document(width, height, title, &body)
}

/// Host memory stacked: the host's own, each VM's resident memory (the largest ten,
/// then the others together), page cache and free memory.
pub fn host_stack(series: &Series, title: &str) -> String {
    let (width, height) = (900.0, 420.0);
    let n = series.t_s.len();
    let mut order: Vec<usize> = (0..series.vms.len()).collect();
    let mean = |i: usize| {
        series.vms[i]
            .resident_mib
            .iter()
            .map(|v| f64::from(*v))
            .sum::<f64>()
    };
    order.sort_by(|a, b| mean(*b).total_cmp(&mean(*a)).then(a.cmp(b)));
    let mut layers: Vec<(String, Vec<f64>, &str)> =
        vec![("host".into(), vec![series.host_reserved_mib; n], "#555")];
    for (k, &i) in order.iter().take(MAX_LAYERS).enumerate() {
        let v = &series.vms[i];
        let values = v.resident_mib.iter().map(|x| f64::from(*x)).collect();
        layers.push((v.name.clone(), values, PALETTE[k % PALETTE.len()]));
    }
    if order.len() > MAX_LAYERS {
        let mut rest = vec![0.0; n];
        for &i in &order[MAX_LAYERS..] {
            for (r, v) in rest.iter_mut().zip(&series.vms[i].resident_mib) {
                *r += f64::from(*v);
            }
        }
        layers.push((
            format!("{} other VMs", order.len() - MAX_LAYERS),
            rest,
            "#c7c7c7",
        ));
    }
    let cache = series
        .host_cache_mib
        .iter()
        .map(|v| f64::from(*v))
        .collect();
    layers.push(("host page cache".into(), cache, "#dbdb8d"));
    let free = series.host_free_mib.iter().map(|v| f64::from(*v)).collect();
    layers.push(("free".into(), free, "#e8f4e8"));

    let f = Frame {
        left: 80.0,
        top: 50.0,
        width: 620.0,
        height: 310.0,
        x_max: series.t_s.last().copied().unwrap_or(1.0).max(1e-9),
        y_max: series.host_total_mib.max(1.0),
    };
    let (tu, mu) = (time_unit(f.x_max), memory_unit(f.y_max));
    let mut body = String::new();
    let mut lower = vec![0.0; n];
    for (_, values, color) in &layers {
        let upper: Vec<f64> = lower.iter().zip(values).map(|(l, v)| l + v).collect();
        f.band(&mut body, &series.t_s, &lower, &upper, color);
        lower = upper;
    }
    f.axes(&mut body, &tu, &mu, true);
    let entries: Vec<(String, &str, bool)> = layers
        .iter()
        .rev()
        .map(|(name, _, color)| (name.clone(), *color, false))
        .collect();
    legend(&mut body, 720.0, 60.0, &entries);
    let _ = write!(
        body,
        r#"<text x="{:.1}" y="38" text-anchor="middle">host memory by VM (after KSM savings)</text>"#,
        f.left + f.width / 2.0
    );
    document(width, height, title, &body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::VmSeries;

    fn series(vms: usize) -> Series {
        Series {
            tick_s: 1.0,
            host_total_mib: 8192.0,
            host_reserved_mib: 512.0,
            t_s: vec![1.0, 2.0, 3.0],
            host_free_mib: vec![1000.0, 800.0, 900.0],
            host_cache_mib: vec![100.0, 0.0, 50.0],
            host_swap_mib: vec![0.0, 10.0, 20.0],
            ksm_saved_mib: vec![0.0, 0.0, 5.0],
            vms: (0..vms)
                .map(|i| VmSeries {
                    name: format!("vm<{i}>"),
                    given_mib: vec![1024.0; 3],
                    working_set_mib: vec![500.0, 600.0, 700.0],
                    resident_mib: vec![600.0; 3],
                })
                .collect(),
        }
    }

    #[test]
    fn plots_are_well_formed_and_escaped() {
        let s = series(20);
        for svg in [
            allocation(&s, "t"),
            host_memory(&s, "t"),
            host_stack(&s, "t"),
        ] {
            assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
            assert!(!svg.contains("vm<"), "names are escaped");
            assert!(!svg.contains("NaN"));
        }
        assert!(allocation(&s, "t").contains("first 16 of 20 VMs"));
        assert!(host_stack(&s, "t").contains("10 other VMs"));
    }

    #[test]
    fn tick_steps_are_round() {
        assert_eq!(tick_step(48.0, 4.0), 20.0);
        assert_eq!(tick_step(3600.0, 5.0), 1000.0);
        assert_eq!(tick_step(0.0, 5.0), 1.0);
    }
}
