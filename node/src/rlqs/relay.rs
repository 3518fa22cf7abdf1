//! Reports of buckets another node owns, queued by owner for the task that sends them in
//! batches (kind 21, `relay_reports` in the parent): everything queued goes at once, and reports
//! that arrive meanwhile wait for the next round, so a busy node sends fewer, larger frames. The queue is bounded in
//! bytes; past it a report is dropped (counted): its Envoy keeps its assignment until the next
//! report renews it or it expires.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;

use floodgate::wire::{
    MAX_WIRE_RLQS_ITEMS, RlqsReportBatch, WireRlqsAssignment, WireRlqsBucket, WireRlqsReport,
};
use parking_lot::Mutex;
use tokio::sync::Notify;

use super::shares::StreamId;

/// Most bytes of reports and closes waiting for all owners together.
pub(crate) const MAX_QUEUED_BYTES: usize = 8 << 20;
/// Longest a relay waits for the owner's answer: Envoy reports every 5 s, so an answer later
/// than this is better dropped for the next report's.
pub(crate) const RELAY_TIMEOUT: Duration = Duration::from_secs(2);
/// Fixed bytes counted per report besides its bucket's strings.
const REPORT_OVERHEAD: usize = 96;

#[derive(Debug, Default)]
struct OwnerQueue {
    reports: Vec<WireRlqsReport>,
    closed: Vec<StreamId>,
}

#[derive(Debug, Default)]
struct Pending {
    by_owner: BTreeMap<String, OwnerQueue>,
    bytes: usize,
    /// The owners each stream's reports went to: told when it closes.
    relayed_to: HashMap<StreamId, BTreeSet<String>>,
}

/// The queue of reports for other owners.
#[derive(Debug, Default)]
pub(crate) struct Relay {
    pending: Mutex<Pending>,
    wake: Notify,
}

fn bytes_of(report: &WireRlqsReport) -> usize {
    let strings: usize = report
        .bucket
        .entries
        .iter()
        .map(|e| e.key.len() + e.value.len())
        .sum();
    REPORT_OVERHEAD + report.bucket.domain.len() + strings
}

impl Relay {
    /// Queues `stream`'s reports by owner; returns those dropped for want of room.
    pub(crate) fn enqueue(
        &self,
        stream: StreamId,
        reports: Vec<(String, WireRlqsReport)>,
    ) -> Vec<WireRlqsReport> {
        let mut dropped = Vec::new();
        let mut pending = self.pending.lock();
        for (owner, report) in reports {
            let bytes = bytes_of(&report);
            if pending.bytes + bytes > MAX_QUEUED_BYTES {
                dropped.push(report);
                continue;
            }
            pending.bytes += bytes;
            pending
                .relayed_to
                .entry(stream)
                .or_default()
                .insert(owner.clone());
            pending
                .by_owner
                .entry(owner)
                .or_default()
                .reports
                .push(report);
        }
        drop(pending);
        self.wake.notify_one();
        dropped
    }

    /// `stream`'s reports went to `owner` too (a retry): it is told when the stream closes.
    pub(crate) fn remember(&self, stream: StreamId, owner: &str) {
        let mut pending = self.pending.lock();
        let owners = pending.relayed_to.entry(stream).or_default();
        if !owners.contains(owner) {
            owners.insert(owner.to_owned());
        }
    }

    /// `stream` closed: every owner its reports went to is told with the next batch.
    pub(crate) fn close(&self, stream: StreamId) {
        let mut pending = self.pending.lock();
        let Some(owners) = pending.relayed_to.remove(&stream) else {
            return;
        };
        for owner in owners {
            pending.bytes += 8;
            pending
                .by_owner
                .entry(owner)
                .or_default()
                .closed
                .push(stream);
        }
        drop(pending);
        self.wake.notify_one();
    }

    /// Returns once something was queued since the last [`Relay::take`] (at once if it was).
    pub(crate) async fn queued(&self) {
        self.wake.notified().await;
    }

    /// Everything queued, by owner, cut into messages of at most `max_bytes` (and
    /// [`MAX_WIRE_RLQS_ITEMS`] reports or closes).
    pub(crate) fn take(&self, me: &str, max_bytes: usize) -> Vec<(String, RlqsReportBatch)> {
        let mut pending = self.pending.lock();
        pending.bytes = 0;
        let by_owner = std::mem::take(&mut pending.by_owner);
        drop(pending);
        let mut batches = Vec::new();
        for (owner, queue) in by_owner {
            let mut batch = RlqsReportBatch {
                from: me.to_owned(),
                reports: Vec::new(),
                closed: queue.closed,
            };
            batch.closed.truncate(MAX_WIRE_RLQS_ITEMS);
            let mut bytes = 0;
            for report in queue.reports {
                let size = bytes_of(&report);
                if !batch.reports.is_empty()
                    && (bytes + size > max_bytes || batch.reports.len() >= MAX_WIRE_RLQS_ITEMS)
                {
                    let full = std::mem::replace(
                        &mut batch,
                        RlqsReportBatch {
                            from: me.to_owned(),
                            ..RlqsReportBatch::default()
                        },
                    );
                    batches.push((owner.clone(), full));
                    bytes = 0;
                }
                bytes += size;
                batch.reports.push(report);
            }
            batches.push((owner, batch));
        }
        batches
    }
}

/// The reports of `sent` the owner's answer has no assignment for: it did not take them (by its
/// table another node owns their bucket).
pub(crate) fn unanswered(
    sent: Vec<WireRlqsReport>,
    answered: &[WireRlqsAssignment],
) -> Vec<WireRlqsReport> {
    let got: HashSet<(u64, &WireRlqsBucket)> =
        answered.iter().map(|a| (a.stream, &a.bucket)).collect();
    sent.into_iter()
        .filter(|r| !got.contains(&(r.stream, &r.bucket)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use floodgate::wire::{WireRlqsBucket, WireRlqsEntry};

    fn report(stream: StreamId, name: &str) -> WireRlqsReport {
        WireRlqsReport {
            stream,
            bucket: WireRlqsBucket {
                domain: "edge".into(),
                entries: vec![WireRlqsEntry {
                    key: "name".into(),
                    value: name.into(),
                }],
            },
            requests: 60,
            period_s: 60,
            ..WireRlqsReport::default()
        }
    }

    #[test]
    fn reports_go_by_owner_in_bounded_messages_and_closes_reach_every_owner() {
        let relay = Relay::default();
        let many: Vec<(String, WireRlqsReport)> = (0..MAX_WIRE_RLQS_ITEMS + 5)
            .map(|i| ("node-1".to_owned(), report(1, &i.to_string())))
            .collect();
        assert!(relay.enqueue(1, many).is_empty());
        relay.enqueue(2, vec![("node-2".to_owned(), report(2, "a"))]);
        relay.close(2);
        let batches = relay.take("node-0", 1 << 20);
        let to_1: Vec<usize> = batches
            .iter()
            .filter(|(o, _)| o == "node-1")
            .map(|(_, b)| b.reports.len())
            .collect();
        assert_eq!(to_1, vec![MAX_WIRE_RLQS_ITEMS, 5]);
        let to_2 = batches.iter().find(|(o, _)| o == "node-2").unwrap();
        assert_eq!((to_2.1.reports.len(), to_2.1.closed.clone()), (1, vec![2]));
        assert!(relay.take("node-0", 1 << 20).is_empty(), "all taken");
    }

    #[test]
    fn reports_an_answer_leaves_out_are_the_unanswered_ones() {
        let sent = vec![report(1, "a"), report(2, "a"), report(1, "b")];
        let answered = vec![WireRlqsAssignment {
            stream: 1,
            bucket: report(1, "a").bucket,
            ..WireRlqsAssignment::default()
        }];
        let left: Vec<(u64, String)> = unanswered(sent, &answered)
            .into_iter()
            .map(|r| (r.stream, r.bucket.entries[0].value.clone()))
            .collect();
        assert_eq!(left, vec![(2, "a".to_owned()), (1, "b".to_owned())]);
    }

    #[test]
    fn the_queue_is_bounded_in_bytes() {
        let relay = Relay::default();
        let per = bytes_of(&report(1, "x"));
        let fit = MAX_QUEUED_BYTES / per;
        let reports: Vec<(String, WireRlqsReport)> = (0..fit + 10)
            .map(|_| ("node-1".to_owned(), report(1, "x")))
            .collect();
        assert_eq!(relay.enqueue(1, reports).len(), 10);
    }
}
