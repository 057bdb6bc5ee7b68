//! Different policies for different VMs: each VM named for a policy is decided by it, the
//! others by the host's policy, which alone tunes KSM. Memory is divided within each
//! policy's group.

use super::{Policy, PolicyInput, PolicyOutput, VmInput};
use crate::estimate::fused::FusedMemory;
use crate::Bytes;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// The host's policy, with per-VM exceptions.
pub struct Routed {
    host: Box<dyn Policy>,
    exceptions: Vec<(BTreeSet<String>, Box<dyn Policy>)>,
    name: String,
}

impl Routed {
    /// `host` decides every VM not named in `exceptions`.
    pub fn new(
        host: Box<dyn Policy>,
        exceptions: Vec<(BTreeSet<String>, Box<dyn Policy>)>,
    ) -> Routed {
        let mut name = host.name().to_string();
        for (vms, p) in &exceptions {
            let vms: Vec<&str> = vms.iter().map(String::as_str).collect();
            name.push_str(&format!(" ({} for {})", p.name(), vms.join(", ")));
        }
        Routed {
            host,
            exceptions,
            name,
        }
    }
}

fn merge(into: &mut PolicyOutput, from: PolicyOutput) {
    into.balloon.extend(from.balloon);
    into.holds.extend(from.holds);
    into.estimates.extend(from.estimates);
    into.faults.extend(from.faults);
    into.unbacked.extend(from.unbacked);
    // The host's need stays the host policy's: an exception's is weighed over its own
    // VMs alone (each of its VMs' reasons carry it).
}

impl Routed {
    /// Give each policy, with `give`, the VMs' memory it decides for.
    fn share(
        &mut self,
        mut memory: BTreeMap<String, (Bytes, FusedMemory)>,
        give: impl Fn(&mut dyn Policy, BTreeMap<String, (Bytes, FusedMemory)>),
    ) {
        for (names, policy) in &mut self.exceptions {
            let (mine, rest) = memory.into_iter().partition(|(vm, _)| names.contains(vm));
            give(policy.as_mut(), mine);
            memory = rest;
        }
        give(self.host.as_mut(), memory);
    }
}

impl Policy for Routed {
    fn name(&self) -> &str {
        &self.name
    }

    fn decide(&mut self, input: &PolicyInput<'_>) -> PolicyOutput {
        let mut rest: Vec<VmInput<'_>> = input.vms.to_vec();
        let mut outputs = Vec::new();
        for (names, policy) in &mut self.exceptions {
            let (mine, others): (Vec<VmInput<'_>>, Vec<VmInput<'_>>) =
                rest.into_iter().partition(|vm| names.contains(vm.name));
            rest = others;
            if !mine.is_empty() {
                outputs.push(policy.decide(&PolicyInput {
                    vms: &mine,
                    ..*input
                }));
            }
        }
        let mut out = self.host.decide(&PolicyInput {
            vms: &rest,
            ..*input
        });
        for o in outputs {
            merge(&mut out, o);
        }
        out
    }

    fn memory(&self, at: Duration) -> BTreeMap<String, FusedMemory> {
        let mut memory = self.host.memory(at);
        for (_, policy) in &self.exceptions {
            memory.extend(policy.memory(at));
        }
        memory
    }

    fn recall(&mut self, memory: BTreeMap<String, (Bytes, FusedMemory)>) {
        self.share(memory, |policy, mine| policy.recall(mine));
    }

    fn take_over(&mut self, memory: BTreeMap<String, (Bytes, FusedMemory)>) {
        self.share(memory, |policy, mine| policy.take_over(mine));
    }

    fn forget_recalled(&mut self, vm: &str) {
        self.host.forget_recalled(vm);
        for (_, policy) in &mut self.exceptions {
            policy.forget_recalled(vm);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::History;
    use crate::policy::none::Unmanaged;
    use crate::signals::Signals;
    use crate::snapshot::VmLimits;
    use crate::testkit::{self, Fixed};
    use crate::units::Bytes;
    use std::time::Duration;

    #[test]
    fn named_vms_go_to_their_policy_and_the_rest_to_the_hosts() {
        let mut host = History::new(2);
        host.push(Duration::ZERO, testkit::host(4096, 2000));
        let mut h = History::new(2);
        h.push(
            Duration::ZERO,
            testkit::vm("x", 1024, 1024, 0).sample.unwrap(),
        );
        let limits = VmLimits {
            min: Bytes::ZERO,
            max: Bytes::from_mib(1024),
            shares: 1,
        };
        let signals = Signals::default();
        let vm = |name| VmInput {
            name,
            limits: &limits,
            history: &h,
            actual: Bytes::from_mib(1024),
            target: None,
            signals: &signals,
        };
        let vms = [vm("db"), vm("web"), vm("batch")];
        let mut routed = Routed::new(
            Box::new(Fixed(Bytes::from_mib(500))),
            vec![
                (
                    ["db".to_string()].into(),
                    Box::new(Fixed(Bytes::from_mib(900))),
                ),
                (["batch".to_string()].into(), Box::new(Unmanaged)),
            ],
        );
        assert_eq!(routed.name(), "fixed (fixed for db) (none for batch)");
        let out = routed.decide(&PolicyInput {
            at: Duration::ZERO,
            host: &host,
            vms: &vms,
            unreachable: &[],
        });
        let mut targets: Vec<_> = out
            .balloon
            .iter()
            .map(|(n, p)| (n.as_str(), p.target.mib()))
            .collect();
        targets.sort();
        assert_eq!(targets, [("db", 900), ("web", 500)]);
        assert!(out.holds.contains_key("batch"));
    }

    /// A policy that keeps whatever estimator states it is given.
    struct Keeps(BTreeMap<String, FusedMemory>);

    impl Policy for Keeps {
        fn name(&self) -> &str {
            "keeps"
        }
        fn decide(&mut self, _: &PolicyInput<'_>) -> PolicyOutput {
            PolicyOutput::default()
        }
        fn memory(&self, _: Duration) -> BTreeMap<String, FusedMemory> {
            self.0.clone()
        }
        fn recall(&mut self, memory: BTreeMap<String, (Bytes, FusedMemory)>) {
            self.0 = memory.into_iter().map(|(vm, (_, m))| (vm, m)).collect();
        }
    }

    #[test]
    fn what_each_policy_learnt_is_kept_across_a_restart_and_given_back_to_it() {
        let m = |mib| FusedMemory {
            estimate: Bytes::from_mib(mib),
            base: Bytes::from_mib(mib),
            backoffs: 0,
            hold_s: 0.0,
            exact: false,
            sampling: false,
            freed_peak: Bytes::ZERO,
            freed_peak_s: 0.0,
        };
        let keeps = || Box::new(Keeps(BTreeMap::new()));
        // "db" is decided by a policy that keeps nothing: what was saved for it is not
        // given to the host's policy.
        let mut routed = Routed::new(
            keeps(),
            vec![
                (["db".to_string()].into(), Box::new(Unmanaged)),
                (["batch".to_string()].into(), keeps()),
            ],
        );
        let saved = [("db", 100), ("web", 200), ("batch", 300)]
            .map(|(vm, mib)| (vm.to_string(), (Bytes::from_mib(1024), m(mib))));
        routed.recall(saved.into());
        let kept: Vec<_> = routed
            .memory(Duration::ZERO)
            .into_iter()
            .map(|(vm, m)| (vm, m.estimate.mib()))
            .collect();
        assert_eq!(kept, [("batch".to_string(), 300), ("web".to_string(), 200)]);
    }
}
