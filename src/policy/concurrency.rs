//! Concurrency rules: `concurrency: N` (with `ttl:`) limits the requests a rule matches to N in
//! flight at once, per key, through leases; parsing, planning and the `429`/`503` answer.
//!
//! A concurrency rule counts requests in flight, not a rate: it has no `limit`, `burst`,
//! `algorithm`, `plans`, `default_plan`, `cost` or `max_wait`, and its scope is its region. Its
//! keys are built like a rate rule's (`rule ␟ part:value ...`), so it never shares a key with
//! another rule. A refused request gets the same answer a rate limit gives: `429` with
//! `Retry-After` (the time until the earliest lease expires, in whole seconds rounded up, at
//! least 1) and a problem body; a fail-closed rule the limiter could not answer gets `503`.

use std::fmt::Write as _;
use std::sync::Arc;

use super::engine::{RequestAttributes, build_key};
use super::error::PolicyError;
use super::http::{
    CONTENT_TYPE, HttpResponse, PROBLEM_JSON, QUOTA_EXCEEDED, RETRY_AFTER,
    TEMPORARY_REDUCED_CAPACITY, seconds_ceil,
};
use super::json;
use super::pattern::{joined_path, normalize_path};
use super::rules::{FailureMode, Mode, Policy};
use super::verdict::UNAVAILABLE_RETRY_AFTER_NS;
use super::yaml::{self, Fields, error_at};
use crate::lease::LeaseLimit;
use crate::parse_duration_ns;

/// A concurrency rule's TTL when the file does not say: long enough for a slow request, short
/// enough that a gateway that crashes holding leases gives them back within a minute.
pub const DEFAULT_LEASE_TTL_NS: u64 = 60 * crate::NANOS_PER_SEC;

/// Fields a concurrency rule may not have, and why, for the error message.
const RATE_ONLY_FIELDS: &[&str] = &[
    "limit",
    "burst",
    "algorithm",
    "plans",
    "default_plan",
    "cost",
    "max_wait",
    "lease_above",
    "cost_from",
];

/// Reads a rule's `concurrency` and `ttl` fields; `None` for a rate rule.
pub(super) fn parse_concurrency(
    fields: &Fields<'_, '_>,
) -> Result<Option<LeaseLimit>, PolicyError> {
    let Some(node) = fields.get("concurrency") else {
        if let Some(ttl) = fields.get("ttl") {
            return Err(error_at(
                ttl,
                "`ttl` belongs to a concurrency rule: add `concurrency: N` beside it",
            ));
        }
        return Ok(None);
    };
    for field in RATE_ONLY_FIELDS {
        if let Some(other) = fields.get(field) {
            return Err(error_at(
                other,
                format!(
                    "a concurrency rule has no `{field}`: it limits requests in flight, not a \
                     rate (make a second rule for a rate limit)"
                ),
            ));
        }
    }
    if let Some(scope) = fields.get("scope")
        && yaml::string(scope, "`scope`")? != "region"
    {
        return Err(error_at(
            scope,
            "a concurrency rule is decided in its region: its scope can only be `region`",
        ));
    }
    let max = yaml::unsigned(node, "`concurrency` (how many requests at once)")?;
    let ttl_ns = match fields.get("ttl") {
        Some(ttl) => {
            let text = yaml::string(ttl, "`ttl` (a duration like `30s`)")?;
            parse_duration_ns(text).map_err(|e| error_at(ttl, e.to_string()))?
        }
        None => DEFAULT_LEASE_TTL_NS,
    };
    LeaseLimit::new(max, ttl_ns).map(Some).map_err(|e| {
        let at = match e {
            crate::lease::LeaseLimitError::Ttl(_) => fields.get("ttl").unwrap_or(node),
            crate::lease::LeaseLimitError::Max(_) => node,
        };
        error_at(at, e.to_string())
    })
}

/// One lease a request needs: on which key, under which limit, and how to treat the answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedLease {
    pub rule: Arc<str>,
    /// The key on the node: `rule ␟ part:value ␟ ...`, as for checks.
    pub key: Vec<u8>,
    pub limit: LeaseLimit,
    pub failure_mode: FailureMode,
    /// Shadow rules take leases and report refusals, but never refuse the request.
    pub shadow: bool,
}

/// What became of one planned lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseOutcome {
    Granted,
    /// All `max` held: the earliest expires in `retry_after_ns`.
    Refused {
        in_use: u64,
        retry_after_ns: u64,
    },
    /// The limiter did not answer.
    Unreachable,
}

impl Policy {
    /// One lease per concurrency rule that applies to the request, in rule order (a rule keyed
    /// by an attribute the request lacks does not apply, as for rate rules).
    pub fn leases_for(&self, attrs: &RequestAttributes<'_>) -> Vec<PlannedLease> {
        self.leases_for_class(attrs, self.priority_of(attrs, None))
    }

    /// [`Policy::leases_for`] for a request of `class`: a rule that keeps places for classes
    /// above it asks with the places `class` is allowed.
    pub fn leases_for_class(
        &self,
        attrs: &RequestAttributes<'_>,
        class: crate::priority::Priority,
    ) -> Vec<PlannedLease> {
        if !self.rules.iter().any(|r| r.concurrency.is_some()) {
            return Vec::new();
        }
        let segments = normalize_path(attrs.path);
        let plan = self.resolve_plan(attrs);
        let path = joined_path(&segments);
        let mut leases = Vec::new();
        for rule in &self.rules {
            let Some(limit) = rule.concurrency else {
                continue;
            };
            let method_ok = rule.methods.is_empty()
                || rule
                    .methods
                    .iter()
                    .any(|m| m.eq_ignore_ascii_case(attrs.method));
            if !method_ok || !rule.path.matches(&segments) {
                continue;
            }
            let Some(key) = build_key(rule, attrs, plan, &path) else {
                continue;
            };
            leases.push(PlannedLease {
                rule: Arc::clone(&rule.name),
                key,
                limit: rule.lease_limit_for_class(limit, class),
                failure_mode: rule.failure_mode,
                shadow: rule.mode == Mode::Shadow,
            });
        }
        leases
    }
}

/// The answer for a request whose leases came out as `outcomes` (one per planned lease):
/// `None` when it passes; else `429` (an enforced rule refused: `Retry-After` is the longest
/// of their retries) or `503` (an enforced fail-closed rule was not answered).
pub fn lease_refusal(planned: &[PlannedLease], outcomes: &[LeaseOutcome]) -> Option<HttpResponse> {
    let mut refused: Vec<(&str, u64)> = Vec::new();
    let mut unavailable: Vec<&str> = Vec::new();
    for (lease, outcome) in planned.iter().zip(outcomes) {
        if lease.shadow {
            continue;
        }
        match *outcome {
            LeaseOutcome::Refused { retry_after_ns, .. } => {
                refused.push((&lease.rule, seconds_ceil(retry_after_ns).max(1)));
            }
            LeaseOutcome::Unreachable if lease.failure_mode == FailureMode::Closed => {
                unavailable.push(&lease.rule);
            }
            _ => {}
        }
    }
    let (status, culprits) = if !refused.is_empty() {
        (429, refused)
    } else if !unavailable.is_empty() {
        let retry = seconds_ceil(UNAVAILABLE_RETRY_AFTER_NS).max(1);
        (503, unavailable.into_iter().map(|r| (r, retry)).collect())
    } else {
        return None;
    };
    let retry_after = culprits.iter().map(|(_, s)| *s).max().unwrap_or(1);
    Some(HttpResponse {
        status,
        headers: vec![
            (RETRY_AFTER, retry_after.to_string()),
            (CONTENT_TYPE, PROBLEM_JSON.to_owned()),
        ],
        body: Some(problem(status, &culprits, retry_after)),
    })
}

/// The problem body, shaped as a rate limit's (`violated-policies`, `violations`).
fn problem(status: u16, culprits: &[(&str, u64)], retry_after: u64) -> String {
    let quoted = culprits
        .iter()
        .map(|(n, _)| format!("\"{n}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let (kind, title, detail) = if status == 503 {
        (
            TEMPORARY_REDUCED_CAPACITY,
            "Service Unavailable",
            format!(
                "The rate limiter is unreachable and {quoted} fails closed; retry after {retry_after} s."
            ),
        )
    } else {
        (
            QUOTA_EXCEEDED,
            "Too Many Requests",
            format!(
                "Concurrency limit reached for {quoted}: as many requests as it allows are in \
                 flight; retry after {retry_after} s."
            ),
        )
    };
    let mut body = String::with_capacity(256);
    body.push_str("{\"type\":");
    json::push_string(&mut body, kind);
    body.push_str(",\"title\":");
    json::push_string(&mut body, title);
    let _ = write!(body, ",\"status\":{status},\"detail\":");
    json::push_string(&mut body, &detail);
    let names: Vec<String> = culprits.iter().map(|(n, _)| json::string(n)).collect();
    let _ = write!(body, ",\"violated-policies\":[{}]", names.join(","));
    body.push_str(",\"violations\":[");
    for (i, (name, retry)) in culprits.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        body.push_str("{\"policy\":");
        json::push_string(&mut body, name);
        let _ = write!(body, ",\"retry_after\":{retry}}}");
    }
    body.push_str("]}");
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: &str = "
rules:
  - name: exports
    method: POST
    path: /v1/exports
    key: tenant
    concurrency: 3
    ttl: 30s
  - name: reports
    path: /v1/reports/**
    key: global
    concurrency: 1
    failure_mode: closed
  - name: api
    path: /v1/**
    key: tenant
    limit: 10/s
";

    fn attrs<'a>(method: &'a str, path: &'a str) -> RequestAttributes<'a> {
        RequestAttributes {
            method,
            path,
            tenant: Some("acme"),
            ..RequestAttributes::default()
        }
    }

    #[test]
    fn concurrency_rules_plan_leases_and_no_checks() {
        let policy = Policy::from_yaml(RULES).unwrap();
        let leases = policy.leases_for(&attrs("POST", "/v1/exports"));
        assert_eq!(leases.len(), 1);
        assert_eq!(leases[0].key, b"exports\x1ftenant:acme".to_vec());
        assert_eq!(leases[0].limit.max(), 3);
        assert_eq!(leases[0].limit.ttl_ns(), 30 * crate::NANOS_PER_SEC);
        // The rate rule still plans its check; the concurrency rule plans none.
        let checks = policy.checks_for(&attrs("POST", "/v1/exports"));
        assert_eq!(checks.len(), 1);
        assert_eq!(&*checks[0].rule, "api");
        assert!(policy.leases_for(&attrs("GET", "/v1/exports")).is_empty());
        let reports = policy.leases_for(&attrs("GET", "/v1/reports/7"));
        assert_eq!(reports[0].limit.ttl_ns(), DEFAULT_LEASE_TTL_NS);
        assert!(
            policy
                .rule("exports")
                .unwrap()
                .describe()
                .contains("at most 3 at once")
        );
    }

    #[test]
    fn bad_concurrency_rules_name_the_field() {
        let error = |rule: &str| {
            let text = format!("rules:\n  - name: r\n    path: /x\n    key: global\n{rule}");
            Policy::from_yaml(&text).unwrap_err().to_string()
        };
        let e = error("    concurrency: 3\n    limit: 10/s\n");
        assert!(e.contains("a concurrency rule has no `limit`"), "{e}");
        // Token leases spend a rate's tokens: a concurrency rule has none to lease.
        let e = error("    concurrency: 3\n    lease_above: 100/s\n");
        assert!(e.contains("a concurrency rule has no `lease_above`"), "{e}");
        let e = error("    concurrency: 0\n");
        assert!(e.contains("max must be between 1 and 100000"), "{e}");
        let e = error("    concurrency: 100001\n");
        assert!(e.contains("max must be between 1 and 100000"), "{e}");
        let e = error("    concurrency: 3\n    ttl: 2d\n");
        assert!(e.contains("ttl must be between 1ms and 1 day"), "{e}");
        let e = error("    limit: 10/s\n    ttl: 30s\n");
        assert!(e.contains("`ttl` belongs to a concurrency rule"), "{e}");
        let e = error("    concurrency: 3\n    scope: global\n");
        assert!(e.contains("its scope can only be `region`"), "{e}");
    }

    #[test]
    fn a_refusal_is_a_429_with_retry_after_in_whole_seconds() {
        let policy = Policy::from_yaml(RULES).unwrap();
        let planned = policy.leases_for(&attrs("POST", "/v1/exports"));
        assert_eq!(lease_refusal(&planned, &[LeaseOutcome::Granted]), None);
        // Open rules pass when the limiter is unreachable.
        assert_eq!(lease_refusal(&planned, &[LeaseOutcome::Unreachable]), None);
        let refused = LeaseOutcome::Refused {
            in_use: 3,
            retry_after_ns: 1_200_000_000,
        };
        let answer = lease_refusal(&planned, &[refused]).unwrap();
        assert_eq!(answer.status, 429);
        assert_eq!(answer.header("retry-after"), Some("2"));
        let body = answer.body.unwrap();
        assert!(
            body.contains("\"violated-policies\":[\"exports\"]"),
            "{body}"
        );
        assert!(body.contains("\"retry_after\":2"), "{body}");
        // Less than a second is still 1.
        let soon = LeaseOutcome::Refused {
            in_use: 3,
            retry_after_ns: 1,
        };
        let answer = lease_refusal(&planned, &[soon]).unwrap();
        assert_eq!(answer.header("retry-after"), Some("1"));
        // Fail-closed and unanswered: 503.
        let reports = policy.leases_for(&attrs("GET", "/v1/reports/7"));
        let answer = lease_refusal(&reports, &[LeaseOutcome::Unreachable]).unwrap();
        assert_eq!(answer.status, 503);
        assert_eq!(answer.header("retry-after"), Some("1"));
    }
}
