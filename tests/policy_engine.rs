//! Matching: request attributes → the rules that apply → one check per rule, with its key
//! (globs, methods, plans from attributes or the API-key table, missing
//! attributes, keys that never collide across rules).

use std::net::IpAddr;

use floodgate::policy::{FailureMode, KEY_SEPARATOR, MAX_KEY_BYTES, PlannedCheck, Policy};
use floodgate::policy::{RequestAttributes, RuleLimit};
use floodgate::{Limit, NANOS_PER_SEC};

const EXAMPLE: &str = include_str!("../rules/example.yaml");
const MIN: u64 = 60 * NANOS_PER_SEC;

fn example() -> Policy {
    Policy::from_yaml(EXAMPLE).unwrap()
}

fn ip(s: &str) -> Option<IpAddr> {
    Some(s.parse().unwrap())
}

fn names(checks: &[PlannedCheck]) -> Vec<&str> {
    checks.iter().map(|c| &*c.rule).collect()
}

fn key(check: &PlannedCheck) -> String {
    String::from_utf8(check.key.clone()).unwrap()
}

fn find<'a>(checks: &'a [PlannedCheck], rule: &str) -> &'a PlannedCheck {
    checks.iter().find(|c| &*c.rule == rule).unwrap()
}

fn hold(user: &str) -> RequestAttributes<'_> {
    RequestAttributes {
        method: "POST",
        path: "/v1/events/42/holds",
        user: Some(user),
        client_ip: ip("203.0.113.9"),
        api_key: Some("pk_test_hobby_42"),
        tenant: Some("t1"),
        ..Default::default()
    }
}

#[test]
fn a_hold_request_gets_one_check_per_matching_rule_in_rule_order() {
    let policy = example();
    let checks = policy.checks_for(&hold("u42"));
    assert_eq!(
        names(&checks),
        ["holds", "api-key", "tenant", "global", "user-endpoint"]
    );
    let sep = KEY_SEPARATOR;
    assert_eq!(key(&checks[0]), format!("holds{sep}user:u42"));
    assert_eq!(key(&checks[2]), format!("tenant{sep}tenant:t1"));
    assert_eq!(key(&checks[3]), format!("global{sep}global"));
    assert_eq!(
        key(&checks[4]),
        format!("user-endpoint{sep}user:u42{sep}endpoint:POST /v1/events/42/holds")
    );
    // The API key is a secret: only its hash reaches the limiter.
    let api = key(&checks[1]);
    assert!(api.starts_with(&format!("api-key{sep}api_key:#")), "{api}");
    assert!(!api.contains("pk_test_hobby_42"));
    assert_eq!(api.len(), "api-key".len() + 1 + "api_key:#".len() + 32);

    let holds = &checks[0];
    assert_eq!(holds.limit, Limit::gcra(5, MIN, 5).unwrap());
    assert_eq!(holds.cost, 1);
    assert_eq!(holds.max_wait_ns, 500_000_000);
    assert!(!holds.shadow);
    assert_eq!(holds.failure_mode, FailureMode::Open);
    // The key's plan (free, from the API-key table) picks the tenant rule's limit.
    assert_eq!(checks[2].limit, Limit::gcra(100, MIN, 100).unwrap());
    assert_eq!(checks[1].limit, Limit::gcra(1000, MIN, 200).unwrap());
}

#[test]
fn methods_and_globs_select_rules() {
    let policy = example();
    let get = RequestAttributes {
        method: "GET",
        ..hold("u42")
    };
    assert!(!names(&policy.checks_for(&get)).contains(&"holds"));
    let lower = RequestAttributes {
        method: "post",
        path: "//v1/events/42/./holds/?x=1",
        ..hold("u42")
    };
    assert!(names(&policy.checks_for(&lower)).contains(&"holds"));
    let deeper = RequestAttributes {
        path: "/v1/events/42/x/holds",
        ..hold("u42")
    };
    assert!(!names(&policy.checks_for(&deeper)).contains(&"holds"));
    let outside = RequestAttributes {
        path: "/health",
        ..hold("u42")
    };
    assert_eq!(names(&policy.checks_for(&outside)), ["global"]);
    let search = RequestAttributes {
        method: "HEAD",
        path: "/v1/search/q",
        ..hold("u42")
    };
    let checks = policy.checks_for(&search);
    assert!(find(&checks, "search-ip").shadow);
}

#[test]
fn the_plan_attribute_wins_over_the_api_key_table() {
    let policy = example();
    let partner_key = RequestAttributes {
        api_key: Some("pk_live_acme_7f3a"),
        ..hold("u1")
    };
    assert_eq!(policy.resolve_plan(&partner_key), Some("partner"));
    let checks = policy.checks_for(&partner_key);
    assert_eq!(
        find(&checks, "api-key").limit,
        Limit::gcra(10_000, MIN, 10_000).unwrap()
    );
    assert!(
        !names(&checks).contains(&"tenant"),
        "partner has no tenant limit"
    );

    let told_paid = RequestAttributes {
        plan: Some("paid"),
        ..partner_key
    };
    assert_eq!(policy.resolve_plan(&told_paid), Some("paid"));
    let checks = policy.checks_for(&told_paid);
    assert_eq!(
        find(&checks, "api-key").limit,
        Limit::gcra(1000, MIN, 200).unwrap()
    );
    assert_eq!(
        find(&checks, "tenant").limit,
        Limit::gcra(10_000, MIN, 10_000).unwrap()
    );

    let internal = RequestAttributes {
        api_key: Some("pk_live_ops_0001"),
        ..hold("u1")
    };
    let checks = policy.checks_for(&internal);
    assert!(
        !names(&checks).contains(&"api-key"),
        "internal is unlimited"
    );
    assert!(!names(&checks).contains(&"tenant"));

    let unknown_key = RequestAttributes {
        api_key: Some("pk_unknown"),
        ..hold("u1")
    };
    assert_eq!(policy.resolve_plan(&unknown_key), None);
    let checks = policy.checks_for(&unknown_key);
    assert_eq!(
        find(&checks, "api-key").limit,
        Limit::gcra(1000, MIN, 200).unwrap()
    );
    assert!(
        !names(&checks).contains(&"tenant"),
        "no plan: the tenant rule does not apply"
    );
}

#[test]
fn rules_whose_key_needs_a_missing_attribute_do_not_apply() {
    let policy = example();
    let anonymous_login = RequestAttributes {
        method: "POST",
        path: "/v1/auth/login",
        client_ip: ip("198.51.100.7"),
        ..Default::default()
    };
    let checks = policy.checks_for(&anonymous_login);
    assert_eq!(names(&checks), ["login", "global"]);
    assert_eq!(
        key(&checks[0]),
        format!("login{KEY_SEPARATOR}ip:198.51.100.7")
    );
    assert_eq!(checks[0].failure_mode, FailureMode::Closed);

    let no_ip = RequestAttributes {
        client_ip: None,
        ..anonymous_login
    };
    assert_eq!(names(&policy.checks_for(&no_ip)), ["global"]);

    let empty_user = RequestAttributes {
        user: Some(""),
        api_key: Some(""),
        tenant: Some(""),
        plan: Some(""),
        ..hold("x")
    };
    assert_eq!(names(&policy.checks_for(&empty_user)), ["global"]);

    let mapped = RequestAttributes {
        client_ip: ip("::ffff:198.51.100.7"),
        ..anonymous_login
    };
    assert_eq!(key(&policy.checks_for(&mapped)[0]), key(&checks[0]));
}

#[test]
fn values_cannot_forge_key_parts_and_long_keys_are_hashed() {
    let policy = example();
    let sep = KEY_SEPARATOR;
    let forged = format!("a{sep}endpoint:GET /x%");
    let checks = policy.checks_for(&hold(&forged));
    assert_eq!(
        key(&checks[0]),
        format!("holds{sep}user:a%1Fendpoint:GET /x%25")
    );

    let long_user = "u".repeat(400);
    let checks = policy.checks_for(&hold(&long_user));
    for check in &checks {
        assert!(check.key.len() <= MAX_KEY_BYTES, "{}", check.rule);
    }
    let hashed = key(find(&checks, "holds"));
    assert!(hashed.starts_with(&format!("holds{sep}#")), "{hashed}");
    assert_eq!(hashed.len(), "holds".len() + 1 + 33);
    let other = policy.checks_for(&hold(&"v".repeat(400)));
    assert_ne!(key(find(&other, "holds")), hashed);
}

#[test]
fn different_rules_never_share_a_bucket() {
    let text = "\
rules:
  - { name: a, path: /**, key: ip, limit: 1/s }
  - { name: b, path: /**, key: ip, limit: 1/s }
  - { name: c, path: /**, key: [ip, method], limit: 1/s, cost: 1 }
";
    let policy = Policy::from_yaml(text).unwrap();
    let attrs = RequestAttributes {
        method: "GET",
        path: "/",
        client_ip: ip("192.0.2.1"),
        ..Default::default()
    };
    let checks = policy.checks_for(&attrs);
    assert_eq!(checks.len(), 3);
    assert_ne!(checks[0].bucket_key(), checks[1].bucket_key());
    assert_ne!(checks[1].bucket_key(), checks[2].bucket_key());
    assert_eq!(checks[2].store_check().cost, 1);
    assert_eq!(checks[2].store_check().key, checks[2].bucket_key());
}

#[test]
fn unlimited_by_default_limits_only_listed_plans() {
    let text = "\
plans: [free]
rules:
  - name: r
    path: /**
    key: tenant
    limit: unlimited
    plans: { free: 3/s }
";
    let policy = Policy::from_yaml(text).unwrap();
    let base = RequestAttributes {
        method: "GET",
        path: "/x",
        tenant: Some("t"),
        ..Default::default()
    };
    assert!(policy.checks_for(&base).is_empty());
    let free = RequestAttributes {
        plan: Some("free"),
        ..base
    };
    assert_eq!(policy.checks_for(&free).len(), 1);
    assert_eq!(
        policy.rule("r").unwrap().limit_for(Some("free")),
        Some(RuleLimit::Limited(
            Limit::gcra(3, NANOS_PER_SEC, 3).unwrap()
        ))
    );
}

/// `lease_above` travels from the rule to the check a client sends: gateways lease that rule's
/// hot keys; other rules' checks carry nothing.
#[test]
fn a_rule_with_lease_above_asks_for_token_leases_on_its_checks() {
    let text = "\
rules:
  - name: hot
    path: /*
    key: global
    limit: 5000/s
    lease_above: 30000/min
  - name: plain
    path: /*
    key: global
    limit: 10/s
";
    let policy = Policy::from_yaml(text).unwrap();
    assert_eq!(policy.rule("hot").unwrap().lease_above_per_sec(), Some(500));
    assert_eq!(policy.rule("plain").unwrap().lease_above_per_sec(), None);
    let attrs = RequestAttributes {
        method: "GET",
        path: "/search",
        ..Default::default()
    };
    let checks = policy.checks_for(&attrs);
    assert_eq!(find(&checks, "hot").check().lease_above_per_sec, Some(500));
    assert_eq!(find(&checks, "plain").check().lease_above_per_sec, None);
    assert!(
        policy
            .rule("hot")
            .unwrap()
            .describe()
            .contains("token leases above 500/s")
    );
}
