//! Priorities in the rules file: where a request's class comes from (`priority:`), and the
//! shares of a rule's limit kept for higher classes (a rule's `reserve:`).
//!
//! A request's class is the one it names (the example gateway reads `X-Priority`) when the
//! file believes it (`header: true`, the default), else the class of the first `routes:` entry
//! its method and path match, else `default:` (itself `default` unless the file says). A rule
//! with `reserve: { critical: 20% }` refuses lower classes once 80% of its limit is used;
//! critical requests may use all of it. The share is applied where the bucket or lease set is
//! decided, by its one owner, so it holds exactly across gateways: a lower class's check goes
//! with the limit its class is allowed (the same key, a smaller count), and no node needs to
//! know about classes. Only counts that a smaller limit reads without rewriting can do that:
//! concurrency rules and the fixed and sliding windows (a GCRA bucket read under a smaller
//! burst is clamped to it, which would forgive what higher classes took; a sliding log is kept
//! to its limit's size).

use super::engine::RequestAttributes;
use super::error::PolicyError;
use super::http::{
    CONTENT_TYPE, HttpResponse, PROBLEM_JSON, RETRY_AFTER, TEMPORARY_REDUCED_CAPACITY, seconds_ceil,
};
use super::json;
use super::method::parse_method;
use super::pattern::{PathPattern, normalize_path};
use super::rules::{Policy, PriorityRoute, PriorityRules, Rule, RuleLimit};
use super::yaml::{self, Fields, Node, error_at};
use crate::Limit;
use crate::lease::LeaseLimit;
use crate::limit::Algorithm;
use crate::priority::reserve::parse_share_bp;
use crate::priority::{Priority, Reservation};

/// Most `routes:` entries (every request is matched against them).
pub const MAX_PRIORITY_ROUTES: usize = 1_000;

const PRIORITY_FIELDS: &[&str] = &["header", "routes", "default"];
const ROUTE_FIELDS: &[&str] = &["method", "path", "class"];

impl Policy {
    /// The class of a request that names `named` (e.g. its `X-Priority` header): see the
    /// module docs. A name that is no class is ignored.
    pub fn priority_of(&self, attrs: &RequestAttributes<'_>, named: Option<&str>) -> Priority {
        let rules = &self.priority;
        if rules.header
            && let Some(class) = named.and_then(Priority::from_name)
        {
            return class;
        }
        if !rules.routes.is_empty() {
            let segments = normalize_path(attrs.path);
            let route = rules.routes.iter().find(|r| {
                (r.methods.is_empty()
                    || r.methods
                        .iter()
                        .any(|m| m.eq_ignore_ascii_case(attrs.method)))
                    && r.path.matches(&segments)
            });
            if let Some(route) = route {
                return route.class;
            }
        }
        rules.default
    }
}

impl Rule {
    /// The shares of this rule's limit kept for higher classes.
    pub fn reservation(&self) -> &Reservation {
        &self.reserve
    }

    /// The limit a check of `class` goes with: the rule's, with the count its class is allowed.
    pub fn limit_for_class(&self, limit: Limit, class: Priority) -> Limit {
        if self.reserve.is_none() {
            return limit;
        }
        let allowed = self.reserve.allowance(limit.burst(), class);
        // Valid: the algorithm and period are the limit's, the count in 1..=its own.
        Limit::window(limit.algorithm(), allowed, limit.period_ns()).unwrap_or(limit)
    }

    /// The lease limit a request of `class` goes with: `max` less what is kept above it.
    pub fn lease_limit_for_class(&self, limit: LeaseLimit, class: Priority) -> LeaseLimit {
        let allowed = self.reserve.allowance(limit.max(), class);
        LeaseLimit::new(allowed, limit.ttl_ns()).unwrap_or(limit)
    }
}

/// Reads the file's `priority:` section.
pub(super) fn parse_priority(node: &Node<'_>) -> Result<PriorityRules, PolicyError> {
    let fields = Fields::new(node, "`priority`", PRIORITY_FIELDS)?;
    let header = match fields.get("header") {
        Some(n) => yaml::boolean(n, "`header` (true: believe the class a request names)")?,
        None => true,
    };
    let default = match fields.get("default") {
        Some(n) => parse_class(n)?,
        None => Priority::Default,
    };
    let mut routes = Vec::new();
    if let Some(list) = fields.get("routes") {
        let items = yaml::sequence(list, "`routes`")?;
        if items.len() > MAX_PRIORITY_ROUTES {
            return Err(error_at(
                list,
                format!(
                    "{} routes; the maximum is {MAX_PRIORITY_ROUTES}",
                    items.len()
                ),
            ));
        }
        for item in items {
            let route = Fields::new(item, "a priority route", ROUTE_FIELDS)?;
            let mut methods = Vec::new();
            if let Some(method_node) = route.get("method") {
                for (text, m) in yaml::strings(method_node, "`method`")? {
                    methods.push(parse_method(text).map_err(|e| error_at(m, e))?);
                }
            }
            let path_node = route.require("path")?;
            let path = PathPattern::parse(yaml::string(path_node, "`path`")?)
                .map_err(|e| error_at(path_node, e))?;
            let class = parse_class(route.require("class")?)?;
            routes.push(PriorityRoute {
                methods,
                path,
                class,
            });
        }
    }
    Ok(PriorityRules {
        header,
        routes,
        default,
    })
}

/// Reads a rule's `reserve:` (class: share), given the rule's limits and concurrency.
pub(super) fn parse_reserve<'l>(
    node: &Node<'_>,
    concurrency: Option<LeaseLimit>,
    mut limits: impl Iterator<Item = &'l RuleLimit>,
) -> Result<Reservation, PolicyError> {
    let mut kept = Vec::new();
    for (name, key, value) in yaml::mapping(node, "`reserve` (class: share)")? {
        let class = Priority::from_name(name).ok_or_else(|| error_at(key, not_a_class(name)))?;
        let share = yaml::string(value, "a share such as `20%`")?;
        let bp = parse_share_bp(share).map_err(|e| error_at(value, e.to_string()))?;
        kept.push((class, bp));
    }
    let reservation = Reservation::new(&kept).map_err(|e| error_at(node, e.to_string()))?;
    if concurrency.is_none() {
        let counted_as_windows = |l: &RuleLimit| match l {
            RuleLimit::Limited(limit) => matches!(
                limit.algorithm(),
                Algorithm::FixedWindow | Algorithm::SlidingWindow
            ),
            RuleLimit::Unlimited => true,
        };
        if !limits.all(counted_as_windows) {
            return Err(error_at(
                node,
                "`reserve` needs a count a smaller limit can read without changing it: a \
                 concurrency rule, or algorithm fixed-window or sliding-window (a GCRA bucket \
                 read under a smaller burst forgives what higher classes took; a sliding log \
                 keeps only its limit's size)",
            ));
        }
    }
    Ok(reservation)
}

fn parse_class(node: &Node<'_>) -> Result<Priority, PolicyError> {
    let name = yaml::string(node, "a class (critical, default or sheddable)")?;
    Priority::from_name(name).ok_or_else(|| error_at(node, not_a_class(name)))
}

fn not_a_class(name: &str) -> String {
    format!("`{name}` is not a class; expected critical, default or sheddable")
}

/// The answer to a request a shedder turned away: `503` with `Retry-After` (whole seconds,
/// at least 1) and a problem body naming the backend and the class, so a client tells it from
/// a rate limit's `429`.
pub fn shed_response(backend: &str, class: Priority, retry_after_ns: u64) -> HttpResponse {
    let retry_after = seconds_ceil(retry_after_ns).max(1);
    let mut body = String::with_capacity(256);
    body.push_str("{\"type\":");
    json::push_string(&mut body, TEMPORARY_REDUCED_CAPACITY);
    body.push_str(",\"title\":\"Service Unavailable\",\"status\":503,\"detail\":");
    json::push_string(
        &mut body,
        &format!(
            "{backend} is shedding load: {class} requests are turned away for now; retry after \
             {retry_after} s."
        ),
    );
    body.push_str(",\"backend\":");
    json::push_string(&mut body, backend);
    body.push_str(",\"priority\":");
    json::push_string(&mut body, class.name());
    body.push('}');
    HttpResponse {
        status: 503,
        headers: vec![
            (RETRY_AFTER, retry_after.to_string()),
            (CONTENT_TYPE, PROBLEM_JSON.to_owned()),
        ],
        body: Some(body),
    }
}
