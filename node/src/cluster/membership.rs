//! The membership driver: gossip in and out, id conflicts, the join and readiness, and a
//! graceful leave.

use std::sync::atomic::{AtomicU64, Ordering};

use floodgate::Clock;
use floodgate::cluster::ownership::Action;
use floodgate::cluster::{ConflictVerdict, Gossip, IdConflict};
use floodgate::wire::{FrameKind, encode_gossip, encode_message, member_state_to_wire};
use tokio::sync::watch;

use super::{COMPLAINT_INTERVAL_NS, Cluster, JOIN_WAIT};

impl Cluster {
    /// While a node started with seeds has not heard from the cluster, its table of one is not
    /// real ownership: checks wait (bounded) until it has joined, or decide alone after that.
    pub(crate) async fn wait_until_joined(&self) {
        if !self.joining.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let _ = tokio::time::timeout(JOIN_WAIT, self.joined()).await;
        if self.joining.load(std::sync::atomic::Ordering::Relaxed) {
            self.ownership.lock().handle_join_wait_expired();
        }
    }

    /// Resolves once this node has its first real table (at once for a node without seeds).
    pub(crate) async fn joined(&self) {
        loop {
            // Registered before the look, so a join in between still wakes it.
            let joined = self.joined.notified();
            tokio::pin!(joined);
            joined.as_mut().enable();
            if !self.joining.load(std::sync::atomic::Ordering::Relaxed) {
                return;
            }
            joined.await;
        }
    }

    /// Takes a peer's gossip; `own` says which members' digests are the sender's own word (the
    /// members its certificate names), the others being relays.
    pub(crate) fn handle_gossip(&self, now_ns: u64, own: &dyn Fn(&str) -> bool, gossip: &Gossip) {
        let mut conflicts = Vec::new();
        drop(self.update_table(now_ns, |membership| {
            conflicts = membership.handle_gossip_from(now_ns, own, gossip)
        }));
        self.publish_cluster_version();
        for conflict in conflicts {
            if self.time_to_complain(&self.next_conflict_complaint_ns, now_ns) {
                tracing::warn!(
                    id = %conflict.id,
                    holder = %conflict.holder_addr,
                    claimant = %conflict.claimant_addr,
                    "refused a second node claiming a live node's id; telling it"
                );
            }
            let mut frame = Vec::new();
            encode_message(&mut frame, FrameKind::IdConflict, 0, &conflict);
            drop(self.peers.send(conflict.claimant_addr.clone(), frame));
        }
    }

    /// Another member says our id is held elsewhere: the node that started later yields.
    /// Handles a conflict a peer sent. Any peer can send one, so a conflict that would make
    /// this node yield counts only once the holder proves it: a node at `holder_addr` whose
    /// certificate names this node's id (which only a node given that id has).
    pub(crate) async fn handle_conflict(&self, conflict: &IdConflict, now_ns: u64) {
        let judged = self.membership.lock().judge_conflict(conflict);
        if judged == ConflictVerdict::Refused
            && !self
                .peers
                .proves_id(&conflict.holder_addr, &conflict.id)
                .await
        {
            self.metrics.unproven_conflicts.increment(1);
            if self.time_to_complain(&self.next_conflict_complaint_ns, now_ns) {
                tracing::warn!(
                    id = %conflict.id,
                    holder = %conflict.holder_addr,
                    "ignored an id conflict: nothing at the holder's address proves that id"
                );
            }
            return;
        }
        let verdict = self.membership.lock().handle_conflict(conflict);
        match verdict {
            ConflictVerdict::Ignored => {}
            ConflictVerdict::Refused => {
                let reason = format!(
                    "node id {:?} is already held by the live node at {} (this node, at {}, \
                     started later): give this node another --node-id, or stop the other one",
                    conflict.id, conflict.holder_addr, self.me.addr
                );
                tracing::error!("refused by the cluster: {reason}");
                self.refused.send_if_modified(|r| {
                    let first = r.is_none();
                    if first {
                        *r = Some(reason);
                    }
                    first
                });
            }
            // Repeats while the other node's claim is gossiped: said once a second at most.
            ConflictVerdict::Kept
                if self.time_to_complain(&self.next_conflict_complaint_ns, now_ns) =>
            {
                tracing::error!(
                    id = %conflict.id,
                    other = %conflict.holder_addr,
                    "another node claims this node's id; this node started first and keeps it"
                );
            }
            ConflictVerdict::Kept => {}
        }
    }

    /// Why this node is not ready to serve with the cluster, or `None` when it is.
    pub(crate) fn not_ready_reason(&self) -> Option<String> {
        if let Some(reason) = self.refused.borrow().as_ref() {
            return Some(format!("refused: {reason}"));
        }
        if self.joining.load(std::sync::atomic::Ordering::Relaxed) && !self.config.allow_alone {
            return Some("not joined: no seed answered".to_owned());
        }
        None
    }

    pub(crate) fn watch_refusal(&self) -> watch::Receiver<Option<String>> {
        self.refused.subscribe()
    }

    /// True at most once per `COMPLAINT_INTERVAL_NS` for each `next` clock.
    pub(super) fn time_to_complain(&self, next: &AtomicU64, now_ns: u64) -> bool {
        let due = next.load(Ordering::Relaxed);
        now_ns >= due
            && next
                .compare_exchange(
                    due,
                    now_ns + COMPLAINT_INTERVAL_NS,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    /// One round of gossip, then (every sync interval) replication of changed buckets.
    pub(super) fn gossip_round(&self, now_ns: u64) {
        if self.joining.load(Ordering::Relaxed)
            && self
                .peers
                .seeds_are_all_me(&self.config.seeds, &self.me.addr)
        {
            // Every seed name turned out to be this node: like a node without seeds, it is the
            // first of its cluster and has nobody to wait for. Under the update lock, so no
            // table update sees the flag change halfway (busy: the next round retries).
            if let Some(_one_at_a_time) = self.updating.try_lock() {
                self.membership.lock().found();
                let actions: Vec<Action> = {
                    let mut ownership = self.ownership.lock();
                    ownership.handle_no_one_to_join(now_ns);
                    std::iter::from_fn(|| ownership.poll_action()).collect()
                };
                drop(self.carry_out(actions, now_ns));
            }
        }
        if self.joining.load(Ordering::Relaxed)
            && self.refused.borrow().is_none()
            && self.time_to_complain(&self.next_join_complaint_ns, now_ns)
        {
            tracing::warn!(
                seeds = %self.config.seeds.iter().map(ToString::to_string).collect::<Vec<_>>().join(","),
                "not joined: no seed answered yet; serving alone and retrying"
            );
        }
        {
            // Waits for members newly suspected shorten (those alive again lengthen); waits
            // that ran out end in the machine too (checks already look lazily). Read before
            // the ownership lock: the membership lock is never taken inside it.
            let suspected = self.suspected_members();
            let mut ownership = self.ownership.lock();
            ownership.handle_suspicion(suspected);
            if ownership.poll_timeout().is_some_and(|at| at <= now_ns) {
                ownership.handle_timeout(now_ns);
            }
        }
        let outgoing = self.membership.lock().poll(now_ns);
        for message in outgoing {
            self.send_gossip(message);
        }
        self.publish_cluster_version();
        // Members declared suspect or dead by `poll` change the owners.
        drop(self.update_table(now_ns, |_| {}));
    }

    /// Sends gossip in the layout of the version the connection to its peer agreed on.
    fn send_gossip(&self, message: floodgate::cluster::Outgoing) -> tokio::task::JoinHandle<bool> {
        let gossip = message.gossip;
        self.peers.send_with(message.to, move |version| {
            let mut frame = Vec::new();
            encode_gossip(&mut frame, version, &gossip);
            frame
        })
    }

    /// The highest protocol version every member speaks, as far as gossip has told this node
    /// (0: their ranges share none).
    pub(crate) fn cluster_version(&self) -> u8 {
        self.membership.lock().cluster_version().unwrap_or(0)
    }

    /// Publishes the cluster version, and logs when it changes: at INFO as the last member of
    /// an older build leaves or the first joins, at ERROR when the members share no version
    /// (a member that shares none with this node cannot connect; one between two others can).
    fn publish_cluster_version(&self) {
        let version = self.cluster_version();
        let before = self
            .published_cluster_version
            .swap(version, Ordering::Relaxed);
        if before == version {
            return;
        }
        self.metrics.cluster_version.set(f64::from(version));
        if version == 0 {
            let membership = self.membership.lock();
            let ranges: Vec<String> = membership
                .members()
                .filter(|(_, state)| state.owns_slots())
                .filter_map(|(info, _)| {
                    let range = membership.versions_of(&info.id)?;
                    Some(format!("{} speaks {range}", info.id))
                })
                .collect();
            tracing::error!(
                "the members share no protocol version ({}): upgrade or stop the odd ones out",
                ranges.join(", ")
            );
        } else if before != 0 {
            tracing::info!(
                from = before,
                to = version,
                "the cluster now speaks protocol version {version}"
            );
        }
    }

    pub(super) fn publish_members(&self) {
        let mut counts = [0usize; 4];
        for (_, state) in self.membership.lock().members() {
            counts[usize::from(member_state_to_wire(state))] += 1;
        }
        for (gauge, count) in self.metrics.members.iter().zip(counts) {
            gauge.set(count as f64);
        }
    }

    /// Announces a graceful leave and hands every bucket to its owner without this node.
    pub(crate) async fn leave(&self) {
        let now_ns = self.clock.now_ns();
        let mut outgoing = Vec::new();
        // From the switch on, checks that arrive are forwarded to the new owners, and forwarded
        // checks for these slots are answered `not_owner`; the new owners hold checks on them
        // until the hand-off arrives (they see the leave as `Left`, not dead).
        let sends = self.update_table(now_ns, |membership| outgoing = membership.leave(now_ns));
        for message in outgoing {
            drop(self.send_gossip(message));
        }
        // Each hand-off frame is tried a few times, each try bounded by PEER_TIMEOUT; the
        // endpoint must not close before they land.
        let mut lost = 0;
        for send in sends {
            lost += usize::from(!matches!(send.await, Ok(true)));
        }
        if lost > 0 {
            // Their new owners decide those slots once their wait for it runs out.
            tracing::warn!(
                lost,
                "leave: hand-off messages not delivered to the new owners"
            );
        }
    }
}
