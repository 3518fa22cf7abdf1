//! floodgate-bench: tools that measure floodgate.
//!
//! - [`replay`]: replays a trace of arrival times through one algorithm ("what would this limit
//!   do to my traffic?").
//! - [`load`]: the load generator, floodgate beside Redis + Lua, Redis + redis-cell, Gubernator
//!   and envoyproxy/ratelimit in one run; `load::accuracy`, one key hit through three nodes.
//! - [`shed`]: the example gateway's load shedding under open-loop HTTP load, with and
//!   without shedding in one run.
//! - `benches/core.rs`: criterion micro-benchmarks of the bucket store beside `governor`.

pub mod load;
pub mod replay;
pub mod shed;
