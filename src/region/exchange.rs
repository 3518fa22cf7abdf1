//! [`Exchange`]: one node's side of the inter-region delta exchange, as a sans-I/O machine.
//!
//! Shaped like quinn-proto's connection: the caller passes time in and moves bytes; the machine
//! never reads a clock, sleeps or spawns.
//!
//! - [`Exchange::check_global`] decides a check on a global key (its bucket, the admission rule
//!   of `super::admission`) and queues what it admitted for every other region's owner.
//! - [`Exchange::handle_deltas`] applies a peer's deltas to the store exactly once and queues an
//!   acknowledgement; [`Exchange::handle_routed_deltas`] does so where this region's table
//!   says each key is decided (see [`Route`]); [`Exchange::handle_ack`] confirms what a peer
//!   applied.
//! - [`Exchange::poll_transmit`] gives the next message to send (call until `None`);
//!   [`Exchange::poll_timeout`] says when to call it again if nothing arrives.
//!
//! Across restarts: a node's exchange state lives only while it runs. A restarted sender has a
//! new session and its receivers start its numbering again. A restarted receiver knows nothing
//! of its senders, who keep their sessions: every message carries the sender's settled point,
//! where a new inbox starts, and every acknowledgement the receiver's session, so a sender that
//! sees a new one sends what is in flight again at once. Still not exact: a message applied by
//! a receiver that restarted before its acknowledgement left (or a copy sent again that was
//! still on its way) is applied again by the new incarnation. Where the receiver kept the
//! bucket (a snapshot), those units count twice: it errs toward denying, by at most
//! `max_in_flight` messages per sender. What a restarted sender had not had confirmed is lost
//! to its destinations (its bucket holds it; theirs never will).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::admission::share_allows;
use super::config::ExchangeConfig;
use super::delta::{Delta, DeltaAck, DeltaBatch, Outgoing, Peer, Transmit};
use super::inbox::{Inbox, Receipt};
use super::inherited::{Inherited, UnconfirmedUnits};
use super::outbox::Outbox;
use super::route::Route;
use super::scope::RegionName;
use crate::store::RemoteUse;
use crate::{BucketKey, BucketStore, Decision, Limit, StoreError};

/// Counters the exchange keeps about itself (all monotonic).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExchangeStats {
    /// Global checks denied by the admission rule (their region's share was unconfirmed).
    pub denied_by_share: u64,
    /// Global checks denied because a destination's pending table was full (nothing admitted,
    /// so nothing dropped).
    pub refused_outbox_full: u64,
    /// Messages sent again for want of an acknowledgement.
    pub retransmissions: u64,
    /// Delta messages applied, and received again after being applied (acknowledged again).
    pub applied_messages: u64,
    pub duplicate_messages: u64,
    /// Messages refused: from an older session of their sender, out of the sequence window,
    /// from a sender beyond `max_senders`, or from this node's own region.
    pub stale_messages: u64,
    pub refused_messages: u64,
    /// Remote units that could not be stored (the store was full of denying keys).
    pub units_lost_store_full: u64,
    /// Remote GCRA units beyond what a bucket may owe (`(R - 1)` bursts, reached only after a
    /// partition), forgiven rather than held.
    pub units_forgiven: u64,
    /// Acknowledgements that showed a destination had restarted (what was in flight to it was
    /// sent again at once).
    pub receiver_restarts: u64,
    /// Inboxes of senders idle past `inbox_idle_ns`, forgotten.
    pub evicted_inboxes: u64,
    /// Units received for keys another node of this region decides, passed on to it.
    pub passed_on_units: u64,
    /// Units received for keys whose hand-off this node still waited for, held for the key's
    /// next check.
    pub held_units: u64,
    /// Unconfirmed units handed over with keys this node gained, counted by its admission
    /// rule; and those it had no room for (more than `max_pending_keys` keys).
    pub inherited_units: u64,
    pub inherited_units_dropped: u64,
}

/// One destination's side of the exchange, for metrics and status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DestinationStats {
    pub peer: Peer,
    pub pending_keys: usize,
    pub unconfirmed_units: u64,
    pub retransmissions: u64,
    pub lag_ns: u64,
}

/// Most forgotten destinations whose sequence numbers are remembered.
const MAX_FORGOTTEN: usize = 4_096;

/// A new outbox for `dest`, going on from where a forgotten one of this session stopped.
fn resumed_outbox(forgotten: &mut BTreeMap<Peer, u64>, dest: &Peer) -> Outbox {
    forgotten
        .remove(dest)
        .map_or_else(Outbox::new, Outbox::starting_at)
}

/// `dest`'s outbox in `outboxes`, made (going on from `forgotten`) if it has none. Looked up
/// by reference first: a global check finds it there, and cloning the peer for the map's entry
/// took and gave back two reference counts per check.
fn outbox_for<'a>(
    outboxes: &'a mut BTreeMap<Peer, Outbox>,
    forgotten: &mut BTreeMap<Peer, u64>,
    dest: &Peer,
) -> &'a mut Outbox {
    if !outboxes.contains_key(dest) {
        outboxes.insert(dest.clone(), resumed_outbox(forgotten, dest));
    }
    // Present: inserted just above when it was missing.
    outboxes
        .get_mut(dest)
        .unwrap_or_else(|| unreachable!("the outbox was just made"))
}

/// One node's delta exchange with the owners of the same keys in the other regions.
#[derive(Debug)]
pub struct Exchange {
    config: ExchangeConfig,
    me: Peer,
    session: u64,
    outboxes: BTreeMap<Peer, Outbox>,
    /// Where forgotten destinations' sequence numbers stopped, so an outbox made again for one
    /// in this session goes on from there (at most `MAX_FORGOTTEN`; the oldest go first).
    forgotten_seqs: BTreeMap<Peer, u64>,
    inboxes: BTreeMap<Peer, Inbox>,
    /// Senders owed an acknowledgement.
    ack_due: BTreeSet<Peer>,
    /// GCRA units received that their bucket could not take yet (it was a capacity ahead).
    /// Looked up by every global check: hashbrown's hasher, not std's SipHash.
    backlog: hashbrown::HashMap<BucketKey, (Limit, u64)>,
    /// Units other regions had not confirmed when keys came here from another node of this
    /// region, counted beside this node's own.
    inherited: Inherited,
    retransmissions_seen: u64,
    stats: ExchangeStats,
}

impl Exchange {
    /// The exchange of node `me`; `session` must grow with each start of the node (e.g. its
    /// start time in ns), so peers tell a restart from a replay.
    pub fn new(config: ExchangeConfig, me: Peer, session: u64) -> Self {
        Exchange {
            config: config.sanitized(),
            me,
            session,
            outboxes: BTreeMap::new(),
            forgotten_seqs: BTreeMap::new(),
            inboxes: BTreeMap::new(),
            ack_due: BTreeSet::new(),
            backlog: hashbrown::HashMap::new(),
            inherited: Inherited::default(),
            retransmissions_seen: 0,
            stats: ExchangeStats::default(),
        }
    }

    pub fn me(&self) -> &Peer {
        &self.me
    }

    /// Sets how many regions share global limits (each region's share of a burst is `1 / R`
    /// of it): a node learns the regions from its membership, so the count may grow.
    pub fn set_regions(&mut self, regions: usize) {
        self.config = ExchangeConfig {
            regions,
            ..self.config
        }
        .sanitized();
    }

    pub fn config(&self) -> &ExchangeConfig {
        &self.config
    }

    pub fn stats(&self) -> ExchangeStats {
        let mut stats = self.stats;
        stats.retransmissions = self.retransmissions_seen
            + self
                .outboxes
                .values()
                .map(|o| o.retransmissions)
                .sum::<u64>();
        stats
    }

    /// Units applied from `sender` so far (every session).
    pub fn applied_from(&self, sender: &Peer) -> u64 {
        self.inboxes.get(sender).map_or(0, |i| i.applied_units)
    }

    /// True when every delta this node admitted has been confirmed by its destination.
    pub fn is_idle(&self) -> bool {
        self.outboxes.values().all(Outbox::is_idle)
    }

    /// Units of `key` that `dest` has not confirmed.
    pub fn unconfirmed(&self, dest: &Peer, key: BucketKey) -> u64 {
        self.outboxes.get(dest).map_or(0, |o| o.unconfirmed(key))
    }

    /// Whether `dest` counts as reachable for the admission rule at `now_ns`.
    pub fn is_reachable(&self, dest: &Peer, now_ns: u64) -> bool {
        self.outboxes
            .get(dest)
            .is_none_or(|o| o.is_reachable(now_ns, &self.config))
    }

    /// Decides a check on a global key in this region: `others` are the key's owners in every
    /// other region. Allowed only if the bucket (holding the other regions' consumption too)
    /// allows it and the admission rule does; what it admits is queued for each of `others`.
    pub fn check_global(
        &mut self,
        now_ns: u64,
        store: &BucketStore,
        key: BucketKey,
        limit: &Limit,
        cost: u64,
        others: &[Peer],
    ) -> Result<Decision, StoreError> {
        if let Some(denied) = self.hold_back(now_ns, store, key, limit, cost, others)? {
            return Ok(denied);
        }
        let decision = store.check(key, limit, cost, now_ns)?;
        if decision.is_allowed() {
            self.record_admitted(now_ns, key, limit, cost, others);
        }
        Ok(decision)
    }

    /// Starts loading what [`Exchange::hold_back`] will read of `key` toward `others` (its
    /// entry in each destination's outbox), for a caller about to decide it among others: the
    /// misses of a batch's cold keys then overlap. A hint: nothing is read or changed.
    pub fn prefetch(&self, key: BucketKey, others: &[Peer]) {
        for dest in others.iter().filter(|d| d.region != self.me.region) {
            if let Some(outbox) = self.outboxes.get(dest) {
                outbox.prefetch(key);
            }
        }
    }

    /// The first half of [`Exchange::check_global`], for callers that decide the bucket
    /// themselves (an all-or-nothing group): brings the key's backlogged remote units into its
    /// bucket, then returns the denial if the admission rule (or a full outbox) holds the check
    /// back, `None` if the bucket may decide it. Follow an admission with
    /// [`Exchange::record_admitted`].
    pub fn hold_back(
        &mut self,
        now_ns: u64,
        store: &BucketStore,
        key: BucketKey,
        limit: &Limit,
        cost: u64,
        others: &[Peer],
    ) -> Result<Option<Decision>, StoreError> {
        self.absorb_backlog(now_ns, store, key, limit)?;
        if cost == 0 || cost > limit.burst() {
            return Ok(None);
        }
        let share = self.config.share(limit.burst());
        for dest in others.iter().filter(|d| d.region != self.me.region) {
            let outbox = outbox_for(&mut self.outboxes, &mut self.forgotten_seqs, dest);
            if !outbox.can_hold(key, &self.config) {
                self.stats.refused_outbox_full += 1;
                return self.held_back(now_ns, store, key, limit).map(Some);
            }
            let unconfirmed = outbox.unconfirmed(key).saturating_add(self.inherited.units(
                key,
                &dest.region,
                now_ns,
            ));
            if outbox.is_reachable(now_ns, &self.config) && !share_allows(unconfirmed, cost, share)
            {
                self.stats.denied_by_share += 1;
                return self.held_back(now_ns, store, key, limit).map(Some);
            }
        }
        Ok(None)
    }

    /// For the hand-off of keys this node stops deciding (`moving`): per key and other region,
    /// the units the region has not confirmed that this node's admission rule counted, for the
    /// new decider to [`Exchange::inherit`]: those admitted here and those inherited, added.
    /// What this node admitted stays in its outboxes and is still sent and confirmed from
    /// here; the inherited entries leave with the key.
    pub fn hand_over_unconfirmed(
        &mut self,
        now_ns: u64,
        moving: &dyn Fn(BucketKey) -> bool,
    ) -> Vec<UnconfirmedUnits> {
        let mut units: HashMap<(BucketKey, RegionName), u64> = HashMap::new();
        for (dest, outbox) in &self.outboxes {
            if dest.region == self.me.region {
                continue;
            }
            for (key, count) in outbox.unconfirmed_keys() {
                if moving(key) {
                    // Two destinations in one region (its ring moved): the larger, as the
                    // admission rule holds each destination to the share on its own.
                    let entry = units.entry((key, dest.region.clone())).or_insert(0);
                    *entry = (*entry).max(count);
                }
            }
        }
        for inherited in self.inherited.take(now_ns, moving) {
            let entry = units.entry((inherited.key, inherited.region)).or_insert(0);
            *entry = entry.saturating_add(inherited.units);
        }
        units
            .into_iter()
            .map(|((key, region), units)| UnconfirmedUnits { key, region, units })
            .collect()
    }

    /// Counts `units`, handed over with keys this node now decides, against their regions'
    /// shares for `unreachable_after` (see `super::inherited` for why that long). Units for
    /// this node's own region are not another region's to confirm and are ignored.
    pub fn inherit(&mut self, now_ns: u64, units: &[UnconfirmedUnits]) {
        let until_ns = now_ns.saturating_add(self.config.unreachable_after_ns);
        let bounds = (self.config.max_pending_keys, self.config.regions);
        for entry in units.iter().filter(|u| u.region != self.me.region) {
            if self.inherited.add(now_ns, entry, until_ns, bounds) {
                self.stats.inherited_units = self.stats.inherited_units.saturating_add(entry.units);
            } else {
                self.stats.inherited_units_dropped = self
                    .stats
                    .inherited_units_dropped
                    .saturating_add(entry.units);
            }
        }
    }

    /// Units of `key` toward `region` inherited and still counted at `now_ns`.
    pub fn inherited_units(&self, key: BucketKey, region: &RegionName, now_ns: u64) -> u64 {
        self.inherited.units(key, region, now_ns)
    }

    /// Queues `cost` units of `key`, admitted here, for each of `others` (the second half of
    /// [`Exchange::check_global`]). A destination whose pending table is full still takes
    /// them if `hold_back` let the check through just before.
    pub fn record_admitted(
        &mut self,
        now_ns: u64,
        key: BucketKey,
        limit: &Limit,
        cost: u64,
        others: &[Peer],
    ) {
        if cost == 0 {
            return;
        }
        for dest in others.iter().filter(|d| d.region != self.me.region) {
            outbox_for(&mut self.outboxes, &mut self.forgotten_seqs, dest)
                .record(key, limit, cost, now_ns);
        }
    }

    /// A denial for a check the admission rule held back: the bucket's own view, and a retry
    /// after one sync interval (when confirmations are due).
    fn held_back(
        &self,
        now_ns: u64,
        store: &BucketStore,
        key: BucketKey,
        limit: &Limit,
    ) -> Result<Decision, StoreError> {
        let peek = store.check(key, limit, 0, now_ns)?;
        Ok(Decision::Denied {
            remaining: 0,
            retry_after_ns: self.config.sync_interval_ns,
            reset_after_ns: peek.reset_after_ns(),
        })
    }

    /// Gives the key's bucket the backlogged remote units it can take now.
    fn absorb_backlog(
        &mut self,
        now_ns: u64,
        store: &BucketStore,
        key: BucketKey,
        limit: &Limit,
    ) -> Result<(), StoreError> {
        let Some(&(held_limit, units)) = self.backlog.get(&key) else {
            return Ok(());
        };
        let used = RemoteUse {
            units,
            at_ns: now_ns,
            max_log_entries: 0,
        };
        // The limit in force now, should the rules have changed it; the held one otherwise.
        let limit = if limit.algorithm() == held_limit.algorithm() {
            limit
        } else {
            &held_limit
        };
        let left = store.apply_remote(key, limit, used, now_ns)?;
        if left == 0 {
            self.backlog.remove(&key);
        } else if let Some(entry) = self.backlog.get_mut(&key) {
            entry.1 = left;
        }
        Ok(())
    }

    /// Applies a peer's deltas to `store` (once per sequence number) and queues an
    /// acknowledgement. Deltas from this node's own region, from an older session of the
    /// sender, or outside the sequence window are refused and counted.
    pub fn handle_deltas(&mut self, now_ns: u64, batch: &DeltaBatch, store: &BucketStore) {
        if batch.from.region == self.me.region {
            self.stats.refused_messages += 1;
            return;
        }
        self.handle_routed_deltas(now_ns, batch, store, &|_| Route::Here);
    }

    /// As [`Exchange::handle_deltas`], each delta going where `route` says: into `store`,
    /// held until the key's hand-off arrived, or passed on to the node of this region that
    /// decides the key. Deltas from this node's own region are passed-on ones and are taken.
    pub fn handle_routed_deltas(
        &mut self,
        now_ns: u64,
        batch: &DeltaBatch,
        store: &BucketStore,
        route: &dyn Fn(BucketKey) -> Route,
    ) {
        if !self.inboxes.contains_key(&batch.from) {
            if self.inboxes.len() >= self.config.max_senders {
                self.evict_idle_inboxes(now_ns);
            }
            if self.inboxes.len() >= self.config.max_senders {
                self.stats.refused_messages += 1;
                return;
            }
            // A sender this node knows nothing of (new, or this node restarted, or its inbox
            // was evicted): start at its settled point.
            self.inboxes.insert(
                batch.from.clone(),
                Inbox::new(batch.session, batch.settled_below, now_ns),
            );
        }
        let Some(inbox) = self.inboxes.get_mut(&batch.from) else {
            return;
        };
        let window = self.config.dedupe_window;
        match inbox.arrive(
            batch.session,
            batch.seq,
            batch.settled_below,
            window,
            now_ns,
        ) {
            Receipt::Apply => {
                // Saturating: the units are a peer's claim, however large.
                let units = batch
                    .deltas
                    .iter()
                    .fold(0u64, |sum, d| sum.saturating_add(d.units));
                inbox.applied_units = inbox.applied_units.saturating_add(units);
                self.stats.applied_messages += 1;
                for (i, delta) in batch.deltas.iter().enumerate() {
                    // Uniform keys' buckets are cold: a miss per delta, overlapped this way.
                    store.prefetch_ahead(&batch.deltas, i, |d| (d.key, d.limit.algorithm()));
                    self.land(now_ns, store, route(delta.key), delta);
                }
                self.ack_due.insert(batch.from.clone());
            }
            Receipt::Duplicate => {
                self.stats.duplicate_messages += 1;
                self.ack_due.insert(batch.from.clone());
            }
            Receipt::Stale => self.stats.stale_messages += 1,
            Receipt::OutOfWindow => self.stats.refused_messages += 1,
        }
    }

    /// Queues `delta` for `owner`, the node of this region that decides its key (this node
    /// acknowledged it to its sender, so it now owes it to the owner). Applied here when the
    /// owner's pending table is full: not lost, though the owner will not see it.
    fn pass_on(&mut self, now_ns: u64, store: &BucketStore, owner: &Peer, delta: &Delta) {
        let outbox = self
            .outboxes
            .entry(owner.clone())
            .or_insert_with(|| resumed_outbox(&mut self.forgotten_seqs, owner));
        if outbox.can_hold(delta.key, &self.config) {
            outbox.record_at(delta.key, &delta.limit, delta.units, delta.at_ns, now_ns);
            self.stats.passed_on_units = self.stats.passed_on_units.saturating_add(delta.units);
        } else {
            let d = *delta;
            self.apply(now_ns, store, d.key, &d.limit, d.units, d.at_ns);
        }
    }

    /// Holds `delta`'s units with its key's backlog (taken into the bucket at the key's next
    /// check); false when the backlog has no room for another key.
    fn hold(&mut self, delta: &Delta) -> bool {
        if self.backlog.len() >= self.config.max_backlog_keys
            && !self.backlog.contains_key(&delta.key)
        {
            return false;
        }
        let entry = self.backlog.entry(delta.key).or_insert((delta.limit, 0));
        entry.0 = delta.limit;
        entry.1 = entry.1.saturating_add(delta.units);
        self.stats.held_units = self.stats.held_units.saturating_add(delta.units);
        true
    }

    /// After an ownership move in this region: the backlog of every key `route` says another
    /// node decides is passed on to it, and the outboxes of this region's nodes that
    /// `still_member` says are gone have their unconfirmed units routed again (some may then
    /// count twice: a message in flight to a node that stopped may have been applied there,
    /// which errs toward denying). Returns the units passed on.
    pub fn follow_ownership(
        &mut self,
        now_ns: u64,
        store: &BucketStore,
        route: &dyn Fn(BucketKey) -> Route,
        still_member: &dyn Fn(&Peer) -> bool,
    ) -> u64 {
        let gone: Vec<Peer> = self
            .outboxes
            .keys()
            .filter(|p| p.region == self.me.region && !still_member(p))
            .cloned()
            .collect();
        let mut moved: Vec<Delta> = Vec::new();
        for peer in gone {
            if let Some(mut outbox) = self.outboxes.remove(&peer) {
                moved.extend(outbox.take_unconfirmed());
                self.retransmissions_seen += outbox.retransmissions;
                self.remember_seq(&peer, outbox.next_seq());
            }
        }
        let backlog_moving: Vec<BucketKey> = self
            .backlog
            .keys()
            .copied()
            .filter(|&key| matches!(route(key), Route::PassOn(ref p) if *p != self.me))
            .collect();
        for key in backlog_moving {
            if let Some((limit, units)) = self.backlog.remove(&key) {
                moved.push(Delta {
                    key,
                    limit,
                    units,
                    at_ns: now_ns,
                });
            }
        }
        let before = self.stats.passed_on_units;
        for delta in moved {
            self.land(now_ns, store, route(delta.key), &delta);
        }
        self.stats.passed_on_units.saturating_sub(before)
    }

    /// Puts `delta`'s units where `route` says: passed on, held, or (also when neither has
    /// room) into this node's bucket.
    fn land(&mut self, now_ns: u64, store: &BucketStore, route: Route, delta: &Delta) {
        match route {
            Route::PassOn(owner) if owner != self.me => self.pass_on(now_ns, store, &owner, delta),
            Route::Hold if self.hold(delta) => {}
            _ => self.apply(
                now_ns,
                store,
                delta.key,
                &delta.limit,
                delta.units,
                delta.at_ns,
            ),
        }
    }

    fn apply(
        &mut self,
        now_ns: u64,
        store: &BucketStore,
        key: BucketKey,
        limit: &Limit,
        units: u64,
        at_ns: u64,
    ) {
        let regions = self.config.regions as u64;
        let max_log_entries =
            usize::try_from(limit.burst().saturating_mul(regions)).unwrap_or(usize::MAX);
        let used = RemoteUse {
            units,
            at_ns,
            max_log_entries,
        };
        match store.apply_remote(key, limit, used, now_ns) {
            Ok(0) => {}
            Ok(left) => {
                // A bucket owes at most (R - 1) bursts beyond its capacity: the most the other
                // regions can over-admit while connected. More comes only from a partition, and
                // is forgiven rather than blocking the key for as long as the partition lasted.
                let most = regions.saturating_sub(1).saturating_mul(limit.burst());
                let room = self.backlog.len() < self.config.max_backlog_keys
                    || self.backlog.contains_key(&key);
                if !room {
                    self.stats.units_forgiven = self.stats.units_forgiven.saturating_add(left);
                    return;
                }
                let entry = self.backlog.entry(key).or_insert((*limit, 0));
                entry.0 = *limit;
                let held = entry.1.saturating_add(left);
                entry.1 = held.min(most);
                // Saturating: a peer's claims can be as large as u64 allows.
                self.stats.units_forgiven =
                    self.stats.units_forgiven.saturating_add(held - entry.1);
                if entry.1 == 0 {
                    self.backlog.remove(&key);
                }
            }
            Err(_) => {
                self.stats.units_lost_store_full =
                    self.stats.units_lost_store_full.saturating_add(units);
            }
        }
    }

    /// Confirms what `ack.from` applied of this node's messages. An acknowledgement from a
    /// later session of the destination than the last one seen (it restarted) makes what is
    /// in flight to it due again at once.
    pub fn handle_ack(&mut self, now_ns: u64, ack: &DeltaAck) {
        if ack.session != self.session {
            self.stats.stale_messages += 1;
            return;
        }
        if let Some(outbox) = self.outboxes.get_mut(&ack.from) {
            outbox.acknowledge(ack.below, &ack.also, now_ns);
            if let Some(session) = ack.receiver_session {
                match outbox.receiver_session {
                    Some(known) if session > known => {
                        outbox.resend_now(now_ns, &self.config);
                        self.stats.receiver_restarts += 1;
                    }
                    Some(known) if session < known => return,
                    _ => {}
                }
                outbox.receiver_session = Some(session);
            }
        }
    }

    /// Makes every destination's pending deltas due at `now_ns` rather than at the next sync
    /// interval (a node about to stop sends what it has).
    pub fn flush_pending_now(&mut self, now_ns: u64) {
        for outbox in self.outboxes.values_mut() {
            outbox.flush_at(now_ns);
        }
    }

    /// Drops inherited units past their time; returns how many keys still hold some. Called
    /// periodically by the node (a lookup ignores expired units anyway: this frees them).
    pub fn prune_inherited(&mut self, now_ns: u64) -> usize {
        self.inherited.prune(now_ns)
    }

    /// Forgets the inboxes of senders that have sent nothing for
    /// [`ExchangeConfig::inbox_idle_ns`] (see there why that is safe); returns how many. Called
    /// when a new sender finds every place taken, and periodically by the node.
    pub fn evict_idle_inboxes(&mut self, now_ns: u64) -> usize {
        let before = self.inboxes.len();
        let idle_ns = self.config.inbox_idle_ns;
        self.inboxes
            .retain(|_, inbox| now_ns.saturating_sub(inbox.last_arrival_ns) < idle_ns);
        let evicted = before - self.inboxes.len();
        self.stats.evicted_inboxes += evicted as u64;
        evicted
    }

    /// Messages numbered so far for `dest` in this session.
    pub fn sent_to(&self, dest: &Peer) -> u64 {
        self.outboxes.get(dest).map_or(0, |o| o.next_seq() - 1)
    }

    /// Senders this node keeps an inbox for.
    pub fn inbox_count(&self) -> usize {
        self.inboxes.len()
    }

    /// The next message to send, if any is due at `now_ns`: acknowledgements first, then
    /// messages to send again, then new deltas (once per sync interval per destination).
    pub fn poll_transmit(&mut self, now_ns: u64) -> Option<Transmit> {
        if let Some(to) = self.ack_due.pop_first()
            && let Some(inbox) = self.inboxes.get(&to)
        {
            let ack = DeltaAck {
                from: self.me.clone(),
                session: inbox.session,
                below: inbox.below,
                also: inbox.also(),
                receiver_session: Some(self.session),
            };
            return Some(Transmit {
                to,
                message: Outgoing::Ack(ack),
            });
        }
        for (to, outbox) in self.outboxes.iter_mut() {
            if let Some((seq, deltas)) = outbox.next_message(now_ns, &self.config) {
                let batch = DeltaBatch {
                    from: self.me.clone(),
                    session: self.session,
                    seq,
                    settled_below: Some(outbox.settled_below()),
                    deltas,
                };
                return Some(Transmit {
                    to: to.clone(),
                    message: Outgoing::Deltas(batch),
                });
            }
        }
        None
    }

    /// When `poll_transmit` will next have something without anything arriving first (`now`
    /// or earlier: at once), or `None` when the exchange is waiting only for messages.
    pub fn poll_timeout(&self) -> Option<u64> {
        if !self.ack_due.is_empty() {
            return Some(0);
        }
        self.outboxes
            .values()
            .filter_map(|o| o.next_timeout(&self.config))
            .min()
    }

    /// Drops the outbox of a destination that is gone for good (it left the cluster, or no
    /// longer owns anything): its unconfirmed units stop holding local admissions back.
    /// Returns the units that were never confirmed.
    pub fn forget_destination(&mut self, dest: &Peer) -> u64 {
        let Some(outbox) = self.outboxes.remove(dest) else {
            return 0;
        };
        self.remember_seq(dest, outbox.next_seq());
        self.retransmissions_seen += outbox.retransmissions;
        outbox.total_unconfirmed()
    }

    /// Drops the outbox of `dest`, another region's node that owns nothing there any more,
    /// and queues its unconfirmed units for each key's new owner in that region (`new_owner`;
    /// `None`: none in sight, and the units are lost to that region). A message in flight may
    /// have been applied by `dest` before it went (its acknowledgement unseen): those units
    /// then count twice, which errs toward denying. Returns the units queued again and lost.
    pub fn reroute_destination(
        &mut self,
        now_ns: u64,
        dest: &Peer,
        new_owner: &dyn Fn(BucketKey) -> Option<Peer>,
    ) -> (u64, u64) {
        let Some(mut outbox) = self.outboxes.remove(dest) else {
            return (0, 0);
        };
        self.remember_seq(dest, outbox.next_seq());
        self.retransmissions_seen += outbox.retransmissions;
        let (mut queued, mut lost) = (0u64, 0u64);
        for delta in outbox.take_unconfirmed() {
            let owner = new_owner(delta.key)
                .filter(|o| o.region == dest.region && o != dest && *o != self.me);
            let Some(owner) = owner else {
                lost = lost.saturating_add(delta.units);
                continue;
            };
            let outbox = self
                .outboxes
                .entry(owner.clone())
                .or_insert_with(|| resumed_outbox(&mut self.forgotten_seqs, &owner));
            if outbox.can_hold(delta.key, &self.config) {
                outbox.record_at(delta.key, &delta.limit, delta.units, delta.at_ns, now_ns);
                queued = queued.saturating_add(delta.units);
            } else {
                lost = lost.saturating_add(delta.units);
            }
        }
        (queued, lost)
    }

    /// Where a forgotten destination's numbering stopped (the oldest forgotten first out).
    fn remember_seq(&mut self, dest: &Peer, next_seq: u64) {
        if self.forgotten_seqs.len() >= MAX_FORGOTTEN {
            self.forgotten_seqs.pop_first();
        }
        self.forgotten_seqs.insert(dest.clone(), next_seq);
    }

    /// Keys with deltas waiting to be sent, and messages awaiting acknowledgement, over every
    /// destination (for metrics).
    pub fn outbox_size(&self) -> (usize, usize) {
        self.outboxes.values().fold((0, 0), |(keys, msgs), o| {
            (keys + o.pending_keys(), msgs + o.in_flight())
        })
    }

    /// Per destination: keys with deltas waiting to be sent, units not yet confirmed, messages
    /// sent again, and the delta
    /// lag (how long it has confirmed nothing while deltas were outstanding; 0 when idle).
    pub fn destinations(&self, now_ns: u64) -> Vec<DestinationStats> {
        self.outboxes
            .iter()
            .map(|(peer, o)| DestinationStats {
                peer: peer.clone(),
                pending_keys: o.pending_keys(),
                unconfirmed_units: o.total_unconfirmed(),
                retransmissions: o.retransmissions,
                lag_ns: o.lag_ns(now_ns),
            })
            .collect()
    }

    /// Remote GCRA units waiting for room in their bucket (for stats and tests).
    pub fn backlog_units(&self, key: BucketKey) -> u64 {
        self.backlog.get(&key).map_or(0, |e| e.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::region::{DEDUPE_WINDOW, Outgoing, RegionName};
    use crate::{NANOS_PER_SEC, StoreConfig};

    const MS: u64 = 1_000_000;

    fn peer(region: &str) -> Peer {
        Peer::new(RegionName::new(region).unwrap(), &format!("node-{region}"))
    }

    fn store() -> BucketStore {
        BucketStore::new(StoreConfig {
            max_keys: 64,
            shards: 4,
        })
        .unwrap()
    }

    /// A node: its exchange and its store.
    struct Node {
        exchange: Exchange,
        store: BucketStore,
    }

    impl Node {
        fn new(region: &str, session: u64) -> Self {
            Node {
                exchange: Exchange::new(ExchangeConfig::for_regions(2), peer(region), session),
                store: store(),
            }
        }

        /// Admits `units` of the global key here, for the other node.
        fn admit(&mut self, now: u64, units: u64, other: &Peer) {
            let limit = Limit::gcra(1_000_000, NANOS_PER_SEC, 1_000_000).unwrap();
            let key = BucketKey::for_key(b"global");
            let decision = self
                .exchange
                .check_global(
                    now,
                    &self.store,
                    key,
                    &limit,
                    units,
                    std::slice::from_ref(other),
                )
                .unwrap();
            assert!(decision.is_allowed());
        }
    }

    /// Delivers `from`'s due messages to `to` (a perfect network); returns how many.
    fn deliver(now: u64, from: &mut Node, to: &mut Node) -> usize {
        let mut sent = 0;
        while let Some(transmit) = from.exchange.poll_transmit(now) {
            sent += 1;
            match transmit.message {
                Outgoing::Deltas(batch) => to.exchange.handle_deltas(now, &batch, &to.store),
                Outgoing::Ack(ack) => to.exchange.handle_ack(now, &ack),
            }
        }
        sent
    }

    fn settle(now: u64, a: &mut Node, b: &mut Node) {
        while deliver(now, a, b) + deliver(now, b, a) > 0 {}
    }

    /// A receiver restarted while its sender was past the sequence window: the sender's next
    /// message starts the new inbox at the settled point, so it is applied and acknowledged at
    /// once, and the link stays reachable (before, it was refused as out of window forever).
    /// A hand-off carries what the giver's admission rule counted: its own unconfirmed units
    /// and those it inherited, added; the receiver counts them for another region only.
    #[test]
    fn a_hand_off_carries_own_and_inherited_units_added() {
        let store = store();
        let key = BucketKey::for_key(b"k");
        let limit = Limit::gcra(100, NANOS_PER_SEC, 100).unwrap();
        let us = peer("us");
        let mut giver = Exchange::new(ExchangeConfig::for_regions(2), peer("eu"), 1);
        giver.inherit(
            0,
            &[UnconfirmedUnits {
                key,
                region: us.region.clone(),
                units: 7,
            }],
        );
        // Units for the giver's own region are not another region's to confirm.
        giver.inherit(
            0,
            &[UnconfirmedUnits {
                key,
                region: peer("eu").region,
                units: 50,
            }],
        );
        assert_eq!(giver.inherited_units(key, &peer("eu").region, 0), 0);
        for _ in 0..5 {
            let decided = giver.check_global(0, &store, key, &limit, 1, std::slice::from_ref(&us));
            assert!(decided.unwrap().is_allowed());
        }
        let other = BucketKey::for_key(b"other");
        let handed = giver.hand_over_unconfirmed(0, &|k| k == key);
        assert_eq!(
            handed,
            vec![UnconfirmedUnits {
                key,
                region: us.region.clone(),
                units: 12
            }]
        );
        assert!(giver.hand_over_unconfirmed(0, &|k| k == other).is_empty());
        // Taken: the inherited units left with the key, the giver's own stay in its outbox.
        assert_eq!(giver.inherited_units(key, &us.region, 0), 0);
        assert_eq!(giver.unconfirmed(&us, key), 5);
    }

    /// Many distinct keys, more a sync interval than the pending table holds: the sender task
    /// (which sends when `poll_timeout` says something is due) sends a half-full table at once,
    /// so no global check is refused for a full table and every unit reaches the other region.
    /// Before, the table waited for the interval and filled up within it.
    #[test]
    fn distinct_keys_faster_than_the_table_holds_per_interval_are_all_admitted() {
        let config = ExchangeConfig {
            max_pending_keys: 1_000,
            max_deltas_per_message: 100,
            max_in_flight: 4,
            ..ExchangeConfig::for_regions(2)
        };
        let big_store = || {
            BucketStore::new(StoreConfig {
                max_keys: 16_384,
                shards: 4,
            })
            .unwrap()
        };
        let mut a = Node {
            exchange: Exchange::new(config, peer("a"), 1),
            store: big_store(),
        };
        let mut b = Node {
            exchange: Exchange::new(config, peer("b"), 1),
            store: big_store(),
        };
        let limit = Limit::gcra(10, NANOS_PER_SEC, 10).unwrap();
        let others = [peer("b")];
        // 20 new keys a millisecond for 400 ms: 2,000 keys an interval, twice the table.
        let mut admitted = 0;
        for ms in 0..400u64 {
            let now = NANOS_PER_SEC + ms * MS;
            for i in 0..20 {
                let key = BucketKey::for_key(format!("user:{ms}:{i}").as_bytes());
                let decision = a
                    .exchange
                    .check_global(now, &a.store, key, &limit, 1, &others)
                    .unwrap();
                admitted += u64::from(decision.is_allowed());
            }
            if a.exchange.poll_timeout().is_some_and(|due| due <= now) {
                settle(now, &mut a, &mut b);
            }
        }
        assert_eq!(a.exchange.stats().refused_outbox_full, 0);
        assert_eq!(admitted, 8_000);
        let end = NANOS_PER_SEC + 500 * MS;
        settle(end, &mut a, &mut b);
        assert_eq!(b.exchange.applied_from(&peer("a")), 8_000);
        assert!(a.exchange.is_idle());
    }

    #[test]
    fn a_restarted_receiver_applies_a_sender_past_the_window_at_once() {
        let (mut a, mut b) = (Node::new("a", 1), Node::new("b", 1));
        let mut now = NANOS_PER_SEC;
        for _ in 0..DEDUPE_WINDOW + 100 {
            a.admit(now, 1, &peer("b"));
            settle(now, &mut a, &mut b);
            now += 100 * MS;
        }
        assert!(a.exchange.is_idle());
        assert_eq!(b.exchange.applied_from(&peer("a")), DEDUPE_WINDOW + 100);
        // b restarts: a new session, its exchange state gone, its store kept.
        b.exchange = Exchange::new(ExchangeConfig::for_regions(2), peer("b"), 2);
        a.admit(now, 3, &peer("b"));
        settle(now, &mut a, &mut b);
        assert_eq!(b.exchange.applied_from(&peer("a")), 3);
        assert!(a.exchange.is_idle(), "the 3 units were confirmed");
        assert!(
            a.exchange
                .is_reachable(&peer("b"), now + 10 * NANOS_PER_SEC)
        );
        assert_eq!(b.exchange.stats().refused_messages, 0);
    }

    /// What was in flight when the receiver restarted goes again as soon as an acknowledgement
    /// shows the new session, not after the doubling wait.
    #[test]
    fn a_new_receiver_session_sends_what_is_in_flight_again_at_once() {
        let (mut a, mut b) = (Node::new("a", 1), Node::new("b", 1));
        let now = NANOS_PER_SEC;
        a.admit(now, 1, &peer("b"));
        settle(now, &mut a, &mut b);
        // A message of 2 units goes out and is lost; b restarts.
        a.admit(now + 200 * MS, 2, &peer("b"));
        assert!(a.exchange.poll_transmit(now + 200 * MS).is_some());
        b.exchange = Exchange::new(ExchangeConfig::for_regions(2), peer("b"), 2);
        // The next message reaches the new b, whose acknowledgement names its session: the
        // lost one is due at once.
        let later = now + 400 * MS;
        a.admit(later, 4, &peer("b"));
        settle(later, &mut a, &mut b);
        assert_eq!(b.exchange.applied_from(&peer("a")), 6);
        assert!(a.exchange.is_idle());
        assert_eq!(a.exchange.stats().receiver_restarts, 1);
    }

    /// A sender idle past `inbox_idle_ns` loses its inbox when a new sender needs the place;
    /// its next message starts a new one at its settled point, applied once.
    #[test]
    fn idle_inboxes_are_evicted_and_come_back_at_the_settled_point() {
        let config = ExchangeConfig {
            max_senders: 1,
            ..ExchangeConfig::for_regions(3)
        };
        let (mut a, mut c) = (Node::new("a", 1), Node::new("c", 1));
        let mut b = Node {
            exchange: Exchange::new(config, peer("b"), 1),
            store: store(),
        };
        let now = NANOS_PER_SEC;
        for i in 0..3 {
            a.admit(now + i * 200 * MS, 1, &peer("b"));
            settle(now + i * 200 * MS, &mut a, &mut b);
        }
        // c is refused while a's inbox is fresh ...
        c.admit(now, 1, &peer("b"));
        settle(now, &mut c, &mut b);
        assert_eq!(b.exchange.stats().refused_messages, 1);
        // ... and takes its place once a has been idle long enough.
        let idle = now + 400 * MS + b.exchange.config().inbox_idle_ns;
        settle(idle + 400 * MS, &mut c, &mut b);
        assert_eq!(b.exchange.applied_from(&peer("c")), 1);
        assert_eq!(b.exchange.stats().evicted_inboxes, 1);
        assert_eq!(b.exchange.inbox_count(), 1);
        assert_eq!(b.exchange.evict_idle_inboxes(idle), 0);
        // Everything c sent is confirmed, so a periodic sweep later forgets it too.
        let much_later = idle + 400 * MS + b.exchange.config().inbox_idle_ns;
        assert_eq!(b.exchange.evict_idle_inboxes(much_later), 1);
    }
}
