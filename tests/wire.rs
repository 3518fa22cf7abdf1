//! The wire protocol refuses hostile bytes with the documented code and never panics
//! (limits on everything from outside; docs/PROTOCOL.md).

use floodgate::wire::{
    BASE_LAYOUT, CheckBatch, DecisionBatch, ErrorCode, FrameKind, FrameReader, HEADER_BYTES,
    PackedBatch, WireCheck, WireDecision, WireLimits, decode_check_batch, decode_decision_batch,
    encode_frame, encode_message, encode_message_at,
};
use floodgate::{Algorithm, Decision, Limit, NANOS_PER_SEC};
use proptest::prelude::*;

const MAX_FRAME: usize = 64 * 1024;

fn batch(keys: &[&str]) -> CheckBatch {
    let limit = Limit::gcra(10, NANOS_PER_SEC, 10).unwrap();
    CheckBatch {
        groups: keys
            .iter()
            .map(|k| vec![WireCheck::new(k.as_bytes(), &limit, 1)])
            .collect(),
    }
}

fn one_frame(bytes: &[u8]) -> Result<Option<floodgate::wire::Frame>, floodgate::wire::FrameError> {
    let mut reader = FrameReader::new(MAX_FRAME);
    reader.extend(bytes);
    reader.next_frame()
}

#[test]
fn a_check_batch_round_trips_byte_by_byte() {
    let mut bytes = Vec::new();
    encode_message(&mut bytes, FrameKind::CheckBatch, 7, &batch(&["a", "b"]));
    encode_message(&mut bytes, FrameKind::CheckBatch, 8, &batch(&["c"]));
    let mut reader = FrameReader::new(MAX_FRAME);
    let mut frames = Vec::new();
    // Fed one byte at a time, as the worst network would deliver it.
    for byte in &bytes {
        reader.extend(std::slice::from_ref(byte));
        while let Some(frame) = reader.next_frame().unwrap() {
            frames.push(frame);
        }
    }
    reader.finish().unwrap();
    assert_eq!(frames.len(), 2);
    assert_eq!(
        (frames[0].kind, frames[0].request_id, frames[1].request_id),
        (FrameKind::CheckBatch, 7, 8)
    );
    let groups = decode_check_batch(&frames[0].payload, &WireLimits::default()).unwrap();
    assert_eq!(groups.len(), 2);
    assert_eq!(groups[0][0].cost, 1);
    assert_eq!(
        groups[0][0].limit,
        Limit::gcra(10, NANOS_PER_SEC, 10).unwrap()
    );
}

#[test]
fn decisions_round_trip() {
    let decisions = [
        Decision::Allowed {
            remaining: 3,
            reset_after_ns: 5,
        },
        Decision::Denied {
            remaining: 0,
            retry_after_ns: 9,
            reset_after_ns: 11,
        },
        Decision::CostExceedsBurst { burst: 4 },
    ];
    let mut wire: Vec<WireDecision> = decisions.iter().map(|&d| d.into()).collect();
    wire.push(WireDecision::error(ErrorCode::StoreFull));
    let mut bytes = Vec::new();
    encode_message(
        &mut bytes,
        FrameKind::DecisionBatch,
        1,
        &DecisionBatch {
            decisions: wire,
            table_version: 0,
        },
    );
    let frame = one_frame(&bytes).unwrap().unwrap();
    let back = decode_decision_batch(&frame.payload).unwrap();
    for (sent, got) in decisions.iter().zip(&back) {
        assert_eq!(got.to_decision(), Ok(*sent));
    }
    assert_eq!(back[3].to_decision(), Err(ErrorCode::StoreFull));
}

#[test]
fn framing_errors_carry_their_codes() {
    assert_eq!(
        one_frame(b"GET / HTTP/1.1\r\n").unwrap_err().code,
        ErrorCode::BadMagic
    );
    let mut wrong_version = Vec::new();
    encode_frame(&mut wrong_version, FrameKind::CheckBatch, 1, b"");
    wrong_version[2] = floodgate::protocol::NEWEST + 1;
    assert_eq!(
        one_frame(&wrong_version).unwrap_err().code,
        ErrorCode::UnsupportedVersion
    );
    let mut oversized = Vec::new();
    encode_frame(&mut oversized, FrameKind::CheckBatch, 1, b"");
    oversized[4..8].copy_from_slice(&(MAX_FRAME as u32 + 1).to_le_bytes());
    assert_eq!(
        one_frame(&oversized).unwrap_err().code,
        ErrorCode::FrameTooLarge
    );
    let mut truncated = Vec::new();
    encode_message(&mut truncated, FrameKind::CheckBatch, 1, &batch(&["a"]));
    truncated.truncate(truncated.len() - 3);
    let mut reader = FrameReader::new(MAX_FRAME);
    reader.extend(&truncated);
    assert!(reader.next_frame().unwrap().is_none());
    assert_eq!(reader.finish().unwrap_err().code, ErrorCode::Truncated);
    let mut unknown = Vec::new();
    encode_frame(&mut unknown, FrameKind::CheckBatch, 4, b"xx");
    unknown[3] = 200;
    let err = one_frame(&unknown).unwrap_err();
    assert_eq!(
        (err.code, err.request_id, err.code.closes_stream()),
        (ErrorCode::UnknownKind, 4, false)
    );
}

/// A receiver's caps on what a caller's limit may cost: a period or a sliding log past them is
/// refused as `invalid_limit`, in words that name the flag; at the cap it passes.
#[test]
fn limits_past_the_receivers_caps_are_refused() {
    const DAY: u64 = 86_400 * NANOS_PER_SEC;
    let limits = WireLimits {
        max_period_ns: DAY,
        max_log_limit: 100,
        ..WireLimits::default()
    };
    let encode = |limit: Limit| {
        let batch = CheckBatch {
            groups: vec![vec![WireCheck::new(&b"k"[..], &limit, 1)]],
        };
        rkyv::to_bytes::<rkyv::rancor::Error>(&batch).unwrap()
    };
    let long = Limit::gcra(1, DAY + 1_000_000, 1).unwrap();
    let (code, message) = decode_check_batch(&encode(long), &limits).unwrap_err();
    assert_eq!(code, ErrorCode::InvalidLimit);
    assert!(
        message.contains("--max-limit-period") && message.contains("1d"),
        "{message}"
    );
    let log = Limit::new(Algorithm::SlidingLog, 101, 60 * NANOS_PER_SEC, 101).unwrap();
    let (code, message) = decode_check_batch(&encode(log), &limits).unwrap_err();
    assert_eq!(code, ErrorCode::InvalidLimit);
    assert!(message.contains("--max-log-limit"), "{message}");
    let at_caps = [
        Limit::gcra(1, DAY, 1).unwrap(),
        Limit::new(Algorithm::SlidingLog, 100, DAY, 100).unwrap(),
        Limit::new(Algorithm::SlidingWindow, 1_000_000, DAY, 1_000_000).unwrap(),
    ];
    for limit in at_caps {
        assert!(
            decode_check_batch(&encode(limit), &limits).is_ok(),
            "{limit:?}"
        );
    }
}

#[test]
fn payload_errors_carry_their_codes() {
    let limits = WireLimits {
        max_batch: 3,
        max_key_bytes: 8,
        ..WireLimits::default()
    };
    let encode = |b: &CheckBatch| rkyv::to_bytes::<rkyv::rancor::Error>(b).unwrap();
    assert_eq!(
        decode_check_batch(b"\x01\x02\x03 definitely not rkyv", &limits)
            .unwrap_err()
            .0,
        ErrorCode::MalformedPayload
    );
    assert_eq!(
        decode_check_batch(&encode(&batch(&["a", "b", "c", "d"])), &limits)
            .unwrap_err()
            .0,
        ErrorCode::BatchTooLarge
    );
    assert_eq!(
        decode_check_batch(&encode(&batch(&["123456789"])), &limits)
            .unwrap_err()
            .0,
        ErrorCode::KeyTooLong
    );
    let mut bad = batch(&["a"]);
    bad.groups[0][0].rate = 0;
    assert_eq!(
        decode_check_batch(&encode(&bad), &limits).unwrap_err().0,
        ErrorCode::InvalidLimit
    );
    bad.groups[0][0].rate = 1;
    bad.groups[0][0].algorithm = 9;
    assert_eq!(
        decode_check_batch(&encode(&bad), &limits).unwrap_err().0,
        ErrorCode::InvalidLimit
    );
    // An empty group cannot be packed; the nearest a sender can come is a check that starts
    // no group.
    assert!(
        rkyv::to_bytes::<rkyv::rancor::Error>(&CheckBatch {
            groups: vec![vec![]]
        })
        .is_err()
    );
    let mut no_group = PackedBatch::pack(&batch(&["a"])).unwrap();
    no_group.checks[0].flags = 0;
    let no_group = rkyv::to_bytes::<rkyv::rancor::Error>(&no_group).unwrap();
    assert_eq!(
        decode_check_batch(&no_group, &limits).unwrap_err().0,
        ErrorCode::MalformedPayload
    );
}

/// A payload that is not a valid archive is refused in words a person can act on: what was
/// expected, that validation failed and why, not rancor's "failed without error information;
/// enable debug assertions ..." (what release builds said before).
#[test]
fn malformed_payloads_are_refused_with_a_readable_message() {
    let encode = |b: &CheckBatch| rkyv::to_bytes::<rkyv::rancor::Error>(b).unwrap();
    let mut truncated = encode(&batch(&["a", "b"])).to_vec();
    truncated.truncate(truncated.len() - 4);
    let payloads: [&[u8]; 3] = [b"\x01\x02\x03 definitely not rkyv", &truncated, b""];
    for payload in payloads {
        let (code, message) = decode_check_batch(payload, &WireLimits::default()).unwrap_err();
        assert_eq!(code, ErrorCode::MalformedPayload);
        assert!(
            message.contains("not a valid check batch (rkyv validation failed"),
            "{message}"
        );
        assert!(!message.contains("enable debug assertions"), "{message}");
        assert!(!message.contains("without error information"), "{message}");
        // Nothing about this process's memory goes back to the sender.
        assert!(!message.contains("0x"), "{message}");
        let (code, message) = decode_decision_batch(payload).unwrap_err();
        assert_eq!(code, ErrorCode::MalformedPayload);
        assert!(message.contains("not a valid decision batch"), "{message}");
        assert!(!message.contains("enable debug assertions"), "{message}");
    }
}

#[test]
fn every_error_code_round_trips_through_its_number() {
    for code in ErrorCode::ALL {
        assert_eq!(ErrorCode::from_u16(code as u16), Some(code));
    }
    assert_eq!(ErrorCode::from_u16(0), None);
    assert_eq!(HEADER_BYTES % 16, 0);
}

proptest! {
    /// Random bytes, as a stream or as a payload, never panic: they become frames or errors.
    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..600), header_ok in any::<bool>()) {
        let mut input = bytes.clone();
        if header_ok {
            let mut framed = Vec::new();
            encode_frame(&mut framed, FrameKind::CheckBatch, 1, &bytes);
            input = framed;
        }
        let mut reader = FrameReader::new(MAX_FRAME);
        reader.extend(&input);
        while let Ok(Some(frame)) = reader.next_frame() {
            let _ = decode_check_batch(&frame.payload, &WireLimits::default());
            let _ = decode_decision_batch(&frame.payload);
        }
        let _ = decode_check_batch(&bytes, &WireLimits::default());
    }
}

/// Replicated buckets of every algorithm survive the wire; a bucket with an invalid limit, an
/// unknown algorithm or a log longer than twice its limit, or a hand-off with impossible parts, is
/// refused as malformed.
#[test]
fn replicate_messages_round_trip_and_bad_ones_are_refused() {
    use floodgate::algorithm::WindowState;
    use floodgate::wire::{HandoffPart, ReplicateMessage, WireBucket, decode_replicate};
    use floodgate::{Algorithm, BucketKey, BucketState, BucketValue};

    let key = |name: &str| BucketKey::new(b"", name.as_bytes());
    let hour = 3_600 * NANOS_PER_SEC;
    let window = Limit::new(Algorithm::SlidingWindow, 10, hour, 10).unwrap();
    let log = Limit::new(Algorithm::SlidingLog, 3, hour, 3).unwrap();
    let buckets = vec![
        BucketState {
            key: key("g"),
            value: BucketValue::Gcra {
                tat_ns: 42,
                margin_ms: 7,
            },
        },
        BucketState {
            key: key("w"),
            value: BucketValue::Window {
                limit: window,
                state: WindowState {
                    window: 5,
                    count: 3,
                    previous: 9,
                },
            },
        },
        BucketState {
            key: key("l"),
            value: BucketValue::Log {
                limit: log,
                times_ns: vec![1, 2, 3],
            },
        },
    ];
    let encode = |message: &ReplicateMessage| {
        let mut bytes = Vec::new();
        encode_message(&mut bytes, FrameKind::Replicate, 0, message);
        one_frame(&bytes).unwrap().unwrap().payload
    };
    let handoff = HandoffPart {
        id: 9,
        part: 0,
        parts: 1,
        slots: vec![1, 4_095],
    };
    let message = ReplicateMessage {
        from: "a".into(),
        handoff: Some(handoff.clone()),
        buckets: buckets.iter().map(WireBucket::from).collect(),
    };
    let decoded = decode_replicate(BASE_LAYOUT, &encode(&message)).unwrap();
    assert_eq!(decoded.from, "a");
    assert_eq!(decoded.handoff, Some(handoff.clone()));
    assert_eq!(decoded.buckets, buckets);

    let refused = |change: &dyn Fn(&mut ReplicateMessage)| {
        let mut bad = message.clone();
        change(&mut bad);
        decode_replicate(BASE_LAYOUT, &encode(&bad)).unwrap_err().0
    };
    let malformed = ErrorCode::MalformedPayload;
    assert_eq!(refused(&|m| m.buckets[1].rate = 0), malformed);
    assert_eq!(refused(&|m| m.buckets[1].algorithm = 9), malformed);
    assert_eq!(
        refused(&|m| m.buckets[2].times_ns.extend([4, 5, 6, 7])),
        malformed
    );
    assert_eq!(
        refused(&|m| m.handoff.as_mut().unwrap().part = 1),
        malformed
    );
    assert_eq!(
        refused(&|m| m.handoff.as_mut().unwrap().slots.push(4_096)),
        malformed
    );
    compact_replicas_round_trip_and_bad_ones_are_refused(&buckets, handoff);
}

/// Version 12's layout (GCRA buckets as columns) carries the same buckets; columns of unequal
/// length, or an arrival time past any store's, are refused as malformed.
fn compact_replicas_round_trip_and_bad_ones_are_refused(
    buckets: &[floodgate::BucketState],
    handoff: floodgate::wire::HandoffPart,
) {
    use floodgate::wire::{ReplicateMessageV12, decode_replicate, encode_replicate};
    let version = floodgate::protocol::Feature::CompactReplicas.since();
    let mut bytes = Vec::new();
    encode_replicate(&mut bytes, version, "a", Some(handoff.clone()), buckets);
    let frame = one_frame(&bytes).unwrap().unwrap();
    assert_eq!(frame.version, version);
    let decoded = decode_replicate(frame.version, &frame.payload).unwrap();
    assert_eq!(decoded.handoff, Some(handoff));
    // GCRA buckets first, then the others, each in the order given.
    let mut expected = buckets.to_vec();
    expected.sort_by_key(|b| !matches!(b.value, floodgate::BucketValue::Gcra { .. }));
    assert_eq!(decoded.buckets, expected);

    let message =
        rkyv::from_bytes::<ReplicateMessageV12, rkyv::rancor::Error>(&frame.payload).unwrap();
    assert_eq!(message.gcra_key_hashes.len(), 1);
    let refused = |change: &dyn Fn(&mut ReplicateMessageV12)| {
        let mut bad = message.clone();
        change(&mut bad);
        let mut bytes = Vec::new();
        encode_message_at(&mut bytes, version, FrameKind::Replicate, 0, &bad);
        let frame = one_frame(&bytes).unwrap().unwrap();
        decode_replicate(frame.version, &frame.payload).unwrap_err()
    };
    let (code, why) = refused(&|m| m.gcra_key_checks.push(1));
    assert_eq!(code, ErrorCode::MalformedPayload);
    assert!(why.contains("GCRA columns"), "{why}");
    let (code, why) = refused(&|m| m.gcra_tats_ns[0] = u64::MAX);
    assert_eq!(code, ErrorCode::MalformedPayload);
    assert!(why.contains("arrival time"), "{why}");
}
