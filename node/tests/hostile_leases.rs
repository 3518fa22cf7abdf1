//! Hostile lease input: bad lease frames (kind 15) get an error frame with their documented
//! code and a reason a person can act on, and the stream goes on; lease syncs (kind 17) from a
//! client are forbidden; the node-wide lease bound answers `store_full`; a lease's id tells
//! nothing of its neighbours', so guessing around one's own releases nothing. Nothing panics.

mod common;

use common::*;
use floodgate::lease::LeaseId;
use floodgate::protocol::NEWEST;
use floodgate::wire::{
    ErrorCode, FrameKind, FrameReader, LEASE_ACQUIRE, LeaseAnswer, LeaseRequestBatch,
    LeaseSyncMessage, WireLeaseRequest, decode_error_frame, decode_lease_answers, encode_frame,
    encode_lease_requests, encode_message,
};

const SEC: u64 = 1_000_000_000;

/// What came back for each request id: its lease answers, or its error (code and message).
type Replies = Vec<(u64, Result<Vec<LeaseAnswer>, (ErrorCode, String)>)>;

fn parse(bytes: &[u8]) -> Replies {
    let mut reader = FrameReader::new(16 << 20);
    reader.extend(bytes);
    let mut replies = Vec::new();
    while let Some(frame) = reader.next_frame().unwrap() {
        let reply = match frame.kind {
            FrameKind::LeaseAnswer => Ok(decode_lease_answers(frame.version, &frame.payload)
                .unwrap()
                .0),
            FrameKind::Error => {
                let error = decode_error_frame(&frame.payload).unwrap();
                Err((ErrorCode::from_u16(error.code).unwrap(), error.message))
            }
            other => panic!("a node never answers lease requests with {other:?}"),
        };
        replies.push((frame.request_id, reply));
    }
    replies
}

fn frame(request_id: u64, requests: Vec<WireLeaseRequest>) -> Vec<u8> {
    frame_at(NEWEST, request_id, requests)
}

/// A kind 15 frame as a caller speaking `version` sends it.
fn frame_at(version: u8, request_id: u64, requests: Vec<WireLeaseRequest>) -> Vec<u8> {
    let mut out = Vec::new();
    encode_lease_requests(
        &mut out,
        version,
        request_id,
        &LeaseRequestBatch { requests },
    );
    out
}

fn acquire(key: &[u8], max: u64, ttl_ns: u64) -> WireLeaseRequest {
    WireLeaseRequest {
        op: LEASE_ACQUIRE,
        key: key.to_vec(),
        max,
        ttl_ns,
        ..WireLeaseRequest::default()
    }
}

#[tokio::test]
async fn bad_lease_frames_are_refused_with_a_reason_and_the_stream_goes_on() {
    let node = start_node(|c| {
        c.limits.max_batch = 4;
        c.limits.max_key_bytes = 16;
    })
    .await;
    let connection = connect(node.node.local_addr(), client_config(&node.certs, false)).await;
    let mut bytes = Vec::new();
    let mut garbage = Vec::new();
    encode_frame(
        &mut garbage,
        FrameKind::LeaseRequest,
        1,
        b"not an rkyv archive, just bytes",
    );
    bytes.extend(garbage);
    let bad = [
        vec![acquire(b"k", 0, SEC)],
        vec![acquire(b"k", 100_001, SEC)],
        vec![acquire(b"k", 1, 999_999)],
        vec![acquire(b"k", 1, 86_400 * SEC + 1)],
        vec![WireLeaseRequest::release("k", 0)],
        vec![WireLeaseRequest::renew("k", 7, 0)],
        vec![WireLeaseRequest {
            op: 3,
            ..WireLeaseRequest::release("k", 7)
        }],
        vec![acquire(&[b'k'; 17], 1, SEC)],
        vec![acquire(b"k", 1, SEC); 5],
        Vec::new(),
    ];
    for (i, requests) in bad.into_iter().enumerate() {
        bytes.extend(frame(2 + i as u64, requests));
    }
    // A good request after all of them is still answered, and nothing bad was granted.
    bytes.extend(frame(99, vec![acquire(b"k", 1, SEC)]));
    let replies = parse(
        &floodgate_node::exchange::round_trip(&connection, &bytes, 1 << 20)
            .await
            .unwrap(),
    );
    let expected: [(ErrorCode, &str); 11] = [
        (
            ErrorCode::MalformedPayload,
            "not a valid lease request batch",
        ),
        (
            ErrorCode::InvalidLimit,
            "max must be between 1 and 100000 leases, not 0",
        ),
        (
            ErrorCode::InvalidLimit,
            "max must be between 1 and 100000 leases, not 100001",
        ),
        (ErrorCode::InvalidLimit, "ttl must be between 1ms and 1 day"),
        (ErrorCode::InvalidLimit, "ttl must be between 1ms and 1 day"),
        (
            ErrorCode::MalformedPayload,
            "a lease release without a lease id",
        ),
        (ErrorCode::InvalidLimit, "ttl must be between 1ms and 1 day"),
        (ErrorCode::MalformedPayload, "unknown lease op 3"),
        (
            ErrorCode::KeyTooLong,
            "key of 17 bytes exceeds the maximum of 16",
        ),
        (
            ErrorCode::BatchTooLarge,
            "5 lease requests in one frame; the maximum is 4",
        ),
        (ErrorCode::MalformedPayload, "no requests"),
    ];
    assert_eq!(replies.len(), expected.len() + 1, "{replies:?}");
    for ((id, reply), (i, (code, words))) in replies.iter().zip(expected.iter().enumerate()) {
        assert_eq!(*id, 1 + i as u64);
        let (got, message) = reply.as_ref().unwrap_err();
        assert_eq!(got, code, "{message}");
        assert!(message.contains(words), "request {id}: {message}");
    }
    let (id, last) = replies.last().unwrap();
    assert_eq!(*id, 99);
    assert!(
        matches!(
            last.as_ref().unwrap()[..],
            [LeaseAnswer::Granted { in_use: 1, .. }]
        ),
        "{last:?}"
    );
    node.node.shutdown().await;
}

#[tokio::test]
async fn a_lease_sync_from_a_client_closes_its_connection_as_forbidden() {
    let node = start_node(|_| {}).await;
    let connection = connect(node.node.local_addr(), client_config(&node.certs, false)).await;
    let mut sync = Vec::new();
    encode_message(
        &mut sync,
        FrameKind::LeaseSync,
        0,
        &LeaseSyncMessage {
            from: node.node.node_id().to_owned(),
            handoff: true,
            sets: Vec::new(),
        },
    );
    let mut stream = connection.open_uni().await.unwrap();
    stream.write_all(&sync).await.unwrap();
    let _ = stream.finish();
    let reason = tokio::time::timeout(std::time::Duration::from_secs(10), connection.closed())
        .await
        .expect("the node closes the connection");
    assert!(reason.to_string().contains("forbidden"), "{reason}");
    node.node.shutdown().await;
}

#[tokio::test]
async fn past_the_node_wide_bound_an_acquire_is_answered_store_full() {
    let node = start_node(|c| c.limits.max_leases = 2).await;
    let connection = connect(node.node.local_addr(), client_config(&node.certs, false)).await;
    let requests = vec![
        acquire(b"a", 10, 60 * SEC),
        acquire(b"b", 10, 60 * SEC),
        acquire(b"c", 10, 60 * SEC),
    ];
    let replies = parse(
        &floodgate_node::exchange::round_trip(&connection, &frame(1, requests), 1 << 20)
            .await
            .unwrap(),
    );
    let answers = replies[0].1.as_ref().unwrap();
    assert!(matches!(answers[0], LeaseAnswer::Granted { .. }));
    assert!(matches!(answers[1], LeaseAnswer::Granted { .. }));
    assert_eq!(answers[2], LeaseAnswer::Error(ErrorCode::StoreFull));
    node.node.shutdown().await;
}

/// The id of the lease granted by a one-request frame.
async fn granted_id(connection: &quinn::Connection, request: WireLeaseRequest) -> LeaseId {
    granted_id_at(NEWEST, connection, request).await
}

/// As [`granted_id`], asked by a caller speaking `version`.
async fn granted_id_at(
    version: u8,
    connection: &quinn::Connection,
    request: WireLeaseRequest,
) -> LeaseId {
    let bytes = frame_at(version, 1, vec![request]);
    let replies = parse(
        &floodgate_node::exchange::round_trip(connection, &bytes, 1 << 20)
            .await
            .unwrap(),
    );
    match replies[0].1.as_ref().unwrap()[..] {
        [LeaseAnswer::Granted { lease_id, .. }] => lease_id,
        ref other => panic!("expected a grant, got {other:?}"),
    }
}

/// Lease ids are random, not a counter: a caller holding a lease on a key cannot release or
/// renew the leases other callers hold on it by trying the ids around its own.
#[tokio::test]
async fn a_caller_cannot_release_or_renew_anothers_lease_by_guessing_its_id() {
    const GUESSES: u64 = 1_000;
    let node = start_node(|_| {}).await;
    let victim = connect(node.node.local_addr(), client_config(&node.certs, false)).await;
    let attacker = connect(node.node.local_addr(), client_config(&node.certs, false)).await;
    let shared = || acquire(b"shared", 10, 60 * SEC);
    let before = granted_id(&victim, shared()).await;
    let own = granted_id(&attacker, shared()).await;
    let after = granted_id(&victim, shared()).await;
    let guesses: Vec<LeaseId> = (1..=LeaseId::from(GUESSES))
        .flat_map(|d| [own.wrapping_add(d), own.wrapping_sub(d)])
        .filter(|&id| id != 0)
        .collect();
    let releases = guesses
        .iter()
        .map(|&id| WireLeaseRequest::release("shared", id))
        .collect();
    let renewals = guesses
        .iter()
        .map(|&id| WireLeaseRequest::renew("shared", id, 60 * SEC))
        .collect();
    let mut bytes = frame(1, releases);
    bytes.extend(frame(2, renewals));
    let replies = parse(
        &floodgate_node::exchange::round_trip(&attacker, &bytes, 16 << 20)
            .await
            .unwrap(),
    );
    assert_eq!(replies.len(), 2, "{replies:?}");
    let released = replies[0].1.as_ref().unwrap();
    assert_eq!(released.len(), guesses.len());
    assert!(
        released.iter().all(|a| *a
            == LeaseAnswer::Released {
                was_held: false,
                in_use: 3
            }),
        "a guessed id released a lease: {released:?}"
    );
    let renewed = replies[1].1.as_ref().unwrap();
    assert!(
        renewed
            .iter()
            .all(|a| *a == LeaseAnswer::NotHeld { in_use: 3 }),
        "a guessed id renewed a lease"
    );
    // The victim's leases are still its own to renew and release.
    let mine = vec![
        WireLeaseRequest::renew("shared", before, 60 * SEC),
        WireLeaseRequest::release("shared", before),
        WireLeaseRequest::release("shared", after),
    ];
    let replies = parse(
        &floodgate_node::exchange::round_trip(&victim, &frame(3, mine), 1 << 20)
            .await
            .unwrap(),
    );
    let answers = replies[0].1.as_ref().unwrap();
    assert!(
        matches!(answers[0], LeaseAnswer::Renewed { in_use: 3, .. }),
        "{answers:?}"
    );
    assert_eq!(
        answers[1..],
        [
            LeaseAnswer::Released {
                was_held: true,
                in_use: 2
            },
            LeaseAnswer::Released {
                was_held: true,
                in_use: 1
            }
        ]
    );
    node.node.shutdown().await;
}

/// A caller speaking version 10 is granted ids of 128 random bits (the upper 64 are not all 0 in
/// any of 8 grants but once in 2^512); one speaking 9 or less, whose frames carry 64, is
/// granted 64-bit ids, and renews and releases them as before.
#[tokio::test]
async fn ids_are_128_bits_for_a_caller_of_version_10_and_64_for_an_older_one() {
    let node = start_node(|_| {}).await;
    let connection = connect(node.node.local_addr(), client_config(&node.certs, false)).await;
    let mut wide = 0;
    for _ in 0..8 {
        let id = granted_id(&connection, acquire(b"wide", 100, 60 * SEC)).await;
        wide += u32::from(id >> 64 != 0);
    }
    assert!(wide > 0, "no id used its upper 64 bits");
    let old = 9;
    let id = granted_id_at(old, &connection, acquire(b"narrow", 100, 60 * SEC)).await;
    assert!(id != 0 && id >> 64 == 0, "{id:#x}");
    let again = [
        WireLeaseRequest::renew("narrow", id, 60 * SEC),
        WireLeaseRequest::release("narrow", id),
    ];
    let replies = parse(
        &floodgate_node::exchange::round_trip(
            &connection,
            &frame_at(old, 2, again.to_vec()),
            1 << 20,
        )
        .await
        .unwrap(),
    );
    let answers = replies[0].1.as_ref().unwrap();
    assert!(
        matches!(answers[0], LeaseAnswer::Renewed { .. }),
        "{answers:?}"
    );
    assert_eq!(
        answers[1],
        LeaseAnswer::Released {
            was_held: true,
            in_use: 0
        }
    );
    node.node.shutdown().await;
}

/// A lease is replicated within its region only, so 128-bit ids wait for that region's members:
/// a member of another region speaking 9 does not hold them back, one of this region does.
#[tokio::test]
async fn ids_wait_for_the_members_of_this_region_not_of_others() {
    let node = start_node(|c| {
        c.cluster.region = "a".to_owned();
        // The silent members below stay alive for the whole test.
        c.cluster.membership = floodgate::cluster::MembershipConfig {
            gossip_interval_ns: 20_000_000,
            suspect_after_ns: 600 * SEC,
            dead_after_ns: 1_200 * SEC,
            ..floodgate::cluster::MembershipConfig::default()
        };
    })
    .await;
    let nine = floodgate::protocol::VersionRange::new(2, 9);
    let wait = std::time::Duration::from_secs(10);
    let mut tables = node.node.watch_slot_table();
    gossip_silent_member(&node, ("old-elsewhere", "127.0.0.1:9"), "b", nine).await;
    let heard = tokio::time::timeout(wait, async {
        while node.node.cluster_version() != 9 {
            tables.changed().await.unwrap();
        }
    })
    .await;
    assert!(heard.is_ok(), "the other region's member was not taken");
    let connection = connect(node.node.local_addr(), client_config(&node.certs, false)).await;
    let mut wide = 0;
    for i in 0..8 {
        let key = format!("elsewhere-{i}");
        let id = granted_id(&connection, acquire(key.as_bytes(), 100, 60 * SEC)).await;
        wide += u32::from(id >> 64 != 0);
    }
    assert!(
        wide > 0,
        "an old member of region b held this region's ids to 64 bits"
    );
    gossip_silent_member(&node, ("old-here", "127.0.0.1:7"), "a", nine).await;
    // `is_ok` at once: the table's guard must not outlive the wait (it would hold up the node's
    // next table switch).
    let joined = tokio::time::timeout(
        wait,
        tables.wait_for(|table| table.nodes().iter().any(|n| n == "old-here")),
    )
    .await
    .is_ok();
    assert!(joined, "this region's old member was not taken");
    for i in 0..8 {
        // Keys this node still owns: the silent member's are not decided here.
        let key = key_owned_by(&node.node, node.node.node_id(), &format!("here-{i}-"));
        let id = granted_id(&connection, acquire(&key, 100, 60 * SEC)).await;
        assert!(id != 0 && id >> 64 == 0, "{id:#x}");
    }
    node.node.shutdown().await;
}
