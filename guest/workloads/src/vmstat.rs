//! Counters of the kernel's `/proc/vmstat`, e.g. `workingset_refault_file`:
//! page cache pages read back in shortly after being evicted.

use std::fs;

/// The counter of evicted page cache pages read back in.
pub const REFAULT_FILE: &str = "workingset_refault_file";

/// The change of one counter between successive reads.
pub struct Counter {
    name: &'static str,
    last: Option<u64>,
}

impl Counter {
    /// Starts counting from the counter's current value.
    pub fn new(name: &'static str) -> Counter {
        Counter {
            name,
            last: read(name),
        }
    }

    /// How much the counter grew since the previous call (or `new`); `None`
    /// when it cannot be read now or could not be then.
    pub fn delta(&mut self) -> Option<u64> {
        let now = read(self.name);
        let delta = now
            .zip(self.last)
            .map(|(now, then)| now.saturating_sub(then));
        self.last = now.or(self.last);
        delta
    }
}

/// The guest-wide value of counter `name`, `None` when unreadable or absent.
fn read(name: &str) -> Option<u64> {
    find(&fs::read_to_string("/proc/vmstat").ok()?, name)
}

fn find(vmstat: &str, name: &str) -> Option<u64> {
    vmstat.lines().find_map(|line| {
        let (key, value) = line.split_once(' ')?;
        (key == name).then(|| value.trim().parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_counters_by_exact_name() {
        let vmstat = "workingset_refault_anon 3\nworkingset_refault_file 42\npgfault 7\n";
        assert_eq!(find(vmstat, REFAULT_FILE), Some(42));
        assert_eq!(find(vmstat, "pgfault"), Some(7));
        assert_eq!(find(vmstat, "workingset_refault"), None);
        assert_eq!(find("pgfault x\n", "pgfault"), None);
    }

    #[test]
    fn reads_this_kernel_and_counts_growth() {
        assert!(read("pgfault").is_some());
        assert!(Counter::new("pgfault").delta().is_some());
        assert_eq!(Counter::new("no_such_counter").delta(), None);
    }
}
