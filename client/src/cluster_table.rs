//! `ClusterTable`: a node's slot table as the client receives it, with the members' addresses.

use floodgate::cluster::{MemberState, slot_of};
use floodgate::wire::{SlotTableMessage, member_state_from_wire};

/// One member of the cluster as the table lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterMember {
    pub id: String,
    /// The address the member serves clients at ("IP:port").
    pub addr: String,
    pub region: String,
    pub state: MemberState,
}

/// A node's slot table: who is in the cluster and who owns each of the
/// [`floodgate::cluster::SLOTS`] slots. Equal `version`s mean equal owners.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterTable {
    /// A hash of the owners' ids: the same on every node that sees the same owners.
    pub version: u64,
    /// The sending node's own count of ownership changes.
    pub epoch: u64,
    /// Id of the node that sent the table.
    pub from: String,
    /// Every member the node knows, sorted by id (departed and dead ones for a while too).
    pub members: Vec<ClusterMember>,
    /// `owners[slot]` indexes `members`; out of range (`u16::MAX`): nobody.
    pub(crate) owners: Vec<u16>,
    /// `successors[slot]`: who holds the slot's replicas and takes it over if its owner fails.
    pub(crate) successors: Vec<u16>,
}

impl ClusterTable {
    /// From a validated message (`decode_slot_table` checked the owners' range and count).
    pub(crate) fn from_message(message: SlotTableMessage) -> Self {
        ClusterTable {
            version: message.version,
            epoch: message.epoch,
            from: message.from,
            members: message
                .members
                .into_iter()
                .map(|m| ClusterMember {
                    id: m.id,
                    addr: m.addr,
                    region: m.region,
                    state: member_state_from_wire(m.state),
                })
                .collect(),
            owners: message.owners,
            successors: message.successors,
        }
    }

    /// The member that owns `slot`.
    pub fn owner(&self, slot: u16) -> Option<&ClusterMember> {
        let index = *self.owners.get(usize::from(slot))?;
        self.members.get(usize::from(index))
    }

    /// The member that takes `slot` over if its owner fails (it holds the replicas).
    pub fn successor(&self, slot: u16) -> Option<&ClusterMember> {
        let index = *self.successors.get(usize::from(slot))?;
        self.members.get(usize::from(index))
    }

    /// The member that decides a call whose first key is `key`.
    pub fn owner_of_key(&self, key: &[u8]) -> Option<&ClusterMember> {
        self.owner(slot_of(key))
    }

    /// How many slots the member with this id owns.
    pub fn slots_owned(&self, id: &str) -> usize {
        match self.members.iter().position(|m| m.id == id) {
            Some(i) => self.owners.iter().filter(|&&o| usize::from(o) == i).count(),
            None => 0,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use floodgate::cluster::{SLOTS, SlotTable};
    use floodgate::wire::{TableMember, member_state_to_wire};

    use super::*;

    /// No member.
    const NONE: u16 = u16::MAX;

    /// The table message a node of the cluster `ids` sends (member i at 127.0.0.1:7100 + i).
    pub(crate) fn message(ids: &[&str]) -> SlotTableMessage {
        let ids: Vec<String> = ids.iter().map(|s| (*s).to_owned()).collect();
        let table = SlotTable::compute(3, &ids);
        let members: Vec<TableMember> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| TableMember {
                id: id.clone(),
                addr: format!("127.0.0.1:{}", 7100 + i),
                region: "local".to_owned(),
                state: member_state_to_wire(MemberState::Alive),
            })
            .collect();
        let index = |id: Option<&str>| {
            id.map_or(NONE, |id| ids.iter().position(|i| i == id).unwrap() as u16)
        };
        SlotTableMessage {
            version: table.version(),
            epoch: table.epoch(),
            from: ids[0].clone(),
            members,
            owners: (0..SLOTS as u16).map(|s| index(table.owner(s))).collect(),
            successors: (0..SLOTS as u16)
                .map(|s| index(table.successor(s)))
                .collect(),
        }
    }

    #[test]
    fn a_table_names_each_slots_owner_as_the_nodes_compute_it() {
        let ids = ["node-a", "node-b", "node-c"];
        let table = ClusterTable::from_message(message(&ids));
        let core = SlotTable::compute(1, &ids.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
        assert_eq!(table.version, core.version());
        for i in 0..1_000u32 {
            let key = format!("user:{i}");
            assert_eq!(
                table.owner_of_key(key.as_bytes()).map(|m| m.id.as_str()),
                core.owner_of_key(key.as_bytes())
            );
        }
        let total: usize = ids.iter().map(|id| table.slots_owned(id)).sum();
        assert_eq!(total, SLOTS);
        assert_eq!(table.slots_owned("nobody"), 0);
    }
}
