//! Proxmox VE's auto-ballooning, as its documentation and pvestatd describe it (PVE's
//! `AutoBalloon.pm`, `compute_alg1`): every 10 s, steer the host toward 80% of its memory
//! used, unless it is within 10 MiB of that; move each VM by at most 100 MiB per cycle,
//! between its `balloon:` minimum and its `memory:` size, toward its part of the memory
//! above the minimums in proportion to its `shares:`. Memory to give goes first to the
//! VMs whose free memory is at or below 25% of their minimum (or below it), and memory
//! to take first from the others; only where that moves nothing are all VMs asked. No
//! working-set estimate, no pressure signal. PVE enables KSM by default, tuned by
//! ksmtuned apart from pvestatd: it runs here beside it. It is what most KVM operators
//! run today: a baseline.

use super::ksmtuned::{KsmConfig, Ksmtuned};
use super::{Policy, PolicyInput, PolicyOutput, Proposal, VmInput};
use crate::action::Reason;
use crate::units::{Bytes, Percent};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The constants (Proxmox VE's by default).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProxmoxConfig {
    /// Share of the domain's memory the host is steered to use.
    pub goal_used: f64,
    /// The most a VM moves per cycle, in MiB.
    pub max_change_mib: u64,
    /// Seconds between cycles (pvestatd's update loop).
    pub cycle_s: f64,
    /// Free memory, as a share of the VM's minimum, at or below which a VM is served
    /// first when memory is given (and taken from last).
    pub starving: f64,
    /// A goal nearer than this, in MiB, moves nothing.
    pub dead_band_mib: u64,
}

impl Default for ProxmoxConfig {
    fn default() -> Self {
        ProxmoxConfig {
            goal_used: 0.80,
            max_change_mib: 100,
            cycle_s: 10.0,
            starving: 0.25,
            dead_band_mib: 10,
        }
    }
}

/// The Proxmox policy.
pub struct Proxmox {
    config: ProxmoxConfig,
    ksm: Ksmtuned,
    next_cycle: Option<Duration>,
}

impl Proxmox {
    /// The policy with its constants and ksmtuned's.
    pub fn new(config: ProxmoxConfig, ksm: KsmConfig) -> Proxmox {
        Proxmox {
            config,
            ksm: Ksmtuned::new(ksm),
            next_cycle: None,
        }
    }

    /// Whether the VM is short of memory as PVE tells it: its free memory unknown, or at
    /// or below `starving` of its minimum, or the VM below its minimum.
    fn starving(&self, vm: &VmInput<'_>) -> bool {
        let free = vm.signals.used.map(|used| vm.actual - used);
        vm.actual < vm.limits.min
            || free.is_none_or(|free| free <= vm.limits.min.scale(self.config.starving))
    }
}

/// One VM as a cycle sees it (bytes).
struct Ballooned {
    size: i64,
    min: i64,
    max: i64,
    shares: i64,
}

/// Move `amount` bytes (given when positive, taken when negative) among the VMs `ids`,
/// as PVE does: each toward its minimum plus its part, by shares, of what the VMs hold
/// above their minimums plus the amount, within its bounds and at most `cap` from its
/// size this cycle; rounds repeat, without the VMs that reached their part, while some
/// VM hit a bound and the last round moved something (in whole bytes, as PVE counts:
/// with fractions, rounds could go on moving a VM by nothing; and at most one round more
/// than there are VMs). `moved` holds each VM's new size once it has one. Returns what is
/// left to move.
fn change(
    vms: &[Ballooned],
    ids: &[usize],
    amount: i64,
    cap: i64,
    moved: &mut [Option<i64>],
) -> i64 {
    let mut rest = amount;
    let mut done = vec![false; vms.len()];
    for _ in 0..=ids.len() {
        let open: Vec<usize> = ids.iter().copied().filter(|&i| !done[i]).collect();
        let shares: i64 = open.iter().map(|&i| vms[i].shares).sum();
        if rest == 0 || shares == 0 {
            break;
        }
        let held: i64 = open
            .iter()
            .map(|&i| moved[i].unwrap_or(vms[i].size) - vms[i].min)
            .sum();
        let pool = i128::from(held + rest);
        let (mut repeat, mut changes) = (false, 0);
        for &i in &open {
            let vm = &vms[i];
            let part = pool * i128::from(vm.shares) / i128::from(shares);
            let mut desired = vm
                .min
                .saturating_add(i64::try_from(part).unwrap_or(i64::MAX));
            if desired > vm.max {
                (desired, repeat) = (vm.max, true);
            } else if desired < vm.min {
                (desired, repeat) = (vm.min, true);
            }
            let size = if amount > 0 && desired > vm.size {
                (vm.size + cap).min(desired)
            } else if desired < vm.size {
                (vm.size - cap).max(desired)
            } else {
                done[i] = true;
                continue;
            };
            if size != vm.size {
                let before = moved[i].replace(size).unwrap_or(vm.size);
                changes += size - before;
            }
        }
        rest -= changes;
        if !repeat || changes == 0 {
            break;
        }
    }
    rest
}

impl Policy for Proxmox {
    fn name(&self) -> &str {
        "proxmox"
    }

    fn decide(&mut self, input: &PolicyInput<'_>) -> PolicyOutput {
        let mut out = PolicyOutput::with_capacity(input.vms.len());
        out.ksm = self.ksm.decide(input);
        if self.next_cycle.is_some_and(|next| input.at < next) {
            let wait = Reason::new("proxmox.wait", "between pvestatd cycles (every 10 s)");
            out.hold_all(input.vms, wait);
            return out;
        }
        let c = &self.config;
        self.next_cycle =
            Some(input.at + Duration::try_from_secs_f64(c.cycle_s).unwrap_or_default());
        let domain = &input.host_latest().domain;
        let used = domain.total - domain.freeable;
        let bytes = |b: Bytes| i64::try_from(b.0).unwrap_or(i64::MAX);
        let goal = (domain.total.as_f64() * c.goal_used - used.as_f64()) as i64;
        let cap = bytes(Bytes::from_mib(c.max_change_mib));
        let band = bytes(Bytes::from_mib(c.dead_band_mib));
        let vms: Vec<Ballooned> = input
            .vms
            .iter()
            .map(|vm| Ballooned {
                size: bytes(vm.actual),
                min: bytes(vm.limits.min),
                max: bytes(vm.limits.max),
                shares: i64::from(vm.limits.shares),
            })
            .collect();
        // PVE leaves a VM of no shares alone.
        let all: Vec<usize> = (0..vms.len()).filter(|&i| vms[i].shares > 0).collect();
        let (starving, enough): (Vec<usize>, Vec<usize>) =
            all.iter().partition(|&&i| self.starving(&input.vms[i]));
        let mut moved = vec![None; vms.len()];
        let (rule, why) = if goal > band {
            // Give: the starving first; everyone only where they took nothing.
            let rest = change(&vms, &starving, goal, cap, &mut moved);
            if rest >= goal {
                change(&vms, &all, rest, cap, &mut moved);
            }
            ("proxmox.grow", "below the goal: give")
        } else if goal < -band {
            // Take: from those with enough free memory first; everyone only where they
            // gave nothing.
            let rest = change(&vms, &enough, goal, cap, &mut moved);
            if rest <= goal {
                change(&vms, &all, rest, cap, &mut moved);
            }
            ("proxmox.shrink", "above the goal: take")
        } else {
            ("proxmox.hold", "within the dead band of the goal: nothing")
        };
        for (vm, m) in input.vms.iter().zip(moved) {
            let target = m.map_or(vm.actual, |m| Bytes(m.max(0) as u64));
            let detail = format!(
                "host {} used, goal {}: {why} (at most {} MiB per VM per cycle)",
                Percent(used.as_f64() / domain.total.as_f64().max(1.0)),
                Percent(c.goal_used),
                c.max_change_mib
            );
            if target.abs_diff(vm.actual) >= Bytes::from_mib(1) {
                out.balloon.insert(
                    vm.name.to_string(),
                    Proposal {
                        target,
                        reason: Reason::new(rule, detail),
                    },
                );
            } else {
                out.holds
                    .insert(vm.name.to_string(), Reason::new(rule, detail));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::History;
    use crate::signals::Signals;
    use crate::snapshot::{VmLimits, VmSample};
    use crate::testkit;

    /// Decide at `t` s for VMs (size MiB, used MiB, shares) with min 256 and max 1024, on
    /// a 4000 MiB host with `free` MiB freeable.
    fn decide(p: &mut Proxmox, t: u64, free: u64, vms: &[(u64, u64, u32)]) -> PolicyOutput {
        let mut host = History::new(2);
        host.push(Duration::ZERO, testkit::host(4000, free));
        let histories: Vec<History<VmSample>> = vms
            .iter()
            .map(|&(size, _, _)| {
                let mut h = History::new(2);
                h.push(
                    Duration::ZERO,
                    testkit::vm("x", 1024, size, 0).sample.unwrap(),
                );
                h
            })
            .collect();
        let signals: Vec<Signals> = vms
            .iter()
            .map(|&(_, used, _)| Signals {
                used: Some(Bytes::from_mib(used)),
                ..Signals::default()
            })
            .collect();
        let limits: Vec<VmLimits> = vms
            .iter()
            .map(|&(_, _, shares)| VmLimits {
                min: Bytes::from_mib(256),
                max: Bytes::from_mib(1024),
                shares,
            })
            .collect();
        let names = ["a", "b", "c"];
        let inputs: Vec<VmInput<'_>> = (0..vms.len())
            .map(|i| VmInput {
                name: names[i],
                limits: &limits[i],
                history: &histories[i],
                actual: Bytes::from_mib(vms[i].0),
                target: None,
                signals: &signals[i],
            })
            .collect();
        p.decide(&PolicyInput {
            at: Duration::from_secs(t),
            host: &host,
            vms: &inputs,
            unreachable: &[],
        })
    }

    fn target(o: &PolicyOutput, vm: &str) -> Option<u64> {
        o.balloon.get(vm).map(|p| p.target.mib())
    }

    #[test]
    fn above_the_goal_each_vm_moves_at_most_100_mib_per_cycle_toward_its_part_by_shares() {
        // 4000 MiB, 200 free: 95% used, 600 MiB over the 80% goal. Above the minimums the
        // two hold 1536 MiB; 936 are to be left, a quarter to a (234) and three quarters
        // to b (702): a goes 100 MiB toward 490, b to its part, 958.
        let mut p = Proxmox::new(ProxmoxConfig::default(), KsmConfig::default());
        let o = decide(&mut p, 0, 200, &[(1024, 500, 1000), (1024, 500, 3000)]);
        assert_eq!((target(&o, "a"), target(&o, "b")), (Some(924), Some(958)));
        assert_eq!(o.balloon["a"].reason.rule, "proxmox.shrink");
        // 100 MiB to take: b's part is above its size, so a gives it all.
        let mut p = Proxmox::new(ProxmoxConfig::default(), KsmConfig::default());
        let o = decide(&mut p, 0, 700, &[(1024, 500, 1000), (1024, 500, 3000)]);
        assert_eq!((target(&o, "a"), target(&o, "b")), (Some(924), None));
        // Within 10 MiB of the goal: nothing moves.
        let mut p = Proxmox::new(ProxmoxConfig::default(), KsmConfig::default());
        let o = decide(&mut p, 0, 795, &[(1024, 500, 1000)]);
        assert_eq!(target(&o, "a"), None);
        assert_eq!(o.holds["a"].rule, "proxmox.hold");
    }

    #[test]
    fn memory_is_taken_first_from_vms_with_enough_free_and_from_the_others_only_as_a_last_resort() {
        // a has 32 MiB free (under a quarter of its 256 MiB minimum), b 524: b alone gives.
        let mut p = Proxmox::new(ProxmoxConfig::default(), KsmConfig::default());
        let o = decide(&mut p, 0, 200, &[(512, 480, 1000), (1024, 500, 1000)]);
        assert_eq!((target(&o, "a"), target(&o, "b")), (None, Some(924)));
        // Only starving VMs: they give all the same, each toward its part (424 MiB above
        // the minimums left, 212 each: 468), by 100 MiB at most.
        let mut p = Proxmox::new(ProxmoxConfig::default(), KsmConfig::default());
        let o = decide(&mut p, 0, 200, &[(512, 480, 1000), (1024, 1000, 1000)]);
        assert_eq!((target(&o, "a"), target(&o, "b")), (Some(468), Some(924)));
    }

    #[test]
    fn memory_to_give_goes_first_to_vms_starving_below_a_quarter_of_their_minimum() {
        // 1000 MiB free: 75% used, 200 MiB to give; a has 40 MiB free (< 64), b 300: a
        // alone grows, by 100 MiB toward its part.
        let mut p = Proxmox::new(ProxmoxConfig::default(), KsmConfig::default());
        let o = decide(&mut p, 0, 1000, &[(512, 472, 1000), (512, 212, 1000)]);
        assert_eq!((target(&o, "a"), target(&o, "b")), (Some(612), None));
        // Only 40 MiB to give: all of it to the starving VM.
        let mut p = Proxmox::new(ProxmoxConfig::default(), KsmConfig::default());
        let o = decide(&mut p, 0, 840, &[(512, 472, 1000), (512, 212, 1000)]);
        assert_eq!((target(&o, "a"), target(&o, "b")), (Some(552), None));
        // None starving: every VM is given to.
        let mut p = Proxmox::new(ProxmoxConfig::default(), KsmConfig::default());
        let o = decide(&mut p, 0, 1000, &[(512, 212, 1000), (512, 212, 1000)]);
        assert_eq!((target(&o, "a"), target(&o, "b")), (Some(612), Some(612)));
    }

    #[test]
    fn ksm_is_tuned_as_ksmtuned_does_on_a_pve_host() {
        let mut p = Proxmox::new(ProxmoxConfig::default(), KsmConfig::default());
        assert!(decide(&mut p, 0, 200, &[(1024, 500, 1000)]).ksm.is_some());
        assert!(
            decide(&mut p, 5, 200, &[(1024, 500, 1000)]).ksm.is_some(),
            "between cycles too"
        );
    }

    #[test]
    fn its_ksm_steps_are_the_configured_ones() {
        // Found by an audit: `[ksm]` was taken and had no effect under this policy.
        let ksm = KsmConfig {
            npages_boost: 10,
            ..KsmConfig::default()
        };
        let mut p = Proxmox::new(ProxmoxConfig::default(), ksm);
        let o = decide(&mut p, 0, 200, &[(1024, 500, 1000)]);
        assert_eq!(o.ksm.unwrap().settings.pages_to_scan, Some(100 + 10));
    }

    #[test]
    fn it_decides_once_per_10_s_cycle() {
        let mut p = Proxmox::new(ProxmoxConfig::default(), KsmConfig::default());
        assert!(target(&decide(&mut p, 0, 200, &[(1024, 500, 1000)]), "a").is_some());
        let o = decide(&mut p, 5, 200, &[(1024, 500, 1000)]);
        assert_eq!(o.holds["a"].rule, "proxmox.wait");
        assert!(target(&decide(&mut p, 10, 200, &[(1024, 500, 1000)]), "a").is_some());
    }

    proptest::proptest! {
        /// Whatever the VMs and the host, a cycle ends (in whole bytes: in fractions its
        /// rounds went on), moves no VM by more than 100 MiB, and moves each toward its
        /// bounds, never past them.
        #[test]
        fn a_cycle_ends_and_moves_each_vm_at_most_its_step_within_its_bounds(
            vms in proptest::collection::vec(
                (64u64..4096, 0u64..4096, 0u64..4096, 0u32..5000, 0u64..4096),
                1..40,
            ),
            free in 0u64..200_000,
        ) {
            let mut host = History::new(2);
            host.push(Duration::ZERO, testkit::host(200_000, free));
            let (mut histories, mut signals, mut limits, mut names) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for (i, &(size, min, span, shares, used)) in vms.iter().enumerate() {
                let mut h = History::new(2);
                h.push(Duration::ZERO, testkit::vm("x", 8192, size, 0).sample.unwrap());
                histories.push(h);
                signals.push(Signals {
                    used: Some(Bytes::from_mib(used)),
                    ..Signals::default()
                });
                limits.push(VmLimits {
                    min: Bytes::from_mib(min),
                    max: Bytes::from_mib(min + span),
                    shares,
                });
                names.push(format!("vm{i}"));
            }
            let inputs: Vec<VmInput<'_>> = (0..vms.len())
                .map(|i| VmInput {
                    name: &names[i],
                    limits: &limits[i],
                    history: &histories[i],
                    actual: Bytes::from_mib(vms[i].0),
                    target: None,
                    signals: &signals[i],
                })
                .collect();
            let out = Proxmox::new(ProxmoxConfig::default(), KsmConfig::default()).decide(&PolicyInput {
                at: Duration::ZERO,
                host: &host,
                vms: &inputs,
                unreachable: &[],
            });
            for vm in &inputs {
                let Some(p) = out.balloon.get(vm.name) else { continue };
                proptest::prop_assert!(p.target.abs_diff(vm.actual) <= Bytes::from_mib(100));
                if p.target > vm.actual {
                    proptest::prop_assert!(p.target <= vm.limits.max.max(vm.actual));
                } else {
                    proptest::prop_assert!(p.target >= vm.limits.min.min(vm.actual));
                }
            }
        }
    }
}
