//! Three regions of one node each, one membership: every node owns all of its region's slots,
//! and gateways (raw connections here) send kind 12 batches to their own region's node. A
//! `global` key split over the three is admitted within the documented bound and exactly once
//! every delta is confirmed; a `region` key is exact per region. Waits are on the nodes' table
//! and exchange change counters, bounded by timeouts.

mod common;

use std::time::Duration;

use common::*;
use floodgate::cluster::MembershipConfig;
use floodgate::region::Scope;
use floodgate::wire::{CheckBatch, FrameKind, ScopedCheckBatch, WireCheck, encode_message};
use floodgate::{Limit, NANOS_PER_SEC};
use floodgate_node::{Node, NodeConfig};

const MS: u64 = 1_000_000;
const WAIT: Duration = Duration::from_secs(10);

fn fast(config: &mut NodeConfig, region: &str) {
    // Fast gossip, but a failure detector as patient as the default's double: the bounds
    // judged here hold while every region hears every other, and a loaded machine stalls a
    // node for hundreds of milliseconds (a region held dead enforces the global limit alone).
    config.cluster.membership = MembershipConfig {
        gossip_interval_ns: 20 * MS,
        suspect_after_ns: 1_000 * MS,
        dead_after_ns: 2_000 * MS,
        ..MembershipConfig::default()
    };
    config.cluster.region = region.to_owned();
    config.cluster.region_sync_interval = Duration::from_millis(20);
}

/// A node per region, `b` and `c` joining through `a`; returns once each counts the others as
/// their regions' owners (before, a global key's units admitted here would never reach them).
async fn three_regions() -> (TestNode, Vec<Node>) {
    let first = start_node(|c| fast(c, "a")).await;
    let seed = first.node.local_addr();
    let mut others = Vec::new();
    for region in ["b", "c"] {
        let mut config = NodeConfig::for_tests(&first.certs);
        fast(&mut config, region);
        config.cluster.seeds = vec![seed.into()];
        others.push(Node::start(config).await.unwrap());
    }
    let ids: Vec<String> = std::iter::once(&first.node)
        .chain(&others)
        .map(|n| n.node_id().to_owned())
        .collect();
    for node in std::iter::once(&first.node).chain(&others) {
        let elsewhere: Vec<&str> = ids
            .iter()
            .map(String::as_str)
            .filter(|id| *id != node.node_id())
            .collect();
        let reaches_all = tokio::time::timeout(WAIT, node.reaches(&elsewhere)).await;
        assert!(
            reaches_all.is_ok(),
            "{} does not count every region's node as an owner: {:?}",
            node.node_id(),
            node.other_region_owners()
        );
        // Its own region's ring: itself alone, though it knows three members.
        assert_eq!(node.owners(), vec![node.node_id().to_owned()]);
    }
    (first, others)
}

/// `count` checks of `key`, one frame each, all of `scope`.
fn scoped_frames(key: &[u8], limit: &Limit, count: usize, scope: &Scope) -> Vec<u8> {
    let mut bytes = Vec::new();
    for i in 0..count {
        let batch = CheckBatch {
            groups: vec![vec![WireCheck::new(key.to_vec(), limit, 1)]],
        };
        let scoped = ScopedCheckBatch::new(batch, std::slice::from_ref(scope));
        encode_message(
            &mut bytes,
            FrameKind::ScopedCheckBatch,
            i as u64 + 1,
            &scoped,
        );
    }
    bytes
}

/// Sends `count` checks to each node at once; returns how many each allowed.
async fn round(
    nodes: &[&Node],
    connections: &[quinn::Connection],
    key: &[u8],
    limit: &Limit,
    count: usize,
    scope: &Scope,
) -> Vec<usize> {
    let bytes = scoped_frames(key, limit, count, scope);
    let answers = futures_like_join(connections, &bytes).await;
    assert_eq!(answers.len(), nodes.len());
    answers
        .iter()
        .map(|a| {
            assert!(a.errors.is_empty(), "{:?}", a.errors);
            a.allowed()
        })
        .collect()
}

/// The same bytes on a new stream of every connection, concurrently.
async fn futures_like_join(connections: &[quinn::Connection], bytes: &[u8]) -> Vec<Answers> {
    let mut tasks = Vec::new();
    for connection in connections {
        let connection = connection.clone();
        let bytes = bytes.to_vec();
        tasks.push(tokio::spawn(
            async move { exchange(&connection, &bytes).await },
        ));
    }
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    answers
}

/// Waits (bounded) until every node's exchange has everything it admitted confirmed: one node
/// after another, as an outbox fills only with what its node admits or passes on, and the
/// tests send nothing while they wait.
async fn settle(nodes: &[&Node]) {
    for node in nodes {
        let mut changes = node.region_sync().subscribe();
        let settled = tokio::time::timeout(WAIT, async {
            loop {
                changes.borrow_and_update();
                if node.region_sync().is_idle() {
                    return;
                }
                changes.changed().await.unwrap();
            }
        })
        .await;
        assert!(
            settled.is_ok(),
            "{}: deltas still unconfirmed after {WAIT:?}",
            node.node_id()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_limit_is_shared_by_three_regions_within_the_bound() {
    let (first, others) = three_regions().await;
    let nodes: Vec<&Node> = std::iter::once(&first.node).chain(&others).collect();
    let mut connections = Vec::new();
    for node in &nodes {
        connections.push(connect(node.local_addr(), client_config(&first.certs, false)).await);
    }
    // 30 per hour, burst 30: refill is negligible within the test, so the bound is the burst
    // plus (R - 1) shares: 30 + 2 × 10.
    let limit = Limit::gcra(30, 3_600 * NANOS_PER_SEC, 30).unwrap();
    let bound = 30 + 2 * 10;
    let key = b"global:tenant-7";
    // All three regions at once, before any has heard of the others.
    let burst = round(&nodes, &connections, key, &limit, 20, &Scope::Global).await;
    let mut total: usize = burst.iter().sum();
    assert!(total <= bound, "the simultaneous burst admitted {burst:?}");
    settle(&nodes).await;
    // Then rounds with the regions in sync between them, until the key is spent everywhere.
    for _ in 0..10 {
        let admitted = round(&nodes, &connections, key, &limit, 5, &Scope::Global).await;
        total += admitted.iter().sum::<usize>();
        settle(&nodes).await;
        if admitted.iter().all(|n| *n == 0) {
            break;
        }
    }
    eprintln!("global key: {total} admitted of a limit of 30 (bound {bound}); burst {burst:?}");
    assert!(total <= bound, "{total} admitted, over the bound {bound}");
    assert!(
        total >= 30,
        "only {total} admitted: the regions under-admit"
    );
    // Once all is confirmed, every region knows the key is spent.
    let last = round(&nodes, &connections, key, &limit, 1, &Scope::Global).await;
    assert_eq!(last, vec![0, 0, 0]);
    // Every node applied from each other node what that node admitted.
    for node in &nodes {
        let stats = node.region_sync().stats();
        assert_eq!(stats.refused_messages, 0);
        assert!(
            stats.applied_messages > 0,
            "{} applied nothing",
            node.node_id()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_limit_is_exact_per_region_and_a_home_limit_exact_overall() {
    let (first, others) = three_regions().await;
    let nodes: Vec<&Node> = std::iter::once(&first.node).chain(&others).collect();
    let mut connections = Vec::new();
    for node in &nodes {
        connections.push(connect(node.local_addr(), client_config(&first.certs, false)).await);
    }
    let limit = per_hour(30);
    let allowed = round(
        &nodes,
        &connections,
        b"region:k",
        &limit,
        40,
        &Scope::Region,
    )
    .await;
    assert_eq!(allowed, vec![30, 30, 30]);
    // Nothing crossed regions for a region key.
    settle(&nodes).await;
    for node in &nodes {
        assert_eq!(node.region_sync().stats().applied_messages, 0);
    }
    // A home check whose home is this node's region is a region check here.
    let home_a = Scope::Home(floodgate::region::RegionName::new("a").unwrap());
    let answers = exchange(
        &connections[0],
        &scoped_frames(b"home:k", &limit, 31, &home_a),
    )
    .await;
    assert_eq!(answers.allowed(), 30);
    // Elsewhere it is forwarded to its home and decided there: one bucket for all regions.
    for connection in &connections[1..] {
        let answers = exchange(connection, &scoped_frames(b"home:k", &limit, 1, &home_a)).await;
        assert!(answers.errors.is_empty(), "{:?}", answers.errors);
        assert_eq!(answers.decisions[0].1.len(), 1);
        assert_eq!(answers.allowed(), 0, "the home bucket is spent");
    }
    let fresh = exchange(
        &connections[2],
        &scoped_frames(b"home:fresh", &limit, 31, &home_a),
    )
    .await;
    assert_eq!(fresh.allowed(), 30);
    let at_home = exchange(
        &connections[0],
        &scoped_frames(b"home:fresh", &limit, 1, &home_a),
    )
    .await;
    assert_eq!(at_home.allowed(), 0);
    // A home region nobody serves: not decided (`not_owner`); the failure mode decides.
    let nowhere = Scope::Home(floodgate::region::RegionName::new("z").unwrap());
    let answers = exchange(
        &connections[1],
        &scoped_frames(b"home:z", &limit, 1, &nowhere),
    )
    .await;
    assert_eq!(
        answers.decisions[0].1,
        vec![Err(floodgate::wire::ErrorCode::NotOwner)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_scoped_batch_is_refused_in_words_and_decides_nothing() {
    let node = start_node(|c| fast(c, "a")).await;
    let connection = connect(node.node.local_addr(), client_config(&node.certs, false)).await;
    let limit = per_hour(1);
    // Two scopes for one check.
    let scoped = ScopedCheckBatch::new(
        CheckBatch {
            groups: vec![vec![WireCheck::new(b"victim".to_vec(), &limit, 1)]],
        },
        &[Scope::Global, Scope::Global],
    );
    let mut bytes = Vec::new();
    encode_message(&mut bytes, FrameKind::ScopedCheckBatch, 7, &scoped);
    let answers = exchange(&connection, &bytes).await;
    assert_eq!(answers.errors.len(), 1, "{answers:?}");
    let (id, code, message) = &answers.errors[0];
    assert_eq!(
        (*id, *code),
        (7, floodgate::wire::ErrorCode::MalformedPayload)
    );
    assert!(message.contains("2 scopes for 1 checks"), "{message}");
    // The one token of `victim` is still there.
    let answers = exchange(
        &connection,
        &scoped_frames(b"victim", &limit, 2, &Scope::Global),
    )
    .await;
    assert_eq!(answers.allowed(), 1);
}

/// A global key's units that the other region has not confirmed go with its slot to the new
/// owner in the region, which counts them against the region's share: `eu`'s first node admits
/// a share (10 of a burst of 20) of each of 64 keys and sends none of it yet (a sync interval
/// of an hour); a second `eu` node joins and takes some of those keys. It must admit none of
/// them: its region's share is already spent. Without the hand-off's units it admitted a share
/// more of each (the region's unconfirmed units at twice its share).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unconfirmed_units_go_with_their_slot_to_the_new_owner() {
    units_go_with_their_slots(None).await;
}

/// The units follow the link to the new owner, not the region's oldest member: with a member
/// of `eu` that speaks no version with kind 25 (2-10, silent, so `eu`'s region version is 10),
/// the first node still hands its units to a second one of this build. (Gated on the region
/// version, they were not sent, and the new owner inherited nothing. A restart heard of first
/// through an older build's gossip, which carries no versions, counted the same way.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unconfirmed_units_go_to_a_new_owner_that_reads_them_beside_an_older_member() {
    let before_units = floodgate::protocol::Feature::UnconfirmedHandoff.since() - 1;
    let old = floodgate::protocol::VersionRange::new(2, before_units);
    units_go_with_their_slots(old).await;
}

/// The other side of the test above, seen on the wire: a new owner whose link agreed on a version
/// before kind 25 is sent the hand-off's buckets but no units (it would refuse the kind), and one
/// whose link agreed on kind 25's version is sent the units before the buckets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_sends_units_only_to_a_new_owner_whose_link_reads_them() {
    let units_since = floodgate::protocol::Feature::UnconfirmedHandoff.since();
    let older = floodgate::protocol::VersionRange::new(2, units_since - 1).unwrap();
    let heard = hand_off_to_a_recording_member(older).await;
    assert!(
        !heard.iter().any(|h| matches!(h, Heard::Units(_))),
        "a new owner speaking {older:?} was sent kind 25: {heard:?}"
    );

    let reading = floodgate::protocol::VersionRange::new(2, units_since).unwrap();
    let heard = hand_off_to_a_recording_member(reading).await;
    let units = heard
        .iter()
        .position(|h| matches!(h, Heard::Units(n) if *n > 0));
    let buckets = heard.iter().position(|h| *h == Heard::HandoffBuckets);
    assert!(
        units.is_some() && units < buckets,
        "a new owner speaking {reading:?} was not sent its units before the buckets: {heard:?}"
    );
}

/// What a [`RecordingMember`] was sent, in the order it read it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Heard {
    /// A kind 25 with this many units' entries.
    Units(usize),
    /// A kind 7 frame that is part of a hand-off.
    HandoffBuckets,
    /// Any other frame (gossip, replicas, releases).
    Other(FrameKind),
}

/// A member of `eu`'s own address that speaks only the versions it was given and records every
/// frame sent to it (never gossiping, so the node must be patient with it). It answers a kind 25
/// as this build does, an empty kind 25, so a sender waiting for that answer goes on.
struct RecordingMember {
    addr: std::net::SocketAddr,
    heard: tokio::sync::watch::Receiver<Vec<Heard>>,
    _endpoint: quinn::Endpoint,
}

impl RecordingMember {
    async fn start(
        certs: &floodgate_node::DevCerts,
        versions: floodgate::protocol::VersionRange,
    ) -> Self {
        let server = quic_server_config(&certs.node_cert, &certs.node_key, versions);
        let endpoint = quinn::Endpoint::server(server, "127.0.0.1:0".parse().unwrap()).unwrap();
        let (record, heard) = tokio::sync::watch::channel(Vec::new());
        let accepting = endpoint.clone();
        tokio::spawn(async move {
            while let Some(incoming) = accepting.accept().await {
                let record = record.clone();
                tokio::spawn(async move {
                    let Ok(connection) = incoming.await else {
                        return;
                    };
                    loop {
                        let record = record.clone();
                        tokio::select! {
                            uni = connection.accept_uni() => {
                                let Ok(mut recv) = uni else { return };
                                tokio::spawn(async move {
                                    if let Ok(bytes) = recv.read_to_end(MOST_FRAME_BYTES).await {
                                        Self::record(&record, &bytes);
                                    }
                                });
                            }
                            bi = connection.accept_bi() => {
                                let Ok((mut send, mut recv)) = bi else { return };
                                tokio::spawn(async move {
                                    let Ok(bytes) = recv.read_to_end(MOST_FRAME_BYTES).await else {
                                        return;
                                    };
                                    let answer = Self::record(&record, &bytes);
                                    let _ = send.write_all(&answer).await;
                                    let _ = send.finish();
                                });
                            }
                        }
                    }
                });
            }
        });
        RecordingMember {
            addr: endpoint.local_addr().unwrap(),
            heard,
            _endpoint: endpoint,
        }
    }

    /// Records the frames of one stream; returns the answer to send back (kind 25s only).
    fn record(record: &tokio::sync::watch::Sender<Vec<Heard>>, bytes: &[u8]) -> Vec<u8> {
        let mut reader = floodgate::wire::FrameReader::new(MOST_FRAME_BYTES);
        reader.extend(bytes);
        let mut answer = Vec::new();
        while let Ok(Some(frame)) = reader.next_frame() {
            let heard = match frame.kind {
                FrameKind::RegionUnconfirmed => {
                    let units = floodgate::wire::decode_region_unconfirmed(&frame.payload)
                        .map_or(0, |m| m.units.len());
                    let empty = floodgate::wire::RegionUnconfirmedMessage {
                        from: "recording".into(),
                        units: Vec::new(),
                    };
                    encode_message(
                        &mut answer,
                        FrameKind::RegionUnconfirmed,
                        frame.request_id,
                        &empty,
                    );
                    Heard::Units(units)
                }
                FrameKind::Replicate
                    if floodgate::wire::decode_replicate(frame.version, &frame.payload)
                        .is_ok_and(|r| r.handoff.is_some()) =>
                {
                    Heard::HandoffBuckets
                }
                kind => Heard::Other(kind),
            };
            record.send_modify(|all| all.push(heard));
        }
        answer
    }
}

/// More than any frame a node sends a peer in these tests.
const MOST_FRAME_BYTES: usize = 16 << 20;

/// `eu`'s first node admits a share of 64 global keys, none of it confirmed (a sync interval of
/// an hour), then hears of a [`RecordingMember`] of `eu` speaking `versions` and hands it the
/// slots it now owns. Returns what the member was sent, once a hand-off's buckets came.
async fn hand_off_to_a_recording_member(versions: floodgate::protocol::VersionRange) -> Vec<Heard> {
    let (first, us) = eu_and_us(true).await;
    let a = &first.node;
    let to_a = connect(a.local_addr(), client_config(&first.certs, false)).await;
    holds_back_for(a, &to_a, &us).await;
    let keys: Vec<Vec<u8>> = (0..64)
        .map(|i| format!("moving-{i}").into_bytes())
        .collect();
    admits_an_unconfirmed_share(a, &to_a, &keys).await;

    let member = RecordingMember::start(&first.certs, versions).await;
    let addr = member.addr.to_string();
    gossip_silent_member(&first, (&addr, &addr), "eu", Some(versions)).await;
    let mut heard = member.heard.clone();
    let handed =
        tokio::time::timeout(WAIT, heard.wait_for(|h| h.contains(&Heard::HandoffBuckets))).await;
    assert!(
        handed.is_ok(),
        "no hand-off reached the new member: {:?}",
        *member.heard.borrow()
    );
    let heard = member.heard.borrow().clone();
    // Stopped at once: a graceful stop would wait for `us` to confirm the units, and for the
    // recording member to take a leaving node's slots, neither of which comes.
    us.crash();
    first.node.crash();
    heard
}

/// The body of the two tests above; `old_member`: the versions of a silent member of `eu`,
/// told to the first node before the second joins.
async fn units_go_with_their_slots(old_member: Option<floodgate::protocol::VersionRange>) {
    let (first, us) = eu_and_us(old_member.is_some()).await;
    let seed = first.node.local_addr();
    let a = &first.node;
    let mut owners = 1;
    if let Some(versions) = old_member {
        gossip_silent_member(&first, ("old-here", "127.0.0.1:7"), "eu", Some(versions)).await;
        owners += 1;
        converge(a, owners).await;
    }
    let limit = Limit::gcra(20, 3_600 * NANOS_PER_SEC, 20).unwrap();
    // Keys the first node decides (not the silent member's, which nothing would answer).
    let table = a.slot_table();
    let keys: Vec<Vec<u8>> = (0..10_000)
        .map(|i| format!("moving-{i}").into_bytes())
        .filter(|k| table.owner(floodgate::cluster::slot_of(k)) == Some(a.node_id()))
        .take(64)
        .collect();
    assert_eq!(keys.len(), 64);
    let to_a = connect(a.local_addr(), client_config(&first.certs, false)).await;
    holds_back_for(a, &to_a, &us).await;
    admits_an_unconfirmed_share(a, &to_a, &keys).await;

    let mut config = NodeConfig::for_tests(&first.certs);
    patient(&mut config, "eu", old_member.is_some());
    config.cluster.seeds = vec![seed.into()];
    // The inherited units count this long: longer than a loaded host may take from the
    // hand-off to the checks below (2 s by default).
    config.cluster.region_unreachable_after = Duration::from_secs(60);
    let b = Node::start(config).await.unwrap();
    converge(a, owners + 1).await;
    converge(&b, owners + 1).await;
    b.handoffs_settled().await;
    let table = b.slot_table();
    let moved: Vec<&Vec<u8>> = keys
        .iter()
        .filter(|k| table.owner(floodgate::cluster::slot_of(k)) == Some(b.node_id()))
        .collect();
    assert!(!moved.is_empty(), "no key moved to the new node");
    assert!(
        b.region_sync().stats().inherited_units > 0,
        "the new owner inherited nothing"
    );
    // Every check of every moved key in one round trip: the units count for 2 s after they
    // came, which a round trip per key on a loaded host could outlast.
    let to_b = connect(b.local_addr(), client_config(&first.certs, false)).await;
    holds_back_for(&b, &to_b, &us).await;
    let mut bytes = Vec::new();
    for key in &moved {
        bytes.extend(scoped_frames(key, &limit, 5, &Scope::Global));
    }
    let answers = exchange(&to_b, &bytes).await;
    assert!(answers.errors.is_empty(), "{:?}", answers.errors);
    assert_eq!(
        answers.allowed(),
        0,
        "the new owner admitted {} more of {} keys whose region share was unconfirmed",
        answers.allowed(),
        moved.len()
    );
    refuses_units_from_outside_its_region(&b, us.node_id(), a.node_id(), &first).await;
    b.shutdown().await;
    us.shutdown().await;
}

/// `eu`'s first node, with a sync interval of an hour (nothing it admits is confirmed within a
/// test), and a node of `us` joined through it. `silent_member`: a member that never gossips
/// will be told of in `eu`, so both suspect late enough to keep it an owner for the whole test.
async fn eu_and_us(silent_member: bool) -> (TestNode, Node) {
    let first = start_node(|c| {
        patient(c, "eu", silent_member);
        c.cluster.region_sync_interval = Duration::from_secs(3_600);
    })
    .await;
    let mut config = NodeConfig::for_tests(&first.certs);
    patient(&mut config, "us", silent_member);
    config.cluster.seeds = vec![first.node.local_addr().into()];
    let us = Node::start(config).await.unwrap();
    (first, us)
}

/// [`fast`], and with `silent_member` a failure detector that keeps a member that never gossips
/// alive (an owner) for the whole test.
fn patient(config: &mut NodeConfig, region: &str, silent_member: bool) {
    fast(config, region);
    if silent_member {
        config.cluster.membership.suspect_after_ns = 600 * NANOS_PER_SEC;
        config.cluster.membership.dead_after_ns = 1_200 * NANOS_PER_SEC;
    }
}

/// Twelve global checks of each of `keys` (a burst of 20 an hour) on `node`, through
/// `connection`: each admits its region's share, 10, and none of it is confirmed yet (the
/// caller's sync interval is an hour).
async fn admits_an_unconfirmed_share(
    node: &Node,
    connection: &quinn::Connection,
    keys: &[Vec<u8>],
) {
    let limit = Limit::gcra(20, 3_600 * NANOS_PER_SEC, 20).unwrap();
    for key in keys {
        let allowed = round(
            &[node],
            std::slice::from_ref(connection),
            key,
            &limit,
            12,
            &Scope::Global,
        )
        .await;
        assert_eq!(allowed, vec![10], "{}", String::from_utf8_lossy(key));
    }
    assert_eq!(
        node.region_sync().unconfirmed_units(),
        10 * keys.len() as u64,
        "a share of each key unconfirmed"
    );
}

/// Kind 25 is taken only from a member of the receiver's own region, and answered once the
/// units count: from `us`'s node or an unknown id it is refused as forbidden.
async fn refuses_units_from_outside_its_region(
    receiver: &Node,
    other_region: &str,
    same_region: &str,
    first: &TestNode,
) {
    use floodgate::wire::{ErrorCode, RegionUnconfirmedMessage, WireUnconfirmed};
    let peer = connect(receiver.local_addr(), peer_config(&first.certs)).await;
    for (from, accepted) in [
        (same_region, true),
        (other_region, false),
        ("nobody:1", false),
    ] {
        let message = RegionUnconfirmedMessage {
            from: from.to_owned(),
            units: vec![WireUnconfirmed {
                key: 42,
                region: "us".into(),
                units: 1,
            }],
        };
        let mut frame = Vec::new();
        encode_message(&mut frame, FrameKind::RegionUnconfirmed, 9, &message);
        let answer = floodgate_node::exchange::round_trip(&peer, &frame, 4096)
            .await
            .unwrap();
        let taken = floodgate_node::exchange::frame_of_kind(&answer, FrameKind::RegionUnconfirmed);
        assert_eq!(taken.is_ok(), accepted, "from {from}: {taken:?}");
        if !accepted {
            let error = floodgate_node::exchange::frame_of_kind(&answer, FrameKind::Error).unwrap();
            let error = floodgate::wire::decode_error_frame(&error.payload).unwrap();
            assert_eq!(error.code, ErrorCode::Forbidden as u16, "from {from}");
        }
    }
}

/// Waits (bounded) until `node` counts `other` (a node of another region) as an owner, then
/// shows it holds global checks back to that region's share: one frame of two checks of a fresh
/// key of burst 2 (a share of 1) that `node` owns, decided in one pass, admits the first and
/// holds the second back. That unit is the first `node` sends `other`, at once: returns once
/// it is confirmed, so what `node` admits next waits for its next sync interval.
async fn holds_back_for(node: &Node, connection: &quinn::Connection, other: &Node) {
    let counted = tokio::time::timeout(WAIT, node.reaches(&[other.node_id()])).await;
    assert!(
        counted.is_ok(),
        "{} never counted {} as an owner",
        node.node_id(),
        other.node_id()
    );
    let limit = Limit::gcra(2, 3_600 * NANOS_PER_SEC, 2).unwrap();
    let key = key_owned_by(
        node,
        node.node_id(),
        &format!("probe-{}-{}-", node.node_id(), other.node_id()),
    );
    let check = WireCheck::new(key, &limit, 1);
    let batch = CheckBatch {
        groups: vec![vec![check.clone()], vec![check]],
    };
    let scoped = ScopedCheckBatch::new(batch, &[Scope::Global, Scope::Global]);
    let mut bytes = Vec::new();
    encode_message(&mut bytes, FrameKind::ScopedCheckBatch, 1, &scoped);
    let answers = exchange(connection, &bytes).await;
    assert!(answers.errors.is_empty(), "{:?}", answers.errors);
    assert_eq!(
        answers.allowed(),
        1,
        "{} did not hold the second check back for {}",
        node.node_id(),
        other.node_id()
    );
    settle(&[node]).await;
}
