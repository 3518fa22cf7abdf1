//! The running node: start (the endpoint, the parts, the tasks), what tests and the binary ask
//! of it, certificate reload, and graceful shutdown.
//!
//! - `wiring`: the composition root: the node's parts built once, each task handed its own.
//! - `connection`: the accept loop, admission after the handshake, one task per stream
//!   (`Serving`: what a connection's tasks are handed; `Connections`, here: admission, the
//!   buffer budget, peer trust).
//! - `remote`: the other end of a connection: whether it is a peer, which node it is.
//! - `streams`: long-lived bidirectional streams: frames in, answers out (`Answering`).
//! - `peer_messages`: one-way streams: gossip, replicas and hand-offs in; table pushes out
//!   (`PeerMessages`).
//! - `unconfirmed`: a hand-off's unconfirmed region units (kind 25), counted, then answered.
//! - `rlqs_listener`: the `--rlqs-listen` gRPC server around the node's RLQS hub;
//!   `rlqs_handshake`: its connections' TLS handshake and HTTP/2 preface, each by a deadline.
//! - `sweeper`: expired buckets forgotten a slice of a shard at a time, leases a shard at a
//!   time; the stores' counters published (`Swept`).

#[cfg(test)]
mod allocations;
mod connection;
mod peer_messages;
mod remote;
mod rlqs_handshake;
mod rlqs_listener;
mod streams;
mod sweeper;
mod unconfirmed;
mod wiring;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use floodgate::EpochClock;
use floodgate::wire::ErrorCode;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::admission::ConnectionAllowance;
use crate::budget::BufferBudget;
use crate::config::{NodeConfig, NodeLimits};
use crate::metrics::NodeMetrics;
use crate::{admin, cluster, tls};

use connection::accept_loop;
use sweeper::sweep_loop;
use wiring::{Wiring, wire};

/// How long shutdown waits for in-flight work before closing connections regardless.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a graceful stop waits for the other regions to confirm the global units this node
/// admitted.
const REGION_DRAIN_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a leaving node keeps answering after its leave: clients refetch the table at least
/// every second and at once when a link drops, so most have moved on by then.
const LEAVE_LINGER: Duration = Duration::from_millis(300);

/// What every QUIC connection shares: who is admitted (clients and peers counted apart), the
/// node-wide budget of bytes buffered from streams, and who counts as a peer.
#[derive(Debug)]
pub(super) struct Connections {
    /// Client and peer connections, counted apart.
    pub(super) allowance: Arc<ConnectionAllowance>,
    /// Bytes buffered from all streams (and the RLS and RESP fronts' calls), against
    /// `max_buffered_bytes`.
    pub(super) budget: Arc<BufferBudget>,
    /// Who may send peer-only frames (gossip, replicate, forwarded checks); replaced when the
    /// certificates are reloaded.
    pub(super) peer_trust: Arc<parking_lot::RwLock<tls::PeerTrust>>,
    /// Frame sizes and the write timeout.
    pub(super) limits: NodeLimits,
    pub(super) metrics: Arc<NodeMetrics>,
}

impl Connections {
    pub(super) fn new(
        limits: NodeLimits,
        metrics: Arc<NodeMetrics>,
        peer_trust: tls::PeerTrust,
    ) -> Self {
        Connections {
            allowance: Arc::new(ConnectionAllowance::new(
                limits.max_connections,
                limits.max_peer_connections,
                metrics.connections.clone(),
                metrics.peer_connections.clone(),
            )),
            budget: Arc::new(BufferBudget::new(limits.max_buffered_bytes)),
            peer_trust: Arc::new(parking_lot::RwLock::new(peer_trust)),
            limits,
            metrics,
        }
    }
}

/// A running node. Dropping it without [`Node::shutdown`] aborts its tasks.
#[derive(Debug)]
pub struct Node {
    local_addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    shutdown: watch::Sender<bool>,
    tasks: JoinSet<()>,
    endpoint: quinn::Endpoint,
    /// The node's parts, as built at start.
    wiring: Wiring,
    snapshots: Option<Arc<crate::snapshot::Snapshots>>,
    /// `--rls-listen`: the bound address and the configuration in force.
    rls: Option<(SocketAddr, Arc<crate::rls::RlsConfigHandle>)>,
    /// `--rlqs-listen`: the bound address.
    rlqs: Option<SocketAddr>,
    /// `--resp-listen`: the bound address.
    resp: Option<SocketAddr>,
}

impl Node {
    /// Binds the endpoint and the configured listeners (admin, RLS, RLQS, RESP), restores the
    /// snapshots of `--state-dir`, and starts serving.
    pub async fn start(config: NodeConfig) -> anyhow::Result<Node> {
        config.limits.validate()?;
        if let Some(id) = &config.cluster.node_id {
            crate::node_id::validate_node_id(id).context("--node-id")?;
            tls::check_own_certificate(&config.tls, id)?;
        }
        let peer_trust = tls::PeerTrust::new(&config.tls)?;
        let endpoint = bind_endpoint(&config)?;
        let local_addr = endpoint.local_addr()?;
        let (wiring, snapshots) = wire(config, &endpoint, local_addr, peer_trust)?;
        let checks = &wiring.checks;
        if let Some(snapshots) = &snapshots {
            // Before the first check is served: a restored daily quota counts from the start.
            snapshots.load(&checks.store, &checks.clock, &checks.metrics);
        }
        let (shutdown, shutdown_rx) = watch::channel(false);
        let mut tasks = JoinSet::new();
        if let Some(snapshots) = &snapshots {
            tasks.spawn(crate::snapshot::run(
                snapshots.clone(),
                checks.store.clone(),
                checks.clock,
                checks.metrics.clone(),
                shutdown_rx.clone(),
            ));
        }
        let Fronts {
            admin_addr,
            rls,
            rlqs,
            resp,
        } = start_fronts(&wiring, &shutdown_rx, &mut tasks).await?;
        spawn_background(&wiring, &endpoint, shutdown_rx, &mut tasks);
        tracing::info!(%local_addr, ?admin_addr, "floodgate node listening");
        Ok(Node {
            local_addr,
            admin_addr,
            shutdown,
            tasks,
            endpoint,
            wiring,
            snapshots,
            rls,
            rlqs,
            resp,
        })
    }

    /// The RESP (Redis protocol) address, when started with `--resp-listen`.
    pub fn resp_addr(&self) -> Option<SocketAddr> {
        self.resp
    }

    /// The QUIC address clients connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The admin HTTP address, when enabled.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// The RLS (Envoy rate limit service) address, when started with `--rls-listen`.
    pub fn rls_addr(&self) -> Option<SocketAddr> {
        self.rls.as_ref().map(|(addr, _)| *addr)
    }

    /// The RLQS (Envoy rate limit quota service) address, when started with `--rlqs-listen`.
    pub fn rlqs_addr(&self) -> Option<SocketAddr> {
        self.rlqs
    }

    /// The RLS configuration in force, when started with `--rls-config`.
    pub fn rls_config(&self) -> Option<&Arc<crate::rls::RlsConfigHandle>> {
        self.rls.as_ref().map(|(_, handle)| handle)
    }

    /// Buckets currently held (for tests and status).
    pub fn live_buckets(&self) -> usize {
        self.wiring.checks.store.len()
    }

    /// Bytes the bucket store accounts now, and its budget (7/8 of `max_store_bytes`).
    pub fn store_bytes(&self) -> (usize, usize) {
        (
            self.wiring.checks.store.bytes_used(),
            self.wiring.checks.store.max_bytes(),
        )
    }

    /// Concurrency leases held on this node now, all keys together.
    pub fn leases_held(&self) -> usize {
        self.wiring.checks.leases.held()
    }

    /// The rules in force, when started with `--rules`.
    pub fn rules(&self) -> Option<&Arc<crate::rules::RulesHandle>> {
        self.wiring.rules.as_ref()
    }

    /// This node's id in the cluster.
    pub fn node_id(&self) -> &str {
        &self.wiring.parts.members.me().id
    }

    /// Ids of the members this node currently counts as owners of slots.
    pub fn owners(&self) -> Vec<String> {
        self.wiring.parts.slots.table().nodes().to_vec()
    }

    /// Ids of the members of other regions this node sends its global keys' deltas to: the
    /// owners in each other region's ring, as its membership view says. A member it still sees
    /// joining is not one: units admitted meanwhile never reach it.
    pub fn other_region_owners(&self) -> Vec<String> {
        self.wiring.checks.regions.rings().owners()
    }

    /// Resolves once every one of `ids` (members of other regions) is an owner in its region's
    /// ring as this node sees it, so its global keys' deltas reach each. Knowing a member's
    /// address is not enough: a member seen joining owns nothing yet. The rings follow the
    /// membership's epoch, as the slot table does, so each table published is a moment to look.
    pub async fn reaches(&self, ids: &[&str]) {
        let mut tables = self.watch_slot_table();
        loop {
            tables.borrow_and_update();
            let owners = self.other_region_owners();
            if ids.iter().all(|id| owners.iter().any(|o| o == id)) {
                return;
            }
            if tables.changed().await.is_err() {
                // The node stopped: nothing will change any more.
                return std::future::pending().await;
            }
        }
    }

    /// Why the node is not ready (what `/readyz` answers 503 with), or `None` when it serves
    /// with the cluster: not while shutting down, refused, or (with seeds and without
    /// `--allow-alone`) not joined yet.
    pub fn not_ready_reason(&self) -> Option<String> {
        self.wiring.readiness.not_ready_reason()
    }

    /// Becomes `Some(reason)` if the cluster refused this node (another live node holds its
    /// id); the node then sends no gossip and should be stopped.
    pub fn watch_refusal(&self) -> watch::Receiver<Option<String>> {
        self.wiring.parts.members.watch_refusal()
    }

    /// Resolves once the node has joined a cluster: heard from another member and taken its
    /// real table (at once for a node started without seeds).
    pub async fn joined(&self) {
        self.wiring.parts.slots.joined().await
    }

    /// Resolves once no slot this node gained waits for its hand-off any longer (the hand-off
    /// arrived, or its wait ran out). Until then a version-4 caller's check on such a slot is
    /// answered `try_again`; tests and tools await this instead of retrying.
    pub async fn handoffs_settled(&self) {
        let slots = &self.wiring.parts.slots;
        let all = 0..floodgate::cluster::SLOTS as u16;
        slots.wait_for_handoffs(all, u64::MAX).await
    }

    /// The address this node knows the member `id` at.
    pub fn member_addr(&self, id: &str) -> Option<String> {
        self.wiring.parts.members.addr_of(id)
    }

    /// The highest protocol version every member speaks, as gossip told this node (0: their
    /// ranges share none).
    pub fn cluster_version(&self) -> u8 {
        self.wiring.parts.members.cluster_version()
    }

    /// The inter-region exchange of global keys (its counters, whether all is confirmed).
    pub fn region_sync(&self) -> &Arc<crate::region_sync::RegionSync<EpochClock>> {
        &self.wiring.checks.region_sync
    }

    /// The current slot table.
    pub fn slot_table(&self) -> Arc<floodgate::cluster::SlotTable> {
        self.wiring.parts.slots.table()
    }

    /// Counts buckets merged from peers (replicas and hand-offs); await a change instead of
    /// polling.
    pub fn watch_received_buckets(&self) -> watch::Receiver<u64> {
        self.wiring.parts.replication.watch_received()
    }

    /// Live concurrency leases of `key` (the key bytes a client sends) on this node now:
    /// decided here, or replicas and hand-offs from peers.
    pub fn leases_in_use(&self, key: &[u8]) -> u64 {
        let now_ns = floodgate::Clock::now_ns(&self.wiring.checks.clock);
        let key = floodgate::BucketKey::for_key(key);
        self.wiring.checks.leases.in_use(key, now_ns)
    }

    /// Counts lease sets merged from peers (replicas and hand-offs); await a change instead of
    /// polling.
    pub fn watch_received_lease_sets(&self) -> watch::Receiver<u64> {
        self.wiring.parts.lease_replication.watch_received()
    }

    /// Bytes buffered from all streams now, and the most ever buffered at once (both within
    /// `max_buffered_bytes`).
    pub fn buffered_bytes(&self) -> (usize, usize) {
        (
            self.wiring.connections.budget.used(),
            self.wiring.connections.budget.peak(),
        )
    }

    /// Client and peer connections admitted now.
    pub fn connection_counts(&self) -> (usize, usize) {
        (
            self.wiring.connections.allowance.clients(),
            self.wiring.connections.allowance.peers(),
        )
    }

    /// The admitted (clients, peers) connections, as they change (await instead of polling).
    pub fn watch_connection_counts(&self) -> watch::Receiver<(usize, usize)> {
        self.wiring.connections.allowance.watch_counts()
    }

    /// Every new slot table, as it is adopted (await `changed()` instead of polling).
    pub fn watch_slot_table(&self) -> watch::Receiver<Arc<floodgate::cluster::SlotTable>> {
        self.wiring.parts.slots.watch_table()
    }

    /// Reads the certificates, key and CAs again from their files (SIGHUP) and uses them for new
    /// connections, served and dialed; open connections keep theirs. On error nothing changes.
    pub fn reload_tls(&self) -> anyhow::Result<()> {
        let config = &self.wiring.config;
        if let Some(id) = &config.cluster.node_id {
            tls::check_own_certificate(&config.tls, id)?;
        }
        let server = tls::server_config(&config.tls, &config.limits)?;
        let peers = tls::peer_client_configs(&config.tls, &config.limits)?;
        let trust = tls::PeerTrust::new(&config.tls)?;
        self.endpoint.set_server_config(Some(server));
        self.wiring.parts.peers.set_configs(peers);
        *self.wiring.connections.peer_trust.write() = trust;
        tracing::info!("certificates reloaded");
        Ok(())
    }

    /// Stops abruptly, as a crash would: no leave, no hand-off, no drain.
    pub fn crash(mut self) {
        self.tasks.abort_all();
        self.endpoint.close(quinn::VarInt::from_u32(0), b"");
    }

    /// Graceful stop: leave, wait (bounded) for the other regions to confirm the global units
    /// admitted here, refuse new connections, answer every frame already received, finish each
    /// stream, close connections with `ShuttingDown`, and wait (bounded) for peers to see it.
    pub async fn shutdown(mut self) {
        self.wiring.readiness.shutting_down();
        // Leave first: peers stop routing here and receive our buckets before we stop answering.
        // Then keep answering (forwarding to the new owners) while clients fetch the new table.
        self.wiring.cluster.leave().await;
        if !self.wiring.parts.slots.table().nodes().is_empty() {
            tokio::time::sleep(LEAVE_LINGER).await;
        }
        // Global units admitted here and not yet confirmed by the other regions would be lost
        // to them with this session: send them now and wait (bounded) for the acknowledgements,
        // while the sender task and the peer endpoint still run.
        let unconfirmed = self
            .wiring
            .checks
            .region_sync
            .drain(REGION_DRAIN_TIMEOUT)
            .await;
        if unconfirmed > 0 {
            tracing::warn!(
                units = unconfirmed,
                "shutdown: global units admitted here were not confirmed by every other region \
                 within {REGION_DRAIN_TIMEOUT:?}; those regions will not count them"
            );
        }
        let _ = self.shutdown.send(true);
        let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!("shutdown: in-flight work did not finish within {DRAIN_TIMEOUT:?}");
            self.tasks.abort_all();
        }
        // Every received check has been answered: the last snapshot holds all of them.
        if let Some(snapshots) = &self.snapshots {
            let checks = &self.wiring.checks;
            crate::snapshot::snapshot_once(snapshots, &checks.store, checks.clock, &checks.metrics)
                .await;
        }
        self.endpoint.close(
            quinn::VarInt::from_u32(ErrorCode::ShuttingDown as u32),
            b"node shutting down",
        );
        let _ = tokio::time::timeout(DRAIN_TIMEOUT, self.endpoint.wait_idle()).await;
        tracing::info!(addr = %self.local_addr, "floodgate node stopped");
    }
}

/// The QUIC endpoint on `--listen`: as `Endpoint::server`, with the node's endpoint settings.
fn bind_endpoint(config: &NodeConfig) -> anyhow::Result<quinn::Endpoint> {
    let server_config = tls::server_config(&config.tls, &config.limits)?;
    let socket = std::net::UdpSocket::bind(config.listen)
        .with_context(|| format!("binding the QUIC endpoint on {}", config.listen))?;
    // The node's id, which every life of it has, so a restarted node can reset its previous
    // life's connections; none when it is an ephemeral port's address.
    let cluster = &config.cluster;
    let ephemeral =
        config.listen.port() == 0 && cluster.node_id.is_none() && cluster.advertise.is_none();
    let bound = socket.local_addr()?;
    let stable_as = (!ephemeral).then(|| crate::cluster::me_at(cluster, bound).id);
    quinn::Endpoint::new(
        tls::endpoint_config(&config.tls, stable_as.as_deref())?,
        Some(server_config),
        socket,
        Arc::new(floodgate_udp_runtime::ReadInterestRuntime),
    )
    .with_context(|| format!("starting the QUIC endpoint on {}", config.listen))
}

/// The listeners beside the QUIC endpoint, each `None` when not configured.
struct Fronts {
    /// `--admin`: the bound address.
    admin_addr: Option<SocketAddr>,
    /// `--rls-listen`: the bound address and the configuration in force.
    rls: Option<(SocketAddr, Arc<crate::rls::RlsConfigHandle>)>,
    /// `--rlqs-listen`: the bound address.
    rlqs: Option<SocketAddr>,
    /// `--resp-listen`: the bound address.
    resp: Option<SocketAddr>,
}

/// Binds the configured listeners, in this order: admin, RLS, RLQS (which needs the RLS
/// configuration), RESP; their tasks go into `tasks`.
async fn start_fronts(
    wiring: &Wiring,
    shutdown: &watch::Receiver<bool>,
    tasks: &mut JoinSet<()>,
) -> anyhow::Result<Fronts> {
    let config = &wiring.config;
    let admin_addr = match config.admin {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding the admin server on {addr}"))?;
            let admin_addr = listener.local_addr()?;
            let readiness = wiring.readiness.clone();
            tasks.spawn(admin::serve(listener, readiness, shutdown.clone()));
            Some(admin_addr)
        }
        None => None,
    };
    let rls = match config.rls.clone() {
        Some(settings) => {
            let rls = crate::rls::start(wiring.front(), &settings, shutdown.clone(), tasks);
            Some(rls.await?)
        }
        None => None,
    };
    let rlqs = match (config.rlqs.clone(), &rls) {
        (Some(settings), Some((_, handle))) => Some(
            rlqs_listener::start(
                wiring.rlqs.clone(),
                config,
                &settings,
                handle.clone(),
                shutdown.clone(),
                tasks,
            )
            .await?,
        ),
        (Some(_), None) => anyhow::bail!(
            "--rlqs-listen needs --rls-config PATH: the RLQS limits come from the RLS configuration"
        ),
        (None, _) => None,
    };
    let resp = match config.resp.clone() {
        Some(settings) => {
            Some(crate::resp::start(wiring.front(), settings, shutdown.clone(), tasks).await?)
        }
        None => None,
    };
    Ok(Fronts {
        admin_addr,
        rls,
        rlqs,
        resp,
    })
}

/// The node's own tasks, until `shutdown`: accepting QUIC connections, the sweeper, RLQS and
/// metrics upkeep, the rules file's watch, the region exchange and the cluster's.
fn spawn_background(
    wiring: &Wiring,
    endpoint: &quinn::Endpoint,
    shutdown: watch::Receiver<bool>,
    tasks: &mut JoinSet<()>,
) {
    tasks.spawn(accept_loop(
        endpoint.clone(),
        wiring.serving(),
        shutdown.clone(),
    ));
    tasks.spawn(sweep_loop(wiring.swept(), shutdown.clone()));
    tasks.spawn(crate::rlqs::upkeep(
        wiring.rlqs.clone(),
        wiring.config.limits.max_frame_bytes,
        shutdown.clone(),
    ));
    tasks.spawn(crate::metrics::upkeep_loop(shutdown.clone()));
    if let Some(rules) = &wiring.rules {
        tasks.spawn(crate::rules::watch_file(rules.clone(), shutdown.clone()));
    }
    let parts = &wiring.parts;
    let links = Arc::new(crate::region_links::PeerLinks {
        members: parts.members.clone(),
        peers: parts.peers.clone(),
    });
    let sync = wiring.checks.region_sync.clone();
    let sync_shutdown = shutdown.clone();
    tasks.spawn(async move { sync.run(links, sync_shutdown).await });
    tasks.spawn(crate::region_links::follow_rings(
        wiring.checks.region_sync.clone(),
        parts.slots.clone(),
        parts.regions.clone(),
        wiring.checks.clock,
        shutdown.clone(),
    ));
    tasks.spawn(cluster::run(wiring.cluster.clone(), shutdown));
}
