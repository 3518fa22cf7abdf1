//! The body of every fuzz target: a plain function of the input bytes that must never panic and
//! asserts what the decoder promises (bounds, round trips). The libFuzzer targets call these; the
//! core's `tests/fuzz_corpus.rs` runs them over the saved corpora on stable.
//!
//! Only `floodgate`, `rkyv` and `std` may be used here: the same file is compiled into the core's
//! test tree, where nothing else is available.

use std::net::{IpAddr, SocketAddr};
use std::sync::OnceLock;

use floodgate::cluster::{MemberInfo, Membership, MembershipConfig, SLOTS};
use floodgate::limit::format_period;
use floodgate::policy::pattern::{PathPattern, normalize_path};
use floodgate::policy::{
    KEY_SEPARATOR, MAX_KEY_BYTES, MAX_WAIT_NS, PlannedCheck, Policy, RequestAttributes, client_ip,
};
use floodgate::priority::Priority;
use floodgate::resp::{Parsed, RespLimits, parse_command};
use floodgate::rls::{
    DescriptorRequest, MAX_ENTRIES, NEGATIVE_HITS_OFF, PlanOptions, Planned, RequestView,
    RlsConfig, Unread, plan_request, read_request,
};
use floodgate::store::snapshot::{
    SNAPSHOT_HEADER_BYTES, SNAPSHOT_TRAILER_BYTES, SnapshotError, decode_snapshot,
    decode_snapshot_limited, encode_snapshot, is_live, is_long_period,
};
use floodgate::wire::{
    BASE_LAYOUT, CheckBatch, CheckGroups, DecisionBatch, ErrorCode, ErrorFrame, FrameKind,
    FrameReader, HEADER_BYTES, MAX_HANDOFF_PARTS, MAX_POLICY_TEXT_BYTES, RegionAckMessage,
    WireDecision, WireLimits, decode_check_batch, decode_decisions, decode_error_frame,
    decode_gossip, decode_id_conflict, decode_lease_answers, decode_lease_requests,
    decode_lease_sync, decode_policy_message, decode_policy_request, decode_region_ack,
    decode_region_deltas, decode_replicate, decode_scoped_check_batch, decode_slot_table,
    encode_frame, encode_gossip, encode_message, encode_region_deltas, encode_replicate,
    encode_slot_table,
};
use floodgate::{
    Algorithm, BucketCheck, BucketKey, BucketState, BucketStore, BucketValue, Clock, Decision,
    FakeClock, Limit, MAX_PERIOD_NS, NANOS_PER_SEC, StoreConfig, parse_duration_ns, parse_rate,
};
use rkyv::rancor;
use rkyv::util::AlignedVec;

/// What a body did with its input. Both are fine; a panic is the bug.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The decoder took the input as valid (and every invariant held).
    Accepted,
    /// The decoder refused the input with an error.
    Refused,
}

/// A fuzz target: its name (that of `fuzz_targets/NAME.rs` and `corpus/NAME/`) and its body.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    pub name: &'static str,
    pub run: fn(&[u8]) -> Outcome,
}

/// Every target (`make fuzz` runs them in the order of `fuzz/Cargo.toml`).
pub const TARGETS: &[Target] = &[
    Target {
        name: "frame_reader",
        run: frame_reader,
    },
    Target {
        name: "check_batch",
        run: check_batch,
    },
    Target {
        name: "check_batch_decide",
        run: check_batch_decide,
    },
    Target {
        name: "decision_batch",
        run: decision_batch,
    },
    Target {
        name: "error_frame",
        run: error_frame,
    },
    Target {
        name: "gossip",
        run: gossip,
    },
    Target {
        name: "slot_table",
        run: slot_table,
    },
    Target {
        name: "replicate",
        run: replicate,
    },
    Target {
        name: "replicate_merge",
        run: replicate_merge,
    },
    Target {
        name: "policy_request",
        run: policy_request,
    },
    Target {
        name: "policy_message",
        run: policy_message,
    },
    Target {
        name: "rules_yaml",
        run: rules_yaml,
    },
    Target {
        name: "rate_text",
        run: rate_text,
    },
    Target {
        name: "request",
        run: request,
    },
    Target {
        name: "snapshot",
        run: snapshot,
    },
    Target {
        name: "snapshot_merge",
        run: snapshot_merge,
    },
    Target {
        name: "region_messages",
        run: region_messages,
    },
    Target {
        name: "resp_command",
        run: resp_command,
    },
    Target {
        name: "rls_request",
        run: rls_request,
    },
];

/// The body of the target called `name`.
pub fn target(name: &str) -> Option<Target> {
    TARGETS.iter().copied().find(|t| t.name == name)
}

/// Largest payload the frame reader target allows: small, so `FrameTooLarge` is easy to reach.
pub const FRAME_TARGET_MAX_BYTES: usize = 512;
/// The limits the check batch target decodes with: small, so both refusals are easy to reach.
pub const CHECK_TARGET_LIMITS: WireLimits = WireLimits {
    max_batch: 16,
    max_key_bytes: 64,
    max_period_ns: 366 * 24 * 3_600 * 1_000_000_000,
    max_log_limit: 1_000,
};

fn outcome<T, E>(result: &Result<T, E>) -> Outcome {
    if result.is_ok() {
        Outcome::Accepted
    } else {
        Outcome::Refused
    }
}

/// The input copied into an aligned buffer, as `FrameReader` hands payloads to decoders.
fn aligned(data: &[u8]) -> AlignedVec {
    let mut payload = AlignedVec::with_capacity(data.len());
    payload.extend_from_slice(data);
    payload
}

/// `message` encoded as a frame of `kind` and read back by a `FrameReader`: the payload a peer
/// would decode.
pub fn reframe<T>(kind: FrameKind, message: &T) -> AlignedVec
where
    T: for<'a> rkyv::Serialize<
            rkyv::api::high::HighSerializer<
                AlignedVec,
                rkyv::ser::allocator::ArenaHandle<'a>,
                rancor::Error,
            >,
        >,
{
    let (_, payload) = read_back(|out| encode_message(out, kind, 7, message));
    payload
}

/// What a frame reader produced: a frame (kind, request id, payload) or an error (code, id).
#[derive(Debug, PartialEq, Eq)]
enum Event {
    Frame(FrameKind, u64, Vec<u8>),
    Error(ErrorCode, u64),
}

/// Takes every frame the reader has; true once the stream cannot go on.
fn drain(reader: &mut FrameReader, events: &mut Vec<Event>) -> bool {
    loop {
        match reader.next_frame() {
            Ok(Some(frame)) => {
                assert!(frame.payload.len() <= FRAME_TARGET_MAX_BYTES);
                decode_by_kind(&frame.payload, frame.kind, frame.version);
                events.push(Event::Frame(
                    frame.kind,
                    frame.request_id,
                    frame.payload.to_vec(),
                ));
            }
            Ok(None) => return false,
            Err(e) => {
                assert!(!e.message.is_empty(), "errors say what went wrong");
                events.push(Event::Error(e.code, e.request_id));
                if e.code.closes_stream() {
                    return true;
                }
                // Only an unknown kind leaves the framing intact.
                assert_eq!(e.code, ErrorCode::UnknownKind);
            }
        }
    }
}

/// Hands a payload to the decoder its kind (and, for kinds with several layouts, its version)
/// names, as the node and client do.
fn decode_by_kind(payload: &[u8], kind: FrameKind, version: u8) {
    let _ = match kind {
        FrameKind::CheckBatch | FrameKind::ForwardedCheckBatch => {
            outcome(&decode_check_batch(payload, &WireLimits::default()))
        }
        FrameKind::DecisionBatch => outcome(&decode_decisions(payload)),
        FrameKind::Error => outcome(&decode_error_frame(payload)),
        FrameKind::Gossip => outcome(&decode_gossip(version, payload)),
        FrameKind::IdConflict => outcome(&decode_id_conflict(payload)),
        FrameKind::TableRequest => Outcome::Accepted,
        FrameKind::SlotTable => outcome(&decode_slot_table(version, payload)),
        FrameKind::Replicate => outcome(&decode_replicate(version, payload)),
        FrameKind::PolicyRequest => outcome(&decode_policy_request(payload)),
        FrameKind::Policy => outcome(&decode_policy_message(payload)),
        FrameKind::ScopedCheckBatch | FrameKind::ForwardedScopedCheckBatch => {
            let mut groups = CheckGroups::default();
            outcome(&decode_scoped_check_batch(
                payload,
                &WireLimits::default(),
                &mut groups,
            ))
        }
        FrameKind::RegionDeltas => outcome(&decode_region_deltas(version, payload)),
        FrameKind::RegionAck => outcome(&decode_region_ack(version, payload)),
        FrameKind::LeaseRequest => outcome(&decode_lease_requests(
            version,
            payload,
            &WireLimits::default(),
        )),
        FrameKind::LeaseAnswer => outcome(&decode_lease_answers(version, payload)),
        FrameKind::LeaseSync => outcome(&decode_lease_sync(version, payload)),
        FrameKind::TokenLeaseBatch => outcome(&floodgate::wire::decode_token_lease_batch(
            payload,
            &WireLimits::default(),
        )),
        FrameKind::TokenLeaseAnswers => {
            outcome(&floodgate::wire::decode_token_lease_answers(payload))
        }
        FrameKind::RlqsReports => outcome(&floodgate::wire::decode_rlqs_reports(payload)),
        FrameKind::RlqsAssignments => outcome(&floodgate::wire::decode_rlqs_assignments(payload)),
        FrameKind::RlqsRegionClaims => {
            outcome(&floodgate::wire::decode_rlqs_region_claims(payload))
        }
        FrameKind::RlqsRegionParts => outcome(&floodgate::wire::decode_rlqs_region_parts(payload)),
        FrameKind::RegionUnconfirmed => {
            outcome(&floodgate::wire::decode_region_unconfirmed(payload))
        }
    };
}

/// A byte stream cut into frames. The first byte picks the size of the pieces the stream arrives
/// in; the rest is the stream. Cutting it all at once and piece by piece must give the same
/// frames and errors, every frame must re-encode to itself, and the buffer stays bounded.
pub fn frame_reader(data: &[u8]) -> Outcome {
    let Some((&piece, stream)) = data.split_first() else {
        return Outcome::Refused;
    };
    let piece = usize::from(piece % 32) + 1;

    let mut whole = FrameReader::new(FRAME_TARGET_MAX_BYTES);
    whole.extend(stream);
    let mut expected = Vec::new();
    let closed = drain(&mut whole, &mut expected);

    let mut pieces = FrameReader::new(FRAME_TARGET_MAX_BYTES);
    let mut events = Vec::new();
    let mut closed_in_pieces = false;
    for chunk in stream.chunks(piece) {
        pieces.extend(chunk);
        // Everything complete was taken after the last piece: what is left is one unfinished
        // frame (header and at most the largest payload) plus this piece.
        assert!(pieces.buffered() <= HEADER_BYTES + FRAME_TARGET_MAX_BYTES + piece);
        if drain(&mut pieces, &mut events) {
            closed_in_pieces = true;
            break;
        }
    }
    assert_eq!(events, expected, "piece size {piece}");
    assert_eq!(closed_in_pieces, closed);
    if !closed {
        assert_eq!(whole.finish().is_ok(), whole.buffered() == 0);
        assert_eq!(whole.buffered(), pieces.buffered());
    }

    for event in &expected {
        if let Event::Frame(kind, request_id, payload) = event {
            let mut bytes = Vec::new();
            encode_frame(&mut bytes, *kind, *request_id, payload);
            let mut again = FrameReader::new(FRAME_TARGET_MAX_BYTES);
            again.extend(&bytes);
            let frame = again
                .next_frame()
                .expect("re-encoded frame")
                .expect("whole");
            assert_eq!(
                Event::Frame(frame.kind, frame.request_id, frame.payload.to_vec()),
                *event
            );
            assert!(again.finish().is_ok());
        }
    }
    if expected.iter().any(|e| matches!(e, Event::Frame(..))) {
        Outcome::Accepted
    } else {
        Outcome::Refused
    }
}

/// A check batch payload: refused, or every check valid and within the limits, and the batch
/// re-encodes to the same checks.
pub fn check_batch(data: &[u8]) -> Outcome {
    let payload = aligned(data);
    let limits = CHECK_TARGET_LIMITS;
    let decoded = decode_check_batch(&payload, &limits);
    let Ok(groups) = &decoded else {
        return Outcome::Refused;
    };
    let batch = rkyv::from_bytes::<CheckBatch, rancor::Error>(&payload)
        .expect("a validated batch deserializes");
    assert_eq!(groups.len(), batch.groups.len());
    assert!(groups.iter().map(Vec::len).sum::<usize>() <= limits.max_batch);
    for (group, sent) in groups.iter().zip(&batch.groups) {
        assert!(!group.is_empty());
        assert_eq!(group.len(), sent.len());
        assert!(group.iter().all(|c| c.refund) || group.iter().all(|c| !c.refund));
        for (check, wire) in group.iter().zip(sent) {
            assert!(wire.key.len() <= limits.max_key_bytes);
            assert_eq!(check.key, BucketKey::for_key(&wire.key));
            assert_eq!(check.cost, wire.cost);
            assert_eq!(
                Some(&check.limit.algorithm()),
                Algorithm::ALL.get(usize::from(wire.algorithm))
            );
            assert_eq!(check.limit.rate(), wire.rate);
            assert_eq!(check.limit.period_ns(), wire.period_ns);
            assert_eq!(check.limit.burst(), wire.burst);
        }
    }
    let again = reframe(FrameKind::CheckBatch, &batch);
    assert_eq!(decode_check_batch(&again, &limits), decoded);
    Outcome::Accepted
}

/// A check batch decided against a small store as a node does (refund groups one by one, a
/// single check alone, larger groups all-or-nothing), the clock moving between groups. The first
/// byte picks the clock's step (2^0 to 2^47 ns); the rest is the payload. Clients pick each
/// check's limit, so one key may arrive under several limits: every decision must stay sane.
pub fn check_batch_decide(data: &[u8]) -> Outcome {
    let Some((&step, rest)) = data.split_first() else {
        return Outcome::Refused;
    };
    let step = 1u64 << (step % 48);
    let payload = aligned(rest);
    let Ok(groups) = decode_check_batch(&payload, &CHECK_TARGET_LIMITS) else {
        return Outcome::Refused;
    };
    let store = BucketStore::new(StoreConfig {
        max_keys: 8,
        shards: 2,
    })
    .expect("a valid store config");
    let clock = FakeClock::new(1_000 * NANOS_PER_SEC);
    let mut decisions = Vec::new();
    for group in &groups {
        clock.advance(step);
        let now = clock.now_ns();
        if group[0].refund {
            for refund in group {
                store.refund(refund.key, &refund.limit, refund.cost, now);
                if let Ok(decision) = store.check(refund.key, &refund.limit, 0, now) {
                    check_sane(&decision, &refund.limit, 0);
                }
            }
            continue;
        }
        if let [single] = group.as_slice() {
            if let Ok(decision) = store.check(single.key, &single.limit, single.cost, now) {
                check_sane(&decision, &single.limit, single.cost);
            }
            continue;
        }
        let checks: Vec<BucketCheck> = group
            .iter()
            .map(floodgate::wire::ValidCheck::check)
            .collect();
        if let Ok(all_allowed) = store.check_all(&checks, now, &mut decisions) {
            assert_eq!(decisions.len(), checks.len());
            assert_eq!(all_allowed, decisions.iter().all(Decision::is_allowed));
            for (decision, check) in decisions.iter().zip(&checks) {
                // When the group was denied, the checks that passed report a peek (cost 0).
                let cost = if all_allowed { check.cost } else { 0 };
                check_sane(decision, &check.limit, cost);
            }
        }
        assert!(store.len() <= store.max_keys());
    }
    Outcome::Accepted
}

/// What every decision of a check of `cost` under `limit` must satisfy, whatever state the key
/// had (another limit's, a replica's): a cost above the burst never passes and is reported as
/// such, nothing remaining above the burst, and a retry no later than the bucket's reset.
fn check_decided(decision: &Decision, limit: &Limit, cost: u64) {
    match *decision {
        Decision::Allowed { remaining, .. } => {
            assert!(
                cost <= limit.burst(),
                "{decision:?} for {cost} under {limit}"
            );
            assert!(remaining <= limit.burst(), "{decision:?} under {limit}");
        }
        Decision::Denied {
            remaining,
            retry_after_ns,
            reset_after_ns,
        } => {
            assert!(remaining <= limit.burst(), "{decision:?} under {limit}");
            assert!(
                retry_after_ns <= reset_after_ns,
                "{decision:?} under {limit}"
            );
        }
        Decision::CostExceedsBurst { burst } => assert_eq!(burst, limit.burst()),
    }
}

/// A decision batch payload (what a client reads from a node): refused or re-encodes to itself,
/// and every decision converts without panicking.
pub fn decision_batch(data: &[u8]) -> Outcome {
    let payload = aligned(data);
    let decoded = decode_decisions(&payload);
    let Ok((decisions, table_version)) = &decoded else {
        return Outcome::Refused;
    };
    for wire in decisions {
        match wire.to_decision() {
            Ok(decision) => {
                assert!(wire.outcome <= 2);
                let back = WireDecision::from(decision).to_decision();
                assert_eq!(back, Ok(decision));
            }
            Err(_) => assert!(wire.outcome >= 3),
        }
    }
    let batch = DecisionBatch {
        decisions: decisions.clone(),
        table_version: *table_version,
    };
    let again = reframe(FrameKind::DecisionBatch, &batch);
    assert_eq!(decode_decisions(&again), decoded);
    Outcome::Accepted
}

/// An error frame payload: refused or re-encodes to itself.
pub fn error_frame(data: &[u8]) -> Outcome {
    let payload = aligned(data);
    let decoded = decode_error_frame(&payload);
    let Ok(frame) = &decoded else {
        return Outcome::Refused;
    };
    if let Some(code) = ErrorCode::from_u16(frame.code) {
        assert_eq!(code as u16, frame.code);
        assert!(!code.name().is_empty());
    }
    let copy = ErrorFrame {
        code: frame.code,
        message: frame.message.clone(),
    };
    let again = reframe(FrameKind::Error, &copy);
    assert_eq!(decode_error_frame(&again), decoded);
    Outcome::Accepted
}

/// The frame `encode` writes, read back: its version and payload.
fn read_back(encode: impl FnOnce(&mut Vec<u8>)) -> (u8, AlignedVec) {
    let mut bytes = Vec::new();
    encode(&mut bytes);
    let mut reader = FrameReader::new(usize::MAX);
    reader.extend(&bytes);
    let frame = reader
        .next_frame()
        .expect("a frame this crate encoded reads back")
        .expect("the whole frame was given");
    assert_eq!(reader.buffered(), 0);
    (frame.version, frame.payload)
}

/// Every protocol version this build reads: payloads of kinds with several layouts are tried
/// in each.
fn versions() -> std::ops::RangeInclusive<u8> {
    floodgate::protocol::OLDEST..=floodgate::protocol::NEWEST
}

/// A gossip payload, in every layout: refused, or re-encodes to itself and a membership that
/// takes it in stays within its bounds.
pub fn gossip(data: &[u8]) -> Outcome {
    let payload = aligned(data);
    let mut result = Outcome::Refused;
    for version in versions() {
        let decoded = decode_gossip(version, &payload);
        let Ok(gossip) = &decoded else {
            continue;
        };
        let (layout, again) = read_back(|out| encode_gossip(out, version, gossip));
        assert_eq!(layout, FrameKind::Gossip.layout_at(version));
        assert_eq!(decode_gossip(layout, &again), decoded);
        take_in(gossip);
        result = Outcome::Accepted;
    }
    result
}

/// A membership that takes `gossip` in, through every timer path, stays within its bounds.
fn take_in(gossip: &floodgate::cluster::Gossip) {
    let config = MembershipConfig {
        max_members: 8,
        ..MembershipConfig::default()
    };
    let me = MemberInfo {
        id: "me".to_owned(),
        addr: "127.0.0.1:7100".to_owned(),
        region: String::new(),
    };
    let start = NANOS_PER_SEC;
    let mut membership =
        Membership::new(me, 1, vec!["127.0.0.1:7101".to_owned()], config, start, 3);
    membership.handle_gossip(start, gossip);
    assert!(membership.members().count() <= config.max_members);
    let mut now = start;
    // Past suspicion, death and forgetting: every timer path runs once.
    for step in [
        0,
        config.suspect_after_ns,
        config.dead_after_ns,
        config.forget_after_ns,
    ] {
        now += step + 1;
        for message in membership.poll(now) {
            assert!(message.gossip.members.len() <= config.max_members);
        }
        membership.handle_gossip(now, gossip);
        assert!(membership.members().count() <= config.max_members);
        assert_eq!(membership.me(), "me");
        // Whatever ranges it was told, this node's own stays in the cluster's.
        if let Some(version) = membership.cluster_version() {
            assert!(floodgate::protocol::SUPPORTED.contains(version));
        }
    }
}

/// A slot table payload (what a client routes by), in every layout: refused, or one owner and
/// one successor per slot, each a listed member or nobody, and it re-encodes to itself.
pub fn slot_table(data: &[u8]) -> Outcome {
    let payload = aligned(data);
    let mut result = Outcome::Refused;
    for version in versions() {
        let decoded = decode_slot_table(version, &payload);
        let Ok(table) = &decoded else {
            continue;
        };
        assert_eq!(table.owners.len(), SLOTS);
        assert_eq!(table.successors.len(), SLOTS);
        for &index in table.owners.iter().chain(&table.successors) {
            assert!(index == u16::MAX || usize::from(index) < table.members.len());
        }
        let (layout, again) = read_back(|out| encode_slot_table(out, version, 7, table));
        assert_eq!(layout, FrameKind::SlotTable.layout_at(version));
        assert_eq!(decode_slot_table(layout, &again), decoded);
        result = Outcome::Accepted;
    }
    result
}

/// The layouts a replicate payload may have: version 2's (flat buckets) and version 12's (GCRA
/// buckets as columns).
fn replicate_layouts() -> [u8; 2] {
    [
        BASE_LAYOUT,
        floodgate::protocol::Feature::CompactReplicas.since(),
    ]
}

/// A replicate payload read in each layout: refused, or a hand-off in range, every bucket's
/// limit valid and its log no longer than twice the limit (one limit owed), and it re-encodes to
/// the same buckets.
pub fn replicate(data: &[u8]) -> Outcome {
    let payload = aligned(data);
    let outcomes = replicate_layouts().map(|layout| replicate_at(layout, &payload));
    if outcomes.contains(&Outcome::Accepted) {
        Outcome::Accepted
    } else {
        Outcome::Refused
    }
}

fn replicate_at(layout: u8, payload: &[u8]) -> Outcome {
    let decoded = decode_replicate(layout, payload);
    let Ok(replicated) = &decoded else {
        return Outcome::Refused;
    };
    if let Some(handoff) = &replicated.handoff {
        assert!(handoff.part < handoff.parts && handoff.parts <= MAX_HANDOFF_PARTS);
        assert!(handoff.slots.len() <= SLOTS);
        assert!(handoff.slots.iter().all(|&s| usize::from(s) < SLOTS));
    }
    for bucket in &replicated.buckets {
        match &bucket.value {
            BucketValue::Gcra { .. } => {}
            BucketValue::Window { limit, .. } => assert!(matches!(
                limit.algorithm(),
                Algorithm::FixedWindow | Algorithm::SlidingWindow
            )),
            BucketValue::Log { limit, times_ns } => {
                assert_eq!(limit.algorithm(), Algorithm::SlidingLog);
                assert!(times_ns.len() <= floodgate::algorithm::SlidingLog::most_entries(limit));
            }
        }
    }
    // As a sender encodes what its store holds.
    let (version, again) = read_back(|out| {
        let handoff = replicated.handoff.clone();
        encode_replicate(out, layout, &replicated.from, handoff, &replicated.buckets)
    });
    assert_eq!(version, layout);
    assert_eq!(decode_replicate(version, &again), decoded);
    Outcome::Accepted
}

/// GCRA limits to check merged GCRA buckets with (a GCRA bucket carries no limit; the checking
/// rule brings it). Picked by key bits, so one input meets several.
fn gcra_limit(key: BucketKey) -> Limit {
    const S: u64 = NANOS_PER_SEC;
    let (rate, period, burst) = match key.to_u128() % 4 {
        0 => (10, S, 10),
        1 => (5, 60 * S, 2),
        2 => (1, 1_000_000, 1),
        _ => (1_000, 3_600 * S, 5_000),
    };
    Limit::gcra(rate, period, burst).expect("a valid limit")
}

/// How long a decision under `limit` may ever ask to wait or report until the bucket is full.
/// GCRA: two full buckets' drain time (one owed). Fixed window: the rest of the window. Sliding window: the
/// rest of this window and all of the next. Log: one period.
fn longest_wait(limit: &Limit) -> u64 {
    match limit.algorithm() {
        // An empty bucket and one capacity owed (a metered charge's debt).
        Algorithm::Gcra => floodgate::algorithm::gcra::most_ahead_ns(limit),
        Algorithm::FixedWindow | Algorithm::SlidingLog => limit.period_ns(),
        Algorithm::SlidingWindow => 2 * limit.period_ns(),
    }
}

/// A replicate payload merged into a small store (as a node does), then every merged key checked
/// under its limit now and later: no panic, no remaining above the burst, and no wait longer than
/// the limit allows.
pub fn replicate_merge(data: &[u8]) -> Outcome {
    let payload = aligned(data);
    let Some(replicated) = replicate_layouts()
        .into_iter()
        .find_map(|layout| decode_replicate(layout, &payload).ok())
    else {
        return Outcome::Refused;
    };
    merge_and_check(&replicated.buckets, FakeClock::new(1_000 * NANOS_PER_SEC));
    Outcome::Accepted
}

/// Keys of the store merged buckets go into (a snapshot is loaded with this bound, as a node
/// passes its own capacity).
const MERGE_STORE_KEYS: usize = 16;

/// `buckets` (from a peer or a snapshot file) merged into a small store at the clock's time, then
/// every merged key checked under its limit now and later: no panic, no remaining above the
/// burst, no wait longer than the limit allows, and the store stays within its bounds.
fn merge_and_check(buckets: &[BucketState], clock: FakeClock) {
    let store = BucketStore::new(StoreConfig {
        max_keys: MERGE_STORE_KEYS,
        shards: 2,
    })
    .expect("a valid store config");
    let refused = store.merge(buckets, clock.now_ns());
    assert!(refused <= buckets.len());
    assert!(store.len() <= store.max_keys());

    let checks: Vec<(BucketKey, Limit)> = buckets
        .iter()
        .take(32)
        .map(|bucket| match &bucket.value {
            BucketValue::Gcra { .. } => (bucket.key, gcra_limit(bucket.key)),
            BucketValue::Window { limit, .. } | BucketValue::Log { limit, .. } => {
                (bucket.key, *limit)
            }
        })
        .collect();
    for step in [0, NANOS_PER_SEC, MAX_PERIOD_NS] {
        clock.advance(step);
        let now = clock.now_ns();
        for &(key, limit) in &checks {
            for cost in [0, 1, limit.burst()] {
                let Ok(decision) = store.check(key, &limit, cost, now) else {
                    continue; // The store is full of denying keys: a refusal, not a bug.
                };
                check_sane(&decision, &limit, cost);
                check_sane(&store.peek(key, &limit, cost, now), &limit, cost);
            }
            // A metered charge past anything left: the debt it leaves still bounds every wait.
            if let Ok(charged) = store.charge(key, &limit, limit.burst().saturating_mul(3), now) {
                check_sane(&charged.decision, &limit, 0);
            }
            store.refund(key, &limit, 1, now);
        }
        let mut out = Vec::new();
        store.take_changed(now, &mut out);
        store.export(now, &|_| true, &mut out);
        assert!(out.len() <= 2 * store.max_keys());
        store.sweep_expired(now, 2);
        assert!(store.len() <= store.max_keys());
    }
}

/// [`check_decided`], and no wait or reset longer than [`longest_wait`] under `limit`, whatever
/// limit or peer made the key's state (a changed limit never locks a key).
fn check_sane(decision: &Decision, limit: &Limit, cost: u64) {
    check_decided(decision, limit, cost);
    let longest = longest_wait(limit);
    let (retry_after_ns, reset_after_ns) = match *decision {
        Decision::Allowed { reset_after_ns, .. } => (0, reset_after_ns),
        Decision::Denied {
            retry_after_ns,
            reset_after_ns,
            ..
        } => (retry_after_ns, reset_after_ns),
        Decision::CostExceedsBurst { .. } => (0, 0),
    };
    assert!(retry_after_ns <= longest, "{decision:?} under {limit}");
    assert!(reset_after_ns <= longest, "{decision:?} under {limit}");
}

/// A policy request payload (what a node reads from a client): refused, or a short version that
/// re-encodes to itself.
pub fn policy_request(data: &[u8]) -> Outcome {
    let payload = aligned(data);
    let decoded = decode_policy_request(&payload);
    let Ok(request) = &decoded else {
        return Outcome::Refused;
    };
    assert!(request.version.len() <= 128);
    let again = reframe(FrameKind::PolicyRequest, request);
    assert_eq!(decode_policy_request(&again), decoded);
    Outcome::Accepted
}

/// A policy message payload (what a client reads from a node): refused, or within its bounds,
/// re-encodes to itself, and its text parses or is refused (the client parses it) without panic.
pub fn policy_message(data: &[u8]) -> Outcome {
    let payload = aligned(data);
    let decoded = decode_policy_message(&payload);
    let Ok(message) = &decoded else {
        return Outcome::Refused;
    };
    assert!(message.text.len() <= MAX_POLICY_TEXT_BYTES && message.version.len() <= 128);
    let again = reframe(FrameKind::Policy, message);
    assert_eq!(decode_policy_message(&again), decoded);
    if !message.is_unchanged() {
        let _ = Policy::from_yaml(&message.text);
    }
    Outcome::Accepted
}

/// Requests to plan against a parsed rules file: every key part present, and some absent.
fn sample_requests() -> [RequestAttributes<'static>; 3] {
    [
        RequestAttributes {
            method: "GET",
            path: "/",
            ..RequestAttributes::default()
        },
        RequestAttributes {
            method: "POST",
            path: "/v1/events/7/holds?x=1",
            user: Some("42"),
            client_ip: Some(std::net::IpAddr::from([192, 0, 2, 1])),
            api_key: Some("pk_live_acme_7f3a"),
            tenant: Some("acme%\u{1f}"),
            plan: None,
            home_region: Some("eu"),
            cost_headers: &[],
        },
        RequestAttributes {
            method: "delete",
            path: "//v1/../a/./b/%41",
            user: Some(""),
            client_ip: Some(std::net::IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 0, 1])),
            api_key: None,
            tenant: Some("t"),
            plan: Some("free"),
            home_region: Some("not a region"),
            cost_headers: &[],
        },
    ]
}

/// A rules file (text from an operator or a node): refused with a position, or a policy whose
/// version is a stable content hash and whose planned checks are within bounds.
pub fn rules_yaml(data: &[u8]) -> Outcome {
    let text = String::from_utf8_lossy(data);
    let parsed = Policy::from_yaml(&text);
    let policy = match &parsed {
        Ok(policy) => policy,
        Err(error) => {
            assert!(!error.to_string().is_empty());
            let _ = error.render("rules.yaml", &text);
            return Outcome::Refused;
        }
    };
    assert_eq!(policy.version().len(), 16);
    assert!(policy.version().bytes().all(|b| b.is_ascii_hexdigit()));
    let again = Policy::from_yaml(&text).expect("the same text parses again");
    assert_eq!(again.version(), policy.version());
    assert_eq!(again.rules(), policy.rules());
    assert!(policy.describe().lines().count() > policy.rules().len());
    for request in sample_requests() {
        for check in policy.checks_for(&request) {
            assert!(
                check.key.len() <= MAX_KEY_BYTES,
                "{} bytes",
                check.key.len()
            );
            assert!(check.key.starts_with(check.rule.as_bytes()));
            assert!(check.cost <= check.limit.burst());
        }
        classes_and_reserves(policy, &request);
    }
    Outcome::Accepted
}

/// A parsed policy's `priority:` and `reserve:` for one request: a named class is believed
/// only as the file says, and every class plans the same checks and leases (same keys,
/// algorithms, periods and TTLs) with a limit of at least 1 that never exceeds the limit of
/// the class above it.
fn classes_and_reserves(policy: &Policy, request: &RequestAttributes<'_>) {
    let unnamed = policy.priority_of(request, None);
    for named in ["critical", "SHEDDABLE", " default ", "urgent", ""] {
        let class = policy.priority_of(request, Some(named));
        if Priority::from_name(named).is_none() {
            assert_eq!(class, unnamed, "{named:?} is no class");
        }
    }
    let same = |a: &[PlannedCheck], b: &[PlannedCheck]| {
        a.len() == b.len()
            && a.iter().zip(b).all(|(a, b)| {
                a.key == b.key
                    && a.limit.algorithm() == b.limit.algorithm()
                    && a.limit.period_ns() == b.limit.period_ns()
            })
    };
    let checks = Priority::ALL.map(|class| policy.checks_for_class(request, class));
    let leases = Priority::ALL.map(|class| policy.leases_for_class(request, class));
    assert!(same(&policy.checks_for(request), &checks[unnamed.rank()]));
    for pair in checks.windows(2) {
        let (lower, higher) = (&pair[0], &pair[1]);
        assert!(same(lower, higher));
        for (l, h) in lower.iter().zip(higher) {
            assert!(l.limit.burst() >= 1 && l.limit.burst() <= h.limit.burst());
        }
    }
    for pair in leases.windows(2) {
        let (lower, higher) = (&pair[0], &pair[1]);
        assert_eq!(lower.len(), higher.len());
        for (l, h) in lower.iter().zip(higher) {
            assert_eq!((&l.key, l.limit.ttl_ns()), (&h.key, h.limit.ttl_ns()));
            assert!(l.limit.max() >= 1 && l.limit.max() <= h.limit.max());
        }
    }
}

/// A rate or duration as written in a rules file or on a command line: refused, or a value that
/// prints back (`format_period`, a limit's `Display`) to the same duration or rate.
pub fn rate_text(data: &[u8]) -> Outcome {
    let text = String::from_utf8_lossy(data);
    let duration = parse_duration_ns(&text);
    if let Ok(ns) = duration
        && ns > 0
    {
        assert_eq!(parse_duration_ns(&format_period(ns)), Ok(ns), "{text:?}");
    }
    let rate = parse_rate(&text);
    if let Ok((count, period_ns)) = rate
        && let Ok(limit) = Limit::gcra(count, period_ns, count)
    {
        // A limit prints as `gcra COUNT/PERIOD`, which parses back to the same rate.
        let shown = limit.to_string();
        let printed = shown.strip_prefix("gcra ").expect("a gcra limit says so");
        assert_eq!(
            parse_rate(printed),
            Ok((count, period_ns)),
            "{text:?} → {shown}"
        );
    }
    if duration.is_ok() || rate.is_ok() {
        Outcome::Accepted
    } else {
        Outcome::Refused
    }
}

/// The repository's example rules file: the policy the `request` target plans against.
pub const EXAMPLE_RULES: &str = include_str!("../../rules/example.yaml");

fn example_policy() -> &'static Policy {
    static POLICY: OnceLock<Policy> = OnceLock::new();
    POLICY.get_or_init(|| Policy::from_yaml(EXAMPLE_RULES).expect("the example rules parse"))
}

/// Every address an `X-Forwarded-For` value names (with or without a port), IPv4-mapped ones as
/// IPv4: where a client address may come from besides the peer.
fn forwarded_addresses(values: &[&str]) -> Vec<IpAddr> {
    values
        .iter()
        .flat_map(|value| value.split(','))
        .filter_map(|entry| {
            let entry = entry.trim();
            entry
                .parse::<IpAddr>()
                .ok()
                .or_else(|| entry.parse::<SocketAddr>().ok().map(|s| s.ip()))
        })
        .map(|ip| ip.to_canonical())
        .collect()
}

/// One request as a gateway sees it, planned against the example rules. The first byte picks
/// the peer (a trusted proxy or not); the rest is lines: method, path, user, tenant, API key,
/// plan, then `X-Forwarded-For` values, the last line also read as a path glob. The client
/// address is the peer or one the header names (the peer's own when it is not trusted); every
/// planned key starts with its rule's name, stays within `MAX_KEY_BYTES` and has exactly one
/// separator per key part (values cannot forge parts) unless it is the hashed long form.
pub fn request(data: &[u8]) -> Outcome {
    let Some((&peer, rest)) = data.split_first() else {
        return Outcome::Refused;
    };
    let peer = match peer % 3 {
        0 => IpAddr::from([10, 0, 0, 1]),
        1 => IpAddr::from([0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 1]),
        _ => IpAddr::from([192, 0, 2, 1]),
    };
    let text = String::from_utf8_lossy(rest);
    let mut lines = text.split('\n');
    let mut field = || lines.next().filter(|l| !l.is_empty());
    let (method, path) = (field().unwrap_or("GET"), field().unwrap_or("/"));
    let (user, tenant, api_key, plan) = (field(), field(), field(), field());
    let forwarded: Vec<&str> = lines.collect();

    let policy = example_policy();
    let client = client_ip(peer, &forwarded, policy.trusted_proxies());
    if policy.trusted_proxies().contains(peer) {
        assert!(
            client == peer || forwarded_addresses(&forwarded).contains(&client),
            "{client} from {forwarded:?}"
        );
    } else {
        assert_eq!(client, peer);
    }

    // Whatever a metered rule's request header may carry: any text is a cost or `missing`.
    let cost_headers: Vec<(String, String)> = policy
        .request_cost_headers()
        .map(|name| (name.to_owned(), user.unwrap_or_default().to_owned()))
        .collect();
    let attrs = RequestAttributes {
        method,
        path,
        user,
        client_ip: Some(client),
        api_key,
        tenant,
        plan,
        home_region: tenant,
        cost_headers: &cost_headers,
    };
    let separator = KEY_SEPARATOR.len_utf8();
    for check in policy.checks_for(&attrs) {
        let rule = policy.rule(&check.rule).expect("a planned rule exists");
        let key = String::from_utf8(check.key.clone()).expect("keys are text");
        assert!(key.len() <= MAX_KEY_BYTES, "{} bytes", key.len());
        let body = key
            .strip_prefix(rule.name())
            .and_then(|k| k.strip_prefix(KEY_SEPARATOR))
            .expect("a key starts with its rule's name and a separator");
        let separators = key.matches(KEY_SEPARATOR).count();
        if separators != rule.key().len() {
            // The long form: the rule's name, then a hash of the rest.
            assert_eq!(separators, 1, "{key:?}");
            assert!(body.starts_with('#') && body.len() == 33, "{key:?}");
            assert!(rule.name().len() + separator + 33 <= MAX_KEY_BYTES);
        }
        assert!(check.cost <= check.limit.burst());
        assert!(check.max_wait_ns <= MAX_WAIT_NS);
    }

    let segments = normalize_path(path);
    assert!(
        segments
            .iter()
            .all(|s| !s.is_empty() && s != "." && s != "..")
    );
    if let Some(glob) = forwarded.last()
        && let Ok(pattern) = PathPattern::parse(glob)
    {
        assert_eq!(pattern.as_str(), *glob);
        assert_eq!(PathPattern::parse(pattern.as_str()), Ok(pattern.clone()));
        let _ = pattern.matches(&segments);
    }
    Outcome::Accepted
}

/// Where a snapshot's header keeps its body length (after magic, version, reserved and count,
/// and the write time).
const SNAPSHOT_BODY_LEN_AT: usize = 24;

/// `data` as a snapshot file that passes the length and checksum checks: its body length and
/// checksum rewritten to match (when it is long enough and its magic and version pass), so the
/// fuzzer reaches the entries instead of stopping at the checksum. The checksum comes from the
/// decoder's own refusal, which names the one it computed.
fn sealed_snapshot(data: &[u8]) -> Vec<u8> {
    let mut bytes = data.to_vec();
    let minimum = SNAPSHOT_HEADER_BYTES + SNAPSHOT_TRAILER_BYTES;
    if bytes.len() < minimum {
        return bytes;
    }
    let body_len = (bytes.len() - minimum) as u64;
    bytes[SNAPSHOT_BODY_LEN_AT..SNAPSHOT_HEADER_BYTES].copy_from_slice(&body_len.to_le_bytes());
    if let Err(SnapshotError::BadChecksum { computed, .. }) = decode_snapshot(&bytes) {
        let at = bytes.len() - SNAPSHOT_TRAILER_BYTES;
        bytes[at..].copy_from_slice(&computed.to_le_bytes());
    }
    bytes
}

/// A snapshot file (read from `--state-dir` at start, so anything on disk): refused with a
/// message, or buckets that re-encode to the very same bytes and decode to the same snapshot.
/// The input is decoded as it is and then sealed (see [`sealed_snapshot`]); a valid file is the
/// same both ways. A bucket-count bound refuses exactly the snapshots holding more.
pub fn snapshot(data: &[u8]) -> Outcome {
    if let Err(error) = decode_snapshot(data) {
        assert!(!error.to_string().is_empty());
    }
    let bytes = sealed_snapshot(data);
    let decoded = decode_snapshot(&bytes);
    let snapshot = match &decoded {
        Ok(snapshot) => snapshot,
        Err(error) => {
            assert!(!error.to_string().is_empty());
            return Outcome::Refused;
        }
    };
    let mut again = Vec::new();
    encode_snapshot(&snapshot.buckets, snapshot.written_unix_ns, &mut again);
    assert_eq!(again, bytes, "a decoded snapshot re-encodes to its bytes");
    assert_eq!(decode_snapshot(&again), decoded);
    let count = snapshot.buckets.len();
    assert_eq!(decode_snapshot_limited(&bytes, count), decoded);
    if let Some(fewer) = count.checked_sub(1) {
        assert!(matches!(
            decode_snapshot_limited(&bytes, fewer),
            Err(SnapshotError::TooManyBuckets { .. })
        ));
    }
    for bucket in &snapshot.buckets {
        assert_ne!(bucket.key.to_u128() as u64, 0, "no key has a zero hash");
        let _ = (is_live(bucket, 0), is_long_period(bucket, u64::MAX));
    }
    Outcome::Accepted
}

/// A snapshot loaded as a node does at start: decoded within a small store's capacity, the
/// buckets still live at the load time kept, merged, then every key checked as in
/// `replicate_merge`. The load time is the snapshot's own write time plus an offset picked by
/// the first byte (0 to 2^47 ns later), so its windows and arrival times are near it.
pub fn snapshot_merge(data: &[u8]) -> Outcome {
    let Some((&offset, rest)) = data.split_first() else {
        return Outcome::Refused;
    };
    let bytes = sealed_snapshot(rest);
    let Ok(snapshot) = decode_snapshot_limited(&bytes, MERGE_STORE_KEYS) else {
        return Outcome::Refused;
    };
    // Far-off write times stay within the clock's range and leave room for the checks' steps.
    let now = snapshot
        .written_unix_ns
        .min(u64::MAX / 4)
        .saturating_add(1u64 << (offset % 48));
    let live: Vec<BucketState> = snapshot
        .buckets
        .into_iter()
        .filter(|b| is_live(b, now))
        .collect();
    merge_and_check(&live, FakeClock::new(now));
    Outcome::Accepted
}

/// The receiving region of the `region_messages` target.
pub const REGION_TARGET_RECEIVER: &str = "fuzz.receiver";

/// A region message payload, its first byte picking the decoder (0 scoped check batch, 1 region
/// deltas, 2 region ack, 3 RLQS region claims, 4 RLQS region parts, 5 a hand-off's unconfirmed
/// units, 6 region deltas in version 13's columns; others modulo 7): refused, or within its
/// bounds and re-encoding to itself. Accepted
/// deltas are applied to a store through an exchange twice: the units count once, the second
/// arrival is a duplicate, nothing panics. Accepted unconfirmed units are inherited and count.
pub fn region_messages(data: &[u8]) -> Outcome {
    let Some((&which, rest)) = data.split_first() else {
        return Outcome::Refused;
    };
    let payload = aligned(rest);
    match which % 7 {
        0 => {
            let mut groups = CheckGroups::default();
            let Ok(scopes) = decode_scoped_check_batch(&payload, &CHECK_TARGET_LIMITS, &mut groups)
            else {
                return Outcome::Refused;
            };
            assert_eq!(scopes.len(), groups.check_count());
            Outcome::Accepted
        }
        1 => region_deltas(BASE_LAYOUT, &payload),
        2 => {
            let decoded = decode_region_ack(BASE_LAYOUT, &payload);
            let Ok(ack) = &decoded else {
                return Outcome::Refused;
            };
            let again = reframe(FrameKind::RegionAck, &RegionAckMessage::from(ack));
            assert_eq!(decode_region_ack(BASE_LAYOUT, &again), decoded);
            Outcome::Accepted
        }
        3 => {
            let decoded = floodgate::wire::decode_rlqs_region_claims(&payload);
            let Ok(claims) = &decoded else {
                return Outcome::Refused;
            };
            let again = reframe(FrameKind::RlqsRegionClaims, claims);
            assert_eq!(floodgate::wire::decode_rlqs_region_claims(&again), decoded);
            Outcome::Accepted
        }
        6 => region_deltas(
            floodgate::protocol::Feature::CompactDeltas.since(),
            &payload,
        ),
        4 => {
            let decoded = floodgate::wire::decode_rlqs_region_parts(&payload);
            let Ok(parts) = &decoded else {
                return Outcome::Refused;
            };
            let again = reframe(FrameKind::RlqsRegionParts, parts);
            assert_eq!(floodgate::wire::decode_rlqs_region_parts(&again), decoded);
            Outcome::Accepted
        }
        _ => {
            use floodgate::wire::{RegionUnconfirmedMessage, decode_region_unconfirmed};
            let decoded = decode_region_unconfirmed(&payload);
            let Ok(message) = &decoded else {
                return Outcome::Refused;
            };
            let again = reframe(
                FrameKind::RegionUnconfirmed,
                &RegionUnconfirmedMessage::from(message),
            );
            assert_eq!(decode_region_unconfirmed(&again), decoded);
            inherit_all(&message.units);
            Outcome::Accepted
        }
    }
}

/// Inherits `units` in an exchange, whatever the peer claims: nothing panics, and no key counts
/// more units toward a region than the entries for it claimed (entries for the receiver's own
/// region, or past the bound on regions per key, count nothing).
fn inherit_all(units: &[floodgate::region::UnconfirmedUnits]) {
    use floodgate::region::{Exchange, ExchangeConfig, Peer, RegionName};
    let here = RegionName::new(REGION_TARGET_RECEIVER).expect("a valid region name");
    let mut exchange = Exchange::new(
        ExchangeConfig::for_regions(3),
        Peer::new(here.clone(), "n"),
        1,
    );
    exchange.inherit(1, units);
    for entry in units {
        let claimed = units
            .iter()
            .filter(|u| u.key == entry.key && u.region == entry.region)
            .fold(0u64, |sum, u| sum.saturating_add(u.units));
        let counted = exchange.inherited_units(entry.key, &entry.region, 1);
        assert!(counted <= claimed, "{counted} counted of {claimed} claimed");
        if entry.region == here {
            assert_eq!(counted, 0, "units for the receiver's own region counted");
        }
    }
}

/// Region deltas in the layout of `version` (2's or 13's): refused, or re-encoding through the
/// node's own encoder to themselves, then applied twice.
fn region_deltas(version: u8, payload: &[u8]) -> Outcome {
    let decoded = decode_region_deltas(version, payload);
    let Ok(batch) = &decoded else {
        return Outcome::Refused;
    };
    let (layout, again) = read_back(|out| encode_region_deltas(out, version, batch));
    assert_eq!(layout, version);
    assert_eq!(decode_region_deltas(layout, &again), decoded);
    if batch.from.region.as_str() != REGION_TARGET_RECEIVER {
        apply_twice(batch);
    }
    Outcome::Accepted
}

/// Applies `batch` twice through an exchange: applied once, acknowledged as a duplicate once
/// (or, numbered beyond the window, refused twice). A new sender's window starts at its
/// settled point (1 when it gives none, as version 2's layout cannot).
fn apply_twice(batch: &floodgate::region::DeltaBatch) {
    use floodgate::region::{DEDUPE_WINDOW, Exchange, ExchangeConfig, Peer, RegionName};
    let receiver = RegionName::new(REGION_TARGET_RECEIVER).expect("a valid region name");
    let mut exchange = Exchange::new(ExchangeConfig::for_regions(3), Peer::new(receiver, "n"), 1);
    let store = BucketStore::new(StoreConfig {
        max_keys: 64,
        shards: 4,
    })
    .expect("a valid store size");
    let now = 1_700_000_000 * NANOS_PER_SEC;
    exchange.handle_deltas(now, batch, &store);
    exchange.handle_deltas(now, batch, &store);
    assert!(store.len() <= store.max_keys());
    let window_start = batch.settled_below.unwrap_or(1).max(1);
    if batch.seq >= window_start.saturating_add(DEDUPE_WINDOW) {
        // Too far ahead of a new sender's first number: refused both times, not acknowledged.
        assert_eq!(exchange.applied_from(&batch.from), 0);
        assert_eq!(exchange.stats().refused_messages, 2);
        assert!(exchange.poll_transmit(now).is_none());
        return;
    }
    let units = batch
        .deltas
        .iter()
        .fold(0u64, |sum, d| sum.saturating_add(d.units));
    assert_eq!(exchange.applied_from(&batch.from), units);
    assert_eq!(exchange.stats().duplicate_messages, 1);
    assert!(
        exchange.poll_transmit(now).is_some(),
        "an acknowledgement is owed"
    );
}

/// Small caps, so the fuzzer reaches every limit with short inputs.
pub const RESP_TARGET_LIMITS: RespLimits = RespLimits {
    max_args: 8,
    max_arg_bytes: 64,
    max_command_bytes: 256,
};

/// A byte stream read as a RESP server reads it: command after command until an error or the
/// end. Every command stays within the caps, an incomplete one asks for more than it was given,
/// and each command written back as a multibulk parses to the same arguments.
pub fn resp_command(data: &[u8]) -> Outcome {
    let limits = RESP_TARGET_LIMITS;
    let mut at = 0;
    // Each step consumes at least one byte, so this ends within `data.len()` steps.
    while at < data.len() {
        let rest = &data[at..];
        match parse_command(rest, &limits) {
            Err(_) => return Outcome::Refused,
            Ok(Parsed::Incomplete(needed)) => {
                assert!(needed > rest.len(), "incomplete asks for more than it has");
                break;
            }
            Ok(Parsed::Skip(used)) => {
                assert!(used > 0 && used <= rest.len());
                at += used;
            }
            Ok(Parsed::Command(args, used)) => {
                assert!(used > 0 && used <= rest.len() && used <= limits.max_command_bytes.max(2));
                assert!(!args.is_empty() && args.len() <= limits.max_args);
                assert!(args.iter().all(|a| a.len() <= limits.max_arg_bytes));
                let mut again = format!("*{}\r\n", args.len()).into_bytes();
                for arg in &args {
                    again.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
                    again.extend_from_slice(arg);
                    again.extend_from_slice(b"\r\n");
                }
                let wide = RespLimits {
                    max_command_bytes: usize::MAX,
                    ..limits
                };
                assert_eq!(
                    parse_command(&again, &wide),
                    Ok(Parsed::Command(args, again.len()))
                );
                at += used;
            }
        }
    }
    Outcome::Accepted
}

/// The RLS front's configuration the `rls_request` target plans against (domain `edge`): a
/// rule by value, one by key alone, an unlimited one, a nested pair whose inner rule replaces
/// another, and a metered rule.
const RLS_TARGET_CONFIG: &str = "\
domain: edge
descriptors:
  - key: generic_key
    value: slow
    rate_limit: {unit: minute, requests_per_unit: 3, name: slow}
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: user
    value: admin
    rate_limit: {unlimited: true}
  - key: destination
    descriptors:
      - key: source
        value: internal
        rate_limit: {unit: day, requests_per_unit: 5, algorithm: gcra, burst: 2, replaces: [{name: slow}]}
  - key: tokens
    rate_limit: {unit: minute, requests_per_unit: 1000, metered: true, estimate: 50}
";

fn rls_target_config() -> &'static RlsConfig {
    static CONFIG: OnceLock<RlsConfig> = OnceLock::new();
    CONFIG.get_or_init(|| {
        RlsConfig::from_files([("edge.yaml", RLS_TARGET_CONFIG)])
            .expect("the target's RLS rules load")
    })
}

/// An Envoy `RateLimitRequest` read as the RLS front reads it, then planned as the front plans
/// it. The first byte picks the most descriptors a request may have (1 to 16) and whether
/// negative hits are on; the rest is the message. Read: the domain and every entry borrowed
/// from the message, within the bounds, and the request written back reads the same; refused:
/// in words. Planned: one plan a descriptor, every bucket key of one size, the same descriptor
/// on the same key and different ones on different keys, negative hits only where they are on.
pub fn rls_request(data: &[u8]) -> Outcome {
    let Some((&first, message)) = data.split_first() else {
        return Outcome::Refused;
    };
    let max_descriptors = 1 + usize::from(first & 0x0f);
    let options = PlanOptions {
        allow_negative_hits: first & 0x10 != 0,
    };
    let request = match read_request(message, max_descriptors) {
        Ok(request) => request,
        Err(Unread::Refused(why)) => {
            assert!(!why.is_empty());
            return Outcome::Refused;
        }
        Err(Unread::Malformed(why)) => {
            assert!(!why.is_empty());
            return Outcome::Refused;
        }
    };
    let within = message.as_ptr_range();
    let borrowed = |text: &str| {
        text.is_empty()
            || (within.start <= text.as_ptr() && text.as_bytes().as_ptr_range().end <= within.end)
    };
    assert!(!request.domain.is_empty() && borrowed(request.domain));
    assert!((1..=max_descriptors).contains(&request.descriptors.len()));
    for descriptor in &request.descriptors {
        assert!((1..=MAX_ENTRIES).contains(&descriptor.entries.len()));
        assert!(
            descriptor
                .entries
                .iter()
                .all(|(key, value)| borrowed(key) && borrowed(value))
        );
    }
    let again = encode_rls_request(&request);
    assert_eq!(read_request(&again, max_descriptors).as_ref(), Ok(&request));

    let plans = plan_request(
        rls_target_config(),
        request.domain,
        &request.descriptors,
        u64::from(request.hits_addend),
        options,
    );
    assert_eq!(plans.len(), request.descriptors.len());
    let mut keyed: Vec<(&DescriptorRequest, &[u8])> = Vec::new();
    for (descriptor, plan) in request.descriptors.iter().zip(&plans) {
        if descriptor.negative_hits && !options.allow_negative_hits {
            assert_eq!(plan, &Planned::Invalid(NEGATIVE_HITS_OFF.to_owned()));
        }
        match plan {
            Planned::Check {
                key,
                refund,
                peek,
                charge,
                ..
            } => {
                assert!(key.len() == 20 && key.starts_with(b"rls:"), "{key:?}");
                assert_eq!(*refund, descriptor.negative_hits);
                assert!(!(*peek && *charge) && !(*refund && (*peek || *charge)));
                keyed.push((descriptor, key));
            }
            Planned::Invalid(why) => assert!(!why.is_empty()),
            Planned::NoLimit | Planned::Unlimited(_) => {}
        }
    }
    for (i, (a, a_key)) in keyed.iter().enumerate() {
        for (b, b_key) in &keyed[i + 1..] {
            let same = a.entries == b.entries && a.limit_override == b.limit_override;
            assert_eq!(same, a_key == b_key, "{a:?} and {b:?}");
        }
    }
    Outcome::Accepted
}

/// `request` as a `RateLimitRequest` message, every field it holds written once (the seeds and
/// the `rls_request` target's round trip).
pub fn encode_rls_request(request: &RequestView) -> Vec<u8> {
    fn key(out: &mut Vec<u8>, field: u32, wire: u8) {
        varint(out, u64::from(field << 3 | u32::from(wire)));
    }
    fn varint(out: &mut Vec<u8>, mut value: u64) {
        while value >= 0x80 {
            out.push(value as u8 | 0x80);
            value >>= 7;
        }
        out.push(value as u8);
    }
    fn bytes(out: &mut Vec<u8>, field: u32, body: &[u8]) {
        key(out, field, 2);
        varint(out, body.len() as u64);
        out.extend_from_slice(body);
    }
    let mut out = Vec::new();
    bytes(&mut out, 1, request.domain.as_bytes());
    for descriptor in &request.descriptors {
        let mut body = Vec::new();
        for (entry_key, value) in &descriptor.entries {
            let mut entry = Vec::new();
            bytes(&mut entry, 1, entry_key.as_bytes());
            bytes(&mut entry, 2, value.as_bytes());
            bytes(&mut body, 1, &entry);
        }
        if let Some((requests_per_unit, unit)) = descriptor.limit_override {
            let mut limit = Vec::new();
            key(&mut limit, 1, 0);
            varint(&mut limit, u64::from(requests_per_unit));
            key(&mut limit, 2, 0);
            // An enum is an int32, sign-extended to 64 bits on the wire.
            varint(&mut limit, i64::from(unit) as u64);
            bytes(&mut body, 2, &limit);
        }
        if let Some(hits) = descriptor.hits_addend {
            let mut value = Vec::new();
            key(&mut value, 1, 0);
            varint(&mut value, hits);
            bytes(&mut body, 3, &value);
        }
        if descriptor.negative_hits {
            key(&mut body, 4, 0);
            varint(&mut body, 1);
        }
        bytes(&mut out, 2, &body);
    }
    key(&mut out, 3, 0);
    varint(&mut out, u64::from(request.hits_addend));
    out
}
