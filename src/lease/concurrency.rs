//! `LeaseSet`: one key's leases. At most `max` live at once; a lease whose expiry has passed is
//! reclaimed on the next look (lazily) or by the store's sweep, whichever comes first.

use super::LeaseLimit;

/// One held lease: its id (random, unique among its key's live leases, see `LeaseIds`) and
/// when it is reclaimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub id: super::LeaseId,
    pub expires_at_ns: u64,
}

/// The answer to an acquire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquired {
    /// Granted: the new lease and how many are held now, itself included.
    Granted { lease: Lease, in_use: u64 },
    /// None free: how many are held, and when the earliest of them expires (from now, >= 1 ns).
    Refused { in_use: u64, retry_after_ns: u64 },
}

/// One key's leases.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseSet {
    /// The max of the last acquire (or merged copy): a changed limit applies at the next grant.
    pub(crate) max: u64,
    pub(crate) leases: Vec<Lease>,
    /// Changed here since replication last took it.
    pub(crate) changed: bool,
}

impl LeaseSet {
    /// Drops every lease expired at `now_ns`; returns how many.
    pub fn reclaim(&mut self, now_ns: u64) -> usize {
        let before = self.leases.len();
        self.leases.retain(|l| l.expires_at_ns > now_ns);
        self.give_back_room();
        before - self.leases.len()
    }

    /// Keeps room for at most twice the leases held (and the smallest allocation, 4), what
    /// [`super::LEASE_BYTES`] charges: a set that once held many leases would otherwise keep
    /// their room while the store counts only the few left.
    fn give_back_room(&mut self) {
        let least = self.leases.len().max(4);
        if self.leases.capacity() > 2 * least {
            self.leases.shrink_to(least);
        }
    }

    /// Grants lease `id` if fewer than `limit.max()` are live at `now_ns` (reclaim first).
    pub fn acquire(&mut self, limit: &LeaseLimit, id: super::LeaseId, now_ns: u64) -> Acquired {
        self.max = limit.max();
        let in_use = self.leases.len() as u64;
        if in_use >= limit.max() {
            let earliest = self.leases.iter().map(|l| l.expires_at_ns).min();
            let retry_after_ns = earliest.map_or(1, |at| at.saturating_sub(now_ns).max(1));
            return Acquired::Refused {
                in_use,
                retry_after_ns,
            };
        }
        let lease = Lease {
            id,
            expires_at_ns: now_ns.saturating_add(limit.ttl_ns()),
        };
        self.leases.push(lease);
        self.changed = true;
        Acquired::Granted {
            lease,
            in_use: in_use + 1,
        }
    }

    /// Releases lease `id`; false when it is not held (released already, expired, unknown):
    /// releasing twice is not an error.
    pub fn release(&mut self, id: super::LeaseId) -> bool {
        let Some(i) = self.leases.iter().position(|l| l.id == id) else {
            return false;
        };
        self.leases.swap_remove(i);
        self.give_back_room();
        self.changed = true;
        true
    }

    /// Extends lease `id` to expire `ttl_ns` after `now_ns`; `None` when it is not held (it
    /// expired and may have been granted to someone else: the holder must acquire again).
    pub fn renew(&mut self, id: super::LeaseId, ttl_ns: u64, now_ns: u64) -> Option<Lease> {
        let lease = self.leases.iter_mut().find(|l| l.id == id)?;
        lease.expires_at_ns = now_ns.saturating_add(ttl_ns);
        self.changed = true;
        Some(*lease)
    }

    /// Merges a copy from a peer: the union of both (a lease either side holds is held, until
    /// the later of the two expiries), minus the ids the peer released. Never loses a grant, so
    /// a merge can only make a key stricter. Returns how many leases were added.
    pub fn merge(
        &mut self,
        max: u64,
        leases: &[Lease],
        released: &[super::LeaseId],
        now_ns: u64,
    ) -> usize {
        if max > 0 {
            self.max = max;
        }
        let mut added = 0;
        for incoming in leases.iter().filter(|l| l.expires_at_ns > now_ns) {
            match self.leases.iter_mut().find(|l| l.id == incoming.id) {
                Some(held) => held.expires_at_ns = held.expires_at_ns.max(incoming.expires_at_ns),
                None => {
                    self.leases.push(*incoming);
                    added += 1;
                }
            }
        }
        self.leases.retain(|l| !released.contains(&l.id));
        self.give_back_room();
        added
    }

    pub fn len(&self) -> usize {
        self.leases.len()
    }

    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    pub fn max(&self) -> u64 {
        self.max
    }

    pub fn leases(&self) -> &[Lease] {
        &self.leases
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;

    fn limit(max: u64, ttl_s: u64) -> LeaseLimit {
        LeaseLimit::new(max, ttl_s * SEC).unwrap()
    }

    #[test]
    fn grants_up_to_max_then_refuses_until_the_earliest_expiry() {
        let mut set = LeaseSet::default();
        let l = limit(2, 10);
        assert!(matches!(
            set.acquire(&l, 1, 0),
            Acquired::Granted { in_use: 1, .. }
        ));
        assert!(matches!(
            set.acquire(&l, 2, 3 * SEC),
            Acquired::Granted { in_use: 2, .. }
        ));
        assert_eq!(
            set.acquire(&l, 3, 4 * SEC),
            Acquired::Refused {
                in_use: 2,
                retry_after_ns: 6 * SEC
            }
        );
        // At the earliest expiry the first lease is reclaimed, not a nanosecond before.
        set.reclaim(10 * SEC - 1);
        assert_eq!(set.len(), 2);
        assert_eq!(set.reclaim(10 * SEC), 1);
        assert!(matches!(
            set.acquire(&l, 3, 10 * SEC),
            Acquired::Granted { in_use: 2, .. }
        ));
    }

    #[test]
    fn release_is_idempotent_and_frees_a_place() {
        let mut set = LeaseSet::default();
        let l = limit(1, 10);
        set.acquire(&l, 7, 0);
        assert!(matches!(set.acquire(&l, 8, 0), Acquired::Refused { .. }));
        assert!(set.release(7));
        assert!(!set.release(7));
        assert!(!set.release(99));
        assert!(matches!(set.acquire(&l, 8, 0), Acquired::Granted { .. }));
    }

    #[test]
    fn renew_extends_a_held_lease_and_not_an_expired_one() {
        let mut set = LeaseSet::default();
        let l = limit(1, 10);
        set.acquire(&l, 1, 0);
        assert_eq!(
            set.renew(1, 30 * SEC, 5 * SEC).map(|l| l.expires_at_ns),
            Some(35 * SEC)
        );
        set.reclaim(34 * SEC);
        assert_eq!(set.len(), 1);
        set.reclaim(35 * SEC);
        assert_eq!(set.renew(1, 30 * SEC, 35 * SEC), None);
    }

    #[test]
    fn a_merge_keeps_every_grant_and_drops_what_the_peer_released() {
        let mut set = LeaseSet::default();
        let l = limit(3, 10);
        set.acquire(&l, 1, 0);
        set.acquire(&l, 2, 0);
        let theirs = [
            Lease {
                id: 2,
                expires_at_ns: 20 * SEC,
            },
            Lease {
                id: 3,
                expires_at_ns: 10 * SEC,
            },
            Lease {
                id: 4,
                expires_at_ns: SEC, // already expired at the merge
            },
        ];
        assert_eq!(set.merge(3, &theirs, &[1], 2 * SEC), 1);
        let mut held: Vec<(super::super::LeaseId, u64)> = set
            .leases()
            .iter()
            .map(|l| (l.id, l.expires_at_ns / SEC))
            .collect();
        held.sort();
        assert_eq!(held, vec![(2, 20), (3, 10)]);
    }
}
