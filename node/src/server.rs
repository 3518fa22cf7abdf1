//! The running node: the QUIC endpoint's accept loop, one task per connection and per stream,
//! the expiry sweeper, the admin server, and graceful shutdown.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use floodgate::wire::{ErrorCode, HEADER_BYTES};
use floodgate::{BucketStore, Clock};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::admission::{Allowance, Handshake};
use crate::budget::{BudgetedReader, BufferBudget};
use crate::clock::NodeClock;
use crate::cluster::Cluster;
use crate::config::NodeConfig;
use crate::metrics::NodeMetrics;
use crate::service::{answer_frame, encode_error};
use crate::state::{Shared, not_ready_reason};
use crate::{admin, cluster, forward, tls};
use floodgate::wire::{
    Frame, FrameKind, Replicated, decode_gossip, decode_id_conflict, decode_replicate,
};

/// How long shutdown waits for in-flight work before closing connections regardless.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a leaving node keeps answering after its leave: clients refetch the table at least
/// every second and at once when a link drops, so most have moved on by then.
const LEAVE_LINGER: Duration = Duration::from_millis(300);
/// Longest one slot-table push to a client may take.
const PUSH_TIMEOUT: Duration = Duration::from_secs(1);
/// How often idle buckets are swept (a fraction of the shards each time).
const SWEEP_INTERVAL: Duration = Duration::from_millis(250);

/// A running node. Dropping it without [`Node::shutdown`] aborts its tasks.
#[derive(Debug)]
pub struct Node {
    local_addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    shutdown: watch::Sender<bool>,
    tasks: JoinSet<()>,
    endpoint: quinn::Endpoint,
    shared: Arc<Shared>,
    snapshots: Option<Arc<crate::snapshot::Snapshots>>,
    /// `--rls-listen`: the bound address and the configuration in force.
    rls: Option<(SocketAddr, Arc<crate::rls::RlsConfigHandle>)>,
}

impl Node {
    /// Binds the endpoint (and the admin server, if configured) and starts serving.
    pub async fn start(config: NodeConfig) -> anyhow::Result<Node> {
        config.limits.validate()?;
        if let Some(id) = &config.cluster.node_id {
            crate::node_id::validate_node_id(id).context("--node-id")?;
            tls::check_own_certificate(&config.tls, id)?;
        }
        let peer_trust = tls::PeerTrust::new(&config.tls)?;
        let server_config = tls::server_config(&config.tls, &config.limits)?;
        let endpoint = quinn::Endpoint::server(server_config, config.listen)
            .with_context(|| format!("binding the QUIC endpoint on {}", config.listen))?;
        let local_addr = endpoint.local_addr()?;
        let store = BucketStore::new(config.store)?;
        let snapshots = config
            .state_dir
            .as_deref()
            .map(crate::snapshot::Snapshots::open)
            .transpose()?;
        let rules = config
            .rules
            .as_deref()
            .map(crate::rules::RulesHandle::load)
            .transpose()?;
        let clock = NodeClock::new();
        let peer_config = tls::peer_client_configs(&config.tls)?;
        let metrics = NodeMetrics::register();
        let store = Arc::new(store);
        let cluster = Arc::new(
            Cluster::new(
                config.cluster.clone(),
                local_addr,
                endpoint.clone(),
                peer_config,
                store.clone(),
                clock,
                metrics.cluster(),
            )
            .with_frame_limit(config.limits.max_frame_bytes),
        );
        let allowance = Arc::new(Allowance::new(
            config.limits.max_connections,
            config.limits.max_peer_connections,
            metrics.connections.clone(),
            metrics.peer_connections.clone(),
        ));
        let shared = Arc::new(Shared {
            store,
            clock,
            metrics,
            allowance,
            budget: BufferBudget::new(config.limits.max_buffered_bytes),
            ready: AtomicBool::new(true),
            cluster,
            rules,
            received: watch::Sender::new(0),
            peer_trust: parking_lot::RwLock::new(peer_trust),
            config,
        });
        if let Some(snapshots) = &snapshots {
            // Before the first check is served: a restored daily quota counts from the start.
            snapshots.load(&shared);
        }
        let (shutdown, shutdown_rx) = watch::channel(false);
        let mut tasks = JoinSet::new();
        if let Some(snapshots) = &snapshots {
            tasks.spawn(crate::snapshot::run(
                snapshots.clone(),
                shared.clone(),
                shutdown_rx.clone(),
            ));
        }
        let admin_addr = match shared.config.admin {
            Some(addr) => {
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("binding the admin server on {addr}"))?;
                let admin_addr = listener.local_addr()?;
                tasks.spawn(admin::serve(listener, shared.clone(), shutdown_rx.clone()));
                Some(admin_addr)
            }
            None => None,
        };
        let rls = match shared.config.rls.clone() {
            Some(settings) => {
                let rls =
                    crate::rls::start(shared.clone(), &settings, shutdown_rx.clone(), &mut tasks);
                Some(rls.await?)
            }
            None => None,
        };
        tasks.spawn(accept_loop(
            endpoint.clone(),
            shared.clone(),
            shutdown_rx.clone(),
        ));
        tasks.spawn(sweep_loop(shared.clone(), shutdown_rx.clone()));
        if let Some(rules) = &shared.rules {
            tasks.spawn(crate::rules::watch_file(rules.clone(), shutdown_rx.clone()));
        }
        tasks.spawn(cluster::run(shared.cluster.clone(), shutdown_rx));
        tracing::info!(%local_addr, ?admin_addr, "floodgate node listening");
        Ok(Node {
            local_addr,
            admin_addr,
            shutdown,
            tasks,
            endpoint,
            shared,
            snapshots,
            rls,
        })
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

    /// The RLS configuration in force, when started with `--rls-config`.
    pub fn rls_config(&self) -> Option<&Arc<crate::rls::RlsConfigHandle>> {
        self.rls.as_ref().map(|(_, handle)| handle)
    }

    /// Buckets currently held (for tests and status).
    pub fn live_buckets(&self) -> usize {
        self.shared.store.len()
    }

    /// The rules in force, when started with `--rules`.
    pub fn rules(&self) -> Option<&Arc<crate::rules::RulesHandle>> {
        self.shared.rules.as_ref()
    }

    /// This node's id in the cluster.
    pub fn node_id(&self) -> &str {
        &self.shared.cluster.me.id
    }

    /// Ids of the members this node currently counts as owners of slots.
    pub fn owners(&self) -> Vec<String> {
        self.shared.cluster.table().nodes().to_vec()
    }

    /// Why the node is not ready (what `/readyz` answers 503 with), or `None` when it serves
    /// with the cluster: not while shutting down, refused, or (with seeds) not joined yet.
    pub fn not_ready_reason(&self) -> Option<String> {
        not_ready_reason(&self.shared)
    }

    /// Becomes `Some(reason)` if the cluster refused this node (another live node holds its
    /// id); the node then sends no gossip and should be stopped.
    pub fn watch_refusal(&self) -> watch::Receiver<Option<String>> {
        self.shared.cluster.watch_refusal()
    }

    /// Resolves once the node has joined a cluster: heard from another member and taken its
    /// real table (at once for a node started without seeds).
    pub async fn joined(&self) {
        self.shared.cluster.joined().await
    }

    /// The address this node knows the member `id` at.
    pub fn member_addr(&self, id: &str) -> Option<String> {
        self.shared.cluster.addr_of(id)
    }

    /// The current slot table.
    pub fn slot_table(&self) -> Arc<floodgate::cluster::SlotTable> {
        self.shared.cluster.table()
    }

    /// Counts buckets merged from peers (replicas and hand-offs); await a change instead of
    /// polling.
    pub fn watch_received_buckets(&self) -> watch::Receiver<u64> {
        self.shared.received.subscribe()
    }

    /// Bytes buffered from all streams now, and the most ever buffered at once (both within
    /// `max_buffered_bytes`).
    pub fn buffered_bytes(&self) -> (usize, usize) {
        (self.shared.budget.used(), self.shared.budget.peak())
    }

    /// Client and peer connections admitted now.
    pub fn connection_counts(&self) -> (usize, usize) {
        (
            self.shared.allowance.clients(),
            self.shared.allowance.peers(),
        )
    }

    /// The admitted (clients, peers) connections, as they change (await instead of polling).
    pub fn watch_connection_counts(&self) -> watch::Receiver<(usize, usize)> {
        self.shared.allowance.watch_counts()
    }

    /// Every new slot table, as it is adopted (await `changed()` instead of polling).
    pub fn watch_slot_table(&self) -> watch::Receiver<Arc<floodgate::cluster::SlotTable>> {
        self.shared.cluster.watch_table()
    }

    /// Reads the certificates, key and CAs again from their files (SIGHUP) and uses them for new
    /// connections, served and dialed; open connections keep theirs. On error nothing changes.
    pub fn reload_tls(&self) -> anyhow::Result<()> {
        let config = &self.shared.config;
        if let Some(id) = &config.cluster.node_id {
            tls::check_own_certificate(&config.tls, id)?;
        }
        let server = tls::server_config(&config.tls, &config.limits)?;
        let peers = tls::peer_client_configs(&config.tls)?;
        let trust = tls::PeerTrust::new(&config.tls)?;
        self.endpoint.set_server_config(Some(server));
        self.shared.cluster.peers.set_configs(peers);
        *self.shared.peer_trust.write() = trust;
        tracing::info!("certificates reloaded");
        Ok(())
    }

    /// Stops abruptly, as a crash would: no leave, no hand-off, no drain.
    pub fn crash(mut self) {
        self.tasks.abort_all();
        self.endpoint.close(quinn::VarInt::from_u32(0), b"");
    }

    /// Graceful stop: refuse new connections, answer every frame already received, finish each
    /// stream, close connections with `ShuttingDown`, and wait (bounded) for peers to see it.
    pub async fn shutdown(mut self) {
        self.shared.ready.store(false, Ordering::Relaxed);
        // Leave first: peers stop routing here and receive our buckets before we stop answering.
        // Then keep answering (forwarding to the new owners) while clients fetch the new table.
        self.shared.cluster.leave().await;
        if !self.shared.cluster.table().nodes().is_empty() {
            tokio::time::sleep(LEAVE_LINGER).await;
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
            crate::snapshot::snapshot_once(snapshots, &self.shared).await;
        }
        self.endpoint.close(
            quinn::VarInt::from_u32(ErrorCode::ShuttingDown as u32),
            b"node shutting down",
        );
        let _ = tokio::time::timeout(DRAIN_TIMEOUT, self.endpoint.wait_idle()).await;
        tracing::info!(addr = %self.local_addr, "floodgate node stopped");
    }
}

async fn accept_loop(
    endpoint: quinn::Endpoint,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut connections = JoinSet::new();
    loop {
        let incoming = tokio::select! {
            incoming = endpoint.accept() => incoming,
            _ = shutdown.changed() => break,
        };
        let Some(incoming) = incoming else { break };
        let Some(handshake) = shared.allowance.start_handshake() else {
            shared.metrics.connections_refused.increment(1);
            incoming.refuse();
            continue;
        };
        // Reap finished connection tasks so the set stays bounded by live connections.
        while connections.try_join_next().is_some() {}
        connections.spawn(serve_connection(
            incoming,
            handshake,
            shared.clone(),
            shutdown.clone(),
        ));
    }
    while connections.join_next().await.is_some() {}
}

async fn serve_connection(
    incoming: quinn::Incoming,
    handshake: Handshake,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    let connection = match incoming.await {
        Ok(connection) => connection,
        Err(e) => {
            tracing::debug!("handshake failed: {e}");
            return;
        }
    };
    let remote = Remote {
        connection: connection.clone(),
        peer: Arc::new(OnceLock::new()),
        certified: Arc::default(),
    };
    // Peers are counted apart from clients: only a node certificate of the peer CA is one.
    let peer = remote.is_peer(&shared);
    let Some(_admitted) = shared.allowance.admit(handshake, peer) else {
        shared.metrics.connections_refused.increment(1);
        let side = if peer { "peer" } else { "client" };
        connection.close(
            quinn::VarInt::from_u32(ErrorCode::Overloaded as u32),
            format!("too many {side} connections: retry later").as_bytes(),
        );
        return;
    };
    let mut streams = JoinSet::new();
    let subscribed = Arc::new(AtomicBool::new(false));
    loop {
        let accepted = tokio::select! {
            accepted = connection.accept_bi() => accepted.map(Some),
            accepted = connection.accept_uni() => accepted.map(|recv| {
                // Finished tasks count until joined: gossip and replication use one stream per
                // message, so without this a quiet connection would drop every message after 256.
                while streams.try_join_next().is_some() {}
                if streams.len() < 256 {
                    let from = UniSender {
                        remote: remote.clone(),
                        subscribed: subscribed.clone(),
                    };
                    streams.spawn(serve_uni_message(recv, from, shared.clone(), shutdown.clone()));
                }
                None
            }),
            _ = shutdown.changed() => break,
        };
        match accepted {
            Ok(Some((send, recv))) => {
                while streams.try_join_next().is_some() {}
                let remote = remote.clone();
                streams.spawn(serve_stream(
                    send,
                    recv,
                    remote,
                    shared.clone(),
                    shutdown.clone(),
                ));
            }
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(peer = %connection.remote_address(), "connection ended: {e}");
                break;
            }
        }
    }
    // Let every stream answer what it has received, then tell the peer why we are closing.
    while streams.join_next().await.is_some() {}
    if *shutdown.borrow() {
        connection.close(
            quinn::VarInt::from_u32(ErrorCode::ShuttingDown as u32),
            b"node shutting down",
        );
    }
}

/// The other end of a connection, and whether it is a peer.
#[derive(Clone)]
struct Remote {
    connection: quinn::Connection,
    /// Decided on first need, not at accept: a server's connection is up before the client's
    /// certificate has arrived, but not before a stream from it has.
    peer: Arc<OnceLock<bool>>,
    /// The last node id its certificate was verified to carry.
    certified: Arc<parking_lot::Mutex<Option<String>>>,
}

impl Remote {
    /// True when the connection's certificate is a node's from the peer CA.
    fn is_peer(&self, shared: &Shared) -> bool {
        *self.peer.get_or_init(|| {
            let identity = self.connection.peer_identity();
            shared.peer_trust.read().is_peer(identity)
        })
    }

    /// True when the connection's certificate is a node certificate for node `id`.
    fn certified_as(&self, shared: &Shared, id: &str) -> bool {
        let mut certified = self.certified.lock();
        if certified.as_deref() == Some(id) {
            return true;
        }
        let identity = self.connection.peer_identity();
        let names = shared.peer_trust.read().names(identity, id);
        if names {
            *certified = Some(id.to_owned());
        }
        names
    }

    /// Refuses a peer-only frame from a non-peer: closes the connection with `forbidden`, the
    /// payload unread.
    fn forbid(&self, shared: &Shared, kind: FrameKind) {
        shared.metrics.frame_error(ErrorCode::Forbidden);
        tracing::warn!(
            remote = %self.connection.remote_address(),
            "closing a connection that sent {kind:?} frames without a peer certificate"
        );
        self.connection.close(
            quinn::VarInt::from_u32(ErrorCode::Forbidden as u32),
            format!("forbidden: {kind:?} frames are for peers with a certificate from the peer CA")
                .as_bytes(),
        );
    }
}

/// Serves one long-lived stream: reads whatever bytes arrive, answers every complete frame, and
/// writes all answers of one read at once.
async fn serve_stream(
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    remote: Remote,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    // Buffered bytes are reserved from the node-wide budget; quinn's chunks are read directly,
    // so a stream holds no read buffer of its own.
    let mut reader = BudgetedReader::new(&shared.budget, shared.config.limits.max_frame_bytes);
    let mut out = Vec::new();
    loop {
        let read = tokio::select! {
            read = recv.read_chunk(crate::budget::READ_BYTES, true) => read,
            _ = shutdown.changed() => {
                // Everything read so far has been answered (answers are written before the next
                // read), so finishing here drops nothing the node accepted. Wait until the peer
                // has the answers (the connection is closed right after), bounded by the drain.
                let _ = send.finish();
                let _ = tokio::time::timeout(Duration::from_millis(250), send.stopped()).await;
                return;
            }
        };
        let fatal = match read {
            Ok(Some(ref chunk)) => match reader.extend(&chunk.bytes) {
                Ok(()) => {
                    let fatal = answer_available(&shared, &remote, &mut reader, &mut out).await;
                    reader.settle();
                    fatal
                }
                Err(e) => {
                    shared.metrics.over_buffer_budget.increment(1);
                    shared.metrics.frame_error(e.code);
                    encode_error(&mut out, e.request_id, e.code, e.message);
                    Some(e.code)
                }
            },
            Ok(None) => reader.finish().err().map(|e| {
                shared.metrics.frame_error(e.code);
                encode_error(&mut out, e.request_id, e.code, e.message);
                e.code
            }),
            Err(_) => return,
        };
        if !out.is_empty() {
            if send.write_all(&out).await.is_err() {
                return;
            }
            out.clear();
        }
        if fatal == Some(ErrorCode::Forbidden) {
            return;
        }
        if let Some(code) = fatal {
            let _ = send.finish();
            let _ = recv.stop(quinn::VarInt::from_u32(code as u32));
            return;
        }
        if matches!(read, Ok(None)) {
            let _ = send.finish();
            return;
        }
    }
}

/// Answers every complete frame in `reader`; returns the code of an error that ends the stream.
async fn answer_available(
    shared: &Shared,
    remote: &Remote,
    reader: &mut BudgetedReader<'_>,
    out: &mut Vec<u8>,
) -> Option<ErrorCode> {
    // One clock read for all frames of this read: checks that arrive together decide at one instant.
    let now_ns = shared.clock.now_ns();
    let started = Instant::now();
    let mut frames = 0;
    let fatal = loop {
        match reader.next_frame() {
            Ok(Some(frame)) if frame.kind.peer_only() && !remote.is_peer(shared) => {
                remote.forbid(shared, frame.kind);
                break Some(ErrorCode::Forbidden);
            }
            Ok(Some(frame)) => {
                frames += 1;
                if let Some(code) = answer(shared, &frame, now_ns, out).await {
                    shared.metrics.frame_error(code);
                }
            }
            Ok(None) => break None,
            Err(e) => {
                shared.metrics.frame_error(e.code);
                encode_error(out, e.request_id, e.code, e.message);
                if e.code.closes_stream() {
                    break Some(e.code);
                }
            }
        }
    };
    if frames > 0 {
        shared
            .metrics
            .frame_seconds
            .record(started.elapsed().as_secs_f64() / f64::from(frames));
    }
    fatal
}

/// Answers one frame received on a bidirectional stream.
async fn answer(
    shared: &Shared,
    frame: &Frame,
    now_ns: u64,
    out: &mut Vec<u8>,
) -> Option<ErrorCode> {
    let cluster = &shared.cluster;
    match frame.kind {
        FrameKind::CheckBatch | FrameKind::ForwardedCheckBatch => {
            cluster.wait_until_joined().await;
            let deciding = cluster.deciding();
            let table = cluster.table();
            // Alone (or the last to leave): nobody else owns anything.
            let alone = table.nodes().iter().all(|n| *n == cluster.me.id);
            if !alone {
                drop(deciding);
                // Groups may belong to other nodes, and gained slots may wait for a hand-off.
                forward::answer_check_batch(shared, frame, now_ns, out).await
            } else {
                // A node alone decides everything here, synchronously, with the table held: a
                // node that joins meanwhile receives these decisions in its hand-off.
                let limits = shared.config.limits.wire();
                answer_frame(
                    &shared.store,
                    &limits,
                    &shared.metrics,
                    now_ns,
                    table.version(),
                    frame,
                    out,
                )
            }
        }
        FrameKind::PolicyRequest => {
            crate::rules::answer_policy_request(shared.rules.as_deref(), frame, out)
        }
        FrameKind::TableRequest => {
            cluster.encode_table(out, frame.request_id);
            None
        }
        other => {
            encode_error(
                out,
                frame.request_id,
                ErrorCode::UnknownKind,
                format!("a node does not accept {other:?} frames on this stream"),
            );
            Some(ErrorCode::UnknownKind)
        }
    }
}

/// Who sent a message on a unidirectional stream.
struct UniSender {
    remote: Remote,
    /// The connection already receives table pushes.
    subscribed: Arc<AtomicBool>,
}

/// Handles one message sent on a unidirectional stream: from peers, gossip or buckets; from
/// anyone, a `TableRequest`, which subscribes the connection to table pushes (this task then
/// pushes until the connection or the node ends).
async fn serve_uni_message(
    mut recv: quinn::RecvStream,
    from: UniSender,
    shared: Arc<Shared>,
    shutdown: watch::Receiver<bool>,
) {
    let max = shared.config.limits.max_frame_bytes;
    // The header first: a peer-only kind from a non-peer closes the connection unread.
    let mut header = [0u8; HEADER_BYTES];
    if recv.read_exact(&mut header).await.is_err() {
        return;
    }
    let is_peer = from.remote.is_peer(&shared);
    if let Some(kind) = FrameKind::from_u8(header[3]).filter(|k| k.peer_only())
        && !is_peer
    {
        from.remote.forbid(&shared, kind);
        return;
    }
    // A client may only subscribe (an empty frame): it gets no room for more.
    let readable = if is_peer { max + HEADER_BYTES } else { 64 };
    let (mut reader, _reserved) = match crate::budget::read_message(
        &mut recv,
        &header,
        max,
        readable,
        &shared.budget,
        is_peer,
    )
    .await
    {
        Ok(read) => read,
        Err(over_budget) => {
            if over_budget.is_some() {
                shared.metrics.over_buffer_budget.increment(1);
                let _ = recv.stop(quinn::VarInt::from_u32(ErrorCode::Overloaded as u32));
            }
            return;
        }
    };
    while let Ok(Some(frame)) = reader.next_frame() {
        let now_ns = shared.clock.now_ns();
        match frame.kind {
            FrameKind::TableRequest => {
                if !from.subscribed.swap(true, Ordering::Relaxed) {
                    push_tables(from.remote.connection.clone(), &shared, shutdown.clone()).await;
                }
                return;
            }
            // A peer pushing its table to this node as to any client: nodes keep their own.
            FrameKind::SlotTable if is_peer => {}
            kind if kind.peer_only() && !is_peer => {
                from.remote.forbid(&shared, kind);
                return;
            }
            _ if !is_peer => shared.metrics.frame_error(ErrorCode::UnknownKind),
            FrameKind::Gossip => match decode_gossip(&frame.payload) {
                Ok(gossip) => shared.cluster.handle_gossip(now_ns, &gossip),
                Err((code, _)) => shared.metrics.frame_error(code),
            },
            FrameKind::IdConflict => match decode_id_conflict(&frame.payload) {
                Ok(conflict) => shared.cluster.handle_conflict(&conflict, now_ns),
                Err((code, _)) => shared.metrics.frame_error(code),
            },
            FrameKind::Replicate => match decode_replicate(&frame.payload) {
                Ok(Replicated {
                    from: sender_id,
                    handoff,
                    buckets,
                }) => {
                    // A node speaks only as itself: its hand-offs count as the named node's.
                    if !from.remote.certified_as(&shared, &sender_id) {
                        shared.metrics.frame_error(ErrorCode::Forbidden);
                        tracing::warn!(
                            remote = %from.remote.connection.remote_address(),
                            "dropped a replicate from `{sender_id}`: its certificate names another node"
                        );
                        continue;
                    }
                    let refused = shared.store.merge(&buckets, now_ns);
                    if let Some(part) = &handoff {
                        shared.cluster.handoff_received(&sender_id, part, now_ns);
                    }
                    let counter = if handoff.is_some() {
                        &shared.metrics.received_handoff
                    } else {
                        &shared.metrics.received_replicas
                    };
                    counter.increment((buckets.len() - refused) as u64);
                    shared
                        .received
                        .send_modify(|n| *n += (buckets.len() - refused) as u64);
                }
                Err((code, _)) => shared.metrics.frame_error(code),
            },
            _ => shared.metrics.frame_error(ErrorCode::UnknownKind),
        }
    }
}

/// Sends the slot table on a new unidirectional stream each time it changes, until the
/// connection closes or the node shuts down: clients route by the new table without waiting for
/// an answer to hint at it.
async fn push_tables(
    connection: quinn::Connection,
    shared: &Shared,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut tables = shared.cluster.watch_table();
    tables.borrow_and_update();
    loop {
        tokio::select! {
            changed = tables.changed() => if changed.is_err() { return },
            _ = connection.closed() => return,
            _ = shutdown.changed() => return,
        }
        let mut frame = Vec::new();
        shared.cluster.encode_table(&mut frame, 0);
        let pushed = tokio::time::timeout(PUSH_TIMEOUT, async {
            let mut stream = connection.open_uni().await?;
            stream.write_all(&frame).await?;
            stream.finish()?;
            anyhow::Ok(())
        })
        .await;
        if !matches!(pushed, Ok(Ok(()))) {
            tracing::debug!(peer = %connection.remote_address(), "slot table push failed");
        }
    }
}

/// Forgets expired buckets a few shards at a time and publishes the store's counters.
async fn sweep_loop(shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    let mut ticker = tokio::time::interval(SWEEP_INTERVAL);
    let stats = shared.store.stats();
    let (mut evicted, mut expired, mut refused) = (0, 0, 0);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => return,
        }
        shared.store.sweep_expired(shared.clock.now_ns(), 8);
        shared.metrics.live_buckets.set(shared.store.len() as f64);
        shared
            .metrics
            .buffered_bytes
            .set(shared.budget.used() as f64);
        let publish =
            |counter: &metrics::Counter, total: &std::sync::atomic::AtomicU64, seen: &mut u64| {
                let now = total.load(Ordering::Relaxed);
                counter.increment(now - *seen);
                *seen = now;
            };
        publish(&shared.metrics.evicted, &stats.evicted, &mut evicted);
        publish(&shared.metrics.expired, &stats.expired, &mut expired);
        publish(&shared.metrics.refused_keys, &stats.refused, &mut refused);
    }
}
