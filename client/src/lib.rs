//! floodgate-client: the thin client gateways embed.
//!
//! It will carry transport, batching, routing and failure modes (see DESIGN.md and the open
//! issues). Nothing is built here yet; the core (`floodgate`) is usable in-process today.

/// The core whose types the client speaks, re-exported for gateways.
pub use floodgate as core;
