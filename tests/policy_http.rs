//! The HTTP answer of a verdict, exactly: status, `Retry-After`, `RateLimit-Policy`, `RateLimit`
//! and the problem body (draft-ietf-httpapi-ratelimit-headers-10; RFC 9457).
//! Expected values come from GCRA: 5/min has a 12 s emission interval and a 60 s capacity.

mod policy_support;

use floodgate::Decision;
use floodgate::check::DegradedReason;
use floodgate::policy::{Action, CheckOutcome, Policy, RequestAttributes, RuleState};
use policy_support::*;

#[test]
fn holds_allows_exactly_five_then_answers_429_with_exact_fields() {
    let policy = Policy::from_yaml(HOLDS_ONLY).unwrap();
    let store = store();
    let expected_allowed = [
        "\"holds\";r=4;t=12",
        "\"holds\";r=3;t=12",
        "\"holds\";r=2;t=12",
        "\"holds\";r=1;t=12",
        "\"holds\";r=0;t=12",
    ];
    for ratelimit in expected_allowed {
        let response = request(&policy, &store, &hold("42"), T0).http();
        assert_eq!(response.status, 200);
        assert_eq!(
            response.headers,
            [
                ("ratelimit-policy", "\"holds\";q=5;w=60".to_owned()),
                ("ratelimit", ratelimit.to_owned()),
            ]
        );
        assert_eq!(response.body, None);
    }
    let verdict = request(&policy, &store, &hold("42"), T0);
    assert_eq!(
        verdict.action,
        Action::Deny {
            retry_after_ns: Some(12 * S)
        }
    );
    let response = verdict.http();
    assert_eq!(response.status, 429);
    assert_eq!(
        response.headers,
        [
            ("retry-after", "12".to_owned()),
            ("ratelimit-policy", "\"holds\";q=5;w=60".to_owned()),
            ("ratelimit", "\"holds\";r=0;t=12".to_owned()),
            ("content-type", "application/problem+json".to_owned()),
        ]
    );
    assert_eq!(
        response.body.as_deref(),
        Some(
            r#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Too Many Requests","status":429,"detail":"Rate limit exceeded for \"holds\"; retry after 12 s.","violated-policies":["holds"],"violations":[{"policy":"holds","retry_after":12}]}"#
        )
    );
    // Another user is untouched; 12 s later one more hold passes, and t counts down.
    assert!(request(&policy, &store, &hold("43"), T0).is_allowed());
    let later = request(&policy, &store, &hold("42"), T0 + 12 * S);
    assert!(later.is_allowed());
    assert_eq!(later.http().header("ratelimit"), Some("\"holds\";r=0;t=12"));
    let partial = request(&policy, &store, &hold("43"), T0 + 5 * S).http();
    // u43 used 1 at T0: debt 7 s after 5 s, then 19 s after this one: r = (60-19)/12 = 3,
    // and the fourth unit is back when the debt reaches 12 s, 7 s from now.
    assert_eq!(partial.header("ratelimit"), Some("\"holds\";r=3;t=7"));
}

#[test]
fn retry_after_rounds_up_to_whole_seconds() {
    let policy = Policy::from_yaml(HOLDS_ONLY).unwrap();
    let store = store();
    for _ in 0..5 {
        request(&policy, &store, &hold("42"), T0);
    }
    let response = request(&policy, &store, &hold("42"), T0 + 500_000_001).http();
    assert_eq!(
        response.header("retry-after"),
        Some("12"),
        "11.499999999 s rounds up"
    );
    let response = request(&policy, &store, &hold("42"), T0 + 11_999_999_999).http();
    assert_eq!(
        response.header("retry-after"),
        Some("1"),
        "1 ns rounds up to 1 s"
    );
    assert_eq!(response.header("ratelimit"), Some("\"holds\";r=0;t=1"));
}

#[test]
fn a_fail_closed_rule_the_limiter_cannot_decide_answers_503() {
    let policy = Policy::from_yaml(EXAMPLE).unwrap();
    let planned = login(&policy);
    assert_eq!(
        planned.iter().map(|p| &*p.rule).collect::<Vec<_>>(),
        ["login", "global"]
    );
    let verdict = policy.verdict(
        &planned,
        &[
            CheckOutcome::Unreachable,
            CheckOutcome::fallback(allowed(1999, 500_000), DegradedReason::Unreachable),
        ],
    );
    assert_eq!(verdict.action, Action::Unavailable { retry_after_ns: S });
    assert_eq!(verdict.rules[0].state, RuleState::Unreachable);
    assert!(
        verdict.refunds(&planned).is_empty(),
        "only what a node took is given back; a local fallback bucket keeps its unit"
    );
    let response = verdict.http();
    assert_eq!(response.status, 503);
    assert_eq!(
        response.headers,
        [
            ("retry-after", "1".to_owned()),
            (
                "ratelimit-policy",
                "\"login\";q=10;w=60, \"global\";q=2000;w=1".to_owned()
            ),
            ("ratelimit", "\"global\";r=1999;t=1".to_owned()),
            ("content-type", "application/problem+json".to_owned()),
        ]
    );
    assert_eq!(
        response.body.as_deref(),
        Some(
            r#"{"type":"https://iana.org/assignments/http-problem-types#temporary-reduced-capacity","title":"Service Unavailable","status":503,"detail":"The rate limiter is unreachable and \"login\" fails closed; retry after 1 s.","violated-policies":["login"],"violations":[{"policy":"login","retry_after":1}]}"#
        )
    );
    // Missing outcomes count as unreachable.
    assert!(matches!(
        policy.verdict(&planned, &[]).action,
        Action::Unavailable { .. }
    ));
}

#[test]
fn a_cost_that_can_never_pass_is_denied_without_retry_after() {
    let policy = Policy::from_yaml(EXAMPLE).unwrap();
    let planned = login(&policy);
    let never = CheckOutcome::node(Decision::CostExceedsBurst { burst: 10 });
    let verdict = policy.verdict(
        &planned,
        &[never, CheckOutcome::node(allowed(1999, 500_000))],
    );
    assert_eq!(
        verdict.action,
        Action::Deny {
            retry_after_ns: None
        }
    );
    assert_eq!(verdict.refunds(&planned).len(), 1);
    let response = verdict.http();
    assert_eq!(response.status, 429);
    assert_eq!(response.header("retry-after"), None);
    let body = response.body.unwrap();
    assert!(
        body.contains("the request can never pass as sent"),
        "{body}"
    );
    assert!(
        body.contains(r#"{"policy":"login","retry_after":null}"#),
        "{body}"
    );
}

#[test]
fn a_request_no_rule_applies_to_passes_without_fields() {
    let policy = Policy::from_yaml(HOLDS_ONLY).unwrap();
    let planned = policy.checks_for(&RequestAttributes {
        method: "GET",
        path: "/",
        ..Default::default()
    });
    assert!(planned.is_empty());
    let response = policy.verdict(&planned, &[]).http();
    assert_eq!((response.status, response.headers.len()), (200, 0));
}
