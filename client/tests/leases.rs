//! Concurrency leases end to end: several clients on an in-process cluster acquire, release and
//! renew leases; never more than `max` are granted at once, and a crash of the owner or a
//! graceful leave does not reset them.
//!
//! Every wait is for a condition, re-checked whenever something it depends on changes (a slot
//! table, lease sets received by a node, a client's links: see `PULSE`), bounded by `PATIENCE`;
//! nothing sleeps.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use common::*;
use floodgate::cluster::MembershipConfig;
use floodgate_client::{Acquire, Client, ErrorKind, LinkState, Renewal};
use floodgate_node::{Node, NodeConfig};

const TTL: Duration = Duration::from_secs(60);

static PULSE: Notify = Notify::const_new();

/// Waits until `done` holds, re-checking it at every `PULSE`; fails after `PATIENCE`.
async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    loop {
        let pulse = PULSE.notified();
        tokio::pin!(pulse);
        pulse.as_mut().enable();
        if done() {
            return;
        }
        let left = PATIENCE.saturating_sub(started.elapsed());
        assert!(!left.is_zero(), "timed out waiting for {what}");
        let _ = tokio::time::timeout(left, pulse).await;
    }
}

/// Gossip every 50 ms, suspect after 250 ms of silence, dead after 500 ms.
async fn start(certs: &Certs, seeds: Vec<SocketAddr>) -> Node {
    start_with(certs, seeds, 500_000_000).await
}

async fn start_with(certs: &Certs, seeds: Vec<SocketAddr>, dead_after_ns: u64) -> Node {
    let mut config = NodeConfig::for_tests(&certs.dev);
    config.cluster.seeds = seeds.into_iter().map(Into::into).collect();
    config.cluster.membership = MembershipConfig {
        gossip_interval_ns: 50_000_000,
        suspect_after_ns: 250_000_000,
        dead_after_ns,
        ..MembershipConfig::default()
    };
    let node = Node::start(config).await.unwrap();
    let (mut tables, mut leases) = (node.watch_slot_table(), node.watch_received_lease_sets());
    tokio::spawn(async move {
        loop {
            tokio::select! {
                t = tables.changed() => if t.is_err() { return },
                l = leases.changed() => if l.is_err() { return },
            }
            PULSE.notify_waiters();
        }
    });
    node
}

async fn connect(nodes: &[SocketAddr], certs: &Certs) -> Client {
    let client = Client::connect(nodes, client_config(certs)).await.unwrap();
    let mut changes = client.table_changes();
    tokio::spawn(async move {
        while changes.changed().await {
            PULSE.notify_waiters();
        }
    });
    client
}

async fn cluster(certs: &Certs, n: usize) -> Vec<Node> {
    let first = start(certs, Vec::new()).await;
    let seed = first.local_addr();
    let mut nodes = vec![first];
    for _ in 1..n {
        nodes.push(start(certs, vec![seed]).await);
    }
    eventually("the cluster to converge", || {
        let version = nodes[0].slot_table().version();
        nodes
            .iter()
            .all(|n| n.owners().len() == nodes.len() && n.slot_table().version() == version)
    })
    .await;
    nodes
}

fn owner_of<'a>(nodes: &'a [Node], key: &str) -> &'a Node {
    let table = nodes[0].slot_table();
    let owner = table
        .owner(floodgate::cluster::slot_of(key.as_bytes()))
        .unwrap();
    nodes.iter().find(|n| n.node_id() == owner).unwrap()
}

fn granted(answer: Acquire) -> floodgate_client::Lease {
    match answer {
        Acquire::Granted(lease) => lease,
        other => panic!("expected a grant, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_gateways_acquiring_at_once_get_exactly_max() {
    let certs = certs();
    let nodes = cluster(&certs, 3).await;
    let mut clients = Vec::new();
    for node in &nodes {
        clients.push(connect(&[node.local_addr()], &certs).await);
    }
    for client in &clients {
        eventually("each client to route by the cluster's table", || {
            client
                .slot_table()
                .is_some_and(|t| t.version() == nodes[0].slot_table().version())
        })
        .await;
    }
    // 3 clients x 20 tasks, each acquiring once without releasing: exactly 5 are granted.
    let (granted_n, refused_n) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut tasks = tokio::task::JoinSet::new();
    for client in &clients {
        for _ in 0..20 {
            let (client, granted_n, refused_n) =
                (client.clone(), granted_n.clone(), refused_n.clone());
            tasks.spawn(async move {
                match client.acquire("exports:tenant-1", 5, TTL).await.unwrap() {
                    Acquire::Granted(lease) => {
                        assert!(lease.in_use() <= 5, "{lease:?}");
                        granted_n.fetch_add(1, Ordering::Relaxed);
                    }
                    Acquire::Refused {
                        in_use,
                        retry_after,
                    } => {
                        assert_eq!(in_use, 5);
                        // The earliest lease expires within its TTL from now.
                        assert!(retry_after > Duration::ZERO && retry_after <= TTL);
                        refused_n.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    assert_eq!(granted_n.load(Ordering::Relaxed), 5);
    assert_eq!(refused_n.load(Ordering::Relaxed), 55);
    assert_eq!(
        owner_of(&nodes, "exports:tenant-1").leases_in_use(b"exports:tenant-1"),
        5
    );

    // Acquire, hold, release in a loop from every client: the holders seen at once (counted
    // between each grant and its release, a span inside the node's) never pass max.
    let holding = Arc::new(AtomicU64::new(0));
    let most = Arc::new(AtomicU64::new(0));
    let grants = Arc::new(AtomicU64::new(0));
    for client in &clients {
        for _ in 0..8 {
            let (client, holding, most, grants) = (
                client.clone(),
                holding.clone(),
                most.clone(),
                grants.clone(),
            );
            tasks.spawn(async move {
                for _ in 0..15 {
                    let answer = client.acquire("exports:tenant-2", 3, TTL).await.unwrap();
                    if let Acquire::Granted(lease) = answer {
                        let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        grants.fetch_add(1, Ordering::Relaxed);
                        tokio::task::yield_now().await;
                        holding.fetch_sub(1, Ordering::SeqCst);
                        assert!(client.release(&lease).await.unwrap());
                    }
                }
            });
        }
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    let most = most.load(Ordering::SeqCst);
    assert!((1..=3).contains(&most), "{most} held at once, max 3");
    assert!(grants.load(Ordering::Relaxed) >= 3);
    assert_eq!(
        owner_of(&nodes, "exports:tenant-2").leases_in_use(b"exports:tenant-2"),
        0
    );
    for client in &clients {
        client.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_is_idempotent_and_renew_extends_only_a_held_lease() {
    let certs = certs();
    let node = start(&certs, Vec::new()).await;
    let client = connect(&[node.local_addr()], &certs).await;
    let lease = granted(
        client
            .acquire("k", 1, Duration::from_secs(5))
            .await
            .unwrap(),
    );
    assert_eq!(lease.expires_in(), Duration::from_secs(5));
    match client.renew(&lease, Duration::from_secs(90)).await.unwrap() {
        Renewal::Renewed { expires_in } => assert_eq!(expires_in, Duration::from_secs(90)),
        other => panic!("{other:?}"),
    }
    assert!(client.release(&lease).await.unwrap());
    assert!(!client.release(&lease).await.unwrap());
    assert_eq!(
        client.renew(&lease, Duration::from_secs(5)).await.unwrap(),
        Renewal::NotHeld
    );
    // Bad limits are the caller's error, caught before sending.
    let bad = client.acquire("k", 0, TTL).await.unwrap_err();
    assert_eq!(bad.kind(), ErrorKind::BadRequest);
    assert!(
        bad.to_string().contains("max must be between 1 and 100000"),
        "{bad}"
    );
    let bad = client
        .acquire("k", 1, Duration::from_secs(2 * 86_400))
        .await
        .unwrap_err();
    assert!(
        bad.to_string()
            .contains("ttl must be between 1ms and 1 day"),
        "{bad}"
    );
    client.close().await;
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_survive_a_crash_of_the_owner() {
    let certs = certs();
    let mut nodes = cluster(&certs, 2).await;
    let key = "exports:crash";
    let owner_index = nodes
        .iter()
        .position(|n| n.node_id() == owner_of(&nodes, key).node_id())
        .unwrap();
    let client = connect(&[nodes[1 - owner_index].local_addr()], &certs).await;
    eventually("the client to route by the cluster's table", || {
        client.nodes().len() == 2
            && client
                .nodes()
                .iter()
                .all(|n| n.state == LinkState::Connected)
    })
    .await;
    let mut leases = Vec::new();
    for _ in 0..3 {
        leases.push(granted(client.acquire(key, 3, TTL).await.unwrap()));
    }
    let successor = &nodes[1 - owner_index];
    assert_eq!(owner_of(&nodes, key).leases_in_use(key.as_bytes()), 3);
    eventually("the successor to hold the owner's replicas", || {
        successor.leases_in_use(key.as_bytes()) == 3
    })
    .await;
    let owner = nodes.remove(owner_index);
    owner.crash();
    let survivor = nodes[0].node_id().to_owned();
    eventually(
        "the survivor to own the key, in its table and the client's",
        || {
            nodes[0].owners() == [survivor.clone()]
                && client
                    .slot_table()
                    .and_then(|t| t.owner_of_key(key.as_bytes()).map(|m| m.id == survivor))
                    .unwrap_or(false)
        },
    )
    .await;
    // The successor took over from its replicas: all 3 are still held.
    match client.acquire(key, 3, TTL).await.unwrap() {
        Acquire::Refused { in_use, .. } => assert_eq!(in_use, 3),
        other => panic!("a crash reset the leases: {other:?}"),
    }
    assert!(client.release(&leases[0]).await.unwrap());
    granted(client.acquire(key, 3, TTL).await.unwrap());
    client.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_survive_a_graceful_leave() {
    let certs = certs();
    let mut nodes = cluster(&certs, 3).await;
    let key = "exports:leave";
    let owner_index = nodes
        .iter()
        .position(|n| n.node_id() == owner_of(&nodes, key).node_id())
        .unwrap();
    let stays = nodes[(owner_index + 1) % 3].local_addr();
    let client = connect(&[stays], &certs).await;
    eventually("links to every member", || {
        client.nodes().len() == 3
            && client
                .nodes()
                .iter()
                .all(|n| n.state == LinkState::Connected)
    })
    .await;
    for _ in 0..2 {
        granted(client.acquire(key, 2, TTL).await.unwrap());
    }
    let leaving = nodes.remove(owner_index);
    leaving.shutdown().await;
    eventually("the others to own every slot", || {
        nodes.iter().all(|n| n.owners().len() == 2)
    })
    .await;
    let new_owner = owner_of(&nodes, key);
    eventually("the new owner to hold the leases", || {
        new_owner.leases_in_use(key.as_bytes()) == 2
    })
    .await;
    match client.acquire(key, 2, TTL).await.unwrap() {
        Acquire::Refused { in_use, .. } => assert_eq!(in_use, 2),
        other => panic!("a leave reset the leases: {other:?}"),
    }
    client.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_move_with_their_slots_when_a_node_joins() {
    let certs = certs();
    let first = start(&certs, Vec::new()).await;
    let client = connect(&[first.local_addr()], &certs).await;
    let keys: Vec<String> = (0..24).map(|i| format!("exports:join-{i}")).collect();
    for key in &keys {
        granted(client.acquire(key.as_bytes(), 1, TTL).await.unwrap());
    }
    let seed = first.local_addr();
    let nodes = vec![first, start(&certs, vec![seed]).await];
    eventually("the cluster to converge", || {
        let version = nodes[0].slot_table().version();
        nodes
            .iter()
            .all(|n| n.owners().len() == 2 && n.slot_table().version() == version)
    })
    .await;
    let moved: Vec<&String> = keys
        .iter()
        .filter(|k| owner_of(&nodes, k).node_id() == nodes[1].node_id())
        .collect();
    assert!(!moved.is_empty(), "some keys move to the newcomer");
    eventually("the newcomer to hold the moved keys' leases", || {
        moved
            .iter()
            .all(|k| nodes[1].leases_in_use(k.as_bytes()) == 1)
    })
    .await;
    eventually("the client to route by the new table", || {
        client
            .slot_table()
            .is_some_and(|t| t.version() == nodes[0].slot_table().version())
    })
    .await;
    for key in &keys {
        match client.acquire(key.as_bytes(), 1, TTL).await.unwrap() {
            Acquire::Refused { in_use, .. } => assert_eq!(in_use, 1, "{key}"),
            other => panic!("{key}: a join reset its lease: {other:?}"),
        }
    }
    client.close().await;
}

/// Before the cluster declares a crashed owner dead, a client that lost it sends its lease
/// requests to the slot's successor marked as a takeover; the successor decides them from its
/// replicas: the owner's leases still hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_successor_takes_over_while_the_owner_is_unreachable() {
    let certs = certs();
    // Dead after an hour: the owner stays in every table for the whole test.
    let hour = 3_600_000_000_000;
    let first = start_with(&certs, Vec::new(), hour).await;
    let seed = first.local_addr();
    let mut nodes = vec![first, start_with(&certs, vec![seed], hour).await];
    eventually("the cluster to converge", || {
        let version = nodes[0].slot_table().version();
        nodes
            .iter()
            .all(|n| n.owners().len() == 2 && n.slot_table().version() == version)
    })
    .await;
    let key = "exports:takeover";
    let owner_index = nodes
        .iter()
        .position(|n| n.node_id() == owner_of(&nodes, key).node_id())
        .unwrap();
    let client = connect(&[nodes[1 - owner_index].local_addr()], &certs).await;
    eventually("links to both nodes", || {
        client.nodes().len() == 2
            && client
                .nodes()
                .iter()
                .all(|n| n.state == LinkState::Connected)
    })
    .await;
    for _ in 0..2 {
        granted(client.acquire(key, 2, TTL).await.unwrap());
    }
    eventually("the successor to hold the replicas", || {
        nodes[1 - owner_index].leases_in_use(key.as_bytes()) == 2
    })
    .await;
    nodes.remove(owner_index).crash();
    let successor = &nodes[0];
    // Until the client notices the connection is gone, a call to the owner fails; then it goes
    // to the successor as a takeover. Bounded in attempts and time.
    let started = Instant::now();
    let mut attempts = 0;
    let in_use = loop {
        attempts += 1;
        assert!(
            attempts < 10_000 && started.elapsed() < PATIENCE,
            "no takeover"
        );
        match client.acquire(key, 2, TTL).await {
            Ok(Acquire::Refused { in_use, .. }) => break in_use,
            Ok(other) => panic!("the takeover reset the leases: {other:?}"),
            Err(_) => tokio::task::yield_now().await,
        }
    };
    assert_eq!(in_use, 2);
    // Still in the table: the successor decided as a takeover, not as the new owner.
    assert_eq!(successor.owners().len(), 2);
    client.close().await;
}
