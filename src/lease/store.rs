//! `LeaseStore`: every key's lease set, in shards behind short locks, bounded node-wide by the
//! number of leases held. What replication and hand-off need: the sets changed since the last
//! round and the ids released since then (tombstones), an export by slot, and a merge.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

use super::{Acquired, Lease, LeaseId, LeaseLimit, LeaseSet};
use crate::BucketKey;

/// Shards of the map: lease operations are rare next to checks, so a few suffice to keep
/// concurrent acquires on different keys apart.
const SHARDS: usize = 64;
/// Most release tombstones a shard keeps between replication rounds. Past it the oldest are
/// dropped: the replica then holds that lease until its TTL, stricter, never looser.
const MAX_TOMBSTONES_PER_SHARD: usize = 4_096;
/// Least time between two whole sweeps made by acquires refused for room: expired leases of
/// keys nobody touches again are found within this long of a refusal, and a caller retrying
/// at a full store walks the store at most ten times a second, not once per acquire.
const ROOM_SWEEP_EVERY_NS: u64 = 100_000_000;

/// What one held lease costs at most, in bytes: alone in its key's set, the map entry at the
/// lowest load a hash map has after it grew (7/16) and the set's smallest allocation (4 leases).
pub const LEASE_BYTES: usize =
    (size_of::<(BucketKey, LeaseSet)>() + 1) * 16 / 7 + 4 * size_of::<super::Lease>();

/// Bounds of a node's lease store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseStoreConfig {
    /// Most leases held at once on this node, all keys together (replicas included). An acquire
    /// past it is refused (`LeaseStoreError::Full`); a merge past it drops the extra leases.
    pub max_leases: usize,
}

impl Default for LeaseStoreConfig {
    fn default() -> Self {
        LeaseStoreConfig {
            max_leases: 1_000_000,
        }
    }
}

/// Where a store's lease ids come from.
///
/// A lease is named by its key and its id alone: whoever sends both may release or renew it. So
/// an id must tell nothing about any other: holding one lease must not let a caller work out its
/// neighbours'. Each id is 128 bits drawn from a cryptographically secure generator (the node
/// draws them from the operating system's; the core reads no randomness of its own), cut to
/// their low 64 for a caller whose protocol version carries no more ([`LeaseIdWidth`]), and a
/// store's ids are never 0 ("no lease") nor one a live lease of the same key holds (drawn again:
/// two live leases of one key never share an id).
pub trait LeaseIds: Send + Sync + std::fmt::Debug {
    /// The next id: 128 bits from a cryptographically secure generator.
    fn next_id(&self) -> LeaseId;
}

/// How many random bits a new lease's id has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseIdWidth {
    /// For a caller, or a cluster member, whose protocol version has 64-bit lease ids.
    Bits64,
    Bits128,
}

impl LeaseIdWidth {
    fn cut(self, id: LeaseId) -> LeaseId {
        match self {
            LeaseIdWidth::Bits64 => id & LeaseId::from(u64::MAX),
            LeaseIdWidth::Bits128 => id,
        }
    }
}

/// Why an acquire could not be decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LeaseStoreError {
    #[error(
        "this node holds {max_leases} leases already (its --max-leases, or 1/8 of --max-store-bytes)"
    )]
    Full { max_leases: usize },
}

/// The answer to a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    /// False when the lease was not held (released before, expired, or never granted).
    pub released: bool,
    pub in_use: u64,
}

/// The answer to a renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewed {
    Renewed {
        lease: Lease,
        in_use: u64,
    },
    /// Not held: it expired (and its place may be someone else's) or was released.
    Unknown {
        in_use: u64,
    },
}

/// One key's leases as replicated or handed off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseSetState {
    pub key: BucketKey,
    pub max: u64,
    pub leases: Vec<Lease>,
    /// Ids released here since the last round, for the receiver to drop.
    pub released: Vec<LeaseId>,
}

/// Counters since start, published by the node.
#[derive(Debug, Default)]
pub struct LeaseStats {
    pub grants: AtomicU64,
    pub refusals: AtomicU64,
    pub releases: AtomicU64,
    pub expiries: AtomicU64,
    /// Acquires refused because the store was full.
    pub full: AtomicU64,
}

#[derive(Debug, Default)]
struct Shard {
    sets: HashMap<BucketKey, LeaseSet>,
    tombstones: Vec<(BucketKey, LeaseId)>,
}

/// Every key's leases on one node.
#[derive(Debug)]
pub struct LeaseStore {
    shards: Box<[Mutex<Shard>]>,
    held: AtomicUsize,
    config: LeaseStoreConfig,
    ids: Box<dyn LeaseIds>,
    sweep_cursor: AtomicUsize,
    /// When an acquire refused for room last swept the whole store (0: never).
    room_swept_at_ns: AtomicU64,
    stats: LeaseStats,
}

impl LeaseStore {
    /// An empty store granting ids drawn from `ids` (see [`LeaseIds`]).
    pub fn new(config: LeaseStoreConfig, ids: Box<dyn LeaseIds>) -> Self {
        LeaseStore {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            held: AtomicUsize::new(0),
            config,
            ids,
            sweep_cursor: AtomicUsize::new(0),
            room_swept_at_ns: AtomicU64::new(0),
            stats: LeaseStats::default(),
        }
    }

    fn shard(&self, key: BucketKey) -> &Mutex<Shard> {
        &self.shards[key.check as usize % SHARDS]
    }

    /// `drawn` if it is a usable id for `set`, else fresh draws until one is: never 0 (which
    /// means "no lease"), never an id a live lease of the key holds. Either happens once in
    /// about 2^64 / (leases of the key) draws (2^128 for wide ids).
    fn fresh_id(&self, set: &LeaseSet, drawn: LeaseId, width: LeaseIdWidth) -> LeaseId {
        let mut id = width.cut(drawn);
        while id == 0 || set.leases.iter().any(|l| l.id == id) {
            id = width.cut(self.ids.next_id());
        }
        id
    }

    /// Applies `op` to `key`'s set with expired leases reclaimed first, keeps the held count
    /// and the expiry counter right, and forgets a set left empty.
    /// `op` is also told how many leases the reclaim just freed (not yet off the held count).
    fn with_set<T>(
        &self,
        key: BucketKey,
        now_ns: u64,
        op: impl FnOnce(&mut LeaseSet, usize) -> T,
    ) -> T {
        let mut shard = self.shard(key).lock();
        let set = shard.sets.entry(key).or_default();
        let before = set.len();
        let expired = set.reclaim(now_ns);
        let result = op(set, expired);
        let after = set.len();
        if set.is_empty() {
            shard.sets.remove(&key);
        }
        drop(shard);
        self.stats
            .expiries
            .fetch_add(expired as u64, Ordering::Relaxed);
        self.adjust_held(before, after);
        result
    }

    fn adjust_held(&self, before: usize, after: usize) {
        if after > before {
            self.held.fetch_add(after - before, Ordering::Relaxed);
        } else {
            self.held.fetch_sub(before - after, Ordering::Relaxed);
        }
    }

    /// Grants a lease on `key` if fewer than `limit.max()` are held there, its id `width` wide.
    pub fn acquire(
        &self,
        key: BucketKey,
        limit: &LeaseLimit,
        now_ns: u64,
        width: LeaseIdWidth,
    ) -> Result<Acquired, LeaseStoreError> {
        // Drawn before the shard's lock is taken (the draw may be a system call); drawn again
        // under it only in the rare case the id is unusable.
        let drawn = self.ids.next_id();
        let mut result = self.try_acquire(key, limit, now_ns, (drawn, width));
        if result.is_err() && self.reclaim_for_room(now_ns) {
            result = self.try_acquire(key, limit, now_ns, (drawn, width));
        }
        let counter = match result {
            Ok(Acquired::Granted { .. }) => &self.stats.grants,
            Ok(Acquired::Refused { .. }) => &self.stats.refusals,
            Err(_) => &self.stats.full,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        result
    }

    /// Full: reclaims the expired leases of every key (those of keys nobody touches again hold
    /// room until the sweep reaches them), at most once per [`ROOM_SWEEP_EVERY_NS`]. A live
    /// lease is never dropped for room: its holder counts on it, and dropping it would let one
    /// more in than the key's max. True when something was reclaimed.
    fn reclaim_for_room(&self, now_ns: u64) -> bool {
        let last = self.room_swept_at_ns.load(Ordering::Relaxed);
        if last != 0 && now_ns.saturating_sub(last) < ROOM_SWEEP_EVERY_NS {
            return false;
        }
        let claimed = self.room_swept_at_ns.compare_exchange(
            last,
            now_ns.max(1),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        claimed.is_ok() && self.sweep(now_ns, SHARDS) > 0
    }

    /// [`LeaseStore::acquire`] without the sweep for room or the counters.
    fn try_acquire(
        &self,
        key: BucketKey,
        limit: &LeaseLimit,
        now_ns: u64,
        (drawn, width): (LeaseId, LeaseIdWidth),
    ) -> Result<Acquired, LeaseStoreError> {
        self.with_set(key, now_ns, |set, reclaimed| {
            // The places this key's reclaim just freed count as free.
            let held = self.held.load(Ordering::Relaxed).saturating_sub(reclaimed);
            if held >= self.config.max_leases && set.len() < limit.max() as usize {
                return Err(LeaseStoreError::Full {
                    max_leases: self.config.max_leases,
                });
            }
            let id = self.fresh_id(set, drawn, width);
            Ok(set.acquire(limit, id, now_ns))
        })
    }

    /// Releases lease `id` of `key`; releasing one not held is not an error.
    pub fn release(&self, key: BucketKey, id: LeaseId, now_ns: u64) -> Released {
        let (released, in_use) =
            self.with_set(key, now_ns, |set, _| (set.release(id), set.len() as u64));
        if released {
            self.stats.releases.fetch_add(1, Ordering::Relaxed);
            let mut shard = self.shard(key).lock();
            if shard.tombstones.len() >= MAX_TOMBSTONES_PER_SHARD {
                shard.tombstones.remove(0);
            }
            shard.tombstones.push((key, id));
        }
        Released { released, in_use }
    }

    /// Extends lease `id` of `key` to `ttl_ns` from now.
    pub fn renew(&self, key: BucketKey, id: LeaseId, ttl_ns: u64, now_ns: u64) -> Renewed {
        self.with_set(key, now_ns, |set, _| match set.renew(id, ttl_ns, now_ns) {
            Some(lease) => Renewed::Renewed {
                lease,
                in_use: set.len() as u64,
            },
            None => Renewed::Unknown {
                in_use: set.len() as u64,
            },
        })
    }

    /// Leases held on this node now (expired ones not yet reclaimed included).
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// Live leases of `key` at `now_ns`.
    pub fn in_use(&self, key: BucketKey, now_ns: u64) -> u64 {
        let shard = self.shard(key).lock();
        shard.sets.get(&key).map_or(0, |set| {
            set.leases
                .iter()
                .filter(|l| l.expires_at_ns > now_ns)
                .count() as u64
        })
    }

    pub fn stats(&self) -> &LeaseStats {
        &self.stats
    }

    pub fn config(&self) -> LeaseStoreConfig {
        self.config
    }

    /// The sets changed here since the last call and the ids released since then, grouped by
    /// key; clears both (what replication sends to each slot's successor).
    pub fn take_changed(&self, now_ns: u64, out: &mut Vec<LeaseSetState>) {
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            let mut by_key: HashMap<BucketKey, LeaseSetState> = HashMap::new();
            for (key, set) in shard.sets.iter_mut().filter(|(_, s)| s.changed) {
                set.changed = false;
                by_key.insert(*key, state_of(*key, set, now_ns));
            }
            for (key, id) in std::mem::take(&mut shard.tombstones) {
                by_key
                    .entry(key)
                    .or_insert_with(|| LeaseSetState {
                        key,
                        max: 0,
                        leases: Vec::new(),
                        released: Vec::new(),
                    })
                    .released
                    .push(id);
            }
            out.extend(by_key.into_values());
        }
    }

    /// Every live set whose key passes `filter` (what a hand-off carries).
    pub fn export(
        &self,
        now_ns: u64,
        filter: &dyn Fn(BucketKey) -> bool,
        out: &mut Vec<LeaseSetState>,
    ) {
        for shard in self.shards.iter() {
            let shard = shard.lock();
            for (key, set) in shard.sets.iter().filter(|(k, _)| filter(**k)) {
                let state = state_of(*key, set, now_ns);
                if !state.leases.is_empty() {
                    out.push(state);
                }
            }
        }
    }

    /// Merges sets from a peer (replicas, a hand-off): see [`LeaseSet::merge`]. Leases past the
    /// node's bound are dropped; returns how many.
    pub fn merge(&self, states: &[LeaseSetState], now_ns: u64) -> usize {
        let mut dropped = 0;
        for state in states {
            let room = self.config.max_leases.saturating_sub(self.held());
            let leases = if state.leases.len() > room {
                dropped += state.leases.len() - room;
                &state.leases[..room]
            } else {
                &state.leases[..]
            };
            self.with_set(state.key, now_ns, |set, _| {
                set.merge(state.max, leases, &state.released, now_ns)
            });
        }
        dropped
    }

    /// Marks a set as decided here (a takeover decided it from a replica), so the next round
    /// sends it back to its owner.
    pub fn mark_changed(&self, key: BucketKey) {
        if let Some(set) = self.shard(key).lock().sets.get_mut(&key) {
            set.changed = true;
        }
    }

    /// Reclaims expired leases in the next `shards` shards (a bounded slice per call, so one
    /// sweep never holds a node up); returns how many.
    pub fn sweep(&self, now_ns: u64, shards: usize) -> usize {
        let mut reclaimed = 0;
        for _ in 0..shards.min(SHARDS) {
            let i = self.sweep_cursor.fetch_add(1, Ordering::Relaxed) % SHARDS;
            let mut shard = self.shards[i].lock();
            shard.sets.retain(|_, set| {
                reclaimed += set.reclaim(now_ns);
                !set.is_empty()
            });
        }
        self.held.fetch_sub(reclaimed, Ordering::Relaxed);
        self.stats
            .expiries
            .fetch_add(reclaimed as u64, Ordering::Relaxed);
        reclaimed
    }
}

fn state_of(key: BucketKey, set: &LeaseSet, now_ns: u64) -> LeaseSetState {
    LeaseSetState {
        key,
        max: set.max,
        leases: set
            .leases
            .iter()
            .copied()
            .filter(|l| l.expires_at_ns > now_ns)
            .collect(),
        released: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;

    /// Ids from a script, then a counter: deterministic, for tests only (a store in service
    /// draws them from a secure generator).
    #[derive(Debug)]
    struct ScriptedIds {
        script: Mutex<Vec<LeaseId>>,
        next: AtomicU64,
    }

    impl ScriptedIds {
        fn new(script: &[LeaseId]) -> Box<Self> {
            Box::new(ScriptedIds {
                script: Mutex::new(script.iter().rev().copied().collect()),
                next: AtomicU64::new(1 << 40),
            })
        }
    }

    impl LeaseIds for ScriptedIds {
        fn next_id(&self) -> LeaseId {
            self.script
                .lock()
                .pop()
                .unwrap_or_else(|| self.next.fetch_add(1, Ordering::Relaxed).into())
        }
    }

    fn store(max_leases: usize) -> LeaseStore {
        LeaseStore::new(LeaseStoreConfig { max_leases }, ScriptedIds::new(&[]))
    }

    fn granted(answer: Result<Acquired, LeaseStoreError>) -> Lease {
        match answer {
            Ok(Acquired::Granted { lease, .. }) => lease,
            other => panic!("expected a grant, got {other:?}"),
        }
    }

    #[test]
    fn ids_come_from_the_source_never_0_and_never_a_live_one_of_the_key() {
        // 0 is skipped; a draw a live lease of the same key holds is drawn again; another key
        // may hold the same id (a lease is named by key and id together).
        let store = LeaseStore::new(
            LeaseStoreConfig { max_leases: 100 },
            ScriptedIds::new(&[0, 42, 42, 42, 7, 42, 42]),
        );
        let key = BucketKey::for_key(b"k");
        let limit = LeaseLimit::new(10, SEC).unwrap();
        let a = granted(store.acquire(key, &limit, 0, LeaseIdWidth::Bits128));
        assert_eq!(a.id, 42);
        let b = granted(store.acquire(key, &limit, 0, LeaseIdWidth::Bits128));
        assert_eq!(b.id, 7, "42 is live on this key: drawn again, twice");
        let other = granted(store.acquire(
            BucketKey::for_key(b"other"),
            &limit,
            0,
            LeaseIdWidth::Bits128,
        ));
        assert_eq!(other.id, 42);
        // Once 42 is released on `k`, it may be drawn there again.
        assert!(store.release(key, a.id, 0).released);
        let c = granted(store.acquire(key, &limit, 0, LeaseIdWidth::Bits128));
        assert_eq!(c.id, 42);
        assert_eq!(store.in_use(key, 0), 2);
    }

    #[test]
    fn the_node_wide_bound_refuses_new_leases_and_counts_them() {
        let store = store(2);
        let limit = LeaseLimit::new(10, SEC).unwrap();
        granted(store.acquire(BucketKey::for_key(b"a"), &limit, 0, LeaseIdWidth::Bits128));
        granted(store.acquire(BucketKey::for_key(b"b"), &limit, 0, LeaseIdWidth::Bits128));
        assert_eq!(
            store.acquire(BucketKey::for_key(b"c"), &limit, 0, LeaseIdWidth::Bits128),
            Err(LeaseStoreError::Full { max_leases: 2 })
        );
        assert_eq!(store.stats().full.load(Ordering::Relaxed), 1);
        // Once they expire, the sweep gives the room back.
        assert_eq!(store.sweep(SEC, SHARDS), 2);
        assert_eq!(store.held(), 0);
        granted(store.acquire(BucketKey::for_key(b"c"), &limit, SEC, LeaseIdWidth::Bits128));
    }

    /// A caller fills the store with short leases on keys it never touches again; once they
    /// expire, a new key's acquire reclaims them instead of being refused until the sweep
    /// reaches them. Live leases are never taken: a store full of them still refuses.
    #[test]
    fn expired_leases_nobody_touches_make_room_for_a_new_key() {
        let store = store(2);
        let short = LeaseLimit::new(10, SEC).unwrap();
        granted(store.acquire(BucketKey::for_key(b"a"), &short, 0, LeaseIdWidth::Bits128));
        granted(store.acquire(BucketKey::for_key(b"b"), &short, 0, LeaseIdWidth::Bits128));
        granted(store.acquire(
            BucketKey::for_key(b"new"),
            &short,
            SEC,
            LeaseIdWidth::Bits128,
        ));
        assert_eq!(store.held(), 1);
        let long = LeaseLimit::new(10, 3_600 * SEC).unwrap();
        granted(store.acquire(
            BucketKey::for_key(b"live"),
            &long,
            SEC,
            LeaseIdWidth::Bits128,
        ));
        let later = 10 * SEC;
        assert_eq!(
            store.acquire(
                BucketKey::for_key(b"c"),
                &long,
                later,
                LeaseIdWidth::Bits128
            ),
            Ok(Acquired::Granted {
                lease: Lease {
                    id: (1 << 40) + 4,
                    expires_at_ns: later + 3_600 * SEC
                },
                in_use: 1
            })
        );
        assert_eq!(
            store.acquire(
                BucketKey::for_key(b"d"),
                &long,
                later + SEC,
                LeaseIdWidth::Bits128
            ),
            Err(LeaseStoreError::Full { max_leases: 2 })
        );
        assert_eq!(store.in_use(BucketKey::for_key(b"live"), later + SEC), 1);
    }

    /// A caller fills one key with many short leases, then keeps one: the key's set gives back
    /// the room of those that expired, so what it holds stays within what its lease is charged.
    #[test]
    fn a_set_gives_back_the_room_of_expired_leases() {
        let store = store(10_000);
        let key = BucketKey::for_key(b"k");
        let short = LeaseLimit::new(10_000, SEC).unwrap();
        for _ in 0..10_000 {
            granted(store.acquire(key, &short, 0, LeaseIdWidth::Bits128));
        }
        granted(store.acquire(key, &short, 2 * SEC, LeaseIdWidth::Bits128));
        let room = store.shard(key).lock().sets[&key].leases.capacity();
        assert!(
            room * size_of::<Lease>() <= LEASE_BYTES,
            "one lease keeps room for {room}"
        );
    }

    #[test]
    fn a_full_store_still_grants_a_place_its_own_key_just_reclaimed() {
        let store = store(1);
        let key = BucketKey::for_key(b"a");
        granted(store.acquire(
            key,
            &LeaseLimit::new(10, SEC).unwrap(),
            0,
            LeaseIdWidth::Bits128,
        ));
        // Expired but not swept: the store counts it as held until someone looks.
        assert_eq!(store.held(), 1);
        granted(store.acquire(
            key,
            &LeaseLimit::new(10, SEC).unwrap(),
            SEC,
            LeaseIdWidth::Bits128,
        ));
        assert_eq!(store.held(), 1);
    }

    #[test]
    fn changed_sets_and_releases_replicate_once() {
        let owner = store(100);
        let replica = store(100);
        let key = BucketKey::for_key(b"k");
        let limit = LeaseLimit::new(2, 10 * SEC).unwrap();
        let a = granted(owner.acquire(key, &limit, 0, LeaseIdWidth::Bits128));
        granted(owner.acquire(key, &limit, 0, LeaseIdWidth::Bits128));
        let mut changed = Vec::new();
        owner.take_changed(0, &mut changed);
        assert_eq!(changed.len(), 1);
        replica.merge(&changed, 0);
        assert_eq!(replica.in_use(key, 0), 2);
        // Nothing changed since: nothing to send.
        changed.clear();
        owner.take_changed(0, &mut changed);
        assert!(changed.is_empty());
        // A release reaches the replica as a tombstone.
        assert!(owner.release(key, a.id, SEC).released);
        assert!(!owner.release(key, a.id, SEC).released);
        owner.take_changed(SEC, &mut changed);
        replica.merge(&changed, SEC);
        assert_eq!(replica.in_use(key, SEC), 1);
        assert_eq!(replica.held(), 1);
    }

    #[test]
    fn expiry_reclaims_lazily_and_counts() {
        let store = store(100);
        let key = BucketKey::for_key(b"k");
        let limit = LeaseLimit::new(1, 5 * SEC).unwrap();
        granted(store.acquire(key, &limit, 0, LeaseIdWidth::Bits128));
        assert!(matches!(
            store.acquire(key, &limit, 5 * SEC - 1, LeaseIdWidth::Bits128),
            Ok(Acquired::Refused {
                in_use: 1,
                retry_after_ns: 1
            })
        ));
        granted(store.acquire(key, &limit, 5 * SEC, LeaseIdWidth::Bits128));
        assert_eq!(store.stats().expiries.load(Ordering::Relaxed), 1);
        assert_eq!(store.held(), 1);
    }
}
