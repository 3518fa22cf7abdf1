//! The RLS listener's HTTP/2 against h2spec (github.com/summerwind/h2spec v2.2.1, pinned in
//! `http2_conformance_go`, built with the machine's Go into `target/h2spec` once): 145 cases
//! of RFC 7540/9113 and HPACK, most of them a peer breaking the protocol on purpose, each
//! expecting the GOAWAY or RST_STREAM and error code the RFC names. Run by `make
//! http2-conformance` (ignored otherwise: it downloads Go modules).
//!
//! Three cases assume a server that answers a GET with a body, or leaves it unanswered for a
//! while: the listener refuses a GET (HTTP 405, headers only) as soon as it has read the frames
//! that came with it. `BY_DESIGN` names them and why; any other failure fails the test.
//!
//! The second test drives the listener with grpc-go (its own HTTP/2 transport, BDP pings and
//! all) and envoyproxy/go-control-plane's generated RLS stubs (`rls_grpc_go`, built into
//! `target/rls-grpc-go`): the HTTP/2 of Go gateways, beside h2's (node/tests/rls.rs), gRPC
//! C-core's (the Python client there) and Envoy's own (`make envoy-test`).

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::start_node;

/// h2spec's cases this listener fails without breaking HTTP/2, and why.
const BY_DESIGN: [(&str, &str); 3] = [
    (
        "Sends a WINDOW_UPDATE frame on half-closed (remote) stream",
        "expects a DATA frame answering its GET; the 405 refusal is headers only",
    ),
    (
        "Sends a PRIORITY frame on half-closed (remote) stream",
        "expects a DATA frame answering its GET; the 405 refusal is headers only",
    ),
    (
        "Sends HEADERS frames that causes their advertised concurrent stream limit to be exceeded",
        "each GET is refused and its stream closed as it arrives, so none stays open to pass \
         the limit (the unit tests hold calls open to test it)",
    ),
];

const CONFIG: &str = "\
domain: edge
descriptors:
  - key: client
    rate_limit:
      unit: second
      requests_per_unit: 1000
";

/// A node serving `config` on its RLS listener (cleartext), its clock reading midday (UTC) when
/// this binary's first node starts (a test-only skew): the grpc-go client's exact counts are of
/// `unit: day` fixed windows, aligned to Unix time, which would let a key be admitted its limit
/// again if one turned over while it ran. (h2spec's answers do not depend on what is admitted.)
async fn start_rls(config: &str) -> (common::TestNode, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, config).unwrap();
    let node = start_node(|c| {
        c.test_only_clock_skew_ns =
            common::mid_window_skew_ns(floodgate::rls::Unit::Day.period_ns());
        c.rls = Some(common::rls_settings(path));
    })
    .await;
    (node, dir)
}

/// h2spec, built into `target/h2spec` from the pinned module.
fn h2spec() -> PathBuf {
    common::go_build(
        "http2_conformance_go",
        "github.com/summerwind/h2spec/cmd/h2spec",
        "h2spec/h2spec",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "builds h2spec with Go; run with `make http2-conformance`"]
async fn h2spec_finds_nothing_but_the_cases_that_assume_a_slower_answer() {
    let (node, _dir) = start_rls(CONFIG).await;
    let addr = node.node.rls_addr().unwrap();
    let h2spec = h2spec();
    let mut command = Command::new(h2spec);
    command
        .args(["-h", "127.0.0.1", "-p", &addr.port().to_string()])
        .args([
            "-P",
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        ])
        // Seconds a case waits for the frame it expects.
        .args(["-o", "2"]);
    // h2spec exits unsuccessfully when any case fails; its report says which, read below.
    let ran = common::run_client(command, None, Duration::from_secs(300), "h2spec").await;
    let report = String::from_utf8_lossy(&ran.stdout);
    let summary = report
        .lines()
        .find(|l| l.contains(" tests, ") && l.ends_with(" failed"))
        .unwrap_or_else(|| panic!("no summary in h2spec's report:\n{report}"));
    let counts: Vec<usize> = summary
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect();
    println!("h2spec: {summary}");
    let [tests, passed, skipped, failed] = counts[..] else {
        panic!("an unexpected summary: {summary}");
    };
    assert!(
        tests >= 145,
        "{summary}: h2spec ran fewer cases than it has"
    );
    assert_eq!(passed + skipped + failed, tests, "{summary}");
    // The failures, as listed after "Failures:".
    let failures: Vec<&str> = report
        .split_once("\nFailures:")
        .map_or("", |(_, failures)| failures)
        .lines()
        .filter_map(|l| l.split_once("× ").map(|(_, case)| case.trim()))
        .map(|case| case.split_once(": ").map_or(case, |(_, name)| name))
        .collect();
    assert_eq!(failures.len(), failed, "{report}");
    let unexpected: Vec<&&str> = failures
        .iter()
        .filter(|case| !BY_DESIGN.iter().any(|(known, _)| **case == *known))
        .collect();
    assert!(
        unexpected.is_empty(),
        "h2spec cases failed that are not by design: {unexpected:?}\n{report}"
    );
    assert!(passed >= tests - skipped - BY_DESIGN.len(), "{summary}");
}

const GO_CLIENT_CONFIG: &str = "\
domain: edge
descriptors:
  - key: generic_key
    value: three
    rate_limit: {unit: day, requests_per_unit: 3, name: three-a-day}
  - key: generic_key
    value: ten
    rate_limit: {unit: day, requests_per_unit: 10}
  - key: generic_key
    value: five-hundred
    rate_limit: {unit: day, requests_per_unit: 500}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "builds a grpc-go client with Go; run with `make http2-conformance`"]
async fn grpc_go_and_go_control_plane_stubs_are_answered() {
    let (node, _dir) = start_rls(GO_CLIENT_CONFIG).await;
    let addr = node.node.rls_addr().unwrap();
    let client = common::go_build("rls_grpc_go", ".", "rls-grpc-go/rls_grpc_go");
    let mut command = Command::new(client);
    command.arg(addr.to_string());
    // The client's own calls share a 60 s deadline; this bounds the whole run.
    let output = common::run_client(command, None, Duration::from_secs(120), "rls_grpc_go").await;
    let stdout = common::succeeded(&output, "the grpc-go client");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        vec![
            "health: SERVING",
            "watch: SERVING",
            "fourth: overall=OVER_LIMIT code=OVER_LIMIT remaining=0 name=three-a-day",
            "concurrent: ok=500 over_limit=500 failed=0",
            "one MiB message: code=ResourceExhausted",
            "after it: overall=OK remaining=9",
            "unknown method: code=Unimplemented",
        ]
    );
    node.node.shutdown().await;
}
