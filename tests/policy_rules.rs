//! The rules file: the example parses into exactly the rules the design brief lists, and broken
//! files are refused with the line and column of the mistake.

use floodgate::policy::{FailureMode, KeyPart, Mode, Policy, RuleLimit};
use floodgate::{Algorithm, Limit, NANOS_PER_SEC};

const EXAMPLE: &str = include_str!("../rules/example.yaml");
const MIN: u64 = 60 * NANOS_PER_SEC;

fn example() -> Policy {
    Policy::from_yaml(EXAMPLE).unwrap_or_else(|e| panic!("{}", e.render("example.yaml", EXAMPLE)))
}

fn limited(rate: u64, period_ns: u64, burst: u64) -> Option<RuleLimit> {
    Some(RuleLimit::Limited(
        Limit::gcra(rate, period_ns, burst).unwrap(),
    ))
}

#[test]
fn the_example_holds_every_rule_of_the_brief() {
    let policy = example();
    let names: Vec<&str> = policy.rules().iter().map(|r| r.name()).collect();
    assert_eq!(
        names,
        [
            "holds",
            "api-key",
            "tokens",
            "tenant",
            "login",
            "global",
            "user-endpoint",
            "exports",
            "search-ip",
            "work"
        ]
    );
    let exports = policy.rule("exports").unwrap().concurrency().unwrap();
    assert_eq!((exports.max(), exports.ttl_ns()), (3, 30 * NANOS_PER_SEC));

    let holds = policy.rule("holds").unwrap();
    assert_eq!(holds.methods(), ["POST"]);
    assert_eq!(holds.path().as_str(), "/v1/events/*/holds");
    assert_eq!(holds.key(), [KeyPart::User]);
    assert_eq!(holds.default_limit(), limited(5, MIN, 5));
    assert_eq!(holds.max_wait_ns(), 500_000_000);

    let api = policy.rule("api-key").unwrap();
    assert_eq!(api.key(), [KeyPart::ApiKey]);
    assert_eq!(api.default_limit(), limited(1000, MIN, 200));
    assert_eq!(api.limit_for(Some("partner")), limited(10_000, MIN, 10_000));
    assert_eq!(api.limit_for(Some("internal")), Some(RuleLimit::Unlimited));
    assert_eq!(api.limit_for(Some("free")), limited(1000, MIN, 200));

    let tokens = policy.rule("tokens").unwrap().cost_from().unwrap();
    assert_eq!(
        tokens.source(),
        &floodgate::policy::metered::CostSource::Response("x-usage-tokens".into())
    );
    assert_eq!((tokens.estimate(), tokens.missing()), (1, 1));

    let tenant = policy.rule("tenant").unwrap();
    assert_eq!(tenant.default_limit(), None);
    assert_eq!(tenant.limit_for(Some("free")), limited(100, MIN, 100));
    assert_eq!(tenant.limit_for(Some("paid")), limited(10_000, MIN, 10_000));
    assert_eq!(tenant.limit_for(Some("partner")), None);
    assert_eq!(tenant.limit_for(None), None);

    let login = policy.rule("login").unwrap();
    assert_eq!(login.key(), [KeyPart::Ip]);
    assert_eq!(login.default_limit(), limited(10, MIN, 10));
    assert_eq!(login.failure_mode(), FailureMode::Closed);

    let global = policy.rule("global").unwrap();
    assert_eq!(global.key(), [KeyPart::Global]);
    assert_eq!(global.default_limit(), limited(2000, NANOS_PER_SEC, 2000));
    assert_eq!(global.failure_mode(), FailureMode::Open);

    let composite = policy.rule("user-endpoint").unwrap();
    assert_eq!(composite.key(), [KeyPart::User, KeyPart::Endpoint]);
    assert_eq!(
        composite.default_limit(),
        Some(RuleLimit::Limited(
            Limit::window(Algorithm::SlidingLog, 60, MIN).unwrap()
        ))
    );

    let shadow = policy.rule("search-ip").unwrap();
    assert_eq!(shadow.mode(), Mode::Shadow);
    assert_eq!(shadow.methods(), ["GET", "HEAD"]);
    assert_eq!(holds.mode(), Mode::Enforce);

    assert_eq!(policy.plans(), ["free", "paid", "partner", "internal"]);
    assert_eq!(
        policy.plan_for_api_key("pk_live_acme_7f3a"),
        Some("partner")
    );
    assert_eq!(
        policy.plan_for_api_key("pk_live_ops_0001"),
        Some("internal")
    );
    assert_eq!(policy.plan_for_api_key("nope"), None);
    assert_eq!(policy.max_waiting(), 1000);
    assert!(
        policy
            .trusted_proxies()
            .contains("10.1.2.3".parse().unwrap())
    );
    assert!(
        !policy
            .trusted_proxies()
            .contains("192.0.2.1".parse().unwrap())
    );
}

#[test]
fn describe_lists_what_each_rule_enforces() {
    let policy = example();
    let text = policy.describe();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        format!(
            "policy {}: 10 rules, plans [free, paid, partner, internal] (unknown plans as free), \
             3 API keys, \
             max 1000 waiting, 2 trusted proxies, regions [eu-west, us-east, ap-south], \
             2 tenants with a home region",
            policy.version()
        )
    );
    assert_eq!(
        &lines[1..],
        [
            "holds: POST /v1/events/*/holds per user: gcra 5/1min; waits up to 500ms; scope home",
            "api-key: * /v1/** per api_key: gcra 1000/1min burst 200; \
             plan partner gcra 10000/1min; plan internal unlimited",
            "tokens: POST /v1/complete per api_key: gcra 1000/1min; 1 left to pass, then \
             charged the response's x-usage-tokens (else 1)",
            "tenant: * /v1/** per tenant: plan free gcra 100/1min; plan paid gcra 10000/1min; \
             other declared plans not limited; scope global",
            "login: POST /v1/auth/login per ip: gcra 10/1min; fails closed",
            "global: * /** per global: gcra 2000/1s; scope global",
            "user-endpoint: * /v1/** per user+endpoint: sliding-log 60/1min",
            "exports: POST /v1/exports per global: at most 3 at once (leases of 30s)",
            "search-ip: GET|HEAD /v1/search/** per ip: gcra 20/1s; shadow (never denies)",
            "work: GET /v1/work per global: at most 64 at once (leases of 10s); \
             keeps 25% for critical; keeps 25% for default",
        ]
    );
}

#[test]
fn the_version_is_a_content_hash() {
    let a = example();
    let b = Policy::from_yaml(EXAMPLE).unwrap();
    let c = Policy::from_yaml(&format!("{EXAMPLE}\n# changed\n")).unwrap();
    assert_eq!(a.version(), b.version());
    assert_ne!(a.version(), c.version());
    assert_eq!(a.version().len(), 16);
}

#[test]
fn plan_entries_accept_every_documented_form() {
    let text = "\
plans: [a, b, c, d]
rules:
  - name: r
    path: /**
    key: [tenant, plan]
    limit: unlimited
    plans:
      a: 10/s
      b: unlimited
      c: { limit: 100/min, burst: 20, algorithm: gcra }
      d: { limit: 5/s, algorithm: fixed-window }
";
    let policy = Policy::from_yaml(text).unwrap();
    let rule = policy.rule("r").unwrap();
    assert_eq!(rule.default_limit(), Some(RuleLimit::Unlimited));
    assert_eq!(rule.limit_for(Some("a")), limited(10, NANOS_PER_SEC, 10));
    assert_eq!(rule.limit_for(Some("b")), Some(RuleLimit::Unlimited));
    assert_eq!(rule.limit_for(Some("c")), limited(100, MIN, 20));
    assert_eq!(
        rule.limit_for(Some("d")),
        Some(RuleLimit::Limited(
            Limit::window(Algorithm::FixedWindow, 5, NANOS_PER_SEC).unwrap()
        ))
    );
    assert_eq!(rule.limit_for(Some("zzz")), Some(RuleLimit::Unlimited));
}
