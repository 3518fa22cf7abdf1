//! The Envoys of other nodes, as a bucket's owner sees them: each (node, stream) gets an id of
//! this node's numbering, so the allocator counts it like a local stream, and the pushes for
//! it are sent back to its node. Also the conversions between the allocator's types and the
//! relay messages.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use floodgate::wire::{
    FrameKind, RLQS_ABANDON, RLQS_DENY, RLQS_TOKEN_BUCKET, RlqsAssignmentBatch, WireRlqsAssignment,
    WireRlqsBucket, WireRlqsEntry, WireRlqsReport, encode_message,
};

use super::shares::{Assignment, BucketKey, Limit, Push, StreamId, Usage};

/// A push with the rebalance that made it, by its owner's count.
#[derive(Debug)]
pub(crate) struct Stamped {
    pub(crate) seq: u64,
    pub(crate) push: Push,
}

/// Other nodes' Envoys holding or asking for a share here, bounded: past `max`, a new one is
/// refused (denied) until expiry frees room.
#[derive(Debug)]
pub(crate) struct Remotes {
    by_envoy: HashMap<(Arc<str>, u64), StreamId>,
    by_id: HashMap<StreamId, (Arc<str>, u64)>,
    max: usize,
}

impl Remotes {
    pub(crate) fn new(max: usize) -> Remotes {
        Remotes {
            by_envoy: HashMap::new(),
            by_id: HashMap::new(),
            max,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.by_id.len()
    }

    /// The id of `node`'s `stream`, if known.
    pub(crate) fn lookup(&self, node: &str, stream: u64) -> Option<StreamId> {
        self.by_envoy.get(&(Arc::from(node), stream)).copied()
    }

    /// The id of `node`'s `stream`, numbered by `next` when new; `None` when full.
    pub(crate) fn intern(
        &mut self,
        node: &str,
        stream: u64,
        next: impl FnOnce() -> StreamId,
    ) -> Option<StreamId> {
        let envoy = (Arc::from(node), stream);
        if let Some(id) = self.by_envoy.get(&envoy) {
            return Some(*id);
        }
        if self.by_id.len() >= self.max {
            return None;
        }
        let id = next();
        self.by_envoy.insert(envoy.clone(), id);
        self.by_id.insert(id, envoy);
        Some(id)
    }

    /// Keeps only the Envoys `keep` says still hold something.
    pub(crate) fn retain(&mut self, keep: impl Fn(StreamId) -> bool) {
        self.by_id.retain(|id, _| keep(*id));
        let by_id = &self.by_id;
        self.by_envoy.retain(|_, id| by_id.contains_key(id));
    }

    /// Splits pushes into this node's streams' and, by node, the other nodes' Envoys'.
    pub(crate) fn split(
        &self,
        pushes: Vec<Stamped>,
    ) -> (Vec<Stamped>, BTreeMap<String, Vec<WireRlqsAssignment>>) {
        let mut local = Vec::new();
        let mut elsewhere: BTreeMap<String, Vec<WireRlqsAssignment>> = BTreeMap::new();
        for stamped in pushes {
            match self.by_id.get(&stamped.push.stream) {
                None => local.push(stamped),
                Some((node, stream)) => elsewhere
                    .entry(node.to_string())
                    .or_default()
                    .push(assignment(*stream, stamped.seq, &stamped.push)),
            }
        }
        (local, elsewhere)
    }
}

/// The key whose slot places a bucket: the domain and the sorted entries, separated by a byte
/// no UTF-8 text holds, so two buckets never make the same key.
pub(crate) fn slot_key(key: &BucketKey) -> Vec<u8> {
    let mut bytes = b"rlqs\xff".to_vec();
    bytes.extend_from_slice(key.domain.as_bytes());
    for (k, v) in &key.entries {
        bytes.push(0xff);
        bytes.extend_from_slice(k.as_bytes());
        bytes.push(0xfe);
        bytes.extend_from_slice(v.as_bytes());
    }
    bytes
}

pub(crate) fn wire_bucket(key: &BucketKey) -> WireRlqsBucket {
    WireRlqsBucket {
        domain: key.domain.clone(),
        entries: key
            .entries
            .iter()
            .map(|(key, value)| WireRlqsEntry {
                key: key.clone(),
                value: value.clone(),
            })
            .collect(),
    }
}

pub(crate) fn key_of_wire(bucket: &WireRlqsBucket) -> BucketKey {
    BucketKey {
        domain: bucket.domain.clone(),
        entries: bucket
            .entries
            .iter()
            .map(|e| (e.key.clone(), e.value.clone()))
            .collect(),
    }
}

/// A report of `stream` for its bucket's owner.
pub(crate) fn report(
    stream: StreamId,
    key: &BucketKey,
    limit: Limit,
    used: Usage,
) -> WireRlqsReport {
    WireRlqsReport {
        stream,
        bucket: wire_bucket(key),
        requests: limit.requests,
        period_s: limit.period_s,
        allowed: used.allowed,
        denied: used.denied,
        elapsed_ns: used.elapsed_ns,
        held_tokens: used.held,
    }
}

/// A relayed report's limit and usage, as the allocator takes them: the reverse of [`report`].
pub(crate) fn limit_and_usage(report: &WireRlqsReport) -> (Limit, Usage) {
    let limit = Limit {
        requests: report.requests,
        period_s: report.period_s,
    };
    let used = Usage {
        allowed: report.allowed,
        denied: report.denied,
        elapsed_ns: report.elapsed_ns,
        held: report.held_tokens,
    };
    (limit, used)
}

/// `push` (of rebalance `seq`) for the Envoy that is `stream` on its node.
fn assignment(stream: u64, seq: u64, push: &Push) -> WireRlqsAssignment {
    let bucket = wire_bucket(&push.bucket);
    match push.assignment {
        Assignment::TokenBucket {
            tokens_per_fill,
            fill_interval_s,
            ..
        } => WireRlqsAssignment {
            stream,
            seq,
            bucket,
            action: RLQS_TOKEN_BUCKET,
            tokens_per_fill,
            fill_interval_s,
        },
        Assignment::Abandon => WireRlqsAssignment {
            stream,
            seq,
            bucket,
            action: RLQS_ABANDON,
            ..WireRlqsAssignment::default()
        },
        Assignment::Deny => deny(stream, seq, bucket),
    }
}

/// A refusal: the Envoy denies the bucket until the assignment expires.
pub(crate) fn deny(stream: u64, seq: u64, bucket: WireRlqsBucket) -> WireRlqsAssignment {
    WireRlqsAssignment {
        stream,
        seq,
        bucket,
        action: RLQS_DENY,
        ..WireRlqsAssignment::default()
    }
}

/// A kind 22 frame of `assignments` from node `from`.
pub(crate) fn assignments_frame(
    from: &str,
    assignments: Vec<WireRlqsAssignment>,
    request_id: u64,
) -> Vec<u8> {
    let mut frame = Vec::new();
    let batch = RlqsAssignmentBatch {
        from: from.to_owned(),
        assignments,
    };
    encode_message(&mut frame, FrameKind::RlqsAssignments, request_id, &batch);
    frame
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envoys_of_other_nodes_are_numbered_bounded_and_forgotten() {
        let mut remotes = Remotes::new(2);
        let mut next = 100;
        let mut number = || {
            next += 1;
            next
        };
        let a = remotes.intern("node-1", 1, &mut number).unwrap();
        assert_eq!(remotes.intern("node-1", 1, &mut number), Some(a));
        let b = remotes.intern("node-2", 1, &mut number).unwrap();
        assert_ne!(a, b, "the same stream number on two nodes is two Envoys");
        assert_eq!(remotes.intern("node-3", 1, &mut number), None, "full");
        remotes.retain(|id| id == b);
        assert_eq!(remotes.lookup("node-1", 1), None);
        assert_eq!(remotes.lookup("node-2", 1), Some(b));
        assert!(remotes.intern("node-3", 1, &mut number).is_some());
    }

    #[test]
    fn slot_keys_of_different_buckets_differ() {
        let key = |domain: &str, entries: &[(&str, &str)]| BucketKey {
            domain: domain.to_owned(),
            entries: entries
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        };
        assert_ne!(
            slot_key(&key("a", &[("b", "c")])),
            slot_key(&key("ab", &[("", "c")]))
        );
        assert_ne!(
            slot_key(&key("a", &[("b", "c"), ("d", "")])),
            slot_key(&key("a", &[("b", "cd")]))
        );
    }
}
