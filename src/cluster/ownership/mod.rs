//! Slot ownership while slots move, as a sans-I/O state machine: who decides a slot, when a
//! gained slot may be decided, what a node owes as hand-offs, and where a check goes.
//!
//! The node drives one [`Ownership`] per process in quinn-proto's shape: it feeds tables from
//! membership ([`Ownership::handle_table`]), hand-off parts ([`Ownership::handle_handoff`]),
//! the join's progress and timers ([`Ownership::handle_timeout`] when
//! [`Ownership::poll_timeout`] says), carries out what [`Ownership::poll_action`] returns
//! (send a hand-off, wake checks waiting for the join), and asks [`Ownership::place`] where
//! each check goes. No clock, no task, no runtime: time is the `now_ns` passed in.
//!
//! # The invariant
//!
//! **At most one node decides a slot at a time**, except in these windows, each bounded. Each
//! names the other decider it allows; the simulation's checker excuses a pair of deciders only
//! through a window that names the other one.
//!
//! 1. **Wait expired** ([`Window::WaitExpired`]): a gained slot waits for the complete
//!    hand-off (every part) from its previous owner that lists it, at most
//!    `handoff_wait_alive_ns` (5 s) while the driver's failure detector holds that owner alive
//!    ([`Ownership::handle_suspicion`]) and `handoff_wait_ns` (500 ms) from the wait's start
//!    once it is suspected. When the wait runs out first (the previous owner is stalled longer
//!    than that, has not switched tables yet, or a part was lost), the new owner decides from
//!    what it has while that previous owner may still decide. It ends when that owner's hand-off carrying the
//!    slot arrives, or the slot is given away.
//! 2. **Owner declared dead** ([`Window::OwnerDeclaredDead`]): a slot gained from a member
//!    this node's membership holds dead (not departed) does not wait: no hand-off comes, the
//!    successor decides from its replicas. If that member is alive after all (lost heartbeats),
//!    both decide until one of them switches tables again. Ends as window 1 does.
//! 3. **Alone** ([`Window::Alone`]): a node started with seeds waits (bounded, per check) for
//!    its join; when the wait runs out it decides everything with its table of one (beside
//!    anyone) until its first real table.
//! 4. **Joined on a guess** ([`Window::JoinedGuessing`]): a node's first real table is made
//!    from the members it has heard of, and so is its guess of who owned each slot before it
//!    came (the same table without itself), whose hand-off it waits for. When the others'
//!    tables differ (it joined through a member that is itself still joining, or it heard of
//!    a restarted member before they did), the member that really owns a slot in its own
//!    table may still decide it until it hears of the newcomer and hands it over (a gossip
//!    round or so). The window covers every decider but the guessed previous owner (whose
//!    hand-off arrived), and is marked while the newcomer keeps the slot. Views that differ
//!    can also send a hand-off to a member whose own table gives the slot to a third: a
//!    joining member passes what it received on with its announcement, a joined one sends it
//!    on to that owner as replicas (merged, only ever stricter), and the owner may decide
//!    before they land.
//! 5. **Split views**: two nodes whose tables do not name each other at all (a partition;
//!    each holding the other dead, as after a crash and restart while gossip was lost; or two
//!    newcomers that joined through one member before hearing of each other, the member's
//!    release to the second listing slots its table gave the first a moment before) each
//!    decide the slots their own table gives them, until gossip reaches both. The checker
//!    knows this one from the pair of tables; a table that names the other decider excuses
//!    nothing.
//! 6. **Owner suspected** ([`Window::OwnerSuspected`], outside the machine: the driver's): a
//!    **takeover** ([`Placement::Takeover`]) is decided by the slot's successor for a client
//!    that lost the owner, and a forward **unanswered** in time is decided by the forwarder,
//!    each only once the failure detector suspects the owner (silent for 500 ms by default):
//!    an owner that is merely slow stays the one decider, and the check is answered
//!    [`Refusal::TryAgain`]. An owner that announced its leave is not suspected: it hands
//!    its buckets over, and replicas would miss its last decisions. So a stall shorter than the suspicion timeout never makes a second
//!    decider; a longer one can, until the owner is heard from or declared dead, from replicas
//!    at most one replication interval old. The window names the suspected owner; the machine
//!    never marks it.
//!
//! Also outside the machine: a **forwarded** check for a slot this node never held is decided
//! once here when its table has not caught up with the sender's (after a bounded wait); no
//! window covers it. (Every node's first table is of one, owning every slot, so after its first
//! switch a node counts each slot it does not own as handed off: in practice such a check is
//! refused `not_owner`, and an unanswered forward is refused, not decided.) A check for a slot still waiting for its hand-off is answered
//! [`Refusal::TryAgain`] at once ([`Ownership::place`]), so no frame waits on another group's
//! hand-off; only a caller of a version before that answer waits (bounded) and, finding the
//! slot waiting again under the gate a third time (the table switched meanwhile), is decided
//! then.
//!
//! What closes every other gap: a table switch happens with no decision under the old table
//! in flight (the driver's gate) and the hand-off is exported after it, so it holds every
//! decision made under the old table; a slot given away is never decided again until owned
//! again (a forwarder is told `not_owner`); a hand-off that arrived before the switch counts
//! while recent, one for a slot given away since does not.
//!
//! [`sim`] runs many machines over a delaying, losing, duplicating, reordering network with
//! crashes, restarts, joins, leaves and stalls, and clients whose breakers open on owners that
//! do not answer; it drives each machine as the node's driver does (decisions, forwards,
//! takeovers, `TryAgain`, and the shortcut of a node alone in its table). It checks this
//! invariant at every change of the machines, and at every decision against every other node
//! deciding that slot then: a pair is excused only by a window above that names the other
//! decider (window 6 only while the decider's failure detector holds the other suspect or
//! dead).

mod handoffs;
mod machine;
mod placement;
pub mod sim;

pub use handoffs::{Handoffs, MAX_PARTIAL, PARTIAL_TTL_NS, ReceivedPart};
pub use machine::{Action, HandOff, Ownership, OwnershipConfig, Phase, Window};
pub use placement::{Arrival, Failed, Placement, Refusal, first_place, next_place};
