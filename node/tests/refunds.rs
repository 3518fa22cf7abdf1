//! Refunds from the attacker's side: a gateway connection may give back on a key at most what
//! it was granted there, so a hostile gateway cannot refill a key (its own or another caller's)
//! by sending refunds. A refund not covered is answered `forbidden` and touches no bucket.

mod common;

use common::*;
use floodgate::Decision;
use floodgate::cluster::slot_of;
use floodgate::wire::{CheckBatch, ErrorCode, FrameKind, WireCheck, encode_message};
use floodgate_node::{Node, NodeConfig};

/// One frame of one group per entry.
fn frames(groups: Vec<Vec<WireCheck>>) -> Vec<u8> {
    let mut bytes = Vec::new();
    for (id, group) in groups.into_iter().enumerate() {
        let batch = CheckBatch {
            groups: vec![group],
        };
        encode_message(&mut bytes, FrameKind::CheckBatch, id as u64, &batch);
    }
    bytes
}

/// The first decision of each frame's answer, in order.
fn firsts(answers: &Answers) -> Vec<Result<Decision, ErrorCode>> {
    answers.decisions.iter().map(|(_, d)| d[0]).collect()
}

#[tokio::test]
async fn a_gateway_refunds_at_most_what_it_was_granted_on_the_key() {
    let node = start_node(|_| {}).await;
    let connection = connect(node.node.local_addr(), client_config(&node.certs, false)).await;
    let limit = per_hour(5);
    let check = |cost| WireCheck::new(b"victim".to_vec(), &limit, cost);
    let refund = |cost| WireCheck::refund(b"victim".to_vec(), &limit, cost);
    let answers = exchange(
        &connection,
        &frames(vec![
            vec![check(5)],  // the key is used up
            vec![refund(5)], // what was granted comes back
            vec![check(5)],  // and is taken again
            vec![refund(6)], // more than was granted since: refused whole
            vec![refund(2)],
            vec![refund(3)], // 5 in all: the grant, no more
            vec![refund(1)],
            vec![check(5)],
        ]),
    )
    .await;
    let got = firsts(&answers);
    assert_eq!(got[0].unwrap().remaining(), 0);
    assert_eq!(got[1].unwrap().remaining(), 5);
    assert_eq!(got[2].unwrap().remaining(), 0);
    assert_eq!(got[3], Err(ErrorCode::Forbidden), "{got:?}");
    assert_eq!(got[4].unwrap().remaining(), 2);
    assert_eq!(got[5].unwrap().remaining(), 5);
    assert_eq!(got[6], Err(ErrorCode::Forbidden), "{got:?}");
    assert!(got[7].unwrap().is_allowed(), "the bucket holds exactly 5");
    node.node.shutdown().await;
}

#[tokio::test]
async fn a_refund_on_a_key_the_connection_was_never_granted_touches_no_bucket() {
    let node = start_node(|_| {}).await;
    let addr = node.node.local_addr();
    let victim = connect(addr, client_config(&node.certs, false)).await;
    let attacker = connect(addr, client_config(&node.certs, false)).await;
    let limit = per_hour(3);
    let check = WireCheck::new(b"shared".to_vec(), &limit, 3);
    let used = exchange(&victim, &frames(vec![vec![check.clone()]])).await;
    assert_eq!(firsts(&used)[0].unwrap().remaining(), 0);
    // Another connection's grant is no credit here, whatever the group holds.
    let refunds = vec![
        vec![WireCheck::refund(b"shared".to_vec(), &limit, 3)],
        vec![
            WireCheck::refund(b"shared".to_vec(), &limit, 1),
            WireCheck::refund(b"other".to_vec(), &limit, 1),
        ],
    ];
    let answers = exchange(&attacker, &frames(refunds)).await;
    assert!(
        answers
            .decisions
            .iter()
            .flat_map(|(_, d)| d)
            .all(|d| *d == Err(ErrorCode::Forbidden)),
        "{answers:?}"
    );
    let after = exchange(&victim, &frames(vec![vec![check]])).await;
    assert!(
        !firsts(&after)[0].unwrap().is_allowed(),
        "nothing was given back"
    );
    node.node.shutdown().await;
}

/// In a cluster the credit is kept where the gateway is connected: a check forwarded to its
/// owner and allowed there is credit on the entry node, and a refund beyond it never reaches
/// the owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_refund_is_bounded_where_the_gateway_is_connected() {
    let first = start_node(|_| {}).await;
    let mut config = NodeConfig::for_tests(&first.certs);
    config.cluster.seeds = vec![first.node.local_addr().into()];
    let second = Node::start(config).await.unwrap();
    converge(&first.node, 2).await;
    converge(&second, 2).await;
    let table = second.slot_table();
    let key = (0..100_000)
        .map(|i| format!("elsewhere{i}").into_bytes())
        .find(|k| table.owner(slot_of(k)) == Some(first.node.node_id()))
        .unwrap();
    let limit = per_hour(4);
    let connection = connect(second.local_addr(), client_config(&first.certs, false)).await;
    let check = WireCheck::new(key.clone(), &limit, 4);
    let answers = exchange(
        &connection,
        &frames(vec![
            vec![check.clone()],
            vec![WireCheck::refund(key.clone(), &limit, 5)],
            vec![WireCheck::refund(key.clone(), &limit, 1)],
            vec![check.clone()],
        ]),
    )
    .await;
    let got = firsts(&answers);
    assert_eq!(got[0].unwrap().remaining(), 0, "{got:?}");
    assert_eq!(got[1], Err(ErrorCode::Forbidden));
    assert_eq!(got[2].unwrap().remaining(), 1);
    assert!(!got[3].unwrap().is_allowed(), "one unit back, not five");
    assert_eq!(second.live_buckets(), 0, "the owner decided every check");
    second.shutdown().await;
    first.node.shutdown().await;
}
