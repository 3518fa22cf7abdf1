//! The cluster's sans-I/O parts: who owns which slot. Driven by the node; pure here.
//!
//! - [`membership`]: who is in the cluster: gossip of heartbeats, suspect and dead by silence.
//! - [`slots`]: keys → slots → nodes through a consistent-hash ring, with each slot's successor.
//! - [`ownership`]: who decides a slot while it moves (hand-offs, placement), and its simulation.

pub mod membership;
pub mod ownership;
pub mod slots;

pub use membership::{
    ConflictVerdict, Gossip, IdConflict, MemberInfo, MemberState, Membership, MembershipConfig,
    Outgoing,
};
pub use slots::{SLOTS, SlotTable, slot_of};
