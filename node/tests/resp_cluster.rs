//! A 3-node cluster with the Redis protocol front on every node: `CL.THROTTLE` through any node
//! is decided by the key's owner (forwarded when another node owns it), so each key is exact
//! however its calls are spread over the nodes.

mod common;

use common::resp::RespClient;
use common::*;
use floodgate_node::{Node, RespSettings};

/// Three nodes with the Redis front on each, and no replication during the test: a node can
/// know a key's state only from its owner.
async fn resp_cluster() -> (Vec<Node>, TestNode) {
    cluster_with(3, |config| {
        config.resp = Some(RespSettings::on(([127, 0, 0, 1], 0).into()));
        config.cluster.sync_interval = std::time::Duration::from_secs(3600);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_answers_for_every_key_exactly() {
    let (nodes, first) = resp_cluster().await;
    let all: Vec<&Node> = nodes.iter().chain([&first.node]).collect();
    let mut clients = Vec::new();
    for node in &all {
        clients.push(RespClient::connect(node.resp_addr().unwrap()).await);
    }
    for owner in &all {
        let key = key_owned_by(all[0], owner.node_id(), "resp-");
        let key = String::from_utf8(key).unwrap();
        // max_burst 4 per hour: 12 calls spread over the three nodes, two of which forward.
        let mut replies = Vec::new();
        for i in 0..12 {
            let via = &mut clients[i % 3];
            let reply = via
                .call(&format!("CL.THROTTLE {key} 4 1 3600"))
                .await
                .throttle();
            replies.push((reply[0], reply[2]));
        }
        let expected: Vec<(i64, i64)> = [(0, 4), (0, 3), (0, 2), (0, 1), (0, 0)]
            .into_iter()
            .chain([(1, 0); 7])
            .collect();
        assert_eq!(replies, expected, "key {key} owned by {}", owner.node_id());
    }
    // A pipeline through one node of keys owned by all three: each decided by its owner.
    let keys: Vec<String> = all
        .iter()
        .map(|owner| String::from_utf8(key_owned_by(all[0], owner.node_id(), "piped-")).unwrap())
        .collect();
    let mut bytes = Vec::new();
    for _ in 0..4 {
        for key in &keys {
            bytes.extend(common::resp::words(&format!("CL.THROTTLE {key} 1 1 3600")));
        }
    }
    clients[1].send(&bytes).await;
    let mut limited = Vec::new();
    for _ in 0..12 {
        limited.push(clients[1].read().await.throttle()[0]);
    }
    assert_eq!(limited, [0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1]);
    for node in nodes {
        node.shutdown().await;
    }
    first.node.shutdown().await;
}

/// Calls through one node for keys another node owns, from many connections at once: their
/// forwards to the owner may leave together in one frame, and each call still gets its own
/// key's decision. Each connection's key has a limit of its own, so a decision handed to the
/// wrong caller shows in the limit it names, and each key's count stays exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_forwards_each_get_their_own_keys_decisions() {
    let (nodes, first) = resp_cluster().await;
    let all: Vec<&Node> = nodes.iter().chain([&first.node]).collect();
    let (via, owner) = (all[0], all[1]);
    let addr = via.resp_addr().unwrap();
    // The callers run concurrently in this task (the test's RESP client is not `Send`).
    let callers = (0..24_i64).map(|i| {
        let key = key_owned_by(via, owner.node_id(), &format!("coalesced-{i}-"));
        let key = String::from_utf8(key).unwrap();
        async move {
            let mut client = RespClient::connect(addr).await;
            // max_burst + 1 calls are allowed, the rest limited.
            let max_burst = 2 + i;
            let mut replies = Vec::new();
            for _ in 0..max_burst + 3 {
                let call = format!("CL.THROTTLE {key} {max_burst} 1 3600");
                replies.push(client.call(&call).await.throttle());
            }
            (max_burst, replies)
        }
    });
    let mut answered = 0;
    for (max_burst, replies) in futures_util::future::join_all(callers).await {
        let limited: Vec<i64> = replies.iter().map(|r| r[0]).collect();
        let allowed = max_burst as usize + 1;
        let expected: Vec<i64> = [vec![0; allowed], vec![1; 2]].concat();
        assert_eq!(limited, expected, "max_burst {max_burst}: {replies:?}");
        assert!(
            replies.iter().all(|r| r[1] == max_burst + 1),
            "max_burst {max_burst}: another key's decision came back: {replies:?}"
        );
        answered += 1;
    }
    assert_eq!(answered, 24);
    for node in nodes {
        node.shutdown().await;
    }
    first.node.shutdown().await;
}
