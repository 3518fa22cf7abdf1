//! Where a region delta this node receives goes inside its own region. The sender addressed it
//! by its view of this region's ring, which lags an ownership move here; the table in force
//! decides (see [`Route`]).

use floodgate::BucketKey;
use floodgate::protocol::Feature;
use floodgate::region::{Peer, RegionName, Route};

use super::Cluster;

impl Cluster {
    /// A router for received deltas, by the table in force at `now_ns`: call it, and apply
    /// what it says, under the deciding gate ([`Cluster::deciding`]), so the table cannot
    /// switch (and a hand-off leave) between the route and the units landing. Units of a key
    /// another member decides are passed on only once every member takes them (an older
    /// build refuses deltas from its own region); until then they land here, as before.
    pub(crate) fn delta_router(
        &self,
        region: RegionName,
        now_ns: u64,
    ) -> impl Fn(BucketKey) -> Route + '_ {
        let pass_on = Feature::RegionPassOn.readable_at(self.members.cluster_version());
        move |key: BucketKey| {
            let slot = key.slot();
            let ownership = self.ownership();
            match ownership.table().owner(slot) {
                Some(owner) if owner == self.me.id => {
                    if ownership.awaits_handoff(std::iter::once(slot), now_ns) {
                        Route::Hold
                    } else {
                        Route::Here
                    }
                }
                Some(owner) if pass_on => Route::PassOn(Peer::new(region.clone(), owner)),
                _ => Route::Here,
            }
        }
    }

    /// Whether `peer`, a node of this region, still owns slots in the table in force (deltas
    /// passed on to one that does not are routed again).
    pub(crate) fn owns_slots(&self, peer: &Peer) -> bool {
        self.table().nodes().iter().any(|n| **n == *peer.node)
    }
}

#[cfg(test)]
mod tests {
    use floodgate::Clock;

    use super::*;
    use crate::cluster::tests::{cluster_alone, joined_by_b};

    /// Once b has joined, a routes a delta for a key of b's to b and keeps one of its own;
    /// a member that owns nothing is no destination any more.
    #[tokio::test]
    async fn received_deltas_go_to_the_member_whose_table_decides_their_key() {
        let a = cluster_alone();
        let now = a.clock.now_ns();
        drop(joined_by_b(&a, now));
        assert_eq!(a.members.cluster_version(), floodgate::protocol::NEWEST);
        let table = a.table();
        let key_of = |owner: &str| {
            (0..100_000u32)
                .map(|i| BucketKey::for_key(format!("tenant:{i}").as_bytes()))
                .find(|k| table.owner(k.slot()) == Some(owner))
                .expect("a key of that owner")
        };
        let region = RegionName::new("local").unwrap();
        let route = a.delta_router(region.clone(), now);
        let b = Peer::new(region.clone(), "node-b");
        assert_eq!(route(key_of("node-b")), Route::PassOn(b.clone()));
        assert_eq!(route(key_of("node-a")), Route::Here);
        assert!(a.owns_slots(&b));
        assert!(!a.owns_slots(&Peer::new(region, "node-c")));
    }
}
