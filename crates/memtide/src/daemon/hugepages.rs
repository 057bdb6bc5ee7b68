//! Guest RAM put back in huge pages after a balloon gave memory back (`[host]
//! restore_huge_pages`): which VMs are due (memtide-core's [`Restore`]), and one pass
//! over them (memtide-adapters' `hugepages`), run off the runtime as reclaim's passes.

use memtide_adapters::access::Mappings;
use memtide_adapters::hugepages::{self as io, CollapseError, Collapsed};
use memtide_core::Bytes;
use std::path::Path;

pub use memtide_core::hugepages::Restore;

/// A VM to collapse the guest RAM of.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    /// Its name.
    pub vm: String,
    /// Its hypervisor's process.
    pub pid: i32,
    /// Its guest RAM's size, which picks the mapping.
    pub configured: Bytes,
}

/// What a pass did for one VM.
#[derive(Debug)]
pub struct Outcome {
    /// The VM.
    pub vm: String,
    /// What came of it.
    pub done: Result<Collapsed, CollapseError>,
}

impl Outcome {
    /// Its event: kind, result, the memory newly in huge pages, and the message; `None`
    /// when the pass found nothing to collapse.
    pub fn event(&self) -> Option<(&'static str, &'static str, Bytes, String)> {
        match &self.done {
            Ok(c) if c.asked == 0 => None,
            Ok(c) => {
                let gained = Bytes(c.huge_after.0.saturating_sub(c.huge_before.0));
                let what = format!(
                    "huge pages: the guest RAM's {} fully resident 2 MiB ranges collapsed \
                     (those already huge left as they were), its memory in huge pages {} -> \
                     {} (the balloon had given memory back)",
                    c.asked - c.refused,
                    c.huge_before,
                    c.huge_after
                );
                match c.refused {
                    0 => Some(("action", "ok", gained, what)),
                    n => Some((
                        "action",
                        "partly",
                        gained,
                        format!("{what}; {n} the kernel could not collapse now"),
                    )),
                }
            }
            Err(e) => Some((
                "action_failed",
                "error",
                Bytes::ZERO,
                format!("huge pages: {e}"),
            )),
        }
    }

    /// Whether the kernel refuses the advice itself: no pass will do better.
    pub fn refused(&self) -> bool {
        matches!(self.done, Err(CollapseError::Refused(_)))
    }
}

/// One pass over `targets` (blocking: it reads each one's page map and the kernel copies
/// the ranges it collapses).
pub fn pass(proc: &Path, targets: &[Target]) -> Vec<Outcome> {
    targets
        .iter()
        .map(|t| Outcome {
            vm: t.vm.clone(),
            done: io::collapse_resident(proc, t.pid, Mappings::GuestRam(t.configured)),
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
        };
        let outcome = |done| Outcome {
            vm: "a".into(),
            done,
        };
        assert!(
            outcome(Ok(c(0, 0))).event().is_none(),
            "nothing resident to do"
        );
        let (kind, result, gained, message) = outcome(Ok(c(100, 0))).event().unwrap();
        assert_eq!(
            (kind, result, gained),
            ("action", "ok", Bytes::from_mib(200))
        );
        assert!(
            message.contains("100 fully resident 2 MiB ranges"),
            "{message}"
        );
        let (_, result, _, message) = outcome(Ok(c(100, 3))).event().unwrap();
        assert_eq!(result, "partly");
        assert!(
            message.contains("97 fully resident") && message.contains("3 the kernel"),
            "{message}"
        );
        let refused = outcome(Err(CollapseError::Refused(
            std::io::Error::from_raw_os_error(libc::EPERM),
        )));
        assert!(refused.refused());
        let (kind, result, _, message) = refused.event().unwrap();
        assert_eq!((kind, result), ("action_failed", "error"));
        assert!(message.contains("CAP_SYS_NICE"), "{message}");
    }

    #[test]
    fn a_pass_over_a_process_that_is_gone_reports_it_and_goes_on() {
        let targets = [Target {
            vm: "gone".into(),
            pid: i32::MAX,
            configured: Bytes::from_mib(384),
        }];
        let out = pass(Path::new("/proc"), &targets);
        assert_eq!(out.len(), 1);
        assert!(out[0].done.is_err() && !out[0].refused());
    }
}
