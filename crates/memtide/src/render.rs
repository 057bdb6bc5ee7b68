//! `memtide status` as text: a header, the host, one line per VM, why, and what went wrong.

use crate::config::BoundsFrom;
use crate::status::Status;
use memtide_adapters::tiers::Tiers;
use memtide_core::stats::DomainScope;
use memtide_core::{guest_text, Bytes};
use serde_json::Value;
use std::collections::HashMap;
use std::fmt::Write;

fn size(b: Option<Bytes>) -> String {
    b.map_or_else(|| "-".into(), |b| b.to_string())
}

fn rate(r: Option<f64>) -> String {
    r.map_or_else(|| "-".into(), |r| format!("{r:.0}"))
}

/// Every text in `s` with its control characters escaped, so that none reaches the
/// terminal: VM names, messages and errors come from guests, hypervisors and socket names.
pub(crate) fn printable(s: &Status) -> Status {
    fn escape(v: &mut Value) {
        match v {
            Value::String(text) => *text = guest_text::escape(text),
            Value::Array(items) => items.iter_mut().for_each(escape),
            Value::Object(fields) => fields.values_mut().for_each(escape),
            _ => {}
        }
    }
    let mut value = serde_json::to_value(s).expect("status serializes");
    escape(&mut value);
    serde_json::from_value(value).expect("an escaped status is a status")
}

/// The host's memory tiers on one line, when it has more than one node or a compressed
/// tier: each node's memory and tier, then zswap and swap.
fn tiers(t: &Tiers) -> Option<String> {
    if t.nodes.len() < 2 && t.zswap.as_ref().is_none_or(|z| !z.enabled) {
        return None;
    }
    let mut parts: Vec<String> = t
        .nodes
        .iter()
        .map(|n| {
            let mut p = format!("node {} ", n.id);
            p += if n.cpus { "(CPUs" } else { "(memory only" };
            if let Some(tier) = n.tier {
                p += &format!(", tier {tier}");
            }
            if let Some(ns) = n.read_latency_ns {
                p += &format!(", {ns} ns");
            }
            if let Some(mbps) = n.read_bandwidth_mbps {
                p += &format!(", {mbps} MB/s");
            }
            p + &format!(") {} free of {}", n.free, n.total)
        })
        .collect();
    if let Some(z) = &t.zswap {
        let state = if z.enabled { "on" } else { "off" };
        parts.push(format!("zswap {state} ({})", z.compressor));
    }
    parts.push(format!("swap {} free of {}", t.swap_free, t.swap_total));
    Some(parts.join(" · "))
}

/// Render a status for a terminal.
pub fn status(s: &Status) -> String {
    // A rejected policy's error spans lines (the source line and a caret under it): each
    // escaped on its own, not its newlines.
    let policy_error = s.policy_error.as_deref().map(|e| {
        let lines: Vec<String> = e.lines().map(guest_text::escape).collect();
        lines.join("\n  ")
    });
    let s = &printable(s);
    let mut out = String::new();
    let dry = if s.dry_run { " · DRY RUN" } else { "" };
    let policy = s.decision.as_ref().map_or("-", |d| d.policy.as_str());
    let _ = writeln!(
        out,
        "memtide {} · policy {policy} · started {} · every {} s · {} ticks · last tick {:.1} ms{dry}",
        s.version, s.started, s.interval_s, s.counters.ticks, s.last_tick_ms
    );
    if let Some(e) = &s.host_error {
        let _ = writeln!(out, "HOST ERROR: {e}");
    }
    if let Some(e) = policy_error {
        let _ = writeln!(out, "POLICY RELOAD REJECTED: {e}");
    }
    if !s.restart_pending.is_empty() {
        let _ = writeln!(
            out,
            "configuration changed, not applied until memtide restarts: {}",
            s.restart_pending.join(", ")
        );
    }
    let Some(d) = &s.decision else {
        let _ = writeln!(out, "no decision yet");
        return out;
    };
    let h = &d.host;
    let _ = writeln!(
        out,
        "host ({}): {} total, {} freeable ({:.1}%, avg {:.1}%){}{}{}",
        scope(&h.scope),
        h.total,
        h.freeable,
        h.free_ratio * 100.0,
        h.free_ratio_avg * 100.0,
        h.need.map_or(String::new(), |n| format!(" · {n}")),
        h.psi_some_avg10
            .map_or(String::new(), |p| format!(" · memory PSI some {p:.2}%")),
        h.ksm.as_ref().map_or(String::new(), |k| format!(
            " · KSM run={} pages_to_scan={} sleep={} ms sharing={}",
            k.run, k.pages_to_scan, k.sleep_millisecs, k.pages_sharing
        )),
    );
    if let Some(r) = &h.ksm_reason {
        let _ = writeln!(out, "  ksm: {r}");
    }
    if let Some(line) = tiers(&s.tiers) {
        let _ = writeln!(out, "  tiers: {line}");
    }
    for h in &s.hibernated {
        let _ = writeln!(
            out,
            "  hibernated: {} ({}) since {}, snapshot {} (memtide snapshot restore {} wakes it)",
            h.vm, h.configured, h.since, h.id, h.vm
        );
    }
    for p in &s.placed {
        let _ = writeln!(
            out,
            "  placed: {} {} fast (budget {}), {} slow{}",
            p.vm,
            p.fast,
            p.fast_budget
                .map_or("none yet: first scan".into(), |b| b.to_string()),
            p.slow,
            p.cold_age.map_or(String::new(), |a| format!(", {a}"))
        );
    }
    let row = |cols: [&str; 11]| {
        let mut line = format!("{:<16} {:<11}", cols[0], cols[1]);
        for c in &cols[2..] {
            line.push_str(&format!(" {c:>9}"));
        }
        line.push('\n');
        line
    };
    out.push('\n');
    out.push_str(&row([
        "VM", "STATE", "SIZE", "ACTUAL", "TARGET", "ESTIMATE", "USED", "FREE", "AVAIL", "REFLT/s",
        "SWAPIN/s",
    ]));
    for vm in &d.vms {
        let swap_in = vm
            .swap_in_per_s
            .map_or_else(|| "-".into(), |r| Bytes::from_f64(r).to_string());
        out.push_str(&row([
            &vm.name,
            vm.state.name(),
            &size(vm.configured),
            &size(vm.actual),
            &size(vm.target),
            &size(vm.estimate),
            &size(vm.used),
            &size(vm.guest_free),
            &size(vm.guest_available),
            &rate(vm.refaults_per_s.or(vm.major_faults_per_s)),
            &swap_in,
        ]));
    }
    for vm in d.vms.iter().filter(|v| v.reason.is_some()) {
        let _ = writeln!(
            out,
            "  {}: {}",
            vm.name,
            vm.reason.as_ref().expect("filtered")
        );
    }
    // What the host swapped out of a VM is memory its guest will wait for, not memory
    // the balloon took: an operator tells the two apart here.
    for vm in &d.vms {
        if let Some(swapped) = vm.host_swapped.filter(|b| *b >= Bytes::from_mib(1)) {
            let _ = writeln!(
                out,
                "  {}: the host swapped out {swapped} of its memory (resident {})",
                vm.name,
                size(vm.rss)
            );
        }
    }
    // What a guest's zram swap holds and takes: swapping to it frees only what it saves.
    for vm in &d.vms {
        if let Some(z) = vm.guest_zram.filter(|z| z.stored >= Bytes::from_mib(1)) {
            let _ = writeln!(
                out,
                "  {}: zram stores {} in {} of its memory ({} free)",
                vm.name, z.stored, z.used, z.free
            );
        }
    }
    for p in s.sampling.iter().filter(|p| p.stale) {
        let age = p
            .age_s
            .map_or_else(|| "none yet".into(), |a| format!("{a:.0} s ago"));
        let _ = writeln!(
            out,
            "  {}: stale: no sample by the tick's deadline, left out of the decision (latest figures {age}, {} late in all)",
            p.name, p.late_samples
        );
    }
    let from: HashMap<&str, BoundsFrom> = s
        .sampling
        .iter()
        .filter_map(|p| Some((p.name.as_str(), p.bounds_from?)))
        .collect();
    let bounded: Vec<_> = d
        .vms
        .iter()
        .filter_map(|vm| Some((vm, from.get(vm.name.as_str())?)))
        .collect();
    if !bounded.is_empty() {
        let _ = writeln!(out, "\nbounds:");
        for (vm, from) in bounded {
            let _ = writeln!(
                out,
                "  {}: min {} ({}) · max {} ({})",
                vm.name,
                vm.min,
                from.min.name(),
                vm.max,
                from.max.name()
            );
        }
    }
    // A hibernated VM is shown as such above, not as one out of reach.
    let waiting: Vec<_> = s
        .waiting
        .iter()
        .filter(|w| !s.is_hibernated(&w.name))
        .collect();
    if !waiting.is_empty() {
        let _ = writeln!(out, "\nnot connected:");
        for w in waiting {
            let _ = writeln!(
                out,
                "  {} ({}): {} · {}",
                w.name,
                w.endpoint,
                w.error.as_deref().unwrap_or("connecting"),
                match w.retry_in_s {
                    r if r < 1.0 => "retrying now".to_string(),
                    r => format!("retry in {r:.0} s"),
                }
            );
        }
    }
    if !d.diagnostics.is_empty() {
        let _ = writeln!(out, "\nproblems:");
        for p in &d.diagnostics {
            let _ = writeln!(
                out,
                "  {}: {}: {}",
                p.vm.as_deref().unwrap_or("host"),
                p.kind.as_str(),
                p.message
            );
        }
    }
    if !s.recent_events.is_empty() {
        let _ = writeln!(out, "\nrecent events:");
        for e in s.recent_events.iter().rev().take(10) {
            let _ = writeln!(
                out,
                "  {} {:<18} {:<12} {}",
                e.ts,
                e.kind,
                e.vm.as_deref().unwrap_or("-"),
                e.message
            );
        }
    }
    out
}

/// The domain's scope in words.
fn scope(s: &DomainScope) -> String {
    match s {
        DomainScope::Host => "the whole host".into(),
        DomainScope::Cgroup { path, version } => format!("cgroup v{version} {path}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BoundFrom;
    use crate::daemon::fleet::Sampling;
    use crate::status::{Counters, Hibernated, Placed};
    use memtide_adapters::tiers::{Node, Zswap};
    use memtide_core::testkit::{host, mom_every_tick, snapshot, vm};
    use memtide_core::{BackendError, Engine, EngineConfig};

    #[test]
    fn shows_each_vm_its_reason_and_problems() {
        let mut web = vm("web", 1000, 800, 600);
        let sample = web.sample.as_mut().unwrap();
        sample.rss = Some(Bytes::from_mib(700));
        sample.swapped = Some(Bytes::from_mib(128));
        sample.agent = Some(Ok(memtide_core::stats::AgentStats {
            zram: Some(memtide_core::stats::ZramSwap {
                free: Bytes::from_mib(500),
                stored: Bytes::from_mib(300),
                used: Bytes::from_mib(100),
            }),
            ..Default::default()
        }));
        let mut down = vm("down", 1000, 800, 600);
        down.sample = Err(BackendError::Timeout(2000));
        let mut engine = Engine::new(EngineConfig::default(), mom_every_tick());
        let decision = engine.tick(&snapshot(0, host(4000, 400), vec![web, down]));
        let s = Status {
            version: "9.9".into(),
            started: "2026-01-01T00:00:00Z".into(),
            interval_s: 2.0,
            dry_run: true,
            last_tick_ms: 1.5,
            last_decision_unix_s: None,
            host_error: None,
            policy_error: None,
            restart_pending: Vec::new(),
            policies: Default::default(),
            decision: Some(decision),
            waiting: Vec::new(),
            sampling: vec![
                Sampling {
                    name: "down".into(),
                    connector: "qmp".into(),
                    stale: true,
                    age_s: Some(6.2),
                    late_samples: 3,
                    bounds_from: None,
                },
                Sampling {
                    name: "web".into(),
                    connector: "libvirt".into(),
                    stale: false,
                    age_s: Some(0.2),
                    late_samples: 0,
                    bounds_from: Some(BoundsFrom {
                        min: BoundFrom::Pod,
                        max: BoundFrom::Size,
                    }),
                },
            ],
            counters: Counters::default(),
            recent_events: Vec::new(),
            tiers: Tiers {
                nodes: vec![
                    Node {
                        id: 0,
                        cpus: true,
                        total: Bytes::from_gib(2),
                        free: Bytes::from_gib(1),
                        tier: Some(4),
                        ..Node::default()
                    },
                    Node {
                        id: 1,
                        total: Bytes::from_gib(4),
                        free: Bytes::from_gib(4),
                        tier: Some(22),
                        read_latency_ns: Some(240),
                        read_bandwidth_mbps: Some(20000),
                        ..Node::default()
                    },
                ],
                zswap: Some(Zswap {
                    enabled: true,
                    compressor: "zstd".into(),
                    max_pool_percent: Some(20),
                }),
                swap_total: Bytes::from_gib(1),
                swap_free: Bytes::from_gib(1),
            },
            hibernated: vec![Hibernated {
                vm: "ci-7".into(),
                id: "20261126T001500.000Z".into(),
                since: "2026-11-26T00:15:00.000Z".into(),
                configured: Bytes::from_gib(2),
            }],
            placed: vec![Placed {
                vm: "web".into(),
                fast: Bytes::from_mib(42),
                slow: Bytes::from_mib(86),
                fast_budget: Some(Bytes::from_mib(42)),
                cold_age: Some(crate::daemon::place::Age {
                    age_s: 120.0,
                    adaptive: true,
                }),
            }],
        };
        let text = status(&s);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines.contains(
                &"  hibernated: ci-7 (2.0 GiB) since 2026-11-26T00:15:00.000Z, snapshot \
                  20261126T001500.000Z (memtide snapshot restore ci-7 wakes it)"
            ),
            "{text}"
        );
        assert!(
            lines.contains(
                &"  placed: web 42 MiB fast (budget 42 MiB), 86 MiB slow, cold age 120 s, adaptive"
            ),
            "{text}"
        );
        assert_eq!(
            lines.iter().find(|l| l.starts_with("  tiers:")).copied().unwrap_or_default(),
            "  tiers: node 0 (CPUs, tier 4) 1.0 GiB free of 2.0 GiB · node 1 (memory only, tier 22, \
             240 ns, 20000 MB/s) 4.0 GiB free of 4.0 GiB · zswap on (zstd) · swap 1.0 GiB free of \
             1.0 GiB",
            "{text}"
        );
        assert!(
            lines[0].starts_with("memtide 9.9 · policy mom") && lines[0].ends_with("DRY RUN"),
            "{text}"
        );
        assert!(
            lines[1].starts_with("host (the whole host): 3.9 GiB total, 400 MiB freeable (10.0%"),
            "{text}"
        );
        let web = lines.iter().find(|l| l.starts_with("web ")).unwrap();
        let cols: Vec<&str> = web.split_whitespace().collect();
        assert_eq!(
            cols[..8],
            ["web", "managed", "1000", "MiB", "800", "MiB", "760", "MiB"],
            "{web}"
        );
        assert!(
            text.contains("  web: mom.shrink: host free 10.0% < 20.0%"),
            "{text}"
        );
        assert!(
            lines.contains(&"  web: the host swapped out 128 MiB of its memory (resident 700 MiB)"),
            "{text}"
        );
        assert!(
            !text.contains("down: the host swapped"),
            "nothing known swapped: {text}"
        );
        assert!(
            lines.contains(&"  web: zram stores 300 MiB in 100 MiB of its memory (500 MiB free)"),
            "{text}"
        );
        assert!(text.contains("down             unreachable"), "{text}");
        assert!(
            text.contains("\nbounds:\n  web: min 64 MiB (pod) · max 1000 MiB (size)\n\n"),
            "only the VM whose bounds are known: {text}"
        );
        assert!(
            text.contains("  down: stale: no sample by the tick's deadline, left out of the decision (latest figures 6 s ago, 3 late in all)\n"),
            "{text}"
        );
        assert!(
            text.contains("problems:\n  down: unreachable: not sampled: no answer within 2000 ms"),
            "{text}"
        );
    }

    #[test]
    fn control_characters_reach_no_terminal() {
        let name = "web\x1b]0;owned\x07";
        let mut engine = Engine::new(EngineConfig::default(), mom_every_tick());
        let mut down = vm(name, 1000, 800, 600);
        down.sample = Err(BackendError::Protocol("\x1b[2Jfake\nline".into()));
        let decision = engine.tick(&snapshot(0, host(4000, 400), vec![down]));
        let text = status(&Status {
            decision: Some(decision),
            ..Status::default()
        });
        assert!(!text.contains(['\x1b', '\x07']), "{text:?}");
        assert!(
            text.contains(
                "web\\u{1b}]0;owned\\u{7}: unreachable: not sampled: \\u{1b}[2Jfake\\nline\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_rejected_policy_keeps_its_lines_and_a_vm_about_to_be_tried_says_so() {
        let waiting = |name: &str, retry_in_s| crate::daemon::fleet::Waiting {
            name: name.into(),
            endpoint: format!("/q/{name}.sock"),
            error: None,
            left_alone: false,
            retry_in_s,
        };
        let mut engine = Engine::new(EngineConfig::default(), mom_every_tick());
        let decision = engine.tick(&snapshot(0, host(4000, 400), vec![]));
        let text = status(&Status {
            decision: Some(decision),
            policy_error: Some("p.policy:1:5: unclosed '('\n(defvar x\x1b\n    ^".into()),
            restart_pending: vec!["interval_s".into(), "[host]".into()],
            waiting: vec![waiting("a", 0.2), waiting("b", 4.4), waiting("idle", 2.0)],
            hibernated: vec![Hibernated {
                vm: "idle".into(),
                id: "1".into(),
                since: "2026-12-02T06:00:00Z".into(),
                configured: memtide_core::Bytes::from_mib(384),
            }],
            ..Status::default()
        });
        assert!(
            text.contains(
                "POLICY RELOAD REJECTED: p.policy:1:5: unclosed '('\n  (defvar x\\u{1b}\n      ^\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("a (/q/a.sock): connecting · retrying now\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "configuration changed, not applied until memtide restarts: interval_s, [host]\n"
            ),
            "{text}"
        );
        assert!(
            !text.contains("/q/idle.sock"),
            "hibernated, not out of reach: {text}"
        );
        assert!(
            text.contains("b (/q/b.sock): connecting · retry in 4 s\n"),
            "{text}"
        );
    }
}
