//! Connections to other nodes: dialed by node id (or as a seed), verified, reused, and the
//! one-way sends and requests every peer message goes through.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use floodgate::cluster::MemberInfo;
use floodgate::wire::{Frame, FrameKind};
use parking_lot::Mutex;

use crate::address::HostPort;

use super::{PEER_TIMEOUT, RESOLVE_TIMEOUT};

/// Most members whose address and last dial failure are remembered (membership is bounded;
/// this only keeps hostile gossip from growing the maps).
const MAX_KNOWN_PEERS: usize = 4_096;

/// Tries of one hand-off frame. A hand-off lost between two live nodes leaves its slots
/// waiting seconds for it and then decided beside the sender, and a leaving node gets no
/// second chance, so a failed delivery is tried again. The receiver takes a repeated part
/// once (parts count by hand-off id, buckets merge), so a retry after a delivery whose
/// acknowledgement was lost costs nothing. Each try is bounded by `PEER_TIMEOUT`.
const HANDOFF_TRIES: u32 = 3;

/// Pause before a hand-off frame's second try (doubling after).
const HANDOFF_RETRY_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);

/// Connections to other nodes, opened on demand and reused.
#[derive(Debug)]
pub(crate) struct Peers {
    endpoint: quinn::Endpoint,
    /// How members (by node id) and seeds (any node of the peer CA) are dialed; replaced when
    /// the certificates are reloaded.
    configs: Mutex<crate::tls::PeerClientConfigs>,
    /// Node id of each member address, from membership: the name a member is dialed and
    /// verified by. An address not in it is a seed.
    ids: Mutex<HashMap<String, String>>,
    /// Keyed by address and the id it was verified as (none: as a seed).
    connections: Mutex<HashMap<(String, Option<String>), quinn::Connection>>,
    /// The last handshake failure logged per address, so a peer that keeps failing is logged
    /// at ERROR once per new reason, not on every gossip round.
    failures: Mutex<HashMap<String, String>>,
    handshake_failures: metrics::Counter,
    /// Handshakes that failed because the peer shares no protocol version with this node.
    version_mismatches: metrics::Counter,
    /// This node's own addresses (advertised, and listened on when specific): a seed name that
    /// resolves to one of them is this node, never dialed.
    own_addrs: Vec<SocketAddr>,
    /// Seed names found to resolve to this node alone (one seed list for every node).
    self_seeds: Mutex<std::collections::HashSet<String>>,
    resolve_failures: metrics::Counter,
}

impl Peers {
    pub(super) fn new(
        endpoint: quinn::Endpoint,
        configs: crate::tls::PeerClientConfigs,
        handshake_failures: metrics::Counter,
        version_mismatches: metrics::Counter,
        own_addrs: Vec<SocketAddr>,
    ) -> Self {
        Peers {
            endpoint,
            configs: Mutex::new(configs),
            ids: Mutex::new(HashMap::new()),
            connections: Mutex::new(HashMap::new()),
            failures: Mutex::new(HashMap::new()),
            handshake_failures,
            version_mismatches,
            own_addrs,
            self_seeds: Mutex::new(std::collections::HashSet::new()),
            resolve_failures: metrics::counter!("floodgate_seed_resolve_failures_total"),
        }
    }

    /// Dials with `configs` from now on (reloaded certificates); open connections stay.
    pub(crate) fn set_configs(&self, configs: crate::tls::PeerClientConfigs) {
        *self.configs.lock() = configs;
    }

    /// Remembers the node id of each member address.
    pub(crate) fn learn_ids<'a>(&self, members: impl Iterator<Item = &'a MemberInfo>) {
        let mut ids = self.ids.lock();
        for member in members {
            if ids.len() >= MAX_KNOWN_PEERS && !ids.contains_key(&member.addr) {
                break;
            }
            if ids.get(&member.addr) != Some(&member.id) {
                ids.insert(member.addr.clone(), member.id.clone());
            }
        }
    }

    async fn connection(&self, addr: &str) -> anyhow::Result<quinn::Connection> {
        let id = self.ids.lock().get(addr).cloned();
        let key = (addr.to_owned(), id);
        if let Some(connection) = self.connections.lock().get(&key)
            && connection.close_reason().is_none()
        {
            return Ok(connection.clone());
        }
        let socket = match (addr.parse::<SocketAddr>(), &key.1) {
            (Ok(socket), _) => socket,
            (Err(_), None) => self.resolve_seed(addr).await?,
            (Err(e), Some(_)) => {
                return Err(e).with_context(|| format!("peer address {addr}"));
            }
        };
        let (config, name) = match &key.1 {
            Some(id) => (
                self.configs.lock().members.clone(),
                crate::tls::server_name_of(id)?,
            ),
            // Any name: the seed verifier checks everything but the name.
            None => (self.configs.lock().seeds.clone(), socket.ip().to_string()),
        };
        let connecting = self.endpoint.connect_with(config, socket, &name)?;
        let connection = match tokio::time::timeout(PEER_TIMEOUT, connecting).await {
            Ok(Ok(connection)) => connection,
            Ok(Err(e)) => {
                self.handshake_failed(addr, key.1.as_deref(), &e);
                return Err(e).with_context(|| format!("handshake with peer {addr}"));
            }
            Err(_) => anyhow::bail!("peer handshake with {addr} timed out"),
        };
        self.failures.lock().remove(addr);
        let mut connections = self.connections.lock();
        if connections.len() >= MAX_KNOWN_PEERS {
            connections.retain(|_, c| c.close_reason().is_none());
        }
        if key.1.is_some() {
            // The member's seed connection, if any, is not needed any more: dropping the last
            // handle closes it once the sends still using it are done.
            connections.remove(&(addr.to_owned(), None));
        }
        connections.insert(key, connection.clone());
        Ok(connection)
    }

    /// Closes the connections kept to `addr`: the member there restarted (see `lives.rs`), and
    /// they lead to its previous life. Sends still on them fail at once instead of at their
    /// timeout; the next send dials the new one.
    pub(crate) fn forget(&self, addr: &str) {
        self.connections.lock().retain(|(to, _), connection| {
            let keep = to != addr;
            if !keep {
                connection.close(0u32.into(), b"peer restarted");
            }
            keep
        });
    }

    /// True when the node at `addr` presents a certificate for node id `id` (its handshake as
    /// that id succeeds within the peer timeout). A fresh connection, kept nowhere: it only
    /// proves who is there.
    pub(crate) async fn proves_id(&self, addr: &str, id: &str) -> bool {
        let (Ok(socket), Ok(name)) = (addr.parse::<SocketAddr>(), crate::tls::server_name_of(id))
        else {
            return false;
        };
        let config = self.configs.lock().members.clone();
        let Ok(connecting) = self.endpoint.connect_with(config, socket, &name) else {
            return false;
        };
        match tokio::time::timeout(PEER_TIMEOUT, connecting).await {
            Ok(Ok(connection)) => {
                connection.close(0u32.into(), b"id proven");
                true
            }
            _ => false,
        }
    }

    /// Resolves a seed given by name, now (each dial: a restarted seed may have a new address),
    /// to its first address that is not this node's. A failure is logged at WARN once per new
    /// reason and counted.
    async fn resolve_seed(&self, seed: &str) -> anyhow::Result<SocketAddr> {
        let resolved = match seed.parse::<HostPort>() {
            Ok(name) => crate::address::resolve(&name, RESOLVE_TIMEOUT).await,
            Err(e) => Err(e),
        };
        let addrs = match resolved {
            Ok(addrs) => addrs,
            Err(reason) => {
                self.resolve_failures.increment(1);
                if self.note_failure(seed, &reason) {
                    tracing::warn!(seed = %seed, "seed not resolved: {reason}");
                }
                anyhow::bail!("seed {seed}: {reason}");
            }
        };
        match addrs.iter().find(|a| !self.own_addrs.contains(a)) {
            Some(addr) => Ok(*addr),
            None => {
                let mut self_seeds = self.self_seeds.lock();
                if self_seeds.len() < MAX_KNOWN_PEERS {
                    self_seeds.insert(seed.to_owned());
                }
                anyhow::bail!("seed {seed} resolves to this node")
            }
        }
    }

    /// Records `reason` as the last failure with `addr`; true when it is a new one (to log).
    fn note_failure(&self, addr: &str, reason: &str) -> bool {
        let mut failures = self.failures.lock();
        if failures.get(addr).map(String::as_str) == Some(reason) {
            return false;
        }
        if failures.len() >= MAX_KNOWN_PEERS {
            failures.clear();
        }
        failures.insert(addr.to_owned(), reason.to_owned());
        true
    }

    /// True when every seed is this node (by address, or by a name resolving to it alone).
    pub(super) fn seeds_are_all_me(&self, seeds: &[HostPort], me: &str) -> bool {
        let self_seeds = self.self_seeds.lock();
        seeds.iter().all(|s| {
            let text = s.to_string();
            text == me || self_seeds.contains(&text)
        })
    }

    /// Logs and counts a failed handshake when it is a mistake between nodes (at ERROR, once per
    /// new reason): a certificate the peer CA does not sign, a name that is not the node id, a
    /// peer that refuses ours. A peer going away (draining, left, restarting) or this node
    /// closing is no mistake: logged at INFO once per new reason, not counted, so a rolling
    /// restart does not fire the alert on the counter.
    fn handshake_failed(&self, addr: &str, id: Option<&str>, error: &quinn::ConnectionError) {
        let mistake = is_handshake_mistake(error);
        if mistake {
            self.handshake_failures.increment(1);
        }
        let reason = error.to_string();
        if !self.note_failure(addr, &reason) {
            tracing::debug!(peer = %addr, "peer handshake failed again: {reason}");
            return;
        }
        let expected = id.unwrap_or("(a seed: any node of the peer CA)");
        if crate::tls::no_shared_version(error) {
            self.version_mismatches.increment(1);
            tracing::error!(
                peer = %addr, node_id = %expected,
                "peer refused: it speaks none of this node's protocol versions {} ({reason}); \
                 upgrade the older of the two (release N works with N-1)",
                floodgate::protocol::SUPPORTED
            );
        } else if mistake {
            tracing::error!(peer = %addr, node_id = %expected, "peer handshake failed: {reason}");
        } else {
            tracing::info!(peer = %addr, node_id = %expected, "peer not reachable (leaving, restarting or gone): {reason}");
        }
    }

    /// Sends one frame on its own unidirectional stream, in the background (replication, id
    /// conflicts: kinds whose layout every version reads). The task ends true once the peer has
    /// the whole frame.
    pub(crate) fn send(
        self: &Arc<Self>,
        addr: String,
        frame: Vec<u8>,
    ) -> tokio::task::JoinHandle<bool> {
        self.send_with(addr, move |_| frame)
    }

    /// As [`Peers::send`], the frame encoded by `encode` for the protocol version the
    /// connection to the peer agreed on (gossip: its layout depends on it).
    pub(crate) fn send_with(
        self: &Arc<Self>,
        addr: String,
        encode: impl FnOnce(u8) -> Vec<u8> + Send + 'static,
    ) -> tokio::task::JoinHandle<bool> {
        let peers = self.clone();
        tokio::spawn(async move {
            let sent = tokio::time::timeout(PEER_TIMEOUT, async {
                let connection = peers.connection(&addr).await?;
                let frame = encode(crate::tls::agreed_version(&connection));
                let mut stream = connection.open_uni().await?;
                stream.write_all(&frame).await?;
                stream.finish()?;
                // Done only once the peer has acknowledged the data: a leaving node closes its
                // endpoint right after its hand-off, which would drop unacknowledged bytes. A
                // peer that stopped the stream (say, a frame over its limit) did not take it.
                match stream.stopped().await? {
                    None => anyhow::Ok(()),
                    Some(code) => Err(anyhow::anyhow!("stopped by the peer with code {code}")),
                }
            })
            .await;
            let delivered = matches!(sent, Ok(Ok(())));
            match sent {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!(%addr, error = %e, "peer message not delivered"),
                Err(_) => tracing::debug!(%addr, "peer message not delivered in time"),
            }
            delivered
        })
    }

    /// As [`Peers::send`] for a frame of a hand-off: tried up to [`HANDOFF_TRIES`] times
    /// until delivered. Ends true once delivered.
    pub(crate) fn send_handoff(
        self: &Arc<Self>,
        addr: String,
        frame: Vec<u8>,
    ) -> tokio::task::JoinHandle<bool> {
        let peers = self.clone();
        tokio::spawn(async move {
            let mut tried = 0;
            let delivered = retried(HANDOFF_TRIES, HANDOFF_RETRY_PAUSE, || {
                tried += 1;
                if tried > 1 {
                    metrics::counter!("floodgate_handoff_retries_total").increment(1);
                    tracing::info!(peer = %addr, try_ = tried, "hand-off frame not delivered; trying again");
                }
                let send = peers.send(addr.clone(), frame.clone());
                async move { matches!(send.await, Ok(true)) }
            })
            .await;
            if !delivered {
                tracing::warn!(peer = %addr, tries = HANDOFF_TRIES, "hand-off frame not delivered");
            }
            delivered
        })
    }

    /// The protocol version the connection to the peer at `addr` agreed on (made now if
    /// there is none), within the peer timeout: exactly what that peer reads, whatever gossip
    /// has told of it yet. `None` when it cannot be reached.
    pub(crate) async fn agreed_version(&self, addr: &str) -> Option<u8> {
        let connection = tokio::time::timeout(PEER_TIMEOUT, self.connection(addr))
            .await
            .ok()?
            .ok()?;
        Some(crate::tls::agreed_version(&connection))
    }

    /// Sends a request of a hand-off (`frame`, answered with a frame of `kind`) and waits for
    /// its answer, tried up to [`HANDOFF_TRIES`] times like the hand-off's buckets. True once
    /// answered.
    pub(crate) async fn request_for_handoff(
        &self,
        addr: &str,
        frame: &[u8],
        kind: FrameKind,
    ) -> bool {
        // An answer is one short frame: an acknowledgement, or an error saying why not.
        const MOST_ANSWER_BYTES: usize = 4 * 1024;
        let mut tried = 0;
        let answered = retried(HANDOFF_TRIES, HANDOFF_RETRY_PAUSE, || {
            tried += 1;
            let request = self.request_within(PEER_TIMEOUT, addr, frame, MOST_ANSWER_BYTES, kind);
            async move { request.await.is_ok() }
        })
        .await;
        if !answered {
            tracing::warn!(peer = %addr, tries = tried, ?kind, "hand-off request not answered");
        }
        answered
    }

    /// Sends one frame on a bidirectional stream and returns the answer's frame of `kind`,
    /// waiting at most `limit` (a connection being made included).
    pub(crate) async fn request_within(
        &self,
        limit: std::time::Duration,
        addr: &str,
        frame: &[u8],
        max_bytes: usize,
        kind: FrameKind,
    ) -> anyhow::Result<Frame> {
        tokio::time::timeout(limit, async {
            let connection = self.connection(addr).await?;
            crate::exchange::request(&connection, frame, max_bytes, kind).await
        })
        .await
        .context("peer did not answer in time")?
    }
}

/// True when a failed handshake is a mistake between nodes (certificates, ids, versions, a
/// refusal for another reason) rather than the peer going away: a draining node refuses new
/// connections (transport code `CONNECTION_REFUSED`) or closes with `ShuttingDown`; a restarted
/// one resets; a crashed one times out; and this node's own endpoint closing ends its dials.
fn is_handshake_mistake(error: &quinn::ConnectionError) -> bool {
    use floodgate::wire::ErrorCode;
    use quinn::ConnectionError as E;
    match error {
        E::ConnectionClosed(close) => {
            close.error_code != quinn::TransportErrorCode::CONNECTION_REFUSED
        }
        E::ApplicationClosed(close) => {
            close.error_code != quinn::VarInt::from_u32(ErrorCode::ShuttingDown as u32)
        }
        E::Reset | E::TimedOut | E::LocallyClosed => false,
        E::VersionMismatch | E::TransportError(_) | E::CidsExhausted => true,
    }
}

/// Runs `attempt` until it returns true, at most `tries` times, pausing `pause` before the
/// second try and twice as long before each after. True when one try succeeded.
async fn retried<F, Fut>(tries: u32, mut pause: std::time::Duration, mut attempt: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for i in 0..tries {
        if i > 0 {
            tokio::time::sleep(pause).await;
            pause = pause.saturating_mul(2);
        }
        if attempt().await {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use floodgate::wire::ErrorCode;
    use quinn::{ApplicationClose, ConnectionClose, ConnectionError, TransportErrorCode, VarInt};

    fn aborted(code: TransportErrorCode) -> ConnectionError {
        ConnectionError::ConnectionClosed(ConnectionClose {
            error_code: code,
            frame_type: None,
            reason: Default::default(),
        })
    }

    fn closed(code: ErrorCode) -> ConnectionError {
        ConnectionError::ApplicationClosed(ApplicationClose {
            error_code: VarInt::from_u32(code as u32),
            reason: Default::default(),
        })
    }

    #[test]
    fn a_peer_going_away_is_no_handshake_mistake() {
        for leaving in [
            aborted(TransportErrorCode::CONNECTION_REFUSED),
            closed(ErrorCode::ShuttingDown),
            ConnectionError::Reset,
            ConnectionError::TimedOut,
            ConnectionError::LocallyClosed,
        ] {
            assert!(!is_handshake_mistake(&leaving), "{leaving}");
        }
    }

    #[test]
    fn a_peer_sharing_no_protocol_version_is_told_apart() {
        // TLS alert 120, no_application_protocol: the peer accepts none of our ALPN ids.
        let refused = aborted(TransportErrorCode::crypto(0x78));
        assert!(crate::tls::no_shared_version(&refused));
        assert!(is_handshake_mistake(&refused));
        for other in [
            aborted(TransportErrorCode::crypto(42)),
            aborted(TransportErrorCode::CONNECTION_REFUSED),
            closed(ErrorCode::Forbidden),
        ] {
            assert!(!crate::tls::no_shared_version(&other), "{other}");
        }
    }

    #[test]
    fn certificate_id_and_refusal_mistakes_stay_handshake_failures() {
        // 42 is TLS bad_certificate: the peer rejected our certificate.
        for mistake in [
            aborted(TransportErrorCode::crypto(42)),
            closed(ErrorCode::Forbidden),
            ConnectionError::VersionMismatch,
        ] {
            assert!(is_handshake_mistake(&mistake), "{mistake}");
        }
    }

    /// A hand-off frame is tried again after a failed delivery, with doubling pauses, and
    /// given up after its last try (the paused clock shows the pauses, nothing sleeps).
    #[tokio::test(start_paused = true)]
    async fn a_failed_hand_off_frame_is_tried_again_then_given_up() {
        let pause = std::time::Duration::from_millis(50);
        let start = tokio::time::Instant::now();
        let mut tries = 0;
        let delivered = retried(3, pause, || {
            tries += 1;
            let ok = tries == 3;
            async move { ok }
        })
        .await;
        assert!(delivered);
        assert_eq!(tries, 3);
        assert_eq!(start.elapsed(), pause * 3, "50 ms, then 100 ms");

        let mut tries = 0;
        let delivered = retried(3, pause, || {
            tries += 1;
            async { false }
        })
        .await;
        assert!(!delivered);
        assert_eq!(tries, 3, "never more than its tries");

        let mut tries = 0;
        assert!(
            retried(3, pause, || {
                tries += 1;
                async { true }
            })
            .await
        );
        assert_eq!(tries, 1, "a delivered frame is sent once");
    }
}
