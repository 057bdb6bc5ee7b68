//! Proxmox VE's auto-ballooning, as its documentation and pvestatd describe it: every
//! 10 s, steer the host toward 80% of its memory used; move each VM by at most 100 MiB
//! per cycle, between its `balloon:` minimum and its `memory:` size, in proportion to its
//! `shares:`; when there is memory to give, give it first to VMs whose free memory is at
//! or below 25% of their minimum. No working-set estimate, no pressure signal, no KSM
//! tuning (PVE runs ksmtuned apart). It is what most KVM operators run today: a baseline.

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
    /// first when memory is given.
    pub starving: f64,
}

impl Default for ProxmoxConfig {
    fn default() -> Self {
        ProxmoxConfig {
            goal_used: 0.80,
            max_change_mib: 100,
            cycle_s: 10.0,
            starving: 0.25,
        }
    }
}

/// The Proxmox policy.
pub struct Proxmox {
    config: ProxmoxConfig,
    next_cycle: Option<Duration>,
}

impl Proxmox {
    /// The policy with its constants.
    pub fn new(config: ProxmoxConfig) -> Proxmox {
        Proxmox {
            config,
            next_cycle: None,
        }
    }

    /// Whether the VM's free memory is at or below `starving` of its minimum.
    fn starving(&self, vm: &VmInput<'_>) -> bool {
        vm.signals
            .used
            .is_some_and(|used| (vm.actual - used) <= vm.limits.min.scale(self.config.starving))
    }
}

/// Hand `goal` bytes out to `vms` (each with its room and weight), at most `cap` each;
/// returns the amount per VM and what is left.
fn hand_out(goal: f64, vms: &[(usize, f64, f64)], cap: f64, given: &mut [f64]) -> f64 {
    let total: f64 = vms.iter().map(|&(_, _, w)| w).sum();
    if total <= 0.0 {
        return goal;
    }
    let mut left = goal;
    for &(i, room, w) in vms {
        let d = (goal * w / total).min(room).min(cap - given[i]).max(0.0);
        given[i] += d;
        left -= d;
    }
    left
}

impl Policy for Proxmox {
    fn name(&self) -> &str {
        "proxmox"
    }

    fn decide(&mut self, input: &PolicyInput<'_>) -> PolicyOutput {
        let mut out = PolicyOutput::with_capacity(input.vms.len());
        if self.next_cycle.is_some_and(|next| input.at < next) {
            for vm in input.vms {
                out.holds.insert(
                    vm.name.to_string(),
                    Reason::new("proxmox.wait", "between pvestatd cycles (every 10 s)"),
                );
            }
            return out;
        }
        let c = &self.config;
        self.next_cycle =
            Some(input.at + Duration::try_from_secs_f64(c.cycle_s).unwrap_or_default());
        let domain = &input.host_latest().domain;
        let used = domain.total - domain.freeable;
        let goal = domain.total.as_f64() * c.goal_used - used.as_f64();
        let cap = Bytes::from_mib(c.max_change_mib).as_f64();
        let shares = |vm: &VmInput<'_>| f64::from(vm.limits.shares.max(1));
        let mut moved = vec![0.0; input.vms.len()];
        let (rule, why) = if goal > 0.0 {
            // Give: VMs below their size, the starving first, by shares.
            let room = |vm: &VmInput<'_>| (vm.limits.max - vm.actual).as_f64();
            let pick = |starving: bool| -> Vec<(usize, f64, f64)> {
                input
                    .vms
                    .iter()
                    .enumerate()
                    .filter(|(_, vm)| room(vm) > 0.0 && self.starving(vm) == starving)
                    .map(|(i, vm)| (i, room(vm), shares(vm)))
                    .collect()
            };
            let left = hand_out(goal, &pick(true), cap, &mut moved);
            hand_out(left, &pick(false), cap, &mut moved);
            ("proxmox.grow", "below the goal: give")
        } else {
            // Take: VMs above their minimum, those with fewer shares more.
            let vms: Vec<(usize, f64, f64)> = input
                .vms
                .iter()
                .enumerate()
                .map(|(i, vm)| (i, (vm.actual - vm.limits.min).as_f64(), 1.0 / shares(vm)))
                .filter(|&(_, room, _)| room > 0.0)
                .collect();
            hand_out(-goal, &vms, cap, &mut moved);
            moved.iter_mut().for_each(|m| *m = -*m);
            ("proxmox.shrink", "above the goal: take")
        };
        for (vm, m) in input.vms.iter().zip(moved) {
            let target = if m >= 0.0 {
                vm.actual + Bytes::from_f64(m)
            } else {
                vm.actual - Bytes::from_f64(-m)
            };
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
    fn above_the_goal_each_vm_gives_at_most_100_mib_per_cycle_fewer_shares_more() {
        // 4000 MiB, 200 free: 95% used, 600 MiB over the 80% goal.
        let mut p = Proxmox::new(ProxmoxConfig::default());
        let o = decide(&mut p, 0, 200, &[(1024, 500, 1000), (1024, 500, 3000)]);
        assert_eq!((target(&o, "a"), target(&o, "b")), (Some(924), Some(924)));
        // 100 MiB to take: three quarters from the VM with a third of the shares.
        let mut p = Proxmox::new(ProxmoxConfig::default());
        let o = decide(&mut p, 0, 700, &[(1024, 500, 1000), (1024, 500, 3000)]);
        assert_eq!((target(&o, "a"), target(&o, "b")), (Some(949), Some(999)));
        assert_eq!(o.balloon["a"].reason.rule, "proxmox.shrink");
    }

    #[test]
    fn memory_to_give_goes_first_to_vms_starving_below_a_quarter_of_their_minimum() {
        // 1000 MiB free: 75% used, 200 MiB to give; a has 40 MiB free (< 64), b 300.
        let mut p = Proxmox::new(ProxmoxConfig::default());
        let o = decide(&mut p, 0, 1000, &[(512, 472, 1000), (512, 212, 1000)]);
        assert_eq!((target(&o, "a"), target(&o, "b")), (Some(612), Some(612)));
        // Only 40 MiB to give: all of it to the starving VM.
        let mut p = Proxmox::new(ProxmoxConfig::default());
        let o = decide(&mut p, 0, 840, &[(512, 472, 1000), (512, 212, 1000)]);
        assert_eq!((target(&o, "a"), target(&o, "b")), (Some(552), None));
    }

    #[test]
    fn it_decides_once_per_10_s_cycle() {
        let mut p = Proxmox::new(ProxmoxConfig::default());
        assert!(target(&decide(&mut p, 0, 200, &[(1024, 500, 1000)]), "a").is_some());
        let o = decide(&mut p, 5, 200, &[(1024, 500, 1000)]);
        assert_eq!(o.holds["a"].rule, "proxmox.wait");
        assert!(target(&decide(&mut p, 10, 200, &[(1024, 500, 1000)]), "a").is_some());
    }
}
