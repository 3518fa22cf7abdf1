//! Inputs the fuzzer found crashing, each rebuilt as a plain test of the fixed behaviour (the
//! raw inputs also sit in `fuzz/corpus/<target>/regression-*`, replayed by `fuzz_corpus.rs`).

use floodgate::wire::{
    ErrorCode, FrameKind, FrameReader, MAX_WIRE_TAT_NS, ReplicateMessage, WireBucket,
    decode_replicate, encode_message,
};
use floodgate::{
    Algorithm, BucketKey, BucketStore, Decision, Limit, MAX_PERIOD_NS, NANOS_PER_SEC, StoreConfig,
};

const S: u64 = NANOS_PER_SEC;

/// `message` as a peer sends it, decoded as the node does.
fn received(message: &ReplicateMessage) -> Vec<floodgate::BucketState> {
    let mut bytes = Vec::new();
    encode_message(&mut bytes, FrameKind::Replicate, 1, message);
    let mut reader = FrameReader::new(1 << 20);
    reader.extend(&bytes);
    let frame = reader.next_frame().unwrap().unwrap();
    decode_replicate(frame.version, &frame.payload)
        .unwrap()
        .buckets
}

/// A replicated GCRA bucket whose key has zero low bits: the GCRA table marks empty slots with a
/// zero hash, so merging it planted an entry that looked empty, and the next check of that key
/// inserted it a second time (a debug assertion in debug builds, a corrupt table in release).
/// Keys built from the wire now never have a zero hash.
#[test]
fn a_replicated_bucket_with_a_zero_key_hash_merges_and_is_found_again() {
    let now = 1_000 * S;
    let limit = Limit::gcra(10, S, 10).unwrap();
    let zero = ReplicateMessage {
        from: "peer".to_owned(),
        handoff: None,
        buckets: vec![WireBucket {
            key: 5 << 64, // hash 0, check 5
            algorithm: 0,
            tat_ns: now + limit.capacity_ns(),
            margin_ms: 900,
            ..WireBucket::default()
        }],
    };
    let buckets = received(&zero);
    let key = buckets[0].key;
    assert_ne!(key.to_u128() as u64, 0, "no key may have a zero hash");
    assert_eq!(key, BucketKey::from_u128(key.to_u128()));

    let store = BucketStore::new(StoreConfig {
        max_keys: 16,
        shards: 2,
    })
    .unwrap();
    assert_eq!(store.merge(&buckets, now), 0);
    assert_eq!(store.len(), 1);
    // The merged bucket is full, so the key is denied (it used to be treated as unknown).
    assert!(matches!(
        store.check(key, &limit, 1, now).unwrap(),
        Decision::Denied { .. }
    ));
    assert_eq!(store.len(), 1);
}

/// The widest GCRA limit there is: the longest period, one unit per period, and the largest
/// burst whose capacity still fits in `u64::MAX / 4`.
fn widest_gcra_limit() -> Limit {
    let burst = (u64::MAX / 4) / MAX_PERIOD_NS;
    Limit::gcra(1, MAX_PERIOD_NS, burst).unwrap()
}

fn gcra_bucket(tat_ns: u64) -> ReplicateMessage {
    ReplicateMessage {
        from: "peer".to_owned(),
        handoff: None,
        buckets: vec![WireBucket {
            key: 0x1234_5678_9abc_def0,
            algorithm: 0,
            tat_ns,
            margin_ms: u32::MAX,
            ..WireBucket::default()
        }],
    }
}

/// A replicated GCRA bucket whose arrival time was near `u64::MAX`: merged as received, the next
/// check's `debt + cost * interval` overflowed (a panic in debug builds, a wrapped debt that
/// admitted in release). The decoder now refuses arrival times past `MAX_WIRE_TAT_NS`, and the
/// latest it accepts is checked under the widest limit without overflow.
#[test]
fn a_replicated_arrival_time_near_the_end_of_time_is_refused() {
    let mut bytes = Vec::new();
    encode_message(
        &mut bytes,
        FrameKind::Replicate,
        1,
        &gcra_bucket(u64::MAX - 5),
    );
    let mut reader = FrameReader::new(1 << 20);
    reader.extend(&bytes);
    let (code, message) = {
        let frame = reader.next_frame().unwrap().unwrap();
        decode_replicate(frame.version, &frame.payload)
    }
    .expect_err("a TAT past the bound is refused");
    assert_eq!(code, ErrorCode::MalformedPayload);
    assert!(message.contains("arrival time"), "{message}");

    let buckets = received(&gcra_bucket(MAX_WIRE_TAT_NS));
    let store = BucketStore::new(StoreConfig {
        max_keys: 16,
        shards: 2,
    })
    .unwrap();
    let now = 1_000 * S;
    assert_eq!(store.merge(&buckets, now), 0);
    let limit = widest_gcra_limit();
    for cost in [0, 1, limit.burst()] {
        let decision = store.check(buckets[0].key, &limit, cost, now).unwrap();
        assert!(!decision.is_allowed() || cost == 0, "{decision:?}");
    }
}

/// One key checked under a short window period, then under a much longer one (a rules change,
/// or a client sending another limit for the same key): the state's window index, counted in
/// the short period, was multiplied by the long one and overflowed (found by
/// `check_batch_decide`). Window states are now rebased to the period they are checked under.
#[test]
fn a_window_key_checked_under_a_longer_period_decides_within_that_period() {
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let store = BucketStore::new(StoreConfig {
            max_keys: 16,
            shards: 2,
        })
        .unwrap();
        let key = BucketKey::for_key(b"k");
        let now = 1_000 * S;
        let short = Limit::window(algorithm, 1, 1_000_000).unwrap();
        let long = Limit::window(algorithm, 1, MAX_PERIOD_NS).unwrap();
        assert!(store.check(key, &short, 1, now).unwrap().is_allowed());
        let decision = store.check(key, &long, 1, now + 1).unwrap();
        assert!(
            decision
                .retry_after_ns()
                .is_some_and(|w| w <= 2 * MAX_PERIOD_NS),
            "{algorithm}: {decision:?}"
        );
    }
}

/// Region deltas claiming `u64::MAX` units, twice for one GCRA key: the units the bucket could
/// not owe were counted as forgiven with a plain addition, which overflowed (a panic in debug
/// builds). Counters of a peer's units now saturate; the bucket owes at most `(R - 1)` bursts.
#[test]
fn region_deltas_of_every_unit_there_is_are_forgiven_without_overflow() {
    use floodgate::region::{Delta, DeltaBatch, Exchange, ExchangeConfig, Peer, RegionName};
    let now = 1_000 * S;
    let limit = Limit::gcra(10, S, 10).unwrap();
    let key = BucketKey::for_key(b"k");
    let store = BucketStore::new(StoreConfig {
        max_keys: 16,
        shards: 1,
    })
    .unwrap();
    let region = |name: &str| RegionName::new(name).unwrap();
    let mut exchange = Exchange::new(
        ExchangeConfig::for_regions(3),
        Peer::new(region("here"), "n"),
        1,
    );
    let delta = Delta {
        key,
        limit,
        units: u64::MAX,
        at_ns: now,
    };
    let batch = DeltaBatch {
        from: Peer::new(region("there"), "m"),
        session: 1,
        seq: 1,
        settled_below: None,
        deltas: vec![delta, delta],
    };
    exchange.handle_deltas(now, &batch, &store);
    assert_eq!(exchange.stats().units_forgiven, u64::MAX);
    assert_eq!(exchange.backlog_units(key), 2 * 10);
    assert_eq!(exchange.applied_from(&batch.from), u64::MAX);
    assert!(!store.check(key, &limit, 1, now).unwrap().is_allowed());
}
