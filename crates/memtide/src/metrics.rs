//! Prometheus metrics, rendered from the latest status (at the first scrape after it
//! changed: `http.rs`), so VMs that leave simply stop appearing.

use crate::daemon::fleet::Sampling;
use crate::status::SharedStatus;
use memtide_core::decision::{VmReport, VmState};
use memtide_core::need::NeedLevel;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelValue, EncodeMetric, LabelValueEncoder, NoLabelSet,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::fmt::Write;

/// Reads the daemon status at scrape time.
#[derive(Debug)]
struct StatusCollector(SharedStatus);

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

/// Encode one counter family (a single unlabelled row is its one value); empty families
/// are omitted.
fn counters(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: Vec<(Labels<'_>, u64)>,
) -> std::fmt::Result {
    if rows.is_empty() {
        return Ok(());
    }
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
fn per_vm<'a, T>(
    vms: &'a [VmReport],
    value: impl Fn(&VmReport) -> Option<T>,
) -> Vec<(Labels<'a>, T)> {
    vms.iter()
        .filter_map(|vm| Some((vec![("vm", vm.name.as_str())], value(vm)?)))
        .collect()
}

impl Collector for StatusCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let status = self.0.read();
        let c = &status.counters;
        gauges(
            &mut enc,
            "memtide_build_info",
            "memtide's version, as a label; the value is always 1.",
            vec![(vec![("version", status.version.as_str())], 1.0)],
        )?;
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
        gauges(
            &mut enc,
            "memtide_interval_seconds",
            "Seconds between ticks (interval_s).",
            vec![(vec![], status.interval_s)],
        )?;
        gauges(
            &mut enc,
            "memtide_last_decision_timestamp_seconds",
            "When the last decision was made (seconds since the Unix epoch).",
            status
                .last_decision_unix_s
                .map(|t| vec![(vec![], t)])
                .unwrap_or_default(),
        )?;
        gauges(
            &mut enc,
            "memtide_host_up",
            "0 while the host's statistics cannot be read: no decision is made, and every VM \
             figure is the last decision's; 1 otherwise.",
            vec![(vec![], f64::from(u8::from(status.host_error.is_none())))],
        )?;
        // The failures alerted on are there at 0 before they first happen, so that an
        // increase() sees the first one.
        let mut actions = c.actions.clone();
        for kind in ["balloon", "ksm"] {
            for result in ["ok", "error"] {
                let results = actions.entry(kind.to_string()).or_default();
                results.entry(result.to_string()).or_default();
            }
        }
        let actions = actions
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
        counters(
            &mut enc,
            "memtide_reclaim_asked_bytes",
            "Memory asked of VMs' cgroup v2 memory.reclaim (proactive reclaim).",
            vec![(vec![], c.reclaim_asked_bytes)],
        )?;
        counters(
            &mut enc,
            "memtide_huge_pages_restored_bytes",
            "Guest RAM newly in huge pages after the balloon gave memory back ([host] restore_huge_pages).",
            vec![(vec![], c.huge_pages_restored_bytes)],
        )?;
        counters(
            &mut enc,
            "memtide_place_demoted_bytes",
            "Memory moved to the slow tier by tier placement ([tiering]).",
            vec![(vec![], c.place_demoted_bytes)],
        )?;
        counters(
            &mut enc,
            "memtide_place_promoted_bytes",
            "Memory moved to the fast tier by tier placement ([tiering]).",
            vec![(vec![], c.place_promoted_bytes)],
        )?;
        let placed = |f: fn(&crate::status::Placed) -> Option<memtide_core::Bytes>| {
            status
                .placed
                .iter()
                .filter_map(|p| Some((vec![("vm", p.vm.as_str())], f(p)?.0 as f64)))
                .collect()
        };
        gauges(
            &mut enc,
            "memtide_vm_fast_bytes",
            "A placed VM's memory on the fast tier's node, after its latest placement pass.",
            placed(|p| Some(p.fast)),
        )?;
        gauges(
            &mut enc,
            "memtide_vm_slow_bytes",
            "A placed VM's memory on the slow tier's node, after its latest placement pass.",
            placed(|p| Some(p.slow)),
        )?;
        gauges(
            &mut enc,
            "memtide_vm_fast_budget_bytes",
            "The fast memory a placed VM may hold, as its latest placement pass decided.",
            placed(|p| p.fast_budget),
        )?;
        gauges(
            &mut enc,
            "memtide_vm_cold_age_seconds",
            "A placed VM's cold age after its latest placement pass: memory in use untouched for as long may be demoted (adapted to its promotions unless [tiering] adaptive_age = false).",
            status
                .placed
                .iter()
                .filter_map(|p| Some((vec![("vm", p.vm.as_str())], p.cold_age?.age_s)))
                .collect(),
        )?;
        let rules = c
            .rules
            .iter()
            .map(|(rule, n)| (vec![("rule", rule.as_str())], *n))
            .collect();
        counters(
            &mut enc,
            "memtide_actions_by_rule",
            "Actions, by the rule that decided them (the reason's rule, e.g. memtide.probe).",
            rules,
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
        let mut write_errors = c.write_errors.clone();
        for file in ["event_log", "recording", "state"] {
            write_errors.entry(file.to_string()).or_default();
        }
        let writes = write_errors
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
            "memtide_policy_last_reload_successful",
            "0 when the last policy reload was rejected (the previous policy stays in force).",
            vec![(vec![], f64::from(u8::from(status.policy_error.is_none())))],
        )?;
        gauges(
            &mut enc,
            "memtide_config_restart_pending",
            "1 when the configuration file changed, as of the last reload, in what only a restart applies.",
            vec![(vec![], f64::from(u8::from(!status.restart_pending.is_empty())))],
        )?;
        let ticks = &c.tick_durations;
        let mut family = enc.encode_descriptor(
            "memtide_tick_duration_seconds",
            "How long ticks took (sampling, deciding, acting).",
            None,
            MetricType::Histogram,
        )?;
        family.encode_histogram::<NoLabelSet>(
            ticks.sum_s,
            ticks.count(),
            &ticks.buckets(),
            None,
        )?;
        counters(
            &mut enc,
            "memtide_late_ticks",
            "Ticks that took longer than the interval.",
            vec![(vec![], c.late_ticks)],
        )?;

        let t = &status.tiers;
        let ids: Vec<(String, String)> = t
            .nodes
            .iter()
            .map(|n| {
                (
                    n.id.to_string(),
                    n.tier.map_or(String::new(), |t| t.to_string()),
                )
            })
            .collect();
        let per_node = |value: &dyn Fn(&memtide_adapters::tiers::Node) -> f64| {
            t.nodes
                .iter()
                .zip(&ids)
                .map(|(n, (id, tier))| {
                    (
                        vec![("node", id.as_str()), ("tier", tier.as_str())],
                        value(n),
                    )
                })
                .collect::<Vec<_>>()
        };
        gauges(
            &mut enc,
            "memtide_node_memory_bytes",
            "Memory of each NUMA node, with the memory tier the kernel put it in (larger: slower).",
            per_node(&|n| n.total.as_f64()),
        )?;
        gauges(
            &mut enc,
            "memtide_node_free_bytes",
            "Free memory of each NUMA node.",
            per_node(&|n| n.free.as_f64()),
        )?;
        gauges(
            &mut enc,
            "memtide_vms_hibernated",
            "VMs hibernated and not woken yet (their memory on disk, given back to the host).",
            vec![(vec![], status.hibernated.len() as f64)],
        )?;
        if let Some(z) = &t.zswap {
            gauges(
                &mut enc,
                "memtide_zswap_enabled",
                "zswap takes pages (1) or not (0).",
                vec![(vec![], f64::from(u8::from(z.enabled)))],
            )?;
        }

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
        gauges(
            &mut enc,
            "memtide_host_memory_pressure_ratio",
            "Share of the last 10 s some tasks stalled on memory (PSI some avg10, 0-1).",
            h.psi_some_avg10
                .map(|p| host(p / 100.0))
                .unwrap_or_default(),
        )?;
        // A state set: one series per level, 1 for the level in force.
        let levels = [NeedLevel::Ample, NeedLevel::Tight, NeedLevel::Short];
        gauges(
            &mut enc,
            "memtide_host_need",
            "The host's need for memory as the policy weighed it, by level (ample: only what \
             costs the guests nothing is taken; tight: probing slowly; short: at full speed): \
             1 for the level in force (memtide's policy only).",
            h.need
                .map(|n| {
                    let row = |l: NeedLevel| {
                        (vec![("level", l.name())], f64::from(u8::from(l == n.level)))
                    };
                    levels.into_iter().map(row).collect()
                })
                .unwrap_or_default(),
        )?;
        gauges(
            &mut enc,
            "memtide_host_free_at_costless_ratio",
            "The domain's free share with every VM at its costless size, the figure the need \
             level is read from (memtide's policy only).",
            h.need.map(|n| host(n.free_share)).unwrap_or_default(),
        )?;
        let total = |v: Option<u64>| v.map(|v| vec![(vec![], v)]).unwrap_or_default();
        counters(
            &mut enc,
            "memtide_host_swapped_in_pages",
            "Pages the host swapped in since it booted.",
            total(h.swapped_in_pages),
        )?;
        counters(
            &mut enc,
            "memtide_host_swapped_out_pages",
            "Pages the host swapped out since it booted.",
            total(h.swapped_out_pages),
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
                "memtide_ksm_sleep_seconds",
                "KSM sleep between wake-ups.",
                host(k.sleep_millisecs as f64 / 1000.0),
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
            let known = |v: Option<f64>| v.map(host).unwrap_or_default();
            gauges(
                &mut enc,
                "memtide_ksm_zero_pages",
                "Pages KSM merged with the kernel's zero page (use_zero_pages): saved too, \
                 and not among the sites sharing pages.",
                known(k.ksm_zero_pages.map(|p| p as f64)),
            )?;
            gauges(
                &mut enc,
                "memtide_ksm_general_profit_bytes",
                "What KSM saves less its metadata (the kernel's general_profit).",
                known(k.general_profit.map(|p| p as f64)),
            )?;
        }

        let vms = &d.vms;
        let sampling = &status.sampling;
        // Looked up once per VM: a map, not a search of the list each time.
        let by_name: HashMap<&str, &Sampling> =
            sampling.iter().map(|s| (s.name.as_str(), s)).collect();
        // The policy that decides each VM: its own, else the host's (not the fleet's
        // name, which names every exception); the decision's without them (a status not
        // from a daemon).
        let policy_of = |vm: &str| match status.policies.host.is_empty() {
            true => d.policy.as_str(),
            false => status.policies.of(vm),
        };
        // A VM memtide knows and cannot connect to (its QEMU gone, hung at connection, its
        // socket missing) is out of reach for as long as it waits. Not one down on purpose:
        // hibernated by memtide, or left to another manager.
        let not_connected: Vec<&str> = status
            .out_of_reach()
            .into_iter()
            .filter(|(_, w)| !w.left_alone)
            .map(|(vm, _)| vm)
            .collect();
        let decided = vms.iter().map(|vm| (vm.name.as_str(), vm.state.name()));
        let waiting = not_connected
            .iter()
            .map(|vm| (*vm, VmState::Unreachable.name()));
        let info = decided
            .chain(waiting)
            .map(|(vm, state)| {
                let s = by_name.get(vm);
                let from = s.and_then(|s| s.bounds_from);
                let labels = vec![
                    ("vm", vm),
                    ("connector", s.map_or("", |s| s.connector.as_str())),
                    ("policy", policy_of(vm)),
                    ("state", state),
                    ("min_from", from.map_or("", |f| f.min.name())),
                    ("max_from", from.map_or("", |f| f.max.name())),
                ];
                (labels, 1.0)
            })
            .collect();
        gauges(
            &mut enc,
            "memtide_vm_info",
            "Each VM's connector, policy, state (managed, unmanaged, unreachable, busy) and where \
             its bounds came from, as labels; the value is always 1.",
            info,
        )?;
        let bytes = |b: Option<memtide_core::Bytes>| b.map(|b| b.as_f64());
        let mut up = per_vm(vms, |v| {
            Some(if v.state == VmState::Unreachable {
                0.0
            } else {
                1.0
            })
        });
        // Down too, for as long as it waits: an alert on `memtide_vm_up == 0` then holds
        // for as long as the VM is out of reach.
        up.extend(not_connected.iter().map(|vm| (vec![("vm", *vm)], 0.0)));
        gauges(
            &mut enc,
            "memtide_vm_up",
            "1 when the VM answered this tick, or its hypervisor holds it (a save, a \
             migration, a pause); 0 when it did not, or is not connected (a VM memtide knows and waits \
             to reach; not one hibernated, or left to another manager).",
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
            "memtide_vm_rss_bytes",
            "Resident memory of the QEMU process.",
            per_vm(vms, |v| bytes(v.rss)),
        )?;
        gauges(
            &mut enc,
            "memtide_vm_hypervisor_own_bytes",
            "The QEMU process's own resident memory beside guest RAM (heap, devices, TCG's \
             translation cache), where told apart: RSS less it is the guest memory the host backs.",
            per_vm(vms, |v| bytes(v.hypervisor_own)),
        )?;
        gauges(
            &mut enc,
            "memtide_vm_host_swapped_bytes",
            "Memory of the hypervisor process the host swapped out (VmSwap): guest memory \
             the host no longer holds in RAM.",
            per_vm(vms, |v| bytes(v.host_swapped)),
        )?;
        gauges(
            &mut enc,
            "memtide_vm_zram_stored_bytes",
            "What the guest's zram swap stores, uncompressed (mm_stat's orig_data_size; \
             guest agent).",
            per_vm(vms, |v| bytes(v.guest_zram.map(|z| z.stored))),
        )?;
        gauges(
            &mut enc,
            "memtide_vm_zram_used_bytes",
            "The guest memory its zram swap takes for what it stores (mm_stat's \
             mem_used_total; guest agent).",
            per_vm(vms, |v| bytes(v.guest_zram.map(|z| z.used))),
        )?;
        gauges(
            &mut enc,
            "memtide_vm_memory_pressure_ratio",
            "Share of the last 10 s some guest tasks stalled on memory (PSI some avg10, 0-1; \
             guest agent).",
            per_vm(vms, |v| v.guest_psi_some_avg10.map(|p| p / 100.0)),
        )?;
        let guest_bytes = |b: Option<memtide_core::Bytes>| b.map(|b| b.0);
        counters(
            &mut enc,
            "memtide_vm_swapped_in_bytes",
            "Bytes the guest swapped in since it booted, as it reports them.",
            per_vm(vms, |v| guest_bytes(v.totals.swapped_in)),
        )?;
        counters(
            &mut enc,
            "memtide_vm_swapped_out_bytes",
            "Bytes the guest swapped out since it booted, as it reports them.",
            per_vm(vms, |v| guest_bytes(v.totals.swapped_out)),
        )?;
        counters(
            &mut enc,
            "memtide_vm_major_faults",
            "Major page faults in the guest since it booted, as it reports them.",
            per_vm(vms, |v| v.totals.major_faults),
        )?;
        counters(
            &mut enc,
            "memtide_vm_refaults",
            "Evicted pages the guest faulted back since it booted (guest agent).",
            per_vm(vms, |v| v.totals.refaults),
        )?;
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
            "Seconds since the VM's latest figures arrived (an answer that it is busy, paused say, or failed, brings none).",
            sampling
                .iter()
                .filter_map(|s| Some((vec![("vm", s.name.as_str())], s.age_s?)))
                .collect(),
        )?;
        Ok(())
    }
}

/// A registry exposing the daemon's status.
pub fn registry(status: SharedStatus) -> Registry {
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

/// `openmetrics` (as [`render`] writes it) in the classic Prometheus text format
/// (0.0.4): a counter family is named as its samples are, with `_total`, and there is
/// no `# EOF` nor `# UNIT`. prometheus-client writes only OpenMetrics, which the classic
/// parsers (promtool's among them) misread, so the few differences are rewritten here.
pub fn classic(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len() + 256);
    let mut help: Option<&str> = None;
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if line.starts_with("# HELP ") {
            if let Some(previous) = help.replace(line) {
                push_line(&mut out, previous);
            }
            continue;
        }
        let counter = line
            .strip_prefix("# TYPE ")
            .and_then(|rest| rest.strip_suffix(" counter"));
        match (counter, help.take()) {
            (Some(name), help) => {
                if let Some(text) = help.and_then(|h| h.strip_prefix("# HELP ")) {
                    let text = text.strip_prefix(name).unwrap_or(text);
                    push_line(&mut out, &format!("# HELP {name}_total{text}"));
                }
                push_line(&mut out, &format!("# TYPE {name}_total counter"));
            }
            (None, help) => {
                if let Some(help) = help {
                    push_line(&mut out, help);
                }
                push_line(&mut out, line);
            }
        }
    }
    out
}

fn push_line(out: &mut String, line: &str) {
    out.push_str(line);
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{BoundFrom, BoundsFrom};
    use crate::status::Status;
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
            connector: "qmp".into(),
            stale: true,
            age_s: Some(4.0),
            late_samples: 2,
            bounds_from: None,
        });
        let text = render(&registry(SharedStatus::new(status)));
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

    /// The series named `prefix…` after a tick with "web" (as `edit` makes it) beside a
    /// plain "db".
    fn series_of_web(
        prefix: &str,
        edit: impl FnOnce(&mut memtide_core::snapshot::VmSample),
    ) -> Vec<String> {
        let mut web = vm("web", 1000, 800, 600);
        edit(web.sample.as_mut().unwrap());
        let mut engine = Engine::new(EngineConfig::default(), Box::<Mom>::default());
        let decision = engine.tick(&snapshot(
            0,
            host(4000, 400),
            vec![web, vm("db", 1000, 800, 600)],
        ));
        let status = Status {
            decision: Some(decision),
            ..Status::default()
        };
        let text = render(&registry(SharedStatus::new(status)));
        text.lines()
            .filter(|l| l.starts_with(prefix))
            .map(String::from)
            .collect()
    }

    #[test]
    fn what_the_host_swapped_out_of_a_vm_is_a_gauge_of_its_own() {
        let series = series_of_web("memtide_vm_host_swapped_bytes", |s| {
            s.swapped = Some(memtide_core::Bytes::from_mib(128));
        });
        assert_eq!(
            series,
            [r#"memtide_vm_host_swapped_bytes{vm="web"} 134217728.0"#],
            "not known for db"
        );
    }

    #[test]
    fn a_guests_zram_swap_is_two_gauges_of_its_own() {
        use memtide_core::stats::{AgentStats, ZramSwap};
        use memtide_core::Bytes;
        let series = series_of_web("memtide_vm_zram_", |s| {
            s.agent = Some(Ok(AgentStats {
                zram: Some(ZramSwap {
                    free: Bytes::from_mib(500),
                    stored: Bytes::from_mib(300),
                    used: Bytes::from_mib(100),
                }),
                ..AgentStats::default()
            }));
        });
        assert_eq!(
            series,
            [
                r#"memtide_vm_zram_stored_bytes{vm="web"} 314572800.0"#,
                r#"memtide_vm_zram_used_bytes{vm="web"} 104857600.0"#
            ],
            "none for db"
        );
    }

    #[test]
    fn a_vm_not_connected_is_down_for_as_long_as_it_waits() {
        let mut engine = Engine::new(EngineConfig::default(), Box::<Mom>::default());
        let decision = engine.tick(&snapshot(
            0,
            host(4000, 400),
            vec![vm("web", 1000, 800, 600)],
        ));
        let waiting = |name: &str| crate::daemon::fleet::Waiting {
            name: name.into(),
            endpoint: format!("/run/memtide/qmp/{name}.qmp"),
            error: Some("No such file or directory".into()),
            left_alone: false,
            retry_in_s: 4.0,
        };
        let pve = crate::daemon::fleet::Waiting {
            left_alone: true,
            ..waiting("pve")
        };
        let status = Status {
            decision: Some(decision),
            // "web" waits under a second endpoint of its name: it answered, it is up.
            // "pve" is left to Proxmox VE's auto-ballooning, "idle" hibernated: both down
            // on purpose.
            waiting: vec![
                waiting("db"),
                waiting("web"),
                waiting("db"),
                pve,
                waiting("idle"),
            ],
            hibernated: vec![crate::status::Hibernated {
                vm: "idle".into(),
                id: "1".into(),
                since: "2026-12-02T06:00:00Z".into(),
                configured: memtide_core::Bytes::from_mib(512),
            }],
            ..Status::default()
        };
        let text = classic(&render(&registry(SharedStatus::new(status))));
        let up: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("memtide_vm_up{"))
            .collect();
        assert_eq!(
            up,
            [
                "memtide_vm_up{vm=\"web\"} 1.0",
                "memtide_vm_up{vm=\"db\"} 0.0"
            ],
            "{text}"
        );
        // And counted by state as unreachable (docs/metrics.md's `count by (connector,
        // state) (memtide_vm_info)`), not left out of the count.
        let states: Vec<(&str, &str)> = text
            .lines()
            .filter(|l| l.starts_with("memtide_vm_info{"))
            .map(|l| {
                let label = |k: &str| {
                    l.split(&format!("{k}=\""))
                        .nth(1)
                        .unwrap()
                        .split('"')
                        .next()
                        .unwrap()
                };
                (label("vm"), label("state"))
            })
            .collect();
        assert_eq!(
            states,
            [("web", "managed"), ("db", "unreachable")],
            "{text}"
        );
    }

    /// Mom's decision on a host of 4000 MiB, 400 free, with no VM.
    fn moms_decision() -> memtide_core::Decision {
        let mut engine = Engine::new(EngineConfig::default(), Box::<Mom>::default());
        engine.tick(&snapshot(0, host(4000, 400), vec![]))
    }

    /// The metrics of a status holding `decision` alone.
    fn metrics_of(decision: &memtide_core::Decision) -> String {
        let status = Status {
            decision: Some(decision.clone()),
            ..Status::default()
        };
        classic(&render(&registry(SharedStatus::new(status))))
    }

    #[test]
    fn the_host_s_need_is_a_state_set_of_its_levels() {
        let mut decision = moms_decision();
        let text = metrics_of;
        assert!(
            !text(&decision).contains("memtide_host_need"),
            "mom weighs none"
        );
        decision.host.need = Some(memtide_core::need::Need {
            level: NeedLevel::Tight,
            free_share: 0.12,
            free_at_full: 0.05,
        });
        let text = text(&decision);
        for line in [
            "memtide_host_need{level=\"ample\"} 0.0",
            "memtide_host_need{level=\"tight\"} 1.0",
            "memtide_host_need{level=\"short\"} 0.0",
            "memtide_host_free_at_costless_ratio 0.12",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line:?} missing from\n{text}"
            );
        }
    }

    #[test]
    fn ksm_savings_are_the_kernels_figures_where_it_has_them() {
        let mut decision = moms_decision();
        let text = metrics_of;
        let old_kernel = text(&decision);
        assert!(
            old_kernel
                .lines()
                .any(|l| l == "memtide_ksm_pages_sharing 0.0"),
            "{old_kernel}"
        );
        assert!(
            !old_kernel.contains("memtide_ksm_zero_pages"),
            "{old_kernel}"
        );
        let ksm = decision.host.ksm.as_mut().expect("the test host has KSM");
        (ksm.general_profit, ksm.ksm_zero_pages) = (Some(-4096), Some(10));
        let text = text(&decision);
        for line in [
            "memtide_ksm_zero_pages 10.0",
            "memtide_ksm_general_profit_bytes -4096.0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line:?} missing from\n{text}"
            );
        }
    }

    #[test]
    fn an_unreadable_host_is_down_and_the_failures_alerted_on_start_at_zero() {
        let mut status = Status::default();
        let text = |status: &Status| classic(&render(&registry(SharedStatus::new(status.clone()))));
        let healthy = text(&status);
        for line in [
            "memtide_host_up 1.0",
            "memtide_write_errors_total{file=\"event_log\"} 0",
            "memtide_write_errors_total{file=\"state\"} 0",
            "memtide_actions_total{kind=\"balloon\",result=\"error\"} 0",
            "memtide_actions_total{kind=\"ksm\",result=\"error\"} 0",
        ] {
            assert!(
                healthy.lines().any(|l| l == line),
                "{line:?} missing from\n{healthy}"
            );
        }
        status.host_error = Some("host statistics unreadable, tick skipped: meminfo".into());
        status.counters.write_errors.insert("state".into(), 2);
        let failing = text(&status);
        for line in [
            "memtide_host_up 0.0",
            "memtide_write_errors_total{file=\"state\"} 2",
        ] {
            assert!(
                failing.lines().any(|l| l == line),
                "{line:?} missing from\n{failing}"
            );
        }
    }

    #[test]
    fn counters_and_info_follow_the_conventions() {
        let mut engine = Engine::new(EngineConfig::default(), Box::<Mom>::default());
        let mut snap = snapshot(0, host(4000, 400), vec![vm("web", 1000, 800, 600)]);
        snap.host.vmstat.pswpin = Some(7);
        let sample = snap.vms[0].sample.as_mut().unwrap();
        sample.stats.swap_in = Some(memtide_core::Bytes(4096 * 3));
        sample.stats.major_faults = Some(12);
        let mut status = Status {
            version: "9.8.7".into(),
            decision: Some(engine.tick(&snap)),
            ..Status::default()
        };
        status.counters.ticks = 1;
        status.counters.tick_took(30.0, 1000.0);
        status.tiers.nodes = vec![memtide_adapters::tiers::Node {
            id: 1,
            total: memtide_core::Bytes::from_gib(4),
            tier: Some(22),
            ..Default::default()
        }];
        status.tiers.zswap = Some(Default::default());
        status.counters.place_demoted_bytes = 3 << 20;
        status.counters.place_promoted_bytes = 1 << 20;
        status.placed.push(crate::status::Placed {
            vm: "web".into(),
            fast: memtide_core::Bytes::from_mib(42),
            slow: memtide_core::Bytes::from_mib(86),
            fast_budget: Some(memtide_core::Bytes::from_mib(42)),
            cold_age: Some(crate::daemon::place::Age {
                age_s: 120.0,
                adaptive: true,
            }),
        });
        // On its first scan: where its memory is, but no budget decided.
        status.placed.push(crate::status::Placed {
            vm: "new".into(),
            fast: memtide_core::Bytes::from_mib(8),
            slow: memtide_core::Bytes::ZERO,
            fast_budget: None,
            cold_age: None,
        });
        status.sampling.push(Sampling {
            name: "web".into(),
            connector: "qmp".into(),
            stale: false,
            age_s: Some(0.5),
            late_samples: 0,
            bounds_from: Some(BoundsFrom {
                min: BoundFrom::Proxmox,
                max: BoundFrom::Config,
            }),
        });
        let open = render(&registry(SharedStatus::new(status)));
        let text = classic(&open);
        for line in [
            "memtide_build_info{version=\"9.8.7\"} 1.0",
            "# TYPE memtide_ticks_total counter",
            "# HELP memtide_ticks_total Decisions made.",
            "memtide_ticks_total 1",
            "memtide_host_swapped_in_pages_total 7",
            "memtide_vm_swapped_in_bytes_total{vm=\"web\"} 12288",
            "memtide_vm_major_faults_total{vm=\"web\"} 12",
            "memtide_vm_info{vm=\"web\",connector=\"qmp\",policy=\"mom\",state=\"managed\",\
             min_from=\"proxmox\",max_from=\"config\"} 1.0",
            "memtide_tick_duration_seconds_bucket{le=\"0.05\"} 1",
            "memtide_tick_duration_seconds_count 1",
            "memtide_node_memory_bytes{node=\"1\",tier=\"22\"} 4294967296.0",
            "memtide_node_free_bytes{node=\"1\",tier=\"22\"} 0.0",
            "memtide_zswap_enabled 0.0",
            "memtide_vms_hibernated 0.0",
            "memtide_place_demoted_bytes_total 3145728",
            "memtide_place_promoted_bytes_total 1048576",
            "memtide_vm_fast_bytes{vm=\"web\"} 44040192.0",
            "memtide_vm_slow_bytes{vm=\"web\"} 90177536.0",
            "memtide_vm_fast_budget_bytes{vm=\"web\"} 44040192.0",
            "memtide_vm_fast_bytes{vm=\"new\"} 8388608.0",
            "# TYPE memtide_vm_cold_age_seconds gauge",
            "memtide_vm_cold_age_seconds{vm=\"web\"} 120.0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line:?} missing from\n{text}"
            );
        }
        assert!(
            !text.contains("memtide_vm_fast_budget_bytes{vm=\"new\"}"),
            "no budget at a first scan: {text}"
        );
        assert!(
            !text.contains("memtide_vm_cold_age_seconds{vm=\"new\"}"),
            "no cold age unknown: {text}"
        );
        assert!(
            !text.contains("# EOF") && open.ends_with("# EOF\n"),
            "{text}"
        );
        assert!(
            !text.contains("per_second") && !text.contains("milliseconds"),
            "{text}"
        );
        assert_eq!(
            text.lines().filter(|l| !l.starts_with('#')).count(),
            open.lines().filter(|l| !l.starts_with('#')).count(),
            "every sample is kept"
        );
    }
}
