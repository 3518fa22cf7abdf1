//! floodgate's decision core: pure, no I/O, no runtime; decisions never read a clock.
//!
//! - [`limit`]: [`Limit`], a rate limit that cannot be invalid, and parsing of rates and durations.
//! - [`decision`]: [`Decision`], the answer to one check, as a value.
//! - [`check`](mod@check): a check as a client asks it ([`check::Check`], with its failure mode)
//!   and its [`check::Verdict`] (the decision and who made it: node, fallback, fail-closed).
//! - [`algorithm`]: GCRA, fixed window, sliding-window counter and sliding-window log, each a pure
//!   function of `(limit, state, now, cost)`.
//! - [`key`]: [`BucketKey`], the fixed-size identity of a (rule, key) bucket.
//! - [`lease`]: concurrency limits: at most `max` leases per key at once, each with a TTL.
//! - [`address`]: [`HostPort`], a HOST:PORT whose host may be a DNS name (resolved by the shells).
//! - [`store`]: [`BucketStore`], the sharded concurrent map of buckets, with expiry, bounded size
//!   and all-or-nothing multi-checks.
//! - [`wire`]: the frame format and messages between clients and nodes (rkyv, validated).
//! - [`policy`]: the rules file, request → checks → verdict, and the HTTP answer (429/503 fields).
//! - [`priority`]: request classes, shares of a limit kept for higher classes, the adaptive
//!   limit and shedder a gateway keeps per upstream, and the fleet's brownout level.
//! - [`rls`]: Envoy's rate limit service: envoyproxy/ratelimit's config, matching, answers.
//! - [`resp`]: the Redis protocol (RESP2 and RESP3): commands parsed under caps, replies written.
//! - [`cluster`]: membership, slots and the ownership protocol (who decides a slot while it
//!   moves), sans I/O, with its seeded simulation.
//! - [`region`]: scopes across regions and the inter-region delta exchange for global limits,
//!   sans I/O, with its seeded simulation.
//! - [`token_lease`]: token leases for hot keys: the owner's "take up to N" and the gateway's
//!   allowance (local decisions, expiry, sizing).
//! - [`simulation`]: the simulations' seeded generator, so a printed seed replays a run anywhere.
//! - [`clock`]: the [`Clock`] trait, the [`EpochClock`] the node and the client read (Unix time
//!   that never goes backwards) and the [`FakeClock`] tests use.
//!
//! Time is always `now_ns`: nanoseconds from an origin the caller picks (the node uses the Unix
//! epoch) and that never goes backwards.

pub mod address;
pub mod algorithm;
pub mod check;
pub mod clock;
pub mod cluster;
pub mod decision;
pub mod key;
pub mod lease;
pub mod limit;
mod open_addressing;
pub mod policy;
pub mod prefetch;
pub mod priority;
pub mod protocol;
pub mod region;
pub mod resp;
pub mod rls;
pub mod simulation;
pub mod store;
pub mod token_lease;
pub mod wire;

pub use address::HostPort;
pub use clock::{Clock, EpochClock, FakeClock};
pub use decision::Decision;
pub use key::BucketKey;
pub use limit::{
    Algorithm, Limit, LimitError, MAX_BURST, MAX_PERIOD_NS, MIN_PERIOD_NS, NANOS_PER_SEC,
    SLIDING_LOG_MAX_LIMIT, parse_duration_ns, parse_rate,
};
pub use store::{
    BucketCheck, BucketState, BucketStore, BucketValue, Charged, DEFAULT_MAX_STORE_BYTES,
    MIN_SHARD_BYTES, StoreConfig, StoreError, StoreStats, SweepCursor,
};
