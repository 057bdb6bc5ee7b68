//! MOM's pace: when its policy engine evaluates a policy, and on what. The built-in `mom`
//! runs at it, and so do policy files ([`Paced`]): MOM's policy language is written for
//! its engine, which evaluates every `policy-engine-interval` on what its collectors
//! sampled, not at every sample.

use super::collector::{Collector, Schedule};
use super::MomConfig;
use crate::action::Reason;
use crate::policy::{Policy, PolicyInput, PolicyOutput, VmInput};
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
    /// evaluations every VM holds, under rule `wait_rule`, and KSM is left as it is.
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
            return out;
        }
        let Some(collector) = &self.collector else {
            return evaluate(input);
        };
        let seen: Vec<VmInput<'_>> = input.vms.iter().map(|vm| collector.view(vm)).collect();
        evaluate(&PolicyInput {
            host: collector.host(),
            vms: &seen,
            ..*input
        })
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
