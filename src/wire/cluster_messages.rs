//! Messages between nodes (gossip, replication, forwarded checks) and the slot table a node gives
//! its clients. Validated like every other payload.

use rkyv::rancor;
use rkyv::{Archive, Deserialize, Serialize};

use super::ErrorCode;
use super::messages::Refusal;
use super::messages::{access_validated, algorithm_to_wire};
use crate::algorithm::WindowState;
use crate::cluster::{Gossip, IdConflict, MemberState, SLOTS};
use crate::{Algorithm, BucketKey, BucketState, BucketValue, Limit};

/// A member as a client sees it.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct TableMember {
    pub id: String,
    pub addr: String,
    pub region: String,
    /// 0 alive, 1 suspect, 2 dead, 3 left.
    pub state: u8,
}

/// Node → client: who owns which slot. `owners[slot]` indexes `members`; `u16::MAX`: nobody.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct SlotTableMessage {
    /// Equal on every node with the same view of the owners (a hash of their ids).
    pub version: u64,
    /// The sending node's own count of ownership changes (for status and metrics).
    pub epoch: u64,
    /// The node that sent this table.
    pub from: String,
    pub members: Vec<TableMember>,
    pub owners: Vec<u16>,
    /// `successors[slot]`: who takes the slot over if its owner fails (it holds the replicas);
    /// indexes `members` like `owners`.
    pub successors: Vec<u16>,
}

/// One replicated bucket: its key bits and its state, flat (fields another algorithm does not
/// use are zero).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct WireBucket {
    pub key: u128,
    /// `Algorithm` in wire order: 0 gcra, 1 fixed-window, 2 sliding-window, 3 sliding-log.
    pub algorithm: u8,
    /// GCRA: the theoretical arrival time and the margin (ms).
    pub tat_ns: u64,
    pub margin_ms: u32,
    /// Windows and logs: their limit.
    pub rate: u64,
    pub period_ns: u64,
    pub burst: u64,
    /// Windows: the window's index, the units admitted in it and in the one before.
    pub window: u64,
    pub count: u64,
    pub previous: u64,
    /// Logs: the admission times, oldest first (at most the limit's burst).
    pub times_ns: Vec<u64>,
}

/// Node → node: buckets for a successor (every sync interval) or a new owner (hand-off).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct ReplicateMessage {
    pub from: String,
    /// Set when these buckets are (part of) a hand-off; replicas otherwise.
    pub handoff: Option<HandoffPart>,
    pub buckets: Vec<WireBucket>,
}

/// Which hand-off a message belongs to: hand-off `id` of its sender, sent as `parts` messages
/// (which may arrive in any order), carrying the state of `slots` (every part lists them all).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct HandoffPart {
    pub id: u64,
    pub part: u32,
    pub parts: u32,
    pub slots: Vec<u16>,
}

/// Most messages one hand-off may be split into (far above what a full store needs).
pub const MAX_HANDOFF_PARTS: u32 = 1 << 16;

/// A validated replicate message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replicated {
    pub from: String,
    pub handoff: Option<HandoffPart>,
    pub buckets: Vec<BucketState>,
}

pub fn member_state_to_wire(state: MemberState) -> u8 {
    match state {
        MemberState::Alive => 0,
        MemberState::Suspect => 1,
        MemberState::Dead => 2,
        MemberState::Left => 3,
    }
}

pub fn member_state_from_wire(state: u8) -> MemberState {
    match state {
        0 => MemberState::Alive,
        1 => MemberState::Suspect,
        2 => MemberState::Dead,
        _ => MemberState::Left,
    }
}

impl From<&BucketState> for WireBucket {
    fn from(state: &BucketState) -> Self {
        let key = state.key.to_u128();
        let with_limit = |limit: &Limit| WireBucket {
            key,
            algorithm: algorithm_to_wire(limit.algorithm()),
            rate: limit.rate(),
            period_ns: limit.period_ns(),
            burst: limit.burst(),
            ..WireBucket::default()
        };
        match &state.value {
            BucketValue::Gcra { tat_ns, margin_ms } => WireBucket {
                key,
                algorithm: algorithm_to_wire(Algorithm::Gcra),
                tat_ns: *tat_ns,
                margin_ms: *margin_ms,
                ..WireBucket::default()
            },
            BucketValue::Window { limit, state } => WireBucket {
                window: state.window,
                count: state.count,
                previous: state.previous,
                ..with_limit(limit)
            },
            BucketValue::Log { limit, times_ns } => WireBucket {
                times_ns: times_ns.clone(),
                ..with_limit(limit)
            },
        }
    }
}

/// Latest GCRA arrival time a peer may send. A store's TATs are at most `now` plus a capacity
/// (at most `u64::MAX / 4`), and the Unix-epoch `now` stays below `u64::MAX / 4` until 2116, so
/// every real TAT fits. A larger one can only come from a broken or hostile peer, and is refused
/// before it reaches the store, whose GCRA arithmetic (`debt + cost * interval`) it could push
/// past `u64::MAX`.
pub const MAX_WIRE_TAT_NS: u64 = u64::MAX / 2;

/// Validates one received bucket: a known algorithm, a TAT in range, a valid limit, a log no
/// longer than it.
fn bucket_from_wire(bucket: &ArchivedWireBucket) -> Result<BucketState, Refusal> {
    let key = BucketKey::from_u128(bucket.key.to_native());
    let algorithm = *Algorithm::ALL
        .get(usize::from(bucket.algorithm))
        .ok_or_else(|| malformed("bucket", format!("unknown algorithm {}", bucket.algorithm)))?;
    let value = if algorithm == Algorithm::Gcra {
        let tat_ns = bucket.tat_ns.to_native();
        if tat_ns > MAX_WIRE_TAT_NS {
            return Err(malformed(
                "bucket",
                format!("GCRA arrival time {tat_ns} ns is later than any store reaches"),
            ));
        }
        BucketValue::Gcra {
            tat_ns,
            margin_ms: bucket.margin_ms.to_native(),
        }
    } else {
        let limit = Limit::new(
            algorithm,
            bucket.rate.to_native(),
            bucket.period_ns.to_native(),
            bucket.burst.to_native(),
        )
        .map_err(|e| malformed("bucket", e))?;
        if algorithm == Algorithm::SlidingLog {
            if bucket.times_ns.len() as u64 > limit.burst() {
                return Err(malformed("bucket", "log longer than its limit"));
            }
            BucketValue::Log {
                limit,
                times_ns: bucket.times_ns.iter().map(|t| t.to_native()).collect(),
            }
        } else {
            BucketValue::Window {
                limit,
                state: WindowState {
                    window: bucket.window.to_native(),
                    count: bucket.count.to_native(),
                    previous: bucket.previous.to_native(),
                },
            }
        }
    };
    Ok(BucketState { key, value })
}

fn malformed(what: &str, e: impl std::fmt::Display) -> Refusal {
    (ErrorCode::MalformedPayload, format!("invalid {what}: {e}"))
}

/// Validates and converts a gossip payload.
pub fn decode_gossip(payload: &[u8]) -> Result<Gossip, Refusal> {
    let archived =
        access_validated::<crate::cluster::membership::ArchivedGossip>(payload, "gossip message")?;
    rkyv::deserialize::<Gossip, rancor::Error>(archived).map_err(|e| malformed("gossip", e))
}

/// Longest id or address an id conflict may name, in bytes.
pub const MAX_MEMBER_FIELD_BYTES: usize = 256;

/// Validates an id conflict: a non-empty id and two different, non-empty addresses, each at
/// most [`MAX_MEMBER_FIELD_BYTES`].
pub fn decode_id_conflict(payload: &[u8]) -> Result<IdConflict, Refusal> {
    let archived =
        rkyv::access::<crate::cluster::membership::ArchivedIdConflict, rancor::Error>(payload)
            .map_err(|e| malformed("id conflict", e))?;
    let conflict: IdConflict = rkyv::deserialize::<IdConflict, rancor::Error>(archived)
        .map_err(|e| malformed("id conflict", e))?;
    for (field, value) in [
        ("id", &conflict.id),
        ("holder address", &conflict.holder_addr),
        ("claimant address", &conflict.claimant_addr),
    ] {
        if value.is_empty() || value.len() > MAX_MEMBER_FIELD_BYTES {
            return Err(malformed(
                "id conflict",
                format!(
                    "{field} of {} bytes (1 to {MAX_MEMBER_FIELD_BYTES})",
                    value.len()
                ),
            ));
        }
    }
    if conflict.holder_addr == conflict.claimant_addr {
        return Err(malformed(
            "id conflict",
            "holder and claimant at the same address",
        ));
    }
    Ok(conflict)
}

/// Validates a replication payload.
pub fn decode_replicate(payload: &[u8]) -> Result<Replicated, Refusal> {
    let message = access_validated::<ArchivedReplicateMessage>(payload, "replication message")?;
    let handoff = message.handoff.as_ref().map(|h| HandoffPart {
        id: h.id.to_native(),
        part: h.part.to_native(),
        parts: h.parts.to_native(),
        slots: h.slots.iter().map(|s| s.to_native()).collect(),
    });
    if let Some(h) = &handoff {
        if h.parts == 0 || h.parts > MAX_HANDOFF_PARTS || h.part >= h.parts {
            return Err(malformed(
                "replication",
                format!("hand-off part {} of {}", h.part, h.parts),
            ));
        }
        if h.slots.len() > SLOTS || h.slots.iter().any(|&s| usize::from(s) >= SLOTS) {
            return Err(malformed("replication", "hand-off slots out of range"));
        }
    }
    Ok(Replicated {
        from: message.from.as_str().to_owned(),
        handoff,
        buckets: message
            .buckets
            .iter()
            .map(bucket_from_wire)
            .collect::<Result<_, _>>()?,
    })
}

/// Validates a slot table payload (client side) and checks its shape.
pub fn decode_slot_table(payload: &[u8]) -> Result<SlotTableMessage, Refusal> {
    let archived = access_validated::<ArchivedSlotTableMessage>(payload, "slot table")?;
    let table: SlotTableMessage = rkyv::deserialize::<SlotTableMessage, rancor::Error>(archived)
        .map_err(|e| malformed("slot table", e))?;
    if table.owners.len() != SLOTS || table.successors.len() != SLOTS {
        return Err((
            ErrorCode::MalformedPayload,
            format!(
                "slot table with {} owners and {} successors, expected {SLOTS}",
                table.owners.len(),
                table.successors.len()
            ),
        ));
    }
    if table
        .owners
        .iter()
        .chain(&table.successors)
        .any(|&o| o != u16::MAX && usize::from(o) >= table.members.len())
    {
        return Err((
            ErrorCode::MalformedPayload,
            "slot table names a member it does not list".to_owned(),
        ));
    }
    Ok(table)
}
