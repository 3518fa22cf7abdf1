//! Metered rules (`cost_from:`): a rule whose cost is not fixed but read from the request or,
//! known only once the response is done, from the response (an LLM's tokens, response bytes,
//! compute units).
//!
//! - `request_header: NAME`: the request says its cost (input tokens a gateway counted). The
//!   check takes that cost before the request goes on, like any fixed cost.
//! - `response_header: NAME`: before the request, a peek asks that its key has `estimate` units
//!   left (by default 1: any budget at all), taking nothing; after the response, its cost (the
//!   header, a trailer, or what the service reports) is charged, never refused, so the key may
//!   be left owing and its next requests wait the debt out. A gateway charges before it returns
//!   the response, so the most a key can be over its limit is one response's cost for each
//!   request in flight when its budget ran out.
//!
//! A cost the request or response does not carry as a whole decimal number (missing, cut off,
//! garbled) is `missing` units (by default the estimate for a response, 1 for a request).

use std::sync::Arc;

use super::error::PolicyError;
use super::yaml::{self, Fields, Node, error_at};
use crate::MAX_BURST;

/// Fields of a `cost_from:` mapping.
const COST_FROM_FIELDS: &[&str] = &["request_header", "response_header", "estimate", "missing"];
/// Longest header name `cost_from:` may name.
const MAX_HEADER_NAME: usize = 64;

/// Where a metered rule's cost comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CostSource {
    /// A request header (lower-case name): the cost is known before the request goes on.
    RequestHeader(Arc<str>),
    /// A response header or trailer (lower-case name), or the value a service reports under
    /// that name: the cost is charged after the response.
    Response(Arc<str>),
}

/// A rule's `cost_from:`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CostFrom {
    pub(crate) source: CostSource,
    /// Response costs: units a request must find left before it goes on (a peek).
    pub(crate) estimate: u64,
    /// Units a request or response that carries no valid cost is charged.
    pub(crate) missing: u64,
}

impl CostFrom {
    pub fn source(&self) -> &CostSource {
        &self.source
    }

    pub fn estimate(&self) -> u64 {
        self.estimate
    }

    pub fn missing(&self) -> u64 {
        self.missing
    }

    /// The cost a request header's value says: a whole decimal number, else `missing`.
    pub fn cost_of(&self, value: Option<&str>) -> u64 {
        value.and_then(cost_in).unwrap_or(self.missing)
    }
}

/// A cost charged once a request's response is done: the name it is read under, and what is
/// charged when the response carries none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseCost {
    pub name: Arc<str>,
    pub missing: u64,
}

/// The units a header or trailer value says: a whole decimal number (spaces around it
/// allowed), else `None` (the rule's `missing` is charged).
pub fn cost_in(value: &str) -> Option<u64> {
    let text = value.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // All digits: only an overflow fails, a cost far past any limit's debt anyway.
    Some(text.parse().unwrap_or(u64::MAX))
}

/// Reads a rule's `cost_from:` (`None` without one), checked against its other fields and
/// `least_burst`, the least burst of its limits (more could never pass).
pub(super) fn parse_cost_from(
    fields: &Fields<'_, '_>,
    least_burst: u64,
) -> Result<Option<CostFrom>, PolicyError> {
    let Some(node) = fields.get("cost_from") else {
        return Ok(None);
    };
    if let Some(cost) = fields.get("cost") {
        return Err(error_at(
            cost,
            "a rule takes its cost from `cost` or from `cost_from`, not both",
        ));
    }
    let cost_from = Fields::new(node, "`cost_from`", COST_FROM_FIELDS)?;
    let source = match (
        cost_from.get("request_header"),
        cost_from.get("response_header"),
    ) {
        (Some(name), None) => CostSource::RequestHeader(header_name(name)?),
        (None, Some(name)) => CostSource::Response(header_name(name)?),
        _ => {
            return Err(error_at(
                node,
                "`cost_from` names one header: `request_header: NAME` (a cost known before the \
                 request) or `response_header: NAME` (charged after the response)",
            ));
        }
    };
    let response = matches!(source, CostSource::Response(_));
    let estimate = match cost_from.get("estimate") {
        Some(n) if !response => {
            return Err(error_at(
                n,
                "`estimate` is for response costs: a request header's cost is checked whole",
            ));
        }
        Some(n) => units(n, "`estimate`", least_burst)?,
        None => 1.min(least_burst),
    };
    let missing = match cost_from.get("missing") {
        // A request's cost must be able to pass; a charge after the fact may take anything.
        Some(n) => units(
            n,
            "`missing`",
            if response { MAX_BURST } else { least_burst },
        )?,
        None if response => estimate,
        None => 1,
    };
    if response && let Some(lease) = fields.get("lease_above") {
        return Err(error_at(
            lease,
            "a rule with a response cost is charged at its key's owner: it takes no `lease_above`",
        ));
    }
    Ok(Some(CostFrom {
        source,
        estimate,
        missing,
    }))
}

/// A number of units from 0 to `most` (the least burst of the rule's limits: more could never
/// pass).
fn units(node: &Node<'_>, what: &str, most: u64) -> Result<u64, PolicyError> {
    let n = yaml::unsigned(node, what)?;
    if n > most {
        return Err(error_at(
            node,
            format!(
                "{what} {n} exceeds {most}, the least burst of the rule's limits: it could never pass"
            ),
        ));
    }
    Ok(n)
}

/// A header name: 1 to 64 of the characters HTTP allows in one, kept lower-case.
fn header_name(node: &Node<'_>) -> Result<Arc<str>, PolicyError> {
    let name = yaml::string(node, "a header name")?;
    let valid = !name.is_empty()
        && name.len() <= MAX_HEADER_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    if !valid {
        return Err(error_at(
            node,
            format!(
                "`{name}` is not a header name (1 to {MAX_HEADER_NAME} letters, digits and \
                 !#$%&'*+-.^_`|~)"
            ),
        ));
    }
    Ok(Arc::from(name.to_ascii_lowercase()))
}
