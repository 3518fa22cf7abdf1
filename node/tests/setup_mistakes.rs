//! Setup mistakes fail loudly: a second node with a live node's id is refused by the cluster
//! (the real one keeps its id and slots), an address nobody can reach is refused at start, and
//! `/readyz` says 503 with a reason until a node with seeds has joined. Waits are on events,
//! bounded by timeouts.

mod common;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use floodgate::cluster::MembershipConfig;
use floodgate_node::{DevCerts, Node, NodeConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MS: u64 = 1_000_000;
const BOUND: Duration = Duration::from_secs(10);

/// Gossip often; suspect and dead late, so a loaded machine never declares a live node dead.
fn quick_gossip(config: &mut NodeConfig) {
    config.cluster.membership = MembershipConfig {
        gossip_interval_ns: 20 * MS,
        suspect_after_ns: 2_000 * MS,
        dead_after_ns: 4_000 * MS,
        ..MembershipConfig::default()
    };
}

async fn start(certs: &DevCerts, adjust: impl FnOnce(&mut NodeConfig)) -> Node {
    let mut config = NodeConfig::for_tests(certs);
    quick_gossip(&mut config);
    adjust(&mut config);
    certify_node_id(&mut config, certs);
    Node::start(config).await.unwrap()
}

async fn joined(node: &Node) {
    assert!(
        tokio::time::timeout(BOUND, node.joined()).await.is_ok(),
        "{} never joined: {:?}",
        node.node_id(),
        node.not_ready_reason()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_node_with_a_live_id_is_refused_and_the_first_keeps_its_id_and_slots() {
    let dir = tempfile::tempdir().unwrap();
    let certs = &floodgate_node::ensure_dev_certs(dir.path()).unwrap();
    let first = start(certs, |c| c.cluster.node_id = Some("node-a".into())).await;
    let a_addr = first.local_addr();
    let second = start(certs, |c| {
        c.cluster.node_id = Some("node-b".into());
        c.cluster.seeds = vec![a_addr.into()];
    })
    .await;
    joined(&second).await;
    let mut tables = first.watch_slot_table();
    let converged = tokio::time::timeout(BOUND, async {
        while tables.borrow_and_update().nodes().len() != 2 {
            tables.changed().await.unwrap();
        }
    })
    .await;
    assert!(converged.is_ok(), "{:?}", first.owners());
    let mut second_tables = second.watch_slot_table();
    second_tables.borrow_and_update();
    let table_before = first.slot_table();

    // Same id as the first node, another address, joining through the second.
    let impostor = start(certs, |c| {
        c.cluster.node_id = Some("node-a".into());
        c.cluster.seeds = vec![second.local_addr().into()];
    })
    .await;
    let mut refusal = impostor.watch_refusal();
    let refused = tokio::time::timeout(BOUND, refusal.wait_for(Option::is_some))
        .await
        .map(|r| r.unwrap().clone());
    let reason = refused
        .expect("the impostor was never told it is refused")
        .unwrap();
    assert!(reason.contains("node-a"), "{reason}");
    assert!(reason.contains(&a_addr.to_string()), "{reason}");
    let not_ready = impostor.not_ready_reason().unwrap();
    assert!(not_ready.starts_with("refused:"), "{not_ready}");

    // The first node kept its id, its address in the second's view, and its slots.
    assert_eq!(first.node_id(), "node-a");
    assert_eq!(second.member_addr("node-a"), Some(a_addr.to_string()));
    // Its slots, that is: the table's epoch may have moved on (a member's digest changed)
    // with every slot where it was, which the version (a digest of who owns what) shows.
    let slots = |table: &floodgate::cluster::SlotTable| (table.nodes().to_vec(), table.version());
    assert_eq!(slots(&first.slot_table()), slots(&table_before));
    assert_eq!(slots(&second.slot_table()), slots(&table_before));
    assert_eq!(
        slots(&second_tables.borrow_and_update()),
        slots(&table_before),
        "the second node's ownership moved: {:?}",
        second.owners()
    );
    assert_eq!(first.not_ready_reason(), None);
    assert_eq!(second.not_ready_reason(), None);
    impostor.crash();
    second.shutdown().await;
    first.shutdown().await;
}

/// A UDP socket that never answers: a seed that is down.
fn silent_seed() -> (std::net::UdpSocket, SocketAddr) {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = socket.local_addr().unwrap();
    (socket, addr)
}

/// `GET path` on the admin server: the status code and body.
async fn get(admin: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(admin).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    tokio::time::timeout(BOUND, stream.read_to_string(&mut response))
        .await
        .unwrap()
        .unwrap();
    let code = response[9..12].parse().unwrap();
    let body = response.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
    (code, body)
}

fn with_admin(config: &mut NodeConfig) {
    config.admin = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_waits_for_a_join_when_there_are_seeds() {
    let first = start_node(|c| {
        quick_gossip(c);
        with_admin(c);
    })
    .await;
    let certs = &first.certs;
    // No seeds: the first node of a cluster is ready at once.
    let (code, body) = get(first.node.admin_addr().unwrap(), "/readyz").await;
    assert_eq!((code, body.as_str()), (200, "ready\n"));

    // Seeds that never answer: serving, but not ready, and saying why.
    let (_socket, nobody) = silent_seed();
    let alone = start(certs, |c| {
        with_admin(c);
        c.cluster.seeds = vec![nobody.into()];
    })
    .await;
    let (code, body) = get(alone.admin_addr().unwrap(), "/readyz").await;
    assert_eq!(code, 503);
    assert!(body.contains("not joined: no seed answered"), "{body}");
    // Still answers checks (alone) meanwhile.
    let connection = connect(alone.local_addr(), client_config(certs, false)).await;
    let answers = exchange(&connection, &check_frame(1, &[b"k"], &per_hour(5))).await;
    assert_eq!(answers.allowed(), 1);

    // --allow-alone: the same node is ready.
    let (_socket2, nobody2) = silent_seed();
    let allowed = start(certs, |c| {
        with_admin(c);
        c.cluster.seeds = vec![nobody2.into()];
        c.cluster.allow_alone = true;
    })
    .await;
    let (code, _) = get(allowed.admin_addr().unwrap(), "/readyz").await;
    assert_eq!(code, 200);

    // A seed that answers: ready once joined.
    let joiner = start(certs, |c| {
        with_admin(c);
        c.cluster.seeds = vec![first.node.local_addr().into()];
    })
    .await;
    joined(&joiner).await;
    let (code, body) = get(joiner.admin_addr().unwrap(), "/readyz").await;
    assert_eq!((code, body.as_str()), (200, "ready\n"));

    joiner.shutdown().await;
    alone.crash();
    allowed.crash();
    first.node.shutdown().await;
}

/// One seed list for every node, given by names: the node whose own name is listed (here
/// `localhost:ITS_PORT`) finds that the name is itself and is ready without anybody to join;
/// a name that does not resolve keeps a node unready, serving alone, without stopping it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_name_resolving_to_the_node_itself_is_no_one_to_wait_for() {
    let dir = tempfile::tempdir().unwrap();
    let certs = floodgate_node::ensure_dev_certs(dir.path()).unwrap();
    // A free port, known before the node starts so its own seed list can name it.
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let own_name: floodgate_node::HostPort = format!("localhost:{port}").parse().unwrap();
    let first = start(&certs, |c| {
        c.listen = SocketAddr::from(([127, 0, 0, 1], port));
        c.cluster.seeds = vec![own_name.clone()];
    })
    .await;
    joined(&first).await;
    assert!(first.not_ready_reason().is_none());

    // `.invalid` never resolves (RFC 2606).
    let nowhere: floodgate_node::HostPort = "fg-nowhere.invalid:7100".parse().unwrap();
    let lost = start(&certs, |c| c.cluster.seeds = vec![nowhere]).await;
    let waited = tokio::time::timeout(Duration::from_millis(300), lost.joined()).await;
    assert!(
        waited.is_err(),
        "joined through a name that does not resolve"
    );
    let reason = lost.not_ready_reason().unwrap_or_default();
    assert!(reason.contains("not joined"), "{reason}");
    lost.crash();
    first.shutdown().await;
}

#[test]
fn listening_on_every_interface_without_advertise_exits_2_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    for args in [
        vec![
            "--listen",
            "0.0.0.0:0",
            "--data-dir",
            data,
            "--admin",
            "off",
        ],
        vec!["--listen", "[::]:0", "--data-dir", data, "--admin", "off"],
        vec![
            "--listen",
            "127.0.0.1:0",
            "--advertise",
            "0.0.0.0:7103",
            "--data-dir",
            data,
            "--admin",
            "off",
        ],
    ] {
        let mut command = Command::new(env!("CARGO_BIN_EXE_floodgate-node"));
        command.args(&args);
        exits_2_saying(&mut command, "--advertise");
    }
}

/// Runs the node binary to its end: it must exit 2 with `says` in its error.
fn exits_2_saying(command: &mut Command, says: &str) {
    let output = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{command:?}: {stderr}");
    assert!(stderr.contains(says), "{command:?}: {stderr}");
}

fn node_binary(args: &[&str]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_floodgate-node"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn the_binary_with_a_live_nodes_id_exits_2_naming_the_id_and_the_holder() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let common = alone_on_any_port(data);
    let mut holder = node_binary(&[&common[..], &["--node-id", "twin"]].concat());
    let mut stderr = BufReader::new(holder.stderr.take().unwrap());
    let mut line = String::new();
    // Bounded: the node prints this line once it serves, or exits (EOF) on error.
    while stderr.read_line(&mut line).unwrap() > 0 && !line.contains("serving on") {}
    let holder_addr = line
        .split("serving on ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_owned();

    let twin =
        node_binary(&[&common[..], &["--node-id", "twin", "--seeds", &holder_addr]].concat());
    let twin_pid = twin.id().to_string();
    let (done, outcome) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(twin.wait_with_output());
    });
    let output = match outcome.recv_timeout(Duration::from_secs(30)) {
        Ok(output) => output.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").args(["-KILL", &twin_pid]).status();
            let _ = holder.kill();
            panic!("the second node with the same id was not refused within 30 s");
        }
    };
    let twin_stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{twin_stderr}");
    assert!(
        twin_stderr.contains("refused by the cluster"),
        "{twin_stderr}"
    );
    assert!(twin_stderr.contains("\"twin\""), "{twin_stderr}");
    assert!(twin_stderr.contains(&holder_addr), "{twin_stderr}");

    // The holder is unharmed: it still stops cleanly.
    let killed = Command::new("kill")
        .args(["-TERM", &holder.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    assert_eq!(holder.wait().unwrap().code(), Some(0));
}

/// The RESP password comes from a file or the environment, never both, never empty, and only
/// with `--resp-listen`; each mistake exits 2 naming what is wrong. Given right, `AUTH` takes it.
#[test]
fn resp_password_mistakes_exit_2_and_a_good_password_is_taken() {
    use std::io::{BufRead, BufReader, Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let password = dir.path().join("resp-password");
    std::fs::write(&password, "pw-1\n").unwrap();
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "").unwrap();
    let (password, empty) = (password.to_str().unwrap(), empty.to_str().unwrap());
    let base = [
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data,
        "--admin",
        "off",
    ];
    let cases: [(&[&str], Option<&str>, &str); 4] = [
        (
            &[
                "--resp-listen",
                "127.0.0.1:0",
                "--resp-password-file",
                password,
            ],
            Some("pw-2"),
            "given twice",
        ),
        (
            &[
                "--resp-listen",
                "127.0.0.1:0",
                "--resp-password-file",
                empty,
            ],
            None,
            "is empty",
        ),
        (&["--resp-listen", "127.0.0.1:0"], Some(""), "set but empty"),
        (
            &["--resp-password-file", password],
            None,
            "need --resp-listen",
        ),
    ];
    for (args, env, says) in cases {
        let mut command = Command::new(env!("CARGO_BIN_EXE_floodgate-node"));
        command
            .args(base)
            .args(args)
            .env_remove("FLOODGATE_RESP_PASSWORD");
        if let Some(env) = env {
            command.env("FLOODGATE_RESP_PASSWORD", env);
        }
        exits_2_saying(&mut command, says);
    }
    let mut node = Command::new(env!("CARGO_BIN_EXE_floodgate-node"))
        .args(base)
        .args(["--resp-listen", "127.0.0.1:0"])
        .env("FLOODGATE_RESP_PASSWORD", "pw-3")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The start-up log names the bound address. The log is read to its end on another thread:
    // a node whose stderr is closed fails its next write.
    let stderr = node.stderr.take().unwrap();
    let (found, address) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let addr = line
                .split_once("RESP (Redis protocol")
                .and_then(|(_, rest)| rest.split_once("addr="))
                .and_then(|(_, rest)| rest.split_whitespace().next()?.parse::<SocketAddr>().ok());
            if let Some(addr) = addr {
                let _ = found.send(addr);
            }
        }
    });
    let addr = address
        .recv_timeout(BOUND)
        .expect("the node logs its RESP address");
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(BOUND)).unwrap();
    stream.write_all(b"PING\r\nAUTH pw-3\r\nPING\r\n").unwrap();
    let expected = "-NOAUTH Authentication required.\r\n+OK\r\n+PONG\r\n";
    let mut got = vec![0; expected.len()];
    stream.read_exact(&mut got).unwrap();
    assert_eq!(String::from_utf8_lossy(&got), expected);
    let _ = node.kill();
    let _ = node.wait();
}
