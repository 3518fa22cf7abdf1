//! One node's link: what the client and the link's tasks share about the node ([`NodeLink`]),
//! and the supervisor that keeps it connected (reconnecting with backoff) and starts its stream
//! tasks (`stream`).

mod stream;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;

use crate::address::HostPort;
use crate::backoff::Backoff;
use crate::breaker::SharedBreaker;
use crate::config::{BackoffConfig, ClientConfig};
use crate::dial::{connect, describe_connection_error};
use crate::queue::CallQueue;
use crate::status::{LinkState, NodeStatus};
use crate::table_feed::{TableHint, follow_pushes};

/// The link settings every task of every node reads.
#[derive(Debug)]
pub(crate) struct LinkSettings {
    pub(crate) connect_timeout: Duration,
    pub(crate) streams: usize,
    pub(crate) max_checks: usize,
    /// How long a stream waits for a late answer (its callers were answered `Timeout`) before
    /// giving up on the stream: frees a stream stuck on a node that stopped answering on it
    /// while the connection itself looks alive.
    pub(crate) stall_timeout: Duration,
    reconnect: BackoffConfig,
}

impl LinkSettings {
    pub(crate) fn new(config: &ClientConfig) -> Self {
        LinkSettings {
            connect_timeout: config.connect_timeout,
            streams: config.streams_per_connection,
            max_checks: config.max_checks_per_frame,
            stall_timeout: (config.timeout * 4).max(Duration::from_secs(1)),
            reconnect: config.reconnect,
        }
    }
}

/// Everything the client and the link's tasks share about one node.
#[derive(Debug)]
pub(crate) struct NodeLink {
    pub(crate) addr: SocketAddr,
    /// The name the node's certificate must carry (a seed's configured name or host, a
    /// member's node id).
    pub(crate) server_name: String,
    /// A seed given by DNS name: resolved again before every connection attempt (`addr` is
    /// then only what it resolved to first, or the unspecified address if it did not).
    name: Option<HostPort>,
    pub(crate) queue: CallQueue,
    pub(crate) breaker: SharedBreaker,
    /// For those who wait on changes; every call reads `state_now` instead.
    state: watch::Sender<LinkState>,
    /// The same state as a plain atomic: reading a watch takes its lock, and that lock's cache
    /// line then moves between the cores of callers on every call.
    state_now: AtomicU8,
    last_error: Mutex<Option<String>>,
    /// The current connection has answered at least one frame: only then is it healthy enough
    /// to reset the reconnect backoff (a node refusing our certificate completes the handshake
    /// and then closes; without this we would reconnect in a tight loop).
    pub(crate) answered: AtomicBool,
    /// Told the slot-table version of every answer (set once the client routes by tables).
    pub(crate) table_hint: std::sync::OnceLock<Arc<TableHint>>,
    /// The table names this node again after it had stopped owning slots (it left and came
    /// back, as in a restart), and this link has not connected since: the node is up and
    /// decides for the clients connected to it, only this link lags. Cleared on connecting.
    rejoined: AtomicBool,
    /// Cuts a reconnect backoff short (the node is back).
    reconnect_now: tokio::sync::Notify,
    /// The live connection, for one-off requests on their own stream beside the check streams
    /// (concurrency and token leases); `None` while down. The link goes up and down, and a
    /// rejoin looks at it, under this lock, so each sees the others whole. Lock order: this
    /// lock, then the state's watch and `last_error`; never one of those held while taking it.
    connection: Mutex<Option<quinn::Connection>>,
}

impl NodeLink {
    pub(crate) fn new(addr: SocketAddr, config: &ClientConfig) -> Self {
        NodeLink {
            addr,
            server_name: crate::tls::seed_server_name(config.server_name.as_deref(), addr),
            name: None,
            queue: CallQueue::new(config.max_queued_checks, config.max_checks_per_frame / 2),
            breaker: SharedBreaker::new(config.breaker, config.timeout),
            state: watch::Sender::new(LinkState::Connecting),
            state_now: AtomicU8::new(LinkState::Connecting as u8),
            last_error: Mutex::new(None),
            answered: AtomicBool::new(false),
            table_hint: std::sync::OnceLock::new(),
            rejoined: AtomicBool::new(false),
            reconnect_now: tokio::sync::Notify::new(),
            connection: Mutex::new(None),
        }
    }

    /// A link to a seed as given to `connect`, first resolved to `addr`: a name is resolved
    /// again on every connection attempt, and is the default name its certificate must carry.
    pub(crate) fn seed(seed: HostPort, addr: SocketAddr, config: &ClientConfig) -> Self {
        let server_name = config
            .server_name
            .clone()
            .unwrap_or_else(|| seed.host().to_owned());
        let name = seed.socket_addr().is_none().then_some(seed);
        NodeLink {
            name,
            ..NodeLink::new(addr, config).named(server_name)
        }
    }

    /// The same link verifying the node by `server_name` (a member by its node id).
    pub(crate) fn named(mut self, server_name: String) -> Self {
        self.server_name = server_name;
        self
    }

    /// True while the link has a connection (cheap: one watch read).
    pub(crate) fn is_connected(&self) -> bool {
        self.state_now.load(Ordering::Acquire) == LinkState::Connected as u8
    }

    /// See [`NodeLink::mark_rejoined`].
    pub(crate) fn is_rejoined(&self) -> bool {
        self.rejoined.load(Ordering::Relaxed)
    }

    /// The table names this node again after it had left it: until this link connects, a
    /// check the node owns goes through another node, which forwards it, and is not a
    /// takeover (the node is alive; a takeover would make two deciders). Reconnects at once.
    ///
    /// A link still connected whose calls have failed since their last success is taken to
    /// lead to the node's previous life (a crash, then a restart at the same address): the
    /// dead process sent no close, and the new one ends the connection only when one of its
    /// packets arrives (with a reset the node signs with keys its lives share), which a call
    /// already lost waits for, or never when the node's private key changed across the restart.
    /// It is closed, and the link reconnects at once (down from here on, so calls meanwhile are
    /// relayed rather than queued on the closed connection).
    pub(crate) fn mark_rejoined(&self) {
        {
            let mut connection = self.connection.lock();
            let connected = self.is_connected();
            if connected && self.breaker.is_pristine() {
                return;
            }
            self.rejoined.store(true, Ordering::Relaxed);
            // Only the connection still up: one that ended meanwhile is the supervisor's, and
            // a newer one is not the stale one.
            if let Some(stale) = connection.clone().filter(|_| connected) {
                self.take_down(
                    &mut connection,
                    "the node is back in the table and calls on its connection failed: reconnecting"
                        .to_owned(),
                );
                stale.close(0u32.into(), b"node restarted");
            }
        }
        self.reconnect_now.notify_one();
    }

    /// Sets the link's state as its supervisor would (tests that play the link).
    #[cfg(test)]
    pub(crate) fn set_state(&self, state: LinkState) {
        self.set_link_state(state);
    }

    /// The live connection to the node, if any (a clone: requests open their own streams).
    pub(crate) fn connection(&self) -> Option<quinn::Connection> {
        self.connection.lock().clone()
    }

    /// True when the link had a connection and lost it (not while a new link first connects:
    /// its node may be up and deciding for others).
    pub(crate) fn is_down(&self) -> bool {
        self.state_now.load(Ordering::Acquire) == LinkState::Disconnected as u8
    }

    /// Sets the state seen by calls and by those waiting on changes.
    fn set_link_state(&self, state: LinkState) {
        self.state_now.store(state as u8, Ordering::Release);
        self.state.send_replace(state);
    }

    pub(crate) fn status(&self) -> NodeStatus {
        // One lock at a time (see `connection` for their order).
        let transport = (self.connection().as_ref()).map(crate::status::TransportStats::of);
        let state = *self.state.borrow();
        let last_error = self.last_error.lock().clone();
        NodeStatus {
            addr: self.addr,
            state,
            last_error,
            transport,
        }
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<LinkState> {
        self.state.subscribe()
    }

    /// No connection: fail queued calls over and record why. Warns once per outage; repeated
    /// failed reconnect attempts are logged at debug level.
    fn went_down(&self, why: String) {
        let mut connection = self.connection.lock();
        self.take_down(&mut connection, why);
    }

    /// [`NodeLink::went_down`], the connection's lock held.
    fn take_down(&self, connection: &mut Option<quinn::Connection>, why: String) {
        self.queue.set_down();
        *connection = None;
        let state = *self.state.borrow();
        match state {
            LinkState::Disconnected => {
                tracing::debug!(node = %self.addr, "reconnect failed: {why}")
            }
            LinkState::Connecting => {
                tracing::warn!(node = %self.addr, "cannot reach floodgate node: {why}")
            }
            LinkState::Connected => {
                tracing::warn!(node = %self.addr, "lost connection to floodgate node: {why}")
            }
        }
        // The reason first: whoever waits for `Disconnected` may read it at once.
        *self.last_error.lock() = Some(why);
        self.set_link_state(LinkState::Disconnected);
    }

    /// A new connection is up: its calls start afresh, and the node is reached directly.
    fn went_up(&self, conn: &quinn::Connection, generation: u64) {
        let mut connection = self.connection.lock();
        self.answered.store(false, Ordering::Relaxed);
        self.breaker.reset();
        self.queue.set_up(generation);
        *connection = Some(conn.clone());
        self.rejoined.store(false, Ordering::Relaxed);
        self.set_link_state(LinkState::Connected);
    }

    /// The client is closing: like `went_down`, but expected.
    fn closed(&self) {
        let mut connection = self.connection.lock();
        self.queue.set_down();
        *connection = None;
        self.set_link_state(LinkState::Disconnected);
    }
}

/// Resolves when the client is shutting down: the flag was set or every `Client` was dropped.
async fn shutdown_requested(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|&stop| stop).await;
}

/// Times out queued calls nobody takes in time, until shutdown (see [`CallQueue::reap_expired`]).
pub(crate) async fn reap(link: Arc<NodeLink>, mut shutdown: watch::Receiver<bool>) {
    tokio::select! {
        () = shutdown_requested(&mut shutdown) => {}
        () = link.queue.reap_expired() => {}
    }
}

/// Keeps one node connected until shutdown: connect, start the stream tasks, wait for the
/// connection to end, back off, repeat. While no connection is up, calls fail over at once.
pub(crate) async fn supervise(
    link: Arc<NodeLink>,
    endpoint: quinn::Endpoint,
    settings: Arc<LinkSettings>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut backoff = Backoff::new(settings.reconnect);
    let mut generation = 0u64;
    loop {
        let attempt = tokio::select! {
            biased;
            () = shutdown_requested(&mut shutdown) => break,
            attempt = dial(&endpoint, &link, settings.connect_timeout) => attempt,
        };
        match attempt {
            Ok(conn) => {
                generation += 1;
                link.went_up(&conn, generation);
                tracing::info!(node = %link.addr, "connected to floodgate node");
                if let Some(hint) = link.table_hint.get() {
                    // Ends with the connection.
                    tokio::spawn(follow_pushes(conn.clone(), hint.clone(), link.addr));
                }
                for _ in 0..settings.streams {
                    tokio::spawn(stream::run_stream(
                        link.clone(),
                        conn.clone(),
                        generation,
                        settings.clone(),
                    ));
                }
                let ended = tokio::select! {
                    biased;
                    () = shutdown_requested(&mut shutdown) => {
                        conn.close(0u32.into(), b"client closed");
                        break;
                    }
                    ended = conn.closed() => ended,
                };
                if link.answered.load(Ordering::Relaxed) {
                    backoff.reset();
                }
                link.went_down(describe_connection_error(&ended));
            }
            Err(why) => link.went_down(why),
        }
        let delay = backoff.next();
        tokio::select! {
            biased;
            () = shutdown_requested(&mut shutdown) => break,
            () = tokio::time::sleep(delay) => {}
            () = link.reconnect_now.notified() => {}
        }
    }
    link.closed();
    endpoint.close(0u32.into(), b"client closed");
    // Give the close frames a moment to leave, so nodes free the connection at once instead of
    // after their idle timeout; never hold up shutdown for long.
    let _ = tokio::time::timeout(Duration::from_millis(200), endpoint.wait_idle()).await;
}

/// Connects to the link's node: a seed given by name is resolved now (a restarted node may
/// have a new address), the lookup and the handshake each bounded by `timeout`.
async fn dial(
    endpoint: &quinn::Endpoint,
    link: &NodeLink,
    timeout: Duration,
) -> Result<quinn::Connection, String> {
    let addr = match &link.name {
        Some(name) => crate::address::resolve_like(name, link.addr, timeout).await?,
        None => link.addr,
    };
    connect(endpoint, addr, &link.server_name, timeout).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits (bounded: 10 s) until the link is connected by a connection other than `not`.
    async fn connected_anew(link: &NodeLink, not: Option<usize>) -> quinn::Connection {
        let mut states = link.subscribe();
        let connected = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if link.is_connected()
                    && let Some(connection) = link.connection()
                    && Some(connection.stable_id()) != not
                {
                    return connection;
                }
                states.changed().await.unwrap();
            }
        })
        .await;
        connected.expect("the link connects")
    }

    /// A node back in the table while the link still holds a connection: kept while calls on
    /// it succeed (the node did not restart, or the connection is already to its new life),
    /// closed and dialed again at once when calls on it failed since (after a crash and a
    /// restart at the same address it leads to the dead process, which would swallow calls
    /// until the idle timeout).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_node_back_in_the_table_is_dialed_again_when_calls_to_it_failed() {
        let dir = tempfile::tempdir().unwrap();
        let certs = floodgate_node::ensure_dev_certs(dir.path()).unwrap();
        let node = floodgate_node::Node::start(floodgate_node::NodeConfig::for_tests(&certs))
            .await
            .unwrap();
        let config = ClientConfig::with_ca_file(&certs.ca);
        let addr = node.local_addr();
        let link = Arc::new(NodeLink::new(addr, &config));
        let endpoint =
            crate::dial::endpoint_for(addr, crate::tls::quinn_config(&config).unwrap()).unwrap();
        let (stop, stopped) = watch::channel(false);
        let supervisor = tokio::spawn(supervise(
            link.clone(),
            endpoint,
            Arc::new(LinkSettings::new(&config)),
            stopped,
        ));
        let first = connected_anew(&link, None).await;

        link.mark_rejoined();
        assert!(
            first.close_reason().is_none(),
            "a healthy connection is kept"
        );
        assert!(!link.is_rejoined());

        link.breaker.on_failure();
        link.mark_rejoined();
        assert!(
            first.close_reason().is_some(),
            "a connection whose calls failed is closed"
        );
        assert!(link.is_rejoined(), "relayed until the link is back");
        let second = connected_anew(&link, Some(first.stable_id())).await;
        assert!(second.close_reason().is_none());
        assert!(!link.is_rejoined(), "connected again");
        assert!(link.breaker.is_pristine());

        stop.send_replace(true);
        supervisor.await.unwrap();
        node.shutdown().await;
    }
}
