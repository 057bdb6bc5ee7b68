//! The numbers: pure functions over the series a run records.

/// One report line of a workload on the serial console.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    /// When the harness read it, in seconds since the daemon started (negative: before).
    pub at_s: f64,
    /// The workload's own `t=` (seconds since it began).
    pub t: f64,
    /// Its `mib_per_s=`.
    pub mib_per_s: f64,
    /// Its `refaults=` (filecache, mix), if any.
    pub refaults: Option<f64>,
}

/// Parse a workload report line (`NAME t=12 ... mib_per_s=1234.5 ...`); `None` for any
/// other console line (setup lines, kernel messages, the guest's own lines).
pub fn parse_line(workload: &str, line: &str, at_s: f64) -> Option<Line> {
    // SeaBIOS escape codes or kernel messages may precede the name on the same line.
    let start = line.find(&format!("{workload} t="))?;
    let mut t = None;
    let mut rate = None;
    let mut refaults = None;
    for word in line[start..].split_whitespace().skip(1) {
        let Some((k, v)) = word.split_once('=') else {
            continue;
        };
        let v = v.trim().parse::<f64>().ok();
        match k {
            "t" => t = v,
            "mib_per_s" => rate = v,
            "refaults" => refaults = v,
            _ => {}
        }
    }
    Some(Line {
        at_s,
        t: t?,
        mib_per_s: rate?,
        refaults,
    })
}

/// Throughput over `[from_s, to_s]`: the MiB the lines read in the window account for
/// divided by the time they cover. Each line's rate covers the workload's time since its
/// previous line (a stalled workload skips lines, so the next one covers several
/// intervals); the first line ever covers one second.
pub fn throughput(lines: &[Line], from_s: f64, to_s: f64) -> Option<f64> {
    let mut prev_t: Option<f64> = None;
    let (mut mib, mut secs) = (0.0, 0.0);
    for l in lines {
        let covered = match prev_t {
            Some(p) if l.t > p => l.t - p,
            _ => 1.0,
        };
        prev_t = Some(l.t);
        if l.at_s >= from_s && l.at_s <= to_s {
            mib += l.mib_per_s * covered;
            secs += covered;
        }
    }
    (secs > 0.0).then(|| mib / secs)
}

/// Time until `values` enters `[ideal × (1 − tolerance), ideal × (1 + tolerance)]` and
/// stays there to the end: the time of the first sample of the final run of samples
/// within the band. `None` if the last sample is outside it (or a sample is missing
/// there), or there are no samples.
pub fn converge_time(
    ts: &[f64],
    values: &[Option<f64>],
    ideal: f64,
    tolerance: f64,
) -> Option<f64> {
    let (lo, hi) = (ideal * (1.0 - tolerance), ideal * (1.0 + tolerance));
    let inside = |v: &Option<f64>| v.is_some_and(|v| v >= lo && v <= hi);
    let n = ts.len().min(values.len());
    if n == 0 || !inside(&values[n - 1]) {
        return None;
    }
    let first = (0..n)
        .rev()
        .take_while(|&i| inside(&values[i]))
        .last()
        .expect("the last sample is inside");
    Some(ts[first])
}

/// Mean of the present values whose time is in `[from_s, to_s]`.
pub fn mean_in(ts: &[f64], values: &[Option<f64>], from_s: f64, to_s: f64) -> Option<f64> {
    let picked: Vec<f64> = ts
        .iter()
        .zip(values)
        .filter(|(t, _)| **t >= from_s && **t <= to_s)
        .filter_map(|(_, v)| *v)
        .collect();
    (!picked.is_empty()).then(|| picked.iter().sum::<f64>() / picked.len() as f64)
}

/// Coefficient of variation (standard deviation / mean) of the report lines' rates in
/// `[from_s, to_s]`: how noisy the throughput is second to second.
pub fn rate_cv(lines: &[Line], from_s: f64, to_s: f64) -> Option<f64> {
    let v: Vec<f64> = lines
        .iter()
        .filter(|l| l.at_s >= from_s && l.at_s <= to_s)
        .map(|l| l.mib_per_s)
        .collect();
    if v.len() < 2 {
        return None;
    }
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (v.len() - 1) as f64;
    (mean > 0.0).then(|| var.sqrt() / mean)
}

/// Standard error of the window's throughput, from the spread of its means over
/// consecutive `block_s` blocks (throughput is autocorrelated second to second, so
/// blocks of several seconds give a fairer spread than single lines). `None` with fewer
/// than 3 blocks.
pub fn throughput_se(lines: &[Line], from_s: f64, to_s: f64, block_s: f64) -> Option<f64> {
    let last = lines
        .iter()
        .map(|l| l.at_s)
        .fold(f64::NEG_INFINITY, f64::max)
        .min(to_s);
    let mut means = Vec::new();
    let mut start = from_s;
    while start + block_s <= last + 1e-9 {
        if let Some(m) = throughput(lines, start + 1e-9, start + block_s) {
            means.push(m);
        }
        start += block_s;
    }
    if means.len() < 3 {
        return None;
    }
    let n = means.len() as f64;
    let mean = means.iter().sum::<f64>() / n;
    let var = means.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    Some((var / n).sqrt())
}

/// Standard error of `a / b` from those of `a` and `b` (independent).
pub fn ratio_se(a: f64, a_se: f64, b: f64, b_se: f64) -> f64 {
    (a / b) * ((a_se / a).powi(2) + (b_se / b).powi(2)).sqrt()
}

/// Largest present value.
pub fn max_of(values: &[Option<f64>]) -> Option<f64> {
    values.iter().flatten().copied().reduce(f64::max)
}

/// Per-sample sums of several VMs' aligned series (a sample missing for any VM is missing).
pub fn sum_series(series: &[&[Option<f64>]]) -> Vec<Option<f64>> {
    let n = series.iter().map(|s| s.len()).min().unwrap_or(0);
    (0..n)
        .map(|i| series.iter().map(|s| s[i]).sum::<Option<f64>>())
        .collect()
}

/// The counter `key` of a `/proc/vmstat` or `/proc/meminfo` text (meminfo in kB).
pub fn proc_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut words = l.split_whitespace();
        let k = words.next()?.trim_end_matches(':');
        (k == key).then(|| words.next()?.parse().ok())?
    })
}

/// Difference of a counter between two `/proc/vmstat` texts.
pub fn vmstat_delta(before: &str, after: &str, key: &str) -> Option<u64> {
    Some(proc_value(after, key)?.saturating_sub(proc_value(before, key)?))
}

/// Round for the JSON: 2 decimals.
pub fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[f64]) -> Vec<Option<f64>> {
        v.iter().map(|v| Some(*v)).collect()
    }

    #[test]
    fn converge_time_is_the_start_of_the_final_run_inside_the_band() {
        let ts: Vec<f64> = (0..8).map(f64::from).collect();
        // ideal 100 ± 10%: enters at 2, leaves at 4, back for good at 5.
        let v = s(&[160.0, 130.0, 105.0, 95.0, 80.0, 91.0, 109.0, 100.0]);
        assert_eq!(converge_time(&ts, &v, 100.0, 0.10), Some(5.0));
        // Never leaves after entering.
        let v = s(&[200.0, 150.0, 110.0, 100.0, 99.0, 100.0, 101.0, 100.0]);
        assert_eq!(converge_time(&ts, &v, 100.0, 0.10), Some(2.0));
        // Inside from the first sample.
        assert_eq!(converge_time(&ts, &s(&[100.0; 8]), 100.0, 0.10), Some(0.0));
        // Outside at the end: never converged.
        let v = s(&[100.0, 100.0, 100.0, 100.0, 100.0, 100.0, 100.0, 120.0]);
        assert_eq!(converge_time(&ts, &v, 100.0, 0.10), None);
        // A missing last sample counts as outside; a missing one before the final run too.
        let mut v = s(&[100.0; 8]);
        v[7] = None;
        assert_eq!(converge_time(&ts, &v, 100.0, 0.10), None);
        let mut v = s(&[100.0; 8]);
        v[3] = None;
        assert_eq!(converge_time(&ts, &v, 100.0, 0.10), Some(4.0));
        assert_eq!(converge_time(&[], &[], 100.0, 0.10), None);
    }

    #[test]
    fn report_lines_parse() {
        let l = parse_line(
            "memknobs",
            "memknobs t=12 phase=1 size_mib=200 mib_per_s=1234.5\r",
            3.0,
        )
        .unwrap();
        assert_eq!(
            (l.at_s, l.t, l.mib_per_s, l.refaults),
            (3.0, 12.0, 1234.5, None)
        );
        let l = parse_line(
            "filecache",
            "filecache t=4 set_mib=150 mib_per_s=345.6 refaults=12",
            0.0,
        )
        .unwrap();
        assert_eq!(l.refaults, Some(12.0));
        let l = parse_line(
            "coldalloc",
            "\x1b[2Jcoldalloc t=1 hot_mib=32 mib_per_s=183000.0 cold_mib=200 cold_resident_mib=200.0",
            0.0,
        )
        .unwrap();
        assert_eq!(l.mib_per_s, 183000.0);
        assert!(parse_line(
            "filecache",
            "filecache setup file=/data/fileset wrote_mib=150 secs=4.9",
            0.0
        )
        .is_none());
        assert!(parse_line("memknobs", "memtide-guest: ready", 0.0).is_none());
        assert!(parse_line("memknobs", "memknobs t=3 phase=1", 0.0).is_none());
    }

    #[test]
    fn throughput_weights_each_line_by_the_time_it_covers() {
        let line = |at_s, t, mib_per_s| Line {
            at_s,
            t,
            mib_per_s,
            refaults: None,
        };
        // Before the window: only anchors t. In it: 100 for 1 s, then a stall of 3 s at 20.
        let lines = [
            line(-1.0, 10.0, 999.0),
            line(0.5, 11.0, 100.0),
            line(3.5, 14.0, 20.0),
            line(9.0, 15.0, 500.0),
        ];
        let got = throughput(&lines, 0.0, 5.0).unwrap();
        assert!((got - (100.0 + 60.0) / 4.0).abs() < 1e-9, "{got}");
        assert_eq!(throughput(&lines, 20.0, 30.0), None);
        let cv = rate_cv(&lines, 0.0, 10.0).unwrap();
        assert!(cv > 1.0, "{cv}");
        assert_eq!(rate_cv(&lines, 0.0, 1.0), None, "one line");
    }

    #[test]
    fn the_standard_error_comes_from_block_means() {
        let line = |i: u32, v: f64| Line {
            at_s: f64::from(i),
            t: f64::from(i),
            mib_per_s: v,
            refaults: None,
        };
        // 30 s alternating 10-s blocks of 100 and 200: block means 100, 200, 100.
        let lines: Vec<Line> = (1..=30)
            .map(|i| line(i, if (i - 1) / 10 == 1 { 200.0 } else { 100.0 }))
            .collect();
        let se = throughput_se(&lines, 0.0, 30.0, 10.0).unwrap();
        let expected =
            (((100.0f64 - 133.33).powi(2) * 2.0 + (200.0f64 - 133.33).powi(2)) / 2.0 / 3.0).sqrt();
        assert!((se - expected).abs() < 0.1, "{se} vs {expected}");
        assert_eq!(throughput_se(&lines, 0.0, 20.0, 10.0), None, "two blocks");
        let r = ratio_se(90.0, 9.0, 100.0, 0.0);
        assert!((r - 0.09).abs() < 1e-12);
    }

    #[test]
    fn series_helpers() {
        let ts = [0.0, 1.0, 2.0, 3.0];
        let v = vec![Some(1.0), None, Some(3.0), Some(5.0)];
        assert_eq!(mean_in(&ts, &v, 0.0, 2.0), Some(2.0));
        assert_eq!(max_of(&v), Some(5.0));
        let w = vec![Some(1.0), Some(1.0), Some(1.0)];
        assert_eq!(sum_series(&[&v, &w]), vec![Some(2.0), None, Some(4.0)]);
        let before = "pswpin 10\nworkingset_refault_file 5\noom_kill 0\n";
        let after = "pswpin 25\nworkingset_refault_file 5\noom_kill 1\n";
        assert_eq!(vmstat_delta(before, after, "pswpin"), Some(15));
        assert_eq!(vmstat_delta(before, after, "oom_kill"), Some(1));
        assert_eq!(vmstat_delta(before, after, "nope"), None);
        assert_eq!(
            proc_value("MemAvailable:   123456 kB\n", "MemAvailable"),
            Some(123456)
        );
    }
}
