//! Three gateways (clients), one per region, each talking to its own region's node: a `global`
//! limit is one limit for all three within the documented bound, a `region` limit is exact in
//! each region. Waits are on the nodes' table and exchange change counters, bounded by
//! `PATIENCE`; nothing sleeps.

mod common;

use std::net::SocketAddr;

use common::*;
use floodgate::cluster::MembershipConfig;
use floodgate::region::Scope;
use floodgate::{Limit, NANOS_PER_SEC};
use floodgate_client::{Check, Client, FailureMode};
use floodgate_node::{Node, NodeConfig};

const REGIONS: [&str; 3] = ["eu", "us", "ap"];

async fn start(certs: &Certs, region: &str, seeds: Vec<SocketAddr>) -> Node {
    let mut config = NodeConfig::for_tests(&certs.dev);
    config.cluster.seeds = seeds.into_iter().map(Into::into).collect();
    config.cluster.region = region.to_owned();
    config.cluster.region_sync_interval = std::time::Duration::from_millis(20);
    config.cluster.membership = MembershipConfig {
        gossip_interval_ns: 50_000_000,
        suspect_after_ns: 250_000_000,
        dead_after_ns: 500_000_000,
        ..MembershipConfig::default()
    };
    Node::start(config).await.unwrap()
}

/// One node per region, the others joining through the first; returns once each counts the
/// others as their regions' owners (before, a global key's units admitted would not reach them).
async fn regions(certs: &Certs) -> Vec<Node> {
    let first = start(certs, REGIONS[0], Vec::new()).await;
    let seed = first.local_addr();
    let mut nodes = vec![first];
    for region in &REGIONS[1..] {
        nodes.push(start(certs, region, vec![seed]).await);
    }
    let ids: Vec<String> = nodes.iter().map(|n| n.node_id().to_owned()).collect();
    for node in &nodes {
        let elsewhere: Vec<&str> = ids
            .iter()
            .map(String::as_str)
            .filter(|id| *id != node.node_id())
            .collect();
        tokio::time::timeout(PATIENCE, node.reaches(&elsewhere))
            .await
            .expect("every node counts every other region's node as an owner");
    }
    nodes
}

/// A gateway of `region`, given its region's node.
async fn gateway(certs: &Certs, node: &Node, region: &str) -> Client {
    let mut config = client_config(certs);
    config.region = Some(region.to_owned());
    config.timeout = std::time::Duration::from_secs(2);
    Client::connect(&[node.local_addr()], config).await.unwrap()
}

/// Waits until every node has everything it admitted confirmed.
async fn settle(nodes: &[Node]) {
    let mut watches: Vec<_> = nodes.iter().map(|n| n.region_sync().subscribe()).collect();
    tokio::time::timeout(PATIENCE, async {
        loop {
            for w in &mut watches {
                w.borrow_and_update();
            }
            if nodes.iter().all(|n| n.region_sync().is_idle()) {
                return;
            }
            let [a, b, c] = &mut watches[..] else {
                unreachable!("three regions")
            };
            tokio::select! {
                _ = a.changed() => {}
                _ = b.changed() => {}
                _ = c.changed() => {}
            }
        }
    })
    .await
    .expect("every delta confirmed");
}

/// `count` checks of `check` from every gateway at once (each gateway's one after another);
/// returns how many each allowed. Every one must be decided by a node.
async fn round(gateways: &[Client], check: &Check, count: usize) -> Vec<usize> {
    let mut tasks = Vec::new();
    for gateway in gateways {
        let gateway = gateway.clone();
        let check = check.clone();
        tasks.push(tokio::spawn(async move {
            let mut allowed = 0;
            for _ in 0..count {
                let verdict = gateway.check(std::slice::from_ref(&check)).await.unwrap()[0];
                assert!(
                    verdict.source.degraded().is_none(),
                    "not decided by a node: {verdict:?}"
                );
                allowed += usize::from(verdict.decision.is_allowed());
            }
            allowed
        }));
    }
    let mut allowed = Vec::new();
    for task in tasks {
        allowed.push(task.await.unwrap());
    }
    allowed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_in_three_regions_share_one_global_limit_within_the_bound() {
    let certs = certs();
    let nodes = regions(&certs).await;
    let mut gateways = Vec::new();
    for (node, region) in nodes.iter().zip(REGIONS) {
        gateways.push(gateway(&certs, node, region).await);
    }
    // Each gateway links to its own region's node only, though its table lists all three.
    for (gateway, node) in gateways.iter().zip(&nodes) {
        let mut changes = gateway.table_changes();
        tokio::time::timeout(PATIENCE, async {
            while gateway
                .slot_table()
                .is_none_or(|t| t.members().len() != REGIONS.len())
            {
                assert!(changes.changed().await, "the client stopped");
            }
        })
        .await
        .expect("the gateway's table lists every region's node");
        let linked: Vec<SocketAddr> = gateway.nodes().iter().map(|n| n.addr).collect();
        assert_eq!(linked, vec![node.local_addr()]);
    }
    // 60 an hour, burst 60: refill is about one unit a minute, nothing within the test. Shares
    // of 20, so the bound is 60 + 2 × 20.
    let limit = Limit::gcra(60, 3_600 * NANOS_PER_SEC, 60).unwrap();
    let bound = 60 + 2 * 20;
    let check = Check::new("api:tenant-7", limit)
        .failure_mode(FailureMode::Closed)
        .scope(Scope::Global);
    let first = round(&gateways, &check, 40).await;
    let mut total: usize = first.iter().sum();
    settle(&nodes).await;
    for _ in 0..10 {
        let admitted = round(&gateways, &check, 10).await;
        total += admitted.iter().sum::<usize>();
        settle(&nodes).await;
        if admitted.iter().all(|n| *n == 0) {
            break;
        }
    }
    println!("global: {total} admitted of 60 (bound {bound}); first round {first:?}");
    assert!(total <= bound, "{total} admitted, over the bound {bound}");
    assert!(total >= 60, "only {total} admitted");
    assert_eq!(round(&gateways, &check, 1).await, vec![0, 0, 0]);

    // A region limit is exact in each region and crosses no region.
    let applied: u64 = nodes
        .iter()
        .map(|n| n.region_sync().stats().applied_messages)
        .sum();
    let regional = Check::new("api:regional", per_hour(25)).failure_mode(FailureMode::Closed);
    assert_eq!(round(&gateways, &regional, 30).await, vec![25, 25, 25]);
    settle(&nodes).await;
    let applied_after: u64 = nodes
        .iter()
        .map(|n| n.region_sync().stats().applied_messages)
        .sum();
    assert_eq!(applied, applied_after);
    for gateway in gateways {
        gateway.close().await;
    }
}

/// A metered charge of a `global` rule counts in every region: what one region's gateway is
/// charged reaches the other regions' buckets once, so their gateways' peeks see it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_charge_reaches_every_region() {
    let certs = certs();
    let nodes = regions(&certs).await;
    let mut gateways = Vec::new();
    for (node, region) in nodes.iter().zip(REGIONS) {
        gateways.push(gateway(&certs, node, region).await);
    }
    for gateway in &gateways {
        let mut changes = gateway.table_changes();
        tokio::time::timeout(PATIENCE, async {
            while gateway
                .slot_table()
                .is_none_or(|t| t.members().len() != REGIONS.len())
            {
                assert!(changes.changed().await, "the client stopped");
            }
        })
        .await
        .expect("the gateway's table lists every region's node");
    }
    let limit = per_hour(300);
    let tokens = |cost: u64| {
        Check::new("tokens:tenant-7", limit)
            .cost(cost)
            .scope(Scope::Global)
    };
    let charged = gateways[0].charge(&[tokens(60)]).await.unwrap();
    assert!(
        matches!(charged[0], floodgate_client::ChargeOutcome::Taken(d) if d.remaining() == 240),
        "{charged:?}"
    );
    settle(&nodes).await;
    for gateway in &gateways[1..] {
        let over = gateway.check(&[tokens(250).peek()]).await.unwrap()[0];
        assert!(!over.is_allowed(), "{over:?}: 60 were charged in eu");
        let under = gateway.check(&[tokens(10).peek()]).await.unwrap()[0];
        assert!(under.is_allowed(), "{under:?}");
        assert_eq!(under.decision.remaining(), 230, "the peek took nothing");
    }
    for gateway in gateways {
        gateway.close().await;
    }
}
