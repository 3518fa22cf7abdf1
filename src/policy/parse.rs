//! The rules-file schema: YAML nodes → a validated [`Policy`], every error at a line and column.
//!
//! The schema is documented by example in `rules/example.yaml`.

use std::collections::HashMap;
use std::sync::Arc;

use xxhash_rust::xxh3::xxh3_64;

use super::client_ip::{Cidr, TrustedProxies};
use super::error::PolicyError;
use super::method::parse_method;
use super::parse_limit::{
    known_plan, parse_algorithm, parse_cost, parse_lease_above, parse_limit, parse_max_wait,
    parse_rule_plans,
};
use super::parse_region::{parse_regions, parse_scope, parse_tenants};
use super::pattern::PathPattern;
use super::priority::{parse_priority, parse_reserve};
use super::rules::{FailureMode, KeyPart, Mode, Policy, PriorityRules, Rule, RuleLimit, RuleScope};
use super::yaml::{self, Fields, Node, error_at};
use crate::Algorithm;
use crate::priority::Reservation;
use crate::region::RegionName;

/// Largest `max_waiting` accepted.
pub const MAX_WAITING: u64 = 1_000_000;
/// `max_waiting` when the file does not say.
pub const DEFAULT_MAX_WAITING: usize = 1_000;
/// Most rules in one file: every request is matched against each of them.
pub const MAX_RULES: usize = 1_000;

const TOP_FIELDS: &[&str] = &[
    "plans",
    "default_plan",
    "api_keys",
    "max_waiting",
    "trusted_proxies",
    "regions",
    "tenants",
    "priority",
    "rules",
];
const RULE_FIELDS: &[&str] = &[
    "name",
    "method",
    "path",
    "key",
    "limit",
    "burst",
    "algorithm",
    "plans",
    "default_plan",
    "cost",
    "cost_from",
    "failure_mode",
    "mode",
    "max_wait",
    "scope",
    "concurrency",
    "ttl",
    "lease_above",
    "reserve",
];

impl Policy {
    /// Parses and validates a rules file (see `rules/example.yaml` for the schema).
    pub fn from_yaml(text: &str) -> Result<Self, PolicyError> {
        parse_policy(text)
    }
}

/// Parses and validates a whole rules file.
fn parse_policy(text: &str) -> Result<Policy, PolicyError> {
    let root = yaml::load(text)?;
    let top = Fields::new(&root, "the rules file", TOP_FIELDS)?;
    let plans = match top.get("plans") {
        Some(node) => parse_plans(node)?,
        None => Vec::new(),
    };
    let default_plan = match top.get("default_plan") {
        Some(node) => Some(parse_default_plan(node, &plans)?),
        None => None,
    };
    let api_keys = match top.get("api_keys") {
        Some(node) => parse_api_keys(node, &plans)?,
        None => HashMap::new(),
    };
    let max_waiting = match top.get("max_waiting") {
        Some(node) => parse_max_waiting(node)?,
        None => DEFAULT_MAX_WAITING,
    };
    let trusted_proxies = match top.get("trusted_proxies") {
        Some(node) => parse_trusted_proxies(node)?,
        None => TrustedProxies::none(),
    };
    let regions = match top.get("regions") {
        Some(node) => parse_regions(node)?,
        None => Vec::new(),
    };
    let tenants = match top.get("tenants") {
        Some(node) => parse_tenants(node, &regions)?,
        None => HashMap::new(),
    };
    let priority = match top.get("priority") {
        Some(node) => parse_priority(node)?,
        None => PriorityRules::default(),
    };
    let rules = parse_rules(top.require("rules")?, &plans, &regions)?;
    Ok(Policy {
        version: format!("{:016x}", xxh3_64(text.as_bytes())),
        rules,
        plans,
        default_plan,
        api_keys,
        max_waiting,
        trusted_proxies,
        regions,
        tenants,
        priority,
    })
}

fn parse_max_waiting(node: &Node<'_>) -> Result<usize, PolicyError> {
    let n = yaml::unsigned(node, "`max_waiting`")?;
    if n > MAX_WAITING {
        return Err(error_at(
            node,
            format!("max_waiting {n} is above {MAX_WAITING}"),
        ));
    }
    Ok(n as usize)
}

/// `rules`: at most `MAX_RULES`, each name used once.
fn parse_rules(
    rules_node: &Node<'_>,
    plans: &[String],
    regions: &[RegionName],
) -> Result<Vec<Rule>, PolicyError> {
    let items = yaml::sequence(rules_node, "`rules`")?;
    if items.len() > MAX_RULES {
        return Err(error_at(
            rules_node,
            format!("{} rules; the maximum is {MAX_RULES}", items.len()),
        ));
    }
    let mut rules: Vec<Rule> = Vec::with_capacity(items.len());
    let mut seen: HashMap<String, usize> = HashMap::new();
    for item in items {
        let (rule, name_node) = parse_rule(item, plans, regions)?;
        if let Some(line) = seen.get(rule.name()) {
            return Err(error_at(
                name_node,
                format!(
                    "duplicate rule name `{}` (first defined on line {line})",
                    rule.name()
                ),
            ));
        }
        seen.insert(rule.name().to_owned(), name_node.span.start.line());
        rules.push(rule);
    }
    Ok(rules)
}

/// A name for a rule or plan: 1 to 64 of `A-Z a-z 0-9 . _ -`, starting with a letter or digit.
/// Rule names appear quoted in HTTP fields and in keys, so they need no escaping anywhere.
fn check_name(node: &Node<'_>, what: &str) -> Result<String, PolicyError> {
    let name = yaml::string(node, what)?;
    let ok = (1..=64).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if !ok {
        return Err(error_at(
            node,
            format!(
                "{what} `{name}` must be 1 to 64 letters, digits, `.`, `_` or `-`, starting with a letter or digit"
            ),
        ));
    }
    Ok(name.to_owned())
}

fn parse_plans(node: &Node<'_>) -> Result<Vec<String>, PolicyError> {
    let mut plans: Vec<String> = Vec::new();
    for item in yaml::sequence(node, "`plans`")? {
        let name = check_name(item, "a plan name")?;
        if plans.contains(&name) {
            return Err(error_at(item, format!("plan `{name}` is listed twice")));
        }
        plans.push(name);
    }
    Ok(plans)
}

/// `default_plan: PLAN`, a declared plan.
fn parse_default_plan(node: &Node<'_>, plans: &[String]) -> Result<String, PolicyError> {
    let plan = yaml::string(node, "`default_plan` (a plan name)")?;
    known_plan(node, plan, plans)?;
    Ok(plan.to_owned())
}

fn parse_api_keys(
    node: &Node<'_>,
    plans: &[String],
) -> Result<HashMap<String, String>, PolicyError> {
    let mut keys = HashMap::new();
    for (api_key, key_node, value) in yaml::mapping(node, "`api_keys`")? {
        if api_key.is_empty() {
            return Err(error_at(key_node, "an API key cannot be empty"));
        }
        let plan = yaml::string(value, "the plan of an API key")?;
        known_plan(value, plan, plans)?;
        keys.insert(api_key.to_owned(), plan.to_owned());
    }
    Ok(keys)
}

fn parse_trusted_proxies(node: &Node<'_>) -> Result<TrustedProxies, PolicyError> {
    let mut networks = Vec::new();
    for (text, item) in yaml::strings(node, "`trusted_proxies`")? {
        let cidr: Cidr = text.parse().map_err(|e: String| error_at(item, e))?;
        networks.push(cidr);
    }
    Ok(TrustedProxies::from_networks(networks))
}

/// One rule, and the node of its name (for duplicate-name errors). Fields are read in a fixed
/// order, so a rule with several mistakes always reports the same one first.
fn parse_rule<'n, 'a>(
    node: &'n Node<'a>,
    plans: &[String],
    regions: &[RegionName],
) -> Result<(Rule, &'n Node<'a>), PolicyError> {
    let fields = Fields::new(node, "a rule", RULE_FIELDS)?;
    let name_node = fields.require("name")?;
    let name = check_name(name_node, "a rule name")?;
    let methods = parse_methods(&fields)?;
    let path_node = fields.require("path")?;
    let path = PathPattern::parse(yaml::string(path_node, "`path`")?)
        .map_err(|e| error_at(path_node, e))?;
    let key = parse_key(fields.require("key")?)?;
    let algorithm = match fields.get("algorithm") {
        Some(n) => parse_algorithm(n)?,
        None => Algorithm::Gcra,
    };
    let concurrency = super::concurrency::parse_concurrency(&fields)?;
    let RuleLimits {
        limit,
        plans: rule_plans,
        default_plan,
    } = parse_rule_limits(&fields, &name, plans, algorithm, concurrency.is_some())?;
    // The rule's own limit and every plan's.
    let limits = || limit.iter().chain(rule_plans.iter().map(|p| &p.1));
    let cost = match fields.get("cost") {
        Some(cost_node) => parse_cost(cost_node, limits())?,
        None => 1,
    };
    let cost_from = super::metered::parse_cost_from(&fields, least_burst(limits()))?;
    let failure_mode = match fields.get("failure_mode") {
        Some(n) => parse_failure_mode(n)?,
        None => FailureMode::Open,
    };
    let mode = match fields.get("mode") {
        Some(n) => parse_mode(n)?,
        None => Mode::Enforce,
    };
    let max_wait_ns = match fields.get("max_wait") {
        Some(n) => parse_max_wait(n)?,
        None => 0,
    };
    let scope = match fields.get("scope") {
        Some(n) => parse_scope(n, regions)?,
        None => RuleScope::Region,
    };
    let lease_above_per_sec = fields
        .get("lease_above")
        .map(parse_lease_above)
        .transpose()?;
    let reserve = match fields.get("reserve") {
        Some(n) => parse_reserve(n, concurrency, limits())?,
        None => Reservation::NONE,
    };
    let rule = Rule {
        name: Arc::from(name),
        methods,
        path,
        key,
        limit,
        plans: rule_plans,
        default_plan,
        cost,
        cost_from,
        failure_mode,
        mode,
        max_wait_ns,
        scope,
        concurrency,
        lease_above_per_sec,
        reserve,
    };
    Ok((rule, name_node))
}

/// A rule's own limit, its limits per plan, and the plan it takes for an undeclared one.
struct RuleLimits {
    limit: Option<RuleLimit>,
    plans: Vec<(String, RuleLimit)>,
    default_plan: Option<String>,
}

/// `limit` (with `burst`), `plans` and `default_plan`: at least one limit, unless the rule
/// limits only requests in flight (`concurrency`).
fn parse_rule_limits(
    fields: &Fields<'_, '_>,
    name: &str,
    plans: &[String],
    algorithm: Algorithm,
    concurrency: bool,
) -> Result<RuleLimits, PolicyError> {
    let limit = parse_rule_limit(fields, algorithm)?;
    let rule_plans = match fields.get("plans") {
        Some(plans_node) => parse_rule_plans(plans_node, plans, algorithm)?,
        None => Vec::new(),
    };
    let default_plan = match fields.get("default_plan") {
        Some(node) => Some(parse_default_plan(node, plans)?),
        None => None,
    };
    if limit.is_none() && rule_plans.is_empty() && !concurrency {
        return Err(error_at(
            fields.node(),
            format!(
                "rule `{name}` needs a `limit`, per-plan limits under `plans`, or both (or \
                 `concurrency` for requests in flight)"
            ),
        ));
    }
    Ok(RuleLimits {
        limit,
        plans: rule_plans,
        default_plan,
    })
}

/// `method`: one method or a list, each kept once.
fn parse_methods(fields: &Fields<'_, '_>) -> Result<Vec<String>, PolicyError> {
    let mut methods = Vec::new();
    if let Some(method_node) = fields.get("method") {
        for (text, item) in yaml::strings(method_node, "`method`")? {
            let method = parse_method(text).map_err(|e| error_at(item, e))?;
            if !methods.contains(&method) {
                methods.push(method);
            }
        }
    }
    Ok(methods)
}

/// `limit` (with `burst` beside it); a `burst` alone is an error.
fn parse_rule_limit(
    fields: &Fields<'_, '_>,
    algorithm: Algorithm,
) -> Result<Option<RuleLimit>, PolicyError> {
    match fields.get("limit") {
        Some(limit_node) => Ok(Some(parse_limit(
            limit_node,
            fields.get("burst"),
            algorithm,
        )?)),
        None => match fields.get("burst") {
            Some(burst) => Err(error_at(burst, "`burst` needs a `limit` beside it")),
            None => Ok(None),
        },
    }
}

/// The smallest burst of `limits` (unlimited ones have none); the largest burst if none has.
fn least_burst<'l>(limits: impl Iterator<Item = &'l RuleLimit>) -> u64 {
    limits
        .filter_map(|l| match l {
            RuleLimit::Limited(limit) => Some(limit.burst()),
            RuleLimit::Unlimited => None,
        })
        .min()
        .unwrap_or(crate::MAX_BURST)
}

fn parse_failure_mode(node: &Node<'_>) -> Result<FailureMode, PolicyError> {
    match yaml::string(node, "`failure_mode`")? {
        "open" => Ok(FailureMode::Open),
        "closed" => Ok(FailureMode::Closed),
        other => Err(error_at(
            node,
            format!("failure_mode `{other}`: expected open or closed"),
        )),
    }
}

fn parse_mode(node: &Node<'_>) -> Result<Mode, PolicyError> {
    match yaml::string(node, "`mode`")? {
        "enforce" => Ok(Mode::Enforce),
        "shadow" => Ok(Mode::Shadow),
        other => Err(error_at(
            node,
            format!("mode `{other}`: expected enforce or shadow"),
        )),
    }
}

fn parse_key(node: &Node<'_>) -> Result<Vec<KeyPart>, PolicyError> {
    let mut parts = Vec::new();
    for (text, item) in yaml::strings(node, "`key`")? {
        let part = KeyPart::from_name(text).ok_or_else(|| {
            let names: Vec<&str> = KeyPart::ALL.iter().map(|p| p.name()).collect();
            error_at(
                item,
                format!(
                    "unknown key part `{text}`; expected one of: {}",
                    names.join(", ")
                ),
            )
        })?;
        if parts.contains(&part) {
            return Err(error_at(item, format!("key part `{text}` is listed twice")));
        }
        parts.push(part);
    }
    if parts.is_empty() {
        return Err(error_at(
            node,
            "`key` needs at least one part (e.g. `user`)",
        ));
    }
    if parts.len() > 1 && parts.contains(&KeyPart::Global) {
        return Err(error_at(
            node,
            "`global` is one key for everyone: it cannot be combined",
        ));
    }
    Ok(parts)
}
