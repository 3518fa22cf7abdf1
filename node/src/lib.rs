//! floodgate-node: the limiter node, the shell of sockets, timers and tasks around the core's
//! pure bucket store.
//!
//! - [`config`]: [`NodeConfig`], listen addresses, TLS files and the limits on peers' input.
//! - [`certs`]: development certificates for `--data-dir` and PEM loading.
//! - `tls`: the QUIC server configuration (TLS 1.3, ALPN `floodgate/1`, optional mutual TLS).
//! - `server`: [`Node`]: accept loop, connection and stream tasks, sweeper, graceful shutdown.
//! - `service`: the pure step from a received frame to the bytes of its answer.
//! - `admin`: `/metrics`, `/healthz`, `/readyz`.
//! - `metrics`: metric names and handles.
//! - `clock`: epoch-based nanoseconds that never go backwards.

pub mod certs;
pub mod clock;
pub mod config;

mod admin;
mod metrics;
mod server;
mod service;
mod tls;

pub use certs::{DevCerts, ensure_dev_certs};
pub use config::{NodeConfig, NodeLimits, TlsConfig};
pub use server::Node;

/// The core this node serves, re-exported so node code and tests name one path.
pub use floodgate as core;
