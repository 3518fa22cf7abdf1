//! The documented over-admission bound of `scope: global` keys (docs/CLUSTER.md, "Regions"),
//! in one place: the normal bound from the share rule and the extra a partition adds.

use floodgate::{Algorithm, Limit};

use crate::scenario::Plan;

/// After a partition heals, the time until every region hears every other again: the longest
/// retransmission wait, two sync intervals and a round trip (documented as about 2.5 s with
/// the node's default `--region-sync-interval` of 100 ms, which the harness keeps).
pub const REGION_SETTLE_NS: u64 = 2_500_000_000;

/// Largest cost the harness sends (every check costs one unit).
pub const COST: u64 = 1;

/// A region's share of a burst: `max(burst / R, 1)`.
pub fn share(burst: u64, regions: usize) -> u64 {
    (burst / regions.max(1) as u64).max(1)
}

/// A limit's burst as the share rule reads it: GCRA's burst, a window's count.
pub fn burst_of(limit: &Limit) -> u64 {
    match limit.algorithm() {
        Algorithm::Gcra => limit.burst(),
        _ => limit.rate(),
    }
}

/// Normal operation: `(R - 1) × max(share, largest cost)` units per window the checker judges
/// (GCRA and the sliding log: any window of one period; fixed and sliding windows: each of their
/// own aligned windows, see `KeySpec::aligned_period_ns`).
pub fn normal_extra(limit: &Limit, regions: usize) -> u64 {
    if regions <= 1 {
        return 0;
    }
    (regions as u64 - 1) * share(burst_of(limit), regions).max(COST)
}

/// A partition of `fault_ns` into `sides` sides: GCRA `(k - 1) × (burst + rate × (T + settle))`,
/// the others `(k - 1) × limit` per window the checker judges (an aligned window for fixed and
/// sliding windows).
pub fn partition_extra(limit: &Limit, sides: usize, fault_ns: u64) -> u64 {
    let others = sides.saturating_sub(1) as u64;
    if others == 0 {
        return 0;
    }
    match limit.algorithm() {
        Algorithm::Gcra => {
            let span = fault_ns.saturating_add(REGION_SETTLE_NS) as f64;
            let refill = limit.rate() as f64 * span / limit.period_ns().max(1) as f64;
            others * (limit.burst() + refill.ceil() as u64)
        }
        _ => others * limit.rate(),
    }
}

/// How many sides a scenario's region fault splits the regions into: `region-partition` cuts
/// region 0 from the rest (2); `wan-delay` delays and drops on every path between regions, so
/// at worst every region stops hearing the others (R); no other scenario splits regions (1).
pub fn fault_sides(plan: Plan, regions: usize) -> usize {
    match plan {
        Plan::RegionPartition if regions >= 2 => 2,
        Plan::WanDelay => regions.max(1),
        _ => 1,
    }
}

/// The bound in words for `list`.
pub fn describe() -> &'static str {
    "global keys (with --regions R >= 2): limit + (R-1) x max(share, cost), share = max(burst/R, 1), per window (fixed/sliding windows: per aligned window of their own); in windows touching the fault or its 2.5 s settling, plus (k-1) x (burst + rate x (T + 2.5 s)) for GCRA and (k-1) x limit per aligned window for the others, T the fault's length, k its sides"
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn l(algorithm: Algorithm, rate: u64, burst: u64) -> Limit {
        Limit::new(algorithm, rate, S, burst).unwrap()
    }

    #[test]
    fn the_share_is_the_burst_over_the_regions_and_at_least_one() {
        assert_eq!(share(20, 2), 10);
        assert_eq!(share(25, 3), 8);
        assert_eq!(share(2, 3), 1);
    }

    #[test]
    fn the_normal_bound_is_r_minus_one_shares_per_aligned_window() {
        let gcra = l(Algorithm::Gcra, 20, 20);
        assert_eq!(normal_extra(&gcra, 1), 0);
        assert_eq!(normal_extra(&gcra, 2), 10);
        assert_eq!(normal_extra(&gcra, 3), 2 * 6);
        // Fixed window 25: share 12 with two regions, in each of its aligned windows.
        assert_eq!(normal_extra(&l(Algorithm::FixedWindow, 25, 25), 2), 12);
        assert_eq!(normal_extra(&l(Algorithm::SlidingLog, 25, 25), 2), 12);
    }

    #[test]
    fn a_partition_adds_a_burst_and_its_refill_per_extra_side() {
        let gcra = l(Algorithm::Gcra, 20, 20);
        // 8 s cut + 2.5 s settle at 20/s = 210, plus the burst 20.
        assert_eq!(partition_extra(&gcra, 2, 8 * S), 230);
        assert_eq!(partition_extra(&gcra, 3, 8 * S), 460);
        assert_eq!(partition_extra(&gcra, 1, 8 * S), 0);
        assert_eq!(
            partition_extra(&l(Algorithm::SlidingLog, 25, 25), 2, 8 * S),
            25
        );
        assert_eq!(
            partition_extra(&l(Algorithm::FixedWindow, 25, 25), 3, 8 * S),
            50
        );
    }

    #[test]
    fn only_region_faults_split_regions() {
        assert_eq!(fault_sides(Plan::RegionPartition, 3), 2);
        assert_eq!(fault_sides(Plan::WanDelay, 3), 3);
        assert_eq!(fault_sides(Plan::Kill, 3), 1);
    }
}
