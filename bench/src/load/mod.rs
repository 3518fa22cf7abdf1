//! `floodgate-bench load`: floodgate against Redis + Lua, same workloads, same machine, same run.
//!
//! For each system: start its server (a `floodgate-node`, or `redis-server` with persistence
//! off), load the key space once to measure resident bytes per key, then for each workload run a
//! closed loop (maximum throughput, server CPU per million checks) and an open loop at rising
//! arrival rates (latency from the scheduled time). Outputs a markdown table with ratios,
//! `report.json` and `latency.svg` in the output folder.

mod driver;
mod process;
mod report;
mod target;
mod workload;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use floodgate::{Limit, NANOS_PER_SEC};
use indicatif::{ProgressBar, ProgressStyle};

pub use report::Record;
use target::Target;
pub use workload::{KeySpread, Workload};

use self::process::Server;

#[derive(Debug, Clone, clap::Args)]
pub struct LoadArgs {
    /// Seconds each closed-loop run and each open-loop step lasts.
    #[arg(long, default_value_t = 4.0)]
    pub seconds: f64,
    /// Open-loop arrival rates (requests/s), in increasing order; a system stops climbing once it
    /// saturates.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "10000,50000,100000,200000,400000,800000"
    )]
    pub rates: Vec<u64>,
    /// Concurrent callers in the closed loop.
    #[arg(long, default_value_t = 512)]
    pub callers: usize,
    /// Size of the key space (and keys loaded for the memory measurement).
    #[arg(long, default_value_t = 1_000_000)]
    pub keys: u64,
    /// Key spreads to run, each with 1 check per request; `--three-checks` adds uniform/3-check.
    #[arg(long, value_delimiter = ',', default_value = "uniform,zipf,hot")]
    pub spreads: Vec<KeySpread>,
    /// Also run requests of 3 checks (user + IP + API key) over the uniform spread.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub three_checks: bool,
    /// Skip the Redis baseline.
    #[arg(long)]
    pub no_redis: bool,
    /// Multiplexed (pipelining) Redis connections; calls are spread over them.
    #[arg(long, default_value_t = 4)]
    pub redis_connections: usize,
    /// The floodgate-node binary to start (default: beside this binary).
    #[arg(long)]
    pub node_bin: Option<PathBuf>,
    /// Use running nodes instead of starting one (then server CPU and memory are not measured).
    #[arg(long, value_delimiter = ',', requires = "ca")]
    pub nodes: Vec<SocketAddr>,
    /// CA certificate of the `--nodes`.
    #[arg(long)]
    pub ca: Option<PathBuf>,
    /// Runtime threads of the node started (default: its own, one per core).
    #[arg(long)]
    pub node_threads: Option<usize>,
    /// Where report.json and latency.svg go.
    #[arg(long, default_value = "target/bench")]
    pub out: PathBuf,
    /// No progress bar (for logs and CI).
    #[arg(long)]
    pub quiet: bool,
}

impl LoadArgs {
    fn workloads(&self) -> Vec<Workload> {
        let mut list: Vec<Workload> = self
            .spreads
            .iter()
            .map(|&spread| Workload {
                spread,
                checks_per_request: 1,
            })
            .collect();
        if self.three_checks {
            list.push(Workload {
                spread: KeySpread::Uniform,
                checks_per_request: 3,
            });
        }
        list
    }
}

/// The limit every check uses on both systems: 1,000 per hour with a burst of 1,000, so keys
/// stay live (and in memory) for the whole run on both sides.
fn bench_limit() -> Limit {
    // Valid by construction: rate, period and burst are in range.
    Limit::gcra(1_000, 3_600 * NANOS_PER_SEC, 1_000).unwrap_or_else(|_| unreachable!("valid limit"))
}

pub async fn run(args: LoadArgs) -> anyhow::Result<Vec<Record>> {
    anyhow::ensure!(args.keys >= 1, "--keys must be at least 1");
    anyhow::ensure!(args.callers >= 1, "--callers must be at least 1");
    anyhow::ensure!(
        args.seconds > 0.0 && args.seconds <= 600.0,
        "--seconds must be in (0, 600]"
    );
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let workloads = args.workloads();
    let systems = if args.no_redis { 1 } else { 2 };
    let steps = systems * workloads.len() * (1 + args.rates.len()) + systems;
    let progress = if args.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(steps as u64)
    };
    progress.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {elapsed} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut records = Vec::new();

    // floodgate
    let (server, target) = if args.nodes.is_empty() {
        let binary = args
            .node_bin
            .clone()
            .unwrap_or_else(process::default_node_binary);
        let data_dir = args.out.join("node-data");
        let server = process::start_node(&binary, &data_dir, args.node_threads)?;
        let target =
            Target::floodgate(server.addr, &data_dir.join("ca.pem"), bench_limit()).await?;
        (Some(server), target)
    } else {
        let ca = args.ca.clone().context("--nodes needs --ca")?;
        (
            None,
            Target::floodgate(args.nodes[0], &ca, bench_limit()).await?,
        )
    };
    run_system(
        &args,
        server.as_ref(),
        target,
        &workloads,
        &progress,
        &mut records,
    )
    .await?;
    drop(server);

    // Redis + Lua
    if !args.no_redis {
        match process::start_redis() {
            Ok(server) => {
                let target =
                    Target::redis(server.addr, args.redis_connections, bench_limit()).await?;
                run_system(
                    &args,
                    Some(&server),
                    target,
                    &workloads,
                    &progress,
                    &mut records,
                )
                .await?;
            }
            Err(e) => {
                progress.suspend(|| eprintln!("skipping the Redis baseline: {e:#}"));
            }
        }
    }
    progress.finish_and_clear();
    report::write_json(&records, &args.out.join("report.json"))?;
    report::write_svg(&records, &args.out.join("latency.svg"))?;
    println!("{}", report::markdown(&records));
    println!(
        "(report: {}, plot: {})",
        args.out.join("report.json").display(),
        args.out.join("latency.svg").display()
    );
    Ok(records)
}

async fn run_system(
    args: &LoadArgs,
    server: Option<&Server>,
    target: Target,
    workloads: &[Workload],
    progress: &ProgressBar,
    records: &mut Vec<Record>,
) -> anyhow::Result<()> {
    let target = Arc::new(target);
    let name = target.name();
    let seconds = Duration::from_secs_f64(args.seconds);
    progress.set_message(format!("{name}: loading {} keys", args.keys));
    let bytes_per_key = load_keys(&target, server, args.keys).await?;
    progress.inc(1);
    for (w, workload) in workloads.iter().enumerate() {
        let keys = Arc::new(workload::KeyGen::new(*workload, args.keys));
        progress.set_message(format!("{name} {workload}: closed loop"));
        let cpu_before = cpu(server);
        let run = driver::closed_loop(
            target.clone(),
            keys.clone(),
            args.callers,
            seconds,
            7 + w as u64,
        )
        .await;
        records.push(Record::new(
            name,
            &workload.to_string(),
            0,
            &run,
            cpu(server) - cpu_before,
            bytes_per_key,
        ));
        progress.inc(1);
        let mut saturated = false;
        for &rate in &args.rates {
            if saturated {
                progress.inc(1);
                continue;
            }
            progress.set_message(format!("{name} {workload}: open loop at {rate}/s"));
            let cpu_before = cpu(server);
            let run =
                driver::open_loop(target.clone(), keys.clone(), rate, seconds, 11 + w as u64).await;
            saturated = run.saturated || run.requests_per_second() < 0.9 * rate as f64;
            records.push(Record::new(
                name,
                &workload.to_string(),
                rate,
                &run,
                cpu(server) - cpu_before,
                bytes_per_key,
            ));
            progress.inc(1);
        }
    }
    Ok(())
}

fn cpu(server: Option<&Server>) -> f64 {
    server.and_then(|s| s.cpu_seconds().ok()).unwrap_or(0.0)
}

/// Touches every key once (the same key names the workloads use) and returns the server's
/// resident bytes gained per key.
async fn load_keys(
    target: &Arc<Target>,
    server: Option<&Server>,
    keys: u64,
) -> anyhow::Result<f64> {
    let before = server.map(|s| s.rss_bytes()).transpose()?.unwrap_or(0);
    const LOADERS: u64 = 256;
    let mut tasks = tokio::task::JoinSet::new();
    for loader in 0..LOADERS {
        let target = target.clone();
        tasks.spawn(async move {
            let mut key = Vec::with_capacity(1);
            for index in (loader..keys).step_by(LOADERS as usize) {
                key.clear();
                key.push(format!("user:{index}"));
                target.check(&key).await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(result) = tasks.join_next().await {
        result??;
    }
    let after = server.map(|s| s.rss_bytes()).transpose()?.unwrap_or(0);
    Ok(after.saturating_sub(before) as f64 / keys as f64)
}
