//! Regions: where a check is decided across regions ([`Scope`]), and the inter-region delta
//! exchange that makes a `global` limit one limit shared by every region, as a sans-I/O machine
//! ([`Exchange`]).
//!
//! Every node has a region; each region has its own owners, so a key has one owner per region.
//! A `global` check is decided at once by the owner in the gateway's region, from a bucket that
//! also holds what the other regions consumed: every sync interval each owner sends the units it
//! admitted to the owner of the same key in every other region, batched per destination node,
//! numbered so each is applied exactly once, sent again until acknowledged, aggregated per key
//! while a destination is unreachable. The admission rule (`admission`) bounds what the regions
//! can admit together before they have heard of each other.
//!
//! - `scope`: [`Scope`] and [`RegionName`].
//! - `config`: [`ExchangeConfig`], every interval and bound.
//! - `delta`: the messages ([`DeltaBatch`], [`DeltaAck`]) and [`Peer`].
//! - `outbox`: per destination, pending deltas, messages in flight, unconfirmed units
//!   (`key_table`: its per-key counts).
//! - `inbox`: per sender, exactly-once application by sequence number.
//! - `route`: [`Route`], where a received delta goes when this region's ownership moved.
//! - `inherited`: [`UnconfirmedUnits`], what other regions had not confirmed when a key moved
//!   to another node of this region, handed over with it and counted by the new decider.
//! - `admission`: the local admission rule for global keys and its bound.
//! - `exchange`: [`Exchange`], the machine tying them to a [`crate::BucketStore`].
//! - `home`: [`home_fallback_limit`], a `home` check's local share when its home is away.
//! - [`sim`]: a seeded simulation of three regions over a lossy network, asserting the bound.

mod admission;
mod config;
mod delta;
mod exchange;
mod home;
mod inbox;
mod inherited;
mod key_table;
mod outbox;
mod route;
mod scope;
pub mod sim;

pub use admission::{over_admission_bound, share_allows};
pub use config::ExchangeConfig;
pub use delta::{Delta, DeltaAck, DeltaBatch, MAX_ACK_RANGES, Outgoing, Peer, Transmit};
pub use exchange::{DestinationStats, Exchange, ExchangeStats};
pub use home::home_fallback_limit;
pub use inbox::DEDUPE_WINDOW;
pub use inherited::UnconfirmedUnits;
pub use route::Route;
pub use scope::{MAX_REGION_NAME_BYTES, RegionName, RegionNameError, Scope, ScopeError};
