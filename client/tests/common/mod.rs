//! End-to-end helpers: a real node with dev certificates in a tempdir, and client configs.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use floodgate::{Limit, NANOS_PER_SEC};
use floodgate_client::{BackoffConfig, ClientAuth, ClientConfig};
use floodgate_node::{DevCerts, Node, NodeConfig, ensure_dev_certs};

/// Development certificates that live as long as the value.
pub struct Certs {
    pub dev: DevCerts,
    _dir: tempfile::TempDir,
}

pub fn certs() -> Certs {
    let dir = tempfile::tempdir().unwrap();
    let dev = ensure_dev_certs(dir.path()).unwrap();
    Certs { dev, _dir: dir }
}

/// Starts a node at `listen` (port 0: any), requiring client certificates when `mtls`.
pub async fn start_node(certs: &Certs, listen: SocketAddr, mtls: bool) -> Node {
    let mut config = NodeConfig::for_tests(&certs.dev);
    config.listen = listen;
    if mtls {
        config.tls.client_ca = Some(certs.dev.client_ca.clone());
    }
    Node::start(config).await.unwrap()
}

/// Starts a node again on the address a stopped node had. `Node::shutdown` returns before
/// quinn's endpoint driver task has released the UDP socket (it exits on its next poll once the
/// last handle is gone), so binding is retried, yielding to the runtime between attempts and
/// bounded by `PATIENCE`; no fixed sleep.
pub async fn restart_node(certs: &Certs, addr: SocketAddr) -> Node {
    let started = tokio::time::Instant::now();
    loop {
        let mut config = NodeConfig::for_tests(&certs.dev);
        config.listen = addr;
        match Node::start(config).await {
            Ok(node) => return node,
            Err(_) if started.elapsed() < PATIENCE => tokio::task::yield_now().await,
            Err(e) => panic!("cannot restart the node on {addr}: {e:#}"),
        }
    }
}

pub fn any_port() -> SocketAddr {
    ([127, 0, 0, 1], 0).into()
}

/// A client configuration trusting the dev CA, with a generous call timeout (these tests check
/// decisions, not latency, on a shared noisy machine) and quick reconnects.
pub fn client_config(certs: &Certs) -> ClientConfig {
    let mut config = ClientConfig::with_ca_file(&certs.dev.ca);
    config.timeout = Duration::from_secs(10);
    config.connect_timeout = Duration::from_secs(5);
    config.reconnect = BackoffConfig {
        initial: Duration::from_millis(10),
        max: Duration::from_millis(100),
    };
    config
}

pub fn with_client_cert(mut config: ClientConfig, certs: &Certs) -> ClientConfig {
    config.client_auth = Some(ClientAuth {
        cert: certs.dev.client_cert.clone(),
        key: certs.dev.client_key.clone(),
    });
    config
}

pub fn per_hour(n: u64) -> Limit {
    Limit::gcra(n, 3_600 * NANOS_PER_SEC, n).unwrap()
}

/// Bound on waits for something that happens in milliseconds unless the code is broken.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// True when every node sees exactly `nodes` as the owners, with one table version.
pub fn converged(nodes: &[&Node]) -> bool {
    let mut ids: Vec<String> = nodes.iter().map(|n| n.node_id().to_owned()).collect();
    ids.sort();
    let version = nodes[0].slot_table().version();
    nodes
        .iter()
        .all(|n| n.owners() == ids && n.slot_table().version() == version)
}
