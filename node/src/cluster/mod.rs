//! The node's part of the cluster: parts that each own their state, and the driver that runs
//! them. The decisions live in the core's sans-I/O `Membership`, `SlotTable` and `Ownership`;
//! these files only move their messages, run their timers and carry out their actions.
//!
//! The parts, handed out once (`ClusterParts`) to the tasks that use them:
//! - `members`: `Members`, who is in the cluster and where: the membership (gossip and the
//!   failure detector), the members' log and gauges, id conflicts and the refusal they may
//!   bring, the cluster version.
//! - `slot_ownership`: `SlotOwnership`, who decides which slot: the ownership machine, the
//!   table in force (published), the deciding gate, the join, the waits for hand-offs, and
//!   where a received region delta goes.
//! - `table_message`: `TableMessages`, the slot table and members as clients receive them,
//!   encoded once.
//! - `replication`: `Replication`, changed buckets to each slot's successor, buckets split
//!   into frames, a peer's buckets merged; `lease_replication`: `LeaseReplication`, the same
//!   for concurrency leases (kind 17), and leases in hand-offs.
//! - `region_rings`: `OtherRegions`, the other regions' rings, followed from the membership.
//! - `peers`: `Peers`, connections to other nodes, dialed by id and reused (`lives`: those to a
//!   restarted member are closed, as they lead to its previous life).
//!
//! The driver, `Cluster` (its loop is `run`: gossip rounds and replication rounds):
//! - `gossip`: the gossip round, a peer's gossip in, readiness and a graceful leave.
//! - `table_switch`: a change of owners becomes a new table, switched under the deciding gate
//!   through the ownership machine, and the hand-offs it owes go out.
//! - `unconfirmed_handoff`: region units other regions have not confirmed, handed over with
//!   their slots (kind 25), taken from the region exchange through `UnconfirmedSource`.

mod gossip;
mod lease_replication;
mod lives;
mod members;
mod peers;
mod region_rings;
mod replication;
mod slot_ownership;
mod table_message;
mod table_switch;
mod unconfirmed_handoff;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use floodgate::cluster::{MemberInfo, Membership, SlotTable};
use floodgate::lease::LeaseStore;
use floodgate::{BucketStore, Clock, EpochClock};
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::metrics::ClusterMetrics;

pub use crate::config::ClusterConfig;
pub(crate) use lease_replication::LeaseReplication;
pub(crate) use members::Members;
pub(crate) use peers::Peers;
pub(crate) use region_rings::{OtherRegions, RegionRings};
pub(crate) use replication::Replication;
pub(crate) use slot_ownership::SlotOwnership;
pub(crate) use table_message::TableMessages;
pub(crate) use unconfirmed_handoff::UnconfirmedSource;

/// Most encoded bytes of buckets in one replication or hand-off frame: well under the smallest
/// frame limit a node accepts (`NodeLimits` refuses less than this plus room for the rest).
const BUCKET_BYTES_PER_FRAME: usize = 256 * 1024;
/// Longest a check waits for a starting node to hear from the cluster it joins.
const JOIN_WAIT: Duration = Duration::from_secs(1);
/// Longest a caller that cannot be told `try_again` waits for a gained slot's hand-off (the
/// machine waits longer for a previous owner held alive; such a caller is then refused).
const OLD_CALLER_HANDOFF_WAIT: Duration = Duration::from_millis(500);
/// Longest a message to a peer may take before it is given up.
pub(crate) const PEER_TIMEOUT: Duration = Duration::from_secs(1);
/// How often a node whose seeds do not answer, or that receives conflicting claims on an id,
/// says so in the log (gossip retries every round; the log need not).
const COMPLAINT_INTERVAL_NS: u64 = 1_000_000_000;
/// Longest a seed's name may take to resolve before the dial is given up (retried next round).
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(1);

/// The driver of the cluster's parts: the gossip round, each change of owners switched to
/// through the table update and its hand-offs, replication rounds, the leave. It keeps its own
/// handles on the parts it drives and hands none of them out: the node is given the parts once
/// ([`ClusterParts`]), and keeps the driver only for what is the driver's (a peer's gossip,
/// readiness, the leave, its loop).
#[derive(Debug)]
pub(crate) struct Cluster {
    config: ClusterConfig,
    members: Arc<Members>,
    slots: Arc<SlotOwnership>,
    peers: Arc<Peers>,
    replication: Arc<Replication>,
    lease_replication: Arc<LeaseReplication>,
    regions: Arc<OtherRegions>,
    clock: EpochClock,
    metrics: ClusterMetrics,
    /// One table update at a time (gossip, the gossip loop, a leave), so a leave's hand-off is
    /// the one it waits for.
    updating: Mutex<()>,
    /// The region exchange's unconfirmed units, handed over with slots (set once the node's
    /// region exchange is built).
    unconfirmed_source: std::sync::OnceLock<Arc<dyn UnconfirmedSource>>,
}

/// The cluster's parts, each owning its state, for the node to hand to the tasks that use
/// them.
#[derive(Debug, Clone)]
pub(crate) struct ClusterParts {
    /// Who is in the cluster and where.
    pub(crate) members: Arc<Members>,
    /// Who decides which slot while slots move.
    pub(crate) slots: Arc<SlotOwnership>,
    /// The slot table as clients receive it.
    pub(crate) tables: Arc<TableMessages>,
    /// Buckets between nodes.
    pub(crate) replication: Arc<Replication>,
    /// Concurrency leases between nodes.
    pub(crate) lease_replication: Arc<LeaseReplication>,
    /// The other regions' rings.
    pub(crate) regions: Arc<OtherRegions>,
    /// Connections to other nodes.
    pub(crate) peers: Arc<Peers>,
}

/// What a node's cluster is built from.
#[derive(Debug)]
pub(crate) struct ClusterSetup {
    pub(crate) config: ClusterConfig,
    /// The QUIC address the node listens on (and advertises, unless `config.advertise` says).
    pub(crate) listen: SocketAddr,
    /// Where connections to peers are dialed from.
    pub(crate) endpoint: quinn::Endpoint,
    pub(crate) peer_config: crate::tls::PeerClientConfigs,
    /// The buckets replicated and handed off, and where merged ones go.
    pub(crate) store: Arc<BucketStore>,
    /// Concurrency leases, replicated and handed off with the buckets of their slots.
    pub(crate) leases: Arc<LeaseStore>,
    pub(crate) clock: EpochClock,
    pub(crate) metrics: ClusterMetrics,
    /// The largest frame peers accept: replication frames carry half of it in buckets (at most
    /// `BUCKET_BYTES_PER_FRAME`).
    pub(crate) max_frame_bytes: usize,
}

impl Cluster {
    /// Builds the parts and their driver: the node hands the parts to the tasks that use them,
    /// and runs the driver ([`run`]).
    pub(crate) fn new(setup: ClusterSetup) -> (Cluster, ClusterParts) {
        let ClusterSetup {
            config,
            listen,
            endpoint,
            peer_config,
            store,
            leases,
            clock,
            metrics,
            max_frame_bytes,
        } = setup;
        let now_ns = clock.now_ns();
        let me = me_at(&config, listen);
        let (membership, table, has_other_seeds) = starting_membership(&config, &me, now_ns);
        let peers = Arc::new(Peers::new(
            endpoint,
            peer_config,
            metrics.peer_handshake_failures.clone(),
            metrics.outbound_version_mismatches.clone(),
            own_addrs(&me, listen),
        ));
        let id = me.id.clone();
        let members = Arc::new(Members::new(
            me,
            membership,
            peers.clone(),
            metrics.clone(),
            now_ns,
        ));
        let slots = Arc::new(SlotOwnership::new(
            id.clone(),
            members.clone(),
            clock,
            table,
            has_other_seeds,
            now_ns,
        ));
        let bucket_bytes_per_frame = (max_frame_bytes / 2).min(BUCKET_BYTES_PER_FRAME);
        let parts = ClusterParts {
            tables: Arc::new(TableMessages::new(
                id.clone(),
                members.clone(),
                slots.clone(),
            )),
            replication: Arc::new(Replication::new(
                id.clone(),
                store,
                bucket_bytes_per_frame,
                members.clone(),
                peers.clone(),
                metrics.clone(),
            )),
            lease_replication: Arc::new(LeaseReplication::new(
                id,
                leases,
                bucket_bytes_per_frame,
                members.clone(),
            )),
            regions: Arc::default(),
            members,
            slots,
            peers,
        };
        let cluster = Cluster {
            config,
            members: parts.members.clone(),
            slots: parts.slots.clone(),
            peers: parts.peers.clone(),
            replication: parts.replication.clone(),
            lease_replication: parts.lease_replication.clone(),
            regions: parts.regions.clone(),
            clock,
            metrics,
            updating: Mutex::new(()),
            unconfirmed_source: std::sync::OnceLock::new(),
        };
        (cluster, parts)
    }
}

/// The membership a node starts with (its start time in ms the incarnation: a restart always
/// comes back newer), its table (of itself alone), and whether it has seeds other than itself
/// to join.
fn starting_membership(
    config: &ClusterConfig,
    me: &MemberInfo,
    now_ns: u64,
) -> (Membership, Arc<SlotTable>, bool) {
    let seeds: Vec<String> = config.seeds.iter().map(ToString::to_string).collect();
    // A node listed among its own seeds (one list for every node) has nobody to wait for.
    let has_other_seeds = seeds.iter().any(|s| *s != me.addr);
    let membership = Membership::new(
        me.clone(),
        now_ns / 1_000_000,
        seeds,
        config.membership,
        now_ns,
        now_ns,
    );
    let table = Arc::new(SlotTable::compute(
        membership.epoch(),
        &membership.owners_in(&me.region),
    ));
    (membership, table, has_other_seeds)
}

/// This node as a member: its id (`--node-id`, or its address), the address it advertises
/// (`--advertise`, or the one it listens on), its region.
pub(crate) fn me_at(config: &ClusterConfig, listen: SocketAddr) -> MemberInfo {
    let addr = config.advertise.unwrap_or(listen).to_string();
    MemberInfo {
        id: config.node_id.clone().unwrap_or_else(|| addr.clone()),
        addr,
        region: config.region.clone(),
    }
}

/// This node's own addresses: the advertised one, and the one listened on when specific (a
/// seed name that resolves to one of them is this node).
fn own_addrs(me: &MemberInfo, listen: SocketAddr) -> Vec<SocketAddr> {
    let mut own_addrs: Vec<SocketAddr> = me.addr.parse().ok().into_iter().collect();
    if !listen.ip().is_unspecified() {
        own_addrs.push(listen);
    }
    own_addrs
}

/// Runs gossip rounds and replication until shutdown.
///
/// The replication lag gauge is the time since the start of the last round whose every message
/// the successors acknowledged: how old their copies can be now (it grows while one is down,
/// and while a round is late).
pub(crate) async fn run(cluster: Arc<Cluster>, mut shutdown: watch::Receiver<bool>) {
    let tick = Duration::from_nanos(cluster.config.membership.gossip_interval_ns / 2)
        .max(Duration::from_millis(5));
    let mut ticker = tokio::time::interval(tick);
    let sync_ns = u64::try_from(cluster.config.sync_interval.as_nanos()).unwrap_or(u64::MAX);
    let mut next_sync_ns = 0;
    let replicated_through = Arc::new(AtomicU64::new(cluster.clock.now_ns()));
    let mut round: Option<tokio::task::JoinHandle<()>> = None;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => return,
        }
        let now_ns = cluster.clock.now_ns();
        cluster.gossip_round(now_ns);
        // A round still reading the store is let finish rather than joined by another: rounds
        // never pile up on a slow store, they only come later (the lag gauge shows it).
        if now_ns >= next_sync_ns && round.as_ref().is_none_or(|r| r.is_finished()) {
            round = Some(tokio::spawn(replication_round(
                cluster.clone(),
                now_ns,
                replicated_through.clone(),
            )));
            next_sync_ns = now_ns + sync_ns;
        }
        let lag_ns = now_ns.saturating_sub(replicated_through.load(Ordering::Relaxed));
        cluster.metrics.replication_lag.set(lag_ns as f64 / 1e9);
    }
}

/// One replication round started at `now_ns`: the changed buckets taken from the store and
/// encoded on a blocking thread (the work grows with what changed, and a runtime worker is
/// serving checks), then sent. Ends once the sends are under way; `through` moves to `now_ns`
/// when every one of them is acknowledged.
async fn replication_round(cluster: Arc<Cluster>, now_ns: u64, through: Arc<AtomicU64>) {
    let reader = cluster.clone();
    let frames = match tokio::task::spawn_blocking(move || reader.replication_frames(now_ns)).await
    {
        Ok(frames) => frames,
        Err(e) => {
            // Only a panic or the runtime shutting down: `through` stays, the lag grows.
            tracing::error!(error = %e, "a replication round failed");
            return;
        }
    };
    let sends = cluster.replication.send_frames(frames);
    // One waiter per round, each bounded by the sends' own timeout.
    tokio::spawn(async move {
        for send in sends {
            if !matches!(send.await, Ok(true)) {
                return;
            }
        }
        through.fetch_max(now_ns, Ordering::Relaxed);
    });
}

impl Cluster {
    /// The synchronous part of a replication round: takes the buckets and lease sets changed
    /// since the last round and encodes them as frames for their slots' successors (or, for
    /// anything decided here for another owner, that owner), by peer address. Blocking: run it
    /// off the runtime's workers (`run` does).
    fn replication_frames(&self, now_ns: u64) -> Vec<(String, Vec<u8>)> {
        let table = self.slots.table();
        // Alone, there is nobody to replicate to; changed marks stay set, so a node that joins
        // later still receives them (through the hand-off first).
        if table.nodes().len() < 2 {
            return Vec::new();
        }
        let buckets = self.replication.round_frames(now_ns, &table);
        let mut frames = self.lease_replication.round_frames(now_ns, &table);
        frames.extend(buckets);
        frames
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn cluster_alone() -> Cluster {
        alone().0
    }

    /// A cluster of one, node-a, and its parts.
    pub(crate) fn alone() -> (Cluster, ClusterParts) {
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
        Cluster::new(ClusterSetup {
            config,
            listen: "127.0.0.1:7000".parse().unwrap(),
            endpoint,
            peer_config: crate::tls::PeerClientConfigs {
                members: quinn::ClientConfig::new(quic.clone()),
                seeds: quinn::ClientConfig::new(quic),
            },
            store: Arc::new(BucketStore::new(floodgate::StoreConfig::default()).unwrap()),
            leases: Arc::new(crate::lease::lease_store(None)),
            clock: floodgate::EpochClock::start(),
            metrics: crate::metrics::NodeMetrics::register().cluster(),
            max_frame_bytes: crate::config::NodeLimits::default().max_frame_bytes,
        })
    }

    /// The membership of a second member, "node-b", once it has joined through `cluster`.
    pub(crate) fn joined_by_b(cluster: &Cluster, now: u64) -> Membership {
        let mut b = Membership::new(
            MemberInfo {
                id: "node-b".into(),
                addr: "127.0.0.1:7001".into(),
                region: "local".into(),
            },
            1,
            vec!["127.0.0.1:7000".into()],
            floodgate::cluster::MembershipConfig::default(),
            now,
            7,
        );
        // b has joined (it heard of a, a settled member, first): a's tables name it only then.
        b.found();
        for out in b.poll(now) {
            drop(cluster.update_table(now, |m| drop(m.handle_gossip(now, &out.gossip))));
        }
        b
    }

    /// A member that announced its leave hands its buckets over; until this node's table
    /// stops naming it (the switch comes a moment after the leave is heard of), a takeover
    /// for one of its slots is sent to it, never decided here from replicas that miss its
    /// last decisions. A member silent past suspicion is taken over from.
    #[tokio::test]
    async fn a_takeover_for_a_departed_owner_is_forwarded_and_one_for_a_silent_owner_decided() {
        use floodgate::cluster::ownership::{Arrival, Placement};
        use floodgate::cluster::{MemberState, MembershipConfig};
        let a = cluster_alone();
        let now = a.clock.now_ns();
        // b joins through a; a's table then names both.
        let mut b = joined_by_b(&a, now);
        let table = a.slots.table();
        assert_eq!(table.nodes().len(), 2, "a knows b: {:?}", table.nodes());
        let slot = (0..floodgate::cluster::SLOTS as u16)
            .find(|&s| table.owner(s) == Some("node-b") && table.successor(s) == Some("node-a"))
            .expect("b owns a slot a succeeds");
        let place = || {
            a.slots
                .place_each([(slot, Arrival::Takeover)].into_iter(), now)
                .0
        };

        // a hears of b's leave; its table has not switched yet.
        for out in a.members.membership().poll(now) {
            drop(b.handle_gossip(now, &out.gossip));
        }
        let leave = b.leave(now);
        assert!(!leave.is_empty(), "b tells a of its leave");
        for out in &leave {
            drop(a.members.membership().handle_gossip(now, &out.gossip));
        }
        assert_eq!(
            a.members.membership().state_of("node-b"),
            Some(MemberState::Left)
        );
        assert_eq!(place(), vec![Placement::Forward("node-b".into())]);

        // Silent instead (no leave heard, past the failure detector's timeouts): taken over.
        let c = cluster_alone();
        drop(joined_by_b(&c, now));
        let suspect_at = now + MembershipConfig::default().suspect_after_ns + 1;
        drop(c.members.membership().poll(suspect_at));
        assert_eq!(
            c.members.membership().state_of("node-b"),
            Some(MemberState::Suspect)
        );
        let placed = c
            .slots
            .place_each([(slot, Arrival::Takeover)].into_iter(), suspect_at)
            .0;
        assert_eq!(placed, vec![Placement::Takeover]);
    }

    /// Releases (settled joins) pass only between the members of one region's table, so an
    /// older build in another region must not turn them off here: a switch gives the ownership
    /// machine this region's version, not the cluster's.
    #[tokio::test]
    async fn a_switch_hears_its_regions_version_not_the_clusters() {
        use floodgate::cluster::membership::MemberDigest;
        use floodgate::cluster::{Gossip, MemberInfo};
        use floodgate::protocol::{Feature, NEWEST, OLDEST, VersionRange};
        let a = cluster_alone();
        let now = a.clock.now_ns();
        let before_releases = Feature::SettledJoins.since() - 1;
        let member = |id: &str, region: &str, versions: VersionRange| MemberDigest {
            info: MemberInfo {
                id: id.into(),
                addr: format!("127.0.0.1:{}", 7100 + id.len()),
                region: region.into(),
            },
            incarnation: 1,
            heartbeat: 1,
            left: false,
            versions: Some(versions),
            joining: false,
        };
        let hear = |digest: MemberDigest| {
            let gossip = Gossip {
                members: vec![digest],
            };
            a.members
                .change(|m| drop(m.handle_gossip(now, &gossip)), &a.regions)
        };
        let old = VersionRange::new(OLDEST, before_releases).unwrap();
        let heard = hear(member("old-far", "far", old));
        assert_eq!(a.members.cluster_version(), before_releases);
        assert_eq!(
            heard.region_version, NEWEST,
            "region `far` holds back only itself"
        );
        // One of this region's own members on that build does hold it back.
        let heard = hear(member("old-near", "local", old));
        assert_eq!(heard.region_version, before_releases);
    }
}
