//! The client against scripted QUIC peers that misbehave: a node that never answers, one that
//! answers late. What holds: no call waits past its timeout, and a late answer never reaches
//! the wrong caller (the failure model: no check waits longer than the client timeout).

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use common::*;
use floodgate::Decision;
use floodgate::wire::{
    DecisionBatch, FrameKind, FrameReader, WireDecision, WireLimits, decode_check_batch,
    encode_message,
};
use floodgate_client::{
    BreakerConfig, Check, Client, DegradedReason, FailureMode, Source, Verdict,
};

/// How a scripted node treats each frame.
#[derive(Debug, Clone)]
enum Script {
    /// Reads every frame, answers none.
    Silent,
    /// Answers every check "allowed, remaining = the frame's request id", the first frame of
    /// each stream only once the test releases it (after its callers have timed out).
    HoldFirst(Arc<Notify>),
}

/// A QUIC endpoint with the dev node certificate that follows `script`.
fn scripted_node(certs: &Certs, script: Script) -> SocketAddr {
    let chain = floodgate_node::certs::load_certs(&certs.dev.node_cert).unwrap();
    let key = floodgate_node::certs::load_key(&certs.dev.node_key).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    tls.alpn_protocols = floodgate::protocol::SUPPORTED.alpn_ids();
    let quic = quinn::crypto::rustls::QuicServerConfig::try_from(tls).unwrap();
    let config = quinn::ServerConfig::with_crypto(Arc::new(quic));
    let endpoint = quinn::Endpoint::server(config, any_port()).unwrap();
    let addr = endpoint.local_addr().unwrap();
    tokio::spawn(async move {
        while let Some(incoming) = endpoint.accept().await {
            let script = script.clone();
            tokio::spawn(async move {
                let Ok(conn) = incoming.await else { return };
                while let Ok((send, recv)) = conn.accept_bi().await {
                    tokio::spawn(serve_stream(send, recv, script.clone()));
                }
            });
        }
    });
    addr
}

async fn serve_stream(mut send: quinn::SendStream, mut recv: quinn::RecvStream, script: Script) {
    let mut reader = FrameReader::new(1 << 20);
    let mut first = true;
    while let Ok(Some(chunk)) = recv.read_chunk(usize::MAX, true).await {
        reader.extend(&chunk.bytes);
        while let Ok(Some(frame)) = reader.next_frame() {
            let Script::HoldFirst(release) = &script else {
                continue;
            };
            // Only check batches are scripted (the client also asks for a slot table).
            if frame.kind != FrameKind::CheckBatch {
                continue;
            }
            if std::mem::take(&mut first) {
                release.notified().await;
            }
            let groups = decode_check_batch(&frame.payload, &WireLimits::default()).unwrap();
            let allowed = Decision::Allowed {
                remaining: frame.request_id,
                reset_after_ns: 0,
            };
            let answer = DecisionBatch {
                decisions: vec![WireDecision::from(allowed); groups.iter().map(Vec::len).sum()],
                table_version: 0,
            };
            let mut out = Vec::new();
            encode_message(
                &mut out,
                FrameKind::DecisionBatch,
                frame.request_id,
                &answer,
            );
            if send.write_all(&out).await.is_err() {
                return;
            }
        }
    }
}

fn closed_check() -> [Check; 1] {
    [Check::new("k", per_hour(10)).failure_mode(FailureMode::Closed)]
}

async fn one(client: &Client, checks: &[Check]) -> Verdict {
    client.check(checks).await.unwrap()[0]
}

/// A node that takes frames and never answers: each call fails over at its deadline (here a
/// real 100 ms), then the breaker opens and calls fail over without waiting at all.
#[tokio::test]
async fn a_silent_node_times_calls_out_then_opens_the_breaker() {
    let certs = certs();
    let addr = scripted_node(&certs, Script::Silent);
    let mut config = client_config(&certs);
    config.timeout = Duration::from_millis(100);
    config.breaker = BreakerConfig {
        failure_threshold: 2,
        cooldown: Duration::from_secs(60),
    };
    let client = Client::connect(&[addr], config).await.unwrap();
    let timed_out = Source::FailClosed(DegradedReason::Timeout);
    assert_eq!(one(&client, &closed_check()).await.source, timed_out);
    let open = [Check::new("k", per_hour(10))];
    assert_eq!(
        one(&client, &open).await.source,
        Source::Fallback(DegradedReason::Timeout)
    );
    let v = one(&client, &closed_check()).await;
    assert_eq!(v.source, Source::FailClosed(DegradedReason::CircuitOpen));
    // A fail-closed denial tells the caller to come back after the breaker's cooldown.
    assert_eq!(v.decision.retry_after_ns(), Some(60_000_000_000));
    client.close().await;
}

/// A frame answered after its callers timed out: the stream reads and drops that answer before
/// carrying the next frame, so the next caller gets the answer to its own frame.
#[tokio::test]
async fn a_late_answer_is_dropped_not_given_to_the_next_caller() {
    let certs = certs();
    let release = Arc::new(Notify::new());
    let addr = scripted_node(&certs, Script::HoldFirst(release.clone()));
    let mut config = client_config(&certs);
    // The first call waits this out in real time; the second must be answered within it, so it
    // is generous: the assertion is about which answer the caller gets, not how fast.
    config.timeout = Duration::from_secs(2);
    config.streams_per_connection = 1;
    let client = Client::connect(&[addr], config).await.unwrap();
    let first = one(&client, &closed_check()).await;
    assert_eq!(first.source, Source::FailClosed(DegradedReason::Timeout));
    // The answer to request 1 arrives late, now; the next call goes out on the same stream once
    // it is in.
    release.notify_one();
    let second = one(&client, &closed_check()).await;
    assert_eq!(second.source, Source::Node);
    assert_eq!(second.decision.remaining(), 2, "the answer to request 2");
    client.close().await;
}
