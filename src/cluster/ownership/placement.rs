//! Placement of one check by one node's table: decide here, forward to the owner, take over
//! for a lost owner, or refuse. Pure functions of the table and what this node gave away.

use crate::cluster::SlotTable;

/// How a check reached this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// From a client that routes it to the owner (or does not know the owner).
    Client,
    /// From a client that cannot reach the owner, marked for the slot's successor.
    Takeover,
    /// From a node that does not own it (whose table names this node).
    Forwarded,
}

impl Arrival {
    /// How a client's request arrived: marked `takeover` for the successor, or not.
    pub fn from_client(takeover: bool) -> Self {
        if takeover {
            Arrival::Takeover
        } else {
            Arrival::Client
        }
    }
}

/// Why a check is not decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// This node handed the slot off (or left): the sender must place it again.
    NotOwner,
    /// Nobody here can decide it: the node is leaving, or the owner refused twice.
    ShuttingDown,
    /// Not decided now, to keep one decider: the slot's state is on its way from its previous
    /// owner, or its owner is alive (not suspected by the failure detector) but did not answer
    /// a forward in time. The caller may send it again shortly.
    TryAgain,
}

/// Where a check goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// Decided here, by the owner (or once, by a node the sender's newer table names).
    Decide,
    /// Decided here by the slot's successor for a client that lost the owner: from the
    /// owner's replicas, as it will once the owner is declared dead.
    Takeover,
    /// Sent to this owner.
    Forward(String),
    /// Answered with this refusal.
    Refuse(Refusal),
}

/// How a forward failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failed {
    /// The node it was sent to answered `not_owner` (it had handed the slot off).
    NotOwner(String),
    /// No answer came in time.
    Unanswered,
}

/// Where a check on `slot` goes first, by `table` as `me` sees it. `suspected` says whether
/// this node's failure detector holds a member suspect (or worse).
pub fn first_place(
    table: &SlotTable,
    me: &str,
    slot: u16,
    arrival: Arrival,
    gave_away: impl Fn(u16) -> bool,
    suspected: impl Fn(&str) -> bool,
) -> Placement {
    let owner = table.owner(slot);
    if owner == Some(me) {
        return Placement::Decide;
    }
    let left = !table.contains(me);
    if arrival == Arrival::Takeover && table.successor(slot) == Some(me) && !left {
        return match owner {
            // The client lost its link to an owner this node hears from: a slow moment, or a
            // fault between that client and the owner only. The owner stays the one decider;
            // should it not answer in time, the check is answered `TryAgain`.
            Some(owner) if !suspected(owner) => Placement::Forward(owner.to_owned()),
            // The owner has been silent past the failure detector's suspicion. This node holds
            // its replicas (at most one sync interval old) and decides from them, as it will
            // once the owner is declared dead: one shared decider, where otherwise every
            // client's fallback bucket would decide alone. Its decisions replicate to the
            // owner, should the owner be alive after all.
            _ => Placement::Takeover,
        };
    }
    if arrival == Arrival::Forwarded {
        // The sender's table names this node. A slot handed off (or a node that left) is
        // never decided here; a slot never held is decided once, here (our table did not catch
        // up in time; forwarding on could loop).
        return if left || gave_away(slot) {
            Placement::Refuse(Refusal::NotOwner)
        } else {
            Placement::Decide
        };
    }
    match owner {
        Some(owner) => Placement::Forward(owner.to_owned()),
        // A node that has left, and was the last: nobody owns anything.
        None => Placement::Refuse(Refusal::ShuttingDown),
    }
}

/// Where a check goes after its first forward failed (`last_round`: it was forwarded twice).
pub fn next_place(
    table: &SlotTable,
    me: &str,
    slot: u16,
    failed: &Failed,
    last_round: bool,
    gave_away: impl Fn(u16) -> bool,
    suspected: impl Fn(&str) -> bool,
) -> Placement {
    let owner = table.owner(slot);
    match failed {
        Failed::NotOwner(refuser) => match owner {
            Some(owner) if owner == me => Placement::Decide,
            Some(owner) if owner != refuser && !last_round => Placement::Forward(owner.to_owned()),
            _ => Placement::Refuse(Refusal::ShuttingDown),
        },
        // An owner that does not answer. Alive by the failure detector, it is slow for a
        // moment and may decide the check yet: not decided here, so a stall never makes a
        // second decider. Suspected (silent for longer), it has probably crashed and is not
        // yet declared dead: decided here rather than failed (availability over exactness; the
        // bucket replicates to the owner like any other), unless this node has left or handed
        // the slot off.
        Failed::Unanswered => {
            let left = !table.contains(me);
            match owner {
                None => Placement::Refuse(Refusal::ShuttingDown),
                // Asked first: the owner may answer the next try (a node that took the slot
                // over, or handed it off, sends it to the owner the same way).
                Some(owner) if owner != me && !suspected(owner) => {
                    Placement::Refuse(Refusal::TryAgain)
                }
                _ if left || gave_away(slot) => Placement::Refuse(Refusal::ShuttingDown),
                Some(_) => Placement::Decide,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(nodes: &[&str]) -> SlotTable {
        let nodes: Vec<String> = nodes.iter().map(|n| n.to_string()).collect();
        SlotTable::compute(1, &nodes)
    }

    fn slot_owned_by(table: &SlotTable, node: &str) -> u16 {
        (0..crate::cluster::SLOTS as u16)
            .find(|&s| table.owner(s) == Some(node))
            .unwrap()
    }

    const NEVER: fn(u16) -> bool = |_| false;
    const ALWAYS: fn(u16) -> bool = |_| true;
    /// Every member alive, as this node's failure detector sees it.
    const ALIVE: fn(&str) -> bool = |_| false;
    const SUSPECTED: fn(&str) -> bool = |_| true;
    const NOT_OWNER: Placement = Placement::Refuse(Refusal::NotOwner);
    const SHUTTING_DOWN: Placement = Placement::Refuse(Refusal::ShuttingDown);

    #[test]
    fn a_client_check_is_decided_by_its_owner_and_forwarded_otherwise() {
        let t = table(&["a", "b", "c"]);
        let mine = slot_owned_by(&t, "a");
        let theirs = slot_owned_by(&t, "b");
        assert_eq!(
            first_place(&t, "a", mine, Arrival::Client, NEVER, ALIVE),
            Placement::Decide
        );
        assert_eq!(
            first_place(&t, "a", theirs, Arrival::Client, NEVER, ALIVE),
            Placement::Forward("b".into())
        );
    }

    #[test]
    fn a_forwarded_check_for_a_slot_handed_off_or_after_leaving_is_refused() {
        let t = table(&["a", "b", "c"]);
        let theirs = slot_owned_by(&t, "b");
        assert_eq!(
            first_place(&t, "a", theirs, Arrival::Forwarded, ALWAYS, ALIVE),
            NOT_OWNER
        );
        // Never held: the sender's table is newer; decided here, never forwarded on.
        assert_eq!(
            first_place(&t, "a", theirs, Arrival::Forwarded, NEVER, ALIVE),
            Placement::Decide
        );
        // A node that left is in nobody's table, its own included.
        let after_leave = table(&["b", "c"]);
        let slot = slot_owned_by(&after_leave, "b");
        assert_eq!(
            first_place(&after_leave, "a", slot, Arrival::Forwarded, NEVER, ALIVE),
            NOT_OWNER
        );
        assert_eq!(
            first_place(&after_leave, "a", slot, Arrival::Client, NEVER, ALIVE),
            Placement::Forward("b".into())
        );
        assert_eq!(
            first_place(&table(&[]), "a", 7, Arrival::Client, NEVER, ALIVE),
            SHUTTING_DOWN
        );
    }

    #[test]
    fn a_takeover_is_decided_by_its_successor_once_the_owner_is_suspected_and_forwarded_otherwise()
    {
        let t = table(&["a", "b", "c"]);
        let slot = (0..crate::cluster::SLOTS as u16)
            .find(|&s| t.owner(s) == Some("b") && t.successor(s) == Some("a"))
            .unwrap();
        assert_eq!(
            first_place(&t, "a", slot, Arrival::Takeover, NEVER, SUSPECTED),
            Placement::Takeover
        );
        assert_eq!(
            first_place(&t, "a", slot, Arrival::Takeover, NEVER, ALIVE),
            Placement::Forward("b".into()),
            "an owner this node hears from stays the decider"
        );
        assert_eq!(
            first_place(&t, "c", slot, Arrival::Takeover, NEVER, ALIVE),
            Placement::Forward("b".into()),
            "not the successor: to the owner"
        );
        let after_leave = table(&["b", "c"]);
        assert_eq!(
            first_place(&after_leave, "a", slot, Arrival::Takeover, NEVER, ALIVE),
            Placement::Forward("b".into()),
            "a node that left takes nothing over"
        );
    }

    #[test]
    fn a_refused_check_goes_to_the_owner_the_table_names_now_at_most_once_more() {
        let t = table(&["a", "b", "c"]);
        let mine = slot_owned_by(&t, "a");
        let cs = slot_owned_by(&t, "c");
        let by_b = Failed::NotOwner("b".into());
        assert_eq!(
            next_place(&t, "a", mine, &by_b, false, NEVER, ALIVE),
            Placement::Decide
        );
        assert_eq!(
            next_place(&t, "a", cs, &by_b, false, NEVER, ALIVE),
            Placement::Forward("c".into())
        );
        assert_eq!(
            next_place(&t, "a", cs, &by_b, true, NEVER, ALIVE),
            SHUTTING_DOWN
        );
        // Our table still names the refuser: it did not catch up in time.
        let bs = slot_owned_by(&t, "b");
        assert_eq!(
            next_place(&t, "a", bs, &by_b, false, NEVER, ALIVE),
            SHUTTING_DOWN
        );
    }

    #[test]
    fn an_unanswered_check_is_decided_here_only_once_its_owner_is_suspected() {
        let t = table(&["a", "b"]);
        let bs = slot_owned_by(&t, "b");
        let unanswered = Failed::Unanswered;
        assert_eq!(
            next_place(&t, "a", bs, &unanswered, false, NEVER, SUSPECTED),
            Placement::Decide
        );
        assert_eq!(
            next_place(&t, "a", bs, &unanswered, false, NEVER, ALIVE),
            Placement::Refuse(Refusal::TryAgain),
            "a slow owner may still decide it: never a second decider"
        );
        assert_eq!(
            next_place(&t, "a", bs, &unanswered, false, ALWAYS, SUSPECTED),
            SHUTTING_DOWN
        );
        assert_eq!(
            next_place(&t, "a", bs, &unanswered, false, ALWAYS, ALIVE),
            Placement::Refuse(Refusal::TryAgain),
            "handed off here, but its owner is alive: the next try may reach it"
        );
        // A node that left decides nothing, whatever the owner's state.
        let after_leave = table(&["b"]);
        assert_eq!(
            next_place(&after_leave, "a", bs, &unanswered, true, NEVER, SUSPECTED),
            SHUTTING_DOWN
        );
        assert_eq!(
            next_place(&after_leave, "a", bs, &unanswered, true, NEVER, ALIVE),
            Placement::Refuse(Refusal::TryAgain)
        );
    }
}
