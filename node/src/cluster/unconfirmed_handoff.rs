//! Region units in hand-offs (kind 25): the units of global keys that other regions have not
//! confirmed go with their slots to the new owner, before the buckets, so its admission rule
//! counts them (see `floodgate::region::UnconfirmedUnits`). The exchange belongs to the node's
//! region sync, which the cluster reaches only through [`UnconfirmedSource`].

use std::sync::Arc;

use floodgate::BucketKey;
use floodgate::protocol::Feature;
use floodgate::region::UnconfirmedUnits;
use floodgate::wire::{FrameKind, RegionUnconfirmedMessage, WireUnconfirmed, encode_message};

use super::Cluster;

/// Entries per kind 25 frame: far within the smallest frame limit a node accepts (an entry is
/// at most a key, a region name and a count).
const UNITS_PER_FRAME: usize = 1_024;

/// Where a hand-off's unconfirmed units come from: the region exchange.
pub(crate) trait UnconfirmedSource: Send + Sync + std::fmt::Debug {
    /// Units of the keys `moving` names that other regions have not confirmed.
    fn unconfirmed_of(&self, moving: &dyn Fn(BucketKey) -> bool) -> Vec<UnconfirmedUnits>;
}

impl<C: floodgate::Clock + Send + Sync> UnconfirmedSource for crate::region_sync::RegionSync<C> {
    fn unconfirmed_of(&self, moving: &dyn Fn(BucketKey) -> bool) -> Vec<UnconfirmedUnits> {
        crate::region_sync::RegionSync::unconfirmed_of(self, moving)
    }
}

impl Cluster {
    /// Hands unconfirmed region units over with the slots this node gives away (set once, by
    /// a node with regions).
    pub(crate) fn hand_over_unconfirmed_from(&self, source: Arc<dyn UnconfirmedSource>) {
        let _ = self.unconfirmed_source.set(source);
    }

    /// For each hand-off (by `carrier`, the hand-off index per slot), the kind 25 frames of the
    /// units its slots carry; none while a member may not read kind 25.
    pub(super) fn unconfirmed_frames(
        &self,
        carrier: &[Option<usize>],
        handoffs: usize,
    ) -> Vec<Vec<Vec<u8>>> {
        let mut frames = vec![Vec::new(); handoffs];
        let Some(source) = self.unconfirmed_source.get() else {
            return frames;
        };
        if !Feature::UnconfirmedHandoff.readable_at(self.cluster_version()) {
            return frames;
        }
        let mut moved: Vec<Vec<UnconfirmedUnits>> = vec![Vec::new(); handoffs];
        for units in source.unconfirmed_of(&|key| carrier[usize::from(key.slot())].is_some()) {
            if let Some(i) = carrier[usize::from(units.key.slot())] {
                moved[i].push(units);
            }
        }
        for (units, frames) in moved.iter().zip(frames.iter_mut()) {
            for chunk in units.chunks(UNITS_PER_FRAME) {
                let message = RegionUnconfirmedMessage {
                    from: self.me.id.clone(),
                    units: chunk.iter().map(WireUnconfirmed::from).collect(),
                };
                let mut frame = Vec::new();
                encode_message(&mut frame, FrameKind::RegionUnconfirmed, 0, &message);
                frames.push(frame);
            }
        }
        frames
    }
}
