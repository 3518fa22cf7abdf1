//! The example gateway's concurrency rule (`exports` in `rules/example.yaml`: at most 3
//! `POST /v1/exports` at once) over real HTTP, in front of a real node: a fourth export gets
//! the 429 contract with `Retry-After`, and a finished export frees its place.
//!
//! The upstream's exports wait on a gate the test opens, so nothing here waits on the clock;
//! every wait is for an event (an export arriving, a lease released), bounded by `PATIENCE`.

mod common;

#[path = "../examples/gateway/app.rs"]
mod app;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use floodgate_client::{LimiterConfig, RateLimiter};
use floodgate_node::{Node, NodeConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::watch;

const EXAMPLE: &str = include_str!("../../rules/example.yaml");
/// The key of the `exports` rule (`key: global`).
const EXPORTS_KEY: &[u8] = b"exports\x1fglobal";

/// Sends one HTTP/1.1 request (`Connection: close`) and returns (status, headers, body).
async fn http(addr: SocketAddr, method: &str, path: &str) -> (u16, Vec<(String, String)>, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status = lines.next().unwrap()[9..12].parse().unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(": "))
        .map(|(n, v)| (n.to_ascii_lowercase(), v.to_owned()))
        .collect();
    (status, headers, body.to_owned())
}

async fn wait_for<T>(what: &str, watch: &mut watch::Receiver<T>, done: impl Fn(&T) -> bool) {
    tokio::time::timeout(PATIENCE, watch.wait_for(|v| done(v)))
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
        .unwrap();
}

/// A node serving `rules`, a gateway in front of it, and the gated upstream.
struct Stack {
    _certs: Certs,
    _dir: tempfile::TempDir,
    node: Node,
    limiter: RateLimiter,
    gateway: SocketAddr,
    gate: std::sync::Arc<app::ExportGate>,
    metrics: app::GatewayMetrics,
    shutdown: watch::Sender<bool>,
}

impl Stack {
    async fn start(rules_text: &str) -> Stack {
        let certs = certs();
        let dir = tempfile::tempdir().unwrap();
        let rules = dir.path().join("rules.yaml");
        std::fs::write(&rules, rules_text).unwrap();
        let mut config = NodeConfig::for_tests(&certs.dev);
        config.rules = Some(rules);
        let node = Node::start(config).await.unwrap();
        let limiter = RateLimiter::connect(
            &[node.local_addr()],
            client_config(&certs),
            LimiterConfig {
                refresh_interval: Duration::from_millis(100),
                policy_timeout: PATIENCE,
            },
        )
        .await
        .unwrap();
        let (shutdown, stop) = watch::channel(false);
        let gate = app::ExportGate::new();
        let upstream = TcpListener::bind(any_port()).await.unwrap();
        let upstream_addr = upstream.local_addr().unwrap();
        let upstream_app = app::upstream_app_with(app::ExportPace::Gate(gate.clone()));
        tokio::spawn(app::serve(upstream, upstream_app, stop.clone()));
        let listener = TcpListener::bind(any_port()).await.unwrap();
        let gateway = listener.local_addr().unwrap();
        let metrics = app::GatewayMetrics::new();
        let gateway_app = app::app(limiter.clone(), upstream_addr, metrics.clone());
        tokio::spawn(app::serve(listener, gateway_app, stop));
        Stack {
            _certs: certs,
            _dir: dir,
            node,
            limiter,
            gateway,
            gate,
            metrics,
            shutdown,
        }
    }

    async fn stop(self) {
        self.shutdown.send_replace(true);
        self.limiter.close().await;
        self.node.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_exports_run_at_once_a_fourth_gets_429_until_one_finishes() {
    let stack = Stack::start(EXAMPLE).await;
    let (node, gateway, gate) = (&stack.node, stack.gateway, &stack.gate);
    let mut released = stack.metrics.watch_released();
    let mut arrived = gate.arrived.subscribe();
    let mut exports = tokio::task::JoinSet::new();
    for _ in 0..3 {
        exports.spawn(http(gateway, "POST", "/v1/exports"));
    }
    wait_for("three exports at the upstream", &mut arrived, |n| *n == 3).await;
    assert_eq!(node.leases_in_use(EXPORTS_KEY), 3);

    let (status, headers, body) = http(gateway, "POST", "/v1/exports").await;
    assert_eq!(status, 429, "{body}");
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    // The earliest lease expires 30 s after it was granted, rounded up to whole seconds.
    let retry: u64 = header("retry-after").unwrap().parse().unwrap();
    assert!((1..=30).contains(&retry), "Retry-After {retry}");
    assert_eq!(
        header("content-type").as_deref(),
        Some("application/problem+json")
    );
    assert!(
        body.contains("\"violated-policies\":[\"exports\"]"),
        "{body}"
    );
    assert!(body.contains(&format!("\"retry_after\":{retry}")), "{body}");
    // Other endpoints are not held up by the exports.
    let (status, _, _) = http(gateway, "GET", "/v1/reports").await;
    assert_eq!(status, 200);
    assert_eq!(
        *gate.arrived.borrow(),
        3,
        "the refused export never reached the upstream"
    );

    // One export finishes: its place is given back, and the next export runs.
    gate.answer.add_permits(1);
    // Whichever export took the permit finishes.
    let finished = tokio::time::timeout(PATIENCE, exports.join_next())
        .await
        .expect("an export finishes")
        .unwrap();
    assert_eq!(finished.unwrap().0, 200);
    wait_for(
        "the finished export's lease to be released",
        &mut released,
        |n| *n == 1,
    )
    .await;
    assert_eq!(node.leases_in_use(EXPORTS_KEY), 2);
    let next = tokio::spawn(http(gateway, "POST", "/v1/exports"));
    wait_for("the next export at the upstream", &mut arrived, |n| *n == 4).await;
    gate.answer.add_permits(3);
    let next = tokio::time::timeout(PATIENCE, next)
        .await
        .expect("the export finishes");
    assert_eq!(next.unwrap().0, 200);
    while let Some(export) = tokio::time::timeout(PATIENCE, exports.join_next())
        .await
        .expect("the exports finish")
    {
        assert_eq!(export.unwrap().0, 200);
    }

    stack.stop().await;
}

/// A request slower than its rule's TTL keeps its place: the layer renews the lease every half
/// TTL. Two renewals answered `renewed` mean the lease outlived its first TTL (the second comes
/// a whole TTL after the grant); no wait here is on the clock, only on those events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_slower_than_the_ttl_keeps_its_lease() {
    let rules = "rules:\n  - name: exports\n    method: POST\n    path: /v1/exports\n    key: global\n    concurrency: 1\n    ttl: 1s\n";
    let stack = Stack::start(rules).await;
    let mut arrived = stack.gate.arrived.subscribe();
    let mut renewed = stack.metrics.watch_renewed();
    let export = tokio::spawn(http(stack.gateway, "POST", "/v1/exports"));
    wait_for("the export at the upstream", &mut arrived, |n| *n == 1).await;
    wait_for("two renewals", &mut renewed, |n| *n >= 2).await;
    assert_eq!(stack.node.leases_in_use(EXPORTS_KEY), 1);
    let (status, _, _) = http(stack.gateway, "POST", "/v1/exports").await;
    assert_eq!(status, 429, "the running export still holds the only place");
    let metrics = stack.metrics.render();
    assert!(
        !metrics.contains("floodgate_gateway_leases_lost_total"),
        "{metrics}"
    );
    stack.gate.answer.add_permits(1);
    let (status, _, _) = tokio::time::timeout(PATIENCE, export)
        .await
        .expect("the export finishes")
        .unwrap();
    assert_eq!(status, 200);
    stack.stop().await;
}

/// The demo upstream's work queue counts a request that went away (its future dropped while
/// queued or in service) as gone: its place in the queue and in service is given back, so
/// the queue the metrics show is the requests still waiting, never more.
#[tokio::test(start_paused = true)]
async fn the_work_queue_forgets_requests_dropped_part_way() {
    let work = app::Work::new(1, Duration::from_millis(20));
    let mut serving = Vec::new();
    for _ in 0..5 {
        let work = work.clone();
        serving.push(tokio::spawn(async move { work.serve().await }));
    }
    tokio::task::yield_now().await;
    let stats = work.stats();
    assert_eq!(
        (stats.in_service, stats.queued, stats.queued_max),
        (1, 4, 4)
    );
    // The one in service and two of the queued ones go away.
    for task in serving.drain(..3) {
        task.abort();
        let _ = task.await;
    }
    // The place given back went to the next in the queue.
    let stats = work.stats();
    assert_eq!((stats.in_service, stats.queued), (1, 1));
    for task in serving {
        task.await.unwrap();
    }
    let stats = work.stats();
    assert_eq!((stats.in_service, stats.queued, stats.served), (0, 0, 2));
}
