//! An owner that does not answer while the failure detector still holds it alive (stalled: a
//! pause, a SIGSTOP, a slow moment) is never decided beside: a check forwarded to it, or a
//! takeover of its slot sent to its successor, is answered without a decision (`try_again`,
//! `shutting_down` to a caller of an older version) and nothing is spent here. The stalled
//! owner is a member gossiped at an address where nothing answers; the node's suspicion
//! timeout is an hour, so it stays alive throughout. Waits are on the node's table, bounded.

mod common;

use std::time::Duration;

use common::*;
use floodgate::cluster::membership::MemberDigest;
use floodgate::cluster::{Gossip, MemberInfo, MembershipConfig, slot_of};
use floodgate::wire::{CheckBatch, ErrorCode, FrameKind, WireCheck, encode_message};
use floodgate_node::NodeConfig;

const PATIENCE: Duration = Duration::from_secs(10);
const HOUR_NS: u64 = 3_600_000_000_000;

/// A member `id` that owns slots at an address nowhere answers from (UDP port 9, discard).
fn silent_member(id: &str) -> Vec<u8> {
    let info = MemberInfo {
        id: id.to_owned(),
        addr: "127.0.0.1:9".to_owned(),
        region: "local".to_owned(),
    };
    let digest = MemberDigest {
        info,
        incarnation: 1,
        heartbeat: 1,
        left: false,
        versions: None,
        joining: false,
    };
    let mut frame = Vec::new();
    floodgate::wire::encode_gossip(
        &mut frame,
        floodgate::protocol::NEWEST,
        &Gossip {
            members: vec![digest],
        },
    );
    frame
}

fn one_check(key: &[u8], takeover: bool) -> Vec<u8> {
    let mut check = WireCheck::new(key.to_vec(), &per_hour(5), 1);
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_for_a_live_owner_that_does_not_answer_is_not_decided_beside_it() {
    let a = start_node(|config: &mut NodeConfig| {
        config.cluster.membership = MembershipConfig {
            suspect_after_ns: HOUR_NS,
            dead_after_ns: 2 * HOUR_NS,
            ..MembershipConfig::default()
        };
        // The takeover's forward waits for the owner's answer, not for a debug build's pace.
        config.cluster.takeover_forward_timeout = Duration::from_millis(100);
    })
    .await;
    let peer = connect(a.node.local_addr(), peer_config(&a.certs)).await;
    let mut stream = peer.open_uni().await.unwrap();
    stream.write_all(&silent_member("stalled")).await.unwrap();
    stream.finish().unwrap();
    let mut tables = a.node.watch_slot_table();
    let joined = tokio::time::timeout(
        PATIENCE,
        tables.wait_for(|t| t.nodes().iter().any(|n| n == "stalled")),
    )
    .await
    .is_ok();
    assert!(joined, "the stalled member never owned slots");
    let table = a.node.slot_table();
    let me = a.node.node_id();
    // Owned by the stalled member, with this node its successor (two members: always).
    let key = (0..10_000)
        .map(|i| format!("stalled-{i}").into_bytes())
        .find(|k| {
            let slot = slot_of(k);
            table.owner(slot) == Some("stalled") && table.successor(slot) == Some(me)
        })
        .unwrap();
    let client = connect(a.node.local_addr(), client_config(&a.certs, false)).await;
    for takeover in [false, true] {
        let answers = exchange(&client, &one_check(&key, takeover)).await;
        let decided: Vec<_> = answers.decisions.iter().flat_map(|(_, d)| d).collect();
        // This connection speaks version 4: `try_again` (an older one: `shutting_down`).
        assert_eq!(
            decided,
            vec![&Err(ErrorCode::TryAgain)],
            "takeover {takeover}: an owner held alive is never decided beside: {answers:?}"
        );
    }
    assert_eq!(a.node.live_buckets(), 0, "nothing was spent here");
    a.node.shutdown().await;
}
