//! A hostile gateway that chooses expensive limits over many keys (every algorithm, and
//! concurrency leases) cannot take the node past `--max-store-bytes`: the store evicts the
//! flood's own keys, a witness's key is decided as before, a new key afterwards is decided (not
//! refused), and a limit past the node's caps is refused as `invalid_limit`.

mod common;

use common::*;
use floodgate::lease::LEASE_BYTES;
use floodgate::wire::{
    CheckBatch, ErrorCode, FrameKind, FrameReader, LEASE_ACQUIRE, LeaseAnswer, LeaseRequestBatch,
    WireCheck, WireLeaseRequest, decode_lease_answers, encode_lease_requests, encode_message,
};
use floodgate::{Algorithm, Limit, NANOS_PER_SEC};

const BUDGET: usize = 8 << 20;
const DAY: u64 = 86_400 * NANOS_PER_SEC;

/// One frame of single-check groups, every key `prefix` and a number, all under `limit`.
fn flood_frame(prefix: &str, range: std::ops::Range<usize>, limit: &Limit, cost: u64) -> Vec<u8> {
    let batch = CheckBatch {
        groups: range
            .map(|i| vec![WireCheck::new(format!("{prefix}{i}"), limit, cost)])
            .collect(),
    };
    let mut out = Vec::new();
    encode_message(&mut out, FrameKind::CheckBatch, 1, &batch);
    out
}

fn lease_frame(range: std::ops::Range<usize>) -> Vec<u8> {
    let requests = range
        .map(|i| WireLeaseRequest {
            op: LEASE_ACQUIRE,
            key: format!("seat{i}").into_bytes(),
            max: 100_000,
            ttl_ns: DAY,
            ..WireLeaseRequest::default()
        })
        .collect();
    let mut out = Vec::new();
    encode_lease_requests(
        &mut out,
        floodgate::protocol::NEWEST,
        1,
        &LeaseRequestBatch { requests },
    );
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_expensive_limits_stays_within_the_store_budget() {
    let node = start_node(|c| c.limits.max_store_bytes = BUDGET).await;
    let addr = node.node.local_addr();
    let witness = connect(addr, client_config(&node.certs, false)).await;
    let attacker = connect(addr, client_config(&node.certs, false)).await;
    // Slow enough to refill nothing while the flood runs: a reset would show.
    let witness_limit = Limit::gcra(10, DAY, 10).unwrap();
    for expected in [9, 8, 7] {
        let answers = exchange(&witness, &check_frame(1, &[b"witness"], &witness_limit)).await;
        assert_eq!(answers.decisions[0].1[0].unwrap().remaining(), expected);
    }

    // The most each algorithm lets a caller ask for under the default caps: 31-day periods,
    // logs of 1,000 times filled at once, windows and GCRA of a billion.
    let month = 31 * DAY;
    let floods = [
        (
            "log",
            Limit::new(Algorithm::SlidingLog, 1_000, month, 1_000).unwrap(),
            1_000,
            2_000,
        ),
        (
            "fixed",
            Limit::new(Algorithm::FixedWindow, 1_000_000_000, month, 1_000_000_000).unwrap(),
            1,
            16_000,
        ),
        (
            "sliding",
            Limit::new(
                Algorithm::SlidingWindow,
                1_000_000_000,
                month,
                1_000_000_000,
            )
            .unwrap(),
            1,
            16_000,
        ),
        (
            "gcra",
            Limit::gcra(1_000_000_000, month, 1_000_000_000).unwrap(),
            1,
            40_000,
        ),
    ];
    let mut decided = 0;
    for (prefix, limit, cost, keys) in &floods {
        for start in (0..*keys).step_by(4_000) {
            let range = start..(start + 4_000).min(*keys);
            let answers = exchange(&attacker, &flood_frame(prefix, range, limit, *cost)).await;
            assert!(answers.errors.is_empty(), "{prefix}: {:?}", answers.errors);
            for decision in answers.decisions.iter().flat_map(|(_, d)| d) {
                assert!(
                    decision.is_ok(),
                    "{prefix}: a check was refused: {decision:?}"
                );
                decided += 1;
            }
            let (used, max) = node.node.store_bytes();
            assert!(
                used <= max,
                "{prefix}: the store holds {used} bytes, budget {max}"
            );
        }
    }
    assert_eq!(decided, 74_000);
    let (used, max) = node.node.store_bytes();
    assert_eq!(max, BUDGET / 8 * 7);
    assert!(
        used > max / 2,
        "the flood never filled the budget: {used} of {max}"
    );

    // Leases cannot be evicted: past their share of the budget they are refused store_full.
    let mut full = 0;
    for start in (0..8_000).step_by(4_000) {
        let bytes = floodgate_node::exchange::round_trip(
            &attacker,
            &lease_frame(start..start + 4_000),
            16 << 20,
        )
        .await
        .unwrap();
        let mut reader = FrameReader::new(16 << 20);
        reader.extend(&bytes);
        let frame = reader.next_frame().unwrap().unwrap();
        assert_eq!(frame.kind, FrameKind::LeaseAnswer);
        let (answers, _) = decode_lease_answers(frame.version, &frame.payload).unwrap();
        full += answers
            .iter()
            .filter(|a| **a == LeaseAnswer::Error(ErrorCode::StoreFull))
            .count();
    }
    let held = node.node.leases_held();
    assert!(full > 0, "every lease was granted");
    assert!(
        held * LEASE_BYTES <= BUDGET / 8,
        "{held} leases of {LEASE_BYTES} bytes past their share of {BUDGET}"
    );

    // The witness was decided as before, and a new key is decided, not refused.
    let answers = exchange(&witness, &check_frame(1, &[b"witness"], &witness_limit)).await;
    assert_eq!(answers.decisions[0].1[0].unwrap().remaining(), 6);
    let answers = exchange(&witness, &check_frame(1, &[b"newcomer"], &witness_limit)).await;
    let newcomer = answers.decisions[0].1[0].expect("the new key is decided, not refused");
    assert_eq!(newcomer.remaining(), 9);

    // Past the caps: refused in words naming the flag, nothing stored.
    let too_long = Limit::gcra(1, 32 * DAY, 1).unwrap();
    let answers = exchange(&attacker, &check_frame(1, &[b"yearly"], &too_long)).await;
    assert_eq!(answers.errors.len(), 1, "{answers:?}");
    assert_eq!(answers.errors[0].1, ErrorCode::InvalidLimit);
    assert!(
        answers.errors[0].2.contains("--max-limit-period"),
        "{}",
        answers.errors[0].2
    );
}
