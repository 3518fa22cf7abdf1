//! The HTTP contract of a verdict: status, `Retry-After`, `RateLimit-Policy`, `RateLimit` and an
//! RFC 9457 problem body.
//!
//! Fields follow draft-ietf-httpapi-ratelimit-headers-10. `RateLimit-Policy` lists every
//! enforced rule that applied to the request (`"holds";q=5;w=60`): `q` is the rule's rate and `w`
//! its period in whole seconds, rounded up (a sub-second or fractional period thus understates
//! the rate, which only makes clients more careful). `RateLimit` carries one item, the most
//! restrictive rule: the denying rule with the longest retry on a `429`, else the one with the
//! fewest remaining units. The draft lets a server return only the limit closest to being
//! reached (Appendix B.1.2, B.3.2: "the closest limit to reach is the daily one", only `"day"`
//! is sent), and one item keeps `Retry-After` and `t` consistent: `Retry-After` is never earlier
//! than `t` (§6). `t` is the time until more quota is available, in seconds rounded up. Shadow
//! rules are left out: they never deny, so advertising them would mislead clients. No `pk`
//! parameter is sent: partition keys would expose user ids and API-key hashes (§6.1, §8.2).
//!
//! Field names are lower-case, as HTTP/2 and the `http` crate write them.

use std::fmt::Write as _;

use super::json;
use super::verdict::{Action, RequestVerdict, RuleReport, RuleState};
use crate::NANOS_PER_SEC;

pub const RETRY_AFTER: &str = "retry-after";
pub const RATELIMIT_POLICY: &str = "ratelimit-policy";
pub const RATELIMIT: &str = "ratelimit";
pub const CONTENT_TYPE: &str = "content-type";
pub const PROBLEM_JSON: &str = "application/problem+json";
/// The draft's problem type for a `429` (§5.1).
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";
/// The draft's problem type for a `503` when capacity is reduced (§5.2): here, the limiter.
pub const TEMPORARY_REDUCED_CAPACITY: &str =
    "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity";

/// What the gateway answers, or adds to the upstream's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpResponse {
    /// 200: pass the request on (and add `headers` to the upstream's response); 429 or 503:
    /// answer with `headers` and `body` instead.
    pub status: u16,
    /// `(lower-case name, value)` pairs, in a fixed order.
    pub headers: Vec<(&'static str, String)>,
    /// The `application/problem+json` body of a 429 or 503.
    pub body: Option<String>,
}

impl HttpResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Whole seconds, rounded up: a client that waits this long is never early.
pub fn seconds_ceil(ns: u64) -> u64 {
    ns.div_ceil(NANOS_PER_SEC)
}

impl RequestVerdict {
    /// The HTTP answer for this verdict. A `Wait` the gateway does not honour is answered as the
    /// denial it stands for (429, `Retry-After` the wait).
    pub fn http(&self) -> HttpResponse {
        let mut headers = Vec::new();
        if let Some(policy) = ratelimit_policy(self) {
            headers.push((RATELIMIT_POLICY, policy));
        }
        if let Some(limit) = ratelimit(self) {
            headers.push((RATELIMIT, limit));
        }
        let (status, retry_after_ns) = match self.action {
            Action::Allow => {
                return HttpResponse {
                    status: 200,
                    headers,
                    body: None,
                };
            }
            Action::Wait { wait_ns } => (429, Some(wait_ns)),
            Action::Deny { retry_after_ns } => (429, retry_after_ns),
            Action::Unavailable { retry_after_ns } => (503, Some(retry_after_ns)),
        };
        let retry_after = retry_after_ns.map(|ns| seconds_ceil(ns).max(1));
        if let Some(seconds) = retry_after {
            headers.insert(0, (RETRY_AFTER, seconds.to_string()));
        }
        headers.push((CONTENT_TYPE, PROBLEM_JSON.to_owned()));
        HttpResponse {
            status,
            headers,
            body: Some(problem(self, status, retry_after)),
        }
    }
}

/// `RateLimit-Policy`: one item per enforced rule of the request, in rule order.
pub fn ratelimit_policy(verdict: &RequestVerdict) -> Option<String> {
    let items: Vec<String> = verdict
        .rules
        .iter()
        .filter(|r| !r.shadow)
        .map(|r| {
            let window = seconds_ceil(r.limit.period_ns()).max(1);
            format!("\"{}\";q={};w={window}", r.rule, r.limit.rate())
        })
        .collect();
    (!items.is_empty()).then(|| items.join(", "))
}

/// `RateLimit`: the most restrictive enforced rule's remaining units and time to more quota.
pub fn ratelimit(verdict: &RequestVerdict) -> Option<String> {
    let report = most_restrictive(verdict)?;
    let remaining = report.remaining?;
    let reset = seconds_ceil(report.more_after_ns.unwrap_or(0));
    Some(format!("\"{}\";r={remaining};t={reset}", report.rule))
}

fn most_restrictive(verdict: &RequestVerdict) -> Option<&RuleReport> {
    // A retry that can never pass sorts last of all (u64::MAX).
    let retry = |r: &RuleReport| match r.state {
        RuleState::Denied { retry_after_ns } => retry_after_ns.unwrap_or(u64::MAX),
        _ => 0,
    };
    let mut best: Option<&RuleReport> = None;
    for report in verdict.violated() {
        if best.is_none_or(|b| retry(report) > retry(b)) {
            best = Some(report);
        }
    }
    if best.is_some() {
        return best;
    }
    let key = |r: &RuleReport| {
        (
            r.remaining.unwrap_or(u64::MAX),
            u64::MAX - r.more_after_ns.unwrap_or(0),
        )
    };
    for report in verdict
        .rules
        .iter()
        .filter(|r| !r.shadow && r.remaining.is_some())
    {
        if best.is_none_or(|b| key(report) < key(b)) {
            best = Some(report);
        }
    }
    best
}

/// The RFC 9457 body: the draft's problem type, `violated-policies` (its extension member) and
/// `violations`, each policy with its own retry time in seconds (`null`: never).
fn problem(verdict: &RequestVerdict, status: u16, retry_after: Option<u64>) -> String {
    let unavailable = status == 503;
    let culprits: Vec<(&str, Option<u64>)> = if unavailable {
        verdict
            .undecided_closed()
            .map(|r| (&*r.rule, retry_after))
            .collect()
    } else {
        verdict
            .violated()
            .map(|r| {
                let retry = match r.state {
                    RuleState::Denied { retry_after_ns } => {
                        retry_after_ns.map(|ns| seconds_ceil(ns).max(1))
                    }
                    _ => None,
                };
                (&*r.rule, retry)
            })
            .collect()
    };
    let names: Vec<String> = culprits.iter().map(|(n, _)| json::string(n)).collect();
    let quoted = culprits
        .iter()
        .map(|(n, _)| format!("\"{n}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let when = match retry_after {
        Some(s) => format!("retry after {s} s"),
        None => "the request can never pass as sent".to_owned(),
    };
    let (kind, title, detail) = if unavailable {
        (
            TEMPORARY_REDUCED_CAPACITY,
            "Service Unavailable",
            format!("The rate limiter is unreachable and {quoted} fails closed; {when}."),
        )
    } else {
        (
            QUOTA_EXCEEDED,
            "Too Many Requests",
            format!("Rate limit exceeded for {quoted}; {when}."),
        )
    };
    let mut body = String::with_capacity(256);
    body.push_str("{\"type\":");
    json::push_string(&mut body, kind);
    body.push_str(",\"title\":");
    json::push_string(&mut body, title);
    let _ = write!(body, ",\"status\":{status},\"detail\":");
    json::push_string(&mut body, &detail);
    let _ = write!(body, ",\"violated-policies\":[{}]", names.join(","));
    body.push_str(",\"violations\":[");
    for (i, (name, retry)) in culprits.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        body.push_str("{\"policy\":");
        json::push_string(&mut body, name);
        match retry {
            Some(s) => {
                let _ = write!(body, ",\"retry_after\":{s}}}");
            }
            None => body.push_str(",\"retry_after\":null}"),
        }
    }
    body.push_str("]}");
    body
}
