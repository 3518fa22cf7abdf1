//! Node-wide bounds: all streams together buffer at most `max_buffered_bytes` (a stream that
//! would pass it is closed with `overloaded`, a table or the rules it could not hold as answers
//! are refused as `overloaded`) while small checks keep being answered, and peers
//! have their own connection allowance, so clients at their limit cannot keep a peer out.
//! Waits are on answers and table changes, bounded by timeouts.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use floodgate::cluster::MembershipConfig;
use floodgate::wire::{
    ErrorCode, FrameKind, FrameReader, PolicyRequest, decode_policy_message, encode_frame,
    encode_message,
};
use floodgate_node::{Node, NodeConfig};

const WAIT: Duration = Duration::from_secs(10);

/// One check on the witness's own key, on its own connection: must be allowed, counting down.
async fn witness_check(connection: &quinn::Connection, expected_remaining: u64) {
    let answers = exchange(connection, &check_frame(1, &[b"witness"], &per_hour(1_000))).await;
    assert!(answers.errors.is_empty(), "{:?}", answers.errors);
    let decision = answers.decisions[0].1[0].unwrap();
    assert!(decision.is_allowed());
    assert_eq!(decision.remaining(), expected_remaining);
}

/// Twelve connections each start a 60 KiB frame and send 50 KiB of it, then wait: together
/// 600 KiB against a budget of 256 KiB, of which large partial frames may fill seven eighths
/// (224 KiB, four such streams). At least eight streams must be closed with `overloaded`, the
/// node never holds more than the budget, and a small client is answered throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_partial_large_frames_stay_within_the_buffer_budget() {
    const BUDGET: usize = 256 * 1024;
    const SENT: usize = 50 * 1024 + 16;
    const ATTACKERS: usize = 12;
    let node = start_node(|c| {
        c.limits.max_frame_bytes = 64 * 1024;
        c.limits.max_buffered_bytes = BUDGET;
    })
    .await;
    let addr = node.node.local_addr();
    let witness = connect(addr, client_config(&node.certs, false)).await;
    witness_check(&witness, 999).await;

    let mut frame = Vec::new();
    encode_frame(&mut frame, FrameKind::CheckBatch, 7, &[0u8; 60 * 1024]);
    frame.truncate(SENT);
    let (refused_tx, mut refused) = tokio::sync::mpsc::unbounded_channel();
    let mut open = Vec::new();
    for _ in 0..ATTACKERS {
        let connection = connect(addr, client_config(&node.certs, false)).await;
        let (mut send, mut recv) = connection.open_bi().await.unwrap();
        send.write_all(&frame).await.unwrap();
        let refused_tx = refused_tx.clone();
        // A stream the node closes sends its error and ends; the others stay open (unfinished).
        tokio::spawn(async move {
            let bytes = recv.read_to_end(1 << 20).await.unwrap_or_default();
            let _ = refused_tx.send(parse_answers(&bytes).errors);
        });
        open.push((connection, send));
    }
    let mut closed = 0;
    tokio::time::timeout(WAIT, async {
        while closed < ATTACKERS - 4 {
            let errors = refused.recv().await.unwrap();
            assert_eq!(errors.len(), 1, "{errors:?}");
            assert_eq!(errors[0].1, ErrorCode::Overloaded, "{errors:?}");
            closed += 1;
        }
    })
    .await
    .expect("streams over the budget are closed with overloaded");

    let (_, peak) = node.node.buffered_bytes();
    assert!(peak <= BUDGET, "held {peak} bytes, budget {BUDGET}");
    // Each refusal came when one more partial frame would not fit under seven eighths.
    assert!(
        peak > BUDGET / 8 * 7 - SENT,
        "held at most {peak} bytes: the budget was never nearly full"
    );
    // Small checks still find room, on the witness's connection and on a new one.
    witness_check(&witness, 998).await;
    let newcomer = connect(addr, client_config(&node.certs, false)).await;
    witness_check(&newcomer, 997).await;
    drop(open);
    node.node.shutdown().await;
}

/// A small request can draw a large answer (the rules text for a policy request of a few
/// bytes), held until its caller takes it: answers count against the budget. A caller whose
/// receive window takes 4 KiB asks for 120 KiB of rules and reads 1 KiB of it, so the node holds
/// the rest; the same ask on a second stream would pass what large holdings may take (seven
/// eighths of 256 KiB) and is refused as `overloaded`, while checks are answered. Once the first
/// answer is taken whole, its bytes are given back and the rules are sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_not_yet_taken_count_against_the_buffer_budget() {
    const BUDGET: usize = 256 * 1024;
    const RULES_BYTES: usize = 120 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let rules_file = dir.path().join("rules.yaml");
    let mut rules = "rules:\n  - name: a\n    path: /**\n    key: ip\n    limit: 5/s\n".to_owned();
    while rules.len() < RULES_BYTES {
        rules.push_str("# a comment the rules' text carries to every client that asks\n");
    }
    std::fs::write(&rules_file, &rules).unwrap();
    let node = start_node(|c| {
        c.limits.max_frame_bytes = 64 * 1024;
        c.limits.max_buffered_bytes = BUDGET;
        // The held answer stays held for the whole test.
        c.limits.write_timeout = Duration::from_secs(600);
        c.rules = Some(rules_file.clone());
    })
    .await;
    let addr = node.node.local_addr();
    let ask = |id| {
        let mut frame = Vec::new();
        let request = PolicyRequest {
            version: String::new(),
        };
        encode_message(&mut frame, FrameKind::PolicyRequest, id, &request);
        frame
    };
    let mut config = client_config(&node.certs, false);
    let mut transport = quinn::TransportConfig::default();
    transport.stream_receive_window(quinn::VarInt::from_u32(4 * 1024));
    config.transport_config(Arc::new(transport));
    let slow = connect(addr, config).await;
    let (mut send, mut held) = slow.open_bi().await.unwrap();
    send.write_all(&ask(1)).await.unwrap();
    let mut first = vec![0; 1024];
    tokio::time::timeout(WAIT, held.read_exact(&mut first))
        .await
        .expect("the answer's first bytes in time")
        .unwrap();
    let (used, _) = node.node.buffered_bytes();
    assert!(used >= RULES_BYTES, "the held answer counts: {used} bytes");

    let (mut second, mut refused) = slow.open_bi().await.unwrap();
    second.write_all(&ask(2)).await.unwrap();
    second.finish().unwrap();
    let bytes = tokio::time::timeout(WAIT, refused.read_to_end(1 << 20))
        .await
        .expect("the second ask answered in time")
        .unwrap();
    let answers = parse_answers(&bytes);
    assert_eq!(answers.errors.len(), 1, "{:?}", answers.errors);
    assert_eq!(answers.errors[0].0, 2);
    assert_eq!(
        answers.errors[0].1,
        ErrorCode::Overloaded,
        "{:?}",
        answers.errors
    );
    let witness = connect(addr, client_config(&node.certs, false)).await;
    witness_check(&witness, 999).await;
    let (_, peak) = node.node.buffered_bytes();
    assert!(peak <= BUDGET, "held {peak} bytes, budget {BUDGET}");

    // The first answer taken whole: the rules as they are, and its bytes given back.
    send.finish().unwrap();
    let rest = tokio::time::timeout(WAIT, held.read_to_end(1 << 20))
        .await
        .expect("the rest of the answer in time")
        .unwrap();
    first.extend_from_slice(&rest);
    let policy = |bytes: &[u8]| {
        let mut reader = FrameReader::new(1 << 20);
        reader.extend(bytes);
        let frame = reader.next_frame().unwrap().expect("one whole frame");
        assert_eq!(frame.kind, FrameKind::Policy, "{frame:?}");
        decode_policy_message(&frame.payload).unwrap().text
    };
    assert_eq!(policy(&first), rules);
    let again = floodgate_node::exchange::round_trip(&witness, &ask(3), 1 << 20)
        .await
        .unwrap();
    assert_eq!(policy(&again), rules);
    node.node.shutdown().await;
}

/// Checks decided cannot be taken back, so the room their answers may take (twice the frame)
/// is reserved before they are decided: a caller that reads none of its answers gets frames
/// answered while their room fits under seven eighths of the budget, then the next frame
/// refused as `overloaded` and left undecided, and the budget is never passed; small checks
/// are answered throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_are_decided_only_when_their_answers_room_fits_the_budget() {
    const BUDGET: usize = 256 * 1024;
    const STREAMS: usize = 8;
    let node = start_node(|c| {
        c.limits.max_frame_bytes = 64 * 1024;
        c.limits.max_buffered_bytes = BUDGET;
        // The held answers stay held for the whole test.
        c.limits.write_timeout = Duration::from_secs(600);
    })
    .await;
    let addr = node.node.local_addr();
    let mut config = client_config(&node.certs, false);
    let mut transport = quinn::TransportConfig::default();
    transport.stream_receive_window(quinn::VarInt::from_u32(1024));
    config.transport_config(Arc::new(transport));
    let slow = connect(addr, config).await;
    let limit = per_hour(1_000);
    // About 24 KiB of checks a frame, so about 49 KiB of room for each frame's answers: four
    // such streams fit under seven eighths of 256 KiB beside a read, the fifth does not.
    let keys = |stream: usize| -> Vec<Vec<u8>> {
        (0..1_000)
            .map(|i| format!("s{stream}:{i}").into_bytes())
            .collect()
    };
    let mut held = Vec::new();
    let mut outcomes = Vec::new();
    for stream in 0..STREAMS {
        let names = keys(stream);
        let names: Vec<&[u8]> = names.iter().map(Vec::as_slice).collect();
        let frame = check_frame(stream as u64 + 1, &names, &limit);
        let (mut send, mut recv) = slow.open_bi().await.unwrap();
        send.write_all(&frame).await.unwrap();
        // The answer's first bytes: a refusal whole, or the start of a decision batch (its rest
        // held by the node, the caller's window taking 1 KiB).
        let mut reader = FrameReader::new(1 << 20);
        let mut read = 0;
        let whole = loop {
            let mut chunk = [0; 512];
            let n = tokio::time::timeout(WAIT, recv.read(&mut chunk))
                .await
                .expect("an answer's first bytes in time")
                .unwrap()
                .expect("the stream stays open");
            reader.extend(&chunk[..n]);
            read += n;
            if let Some(frame) = reader.next_frame().unwrap() {
                break Some(frame);
            }
            if read >= 512 {
                break None;
            }
        };
        let refused = whole.is_some_and(|frame| {
            assert_eq!(frame.kind, FrameKind::Error, "{frame:?}");
            let error = floodgate::wire::decode_error_frame(&frame.payload).unwrap();
            assert_eq!(
                error.code,
                ErrorCode::Overloaded as u16,
                "{}",
                error.message
            );
            true
        });
        outcomes.push(refused);
        held.push((send, recv));
    }
    let answered = outcomes.iter().take_while(|refused| !**refused).count();
    assert!(
        (1..STREAMS).contains(&answered),
        "answered then refused: {outcomes:?}"
    );
    assert!(
        outcomes[answered..].iter().all(|refused| *refused),
        "once the budget is taken, every later frame is refused: {outcomes:?}"
    );
    let (_, peak) = node.node.buffered_bytes();
    assert!(peak <= BUDGET, "held {peak} bytes, budget {BUDGET}");
    // A refused frame decided nothing; an answered one did. Small checks are answered.
    let witness = connect(addr, client_config(&node.certs, false)).await;
    let remaining = |key: String| {
        let witness = witness.clone();
        async move {
            let answers = exchange(&witness, &check_frame(1, &[key.as_bytes()], &limit)).await;
            assert!(answers.errors.is_empty(), "{:?}", answers.errors);
            answers.decisions[0].1[0].unwrap().remaining()
        }
    };
    assert_eq!(
        remaining(format!("s{answered}:0")).await,
        999,
        "refused: undecided"
    );
    assert_eq!(remaining("s0:0".to_owned()).await, 998, "answered: decided");
    drop(held);
    node.node.shutdown().await;
}

const MS: u64 = 1_000_000;

fn fast(config: &mut NodeConfig) {
    config.cluster.membership = MembershipConfig {
        gossip_interval_ns: 20 * MS,
        suspect_after_ns: 150 * MS,
        dead_after_ns: 300 * MS,
        ..MembershipConfig::default()
    };
    config.cluster.sync_interval = Duration::from_millis(50);
}

/// With its two client places taken, a node closes a third client with `overloaded`, yet a
/// second node still connects as a peer, gossips, and both see a cluster of two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_at_their_limit_do_not_keep_a_peer_out() {
    let first = start_node(|c| {
        fast(c);
        c.limits.max_connections = 2;
    })
    .await;
    let addr = first.node.local_addr();
    let mut clients = Vec::new();
    for i in 0..2u64 {
        let connection = connect(addr, client_config(&first.certs, false)).await;
        // Answered: the node has admitted it (admission follows the node's end of the handshake).
        let answers = exchange(&connection, &check_frame(i, &[b"k"], &per_hour(10))).await;
        assert_eq!(answers.allowed(), 1);
        clients.push(connection);
    }
    assert_eq!(first.node.connection_counts(), (2, 0));

    let third = connect(addr, client_config(&first.certs, false)).await;
    let closed = tokio::time::timeout(WAIT, third.closed())
        .await
        .expect("a client over the limit is closed");
    match closed {
        quinn::ConnectionError::ApplicationClosed(close) => {
            assert_eq!(close.error_code.into_inner(), ErrorCode::Overloaded as u64);
        }
        other => panic!("closed for another reason: {other}"),
    }

    let mut config = NodeConfig::for_tests(&first.certs);
    fast(&mut config);
    config.cluster.seeds = vec![addr.into()];
    let second = Node::start(config).await.unwrap();
    converge(&second, 2).await;
    converge(&first.node, 2).await;
    // The second node's connection may still be moving from its seed dial to its dial by node
    // id: wait for the first node to count it as a peer, beside the two clients.
    let mut counts = first.node.watch_connection_counts();
    // The borrow `wait_for` returns holds the watch's lock: keep only whether it came.
    let counted = tokio::time::timeout(WAIT, async {
        counts.wait_for(|&(_, peers)| peers >= 1).await.is_ok()
    })
    .await;
    assert_eq!(counted, Ok(true), "the second node is counted as a peer");
    assert_eq!(first.node.connection_counts().0, 2, "the clients stay");
    drop(clients);
    second.shutdown().await;
    first.node.shutdown().await;
}

/// A small frame can draw a large answer (a slot table, about 16 KiB, for a 16-byte request):
/// the node answers a read's frames a bounded batch at a time, writing each batch before it
/// answers the next, and still answers every frame the read brought.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_of_small_frames_with_large_answers_is_answered_whole() {
    const REQUESTS: usize = 1_024;
    let node = start_node(|_| {}).await;
    let connection = connect(node.node.local_addr(), client_config(&node.certs, false)).await;
    let mut frames = Vec::new();
    for id in 0..REQUESTS {
        encode_frame(&mut frames, FrameKind::TableRequest, id as u64, &[]);
    }
    let (mut send, mut recv) = connection.open_bi().await.unwrap();
    send.write_all(&frames).await.unwrap();
    send.finish().unwrap();
    let answers = tokio::time::timeout(WAIT, recv.read_to_end(64 << 20))
        .await
        .expect("the answers in time")
        .unwrap();
    let mut reader = floodgate::wire::FrameReader::new(1 << 20);
    reader.extend(&answers);
    let mut ids = Vec::new();
    while let Some(frame) = reader.next_frame().unwrap() {
        assert_eq!(frame.kind, FrameKind::SlotTable);
        ids.push(frame.request_id);
    }
    assert_eq!(ids, (0..REQUESTS as u64).collect::<Vec<_>>());
    // Far past the bytes a stream holds before writing them (64 KiB): many batches.
    assert!(
        answers.len() > 8 << 20,
        "{} bytes of answers",
        answers.len()
    );
    // Held at most 64 KiB of answers and the one that passed it (a table), in a buffer grown
    // by doubling, beside the read's 16 KiB of requests: never the read's answers at once.
    let (_, peak) = node.node.buffered_bytes();
    assert!(peak <= 256 * 1024, "held {peak} bytes at once");
}
