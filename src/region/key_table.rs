//! An outbox's per-key table: for each key with units a destination has not confirmed, how
//! many, and where its pending delta sits. Open addressing with linear probing and the key in
//! the slot, so a global check finds (or makes) its key's entry in one cache line, where a
//! SwissTable keeps the entries apart from the control bytes it searches (a second miss on
//! every new key); and a slot's address is known before it is read, so the acknowledgements'
//! pass over a message's keys prefetches ahead.
//!
//! Slots are placed by the key's hash mixed with a seed drawn per table, so which keys share
//! a probe run cannot be chosen from outside.

use std::hash::{BuildHasher, RandomState};

use crate::BucketKey;
use crate::open_addressing;

/// A key's counts, as the outbox keeps them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct KeyState {
    /// Its units pending and in flight together.
    pub(super) unconfirmed: u64,
    /// The round in which its delta was appended to the pending vector, and where: its delta
    /// while that round is still the pending one, stale after.
    pub(super) round: u32,
    pub(super) index: u32,
}

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    /// The key's `hash`: never zero for a key, so zero marks an empty slot.
    hash: u64,
    check: u32,
    state: KeyState,
}

impl Slot {
    fn is_empty(&self) -> bool {
        self.hash == 0
    }

    fn is(&self, key: BucketKey) -> bool {
        self.hash == key.hash && self.check == key.check
    }

    fn key(&self) -> BucketKey {
        BucketKey {
            hash: self.hash,
            check: self.check,
        }
    }
}

const MIN_SLOTS: usize = 16;

/// Slots a table keeps however few its keys (128 KiB): giving back less would only have it
/// grow again at the next round, and more is given back after a burst.
const KEPT_SLOTS: usize = 4_096;

/// The home slot of `hash` in a table of 2^`bits` slots: multiply-shift of the seeded hash, so
/// the high bits, which depend on every bit of the key's, pick the slot.
fn home(seed: u64, bits: u32, hash: u64) -> usize {
    ((hash ^ seed).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - bits)) as usize
}

#[derive(Debug)]
pub(super) struct KeyTable {
    slots: Box<[Slot]>,
    len: usize,
    seed: u64,
}

impl Default for KeyTable {
    fn default() -> Self {
        KeyTable {
            slots: vec![Slot::default(); MIN_SLOTS].into_boxed_slice(),
            len: 0,
            seed: RandomState::new().hash_one(0u64) | 1,
        }
    }
}

impl KeyTable {
    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where `hash`'s probe run starts.
    fn home(&self, hash: u64) -> usize {
        home(self.seed, self.slots.len().trailing_zeros(), hash)
    }

    fn index_of(&self, key: BucketKey) -> Option<usize> {
        open_addressing::find(
            &self.slots,
            self.home(key.hash),
            |slot| slot.is(key),
            Slot::is_empty,
        )
    }

    pub(super) fn get(&self, key: BucketKey) -> Option<&KeyState> {
        self.index_of(key).map(|i| &self.slots[i].state)
    }

    pub(super) fn get_mut(&mut self, key: BucketKey) -> Option<&mut KeyState> {
        self.index_of(key).map(|i| &mut self.slots[i].state)
    }

    /// `key`'s entry, made with `fresh` if it has none.
    pub(super) fn entry_or_insert(&mut self, key: BucketKey, fresh: KeyState) -> &mut KeyState {
        if let Some(i) = self.index_of(key) {
            return &mut self.slots[i].state;
        }
        if (self.len + 1) * 4 > self.slots.len() * 3 {
            self.rebuild(self.slots.len() * 2);
        }
        let i = self.place(Slot {
            hash: key.hash,
            check: key.check,
            state: fresh,
        });
        &mut self.slots[i].state
    }

    fn place(&mut self, slot: Slot) -> usize {
        let i = open_addressing::first_empty(&self.slots, self.home(slot.hash), Slot::is_empty);
        self.slots[i] = slot;
        self.len += 1;
        i
    }

    /// Removes `key` if present, shifting the rest of its probe run back so no lookup breaks.
    pub(super) fn remove(&mut self, key: BucketKey) {
        if let Some(hole) = self.index_of(key) {
            let (seed, bits) = (self.seed, self.slots.len().trailing_zeros());
            open_addressing::remove_at(
                &mut self.slots,
                hole,
                |slot| home(seed, bits, slot.hash),
                Slot::is_empty,
            );
            self.len -= 1;
        }
    }

    /// Every key and its counts, in no particular order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (BucketKey, &KeyState)> {
        self.slots
            .iter()
            .filter(|s| !s.is_empty())
            .map(|s| (s.key(), &s.state))
    }

    /// Forgets every key, and the room a burst of them took.
    pub(super) fn clear(&mut self) {
        self.slots = vec![Slot::default(); MIN_SLOTS].into_boxed_slice();
        self.len = 0;
    }

    /// Gives back room once the keys are far fewer than the slots (after a burst), down to
    /// `KEPT_SLOTS`.
    pub(super) fn shrink_to_fit_keys(&mut self) {
        let wanted = (self.len * 4).next_power_of_two().max(KEPT_SLOTS);
        if self.slots.len() >= wanted * 4 {
            self.rebuild(wanted);
        }
    }

    fn rebuild(&mut self, slots: usize) {
        let old = std::mem::replace(
            &mut self.slots,
            vec![Slot::default(); slots].into_boxed_slice(),
        );
        self.len = 0;
        for slot in old.iter().filter(|s| !s.is_empty()) {
            self.place(*slot);
        }
    }

    /// Starts loading `key`'s first probe slot (a hint: nothing is read).
    pub(super) fn prefetch(&self, key: BucketKey) {
        let addr = self.slots.as_ptr() as usize + self.home(key.hash) * size_of::<Slot>();
        crate::prefetch::prefetch(addr);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::simulation::SplitMix64;

    fn key(n: u64) -> BucketKey {
        BucketKey::for_key(&n.to_le_bytes())
    }

    fn state(units: u64) -> KeyState {
        KeyState {
            unconfirmed: units,
            ..KeyState::default()
        }
    }

    #[test]
    fn inserts_updates_and_removals_agree_with_a_map_through_growth_and_shrinking() {
        let mut largest = 0;
        let mut rng = SplitMix64::new(7);
        let mut table = KeyTable::default();
        let mut model: HashMap<BucketKey, u64> = HashMap::new();
        for step in 0..70_000u64 {
            // Few keys early and late, up to 20,000 in the middle: the table grows past 16,384
            // slots and shrinks back.
            let keys = if (20_000..50_000).contains(&step) {
                20_000
            } else {
                40
            };
            if step == 50_000 {
                // The burst's keys are confirmed: only the few stay.
                let few: Vec<BucketKey> = (0..40).map(key).collect();
                for k in model.keys().filter(|k| !few.contains(k)) {
                    table.remove(*k);
                }
                model.retain(|k, _| few.contains(k));
            }
            let k = key(rng.range(0, keys - 1));
            match rng.range(0, 3) {
                0 | 1 => {
                    let units = rng.range(1, 10);
                    table.entry_or_insert(k, state(0)).unconfirmed += units;
                    *model.entry(k).or_insert(0) += units;
                }
                2 => {
                    table.remove(k);
                    model.remove(&k);
                }
                _ => {
                    if let Some(s) = table.get_mut(k) {
                        s.unconfirmed += 1;
                    }
                    if let Some(u) = model.get_mut(&k) {
                        *u += 1;
                    }
                }
            }
            if step % 997 == 0 {
                table.shrink_to_fit_keys();
            }
            largest = largest.max(table.slots.len());
            assert_eq!(table.len, model.len(), "step {step}");
            assert_eq!(
                table.get(k).map(|s| s.unconfirmed),
                model.get(&k).copied(),
                "step {step}"
            );
        }
        let mut listed: Vec<(BucketKey, u64)> =
            table.iter().map(|(k, s)| (k, s.unconfirmed)).collect();
        let mut expected: Vec<(BucketKey, u64)> = model.into_iter().collect();
        listed.sort_unstable_by_key(|(k, _)| k.to_u128());
        expected.sort_unstable_by_key(|(k, _)| k.to_u128());
        assert_eq!(listed, expected);
        assert!(largest >= 16_384, "grew to {largest} slots");
        assert!(
            table.slots.len() == KEPT_SLOTS,
            "shrunk after the burst: {} slots for {}",
            table.slots.len(),
            table.len
        );
        table.clear();
        assert!(table.is_empty() && table.iter().next().is_none());
    }

    #[test]
    fn keys_whose_hashes_share_low_bits_still_spread() {
        // Hashes alike but for their top bits would all start at one slot if the table took
        // the low bits; the seeded multiply-shift spreads them.
        let mut table = KeyTable::default();
        for n in 1..=1_000u64 {
            let k = BucketKey {
                hash: n << 40,
                check: 0,
            };
            table.entry_or_insert(k, state(n));
        }
        let longest_run = table
            .slots
            .split(Slot::is_empty)
            .map(<[Slot]>::len)
            .max()
            .unwrap();
        assert!(longest_run < 64, "a probe run of {longest_run}");
        for n in 1..=1_000u64 {
            let k = BucketKey {
                hash: n << 40,
                check: 0,
            };
            assert_eq!(table.get(k), Some(&state(n)));
        }
    }
}
