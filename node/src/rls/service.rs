//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`: the request (read in place,
//! `request`) into the core's plan, the cluster's decisions back into the proto response.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    DescriptorStatus, RateLimit,
};
use envoy_types::pb::google::protobuf::{self as pbuf, value::Kind};
use floodgate::NANOS_PER_SEC;
use floodgate::rls::{
    DescriptorAnswer, PlanOptions, Planned, StatusCode, answer_descriptor, overall_code,
    plan_request, ratelimit_headers, read_request,
};
use tonic::Status;

use super::config_file::RlsConfigHandle;
use super::counts::{Outcome, RlsMetrics};
use super::decide::{Undecided, decide};
use crate::budget::{BufferBudget, Reservation};
use crate::front_batch::FrontContext;

/// The service: what the fronts share (the node's configuration, the buffer budget, the check
/// path), the configuration in force, the header flag, and what descriptors may ask for
/// (negative hits), and its metrics.
#[derive(Debug)]
pub(crate) struct RlsService {
    pub(crate) front: Arc<FrontContext>,
    pub(crate) config: Arc<RlsConfigHandle>,
    pub(crate) rate_limit_headers: bool,
    pub(crate) plan: PlanOptions,
    pub(crate) metrics: RlsMetrics,
}

impl super::http2::RateLimiter for RlsService {
    async fn should_rate_limit(&self, message: Bytes) -> Result<RateLimitResponse, Status> {
        let started = Instant::now();
        // The message is held until it is answered (the request read from it borrows it): it
        // counts in the node's buffer budget beside the QUIC streams', so neither front can
        // starve the other.
        let _held = reserve_call(&self.front.budget, message.len()).inspect_err(|_| {
            self.metrics.over_budget.increment(1);
        })?;
        let result = self.answer(&message).await;
        self.metrics
            .request_seconds
            .record(started.elapsed().as_secs_f64());
        result
    }
}

/// Reserves a call's `bytes` from `budget` for as long as the call is answered, or refuses it
/// with `RESOURCE_EXHAUSTED` (Envoy applies its `failure_mode_deny` setting).
fn reserve_call(budget: &BufferBudget, bytes: usize) -> Result<Reservation<'_>, Status> {
    let mut held = budget.reservation();
    if held.resize(bytes, false).is_err() {
        return Err(Status::resource_exhausted(format!(
            "the node is buffering too much for all its callers (--max-buffered-bytes {}): \
             retry later",
            budget.limit()
        )));
    }
    Ok(held)
}

impl RlsService {
    async fn answer(&self, message: &[u8]) -> Result<RateLimitResponse, Status> {
        let request = read_request(message, self.front.config.limits.max_batch)
            .map_err(|unread| Status::invalid_argument(unread.to_string()))?;
        let config = self.config.current();
        let plans = plan_request(
            &config,
            request.domain,
            &request.descriptors,
            u64::from(request.hits_addend),
            self.plan,
        );
        // Any descriptor that cannot be decided refuses the whole request before a bucket is
        // touched (as envoyproxy/ratelimit answers a request it cannot serve: a gRPC error),
        // naming the descriptor and why.
        if let Some((i, why)) = plans.iter().enumerate().find_map(|(i, p)| match p {
            Planned::Invalid(why) => Some((i, why)),
            _ => None,
        }) {
            return Err(Status::invalid_argument(format!("descriptor {i}: {why}")));
        }
        let decisions = decide(&self.front, &plans)
            .await
            .map_err(|Undecided(e)| Status::unavailable(format!("not decided: {e}")))?;
        let answers: Vec<DescriptorAnswer> = plans
            .iter()
            .zip(&decisions)
            .map(|(plan, decision)| answer_descriptor(plan, decision.as_ref()))
            .collect();
        let overall = overall_code(&answers);
        self.record_metrics(request.domain, &answers, overall);
        let mut response = RateLimitResponse {
            overall_code: overall as i32,
            statuses: answers.iter().map(status_of).collect(),
            ..Default::default()
        };
        if self.rate_limit_headers
            && let Some((policy, state)) = ratelimit_headers(&answers)
        {
            response.response_headers_to_add = vec![
                header("RateLimit-Policy", policy),
                header("RateLimit", state),
            ];
        }
        if overall == StatusCode::OverLimit {
            response.dynamic_metadata = Some(denied_metadata(&answers));
        }
        Ok(response)
    }
}

fn status_of(answer: &DescriptorAnswer) -> DescriptorStatus {
    let mut status = DescriptorStatus {
        code: answer.code as i32,
        ..Default::default()
    };
    if let (Some(rule), Some((requests_per_unit, unit))) = (&answer.rule, answer.limit) {
        status.current_limit = Some(RateLimit {
            name: rule.name.clone().unwrap_or_default(),
            requests_per_unit,
            unit: unit as i32,
        });
        status.limit_remaining = answer.remaining;
        status.duration_until_reset = Some(pbuf::Duration {
            seconds: i64::try_from(answer.reset_after_ns / NANOS_PER_SEC).unwrap_or(i64::MAX),
            nanos: (answer.reset_after_ns % NANOS_PER_SEC) as i32,
        });
    }
    status
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.to_owned(),
        value,
        ..Default::default()
    }
}

/// `denied_by`: the first rule over its limit; `denied_rules`: all of them (envoyproxy/ratelimit
/// names none, so a 429 cannot be traced to its rule).
fn denied_metadata(answers: &[DescriptorAnswer]) -> pbuf::Struct {
    let denied: Vec<String> = answers
        .iter()
        .filter(|a| a.code == StatusCode::OverLimit)
        .filter_map(|a| a.rule.as_ref().map(|r| r.display_name().to_owned()))
        .collect();
    let string = |s: String| pbuf::Value {
        kind: Some(Kind::StringValue(s)),
    };
    let mut fields = HashMap::new();
    if let Some(first) = denied.first() {
        fields.insert("denied_by".to_owned(), string(first.clone()));
    }
    fields.insert(
        "denied_rules".to_owned(),
        pbuf::Value {
            kind: Some(Kind::ListValue(pbuf::ListValue {
                values: denied.into_iter().map(string).collect(),
            })),
        },
    );
    pbuf::Struct { fields }
}

impl RlsService {
    /// Per domain and rule: allowed, denied, shadow_denied (over, but in shadow mode), refunded
    /// (allowed, then given back because another descriptor denied the request). Only
    /// descriptors a configured rule counted are labelled, so the label set is bounded by the
    /// configuration.
    fn record_metrics(&self, domain: &str, answers: &[DescriptorAnswer], overall: StatusCode) {
        for answer in answers {
            let (Some(rule), Some(_)) = (&answer.rule, answer.limit) else {
                continue;
            };
            let outcome = Outcome::of(answer.code, answer.shadow_denied, overall);
            self.metrics
                .descriptor(domain, rule.display_name(), outcome);
        }
    }
}

#[cfg(test)]
mod tests {
    use floodgate::rls::{DescriptorRequest, RlsConfig};

    use super::*;
    use crate::alloc_counter::allocations_during;

    #[test]
    fn planning_allocates_the_plans_and_one_key_per_counted_descriptor_only() {
        // Every descriptor Envoy sends is planned: its rule is found and its bucket keyed
        // without allocating per entry (the key is the one allocation a counted descriptor
        // needs; the request's plans and their rules are the other two).
        let config = RlsConfig::from_files([(
            "d.yaml",
            "domain: d\ndescriptors:\n  - key: api_key\n    descriptors:\n      - key: path\n        value: api*\n        rate_limit: {unit: second, requests_per_unit: 5}\n",
        )])
        .unwrap();
        let keys = ["k0", "k1", "k2"];
        let descriptor = |key| DescriptorRequest {
            entries: vec![("api_key", key), ("path", "api/v1/items")],
            ..Default::default()
        };
        for count in [1, 3] {
            let descriptors: Vec<_> = keys[..count].iter().map(|&k| descriptor(k)).collect();
            let (plans, allocations) = allocations_during(|| {
                plan_request(&config, "d", &descriptors, 0, PlanOptions::default())
            });
            assert!(plans.iter().all(|p| matches!(p, Planned::Check { .. })));
            assert_eq!(allocations, 2 + count as u64, "{count} descriptors");
        }
    }

    #[test]
    fn a_call_is_held_in_the_buffer_budget_and_refused_when_it_is_spent() {
        let budget = BufferBudget::new(10_000);
        let first = reserve_call(&budget, 6_000).unwrap();
        assert_eq!(budget.used(), 6_000);
        let refused = reserve_call(&budget, 6_000).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(refused.message().contains("--max-buffered-bytes 10000"));
        assert_eq!(budget.used(), 6_000, "a refused call holds nothing");
        drop(first);
        assert_eq!(budget.used(), 0, "an answered call gives its bytes back");
        assert!(reserve_call(&budget, 6_000).is_ok());
    }
}
