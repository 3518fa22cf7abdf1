//! Seed inputs for every fuzz target: valid messages built with the crate's own encoders, and a
//! few hand-made edge cases, each with the outcome its body must give. Written to
//! `fuzz/corpus/<target>/seed-<name>` by the ignored test `write_seed_corpus` in the core's
//! `tests/fuzz_corpus.rs`; checked by its `seeds_give_their_expected_outcome`.

use floodgate::algorithm::WindowState;
use floodgate::cluster::membership::MemberDigest;
use floodgate::cluster::{Gossip, MemberInfo, SLOTS, SlotTable};
use floodgate::wire::{
    CheckBatch, DecisionBatch, ErrorCode, ErrorFrame, FrameKind, HEADER_BYTES, HandoffPart,
    MAX_WIRE_TAT_NS, PackedBatch, PackedDecisions, PolicyMessage, PolicyRequest, ReplicateMessage,
    ReplicateMessageV12, SlotTableMessage, TableMember, WireBucket, WireCheck, WireDecision,
    encode_frame, encode_gossip, encode_message, encode_replicate, encode_slot_table,
};
use floodgate::{
    Algorithm, BucketKey, BucketState, BucketStore, BucketValue, Decision, Limit, MAX_PERIOD_NS,
    NANOS_PER_SEC, StoreConfig,
};

use floodgate::store::snapshot::{SNAPSHOT_HEADER_BYTES, SNAPSHOT_TRAILER_BYTES, encode_snapshot};

use floodgate::rls::{DescriptorRequest, RequestView};

use crate::bodies::{
    CHECK_TARGET_LIMITS, EXAMPLE_RULES, FRAME_TARGET_MAX_BYTES, Outcome, encode_rls_request,
    reframe,
};

/// One seed: the target it is for, a file name, the bytes, and the outcome it must give.
#[derive(Debug, Clone)]
pub struct Seed {
    pub target: &'static str,
    pub name: &'static str,
    pub bytes: Vec<u8>,
    pub expect: Outcome,
}

const S: u64 = NANOS_PER_SEC;

fn seed(target: &'static str, name: &'static str, bytes: Vec<u8>, expect: Outcome) -> Seed {
    Seed {
        target,
        name,
        bytes,
        expect,
    }
}

fn limit(algorithm: Algorithm, rate: u64, period_ns: u64, burst: u64) -> Limit {
    Limit::new(algorithm, rate, period_ns, burst).expect("seed limits are valid")
}

/// Every seed of every target.
pub fn all() -> Vec<Seed> {
    let mut seeds = Vec::new();
    seeds.extend(frame_seeds());
    seeds.extend(check_batch_seeds());
    seeds.extend(decision_seeds());
    seeds.extend(error_frame_seeds());
    seeds.extend(gossip_seeds());
    seeds.extend(slot_table_seeds());
    seeds.extend(replicate_seeds());
    seeds.extend(policy_seeds());
    seeds.extend(rules_seeds());
    seeds.extend(rate_seeds());
    seeds.extend(resp_seeds());
    seeds.extend(rls_seeds());
    seeds.extend(request_seeds());
    seeds.extend(snapshot_seeds());
    seeds.extend(region_seeds());
    seeds
}

fn region_seeds() -> Vec<Seed> {
    let mut seeds = region_delta_seeds();
    seeds.extend(rlqs_region_seeds());
    seeds.extend(unconfirmed_seeds());
    seeds
}

/// The `region_messages` target's scoped batches, deltas and acknowledgements (tags 0-2).
fn region_delta_seeds() -> Vec<Seed> {
    use Outcome::{Accepted, Refused};
    use floodgate::region::{RegionName, Scope};
    use floodgate::wire::{RegionAckMessage, RegionDeltasMessage, ScopedCheckBatch, WireDelta};
    let tagged = |which: u8, payload: Vec<u8>| [&[which][..], &payload].concat();
    let gcra = limit(Algorithm::Gcra, 10, S, 10);
    let batch = CheckBatch {
        groups: vec![vec![
            WireCheck::new("a", &gcra, 1),
            WireCheck::new("b", &gcra, 1),
        ]],
    };
    let eu = RegionName::new("eu").expect("a valid region");
    let scoped = ScopedCheckBatch::new(batch, &[Scope::Global, Scope::Home(eu)]);
    let delta = |algorithm: u8, rate: u64, burst: u64, units: u64| WireDelta {
        key: 42,
        algorithm,
        rate,
        period_ns: S,
        burst,
        units,
        at_ns: 1_700_000_000 * S,
    };
    let deltas = RegionDeltasMessage {
        region: "us".to_owned(),
        node: "node-1".to_owned(),
        session: 3,
        seq: 1,
        deltas: vec![
            delta(0, 10, 10, 1_000),
            delta(1, 10, 10, 4),
            delta(2, 10, 10, 4),
            delta(3, 10, 10, u64::MAX),
        ],
    };
    let ack = RegionAckMessage {
        region: "us".to_owned(),
        node: "node-1".to_owned(),
        session: 3,
        below: 2,
        also: vec![4, 5],
    };
    let zero_seq = RegionDeltasMessage {
        seq: 0,
        ..deltas.clone()
    };
    vec![
        seed(
            "region_messages",
            "scoped",
            tagged(0, reframe(FrameKind::ScopedCheckBatch, &scoped).to_vec()),
            Accepted,
        ),
        seed(
            "region_messages",
            "deltas",
            tagged(1, reframe(FrameKind::RegionDeltas, &deltas).to_vec()),
            Accepted,
        ),
        seed(
            "region_messages",
            "ack",
            tagged(2, reframe(FrameKind::RegionAck, &ack).to_vec()),
            Accepted,
        ),
        seed(
            "region_messages",
            "zero-seq",
            tagged(1, reframe(FrameKind::RegionDeltas, &zero_seq).to_vec()),
            Refused,
        ),
        seed(
            "region_messages",
            "garbage",
            vec![1, 0xaa, 0xbb, 0xcc],
            Refused,
        ),
        seed("region_messages", "empty", Vec::new(), Refused),
    ]
    .into_iter()
    .chain(compact_delta_seeds())
    .collect()
}

/// The `region_messages` target's deltas in version 13's columns (tag 6): a round of several
/// limits, units and ages, and one whose units and ages run past its deltas.
fn compact_delta_seeds() -> Vec<Seed> {
    use floodgate::BucketKey;
    use floodgate::region::{Delta, DeltaBatch, Peer, RegionName};
    use floodgate::wire::RegionDeltasMessageV13;
    let us = RegionName::new("us").expect("a valid region");
    let limits = [
        limit(Algorithm::Gcra, 10, S, 10),
        limit(Algorithm::FixedWindow, 10, S, 10),
        limit(Algorithm::SlidingLog, 10, S, 10),
    ];
    let batch = DeltaBatch {
        from: Peer::new(us, "node-1"),
        session: 3,
        seq: 2,
        settled_below: Some(1),
        deltas: (0..6u64)
            .map(|i| Delta {
                key: BucketKey::for_key(&i.to_le_bytes()),
                limit: limits[i as usize % 3],
                units: [1, 4, u64::MAX][i as usize % 3],
                at_ns: 1_700_000_000 * S - i * 9_000_000,
            })
            .collect(),
    };
    let compact = RegionDeltasMessageV13::from(&batch);
    let trailing = RegionDeltasMessageV13 {
        units_and_ages: [&compact.units_and_ages[..], &[1, 0]].concat(),
        ..compact.clone()
    };
    let tagged = |message: &RegionDeltasMessageV13| {
        [&[6][..], &reframe(FrameKind::RegionDeltas, message)].concat()
    };
    vec![
        seed(
            "region_messages",
            "compact-deltas",
            tagged(&compact),
            Outcome::Accepted,
        ),
        seed(
            "region_messages",
            "compact-deltas-trailing",
            tagged(&trailing),
            Outcome::Refused,
        ),
    ]
}

/// The `region_messages` target's RLQS region claims and parts (tags 3 and 4).
fn rlqs_region_seeds() -> Vec<Seed> {
    use Outcome::{Accepted, Refused};
    use floodgate::wire::{
        RlqsRegionClaims, RlqsRegionParts, WireRegionClaim, WireRegionPart, WireRlqsBucket,
        WireRlqsEntry,
    };
    let tagged = |which: u8, payload: Vec<u8>| [&[which][..], &payload].concat();
    let bucket = WireRlqsBucket {
        domain: "edge".to_owned(),
        entries: vec![WireRlqsEntry {
            key: "name".to_owned(),
            value: "shared".to_owned(),
        }],
    };
    let claims = RlqsRegionClaims {
        from: "node-1".to_owned(),
        region: "us".to_owned(),
        claims: vec![WireRegionClaim {
            bucket: bucket.clone(),
            requests: 600,
            period_s: 60,
            demand: 420,
            claim: 300,
        }],
    };
    let parts = RlqsRegionParts {
        from: "node-0".to_owned(),
        parts: vec![WireRegionPart { bucket, part: 450 }],
    };
    let bad_region = RlqsRegionClaims {
        region: "us east".to_owned(),
        ..claims.clone()
    };
    vec![
        seed(
            "region_messages",
            "rlqs-claims",
            tagged(3, reframe(FrameKind::RlqsRegionClaims, &claims).to_vec()),
            Accepted,
        ),
        seed(
            "region_messages",
            "rlqs-parts",
            tagged(4, reframe(FrameKind::RlqsRegionParts, &parts).to_vec()),
            Accepted,
        ),
        seed(
            "region_messages",
            "rlqs-claims-bad-region",
            tagged(
                3,
                reframe(FrameKind::RlqsRegionClaims, &bad_region).to_vec(),
            ),
            Refused,
        ),
    ]
}

/// The `region_messages` target's hand-off units (tag 5).
fn unconfirmed_seeds() -> Vec<Seed> {
    use Outcome::{Accepted, Refused};
    let tagged = |which: u8, payload: Vec<u8>| [&[which][..], &payload].concat();
    let unconfirmed = floodgate::wire::RegionUnconfirmedMessage {
        from: "node-0".to_owned(),
        units: vec![floodgate::wire::WireUnconfirmed {
            key: 42,
            region: "us".to_owned(),
            units: 5,
        }],
    };
    let mut zero_units = unconfirmed.clone();
    zero_units.units[0].units = 0;
    vec![
        seed(
            "region_messages",
            "unconfirmed",
            tagged(
                5,
                reframe(FrameKind::RegionUnconfirmed, &unconfirmed).to_vec(),
            ),
            Accepted,
        ),
        seed(
            "region_messages",
            "unconfirmed-zero-units",
            tagged(
                5,
                reframe(FrameKind::RegionUnconfirmed, &zero_units).to_vec(),
            ),
            Refused,
        ),
    ]
}

fn request_seeds() -> Vec<Seed> {
    use Outcome::{Accepted, Refused};
    let request = |peer: u8, lines: &str| [&[peer][..], lines.as_bytes()].concat();
    vec![
        seed(
            "request",
            "hold",
            request(2, "POST\n/v1/events/7/holds\n42"),
            Accepted,
        ),
        seed(
            "request",
            "behind-proxies",
            request(
                0,
                "GET\n/v1/data?x=1\n\nacme\npk_live_acme_7f3a\n\n203.0.113.9, 10.1.1.1\n[2001:db8::1]:443,unknown",
            ),
            Accepted,
        ),
        seed(
            "request",
            "forged-parts",
            request(
                1,
                "get\n//v1/../v1/./%41/%2e%2E/b\nu\u{1f}user:1%\nt\u{1f}\n\nfree\n::ffff:10.0.0.9\n/v1/*/**",
            ),
            Accepted,
        ),
        seed(
            "request",
            "long-user",
            request(0, &format!("POST\n/v1/events/1/holds\n{}", "x".repeat(400))),
            Accepted,
        ),
        seed("request", "empty", Vec::new(), Refused),
    ]
}

/// A lease request, answer and sync in version 10's layouts (128-bit ids).
fn lease_frames_v10() -> Vec<u8> {
    use floodgate::lease::LeaseLimit;
    use floodgate::wire::{
        LeaseAnswer, LeaseAnswerBatch, LeaseRequestBatch, LeaseSyncMessage, WireLease,
        WireLeaseAnswer, WireLeaseRequest, WireLeaseSet, encode_lease_answers,
        encode_lease_requests, encode_lease_sync,
    };
    let version = floodgate::protocol::Feature::WideLeaseIds.since();
    let id = (0xfeed_beef_u128 << 64) | 7;
    let lease_limit = LeaseLimit::new(3, 30 * S).expect("a valid lease limit");
    let mut stream = Vec::new();
    let requests = LeaseRequestBatch {
        requests: vec![
            WireLeaseRequest::acquire("jobs", &lease_limit),
            WireLeaseRequest::release("jobs", id),
        ],
    };
    encode_lease_requests(&mut stream, version, 1, &requests);
    let answers = LeaseAnswerBatch {
        answers: vec![WireLeaseAnswer::from(LeaseAnswer::Granted {
            lease_id: id,
            in_use: 1,
            expires_in_ns: 30 * S,
        })],
        table_version: 3,
    };
    encode_lease_answers(&mut stream, version, 1, &answers);
    let sync = LeaseSyncMessage {
        from: "node-a".to_owned(),
        handoff: false,
        sets: vec![WireLeaseSet {
            key: 7,
            max: 3,
            leases: vec![WireLease {
                id,
                expires_at_ns: 30 * S,
            }],
            released: vec![id ^ 1],
        }],
    };
    encode_lease_sync(&mut stream, version, &sync);
    stream
}

fn frame_seeds() -> Vec<Seed> {
    use Outcome::{Accepted, Refused};
    let gcra = limit(Algorithm::Gcra, 10, S, 10);
    let mut stream = Vec::new();
    let batch = CheckBatch {
        groups: vec![vec![WireCheck::new("api\u{1f}user:42", &gcra, 1)]],
    };
    encode_message(&mut stream, FrameKind::CheckBatch, 1, &batch);
    encode_frame(&mut stream, FrameKind::TableRequest, 2, &[]);
    let decisions = DecisionBatch {
        decisions: vec![WireDecision::error(ErrorCode::StoreFull)],
        table_version: 9,
    };
    encode_message(&mut stream, FrameKind::DecisionBatch, 1, &decisions);
    let mut unknown_kind = stream.clone();
    unknown_kind[3] = 0xee;
    let with_piece = |piece: u8, bytes: &[u8]| [&[piece][..], bytes].concat();

    let mut too_large = Vec::new();
    encode_frame(
        &mut too_large,
        FrameKind::Error,
        5,
        &vec![0; FRAME_TARGET_MAX_BYTES + 1],
    );
    let mut old_version = stream.clone();
    old_version[2] = 0;
    vec![
        seed(
            "frame_reader",
            "lease-frames-v10",
            with_piece(0, &lease_frames_v10()),
            Accepted,
        ),
        seed(
            "frame_reader",
            "three-frames",
            with_piece(0, &stream),
            Accepted,
        ),
        seed(
            "frame_reader",
            "three-frames-in-7s",
            with_piece(6, &stream),
            Accepted,
        ),
        seed(
            "frame_reader",
            "unknown-kind-then-frames",
            with_piece(3, &unknown_kind),
            Accepted,
        ),
        seed(
            "frame_reader",
            "truncated",
            with_piece(31, &stream[..stream.len() - 3]),
            Accepted,
        ),
        seed("frame_reader", "empty", Vec::new(), Refused),
        seed(
            "frame_reader",
            "bad-magic",
            with_piece(1, b"GF\x01\x01"),
            Refused,
        ),
        seed(
            "frame_reader",
            "old-version",
            with_piece(2, &old_version),
            Refused,
        ),
        seed(
            "frame_reader",
            "too-large",
            with_piece(0, &too_large),
            Refused,
        ),
    ]
}

// A list of seeds, one case each: long on purpose, so the cases read side by side.
/// A table of seeds, one entry per case, sharing the fixtures above them: split, the cases would
/// only be scattered.
fn check_batch_seeds() -> Vec<Seed> {
    use Outcome::{Accepted, Refused};
    let gcra = limit(Algorithm::Gcra, 10, S, 20);
    let fixed = limit(Algorithm::FixedWindow, 100, 60 * S, 100);
    let sliding = limit(Algorithm::SlidingWindow, 5, 10 * S, 5);
    let log = limit(Algorithm::SlidingLog, 3, S, 3);
    let encode = |groups: Vec<Vec<WireCheck>>| {
        reframe(FrameKind::CheckBatch, &CheckBatch { groups }).to_vec()
    };
    // Packed with an empty group's worth of structure: a check that belongs to no group.
    let mut no_group_start = PackedBatch::pack(&CheckBatch {
        groups: vec![vec![WireCheck::new("a", &gcra, 1)]],
    })
    .expect("a batch of one group packs");
    no_group_start.checks[0].flags = 0;
    let takeover = WireCheck {
        takeover: true,
        ..WireCheck::new("b", &gcra, 2)
    };
    let every_algorithm = vec![
        vec![
            WireCheck::new("a", &gcra, 1),
            WireCheck::new("b", &fixed, 0),
        ],
        vec![WireCheck::new("c", &sliding, 5)],
        vec![WireCheck::new("", &log, 4), takeover],
    ];
    let refunds = vec![vec![
        WireCheck::refund("a", &gcra, 1),
        WireCheck::refund("b", &log, 1),
    ]];
    let mixed = vec![vec![
        WireCheck::refund("a", &gcra, 1),
        WireCheck::new("b", &gcra, 1),
    ]];
    let long_key = vec![vec![WireCheck::new(
        vec![b'k'; CHECK_TARGET_LIMITS.max_key_bytes + 1],
        &gcra,
        1,
    )]];
    let bad_algorithm = vec![vec![WireCheck {
        algorithm: 4,
        ..WireCheck::new("a", &gcra, 1)
    }]];
    let zero_rate = vec![vec![WireCheck {
        rate: 0,
        ..WireCheck::new("a", &gcra, 1)
    }]];
    let too_many = vec![vec![
        WireCheck::new("a", &gcra, 1);
        CHECK_TARGET_LIMITS.max_batch + 1
    ]];
    // One key under several limits, as a client may send after a rule change (or on purpose).
    let one_key_many_limits = |algorithm| {
        [(1, 1_000_000), (1, MAX_PERIOD_NS), (1_000, 3_600 * S)]
            .into_iter()
            .map(|(rate, period)| {
                vec![WireCheck::new(
                    "k",
                    &limit(algorithm, rate, period, rate),
                    1,
                )]
            })
            .collect::<Vec<_>>()
    };
    let decide =
        |step: u8, groups: &Vec<Vec<WireCheck>>| [vec![step], encode(groups.clone())].concat();
    let mut seeds = vec![
        seed(
            "check_batch_decide",
            "every-algorithm",
            decide(30, &every_algorithm),
            Accepted,
        ),
        seed(
            "check_batch_decide",
            "refunds",
            decide(0, &refunds),
            Accepted,
        ),
        seed(
            "check_batch_decide",
            "gcra-limits",
            decide(1, &one_key_many_limits(Algorithm::Gcra)),
            Accepted,
        ),
        seed(
            "check_batch_decide",
            "fixed-limits",
            decide(1, &one_key_many_limits(Algorithm::FixedWindow)),
            Accepted,
        ),
        seed(
            "check_batch_decide",
            "sliding-limits",
            decide(1, &one_key_many_limits(Algorithm::SlidingWindow)),
            Accepted,
        ),
        seed(
            "check_batch_decide",
            "log-limits",
            decide(1, &one_key_many_limits(Algorithm::SlidingLog)),
            Accepted,
        ),
        seed(
            "check_batch_decide",
            "mixed-refund",
            decide(0, &mixed),
            Refused,
        ),
        seed("check_batch_decide", "empty", Vec::new(), Refused),
    ];
    seeds.extend([
        seed(
            "check_batch",
            "every-algorithm",
            encode(every_algorithm),
            Accepted,
        ),
        seed("check_batch", "refunds", encode(refunds), Accepted),
        seed("check_batch", "no-groups", encode(Vec::new()), Accepted),
        seed(
            "check_batch",
            "first-check-starts-no-group",
            reframe(FrameKind::CheckBatch, &no_group_start).to_vec(),
            Refused,
        ),
        seed("check_batch", "mixed-refund", encode(mixed), Refused),
        seed("check_batch", "long-key", encode(long_key), Refused),
        seed(
            "check_batch",
            "unknown-algorithm",
            encode(bad_algorithm),
            Refused,
        ),
        seed("check_batch", "zero-rate", encode(zero_rate), Refused),
        seed("check_batch", "too-many", encode(too_many), Refused),
        seed("check_batch", "garbage", vec![0xff; 24], Refused),
    ]);
    seeds
}

fn decision_seeds() -> Vec<Seed> {
    use Outcome::{Accepted, Refused};
    let decisions = vec![
        WireDecision::from(Decision::Allowed {
            remaining: 3,
            reset_after_ns: S,
        }),
        WireDecision::from(Decision::Denied {
            remaining: 0,
            retry_after_ns: 100,
            reset_after_ns: 2 * S,
        }),
        WireDecision::from(Decision::CostExceedsBurst { burst: 10 }),
        WireDecision::error(ErrorCode::NotOwner),
        WireDecision {
            outcome: 9,
            ..WireDecision::default()
        },
    ];
    let encode = |decisions: Vec<WireDecision>, table_version| {
        reframe(
            FrameKind::DecisionBatch,
            &DecisionBatch {
                decisions,
                table_version,
            },
        )
        .to_vec()
    };
    vec![
        seed(
            "decision_batch",
            "each-outcome",
            encode(decisions, 42),
            Accepted,
        ),
        seed("decision_batch", "empty", encode(Vec::new(), 0), Accepted),
        seed("decision_batch", "short", vec![0; 4], Refused),
        seed(
            "decision_batch",
            "unknown-outcome",
            reframe(
                FrameKind::DecisionBatch,
                &PackedDecisions {
                    outcomes: vec![4],
                    ..PackedDecisions::default()
                },
            )
            .to_vec(),
            Refused,
        ),
    ]
}

fn error_frame_seeds() -> Vec<Seed> {
    use Outcome::{Accepted, Refused};
    let encode = |code: u16, message: &str| {
        reframe(
            FrameKind::Error,
            &ErrorFrame {
                code,
                message: message.to_owned(),
            },
        )
        .to_vec()
    };
    vec![
        seed(
            "error_frame",
            "too-large",
            encode(
                ErrorCode::FrameTooLarge as u16,
                "frame of 9 bytes exceeds the maximum of 8",
            ),
            Accepted,
        ),
        seed("error_frame", "unknown-code", encode(999, "é ✓"), Accepted),
        seed(
            "error_frame",
            "empty-message",
            encode(ErrorCode::Overloaded as u16, ""),
            Accepted,
        ),
        seed(
            "error_frame",
            "garbage",
            vec![1, 2, 3, 4, 5, 6, 7, 8, 9],
            Refused,
        ),
    ]
}

fn member(id: &str, incarnation: u64, heartbeat: u64, left: bool) -> MemberDigest {
    MemberDigest {
        info: MemberInfo {
            id: id.to_owned(),
            addr: format!("127.0.0.1:{}", 7100 + id.len()),
            region: "eu".to_owned(),
        },
        incarnation,
        heartbeat,
        left,
        versions: floodgate::protocol::VersionRange::new(2, 3),
        joining: false,
    }
}

/// The payload of the frame `encode` writes.
fn payload_of(encode: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut bytes = Vec::new();
    encode(&mut bytes);
    bytes[floodgate::wire::HEADER_BYTES..].to_vec()
}

fn gossip_seeds() -> Vec<Seed> {
    use Outcome::{Accepted, Refused};
    // Version 2's layout (the seeds from before ranges), and version 3's.
    let encode_in = |version: u8, members: Vec<MemberDigest>| {
        payload_of(|out| encode_gossip(out, version, &Gossip { members }))
    };
    let encode = |members| encode_in(2, members);
    let view = vec![
        member("me", 5, 5, false),
        member("node-1", 1, 10, false),
        member("node-2", 2, 0, true),
        member("node-1", 2, 0, false),
    ];
    let crowd = (0..12)
        .map(|i| {
            member(
                ["a", "bb", "ccc", "dddd"][i % 4],
                i as u64,
                u64::MAX - i as u64,
                i % 3 == 0,
            )
        })
        .collect();
    // One digest's field set to what a receiver refuses (the message is refused whole).
    let with = |set: fn(&mut MemberInfo)| {
        let mut digests = vec![member("node-1", 1, 1, false), member("node-2", 1, 1, false)];
        set(&mut digests[1].info);
        digests
    };
    let too_many = (0..=floodgate::wire::MAX_GOSSIP_DIGESTS)
        .map(|i| member(&format!("n{i}"), 1, 1, false))
        .collect();
    vec![
        seed("gossip", "view-v3", encode_in(3, view.clone()), Accepted),
        seed("gossip", "view", encode(view), Accepted),
        seed("gossip", "crowd", encode(crowd), Accepted),
        seed("gossip", "empty", encode(Vec::new()), Accepted),
        seed("gossip", "garbage", vec![0xaa; 32], Refused),
        seed(
            "gossip",
            "long-id-v3",
            encode_in(3, with(|i| i.id = "x".repeat(257))),
            Refused,
        ),
        seed(
            "gossip",
            "empty-id",
            encode(with(|i| i.id.clear())),
            Refused,
        ),
        seed(
            "gossip",
            "empty-addr-v3",
            encode_in(3, with(|i| i.addr.clear())),
            Refused,
        ),
        seed(
            "gossip",
            "long-addr",
            encode(with(|i| i.addr = "1".repeat(257))),
            Refused,
        ),
        seed(
            "gossip",
            "bad-region-v3",
            encode_in(3, with(|i| i.region = "eu west".to_owned())),
            Refused,
        ),
        seed(
            "gossip",
            "no-region",
            encode(with(|i| i.region.clear())),
            Refused,
        ),
        seed("gossip", "too-many", encode(too_many), Refused),
    ]
}

/// The slot table message a node sends for these members (the node builds it the same way).
fn table_message(nodes: &[String]) -> SlotTableMessage {
    let table = SlotTable::compute(3, nodes);
    let index = |node: Option<&str>| {
        node.and_then(|n| table.nodes().iter().position(|m| m == n))
            .map_or(u16::MAX, |i| i as u16)
    };
    SlotTableMessage {
        version: table.version(),
        epoch: table.epoch(),
        from: nodes.first().cloned().unwrap_or_default(),
        members: table
            .nodes()
            .iter()
            .map(|id| TableMember {
                id: id.clone(),
                addr: "127.0.0.1:7100".to_owned(),
                region: String::new(),
                state: 0,
                versions: floodgate::protocol::VersionRange::new(2, 3),
            })
            .collect(),
        owners: (0..SLOTS as u16).map(|s| index(table.owner(s))).collect(),
        successors: (0..SLOTS as u16)
            .map(|s| index(table.successor(s)))
            .collect(),
        cluster_version: 3,
    }
}

fn slot_table_seeds() -> Vec<Seed> {
    use Outcome::{Accepted, Refused};
    let encode_in = |version: u8, message: &SlotTableMessage| {
        payload_of(|out| encode_slot_table(out, version, 7, message))
    };
    let encode = |message: &SlotTableMessage| encode_in(2, message);
    let three = table_message(&[
        "node-0".to_owned(),
        "node-1".to_owned(),
        "node-2".to_owned(),
    ]);
    let mut dangling = three.clone();
    dangling.owners[17] = 3;
    let mut short = three.clone();
    short.successors.pop();
    vec![
        seed("slot_table", "three-nodes", encode(&three), Accepted),
        seed(
            "slot_table",
            "three-nodes-v3",
            encode_in(3, &three),
            Accepted,
        ),
        seed(
            "slot_table",
            "no-nodes",
            encode(&table_message(&[])),
            Accepted,
        ),
        seed("slot_table", "dangling-owner", encode(&dangling), Refused),
        seed("slot_table", "short", encode(&short), Refused),
    ]
}

/// Buckets of every algorithm as a real store exports them after a few checks.
fn exported_buckets() -> Vec<BucketState> {
    let store = BucketStore::new(StoreConfig {
        max_keys: 64,
        shards: 2,
    })
    .expect("a valid store config");
    let now = 1_000 * S;
    let limits = [
        limit(Algorithm::Gcra, 10, S, 5),
        limit(Algorithm::FixedWindow, 4, S, 4),
        limit(Algorithm::SlidingWindow, 3, 10 * S, 3),
        limit(Algorithm::SlidingLog, 2, S, 2),
    ];
    for (i, l) in limits.iter().enumerate() {
        for n in 0..3u64 {
            let key = BucketKey::for_key(format!("rule\u{1f}user:{i}").as_bytes());
            let _ = store.check(key, l, 1, now + n * 1_000_000);
        }
    }
    let mut out = Vec::new();
    store.export(now + 5_000_000, &|_| true, &mut out);
    out
}

/// Replicate payloads in version 12's layout (GCRA buckets as columns): a node's exported
/// buckets as a hand-off, and columns of unequal length.
fn compact_replicate_seeds() -> Vec<(&'static str, Vec<u8>, Outcome)> {
    let version = floodgate::protocol::Feature::CompactReplicas.since();
    let handoff = HandoffPart {
        id: 7,
        part: 0,
        parts: 1,
        slots: vec![0, 4095],
    };
    let mut frame = Vec::new();
    encode_replicate(
        &mut frame,
        version,
        "node-1",
        Some(handoff),
        &exported_buckets(),
    );
    let payload = frame[HEADER_BYTES..].to_vec();
    // A key hash and an arrival time, but no check or margin for them.
    let unequal = ReplicateMessageV12 {
        gcra_key_hashes: vec![1],
        gcra_tats_ns: vec![5],
        ..ReplicateMessageV12::default()
    };
    vec![
        ("compact-handoff", payload, Outcome::Accepted),
        (
            "compact-unequal-columns",
            reframe(FrameKind::Replicate, &unequal).to_vec(),
            Outcome::Refused,
        ),
    ]
}

// A list of seeds, one case each: long on purpose, so the cases read side by side.
/// A table of seeds, one entry per case, sharing the fixtures above them: split, the cases would
/// only be scattered.
fn replicate_seeds() -> Vec<Seed> {
    use Outcome::{Accepted, Refused};
    let encode = |message: &ReplicateMessage| reframe(FrameKind::Replicate, message).to_vec();
    let buckets: Vec<WireBucket> = exported_buckets().iter().map(WireBucket::from).collect();
    let replicas = ReplicateMessage {
        from: "node-1".to_owned(),
        handoff: None,
        buckets: buckets.clone(),
    };
    let handoff = ReplicateMessage {
        from: "node-2".to_owned(),
        handoff: Some(HandoffPart {
            id: 7,
            part: 1,
            parts: 2,
            slots: vec![0, 1, 4095],
        }),
        buckets,
    };
    // A peer's window ahead of now with counts far over the limit: merged clamped.
    let window_ahead = ReplicateMessage {
        buckets: vec![WireBucket {
            key: 99,
            algorithm: 2,
            rate: 5,
            period_ns: S,
            burst: 5,
            window: u64::MAX,
            count: u64::MAX,
            previous: u64::MAX,
            ..WireBucket::default()
        }],
        ..ReplicateMessage::default()
    };
    // A log whose admissions lie in the future and out of order.
    let log_future = ReplicateMessage {
        buckets: vec![WireBucket {
            key: 7 << 64,
            algorithm: 3,
            rate: 3,
            period_ns: S,
            burst: 3,
            times_ns: vec![u64::MAX, 0, 1_000 * S],
            ..WireBucket::default()
        }],
        ..ReplicateMessage::default()
    };
    let mut bad_part = handoff.clone();
    bad_part.handoff.as_mut().expect("a hand-off").part = 2;
    let mut bad_slot = handoff.clone();
    bad_slot
        .handoff
        .as_mut()
        .expect("a hand-off")
        .slots
        .push(SLOTS as u16);
    // GCRA arrival times: far ahead of any limit (accepted; waits long), and past the bound.
    let tat = |tat_ns| ReplicateMessage {
        buckets: vec![WireBucket {
            key: 0xfeed << 64 | 0xbeef,
            algorithm: 0,
            tat_ns,
            margin_ms: 1_000,
            ..WireBucket::default()
        }],
        ..ReplicateMessage::default()
    };
    // Longer than twice its limit of 3 (one limit owed).
    let long_log = ReplicateMessage {
        buckets: vec![WireBucket {
            times_ns: vec![1; 7],
            ..log_future.buckets[0].clone()
        }],
        ..ReplicateMessage::default()
    };
    let compact = compact_replicate_seeds();
    let mut seeds = Vec::new();
    for target in ["replicate", "replicate_merge"] {
        seeds.extend(
            compact
                .iter()
                .map(|(name, bytes, expect)| seed(target, name, bytes.clone(), *expect)),
        );
        seeds.extend([
            seed(target, "replicas", encode(&replicas), Accepted),
            seed(target, "handoff", encode(&handoff), Accepted),
            seed(target, "window-ahead", encode(&window_ahead), Accepted),
            seed(target, "log-future", encode(&log_future), Accepted),
            seed(target, "bad-part", encode(&bad_part), Refused),
            seed(target, "bad-slot", encode(&bad_slot), Refused),
            seed(target, "long-log", encode(&long_log), Refused),
            seed(
                target,
                "tat-far-ahead",
                encode(&tat(MAX_WIRE_TAT_NS)),
                Accepted,
            ),
            seed(
                target,
                "tat-past-bound",
                encode(&tat(MAX_WIRE_TAT_NS + 1)),
                Refused,
            ),
        ]);
    }
    seeds
}

fn policy_seeds() -> Vec<Seed> {
    use Outcome::{Accepted, Refused};
    let request = |version: &str| {
        reframe(
            FrameKind::PolicyRequest,
            &PolicyRequest {
                version: version.to_owned(),
            },
        )
        .to_vec()
    };
    let message = |version: &str, text: &str| {
        reframe(
            FrameKind::Policy,
            &PolicyMessage {
                version: version.to_owned(),
                text: text.to_owned(),
            },
        )
        .to_vec()
    };
    let long = "v".repeat(129);
    vec![
        seed("policy_request", "none", request(""), Accepted),
        seed(
            "policy_request",
            "version",
            request("0123456789abcdef"),
            Accepted,
        ),
        seed("policy_request", "long-version", request(&long), Refused),
        seed(
            "policy_message",
            "example",
            message("0123456789abcdef", EXAMPLE_RULES),
            Accepted,
        ),
        seed(
            "policy_message",
            "unchanged",
            message("0123456789abcdef", ""),
            Accepted,
        ),
        seed(
            "policy_message",
            "bad-rules",
            message("1", "rules: [1"),
            Accepted,
        ),
        seed(
            "policy_message",
            "long-version",
            message(&long, "rules: []\n"),
            Refused,
        ),
    ]
}

fn rules_seeds() -> Vec<Seed> {
    use Outcome::{Accepted, Refused};
    let text = |s: &str| s.as_bytes().to_vec();
    let minimal = "rules:\n  - name: api\n    path: /**\n    key: ip\n    limit: 10/s\n";
    let priority = "priority:\n  header: false\n  routes:\n    - { method: POST, path: /v1/auth/**, class: critical }\n    - { path: /, class: sheddable }\n  default: default\nrules:\n  - name: w\n    path: /**\n    key: global\n    concurrency: 7\n    reserve: { critical: 12.5%, default: 30% }\n  - name: r\n    path: /**\n    key: ip\n    limit: 3/s\n    algorithm: sliding-window\n    reserve: { critical: 99% }\n";
    let reserve = |limit: &str, reserve: &str| {
        format!(
            "rules:\n  - name: x\n    path: /**\n    key: ip\n    {limit}\n    reserve: {reserve}\n"
        )
    };
    let composite = "plans: [free]\nrules:\n  - name: x\n    method: [GET, post]\n    path: /v1/*/y\n    key: [user, endpoint, plan]\n    plans:\n      free: {limit: 3/min, algorithm: sliding-log}\n    cost: 2\n    mode: shadow\n";
    vec![
        seed("rules_yaml", "example", text(EXAMPLE_RULES), Accepted),
        seed("rules_yaml", "minimal", text(minimal), Accepted),
        seed("rules_yaml", "composite", text(composite), Accepted),
        seed("rules_yaml", "tab", text("rules:\n\t- name: a\n"), Refused),
        seed(
            "rules_yaml",
            "unknown-field",
            text("rules: []\nextra: 1\n"),
            Refused,
        ),
        seed(
            "rules_yaml",
            "anchors",
            text("a: &x [*x]\nrules: *x\n"),
            Refused,
        ),
        seed("rules_yaml", "priority", text(priority), Accepted),
        seed(
            "rules_yaml",
            "reserve-sheddable",
            text(&reserve("concurrency: 4", "{ sheddable: 10% }")),
            Refused,
        ),
        seed(
            "rules_yaml",
            "reserve-whole",
            text(&reserve(
                "limit: 10/s\n    algorithm: fixed-window",
                "{ critical: 60%, default: 40% }",
            )),
            Refused,
        ),
        seed(
            "rules_yaml",
            "reserve-gcra",
            text(&reserve("limit: 10/s", "{ critical: 20% }")),
            Refused,
        ),
        seed(
            "rules_yaml",
            "priority-unknown-class",
            text("priority:\n  default: urgent\nrules: []\n"),
            Refused,
        ),
    ]
}

fn rate_seeds() -> Vec<Seed> {
    use Outcome::{Accepted, Refused};
    let text = |s: &str| s.as_bytes().to_vec();
    vec![
        seed("rate_text", "per-second", text("10/s"), Accepted),
        seed("rate_text", "per-ten-seconds", text("5/10s"), Accepted),
        seed("rate_text", "decimal", text("1.5min"), Accepted),
        seed("rate_text", "micro", text("250µs"), Accepted),
        seed("rate_text", "huge", text("18446744073709551615d"), Refused),
        seed("rate_text", "no-count", text("/s"), Refused),
        seed("rate_text", "dot", text("."), Refused),
    ]
}

/// The `rls_request` target's requests: its first byte is `0x0f` (16 descriptors at most,
/// negative hits off) unless a seed says otherwise.
fn rls_seeds() -> Vec<Seed> {
    use Outcome::{Accepted, Refused};
    let descriptor = |entries: &[(&'static str, &'static str)]| DescriptorRequest {
        entries: entries.to_vec(),
        ..DescriptorRequest::default()
    };
    let request = |first: u8, descriptors: Vec<DescriptorRequest<'static>>| {
        let mut bytes = vec![first];
        bytes.extend(encode_rls_request(&RequestView {
            domain: "edge",
            descriptors,
            hits_addend: 0,
        }));
        bytes
    };
    let nested = descriptor(&[("destination", "db"), ("source", "internal")]);
    let overridden = DescriptorRequest {
        limit_override: Some((7, 2)),
        hits_addend: Some(3),
        ..descriptor(&[("remote_address", "10.0.0.1")])
    };
    let refund = DescriptorRequest {
        negative_hits: true,
        ..descriptor(&[("remote_address", "10.0.0.1")])
    };
    let metered_peek = DescriptorRequest {
        hits_addend: Some(0),
        ..descriptor(&[("tokens", "tenant-a")])
    };
    let one = request(0x0f, vec![descriptor(&[("remote_address", "10.0.0.1")])]);
    // Unknown fields of every wire type, and a group, after the request's own.
    let mut unknown = one.clone();
    unknown.extend_from_slice(&[0x20, 0x01, 0x29, 0, 0, 0, 0, 0, 0, 0, 0, 0x35, 0, 0, 0, 0]);
    unknown.extend_from_slice(&[0x3b, 0x08, 0x01, 0x3c]);
    vec![
        seed("rls_request", "one", one.clone(), Accepted),
        seed(
            "rls_request",
            "several",
            request(
                0x0f,
                vec![
                    descriptor(&[("generic_key", "slow")]),
                    nested,
                    descriptor(&[("user", "admin")]),
                    overridden.clone(),
                    overridden,
                    metered_peek,
                    descriptor(&[("unknown", "x")]),
                ],
            ),
            Accepted,
        ),
        seed(
            "rls_request",
            "refund-on",
            request(0x1f, vec![refund.clone()]),
            Accepted,
        ),
        seed(
            "rls_request",
            "refund-off",
            request(0x0f, vec![refund]),
            Accepted,
        ),
        seed("rls_request", "unknown-fields", unknown, Accepted),
        seed(
            "rls_request",
            "too-many",
            request(
                0x00,
                vec![descriptor(&[("a", "b")]), descriptor(&[("c", "d")])],
            ),
            Refused,
        ),
        seed(
            "rls_request",
            "no-entries",
            request(0x0f, vec![descriptor(&[])]),
            Refused,
        ),
        seed("rls_request", "cut", one[..one.len() - 3].to_vec(), Refused),
    ]
}

fn resp_seeds() -> Vec<Seed> {
    use Outcome::{Accepted, Refused};
    let text = |s: &str| s.as_bytes().to_vec();
    vec![
        seed(
            "resp_command",
            "throttle",
            text(
                "*6\r\n$11\r\nCL.THROTTLE\r\n$4\r\nuser\r\n$2\r\n15\r\n$2\r\n30\r\n$2\r\n60\r\n$1\r\n1\r\n",
            ),
            Accepted,
        ),
        seed(
            "resp_command",
            "pipeline",
            text(
                "*1\r\n$4\r\nPING\r\n*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\n*0\r\nPING\r\n\r\n*1\r\n$4\r\nPI",
            ),
            Accepted,
        ),
        seed(
            "resp_command",
            "inline",
            text("HELLO 3 AUTH default secret\r\n"),
            Accepted,
        ),
        seed("resp_command", "bad-length", text("*1\r\n$-5\r\n"), Refused),
        seed("resp_command", "too-many-args", text("*9\r\n"), Refused),
        seed("resp_command", "not-a-bulk", text("*1\r\n:1\r\n"), Refused),
    ]
}

/// A snapshot file of `buckets` written at `written_unix_ns`, as a node writes it.
fn snapshot_file(buckets: &[BucketState], written_unix_ns: u64) -> Vec<u8> {
    let mut out = Vec::new();
    encode_snapshot(buckets, written_unix_ns, &mut out);
    out
}

/// Where the first entry of a snapshot file starts, and within it the algorithm tag.
const FIRST_ENTRY_TAG_AT: usize = SNAPSHOT_HEADER_BYTES + 8 + 4;

// A list of seeds, one case each: long on purpose, so the cases read side by side.
/// A table of seeds, one entry per case, sharing the fixtures above them: split, the cases would
/// only be scattered.
fn snapshot_seeds() -> Vec<Seed> {
    use Outcome::{Accepted, Refused};
    let written = 1_000 * S;
    let exported = exported_buckets();
    let valid = snapshot_file(&exported, written);
    let key = |n: &str| BucketKey::for_key(n.as_bytes());
    // Long-period buckets as a node keeps them, with states far ahead of the write time.
    let hour = 3_600 * S;
    let far = vec![
        BucketState {
            key: key("gcra-far"),
            value: BucketValue::Gcra {
                tat_ns: u64::MAX,
                margin_ms: u32::MAX,
            },
        },
        BucketState {
            key: key("window-far"),
            value: BucketValue::Window {
                limit: limit(Algorithm::SlidingWindow, 100, hour, 100),
                state: WindowState {
                    window: u64::MAX,
                    count: u64::MAX,
                    previous: u64::MAX,
                },
            },
        },
        BucketState {
            key: key("log-far"),
            value: BucketValue::Log {
                limit: limit(Algorithm::SlidingLog, 3, MAX_PERIOD_NS, 3),
                times_ns: vec![0, written, u64::MAX],
            },
        },
    ];
    let far_file = snapshot_file(&far, written);
    let empty = snapshot_file(&[], written);

    let with = |mut bytes: Vec<u8>, at: usize, new: &[u8]| {
        bytes[at..at + new.len()].copy_from_slice(new);
        bytes
    };
    // The checksum is rewritten by the bodies before decoding, so a stale one still decodes.
    let stale_checksum = {
        let at = valid.len() - SNAPSHOT_TRAILER_BYTES;
        with(valid.clone(), at, &[0; 8])
    };
    let bad_magic = with(valid.clone(), 0, b"FGSNAPx\n");
    let newer = with(valid.clone(), 8, &2u16.to_le_bytes());
    let version_zero = with(valid.clone(), 8, &0u16.to_le_bytes());
    let reserved = with(valid.clone(), 10, &1u16.to_le_bytes());
    let too_many = with(valid.clone(), 12, &u32::MAX.to_le_bytes());
    let zero_hash = with(valid.clone(), SNAPSHOT_HEADER_BYTES, &[0; 8]);
    let unknown_algorithm = with(valid.clone(), FIRST_ENTRY_TAG_AT, &[9]);
    let log_backwards = snapshot_file(
        &[BucketState {
            key: key("log-backwards"),
            value: BucketValue::Log {
                limit: limit(Algorithm::SlidingLog, 3, hour, 3),
                times_ns: vec![written, 1],
            },
        }],
        written,
    );
    let mut trailing = valid.clone();
    trailing.truncate(trailing.len() - SNAPSHOT_TRAILER_BYTES);
    trailing.extend_from_slice(&[0; 3 + SNAPSHOT_TRAILER_BYTES]);

    let mut seeds = vec![
        seed("snapshot", "exported", valid.clone(), Accepted),
        seed("snapshot", "far-ahead", far_file.clone(), Accepted),
        seed("snapshot", "empty", empty.clone(), Accepted),
        seed("snapshot", "stale-checksum", stale_checksum, Accepted),
        seed("snapshot", "truncated", valid[..20].to_vec(), Refused),
        seed("snapshot", "bad-magic", bad_magic, Refused),
        seed("snapshot", "newer-version", newer, Refused),
        seed("snapshot", "version-zero", version_zero, Refused),
        seed("snapshot", "reserved-set", reserved, Refused),
        seed("snapshot", "too-many", too_many, Refused),
        seed("snapshot", "zero-hash", zero_hash, Refused),
        seed("snapshot", "unknown-algorithm", unknown_algorithm, Refused),
        seed("snapshot", "log-backwards", log_backwards, Refused),
        seed("snapshot", "trailing-bytes", trailing, Refused),
    ];
    // The first byte picks how long after the write time the snapshot is loaded.
    let later = |offset: u8, file: &[u8]| [&[offset][..], file].concat();
    seeds.extend([
        seed("snapshot_merge", "exported-now", later(0, &valid), Accepted),
        seed(
            "snapshot_merge",
            "exported-later",
            later(33, &valid),
            Accepted,
        ),
        seed("snapshot_merge", "far-ahead", later(0, &far_file), Accepted),
        seed("snapshot_merge", "empty", later(5, &empty), Accepted),
        seed("snapshot_merge", "no-offset", Vec::new(), Refused),
        seed(
            "snapshot_merge",
            "truncated",
            later(0, &valid[..20]),
            Refused,
        ),
    ]);
    seeds
}
