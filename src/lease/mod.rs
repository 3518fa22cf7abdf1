//! Concurrency limits: at most `max` leases held at once per key, each reclaimed after its TTL
//! so a holder that crashes cannot leak capacity. Pure: every operation takes `now_ns`.
//!
//! - `limit`: [`LeaseLimit`], a validated `max` and TTL.
//! - `concurrency`: [`LeaseSet`], one key's leases: acquire, release, renew, reclaim, merge.
//! - `store`: [`LeaseStore`], the sharded map of lease sets, bounded node-wide, with what
//!   replication and hand-off read (changed sets, release tombstones, export) and merge; its
//!   ids come from a [`LeaseIds`] source the node gives it (a secure generator).

mod concurrency;
mod limit;
mod store;

/// A lease's id: 128 random bits (64 for a caller whose protocol version carries no more, see
/// [`LeaseIdWidth`]); 0 names no lease.
pub type LeaseId = u128;

pub use concurrency::{Acquired, Lease, LeaseSet};
pub use limit::{LeaseLimit, LeaseLimitError, MAX_LEASE_MAX, MAX_LEASE_TTL_NS, MIN_LEASE_TTL_NS};
pub use store::{
    LEASE_BYTES, LeaseIdWidth, LeaseIds, LeaseSetState, LeaseStats, LeaseStore, LeaseStoreConfig,
    LeaseStoreError, Released, Renewed,
};
