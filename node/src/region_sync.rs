//! The node's side of the inter-region delta exchange, not wired into the node yet: the core's
//! sans-I/O [`Exchange`] behind a lock, global checks through it, received region frames (kinds
//! 13 and 14) checked against the sender's certificate and handled, and a task that sends what
//! is due through [`RegionLinks`] and sleeps until the exchange's next timeout or a wake-up.

use std::sync::Arc;
use std::time::Duration;

use floodgate::region::{Exchange, ExchangeStats, Outgoing, Peer};
use floodgate::wire::{
    ErrorCode, FrameKind, RegionAckMessage, RegionDeltasMessage, decode_region_ack,
    decode_region_deltas, encode_message,
};
use floodgate::{BucketKey, BucketStore, Clock, Decision, Limit, StoreError};
use parking_lot::Mutex;
use tokio::sync::{Notify, watch};

/// Where the driver's frames go: one encoded frame for one peer, best effort. A frame that is
/// lost is sent again by the exchange until acknowledged, so a link may drop on failure.
pub trait RegionLinks: Send + Sync + 'static {
    fn send(&self, to: &Peer, frame: Vec<u8>);
}

/// One node's exchange with the owners of its global keys in the other regions.
pub struct RegionSync<C> {
    exchange: Mutex<Exchange>,
    store: Arc<BucketStore>,
    clock: C,
    wake: Notify,
    /// Counts every change (a check recorded, a frame handled): tests and status wait on it.
    progress: watch::Sender<u64>,
}

impl<C: Clock> RegionSync<C> {
    pub fn new(exchange: Exchange, store: Arc<BucketStore>, clock: C) -> Self {
        RegionSync {
            exchange: Mutex::new(exchange),
            store,
            clock,
            wake: Notify::new(),
            progress: watch::Sender::new(0),
        }
    }

    /// Decides a global check (see [`Exchange::check_global`]) and wakes the sender task.
    pub fn check_global(
        &self,
        key: BucketKey,
        limit: &Limit,
        cost: u64,
        others: &[Peer],
    ) -> Result<Decision, StoreError> {
        let now = self.clock.now_ns();
        let decision =
            self.exchange
                .lock()
                .check_global(now, &self.store, key, limit, cost, others);
        self.changed();
        decision
    }

    /// Handles a region frame's payload from a peer whose certificate names `certified_node`.
    /// A message naming another node is refused as `forbidden` (a peer speaks only as itself);
    /// one that fails validation with the decoder's code. Nothing is applied then.
    pub fn receive(
        &self,
        kind: FrameKind,
        payload: &[u8],
        certified_node: &str,
    ) -> Result<(), ErrorCode> {
        let now = self.clock.now_ns();
        match kind {
            FrameKind::RegionDeltas => {
                let batch = decode_region_deltas(payload).map_err(|(code, _)| code)?;
                if &*batch.from.node != certified_node {
                    return Err(ErrorCode::Forbidden);
                }
                self.exchange.lock().handle_deltas(now, &batch, &self.store);
            }
            FrameKind::RegionAck => {
                let ack = decode_region_ack(payload).map_err(|(code, _)| code)?;
                if &*ack.from.node != certified_node {
                    return Err(ErrorCode::Forbidden);
                }
                self.exchange.lock().handle_ack(now, &ack);
            }
            _ => return Err(ErrorCode::UnknownKind),
        }
        self.changed();
        Ok(())
    }

    /// Sends every frame due now through `links`; returns when something is next due (`None`:
    /// only when something arrives or is admitted).
    pub fn flush(&self, links: &dyn RegionLinks) -> Option<u64> {
        let now = self.clock.now_ns();
        let mut exchange = self.exchange.lock();
        // Bounded: each call sends at most what is due now; the rest waits for the next round.
        for _ in 0..1_024 {
            let Some(transmit) = exchange.poll_transmit(now) else {
                break;
            };
            let mut frame = Vec::new();
            match &transmit.message {
                Outgoing::Deltas(batch) => encode_message(
                    &mut frame,
                    FrameKind::RegionDeltas,
                    0,
                    &RegionDeltasMessage::from(batch),
                ),
                Outgoing::Ack(ack) => encode_message(
                    &mut frame,
                    FrameKind::RegionAck,
                    0,
                    &RegionAckMessage::from(ack),
                ),
            }
            links.send(&transmit.to, frame);
        }
        exchange.poll_timeout()
    }

    /// Sends what is due, then sleeps until the next timeout or a wake-up, until `shutdown`.
    pub async fn run(&self, links: Arc<dyn RegionLinks>, mut shutdown: watch::Receiver<bool>) {
        while !*shutdown.borrow() {
            let next = self.flush(links.as_ref());
            let now = self.clock.now_ns();
            // No timeout: sleep until woken (a long bound keeps the loop alive regardless).
            let wait = next.map_or(Duration::from_secs(1), |at| {
                Duration::from_nanos(at.saturating_sub(now))
            });
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.wake.notified() => {}
                _ = shutdown.changed() => {}
            }
        }
    }

    /// True when everything this node admitted has been confirmed by every destination.
    pub fn is_idle(&self) -> bool {
        self.exchange.lock().is_idle()
    }

    pub fn stats(&self) -> ExchangeStats {
        self.exchange.lock().stats()
    }

    /// Units applied from `sender` so far.
    pub fn applied_from(&self, sender: &Peer) -> u64 {
        self.exchange.lock().applied_from(sender)
    }

    /// A receiver of the change counter.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.progress.subscribe()
    }

    fn changed(&self) {
        self.progress.send_modify(|n| *n += 1);
        self.wake.notify_one();
    }
}
