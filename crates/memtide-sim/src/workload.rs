//! Workloads: how much memory a guest's programs want over time, and how they touch it.
//!
//! A workload has an anonymous working set and a page-cache working set, each following
//! a [`Shape`] in MiB over time, plus an optional region allocated once and then left
//! idle. [`Workload::demand`] turns the description into page counts tick by tick.

use crate::guest::pages;
use crate::rng::Rng;
use serde::{Deserialize, Serialize};

/// Why a rate, a length of time or a count of seconds is refused: it must be finite and
/// above 0 (scenario and workload checks alike).
pub(crate) const ABOVE_ZERO: &str = "must be a finite number above 0";

/// The shortest step of a workload's clock (a walk's `every_s`, a `hold_s`), in s.
pub(crate) const MIN_STEP_S: f64 = 0.001;

/// A size over time, in MiB.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Shape {
    /// Always the same size.
    Const {
        /// Size (MiB).
        mib: f64,
    },
    /// Sizes held one after another for their durations; the last holds on, unless
    /// `repeat` starts the list again.
    Phases {
        /// The phases, in order.
        phases: Vec<Phase>,
        /// Start again after the last phase.
        #[serde(default)]
        repeat: bool,
    },
    /// A periodic wave between two sizes.
    Wave {
        /// Form of the wave.
        #[serde(default)]
        form: WaveForm,
        /// Lowest size (MiB).
        min_mib: f64,
        /// Highest size (MiB).
        max_mib: f64,
        /// Period (s).
        period_s: f64,
        /// Time shift (s): the wave at time t is the unshifted wave at t + phase_s.
        #[serde(default)]
        phase_s: f64,
        /// Draw the shift at random (from the run's seed) instead, so that each VM of a
        /// group has its own timing.
        #[serde(default)]
        random_phase: bool,
    },
    /// A random walk: every `every_s` seconds the size moves up or down by `step_mib`,
    /// staying within the bounds (memknobs invoked with a gradually changing size).
    Walk {
        /// Lowest size (MiB).
        min_mib: f64,
        /// Highest size (MiB).
        max_mib: f64,
        /// Size of one step (MiB).
        step_mib: f64,
        /// Time between steps (s).
        every_s: f64,
        /// First size (MiB); drawn at random within the bounds when absent.
        #[serde(default)]
        start_mib: Option<f64>,
    },
    /// A recorded trace: `[t_s, mib]` points, linear in between, held after the last.
    Trace {
        /// The points, with increasing times.
        points: Vec<[f64; 2]>,
    },
}

impl Default for Shape {
    fn default() -> Self {
        Shape::Const { mib: 0.0 }
    }
}

/// One step of a [`Shape::Phases`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Phase {
    /// Size (MiB).
    pub mib: f64,
    /// How long it holds (s).
    pub duration_s: f64,
}

/// The form of a [`Shape::Wave`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaveForm {
    /// Smooth.
    #[default]
    Sine,
    /// Linear up, linear down.
    Triangle,
    /// Half the period at each bound.
    Square,
    /// Linear up, then drop.
    Sawtooth,
}

/// What a guest's programs do with memory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkloadSpec {
    /// Work rate when the whole working set is resident (MiB touched per second).
    pub base_mib_s: f64,
    /// Share of the working set that is hot (%); 100 means every page is touched alike.
    pub hot_pct: f64,
    /// Share of accesses that go to the hot pages (%).
    pub hot_access_pct: f64,
    /// Anonymous working set (MiB over time).
    pub anon: Shape,
    /// Page-cache working set: file data read again and again (MiB over time).
    pub file: Shape,
    /// Anonymous memory allocated and touched once, then idle (MiB).
    pub idle_mib: f64,
    /// When the idle region is allocated (s).
    pub idle_at_s: f64,
    /// Anonymous memory committed up front (a JVM's heap, MiB): in Committed_AS while the
    /// workload runs, it holds pages only as the anonymous working set and idle region
    /// grow into it.
    pub heap_mib: f64,
    /// The working-set sizes change only every `hold_s` seconds (one memknobs run per
    /// size); 0 follows the shapes every tick.
    pub hold_s: f64,
    /// At every change (every `hold_s`), free the anonymous working set and allocate it
    /// afresh, as a new memknobs process does.
    pub restart: bool,
    /// Share of idle pages (idle anonymous memory, page cache outside the working set,
    /// free pages) identical across guests, that KSM can merge (%).
    pub shareable_pct: f64,
    /// After the guest's OOM killer kills the workload, it is started again this much
    /// later (s), as a service manager would; it does no work meanwhile.
    pub oom_restart_s: f64,
    /// Share of the work's time spent waiting on memory with everything in DRAM (%): how
    /// much slower tier memory slows it (only with a scenario's `[tiers]`).
    pub memory_bound_pct: f64,
}

impl Default for WorkloadSpec {
    fn default() -> Self {
        WorkloadSpec {
            base_mib_s: 1024.0,
            hot_pct: 100.0,
            hot_access_pct: 100.0,
            anon: Shape::default(),
            file: Shape::default(),
            idle_mib: 0.0,
            idle_at_s: 0.0,
            heap_mib: 0.0,
            hold_s: 0.0,
            restart: false,
            shareable_pct: 0.0,
            oom_restart_s: 30.0,
            memory_bound_pct: 25.0,
        }
    }
}

impl Shape {
    /// Check the shape of a run of ticks of `tick_s`, naming the first bad field under
    /// `at`.
    pub fn validate(&self, at: &str, tick_s: f64) -> Result<(), (String, String)> {
        let err = |f: &str, m: &str| Err((format!("{at}.{f}"), m.to_string()));
        let size_ok = |v: f64| v.is_finite() && v >= 0.0;
        match self {
            Shape::Const { mib } if !size_ok(*mib) => err("mib", "must be a size ≥ 0"),
            Shape::Const { .. } => Ok(()),
            Shape::Phases { phases, .. } => {
                if phases.is_empty() {
                    return err("phases", "needs at least one phase");
                }
                for (i, p) in phases.iter().enumerate() {
                    if !size_ok(p.mib) {
                        return err(&format!("phases[{i}].mib"), "must be a size ≥ 0");
                    }
                    if !(p.duration_s.is_finite() && p.duration_s > 0.0) {
                        return err(&format!("phases[{i}].duration_s"), ABOVE_ZERO);
                    }
                }
                Ok(())
            }
            Shape::Wave {
                min_mib,
                max_mib,
                period_s,
                phase_s,
                ..
            } => {
                if !size_ok(*min_mib) {
                    err("min_mib", "must be a size ≥ 0")
                } else if !(max_mib.is_finite() && max_mib >= min_mib) {
                    err("max_mib", "must be at least min_mib")
                } else if !(period_s.is_finite() && *period_s > 0.0) {
                    err("period_s", ABOVE_ZERO)
                } else if !phase_s.is_finite() {
                    err("phase_s", "must be a number")
                } else {
                    Ok(())
                }
            }
            Shape::Walk {
                min_mib,
                max_mib,
                step_mib,
                every_s,
                start_mib,
            } => {
                if !size_ok(*min_mib) {
                    err("min_mib", "must be a size ≥ 0")
                } else if !(max_mib.is_finite() && max_mib >= min_mib) {
                    err("max_mib", "must be at least min_mib")
                } else if !size_ok(*step_mib) {
                    err("step_mib", "must be a size ≥ 0")
                } else if !(every_s.is_finite() && *every_s >= MIN_STEP_S) {
                    err("every_s", "must be a number of seconds, at least 0.001")
                } else if *every_s < tick_s / 1000.0 {
                    // Its steps are taken one by one: a thousand a tick at most.
                    err("every_s", "must be at least a thousandth of tick_s")
                } else if start_mib.is_some_and(|s| !(s >= *min_mib && s <= *max_mib)) {
                    err("start_mib", "must be within min_mib and max_mib")
                } else {
                    Ok(())
                }
            }
            Shape::Trace { points } => {
                if points.is_empty() {
                    return err("points", "needs at least one point");
                }
                for (i, [t, mib]) in points.iter().enumerate() {
                    if !t.is_finite() || (i > 0 && *t <= points[i - 1][0]) {
                        return err(&format!("points[{i}]"), "times must increase");
                    }
                    if !size_ok(*mib) {
                        return err(&format!("points[{i}]"), "size must be ≥ 0");
                    }
                }
                Ok(())
            }
        }
    }
}

/// A shape being followed: its random choices are made once, at the start.
#[derive(Clone, Debug)]
struct ShapeState {
    shape: Shape,
    phase_s: f64,
    walk_mib: f64,
    walk_next_s: f64,
}

impl ShapeState {
    fn new(shape: &Shape, rng: &mut Rng) -> Self {
        let (phase_s, walk_mib, walk_next_s) = match shape {
            Shape::Wave {
                period_s,
                phase_s,
                random_phase,
                ..
            } => {
                let phase = if *random_phase {
                    rng.unit() * period_s
                } else {
                    *phase_s
                };
                (phase, 0.0, 0.0)
            }
            Shape::Walk {
                min_mib,
                max_mib,
                every_s,
                start_mib,
                ..
            } => {
                let start = start_mib.unwrap_or_else(|| min_mib + rng.unit() * (max_mib - min_mib));
                (0.0, start, *every_s)
            }
            _ => (0.0, 0.0, 0.0),
        };
        ShapeState {
            shape: shape.clone(),
            phase_s,
            walk_mib,
            walk_next_s,
        }
    }

    /// The size at time `t` (s, not decreasing from call to call), in MiB.
    fn mib_at(&mut self, t: f64, rng: &mut Rng) -> f64 {
        match &self.shape {
            Shape::Const { mib } => *mib,
            Shape::Phases { phases, repeat } => {
                let total: f64 = phases.iter().map(|p| p.duration_s).sum();
                let mut at = if *repeat { t.rem_euclid(total) } else { t };
                for p in phases {
                    if at < p.duration_s {
                        return p.mib;
                    }
                    at -= p.duration_s;
                }
                phases.last().map_or(0.0, |p| p.mib)
            }
            Shape::Wave {
                form,
                min_mib,
                max_mib,
                period_s,
                ..
            } => {
                let x = ((t + self.phase_s) / period_s).rem_euclid(1.0);
                let level = match form {
                    WaveForm::Sine => 0.5 - 0.5 * (2.0 * std::f64::consts::PI * x).cos(),
                    WaveForm::Triangle => 1.0 - (2.0 * x - 1.0).abs(),
                    WaveForm::Square => f64::from(u8::from(x >= 0.5)),
                    WaveForm::Sawtooth => x,
                };
                min_mib + level * (max_mib - min_mib)
            }
            Shape::Walk {
                min_mib,
                max_mib,
                step_mib,
                every_s,
                ..
            } => {
                while t >= self.walk_next_s {
                    let step = if rng.unit() < 0.5 {
                        -step_mib
                    } else {
                        *step_mib
                    };
                    let mut next = self.walk_mib + step;
                    if next < *min_mib || next > *max_mib {
                        next = self.walk_mib - step;
                    }
                    self.walk_mib = next.clamp(*min_mib, *max_mib);
                    self.walk_next_s += every_s;
                }
                self.walk_mib
            }
            Shape::Trace { points } => {
                let i = points.partition_point(|p| p[0] <= t);
                match (i.checked_sub(1).map(|j| points[j]), points.get(i)) {
                    (None, Some(first)) => first[1],
                    (Some(last), None) => last[1],
                    (Some([t0, m0]), Some([t1, m1])) => m0 + (m1 - m0) * (t - t0) / (t1 - t0),
                    (None, None) => 0.0,
                }
            }
        }
    }
}

/// What the workload wants resident this tick, in pages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Demand {
    /// Anonymous working set.
    pub anon: u64,
    /// Page-cache working set.
    pub file: u64,
    /// Idle anonymous region.
    pub idle: u64,
    /// Anonymous memory committed up front, touched only as the others grow into it.
    pub heap: u64,
    /// Free the anonymous working set and allocate it afresh.
    pub restart: bool,
    /// The workload is not running (killed, waiting to be restarted): it wants no memory
    /// and does no work.
    pub stopped: bool,
}

/// A workload being run.
#[derive(Clone, Debug)]
pub struct Workload {
    spec: WorkloadSpec,
    anon: ShapeState,
    file: ShapeState,
    next_change_s: f64,
    current: Demand,
    rng: Rng,
}

impl Workload {
    /// Start `spec`, making its random choices with `rng`.
    pub fn new(spec: &WorkloadSpec, mut rng: Rng) -> Self {
        let anon = ShapeState::new(&spec.anon, &mut rng);
        let file = ShapeState::new(&spec.file, &mut rng);
        let next_change_s = if spec.hold_s > 0.0 {
            rng.unit() * spec.hold_s
        } else {
            0.0
        };
        let mut w = Workload {
            spec: spec.clone(),
            anon,
            file,
            next_change_s,
            current: Demand::default(),
            rng,
        };
        w.current.anon = pages(w.anon.mib_at(0.0, &mut w.rng));
        w.current.file = pages(w.file.mib_at(0.0, &mut w.rng));
        w
    }

    /// The description being run.
    pub fn spec(&self) -> &WorkloadSpec {
        &self.spec
    }

    /// What the workload wants at time `t` (s); called once per tick with increasing `t`.
    pub fn demand(&mut self, t: f64) -> Demand {
        let mut restart = false;
        if self.spec.hold_s <= 0.0 || t >= self.next_change_s {
            self.current.anon = pages(self.anon.mib_at(t, &mut self.rng));
            self.current.file = pages(self.file.mib_at(t, &mut self.rng));
            if self.spec.hold_s > 0.0 {
                while self.next_change_s <= t {
                    self.next_change_s += self.spec.hold_s;
                }
                restart = self.spec.restart;
            }
        }
        self.current.idle = if t >= self.spec.idle_at_s {
            pages(self.spec.idle_mib)
        } else {
            0
        };
        self.current.heap = pages(self.spec.heap_mib);
        Demand {
            restart,
            ..self.current
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn follow(shape: Shape, times: &[f64]) -> Vec<f64> {
        let mut rng = Rng::new(1);
        let mut s = ShapeState::new(&shape, &mut rng);
        times.iter().map(|t| s.mib_at(*t, &mut rng)).collect()
    }

    #[test]
    fn phases_hold_and_repeat() {
        let phases = vec![
            Phase {
                mib: 100.0,
                duration_s: 10.0,
            },
            Phase {
                mib: 300.0,
                duration_s: 5.0,
            },
        ];
        let once = Shape::Phases {
            phases: phases.clone(),
            repeat: false,
        };
        assert_eq!(
            follow(once, &[0.0, 9.9, 10.0, 20.0]),
            [100.0, 100.0, 300.0, 300.0]
        );
        let again = Shape::Phases {
            phases,
            repeat: true,
        };
        assert_eq!(follow(again, &[15.0, 26.0]), [100.0, 300.0]);
    }

    #[test]
    fn waves_stay_within_bounds() {
        for form in [
            WaveForm::Sine,
            WaveForm::Triangle,
            WaveForm::Square,
            WaveForm::Sawtooth,
        ] {
            let w = Shape::Wave {
                form,
                min_mib: 200.0,
                max_mib: 600.0,
                period_s: 60.0,
                phase_s: 0.0,
                random_phase: true,
            };
            for v in follow(w, &(0..200).map(f64::from).collect::<Vec<_>>()) {
                assert!((200.0..=600.0).contains(&v), "{form:?} {v}");
            }
        }
        let sine = Shape::Wave {
            form: WaveForm::Sine,
            min_mib: 0.0,
            max_mib: 100.0,
            period_s: 40.0,
            phase_s: 0.0,
            random_phase: false,
        };
        assert_eq!(follow(sine, &[0.0, 20.0]), [0.0, 100.0]);
    }

    #[test]
    fn walk_moves_by_steps_within_bounds() {
        let w = Shape::Walk {
            min_mib: 100.0,
            max_mib: 300.0,
            step_mib: 50.0,
            every_s: 10.0,
            start_mib: Some(100.0),
        };
        let sizes = follow(w, &(0..100).map(|i| f64::from(i) * 5.0).collect::<Vec<_>>());
        assert_eq!(sizes[0], 100.0);
        for pair in sizes.windows(2) {
            assert!((pair[1] - pair[0]).abs() <= 50.0);
            assert!((100.0..=300.0).contains(&pair[1]));
        }
    }

    #[test]
    fn trace_interpolates_and_holds() {
        let t = Shape::Trace {
            points: vec![[10.0, 100.0], [20.0, 200.0]],
        };
        assert_eq!(follow(t, &[0.0, 15.0, 30.0]), [100.0, 150.0, 200.0]);
    }

    #[test]
    fn hold_and_restart_change_sizes_only_at_boundaries() {
        let spec = WorkloadSpec {
            anon: Shape::Trace {
                points: vec![[0.0, 0.0], [100.0, 100.0]],
            },
            hold_s: 10.0,
            restart: true,
            ..WorkloadSpec::default()
        };
        let mut w = Workload::new(&spec, Rng::new(2));
        let demands: Vec<Demand> = (0..40).map(|t| w.demand(f64::from(t))).collect();
        let restarts = demands.iter().filter(|d| d.restart).count();
        assert!((3..=5).contains(&restarts), "{restarts}");
        for pair in demands.windows(2) {
            if !pair[1].restart {
                assert_eq!(pair[0].anon, pair[1].anon);
            }
        }
    }

    #[test]
    fn validation_names_the_field() {
        let bad = Shape::Wave {
            form: WaveForm::Sine,
            min_mib: 10.0,
            max_mib: 5.0,
            period_s: 1.0,
            phase_s: 0.0,
            random_phase: false,
        };
        assert_eq!(
            bad.validate("vm[0].workload.anon", 1.0).unwrap_err().0,
            "vm[0].workload.anon.max_mib"
        );
    }
}
