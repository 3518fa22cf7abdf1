//! The client against a real node over QUIC: exactness, failure modes, reconnect, mutual TLS.
//!
//! A `floodgate_node::Node` on 127.0.0.1 (the client and the failure model).
//!
//! Time is real here: quinn drives real UDP sockets, and tokio's paused time would fire its
//! handshake and loss timers before packets arrive. So nothing waits a fixed time: each wait is
//! for an event (`wait_connected`, `wait_disconnected`), bounded by `PATIENCE` so a bug fails the
//! test instead of hanging it.

mod common;

use std::time::Duration;

use common::*;
use floodgate_client::{
    Check, Client, DegradedReason, FailureMode, HostPort, LinkState, Source, all_allowed,
};
use tokio::time::timeout;

/// Failure model, one region without faults: concurrent consumption from many connections
/// admits exactly the limit — here many tasks sharing one client, so their calls
/// are coalesced into shared frames and groups.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_tasks_admit_exactly_the_limit() {
    let certs = certs();
    let node = start_node(&certs, any_port(), false).await;
    let client = Client::connect(&[node.local_addr()], client_config(&certs))
        .await
        .unwrap();
    let limit = per_hour(100);
    let tasks: Vec<_> = (0..32)
        .map(|t| {
            let client = client.clone();
            tokio::spawn(async move {
                // 1,000 checks over 32 tasks: 8 tasks send 32, the rest 31.
                let n = if t < 8 { 32 } else { 31 };
                let mut allowed = 0;
                for _ in 0..n {
                    // Closed: a timeout could never admit, so the count is the node's alone.
                    let check = Check::new("tenant:42", limit).failure_mode(FailureMode::Closed);
                    let verdicts = client.check(&[check]).await.unwrap();
                    assert_eq!(verdicts[0].source, Source::Node);
                    allowed += usize::from(verdicts[0].is_allowed());
                }
                (n, allowed)
            })
        })
        .collect();
    let (mut sent, mut allowed) = (0, 0);
    for task in tasks {
        let (n, a) = task.await.unwrap();
        sent += n;
        allowed += a;
    }
    assert_eq!(sent, 1_000);
    assert_eq!(allowed, 100);
    client.close().await;
    node.shutdown().await;
}

/// A multi-check group decides all-or-nothing on the node: a denied group consumes nothing.
#[tokio::test]
async fn a_denied_group_consumes_nothing_on_the_node() {
    let certs = certs();
    let node = start_node(&certs, any_port(), false).await;
    let client = Client::connect(&[node.local_addr()], client_config(&certs))
        .await
        .unwrap();
    let (wide, narrow) = (per_hour(10), per_hour(1));
    let group = [
        Check::new("api:key1", wide),
        Check::new("login:key1", narrow),
    ];
    assert!(all_allowed(&client.check(&group).await.unwrap()));
    let denied = client.check(&group).await.unwrap();
    assert!(!all_allowed(&denied));
    assert!(denied.iter().all(|v| v.source == Source::Node));
    // "api:key1" gave 1 of 10 to the first group only.
    let alone = client.check(&[Check::new("api:key1", wide)]).await.unwrap();
    assert_eq!(alone[0].decision.remaining(), 8);
    // The link reports its connection's transport figures: three round trips went out.
    let transport = client.nodes()[0]
        .transport
        .expect("a connected link has figures");
    assert!(transport.sent_packets >= 3, "{transport:?}");
    assert!(
        transport.rtt > Duration::ZERO && transport.mtu >= 1200,
        "{transport:?}"
    );
    client.close().await;
    node.shutdown().await;
}

/// Failure model, whole tier unreachable: every rule honours its failure mode. With
/// the node stopped, `Open` checks are decided by the local fallback and `Closed` ones denied;
/// once a node is back on the same address the client reconnects by itself.
#[tokio::test]
async fn node_down_follows_failure_modes_and_the_client_reconnects_when_it_returns() {
    let certs = certs();
    let node = start_node(&certs, any_port(), false).await;
    let addr = node.local_addr();
    let client = Client::connect(&[addr], client_config(&certs))
        .await
        .unwrap();
    let open = [Check::new("search:user:7", per_hour(2))];
    let closed = [Check::new("login:ip:1", per_hour(5)).failure_mode(FailureMode::Closed)];
    assert_eq!(client.check(&open).await.unwrap()[0].source, Source::Node);

    node.shutdown().await;
    timeout(PATIENCE, client.wait_disconnected()).await.unwrap();
    let status = &client.nodes()[0];
    assert_eq!(status.state, LinkState::Disconnected);
    // "closed by the node: shutting_down", or already a refused reconnect attempt.
    assert!(status.last_error.is_some(), "{status:?}");

    // Open: the fallback has its own bucket with the same limit (2 per hour). The node's one
    // consumption is not known to it: degraded, not exact.
    let mut verdicts = Vec::new();
    for _ in 0..3 {
        verdicts.push(client.check(&open).await.unwrap()[0]);
    }
    let unreachable = Source::Fallback(DegradedReason::Unreachable);
    assert!(
        verdicts.iter().all(|v| v.source == unreachable),
        "{verdicts:?}"
    );
    let admitted: Vec<bool> = verdicts.iter().map(|v| v.is_allowed()).collect();
    assert_eq!(admitted, [true, true, false]);

    let v = client.check(&closed).await.unwrap()[0];
    assert_eq!(v.source, Source::FailClosed(DegradedReason::Unreachable));
    assert!(!v.is_allowed());

    let node = restart_node(&certs, addr).await;
    timeout(PATIENCE, client.wait_connected()).await.unwrap();
    let v = client.check(&closed).await.unwrap()[0];
    assert_eq!(v.source, Source::Node);
    assert!(v.is_allowed());
    // The restarted node starts empty: its bucket for the open key is full again.
    let v = client.check(&open).await.unwrap()[0];
    assert_eq!((v.source, v.decision.remaining()), (Source::Node, 1));
    client.close().await;
    node.shutdown().await;
}

/// A seed given by host name, `localhost:PORT`: dialed at what the name resolves to (IPv4
/// first: the node listens on 127.0.0.1 only) and verified by that name (the development
/// certificate carries `localhost`); after the node restarts, the name is resolved again and
/// the link comes back. A name that does not resolve is not a connect error: the link keeps
/// trying and its status says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_given_by_host_name_connects_and_reconnects_through_the_name() {
    let certs = certs();
    let node = start_node(&certs, any_port(), false).await;
    let addr = node.local_addr();
    let by_name: HostPort = format!("localhost:{}", addr.port()).parse().unwrap();
    let client = Client::connect(&[by_name], client_config(&certs))
        .await
        .unwrap();
    let check = [Check::new("named:1", per_hour(5)).failure_mode(FailureMode::Closed)];
    let v = client.check(&check).await.unwrap()[0];
    assert_eq!((v.source, v.decision.remaining()), (Source::Node, 4));

    node.shutdown().await;
    timeout(PATIENCE, client.wait_disconnected()).await.unwrap();
    let node = restart_node(&certs, addr).await;
    timeout(PATIENCE, client.wait_connected()).await.unwrap();
    let v = client.check(&check).await.unwrap()[0];
    assert_eq!((v.source, v.decision.remaining()), (Source::Node, 4));
    client.close().await;
    node.shutdown().await;

    // `.invalid` never resolves (RFC 2606).
    let nowhere: HostPort = "fg-nowhere.invalid:7100".parse().unwrap();
    let client = Client::connect(&[nowhere], client_config(&certs))
        .await
        .unwrap();
    timeout(PATIENCE, client.wait_disconnected()).await.unwrap();
    let status = &client.nodes()[0];
    let why = status.last_error.clone().unwrap_or_default();
    assert!(why.contains("fg-nowhere.invalid"), "{status:?}");
    let v = client.check(&check).await.unwrap()[0];
    assert_eq!(v.source, Source::FailClosed(DegradedReason::Unreachable));
    client.close().await;
}

/// `connect` fails only for bad configuration: a node that never answers the handshake is
/// retried in the background while calls fail over at once, with the cause in its status.
#[tokio::test]
async fn an_unreachable_node_is_not_a_connect_error() {
    let certs = certs();
    // A bound UDP socket nobody reads: handshakes go unanswered.
    let silent = std::net::UdpSocket::bind(any_port()).unwrap();
    let mut config = client_config(&certs);
    config.connect_timeout = Duration::from_millis(200);
    let client = Client::connect(&[silent.local_addr().unwrap()], config)
        .await
        .unwrap();
    assert_eq!(client.nodes()[0].state, LinkState::Disconnected);
    assert_eq!(client.nodes()[0].transport, None, "never connected");
    assert!(
        client.nodes()[0]
            .last_error
            .as_deref()
            .unwrap()
            .contains("no handshake within"),
        "{:?}",
        client.nodes()
    );
    let v = client
        .check(&[Check::new("k", per_hour(1)).failure_mode(FailureMode::Closed)])
        .await
        .unwrap()[0];
    assert_eq!(v.source, Source::FailClosed(DegradedReason::Unreachable));
    client.close().await;
}

/// Mutual TLS: a node configured with a client CA refuses a client without a certificate (TLS
/// alert 116, certificate_required, RFC 8446 §6.2); with the dev client certificate it serves.
#[tokio::test]
async fn mutual_tls_refuses_a_client_without_a_certificate() {
    let certs = certs();
    let node = start_node(&certs, any_port(), true).await;

    let mut config = client_config(&certs);
    config.timeout = Duration::from_secs(2);
    let anonymous = Client::connect(&[node.local_addr()], config).await.unwrap();
    // With TLS 1.3 the client finishes its handshake before the node has checked it, so the
    // refusal arrives just after: the first call fails over (never admitted), and the link
    // reports why.
    let v = anonymous
        .check(&[Check::new("k", per_hour(10)).failure_mode(FailureMode::Closed)])
        .await
        .unwrap()[0];
    assert!(
        matches!(v.source, Source::FailClosed(_)),
        "a refused client got {v:?}"
    );
    timeout(PATIENCE, anonymous.wait_disconnected())
        .await
        .unwrap();
    let why = anonymous.nodes()[0].last_error.clone().unwrap();
    assert!(why.contains("error 116"), "{why}");
    assert!(why.contains("requires a client certificate"), "{why}");
    anonymous.close().await;

    let config = with_client_cert(client_config(&certs), &certs);
    let trusted = Client::connect(&[node.local_addr()], config).await.unwrap();
    let v = trusted
        .check(&[Check::new("k", per_hour(10))])
        .await
        .unwrap()[0];
    assert_eq!(v.source, Source::Node);
    assert!(v.is_allowed());
    trusted.close().await;
    node.shutdown().await;
}

/// A node stricter than the client's own checks refuses a shared frame as a bad request; only
/// the call at fault gets the error (kind `BadRequest`), the calls it shared the frame with are
/// resent alone and decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_request_fails_only_its_own_call() {
    let certs = certs();
    let mut node_config = floodgate_node::NodeConfig::for_tests(&certs.dev);
    node_config.limits.max_key_bytes = 8;
    node_config.limits.max_batch = 2;
    let node = floodgate_node::Node::start(node_config).await.unwrap();
    let mut config = client_config(&certs);
    // One stream: concurrent calls queue behind each other and share frames.
    config.streams_per_connection = 1;
    let client = Client::connect(&[node.local_addr()], config).await.unwrap();
    let limit = per_hour(100);
    let short: Vec<_> = (0..20)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move { client.check(&[Check::new(format!("k{i}"), limit)]).await })
        })
        .collect();
    let long_key = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .check(&[Check::new("a-key-over-8-bytes", limit)])
                .await
        }
    });
    let three = tokio::spawn({
        let client = client.clone();
        async move {
            let group: Vec<_> = ["x", "y", "z"].map(|k| Check::new(k, limit)).into();
            client.check(&group).await
        }
    });
    for call in short {
        let verdicts = call.await.unwrap().unwrap();
        assert_eq!(verdicts[0].source, Source::Node);
    }
    let err = long_key.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), floodgate_client::ErrorKind::BadRequest);
    assert!(err.to_string().contains("key_too_long"), "{err}");
    let err = three.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), floodgate_client::ErrorKind::BadRequest);
    assert!(err.to_string().contains("batch_too_large"), "{err}");
    client.close().await;
    node.shutdown().await;
}

/// Bad configuration is the one thing `connect` reports, with the file at fault.
#[tokio::test]
async fn unreadable_certificates_are_connect_errors() {
    let certs = certs();
    let addr = any_port();
    let missing = floodgate_client::ClientConfig::with_ca_file(certs.dev.dir.join("nope.pem"));
    let err = Client::connect(&[addr], missing).await.unwrap_err();
    assert_eq!(err.kind(), floodgate_client::ErrorKind::Config);
    assert!(err.to_string().contains("nope.pem"), "{err}");

    let mut bad_key = client_config(&certs);
    bad_key.client_auth = Some(floodgate_client::ClientAuth {
        cert: certs.dev.client_cert.clone(),
        key: certs.dev.ca.clone(), // a certificate, not a key
    });
    let err = Client::connect(&[addr], bad_key).await.unwrap_err();
    assert!(err.to_string().contains("client key"), "{err}");

    let err = Client::connect::<std::net::SocketAddr>(&[], client_config(&certs))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no node"), "{err}");
}
