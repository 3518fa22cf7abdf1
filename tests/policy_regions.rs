//! Regions in the rules file: `regions:`, `tenants:` and a rule's `scope:`, validated with the
//! line and column of a mistake, and each planned check's scope resolved per request.

use floodgate::policy::{Policy, RequestAttributes, RuleScope};
use floodgate::region::{RegionName, Scope};

const EXAMPLE: &str = include_str!("../rules/example.yaml");

fn region(name: &str) -> RegionName {
    RegionName::new(name).unwrap()
}

fn refused(text: &str) -> String {
    let err = Policy::from_yaml(text).expect_err("the file should be refused");
    err.render("rules.yaml", text)
}

const REGIONAL: &str = "\
regions: [eu, us]
tenants:
  acme: eu
rules:
  - name: fixed
    path: /**
    key: global
    limit: 10/s
    scope: home:us
  - name: by-request
    path: /**
    key: tenant
    limit: 10/s
    scope: home
  - name: shared
    path: /**
    key: global
    limit: 10/s
    scope: global
  - name: local
    path: /**
    key: global
    limit: 10/s
";

#[test]
fn scopes_parse_and_resolve_per_request() {
    let policy = Policy::from_yaml(REGIONAL).unwrap();
    assert_eq!(policy.regions(), [region("eu"), region("us")]);
    assert_eq!(policy.home_region_of_tenant("acme"), Some(&region("eu")));
    let scopes: Vec<&RuleScope> = policy.rules().iter().map(|r| r.scope()).collect();
    assert_eq!(
        scopes,
        [
            &RuleScope::Home(region("us")),
            &RuleScope::RequestHome,
            &RuleScope::Global,
            &RuleScope::Region
        ]
    );
    let planned = |tenant, home_region| {
        let attrs = RequestAttributes {
            method: "GET",
            path: "/x",
            tenant,
            home_region,
            ..Default::default()
        };
        policy
            .checks_for(&attrs)
            .into_iter()
            .map(|c| c.scope)
            .collect::<Vec<_>>()
    };
    let home = |r: &str| Scope::Home(region(r));
    // The tenants table gives acme's home; a declared home_region attribute wins over it.
    assert_eq!(
        planned(Some("acme"), None),
        [home("us"), home("eu"), Scope::Global, Scope::Region]
    );
    assert_eq!(planned(Some("acme"), Some("us"))[1], home("us"));
    // An undeclared attribute is not believed: the table is asked, then the gateway's region.
    assert_eq!(planned(Some("acme"), Some("mars"))[1], home("eu"));
    assert_eq!(planned(Some("initech"), Some("mars"))[1], Scope::Region);
    assert_eq!(planned(Some("initech"), Some(""))[1], Scope::Region);
}

#[test]
fn region_mistakes_are_refused_at_their_line() {
    let cases = [
        (
            REGIONAL.replace("scope: global", "scope: planet"),
            "rules.yaml:19:12: unknown scope `planet`: expected region, global, home or home:REGION",
        ),
        (
            REGIONAL.replace("home:us", "home:ap"),
            "rules.yaml:9:12: unknown home region `ap` (declared regions: eu, us)",
        ),
        (
            REGIONAL.replace("acme: eu", "acme: ap"),
            "rules.yaml:3:9: unknown home region `ap` (declared regions: eu, us)",
        ),
        (
            REGIONAL.replace("[eu, us]", "[eu, eu]"),
            "rules.yaml:1:15: region `eu` is listed twice",
        ),
        (
            REGIONAL.replace("[eu, us]", "[eu, \"u s\"]"),
            "rules.yaml:1:15: region `u s` must be 1 to 64",
        ),
        (
            REGIONAL.replace("regions: [eu, us]\ntenants:\n  acme: eu\n", ""),
            "unknown home region `us` (declared regions: none; list them under `regions:`)",
        ),
    ];
    for (text, says) in cases {
        let err = refused(&text);
        assert!(err.contains(says), "{err}\n(wanted: {says})");
    }
}

#[test]
fn the_example_guards_tenants_and_the_service_across_regions() {
    let policy = Policy::from_yaml(EXAMPLE).unwrap();
    assert_eq!(policy.rule("global").unwrap().scope(), &RuleScope::Global);
    assert_eq!(policy.rule("tenant").unwrap().scope(), &RuleScope::Global);
    assert_eq!(
        policy.rule("holds").unwrap().scope(),
        &RuleScope::RequestHome
    );
    assert_eq!(policy.rule("login").unwrap().scope(), &RuleScope::Region);
    assert_eq!(
        policy.home_region_of_tenant("globex"),
        Some(&region("us-east"))
    );
}
