//! What a run produces: `summary.json`, time series for the plots, and comparisons of
//! several policies (`compare.json` and a text table).

use crate::resize::ResizeSummary;
use crate::svg;
use memtide_core::{Decision, DiagnosticKind};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io;
use std::path::Path;

/// The numbers of one run (`summary.json`). Swap and fault counts are in 4 KiB pages.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Scenario name.
    pub scenario: String,
    /// Policy name.
    pub policy: String,
    /// Number of VMs.
    pub vms: usize,
    /// Ticks run.
    pub ticks: u64,
    /// Simulated seconds per tick.
    pub tick_s: f64,
    /// The seed of the run.
    pub seed: u64,
    /// Sum over VMs of each VM's mean throughput (MiB/s), MOM's Memknobs score.
    pub total_throughput: f64,
    /// Pages the guests read back from their swap.
    pub guest_swap_ins: u64,
    /// Pages the guests wrote to their swap.
    pub guest_swap_outs: u64,
    /// Guest pages the host read back from its swap.
    pub host_swap_ins: u64,
    /// Guest pages the host wrote to its swap.
    pub host_swap_outs: u64,
    /// Processes (guest OOM) and VMs (host OOM) killed.
    pub oom_kills: u64,
    /// Times deflate-on-oom saved a guest from its OOM killer (each an OOM kill without
    /// it; 0 unless the scenario's host has `deflate_on_oom`).
    #[serde(default)]
    pub oom_deflations: u64,
    /// How fast memory was given back after pressure and taken back after it was freed.
    #[serde(default)]
    pub resize: ResizeSummary,
    /// Balloon targets set.
    pub balloon_actions: u64,
    /// KSM knob changes.
    pub ksm_actions: u64,
    /// Mean free host memory (MiB).
    pub host_free_mean_mib: f64,
    /// Lowest free host memory (MiB).
    pub host_free_min_mib: f64,
    /// Mean memory saved by KSM (MiB).
    pub ksm_saved_mean_mib: f64,
    /// Wall-clock time of the run (s): the only value that differs between equal runs.
    pub wall_s: f64,
    /// On a two-tier host: where the guests' memory was and what moved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tiers: Option<TierSummary>,
    /// Ticks in which the policy failed, in whole or for some VM (a script's error):
    /// what failed was not proposed.
    #[serde(default, skip_serializing_if = "PolicyErrors::is_none")]
    pub policy_errors: PolicyErrors,
    /// Per VM, in scenario order.
    pub per_vm: Vec<VmSummary>,
}

/// The ticks in which a policy failed, and the first failure: a script policy that
/// fails every tick proposes nothing, and would otherwise look like `none`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PolicyErrors {
    /// Ticks with at least one policy error.
    pub ticks: u64,
    /// The first error, as the engine reported it.
    pub first: Option<String>,
}

impl PolicyErrors {
    /// Count `decision`'s policy errors.
    pub fn observe(&mut self, decision: &Decision) {
        let mut errors = decision
            .diagnostics
            .iter()
            .filter(|d| d.kind == DiagnosticKind::PolicyError);
        if let Some(e) = errors.next() {
            self.ticks += 1;
            self.first.get_or_insert_with(|| match &e.vm {
                Some(vm) => format!("{vm}: {}", e.message),
                None => e.message.clone(),
            });
        }
    }

    /// No policy error in the run.
    pub fn is_none(&self) -> bool {
        self.ticks == 0
    }

    /// A line saying so, for `policy` over `of` ticks; `None` without errors.
    pub fn warning(&self, policy: &str, of: u64) -> Option<String> {
        let first = self.first.as_deref()?;
        Some(format!(
            "warning: policy {policy} failed in {} of {of} ticks (what failed was not \
             proposed); the first error: {first}",
            self.ticks
        ))
    }
}

/// What a two-tier host did over a run (`summary.json`'s `tiers`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TierSummary {
    /// How pages were placed (`memtide`, `first-touch`).
    pub placement: String,
    /// Fast memory the guests could use (MiB).
    pub fast_mib: f64,
    /// memtide's cold age (s): the least, where each VM's adapts.
    #[serde(default)]
    pub cold_age_s: f64,
    /// Whether each VM's cold age adapted to its promotions.
    #[serde(default)]
    pub adaptive_age: bool,
    /// The VMs' mean cold age over the run (s).
    #[serde(default)]
    pub mean_cold_age_s: f64,
    /// Guest memory on the slow tier, over guest memory in host RAM (time means).
    pub slow_share: f64,
    /// Share of the workloads' accesses that landed on the slow tier.
    pub slow_access_share: f64,
    /// Pages moved to the slow tier.
    pub demotions: u64,
    /// Pages moved to the fast tier.
    pub promotions: u64,
    /// Of them, pages memtide had demoted (judged cold) that still held the same data.
    #[serde(default)]
    pub cold_promotions: u64,
    /// The far-memory SLO's promotion rate: promotions of pages memtide had demoted
    /// (`cold_promotions`) per minute over the mean working set (%), over the whole run.
    pub promotions_ws_pct_min: f64,
    /// The same over the second half of the run, once first placements have settled.
    pub promotions_ws_pct_min_late: f64,
    /// Every promotion (`promotions`) per minute over the mean working set (%).
    #[serde(default)]
    pub all_promotions_ws_pct_min: f64,
    /// Pages entering a working set on the slow tier, other than demoted pages coming
    /// back (fresh allocations and reads into slow free frames, first touches there), per
    /// minute over the mean working set (%).
    #[serde(default)]
    pub fresh_on_slow_ws_pct_min: f64,
}

/// One VM's numbers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VmSummary {
    /// VM name.
    pub name: String,
    /// Mean work rate (MiB touched per second).
    pub throughput_mib_s: f64,
    /// Mean memory given (balloon actual) (MiB).
    pub given_mean_mib: f64,
    /// Largest memory given (MiB).
    pub given_max_mib: f64,
    /// Mean working set the workload wanted (MiB).
    pub working_set_mean_mib: f64,
    /// Mean host memory the VM occupied, after KSM savings (MiB).
    pub host_resident_mean_mib: f64,
    /// Pages read back from guest swap.
    pub guest_swap_ins: u64,
    /// Pages the host read back from host swap for this VM.
    pub host_swap_ins: u64,
    /// Processes the guest's OOM killer killed.
    pub guest_oom_kills: u64,
    /// Times the host killed (and restarted) the VM.
    pub host_oom_kills: u64,
    /// `guest_oom_kills + host_oom_kills`.
    pub oom_kills: u64,
    /// Times deflate-on-oom saved the guest from its OOM killer.
    #[serde(default)]
    pub oom_deflations: u64,
    /// Time the guest stayed above its balloon target (s).
    pub over_target_s: f64,
    /// Time part of the working set was out of guest memory (s).
    pub short_s: f64,
}

/// One VM over time.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VmSeries {
    /// VM name.
    pub name: String,
    /// Memory given (MiB).
    pub given_mib: Vec<f32>,
    /// Working set wanted (MiB).
    pub working_set_mib: Vec<f32>,
    /// Host memory occupied (MiB).
    pub resident_mib: Vec<f32>,
}

/// Values over time, sampled at most a few hundred times per run, for the plots.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Series {
    /// Simulated seconds per tick.
    pub tick_s: f64,
    /// Host memory (MiB).
    pub host_total_mib: f64,
    /// Host memory used by the host itself (MiB).
    pub host_reserved_mib: f64,
    /// Times of the points (s).
    pub t_s: Vec<f64>,
    /// Free host memory (MiB).
    pub host_free_mib: Vec<f32>,
    /// Host page cache (MiB).
    pub host_cache_mib: Vec<f32>,
    /// Guest memory in host swap (MiB).
    pub host_swap_mib: Vec<f32>,
    /// Memory KSM saves (MiB).
    pub ksm_saved_mib: Vec<f32>,
    /// Per VM.
    pub vms: Vec<VmSeries>,
}

/// The outcome of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// The numbers.
    pub summary: Summary,
    /// Time series for the plots.
    pub series: Series,
}

impl Report {
    /// `summary.json`'s text.
    pub fn summary_json(&self) -> String {
        serde_json::to_string_pretty(&self.summary).expect("summaries serialize")
    }

    /// Write `summary.json` and the plots (`allocation.svg`, `host_memory.svg`,
    /// `host_stack.svg`) into `dir`, creating it.
    pub fn write(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("summary.json"), self.summary_json() + "\n")?;
        let title = format!("{} under {}", self.summary.scenario, self.summary.policy);
        std::fs::write(
            dir.join("allocation.svg"),
            svg::allocation(&self.series, &title),
        )?;
        std::fs::write(
            dir.join("host_memory.svg"),
            svg::host_memory(&self.series, &title),
        )?;
        std::fs::write(
            dir.join("host_stack.svg"),
            svg::host_stack(&self.series, &title),
        )?;
        Ok(())
    }
}

/// Several policies run on one scenario with one seed.
#[derive(Clone, Debug, PartialEq)]
pub struct CompareReport {
    /// Each policy's label and run, in the order given.
    pub runs: Vec<(String, Report)>,
}

impl CompareReport {
    /// The host memory each run freed, as the time mean of its free host memory less
    /// that of the run labelled `none` (no management) in the same comparison (MiB);
    /// `None` without a `none` run. Memory the guests never touched is free in both, so
    /// what remains is what the policy took back (balloon, KSM) and kept from them.
    pub fn freed_mib(&self) -> Option<Vec<f64>> {
        let (_, none) = self.runs.iter().find(|(label, _)| label == "none")?;
        let base = none.summary.host_free_mean_mib;
        Some(
            self.runs
                .iter()
                .map(|(_, r)| r.summary.host_free_mean_mib - base)
                .collect(),
        )
    }

    /// `compare.json`: `{"policies": {"<label>": <summary>}}`, and with a `none` run
    /// `"freed_mean_mib": {"<label>": MiB}` (see [`CompareReport::freed_mib`]).
    pub fn json(&self) -> serde_json::Value {
        let policies: BTreeMap<&str, &Summary> = self
            .runs
            .iter()
            .map(|(label, r)| (label.as_str(), &r.summary))
            .collect();
        match self.freed_mib() {
            Some(freed) => {
                let freed: BTreeMap<&str, f64> = self
                    .runs
                    .iter()
                    .zip(freed)
                    .map(|((label, _), f)| (label.as_str(), f))
                    .collect();
                serde_json::json!({ "policies": policies, "freed_mean_mib": freed })
            }
            None => serde_json::json!({ "policies": policies }),
        }
    }

    /// A text table, one line per policy.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let width = self
            .runs
            .iter()
            .map(|(l, _)| l.len())
            .max()
            .unwrap_or(0)
            .max(6);
        let _ = writeln!(
            out,
            "{:<width$}  {:>12}  {:>14}  {:>14}  {:>9}  {:>13}  {:>13}  {:>11}  {:>9}",
            "policy",
            "throughput",
            "guest swap-in",
            "host swap-in",
            "OOM kills",
            "host free min",
            "host free avg",
            "freed avg",
            "balloons"
        );
        let _ = writeln!(
            out,
            "{:<width$}  {:>12}  {:>14}  {:>14}  {:>9}  {:>13}  {:>13}  {:>11}  {:>9}",
            "", "MiB/s", "pages", "pages", "(+deflate)", "MiB", "MiB", "MiB vs none", "actions"
        );
        let freed = self.freed_mib();
        for (i, (label, r)) in self.runs.iter().enumerate() {
            let s = &r.summary;
            let kills = match s.oom_deflations {
                0 => s.oom_kills.to_string(),
                d => format!("{} (+{d})", s.oom_kills),
            };
            let freed = freed
                .as_ref()
                .map_or("-".to_string(), |f| format!("{:.0}", f[i]));
            let _ = writeln!(
                out,
                "{label:<width$}  {:>12.1}  {:>14}  {:>14}  {:>9}  {:>13.0}  {:>13.0}  {:>11}  {:>9}",
                s.total_throughput,
                s.guest_swap_ins,
                s.host_swap_ins,
                kills,
                s.host_free_min_mib,
                s.host_free_mean_mib,
                freed,
                s.balloon_actions
            );
        }
        for (label, r) in &self.runs {
            let s = &r.summary;
            if let Some(w) = s.policy_errors.warning(label, s.ticks) {
                let _ = writeln!(out, "{w}");
            }
        }
        out
    }

    /// Write `compare.json`, `compare.txt`, and each run's report in a folder named
    /// after its label.
    pub fn write(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let json = serde_json::to_string_pretty(&self.json()).expect("summaries serialize");
        std::fs::write(dir.join("compare.json"), json + "\n")?;
        std::fs::write(dir.join("compare.txt"), self.table())?;
        for (label, report) in &self.runs {
            report.write(&dir.join(folder_name(label)))?;
        }
        Ok(())
    }
}

/// A label (a policy name or file path) as a folder name: the folder of its report
/// under `--out`.
pub fn folder_name(label: &str) -> String {
    let name: String = label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    match name.trim_matches('.') {
        "" => "policy".into(),
        n => n.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(policy: &str, host_free_mean_mib: f64) -> (String, Report) {
        let summary = Summary {
            scenario: "s".into(),
            policy: policy.into(),
            vms: 0,
            ticks: 1,
            tick_s: 1.0,
            seed: 1,
            total_throughput: 0.0,
            guest_swap_ins: 0,
            guest_swap_outs: 0,
            host_swap_ins: 0,
            host_swap_outs: 0,
            oom_kills: 0,
            oom_deflations: 0,
            resize: ResizeSummary::default(),
            balloon_actions: 0,
            ksm_actions: 0,
            host_free_mean_mib,
            host_free_min_mib: 0.0,
            ksm_saved_mean_mib: 0.0,
            wall_s: 0.0,
            tiers: None,
            policy_errors: PolicyErrors::default(),
            per_vm: Vec::new(),
        };
        let series = Series::default();
        (policy.into(), Report { summary, series })
    }

    #[test]
    fn freed_memory_is_host_free_memory_beyond_what_no_management_leaves() {
        // none leaves 1933 MiB free on average, mom 7388: mom freed 5455.
        let c = CompareReport {
            runs: vec![run("mom", 7388.0), run("none", 1933.0)],
        };
        assert_eq!(c.freed_mib(), Some(vec![5455.0, 0.0]));
        assert_eq!(c.json()["freed_mean_mib"]["mom"], 5455.0);
        let table = c.table();
        let mom = table.lines().find(|l| l.starts_with("mom")).unwrap();
        assert!(mom.contains(" 5455 "), "{table}");
        // Without a none run there is nothing to measure from.
        let c = CompareReport {
            runs: vec![run("mom", 7388.0)],
        };
        assert_eq!(c.freed_mib(), None);
        assert!(c.json().get("freed_mean_mib").is_none());
        assert!(c.table().lines().nth(2).unwrap().contains(" - "));
    }

    #[test]
    fn folder_names_are_safe() {
        assert_eq!(folder_name("mom"), "mom");
        assert_eq!(
            folder_name("policies/my policy.pol"),
            "policies_my_policy.pol"
        );
        assert_eq!(folder_name(".."), "policy");
    }
}
