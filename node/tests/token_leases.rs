//! Kind 18 against real nodes: grants from concurrent gateways add up to the bucket and never
//! more, returned tokens are granted again, an empty bucket answers when its next token is due,
//! bad requests are refused in words without touching the bucket, and in a cluster a node grants
//! only the keys it decides.

mod common;

use common::*;
use floodgate::Limit;
use floodgate::token_lease::Grant;
use floodgate::wire::{
    ErrorCode, FrameKind, TokenLeaseBatch, TokenLeaseRequest, decode_error_frame,
    decode_token_lease_answers, encode_message,
};
use floodgate_node::exchange::request;

fn lease_frame(requests: Vec<TokenLeaseRequest>) -> Vec<u8> {
    let mut out = Vec::new();
    encode_message(
        &mut out,
        FrameKind::TokenLeaseBatch,
        7,
        &TokenLeaseBatch { requests },
    );
    out
}

async fn ask(connection: &quinn::Connection, requests: Vec<TokenLeaseRequest>) -> Vec<Grant> {
    let frame = request(
        connection,
        &lease_frame(requests),
        1 << 20,
        FrameKind::TokenLeaseAnswers,
    )
    .await
    .unwrap();
    assert_eq!(frame.request_id, 7);
    let (answers, _) = decode_token_lease_answers(&frame.payload).unwrap();
    answers.iter().map(|a| a.to_grant().unwrap()).collect()
}

#[tokio::test]
async fn concurrent_leases_never_grant_more_than_the_bucket_holds() {
    let node = start_node(|_| {}).await;
    let limit = per_hour(100);
    let mut gateways = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let connection = connect(node.node.local_addr(), client_config(&node.certs, false)).await;
        gateways.spawn(async move {
            let mut granted = 0;
            for _ in 0..10 {
                let grants = ask(
                    &connection,
                    vec![TokenLeaseRequest::new("hot", &limit, 7, 0)],
                )
                .await;
                granted += grants[0].granted;
            }
            (granted, connection)
        });
    }
    let mut total = 0;
    let mut holders = Vec::new();
    while let Some(done) = gateways.join_next().await {
        let (granted, connection) = done.unwrap();
        total += granted;
        holders.push((granted, connection));
    }
    // 4 gateways asked for 280 tokens; the bucket held 100.
    assert_eq!(total, 100);
    let stranger = connect(node.node.local_addr(), client_config(&node.certs, false)).await;
    let empty = ask(&stranger, vec![TokenLeaseRequest::new("hot", &limit, 5, 0)]).await;
    assert_eq!(empty[0].granted, 0);
    // The node's clock moved since the first grant: the next token is at most one interval away.
    let wait = empty[0].retry_after_ns;
    assert!(wait > 0 && wait <= limit.interval_ns(), "{wait}");
    // A connection that was granted nothing gives nothing back, whatever it says it returns.
    let forged = ask(
        &stranger,
        vec![TokenLeaseRequest::new("hot", &limit, 0, 50)],
    )
    .await;
    assert_eq!(forged[0].remaining, 0);
    // What a gateway did not use comes back, and can be granted again (here: to a check).
    let (granted, holder) = holders.iter().max_by_key(|(g, _)| *g).unwrap();
    assert!(*granted >= 25, "one of four took a quarter at least");
    let returned = ask(holder, vec![TokenLeaseRequest::new("hot", &limit, 0, 3)]).await;
    assert_eq!(returned[0].remaining, 3);
    let answers = exchange(&stranger, &check_frame(9, &[b"hot".as_slice(); 4], &limit)).await;
    assert_eq!(answers.allowed(), 3);
    node.node.shutdown().await;
}

#[tokio::test]
async fn bad_lease_requests_are_refused_whole_and_consume_nothing() {
    let node = start_node(|_| {}).await;
    let connection = connect(node.node.local_addr(), client_config(&node.certs, false)).await;
    let limit = per_hour(10);
    let over_return = lease_frame(vec![
        TokenLeaseRequest::new("k", &limit, 5, 0),
        TokenLeaseRequest::new("k", &limit, 0, 11),
    ]);
    let mut bad_limit = TokenLeaseRequest::new("k", &limit, 5, 0);
    bad_limit.check.period_ns = 0;
    let mut garbage = Vec::new();
    floodgate::wire::encode_frame(&mut garbage, FrameKind::TokenLeaseBatch, 7, &[0xa5; 64]);
    for (frame, code, words) in [
        (
            garbage,
            ErrorCode::MalformedPayload,
            "not a valid token lease batch",
        ),
        (
            over_return,
            ErrorCode::MalformedPayload,
            "returns 11 tokens",
        ),
        (
            lease_frame(vec![bad_limit]),
            ErrorCode::InvalidLimit,
            "period",
        ),
    ] {
        let answer = request(&connection, &frame, 1 << 20, FrameKind::Error)
            .await
            .unwrap();
        let error = decode_error_frame(&answer.payload).unwrap();
        assert_eq!(error.code, code as u16, "{}", error.message);
        assert!(error.message.contains(words), "{}", error.message);
    }
    // Nothing was granted by the refused frames: the whole burst is there.
    let grants = ask(
        &connection,
        vec![TokenLeaseRequest::new("k", &limit, 10, 0)],
    )
    .await;
    assert_eq!(grants[0].granted, 10);
    let other_limit = Limit::gcra(1, 1_000_000_000, 1).unwrap();
    let grants = ask(
        &connection,
        vec![TokenLeaseRequest::new("j", &other_limit, 5, 0)],
    )
    .await;
    assert_eq!(grants[0].granted, 1, "clamped to the burst");
    node.node.shutdown().await;
}

/// In a cluster a node grants only the keys it decides: a request for another node's key is
/// answered `not_owner` and takes nothing, while its own key in the same frame is granted.
#[tokio::test]
async fn a_node_grants_only_keys_it_decides() {
    let first = start_node(|_| {}).await;
    let mut config = floodgate_node::NodeConfig::for_tests(&first.certs);
    config.cluster.seeds = vec![first.node.local_addr().into()];
    certify_node_id(&mut config, &first.certs);
    let second = floodgate_node::Node::start(config).await.unwrap();
    converge(&first.node, 2).await;
    converge(&second, 2).await;
    let table = first.node.slot_table();
    let owned_by = |id: &str| {
        (0..10_000)
            .map(|i| format!("lease:{i}"))
            .find(|k| table.owner(floodgate::cluster::slot_of(k.as_bytes())) == Some(id))
            .unwrap()
    };
    let (mine, theirs) = (owned_by(first.node.node_id()), owned_by(second.node_id()));
    let limit = per_hour(10);
    let connection = connect(first.node.local_addr(), client_config(&first.certs, false)).await;
    let frame = request(
        &connection,
        &lease_frame(vec![
            TokenLeaseRequest::new(theirs.as_str(), &limit, 4, 0),
            TokenLeaseRequest::new(mine.as_str(), &limit, 4, 0),
        ]),
        1 << 20,
        FrameKind::TokenLeaseAnswers,
    )
    .await
    .unwrap();
    let (answers, version) = decode_token_lease_answers(&frame.payload).unwrap();
    assert_eq!(version, table.version());
    assert_eq!(answers[0].to_grant(), Err(ErrorCode::NotOwner));
    assert_eq!(answers[1].to_grant().unwrap().granted, 4);
    // The other node's bucket is untouched: all 10 are there for its own grant.
    let other = connect(second.local_addr(), client_config(&first.certs, false)).await;
    let grants = ask(
        &other,
        vec![TokenLeaseRequest::new(theirs.as_str(), &limit, 10, 0)],
    )
    .await;
    assert_eq!(grants[0].granted, 10);
    second.shutdown().await;
    first.node.shutdown().await;
}
