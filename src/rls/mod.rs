//! Envoy's rate limit service (RLS v3), the pure part: envoyproxy/ratelimit's configuration
//! format read unchanged, its descriptor matching, and the per-descriptor plan and answer.
//!
//! - [`config`]: the YAML files (one `domain` each) into a validated [`RlsConfig`], with
//!   floodgate's optional `algorithm` and `burst`.
//! - [`request`]: a `RateLimitRequest` message read in place, what no Envoy sends refused.
//! - [`plan`]: a request's descriptors into checks (bucket key, limit, cost) or "no limit".
//! - [`answer`]: decisions back into per-descriptor statuses and the draft-10 header fields.
//!
//! No I/O and no runtime here: the node reads the files, calls the cluster and speaks gRPC.

pub mod answer;
pub mod config;
pub mod plan;
pub mod request;

pub use answer::{
    DescriptorAnswer, StatusCode, answer_descriptor, overall_code, ratelimit_headers,
};
pub use config::{RateRule, RlsConfig, RlsConfigError, Unit};
pub use plan::{DescriptorRequest, NEGATIVE_HITS_OFF, PlanOptions, Planned, plan_request};
pub use request::{MAX_ENTRIES, RequestView, Unread, read_request};
