//! The node's side of the inter-region delta exchange: the core's sans-I/O [`Exchange`] behind a
//! lock, global checks through it, received region frames (kinds 13 and 14) checked against the
//! sender's certificate and handled, and a task that sends what is due through [`RegionLinks`]
//! and sleeps until the exchange's next timeout or a wake-up.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use floodgate::region::{
    Exchange, ExchangeStats, Outgoing, Peer, RegionName, Route, UnconfirmedUnits,
};
use floodgate::wire::{
    ErrorCode, FrameKind, decode_region_ack, decode_region_deltas, encode_region_ack,
    encode_region_deltas,
};
use floodgate::{BucketCheck, BucketKey, BucketStore, Charged, Clock, Decision, Limit, StoreError};
use parking_lot::{Mutex, MutexGuard};
use tokio::sync::{Notify, watch};

/// Where the driver's messages go: one message for one peer, best effort, encoded by
/// [`encode_region_frame`] for the protocol version the link to that peer speaks. A message
/// that is lost is sent again by the exchange until acknowledged, so a link may drop on failure.
pub trait RegionLinks: Send + Sync + 'static {
    fn send(&self, to: &Peer, message: Outgoing);
}

/// `message` as a frame for a peer speaking `version`: the newest layout of its kind the peer
/// reads (deltas as columns from version 13; the settled point and the receiver's session from
/// 4; version 2's otherwise).
pub fn encode_region_frame(version: u8, message: &Outgoing) -> Vec<u8> {
    let mut frame = Vec::new();
    match message {
        Outgoing::Deltas(batch) => encode_region_deltas(&mut frame, version, batch),
        Outgoing::Ack(ack) => encode_region_ack(&mut frame, version, ack),
    }
    frame
}

/// Longest the sender task sleeps when nothing is due: it looks again regardless.
const IDLE_WAIT: Duration = Duration::from_secs(1);

/// One node's exchange with the owners of its global keys in the other regions.
pub struct RegionSync<C> {
    exchange: Mutex<Exchange>,
    store: Arc<BucketStore>,
    clock: C,
    wake: Notify,
    /// When the sender task next looks at the exchange of its own accord (the clock's ns; 0
    /// until its first look, which it takes as it starts), set under the exchange's lock: only
    /// a change that makes a message due before then wakes it (a global check's units wait for
    /// the sync interval anyway, so most wake nothing).
    wakes_at: AtomicU64,
    /// Counts every change (a check recorded, a frame handled) while someone watches it: tests
    /// and a graceful stop wait on it.
    progress: watch::Sender<u64>,
    /// Set once a frame not in its sender's own name was logged: a hostile peer repeating it
    /// is counted, not logged again.
    warned_forbidden: AtomicBool,
}

impl<C> std::fmt::Debug for RegionSync<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegionSync")
            .field("me", self.exchange.lock().me())
            .finish_non_exhaustive()
    }
}

impl<C: Clock> RegionSync<C> {
    pub fn new(exchange: Exchange, store: Arc<BucketStore>, clock: C) -> Self {
        RegionSync {
            exchange: Mutex::new(exchange),
            store,
            clock,
            wake: Notify::new(),
            wakes_at: AtomicU64::new(0),
            progress: watch::Sender::new(0),
            warned_forbidden: AtomicBool::new(false),
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
        let mut exchange = self.exchange.lock();
        let decision = exchange.check_global(now, &self.store, key, limit, cost, others);
        self.changed(&exchange);
        decision
    }

    /// A session for deciding a batch's global groups: the exchange's lock taken and the clock
    /// read once for all of them, and the sender task told once, when the session ends (per
    /// check, those were a tenth of a global check's cost). Hold it only for work without an
    /// await: other checks and received frames wait for the lock meanwhile.
    pub fn global_checks(&self) -> GlobalChecks<'_, C> {
        GlobalChecks {
            now_ns: self.clock.now_ns(),
            exchange: self.exchange.lock(),
            sync: self,
            decisions: Vec::new(),
        }
    }

    /// Sets how many regions share global limits (see [`Exchange::set_regions`]).
    pub fn set_regions(&self, regions: usize) {
        self.exchange.lock().set_regions(regions);
    }

    /// Handles a region frame's payload, of the layout of version `layout` (the frame's), from
    /// a peer whose certificate names `certified_node`, a member this node knows in `region`. A message naming another node, or another region,
    /// is refused as `forbidden` (a peer speaks only as itself); one that fails validation with
    /// the decoder's code. Nothing is applied then.
    pub fn receive(
        &self,
        kind: FrameKind,
        layout: u8,
        payload: &[u8],
        certified_node: &str,
        region: &str,
    ) -> Result<(), ErrorCode> {
        self.receive_from(
            kind,
            layout,
            payload,
            &|node| node == certified_node,
            &|node| (node == certified_node).then(|| region.to_owned()),
            &|_| Route::Here,
        )
    }

    /// As [`RegionSync::receive`], with `certified` saying whether the sender's certificate
    /// names a node id, `region_of` the region the membership knows a node in (`None`: not a
    /// member this node knows), and `route` where each delta's units go in this region. A
    /// delta from this node's own region was passed on by a member that found this node
    /// decides its key, and is taken like any other.
    pub fn receive_from(
        &self,
        kind: FrameKind,
        layout: u8,
        payload: &[u8],
        certified: &dyn Fn(&str) -> bool,
        region_of: &dyn Fn(&str) -> Option<String>,
        route: &dyn Fn(BucketKey) -> Route,
    ) -> Result<(), ErrorCode> {
        let now = self.clock.now_ns();
        match kind {
            FrameKind::RegionDeltas => {
                let batch = decode_region_deltas(layout, payload).map_err(|(code, _)| code)?;
                self.speaks_as_itself(kind, &batch.from, certified, region_of)?;
                let mut exchange = self.exchange.lock();
                exchange.handle_routed_deltas(now, &batch, &self.store, route);
                self.changed(&exchange);
            }
            FrameKind::RegionAck => {
                let ack = decode_region_ack(layout, payload).map_err(|(code, _)| code)?;
                self.speaks_as_itself(kind, &ack.from, certified, region_of)?;
                let mut exchange = self.exchange.lock();
                exchange.handle_ack(now, &ack);
                self.changed(&exchange);
            }
            _ => return Err(ErrorCode::UnknownKind),
        }
        Ok(())
    }

    /// `Forbidden` unless `from` is the node the sender's certificate names, in the region the
    /// membership knows it in: a peer claiming another region would be a sender of its own to
    /// every receiver (its units applied as that region's, one more inbox each time).
    fn speaks_as_itself(
        &self,
        kind: FrameKind,
        from: &Peer,
        certified: &dyn Fn(&str) -> bool,
        region_of: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(), ErrorCode> {
        let refused = if !certified(&from.node) {
            "its certificate names another node".to_owned()
        } else {
            match region_of(&from.node) {
                Some(known) if known == from.region.as_str() => return Ok(()),
                Some(known) => format!("the membership knows that node in region `{known}`"),
                None => "that node is not a member this node knows".to_owned(),
            }
        };
        if !self.warned_forbidden.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "dropped a {kind:?} frame in the name of `{from}`: {refused} \
                 (further ones are counted as forbidden, not logged)"
            );
        }
        Err(ErrorCode::Forbidden)
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
            links.send(&transmit.to, transmit.message);
        }
        let next = exchange.poll_timeout();
        let idle_until = now.saturating_add(IDLE_WAIT.as_nanos() as u64);
        self.wakes_at
            .store(next.unwrap_or(idle_until), Ordering::Relaxed);
        next
    }

    /// Sends what is due, then sleeps until the next timeout or a wake-up, until `shutdown`.
    pub async fn run(&self, links: Arc<dyn RegionLinks>, mut shutdown: watch::Receiver<bool>) {
        while !*shutdown.borrow() {
            let next = self.flush(links.as_ref());
            let now = self.clock.now_ns();
            // No timeout: sleep until woken (a long bound keeps the loop alive regardless).
            let wait = next.map_or(IDLE_WAIT, |at| Duration::from_nanos(at.saturating_sub(now)));
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.wake.notified() => {}
                _ = shutdown.changed() => {}
            }
        }
    }

    /// Each destination's pending keys, retransmissions and delta lag.
    pub fn destinations(&self) -> Vec<floodgate::region::DestinationStats> {
        self.exchange.lock().destinations(self.clock.now_ns())
    }

    /// Drops the destinations `still_owner` says own nothing any more (they left, or their
    /// region's ring moved on), queueing their unconfirmed units for each key's new owner in
    /// that region (`new_owner(region, key)`; see [`Exchange::reroute_destination`]). Returns the units
    /// queued again and the units lost (no owner in sight).
    pub fn forget_gone(
        &self,
        still_owner: impl Fn(&Peer) -> bool,
        new_owner: &dyn Fn(&RegionName, BucketKey) -> Option<Peer>,
    ) -> (u64, u64) {
        let now = self.clock.now_ns();
        let mut exchange = self.exchange.lock();
        let gone: Vec<Peer> = exchange
            .destinations(0)
            .into_iter()
            .map(|d| d.peer)
            .filter(|p| !still_owner(p))
            .collect();
        let (mut queued, mut lost) = (0u64, 0u64);
        for peer in &gone {
            let in_region = |key: BucketKey| new_owner(&peer.region, key);
            let (q, l) = exchange.reroute_destination(now, peer, &in_region);
            queued = queued.saturating_add(q);
            lost = lost.saturating_add(l);
        }
        if queued > 0 || lost > 0 {
            self.changed(&exchange);
        }
        (queued, lost)
    }

    /// After this region's table changed: passes the backlog of keys another member now
    /// decides on to it, and routes again what was passed on to members that own nothing any
    /// more (see [`Exchange::follow_ownership`]). Returns the units passed on.
    pub fn follow_ownership(
        &self,
        route: &dyn Fn(BucketKey) -> Route,
        still_member: &dyn Fn(&Peer) -> bool,
    ) -> u64 {
        let now = self.clock.now_ns();
        let mut exchange = self.exchange.lock();
        let passed = exchange.follow_ownership(now, &self.store, route, still_member);
        if passed > 0 {
            self.changed(&exchange);
        }
        passed
    }

    /// For a hand-off: the units of the keys `moving` names (their slots leave this node) that
    /// other regions have not confirmed, for the new owner to count (see
    /// [`Exchange::hand_over_unconfirmed`]). Call after the table switch returned, so no
    /// admission under the old table is still to come.
    pub fn hand_over_unconfirmed(
        &self,
        moving: &dyn Fn(BucketKey) -> bool,
    ) -> Vec<UnconfirmedUnits> {
        let now = self.clock.now_ns();
        self.exchange.lock().hand_over_unconfirmed(now, moving)
    }

    /// Counts units handed over with slots this node gained against their keys' shares.
    pub fn inherit(&self, units: &[UnconfirmedUnits]) {
        let now = self.clock.now_ns();
        self.exchange.lock().inherit(now, units);
    }

    /// This node as the exchange names it.
    pub fn me(&self) -> Peer {
        self.exchange.lock().me().clone()
    }

    /// True when everything this node admitted has been confirmed by every destination.
    pub fn is_idle(&self) -> bool {
        self.exchange.lock().is_idle()
    }

    /// For a graceful stop: sends every pending delta now, then waits (at most `limit`) until
    /// every destination has confirmed all this node admitted, while the sender task and the
    /// peer endpoint still run. Returns the units left unconfirmed (lost to their destinations
    /// once this node stops: its next session starts afresh).
    pub async fn drain(&self, limit: Duration) -> u64 {
        let mut changes = self.subscribe();
        self.exchange.lock().flush_pending_now(self.clock.now_ns());
        // Only the sender task needs to hear of it (no change to count: a subscriber may hold
        // the counter's value borrowed).
        self.wake.notify_one();
        let _ = tokio::time::timeout(limit, async {
            while !self.is_idle() {
                if changes.changed().await.is_err() {
                    return;
                }
            }
        })
        .await;
        self.unconfirmed_units()
    }

    /// Units admitted here that some destination has not confirmed, over every destination.
    pub fn unconfirmed_units(&self) -> u64 {
        self.destinations()
            .iter()
            .fold(0, |sum, d| sum.saturating_add(d.unconfirmed_units))
    }

    /// Forgets the inboxes of senders idle past the exchange's `inbox_idle_ns`; returns how
    /// many.
    pub fn evict_idle_inboxes(&self) -> usize {
        self.exchange.lock().evict_idle_inboxes(self.clock.now_ns())
    }

    /// Frees inherited units past their time.
    pub fn prune_inherited(&self) {
        self.exchange.lock().prune_inherited(self.clock.now_ns());
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

    /// After a change to `exchange` (still locked): counts it for those watching (a send
    /// with nobody subscribed would only take the watch's lock and wake no one), and wakes the
    /// sender task if a message is now due before it would look of its own accord.
    fn changed(&self, exchange: &Exchange) {
        if self.progress.receiver_count() > 0 {
            self.progress.send_modify(|n| *n += 1);
        }
        let wakes_at = self.wakes_at.load(Ordering::Relaxed);
        if exchange.poll_timeout().is_some_and(|due| due < wakes_at) {
            self.wake.notify_one();
        }
    }
}

/// Global checks decided under one hold of the exchange's lock (see
/// [`RegionSync::global_checks`]).
pub struct GlobalChecks<'a, C: Clock> {
    sync: &'a RegionSync<C>,
    exchange: MutexGuard<'a, Exchange>,
    now_ns: u64,
    /// The store's decisions for one group, kept between groups.
    decisions: Vec<Decision>,
}

impl<C: Clock> std::fmt::Debug for GlobalChecks<'_, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GlobalChecks")
            .field("now_ns", &self.now_ns)
            .finish_non_exhaustive()
    }
}

impl<C: Clock> GlobalChecks<'_, C> {
    /// Sets how many regions share global limits (see [`Exchange::set_regions`]).
    pub fn set_regions(&mut self, regions: usize) {
        self.exchange.set_regions(regions);
    }

    /// Starts loading what deciding a global check of `key` will read of the exchange (see
    /// [`floodgate::region::Exchange::prefetch`]), `others` the key's owners elsewhere.
    pub fn prefetch(&self, key: BucketKey, others: &[Peer]) {
        self.exchange.prefetch(key, others);
    }

    /// Decides an all-or-nothing group of which the checks marked in `global` are global, each
    /// with the owners of its key in the other regions (`others`, one list per check): every
    /// global check must pass the admission rule, then the store decides the group, and what it
    /// admitted is recorded for the other regions only if the whole group passed. Adds one
    /// decision per check to `out`, or none on an error.
    pub fn check_group<D: From<Decision>>(
        &mut self,
        checks: &[BucketCheck],
        global: &[bool],
        others: &[&[Peer]],
        out: &mut Vec<D>,
    ) -> Result<(), StoreError> {
        let (now, store) = (self.now_ns, &self.sync.store);
        let exchange = &mut *self.exchange;
        let mut held_back = None;
        for ((check, _), others) in checks
            .iter()
            .zip(global)
            .zip(others)
            .filter(|((_, g), _)| **g)
        {
            held_back =
                exchange.hold_back(now, store, check.key, &check.limit, check.cost, others)?;
            if held_back.is_some() {
                break;
            }
        }
        let decisions = &mut self.decisions;
        decisions.clear();
        if let Some(denied) = held_back {
            // Denied as a whole: every check is denied, retrying when the held-back one may pass.
            let retry_after_ns = denied.retry_after_ns().unwrap_or(0);
            for check in checks {
                let peek = store.check(check.key, &check.limit, 0, now)?;
                decisions.push(Decision::Denied {
                    remaining: 0,
                    retry_after_ns,
                    reset_after_ns: peek.reset_after_ns(),
                });
            }
        } else if store.check_all(checks, now, decisions)? {
            // A peek took nothing: nothing for the other regions.
            for ((check, _), others) in checks
                .iter()
                .zip(global)
                .zip(others)
                .filter(|((check, g), _)| **g && !check.peek)
            {
                exchange.record_admitted(now, check.key, &check.limit, check.cost, others);
            }
        }
        out.extend(decisions.drain(..).map(D::from));
        Ok(())
    }

    /// Takes metered charges (never refused, see `BucketStore::charge`), of which those marked
    /// in `global` count for the other regions too: what each bucket took is recorded for the
    /// owners of its key there (`others`, one list per charge). Answers each with its bucket
    /// as it now stands.
    pub fn charge_group(
        &mut self,
        charges: &[BucketCheck],
        global: &[bool],
        others: &[&[Peer]],
    ) -> Vec<Result<Charged, StoreError>> {
        let (now, store) = (self.now_ns, &self.sync.store);
        let exchange = &mut *self.exchange;
        charges
            .iter()
            .zip(global)
            .zip(others)
            .map(|((charge, &global), others)| {
                let charged = store.charge(charge.key, &charge.limit, charge.cost, now)?;
                if global {
                    let taken = charge.cost - charged.forgiven.min(charge.cost);
                    exchange.record_admitted(now, charge.key, &charge.limit, taken, others);
                }
                Ok(charged)
            })
            .collect()
    }
}

impl<C: Clock> Drop for GlobalChecks<'_, C> {
    /// What the session changed is counted, and the sender task woken, once.
    fn drop(&mut self) {
        self.sync.changed(&self.exchange);
    }
}
