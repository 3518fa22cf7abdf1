//! Messages for regions: a check batch carrying each check's scope (kind 12), and the
//! inter-region delta exchange between owners (kind 13 deltas, kind 14 acknowledgements).
//! Validated like every other payload before a field is read.
//!
//! rkyv archives have no optional trailing fields, so a scope cannot be added to the kind 1
//! check as an old node would still read it: a batch with any non-`region` check travels as
//! kind 12 instead, and kind 1 stays exactly as it was (every check `region`). Likewise kinds 13
//! and 14 have a second layout from protocol version 4 ([`Feature::RegionResync`]), defined
//! beside version 2's and chosen by the frame's version byte.

use rkyv::{Archive, Deserialize, Serialize};

use super::check_batch::{ArchivedCheckBatch, CheckBatch, CheckGroups, decode_archived_into};
use super::frame::encode_message_at;
use super::messages::{Refusal, WireLimits, access_validated, algorithm_to_wire, limit_from_wire};
use super::{BASE_LAYOUT, ErrorCode, FrameKind};
use crate::BucketKey;
use crate::protocol::Feature;
use crate::region::{Delta, DeltaAck, DeltaBatch, MAX_ACK_RANGES, Peer, RegionName, Scope};

/// Most deltas one kind 13 message may carry.
pub const MAX_WIRE_DELTAS: usize = 4_096;
/// Longest node id a region message may name (as in the slot table).
pub const MAX_WIRE_NODE_ID_BYTES: usize = 256;
/// Latest admission time a delta may claim (as for replicated TATs: far past any real clock).
pub const MAX_WIRE_DELTA_AT_NS: u64 = u64::MAX / 2;

/// A check's scope: `kind` 0 region, 1 global, 2 home (then `home` names the region; empty
/// otherwise).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct WireScope {
    pub kind: u8,
    pub home: String,
}

/// Kind 12, client → node: a check batch and one scope per check, in the batch's flattened
/// order (an empty list: every check `region`, as kind 1).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct ScopedCheckBatch {
    pub batch: CheckBatch,
    pub scopes: Vec<WireScope>,
}

/// One delta as sent: a key's bits, its limit, and the units admitted (aggregated; `at_ns` the
/// latest admission).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct WireDelta {
    pub key: u128,
    /// `Algorithm` in wire order: 0 gcra, 1 fixed-window, 2 sliding-window, 3 sliding-log.
    pub algorithm: u8,
    pub rate: u64,
    pub period_ns: u64,
    pub burst: u64,
    pub units: u64,
    pub at_ns: u64,
}

/// Kind 13, owner → owner of the same keys in another region.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct RegionDeltasMessage {
    pub region: String,
    /// The sender's node id, which its certificate must carry.
    pub node: String,
    pub session: u64,
    pub seq: u64,
    pub deltas: Vec<WireDelta>,
}

/// Kind 14, receiver → sender of kind 13: what it applied.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct RegionAckMessage {
    pub region: String,
    pub node: String,
    pub session: u64,
    pub below: u64,
    pub also: Vec<u64>,
}

/// Kind 13 from protocol version 4: version 2's fields and the sender's settled point.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct RegionDeltasMessageV4 {
    pub region: String,
    pub node: String,
    pub session: u64,
    pub seq: u64,
    /// Every seq below this was acknowledged by the destination (1..=seq; 0: not given).
    pub settled_below: u64,
    pub deltas: Vec<WireDelta>,
}

/// Kind 14 from protocol version 4: version 2's fields and the acknowledging node's session.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct RegionAckMessageV4 {
    pub region: String,
    pub node: String,
    pub session: u64,
    pub below: u64,
    pub also: Vec<u64>,
    /// The acknowledging node's own session (0: not given).
    pub receiver_session: u64,
}

impl WireScope {
    pub fn of(scope: &Scope) -> Self {
        match scope {
            Scope::Region => WireScope::default(),
            Scope::Global => WireScope {
                kind: 1,
                home: String::new(),
            },
            Scope::Home(region) => WireScope {
                kind: 2,
                home: region.as_str().to_owned(),
            },
        }
    }
}

impl ScopedCheckBatch {
    /// `batch` with `scopes`, one per check in flattened order.
    pub fn new(batch: CheckBatch, scopes: &[Scope]) -> Self {
        ScopedCheckBatch {
            batch,
            scopes: scopes.iter().map(WireScope::of).collect(),
        }
    }
}

impl From<&DeltaBatch> for RegionDeltasMessage {
    fn from(batch: &DeltaBatch) -> Self {
        RegionDeltasMessage {
            region: batch.from.region.as_str().to_owned(),
            node: batch.from.node.to_string(),
            session: batch.session,
            seq: batch.seq,
            deltas: batch
                .deltas
                .iter()
                .map(|d| WireDelta {
                    key: d.key.to_u128(),
                    algorithm: algorithm_to_wire(d.limit.algorithm()),
                    rate: d.limit.rate(),
                    period_ns: d.limit.period_ns(),
                    burst: d.limit.burst(),
                    units: d.units,
                    at_ns: d.at_ns,
                })
                .collect(),
        }
    }
}

impl From<&DeltaBatch> for RegionDeltasMessageV4 {
    fn from(batch: &DeltaBatch) -> Self {
        let v2 = RegionDeltasMessage::from(batch);
        RegionDeltasMessageV4 {
            region: v2.region,
            node: v2.node,
            session: v2.session,
            seq: v2.seq,
            settled_below: batch.settled_below.unwrap_or(0),
            deltas: v2.deltas,
        }
    }
}

impl From<&DeltaAck> for RegionAckMessageV4 {
    fn from(ack: &DeltaAck) -> Self {
        RegionAckMessageV4 {
            region: ack.from.region.as_str().to_owned(),
            node: ack.from.node.to_string(),
            session: ack.session,
            below: ack.below,
            also: ack.also.clone(),
            receiver_session: ack.receiver_session.unwrap_or(0),
        }
    }
}

/// Appends `batch` as a kind 13 frame for a peer speaking `version`: with the settled point
/// from version 4, in version 2's layout (without it) for a peer that speaks less.
pub fn encode_region_deltas(out: &mut Vec<u8>, version: u8, batch: &DeltaBatch) {
    let kind = FrameKind::RegionDeltas;
    if Feature::RegionResync.readable_at(version) {
        let message = RegionDeltasMessageV4::from(batch);
        encode_message_at(out, kind.layout_at(version), kind, 0, &message);
    } else {
        encode_message_at(out, BASE_LAYOUT, kind, 0, &RegionDeltasMessage::from(batch));
    }
}

/// Appends `ack` as a kind 14 frame for a peer speaking `version`: with the receiver's session
/// from version 4, in version 2's layout (without it) for a peer that speaks less.
pub fn encode_region_ack(out: &mut Vec<u8>, version: u8, ack: &DeltaAck) {
    let kind = FrameKind::RegionAck;
    if Feature::RegionResync.readable_at(version) {
        let message = RegionAckMessageV4::from(ack);
        encode_message_at(out, kind.layout_at(version), kind, 0, &message);
    } else {
        encode_message_at(out, BASE_LAYOUT, kind, 0, &RegionAckMessage::from(ack));
    }
}

impl From<&DeltaAck> for RegionAckMessage {
    fn from(ack: &DeltaAck) -> Self {
        RegionAckMessage {
            region: ack.from.region.as_str().to_owned(),
            node: ack.from.node.to_string(),
            session: ack.session,
            below: ack.below,
            also: ack.also.clone(),
        }
    }
}

fn malformed(message: String) -> Refusal {
    (ErrorCode::MalformedPayload, message)
}

fn region_name(text: &str) -> Result<RegionName, Refusal> {
    RegionName::new(text).map_err(|e| malformed(e.to_string()))
}

fn peer(region: &str, node: &str) -> Result<Peer, Refusal> {
    if node.is_empty() || node.len() > MAX_WIRE_NODE_ID_BYTES {
        return Err(malformed(format!(
            "a node id of {} bytes; expected 1 to {MAX_WIRE_NODE_ID_BYTES}",
            node.len()
        )));
    }
    Ok(Peer::new(region_name(region)?, node))
}

/// Validates a kind 12 payload: the checks as kind 1 validates them, and one valid scope per
/// check (or none at all). Decodes the groups into `groups` (reused from frame to frame, as
/// kind 1's are: no allocation per group) and returns the scopes in flattened order.
pub fn decode_scoped_check_batch(
    payload: &[u8],
    limits: &WireLimits,
    groups: &mut CheckGroups,
) -> Result<Vec<Scope>, Refusal> {
    let scoped = access_validated::<ArchivedScopedCheckBatch>(payload, "scoped check batch")?;
    let batch: &ArchivedCheckBatch = &scoped.batch;
    decode_archived_into(batch, limits, groups)?;
    let total = groups.check_count();
    if scoped.scopes.is_empty() {
        return Ok(vec![Scope::Region; total]);
    }
    if scoped.scopes.len() != total {
        return Err(malformed(format!(
            "{} scopes for {total} checks: send one per check, or none",
            scoped.scopes.len()
        )));
    }
    let mut scopes = Vec::with_capacity(total);
    for scope in scoped.scopes.iter() {
        let home = scope.home.as_str();
        scopes.push(match (scope.kind, home.is_empty()) {
            (0, true) => Scope::Region,
            (1, true) => Scope::Global,
            (2, false) => Scope::Home(region_name(home)?),
            (kind, _) => {
                return Err(malformed(format!(
                    "scope kind {kind} with a home region of {} bytes (0 region and 1 global name none; 2 home names one)",
                    home.len()
                )));
            }
        });
    }
    Ok(scopes)
}

/// Validates a kind 13 payload of the layout of version `layout` (the frame's) into the
/// exchange's [`DeltaBatch`]; version 2's layout gives no settled point.
pub fn decode_region_deltas(layout: u8, payload: &[u8]) -> Result<DeltaBatch, Refusal> {
    if Feature::RegionResync.readable_at(layout) {
        let m = access_validated::<ArchivedRegionDeltasMessageV4>(payload, "region deltas")?;
        let seq = m.seq.to_native();
        let settled_below = match m.settled_below.to_native() {
            0 => None,
            settled if settled > seq => {
                return Err(malformed(format!(
                    "a region delta message numbered {seq} settled below {settled}: a message \
                     in flight cannot be settled"
                )));
            }
            settled => Some(settled),
        };
        deltas_batch(
            (m.region.as_str(), m.node.as_str()),
            m.session.to_native(),
            seq,
            settled_below,
            &m.deltas,
        )
    } else {
        let m = access_validated::<ArchivedRegionDeltasMessage>(payload, "region deltas")?;
        deltas_batch(
            (m.region.as_str(), m.node.as_str()),
            m.session.to_native(),
            m.seq.to_native(),
            None,
            &m.deltas,
        )
    }
}

/// A kind 13 message's fields, validated, as a [`DeltaBatch`] (either layout).
fn deltas_batch(
    (region, node): (&str, &str),
    session: u64,
    seq: u64,
    settled_below: Option<u64>,
    wire: &[ArchivedWireDelta],
) -> Result<DeltaBatch, Refusal> {
    let from = peer(region, node)?;
    if seq == 0 {
        return Err(malformed(
            "a region delta message numbered 0 (numbers start at 1)".to_owned(),
        ));
    }
    if wire.len() > MAX_WIRE_DELTAS {
        return Err(malformed(format!(
            "{} deltas in one message; the maximum is {MAX_WIRE_DELTAS}",
            wire.len()
        )));
    }
    let mut deltas = Vec::with_capacity(wire.len());
    for delta in wire {
        let limit = limit_from_wire(
            delta.algorithm,
            delta.rate.to_native(),
            delta.period_ns.to_native(),
            delta.burst.to_native(),
        )?;
        let units = delta.units.to_native();
        let at_ns = delta.at_ns.to_native();
        if units == 0 {
            return Err(malformed("a delta of 0 units".to_owned()));
        }
        if at_ns > MAX_WIRE_DELTA_AT_NS {
            return Err(malformed(format!(
                "a delta admitted at {at_ns} ns, beyond any clock"
            )));
        }
        deltas.push(Delta {
            key: BucketKey::from_u128(delta.key.to_native()),
            limit,
            units,
            at_ns,
        });
    }
    Ok(DeltaBatch {
        from,
        session,
        seq,
        settled_below,
        deltas,
    })
}

/// Validates a kind 14 payload of the layout of version `layout` (the frame's) into the
/// exchange's [`DeltaAck`]; version 2's layout gives no receiver session.
pub fn decode_region_ack(layout: u8, payload: &[u8]) -> Result<DeltaAck, Refusal> {
    if Feature::RegionResync.readable_at(layout) {
        let m = access_validated::<ArchivedRegionAckMessageV4>(payload, "region ack")?;
        let receiver_session = match m.receiver_session.to_native() {
            0 => None,
            session => Some(session),
        };
        ack(
            (m.region.as_str(), m.node.as_str()),
            m.session.to_native(),
            m.below.to_native(),
            &m.also,
            receiver_session,
        )
    } else {
        let m = access_validated::<ArchivedRegionAckMessage>(payload, "region ack")?;
        ack(
            (m.region.as_str(), m.node.as_str()),
            m.session.to_native(),
            m.below.to_native(),
            &m.also,
            None,
        )
    }
}

/// A kind 14 message's fields, validated, as a [`DeltaAck`] (either layout).
fn ack(
    (region, node): (&str, &str),
    session: u64,
    below: u64,
    also: &[rkyv::Archived<u64>],
    receiver_session: Option<u64>,
) -> Result<DeltaAck, Refusal> {
    let from = peer(region, node)?;
    if also.len() > MAX_ACK_RANGES {
        return Err(malformed(format!(
            "{} out-of-order numbers in one ack; the maximum is {MAX_ACK_RANGES}",
            also.len()
        )));
    }
    Ok(DeltaAck {
        from,
        session,
        below,
        also: also.iter().map(|n| n.to_native()).collect(),
        receiver_session,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NANOS_PER_SEC as S;
    use crate::wire::WireCheck;
    use crate::{Algorithm, Limit};

    fn bytes<T>(message: &T) -> rkyv::util::AlignedVec
    where
        T: for<'a> rkyv::Serialize<
                rkyv::api::high::HighSerializer<
                    rkyv::util::AlignedVec,
                    rkyv::ser::allocator::ArenaHandle<'a>,
                    rkyv::rancor::Error,
                >,
            >,
    {
        rkyv::to_bytes::<rkyv::rancor::Error>(message).unwrap()
    }

    fn eu() -> RegionName {
        RegionName::new("eu").unwrap()
    }

    #[test]
    fn scoped_batches_round_trip_and_default_to_region() {
        let limit = Limit::gcra(10, S, 10).unwrap();
        let batch = CheckBatch {
            groups: vec![
                vec![WireCheck::new("a", &limit, 1)],
                vec![
                    WireCheck::new("b", &limit, 1),
                    WireCheck::new("c", &limit, 1),
                ],
            ],
        };
        let scopes = [Scope::Global, Scope::Region, Scope::Home(eu())];
        let payload = bytes(&ScopedCheckBatch::new(batch.clone(), &scopes));
        let mut groups = CheckGroups::default();
        let decoded =
            decode_scoped_check_batch(&payload, &WireLimits::default(), &mut groups).unwrap();
        assert_eq!(groups.len(), 2);
        assert_eq!(groups.check_count(), 3);
        assert_eq!(decoded, scopes);
        let none = bytes(&ScopedCheckBatch::new(batch, &[]));
        let decoded =
            decode_scoped_check_batch(&none, &WireLimits::default(), &mut groups).unwrap();
        assert_eq!(decoded, vec![Scope::Region; 3]);
    }

    #[test]
    fn bad_scopes_are_refused_with_a_reason() {
        let limit = Limit::gcra(10, S, 10).unwrap();
        let batch = CheckBatch {
            groups: vec![vec![WireCheck::new("a", &limit, 1)]],
        };
        let mut groups = CheckGroups::default();
        for (scopes, says) in [
            (vec![WireScope::default(); 2], "2 scopes for 1 checks"),
            (
                vec![WireScope {
                    kind: 7,
                    home: String::new(),
                }],
                "scope kind 7",
            ),
            (
                vec![WireScope {
                    kind: 2,
                    home: String::new(),
                }],
                "scope kind 2",
            ),
            (
                vec![WireScope {
                    kind: 2,
                    home: "eu west".to_owned(),
                }],
                "must be 1 to 64",
            ),
        ] {
            let payload = bytes(&ScopedCheckBatch {
                batch: batch.clone(),
                scopes,
            });
            let (code, message) =
                decode_scoped_check_batch(&payload, &WireLimits::default(), &mut groups)
                    .unwrap_err();
            assert_eq!(code, ErrorCode::MalformedPayload);
            assert!(message.contains(says), "{message}");
        }
        let (code, _) =
            decode_scoped_check_batch(b"not rkyv at all!", &WireLimits::default(), &mut groups)
                .unwrap_err();
        assert_eq!(code, ErrorCode::MalformedPayload);
    }

    fn batch(settled_below: Option<u64>) -> DeltaBatch {
        DeltaBatch {
            from: Peer::new(eu(), "node-1"),
            session: 9,
            seq: 3,
            settled_below,
            deltas: vec![Delta {
                key: BucketKey::for_key(b"k"),
                limit: Limit::window(Algorithm::SlidingLog, 5, S).unwrap(),
                units: 4,
                at_ns: 77,
            }],
        }
    }

    fn ack(receiver_session: Option<u64>) -> DeltaAck {
        DeltaAck {
            from: Peer::new(eu(), "node-2"),
            session: 9,
            below: 3,
            also: vec![5, 6],
            receiver_session,
        }
    }

    /// A frame's version and payload as a receiver reads them.
    fn framed(encode: impl FnOnce(&mut Vec<u8>)) -> (u8, rkyv::util::AlignedVec) {
        let mut bytes = Vec::new();
        encode(&mut bytes);
        let mut reader = super::super::FrameReader::new(1 << 20);
        reader.extend(&bytes);
        let frame = reader.next_frame().unwrap().unwrap();
        (frame.version, frame.payload)
    }

    #[test]
    fn deltas_and_acks_round_trip() {
        let payload = bytes(&RegionDeltasMessage::from(&batch(None)));
        assert_eq!(
            decode_region_deltas(BASE_LAYOUT, &payload).unwrap(),
            batch(None)
        );
        let payload = bytes(&RegionAckMessage::from(&ack(None)));
        assert_eq!(decode_region_ack(BASE_LAYOUT, &payload).unwrap(), ack(None));
    }

    /// From version 4 the settled point and the receiver's session travel; to an end speaking
    /// less, version 2's layout goes, stamped 2, and reads back without them.
    #[test]
    fn each_version_gets_its_layout_and_reads_it_back() {
        for version in crate::protocol::OLDEST..=crate::protocol::NEWEST {
            let resync = Feature::RegionResync.readable_at(version);
            let (layout, payload) =
                framed(|out| encode_region_deltas(out, version, &batch(Some(2))));
            assert_eq!(layout, if resync { 4 } else { BASE_LAYOUT }, "{version}");
            let expected = batch(resync.then_some(2));
            assert_eq!(decode_region_deltas(layout, &payload).unwrap(), expected);
            let (layout, payload) = framed(|out| encode_region_ack(out, version, &ack(Some(11))));
            assert_eq!(layout, if resync { 4 } else { BASE_LAYOUT }, "{version}");
            assert_eq!(
                decode_region_ack(layout, &payload).unwrap(),
                ack(resync.then_some(11))
            );
        }
        // Not given: 0 on the wire, read back as not given.
        let (layout, payload) = framed(|out| encode_region_deltas(out, 4, &batch(None)));
        assert_eq!(decode_region_deltas(layout, &payload).unwrap(), batch(None));
        let (layout, payload) = framed(|out| encode_region_ack(out, 4, &ack(None)));
        assert_eq!(decode_region_ack(layout, &payload).unwrap(), ack(None));
    }

    /// A settled point above the message's own number is a claim no honest sender makes.
    #[test]
    fn a_settled_point_above_the_message_is_refused() {
        let message = RegionDeltasMessageV4 {
            settled_below: 4,
            ..RegionDeltasMessageV4::from(&batch(None))
        };
        let (code, reason) = decode_region_deltas(4, &bytes(&message)).unwrap_err();
        assert_eq!(code, ErrorCode::MalformedPayload);
        assert!(reason.contains("settled below 4"), "{reason}");
        let at_seq = RegionDeltasMessageV4 {
            settled_below: 3,
            ..message
        };
        assert_eq!(
            decode_region_deltas(4, &bytes(&at_seq)).unwrap(),
            batch(Some(3))
        );
    }

    #[test]
    fn hostile_deltas_are_refused() {
        let good = WireDelta {
            key: 1,
            algorithm: 0,
            rate: 10,
            period_ns: S,
            burst: 10,
            units: 1,
            at_ns: 5,
        };
        let message = |deltas: Vec<WireDelta>, seq: u64, node: &str| RegionDeltasMessage {
            region: "eu".to_owned(),
            node: node.to_owned(),
            session: 1,
            seq,
            deltas,
        };
        let cases = [
            (message(vec![good.clone()], 0, "n"), "numbered 0"),
            (message(vec![good.clone()], 1, ""), "node id of 0 bytes"),
            (
                message(
                    vec![WireDelta {
                        units: 0,
                        ..good.clone()
                    }],
                    1,
                    "n",
                ),
                "0 units",
            ),
            (
                message(
                    vec![WireDelta {
                        rate: 0,
                        ..good.clone()
                    }],
                    1,
                    "n",
                ),
                "rate",
            ),
            (
                message(
                    vec![WireDelta {
                        algorithm: 9,
                        ..good.clone()
                    }],
                    1,
                    "n",
                ),
                "unknown algorithm",
            ),
            (
                message(
                    vec![WireDelta {
                        at_ns: u64::MAX,
                        ..good.clone()
                    }],
                    1,
                    "n",
                ),
                "beyond any clock",
            ),
            (
                message(vec![good.clone(); MAX_WIRE_DELTAS + 1], 1, "n"),
                "deltas in one message",
            ),
        ];
        for (message, says) in cases {
            let (_, reason) = decode_region_deltas(BASE_LAYOUT, &bytes(&message)).unwrap_err();
            assert!(reason.contains(says), "{reason} (wanted {says})");
        }
        let ack = RegionAckMessage {
            region: "eu".to_owned(),
            node: "n".to_owned(),
            session: 1,
            below: 1,
            also: vec![2; MAX_ACK_RANGES + 1],
        };
        assert!(decode_region_ack(BASE_LAYOUT, &bytes(&ack)).is_err());
    }
}
