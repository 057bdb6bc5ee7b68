//! What `memtide top` shows, apart from the terminal: each VM's latest figures and its
//! recent history, sorted and filtered as the user asked.

use crate::status::Status;
use memtide_core::decision::VmReport;
use memtide_core::Bytes;
use std::collections::{BTreeMap, VecDeque};

/// Points of history kept per VM (one per refresh), as many as its sparkline shows.
pub const HISTORY: usize = 30;

/// What the VM table is sorted by (`s` cycles through them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortKey {
    /// Name, A to Z.
    Name,
    /// Memory given (the balloon's actual size), most first.
    Given,
    /// Estimated working set, most first.
    WorkingSet,
    /// Host memory of its hypervisor process, most first.
    Rss,
    /// Guest swap-ins per second, most first.
    SwapIn,
}

impl SortKey {
    /// Its name in the header.
    pub fn name(self) -> &'static str {
        match self {
            SortKey::Name => "name",
            SortKey::Given => "actual",
            SortKey::WorkingSet => "estimate",
            SortKey::Rss => "host RSS",
            SortKey::SwapIn => "swap-in",
        }
    }

    fn next(self) -> SortKey {
        match self {
            SortKey::Name => SortKey::Given,
            SortKey::Given => SortKey::WorkingSet,
            SortKey::WorkingSet => SortKey::Rss,
            SortKey::Rss => SortKey::SwapIn,
            SortKey::SwapIn => SortKey::Name,
        }
    }
}

/// One point of a VM's history: what it was given and its estimated working set.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    /// The balloon's actual size.
    pub given: Option<Bytes>,
    /// The policy's working-set estimate.
    pub working_set: Option<Bytes>,
}

/// The state of the view.
#[derive(Debug)]
pub struct Top {
    /// The latest status, with every text escaped for the terminal.
    pub status: Option<Status>,
    /// Why the latest refresh failed, if it did.
    pub error: Option<String>,
    history: BTreeMap<String, VecDeque<Point>>,
    /// The sort order.
    pub sort: SortKey,
    /// Only VMs whose name contains this are shown.
    pub filter: String,
    /// The filter is being typed.
    pub editing: bool,
    /// The selected row.
    pub selected: usize,
}

impl Default for Top {
    fn default() -> Self {
        Top {
            status: None,
            error: None,
            history: BTreeMap::new(),
            sort: SortKey::Given,
            filter: String::new(),
            editing: false,
            selected: 0,
        }
    }
}

impl Top {
    /// Take in a new status: each VM's point is added to its history, departed VMs are
    /// forgotten.
    pub fn update(&mut self, status: Status) {
        let vms = status.decision.as_ref().map_or(&[][..], |d| &d.vms[..]);
        self.history
            .retain(|name, _| vms.iter().any(|v| &v.name == name));
        for vm in vms {
            let history = self.history.entry(vm.name.clone()).or_default();
            if history.len() == HISTORY {
                history.pop_front();
            }
            history.push_back(Point {
                given: vm.actual,
                working_set: vm.estimate,
            });
        }
        self.status = Some(status);
        self.error = None;
        self.selected = self.selected.min(self.vms().len().saturating_sub(1));
    }

    /// The VMs shown, filtered and sorted.
    pub fn vms(&self) -> Vec<&VmReport> {
        let Some(d) = self.status.as_ref().and_then(|s| s.decision.as_ref()) else {
            return Vec::new();
        };
        let mut vms: Vec<&VmReport> = d
            .vms
            .iter()
            .filter(|v| v.name.contains(self.filter.as_str()))
            .collect();
        let most_first = |f: fn(&VmReport) -> Option<f64>| {
            move |a: &&VmReport, b: &&VmReport| {
                f(b).partial_cmp(&f(a)).unwrap_or(std::cmp::Ordering::Equal)
            }
        };
        match self.sort {
            SortKey::Name => vms.sort_by(|a, b| a.name.cmp(&b.name)),
            SortKey::Given => vms.sort_by(most_first(|v| v.actual.map(Bytes::as_f64))),
            SortKey::WorkingSet => vms.sort_by(most_first(|v| v.estimate.map(Bytes::as_f64))),
            SortKey::Rss => vms.sort_by(most_first(|v| v.rss.map(Bytes::as_f64))),
            SortKey::SwapIn => vms.sort_by(most_first(|v| v.swap_in_per_s)),
        }
        vms
    }

    /// The VMs memtide knows and is not connected to (`memtide status`'s "not
    /// connected"), by name, each once, filtered as the table is: not those connected
    /// under another endpoint, nor those hibernated.
    pub fn not_connected(&self) -> Vec<&str> {
        let Some(s) = &self.status else {
            return Vec::new();
        };
        let names = s.out_of_reach().into_keys();
        names.filter(|n| n.contains(self.filter.as_str())).collect()
    }

    /// A VM's history, oldest first.
    pub fn history(&self, name: &str) -> impl Iterator<Item = &Point> {
        self.history.get(name).into_iter().flatten()
    }

    /// Sort by the next key.
    pub fn next_sort(&mut self) {
        self.sort = self.sort.next();
    }

    /// Move the selection by `delta` rows, within the table.
    pub fn select(&mut self, delta: isize) {
        let last = self.vms().len().saturating_sub(1);
        self.selected = self.selected.saturating_add_signed(delta).min(last);
    }

    /// The selected VM, if any is shown.
    pub fn selected_vm(&self) -> Option<&VmReport> {
        self.vms().get(self.selected).copied()
    }
}

/// `points` as a line of block characters, one per point, each as high as what the VM
/// was given against `full` (its configured size), and whether each point's working set
/// exceeded what it was given (the guest was short).
pub fn sparkline(points: &[Point], full: Bytes) -> Vec<(char, bool)> {
    const BLOCKS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    points
        .iter()
        .map(|p| {
            let given = p.given.unwrap_or_default();
            let share = given.as_f64() / full.as_f64().max(1.0);
            let block = BLOCKS[((share * 8.0).ceil() as usize).clamp(1, 8) - 1];
            let short = p.working_set.is_some_and(|ws| ws > given);
            (block, short)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use memtide_core::policy::mom::Mom;
    use memtide_core::testkit::{host, snapshot, vm};
    use memtide_core::{Engine, EngineConfig};

    fn status(vms: &[(&str, u64)]) -> Status {
        let mut engine = Engine::new(EngineConfig::default(), Box::<Mom>::default());
        let vms = vms
            .iter()
            .map(|(name, actual)| vm(name, 1000, *actual, 100))
            .collect();
        Status {
            decision: Some(engine.tick(&snapshot(0, host(8000, 4000), vms))),
            ..Status::default()
        }
    }

    fn names(top: &Top) -> Vec<&str> {
        top.vms().iter().map(|v| v.name.as_str()).collect()
    }

    #[test]
    fn vms_are_sorted_by_the_chosen_key_and_filtered_by_name() {
        let mut top = Top::default();
        top.update(status(&[("web-1", 300), ("db", 900), ("web-2", 600)]));
        assert_eq!(top.sort, SortKey::Given);
        assert_eq!(names(&top), ["db", "web-2", "web-1"]);
        top.sort = SortKey::Name;
        assert_eq!(names(&top), ["db", "web-1", "web-2"]);
        top.filter = "web".into();
        assert_eq!(names(&top), ["web-1", "web-2"]);
        top.filter = "nothing".into();
        assert!(top.vms().is_empty() && top.selected_vm().is_none());
    }

    #[test]
    fn vms_not_connected_are_named_once_and_filtered() {
        let mut top = Top::default();
        let mut s = status(&[("web-1", 300)]);
        let waiting = |name: &str, endpoint: &str| crate::daemon::fleet::Waiting {
            name: name.into(),
            endpoint: endpoint.into(),
            error: None,
            left_alone: false,
            retry_in_s: 1.0,
        };
        s.waiting = vec![
            waiting("web-2", "/a"),
            waiting("db", "/b"),
            waiting("web-2", "/c"),
            // Connected under its other endpoint; hibernated.
            waiting("web-1", "/d"),
            waiting("idle", "/e"),
        ];
        s.hibernated = vec![crate::status::Hibernated {
            vm: "idle".into(),
            id: "1".into(),
            since: "2026-12-02T06:00:00Z".into(),
            configured: Bytes::from_mib(512),
        }];
        top.update(s);
        assert_eq!(top.not_connected(), ["db", "web-2"]);
        top.filter = "web".into();
        assert_eq!(top.not_connected(), ["web-2"]);
    }

    #[test]
    fn sort_keys_cycle_and_the_selection_stays_in_the_table() {
        let mut top = Top::default();
        top.update(status(&[("a", 300), ("b", 900)]));
        let mut seen = vec![top.sort];
        for _ in 0..5 {
            top.next_sort();
            seen.push(top.sort);
        }
        assert_eq!(seen.first(), seen.last());
        assert_eq!(seen.len() - 1, 5, "five keys before the first comes back");
        top.select(5);
        assert_eq!(top.selected, 1);
        top.select(-9);
        assert_eq!(top.selected, 0);
        top.select(1);
        top.update(status(&[("a", 300)]));
        assert_eq!(top.selected, 0, "a departed VM's row is not selected");
    }

    #[test]
    fn history_is_kept_per_vm_bounded_and_forgotten_when_it_leaves() {
        let mut top = Top::default();
        for i in 0..HISTORY as u64 + 5 {
            top.update(status(&[("a", 100 + i), ("b", 500)]));
        }
        let a: Vec<_> = top.history("a").collect();
        assert_eq!(a.len(), HISTORY);
        assert_eq!(
            a.last().unwrap().given,
            Some(Bytes::from_mib(100 + HISTORY as u64 + 4))
        );
        top.update(status(&[("a", 100)]));
        assert_eq!(top.history("b").count(), 0);
    }

    #[test]
    fn the_sparkline_shows_what_was_given_and_when_the_guest_was_short() {
        let point = |given, ws: Option<u64>| Point {
            given: Some(Bytes::from_mib(given)),
            working_set: ws.map(Bytes::from_mib),
        };
        let line = sparkline(
            &[
                point(1000, None),
                point(500, Some(400)),
                point(100, Some(300)),
                point(0, None),
            ],
            Bytes::from_mib(1000),
        );
        assert_eq!(
            line,
            [('█', false), ('▄', false), ('▁', true), ('▁', false)]
        );
    }
}
