//! [`Members`]: who is in the cluster and where. The core's `Membership` (gossip and the failure
//! detector) behind its lock, the members' log and gauges, id conflicts and the refusal one may
//! bring, and the cluster version the members share.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use floodgate::cluster::{
    ConflictVerdict, IdConflict, MemberInfo, MemberState, Membership, Outgoing,
};
use floodgate::wire::{
    FrameKind, TableMember, encode_gossip, encode_message, member_state_to_wire,
};
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::address::HostPort;
use crate::member_log::MemberLog;
use crate::metrics::ClusterMetrics;

use super::lives::Lives;
use super::{COMPLAINT_INTERVAL_NS, JOIN_WAIT, OtherRegions, Peers};

/// Who is in the cluster, where, and in what state, as this node's gossip knows them.
#[derive(Debug)]
pub(crate) struct Members {
    me: MemberInfo,
    membership: Mutex<Membership>,
    /// Where gossip and id conflicts go.
    peers: Arc<Peers>,
    metrics: ClusterMetrics,
    /// Members' states as last logged: suspicion and death are logged at WARN as they happen.
    member_log: Mutex<MemberLog>,
    /// Members' incarnations as last seen: a restarted member's kept connections are closed.
    lives: Mutex<Lives>,
    /// Set (with the reason) once another node proved to hold this node's id first: this node
    /// is out of the cluster and its process should stop.
    refused: watch::Sender<Option<String>>,
    /// When the log may next say that no seed answered, or that an id is claimed twice.
    next_join_complaint_ns: AtomicU64,
    next_conflict_complaint_ns: AtomicU64,
    /// The cluster version last published (metric and log), to log it when it changes.
    published_cluster_version: AtomicU8,
}

/// The membership as a table update reads it, right after a change.
#[derive(Debug)]
pub(super) struct OwnersNow {
    pub(super) epoch: u64,
    /// This region's owners: a key has one owner per region, and this node's ring is its own
    /// region's.
    pub(super) owners: Vec<String>,
    /// Members that announced their leave.
    pub(super) departed: Vec<String>,
    /// Joined with nobody else in this region (it founded the cluster, or knows settled members
    /// of other regions only): the first of its region, with nobody to wait for (as a node
    /// whose seeds are all itself).
    pub(super) first_of_region: bool,
    /// What every slot-owning member of this region speaks: the ownership machine's releases
    /// go only to members of this region's table.
    pub(super) region_version: u8,
    /// Members of this region's owners just heard from in a new life: a restart this node's
    /// table never saw (the new life joined before its word came), whose release is owed.
    pub(super) restarted_owners: Vec<String>,
}

impl Members {
    pub(super) fn new(
        me: MemberInfo,
        membership: Membership,
        peers: Arc<Peers>,
        metrics: ClusterMetrics,
        now_ns: u64,
    ) -> Self {
        Members {
            me,
            membership: Mutex::new(membership),
            peers,
            metrics,
            member_log: Mutex::new(MemberLog::default()),
            lives: Mutex::new(Lives::default()),
            refused: watch::Sender::new(None),
            next_join_complaint_ns: AtomicU64::new(now_ns + JOIN_WAIT.as_nanos() as u64),
            next_conflict_complaint_ns: AtomicU64::new(0),
            published_cluster_version: AtomicU8::new(0),
        }
    }

    /// This node as the members know it: its id, address and region.
    pub(crate) fn me(&self) -> &MemberInfo {
        &self.me
    }

    /// The address of the member with this id.
    pub(crate) fn addr_of(&self, id: &str) -> Option<String> {
        self.membership.lock().info(id).map(|m| m.addr.clone())
    }

    /// The region the member with this id is known in.
    pub(crate) fn region_of(&self, id: &str) -> Option<String> {
        self.membership.lock().info(id).map(|m| m.region.clone())
    }

    /// Ids of the members the failure detector holds suspect or dead: silent for longer than a
    /// slow moment. Only those are taken over from (almost always none), and only their
    /// hand-offs are waited for briefly. A member that announced its leave is not among them:
    /// it is handing its buckets to the new owners, so a takeover decided from replicas, or a
    /// wait cut short, would miss its last decisions (merged, the hand-off's state does not add
    /// to what was decided without it).
    pub(crate) fn suspected_members(&self) -> Vec<String> {
        self.membership
            .lock()
            .members()
            .filter(|(_, state)| matches!(state, MemberState::Suspect | MemberState::Dead))
            .map(|(info, _)| info.id.clone())
            .collect()
    }

    /// The highest protocol version every member speaks, as far as gossip has told this node
    /// (0: their ranges share none).
    pub(crate) fn cluster_version(&self) -> u8 {
        self.membership.lock().cluster_version().unwrap_or(0)
    }

    /// The highest protocol version every member of this node's region speaks, as far as
    /// gossip has told this node: what stays among them (replicas, a join's releases, lease
    /// syncs, deltas passed on, RLQS relays) may use it, though another region still runs an
    /// older build.
    pub(crate) fn region_version(&self) -> u8 {
        self.membership
            .lock()
            .region_version(&self.me.region)
            .unwrap_or(0)
    }

    /// The highest protocol version this node and the member with this id both speak, as far
    /// as gossip has told this node (0: an unknown member, or ranges that share none): what a
    /// message for that member alone, never passed on, may use. Members of other regions on
    /// another build hold the cluster version down, not this.
    pub(crate) fn version_with(&self, id: &str) -> u8 {
        let membership = self.membership.lock();
        let mine = membership
            .versions_of(&self.me.id)
            .unwrap_or(floodgate::protocol::SUPPORTED);
        membership
            .versions_of(id)
            .and_then(|theirs| mine.highest_shared(theirs))
            .unwrap_or(0)
    }

    /// Applies `change` to the membership and reads what a table update needs: the owners, the
    /// members that left, the cluster version, the owners heard from in a new life. Logs the
    /// members whose state changed, has the peers close what they keep to a restarted member
    /// and learn the members' ids, and has `regions` follow the other regions' rings.
    pub(super) fn change(
        &self,
        change: impl FnOnce(&mut Membership),
        regions: &OtherRegions,
    ) -> OwnersNow {
        let mut membership = self.membership.lock();
        change(&mut membership);
        drop(self.member_log.lock().observe(&membership));
        let owners = membership.owners_in(&self.me.region);
        let mut restarted_owners = Vec::new();
        for life in self.lives.lock().restarted(&membership) {
            self.peers.forget(&life.addr);
            if owners.contains(&life.id) {
                restarted_owners.push(life.id.clone());
            }
        }
        self.peers
            .learn_ids(membership.members().map(|(info, _)| info));
        let departed: Vec<String> = membership
            .members()
            .filter(|(_, state)| *state == MemberState::Left)
            .map(|(info, _)| info.id.clone())
            .collect();
        let first_of_region = owners.len() == 1 && !membership.is_joining();
        regions.follow(&membership, &self.me.region);
        OwnersNow {
            epoch: membership.epoch(),
            owners,
            departed,
            first_of_region,
            region_version: membership.region_version(&self.me.region).unwrap_or(0),
            restarted_owners,
        }
    }

    /// Every seed turned out to be this node: it founds its cluster.
    pub(super) fn found(&self) {
        self.membership.lock().found();
    }

    /// Sends this round's gossip (the failure detector's timeouts run first).
    pub(super) fn gossip(&self, now_ns: u64) {
        let outgoing = self.membership.lock().poll(now_ns);
        for message in outgoing {
            drop(self.send_gossip(message));
        }
    }

    /// Sends gossip in the layout of the version the connection to its peer agreed on.
    pub(super) fn send_gossip(&self, message: Outgoing) -> tokio::task::JoinHandle<bool> {
        let gossip = message.gossip;
        self.peers.send_with(message.to, move |version| {
            let mut frame = Vec::new();
            encode_gossip(&mut frame, version, &gossip);
            frame
        })
    }

    /// Tells each node that claims a live node's id that it is refused.
    pub(super) fn tell_conflicts(&self, conflicts: Vec<IdConflict>, now_ns: u64) {
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

    /// Why the cluster refused this node (another live node holds its id), if it did.
    pub(crate) fn refusal(&self) -> Option<String> {
        self.refused.borrow().clone()
    }

    pub(crate) fn watch_refusal(&self) -> watch::Receiver<Option<String>> {
        self.refused.subscribe()
    }

    /// Says (at most once per `COMPLAINT_INTERVAL_NS`) that no seed answered yet, unless this
    /// node was refused.
    pub(super) fn complain_not_joined(&self, seeds: &[HostPort], now_ns: u64) {
        if self.refused.borrow().is_none()
            && self.time_to_complain(&self.next_join_complaint_ns, now_ns)
        {
            tracing::warn!(
                seeds = %seeds.iter().map(ToString::to_string).collect::<Vec<_>>().join(","),
                "not joined: no seed answered yet; serving alone and retrying"
            );
        }
    }

    /// True at most once per `COMPLAINT_INTERVAL_NS` for each `next` clock.
    fn time_to_complain(&self, next: &AtomicU64, now_ns: u64) -> bool {
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

    /// Publishes the cluster version and the region version, and logs when the cluster
    /// version changes: at INFO as the last member of an older build leaves or the first joins,
    /// at ERROR when the members share no version (a member that shares none with this node
    /// cannot connect; one between two others can).
    pub(super) fn publish_versions(&self) {
        self.metrics
            .region_version
            .set(f64::from(self.region_version()));
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

    /// Publishes how many members are in each state.
    pub(super) fn publish_members(&self) {
        let mut counts = [0usize; 4];
        for (_, state) in self.membership.lock().members() {
            counts[usize::from(member_state_to_wire(state))] += 1;
        }
        for (gauge, count) in self.metrics.members.iter().zip(counts) {
            gauge.set(count as f64);
        }
    }

    /// The members as the slot-table message lists them: ids, addresses, regions, states and
    /// protocol versions.
    pub(super) fn table_members(&self) -> Vec<TableMember> {
        let membership = self.membership.lock();
        membership
            .members()
            .map(|(info, state)| TableMember {
                id: info.id.clone(),
                addr: info.addr.clone(),
                region: info.region.clone(),
                state: member_state_to_wire(state),
                versions: membership.versions_of(&info.id),
            })
            .collect()
    }

    /// True when the members, their states and their versions are still exactly `members`.
    pub(super) fn are(&self, members: &[TableMember]) -> bool {
        let membership = self.membership.lock();
        let mut now = membership.members();
        members.iter().all(|m| {
            now.next().is_some_and(|(info, state)| {
                m.id == info.id
                    && m.addr == info.addr
                    && m.region == info.region
                    && m.state == member_state_to_wire(state)
                    && m.versions == membership.versions_of(&info.id)
            })
        }) && now.next().is_none()
    }

    /// The membership itself, for tests that play another member's part.
    #[cfg(test)]
    pub(super) fn membership(&self) -> parking_lot::MutexGuard<'_, Membership> {
        self.membership.lock()
    }
}
