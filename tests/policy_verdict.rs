//! Verdicts driven by a real `BucketStore` at explicit instants: one denial among allows, refunds
//! across nodes, shadow rules, max_wait and its bound, failure modes.

mod policy_support;

use floodgate::Decision;
use floodgate::policy::{Action, CheckOutcome, PlannedCheck, Policy, RequestAttributes, WaitBound};
use policy_support::*;

#[test]
fn a_denial_by_one_rule_leaves_the_other_rules_untouched() {
    let policy = Policy::from_yaml(EXAMPLE).unwrap();
    let store = store();
    for _ in 0..5 {
        assert!(request(&policy, &store, &hold("42"), T0).is_allowed());
    }
    let planned = policy.checks_for(&hold("42"));
    assert_eq!(
        planned.iter().map(|p| &*p.rule).collect::<Vec<_>>(),
        ["holds", "global", "user-endpoint"]
    );
    let peek = |p: &PlannedCheck| {
        store
            .check(p.bucket_key(), &p.limit, 0, T0)
            .unwrap()
            .remaining()
    };
    let before: Vec<u64> = planned.iter().map(peek).collect();
    assert_eq!(before, [0, 1995, 55]);

    let verdict = request(&policy, &store, &hold("42"), T0);
    assert!(matches!(verdict.action, Action::Deny { .. }));
    assert_eq!(
        verdict.violated().map(|r| &*r.rule).collect::<Vec<_>>(),
        ["holds"]
    );
    assert!(
        verdict.refunds(&planned).is_empty(),
        "one node undid the group itself"
    );
    assert_eq!(planned.iter().map(peek).collect::<Vec<u64>>(), before);

    let response = verdict.http();
    assert_eq!(response.status, 429);
    assert_eq!(
        response.header("ratelimit-policy"),
        Some("\"holds\";q=5;w=60, \"global\";q=2000;w=1, \"user-endpoint\";q=60;w=60")
    );
    assert_eq!(response.header("ratelimit"), Some("\"holds\";r=0;t=12"));
    let body = response.body.unwrap();
    assert!(body.contains(r#""violated-policies":["holds"],"#), "{body}");
}

#[test]
fn checks_on_different_nodes_are_listed_for_refund_when_the_request_is_denied() {
    let policy = Policy::from_yaml(EXAMPLE).unwrap();
    let store = store();
    let planned = policy.checks_for(&hold("42"));
    for _ in 0..5 {
        let v = policy.verdict(&planned, &decide_each(&store, &planned, T0));
        assert!(v.is_allowed());
        assert!(v.refunds(&planned).is_empty());
    }
    let verdict = policy.verdict(&planned, &decide_each(&store, &planned, T0));
    assert!(matches!(verdict.action, Action::Deny { .. }));
    let refunds: Vec<&str> = verdict.refunds(&planned).iter().map(|p| &*p.rule).collect();
    assert_eq!(refunds, ["global", "user-endpoint"]);
}

#[test]
fn shadow_rules_count_and_report_but_never_deny() {
    let policy = Policy::from_yaml(EXAMPLE).unwrap();
    let store = store();
    let search = RequestAttributes {
        method: "GET",
        path: "/v1/search/boots",
        client_ip: Some("198.51.100.1".parse().unwrap()),
        ..Default::default()
    };
    for _ in 0..20 {
        let v = request(&policy, &store, &search, T0);
        assert!(v.is_allowed());
        assert_eq!(v.shadow_denied().count(), 0);
    }
    let verdict = request(&policy, &store, &search, T0);
    assert!(verdict.is_allowed());
    assert_eq!(
        verdict
            .shadow_denied()
            .map(|r| &*r.rule)
            .collect::<Vec<_>>(),
        ["search-ip"]
    );
    assert_eq!(verdict.violated().count(), 0);
    let response = verdict.http();
    assert_eq!(response.status, 200);
    assert_eq!(
        response.header("ratelimit-policy"),
        Some("\"global\";q=2000;w=1")
    );
    assert_eq!(response.header("ratelimit"), Some("\"global\";r=1979;t=1"));
}

#[test]
fn max_wait_waits_when_the_retry_is_short_and_the_bound_holds() {
    let policy = Policy::from_yaml(EXAMPLE).unwrap();
    let store = store();
    let attrs = hold("42");
    for _ in 0..5 {
        assert!(request(&policy, &store, &attrs, T0).is_allowed());
    }
    // 11.6 s later the next unit is 0.4 s away, within holds' max_wait of 500 ms.
    let now = T0 + 11_600_000_000;
    let planned = policy.checks_for(&attrs);
    let verdict = policy.verdict(&planned, &decide_each(&store, &planned, now));
    assert_eq!(
        verdict.action,
        Action::Wait {
            wait_ns: 400_000_000
        }
    );
    let refunds: Vec<&str> = verdict.refunds(&planned).iter().map(|p| &*p.rule).collect();
    assert_eq!(
        refunds,
        ["global", "user-endpoint"],
        "given back before waiting"
    );

    let bound = WaitBound::new(policy.max_waiting().min(2));
    let first = bound.try_enter().unwrap();
    let _second = bound.try_enter().unwrap();
    assert!(
        bound.try_enter().is_none(),
        "a third waiter is over the bound"
    );
    let refused = verdict.clone().into_denial();
    assert_eq!(
        refused.action,
        Action::Deny {
            retry_after_ns: Some(400_000_000)
        }
    );
    assert_eq!(refused.http().header("retry-after"), Some("1"));
    drop(first);
    assert_eq!(bound.waiting(), 1);
    assert!(bound.try_enter().is_some());

    // After the wait, the same request passes.
    assert!(request(&policy, &store, &attrs, now + 400_000_000).is_allowed());

    // 0.6 s before the next refill is longer than max_wait: 429.
    let v = request(&policy, &store, &attrs, T0 + 23_400_000_000);
    assert_eq!(
        v.action,
        Action::Deny {
            retry_after_ns: Some(600_000_000)
        }
    );
}

#[test]
fn a_fail_open_rule_the_limiter_cannot_decide_does_not_block() {
    let policy = Policy::from_yaml(EXAMPLE).unwrap();
    let planned = login(&policy);
    let verdict = policy.verdict(
        &planned,
        &[
            CheckOutcome::node(allowed(9, 6 * S)),
            CheckOutcome::Unreachable,
        ],
    );
    assert!(verdict.is_allowed());
    let response = verdict.http();
    assert_eq!(response.status, 200);
    assert_eq!(response.header("ratelimit"), Some("\"login\";r=9;t=6"));
}

#[test]
fn a_known_denial_wins_over_an_undecided_fail_closed_rule() {
    let policy = Policy::from_yaml(EXAMPLE).unwrap();
    let planned = login(&policy);
    let denied = Decision::Denied {
        remaining: 0,
        retry_after_ns: 2_500_000_000,
        reset_after_ns: 10 * S,
    };
    let verdict = policy.verdict(
        &planned,
        &[CheckOutcome::Unreachable, CheckOutcome::node(denied)],
    );
    assert_eq!(
        verdict.action,
        Action::Deny {
            retry_after_ns: Some(2_500_000_000)
        }
    );
    let response = verdict.http();
    assert_eq!(response.status, 429);
    assert_eq!(response.header("retry-after"), Some("3"));
    assert_eq!(response.header("ratelimit"), Some("\"global\";r=0;t=3"));
}

#[test]
fn the_longest_retry_of_several_denials_is_the_answer() {
    let policy = Policy::from_yaml(EXAMPLE).unwrap();
    let planned = login(&policy);
    let denied = |retry_s: u64| {
        CheckOutcome::node(Decision::Denied {
            remaining: 0,
            retry_after_ns: retry_s * S,
            reset_after_ns: 60 * S,
        })
    };
    let verdict = policy.verdict(&planned, &[denied(6), denied(1)]);
    let response = verdict.http();
    assert_eq!(response.header("retry-after"), Some("6"));
    assert_eq!(response.header("ratelimit"), Some("\"login\";r=0;t=6"));
    assert!(response.body.unwrap().ends_with(
        r#""violated-policies":["login","global"],"violations":[{"policy":"login","retry_after":6},{"policy":"global","retry_after":1}]}"#
    ));
}

/// The example's metered `tokens` rule: the check before a completion is a peek (it takes
/// nothing, and is never refunded); the completion's tokens are charged after, past the limit;
/// then the key's next request is refused until the debt is repaid, and the 429 says when.
#[test]
fn a_metered_rule_peeks_then_charges_and_its_debt_sets_the_retry() {
    let policy = Policy::from_yaml(EXAMPLE).unwrap();
    let store = store();
    let completion = RequestAttributes {
        method: "POST",
        path: "/v1/complete",
        api_key: Some("pk_metered"),
        ..Default::default()
    };
    let planned = policy.checks_for(&completion);
    assert_eq!(
        planned.iter().map(|p| &*p.rule).collect::<Vec<_>>(),
        ["api-key", "tokens", "global"]
    );
    let tokens = &planned[1];
    assert!(tokens.check().peek && tokens.cost == 1);
    let verdict = policy.verdict(&planned, &decide_each(&store, &planned, T0));
    assert!(verdict.is_allowed());
    let left = |now| store.peek(tokens.bucket_key(), &tokens.limit, 0, now);
    assert_eq!(left(T0).remaining(), 1_000, "the peek took nothing");
    // 1,500 tokens spent: taken whole, 500 owed.
    let spent = tokens.charge(Some(1_500)).unwrap();
    let charged = store
        .charge(tokens.bucket_key(), &spent.limit, spent.cost, T0)
        .unwrap();
    assert_eq!(charged.forgiven, 0);
    assert!(!charged.decision.is_allowed());
    // No whole number in the response: the rule's `missing`, the estimate.
    assert_eq!(tokens.charge(None).unwrap().cost, 1);
    let refused = policy.verdict(&planned, &decide_each(&store, &planned, T0));
    assert_eq!(
        refused.violated().map(|r| &*r.rule).collect::<Vec<_>>(),
        ["tokens"]
    );
    let refunds: Vec<&str> = refused.refunds(&planned).iter().map(|p| &*p.rule).collect();
    assert_eq!(refunds, ["api-key", "global"], "a peek is never refunded");
    // 500 owed and one token to pass, at 60 ms a token: 30.06 s, rounded up.
    assert_eq!(refused.http().header("retry-after"), Some("31"));
    let repaid = T0 + 501 * 60_000_000;
    assert!(
        store
            .peek(tokens.bucket_key(), &tokens.limit, 1, repaid)
            .is_allowed()
    );
    assert!(
        !store
            .peek(tokens.bucket_key(), &tokens.limit, 1, repaid - 1)
            .is_allowed()
    );
}
