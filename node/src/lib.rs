//! floodgate-node: the limiter node, the shell of sockets, timers and tasks around the core's
//! pure bucket store.
//!
//! - [`address`]: HOST:PORT flag values with DNS names, resolved IPv4 first.
//! - [`config`]: [`NodeConfig`], listen addresses, TLS files, the cluster and RLS settings, and
//!   the limits on peers' input.
//! - [`exchange`]: one request on its own stream (open, write a frame, read the answer, check
//!   its kind), for peers and tests.
//! - [`certs`]: development certificates for `--data-dir` and PEM loading.
//! - `node_id`: what a node id may be (a DNS name its certificate carries).
//! - `tls`: the QUIC server configuration (TLS 1.3, ALPN `floodgate/1`, optional mutual TLS).
//! - `server/`: [`Node`]: start (the composition root, `server/wiring.rs`), connections,
//!   streams, peer messages, sweeper, graceful shutdown. Each task is handed the parts it uses.
//! - `admission`: separate connection allowances for clients and peers.
//! - `budget`: the node-wide budget of bytes buffered from streams.
//! - `caller`: who sent a check batch: whether it knows `try_again`, what a gateway may refund.
//! - `service`: the pure step from a received frame to the bytes of its answer.
//! - [`cluster`]: the core's membership and ownership machines, driven: parts that each own
//!   their state (members, slot ownership and the deciding gate, the table message,
//!   replication of buckets and leases, the other regions' rings, peers), and the driver that
//!   runs gossip, table switches and their hand-offs.
//! - `check_path`: `CheckPath`, what deciding a request on this node's state takes.
//! - [`region_sync`]: the inter-region delta exchange of global keys (the core's `Exchange`
//!   driven); `region_links` sends its frames to peers; `scoped`: kind 12, checks with scopes.
//! - `token_leases`: kind 18, tokens of hot keys granted to gateways (and returned), decided
//!   where checks are.
//! - `member_log`: peers suspected or declared dead logged at WARN as it happens.
//! - `lease`: kind 15, concurrency leases placed by slot and decided on the lease store (its
//!   ids from the operating system's secure generator); their replication and hand-off are in
//!   `cluster`.
//! - `forward`: checks placed by the core's ownership machine: decided here, sent to their owner,
//!   refusals placed again; `reach`: how a scoped group is decided (region, global, home);
//!   `owner_batches`: groups sent on to their deciders, one frame per node, answers split back.
//! - [`rules`]: `--rules FILE`: validation, versions, hot reload, serving rules to clients.
//! - [`rls`]: `--rls-listen`: Envoy's rate limit service (RLS v3 over gRPC) on the cluster.
//! - [`rlqs`]: `--rlqs-listen`: Envoy's rate limit quota service (RLQS): fair shares of each
//!   bucket's limit among the Envoys reporting it, as token buckets they enforce themselves.
//! - [`resp`]: `--resp-listen`: the Redis protocol front, redis-cell's `CL.THROTTLE` on the
//!   cluster; `front_batch`: one check batch through `forward`, for the RLS and RESP fronts,
//!   and `FrontContext`, what those fronts share.
//! - `admin`: `/metrics`, `/healthz`, `/readyz` (and `Readiness`, what it answers).
//! - `metrics`: metric names and handles.
//! - [`snapshot`]: `--state-dir`: long-period buckets saved every second and at shutdown, loaded
//!   at start.

pub mod address;
pub mod certs;
pub mod cluster;
pub mod config;
pub mod exchange;

mod admin;
mod admission;
#[cfg(test)]
mod alloc_counter;
mod budget;
mod caller;
mod check_path;
mod endpoint_keys;
mod forward;
mod forward_queue;
mod front_batch;
mod lease;
mod member_log;
mod metrics;
mod node_id;
mod owner_batches;
mod reach;
mod region_links;
pub mod region_sync;
pub mod resp;
pub mod rlqs;
pub mod rls;
pub mod rules;
mod scoped;
#[cfg(test)]
mod seeded;
mod server;
mod service;
pub mod snapshot;
mod tls;
mod token_leases;

pub use address::HostPort;
pub use admin::MAX_CONNECTIONS as MAX_ADMIN_CONNECTIONS;
pub use certs::{DevCerts, ensure_dev_certs};
pub use config::{
    ClusterConfig, NodeConfig, NodeLimits, RespFailureMode, RespSettings, RlqsSettings, TlsConfig,
};
pub use server::Node;

/// The core this node serves, re-exported so node code and tests name one path.
pub use floodgate as core;
