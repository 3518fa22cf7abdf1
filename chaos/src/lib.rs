//! floodgate-chaos: the fault-injection harness and seeded simulation of a cluster.
//!
//! It will drive the core's sans-I/O cluster state machines from a seed. Nothing is built here yet.

/// The core under test, re-exported.
pub use floodgate as core;
