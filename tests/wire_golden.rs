//! Golden bytes: every frame kind, encoded from a fixed message, and `slot_of` for fixed keys,
//! compared with the bytes pinned in `tests/golden/`. Nodes and clients of different builds talk
//! to each other during a rolling upgrade, so a change to the wire format or to the key → slot
//! hash must be a deliberate, reviewed edit of these files, never a side effect that passes
//! unnoticed. To re-pin after an intended change: `FLOODGATE_UPDATE_GOLDEN=1 cargo test --test
//! wire_golden`, then review the diff of `tests/golden/`. A layout older builds cannot read is a
//! new protocol version (`floodgate::protocol`): its frames are pinned in `wire_frames_vN.txt`,
//! and version 2's in `wire_frames.txt` never change.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use floodgate::cluster::membership::MemberDigest;
use floodgate::cluster::{Gossip, IdConflict, MemberInfo, slot_of};
use floodgate::lease::LeaseLimit;
use floodgate::protocol::{self, VersionRange};
use floodgate::wire::{
    BASE_LAYOUT, CheckBatch, CheckGroups, DecisionBatch, ErrorCode, ErrorFrame, FrameKind,
    FrameReader, HandoffPart, LeaseAnswer, LeaseAnswerBatch, LeaseRequestBatch, LeaseSyncMessage,
    PolicyMessage, PolicyRequest, RegionAckMessage, RegionAckMessageV4, RegionDeltasMessage,
    RegionDeltasMessageV4, RegionDeltasMessageV13, ReplicateMessage, ScopedCheckBatch,
    SlotTableMessage, TableMember, TokenLeaseAnswer, TokenLeaseAnswers, TokenLeaseBatch,
    TokenLeaseRequest, WireBucket, WireCheck, WireDecision, WireDelta, WireDeltaLimit, WireLease,
    WireLeaseAnswer, WireLeaseRequest, WireLeaseSet, WireScope, decode_check_batch,
    decode_decisions, decode_error_frame, decode_gossip, decode_id_conflict, decode_lease_answers,
    decode_lease_requests, decode_lease_sync, decode_policy_message, decode_policy_request,
    decode_region_ack, decode_region_deltas, decode_replicate, decode_scoped_check_batch,
    decode_slot_table, decode_token_lease_answers, decode_token_lease_batch, encode_frame,
    encode_gossip, encode_lease_answers, encode_lease_requests, encode_lease_sync, encode_message,
    encode_message_at, encode_replicate, encode_slot_table,
};
use floodgate::wire::{
    RLQS_DENY, RLQS_TOKEN_BUCKET, RlqsAssignmentBatch, RlqsRegionClaims, RlqsRegionParts,
    RlqsReportBatch, WireRegionClaim, WireRegionPart, WireRlqsAssignment, WireRlqsBucket,
    WireRlqsEntry, WireRlqsReport, decode_rlqs_assignments, decode_rlqs_region_claims,
    decode_rlqs_region_parts, decode_rlqs_reports,
};
use floodgate::wire::{RegionUnconfirmedMessage, WireUnconfirmed, decode_region_unconfirmed};
use floodgate::{Algorithm, BucketKey, BucketState, BucketValue, Decision, Limit, NANOS_PER_SEC};

fn golden_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name)
}

/// Compares `actual` (name → hex) with the pinned file, or rewrites the file when asked to.
fn assert_golden(file: &str, actual: &BTreeMap<String, String>) {
    let mut text = String::new();
    for (name, hex) in actual {
        writeln!(text, "{name} {hex}").unwrap();
    }
    let path = golden_path(file);
    if std::env::var_os("FLOODGATE_UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &text).unwrap();
        return;
    }
    let pinned = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let pinned: BTreeMap<&str, &str> = pinned
        .lines()
        .filter_map(|line| line.split_once(' '))
        .collect();
    let mut changed = Vec::new();
    for (name, hex) in actual {
        match pinned.get(name.as_str()) {
            Some(old) if old == hex => {}
            Some(old) => changed.push(format!(
                "{name}: pinned {old}\n{:>w$}  now    {hex}",
                "",
                w = name.len()
            )),
            None => changed.push(format!("{name}: not pinned (now {hex})")),
        }
    }
    for name in pinned.keys() {
        if !actual.contains_key(*name) {
            changed.push(format!("{name}: pinned but no longer produced"));
        }
    }
    assert!(
        changed.is_empty(),
        "{} differs from what this build produces:\n{}\n(an intended format change: re-pin \
         with FLOODGATE_UPDATE_GOLDEN=1 and review the diff)",
        path.display(),
        changed.join("\n")
    );
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        write!(s, "{b:02x}").unwrap();
        s
    })
}

fn gcra() -> Limit {
    Limit::gcra(10, NANOS_PER_SEC, 20).unwrap()
}

fn check_batch() -> CheckBatch {
    let window = Limit::window(floodgate::Algorithm::FixedWindow, 100, 60 * NANOS_PER_SEC).unwrap();
    CheckBatch {
        groups: vec![
            vec![
                WireCheck::new(b"user:42".as_slice(), &gcra(), 1),
                WireCheck::new(b"tenant:acme".as_slice(), &window, 3),
            ],
            vec![WireCheck::refund(b"ip:203.0.113.9".as_slice(), &gcra(), 2)],
        ],
    }
}

fn member(id: &str, port: u16) -> MemberInfo {
    MemberInfo {
        id: id.into(),
        addr: format!("127.0.0.1:{port}"),
        region: "eu".into(),
    }
}

/// One fixed message per frame kind, encoded as a whole frame (header and payload) for an end
/// speaking `version`: every kind in its layout of that version.
fn frames(version: u8) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut put = |kind: FrameKind, bytes: Vec<u8>| {
        out.insert(format!("{kind:?}"), hex(&bytes));
    };
    checks_and_answers(&mut put);
    cluster_frames(version, &mut put);
    region_frames(version, &mut put);
    lease_frames(version, &mut put);
    rlqs_frames(&mut put);
    out
}

/// A check batch and its answers: kinds 1-3.
fn checks_and_answers(put: &mut dyn FnMut(FrameKind, Vec<u8>)) {
    let mut frame = Vec::new();
    encode_message(&mut frame, FrameKind::CheckBatch, 7, &check_batch());
    put(FrameKind::CheckBatch, frame);

    let decisions = [
        Decision::Allowed {
            remaining: 3,
            reset_after_ns: 5_000,
        },
        Decision::Denied {
            remaining: 0,
            retry_after_ns: 90_000_000,
            reset_after_ns: 110_000_000,
        },
        Decision::CostExceedsBurst { burst: 4 },
    ];
    let mut wire: Vec<WireDecision> = decisions.iter().map(|&d| d.into()).collect();
    wire.push(WireDecision::error(ErrorCode::NotOwner));
    let mut frame = Vec::new();
    let batch = DecisionBatch {
        decisions: wire,
        table_version: 0x0123_4567_89ab_cdef,
    };
    encode_message(&mut frame, FrameKind::DecisionBatch, 7, &batch);
    put(FrameKind::DecisionBatch, frame);

    let mut frame = Vec::new();
    let error = ErrorFrame {
        code: ErrorCode::KeyTooLong as u16,
        message: "key longer than 256 bytes".into(),
    };
    encode_message(&mut frame, FrameKind::Error, 0, &error);
    put(FrameKind::Error, frame);
}

/// Between nodes and to clients about the cluster, and the rules: kinds 4-11.
/// A table of fixed messages, one per kind: long for that alone.
fn cluster_frames(version: u8, put: &mut dyn FnMut(FrameKind, Vec<u8>)) {
    let mut frame = Vec::new();
    let gossip = Gossip {
        members: vec![
            MemberDigest {
                info: member("node-0", 7100),
                incarnation: 2,
                heartbeat: 41,
                left: false,
                versions: VersionRange::new(2, 3),
                joining: true,
            },
            MemberDigest {
                info: member("node-1", 7101),
                incarnation: 1,
                heartbeat: 40,
                left: true,
                versions: None,
                joining: false,
            },
        ],
    };
    encode_gossip(&mut frame, version, &gossip);
    put(FrameKind::Gossip, frame);

    let mut frame = Vec::new();
    encode_frame(&mut frame, FrameKind::TableRequest, 3, &[]);
    put(FrameKind::TableRequest, frame);

    let mut frame = Vec::new();
    let table = SlotTableMessage {
        version: 99,
        epoch: 4,
        from: "node-0".into(),
        members: vec![
            TableMember {
                id: "node-0".into(),
                addr: "127.0.0.1:7100".into(),
                region: "eu".into(),
                state: 0,
                versions: VersionRange::new(2, 3),
            },
            TableMember {
                id: "node-1".into(),
                addr: "127.0.0.1:7101".into(),
                region: "eu".into(),
                state: 1,
                versions: None,
            },
        ],
        owners: vec![0, 1, 1, 0],
        successors: vec![1, 0, 0, 1],
        cluster_version: 2,
    };
    encode_slot_table(&mut frame, version, 3, &table);
    put(FrameKind::SlotTable, frame);

    let mut frame = Vec::new();
    let handoff = HandoffPart {
        id: 5,
        part: 0,
        parts: 2,
        slots: vec![17, 4095],
    };
    if protocol::Feature::CompactReplicas.readable_at(version) {
        // From the store's buckets, as a node sends them: GCRA as columns (a key is 96 bits).
        let buckets = [
            BucketState {
                key: BucketKey::from_u128(0x4455_6677_8899_aabb_ccdd_eeff),
                value: BucketValue::Gcra {
                    tat_ns: 1_700_000_000_000_000_000,
                    margin_ms: 250,
                },
            },
            BucketState {
                key: BucketKey::from_u128(7),
                value: BucketValue::Log {
                    limit: Limit::new(Algorithm::SlidingLog, 3, NANOS_PER_SEC, 3).unwrap(),
                    times_ns: vec![10, 20],
                },
            },
        ];
        encode_replicate(&mut frame, version, "node-1", Some(handoff), &buckets);
    } else {
        let replicate = ReplicateMessage {
            from: "node-1".into(),
            handoff: Some(handoff),
            buckets: vec![
                WireBucket {
                    key: 0x0011_2233_4455_6677_8899_aabb_ccdd_eeff,
                    algorithm: 0,
                    tat_ns: 1_700_000_000_000_000_000,
                    margin_ms: 250,
                    ..WireBucket::default()
                },
                WireBucket {
                    key: 7,
                    algorithm: 3,
                    rate: 3,
                    period_ns: NANOS_PER_SEC,
                    burst: 3,
                    times_ns: vec![10, 20],
                    ..WireBucket::default()
                },
            ],
        };
        encode_message(&mut frame, FrameKind::Replicate, 0, &replicate);
    }
    put(FrameKind::Replicate, frame);

    let mut frame = Vec::new();
    let request = PolicyRequest {
        version: "v1".into(),
    };
    encode_message(&mut frame, FrameKind::PolicyRequest, 9, &request);
    put(FrameKind::PolicyRequest, frame);

    let mut frame = Vec::new();
    let policy = PolicyMessage {
        version: "v2".into(),
        text: "rules: []\n".into(),
    };
    encode_message(&mut frame, FrameKind::Policy, 9, &policy);
    put(FrameKind::Policy, frame);

    let mut frame = Vec::new();
    encode_message(
        &mut frame,
        FrameKind::ForwardedCheckBatch,
        42,
        &check_batch(),
    );
    put(FrameKind::ForwardedCheckBatch, frame);

    let mut frame = Vec::new();
    let conflict = IdConflict {
        id: "node-1".into(),
        holder_addr: "127.0.0.1:7101".into(),
        holder_incarnation: 3,
        claimant_addr: "127.0.0.1:7109".into(),
        claimant_incarnation: 1,
    };
    encode_message(&mut frame, FrameKind::IdConflict, 0, &conflict);
    put(FrameKind::IdConflict, frame);
}

/// Regions: kinds 12-14, 20 and 25.
/// A table of fixed messages, one per kind: long for that alone.
fn region_frames(version: u8, put: &mut dyn FnMut(FrameKind, Vec<u8>)) {
    let mut frame = Vec::new();
    let scoped = ScopedCheckBatch {
        batch: check_batch(),
        scopes: check_batch()
            .groups
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, _)| match i % 3 {
                0 => WireScope::default(),
                1 => WireScope {
                    kind: 1,
                    home: String::new(),
                },
                _ => WireScope {
                    kind: 2,
                    home: "eu".into(),
                },
            })
            .collect(),
    };
    encode_message(&mut frame, FrameKind::ScopedCheckBatch, 11, &scoped);
    put(FrameKind::ScopedCheckBatch, frame);
    let mut frame = Vec::new();
    encode_message(
        &mut frame,
        FrameKind::ForwardedScopedCheckBatch,
        12,
        &scoped,
    );
    put(FrameKind::ForwardedScopedCheckBatch, frame);

    let mut frame = Vec::new();
    let deltas = RegionDeltasMessage {
        region: "us".into(),
        node: "node-2".into(),
        session: 1_700_000_000_000_000_000,
        seq: 3,
        deltas: vec![
            WireDelta {
                key: 0x0011_2233_4455_6677_8899_aabb_ccdd_eeff,
                algorithm: 0,
                rate: 100,
                period_ns: NANOS_PER_SEC,
                burst: 50,
                units: 4,
                at_ns: 1_700_000_000_100_000_000,
            },
            WireDelta {
                key: 7,
                algorithm: 3,
                rate: 3,
                period_ns: NANOS_PER_SEC,
                burst: 3,
                units: 1,
                at_ns: 1_700_000_000_200_000_000,
            },
        ],
    };
    let layout = FrameKind::RegionDeltas.layout_at(version);
    if layout >= 13 {
        // The same two deltas as columns: each limit once, units and ages as LEB128 integers
        // (4 and 100 ms before the newest, 1 and 0).
        let deltas = RegionDeltasMessageV13 {
            region: deltas.region,
            node: deltas.node,
            session: deltas.session,
            seq: deltas.seq,
            settled_below: 2,
            limits: vec![
                WireDeltaLimit {
                    algorithm: 0,
                    rate: 100,
                    period_ns: NANOS_PER_SEC,
                    burst: 50,
                },
                WireDeltaLimit {
                    algorithm: 3,
                    rate: 3,
                    period_ns: NANOS_PER_SEC,
                    burst: 3,
                },
            ],
            key_hashes: vec![0x8899_aabb_ccdd_eeff, 7],
            key_checks: vec![0x4455_6677, 0],
            limit_indices: vec![0, 1],
            newest_at_ns: 1_700_000_000_200_000_000,
            units_and_ages: vec![0x04, 0x80, 0xc2, 0xd7, 0x2f, 0x01, 0x00],
        };
        encode_message_at(&mut frame, layout, FrameKind::RegionDeltas, 0, &deltas);
    } else if layout >= 4 {
        let deltas = RegionDeltasMessageV4 {
            region: deltas.region,
            node: deltas.node,
            session: deltas.session,
            seq: deltas.seq,
            settled_below: 2,
            deltas: deltas.deltas,
        };
        encode_message_at(&mut frame, layout, FrameKind::RegionDeltas, 0, &deltas);
    } else {
        encode_message(&mut frame, FrameKind::RegionDeltas, 0, &deltas);
    }
    put(FrameKind::RegionDeltas, frame);

    let mut frame = Vec::new();
    let ack = RegionAckMessage {
        region: "eu".into(),
        node: "node-0".into(),
        session: 1_700_000_000_000_000_000,
        below: 3,
        also: vec![5, 6],
    };
    let layout = FrameKind::RegionAck.layout_at(version);
    if layout >= 4 {
        let ack = RegionAckMessageV4 {
            region: ack.region,
            node: ack.node,
            session: ack.session,
            below: ack.below,
            also: ack.also,
            receiver_session: 1_700_000_000_500_000_000,
        };
        encode_message_at(&mut frame, layout, FrameKind::RegionAck, 0, &ack);
    } else {
        encode_message(&mut frame, FrameKind::RegionAck, 0, &ack);
    }
    put(FrameKind::RegionAck, frame);

    let mut frame = Vec::new();
    let unconfirmed = RegionUnconfirmedMessage {
        from: "node-0".into(),
        units: vec![WireUnconfirmed {
            key: 0x0123_4567_89ab_cdef_0011_2233_4455_6677,
            region: "us".into(),
            units: 17,
        }],
    };
    encode_message(&mut frame, FrameKind::RegionUnconfirmed, 0, &unconfirmed);
    put(FrameKind::RegionUnconfirmed, frame);
}

/// Concurrency and token leases: kinds 15-19.
/// A table of fixed messages, one per kind: long for that alone.
fn lease_frames(version: u8, put: &mut dyn FnMut(FrameKind, Vec<u8>)) {
    let mut frame = Vec::new();
    let limit = LeaseLimit::new(3, 30 * NANOS_PER_SEC).unwrap();
    // From version 10 a lease id has 128 bits: the pinned ones use the upper 64 too.
    let lease_id = |low: u128| {
        if protocol::Feature::WideLeaseIds.readable_at(version) {
            (0xfeed_beef_0000_0009 << 64) | low
        } else {
            low
        }
    };
    let requests = LeaseRequestBatch {
        requests: vec![
            WireLeaseRequest::acquire("exports:tenant-7", &limit),
            WireLeaseRequest::release("exports:tenant-7", lease_id(0x1234_5678_0000_0001)),
            WireLeaseRequest {
                takeover: true,
                ..WireLeaseRequest::renew(
                    "exports:tenant-7",
                    lease_id(0x1234_5678_0000_0002),
                    NANOS_PER_SEC,
                )
            },
        ],
    };
    encode_lease_requests(&mut frame, version, 21, &requests);
    put(FrameKind::LeaseRequest, frame);

    let mut frame = Vec::new();
    let answers = LeaseAnswerBatch {
        answers: [
            LeaseAnswer::Granted {
                lease_id: lease_id(0x1234_5678_0000_0003),
                in_use: 1,
                expires_in_ns: 30 * NANOS_PER_SEC,
            },
            LeaseAnswer::Refused {
                in_use: 3,
                retry_after_ns: 1_500_000_000,
            },
            LeaseAnswer::Released {
                was_held: true,
                in_use: 2,
            },
            LeaseAnswer::Error(ErrorCode::NotOwner),
        ]
        .into_iter()
        .map(WireLeaseAnswer::from)
        .collect(),
        table_version: 0xfeed,
    };
    encode_lease_answers(&mut frame, version, 21, &answers);
    put(FrameKind::LeaseAnswer, frame);

    let mut frame = Vec::new();
    let sync = LeaseSyncMessage {
        from: "node-0".into(),
        handoff: true,
        sets: vec![WireLeaseSet {
            key: 0x0123_4567_89ab_cdef_0011_2233,
            max: 3,
            leases: vec![WireLease {
                id: lease_id(0x1234_5678_0000_0003),
                expires_at_ns: 1_700_000_030_000_000_000,
            }],
            released: vec![lease_id(0x1234_5678_0000_0001)],
        }],
    };
    assert_eq!(encode_lease_sync(&mut frame, version, &sync), 0);
    put(FrameKind::LeaseSync, frame);

    let mut frame = Vec::new();
    let mut taken_over = TokenLeaseRequest::new("hot:tenant:7", &gcra(), 0, 3);
    taken_over.check.takeover = true;
    let leases = TokenLeaseBatch {
        requests: vec![
            TokenLeaseRequest::new("hot:user:42", &gcra(), 25, 0),
            taken_over,
        ],
    };
    encode_message(&mut frame, FrameKind::TokenLeaseBatch, 12, &leases);
    put(FrameKind::TokenLeaseBatch, frame);

    let mut frame = Vec::new();
    let answers = TokenLeaseAnswers {
        answers: vec![
            TokenLeaseAnswer {
                outcome: 0,
                error_code: 0,
                granted: 25,
                remaining: 70,
                retry_after_ns: 0,
            },
            TokenLeaseAnswer {
                outcome: 0,
                error_code: 0,
                granted: 0,
                remaining: 0,
                retry_after_ns: 10_000_000,
            },
            TokenLeaseAnswer::error(ErrorCode::NotOwner),
        ],
        table_version: 0x1234_5678_9abc_def0,
    };
    encode_message(&mut frame, FrameKind::TokenLeaseAnswers, 12, &answers);
    put(FrameKind::TokenLeaseAnswers, frame);
}

/// RLQS relays and region parts: kinds 21-24.
fn rlqs_frames(put: &mut dyn FnMut(FrameKind, Vec<u8>)) {
    let bucket = WireRlqsBucket {
        domain: "edge".into(),
        entries: vec![WireRlqsEntry {
            key: "name".into(),
            value: "shared".into(),
        }],
    };
    let mut frame = Vec::new();
    let reports = RlqsReportBatch {
        from: "node-1".into(),
        reports: vec![WireRlqsReport {
            stream: 3,
            bucket: bucket.clone(),
            requests: 60,
            period_s: 60,
            allowed: 5,
            denied: 1,
            elapsed_ns: 5 * NANOS_PER_SEC,
            held_tokens: 29,
        }],
        closed: vec![7],
    };
    encode_message(&mut frame, FrameKind::RlqsReports, 13, &reports);
    put(FrameKind::RlqsReports, frame);

    let mut frame = Vec::new();
    let assignments = RlqsAssignmentBatch {
        from: "node-0".into(),
        assignments: vec![
            WireRlqsAssignment {
                stream: 3,
                seq: 12,
                bucket: bucket.clone(),
                action: RLQS_TOKEN_BUCKET,
                tokens_per_fill: 29,
                fill_interval_s: 60,
            },
            WireRlqsAssignment {
                stream: 4,
                seq: 13,
                bucket: bucket.clone(),
                action: RLQS_DENY,
                ..WireRlqsAssignment::default()
            },
        ],
    };
    encode_message(&mut frame, FrameKind::RlqsAssignments, 13, &assignments);
    put(FrameKind::RlqsAssignments, frame);

    let mut frame = Vec::new();
    let claims = RlqsRegionClaims {
        from: "node-1".into(),
        region: "us".into(),
        claims: vec![WireRegionClaim {
            bucket: bucket.clone(),
            requests: 600,
            period_s: 60,
            demand: 420,
            claim: 300,
        }],
    };
    encode_message(&mut frame, FrameKind::RlqsRegionClaims, 13, &claims);
    put(FrameKind::RlqsRegionClaims, frame);

    let mut frame = Vec::new();
    let parts = RlqsRegionParts {
        from: "node-0".into(),
        parts: vec![WireRegionPart { bucket, part: 450 }],
    };
    encode_message(&mut frame, FrameKind::RlqsRegionParts, 13, &parts);
    put(FrameKind::RlqsRegionParts, frame);
}

/// The kinds whose layout changed in `version` (and so have golden frames of their own).
fn changed_in(version: u8) -> Vec<FrameKind> {
    (1..=u8::MAX)
        .filter_map(FrameKind::from_u8)
        .filter(|kind| kind.layout_at(version) == version && version > BASE_LAYOUT)
        .collect()
}

/// Protocol 2's frames stay pinned as the build before negotiation wrote them: a node or
/// gateway of that build reads exactly these bytes from this one.
#[test]
fn every_frame_kind_encodes_to_its_pinned_bytes() {
    let frames = frames(2);
    // A new kind must get a golden message here too: every kind from 1 up is covered (kinds
    // need not be contiguous: numbers are reserved for kinds built elsewhere).
    let covered = (1..=u8::MAX)
        .filter_map(FrameKind::from_u8)
        .filter(|kind| frames.contains_key(&format!("{kind:?}")))
        .count();
    let known = (1..=u8::MAX).filter_map(FrameKind::from_u8).count();
    assert_eq!(covered, known, "a frame kind has no golden message");
    assert_golden("wire_frames.txt", &frames);
}

/// Each later version pins the kinds whose layout it changed; the other kinds are written as in
/// the version before, byte for byte (so, by induction, a kind no version changed as in 2). A
/// version that changed behaviour only (5) pins nothing.
#[test]
fn later_versions_pin_the_kinds_they_changed_and_leave_the_rest_alone() {
    for version in BASE_LAYOUT + 1..=protocol::NEWEST {
        let base = frames(version - 1);
        let changed = changed_in(version);
        if changed.is_empty() {
            assert_eq!(frames(version), base, "version {version} changed no layout");
            continue;
        }
        let mut pinned = BTreeMap::new();
        for (name, hex) in frames(version) {
            if changed.iter().any(|kind| format!("{kind:?}") == name) {
                pinned.insert(name, hex);
            } else {
                assert_eq!(Some(&hex), base.get(&name), "{name} in version {version}");
            }
        }
        assert_golden(&format!("wire_frames_v{version}.txt"), &pinned);
    }
}

/// Every pinned frame, of every version this build speaks, is read back and its payload
/// decoded: nothing a node or gateway of an older build sends is refused.
#[test]
fn every_pinned_frame_of_every_version_decodes() {
    let limits = floodgate::wire::WireLimits::default();
    let mut decoded = 0;
    for version in BASE_LAYOUT..=protocol::NEWEST {
        let file = match version {
            2 => "wire_frames.txt".to_owned(),
            v if changed_in(v).is_empty() => continue,
            v => format!("wire_frames_v{v}.txt"),
        };
        let text = std::fs::read_to_string(golden_path(&file)).unwrap();
        for (name, hex) in text.lines().filter_map(|line| line.split_once(' ')) {
            let bytes: Vec<u8> = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect();
            let mut reader = FrameReader::new(1 << 20);
            reader.extend(&bytes);
            let frame = reader.next_frame().unwrap().unwrap();
            assert_eq!(format!("{:?}", frame.kind), name);
            assert_eq!(frame.version, version, "{name} in {file}");
            let payload = &frame.payload;
            let ok = match frame.kind {
                FrameKind::CheckBatch | FrameKind::ForwardedCheckBatch => {
                    decode_check_batch(payload, &limits).is_ok()
                }
                FrameKind::DecisionBatch => decode_decisions(payload).is_ok(),
                FrameKind::Error => decode_error_frame(payload).is_ok(),
                FrameKind::Gossip => decode_gossip(frame.version, payload).is_ok(),
                FrameKind::TableRequest => payload.is_empty(),
                // The pinned table is cut to 4 slots to stay short: its layout is read, and
                // then its shape refused for that alone.
                FrameKind::SlotTable => matches!(
                    decode_slot_table(frame.version, payload),
                    Err((_, why)) if why.starts_with("slot table with 4 owners and 4 successors")
                ),
                FrameKind::Replicate => decode_replicate(frame.version, payload).is_ok(),
                FrameKind::PolicyRequest => decode_policy_request(payload).is_ok(),
                FrameKind::Policy => decode_policy_message(payload).is_ok(),
                FrameKind::IdConflict => decode_id_conflict(payload).is_ok(),
                FrameKind::ScopedCheckBatch | FrameKind::ForwardedScopedCheckBatch => {
                    decode_scoped_check_batch(payload, &limits, &mut CheckGroups::default()).is_ok()
                }
                FrameKind::RegionDeltas => decode_region_deltas(frame.version, payload)
                    .is_ok_and(|b| b.settled_below == (version >= 4).then_some(2)),
                FrameKind::RegionAck => decode_region_ack(frame.version, payload).is_ok_and(|a| {
                    a.receiver_session == (version >= 4).then_some(1_700_000_000_500_000_000)
                }),
                FrameKind::LeaseRequest => {
                    decode_lease_requests(frame.version, payload, &limits).is_ok()
                }
                FrameKind::LeaseAnswer => decode_lease_answers(frame.version, payload).is_ok(),
                FrameKind::LeaseSync => decode_lease_sync(frame.version, payload).is_ok(),
                FrameKind::TokenLeaseBatch => decode_token_lease_batch(payload, &limits).is_ok(),
                FrameKind::TokenLeaseAnswers => decode_token_lease_answers(payload).is_ok(),
                FrameKind::RlqsReports => decode_rlqs_reports(payload).is_ok(),
                FrameKind::RlqsAssignments => decode_rlqs_assignments(payload).is_ok(),
                FrameKind::RlqsRegionClaims => decode_rlqs_region_claims(payload).is_ok(),
                FrameKind::RlqsRegionParts => decode_rlqs_region_parts(payload).is_ok(),
                FrameKind::RegionUnconfirmed => decode_region_unconfirmed(payload).is_ok(),
            };
            assert!(ok, "{name} of {file} does not decode");
            decoded += 1;
        }
    }
    let kinds = (1..=u8::MAX).filter_map(FrameKind::from_u8).count();
    assert!(decoded > kinds, "only {decoded} pinned frames");
}

#[test]
fn slot_of_is_pinned_for_fixed_keys() {
    let keys: [&[u8]; 8] = [
        b"",
        b"a",
        b"user:42",
        b"tenant:acme",
        b"ip:203.0.113.9",
        b"rule:login:ip:2001:db8::1",
        &[0xff; 64],
        &[0u8; 256],
    ];
    let slots: BTreeMap<String, String> = keys
        .iter()
        .map(|key| (hex(key), slot_of(key).to_string()))
        .collect();
    assert_golden("slot_of.txt", &slots);
}

/// The `--state-dir` snapshot file is pinned as well: a node reads the file its previous build
/// wrote (a restart is how an upgrade happens), and a rolled-back node reads this build's.
/// Format 1 is what this build writes and the build before negotiation wrote and reads.
#[test]
fn the_snapshot_file_format_is_pinned_and_read_back() {
    use floodgate::store::snapshot::{SNAPSHOT_VERSION, decode_snapshot, encode_snapshot};
    use floodgate::{BucketKey, BucketState, BucketValue};
    let window = Limit::window(
        floodgate::Algorithm::FixedWindow,
        100,
        3_600 * NANOS_PER_SEC,
    )
    .unwrap();
    let buckets = vec![
        BucketState {
            key: BucketKey::from_u128(0x0011_2233_4455_6677_8899_aabb_ccdd_eeff),
            value: BucketValue::Gcra {
                tat_ns: 1_700_000_000_000_000_000,
                margin_ms: 3_600_000,
            },
        },
        BucketState {
            key: BucketKey::from_u128(7),
            value: BucketValue::Window {
                limit: window,
                state: floodgate::algorithm::WindowState {
                    window: 472_222,
                    count: 41,
                    previous: 99,
                },
            },
        },
    ];
    let mut bytes = Vec::new();
    encode_snapshot(&buckets, 1_700_000_000_500_000_000, &mut bytes);
    assert_eq!(SNAPSHOT_VERSION, 1);
    assert_golden(
        "snapshot.txt",
        &BTreeMap::from([("format-1".to_owned(), hex(&bytes))]),
    );
    let read = decode_snapshot(&bytes).unwrap();
    assert_eq!(read.buckets, buckets);
}
