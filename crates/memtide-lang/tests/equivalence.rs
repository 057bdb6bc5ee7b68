//! The shipped policies in the language (`policies/*.policy`) decide exactly as memtide's
//! built-in Rust versions (`memtide_core::policy::mom`) on the same inputs.

use memtide_core::action::KsmSettings;
use memtide_core::history::History;
use memtide_core::policy::mom::{Mom, MomConfig, Paced};
use memtide_core::policy::{Policy, PolicyInput, PolicyOutput, VmInput};
use memtide_core::signals::Signals;
use memtide_core::stats::HostStats;
use memtide_core::testkit;
use memtide_core::{Bytes, VmLimits, VmSample};
use memtide_lang::{Limits, ScriptPolicy, Source};
use proptest::prelude::*;
use std::time::Duration;

fn shipped() -> ScriptPolicy {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/policies");
    let sources: Vec<Source> = ["balloon.policy", "ksm.policy"]
        .iter()
        .map(|f| Source::new(*f, std::fs::read_to_string(format!("{dir}/{f}")).unwrap()))
        .collect();
    ScriptPolicy::parse(&sources, Limits::default()).unwrap()
}

/// One VM: its maximum, and its history of (actual, free) in MiB.
type VmCase = (u64, Vec<(u64, u64)>);

fn vm_case() -> impl Strategy<Value = VmCase> {
    (256u64..8192).prop_flat_map(|max| {
        let sample = (64u64..=max).prop_flat_map(|actual| (Just(actual), 0..=actual));
        (Just(max), proptest::collection::vec(sample, 1..5))
    })
}

/// Host cases: total MiB, the history of freeable MiB, and the kernel's pages_to_scan.
fn host_case() -> impl Strategy<Value = (u64, Vec<u64>, u64)> {
    (1024u64..65536).prop_flat_map(|total| {
        (
            Just(total),
            proptest::collection::vec(0..=total, 1..5),
            0u64..2000,
        )
    })
}

fn decide(policy: &mut dyn Policy, host: &(u64, Vec<u64>, u64), vms: &[VmCase]) -> PolicyOutput {
    let (total, freeable, pages) = host;
    let mut host_history: History<HostStats> = History::new(10);
    for (i, f) in freeable.iter().enumerate() {
        let mut h = testkit::host(*total, *f);
        h.ksm.as_mut().unwrap().pages_to_scan = *pages;
        host_history.push(Duration::from_secs(i as u64), h);
    }
    let mut histories = Vec::new();
    let mut limits = Vec::new();
    for (i, (max, samples)) in vms.iter().enumerate() {
        let mut h: History<VmSample> = History::new(10);
        for (t, (actual, free)) in samples.iter().enumerate() {
            let snap = testkit::vm(&format!("vm{i}"), *max, *actual, *free);
            h.push(Duration::from_secs(t as u64), snap.sample.unwrap());
        }
        histories.push(h);
        limits.push(VmLimits {
            min: Bytes::ZERO,
            max: Bytes::from_mib(*max),
            shares: 1000,
        });
    }
    let names: Vec<String> = (0..vms.len()).map(|i| format!("vm{i}")).collect();
    let signals = Signals::default();
    let inputs: Vec<VmInput<'_>> = (0..vms.len())
        .map(|i| VmInput {
            name: &names[i],
            limits: &limits[i],
            history: &histories[i],
            actual: histories[i].latest().unwrap().balloon.unwrap(),
            target: None,
            signals: &signals,
        })
        .collect();
    policy.decide(&PolicyInput {
        at: Duration::ZERO,
        host: &host_history,
        vms: &inputs,
        unreachable: &[],
    })
}

/// Each VM's proposed target in KiB, by name.
fn targets(o: &PolicyOutput) -> Vec<(String, u64)> {
    let mut v: Vec<_> = o
        .balloon
        .iter()
        .map(|(vm, p)| (vm.clone(), p.target.kib()))
        .collect();
    v.sort();
    v
}

/// The KSM settings proposed, if any.
fn ksm(o: &PolicyOutput) -> Option<KsmSettings> {
    o.ksm.as_ref().map(|k| k.settings.clone())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn shipped_policies_match_the_builtin_ones(host in host_case(), vms in proptest::collection::vec(vm_case(), 1..6)) {
        // One evaluation each, on the same inputs (MOM's first comes an interval after
        // it starts: the built-in evaluates at every call here).
        let rust = decide(testkit::mom_every_tick().as_mut(), &host, &vms);
        let script = decide(&mut shipped(), &host, &vms);
        prop_assert!(script.faults.is_empty(), "{:?}", script.faults);
        prop_assert!(rust.faults.is_empty(), "{:?}", rust.faults);
        let (r, s) = (targets(&rust), targets(&script));
        prop_assert_eq!(r.len(), s.len(), "rust {:?} script {:?}", r, s);
        for ((rv, rk), (sv, sk)) in r.iter().zip(&s) {
            prop_assert_eq!(rv, sv);
            // Both truncate the same KiB arithmetic; float rounding may differ by one.
            prop_assert!(rk.abs_diff(*sk) <= 1, "{}: rust {} KiB, script {} KiB", rv, rk, sk);
        }
        prop_assert_eq!(ksm(&rust), ksm(&script));
    }
}

/// Two minutes of ticks, one a second, on a 4096 MiB host whose freeable memory falls
/// from 1500 to 300 MiB at 30 s and comes back at 80 s, with two 2048 MiB guests (about
/// 1200 and 300 MiB free) whose balloons follow what `policy` proposes: each tick's
/// output.
fn two_minutes(policy: &mut dyn Policy) -> Vec<PolicyOutput> {
    let names = ["web", "db"];
    let limits = VmLimits {
        min: Bytes::ZERO,
        max: Bytes::from_mib(2048),
        shares: 1,
    };
    let signals = Signals::default();
    let mut host = History::new(10);
    let mut histories = [History::new(10), History::new(10)];
    let mut actual = [Bytes::from_mib(2048), Bytes::from_mib(1024)];
    let mut outputs = Vec::new();
    for t in 0..120u64 {
        let at = Duration::from_secs(t);
        let freeable = if (30..80).contains(&t) { 300 } else { 1500 };
        host.push(at, testkit::host(4096, freeable));
        for (i, name) in names.iter().enumerate() {
            let free = [1200, 300][i] + 10 * (t % 7);
            let snap = testkit::vm(name, 2048, actual[i].mib(), free);
            histories[i].push(at, snap.sample.unwrap());
        }
        let inputs: Vec<VmInput<'_>> = (0..2)
            .map(|i| VmInput {
                name: names[i],
                limits: &limits,
                history: &histories[i],
                actual: actual[i],
                target: None,
                signals: &signals,
            })
            .collect();
        let out = policy.decide(&PolicyInput {
            at,
            host: &host,
            vms: &inputs,
            unreachable: &[],
        });
        for (i, name) in names.iter().enumerate() {
            // Whole MiB, as the guests' samples report it.
            if let Some(p) = out.balloon.get(*name) {
                actual[i] = Bytes::from_mib(p.target.mib());
            }
        }
        outputs.push(out);
    }
    outputs
}

#[test]
fn shipped_policies_at_moms_pace_decide_as_the_builtin_mom() {
    // As the daemon loads policy files: at MOM's pace, evaluated every 10 s on samples
    // of their own every 5 s, averaged over the last 10.
    let mut script = Paced::new(shipped(), &MomConfig::default());
    let script = two_minutes(&mut script);
    let rust = two_minutes(&mut Mom::default());
    let mut evaluations = Vec::new();
    for (t, (r, s)) in rust.iter().zip(&script).enumerate() {
        assert!(r.faults.is_empty() && s.faults.is_empty(), "at {t} s");
        let (rt, st) = (targets(r), targets(s));
        assert_eq!(rt.len(), st.len(), "at {t} s: rust {rt:?} script {st:?}");
        for ((rv, rk), (sv, sk)) in rt.iter().zip(&st) {
            assert_eq!(rv, sv, "at {t} s");
            assert!(rk.abs_diff(*sk) <= 1, "at {t} s, {rv}: {rk} and {sk} KiB");
        }
        assert_eq!(ksm(r), ksm(s), "at {t} s");
        let waits = |o: &PolicyOutput, rule: &str| {
            o.holds.len() == 2 && o.holds.values().all(|h| h.rule == rule)
        };
        assert_eq!(waits(s, "script.wait"), waits(r, "mom.wait"), "at {t} s");
        if !waits(s, "script.wait") {
            assert!(
                s.ksm.is_some(),
                "at {t} s: ksm.policy proposes at every evaluation"
            );
            evaluations.push(t);
        }
    }
    // Evaluated an interval after the start, then every interval.
    let every_10_s: Vec<usize> = (1..12).map(|i| i * 10).collect();
    assert_eq!(evaluations, every_10_s);
    // The 50 s average falls below MOM's 20% threshold at 60 s and rises above it at
    // 100 s: "web" shrinks by 5% steps, then grows by them.
    let web: Vec<(usize, u64)> = (0..120)
        .filter_map(|t| Some((t, script[t].balloon.get("web")?.target.mib())))
        .collect();
    assert_eq!(
        web,
        [
            (60, 1945),
            (70, 1847),
            (80, 1754),
            (90, 1666),
            (100, 1749),
            (110, 1836)
        ]
    );
}

#[test]
fn a_failing_script_proposes_nothing_and_names_the_place() {
    let bad = Source::new("bad.policy", "(defvar x 1)\n(/ x 0)\n");
    let mut policy = ScriptPolicy::parse(&[bad], Limits::default()).unwrap();
    let out = decide(
        &mut policy,
        &(4096, vec![100], 100),
        &[(1024, vec![(1024, 100)])],
    );
    assert!(out.balloon.is_empty() && out.ksm.is_none());
    assert_eq!(out.faults.len(), 1);
    assert_eq!(out.faults[0].vm, None);
    assert!(
        out.faults[0].message.starts_with("bad.policy:2:1: "),
        "{}",
        out.faults[0].message
    );
}

#[test]
fn guests_without_statistics_are_not_shown_and_say_why() {
    let mut policy = shipped();
    let mut host = History::new(10);
    host.push(Duration::ZERO, testkit::host(4096, 100));
    let mut sample = testkit::vm("quiet", 1024, 1024, 0).sample.unwrap();
    sample.stats.free = None;
    let mut history = History::new(10);
    history.push(Duration::ZERO, sample);
    let limits = VmLimits {
        min: Bytes::ZERO,
        max: Bytes::from_mib(1024),
        shares: 1,
    };
    let signals = Signals::default();
    let vms = [VmInput {
        name: "quiet",
        limits: &limits,
        history: &history,
        actual: Bytes::from_mib(1024),
        target: None,
        signals: &signals,
    }];
    let out = policy.decide(&PolicyInput {
        at: Duration::ZERO,
        host: &host,
        vms: &vms,
        unreachable: &[],
    });
    assert_eq!(out.faults.len(), 1);
    assert_eq!(out.faults[0].vm.as_deref(), Some("quiet"));
    assert!(out.faults[0].message.contains("no balloon statistics"));
    assert!(out.ksm.is_some(), "the host part of the policy still runs");
}

/// What `decide` logs at debug level, one event a line, without colours.
fn logged(policy: &mut ScriptPolicy) -> String {
    use std::sync::{Arc, Mutex};
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        decide(
            policy,
            &(4096, vec![100], 100),
            &[(1024, vec![(1024, 100)])],
        );
    });
    let bytes = buffer.0.lock().unwrap().clone();
    String::from_utf8(bytes).unwrap()
}

#[test]
fn debug_lines_are_logged_naming_the_policy_and_the_place() {
    let text = "(debug \"free\" Host.mem_free)\n(debug \"then\" (/ 1 0))\n";
    let mut policy =
        ScriptPolicy::parse(&[Source::new("dbg.policy", text)], Limits::default()).unwrap();
    let log = logged(&mut policy);
    assert!(
        log.contains("DEBUG memtide::policy: dbg.policy:1: free ")
            && log.contains("policy=dbg.policy"),
        "{log}"
    );
    // The evaluation failed on line 2: what it recorded before is logged all the same.
    let mut policy = ScriptPolicy::parse(
        &[Source::new("dbg.policy", "(debug \"before\")\n(/ 1 0)\n")],
        Limits::default(),
    )
    .unwrap();
    let log = logged(&mut policy);
    assert!(log.contains("dbg.policy:1: before"), "{log}");
}

fn decide_text(text: &str) -> PolicyOutput {
    let source = Source::new("c.policy", text);
    let mut policy = ScriptPolicy::parse(&[source], Limits::default()).unwrap();
    decide(
        &mut policy,
        &(4096, vec![100], 100),
        &[(1024, vec![(1024, 100)])],
    )
}

#[test]
fn ksm_values_the_kernel_refuses_drop_the_whole_ksm_proposal() {
    for (control, value, range) in [
        ("ksm_run", "7", "0, 1 or 2"),
        ("ksm_merge_across_nodes", "2", "0 or 1"),
        ("ksm_pages_to_scan", "99999999999", "at most 4294967295"),
        ("ksm_sleep_millisecs", "4294967296", "at most 4294967295"),
    ] {
        let text = format!(
            "(Host.Control \"ksm_pages_to_scan\" 100)\n(Host.Control \"{control}\" {value})"
        );
        let out = decide_text(&text);
        assert!(out.ksm.is_none(), "{text}: nothing half-applied");
        assert_eq!(out.faults.len(), 1, "{text}");
        assert_eq!(
            out.faults[0].message,
            format!(
                "{control}: {value} is out of range ({range}); the whole KSM proposal is \
                 dropped (KSM keeps its settings)"
            )
        );
    }
    // The largest values the kernel takes pass.
    let out = decide_text(
        "(Host.Control \"ksm_run\" 2) (Host.Control \"ksm_sleep_millisecs\" 4294967295)",
    );
    assert!(out.faults.is_empty(), "{:?}", out.faults);
    let settings = out.ksm.unwrap().settings;
    assert_eq!(
        (settings.run, settings.sleep_millisecs),
        (Some(2), Some(4294967295))
    );
}

#[test]
fn a_negative_or_nan_balloon_target_is_a_fault_of_that_vm() {
    for (value, message) in [
        ("-1024", "balloon_target: -1024 is negative"),
        (
            "(- (* 1e308 10) (* 1e308 10))",
            "balloon_target: NaN is not a finite number",
        ),
    ] {
        let out = decide_text(&format!(
            "(with Guests g (g.Control \"balloon_target\" {value}))"
        ));
        assert!(out.balloon.is_empty());
        assert_eq!(out.faults.len(), 1);
        assert_eq!(out.faults[0].vm.as_deref(), Some("vm0"));
        assert_eq!(out.faults[0].message, message);
    }
}
