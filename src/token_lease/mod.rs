//! Token leases for hot keys: an owner grants a gateway a few of a key's tokens at once, the
//! gateway decides locally against them and returns what it did not use.
//!
//! - [`take`]: the owner's side, "take up to N tokens" from a bucket ([`take_up_to`]): never more
//!   than the bucket holds, and when it holds none, exactly when the next one is due.
//! - [`allowance`]: the gateway's side, one key's [`Allowance`] (tokens in hand, their expiry, a
//!   local denial until the owner's next token) and the sizing rule ([`LeaseSizing`]); pure, on
//!   an injected `now`, so the client's cache is a thin shell around it.
//!
//! Why the limit still holds: every token a gateway admits against was taken from the owner's
//! bucket by an ordinary atomic check, and a returned token is refunded as a check's refund is.
//! What can go wrong is bounded by the leases outstanding: a gateway that crashes strands its
//! unused tokens (the key under-admits by at most that lease, refilled at the limit's rate), and
//! an owner that crashes before replicating a grant lets its successor grant those tokens again
//! (over-admission of at most the leases it granted since its last replication round).

pub mod allowance;
pub mod take;

pub use allowance::{Allowance, LeaseSizing, LocalDecision, RateMeter};
pub use take::{Grant, take_up_to};
