//! The local admission rule for global keys, and why it bounds over-admission.
//!
//! A region admits a global check only if its bucket (its own consumption plus what the other
//! regions' deltas told it) allows it, **and**, for every other region it can reach, the units
//! of this key that region has not yet confirmed stay within the region's share of the burst:
//!
//! ```text
//! unconfirmed(dest, key) == 0  or  unconfirmed(dest, key) + cost <= share,  share = max(burst / R, 1)
//! ```
//!
//! Why it holds the bound. Call `missing_i` the units admitted by the other regions that region
//! `i` has not applied yet. A unit is unconfirmed until its destination acknowledged it, and a
//! destination acknowledges only what it applied, so `missing_i <= sum over j != i of
//! unconfirmed_j(i) <= (R - 1) * m`, with `m = max(share, largest cost)`. Remote units are
//! applied late and as if admitted when applied, which only makes `i`'s bucket stricter than
//! the truth without them. So when `i` admits, the bucket of all regions' admissions together
//! holds at most `missing_i` more than `i`'s, and `i`'s fits the limit:
//!
//! - GCRA: in every interval `[t1, t2]` the regions together admit at most
//!   `burst + rate * (t2 - t1) + (R - 1) * m`.
//! - Fixed window: at most `limit + (R - 1) * m` per window.
//! - Sliding window: the estimate over all regions' counts stays within `limit + (R - 1) * m`.
//! - Sliding log: at most `limit + (R - 1) * m` admissions in any trailing period.
//!
//! With `m = share` (costs at most `burst / R`) that is `(R - 1) / R` of a burst at most, and
//! never more than `(R - 1) * burst`. It costs throughput only when a region alone would admit
//! more than `share` units per confirmation round trip (sync interval plus one round trip).
//!
//! A region that has confirmed nothing for `unreachable_after` is left out of the rule (else a
//! partition would stop every region): then each side of the cut enforces alone, and a
//! partition of duration `T` can over-admit, per extra side, up to one burst (one window's
//! limit) plus what the rate refills in `T` for GCRA, one limit per window for windows.

/// Whether `cost` more units of a key may be admitted while `unconfirmed` of them are not yet
/// confirmed by one destination.
pub fn share_allows(unconfirmed: u64, cost: u64, share: u64) -> bool {
    unconfirmed == 0 || unconfirmed.saturating_add(cost) <= share
}

/// The documented bound on over-admission in normal operation, in units: `(R - 1) * max(share,
/// largest cost)`.
pub fn over_admission_bound(regions: usize, share: u64, largest_cost: u64) -> u64 {
    (regions.saturating_sub(1) as u64).saturating_mul(share.max(largest_cost))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_spends_at_most_its_share_unconfirmed() {
        assert!(share_allows(0, 1, 3));
        assert!(share_allows(2, 1, 3));
        assert!(!share_allows(3, 1, 3));
        // A cost above the share passes only with nothing unconfirmed.
        assert!(share_allows(0, 9, 3));
        assert!(!share_allows(1, 9, 3));
        assert_eq!(over_admission_bound(3, 10, 1), 20);
        assert_eq!(over_admission_bound(3, 1, 4), 8);
        assert_eq!(over_admission_bound(1, 10, 1), 0);
    }
}
