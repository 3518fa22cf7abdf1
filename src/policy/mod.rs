//! The policy: the rules file, matching requests to rules, and turning decisions into a verdict
//! and its HTTP answer. Pure: callers read files, clocks and sockets.
//!
//! The path of one request:
//!
//! 1. [`Policy::from_yaml`] validates a rules file once (errors carry line and column).
//! 2. The gateway builds [`RequestAttributes`], with the client's address from [`client_ip()`].
//! 3. [`Policy::checks_for`] plans one [`PlannedCheck`] per rule that applies.
//! 4. The client groups them into calls ([`group_by_owner`]), decides them (nodes, or fallback
//!    buckets) and records one [`CheckOutcome`] each ([`RoundOutcomes`]).
//! 5. [`Policy::verdict`] combines them into a [`RequestVerdict`]: allow, wait, deny or unavailable, with
//!    the checks to refund when the request does not pass.
//! 6. [`RequestVerdict::http`] gives the status, `Retry-After`, `RateLimit-Policy`, `RateLimit` and the
//!    problem body.
//!
//! Modules:
//! - [`rules`]: the validated model ([`Policy`], [`Rule`]) and `describe()`.
//! - `parse`, `parse_limit`, `parse_region` and `yaml`: the rules-file schema (regions, tenants
//!   and scopes in `parse_region`) and position-carrying YAML reading.
//! - [`pattern`]: path globs and request-path normalization; [`method`]: HTTP methods in rules.
//! - [`engine`]: request attributes → planned checks and their keys.
//! - [`metered`]: `cost_from:` rules, whose cost a request declares or a response reports.
//! - [`concurrency`](mod@concurrency): `concurrency:` rules → planned leases, and the answer
//!   when one is refused.
//! - [`priority`](mod@priority): where a request's class comes from, and a rule's `reserve:`
//!   (shares of its limit kept for higher classes).
//! - [`grouping`]: planned checks → all-or-nothing calls per owning node, verdicts → outcomes.
//! - [`verdict`](mod@verdict): outcomes → verdict and refunds; [`wait`]: the bound on waiting
//!   requests.
//! - [`http`]: the HTTP contract; [`json`]: string escaping for the problem body.
//! - [`client_ip`](mod@client_ip): trusted proxies and `X-Forwarded-For`.

pub mod client_ip;
pub mod concurrency;
pub mod engine;
mod error;
pub mod grouping;
pub mod http;
pub mod json;
pub mod metered;
pub mod method;
mod parse;
mod parse_limit;
mod parse_region;
pub mod pattern;
pub mod priority;
pub mod rules;
pub mod verdict;
pub mod wait;
pub(crate) mod yaml;

pub use client_ip::{Cidr, TrustedProxies, client_ip};
pub use concurrency::{LeaseOutcome, PlannedLease, lease_refusal};
pub use engine::{KEY_SEPARATOR, MAX_KEY_BYTES, PlannedCheck, RequestAttributes};
pub use error::PolicyError;
pub use grouping::{CheckGroup, RoundOutcomes, group_by_owner};
pub use http::HttpResponse;
pub use parse::{DEFAULT_MAX_WAITING, MAX_RULES, MAX_WAITING};
pub use parse_limit::MAX_WAIT_NS;
pub use parse_region::{MAX_REGIONS, MAX_TENANTS};
pub use rules::{FailureMode, KeyPart, Mode, Policy, Rule, RuleLimit, RuleScope};
pub use verdict::{
    Action, CheckOutcome, RequestVerdict, RuleReport, RuleState, Source,
    UNAVAILABLE_RETRY_AFTER_NS, verdict,
};
pub use wait::{WaitBound, WaitPermit};
pub use yaml::MAX_RULES_FILE_BYTES;
