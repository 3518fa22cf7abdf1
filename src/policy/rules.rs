//! The validated policy: rules, plans, the API-key table and the bounds, plus `describe()`.

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::sync::Arc;

use super::client_ip::TrustedProxies;
use super::pattern::PathPattern;
use crate::Limit;
pub use crate::check::FailureMode;
use crate::limit::format_period;
use crate::region::RegionName;

/// Whether a rule's denials are enforced or only reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    #[default]
    Enforce,
    /// Count and report, never deny: to try a rule on real traffic before enforcing it.
    Shadow,
}

/// One request attribute a rule's key is built from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyPart {
    User,
    Ip,
    ApiKey,
    Tenant,
    Plan,
    Method,
    /// The request's normalized path.
    Path,
    /// Method and normalized path together (`POST /v1/x`): per endpoint.
    Endpoint,
    /// One bucket for every request the rule matches.
    Global,
}

impl KeyPart {
    pub const ALL: [KeyPart; 9] = [
        KeyPart::User,
        KeyPart::Ip,
        KeyPart::ApiKey,
        KeyPart::Tenant,
        KeyPart::Plan,
        KeyPart::Method,
        KeyPart::Path,
        KeyPart::Endpoint,
        KeyPart::Global,
    ];

    /// The name used in rules files and in keys.
    pub fn name(self) -> &'static str {
        match self {
            KeyPart::User => "user",
            KeyPart::Ip => "ip",
            KeyPart::ApiKey => "api_key",
            KeyPart::Tenant => "tenant",
            KeyPart::Plan => "plan",
            KeyPart::Method => "method",
            KeyPart::Path => "path",
            KeyPart::Endpoint => "endpoint",
            KeyPart::Global => "global",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        KeyPart::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// Which regions a rule's limit spans (`scope:` in the rules file).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum RuleScope {
    /// One limit per region, decided in the gateway's region. The default.
    #[default]
    Region,
    /// One limit shared by every region (see [`crate::region::Scope::Global`]).
    Global,
    /// Decided in the request's home region: its `home_region` attribute, else the `tenants:`
    /// table's entry for its tenant; a request with neither is decided in its own region.
    RequestHome,
    /// Decided in this region, for every request.
    Home(RegionName),
}

impl fmt::Display for RuleScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuleScope::Region => f.write_str("region"),
            RuleScope::Global => f.write_str("global"),
            RuleScope::RequestHome => f.write_str("home"),
            RuleScope::Home(region) => write!(f, "home:{region}"),
        }
    }
}

/// A rule's limit for some plan (or by default): a [`Limit`] or none at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleLimit {
    Limited(Limit),
    /// Matching requests are not counted by this rule.
    Unlimited,
}

impl fmt::Display for RuleLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuleLimit::Limited(limit) => write!(f, "{limit}"),
            RuleLimit::Unlimited => f.write_str("unlimited"),
        }
    }
}

/// One validated rule of a [`Policy`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub(crate) name: Arc<str>,
    pub(crate) methods: Vec<String>,
    pub(crate) path: PathPattern,
    pub(crate) key: Vec<KeyPart>,
    pub(crate) limit: Option<RuleLimit>,
    pub(crate) plans: Vec<(String, RuleLimit)>,
    /// The plan a request on an undeclared plan is treated as under this rule (overrides the
    /// file's `default_plan`).
    pub(crate) default_plan: Option<String>,
    pub(crate) cost: u64,
    /// `cost_from:`: the cost read from the request, or charged after the response.
    pub(crate) cost_from: Option<super::metered::CostFrom>,
    pub(crate) failure_mode: FailureMode,
    pub(crate) mode: Mode,
    pub(crate) max_wait_ns: u64,
    pub(crate) scope: RuleScope,
    /// `concurrency:` and `ttl:`: at most this many requests in flight per key, through leases
    /// (such a rule has no rate limit; see [`super::concurrency`]).
    pub(crate) concurrency: Option<crate::lease::LeaseLimit>,
    /// `lease_above`: from this many checks a second of one key at a gateway, the gateway
    /// decides that key against token leases (`None`: as the client's config says).
    pub(crate) lease_above_per_sec: Option<u64>,
    /// `reserve:`: shares of the limit kept for higher classes (see [`super::priority`]).
    pub(crate) reserve: crate::priority::Reservation,
}

impl Rule {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Methods the rule applies to, upper-case; empty for every method.
    pub fn methods(&self) -> &[String] {
        &self.methods
    }

    pub fn path(&self) -> &PathPattern {
        &self.path
    }

    pub fn key(&self) -> &[KeyPart] {
        &self.key
    }

    /// The limit for requests whose plan has no entry in [`Rule::plans`]; `None` when the rule
    /// applies only to the plans it lists.
    pub fn default_limit(&self) -> Option<RuleLimit> {
        self.limit
    }

    /// Per-plan limits, in file order.
    pub fn plans(&self) -> &[(String, RuleLimit)] {
        &self.plans
    }

    /// The limit for a request on `plan`: the plan's entry, else the default.
    pub fn limit_for(&self, plan: Option<&str>) -> Option<RuleLimit> {
        plan.and_then(|p| self.plans.iter().find(|(name, _)| name == p))
            .map(|&(_, limit)| limit)
            .or(self.limit)
    }

    /// The rule's own `default_plan`, if it names one.
    pub fn default_plan(&self) -> Option<&str> {
        self.default_plan.as_deref()
    }

    /// Whether a request's plan changes this rule's limit or key.
    pub fn depends_on_plan(&self) -> bool {
        !self.plans.is_empty() || self.key.contains(&KeyPart::Plan)
    }

    /// The plan a request on a plan the file does not declare (`Free` when only `free` is) is
    /// treated as, and its limit. Never unlimited unless the file says so:
    ///
    /// 1. the rule's `default_plan`, else the file's (`file_default`): treated as that plan;
    /// 2. else the rule's own `limit`, with the plan as sent (`None` as the plan);
    /// 3. else (a rule with per-plan limits only) its strictest listed plan.
    pub fn limit_for_unknown_plan<'a>(
        &'a self,
        file_default: Option<&'a str>,
    ) -> (Option<&'a str>, Option<RuleLimit>) {
        if let Some(plan) = self.default_plan.as_deref().or(file_default) {
            return (Some(plan), self.limit_for(Some(plan)));
        }
        if self.limit.is_some() {
            return (None, self.limit);
        }
        match self.strictest_plan() {
            Some((plan, limit)) => (Some(plan), Some(limit)),
            // Every listed plan is unlimited: the file said so.
            None => (None, Some(RuleLimit::Unlimited)),
        }
    }

    /// The listed plan with the lowest sustained rate (then the smallest burst), if any is
    /// limited.
    fn strictest_plan(&self) -> Option<(&str, RuleLimit)> {
        let mut best: Option<(&str, crate::Limit)> = None;
        for (plan, limit) in &self.plans {
            let RuleLimit::Limited(limit) = *limit else {
                continue;
            };
            // rate/period compared as rate_a * period_b < rate_b * period_a, without division.
            let stricter = best.is_none_or(|(_, b)| {
                let lhs = u128::from(limit.rate()) * u128::from(b.period_ns());
                let rhs = u128::from(b.rate()) * u128::from(limit.period_ns());
                lhs < rhs || (lhs == rhs && limit.burst() < b.burst())
            });
            if stricter {
                best = Some((plan, limit));
            }
        }
        best.map(|(plan, limit)| (plan, RuleLimit::Limited(limit)))
    }

    /// Units each matching request consumes (1 unless the file says; see also
    /// [`Rule::cost_from`]).
    pub fn cost(&self) -> u64 {
        self.cost
    }

    /// Where a metered rule's cost comes from (`None`: the fixed [`Rule::cost`]).
    pub fn cost_from(&self) -> Option<&super::metered::CostFrom> {
        self.cost_from.as_ref()
    }

    pub fn failure_mode(&self) -> FailureMode {
        self.failure_mode
    }

    /// `lease_above`, in checks a second: gateways lease this rule's hot keys' tokens.
    pub fn lease_above_per_sec(&self) -> Option<u64> {
        self.lease_above_per_sec
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Longest a request may wait for this rule instead of being denied (0: never waits).
    pub fn max_wait_ns(&self) -> u64 {
        self.max_wait_ns
    }

    /// Which regions the rule's limit spans.
    pub fn scope(&self) -> &RuleScope {
        &self.scope
    }

    /// The rule's concurrency limit (`concurrency:`, `ttl:`), for a concurrency rule.
    pub fn concurrency(&self) -> Option<crate::lease::LeaseLimit> {
        self.concurrency
    }

    /// One line: what the rule matches, its key and what it enforces.
    pub fn describe(&self) -> String {
        let methods = if self.methods.is_empty() {
            "*".to_owned()
        } else {
            self.methods.join("|")
        };
        let key: Vec<&str> = self.key.iter().map(|p| p.name()).collect();
        let mut line = format!(
            "{}: {methods} {} per {}:",
            self.name,
            self.path,
            key.join("+")
        );
        let mut limits = Vec::new();
        if let Some(limit) = self.limit {
            limits.push(format!(" {limit}"));
        }
        for (plan, limit) in &self.plans {
            limits.push(format!(" plan {plan} {limit}"));
        }
        line.push_str(&limits.join(";"));
        if let Some(lease) = self.concurrency {
            let _ = write!(
                line,
                " at most {} at once (leases of {})",
                lease.max(),
                format_period(lease.ttl_ns())
            );
        } else if self.limit.is_none() {
            line.push_str("; other declared plans not limited");
        }
        if let Some(plan) = &self.default_plan {
            let _ = write!(line, "; unknown plans as {plan}");
        }
        for class in crate::priority::Priority::ALL.into_iter().rev() {
            let bp = self.reserve.kept_bp(class);
            if bp > 0 {
                let _ = write!(line, "; keeps {}% for {class}", f64::from(bp) / 100.0);
            }
        }
        if self.cost != 1 {
            let _ = write!(line, "; cost {}", self.cost);
        }
        if let Some(from) = &self.cost_from {
            let _ = match from.source() {
                super::metered::CostSource::RequestHeader(name) => {
                    write!(
                        line,
                        "; cost from request header {name} (else {})",
                        from.missing()
                    )
                }
                super::metered::CostSource::Response(name) => write!(
                    line,
                    "; {} left to pass, then charged the response's {name} (else {})",
                    from.estimate(),
                    from.missing()
                ),
            };
        }
        if self.failure_mode == FailureMode::Closed {
            line.push_str("; fails closed");
        }
        if self.mode == Mode::Shadow {
            line.push_str("; shadow (never denies)");
        }
        if self.max_wait_ns > 0 {
            let _ = write!(line, "; waits up to {}", format_period(self.max_wait_ns));
        }
        if self.scope != RuleScope::Region {
            let _ = write!(line, "; scope {}", self.scope);
        }
        if let Some(per_sec) = self.lease_above_per_sec {
            let _ = write!(line, "; token leases above {per_sec}/s");
        }
        line
    }
}

/// A validated rules file: immutable once built. Share it behind an `Arc` (a node swaps the whole
/// `Arc` on reload, so a request sees one policy from planning to verdict).
#[derive(Debug, Clone)]
pub struct Policy {
    pub(crate) version: String,
    pub(crate) rules: Vec<Rule>,
    pub(crate) plans: Vec<String>,
    /// The plan a request on an undeclared plan is treated as, unless its rule names another.
    pub(crate) default_plan: Option<String>,
    pub(crate) api_keys: HashMap<String, String>,
    pub(crate) max_waiting: usize,
    pub(crate) trusted_proxies: TrustedProxies,
    /// The deployment's regions (`regions:`); home regions must be among them.
    pub(crate) regions: Vec<RegionName>,
    /// Each tenant's home region (`tenants:`).
    pub(crate) tenants: HashMap<String, RegionName>,
    /// Where a request's class comes from (`priority:`).
    pub(crate) priority: PriorityRules,
}

impl Policy {
    /// A content hash of the file the policy was read from (16 hex digits of xxh3-64): two nodes
    /// with the same version enforce the same rules.
    pub fn version(&self) -> &str {
        &self.version
    }

    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    pub fn rule(&self, name: &str) -> Option<&Rule> {
        self.rules.iter().find(|r| r.name() == name)
    }

    /// The plans the file declares.
    pub fn plans(&self) -> &[String] {
        &self.plans
    }

    /// The file's `default_plan`: what a request on an undeclared plan is treated as.
    pub fn default_plan(&self) -> Option<&str> {
        self.default_plan.as_deref()
    }

    /// Whether `plan` is one the file declares under `plans:`.
    pub fn declares_plan(&self, plan: &str) -> bool {
        self.plans.iter().any(|p| p == plan)
    }

    /// The plan the file's API-key table gives `api_key`, if any.
    pub fn plan_for_api_key(&self, api_key: &str) -> Option<&str> {
        self.api_keys.get(api_key).map(String::as_str)
    }

    /// Most requests that may wait (`max_wait`) at once, per client; the rest are denied.
    pub fn max_waiting(&self) -> usize {
        self.max_waiting
    }

    /// The regions the file declares.
    pub fn regions(&self) -> &[RegionName] {
        &self.regions
    }

    /// The home region the `tenants:` table gives `tenant`, if any.
    pub fn home_region_of_tenant(&self, tenant: &str) -> Option<&RegionName> {
        self.tenants.get(tenant)
    }

    /// `text` as one of the declared regions, if it is one (a request's `home_region` is
    /// believed only then).
    pub fn declared_region(&self, text: &str) -> Option<&RegionName> {
        self.regions.iter().find(|r| r.as_str() == text)
    }

    /// Proxies whose `X-Forwarded-For` entries are believed (see [`super::client_ip()`]).
    pub fn trusted_proxies(&self) -> &TrustedProxies {
        &self.trusted_proxies
    }

    /// What the policy enforces, one rule per line after a header line: what
    /// `floodgate rules check FILE` prints.
    pub fn describe(&self) -> String {
        let mut out = format!(
            "policy {}: {} rules, plans [{}]{}, {} API keys, max {} waiting, {} trusted proxies{}\n",
            self.version,
            self.rules.len(),
            self.plans.join(", "),
            match &self.default_plan {
                Some(plan) => format!(" (unknown plans as {plan})"),
                None => String::new(),
            },
            self.api_keys.len(),
            self.max_waiting,
            self.trusted_proxies.len(),
            if self.regions.is_empty() {
                String::new()
            } else {
                let names: Vec<&str> = self.regions.iter().map(RegionName::as_str).collect();
                format!(
                    ", regions [{}], {} tenants with a home region",
                    names.join(", "),
                    self.tenants.len()
                )
            },
        );
        for rule in &self.rules {
            out.push_str(&rule.describe());
            out.push('\n');
        }
        out
    }
}

/// Where a request's class comes from (`priority:`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriorityRules {
    /// Believe the class the request names.
    pub(crate) header: bool,
    pub(crate) routes: Vec<PriorityRoute>,
    pub(crate) default: crate::priority::Priority,
}

impl Default for PriorityRules {
    fn default() -> Self {
        PriorityRules {
            header: true,
            routes: Vec::new(),
            default: crate::priority::Priority::Default,
        }
    }
}

/// One `routes:` entry: requests it matches have its class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriorityRoute {
    pub(crate) methods: Vec<String>,
    pub(crate) path: PathPattern,
    pub(crate) class: crate::priority::Priority,
}
