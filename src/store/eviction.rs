//! Making room in a full shard: forget the buckets that are full again, then evict in order of
//! what forgetting them gives away, denying buckets last.

use std::cmp::Reverse;
use std::sync::atomic::Ordering;

use super::budget::{Bounds, GCRA_BUCKET_BYTES, WINDOW_BUCKET_BYTES, log_bytes};
use super::entries::{Family, Identified};
use super::shard::Shard;
use super::table::Use;
use super::{StoreError, StoreStats};
use crate::BucketKey;

/// What evicting a bucket gives away, compared field by field, least first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Cost {
    /// A key in use over-admits as soon as it comes back; a flood's one-off key may never.
    used: Use,
    /// Within the same use, a denying bucket goes last: the key regains everything at once (a
    /// flood must not buy a locked-out key its attempts back).
    denying: bool,
    /// Among new buckets, the one holding its room longest goes first: a one-off key about to
    /// be full again is forgotten soon at no cost, and a fixed window just begun (new again
    /// every window) is a key in use, not the flood's hour-long one.
    new_holds: Reverse<u64>,
    /// The share of its capacity consumed (millionths): what the key regains if it returns.
    consumed_ppm: u32,
    expires_in_ns: u64,
}

/// A bucket a pass may evict, and what evicting it gives away.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    cost: Cost,
    denying: bool,
    family: Family,
    key: BucketKey,
}

impl Candidate {
    fn of(
        entry: &mut impl Identified,
        now_ns: u64,
        first_pass: bool,
        family: Family,
        key: BucketKey,
    ) -> Self {
        let used = entry.take_use(first_pass);
        let expires_in_ns = entry.expires_in(now_ns);
        let denying = entry.is_denying(now_ns);
        Candidate {
            cost: Cost {
                used,
                denying,
                new_holds: Reverse(if used == Use::New { expires_in_ns } else { 0 }),
                consumed_ppm: entry.consumed_ppm(now_ns),
                expires_in_ns,
            },
            denying,
            family,
            key,
        }
    }
}

impl Shard {
    /// True when a bucket of `bytes` more fits within `bounds`.
    pub(super) fn fits(&self, bytes: usize, bounds: Bounds) -> bool {
        self.len() < bounds.keys && self.bytes.used().saturating_add(bytes) <= bounds.bytes
    }

    /// Frees room for a bucket of `bytes` (or for `spare`'s bucket to grow by that much): first
    /// by forgetting expired buckets (no decision changes), then by evicting the cheapest to
    /// forget by [`Cost`]: keys not consumed from again after a pass first saw them (the
    /// longest to be full again first), then keys idle since the last pass, then keys in use; within
    /// each, non-denying before denying, then the smallest share consumed. At least 1/16 of the shard goes at once, so the scan is
    /// amortised. An evicted key that returns starts full, so it regains what it had
    /// consumed: the order keeps that at a small share of a key nobody is using. Ranking by time
    /// until full instead would evict a busy key with a short period first, over and over,
    /// under a flood of new keys. [`StoreError::Full`] only when nothing but `spare` is left.
    pub(super) fn make_room(
        &mut self,
        now_ns: u64,
        bytes: usize,
        bounds: Bounds,
        spare: Option<BucketKey>,
        stats: &StoreStats,
    ) -> Result<(), StoreError> {
        let expired = self.forget_expired(now_ns);
        stats.expired.fetch_add(expired as u64, Ordering::Relaxed);
        if self.fits(bytes, bounds) {
            return Ok(());
        }
        let mut candidates: Vec<Candidate> = Vec::new();
        let first = !std::mem::replace(&mut self.passed, true);
        let gcra = self.gcra.iter_mut();
        collect(gcra, Family::Gcra, now_ns, first, &mut candidates);
        let windows = self.windows.iter_mut();
        collect(windows, Family::Window, now_ns, first, &mut candidates);
        let logs = self.logs.iter_mut();
        collect(logs, Family::Log, now_ns, first, &mut candidates);
        candidates.retain(|c| Some(c.key) != spare);
        candidates.sort_unstable_by_key(|c| c.cost);
        let batch = (self.len() / 16).max(1);
        for (evicted, candidate) in candidates.iter().enumerate() {
            if evicted >= batch && self.fits(bytes, bounds) {
                break;
            }
            let Candidate {
                cost,
                denying,
                family,
                key,
            } = *candidate;
            self.evict(family, key);
            stats.evicted.fetch_add(1, Ordering::Relaxed);
            if denying {
                stats.evicted_denying.fetch_add(1, Ordering::Relaxed);
            } else if cost.used == Use::New {
                stats.evicted_new.fetch_add(1, Ordering::Relaxed);
            } else {
                stats.evicted_used.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.give_back_slack();
        if self.fits(bytes, bounds) {
            return Ok(());
        }
        stats.refused.fetch_add(1, Ordering::Relaxed);
        Err(StoreError::Full)
    }

    /// Removes one bucket and releases what it cost.
    fn evict(&mut self, family: Family, key: BucketKey) {
        match family {
            Family::Gcra => {
                if self.gcra.remove(key).is_some() {
                    self.bytes.release(GCRA_BUCKET_BYTES);
                }
            }
            Family::Window => {
                if self.windows.remove(key).is_some() {
                    self.bytes.release(WINDOW_BUCKET_BYTES);
                }
            }
            Family::Log => {
                if let Some(mut removed) = self.logs.remove(key) {
                    self.bytes.release(log_bytes(&removed.slot.get_mut().1));
                }
            }
        }
    }
}

fn collect<'a, E: Identified + 'a>(
    entries: impl Iterator<Item = &'a mut E>,
    family: Family,
    now_ns: u64,
    first_pass: bool,
    out: &mut Vec<Candidate>,
) {
    for entry in entries {
        let key = BucketKey::of(entry);
        out.push(Candidate::of(entry, now_ns, first_pass, family, key));
    }
}
