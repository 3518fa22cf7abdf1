//! `envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas`: each
//! stream's reports into the allocator, its pushes back out as `BucketAction`s. Every stream
//! task holds a sender in the hub, so a report on one stream can push a smaller share to the
//! others at once.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

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
use floodgate::rls::RlsConfig;
use metrics::{counter, gauge, histogram};
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::shares::{Assignment, BucketKey, Limit, Push, Shares, SharesConfig, StreamId, Usage};
use crate::config::RlqsSettings;
use crate::rls::RlsConfigHandle;

/// Most entries in one `BucketId` (Envoy's bucket builders make a handful).
pub const MAX_BUCKET_ENTRIES: usize = 64;
/// Answers waiting to be written to one Envoy; past it, pushes to that Envoy are dropped (and
/// counted): its previous assignment stays until it expires or the next report renews it.
const OUTBOUND_QUEUE: usize = 64;

type Outbound = mpsc::Sender<Result<RateLimitQuotaResponse, Status>>;

/// What every stream shares: the configuration, the allocator and the streams' senders.
#[derive(Debug)]
pub(crate) struct Hub {
    config: Arc<RlsConfigHandle>,
    settings: RlqsSettings,
    shares: Mutex<Shares>,
    streams: Mutex<HashMap<StreamId, Outbound>>,
    next_stream: AtomicU64,
    epoch: Instant,
}

impl Hub {
    pub(crate) fn new(config: Arc<RlsConfigHandle>, settings: RlqsSettings) -> Hub {
        let shares = Shares::new(SharesConfig {
            ttl_ns: u64::from(settings.assignment_ttl_s) * NANOS_PER_SEC,
            idle_reports_before_abandon: settings.idle_reports_before_abandon,
            max_envoys_per_bucket: settings.max_envoys_per_bucket,
            max_buckets_per_stream: settings.max_buckets_per_stream,
            max_buckets: settings.max_buckets,
        });
        Hub {
            config,
            settings,
            shares: Mutex::new(shares),
            streams: Mutex::new(HashMap::new()),
            next_stream: AtomicU64::new(1),
            epoch: Instant::now(),
        }
    }

    /// Nanoseconds since the hub started: the allocator's clock.
    fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Drops the shares whose assignments have expired; run every second.
    pub(crate) fn expire(&self) {
        let now = self.now_ns();
        let mut shares = self.shares.lock();
        shares.expire(now);
        gauge!("floodgate_rlqs_buckets").set(shares.bucket_count() as f64);
    }

    /// One message of `stream`: every bucket's usage into the allocator, the answers out. An
    /// error ends the stream with that status.
    fn take(
        &self,
        stream: StreamId,
        domain: &mut Option<String>,
        reports: RateLimitQuotaUsageReports,
    ) -> Result<(), Status> {
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
        let config = self.config.current();
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
        let mut pushes = Vec::new();
        let mut allow_all = Vec::new();
        for usage in &reports.bucket_quota_usages {
            match self.plan(&config, &reports.domain, usage) {
                Planned::Ignored(reason) => {
                    counter!("floodgate_rlqs_ignored_total", "reason" => reason).increment(1);
                }
                Planned::AllowAll(id) => allow_all.push(id),
                Planned::Shared(key, limit, rule, used) => {
                    let now = self.now_ns();
                    let result = self.shares.lock().report(now, stream, &key, limit, used);
                    match result {
                        Ok(more) => {
                            for push in &more {
                                record_share(&rule, push, limit);
                            }
                            pushes.extend(more);
                        }
                        Err(refused) => {
                            tracing::debug!(%refused, "RLQS bucket refused");
                            counter!("floodgate_rlqs_ignored_total", "reason" => refused.reason())
                                .increment(1);
                        }
                    }
                }
            }
        }
        self.send(stream, pushes, allow_all);
        Ok(())
    }

    fn plan(&self, config: &RlsConfig, domain: &str, usage: &BucketQuotaUsage) -> Planned {
        let Some(id) = usage.bucket_id.as_ref().filter(|id| !id.bucket.is_empty()) else {
            return Planned::Ignored("empty_bucket_id");
        };
        let bytes: usize = id.bucket.iter().map(|(k, v)| k.len() + v.len()).sum();
        if id.bucket.len() > MAX_BUCKET_ENTRIES || bytes > self.settings.max_bucket_id_bytes {
            return Planned::Ignored("bucket_id_too_large");
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
        let mut sorted: Vec<(String, String)> = id
            .bucket
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        sorted.sort_unstable();
        let key = BucketKey {
            domain: domain.to_owned(),
            entries: sorted,
        };
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
        };
        Planned::Shared(key, limit, rule.display_name().to_owned(), used)
    }

    /// One answer per stream: the reporter's allow-alls and every stream's pushes.
    fn send(&self, reporter: StreamId, pushes: Vec<Push>, allow_all: Vec<BucketId>) {
        let ttl = Some(PbDuration {
            seconds: i64::from(self.settings.assignment_ttl_s),
            nanos: 0,
        });
        let mut answers: Vec<(StreamId, RateLimitQuotaResponse)> = Vec::new();
        for id in allow_all {
            add(
                &mut answers,
                reporter,
                BucketAction {
                    bucket_id: Some(id),
                    bucket_action: Some(bucket_action::BucketAction::QuotaAssignmentAction(
                        QuotaAssignmentAction {
                            assignment_time_to_live: ttl,
                            rate_limit_strategy: Some(RateLimitStrategy {
                                strategy: Some(Strategy::BlanketRule(BlanketRule::AllowAll as i32)),
                            }),
                        },
                    )),
                },
            );
            counter!("floodgate_rlqs_assignments_total", "kind" => "allow_all").increment(1);
        }
        // Pushes come shrinks first; the answers keep that order.
        for push in pushes {
            let action = match push.assignment {
                Assignment::TokenBucket {
                    max_tokens,
                    tokens_per_fill,
                    fill_interval_s,
                } => {
                    counter!("floodgate_rlqs_assignments_total", "kind" => "token_bucket")
                        .increment(1);
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
            };
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
        let streams = self.streams.lock();
        for (stream, answer) in answers {
            let Some(sender) = streams.get(&stream) else {
                continue;
            };
            if sender.try_send(Ok(answer)).is_err() {
                counter!("floodgate_rlqs_dropped_answers_total").increment(1);
            }
        }
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

enum Planned {
    Ignored(&'static str),
    AllowAll(BucketId),
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
        self.hub.streams.lock().remove(&self.stream);
        self.hub.shares.lock().close(self.stream);
        gauge!("floodgate_rlqs_streams_open").decrement(1.0);
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
        let (sender, receiver) = mpsc::channel(OUTBOUND_QUEUE);
        let hub = self.hub.clone();
        let stream = hub.next_stream.fetch_add(1, Ordering::Relaxed);
        hub.streams.lock().insert(stream, sender.clone());
        gauge!("floodgate_rlqs_streams_open").increment(1.0);
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
