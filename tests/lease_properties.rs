//! Property tests of the lease store against a plain model: for any sequence of acquires,
//! releases, renewals and time steps on a few keys (time from an injected `now`, as the store
//! takes it), the store grants exactly when the model has a free place, never holds more than
//! `max` live leases on a key, and refuses with the time until the earliest expiry.

use floodgate::BucketKey;
use floodgate::lease::{
    Acquired, LeaseId, LeaseIdWidth, LeaseIds, LeaseLimit, LeaseStore, LeaseStoreConfig, Renewed,
};
use proptest::prelude::*;

const KEYS: usize = 3;
const MS: u64 = 1_000_000;

/// Deterministic ids for the model (a store in service draws them from a secure generator):
/// a splitmix64 sequence, so ids are scattered and the store never sees a counter.
#[derive(Debug, Default)]
struct Splitmix(std::sync::atomic::AtomicU64);

impl LeaseIds for Splitmix {
    fn next_id(&self) -> LeaseId {
        let seed = self
            .0
            .fetch_add(0x9e37_79b9_7f4a_7c15, std::sync::atomic::Ordering::Relaxed);
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        LeaseId::from(z ^ (z >> 31)) << 64 | LeaseId::from(z)
    }
}

#[derive(Debug, Clone)]
enum Op {
    Acquire {
        key: usize,
        max: u64,
        ttl_ms: u64,
    },
    /// Releases the `nth` lease granted so far (wrapping), held or not.
    Release {
        nth: usize,
    },
    Renew {
        nth: usize,
        ttl_ms: u64,
    },
    Advance {
        ms: u64,
    },
    Sweep,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..KEYS, 1..4u64, 1..50u64).prop_map(|(key, max, ttl_ms)| Op::Acquire { key, max, ttl_ms }),
        2 => any::<usize>().prop_map(|nth| Op::Release { nth }),
        1 => (any::<usize>(), 1..50u64).prop_map(|(nth, ttl_ms)| Op::Renew { nth, ttl_ms }),
        2 => (0..30u64).prop_map(|ms| Op::Advance { ms }),
        1 => Just(Op::Sweep),
    ]
}

/// The model: per key, each granted lease's id and expiry; a lease is live while `now < expiry`.
#[derive(Default)]
struct Model {
    leases: Vec<Vec<(LeaseId, u64)>>,
}

impl Model {
    fn live(&self, key: usize, now: u64) -> Vec<(LeaseId, u64)> {
        self.leases[key]
            .iter()
            .copied()
            .filter(|&(_, expires)| expires > now)
            .collect()
    }
}

proptest! {
    #[test]
    fn the_store_grants_exactly_what_the_model_has_room_for(ops in prop::collection::vec(op(), 1..200)) {
        let store = LeaseStore::new(LeaseStoreConfig { max_leases: 1_000 }, Box::new(Splitmix::default()));
        let keys: Vec<BucketKey> = (0..KEYS).map(|i| BucketKey::for_key(format!("k{i}").as_bytes())).collect();
        let mut model = Model { leases: vec![Vec::new(); KEYS] };
        let mut granted: Vec<(usize, LeaseId)> = Vec::new();
        let mut now = 1_000 * MS;
        for op in ops {
            match op {
                Op::Acquire { key, max, ttl_ms } => {
                    let limit = LeaseLimit::new(max, ttl_ms * MS).unwrap();
                    let live = model.live(key, now);
                    match store.acquire(keys[key], &limit, now, LeaseIdWidth::Bits128).unwrap() {
                        Acquired::Granted { lease, in_use } => {
                            prop_assert!((live.len() as u64) < max, "granted with {} of {max} live", live.len());
                            prop_assert_eq!(in_use, live.len() as u64 + 1);
                            prop_assert!(in_use <= max);
                            model.leases[key].push((lease.id, lease.expires_at_ns));
                            granted.push((key, lease.id));
                        }
                        Acquired::Refused { in_use, retry_after_ns } => {
                            prop_assert!(live.len() as u64 >= max, "refused with {} of {max} live", live.len());
                            prop_assert_eq!(in_use, live.len() as u64);
                            let earliest = live.iter().map(|&(_, e)| e).min().unwrap();
                            prop_assert_eq!(retry_after_ns, earliest - now);
                        }
                    }
                }
                Op::Release { nth } if !granted.is_empty() => {
                    let (key, id) = granted[nth % granted.len()];
                    let was_live = model.live(key, now).iter().any(|&(i, _)| i == id);
                    let released = store.release(keys[key], id, now);
                    prop_assert_eq!(released.released, was_live);
                    model.leases[key].retain(|&(i, _)| i != id);
                    prop_assert_eq!(released.in_use, model.live(key, now).len() as u64);
                }
                Op::Renew { nth, ttl_ms } if !granted.is_empty() => {
                    let (key, id) = granted[nth % granted.len()];
                    let was_live = model.live(key, now).iter().any(|&(i, _)| i == id);
                    match store.renew(keys[key], id, ttl_ms * MS, now) {
                        Renewed::Renewed { lease, .. } => {
                            prop_assert!(was_live);
                            prop_assert_eq!(lease.expires_at_ns, now + ttl_ms * MS);
                            for entry in model.leases[key].iter_mut().filter(|(i, _)| *i == id) {
                                entry.1 = now + ttl_ms * MS;
                            }
                        }
                        Renewed::Unknown { .. } => prop_assert!(!was_live),
                    }
                }
                Op::Advance { ms } => now += ms * MS,
                Op::Sweep => {
                    store.sweep(now, usize::MAX);
                }
                _ => {}
            }
            for (key, bucket_key) in keys.iter().enumerate() {
                prop_assert_eq!(store.in_use(*bucket_key, now), model.live(key, now).len() as u64);
            }
        }
    }
}
