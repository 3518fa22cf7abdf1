//! floodgate-client: the thin client gateways embed (batched QUIC checks, failure modes).
//!
//! Checks go to floodgate nodes in shared frames over long-lived QUIC streams; when a node
//! cannot answer, each check's failure mode decides.
//!
//! ```no_run
//! # async fn demo() -> Result<(), floodgate_client::ClientError> {
//! use floodgate_client::{Check, Client, ClientConfig, FailureMode, HostPort, all_allowed};
//! use floodgate_client::core::Limit;
//!
//! let config = ClientConfig::with_ca_file("certs/ca.pem");
//! let seed: HostPort = "fg-a.internal:7100".parse().expect("HOST:PORT");
//! let client = Client::connect(&[seed], config).await?;
//! let per_ip = Limit::gcra(10, 60_000_000_000, 10).expect("a valid limit");
//! let verdicts = client
//!     .check(&[Check::new("login:ip:203.0.113.9", per_ip).failure_mode(FailureMode::Closed)])
//!     .await?;
//! if !all_allowed(&verdicts) { /* answer 429 */ }
//! # Ok(()) }
//! ```
//!
//! Modules, from the caller inwards (none imports a module that imports it back):
//! - [`policy`]: [`RateLimiter`]: the rules from the nodes (`policy::feed` fetches them), a
//!   request's checks → verdict → HTTP answer, with refunds across nodes and bounded waiting
//!   (the grouping and refund logic is the core's `floodgate::policy::grouping`).
//! - `tower` (feature `tower`): `RateLimitLayer`, the limiter as a `tower::Layer`.
//! - `shed` (feature `tower`): `ShedLayer`, load shedding in front of one upstream (the core's
//!   adaptive shedder, lowest class first, `503` with `Retry-After`).
//! - `brownout`: the task (feature `tower`) that reports a gateway's shedding level into the
//!   cluster and reads back the fleet's, and [`brownout::read_fleet_level`], the read alone.
//! - `client`: [`Client`]: `connect`, and each call to its key's owner or the owner's successor;
//!   `call`: one call to one node (breaker, queue, reply → verdicts).
//! - [`Check`], [`FailureMode`], [`Verdict`], [`Source`], [`DegradedReason`]: the core's
//!   `floodgate::check`, re-exported.
//! - `lease`: [`Client::acquire`], [`Client::release`], [`Client::renew`]: concurrency
//!   leases ([`Lease`], [`Acquire`], [`Renewal`]), one request on its own stream, off the check path.
//! - `address`: [`HostPort`]: a seed's HOST:PORT; a name is resolved again on every connection
//!   attempt, IPv4 first.
//! - `config`: [`ClientConfig`] and its validation; `tls`: the QUIC/TLS 1.3 client config.
//! - `error`: [`ClientError`], [`ConfigError`] and their [`ErrorKind`].
//! - `routing`: which link a call goes to: the owner of its first key's slot (and its successor)
//!   by the slot table in force; `router`: a stable hash over the given nodes until a table
//!   arrives.
//! - `cluster_table`: [`ClusterTable`], a node's table as received: the core's `SlotTable` plus
//!   the members' addresses; `table_feed`: fetching tables, following pushes, and the hints
//!   answers give; `refresher`: the task that keeps the table and the links to members current.
//! - `breaker`: the per-node circuit breaker; `backoff`: reconnect delays.
//! - `queue`: the per-node call queue that coalesces concurrent calls into frames;
//!   `check_group`: a call's check group, written over its caller's last one; `reply_slot`:
//!   the reusable slot a call's answer (and its group) comes back in (with
//!   `Client::check_into`, nothing allocated per call once warm).
//! - `link`: a node's shared state and its connection supervisor (reconnects); `link::stream`:
//!   the stream tasks (frames out, answers in); `status`: [`LinkState`], [`NodeStatus`] and
//!   its [`TransportStats`].
//! - `dial`: endpoints and bounded handshakes; `request`: one frame and its matched answer.
//! - `token_leases`: hot keys decided here against tokens leased from their owner (kind 18),
//!   refilled in the background, returned when they lapse; bounded.
//! - `fallback`: failure modes, with a local bucket store for `Open` checks (on the core's
//!   `EpochClock`, moved by tokio's time).
//!
//! The `floodgate` command (package `floodgate-cli`, in `client/cli`) sends checks from a shell;
//! `logging` (feature `logging`) sets up its log output and the example gateway's. No feature
//! is on by default: a gateway links the library alone.

mod address;
mod backoff;
mod breaker;
pub mod brownout;
mod call;
mod charge;
mod check_group;
mod client;
mod cluster_table;
mod config;
#[cfg(test)]
mod counting_waker;
mod dial;
mod error;
mod fallback;
mod lease;
mod link;
#[cfg(feature = "logging")]
pub mod logging;
pub mod policy;
mod queue;
mod refresher;
mod reply_slot;
mod request;
mod router;
mod routing;
#[cfg(feature = "tower")]
pub mod shed;
mod status;
mod table_feed;
mod tls;
mod token_leases;
#[cfg(feature = "tower")]
pub mod tower;

pub use address::HostPort;
pub use charge::ChargeOutcome;
pub use client::Client;
pub use cluster_table::{ClusterMember, ClusterTable};
pub use config::{
    BackoffConfig, BreakerConfig, CaSource, ClientAuth, ClientConfig, MAX_CHECKS_PER_FRAME,
    MAX_DURATION, MAX_KEY_BYTES, MAX_STREAMS_PER_CONNECTION, TokenLeaseConfig,
};
pub use error::{ClientError, ConfigError, ErrorKind, classify_code};
/// What a caller sends and gets back: the core's types, re-exported.
pub use floodgate::check::{Check, DegradedReason, FailureMode, Source, Verdict, all_allowed};
pub use lease::{Acquire, Lease, Renewal};
pub use policy::{
    LimiterConfig, LimiterError, PolicyChanges, PolicySource, RateLimiter, RequestDecision,
    RequestInfo,
};
pub use routing::TableChanges;
pub use status::{LinkState, NodeStatus, TransportStats};
pub use table_feed::fetch_slot_table;
pub use token_leases::TokenLeaseStats;

/// The core whose types the client speaks (`Limit`, `Decision`, ...), re-exported for gateways.
pub use floodgate as core;
