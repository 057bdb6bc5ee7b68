//! Prometheus metrics, rendered from the latest status on every scrape, so VMs that
//! leave simply stop appearing.

use crate::status::Status;
use memtide_core::decision::{VmReport, VmState};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelValue, EncodeMetric, LabelValueEncoder,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use std::fmt::Write;
use std::sync::{Arc, RwLock};

/// Reads the daemon status at scrape time.
#[derive(Debug)]
struct StatusCollector(Arc<RwLock<Status>>);

type Labels<'a> = Vec<(&'static str, &'a str)>;

/// A label value escaped as the exposition format wants (backslash, double quote, line
/// feed). prometheus-client 0.24 writes label values as they are, and VM names come from
/// socket file names and libvirt domain names, which anyone who can name a VM chooses.
struct Escaped<'a>(&'a str);

impl EncodeLabelValue for Escaped<'_> {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> std::fmt::Result {
        for c in self.0.chars() {
            match c {
                '\\' => encoder.write_str("\\\\")?,
                '"' => encoder.write_str("\\\"")?,
                '\n' => encoder.write_str("\\n")?,
                c => encoder.write_char(c)?,
            }
        }
        Ok(())
    }
}

/// `labels` with their values escaped.
fn escaped<'a>(labels: &Labels<'a>) -> Vec<(&'static str, Escaped<'a>)> {
    labels.iter().map(|(k, v)| (*k, Escaped(v))).collect()
}

/// Encode one gauge family from (labels, value) pairs; empty families are omitted, and a
/// single unlabelled row is the family's one value.
fn gauges(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: Vec<(Labels<'_>, f64)>,
) -> std::fmt::Result {
    if rows.is_empty() {
        return Ok(());
    }
    let mut family = enc.encode_descriptor(name, help, None, ConstGauge::new(0.0).metric_type())?;
    for (labels, value) in rows {
        if labels.is_empty() {
            return ConstGauge::new(value).encode(family);
        }
        ConstGauge::new(value).encode(family.encode_family(&escaped(&labels))?)?;
    }
    Ok(())
}

/// Encode one counter family (a single unlabelled row is its one value).
fn counters(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: Vec<(Labels<'_>, u64)>,
) -> std::fmt::Result {
    let mut family =
        enc.encode_descriptor(name, help, None, ConstCounter::new(0u64).metric_type())?;
    for (labels, value) in rows {
        if labels.is_empty() {
            return ConstCounter::new(value).encode(family);
        }
        ConstCounter::new(value).encode(family.encode_family(&escaped(&labels))?)?;
    }
    Ok(())
}

/// Per-VM rows of a value that may be missing.
fn per_vm<'a>(
    vms: &'a [VmReport],
    value: impl Fn(&VmReport) -> Option<f64>,
) -> Vec<(Labels<'a>, f64)> {
    vms.iter()
        .filter_map(|vm| Some((vec![("vm", vm.name.as_str())], value(vm)?)))
        .collect()
}

impl Collector for StatusCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let status = self.0.read().expect("status lock");
        let c = &status.counters;
        counters(
            &mut enc,
            "memtide_ticks",
            "Decisions made.",
            vec![(vec![], c.ticks)],
        )?;
        counters(
            &mut enc,
            "memtide_host_errors",
            "Ticks skipped: host statistics unreadable.",
            vec![(vec![], c.host_errors)],
        )?;
        let actions = c
            .actions
            .iter()
            .flat_map(|(kind, results)| {
                results
                    .iter()
                    .map(move |(r, n)| (vec![("kind", kind.as_str()), ("result", r.as_str())], *n))
            })
            .collect();
        counters(
            &mut enc,
            "memtide_actions",
            "Actions carried out, by kind and result.",
            actions,
        )?;
        let diags = c
            .diagnostics
            .iter()
            .map(|(k, n)| (vec![("kind", k.as_str())], *n))
            .collect();
        counters(
            &mut enc,
            "memtide_diagnostics",
            "Diagnostics (errors and warnings), by kind.",
            diags,
        )?;
        let writes = c
            .write_errors
            .iter()
            .map(|(f, n)| (vec![("file", f.as_str())], *n))
            .collect();
        counters(
            &mut enc,
            "memtide_write_errors",
            "Failed writes (a full disk), by file: event_log, recording, state.",
            writes,
        )?;
        gauges(
            &mut enc,
            "memtide_last_tick_seconds",
            "Duration of the last tick.",
            vec![(vec![], status.last_tick_ms / 1000.0)],
        )?;
        gauges(
            &mut enc,
            "memtide_tick_seconds_max",
            "Duration of the longest tick since the daemon started.",
            vec![(vec![], c.max_tick_ms / 1000.0)],
        )?;
        counters(
            &mut enc,
            "memtide_late_ticks",
            "Ticks that took longer than the interval.",
            vec![(vec![], c.late_ticks)],
        )?;

        let Some(d) = &status.decision else {
            return Ok(());
        };
        let h = &d.host;
        let host = |v: f64| vec![(vec![], v)];
        gauges(
            &mut enc,
            "memtide_host_memory_bytes",
            "Memory of the VM memory domain.",
            host(h.total.as_f64()),
        )?;
        gauges(
            &mut enc,
            "memtide_host_freeable_bytes",
            "Freeable memory of the domain (free + cache).",
            host(h.freeable.as_f64()),
        )?;
        gauges(
            &mut enc,
            "memtide_host_free_ratio",
            "Freeable share of the domain.",
            host(h.free_ratio),
        )?;
        gauges(
            &mut enc,
            "memtide_host_free_ratio_avg",
            "Freeable share averaged over the history.",
            host(h.free_ratio_avg),
        )?;
        let opt = |v: Option<f64>| v.map(host).unwrap_or_default();
        gauges(
            &mut enc,
            "memtide_host_psi_some_avg10",
            "Memory pressure: % of time some tasks stalled (10 s).",
            opt(h.psi_some_avg10),
        )?;
        gauges(
            &mut enc,
            "memtide_host_swap_in_pages_per_second",
            "Host swap-ins.",
            opt(h.swap_in_per_s),
        )?;
        gauges(
            &mut enc,
            "memtide_host_swap_out_pages_per_second",
            "Host swap-outs.",
            opt(h.swap_out_per_s),
        )?;
        if let Some(k) = &h.ksm {
            gauges(
                &mut enc,
                "memtide_ksm_run",
                "KSM run state.",
                host(k.run as f64),
            )?;
            gauges(
                &mut enc,
                "memtide_ksm_pages_to_scan",
                "KSM pages scanned per wake-up.",
                host(k.pages_to_scan as f64),
            )?;
            gauges(
                &mut enc,
                "memtide_ksm_sleep_milliseconds",
                "KSM sleep between wake-ups.",
                host(k.sleep_millisecs as f64),
            )?;
            gauges(
                &mut enc,
                "memtide_ksm_pages_shared",
                "KSM shared pages.",
                host(k.pages_shared as f64),
            )?;
            gauges(
                &mut enc,
                "memtide_ksm_pages_sharing",
                "KSM sites sharing pages (pages saved).",
                host(k.pages_sharing as f64),
            )?;
        }

        let vms = &d.vms;
        let bytes = |b: Option<memtide_core::Bytes>| b.map(|b| b.as_f64());
        let up = per_vm(vms, |v| {
            Some(if v.state == VmState::Unreachable {
                0.0
            } else {
                1.0
            })
        });
        gauges(
            &mut enc,
            "memtide_vm_up",
            "1 when the VM answered this tick.",
            up,
        )?;
        gauges(
            &mut enc,
            "memtide_vm_configured_bytes",
            "Guest RAM size at start.",
            per_vm(vms, |v| bytes(v.configured)),
        )?;
        gauges(
            &mut enc,
            "memtide_vm_actual_bytes",
            "Current guest size (balloon actual).",
            per_vm(vms, |v| bytes(v.actual)),
        )?;
        gauges(
            &mut enc,
            "memtide_vm_target_bytes",
            "Balloon target in force.",
            per_vm(vms, |v| bytes(v.target)),
        )?;
        gauges(
            &mut enc,
            "memtide_vm_min_bytes",
            "Operator minimum.",
            per_vm(vms, |v| Some(v.min.as_f64())),
        )?;
        gauges(
            &mut enc,
            "memtide_vm_max_bytes",
            "Operator maximum.",
            per_vm(vms, |v| Some(v.max.as_f64())),
        )?;
        gauges(
            &mut enc,
            "memtide_vm_guest_free_bytes",
            "Guest MemFree.",
            per_vm(vms, |v| bytes(v.guest_free)),
        )?;
        gauges(
            &mut enc,
            "memtide_vm_guest_available_bytes",
            "Guest MemAvailable.",
            per_vm(vms, |v| bytes(v.guest_available)),
        )?;
        gauges(
            &mut enc,
            "memtide_vm_used_bytes",
            "Guest used memory (size - free).",
            per_vm(vms, |v| bytes(v.used)),
        )?;
        gauges(
            &mut enc,
            "memtide_vm_estimate_bytes",
            "Working set the policy estimated.",
            per_vm(vms, |v| bytes(v.estimate)),
        )?;
        gauges(
            &mut enc,
            "memtide_vm_committed_as_bytes",
            "Guest Committed_AS (guest agent).",
            per_vm(vms, |v| bytes(v.committed_as)),
        )?;
        gauges(
            &mut enc,
            "memtide_vm_refaults_per_second",
            "Guest refaults (major faults without the agent).",
            per_vm(vms, |v| v.refaults_per_s),
        )?;
        gauges(
            &mut enc,
            "memtide_vm_psi_some_avg10",
            "Guest memory pressure: % of time some tasks stalled (10 s).",
            per_vm(vms, |v| v.guest_psi_some_avg10),
        )?;
        gauges(
            &mut enc,
            "memtide_vm_rss_bytes",
            "Resident memory of the QEMU process.",
            per_vm(vms, |v| bytes(v.rss)),
        )?;
        gauges(
            &mut enc,
            "memtide_vm_major_faults_per_second",
            "Guest major faults.",
            per_vm(vms, |v| v.major_faults_per_s),
        )?;
        gauges(
            &mut enc,
            "memtide_vm_swap_in_bytes_per_second",
            "Guest swap-ins.",
            per_vm(vms, |v| v.swap_in_per_s),
        )?;
        gauges(
            &mut enc,
            "memtide_vm_swap_out_bytes_per_second",
            "Guest swap-outs.",
            per_vm(vms, |v| v.swap_out_per_s),
        )?;
        let sampling = &status.sampling;
        counters(
            &mut enc,
            "memtide_vm_late_samples",
            "Samples that missed their tick's deadline (the VM was left out of that decision).",
            sampling
                .iter()
                .map(|s| (vec![("vm", s.name.as_str())], s.late_samples))
                .collect(),
        )?;
        gauges(
            &mut enc,
            "memtide_vm_stale",
            "1 when the VM's sample missed the last tick's deadline.",
            sampling
                .iter()
                .map(|s| (vec![("vm", s.name.as_str())], f64::from(u8::from(s.stale))))
                .collect(),
        )?;
        gauges(
            &mut enc,
            "memtide_vm_sample_age_seconds",
            "Seconds since the VM's latest sample arrived.",
            sampling
                .iter()
                .filter_map(|s| Some((vec![("vm", s.name.as_str())], s.age_s?)))
                .collect(),
        )?;
        Ok(())
    }
}

/// A registry exposing the daemon's status.
pub fn registry(status: Arc<RwLock<Status>>) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(StatusCollector(status)));
    registry
}

/// Render the registry in the OpenMetrics text format.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry)
        .expect("writing to a String cannot fail");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::fleet::Sampling;
    use memtide_core::policy::mom::Mom;
    use memtide_core::testkit::{host, snapshot, vm};
    use memtide_core::{Engine, EngineConfig};

    #[test]
    fn a_vm_name_cannot_add_a_series() {
        let name = "a\"} 1\nmemtide_injected_total{x=\"1\\";
        let mut engine = Engine::new(EngineConfig::default(), Box::<Mom>::default());
        let decision = engine.tick(&snapshot(
            0,
            host(4000, 400),
            vec![vm(name, 1000, 800, 600)],
        ));
        let mut status = Status {
            decision: Some(decision),
            ..Status::default()
        };
        status.counters.diagnostics.insert(name.into(), 1);
        status.sampling.push(Sampling {
            name: name.into(),
            stale: true,
            age_s: Some(4.0),
            late_samples: 2,
        });
        let text = render(&registry(Arc::new(RwLock::new(status))));
        let late =
            r#"memtide_vm_late_samples_total{vm="a\"} 1\nmemtide_injected_total{x=\"1\\"} 2"#;
        assert!(text.lines().any(|l| l == late), "{text}");
        let stale = r#"memtide_vm_stale{vm="a\"} 1\nmemtide_injected_total{x=\"1\\"} 1.0"#;
        assert!(text.lines().any(|l| l == stale), "{text}");
        assert!(!text.contains("\nmemtide_injected"), "{text}");
        let up = r#"memtide_vm_up{vm="a\"} 1\nmemtide_injected_total{x=\"1\\"} 1.0"#;
        assert!(text.lines().any(|l| l == up), "{text}");
        let kind = r#"memtide_diagnostics_total{kind="a\"} 1\nmemtide_injected_total{x=\"1\\"} 1"#;
        assert!(text.lines().any(|l| l == kind), "{text}");
    }
}
