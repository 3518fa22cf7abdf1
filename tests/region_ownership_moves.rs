//! Region deltas when this region's ownership moved: the sender addressed them by its view of
//! the ring, which lags the move, so the receiver routes each delta by its own table. Units of
//! a key another member decides are passed on to it (numbered and acknowledged like any
//! delta, so applied there once); units for a slot whose hand-off has not arrived wait for the
//! key's next check; both follow the key when its owner changes again.

use floodgate::region::{
    DeltaBatch, Exchange, ExchangeConfig, Outgoing, Peer, RegionName, Route, Transmit,
};
use floodgate::{Algorithm, BucketKey, BucketStore, Limit, NANOS_PER_SEC as S, StoreConfig};

fn peer(region: &str, node: &str) -> Peer {
    Peer::new(RegionName::new(region).unwrap(), node)
}

struct Node {
    exchange: Exchange,
    store: BucketStore,
}

fn node(region: &str, id: &str) -> Node {
    Node {
        exchange: Exchange::new(ExchangeConfig::for_regions(2), peer(region, id), 1),
        store: BucketStore::new(StoreConfig {
            max_keys: 64,
            shards: 4,
        })
        .unwrap(),
    }
}

fn limit() -> Limit {
    Limit::window(Algorithm::FixedWindow, 10, 60 * S).unwrap()
}

fn key() -> BucketKey {
    BucketKey::for_key(b"tenant:7")
}

const NOW: u64 = 600 * S;

impl Node {
    fn transmits(&mut self, now: u64) -> Vec<Transmit> {
        std::iter::from_fn(|| self.exchange.poll_transmit(now))
            .take(100)
            .collect()
    }

    /// What the bucket has left, looked at without spending.
    fn remaining(&self) -> u64 {
        self.store
            .check(key(), &limit(), 0, NOW)
            .unwrap()
            .remaining()
    }

    fn receive(&mut self, now: u64, transmits: &[Transmit], route: Route) {
        let me = self.exchange.me().clone();
        for t in transmits.iter().filter(|t| t.to == me) {
            match &t.message {
                Outgoing::Deltas(batch) => {
                    let route = route.clone();
                    self.exchange
                        .handle_routed_deltas(now, batch, &self.store, &move |_| route.clone());
                }
                Outgoing::Ack(ack) => self.exchange.handle_ack(now, ack),
            }
        }
    }
}

fn batches(transmits: &[Transmit]) -> Vec<DeltaBatch> {
    transmits
        .iter()
        .filter_map(|t| match &t.message {
            Outgoing::Deltas(b) => Some(b.clone()),
            Outgoing::Ack(_) => None,
        })
        .collect()
}

/// Region `a` admitted 4 units and sends them to `b1`, which owned the key in its view; `b2`
/// owns it now.
fn four_units_sent_to_b1() -> (Node, Vec<Transmit>) {
    let mut a = node("a", "a1");
    let decision = a
        .exchange
        .check_global(NOW, &a.store, key(), &limit(), 4, &[peer("b", "b1")])
        .unwrap();
    assert!(decision.is_allowed());
    let sent = a.transmits(NOW);
    assert_eq!(batches(&sent).len(), 1);
    (a, sent)
}

#[test]
fn units_of_a_key_another_member_decides_are_passed_on_and_applied_there_once() {
    let (mut a, sent) = four_units_sent_to_b1();
    let (mut b1, mut b2) = (node("b", "b1"), node("b", "b2"));
    b1.receive(NOW, &sent, Route::PassOn(peer("b", "b2")));
    assert_eq!(
        b1.remaining(),
        10,
        "b1 decides nothing of the key: it keeps none"
    );
    // b1 acknowledges a (it now owes the units to b2) ...
    a.receive(NOW, &b1.transmits(NOW), Route::Here);
    assert!(a.exchange.is_idle());
    // ... and sends them to b2 with the next flush, twice (the first acknowledgement lost).
    let passed = b1.transmits(NOW + S);
    assert_eq!(batches(&passed).len(), 1);
    assert_eq!(batches(&passed)[0].deltas[0].units, 4);
    b2.receive(NOW + S, &passed, Route::Here);
    b2.transmits(NOW + S);
    b2.receive(NOW + S, &passed, Route::Here);
    assert_eq!(b2.remaining(), 6, "applied once");
    assert_eq!(b2.exchange.applied_from(&peer("b", "b1")), 4);
    b1.receive(NOW + S, &b2.transmits(NOW + S), Route::Here);
    assert!(b1.exchange.is_idle(), "b2 confirmed what b1 owed it");
    assert_eq!(b1.exchange.stats().passed_on_units, 4);
}

#[test]
fn units_for_a_slot_awaiting_its_hand_off_wait_for_the_keys_next_check() {
    let (_, sent) = four_units_sent_to_b1();
    let mut b1 = node("b", "b1");
    b1.receive(NOW, &sent, Route::Hold);
    // Not in the bucket yet: the hand-off's state would replace them.
    assert_eq!(b1.remaining(), 10);
    assert_eq!(b1.exchange.backlog_units(key()), 4);
    // The key's next check takes them in first: 10 - 4 - 1.
    let decision = b1
        .exchange
        .check_global(NOW, &b1.store, key(), &limit(), 1, &[peer("a", "a1")])
        .unwrap();
    assert_eq!(decision.remaining(), 5);
    assert_eq!(b1.exchange.backlog_units(key()), 0);
}

#[test]
fn held_and_passed_on_units_follow_the_key_when_its_owner_changes_again() {
    let (_, sent) = four_units_sent_to_b1();
    let (mut b1, b3, mut b4) = (node("b", "b1"), node("b", "b3"), node("b", "b4"));
    b1.receive(NOW, &sent, Route::Hold);
    // The slot moves on to b3 before the key was checked: the held units go with it.
    let to_b3 = Route::PassOn(peer("b", "b3"));
    let passed = b1
        .exchange
        .follow_ownership(NOW, &b1.store, &|_| to_b3.clone(), &|_| true);
    assert_eq!(passed, 4);
    assert_eq!(b1.exchange.backlog_units(key()), 0);
    // b3 stops before it confirmed them (the message lost): they are routed to b4, which owns
    // the slot now.
    let lost = b1.transmits(NOW + S);
    assert_eq!(batches(&lost).len(), 1);
    let to_b4 = Route::PassOn(peer("b", "b4"));
    let b3_gone = |p: &Peer| p.node.as_ref() != "b3";
    let passed = b1
        .exchange
        .follow_ownership(NOW + S, &b1.store, &|_| to_b4.clone(), &b3_gone);
    assert_eq!(passed, 4);
    b4.receive(NOW + 2 * S, &b1.transmits(NOW + 2 * S), Route::Here);
    assert_eq!(b4.remaining(), 6);
    assert_eq!(b3.remaining(), 10);
    b1.receive(NOW + 2 * S, &b4.transmits(NOW + 2 * S), Route::Here);
    assert!(b1.exchange.is_idle());
}

/// A node that passes nothing on (a receiver with `handle_deltas`, as before members took
/// passed-on deltas) still refuses deltas from its own region.
#[test]
fn without_routing_deltas_from_the_own_region_are_still_refused() {
    let (_, sent) = four_units_sent_to_b1();
    let mut batch = batches(&sent).pop().unwrap();
    batch.from = peer("b", "b9");
    let b1 = node("b", "b1");
    let mut exchange = b1.exchange;
    exchange.handle_deltas(NOW, &batch, &b1.store);
    assert_eq!(exchange.stats().refused_messages, 1);
    assert_eq!(
        b1.store.check(key(), &limit(), 0, NOW).unwrap().remaining(),
        10
    );
}

/// The sender's side: `b1` left region `b` before confirming what `a` sent it; `a` sends those
/// units to the key's new owner there instead of dropping them (they were, before), and drops
/// them only when `b` has no owner in sight.
#[test]
fn units_a_departed_destination_never_confirmed_go_to_the_keys_new_owner() {
    let (mut a, lost_with_b1) = four_units_sent_to_b1();
    assert_eq!(batches(&lost_with_b1).len(), 1);
    let mut b2 = node("b", "b2");
    let (queued, lost) = a
        .exchange
        .reroute_destination(NOW, &peer("b", "b1"), &|_| Some(peer("b", "b2")));
    assert_eq!((queued, lost), (4, 0));
    assert_eq!(a.exchange.unconfirmed(&peer("b", "b2"), key()), 4);
    b2.receive(NOW, &a.transmits(NOW), Route::Here);
    assert_eq!(b2.remaining(), 6);
    a.receive(NOW, &b2.transmits(NOW), Route::Here);
    assert!(a.exchange.is_idle());

    let (mut a, _) = four_units_sent_to_b1();
    let (queued, lost) = a
        .exchange
        .reroute_destination(NOW, &peer("b", "b1"), &|_| None);
    assert_eq!((queued, lost), (0, 4));
    assert!(a.exchange.is_idle());
}
