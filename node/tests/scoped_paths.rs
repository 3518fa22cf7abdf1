//! Every scope takes one path: a kind 12 batch (checks with scopes) sent to a node that does
//! not own a group's slot is forwarded to the owner and decided there exactly, as a kind 1
//! batch is: a `region` group that travels beside a `global` one, and a `global` group itself
//! (with its scopes, kind 20). Waits are on slot-table changes, bounded by timeouts.

mod common;

use std::time::Duration;

use common::*;
use floodgate::Limit;
use floodgate::cluster::{MembershipConfig, slot_of};
use floodgate::region::Scope;
use floodgate::wire::{
    CheckBatch, ErrorCode, FrameKind, ScopedCheckBatch, WireCheck, encode_message,
};
use floodgate_node::{Node, NodeConfig};

const MS: u64 = 1_000_000;

fn fast(config: &mut NodeConfig) {
    config.cluster.membership = MembershipConfig {
        gossip_interval_ns: 20 * MS,
        suspect_after_ns: 150 * MS,
        dead_after_ns: 300 * MS,
        ..MembershipConfig::default()
    };
    config.cluster.sync_interval = Duration::from_millis(50);
}

/// A key the node with `id` owns in `node`'s table.
fn key_owned_by(node: &Node, id: &str, prefix: &str) -> Vec<u8> {
    let table = node.slot_table();
    (0..10_000)
        .map(|i| format!("{prefix}{i}").into_bytes())
        .find(|k| table.owner(slot_of(k)) == Some(id))
        .unwrap()
}

/// `count` kind 12 frames of the same groups, each group one check of `limit` with its scope.
fn frames(groups: &[(&[u8], Scope)], limit: &Limit, count: usize) -> Vec<u8> {
    let mut bytes = Vec::new();
    for i in 0..count {
        let batch = CheckBatch {
            groups: groups
                .iter()
                .map(|(key, _)| vec![WireCheck::new(key.to_vec(), limit, 1)])
                .collect(),
        };
        let scopes: Vec<Scope> = groups.iter().map(|(_, s)| s.clone()).collect();
        encode_message(
            &mut bytes,
            FrameKind::ScopedCheckBatch,
            i as u64 + 1,
            &ScopedCheckBatch::new(batch, &scopes),
        );
    }
    bytes
}

/// Per group: how many of its checks were allowed, over every frame of `answers`.
fn allowed_per_group(answers: &Answers, groups: usize) -> Vec<Result<usize, ErrorCode>> {
    let mut allowed = vec![Ok(0); groups];
    for (_, decisions) in &answers.decisions {
        for (group, decision) in decisions.iter().enumerate() {
            allowed[group] = match (&allowed[group], decision) {
                (Ok(n), Ok(d)) => Ok(n + usize::from(d.is_allowed())),
                (Err(code), _) | (_, Err(code)) => Err(*code),
            };
        }
    }
    allowed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scoped_groups_for_another_owner_are_forwarded_and_decided_exactly() {
    let first = start_node(fast).await;
    let mut config = NodeConfig::for_tests(&first.certs);
    fast(&mut config);
    config.cluster.seeds = vec![first.node.local_addr().into()];
    let second = Node::start(config).await.unwrap();
    for node in [&first.node, &second] {
        converge(node, 2).await;
    }
    // Sent to `first`; `second` owns the keys of the first two groups.
    let theirs = key_owned_by(&first.node, second.node_id(), "theirs-");
    let theirs_global = key_owned_by(&first.node, second.node_id(), "theirs-global-");
    let mine = key_owned_by(&first.node, first.node.node_id(), "mine-");
    let groups: [(&[u8], Scope); 3] = [
        (&theirs, Scope::Region),
        (&theirs_global, Scope::Global),
        (&mine, Scope::Global),
    ];
    let limit = per_hour(3);
    let connection = connect(first.node.local_addr(), client_config(&first.certs, false)).await;
    let answers = exchange(&connection, &frames(&groups, &limit, 5)).await;
    assert!(answers.errors.is_empty(), "{:?}", answers.errors);
    assert_eq!(
        allowed_per_group(&answers, 3),
        vec![Ok(3), Ok(3), Ok(3)],
        "each key's 3 of 5, wherever it is owned: {answers:?}"
    );
    // Decided by the owner: its buckets, not the receiver's.
    let again = connect(second.local_addr(), client_config(&first.certs, false)).await;
    let owner_view = exchange(&again, &frames(&groups[..2], &limit, 1)).await;
    assert_eq!(allowed_per_group(&owner_view, 2), vec![Ok(0), Ok(0)]);
    second.shutdown().await;
    first.node.shutdown().await;
}

/// A member of another region that speaks only version 2 holds the cluster version at 2, but
/// a forwarded batch goes to its owner alone: two members of one region that both read scopes
/// forward a `global` group between them and decide it, rather than answering `not_owner`
/// until every region is upgraded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_group_is_forwarded_to_an_owner_that_reads_scopes_whatever_other_regions_speak() {
    let in_region_a = |config: &mut NodeConfig| {
        config.cluster.region = "a".to_owned();
        // The silent member below stays alive for the whole test.
        config.cluster.membership = MembershipConfig {
            gossip_interval_ns: 20 * MS,
            suspect_after_ns: 600_000 * MS,
            dead_after_ns: 1_200_000 * MS,
            ..MembershipConfig::default()
        };
    };
    let first = start_node(in_region_a).await;
    let mut config = NodeConfig::for_tests(&first.certs);
    in_region_a(&mut config);
    config.cluster.seeds = vec![first.node.local_addr().into()];
    let second = Node::start(config).await.unwrap();
    for node in [&first.node, &second] {
        converge(node, 2).await;
    }
    gossip_silent_member(
        &first,
        ("silent-peer", "127.0.0.1:9"),
        "b",
        floodgate::protocol::VersionRange::new(2, 2),
    )
    .await;
    let mut tables = first.node.watch_slot_table();
    let heard = tokio::time::timeout(Duration::from_secs(10), async {
        while first.node.cluster_version() != 2 {
            tables.changed().await.unwrap();
        }
    })
    .await;
    assert!(heard.is_ok(), "the version 2 member's gossip was not taken");
    // Sent to `first`; `second` owns the key. A limit of 20 has a share of 10 a region, so
    // the five checks pass the admission rule with nothing confirmed by region b.
    let theirs = key_owned_by(&first.node, second.node_id(), "theirs-global-");
    let groups: [(&[u8], Scope); 1] = [(&theirs, Scope::Global)];
    let connection = connect(first.node.local_addr(), client_config(&first.certs, false)).await;
    let answers = exchange(&connection, &frames(&groups, &per_hour(20), 5)).await;
    assert!(answers.errors.is_empty(), "{:?}", answers.errors);
    assert_eq!(
        allowed_per_group(&answers, 1),
        vec![Ok(5)],
        "forwarded to the owner and decided there: {answers:?}"
    );
    second.shutdown().await;
    first.node.shutdown().await;
}
