//! RLQS across a cluster: Envoys (tonic clients) streaming one bucket to different nodes share
//! one limit, computed by the bucket's owner; the owner crashing (its state rebuilt from the
//! next reports, each carrying what its Envoy holds); and a member of an older protocol
//! version, with which every node keeps its own shares as before, unless that member is of
//! another region.
//!
//! Every wait is for answers the nodes send at once, bounded by a timeout; nothing sleeps.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::Strategy;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use floodgate_node::{Node, NodeConfig, RlqsSettings};
use tokio::sync::{mpsc, watch};
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;

const CONFIG: &str = "\
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 600, name: per-user}
";
const LIMIT: u64 = 600;

/// Each node serves RLQS from the same file.
fn with_rlqs(file: &std::path::Path) -> impl Fn(&mut NodeConfig) + '_ {
    move |c: &mut NodeConfig| {
        c.rls = Some(rls_settings(file.to_owned()));
        c.rlqs = Some(RlqsSettings::new("127.0.0.1:0".parse().unwrap()));
        c.admin = Some("127.0.0.1:0".parse().unwrap());
    }
}

fn config_file() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, CONFIG).unwrap();
    (dir, file)
}

fn user(name: &str) -> BucketId {
    BucketId {
        bucket: [("user".to_owned(), name.to_owned())].into_iter().collect(),
    }
}

/// A user whose bucket the node `id` owns by `node`'s table.
fn user_owned_by(node: &Node, id: &str) -> String {
    let table = node.slot_table();
    (0..10_000)
        .map(|i| format!("u{i}"))
        .find(|name| {
            let slot = floodgate_node::rlqs::bucket_slot("edge", &[("user", name)]);
            table.owner(slot) == Some(id)
        })
        .unwrap()
}

/// One Envoy's stream; a task keeps the number of assignments it was sent and the last
/// token bucket's `tokens_per_fill` (0 before any, `u32::MAX` for a denial), and counts every
/// message on `changes` (shared by a test's Envoys).
struct Envoy {
    reports: mpsc::Sender<RateLimitQuotaUsageReports>,
    latest: watch::Receiver<(u64, u32)>,
}

async fn open(addr: SocketAddr, changes: &watch::Sender<u64>) -> Envoy {
    let mut client = RateLimitQuotaServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let (reports, receiver) = mpsc::channel(16);
    let mut answers = client
        .stream_rate_limit_quotas(ReceiverStream::new(receiver))
        .await
        .unwrap()
        .into_inner();
    let (sender, latest) = watch::channel((0, 0));
    let changes = changes.clone();
    tokio::spawn(async move {
        while let Ok(Some(answer)) = answers.message().await {
            for action in answer.bucket_action {
                let tokens = match action.bucket_action {
                    Some(Action::QuotaAssignmentAction(q)) => {
                        match q.rate_limit_strategy.and_then(|s| s.strategy) {
                            Some(Strategy::TokenBucket(t)) => {
                                t.tokens_per_fill.map_or(0, |v| v.value)
                            }
                            _ => u32::MAX,
                        }
                    }
                    _ => 0,
                };
                sender.send_modify(|(n, t)| {
                    *n += 1;
                    *t = tokens;
                });
            }
            changes.send_modify(|n| *n += 1);
        }
    });
    Envoy { reports, latest }
}

impl Envoy {
    async fn report(&self, id: &BucketId, allowed: u64, elapsed_s: i64) {
        let usage = BucketQuotaUsage {
            bucket_id: Some(id.clone()),
            time_elapsed: Some(PbDuration {
                seconds: elapsed_s,
                nanos: 0,
            }),
            num_requests_allowed: allowed,
            num_requests_denied: 0,
        };
        let message = RateLimitQuotaUsageReports {
            domain: "edge".to_owned(),
            bucket_quota_usages: vec![usage],
        };
        self.reports.send(message).await.unwrap();
    }

    fn tokens(&self) -> u32 {
        self.latest.borrow().1
    }

    fn received(&self) -> u64 {
        self.latest.borrow().0
    }

    /// Waits (10 s at most) for an assignment after the first `seen`; returns its tokens.
    async fn next_after(&mut self, seen: u64) -> u32 {
        let waited = tokio::time::timeout(
            Duration::from_secs(10),
            self.latest.wait_for(|(n, _)| *n > seen),
        )
        .await;
        waited.expect("an assignment within 10 s").unwrap().1
    }
}

/// What the Envoys' assignments let them admit in one period: `sum(1 + t_i)`.
fn committed(envoys: &[&Envoy]) -> u64 {
    envoys.iter().map(|e| 1 + u64::from(e.tokens())).sum()
}

/// Waits (10 s at most) until every Envoy holds a token bucket and together they commit at
/// most `bound`; fails with what they hold otherwise.
async fn settled_within(changes: &watch::Sender<u64>, envoys: &[&Envoy], bound: u64) {
    let mut changed = changes.subscribe();
    let ok = |envoys: &[&Envoy]| {
        envoys
            .iter()
            .all(|e| e.tokens() > 0 && e.tokens() != u32::MAX)
            && committed(envoys) <= bound
    };
    let settled = tokio::time::timeout(Duration::from_secs(10), async {
        while !ok(envoys) {
            changed.changed().await.unwrap();
        }
    })
    .await;
    let held: Vec<u32> = envoys.iter().map(|e| e.tokens()).collect();
    assert!(
        settled.is_ok(),
        "the Envoys hold {held:?}: {} committed, more than {bound}",
        committed(envoys)
    );
}

/// An Envoy on `first` and one on `second` report `bucket` once each and take their first
/// assignments; returns once together they commit at most the limit (with the sender their
/// assignments are counted on).
async fn one_envoy_on_each(
    first: &Node,
    second: &Node,
    bucket: &BucketId,
) -> (watch::Sender<u64>, Envoy, Envoy) {
    let (changes, _) = watch::channel(0);
    let mut a = open(rlqs_addr(first), &changes).await;
    let mut b = open(rlqs_addr(second), &changes).await;
    a.report(bucket, 1, 0).await;
    a.next_after(0).await;
    b.report(bucket, 1, 0).await;
    b.next_after(0).await;
    settled_within(&changes, &[&a, &b], LIMIT).await;
    (changes, a, b)
}

fn rlqs_addr(node: &Node) -> SocketAddr {
    node.rlqs_addr().unwrap()
}

#[tokio::test]
async fn envoys_streaming_to_three_nodes_share_one_limit() {
    let (_dir, file) = config_file();
    let (nodes, first) = cluster_with(3, with_rlqs(&file)).await;
    let all: Vec<&Node> = std::iter::once(&first.node).chain(nodes.iter()).collect();
    let bucket = user("shared");
    let (changes, _) = watch::channel(0);
    let mut envoys = Vec::new();
    for node in &all {
        envoys.push(open(rlqs_addr(node), &changes).await);
    }
    // One after another: each new Envoy is counted by the same owner, wherever it streams.
    for i in 0..envoys.len() {
        envoys[i].report(&bucket, 1, 0).await;
        envoys[i].next_after(0).await;
        let joined: Vec<&Envoy> = envoys[..=i].iter().collect();
        settled_within(&changes, &joined, LIMIT).await;
    }
    // Steady reports, one busier Envoy: the sum stays within the limit, every Envoy keeps at
    // least the floor (half an even split).
    for _ in 0..3 {
        for (i, envoy) in envoys.iter_mut().enumerate() {
            let seen = envoy.received();
            envoy
                .report(&bucket, if i == 0 { 200 } else { 20 }, 5)
                .await;
            // Every report is answered, relayed or not.
            envoy.next_after(seen).await;
        }
        let every: Vec<&Envoy> = envoys.iter().collect();
        settled_within(&changes, &every, LIMIT).await;
    }
    let floor = (LIMIT as u32 - 3) / 6;
    for envoy in &envoys {
        assert!(envoy.tokens() >= floor, "{} < {floor}", envoy.tokens());
    }
    // The metrics are the process's (every node of this test and the other tests running
    // beside it record into one registry): two of the three Envoys stream to a node that does
    // not own the bucket, so at least 4 rounds of 2 reports were relayed and taken.
    let page = metrics_page(&first.node).await;
    let sent = metric_value(
        &page,
        "floodgate_rlqs_relayed_reports_total{direction=\"sent\"}",
    );
    let received = metric_value(
        &page,
        "floodgate_rlqs_relayed_reports_total{direction=\"received\"}",
    );
    assert!(sent >= 8.0 && received >= 8.0, "{sent} {received}");
    drop(envoys);
    for node in nodes {
        node.shutdown().await;
    }
    first.node.shutdown().await;
}

#[tokio::test]
async fn the_owner_crashing_rebuilds_the_shares_from_the_next_reports_within_the_limit() {
    let (_dir, file) = config_file();
    let (mut nodes, first) = cluster_with(3, with_rlqs(&file)).await;
    let doomed = nodes.pop().unwrap();
    let name = user_owned_by(&first.node, doomed.node_id());
    let bucket = user(&name);
    let (changes, mut a, mut b) = one_envoy_on_each(&first.node, &nodes[0], &bucket).await;
    let before = (a.tokens(), b.tokens());

    doomed.crash();
    converge(&first.node, 2).await;
    converge(&nodes[0], 2).await;
    // The new owner hears of A first, with the share A holds: it keeps it (B, not heard of
    // yet, may still hold the rest) rather than give A the whole limit.
    let seen = a.received();
    a.report(&bucket, 20, 5).await;
    let now = a.next_after(seen).await;
    assert!(now <= before.0, "A grew to {now} from {}", before.0);
    // A newcomer while the bucket settles gets the least; B reports what it holds.
    let mut c = open(rlqs_addr(&nodes[0]), &changes).await;
    c.report(&bucket, 1, 0).await;
    assert_eq!(c.next_after(0).await, 1);
    let seen = b.received();
    b.report(&bucket, 20, 5).await;
    let now = b.next_after(seen).await;
    assert!(now <= before.1, "B grew to {now} from {}", before.1);
    settled_within(&changes, &[&a, &b, &c], LIMIT + 2).await;
    drop((a, b, c));
    for node in nodes {
        node.shutdown().await;
    }
    first.node.shutdown().await;
}

/// A member gossiped as speaking versions 2 to 6 (no relay): a node keeps the shares of every
/// bucket itself, the old member's buckets too, as the build before relaying did. (The old
/// member's address answers nothing: a report relayed to it would get no assignment.)
#[tokio::test]
async fn with_a_member_of_an_older_version_each_node_keeps_its_own_shares() {
    let (_dir, file) = config_file();
    let node = start_node(|c| {
        with_rlqs(&file)(c);
        // The old member stays alive for the whole test without gossiping again.
        c.cluster.membership = floodgate::cluster::MembershipConfig {
            suspect_after_ns: 600 * 1_000_000_000,
            dead_after_ns: 1_200 * 1_000_000_000,
            ..floodgate::cluster::MembershipConfig::default()
        };
    })
    .await;
    gossip_silent_member(
        &node,
        ("old-peer", "127.0.0.1:9"),
        "local",
        floodgate::protocol::VersionRange::new(2, 6),
    )
    .await;
    let mut tables = node.node.watch_slot_table();
    let known = tokio::time::timeout(
        Duration::from_secs(10),
        tables.wait_for(|table| table.nodes().iter().any(|n| n == "old-peer")),
    )
    .await
    .is_ok();
    assert!(known, "the old member's gossip was not taken");
    assert_eq!(node.node.cluster_version(), 6);
    let name = user_owned_by(&node.node, "old-peer");
    let (changes, _) = watch::channel(0);
    let mut envoy = open(rlqs_addr(&node.node), &changes).await;
    envoy.report(&user(&name), 1, 0).await;
    assert_eq!(envoy.next_after(0).await, LIMIT as u32 - 1);
    node.node.shutdown().await;
}

/// A relay goes to the bucket's owner in this region's table and no further, so a member of
/// another region on a build before relaying (2 to 6) leaves the cluster version at 6 and this
/// region's nodes still relay: Envoys streaming one bucket to both nodes share one limit.
#[tokio::test]
async fn an_older_member_of_another_region_does_not_stop_relaying() {
    let (_dir, file) = config_file();
    let (nodes, first) = cluster_with(2, |c| {
        with_rlqs(&file)(c);
        // The other region's member stays alive for the whole test without gossiping again.
        c.cluster.membership.suspect_after_ns = 600 * 1_000_000_000;
        c.cluster.membership.dead_after_ns = 1_200 * 1_000_000_000;
    })
    .await;
    let mut tables = first.node.watch_slot_table();
    gossip_silent_member(
        &first,
        ("old-elsewhere", "127.0.0.1:9"),
        "elsewhere",
        floodgate::protocol::VersionRange::new(2, 6),
    )
    .await;
    let heard = tokio::time::timeout(Duration::from_secs(10), async {
        while first.node.cluster_version() != 6 {
            tables.changed().await.unwrap();
        }
    })
    .await;
    assert!(heard.is_ok(), "the other region's member was not taken");
    let bucket = user(&user_owned_by(&first.node, nodes[0].node_id()));
    // One Envoy streams to the node that relays, the other to the owner.
    let envoys = one_envoy_on_each(&first.node, &nodes[0], &bucket).await;
    drop(envoys);
    for node in nodes {
        node.shutdown().await;
    }
    first.node.shutdown().await;
}

/// What a peer (a node certificate) sends as RLQS relays is validated before anything is kept:
/// junk is answered with `malformed_payload` in words, reports in another node's name with
/// `forbidden`, and a junk one-way assignment message is counted and dropped; the node keeps
/// serving.
#[tokio::test]
async fn junk_relay_messages_from_a_peer_are_refused_in_words() {
    use floodgate::wire::{
        ErrorCode, FrameKind, FrameReader, RlqsReportBatch, decode_error_frame, encode_frame,
        encode_message,
    };
    let (_dir, file) = config_file();
    let node = start_node(with_rlqs(&file)).await;
    let connection = connect(node.node.local_addr(), peer_config(&node.certs)).await;
    let refusal = |bytes: Vec<u8>| {
        let mut reader = FrameReader::new(1 << 20);
        reader.extend(&bytes);
        let frame = reader.next_frame().unwrap().unwrap();
        assert_eq!(frame.kind, FrameKind::Error);
        let error = decode_error_frame(&frame.payload).unwrap();
        (ErrorCode::from_u16(error.code).unwrap(), error.message)
    };
    let mut junk = Vec::new();
    encode_frame(&mut junk, FrameKind::RlqsReports, 5, &[0xAB; 40]);
    let answer = floodgate_node::exchange::round_trip(&connection, &junk, 1 << 20)
        .await
        .unwrap();
    let (code, message) = refusal(answer);
    assert_eq!(code, ErrorCode::MalformedPayload);
    assert!(message.contains("RLQS report batch"), "{message}");

    let mut forged = Vec::new();
    let batch = RlqsReportBatch {
        from: "someone-else".into(),
        ..RlqsReportBatch::default()
    };
    encode_message(&mut forged, FrameKind::RlqsReports, 6, &batch);
    let answer = floodgate_node::exchange::round_trip(&connection, &forged, 1 << 20)
        .await
        .unwrap();
    let (code, message) = refusal(answer);
    assert_eq!(code, ErrorCode::Forbidden);
    assert!(message.contains("`someone-else`"), "{message}");

    let mut junk = Vec::new();
    encode_frame(&mut junk, FrameKind::RlqsAssignments, 0, &[0xCD; 40]);
    let mut stream = connection.open_uni().await.unwrap();
    stream.write_all(&junk).await.unwrap();
    stream.finish().unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.stopped()).await;
    // Still serving Envoys.
    let (changes, _) = watch::channel(0);
    let mut envoy = open(rlqs_addr(&node.node), &changes).await;
    envoy.report(&user("after"), 1, 0).await;
    assert_eq!(envoy.next_after(0).await, LIMIT as u32 - 1);
    node.node.shutdown().await;
}

/// A relayed report is taken only by the bucket's owner by the receiver's own table: one for a
/// bucket another member owns is left out of the answer (the sender then tries that owner),
/// where two owners would each split the whole limit.
#[tokio::test]
async fn a_relay_for_a_bucket_another_member_owns_is_left_out_of_the_answer() {
    use floodgate::wire::{
        FrameKind, FrameReader, RlqsReportBatch, WireRlqsBucket, WireRlqsEntry, WireRlqsReport,
        decode_rlqs_assignments, encode_message,
    };
    let (_dir, file) = config_file();
    let (nodes, first) = cluster_with(2, with_rlqs(&file)).await;
    let other = nodes[0].node_id().to_owned();
    let mine = user_owned_by(&first.node, first.node.node_id());
    let theirs = user_owned_by(&first.node, &other);
    let connection = connect(first.node.local_addr(), peer_config(&first.certs)).await;
    let report = |stream: u64, name: &str| WireRlqsReport {
        stream,
        bucket: WireRlqsBucket {
            domain: "edge".into(),
            entries: vec![WireRlqsEntry {
                key: "user".into(),
                value: name.into(),
            }],
        },
        requests: LIMIT,
        period_s: 60,
        allowed: 1,
        ..WireRlqsReport::default()
    };
    // From the other member (the development certificate names every loopback id).
    let batch = RlqsReportBatch {
        from: other.clone(),
        reports: vec![report(1, &mine), report(2, &theirs)],
        closed: vec![],
    };
    let mut frame = Vec::new();
    encode_message(&mut frame, FrameKind::RlqsReports, 9, &batch);
    let answer = floodgate_node::exchange::round_trip(&connection, &frame, 1 << 20)
        .await
        .unwrap();
    let mut reader = FrameReader::new(1 << 20);
    reader.extend(&answer);
    let frame = reader.next_frame().unwrap().unwrap();
    assert_eq!(frame.kind, FrameKind::RlqsAssignments);
    let assignments = decode_rlqs_assignments(&frame.payload).unwrap().assignments;
    let streams: Vec<u64> = assignments.iter().map(|a| a.stream).collect();
    assert_eq!(
        streams,
        vec![1],
        "only the bucket this node owns is answered"
    );
    for node in nodes {
        node.shutdown().await;
    }
    first.node.shutdown().await;
}
