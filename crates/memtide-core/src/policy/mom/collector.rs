//! What MOM's policy sees: its collectors sample the host and each guest every 5 s
//! (`host-monitor-interval`, `guest-monitor-interval` in MOM's shipped
//! `doc/mom-balloon.conf`) and keep the last 10 samples (`sample-history-length`), over
//! which its averages (`StatAvg`) are taken: 50 s, where the engine's own history holds
//! its last ticks (10 s in the simulator). The collector takes the engine's samples at
//! MOM's pace into histories of its own. Where MOM's guest monitor goes on through a
//! guest's reboot, a reset guest starts over here, as in the engine: its figures from
//! before say nothing of it after.

use crate::history::History;
use crate::policy::{PolicyInput, VmInput};
use crate::stats::HostStats;
use crate::VmSample;
use rustc_hash::FxHashMap;
use std::time::Duration;

/// A fixed schedule: due at its start, then every interval after it. A call a moment
/// late takes the time due and keeps the schedule; calls that stopped for a while take
/// one, and the schedule goes on from there.
#[derive(Clone, Debug)]
pub(super) struct Schedule {
    interval: Duration,
    next: Duration,
}

impl Schedule {
    /// Due first at `start`, then every `interval` (not zero).
    pub(super) fn starting(start: Duration, interval: Duration) -> Schedule {
        Schedule {
            interval,
            next: start,
        }
    }

    /// Whether a time is due at `at`; if not, the next one.
    pub(super) fn due(&mut self, at: Duration) -> Result<(), Duration> {
        if at < self.next {
            return Err(self.next);
        }
        let passed = (at - self.next).as_nanos() / self.interval.as_nanos().max(1);
        let after = u32::try_from(passed + 1).unwrap_or(u32::MAX);
        self.next = self
            .next
            .saturating_add(self.interval.saturating_mul(after));
        Ok(())
    }
}

/// One sampled thing's history and when it is next sampled.
#[derive(Clone, Debug)]
struct Sampled<T> {
    history: History<T>,
    schedule: Schedule,
}

impl<T: Clone> Sampled<T> {
    /// Sampled first at `at`.
    fn new(at: Duration, every: Duration, len: usize) -> Sampled<T> {
        Sampled {
            history: History::new(len),
            schedule: Schedule::starting(at, every),
        }
    }

    /// Take `sample` if one is due at `at`, first forgetting the samples older than
    /// `window`: where it was not offered samples for a while (its VM unreachable, a
    /// routed policy's VMs all gone), MOM's history would hold none from then.
    fn offer(&mut self, at: Duration, window: Duration, sample: Option<&T>) {
        self.history.forget_before(at.saturating_sub(window));
        if let (Some(sample), Ok(())) = (sample, self.schedule.due(at)) {
            self.history.push(at, sample.clone());
        }
    }
}

/// MOM's collectors: the host and each guest sampled every `every`, the last `len`
/// samples kept.
#[derive(Clone, Debug)]
pub(super) struct Collector {
    every: Duration,
    len: usize,
    host: Sampled<HostStats>,
    vms: FxHashMap<String, Sampled<VmSample>>,
}

impl Collector {
    /// Sampling every `every` (not zero), keeping `len` samples.
    pub(super) fn new(every: Duration, len: usize) -> Collector {
        Collector {
            every,
            len,
            // MOM's host monitor samples as it starts, with the daemon (at 0).
            host: Sampled::new(Duration::ZERO, every, len),
            vms: FxHashMap::default(),
        }
    }

    /// Take what is due at this tick: the host, and each VM sampled this tick, each VM
    /// on its own schedule from when it was first seen (as MOM starts a guest's monitor
    /// when it finds the guest). A VM whose engine history holds one sample is new or
    /// was reset (the engine starts its history over): it starts over here too. VMs
    /// no longer known are forgotten.
    pub(super) fn observe(&mut self, input: &PolicyInput<'_>) {
        let (every, len) = (self.every, self.len);
        // What `len` samples every `every` span.
        let window = every.saturating_mul(u32::try_from(len).unwrap_or(u32::MAX));
        self.host.offer(input.at, window, input.host.latest());
        let known = input.known();
        self.vms.retain(|name, _| known.contains(name.as_str()));
        for vm in input.vms {
            if vm.history.len() <= 1 || !self.vms.contains_key(vm.name) {
                let sampled = Sampled::new(input.at, every, len);
                self.vms.insert(vm.name.to_string(), sampled);
            }
            if let Some(sampled) = self.vms.get_mut(vm.name) {
                sampled.offer(input.at, window, vm.history.latest());
            }
        }
    }

    /// The host's samples; empty before the first [`Collector::observe`].
    pub(super) fn host(&self) -> &History<HostStats> {
        &self.host.history
    }

    /// `vm` as MOM sees it: its samples in place of the engine's (every VM of the
    /// input last observed has them). Its size stays the one the engine reports now:
    /// MOM's `balloon_cur` is its latest sample, up to a sample interval older, but a
    /// guest reset releases its balloon at once, and a size from before the release
    /// would have mom take the memory back from the guest as it boots.
    pub(super) fn view<'a>(&'a self, vm: &VmInput<'a>) -> VmInput<'a> {
        match self.vms.get(vm.name) {
            Some(sampled) => VmInput {
                history: &sampled.history,
                ..*vm
            },
            None => *vm,
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::signals::Signals;
    use crate::snapshot::VmLimits;
    use crate::testkit;
    use crate::Bytes;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn a_schedule_is_due_at_its_start_and_every_interval_on_a_fixed_clock() {
        let mut s = Schedule::starting(secs(10), secs(5));
        assert_eq!(s.due(secs(9)), Err(secs(10)));
        assert_eq!(s.due(secs(10)), Ok(()));
        assert_eq!(s.due(secs(14)), Err(secs(15)));
        // A moment late: taken, the next still at 20.
        assert_eq!(s.due(secs(16)), Ok(()));
        assert_eq!(s.due(secs(19)), Err(secs(20)));
        // Stopped for a while: one, then on from there.
        assert_eq!(s.due(secs(47)), Ok(()));
        assert_eq!(s.due(secs(49)), Err(secs(50)));
    }

    /// Ticks at each of `seconds`, each given to `each`: the host 1000 MiB, one 1000 MiB
    /// VM "a" at 800 MiB, `figures(t)` the host's freeable and the VM's free MiB; the VM's
    /// engine history (10 ticks) restarts at `reset_at`.
    pub(in crate::policy::mom) fn feed(
        seconds: impl IntoIterator<Item = u64>,
        reset_at: Option<u64>,
        figures: impl Fn(u64) -> (u64, u64),
        mut each: impl FnMut(&PolicyInput<'_>),
    ) {
        let limits = VmLimits {
            min: Bytes::ZERO,
            max: Bytes::from_mib(1000),
            shares: 1,
        };
        let signals = Signals::default();
        let (mut host, mut engine) = (History::new(10), History::new(10));
        for t in seconds {
            let (host_free, vm_free) = figures(t);
            host.push(secs(t), testkit::host(1000, host_free));
            if Some(t) == reset_at {
                engine.clear();
            }
            let sample = testkit::vm("a", 1000, 800, vm_free).sample.unwrap();
            engine.push(secs(t), sample);
            let vms = [VmInput {
                name: "a",
                limits: &limits,
                history: &engine,
                actual: Bytes::from_mib(800),
                target: None,
                signals: &signals,
            }];
            each(&PolicyInput {
                at: secs(t),
                host: &host,
                vms: &vms,
                unreachable: &[],
            });
        }
    }

    /// The free MiB of "a" in the collector's samples after [`feed`] to `last` with
    /// figures of the second's number.
    fn run(collector: &mut Collector, last: u64, reset_at: Option<u64>) -> Vec<u64> {
        feed(
            0..=last,
            reset_at,
            |t| (t, t),
            |input| collector.observe(input),
        );
        let free = |s: &VmSample| s.stats.free.unwrap().mib();
        collector.vms["a"].history.iter().map(free).collect()
    }

    #[test]
    fn it_samples_every_interval_and_keeps_its_own_history() {
        let mut c = Collector::new(secs(5), 10);
        // 0 to 59 s: sampled at 0, 5, …, 55; the last 10 kept (50 s, where the engine's
        // history holds 10 s).
        assert_eq!(
            run(&mut c, 59, None),
            [10, 15, 20, 25, 30, 35, 40, 45, 50, 55]
        );
        let host: Vec<u64> = c.host().iter().map(|h| h.domain.freeable.mib()).collect();
        assert_eq!(host, [10, 15, 20, 25, 30, 35, 40, 45, 50, 55]);
    }

    #[test]
    fn after_a_gap_the_samples_older_than_the_window_are_forgotten() {
        let mut c = Collector::new(secs(5), 10);
        // Not observed from 60 s to 199 s (a routed policy whose VMs were all gone, or
        // the VM unreachable), then at 200 s: MOM's history would hold nothing from
        // before 150 s, so neither the host's nor the VM's samples from then count.
        let seconds = (0..60).chain([200]);
        feed(seconds, None, |t| (t, t), |input| c.observe(input));
        let host: Vec<u64> = c.host().iter().map(|h| h.domain.freeable.mib()).collect();
        let free = |s: &VmSample| s.stats.free.unwrap().mib();
        let vm: Vec<u64> = c.vms["a"].history.iter().map(free).collect();
        assert_eq!((host, vm), (vec![200], vec![200]));
    }

    #[test]
    fn a_reset_guest_starts_over_and_a_vm_gone_is_forgotten() {
        let mut c = Collector::new(secs(5), 10);
        // Reset at 23: sampled then, and every 5 s from it.
        assert_eq!(run(&mut c, 39, Some(23)), [23, 28, 33, 38]);
        let mut host = History::new(10);
        host.push(secs(40), testkit::host(1000, 0));
        c.observe(&PolicyInput {
            at: secs(40),
            host: &host,
            vms: &[],
            unreachable: &[],
        });
        assert!(c.vms.is_empty());
    }
}
