//! Inputs the fuzzer found crashing, each rebuilt as a plain test of the fixed behaviour (the
//! raw inputs also sit in `fuzz/corpus/<target>/regression-*`, replayed by `fuzz_corpus.rs`).

use floodgate::wire::{
    FrameKind, FrameReader, ReplicateMessage, WireBucket, decode_replicate, encode_message,
};
use floodgate::{BucketKey, BucketStore, Decision, Limit, NANOS_PER_SEC, StoreConfig};

const S: u64 = NANOS_PER_SEC;

/// `message` as a peer sends it, decoded as the node does.
fn received(message: &ReplicateMessage) -> Vec<floodgate::BucketState> {
    let mut bytes = Vec::new();
    encode_message(&mut bytes, FrameKind::Replicate, 1, message);
    let mut reader = FrameReader::new(1 << 20);
    reader.extend(&bytes);
    let frame = reader.next_frame().unwrap().unwrap();
    decode_replicate(&frame.payload).unwrap().buckets
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
