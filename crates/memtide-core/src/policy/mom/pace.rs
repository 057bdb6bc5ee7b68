//! MOM's pace: when its policy engine evaluates a policy, and on what. The built-in `mom`
//! runs at it, and so do policy files ([`Paced`]): MOM's policy language is written for
//! its engine, which evaluates every `policy-engine-interval` on what its collectors
//! sampled, not at every sample.

use super::collector::{Collector, Schedule};
use super::MomConfig;
use crate::action::Reason;
use crate::policy::{Policy, PolicyFault, PolicyInput, PolicyOutput, VmInput};
use std::time::Duration;

/// When evaluations are due and what they see, from `[mom]`'s `interval_s`,
/// `sample_interval_s` and `sample_history`.
#[derive(Clone, Debug)]
pub(super) struct Pace {
    interval_s: f64,
    /// When evaluations are due; `None` before the first call.
    schedule: Option<Schedule>,
    /// MOM's own samples; `None` where it takes the engine's history.
    collector: Option<Collector>,
    /// What failed at the last evaluation: said again until the next, so that a policy
    /// that fails is not taken for one that waits.
    faults: Vec<PolicyFault>,
}

impl Pace {
    /// MOM's pace as `config` sets it.
    pub(super) fn new(config: &MomConfig) -> Pace {
        let collector = Duration::try_from_secs_f64(config.sample_interval_s)
            .ok()
            .filter(|every| !every.is_zero())
            .map(|every| Collector::new(every, config.sample_history));
        Pace {
            interval_s: config.interval_s,
            schedule: None,
            collector,
            faults: Vec::new(),
        }
    }

    /// Whether an evaluation is due at `at`, or when the next one is: as MOM's policy
    /// engine, an interval after it starts and every interval after (MOM sleeps an
    /// interval between evaluations, drifting by their length; here the schedule is
    /// fixed: a tick a moment early delays one evaluation, not the ones after it); at
    /// every call with an interval of 0, never with one that is not a duration.
    fn due(&mut self, at: Duration) -> Result<(), Duration> {
        let Ok(interval) = Duration::try_from_secs_f64(self.interval_s) else {
            return Err(Duration::MAX);
        };
        if interval.is_zero() {
            return Ok(());
        }
        self.schedule
            .get_or_insert_with(|| Schedule::starting(at.saturating_add(interval), interval))
            .due(at)
    }

    /// Take this tick's samples; then, where an evaluation is due, `evaluate` what the
    /// collectors hold (the engine's input where they sample every tick). Between
    /// evaluations every VM holds, under rule `wait_rule`, KSM is left as it is, and the
    /// last evaluation's faults stand (those of VMs still in the input).
    pub(super) fn run(
        &mut self,
        input: &PolicyInput<'_>,
        wait_rule: &'static str,
        evaluate: impl FnOnce(&PolicyInput<'_>) -> PolicyOutput,
    ) -> PolicyOutput {
        if let Some(collector) = &mut self.collector {
            collector.observe(input);
        }
        if let Err(next) = self.due(input.at) {
            let mut out = PolicyOutput::with_capacity(input.vms.len());
            let wait = format!(
                "between MOM's policy evaluations (every {} s; the next in {:.0} s)",
                self.interval_s,
                (next - input.at).as_secs_f64()
            );
            out.hold_all(input.vms, Reason::new(wait_rule, wait));
            let present = |vm: &str| input.vms.iter().any(|v| v.name == vm);
            out.faults = (self.faults.iter())
                .filter(|f| f.vm.as_deref().is_none_or(present))
                .cloned()
                .collect();
            return out;
        }
        let out = match &self.collector {
            None => evaluate(input),
            Some(collector) => {
                let seen: Vec<VmInput<'_>> =
                    input.vms.iter().map(|vm| collector.view(vm)).collect();
                evaluate(&PolicyInput {
                    host: collector.host(),
                    vms: &seen,
                    ..*input
                })
            }
        };
        self.faults.clone_from(&out.faults);
        out
    }
}

/// A policy evaluated at MOM's pace: policy files, as MOM's engine runs them. It keeps
/// nothing across a restart, as policy files keep nothing ([`Policy::memory`]).
pub struct Paced<P> {
    pace: Pace,
    policy: P,
}

impl<P: Policy> Paced<P> {
    /// `policy` at the pace `config` sets.
    pub fn new(policy: P, config: &MomConfig) -> Paced<P> {
        Paced {
            pace: Pace::new(config),
            policy,
        }
    }
}

impl<P: Policy> Policy for Paced<P> {
    fn name(&self) -> &str {
        self.policy.name()
    }

    fn decide(&mut self, input: &PolicyInput<'_>) -> PolicyOutput {
        let policy = &mut self.policy;
        self.pace
            .run(input, "script.wait", |input| policy.decide(input))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::History;
    use crate::policy::mom::collector::tests::feed;
    use crate::testkit;

    /// Fails for "a" and as a whole at every evaluation, noting when it was evaluated
    /// and how many samples of "a" and of the host it was given.
    #[derive(Default)]
    struct Failing {
        seen: Vec<(u64, usize, usize)>,
    }

    impl Policy for Failing {
        fn name(&self) -> &str {
            "failing.policy"
        }

        fn decide(&mut self, input: &PolicyInput<'_>) -> PolicyOutput {
            let at = input.at.as_secs();
            let vm = input.vms[0].history.len();
            self.seen.push((at, vm, input.host.len()));
            let mut out = PolicyOutput::default();
            for vm in [Some("a".to_string()), None] {
                let message = format!("failed at {at} s");
                out.faults.push(PolicyFault { vm, message });
            }
            out
        }
    }

    #[test]
    fn a_paced_policy_is_evaluated_on_moms_samples_and_its_faults_stand_between() {
        let mut paced = Paced::new(Failing::default(), &MomConfig::default());
        let mut outs = Vec::new();
        feed(
            0..=25,
            None,
            |_| (500, 500),
            |input| outs.push(paced.decide(input)),
        );
        // Evaluated at 10 and 20 s, on the samples taken every 5 s from 0.
        assert_eq!(paced.policy.seen, [(10, 3, 3), (20, 5, 5)]);
        for (t, out) in outs.iter().enumerate() {
            let messages: Vec<&str> = out.faults.iter().map(|f| f.message.as_str()).collect();
            let expected = match t {
                0..=9 => vec![],
                10..=19 => vec!["failed at 10 s"; 2],
                _ => vec!["failed at 20 s"; 2],
            };
            assert_eq!(messages, expected, "at {t} s");
            let waits = out.holds.get("a").is_some_and(|h| h.rule == "script.wait");
            assert_eq!(waits, t % 10 != 0 || t == 0, "at {t} s");
        }
        // A VM no longer in the input: its fault goes, the policy's own stays.
        let mut host = History::new(10);
        host.push(Duration::from_secs(26), testkit::host(1000, 500));
        let out = paced.decide(&PolicyInput {
            at: Duration::from_secs(26),
            host: &host,
            vms: &[],
            unreachable: &[],
        });
        let vms: Vec<Option<String>> = out.faults.into_iter().map(|f| f.vm).collect();
        assert_eq!(vms, [None]);
    }
}
