//! Guest RAM put back in huge pages after a balloon or a virtio-mem device gave memory
//! back (`[host] restore_huge_pages`): which VMs are due (memtide-core's [`Restore`]), and one pass
//! over them (memtide-adapters' `hugepages`), run off the runtime as reclaim's passes.
//! A dry run counts what a pass would ask for and collapses nothing.

use memtide_adapters::access::Mappings;
use memtide_adapters::hugepages::{self as io, CollapseError, Collapsed, Sizes};
use memtide_core::Bytes;
use std::path::Path;

pub use memtide_core::hugepages::{Bound, Restore};

/// A VM to collapse the guest RAM of.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    /// Its name.
    pub vm: String,
    /// Its hypervisor's process.
    pub pid: i32,
    /// And that process's start time when it became known: a process with another at
    /// the pid is not its hypervisor.
    pub started: u64,
    /// Its guest RAM's mappings.
    pub mappings: Mappings,
    /// Where in it the pass starts, and how much it may ask for.
    pub bound: Bound,
}

/// What a pass did for one VM.
#[derive(Debug)]
pub struct Outcome {
    /// The VM.
    pub vm: String,
    /// A dry run: nothing was collapsed.
    pub dry_run: bool,
    /// What came of it.
    pub done: Result<Collapsed, CollapseError>,
}

impl Outcome {
    /// Its event: kind, the action's result (`None`: no action, a process not the VM's
    /// skipped), the net change of the process's memory in huge pages, and the message;
    /// `None` when the pass changed nothing (or would not).
    pub fn event(&self) -> Option<(&'static str, Option<&'static str>, Bytes, String)> {
        match &self.done {
            Ok(c) if self.dry_run => (c.asked > 0).then(|| {
                let what = format!(
                    "would ask {} ranges of the guest RAM, each resident and the \
                     hypervisor's alone, to be in huge pages (dry run)",
                    c.asked
                );
                ("action", Some("dry_run"), Bytes::ZERO, what)
            }),
            Ok(c) if c.refused == 0 && c.huge_after <= c.huge_before => None,
            Ok(c) => {
                let gained = Bytes(c.huge_after.0.saturating_sub(c.huge_before.0));
                let what = format!(
                    "huge pages: {} ranges of the guest RAM, each resident and the \
                     hypervisor's alone, asked to be in huge pages (those already were are \
                     left as they are); its memory in huge pages {} -> {} (memory had been \
                     given back to the guest)",
                    c.asked - c.refused,
                    c.huge_before,
                    c.huge_after
                );
                match c.refused {
                    0 => Some(("action", Some("ok"), gained, what)),
                    n => Some((
                        "action",
                        Some("partly"),
                        gained,
                        format!("{what}; {n} the kernel could not collapse now"),
                    )),
                }
            }
            Err(e @ CollapseError::Replaced(_)) => Some((
                "huge_pages_skipped",
                None,
                Bytes::ZERO,
                format!("huge pages: {e}"),
            )),
            Err(e) => Some((
                "action_failed",
                Some("error"),
                Bytes::ZERO,
                format!("huge pages: {e}"),
            )),
        }
    }

    /// Whether the host cannot do it at all (no CAP_SYS_NICE): no pass will do better.
    pub fn unsupported(&self) -> bool {
        matches!(self.done, Err(CollapseError::Unsupported(_)))
    }
}

/// One pass over `targets` (blocking: it reads each one's page map and the kernel copies
/// the ranges it collapses), with the host's page `sizes`; a `dry_run` only counts them.
pub fn pass(proc: &Path, sizes: Sizes, targets: &[Target], dry_run: bool) -> Vec<Outcome> {
    targets
        .iter()
        .map(|t| Outcome {
            vm: t.vm.clone(),
            dry_run,
            done: io::collapse_resident(
                proc,
                t.pid,
                t.started,
                &t.mappings,
                sizes,
                t.bound,
                dry_run,
            ),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_outcome_says_what_was_collapsed_or_why_not() {
        let c = |asked, refused| Collapsed {
            asked,
            refused,
            huge_before: Bytes::from_mib(100),
            huge_after: Bytes::from_mib(300),
            next: None,
        };
        let outcome = |done| Outcome {
            vm: "a".into(),
            dry_run: false,
            done,
        };
        let (kind, result, gained, message) = outcome(Ok(c(100, 0))).event().unwrap();
        assert_eq!(
            (kind, result, gained),
            ("action", Some("ok"), Bytes::from_mib(200))
        );
        assert!(message.contains("100 ranges of the guest RAM"), "{message}");
        let (_, result, _, message) = outcome(Ok(c(100, 3))).event().unwrap();
        assert_eq!(result, Some("partly"));
        assert!(
            message.contains("97 ranges") && message.contains("3 the kernel"),
            "{message}"
        );
        let refused = outcome(Err(CollapseError::Unsupported(
            "advice to another process refused: memtide needs CAP_SYS_NICE".into(),
        )));
        assert!(refused.unsupported());
        let (kind, result, _, message) = refused.event().unwrap();
        assert_eq!((kind, result), ("action_failed", Some("error")));
        assert!(message.contains("CAP_SYS_NICE"), "{message}");
    }

    #[test]
    fn a_dry_run_says_what_it_would_collapse() {
        let found = |asked| Collapsed {
            asked,
            ..Collapsed::default()
        };
        let outcome = |done| Outcome {
            vm: "a".into(),
            dry_run: true,
            done: Ok(done),
        };
        let (kind, result, gained, message) = outcome(found(40)).event().unwrap();
        assert_eq!(
            (kind, result, gained),
            ("action", Some("dry_run"), Bytes::ZERO)
        );
        assert!(
            message.starts_with("would ask 40 ranges") && message.ends_with("(dry run)"),
            "{message}"
        );
        assert!(
            outcome(found(0)).event().is_none(),
            "nothing would be asked"
        );
    }

    /// A process with another start time at the VM's pid is skipped with a diagnostic,
    /// not counted as an action, and does not turn the passes off.
    #[test]
    fn a_process_that_took_the_pid_is_skipped() {
        let (proc, me) = (Path::new("/proc"), std::process::id() as i32);
        let started = memtide_adapters::procfs::start_time(proc, me).unwrap();
        let targets = [Target {
            vm: "a".into(),
            pid: me,
            started: started + 1,
            mappings: Mappings::GuestRam(vec![Bytes::from_mib(384)]),
            bound: Bound { from: 0, ranges: 1 },
        }];
        let sizes = Sizes {
            page: 4096,
            huge: 2 << 20,
        };
        let out = pass(proc, sizes, &targets, false);
        assert!(!out[0].unsupported());
        let (kind, result, _, message) = out[0].event().unwrap();
        assert_eq!((kind, result), ("huge_pages_skipped", None));
        assert!(message.contains("pid was reused"), "{message}");
    }

    #[test]
    fn a_pass_over_a_process_that_is_gone_reports_it_and_goes_on() {
        let targets = [Target {
            vm: "gone".into(),
            pid: i32::MAX,
            started: 1,
            mappings: Mappings::GuestRam(vec![Bytes::from_mib(384)]),
            bound: Bound { from: 0, ranges: 1 },
        }];
        let sizes = Sizes {
            page: 4096,
            huge: 2 << 20,
        };
        let out = pass(Path::new("/proc"), sizes, &targets, false);
        assert_eq!(out.len(), 1);
        assert!(
            out[0].done.is_err() && !out[0].unsupported(),
            "one VM's error only"
        );
    }
}
