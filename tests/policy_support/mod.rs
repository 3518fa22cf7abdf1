//! Shared helpers of the policy tests: a bucket store, requests, and deciding planned checks
//! the way the client will (per node, or as all-or-nothing groups).
#![allow(dead_code)] // each test file uses some of them

use std::net::IpAddr;

use floodgate::policy::{CheckOutcome, PlannedCheck, Policy, RequestAttributes, Verdict};
use floodgate::{BucketStore, Decision, NANOS_PER_SEC, StoreConfig};

pub const S: u64 = NANOS_PER_SEC;
pub const T0: u64 = 1_000 * S;
pub const EXAMPLE: &str = include_str!("../../rules/example.yaml");
pub const HOLDS_ONLY: &str = "\
rules:
  - name: holds
    method: POST
    path: /v1/events/*/holds
    key: user
    limit: 5/min
";

pub fn store() -> BucketStore {
    BucketStore::new(StoreConfig {
        max_keys: 1 << 12,
        shards: 4,
    })
    .unwrap()
}

pub fn hold(user: &str) -> RequestAttributes<'_> {
    RequestAttributes {
        method: "POST",
        path: "/v1/events/7/holds",
        user: Some(user),
        client_ip: Some("203.0.113.9".parse::<IpAddr>().unwrap()),
        ..Default::default()
    }
}

/// Each check on its own, as if every key lived on a different node.
pub fn decide_each(store: &BucketStore, planned: &[PlannedCheck], now: u64) -> Vec<CheckOutcome> {
    planned
        .iter()
        .map(|p| CheckOutcome::node(store.check(p.bucket_key(), &p.limit, p.cost, now).unwrap()))
        .collect()
}

/// The enforced checks as one all-or-nothing group on one node, the shadow checks as another:
/// a shadow denial must not undo the enforced checks of a request it does not deny.
pub fn decide_group(store: &BucketStore, planned: &[PlannedCheck], now: u64) -> Vec<CheckOutcome> {
    let mut outcomes = vec![CheckOutcome::Unreachable; planned.len()];
    for shadow in [false, true] {
        let group: Vec<usize> = (0..planned.len())
            .filter(|&i| planned[i].shadow == shadow)
            .collect();
        let checks: Vec<_> = group.iter().map(|&i| planned[i].store_check()).collect();
        let mut decisions = Vec::new();
        let passed = store.check_all(&checks, now, &mut decisions).unwrap();
        for (&i, decision) in group.iter().zip(decisions) {
            let outcome = CheckOutcome::node(decision);
            outcomes[i] = if passed {
                outcome
            } else {
                outcome.rolled_back()
            };
        }
    }
    outcomes
}

pub fn request(
    policy: &Policy,
    store: &BucketStore,
    attrs: &RequestAttributes<'_>,
    now: u64,
) -> Verdict {
    let planned = policy.checks_for(attrs);
    policy.verdict(&planned, &decide_group(store, &planned, now))
}

pub fn login(policy: &Policy) -> Vec<PlannedCheck> {
    policy.checks_for(&RequestAttributes {
        method: "POST",
        path: "/v1/auth/login",
        client_ip: Some("198.51.100.7".parse().unwrap()),
        ..Default::default()
    })
}

pub fn allowed(remaining: u64, reset_after_ns: u64) -> Decision {
    Decision::Allowed {
        remaining,
        reset_after_ns,
    }
}
