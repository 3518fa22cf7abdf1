//! `envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas`: each
//! stream's reports into the allocator, its pushes back out as `BucketAction`s. Every stream
//! task holds a sender in the hub, so a report on one stream can push a smaller share to the
//! others at once.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use envoy_types::pb::envoy::r#type::v3::TokenBucket;
use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::r#type::v3::RateLimitStrategy;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    self, AbandonAction, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaService;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};
use floodgate::NANOS_PER_SEC;
use floodgate::cluster::slot_of;
use floodgate::protocol::Feature;
use floodgate::rls::RlsConfig;
use floodgate::wire::{
    RLQS_ABANDON, RLQS_DENY, RLQS_TOKEN_BUCKET, RlqsReportBatch, WireRlqsAssignment,
    WireRlqsReport,
};
use metrics::{counter, gauge, histogram};
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::global_state::Global;
use super::relay::Relay;
use super::remote::{Remotes, Stamped};
use super::shares::{Assignment, BucketKey, Limit, Push, Shares, SharesConfig, StreamId, Usage};
use crate::cluster::{Members, OtherRegions, Peers, SlotOwnership};
use crate::config::RlqsSettings;

/// Most entries in one `BucketId` (Envoy's bucket builders make a handful).
pub const MAX_BUCKET_ENTRIES: usize = 64;
/// Answers waiting to be written to one Envoy; past it, pushes to that Envoy are dropped (and
/// counted): its previous assignment stays until it expires or the next report renews it.
const OUTBOUND_QUEUE: usize = 64;

type Outbound = mpsc::Sender<Result<RateLimitQuotaResponse, Status>>;

/// One Envoy stream on this node: where its answers go, and what it holds for each bucket.
#[derive(Debug)]
struct LocalStream {
    sender: Outbound,
    held: HashMap<BucketKey, Held>,
}

/// The last assignment sent to a stream for a bucket: its tokens (0: not a token bucket),
/// until when it binds (a new owner is told it), and who made it, in which rebalance (an
/// older one arriving later is not sent).
#[derive(Debug)]
struct Held {
    tokens: u32,
    expires_ns: u64,
    owner: Option<Arc<str>>,
    seq: u64,
}

/// What every stream shares: the configuration, the allocator, the streams' senders, the
/// Envoys of other nodes whose buckets this node owns, and the reports waiting to be relayed
/// to the owners of buckets this node does not own.
#[derive(Debug)]
pub(crate) struct Hub {
    config: OnceLock<ConfigSource>,
    pub(super) settings: RlqsSettings,
    pub(super) shares: Mutex<Shares>,
    streams: Mutex<HashMap<StreamId, LocalStream>>,
    next_stream: AtomicU64,
    /// Rebalances made here, counted under the allocator's lock: their order. Counted from
    /// the start's wall-clock time in nanoseconds, so a restarted owner's count starts above
    /// its last life's and its assignments are not taken for stale ones.
    seq: AtomicU64,
    epoch: tokio::time::Instant,
    /// The slot table buckets are placed by and the peers they are relayed to; `None`: every
    /// bucket is decided here.
    pub(super) cluster: Option<Arc<ClusterView>>,
    pub(super) remotes: Mutex<Remotes>,
    pub(super) relay: Relay,
    /// `scope: global` buckets: this region's parts, and the splits this node decides.
    pub(super) global: Global,
}

/// The cluster as the hub places buckets and relays reports by: this node, the members'
/// addresses and the version they all speak, the slot table, the other regions' rings, and the
/// peers messages go through.
#[derive(Debug)]
pub(crate) struct ClusterView {
    pub(crate) members: Arc<Members>,
    pub(crate) slots: Arc<SlotOwnership>,
    pub(crate) regions: Arc<OtherRegions>,
    pub(crate) peers: Arc<Peers>,
}

impl Hub {
    pub(crate) fn new(settings: RlqsSettings, cluster: Option<Arc<ClusterView>>) -> Hub {
        let shares = Shares::new(SharesConfig {
            ttl_ns: u64::from(settings.assignment_ttl_s) * NANOS_PER_SEC,
            idle_reports_before_abandon: settings.idle_reports_before_abandon,
            max_envoys_per_bucket: settings.max_envoys_per_bucket,
            max_buckets_per_stream: settings.max_buckets_per_stream,
            max_buckets: settings.max_buckets,
        });
        let ttl_ns = u64::from(settings.assignment_ttl_s) * NANOS_PER_SEC;
        Hub {
            global: Global::new(
                settings.global_domains.clone(),
                ttl_ns,
                settings.max_buckets,
            ),
            config: OnceLock::new(),
            remotes: Mutex::new(Remotes::new(settings.max_buckets)),
            settings,
            shares: Mutex::new(shares),
            streams: Mutex::new(HashMap::new()),
            next_stream: AtomicU64::new(1),
            seq: AtomicU64::new(first_seq()),
            epoch: tokio::time::Instant::now(),
            cluster,
            relay: Relay::default(),
        }
    }

    /// Where the RLS configuration the streams' buckets are matched against comes from
    /// (`--rls-config`, reloaded); a node without it serves no stream but still computes the
    /// shares of the buckets it owns.
    pub(crate) fn set_config(&self, current: impl Fn() -> Arc<RlsConfig> + Send + Sync + 'static) {
        let _ = self.config.set(ConfigSource(Box::new(current)));
    }

    /// Nanoseconds since the hub started: the allocator's clock (tokio's, so a test may pause
    /// it).
    pub(super) fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// The next rebalance number.
    pub(super) fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }

    pub(super) fn ttl_ns(&self) -> u64 {
        u64::from(self.settings.assignment_ttl_s) * NANOS_PER_SEC
    }

    /// Drops the shares whose assignments have expired, and the other nodes' Envoys left with
    /// none; run every second.
    pub(crate) fn expire(&self) {
        let now = self.now_ns();
        let mut shares = self.shares.lock();
        shares.expire(now);
        gauge!("floodgate_rlqs_buckets").set(shares.bucket_count() as f64);
        let mut remotes = self.remotes.lock();
        remotes.retain(|id| shares.holds_stream(id));
        gauge!("floodgate_rlqs_remote_envoys").set(remotes.len() as f64);
    }

    /// A new stream: its id, and the receiver its answers come out of.
    pub(crate) fn open_stream(
        &self,
    ) -> (
        StreamId,
        mpsc::Receiver<Result<RateLimitQuotaResponse, Status>>,
    ) {
        let (sender, receiver) = mpsc::channel(OUTBOUND_QUEUE);
        let stream = self.next_stream.fetch_add(1, Ordering::Relaxed);
        self.streams.lock().insert(
            stream,
            LocalStream {
                sender,
                held: HashMap::new(),
            },
        );
        gauge!("floodgate_rlqs_streams_open").increment(1.0);
        (stream, receiver)
    }

    /// The stream ended: its shares here stay reserved until they expire, and the owners its
    /// reports were relayed to are told.
    pub(crate) fn close_stream(&self, stream: StreamId) {
        self.streams.lock().remove(&stream);
        self.shares.lock().close(stream);
        self.relay.close(stream);
        gauge!("floodgate_rlqs_streams_open").decrement(1.0);
    }

    /// The owner of `key`'s slot when it is another node and every member of this region relays
    /// (protocol version 7); `None`: the shares are computed here. A relay goes to the owner in
    /// this region's table and no further, so another region's older build does not hold it
    /// back.
    fn owner_elsewhere(&self, key: &BucketKey) -> Option<String> {
        let cluster = self.cluster.as_ref()?;
        if !Feature::RlqsRelay.readable_at(cluster.members.region_version()) {
            return None;
        }
        let table = cluster.slots.table();
        let owner = table.owner(slot_of(&super::remote::slot_key(key)))?;
        (owner != cluster.members.me().id).then(|| owner.to_owned())
    }

    /// The tokens `stream` holds for `bucket` by the last assignment sent to it (0: none or
    /// expired).
    fn held(&self, stream: StreamId, bucket: &BucketKey, now_ns: u64) -> u32 {
        self.streams
            .lock()
            .get(&stream)
            .and_then(|s| s.held.get(bucket))
            .filter(|h| h.expires_ns > now_ns)
            .map_or(0, |h| h.tokens)
    }

    /// The allocator's answer to one report, each push stamped with the rebalance's number
    /// (taken under the allocator's lock, so numbers follow the order of rebalances).
    fn report(
        &self,
        now_ns: u64,
        stream: StreamId,
        key: &BucketKey,
        limit: Limit,
        used: Usage,
    ) -> Result<Vec<Stamped>, super::shares::Refused> {
        // A global bucket's Envoys split this region's part.
        let limit = self.regional_limit(now_ns, key, limit);
        let mut shares = self.shares.lock();
        let pushes = shares.report(now_ns, stream, key, limit, used)?;
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        Ok(pushes
            .into_iter()
            .map(|push| Stamped { seq, push })
            .collect())
    }

    /// A denial of `bucket` for `stream`, numbered as a rebalance.
    fn deny(&self, stream: StreamId, bucket: BucketKey) -> Stamped {
        Stamped {
            seq: self.seq.fetch_add(1, Ordering::Relaxed),
            push: Push {
                stream,
                bucket,
                assignment: Assignment::Deny,
            },
        }
    }

    /// One message of `stream`: every bucket's usage into the allocator here or queued for its
    /// owner, the answers out. An error ends the stream with that status.
    pub(crate) fn take(
        &self,
        stream: StreamId,
        domain: &mut Option<String>,
        reports: RateLimitQuotaUsageReports,
    ) -> Result<(), Status> {
        let config = self.config_for(domain, &reports)?;
        let mut pushes = Vec::new();
        let mut allow_all = Vec::new();
        let mut relayed = Vec::new();
        for usage in &reports.bucket_quota_usages {
            match self.plan(&config, &reports.domain, usage) {
                Planned::Ignored(reason) => {
                    counter!("floodgate_rlqs_ignored_total", "reason" => reason).increment(1);
                }
                Planned::Refused(id, reason) => {
                    counter!("floodgate_rlqs_ignored_total", "reason" => reason).increment(1);
                    pushes.push(self.deny(stream, key_of(&reports.domain, &id)));
                }
                Planned::AllowAll(id) => allow_all.push(id),
                Planned::Shared(key, limit, rule, used) => {
                    if let Some(relay) =
                        self.take_shared(stream, key, limit, &rule, used, &mut pushes)
                    {
                        relayed.push(relay);
                    }
                }
            }
        }
        if !relayed.is_empty() {
            let dropped = self.relay.enqueue(stream, relayed);
            if !dropped.is_empty() {
                counter!("floodgate_rlqs_relay_dropped_total").increment(dropped.len() as u64);
            }
        }
        // A report here can move the shares of Envoys on other nodes too.
        let elsewhere = self.send(Some((stream, allow_all)), pushes);
        self.push_to_nodes(elsewhere);
        Ok(())
    }

    /// The configuration a message is matched against, once the message is found fit: its
    /// domain not empty, the stream's own (the first message names it, in `domain`), in the
    /// configuration, and no more buckets than a stream may have.
    fn config_for(
        &self,
        domain: &mut Option<String>,
        reports: &RateLimitQuotaUsageReports,
    ) -> Result<Arc<RlsConfig>, Status> {
        if reports.domain.is_empty() {
            return Err(Status::invalid_argument(
                "the RLQS domain must not be empty",
            ));
        }
        match domain {
            Some(d) if *d != reports.domain => {
                return Err(Status::invalid_argument(format!(
                    "the stream's domain is `{d}`; a report for `{}` needs its own stream",
                    reports.domain
                )));
            }
            Some(_) => {}
            None => *domain = Some(reports.domain.clone()),
        }
        let Some(config) = self.config.get().map(|c| (c.0)()) else {
            return Err(Status::unavailable("this node has no --rls-config"));
        };
        if !config.has_domain(&reports.domain) {
            return Err(Status::not_found(format!(
                "the domain `{}` is in no file of --rls-config",
                reports.domain
            )));
        }
        if reports.bucket_quota_usages.len() > self.settings.max_buckets_per_stream {
            return Err(Status::invalid_argument(format!(
                "{} buckets in one report; the most is {}",
                reports.bucket_quota_usages.len(),
                self.settings.max_buckets_per_stream
            )));
        }
        Ok(config)
    }

    /// One shared bucket's usage by `stream` (what it holds added): the report for its owner
    /// when that is another node, else into the allocator here, its pushes (or a denial, when
    /// refused) added to `pushes`.
    fn take_shared(
        &self,
        stream: StreamId,
        key: BucketKey,
        limit: Limit,
        rule: &str,
        mut used: Usage,
        pushes: &mut Vec<Stamped>,
    ) -> Option<(String, WireRlqsReport)> {
        let now = self.now_ns();
        used.held = self.held(stream, &key, now);
        if let Some(owner) = self.owner_elsewhere(&key) {
            return Some((owner, super::remote::report(stream, &key, limit, used)));
        }
        match self.report(now, stream, &key, limit, used) {
            Ok(more) => {
                for stamped in &more {
                    record_share(rule, &stamped.push, limit);
                }
                pushes.extend(more);
            }
            Err(refused) => {
                tracing::debug!(%refused, "RLQS bucket refused");
                counter!("floodgate_rlqs_ignored_total", "reason" => refused.reason()).increment(1);
                pushes.push(self.deny(stream, key));
            }
        }
        None
    }

    /// Reports relayed by the node `from` for buckets this node owns: each of its Envoys is
    /// one more participant, the allocator's pushes go to whichever node streams to each
    /// Envoy; `from`'s own are returned (the answer), the others' sent one-way.
    pub(crate) fn take_relayed(
        &self,
        from: &str,
        batch: RlqsReportBatch,
    ) -> Vec<WireRlqsAssignment> {
        let now = self.now_ns();
        counter!("floodgate_rlqs_relayed_reports_total", "direction" => "received")
            .increment(batch.reports.len() as u64);
        let mut answer = Vec::new();
        let mut pushes = Vec::new();
        {
            let closed: Vec<StreamId> = {
                let remotes = self.remotes.lock();
                batch
                    .closed
                    .iter()
                    .filter_map(|s| remotes.lookup(from, *s))
                    .collect()
            };
            let mut shares = self.shares.lock();
            for id in closed {
                shares.close(id);
            }
        }
        for report in batch.reports {
            let key = super::remote::key_of_wire(&report.bucket);
            if self.owner_elsewhere(&key).is_some() {
                // Another node owns it by this node's table: left out of the answer, so the
                // sender tries that owner (two owners would each split the whole limit).
                counter!("floodgate_rlqs_ignored_total", "reason" => "not_owner").increment(1);
                continue;
            }
            let interned = self.remotes.lock().intern(from, report.stream, || {
                self.next_stream.fetch_add(1, Ordering::Relaxed)
            });
            let Some(id) = interned else {
                counter!("floodgate_rlqs_ignored_total", "reason" => "remote_envoys").increment(1);
                let seq = self.seq.fetch_add(1, Ordering::Relaxed);
                answer.push(super::remote::deny(report.stream, seq, report.bucket));
                continue;
            };
            let (limit, used) = super::remote::limit_and_usage(&report);
            match self.report(now, id, &key, limit, used) {
                Ok(more) => {
                    for stamped in &more {
                        record_share("relayed", &stamped.push, limit);
                    }
                    pushes.extend(more);
                }
                Err(refused) => {
                    counter!("floodgate_rlqs_ignored_total", "reason" => refused.reason())
                        .increment(1);
                    let seq = self.seq.fetch_add(1, Ordering::Relaxed);
                    answer.push(super::remote::deny(report.stream, seq, report.bucket));
                }
            }
        }
        let mut elsewhere = self.send(None, pushes);
        if let Some(own) = elsewhere.remove(from) {
            answer.extend(own);
        }
        self.push_to_nodes(elsewhere);
        answer
    }

    /// Reports a relay left unanswered, placed again by the table now: those of buckets this
    /// node owns now are taken here, the others batched for their owners (remembered, so a
    /// close reaches them too).
    pub(crate) fn reroute(
        &self,
        reports: Vec<WireRlqsReport>,
        max_bytes: usize,
    ) -> Vec<(String, RlqsReportBatch)> {
        let Some(cluster) = &self.cluster else {
            return Vec::new();
        };
        let again = Relay::default();
        let now = self.now_ns();
        let mut pushes = Vec::new();
        for report in reports {
            let key = super::remote::key_of_wire(&report.bucket);
            if let Some(owner) = self.owner_elsewhere(&key) {
                self.relay.remember(report.stream, &owner);
                again.enqueue(report.stream, vec![(owner, report)]);
                continue;
            }
            if !self.streams.lock().contains_key(&report.stream) {
                continue;
            }
            let (limit, used) = super::remote::limit_and_usage(&report);
            match self.report(now, report.stream, &key, limit, used) {
                Ok(more) => pushes.extend(more),
                Err(refused) => {
                    counter!("floodgate_rlqs_ignored_total", "reason" => refused.reason())
                        .increment(1);
                    pushes.push(self.deny(report.stream, key));
                }
            }
        }
        let elsewhere = self.send(None, pushes);
        self.push_to_nodes(elsewhere);
        again.take(&cluster.members.me().id, max_bytes)
    }

    /// Assignments for this node's streams from their buckets' owner `from`.
    pub(crate) fn deliver(&self, from: &str, assignments: Vec<WireRlqsAssignment>) {
        let pushes: Vec<Stamped> = assignments
            .into_iter()
            .filter_map(|a| {
                let assignment = match a.action {
                    RLQS_TOKEN_BUCKET => Assignment::TokenBucket {
                        max_tokens: 1,
                        tokens_per_fill: a.tokens_per_fill,
                        fill_interval_s: a.fill_interval_s,
                    },
                    RLQS_ABANDON => Assignment::Abandon,
                    RLQS_DENY => Assignment::Deny,
                    _ => return None,
                };
                Some(Stamped {
                    seq: a.seq,
                    push: Push {
                        stream: a.stream,
                        bucket: super::remote::key_of_wire(&a.bucket),
                        assignment,
                    },
                })
            })
            .collect();
        self.answer_local(None, pushes, Some(Arc::from(from)));
    }

    /// What becomes of one bucket's usage in a message of `domain`, by the rule its
    /// `BucketId` matches in `config`.
    fn plan(&self, config: &RlsConfig, domain: &str, usage: &BucketQuotaUsage) -> Planned {
        let Some(id) = usage.bucket_id.as_ref().filter(|id| !id.bucket.is_empty()) else {
            return Planned::Ignored("empty_bucket_id");
        };
        let bytes = id_bytes(id.bucket.iter());
        if id.bucket.len() > MAX_BUCKET_ENTRIES || bytes > self.settings.max_bucket_id_bytes {
            return Planned::Refused(id.clone(), "bucket_id_too_large");
        }
        let entries: Vec<(&str, &str)> = id
            .bucket
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let rule = config.find_unordered(domain, &entries);
        // No rule, an unlimited one or a shadow one: nothing to share, everything passes.
        let Some((rule, counted)) = rule
            .filter(|r| !r.shadow_mode)
            .and_then(|r| r.counted.clone().map(|c| (r, c)))
        else {
            return Planned::AllowAll(id.clone());
        };
        let key = key_of(domain, id);
        let limit = Limit {
            requests: u64::from(counted.requests_per_unit),
            period_s: (counted.unit.period_ns() / NANOS_PER_SEC).max(1),
        };
        let elapsed_ns = usage.time_elapsed.map_or(0, |d| {
            let seconds = u64::try_from(d.seconds).unwrap_or(0);
            let nanos = u64::try_from(d.nanos).unwrap_or(0);
            seconds.saturating_mul(NANOS_PER_SEC).saturating_add(nanos)
        });
        let used = Usage {
            allowed: usage.num_requests_allowed,
            denied: usage.num_requests_denied,
            elapsed_ns,
            held: 0,
        };
        Planned::Shared(key, limit, rule.display_name().to_owned(), used)
    }

    /// Sends the pushes of this node's streams (and `reporter`'s allow-alls); returns the
    /// others by the node their Envoy streams to.
    pub(super) fn send(
        &self,
        reporter: Option<(StreamId, Vec<BucketId>)>,
        pushes: Vec<Stamped>,
    ) -> BTreeMap<String, Vec<WireRlqsAssignment>> {
        let (local, elsewhere) = self.remotes.lock().split(pushes);
        self.answer_local(reporter, local, None);
        elsewhere
    }

    /// Sends each node its Envoys' new assignments, one-way (kind 22).
    pub(super) fn push_to_nodes(&self, by_node: BTreeMap<String, Vec<WireRlqsAssignment>>) {
        let Some(cluster) = &self.cluster else {
            return;
        };
        for (node, assignments) in by_node {
            let Some(addr) = cluster.members.addr_of(&node) else {
                counter!("floodgate_rlqs_dropped_answers_total")
                    .increment(assignments.len() as u64);
                continue;
            };
            counter!("floodgate_rlqs_relayed_assignments_total", "way" => "pushed")
                .increment(assignments.len() as u64);
            let frame = super::remote::assignments_frame(&cluster.members.me().id, assignments, 0);
            // Sent in the background; a push lost leaves the Envoy its last assignment.
            drop(cluster.peers.send(addr, frame));
        }
    }

    /// One answer per local stream: the reporter's allow-alls and every stream's pushes (made
    /// by `owner`, `None`: here), each recorded as what the stream holds; a push older than
    /// the one the stream last got from the same owner is dropped.
    fn answer_local(
        &self,
        reporter: Option<(StreamId, Vec<BucketId>)>,
        pushes: Vec<Stamped>,
        owner: Option<Arc<str>>,
    ) {
        let ttl = Some(PbDuration {
            seconds: i64::from(self.settings.assignment_ttl_s),
            nanos: 0,
        });
        let mut answers: Vec<(StreamId, RateLimitQuotaResponse)> = Vec::new();
        if let Some((stream, allow_all)) = reporter {
            add_allow_alls(&mut answers, stream, allow_all, ttl);
        }
        let now = self.now_ns();
        let mut streams = self.streams.lock();
        // Pushes come shrinks first; the answers keep that order.
        for Stamped { seq, push } in pushes {
            let Some(local) = streams.get_mut(&push.stream) else {
                counter!("floodgate_rlqs_dropped_answers_total").increment(1);
                continue;
            };
            if local.is_stale(&push.bucket, &owner, seq, now) {
                counter!("floodgate_rlqs_stale_assignments_total").increment(1);
                continue;
            }
            let held = Held {
                tokens: tokens_of(push.assignment),
                expires_ns: now.saturating_add(self.ttl_ns()),
                owner: owner.clone(),
                seq,
            };
            // Held ids are bounded in count; a refused one (over the size limit, answered with
            // a denial) is not held at all, so each held id is bounded in bytes too.
            if id_bytes(push.bucket.entries.iter().map(|(k, v)| (k, v)))
                <= self.settings.max_bucket_id_bytes
            {
                local.hold(&push.bucket, held, self.settings.max_buckets_per_stream);
            }
            let action = action_of(push.assignment, ttl);
            // A map compares equal whatever its order: the Envoy recognises its own BucketId.
            let bucket_id = BucketId {
                bucket: push.bucket.entries.into_iter().collect(),
            };
            add(
                &mut answers,
                push.stream,
                BucketAction {
                    bucket_id: Some(bucket_id),
                    bucket_action: Some(action),
                },
            );
        }
        send_answers(&streams, answers);
    }
}

impl LocalStream {
    /// Whether a push of rebalance `seq` by `owner` for `bucket` is older than the one this
    /// stream holds from the same owner, while that one still binds.
    fn is_stale(
        &self,
        bucket: &BucketKey,
        owner: &Option<Arc<str>>,
        seq: u64,
        now_ns: u64,
    ) -> bool {
        self.held
            .get(bucket)
            .is_some_and(|h| h.owner == *owner && h.seq > seq && h.expires_ns > now_ns)
    }

    /// Records `held` as what this stream holds for `bucket`; a new bucket past `max_buckets`
    /// is not recorded (its assignment is still sent).
    fn hold(&mut self, bucket: &BucketKey, held: Held, max_buckets: usize) {
        if self.held.len() < max_buckets || self.held.contains_key(bucket) {
            self.held.insert(bucket.clone(), held);
        }
    }
}

/// The tokens an assignment gives (0: not a token bucket).
fn tokens_of(assignment: Assignment) -> u32 {
    match assignment {
        Assignment::TokenBucket {
            tokens_per_fill, ..
        } => tokens_per_fill,
        _ => 0,
    }
}

/// An allow-all for `stream` of each bucket in `ids`, for `ttl`.
fn add_allow_alls(
    answers: &mut Vec<(StreamId, RateLimitQuotaResponse)>,
    stream: StreamId,
    ids: Vec<BucketId>,
    ttl: Option<PbDuration>,
) {
    for id in ids {
        add(
            answers,
            stream,
            BucketAction {
                bucket_id: Some(id),
                bucket_action: Some(blanket(ttl, BlanketRule::AllowAll)),
            },
        );
        counter!("floodgate_rlqs_assignments_total", "kind" => "allow_all").increment(1);
    }
}

/// What Envoy is told for `assignment`, bound for `ttl` (counted by kind).
fn action_of(assignment: Assignment, ttl: Option<PbDuration>) -> bucket_action::BucketAction {
    match assignment {
        Assignment::TokenBucket {
            max_tokens,
            tokens_per_fill,
            fill_interval_s,
        } => {
            counter!("floodgate_rlqs_assignments_total", "kind" => "token_bucket").increment(1);
            bucket_action::BucketAction::QuotaAssignmentAction(QuotaAssignmentAction {
                assignment_time_to_live: ttl,
                rate_limit_strategy: Some(RateLimitStrategy {
                    strategy: Some(Strategy::TokenBucket(TokenBucket {
                        max_tokens,
                        tokens_per_fill: Some(UInt32Value {
                            value: tokens_per_fill,
                        }),
                        fill_interval: Some(PbDuration {
                            seconds: i64::try_from(fill_interval_s).unwrap_or(i64::MAX),
                            nanos: 0,
                        }),
                    })),
                }),
            })
        }
        Assignment::Abandon => {
            counter!("floodgate_rlqs_assignments_total", "kind" => "abandon").increment(1);
            bucket_action::BucketAction::AbandonAction(AbandonAction {})
        }
        Assignment::Deny => {
            counter!("floodgate_rlqs_assignments_total", "kind" => "deny").increment(1);
            blanket(ttl, BlanketRule::DenyAll)
        }
    }
}

/// Each answer to its stream, if still open; one whose stream's queue is full is dropped (and
/// counted).
fn send_answers(
    streams: &HashMap<StreamId, LocalStream>,
    answers: Vec<(StreamId, RateLimitQuotaResponse)>,
) {
    for (stream, answer) in answers {
        let Some(local) = streams.get(&stream) else {
            continue;
        };
        if local.sender.try_send(Ok(answer)).is_err() {
            counter!("floodgate_rlqs_dropped_answers_total").increment(1);
        }
    }
}

/// The configuration in force, read again for every message (it is reloaded).
struct ConfigSource(Box<dyn Fn() -> Arc<RlsConfig> + Send + Sync>);

impl std::fmt::Debug for ConfigSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConfigSource")
    }
}

/// The first rebalance number: the wall clock's nanoseconds since 1970 (1 when it reads
/// earlier).
fn first_seq() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX / 2))
}

/// A blanket rule for `ttl`.
fn blanket(ttl: Option<PbDuration>, rule: BlanketRule) -> bucket_action::BucketAction {
    bucket_action::BucketAction::QuotaAssignmentAction(QuotaAssignmentAction {
        assignment_time_to_live: ttl,
        rate_limit_strategy: Some(RateLimitStrategy {
            strategy: Some(Strategy::BlanketRule(rule as i32)),
        }),
    })
}

/// The bytes of a bucket id's keys and values: what `max_bucket_id_bytes` bounds.
fn id_bytes<'a>(entries: impl Iterator<Item = (&'a String, &'a String)>) -> usize {
    entries.map(|(k, v)| k.len() + v.len()).sum()
}

/// A bucket: the domain and the `BucketId`'s entries, sorted by key.
fn key_of(domain: &str, id: &BucketId) -> BucketKey {
    let mut sorted: Vec<(String, String)> = id
        .bucket
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    sorted.sort_unstable();
    BucketKey {
        domain: domain.to_owned(),
        entries: sorted,
    }
}

/// Adds `action` to `stream`'s answer, the answers in the order their streams first appear.
fn add(
    answers: &mut Vec<(StreamId, RateLimitQuotaResponse)>,
    stream: StreamId,
    action: BucketAction,
) {
    match answers.iter_mut().find(|(s, _)| *s == stream) {
        Some((_, answer)) => answer.bucket_action.push(action),
        None => answers.push((
            stream,
            RateLimitQuotaResponse {
                bucket_action: vec![action],
            },
        )),
    }
}

/// One bucket of a message, planned (the reason, where one is named, is the metrics label).
enum Planned {
    /// Nothing to answer (no bucket id to name).
    Ignored(&'static str),
    /// Past a bound: denied (a production bucket must not pass unlimited for being refused).
    Refused(BucketId, &'static str),
    /// No rule, an unlimited one or a shadow one: every request passes.
    AllowAll(BucketId),
    /// Shared among the bucket's Envoys: the bucket, its rule's limit, the rule's name, and
    /// the usage reported.
    Shared(BucketKey, Limit, String, Usage),
}

/// The share of the limit each assignment gives, by rule (a bounded label set).
fn record_share(rule: &str, push: &Push, limit: Limit) {
    if let Assignment::TokenBucket {
        tokens_per_fill, ..
    } = push.assignment
    {
        let share = f64::from(tokens_per_fill) / (limit.requests.max(1) as f64);
        histogram!("floodgate_rlqs_share", "domain" => push.bucket.domain.clone(), "rule" => rule.to_owned())
            .record(share);
    }
}

/// The tonic service: every stream runs in its own task around the hub.
#[derive(Debug, Clone)]
pub(crate) struct RlqsService {
    pub(crate) hub: Arc<Hub>,
}

/// Removes the stream from the hub when its task ends, however it ends.
struct Registered {
    hub: Arc<Hub>,
    stream: StreamId,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.hub.close_stream(self.stream);
    }
}

#[tonic::async_trait]
impl RateLimitQuotaService for RlqsService {
    type StreamRateLimitQuotasStream = ReceiverStream<Result<RateLimitQuotaResponse, Status>>;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        let mut inbound = request.into_inner();
        let hub = self.hub.clone();
        let (stream, receiver) = hub.open_stream();
        let sender = hub.streams.lock().get(&stream).map(|s| s.sender.clone());
        let Some(sender) = sender else {
            return Err(Status::internal("the stream closed as it opened"));
        };
        let registered = Registered { hub, stream };
        tokio::spawn(async move {
            let registered = registered;
            let mut domain = None;
            // Ends when the Envoy closes its side, the answers can no longer be sent, or a
            // message is refused.
            loop {
                let message = tokio::select! {
                    message = inbound.message() => message,
                    _ = sender.closed() => break,
                };
                let reports = match message {
                    Ok(Some(reports)) => reports,
                    Ok(None) => break,
                    Err(status) => {
                        tracing::debug!(%status, "RLQS stream ended");
                        break;
                    }
                };
                if let Err(status) = registered.hub.take(stream, &mut domain, reports) {
                    counter!("floodgate_rlqs_refused_streams_total", "code" => format!("{:?}", status.code()))
                        .increment(1);
                    let _ = sender.send(Err(status)).await;
                    break;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(receiver)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const CONFIG: &str = "\
domain: edge
descriptors:
  - key: name
    value: minute
    rate_limit: {unit: minute, requests_per_unit: 600}
";

    fn minute() -> BucketId {
        BucketId {
            bucket: [("name".to_owned(), "minute".to_owned())]
                .into_iter()
                .collect(),
        }
    }

    fn report(allowed: u64, elapsed_s: i64) -> RateLimitQuotaUsageReports {
        RateLimitQuotaUsageReports {
            domain: "edge".to_owned(),
            bucket_quota_usages: vec![BucketQuotaUsage {
                bucket_id: Some(minute()),
                time_elapsed: Some(PbDuration {
                    seconds: elapsed_s,
                    nanos: 0,
                }),
                num_requests_allowed: allowed,
                num_requests_denied: 0,
            }],
        }
    }

    /// The last `tokens_per_fill` among the answers waiting for a stream.
    fn last_tokens(answers: &mut mpsc::Receiver<Result<RateLimitQuotaResponse, Status>>) -> u32 {
        let mut last = 0;
        while let Ok(answer) = answers.try_recv() {
            for action in answer.unwrap().bucket_action {
                if let Some(bucket_action::BucketAction::QuotaAssignmentAction(q)) =
                    action.bucket_action
                    && let Some(Strategy::TokenBucket(t)) =
                        q.rate_limit_strategy.and_then(|s| s.strategy)
                {
                    last = t.tokens_per_fill.map_or(0, |v| v.value);
                }
            }
        }
        last
    }

    /// The running node's expiry task on tokio's paused clock: a closed Envoy's share stays
    /// reserved for its time to live (15 s) and the one-second margin, then the task drops it
    /// and the other Envoy's next report gets the whole limit; once that one is silent as
    /// long, the bucket is gone. No wall clock: the runtime's clock moves only when all tasks
    /// wait.
    #[tokio::test(start_paused = true)]
    async fn the_expiry_task_returns_a_closed_envoys_share_after_its_time_to_live() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.yaml");
        std::fs::write(&file, CONFIG).unwrap();
        let hub = Arc::new(Hub::new(
            RlqsSettings::new("127.0.0.1:0".parse().unwrap()),
            None,
        ));
        let handle = crate::rls::RlsConfigHandle::load(&file).unwrap();
        hub.set_config(move || handle.current());
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(super::super::expire_every_second(hub.clone(), stopped));
        let (one, mut one_answers) = hub.open_stream();
        let (two, mut two_answers) = hub.open_stream();
        let (mut d1, mut d2) = (None, None);
        hub.take(one, &mut d1, report(1, 0)).unwrap();
        hub.take(two, &mut d2, report(1, 0)).unwrap();
        let first = last_tokens(&mut one_answers);
        let second = last_tokens(&mut two_answers);
        assert_eq!(first + second, 598);
        hub.close_stream(one);
        let key = key_of("edge", &minute());
        let envoys = |hub: &Hub| hub.shares.lock().envoys(&key);

        // 10 s on, the closed Envoy may still enforce its assignment: reserved.
        tokio::time::sleep(Duration::from_secs(10)).await;
        hub.take(two, &mut d2, report(50, 5)).unwrap();
        assert_eq!(last_tokens(&mut two_answers), second);
        assert_eq!(envoys(&hub), 2);

        // Past 15 s and the margin, the task has dropped it; the next report gets it all.
        tokio::time::sleep(Duration::from_secs(7)).await;
        assert_eq!(envoys(&hub), 1);
        hub.take(two, &mut d2, report(50, 5)).unwrap();
        assert_eq!(last_tokens(&mut two_answers), 599);

        // Silent for as long, the last Envoy's share expires too: nothing is kept.
        tokio::time::sleep(Duration::from_secs(17)).await;
        assert_eq!(hub.shares.lock().bucket_count(), 0);
        stop.send(true).unwrap();
        task.await.unwrap();
    }

    /// An owner's answer and its one-way pushes may arrive in either order: an assignment of
    /// an earlier rebalance than the one a stream last got from the same owner is not sent; a
    /// new owner's is.
    #[test]
    fn an_earlier_rebalances_assignment_arriving_late_is_not_sent() {
        let hub = Hub::new(RlqsSettings::new("127.0.0.1:0".parse().unwrap()), None);
        let (stream, mut answers) = hub.open_stream();
        let assignment = |seq: u64, tokens: u32| WireRlqsAssignment {
            stream,
            seq,
            bucket: super::super::remote::wire_bucket(&key_of("edge", &minute())),
            action: RLQS_TOKEN_BUCKET,
            tokens_per_fill: tokens,
            fill_interval_s: 60,
        };
        hub.deliver("node-1", vec![assignment(10, 50)]);
        hub.deliver("node-1", vec![assignment(9, 70)]);
        assert_eq!(last_tokens(&mut answers), 50);
        hub.deliver("node-2", vec![assignment(1, 30)]);
        assert_eq!(last_tokens(&mut answers), 30, "another owner's count");
    }

    /// What a stream holds is bounded: at most `max_buckets_per_stream` buckets (a later one's
    /// assignment is sent, not held), and none whose id passes `max_bucket_id_bytes`.
    #[test]
    fn a_stream_holds_at_most_its_bucket_cap_and_no_oversized_id() {
        let mut settings = RlqsSettings::new("127.0.0.1:0".parse().unwrap());
        settings.max_buckets_per_stream = 2;
        settings.max_bucket_id_bytes = 32;
        let hub = Hub::new(settings, None);
        let (stream, mut answers) = hub.open_stream();
        let assignment = |name: &str| WireRlqsAssignment {
            stream,
            seq: 1,
            bucket: super::super::remote::wire_bucket(&BucketKey {
                domain: "edge".to_owned(),
                entries: vec![("name".to_owned(), name.to_owned())],
            }),
            action: RLQS_TOKEN_BUCKET,
            tokens_per_fill: 10,
            fill_interval_s: 60,
        };
        let held = |hub: &Hub| hub.streams.lock()[&stream].held.len();
        hub.deliver("node-1", vec![assignment(&"x".repeat(40))]);
        assert_eq!(held(&hub), 0, "an id over 32 bytes is not held");
        hub.deliver("node-1", vec![assignment("a"), assignment("b")]);
        assert_eq!(held(&hub), 2);
        hub.deliver("node-1", vec![assignment("c")]);
        assert_eq!(held(&hub), 2, "a third bucket is not held");
        // Every assignment was still sent.
        let mut sent = 0;
        while let Ok(answer) = answers.try_recv() {
            sent += answer.unwrap().bucket_action.len();
        }
        assert_eq!(sent, 4);
    }
}
