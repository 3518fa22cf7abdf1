//! The limit settings of a rule: `limit`, `burst`, `algorithm`, per-plan limits, `cost` and
//! `max_wait`, validated through [`Limit::new`] with errors at the offending value.

use super::error::PolicyError;
use super::rules::RuleLimit;
use super::yaml::{self, Fields, Node, error_at};
use crate::{
    Algorithm, Limit, LimitError, MAX_BURST, NANOS_PER_SEC, parse_duration_ns, parse_rate,
};

/// Longest `max_wait` a rule may ask for: a request held longer than this is worse than a 429.
pub const MAX_WAIT_NS: u64 = 10 * NANOS_PER_SEC;

const PLAN_LIMIT_FIELDS: &[&str] = &["limit", "burst", "algorithm", "unlimited"];

/// Checks that `name` is a declared plan.
pub(super) fn known_plan(node: &Node<'_>, name: &str, plans: &[String]) -> Result<(), PolicyError> {
    if plans.iter().any(|p| p == name) {
        return Ok(());
    }
    let declared = if plans.is_empty() {
        "none; list them under `plans:`".to_owned()
    } else {
        plans.join(", ")
    };
    Err(error_at(
        node,
        format!("unknown plan `{name}` (declared plans: {declared})"),
    ))
}

pub(super) fn parse_algorithm(node: &Node<'_>) -> Result<Algorithm, PolicyError> {
    yaml::string(node, "`algorithm`")?
        .parse()
        .map_err(|e: LimitError| error_at(node, e.to_string()))
}

/// `limit: RATE` (with an optional `burst`) or `limit: unlimited`.
pub(super) fn parse_limit(
    limit_node: &Node<'_>,
    burst_node: Option<&Node<'_>>,
    algorithm: Algorithm,
) -> Result<RuleLimit, PolicyError> {
    let text = yaml::string(
        limit_node,
        "`limit` (a rate like `100/min`, or `unlimited`)",
    )?;
    if text == "unlimited" {
        if let Some(burst) = burst_node {
            return Err(error_at(burst, "an unlimited limit has no `burst`"));
        }
        return Ok(RuleLimit::Unlimited);
    }
    let (rate, period_ns) = parse_rate(text).map_err(|e| error_at(limit_node, e.to_string()))?;
    let burst = match burst_node {
        Some(n) => yaml::unsigned(n, "`burst`")?,
        None => rate,
    };
    Limit::new(algorithm, rate, period_ns, burst)
        .map(RuleLimit::Limited)
        .map_err(|e| {
            let about_burst = matches!(
                e,
                LimitError::ZeroBurst
                    | LimitError::BurstTooHigh { .. }
                    | LimitError::BurstOnWindow { .. }
            );
            let at = burst_node.filter(|_| about_burst).unwrap_or(limit_node);
            error_at(at, e.to_string())
        })
}

/// A rule's `plans:` mapping: `plan: RATE`, `plan: unlimited`, or a mapping with `limit`,
/// `burst`, `algorithm` or `unlimited: true`. The rule's algorithm applies unless overridden;
/// the burst defaults to the plan's own rate, not the rule's burst.
pub(super) fn parse_rule_plans(
    node: &Node<'_>,
    plans: &[String],
    algorithm: Algorithm,
) -> Result<Vec<(String, RuleLimit)>, PolicyError> {
    let mut out = Vec::new();
    for (plan, key_node, value) in yaml::mapping(node, "`plans`")? {
        known_plan(key_node, plan, plans)?;
        let limit = if matches!(value.data, saphyr::YamlData::Mapping(_)) {
            let fields = Fields::new(value, "a plan's limit", PLAN_LIMIT_FIELDS)?;
            let algorithm = match fields.get("algorithm") {
                Some(n) => parse_algorithm(n)?,
                None => algorithm,
            };
            match (fields.get("unlimited"), fields.get("limit")) {
                (Some(u), None) if yaml::boolean(u, "`unlimited`")? => {
                    if let Some(other) = fields.get("burst").or(fields.get("algorithm")) {
                        return Err(error_at(other, "an unlimited plan has no other settings"));
                    }
                    RuleLimit::Unlimited
                }
                (Some(u), _) => {
                    return Err(error_at(
                        u,
                        "write either `limit: RATE` or `unlimited: true`",
                    ));
                }
                (None, Some(limit)) => parse_limit(limit, fields.get("burst"), algorithm)?,
                (None, None) => {
                    return Err(error_at(value, "missing field `limit` in a plan's limit"));
                }
            }
        } else {
            parse_limit(value, None, algorithm)?
        };
        out.push((plan.to_owned(), limit));
    }
    Ok(out)
}

/// `cost: N`, at least 1 and within every limit's burst (a larger cost could never pass).
pub(super) fn parse_cost<'l>(
    node: &Node<'_>,
    limits: impl Iterator<Item = &'l RuleLimit>,
) -> Result<u64, PolicyError> {
    let cost = yaml::unsigned(node, "`cost`")?;
    if cost == 0 || cost > MAX_BURST {
        return Err(error_at(
            node,
            format!("cost must be between 1 and {MAX_BURST}"),
        ));
    }
    for limit in limits {
        if let RuleLimit::Limited(l) = limit
            && cost > l.burst()
        {
            return Err(error_at(
                node,
                format!(
                    "cost {cost} exceeds the burst {} of `{l}`: it could never pass",
                    l.burst()
                ),
            ));
        }
    }
    Ok(cost)
}

pub(super) fn parse_max_wait(node: &Node<'_>) -> Result<u64, PolicyError> {
    let text = yaml::string(node, "`max_wait` (a duration like `500ms`)")?;
    let ns = parse_duration_ns(text).map_err(|e| error_at(node, e.to_string()))?;
    if ns > MAX_WAIT_NS {
        return Err(error_at(
            node,
            format!("max_wait `{text}` is above the maximum of 10s: answer 429 instead"),
        ));
    }
    Ok(ns)
}

/// `lease_above: RATE` (e.g. `500/s`): the per-gateway rate of a key from which gateways decide it
/// against token leases, as whole checks per second (at least 1/s).
pub(super) fn parse_lease_above(node: &Node<'_>) -> Result<u64, PolicyError> {
    let text = yaml::string(node, "`lease_above` (a rate like `500/s`)")?;
    let (count, period_ns) =
        crate::limit::parse_rate(text).map_err(|e| error_at(node, e.to_string()))?;
    let per_sec = u128::from(count) * u128::from(crate::NANOS_PER_SEC) / u128::from(period_ns);
    match u64::try_from(per_sec) {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(error_at(
            node,
            format!(
                "lease_above `{text}` is below 1/s: a key that rare gains nothing from a lease"
            ),
        )),
    }
}
