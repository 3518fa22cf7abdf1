//! Protocol versions at a real node: a caller of the build before negotiation (version 2 alone,
//! ALPN `floodgate/1`) is served in version 2, every kind of frame such a caller or peer sends
//! (the pinned frames of `tests/golden/wire_frames.txt`) is read, and a caller sharing no
//! version is refused in the handshake and counted.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{
    TestNode, connect, metric_value, metrics_page, quic_client_config_speaking, start_node,
};
use floodgate::protocol::{self, VersionRange};
use floodgate::wire::{Frame, FrameKind, FrameReader, decode_error_frame};

const VERSION_2: VersionRange = VersionRange { min: 2, max: 2 };

/// The pinned protocol 2 frames, by kind name.
fn golden_frames() -> BTreeMap<String, Vec<u8>> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/golden/wire_frames.txt"
    );
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .filter_map(|line| line.split_once(' '))
        .map(|(name, hex)| {
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect();
            (name.to_owned(), bytes)
        })
        .collect()
}

fn frames_of(bytes: &[u8]) -> Vec<Frame> {
    let mut reader = FrameReader::new(16 << 20);
    reader.extend(bytes);
    std::iter::from_fn(|| reader.next_frame().unwrap()).collect()
}

async fn metrics(node: &TestNode) -> String {
    metrics_page(&node.node).await
}

async fn node_with_admin() -> TestNode {
    start_node(|config| config.admin = Some("127.0.0.1:0".parse().unwrap())).await
}

/// Every kind a version 2 gateway or peer sends is read by this build: each request kind is
/// answered (in version 2's layout, which is all such a caller reads), each one-way kind is
/// taken without a malformed or unsupported frame counted, and version 2's gossip (no ranges)
/// makes its members known, speaking version 2.
#[tokio::test]
async fn every_kind_a_version_2_caller_or_peer_sends_is_read() {
    let node = node_with_admin().await;
    let config = quic_client_config_speaking(
        &node.certs.ca,
        Some((&node.certs.node_cert, &node.certs.node_key)),
        VERSION_2,
    );
    let connection = connect(node.node.local_addr(), config).await;
    let golden = golden_frames();
    let answers = [
        ("CheckBatch", FrameKind::DecisionBatch),
        ("ForwardedCheckBatch", FrameKind::DecisionBatch),
        ("ScopedCheckBatch", FrameKind::DecisionBatch),
        ("LeaseRequest", FrameKind::LeaseAnswer),
        ("TokenLeaseBatch", FrameKind::TokenLeaseAnswers),
        ("PolicyRequest", FrameKind::Policy),
        ("TableRequest", FrameKind::SlotTable),
    ];
    for (name, expected) in answers {
        let bytes = floodgate_node::exchange::round_trip(&connection, &golden[name], 16 << 20)
            .await
            .unwrap();
        let frames = frames_of(&bytes);
        assert!(!frames.is_empty(), "{name}: no answer");
        for frame in frames {
            assert_eq!(
                frame.version, 2,
                "{name}: answered in version {}",
                frame.version
            );
            if frame.kind == FrameKind::Error {
                let error = decode_error_frame(&frame.payload).unwrap();
                panic!("{name}: refused: {} {}", error.code, error.message);
            }
            assert_eq!(frame.kind, expected, "{name}");
            if frame.kind == FrameKind::SlotTable {
                let table = floodgate::wire::decode_slot_table(frame.version, &frame.payload);
                assert_eq!(table.unwrap().cluster_version, 2);
            }
        }
    }

    let refusals = |page: &str| {
        ["malformed_payload", "unsupported_version", "unknown_kind"].map(|code| {
            metric_value(
                page,
                &format!("floodgate_frame_errors_total{{code=\"{code}\"}}"),
            )
        })
    };
    let before = refusals(&metrics(&node).await);
    for name in [
        "Gossip",
        "IdConflict",
        "Replicate",
        "LeaseSync",
        "RegionDeltas",
        "RegionAck",
    ] {
        let mut stream = connection.open_uni().await.unwrap();
        stream.write_all(&golden[name]).await.unwrap();
        stream.finish().unwrap();
        // Taken once the node has read it all (and would stop the stream if it refused it).
        let stopped = tokio::time::timeout(Duration::from_secs(10), stream.stopped()).await;
        assert!(matches!(stopped, Ok(Ok(None))), "{name}: {stopped:?}");
    }
    // The pinned gossip names node-0 (alive) and node-1 (departed), in region eu. Sent again
    // with a version 2 digest of a live member of this node's region after it on one stream
    // (handled in order): once the node's table names that member, the gossip was taken.
    let marker = floodgate::cluster::membership::MemberDigest {
        info: floodgate::cluster::MemberInfo {
            id: "marker".to_owned(),
            addr: "127.0.0.1:9".to_owned(),
            region: "local".to_owned(),
        },
        incarnation: 1,
        heartbeat: 1,
        left: false,
        versions: None,
        joining: false,
    };
    let mut frames = golden["Gossip"].clone();
    let gossip = floodgate::cluster::Gossip {
        members: vec![marker],
    };
    floodgate::wire::encode_gossip(&mut frames, 2, &gossip);
    let mut stream = connection.open_uni().await.unwrap();
    stream.write_all(&frames).await.unwrap();
    stream.finish().unwrap();
    let mut tables = node.node.watch_slot_table();
    let known = tokio::time::timeout(
        Duration::from_secs(10),
        tables.wait_for(|table| table.nodes().iter().any(|n| n == "marker")),
    )
    .await
    // Not held: the watch's guard would block the node's next table.
    .is_ok();
    assert!(known, "version 2's gossip was not taken");
    assert_eq!(
        node.node.member_addr("node-0").as_deref(),
        Some("127.0.0.1:7100")
    );
    // A member gossiped without a range is taken to speak version 2 alone.
    assert_eq!(node.node.cluster_version(), 2);
    assert_eq!(refusals(&metrics(&node).await), before);
    node.node.shutdown().await;
}

/// A caller that speaks only versions this build does not is refused in the handshake, with
/// TLS's `no_application_protocol`, and the node counts it.
#[tokio::test]
async fn a_caller_sharing_no_version_is_refused_and_counted() {
    let node = node_with_admin().await;
    let newer = VersionRange::new(protocol::NEWEST + 1, protocol::NEWEST + 2).unwrap();
    let config = quic_client_config_speaking(&node.certs.ca, None, newer);
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(config);
    let refused = endpoint
        .connect(node.node.local_addr(), "localhost")
        .unwrap()
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, quinn::ConnectionError::ConnectionClosed(close)
            if u64::from(close.error_code) == 0x178),
        "{refused}"
    );
    let page = metrics(&node).await;
    let series = "floodgate_protocol_mismatches_total{direction=\"inbound\"}";
    assert!(metric_value(&page, series) >= 1.0, "{page}");

    // The node's own versions still connect.
    let config = quic_client_config_speaking(&node.certs.ca, None, protocol::SUPPORTED);
    let connection = connect(node.node.local_addr(), config).await;
    let table = floodgate_node::exchange::round_trip(
        &connection,
        &golden_frames()["TableRequest"],
        1 << 20,
    )
    .await
    .unwrap();
    let frame = frames_of(&table).pop().unwrap();
    // The slot table in the newest layout it has (the connection speaks the newest version).
    assert_eq!(
        frame.version,
        FrameKind::SlotTable.layout_at(protocol::NEWEST)
    );
    let table = floodgate::wire::decode_slot_table(frame.version, &frame.payload).unwrap();
    assert_eq!(table.cluster_version, protocol::NEWEST);
    assert_eq!(table.members[0].versions, Some(protocol::SUPPORTED));
    node.node.shutdown().await;
}
