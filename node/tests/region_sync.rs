//! The node-side driver of the inter-region exchange (`node/src/region_sync.rs`, not wired into
//! the node yet), tested alone: two drivers joined by in-memory links that can drop frames,
//! each test waiting on the drivers' change counters with a bounded timeout.

#[allow(dead_code)] // the driver's whole surface, of which each test uses a part
#[path = "../src/region_sync.rs"]
mod region_sync;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use floodgate::region::{Exchange, ExchangeConfig, Outgoing, Peer, RegionName};
use floodgate::wire::{ErrorCode, FrameKind, FrameReader, RegionDeltasMessage, encode_message};
use floodgate::{BucketKey, BucketStore, Clock, Limit, NANOS_PER_SEC, StoreConfig};
use region_sync::{RegionLinks, RegionSync};
use tokio::sync::{mpsc, watch};

/// Wall time since the test started, as the core's `now`.
#[derive(Debug, Clone, Copy)]
struct TestClock(Instant);

impl Clock for TestClock {
    fn now_ns(&self) -> u64 {
        u64::try_from(self.0.elapsed().as_nanos()).unwrap_or(u64::MAX / 2) + NANOS_PER_SEC
    }
}

/// Frames to each peer's inbox channel, encoded for `version`, dropping the first `drop_first`
/// of them.
struct ChannelLinks {
    from: String,
    inboxes: HashMap<Peer, mpsc::UnboundedSender<(String, Vec<u8>)>>,
    drop_first: AtomicUsize,
    version: u8,
    /// The version byte of every frame sent, in order.
    layouts: std::sync::Mutex<Vec<u8>>,
}

impl RegionLinks for ChannelLinks {
    fn send(&self, to: &Peer, message: Outgoing) {
        let frame = region_sync::encode_region_frame(self.version, &message);
        self.layouts.lock().unwrap().push(frame[2]);
        let dropped = self
            .drop_first
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok();
        if !dropped && let Some(inbox) = self.inboxes.get(to) {
            let _ = inbox.send((self.from.clone(), frame));
        }
    }
}

type Sync = RegionSync<TestClock>;

fn peer(region: &str) -> Peer {
    Peer::new(RegionName::new(region).unwrap(), &format!("node-{region}"))
}

fn driver(region: &str, clock: TestClock) -> Arc<Sync> {
    let config = ExchangeConfig {
        sync_interval_ns: 5_000_000,
        retransmit_ns: 20_000_000,
        max_retransmit_ns: 40_000_000,
        ..ExchangeConfig::for_regions(2)
    };
    let store = BucketStore::new(StoreConfig {
        max_keys: 64,
        shards: 4,
    })
    .unwrap();
    Arc::new(RegionSync::new(
        Exchange::new(config, peer(region), 1),
        Arc::new(store),
        clock,
    ))
}

/// Feeds every frame arriving for `sync` into it, as the node's stream reader would.
async fn deliver(sync: Arc<Sync>, mut inbox: mpsc::UnboundedReceiver<(String, Vec<u8>)>) {
    while let Some((sender, bytes)) = inbox.recv().await {
        let mut reader = FrameReader::new(1 << 20);
        reader.extend(&bytes);
        // Each test node is known in the region its id names (node-a in a).
        let region = sender.trim_start_matches("node-");
        while let Ok(Some(frame)) = reader.next_frame() {
            let _ = sync.receive(frame.kind, frame.version, &frame.payload, &sender, region);
        }
    }
}

/// Two drivers (regions a and b) running over channel links; `a` drops its first frames.
fn pair(drop_first: usize) -> (Arc<Sync>, Arc<Sync>, watch::Sender<bool>) {
    let (a, b, stop, _) = pair_at(drop_first, floodgate::protocol::NEWEST);
    (a, b, stop)
}

/// As [`pair`], the links speaking protocol `version`; also `a`'s links.
fn pair_at(
    drop_first: usize,
    version: u8,
) -> (Arc<Sync>, Arc<Sync>, watch::Sender<bool>, Arc<ChannelLinks>) {
    let clock = TestClock(Instant::now());
    let (a, b) = (driver("a", clock), driver("b", clock));
    let (to_a, inbox_a) = mpsc::unbounded_channel();
    let (to_b, inbox_b) = mpsc::unbounded_channel();
    let (stop, shutdown) = watch::channel(false);
    let links_a = Arc::new(ChannelLinks {
        from: "node-a".to_owned(),
        inboxes: HashMap::from([(peer("b"), to_b)]),
        drop_first: AtomicUsize::new(drop_first),
        version,
        layouts: Default::default(),
    });
    let links_b = Arc::new(ChannelLinks {
        from: "node-b".to_owned(),
        inboxes: HashMap::from([(peer("a"), to_a)]),
        drop_first: AtomicUsize::new(0),
        version,
        layouts: Default::default(),
    });
    for (sync, links) in [(&a, links_a.clone() as Arc<dyn RegionLinks>), (&b, links_b)] {
        let sync = Arc::clone(sync);
        let shutdown = shutdown.clone();
        tokio::spawn(async move { sync.run(links, shutdown).await });
    }
    tokio::spawn(deliver(Arc::clone(&a), inbox_a));
    tokio::spawn(deliver(Arc::clone(&b), inbox_b));
    (a, b, stop, links_a)
}

/// Waits (at most 10 s) until `done` holds, re-checking on every change either driver makes.
async fn wait_until(a: &Sync, b: &Sync, done: impl Fn() -> bool) {
    let (mut ca, mut cb) = (a.subscribe(), b.subscribe());
    let waited = tokio::time::timeout(Duration::from_secs(10), async {
        while !done() {
            tokio::select! {
                _ = ca.changed() => {}
                _ = cb.changed() => {}
            }
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "timed out: {:?} / {:?}",
        a.stats(),
        b.stats()
    );
}

#[tokio::test]
async fn admitted_units_reach_the_other_region_once_even_after_losses() {
    let (a, b, stop) = pair(2);
    let limit = Limit::gcra(10, NANOS_PER_SEC, 10).unwrap();
    let key = BucketKey::for_key(b"tenant:acme");
    let admitted = (0..5)
        .filter(|_| {
            a.check_global(key, &limit, 1, &[peer("b")])
                .unwrap()
                .is_allowed()
        })
        .count() as u64;
    assert_eq!(
        admitted, 5,
        "a's share of a burst of 10 between two regions"
    );
    wait_until(&a, &b, || a.is_idle() && b.applied_from(&peer("a")) == 5).await;
    assert!(a.stats().retransmissions >= 1, "{:?}", a.stats());
    assert_eq!(b.applied_from(&peer("a")), 5);
    // b's bucket holds a's units: b's share (5) is all it may still take, and the bucket
    // allows at most 5 more now (minus what has refilled, which is at most a few units).
    let more = (0..10)
        .filter(|_| {
            b.check_global(key, &limit, 1, &[peer("a")])
                .unwrap()
                .is_allowed()
        })
        .count();
    assert!((1..=5).contains(&more), "{more}");
    stop.send_replace(true);
}

/// The deltas a link carries (kind 13) are in the layout of the version it speaks: version 2's
/// to a peer speaking 3 or less, version 4's (the settled point) to one speaking 4 to 12, the
/// columns of 13 from 13. Every pair converges.
#[tokio::test]
async fn each_link_gets_the_layout_of_its_version() {
    for (version, layout) in [(3, 2), (12, 4), (floodgate::protocol::NEWEST, 13)] {
        let (a, b, stop, links) = pair_at(0, version);
        let limit = Limit::gcra(10, NANOS_PER_SEC, 10).unwrap();
        let key = BucketKey::for_key(b"tenant:acme");
        assert!(
            a.check_global(key, &limit, 2, &[peer("b")])
                .unwrap()
                .is_allowed()
        );
        wait_until(&a, &b, || a.is_idle() && b.applied_from(&peer("a")) == 2).await;
        let layouts = links.layouts.lock().unwrap().clone();
        assert!(!layouts.is_empty());
        assert!(
            layouts.iter().all(|&l| l == layout),
            "{version}: {layouts:?}"
        );
        stop.send_replace(true);
    }
}

/// A graceful stop's drain sends pending deltas at once and returns when they are confirmed.
#[tokio::test]
async fn a_drain_returns_once_everything_is_confirmed() {
    let (a, b, stop) = pair(1);
    let limit = Limit::gcra(10, NANOS_PER_SEC, 10).unwrap();
    let key = BucketKey::for_key(b"tenant:acme");
    assert!(
        a.check_global(key, &limit, 3, &[peer("b")])
            .unwrap()
            .is_allowed()
    );
    assert_eq!(a.unconfirmed_units(), 3);
    assert_eq!(a.drain(Duration::from_secs(10)).await, 0);
    assert!(a.is_idle());
    assert_eq!(b.applied_from(&peer("a")), 3);
    stop.send_replace(true);
}

/// A frame of 3 units of key `k` under `limit`, sent as `from`'s first message.
fn deltas_frame(from: Peer, limit: Limit) -> floodgate::wire::Frame {
    let batch = floodgate::region::DeltaBatch {
        from,
        session: 1,
        seq: 1,
        settled_below: None,
        deltas: vec![floodgate::region::Delta {
            key: BucketKey::for_key(b"k"),
            limit,
            units: 3,
            at_ns: 1,
        }],
    };
    let mut frame = Vec::new();
    encode_message(
        &mut frame,
        FrameKind::RegionDeltas,
        0,
        &RegionDeltasMessage::from(&batch),
    );
    let mut reader = FrameReader::new(1 << 20);
    reader.extend(&frame);
    reader.next_frame().unwrap().unwrap()
}

#[tokio::test]
async fn a_peer_speaks_only_as_itself() {
    let (a, b, stop) = pair(0);
    let limit = Limit::gcra(10, NANOS_PER_SEC, 10).unwrap();
    let frame = deltas_frame(peer("a"), limit);
    assert_eq!(
        b.receive(
            frame.kind,
            frame.version,
            &frame.payload,
            "node-mallory",
            "a"
        ),
        Err(ErrorCode::Forbidden)
    );
    assert_eq!(
        b.receive(FrameKind::RegionDeltas, 2, b"garbage!", "node-a", "a"),
        Err(ErrorCode::MalformedPayload)
    );
    assert_eq!(b.applied_from(&peer("a")), 0);
    assert_eq!(
        b.receive(frame.kind, frame.version, &frame.payload, "node-a", "a"),
        Ok(())
    );
    assert_eq!(b.applied_from(&peer("a")), 3);
    let _ = a;
    stop.send_replace(true);
}

#[tokio::test]
async fn a_peer_speaks_only_for_the_region_it_is_known_in() {
    let (a, b, stop) = pair(0);
    let limit = Limit::gcra(10, NANOS_PER_SEC, 10).unwrap();
    // node-a, certified as itself and known in region a, names region c.
    let claimed = Peer::new(RegionName::new("c").unwrap(), "node-a");
    let frame = deltas_frame(claimed.clone(), limit);
    assert_eq!(
        b.receive(frame.kind, frame.version, &frame.payload, "node-a", "a"),
        Err(ErrorCode::Forbidden)
    );
    assert_eq!(b.applied_from(&claimed), 0);
    // An acknowledgement in another region's name likewise.
    let ack = floodgate::region::DeltaAck {
        from: claimed,
        session: 1,
        below: 2,
        also: Vec::new(),
        receiver_session: None,
    };
    let mut frame = Vec::new();
    encode_message(
        &mut frame,
        FrameKind::RegionAck,
        0,
        &floodgate::wire::RegionAckMessage::from(&ack),
    );
    let mut reader = FrameReader::new(1 << 20);
    reader.extend(&frame);
    let frame = reader.next_frame().unwrap().unwrap();
    assert_eq!(
        b.receive(frame.kind, frame.version, &frame.payload, "node-a", "a"),
        Err(ErrorCode::Forbidden)
    );
    // The same deltas in the region node-a is known in are taken.
    let frame = deltas_frame(peer("a"), limit);
    assert_eq!(
        b.receive(frame.kind, frame.version, &frame.payload, "node-a", "a"),
        Ok(())
    );
    assert_eq!(b.applied_from(&peer("a")), 3);
    let _ = a;
    stop.send_replace(true);
}
