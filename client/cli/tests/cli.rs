//! The `floodgate` binary against a real node: output lines and exit codes.
//!
//! 0 allow, 1 deny, 2 error (bad `--limit`, unreachable node, refused certificate).

#[path = "../../tests/common/mod.rs"]
mod common;

use std::process::{Command, Output};

use common::*;

/// Runs the binary off the runtime's thread, so the in-process node keeps serving meanwhile.
async fn floodgate(args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_floodgate"))
            .args(&args)
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

fn check_args(node: std::net::SocketAddr, certs: &Certs, rest: &[&str]) -> Vec<String> {
    let base = ["check", "--seeds", &node.to_string(), "--ca"].map(str::to_owned);
    base.into_iter()
        .chain([certs.dev.ca.display().to_string()])
        .chain(rest.iter().map(|s| s.to_string()))
        .collect()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test]
async fn three_checks_against_two_per_hour_print_allow_allow_deny_and_exit_1() {
    let certs = certs();
    let node = start_node(&certs, any_port(), false).await;
    let out = floodgate(check_args(
        node.local_addr(),
        &certs,
        &["user:1", "--limit", "2/h", "--count", "3"],
    ))
    .await;
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines.len(),
        3,
        "stdout: {stdout}\nstderr: {}",
        text(&out.stderr)
    );
    // 2 per hour: a token every 30 minutes, so the full bucket resets after 1 h.
    assert_eq!(lines[0], "allow remaining=1 reset_after=1800s");
    // Some time passed since the first check: just under 3600 s.
    assert!(
        lines[1].starts_with("allow remaining=0 reset_after=3"),
        "{}",
        lines[1]
    );
    assert!(
        lines[2].starts_with("deny remaining=0 retry_after="),
        "{}",
        lines[2]
    );
    assert_eq!(out.status.code(), Some(1));

    // The same key again in a new process: still denied (the node keeps the bucket).
    let out = floodgate(check_args(
        node.local_addr(),
        &certs,
        &["user:1", "--limit", "2/h"],
    ))
    .await;
    assert_eq!(out.status.code(), Some(1));
    // Another key is allowed: exit 0.
    let out = floodgate(check_args(
        node.local_addr(),
        &certs,
        &["user:2", "--limit", "2/h"],
    ))
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    node.shutdown().await;
}

#[tokio::test]
async fn a_bad_limit_exits_2_with_a_message() {
    let certs = certs();
    let out = floodgate(check_args(
        any_port(),
        &certs,
        &["user:1", "--limit", "ten per hour"],
    ))
    .await;
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("not a rate"), "{stderr}");
    assert!(out.stdout.is_empty());
}

#[tokio::test]
async fn an_unreachable_node_exits_2_not_deny() {
    let certs = certs();
    let silent = std::net::UdpSocket::bind(any_port()).unwrap();
    let out = floodgate(check_args(
        silent.local_addr().unwrap(),
        &certs,
        &["user:1", "--limit", "2/h", "--timeout", "200ms"],
    ))
    .await;
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("no decision from the node: unreachable"),
        "{stderr}"
    );
    assert!(stderr.contains("no handshake within"), "{stderr}");
    assert!(out.stdout.is_empty());
}

#[tokio::test]
async fn mutual_tls_through_the_cli() {
    let certs = certs();
    let node = start_node(&certs, any_port(), true).await;
    let client_cert = certs.dev.client_cert.display().to_string();
    let client_key = certs.dev.client_key.display().to_string();
    let with_cert = [
        "k",
        "--limit",
        "5/min",
        "--client-cert",
        &client_cert,
        "--client-key",
        &client_key,
    ];
    let out = floodgate(check_args(node.local_addr(), &certs, &with_cert)).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with("allow remaining=4"));

    let out = floodgate(check_args(
        node.local_addr(),
        &certs,
        &["k", "--limit", "5/min"],
    ))
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains("no decision"),
        "{}",
        text(&out.stderr)
    );
    node.shutdown().await;
}

/// `--seeds localhost:PORT`: the name is resolved (IPv4 first, where the node listens) and
/// the node verified by it; `--node` is the same flag, for older scripts.
#[tokio::test]
async fn a_seed_given_by_host_name_is_dialed_and_node_still_works() {
    let certs = certs();
    let node = start_node(&certs, any_port(), false).await;
    let ca = certs.dev.ca.display().to_string();
    let by_name = format!("localhost:{}", node.local_addr().port());
    for flag in ["--seeds", "--node"] {
        let args = [
            "check", flag, &by_name, "--ca", &ca, "named:1", "--limit", "5/h",
        ];
        let out = floodgate(args.iter().map(|s| s.to_string()).collect()).await;
        assert_eq!(out.status.code(), Some(0), "{flag}: {}", text(&out.stderr));
        assert!(
            text(&out.stdout).starts_with("allow"),
            "{}",
            text(&out.stdout)
        );
    }
    node.shutdown().await;
}

#[tokio::test]
async fn a_global_check_paced_by_interval_is_decided_by_the_node_and_a_bad_scope_exits_2() {
    let certs = certs();
    let node = start_node(&certs, any_port(), false).await;
    // Sent as a scoped batch (kind 12); a node alone in its region decides it like any check.
    let out = floodgate(check_args(
        node.local_addr(),
        &certs,
        &[
            "tenant:7",
            "--limit",
            "2/h",
            "--count",
            "3",
            "--scope",
            "global",
            "--interval",
            "1ms",
        ],
    ))
    .await;
    let stdout = text(&out.stdout);
    let verdicts: Vec<&str> = stdout
        .lines()
        .map(|l| l.split_whitespace().next().unwrap_or(""))
        .collect();
    assert_eq!(
        verdicts,
        ["allow", "allow", "deny"],
        "{}",
        text(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(1));

    let out = floodgate(check_args(
        node.local_addr(),
        &certs,
        &["tenant:7", "--limit", "2/h", "--scope", "everywhere"],
    ))
    .await;
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("--scope"), "{stderr}");
    assert!(out.stdout.is_empty());
    node.shutdown().await;
}
