//! The node's part of the cluster: membership gossip over QUIC, the slot table, replication of
//! changed buckets to each slot's successor, and hand-off of buckets to new owners (on join,
//! and before a graceful leave). The decisions live in the core's sans-I/O `Membership` and
//! `SlotTable`; this module only moves their messages and runs their timers.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use floodgate::cluster::{Gossip, MemberInfo, Membership, MembershipConfig, SlotTable};
use floodgate::wire::{
    FrameKind, ReplicateMessage, SlotTableMessage, TableMember, WireBucket, encode_message,
    member_state_to_wire,
};
use floodgate::{BucketState, Clock};
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::server::Shared;

/// Most buckets in one replication or hand-off frame (keeps frames well under the frame limit).
const BUCKETS_PER_FRAME: usize = 16_384;
/// Longest a check waits for a starting node to hear from the cluster it joins.
const JOIN_WAIT: Duration = Duration::from_secs(1);
/// Longest a check on a gained slot waits for the previous owner's hand-off.
const HANDOFF_WAIT_NS: u64 = 500_000_000;
/// Longest a message to a peer may take before it is given up.
const PEER_TIMEOUT: Duration = Duration::from_secs(1);

/// How this node takes part in a cluster.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// Stable id of this node (default: its advertised address).
    pub node_id: Option<String>,
    pub region: String,
    /// Address peers and clients reach this node at (default: the listen address).
    pub advertise: Option<SocketAddr>,
    /// Any members to join through.
    pub seeds: Vec<SocketAddr>,
    pub membership: MembershipConfig,
    /// How often changed buckets go to each slot's successor.
    pub sync_interval: Duration,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            node_id: None,
            region: "local".to_owned(),
            advertise: None,
            seeds: Vec::new(),
            membership: MembershipConfig::default(),
            sync_interval: Duration::from_millis(100),
        }
    }
}

/// Connections to other nodes, opened on demand and reused.
#[derive(Debug)]
pub(crate) struct Peers {
    endpoint: quinn::Endpoint,
    config: quinn::ClientConfig,
    connections: Mutex<HashMap<String, quinn::Connection>>,
}

impl Peers {
    async fn connection(&self, addr: &str) -> anyhow::Result<quinn::Connection> {
        if let Some(connection) = self.connections.lock().get(addr)
            && connection.close_reason().is_none()
        {
            return Ok(connection.clone());
        }
        let socket: SocketAddr = addr
            .parse()
            .with_context(|| format!("peer address {addr}"))?;
        let connecting = self
            .endpoint
            .connect_with(self.config.clone(), socket, "localhost")?;
        let connection = tokio::time::timeout(PEER_TIMEOUT, connecting)
            .await
            .context("peer handshake timed out")??;
        self.connections
            .lock()
            .insert(addr.to_owned(), connection.clone());
        Ok(connection)
    }

    /// Sends one frame on its own unidirectional stream, in the background (gossip, replication).
    pub(crate) fn send(
        self: &Arc<Self>,
        addr: String,
        frame: Vec<u8>,
    ) -> tokio::task::JoinHandle<()> {
        let peers = self.clone();
        tokio::spawn(async move {
            let sent = tokio::time::timeout(PEER_TIMEOUT, async {
                let connection = peers.connection(&addr).await?;
                let mut stream = connection.open_uni().await?;
                stream.write_all(&frame).await?;
                stream.finish()?;
                // Done only once the peer has acknowledged the data: a leaving node closes its
                // endpoint right after its hand-off, which would drop unacknowledged bytes.
                stream.stopped().await?;
                anyhow::Ok(())
            })
            .await;
            if !matches!(sent, Ok(Ok(()))) {
                tracing::debug!(%addr, "peer message not delivered");
            }
        })
    }

    /// Sends one frame on a bidirectional stream and returns every byte of the answer.
    pub(crate) async fn request(
        &self,
        addr: &str,
        frame: &[u8],
        max_bytes: usize,
    ) -> anyhow::Result<Vec<u8>> {
        tokio::time::timeout(PEER_TIMEOUT, async {
            let connection = self.connection(addr).await?;
            let (mut send, mut recv) = connection.open_bi().await?;
            send.write_all(frame).await?;
            send.finish()?;
            Ok(recv.read_to_end(max_bytes).await?)
        })
        .await
        .context("peer did not answer in time")?
    }
}

/// The cluster state one node keeps.
#[derive(Debug)]
pub(crate) struct Cluster {
    pub(crate) me: MemberInfo,
    config: ClusterConfig,
    membership: Mutex<Membership>,
    /// The current table; a watch so tests and tools can await changes instead of polling.
    table: watch::Sender<Arc<SlotTable>>,
    pub(crate) peers: Arc<Peers>,
    /// Slots this node just gained from a live previous owner, until that owner's hand-off
    /// arrives (or the deadline passes): checks on them wait, so the bucket is never decided
    /// fresh while its state is on the way.
    pending: Mutex<HashMap<u16, (String, u64)>>,
    handoff_arrived: tokio::sync::Notify,
    /// When each peer's last hand-off arrived: one that came before this node adopted the table
    /// that expects it counts.
    handoffs_seen: Mutex<HashMap<String, u64>>,
    /// Set while a node started with seeds has not yet heard from the cluster: its table of one
    /// is not real ownership, so its first real table's hand-over is computed against the
    /// cluster without it (what everybody else saw before it joined).
    joining: std::sync::atomic::AtomicBool,
}

impl Cluster {
    pub(crate) fn new(
        config: ClusterConfig,
        listen: SocketAddr,
        endpoint: quinn::Endpoint,
        peer_config: quinn::ClientConfig,
        now_ns: u64,
    ) -> Self {
        let addr = config.advertise.unwrap_or(listen).to_string();
        let me = MemberInfo {
            id: config.node_id.clone().unwrap_or_else(|| addr.clone()),
            addr,
            region: config.region.clone(),
        };
        let seeds = config.seeds.iter().map(ToString::to_string).collect();
        // The start time in ms is the incarnation: a restart always comes back newer.
        let membership = Membership::new(
            me.clone(),
            now_ns / 1_000_000,
            seeds,
            config.membership,
            now_ns,
            now_ns,
        );
        let table = SlotTable::compute(membership.epoch(), &membership.owners());
        Cluster {
            me,
            membership: Mutex::new(membership),
            table: watch::Sender::new(Arc::new(table)),
            peers: Arc::new(Peers {
                endpoint,
                config: peer_config,
                connections: Mutex::new(HashMap::new()),
            }),
            pending: Mutex::new(HashMap::new()),
            handoff_arrived: tokio::sync::Notify::new(),
            handoffs_seen: Mutex::new(HashMap::new()),
            joining: std::sync::atomic::AtomicBool::new(!config.seeds.is_empty()),
            config,
        }
    }

    pub(crate) fn table(&self) -> Arc<SlotTable> {
        self.table.borrow().clone()
    }

    pub(crate) fn watch_table(&self) -> watch::Receiver<Arc<SlotTable>> {
        self.table.subscribe()
    }

    /// While a node started with seeds has not heard from the cluster, its table of one is not
    /// real ownership: checks wait (bounded) until it has joined, or decide alone after that.
    pub(crate) async fn wait_until_joined(&self) {
        if !self.joining.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let mut tables = self.watch_table();
        let _ = tokio::time::timeout(JOIN_WAIT, async {
            while self.joining.load(std::sync::atomic::Ordering::Relaxed) {
                if tables.changed().await.is_err() {
                    return;
                }
            }
        })
        .await;
    }

    /// The address of the member with this id.
    pub(crate) fn addr_of(&self, id: &str) -> Option<String> {
        self.membership.lock().info(id).map(|m| m.addr.clone())
    }

    pub(crate) fn handle_gossip(&self, shared: &Shared, now_ns: u64, gossip: &Gossip) {
        self.membership.lock().handle_gossip(now_ns, gossip);
        self.refresh_table(shared, now_ns);
    }

    /// The slot table and members, as clients and `floodgate status` receive them.
    pub(crate) fn table_message(&self) -> SlotTableMessage {
        let table = self.table();
        let membership = self.membership.lock();
        let members: Vec<TableMember> = membership
            .members()
            .map(|(info, state)| TableMember {
                id: info.id.clone(),
                addr: info.addr.clone(),
                region: info.region.clone(),
                state: member_state_to_wire(state),
            })
            .collect();
        let index = |id: &str| {
            members
                .iter()
                .position(|m| m.id == id)
                .map_or(u16::MAX, |i| i as u16)
        };
        let owners = (0..floodgate::cluster::SLOTS as u16)
            .map(|s| table.owner(s).map_or(u16::MAX, index))
            .collect();
        SlotTableMessage {
            version: table.version(),
            epoch: table.epoch(),
            from: self.me.id.clone(),
            members,
            owners,
        }
    }

    /// Recomputes the slot table when the owners changed, and hands the buckets of every slot
    /// this node no longer owns to its new owner.
    fn refresh_table(&self, shared: &Shared, now_ns: u64) {
        let (epoch, owners) = {
            let membership = self.membership.lock();
            (membership.epoch(), membership.owners())
        };
        let old = self.table();
        if old.epoch() == epoch {
            return;
        }
        let new = Arc::new(SlotTable::compute(epoch, &owners));
        if owners.len() > 1
            && self
                .joining
                .swap(false, std::sync::atomic::Ordering::Relaxed)
        {
            let others: Vec<String> = owners
                .iter()
                .filter(|o| **o != self.me.id)
                .cloned()
                .collect();
            self.expect_handoffs(&SlotTable::compute(0, &others), &new, now_ns);
        } else {
            self.expect_handoffs(&old, &new, now_ns);
        }
        self.table.send_replace(new.clone());
        shared.metrics.table_epoch.set(epoch as f64);
        self.publish_members(shared);
        tracing::info!(epoch, owners = ?owners, "slot table changed");
        // Sent in the background: the new owner merges whatever arrives (later TAT wins).
        drop(self.hand_off(shared, &old, &new, now_ns));
    }

    /// Marks the slots this node gains from a live previous owner as pending until that
    /// owner's hand-off arrives (every node that loses slots to a live node sends one, empty or
    /// not). Slots of a dead or departed node are not pending: the successor already holds the
    /// replicas, or the hand-off came before the leave.
    fn expect_handoffs(&self, old: &SlotTable, new: &SlotTable, now_ns: u64) {
        let until = now_ns.saturating_add(HANDOFF_WAIT_NS);
        let me = self.me.id.as_str();
        let seen = self.handoffs_seen.lock();
        let arrived = |owner: &str| {
            seen.get(owner)
                .is_some_and(|at| now_ns.saturating_sub(*at) < HANDOFF_WAIT_NS)
        };
        // A member that left gracefully hands its buckets over; a dead one cannot.
        let membership = self.membership.lock();
        let departed =
            |owner: &str| membership.state_of(owner) == Some(floodgate::cluster::MemberState::Left);
        let mut pending = self.pending.lock();
        pending.retain(|_, (_, end)| *end > now_ns);
        for slot in 0..floodgate::cluster::SLOTS as u16 {
            if let (Some(before), Some(me_now)) = (old.owner(slot), new.owner(slot))
                && me_now == me
                && before != me
                && (new.nodes().iter().any(|n| n == before) || departed(before))
                && !arrived(before)
            {
                pending.insert(slot, (before.to_owned(), until));
            }
        }
    }

    /// Waits (bounded by the pending deadline) until none of `slots` awaits a hand-off.
    pub(crate) async fn wait_for_handoffs(
        &self,
        slots: impl Iterator<Item = u16> + Clone,
        now_ns: u64,
    ) {
        // `now_ns` is when the frame was read; deadlines count from then, however often a
        // hand-off from another peer wakes this loop.
        let started = tokio::time::Instant::now();
        loop {
            // Created before the look, so a hand-off arriving in between still wakes it.
            let notified = self.handoff_arrived.notified();
            let latest = {
                let pending = self.pending.lock();
                if pending.is_empty() {
                    return;
                }
                slots
                    .clone()
                    .filter_map(|s| pending.get(&s))
                    .map(|(_, until)| *until)
                    .filter(|u| *u > now_ns)
                    .max()
            };
            let Some(until) = latest else { return };
            let deadline = started + std::time::Duration::from_nanos(until - now_ns);
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                self.pending.lock().retain(|_, (_, end)| *end > until);
                return;
            }
        }
    }

    /// A hand-off from `from` arrived: its slots are no longer pending.
    pub(crate) fn handoff_received(&self, from: &str, now_ns: u64) {
        self.handoffs_seen.lock().insert(from.to_owned(), now_ns);
        self.pending.lock().retain(|_, (owner, _)| owner != from);
        self.handoff_arrived.notify_waiters();
    }

    fn publish_members(&self, shared: &Shared) {
        let mut counts = [0usize; 4];
        for (_, state) in self.membership.lock().members() {
            counts[usize::from(member_state_to_wire(state))] += 1;
        }
        for (gauge, count) in shared.metrics.members.iter().zip(counts) {
            gauge.set(count as f64);
        }
    }

    /// Sends the buckets of slots whose owner was this node in `old` and someone else in `new`.
    fn hand_off(
        &self,
        shared: &Shared,
        old: &SlotTable,
        new: &SlotTable,
        now_ns: u64,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let me = self.me.id.as_str();
        let mut moved: HashMap<String, Vec<BucketState>> = HashMap::new();
        let mut buckets = Vec::new();
        shared.store.export(
            now_ns,
            &|key| {
                old.owner(key.slot()) == Some(me) && new.owner(key.slot()).is_some_and(|o| o != me)
            },
            &mut buckets,
        );
        for bucket in buckets {
            if let Some(owner) = new.owner(bucket.key.slot()) {
                moved.entry(owner.to_owned()).or_default().push(bucket);
            }
        }
        // Every node that gains slots from us hears from us, even with no buckets: it holds
        // checks on those slots until then.
        for slot in 0..floodgate::cluster::SLOTS as u16 {
            if old.owner(slot) == Some(me)
                && let Some(owner) = new.owner(slot)
                && owner != me
            {
                moved.entry(owner.to_owned()).or_default();
            }
        }
        let mut sends = Vec::new();
        for (owner, buckets) in moved {
            shared.metrics.handed_off.increment(buckets.len() as u64);
            sends.extend(self.send_buckets(&owner, true, &buckets));
        }
        sends
    }

    fn send_buckets(
        &self,
        owner_id: &str,
        handoff: bool,
        buckets: &[BucketState],
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let Some(addr) = self.addr_of(owner_id) else {
            return Vec::new();
        };
        let mut sends = Vec::new();
        // At least one message, so an empty hand-off is still announced.
        let chunks: Vec<&[BucketState]> = if buckets.is_empty() {
            vec![&[]]
        } else {
            buckets.chunks(BUCKETS_PER_FRAME).collect()
        };
        for chunk in chunks {
            let message = ReplicateMessage {
                from: self.me.id.clone(),
                handoff,
                buckets: chunk.iter().map(WireBucket::from).collect(),
            };
            let mut frame = Vec::new();
            encode_message(&mut frame, FrameKind::Replicate, 0, &message);
            sends.push(self.peers.send(addr.clone(), frame));
        }
        sends
    }

    /// One round of gossip, then (every sync interval) replication of changed buckets.
    fn gossip_round(&self, shared: &Shared, now_ns: u64) {
        let outgoing = self.membership.lock().poll(now_ns);
        for message in outgoing {
            let mut frame = Vec::new();
            encode_message(&mut frame, FrameKind::Gossip, 0, &message.gossip);
            self.peers.send(message.to, frame);
        }
        self.refresh_table(shared, now_ns);
    }

    fn replicate(&self, shared: &Shared, now_ns: u64) {
        let table = self.table();
        // Alone, there is nobody to replicate to; changed marks stay set, so a node that joins
        // later still receives them (through the hand-off first).
        if table.nodes().len() < 2 {
            return;
        }
        let mut changed = Vec::new();
        shared.store.take_changed(now_ns, &mut changed);
        let me = self.me.id.as_str();
        let mut by_target: HashMap<&str, Vec<BucketState>> = HashMap::new();
        for bucket in changed {
            let slot = bucket.key.slot();
            // Our slots go to their successor; anything decided here for another owner (a
            // forward that failed) goes to that owner.
            let target = match table.owner(slot) {
                Some(owner) if owner == me => table.successor(slot),
                other => other,
            };
            if let Some(target) = target {
                by_target.entry(target).or_default().push(bucket);
            }
        }
        for (target, buckets) in by_target {
            shared.metrics.replicated.increment(buckets.len() as u64);
            drop(self.send_buckets(target, false, &buckets));
        }
    }

    /// Announces a graceful leave and hands every bucket to its owner without this node.
    pub(crate) async fn leave(&self, shared: &Shared) {
        let now_ns = shared.clock.now_ns();
        // The table as it stands before the leave: the gossip loop may adopt the table without
        // this node at any moment from here on.
        let old = self.table();
        let outgoing = self.membership.lock().leave(now_ns);
        let others: Vec<String> = old
            .nodes()
            .iter()
            .filter(|n| **n != self.me.id)
            .cloned()
            .collect();
        let new = Arc::new(SlotTable::compute(old.epoch() + 1, &others));
        // Switch first: from here on checks that arrive are forwarded to the new owners, so the
        // export below holds everything this node decided. The new owners hold checks on these
        // slots until the hand-off arrives (they see the leave as `Left`, not dead).
        self.table.send_replace(new.clone());
        for message in outgoing {
            let mut frame = Vec::new();
            encode_message(&mut frame, FrameKind::Gossip, 0, &message.gossip);
            drop(self.peers.send(message.to, frame));
        }
        let sends = self.hand_off(shared, &old, &new, now_ns);
        // Each send is bounded by PEER_TIMEOUT; the endpoint must not close before they land.
        for send in sends {
            let _ = send.await;
        }
    }
}

/// Runs gossip rounds and replication until shutdown.
pub(crate) async fn run(shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    let cluster = &shared.cluster;
    let tick = Duration::from_nanos(cluster.config.membership.gossip_interval_ns / 2)
        .max(Duration::from_millis(5));
    let mut ticker = tokio::time::interval(tick);
    let sync_ns = u64::try_from(cluster.config.sync_interval.as_nanos()).unwrap_or(u64::MAX);
    let mut next_sync_ns = 0;
    let mut last_sync_ns = 0;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => return,
        }
        let now_ns = shared.clock.now_ns();
        cluster.gossip_round(&shared, now_ns);
        if now_ns >= next_sync_ns {
            cluster.replicate(&shared, now_ns);
            if last_sync_ns > 0 {
                shared
                    .metrics
                    .replication_lag
                    .set((now_ns - last_sync_ns) as f64 / 1e9);
            }
            last_sync_ns = now_ns;
            next_sync_ns = now_ns + sync_ns;
        }
    }
}
