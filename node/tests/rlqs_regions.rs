//! RLQS `scope: global` across two regions of one node each: Envoys of one bucket streaming to
//! either region share one limit (each region's Envoys split its part; the parts move with
//! demand, a shrink reaching its region before the other grows), where without
//! `--rlqs-global-domain` each region would give its Envoys the whole limit.
//!
//! Every wait is bounded by a timeout; nothing sleeps. The parts move on the nodes' one-second
//! rounds, so the waits are for a few rounds.

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
use floodgate::cluster::MembershipConfig;
use floodgate_node::{Node, NodeConfig, RlqsSettings};
use tokio::sync::{mpsc, watch};
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;

const CONFIG: &str = "\
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 600}
";
const LIMIT: u64 = 600;
const MS: u64 = 1_000_000;
const WAIT: Duration = Duration::from_secs(20);

/// A node of `region` serving RLQS from `file`, its buckets global when `global`.
fn node_in(region: &str, file: &std::path::Path, global: bool, config: &mut NodeConfig) {
    config.cluster.membership = MembershipConfig {
        gossip_interval_ns: 20 * MS,
        suspect_after_ns: 1_000 * MS,
        dead_after_ns: 2_000 * MS,
        ..MembershipConfig::default()
    };
    config.cluster.region = region.to_owned();
    config.rls = Some(rls_settings(file.to_owned()));
    config.rlqs = Some(RlqsSettings::new("127.0.0.1:0".parse().unwrap()));
    config.admin = Some("127.0.0.1:0".parse().unwrap());
    if global {
        config.rlqs_global_domains = ["edge".to_owned()].into_iter().collect();
    }
}

/// Regions `a` and `b`, one node each, `b` joining through `a`; returns once each counts the
/// other as its region's owner.
async fn two_regions(file: &std::path::Path, global: bool) -> (TestNode, Node) {
    let first = start_node(|c| node_in("a", file, global, c)).await;
    let mut config = NodeConfig::for_tests(&first.certs);
    node_in("b", file, global, &mut config);
    config.cluster.seeds = vec![first.node.local_addr().into()];
    let second = Node::start(config).await.unwrap();
    for (node, other) in [(&first.node, &second), (&second, &first.node)] {
        let knows = tokio::time::timeout(WAIT, node.reaches(&[other.node_id()])).await;
        assert!(
            knows.is_ok(),
            "{} does not count the other region's node as an owner",
            node.node_id()
        );
    }
    (first, second)
}

/// One Envoy's stream; a task keeps the last token bucket's `tokens_per_fill`, and counts
/// every message on `changes` (shared by the test's Envoys).
struct Envoy {
    reports: mpsc::Sender<RateLimitQuotaUsageReports>,
    tokens: watch::Receiver<u32>,
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
    let (sender, tokens) = watch::channel(0);
    let changes = changes.clone();
    tokio::spawn(async move {
        while let Ok(Some(answer)) = answers.message().await {
            for action in answer.bucket_action {
                if let Some(Action::QuotaAssignmentAction(q)) = action.bucket_action
                    && let Some(Strategy::TokenBucket(t)) =
                        q.rate_limit_strategy.and_then(|s| s.strategy)
                {
                    sender.send_replace(t.tokens_per_fill.map_or(0, |v| v.value));
                }
            }
            changes.send_modify(|n| *n += 1);
        }
    });
    Envoy { reports, tokens }
}

impl Envoy {
    async fn report(&self, allowed: u64, elapsed_s: i64) {
        let usage = BucketQuotaUsage {
            bucket_id: Some(BucketId {
                bucket: [("user".to_owned(), "shared".to_owned())]
                    .into_iter()
                    .collect(),
            }),
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

    fn tokens(&self) -> u64 {
        u64::from(*self.tokens.borrow())
    }
}

/// What the two Envoys may admit in a period: `sum(1 + t_i)`.
fn committed(a: &Envoy, b: &Envoy) -> u64 {
    2 + a.tokens() + b.tokens()
}

/// Waits until `done` holds, checking after every assignment that the Envoys together
/// commit at most the limit; fails with what they hold otherwise.
async fn watch_until(
    changes: &watch::Sender<u64>,
    a: &Envoy,
    b: &Envoy,
    what: &str,
    done: impl Fn(u64, u64) -> bool,
) {
    let mut changed = changes.subscribe();
    let reached = tokio::time::timeout(WAIT, async {
        loop {
            assert!(
                committed(a, b) <= LIMIT,
                "the Envoys hold {} and {}: past the limit of {LIMIT}",
                a.tokens(),
                b.tokens()
            );
            if done(a.tokens(), b.tokens()) {
                return;
            }
            changed.changed().await.unwrap();
        }
    })
    .await;
    assert!(
        reached.is_ok(),
        "{what}: the Envoys hold {} and {}",
        a.tokens(),
        b.tokens()
    );
}

fn rlqs_addr(node: &Node) -> SocketAddr {
    node.rlqs_addr().unwrap()
}

fn config_file() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, CONFIG).unwrap();
    (dir, file)
}

#[tokio::test]
async fn envoys_in_two_regions_share_one_global_limit_by_demand() {
    let (_dir, file) = config_file();
    let (first, second) = two_regions(&file, true).await;
    let (changes, _) = watch::channel(0);
    let a = open(rlqs_addr(&first.node), &changes).await;
    let b = open(rlqs_addr(&second), &changes).await;
    // Each region starts at its floor (a quarter of the limit) and, with no demand known, is
    // given half: each lone Envoy holds its region's part less its token of burst.
    a.report(1, 0).await;
    b.report(1, 0).await;
    watch_until(&changes, &a, &b, "both get a share", |x, y| x > 0 && y > 0).await;
    // a's Envoy is busy, b's idle: a's part grows, out of what b gives up, never past N.
    for _ in 0..4 {
        a.report(400, 5).await;
        b.report(5, 5).await;
    }
    watch_until(&changes, &a, &b, "a's part grows by demand", |x, y| {
        x > y * 2 && 2 + x + y >= LIMIT - 8
    })
    .await;
    let a_held = a.tokens();
    // The demand turns: b's part grows only once a has shrunk (each keeps its floor, a
    // quarter of the limit).
    for _ in 0..6 {
        a.report(5, 5).await;
        b.report(400, 5).await;
    }
    watch_until(&changes, &a, &b, "the parts follow the demand", |x, y| {
        y > x * 2 && x < a_held
    })
    .await;
    let page = metrics_page(&second).await;
    let sent = metric_value(
        &page,
        "floodgate_rlqs_region_claims_total{direction=\"sent\"}",
    );
    assert!(sent >= 1.0, "{sent}");
    drop((a, b));
    second.shutdown().await;
    first.node.shutdown().await;
}

/// Without `--rlqs-global-domain` a bucket is the region's own: each region's lone Envoy
/// gets the whole limit (what the global test's bound rules out).
#[tokio::test]
async fn without_the_global_flag_each_region_gives_the_whole_limit() {
    let (_dir, file) = config_file();
    let (first, second) = two_regions(&file, false).await;
    let (changes, _) = watch::channel(0);
    let a = open(rlqs_addr(&first.node), &changes).await;
    let b = open(rlqs_addr(&second), &changes).await;
    a.report(1, 0).await;
    b.report(1, 0).await;
    let mut changed = changes.subscribe();
    let both = tokio::time::timeout(WAIT, async {
        while a.tokens() == 0 || b.tokens() == 0 {
            changed.changed().await.unwrap();
        }
    })
    .await;
    assert!(both.is_ok());
    assert_eq!((a.tokens(), b.tokens()), (LIMIT - 1, LIMIT - 1));
    drop((a, b));
    second.shutdown().await;
    first.node.shutdown().await;
}

/// One node of region `a` that has heard (by gossip) of a member of region `b` speaking
/// `versions`, which then stays silent; returns the tokens a lone Envoy of `a` is given for
/// a global bucket, first and after two of the node's one-second rounds.
async fn lone_envoy_beside_a_silent_region(
    file: &std::path::Path,
    versions: (u8, u8),
) -> (u64, u64, TestNode) {
    let node = start_node(|c| {
        node_in("a", file, true, c);
        // The silent member stays alive for the whole test.
        c.cluster.membership = MembershipConfig {
            suspect_after_ns: 600 * 1_000_000_000,
            dead_after_ns: 1_200 * 1_000_000_000,
            ..MembershipConfig::default()
        };
    })
    .await;
    gossip_silent_member(
        &node,
        ("silent-peer", "127.0.0.1:9"),
        "b",
        floodgate::protocol::VersionRange::new(versions.0, versions.1),
    )
    .await;
    let mut tables = node.node.watch_slot_table();
    let known = tokio::time::timeout(WAIT, async {
        while node.node.member_addr("silent-peer").is_none() {
            tables.changed().await.unwrap();
        }
    })
    .await;
    assert!(known.is_ok(), "the silent member's gossip was not taken");
    assert_eq!(node.node.cluster_version(), versions.1);
    let (changes, _) = watch::channel(0);
    let a = open(rlqs_addr(&node.node), &changes).await;
    let mut changed = changes.subscribe();
    a.report(1, 0).await;
    let first = tokio::time::timeout(WAIT, async {
        while a.tokens() == 0 {
            changed.changed().await.unwrap();
        }
        a.tokens()
    })
    .await
    .expect("a first assignment");
    // Rounds run every second; a later assignment (a push) may come with one of them.
    let later = tokio::time::timeout(Duration::from_secs(3), async {
        loop {
            changed.changed().await.unwrap();
        }
    })
    .await;
    assert!(later.is_err());
    (first, a.tokens(), node)
}

/// A member below version 8 anywhere: each region splits the whole limit (logged once and
/// counted); with every member on 8, a lone region starts at its floor and grows to what the
/// silent region does not hold (its floor stays reserved for it).
#[tokio::test]
async fn a_member_below_version_8_keeps_each_regions_whole_limit() {
    let (_dir, file) = config_file();
    let (first, later, node) = lone_envoy_beside_a_silent_region(&file, (2, 7)).await;
    assert_eq!((first, later), (LIMIT - 1, LIMIT - 1));
    let page = metrics_page(&node.node).await;
    assert!(metric_value(&page, "floodgate_rlqs_global_unsplit_total") >= 1.0);
    node.node.shutdown().await;

    let (first, later, node) = lone_envoy_beside_a_silent_region(&file, (2, 8)).await;
    let floor = LIMIT / 4;
    assert_eq!((first, later), (floor - 1, LIMIT - floor - 1));
    node.node.shutdown().await;
}
