//! The other regions' rings: one slot table per region, computed from that region's members in
//! the one membership view, so this node finds the owner of a key in every other region (where
//! its global keys' deltas go). [`OtherRegions`] keeps the current ones.

use std::collections::BTreeMap;
use std::sync::Arc;

use floodgate::cluster::{Membership, SLOTS, SlotTable};
use floodgate::region::{Peer, RegionName};
use parking_lot::RwLock;

/// The other regions' rings as of the last change of owners, recomputed when the membership's
/// epoch moves.
#[derive(Debug, Default)]
pub(crate) struct OtherRegions {
    rings: RwLock<Arc<RegionRings>>,
}

impl OtherRegions {
    /// The other regions' rings as of the last change of owners.
    pub(crate) fn rings(&self) -> Arc<RegionRings> {
        self.rings.read().clone()
    }

    /// Recomputes the rings from `membership` (this node in region `mine`) when its epoch is
    /// not theirs.
    pub(super) fn follow(&self, membership: &Membership, mine: &str) {
        if self.rings.read().epoch() != membership.epoch() {
            let rings = RegionRings::compute(membership, mine);
            *self.rings.write() = Arc::new(rings);
        }
    }
}

/// Per slot of the ring, the owners of that slot in each of `tables`' regions that has one, as
/// an index into a list of the distinct owner lists: a few lists (one per combination of
/// owners) shared by all the slots they own.
fn owners_by_slot(tables: &BTreeMap<RegionName, Arc<SlotTable>>) -> OwnersBySlot {
    let nodes: Vec<Vec<Peer>> = tables
        .iter()
        .map(|(region, table)| {
            let nodes = table.nodes().iter();
            nodes.map(|node| Peer::new(region.clone(), node)).collect()
        })
        .collect();
    let mut index_of: BTreeMap<Box<[Peer]>, u16> = BTreeMap::new();
    let mut lists: Vec<Box<[Peer]>> = Vec::new();
    let slots = (0..SLOTS)
        .map(|slot| {
            let slot = slot as u16;
            let owners: Box<[Peer]> = tables
                .values()
                .zip(&nodes)
                .filter_map(|(table, peers)| peers.get(table.owner_index(slot)?).cloned())
                .collect();
            // At most one new list per slot, and SLOTS fits a u16.
            *index_of.entry(owners).or_insert_with_key(|owners| {
                lists.push(owners.clone());
                (lists.len() - 1) as u16
            })
        })
        .collect();
    OwnersBySlot { lists, slots }
}

/// Each slot's owners in the other regions: read at every global check, so made once per
/// epoch (not a node name allocated per check), and compact (a slot's entry is two bytes, not
/// an allocation of its own, which cost a cache miss per check on cold slots).
#[derive(Debug, Default)]
struct OwnersBySlot {
    /// The distinct owner lists.
    lists: Vec<Box<[Peer]>>,
    /// Per slot, its list in `lists`.
    slots: Vec<u16>,
}

/// Every other region's slot table, as of one membership epoch.
#[derive(Debug, Default)]
pub(crate) struct RegionRings {
    epoch: u64,
    /// How many regions the membership knows (this one included), whatever their members' state.
    regions: usize,
    tables: BTreeMap<RegionName, Arc<SlotTable>>,
    /// Per slot, its owner in every other region that has one.
    owners_by_slot: OwnersBySlot,
}

impl RegionRings {
    /// The rings of every region but `mine`, computed from `membership`. A region whose name is
    /// not a valid region name (a peer's label from gossip) is left out.
    pub(crate) fn compute(membership: &Membership, mine: &str) -> Self {
        let names = membership.regions();
        let tables = names
            .iter()
            .filter(|r| r.as_str() != mine)
            .filter_map(|r| {
                let name = RegionName::new(r).ok()?;
                let owners = membership.owners_in(r);
                Some((
                    name,
                    Arc::new(SlotTable::compute(membership.epoch(), &owners)),
                ))
            })
            .collect();
        RegionRings {
            epoch: membership.epoch(),
            regions: names.len().max(1),
            owners_by_slot: owners_by_slot(&tables),
            tables,
        }
    }

    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    pub(crate) fn regions(&self) -> usize {
        self.regions
    }

    /// The other regions' names.
    pub(crate) fn names(&self) -> impl Iterator<Item = &RegionName> {
        self.tables.keys()
    }

    /// The owner of `slot` in every other region that has one.
    pub(crate) fn owners_elsewhere(&self, slot: u16) -> &[Peer] {
        let by_slot = &self.owners_by_slot;
        by_slot
            .slots
            .get(usize::from(slot))
            .and_then(|&list| by_slot.lists.get(usize::from(list)))
            .map_or(&[], |owners| owners)
    }

    /// Every node of every other region's ring.
    pub(crate) fn owners(&self) -> Vec<String> {
        let nodes = self.tables.values().flat_map(|t| t.nodes().iter());
        nodes.map(|n| n.to_string()).collect()
    }

    /// The owner of `slot` in `region` (another region), if it has one.
    pub(crate) fn owner_in(&self, region: &RegionName, slot: u16) -> Option<&str> {
        self.tables.get(region)?.owner(slot)
    }

    /// Whether deltas for `peer` should stay: it is in its region's ring, or that region has no
    /// owner this node can see (cut off, or restarting: its deltas wait for it to come back).
    /// False only when the region's ring goes on without it (its slots moved to others).
    pub(crate) fn keeps(&self, peer: &Peer) -> bool {
        self.tables
            .get(&peer.region)
            .is_none_or(|t| t.nodes().is_empty() || t.nodes().iter().any(|n| **n == *peer.node))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_slot_names_its_owner_in_every_other_region() {
        let table = |nodes: &[&str]| {
            let nodes: Vec<String> = nodes.iter().map(|n| n.to_string()).collect();
            Arc::new(SlotTable::compute(1, &nodes))
        };
        let mut tables = BTreeMap::new();
        tables.insert(RegionName::new("b").unwrap(), table(&["b-1", "b-2", "b-3"]));
        tables.insert(RegionName::new("c").unwrap(), table(&["c-1"]));
        tables.insert(RegionName::new("d").unwrap(), table(&[]));
        let rings = RegionRings {
            owners_by_slot: owners_by_slot(&tables),
            tables: tables.clone(),
            ..RegionRings::default()
        };
        assert_eq!(rings.owners_by_slot.slots.len(), SLOTS);
        // One list per owner in region b (region c's only node owns every slot).
        assert_eq!(rings.owners_by_slot.lists.len(), 3);
        for slot in [0u16, 1, 777, 4_095] {
            let expected: Vec<Peer> = tables
                .iter()
                .filter_map(|(region, t)| Some(Peer::new(region.clone(), t.owner(slot)?)))
                .collect();
            assert_eq!(rings.owners_elsewhere(slot), &expected[..], "slot {slot}");
            assert_eq!(expected.len(), 2, "region d has no owner");
        }
        assert!(RegionRings::default().owners_elsewhere(7).is_empty());
    }
}
