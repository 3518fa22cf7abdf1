//! Start-up and shutdown: flags are validated with clear errors, development certificates are
//! created once and reused, and SIGTERM drains and closes with `shutting_down`.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use common::*;
use floodgate::wire::ErrorCode;

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
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "off",
        "--data-dir",
        data.to_str().unwrap(),
    ];
    let mut first_ca = None;
    for _ in 0..2 {
        let mut child = node_command(&args).spawn().unwrap();
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        // Bounded: the node prints this line once it serves, or exits (EOF) on error.
        while stderr.read_line(&mut line).unwrap() > 0 && !line.contains("serving on") {}
        assert!(line.contains("serving on"), "{line}");
        let ca = std::fs::read_to_string(data.join("ca.pem")).unwrap();
        assert_eq!(
            *first_ca.get_or_insert(ca.clone()),
            ca,
            "the CA is reused, not regenerated"
        );
        let killed = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        assert_eq!(child.wait().unwrap().code(), Some(0));
    }
}
