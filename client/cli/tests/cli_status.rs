//! `floodgate status` against a 3-node cluster: it prints the table the client library fetches
//! (members, their states and slot counts), and exits 2 when no node answers.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::net::SocketAddr;
use std::process::{Command, Output};

use common::*;
use floodgate::cluster::SLOTS;
use floodgate_node::{Node, NodeConfig};

async fn start(certs: &Certs, seeds: Vec<SocketAddr>) -> Node {
    let mut config = NodeConfig::for_tests(&certs.dev);
    config.cluster.seeds = seeds.into_iter().map(Into::into).collect();
    Node::start(config).await.unwrap()
}

/// Waits, on the nodes' table changes and bounded by `PATIENCE`, until every node sees all of
/// them as owners.
async fn converge(nodes: &[Node]) {
    let mut ids: Vec<String> = nodes.iter().map(|n| n.node_id().to_owned()).collect();
    ids.sort();
    for node in nodes {
        let mut tables = node.watch_slot_table();
        let agreed = tables.wait_for(|_| node.owners() == ids);
        tokio::time::timeout(PATIENCE, agreed)
            .await
            .expect("the cluster converges")
            .unwrap();
    }
}

/// Runs the binary off the runtime's thread, so the in-process nodes keep serving meanwhile.
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_prints_the_cluster_table_and_exits_2_when_nobody_answers() {
    let certs = certs();
    let first = start(&certs, Vec::new()).await;
    let seed = first.local_addr();
    let nodes = vec![
        first,
        start(&certs, vec![seed]).await,
        start(&certs, vec![seed]).await,
    ];
    converge(&nodes).await;
    let addr_of = |id: &str| {
        nodes
            .iter()
            .find(|n| n.node_id() == id)
            .map(|n| n.local_addr().to_string())
    };
    let table =
        floodgate_client::fetch_slot_table(&[nodes[2].local_addr()], &client_config(&certs))
            .await
            .unwrap();

    let ca = certs.dev.ca.display().to_string();
    let node = nodes[2].local_addr().to_string();
    let out = floodgate(
        ["status", "--seeds", &node, "--ca", &ca]
            .map(str::to_owned)
            .into(),
    )
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        lines[0].starts_with("epoch ")
            && lines[0].contains(&format!("version {:016x}", table.version()))
            && lines[0].ends_with(&format!(
                "from {}, cluster protocol {}",
                nodes[2].node_id(),
                floodgate::protocol::NEWEST
            )),
        "{stdout}"
    );
    assert!(
        lines[1]
            .split_whitespace()
            .eq(["id", "region", "address", "state", "protocol", "slots"])
    );
    assert!(lines.len() >= 5, "{stdout}");
    let mut slots = 0;
    // One row per member (lines after them, if any, are about other things).
    for line in &lines[2..5] {
        let cells: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cells[1], "local");
        assert_eq!(Some(cells[2].to_owned()), addr_of(cells[0]));
        assert_eq!(cells[3], "alive");
        // Every node of this build speaks its whole range.
        assert_eq!(cells[4], floodgate::protocol::SUPPORTED.to_string());
        assert_eq!(
            cells[5].parse::<usize>().unwrap(),
            table.slots_owned(cells[0])
        );
        slots += table.slots_owned(cells[0]);
    }
    assert_eq!(slots, SLOTS);

    // Nobody there: exit 2.
    let args = [
        "status",
        "--seeds",
        "127.0.0.1:9",
        "--ca",
        &ca,
        "--timeout",
        "300ms",
    ];
    let out = floodgate(args.map(str::to_owned).into()).await;
    assert_eq!(out.status.code(), Some(2));
    for node in nodes {
        node.shutdown().await;
    }
}

/// `--brownout BACKEND` reads the fleet's level from the counts gateways report into the
/// cluster, without reporting itself: a gateway at level 2 brings `work` to level 2, a
/// backend nobody reports is at 0, a name no key can hold is said to be unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_the_fleet_brownout_level_per_backend() {
    let certs = certs();
    let node = start(&certs, Vec::new()).await;
    let client = floodgate_client::Client::connect(&[node.local_addr()], client_config(&certs))
        .await
        .unwrap();
    // An hour's interval: the counting period's boundaries (every 3 h from the epoch) fall
    // within this test with odds of about one in a million.
    let interval = std::time::Duration::from_secs(3_600);
    let gateway =
        floodgate_client::brownout::BrownoutReporter::new(client.clone(), "work", interval, 5_000)
            .unwrap();
    assert_eq!(gateway.round(2).await.unwrap().0, 2);

    let ca = certs.dev.ca.display().to_string();
    let addr = node.local_addr().to_string();
    let args = [
        "status",
        "--seeds",
        &addr,
        "--ca",
        &ca,
        "--brownout",
        "work,quiet",
        "--brownout",
        "a b",
        "--brownout-interval",
        "1h",
    ];
    for _ in 0..2 {
        let out = floodgate(args.map(str::to_owned).into()).await;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{stdout}");
        let brownout: Vec<&str> = stdout
            .lines()
            .filter(|l| l.starts_with("brownout "))
            .collect();
        // Read twice, the counts stay the gateway's one report: the status reports nothing.
        assert_eq!(
            brownout[..2],
            [
                "brownout work: fleet level 2 (sheddable and default shed); reports at level >= 0/1/2: 1/1/1, quorum 50%",
                "brownout quiet: fleet level 0 (nothing shed); reports at level >= 0/1/2: 0/0/0, quorum 50%",
            ],
            "{stdout}"
        );
        assert!(
            brownout[2].starts_with("brownout a b: unknown (backend name"),
            "{stdout}"
        );
    }
    client.close().await;
    node.shutdown().await;
}
