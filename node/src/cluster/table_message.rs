//! The slot table and members as one `SlotTable` message, as clients and `floodgate status`
//! receive them, encoded once per table and member list.

use std::sync::Arc;

use floodgate::cluster::SlotTable;
use floodgate::wire::{FrameKind, SlotTableMessage, TableMember, member_state_to_wire};

use super::Cluster;

/// A slot-table message encoded once, with what it was encoded from.
#[derive(Debug)]
pub(super) struct EncodedTable {
    table: Arc<SlotTable>,
    members: Vec<TableMember>,
    payload: rkyv::util::AlignedVec,
}

impl Cluster {
    /// Appends the slot table and members as one `SlotTable` frame, as clients and `floodgate
    /// status` receive them. The payload is encoded once per table and member list and reused:
    /// every client fetches or is pushed each new table, and each would otherwise map all slots
    /// to members and serialize them again.
    pub(crate) fn encode_table(&self, out: &mut Vec<u8>, request_id: u64) {
        let table = self.table();
        let cached = self.encoded_table.lock().clone();
        let encoded = match cached {
            Some(c) if Arc::ptr_eq(&c.table, &table) && self.members_are(&c.members) => c,
            _ => {
                let message = self.table_message(&table);
                // Serializing plain vectors into memory cannot fail; an empty payload would be
                // refused by the receiver's validation, never misread.
                let payload = rkyv::to_bytes::<rkyv::rancor::Error>(&message).unwrap_or_default();
                let encoded = Arc::new(EncodedTable {
                    table,
                    members: message.members,
                    payload,
                });
                *self.encoded_table.lock() = Some(encoded.clone());
                encoded
            }
        };
        floodgate::wire::encode_frame(out, FrameKind::SlotTable, request_id, &encoded.payload);
    }

    /// True when the members and their states are still exactly `members`.
    pub(super) fn members_are(&self, members: &[TableMember]) -> bool {
        let membership = self.membership.lock();
        let mut now = membership.members();
        members.iter().all(|m| {
            now.next().is_some_and(|(info, state)| {
                m.id == info.id
                    && m.addr == info.addr
                    && m.region == info.region
                    && m.state == member_state_to_wire(state)
            })
        }) && now.next().is_none()
    }

    /// The slot table and members as a message.
    pub(super) fn table_message(&self, table: &SlotTable) -> SlotTableMessage {
        let members: Vec<TableMember> = self
            .membership
            .lock()
            .members()
            .map(|(info, state)| TableMember {
                id: info.id.clone(),
                addr: info.addr.clone(),
                region: info.region.clone(),
                state: member_state_to_wire(state),
            })
            .collect();
        // Each table node's member index, looked up once, not once per slot.
        let member_of: Vec<u16> = table
            .nodes()
            .iter()
            .map(|id| {
                members
                    .iter()
                    .position(|m| m.id == *id)
                    .map_or(u16::MAX, |i| i as u16)
            })
            .collect();
        let to_member = |node: Option<usize>| node.map_or(u16::MAX, |i| member_of[i]);
        let owners = (0..floodgate::cluster::SLOTS as u16)
            .map(|s| to_member(table.owner_index(s)))
            .collect();
        let successors = (0..floodgate::cluster::SLOTS as u16)
            .map(|s| to_member(table.successor_index(s)))
            .collect();
        SlotTableMessage {
            version: table.version(),
            epoch: table.epoch(),
            from: self.me.id.clone(),
            members,
            owners,
            successors,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::cluster_alone;
    use super::*;

    fn decoded(frame: &[u8]) -> SlotTableMessage {
        let mut reader = floodgate::wire::FrameReader::new(1 << 20);
        reader.extend(frame);
        let frame = reader.next_frame().unwrap().unwrap();
        assert_eq!(frame.kind, FrameKind::SlotTable);
        floodgate::wire::decode_slot_table(&frame.payload).unwrap()
    }

    /// The table message is encoded once and reused while the table and members stay, and
    /// encoded again (with what changed) when either changes.
    #[tokio::test]
    async fn the_table_message_is_encoded_once_per_table_and_member_list() {
        let cluster = cluster_alone();
        let (mut first, mut second) = (Vec::new(), Vec::new());
        cluster.encode_table(&mut first, 1);
        let cached = cluster.encoded_table.lock().clone().unwrap();
        cluster.encode_table(&mut second, 1);
        assert!(Arc::ptr_eq(
            &cached,
            cluster.encoded_table.lock().as_ref().unwrap()
        ));
        assert_eq!(first, second);
        assert_eq!(decoded(&first), cluster.table_message(&cluster.table()));
        assert_eq!(decoded(&first).owners, vec![0; floodgate::cluster::SLOTS]);

        // A member's state changes (here: this node leaves), not the table.
        drop(cluster.membership.lock().leave(2_000_000_000));
        let mut after_leave = Vec::new();
        cluster.encode_table(&mut after_leave, 1);
        assert_eq!(decoded(&after_leave).members[0].state, 3);

        // A new table.
        let table = Arc::new(SlotTable::compute(9, &["node-a".into(), "node-b".into()]));
        cluster.table.send_replace(table.clone());
        let mut new_table = Vec::new();
        cluster.encode_table(&mut new_table, 1);
        let message = decoded(&new_table);
        assert_eq!(message.epoch, 9);
        assert_eq!(message, cluster.table_message(&table));
    }
}
