//! `memtide status` as text: a header, the host, one line per VM, why, and what went wrong.

use crate::status::Status;
use memtide_core::decision::VmState;
use memtide_core::stats::DomainScope;
use memtide_core::Bytes;
use std::fmt::Write;

fn size(b: Option<Bytes>) -> String {
    b.map_or_else(|| "-".into(), |b| b.to_string())
}

fn rate(r: Option<f64>) -> String {
    r.map_or_else(|| "-".into(), |r| format!("{r:.0}"))
}

fn state(s: &VmState) -> &'static str {
    match s {
        VmState::Managed => "managed",
        VmState::Unmanaged => "unmanaged",
        VmState::Unreachable => "unreachable",
    }
}

/// Render a status for a terminal.
pub fn status(s: &Status) -> String {
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
    let Some(d) = &s.decision else {
        let _ = writeln!(out, "no decision yet");
        return out;
    };
    let h = &d.host;
    let _ = writeln!(
        out,
        "host ({}): {} total, {} freeable ({:.1}%, avg {:.1}%){}{}",
        scope(&h.scope),
        h.total,
        h.freeable,
        h.free_ratio * 100.0,
        h.free_ratio_avg * 100.0,
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
    let _ = writeln!(
        out,
        "\n{:<16} {:<11} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>9}",
        "VM", "STATE", "SIZE", "ACTUAL", "TARGET", "USED", "FREE", "AVAIL", "MAJFLT/s", "SWAPIN/s"
    );
    for vm in &d.vms {
        let _ = writeln!(
            out,
            "{:<16} {:<11} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>9}",
            vm.name,
            state(&vm.state),
            size(vm.configured),
            size(vm.actual),
            size(vm.target),
            size(vm.used),
            size(vm.guest_free),
            size(vm.guest_available),
            rate(vm.major_faults_per_s),
            vm.swap_in_per_s
                .map_or_else(|| "-".into(), |r| Bytes::from_f64(r).to_string()),
        );
    }
    for vm in d.vms.iter().filter(|v| v.reason.is_some()) {
        let _ = writeln!(
            out,
            "  {}: {}",
            vm.name,
            vm.reason.as_ref().expect("filtered")
        );
    }
    if !s.waiting.is_empty() {
        let _ = writeln!(out, "\nnot connected:");
        for w in &s.waiting {
            let _ = writeln!(
                out,
                "  {} ({}): {} · retry in {:.0} s",
                w.name,
                w.socket,
                w.error.as_deref().unwrap_or("connecting"),
                w.retry_in_s
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
