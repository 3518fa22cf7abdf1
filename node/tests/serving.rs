//! The node decides batched checks exactly over real QUIC, groups all-or-nothing, with mutual TLS
//! when asked, and serves its admin endpoints.

mod common;

use common::*;
use floodgate::wire::{CheckBatch, FrameKind, WireCheck, encode_message};

#[tokio::test]
async fn concurrent_streams_on_one_key_admit_exactly_the_limit() {
    let node = start_node(|_| {}).await;
    let connection = connect(node.node.local_addr(), client_config(&node.certs, false)).await;
    let limit = per_hour(100);
    let mut tasks = tokio::task::JoinSet::new();
    for stream in 0..8u64 {
        let connection = connection.clone();
        tasks.spawn(async move {
            // 25 frames of 5 checks each per stream: 1,000 checks over 8 streams.
            let mut bytes = Vec::new();
            for frame in 0..25 {
                bytes.extend(check_frame(
                    stream * 100 + frame,
                    &[b"hot".as_slice(); 5],
                    &limit,
                ));
            }
            let answers = exchange(&connection, &bytes).await;
            assert!(answers.errors.is_empty());
            answers.allowed()
        });
    }
    let mut allowed = 0;
    while let Some(count) = tasks.join_next().await {
        allowed += count.unwrap();
    }
    assert_eq!(allowed, 100);
    node.node.shutdown().await;
}

#[tokio::test]
async fn a_denied_group_consumes_nothing_and_answers_come_in_order() {
    let node = start_node(|_| {}).await;
    let connection = connect(node.node.local_addr(), client_config(&node.certs, false)).await;
    let (wide, narrow) = (per_hour(10), per_hour(1));
    let group = vec![
        WireCheck::new(b"wide".to_vec(), &wide, 1),
        WireCheck::new(b"narrow".to_vec(), &narrow, 1),
    ];
    let mut bytes = Vec::new();
    encode_message(
        &mut bytes,
        FrameKind::CheckBatch,
        1,
        &CheckBatch {
            groups: vec![group.clone(), group],
        },
    );
    bytes.extend(check_frame(2, &[b"wide"], &wide));
    let answers = exchange(&connection, &bytes).await;
    let first = &answers.decisions[0];
    assert_eq!(first.0, 1);
    assert!(first.1[0].unwrap().is_allowed() && first.1[1].unwrap().is_allowed());
    assert!(!first.1[3].unwrap().is_allowed(), "narrow is spent");
    assert_eq!(
        first.1[2].unwrap().remaining(),
        9,
        "the denied group left wide untouched"
    );
    let second = &answers.decisions[1];
    assert_eq!((second.0, second.1[0].unwrap().remaining()), (2, 8));
    node.node.shutdown().await;
}

#[tokio::test]
async fn mutual_tls_refuses_a_client_without_a_certificate() {
    let node =
        start_node(|c| c.tls.client_ca = Some(c.tls.cert.with_file_name("client-ca.pem"))).await;
    let addr = node.node.local_addr();
    // With the development client certificate: served.
    let trusted = connect(addr, client_config(&node.certs, true)).await;
    let answers = exchange(&trusted, &check_frame(1, &[b"k"], &per_hour(5))).await;
    assert!(answers.decisions[0].1[0].unwrap().is_allowed());
    // Without one: TLS 1.3 lets the client finish its handshake, then the node closes the
    // connection with the certificate_required alert (0x100 + 116) before any stream is served.
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(client_config(&node.certs, false));
    let refused = match endpoint.connect(addr, "localhost").unwrap().await {
        Err(e) => e,
        Ok(connection) => {
            let frame = check_frame(1, &[b"k"], &per_hour(5));
            floodgate_node::exchange::round_trip(&connection, &frame, 1 << 20)
                .await
                .unwrap_err();
            connection.closed().await
        }
    };
    match refused {
        quinn::ConnectionError::ConnectionClosed(close) => {
            assert_eq!(close.error_code, quinn::TransportErrorCode::crypto(116));
        }
        other => panic!("expected a certificate_required close, got {other:?}"),
    }
    node.node.shutdown().await;
}

#[tokio::test]
async fn admin_serves_metrics_health_and_readiness() {
    let node = start_node(|c| c.admin = Some("127.0.0.1:0".parse().unwrap())).await;
    let connection = connect(node.node.local_addr(), client_config(&node.certs, false)).await;
    exchange(&connection, &check_frame(1, &[b"a", b"b"], &per_hour(5))).await;
    let admin = node.node.admin_addr().unwrap();
    let (status, body) = http_get(admin, "/healthz").await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    let (status, _) = http_get(admin, "/readyz").await;
    assert_eq!(status, 200);
    let (status, body) = http_get(admin, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        body.contains("floodgate_decisions_total{algorithm=\"gcra\",outcome=\"allowed\"}"),
        "{body}"
    );
    assert!(body.contains("floodgate_batch_checks"), "{body}");
    node.node.shutdown().await;
}

/// The admin port holds at most `MAX_ADMIN_CONNECTIONS` connections: callers that never finish
/// a request cannot pin more of the node's memory and descriptors. With every place taken by a
/// caller that sent half a request, a scrape waits (in the kernel's backlog), and is answered
/// once one of them goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_port_holds_a_bounded_number_of_connections() {
    use tokio::io::AsyncWriteExt;
    let node = start_node(|c| c.admin = Some("127.0.0.1:0".parse().unwrap())).await;
    let admin = node.node.admin_addr().unwrap();
    let mut stalled = Vec::new();
    for _ in 0..floodgate_node::MAX_ADMIN_CONNECTIONS {
        let mut stream = tokio::net::TcpStream::connect(admin).await.unwrap();
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\n")
            .await
            .unwrap();
        stalled.push(stream);
    }
    // Connected after them, the scrape is accepted after them (the backlog is in order).
    let mut scrape = tokio::spawn(http_get(admin, "/healthz"));
    // Not answered while every place is held (a window, not a speed: answered at once without
    // the bound, never with it).
    let waited = tokio::time::timeout(std::time::Duration::from_millis(300), &mut scrape).await;
    assert!(
        waited.is_err(),
        "answered with every place held: {waited:?}"
    );
    drop(stalled.pop());
    let (status, body) = tokio::time::timeout(std::time::Duration::from_secs(10), scrape)
        .await
        .expect("answered once a place was free")
        .unwrap();
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    drop(stalled);
    node.node.shutdown().await;
}

/// A minimal HTTP/1.1 GET over TCP (the admin port is plain HTTP on loopback).
async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let status = response[9..12].parse().unwrap();
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

#[tokio::test]
async fn refunds_give_back_and_cannot_mix_with_checks() {
    let node = start_node(|_| {}).await;
    let connection = connect(node.node.local_addr(), client_config(&node.certs, false)).await;
    let limit = per_hour(5);
    let take = vec![WireCheck::new(b"r".to_vec(), &limit, 3)];
    let give = vec![WireCheck::refund(b"r".to_vec(), &limit, 2)];
    let mut bytes = Vec::new();
    // A refund is covered by what was granted before its frame: the grant comes first.
    for (id, groups) in [
        (1, vec![take.clone()]),
        (2, vec![give.clone()]),
        (3, vec![[take, give].concat()]),
    ] {
        encode_message(
            &mut bytes,
            FrameKind::CheckBatch,
            id,
            &CheckBatch { groups },
        );
    }
    let answers = exchange(&connection, &bytes).await;
    assert_eq!(answers.decisions[0].1[0].unwrap().remaining(), 2);
    assert_eq!(
        answers.decisions[1].1[0].unwrap().remaining(),
        4,
        "the refund gave 2 back"
    );
    assert_eq!(answers.errors[0].0, 3);
    assert_eq!(
        answers.errors[0].1,
        floodgate::wire::ErrorCode::MalformedPayload
    );
    node.node.shutdown().await;
}
