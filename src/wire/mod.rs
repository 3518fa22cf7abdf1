//! The wire protocol between gateways (the client) and nodes: length-prefixed frames with a fixed
//! 16-byte header and an rkyv payload. Pure: bytes in, frames out; the node and client own I/O.
//!
//! ```text
//! offset  size  field
//! 0       2     magic "FG"
//! 2       1     protocol version of the payload's layout (2, or the later version that
//!               last changed the kind's layout)
//! 3       1     frame kind (FrameKind)
//! 4       4     payload length, little-endian u32 (at most the receiver's max frame bytes)
//! 8       8     request id, little-endian u64 (answers carry the id of their request)
//! 16      n     payload: an rkyv archive, validated before any field is read
//! ```
//!
//! See docs/PROTOCOL.md for the messages, error codes and what a receiver does with bad input.

mod check_batch;
mod cluster_messages;
mod decision_batch;
mod frame;
mod lease_messages;
mod messages;
mod packing;
mod policy_messages;
mod region_messages;
mod rlqs_messages;
mod rlqs_region_messages;
mod token_lease_messages;
mod unconfirmed_messages;
mod varint;

pub use check_batch::{
    ArchivedCheckBatch, ArchivedPackedBatch, CheckBatch, CheckGroups, PackError, PackedBatch,
    PackedCheck, REFUND, STARTS_GROUP, TAKEOVER, WireLimit, decode_check_batch,
    decode_check_batch_into, validate_check_batch_into,
};
pub use cluster_messages::{
    HandoffPart, MAX_GOSSIP_DIGESTS, MAX_HANDOFF_PARTS, MAX_MEMBER_FIELD_BYTES, MAX_WIRE_TAT_NS,
    ReplicateMessage, ReplicateMessageV12, Replicated, SlotTableMessage, TableMember, WireBucket,
    decode_gossip, decode_id_conflict, decode_replicate, decode_slot_table, encode_gossip,
    encode_replicate, encode_slot_table, member_state_from_wire, member_state_to_wire,
    replicated_bytes, slot_table_payload,
};
pub use decision_batch::{
    ArchivedDecisionBatch, ArchivedPackedDecisions, DecisionBatch, PackedDecisions, WireDecision,
    decode_decision_batch, decode_decisions, decode_decisions_into,
};
pub use frame::{
    Frame, FrameError, FrameReader, encode_frame, encode_frame_at, encode_message,
    encode_message_at,
};
pub use lease_messages::{
    ArchivedLeaseRequestBatch, LEASE_ACQUIRE, LEASE_RELEASE, LEASE_RENEW, LeaseAnswer,
    LeaseAnswerBatch, LeaseOp, LeaseRequestBatch, LeaseSync, LeaseSyncMessage,
    MAX_WIRE_LEASE_EXPIRY_NS, MAX_WIRE_LEASE_SETS, ValidLeaseRequest, WireLease, WireLeaseAnswer,
    WireLeaseRequest, WireLeaseSet, decode_lease_answers, decode_lease_requests, decode_lease_sync,
    encode_lease_answers, encode_lease_requests, encode_lease_sync, lease_set_wire_bytes,
};
pub use messages::{
    ArchivedErrorFrame, ArchivedWireCheck, ErrorFrame, ValidCheck, WireCheck, WireLimits,
    decode_error_frame,
};
pub use policy_messages::{
    MAX_POLICY_TEXT_BYTES, PolicyMessage, PolicyRequest, decode_policy_message,
    decode_policy_request,
};
pub use region_messages::{
    ArchivedScopedCheckBatch, MAX_WIRE_DELTA_AT_NS, MAX_WIRE_DELTAS, MAX_WIRE_NODE_ID_BYTES,
    RegionAckMessage, RegionAckMessageV4, RegionDeltasMessage, RegionDeltasMessageV4,
    RegionDeltasMessageV13, ScopedCheckBatch, WireDelta, WireDeltaLimit, WireScope,
    decode_region_ack, decode_region_deltas, decode_scoped_check_batch, encode_region_ack,
    encode_region_deltas,
};
pub use rlqs_messages::{
    MAX_WIRE_RLQS_BUCKET_BYTES, MAX_WIRE_RLQS_ENTRIES, MAX_WIRE_RLQS_ITEMS, RLQS_ABANDON,
    RLQS_DENY, RLQS_TOKEN_BUCKET, RlqsAssignmentBatch, RlqsReportBatch, WireRlqsAssignment,
    WireRlqsBucket, WireRlqsEntry, WireRlqsReport, decode_rlqs_assignments, decode_rlqs_reports,
};
pub use rlqs_region_messages::{
    RlqsRegionClaims, RlqsRegionParts, WireRegionClaim, WireRegionPart, decode_rlqs_region_claims,
    decode_rlqs_region_parts,
};
pub use token_lease_messages::{
    ArchivedTokenLeaseBatch, TokenLeaseAnswer, TokenLeaseAnswers, TokenLeaseBatch,
    TokenLeaseRequest, ValidTokenLease, decode_token_lease_answers, decode_token_lease_batch,
};
pub use unconfirmed_messages::{
    MAX_WIRE_UNCONFIRMED, RegionUnconfirmed, RegionUnconfirmedMessage, WireUnconfirmed,
    decode_region_unconfirmed,
};

/// First two bytes of every frame.
pub const MAGIC: [u8; 2] = *b"FG";
/// The version byte of a frame whose kind has the layout it had in version 2, the first
/// version: what every kind that no later version changed carries. Which versions a build
/// speaks, and how two ends agree on one: [`crate::protocol`].
pub const BASE_LAYOUT: u8 = 2;
/// Bytes before the payload. A multiple of 16, so a payload read into an aligned buffer right
/// after its header stays aligned for rkyv.
pub const HEADER_BYTES: usize = 16;
/// Largest UDP payload a floodgate endpoint accepts, and the ceiling of its path MTU discovery
/// (QUIC starts at 1,200 bytes and probes upward; quinn's own ceiling is 1,452). A frame of a few
/// hundred checks then takes a handful of datagrams where the path carries them (loopback,
/// jumbo-frame networks), and every datagram saved is a send, a receive and a wake-up at both
/// ends; on an ordinary 1,500-byte path the probes fail and 1,452 stays in use. Larger ceilings
/// (8,952 and 65,527) were tried on loopback: quinn then declared bursts of packets lost with
/// no drop in the kernel's counters and stalled frames for 25-80 ms, so the ceiling stays at a
/// size where that was never seen.
pub const MAX_DATAGRAM_BYTES: u16 = 4_096;
/// How many ack-eliciting packets a node and a client ask each other to receive before they
/// must acknowledge them (QUIC's ACK-frequency extension; by default QUIC acknowledges every
/// second packet). Checks are requests and answers, so acknowledgements ride on the next frame
/// anyway; under load, acknowledgement-only datagrams were about a third of all datagrams sent,
/// each a send, a receive and a wake-up at both ends. A node dialing a peer asks nothing: with
/// that direction on too, a cluster test of crash takeover turned flaky.
pub const ACK_ELICITING_THRESHOLD: u32 = 8;
/// The longest an acknowledgement may be held back under [`ACK_ELICITING_THRESHOLD`] (QUIC's
/// default is 25 ms). Short, because the sender's probe timeout waits for it: a lost lone frame
/// is sent again within a few milliseconds, inside a gateway's usual call timeout.
pub const MAX_ACK_DELAY: std::time::Duration = std::time::Duration::from_millis(2);

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// Client → node: a [`CheckBatch`].
    CheckBatch = 1,
    /// Node → client: a [`DecisionBatch`], one decision per check, in order.
    DecisionBatch = 2,
    /// Either way: an [`ErrorFrame`] about the request with the same id (0: the stream).
    Error = 3,
    /// Node → node: a membership [`crate::cluster::Gossip`] message.
    Gossip = 4,
    /// Client → node: asks for the node's slot table (empty payload).
    TableRequest = 5,
    /// Node → client: the node's slot table and members.
    SlotTable = 6,
    /// Node → node: bucket states replicated to a successor or handed over to a new owner.
    Replicate = 7,
    /// Client → node: asks for the node's current rules (payload: the version the client has).
    PolicyRequest = 8,
    /// Node → client: the rules in force (version and text).
    Policy = 9,
    /// Node → node: a check batch forwarded by a node that does not own its slots; decided
    /// where it lands, never forwarded again.
    ForwardedCheckBatch = 10,
    /// Node → node: an [`crate::cluster::IdConflict`]: the receiver gossiped an id another
    /// live node holds at another address.
    IdConflict = 11,
    /// Client → node: a [`ScopedCheckBatch`], a check batch with each check's scope (region,
    /// global, home). Kind 1 stays the batch of `region` checks.
    ScopedCheckBatch = 12,
    /// Node → node: a [`RegionDeltasMessage`], units of global keys admitted in the sender's
    /// region for the owner of the same keys in another region.
    RegionDeltas = 13,
    /// Node → node: a [`RegionAckMessage`], which region deltas the receiver applied.
    RegionAck = 14,
    /// Client → node: a [`LeaseRequestBatch`] (acquire, release, renew concurrency leases),
    /// answered on the same stream with a [`LeaseAnswerBatch`].
    LeaseRequest = 15,
    /// Node → client: a [`LeaseAnswerBatch`], one answer per lease request, in order.
    LeaseAnswer = 16,
    /// Node → node: a [`LeaseSyncMessage`], lease sets replicated to a slot's successor or
    /// handed off to a new owner.
    LeaseSync = 17,
    /// Client → node: a [`TokenLeaseBatch`], tokens of hot keys asked for (and unused ones
    /// returned) by a gateway that decides those keys locally.
    TokenLeaseBatch = 18,
    /// Node → client: [`TokenLeaseAnswers`], what the owner granted, one per request.
    TokenLeaseAnswers = 19,
    /// Node → node, from version 4: a [`ScopedCheckBatch`] forwarded by a node that does not
    /// own its slots (a group with `global` checks, which kind 10 cannot carry); answered with
    /// a [`DecisionBatch`], never forwarded again. Sent only once every member speaks 4.
    ForwardedScopedCheckBatch = 20,
    /// Node → node, from version 7: an [`RlqsReportBatch`], the usage of RLQS buckets the
    /// receiver owns, from the node the Envoys stream to; answered with a kind 22. Sent only
    /// once every member speaks 7.
    RlqsReports = 21,
    /// Node → node, from version 7: an [`RlqsAssignmentBatch`], a bucket owner's assignments
    /// for the receiver's Envoys: the answer to a kind 21, or sent one-way when another
    /// Envoy's report moved their shares.
    RlqsAssignments = 22,
    /// Node → node, from version 8: [`RlqsRegionClaims`], a region owner's demand and claim
    /// for `scope: global` RLQS buckets the receiver decides the split of; answered with a
    /// kind 24. Sent only once every member speaks 8.
    RlqsRegionClaims = 23,
    /// Node → node, from version 8: [`RlqsRegionParts`], each claimed bucket's part of its
    /// limit for the asking region: the answer to a kind 23.
    RlqsRegionParts = 24,
    /// Node → node of one region, from version 11: a [`RegionUnconfirmedMessage`], the units
    /// of global keys other regions had not confirmed when the sender handed their slots to
    /// the receiver, sent before the hand-off's buckets. Sent only once every member speaks 11.
    RegionUnconfirmed = 25,
}

impl FrameKind {
    pub fn from_u8(byte: u8) -> Option<Self> {
        match byte {
            1 => Some(FrameKind::CheckBatch),
            2 => Some(FrameKind::DecisionBatch),
            3 => Some(FrameKind::Error),
            4 => Some(FrameKind::Gossip),
            5 => Some(FrameKind::TableRequest),
            6 => Some(FrameKind::SlotTable),
            7 => Some(FrameKind::Replicate),
            8 => Some(FrameKind::PolicyRequest),
            9 => Some(FrameKind::Policy),
            10 => Some(FrameKind::ForwardedCheckBatch),
            11 => Some(FrameKind::IdConflict),
            12 => Some(FrameKind::ScopedCheckBatch),
            13 => Some(FrameKind::RegionDeltas),
            14 => Some(FrameKind::RegionAck),
            15 => Some(FrameKind::LeaseRequest),
            16 => Some(FrameKind::LeaseAnswer),
            17 => Some(FrameKind::LeaseSync),
            18 => Some(FrameKind::TokenLeaseBatch),
            19 => Some(FrameKind::TokenLeaseAnswers),
            20 => Some(FrameKind::ForwardedScopedCheckBatch),
            21 => Some(FrameKind::RlqsReports),
            22 => Some(FrameKind::RlqsAssignments),
            23 => Some(FrameKind::RlqsRegionClaims),
            24 => Some(FrameKind::RlqsRegionParts),
            25 => Some(FrameKind::RegionUnconfirmed),
            _ => None,
        }
    }

    /// The version whose layout this kind has for an end speaking `version`: the frame's
    /// version byte. Every kind keeps version 2's layout until a version changes it; every
    /// change is listed here (and pinned in `tests/golden/wire_frames_vN.txt`).
    pub fn layout_at(self, version: u8) -> u8 {
        let member_versions = crate::protocol::Feature::MemberVersions;
        let region_resync = crate::protocol::Feature::RegionResync;
        let settled_joins = crate::protocol::Feature::SettledJoins;
        let wide_lease_ids = crate::protocol::Feature::WideLeaseIds;
        let compact_replicas = crate::protocol::Feature::CompactReplicas;
        let compact_deltas = crate::protocol::Feature::CompactDeltas;
        match self {
            FrameKind::RegionDeltas if compact_deltas.readable_at(version) => {
                compact_deltas.since()
            }
            FrameKind::Replicate if compact_replicas.readable_at(version) => {
                compact_replicas.since()
            }
            FrameKind::LeaseRequest | FrameKind::LeaseAnswer | FrameKind::LeaseSync
                if wide_lease_ids.readable_at(version) =>
            {
                wide_lease_ids.since()
            }
            FrameKind::Gossip if settled_joins.readable_at(version) => settled_joins.since(),
            FrameKind::Gossip | FrameKind::SlotTable if member_versions.readable_at(version) => {
                member_versions.since()
            }
            FrameKind::RegionDeltas | FrameKind::RegionAck
                if region_resync.readable_at(version) =>
            {
                region_resync.since()
            }
            _ => BASE_LAYOUT,
        }
    }

    /// True for the kinds only another node may send (gossip, replication, forwarded checks,
    /// id conflicts, region deltas and their acknowledgements, lease syncs, RLQS relays): the receiver
    /// closes a connection without a peer certificate that sends one, with
    /// [`ErrorCode::Forbidden`]. Every kind must decide here.
    pub fn peer_only(self) -> bool {
        match self {
            FrameKind::Gossip
            | FrameKind::Replicate
            | FrameKind::ForwardedCheckBatch
            | FrameKind::IdConflict
            | FrameKind::RegionDeltas
            | FrameKind::RegionAck
            | FrameKind::LeaseSync
            | FrameKind::ForwardedScopedCheckBatch
            | FrameKind::RlqsReports
            | FrameKind::RlqsAssignments
            | FrameKind::RlqsRegionClaims
            | FrameKind::RlqsRegionParts
            | FrameKind::RegionUnconfirmed => true,
            FrameKind::CheckBatch
            | FrameKind::DecisionBatch
            | FrameKind::Error
            | FrameKind::TableRequest
            | FrameKind::SlotTable
            | FrameKind::PolicyRequest
            | FrameKind::Policy
            | FrameKind::ScopedCheckBatch
            | FrameKind::LeaseRequest
            | FrameKind::LeaseAnswer
            | FrameKind::TokenLeaseBatch
            | FrameKind::TokenLeaseAnswers => false,
        }
    }
}

/// Error codes, carried in error frames, per-check error decisions, and as the QUIC application
/// error code when a stream or connection is closed. Stable: never renumber.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ErrorCode {
    /// The frame did not start with "FG": the stream is out of sync. Stream closed.
    BadMagic = 1,
    /// The header's protocol version is not one this node speaks. Stream closed.
    UnsupportedVersion = 2,
    /// The length prefix exceeds the receiver's max frame bytes. Stream closed.
    FrameTooLarge = 3,
    /// The payload failed rkyv validation or is not the message its kind says. Frame refused.
    MalformedPayload = 4,
    /// A key is longer than the node's max key bytes. Frame refused.
    KeyTooLong = 5,
    /// More checks in one frame than the node's max batch. Frame refused.
    BatchTooLarge = 6,
    /// A check's limit is invalid (zero rate, unknown algorithm, ...) or past the receiver's caps
    /// (`WireLimits`: longest period, largest sliding log). Frame refused.
    InvalidLimit = 7,
    /// A frame kind this receiver does not accept. Frame refused.
    UnknownKind = 8,
    /// The node's bucket store is full of denying keys; this check was not tracked.
    StoreFull = 9,
    /// The node is shutting down; retry on another node. Stream or connection closed.
    ShuttingDown = 10,
    /// The stream ended in the middle of a frame. Stream closed.
    Truncated = 11,
    /// Too many connections or streams. Connection refused or closed.
    Overloaded = 12,
    /// Nothing was decided: this node will not decide it. To a forwarder: a forwarded check for
    /// a slot this node has handed to another owner, sent after this node left, or sent under a
    /// table this node had before (the sender is behind); the forwarder places the check again
    /// once its slot table has caught up. To a client: a group of a kind 12 batch this node
    /// does not own, a `home` check whose home region did not answer, or a lease (kind 15) or
    /// token lease (kind 18) request for a slot this node does not decide.
    NotOwner = 13,
    /// A frame kind only peers may send ([`FrameKind::peer_only`]: gossip, replicate, forwarded
    /// checks, id conflicts, region deltas and acks, lease syncs) from a connection without a
    /// peer certificate. Nothing decoded; connection closed.
    Forbidden = 14,
    /// Per check, from version 4: nobody could decide this check at once without risking a
    /// second decider (its slot's state is on its way from the previous owner, or its owner is
    /// alive but did not answer a forward in time). Nothing was decided; the caller may send
    /// the check again shortly, and the node is not failing. A connection of an older version
    /// gets `ShuttingDown` instead.
    TryAgain = 15,
    /// Per charge, from version 6: the charge was sent on to its owner and no answer came, so
    /// it may or may not have been taken. Not to be sent again (it would count twice); only
    /// charges get it, and only callers of version 6 send charges.
    OutcomeUnknown = 16,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 16] = [
        ErrorCode::BadMagic,
        ErrorCode::UnsupportedVersion,
        ErrorCode::FrameTooLarge,
        ErrorCode::MalformedPayload,
        ErrorCode::KeyTooLong,
        ErrorCode::BatchTooLarge,
        ErrorCode::InvalidLimit,
        ErrorCode::UnknownKind,
        ErrorCode::StoreFull,
        ErrorCode::ShuttingDown,
        ErrorCode::Truncated,
        ErrorCode::Overloaded,
        ErrorCode::NotOwner,
        ErrorCode::Forbidden,
        ErrorCode::TryAgain,
        ErrorCode::OutcomeUnknown,
    ];

    pub fn from_u16(code: u16) -> Option<Self> {
        ErrorCode::ALL.into_iter().find(|c| *c as u16 == code)
    }

    /// Short snake_case name, used in metrics labels and logs.
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::BadMagic => "bad_magic",
            ErrorCode::UnsupportedVersion => "unsupported_version",
            ErrorCode::FrameTooLarge => "frame_too_large",
            ErrorCode::MalformedPayload => "malformed_payload",
            ErrorCode::KeyTooLong => "key_too_long",
            ErrorCode::BatchTooLarge => "batch_too_large",
            ErrorCode::InvalidLimit => "invalid_limit",
            ErrorCode::UnknownKind => "unknown_kind",
            ErrorCode::StoreFull => "store_full",
            ErrorCode::ShuttingDown => "shutting_down",
            ErrorCode::Truncated => "truncated",
            ErrorCode::Overloaded => "overloaded",
            ErrorCode::NotOwner => "not_owner",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::TryAgain => "try_again",
            ErrorCode::OutcomeUnknown => "outcome_unknown",
        }
    }

    /// True when the stream cannot continue after this error (framing is lost).
    pub fn closes_stream(self) -> bool {
        matches!(
            self,
            ErrorCode::BadMagic
                | ErrorCode::UnsupportedVersion
                | ErrorCode::FrameTooLarge
                | ErrorCode::Truncated
                | ErrorCode::ShuttingDown
        )
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), *self as u16)
    }
}
