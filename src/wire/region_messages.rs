//! Messages for regions: a check batch carrying each check's scope (kind 12), and the
//! inter-region delta exchange between owners (kind 13 deltas, kind 14 acknowledgements).
//! Validated like every other payload before a field is read.
//!
//! rkyv archives have no optional trailing fields, so a scope cannot be added to the kind 1
//! check as an old node would still read it: a batch with any non-`region` check travels as
//! kind 12 instead, and kind 1 stays exactly as it was (every check `region`).

use rkyv::{Archive, Deserialize, Serialize};

use super::ErrorCode;
use super::check_batch::{ArchivedCheckBatch, CheckBatch, decode_groups};
use super::messages::{
    Refusal, ValidCheck, WireLimits, access_validated, algorithm_to_wire, limit_from_wire,
};
use crate::BucketKey;
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
/// check (or none at all). Returns the groups and the scopes in flattened order.
pub fn decode_scoped_check_batch(
    payload: &[u8],
    limits: &WireLimits,
) -> Result<(Vec<Vec<ValidCheck>>, Vec<Scope>), Refusal> {
    let scoped = access_validated::<ArchivedScopedCheckBatch>(payload, "scoped check batch")?;
    let batch: &ArchivedCheckBatch = &scoped.batch;
    let groups = decode_groups(batch, limits)?;
    let total: usize = groups.iter().map(Vec::len).sum();
    if scoped.scopes.is_empty() {
        return Ok((groups, vec![Scope::Region; total]));
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
    Ok((groups, scopes))
}

/// Validates a kind 13 payload into the exchange's [`DeltaBatch`].
pub fn decode_region_deltas(payload: &[u8]) -> Result<DeltaBatch, Refusal> {
    let message = access_validated::<ArchivedRegionDeltasMessage>(payload, "region deltas")?;
    let from = peer(message.region.as_str(), message.node.as_str())?;
    let seq = message.seq.to_native();
    if seq == 0 {
        return Err(malformed(
            "a region delta message numbered 0 (numbers start at 1)".to_owned(),
        ));
    }
    if message.deltas.len() > MAX_WIRE_DELTAS {
        return Err(malformed(format!(
            "{} deltas in one message; the maximum is {MAX_WIRE_DELTAS}",
            message.deltas.len()
        )));
    }
    let mut deltas = Vec::with_capacity(message.deltas.len());
    for delta in message.deltas.iter() {
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
        session: message.session.to_native(),
        seq,
        deltas,
    })
}

/// Validates a kind 14 payload into the exchange's [`DeltaAck`].
pub fn decode_region_ack(payload: &[u8]) -> Result<DeltaAck, Refusal> {
    let message = access_validated::<ArchivedRegionAckMessage>(payload, "region ack")?;
    let from = peer(message.region.as_str(), message.node.as_str())?;
    if message.also.len() > MAX_ACK_RANGES {
        return Err(malformed(format!(
            "{} out-of-order numbers in one ack; the maximum is {MAX_ACK_RANGES}",
            message.also.len()
        )));
    }
    Ok(DeltaAck {
        from,
        session: message.session.to_native(),
        below: message.below.to_native(),
        also: message.also.iter().map(|n| n.to_native()).collect(),
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
        let (groups, decoded) =
            decode_scoped_check_batch(&payload, &WireLimits::default()).unwrap();
        assert_eq!(groups.len(), 2);
        assert_eq!(decoded, scopes);
        let none = bytes(&ScopedCheckBatch::new(batch, &[]));
        let (_, decoded) = decode_scoped_check_batch(&none, &WireLimits::default()).unwrap();
        assert_eq!(decoded, vec![Scope::Region; 3]);
    }

    #[test]
    fn bad_scopes_are_refused_with_a_reason() {
        let limit = Limit::gcra(10, S, 10).unwrap();
        let batch = CheckBatch {
            groups: vec![vec![WireCheck::new("a", &limit, 1)]],
        };
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
                decode_scoped_check_batch(&payload, &WireLimits::default()).unwrap_err();
            assert_eq!(code, ErrorCode::MalformedPayload);
            assert!(message.contains(says), "{message}");
        }
        let (code, _) =
            decode_scoped_check_batch(b"not rkyv at all!", &WireLimits::default()).unwrap_err();
        assert_eq!(code, ErrorCode::MalformedPayload);
    }

    #[test]
    fn deltas_and_acks_round_trip() {
        let limit = Limit::window(Algorithm::SlidingLog, 5, S).unwrap();
        let batch = DeltaBatch {
            from: Peer::new(eu(), "node-1"),
            session: 9,
            seq: 3,
            deltas: vec![Delta {
                key: BucketKey::for_key(b"k"),
                limit,
                units: 4,
                at_ns: 77,
            }],
        };
        let payload = bytes(&RegionDeltasMessage::from(&batch));
        assert_eq!(decode_region_deltas(&payload).unwrap(), batch);
        let ack = DeltaAck {
            from: Peer::new(eu(), "node-2"),
            session: 9,
            below: 3,
            also: vec![5, 6],
        };
        let payload = bytes(&RegionAckMessage::from(&ack));
        assert_eq!(decode_region_ack(&payload).unwrap(), ack);
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
            let (_, reason) = decode_region_deltas(&bytes(&message)).unwrap_err();
            assert!(reason.contains(says), "{reason} (wanted {says})");
        }
        let ack = RegionAckMessage {
            region: "eu".to_owned(),
            node: "n".to_owned(),
            session: 1,
            below: 1,
            also: vec![2; MAX_ACK_RANGES + 1],
        };
        assert!(decode_region_ack(&bytes(&ack)).is_err());
    }
}
