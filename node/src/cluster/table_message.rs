//! [`TableMessages`]: the slot table and members as one `SlotTable` message, as clients and
//! `floodgate status` receive them, encoded once per table and member list.

use std::sync::Arc;

use floodgate::cluster::SlotTable;
use floodgate::protocol;
use floodgate::wire::{FrameKind, SlotTableMessage, TableMember, slot_table_payload};
use parking_lot::Mutex;

use super::{Members, SlotOwnership};

/// The slot-table message clients receive, encoded once and reused while it is current.
#[derive(Debug)]
pub(crate) struct TableMessages {
    /// This node's id: the message's sender.
    me: String,
    members: Arc<Members>,
    slots: Arc<SlotOwnership>,
    /// The last slot-table payload encoded for clients, reused while it is current.
    encoded: Mutex<Option<Arc<EncodedTable>>>,
}

/// A slot-table message encoded once per version clients speak, with what it was encoded from.
#[derive(Debug)]
struct EncodedTable {
    table: Arc<SlotTable>,
    members: Vec<TableMember>,
    cluster_version: u8,
    /// Per version from `protocol::OLDEST` on: the layout's version and the payload.
    payloads: Vec<(u8, rkyv::util::AlignedVec)>,
}

impl TableMessages {
    pub(super) fn new(me: String, members: Arc<Members>, slots: Arc<SlotOwnership>) -> Self {
        TableMessages {
            me,
            members,
            slots,
            encoded: Mutex::new(None),
        }
    }

    /// Appends the slot table and members as one `SlotTable` frame for a client speaking
    /// `version`, as clients and `floodgate status` receive them. The payloads are encoded once
    /// per table and member list and reused: every client fetches or is pushed each new table,
    /// and each would otherwise map all slots to members and serialize them again.
    pub(crate) fn encode_table(&self, out: &mut Vec<u8>, version: u8, request_id: u64) {
        let table = self.slots.table();
        let cached = self.encoded.lock().clone();
        let encoded = match cached {
            Some(c)
                if Arc::ptr_eq(&c.table, &table)
                    && self.members.are(&c.members)
                    && c.cluster_version == self.members.cluster_version() =>
            {
                c
            }
            _ => {
                let message = self.table_message(&table);
                let payloads = (protocol::OLDEST..=protocol::NEWEST)
                    .map(|v| slot_table_payload(v, &message))
                    .collect();
                let encoded = Arc::new(EncodedTable {
                    table,
                    members: message.members,
                    cluster_version: message.cluster_version,
                    payloads,
                });
                *self.encoded.lock() = Some(encoded.clone());
                encoded
            }
        };
        let index = version.clamp(protocol::OLDEST, protocol::NEWEST) - protocol::OLDEST;
        if let Some((layout, payload)) = encoded.payloads.get(usize::from(index)) {
            floodgate::wire::encode_frame_at(
                out,
                *layout,
                FrameKind::SlotTable,
                request_id,
                payload,
            );
        }
    }

    /// The slot table and members as a message.
    pub(super) fn table_message(&self, table: &SlotTable) -> SlotTableMessage {
        let members = self.members.table_members();
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
            from: self.me.clone(),
            members,
            owners,
            successors,
            cluster_version: self.members.cluster_version(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::alone;
    use super::*;

    fn decoded(frame: &[u8]) -> SlotTableMessage {
        let mut reader = floodgate::wire::FrameReader::new(1 << 20);
        reader.extend(frame);
        let frame = reader.next_frame().unwrap().unwrap();
        assert_eq!(frame.kind, FrameKind::SlotTable);
        floodgate::wire::decode_slot_table(frame.version, &frame.payload).unwrap()
    }

    /// The table message is encoded once and reused while the table and members stay, and
    /// encoded again (with what changed) when either changes.
    #[tokio::test]
    async fn the_table_message_is_encoded_once_per_table_and_member_list() {
        let (_, parts) = alone();
        let (mut first, mut second) = (Vec::new(), Vec::new());
        parts.tables.encode_table(&mut first, protocol::NEWEST, 1);
        let cached = parts.tables.encoded.lock().clone().unwrap();
        parts.tables.encode_table(&mut second, protocol::NEWEST, 1);
        assert!(Arc::ptr_eq(
            &cached,
            parts.tables.encoded.lock().as_ref().unwrap()
        ));
        assert_eq!(first, second);
        assert_eq!(
            decoded(&first),
            parts.tables.table_message(&parts.slots.table())
        );
        assert_eq!(decoded(&first).owners, vec![0; floodgate::cluster::SLOTS]);

        // A member's state changes (here: this node leaves), not the table.
        drop(parts.members.membership().leave(2_000_000_000));
        let mut after_leave = Vec::new();
        parts
            .tables
            .encode_table(&mut after_leave, protocol::NEWEST, 1);
        assert_eq!(decoded(&after_leave).members[0].state, 3);

        // A new table.
        let table = Arc::new(SlotTable::compute(9, &["node-a".into(), "node-b".into()]));
        parts.slots.publish(table.clone());
        let mut new_table = Vec::new();
        parts
            .tables
            .encode_table(&mut new_table, protocol::NEWEST, 1);
        let message = decoded(&new_table);
        assert_eq!(message.epoch, 9);
        assert_eq!(message, parts.tables.table_message(&table));
    }

    /// A client of version 2 gets version 2's layout, without ranges; a newer one gets the
    /// ranges and the cluster version.
    #[tokio::test]
    async fn each_client_gets_the_table_in_the_version_it_speaks() {
        let (_, parts) = alone();
        let (mut old, mut new) = (Vec::new(), Vec::new());
        parts.tables.encode_table(&mut old, 2, 1);
        parts.tables.encode_table(&mut new, 3, 1);
        assert_eq!(old[2], 2);
        assert_eq!(new[2], 3);
        let (old, new) = (decoded(&old), decoded(&new));
        assert_eq!(old.members[0].versions, None);
        assert_eq!(old.cluster_version, 2);
        assert_eq!(new.members[0].versions, Some(protocol::SUPPORTED));
        assert_eq!(new.cluster_version, protocol::NEWEST);
        assert_eq!(old.owners, new.owners);
    }
}
