//! Requests on a plan the rules file does not declare (`Free` when it declares `free`) are never
//! silently unlimited: each rule that depends on the plan applies its documented default, and
//! the check is marked so gateways can count it.

use floodgate::policy::{PlannedCheck, Policy, RequestAttributes};
use floodgate::{Limit, NANOS_PER_SEC};

const MIN: u64 = 60 * NANOS_PER_SEC;

const PLANS_ONLY: &str = "\
plans: [free, paid, internal]
rules:
  - name: tenant
    path: /v1/**
    key: tenant
    plans:
      paid: 10000/min
      free: 100/min
      internal: unlimited
  - name: global
    path: /**
    key: global
    limit: 2000/s
";

fn tenant_request(plan: Option<&str>) -> RequestAttributes<'_> {
    RequestAttributes {
        method: "GET",
        path: "/v1/data",
        tenant: Some("initech"),
        plan,
        ..Default::default()
    }
}

fn find<'a>(checks: &'a [PlannedCheck], rule: &str) -> Option<&'a PlannedCheck> {
    checks.iter().find(|c| &*c.rule == rule)
}

fn gcra_per_min(rate: u64) -> Limit {
    Limit::gcra(rate, MIN, rate).unwrap()
}

#[test]
fn a_plans_only_rule_applies_its_strictest_plan_to_an_unknown_plan() {
    let policy = Policy::from_yaml(PLANS_ONLY).unwrap();
    let checks = policy.checks_for(&tenant_request(Some("Free")));
    let tenant = find(&checks, "tenant").expect("an unknown plan must not be unlimited");
    assert_eq!(tenant.limit, gcra_per_min(100));
    assert!(tenant.unknown_plan);
    // The global rule does not depend on the plan: nothing unknown about it.
    assert!(!find(&checks, "global").unwrap().unknown_plan);
}

#[test]
fn declared_plans_and_requests_without_a_plan_keep_their_meaning() {
    let policy = Policy::from_yaml(PLANS_ONLY).unwrap();
    let paid = policy.checks_for(&tenant_request(Some("paid")));
    assert_eq!(find(&paid, "tenant").unwrap().limit, gcra_per_min(10_000));
    assert!(!find(&paid, "tenant").unwrap().unknown_plan);
    // `internal: unlimited` is what the file says: the rule does not apply.
    let internal = policy.checks_for(&tenant_request(Some("internal")));
    assert!(find(&internal, "tenant").is_none());
    // No plan at all: a plans-only rule does not apply (as documented).
    let none = policy.checks_for(&tenant_request(None));
    assert!(find(&none, "tenant").is_none());
}

#[test]
fn the_file_default_plan_decides_and_names_the_plan_in_keys() {
    let text = format!("default_plan: paid\n{PLANS_ONLY}")
        .replace("    key: tenant\n", "    key: [tenant, plan]\n");
    let policy = Policy::from_yaml(&text).unwrap();
    let checks = policy.checks_for(&tenant_request(Some("FREE")));
    let tenant = find(&checks, "tenant").unwrap();
    assert_eq!(tenant.limit, gcra_per_min(10_000));
    assert!(tenant.unknown_plan);
    let key = String::from_utf8(tenant.key.clone()).unwrap();
    assert!(key.ends_with("plan:paid"), "{key}");
}

#[test]
fn a_rule_default_plan_overrides_the_file_default() {
    let text = format!("default_plan: paid\n{PLANS_ONLY}").replace(
        "      internal: unlimited\n",
        "      internal: unlimited\n    default_plan: internal\n",
    );
    let policy = Policy::from_yaml(&text).unwrap();
    // The rule says unknown plans are treated as `internal`, which it leaves unlimited: the
    // rules say so, so the rule does not apply.
    let checks = policy.checks_for(&tenant_request(Some("Free")));
    assert!(find(&checks, "tenant").is_none());
    assert!(find(&checks, "global").is_some());
}

#[test]
fn a_rule_with_its_own_limit_applies_it_to_unknown_plans() {
    let text = PLANS_ONLY.replace("    key: tenant\n", "    key: tenant\n    limit: 50/min\n");
    let policy = Policy::from_yaml(&text).unwrap();
    let checks = policy.checks_for(&tenant_request(Some("gold")));
    let tenant = find(&checks, "tenant").unwrap();
    assert_eq!(tenant.limit, gcra_per_min(50));
    assert!(tenant.unknown_plan);
}

#[test]
fn the_example_file_treats_unknown_plans_as_free() {
    let policy = Policy::from_yaml(include_str!("../rules/example.yaml")).unwrap();
    assert_eq!(policy.default_plan(), Some("free"));
    let checks = policy.checks_for(&tenant_request(Some("Free")));
    let tenant = find(&checks, "tenant").unwrap();
    assert_eq!(tenant.limit, gcra_per_min(100));
    assert!(tenant.unknown_plan);
}

#[test]
fn verdict_reports_carry_the_unknown_plan_mark() {
    let policy = Policy::from_yaml(PLANS_ONLY).unwrap();
    let checks = policy.checks_for(&tenant_request(Some("Free")));
    let verdict = policy.verdict(&checks, &[]);
    let marked: Vec<&str> = verdict
        .rules
        .iter()
        .filter(|r| r.unknown_plan)
        .map(|r| &*r.rule)
        .collect();
    assert_eq!(marked, ["tenant"]);
}
