//! floodgate-node: the limiter node.
//!
//! It will own sockets, timers and the runtime around the core's `BucketStore`: the QUIC
//! endpoint, the admin HTTP port and cluster membership (see DESIGN.md and the open issues).
//! Nothing is built here yet; the core (`floodgate`) is usable in-process today.

/// The core this node serves, re-exported so node code and tests name one path.
pub use floodgate as core;
