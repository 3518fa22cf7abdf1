//! A 3-node cluster with the Redis protocol front on every node: `CL.THROTTLE` through any node
//! is decided by the key's owner (forwarded when another node owns it), so each key is exact
//! however its calls are spread over the nodes.

mod common;

use common::resp::RespClient;
use common::*;
use floodgate_node::{Node, RespSettings};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_answers_for_every_key_exactly() {
    let (nodes, first) = cluster_with(3, |config| {
        config.resp = Some(RespSettings::on(([127, 0, 0, 1], 0).into()));
        // No replication during the test: a node can know a key's state only from its owner.
        config.cluster.sync_interval = std::time::Duration::from_secs(3600);
    })
    .await;
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
