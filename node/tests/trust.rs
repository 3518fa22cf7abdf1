//! Who may act as a node: peer-only frames (gossip, replicate, forwarded checks) from a
//! connection without a node certificate of the peer CA close it with `forbidden`, whatever
//! client certificate it holds; nodes with certificates that name their ids (not `localhost`)
//! form a cluster and are verified by id; a client's takeover flag makes only the named
//! successor decide, and only once it suspects the owner. Waits are on events, bounded by
//! timeouts.

mod common;
#[path = "common/pki.rs"]
mod pki;

use std::time::Duration;

use common::*;
use floodgate::cluster::{MembershipConfig, slot_of};
use floodgate::wire::{CheckBatch, ErrorCode, FrameKind, WireCheck, encode_frame, encode_message};
use floodgate_node::{Node, NodeConfig, TlsConfig};
use pki::TestCa;

const MS: u64 = 1_000_000;
const PATIENCE: Duration = Duration::from_secs(10);

fn fast(config: &mut NodeConfig) {
    config.cluster.membership = MembershipConfig {
        gossip_interval_ns: 20 * MS,
        suspect_after_ns: 150 * MS,
        dead_after_ns: 300 * MS,
        ..MembershipConfig::default()
    };
    config.cluster.sync_interval = Duration::from_millis(50);
    // A forwarded takeover waits for the live owner's answer rather than racing a debug build.
    config.cluster.takeover_forward_timeout = PATIENCE;
}

/// A frame of `kind` whose payload is not a valid message: a receiver that decoded it would
/// answer `malformed_payload`, not `forbidden`.
fn garbage_frame(kind: FrameKind) -> Vec<u8> {
    let mut frame = Vec::new();
    encode_frame(&mut frame, kind, 7, &[0xAB; 40]);
    frame
}

/// Sends `frame` on a fresh stream of the kind the frame travels on (bidirectional for
/// forwarded checks, one-way otherwise) and returns how the node closed the connection.
async fn send_as_non_peer(connection: quinn::Connection, frame: &[u8], bidi: bool) -> String {
    if bidi {
        let answer = floodgate_node::exchange::round_trip(&connection, frame, 1 << 20);
        let _ = tokio::time::timeout(PATIENCE, answer).await;
    } else {
        let mut send = connection.open_uni().await.unwrap();
        let _ = send.write_all(frame).await;
        let _ = send.finish();
    }
    let closed = tokio::time::timeout(PATIENCE, connection.closed())
        .await
        .expect("the node closes the connection");
    match closed {
        quinn::ConnectionError::ApplicationClosed(close) => {
            assert_eq!(
                close.error_code,
                quinn::VarInt::from_u32(ErrorCode::Forbidden as u32)
            );
            String::from_utf8_lossy(&close.reason).into_owned()
        }
        other => panic!("expected a forbidden close, got {other:?}"),
    }
}

/// Every peer-only kind, on the streams it travels on, from `client` to `node`: each closes
/// the connection with `forbidden`; the node goes on serving, and a forwarded check it refused
/// consumed nothing.
async fn peer_only_kinds_are_forbidden(node: &TestNode, client: &quinn::ClientConfig) {
    let addr = node.node.local_addr();
    let mut forwarded = Vec::new();
    let one = per_hour(1);
    encode_message(
        &mut forwarded,
        FrameKind::ForwardedCheckBatch,
        0,
        &CheckBatch {
            groups: vec![vec![WireCheck::new(b"victim".to_vec(), &one, 1)]],
        },
    );
    let cases = [
        (garbage_frame(FrameKind::Gossip), false),
        (garbage_frame(FrameKind::Replicate), false),
        (garbage_frame(FrameKind::RegionDeltas), false),
        (garbage_frame(FrameKind::RegionAck), false),
        (garbage_frame(FrameKind::LeaseSync), false),
        (garbage_frame(FrameKind::Gossip), true),
        (forwarded, true),
    ];
    for (frame, bidi) in cases {
        let connection = connect(addr, client.clone()).await;
        let reason = send_as_non_peer(connection, &frame, bidi).await;
        assert!(reason.contains("forbidden"), "{reason}");
    }
    // The forwarded check was never decided: the only token is still there.
    let witness = connect(addr, client.clone()).await;
    let answers = exchange(&witness, &check_frame(1, &[b"victim"], &one)).await;
    assert_eq!(answers.allowed(), 1, "{answers:?}");
    assert_eq!(
        node.node.live_buckets(),
        1,
        "nothing replicated or forwarded was merged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_a_certificate_may_not_act_as_a_peer() {
    let node = start_node(|_| {}).await;
    let anonymous = client_config(&node.certs, false);
    peer_only_kinds_are_forbidden(&node, &anonymous).await;
    node.node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_from_a_separate_client_ca_is_not_a_peer() {
    let node =
        start_node(|c| c.tls.client_ca = Some(c.tls.cert.with_file_name("client-ca.pem"))).await;
    let client = client_config(&node.certs, true);
    peer_only_kinds_are_forbidden(&node, &client).await;
    node.node.shutdown().await;
}

/// One CA signs nodes and clients: a client certificate from it, even one naming a DNS name
/// like a node id, lacks the server-auth usage every node certificate has, and is no peer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_from_the_peer_ca_itself_is_not_a_peer() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "shared-ca");
    let node_identity = ca.node("fg-a.internal", &["fg-a.internal", "127.0.0.1"]);
    let client = ca.client("gateway", &["fg-b.internal"]);
    let node = start_node(|c| {
        c.tls = TlsConfig {
            cert: node_identity.cert.clone(),
            key: node_identity.key.clone(),
            client_ca: Some(ca.cert.clone()),
            peer_ca: Some(ca.cert.clone()),
        };
        c.cluster.node_id = Some("fg-a.internal".into());
    })
    .await;
    let addr = node.node.local_addr();
    let as_client = quic_client_config(&ca.cert, Some((&client.cert, &client.key)));
    for (frame, bidi) in [
        (garbage_frame(FrameKind::Gossip), false),
        (garbage_frame(FrameKind::Replicate), false),
        (garbage_frame(FrameKind::ForwardedCheckBatch), true),
    ] {
        let connection = connect_as(addr, as_client.clone(), "fg-a.internal").await;
        let reason = send_as_non_peer(connection, &frame, bidi).await;
        assert!(reason.contains("forbidden"), "{reason}");
    }
    // The same CA's node certificate is a peer: its replica is taken, but only in its own name
    // (both frames on one stream, handled in order: the first is dropped before the second).
    let as_peer = quic_client_config(&ca.cert, Some((&node_identity.cert, &node_identity.key)));
    let peer = connect_as(addr, as_peer, "fg-a.internal").await;
    let mut received = node.node.watch_received_buckets();
    let frames = [
        replicate_frame("fg-b.internal", b"impersonated"),
        replicate_frame("fg-a.internal", b"replicated"),
    ]
    .concat();
    send_frames(&peer, &frames).await;
    let taken = tokio::time::timeout(PATIENCE, received.wait_for(|n| *n >= 1)).await;
    assert!(taken.is_ok(), "a peer's replica is merged");
    assert_eq!(
        node.node.live_buckets(),
        1,
        "a replicate in another node's name is dropped"
    );
    node.node.shutdown().await;
}

async fn send_replica(peer: &quinn::Connection, key: &[u8]) {
    send_frames(peer, &replicate_frame("fg-a.internal", key)).await;
}

async fn send_frames(peer: &quinn::Connection, frames: &[u8]) {
    let mut stream = peer.open_uni().await.unwrap();
    stream.write_all(frames).await.unwrap();
    stream.finish().unwrap();
    assert_eq!(stream.stopped().await.unwrap(), None);
}

/// A replicate frame in the name of `from` carrying one bucket for `key`.
fn replicate_frame(from: &str, key: &[u8]) -> Vec<u8> {
    use floodgate::wire::{ReplicateMessage, WireBucket};
    use floodgate::{BucketKey, BucketState, BucketValue};
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let bucket = BucketState {
        key: BucketKey::new(b"", key),
        value: BucketValue::Gcra {
            tat_ns: now + 3_600 * floodgate::NANOS_PER_SEC,
            margin_ms: 0,
        },
    };
    let message = ReplicateMessage {
        from: from.into(),
        handoff: None,
        buckets: vec![WireBucket::from(&bucket)],
    };
    let mut frame = Vec::new();
    encode_message(&mut frame, FrameKind::Replicate, 0, &message);
    frame
}

async fn connect_as(
    addr: std::net::SocketAddr,
    config: quinn::ClientConfig,
    server_name: &str,
) -> quinn::Connection {
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(config);
    endpoint.connect(addr, server_name).unwrap().await.unwrap()
}

/// Two nodes on certificates that name `fg-a.internal` and `fg-b.internal` (and 127.0.0.1,
/// never localhost) form a cluster: the second joins through the first's IP address, then each
/// A node named `id` with a certificate from `ca` naming `id` and 127.0.0.1 (never localhost),
/// joining through `seeds`.
async fn start_named(
    ca: &TestCa,
    dev: &floodgate_node::DevCerts,
    id: &str,
    seeds: Vec<floodgate_node::HostPort>,
) -> Node {
    let identity = ca.node(id, &[id, "127.0.0.1"]);
    let mut config = NodeConfig::for_tests(dev);
    fast(&mut config);
    config.tls = TlsConfig {
        cert: identity.cert,
        key: identity.key,
        client_ca: None,
        peer_ca: Some(ca.cert.clone()),
    };
    config.cluster.node_id = Some(id.to_owned());
    config.cluster.seeds = seeds;
    Node::start(config).await.unwrap()
}

/// dials the other by node id. A connection verifies each node by its own id only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_named_by_their_ids_form_a_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "cluster-ca");
    let dev = floodgate_node::ensure_dev_certs(&dir.path().join("dev")).unwrap();
    let start = |id, seeds| start_named(&ca, &dev, id, seeds);
    let a = start("fg-a.internal", vec![]).await;
    let b = start("fg-b.internal", vec![a.local_addr().into()]).await;
    converge(&a, 2).await;
    converge(&b, 2).await;
    assert_eq!(a.owners(), ["fg-a.internal", "fg-b.internal"]);

    let anonymous = quic_client_config(&ca.cert, None);
    let by_id = connect_as(b.local_addr(), anonymous.clone(), "fg-b.internal").await;
    let answers = exchange(&by_id, &check_frame(1, &[b"k"], &per_hour(3))).await;
    assert_eq!(answers.allowed(), 1, "{answers:?}");
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(anonymous);
    for wrong in ["fg-a.internal", "localhost"] {
        let refused = endpoint.connect(b.local_addr(), wrong).unwrap().await;
        assert!(refused.is_err(), "b's certificate does not name {wrong}");
    }
    b.shutdown().await;
    a.shutdown().await;
}

/// The same certificates (`fg-a.internal`/`fg-b.internal` plus 127.0.0.1, never localhost),
/// the second node joining through a host-name seed, `localhost:PORT`: the name is resolved
/// when the seed is dialed (127.0.0.1 first, which the certificate's IP covers), and a seed is
/// accepted as any node of the peer CA, so the name itself need not be in the certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_joins_through_a_seed_given_by_host_name() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "cluster-ca");
    let dev = floodgate_node::ensure_dev_certs(&dir.path().join("dev")).unwrap();
    let start = |id, seeds| start_named(&ca, &dev, id, seeds);
    let a = start("fg-a.internal", vec![]).await;
    let by_name: floodgate_node::HostPort = format!("localhost:{}", a.local_addr().port())
        .parse()
        .unwrap();
    assert!(by_name.socket_addr().is_none(), "a name, not an address");
    let b = start("fg-b.internal", vec![by_name]).await;
    converge(&a, 2).await;
    converge(&b, 2).await;
    assert_eq!(a.owners(), ["fg-a.internal", "fg-b.internal"]);
    // Joined (the flag is set just after the table switch converge waits for).
    let joined = tokio::time::timeout(PATIENCE, b.joined()).await;
    assert!(joined.is_ok(), "{:?}", b.not_ready_reason());
    assert_eq!(b.not_ready_reason(), None);
    b.shutdown().await;
    a.shutdown().await;
}

#[tokio::test]
async fn a_node_id_that_is_not_a_dns_name_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let certs = floodgate_node::ensure_dev_certs(dir.path()).unwrap();
    let mut config = NodeConfig::for_tests(&certs);
    config.cluster.node_id = Some("node 1/../x".into());
    let error = Node::start(config).await.unwrap_err();
    assert!(format!("{error:#}").contains("not a DNS name"), "{error:#}");
    let error = certs.node_cert_for("../escape").unwrap_err();
    assert!(format!("{error:#}").contains("not a DNS name"), "{error:#}");
    // A valid id the certificate does not carry (node.pem names localhost and loopback only).
    let mut config = NodeConfig::for_tests(&certs);
    config.cluster.node_id = Some("fg-z.internal".into());
    let error = Node::start(config).await.unwrap_err();
    assert!(
        format!("{error:#}").contains("not a node certificate for node id `fg-z.internal`"),
        "{error:#}"
    );
}

/// Development certificates: node certificates per node id from the shared peer CA, and a
/// client certificate from a separate client CA that the peer CA does not sign.
#[tokio::test]
async fn development_certificates_separate_clients_from_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let certs = floodgate_node::ensure_dev_certs(dir.path()).unwrap();
    let (a_cert, _) = certs.node_cert_for("node-0").unwrap();
    let (b_cert, _) = certs.node_cert_for("node-1").unwrap();
    assert_ne!(
        std::fs::read(&a_cert).unwrap(),
        std::fs::read(&b_cert).unwrap()
    );
    assert_eq!(certs.node_cert_for("node-0").unwrap().0, a_cert, "reused");
    assert_ne!(
        std::fs::read(&certs.ca).unwrap(),
        std::fs::read(&certs.client_ca).unwrap()
    );
    // A second start on the same directory finds the same set.
    let again = floodgate_node::ensure_dev_certs(dir.path()).unwrap();
    assert_eq!(
        std::fs::read(&again.client_cert).unwrap(),
        std::fs::read(&certs.client_cert).unwrap()
    );
    // A node serving node-0's certificate is reached by that name.
    let node = start_node(|c| {
        c.tls.cert = a_cert.clone();
        c.tls.key = a_cert.with_extension("key");
        c.tls.peer_ca = Some(certs.ca.clone());
        c.cluster.node_id = Some("node-0".into());
    })
    .await;
    let client = quic_client_config(&certs.ca, None);
    let connection = connect_as(node.node.local_addr(), client, "node-0").await;
    let answers = exchange(&connection, &check_frame(1, &[b"k"], &per_hour(3))).await;
    assert_eq!(answers.allowed(), 1);
    node.node.shutdown().await;
}

/// A client's takeover flag is honoured only by the slot's successor in the receiver's own
/// table: any other node forwards the check to the owner, and never decides it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_sent_to_a_node_that_is_not_the_successor_is_decided_by_the_owner() {
    let first = start_node(fast).await;
    let seed = first.node.local_addr();
    let mut others = Vec::new();
    for _ in 0..2 {
        let mut config = NodeConfig::for_tests(&first.certs);
        fast(&mut config);
        config.cluster.seeds = vec![seed.into()];
        others.push(Node::start(config).await.unwrap());
    }
    let nodes: Vec<&Node> = others.iter().chain([&first.node]).collect();
    for node in &nodes {
        converge(node, 3).await;
    }
    let table = nodes[0].slot_table();
    // A key whose owner and successor are both other than the node we send it to.
    let receiver = nodes[0];
    let me = receiver.node_id().to_owned();
    let key = (0..100_000)
        .map(|i| format!("takeover{i}").into_bytes())
        .find(|k| {
            let slot = slot_of(k);
            table.owner(slot) != Some(me.as_str()) && table.successor(slot) != Some(me.as_str())
        })
        .unwrap();
    let owner_id = table.owner(slot_of(&key)).unwrap().to_owned();
    let owner = nodes.iter().find(|n| n.node_id() == owner_id).unwrap();
    let limit = per_hour(5);
    let mut check = WireCheck::new(key.clone(), &limit, 1);
    check.takeover = true;
    let mut frame = Vec::new();
    encode_message(
        &mut frame,
        FrameKind::CheckBatch,
        1,
        &CheckBatch {
            groups: vec![vec![check]],
        },
    );
    let connection = connect(receiver.local_addr(), client_config(&first.certs, false)).await;
    let answers = exchange(&connection, &frame).await;
    assert_eq!(answers.allowed(), 1, "{answers:?}");
    assert_eq!(receiver.live_buckets(), 0, "the receiver decided nothing");
    assert_eq!(owner.live_buckets(), 1, "the owner decided it");
    for node in others {
        node.shutdown().await;
    }
    first.node.shutdown().await;
}

/// A takeover reaching the slot's successor while the owner is alive (a client's breaker
/// opened on a slow moment, or a fault between that client and the owner) goes to the owner:
/// the owner stays the one decider. Replication is held off, so a successor deciding from its
/// replicas would find nothing used and allow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_for_an_owner_the_successor_hears_from_is_decided_by_the_owner() {
    let no_replication = |config: &mut NodeConfig| {
        fast(config);
        config.cluster.sync_interval = Duration::from_secs(3_600);
    };
    let first = start_node(no_replication).await;
    let mut config = NodeConfig::for_tests(&first.certs);
    no_replication(&mut config);
    config.cluster.seeds = vec![first.node.local_addr().into()];
    let second = Node::start(config).await.unwrap();
    let nodes = [&first.node, &second];
    for node in nodes {
        converge(node, 2).await;
    }
    let table = first.node.slot_table();
    let key = b"takeover-live-owner".to_vec();
    let slot = slot_of(&key);
    let owner = nodes
        .into_iter()
        .find(|n| table.owner(slot) == Some(n.node_id()))
        .unwrap();
    let successor = nodes
        .into_iter()
        .find(|n| table.successor(slot) == Some(n.node_id()))
        .unwrap();
    let limit = per_hour(3);
    let batch = |takeover: bool| {
        let mut check = WireCheck::new(key.clone(), &limit, 1);
        check.takeover = takeover;
        let mut frame = Vec::new();
        encode_message(
            &mut frame,
            FrameKind::CheckBatch,
            1,
            &CheckBatch {
                groups: vec![vec![check]],
            },
        );
        frame
    };
    let to_owner = connect(owner.local_addr(), client_config(&first.certs, false)).await;
    for _ in 0..3 {
        assert_eq!(exchange(&to_owner, &batch(false)).await.allowed(), 1);
    }
    let to_successor = connect(successor.local_addr(), client_config(&first.certs, false)).await;
    let answers = exchange(&to_successor, &batch(true)).await;
    let decided: Vec<_> = answers.decisions.iter().flat_map(|(_, d)| d).collect();
    assert!(
        matches!(decided.as_slice(), [Ok(d)] if !d.is_allowed()),
        "the owner used all 3: the successor must not decide beside it: {answers:?}"
    );
    second.shutdown().await;
    first.node.shutdown().await;
}

/// A seed whose certificate the peer CA did not sign fails every handshake; each failure is
/// counted in `floodgate_peer_handshake_failures_total` (and logged at ERROR).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_with_a_foreign_certificate_is_counted_as_a_handshake_failure() {
    let dir = tempfile::tempdir().unwrap();
    let foreign = TestCa::new(dir.path(), "foreign-ca");
    let impostor = foreign.node("impostor", &["127.0.0.1", "localhost"]);
    let server = quic_server_config(
        &impostor.cert,
        &impostor.key,
        floodgate::protocol::SUPPORTED,
    );
    let seed = quinn::Endpoint::server(server, "127.0.0.1:0".parse().unwrap()).unwrap();

    let node = start_node(|c| {
        fast(c);
        c.admin = Some("127.0.0.1:0".parse().unwrap());
        c.cluster.seeds = vec![seed.local_addr().unwrap().into()];
    })
    .await;
    // The node dials its seed every gossip round; the third failed attempt comes after the
    // first was counted.
    for _ in 0..3 {
        let incoming = tokio::time::timeout(PATIENCE, seed.accept())
            .await
            .expect("the node dials its seed")
            .unwrap();
        assert!(
            incoming.await.is_err(),
            "the node refuses the foreign certificate"
        );
    }
    let metrics = http_get(node.node.admin_addr().unwrap(), "/metrics").await;
    let failures: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("floodgate_peer_handshake_failures_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    assert!(failures >= 1.0, "{metrics}");
    node.node.shutdown().await;
}

async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response
}

/// Certificates rotated on disk and reloaded (what SIGHUP does): new connections get the new
/// certificate and peer CA, open connections keep going, and a broken file changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloaded_certificates_serve_new_connections() {
    let dir = tempfile::tempdir().unwrap();
    let old_ca = TestCa::new(dir.path(), "old-ca");
    let new_ca = TestCa::new(dir.path(), "new-ca");
    let names = ["fg-a.internal", "127.0.0.1"];
    let (cert, key, peer_ca) = (
        dir.path().join("node.pem"),
        dir.path().join("node.key"),
        dir.path().join("peer-ca.pem"),
    );
    let install = |identity: &pki::Identity, ca: &TestCa| {
        std::fs::copy(&identity.cert, &cert).unwrap();
        std::fs::copy(&identity.key, &key).unwrap();
        std::fs::copy(&ca.cert, &peer_ca).unwrap();
    };
    install(&old_ca.node("old", &names), &old_ca);
    let node = start_node(|c| {
        c.tls = TlsConfig {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: None,
            peer_ca: Some(peer_ca.clone()),
        };
        c.cluster.node_id = Some("fg-a.internal".into());
    })
    .await;
    let addr = node.node.local_addr();
    let trusting_old = quic_client_config(&old_ca.cert, None);
    let open = connect_as(addr, trusting_old.clone(), "fg-a.internal").await;

    let new_identity = new_ca.node("new", &names);
    install(&new_identity, &new_ca);
    node.node.reload_tls().unwrap();
    let fresh = connect_as(
        addr,
        quic_client_config(&new_ca.cert, None),
        "fg-a.internal",
    )
    .await;
    let limit = per_hour(5);
    assert_eq!(
        exchange(&fresh, &check_frame(1, &[b"k"], &limit))
            .await
            .allowed(),
        1
    );
    assert_eq!(
        exchange(&open, &check_frame(2, &[b"k"], &limit))
            .await
            .allowed(),
        1
    );
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(trusting_old);
    let refused = endpoint.connect(addr, "fg-a.internal").unwrap().await;
    assert!(refused.is_err(), "the old CA no longer verifies the node");
    // The new peer CA decides who is a peer.
    let as_peer = quic_client_config(&new_ca.cert, Some((&new_identity.cert, &new_identity.key)));
    let peer = connect_as(addr, as_peer, "fg-a.internal").await;
    let mut received = node.node.watch_received_buckets();
    send_replica(&peer, b"after-reload").await;
    let taken = tokio::time::timeout(PATIENCE, received.wait_for(|n| *n >= 1)).await;
    assert!(
        taken.is_ok(),
        "a node certificate of the new peer CA is a peer"
    );

    // A broken key: the reload fails and the certificates in use stay.
    std::fs::write(&key, "not a key").unwrap();
    assert!(node.node.reload_tls().is_err());
    let still = connect_as(
        addr,
        quic_client_config(&new_ca.cert, None),
        "fg-a.internal",
    )
    .await;
    assert_eq!(
        exchange(&still, &check_frame(3, &[b"k"], &limit))
            .await
            .allowed(),
        1
    );
    node.node.shutdown().await;
}
