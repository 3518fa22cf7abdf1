//! Start-up, restart and shutdown: flags are validated with clear errors, development
//! certificates are created once and reused, a node started again at its address resets its
//! previous life's connections, and SIGTERM drains and closes with `shutting_down`.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use floodgate::wire::ErrorCode;
use floodgate_node::{Node, NodeConfig, ensure_dev_certs};

#[tokio::test]
async fn shutdown_answers_what_was_received_then_closes_with_shutting_down() {
    let node = start_node(|_| {}).await;
    let connection = connect(node.node.local_addr(), client_config(&node.certs, false)).await;
    let (mut send, mut recv) = connection.open_bi().await.unwrap();
    send.write_all(&check_frame(1, &[b"k"], &per_hour(5)))
        .await
        .unwrap();
    let mut answer = vec![0u8; 16];
    recv.read_exact(&mut answer).await.unwrap();
    node.node.shutdown().await;
    // The stream was finished by the node (not reset), after the answer.
    let rest = recv.read_to_end(1 << 20).await.unwrap();
    assert!(parse_answers(&[answer, rest].concat()).decisions.len() == 1);
    match connection.closed().await {
        quinn::ConnectionError::ApplicationClosed(close) => {
            assert_eq!(
                close.error_code,
                quinn::VarInt::from_u32(ErrorCode::ShuttingDown as u32)
            );
        }
        other => panic!("expected an application close with shutting_down, got {other:?}"),
    }
}

/// A crashed node started again at its address resets its previous life's connections at
/// their next packet: its stateless resets carry the tokens that life announced, so a client
/// (or peer) redials at once instead of sending into a dead connection until its idle timeout
/// (5 s). A relay stands for the address: the first life keeps its socket and its connections,
/// as a process that died without a word would, while the relay hands the address to the
/// second.
#[tokio::test]
async fn a_node_started_again_resets_its_previous_lifes_connections() {
    let dir = tempfile::tempdir().unwrap();
    let certs = ensure_dev_certs(dir.path()).unwrap();
    let relay = Relay::start().await;
    let life = || {
        let mut config = NodeConfig::for_tests(&certs);
        config.cluster.advertise = Some(relay.addr);
        Node::start(config)
    };
    let first = life().await.unwrap();
    relay.lead_to(first.local_addr());
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(client_config(&certs, false));
    let connect = || async { endpoint.connect(relay.addr, "localhost").unwrap().await };
    let connection = connect().await.unwrap();
    let answers = exchange(&connection, &check_frame(1, &[b"k"], &per_hour(5))).await;
    assert_eq!(answers.decisions.len(), 1, "the first life answers");

    let second = life().await.unwrap();
    relay.lead_to(second.local_addr());
    // The next packet on the old connection reaches the second life, which resets it.
    if let Ok(mut stream) = connection.open_uni().await {
        let _ = stream.write_all(b"x").await;
    }
    let closed = tokio::time::timeout(Duration::from_secs(10), connection.closed()).await;
    assert!(
        matches!(closed, Ok(quinn::ConnectionError::Reset)),
        "the previous life's connection is reset by the second life, got {closed:?}"
    );
    let connection = connect().await.unwrap();
    let answers = exchange(&connection, &check_frame(2, &[b"k"], &per_hour(5))).await;
    assert_eq!(answers.decisions.len(), 1, "the second life answers");
    first.crash();
    second.shutdown().await;
}

/// A UDP relay on 127.0.0.1 for one client: what the client sends goes to the node it leads
/// to, and only that node's datagrams come back.
struct Relay {
    addr: SocketAddr,
    to: Arc<parking_lot::Mutex<Option<SocketAddr>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn start() -> Relay {
        let outer = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let inner = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = outer.local_addr().unwrap();
        let to = Arc::new(parking_lot::Mutex::new(None::<SocketAddr>));
        let lead = to.clone();
        let task = tokio::spawn(async move {
            let (mut from_client, mut from_node) = (vec![0u8; 65_536], vec![0u8; 65_536]);
            let mut client = None;
            loop {
                tokio::select! {
                    Ok((n, sender)) = outer.recv_from(&mut from_client) => {
                        client = Some(sender);
                        let node = *lead.lock();
                        if let Some(node) = node {
                            let _ = inner.send_to(&from_client[..n], node).await;
                        }
                    }
                    Ok((n, sender)) = inner.recv_from(&mut from_node) => {
                        let node = *lead.lock();
                        if let Some(client) = client.filter(|_| node == Some(sender)) {
                            let _ = outer.send_to(&from_node[..n], client).await;
                        }
                    }
                    else => return,
                }
            }
        });
        Relay { addr, to, task }
    }

    fn lead_to(&self, node: SocketAddr) {
        *self.to.lock() = Some(node);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn node_command(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_floodgate-node"));
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    command
}

#[test]
fn bad_flags_exit_2_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    for (args, expected) in [
        (vec!["--listen", "127.0.0.1:0"], "--data-dir"),
        (vec!["--data-dir", data, "--max-batch", "0"], "max batch"),
        (
            vec!["--data-dir", data, "--admin", "nowhere"],
            "--admin nowhere",
        ),
        (
            vec!["--data-dir", data, "--admin", "off", "--node-id", "fg_a:1"],
            "node id `fg_a:1` is not a DNS name",
        ),
    ] {
        let output = node_command(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

#[test]
fn the_binary_creates_dev_certs_once_and_stops_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let args = alone_on_any_port(data.to_str().unwrap());
    let mut first_ca = None;
    for _ in 0..2 {
        let node = spawn_serving(&args);
        let ca = std::fs::read_to_string(data.join("ca.pem")).unwrap();
        assert_eq!(
            *first_ca.get_or_insert(ca.clone()),
            ca,
            "the CA is reused, not regenerated"
        );
        stop_with_sigterm(node);
    }
}

/// A node binary that said it serves; its stderr is held open (a node writing to a closed pipe
/// would fail) until it is stopped.
struct Serving {
    child: std::process::Child,
    _stderr: BufReader<std::process::ChildStderr>,
}

/// A test that fails before stopping its node does not leave it running.
impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the node binary with `args` and returns once it says it serves.
fn spawn_serving(args: &[&str]) -> Serving {
    let mut child = node_command(args).spawn().unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut lines = String::new();
    // Bounded: the node prints this line once it serves, or exits (EOF) on error.
    while stderr.read_line(&mut lines).unwrap() > 0 && !lines.contains("serving on") {}
    assert!(lines.contains("serving on"), "{lines}");
    Serving {
        child,
        _stderr: stderr,
    }
}

/// Sends SIGTERM and expects a clean exit.
fn stop_with_sigterm(mut node: Serving) {
    let killed = Command::new("kill")
        .args(["-TERM", &node.child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    assert_eq!(node.child.wait().unwrap().code(), Some(0));
}

/// Every thread of a node runs under SCHED_BATCH by default (so a node woken by a datagram
/// does not preempt its callers on a shared core), and under the policy it was started with
/// given `--scheduling inherit`. Read from /proc once the node serves; a policy other than the
/// default given to this test is kept either way.
#[cfg(target_os = "linux")]
#[test]
fn a_node_runs_its_threads_under_sched_batch_unless_told_to_inherit() {
    const SCHED_OTHER: u32 = 0;
    const SCHED_BATCH: u32 = 3;
    let ours = policy_in(&std::fs::read_to_string("/proc/self/stat").unwrap());
    let batch = if ours == SCHED_OTHER {
        SCHED_BATCH
    } else {
        ours
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    for (scheduling, expected) in [("batch", batch), ("inherit", ours)] {
        let extra = ["--worker-threads", "2", "--scheduling", scheduling];
        let args = [&alone_on_any_port(data.to_str().unwrap())[..], &extra].concat();
        let node = spawn_serving(&args);
        let tasks = std::fs::read_dir(format!("/proc/{}/task", node.child.id())).unwrap();
        let policies: Vec<u32> = tasks
            .map(|task| {
                let stat = task.unwrap().path().join("stat");
                policy_in(&std::fs::read_to_string(stat).unwrap())
            })
            .collect();
        // The main thread and the runtime's two workers at least.
        assert!(policies.len() >= 3, "{policies:?}");
        assert!(
            policies.iter().all(|&p| p == expected),
            "--scheduling {scheduling}: {policies:?}, expected {expected} for every thread"
        );
        stop_with_sigterm(node);
    }
}

/// The scheduling policy (field 41) of a `/proc/.../stat` line; the command name (field 2) is
/// in parentheses and may hold spaces, so fields are counted after its closing one.
#[cfg(target_os = "linux")]
fn policy_in(stat: &str) -> u32 {
    let after_name = &stat[stat.rfind(')').unwrap() + 1..];
    after_name
        .split_whitespace()
        .nth(41 - 3)
        .unwrap()
        .parse()
        .unwrap()
}
