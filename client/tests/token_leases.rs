//! Token leases end to end: several gateways (clients) sharing a hot key on one node never admit
//! more than its limit, most of it decided locally; a gateway that crashes holding a lease
//! strands at most what it held, and nothing else changes.
//!
//! The limits are a day long (one token refills every few minutes), so no refill happens while a
//! test runs and every count is exact. Nothing sleeps: loops are bounded in count.

mod common;

use common::*;
use floodgate::{Limit, NANOS_PER_SEC};
use floodgate_client::{Check, Client, ClientConfig, TokenLeaseStats};

/// A limit that admits exactly `n` during a test.
fn per_day(n: u64) -> Limit {
    Limit::gcra(n, 86_400 * NANOS_PER_SEC, n).unwrap()
}

/// Leases on, from 20 checks a second (every test loop is far faster than that).
fn leasing(certs: &Certs) -> ClientConfig {
    let mut config = client_config(certs);
    config.token_leases.enabled = true;
    config.token_leases.hot_above_per_sec = 20;
    config
}

/// Checks `key` until `denials` checks in a row are denied (or `most` checks); returns how many
/// were admitted.
async fn drain(client: &Client, key: &str, limit: Limit, denials: usize, most: usize) -> u64 {
    let (mut admitted, mut denied_in_a_row) = (0, 0);
    for _ in 0..most {
        let verdicts = client.check(&[Check::new(key, limit)]).await.unwrap();
        if verdicts[0].is_allowed() {
            admitted += 1;
            denied_in_a_row = 0;
        } else {
            denied_in_a_row += 1;
            if denied_in_a_row == denials {
                break;
            }
        }
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_sharing_a_hot_key_never_admit_more_than_its_limit() {
    let certs = certs();
    let node = start_node(&certs, any_port(), false).await;
    let limit = per_day(1_000);
    // Every gateway connected before any starts, so they compete for the key from the start.
    let mut connected = Vec::new();
    for _ in 0..3 {
        let client = Client::connect(&[node.local_addr()], leasing(&certs))
            .await
            .unwrap();
        connected.push(client);
    }
    let mut gateways = tokio::task::JoinSet::new();
    for client in connected {
        gateways.spawn(async move {
            // Each gateway alone would try 800: 2,400 against a limit of 1,000.
            let mut admitted = 0;
            for _ in 0..800 {
                let verdicts = client.check(&[Check::new("hot", limit)]).await.unwrap();
                admitted += u64::from(verdicts[0].is_allowed());
            }
            (admitted, client)
        });
    }
    let mut admitted = 0;
    let mut clients = Vec::new();
    while let Some(done) = gateways.join_next().await {
        let (count, client) = done.unwrap();
        admitted += count;
        clients.push(client);
    }
    // Read together, once every gateway stopped: no token can be in two leases at once.
    let all: Vec<TokenLeaseStats> = clients
        .iter()
        .map(|c| c.token_lease_stats().unwrap())
        .collect();
    for client in &clients {
        client.close().await;
    }
    let local: u64 = all.iter().map(|s| s.local_allowed).sum();
    let held: u64 = all.iter().map(|s| s.held).sum();
    println!(
        "admitted {admitted} of 1000, {local} of them locally; {held} held at the end; {all:?}"
    );
    assert!(
        admitted <= 1_000,
        "admitted {admitted} over a limit of 1000"
    );
    // Tokens still held came from the bucket too: no token is both held and admitted.
    assert!(
        admitted + held <= 1_000,
        "admitted {admitted} and {held} held: more tokens than the bucket had"
    );
    assert!(local > 0, "no check was decided against a lease: {all:?}");
    node.shutdown().await;
}

/// A gateway killed while it holds a lease (its runtime dropped: no task runs again, nothing is
/// returned) strands at most the tokens it held; every other token is still admitted elsewhere.
#[test]
fn a_crashed_gateway_strands_at_most_its_lease() {
    let certs = certs();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let node = runtime.block_on(start_node(&certs, any_port(), false));
    let addr = node.local_addr();
    let limit = per_day(400);

    // The gateway that will crash, on a runtime of its own.
    let doomed = tokio::runtime::Runtime::new().unwrap();
    let (crashed_admitted, held) = doomed.block_on(async {
        let client = Client::connect(&[addr], leasing(&certs)).await.unwrap();
        let mut admitted = 0;
        // Until it is admitting against a lease and holds tokens, with no refill on its way.
        for _ in 0..300 {
            let verdicts = client.check(&[Check::new("hot", limit)]).await.unwrap();
            admitted += u64::from(verdicts[0].is_allowed());
            let stats = client.token_lease_stats().unwrap();
            if stats.local_allowed > 0 && stats.held > 0 && stats.refilling == 0 {
                // Leaked on purpose: a crash runs no destructor and returns nothing.
                std::mem::forget(client);
                return (admitted, stats.held);
            }
        }
        panic!("the gateway never held a lease");
    });
    doomed.shutdown_background();

    let most_held = floodgate::token_lease::LeaseSizing::default().most_held(&limit);
    assert!(
        held <= most_held,
        "held {held}, above the bound {most_held}"
    );
    let survivor_admitted = runtime.block_on(async {
        let client = Client::connect(&[addr], leasing(&certs)).await.unwrap();
        let admitted = drain(&client, "hot", limit, 20, 2_000).await;
        // Denials come only once its own lease is empty, so this is normally 0.
        let held = client.token_lease_stats().unwrap().held;
        client.close().await;
        admitted + held
    });
    println!(
        "crashed gateway admitted {crashed_admitted} and stranded {held}; the survivor admitted {survivor_admitted}"
    );
    assert_eq!(
        crashed_admitted + held + survivor_admitted,
        400,
        "every token is admitted or stranded in the crashed lease, none twice"
    );
    runtime.block_on(node.shutdown());
}

/// Waits (bounded: `PATIENCE`) until `node` counts `owners` slot owners.
async fn converge(node: &floodgate_node::Node, owners: usize) {
    let mut tables = node.watch_slot_table();
    let reached = tokio::time::timeout(PATIENCE, async {
        while tables.borrow_and_update().nodes().len() != owners {
            tables.changed().await.unwrap();
        }
    })
    .await;
    assert!(
        reached.is_ok(),
        "{} never saw {owners} owners",
        node.node_id()
    );
}

/// Two nodes, three gateways, two hot keys, one owned by each node: each key is leased from its
/// owner, and no key admits more than its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_each_hot_key_is_leased_from_its_owner_and_held_to_its_limit() {
    let certs = certs();
    let first = start_node(&certs, any_port(), false).await;
    let mut config = floodgate_node::NodeConfig::for_tests(&certs.dev);
    config.cluster.seeds = vec![first.local_addr().into()];
    let second = floodgate_node::Node::start(config).await.unwrap();
    converge(&first, 2).await;
    converge(&second, 2).await;
    let limit = per_day(300);
    let mut connected = Vec::new();
    for _ in 0..3 {
        let client = Client::connect(&[first.local_addr()], leasing(&certs))
            .await
            .unwrap();
        connected.push(client);
    }
    // One hot key on each node (a node grants only the keys it decides).
    let router = &connected[0];
    assert!(
        router.slot_table().is_some(),
        "the client has the cluster's table"
    );
    let on = |addr| {
        (0..1_000)
            .map(|i| format!("hot:{i}"))
            .find(|k| router.node_for(k.as_bytes()) == addr)
            .unwrap()
    };
    let keys = vec![on(first.local_addr()), on(second.local_addr())];
    let mut gateways = tokio::task::JoinSet::new();
    for client in connected {
        let keys = keys.clone();
        gateways.spawn(async move {
            let mut admitted = vec![0u64; keys.len()];
            for round in 0..400 {
                let key = round % keys.len();
                let verdicts = client
                    .check(&[Check::new(keys[key].as_str(), limit)])
                    .await
                    .unwrap();
                admitted[key] += u64::from(verdicts[0].is_allowed());
            }
            (admitted, client)
        });
    }
    let mut admitted = vec![0u64; keys.len()];
    let mut clients = Vec::new();
    while let Some(done) = gateways.join_next().await {
        let (counts, client) = done.unwrap();
        for (total, count) in admitted.iter_mut().zip(counts) {
            *total += count;
        }
        clients.push(client);
    }
    let stats: Vec<TokenLeaseStats> = clients
        .iter()
        .map(|c| c.token_lease_stats().unwrap())
        .collect();
    println!("admitted per key {admitted:?} (limit 300 each); {stats:?}");
    for (key, count) in keys.iter().zip(&admitted) {
        assert!(
            *count <= 300,
            "{key}: admitted {count} over its limit of 300"
        );
    }
    let held: u64 = stats.iter().map(|s| s.held).sum();
    let total: u64 = admitted.iter().sum();
    assert!(total + held <= 600, "admitted {total} and {held} held");
    assert!(stats.iter().any(|s| s.local_allowed > 0), "{stats:?}");
    for client in &clients {
        client.close().await;
    }
    second.shutdown().await;
    first.shutdown().await;
}

/// A gateway that closes gracefully gives its unused tokens back: the bucket then holds exactly
/// what was not admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_gateway_returns_its_lease() {
    let certs = certs();
    let node = start_node(&certs, any_port(), false).await;
    let limit = per_day(400);
    let client = Client::connect(&[node.local_addr()], leasing(&certs))
        .await
        .unwrap();
    let mut admitted = 0;
    for _ in 0..300 {
        let verdicts = client.check(&[Check::new("hot", limit)]).await.unwrap();
        admitted += u64::from(verdicts[0].is_allowed());
        let stats = client.token_lease_stats().unwrap();
        if stats.local_allowed > 0 && stats.held > 0 && stats.refilling == 0 {
            break;
        }
    }
    let held = client.token_lease_stats().unwrap().held;
    assert!(held > 0, "the gateway never held a lease");
    client.close().await;
    // A client without leases peeks at the bucket (cost 0 consumes nothing).
    let plain = Client::connect(&[node.local_addr()], client_config(&certs))
        .await
        .unwrap();
    let peek = plain
        .check(&[Check::new("hot", limit).cost(0)])
        .await
        .unwrap();
    println!(
        "admitted {admitted}, returned {held} on close: {:?}",
        peek[0]
    );
    assert_eq!(
        peek[0].decision.remaining(),
        400 - admitted,
        "the {held} tokens held came back"
    );
    plain.close().await;
    node.shutdown().await;
}
