//! floodgate-bench: tools that measure floodgate.
//!
//! - [`replay`]: replays a trace of arrival times through one algorithm ("what would this limit
//!   do to my traffic?").
//! - `benches/core.rs`: criterion micro-benchmarks of the bucket store beside `governor`.

pub mod replay;
