//! Plot primitives for hand-written SVG, shared by the simulator's reports and
//! memtide-bench's plots: a [`Panel`] mapping data to pixels, with axes, ticks, grid
//! lines and labels, polylines broken at gaps and bands between two curves; [`Legend`]
//! entries; and the [`document`] around them.

use std::fmt::Write as _;

/// A round step giving about `n` ticks up to `max`.
pub fn tick_step(max: f64, n: f64) -> f64 {
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

/// A tick label: whole numbers without decimals, others with one.
pub fn fmt_tick(v: f64) -> String {
    if v.fract().abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// A tick label like [`fmt_tick`]'s, with whole thousands as `k` (`2000` is `2k`).
pub fn fmt_tick_k(v: f64) -> String {
    if v >= 1000.0 && (v / 1000.0).fract() == 0.0 {
        format!("{}k", v / 1000.0)
    } else {
        fmt_tick(v)
    }
}

/// Text for SVG: `&`, `<`, `>` and `"` escaped.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A whole SVG document: `width` × `height` on white, `title` centred at the top, then
/// `body`.
pub fn document(width: f64, height: f64, title: &str, body: &str) -> String {
    format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="sans-serif" font-size="11"><rect width="100%" height="100%" fill="white"/><text x="{:.1}" y="20" text-anchor="middle" font-size="14">{}</text>{body}</svg>
"##,
        width / 2.0,
        escape(title)
    )
}

/// How legend entries look: a line `line` pixels long and `width` thick, its label
/// starting `text` pixels after the line's start.
#[derive(Debug, Clone, Copy)]
pub struct Legend {
    /// The line's length.
    pub line: f64,
    /// The line's thickness.
    pub width: f64,
    /// Where the label starts.
    pub text: f64,
}

impl Legend {
    /// An entry at `x`, `y`: a line in `color` (with `attrs`, e.g. a dash pattern, with
    /// its leading space), then `label`.
    pub fn entry(&self, out: &mut String, x: f64, y: f64, color: &str, attrs: &str, label: &str) {
        let _ = write!(
            out,
            r#"<line x1="{x:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{color}" stroke-width="{}"{attrs}/><text x="{:.1}" y="{:.1}">{}</text>"#,
            x + self.line,
            self.width,
            x + self.text,
            y + 4.0,
            escape(label)
        );
    }
}

/// How values map to the vertical axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    /// Proportionally, from 0.
    Linear,
    /// log10(1 + v): zero stays visible; ticks at 0 and the powers of ten.
    Log1p,
}

/// How an axis' ticks are placed and labelled.
#[derive(Debug, Clone, Copy)]
pub struct Ticks {
    /// About how many (a linear axis; a log axis has one per power of ten).
    pub count: f64,
    /// Data units per labelled unit (60 to label seconds in minutes).
    pub per: f64,
    /// The label of a tick, in labelled units ([`fmt_tick`], [`fmt_tick_k`]).
    pub label: fn(f64) -> String,
}

/// A panel's ticks and grid.
#[derive(Debug, Clone, Copy)]
pub struct Axes {
    /// Along the bottom (time).
    pub x: Ticks,
    /// Along the left, with a grid line each.
    pub y: Ticks,
    /// The grid lines' colour.
    pub grid: &'static str,
}

/// A plotting area: data (x from 0 to `x_max`, y from 0 to `y_max`) mapped to pixels.
#[derive(Debug, Clone, Copy)]
pub struct Panel {
    /// Left edge, in pixels.
    pub left: f64,
    /// Top edge, in pixels.
    pub top: f64,
    /// Width, in pixels.
    pub width: f64,
    /// Height, in pixels.
    pub height: f64,
    /// The x value at the right edge.
    pub x_max: f64,
    /// The y value at the top edge.
    pub y_max: f64,
    /// How y values map to the height.
    pub y_scale: Scale,
}

impl Panel {
    /// The pixel column of `t` (clamped to the panel).
    pub fn x(&self, t: f64) -> f64 {
        self.left + self.width * (t / self.x_max).clamp(0.0, 1.0)
    }

    /// The pixel row of `v` (clamped to the panel).
    pub fn y(&self, v: f64) -> f64 {
        let (v, max) = match self.y_scale {
            Scale::Linear => (v, self.y_max),
            Scale::Log1p => ((1.0 + v.max(0.0)).log10(), (1.0 + self.y_max).log10()),
        };
        self.top + self.height * (1.0 - (v / max.max(1e-9)).clamp(0.0, 1.0))
    }

    /// Grid lines and labels at the y ticks, tick marks and labels along the bottom, and
    /// the frame.
    pub fn axes(&self, out: &mut String, axes: &Axes) {
        let bottom = self.top + self.height;
        let right = self.left + self.width;
        let y_top = self.y_max / axes.y.per;
        let ticks: Vec<f64> = match self.y_scale {
            Scale::Linear => {
                let step = tick_step(y_top, axes.y.count);
                (0u32..)
                    .map(|i| f64::from(i) * step)
                    .take_while(|v| *v <= y_top + 1e-9)
                    .collect()
            }
            Scale::Log1p => std::iter::once(0.0)
                .chain((0..).map(|e| 10f64.powi(e)))
                .take_while(|v| *v <= y_top * 1.0001)
                .collect(),
        };
        for v in ticks {
            let y = self.y(v * axes.y.per);
            let _ = write!(
                out,
                r##"<line x1="{:.1}" y1="{y:.1}" x2="{right:.1}" y2="{y:.1}" stroke="{}"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                self.left,
                axes.grid,
                self.left - 4.0,
                y + 4.0,
                (axes.y.label)(v)
            );
        }
        let x_end = self.x_max / axes.x.per;
        let step = tick_step(x_end, axes.x.count);
        for t in (0u32..)
            .map(|i| f64::from(i) * step)
            .take_while(|t| *t <= x_end + 1e-9)
        {
            let x = self.x(t * axes.x.per);
            let _ = write!(
                out,
                r##"<line x1="{x:.1}" y1="{bottom:.1}" x2="{x:.1}" y2="{:.1}" stroke="#333"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                bottom + 4.0,
                bottom + 15.0,
                (axes.x.label)(t)
            );
        }
        let _ = write!(
            out,
            r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="none" stroke="#333"/>"##,
            self.left, self.top, self.width, self.height
        );
    }

    /// A bold title centred `above` pixels over the panel.
    pub fn title(&self, out: &mut String, text: &str, above: f64) {
        let _ = write!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-weight="bold">{}</text>"#,
            self.left + self.width / 2.0,
            self.top - above,
            escape(text)
        );
    }

    /// The x axis' label, centred `below` pixels under the panel.
    pub fn x_label(&self, out: &mut String, text: &str, below: f64) {
        let _ = write!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            self.left + self.width / 2.0,
            self.top + self.height + below,
            escape(text)
        );
    }

    /// The y axis' label, turned upright, centred `left_of` pixels left of the panel.
    pub fn y_label(&self, out: &mut String, text: &str, left_of: f64) {
        let _ = write!(
            out,
            r#"<text transform="translate({:.1},{:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
            self.left - left_of,
            self.top + self.height / 2.0,
            escape(text)
        );
    }

    /// A polyline through the points `(ts[i], values[i])` that are present and finite (a
    /// gap breaks it); `attrs` is added to each (e.g. a dash pattern, with its leading
    /// space).
    pub fn line(
        &self,
        out: &mut String,
        ts: &[f64],
        values: impl IntoIterator<Item = Option<f64>>,
        color: &str,
        attrs: &str,
    ) {
        let mut runs: Vec<String> = vec![String::new()];
        for (t, v) in ts.iter().zip(values) {
            match v {
                Some(v) if v.is_finite() => {
                    let _ = write!(
                        runs.last_mut().expect("one run"),
                        "{:.1},{:.1} ",
                        self.x(*t),
                        self.y(v)
                    );
                }
                _ => runs.push(String::new()),
            }
        }
        for points in runs.iter().filter(|p| !p.is_empty()) {
            let _ = write!(
                out,
                r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="1.5"{attrs}/>"#,
                points.trim_end()
            );
        }
    }

    /// The area between two curves, filled.
    pub fn band(&self, out: &mut String, ts: &[f64], lower: &[f64], upper: &[f64], color: &str) {
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

#[cfg(test)]
mod tests {
    use super::*;

    const AXES: Axes = Axes {
        x: Ticks {
            count: 5.0,
            per: 1.0,
            label: fmt_tick,
        },
        y: Ticks {
            count: 4.0,
            per: 1.0,
            label: fmt_tick_k,
        },
        grid: "#ddd",
    };

    fn panel(y_scale: Scale) -> Panel {
        Panel {
            left: 10.0,
            top: 20.0,
            width: 100.0,
            height: 50.0,
            x_max: 10.0,
            y_max: 4000.0,
            y_scale,
        }
    }

    #[test]
    fn tick_steps_are_round() {
        assert_eq!(tick_step(48.0, 4.0), 20.0);
        assert_eq!(tick_step(3600.0, 5.0), 1000.0);
        assert_eq!(tick_step(0.0, 5.0), 1.0);
    }

    #[test]
    fn tick_labels() {
        assert_eq!(fmt_tick(20.0), "20");
        assert_eq!(fmt_tick(0.5), "0.5");
        assert_eq!(fmt_tick(2000.0), "2000");
        assert_eq!(fmt_tick_k(2000.0), "2k");
        assert_eq!(fmt_tick_k(2500.0), "2500");
    }

    #[test]
    fn values_map_to_pixels_within_the_panel() {
        let p = panel(Scale::Linear);
        assert_eq!((p.x(0.0), p.x(10.0), p.x(20.0)), (10.0, 110.0, 110.0));
        assert_eq!((p.y(0.0), p.y(4000.0), p.y(-1.0)), (70.0, 20.0, 70.0));
        let log = panel(Scale::Log1p);
        assert_eq!(log.y(0.0), 70.0);
        assert!(log.y(10.0) < 70.0 - 50.0 * 0.25, "log: 10 is well up");
    }

    #[test]
    fn axes_have_a_tick_per_step_and_log_axes_one_per_power_of_ten() {
        let mut out = String::new();
        panel(Scale::Linear).axes(&mut out, &AXES);
        assert_eq!(out.matches(r##"stroke="#ddd""##).count(), 5, "0 to 4k");
        assert!(out.contains(">4k</text>") && out.contains(r#"<rect x="10.0""#));
        let mut out = String::new();
        panel(Scale::Log1p).axes(&mut out, &AXES);
        assert_eq!(
            out.matches(r##"stroke="#ddd""##).count(),
            5,
            "0, 1, 10, 100, 1k"
        );
    }

    #[test]
    fn a_gap_breaks_a_line_and_labels_are_escaped() {
        let p = panel(Scale::Linear);
        let mut out = String::new();
        let values = [
            Some(1.0),
            Some(2.0),
            None,
            Some(f64::NAN),
            Some(3.0),
            Some(4.0),
        ];
        p.line(&mut out, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], values, "red", "");
        assert_eq!(out.matches("<polyline").count(), 2);
        assert!(!out.contains("NaN"));
        let mut out = String::new();
        p.line(&mut out, &[], [], "red", "");
        assert!(out.is_empty(), "no points, no line");
        p.title(&mut out, "a<b", 5.0);
        p.y_label(&mut out, "x & y", 40.0);
        assert!(out.contains("a&lt;b") && out.contains("x &amp; y"));
        assert!(document(10.0, 10.0, "\"t\"", &out).contains("&quot;t&quot;"));
        let mut out = String::new();
        let legend = Legend {
            line: 18.0,
            width: 2.5,
            text: 24.0,
        };
        legend.entry(&mut out, 10.0, 20.0, "red", "", "<b>");
        assert_eq!(
            out,
            r#"<line x1="10.0" y1="20.0" x2="28.0" y2="20.0" stroke="red" stroke-width="2.5"/><text x="34.0" y="24.0">&lt;b&gt;</text>"#
        );
    }
}
