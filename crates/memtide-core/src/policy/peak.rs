//! The most a guest has used over a window of time. Its growth room
//! ([`super::divide::growth`]) is measured from the most over [`WINDOW`]: measured from
//! the samples kept in its history alone, a guest's figures could earn that room again and
//! again without it touching anything, by reporting little in use for those few samples
//! and then climbing back to what its host backs, a step a tick (found in review: about
//! half the ticks); measured over the window, they must first report little for that
//! long; a tick without figures repeats the last ones seen, so going silent does not
//! shorten it. A guest without swap keeps room measured over an hour
//! ([`super::burst::BurstRoom`]).

use crate::units::Bytes;
use std::collections::VecDeque;
use std::time::Duration;

/// How far back the most a guest used counts for its growth room.
pub const WINDOW: Duration = Duration::from_secs(300);

/// The most of one guest's figure (what it used, held, grew by) over the last `window`.
#[derive(Clone, Debug)]
pub struct Peak {
    /// How far back its most counts.
    window: Duration,
    /// Samples that may still be the window's most, oldest first, each smaller than the
    /// one before (a sliding-window maximum).
    samples: VecDeque<(Duration, Bytes)>,
    /// The latest figure seen.
    last: Option<Bytes>,
}

impl Default for Peak {
    /// Over [`WINDOW`].
    fn default() -> Self {
        Peak::over(WINDOW)
    }
}

impl Peak {
    /// Over the last `window`.
    pub fn over(window: Duration) -> Peak {
        Peak {
            window,
            samples: VecDeque::new(),
            last: None,
        }
    }

    /// The most of the figure over the window before `at` (`None` before it has been
    /// seen), then `used` at `at` is kept (the last figure again where it is `None`). Time
    /// going back starts over.
    pub fn observe(&mut self, at: Duration, used: Option<Bytes>) -> Option<Bytes> {
        if self.samples.back().is_some_and(|(t, _)| at < *t) {
            self.samples.clear();
        }
        let used = used.or(self.last)?;
        self.last = Some(used);
        while self
            .samples
            .front()
            .is_some_and(|(t, _)| *t + self.window < at)
        {
            self.samples.pop_front();
        }
        let most = self.samples.front().map(|(_, b)| *b);
        while self.samples.back().is_some_and(|(_, b)| *b <= used) {
            self.samples.pop_back();
        }
        self.samples.push_back((at, used));
        most
    }

    /// The most over the window before `at`, as [`Peak::observe`] gives it, without taking
    /// a figure at `at`; `None` once every figure seen is older than the window.
    pub fn most(&self, at: Duration) -> Option<Bytes> {
        // Oldest first and each smaller than the one before: the first still in the
        // window is the most.
        self.samples
            .iter()
            .find(|(t, _)| *t + self.window >= at)
            .map(|(_, b)| *b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_used_over_the_window_before_each_sample() {
        let mut p = Peak::default();
        let at = Duration::from_secs;
        let mib = Bytes::from_mib;
        let seen = |m| Some(mib(m));
        assert_eq!(p.observe(at(0), None), None);
        assert_eq!(p.observe(at(1), seen(100)), None);
        assert_eq!(p.observe(at(2), seen(900)), seen(100));
        // Down and up again within what it used: the most is still 900.
        assert_eq!(p.observe(at(3), seen(200)), seen(900));
        assert_eq!(p.observe(at(200), seen(900)), seen(900));
        // 900 last seen at 200: it counts until 500.
        assert_eq!(p.observe(at(500), seen(300)), seen(900));
        assert_eq!(p.observe(at(501), seen(300)), seen(300));
        // Silent, the last figure stands: 900 again at 600 counts until 900.
        assert_eq!(p.observe(at(502), seen(900)), seen(300));
        assert_eq!(p.observe(at(600), None), seen(900));
        assert_eq!(p.observe(at(900), seen(100)), seen(900));
        // Time going back starts over.
        assert_eq!(p.observe(at(400), seen(300)), None);
    }

    #[test]
    fn the_most_over_the_window_is_read_without_taking_a_figure() {
        let mut p = Peak::default();
        let (at, mib) = (Duration::from_secs, Bytes::from_mib);
        assert_eq!(p.most(at(0)), None);
        p.observe(at(0), Some(mib(900)));
        p.observe(at(100), Some(mib(300)));
        // Read twice: nothing taken.
        assert_eq!(
            (p.most(at(300)), p.most(at(300))),
            (Some(mib(900)), Some(mib(900)))
        );
        // 900 counts until 300, 300 until 400, then nothing.
        assert_eq!(p.most(at(301)), Some(mib(300)));
        assert_eq!(p.most(at(400)), Some(mib(300)));
        assert_eq!(p.most(at(401)), None);
    }
}
