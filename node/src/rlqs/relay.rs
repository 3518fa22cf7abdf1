//! Reports of buckets another node owns, queued by owner and sent in batches (kind 21): one
//! task sends everything queued, one frame per owner (several for a large queue), all owners at
//! once, and hands each answer's assignments to the streams. Reports that arrive meanwhile wait
//! for the next round, so a busy node sends fewer, larger frames. The queue is bounded in
//! bytes; past it a report is dropped (counted): its Envoy keeps its assignment until the next
//! report renews it or it expires.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use floodgate::wire::{
    FrameKind, MAX_WIRE_RLQS_ITEMS, RlqsReportBatch, WireRlqsReport, decode_rlqs_assignments,
    encode_message,
};
use metrics::counter;
use parking_lot::Mutex;
use tokio::sync::{Notify, watch};

use super::service::Hub;
use super::shares::StreamId;

/// Most bytes of reports and closes waiting for all owners together.
pub(crate) const MAX_QUEUED_BYTES: usize = 8 << 20;
/// Longest a relay waits for the owner's answer: Envoy reports every 5 s, so an answer later
/// than this is better dropped for the next report's.
const RELAY_TIMEOUT: Duration = Duration::from_secs(2);
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

    /// Everything queued, by owner, cut into messages of at most `max_bytes` (and
    /// [`MAX_WIRE_RLQS_ITEMS`] reports or closes).
    fn take(&self, me: &str, max_bytes: usize) -> Vec<(String, RlqsReportBatch, usize)> {
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
                    batches.push((owner.clone(), full, bytes));
                    bytes = 0;
                }
                bytes += size;
                batch.reports.push(report);
            }
            batches.push((owner, batch, bytes));
        }
        batches
    }
}

/// Sends what is queued whenever something is, until shutdown.
pub(crate) async fn run(
    hub: Arc<Hub>,
    max_frame_bytes: usize,
    mut shutdown: watch::Receiver<bool>,
) {
    let Some(cluster) = hub.cluster.clone() else {
        return;
    };
    loop {
        tokio::select! {
            _ = hub.relay.wake.notified() => {}
            _ = shutdown.wait_for(|stopping| *stopping) => return,
        }
        let batches = hub.relay.take(&cluster.me.id, max_frame_bytes / 2);
        let mut sends = tokio::task::JoinSet::new();
        for (owner, batch, _) in batches {
            let reports = batch.reports.len() as u64;
            let Some(addr) = cluster.addr_of(&owner) else {
                counter!("floodgate_rlqs_relay_failures_total").increment(reports);
                continue;
            };
            let mut frame = Vec::new();
            encode_message(&mut frame, FrameKind::RlqsReports, 0, &batch);
            counter!("floodgate_rlqs_relayed_reports_total", "direction" => "sent")
                .increment(reports);
            let peers = cluster.peers.clone();
            sends.spawn(async move {
                let answer = peers
                    .request_within(
                        RELAY_TIMEOUT,
                        &addr,
                        &frame,
                        max_frame_bytes + 64,
                        FrameKind::RlqsAssignments,
                    )
                    .await;
                (owner, reports, answer)
            });
        }
        while let Some(Ok((owner, reports, answer))) = sends.join_next().await {
            match answer.map(|frame| decode_rlqs_assignments(&frame.payload)) {
                Ok(Ok(batch)) => {
                    counter!("floodgate_rlqs_relayed_assignments_total", "way" => "answered")
                        .increment(batch.assignments.len() as u64);
                    hub.deliver(&owner, batch.assignments);
                }
                Ok(Err((code, why))) => {
                    counter!("floodgate_rlqs_relay_failures_total").increment(reports);
                    tracing::warn!(%owner, %code, "an RLQS relay's answer was refused: {why}");
                }
                Err(e) => {
                    counter!("floodgate_rlqs_relay_failures_total").increment(reports);
                    tracing::debug!(%owner, error = %e, "an RLQS relay got no answer");
                }
            }
        }
    }
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
            .filter(|(o, _, _)| o == "node-1")
            .map(|(_, b, _)| b.reports.len())
            .collect();
        assert_eq!(to_1, vec![MAX_WIRE_RLQS_ITEMS, 5]);
        let to_2 = batches.iter().find(|(o, _, _)| o == "node-2").unwrap();
        assert_eq!((to_2.1.reports.len(), to_2.1.closed.clone()), (1, vec![2]));
        assert!(relay.take("node-0", 1 << 20).is_empty(), "all taken");
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
