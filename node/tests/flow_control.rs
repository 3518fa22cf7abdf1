//! A caller that stops reading its answers costs the node at most its QUIC windows and the
//! write timeout: the node's writes block on the caller's flow control, then the stream is
//! reset with `overloaded` and counted, and other callers are answered all along.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{check_frame, connect, exchange, metric_value, metrics_page, per_hour, start_node};
use floodgate::wire::ErrorCode;

#[tokio::test]
async fn a_caller_that_takes_no_answers_has_its_stream_reset_after_the_write_timeout() {
    let node = start_node(|config| {
        config.admin = Some("127.0.0.1:0".parse().unwrap());
        config.limits.write_timeout = Duration::from_millis(300);
    })
    .await;
    // A caller whose receive windows are tiny and which never reads: the node's answers fill
    // them at once.
    let mut config = common::client_config(&node.certs, false);
    let mut transport = quinn::TransportConfig::default();
    transport.stream_receive_window(quinn::VarInt::from_u32(1_024));
    transport.receive_window(quinn::VarInt::from_u32(2_048));
    config.transport_config(Arc::new(transport));
    let stalled = connect(node.node.local_addr(), config).await;
    let (mut send, mut recv) = stalled.open_bi().await.unwrap();
    let limit = per_hour(1_000_000);
    let names: Vec<Vec<u8>> = (0..64).map(|i| format!("user:{i}").into_bytes()).collect();
    let keys: Vec<&[u8]> = names.iter().map(Vec::as_slice).collect();
    let frames: Vec<Vec<u8>> = (1..=20)
        .map(|request| check_frame(request, &keys, &limit))
        .collect();
    // Every frame fits the node's windows; the node answers them until the caller's window is
    // full, then its write waits, times out, and the node stops reading too.
    for frame in &frames {
        send.write_all(frame).await.unwrap();
    }
    let stopped = tokio::time::timeout(Duration::from_secs(20), send.stopped()).await;
    let code = quinn::VarInt::from_u32(u32::from(ErrorCode::Overloaded as u16));
    assert!(
        matches!(&stopped, Ok(Ok(Some(stop))) if *stop == code),
        "{stopped:?}"
    );
    let page = metrics_page(&node.node).await;
    assert!(
        metric_value(&page, "floodgate_write_timeouts_total") >= 1.0,
        "{page}"
    );

    // Another caller is answered meanwhile.
    let other = connect(
        node.node.local_addr(),
        common::client_config(&node.certs, false),
    )
    .await;
    let answers = exchange(&other, &check_frame(1, &[b"user:other"], &per_hour(10))).await;
    assert_eq!(answers.allowed(), 1);

    // The stalled caller finds its stream reset with `overloaded`.
    let read = tokio::time::timeout(Duration::from_secs(10), recv.read_to_end(1 << 20)).await;
    assert!(
        matches!(&read, Ok(Err(quinn::ReadToEndError::Read(quinn::ReadError::Reset(reset))))
            if *reset == code),
        "{read:?}"
    );
    node.node.shutdown().await;
}
