//! Routing by the cluster's slot table: which node a call goes to, and keeping that current.
//!
//! A client starts from the nodes it was given (the seeds) and asks one of them for the slot
//! table (`TableRequest` → `SlotTable`). From then on a call goes to the owner of the slot of its
//! first key, over a link to every member that owns slots (alive or suspect), whether or not it
//! was a seed. Each link subscribes to its node's pushes (a `TableRequest` on a unidirectional
//! stream): a node sends its new table to its clients as soon as it changes, and the client
//! routes by it at once ([`follow_pushes`]). The table is also fetched again
//! - when an answer carries another table version than ours (the node's view changed),
//! - when a link goes down (its node may have left or crashed),
//! - and every [`REFRESH_PERIOD`] in any case, so a crashed owner's slots move even when no
//!   answer says so,
//!
//! by one background task ([`Refresher`]): at most one fetch in flight, at most one every
//! [`MIN_FETCH_INTERVAL`]. A call whose owner cannot be reached (its link is down or its breaker
//! open, or the call failed on it) goes to the slot's successor, marked as a takeover: the
//! successor holds the owner's replicas (at most one sync interval old) and decides from them.
//! Only when neither can be reached does the failure mode decide. Before any table is known (or from
//! nodes that serve none) calls spread over the seeds by a stable hash ([`Router`]); the nodes
//! forward what they do not own.
//!
//! Fetches use their own connection (one at a time, reused), so they never wait behind checks.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use floodgate::cluster::{MemberState, SLOTS, slot_of};
use floodgate::wire::{
    FrameKind, FrameReader, SlotTableMessage, decode_error_frame, decode_slot_table, encode_frame,
    member_state_from_wire,
};
use parking_lot::Mutex;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::config::ClientConfig;
use crate::link::{self, LinkSettings, LinkState, NodeLink};
use crate::router::Router;

/// How often the table is fetched when nothing suggests it changed.
pub(crate) const REFRESH_PERIOD: Duration = Duration::from_secs(1);
/// Fetches never come closer together than this, whatever triggers them.
pub(crate) const MIN_FETCH_INTERVAL: Duration = Duration::from_millis(100);
/// Longest one fetch (connection included) may take before the next candidate node is tried.
const FETCH_TIMEOUT: Duration = Duration::from_secs(1);
/// Least time a departed member's link stays open after the table stops naming it.
const RETIRE_GRACE: Duration = Duration::from_millis(500);
/// Nodes tried per refresh before waiting for the next one.
const ATTEMPTS_PER_REFRESH: usize = 3;
/// Largest slot-table answer accepted (4,096 owners and up to 1,024 members fit easily).
const MAX_TABLE_BYTES: usize = 1 << 20;
/// No link for a slot's owner.
const NONE: u16 = u16::MAX;

/// One member of the cluster as the table lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterMember {
    pub id: String,
    /// The address the member serves clients at ("IP:port").
    pub addr: String,
    pub region: String,
    pub state: MemberState,
}

/// A node's slot table: who is in the cluster and who owns each of the
/// [`floodgate::cluster::SLOTS`] slots. Equal `version`s mean equal owners.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterTable {
    /// A hash of the owners' ids: the same on every node that sees the same owners.
    pub version: u64,
    /// The sending node's own count of ownership changes.
    pub epoch: u64,
    /// Id of the node that sent the table.
    pub from: String,
    /// Every member the node knows, sorted by id (departed and dead ones for a while too).
    pub members: Vec<ClusterMember>,
    /// `owners[slot]` indexes `members`; `NONE`: nobody.
    owners: Vec<u16>,
    /// `successors[slot]`: who holds the slot's replicas and takes it over if its owner fails.
    successors: Vec<u16>,
}

impl ClusterTable {
    /// From a validated message (`decode_slot_table` checked the owners' range and count).
    pub(crate) fn from_message(message: SlotTableMessage) -> Self {
        ClusterTable {
            version: message.version,
            epoch: message.epoch,
            from: message.from,
            members: message
                .members
                .into_iter()
                .map(|m| ClusterMember {
                    id: m.id,
                    addr: m.addr,
                    region: m.region,
                    state: member_state_from_wire(m.state),
                })
                .collect(),
            owners: message.owners,
            successors: message.successors,
        }
    }

    /// The member that owns `slot`.
    pub fn owner(&self, slot: u16) -> Option<&ClusterMember> {
        let index = *self.owners.get(usize::from(slot))?;
        self.members.get(usize::from(index))
    }

    /// The member that takes `slot` over if its owner fails (it holds the replicas).
    pub fn successor(&self, slot: u16) -> Option<&ClusterMember> {
        let index = *self.successors.get(usize::from(slot))?;
        self.members.get(usize::from(index))
    }

    /// The member that decides a call whose first key is `key`.
    pub fn owner_of_key(&self, key: &[u8]) -> Option<&ClusterMember> {
        self.owner(slot_of(key))
    }

    /// How many slots the member with this id owns.
    pub fn slots_owned(&self, id: &str) -> usize {
        match self.members.iter().position(|m| m.id == id) {
            Some(i) => self.owners.iter().filter(|&&o| usize::from(o) == i).count(),
            None => 0,
        }
    }
}

/// Where calls go now: a snapshot, replaced whole when the table or the links change.
#[derive(Debug)]
pub(crate) struct Routes {
    /// The seeds first (in the order given to `connect`), then the members discovered.
    pub(crate) links: Vec<Arc<NodeLink>>,
    table: Option<Arc<ClusterTable>>,
    /// Per slot, the index in `links` of its owner's link (`NONE`: no table, or no link).
    slot_link: Box<[u16]>,
    /// Per slot, the index in `links` of its successor's link (`NONE`: none).
    successor_link: Box<[u16]>,
    /// Before a table is known: a stable hash over the seeds.
    fallback: Router,
}

impl Routes {
    fn seeds_only(seeds: Vec<Arc<NodeLink>>) -> Self {
        Routes {
            fallback: Router::new(seeds.len()),
            links: seeds,
            table: None,
            slot_link: vec![NONE; SLOTS].into_boxed_slice(),
            successor_link: vec![NONE; SLOTS].into_boxed_slice(),
        }
    }

    /// Index in `links` of the node that decides a call whose first key is `key`.
    pub(crate) fn route(&self, key: &[u8]) -> usize {
        if self.table.is_some() {
            let index = self.slot_link[usize::from(slot_of(key))];
            if index != NONE {
                return usize::from(index);
            }
        }
        self.fallback.route(key)
    }

    /// Index in `links` of the node that takes over `key`'s slot when its owner is
    /// unreachable, if the table names one with a link.
    pub(crate) fn successor(&self, key: &[u8]) -> Option<usize> {
        let index = self.successor_link[usize::from(slot_of(key))];
        (index != NONE).then_some(usize::from(index))
    }
}

/// What answers tell the refresher: a node has another table version than ours, or a link went
/// down. Cheap to consult on every answer (one atomic load while the versions agree).
#[derive(Debug, Default)]
pub(crate) struct TableHint {
    /// Version of the table calls are routed by (0: none yet).
    current: AtomicU64,
    /// The node that last reported another version: asked first.
    from: Mutex<Option<SocketAddr>>,
    /// The latest table a node pushed, not yet applied.
    pushed: Mutex<Option<ClusterTable>>,
    wake: Notify,
}

impl TableHint {
    /// A node answered with its table `version` (0: it is in no cluster).
    pub(crate) fn saw(&self, version: u64, node: SocketAddr) {
        if version == 0 || version == self.current.load(Ordering::Relaxed) {
            return;
        }
        *self.from.lock() = Some(node);
        self.wake.notify_one();
    }

    /// A node pushed its table: routed by at once when it is another version.
    pub(crate) fn pushed(&self, table: ClusterTable) {
        if table.version == self.current.load(Ordering::Relaxed) {
            return;
        }
        *self.pushed.lock() = Some(table);
        self.wake.notify_one();
    }

    fn poke(&self) {
        self.wake.notify_one();
    }
}

/// Subscribes to `node`'s table pushes over `conn` (a `TableRequest` on a unidirectional
/// stream) and hands every table it pushes to the refresher, until the connection ends.
pub(crate) async fn follow_pushes(conn: quinn::Connection, hint: Arc<TableHint>, node: SocketAddr) {
    let subscribed = async {
        let mut frame = Vec::new();
        encode_frame(&mut frame, FrameKind::TableRequest, 0, &[]);
        let mut stream = conn.open_uni().await.map_err(|e| e.to_string())?;
        stream.write_all(&frame).await.map_err(|e| e.to_string())?;
        stream.finish().map_err(|e| e.to_string())
    };
    if let Err(why) = tokio::time::timeout(FETCH_TIMEOUT, subscribed)
        .await
        .unwrap_or_else(|_| Err("timed out".to_owned()))
    {
        tracing::debug!(%node, "no table pushes: {why}");
        return;
    }
    while let Ok(mut recv) = conn.accept_uni().await {
        let Ok(Ok(bytes)) =
            tokio::time::timeout(FETCH_TIMEOUT, recv.read_to_end(MAX_TABLE_BYTES)).await
        else {
            continue;
        };
        let mut reader = FrameReader::new(MAX_TABLE_BYTES);
        reader.extend(&bytes);
        match reader.next_frame() {
            Ok(Some(frame)) if frame.kind == FrameKind::SlotTable => {
                match decode_slot_table(&frame.payload) {
                    Ok(message) => hint.pushed(ClusterTable::from_message(message)),
                    Err((_, why)) => tracing::debug!(%node, "bad pushed table: {why}"),
                }
            }
            other => tracing::debug!(%node, "unexpected push: {other:?}"),
        }
    }
}

/// The routing state the client reads on every call and the refresher replaces. A watch, so
/// callers can also await the next table ([`TableChanges`]).
#[derive(Debug)]
pub(crate) struct Routing {
    routes: watch::Sender<Arc<Routes>>,
    pub(crate) hint: Arc<TableHint>,
}

impl Routing {
    /// Routing over the seeds until a table arrives.
    pub(crate) fn new(seeds: Vec<Arc<NodeLink>>) -> Self {
        let hint = Arc::new(TableHint::default());
        for link in &seeds {
            let _ = link.table_hint.set(hint.clone());
        }
        Routing {
            routes: watch::Sender::new(Arc::new(Routes::seeds_only(seeds))),
            hint,
        }
    }

    /// The current routes (a cheap snapshot: one reference count).
    pub(crate) fn routes(&self) -> Arc<Routes> {
        self.routes.borrow().clone()
    }

    /// The table calls are routed by, once one was fetched.
    pub(crate) fn table(&self) -> Option<Arc<ClusterTable>> {
        self.routes.borrow().table.clone()
    }

    pub(crate) fn changes(&self) -> TableChanges {
        TableChanges(self.routes.subscribe())
    }
}

/// Wakes each time the client adopts new routes (a new slot table, or links to new members):
/// for tools and tests that wait for discovery instead of polling.
#[derive(Debug)]
pub struct TableChanges(watch::Receiver<Arc<Routes>>);

impl TableChanges {
    /// Waits for the next change; false once the client is gone.
    pub async fn changed(&mut self) -> bool {
        self.0.changed().await.is_ok()
    }
}

/// What creating a link needs.
#[derive(Debug)]
pub(crate) struct LinkFactory {
    pub(crate) quic: quinn::ClientConfig,
    pub(crate) config: ClientConfig,
    pub(crate) settings: Arc<LinkSettings>,
}

/// A link to a member that was not a seed, and what stops it.
#[derive(Debug)]
struct Discovered {
    link: Arc<NodeLink>,
    /// Dropping or setting it stops the link's supervisor and reaper.
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

/// The background task that keeps the table and the links current.
#[derive(Debug)]
pub(crate) struct Refresher {
    routing: Arc<Routing>,
    factory: LinkFactory,
    seeds: Vec<Arc<NodeLink>>,
    discovered: BTreeMap<SocketAddr, Discovered>,
    /// Links to members that left the table, closed at their deadline: calls routed just before
    /// the table changed, and frames in flight, are still answered over them.
    retiring: Vec<(Instant, Discovered)>,
    /// How long a departed member's link stays open.
    grace: Duration,
    /// The connection fetches go over, and its node.
    control: Option<(SocketAddr, quinn::Connection)>,
    endpoint: Option<quinn::Endpoint>,
    last_table: Option<Arc<ClusterTable>>,
}

impl Refresher {
    pub(crate) fn new(
        routing: Arc<Routing>,
        factory: LinkFactory,
        seeds: Vec<Arc<NodeLink>>,
    ) -> Self {
        for link in &seeds {
            watch_link(link, routing.hint.clone());
        }
        let grace = (factory.config.timeout * 2).max(RETIRE_GRACE);
        Refresher {
            routing,
            factory,
            seeds,
            discovered: BTreeMap::new(),
            retiring: Vec::new(),
            grace,
            control: None,
            endpoint: None,
            last_table: None,
        }
    }

    /// Fetches the table from one node (the one that reported a new version first, then the
    /// node of the last fetch, then connected nodes) and applies it. Returns whether a table
    /// came back.
    pub(crate) async fn refresh(&mut self) -> bool {
        for addr in self.candidates() {
            match self.fetch_from(addr).await {
                Ok(table) => {
                    self.apply(table);
                    return true;
                }
                Err(why) => {
                    tracing::debug!(node = %addr, "slot table not fetched: {why}");
                    if self.control.as_ref().is_some_and(|(a, _)| *a == addr) {
                        self.control = None;
                    }
                }
            }
        }
        false
    }

    /// Refreshes until shutdown: every `REFRESH_PERIOD`, and sooner when a hint arrives.
    pub(crate) async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let hint = self.routing.hint.clone();
        let mut last = Instant::now();
        loop {
            let retire_at = self.retiring.iter().map(|(at, _)| *at).min();
            tokio::select! {
                biased;
                _ = shutdown.wait_for(|&stop| stop) => break,
                () = sleep_until_some(retire_at) => {
                    self.retire_due();
                    continue;
                }
                () = hint.wake.notified() => {}
                () = tokio::time::sleep_until(last + REFRESH_PERIOD) => {}
            }
            // A pushed table needs no fetch.
            let pushed = hint.pushed.lock().take();
            if let Some(table) = pushed {
                self.apply(table);
                last = Instant::now();
                continue;
            }
            let earliest = last + MIN_FETCH_INTERVAL;
            if Instant::now() < earliest {
                tokio::select! {
                    biased;
                    _ = shutdown.wait_for(|&stop| stop) => break,
                    () = tokio::time::sleep_until(earliest) => {}
                }
            }
            last = Instant::now();
            tokio::select! {
                biased;
                _ = shutdown.wait_for(|&stop| stop) => break,
                _ = self.refresh() => {}
            }
        }
        self.stop().await;
    }

    /// Closes the links whose grace period is over.
    fn retire_due(&mut self) {
        let now = Instant::now();
        self.retiring.retain(|(at, entry)| {
            let due = *at <= now;
            if due {
                tracing::debug!(node = %entry.link.addr, "closing the link to a departed member");
                entry.stop.send_replace(true);
            }
            !due
        });
    }

    /// Stops every discovered link and waits for their tasks (bounded by each supervisor's own
    /// short close wait).
    async fn stop(&mut self) {
        if let Some((_, conn)) = self.control.take() {
            conn.close(0u32.into(), b"client closed");
        }
        let discovered: Vec<Discovered> = std::mem::take(&mut self.discovered)
            .into_values()
            .chain(self.retiring.drain(..).map(|(_, entry)| entry))
            .collect();
        for entry in &discovered {
            entry.stop.send_replace(true);
        }
        for entry in discovered {
            for task in entry.tasks {
                let _ = task.await;
            }
        }
        if let Some(endpoint) = self.endpoint.take() {
            endpoint.close(0u32.into(), b"client closed");
        }
    }

    /// Nodes to ask, best first, at most `ATTEMPTS_PER_REFRESH`.
    fn candidates(&self) -> Vec<SocketAddr> {
        let mut out = Vec::new();
        let mut push = |addr: SocketAddr| {
            if !out.contains(&addr) {
                out.push(addr);
            }
        };
        if let Some(addr) = self.routing.hint.from.lock().take() {
            push(addr);
        }
        let routes = self.routing.routes();
        let connected = |addr: SocketAddr| {
            routes
                .links
                .iter()
                .find(|l| l.addr == addr)
                .is_none_or(|l| l.status().state == LinkState::Connected)
        };
        if let Some((addr, _)) = &self.control
            && connected(*addr)
        {
            push(*addr);
        }
        for link in &routes.links {
            if link.status().state == LinkState::Connected {
                push(link.addr);
            }
        }
        for link in &routes.links {
            push(link.addr);
        }
        out.truncate(ATTEMPTS_PER_REFRESH);
        out
    }

    /// The name the node at `addr` is verified by: its link's (a member's node id, a seed's
    /// configured name or address).
    fn server_name_of(&self, addr: SocketAddr) -> String {
        self.seeds
            .iter()
            .chain(self.discovered.values().map(|d| &d.link))
            .find(|l| l.addr == addr)
            .map_or_else(
                || crate::tls::seed_server_name(self.factory.config.server_name.as_deref(), addr),
                |l| l.server_name.clone(),
            )
    }

    async fn fetch_from(&mut self, addr: SocketAddr) -> Result<ClusterTable, String> {
        let conn = match &self.control {
            Some((a, conn)) if *a == addr && conn.close_reason().is_none() => conn.clone(),
            _ => {
                if let Some((_, old)) = self.control.take() {
                    old.close(0u32.into(), b"");
                }
                let endpoint = match &self.endpoint {
                    Some(endpoint) => endpoint.clone(),
                    None => {
                        let endpoint = link::endpoint_for(addr, self.factory.quic.clone())
                            .map_err(|e| e.to_string())?;
                        self.endpoint = Some(endpoint.clone());
                        endpoint
                    }
                };
                let server_name = self.server_name_of(addr);
                let conn = link::connect(&endpoint, addr, &server_name, FETCH_TIMEOUT).await?;
                self.control = Some((addr, conn.clone()));
                conn
            }
        };
        let message = tokio::time::timeout(FETCH_TIMEOUT, request_table(&conn))
            .await
            .map_err(|_| format!("no slot table within {FETCH_TIMEOUT:?}"))??;
        Ok(ClusterTable::from_message(message))
    }

    /// Routes by `table`: links to every member that owns slots, closes links to members that
    /// left, and maps each slot to its owner's link.
    fn apply(&mut self, table: ClusterTable) {
        self.routing
            .hint
            .current
            .store(table.version, Ordering::Relaxed);
        // Another node's copy of the same table differs only in `from` and `epoch`.
        if let Some(last) = &self.last_table
            && (last.version, &last.members, &last.owners, &last.successors)
                == (
                    table.version,
                    &table.members,
                    &table.owners,
                    &table.successors,
                )
        {
            return;
        }
        let owners: HashMap<SocketAddr, &str> = table
            .members
            .iter()
            .filter(|m| m.state.owns_slots())
            .filter_map(|m| Some((parse_addr(&m.addr)?, m.id.as_str())))
            .collect();
        let seeds: HashSet<SocketAddr> = self.seeds.iter().map(|l| l.addr).collect();
        for (&addr, &id) in owners.iter().filter(|(a, _)| !seeds.contains(a)) {
            if let Some(i) = self.retiring.iter().position(|(_, e)| e.link.addr == addr) {
                // Back before its link was closed.
                let (_, entry) = self.retiring.swap_remove(i);
                self.discovered.insert(addr, entry);
            } else if !self.discovered.contains_key(&addr) {
                match self.start_link(addr, id) {
                    Ok(entry) => {
                        tracing::info!(node = %addr, "discovered floodgate node");
                        self.discovered.insert(addr, entry);
                    }
                    Err(e) => tracing::warn!(node = %addr, "cannot link to a member: {e}"),
                }
            }
        }
        let departed: Vec<SocketAddr> = self
            .discovered
            .keys()
            .filter(|addr| !owners.contains_key(addr))
            .copied()
            .collect();
        let retire_at = Instant::now() + self.grace;
        for addr in departed {
            if let Some(entry) = self.discovered.remove(&addr) {
                log_departure(&table, addr);
                self.retiring.push((retire_at, entry));
            }
        }
        let links: Vec<Arc<NodeLink>> = self
            .seeds
            .iter()
            .cloned()
            .chain(self.discovered.values().map(|d| d.link.clone()))
            .collect();
        // Member index → link index, then slot → link index.
        let member_link: Vec<u16> = table
            .members
            .iter()
            .map(|m| {
                parse_addr(&m.addr)
                    .filter(|_| m.state.owns_slots())
                    .and_then(|addr| links.iter().position(|l| l.addr == addr))
                    .and_then(|i| u16::try_from(i).ok())
                    .unwrap_or(NONE)
            })
            .collect();
        let link_of = |members: &[u16]| {
            members
                .iter()
                .map(|&m| member_link.get(usize::from(m)).copied().unwrap_or(NONE))
                .collect()
        };
        let slot_link = link_of(&table.owners);
        let successor_link = link_of(&table.successors);
        let table = Arc::new(table);
        tracing::debug!(
            version = table.version,
            epoch = table.epoch,
            from = %table.from,
            "routing by a new slot table"
        );
        let routes = Routes {
            fallback: Router::new(self.seeds.len()),
            links,
            table: Some(table.clone()),
            slot_link,
            successor_link,
        };
        self.routing.routes.send_replace(Arc::new(routes));
        self.last_table = Some(table);
    }

    /// Links to the member `id` at `addr`, verifying it by its node id.
    fn start_link(&self, addr: SocketAddr, id: &str) -> Result<Discovered, String> {
        let factory = &self.factory;
        let endpoint = link::endpoint_for(addr, factory.quic.clone()).map_err(|e| e.to_string())?;
        let name = crate::tls::member_server_name(id, addr);
        let link = Arc::new(NodeLink::new(addr, &factory.config).named(name));
        let _ = link.table_hint.set(self.routing.hint.clone());
        watch_link(&link, self.routing.hint.clone());
        let (stop, stopped) = watch::channel(false);
        let tasks = vec![
            tokio::spawn(link::supervise(
                link.clone(),
                endpoint,
                factory.settings.clone(),
                stopped.clone(),
            )),
            tokio::spawn(link::reap(link.clone(), stopped)),
        ];
        Ok(Discovered { link, stop, tasks })
    }
}

/// Resolves at `at`, or never.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Wakes the refresher when a connected link goes down: its node may have left or crashed.
fn watch_link(link: &NodeLink, hint: Arc<TableHint>) {
    let mut state = link.subscribe();
    tokio::spawn(async move {
        let mut was = *state.borrow_and_update();
        // Ends when the link is dropped.
        while state.changed().await.is_ok() {
            let now = *state.borrow_and_update();
            if now == LinkState::Disconnected && was != LinkState::Disconnected {
                hint.poke();
            }
            was = now;
        }
    });
}

/// Says why a member no longer owns slots, as the cluster reported it: only a member that
/// announced its leave "left"; a killed or unreachable one was declared dead by its peers.
fn log_departure(table: &ClusterTable, addr: SocketAddr) {
    let state = table
        .members
        .iter()
        .find(|m| parse_addr(&m.addr) == Some(addr))
        .map(|m| m.state);
    match state {
        Some(MemberState::Left) => {
            tracing::info!(node = %addr, "floodgate node left the cluster (announced leave)")
        }
        Some(MemberState::Dead) => tracing::warn!(
            node = %addr,
            "floodgate node declared dead by the cluster (lost, not a graceful leave); its slots moved to their successors"
        ),
        _ => {
            tracing::info!(node = %addr, "floodgate node no longer owns slots in the cluster's table")
        }
    }
}

fn parse_addr(addr: &str) -> Option<SocketAddr> {
    addr.parse().ok()
}

/// Asks for the table on a fresh stream of `conn` and validates the answer.
async fn request_table(conn: &quinn::Connection) -> Result<SlotTableMessage, String> {
    const REQUEST_ID: u64 = 1;
    let (mut send, mut recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
    let mut frame = Vec::new();
    encode_frame(&mut frame, FrameKind::TableRequest, REQUEST_ID, &[]);
    send.write_all(&frame).await.map_err(|e| e.to_string())?;
    let _ = send.finish();
    let bytes = recv
        .read_to_end(MAX_TABLE_BYTES)
        .await
        .map_err(|e| e.to_string())?;
    let mut reader = FrameReader::new(MAX_TABLE_BYTES);
    reader.extend(&bytes);
    match reader.next_frame() {
        Ok(Some(frame)) if frame.kind == FrameKind::SlotTable && frame.request_id == REQUEST_ID => {
            decode_slot_table(&frame.payload).map_err(|(_, message)| message)
        }
        Ok(Some(frame)) if frame.kind == FrameKind::Error => {
            match decode_error_frame(&frame.payload) {
                Ok(error) => Err(format!(
                    "the node refused: {} ({})",
                    error.message, error.code
                )),
                Err((_, message)) => Err(message),
            }
        }
        Ok(Some(frame)) => Err(format!(
            "unexpected answer to a table request: {:?}",
            frame.kind
        )),
        Ok(None) => Err("the node finished the stream without a table".to_owned()),
        Err(e) => Err(format!("bad frame from the node: {e}")),
    }
}

/// Fetches the slot table from the first of `nodes` that gives one (for tools such as
/// `floodgate status`). Each node is given `config.connect_timeout` to resolve its name, and as
/// long to connect and answer; it is verified by `config.server_name`, else its host.
pub async fn fetch_slot_table<A: Clone + Into<crate::HostPort>>(
    nodes: &[A],
    config: &ClientConfig,
) -> Result<ClusterTable, crate::ClientError> {
    let nodes: Vec<crate::HostPort> = nodes.iter().cloned().map(Into::into).collect();
    crate::config::validate_nodes(&nodes)?;
    config.validate()?;
    let quic = crate::tls::quinn_config(config)?;
    let mut errors = Vec::new();
    for node in &nodes {
        let addr = match crate::address::resolve(node, config.connect_timeout).await {
            Ok(addrs) => addrs[0],
            Err(why) => {
                errors.push(why);
                continue;
            }
        };
        let endpoint = link::endpoint_for(addr, quic.clone())?;
        let fetched = tokio::time::timeout(config.connect_timeout, async {
            let name = (config.server_name.clone()).unwrap_or_else(|| node.host().to_owned());
            let conn = link::connect(&endpoint, addr, &name, config.connect_timeout).await?;
            let table = request_table(&conn).await;
            conn.close(0u32.into(), b"done");
            table
        })
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {:?}", config.connect_timeout)));
        let _ = tokio::time::timeout(Duration::from_millis(200), endpoint.wait_idle()).await;
        match fetched {
            Ok(message) => return Ok(ClusterTable::from_message(message)),
            Err(why) => errors.push(format!("{node}: {why}")),
        }
    }
    Err(crate::ClientError::Unavailable(errors.join("; ")))
}

#[cfg(test)]
mod tests {
    use floodgate::cluster::SlotTable;
    use floodgate::wire::{TableMember, member_state_to_wire};

    use super::*;

    fn message(ids: &[&str]) -> SlotTableMessage {
        let ids: Vec<String> = ids.iter().map(|s| (*s).to_owned()).collect();
        let table = SlotTable::compute(3, &ids);
        let members: Vec<TableMember> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| TableMember {
                id: id.clone(),
                addr: format!("127.0.0.1:{}", 7100 + i),
                region: "local".to_owned(),
                state: member_state_to_wire(MemberState::Alive),
            })
            .collect();
        let index = |id: Option<&str>| {
            id.map_or(NONE, |id| ids.iter().position(|i| i == id).unwrap() as u16)
        };
        SlotTableMessage {
            version: table.version(),
            epoch: table.epoch(),
            from: ids[0].clone(),
            members,
            owners: (0..SLOTS as u16).map(|s| index(table.owner(s))).collect(),
            successors: (0..SLOTS as u16)
                .map(|s| index(table.successor(s)))
                .collect(),
        }
    }

    #[test]
    fn a_table_names_each_slots_owner_as_the_nodes_compute_it() {
        let ids = ["node-a", "node-b", "node-c"];
        let table = ClusterTable::from_message(message(&ids));
        let core = SlotTable::compute(1, &ids.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
        assert_eq!(table.version, core.version());
        for i in 0..1_000u32 {
            let key = format!("user:{i}");
            assert_eq!(
                table.owner_of_key(key.as_bytes()).map(|m| m.id.as_str()),
                core.owner_of_key(key.as_bytes())
            );
        }
        let total: usize = ids.iter().map(|id| table.slots_owned(id)).sum();
        assert_eq!(total, SLOTS);
        assert_eq!(table.slots_owned("nobody"), 0);
    }

    /// Links follow the table: one per member that owns slots, each key routed to its owner's;
    /// a departed member's link retires after a grace period, and comes back if it returns.
    #[tokio::test]
    async fn routes_follow_the_table() {
        let dir = tempfile::tempdir().unwrap();
        let certs = floodgate_node::ensure_dev_certs(dir.path()).unwrap();
        let mut config = ClientConfig::with_ca_file(&certs.ca);
        config.connect_timeout = Duration::from_millis(50);
        let quic = crate::tls::quinn_config(&config).unwrap();
        let seed = Arc::new(NodeLink::new("127.0.0.1:7100".parse().unwrap(), &config));
        let routing = Arc::new(Routing::new(vec![seed.clone()]));
        let factory = LinkFactory {
            quic,
            settings: Arc::new(LinkSettings::new(&config)),
            config,
        };
        let mut refresher = Refresher::new(routing.clone(), factory, vec![seed]);
        assert!(routing.table().is_none());
        assert_eq!(
            routing.routes().route(b"any"),
            0,
            "the seed, before a table"
        );

        let three = message(&["node-a", "node-b", "node-c"]);
        refresher.apply(ClusterTable::from_message(three.clone()));
        let routes = routing.routes();
        assert_eq!(routes.links.len(), 3, "the seed is node-a: two links added");
        let table = routing.table().unwrap();
        for i in 0..500u32 {
            let key = format!("k{i}");
            let owner = table.owner_of_key(key.as_bytes()).unwrap();
            let link = &routes.links[routes.route(key.as_bytes())];
            assert_eq!(link.addr.to_string(), owner.addr);
        }
        assert_eq!(routing.hint.current.load(Ordering::Relaxed), three.version);

        let two = message(&["node-a", "node-b"]);
        refresher.apply(ClusterTable::from_message(two));
        assert_eq!(routing.routes().links.len(), 2);
        assert_eq!(
            refresher.retiring.len(),
            1,
            "node-c's link retires, not at once"
        );
        let retired = refresher.retiring[0].1.link.clone();
        refresher.apply(ClusterTable::from_message(three));
        assert!(refresher.retiring.is_empty());
        assert!(
            routing
                .routes()
                .links
                .iter()
                .any(|l| Arc::ptr_eq(l, &retired))
        );
        refresher.stop().await;
    }

    #[test]
    fn hints_wake_only_for_another_nonzero_version() {
        let hint = TableHint::default();
        hint.current.store(7, Ordering::Relaxed);
        let node: SocketAddr = "127.0.0.1:1".parse().unwrap();
        hint.saw(7, node);
        hint.saw(0, node);
        assert_eq!(*hint.from.lock(), None);
        hint.saw(8, node);
        assert_eq!(*hint.from.lock(), Some(node));
    }
}
