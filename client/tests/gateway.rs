//! The example gateway over real HTTP, in front of real nodes serving `rules/example.yaml`
//! (the limits
//! of the example rules, and the HTTP contract of draft-ietf-httpapi-ratelimit-headers-10 and
//! RFC 9457).
//!
//! Each test starts its own node(s) on 127.0.0.1:0 with `--rules`, a gateway (the example's
//! `app.rs`) connected to them with the real client, and sends hand-written HTTP/1.1 requests.
//! Nothing sleeps to synchronize: waits are for change events (slot tables, rules), bounded.
//!
//! On exact counts under GCRA: a bucket of `burst` refills one unit per `period / rate`, so a
//! sequence of requests admits exactly `burst` only if it finishes within one interval (600 ms
//! for 100/min). The tests assert the exact count plus the refills the measured elapsed time
//! allows (zero on any ordinary run), never a timing upper bound on the code.

mod common;

#[path = "../examples/gateway/app.rs"]
mod app;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use floodgate_client::core::policy::Policy;
use floodgate_client::policy::planned_checks;
use floodgate_client::{Check, Client, LimiterConfig, RateLimiter, RequestInfo};
use floodgate_node::{Node, NodeConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

const EXAMPLE: &str = include_str!("../../rules/example.yaml");

/// Nodes with a rules file, and the gateway in front of them.
struct Stack {
    certs: Certs,
    nodes: Vec<Node>,
    _dir: tempfile::TempDir,
    rules: PathBuf,
    limiter: RateLimiter,
    gateway: SocketAddr,
    upstream: SocketAddr,
    shutdown: watch::Sender<bool>,
}

/// Waits until the nodes form one cluster: every node's table names all of them, at one
/// version, and no slot waits for a hand-off. Returns that table's version. These tests are
/// about the gateway, not about a cluster forming: while two newcomers have joined through the
/// first node and do not yet know each other, each may decide slots the other's table gives it
/// (a window docs/CLUSTER.md names), and a key decided by two nodes at once has two budgets.
async fn formed(nodes: &[Node]) -> u64 {
    let all: Vec<&Node> = nodes.iter().collect();
    // Rung at every node's table change; a change between a look and the wait leaves a permit.
    let changed = Arc::new(Notify::new());
    let watchers: Vec<_> = nodes
        .iter()
        .map(|node| {
            let mut table = node.watch_slot_table();
            let changed = changed.clone();
            tokio::spawn(async move {
                while table.changed().await.is_ok() {
                    changed.notify_one();
                }
            })
        })
        .collect();
    tokio::time::timeout(PATIENCE, async {
        while !converged(&all) {
            changed.notified().await;
        }
        for node in nodes {
            node.handoffs_settled().await;
        }
    })
    .await
    .expect("the nodes to form one cluster");
    for watcher in watchers {
        watcher.abort();
    }
    nodes[0].slot_table().version()
}

/// Waits until `limiter` routes by the table of version `version`.
async fn routes_by(limiter: &RateLimiter, version: u64) {
    let client = limiter.client();
    let mut changes = client.table_changes();
    let routed = || client.slot_table().is_some_and(|t| t.version() == version);
    tokio::time::timeout(PATIENCE, async {
        while !routed() {
            if !changes.changed().await {
                break;
            }
        }
    })
    .await
    .expect("the gateway's client to route by the cluster's table");
    assert!(routed(), "the client stopped before routing by the table");
}

impl Stack {
    async fn start(rules: &str, nodes: usize) -> Stack {
        let certs = certs();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.yaml");
        write_rules(&path, rules);
        let mut started = Vec::new();
        for _ in 0..nodes {
            let mut config = NodeConfig::for_tests(&certs.dev);
            config.rules = Some(path.clone());
            // Every node after the first joins the first: one cluster sharing the key space.
            config.cluster.seeds = started
                .first()
                .map(|n: &Node| n.local_addr().into())
                .into_iter()
                .collect();
            started.push(Node::start(config).await.unwrap());
        }
        let table = formed(&started).await;
        let addrs: Vec<SocketAddr> = started.iter().map(Node::local_addr).collect();
        let limiter = RateLimiter::connect(
            &addrs,
            client_config(&certs),
            LimiterConfig {
                refresh_interval: Duration::from_millis(100),
                policy_timeout: PATIENCE,
            },
        )
        .await
        .unwrap();
        tokio::time::timeout(PATIENCE, limiter.client().wait_connected())
            .await
            .unwrap();
        routes_by(&limiter, table).await;
        let (shutdown, stop) = watch::channel(false);
        let upstream = TcpListener::bind(any_port()).await.unwrap();
        let upstream_addr = upstream.local_addr().unwrap();
        tokio::spawn(app::serve(upstream, app::upstream_app(), stop.clone()));
        let listener = TcpListener::bind(any_port()).await.unwrap();
        let gateway = listener.local_addr().unwrap();
        let gateway_app = app::app(limiter.clone(), upstream_addr, app::GatewayMetrics::new());
        tokio::spawn(app::serve(listener, gateway_app, stop));
        Stack {
            certs,
            nodes: started,
            _dir: dir,
            rules: path,
            limiter,
            gateway,
            upstream: upstream_addr,
            shutdown,
        }
    }

    /// Another gateway in front of the same nodes and upstream, with a client of its own (as a
    /// second gateway replica runs); stopped with the stack.
    async fn another_gateway(&self) -> (SocketAddr, RateLimiter) {
        let addrs: Vec<SocketAddr> = self.nodes.iter().map(Node::local_addr).collect();
        let limiter = RateLimiter::connect(
            &addrs,
            client_config(&self.certs),
            LimiterConfig {
                refresh_interval: Duration::from_millis(100),
                policy_timeout: PATIENCE,
            },
        )
        .await
        .unwrap();
        tokio::time::timeout(PATIENCE, limiter.client().wait_connected())
            .await
            .unwrap();
        routes_by(&limiter, self.nodes[0].slot_table().version()).await;
        let listener = TcpListener::bind(any_port()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = app::app(limiter.clone(), self.upstream, app::GatewayMetrics::new());
        tokio::spawn(app::serve(listener, app, self.shutdown.subscribe()));
        (addr, limiter)
    }

    async fn send(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> Response {
        http(self.gateway, method, path, headers).await
    }

    /// Sends the same request until it is refused (at most `max`); returns the allowed count,
    /// the refusal, and the refills the elapsed time allows at `interval`.
    async fn until_refused(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        max: usize,
        interval: Duration,
    ) -> (usize, Response, u32) {
        let started = Instant::now();
        for allowed in 0..max {
            let response = self.send(method, path, headers).await;
            if response.status != 200 {
                let slack = (started.elapsed().as_nanos() / interval.as_nanos()) as u32;
                return (allowed, response, slack);
            }
        }
        panic!("{max} requests passed");
    }

    /// One metric's value from the gateway's `/metrics` (0 when absent).
    async fn metric(&self, series: &str) -> f64 {
        let body = self.send("GET", "/metrics", &[]).await.body;
        body.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or(0.0)
    }

    /// The remaining units of the bucket `rule` uses for `request`, peeked (cost 0) on its node.
    async fn remaining(&self, rule: &str, request: &RequestInfo) -> u64 {
        let policy = self.limiter.policy().unwrap();
        let (_, check) = planned_checks(&policy, request)
            .into_iter()
            .find(|(p, _)| &*p.rule == rule)
            .unwrap();
        let verdicts = self.limiter.client().check(&[check.cost(0)]).await.unwrap();
        verdicts[0].decision.remaining()
    }

    async fn stop(self) {
        self.shutdown.send_replace(true);
        self.limiter.close().await;
        for node in self.nodes {
            node.shutdown().await;
        }
    }
}

/// Write then rename, as editors and config managers do.
fn write_rules(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[derive(Debug)]
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One HTTP/1.1 request on a fresh connection (`Connection: close`), read to the end.
async fn http(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> Response {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("Content-Length: 0\r\n\r\n");
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
    Response {
        status,
        headers,
        body: body.to_owned(),
    }
}

fn problem_429(rule: &str, retry: u64) -> String {
    format!(
        "{{\"type\":\"https://iana.org/assignments/http-problem-types#quota-exceeded\",\
         \"title\":\"Too Many Requests\",\"status\":429,\
         \"detail\":\"Rate limit exceeded for \\\"{rule}\\\"; retry after {retry} s.\",\
         \"violated-policies\":[\"{rule}\"],\"violations\":[{{\"policy\":\"{rule}\",\"retry_after\":{retry}}}]}}"
    )
}

/// Something that wakes when what a test waits on may have changed.
trait Changes {
    /// Waits for the next change; false once its source is gone.
    async fn next(&mut self) -> bool;
}

impl Changes for floodgate_client::TableChanges {
    async fn next(&mut self) -> bool {
        self.changed().await
    }
}

impl Changes for floodgate_client::PolicyChanges {
    async fn next(&mut self) -> bool {
        self.changed().await
    }
}

impl<T> Changes for watch::Receiver<T> {
    async fn next(&mut self) -> bool {
        self.changed().await.is_ok()
    }
}

/// Waits until `done()` holds, re-checking it after each change of `changes` (a new slot table,
/// new rules, a rules edit), bounded by `bound` (a hang detector, not a speed requirement).
async fn until(bound: Duration, changes: &mut impl Changes, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        let left = bound.saturating_sub(started.elapsed());
        assert!(!left.is_zero(), "not within {bound:?}");
        if let Ok(alive) = tokio::time::timeout(left, changes.next()).await {
            assert!(alive, "what the test waits on is gone");
        }
    }
}

/// Rule `holds` (POST /v1/events/*/holds, 5/min per user): five pass, the sixth gets a 429 with
/// every field of the contract, exactly; allowed responses carry the fields too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_allow_five_per_user_then_answer_429_with_exact_fields() {
    let stack = Stack::start(EXAMPLE, 1).await;
    let user = [("X-User-Id", "u-holds")];
    let policy = "\"holds\";q=5;w=60, \"global\";q=2000;w=1, \"user-endpoint\";q=60;w=60";
    for remaining in (0..5).rev() {
        let ok = stack.send("POST", "/v1/events/e1/holds", &user).await;
        assert_eq!(ok.status, 200, "{ok:?}");
        assert!(ok.body.starts_with("{\"ok\":true"), "{ok:?}");
        assert_eq!(ok.header("ratelimit-policy"), Some(policy));
        assert_eq!(
            ok.header("ratelimit"),
            Some(format!("\"holds\";r={remaining};t=12").as_str())
        );
    }
    let denied = stack.send("POST", "/v1/events/e1/holds", &user).await;
    assert_eq!(denied.status, 429);
    assert_eq!(denied.header("retry-after"), Some("12"));
    assert_eq!(denied.header("ratelimit-policy"), Some(policy));
    assert_eq!(denied.header("ratelimit"), Some("\"holds\";r=0;t=12"));
    assert_eq!(
        denied.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(denied.body, problem_429("holds", 12));
    // Another user, and another event's holds for the same user, are their own buckets? The
    // key is the user: another event shares it, another user does not.
    assert_eq!(
        stack
            .send("POST", "/v1/events/e2/holds", &user)
            .await
            .status,
        429
    );
    let other = stack
        .send("POST", "/v1/events/e1/holds", &[("X-User-Id", "u-other")])
        .await;
    assert_eq!(other.status, 200);
    assert_eq!(
        stack
            .metric("floodgate_gateway_verdicts_total{rule=\"holds\",mode=\"enforce\",outcome=\"denied\"}")
            .await,
        2.0
    );
    stack.stop().await;
}

/// Rule `tenant`: a free tenant's 101st request in a minute is refused with the fields; a paid
/// tenant's is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_tenant_gets_100_a_minute_and_a_paid_tenant_more() {
    let stack = Stack::start(EXAMPLE, 1).await;
    let free = [("X-Tenant-Id", "t-free"), ("X-Plan", "free")];
    let (allowed, denied, slack) = stack
        .until_refused("GET", "/v1/data", &free, 200, Duration::from_millis(600))
        .await;
    assert!(
        (100..=100 + slack as usize).contains(&allowed),
        "{allowed} allowed (refills possible: {slack})"
    );
    assert_eq!(denied.status, 429);
    assert_eq!(denied.header("retry-after"), Some("1"));
    assert_eq!(
        denied.header("ratelimit-policy"),
        Some("\"tenant\";q=100;w=60, \"global\";q=2000;w=1")
    );
    assert_eq!(denied.header("ratelimit"), Some("\"tenant\";r=0;t=1"));
    assert_eq!(denied.body, problem_429("tenant", 1));

    let paid = [("X-Tenant-Id", "t-paid"), ("X-Plan", "paid")];
    for _ in 0..101 {
        let ok = stack.send("GET", "/v1/data", &paid).await;
        assert_eq!(ok.status, 200, "{ok:?}");
    }
    let last = stack.send("GET", "/v1/data", &paid).await;
    assert_eq!(
        last.header("ratelimit-policy"),
        Some("\"tenant\";q=10000;w=60, \"global\";q=2000;w=1")
    );
    stack.stop().await;
}

/// Rule `api-key`: per API key with a burst of 200; the key's plan comes from the rules file's
/// table (partner: 10,000/min; internal: not limited by the rule).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_get_a_burst_of_200_and_their_plan_from_the_table() {
    let stack = Stack::start(EXAMPLE, 1).await;
    let key = [("X-Api-Key", "pk_unknown_1")];
    let (allowed, denied, slack) = stack
        .until_refused("GET", "/v1/data", &key, 400, Duration::from_millis(60))
        .await;
    assert!((200..=200 + slack as usize).contains(&allowed), "{allowed}");
    assert_eq!(denied.status, 429);
    assert_eq!(
        denied.header("ratelimit-policy"),
        Some("\"api-key\";q=1000;w=60, \"global\";q=2000;w=1")
    );
    assert_eq!(denied.header("ratelimit"), Some("\"api-key\";r=0;t=1"));
    let partner = stack
        .send("GET", "/v1/data", &[("X-Api-Key", "pk_live_acme_7f3a")])
        .await;
    assert_eq!(
        partner.header("ratelimit-policy"),
        Some("\"api-key\";q=10000;w=60, \"global\";q=2000;w=1")
    );
    let internal = stack
        .send("GET", "/v1/data", &[("X-Api-Key", "pk_live_ops_0001")])
        .await;
    assert_eq!(
        internal.header("ratelimit-policy"),
        Some("\"global\";q=2000;w=1")
    );
    stack.stop().await;
}

/// Rule `login`: 10/min per client IP; when the limiter is unreachable it fails closed (503),
/// while rules that fail open keep passing through the local fallback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_allows_ten_per_ip_and_fails_closed_when_the_node_is_stopped() {
    let mut stack = Stack::start(EXAMPLE, 1).await;
    let (allowed, denied, slack) = stack
        .until_refused("POST", "/v1/auth/login", &[], 50, Duration::from_secs(6))
        .await;
    assert_eq!(allowed, 10 + slack as usize);
    assert_eq!(denied.status, 429);
    assert_eq!(denied.header("retry-after"), Some("6"));
    assert_eq!(
        denied.header("ratelimit-policy"),
        Some("\"login\";q=10;w=60, \"global\";q=2000;w=1")
    );
    assert_eq!(denied.header("ratelimit"), Some("\"login\";r=0;t=6"));
    assert_eq!(denied.body, problem_429("login", 6));

    let node = stack.nodes.remove(0);
    node.shutdown().await;
    tokio::time::timeout(PATIENCE, stack.limiter.client().wait_disconnected())
        .await
        .unwrap();
    let closed = stack.send("POST", "/v1/auth/login", &[]).await;
    assert_eq!(closed.status, 503, "{closed:?}");
    assert_eq!(closed.header("retry-after"), Some("1"));
    assert_eq!(
        closed.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(
        closed.body,
        "{\"type\":\"https://iana.org/assignments/http-problem-types#temporary-reduced-capacity\",\
         \"title\":\"Service Unavailable\",\"status\":503,\
         \"detail\":\"The rate limiter is unreachable and \\\"login\\\" fails closed; retry after 1 s.\",\
         \"violated-policies\":[\"login\"],\"violations\":[{\"policy\":\"login\",\"retry_after\":1}]}"
    );
    // Fail-open rules pass (degraded, through the fallback bucket), and it shows in metrics.
    let open = stack.send("GET", "/v1/data", &[("X-User-Id", "u1")]).await;
    assert_eq!(open.status, 200, "{open:?}");
    assert!(stack.metric("floodgate_gateway_fallbacks_total").await >= 2.0);
    stack.stop().await;
}

/// Rule `global`: one bucket for every request, whoever sends it (the example's guard scaled
/// down to 5/min so a test can exhaust it exactly).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_global_guard_counts_every_client_together() {
    let rules = EXAMPLE.replace("limit: 2000/s", "limit: 5/min");
    assert_ne!(rules, EXAMPLE);
    let stack = Stack::start(&rules, 1).await;
    for i in 0..5 {
        let user = format!("u{i}");
        let ok = stack
            .send("GET", "/health", &[("X-User-Id", user.as_str())])
            .await;
        assert_eq!(ok.status, 200);
    }
    let denied = stack
        .send("GET", "/anything", &[("X-User-Id", "someone-else")])
        .await;
    assert_eq!(denied.status, 429);
    assert_eq!(denied.header("retry-after"), Some("12"));
    assert_eq!(
        denied.header("ratelimit-policy"),
        Some("\"global\";q=5;w=60")
    );
    assert_eq!(denied.body, problem_429("global", 12));
    stack.stop().await;
}

/// Rule `user-endpoint`: a composite key (user + method + path), exact sliding log: 60 per
/// user per endpoint; another endpoint or another user has its own bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_composite_key_limits_each_user_on_each_endpoint() {
    let stack = Stack::start(EXAMPLE, 1).await;
    let user = [("X-User-Id", "u-composite")];
    for _ in 0..60 {
        assert_eq!(stack.send("GET", "/v1/things", &user).await.status, 200);
    }
    let denied = stack.send("GET", "/v1/things", &user).await;
    assert_eq!(denied.status, 429);
    assert_eq!(denied.header("retry-after"), Some("60"));
    assert_eq!(
        denied.header("ratelimit-policy"),
        Some("\"global\";q=2000;w=1, \"user-endpoint\";q=60;w=60")
    );
    assert_eq!(
        denied.header("ratelimit"),
        Some("\"user-endpoint\";r=0;t=60")
    );
    assert_eq!(denied.body, problem_429("user-endpoint", 60));
    assert_eq!(stack.send("POST", "/v1/things", &user).await.status, 200);
    assert_eq!(stack.send("GET", "/v1/others", &user).await.status, 200);
    let other = [("X-User-Id", "u-composite-2")];
    assert_eq!(stack.send("GET", "/v1/things", &other).await.status, 200);
    stack.stop().await;
}

/// Rule `search-ip` (shadow): never denies and is never advertised, but what it would deny is
/// counted in the gateway's metrics. Its rate is lowered from 20/s to 20/h (the burst stays
/// 20), so the counts are exact however slowly the requests go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_rules_never_deny_but_are_counted() {
    let rules = EXAMPLE.replace(
        "key: ip\n    limit: 20/s\n    mode: shadow",
        "key: ip\n    limit: 20/h\n    mode: shadow",
    );
    assert_ne!(
        rules, EXAMPLE,
        "the example's search-ip rule changed: update this test"
    );
    let stack = Stack::start(&rules, 1).await;
    for _ in 0..60 {
        let ok = stack.send("GET", "/v1/search/shoes", &[]).await;
        assert_eq!(ok.status, 200, "{ok:?}");
        assert_eq!(ok.header("ratelimit-policy"), Some("\"global\";q=2000;w=1"));
    }
    let allowed = stack
        .metric("floodgate_gateway_verdicts_total{rule=\"search-ip\",mode=\"shadow\",outcome=\"allowed\"}")
        .await;
    let denied = stack
        .metric("floodgate_gateway_verdicts_total{rule=\"search-ip\",mode=\"shadow\",outcome=\"denied\"}")
        .await;
    assert_eq!((allowed, denied), (20.0, 40.0));
    stack.stop().await;
}

/// A request denied by one rule takes nothing from the others: `holds` denies, and the
/// `user-endpoint` bucket (exact sliding log) still shows only the requests that passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_request_consumes_nothing_from_the_other_rules() {
    let stack = Stack::start(EXAMPLE, 1).await;
    let user = [("X-User-Id", "u-refund")];
    for _ in 0..5 {
        assert_eq!(
            stack
                .send("POST", "/v1/events/e1/holds", &user)
                .await
                .status,
            200
        );
    }
    for _ in 0..3 {
        assert_eq!(
            stack
                .send("POST", "/v1/events/e1/holds", &user)
                .await
                .status,
            429
        );
    }
    let mut info = RequestInfo::new("POST", "/v1/events/e1/holds");
    info.user = Some("u-refund".to_owned());
    info.peer = Some([127, 0, 0, 1].into());
    assert_eq!(stack.remaining("user-endpoint", &info).await, 55);
    assert_eq!(stack.remaining("holds", &info).await, 0);
    stack.stop().await;
}

/// The same across nodes: a user whose `holds` and `user-endpoint` buckets live on different
/// nodes; the denial on one node refunds what the other took.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_request_consumes_nothing_from_rules_on_other_nodes() {
    let stack = Stack::start(EXAMPLE, 2).await;
    let policy = stack.limiter.policy().unwrap();
    let client = stack.limiter.client();
    let owners = |user: &str| {
        let mut info = RequestInfo::new("POST", "/v1/events/e1/holds");
        info.user = Some(user.to_owned());
        info.peer = Some([127, 0, 0, 1].into());
        let checks = planned_checks(&policy, &info);
        let owner = |rule: &str| {
            let (_, check) = checks.iter().find(|(p, _)| &*p.rule == rule).unwrap();
            client.owner_of(&check.key)
        };
        (owner("holds"), owner("user-endpoint"), info)
    };
    // Once the client routes by a table with both nodes, some user's buckets are split.
    let split = || {
        (0..100)
            .map(|i| owners(&format!("u-split-{i}")))
            .find(|(a, b, _)| a != b)
    };
    let mut tables = client.table_changes();
    until(PATIENCE, &mut tables, || split().is_some()).await;
    let (holds, user_endpoint, info) = split().unwrap();
    assert_ne!(holds, user_endpoint);
    let user = info.user.clone().unwrap();
    let headers = [("X-User-Id", user.as_str())];
    for _ in 0..5 {
        let ok = stack.send("POST", "/v1/events/e1/holds", &headers).await;
        assert_eq!(ok.status, 200);
    }
    for _ in 0..3 {
        let denied = stack.send("POST", "/v1/events/e1/holds", &headers).await;
        assert_eq!(denied.status, 429);
    }
    assert_eq!(stack.remaining("user-endpoint", &info).await, 55);
    assert_eq!(stack.remaining("holds", &info).await, 0);
    stack.stop().await;
}

const WAIT_RULES: &str = "\
max_waiting: 1
rules:
  - name: slow
    path: /v1/slow
    key: user
    limit: 2/s
    burst: 1
    max_wait: 800ms
  - name: never-long
    path: /v1/fast
    key: user
    limit: 1/10s
    max_wait: 200ms
";

/// `max_wait`: a request that would wait at most that long is held and then allowed; one that
/// would wait longer is refused at once, and at most `max_waiting` requests wait together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_wait_holds_then_allows_and_its_bounds_hold() {
    let stack = Stack::start(WAIT_RULES, 1).await;
    let a = [("X-User-Id", "a")];
    assert_eq!(stack.send("GET", "/v1/slow", &a).await.status, 200);
    let started = Instant::now();
    let waited = stack.send("GET", "/v1/slow", &a).await;
    assert_eq!(waited.status, 200, "{waited:?}");
    // The bucket refills one unit per 500 ms: the request cannot have passed sooner.
    assert!(started.elapsed() >= Duration::from_millis(400));
    assert_eq!(stack.metric("floodgate_gateway_waited_total").await, 1.0);

    // Would wait ~10 s, longer than its 200 ms: refused at once, no wait counted.
    let b = [("X-User-Id", "b")];
    assert_eq!(stack.send("GET", "/v1/fast", &b).await.status, 200);
    let refused = stack.send("GET", "/v1/fast", &b).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("retry-after"), Some("10"));
    assert_eq!(stack.metric("floodgate_gateway_waited_total").await, 1.0);

    // Two at once that would both wait: max_waiting is 1, so one waits and one is refused.
    let c = [("X-User-Id", "c")];
    assert_eq!(stack.send("GET", "/v1/slow", &c).await.status, 200);
    let (first, second) = tokio::join!(
        stack.send("GET", "/v1/slow", &c),
        stack.send("GET", "/v1/slow", &c)
    );
    let mut statuses = [first.status, second.status];
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 429]);
    stack.stop().await;
}

const RELOAD_RULES: &str = "\
rules:
  - name: items
    path: /v1/items
    key: user
    limit: 3/min
";

/// Hot reload: an edited limit is enforced within about a second of the file change, with every
/// request meanwhile answered; a broken file is rejected and the rules in force stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule_edits_apply_without_restart_and_broken_files_are_rejected() {
    let stack = Stack::start(RELOAD_RULES, 1).await;
    let (allowed, _, _) = stack
        .until_refused(
            "GET",
            "/v1/items",
            &[("X-User-Id", "r0")],
            10,
            Duration::from_secs(20),
        )
        .await;
    assert_eq!(allowed, 3);
    let v1 = stack.limiter.policy_version().unwrap();

    let mut policies = stack.limiter.policy_changes();
    write_rules(&stack.rules, &RELOAD_RULES.replace("3/min", "6/min"));
    // Requests keep being answered while the edit travels from the file to the gateway.
    let gateway = &stack;
    let probe = |n: u32| {
        let user = format!("probe-{n}");
        async move {
            let response = gateway
                .send("GET", "/v1/items", &[("X-User-Id", user.as_str())])
                .await;
            assert_eq!(response.status, 200, "{response:?}");
            response
        }
    };
    probe(0).await;
    until(PATIENCE, &mut policies, || {
        stack.limiter.policy_version().as_ref() != Some(&v1)
    })
    .await;
    let response = probe(1).await;
    assert_eq!(
        response.header("ratelimit-policy"),
        Some("\"items\";q=6;w=60")
    );
    let v2 = stack.limiter.policy_version().unwrap();
    assert_ne!(v1, v2);
    let (allowed, _, _) = stack
        .until_refused(
            "GET",
            "/v1/items",
            &[("X-User-Id", "r1")],
            10,
            Duration::from_secs(10),
        )
        .await;
    assert_eq!(allowed, 6);

    // A broken edit: the node rejects it (with line and column) and the old rules stay.
    write_rules(&stack.rules, &RELOAD_RULES.replace("3/min", "lots"));
    let rules = stack.nodes[0].rules().unwrap().clone();
    let mut reloads = rules.watch_reloads();
    until(PATIENCE, &mut reloads, || rules.rejected() >= 1).await;
    let error = rules.last_error().unwrap();
    assert!(error.contains("rules.yaml:5:12"), "{error}");
    assert_eq!(rules.current().version(), v2);
    let (allowed, _, _) = stack
        .until_refused(
            "GET",
            "/v1/items",
            &[("X-User-Id", "r2")],
            10,
            Duration::from_secs(10),
        )
        .await;
    assert_eq!(allowed, 6);
    assert_eq!(stack.limiter.policy_version().unwrap(), v2);
    stack.stop().await;
}

/// `X-Forwarded-For` from a peer that is not a trusted proxy is ignored: spoofed addresses do
/// not get a login bucket of their own. Through a trusted proxy, the rightmost untrusted entry
/// is the client, never the leftmost one the client wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spoofed_forwarded_for_does_not_change_the_client_ip() {
    let stack = Stack::start(EXAMPLE, 1).await;
    for i in 0..10 {
        let spoof = format!("198.51.100.{i}");
        let ok = stack
            .send(
                "POST",
                "/v1/auth/login",
                &[("X-Forwarded-For", spoof.as_str())],
            )
            .await;
        assert_eq!(ok.status, 200);
    }
    let denied = stack
        .send(
            "POST",
            "/v1/auth/login",
            &[("X-Forwarded-For", "198.51.100.77")],
        )
        .await;
    assert_eq!(denied.status, 429, "the peer 127.0.0.1 is the client");
    stack.stop().await;

    // The loopback gateway's peer as a trusted proxy: the client is what it vouches for.
    let trusted = EXAMPLE.replace(
        "trusted_proxies: [10.0.0.0/8,",
        "trusted_proxies: [127.0.0.0/8, 10.0.0.0/8,",
    );
    assert_ne!(trusted, EXAMPLE);
    let stack = Stack::start(&trusted, 1).await;
    for i in 0..10 {
        // The leftmost entry is the client's own invention; 203.0.113.5 is who connected.
        let xff = format!("192.0.2.{i}, 203.0.113.5");
        let ok = stack
            .send(
                "POST",
                "/v1/auth/login",
                &[("X-Forwarded-For", xff.as_str())],
            )
            .await;
        assert_eq!(ok.status, 200);
    }
    let same = stack
        .send(
            "POST",
            "/v1/auth/login",
            &[("X-Forwarded-For", "203.0.113.5")],
        )
        .await;
    assert_eq!(same.status, 429, "one bucket for 203.0.113.5");
    let other = stack
        .send(
            "POST",
            "/v1/auth/login",
            &[("X-Forwarded-For", "203.0.113.6")],
        )
        .await;
    assert_eq!(other.status, 200, "another client behind the proxy");
    stack.stop().await;
}

/// A limiter given a local policy (no rules from the nodes needed) decides the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_policy_works_without_node_rules() {
    let certs = certs();
    let node = start_node(&certs, any_port(), false).await;
    let client = Client::connect(&[node.local_addr()], client_config(&certs))
        .await
        .unwrap();
    let limiter = RateLimiter::with_policy(client, Some(Policy::from_yaml(RELOAD_RULES).unwrap()));
    let mut info = RequestInfo::new("GET", "/v1/items");
    info.user = Some("x".to_owned());
    let mut allowed = 0;
    for _ in 0..4 {
        allowed += usize::from(limiter.check(&info).await.is_allowed());
    }
    assert_eq!(allowed, 3);
    let _ = Check::new("unused", per_hour(1));
    limiter.close().await;
    node.shutdown().await;
}

/// Metered limits across gateways: three gateways share one API key's `tokens` bucket (1,000
/// tokens a minute, each completion charged the 1 to 100 tokens the demo upstream reports after
/// it is done). Each gateway sends one completion at a time until it is refused. The tokens
/// charged reach the limit (a charge is taken whole, even past what is left) and never exceed
/// it by more than the refill over the run plus one completion's largest cost per gateway in
/// flight; the refusal says when the debt is repaid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metered_tokens_hold_across_three_gateways() {
    let stack = Stack::start(EXAMPLE, 3).await;
    let (second, second_limiter) = stack.another_gateway().await;
    let (third, third_limiter) = stack.another_gateway().await;
    let started = Instant::now();
    let key = [("X-Api-Key", "pk_metered_demo")];
    let runs: Vec<_> = [stack.gateway, second, third]
        .into_iter()
        .map(|gateway| {
            tokio::spawn(async move {
                let mut charged = 0;
                for _ in 0..200 {
                    let response = http(gateway, "POST", "/v1/complete", &key).await;
                    if response.status != 200 {
                        return (charged, response);
                    }
                    let used: u64 = response.header(app::USAGE_HEADER).unwrap().parse().unwrap();
                    assert!((1..=app::MOST_TOKENS).contains(&used));
                    charged += used;
                }
                panic!("200 completions passed at one gateway");
            })
        })
        .collect();
    let mut each = Vec::new();
    let mut refusals = Vec::new();
    for run in runs {
        let (tokens, refusal) = run.await.unwrap();
        each.push(tokens);
        refusals.push(refusal);
    }
    let charged: u64 = each.iter().sum();
    let elapsed = started.elapsed();
    // 1,000 a minute: what refilled while the gateways ran, rounded up.
    let refill = (elapsed.as_millis() as u64).div_ceil(60);
    let gateways = 3;
    assert!(
        charged >= 1_000 - 1,
        "charged {charged}: the budget was not used up"
    );
    assert!(
        charged <= 1_000 + refill + gateways * app::MOST_TOKENS,
        "charged {charged} ({each:?} by gateway) in {elapsed:?}: over the limit by more than the bound"
    );
    for refusal in &refusals {
        assert_eq!(refusal.status, 429, "{}", refusal.body);
        let retry: u64 = refusal.header("retry-after").unwrap().parse().unwrap();
        // The key owes at most what was charged past the limit; one token more passes. A
        // token refills in 60 ms; Retry-After is whole seconds, rounded up.
        let most = ((charged + 1).saturating_sub(1_000) * 60).div_ceil(1_000);
        assert!(
            (1..=most.max(1)).contains(&retry),
            "retry-after {retry}, charged {charged}"
        );
        assert!(refusal.body.contains("tokens"), "{}", refusal.body);
        assert!(refusal.header("ratelimit").unwrap().contains("\"tokens\""));
    }
    second_limiter.close().await;
    third_limiter.close().await;
    stack.stop().await;
}
