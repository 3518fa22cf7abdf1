//! `floodgate acquire` against a real node: one line per attempt, exit 0 granted, 1 refused,
//! 2 error; abandoned leases stay held, released ones free their place.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::process::{Command, Output};

use common::*;

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

fn acquire_args(node: std::net::SocketAddr, certs: &Certs, rest: &[&str]) -> Vec<String> {
    let base = ["acquire", "--node", &node.to_string(), "--ca"].map(str::to_owned);
    base.into_iter()
        .chain([certs.dev.ca.display().to_string()])
        .chain(rest.iter().map(|s| s.to_string()))
        .collect()
}

fn lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn abandoned_leases_stay_held_and_released_ones_free_their_place() {
    let certs = certs();
    let node = start_node(&certs, any_port(), false).await;
    let addr = node.local_addr();
    let abandon = acquire_args(
        addr,
        &certs,
        &[
            "exports",
            "--max",
            "2",
            "--ttl",
            "30s",
            "--count",
            "3",
            "--abandon",
        ],
    );
    let out = floodgate(abandon).await;
    let printed = lines(&out);
    assert_eq!(
        printed.len(),
        3,
        "{printed:?} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(printed[0].starts_with("granted lease="), "{}", printed[0]);
    assert!(printed[0].ends_with(" in_use=1"), "{}", printed[0]);
    assert!(printed[1].ends_with(" in_use=2"), "{}", printed[1]);
    // The earliest lease expires within 30 s: never more, never zero.
    let refused = &printed[2];
    assert!(
        refused.starts_with("refused in_use=2 retry_after="),
        "{refused}"
    );
    assert_ne!(refused, "refused in_use=2 retry_after=0ms");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(node.leases_in_use(b"exports"), 2);

    // Released at exit: the next run gets both places again.
    let release = acquire_args(
        addr,
        &certs,
        &["reports", "--max", "2", "--ttl", "30s", "--count", "2"],
    );
    for _ in 0..2 {
        let out = floodgate(release.clone()).await;
        assert_eq!(out.status.code(), Some(0), "{:?}", lines(&out));
        assert_eq!(lines(&out).len(), 2);
    }
    assert_eq!(node.leases_in_use(b"reports"), 0);
}

#[tokio::test]
async fn bad_limits_exit_2_with_the_reason() {
    let certs = certs();
    let node = start_node(&certs, any_port(), false).await;
    let out = floodgate(acquire_args(
        node.local_addr(),
        &certs,
        &["k", "--max", "0", "--ttl", "30s"],
    ))
    .await;
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("max must be between 1 and 100000"),
        "{stderr}"
    );
    let out = floodgate(acquire_args(
        node.local_addr(),
        &certs,
        &["k", "--max", "1", "--ttl", "2d"],
    ))
    .await;
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("ttl must be between 1ms and 1 day"),
        "{stderr}"
    );
}
