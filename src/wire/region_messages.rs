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
use super::varint;
use super::{BASE_LAYOUT, ErrorCode, FrameKind};
use crate::protocol::Feature;
use crate::region::{Delta, DeltaAck, DeltaBatch, MAX_ACK_RANGES, Peer, RegionName, Scope};
use crate::{BucketKey, Limit};

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

/// A limit as a version 13 kind 13 message carries it: once, for every delta of it.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct WireDeltaLimit {
    /// `Algorithm` in wire order, as in [`WireDelta`].
    pub algorithm: u8,
    pub rate: u64,
    pub period_ns: u64,
    pub burst: u64,
}

/// Kind 13 from protocol version 13: version 4's fields, the deltas as columns. A delta takes
/// about 19 bytes where a [`WireDelta`] takes 64: its key (12 bytes), its limit as an index into
/// the message's distinct limits (2), and its units and age as two LEB128 integers (1 and about
/// 4). A region's deltas cross the WAN, where bytes are paid for, and each byte is copied,
/// encrypted and decrypted at both ends.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct RegionDeltasMessageV13 {
    pub region: String,
    pub node: String,
    pub session: u64,
    pub seq: u64,
    pub settled_below: u64,
    /// Each distinct limit of the deltas, once (no more limits than deltas).
    pub limits: Vec<WireDeltaLimit>,
    /// Per delta (the three columns of equal length): the low 64 bits of its key
    /// (`BucketKey::to_u128`), the next 32, its limit's index in `limits`.
    pub key_hashes: Vec<u64>,
    pub key_checks: Vec<u32>,
    pub limit_indices: Vec<u16>,
    /// The latest admission of any delta here (the sender's clock; 0 without deltas).
    pub newest_at_ns: u64,
    /// Per delta, in order, two unsigned LEB128 integers: its units, and how long before
    /// `newest_at_ns` its latest admission was. Nothing after the last.
    pub units_and_ages: Vec<u8>,
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

impl From<&DeltaBatch> for RegionDeltasMessageV13 {
    fn from(batch: &DeltaBatch) -> Self {
        let n = batch.deltas.len();
        let mut message = RegionDeltasMessageV13 {
            region: batch.from.region.as_str().to_owned(),
            node: batch.from.node.to_string(),
            session: batch.session,
            seq: batch.seq,
            settled_below: batch.settled_below.unwrap_or(0),
            limits: Vec::new(),
            key_hashes: Vec::with_capacity(n),
            key_checks: Vec::with_capacity(n),
            limit_indices: Vec::with_capacity(n),
            newest_at_ns: batch.deltas.iter().map(|d| d.at_ns).max().unwrap_or(0),
            units_and_ages: Vec::with_capacity(n * 6),
        };
        // Nearly every delta has the limit of the one before it (one rule per global key).
        let mut indices: hashbrown::HashMap<Limit, u16> = hashbrown::HashMap::new();
        let mut last: Option<(Limit, u16)> = None;
        for delta in &batch.deltas {
            let index = match last {
                Some((limit, index)) if limit == delta.limit => index,
                _ => {
                    let next = message.limits.len();
                    let index = *indices.entry(delta.limit).or_insert_with(|| {
                        message.limits.push(WireDeltaLimit::from(&delta.limit));
                        // A message holds at most MAX_WIRE_DELTAS (4,096) deltas.
                        u16::try_from(next).unwrap_or(u16::MAX)
                    });
                    last = Some((delta.limit, index));
                    index
                }
            };
            let key = delta.key.to_u128();
            // Truncations intended: a key is 96 bits, its hash the low 64.
            message.key_hashes.push(key as u64);
            message.key_checks.push((key >> 64) as u32);
            message.limit_indices.push(index);
            varint::put(&mut message.units_and_ages, delta.units);
            varint::put(
                &mut message.units_and_ages,
                message.newest_at_ns - delta.at_ns,
            );
        }
        message
    }
}

impl From<&Limit> for WireDeltaLimit {
    fn from(limit: &Limit) -> Self {
        WireDeltaLimit {
            algorithm: algorithm_to_wire(limit.algorithm()),
            rate: limit.rate(),
            period_ns: limit.period_ns(),
            burst: limit.burst(),
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

/// Appends `batch` as a kind 13 frame for a peer speaking `version`: the deltas as columns from
/// version 13, with the settled point from version 4, in version 2's layout (without it) for a
/// peer that speaks less.
pub fn encode_region_deltas(out: &mut Vec<u8>, version: u8, batch: &DeltaBatch) {
    let kind = FrameKind::RegionDeltas;
    if Feature::CompactDeltas.readable_at(version) {
        let message = RegionDeltasMessageV13::from(batch);
        encode_message_at(out, kind.layout_at(version), kind, 0, &message);
    } else if Feature::RegionResync.readable_at(version) {
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
    if Feature::CompactDeltas.readable_at(layout) {
        decode_compact_deltas(payload)
    } else if Feature::RegionResync.readable_at(layout) {
        let m = access_validated::<ArchivedRegionDeltasMessageV4>(payload, "region deltas")?;
        let seq = m.seq.to_native();
        let settled_below = settled_below(seq, m.settled_below.to_native())?;
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

/// A version 4 or later message's settled point (0: not given), which cannot be above the
/// message's own number `seq`.
fn settled_below(seq: u64, settled: u64) -> Result<Option<u64>, Refusal> {
    match settled {
        0 => Ok(None),
        settled if settled > seq => Err(malformed(format!(
            "a region delta message numbered {seq} settled below {settled}: a message in flight \
             cannot be settled"
        ))),
        settled => Ok(Some(settled)),
    }
}

/// The sender of a kind 13 message and its number, validated (every layout).
fn deltas_sender(region: &str, node: &str, seq: u64, deltas: usize) -> Result<Peer, Refusal> {
    let from = peer(region, node)?;
    if seq == 0 {
        return Err(malformed(
            "a region delta message numbered 0 (numbers start at 1)".to_owned(),
        ));
    }
    if deltas > MAX_WIRE_DELTAS {
        return Err(malformed(format!(
            "{deltas} deltas in one message; the maximum is {MAX_WIRE_DELTAS}"
        )));
    }
    Ok(from)
}

/// One delta's units and admission time, validated (every layout).
fn delta_units(units: u64, at_ns: u64) -> Result<(u64, u64), Refusal> {
    if units == 0 {
        return Err(malformed("a delta of 0 units".to_owned()));
    }
    if at_ns > MAX_WIRE_DELTA_AT_NS {
        return Err(malformed(format!(
            "a delta admitted at {at_ns} ns, beyond any clock"
        )));
    }
    Ok((units, at_ns))
}

/// Validates a kind 13 payload of version 13's layout: its columns of one length, each limit
/// (once), each delta's limit index, and its units and age, which must end where the bytes do.
fn decode_compact_deltas(payload: &[u8]) -> Result<DeltaBatch, Refusal> {
    let m = access_validated::<ArchivedRegionDeltasMessageV13>(payload, "region deltas")?;
    let (seq, n) = (m.seq.to_native(), m.key_hashes.len());
    let settled_below = settled_below(seq, m.settled_below.to_native())?;
    let from = deltas_sender(m.region.as_str(), m.node.as_str(), seq, n)?;
    let lengths = [m.key_checks.len(), m.limit_indices.len()];
    if lengths.iter().any(|&len| len != n) || m.limits.len() > n {
        return Err(malformed(format!(
            "delta columns of {n} key hashes, {lengths:?} key checks and limit indices, {} limits \
             (at most one per delta)",
            m.limits.len()
        )));
    }
    let limits = m
        .limits
        .iter()
        .map(|l| {
            limit_from_wire(
                l.algorithm,
                l.rate.to_native(),
                l.period_ns.to_native(),
                l.burst.to_native(),
            )
        })
        .collect::<Result<Vec<Limit>, Refusal>>()?;
    let newest_at_ns = m.newest_at_ns.to_native();
    let mut rest: &[u8] = &m.units_and_ages;
    let mut deltas = Vec::with_capacity(n);
    for i in 0..n {
        let index = usize::from(m.limit_indices[i].to_native());
        let limit = *limits.get(index).ok_or_else(|| {
            malformed(format!(
                "a delta's limit index {index} is past the message's {} limits",
                limits.len()
            ))
        })?;
        let (units, after) = varint::take(rest).ok_or_else(|| units_and_ages_end(i))?;
        let (age, after) = varint::take(after).ok_or_else(|| units_and_ages_end(i))?;
        rest = after;
        let at_ns = newest_at_ns.checked_sub(age).ok_or_else(|| {
            malformed(format!(
                "a delta admitted {age} ns before the message's newest admission at \
                 {newest_at_ns} ns"
            ))
        })?;
        let (units, at_ns) = delta_units(units, at_ns)?;
        let key = u128::from(m.key_hashes[i].to_native())
            | (u128::from(m.key_checks[i].to_native()) << 64);
        deltas.push(Delta {
            key: BucketKey::from_u128(key),
            limit,
            units,
            at_ns,
        });
    }
    if !rest.is_empty() {
        return Err(malformed(format!(
            "{} bytes of units and ages after the last of {n} deltas",
            rest.len()
        )));
    }
    Ok(DeltaBatch {
        from,
        session: m.session.to_native(),
        seq,
        settled_below,
        deltas,
    })
}

fn units_and_ages_end(delta: usize) -> Refusal {
    malformed(format!(
        "the units and ages end inside delta {delta} (two LEB128 integers each, shortest form)"
    ))
}

/// A kind 13 message's fields, validated, as a [`DeltaBatch`] (layouts 2 and 4).
fn deltas_batch(
    (region, node): (&str, &str),
    session: u64,
    seq: u64,
    settled_below: Option<u64>,
    wire: &[ArchivedWireDelta],
) -> Result<DeltaBatch, Refusal> {
    let from = deltas_sender(region, node, seq, wire.len())?;
    let mut deltas = Vec::with_capacity(wire.len());
    for delta in wire {
        let limit = limit_from_wire(
            delta.algorithm,
            delta.rate.to_native(),
            delta.period_ns.to_native(),
            delta.burst.to_native(),
        )?;
        let (units, at_ns) = delta_units(delta.units.to_native(), delta.at_ns.to_native())?;
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

    /// From version 4 the settled point and the receiver's session travel, from 13 the deltas
    /// as columns; to an end speaking less, version 2's layout goes, stamped 2, and reads back
    /// without them.
    #[test]
    fn each_version_gets_its_layout_and_reads_it_back() {
        for version in crate::protocol::OLDEST..=crate::protocol::NEWEST {
            let resync = Feature::RegionResync.readable_at(version);
            let (layout, payload) =
                framed(|out| encode_region_deltas(out, version, &batch(Some(2))));
            let deltas_layout = match version {
                13.. => 13,
                4.. => 4,
                _ => BASE_LAYOUT,
            };
            assert_eq!(layout, deltas_layout, "{version}");
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

    /// A round's deltas as the exchange sends them: many keys, a few limits interleaved, units
    /// and admission times anywhere in range.
    fn round(deltas: usize) -> DeltaBatch {
        let limits = [
            Limit::gcra(100, S, 50).unwrap(),
            Limit::window(Algorithm::FixedWindow, 7, 60 * S).unwrap(),
            Limit::window(Algorithm::SlidingLog, 3, S).unwrap(),
        ];
        let newest = 1_700_000_000 * S;
        DeltaBatch {
            deltas: (0..deltas)
                .map(|i| Delta {
                    key: BucketKey::for_key(format!("user:{i}").as_bytes()),
                    // Mostly the first limit, as one rule's keys are.
                    limit: limits[if i % 5 == 0 { i % 3 } else { 0 }],
                    units: match i % 7 {
                        0 => u64::MAX,
                        1 => 1 << 40,
                        _ => 1 + (i as u64 % 3),
                    },
                    at_ns: match i % 11 {
                        0 => 0,
                        1 => newest,
                        _ => newest - (i as u64 * 7_919_000 % (100 * 1_000_000)),
                    },
                })
                .collect(),
            ..batch(Some(2))
        }
    }

    #[test]
    fn compact_deltas_read_back_whole_in_a_third_of_the_bytes() {
        for n in [0, 1, 2, 1_000, MAX_WIRE_DELTAS] {
            let batch = round(n);
            let (layout, payload) = framed(|out| encode_region_deltas(out, 13, &batch));
            assert_eq!(layout, 13);
            assert_eq!(
                decode_region_deltas(layout, &payload).unwrap(),
                batch,
                "{n}"
            );
            let message = RegionDeltasMessageV13::from(&batch);
            let mut distinct: Vec<Limit> = Vec::new();
            for delta in &batch.deltas {
                if !distinct.contains(&delta.limit) {
                    distinct.push(delta.limit);
                }
            }
            assert_eq!(message.limits.len(), distinct.len(), "each limit once");
            if n == 1_000 {
                let (_, v4) = framed(|out| encode_region_deltas(out, 4, &batch));
                assert!(
                    3 * payload.len() < v4.len() + 3 * 64,
                    "{} vs {}",
                    payload.len(),
                    v4.len()
                );
            }
        }
        // The usual round: one limit, one unit, ages within the interval.
        let usual = DeltaBatch {
            deltas: (0..1_000u64)
                .map(|i| Delta {
                    key: BucketKey::for_key(&i.to_le_bytes()),
                    limit: Limit::gcra(100, S, 50).unwrap(),
                    units: 1,
                    at_ns: 1_700_000_000 * S + i * 100_000,
                })
                .collect(),
            ..batch(None)
        };
        let (_, payload) = framed(|out| encode_region_deltas(out, 13, &usual));
        assert!(payload.len() < 20 * 1_000 + 200, "{} bytes", payload.len());
        assert_eq!(decode_region_deltas(13, &payload).unwrap(), usual);
    }

    #[test]
    fn hostile_compact_deltas_are_refused_in_words() {
        let good = RegionDeltasMessageV13::from(&round(3));
        assert!(decode_region_deltas(13, &bytes(&good)).is_ok());
        let mut one_unit = Vec::new();
        varint::put(&mut one_unit, 1);
        varint::put(&mut one_unit, 0);
        let cases = [
            (
                RegionDeltasMessageV13 {
                    key_checks: vec![1; 2],
                    ..good.clone()
                },
                "delta columns of 3 key hashes, [2, 3]",
            ),
            (
                RegionDeltasMessageV13 {
                    limits: vec![good.limits[0].clone(); 4],
                    ..good.clone()
                },
                "4 limits",
            ),
            (
                RegionDeltasMessageV13 {
                    limit_indices: vec![0, 0, 7],
                    ..good.clone()
                },
                "limit index 7 is past the message's 1 limits",
            ),
            (
                RegionDeltasMessageV13 {
                    units_and_ages: good.units_and_ages[..good.units_and_ages.len() - 1].to_vec(),
                    ..good.clone()
                },
                "end inside delta 2",
            ),
            (
                RegionDeltasMessageV13 {
                    units_and_ages: [&good.units_and_ages[..], &[0]].concat(),
                    ..good.clone()
                },
                "1 bytes of units and ages after the last of 3 deltas",
            ),
            (
                RegionDeltasMessageV13 {
                    newest_at_ns: 5,
                    ..good.clone()
                },
                "before the message's newest admission at 5 ns",
            ),
            (
                RegionDeltasMessageV13 {
                    newest_at_ns: u64::MAX,
                    ..RegionDeltasMessageV13::from(&round(1))
                },
                "beyond any clock",
            ),
            (
                RegionDeltasMessageV13 {
                    units_and_ages: [&[0u8, 0][..], &good.units_and_ages[..]].concat(),
                    ..good.clone()
                },
                "0 units",
            ),
            (
                RegionDeltasMessageV13 {
                    limits: vec![WireDeltaLimit {
                        rate: 0,
                        ..good.limits[0].clone()
                    }],
                    limit_indices: vec![0; 3],
                    ..good.clone()
                },
                "rate",
            ),
            (
                RegionDeltasMessageV13 {
                    seq: 0,
                    ..good.clone()
                },
                "numbered 0",
            ),
            (
                RegionDeltasMessageV13 {
                    settled_below: 4,
                    ..good.clone()
                },
                "settled below 4",
            ),
            (
                RegionDeltasMessageV13 {
                    key_hashes: vec![1; MAX_WIRE_DELTAS + 1],
                    key_checks: vec![1; MAX_WIRE_DELTAS + 1],
                    limit_indices: vec![0; MAX_WIRE_DELTAS + 1],
                    units_and_ages: one_unit.repeat(MAX_WIRE_DELTAS + 1),
                    ..good.clone()
                },
                "deltas in one message",
            ),
        ];
        for (message, says) in cases {
            let (code, reason) = decode_region_deltas(13, &bytes(&message)).unwrap_err();
            assert!(
                matches!(code, ErrorCode::MalformedPayload | ErrorCode::InvalidLimit),
                "{code:?}"
            );
            assert!(reason.contains(says), "{reason} (wanted {says})");
        }
    }
}
