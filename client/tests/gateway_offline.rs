//! The gateway when no node answers: it starts from its rules file (or its cache of a node's
//! rules), applies each rule's failure mode meanwhile (fail-open rules allow through the local
//! fallback, fail-closed rules answer 503), says truthfully where its rules came from, and takes
//! a node's rules once one answers.
//!
//! "No node answers" is a UDP socket this test holds open and never reads: QUIC handshakes to it
//! get no answer, deterministically. Waits are for events (rules changes), bounded.

mod common;

#[path = "../examples/gateway/app.rs"]
mod app;
#[path = "../examples/gateway/rules_source.rs"]
mod rules_source;

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use common::*;
use floodgate_client::core::policy::{Action, Policy};
use floodgate_client::{
    ClientConfig, LimiterConfig, LimiterError, PolicySource, RateLimiter, RequestInfo,
};
use floodgate_node::{Node, NodeConfig};
use rules_source::LocalRules;

const EXAMPLE: &str = include_str!("../../rules/example.yaml");

/// An address where nothing answers, held for the test's duration.
fn silent_node() -> (UdpSocket, SocketAddr) {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = socket.local_addr().unwrap();
    (socket, addr)
}

/// Short waits: nothing will answer, and the failure modes should decide soon.
fn offline_config(certs: &Certs) -> ClientConfig {
    let mut config = client_config(certs);
    config.timeout = Duration::from_millis(100);
    config.connect_timeout = Duration::from_millis(300);
    config
}

fn limiter_config() -> LimiterConfig {
    LimiterConfig {
        refresh_interval: Duration::from_millis(100),
        policy_timeout: Duration::from_millis(600),
    }
}

fn login() -> RequestInfo {
    let mut info = RequestInfo::new("POST", "/v1/auth/login");
    info.peer = Some("203.0.113.7".parse().unwrap());
    info
}

fn tenant_request() -> RequestInfo {
    let mut info = RequestInfo::new("GET", "/v1/data");
    info.tenant = Some("initech".to_owned());
    info.plan = Some("free".to_owned());
    info.peer = Some("203.0.113.8".parse().unwrap());
    info
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_rules_and_no_reachable_node_start_and_apply_each_rules_failure_mode() {
    let certs = certs();
    let (_silent, addr) = silent_node();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.yaml");
    std::fs::write(&file, EXAMPLE).unwrap();
    let (policy, local) = rules_source::load_local(Some(&file), None)
        .unwrap()
        .unwrap();
    assert_eq!(local, LocalRules::File(file.clone()));
    let limiter = RateLimiter::connect_with(
        &[addr],
        offline_config(&certs),
        limiter_config(),
        Some(policy),
    )
    .await
    .expect("file rules are enough to start");
    assert_eq!(limiter.policy_source(), Some(PolicySource::Local));
    let said = rules_source::describe(&limiter, Some(&local));
    assert!(said.contains("from the rules file"), "{said}");
    assert!(!said.contains("node 127"), "must not claim a node: {said}");

    // `login` fails closed: 503, naming the rule.
    let decision = limiter.check(&login()).await;
    assert!(
        matches!(decision.verdict.action, Action::Unavailable { .. }),
        "{:?}",
        decision.verdict
    );
    assert_eq!(decision.response.status, 503);
    assert!(decision.response.body.unwrap().contains("\"login\""));

    // `tenant` and `global` fail open: allowed through the local fallback.
    let decision = limiter.check(&tenant_request()).await;
    assert_eq!(decision.response.status, 200, "{:?}", decision.verdict);
    assert!(decision.fallbacks >= 2, "{decision:?}");
    limiter.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_local_rules_the_error_says_no_node_served_rules() {
    let certs = certs();
    let (_silent, addr) = silent_node();
    let error =
        RateLimiter::connect_with(&[addr], offline_config(&certs), limiter_config(), None).await;
    let Err(error @ LimiterError::NoPolicy(_)) = error else {
        panic!("started without rules");
    };
    let text = error.to_string();
    assert!(text.contains("no node served rules"), "{text}");
    assert!(text.contains(&addr.to_string()), "{text}");
}

/// A gateway started from file rules takes a node's rules once the node comes up, says so, and
/// caches them; a later start with no node answering uses that cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_answers_later_replaces_the_file_rules_and_fills_the_cache() {
    let certs = certs();
    let dir = tempfile::tempdir().unwrap();
    // The node serves a different file from the gateway's, so the switch is visible.
    let served = EXAMPLE.replace("limit: 10/min", "limit: 11/min");
    let node_rules = dir.path().join("node-rules.yaml");
    std::fs::write(&node_rules, &served).unwrap();
    let gateway_policy = Policy::from_yaml(EXAMPLE).unwrap();
    let served_version = Policy::from_yaml(&served).unwrap().version().to_owned();

    // A free port for the node to come up on later.
    let addr = {
        let (socket, addr) = silent_node();
        drop(socket);
        addr
    };
    let limiter = RateLimiter::connect_with(
        &[addr],
        offline_config(&certs),
        limiter_config(),
        Some(gateway_policy),
    )
    .await
    .unwrap();
    assert_eq!(limiter.policy_source(), Some(PolicySource::Local));
    let mut changes = limiter.policy_changes();
    let node = start_node_with_rules(&certs, addr, &node_rules).await;

    let deadline = tokio::time::Instant::now() + PATIENCE;
    while limiter.policy_version().as_deref() != Some(served_version.as_str()) {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        assert!(!left.is_zero(), "the node's rules never arrived");
        let _ = tokio::time::timeout(left, changes.changed()).await;
    }
    match limiter.policy_source() {
        Some(PolicySource::Node { addr: from, text }) => {
            assert_eq!(from, addr);
            assert_eq!(&*text, served.as_str());
        }
        other => panic!("rules from {other:?}"),
    }
    assert!(rules_source::describe(&limiter, None).contains(&format!("from node {addr}")));

    let cache = dir.path().join("cache.yaml");
    let mut last = None;
    assert!(rules_source::save_if_from_node(&limiter, &cache, &mut last).unwrap());
    assert!(!rules_source::save_if_from_node(&limiter, &cache, &mut last).unwrap());
    limiter.close().await;
    node.shutdown().await;

    // Next start: no node answers, no --rules; the cache is what it starts from.
    let (_silent, silent) = silent_node();
    let (policy, local) = rules_source::load_local(None, Some(&cache))
        .unwrap()
        .unwrap();
    assert_eq!(local, LocalRules::Cache(cache.clone()));
    assert_eq!(policy.version(), served_version);
    let written = std::fs::read_to_string(&cache).unwrap();
    assert!(
        written.starts_with("# floodgate rules cache, format 1\n"),
        "{written}"
    );

    // A cache written by the build before the format line (the bare text) reads the same.
    let bare = dir.path().join("bare.yaml");
    std::fs::write(&bare, served.as_bytes()).unwrap();
    let (policy_bare, _) = rules_source::load_local(None, Some(&bare))
        .unwrap()
        .unwrap();
    assert_eq!(policy_bare.version(), served_version);
    // One of a later format is skipped (the nodes may still answer), not misread.
    let newer = dir.path().join("newer.yaml");
    std::fs::write(
        &newer,
        format!("# floodgate rules cache, format 2\n{served}"),
    )
    .unwrap();
    assert!(
        rules_source::load_local(None, Some(&newer))
            .unwrap()
            .is_none()
    );
    let limiter = RateLimiter::connect_with(
        &[silent],
        offline_config(&certs),
        limiter_config(),
        Some(policy),
    )
    .await
    .unwrap();
    assert!(rules_source::describe(&limiter, Some(&local)).contains("cache"));
    assert_eq!(limiter.check(&login()).await.response.status, 503);
    limiter.close().await;
}

/// A request on a plan the rules do not declare (`Free`, not `free`) is limited by the default
/// and counted per rule in the gateway's metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_plans_are_limited_by_default_and_counted() {
    let certs = certs();
    let (_silent, addr) = silent_node();
    let limiter = RateLimiter::connect_with(
        &[addr],
        offline_config(&certs),
        limiter_config(),
        Some(Policy::from_yaml(EXAMPLE).unwrap()),
    )
    .await
    .unwrap();
    let metrics = app::GatewayMetrics::new();
    let mut request = tenant_request();
    request.plan = Some("Free".to_owned());
    let decision = limiter.check(&request).await;
    metrics.record(&decision);
    let tenant = decision
        .verdict
        .rules
        .iter()
        .find(|r| &*r.rule == "tenant")
        .expect("the tenant rule applies to an unknown plan");
    assert!(tenant.unknown_plan);
    assert_eq!(tenant.limit.rate(), 100);
    let text = metrics.render();
    assert!(
        text.contains("floodgate_gateway_unknown_plan_total{rule=\"tenant\"} 1"),
        "{text}"
    );
    assert!(
        !text.contains("unknown_plan_total{rule=\"global\"}"),
        "{text}"
    );
    limiter.close().await;
}

/// A node serving the very rules the gateway started from becomes their source (the start-up
/// file is no longer what the gateway relies on, and the cache can be filled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_serving_the_same_rules_becomes_their_source() {
    let certs = certs();
    let dir = tempfile::tempdir().unwrap();
    let node_rules = dir.path().join("rules.yaml");
    std::fs::write(&node_rules, EXAMPLE).unwrap();
    let addr = {
        let (socket, addr) = silent_node();
        drop(socket);
        addr
    };
    let limiter = RateLimiter::connect_with(
        &[addr],
        offline_config(&certs),
        limiter_config(),
        Some(Policy::from_yaml(EXAMPLE).unwrap()),
    )
    .await
    .unwrap();
    let version = limiter.policy_version();
    let mut changes = limiter.policy_changes();
    let node = start_node_with_rules(&certs, addr, &node_rules).await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while limiter.policy_source() == Some(PolicySource::Local) {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        assert!(!left.is_zero(), "the node never became the source");
        let _ = tokio::time::timeout(left, changes.changed()).await;
    }
    assert!(
        matches!(limiter.policy_source(), Some(PolicySource::Node { addr: from, .. }) if from == addr)
    );
    assert_eq!(limiter.policy_version(), version);
    limiter.close().await;
    node.shutdown().await;
}

#[test]
fn a_broken_rules_file_is_an_error_and_a_broken_cache_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.yaml");
    std::fs::write(&broken, EXAMPLE.replace("method: POST", "method: PSOT")).unwrap();
    let error = rules_source::load_local(Some(&broken), None).unwrap_err();
    assert!(
        format!("{error:#}").contains("did you mean `POST`"),
        "{error:#}"
    );
    assert!(
        rules_source::load_local(None, Some(&broken))
            .unwrap()
            .is_none()
    );
    let missing = dir.path().join("missing.yaml");
    assert!(
        rules_source::load_local(None, Some(&missing))
            .unwrap()
            .is_none()
    );
}

/// Starts a node serving `rules` at `addr`, retrying the bind while the port is released.
async fn start_node_with_rules(certs: &Certs, addr: SocketAddr, rules: &std::path::Path) -> Node {
    let started = tokio::time::Instant::now();
    loop {
        let mut config = NodeConfig::for_tests(&certs.dev);
        config.listen = addr;
        config.rules = Some(rules.to_owned());
        match Node::start(config).await {
            Ok(node) => return node,
            Err(_) if started.elapsed() < PATIENCE => tokio::task::yield_now().await,
            Err(e) => panic!("cannot start the node on {addr}: {e:#}"),
        }
    }
}
