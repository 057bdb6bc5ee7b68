//! virtio-mem, whichever way the hypervisor is reached (QMP, libvirt): memory plugged into
//! a guest in blocks beyond its base memory.
//!
//! memtide's policies ask for one size per VM. Where a VM has a virtio-mem device, the
//! whole blocks above the base memory are plugged or unplugged (no pages pinned in the
//! guest, memory really leaves it), and the balloon takes the remainder below a block.
//! QEMU's balloon works on the base memory alone (`actual` and the `balloon` command
//! leave virtio-mem memory out, checked with QEMU 7.2; libvirt's `ACTUAL_BALLOON` and
//! `virDomainSetMemoryFlags` are the same numbers, checked with libvirt 9.0), so the
//! logical size is the balloon's `actual` plus what is plugged, and the balloon is sent
//! the target less what is to be plugged — which does not depend on how far the guest has
//! got with (un)plugging (about 0.2 s to plug and 0.9 s to unplug 256 MiB here).

use memtide_core::stats::GuestStats;
use memtide_core::{Bytes, VirtioMem};

/// A virtio-mem device's sizes.
#[derive(Debug, Clone, PartialEq)]
pub struct Device {
    /// Memory plugged now.
    pub plugged: Bytes,
    /// Memory asked for.
    pub requested: Bytes,
    /// The most that can be plugged.
    pub max: Bytes,
    /// Plugging granularity.
    pub block: Bytes,
}

/// How a logical size is met: what the device is asked to plug and what the balloon is
/// sent (relative to the base memory).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Resize {
    /// The device's requested size: whole blocks, never less than needed, within its
    /// maximum.
    pub plug: Bytes,
    /// The balloon's target: the rest, at most the base memory.
    pub balloon: Bytes,
}

/// How to reach a logical size of `target` over `base` memory with device `d`.
pub fn resize(target: Bytes, base: Bytes, d: &Device) -> Resize {
    let above = (target - base).0;
    let plug = Bytes(above.div_ceil(d.block.0).saturating_mul(d.block.0)).min(d.max);
    Resize {
        plug,
        balloon: (target - plug).min(base),
    }
}

/// What memtide learns about a VM's virtio-mem device from sample to sample, to tell
/// plugged memory the guest never onlined: the base memory the guest's MemTotal does not
/// show (the kernel's own), learnt while nothing is plugged, and since when the plugged
/// size and the balloon have stood still.
#[derive(Debug, Default)]
pub struct Follower {
    kernel_gap: Option<Bytes>,
    /// The plugged size and balloon last seen, and since when (host seconds since the
    /// epoch): the guest's statistics say something about them only once updated after.
    sizes_seen: Option<((Bytes, Bytes), u64)>,
}

impl Follower {
    /// The VM's logical size (the balloon's `actual`, or all of `base` without a balloon,
    /// plus what is plugged) and the device's state. The guest's MemTotal counts only
    /// from statistics updated at least 2 s after the plugged size or the balloon last
    /// moved (they are polled at an interval; the guest onlines new blocks a moment
    /// after). `deflate_on_oom`: the balloon gives memory back when the guest runs out,
    /// and its pages then stay in the guest's MemTotal.
    pub fn follow(
        &mut self,
        device: &Device,
        base: Bytes,
        actual: Option<Bytes>,
        deflate_on_oom: bool,
        stats: &GuestStats,
    ) -> (Bytes, VirtioMem) {
        let ballooned = base - actual.unwrap_or(base);
        let sizes = (device.plugged, ballooned);
        let since = match self.sizes_seen {
            Some((seen, since)) if seen == sizes => since,
            _ => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                self.sizes_seen = Some((sizes, now));
                now
            }
        };
        let guest_total = stats
            .total
            .filter(|_| stats.last_update.is_some_and(|t| t >= since + 2));
        let visible = if deflate_on_oom {
            base
        } else {
            base - ballooned
        };
        if device.plugged == Bytes::ZERO && device.requested == Bytes::ZERO {
            if let Some(total) = guest_total {
                self.kernel_gap = Some(visible - total);
            }
        }
        let state = state(device, visible, guest_total, self.kernel_gap);
        (base - ballooned + device.plugged, state)
    }
}

/// The sample's view of the device. `offline` is the plugged memory missing from the
/// guest's MemTotal: `base` (the base memory the guest should see: less what the balloon
/// holds, where the balloon takes it out of MemTotal) + plugged − MemTotal, less the
/// kernel's own share (`gap`, learnt while nothing was plugged; until then assumed as
/// large as half the base — it grows with `maxmem`, 26 MiB of 256 MiB without and 102 MiB
/// with `maxmem=1G` here — so that no verdict is a false alarm). No verdict while
/// (un)plugging is under way or without the guest's MemTotal.
fn state(d: &Device, base: Bytes, guest_total: Option<Bytes>, gap: Option<Bytes>) -> VirtioMem {
    let offline = guest_total
        .filter(|_| d.plugged == d.requested)
        .map(|total| ((base + d.plugged) - total) - gap.unwrap_or(Bytes(base.0 / 2)));
    VirtioMem {
        plugged: d.plugged,
        requested: d.requested,
        max: d.max,
        offline,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 512 MiB device with 2 MiB blocks, `plugged` of it plugged and asked for.
    fn device(plugged: u64) -> Device {
        Device {
            plugged: Bytes::from_mib(plugged),
            requested: Bytes::from_mib(plugged),
            max: Bytes::from_mib(512),
            block: Bytes::from_mib(2),
        }
    }

    #[test]
    fn plugs_whole_blocks_and_leaves_the_rest_to_the_balloon() {
        let (d, base) = (device(0), Bytes::from_mib(256));
        let mib = |target| resize(Bytes::from_mib(target), base, &d);
        assert_eq!(
            mib(200),
            Resize {
                plug: Bytes::ZERO,
                balloon: Bytes::from_mib(200)
            },
            "below base: balloon only"
        );
        assert_eq!(
            mib(301),
            Resize {
                plug: Bytes::from_mib(46),
                balloon: Bytes::from_mib(255)
            },
            "45 MiB rounds up to 46"
        );
        assert_eq!(
            mib(4096),
            Resize {
                plug: Bytes::from_mib(512),
                balloon: base
            },
            "at most the maximum, and the balloon at most the base"
        );
    }

    #[test]
    fn memory_the_guest_did_not_online_is_reported() {
        let mut d = device(256);
        let (base, gap) = (Bytes::from_mib(256), Some(Bytes::from_mib(26)));
        let offline =
            |d: &Device, total: u64, gap| state(d, base, Some(Bytes::from_mib(total)), gap).offline;
        // A 256 MiB guest shows 230 MiB; with 256 MiB plugged and onlined, 486.
        assert_eq!(offline(&d, 486, gap), Some(Bytes::ZERO), "onlined");
        assert_eq!(
            offline(&d, 230, gap),
            Some(Bytes::from_mib(256)),
            "never onlined"
        );
        assert_eq!(
            offline(&d, 230, None),
            Some(Bytes::from_mib(154)),
            "gap assumed 128 MiB"
        );
        assert_eq!(
            offline(&d, 384, None),
            Some(Bytes::ZERO),
            "onlined, with a gap of 128 MiB: no alarm"
        );
        d.requested = Bytes::from_mib(512);
        assert_eq!(offline(&d, 230, gap), None, "still plugging: no verdict");
    }

    /// Follow `device(plugged)` over 256 MiB of base memory with the balloon's `actual`,
    /// `deflate_on_oom` and a guest MemTotal of `total`, in statistics updated at
    /// `last_update`: the logical size and the memory not onlined, in MiB.
    fn follow(
        f: &mut Follower,
        (plugged, actual, deflate_on_oom): (u64, Option<u64>, bool),
        (total, last_update): (u64, u64),
    ) -> (u64, Option<u64>) {
        let stats = GuestStats {
            total: Some(Bytes::from_mib(total)),
            last_update: Some(last_update),
            ..GuestStats::default()
        };
        let actual = actual.map(Bytes::from_mib);
        let (size, state) = f.follow(
            &device(plugged),
            Bytes::from_mib(256),
            actual,
            deflate_on_oom,
            &stats,
        );
        (size.0 >> 20, state.offline.map(|b| b.0 >> 20))
    }

    #[test]
    fn the_logical_size_adds_what_is_plugged_and_the_kernel_share_is_learnt() {
        let (mut f, fresh) = (Follower::default(), u64::MAX / 2);
        // Nothing plugged, 56 MiB ballooned out of a guest that shows 162 MiB: a gap of 38.
        assert_eq!(
            follow(&mut f, (0, Some(200), false), (162, fresh)),
            (200, Some(0))
        );
        assert_eq!(f.kernel_gap, Some(Bytes::from_mib(38)));
        // 256 MiB plugged and the balloon full: 512 MiB, of which the guest shows 474.
        assert_eq!(
            follow(&mut f, (256, Some(256), false), (474, fresh)),
            (512, Some(0))
        );
        // Never onlined: the guest still shows its base memory only.
        assert_eq!(
            follow(&mut f, (256, Some(256), false), (218, fresh)),
            (512, Some(256))
        );
        // Without a balloon the whole base memory counts.
        assert_eq!(
            follow(&mut f, (256, None, false), (474, fresh)),
            (512, Some(0))
        );
        // With deflate-on-oom the ballooned pages stay in MemTotal.
        assert_eq!(
            follow(&mut f, (256, Some(200), true), (474, fresh)),
            (456, Some(0))
        );
        // Statistics from before the last resize say nothing about it.
        assert_eq!(
            follow(&mut f, (128, Some(256), false), (218, 1)),
            (384, None)
        );
    }
}
