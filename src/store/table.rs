//! `KeyedTable`: the open-addressing table that holds each of the store's bucket families (GCRA,
//! window, sliding log), built for one cache miss per lookup and for prefetching.
//!
//! Each slot is a whole bucket (a GCRA bucket's 24 bytes: hash, check, margin, TAT), found by
//! linear probing from `hash & mask`, so a lookup touches the slot's cache line and rarely the
//! next; a general-purpose map would first read a control byte elsewhere (a second miss on a
//! cold key, and one no prefetch can start without the map's layout). Load stays at most 3/4,
//! so every probe ends at an empty slot; removal shifts the following run back (no tombstones).
//! A slot with `hash == 0` is empty: `BucketKey` never has a zero hash (it is mapped away when
//! the key is built, whatever the digest, so a received key cannot hide in an empty slot).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::BucketKey;
use crate::open_addressing;

/// A GCRA bucket: 24 bytes.
#[derive(Debug, Default)]
pub(super) struct GcraEntry {
    pub(super) hash: u64,
    pub(super) check: u32,
    /// Low 28 bits: how far (in whole ms, rounded down, at most ~3.1 days) the TAT may run
    /// ahead of `now` while a cost of 1 still passes; lets eviction tell a denying bucket
    /// without knowing its limit (rounding down only makes a bucket look denying, which
    /// protects it). Bits 28-29: where the bucket stands with eviction passes ([`Standing`]).
    /// Bit 30: consumed from since the last pass (see `eviction.rs`). Top bit: changed since
    /// the last replication round.
    pub(super) meta: AtomicU32,
    /// Theoretical arrival time. Updated by compare-and-swap: the value is the whole state, so
    /// `Relaxed` suffices (every update is a read-modify-write of this one atomic).
    pub(super) tat_ns: AtomicU64,
}

/// How an eviction pass finds a bucket used: what it would give away to forget it grows in
/// this order. A bucket starts `New`; one consumed from at a pass after the one that first saw
/// it is `Used` at that pass and, once seen so, `Idle` at the passes where it was not. A flood
/// of one-off keys stays `New` and is evicted before any key that came back (a scan-resistant
/// cache's probation), and so does a flood checking each key twice in a row: being consumed
/// from again counts only across a pass, so each junk key must outlive a pass as `New` first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Use {
    New,
    Idle,
    Used,
}

/// Where a bucket stands with the eviction passes that looked at it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) enum Standing {
    /// No pass has looked at it yet.
    #[default]
    Unseen,
    /// A pass saw it; it was not consumed from at a later one.
    Seen,
    /// Consumed from between two passes after the first that saw it: a returning key.
    Promoted,
}

impl Use {
    /// How a pass finds a bucket that stood at `standing` and was consumed from since the last
    /// pass or not (`used`), and where it stands after this pass. The shard's first pass has
    /// no earlier one to tell a return by: it takes a key checked again before it as returning
    /// (a flood gains at most one shard's worth, idle from the next pass on).
    pub(super) fn at_pass(used: bool, standing: Standing, first_pass: bool) -> (Use, Standing) {
        match (used, standing) {
            (true, Standing::Seen | Standing::Promoted) => (Use::Used, Standing::Promoted),
            (true, Standing::Unseen) if first_pass => (Use::Used, Standing::Promoted),
            (false, Standing::Promoted) => (Use::Idle, Standing::Promoted),
            (_, Standing::Unseen | Standing::Seen) => (Use::New, Standing::Seen),
        }
    }
}

/// `meta` bit marking a bucket changed since it was last replicated.
const DIRTY: u32 = 1 << 31;
/// `meta` bit marking a bucket consumed from since eviction last looked (see `eviction.rs`).
const USED: u32 = 1 << 30;
/// `meta` bit of [`Standing::Promoted`].
const PROMOTED: u32 = 1 << 29;
/// `meta` bit of [`Standing::Seen`].
const SEEN: u32 = 1 << 28;
/// Largest margin `meta` holds (about 3.1 days); larger margins saturate to it.
pub(super) const MAX_MARGIN_MS: u32 = SEEN - 1;

/// A margin in nanoseconds as `meta` holds it: whole ms, rounded down, saturated.
#[inline]
pub(super) fn margin_ms_of(margin_ns: u64) -> u32 {
    u32::try_from(margin_ns / 1_000_000)
        .unwrap_or(u32::MAX)
        .min(MAX_MARGIN_MS)
}

impl GcraEntry {
    /// A bucket, marked changed (to be replicated) when `changed`.
    pub(super) fn new(key: BucketKey, margin_ns: u64, tat_ns: u64, changed: bool) -> Self {
        let margin_ms = margin_ms_of(margin_ns);
        GcraEntry {
            hash: key.hash,
            check: key.check,
            meta: AtomicU32::new(margin_ms | if changed { DIRTY } else { 0 }),
            tat_ns: AtomicU64::new(tat_ns),
        }
    }

    pub(super) fn margin_ms(&self) -> u32 {
        self.meta.load(Ordering::Relaxed) & MAX_MARGIN_MS
    }

    /// How the bucket was used, as an eviction pass reads it (and moves it on).
    pub(super) fn take_use(&mut self, first_pass: bool) -> Use {
        let meta = self.meta.get_mut();
        let standing = if *meta & PROMOTED != 0 {
            Standing::Promoted
        } else if *meta & SEEN != 0 {
            Standing::Seen
        } else {
            Standing::Unseen
        };
        let (seen, after) = Use::at_pass(*meta & USED != 0, standing, first_pass);
        let bits = match after {
            Standing::Unseen => 0,
            Standing::Seen => SEEN,
            Standing::Promoted => PROMOTED,
        };
        *meta = (*meta & !(USED | SEEN | PROMOTED)) | bits;
        seen
    }

    /// Marks the bucket changed; true when it was not (its key must then be listed:
    /// `Shard::mark_dirty`). The load first keeps an already-dirty hot bucket's line shared.
    #[inline]
    #[must_use = "a bucket newly marked must be listed: use Shard::mark_dirty"]
    pub(super) fn mark_dirty(&self) -> bool {
        self.meta.load(Ordering::Relaxed) & DIRTY == 0
            && self.meta.fetch_or(DIRTY, Ordering::Relaxed) & DIRTY == 0
    }

    /// Marks the bucket used, sets its margin (that of the limit now in force, which may differ
    /// from the one it was created with) and, when `replicate`, marks it changed; true when
    /// that mark was newly set (its key must then be listed: `Shard::mark_gcra_changed`). One
    /// load and, only when something differs, one compare-and-swap: a hot bucket under an
    /// unchanged limit keeps its line shared. The swap keeps the changed mark (and the standing)
    /// as they are at the swap, not as first loaded: a round may clear the mark in between, and
    /// a mark set back without its key listed would keep every later change from being listed.
    #[inline]
    #[must_use = "a bucket newly marked must be listed: use Shard::mark_gcra_changed"]
    pub(super) fn mark_changed(&self, margin_ms: u32, replicate: bool) -> bool {
        let set = if replicate { DIRTY } else { 0 };
        let updated = self
            .meta
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |meta| {
                let wanted = margin_ms | set | USED | (meta & (DIRTY | SEEN | PROMOTED));
                (meta != wanted).then_some(wanted)
            });
        matches!(updated, Ok(before) if replicate && before & DIRTY == 0)
    }

    /// Clears the changed mark; true if it was set.
    pub(super) fn take_dirty(&self) -> bool {
        self.meta.load(Ordering::Relaxed) & DIRTY != 0
            && self.meta.fetch_and(!DIRTY, Ordering::Relaxed) & DIRTY != 0
    }

    pub(super) fn is_dirty(&self) -> bool {
        self.meta.load(Ordering::Relaxed) & DIRTY != 0
    }

    pub(super) fn key(&self) -> BucketKey {
        BucketKey {
            hash: self.hash,
            check: self.check,
        }
    }
}

const MIN_SLOTS: usize = 16;

/// A bucket as a table finds it: by its key's hash and check.
pub(super) trait Keyed {
    fn hash(&self) -> u64;
    fn check(&self) -> u32;
}

impl Keyed for GcraEntry {
    fn hash(&self) -> u64 {
        self.hash
    }
    fn check(&self) -> u32 {
        self.check
    }
}

/// An empty slot: every bucket kept in a table has a non-zero hash.
fn is_empty<E: Keyed>(entry: &E) -> bool {
    entry.hash() == 0
}

fn is<E: Keyed>(entry: &E, key: BucketKey) -> bool {
    entry.hash() == key.hash && entry.check() == key.check
}

/// Buckets of one family in their slots; `E::default()` is the empty slot (hash 0).
#[derive(Debug)]
pub(super) struct KeyedTable<E> {
    slots: Box<[E]>,
    len: usize,
}

/// The GCRA buckets of a shard.
pub(super) type GcraTable = KeyedTable<GcraEntry>;

impl<E: Keyed + Default> Default for KeyedTable<E> {
    fn default() -> Self {
        KeyedTable::with_slots(MIN_SLOTS)
    }
}

impl<E: Keyed + Default> KeyedTable<E> {
    fn with_slots(slots: usize) -> Self {
        debug_assert!(slots.is_power_of_two());
        KeyedTable {
            slots: (0..slots).map(|_| E::default()).collect(),
            len: 0,
        }
    }

    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Address of the slot where `key`'s probe starts and the table's mask, for prefetch hints.
    pub(super) fn layout(&self) -> (usize, usize) {
        (self.slots.as_ptr() as usize, self.mask())
    }

    fn index_of(&self, key: BucketKey) -> Option<usize> {
        open_addressing::find(
            &self.slots,
            key.hash as usize,
            |slot| is(slot, key),
            is_empty,
        )
    }

    pub(super) fn find(&self, key: BucketKey) -> Option<&E> {
        self.index_of(key).map(|i| &self.slots[i])
    }

    pub(super) fn find_mut(&mut self, key: BucketKey) -> Option<&mut E> {
        self.index_of(key).map(|i| &mut self.slots[i])
    }

    /// Inserts an entry whose key is not in the table.
    pub(super) fn insert(&mut self, entry: E) {
        debug_assert!(!is_empty(&entry));
        debug_assert!(
            self.index_of(BucketKey {
                hash: entry.hash(),
                check: entry.check()
            })
            .is_none()
        );
        if (self.len + 1) * 4 > self.slots.len() * 3 {
            self.rebuild(self.slots.len() * 2);
        }
        self.place(entry);
    }

    fn place(&mut self, entry: E) {
        let start = entry.hash() as usize;
        let i = open_addressing::first_empty(&self.slots, start, is_empty);
        self.slots[i] = entry;
        self.len += 1;
    }

    /// Removes `key` if present, shifting the rest of its probe run back so no lookup breaks;
    /// returns the entry removed.
    pub(super) fn remove(&mut self, key: BucketKey) -> Option<E> {
        let at = self.index_of(key)?;
        let removed = std::mem::take(&mut self.slots[at]);
        self.remove_at(at);
        Some(removed)
    }

    /// Empties the occupied slot `hole`, shifting the rest of its probe run back.
    fn remove_at(&mut self, hole: usize) {
        open_addressing::remove_at(
            &mut self.slots,
            hole,
            |entry| entry.hash() as usize,
            is_empty,
        );
        self.len -= 1;
    }

    /// Keeps only the entries for which `keep` is true among at most `max_slots` slots from
    /// slot `from`, removing the others in place (as `remove` does). `keep` may be asked twice
    /// about an entry: one shifted back into the slot just emptied is looked at again. Returns
    /// how many were dropped and the slot to go on from, or `None` once the walk reached the
    /// table's end (the caller then gives back the room: `slack.rs`). A table rebuilt between
    /// two calls is walked on from the same index: an entry may be looked at twice, or missed
    /// until the next walk, which only delays forgetting it.
    ///
    /// In place and in slices, because the expiry sweep runs it under the shard's lock:
    /// rebuilding the whole table on every sweep (a fresh table of hundreds of KiB, every entry
    /// placed again, the old one freed) held the lock and a core long enough to put the node's
    /// p99 at 10,000 req/s from about 130 to 215 µs with a million keys.
    pub(super) fn retain_slots(
        &mut self,
        from: usize,
        max_slots: usize,
        mut keep: impl FnMut(&mut E) -> bool,
    ) -> (usize, Option<usize>) {
        let before = self.len;
        let end = from.saturating_add(max_slots).min(self.slots.len());
        let mut i = from;
        while i < end {
            if !is_empty(&self.slots[i]) && !keep(&mut self.slots[i]) {
                // The next entry of the run may now sit in slot `i`: not advancing looks at it.
                // Each pass either advances or removes one entry, so the loop is bounded.
                self.remove_at(i);
                continue;
            }
            i += 1;
        }
        if end < self.slots.len() {
            return (before - self.len, Some(end));
        }
        (before - self.len, None)
    }

    /// The bytes the table's slots take.
    pub(super) fn allocation_size(&self) -> usize {
        self.slots.len() * size_of::<E>()
    }

    /// Rebuilds the table with the fewest slots that hold its entries at most 3/4 full: then
    /// more than 3/8 full, the load a bucket's charge assumes.
    pub(super) fn shrink_to_fit(&mut self) {
        let mut slots = self.slots.len();
        while slots > MIN_SLOTS && self.len * 4 <= (slots / 2) * 3 {
            slots /= 2;
        }
        if slots < self.slots.len() {
            self.rebuild(slots);
        }
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &E> {
        self.slots.iter().filter(|e| !is_empty(*e))
    }

    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = &mut E> {
        self.slots.iter_mut().filter(|e| !is_empty(*e))
    }

    fn rebuild(&mut self, slots: usize) {
        let old = std::mem::replace(self, KeyedTable::with_slots(slots));
        for entry in Vec::from(old.slots) {
            if !is_empty(&entry) {
                self.place(entry);
            }
        }
    }
}

/// Asks the CPU to start loading `key`'s first probe slot in a table of `E`, given its layout
/// read earlier (possibly stale): the slot's first line and, for a slot that ends on another
/// line, that one too. A hint only: no memory is read here, so a stale address is harmless.
#[inline]
pub(super) fn prefetch<E>(layout: (usize, usize), key: BucketKey) {
    let (base, mask) = layout;
    let first = base.wrapping_add((key.hash as usize & mask).wrapping_mul(size_of::<E>()));
    let last = first.wrapping_add(size_of::<E>() - 1);
    crate::prefetch::prefetch(first);
    if first / 64 != last / 64 {
        crate::prefetch::prefetch(last);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(hash: u64, tat: u64) -> GcraEntry {
        GcraEntry::new(key(hash), 0, tat, true)
    }

    fn key(hash: u64) -> BucketKey {
        BucketKey {
            hash,
            check: hash as u32,
        }
    }

    /// Inserts, removes and lookups agree with a plain map, including across wrap-around and
    /// clustered hashes (many keys with the same home slot).
    #[test]
    fn behaves_like_a_map() {
        let mut table = GcraTable::default();
        let mut model = std::collections::HashMap::new();
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for step in 0..20_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Small hash space: clusters and repeats; low bits shared to force collisions.
            let hash = (x % 700 + 1) * 64 + 15;
            if x.is_multiple_of(3) {
                table.remove(key(hash));
                model.remove(&hash);
            } else if table.find(key(hash)).is_none() {
                table.insert(entry(hash, step));
                model.insert(hash, step);
            }
            if step % 1_000 == 0 {
                let dropped = table
                    .retain_slots(0, usize::MAX, |e| e.tat_ns.load(Ordering::Relaxed) % 5 != 0)
                    .0;
                let before = model.len();
                model.retain(|_, t| *t % 5 != 0);
                assert_eq!(dropped, before - model.len());
            }
            assert_eq!(table.len(), model.len());
        }
        for (&hash, &tat) in &model {
            assert_eq!(
                table
                    .find(key(hash))
                    .map(|e| e.tat_ns.load(Ordering::Relaxed)),
                Some(tat)
            );
        }
        assert_eq!(table.iter_mut().count(), model.len());
    }

    /// A probe run that wraps from the last slot to the first, thinned in place: every kept
    /// entry stays findable, and the dropped ones are gone.
    #[test]
    fn retain_in_place_keeps_a_wrapped_run_findable() {
        let mut table = GcraTable::default();
        let slots = table.slots.len() as u64;
        // Ten entries whose home is one of the last two slots: the run wraps past the end.
        let hashes: Vec<u64> = (0..10)
            .map(|i| (slots - 2 + i % 2) + slots * (i + 1))
            .collect();
        for (i, &hash) in hashes.iter().enumerate() {
            table.insert(entry(hash, i as u64));
        }
        assert!(
            table.slots[0].hash != 0,
            "the run must wrap for this test to mean anything"
        );
        let (dropped, next) =
            table.retain_slots(0, usize::MAX, |e| e.tat_ns.load(Ordering::Relaxed) % 3 != 0);
        assert_eq!(next, None);
        assert_eq!(dropped, 4);
        for (i, &hash) in hashes.iter().enumerate() {
            assert_eq!(table.find(key(hash)).is_some(), i % 3 != 0, "entry {i}");
        }
        assert_eq!(table.len(), 6);
    }
}
