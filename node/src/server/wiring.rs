//! The composition root: the node's parts built once at start (stores, cluster, region
//! exchange, RLQS hub, rules, admission), and each task's handful of them.

use std::net::SocketAddr;
use std::sync::Arc;

use floodgate::cluster::MemberInfo;
use floodgate::{BucketStore, EpochClock};

use crate::admin::Readiness;
use crate::check_path::CheckPath;
use crate::cluster::{Cluster, ClusterParts, ClusterSetup};
use crate::config::NodeConfig;
use crate::front_batch::FrontContext;
use crate::metrics::NodeMetrics;
use crate::region_sync::RegionSync;
use crate::tls;

use super::Connections;
use super::connection::Serving;
use super::peer_messages::PeerMessages;
use super::streams::Answering;
use super::sweeper::Swept;

/// The node's parts, as built at start. Nothing hands this on whole: each task is given the
/// parts it uses (`Serving`, `FrontContext`, `Swept`, `Readiness`, ...).
#[derive(Debug)]
pub(super) struct Wiring {
    pub(super) config: NodeConfig,
    /// The cluster's driver: gossip rounds, table updates and their hand-offs, the leave.
    pub(super) cluster: Arc<Cluster>,
    /// The cluster's parts: members, slot ownership, table messages, replication, peers.
    pub(super) parts: ClusterParts,
    /// What deciding a request takes: the stores, the clock, who decides which slot.
    pub(super) checks: Arc<CheckPath>,
    /// Admission, the buffer budget and peer trust of every connection.
    pub(super) connections: Arc<Connections>,
    pub(super) readiness: Arc<Readiness>,
    /// The rules file in force (`--rules`), served to clients and hot-reloaded.
    pub(super) rules: Option<Arc<crate::rules::RulesHandle>>,
    /// RLQS shares: of the buckets this node owns, whoever's Envoys report them, and the
    /// reports of this node's Envoys for other owners (with or without `--rlqs-listen`).
    pub(super) rlqs: Arc<crate::rlqs::Hub>,
}

/// Builds the node's parts, and opens the snapshots of `--state-dir` (not loaded yet).
pub(super) fn wire(
    config: NodeConfig,
    endpoint: &quinn::Endpoint,
    local_addr: SocketAddr,
    peer_trust: tls::PeerTrust,
) -> anyhow::Result<(Wiring, Option<Arc<crate::snapshot::Snapshots>>)> {
    let store = BucketStore::new(config.store)?.with_max_bytes(config.limits.bucket_bytes())?;
    let snapshots = config
        .state_dir
        .as_deref()
        .map(crate::snapshot::Snapshots::open)
        .transpose()?;
    let rules = config
        .rules
        .as_deref()
        .map(crate::rules::RulesHandle::load)
        .transpose()?;
    let clock = EpochClock::start().skewed(config.test_only_clock_skew_ns);
    let peer_config = tls::peer_client_configs(&config.tls, &config.limits)?;
    let metrics = Arc::new(NodeMetrics::register());
    let store = Arc::new(store);
    let leases = Arc::new(crate::lease::lease_store(Some(config.limits.lease_cap())));
    let (cluster, parts) = Cluster::new(ClusterSetup {
        config: config.cluster.clone(),
        listen: local_addr,
        endpoint: endpoint.clone(),
        peer_config,
        store: store.clone(),
        leases: leases.clone(),
        clock,
        metrics: metrics.cluster(),
        max_frame_bytes: config.limits.max_frame_bytes,
    });
    let cluster = Arc::new(cluster);
    let region_sync = Arc::new(region_sync(
        &config,
        parts.members.me(),
        store.clone(),
        clock,
    )?);
    cluster.hand_over_unconfirmed_from(region_sync.clone());
    let checks = Arc::new(CheckPath {
        limits: config.limits,
        takeover_forward_timeout: config.cluster.takeover_forward_timeout,
        store,
        leases,
        clock,
        metrics: metrics.clone(),
        slots: parts.slots.clone(),
        members: parts.members.clone(),
        peers: parts.peers.clone(),
        forwards: Default::default(),
        regions: parts.regions.clone(),
        region_sync,
    });
    let connections = Arc::new(Connections::new(config.limits, metrics, peer_trust));
    let wiring = Wiring {
        readiness: Arc::new(Readiness::new(cluster.clone())),
        rlqs: rlqs_hub(&config, &parts),
        cluster,
        parts,
        checks,
        connections,
        rules,
        config,
    };
    Ok((wiring, snapshots))
}

impl Wiring {
    /// What a QUIC connection's tasks are handed.
    pub(super) fn serving(&self) -> Serving {
        Serving {
            connections: self.connections.clone(),
            answering: self.answering(),
            messages: Arc::new(PeerMessages {
                cluster: self.cluster.clone(),
                members: self.parts.members.clone(),
                slots: self.parts.slots.clone(),
                tables: self.parts.tables.clone(),
                replication: self.parts.replication.clone(),
                lease_replication: self.parts.lease_replication.clone(),
                region_sync: self.checks.region_sync.clone(),
                rlqs: self.rlqs.clone(),
                clock: self.checks.clock,
                metrics: self.checks.metrics.clone(),
            }),
        }
    }

    /// What answers the frames of a bidirectional stream.
    pub(super) fn answering(&self) -> Arc<Answering> {
        Arc::new(Answering {
            checks: self.checks.clone(),
            tables: self.parts.tables.clone(),
            rules: self.rules.clone(),
            rlqs: self.rlqs.clone(),
        })
    }

    /// What the RLS and RESP fronts are handed.
    pub(super) fn front(&self) -> Arc<FrontContext> {
        Arc::new(FrontContext {
            config: self.config.clone(),
            budget: self.connections.budget.clone(),
            checks: self.checks.clone(),
        })
    }

    /// What the expiry sweeper sweeps and publishes.
    pub(super) fn swept(&self) -> Arc<Swept> {
        Arc::new(Swept {
            store: self.checks.store.clone(),
            leases: self.checks.leases.clone(),
            clock: self.checks.clock,
            metrics: self.checks.metrics.clone(),
            budget: self.connections.budget.clone(),
        })
    }
}

/// The RLQS hub. A node without `--rlqs-listen` has one too (on default settings): it computes
/// the shares of the buckets it owns for the Envoys of other nodes.
fn rlqs_hub(config: &NodeConfig, parts: &ClusterParts) -> Arc<crate::rlqs::Hub> {
    let mut settings = config
        .rlqs
        .clone()
        .unwrap_or_else(|| crate::rlqs::RlqsSettings::new(SocketAddr::from(([127, 0, 0, 1], 0))));
    settings.global_domains = config.rlqs_global_domains.clone();
    let cluster = crate::rlqs::ClusterView {
        members: parts.members.clone(),
        slots: parts.slots.clone(),
        regions: parts.regions.clone(),
        peers: parts.peers.clone(),
    };
    Arc::new(crate::rlqs::Hub::new(settings, Some(Arc::new(cluster))))
}

/// The node's region exchange: this node (`me`) as a peer of its region, its start time as the
/// session (a restart is told from a replay), the sync interval from the flags.
fn region_sync(
    config: &NodeConfig,
    me: &MemberInfo,
    store: Arc<BucketStore>,
    clock: EpochClock,
) -> anyhow::Result<RegionSync<EpochClock>> {
    let region = floodgate::region::RegionName::new(&me.region)
        .map_err(|e| anyhow::anyhow!("--region {:?}: {e}", me.region))?;
    let me = floodgate::region::Peer::new(region, &me.id);
    let exchange_config = floodgate::region::ExchangeConfig {
        sync_interval_ns: u64::try_from(config.cluster.region_sync_interval.as_nanos())
            .unwrap_or(u64::MAX),
        unreachable_after_ns: u64::try_from(config.cluster.region_unreachable_after.as_nanos())
            .unwrap_or(u64::MAX),
        ..floodgate::region::ExchangeConfig::for_regions(1)
    };
    let exchange =
        floodgate::region::Exchange::new(exchange_config, me, floodgate::Clock::now_ns(&clock));
    Ok(RegionSync::new(exchange, store, clock))
}
