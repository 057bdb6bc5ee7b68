//! Tier placement: how much of each VM's host memory the fast tier (DRAM) holds, and what
//! moves between it and a slow tier (a CXL memory expander, a compressed tier) this tick.
//!
//! Pure, like a balloon target: the caller measures each VM (its resident memory, how
//! much of it is fast, its hot set from access tracking) and moves the pages. Each VM's
//! fast budget is its hot set plus a margin (or the operator's budget) when the fast tier
//! holds them all, and what is left over is shared out by shares up to each VM's resident
//! memory, so nothing is demoted that need not be; when the hot sets do not fit, the fast
//! tier is divided by shares, no VM getting more than its hot set plus the margin. Moves
//! are rate-limited per VM: demotions down to the budget first, then promotions of hot
//! memory found on the slow tier, into room under the budget or in exchange for cold
//! memory on the fast tier.
//!
//! Page by page ([`count_pages`], [`pick_pages`]): given each resident page's access age
//! and tier, the figures `place` takes, and which pages carry out its moves.

use crate::action::Reason;
use crate::policy::divide::{divide_by_use, Claim};
use crate::units::{Bytes, Percent};

/// One VM as placement sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct TierVm<'a> {
    /// The VM's name.
    pub name: &'a str,
    /// Its guest memory in host RAM, both tiers together.
    pub resident: Bytes,
    /// Of it, in the fast tier now.
    pub fast: Bytes,
    /// Its hot set: the memory that takes most of its accesses, as access tracking
    /// estimates it.
    pub hot: Bytes,
    /// Of the hot set, memory found on the slow tier.
    pub hot_on_slow: Bytes,
    /// Its weight when the fast tier is short.
    pub shares: u32,
    /// The operator's fast budget, in place of the hot set plus the margin; it also caps
    /// what the VM gets of spare fast memory.
    pub configured: Option<Bytes>,
}

/// The host's fast tier.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FastTier {
    /// Fast memory free now.
    pub free: Bytes,
    /// Fast memory to keep free (for new allocations, the host's own needs).
    pub reserve: Bytes,
}

/// Placement settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TierConfig {
    /// Fast memory given above a hot set, as a share of it (0.1: 10%).
    pub margin: f64,
    /// Most memory moved per VM per second, demotions and promotions together (MiB/s).
    pub rate_mib_s: f64,
}

impl Default for TierConfig {
    fn default() -> Self {
        TierConfig {
            margin: 0.1,
            rate_mib_s: 256.0,
        }
    }
}

/// One VM's placement for this tick.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// The VM's name.
    pub vm: String,
    /// The fast memory it may hold.
    pub fast_budget: Bytes,
    /// Its coldest fast memory to move to the slow tier now.
    pub demote: Bytes,
    /// Its hot memory on the slow tier to move to the fast tier now.
    pub promote: Bytes,
    /// Why.
    pub reason: Reason,
}

/// Place every VM's memory for a tick of `dt_s` seconds, in the order given.
pub fn place(vms: &[TierVm<'_>], tier: FastTier, config: TierConfig, dt_s: f64) -> Vec<Placement> {
    let held: Bytes = vms.iter().map(|vm| vm.fast.min(vm.resident)).sum();
    let capacity = (held + tier.free) - tier.reserve;
    let margin = if config.margin.is_finite() {
        config.margin.max(0.0)
    } else {
        0.0
    };
    let claims: Vec<Claim> = vms
        .iter()
        .map(|vm| Claim {
            min: Bytes::ZERO,
            want: vm.configured.map_or(vm.resident, |c| c.min(vm.resident)),
            weight: f64::from(vm.shares),
        })
        .collect();
    let wants: Vec<Bytes> = vms
        .iter()
        .zip(&claims)
        .map(|(vm, c)| {
            vm.configured
                .unwrap_or_else(|| vm.hot.scale(1.0 + margin))
                .min(c.want)
        })
        .collect();
    let short = wants.iter().copied().sum::<Bytes>() > capacity;
    let budgets = divide_by_use(capacity, &claims, &wants);
    let limit = Bytes::from_f64(config.rate_mib_s * dt_s.max(0.0) * 1024.0 * 1024.0);
    vms.iter()
        .zip(budgets)
        .map(|(vm, budget)| {
            let (demote, promote) = moves(vm, budget, limit);
            let (rule, basis) = match vm.configured {
                Some(c) => ("tier.configured", format!("operator budget {c}")),
                None => (
                    "tier.hot",
                    format!("hot set {} + {}", vm.hot, Percent(margin)),
                ),
            };
            let (rule, fit) = if short {
                ("tier.short", "hot sets exceed the fast tier: by shares")
            } else {
                (rule, "fits")
            };
            let detail = format!(
                "{basis} {fit}: fast {budget} of {} resident (fast tier {capacity} for the VMs); \
                 demote {demote}, promote {promote} (at most {limit} a tick)",
                vm.resident
            );
            Placement {
                vm: vm.name.to_string(),
                fast_budget: budget,
                demote,
                promote,
                reason: Reason::new(rule, detail),
            }
        })
        .collect()
}

/// What to demote and promote to bring `vm` toward `budget`, at most `limit` in all:
/// demotions down to the budget first, then hot memory from the slow tier into room under
/// the budget, then hot memory in exchange for cold fast memory (a demotion for each).
fn moves(vm: &TierVm<'_>, budget: Bytes, limit: Bytes) -> (Bytes, Bytes) {
    let fast = vm.fast.min(vm.resident);
    let hot_on_slow = vm.hot_on_slow.min(vm.resident - fast).min(vm.hot);
    let down = (fast - budget).min(limit);
    let left = limit - down;
    let fill = hot_on_slow.min(budget - fast).min(left);
    let left = left - fill;
    let cold_on_fast = (fast - (vm.hot - hot_on_slow)) - down;
    let exchange = (hot_on_slow - fill)
        .min(Bytes(left.0 / 2))
        .min(cold_on_fast);
    (down + exchange, fill + exchange)
}

/// A resident page as page placement sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageTier {
    /// Scans in a row that found it untouched: 0 for a page accessed since the previous
    /// scan.
    pub age: u16,
    /// On the fast tier (else on the slow one).
    pub fast: bool,
}

/// Pages by tier and heat. A page is hot when accessed since the previous scan.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageCounts {
    /// Pages on the fast tier.
    pub fast: u64,
    /// Pages on the slow tier.
    pub slow: u64,
    /// Hot pages, both tiers.
    pub hot: u64,
    /// Hot pages on the slow tier.
    pub hot_on_slow: u64,
}

/// Count `pages` by tier and heat, for a [`TierVm`].
pub fn count_pages(pages: &[PageTier]) -> PageCounts {
    let mut c = PageCounts::default();
    for p in pages {
        let hot = u64::from(p.age == 0);
        if p.fast {
            c.fast += 1;
        } else {
            c.slow += 1;
            c.hot_on_slow += hot;
        }
        c.hot += hot;
    }
    c
}

/// The pages that carry out a placement's moves, as indices into `pages`: `demote` of
/// the fast pages, the longest untouched first, and `promote` of the hot pages on the
/// slow tier (fewer when there are fewer). Ties go to the lower index.
pub fn pick_pages(pages: &[PageTier], demote: u64, promote: u64) -> (Vec<usize>, Vec<usize>) {
    let take = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    let mut fast: Vec<usize> = (0..pages.len()).filter(|&i| pages[i].fast).collect();
    fast.sort_by_key(|&i| std::cmp::Reverse(pages[i].age));
    fast.truncate(take(demote));
    let hot_on_slow = (0..pages.len())
        .filter(|&i| !pages[i].fast && pages[i].age == 0)
        .take(take(promote))
        .collect();
    (fast, hot_on_slow)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm(name: &str, resident: u64, fast: u64, hot: u64, hot_on_slow: u64) -> TierVm<'_> {
        TierVm {
            name,
            resident: Bytes::from_mib(resident),
            fast: Bytes::from_mib(fast),
            hot: Bytes::from_mib(hot),
            hot_on_slow: Bytes::from_mib(hot_on_slow),
            shares: 1000,
            configured: None,
        }
    }

    fn tier(free: u64) -> FastTier {
        FastTier {
            free: Bytes::from_mib(free),
            reserve: Bytes::ZERO,
        }
    }

    fn mib(b: Bytes) -> u64 {
        b.0 / (1 << 20)
    }

    const FAST: TierConfig = TierConfig {
        margin: 0.1,
        rate_mib_s: 100_000.0,
    };

    #[test]
    fn with_room_for_every_hot_set_the_spare_fast_memory_is_shared_and_nothing_moves() {
        // 4000 MiB of fast memory, 3000 held: both fit whole, nothing is demoted.
        let vms = [vm("a", 2000, 2000, 500, 0), vm("b", 1000, 1000, 1000, 0)];
        let p = place(&vms, tier(1000), FAST, 1.0);
        assert_eq!(
            p.iter().map(|p| mib(p.fast_budget)).collect::<Vec<_>>(),
            [2000, 1000]
        );
        assert!(p
            .iter()
            .all(|p| p.demote == Bytes::ZERO && p.promote == Bytes::ZERO));
        assert_eq!(p[0].reason.rule, "tier.hot");
    }

    #[test]
    fn a_short_fast_tier_keeps_hot_sets_and_a_margin_and_demotes_the_rest() {
        // 2000 MiB of fast memory for 3000 resident: hot sets 500 and 800 (+10%) fit, and
        // the 570 MiB left over is shared by shares, b's part capped at its 1000 resident.
        let vms = [vm("a", 2000, 1400, 500, 0), vm("b", 1000, 600, 800, 0)];
        let p = place(&vms, tier(0), FAST, 1.0);
        let budgets: Vec<u64> = p.iter().map(|p| mib(p.fast_budget)).collect();
        assert!(budgets.iter().sum::<u64>() <= 2000, "{budgets:?}");
        assert!(budgets[0] >= 550 && budgets[1] >= 880, "{budgets:?}");
        assert_eq!(budgets[1], 1000, "b gets all its memory");
        assert_eq!(mib(p[0].demote), 1400 - budgets[0]);
        assert_eq!(p[0].promote, Bytes::ZERO);
    }

    #[test]
    fn hot_sets_that_do_not_fit_are_divided_by_shares() {
        let mut a = vm("a", 4000, 2000, 3000, 1000);
        a.shares = 3000;
        let b = vm("b", 4000, 2000, 3000, 1000);
        let p = place(&[a, b], tier(0), FAST, 1.0);
        assert_eq!((mib(p[0].fast_budget), mib(p[1].fast_budget)), (3000, 1000));
        assert_eq!(p[0].reason.rule, "tier.short");
        // a promotes its hot memory into the room, b demotes down to its budget.
        assert_eq!((mib(p[0].promote), mib(p[0].demote)), (1000, 0));
        assert_eq!((mib(p[1].promote), mib(p[1].demote)), (0, 1000));
    }

    #[test]
    fn an_operator_budget_replaces_the_hot_set_and_caps_spare_memory() {
        let mut a = vm("a", 2000, 2000, 1500, 0);
        a.configured = Some(Bytes::from_mib(800));
        let p = place(&[a], tier(10_000), FAST, 1.0);
        assert_eq!((mib(p[0].fast_budget), mib(p[0].demote)), (800, 1200));
        assert_eq!(p[0].reason.rule, "tier.configured");
    }

    #[test]
    fn hot_memory_on_the_slow_tier_is_exchanged_for_cold_fast_memory() {
        // At its budget with 300 MiB of its hot set on the slow tier and cold memory on
        // the fast tier: each promotion displaces a cold page.
        let v = vm("a", 3000, 1000, 900, 300);
        let p = place(&[v], tier(0), FAST, 1.0);
        assert_eq!(mib(p[0].fast_budget), 1000);
        assert_eq!((mib(p[0].promote), mib(p[0].demote)), (300, 300));
        // With no cold memory on the fast tier there is nothing to exchange.
        let v = vm("a", 3000, 1000, 1300, 300);
        let p = place(&[v], tier(0), FAST, 1.0);
        assert_eq!((p[0].promote, p[0].demote), (Bytes::ZERO, Bytes::ZERO));
    }

    #[test]
    fn moves_are_rate_limited() {
        let slow = TierConfig {
            margin: 0.1,
            rate_mib_s: 64.0,
        };
        let v = vm("a", 4000, 4000, 1000, 0);
        let short = FastTier {
            free: Bytes::ZERO,
            reserve: Bytes::from_mib(2000),
        };
        let p = place(&[v], short, slow, 2.0);
        let budget = mib(p[0].fast_budget);
        assert!(budget < 4000);
        assert_eq!(mib(p[0].demote), 128);
        // An exchange counts both ways: at most the limit in all.
        let v = vm("a", 3000, 1000, 900, 300);
        let p = place(&[v], tier(0), slow, 1.0);
        assert_eq!((mib(p[0].promote), mib(p[0].demote)), (32, 32));
        assert!(
            p[0].reason.detail.contains("at most 64 MiB a tick"),
            "{}",
            p[0].reason
        );
    }

    #[test]
    fn degenerate_inputs_give_zero_budgets_without_panicking() {
        let mut v = vm("a", 1000, 1000, 2000, 5000);
        v.shares = 0;
        let tier = FastTier {
            free: Bytes::ZERO,
            reserve: Bytes::from_mib(u64::MAX >> 20),
        };
        let nan = TierConfig {
            margin: f64::NAN,
            rate_mib_s: f64::NAN,
        };
        let p = place(&[v.clone()], tier, nan, -1.0);
        assert_eq!(p[0].fast_budget, Bytes::ZERO);
        assert_eq!((p[0].demote, p[0].promote), (Bytes::ZERO, Bytes::ZERO));
        let p = place(&[v], tier, FAST, 1.0);
        assert_eq!((p[0].fast_budget, mib(p[0].demote)), (Bytes::ZERO, 1000));
        assert!(place(&[], tier, FAST, 1.0).is_empty());
    }

    fn pages(spec: &[(u16, bool)]) -> Vec<PageTier> {
        spec.iter()
            .map(|&(age, fast)| PageTier { age, fast })
            .collect()
    }

    #[test]
    fn pages_are_counted_by_tier_and_heat() {
        let p = pages(&[(0, true), (3, true), (0, false), (0, false), (9, false)]);
        let c = count_pages(&p);
        assert_eq!(
            c,
            PageCounts {
                fast: 2,
                slow: 3,
                hot: 3,
                hot_on_slow: 2
            }
        );
        assert_eq!(count_pages(&[]), PageCounts::default());
    }

    #[test]
    fn the_longest_untouched_fast_pages_are_demoted_and_hot_slow_pages_promoted() {
        //            0          1         2          3          4           5          6
        let p = pages(&[
            (2, true),
            (0, true),
            (7, true),
            (0, false),
            (5, false),
            (7, true),
            (0, false),
        ]);
        let (demote, promote) = pick_pages(&p, 3, 1);
        // The oldest first, ties by index; a hot fast page only once no cold one is left.
        assert_eq!(demote, [2, 5, 0]);
        assert_eq!(promote, [3]);
        let (demote, promote) = pick_pages(&p, 10, 10);
        assert_eq!(demote, [2, 5, 0, 1]);
        // A cold page on the slow tier is never promoted.
        assert_eq!(promote, [3, 6]);
        assert_eq!(pick_pages(&p, 0, 0), (vec![], vec![]));
        assert_eq!(pick_pages(&[], u64::MAX, u64::MAX), (vec![], vec![]));
    }

    #[test]
    fn placing_counted_pages_converges_to_the_hot_set_within_the_budget() {
        // 48 pages: 12 hot ones (age 0) on the slow tier, 36 cold ones on the fast tier;
        // a budget of 16 pages, 8 pages moved a tick. Carrying out each tick's moves
        // brings every hot page onto the fast tier and the fast tier to the budget.
        let page = Bytes(4096);
        let mut p: Vec<PageTier> = (0..48)
            .map(|i| PageTier {
                age: if i < 12 { 0 } else { 5 },
                fast: i >= 12,
            })
            .collect();
        let config = TierConfig {
            margin: 0.1,
            rate_mib_s: 8.0 * 4096.0 / (1024.0 * 1024.0),
        };
        for _ in 0..20 {
            let c = count_pages(&p);
            let vm = TierVm {
                name: "a",
                resident: Bytes(page.0 * (c.fast + c.slow)),
                fast: Bytes(page.0 * c.fast),
                hot: Bytes(page.0 * c.hot),
                hot_on_slow: Bytes(page.0 * c.hot_on_slow),
                shares: 1,
                configured: Some(Bytes(page.0 * 16)),
            };
            let placed = &place(&[vm], tier(1000), config, 1.0)[0];
            assert!(placed.demote.0 + placed.promote.0 <= 8 * page.0);
            let (demote, promote) =
                pick_pages(&p, placed.demote.0 / page.0, placed.promote.0 / page.0);
            demote.iter().for_each(|&i| p[i].fast = false);
            promote.iter().for_each(|&i| p[i].fast = true);
        }
        let c = count_pages(&p);
        assert_eq!((c.fast, c.hot_on_slow), (16, 0));
    }

    proptest::proptest! {
        #[test]
        fn budgets_fit_the_fast_tier_and_moves_stay_within_bounds(
            raw in proptest::collection::vec((0u64..8192, 0u64..8192, 0u64..8192, 0u64..8192, 0u32..4000), 1..6),
            free in 0u64..16384,
            reserve in 0u64..4096,
            rate in 0.0f64..4096.0,
        ) {
            let names: Vec<String> = (0..raw.len()).map(|i| format!("vm{i}")).collect();
            let vms: Vec<TierVm<'_>> = raw.iter().zip(&names).map(|(&(res, fast, hot, hos, shares), name)| TierVm {
                shares,
                ..vm(name, res, fast.min(res), hot.min(res), hos)
            }).collect();
            let tier = FastTier { free: Bytes::from_mib(free), reserve: Bytes::from_mib(reserve) };
            let config = TierConfig { margin: 0.1, rate_mib_s: rate };
            let p = place(&vms, tier, config, 1.0);
            let held: Bytes = vms.iter().map(|v| v.fast).sum();
            let capacity = (held + tier.free) - tier.reserve;
            let total: Bytes = p.iter().map(|p| p.fast_budget).sum();
            proptest::prop_assert!(total <= capacity + Bytes(vms.len() as u64), "{total} > {capacity}");
            let short = vms.iter().map(|v| v.hot.scale(1.1).min(v.resident)).sum::<Bytes>() > capacity;
            let limit = Bytes::from_f64(rate * 1024.0 * 1024.0);
            for (v, p) in vms.iter().zip(&p) {
                proptest::prop_assert!(p.fast_budget <= v.resident);
                if !short {
                    // Never below the hot set and its margin while the fast tier holds them.
                    proptest::prop_assert!(p.fast_budget + Bytes(1) >= v.hot.scale(1.1).min(v.resident));
                    proptest::prop_assert_eq!(p.reason.rule.as_ref(), "tier.hot");
                }
                proptest::prop_assert!(p.demote + p.promote <= limit);
                proptest::prop_assert!(p.demote <= v.fast);
                proptest::prop_assert!(p.promote <= (v.resident - v.fast).min(v.hot_on_slow));
                // Demotion never takes the VM below its budget except to make room for a
                // promotion.
                proptest::prop_assert!((v.fast - p.demote) + p.promote >= p.fast_budget.min(v.fast));
            }
        }
    }
}
