//! Planning: a request's attributes → the matching rules → one check per rule, with its key.
//!
//! A rule applies to a request when its method and path match, the request's plan has a limit
//! under it (not `unlimited`), and the request has every attribute the rule's key needs: a rule
//! keyed by `user` does not apply to anonymous requests (add an `ip`-keyed rule to cover those).
//! Empty attribute strings count as missing.
//!
//! A plan the file does not declare (`Free` when it declares `free`; plan names are
//! case-sensitive) is never silently unlimited: see [`Rule::limit_for_unknown_plan`]. Such checks
//! are marked [`PlannedCheck::unknown_plan`] so gateways can count them.

use std::net::IpAddr;
use std::sync::Arc;

use xxhash_rust::xxh3::xxh3_128;

use super::pattern::{joined_path, normalize_path};
use super::rules::{FailureMode, KeyPart, Mode, Policy, Rule, RuleLimit, RuleScope};
use crate::region::Scope;
use crate::{BucketCheck, BucketKey, Limit};

/// Longest key a node accepts (the wire's default `max_key_bytes`); longer keys are hashed.
pub const MAX_KEY_BYTES: usize = 256;
/// Separates the rule name and the key parts inside a key (ASCII unit separator).
pub const KEY_SEPARATOR: char = '\u{1f}';

/// What the gateway knows about a request. The gateway's auth step sets `user`, `tenant` and
/// `plan`; `client_ip` comes from [`super::client_ip()`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestAttributes<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub user: Option<&'a str>,
    pub client_ip: Option<IpAddr>,
    pub api_key: Option<&'a str>,
    pub tenant: Option<&'a str>,
    /// The request's plan; when absent, the API-key table in the rules file is asked.
    pub plan: Option<&'a str>,
    /// The request's home region (for `scope: home` rules), set by the gateway's auth step
    /// (the example gateway takes `X-Home-Region`). Believed only when it is one of the file's
    /// `regions:`; otherwise, or when absent, the `tenants:` table is asked.
    pub home_region: Option<&'a str>,
    /// The request headers metered rules read their cost from (`cost_from: { request_header:
    /// NAME }`; [`Policy::request_cost_headers`]), as lower-case name and value.
    pub cost_headers: &'a [(String, String)],
}

/// One check a request needs: which bucket, under which limit, and how to treat the answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedCheck {
    pub rule: Arc<str>,
    /// The bucket's identity on the node: `rule ␟ part:value ␟ ...` (see [`Policy::checks_for`]).
    pub key: Vec<u8>,
    pub limit: Limit,
    pub cost: u64,
    pub failure_mode: FailureMode,
    /// Shadow rules count but never deny. Decide shadow checks in a different all-or-nothing
    /// group than enforced ones: a group's denial undoes the whole group, so a shadow denial
    /// in the same group would undo the enforced checks of a request that passes.
    pub shadow: bool,
    /// Longest this rule lets a request wait instead of denying it (0: never).
    pub max_wait_ns: u64,
    /// The request's plan is not one the file declares, and this rule's limit or key depends on
    /// the plan: the limit came from the documented default (for metrics and logs).
    pub unknown_plan: bool,
    /// Where the check is decided across regions: the rule's scope, with `home` resolved to
    /// the request's home region (`region` when it has none).
    pub scope: Scope,
    /// The rule's `lease_above`, in checks a second.
    pub lease_above_per_sec: Option<u64>,
    /// A metered rule's cost known only after the response: the check before the request is a
    /// peek of `cost` (the estimate), and this is charged once the response is done.
    pub charge_after: Option<super::metered::ResponseCost>,
}

impl PlannedCheck {
    /// The bucket the node keeps for this key (as the wire decoder computes it).
    pub fn bucket_key(&self) -> BucketKey {
        BucketKey::for_key(&self.key)
    }

    /// This check as a client sends it to the node that owns its key.
    pub fn check(&self) -> crate::check::Check {
        let check = crate::check::Check::new(self.key.clone(), self.limit)
            .cost(self.cost)
            .failure_mode(self.failure_mode)
            .scope(self.scope.clone());
        let check = match self.charge_after {
            Some(_) => check.peek(),
            None => check,
        };
        match self.lease_above_per_sec {
            Some(per_sec) => check.lease_above(per_sec),
            None => check,
        }
    }

    /// The charge of a metered check once its response is done: its key and limit, and the
    /// `units` the response reported under [`super::metered::ResponseCost::name`] (`None`: none
    /// valid, so the rule's `missing`). `None` for a check with a fixed cost.
    pub fn charge(&self, units: Option<u64>) -> Option<crate::check::Check> {
        let after = self.charge_after.as_ref()?;
        Some(
            crate::check::Check::new(self.key.clone(), self.limit)
                .cost(units.unwrap_or(after.missing))
                .failure_mode(self.failure_mode)
                .scope(self.scope.clone()),
        )
    }

    /// This check for an in-process [`crate::BucketStore`].
    pub fn store_check(&self) -> BucketCheck {
        BucketCheck {
            key: self.bucket_key(),
            limit: self.limit,
            cost: self.cost,
            peek: self.charge_after.is_some(),
        }
    }
}

impl Policy {
    /// The plan of a request: its `plan` attribute, else the API-key table's entry for its key.
    pub fn resolve_plan<'a>(&'a self, attrs: &RequestAttributes<'a>) -> Option<&'a str> {
        present(attrs.plan)
            .or_else(|| present(attrs.api_key).and_then(|k| self.plan_for_api_key(k)))
    }

    /// The home region of a request: its `home_region` attribute if the file declares that
    /// region, else the `tenants:` table's entry for its tenant.
    pub fn resolve_home_region(
        &self,
        attrs: &RequestAttributes<'_>,
    ) -> Option<&crate::region::RegionName> {
        present(attrs.home_region)
            .and_then(|r| self.declared_region(r))
            .or_else(|| present(attrs.tenant).and_then(|t| self.home_region_of_tenant(t)))
    }

    /// One check per rule that applies to the request, in rule order.
    ///
    /// Keys start with the rule's name and a separator, so two rules never share a bucket;
    /// each part is written `name:value` (`holds␟user:42`). `%` and the separator inside values
    /// are percent-escaped so values cannot forge parts; API keys are replaced by their hash so
    /// secrets never reach the limiter; a key longer than [`MAX_KEY_BYTES`] keeps the rule name
    /// and hashes the rest.
    pub fn checks_for(&self, attrs: &RequestAttributes<'_>) -> Vec<PlannedCheck> {
        self.checks_for_class(attrs, self.priority_of(attrs, None))
    }

    /// [`Policy::checks_for`] for a request of `class`: a rule that keeps shares of its limit
    /// for classes above it checks with the count `class` is allowed.
    pub fn checks_for_class(
        &self,
        attrs: &RequestAttributes<'_>,
        class: crate::priority::Priority,
    ) -> Vec<PlannedCheck> {
        let segments = normalize_path(attrs.path);
        let plan = self.resolve_plan(attrs);
        let mut path = None;
        let mut checks = Vec::new();
        for rule in &self.rules {
            let method_ok = rule.methods.is_empty()
                || rule
                    .methods
                    .iter()
                    .any(|m| m.eq_ignore_ascii_case(attrs.method));
            if !method_ok || !rule.path.matches(&segments) {
                continue;
            }
            let unknown_plan =
                plan.is_some_and(|p| !self.declares_plan(p)) && rule.depends_on_plan();
            let (rule_plan, limit) = if unknown_plan {
                let (substitute, limit) = rule.limit_for_unknown_plan(self.default_plan());
                (substitute.or(plan), limit)
            } else {
                (plan, rule.limit_for(plan))
            };
            let Some(RuleLimit::Limited(limit)) = limit else {
                continue;
            };
            let path = path.get_or_insert_with(|| joined_path(&segments));
            let Some(key) = build_key(rule, attrs, rule_plan, path) else {
                continue;
            };
            let (cost, charge_after) = metered_cost(rule, attrs);
            checks.push(PlannedCheck {
                rule: Arc::clone(&rule.name),
                key,
                limit: rule.limit_for_class(limit, class),
                cost,
                charge_after,
                failure_mode: rule.failure_mode,
                shadow: rule.mode == Mode::Shadow,
                max_wait_ns: rule.max_wait_ns,
                lease_above_per_sec: rule.lease_above_per_sec,
                unknown_plan,
                scope: match &rule.scope {
                    RuleScope::Region => Scope::Region,
                    RuleScope::Global => Scope::Global,
                    RuleScope::Home(region) => Scope::Home(region.clone()),
                    RuleScope::RequestHome => self
                        .resolve_home_region(attrs)
                        .map_or(Scope::Region, |region| Scope::Home(region.clone())),
                },
            });
        }
        checks
    }
}

/// A rule's cost for this request, and what it charges after the response: its fixed cost;
/// the cost its request header declares; or the estimate, peeked, and the response's cost.
fn metered_cost(
    rule: &Rule,
    attrs: &RequestAttributes<'_>,
) -> (u64, Option<super::metered::ResponseCost>) {
    use super::metered::{CostSource, ResponseCost};
    let Some(from) = &rule.cost_from else {
        return (rule.cost, None);
    };
    match &from.source {
        CostSource::RequestHeader(name) => {
            let value = attrs
                .cost_headers
                .iter()
                .find(|(n, _)| n.as_str() == &**name)
                .map(|(_, v)| v.as_str());
            (from.cost_of(value), None)
        }
        CostSource::Response(name) => (
            from.estimate,
            Some(ResponseCost {
                name: Arc::clone(name),
                missing: from.missing,
            }),
        ),
    }
}

impl Policy {
    /// The request headers metered rules take their cost from (lower-case names): what a
    /// gateway puts in [`RequestAttributes::cost_headers`].
    pub fn request_cost_headers(&self) -> impl Iterator<Item = &str> {
        self.rules
            .iter()
            .filter_map(|rule| match rule.cost_from()?.source() {
                super::metered::CostSource::RequestHeader(name) => Some(&**name),
                super::metered::CostSource::Response(_) => None,
            })
    }
}

fn present(value: Option<&str>) -> Option<&str> {
    value.filter(|v| !v.is_empty())
}

/// The rule's key for this request, or `None` when an attribute it needs is missing.
pub(super) fn build_key(
    rule: &Rule,
    attrs: &RequestAttributes<'_>,
    plan: Option<&str>,
    path: &str,
) -> Option<Vec<u8>> {
    let mut key = String::with_capacity(64);
    key.push_str(&rule.name);
    for &part in &rule.key {
        key.push(KEY_SEPARATOR);
        key.push_str(part.name());
        if part == KeyPart::Global {
            continue;
        }
        key.push(':');
        match part {
            KeyPart::User => escape_into(&mut key, present(attrs.user)?),
            KeyPart::Ip => key.push_str(&attrs.client_ip?.to_canonical().to_string()),
            KeyPart::ApiKey => {
                let api_key = present(attrs.api_key)?;
                key.push_str(&format!("#{:032x}", xxh3_128(api_key.as_bytes())));
            }
            KeyPart::Tenant => escape_into(&mut key, present(attrs.tenant)?),
            KeyPart::Plan => escape_into(&mut key, plan?),
            KeyPart::Method => {
                escape_into(&mut key, &present(Some(attrs.method))?.to_ascii_uppercase())
            }
            KeyPart::Path => escape_into(&mut key, path),
            KeyPart::Endpoint => {
                escape_into(&mut key, &present(Some(attrs.method))?.to_ascii_uppercase());
                key.push(' ');
                escape_into(&mut key, path);
            }
            KeyPart::Global => {}
        }
    }
    if key.len() > MAX_KEY_BYTES {
        let rest = &key[rule.name.len() + KEY_SEPARATOR.len_utf8()..];
        let hashed = format!("#{:032x}", xxh3_128(rest.as_bytes()));
        key.truncate(rule.name.len() + KEY_SEPARATOR.len_utf8());
        key.push_str(&hashed);
    }
    Some(key.into_bytes())
}

/// Appends `value`, percent-escaping `%` and the separator so a value can never look like a
/// separator and a further part.
fn escape_into(key: &mut String, value: &str) {
    for ch in value.chars() {
        match ch {
            '%' => key.push_str("%25"),
            KEY_SEPARATOR => key.push_str("%1F"),
            _ => key.push(ch),
        }
    }
}
