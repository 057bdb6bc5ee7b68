//! Tier placement in the daemon (`[tiering]`, `docs/tiering.md`): which nodes are the
//! fast and the slow tier, and one pass over the placed VMs — each one's pages scanned
//! and located ([`placement::Placer::measure`]), the fast tier divided among them all by
//! `tiering::place`, and each one's moves carried out.

use crate::config::TieringConfig;
use crate::placement::{self, Moved, Nodes, Placer};
use memtide_adapters::access::Mappings;
use memtide_adapters::tiers::Node;
use memtide_core::tiering::{self, FastTier, Placement, TierConfig};
use memtide_core::Bytes;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

/// The fast and the slow node: as configured, else the node with CPUs in the fastest
/// tier (the lowest id among equals) and the memory-only node in the slowest tier.
/// Refused when the host has fewer than two nodes with memory, a configured node is not
/// one of them, or no memory-only node can be the slow tier.
pub fn choose_nodes(nodes: &[Node], fast: Option<u32>, slow: Option<u32>) -> Result<Nodes, String> {
    let ids: Vec<u32> = nodes.iter().map(|n| n.id).collect();
    if nodes.len() < 2 {
        return Err(format!(
            "the host has {} NUMA node(s) with memory ({ids:?}): placement needs a fast and a \
             slow one",
            nodes.len()
        ));
    }
    let known = |which: &str, id: u32| {
        if ids.contains(&id) {
            Ok(id)
        } else {
            Err(format!(
                "[tiering] {which}_node {id} is not a node with memory ({ids:?})"
            ))
        }
    };
    // A node without a memory tier (a kernel before 6.1) ranks as the fastest.
    let rank = |n: &Node| n.tier.unwrap_or(0);
    let fast = match fast {
        Some(id) => known("fast", id)?,
        None => nodes
            .iter()
            .filter(|n| n.cpus || nodes.iter().all(|m| !m.cpus))
            .min_by_key(|n| (rank(n), n.id))
            .map(|n| n.id)
            .expect("two nodes"),
    };
    let slow = match slow {
        Some(id) => known("slow", id)?,
        None => nodes
            .iter()
            .filter(|n| !n.cpus && n.id != fast)
            .max_by_key(|n| (rank(n), std::cmp::Reverse(n.id)))
            .map(|n| n.id)
            .ok_or_else(|| {
                format!(
                    "no memory-only node to be the slow tier (nodes {ids:?} all have CPUs): \
                     set [tiering] slow_node"
                )
            })?,
    };
    if fast == slow {
        return Err(format!(
            "node {fast} cannot be both the fast and the slow tier: set [tiering] fast_node \
             and slow_node"
        ));
    }
    let id = |n: u32| i32::try_from(n).map_err(|_| format!("node {n} is out of range"));
    Ok(Nodes {
        fast: id(fast)?,
        slow: id(slow)?,
    })
}

/// A VM to place this pass.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    /// Its name.
    pub vm: String,
    /// Its hypervisor's process (or the process configured with `pid`).
    pub pid: i32,
    /// Its guest RAM among the process's mappings.
    pub mappings: Mappings,
    /// Its weight when the fast tier is short.
    pub shares: u32,
    /// Its configured fast budget (`[[vm]] fast_budget_mib`).
    pub budget: Option<Bytes>,
}

/// What a pass did for one VM.
#[derive(Debug, PartialEq)]
pub struct Outcome {
    /// The VM.
    pub vm: String,
    /// The decision, when its pages could be read.
    pub placement: Option<Placement>,
    /// What came of it.
    pub done: Done,
}

/// Where a VM's memory is, after a pass's moves.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Resident {
    /// On the fast node.
    pub fast: Bytes,
    /// On the slow node.
    pub slow: Bytes,
}

/// What came of a VM's placement.
#[derive(Debug, PartialEq)]
pub enum Done {
    /// The first scan: it only marks pages, nothing moves.
    First(Resident),
    /// A dry run: nothing moved.
    DryRun(Resident),
    /// Carried out: bytes moved down and up, pages the kernel did not move.
    Moved {
        /// Memory moved to the slow node.
        demoted: Bytes,
        /// Memory moved to the fast node.
        promoted: Bytes,
        /// Pages not moved.
        failed: u64,
        /// Where its memory is now.
        resident: Resident,
    },
    /// Its pages could not be read or moved.
    Failed(String),
}

impl Done {
    /// Where the VM's memory is, when its pages could be read.
    pub fn resident(&self) -> Option<Resident> {
        match self {
            Done::First(r) | Done::DryRun(r) | Done::Moved { resident: r, .. } => Some(*r),
            Done::Failed(_) => None,
        }
    }
}

/// How an outcome is logged and counted.
#[derive(Debug, PartialEq)]
pub struct Logged<'a> {
    /// The event's kind: `action`, `action_failed` or `place_failed`.
    pub kind: &'static str,
    /// The action's result (`memtide_actions_total{kind="place"}`): `ok`, `partly`,
    /// `error`, `dry_run`.
    pub result: &'static str,
    /// The placement's rule, when there was one.
    pub rule: Option<&'a str>,
    /// The event's text.
    pub message: String,
}

impl Outcome {
    /// How it is logged and counted; `None` when nothing moved (or would).
    pub fn event(&self) -> Option<Logged<'_>> {
        let p = self.placement.as_ref();
        let rule = p.map(|p| p.reason.rule.as_ref());
        let budget = |p: &Placement| format!("fast budget {} ({})", p.fast_budget, p.reason);
        let (kind, result, message) = match (&self.done, p) {
            (Done::First(_), _) => return None,
            (Done::DryRun(_), Some(p)) if p.demote.0 == 0 && p.promote.0 == 0 => return None,
            (Done::DryRun(_), Some(p)) => (
                "action",
                "dry_run",
                format!(
                    "would place: demote {}, promote {}, {} (dry run)",
                    p.demote,
                    p.promote,
                    budget(p)
                ),
            ),
            (
                Done::Moved {
                    demoted,
                    promoted,
                    failed,
                    ..
                },
                Some(p),
            ) => {
                if demoted.0 == 0 && promoted.0 == 0 && *failed == 0 {
                    return None;
                }
                let what = format!(
                    "place: demoted {demoted}, promoted {promoted}, {}",
                    budget(p)
                );
                match failed {
                    0 => ("action", "ok", what),
                    n => (
                        "action",
                        "partly",
                        format!("{what}; {n} pages the kernel did not move"),
                    ),
                }
            }
            (Done::Failed(why), Some(p)) => (
                "action_failed",
                "error",
                format!(
                    "place: demote {}, promote {} failed: {why}",
                    p.demote, p.promote
                ),
            ),
            (Done::Failed(why), None) => ("place_failed", "error", format!("not placed: {why}")),
            (_, None) => unreachable!("a placement is decided before anything moves"),
        };
        Some(Logged {
            kind,
            result,
            rule,
            message,
        })
    }
}

/// The placed VMs' trackers, and the settings.
pub struct TierPlacer {
    nodes: Nodes,
    config: TierConfig,
    reserve: Bytes,
    interval: Duration,
    proc: PathBuf,
    sys: PathBuf,
    placers: HashMap<String, Placer>,
}

impl TierPlacer {
    /// A placer between `nodes` with `config`'s settings (procfs at `proc`, sysfs at
    /// `sys`).
    pub fn new(nodes: Nodes, config: &TieringConfig, proc: PathBuf, sys: PathBuf) -> Self {
        TierPlacer {
            nodes,
            config: TierConfig {
                margin: config.margin_pct / 100.0,
                rate_mib_s: config.rate_mib_s,
            },
            reserve: Bytes::from_mib(config.reserve_mib),
            interval: Duration::from_secs_f64(config.interval_s),
            proc,
            sys,
            placers: HashMap::new(),
        }
    }

    /// One pass at `at` over `targets` (blocking: scans and moves). A VM not among them,
    /// or whose process changed or failed, loses its tracker (its next pass is a first
    /// scan again). In a dry run nothing moves.
    pub fn pass(&mut self, targets: &[Target], at: Duration, dry_run: bool) -> Vec<Outcome> {
        self.placers
            .retain(|vm, p| targets.iter().any(|t| &t.vm == vm && t.pid == p.pid()));
        let mut measured: Vec<_> = targets.iter().map(|t| self.measure(t, at)).collect();
        let free = placement::free_on(&self.sys, self.nodes.fast);
        let vms: Vec<_> = targets
            .iter()
            .zip(&measured)
            .filter_map(|(t, m)| Some(m.as_ref().ok()?.vm(&t.vm, t.shares, t.budget)))
            .collect();
        let mut placements = match &free {
            Ok(free) => {
                let tier = FastTier {
                    free: *free,
                    reserve: self.reserve,
                };
                let dt = self.interval.as_secs_f64();
                tiering::place(&vms, tier, self.config, dt).into_iter()
            }
            Err(_) => Vec::new().into_iter(),
        };
        let mut outcomes = Vec::with_capacity(targets.len());
        for (t, m) in targets.iter().zip(&mut measured) {
            let failed = |placement, why: String| Outcome {
                vm: t.vm.clone(),
                placement,
                done: Done::Failed(why),
            };
            let m = match (m, &free) {
                (Err(why), _) => {
                    outcomes.push(failed(None, why.clone()));
                    continue;
                }
                (Ok(_), Err(e)) => {
                    outcomes.push(failed(None, format!("{e:#}")));
                    continue;
                }
                (Ok(m), Ok(_)) => m,
            };
            let placement = placements.next().expect("a placement for each VM measured");
            let resident = |m: &placement::Measured| Resident {
                fast: m.on(self.nodes.fast),
                slow: m.on(self.nodes.slow),
            };
            let done = if m.first {
                Done::First(resident(m))
            } else if dry_run {
                Done::DryRun(resident(m))
            } else {
                let placer = self.placers.get(&t.vm).expect("measured by its placer");
                match placer.carry_out(m, &placement) {
                    Ok(Moved {
                        demoted,
                        promoted,
                        failed,
                    }) => Done::Moved {
                        demoted: Bytes(demoted * m.page_size()),
                        promoted: Bytes(promoted * m.page_size()),
                        failed,
                        resident: resident(m),
                    },
                    Err(e) => {
                        self.placers.remove(&t.vm);
                        Done::Failed(format!("{e:#}"))
                    }
                }
            };
            outcomes.push(Outcome {
                vm: t.vm.clone(),
                placement: Some(placement),
                done,
            });
        }
        outcomes
    }

    /// Scan `t`'s pages, opening its tracker at its first pass; a failure drops it.
    fn measure(&mut self, t: &Target, at: Duration) -> Result<placement::Measured, String> {
        let placer = match self.placers.entry(t.vm.clone()) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let opened = Placer::open(
                    &self.proc,
                    &self.sys,
                    t.pid,
                    t.mappings,
                    self.interval,
                    self.nodes,
                );
                e.insert(opened.map_err(|e| format!("{e:#}"))?)
            }
        };
        placer.measure(at).map_err(|e| {
            self.placers.remove(&t.vm);
            format!("{e:#}")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memtide_core::action::Reason;

    fn node(id: u32, cpus: bool, tier: Option<u32>) -> Node {
        Node {
            id,
            cpus,
            total: Bytes::from_gib(1),
            free: Bytes::from_gib(1),
            tier,
            read_latency_ns: None,
            read_bandwidth_mbps: None,
        }
    }

    #[test]
    fn the_fast_node_has_cpus_and_the_slow_one_is_memory_only_and_one_node_is_refused() {
        let nodes = |fast, slow| Nodes { fast, slow };
        let dram_cxl = [node(0, true, Some(4)), node(1, false, Some(22))];
        assert_eq!(choose_nodes(&dram_cxl, None, None), Ok(nodes(0, 1)));
        // Two sockets and a CXL expander in a slower tier, listed first.
        let host = [
            node(2, false, Some(22)),
            node(0, true, Some(4)),
            node(1, true, Some(4)),
            node(3, false, Some(4)),
        ];
        assert_eq!(choose_nodes(&host, None, None), Ok(nodes(0, 2)));
        assert_eq!(choose_nodes(&host, Some(1), Some(3)), Ok(nodes(1, 3)));
        // Linux 6.1 (every node in tier 4) and a kernel without tiers alike.
        let flat = [node(0, true, None), node(1, false, None)];
        assert_eq!(choose_nodes(&flat, None, None), Ok(nodes(0, 1)));
        let one = choose_nodes(&[node(0, true, Some(4))], None, None).unwrap_err();
        assert_eq!(
            one,
            "the host has 1 NUMA node(s) with memory ([0]): placement needs a fast and a slow one"
        );
        let sockets = [node(0, true, Some(4)), node(1, true, Some(4))];
        let e = choose_nodes(&sockets, None, None).unwrap_err();
        assert!(
            e.starts_with("no memory-only node to be the slow tier"),
            "{e}"
        );
        assert_eq!(choose_nodes(&sockets, None, Some(1)), Ok(nodes(0, 1)));
        let e = choose_nodes(&dram_cxl, Some(5), None).unwrap_err();
        assert_eq!(
            e,
            "[tiering] fast_node 5 is not a node with memory ([0, 1])"
        );
        let e = choose_nodes(&dram_cxl, Some(1), Some(1)).unwrap_err();
        assert!(e.starts_with("node 1 cannot be both"), "{e}");
    }

    fn placement(demote: u64, promote: u64) -> Placement {
        Placement {
            vm: "a".into(),
            fast_budget: Bytes::from_mib(42),
            demote: Bytes::from_mib(demote),
            promote: Bytes::from_mib(promote),
            reason: Reason::new("tier.configured", "operator budget 42 MiB fits"),
        }
    }

    fn outcome(placement: Option<Placement>, done: Done) -> Outcome {
        Outcome {
            vm: "a".into(),
            placement,
            done,
        }
    }

    #[test]
    fn moves_and_failures_are_logged_with_their_rule_and_a_pass_without_moves_is_not() {
        let resident = Resident {
            fast: Bytes::from_mib(42),
            slow: Bytes::from_mib(86),
        };
        let moved = |demoted: u64, promoted: u64, failed| Done::Moved {
            demoted: Bytes::from_mib(demoted),
            promoted: Bytes::from_mib(promoted),
            failed,
            resident,
        };
        assert_eq!(
            outcome(Some(placement(32, 0)), Done::First(resident)).event(),
            None
        );
        assert_eq!(outcome(Some(placement(0, 0)), moved(0, 0, 0)).event(), None);
        assert_eq!(
            outcome(Some(placement(0, 0)), Done::DryRun(resident)).event(),
            None
        );
        let done = outcome(Some(placement(16, 16)), moved(16, 16, 0));
        let e = done.event().unwrap();
        assert_eq!(
            (e.kind, e.result, e.rule),
            ("action", "ok", Some("tier.configured"))
        );
        assert_eq!(
            e.message,
            "place: demoted 16 MiB, promoted 16 MiB, fast budget 42 MiB (tier.configured: \
             operator budget 42 MiB fits)"
        );
        let partly = outcome(Some(placement(16, 0)), moved(15, 0, 256));
        let e = partly.event().unwrap();
        assert_eq!((e.kind, e.result), ("action", "partly"));
        assert!(
            e.message.ends_with("; 256 pages the kernel did not move"),
            "{}",
            e.message
        );
        let dry = outcome(Some(placement(8, 0)), Done::DryRun(resident));
        let e = dry.event().unwrap();
        assert_eq!((e.kind, e.result), ("action", "dry_run"));
        assert!(
            e.message
                .starts_with("would place: demote 8 MiB, promote 0 B"),
            "{}",
            e.message
        );
        let gone = outcome(None, Done::Failed("process 7 is gone".into()));
        let e = gone.event().unwrap();
        assert_eq!(
            (e.kind, e.result, e.rule, e.message.as_str()),
            (
                "place_failed",
                "error",
                None,
                "not placed: process 7 is gone"
            )
        );
        let refused = outcome(
            Some(placement(8, 0)),
            Done::Failed("move_pages: node 1 has no memory (ENODEV)".into()),
        );
        let e = refused.event().unwrap();
        assert_eq!((e.kind, e.result), ("action_failed", "error"));
        assert_eq!(
            e.message,
            "place: demote 8 MiB, promote 0 B failed: move_pages: node 1 has no memory (ENODEV)"
        );
    }

    #[test]
    fn a_pass_names_what_it_cannot_place_and_keeps_no_tracker_for_it() {
        let sys = tempfile::tempdir().unwrap();
        let config = TieringConfig::default();
        let nodes = Nodes { fast: 0, slow: 1 };
        let mut p = TierPlacer::new(nodes, &config, "/proc".into(), sys.path().into());
        let target = |vm: &str, pid| Target {
            vm: vm.into(),
            pid,
            mappings: Mappings::Private,
            shares: 1000,
            budget: None,
        };
        // A process that does not exist (pids stay below 2^22), and this one on a sysfs
        // without idle page tracking.
        let targets = [
            target("gone", 1 << 23),
            target("me", std::process::id() as i32),
        ];
        let outcomes = p.pass(&targets, Duration::from_secs(10), false);
        assert_eq!(outcomes.len(), 2);
        assert_eq!(
            outcomes[0].done,
            Done::Failed(format!("process {} is gone", 1 << 23))
        );
        assert!(
            matches!(&outcomes[1].done, Done::Failed(w) if w.contains("CONFIG_IDLE_PAGE_TRACKING")),
            "{:?}",
            outcomes[1].done
        );
        assert!(outcomes.iter().all(|o| o.placement.is_none()));
        assert!(p.placers.is_empty());
    }
}
