//! A short, bounded history of samples: the source of averages and per-second rates.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::time::Duration;

/// The most recent samples of something, oldest first, with the time each was taken.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct History<T> {
    capacity: usize,
    samples: VecDeque<(Duration, T)>,
}

impl<T> History<T> {
    /// An empty history keeping at most `capacity` samples (at least 2, for rates).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(2);
        // Exactly its capacity: grown one sample at a time it would double past it (16
        // slots for 10 samples, 5 KiB per VM more with the engine's default).
        History {
            capacity,
            samples: VecDeque::with_capacity(capacity),
        }
    }

    /// Add a sample, dropping the oldest beyond capacity.
    pub fn push(&mut self, at: Duration, sample: T) {
        if self.samples.len() == self.capacity {
            self.samples.pop_front();
        }
        self.samples.push_back((at, sample));
    }

    /// The latest sample.
    pub fn latest(&self) -> Option<&T> {
        self.samples.back().map(|(_, s)| s)
    }

    /// All samples, oldest first.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &T> + ExactSizeIterator {
        self.samples.iter().map(|(_, s)| s)
    }

    /// Number of samples held.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// True when no sample is held.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Forget everything (e.g. after a guest reset, when counters restart).
    pub fn clear(&mut self) {
        self.samples.clear();
    }

    /// Forget the samples taken before `at`.
    pub fn forget_before(&mut self, at: Duration) {
        while self.samples.front().is_some_and(|(t, _)| *t < at) {
            self.samples.pop_front();
        }
    }

    /// The mean of a value over the history, ignoring samples that lack it.
    pub fn mean(&self, value: impl Fn(&T) -> Option<f64>) -> Option<f64> {
        let (sum, n) = self
            .iter()
            .filter_map(value)
            .fold((0.0, 0usize), |(sum, n), v| (sum + v, n + 1));
        (n > 0).then(|| sum / n as f64)
    }

    /// When the run of latest samples that all give `value` as `v` began (`None` if the
    /// latest does not): how long `v` has not changed, as far as the history reaches.
    pub fn unchanged_since<V: PartialEq>(
        &self,
        v: &V,
        value: impl Fn(&T) -> V,
    ) -> Option<Duration> {
        self.samples
            .iter()
            .rev()
            .take_while(|(_, s)| value(s) == *v)
            .last()
            .map(|(at, _)| *at)
    }

    /// Time between the two latest samples.
    pub fn interval(&self) -> Option<Duration> {
        let n = self.samples.len();
        (n >= 2).then(|| self.samples[n - 1].0.saturating_sub(self.samples[n - 2].0))
    }

    /// Growth of a cumulative counter from the latest earlier sample that has it to the
    /// latest, and the time between the two: samples without it in between (a guest
    /// agent's missed replies) lose none of it (found in review: an OOM kill counted in
    /// the reply after a missed one was never seen). `None` when the latest lacks it, no
    /// earlier sample has it, or it went backwards (a reset).
    pub fn growth(&self, counter: impl Fn(&T) -> Option<u64>) -> Option<(u64, Duration)> {
        let mut samples = self.samples.iter().rev();
        let (t1, latest) = samples.next()?;
        let c1 = counter(latest)?;
        let (t0, c0) = samples.find_map(|(t, s)| Some((t, counter(s)?)))?;
        Some((c1.checked_sub(c0)?, t1.saturating_sub(*t0)))
    }

    /// Growth of a cumulative counter between the two latest samples; `None` when either
    /// lacks it or it went backwards (a reset).
    pub fn delta(&self, counter: impl Fn(&T) -> Option<u64>) -> Option<u64> {
        let n = self.samples.len();
        if n < 2 {
            return None;
        }
        let (c0, c1) = (
            counter(&self.samples[n - 2].1)?,
            counter(&self.samples[n - 1].1)?,
        );
        c1.checked_sub(c0)
    }

    /// Per-second rate of a cumulative counter between the two latest samples.
    /// `None` when either lacks it, time did not advance, or it went backwards (a reset).
    pub fn rate(&self, counter: impl Fn(&T) -> Option<u64>) -> Option<f64> {
        let n = self.samples.len();
        if n < 2 {
            return None;
        }
        let (t0, s0) = &self.samples[n - 2];
        let (t1, s1) = &self.samples[n - 1];
        let dt = t1.checked_sub(*t0)?.as_secs_f64();
        let (c0, c1) = (counter(s0)?, counter(s1)?);
        (dt > 0.0 && c1 >= c0).then(|| (c1 - c0) as f64 / dt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn keeps_only_the_latest_samples() {
        let mut h = History::new(3);
        for i in 0..5u64 {
            h.push(at(i), i);
        }
        assert_eq!(h.iter().copied().collect::<Vec<_>>(), vec![2, 3, 4]);
        assert_eq!(h.latest(), Some(&4));
    }

    #[test]
    fn holds_no_room_beyond_its_capacity() {
        let mut h = History::new(10);
        for i in 0..25u64 {
            h.push(at(i), i);
        }
        assert_eq!(h.samples.capacity(), 10, "not doubled to 16");
    }

    #[test]
    fn mean_ignores_missing_values() {
        let mut h = History::new(10);
        for v in [Some(2.0), None, Some(4.0)] {
            h.push(at(0), v);
        }
        assert_eq!(h.mean(|v| *v), Some(3.0));
        let empty: History<Option<f64>> = History::new(3);
        assert_eq!(empty.mean(|v| *v), None);
    }

    #[test]
    fn delta_and_interval_of_the_two_latest() {
        let mut h = History::new(10);
        h.push(at(1), 5u64);
        assert_eq!((h.delta(|v| Some(*v)), h.interval()), (None, None));
        h.push(at(3), 12);
        assert_eq!(
            (h.delta(|v| Some(*v)), h.interval()),
            (Some(7), Some(at(2)))
        );
        h.push(at(4), 2);
        assert_eq!(h.delta(|v| Some(*v)), None, "a counter reset is no delta");
    }

    #[test]
    fn growth_reaches_over_samples_that_lack_the_counter() {
        let mut h = History::new(10);
        for (t, v) in [(1, Some(5u64)), (3, None), (5, None), (7, Some(9))] {
            h.push(at(t), v);
        }
        assert_eq!(
            h.growth(|v| *v),
            Some((4, at(6))),
            "nothing lost in the gap"
        );
        assert_eq!(h.delta(|v| *v), None, "the two latest only");
        h.push(at(9), None);
        assert_eq!(h.growth(|v| *v), None, "the latest lacks it");
        let mut h = History::new(10);
        h.push(at(1), None);
        h.push(at(2), Some(3u64));
        assert_eq!(h.growth(|v| *v), None, "nothing earlier has it");
    }

    #[test]
    fn rate_is_per_second_and_none_on_reset() {
        let mut h = History::new(10);
        h.push(at(10), 100u64);
        assert_eq!(h.rate(|v| Some(*v)), None, "one sample has no rate");
        h.push(at(12), 160);
        assert_eq!(h.rate(|v| Some(*v)), Some(30.0));
        h.push(at(13), 5);
        assert_eq!(h.rate(|v| Some(*v)), None, "counter went backwards");
        h.push(at(13), 9);
        assert_eq!(h.rate(|v| Some(*v)), None, "no time passed");
    }
}
