//! Shared test helpers: a node on 127.0.0.1:0 with development certificates, and a raw QUIC
//! connection to it that speaks frames directly (no client crate), for hostile input.

#![allow(dead_code)]

pub mod envoy;
pub mod resp;

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use floodgate::wire::{
    CheckBatch, ErrorCode, FrameKind, FrameReader, WireCheck, decode_decision_batch,
    decode_error_frame, encode_message,
};
use floodgate::{Decision, Limit, NANOS_PER_SEC};
use floodgate_node::{DevCerts, Node, NodeConfig, ensure_dev_certs};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

pub struct TestNode {
    pub node: Node,
    pub certs: DevCerts,
    _dir: tempfile::TempDir,
}

pub async fn start_node(adjust: impl FnOnce(&mut NodeConfig)) -> TestNode {
    let dir = tempfile::tempdir().unwrap();
    let certs = ensure_dev_certs(dir.path()).unwrap();
    let mut config = NodeConfig::for_tests(&certs);
    adjust(&mut config);
    certify_node_id(&mut config, &certs);
    let node = Node::start(config).await.unwrap();
    TestNode {
        node,
        certs,
        _dir: dir,
    }
}

/// A node given an id but still the shared development certificate gets that id's own
/// certificate: peers verify a node by the id its certificate carries.
pub fn certify_node_id(config: &mut NodeConfig, certs: &DevCerts) {
    if let Some(id) = &config.cluster.node_id
        && config.tls.cert == certs.node_cert
    {
        let (cert, key) = certs.node_cert_for(id).unwrap();
        config.tls.cert = cert;
        config.tls.key = key;
    }
}

pub fn client_config(certs: &DevCerts, with_client_cert: bool) -> quinn::ClientConfig {
    let identity = with_client_cert.then_some((&certs.client_cert, &certs.client_key));
    quic_client_config(&certs.ca, identity)
}

/// A connection that presents the node certificate, as another node would.
pub fn peer_config(certs: &DevCerts) -> quinn::ClientConfig {
    quic_client_config(&certs.ca, Some((&certs.node_cert, &certs.node_key)))
}

/// Trusts `ca` and presents `identity` (certificate and key PEM files), if any.
pub fn quic_client_config(
    ca: &std::path::Path,
    identity: Option<(&std::path::PathBuf, &std::path::PathBuf)>,
) -> quinn::ClientConfig {
    quic_client_config_speaking(ca, identity, floodgate::protocol::SUPPORTED)
}

/// As [`quic_client_config`], offering only the protocol versions of `versions` (a caller of
/// an older or newer build).
pub fn quic_client_config_speaking(
    ca: &std::path::Path,
    identity: Option<(&std::path::PathBuf, &std::path::PathBuf)>,
    versions: floodgate::protocol::VersionRange,
) -> quinn::ClientConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots);
    let mut tls = match identity {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .unwrap()
                .map(Result::unwrap)
                .collect();
            let key = rustls::pki_types::PrivateKeyDer::from_pem_file(key).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    tls.alpn_protocols = versions.alpn_ids();
    quinn::ClientConfig::new(Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap(),
    ))
}

/// A QUIC server's configuration presenting `cert` and `key` (PEM files), offering the ALPN ids
/// of `versions`: a peer of this test's own making, standing where a node would.
pub fn quic_server_config(
    cert: &std::path::Path,
    key: &std::path::Path,
    versions: floodgate::protocol::VersionRange,
) -> quinn::ServerConfig {
    let chain = CertificateDer::pem_file_iter(cert)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = rustls::pki_types::PrivateKeyDer::from_pem_file(key).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    tls.alpn_protocols = versions.alpn_ids();
    quinn::ServerConfig::with_crypto(Arc::new(
        quinn::crypto::rustls::QuicServerConfig::try_from(tls).unwrap(),
    ))
}

pub async fn connect(addr: SocketAddr, config: quinn::ClientConfig) -> quinn::Connection {
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(config);
    endpoint.connect(addr, "localhost").unwrap().await.unwrap()
}

/// Tells `node` by gossip, over a peer connection as a member would, of a live member `id` of
/// `region` at `addr` (one nothing answers on; a node id has one address, so one each) speaking
/// `versions` (`None`: a range no digest gave), which never speaks again: the other side of a
/// mixed-version cluster. The node keeps it alive only under a membership config that
/// suspects late. Returns once the node knows the member (bounded: 10 s, or it panics); the
/// caller waits for whatever else the gossip changes.
pub async fn gossip_silent_member(
    node: &TestNode,
    (id, addr): (&str, &str),
    region: &str,
    versions: Option<floodgate::protocol::VersionRange>,
) {
    let member = floodgate::cluster::membership::MemberDigest {
        info: floodgate::cluster::MemberInfo {
            id: id.to_owned(),
            addr: addr.to_owned(),
            region: region.to_owned(),
        },
        incarnation: 1,
        heartbeat: 1,
        left: false,
        versions,
        joining: false,
    };
    let mut frame = Vec::new();
    let gossip = floodgate::cluster::Gossip {
        members: vec![member],
    };
    floodgate::wire::encode_gossip(&mut frame, floodgate::protocol::NEWEST, &gossip);
    // A new member changes the owners, so the node publishes a table once it has taken it.
    let mut tables = node.node.watch_slot_table();
    let connection = connect(node.node.local_addr(), peer_config(&node.certs)).await;
    let mut stream = connection.open_uni().await.unwrap();
    stream.write_all(&frame).await.unwrap();
    stream.finish().unwrap();
    // The connection must outlive the node's read of the stream: closed once the data is only
    // acknowledged (what `stopped` waits for), a busy node may find the stream gone unread.
    let known = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while node.node.member_addr(id).as_deref() != Some(addr) {
            tables.changed().await.unwrap();
        }
    })
    .await;
    assert!(known.is_ok(), "the node did not take the gossip of {id}");
    drop(connection);
}

/// What came back on a stream: decoded frames until the node finished or reset the stream.
#[derive(Debug, Default)]
pub struct Answers {
    pub decisions: Vec<(u64, Vec<Result<Decision, ErrorCode>>)>,
    pub errors: Vec<(u64, ErrorCode, String)>,
}

impl Answers {
    /// How many checks were allowed (every decision must be one, not an error).
    pub fn allowed(&self) -> usize {
        self.decisions
            .iter()
            .flat_map(|(_, d)| d)
            .filter(|d| d.unwrap().is_allowed())
            .count()
    }
}

/// Sends raw bytes on a new stream, finishes it, and reads every answer until the stream ends.
pub async fn exchange(connection: &quinn::Connection, bytes: &[u8]) -> Answers {
    let received = floodgate_node::exchange::round_trip(connection, bytes, 16 << 20)
        .await
        .unwrap_or_default();
    parse_answers(&received)
}

pub fn parse_answers(bytes: &[u8]) -> Answers {
    let mut reader = FrameReader::new(16 << 20);
    reader.extend(bytes);
    let mut answers = Answers::default();
    while let Some(frame) = reader.next_frame().unwrap() {
        match frame.kind {
            FrameKind::DecisionBatch => {
                let decisions = decode_decision_batch(&frame.payload).unwrap();
                answers.decisions.push((
                    frame.request_id,
                    decisions.iter().map(|d| d.to_decision()).collect(),
                ));
            }
            FrameKind::Error => {
                let error = decode_error_frame(&frame.payload).unwrap();
                answers.errors.push((
                    frame.request_id,
                    ErrorCode::from_u16(error.code).unwrap(),
                    error.message,
                ));
            }
            other => panic!("a node never answers a check batch with {other:?}"),
        }
    }
    answers
}

/// How far a test node's clock must read from the system's (`NodeConfig::test_only_clock_skew_ns`)
/// to read at the middle of a window of `period_ns`, so that no such window turns over while a
/// test runs: fixed and sliding windows count in windows aligned to the clock
/// (`[k * period, (k + 1) * period)` of Unix time), and a key whose window turns over mid-test is
/// admitted its limit again, legitimately, which a test asserting exact counts would read as a
/// failure. The system time it starts from is read once per test binary, at its first use, so
/// every node given the skew of one period (restarted ones too) reads the same time: half a
/// period from either end of its window at that first use. Half a period is the margin: give it
/// a period far longer than the binary runs (an hour, a day). It keeps windows of that period
/// whole, not shorter ones: the middle of a day is the start of an hour, a minute and a second.
pub fn mid_window_skew_ns(period_ns: u64) -> i64 {
    static UNIX_NS_AT_FIRST_USE: OnceLock<u128> = OnceLock::new();
    let unix_ns = *UNIX_NS_AT_FIRST_USE.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("the system clock reads after 1970")
            .as_nanos()
    });
    let period = u128::from(period_ns);
    let into_window = unix_ns % period;
    i64::try_from(period / 2).unwrap() - i64::try_from(into_window).unwrap()
}

pub fn per_hour(n: u64) -> Limit {
    Limit::gcra(n, 3_600 * NANOS_PER_SEC, n).unwrap()
}

/// A frame with one single-check group per key.
pub fn check_frame(request_id: u64, keys: &[&[u8]], limit: &Limit) -> Vec<u8> {
    let batch = CheckBatch {
        groups: keys
            .iter()
            .map(|k| vec![WireCheck::new(k.to_vec(), limit, 1)])
            .collect(),
    };
    let mut out = Vec::new();
    encode_message(&mut out, FrameKind::CheckBatch, request_id, &batch);
    out
}

/// Waits (bounded: 10 s) until `node` counts `owners` slot owners and the slots it gained
/// wait for no hand-off (until then a version-4 caller is answered `try_again`).
pub async fn converge(node: &Node, owners: usize) {
    let mut tables = node.watch_slot_table();
    let reached = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while tables.borrow_and_update().nodes().len() != owners {
            tables.changed().await.unwrap();
        }
        node.handoffs_settled().await;
    })
    .await;
    assert!(
        reached.is_ok(),
        "{} sees {:?}, expected {owners} owners",
        node.node_id(),
        node.owners()
    );
}

/// The node's `/metrics` page (it must have an admin address).
pub async fn metrics_page(node: &Node) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let admin = node.admin_addr().expect("a node with an admin address");
    let mut stream = tokio::net::TcpStream::connect(admin).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut text = String::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        stream.read_to_string(&mut text),
    )
    .await
    .expect("the metrics page comes")
    .unwrap();
    text
}

/// The value of the series `series` (name and labels as the page prints them) on a metrics
/// page; 0 when absent.
pub fn metric_value(page: &str, series: &str) -> f64 {
    page.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

const MS: u64 = 1_000_000;

/// Quick gossip and replication, so a test's cluster forms and notices a crash within a second.
pub fn fast(config: &mut NodeConfig) {
    config.cluster.membership = floodgate::cluster::MembershipConfig {
        gossip_interval_ns: 20 * MS,
        suspect_after_ns: 150 * MS,
        dead_after_ns: 300 * MS,
        ..floodgate::cluster::MembershipConfig::default()
    };
    config.cluster.sync_interval = std::time::Duration::from_millis(50);
}

/// Starts `n` nodes sharing one set of development certificates; all but the first join
/// through the first.
pub async fn cluster(n: usize) -> (Vec<Node>, TestNode) {
    cluster_with(n, |_| {}).await
}

/// As [`cluster`], each node's configuration adjusted by `adjust` too.
pub async fn cluster_with(n: usize, adjust: impl Fn(&mut NodeConfig)) -> (Vec<Node>, TestNode) {
    let first = start_node(|config| {
        fast(config);
        adjust(config);
    })
    .await;
    let seed = first.node.local_addr();
    let mut nodes = Vec::new();
    for _ in 1..n {
        nodes.push(join_with(&first, seed, &adjust).await);
    }
    for node in nodes.iter().chain([&first.node]) {
        converge(node, n).await;
    }
    (nodes, first)
}

pub async fn join(first: &TestNode, seed: SocketAddr) -> Node {
    join_with(first, seed, &|_: &mut NodeConfig| {}).await
}

async fn join_with(first: &TestNode, seed: SocketAddr, adjust: &impl Fn(&mut NodeConfig)) -> Node {
    let mut config = NodeConfig::for_tests(&first.certs);
    fast(&mut config);
    adjust(&mut config);
    config.cluster.seeds = vec![seed.into()];
    Node::start(config).await.unwrap()
}

/// A key owned by the node with `id` (searching key names).
pub fn key_owned_by(node: &Node, id: &str, prefix: &str) -> Vec<u8> {
    let table = node.slot_table();
    (0..10_000)
        .map(|i| format!("{prefix}{i}").into_bytes())
        .find(|k| table.owner(floodgate::cluster::slot_of(k)) == Some(id))
        .unwrap()
}

/// A throwaway virtualenv `target/NAME` (made once, then reused) with `packages` installed,
/// `ready` telling (given its directory) whether it has what the test needs. `Err` says why it
/// could not be made.
pub fn python_venv(
    name: &str,
    packages: &[&str],
    ready: impl Fn(&std::path::Path) -> bool,
) -> Result<std::path::PathBuf, String> {
    use std::process::Command;
    // One test at a time makes or checks a venv: two tests of a binary running at once on a
    // fresh checkout would otherwise both create it and pip-install into it together.
    static MAKING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _making = MAKING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let venv = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target")
        .join(name);
    if ready(&venv) {
        return Ok(venv);
    }
    let made = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .map_err(|e| format!("python3 is not runnable: {e}"))?;
    if !made.success() {
        return Err("`python3 -m venv` failed (is python3-venv installed?)".into());
    }
    let installed = Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet"])
        .args(packages)
        .status()
        .map_err(|e| format!("pip is not runnable: {e}"))?;
    if !installed.success() || !ready(&venv) {
        return Err(format!("pip could not install {}", packages.join(" ")));
    }
    Ok(venv)
}

/// `package` (a main package of the Go module in `node/tests/{module}`), built with the
/// machine's Go into `out` under the workspace's `target/` (Go's cache makes a rebuild cheap);
/// the module's dependencies come from the Go module proxy.
pub fn go_build(module: &str, package: &str, out: &str) -> std::path::PathBuf {
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let binary = manifest.join("../target").join(out);
    let built = std::process::Command::new("go")
        .args(["build", "-o"])
        .arg(&binary)
        .arg(package)
        .current_dir(manifest.join("tests").join(module))
        .env("GOTOOLCHAIN", "local")
        .output()
        .unwrap_or_else(|e| panic!("go is not runnable (install Go 1.26 or newer): {e}"));
    assert!(
        built.status.success(),
        "go build of {module} failed: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    binary
}

/// Runs a foreign client (`command`, given `stdin` if any) to its end on a blocking thread, so
/// the node it talks to keeps being served by the test's runtime; `limit` bounds the whole run.
/// Panics, naming the client (`what`), if it cannot start or does not finish in time.
pub async fn run_client(
    mut command: std::process::Command,
    stdin: Option<Vec<u8>>,
    limit: std::time::Duration,
    what: &str,
) -> std::process::Output {
    use std::io::Write;
    use std::process::Stdio;
    let run = tokio::task::spawn_blocking(move || {
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        if stdin.is_some() {
            command.stdin(Stdio::piped());
        }
        let mut child = command.spawn()?;
        if let (Some(bytes), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(&bytes)?;
        }
        child.wait_with_output()
    });
    tokio::time::timeout(limit, run)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {limit:?}"))
        .expect("the blocking thread ran to its end")
        .unwrap_or_else(|e| panic!("{what} could not be run: {e}"))
}

/// `output`'s standard output, once it is known to have exited successfully; panics with
/// both of its outputs otherwise.
pub fn succeeded(output: &std::process::Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// The RLS listener's settings for a test: 127.0.0.1 on any port, cleartext, serving the
/// envoyproxy/ratelimit configuration at `config`, every option off (as its flags default).
pub fn rls_settings(config: std::path::PathBuf) -> floodgate_node::rls::RlsSettings {
    floodgate_node::rls::RlsSettings {
        listen: "127.0.0.1:0".parse().unwrap(),
        config,
        rate_limit_headers: false,
        tls: false,
        client_auth: false,
        allow_negative_hits: false,
    }
}

/// A gRPC channel over TLS to `url` (`https://ADDR`), trusting the development CA `certs.ca`
/// for the name `localhost`, presenting `identity` (a certificate and key) when given; the
/// connection's error as text.
pub async fn tls_channel(
    url: &str,
    certs: &DevCerts,
    identity: Option<tonic::transport::Identity>,
) -> Result<tonic::transport::Channel, String> {
    use tonic::transport::{Certificate, Channel, ClientTlsConfig};
    let ca = std::fs::read(&certs.ca).unwrap();
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost");
    if let Some(identity) = identity {
        tls = tls.identity(identity);
    }
    Channel::from_shared(url.to_owned())
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .map_err(|e| e.to_string())
}

/// The identity (certificate and key) of `cert` and `key`, PEM files.
pub fn identity(cert: &std::path::Path, key: &std::path::Path) -> tonic::transport::Identity {
    tonic::transport::Identity::from_pem(std::fs::read(cert).unwrap(), std::fs::read(key).unwrap())
}

/// The node binary's flags for a node alone on a free port, no admin port, with development
/// certificates in `data`.
pub fn alone_on_any_port(data: &str) -> [&str; 6] {
    [
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "off",
        "--data-dir",
        data,
    ]
}
