//! The delta exchange driven by hand, message by message: the admission rule, exactly-once
//! application, acknowledgements, the GCRA backlog, unreachable destinations and the bounds.

use floodgate::region::{
    DeltaBatch, Exchange, ExchangeConfig, Outgoing, Peer, RegionName, Transmit,
};
use floodgate::{BucketKey, BucketStore, Limit, NANOS_PER_SEC as S, StoreConfig};

const MS: u64 = 1_000_000;

fn peer(region: &str) -> Peer {
    Peer::new(RegionName::new(region).unwrap(), &format!("node-{region}"))
}

fn store() -> BucketStore {
    BucketStore::new(StoreConfig {
        max_keys: 256,
        shards: 4,
    })
    .unwrap()
}

struct Side {
    exchange: Exchange,
    store: BucketStore,
    others: Vec<Peer>,
}

fn side(me: &str, others: &[&str], config: ExchangeConfig) -> Side {
    Side {
        exchange: Exchange::new(config, peer(me), 1),
        store: store(),
        others: others.iter().map(|o| peer(o)).collect(),
    }
}

impl Side {
    /// Cost-1 checks until one is denied (at most `max`); how many passed.
    fn admit(&mut self, now: u64, key: BucketKey, limit: &Limit, max: u64) -> u64 {
        let mut passed = 0;
        while passed < max
            && self
                .exchange
                .check_global(now, &self.store, key, limit, 1, &self.others)
                .unwrap()
                .is_allowed()
        {
            passed += 1;
        }
        passed
    }

    fn transmits(&mut self, now: u64) -> Vec<Transmit> {
        std::iter::from_fn(|| self.exchange.poll_transmit(now))
            .take(100)
            .collect()
    }
}

fn deltas(transmits: &[Transmit]) -> Vec<DeltaBatch> {
    transmits
        .iter()
        .filter_map(|t| match &t.message {
            Outgoing::Deltas(b) => Some(b.clone()),
            Outgoing::Ack(_) => None,
        })
        .collect()
}

#[test]
fn a_burst_in_every_region_gets_each_only_its_share_until_confirmed() {
    let config = ExchangeConfig::for_regions(3);
    let limit = Limit::gcra(10, S, 30).unwrap();
    let key = BucketKey::for_key(b"k");
    let mut sides = [
        side("a", &["b", "c"], config),
        side("b", &["a", "c"], config),
        side("c", &["a", "b"], config),
    ];
    let now = 100 * S;
    let admitted: Vec<u64> = sides
        .iter_mut()
        .map(|s| s.admit(now, key, &limit, 100))
        .collect();
    // 30 together: the burst, not three bursts.
    assert_eq!(admitted, [10, 10, 10]);
    assert_eq!(sides[0].exchange.stats().denied_by_share, 1);
    // Deliver everything both ways: each bucket now holds all 30, so nobody admits more.
    for round in 0..2 {
        let out: Vec<(usize, Vec<Transmit>)> =
            (0..3).map(|i| (i, sides[i].transmits(now))).collect();
        for (_, transmits) in out {
            for t in transmits {
                let to = sides.iter().position(|s| *s.exchange.me() == t.to).unwrap();
                let s = &mut sides[to];
                match &t.message {
                    Outgoing::Deltas(b) => s.exchange.handle_deltas(now, b, &s.store),
                    Outgoing::Ack(a) => s.exchange.handle_ack(now, a),
                }
            }
        }
        assert!(round == 0 || sides.iter().all(|s| s.exchange.is_idle()));
    }
    let more: Vec<u64> = sides
        .iter_mut()
        .map(|s| s.admit(now, key, &limit, 100))
        .collect();
    assert_eq!(more, [0, 0, 0]);
    // A second later the shared bucket has refilled 10 units, and each region, having
    // nothing unconfirmed, may spend its share of them: at most the bound, (R - 1) * share, over.
    let later: u64 = sides
        .iter_mut()
        .map(|s| s.admit(now + S, key, &limit, 100))
        .sum();
    assert!((10..=10 + 2 * 10).contains(&later), "{later}");
}

#[test]
fn a_message_applies_once_however_often_it_arrives() {
    let config = ExchangeConfig::for_regions(2);
    let limit = Limit::window(floodgate::Algorithm::FixedWindow, 10, S).unwrap();
    let key = BucketKey::for_key(b"k");
    let mut a = side("a", &["b"], config);
    let mut b = side("b", &["a"], config);
    let now = 50 * S;
    assert_eq!(a.admit(now, key, &limit, 4), 4);
    let batch = deltas(&a.transmits(now)).pop().unwrap();
    for _ in 0..3 {
        b.exchange.handle_deltas(now, &batch, &b.store);
    }
    assert_eq!(b.exchange.applied_from(&peer("a")), 4);
    assert_eq!(b.exchange.stats().duplicate_messages, 2);
    // Three arrivals, three acknowledgements owed, coalesced into one.
    let acks = b.transmits(now);
    assert_eq!(acks.len(), 1);
    // b's bucket holds a's 4 units: 6 remain, of which b may spend its share (5) unconfirmed.
    assert_eq!(b.admit(now, key, &limit, 100), 5);
    assert_eq!(b.exchange.stats().denied_by_share, 1);
    // The same sequence number under an older session (a before a restart) is ignored.
    let mut stale = batch.clone();
    stale.session = 0;
    b.exchange.handle_deltas(now, &stale, &b.store);
    assert_eq!(b.exchange.stats().stale_messages, 1);
    // Deltas claiming to come from b's own region are refused.
    let mut own = batch;
    own.from = peer("b");
    b.exchange.handle_deltas(now, &own, &b.store);
    assert_eq!(b.exchange.stats().refused_messages, 1);
    assert_eq!(b.exchange.applied_from(&peer("a")), 4);
}

#[test]
fn unacknowledged_deltas_are_sent_again_until_confirmed() {
    let config = ExchangeConfig::for_regions(2);
    let limit = Limit::gcra(10, S, 10).unwrap();
    let key = BucketKey::for_key(b"k");
    let mut a = side("a", &["b"], config);
    let mut b = side("b", &["a"], config);
    let now = 10 * S;
    a.admit(now, key, &limit, 3);
    let first = deltas(&a.transmits(now));
    assert_eq!(first.len(), 1);
    // Lost. Nothing more until the retransmission wait ends.
    assert_eq!(a.exchange.poll_timeout(), Some(now + config.retransmit_ns));
    assert!(a.transmits(now + config.retransmit_ns - 1).is_empty());
    let again = deltas(&a.transmits(now + config.retransmit_ns));
    assert_eq!(again, first);
    b.exchange.handle_deltas(now, &again[0], &b.store);
    for t in b.transmits(now) {
        if let Outgoing::Ack(ack) = &t.message {
            a.exchange.handle_ack(now, ack);
        }
    }
    assert!(a.exchange.is_idle());
    assert_eq!(a.exchange.poll_timeout(), None);
    assert_eq!(a.exchange.stats().retransmissions, 1);
}

#[test]
fn gcra_units_beyond_a_full_bucket_wait_in_the_backlog() {
    let config = ExchangeConfig::for_regions(3);
    let limit = Limit::gcra(10, S, 30).unwrap();
    let key = BucketKey::for_key(b"k");
    let mut a = side("a", &["b", "c"], config);
    let mut b = side("b", &["a", "c"], config);
    let now = 10 * S;
    // b's bucket is full of its own consumption when 6 units from a arrive.
    assert!(b.store.check(key, &limit, 30, now).unwrap().is_allowed());
    assert_eq!(a.admit(now, key, &limit, 6), 6);
    for batch in &deltas(&a.transmits(now)) {
        b.exchange.handle_deltas(now, batch, &b.store);
    }
    assert_eq!(b.exchange.backlog_units(key), 6);
    // After 0.5 s the bucket drained 5 units, but the backlog takes them: still denied.
    assert_eq!(b.admit(now + S / 2, key, &limit, 100), 0);
    assert_eq!(b.exchange.backlog_units(key), 1);
    // After 0.7 s in all: 7 drained, 6 owed: one unit passes.
    assert_eq!(b.admit(now + 7 * S / 10, key, &limit, 100), 1);
    assert_eq!(b.exchange.backlog_units(key), 0);
}

#[test]
fn a_silent_destination_stops_holding_back_admissions() {
    let config = ExchangeConfig::for_regions(2);
    let limit = Limit::gcra(100, S, 10).unwrap();
    let key = BucketKey::for_key(b"k");
    let mut a = side("a", &["b"], config);
    let now = 10 * S;
    assert_eq!(a.admit(now, key, &limit, 100), 5);
    a.transmits(now);
    // b says nothing: within unreachable_after a still keeps to its share...
    let later = now + config.unreachable_after_ns - MS;
    assert_eq!(a.admit(later, key, &limit, 100), 0);
    assert!(a.exchange.is_reachable(&peer("b"), later));
    // ... after it, b is unreachable and a enforces the bucket alone (a partition).
    let cut = now + config.unreachable_after_ns;
    assert!(!a.exchange.is_reachable(&peer("b"), cut));
    assert_eq!(a.admit(cut, key, &limit, 100), 10);
    assert_eq!(a.exchange.unconfirmed(&peer("b"), key), 15);
}

#[test]
fn a_full_outbox_refuses_new_keys_rather_than_drop_their_units() {
    let config = ExchangeConfig {
        max_pending_keys: 2,
        ..ExchangeConfig::for_regions(2)
    };
    let limit = Limit::gcra(10, S, 10).unwrap();
    let mut a = side("a", &["b"], config);
    let now = 10 * S;
    for name in [b"k1", b"k2"] {
        assert_eq!(a.admit(now, BucketKey::for_key(name), &limit, 1), 1);
    }
    let third = BucketKey::for_key(b"k3");
    assert_eq!(a.admit(now, third, &limit, 1), 0);
    assert_eq!(a.exchange.stats().refused_outbox_full, 1);
    // Once the pending keys are sent, there is room again.
    a.transmits(now);
    assert_eq!(a.admit(now, third, &limit, 1), 1);
}

/// The two halves of `check_global`, for an all-or-nothing group decided by the store: units
/// are recorded only when the whole group passed.
#[test]
fn a_group_records_its_global_units_only_when_it_passes() {
    let config = ExchangeConfig::for_regions(2);
    let global = Limit::gcra(10, S, 10).unwrap();
    let local = Limit::gcra(1, S, 1).unwrap();
    let (g, l) = (BucketKey::for_key(b"global"), BucketKey::for_key(b"local"));
    let mut a = side("a", &["b"], config);
    let now = 10 * S;
    let decide_group = |a: &mut Side| {
        assert_eq!(
            a.exchange
                .hold_back(now, &a.store, g, &global, 1, &a.others)
                .unwrap(),
            None
        );
        let checks = [
            floodgate::BucketCheck {
                key: g,
                limit: global,
                cost: 1,
                peek: false,
            },
            floodgate::BucketCheck {
                key: l,
                limit: local,
                cost: 1,
                peek: false,
            },
        ];
        let mut decisions = Vec::new();
        let passed = a.store.check_all(&checks, now, &mut decisions).unwrap();
        if passed {
            a.exchange.record_admitted(now, g, &global, 1, &a.others);
        }
        passed
    };
    assert!(decide_group(&mut a));
    assert!(
        !decide_group(&mut a),
        "the local key is spent: the group is denied"
    );
    assert_eq!(a.exchange.unconfirmed(&peer("b"), g), 1);
}

#[test]
fn a_destination_forgotten_and_found_again_gets_its_new_units_applied() {
    // A partition declares one owner of the other region dead before the other: the ring
    // goes on without it, its outbox is forgotten; after healing it owns the key again.
    let config = ExchangeConfig::for_regions(2);
    let limit = Limit::gcra(10, S, 10).unwrap();
    let key = BucketKey::for_key(b"k");
    let mut a = side("a", &["b"], config);
    let mut b = side("b", &["a"], config);
    let now = 10 * S;
    a.admit(now, key, &limit, 3);
    for batch in deltas(&a.transmits(now)) {
        b.exchange.handle_deltas(now, &batch, &b.store);
    }
    assert_eq!(b.exchange.applied_from(&peer("a")), 3);
    a.exchange.forget_destination(&peer("b"));
    let later = now + 5 * S;
    a.admit(later, key, &limit, 2);
    let again = deltas(&a.transmits(later));
    assert_eq!(again.len(), 1);
    b.exchange.handle_deltas(later, &again[0], &b.store);
    // Applied, not taken for a replay of the first message.
    assert_eq!(b.exchange.applied_from(&peer("a")), 5);
}
