//! Unconfirmed units that follow a key to its new decider in the same region.
//!
//! The admission rule holds a region's unconfirmed units of a key below its share, but each
//! node counts only what it admitted itself. When a key's slot moves, the node that gave it
//! away still has units another region has not confirmed; without them the new decider could
//! admit a whole share more before they are confirmed. So the giver hands them over with the
//! slot ([`super::Exchange::hand_over_unconfirmed`]) and the new decider counts them beside its
//! own ([`super::Exchange::inherit`]) until they expire, after `unreachable_after`.
//!
//! The giver stops counting them when they are confirmed, usually one sync interval and a round
//! trip later; the new decider cannot see that, so it counts them longer, and a key whose
//! region share was spent stays held back for up to `unreachable_after` after a move (a cost in
//! availability, not in accuracy). Units still unconfirmed after that long (messages lost again
//! and again while others got through) stop counting at the new decider before the giver's
//! confirmation: then the region can pass its share by what is left of them, as when a
//! destination counts as unreachable.

use hashbrown::HashMap;

use super::scope::RegionName;
use crate::BucketKey;

/// Units of `key` that `region` had not confirmed when the key left the node that admitted
/// them (or that inherited them before).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnconfirmedUnits {
    pub key: BucketKey,
    pub region: RegionName,
    pub units: u64,
}

/// One inherited entry: units toward one region, counted until `until_ns`.
#[derive(Debug, Clone)]
struct Entry {
    region: RegionName,
    units: u64,
    until_ns: u64,
}

/// Inherited units per key, bounded in keys.
#[derive(Debug, Default)]
pub(super) struct Inherited {
    by_key: HashMap<BucketKey, Vec<Entry>>,
}

impl Inherited {
    /// Adds `units`, counted until `until_ns`. False (nothing added) when `max_keys` keys hold
    /// entries already (after the expired ones are dropped), or the key holds entries for
    /// `max_regions` regions already: a peer cannot grow either without bound.
    pub(super) fn add(
        &mut self,
        now_ns: u64,
        units: &UnconfirmedUnits,
        until_ns: u64,
        (max_keys, max_regions): (usize, usize),
    ) -> bool {
        if units.units == 0 {
            return true;
        }
        if !self.by_key.contains_key(&units.key) && self.by_key.len() >= max_keys {
            self.prune(now_ns);
            if self.by_key.len() >= max_keys {
                return false;
            }
        }
        let entries = self.by_key.entry(units.key).or_default();
        entries.retain(|e| e.until_ns > now_ns);
        match entries.iter().position(|e| e.region == units.region) {
            Some(at) => {
                let entry = &mut entries[at];
                entry.units = entry.units.saturating_add(units.units);
                entry.until_ns = entry.until_ns.max(until_ns);
            }
            None if entries.len() >= max_regions => return false,
            None => entries.push(Entry {
                region: units.region.clone(),
                units: units.units,
                until_ns,
            }),
        }
        true
    }

    /// Units of `key` toward `region` still counted at `now_ns`.
    pub(super) fn units(&self, key: BucketKey, region: &RegionName, now_ns: u64) -> u64 {
        if self.by_key.is_empty() {
            return 0;
        }
        self.by_key.get(&key).map_or(0, |entries| {
            entries
                .iter()
                .filter(|e| e.region == *region && e.until_ns > now_ns)
                .fold(0, |sum, e| sum.saturating_add(e.units))
        })
    }

    /// Every live entry of the keys `moving` names, taken out (they follow the key on).
    pub(super) fn take(
        &mut self,
        now_ns: u64,
        moving: &dyn Fn(BucketKey) -> bool,
    ) -> Vec<UnconfirmedUnits> {
        let keys: Vec<BucketKey> = self.by_key.keys().copied().filter(|&k| moving(k)).collect();
        let mut taken = Vec::new();
        for key in keys {
            for entry in self.by_key.remove(&key).unwrap_or_default() {
                if entry.until_ns > now_ns {
                    taken.push(UnconfirmedUnits {
                        key,
                        region: entry.region,
                        units: entry.units,
                    });
                }
            }
        }
        taken
    }

    /// Drops expired entries; returns how many keys are left.
    pub(super) fn prune(&mut self, now_ns: u64) -> usize {
        self.by_key.retain(|_, entries| {
            entries.retain(|e| e.until_ns > now_ns);
            !entries.is_empty()
        });
        self.by_key.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn units(key: &[u8], region: &str, units: u64) -> UnconfirmedUnits {
        UnconfirmedUnits {
            key: BucketKey::for_key(key),
            region: RegionName::new(region).unwrap(),
            units,
        }
    }

    #[test]
    fn units_count_per_region_until_they_expire() {
        let mut inherited = Inherited::default();
        let us = RegionName::new("us").unwrap();
        let ap = RegionName::new("ap").unwrap();
        assert!(inherited.add(0, &units(b"k", "us", 3), 100, (8, 8)));
        assert!(inherited.add(10, &units(b"k", "us", 2), 150, (8, 8)));
        assert!(inherited.add(10, &units(b"k", "ap", 7), 50, (8, 8)));
        let key = BucketKey::for_key(b"k");
        assert_eq!(inherited.units(key, &us, 20), 5);
        assert_eq!(inherited.units(key, &ap, 20), 7);
        assert_eq!(inherited.units(key, &ap, 50), 0);
        assert_eq!(inherited.units(key, &us, 150), 0);
        assert_eq!(inherited.prune(150), 0);
    }

    #[test]
    fn keys_are_bounded_and_expired_ones_make_room() {
        let mut inherited = Inherited::default();
        assert!(inherited.add(0, &units(b"a", "us", 1), 100, (2, 8)));
        assert!(inherited.add(0, &units(b"b", "us", 1), 200, (2, 8)));
        assert!(!inherited.add(50, &units(b"c", "us", 1), 300, (2, 8)));
        // A key already held takes more.
        assert!(inherited.add(50, &units(b"b", "us", 1), 300, (2, 8)));
        // Once "a" expired, "c" fits.
        assert!(inherited.add(100, &units(b"c", "us", 1), 300, (2, 8)));
        // A key holds entries for at most so many regions.
        assert!(!inherited.add(100, &units(b"c", "ap", 1), 300, (2, 1)));
        assert!(inherited.add(100, &units(b"c", "us", 1), 300, (2, 1)));
    }

    #[test]
    fn taken_entries_leave_and_expired_ones_are_not_passed_on() {
        let mut inherited = Inherited::default();
        assert!(inherited.add(0, &units(b"a", "us", 4), 100, (8, 8)));
        assert!(inherited.add(0, &units(b"b", "us", 5), 10, (8, 8)));
        assert!(inherited.add(0, &units(b"c", "us", 6), 100, (8, 8)));
        let (a, b) = (BucketKey::for_key(b"a"), BucketKey::for_key(b"b"));
        let taken = inherited.take(20, &|k| k == a || k == b);
        assert_eq!(taken, vec![units(b"a", "us", 4)]);
        assert_eq!(inherited.prune(20), 1);
    }
}
