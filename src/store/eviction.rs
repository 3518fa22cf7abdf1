//! Making room in a full shard: forget the buckets that are full again, else evict the
//! non-denying buckets with the least of their capacity consumed.

use std::sync::atomic::Ordering;

use hashbrown::HashTable;

use super::entries::{Identified, remove};
use super::shard::Shard;
use super::{StoreError, StoreStats};
use crate::BucketKey;

/// What evicting a bucket gives away, compared first by the share of its capacity consumed
/// (millionths: what the key would regain if it returned) and then by the time until it is full
/// again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Cost {
    consumed_ppm: u32,
    expires_in_ns: u64,
}

impl Cost {
    fn of(entry: &mut impl Identified, now_ns: u64) -> Cost {
        Cost {
            consumed_ppm: entry.consumed_ppm(now_ns),
            expires_in_ns: entry.expires_in(now_ns),
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Family {
    Gcra,
    Window,
    Log,
}

impl Shard {
    /// Frees space in a full shard: first by forgetting expired buckets, then by evicting the
    /// non-denying buckets that hold the smallest share of their capacity consumed (about 1/16
    /// of the shard at once, so the scan is amortised). An evicted key that returns starts full,
    /// so it regains what it had consumed: ranking by that share keeps the cost of an eviction
    /// at a small fraction of each evicted key's limit. Ranking by time until full instead would
    /// evict a busy key with a short period first, over and over, under a flood of new keys. A
    /// bucket that is denying is never evicted: when every bucket is denying, the new key is
    /// refused with [`StoreError::Full`] instead of silently resetting someone.
    pub(super) fn make_room(&mut self, now_ns: u64, stats: &StoreStats) -> Result<(), StoreError> {
        let expired = self.forget_expired(now_ns);
        stats.expired.fetch_add(expired as u64, Ordering::Relaxed);
        if expired > 0 {
            return Ok(());
        }
        let mut candidates: Vec<(Cost, Family, BucketKey)> = Vec::new();
        for entry in self.gcra.iter_mut() {
            if !entry.is_denying(now_ns) {
                candidates.push((Cost::of(entry, now_ns), Family::Gcra, entry.key()));
            }
        }
        collect_evictable(&mut self.windows, Family::Window, now_ns, &mut candidates);
        collect_evictable(&mut self.logs, Family::Log, now_ns, &mut candidates);
        if candidates.is_empty() {
            stats.refused.fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::Full);
        }
        let evict = (self.len() / 16).clamp(1, candidates.len());
        candidates.select_nth_unstable_by_key(evict - 1, |c| c.0);
        for &(_, family, key) in &candidates[..evict] {
            match family {
                Family::Gcra => self.gcra.remove(key),
                Family::Window => remove(&mut self.windows, key),
                Family::Log => remove(&mut self.logs, key),
            }
        }
        stats.evicted.fetch_add(evict as u64, Ordering::Relaxed);
        Ok(())
    }
}

fn collect_evictable<E: Identified>(
    table: &mut HashTable<E>,
    family: Family,
    now_ns: u64,
    out: &mut Vec<(Cost, Family, BucketKey)>,
) {
    for entry in table.iter_mut() {
        if !entry.is_denying(now_ns) {
            let key = BucketKey {
                hash: entry.hash(),
                check: entry.check(),
            };
            out.push((Cost::of(entry, now_ns), family, key));
        }
    }
}
