//! Region units in hand-offs (kind 25): the units of global keys that other regions have not
//! confirmed go with their slots to the new owner, as requests it answers once they count, and
//! the hand-off's buckets go only after the answers, so its admission rule counts them when it
//! starts deciding (see `floodgate::region::UnconfirmedUnits`). The exchange belongs to the
//! node's region sync, which the cluster reaches only through [`UnconfirmedSource`].

use std::sync::Arc;

use floodgate::BucketKey;
use floodgate::region::UnconfirmedUnits;
use floodgate::wire::{FrameKind, RegionUnconfirmedMessage, WireUnconfirmed, encode_message};

use super::Cluster;

/// Entries per kind 25 frame: far within the smallest frame limit a node accepts (an entry is
/// at most a key, a region name and a count).
const UNITS_PER_FRAME: usize = 1_024;

/// Where a hand-off's unconfirmed units come from: the region exchange.
pub(crate) trait UnconfirmedSource: Send + Sync + std::fmt::Debug {
    /// Units of the keys `moving` names that other regions have not confirmed, taken for a
    /// hand-off.
    fn hand_over_unconfirmed(&self, moving: &dyn Fn(BucketKey) -> bool) -> Vec<UnconfirmedUnits>;
}

impl<C: floodgate::Clock + Send + Sync> UnconfirmedSource for crate::region_sync::RegionSync<C> {
    fn hand_over_unconfirmed(&self, moving: &dyn Fn(BucketKey) -> bool) -> Vec<UnconfirmedUnits> {
        crate::region_sync::RegionSync::hand_over_unconfirmed(self, moving)
    }
}

impl Cluster {
    /// Hands unconfirmed region units over with the slots this node gives away (set once, by
    /// a node with regions).
    pub(crate) fn hand_over_unconfirmed_from(&self, source: Arc<dyn UnconfirmedSource>) {
        let _ = self.unconfirmed_source.set(source);
    }

    /// For each hand-off (by `carrier`, the hand-off index per slot), the kind 25 frames of the
    /// units its slots carry. Whether its new owner reads them is the link's to say, as it is
    /// sent (`table_switch::send_in_order`).
    pub(super) fn unconfirmed_frames(
        &self,
        carrier: &[Option<usize>],
        handoffs: usize,
    ) -> Vec<Vec<Vec<u8>>> {
        let mut frames = vec![Vec::new(); handoffs];
        let Some(source) = self.unconfirmed_source.get() else {
            return frames;
        };
        let mut moved: Vec<Vec<UnconfirmedUnits>> = vec![Vec::new(); handoffs];
        let moving = |key: BucketKey| carrier[usize::from(key.slot())].is_some();
        for units in source.hand_over_unconfirmed(&moving) {
            if let Some(i) = carrier[usize::from(units.key.slot())] {
                moved[i].push(units);
            }
        }
        for (units, frames) in moved.iter().zip(frames.iter_mut()) {
            for chunk in units.chunks(UNITS_PER_FRAME) {
                let message = RegionUnconfirmedMessage {
                    from: self.members.me().id.clone(),
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

/// Sends a hand-off's kind 25 frames to `addr`, all at once, and waits for every answer: true
/// when each was answered (its units count there). A frame left unanswered after its tries
/// loses its units to the new owner (its admission rule may then pass the share by them, as
/// for a destination it counts unreachable).
pub(super) async fn deliver_unconfirmed(
    peers: &Arc<super::Peers>,
    addr: &str,
    frames: Vec<Vec<u8>>,
) -> bool {
    let mut requests = tokio::task::JoinSet::new();
    for frame in frames {
        let (peers, addr) = (peers.clone(), addr.to_owned());
        requests.spawn(async move {
            peers
                .request_for_handoff(&addr, &frame, FrameKind::RegionUnconfirmed)
                .await
        });
    }
    let mut all = true;
    while let Some(answered) = requests.join_next().await {
        all &= matches!(answered, Ok(true));
    }
    all
}
