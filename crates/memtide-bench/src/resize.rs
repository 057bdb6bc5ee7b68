//! Resize latencies on real guests, from a results file's per-tick series: after a
//! guest's pressure signal (swap-ins or refaults above 1 MiB/s while below its full size),
//! how long until the policy raised its balloon target and until the signal stopped;
//! after it freed memory (Committed_AS down by 5% of its size), how long until the
//! balloon brought it within 10% of its size of its commitment. The same episodes as the
//! simulator's (`memtide_sim::resize`), measured from what the daemon saw.

use memtide_sim::resize::{ResizeSummary, ResizeTracker, Tick};
use serde_json::Value;
use std::collections::BTreeMap;

/// Pressure above this many MiB/s of pages swapped or refaulted in counts as a signal
/// (a page or two now and then is noise on these guests, see the estimator's
/// `fault_noise`).
const SIGNAL_MIB_S: f64 = 1.0;
const PAGE_MIB: f64 = 4096.0 / (1 << 20) as f64;

/// KiB of a MiB figure, for the tracker's integer sizes.
fn kib(mib: f64) -> u64 {
    (mib * 1024.0).round() as u64
}

/// How the guests of a results document are resized: `virtio-mem` where every guest has
/// a virtio-mem device (the balloon then moves only what is below a block), else
/// `balloon`.
pub fn mechanism(doc: &Value) -> &'static str {
    let guests = doc["guests"].as_array().map_or(&[][..], Vec::as_slice);
    let vmem = |g: &Value| g["virtio_mem_mib"].as_u64().is_some_and(|m| m > 0);
    if !guests.is_empty() && guests.iter().all(vmem) {
        "virtio-mem"
    } else {
        "balloon"
    }
}

/// Each policy's resize latencies over every guest of a results document.
pub fn latencies(doc: &Value) -> BTreeMap<String, ResizeSummary> {
    let tick_s = doc["settings"]["interval_s"].as_f64().unwrap_or(1.0);
    let sizes: BTreeMap<&str, f64> = doc["guests"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|g| Some((g["name"].as_str()?, g["memory_mib"].as_f64()?)))
        .collect();
    let mut out = BTreeMap::new();
    for (policy, run) in doc["policies"].as_object().into_iter().flatten() {
        let mut trackers = Vec::new();
        for (vm, s) in run["series"]["vms"].as_object().into_iter().flatten() {
            let Some(&configured) = sizes.get(vm.as_str()) else {
                continue;
            };
            let at = |key: &str, i: usize| s[key].get(i).and_then(Value::as_f64);
            let ticks = s["actual_mib"].as_array().map_or(0, Vec::len);
            let mut tracker = ResizeTracker::default();
            for i in 0..ticks {
                let (Some(actual), Some(committed)) = (at("actual_mib", i), at("committed_mib", i))
                else {
                    continue;
                };
                let faults =
                    at("swap_in_per_s", i).unwrap_or(0.0) + at("refaults_per_s", i).unwrap_or(0.0);
                tracker.observe(
                    Tick {
                        tick: i as u64,
                        short: faults * PAGE_MIB > SIGNAL_MIB_S,
                        target: at("target_mib", i).map(kib),
                        actual: kib(actual),
                        configured: kib(configured),
                        working_set: kib(committed),
                    },
                    tick_s,
                );
            }
            trackers.push(tracker);
        }
        out.insert(policy.clone(), ResizeTracker::summary(trackers.iter()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_guest_swapping_and_given_memory_the_next_tick() {
        // 384 MiB guest at 200 MiB: swapping 512 pages/s (2 MiB/s) at ticks 1-3, its
        // target raised at tick 2, the signal gone at tick 4.
        let doc = json!({
            "settings": {"interval_s": 1.0},
            "guests": [{"name": "a", "memory_mib": 384}],
            "policies": {"memtide": {"series": {"vms": {"a": {
                "actual_mib":    [200, 200, 200, 260, 260],
                "target_mib":    [200, 200, 260, 260, 260],
                "committed_mib": [250, 250, 250, 250, 250],
                "swap_in_per_s": [0, 512, 512, 512, 0],
                "refaults_per_s": [0, 0, 0, 0, 0]
            }}}}}
        });
        let s = &latencies(&doc)["memtide"];
        assert_eq!(s.give_reaction_s.count, 1);
        assert_eq!((s.give_reaction_s.max, s.shortage_s.max), (1.0, 3.0));
        assert_eq!(mechanism(&doc), "balloon", "results before virtio_mem_mib");
    }

    #[test]
    fn the_mechanism_is_virtio_mem_only_where_every_guest_has_it() {
        let doc = |sizes: &[u64]| {
            let guests: Vec<Value> = sizes.iter().map(|m| json!({"virtio_mem_mib": m})).collect();
            json!({ "guests": guests })
        };
        assert_eq!(mechanism(&doc(&[256, 256])), "virtio-mem");
        assert_eq!(mechanism(&doc(&[256, 0])), "balloon");
        assert_eq!(mechanism(&doc(&[])), "balloon");
    }
}
