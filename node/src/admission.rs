//! Connection allowances: clients and peers are counted apart, so a flood of client connections
//! cannot take the places a node keeps for its peers' gossip and replication.
//!
//! Which side a connection is on is known only once its handshake has verified the certificate,
//! so connections are admitted in two steps: a handshake place at accept (all handshakes and
//! connections together stay within both allowances), then a client or peer place after it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use metrics::Gauge;

/// Counts of connections by side, and their limits.
#[derive(Debug)]
pub(crate) struct ConnectionAllowance {
    max_clients: usize,
    max_peers: usize,
    handshakes: AtomicUsize,
    clients: AtomicUsize,
    peers: AtomicUsize,
    /// All connections, clients and peers.
    connections_gauge: Gauge,
    peer_gauge: Gauge,
    /// (clients, peers) admitted, for whoever awaits a change (tests, instead of polling).
    counts: tokio::sync::watch::Sender<(usize, usize)>,
}

/// A handshake in flight; its place is given back on drop.
#[derive(Debug)]
pub(crate) struct Handshake(Arc<ConnectionAllowance>);

/// An admitted connection; its place is given back on drop.
#[derive(Debug)]
pub(crate) struct Admitted {
    allowance: Arc<ConnectionAllowance>,
    peer: bool,
}

impl ConnectionAllowance {
    pub(crate) fn new(
        max_clients: usize,
        max_peers: usize,
        connections_gauge: Gauge,
        peer_gauge: Gauge,
    ) -> Self {
        ConnectionAllowance {
            max_clients,
            max_peers,
            handshakes: AtomicUsize::new(0),
            clients: AtomicUsize::new(0),
            peers: AtomicUsize::new(0),
            connections_gauge,
            peer_gauge,
            counts: tokio::sync::watch::Sender::new((0, 0)),
        }
    }

    /// A place for one more handshake, or `None` when handshakes and connections together fill
    /// both allowances. Only the accept loop calls it, so the sum cannot race past the limit.
    pub(crate) fn start_handshake(self: &Arc<Self>) -> Option<Handshake> {
        let busy = self.handshakes.load(Ordering::Relaxed)
            + self.clients.load(Ordering::Relaxed)
            + self.peers.load(Ordering::Relaxed);
        if busy >= self.max_clients + self.max_peers {
            return None;
        }
        self.handshakes.fetch_add(1, Ordering::Relaxed);
        Some(Handshake(self.clone()))
    }

    /// Turns a finished handshake into a client or peer place, or `None` when that side's
    /// allowance is full (the caller closes the connection with `overloaded`).
    pub(crate) fn admit(self: &Arc<Self>, handshake: Handshake, peer: bool) -> Option<Admitted> {
        let (count, max) = if peer {
            (&self.peers, self.max_peers)
        } else {
            (&self.clients, self.max_clients)
        };
        count
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()?;
        drop(handshake);
        self.publish();
        Some(Admitted {
            allowance: self.clone(),
            peer,
        })
    }

    pub(crate) fn clients(&self) -> usize {
        self.clients.load(Ordering::Relaxed)
    }

    pub(crate) fn peers(&self) -> usize {
        self.peers.load(Ordering::Relaxed)
    }

    /// The admitted (clients, peers), updated on every admission and departure.
    pub(crate) fn watch_counts(&self) -> tokio::sync::watch::Receiver<(usize, usize)> {
        self.counts.subscribe()
    }

    fn publish(&self) {
        let (clients, peers) = (self.clients(), self.peers());
        self.connections_gauge.set((clients + peers) as f64);
        self.peer_gauge.set(peers as f64);
        self.counts.send_replace((clients, peers));
    }
}

impl Drop for Handshake {
    fn drop(&mut self) {
        self.0.handshakes.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let count = if self.peer {
            &self.allowance.peers
        } else {
            &self.allowance.clients
        };
        count.fetch_sub(1, Ordering::Relaxed);
        self.allowance.publish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowance(clients: usize, peers: usize) -> Arc<ConnectionAllowance> {
        Arc::new(ConnectionAllowance::new(
            clients,
            peers,
            Gauge::noop(),
            Gauge::noop(),
        ))
    }

    #[test]
    fn clients_at_their_limit_leave_the_peer_places_free() {
        let allowance = allowance(2, 1);
        let clients: Vec<Admitted> = (0..2)
            .map(|_| {
                let handshake = allowance.start_handshake().unwrap();
                allowance.admit(handshake, false).unwrap()
            })
            .collect();
        // A third client completes a handshake (it could have been a peer) but is not admitted.
        let handshake = allowance.start_handshake().unwrap();
        assert!(allowance.admit(handshake, false).is_none());
        // A peer is.
        let handshake = allowance.start_handshake().unwrap();
        let peer = allowance.admit(handshake, true).unwrap();
        assert_eq!((allowance.clients(), allowance.peers()), (2, 1));
        // Everything is full: no more handshakes.
        assert!(allowance.start_handshake().is_none());
        drop(peer);
        drop(clients);
        assert_eq!((allowance.clients(), allowance.peers()), (0, 0));
        assert!(allowance.start_handshake().is_some());
    }

    #[test]
    fn handshakes_in_flight_count_against_the_total() {
        let allowance = allowance(1, 1);
        let first = allowance.start_handshake().unwrap();
        let _second = allowance.start_handshake().unwrap();
        assert!(allowance.start_handshake().is_none());
        drop(first);
        assert!(allowance.start_handshake().is_some());
    }
}
