//! RLQS relay messages (protocol version 7): the node an Envoy streams to relays the usage of
//! each bucket to the bucket's owner (kind 21), and the owner sends back the assignments it
//! computed (kind 22: the answer to a kind 21, or pushed one-way to the node of another Envoy
//! whose share changed). Validated like every other payload, then held to fixed bounds, so a
//! peer's junk is refused in words before anything is kept.

use rkyv::rancor;
use rkyv::{Archive, Deserialize, Serialize};

use super::ErrorCode;
use super::messages::{Refusal, access_validated};
use super::region_messages::MAX_WIRE_NODE_ID_BYTES;

/// Most reports, closed streams or assignments in one message.
pub const MAX_WIRE_RLQS_ITEMS: usize = 4_096;
/// Most entries in one bucket id (the node's own cap for an Envoy's).
pub const MAX_WIRE_RLQS_ENTRIES: usize = 64;
/// Most bytes of keys and values in one bucket id.
pub const MAX_WIRE_RLQS_BUCKET_BYTES: usize = 4_096;
/// Longest domain.
pub const MAX_WIRE_RLQS_DOMAIN_BYTES: usize = 256;
/// Longest period of a relayed limit: a year, past any rule's unit.
pub const MAX_WIRE_RLQS_PERIOD_S: u64 = 366 * 86_400;

/// One key and value of a bucket id.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WireRlqsEntry {
    pub key: String,
    pub value: String,
}

/// A bucket: the Envoy stream's domain and its bucket id's entries, sorted by key.
#[derive(
    Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default,
)]
pub struct WireRlqsBucket {
    pub domain: String,
    pub entries: Vec<WireRlqsEntry>,
}

/// One Envoy's report of one bucket, with the limit the sender's configuration gives it.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct WireRlqsReport {
    /// The stream on the sending node (its own numbering).
    pub stream: u64,
    pub bucket: WireRlqsBucket,
    /// The limit: `requests` per `period_s` seconds.
    pub requests: u64,
    pub period_s: u64,
    pub allowed: u64,
    pub denied: u64,
    /// Since the Envoy's previous report of the bucket (0 in its first).
    pub elapsed_ns: u64,
    /// The `tokens_per_fill` of the assignment this Envoy holds now (0: none), as the sender
    /// last delivered it: a new owner counts it as given until it learns better.
    pub held_tokens: u32,
}

/// Kind 21, node → node: reports for buckets the receiver owns, and the sender's streams that
/// closed since its last message to the receiver. Answered with a kind 22 (same request id).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct RlqsReportBatch {
    pub from: String,
    pub reports: Vec<WireRlqsReport>,
    pub closed: Vec<u64>,
}

/// What an Envoy is told about a bucket: 0 a token bucket of one token refilled by
/// `tokens_per_fill` every `fill_interval_s`, 1 abandon it, 2 deny everything (the owner
/// refused the bucket past a bound).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct WireRlqsAssignment {
    pub stream: u64,
    /// The owner's count of its rebalances when it made this assignment: the answer to a
    /// report and a push sent one-way may arrive in either order, and the receiver keeps the
    /// later one (from the same owner) for each stream and bucket.
    pub seq: u64,
    pub bucket: WireRlqsBucket,
    pub action: u8,
    pub tokens_per_fill: u32,
    pub fill_interval_s: u64,
}

pub const RLQS_TOKEN_BUCKET: u8 = 0;
pub const RLQS_ABANDON: u8 = 1;
pub const RLQS_DENY: u8 = 2;

/// Kind 22, node → node: assignments for streams of the receiver, from the buckets' owner.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct RlqsAssignmentBatch {
    pub from: String,
    pub assignments: Vec<WireRlqsAssignment>,
}

pub(super) fn too_many(what: &str, n: usize) -> Refusal {
    (
        ErrorCode::BatchTooLarge,
        format!("{n} {what} in one RLQS relay message; the most is {MAX_WIRE_RLQS_ITEMS}"),
    )
}

pub(super) fn malformed(message: String) -> Refusal {
    (ErrorCode::MalformedPayload, message)
}

pub(super) fn check_from(from: &str) -> Result<(), Refusal> {
    if from.is_empty() || from.len() > MAX_WIRE_NODE_ID_BYTES {
        return Err(malformed(format!(
            "an RLQS relay message's sender id has {} bytes (1 to {MAX_WIRE_NODE_ID_BYTES})",
            from.len()
        )));
    }
    Ok(())
}

pub(super) fn check_bucket(i: usize, bucket: &WireRlqsBucket) -> Result<(), Refusal> {
    let bytes: usize = bucket
        .entries
        .iter()
        .map(|e| e.key.len() + e.value.len())
        .sum();
    if bucket.domain.is_empty() || bucket.domain.len() > MAX_WIRE_RLQS_DOMAIN_BYTES {
        return Err(malformed(format!(
            "RLQS item {i}: a domain of {} bytes (1 to {MAX_WIRE_RLQS_DOMAIN_BYTES})",
            bucket.domain.len()
        )));
    }
    if bucket.entries.is_empty()
        || bucket.entries.len() > MAX_WIRE_RLQS_ENTRIES
        || bytes > MAX_WIRE_RLQS_BUCKET_BYTES
    {
        return Err(malformed(format!(
            "RLQS item {i}: a bucket id of {} entries and {bytes} bytes (1 to \
             {MAX_WIRE_RLQS_ENTRIES} entries, at most {MAX_WIRE_RLQS_BUCKET_BYTES} bytes)",
            bucket.entries.len()
        )));
    }
    if bucket.entries.windows(2).any(|w| w[0].key >= w[1].key) {
        return Err(malformed(format!(
            "RLQS item {i}: the bucket id's keys are not sorted and distinct"
        )));
    }
    Ok(())
}

pub(super) fn check_period(i: usize, period_s: u64) -> Result<(), Refusal> {
    if period_s == 0 || period_s > MAX_WIRE_RLQS_PERIOD_S {
        return Err(malformed(format!(
            "RLQS item {i}: a period of {period_s} s (1 to {MAX_WIRE_RLQS_PERIOD_S})"
        )));
    }
    Ok(())
}

/// Validates a kind 21 payload: the sender's id, at most [`MAX_WIRE_RLQS_ITEMS`] reports and
/// closed streams, each bucket id bounded and sorted, each period within a year, each limit
/// at most `u32::MAX` requests (as the RLS file's).
pub fn decode_rlqs_reports(payload: &[u8]) -> Result<RlqsReportBatch, Refusal> {
    let archived = access_validated::<ArchivedRlqsReportBatch>(payload, "RLQS report batch")?;
    if archived.reports.len() > MAX_WIRE_RLQS_ITEMS {
        return Err(too_many("reports", archived.reports.len()));
    }
    if archived.closed.len() > MAX_WIRE_RLQS_ITEMS {
        return Err(too_many("closed streams", archived.closed.len()));
    }
    let batch: RlqsReportBatch = rkyv::deserialize::<_, rancor::Error>(archived)
        .map_err(|e| malformed(format!("RLQS report batch: {e}")))?;
    check_from(&batch.from)?;
    for (i, report) in batch.reports.iter().enumerate() {
        check_bucket(i, &report.bucket)?;
        check_period(i, report.period_s)?;
        if report.requests > u64::from(u32::MAX) {
            return Err(malformed(format!(
                "RLQS report {i}: a limit of {} requests (at most {})",
                report.requests,
                u32::MAX
            )));
        }
    }
    Ok(batch)
}

/// Validates a kind 22 payload: the sender's id, at most [`MAX_WIRE_RLQS_ITEMS`] assignments,
/// each bucket id bounded and sorted, each action known, a token bucket's fill at least 1 per
/// period of at most a year.
pub fn decode_rlqs_assignments(payload: &[u8]) -> Result<RlqsAssignmentBatch, Refusal> {
    let archived =
        access_validated::<ArchivedRlqsAssignmentBatch>(payload, "RLQS assignment batch")?;
    if archived.assignments.len() > MAX_WIRE_RLQS_ITEMS {
        return Err(too_many("assignments", archived.assignments.len()));
    }
    let batch: RlqsAssignmentBatch = rkyv::deserialize::<_, rancor::Error>(archived)
        .map_err(|e| malformed(format!("RLQS assignment batch: {e}")))?;
    check_from(&batch.from)?;
    for (i, assignment) in batch.assignments.iter().enumerate() {
        check_bucket(i, &assignment.bucket)?;
        match assignment.action {
            RLQS_TOKEN_BUCKET => {
                check_period(i, assignment.fill_interval_s)?;
                if assignment.tokens_per_fill == 0 {
                    return Err(malformed(format!(
                        "RLQS assignment {i}: a token bucket refilled by 0 tokens"
                    )));
                }
            }
            RLQS_ABANDON | RLQS_DENY => {}
            other => {
                return Err(malformed(format!(
                    "RLQS assignment {i}: action {other} (0 token bucket, 1 abandon, 2 deny)"
                )));
            }
        }
    }
    Ok(batch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::FrameKind;
    use crate::wire::frame::framed_payload;

    fn bucket(name: &str) -> WireRlqsBucket {
        WireRlqsBucket {
            domain: "edge".into(),
            entries: vec![WireRlqsEntry {
                key: "name".into(),
                value: name.into(),
            }],
        }
    }

    fn report() -> WireRlqsReport {
        WireRlqsReport {
            stream: 3,
            bucket: bucket("shared"),
            requests: 60,
            period_s: 60,
            allowed: 5,
            denied: 1,
            elapsed_ns: 5_000_000_000,
            held_tokens: 29,
        }
    }

    fn reports(reports: Vec<WireRlqsReport>) -> Result<RlqsReportBatch, Refusal> {
        let batch = RlqsReportBatch {
            from: "node-1".into(),
            reports,
            closed: vec![7],
        };
        decode_rlqs_reports(&framed_payload(FrameKind::RlqsReports, &batch))
    }

    #[test]
    fn reports_and_assignments_decode_as_sent() {
        let decoded = reports(vec![report()]).unwrap();
        assert_eq!(decoded.reports, vec![report()]);
        assert_eq!(decoded.closed, vec![7]);
        let batch = RlqsAssignmentBatch {
            from: "node-0".into(),
            assignments: vec![WireRlqsAssignment {
                stream: 3,
                seq: 12,
                bucket: bucket("shared"),
                action: RLQS_TOKEN_BUCKET,
                tokens_per_fill: 29,
                fill_interval_s: 60,
            }],
        };
        let payload = framed_payload(FrameKind::RlqsAssignments, &batch);
        assert_eq!(decode_rlqs_assignments(&payload).unwrap(), batch);
    }

    #[test]
    fn junk_is_refused_in_words() {
        let cases: Vec<(WireRlqsReport, &str)> = vec![
            (
                WireRlqsReport {
                    period_s: 0,
                    ..report()
                },
                "period of 0",
            ),
            (
                WireRlqsReport {
                    requests: u64::MAX,
                    ..report()
                },
                "requests",
            ),
            (
                WireRlqsReport {
                    bucket: WireRlqsBucket {
                        domain: String::new(),
                        ..bucket("a")
                    },
                    ..report()
                },
                "domain",
            ),
            (
                WireRlqsReport {
                    bucket: WireRlqsBucket {
                        domain: "edge".into(),
                        entries: vec![],
                    },
                    ..report()
                },
                "bucket id of 0 entries",
            ),
            (
                WireRlqsReport {
                    bucket: WireRlqsBucket {
                        domain: "edge".into(),
                        entries: vec![
                            WireRlqsEntry {
                                key: "b".into(),
                                value: String::new(),
                            },
                            WireRlqsEntry {
                                key: "a".into(),
                                value: String::new(),
                            },
                        ],
                    },
                    ..report()
                },
                "not sorted",
            ),
        ];
        for (bad, words) in cases {
            let (code, message) = reports(vec![bad]).unwrap_err();
            assert_eq!(code, ErrorCode::MalformedPayload);
            assert!(message.contains(words), "{message}");
        }
        let (code, _) = reports(vec![report(); MAX_WIRE_RLQS_ITEMS + 1]).unwrap_err();
        assert_eq!(code, ErrorCode::BatchTooLarge);
        let (code, _) = decode_rlqs_reports(&[1, 2, 3]).unwrap_err();
        assert_eq!(code, ErrorCode::MalformedPayload);
        let bad_action = RlqsAssignmentBatch {
            from: "node-0".into(),
            assignments: vec![WireRlqsAssignment {
                stream: 1,
                bucket: bucket("a"),
                action: 9,
                ..WireRlqsAssignment::default()
            }],
        };
        let payload = framed_payload(FrameKind::RlqsAssignments, &bad_action);
        let (code, message) = decode_rlqs_assignments(&payload).unwrap_err();
        assert_eq!(code, ErrorCode::MalformedPayload);
        assert!(message.contains("action 9"), "{message}");
    }
}
