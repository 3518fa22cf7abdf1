//! Shared helpers of the policy tests: a bucket store, requests, and deciding planned checks
//! the way the client does (the core's `group_by_owner` and `RoundOutcomes`), with each call
//! decided all-or-nothing by the store as a node decides it.
#![allow(dead_code)] // each test file uses some of them

use std::net::IpAddr;

use floodgate::check::{Source, Verdict};
use floodgate::policy::{
    CheckOutcome, PlannedCheck, Policy, RequestAttributes, RequestVerdict, RoundOutcomes,
    group_by_owner,
};
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
    let mut keys: Vec<Vec<u8>> = Vec::new();
    decide(store, planned, now, |key| {
        keys.iter().position(|k| k == key).unwrap_or_else(|| {
            keys.push(key.to_vec());
            keys.len() - 1
        })
    })
}

/// Every key on one node: the enforced checks as one all-or-nothing group, each shadow check
/// alone (a shadow denial must not undo the enforced checks of a request it does not deny).
pub fn decide_group(store: &BucketStore, planned: &[PlannedCheck], now: u64) -> Vec<CheckOutcome> {
    decide(store, planned, now, |_| 0)
}

/// Decides `planned` as the client does, with `owner_of` saying which node owns a key: one call
/// per group of [`group_by_owner`], each decided all-or-nothing by `store`.
pub fn decide(
    store: &BucketStore,
    planned: &[PlannedCheck],
    now: u64,
    owner_of: impl FnMut(&[u8]) -> usize,
) -> Vec<CheckOutcome> {
    let mut round = RoundOutcomes::new(planned.len());
    for group in group_by_owner(planned, owner_of) {
        let checks: Vec<_> = group
            .members
            .iter()
            .map(|&i| planned[i].store_check())
            .collect();
        let mut decisions = Vec::new();
        store.check_all(&checks, now, &mut decisions).unwrap();
        let verdicts: Vec<Verdict> = decisions
            .into_iter()
            .map(|decision| Verdict {
                decision,
                source: Source::Node,
            })
            .collect();
        round.add(&group, Some(&verdicts));
    }
    round.outcomes
}

pub fn request(
    policy: &Policy,
    store: &BucketStore,
    attrs: &RequestAttributes<'_>,
    now: u64,
) -> RequestVerdict {
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
