//! Plots as hand-written SVG: per-VM allocation against working set, host memory over
//! time, and host memory stacked by VM. They are drawn with [`plot`]'s primitives, which
//! memtide-bench's plots share.

pub mod plot;

use crate::report::Series;
use plot::{document, fmt_tick, Axes, Legend, Panel, Scale, Ticks};
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

/// The dash pattern of the dashed lines.
const DASHED: &str = r#" stroke-dasharray="4 3""#;

/// A panel's axes in `x_unit` and `y_unit`; with `labels`, their names too.
fn axes(f: &Panel, out: &mut String, x_unit: &Unit, y_unit: &Unit, labels: bool) {
    let ticks = |count, unit: &Unit| Ticks {
        count,
        per: unit.per,
        label: fmt_tick,
    };
    let style = Axes {
        x: ticks(5.0, x_unit),
        y: ticks(4.0, y_unit),
        grid: "#ddd",
    };
    f.axes(out, &style);
    if labels {
        f.x_label(out, &format!("time ({})", x_unit.name), 32.0);
        f.y_label(out, &format!("memory ({})", y_unit.name), 42.0);
    }
}

/// A series' values, every one present.
fn present(values: &[f32]) -> impl Iterator<Item = Option<f64>> + '_ {
    values.iter().map(|v| Some(f64::from(*v)))
}

/// A legend: one line per entry (label, colour, dashed).
fn legend(out: &mut String, x: f64, y: f64, entries: &[(String, &str, bool)]) {
    let style = Legend {
        line: 18.0,
        width: 6.0,
        text: 24.0,
    };
    for (i, (label, color, dash)) in entries.iter().enumerate() {
        let dash = if *dash { DASHED } else { "" };
        style.entry(out, x, y + 16.0 * i as f64, color, dash, label);
    }
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
        let f = Panel {
            left: left + (i % cols) as f64 * (pw + 30.0),
            top: top + 20.0 + (i / cols) as f64 * (ph + 50.0),
            width: pw,
            height: ph,
            x_max: end,
            y_max,
            y_scale: Scale::Linear,
        };
        f.title(&mut body, &vm.name, 5.0);
        axes(&f, &mut body, &tu, &mu, false);
        let t = &series.t_s;
        f.line(&mut body, t, present(&vm.resident_mib), PALETTE[2], "");
        f.line(
            &mut body,
            t,
            present(&vm.working_set_mib),
            PALETTE[1],
            DASHED,
        );
        f.line(&mut body, t, present(&vm.given_mib), PALETTE[0], "");
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

/// The host plots' panel: the whole run, memory up to `y_max` MiB.
fn host_panel(series: &Series, y_max: f64) -> Panel {
    Panel {
        left: 80.0,
        top: 50.0,
        width: 620.0,
        height: 310.0,
        x_max: series.t_s.last().copied().unwrap_or(1.0).max(1e-9),
        y_max,
        y_scale: Scale::Linear,
    }
}

/// Host memory over time: free, freeable (free + cache), guest memory in host swap, and
/// KSM's savings.
pub fn host_memory(series: &Series, title: &str) -> String {
    let (width, height) = (900.0, 420.0);
    let f = host_panel(
        series,
        [
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
    );
    let (tu, mu) = (time_unit(f.x_max), memory_unit(f.y_max));
    let mut body = String::new();
    axes(&f, &mut body, &tu, &mu, true);
    let freeable: Vec<f32> = series
        .host_free_mib
        .iter()
        .zip(&series.host_cache_mib)
        .map(|(a, b)| a + b)
        .collect();
    let t = &series.t_s;
    f.line(&mut body, t, present(&freeable), PALETTE[0], DASHED);
    f.line(&mut body, t, present(&series.host_free_mib), PALETTE[0], "");
    f.line(&mut body, t, present(&series.host_swap_mib), PALETTE[3], "");
    f.line(&mut body, t, present(&series.ksm_saved_mib), PALETTE[2], "");
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

    let f = host_panel(series, series.host_total_mib.max(1.0));
    let (tu, mu) = (time_unit(f.x_max), memory_unit(f.y_max));
    let mut body = String::new();
    let mut lower = vec![0.0; n];
    for (_, values, color) in &layers {
        let upper: Vec<f64> = lower.iter().zip(values).map(|(l, v)| l + v).collect();
        f.band(&mut body, &series.t_s, &lower, &upper, color);
        lower = upper;
    }
    axes(&f, &mut body, &tu, &mu, true);
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
}
