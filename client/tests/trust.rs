//! The client verifies each node by name: a seed by the name configured or the address it is
//! dialed at, every member found in the slot table by its node id. Nodes here carry certificates
//! naming their ids (`fg-a.internal`, `fg-b.internal`), never `localhost`. Waits are on table
//! changes, bounded by timeouts.

mod common;
#[path = "../../node/tests/common/pki.rs"]
mod pki;

use std::net::SocketAddr;
use std::time::Duration;

use common::{PATIENCE, any_port, per_hour};
use floodgate::cluster::{MembershipConfig, slot_of};
use floodgate_client::{CaSource, Check, Client, ClientConfig, LinkState, Source};
use floodgate_node::{Node, NodeConfig, TlsConfig};
use pki::TestCa;

/// Starts node `id` on `identity`, joining through `seeds`.
async fn start(
    dev: &floodgate_node::DevCerts,
    ca: &TestCa,
    id: &str,
    names: &[&str],
    seeds: Vec<SocketAddr>,
) -> Node {
    let identity = ca.node(id, names);
    let mut config = NodeConfig::for_tests(dev);
    config.listen = any_port();
    config.tls = TlsConfig {
        cert: identity.cert,
        key: identity.key,
        client_ca: None,
        peer_ca: Some(ca.cert.clone()),
    };
    config.cluster.node_id = Some(id.to_owned());
    config.cluster.seeds = seeds.into_iter().map(Into::into).collect();
    config.cluster.membership = MembershipConfig {
        gossip_interval_ns: 20_000_000,
        suspect_after_ns: 250_000_000,
        dead_after_ns: 500_000_000,
        ..MembershipConfig::default()
    };
    Node::start(config).await.unwrap()
}

async fn converge(node: &Node, owners: usize) {
    let mut tables = node.watch_slot_table();
    let reached = tokio::time::timeout(PATIENCE, async {
        while tables.borrow_and_update().nodes().len() != owners {
            tables.changed().await.unwrap();
        }
    })
    .await;
    assert!(
        reached.is_ok(),
        "{} sees {:?}",
        node.node_id(),
        node.owners()
    );
}

fn config(ca: &TestCa) -> ClientConfig {
    let mut config = ClientConfig::new(CaSource::File(ca.cert.clone()));
    config.timeout = Duration::from_secs(5);
    config.connect_timeout = Duration::from_secs(2);
    config
}

/// Waits until the client links to `n` nodes, all connected.
async fn linked(client: &Client, n: usize) {
    let mut changes = client.table_changes();
    let all = tokio::time::timeout(PATIENCE, async {
        while client.nodes().len() != n {
            assert!(changes.changed().await, "the client closed");
        }
        client.wait_connected().await;
    })
    .await;
    assert!(all.is_ok(), "links: {:?}", client.nodes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_verifies_each_discovered_node_by_its_node_id() {
    let dir = tempfile::tempdir().unwrap();
    let dev = floodgate_node::ensure_dev_certs(&dir.path().join("dev")).unwrap();
    let ca = TestCa::new(dir.path(), "cluster-ca");
    // a is reachable by its IP as a seed; b's certificate names only its id.
    let a = start(
        &dev,
        &ca,
        "fg-a.internal",
        &["fg-a.internal", "127.0.0.1"],
        vec![],
    )
    .await;
    let b = start(
        &dev,
        &ca,
        "fg-b.internal",
        &["fg-b.internal"],
        vec![a.local_addr()],
    )
    .await;
    converge(&a, 2).await;
    converge(&b, 2).await;

    // `floodgate status`: the seed verified by the address it is dialed at.
    let table = floodgate_client::fetch_slot_table(&[a.local_addr()], &config(&ca))
        .await
        .unwrap();
    let ids: Vec<&str> = table.members().iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids.len(), 2, "{ids:?}");

    // Discovery: b is linked and verified as fg-b.internal (its certificate names nothing else).
    let client = Client::connect(&[a.local_addr()], config(&ca))
        .await
        .unwrap();
    linked(&client, 2).await;
    assert!(
        client
            .nodes()
            .iter()
            .all(|n| n.state == LinkState::Connected)
    );
    let key = (0..10_000)
        .map(|i| format!("user:{i}"))
        .find(|k| b.slot_table().owner(slot_of(k.as_bytes())) == Some("fg-b.internal"))
        .unwrap();
    assert_eq!(client.node_for(key.as_bytes()), b.local_addr());
    let verdicts = client.check(&[Check::new(key, per_hour(3))]).await.unwrap();
    assert_eq!(verdicts[0].source, Source::Node);
    assert!(verdicts[0].is_allowed());
    client.close().await;

    // A seed is verified by its address unless a server name is configured.
    let by_address = floodgate_client::fetch_slot_table(&[b.local_addr()], &config(&ca)).await;
    assert!(
        by_address.is_err(),
        "b's certificate does not name 127.0.0.1"
    );
    let mut named = config(&ca);
    named.server_name = Some("fg-b.internal".into());
    let table = floodgate_client::fetch_slot_table(&[b.local_addr()], &named).await;
    assert!(table.is_ok(), "{table:?}");
    b.shutdown().await;
    a.shutdown().await;
}
