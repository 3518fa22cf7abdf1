//! Hostile input gets an error frame or a closed stream with its documented code, never a panic,
//! and never disturbs another client (docs/PROTOCOL.md error
//! codes).

mod common;

use common::*;
use floodgate::wire::{CheckBatch, ErrorCode, FrameKind, WireCheck, encode_frame, encode_message};

/// A well-behaved client on its own connection: one check on its key must keep deciding exactly
/// (remaining counts down by one) during and after every attack.
struct Witness {
    connection: quinn::Connection,
    expected_remaining: u64,
}

impl Witness {
    async fn new(node: &TestNode) -> Self {
        let connection = connect(node.node.local_addr(), client_config(&node.certs, false)).await;
        Witness {
            connection,
            expected_remaining: 1_000,
        }
    }

    async fn still_served(&mut self) {
        let answers = exchange(
            &self.connection,
            &check_frame(1, &[b"witness"], &per_hour(1_000)),
        )
        .await;
        self.expected_remaining -= 1;
        assert!(answers.errors.is_empty(), "{:?}", answers.errors);
        let decision = answers.decisions[0].1[0].unwrap();
        assert!(decision.is_allowed());
        assert_eq!(decision.remaining(), self.expected_remaining);
    }
}

async fn attack(bytes: &[u8]) -> (Answers, Witness, TestNode) {
    let node = start_node(|c| {
        c.limits.max_frame_bytes = 4_096;
        c.limits.max_batch = 8;
        c.limits.max_key_bytes = 16;
    })
    .await;
    let mut witness = Witness::new(&node).await;
    witness.still_served().await;
    let attacker = connect(node.node.local_addr(), client_config(&node.certs, false)).await;
    let answers = exchange(&attacker, bytes).await;
    witness.still_served().await;
    (answers, witness, node)
}

fn only_error(answers: &Answers) -> ErrorCode {
    assert!(answers.decisions.is_empty(), "{:?}", answers.decisions);
    assert_eq!(answers.errors.len(), 1, "{:?}", answers.errors);
    answers.errors[0].1
}

#[tokio::test]
async fn random_bytes_close_the_stream_with_bad_magic() {
    // Fixed pseudo-random bytes (not starting with "FG").
    let bytes: Vec<u8> = (0u32..2_000)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 | 0x80)
        .collect();
    let (answers, mut witness, node) = attack(&bytes).await;
    assert_eq!(only_error(&answers), ErrorCode::BadMagic);
    witness.still_served().await;
    node.node.shutdown().await;
}

#[tokio::test]
async fn a_truncated_frame_is_reported_when_the_stream_ends() {
    let mut bytes = check_frame(5, &[b"k"], &per_hour(10));
    bytes.truncate(bytes.len() - 5);
    let (answers, _, node) = attack(&bytes).await;
    assert_eq!(only_error(&answers), ErrorCode::Truncated);
    node.node.shutdown().await;
}

#[tokio::test]
async fn a_length_prefix_over_the_limit_closes_the_stream() {
    let mut bytes = Vec::new();
    encode_frame(&mut bytes, FrameKind::CheckBatch, 6, b"");
    bytes[4..8].copy_from_slice(&1_000_000u32.to_le_bytes());
    let (answers, _, node) = attack(&bytes).await;
    assert_eq!(only_error(&answers), ErrorCode::FrameTooLarge);
    assert_eq!(answers.errors[0].0, 6, "the error names the request");
    node.node.shutdown().await;
}

#[tokio::test]
async fn a_wrong_version_is_refused_by_name() {
    // A gateway of the version before, whose check batches this node would misread.
    let mut bytes = check_frame(7, &[b"k"], &per_hour(10));
    bytes[2] = 1;
    let (answers, _, node) = attack(&bytes).await;
    assert_eq!(only_error(&answers), ErrorCode::UnsupportedVersion);
    assert!(
        answers.errors[0].2.contains("version 1"),
        "{}",
        answers.errors[0].2
    );
    node.node.shutdown().await;
}

#[tokio::test]
async fn an_invalid_payload_is_refused_and_the_stream_goes_on() {
    let mut bytes = Vec::new();
    encode_frame(&mut bytes, FrameKind::CheckBatch, 8, &[0xAB; 64]);
    bytes.extend(check_frame(9, &[b"after"], &per_hour(10)));
    let (answers, _, node) = attack(&bytes).await;
    assert_eq!(answers.errors.len(), 1);
    assert_eq!(
        (answers.errors[0].0, answers.errors[0].1),
        (8, ErrorCode::MalformedPayload)
    );
    assert_eq!(
        answers.decisions.len(),
        1,
        "the next frame on the same stream is answered"
    );
    assert_eq!(answers.decisions[0].0, 9);
    assert!(answers.decisions[0].1[0].unwrap().is_allowed());
    node.node.shutdown().await;
}

#[tokio::test]
async fn a_key_over_the_maximum_is_refused() {
    let (answers, _, node) = attack(&check_frame(10, &[&[b'k'; 17]], &per_hour(10))).await;
    assert_eq!(only_error(&answers), ErrorCode::KeyTooLong);
    assert_eq!(
        node.node.live_buckets(),
        1,
        "only the witness's bucket exists"
    );
    node.node.shutdown().await;
}

#[tokio::test]
async fn a_batch_over_the_maximum_is_refused_whole() {
    let limit = per_hour(10);
    let batch = CheckBatch {
        groups: (0..9u8)
            .map(|i| vec![WireCheck::new(vec![i], &limit, 1)])
            .collect(),
    };
    let mut bytes = Vec::new();
    encode_message(&mut bytes, FrameKind::CheckBatch, 11, &batch);
    let (answers, _, node) = attack(&bytes).await;
    assert_eq!(only_error(&answers), ErrorCode::BatchTooLarge);
    assert_eq!(
        node.node.live_buckets(),
        1,
        "nothing of the refused batch was consumed"
    );
    node.node.shutdown().await;
}

#[tokio::test]
async fn an_invalid_limit_is_refused() {
    let mut check = WireCheck::new(b"k".to_vec(), &per_hour(10), 1);
    check.period_ns = 5;
    let mut bytes = Vec::new();
    encode_message(
        &mut bytes,
        FrameKind::CheckBatch,
        12,
        &CheckBatch {
            groups: vec![vec![check]],
        },
    );
    let (answers, _, node) = attack(&bytes).await;
    assert_eq!(only_error(&answers), ErrorCode::InvalidLimit);
    node.node.shutdown().await;
}

/// A client without a node certificate cannot gossip or replicate: replicated buckets sent on
/// a unidirectional stream change nothing (the witness's bucket stays as it was), and a large
/// unidirectional stream is cut off after a few bytes (a replicate frame closes the connection,
/// `forbidden`). The node keeps serving.
#[tokio::test]
async fn a_client_cannot_replicate_or_gossip_on_unidirectional_streams() {
    use floodgate::wire::{ReplicateMessage, WireBucket};
    use floodgate::{BucketKey, BucketState, BucketValue};

    let node = start_node(|_| {}).await;
    let mut witness = Witness::new(&node).await;
    witness.still_served().await;
    // A far-future TAT for the witness's key would deny it, were it merged.
    let forged = BucketState {
        key: BucketKey::new(b"", b"witness"),
        value: BucketValue::Gcra {
            tat_ns: u64::MAX / 2,
            margin_ms: 0,
        },
    };
    let message = ReplicateMessage {
        from: "mallory".into(),
        handoff: None,
        buckets: vec![WireBucket::from(&forged)],
    };
    let mut frame = Vec::new();
    encode_message(&mut frame, FrameKind::Replicate, 0, &message);
    for payload in [frame, vec![0u8; 1 << 20]] {
        let attacker = connect(node.node.local_addr(), client_config(&node.certs, false)).await;
        let mut stream = attacker.open_uni().await.unwrap();
        // The node may stop reading (and the stream) early: either way nothing is merged.
        let _ = stream.write_all(&payload).await;
        let _ = stream.finish();
        let _ = stream.stopped().await;
    }
    witness.still_served().await;
    witness.still_served().await;
}
