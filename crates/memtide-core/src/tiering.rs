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
//! A guest's free memory that the host still backs is not cold memory: it holds no data,
//! and the guest's next allocation reuses it, so a free frame demoted to the slow tier
//! comes back as a fresh allocation written into slow memory (and is then promoted).
//! Taking free memory from a guest is the balloon's work (or free page reporting's). So,
//! while the hot sets fit in the fast memory the VMs' data holds, free frames on the fast
//! tier (`free_fast`) stay out of the division (the budgets share out that memory) and
//! are never demoted to bring a VM down to its budget; they give way only to the VM's own
//! hot memory found on the slow tier, in exchange, once no cold memory in use is left on
//! the fast tier to exchange (a guest without a balloon would otherwise keep its hot set
//! on the slow tier behind free frames). When the hot sets do not fit, fast memory is
//! too short to hold anything not in use: free frames are divided with the rest and go
//! after cold memory in use, before hot memory. The part of a demotion that is free
//! memory is named (`demote_free`).
//!
//! The hot set is memory in use now: moving it down and back up costs two copies and a
//! slow access for every touch in between. A VM above its budget demotes its cold memory
//! in use down to the budget, but its hot memory only once the VM is more than the margin
//! above the budget (then down to the budget), so that budgets moving by a little as other
//! VMs' hot sets change do not move hot memory back and forth. Promotions into room are
//! held to the fast memory that is free (beyond the reserve) once this tick's demotions
//! are done.
//!
//! A cold age per VM (`TierVm::cold_age_s`), as in Google's far memory (Lagar-Cavilla et
//! al., ASPLOS'19): memory in use is demoted only once it has gone untouched for the VM's
//! cold age (`TierVm::aged`, the access tracker's figure), since memory idle for a short
//! while is often read again soon, and each such page comes back as a promotion. Memory in
//! use younger than that stays fast even above the VM's budget (the other VMs' promotions
//! into room are then held to the fast memory free). Guest-free frames hold no data and
//! keep their own rule above. Each VM's age follows its own promotions ([`age`]).

//! Page by page ([`count_pages`], [`pick_pages`]): given each resident page's access age
//! and tier, the figures `place` takes, and which pages carry out its moves.

pub mod age;

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
    /// Of `fast`, memory free in the guest (frames the host backs that hold none of the
    /// guest's data, as free page reporting or hinting tells them). Not cold memory: while
    /// the hot sets fit, kept fast outside the VM's budget, so that the guest's next
    /// allocations land in fast memory, and demoted only in exchange for the VM's hot
    /// memory on the slow tier; when they do not, demoted after cold memory in use.
    pub free_fast: Bytes,
    /// Of `fast`, memory in use untouched for at least the cold age (`cold_age_s`; all
    /// of it where the cold age is 0): the only memory in use that is demoted.
    pub aged: Bytes,
    /// The VM's cold age (s), which `aged` was measured for ([`age::ColdAge`]).
    pub cold_age_s: f64,
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
    /// Of `demote`, guest-free memory (after cold memory in use, before hot memory).
    pub demote_free: Bytes,
    /// Its hot memory on the slow tier to move to the fast tier now.
    pub promote: Bytes,
    /// Why.
    pub reason: Reason,
}

/// Place every VM's memory for a tick of `dt_s` seconds, in the order given.
pub fn place(vms: &[TierVm<'_>], tier: FastTier, config: TierConfig, dt_s: f64) -> Vec<Placement> {
    let margin = if config.margin.is_finite() {
        config.margin.max(0.0)
    } else {
        0.0
    };
    // Guest-free fast memory stays where it is, outside the division, while the hot sets
    // fit in the rest; when they do not, it is divided too and goes before hot memory.
    let division = |free_divided: bool| {
        let part = |vm: &TierVm<'_>| {
            let (resident, fast) = in_use(vm);
            let free = vm.free_fast.min(vm.fast.min(vm.resident));
            if free_divided {
                (resident + free, fast + free)
            } else {
                (resident, fast)
            }
        };
        let held: Bytes = vms.iter().map(|vm| part(vm).1).sum();
        let capacity = (held + tier.free) - tier.reserve;
        let claims: Vec<Claim> = vms
            .iter()
            .map(|vm| {
                let resident = part(vm).0;
                Claim {
                    min: Bytes::ZERO,
                    want: vm.configured.map_or(resident, |c| c.min(resident)),
                    weight: f64::from(vm.shares),
                }
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
        (capacity, claims, wants, short)
    };
    let (mut capacity, mut claims, mut wants, short) = division(false);
    if short {
        (capacity, claims, wants, _) = division(true);
    }
    let budgets = divide_by_use(capacity, &claims, &[&wants]);
    let limit = Bytes::from_f64(config.rate_mib_s * dt_s.max(0.0) * 1024.0 * 1024.0);
    let planned: Vec<Moves> = vms
        .iter()
        .zip(&budgets)
        .map(|(vm, &budget)| moves(vm, budget, limit, margin, short))
        .collect();
    // Promotions into room take fast memory that is free once this tick's demotions are
    // done (a VM keeping its hot memory above its budget leaves less than the budgets
    // say): when they want more, each gets its part in proportion.
    let room = (tier.free - tier.reserve) + planned.iter().map(|m| m.down).sum::<Bytes>();
    let wanted: Bytes = planned.iter().map(|m| m.fill).sum();
    let scale = if wanted > room {
        room.as_f64() / wanted.as_f64()
    } else {
        1.0
    };
    vms.iter()
        .zip(budgets)
        .zip(planned)
        .map(|((vm, budget), m)| {
            let fill = if scale < 1.0 {
                Bytes::from_f64((m.fill.as_f64() * scale).floor())
            } else {
                m.fill
            };
            let (demote, promote) = (m.down + m.exchange, fill + m.exchange);
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
            let mut notes = String::new();
            if m.young_kept > Bytes::ZERO {
                notes += &format!(
                    "; {} touched within the cold age ({} s) kept above the budget",
                    m.young_kept, vm.cold_age_s
                );
            }
            if m.hot_kept > Bytes::ZERO {
                let why = if m.hot_in_band {
                    "within the margin"
                } else {
                    "touched within the cold age"
                };
                notes += &format!(
                    "; {} of hot memory kept above the budget ({why})",
                    m.hot_kept
                );
            }
            if fill < m.fill {
                notes += &format!("; promotion held to the fast memory free ({})", m.fill);
            }
            let free = vm.free_fast.min(vm.fast.min(vm.resident));
            if m.demote_free > Bytes::ZERO {
                notes += &format!(
                    "; {} of the demotion free in the guest (after its cold memory in use, \
                     before its hot memory), {} free kept fast",
                    m.demote_free,
                    free - m.demote_free
                );
            } else if free > Bytes::ZERO {
                notes += &format!("; {free} free in the guest kept fast (not cold: not demoted)");
            }
            let detail = format!(
                "{basis} {fit}: fast {budget} of {} resident (fast tier {capacity} for the VMs); \
                 demote {demote}, promote {promote} (at most {limit} a tick){notes}",
                vm.resident
            );
            Placement {
                vm: vm.name.to_string(),
                fast_budget: budget,
                demote,
                demote_free: m.demote_free,
                promote,
                reason: Reason::new(rule, detail),
            }
        })
        .collect()
}

/// A VM's memory in use (its resident memory less its guest-free fast memory) and, of it,
/// what is on the fast tier.
fn in_use(vm: &TierVm<'_>) -> (Bytes, Bytes) {
    let fast = vm.fast.min(vm.resident);
    let free = vm.free_fast.min(fast);
    (vm.resident - free, fast - free)
}

/// One VM's moves before promotions into room are held to the room there is.
struct Moves {
    /// Demotions down to the budget.
    down: Bytes,
    /// Promotions into room under the budget.
    fill: Bytes,
    /// Promotions each for a demotion of cold memory in use or of free memory.
    exchange: Bytes,
    /// Of the demotions, guest-free memory.
    demote_free: Bytes,
    /// Cold memory in use above the budget not demoted: touched within the cold age.
    young_kept: Bytes,
    /// Hot memory above the budget not demoted (within the margin, or touched within the
    /// cold age).
    hot_kept: Bytes,
    /// Whether the VM is within the margin above its budget (hot memory stays).
    hot_in_band: bool,
}

/// What to demote and promote to bring `vm` toward `budget`, at most `limit` in all:
/// demotions down to the budget first (cold memory in use, and guest-free memory when
/// `free_divided`; hot memory only when the VM is more than `margin` of the budget above
/// it), then hot memory from the slow tier into room under the budget, then hot memory in
/// exchange for cold memory in use on the fast tier, then for guest-free memory (a
/// demotion for each). Of memory in use, only what is untouched for the cold age
/// (`vm.aged`) is demoted. Unless `free_divided`, guest-free memory is not counted
/// against the budget and not demoted to meet it.
fn moves(vm: &TierVm<'_>, budget: Bytes, limit: Bytes, margin: f64, free_divided: bool) -> Moves {
    let (resident, in_use_fast) = in_use(vm);
    let free = vm.free_fast.min(vm.fast.min(vm.resident));
    let hot_on_slow = vm.hot_on_slow.min(resident - in_use_fast).min(vm.hot);
    let hot_on_fast = (vm.hot - hot_on_slow).min(in_use_fast);
    let cold_in_use = in_use_fast - hot_on_fast;
    // Memory in use untouched for the cold age: cold memory first, hot memory (aged only
    // where the cold age is 0) after it. Cold memory younger than that stays.
    let aged = vm.aged.min(in_use_fast);
    let aged_cold = aged.min(cold_in_use);
    let aged_hot = aged - aged_cold;
    let young = cold_in_use - aged_cold;
    let (fast, cold_on_fast) = if free_divided {
        (in_use_fast + free, aged_cold + free)
    } else {
        (in_use_fast, aged_cold)
    };
    let over = fast - budget;
    let cold_down = over.min(cold_on_fast);
    let young_kept = (over - cold_down).min(young);
    let hot_over = over - cold_down - young_kept;
    let hot_in_band = fast - cold_down <= budget.scale(1.0 + margin);
    let hot_down = if hot_in_band {
        Bytes::ZERO
    } else {
        hot_over.min(aged_hot)
    };
    let down = (cold_down + hot_down).min(limit);
    let hot_kept = hot_over - hot_down;
    let left = limit - down;
    let fill = hot_on_slow.min(budget - fast).min(left);
    let left = left - fill;
    let cold_left = (aged_cold + free) - down.min(cold_down);
    let exchange = (hot_on_slow - fill).min(Bytes(left.0 / 2)).min(cold_left);
    // Cold memory in use goes first, free memory after it.
    let demote_free = ((down.min(cold_down) + exchange) - aged_cold).min(free);
    Moves {
        down,
        fill,
        exchange,
        demote_free,
        young_kept,
        hot_kept,
        hot_in_band,
    }
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
    /// Pages on the fast tier untouched for the cold age.
    pub aged: u64,
}

/// Whether a page of age `age` (scans) has gone untouched for the cold age, which `least`
/// scans in a row span (`None` while the scans so far span less: no page has).
fn aged(age: u16, least: Option<u16>) -> bool {
    least.is_some_and(|least| age >= least)
}

/// Count `pages` by tier and heat, for a [`TierVm`]; a page is aged when untouched for
/// at least `least` scans (the cold age in scans; `None`: not spanned yet).
pub fn count_pages(pages: &[PageTier], least: Option<u16>) -> PageCounts {
    let mut c = PageCounts::default();
    for p in pages {
        let hot = u64::from(p.age == 0);
        if p.fast {
            c.fast += 1;
            c.aged += u64::from(aged(p.age, least));
        } else {
            c.slow += 1;
            c.hot_on_slow += hot;
        }
        c.hot += hot;
    }
    c
}

/// The pages that carry out a placement's moves, as indices into `pages`: `demote` of
/// the fast pages untouched for at least `least` scans (the cold age, as in
/// [`count_pages`]), the longest untouched first, and `promote` of the hot pages on the
/// slow tier (fewer when there are fewer). Ties go to the lower index.
pub fn pick_pages(
    pages: &[PageTier],
    demote: u64,
    promote: u64,
    least: Option<u16>,
) -> (Vec<usize>, Vec<usize>) {
    let take = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    let mut fast: Vec<usize> = (0..pages.len())
        .filter(|&i| pages[i].fast && aged(pages[i].age, least))
        .collect();
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
            free_fast: Bytes::ZERO,
            // No cold age: all of its fast memory may go.
            aged: Bytes::from_mib(fast),
            cold_age_s: 0.0,
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

    #[test]
    fn guest_free_fast_memory_is_kept_out_of_the_division_while_the_hot_sets_fit() {
        // 1000 MiB fast, 400 of it free in the guest; an operator budget of 500 MiB.
        // Demoting the free frames would make the guest's next allocations land on the
        // slow tier: only the 600 MiB in use count, 100 MiB of it demoted.
        let mut a = vm("a", 2000, 1000, 300, 0);
        a.free_fast = Bytes::from_mib(400);
        a.configured = Some(Bytes::from_mib(500));
        let p = place(&[a.clone()], tier(0), FAST, 1.0);
        assert_eq!((mib(p[0].fast_budget), mib(p[0].demote)), (500, 100));
        assert_eq!(p[0].demote_free, Bytes::ZERO);
        assert!(
            p[0].reason
                .detail
                .contains("400 MiB free in the guest kept fast"),
            "{}",
            p[0].reason
        );
        // Hot sets that fit in what the VMs hold in use and the free fast memory: a's free
        // frames stay, out of the division.
        a.configured = None;
        let b = vm("b", 1000, 0, 400, 400);
        let p = place(&[a.clone(), b], tier(200), FAST, 1.0);
        assert_eq!(p[0].reason.rule, "tier.hot");
        assert_eq!(p[0].demote_free, Bytes::ZERO);
        assert_eq!(mib(p[1].promote), 400);
        // Hot sets that do not fit: the free frames are divided too and go after a's cold
        // memory in use (300 MiB), before its hot set: b gets 870 MiB of the 1200.
        let b = vm("b", 1000, 0, 800, 800);
        let p = place(&[a, b], tier(200), FAST, 1.0);
        assert_eq!(p[0].reason.rule, "tier.short");
        assert_eq!((mib(p[0].fast_budget), mib(p[1].fast_budget)), (330, 870));
        assert_eq!((mib(p[0].demote), mib(p[0].demote_free)), (670, 370));
        assert_eq!(mib(p[1].promote), 800);
        // All of it free: nothing to demote, whatever the budget.
        let mut c = vm("c", 1000, 1000, 0, 0);
        c.free_fast = Bytes::from_mib(1000);
        c.configured = Some(Bytes::ZERO);
        let p = place(&[c], tier(0), FAST, 1.0);
        assert_eq!((p[0].demote, p[0].promote), (Bytes::ZERO, Bytes::ZERO));
        assert!(
            p[0].reason
                .detail
                .contains("1000 MiB free in the guest kept fast"),
            "{}",
            p[0].reason
        );
    }

    #[test]
    fn free_fast_memory_gives_way_to_hot_memory_on_the_slow_tier_after_cold_memory() {
        // 1000 MiB fast: 600 hot, 100 cold in use, 300 free; 300 MiB of the hot set on the
        // slow tier and no room: the cold memory goes first, then 200 MiB of free memory.
        let mut a = vm("a", 3000, 1000, 900, 300);
        a.free_fast = Bytes::from_mib(300);
        a.configured = Some(Bytes::from_mib(700));
        let p = place(&[a], tier(0), FAST, 1.0);
        assert_eq!(mib(p[0].fast_budget), 700);
        assert_eq!(
            (mib(p[0].promote), mib(p[0].demote), mib(p[0].demote_free)),
            (300, 300, 200)
        );
        assert!(
            p[0].reason.detail.contains(
                "200 MiB of the demotion free in the guest (after its cold memory in use"
            ),
            "{}",
            p[0].reason
        );
    }

    #[test]
    fn hot_memory_above_the_budget_moves_only_beyond_the_margin() {
        // All 1000 MiB fast and hot, with 500 more hot on the slow tier; b wants room.
        let a = |configured| TierVm {
            configured: Some(Bytes::from_mib(configured)),
            ..vm("a", 1500, 1000, 1500, 500)
        };
        // A budget 5% under what it holds: the hot memory stays (within the 10% margin).
        let p = place(&[a(950)], tier(0), FAST, 1.0);
        assert_eq!((p[0].demote, p[0].promote), (Bytes::ZERO, Bytes::ZERO));
        assert!(
            p[0].reason
                .detail
                .contains("50 MiB of hot memory kept above the budget"),
            "{}",
            p[0].reason
        );
        // 20% under: down to the budget.
        let p = place(&[a(800)], tier(0), FAST, 1.0);
        assert_eq!(mib(p[0].demote), 200);
        // Cold memory in use goes down to the budget whatever the margin.
        let c = TierVm {
            configured: Some(Bytes::from_mib(950)),
            ..vm("c", 1500, 1000, 500, 0)
        };
        assert_eq!(mib(place(&[c], tier(0), FAST, 1.0)[0].demote), 50);
    }

    #[test]
    fn promotions_into_room_are_held_to_the_fast_memory_free() {
        // a keeps 50 MiB of hot memory above its budget; b's budget counts on it: b gets
        // the 100 MiB free, not the 150 its budget leaves room for.
        let mut a = vm("a", 1500, 1000, 1500, 500);
        a.configured = Some(Bytes::from_mib(950));
        let mut b = vm("b", 1000, 0, 1000, 1000);
        b.configured = Some(Bytes::from_mib(150));
        let p = place(&[a, b], tier(100), FAST, 1.0);
        assert_eq!(mib(p[0].demote), 0);
        assert_eq!(mib(p[1].promote), 100);
        assert!(
            p[1].reason
                .detail
                .contains("promotion held to the fast memory free"),
            "{}",
            p[1].reason
        );
    }

    #[test]
    fn memory_in_use_is_demoted_only_once_untouched_for_the_cold_age() {
        // 2000 MiB fast, 500 hot, an operator budget of 1000 MiB: 1000 MiB to demote, of
        // the 1500 MiB cold in use only the 300 MiB past the cold age go.
        let a = |aged| TierVm {
            aged: Bytes::from_mib(aged),
            cold_age_s: 120.0,
            configured: Some(Bytes::from_mib(1000)),
            ..vm("a", 2000, 2000, 500, 0)
        };
        let p = place(&[a(300)], tier(0), FAST, 1.0);
        assert_eq!(mib(p[0].demote), 300);
        assert!(
            p[0].reason
                .detail
                .contains("700 MiB touched within the cold age (120 s) kept above the budget"),
            "{}",
            p[0].reason
        );
        // Older memory goes down to the budget, and nothing once none is old enough.
        assert_eq!(mib(place(&[a(1500)], tier(0), FAST, 1.0)[0].demote), 1000);
        assert_eq!(place(&[a(0)], tier(0), FAST, 1.0)[0].demote, Bytes::ZERO);
        // Nor is young memory exchanged for hot memory on the slow tier: 100 MiB past the
        // cold age, 100 MiB exchanged.
        let b = |aged| TierVm {
            aged: Bytes::from_mib(aged),
            ..vm("b", 3000, 1000, 900, 300)
        };
        let p = place(&[b(100)], tier(0), FAST, 1.0);
        assert_eq!((mib(p[0].promote), mib(p[0].demote)), (100, 100));
        let p = place(&[b(0)], tier(0), FAST, 1.0);
        assert_eq!((p[0].promote, p[0].demote), (Bytes::ZERO, Bytes::ZERO));
        // Hot memory too: a VM far above its budget keeps its hot memory touched within
        // the cold age.
        let c = TierVm {
            aged: Bytes::ZERO,
            configured: Some(Bytes::from_mib(500)),
            ..vm("c", 1500, 1000, 1500, 500)
        };
        let p = place(&[c], tier(0), FAST, 1.0);
        assert_eq!(p[0].demote, Bytes::ZERO);
        assert!(
            p[0].reason.detail.contains(
                "500 MiB of hot memory kept above the budget (touched within the cold age)"
            ),
            "{}",
            p[0].reason
        );
    }

    #[test]
    fn a_page_is_demoted_only_once_untouched_for_the_cold_age_and_a_touch_starts_it_over() {
        // A cold age of 3 scans; fast pages of ages 2, 3, 7, and a slow hot one.
        let mut p = pages(&[(2, true), (3, true), (7, true), (0, false)]);
        let (demote, promote) = pick_pages(&p, 10, 10, Some(3));
        assert_eq!((demote, promote), (vec![2, 1], vec![3]));
        assert_eq!(count_pages(&p, Some(3)).aged, 2);
        // Until the scans span the cold age no page has been untouched for it.
        assert_eq!(pick_pages(&p, 10, 0, None).0, Vec::<usize>::new());
        // Page 2 touched: its age is 0 again, and it goes only once 3 more scans found it
        // idle.
        p[2].age = 0;
        assert_eq!(pick_pages(&p, 10, 0, Some(3)).0, [1]);
        for _ in 0..3 {
            p.iter_mut().for_each(|p| p.age += 1);
        }
        assert_eq!(pick_pages(&p, 10, 0, Some(3)).0, [1, 0, 2]);
    }

    fn pages(spec: &[(u16, bool)]) -> Vec<PageTier> {
        spec.iter()
            .map(|&(age, fast)| PageTier { age, fast })
            .collect()
    }

    #[test]
    fn pages_are_counted_by_tier_and_heat() {
        let p = pages(&[(0, true), (3, true), (0, false), (0, false), (9, false)]);
        let c = count_pages(&p, Some(3));
        assert_eq!(
            c,
            PageCounts {
                fast: 2,
                slow: 3,
                hot: 3,
                hot_on_slow: 2,
                aged: 1,
            }
        );
        assert_eq!(count_pages(&p, Some(4)).aged, 0);
        assert_eq!(count_pages(&p, Some(0)).aged, 2);
        assert_eq!(
            count_pages(&p, None).aged,
            0,
            "the scans do not span the cold age"
        );
        assert_eq!(count_pages(&[], Some(1)), PageCounts::default());
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
        // No cold age: the oldest first, ties by index; a hot fast page only once no cold
        // one is left.
        let (demote, promote) = pick_pages(&p, 3, 1, Some(0));
        assert_eq!(demote, [2, 5, 0]);
        assert_eq!(promote, [3]);
        let (demote, promote) = pick_pages(&p, 10, 10, Some(0));
        assert_eq!(demote, [2, 5, 0, 1]);
        // A cold page on the slow tier is never promoted.
        assert_eq!(promote, [3, 6]);
        assert_eq!(pick_pages(&p, 0, 0, Some(0)), (vec![], vec![]));
        assert_eq!(
            pick_pages(&[], u64::MAX, u64::MAX, Some(0)),
            (vec![], vec![])
        );
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
            // A cold age of 2 scans: every cold page is past it.
            let c = count_pages(&p, Some(2));
            let vm = TierVm {
                name: "a",
                resident: Bytes(page.0 * (c.fast + c.slow)),
                fast: Bytes(page.0 * c.fast),
                hot: Bytes(page.0 * c.hot),
                hot_on_slow: Bytes(page.0 * c.hot_on_slow),
                free_fast: Bytes::ZERO,
                aged: Bytes(page.0 * c.aged),
                cold_age_s: 10.0,
                shares: 1,
                configured: Some(Bytes(page.0 * 16)),
            };
            let placed = &place(&[vm], tier(1000), config, 1.0)[0];
            assert!(placed.demote.0 + placed.promote.0 <= 8 * page.0);
            let (demote, promote) = pick_pages(
                &p,
                placed.demote.0 / page.0,
                placed.promote.0 / page.0,
                Some(2),
            );
            demote.iter().for_each(|&i| p[i].fast = false);
            promote.iter().for_each(|&i| p[i].fast = true);
        }
        let c = count_pages(&p, Some(2));
        assert_eq!((c.fast, c.hot_on_slow), (16, 0));
    }

    proptest::proptest! {
        #[test]
        fn budgets_fit_the_fast_tier_and_moves_stay_within_bounds(
            raw in proptest::collection::vec((0u64..8192, 0u64..8192, 0u64..8192, 0u64..8192, 0u32..4000, 0u64..8192, 0u64..8192), 1..6),
            free in 0u64..16384,
            reserve in 0u64..4096,
            rate in 0.0f64..4096.0,
        ) {
            let names: Vec<String> = (0..raw.len()).map(|i| format!("vm{i}")).collect();
            let vms: Vec<TierVm<'_>> = raw.iter().zip(&names).map(|(&(res, fast, hot, hos, shares, free, aged), name)| TierVm {
                shares,
                aged: Bytes::from_mib(aged),
                free_fast: Bytes::from_mib(free.min(fast).min(res.saturating_sub(hot))),
                ..vm(name, res, fast.min(res), hot.min(res), hos)
            }).collect();
            let tier = FastTier { free: Bytes::from_mib(free), reserve: Bytes::from_mib(reserve) };
            let config = TierConfig { margin: 0.1, rate_mib_s: rate };
            let p = place(&vms, tier, config, 1.0);
            // Guest-free fast memory is outside the division while the hot sets fit in the
            // rest, and divided with it when they do not.
            let held: Bytes = vms.iter().map(|v| v.fast - v.free_fast).sum();
            let in_use_capacity = (held + tier.free) - tier.reserve;
            let short = vms.iter().map(|v| v.hot.scale(1.1).min(v.resident - v.free_fast)).sum::<Bytes>() > in_use_capacity;
            let free_total: Bytes = vms.iter().map(|v| v.free_fast).sum();
            let capacity = if short { in_use_capacity + free_total } else { in_use_capacity };
            let total: Bytes = p.iter().map(|p| p.fast_budget).sum();
            proptest::prop_assert!(total <= capacity + Bytes(vms.len() as u64), "{total} > {capacity}");
            let limit = Bytes::from_f64(rate * 1024.0 * 1024.0);
            for (v, p) in vms.iter().zip(&p) {
                let in_use = v.resident - v.free_fast;
                let fast = v.fast - v.free_fast;
                let most = if short { v.resident } else { in_use };
                proptest::prop_assert!(p.fast_budget <= most);
                if !short {
                    // Never below the hot set and its margin while the fast tier holds them.
                    proptest::prop_assert!(p.fast_budget + Bytes(1) >= v.hot.scale(1.1).min(in_use));
                    proptest::prop_assert_eq!(p.reason.rule.as_ref(), "tier.hot");
                    // Guest-free fast memory is demoted only in exchange for hot memory.
                    proptest::prop_assert!(p.demote_free <= p.promote);
                }
                proptest::prop_assert!(p.demote + p.promote <= limit);
                proptest::prop_assert!(p.demote - p.demote_free <= fast);
                // Of memory in use, only what is past the cold age is demoted.
                proptest::prop_assert!(p.demote - p.demote_free <= v.aged);
                proptest::prop_assert!(p.demote_free <= v.free_fast);
                proptest::prop_assert!(p.promote <= (v.resident - v.fast).min(v.hot_on_slow));
                // Demotion never takes the VM below its budget except to make room for a
                // promotion.
                let counted = if short { v.fast } else { fast };
                let freed = if short { Bytes::ZERO } else { p.demote_free };
                proptest::prop_assert!(((counted + freed) - p.demote) + p.promote >= p.fast_budget.min(counted));
            }
            // The moves never fill the fast tier beyond what it holds.
            let before: Bytes = vms.iter().map(|v| v.fast).sum();
            let after: Bytes = vms.iter().zip(&p).map(|(v, p)| (v.fast - p.demote) + p.promote).sum();
            proptest::prop_assert!(after <= (before + tier.free - tier.reserve).max(before) + Bytes(vms.len() as u64), "{after} > {before}");
        }
    }
}
