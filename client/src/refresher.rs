//! The refresher: the background task that keeps the slot table and the links to its members
//! current.
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
//! by one background task ([`Refresher`]): at most one fetch in flight, and a table taken,
//! fetched or pushed, at most every [`MIN_FETCH_INTERVAL`]. A call whose owner cannot be reached (its link is down or its breaker
//! open, or the call failed on it) goes to the slot's successor, marked as a takeover: the
//! successor holds the owner's replicas (at most one sync interval old) and decides from them.
//! An owner the table names again after it had left (a restart) is alive: until our link to it
//! connects again, its checks go to the successor unmarked, which forwards them to the owner.
//! Only when neither can be reached does the failure mode decide. Before any table is known (or from
//! nodes that serve none) calls spread over the seeds by a stable hash ([`Router`]); the nodes
//! forward what they do not own.
//!
//! Fetches use their own connection (one at a time, reused), so they never wait behind checks.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use floodgate::cluster::membership::MAX_MEMBERS;
use floodgate::cluster::{MemberState, SLOTS};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::cluster_table::ClusterTable;
use crate::config::ClientConfig;
use crate::link::{self, LinkSettings, NodeLink};
use crate::router::Router;
use crate::routing::{NONE, Routes, Routing};
use crate::status::LinkState;
use crate::table_feed::{FETCH_TIMEOUT, TableHint, request_table};
use crate::{dial, tls};

/// How often the table is fetched when nothing suggests it changed.
pub(crate) const REFRESH_PERIOD: Duration = Duration::from_secs(1);
/// Fetches never come closer together than this, whatever triggers them.
pub(crate) const MIN_FETCH_INTERVAL: Duration = Duration::from_millis(100);
/// Least time a departed member's link stays open after the table stops naming it.
const RETIRE_GRACE: Duration = Duration::from_millis(500);
/// Nodes tried per refresh before waiting for the next one.
const ATTEMPTS_PER_REFRESH: usize = 3;

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
    /// Most links in their grace at once ([`MAX_MEMBERS`]; fewer in tests).
    max_retiring: usize,
    /// How long a departed member's link stays open.
    grace: Duration,
    /// The connection fetches go over, and its node.
    control: Option<(SocketAddr, quinn::Connection)>,
    endpoint: Option<quinn::Endpoint>,
    last_table: Option<Arc<ClusterTable>>,
    /// The region whose tables this client routes by: the configured one, else the region of
    /// the first table it took. Each region's nodes place slots among their own region, so
    /// taking tables from two regions would flip routing between two owners of one key.
    region: Option<String>,
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
        let region = factory.config.region.clone();
        Refresher {
            routing,
            factory,
            seeds,
            discovered: BTreeMap::new(),
            retiring: Vec::new(),
            max_retiring: MAX_MEMBERS,
            grace,
            control: None,
            endpoint: None,
            last_table: None,
            region,
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
            // Tables are taken at most every MIN_FETCH_INTERVAL, pushed or fetched: each may
            // start and retire links, and a node pushing without pause must not churn them.
            let earliest = last + MIN_FETCH_INTERVAL;
            if Instant::now() < earliest {
                tokio::select! {
                    biased;
                    _ = shutdown.wait_for(|&stop| stop) => break,
                    () = tokio::time::sleep_until(earliest) => {}
                }
            }
            // A pushed table needs no fetch (the latest pushed, if several came meanwhile).
            let pushed = hint.pushed.lock().take();
            if let Some(table) = pushed {
                self.apply(table);
                last = Instant::now();
                continue;
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
                || tls::seed_server_name(self.factory.config.server_name.as_deref(), addr),
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
                        let endpoint = dial::endpoint_for(addr, self.factory.quic.clone())
                            .map_err(|e| e.to_string())?;
                        self.endpoint = Some(endpoint.clone());
                        endpoint
                    }
                };
                let server_name = self.server_name_of(addr);
                let conn = dial::connect(&endpoint, addr, &server_name, FETCH_TIMEOUT).await?;
                self.control = Some((addr, conn.clone()));
                conn
            }
        };
        tokio::time::timeout(FETCH_TIMEOUT, request_table(&conn))
            .await
            .map_err(|_| format!("no slot table within {FETCH_TIMEOUT:?}"))?
    }

    /// Routes by `table`: links to every member of the sender's region that owns slots, closes
    /// links to members that left, and maps each slot to its owner's link.
    fn apply(&mut self, table: ClusterTable) {
        if !self.routes_in_region_of(&table) {
            return;
        }
        self.routing
            .hint
            .current
            .store(table.version(), Ordering::Relaxed);
        if self
            .last_table
            .as_ref()
            .is_some_and(|last| last.routes_like(&table))
        {
            return;
        }
        let owners = region_owners(&table);
        self.link_owners(&owners);
        self.retire_departed(&table, &owners);
        let links: Vec<Arc<NodeLink>> = self
            .seeds
            .iter()
            .cloned()
            .chain(self.discovered.values().map(|d| d.link.clone()))
            .collect();
        self.mark_rejoined(&links, &owners);
        let (slot_link, successor_link) = slot_links(&table, &links);
        let table = Arc::new(table);
        tracing::debug!(
            version = table.version(),
            epoch = table.epoch(),
            from = %table.from(),
            "routing by a new slot table"
        );
        let routes = Routes {
            fallback: Router::new(self.seeds.len()),
            links,
            table: Some(table.clone()),
            slot_link,
            successor_link,
        };
        self.routing.replace(routes);
        self.last_table = Some(table);
    }

    /// Whether `table`'s sender is of this client's region; the first table's sender chooses
    /// the region.
    fn routes_in_region_of(&mut self, table: &ClusterTable) -> bool {
        let Some(from) = table.members().iter().find(|m| m.id == table.from()) else {
            return true;
        };
        match &self.region {
            // Its owners are its own region's: routing by them would leave this region.
            Some(mine) if from.region != *mine => {
                tracing::warn!(
                    node = %from.addr,
                    "ignoring the slot table of a node of region `{}`: this client routes in region `{mine}`",
                    from.region
                );
                return false;
            }
            Some(_) => {}
            None => {
                tracing::info!("routing in region `{}` (the first table's)", from.region);
                self.region = Some(from.region.clone());
            }
        }
        true
    }

    /// A link to every owner that is not a seed: one back before its link was closed keeps it.
    fn link_owners(&mut self, owners: &HashMap<SocketAddr, &str>) {
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
    }

    /// Links to members no longer among the owners close after the grace.
    fn retire_departed(&mut self, table: &ClusterTable, owners: &HashMap<SocketAddr, &str>) {
        let departed: Vec<SocketAddr> = self
            .discovered
            .keys()
            .filter(|addr| !owners.contains_key(addr))
            .copied()
            .collect();
        let retire_at = Instant::now() + self.grace;
        for addr in departed {
            if let Some(entry) = self.discovered.remove(&addr) {
                log_departure(table, addr);
                self.retiring.push((retire_at, entry));
            }
        }
        // A table names at most MAX_MEMBERS members; past as many links in their grace, the
        // oldest close at once, so tables that keep naming new members cannot pile links up.
        let excess = self.retiring.len().saturating_sub(self.max_retiring);
        if excess > 0 {
            self.retiring.sort_by_key(|(at, _)| *at);
            for (_, entry) in self.retiring.drain(..excess) {
                entry.stop.send_replace(true);
            }
        }
    }

    /// Marks the links of members that own slots now but did not in the last table (back after
    /// a leave, as in a restart, or new): a node the cluster's table names is up, so while our
    /// link to it is not connected its checks go through another node rather than as takeovers.
    fn mark_rejoined(&self, links: &[Arc<NodeLink>], owners: &HashMap<SocketAddr, &str>) {
        let Some(last) = &self.last_table else {
            return;
        };
        let before: HashSet<SocketAddr> = last
            .members()
            .iter()
            .filter(|m| m.state.owns_slots())
            .filter_map(|m| parse_addr(&m.addr))
            .collect();
        for link in links {
            if owners.contains_key(&link.addr) && !before.contains(&link.addr) {
                link.mark_rejoined();
            }
        }
    }

    /// Links to the member `id` at `addr`, verifying it by its node id.
    fn start_link(&self, addr: SocketAddr, id: &str) -> Result<Discovered, String> {
        let factory = &self.factory;
        let endpoint = dial::endpoint_for(addr, factory.quic.clone()).map_err(|e| e.to_string())?;
        let name = tls::member_server_name(id, addr);
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

/// The members that own slots, by address. Only the sending node's region: a table lists every
/// region's members, but places slots among its own region's (a gateway talks to its own
/// region's nodes only).
fn region_owners(table: &ClusterTable) -> HashMap<SocketAddr, &str> {
    let region = table
        .members()
        .iter()
        .find(|m| m.id == table.from())
        .map(|m| m.region.clone());
    table
        .members()
        .iter()
        .filter(|m| m.state.owns_slots())
        .filter(|m| region.as_ref().is_none_or(|r| *r == m.region))
        .filter_map(|m| Some((parse_addr(&m.addr)?, m.id.as_str())))
        .collect()
}

/// Each slot's owner's link and its successor's, as indexes into `links` (`NONE`: no link).
fn slot_links(table: &ClusterTable, links: &[Arc<NodeLink>]) -> (Box<[u16]>, Box<[u16]>) {
    // Member index → link index, then slot → link index.
    let member_link: Vec<u16> = table
        .members()
        .iter()
        .map(|m| {
            parse_addr(&m.addr)
                .filter(|_| m.state.owns_slots())
                .and_then(|addr| links.iter().position(|l| l.addr == addr))
                .and_then(|i| u16::try_from(i).ok())
                .unwrap_or(NONE)
        })
        .collect();
    let link_of = |member: Option<usize>| {
        member
            .and_then(|m| member_link.get(m).copied())
            .unwrap_or(NONE)
    };
    let slots = 0..SLOTS as u16;
    let slot_link = slots
        .clone()
        .map(|s| link_of(table.owner_member(s)))
        .collect();
    let successor_link = slots.map(|s| link_of(table.successor_member(s))).collect();
    (slot_link, successor_link)
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
        .members()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster_table::tests::message;

    /// A refresher over one seed link at 127.0.0.1:7100 (nothing listens there), its routing,
    /// and the directory of the certificates it trusts (to keep while the test runs).
    fn offline_refresher() -> (Refresher, Arc<Routing>, tempfile::TempDir) {
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
        (
            Refresher::new(routing.clone(), factory, vec![seed]),
            routing,
            dir,
        )
    }

    /// A client with no region routes by the first table's region and ignores another region's
    /// tables from then on: each region places slots among its own nodes, so taking both would
    /// flip one key between two owners.
    #[tokio::test]
    async fn a_client_with_no_region_keeps_the_first_tables_region() {
        let (mut refresher, routing, _certs) = offline_refresher();
        assert_eq!(refresher.factory.config.region, None);
        let in_region = |ids: &[&str], region: &str| {
            let mut table = message(ids);
            for member in &mut table.members {
                member.region = region.to_owned();
            }
            ClusterTable::from_message(table).unwrap()
        };
        let eu = in_region(&["node-a", "node-b"], "eu");
        refresher.apply(eu.clone());
        assert_eq!(refresher.region.as_deref(), Some("eu"));
        refresher.apply(in_region(&["node-x", "node-y", "node-z"], "us"));
        assert_eq!(
            routing.table().unwrap().version(),
            eu.version(),
            "us ignored"
        );
        assert_eq!(routing.routes().links.len(), 2);
        let eu_again = in_region(&["node-a", "node-b", "node-c"], "eu");
        refresher.apply(eu_again.clone());
        assert_eq!(routing.table().unwrap().version(), eu_again.version());
    }

    /// Tables that keep naming new members cannot pile up links in their grace: past the cap,
    /// the oldest close at once.
    #[tokio::test]
    async fn links_in_their_grace_are_capped() {
        let (mut refresher, _routing, _certs) = offline_refresher();
        refresher.max_retiring = 2;
        // The seed and two members of their own each time, at ports of their own.
        let table = |round: u16| {
            let (a, b) = (format!("a{round}"), format!("b{round}"));
            let mut table = message(&["seed", &a, &b]);
            for (i, member) in table.members.iter_mut().enumerate().skip(1) {
                member.addr = format!("127.0.0.1:{}", 8000 + 10 * round + i as u16);
            }
            ClusterTable::from_message(table).unwrap()
        };
        refresher.apply(table(1));
        refresher.apply(table(2));
        let first: Vec<_> = (refresher.retiring.iter())
            .map(|(_, e)| e.stop.subscribe())
            .collect();
        assert_eq!(first.len(), 2, "round 1's links in their grace");
        assert!(first.iter().all(|stop| !*stop.borrow()));
        refresher.apply(table(3));
        assert_eq!(refresher.retiring.len(), 2, "at the cap");
        assert!(
            first.iter().all(|stop| *stop.borrow()),
            "round 1's links closed at once"
        );
        refresher.stop().await;
    }

    /// Pushed tables are taken at most every `MIN_FETCH_INTERVAL`: a node pushing without pause
    /// (each table may start and retire links) is not followed faster than that, and the latest
    /// pushed meanwhile is the one taken.
    #[tokio::test(start_paused = true)]
    async fn pushed_tables_are_taken_at_most_every_min_fetch_interval() {
        let (refresher, routing, _certs) = offline_refresher();
        let hint = routing.hint.clone();
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(refresher.run(stopped));
        let table = |ids: &[&str]| ClusterTable::from_message(message(ids)).unwrap();
        let version = || routing.table().map(|t| t.version());
        let (first, second, third) = (
            table(&["node-a", "node-b"]),
            table(&["node-a", "node-b", "node-c"]),
            table(&["node-a", "node-c"]),
        );
        tokio::time::sleep(MIN_FETCH_INTERVAL).await;
        hint.pushed(first.clone());
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(version(), Some(first.version()), "taken at once");
        // Two more pushed right after: neither is taken within the interval, then the latest.
        hint.pushed(second);
        tokio::time::sleep(Duration::from_millis(1)).await;
        hint.pushed(third.clone());
        tokio::time::sleep(MIN_FETCH_INTERVAL - Duration::from_millis(10)).await;
        assert_eq!(version(), Some(first.version()), "within the interval");
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(version(), Some(third.version()), "the latest, after it");
        stop.send_replace(true);
        task.await.unwrap();
    }

    /// Links follow the table: one per member that owns slots, each key routed to its owner's;
    /// a departed member's link retires after a grace period, and comes back if it returns.
    #[tokio::test]
    async fn routes_follow_the_table() {
        let (mut refresher, routing, _certs) = offline_refresher();
        assert!(routing.table().is_none());
        assert_eq!(
            routing.routes().route(b"any"),
            0,
            "the seed, before a table"
        );

        let three = message(&["node-a", "node-b", "node-c"]);
        refresher.apply(ClusterTable::from_message(three.clone()).unwrap());
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
        refresher.apply(ClusterTable::from_message(two).unwrap());
        assert_eq!(routing.routes().links.len(), 2);
        assert_eq!(
            refresher.retiring.len(),
            1,
            "node-c's link retires, not at once"
        );
        let retired = refresher.retiring[0].1.link.clone();
        assert!(!retired.is_rejoined());
        refresher.apply(ClusterTable::from_message(three).unwrap());
        // Named again (nothing listens there, so its link cannot have connected): its checks
        // go through another node, not as takeovers; the members named all along are not marked.
        assert!(retired.is_rejoined(), "node-c is back in the table");
        let marked = routing
            .routes()
            .links
            .iter()
            .filter(|l| l.is_rejoined())
            .count();
        assert_eq!(marked, 1, "only node-c");
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
}
