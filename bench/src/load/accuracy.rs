//! `floodgate-bench accuracy`: how far over one key's limit a cluster lets traffic go when the
//! key is checked through all three of its nodes at once. A Gubernator cluster with its default
//! behaviour (each node forwards to the key's owner) and with GLOBAL (each node answers from its
//! own copy and syncs hits with the owner in the background) beside floodgate's `region` scope
//! (three nodes, one region: the key's owner decides) and `global` scope (three regions of one
//! node each, one limit shared by all, deltas exchanged every sync interval).
//!
//! Each run sends a fixed number of checks of cost 1 on one fresh key through each node, from
//! a few concurrent callers per node, all at once, and counts the admitted ones. The limit
//! refills too slowly to matter within a run (its count per hour), so an exact system admits
//! the limit and no more.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use floodgate::region::Scope;
use floodgate::{Limit, NANOS_PER_SEC};
use floodgate_client::{Check, Client, ClientConfig};

use super::gubernator::{GLOBAL, GubernatorChannels};
use super::outcome::Outcome;
use super::{peers, process};

#[derive(Debug, Clone, clap::Args)]
pub struct AccuracyArgs {
    /// The key's limit: this many per hour.
    #[arg(long, default_value_t = 100)]
    pub limit: u64,
    /// Checks sent through each node.
    #[arg(long, default_value_t = 400)]
    pub checks_per_node: u64,
    /// Concurrent callers per node.
    #[arg(long, default_value_t = 8)]
    pub callers: u64,
    /// The floodgate-node binary (default: beside this binary).
    #[arg(long)]
    pub node_bin: Option<PathBuf>,
    /// The gubernator binary (default: target/gubernator/bin/gubernator); when missing,
    /// Gubernator's rows are skipped.
    #[arg(long)]
    pub gubernator_bin: Option<PathBuf>,
    /// Where the nodes' data and the peers' logs go.
    #[arg(long, default_value = "target/bench-accuracy")]
    pub out: PathBuf,
}

/// Nodes in every cluster here.
const NODES: usize = 3;
/// Longest wait for a floodgate cluster to form.
const FORMING: Duration = Duration::from_secs(30);
/// Longest any one run may take.
const RUN_LIMIT: Duration = Duration::from_secs(60);

/// One row of the result.
#[derive(Debug)]
pub struct Row {
    pub system: &'static str,
    pub mode: &'static str,
    pub sent: u64,
    pub admitted: u64,
    pub limit: u64,
}

/// Runs every comparison it can set up and prints the markdown table; a system it cannot start
/// is skipped with the reason.
pub async fn run(args: AccuracyArgs) -> anyhow::Result<Vec<Row>> {
    anyhow::ensure!(
        args.limit >= 1 && args.callers >= 1,
        "--limit and --callers must be >= 1"
    );
    std::fs::create_dir_all(&args.out)?;
    let limit = Limit::gcra(args.limit, 3_600 * NANOS_PER_SEC, args.limit)?;
    let mut rows = Vec::new();
    match gubernator_rows(&args, limit).await {
        Ok(mut more) => rows.append(&mut more),
        Err(e) => eprintln!("skipping gubernator: {e:#}"),
    }
    for (mode, regions) in [
        ("region scope, 3 nodes", false),
        ("global scope, 3 regions", true),
    ] {
        match floodgate_row(&args, limit, mode, regions).await {
            Ok(row) => rows.push(row),
            Err(e) => eprintln!("skipping floodgate {mode}: {e:#}"),
        }
    }
    print!("{}", markdown(&rows, &args));
    Ok(rows)
}

pub fn markdown(rows: &[Row], args: &AccuracyArgs) -> String {
    let mut out = format!(
        "### One key's limit hit through {NODES} nodes at once\n\n{} checks through each node \
         from {} callers per node, limit {}/h (refill negligible within a run)\n\n\
         | system | mode | checks sent | admitted | limit | admitted / limit |\n|---|---|---|---|---|---|\n",
        args.checks_per_node, args.callers, args.limit
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {:.2}x |\n",
            r.system,
            r.mode,
            r.sent,
            r.admitted,
            r.limit,
            r.admitted as f64 / r.limit as f64
        ));
    }
    out
}

/// Sends `per_node` checks through each of the `nodes` callbacks from `callers` tasks each,
/// all at once; returns how many were admitted. A failed call, or one the client decided
/// without a node, fails the run.
async fn hammer<F, Fut>(nodes: usize, per_node: u64, callers: u64, check: F) -> anyhow::Result<u64>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<Outcome>> + Send,
{
    let check = Arc::new(check);
    let admitted = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + RUN_LIMIT;
    let mut tasks = tokio::task::JoinSet::new();
    for node in 0..nodes {
        for caller in 0..callers {
            let share = per_node / callers + u64::from(caller < per_node % callers);
            let (check, admitted, failed) = (check.clone(), admitted.clone(), failed.clone());
            tasks.spawn(async move {
                for _ in 0..share {
                    if Instant::now() > deadline {
                        break;
                    }
                    match check(node).await {
                        Ok(Outcome::Allowed) => admitted.fetch_add(1, Ordering::Relaxed),
                        Ok(Outcome::Denied) => 0,
                        // Not the cluster's decision: it cannot count for or against it.
                        Ok(Outcome::Degraded) | Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                    };
                }
            });
        }
    }
    while tasks.join_next().await.is_some() {}
    let failed = failed.load(Ordering::Relaxed);
    anyhow::ensure!(failed == 0, "{failed} checks failed");
    Ok(admitted.load(Ordering::Relaxed))
}

async fn gubernator_rows(args: &AccuracyArgs, limit: Limit) -> anyhow::Result<Vec<Row>> {
    let binary = args
        .gubernator_bin
        .clone()
        .unwrap_or_else(|| peers::default_binary("gubernator", "gubernator"));
    let (_cluster, addrs) =
        peers::start_gubernator(&binary, &args.out.join("gubernator"), NODES, 1_000).await?;
    let mut rows = Vec::new();
    for (mode, behavior, key) in [
        ("default (forwarded to the owner)", 0, "accuracy:default"),
        ("GLOBAL", GLOBAL, "accuracy:global"),
    ] {
        let mut per_node = Vec::new();
        for addr in &addrs {
            per_node.push(GubernatorChannels::connect(&[*addr], 1, limit, behavior).await?);
        }
        let per_node = Arc::new(per_node);
        let keys = Arc::new(vec![key.to_owned()]);
        let admitted = hammer(NODES, args.checks_per_node, args.callers, move |node| {
            let (per_node, keys) = (per_node.clone(), keys.clone());
            async move { per_node[node].check(&keys).await }
        })
        .await?;
        rows.push(Row {
            system: "gubernator",
            mode,
            sent: args.checks_per_node * NODES as u64,
            admitted,
            limit: args.limit,
        });
    }
    Ok(rows)
}

/// A floodgate cluster of three nodes (one region, or three regions of one node each), one
/// client seeded at each node (in that node's region), all checking one key.
async fn floodgate_row(
    args: &AccuracyArgs,
    limit: Limit,
    mode: &'static str,
    regions: bool,
) -> anyhow::Result<Row> {
    let binary = args
        .node_bin
        .clone()
        .unwrap_or_else(process::default_node_binary);
    let data_dir = args.out.join("node-data");
    let region = |i: usize| {
        if regions {
            format!("r{i}")
        } else {
            "local".to_owned()
        }
    };
    let (servers, addrs) = start_nodes(&binary, &data_dir, &region)?;
    // Every client must know the whole cluster of its region (one node per region: itself).
    let members = if regions { 1 } else { NODES };
    let clients = connect_clients(&data_dir.join("ca.pem"), &addrs, &region, members).await?;
    // Slots move to the joined nodes just after they join.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let scope = if regions {
        Scope::Global
    } else {
        Scope::Region
    };
    let key = format!("accuracy:{}", if regions { "global" } else { "region" });
    let check = Check::new(key.as_bytes(), limit).scope(scope);
    let clients = Arc::new(clients);
    let admitted = hammer(NODES, args.checks_per_node, args.callers, move |node| {
        let (clients, check) = (clients.clone(), check.clone());
        async move {
            let verdicts = clients[node].check(std::slice::from_ref(&check)).await?;
            Ok(match verdicts.first() {
                Some(v) if v.source != floodgate_client::Source::Node => Outcome::Degraded,
                Some(v) if v.is_allowed() => Outcome::Allowed,
                _ => Outcome::Denied,
            })
        }
    })
    .await?;
    drop(servers);
    Ok(Row {
        system: "floodgate",
        mode,
        sent: args.checks_per_node * NODES as u64,
        admitted,
        limit: args.limit,
    })
}

/// [`NODES`] nodes, node `i` in region `region(i)`, each after the first seeded at the first;
/// their servers and addresses.
fn start_nodes(
    binary: &Path,
    data_dir: &Path,
    region: &impl Fn(usize) -> String,
) -> anyhow::Result<(Vec<process::Server>, Vec<SocketAddr>)> {
    let mut servers = Vec::new();
    let mut addrs: Vec<SocketAddr> = Vec::new();
    for i in 0..NODES {
        let mut flags = vec!["--region".to_owned(), region(i)];
        if let Some(first) = addrs.first() {
            flags.extend(["--seeds".to_owned(), first.to_string()]);
        }
        let server = process::start_node_with(binary, data_dir, Some(1), None, &flags)?;
        addrs.push(server.addr);
        servers.push(server);
    }
    Ok((servers, addrs))
}

/// A client seeded at each of `addrs` (node `i` in region `region(i)`), returned once every
/// one knows `members` nodes and is connected (within [`FORMING`]).
async fn connect_clients(
    ca: &Path,
    addrs: &[SocketAddr],
    region: &impl Fn(usize) -> String,
    members: usize,
) -> anyhow::Result<Vec<Client>> {
    let mut clients = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        let mut config = ClientConfig::with_ca_file(ca);
        config.timeout = Duration::from_secs(2);
        config.region = Some(region(i));
        let client = Client::connect(&[*addr], config)
            .await
            .context("connecting to the node")?;
        clients.push(client);
    }
    let deadline = Instant::now() + FORMING;
    for client in &clients {
        while client.nodes().len() < members {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the cluster did not form within {FORMING:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        client.wait_connected().await;
    }
    Ok(clients)
}
