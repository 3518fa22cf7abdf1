//! A peer speaks only for itself: a node certificate of the peer CA lets its holder gossip and
//! send region frames, but not retire another member, spread fields no node could have, or
//! speak for a region the membership does not know it in. Raw frames from a peer-certified QUIC
//! connection, each stream's frames handled in order, so a harmless frame sent last tells when
//! the ones before it were; waits are bounded by timeouts.

mod common;
#[path = "common/pki.rs"]
mod pki;

use std::time::Duration;

use common::*;
use floodgate::cluster::membership::MemberDigest;
use floodgate::cluster::{Gossip, MemberInfo};
use floodgate::region::{Delta, DeltaAck, DeltaBatch, Peer, RegionName};
use floodgate::wire::{FrameKind, RegionAckMessage, RegionDeltasMessage, encode_message};
use floodgate::{BucketKey, Limit, NANOS_PER_SEC};
use floodgate_node::{Node, NodeConfig, TlsConfig};
use pki::TestCa;

const PATIENCE: Duration = Duration::from_secs(10);

fn digest(info: MemberInfo, incarnation: u64, left: bool) -> MemberDigest {
    MemberDigest {
        info,
        incarnation,
        heartbeat: if left { u64::MAX } else { 1 },
        left,
        versions: None,
        joining: false,
    }
}

fn gossip_frame(members: Vec<MemberDigest>) -> Vec<u8> {
    let mut frame = Vec::new();
    floodgate::wire::encode_gossip(&mut frame, floodgate::protocol::NEWEST, &Gossip { members });
    frame
}

/// Sends `frames` on one new unidirectional stream and waits until the node has read them.
async fn send_frames(peer: &quinn::Connection, frames: &[u8]) {
    let mut stream = peer.open_uni().await.unwrap();
    stream.write_all(frames).await.unwrap();
    stream.finish().unwrap();
    let read = tokio::time::timeout(PATIENCE, stream.stopped()).await;
    assert!(matches!(read, Ok(Ok(None))), "{read:?}");
}

/// Gossip of a live member `id` in `region`, to send after the frames under test on the same
/// stream: the node handles a stream's frames in order, so once its table names `id`, every
/// frame before it was handled.
fn marker_frame(id: &str, region: &str) -> Vec<u8> {
    let marker = MemberInfo {
        id: id.to_owned(),
        addr: "127.0.0.1:9".to_owned(),
        region: region.to_owned(),
    };
    gossip_frame(vec![digest(marker, 1, false)])
}

/// Waits (bounded, on the node's table, no polling) until a marker `id` owns slots.
async fn wait_for_marker(node: &Node, id: &str) {
    let mut tables = node.watch_slot_table();
    let known = tokio::time::timeout(
        PATIENCE,
        tables.wait_for(|table| table.nodes().iter().any(|n| n == id)),
    )
    .await
    // Not held: the watch's guard would block the node's next table.
    .is_ok();
    assert!(known, "{} never took {id}", node.node_id());
}

fn frame_errors(page: &str, code: &str) -> f64 {
    common::metric_value(
        page,
        &format!("floodgate_frame_errors_total{{code=\"{code}\"}}"),
    )
}

/// Another member's departure at an incarnation it is not known in, relayed by a peer, changes
/// nothing: the member still owns its slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_cannot_announce_another_members_departure() {
    let a = start_node(|_| {}).await;
    let mut config = NodeConfig::for_tests(&a.certs);
    config.cluster.seeds = vec![a.node.local_addr().into()];
    let b = Node::start(config).await.unwrap();
    converge(&a.node, 2).await;
    converge(&b, 2).await;
    let victim = MemberInfo {
        id: b.node_id().to_owned(),
        addr: a.node.member_addr(b.node_id()).unwrap(),
        region: "local".to_owned(),
    };
    let attacker = connect(a.node.local_addr(), peer_config(&a.certs)).await;
    let frames = [
        gossip_frame(vec![digest(victim.clone(), u64::MAX, true)]),
        gossip_frame(vec![digest(victim, 1, true)]),
        marker_frame("marker", "local"),
    ]
    .concat();
    send_frames(&attacker, &frames).await;
    wait_for_marker(&a.node, "marker").await;
    assert!(
        a.node.owners().iter().any(|n| n == b.node_id()),
        "{} still owns its slots",
        b.node_id()
    );
    b.shutdown().await;
    a.node.shutdown().await;
}

/// Gossip with a 900 KB id (under the frame limit), more digests than a node tracks, or a
/// region no node can have is refused whole, counted as `malformed_payload`, and none of its
/// members is taken (so nobody passes them on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gossip_no_node_could_send_is_refused_whole() {
    let a = start_node(|c| c.admin = Some("127.0.0.1:0".parse().unwrap())).await;
    let before = frame_errors(&common::metrics_page(&a.node).await, "malformed_payload");
    let attacker = connect(a.node.local_addr(), peer_config(&a.certs)).await;
    let member = |id: String, region: &str| MemberInfo {
        id,
        addr: "127.0.0.1:9".to_owned(),
        region: region.to_owned(),
    };
    let witness = digest(member("witness".to_owned(), "local"), 1, true);
    let messages = [
        vec![
            witness.clone(),
            digest(member("x".repeat(900_000), "local"), 1, false),
        ],
        std::iter::once(witness.clone())
            .chain(
                (0..floodgate::wire::MAX_GOSSIP_DIGESTS)
                    .map(|i| digest(member(format!("crowd-{i}"), "local"), 1, true)),
            )
            .collect(),
        vec![
            witness,
            digest(member("spaced".to_owned(), "eu west"), 1, false),
        ],
    ];
    for (i, members) in messages.into_iter().enumerate() {
        let marker = format!("marker-{i}");
        let frames = [gossip_frame(members), marker_frame(&marker, "local")].concat();
        send_frames(&attacker, &frames).await;
        wait_for_marker(&a.node, &marker).await;
        let counted = frame_errors(&common::metrics_page(&a.node).await, "malformed_payload");
        assert_eq!(counted, before + (i + 1) as f64, "message {i}");
    }
    for id in ["witness", "crowd-0", "spaced"] {
        assert_eq!(a.node.member_addr(id), None, "{id} was taken");
    }
    a.node.shutdown().await;
}

/// A peer whose membership says it is in region `eu` sends region deltas and an acknowledgement
/// in the name of region `us`: both are forbidden (counted) and nothing is applied; the same
/// peer's deltas in its own region are applied. A node id the membership does not know may not
/// send region frames either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn region_frames_name_the_region_the_sender_is_known_in() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "cluster-ca");
    let dev = floodgate_node::ensure_dev_certs(&dir.path().join("dev")).unwrap();
    let node_identity = ca.node("fg-a.internal", &["fg-a.internal", "127.0.0.1"]);
    let mut config = NodeConfig::for_tests(&dev);
    config.tls = TlsConfig {
        cert: node_identity.cert,
        key: node_identity.key,
        client_ca: None,
        peer_ca: Some(ca.cert.clone()),
    };
    config.cluster.node_id = Some("fg-a.internal".to_owned());
    config.cluster.region = "ap".to_owned();
    config.admin = Some("127.0.0.1:0".parse().unwrap());
    let node = Node::start(config).await.unwrap();

    let mallory = "fg-m.internal";
    let identity = ca.node(mallory, &[mallory, "127.0.0.1"]);
    let as_peer = quic_client_config(&ca.cert, Some((&identity.cert, &identity.key)));
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(as_peer);
    let attacker = endpoint
        .connect(node.local_addr(), "fg-a.internal")
        .unwrap()
        .await
        .unwrap();

    let region = |name: &str| RegionName::new(name).unwrap();
    let (own, claimed) = (
        Peer::new(region("eu"), mallory),
        Peer::new(region("us"), mallory),
    );
    let deltas = |from: &Peer, seq: u64, units: u64| {
        let batch = DeltaBatch {
            from: from.clone(),
            session: 1,
            seq,
            settled_below: None,
            deltas: vec![Delta {
                key: BucketKey::for_key(b"global"),
                limit: Limit::gcra(100, 3_600 * NANOS_PER_SEC, 100).unwrap(),
                units,
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
        frame
    };
    let mut ack = Vec::new();
    encode_message(
        &mut ack,
        FrameKind::RegionAck,
        0,
        &RegionAckMessage::from(&DeltaAck {
            from: claimed.clone(),
            session: 1,
            below: 5,
            also: Vec::new(),
            receiver_session: None,
        }),
    );
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let joins = gossip_frame(vec![digest(
        MemberInfo {
            id: mallory.to_owned(),
            addr: "127.0.0.1:9".to_owned(),
            region: "eu".to_owned(),
        },
        now_ms,
        false,
    )]);
    let frames = [
        deltas(&own, 1, 1), // before the membership knows it
        joins,
        deltas(&claimed, 1, 3),
        ack,
        deltas(&own, 2, 2),
    ]
    .concat();
    let before = frame_errors(&common::metrics_page(&node).await, "forbidden");
    let sync = node.region_sync();
    let mut progress = sync.subscribe();
    send_frames(&attacker, &frames).await;
    let applied = tokio::time::timeout(
        PATIENCE,
        progress.wait_for(|_| sync.applied_from(&own) >= 2),
    )
    .await;
    assert!(applied.is_ok(), "{:?}", sync.stats());
    assert_eq!(sync.applied_from(&claimed), 0, "units taken as region us's");
    assert_eq!(sync.applied_from(&own), 2, "units taken from a stranger");
    // Frames of one stream are handled in order: the forbidden ones came before the last
    // deltas, which are applied.
    let counted = frame_errors(&common::metrics_page(&node).await, "forbidden");
    assert_eq!(counted, before + 3.0);
    node.shutdown().await;
}

/// An id conflict is a claim any peer can send: one that would make the node yield counts only
/// when a node at the holder's address proves the id (its certificate names it). A forged one,
/// pointing at an address where no such node is, is ignored and counted; the node stays in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_cannot_make_a_node_yield_its_id_with_a_forged_conflict() {
    let victim = start_node(|c| {
        c.admin = Some("127.0.0.1:0".parse().unwrap());
        c.cluster.node_id = Some("node-v".into());
    })
    .await;
    let series = "floodgate_unproven_id_conflicts_total";
    let before = common::metric_value(&common::metrics_page(&victim.node).await, series);
    let conflict = floodgate::cluster::IdConflict {
        id: "node-v".to_owned(),
        holder_addr: "127.0.0.1:9".to_owned(),
        holder_incarnation: 0,
        claimant_addr: victim.node.local_addr().to_string(),
        claimant_incarnation: u64::MAX,
    };
    let mut frames = Vec::new();
    encode_message(&mut frames, FrameKind::IdConflict, 0, &conflict);
    // Handled after the conflict (whose proof is awaited first) on the same stream.
    frames.extend(marker_frame("marker", "local"));
    let attacker = connect(victim.node.local_addr(), peer_config(&victim.certs)).await;
    send_frames(&attacker, &frames).await;
    wait_for_marker(&victim.node, "marker").await;
    let counted = common::metric_value(&common::metrics_page(&victim.node).await, series);
    assert_eq!(
        counted,
        before + 1.0,
        "the forged conflict was not judged unproven"
    );
    assert_eq!(*victim.node.watch_refusal().borrow(), None);
    assert_eq!(victim.node.not_ready_reason(), None);
    victim.node.shutdown().await;
}

/// Nodes known by DNS ids, each with its own certificate; a third certificate of the same CA,
/// for `fg-m`, in a hostile peer's hands. Another member's digest from it is a relay: it cannot
/// restart that member in another region as a joining node (which would drop it from every
/// table at once, and leave its own heartbeats, of its real life, counting for nothing), nor
/// announce its departure. The member keeps its slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_cannot_restart_retire_or_unjoin_another_member() {
    let a = start_node(|c| c.cluster.node_id = Some("fg-a".into())).await;
    let mut config = NodeConfig::for_tests(&a.certs);
    config.cluster.node_id = Some("fg-b".into());
    config.cluster.seeds = vec![a.node.local_addr().into()];
    certify_node_id(&mut config, &a.certs);
    let b = Node::start(config).await.unwrap();
    converge(&a.node, 2).await;
    converge(&b, 2).await;
    let (cert, key) = a.certs.node_cert_for("fg-m").unwrap();
    let attacker = connect(
        a.node.local_addr(),
        quic_client_config(&a.certs.ca, Some((&cert, &key))),
    )
    .await;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let addr = a.node.member_addr("fg-b").unwrap();
    let restarted = MemberDigest {
        joining: true,
        ..digest(
            MemberInfo {
                id: "fg-b".to_owned(),
                addr: addr.clone(),
                region: "elsewhere".to_owned(),
            },
            now_ms,
            false,
        )
    };
    let departed = digest(
        MemberInfo {
            id: "fg-b".to_owned(),
            addr,
            region: "local".to_owned(),
        },
        now_ms,
        true,
    );
    let frames = [
        gossip_frame(vec![restarted]),
        gossip_frame(vec![departed]),
        marker_frame("marker", "local"),
    ]
    .concat();
    send_frames(&attacker, &frames).await;
    wait_for_marker(&a.node, "marker").await;
    assert!(
        a.node.owners().iter().any(|n| n == "fg-b"),
        "fg-b lost its slots: {:?}",
        a.node.owners()
    );
    b.shutdown().await;
    a.node.shutdown().await;
}
