//! Messages for concurrency leases: a client's lease requests (kind 15) and the node's answers
//! (kind 16), and lease sets between nodes (kind 17: replicas to a slot's successor, a hand-off
//! to a new owner). Validated before any field is read, like every other payload; a `max` or
//! TTL outside `LeaseLimit`'s bounds is refused as `invalid_limit`.
//!
//! Lease ids are 128 bits from version 10 (`Feature::WideLeaseIds`): the public structs here
//! are that layout. Versions 2-8 carry 64-bit ids (the structs of `v2`, converted at the edge):
//! a caller speaking only those is granted 64-bit ids, and so is everyone while a member of
//! the cluster speaks only those (its lease syncs could not carry more).

use rkyv::{Archive, Deserialize, Serialize};

use super::messages::{Refusal, WireLimits, access_validated};
use super::{ErrorCode, FrameKind, encode_message_at};
use crate::BucketKey;
use crate::lease::{Lease, LeaseId, LeaseLimit, LeaseSetState, MAX_LEASE_MAX};
use crate::protocol::Feature;

/// Most lease sets one kind 17 message may carry.
pub const MAX_WIRE_LEASE_SETS: usize = 4_096;
/// Most release tombstones one lease set may carry.
pub const MAX_WIRE_RELEASED: usize = 4_096;
/// Latest expiry a replicated lease may claim (far past any real clock, as for TATs); the
/// receiver also clamps it to its own `now` plus the longest TTL.
pub const MAX_WIRE_LEASE_EXPIRY_NS: u64 = u64::MAX / 2;
/// Longest sender id a lease sync may name (as in the slot table).
const MAX_FROM_BYTES: usize = 256;

/// `WireLeaseRequest::op` values.
pub const LEASE_ACQUIRE: u8 = 0;
pub const LEASE_RELEASE: u8 = 1;
pub const LEASE_RENEW: u8 = 2;

/// One lease request as sent.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct WireLeaseRequest {
    /// 0 acquire, 1 release, 2 renew.
    pub op: u8,
    /// The key bytes (a rule's keys carry the rule's name, as for checks).
    pub key: Vec<u8>,
    /// Acquire: most leases at once on this key (1..=100,000); otherwise 0.
    pub max: u64,
    /// Acquire and renew: how long the lease is held unless renewed (1 ms ..= 1 day).
    pub ttl_ns: u64,
    /// Release and renew: the lease; 0 for an acquire.
    pub lease_id: LeaseId,
    /// Sent to the slot's successor because the owner is unreachable: decided from its replica.
    pub takeover: bool,
}

/// Kind 15, client → node: independent lease requests, answered in order by one kind 16.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaseRequestBatch {
    pub requests: Vec<WireLeaseRequest>,
}

/// One answer as sent; `outcome` says which fields mean something (see [`LeaseAnswer`]).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WireLeaseAnswer {
    /// 0 granted, 1 refused, 2 released, 3 release of a lease not held, 4 renewed, 5 renewal
    /// of a lease not held, 6 error (`error_code` says which).
    pub outcome: u8,
    pub error_code: u16,
    pub lease_id: LeaseId,
    pub in_use: u64,
    /// Granted and renewed: time until the lease expires. Refused: until the earliest expires.
    pub after_ns: u64,
}

/// Kind 16, node → client: one answer per request, in order.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaseAnswerBatch {
    pub answers: Vec<WireLeaseAnswer>,
    /// The answering node's slot-table version, as in a decision batch.
    pub table_version: u64,
}

/// One lease as replicated.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WireLease {
    pub id: LeaseId,
    pub expires_at_ns: u64,
}

/// One key's leases as replicated: the live ones, and ids released since the last round.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct WireLeaseSet {
    pub key: u128,
    /// 0 when the set carries only releases.
    pub max: u64,
    pub leases: Vec<WireLease>,
    pub released: Vec<LeaseId>,
}

/// Kind 17, node → node (unidirectional, unanswered): lease sets for a slot's successor
/// (replicas) or its new owner (a hand-off). Merged: a lease either side holds stays held.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaseSyncMessage {
    /// The sender's node id, which its certificate must carry.
    pub from: String,
    /// True for a hand-off (the sender no longer owns these keys), false for replicas.
    pub handoff: bool,
    pub sets: Vec<WireLeaseSet>,
}

/// A lease request that passed validation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValidLeaseRequest {
    pub key: BucketKey,
    pub op: LeaseOp,
    pub takeover: bool,
}

/// What a valid request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseOp {
    Acquire(LeaseLimit),
    Release { id: LeaseId },
    Renew { id: LeaseId, ttl_ns: u64 },
}

/// An answer as the client reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseAnswer {
    Granted {
        lease_id: LeaseId,
        in_use: u64,
        expires_in_ns: u64,
    },
    Refused {
        in_use: u64,
        retry_after_ns: u64,
    },
    Released {
        /// False when the lease was not held (released before, or expired): not an error.
        was_held: bool,
        in_use: u64,
    },
    Renewed {
        in_use: u64,
        expires_in_ns: u64,
    },
    /// The renewed lease is not held (it expired): acquire again.
    NotHeld {
        in_use: u64,
    },
    Error(ErrorCode),
}

impl From<LeaseAnswer> for WireLeaseAnswer {
    fn from(answer: LeaseAnswer) -> Self {
        let plain = |outcome, in_use, after_ns| WireLeaseAnswer {
            outcome,
            in_use,
            after_ns,
            ..WireLeaseAnswer::default()
        };
        match answer {
            LeaseAnswer::Granted {
                lease_id,
                in_use,
                expires_in_ns,
            } => WireLeaseAnswer {
                lease_id,
                ..plain(0, in_use, expires_in_ns)
            },
            LeaseAnswer::Refused {
                in_use,
                retry_after_ns,
            } => plain(1, in_use, retry_after_ns),
            LeaseAnswer::Released { was_held, in_use } => {
                plain(if was_held { 2 } else { 3 }, in_use, 0)
            }
            LeaseAnswer::Renewed {
                in_use,
                expires_in_ns,
            } => plain(4, in_use, expires_in_ns),
            LeaseAnswer::NotHeld { in_use } => plain(5, in_use, 0),
            LeaseAnswer::Error(code) => WireLeaseAnswer {
                error_code: code as u16,
                ..plain(6, 0, 0)
            },
        }
    }
}

impl WireLeaseRequest {
    pub fn acquire(key: impl Into<Vec<u8>>, limit: &LeaseLimit) -> Self {
        WireLeaseRequest {
            op: LEASE_ACQUIRE,
            key: key.into(),
            max: limit.max(),
            ttl_ns: limit.ttl_ns(),
            ..WireLeaseRequest::default()
        }
    }

    pub fn release(key: impl Into<Vec<u8>>, lease_id: LeaseId) -> Self {
        WireLeaseRequest {
            op: LEASE_RELEASE,
            key: key.into(),
            lease_id,
            ..WireLeaseRequest::default()
        }
    }

    pub fn renew(key: impl Into<Vec<u8>>, lease_id: LeaseId, ttl_ns: u64) -> Self {
        WireLeaseRequest {
            op: LEASE_RENEW,
            key: key.into(),
            ttl_ns,
            lease_id,
            ..WireLeaseRequest::default()
        }
    }
}

/// Version 2's layouts of kinds 15-17 (64-bit lease ids), spoken through version 9.
mod v2 {
    use rkyv::{Archive, Deserialize, Serialize};

    #[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
    pub(super) struct WireLeaseRequest {
        pub(super) op: u8,
        pub(super) key: Vec<u8>,
        pub(super) max: u64,
        pub(super) ttl_ns: u64,
        pub(super) lease_id: u64,
        pub(super) takeover: bool,
    }

    #[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
    pub(super) struct LeaseRequestBatch {
        pub(super) requests: Vec<WireLeaseRequest>,
    }

    #[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub(super) struct WireLeaseAnswer {
        pub(super) outcome: u8,
        pub(super) error_code: u16,
        pub(super) lease_id: u64,
        pub(super) in_use: u64,
        pub(super) after_ns: u64,
    }

    #[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
    pub(super) struct LeaseAnswerBatch {
        pub(super) answers: Vec<WireLeaseAnswer>,
        pub(super) table_version: u64,
    }

    #[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub(super) struct WireLease {
        pub(super) id: u64,
        pub(super) expires_at_ns: u64,
    }

    #[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
    pub(super) struct WireLeaseSet {
        pub(super) key: u128,
        pub(super) max: u64,
        pub(super) leases: Vec<WireLease>,
        pub(super) released: Vec<u64>,
    }

    #[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
    pub(super) struct LeaseSyncMessage {
        pub(super) from: String,
        pub(super) handoff: bool,
        pub(super) sets: Vec<WireLeaseSet>,
    }
}

/// A lease id in version 2's 64 bits; `None` for a wide one, which no end speaking only that
/// version was given.
fn narrow(id: LeaseId) -> Option<u64> {
    u64::try_from(id).ok()
}

/// Appends `batch` as one kind 15 frame in the layout of an end speaking `version`. An id
/// wider than that layout carries goes as 0 (refused: "without a lease id"): only a grant over
/// a version 10 connection has one.
pub fn encode_lease_requests(
    out: &mut Vec<u8>,
    version: u8,
    request_id: u64,
    batch: &LeaseRequestBatch,
) {
    let layout = FrameKind::LeaseRequest.layout_at(version);
    if Feature::WideLeaseIds.readable_at(layout) {
        return encode_message_at(out, layout, FrameKind::LeaseRequest, request_id, batch);
    }
    let old = v2::LeaseRequestBatch {
        requests: batch
            .requests
            .iter()
            .map(|r| v2::WireLeaseRequest {
                op: r.op,
                key: r.key.clone(),
                max: r.max,
                ttl_ns: r.ttl_ns,
                lease_id: narrow(r.lease_id).unwrap_or(0),
                takeover: r.takeover,
            })
            .collect(),
    };
    encode_message_at(out, layout, FrameKind::LeaseRequest, request_id, &old);
}

/// Appends `batch` as one kind 16 frame in the layout of an end speaking `version` (a grant of
/// a wide id, which such an end is never given, would go as a grant without an id: refused).
pub fn encode_lease_answers(
    out: &mut Vec<u8>,
    version: u8,
    request_id: u64,
    batch: &LeaseAnswerBatch,
) {
    let layout = FrameKind::LeaseAnswer.layout_at(version);
    if Feature::WideLeaseIds.readable_at(layout) {
        return encode_message_at(out, layout, FrameKind::LeaseAnswer, request_id, batch);
    }
    let old = v2::LeaseAnswerBatch {
        answers: batch
            .answers
            .iter()
            .map(|a| v2::WireLeaseAnswer {
                outcome: a.outcome,
                error_code: a.error_code,
                lease_id: narrow(a.lease_id).unwrap_or(0),
                in_use: a.in_use,
                after_ns: a.after_ns,
            })
            .collect(),
        table_version: batch.table_version,
    };
    encode_message_at(out, layout, FrameKind::LeaseAnswer, request_id, &old);
}

/// Appends `message` as one kind 17 frame in the layout every member speaking `version` reads.
/// Version 2's layout cannot carry a wide id: such leases are left out (counted in the
/// returned number), as happens only when a member speaking 9 or less joins a cluster that
/// granted wide ids.
pub fn encode_lease_sync(out: &mut Vec<u8>, version: u8, message: &LeaseSyncMessage) -> usize {
    let layout = FrameKind::LeaseSync.layout_at(version);
    if Feature::WideLeaseIds.readable_at(layout) {
        encode_message_at(out, layout, FrameKind::LeaseSync, 0, message);
        return 0;
    }
    let mut left_out = 0;
    let old = v2::LeaseSyncMessage {
        from: message.from.clone(),
        handoff: message.handoff,
        sets: message
            .sets
            .iter()
            .map(|set| v2::WireLeaseSet {
                key: set.key,
                max: set.max,
                leases: set
                    .leases
                    .iter()
                    .filter_map(|l| {
                        let id = narrow(l.id);
                        left_out += usize::from(id.is_none());
                        Some(v2::WireLease {
                            id: id?,
                            expires_at_ns: l.expires_at_ns,
                        })
                    })
                    .collect(),
                released: set.released.iter().filter_map(|&id| narrow(id)).collect(),
            })
            .collect(),
    };
    encode_message_at(out, layout, FrameKind::LeaseSync, 0, &old);
    left_out
}

/// `archived`, validated already, as its owned struct `T`: a frame's worth at most.
fn deserialized<A, T>(archived: &A) -> Result<T, Refusal>
where
    A: rkyv::Deserialize<T, rkyv::api::high::HighDeserializer<rkyv::rancor::Error>>,
{
    rkyv::deserialize::<T, rkyv::rancor::Error>(archived)
        .map_err(|e| malformed(format!("lease message: {e}")))
}

fn malformed(message: String) -> Refusal {
    (ErrorCode::MalformedPayload, message)
}

/// Validates a kind 15 payload in layout `layout` (the frame's version byte): at most
/// `max_batch` requests, keys within `max_key_bytes`, a known op, a valid limit or TTL, a lease
/// id where one is needed. Any fault refuses the frame.
pub fn decode_lease_requests(
    layout: u8,
    payload: &[u8],
    limits: &WireLimits,
) -> Result<Vec<ValidLeaseRequest>, Refusal> {
    let what = "lease request batch";
    let requests = if Feature::WideLeaseIds.readable_at(layout) {
        let batch = access_validated::<ArchivedLeaseRequestBatch>(payload, what)?;
        request_count(batch.requests.len(), limits)?;
        deserialized::<_, LeaseRequestBatch>(batch)?.requests
    } else {
        let batch = access_validated::<v2::ArchivedLeaseRequestBatch>(payload, what)?;
        request_count(batch.requests.len(), limits)?;
        let batch: v2::LeaseRequestBatch = deserialized(batch)?;
        batch
            .requests
            .into_iter()
            .map(|r| WireLeaseRequest {
                op: r.op,
                key: r.key,
                max: r.max,
                ttl_ns: r.ttl_ns,
                lease_id: r.lease_id.into(),
                takeover: r.takeover,
            })
            .collect()
    };
    requests
        .iter()
        .map(|r| validate_request(r, limits))
        .collect()
}

fn request_count(requests: usize, limits: &WireLimits) -> Result<(), Refusal> {
    if requests > limits.max_batch {
        return Err((
            ErrorCode::BatchTooLarge,
            format!(
                "{requests} lease requests in one frame; the maximum is {}",
                limits.max_batch
            ),
        ));
    }
    if requests == 0 {
        return Err(malformed(
            "a lease request batch with no requests".to_owned(),
        ));
    }
    Ok(())
}

fn validate_request(
    request: &WireLeaseRequest,
    limits: &WireLimits,
) -> Result<ValidLeaseRequest, Refusal> {
    if request.key.len() > limits.max_key_bytes {
        return Err((
            ErrorCode::KeyTooLong,
            format!(
                "key of {} bytes exceeds the maximum of {}",
                request.key.len(),
                limits.max_key_bytes
            ),
        ));
    }
    let id = request.lease_id;
    let needs_id = |what: &str| {
        if id == 0 {
            Err(malformed(format!("a lease {what} without a lease id")))
        } else {
            Ok(id)
        }
    };
    let invalid = |e: crate::lease::LeaseLimitError| (ErrorCode::InvalidLimit, e.to_string());
    let op = match request.op {
        LEASE_ACQUIRE => {
            LeaseOp::Acquire(LeaseLimit::new(request.max, request.ttl_ns).map_err(invalid)?)
        }
        LEASE_RELEASE => LeaseOp::Release {
            id: needs_id("release")?,
        },
        LEASE_RENEW => LeaseOp::Renew {
            id: needs_id("renewal")?,
            ttl_ns: LeaseLimit::check_ttl(request.ttl_ns).map_err(invalid)?,
        },
        other => {
            return Err(malformed(format!(
                "unknown lease op {other} (0 acquire, 1 release, 2 renew)"
            )));
        }
    };
    Ok(ValidLeaseRequest {
        key: BucketKey::for_key(&request.key),
        op,
        takeover: request.takeover,
    })
}

/// Validates a kind 16 payload in layout `layout` (client side: a node is not trusted blindly
/// either); returns the answers and the node's table version.
pub fn decode_lease_answers(
    layout: u8,
    payload: &[u8],
) -> Result<(Vec<LeaseAnswer>, u64), Refusal> {
    let what = "lease answer batch";
    let batch: LeaseAnswerBatch = if Feature::WideLeaseIds.readable_at(layout) {
        deserialized(access_validated::<ArchivedLeaseAnswerBatch>(payload, what)?)?
    } else {
        let batch: v2::LeaseAnswerBatch = deserialized(access_validated::<
            v2::ArchivedLeaseAnswerBatch,
        >(payload, what)?)?;
        LeaseAnswerBatch {
            answers: batch
                .answers
                .into_iter()
                .map(|a| WireLeaseAnswer {
                    outcome: a.outcome,
                    error_code: a.error_code,
                    lease_id: a.lease_id.into(),
                    in_use: a.in_use,
                    after_ns: a.after_ns,
                })
                .collect(),
            table_version: batch.table_version,
        }
    };
    let answers = batch
        .answers
        .iter()
        .map(|a| {
            let (in_use, after_ns) = (a.in_use, a.after_ns);
            Ok(match a.outcome {
                0 if a.lease_id != 0 => LeaseAnswer::Granted {
                    lease_id: a.lease_id,
                    in_use,
                    expires_in_ns: after_ns,
                },
                1 => LeaseAnswer::Refused {
                    in_use,
                    retry_after_ns: after_ns,
                },
                2 | 3 => LeaseAnswer::Released {
                    was_held: a.outcome == 2,
                    in_use,
                },
                4 => LeaseAnswer::Renewed {
                    in_use,
                    expires_in_ns: after_ns,
                },
                5 => LeaseAnswer::NotHeld { in_use },
                6 => LeaseAnswer::Error(
                    ErrorCode::from_u16(a.error_code).unwrap_or(ErrorCode::MalformedPayload),
                ),
                other => {
                    return Err(malformed(format!(
                        "lease answer with outcome {other} (or a grant without a lease id)"
                    )));
                }
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((answers, batch.table_version))
}

/// A kind 17 message, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseSync {
    pub from: String,
    pub handoff: bool,
    pub sets: Vec<LeaseSetState>,
}

/// Validates a kind 17 payload in layout `layout`: a sender id of 1..=256 bytes, at most
/// 4,096 sets, each with a `max` of at most 100,000 and at most that many leases, ids non-zero,
/// expiries bounded, at most 4,096 released ids.
pub fn decode_lease_sync(layout: u8, payload: &[u8]) -> Result<LeaseSync, Refusal> {
    let what = "lease sync message";
    let message: LeaseSyncMessage = if Feature::WideLeaseIds.readable_at(layout) {
        let archived = access_validated::<ArchivedLeaseSyncMessage>(payload, what)?;
        sync_bounds(archived.from.len(), archived.sets.len())?;
        deserialized(archived)?
    } else {
        let archived = access_validated::<v2::ArchivedLeaseSyncMessage>(payload, what)?;
        sync_bounds(archived.from.len(), archived.sets.len())?;
        let message: v2::LeaseSyncMessage = deserialized(archived)?;
        LeaseSyncMessage {
            from: message.from,
            handoff: message.handoff,
            sets: message
                .sets
                .into_iter()
                .map(|set| WireLeaseSet {
                    key: set.key,
                    max: set.max,
                    leases: set
                        .leases
                        .into_iter()
                        .map(|l| WireLease {
                            id: l.id.into(),
                            expires_at_ns: l.expires_at_ns,
                        })
                        .collect(),
                    released: set.released.into_iter().map(LeaseId::from).collect(),
                })
                .collect(),
        }
    };
    let mut sets = Vec::with_capacity(message.sets.len());
    for set in &message.sets {
        let max = set.max;
        if max > MAX_LEASE_MAX || set.leases.len() as u64 > MAX_LEASE_MAX {
            return Err((
                ErrorCode::InvalidLimit,
                format!(
                    "a lease set with max {max} and {} leases (at most {MAX_LEASE_MAX})",
                    set.leases.len()
                ),
            ));
        }
        if set.released.len() > MAX_WIRE_RELEASED {
            return Err(malformed(format!(
                "{} released ids in one lease set; the maximum is {MAX_WIRE_RELEASED}",
                set.released.len()
            )));
        }
        let mut leases = Vec::with_capacity(set.leases.len());
        for &WireLease { id, expires_at_ns } in &set.leases {
            if id == 0 || expires_at_ns > MAX_WIRE_LEASE_EXPIRY_NS {
                return Err(malformed(format!(
                    "lease {id} expiring at {expires_at_ns} ns (ids are non-zero, expiries at most {MAX_WIRE_LEASE_EXPIRY_NS})"
                )));
            }
            leases.push(Lease { id, expires_at_ns });
        }
        sets.push(LeaseSetState {
            key: BucketKey::from_u128(set.key),
            max,
            leases,
            released: set.released.clone(),
        });
    }
    Ok(LeaseSync {
        from: message.from,
        handoff: message.handoff,
        sets,
    })
}

fn sync_bounds(from_bytes: usize, sets: usize) -> Result<(), Refusal> {
    if from_bytes == 0 || from_bytes > MAX_FROM_BYTES {
        return Err(malformed(format!(
            "lease sync from an id of {from_bytes} bytes (1..={MAX_FROM_BYTES})"
        )));
    }
    if sets > MAX_WIRE_LEASE_SETS {
        return Err(malformed(format!(
            "{sets} lease sets in one message; the maximum is {MAX_WIRE_LEASE_SETS}"
        )));
    }
    Ok(())
}

impl From<&LeaseSetState> for WireLeaseSet {
    fn from(state: &LeaseSetState) -> Self {
        WireLeaseSet {
            key: state.key.to_u128(),
            max: state.max,
            leases: state
                .leases
                .iter()
                .map(|l| WireLease {
                    id: l.id,
                    expires_at_ns: l.expires_at_ns,
                })
                .collect(),
            released: state.released.clone(),
        }
    }
}

/// Encoded bytes a lease set takes in a kind 17 message, about: for splitting into frames.
pub fn lease_set_wire_bytes(state: &LeaseSetState) -> usize {
    64 + 32 * state.leases.len() + 16 * state.released.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::NEWEST;
    use crate::wire::frame::framed_payload;
    use crate::wire::{FrameKind, FrameReader};

    /// The one frame `encode` appends: its layout byte and payload.
    fn framed(encode: impl FnOnce(&mut Vec<u8>)) -> (u8, Vec<u8>) {
        let mut bytes = Vec::new();
        encode(&mut bytes);
        let mut reader = FrameReader::new(1 << 20);
        reader.extend(&bytes);
        let frame = reader.next_frame().unwrap().unwrap();
        (frame.version, frame.payload.to_vec())
    }

    /// An end speaking 9 or less reads and sends 64-bit ids in version 2's layout; one speaking
    /// 10 the full 128 bits. A wide id never reaches an older end: encoded for one it is 0
    /// (refused as a request or grant without an id), and a lease sync leaves it out.
    #[test]
    fn ids_are_128_bits_from_version_10_and_64_before() {
        let wide: LeaseId = (7 << 64) | 9;
        for (version, layout, id) in [(NEWEST, 10, wide), (9, 2, 9), (2, 2, 9)] {
            let batch = LeaseRequestBatch {
                requests: vec![WireLeaseRequest::release("k", id)],
            };
            let (read_layout, payload) =
                framed(|out| encode_lease_requests(out, version, 1, &batch));
            assert_eq!(read_layout, layout, "version {version}");
            let decoded = decode_lease_requests(layout, &payload, &WireLimits::default()).unwrap();
            assert_eq!(decoded[0].op, LeaseOp::Release { id }, "version {version}");

            let answers = LeaseAnswerBatch {
                answers: vec![WireLeaseAnswer::from(LeaseAnswer::Granted {
                    lease_id: id,
                    in_use: 1,
                    expires_in_ns: 5,
                })],
                table_version: 3,
            };
            let (read_layout, payload) =
                framed(|out| encode_lease_answers(out, version, 1, &answers));
            assert_eq!(read_layout, layout);
            let (decoded, _) = decode_lease_answers(layout, &payload).unwrap();
            assert!(
                matches!(decoded[0], LeaseAnswer::Granted { lease_id, .. } if lease_id == id),
                "version {version}: {decoded:?}"
            );
        }
        // A wide id in an older layout.
        let batch = LeaseRequestBatch {
            requests: vec![WireLeaseRequest::release("k", wide)],
        };
        let (layout, payload) = framed(|out| encode_lease_requests(out, 9, 1, &batch));
        let refused = decode_lease_requests(layout, &payload, &WireLimits::default());
        assert!(refused.unwrap_err().1.contains("without a lease id"));
        let sync = LeaseSyncMessage {
            from: "node-a".into(),
            handoff: false,
            sets: vec![WireLeaseSet {
                key: 7,
                max: 3,
                leases: vec![
                    WireLease {
                        id: wide,
                        expires_at_ns: 10,
                    },
                    WireLease {
                        id: 9,
                        expires_at_ns: 10,
                    },
                ],
                released: vec![wide, 4],
            }],
        };
        let mut left_out = 0;
        let (layout, payload) = framed(|out| left_out = encode_lease_sync(out, 9, &sync));
        assert_eq!((layout, left_out), (2, 1));
        let decoded = decode_lease_sync(layout, &payload).unwrap();
        assert_eq!(decoded.sets[0].leases.len(), 1);
        assert_eq!(decoded.sets[0].leases[0].id, 9);
        assert_eq!(decoded.sets[0].released, vec![4]);
        let (layout, payload) = framed(|out| left_out = encode_lease_sync(out, NEWEST, &sync));
        assert_eq!((layout, left_out), (10, 0));
        let decoded = decode_lease_sync(layout, &payload).unwrap();
        assert_eq!(decoded.sets[0].leases[0].id, wide);
        assert_eq!(decoded.sets[0].released, vec![wide, 4]);
    }

    fn decode(requests: Vec<WireLeaseRequest>) -> Result<Vec<ValidLeaseRequest>, Refusal> {
        let bytes = framed_payload(FrameKind::LeaseRequest, &LeaseRequestBatch { requests });
        decode_lease_requests(NEWEST, &bytes, &WireLimits::default())
    }

    #[test]
    fn valid_requests_decode_to_their_ops() {
        let limit = LeaseLimit::new(3, 1_000_000_000).unwrap();
        let decoded = decode(vec![
            WireLeaseRequest::acquire("k", &limit),
            WireLeaseRequest::release("k", 9),
            WireLeaseRequest::renew("k", 9, 2_000_000),
        ])
        .unwrap();
        assert_eq!(decoded[0].op, LeaseOp::Acquire(limit));
        assert_eq!(decoded[1].op, LeaseOp::Release { id: 9 });
        assert_eq!(
            decoded[2].op,
            LeaseOp::Renew {
                id: 9,
                ttl_ns: 2_000_000
            }
        );
    }

    #[test]
    fn bad_requests_are_refused_with_a_reason() {
        let bad = |request: WireLeaseRequest| decode(vec![request]).unwrap_err();
        let acquire = |max, ttl_ns| WireLeaseRequest {
            op: LEASE_ACQUIRE,
            key: b"k".to_vec(),
            max,
            ttl_ns,
            ..WireLeaseRequest::default()
        };
        let (code, message) = bad(acquire(0, 1_000_000));
        assert_eq!(code, ErrorCode::InvalidLimit);
        assert!(
            message.contains("max must be between 1 and 100000"),
            "{message}"
        );
        assert_eq!(
            bad(acquire(MAX_LEASE_MAX + 1, 1_000_000)).0,
            ErrorCode::InvalidLimit
        );
        assert_eq!(bad(acquire(1, 999_999)).0, ErrorCode::InvalidLimit);
        let (code, message) = bad(WireLeaseRequest::release("k", 0));
        assert_eq!(code, ErrorCode::MalformedPayload);
        assert!(message.contains("without a lease id"), "{message}");
        assert_eq!(
            bad(WireLeaseRequest::renew("k", 1, 0)).0,
            ErrorCode::InvalidLimit
        );
        let (code, message) = bad(WireLeaseRequest {
            op: 9,
            ..WireLeaseRequest::release("k", 1)
        });
        assert_eq!(code, ErrorCode::MalformedPayload);
        assert!(message.contains("unknown lease op 9"), "{message}");
        assert_eq!(
            bad(WireLeaseRequest::release(vec![b'k'; 257], 1)).0,
            ErrorCode::KeyTooLong
        );
        assert_eq!(
            decode(Vec::new()).unwrap_err().0,
            ErrorCode::MalformedPayload
        );
        let (code, message) =
            decode_lease_requests(NEWEST, b"not an archive at all..", &WireLimits::default())
                .unwrap_err();
        assert_eq!(code, ErrorCode::MalformedPayload);
        assert!(message.contains("lease request batch"), "{message}");
    }

    #[test]
    fn answers_round_trip_and_bad_outcomes_are_refused() {
        let answers = vec![
            LeaseAnswer::Granted {
                lease_id: 5,
                in_use: 1,
                expires_in_ns: 7,
            },
            LeaseAnswer::Refused {
                in_use: 3,
                retry_after_ns: 9,
            },
            LeaseAnswer::Released {
                was_held: false,
                in_use: 2,
            },
            LeaseAnswer::Renewed {
                in_use: 2,
                expires_in_ns: 4,
            },
            LeaseAnswer::NotHeld { in_use: 0 },
            LeaseAnswer::Error(ErrorCode::NotOwner),
        ];
        let batch = LeaseAnswerBatch {
            answers: answers.iter().copied().map(WireLeaseAnswer::from).collect(),
            table_version: 42,
        };
        assert_eq!(
            decode_lease_answers(NEWEST, &framed_payload(FrameKind::LeaseRequest, &batch)).unwrap(),
            (answers, 42)
        );
        let bad = LeaseAnswerBatch {
            answers: vec![WireLeaseAnswer {
                outcome: 0,
                ..WireLeaseAnswer::default()
            }],
            table_version: 0,
        };
        assert!(
            decode_lease_answers(NEWEST, &framed_payload(FrameKind::LeaseRequest, &bad)).is_err()
        );
    }

    #[test]
    fn lease_sync_is_bounded() {
        let sync = |sets: Vec<WireLeaseSet>| {
            decode_lease_sync(
                NEWEST,
                &framed_payload(
                    FrameKind::LeaseRequest,
                    &LeaseSyncMessage {
                        from: "node-a".into(),
                        handoff: false,
                        sets,
                    },
                ),
            )
        };
        let set = WireLeaseSet {
            key: 7,
            max: 2,
            leases: vec![WireLease {
                id: 1,
                expires_at_ns: 10,
            }],
            released: vec![3],
        };
        let decoded = sync(vec![set.clone()]).unwrap();
        assert_eq!(decoded.sets[0].leases.len(), 1);
        assert_eq!(decoded.sets[0].released, vec![3]);
        let zero_id = WireLeaseSet {
            leases: vec![WireLease::default()],
            ..set.clone()
        };
        assert!(sync(vec![zero_id]).is_err());
        let too_big = WireLeaseSet {
            max: MAX_LEASE_MAX + 1,
            ..set.clone()
        };
        assert_eq!(sync(vec![too_big]).unwrap_err().0, ErrorCode::InvalidLimit);
        let anonymous = decode_lease_sync(
            NEWEST,
            &framed_payload(FrameKind::LeaseRequest, &LeaseSyncMessage::default()),
        );
        assert!(anonymous.unwrap_err().1.contains("id of 0 bytes"));
    }
}
