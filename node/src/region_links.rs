//! [`PeerLinks`]: the region exchange's frames to the owners in other regions, each on its own
//! unidirectional stream over the node's peer connections (best effort: the exchange sends
//! again what is not acknowledged).

use std::sync::Arc;

use floodgate::region::Peer;

use crate::cluster::Cluster;
use crate::region_sync::RegionLinks;

pub(crate) struct PeerLinks {
    pub(crate) cluster: Arc<Cluster>,
}

impl RegionLinks for PeerLinks {
    fn send(&self, to: &Peer, frame: Vec<u8>) {
        // A peer the membership no longer knows: dropped, sent again once its region's ring
        // names an owner the membership knows.
        let Some(addr) = self.cluster.addr_of(&to.node) else {
            return;
        };
        // Byte 3 of the header is the kind: 13 deltas, 14 acknowledgements.
        let kind = if frame.get(3) == Some(&13) {
            "deltas"
        } else {
            "ack"
        };
        metrics::counter!(
            "floodgate_region_frames_sent_total",
            "region" => to.region.as_str().to_owned(),
            "kind" => kind,
        )
        .increment(1);
        drop(self.cluster.peers.send(addr, frame));
    }
}
