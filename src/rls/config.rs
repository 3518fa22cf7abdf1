//! envoyproxy/ratelimit's configuration files (unchanged format) into a validated tree per domain.
//!
//! A file holds one `domain` and nested `descriptors` (`key`, optional `value`, `rate_limit`,
//! `shadow_mode`, `detailed_metric`, `descriptors`). `rate_limit` holds `unit`,
//! `requests_per_unit`, `unlimited`, `name`, `replaces: [{name}]`, plus floodgate's optional
//! `algorithm` and `burst`. Without those the limit is a fixed window, like envoyproxy/ratelimit.
//! floodgate's `metered: true` (and `estimate: N`, default 1) makes a rule's hits a cost known
//! after the fact: a descriptor with no hits (or `hits_addend` 0) asks that `estimate` units
//! are left, taking nothing; one with hits is charged them, never refused (Envoy's
//! `apply_on_stream_done` descriptors, whose `hits_addend` reads the response).

use std::fmt;
use std::sync::Arc;

use hashbrown::HashMap;

use crate::limit::{Algorithm, Limit, NANOS_PER_SEC};
use crate::policy::PolicyError;
use crate::policy::yaml::{self, Fields, Node};

/// Most descriptors (at every level, over all files) one configuration may hold.
pub const MAX_DESCRIPTORS: usize = 100_000;

/// The time unit of a `rate_limit`, numbered as in the RLS proto.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    Second = 1,
    Minute = 2,
    Hour = 3,
    Day = 4,
    Month = 5,
    Year = 6,
    Week = 7,
}

impl Unit {
    const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Month,
        Unit::Year,
        Unit::Week,
    ];

    /// Case-insensitive, as envoyproxy/ratelimit reads it.
    pub fn from_name(name: &str) -> Option<Unit> {
        Unit::ALL
            .into_iter()
            .find(|u| u.name().eq_ignore_ascii_case(name))
    }

    /// The proto enum number (`UNKNOWN` is 0 and never a `Unit`).
    pub fn from_proto(number: i32) -> Option<Unit> {
        Unit::ALL.into_iter().find(|u| *u as i32 == number)
    }

    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Month => "month",
            Unit::Year => "year",
            Unit::Week => "week",
        }
    }

    /// The window length; months are 30 days and years 365, as envoyproxy/ratelimit counts them.
    pub fn period_ns(self) -> u64 {
        let seconds = match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        };
        seconds * NANOS_PER_SEC
    }
}

/// A limit that counts: `requests_per_unit` per `unit`, decided by `limit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counted {
    pub requests_per_unit: u32,
    pub unit: Unit,
    pub limit: Limit,
    /// `metered: true`: the units a descriptor without hits asks to be left (`estimate`);
    /// hits are charged after the fact. `None`: hits are taken as any check's cost.
    pub metered_estimate: Option<u64>,
}

impl Counted {
    /// Builds the core limit: a fixed window unless `algorithm`/`burst` ask otherwise.
    pub fn new(
        requests_per_unit: u32,
        unit: Unit,
        algorithm: Algorithm,
        burst: Option<u64>,
    ) -> Result<Counted, String> {
        let rate = u64::from(requests_per_unit);
        if rate == 0 {
            return Err(
                "requests_per_unit must be at least 1 (floodgate has no limit that refuses everything; remove the descriptor's rate_limit or use a small limit)"
                    .to_owned(),
            );
        }
        let burst = match (algorithm, burst) {
            (Algorithm::Gcra, b) => b.unwrap_or(rate),
            (_, None) => rate,
            (_, Some(_)) => {
                return Err(format!(
                    "`burst` is a gcra setting; add `algorithm: gcra` or remove it (the {algorithm} limit is requests_per_unit per window)"
                ));
            }
        };
        let limit =
            Limit::new(algorithm, rate, unit.period_ns(), burst).map_err(|e| e.to_string())?;
        Ok(Counted {
            requests_per_unit,
            unit,
            limit,
            metered_estimate: None,
        })
    }
}

/// The `rate_limit` of a descriptor, with what metrics and answers need to name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateRule {
    /// `domain.key_value.key…`, the path of the descriptor in the file: names it in metrics.
    pub full_key: String,
    /// `rate_limit.name`, if given.
    pub name: Option<String>,
    /// Names of rules this one drops when both match a request.
    pub replaces: Vec<String>,
    pub shadow_mode: bool,
    pub detailed_metric: bool,
    /// `None` for `unlimited: true`.
    pub counted: Option<Counted>,
}

impl RateRule {
    /// What answers and metrics call this rule: its `name`, else its path.
    pub fn display_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.full_key)
    }
}

/// One level of descriptors: by `key` or `key_value`, and the wildcard ones (`key_api*`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Level {
    pub(crate) by_key: HashMap<String, Descriptor>,
    /// Keys ending in `*`, in file order: the first prefix match wins.
    pub(crate) wildcards: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Descriptor {
    pub(crate) rule: Option<Arc<RateRule>>,
    pub(crate) children: Level,
}

/// Every domain's descriptor tree.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RlsConfig {
    pub(crate) domains: HashMap<String, Level>,
}

/// A configuration file refused: which file, and where in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RlsConfigError {
    pub file: String,
    pub error: PolicyError,
}

impl fmt::Display for RlsConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.error.in_file(&self.file))
    }
}

impl std::error::Error for RlsConfigError {}

impl RlsConfig {
    /// Reads files given as (name, text), in order; a domain may appear in one file only.
    pub fn from_files<'a>(
        files: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<RlsConfig, RlsConfigError> {
        let mut config = RlsConfig::default();
        let mut count = 0usize;
        for (file, text) in files {
            let in_file = |error| RlsConfigError {
                file: file.to_owned(),
                error,
            };
            let root = yaml::load(text).map_err(in_file)?;
            let fields =
                Fields::new(&root, "the file", &["domain", "descriptors"]).map_err(in_file)?;
            let domain_node = fields.require("domain").map_err(in_file)?;
            let domain = yaml::string(domain_node, "`domain`").map_err(in_file)?;
            if domain.is_empty() {
                return Err(in_file(yaml::error_at(
                    domain_node,
                    "`domain` is empty; name the domain Envoy sends",
                )));
            }
            if config.domains.contains_key(domain) {
                return Err(in_file(yaml::error_at(
                    domain_node,
                    format!("domain `{domain}` is already defined by another file"),
                )));
            }
            let mut level = Level::default();
            if let Some(descriptors) = fields.get("descriptors") {
                load_level(&mut level, descriptors, domain, &mut count).map_err(in_file)?;
            }
            config.domains.insert(domain.to_owned(), level);
        }
        Ok(config)
    }

    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    pub fn domain_count(&self) -> usize {
        self.domains.len()
    }

    /// The rule for a descriptor's entries, by envoyproxy/ratelimit's rules: at each level the
    /// `key_value` match, else the first wildcard whose prefix matches, else the `key` default;
    /// the rule found at the node of the last entry applies; `None` when nothing does.
    pub fn find(&self, domain: &str, entries: &[(&str, &str)]) -> Option<Arc<RateRule>> {
        self.find_in(domain, entries.iter().copied())
    }

    /// [`find`](RlsConfig::find) over entries as the caller holds them.
    pub fn find_in<'e>(
        &self,
        domain: &str,
        entries: impl ExactSizeIterator<Item = (&'e str, &'e str)>,
    ) -> Option<Arc<RateRule>> {
        let mut level = self.domains.get(domain)?;
        let mut found = None;
        let last = entries.len().checked_sub(1)?;
        for (i, (key, value)) in entries.enumerate() {
            let Some(next) = level.step(key, value) else {
                break;
            };
            if i == last {
                found = next.rule.clone();
            }
            if next.children.by_key.is_empty() {
                break;
            }
            level = &next.children;
        }
        found
    }

    /// The rule for an unordered set of entries (an Envoy RLQS `BucketId`, a map): the order is
    /// taken from the descriptor tree. Each entry is tried where it can be placed at each level
    /// (by `Level::step`, as [`find`] matches), in key order, going back when a choice leads
    /// nowhere; the first order that places every entry on a descriptor with a rule gives the
    /// rule. `None` when none does, or when [`MAX_UNORDERED_STEPS`] tries did not settle it.
    ///
    /// [`find`]: RlsConfig::find
    pub fn find_unordered(&self, domain: &str, entries: &[(&str, &str)]) -> Option<Arc<RateRule>> {
        let level = self.domains.get(domain)?;
        if entries.is_empty() {
            return None;
        }
        let mut sorted: Vec<(&str, &str)> = entries.to_vec();
        sorted.sort_unstable();
        let mut used = vec![false; sorted.len()];
        let mut budget = MAX_UNORDERED_STEPS;
        place(level, &sorted, &mut used, sorted.len(), &mut budget)
    }
}

/// Most entry placements [`RlsConfig::find_unordered`] tries for one map: the search can go
/// back, and a hostile map over a deep tree must not make it run long.
pub const MAX_UNORDERED_STEPS: usize = 4_096;

/// Places the `left` unused entries from `level` down; recursion descends one level per entry
/// placed, so its depth is at most the number of entries.
fn place(
    level: &Level,
    entries: &[(&str, &str)],
    used: &mut [bool],
    left: usize,
    budget: &mut usize,
) -> Option<Arc<RateRule>> {
    for i in 0..entries.len() {
        if used[i] {
            continue;
        }
        *budget = budget.checked_sub(1)?;
        let (key, value) = entries[i];
        let Some(next) = level.step(key, value) else {
            continue;
        };
        if left == 1 {
            if let Some(rule) = &next.rule {
                return Some(rule.clone());
            }
            continue;
        }
        if next.children.by_key.is_empty() {
            continue;
        }
        used[i] = true;
        let found = place(&next.children, entries, used, left - 1, budget);
        used[i] = false;
        if found.is_some() {
            return found;
        }
    }
    None
}

impl Level {
    /// Where one entry leads from this level, by envoyproxy/ratelimit's rules: the `key_value`
    /// match, else the first wildcard whose prefix matches, else the `key` default.
    fn step(&self, key: &str, value: &str) -> Option<&Descriptor> {
        // `key_value` is joined on the stack when it fits: this runs for every entry of every
        // descriptor Envoy sends.
        let mut on_stack = [0u8; JOINED_ON_STACK];
        let long;
        let key_value = match join(&mut on_stack, key, value) {
            Some(joined) => joined,
            None => {
                long = format!("{key}_{value}");
                long.as_str()
            }
        };
        self.by_key
            .get(key_value)
            .or_else(|| {
                self.wildcards
                    .iter()
                    .find(|w| key_value.starts_with(w.trim_end_matches('*')))
                    .and_then(|w| self.by_key.get(w.as_str()))
            })
            .or_else(|| self.by_key.get(key))
    }
}

/// Longest `key_value` a lookup joins without allocating.
const JOINED_ON_STACK: usize = 256;

/// `{key}_{value}` in `buffer`, or `None` when it does not fit.
fn join<'b>(buffer: &'b mut [u8; JOINED_ON_STACK], key: &str, value: &str) -> Option<&'b str> {
    let joined = buffer.get_mut(..key.len() + 1 + value.len())?;
    let (key_part, rest) = joined.split_at_mut(key.len());
    key_part.copy_from_slice(key.as_bytes());
    rest[0] = b'_';
    rest[1..].copy_from_slice(value.as_bytes());
    // Two strs joined by an ASCII byte are UTF-8; checked rather than assumed.
    std::str::from_utf8(joined).ok()
}

const DESCRIPTOR_FIELDS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "detailed_metric",
];
const RATE_LIMIT_FIELDS: &[&str] = &[
    "unit",
    "requests_per_unit",
    "unlimited",
    "name",
    "replaces",
    "algorithm",
    "burst",
    "metered",
    "estimate",
];

fn load_level(
    level: &mut Level,
    node: &Node<'_>,
    parent: &str,
    count: &mut usize,
) -> Result<(), PolicyError> {
    for item in yaml::sequence(node, "`descriptors`")? {
        *count += 1;
        if *count > MAX_DESCRIPTORS {
            return Err(yaml::error_at(
                item,
                format!("more than {MAX_DESCRIPTORS} descriptors"),
            ));
        }
        let fields = Fields::new(item, "a descriptor", DESCRIPTOR_FIELDS)?;
        let key_node = fields.require("key")?;
        let key = yaml::string(key_node, "`key`")?;
        if key.is_empty() {
            return Err(yaml::error_at(key_node, "descriptor has an empty `key`"));
        }
        let value = match fields.get("value") {
            Some(v) => scalar_text(v, "`value`")?,
            None => String::new(),
        };
        let final_key = if value.is_empty() {
            key.to_owned()
        } else {
            format!("{key}_{value}")
        };
        let full_key = format!("{parent}.{final_key}");
        if level.by_key.contains_key(&final_key) {
            return Err(yaml::error_at(
                item,
                format!("duplicate descriptor `{full_key}`"),
            ));
        }
        let flag = |name: &str| {
            fields
                .get(name)
                .map(|n| yaml::boolean(n, name))
                .transpose()
                .map(Option::unwrap_or_default)
        };
        let shadow_mode = flag("shadow_mode")?;
        let detailed_metric = flag("detailed_metric")?;
        let rule = fields
            .get("rate_limit")
            .map(|n| load_rule(n, &full_key, shadow_mode, detailed_metric))
            .transpose()?
            .map(Arc::new);
        let mut children = Level::default();
        if let Some(descriptors) = fields.get("descriptors") {
            load_level(&mut children, descriptors, &full_key, count)?;
        }
        if final_key.ends_with('*') {
            level.wildcards.push(final_key.clone());
        }
        level
            .by_key
            .insert(final_key, Descriptor { rule, children });
    }
    Ok(())
}

fn load_rule(
    node: &Node<'_>,
    full_key: &str,
    shadow_mode: bool,
    detailed_metric: bool,
) -> Result<RateRule, PolicyError> {
    let fields = Fields::new(node, "`rate_limit`", RATE_LIMIT_FIELDS)?;
    let unlimited = match fields.get("unlimited") {
        Some(n) => yaml::boolean(n, "`unlimited`")?,
        None => false,
    };
    let name = fields
        .get("name")
        .map(|n| yaml::string(n, "`name`").map(str::to_owned))
        .transpose()?
        .filter(|n| !n.is_empty());
    let replaces = match fields.get("replaces") {
        Some(list) => load_replaces(list, name.as_deref())?,
        None => Vec::new(),
    };
    let unit = load_unit(&fields)?;
    let counted = if unlimited {
        if let Some((_, n)) = unit {
            return Err(yaml::error_at(
                n,
                "should not specify a rate limit unit when `unlimited: true`",
            ));
        }
        None
    } else {
        let (unit, _) = unit.ok_or_else(|| {
            yaml::error_at(node, "`rate_limit` needs a `unit` (or `unlimited: true`)")
        })?;
        Some(load_counted(&fields, unit)?)
    };
    Ok(RateRule {
        full_key: full_key.to_owned(),
        name,
        replaces,
        shadow_mode,
        detailed_metric,
        counted,
    })
}

/// `replaces`: the names of the rules this one replaces, none empty and not its own `name`.
fn load_replaces(list: &Node<'_>, name: Option<&str>) -> Result<Vec<String>, PolicyError> {
    let mut replaces = Vec::new();
    for entry in yaml::sequence(list, "`replaces`")? {
        let entry_fields = Fields::new(entry, "a `replaces` entry", &["name"])?;
        let name_node = entry_fields.require("name")?;
        let replaced = yaml::string(name_node, "`name`")?;
        if replaced.is_empty() {
            return Err(yaml::error_at(
                name_node,
                "a `replaces` entry has an empty name",
            ));
        }
        if name == Some(replaced) {
            return Err(yaml::error_at(
                name_node,
                "a rule cannot replace itself (`replaces` names this rule's own `name`)",
            ));
        }
        replaces.push(replaced.to_owned());
    }
    Ok(replaces)
}

/// `unit`, and its node (for the error when the rule is unlimited).
fn load_unit<'n, 'a>(fields: &Fields<'n, 'a>) -> Result<Option<(Unit, &'n Node<'a>)>, PolicyError> {
    fields
        .get("unit")
        .map(|n| {
            let text = yaml::string(n, "`unit`")?;
            Unit::from_name(text).map(|u| (u, n)).ok_or_else(|| {
                yaml::error_at(
                    n,
                    format!(
                        "invalid rate limit unit `{text}`; expected second, minute, hour, day, week, month or year"
                    ),
                )
            })
        })
        .transpose()
}

/// A counted rule's limit: `requests_per_unit` per `unit`, its `algorithm`, `burst` and metered
/// estimate.
fn load_counted(fields: &Fields<'_, '_>, unit: Unit) -> Result<Counted, PolicyError> {
    let rpu_node = fields.require("requests_per_unit")?;
    let rpu = yaml::unsigned(rpu_node, "`requests_per_unit`")?;
    let rpu = u32::try_from(rpu)
        .map_err(|_| yaml::error_at(rpu_node, "`requests_per_unit` is above 4294967295"))?;
    let algorithm = fields
        .get("algorithm")
        .map(|n| {
            let text = yaml::string(n, "`algorithm`")?;
            text.parse::<Algorithm>()
                .map_err(|e| yaml::error_at(n, e.to_string()))
        })
        .transpose()?
        .unwrap_or(Algorithm::FixedWindow);
    let burst = fields
        .get("burst")
        .map(|n| yaml::unsigned(n, "`burst`"))
        .transpose()?;
    let at = fields
        .get("burst")
        .or(fields.get("algorithm"))
        .unwrap_or(rpu_node);
    let mut counted =
        Counted::new(rpu, unit, algorithm, burst).map_err(|e| yaml::error_at(at, e))?;
    counted.metered_estimate = metered_estimate(fields, counted.limit.burst())?;
    Ok(counted)
}

/// A rule's `metered` and `estimate`: `Some(estimate)` for a metered rule.
fn metered_estimate(fields: &Fields<'_, '_>, burst: u64) -> Result<Option<u64>, PolicyError> {
    let metered = match fields.get("metered") {
        Some(n) => yaml::boolean(n, "`metered`")?,
        None => false,
    };
    let Some(n) = fields.get("estimate") else {
        return Ok(metered.then_some(1));
    };
    if !metered {
        return Err(yaml::error_at(
            n,
            "`estimate` belongs to a rule with `metered: true`",
        ));
    }
    let estimate = yaml::unsigned(n, "`estimate`")?;
    if estimate > burst {
        return Err(yaml::error_at(
            n,
            format!("estimate {estimate} exceeds the limit's burst {burst}: it could never pass"),
        ));
    }
    Ok(Some(estimate))
}

/// A scalar as text: envoyproxy/ratelimit's YAML reads `value: 200` as the string "200".
fn scalar_text(node: &Node<'_>, what: &str) -> Result<String, PolicyError> {
    use saphyr::{Scalar, YamlData};
    match &node.data {
        YamlData::Value(Scalar::String(s)) => Ok(s.to_string()),
        YamlData::Value(Scalar::Integer(i)) => Ok(i.to_string()),
        YamlData::Value(Scalar::Boolean(b)) => Ok(b.to_string()),
        YamlData::Value(Scalar::Null) => Ok(String::new()),
        _ => Err(yaml::error_at(
            node,
            format!(
                "expected a string for {what}, found {}",
                yaml::describe(node)
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "\
domain: edge
descriptors:
  - key: generic_key
    value: slow
    rate_limit:
      unit: minute
      requests_per_unit: 3
      name: slow-rule
  - key: remote_address
    rate_limit:
      unit: SECOND
      requests_per_unit: 10
  - key: path
    value: api*
    rate_limit:
      unit: hour
      requests_per_unit: 100
  - key: user
    value: admin
    rate_limit:
      unlimited: true
  - key: destination
    descriptors:
      - key: source
        value: internal
        shadow_mode: true
        rate_limit:
          unit: day
          requests_per_unit: 5
          algorithm: gcra
          burst: 2
          replaces:
            - name: slow-rule
";

    fn config() -> RlsConfig {
        RlsConfig::from_files([("edge.yaml", EXAMPLE)]).unwrap()
    }

    fn err(text: &str) -> String {
        RlsConfig::from_files([("bad.yaml", text)])
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn metered_takes_an_estimate_the_limit_can_pass() {
        let ok = RlsConfig::from_files([(
            "m.yaml",
            "domain: d\ndescriptors:\n  - key: t\n    rate_limit: {unit: minute, requests_per_unit: 5, metered: true}\n",
        )]);
        assert!(ok.is_ok());
        let alone = err(
            "domain: d\ndescriptors:\n  - key: t\n    rate_limit: {unit: minute, requests_per_unit: 5, estimate: 2}\n",
        );
        assert!(
            alone.contains("`estimate` belongs to a rule with `metered: true`"),
            "{alone}"
        );
        let large = err(
            "domain: d\ndescriptors:\n  - key: t\n    rate_limit: {unit: minute, requests_per_unit: 5, metered: true, estimate: 6}\n",
        );
        assert!(large.contains("exceeds the limit's burst 5"), "{large}");
    }

    #[test]
    fn a_value_match_comes_before_the_key_default() {
        let c = config();
        let rule = c.find("edge", &[("generic_key", "slow")]).unwrap();
        assert_eq!(rule.display_name(), "slow-rule");
        let counted = rule.counted.as_ref().unwrap();
        assert_eq!((counted.requests_per_unit, counted.unit), (3, Unit::Minute));
        assert_eq!(counted.limit.algorithm(), Algorithm::FixedWindow);
        assert!(c.find("edge", &[("generic_key", "fast")]).is_none());
        let by_key = c.find("edge", &[("remote_address", "10.0.0.1")]).unwrap();
        assert_eq!(by_key.full_key, "edge.remote_address");
    }

    #[test]
    fn unordered_entries_take_their_order_from_the_tree() {
        let c = config();
        // "source" sorts after "destination", but either order finds the nested rule.
        let nested = [("source", "internal"), ("destination", "db")];
        let rule = c.find_unordered("edge", &nested).unwrap();
        assert_eq!(rule.full_key, "edge.destination.source_internal");
        let mut reversed = nested;
        reversed.reverse();
        assert_eq!(c.find_unordered("edge", &reversed), Some(rule));
        let one = c
            .find_unordered("edge", &[("generic_key", "slow")])
            .unwrap();
        assert_eq!(one.display_name(), "slow-rule");
        assert!(
            c.find_unordered("edge", &[("generic_key", "fast")])
                .is_none()
        );
        // An entry left over once a leaf is reached, or an unknown domain: no rule.
        let extra = [("generic_key", "slow"), ("other", "x")];
        assert!(c.find_unordered("edge", &extra).is_none());
        assert!(
            c.find_unordered("nowhere", &[("generic_key", "slow")])
                .is_none()
        );
        assert!(c.find_unordered("edge", &[]).is_none());
    }

    #[test]
    fn a_key_value_past_the_stack_buffer_matches_as_a_short_one_does() {
        // `key_value` past JOINED_ON_STACK is joined on the heap: exact, wildcard and `key`
        // matches must not tell the two apart.
        let long = "v".repeat(JOINED_ON_STACK);
        let text = format!(
            "domain: d\ndescriptors:\n  - key: exact\n    value: {long}\n    rate_limit: {{unit: second, requests_per_unit: 1, name: exact}}\n  - key: wild\n    value: vvv*\n    rate_limit: {{unit: second, requests_per_unit: 2, name: wild}}\n  - key: any\n    rate_limit: {{unit: second, requests_per_unit: 3, name: any}}\n"
        );
        let c = RlsConfig::from_files([("d.yaml", text.as_str())]).unwrap();
        let name =
            |entries: &[(&str, &str)]| c.find("d", entries).map(|r| r.display_name().to_owned());
        assert_eq!(name(&[("exact", &long)]).as_deref(), Some("exact"));
        assert_eq!(name(&[("exact", &long[1..])]), None);
        assert_eq!(name(&[("wild", &long)]).as_deref(), Some("wild"));
        assert_eq!(name(&[("wild", "vvvshort")]).as_deref(), Some("wild"));
        assert_eq!(name(&[("any", &long)]).as_deref(), Some("any"));
        assert_eq!(name(&[("any", "short")]).as_deref(), Some("any"));
    }

    #[test]
    fn unordered_entries_go_back_when_the_first_placement_leads_nowhere() {
        // Key order tries `a` first at the top, which leads to `c` only; `b` then `a` matches.
        let text = "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: c\n        rate_limit: {unit: second, requests_per_unit: 1}\n  - key: b\n    descriptors:\n      - key: a\n        rate_limit: {unit: second, requests_per_unit: 2, name: b-then-a}\n";
        let c = RlsConfig::from_files([("d.yaml", text)]).unwrap();
        let rule = c.find_unordered("d", &[("a", "1"), ("b", "2")]).unwrap();
        assert_eq!(rule.display_name(), "b-then-a");
        assert_eq!(c.find("d", &[("b", "2"), ("a", "1")]), Some(rule));
        // Every order of the entries of a nested rule gives what `find` gives in the tree's order.
        let nested = [("destination", "db"), ("source", "internal")];
        let expected = config().find("edge", &nested);
        assert!(expected.is_some());
        assert_eq!(
            config().find_unordered("edge", &[nested[1], nested[0]]),
            expected
        );
    }

    #[test]
    fn a_hostile_map_is_bounded_by_the_step_budget() {
        // Every entry matches the `k` default at each of 6 levels and none reaches a rule:
        // without the budget, the search would try 64 × 63 × … × 59 placements.
        let mut text = String::from("domain: d\ndescriptors:\n");
        let mut indent = String::from("  ");
        for _ in 0..6 {
            text.push_str(&format!("{indent}- key: k\n{indent}  descriptors:\n"));
            indent.push_str("    ");
        }
        text.push_str(&format!(
            "{indent}- key: end\n{indent}  rate_limit: {{unit: second, requests_per_unit: 1}}\n"
        ));
        let c = RlsConfig::from_files([("d.yaml", text.as_str())]).unwrap();
        let values: Vec<String> = (0..64).map(|i| format!("v{i}")).collect();
        let entries: Vec<(&str, &str)> = values.iter().map(|v| ("k", v.as_str())).collect();
        assert!(c.find_unordered("d", &entries).is_none());
    }

    #[test]
    fn a_wildcard_value_matches_by_prefix() {
        let c = config();
        let rule = c.find("edge", &[("path", "api/v1/users")]).unwrap();
        assert_eq!(rule.full_key, "edge.path_api*");
        assert!(c.find("edge", &[("path", "static/x")]).is_none());
    }

    #[test]
    fn the_rule_of_the_last_entry_applies() {
        let c = config();
        // `destination` has no limit of its own: the request must reach `source_internal`.
        assert!(c.find("edge", &[("destination", "db")]).is_none());
        let nested = c
            .find("edge", &[("destination", "db"), ("source", "internal")])
            .unwrap();
        assert!(nested.shadow_mode);
        assert_eq!(nested.replaces, vec!["slow-rule".to_owned()]);
        let counted = nested.counted.as_ref().unwrap();
        assert_eq!(counted.limit.algorithm(), Algorithm::Gcra);
        assert_eq!(counted.limit.burst(), 2);
        // More entries than the configuration is deep: no limit, as envoyproxy/ratelimit.
        assert!(
            c.find("edge", &[("remote_address", "1"), ("extra", "x")])
                .is_none()
        );
        assert!(c.find("other", &[("remote_address", "1")]).is_none());
    }

    #[test]
    fn unlimited_has_no_counted_limit() {
        let rule = config().find("edge", &[("user", "admin")]).unwrap();
        assert!(rule.counted.is_none());
    }

    #[test]
    fn errors_name_the_file_line_and_column() {
        assert_eq!(
            err(
                "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n"
            ),
            "bad.yaml:5:13: invalid rate limit unit `fortnight`; expected second, minute, hour, day, week, month or year"
        );
        assert!(
            err("domain: d\ndescriptors:\n  - key: a\n    colour: red\n")
                .starts_with("bad.yaml:4:5: unknown field `colour` in a descriptor")
        );
        assert!(
            err("domain: d\ndescriptors:\n  - key: a\n  - key: a\n")
                .starts_with("bad.yaml:4:5: duplicate descriptor `d.a`")
        );
        assert!(
            err("domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unlimited: true\n      unit: second\n")
                .starts_with("bad.yaml:6:13: should not specify a rate limit unit")
        );
        assert!(
            err("domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      name: x\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - name: x\n")
                .contains("cannot replace itself")
        );
        assert!(
            err("domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n      burst: 2\n")
                .starts_with("bad.yaml:7:14: `burst` is a gcra setting")
        );
        assert!(err("descriptors: []\n").contains("missing field `domain`"));
        assert!(err("domain: d\ndescriptors: [\n").starts_with("bad.yaml:"));
    }

    #[test]
    fn a_domain_belongs_to_one_file() {
        let e = RlsConfig::from_files([("a.yaml", "domain: d\n"), ("b.yaml", "domain: d\n")])
            .unwrap_err();
        assert_eq!(e.file, "b.yaml");
        assert!(e.to_string().contains("already defined"));
    }

    #[test]
    fn numeric_values_read_as_text() {
        let c = RlsConfig::from_files([(
            "n.yaml",
            "domain: d\ndescriptors:\n  - key: code\n    value: 200\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
        )])
        .unwrap();
        assert!(c.find("d", &[("code", "200")]).is_some());
    }
}
