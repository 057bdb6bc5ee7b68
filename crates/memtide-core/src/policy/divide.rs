//! Dividing memory between VMs when their wishes do not fit: every VM first gets its
//! minimum, then what remains is shared in proportion to weights (shares, or
//! activity-adjusted shares), no VM getting more than it wants; what a capped VM does not
//! take flows to the others (water-filling).

use super::{PolicyInput, VmInput};
use crate::units::Bytes;

/// The memory the VMs can have between them: what the host backs for them now plus what
/// the domain has freeable, less `reserve`. Guest memory the host does not back (never
/// touched, or handed back by free page reporting) is already in the freeable figure, so
/// each VM counts with the smaller of its size and its hypervisor's resident memory.
pub fn capacity(input: &PolicyInput<'_>, reserve: Bytes) -> Bytes {
    capacity_of(input, input.vms.iter(), reserve)
}

/// [`capacity`] among `vms` only: memory held by the others (VMs the policy gives no
/// target) is not theirs to divide.
pub fn capacity_of<'a>(
    input: &PolicyInput<'_>,
    vms: impl Iterator<Item = &'a VmInput<'a>>,
    reserve: Bytes,
) -> Bytes {
    let backed: Bytes = vms.map(backed).sum();
    (backed + input.host_latest().domain.freeable) - reserve
}

/// What the host backs of a VM's memory: the smaller of its size and its hypervisor's
/// resident memory less the hypervisor's own, where known: a reporting guest holding less
/// than its size had QEMU's own 30-75 MiB counted as guest memory the host backs, and so
/// as memory to divide among the VMs.
pub fn backed(vm: &VmInput<'_>) -> Bytes {
    let sample = vm.latest();
    let own = sample.fixed.and_then(|f| f.own).unwrap_or_default();
    sample
        .rss
        .map_or(vm.actual, |rss| (rss - own).min(vm.actual))
}

/// What the host has seen of a VM's memory: what it backs, and what it swapped out of
/// the hypervisor (memory the guest touched all the same).
pub fn seen(vm: &VmInput<'_>) -> Bytes {
    (backed(vm) + vm.latest().swapped.unwrap_or_default()).min(vm.actual)
}

/// What each VM's own word may claim when memory is divided, in order: its fair share of
/// `capacity` (its minimum, then the rest by shares, as if every VM wanted its maximum),
/// or more only as far as the host has seen of it ([`seen`]: its hypervisor's resident
/// memory and what the host swapped out of it, within its size) and its `growth` room
/// ([`growth`]). A guest's figures may move memory within its own bounds, but beyond its
/// fair share they take nothing from its neighbours unless the host sees the memory
/// behind them: a guest claiming to use more than it holds cannot grow at the others'
/// expense.
pub fn credible(capacity: Bytes, vms: &[&VmInput<'_>], growth: &[Bytes]) -> Vec<Bytes> {
    let everything: Vec<Claim> = vms
        .iter()
        .map(|vm| Claim {
            min: vm.limits.min,
            want: vm.limits.max.max(vm.limits.min),
            weight: f64::from(vm.limits.shares),
        })
        .collect();
    divide(capacity, &everything)
        .into_iter()
        .zip(vms)
        .zip(growth)
        .map(|((fair, vm), growth)| fair.max(seen(vm) + *growth))
        .collect()
}

/// Room for what a VM is loading: twice what it uses beyond `most`, the most it used
/// lately ([`super::peak::Peak`]), at most [`GROWTH`] of its size; none where its figures
/// say it uses more than the host has seen of it ([`seen`]). It is protected when memory
/// is divided, and a doubted guest may claim it beyond what the host backs: a guest
/// touching memory gets room for its next tick; one whose figures only claim it earns
/// nothing, nor one squeezed to what it holds that touches nothing new (found in the
/// simulator: honest guests without swap, doubted for heaps committed up front, could
/// never grow past their fair share and were OOM-killed when they loaded them together;
/// believed, with their heaps counted as reservations, they were too). Requiring the host to see as much more of the
/// guest touched cost those guests 16 OOM kills: loading a heap a second time, ten
/// minutes on, they touched free memory the host already backed. For five minutes after
/// using more, a guest gets no room until it uses more again. `used` is the balloon
/// statistics' (page cache included): a guest filling its cache gets room as one
/// allocating does.
pub fn growth(vm: &VmInput<'_>, most: Option<Bytes>) -> Bytes {
    let (Some(now), Some(most)) = (vm.signals.used, most) else {
        return Bytes::ZERO;
    };
    let configured = vm.latest().configured;
    if now > seen(vm) + configured.scale(super::trust::TOLERANCE) {
        return Bytes::ZERO;
    }
    (now - most).scale(2.0).min(configured.scale(GROWTH))
}

/// The most of its size a doubted guest may grow by in a tick (see [`growth`]): a
/// quarter, a tick ahead of a program loading a heap it committed long before.
pub const GROWTH: f64 = 0.25;

/// One VM's claim.
#[derive(Clone, Debug, PartialEq)]
pub struct Claim {
    /// Never less than this.
    pub min: Bytes,
    /// What it would get if memory were plentiful.
    pub want: Bytes,
    /// Its weight in the division.
    pub weight: f64,
}

/// Divide `capacity` between claims; returns one amount per claim, in order. When the
/// wants fit, each gets its want; when even the minimums do not fit, each gets its min.
pub fn divide(capacity: Bytes, claims: &[Claim]) -> Vec<Bytes> {
    let wants: Bytes = claims.iter().map(|c| c.want.max(c.min)).sum();
    if wants <= capacity {
        return claims.iter().map(|c| c.want.max(c.min)).collect();
    }
    let mut given: Vec<f64> = claims.iter().map(|c| c.min.as_f64()).collect();
    let mut left = capacity.as_f64() - given.iter().sum::<f64>();
    let mut open: Vec<usize> = (0..claims.len())
        .filter(|&i| claims[i].want > claims[i].min)
        .collect();
    while left > 0.5 && !open.is_empty() {
        let total_weight: f64 = open
            .iter()
            .map(|&i| claims[i].weight.max(f64::MIN_POSITIVE))
            .sum();
        let mut still_open = Vec::new();
        let mut handed = 0.0;
        for &i in &open {
            let share = left * claims[i].weight.max(f64::MIN_POSITIVE) / total_weight;
            let room = claims[i].want.as_f64() - given[i];
            let take = share.min(room);
            given[i] += take;
            handed += take;
            if take < room {
                still_open.push(i);
            }
        }
        left -= handed;
        if still_open.len() == open.len() {
            break; // nobody was capped: the division is final
        }
        open = still_open;
    }
    given.into_iter().map(Bytes::from_f64).collect()
}

/// Divide `capacity` in rounds: first each claim up to its level in `levels[0]` (what the
/// guest uses now; clamped to its min and want), by weight; then, from what each got, up
/// to its level in the next, and so on; last, what is left up to each want, by weight. A
/// guest whose estimate runs ahead of its use cannot take from a guest that uses all of
/// its own.
pub fn divide_by_use(capacity: Bytes, claims: &[Claim], levels: &[&[Bytes]]) -> Vec<Bytes> {
    let mut given: Vec<Bytes> = claims.iter().map(|c| c.min).collect();
    for level in levels {
        debug_assert_eq!(level.len(), claims.len());
        let round: Vec<Claim> = claims
            .iter()
            .zip(*level)
            .zip(&given)
            .map(|((c, l), g)| Claim {
                min: *g,
                want: (*l).clamp(*g, c.want.max(*g)),
                ..c.clone()
            })
            .collect();
        given = divide(capacity, &round);
    }
    let rest: Vec<Claim> = claims
        .iter()
        .zip(given)
        .map(|(c, min)| Claim { min, ..c.clone() })
        .collect();
    divide(capacity, &rest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn claim(min: u64, want: u64, weight: f64) -> Claim {
        Claim {
            min: Bytes::from_mib(min),
            want: Bytes::from_mib(want),
            weight,
        }
    }

    fn mib(v: Vec<Bytes>) -> Vec<u64> {
        v.into_iter()
            .map(|b| (b.as_f64() / (1u64 << 20) as f64).round() as u64)
            .collect()
    }

    #[test]
    fn capacity_counts_unbacked_guest_memory_once() {
        use crate::history::History;
        use crate::policy::VmInput;
        use crate::signals::Signals;
        use crate::snapshot::VmLimits;
        use crate::testkit;
        use std::time::Duration;
        let mut host = History::new(2);
        host.push(Duration::ZERO, testkit::host(4096, 1000));
        let limits = VmLimits {
            min: Bytes::ZERO,
            max: Bytes::from_mib(1024),
            shares: 1,
        };
        let signals = Signals::default();
        let mut histories = Vec::new();
        for (rss, own) in [
            (None, None),
            (Some(300), None),
            (Some(2000), None),
            (Some(400), Some(60)),
        ] {
            let mut s = testkit::vm("x", 1024, 1024, 0).sample.unwrap();
            s.rss = rss.map(Bytes::from_mib);
            s.fixed = Some(crate::FixedMemory {
                own: own.map(Bytes::from_mib),
                ..Default::default()
            });
            let mut h = History::new(2);
            h.push(Duration::ZERO, s);
            histories.push(h);
        }
        let vms: Vec<VmInput<'_>> = histories
            .iter()
            .map(|h| VmInput {
                name: "x",
                limits: &limits,
                history: h,
                actual: Bytes::from_mib(1024),
                target: None,
                signals: &signals,
            })
            .collect();
        let input = PolicyInput {
            at: Duration::ZERO,
            host: &host,
            vms: &vms,
            unreachable: &[],
        };
        // 1024 (RSS unknown: its size) + 300 (the rest is in the host's free memory) +
        // 1024 (QEMU's own overhead is not guest memory) + 340 (400 resident, 60 of it
        // QEMU's own) + 1000 freeable − 100 reserve.
        assert_eq!(
            capacity(&input, Bytes::from_mib(100)),
            Bytes::from_mib(1024 + 300 + 1024 + 340 + 1000 - 100)
        );
    }

    #[test]
    fn a_doubted_guest_touching_memory_may_grow_past_its_fair_share_one_claiming_it_not() {
        use crate::history::History;
        use crate::policy::VmInput;
        use crate::signals::Signals;
        use crate::snapshot::VmLimits;
        use crate::testkit;
        use std::time::Duration;
        let limits = VmLimits {
            min: Bytes::ZERO,
            max: Bytes::from_mib(4096),
            shares: 1,
        };
        // A 4 GiB guest at 2 GiB that uses `now` MiB, the most it used lately `most`, the
        // host backing 1.5 GiB of it; the most its word may claim out of 2 GiB divided
        // between it and another.
        let credible_swapped = |most: Option<u64>, now: u64, swapped: u64| {
            let mut sample = testkit::vm("x", 4096, 2048, 2048 - now).sample.unwrap();
            sample.rss = Some(Bytes::from_mib(1536));
            sample.swapped = Some(Bytes::from_mib(swapped));
            let mut h = History::new(2);
            h.push(Duration::ZERO, sample);
            let signals = Signals::derive(&h);
            let vm = VmInput {
                name: "x",
                limits: &limits,
                history: &h,
                actual: Bytes::from_mib(2048),
                target: None,
                signals: &signals,
            };
            let room = growth(&vm, most.map(Bytes::from_mib));
            credible(Bytes::from_mib(2048), &[&vm, &vm], &[room, room])[0].0 >> 20
        };
        let credible_of = |most, now| credible_swapped(most, now, 0);
        // Its fair share is 1 GiB; the host backs 1.5 GiB of it.
        assert_eq!(credible_of(Some(1000), 1000), 1536, "using nothing new");
        assert_eq!(credible_of(None, 1000), 1536, "first seen");
        // It uses 300 MiB more than it did lately, and the host backs all it says it
        // uses: room for twice that by the next tick.
        assert_eq!(credible_of(Some(1200), 1500), 1536 + 600);
        // No more than a quarter of its size a tick.
        assert_eq!(credible_of(Some(300), 1500), 1536 + 1024);
        // Its figures claim 300 MiB more in use than the host backs: nothing.
        assert_eq!(credible_of(Some(1500), 1800), 1536);
        // Unless the host swapped 300 MiB of it out: the host saw all it claims (found in
        // the simulator: guests without swap lent the host's swap were doubted, held to
        // what stayed resident and OOM-killed).
        assert_eq!(credible_swapped(Some(1800), 1800, 300), 1836);
        assert_eq!(
            credible_swapped(Some(1500), 1800, 300),
            1836 + 600,
            "and growing"
        );
        assert_eq!(
            credible_swapped(Some(1800), 1800, 1024),
            2048,
            "within its size"
        );
    }

    #[test]
    fn wants_that_fit_are_given() {
        assert_eq!(
            mib(divide(
                Bytes::from_mib(1000),
                &[claim(100, 300, 1.0), claim(100, 400, 1.0)]
            )),
            [300, 400]
        );
    }

    #[test]
    fn scarcity_is_shared_by_weight_above_the_minimums() {
        // 600 MiB: minimums 100 each, the 400 left split 1:3.
        let v = divide(
            Bytes::from_mib(600),
            &[claim(100, 500, 1.0), claim(100, 500, 3.0)],
        );
        assert_eq!(mib(v), [200, 400]);
    }

    #[test]
    fn what_a_capped_vm_does_not_take_flows_to_the_others() {
        // Equal weights: 300 each, but the first wants only 150: the other gets 450.
        let v = divide(
            Bytes::from_mib(600),
            &[claim(50, 150, 1.0), claim(50, 800, 1.0)],
        );
        assert_eq!(mib(v), [150, 450]);
    }

    #[test]
    fn what_guests_use_is_divided_before_what_they_might_want() {
        // 1000 MiB: a uses 600 (wants 700), b uses 100 but wants 900. By shares alone
        // each gets 500, a below its use; by use first, a keeps its 600 and the 300 left
        // are shared: 100 fill a's want, b takes the rest.
        let claims = [claim(50, 700, 1.0), claim(50, 900, 1.0)];
        let first = [Bytes::from_mib(600), Bytes::from_mib(100)];
        assert_eq!(mib(divide(Bytes::from_mib(1000), &claims)), [500, 500]);
        assert_eq!(
            mib(divide_by_use(Bytes::from_mib(1000), &claims, &[&first])),
            [700, 300]
        );
        // Use that does not fit is itself divided by shares above the minimums.
        assert_eq!(
            mib(divide_by_use(Bytes::from_mib(500), &claims, &[&first])),
            [400, 100]
        );
    }

    #[test]
    fn each_level_is_served_in_turn_before_what_is_left() {
        // 1000 MiB: a, b and c use 200 each. A second level lifts c (just OOM-killed) to its
        // whole want of 500 before a and b share what is left up to their wants of 600.
        let claims = [
            claim(50, 600, 1.0),
            claim(50, 600, 1.0),
            claim(50, 500, 1.0),
        ];
        let used = [Bytes::from_mib(200); 3];
        let after_kill = [used[0], used[1], Bytes::from_mib(500)];
        let capacity = Bytes::from_mib(1000);
        assert_eq!(
            mib(divide_by_use(capacity, &claims, &[&used])),
            [333, 333, 333]
        );
        assert_eq!(
            mib(divide_by_use(capacity, &claims, &[&used, &after_kill])),
            [250, 250, 500]
        );
        // Never at the expense of what the others use: with 700 MiB c gets 300.
        assert_eq!(
            mib(divide_by_use(
                Bytes::from_mib(700),
                &claims,
                &[&used, &after_kill]
            )),
            [200, 200, 300]
        );
    }

    #[test]
    fn minimums_hold_even_when_they_do_not_fit() {
        assert_eq!(
            mib(divide(
                Bytes::from_mib(100),
                &[claim(80, 200, 1.0), claim(80, 200, 1.0)]
            )),
            [80, 80]
        );
    }

    proptest! {
        #[test]
        fn never_below_min_never_above_want_and_never_over_capacity_beyond_minimums(
            capacity in 0u64..10_000,
            claims in proptest::collection::vec((0u64..2000, 0u64..4000, 0.0f64..10.0), 1..8),
        ) {
            let claims: Vec<Claim> = claims.iter().map(|&(min, want, w)| claim(min, want, w)).collect();
            let v = divide(Bytes::from_mib(capacity), &claims);
            let mins: u64 = claims.iter().map(|c| c.min.0).sum();
            for (c, g) in claims.iter().zip(&v) {
                // Exactly: each starts at its minimum and only gains (then rounds down
                // to whole bytes, which a whole minimum survives).
                prop_assert!(*g >= c.min, "{g:?} below the minimum {:?}", c.min);
                prop_assert!(g.0 <= c.want.max(c.min).0 + 1);
            }
            let total: u64 = v.iter().map(|b| b.0).sum();
            prop_assert!(total <= Bytes::from_mib(capacity).0.max(mins) + claims.len() as u64);
        }
    }
}
