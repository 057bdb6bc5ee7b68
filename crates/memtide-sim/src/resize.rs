//! How fast a policy resizes guests: after a guest's pressure signal (part of its working
//! set out of memory), how long until the policy raises its balloon target, and until the
//! shortage is over; after a guest frees memory, how long until the balloon takes it back.
//! Each as a distribution over every such episode of a run (reported as percentiles).

use serde::{Deserialize, Serialize};

/// A distribution of latencies (s), as percentiles.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    /// Episodes measured.
    pub count: usize,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Longest.
    pub max: f64,
}

impl Percentiles {
    /// The percentiles of `samples` (nearest rank); all zero when there are none.
    pub fn of(mut samples: Vec<f64>) -> Percentiles {
        if samples.is_empty() {
            return Percentiles::default();
        }
        samples.sort_by(f64::total_cmp);
        let rank = |p: f64| {
            samples[((p * samples.len() as f64).ceil() as usize).clamp(1, samples.len()) - 1]
        };
        Percentiles {
            count: samples.len(),
            p50: rank(0.50),
            p90: rank(0.90),
            p99: rank(0.99),
            max: samples[samples.len() - 1],
        }
    }
}

/// A run's resize latencies (`summary.json`: `resize`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ResizeSummary {
    /// From a guest's pressure signal (below its full size) to a raised balloon target
    /// (0: in the same tick).
    pub give_reaction_s: Percentiles,
    /// Pressure episodes the policy never answered with a raised target.
    pub give_unanswered: usize,
    /// From a guest's pressure signal to the end of its shortage.
    pub shortage_s: Percentiles,
    /// From a guest freeing memory (its working set falling by 5% of its size or more)
    /// to its balloon bringing it within 10% of its size of its working set.
    pub take_back_s: Percentiles,
}

/// One VM's episodes as they happen.
#[derive(Clone, Debug, Default)]
pub struct ResizeTracker {
    /// The current shortage: its first tick, the target before it, whether it was
    /// answered.
    shortage: Option<(u64, Option<u64>, bool)>,
    /// The tick the guest last freed memory, while its balloon has not caught up.
    freed: Option<u64>,
    last_ws: Option<u64>,
    /// The target at the end of the tick before.
    last_target: Option<u64>,
    give_reaction: Vec<f64>,
    unanswered: usize,
    shortage_s: Vec<f64>,
    take_back: Vec<f64>,
}

/// What a VM looks like at the end of a tick (pages).
#[derive(Clone, Copy, Debug)]
pub struct Tick {
    /// The tick.
    pub tick: u64,
    /// Part of its working set is out of memory.
    pub short: bool,
    /// Its balloon target, if it was given one.
    pub target: Option<u64>,
    /// Its size.
    pub actual: u64,
    /// Its configured size.
    pub configured: u64,
    /// The working set its workload wants.
    pub working_set: u64,
}

impl ResizeTracker {
    /// Take in one tick.
    pub fn observe(&mut self, t: Tick, tick_s: f64) {
        let since = |start: u64| (t.tick - start) as f64 * tick_s;
        match (&mut self.shortage, t.short) {
            (None, true) if t.actual < t.configured => {
                // A target raised in the shortage's first tick answers it (in 0 s): the
                // tick's target is the decision made on that tick's figures.
                self.shortage = Some((t.tick, self.last_target, false));
                self.answer(t, tick_s);
            }
            (Some(_), true) => self.answer(t, tick_s),
            (Some((start, _, answered)), false) => {
                if !*answered {
                    self.unanswered += 1;
                }
                self.shortage_s.push(since(*start));
                self.shortage = None;
            }
            _ => {}
        }
        let slack = t.configured / 10;
        if self
            .last_ws
            .is_some_and(|last| last >= t.working_set + t.configured / 20)
            && t.actual > t.working_set + slack
        {
            self.freed.get_or_insert(t.tick);
        }
        if let Some(start) = self.freed {
            if t.actual <= t.working_set + slack {
                self.take_back.push(since(start));
                self.freed = None;
            }
        }
        self.last_ws = Some(t.working_set);
        self.last_target = t.target;
    }

    /// A raised target answers the current shortage.
    fn answer(&mut self, t: Tick, tick_s: f64) {
        if let Some((start, before, answered)) = &mut self.shortage {
            let raised = match (t.target, *before) {
                (Some(now), Some(then)) => now > then,
                (Some(now), None) => now > t.actual,
                _ => false,
            };
            if raised && !*answered {
                *answered = true;
                self.give_reaction.push((t.tick - *start) as f64 * tick_s);
            }
        }
    }

    /// Every VM's episodes together.
    pub fn summary<'a>(trackers: impl Iterator<Item = &'a ResizeTracker>) -> ResizeSummary {
        let (mut give, mut shortage, mut take, mut unanswered) =
            (Vec::new(), Vec::new(), Vec::new(), 0);
        for r in trackers {
            give.extend(&r.give_reaction);
            shortage.extend(&r.shortage_s);
            take.extend(&r.take_back);
            unanswered += r.unanswered;
        }
        ResizeSummary {
            give_reaction_s: Percentiles::of(give),
            give_unanswered: unanswered,
            shortage_s: Percentiles::of(shortage),
            take_back_s: Percentiles::of(take),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tick(tick: u64, short: bool, target: Option<u64>, actual: u64, ws: u64) -> Tick {
        Tick {
            tick,
            short,
            target,
            actual,
            configured: 1000,
            working_set: ws,
        }
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let p = Percentiles::of((1..=100).map(f64::from).collect());
        assert_eq!(
            (p.count, p.p50, p.p90, p.p99, p.max),
            (100, 50.0, 90.0, 99.0, 100.0)
        );
        assert_eq!(Percentiles::of(Vec::new()), Percentiles::default());
    }

    #[test]
    fn a_shortage_answered_in_its_second_tick_and_over_in_its_fourth() {
        let mut r = ResizeTracker::default();
        r.observe(tick(1, false, Some(500), 500, 400), 1.0);
        r.observe(tick(2, true, Some(500), 500, 600), 1.0);
        r.observe(tick(3, true, Some(700), 500, 600), 1.0);
        r.observe(tick(4, true, Some(700), 700, 600), 1.0);
        r.observe(tick(6, false, Some(700), 700, 600), 1.0);
        let s = ResizeTracker::summary([&r].into_iter());
        assert_eq!((s.give_reaction_s.max, s.shortage_s.max), (1.0, 4.0));
        assert_eq!(s.give_unanswered, 0);
    }

    #[test]
    fn a_target_raised_in_the_shortages_first_tick_answers_it() {
        // The tick's target is the decision made on its figures: raised at once, it
        // answers the shortage in 0 s, and is not taken for the target before it (which
        // left every such episode unanswered).
        let mut r = ResizeTracker::default();
        r.observe(tick(1, false, Some(500), 500, 400), 1.0);
        r.observe(tick(2, true, Some(700), 500, 600), 1.0);
        r.observe(tick(3, true, Some(700), 700, 600), 1.0);
        r.observe(tick(4, false, Some(700), 700, 600), 1.0);
        // Never raised: unanswered.
        r.observe(tick(5, true, Some(700), 690, 750), 1.0);
        r.observe(tick(6, false, Some(700), 700, 650), 1.0);
        let s = ResizeTracker::summary([&r].into_iter());
        assert_eq!((s.give_reaction_s.count, s.give_reaction_s.max), (1, 0.0));
        assert_eq!(s.give_unanswered, 1);
        assert_eq!((s.shortage_s.count, s.shortage_s.max), (2, 2.0));
    }

    #[test]
    fn freed_memory_is_taken_back_when_the_guest_is_near_its_working_set() {
        let mut r = ResizeTracker::default();
        r.observe(tick(1, false, None, 1000, 600), 1.0);
        r.observe(tick(2, false, None, 1000, 300), 1.0); // freed 300
        r.observe(tick(3, false, Some(350), 700, 300), 1.0);
        r.observe(tick(5, false, Some(350), 390, 300), 1.0);
        let s = ResizeTracker::summary([&r].into_iter());
        assert_eq!((s.take_back_s.count, s.take_back_s.max), (1, 3.0));
    }
}
