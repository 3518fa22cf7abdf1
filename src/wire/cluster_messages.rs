//! Messages between nodes (gossip, replication, forwarded checks) and the slot table a node gives
//! its clients. Validated like every other payload.

use rkyv::rancor;
use rkyv::{Archive, Deserialize, Serialize};

use super::messages::Refusal;
use super::messages::{access_validated, algorithm_to_wire};
use super::{BASE_LAYOUT, ErrorCode, FrameKind, encode_frame_at, encode_message_at};
use crate::algorithm::{SlidingLog, WindowState};
use crate::cluster::membership::MemberDigest;
use crate::cluster::{Gossip, IdConflict, MemberInfo, MemberState, SLOTS};
use crate::protocol::{Feature, VersionRange};
use crate::{Algorithm, BucketKey, BucketState, BucketValue, Limit};
use rkyv::util::AlignedVec;

/// A member as a client sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableMember {
    pub id: String,
    pub addr: String,
    pub region: String,
    /// 0 alive, 1 suspect, 2 dead, 3 left.
    pub state: u8,
    /// The protocol versions it speaks, as the sending node knows them; `None` from a node that
    /// sent version 2's table, which has no ranges.
    pub versions: Option<VersionRange>,
}

/// Node → client: who owns which slot. `owners[slot]` indexes `members`; `u16::MAX`: nobody.
/// Its layouts on the wire: [`encode_slot_table`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
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
    /// The protocol version every member speaks (`protocol::cluster_version`), as the sending
    /// node knows it; 2 from a node that sent version 2's table. 0: the members share none.
    pub cluster_version: u8,
}

/// The slot table's layout in version 2.
#[derive(Archive, Serialize, Deserialize)]
struct SlotTableV2 {
    version: u64,
    epoch: u64,
    from: String,
    members: Vec<TableMemberV2>,
    owners: Vec<u16>,
    successors: Vec<u16>,
}

#[derive(Archive, Serialize, Deserialize)]
struct TableMemberV2 {
    id: String,
    addr: String,
    region: String,
    state: u8,
}

/// Version 3: each member's range, and the cluster version.
#[derive(Archive, Serialize, Deserialize)]
struct SlotTableV3 {
    version: u64,
    epoch: u64,
    from: String,
    members: Vec<TableMemberV3>,
    owners: Vec<u16>,
    successors: Vec<u16>,
    cluster_version: u8,
}

#[derive(Archive, Serialize, Deserialize)]
struct TableMemberV3 {
    id: String,
    addr: String,
    region: String,
    state: u8,
    /// 0..0: not known to the sender.
    min_version: u8,
    max_version: u8,
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

/// Version 12's replicate message: GCRA buckets (nearly all of them) as columns of the same
/// length, 24 bytes a bucket (a key's 96 bits as its hash and check, the arrival time, the
/// margin), where a flat [`WireBucket`] takes 96 with its unused window, limit and log fields;
/// windows and logs flat, as before.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct ReplicateMessageV12 {
    pub from: String,
    pub handoff: Option<HandoffPart>,
    /// The low 64 bits of each key (`BucketKey::to_u128`).
    pub gcra_key_hashes: Vec<u64>,
    /// The next 32 bits of each key.
    pub gcra_key_checks: Vec<u32>,
    pub gcra_tats_ns: Vec<u64>,
    pub gcra_margins_ms: Vec<u32>,
    /// Windows and logs.
    pub others: Vec<WireBucket>,
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
                // The newest a receiver takes (more, from other regions' units, are dropped
                // oldest first rather than refused with the message).
                times_ns: times_ns[times_ns
                    .len()
                    .saturating_sub(SlidingLog::most_entries(limit))..]
                    .to_vec(),
                ..with_limit(limit)
            },
        }
    }
}

/// Latest GCRA arrival time a peer may send. A store's TATs are at most `now` plus two
/// capacities (an empty bucket and one owed; a capacity is at most `u64::MAX / 4`), and the
/// Unix-epoch `now` stays below `u64::MAX / 4` until 2116, so every real TAT fits. A larger one
/// can only come from a broken or hostile peer, and is refused before it reaches the store.
/// (The store clamps a debt to two capacities before it adds a cost, so no arrival time can
/// push its arithmetic past `u64::MAX`; this bound keeps received state plausible.)
pub const MAX_WIRE_TAT_NS: u64 = u64::MAX / 4 * 3;

/// Validates one received bucket: a known algorithm, a TAT in range, a valid limit, a log no
/// longer than it.
fn bucket_from_wire(bucket: &ArchivedWireBucket) -> Result<BucketState, Refusal> {
    let key = BucketKey::from_u128(bucket.key.to_native());
    let algorithm = *Algorithm::ALL
        .get(usize::from(bucket.algorithm))
        .ok_or_else(|| malformed("bucket", format!("unknown algorithm {}", bucket.algorithm)))?;
    if algorithm == Algorithm::Gcra {
        return gcra_from_wire(
            bucket.key.to_native(),
            bucket.tat_ns.to_native(),
            bucket.margin_ms.to_native(),
        );
    }
    let limit = Limit::new(
        algorithm,
        bucket.rate.to_native(),
        bucket.period_ns.to_native(),
        bucket.burst.to_native(),
    )
    .map_err(|e| malformed("bucket", e))?;
    let value = if algorithm == Algorithm::SlidingLog {
        if bucket.times_ns.len() > SlidingLog::most_entries(&limit) {
            return Err(malformed(
                "bucket",
                "log longer than twice its limit (one limit owed)",
            ));
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
    };
    Ok(BucketState { key, value })
}

/// Validates one received GCRA bucket: its arrival time in range.
fn gcra_from_wire(key: u128, tat_ns: u64, margin_ms: u32) -> Result<BucketState, Refusal> {
    if tat_ns > MAX_WIRE_TAT_NS {
        return Err(malformed(
            "bucket",
            format!("GCRA arrival time {tat_ns} ns is later than any store reaches"),
        ));
    }
    Ok(BucketState {
        key: BucketKey::from_u128(key),
        value: BucketValue::Gcra { tat_ns, margin_ms },
    })
}

fn malformed(what: &str, e: impl std::fmt::Display) -> Refusal {
    (ErrorCode::MalformedPayload, format!("invalid {what}: {e}"))
}

/// Gossip's layout in version 2.
#[derive(Archive, Serialize, Deserialize)]
struct GossipV2 {
    members: Vec<DigestV2>,
}

#[derive(Archive, Serialize, Deserialize)]
struct DigestV2 {
    info: MemberInfo,
    incarnation: u64,
    heartbeat: u64,
    left: bool,
}

/// Version 3: each digest with its member's version range.
#[derive(Archive, Serialize, Deserialize)]
struct GossipV3 {
    members: Vec<DigestV3>,
}

#[derive(Archive, Serialize, Deserialize)]
struct DigestV3 {
    info: MemberInfo,
    incarnation: u64,
    heartbeat: u64,
    left: bool,
    /// 0..0: not known to the sender.
    min_version: u8,
    max_version: u8,
}

/// Version 8: each digest also says whether its member is still joining.
#[derive(Archive, Serialize, Deserialize)]
struct GossipV8 {
    members: Vec<DigestV8>,
}

#[derive(Archive, Serialize, Deserialize)]
struct DigestV8 {
    info: MemberInfo,
    incarnation: u64,
    heartbeat: u64,
    left: bool,
    /// 0..0: not known to the sender.
    min_version: u8,
    max_version: u8,
    joining: bool,
}

/// A range as layouts from version 3 carry it: `0..0` for one the sender does not know.
fn range_to_wire(range: Option<VersionRange>) -> (u8, u8) {
    range.map_or((0, 0), |r| (r.min, r.max))
}

fn range_from_wire(what: &str, min: u8, max: u8) -> Result<Option<VersionRange>, Refusal> {
    match (min, max) {
        (0, 0) => Ok(None),
        _ => VersionRange::new(min, max)
            .filter(|r| r.min >= BASE_LAYOUT)
            .map(Some)
            .ok_or_else(|| malformed(what, format!("version range {min}..{max}"))),
    }
}

/// Appends `gossip` as a frame for a peer speaking `version`: with ranges from version 3, in
/// version 2's layout (ranges left out) for a peer that speaks only that.
pub fn encode_gossip(out: &mut Vec<u8>, version: u8, gossip: &Gossip) {
    if Feature::SettledJoins.readable_at(version) {
        let message = GossipV8 {
            members: gossip
                .members
                .iter()
                .map(|d| {
                    let (min_version, max_version) = range_to_wire(d.versions);
                    DigestV8 {
                        info: d.info.clone(),
                        incarnation: d.incarnation,
                        heartbeat: d.heartbeat,
                        left: d.left,
                        min_version,
                        max_version,
                        joining: d.joining,
                    }
                })
                .collect(),
        };
        let layout = FrameKind::Gossip.layout_at(version);
        encode_message_at(out, layout, FrameKind::Gossip, 0, &message);
    } else if Feature::MemberVersions.readable_at(version) {
        let message = GossipV3 {
            members: gossip
                .members
                .iter()
                .map(|d| {
                    let (min_version, max_version) = range_to_wire(d.versions);
                    DigestV3 {
                        info: d.info.clone(),
                        incarnation: d.incarnation,
                        heartbeat: d.heartbeat,
                        left: d.left,
                        min_version,
                        max_version,
                    }
                })
                .collect(),
        };
        let layout = FrameKind::Gossip.layout_at(version);
        encode_message_at(out, layout, FrameKind::Gossip, 0, &message);
    } else {
        let message = GossipV2 {
            members: gossip
                .members
                .iter()
                .map(|d| DigestV2 {
                    info: d.info.clone(),
                    incarnation: d.incarnation,
                    heartbeat: d.heartbeat,
                    left: d.left,
                })
                .collect(),
        };
        encode_message_at(out, BASE_LAYOUT, FrameKind::Gossip, 0, &message);
    }
}

/// Validates and converts a gossip payload of the layout of version `layout` (the frame's):
/// at most [`MAX_GOSSIP_DIGESTS`] digests, each with an id and an address of 1 to
/// [`MAX_MEMBER_FIELD_BYTES`] and a valid region name. Honest nodes pass on what they were
/// told, so one oversized field let in would travel in every node's gossip.
pub fn decode_gossip(layout: u8, payload: &[u8]) -> Result<Gossip, Refusal> {
    let members = if Feature::SettledJoins.readable_at(layout) {
        let archived = access_validated::<ArchivedGossipV8>(payload, "gossip message")?;
        digest_count(archived.members.len())?;
        archived
            .members
            .iter()
            .enumerate()
            .map(|(i, d)| {
                Ok(MemberDigest {
                    versions: range_from_wire("gossip", d.min_version, d.max_version)?,
                    joining: d.joining,
                    ..digest(
                        i,
                        &d.info,
                        d.incarnation.to_native(),
                        d.heartbeat.to_native(),
                        d.left,
                    )?
                })
            })
            .collect::<Result<_, Refusal>>()?
    } else if Feature::MemberVersions.readable_at(layout) {
        let archived = access_validated::<ArchivedGossipV3>(payload, "gossip message")?;
        digest_count(archived.members.len())?;
        archived
            .members
            .iter()
            .enumerate()
            .map(|(i, d)| {
                Ok(MemberDigest {
                    versions: range_from_wire("gossip", d.min_version, d.max_version)?,
                    ..digest(
                        i,
                        &d.info,
                        d.incarnation.to_native(),
                        d.heartbeat.to_native(),
                        d.left,
                    )?
                })
            })
            .collect::<Result<_, Refusal>>()?
    } else {
        let archived = access_validated::<ArchivedGossipV2>(payload, "gossip message")?;
        digest_count(archived.members.len())?;
        archived
            .members
            .iter()
            .enumerate()
            .map(|(i, d)| {
                digest(
                    i,
                    &d.info,
                    d.incarnation.to_native(),
                    d.heartbeat.to_native(),
                    d.left,
                )
            })
            .collect::<Result<_, Refusal>>()?
    };
    Ok(Gossip { members })
}

fn digest_count(digests: usize) -> Result<(), Refusal> {
    if digests > MAX_GOSSIP_DIGESTS {
        return Err(malformed(
            "gossip",
            format!(
                "{digests} digests (at most {MAX_GOSSIP_DIGESTS}, the most members a node tracks)"
            ),
        ));
    }
    Ok(())
}

/// Digest `index`, without a version range (version 2's layout has none), its fields checked
/// before anything is copied.
fn digest(
    index: usize,
    info: &crate::cluster::membership::ArchivedMemberInfo,
    incarnation: u64,
    heartbeat: u64,
    left: bool,
) -> Result<MemberDigest, Refusal> {
    for (field, value) in [("id", info.id.as_str()), ("address", info.addr.as_str())] {
        if value.is_empty() || value.len() > MAX_MEMBER_FIELD_BYTES {
            return Err(malformed(
                "gossip",
                format!(
                    "digest {index}: {field} of {} bytes (1 to {MAX_MEMBER_FIELD_BYTES})",
                    value.len()
                ),
            ));
        }
    }
    crate::region::RegionName::new(info.region.as_str())
        .map_err(|e| malformed("gossip", format!("digest {index}: {e}")))?;
    let info =
        rkyv::deserialize::<MemberInfo, rancor::Error>(info).map_err(|e| malformed("gossip", e))?;
    Ok(MemberDigest {
        info,
        incarnation,
        heartbeat,
        left,
        versions: None,
        joining: false,
    })
}

/// Longest id or address an id conflict or a gossip digest may name, in bytes.
pub const MAX_MEMBER_FIELD_BYTES: usize = 256;

/// Most digests one gossip message may carry: a membership tracks at most this many members
/// (`MembershipConfig::max_members`) and gossips each once.
pub const MAX_GOSSIP_DIGESTS: usize = crate::cluster::membership::MAX_MEMBERS;

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

/// Appends `buckets` as one replicate frame in the layout an end speaking `version` reads
/// (see [`FrameKind::layout_at`]).
pub fn encode_replicate(
    out: &mut Vec<u8>,
    version: u8,
    from: &str,
    handoff: Option<HandoffPart>,
    buckets: &[BucketState],
) {
    let layout = FrameKind::Replicate.layout_at(version);
    if !Feature::CompactReplicas.readable_at(layout) {
        let message = ReplicateMessage {
            from: from.to_owned(),
            handoff,
            buckets: buckets.iter().map(WireBucket::from).collect(),
        };
        return encode_message_at(out, layout, FrameKind::Replicate, 0, &message);
    }
    let gcra = buckets
        .iter()
        .filter(|b| matches!(b.value, BucketValue::Gcra { .. }))
        .count();
    let mut message = ReplicateMessageV12 {
        from: from.to_owned(),
        handoff,
        gcra_key_hashes: Vec::with_capacity(gcra),
        gcra_key_checks: Vec::with_capacity(gcra),
        gcra_tats_ns: Vec::with_capacity(gcra),
        gcra_margins_ms: Vec::with_capacity(gcra),
        others: Vec::new(),
    };
    for bucket in buckets {
        match bucket.value {
            BucketValue::Gcra { tat_ns, margin_ms } => {
                let key = bucket.key.to_u128();
                // Truncations intended: a key is 96 bits, its hash the low 64.
                message.gcra_key_hashes.push(key as u64);
                message.gcra_key_checks.push((key >> 64) as u32);
                message.gcra_tats_ns.push(tat_ns);
                message.gcra_margins_ms.push(margin_ms);
            }
            _ => message.others.push(WireBucket::from(bucket)),
        }
    }
    encode_message_at(out, layout, FrameKind::Replicate, 0, &message);
}

/// Bytes `bucket` takes in a replicate frame of `version`'s layout, at most: for cutting a
/// round's buckets into frames under the receiver's frame limit.
pub fn replicated_bytes(version: u8, bucket: &BucketState) -> usize {
    let compact = Feature::CompactReplicas.readable_at(FrameKind::Replicate.layout_at(version));
    match &bucket.value {
        // An entry in each of the four columns.
        BucketValue::Gcra { .. } if compact => 24,
        // A flat WireBucket archives to under 128 bytes, plus 8 per log entry.
        BucketValue::Log { times_ns, .. } => 128 + 8 * times_ns.len(),
        _ => 128,
    }
}

/// Validates a replication payload of layout `layout` (the frame's version byte).
pub fn decode_replicate(layout: u8, payload: &[u8]) -> Result<Replicated, Refusal> {
    if Feature::CompactReplicas.readable_at(layout) {
        return decode_replicate_v12(payload);
    }
    let message = access_validated::<ArchivedReplicateMessage>(payload, "replication message")?;
    Ok(Replicated {
        from: message.from.as_str().to_owned(),
        handoff: handoff_from_wire(message.handoff.as_ref())?,
        buckets: message
            .buckets
            .iter()
            .map(bucket_from_wire)
            .collect::<Result<_, _>>()?,
    })
}

fn decode_replicate_v12(payload: &[u8]) -> Result<Replicated, Refusal> {
    let message = access_validated::<ArchivedReplicateMessageV12>(payload, "replication message")?;
    let gcra = message.gcra_key_hashes.len();
    let lengths = [
        message.gcra_key_checks.len(),
        message.gcra_tats_ns.len(),
        message.gcra_margins_ms.len(),
    ];
    if lengths.iter().any(|&len| len != gcra) {
        return Err(malformed(
            "replication",
            format!("GCRA columns of {gcra} key hashes and {lengths:?} checks, times, margins"),
        ));
    }
    let mut buckets = Vec::with_capacity(gcra + message.others.len());
    for i in 0..gcra {
        let key = u128::from(message.gcra_key_hashes[i].to_native())
            | (u128::from(message.gcra_key_checks[i].to_native()) << 64);
        buckets.push(gcra_from_wire(
            key,
            message.gcra_tats_ns[i].to_native(),
            message.gcra_margins_ms[i].to_native(),
        )?);
    }
    for bucket in message.others.iter() {
        buckets.push(bucket_from_wire(bucket)?);
    }
    Ok(Replicated {
        from: message.from.as_str().to_owned(),
        handoff: handoff_from_wire(message.handoff.as_ref())?,
        buckets,
    })
}

/// A received hand-off part, its part number and slots in range.
fn handoff_from_wire(
    handoff: Option<&ArchivedHandoffPart>,
) -> Result<Option<HandoffPart>, Refusal> {
    let handoff = handoff.map(|h| HandoffPart {
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
    Ok(handoff)
}

/// Appends `table` as a frame for a client speaking `version`: with ranges and the cluster
/// version from version 3, in version 2's layout otherwise.
pub fn encode_slot_table(
    out: &mut Vec<u8>,
    version: u8,
    request_id: u64,
    table: &SlotTableMessage,
) {
    let (layout, payload) = slot_table_payload(version, table);
    encode_frame_at(out, layout, FrameKind::SlotTable, request_id, &payload);
}

/// `table`'s payload for a client speaking `version`, and the version of its layout (the
/// frame's version byte): for a node that encodes a table once and sends it many times.
pub fn slot_table_payload(version: u8, table: &SlotTableMessage) -> (u8, AlignedVec) {
    // Serializing plain vectors into memory cannot fail; an empty payload would be refused by
    // the receiver's validation, never misread.
    if Feature::MemberVersions.readable_at(version) {
        let message = SlotTableV3 {
            version: table.version,
            epoch: table.epoch,
            from: table.from.clone(),
            members: table
                .members
                .iter()
                .map(|m| {
                    let (min_version, max_version) = range_to_wire(m.versions);
                    TableMemberV3 {
                        id: m.id.clone(),
                        addr: m.addr.clone(),
                        region: m.region.clone(),
                        state: m.state,
                        min_version,
                        max_version,
                    }
                })
                .collect(),
            owners: table.owners.clone(),
            successors: table.successors.clone(),
            cluster_version: table.cluster_version,
        };
        let payload = rkyv::to_bytes::<rancor::Error>(&message).unwrap_or_default();
        (FrameKind::SlotTable.layout_at(version), payload)
    } else {
        let message = SlotTableV2 {
            version: table.version,
            epoch: table.epoch,
            from: table.from.clone(),
            members: table
                .members
                .iter()
                .map(|m| TableMemberV2 {
                    id: m.id.clone(),
                    addr: m.addr.clone(),
                    region: m.region.clone(),
                    state: m.state,
                })
                .collect(),
            owners: table.owners.clone(),
            successors: table.successors.clone(),
        };
        let payload = rkyv::to_bytes::<rancor::Error>(&message).unwrap_or_default();
        (BASE_LAYOUT, payload)
    }
}

/// Validates a slot table payload of the layout of version `layout` (client side) and checks
/// its shape.
pub fn decode_slot_table(layout: u8, payload: &[u8]) -> Result<SlotTableMessage, Refusal> {
    let table = if Feature::MemberVersions.readable_at(layout) {
        let t = access_validated::<ArchivedSlotTableV3>(payload, "slot table")?;
        SlotTableMessage {
            version: t.version.to_native(),
            epoch: t.epoch.to_native(),
            from: t.from.as_str().to_owned(),
            members: t
                .members
                .iter()
                .map(|m| {
                    Ok(TableMember {
                        id: m.id.as_str().to_owned(),
                        addr: m.addr.as_str().to_owned(),
                        region: m.region.as_str().to_owned(),
                        state: m.state,
                        versions: range_from_wire("slot table", m.min_version, m.max_version)?,
                    })
                })
                .collect::<Result<_, Refusal>>()?,
            owners: t.owners.iter().map(|o| o.to_native()).collect(),
            successors: t.successors.iter().map(|o| o.to_native()).collect(),
            cluster_version: t.cluster_version,
        }
    } else {
        let t = access_validated::<ArchivedSlotTableV2>(payload, "slot table")?;
        SlotTableMessage {
            version: t.version.to_native(),
            epoch: t.epoch.to_native(),
            from: t.from.as_str().to_owned(),
            members: t
                .members
                .iter()
                .map(|m| TableMember {
                    id: m.id.as_str().to_owned(),
                    addr: m.addr.as_str().to_owned(),
                    region: m.region.as_str().to_owned(),
                    state: m.state,
                    versions: None,
                })
                .collect(),
            owners: t.owners.iter().map(|o| o.to_native()).collect(),
            successors: t.successors.iter().map(|o| o.to_native()).collect(),
            cluster_version: BASE_LAYOUT,
        }
    };
    // A node tracks at most this many members, and a client dials each one a table lists.
    if table.members.len() > crate::cluster::membership::MAX_MEMBERS {
        return Err((
            ErrorCode::MalformedPayload,
            format!(
                "slot table with {} members; a cluster has at most {}",
                table.members.len(),
                crate::cluster::membership::MAX_MEMBERS
            ),
        ));
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::FrameReader;

    fn gossip() -> Gossip {
        let member = |id: &str, versions| MemberDigest {
            info: MemberInfo {
                id: id.into(),
                addr: format!("127.0.0.1:{}", 7000 + id.len()),
                region: "eu".into(),
            },
            incarnation: 5,
            heartbeat: 9,
            left: false,
            versions,
            joining: false,
        };
        Gossip {
            members: vec![
                member("new", VersionRange::new(2, 3)),
                member("unknown", None),
            ],
        }
    }

    fn read_back(bytes: &[u8]) -> crate::wire::Frame {
        let mut reader = FrameReader::new(1 << 20);
        reader.extend(bytes);
        reader.next_frame().unwrap().unwrap()
    }

    #[test]
    fn gossip_keeps_ranges_from_version_3_and_leaves_them_out_for_version_2() {
        let mut bytes = Vec::new();
        encode_gossip(&mut bytes, 3, &gossip());
        let frame = read_back(&bytes);
        assert_eq!(frame.version, 3);
        assert_eq!(decode_gossip(frame.version, &frame.payload), Ok(gossip()));

        let mut bytes = Vec::new();
        encode_gossip(&mut bytes, 2, &gossip());
        let frame = read_back(&bytes);
        assert_eq!(frame.version, 2);
        let decoded = decode_gossip(frame.version, &frame.payload).unwrap();
        assert!(decoded.members.iter().all(|d| d.versions.is_none()));
        assert_eq!(decoded.members[0].info, gossip().members[0].info);
    }

    #[test]
    fn a_range_upside_down_or_below_version_2_is_refused() {
        for (min, max) in [(3, 2), (1, 3), (0, 3)] {
            let message = GossipV3 {
                members: vec![DigestV3 {
                    info: gossip().members[0].info.clone(),
                    incarnation: 1,
                    heartbeat: 1,
                    left: false,
                    min_version: min,
                    max_version: max,
                }],
            };
            let payload = rkyv::to_bytes::<rancor::Error>(&message).unwrap();
            let refused = decode_gossip(3, &payload).unwrap_err();
            assert_eq!(refused.0, ErrorCode::MalformedPayload, "{min}..{max}");
        }
    }

    /// `gossip` as a payload of each layout.
    fn payloads(gossip: &Gossip) -> Vec<(u8, Vec<u8>)> {
        [2, 3]
            .into_iter()
            .map(|version| {
                let mut bytes = Vec::new();
                encode_gossip(&mut bytes, version, gossip);
                let frame = read_back(&bytes);
                (frame.version, frame.payload.to_vec())
            })
            .collect()
    }

    /// A peer's digest naming a field it should not: refused whole in both layouts, in words
    /// that name the digest and the field.
    #[test]
    fn a_digest_with_an_oversized_empty_or_invalid_field_is_refused() {
        let long = "x".repeat(MAX_MEMBER_FIELD_BYTES + 1);
        let huge = "x".repeat(900_000);
        type Set = fn(&mut MemberInfo, &str);
        let cases: [(&str, Set, &str); 9] = [
            ("id", |i, v| i.id = v.into(), ""),
            ("id", |i, v| i.id = v.into(), &long),
            ("id", |i, v| i.id = v.into(), &huge),
            ("address", |i, v| i.addr = v.into(), ""),
            ("address", |i, v| i.addr = v.into(), &long),
            ("region", |i, v| i.region = v.into(), ""),
            ("region", |i, v| i.region = v.into(), &long),
            ("region", |i, v| i.region = v.into(), "eu west"),
            ("region", |i, v| i.region = v.into(), "-eu"),
        ];
        for (field, set, value) in cases {
            let mut gossip = gossip();
            set(&mut gossip.members[1].info, value);
            for (layout, payload) in payloads(&gossip) {
                let Err((code, message)) = decode_gossip(layout, &payload) else {
                    panic!("a digest with a {field} of {} bytes was taken", value.len());
                };
                assert_eq!(code, ErrorCode::MalformedPayload, "{field} {}", value.len());
                assert!(
                    message.contains("digest 1") && message.contains(field),
                    "{message}"
                );
                assert!(message.len() < 300, "bounded: {message}");
            }
        }
    }

    #[test]
    fn gossip_naming_more_members_than_a_membership_tracks_is_refused() {
        let members = |n: usize| Gossip {
            members: (0..n)
                .map(|i| MemberDigest {
                    info: MemberInfo {
                        id: format!("node-{i}"),
                        addr: format!("10.0.{}.{}:7100", i / 256, i % 256),
                        region: "eu".into(),
                    },
                    incarnation: 1,
                    heartbeat: 1,
                    left: false,
                    versions: None,
                    joining: false,
                })
                .collect(),
        };
        for (layout, payload) in payloads(&members(MAX_GOSSIP_DIGESTS)) {
            assert_eq!(
                decode_gossip(layout, &payload).map(|g| g.members.len()),
                Ok(MAX_GOSSIP_DIGESTS)
            );
        }
        for (layout, payload) in payloads(&members(MAX_GOSSIP_DIGESTS + 1)) {
            let Err((code, message)) = decode_gossip(layout, &payload) else {
                panic!("gossip of {} digests was taken", MAX_GOSSIP_DIGESTS + 1);
            };
            assert_eq!(code, ErrorCode::MalformedPayload);
            assert!(message.contains("1025 digests"), "{message}");
        }
        assert!(
            crate::cluster::MembershipConfig::default().max_members <= MAX_GOSSIP_DIGESTS,
            "a membership gossips every member it tracks"
        );
    }

    /// A client dials every member a table lists: a table may name no more members than a
    /// node tracks, in either layout.
    #[test]
    fn a_table_naming_more_members_than_a_membership_tracks_is_refused() {
        let most = crate::cluster::membership::MAX_MEMBERS;
        let table = |n: usize| SlotTableMessage {
            version: 7,
            epoch: 2,
            from: "node-0".into(),
            members: (0..n)
                .map(|i| TableMember {
                    id: format!("node-{i}"),
                    addr: format!("10.0.{}.{}:7100", i / 256, i % 256),
                    region: "eu".into(),
                    state: 0,
                    versions: None,
                })
                .collect(),
            owners: vec![0; SLOTS],
            successors: vec![u16::MAX; SLOTS],
            cluster_version: 2,
        };
        for layout in [2, 3] {
            let mut bytes = Vec::new();
            encode_slot_table(&mut bytes, layout, 1, &table(most));
            let frame = read_back(&bytes);
            let taken = decode_slot_table(frame.version, &frame.payload);
            assert_eq!(taken.map(|t| t.members.len()), Ok(most));

            let mut bytes = Vec::new();
            encode_slot_table(&mut bytes, layout, 1, &table(most + 1));
            let frame = read_back(&bytes);
            let Err((code, message)) = decode_slot_table(frame.version, &frame.payload) else {
                panic!("a table of {} members was taken", most + 1);
            };
            assert_eq!(code, ErrorCode::MalformedPayload);
            assert!(message.contains("1025 members"), "{message}");
        }
    }

    #[test]
    fn a_version_2_table_reads_as_a_cluster_of_version_2() {
        let table = SlotTableMessage {
            version: 7,
            epoch: 2,
            from: "a".into(),
            members: vec![TableMember {
                id: "a".into(),
                addr: "127.0.0.1:7000".into(),
                region: "eu".into(),
                state: 0,
                versions: VersionRange::new(2, 3),
            }],
            owners: vec![0; SLOTS],
            successors: vec![u16::MAX; SLOTS],
            cluster_version: 3,
        };
        let mut bytes = Vec::new();
        encode_slot_table(&mut bytes, 3, 1, &table);
        let frame = read_back(&bytes);
        assert_eq!(
            decode_slot_table(frame.version, &frame.payload),
            Ok(table.clone())
        );

        let mut bytes = Vec::new();
        encode_slot_table(&mut bytes, 2, 1, &table);
        let frame = read_back(&bytes);
        let old = decode_slot_table(frame.version, &frame.payload).unwrap();
        assert_eq!((old.cluster_version, old.members[0].versions), (2, None));
        assert_eq!(old.owners, table.owners);
    }
}
