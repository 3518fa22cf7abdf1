//! The node's part of the cluster: membership gossip over QUIC, the slot table, replication of
//! changed buckets to each slot's successor, and hand-off of buckets to new owners (on join,
//! and before a graceful leave). The decisions live in the core's sans-I/O `Membership` and
//! `SlotTable`; this module only moves their messages and runs their timers.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use floodgate::cluster::ownership::{Action, HandOff, Ownership, OwnershipConfig, ReceivedPart};
use floodgate::cluster::{
    ConflictVerdict, Gossip, IdConflict, MemberInfo, MemberState, Membership, SlotTable,
};
use floodgate::wire::{
    FrameKind, HandoffPart, ReplicateMessage, SlotTableMessage, TableMember, WireBucket,
    encode_message, member_state_to_wire,
};
use floodgate::{BucketState, BucketStore, Clock};
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::address::HostPort;
use crate::clock::NodeClock;
use crate::member_log::MemberLog;
use crate::metrics::ClusterMetrics;

/// Most encoded bytes of buckets in one replication or hand-off frame: well under the smallest
/// frame limit a node accepts (`NodeLimits` refuses less than this plus room for the rest).
const BUCKET_BYTES_PER_FRAME: usize = 256 * 1024;
/// Longest a check waits for a starting node to hear from the cluster it joins.
const JOIN_WAIT: Duration = Duration::from_secs(1);
/// Longest a message to a peer may take before it is given up.
const PEER_TIMEOUT: Duration = Duration::from_secs(1);
/// How often a node whose seeds do not answer, or that receives conflicting claims on an id,
/// says so in the log (gossip retries every round; the log need not).
const COMPLAINT_INTERVAL_NS: u64 = 1_000_000_000;
/// Longest a seed's name may take to resolve before the dial is given up (retried next round).
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(1);

pub use crate::config::ClusterConfig;

/// Most members whose address and last dial failure are remembered (membership is bounded;
/// this only keeps hostile gossip from growing the maps).
const MAX_KNOWN_PEERS: usize = 4_096;

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
    /// This node's own addresses (advertised, and listened on when specific): a seed name that
    /// resolves to one of them is this node, never dialed.
    own_addrs: Vec<SocketAddr>,
    /// Seed names found to resolve to this node alone (one seed list for every node).
    self_seeds: Mutex<std::collections::HashSet<String>>,
    resolve_failures: metrics::Counter,
}

impl Peers {
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
    fn seeds_are_all_me(&self, seeds: &[HostPort], me: &str) -> bool {
        let self_seeds = self.self_seeds.lock();
        seeds.iter().all(|s| {
            let text = s.to_string();
            text == me || self_seeds.contains(&text)
        })
    }

    /// Logs (at ERROR, once per new reason) and counts a failed handshake: a certificate the
    /// peer CA does not sign, a name that is not the node id, a peer that refuses ours.
    fn handshake_failed(&self, addr: &str, id: Option<&str>, error: &quinn::ConnectionError) {
        self.handshake_failures.increment(1);
        let reason = error.to_string();
        if !self.note_failure(addr, &reason) {
            tracing::debug!(peer = %addr, "peer handshake failed again: {reason}");
            return;
        }
        let expected = id.unwrap_or("(a seed: any node of the peer CA)");
        tracing::error!(peer = %addr, node_id = %expected, "peer handshake failed: {reason}");
    }

    /// Sends one frame on its own unidirectional stream, in the background (gossip, replication).
    /// The task ends true once the peer has the whole frame.
    pub(crate) fn send(
        self: &Arc<Self>,
        addr: String,
        frame: Vec<u8>,
    ) -> tokio::task::JoinHandle<bool> {
        let peers = self.clone();
        tokio::spawn(async move {
            let sent = tokio::time::timeout(PEER_TIMEOUT, async {
                let connection = peers.connection(&addr).await?;
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
            if !delivered {
                tracing::debug!(%addr, "peer message not delivered");
            }
            delivered
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

/// From this many owners a table takes milliseconds to compute (about 3 ms for 100, 25 ms for
/// 1,000, measured by the `slots` benchmark).
const BIG_TABLE: usize = 64;

/// Computes a slot table. A big one is computed with the runtime told that this worker blocks,
/// so the worker's other tasks move to another thread meanwhile (a current-thread runtime, as
/// in some tests, has nowhere to move them and computes inline).
fn compute_table(epoch: u64, owners: &[String]) -> SlotTable {
    off_the_worker(owners.len() >= BIG_TABLE, || {
        SlotTable::compute(epoch, owners)
    })
}

/// Runs `work`, when `blocks`, with the runtime told this worker blocks (on a multi-thread
/// runtime; elsewhere inline).
fn off_the_worker<T>(blocks: bool, work: impl FnOnce() -> T) -> T {
    let multi_thread = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if blocks && multi_thread {
        tokio::task::block_in_place(work)
    } else {
        work()
    }
}

/// The cluster state one node keeps.
#[derive(Debug)]
pub(crate) struct Cluster {
    pub(crate) me: MemberInfo,
    config: ClusterConfig,
    membership: Mutex<Membership>,
    /// Who decides which slot while slots move: the table in force and the ones before it,
    /// the slots given away, gained slots waiting for their hand-off, the join phase. The core's
    /// sans-I/O machine; this driver feeds it and carries out its actions.
    ownership: Mutex<Ownership>,
    /// The machine's table, published: a watch so tests and tools can await changes instead of
    /// polling, and checks read it without the machine's lock.
    table: watch::Sender<Arc<SlotTable>>,
    pub(crate) peers: Arc<Peers>,
    /// Rung when a hand-off completes: checks waiting on gained slots look again.
    handoff_arrived: tokio::sync::Notify,
    /// Encoded bucket bytes per replication or hand-off frame.
    bucket_bytes_per_frame: usize,
    /// The buckets replicated and handed off, and where merged ones go.
    store: Arc<BucketStore>,
    clock: NodeClock,
    metrics: ClusterMetrics,
    /// The machine's join phase, mirrored for the per-check look (set false only after the real
    /// table is published, so a check that sees the node joined also sees that table).
    joining: std::sync::atomic::AtomicBool,
    /// Rung when a joining node has its first real table.
    joined: tokio::sync::Notify,
    /// Set (with the reason) once another node proved to hold this node's id first: this node
    /// is out of the cluster and its process should stop.
    refused: watch::Sender<Option<String>>,
    /// When the log may next say that no seed answered, or that an id is claimed twice.
    next_join_complaint_ns: AtomicU64,
    next_conflict_complaint_ns: AtomicU64,
    /// Held shared while a batch reads the table and decides its groups, exclusively while the
    /// table is switched: once a switch returns, no decision made under the old table is still
    /// in flight, so the hand-off exported after it holds every decision made here.
    deciding: parking_lot::RwLock<()>,
    /// One table update at a time (gossip, the gossip loop, a leave), so a leave's hand-off is
    /// the one it waits for.
    updating: Mutex<()>,
    /// Members' states as last logged: suspicion and death are logged at WARN as they happen.
    member_log: Mutex<MemberLog>,
    /// The last slot-table payload encoded for clients, reused while it is current.
    encoded_table: Mutex<Option<Arc<EncodedTable>>>,
}

/// A slot-table message encoded once, with what it was encoded from.
#[derive(Debug)]
struct EncodedTable {
    table: Arc<SlotTable>,
    members: Vec<TableMember>,
    payload: rkyv::util::AlignedVec,
}

impl Cluster {
    pub(crate) fn new(
        config: ClusterConfig,
        listen: SocketAddr,
        endpoint: quinn::Endpoint,
        peer_config: crate::tls::PeerClientConfigs,
        store: Arc<BucketStore>,
        clock: NodeClock,
        metrics: ClusterMetrics,
    ) -> Self {
        let now_ns = clock.now_ns();
        let addr = config.advertise.unwrap_or(listen).to_string();
        let me = MemberInfo {
            id: config.node_id.clone().unwrap_or_else(|| addr.clone()),
            addr,
            region: config.region.clone(),
        };
        let seeds: Vec<String> = config.seeds.iter().map(ToString::to_string).collect();
        let mut own_addrs: Vec<SocketAddr> = me.addr.parse().ok().into_iter().collect();
        if !listen.ip().is_unspecified() {
            own_addrs.push(listen);
        }
        // A node listed among its own seeds (one list for every node) has nobody to wait for.
        let has_other_seeds = seeds.iter().any(|s| *s != me.addr);
        // The start time in ms is the incarnation: a restart always comes back newer.
        let membership = Membership::new(
            me.clone(),
            now_ns / 1_000_000,
            seeds,
            config.membership,
            now_ns,
            now_ns,
        );
        let table = Arc::new(SlotTable::compute(membership.epoch(), &membership.owners()));
        // Hand-off ids start from the start time, so a restart does not reuse its last life's.
        let ownership = Ownership::new(
            me.id.clone(),
            table.clone(),
            has_other_seeds,
            now_ns,
            OwnershipConfig::default(),
        );
        Cluster {
            me,
            membership: Mutex::new(membership),
            ownership: Mutex::new(ownership),
            table: watch::Sender::new(table),
            peers: Arc::new(Peers {
                endpoint,
                configs: Mutex::new(peer_config),
                ids: Mutex::new(HashMap::new()),
                connections: Mutex::new(HashMap::new()),
                failures: Mutex::new(HashMap::new()),
                handshake_failures: metrics.peer_handshake_failures.clone(),
                own_addrs,
                self_seeds: Mutex::new(std::collections::HashSet::new()),
                resolve_failures: metrics::counter!("floodgate_seed_resolve_failures_total"),
            }),
            handoff_arrived: tokio::sync::Notify::new(),
            bucket_bytes_per_frame: BUCKET_BYTES_PER_FRAME,
            store,
            clock,
            metrics,
            joining: std::sync::atomic::AtomicBool::new(has_other_seeds),
            joined: tokio::sync::Notify::new(),
            refused: watch::Sender::new(None),
            next_join_complaint_ns: AtomicU64::new(now_ns + JOIN_WAIT.as_nanos() as u64),
            next_conflict_complaint_ns: AtomicU64::new(0),
            deciding: parking_lot::RwLock::new(()),
            updating: Mutex::new(()),
            member_log: Mutex::new(MemberLog::default()),
            encoded_table: Mutex::new(None),
            config,
        }
    }

    /// Sizes replication frames for peers that accept frames of `max_frame_bytes` (half of it
    /// for buckets, at most `BUCKET_BYTES_PER_FRAME`).
    pub(crate) fn with_frame_limit(mut self, max_frame_bytes: usize) -> Self {
        self.bucket_bytes_per_frame = (max_frame_bytes / 2).min(BUCKET_BYTES_PER_FRAME);
        self
    }

    pub(crate) fn table(&self) -> Arc<SlotTable> {
        self.table.borrow().clone()
    }

    pub(crate) fn watch_table(&self) -> watch::Receiver<Arc<SlotTable>> {
        self.table.subscribe()
    }

    /// Held while deciding: the table read under it stays this node's table until it is
    /// dropped. Never held across an await.
    pub(crate) fn deciding(&self) -> parking_lot::RwLockReadGuard<'_, ()> {
        self.deciding.read()
    }

    /// The ownership machine, to place checks (under [`Cluster::deciding`], so its table is
    /// the one decisions are made under). Never held across an await.
    pub(crate) fn ownership(&self) -> parking_lot::MutexGuard<'_, Ownership> {
        self.ownership.lock()
    }

    /// True when `version` is that of a table this node had before its current one.
    pub(crate) fn had_version(&self, version: u64) -> bool {
        self.ownership.lock().had_version(version)
    }

    /// Waits until `done` holds for this node's table, or `limit` passes.
    pub(crate) async fn wait_for_table(&self, limit: Duration, done: impl Fn(&SlotTable) -> bool) {
        let mut tables = self.watch_table();
        let _ = tokio::time::timeout(limit, async {
            while !done(&tables.borrow_and_update()) {
                if tables.changed().await.is_err() {
                    return;
                }
            }
        })
        .await;
    }

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

    /// The address of the member with this id.
    pub(crate) fn addr_of(&self, id: &str) -> Option<String> {
        self.membership.lock().info(id).map(|m| m.addr.clone())
    }

    pub(crate) fn handle_gossip(&self, now_ns: u64, gossip: &Gossip) {
        let mut conflicts = Vec::new();
        drop(self.update_table(now_ns, |membership| {
            conflicts = membership.handle_gossip(now_ns, gossip)
        }));
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
    pub(crate) fn handle_conflict(&self, conflict: &IdConflict, now_ns: u64) {
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

    /// Appends the slot table and members as one `SlotTable` frame, as clients and `floodgate
    /// status` receive them. The payload is encoded once per table and member list and reused:
    /// every client fetches or is pushed each new table, and each would otherwise map all slots
    /// to members and serialize them again.
    pub(crate) fn encode_table(&self, out: &mut Vec<u8>, request_id: u64) {
        let table = self.table();
        let cached = self.encoded_table.lock().clone();
        let encoded = match cached {
            Some(c) if Arc::ptr_eq(&c.table, &table) && self.members_are(&c.members) => c,
            _ => {
                let message = self.table_message(&table);
                // Serializing plain vectors into memory cannot fail; an empty payload would be
                // refused by the receiver's validation, never misread.
                let payload = rkyv::to_bytes::<rkyv::rancor::Error>(&message).unwrap_or_default();
                let encoded = Arc::new(EncodedTable {
                    table,
                    members: message.members,
                    payload,
                });
                *self.encoded_table.lock() = Some(encoded.clone());
                encoded
            }
        };
        floodgate::wire::encode_frame(out, FrameKind::SlotTable, request_id, &encoded.payload);
    }

    /// True when the members and their states are still exactly `members`.
    fn members_are(&self, members: &[TableMember]) -> bool {
        let membership = self.membership.lock();
        let mut now = membership.members();
        members.iter().all(|m| {
            now.next().is_some_and(|(info, state)| {
                m.id == info.id
                    && m.addr == info.addr
                    && m.region == info.region
                    && m.state == member_state_to_wire(state)
            })
        }) && now.next().is_none()
    }

    /// The slot table and members as a message.
    fn table_message(&self, table: &SlotTable) -> SlotTableMessage {
        let members: Vec<TableMember> = self
            .membership
            .lock()
            .members()
            .map(|(info, state)| TableMember {
                id: info.id.clone(),
                addr: info.addr.clone(),
                region: info.region.clone(),
                state: member_state_to_wire(state),
            })
            .collect();
        // Each table node's member index, looked up once, not once per slot.
        let member_of: Vec<u16> = table
            .nodes()
            .iter()
            .map(|id| {
                members
                    .iter()
                    .position(|m| m.id == *id)
                    .map_or(u16::MAX, |i| i as u16)
            })
            .collect();
        let to_member = |node: Option<usize>| node.map_or(u16::MAX, |i| member_of[i]);
        let owners = (0..floodgate::cluster::SLOTS as u16)
            .map(|s| to_member(table.owner_index(s)))
            .collect();
        let successors = (0..floodgate::cluster::SLOTS as u16)
            .map(|s| to_member(table.successor_index(s)))
            .collect();
        SlotTableMessage {
            version: table.version(),
            epoch: table.epoch(),
            from: self.me.id.clone(),
            members,
            owners,
            successors,
        }
    }

    /// Applies `change` to the membership; when the owners changed, switches to the new slot
    /// table and hands the buckets of every slot this node no longer owns to its new owner.
    /// Returns the hand-off sends (already running).
    fn update_table(
        &self,
        now_ns: u64,
        change: impl FnOnce(&mut Membership),
    ) -> Vec<tokio::task::JoinHandle<bool>> {
        // Another update may be computing a big table: wait without holding up this worker's
        // other tasks.
        let _one_at_a_time = self
            .updating
            .try_lock()
            .unwrap_or_else(|| off_the_worker(true, || self.updating.lock()));
        let (epoch, owners, departed) = {
            let mut membership = self.membership.lock();
            change(&mut membership);
            drop(self.member_log.lock().observe(&membership));
            self.peers
                .learn_ids(membership.members().map(|(info, _)| info));
            let departed: Vec<String> = membership
                .members()
                .filter(|(_, state)| *state == MemberState::Left)
                .map(|(info, _)| info.id.clone())
                .collect();
            (membership.epoch(), membership.owners(), departed)
        };
        let old = self.table();
        if old.epoch() == epoch {
            return Vec::new();
        }
        let new = Arc::new(compute_table(epoch, &owners));
        let actions = {
            // Once the gate is ours, no decision under the old table is in flight: the
            // hand-offs exported below hold them all.
            let _no_decisions = self.deciding.write();
            let mut ownership = self.ownership.lock();
            off_the_worker(owners.len() >= BIG_TABLE, || {
                ownership.handle_table(now_ns, new.clone(), |id| departed.iter().any(|d| d == id))
            });
            self.table.send_replace(new);
            std::iter::from_fn(|| ownership.poll_action()).collect::<Vec<_>>()
        };
        self.metrics.table_epoch.set(epoch as f64);
        self.publish_members();
        tracing::info!(epoch, owners = ?owners, "slot table changed");
        self.carry_out(actions, now_ns)
    }

    /// Carries out the machine's actions: wakes checks waiting for the join, exports (once)
    /// and sends the hand-offs. Returns the sends (already running).
    fn carry_out(&self, actions: Vec<Action>, now_ns: u64) -> Vec<tokio::task::JoinHandle<bool>> {
        let mut handoffs = Vec::new();
        for action in actions {
            match action {
                Action::Joined => {
                    // Only now: a check that sees the node joined must also see its real table.
                    self.joining
                        .store(false, std::sync::atomic::Ordering::Relaxed);
                    self.joined.notify_waiters();
                }
                Action::HandOff(handoff) => handoffs.push(handoff),
            }
        }
        if handoffs.is_empty() {
            return Vec::new();
        }
        self.hand_off(&handoffs, now_ns)
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
            let latest = self
                .ownership
                .lock()
                .handoff_deadline(slots.clone(), now_ns);
            let Some(until) = latest else { return };
            let deadline = started + std::time::Duration::from_nanos(until - now_ns);
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                self.ownership.lock().handle_timeout(until);
                return;
            }
        }
    }

    /// True when one of `slots` still waits for a hand-off at `now_ns`.
    pub(crate) fn awaits_handoff(&self, slots: impl Iterator<Item = u16>, now_ns: u64) -> bool {
        self.ownership.lock().awaits_handoff(slots, now_ns)
    }

    /// A part of a hand-off from `from` arrived (its buckets already merged).
    pub(crate) fn handoff_received(&self, from: &str, part: &HandoffPart, now_ns: u64) {
        let part = ReceivedPart {
            id: part.id,
            part: part.part,
            parts: part.parts,
            slots: &part.slots,
        };
        if self.ownership.lock().handle_handoff(now_ns, from, part) {
            self.handoff_arrived.notify_waiters();
        }
    }

    fn publish_members(&self) {
        let mut counts = [0usize; 4];
        for (_, state) in self.membership.lock().members() {
            counts[usize::from(member_state_to_wire(state))] += 1;
        }
        for (gauge, count) in self.metrics.members.iter().zip(counts) {
            gauge.set(count as f64);
        }
    }

    /// Sends the hand-offs the machine queued: the buckets of their slots, exported once (after
    /// the switch), each to the node its hand-off goes to; an announcement carries none.
    fn hand_off(&self, handoffs: &[HandOff], now_ns: u64) -> Vec<tokio::task::JoinHandle<bool>> {
        // Which hand-off carries each slot's buckets.
        let mut carrier = vec![None; floodgate::cluster::SLOTS];
        for (i, handoff) in handoffs.iter().enumerate() {
            if handoff.with_buckets {
                for &slot in &handoff.slots {
                    if let Some(c) = carrier.get_mut(usize::from(slot)) {
                        *c = Some(i);
                    }
                }
            }
        }
        let mut buckets = Vec::new();
        if carrier.iter().any(Option::is_some) {
            self.store.export(
                now_ns,
                &|key| carrier[usize::from(key.slot())].is_some(),
                &mut buckets,
            );
        }
        let mut moved: Vec<Vec<BucketState>> = vec![Vec::new(); handoffs.len()];
        for bucket in buckets {
            if let Some(i) = carrier[usize::from(bucket.key.slot())] {
                moved[i].push(bucket);
            }
        }
        // Every node that gains slots from us hears from us, even with no buckets: it holds
        // checks on those slots until then.
        let mut sends = Vec::new();
        for (handoff, buckets) in handoffs.iter().zip(moved) {
            self.metrics.handed_off.increment(buckets.len() as u64);
            let carried = Some((handoff.id, handoff.slots.clone()));
            sends.extend(self.send_buckets(&handoff.to, carried, &buckets));
        }
        sends
    }

    /// Sends `buckets` to a node, split into frames; `handoff` is the hand-off's id and the
    /// slots it carries (`None`: replicas).
    fn send_buckets(
        &self,
        owner_id: &str,
        handoff: Option<(u64, Vec<u16>)>,
        buckets: &[BucketState],
    ) -> Vec<tokio::task::JoinHandle<bool>> {
        let Some(addr) = self.addr_of(owner_id) else {
            return Vec::new();
        };
        let mut sends = Vec::new();
        // At least one message, so an empty hand-off is still announced.
        let chunks = chunk_by_size(buckets, self.bucket_bytes_per_frame);
        let parts = chunks.len() as u32;
        for (part, chunk) in chunks.into_iter().enumerate() {
            let message = ReplicateMessage {
                from: self.me.id.clone(),
                handoff: handoff.as_ref().map(|(id, slots)| HandoffPart {
                    id: *id,
                    part: part as u32,
                    parts,
                    slots: slots.clone(),
                }),
                buckets: chunk.iter().map(WireBucket::from).collect(),
            };
            let mut frame = Vec::new();
            encode_message(&mut frame, FrameKind::Replicate, 0, &message);
            sends.push(self.peers.send(addr.clone(), frame));
        }
        sends
    }

    /// One round of gossip, then (every sync interval) replication of changed buckets.
    fn gossip_round(&self, now_ns: u64) {
        if self.joining.load(Ordering::Relaxed)
            && self
                .peers
                .seeds_are_all_me(&self.config.seeds, &self.me.addr)
        {
            // Every seed name turned out to be this node: like a node without seeds, it is the
            // first of its cluster and has nobody to wait for. Under the update lock, so no
            // table update sees the flag change halfway (busy: the next round retries).
            if let Some(_one_at_a_time) = self.updating.try_lock() {
                let actions: Vec<Action> = {
                    let mut ownership = self.ownership.lock();
                    ownership.handle_no_one_to_join();
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
            // Hand-off waits that ran out end in the machine too (checks already look lazily).
            let mut ownership = self.ownership.lock();
            if ownership.poll_timeout().is_some_and(|at| at <= now_ns) {
                ownership.handle_timeout(now_ns);
            }
        }
        let outgoing = self.membership.lock().poll(now_ns);
        for message in outgoing {
            let mut frame = Vec::new();
            encode_message(&mut frame, FrameKind::Gossip, 0, &message.gossip);
            self.peers.send(message.to, frame);
        }
        // Members declared suspect or dead by `poll` change the owners.
        drop(self.update_table(now_ns, |_| {}));
    }

    /// Sends the buckets changed since the last round to their slots' successors; returns the
    /// sends (each ends true once delivered).
    fn replicate(&self, now_ns: u64) -> Vec<tokio::task::JoinHandle<bool>> {
        let table = self.table();
        // Alone, there is nobody to replicate to; changed marks stay set, so a node that joins
        // later still receives them (through the hand-off first).
        if table.nodes().len() < 2 {
            return Vec::new();
        }
        let mut changed = Vec::new();
        self.store.take_changed(now_ns, &mut changed);
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
        let mut sends = Vec::new();
        for (target, buckets) in by_target {
            self.metrics.replicated.increment(buckets.len() as u64);
            sends.extend(self.send_buckets(target, None, &buckets));
        }
        sends
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
            let mut frame = Vec::new();
            encode_message(&mut frame, FrameKind::Gossip, 0, &message.gossip);
            drop(self.peers.send(message.to, frame));
        }
        // Each send is bounded by PEER_TIMEOUT; the endpoint must not close before they land.
        for send in sends {
            let _ = send.await;
        }
    }
}

/// Splits `buckets` into runs of at most `budget` encoded bytes (a bucket larger than the
/// budget, a long log, goes alone); always at least one run, empty when there are no buckets.
fn chunk_by_size(buckets: &[BucketState], budget: usize) -> Vec<&[BucketState]> {
    // A flat WireBucket archives to under 128 bytes plus 8 per log entry.
    let size = |b: &BucketState| {
        128 + match &b.value {
            floodgate::BucketValue::Log { times_ns, .. } => 8 * times_ns.len(),
            _ => 0,
        }
    };
    let mut chunks = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, bucket) in buckets.iter().enumerate() {
        let next = size(bucket);
        if i > start && bytes + next > budget {
            chunks.push(&buckets[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += next;
    }
    chunks.push(&buckets[start..]);
    chunks
}

/// Runs gossip rounds and replication until shutdown.
///
/// The replication lag gauge is the time since the start of the last round whose every message
/// the successors acknowledged: how old their copies can be now (it grows while one is down).
pub(crate) async fn run(cluster: Arc<Cluster>, mut shutdown: watch::Receiver<bool>) {
    let tick = Duration::from_nanos(cluster.config.membership.gossip_interval_ns / 2)
        .max(Duration::from_millis(5));
    let mut ticker = tokio::time::interval(tick);
    let sync_ns = u64::try_from(cluster.config.sync_interval.as_nanos()).unwrap_or(u64::MAX);
    let mut next_sync_ns = 0;
    let replicated_through = Arc::new(AtomicU64::new(cluster.clock.now_ns()));
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => return,
        }
        let now_ns = cluster.clock.now_ns();
        cluster.gossip_round(now_ns);
        if now_ns >= next_sync_ns {
            let sends = cluster.replicate(now_ns);
            let through = replicated_through.clone();
            // One waiter per round, each bounded by the sends' own timeout.
            tokio::spawn(async move {
                for send in sends {
                    if !matches!(send.await, Ok(true)) {
                        return;
                    }
                }
                through.fetch_max(now_ns, Ordering::Relaxed);
            });
            next_sync_ns = now_ns + sync_ns;
        }
        let lag_ns = now_ns.saturating_sub(replicated_through.load(Ordering::Relaxed));
        cluster.metrics.replication_lag.set(lag_ns as f64 / 1e9);
    }
}

#[cfg(test)]
mod tests {
    use floodgate::algorithm::WindowState;
    use floodgate::{Algorithm, BucketKey, BucketValue, Limit};

    use super::*;

    fn cluster_alone() -> Cluster {
        let crypto = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        let quic = Arc::new(quinn::crypto::rustls::QuicClientConfig::try_from(crypto).unwrap());
        let endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        let config = ClusterConfig {
            node_id: Some("node-a".into()),
            ..ClusterConfig::default()
        };
        Cluster::new(
            config,
            "127.0.0.1:7000".parse().unwrap(),
            endpoint,
            crate::tls::PeerClientConfigs {
                members: quinn::ClientConfig::new(quic.clone()),
                seeds: quinn::ClientConfig::new(quic),
            },
            Arc::new(BucketStore::new(floodgate::StoreConfig::default()).unwrap()),
            crate::clock::NodeClock::new(),
            crate::metrics::NodeMetrics::register().cluster(),
        )
    }

    fn decoded(frame: &[u8]) -> SlotTableMessage {
        let mut reader = floodgate::wire::FrameReader::new(1 << 20);
        reader.extend(frame);
        let frame = reader.next_frame().unwrap().unwrap();
        assert_eq!(frame.kind, FrameKind::SlotTable);
        floodgate::wire::decode_slot_table(&frame.payload).unwrap()
    }

    /// The table message is encoded once and reused while the table and members stay, and
    /// encoded again (with what changed) when either changes.
    #[tokio::test]
    async fn the_table_message_is_encoded_once_per_table_and_member_list() {
        let cluster = cluster_alone();
        let (mut first, mut second) = (Vec::new(), Vec::new());
        cluster.encode_table(&mut first, 1);
        let cached = cluster.encoded_table.lock().clone().unwrap();
        cluster.encode_table(&mut second, 1);
        assert!(Arc::ptr_eq(
            &cached,
            cluster.encoded_table.lock().as_ref().unwrap()
        ));
        assert_eq!(first, second);
        assert_eq!(decoded(&first), cluster.table_message(&cluster.table()));
        assert_eq!(decoded(&first).owners, vec![0; floodgate::cluster::SLOTS]);

        // A member's state changes (here: this node leaves), not the table.
        drop(cluster.membership.lock().leave(2_000_000_000));
        let mut after_leave = Vec::new();
        cluster.encode_table(&mut after_leave, 1);
        assert_eq!(decoded(&after_leave).members[0].state, 3);

        // A new table.
        let table = Arc::new(SlotTable::compute(9, &["node-a".into(), "node-b".into()]));
        cluster.table.send_replace(table.clone());
        let mut new_table = Vec::new();
        cluster.encode_table(&mut new_table, 1);
        let message = decoded(&new_table);
        assert_eq!(message.epoch, 9);
        assert_eq!(message, cluster.table_message(&table));
    }

    fn owners(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("node-{i}")).collect()
    }

    /// A big table is computed off the worker on a multi-thread runtime, inline on a
    /// current-thread one (where `block_in_place` would panic), the same either way.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_big_table_computed_off_the_worker_is_the_same() {
        let owners = owners(BIG_TABLE);
        assert_eq!(compute_table(3, &owners), SlotTable::compute(3, &owners));
    }

    #[tokio::test]
    async fn a_big_table_on_a_current_thread_runtime_is_computed_without_panicking() {
        let owners = owners(BIG_TABLE);
        assert_eq!(compute_table(3, &owners), SlotTable::compute(3, &owners));
    }

    /// Every chunk of buckets, encoded as a replicate message, fits in a frame twice the budget
    /// (what `with_frame_limit` assumes), whatever the mix of algorithms and log lengths.
    #[test]
    fn replication_chunks_fit_the_frame_limit() {
        let hour = 3_600 * floodgate::NANOS_PER_SEC;
        let window = Limit::new(Algorithm::SlidingWindow, 100, hour, 100).unwrap();
        let log = Limit::new(Algorithm::SlidingLog, 1_000, hour, 1_000).unwrap();
        let buckets: Vec<BucketState> = (0..6_000u32)
            .map(|i| {
                let key = BucketKey::new(b"", &i.to_le_bytes());
                let value = match i % 3 {
                    0 => BucketValue::Gcra {
                        tat_ns: u64::from(i),
                        margin_ms: 1,
                    },
                    1 => BucketValue::Window {
                        limit: window,
                        state: WindowState {
                            window: 1,
                            count: 2,
                            previous: 3,
                        },
                    },
                    _ => BucketValue::Log {
                        limit: log,
                        times_ns: (0..u64::from(i % 1_000)).collect(),
                    },
                };
                BucketState { key, value }
            })
            .collect();
        let budget = 64 * 1024;
        let chunks = chunk_by_size(&buckets, budget);
        assert!(chunks.len() > 1);
        assert_eq!(chunks.iter().map(|c| c.len()).sum::<usize>(), buckets.len());
        for chunk in chunks {
            let message = ReplicateMessage {
                from: "node-with-a-long-id:65535".into(),
                handoff: Some(HandoffPart {
                    id: u64::MAX,
                    part: 0,
                    parts: 1,
                    slots: (0..floodgate::cluster::SLOTS as u16).collect(),
                }),
                buckets: chunk.iter().map(WireBucket::from).collect(),
            };
            let mut frame = Vec::new();
            encode_message(&mut frame, FrameKind::Replicate, 0, &message);
            assert!(frame.len() <= 2 * budget, "{} bytes", frame.len());
        }
        assert_eq!(chunk_by_size(&[], budget), vec![&[] as &[BucketState]]);
    }
}
