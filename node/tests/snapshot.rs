//! `--state-dir`: a used-up daily quota survives a graceful restart and `kill -9` (the real
//! binary), and a corrupt, truncated, foreign, too-new or oversized snapshot is refused with a
//! logged reason, kept aside, and the node starts empty.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::*;
use floodgate::store::snapshot::{
    SNAPSHOT_VERSION, decode_snapshot, encode_snapshot, max_snapshot_bytes,
};
use floodgate::{BucketKey, BucketState, BucketValue, Limit, NANOS_PER_SEC};
use floodgate_node::ensure_dev_certs;
use floodgate_node::snapshot::SNAPSHOT_FILE;

const DAY_NS: u64 = 86_400 * NANOS_PER_SEC;

fn daily() -> Limit {
    Limit::gcra(5, DAY_NS, 5).unwrap()
}

/// Six checks of one key in one frame: five pass, the sixth is denied.
fn use_up(request_id: u64) -> Vec<u8> {
    let keys: Vec<&[u8]> = vec![b"quota"; 6];
    check_frame(request_id, &keys, &daily())
}

fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// Files in `dir` whose name starts with the snapshot's and ends in a `.corrupt-…` suffix.
fn set_aside(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{SNAPSHOT_FILE}.corrupt-")))
        })
        .collect()
}

/// A valid snapshot holding the key `quota` used up under `daily()`.
fn used_up_snapshot() -> Vec<u8> {
    let now = wall_ns();
    let bucket = BucketState {
        key: BucketKey::for_key(b"quota"),
        value: BucketValue::Gcra {
            tat_ns: now + DAY_NS,
            margin_ms: (4 * DAY_NS / 5 / 1_000_000) as u32,
        },
    };
    let mut bytes = Vec::new();
    encode_snapshot(&[bucket], now, &mut bytes);
    bytes
}

#[tokio::test]
async fn a_used_up_daily_key_stays_denied_after_a_graceful_restart() {
    let state = tempfile::tempdir().unwrap();
    let with_state = |c: &mut floodgate_node::NodeConfig| c.state_dir = Some(state.path().into());

    let first = start_node(with_state).await;
    let connection = connect(first.node.local_addr(), client_config(&first.certs, false)).await;
    assert_eq!(exchange(&connection, &use_up(1)).await.allowed(), 5);
    first.node.shutdown().await;
    assert!(state.path().join(SNAPSHOT_FILE).exists());

    let second = start_node(with_state).await;
    assert_eq!(second.node.live_buckets(), 1, "the daily bucket was loaded");
    let connection = connect(
        second.node.local_addr(),
        client_config(&second.certs, false),
    )
    .await;
    let again = check_frame(2, &[b"quota"], &daily());
    assert_eq!(exchange(&connection, &again).await.allowed(), 0);
    // A key never used is unaffected.
    let other = check_frame(3, &[b"someone-else"], &daily());
    assert_eq!(exchange(&connection, &other).await.allowed(), 1);
    second.node.shutdown().await;
}

#[tokio::test]
async fn a_bad_snapshot_is_refused_kept_aside_and_the_node_starts_empty() {
    let valid = used_up_snapshot();
    let mut flipped = valid.clone();
    flipped[40] ^= 0x01;
    let mut too_new = valid.clone();
    too_new[8..10].copy_from_slice(&(SNAPSHOT_VERSION + 1).to_le_bytes());
    let max_keys = 64;
    let oversized = vec![0u8; max_snapshot_bytes(max_keys) as usize + 1];
    let cases: [(&str, Vec<u8>); 5] = [
        ("bad checksum", flipped),
        ("truncated", valid[..valid.len() - 3].to_vec()),
        (
            "foreign",
            b"{\"not\": \"a snapshot, but long enough to look at\"}".to_vec(),
        ),
        ("too new", too_new),
        ("oversized", oversized),
    ];
    for (what, bytes) in cases {
        let state = tempfile::tempdir().unwrap();
        std::fs::write(state.path().join(SNAPSHOT_FILE), &bytes).unwrap();
        let node = start_node(|c| {
            c.state_dir = Some(state.path().into());
            c.store.max_keys = max_keys;
        })
        .await;
        assert_eq!(node.node.live_buckets(), 0, "{what}: started empty");
        let aside = set_aside(state.path());
        assert_eq!(aside.len(), 1, "{what}: the bad file is kept aside");
        assert_eq!(
            std::fs::read(&aside[0]).unwrap(),
            bytes,
            "{what}: unchanged"
        );
        let connection = connect(node.node.local_addr(), client_config(&node.certs, false)).await;
        assert_eq!(
            exchange(&connection, &use_up(1)).await.allowed(),
            5,
            "{what}: the key starts fresh"
        );
        node.node.shutdown().await;
        assert_eq!(set_aside(state.path()), aside, "{what}: never overwritten");
        let rewritten = std::fs::read(state.path().join(SNAPSHOT_FILE)).unwrap();
        assert_eq!(decode_snapshot(&rewritten).unwrap().buckets.len(), 1);
    }
}

/// A `floodgate-node` process whose stderr is collected; killed (SIGKILL) when dropped.
struct Process {
    child: Child,
    addr: SocketAddr,
    log: Arc<Mutex<String>>,
    /// One message per snapshot the node reports written (its debug log line).
    snapshots: mpsc::Receiver<()>,
}

impl Process {
    fn start(data: &Path, state: &Path) -> Process {
        let mut child = Command::new(env!("CARGO_BIN_EXE_floodgate-node"))
            .args(["--listen", "127.0.0.1:0", "--admin", "off", "--data-dir"])
            .arg(data)
            .arg("--state-dir")
            .arg(state)
            .env("NO_COLOR", "1")
            // The snapshot writer's debug line is the event the kill -9 test waits for.
            .env("RUST_LOG", "info,floodgate_node::snapshot=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (serving, serving_rx) = mpsc::channel();
        let (written, snapshots) = mpsc::channel();
        let collected = log.clone();
        // Drains stderr for the process's whole life (a full pipe would block the node), reports
        // the address from the "serving on ADDR (" line and each "snapshot written" line.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.split("serving on ").nth(1)
                    && let Some(addr) = rest.split_whitespace().next()
                    && let Ok(addr) = addr.parse::<SocketAddr>()
                {
                    let _ = serving.send(addr);
                }
                if line.contains("snapshot written") {
                    let _ = written.send(());
                }
                collected.lock().unwrap().push_str(&line);
                collected.lock().unwrap().push('\n');
            }
        });
        let addr = match serving_rx.recv_timeout(Duration::from_secs(60)) {
            Ok(addr) => addr,
            Err(_) => panic!("the node did not start: {}", log.lock().unwrap()),
        };
        Process {
            child,
            addr,
            log,
            snapshots,
        }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    fn terminate(mut self) {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        assert_eq!(self.child.wait().unwrap().code(), Some(0), "{}", self.log());
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits (bounded) until a snapshot the node reports written holds `quota` with all five units
/// used: its TAT more than four intervals ahead of now. The file is read after each write the
/// node logs, never on a timer.
fn wait_for_used_up_snapshot(node: &Process, path: &Path) {
    let interval_ns = DAY_NS / 5;
    let quota = BucketKey::for_key(b"quota");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = wall_ns();
        let holds_it = std::fs::read(path)
            .ok()
            .and_then(|bytes| decode_snapshot(&bytes).ok())
            .is_some_and(|snapshot| {
                snapshot.buckets.iter().any(|b| {
                    b.key == quota
                        && matches!(b.value, BucketValue::Gcra { tat_ns, .. }
                            if tat_ns > now + 4 * interval_ns)
                })
            });
        if holds_it {
            return;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            node.snapshots.recv_timeout(left).is_ok(),
            "no snapshot with the used-up key in {}: {}",
            path.display(),
            node.log()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_keeps_a_used_up_daily_key_through_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let (data, state) = (dir.path().join("data"), dir.path().join("state"));
    let first = Process::start(&data, &state);
    let certs = ensure_dev_certs(&data).unwrap();
    let connection = connect(first.addr, client_config(&certs, false)).await;
    assert_eq!(exchange(&connection, &use_up(1)).await.allowed(), 5);
    wait_for_used_up_snapshot(&first, &state.join(SNAPSHOT_FILE));
    drop(first); // SIGKILL: no shutdown path runs

    let second = Process::start(&data, &state);
    assert!(second.log().contains("snapshot loaded"), "{}", second.log());
    let connection = connect(second.addr, client_config(&certs, false)).await;
    let again = check_frame(2, &[b"quota"], &daily());
    assert_eq!(exchange(&connection, &again).await.allowed(), 0);
    second.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_logs_why_it_refused_a_corrupt_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let (data, state) = (dir.path().join("data"), dir.path().join("state"));
    std::fs::create_dir_all(&state).unwrap();
    let mut bytes = used_up_snapshot();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xFF;
    let path = state.join(SNAPSHOT_FILE);
    std::fs::write(&path, &bytes).unwrap();

    let node = Process::start(&data, &state);
    let log = node.log();
    let refusal = log
        .lines()
        .find(|l| l.contains("refused"))
        .unwrap_or_else(|| panic!("no refusal logged: {log}"));
    assert!(refusal.contains("ERROR"), "{refusal}");
    assert!(refusal.contains(&path.display().to_string()), "{refusal}");
    assert!(refusal.contains("checksum mismatch"), "{refusal}");
    assert_eq!(set_aside(&state).len(), 1, "{log}");
    let certs = ensure_dev_certs(&data).unwrap();
    let connection = connect(node.addr, client_config(&certs, false)).await;
    let once = check_frame(1, &[b"quota"], &daily());
    assert_eq!(
        exchange(&connection, &once).await.allowed(),
        1,
        "started empty"
    );
    node.terminate();
}
