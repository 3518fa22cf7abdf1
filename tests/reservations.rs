//! A rule's `reserve:` through the real planning and the real store: the share kept for
//! higher classes holds for each counting that accepts it (fixed window, sliding window,
//! concurrency leases), lower classes are refused at their threshold, the highest class uses
//! the whole limit, and nothing a lower class is refused gives back what others took. GCRA and
//! the sliding log refuse `reserve:` (why: `src/policy/priority.rs`).

use floodgate::lease::{Acquired, LeaseSet};
use floodgate::policy::{Policy, RequestAttributes};
use floodgate::priority::Priority::{self, Critical, Default, Sheddable};
use floodgate::{BucketStore, StoreConfig};

const NOW: u64 = 1_000_000_000_000;

fn policy(rule_tail: &str) -> Policy {
    Policy::from_yaml(&format!(
        "rules:\n  - name: backend\n    path: /v1/work\n    key: global\n{rule_tail}"
    ))
    .unwrap()
}

fn work() -> RequestAttributes<'static> {
    RequestAttributes {
        method: "GET",
        path: "/v1/work",
        ..RequestAttributes::default()
    }
}

/// Sends requests of `class` until one is refused; returns how many passed.
fn fill(policy: &Policy, store: &BucketStore, class: Priority) -> u64 {
    let mut passed = 0;
    for _ in 0..1_000 {
        let checks = policy.checks_for_class(&work(), class);
        let check = &checks[0];
        if !store
            .check(check.bucket_key(), &check.limit, check.cost, NOW)
            .unwrap()
            .is_allowed()
        {
            return passed;
        }
        passed += 1;
    }
    passed
}

fn store() -> BucketStore {
    BucketStore::new(StoreConfig {
        max_keys: 1_000,
        shards: 4,
    })
    .unwrap()
}

/// Of 10 a second with 20% kept for critical and 30% more for default: sheddable gets 5,
/// default 3 more, critical the last 2; afterwards no class gets anything, for each window
/// algorithm.
#[test]
fn window_limits_keep_their_shares_for_higher_classes() {
    for algorithm in ["fixed-window", "sliding-window"] {
        let policy = policy(&format!(
            "    limit: 10/s\n    algorithm: {algorithm}\n    reserve: {{ critical: 20%, default: 30% }}\n"
        ));
        let store = store();
        assert_eq!(fill(&policy, &store, Sheddable), 5, "{algorithm}");
        assert_eq!(fill(&policy, &store, Default), 3, "{algorithm}");
        assert_eq!(fill(&policy, &store, Critical), 2, "{algorithm}");
        // Refusals of lower classes forgave nothing: the limit is spent for everyone.
        for class in Priority::ALL {
            assert_eq!(fill(&policy, &store, class), 0, "{algorithm} {class}");
        }
    }
}

/// A critical burst first leaves lower classes nothing, though they asked for less: the
/// threshold is on what is used, whoever used it.
#[test]
fn a_lower_class_is_refused_once_usage_passes_its_threshold_whoever_used_it() {
    let policy =
        policy("    limit: 10/s\n    algorithm: fixed-window\n    reserve: { critical: 20% }\n");
    let store = store();
    let checks = policy.checks_for_class(&work(), Critical);
    let c = &checks[0];
    assert!(
        store
            .check(c.bucket_key(), &c.limit, 8, NOW)
            .unwrap()
            .is_allowed()
    );
    assert_eq!(fill(&policy, &store, Default), 0);
    assert_eq!(fill(&policy, &store, Critical), 2);
}

/// "Critical keeps 20% of backend X's in-flight capacity": of 5 places, 4 for anyone, the
/// fifth only for critical, on the lease set that decides them.
#[test]
fn a_concurrency_rule_keeps_places_for_critical() {
    let policy = policy("    concurrency: 5\n    ttl: 30s\n    reserve: { critical: 20% }\n");
    let mut set = LeaseSet::default();
    let mut id = 0;
    let mut acquire = |class| {
        let lease = &policy.leases_for_class(&work(), class)[0];
        id += 1;
        matches!(set.acquire(&lease.limit, id, NOW), Acquired::Granted { .. })
    };
    for _ in 0..4 {
        assert!(acquire(Sheddable));
    }
    assert!(!acquire(Sheddable));
    assert!(!acquire(Default));
    assert!(acquire(Critical));
    assert!(!acquire(Critical));
}

/// GCRA and the sliding log refuse `reserve:`, with the reason, at its line.
#[test]
fn gcra_and_the_sliding_log_refuse_a_reservation() {
    for tail in [
        "    limit: 10/s\n    reserve: { critical: 20% }\n",
        "    limit: 10/s\n    algorithm: sliding-log\n    reserve: { critical: 20% }\n",
        "    limit: 10/s\n    algorithm: fixed-window\n    plans: { paid: { limit: 100/s, algorithm: gcra } }\n    reserve: { critical: 20% }\n",
    ] {
        let text = format!(
            "plans: [paid]\nrules:\n  - name: backend\n    path: /v1/work\n    key: global\n{tail}"
        );
        let error = Policy::from_yaml(&text).unwrap_err().to_string();
        assert!(error.contains("forgives"), "{error}");
        // At the `reserve:` line (the rule's last).
        let line = text.lines().count();
        assert!(error.starts_with(&format!("{line}:")), "{error}");
    }
}

/// A request's class: the one it names if believed, else the first matching route, else the
/// file's default.
#[test]
fn a_class_comes_from_the_request_a_route_or_the_default() {
    let policy = Policy::from_yaml(
        "priority:\n  routes:\n    - { method: POST, path: /v1/pay/**, class: critical }\n    - { path: /v1/feed, class: sheddable }\n  default: default\nrules:\n  - name: any\n    path: /**\n    key: global\n    limit: 10/s\n",
    )
    .unwrap();
    let at = |method, path| RequestAttributes {
        method,
        path,
        ..RequestAttributes::default()
    };
    assert_eq!(policy.priority_of(&at("POST", "/v1/pay/7"), None), Critical);
    assert_eq!(policy.priority_of(&at("GET", "/v1/pay/7"), None), Default);
    assert_eq!(policy.priority_of(&at("GET", "/v1/feed"), None), Sheddable);
    assert_eq!(
        policy.priority_of(&at("GET", "/v1/feed"), Some("critical")),
        Critical
    );
    assert_eq!(
        policy.priority_of(&at("GET", "/v1/feed"), Some("urgent")),
        Sheddable
    );
    let strict = Policy::from_yaml(
        "priority: { header: false, default: sheddable }\nrules:\n  - name: any\n    path: /**\n    key: global\n    limit: 10/s\n",
    )
    .unwrap();
    assert_eq!(
        strict.priority_of(&at("GET", "/"), Some("critical")),
        Sheddable
    );
    let error = Policy::from_yaml(
        "priority: { default: urgent }\nrules:\n  - name: any\n    path: /**\n    key: global\n    limit: 10/s\n",
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("not a class"), "{error}");
}
