//! Proxmox VE's VM configuration files (`/etc/pve/qemu-server/VMID.conf`): the memory
//! bounds and shares PVE's own auto-ballooning would use, so that memtide keeps them
//! when it manages the VM in PVE's place.
//!
//! The format (PVE's `qm.conf(5)`): `key: value` lines, `#` comments (the description),
//! and after the current configuration one `[section]` per snapshot, which is not read.
//! `memory` is the VM's size in MiB (PVE 8.3 and later may write `current=N`),
//! `balloon` the least it may be ballooned to (0: no balloon device), `shares` its
//! weight in PVE's auto-ballooning (default 1000; 0 turns PVE's auto-ballooning off for
//! the VM, which is how a VM is handed to memtide).

use memtide_core::Bytes;
use std::fmt;

/// A VM's memory settings in its PVE configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PveMemory {
    /// Its size (`memory`).
    pub memory: Bytes,
    /// The least PVE would balloon it to (`balloon`): its size when `balloon` is unset or
    /// 0, as PVE then never shrinks it.
    pub min: Bytes,
    /// Its weight when memory is divided (`shares`); `None` when it is 0, PVE's way to
    /// say that its own auto-ballooning leaves the VM alone, which says nothing of the
    /// VM's weight.
    pub shares: Option<u32>,
}

impl PveMemory {
    /// Whether PVE's own auto-ballooning (pvestatd) moves this VM's balloon: it may
    /// shrink it (`balloon` below `memory`) and `shares` is not 0.
    pub fn auto_ballooned(&self) -> bool {
        self.shares.is_some() && self.min < self.memory
    }
}

/// PVE's default size when `memory` is unset, and default shares.
const DEFAULT_MEMORY_MIB: u64 = 512;
const DEFAULT_SHARES: u32 = 1000;

/// Why a configuration cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PveError {
    /// The key.
    pub key: &'static str,
    /// Its value as written.
    pub value: String,
}

impl fmt::Display for PveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad {}: {:?}", self.key, self.value)
    }
}

impl std::error::Error for PveError {}

/// The memory settings of the current configuration in `text`.
pub fn memory(text: &str) -> Result<PveMemory, PveError> {
    let mut memory = None;
    let mut balloon = None;
    let mut shares = None;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            break; // a snapshot's configuration, not the VM's current one
        }
        let Some((key, value)) = line.split_once(':') else {
            continue; // comments and blank lines
        };
        let value = value.trim();
        match key.trim() {
            "memory" => memory = Some(mib("memory", memory_size(value))?),
            "balloon" => balloon = Some(mib("balloon", value)?),
            "shares" => {
                let bad = || PveError {
                    key: "shares",
                    value: value.to_string(),
                };
                let n: u32 = value.parse().map_err(|_| bad())?;
                shares = Some(if n <= 50_000 { n } else { return Err(bad()) });
            }
            _ => {}
        }
    }
    let memory = memory.unwrap_or(DEFAULT_MEMORY_MIB);
    let min = balloon.filter(|&b| b > 0).unwrap_or(memory).min(memory);
    Ok(PveMemory {
        memory: Bytes::from_mib(memory),
        min: Bytes::from_mib(min),
        shares: Some(shares.unwrap_or(DEFAULT_SHARES)).filter(|&n| n > 0),
    })
}

/// `memory`'s size: a number, or the `current=` property of PVE 8.3's property string.
fn memory_size(value: &str) -> &str {
    value
        .split(',')
        .find_map(|p| p.strip_prefix("current="))
        .unwrap_or(value)
}

/// A whole number of MiB, at most 16 TiB (PVE's own bound is lower).
fn mib(key: &'static str, value: &str) -> Result<u64, PveError> {
    value
        .parse()
        .ok()
        .filter(|&n: &u64| n <= 16 << 20)
        .ok_or_else(|| PveError {
            key,
            value: value.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONF: &str = "\
#web server
#  second description line: with a colon
boot: order=scsi0;net0
cores: 2
memory: 4096
balloon: 1024
shares: 2000
name: web1
scsi0: local-lvm:vm-101-disk-0,size=32G

[before-upgrade]
memory: 8192
balloon: 0
";

    #[test]
    fn the_current_configuration_gives_size_minimum_and_shares() {
        assert_eq!(
            memory(CONF).unwrap(),
            PveMemory {
                memory: Bytes::from_mib(4096),
                min: Bytes::from_mib(1024),
                shares: Some(2000),
            }
        );
    }

    #[test]
    fn without_a_balloon_minimum_the_vm_keeps_its_size() {
        for text in ["memory: 2048\n", "memory: 2048\nballoon: 0\n"] {
            let m = memory(text).unwrap();
            assert_eq!(
                (m.min, m.shares),
                (Bytes::from_mib(2048), Some(1000)),
                "{text}"
            );
        }
        let handed_over = memory("memory: 2048\nballoon: 512\nshares: 0\n").unwrap();
        assert_eq!(handed_over.shares, None, "PVE's auto-ballooning off");
        let m = memory("balloon: 256\n").unwrap();
        assert_eq!(
            (m.memory, m.min),
            (Bytes::from_mib(512), Bytes::from_mib(256))
        );
        let above = memory("memory: 1024\nballoon: 4096\n").unwrap();
        assert_eq!(above.min, Bytes::from_mib(1024), "never above the size");
    }

    #[test]
    fn pve_auto_balloons_a_vm_it_may_shrink_unless_its_shares_are_0() {
        for (text, auto) in [
            (CONF, true),
            ("memory: 2048\nballoon: 512\n", true), // PVE's default shares
            ("memory: 2048\nballoon: 512\nshares: 0\n", false),
            ("memory: 2048\n", false),
            ("memory: 2048\nballoon: 0\nshares: 500\n", false),
            ("memory: 2048\nballoon: 2048\n", false),
        ] {
            assert_eq!(memory(text).unwrap().auto_ballooned(), auto, "{text}");
        }
    }

    #[test]
    fn the_property_string_form_of_memory_is_read() {
        let m = memory("memory: current=3072\nballoon: 512\n").unwrap();
        assert_eq!(
            (m.memory, m.min),
            (Bytes::from_mib(3072), Bytes::from_mib(512))
        );
    }

    #[test]
    fn bad_values_are_refused_naming_the_key() {
        for (text, message) in [
            ("memory: 4G\n", "bad memory: \"4G\""),
            ("balloon: -1\n", "bad balloon: \"-1\""),
            ("shares: 50001\n", "bad shares: \"50001\""),
            ("shares: lots\n", "bad shares: \"lots\""),
            ("memory: 99999999999\n", "bad memory: \"99999999999\""),
        ] {
            assert_eq!(memory(text).unwrap_err().to_string(), message);
        }
    }
}
