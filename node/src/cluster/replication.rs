//! [`Replication`]: the buckets changed since the last round go to each slot's successor,
//! buckets (replicas or a hand-off) are split into frames a peer accepts, and a peer's buckets
//! are merged here.

use std::collections::HashMap;
use std::sync::Arc;

use floodgate::cluster::{SLOTS, SlotTable};
use floodgate::wire::{HandoffPart, encode_replicate, replicated_bytes};
use floodgate::{BucketState, BucketStore};
use tokio::sync::watch;

use crate::metrics::ClusterMetrics;

use super::{Members, Peers};

/// Buckets between nodes: replicated, handed off, merged in.
#[derive(Debug)]
pub(crate) struct Replication {
    /// This node's id: the sender of its replicate frames.
    me: String,
    /// The buckets replicated and handed off, and where merged ones go.
    store: Arc<BucketStore>,
    /// Encoded bucket bytes per replication or hand-off frame.
    bucket_bytes_per_frame: usize,
    /// Where successors and owners are.
    members: Arc<Members>,
    peers: Arc<Peers>,
    metrics: ClusterMetrics,
    /// Buckets merged from peers (replicas and hand-offs) since start.
    received: watch::Sender<u64>,
}

/// Of the buckets a hand-off from `from` brought to `me`, those whose slot `table` gives to a
/// third member, by that owner (none once `me` has left).
fn stranded<'t>(
    table: &'t SlotTable,
    me: &str,
    from: &str,
    buckets: &[BucketState],
) -> HashMap<&'t str, Vec<BucketState>> {
    let mut by_owner: HashMap<&str, Vec<BucketState>> = HashMap::new();
    if !table.contains(me) {
        return by_owner;
    }
    for bucket in buckets {
        if let Some(owner) = table
            .owner(bucket.key.slot())
            .filter(|o| *o != me && *o != from)
        {
            by_owner.entry(owner).or_default().push(bucket.clone());
        }
    }
    by_owner
}

impl Replication {
    pub(super) fn new(
        me: String,
        store: Arc<BucketStore>,
        bucket_bytes_per_frame: usize,
        members: Arc<Members>,
        peers: Arc<Peers>,
        metrics: ClusterMetrics,
    ) -> Self {
        Replication {
            me,
            store,
            bucket_bytes_per_frame,
            members,
            peers,
            metrics,
            received: watch::Sender::new(0),
        }
    }

    /// Merges a peer's buckets (replicas, or a part of a hand-off) into the store, only ever
    /// stricter. A frame holds thousands of buckets, each merge a cache miss: merged on a
    /// blocking thread, so the checks this worker serves do not wait behind them. Returns the
    /// buckets and how many of them the store refused; `None` only if the merge panicked or
    /// the runtime is shutting down (nothing merged).
    pub(crate) async fn merge(
        &self,
        buckets: Vec<BucketState>,
        now_ns: u64,
    ) -> Option<(Vec<BucketState>, usize)> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || {
            let refused = store.merge(&buckets, now_ns);
            (buckets, refused)
        })
        .await
        .ok()
    }

    /// Counts `merged` buckets from peers.
    pub(crate) fn count_received(&self, merged: u64) {
        self.received.send_modify(|n| *n += merged);
    }

    /// Counts buckets merged from peers (replicas and hand-offs); await a change instead of
    /// polling.
    pub(crate) fn watch_received(&self) -> watch::Receiver<u64> {
        self.received.subscribe()
    }

    /// Sends on, as replicas to their owner, the buckets a hand-off brought for slots `table`
    /// (this node's) gives to a third member: the sender's view of the cluster was not ours
    /// (a member that joined through one still joining, or heard of a restart first), and
    /// kept here alone they would be lost to the owner. Merged there, they can only make its
    /// decisions stricter. None goes back to `from`: our table naming the sender means ours is
    /// the one behind, and the switch to come makes them ours. Returns how many were sent on.
    pub(crate) fn pass_on_stranded(
        &self,
        table: &SlotTable,
        from: &str,
        buckets: &[BucketState],
    ) -> usize {
        let mut sent = 0;
        for (owner, buckets) in stranded(table, &self.me, from, buckets) {
            sent += buckets.len();
            drop(self.send_replicas(owner, &buckets));
        }
        sent
    }

    /// What every member of this node's region speaks.
    pub(super) fn region_version(&self) -> u8 {
        self.members.region_version()
    }

    /// Sends `buckets` to a node as replicas, split into frames (not tried again: the next
    /// round sends what changes again).
    fn send_replicas(
        &self,
        owner_id: &str,
        buckets: &[BucketState],
    ) -> Vec<tokio::task::JoinHandle<bool>> {
        self.send_frames(self.replica_frames(owner_id, buckets))
    }

    /// `buckets` as replica frames for the node `owner_id`, with its address (none when it is
    /// not known). Written in the region version's layout: they are made for a round off the
    /// runtime's workers, where no link's version is at hand.
    fn replica_frames(&self, owner_id: &str, buckets: &[BucketState]) -> Vec<(String, Vec<u8>)> {
        let Some(addr) = self.members.addr_of(owner_id) else {
            return Vec::new();
        };
        self.bucket_frames(self.members.region_version(), None, buckets)
            .into_iter()
            .map(|frame| (addr.clone(), frame))
            .collect()
    }

    /// `buckets` as replicate frames for a peer speaking `version` (at least one, so an empty
    /// hand-off is still announced).
    pub(super) fn bucket_frames(
        &self,
        version: u8,
        handoff: Option<(u64, Vec<u16>)>,
        buckets: &[BucketState],
    ) -> Vec<Vec<u8>> {
        let chunks = chunk_by_size(version, buckets, self.bucket_bytes_per_frame);
        let parts = chunks.len() as u32;
        let mut frames = Vec::new();
        for (part, chunk) in chunks.into_iter().enumerate() {
            let handoff = handoff.as_ref().map(|(id, slots)| HandoffPart {
                id: *id,
                part: part as u32,
                parts,
                slots: slots.clone(),
            });
            let mut frame = Vec::new();
            encode_replicate(&mut frame, version, &self.me, handoff, chunk);
            frames.push(frame);
        }
        frames
    }

    /// The buckets changed since the last round as frames for their slots' successors by
    /// `table` (or, for anything decided here for another owner, that owner), by peer address:
    /// part of a replication round's frames. Blocking: run it off the runtime's workers.
    pub(super) fn round_frames(&self, now_ns: u64, table: &SlotTable) -> Vec<(String, Vec<u8>)> {
        let mut changed = Vec::new();
        self.store.take_changed(now_ns, &mut changed);
        // Where each slot's buckets go, looked up once per slot rather than once per bucket:
        // our slots to their successor, anything decided here for another owner (a forward
        // that failed) to that owner.
        let me = self.me.as_str();
        let mut targets: Vec<&str> = Vec::new();
        let slot_target: Vec<Option<usize>> = (0..SLOTS as u16)
            .map(|slot| {
                let target = match table.owner(slot) {
                    Some(owner) if owner == me => table.successor(slot),
                    other => other,
                }?;
                Some(match targets.iter().position(|t| *t == target) {
                    Some(i) => i,
                    None => {
                        targets.push(target);
                        targets.len() - 1
                    }
                })
            })
            .collect();
        // Counted first, so each target's list is allocated once at its size.
        let mut counts = vec![0; targets.len()];
        for bucket in &changed {
            if let Some(i) = slot_target[usize::from(bucket.key.slot())] {
                counts[i] += 1;
            }
        }
        let mut by_target: Vec<Vec<BucketState>> =
            counts.iter().map(|&n| Vec::with_capacity(n)).collect();
        for bucket in changed {
            if let Some(i) = slot_target[usize::from(bucket.key.slot())] {
                by_target[i].push(bucket);
            }
        }
        let mut frames = Vec::new();
        for (target, buckets) in targets.into_iter().zip(by_target) {
            if buckets.is_empty() {
                continue;
            }
            self.metrics.replicated.increment(buckets.len() as u64);
            frames.extend(self.replica_frames(target, &buckets));
        }
        frames
    }

    /// The buckets of the slots each hand-off carries (by `carrier`, the hand-off index per
    /// slot), exported after the table switch.
    pub(super) fn buckets_to_hand_off(
        &self,
        carrier: &[Option<usize>],
        handoffs: usize,
        now_ns: u64,
    ) -> Vec<Vec<BucketState>> {
        let mut buckets = Vec::new();
        if carrier.iter().any(Option::is_some) {
            self.store.export(
                now_ns,
                &|key| carrier[usize::from(key.slot())].is_some(),
                &mut buckets,
            );
        }
        let mut moved: Vec<Vec<BucketState>> = vec![Vec::new(); handoffs];
        for bucket in buckets {
            if let Some(i) = carrier[usize::from(bucket.key.slot())] {
                moved[i].push(bucket);
            }
        }
        moved
    }

    /// Sends a round's frames; returns the sends (each ends true once delivered).
    pub(super) fn send_frames(
        &self,
        frames: Vec<(String, Vec<u8>)>,
    ) -> Vec<tokio::task::JoinHandle<bool>> {
        frames
            .into_iter()
            .map(|(addr, frame)| self.peers.send(addr, frame))
            .collect()
    }
}

/// Splits `buckets` into runs of at most `budget` bytes once encoded for an end speaking
/// `version` (a bucket larger than the budget, a long log, goes alone); always at least one
/// run, empty when there are no buckets.
pub(super) fn chunk_by_size(
    version: u8,
    buckets: &[BucketState],
    budget: usize,
) -> Vec<&[BucketState]> {
    let mut chunks = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, bucket) in buckets.iter().enumerate() {
        let next = replicated_bytes(version, bucket);
        if i > start && bytes + next > budget {
            chunks.push(&buckets[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += next;
    }
    chunks.push(&buckets[start..]);
    chunks
}

#[cfg(test)]
mod tests {
    use floodgate::algorithm::WindowState;
    use floodgate::{Algorithm, BucketKey, BucketValue, Limit};

    use super::*;

    /// Every chunk of buckets, encoded as a replicate message, fits in a frame twice the budget
    /// (what `with_frame_limit` assumes), whatever the mix of algorithms and log lengths.
    #[test]
    fn replication_chunks_fit_the_frame_limit() {
        let hour = 3_600 * floodgate::NANOS_PER_SEC;
        let window = Limit::new(Algorithm::SlidingWindow, 100, hour, 100).unwrap();
        let log = Limit::new(Algorithm::SlidingLog, 1_000, hour, 1_000).unwrap();
        let buckets: Vec<BucketState> = (0..6_000u32)
            .map(|i| {
                let key = BucketKey::new(b"", &i.to_le_bytes());
                let value = match i % 3 {
                    0 => BucketValue::Gcra {
                        tat_ns: u64::from(i),
                        margin_ms: 1,
                    },
                    1 => BucketValue::Window {
                        limit: window,
                        state: WindowState {
                            window: 1,
                            count: 2,
                            previous: 3,
                        },
                    },
                    _ => BucketValue::Log {
                        limit: log,
                        times_ns: (0..u64::from(i % 1_000)).collect(),
                    },
                };
                BucketState { key, value }
            })
            .collect();
        let budget = 64 * 1024;
        for version in [floodgate::protocol::OLDEST, floodgate::protocol::NEWEST] {
            let chunks = chunk_by_size(version, &buckets, budget);
            assert!(chunks.len() > 1);
            assert_eq!(chunks.iter().map(|c| c.len()).sum::<usize>(), buckets.len());
            for chunk in chunks {
                let handoff = HandoffPart {
                    id: u64::MAX,
                    part: 0,
                    parts: 1,
                    slots: (0..floodgate::cluster::SLOTS as u16).collect(),
                };
                let mut frame = Vec::new();
                let from = "node-with-a-long-id:65535";
                encode_replicate(&mut frame, version, from, Some(handoff), chunk);
                assert!(frame.len() <= 2 * budget, "{} bytes", frame.len());
            }
            let nothing = chunk_by_size(version, &[], budget);
            assert_eq!(nothing, vec![&[] as &[BucketState]]);
        }
    }

    /// A round's frames carry what changed since the last round, all to the other member of a
    /// two-node cluster; nothing changed, no frame. Alone, a node keeps its changes for the
    /// first round after another joins.
    #[tokio::test]
    async fn a_round_frames_what_changed_since_the_last() {
        use crate::cluster::tests::{cluster_alone, joined_by_b};
        use floodgate::Clock;
        use floodgate::protocol::Feature;
        let a = cluster_alone();
        let now = a.clock.now_ns();
        let limit = Limit::gcra(10, floodgate::NANOS_PER_SEC, 10).unwrap();
        let check = |name: &str| {
            a.replication
                .store
                .check(BucketKey::for_key(name.as_bytes()), &limit, 1, now)
                .unwrap()
        };
        check("before-b");
        assert!(a.replication_frames(now).is_empty(), "nobody to send to");
        drop(joined_by_b(&a, now));
        assert_eq!(a.slots.table().nodes().len(), 2);
        let frames = a.replication_frames(now);
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0].0, "127.0.0.1:7001");
        // Both speak the newest version: GCRA buckets go as columns, and read back whole.
        let mut reader = floodgate::wire::FrameReader::new(1 << 20);
        reader.extend(&frames[0].1);
        let frame = reader.next_frame().unwrap().unwrap();
        assert_eq!(frame.version, Feature::CompactReplicas.since());
        let replicated = floodgate::wire::decode_replicate(frame.version, &frame.payload).unwrap();
        assert_eq!(replicated.buckets.len(), 1);
        assert!(
            a.replication_frames(now).is_empty(),
            "nothing changed since"
        );
        check("before-b");
        check("another");
        let frames = a.replication_frames(now);
        assert_eq!(frames.len(), 1);
        assert!(frames.iter().all(|(addr, _)| addr == "127.0.0.1:7001"));
    }

    /// A hand-off's buckets for slots the receiver's table gives to a third member go on to
    /// that owner; none for the receiver's own slots, none back to the sender, none once the
    /// receiver has left.
    #[test]
    fn stranded_buckets_go_to_their_owner_by_the_receivers_table() {
        let owners = ["a".to_owned(), "b".to_owned(), "c".to_owned()];
        let table = SlotTable::compute(2, &owners);
        let buckets: Vec<BucketState> = (0..300u32)
            .map(|i| BucketState {
                key: BucketKey::new(b"", &i.to_le_bytes()),
                value: BucketValue::Gcra {
                    tat_ns: 1,
                    margin_ms: 1,
                },
            })
            .collect();
        let owned_by = |o: &str| {
            buckets
                .iter()
                .filter(|b| table.owner(b.key.slot()) == Some(o))
                .count()
        };
        // "b" received from "a": what "c" owns goes to "c", nothing else anywhere.
        let passed = stranded(&table, "b", "a", &buckets);
        assert_eq!(passed.keys().copied().collect::<Vec<_>>(), ["c"]);
        assert_eq!(passed["c"].len(), owned_by("c"));
        assert!(owned_by("c") > 0 && owned_by("a") > 0 && owned_by("b") > 0);
        assert!(
            passed["c"]
                .iter()
                .all(|b| table.owner(b.key.slot()) == Some("c"))
        );
        // A receiver the table no longer names passes nothing on.
        let without_b = SlotTable::compute(3, &owners[..1]);
        assert!(stranded(&without_b, "b", "a", &buckets).is_empty());
    }
}
