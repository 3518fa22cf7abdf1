//! `ClusterTable`: a node's slot table as the client receives it, with the members' addresses.

use floodgate::cluster::{MemberState, SLOTS, SlotTable, slot_of};
use floodgate::protocol::VersionRange;
use floodgate::wire::{SlotTableMessage, member_state_from_wire};

/// One member of the cluster as the table lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterMember {
    pub id: String,
    /// The address the member serves clients at ("IP:port").
    pub addr: String,
    pub region: String,
    pub state: MemberState,
    /// The protocol versions it speaks, as the node that sent the table knows them; `None` from
    /// a node of a build before versions were negotiated (it speaks version 2).
    pub versions: Option<VersionRange>,
}

/// A node's slot table as it sent it: the core's [`SlotTable`] (who owns and who succeeds each
/// of the [`floodgate::cluster::SLOTS`] slots), plus every member's address, region and state.
/// Equal versions mean equal owners.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterTable {
    from: String,
    members: Vec<ClusterMember>,
    slots: SlotTable,
    /// `member_of[i]`: the index in `members` of node `i` of `slots`.
    member_of: Vec<usize>,
    cluster_version: u8,
}

impl ClusterTable {
    /// From a message `decode_slot_table` validated; refuses a table naming a member twice.
    pub(crate) fn from_message(message: SlotTableMessage) -> Result<Self, String> {
        let ids: Vec<String> = message.members.iter().map(|m| m.id.clone()).collect();
        let slots = SlotTable::from_reported(
            message.epoch,
            message.version,
            &ids,
            &message.owners,
            &message.successors,
        )?;
        let member_of = slots
            .nodes()
            .iter()
            .map(|id| ids.iter().position(|m| m == id).unwrap_or(usize::MAX))
            .collect();
        let members = message
            .members
            .into_iter()
            .map(|m| ClusterMember {
                id: m.id,
                addr: m.addr,
                region: m.region,
                state: member_state_from_wire(m.state),
                versions: m.versions,
            })
            .collect();
        Ok(ClusterTable {
            from: message.from,
            members,
            slots,
            member_of,
            cluster_version: message.cluster_version,
        })
    }

    /// A hash of the owners' ids: the same on every node that sees the same owners.
    pub fn version(&self) -> u64 {
        self.slots.version()
    }

    /// The sending node's own count of ownership changes.
    pub fn epoch(&self) -> u64 {
        self.slots.epoch()
    }

    /// The highest protocol version every member speaks, as the sending node knows it (2 from
    /// a node of a build before versions were negotiated; 0 when the members share none).
    pub fn cluster_version(&self) -> u8 {
        self.cluster_version
    }

    /// Id of the node that sent the table.
    pub fn from(&self) -> &str {
        &self.from
    }

    /// Every member the node knows, sorted by id (departed and dead ones for a while too).
    pub fn members(&self) -> &[ClusterMember] {
        &self.members
    }

    /// Who owns and who succeeds each slot.
    pub fn slots(&self) -> &SlotTable {
        &self.slots
    }

    /// The member that owns `slot`.
    pub fn owner(&self, slot: u16) -> Option<&ClusterMember> {
        self.members.get(self.owner_member(slot)?)
    }

    /// The member that takes `slot` over if its owner fails (it holds the replicas).
    pub fn successor(&self, slot: u16) -> Option<&ClusterMember> {
        self.members.get(self.successor_member(slot)?)
    }

    /// The member that decides a call whose first key is `key`.
    pub fn owner_of_key(&self, key: &[u8]) -> Option<&ClusterMember> {
        self.owner(slot_of(key))
    }

    /// How many slots the member with this id owns.
    pub fn slots_owned(&self, id: &str) -> usize {
        self.slots.slots_owned(id)
    }

    /// Index in [`ClusterTable::members`] of `slot`'s owner.
    pub(crate) fn owner_member(&self, slot: u16) -> Option<usize> {
        self.member_of.get(self.slots.owner_index(slot)?).copied()
    }

    /// Index in [`ClusterTable::members`] of `slot`'s successor.
    pub(crate) fn successor_member(&self, slot: u16) -> Option<usize> {
        self.member_of
            .get(self.slots.successor_index(slot)?)
            .copied()
    }

    /// True when `other` routes every slot as this table does, to the same members: another
    /// node's copy of the same table differs only in `from` and `epoch`.
    pub(crate) fn routes_like(&self, other: &ClusterTable) -> bool {
        self.version() == other.version()
            && self.members == other.members
            && self.slots.nodes() == other.slots.nodes()
            && (0..SLOTS as u16).all(|s| {
                self.slots.owner_index(s) == other.slots.owner_index(s)
                    && self.slots.successor_index(s) == other.slots.successor_index(s)
            })
    }
}

#[cfg(test)]
pub(crate) mod tests {
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
                versions: Some(floodgate::protocol::SUPPORTED),
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
            cluster_version: floodgate::protocol::NEWEST,
        }
    }

    #[test]
    fn a_table_names_each_slots_owner_as_the_nodes_compute_it() {
        let ids = ["node-a", "node-b", "node-c"];
        let table = ClusterTable::from_message(message(&ids)).unwrap();
        let core = SlotTable::compute(1, &ids.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
        assert_eq!(table.version(), core.version());
        assert_eq!(table.slots().nodes(), core.nodes());
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
