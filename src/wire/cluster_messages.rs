//! Messages between nodes (gossip, replication, forwarded checks) and the slot table a node gives
//! its clients. Validated like every other payload.

use rkyv::rancor;
use rkyv::{Archive, Deserialize, Serialize};

use super::ErrorCode;
use super::messages::Refusal;
use crate::cluster::{Gossip, MemberState, SLOTS};
use crate::{BucketKey, BucketState};

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
}

/// One replicated bucket: its key bits, theoretical arrival time and margin.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireBucket {
    pub key: u128,
    pub tat_ns: u64,
    pub margin_ms: u32,
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
        WireBucket {
            key: state.key.to_u128(),
            tat_ns: state.tat_ns,
            margin_ms: state.margin_ms,
        }
    }
}

impl From<&ArchivedWireBucket> for BucketState {
    fn from(bucket: &ArchivedWireBucket) -> Self {
        BucketState {
            key: BucketKey::from_u128(bucket.key.to_native()),
            tat_ns: bucket.tat_ns.to_native(),
            margin_ms: bucket.margin_ms.to_native(),
        }
    }
}

fn malformed(what: &str, e: impl std::fmt::Display) -> Refusal {
    (ErrorCode::MalformedPayload, format!("invalid {what}: {e}"))
}

/// Validates and converts a gossip payload.
pub fn decode_gossip(payload: &[u8]) -> Result<Gossip, Refusal> {
    let archived =
        rkyv::access::<crate::cluster::membership::ArchivedGossip, rancor::Error>(payload)
            .map_err(|e| malformed("gossip", e))?;
    rkyv::deserialize::<Gossip, rancor::Error>(archived).map_err(|e| malformed("gossip", e))
}

/// Validates a replication payload.
pub fn decode_replicate(payload: &[u8]) -> Result<Replicated, Refusal> {
    let message = rkyv::access::<ArchivedReplicateMessage, rancor::Error>(payload)
        .map_err(|e| malformed("replication", e))?;
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
        buckets: message.buckets.iter().map(BucketState::from).collect(),
    })
}

/// Validates a slot table payload (client side) and checks its shape.
pub fn decode_slot_table(payload: &[u8]) -> Result<SlotTableMessage, Refusal> {
    let archived = rkyv::access::<ArchivedSlotTableMessage, rancor::Error>(payload)
        .map_err(|e| malformed("slot table", e))?;
    let table: SlotTableMessage = rkyv::deserialize::<SlotTableMessage, rancor::Error>(archived)
        .map_err(|e| malformed("slot table", e))?;
    if table.owners.len() != SLOTS {
        return Err((
            ErrorCode::MalformedPayload,
            format!(
                "slot table with {} slots, expected {SLOTS}",
                table.owners.len()
            ),
        ));
    }
    if table
        .owners
        .iter()
        .any(|&o| o != u16::MAX && usize::from(o) >= table.members.len())
    {
        return Err((
            ErrorCode::MalformedPayload,
            "slot table names a member it does not list".to_owned(),
        ));
    }
    Ok(table)
}
