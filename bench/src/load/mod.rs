//! `floodgate-bench load`: floodgate (through its QUIC client, and through Envoy's rate limit
//! service as `floodgate+rls`) against Redis + Lua and Redis + redis-cell, and against the peers
//! its users would otherwise run (a 3-node Gubernator cluster; envoyproxy/ratelimit, fed the
//! same RLS calls as `floodgate+rls`), same workloads, same machine, same run.
//!
//! For each system: start its server (a `floodgate-node`, one with `--rls-config` for
//! `floodgate+rls`, or `redis-server` with persistence off, with the redis-cell module for
//! `redis+cell`, or the peers' own processes), load the key space once to measure
//! resident bytes per key, then for each workload run a closed loop (maximum throughput, server
//! CPU per million checks) and an open loop at rising arrival rates (latency from the scheduled
//! time). Outputs a markdown table with ratios, `report.json` and `latency.svg` in the output
//! folder.

pub mod accuracy;
mod driver;
mod gateway;
mod gubernator;
mod machine;
mod outcome;
mod peer_targets;
mod peers;
pub(crate) mod process;
mod report;
mod rls;
mod target;
mod targets;
mod workload;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use floodgate::{Limit, NANOS_PER_SEC};
use indicatif::{ProgressBar, ProgressStyle};

pub use gateway::{Gateway, GatewayShape, Targets};
pub use outcome::Outcome;
pub use process::{Server, default_redis_cell_module, start_redis};
pub use report::Record;
pub use target::Target;
pub use workload::{KeySpread, Workload};

#[derive(Debug, Clone, clap::Args)]
pub struct LoadArgs {
    /// How long each closed-loop run and each open-loop step lasts (e.g. 500ms, 4s; at most
    /// 10min).
    #[arg(long, default_value = "4s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Open-loop arrival rates, in increasing order (e.g. 10000/s, 600000/min; at least 1/s);
    /// repeat the flag or separate with commas. A system stops climbing once it saturates.
    #[arg(
        long,
        value_delimiter = ',',
        value_parser = parse_rate_per_second,
        default_value = "10000/s,50000/s,100000/s,200000/s,400000/s,800000/s"
    )]
    pub rates: Vec<u64>,
    /// Concurrent callers in the closed loop.
    #[arg(long, default_value_t = 512)]
    pub callers: usize,
    /// Size of the key space (and keys loaded for the memory measurement).
    #[arg(long, default_value_t = 1_000_000)]
    pub keys: u64,
    /// Key spreads to run, each with 1 check per request (repeat the flag or separate with
    /// commas); `--three-checks` adds uniform/3-check. `hot-leased` runs only on floodgate: one
    /// key through a client with token leases on.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "uniform,zipf,hot,hot-leased"
    )]
    pub spreads: Vec<KeySpread>,
    /// Also run requests of 3 checks (user + IP + API key) over the uniform spread.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub three_checks: bool,
    /// Skip both Redis baselines.
    #[arg(long)]
    pub no_redis: bool,
    /// Skip `floodgate+rls` (a node started with `--rls-config`, driven through Envoy's RLS v3
    /// gRPC API); it is also skipped with `--seeds`.
    #[arg(long)]
    pub no_rls: bool,
    /// Skip the peers (Gubernator and envoyproxy/ratelimit).
    #[arg(long)]
    pub no_peers: bool,
    /// Keys loaded into each peer to measure its bytes per key (at most `--keys`): the peers
    /// take a few thousand checks a second here, so a million would take minutes.
    #[arg(long, default_value_t = 100_000)]
    pub peer_keys: u64,
    /// The gubernator binary (default: target/gubernator/bin/, where `bench/go-peer.sh
    /// gubernator` installs it); when missing, that peer is skipped.
    #[arg(long)]
    pub gubernator_bin: Option<PathBuf>,
    /// envoyproxy/ratelimit's binary (default: target/envoy-ratelimit/bin/service_cmd, where
    /// `bench/go-peer.sh envoy-ratelimit` installs it); when missing, that peer is skipped. It
    /// runs only where `floodgate+rls` does, which it is compared with.
    #[arg(long)]
    pub envoy_ratelimit_bin: Option<PathBuf>,
    /// HTTP/2 channels to the RLS listener per gateway thread; its calls are spread over them.
    #[arg(long, default_value_t = 4)]
    pub rls_channels: usize,
    /// The redis-cell module for the `redis+cell` baseline (default: target/redis-cell/, where
    /// `bench/redis-cell.sh` builds it); when missing, that baseline is skipped.
    #[arg(long)]
    pub redis_cell: Option<PathBuf>,
    /// Multiplexed (pipelining) Redis connections per gateway thread; its calls are spread over
    /// them. One measured best here (bench/RESULTS.md: of 1-16 in one shared runtime, of 1 and
    /// 2 per thread): redis-server is one thread, and few pipelined connections hand it the
    /// largest batches.
    #[arg(long, default_value_t = 1)]
    pub redis_connections: usize,
    /// The floodgate-node binary to start (default: beside this binary).
    #[arg(long)]
    pub node_bin: Option<PathBuf>,
    /// Measure a running cluster instead of starting a node: the nodes to start from, HOST:PORT
    /// with an IP address or a DNS name (repeat the flag or separate with commas; the first is
    /// used). Server CPU and memory are then not measured.
    #[arg(long, value_delimiter = ',', requires = "ca")]
    pub seeds: Vec<floodgate_client::HostPort>,
    /// CA certificate of the `--seeds`.
    #[arg(long)]
    pub ca: Option<PathBuf>,
    /// Runtime threads of the node started (default: its own, half the cores).
    #[arg(long)]
    pub node_threads: Option<usize>,
    /// Threads of the gateway this process plays, which run the load generator and every
    /// system's clients (default: one per core).
    #[arg(long)]
    pub client_threads: Option<usize>,
    /// How the gateway runs: `thread-per-core` (a runtime and clients of its own per thread,
    /// like Envoy's workers) or `multi-thread` (one work-stealing runtime, one shared client
    /// per system). Every system is driven through the same shape.
    #[arg(long, value_enum, default_value = "thread-per-core")]
    pub gateway: GatewayShape,
    /// Where report.json and latency.svg go.
    #[arg(long, default_value = "target/bench")]
    pub out: PathBuf,
    /// Run only the side-by-side step (every system at the first rate, in turns of 50 ms):
    /// the quick way to compare tails at low load, repeated, on a noisy machine.
    #[arg(long)]
    pub only_side_by_side: bool,
    /// No progress bar (for logs and CI).
    #[arg(long)]
    pub quiet: bool,
}

impl LoadArgs {
    /// The floodgate-node binary to start.
    fn node_binary(&self) -> PathBuf {
        self.node_bin
            .clone()
            .unwrap_or_else(process::default_node_binary)
    }

    /// Whether `floodgate+rls` runs: not with `--no-rls`, nor against a running cluster.
    fn with_rls(&self) -> bool {
        !self.no_rls && self.seeds.is_empty()
    }

    /// Whether the peers run: not with `--no-peers`, nor against a running cluster.
    fn with_peers(&self) -> bool {
        !self.no_peers && self.seeds.is_empty()
    }

    fn gubernator_binary(&self) -> PathBuf {
        self.gubernator_bin
            .clone()
            .unwrap_or_else(|| peers::default_binary("gubernator", "gubernator"))
    }

    fn envoy_ratelimit_binary(&self) -> PathBuf {
        self.envoy_ratelimit_bin
            .clone()
            .unwrap_or_else(|| peers::default_binary("envoy-ratelimit", "service_cmd"))
    }

    /// The redis-cell module for the `redis+cell` baseline.
    fn redis_cell_module(&self) -> PathBuf {
        self.redis_cell
            .clone()
            .unwrap_or_else(default_redis_cell_module)
    }

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

/// Longest `--duration`: every loop of a run stays bounded in time.
const MAX_STEP: Duration = Duration::from_secs(600);

/// `--duration`: the core's duration syntax (`500ms`, `4s`, `1.5min`); a bare number is refused.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    floodgate::parse_duration_ns(text)
        .map(Duration::from_nanos)
        .map_err(|e| e.to_string())
}

/// `--rates`: the core's rate syntax (`10000/s`, `5/10s`), as whole requests per second.
pub fn parse_rate_per_second(text: &str) -> Result<u64, String> {
    let (count, period_ns) = floodgate::parse_rate(text).map_err(|e| e.to_string())?;
    let per_second = u128::from(count) * u128::from(NANOS_PER_SEC) / u128::from(period_ns.max(1));
    match u64::try_from(per_second) {
        Ok(rate) if rate >= 1 => Ok(rate),
        _ => Err(format!(
            "`{text}`: an arrival rate must be between 1/s and {}/s",
            u64::MAX
        )),
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
        !args.duration.is_zero() && args.duration <= MAX_STEP,
        "--duration must be more than 0 and at most 10min"
    );
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let workloads = args.workloads();
    let mut notes = Vec::new();
    let systems = 1
        + usize::from(args.with_rls())
        + if args.no_redis { 0 } else { 2 }
        + if args.with_peers() {
            1 + usize::from(args.with_rls())
        } else {
            0
        };
    let steps = if args.only_side_by_side {
        workloads.len()
    } else {
        systems * workloads.len() * (1 + args.rates.len()) + systems + 2 * workloads.len()
    };
    let progress = if args.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(steps as u64)
    };
    progress.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {elapsed} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let threads = match args.client_threads {
        Some(threads) => threads,
        None => std::thread::available_parallelism().map_or(1, usize::from),
    };
    let run_start = machine::CpuTimes::now();
    let gateway = Gateway::start(args.gateway, threads)?;
    let mut records = Vec::new();

    if !args.only_side_by_side {
        run_one_system_at_a_time(
            &args,
            &gateway,
            &workloads,
            &progress,
            &mut records,
            &mut notes,
        )
        .await?;
    }
    let with_gubernator = args.with_peers() && keeps_up(&records, "gubernator", &args.rates);
    let (side, side_machine) = if (args.no_redis && !with_gubernator) || !args.seeds.is_empty() {
        (Vec::new(), None)
    } else {
        let before = machine::CpuTimes::now();
        let side = side_by_side(&args, &gateway, &workloads, &progress, with_gubernator).await?;
        (side, machine::CpuTimes::shares_since(before))
    };
    progress.finish_and_clear();
    print!("{}", targets::targets_markdown(&records, &side));
    print!("{}", peer_targets::markdown(&records, &side));
    let whole_run = machine::CpuTimes::shares_since(run_start);
    print!("{}", machine_markdown(whole_run, side_machine));
    if !records.is_empty() {
        report::write_json(&records, &args.out.join("report.json"))?;
        report::write_svg(&records, &args.out.join("latency.svg"))?;
        println!("{}", report::markdown(&records));
    }
    if !side.is_empty() {
        report::write_json(&side, &args.out.join("side-by-side.json"))?;
    }
    print!("{}", report::side_by_side_markdown(&side));
    for note in &notes {
        println!("{note}");
    }
    if !records.is_empty() {
        println!(
            "(report: {}, plot: {})",
            args.out.join("report.json").display(),
            args.out.join("latency.svg").display()
        );
    }
    Ok(records)
}

/// A line on how the machine's CPUs spent the run and its side-by-side step (empty where
/// `/proc/stat` could not be read): a run in a spell of stolen time is not a quiet run.
fn machine_markdown(
    whole_run: Option<machine::CpuShares>,
    side_by_side: Option<machine::CpuShares>,
) -> String {
    let spans: Vec<String> = [
        ("the whole run", whole_run),
        ("the side-by-side step", side_by_side),
    ]
    .into_iter()
    .filter_map(|(name, shares)| shares.map(|s| format!("over {name} {s}")))
    .collect();
    if spans.is_empty() {
        return String::new();
    }
    format!(
        "The machine's CPUs (all of them, from /proc/stat): {}.\n\n",
        spans.join("; ")
    )
}

/// The main run: the generator alone, then each system in turn (floodgate, floodgate+rls, the
/// Redis baselines), each through the closed loop and the open-loop rates.
async fn run_one_system_at_a_time(
    args: &LoadArgs,
    gateway: &Gateway,
    workloads: &[Workload],
    progress: &ProgressBar,
    records: &mut Vec<Record>,
    notes: &mut Vec<String>,
) -> anyhow::Result<()> {
    // The generator alone first, so its own cost per check can be taken out of client CPU.
    run_generator(args, gateway, workloads, progress, records).await;

    // floodgate
    let (server, target) = if args.seeds.is_empty() {
        let (server, target) = start_floodgate_node(args, gateway, "node-data").await?;
        (Some(server), target)
    } else {
        let ca = args.ca.clone().context("--seeds needs --ca")?;
        let seed = args.seeds[0].clone();
        let target = gateway
            .connect(|| {
                let (seed, ca) = (seed.clone(), ca.clone());
                async move { Target::floodgate(seed, &ca, bench_limit()).await }
            })
            .await?;
        (None, target)
    };
    run_system(
        args,
        server.as_ref(),
        target,
        workloads,
        progress,
        records,
        notes,
    )
    .await?;
    drop(server);

    // The same node behind its gRPC front (a fresh one, so its memory and buckets are its own).
    if args.with_rls() {
        let (server, target) = start_rls_node(args, gateway).await?;
        run_system(
            args,
            Some(&server),
            target,
            workloads,
            progress,
            records,
            notes,
        )
        .await?;
    }

    // The peers: envoyproxy/ratelimit beside floodgate+rls, and a Gubernator cluster.
    if args.with_peers() {
        if args.with_rls() {
            match start_envoy_ratelimit(args, gateway).await {
                Ok((server, target)) => {
                    run_system(
                        args,
                        Some(&server),
                        target,
                        workloads,
                        progress,
                        records,
                        notes,
                    )
                    .await?
                }
                Err(e) => progress.suspend(|| eprintln!("skipping envoy-ratelimit: {e:#}")),
            }
        }
        match start_gubernator(args, gateway).await {
            Ok((server, target)) => {
                run_system(
                    args,
                    Some(&server),
                    target,
                    workloads,
                    progress,
                    records,
                    notes,
                )
                .await?
            }
            Err(e) => progress.suspend(|| eprintln!("skipping gubernator: {e:#}")),
        }
    }

    // Redis + Lua, then Redis + redis-cell (CL.THROTTLE): the script, and the fastest Redis setup.
    let cell_module = args.redis_cell_module();
    for module in [None, Some(cell_module.as_path())] {
        if args.no_redis {
            break;
        }
        let name = if module.is_some() {
            "redis+cell"
        } else {
            "redis+lua"
        };
        match start_redis_baseline(gateway, module, args.redis_connections).await {
            Ok((server, target)) => {
                run_system(
                    args,
                    Some(&server),
                    target,
                    workloads,
                    progress,
                    records,
                    notes,
                )
                .await?
            }
            Err(e) => progress.suspend(|| eprintln!("skipping the {name} baseline: {e:#}")),
        }
    }
    Ok(())
}

/// Turns run before the side-by-side step's first spread and not recorded. The servers are
/// fresh and the machine is still settling from the steps before (their servers exiting with
/// a million keys each), which lands on the first turns, floodgate's: in three of ten full
/// runs without it, the first spread's p99 was 29-156 ms for floodgate (and 30-59 ms for both
/// Redis baselines in one of them), where no later spread's passed 3.1 ms.
const SIDE_BY_SIDE_WARM_UP: Duration = Duration::from_secs(1);

/// Every system again at the first offered rate, on fresh servers, the systems taking turns
/// of 50 ms (`driver::open_loop_taking_turns`): the stalls of this machine are then shared out
/// among them, where in the steps above they hit whichever system's step they fall in. Not
/// for leased workloads (floodgate alone runs those).
async fn side_by_side(
    args: &LoadArgs,
    gateway: &Gateway,
    workloads: &[Workload],
    progress: &ProgressBar,
    with_gubernator: bool,
) -> anyhow::Result<Vec<Record>> {
    let Some(&rate) = args.rates.first() else {
        return Ok(Vec::new());
    };
    let (node, floodgate) = start_floodgate_node(args, gateway, "side-node-data").await?;
    let mut targets = vec![floodgate];
    let mut servers = vec![node];
    let cell_module = args.redis_cell_module();
    for module in [None, Some(cell_module.as_path())] {
        if args.no_redis {
            break;
        }
        match start_redis_baseline(gateway, module, args.redis_connections).await {
            Ok((server, target)) => {
                servers.push(server);
                targets.push(target);
            }
            Err(e) => progress.suspend(|| eprintln!("side by side without a baseline: {e:#}")),
        }
    }
    if with_gubernator {
        match start_gubernator(args, gateway).await {
            Ok((server, target)) => {
                servers.push(server);
                targets.push(target);
            }
            Err(e) => progress.suspend(|| eprintln!("side by side without gubernator: {e:#}")),
        }
    }
    if let Some(first) = workloads.iter().find(|w| !w.spread.leased()) {
        progress.set_message(format!("side by side: warming up on {first} at {rate}/s"));
        let keys = Arc::new(workload::KeyGen::new(*first, args.keys));
        let warm_up = SIDE_BY_SIDE_WARM_UP.min(args.duration);
        driver::open_loop_taking_turns(targets.clone(), keys, rate, warm_up, 100).await;
    }
    let mut records = Vec::new();
    for (w, workload) in workloads.iter().enumerate() {
        progress.inc(1);
        if workload.spread.leased() {
            continue;
        }
        progress.set_message(format!("side by side {workload} at {rate}/s"));
        let keys = Arc::new(workload::KeyGen::new(*workload, args.keys));
        let transport_before: Vec<_> = targets.iter().map(|t| t.transport()).collect();
        let runs = driver::open_loop_taking_turns(
            targets.clone(),
            keys,
            rate,
            args.duration,
            101 + w as u64,
        )
        .await;
        for ((target, run), before) in targets.iter().zip(&runs).zip(&transport_before) {
            if let Some(note) = stall_note(target, workload, run, *before) {
                progress.suspend(|| eprintln!("{note}"));
            }
            let mut record = Record::new(
                target.name(),
                &workload.to_string(),
                rate,
                run,
                report::CpuSeconds::default(),
                0.0,
            );
            record.mode = "side-by-side".to_owned();
            records.push(record);
        }
    }
    drop(servers);
    Ok(records)
}

/// Whether `system` kept up with the first offered rate on every workload it ran when run
/// alone: a system that cannot would fill the side-by-side step's turns with its backlog, and
/// the other systems' tails with its stalls.
fn keeps_up(records: &[Record], system: &str, rates: &[u64]) -> bool {
    let Some(&rate) = rates.first() else {
        return false;
    };
    let mut runs = records
        .iter()
        .filter(|r| r.system == system && r.offered_rate == rate)
        .peekable();
    runs.peek().is_some()
        && runs.all(|r| !r.saturated && r.requests_per_second >= 0.99 * rate as f64)
}

/// A line on a system's stalled requests in the side-by-side step, if it had any: how many,
/// when they were due and the worst, with the QUIC packets lost meanwhile (a loss costs a call
/// at least a retransmission timeout), so a stall can be told from a lost datagram.
fn stall_note(
    target: &Targets,
    workload: &Workload,
    run: &driver::RunResult,
    transport_before: Option<(u64, u64)>,
) -> Option<String> {
    let stalled = run.stalled?;
    let transport = match (transport_before, target.transport()) {
        (Some((sent0, lost0)), Some((sent, lost))) => format!(
            "; its QUIC connections sent {} packets and lost {} meanwhile",
            sent.saturating_sub(sent0),
            lost.saturating_sub(lost0)
        ),
        _ => String::new(),
    };
    Some(format!(
        "side by side, {} {workload}: {} requests took {} ms or more, due {:.2}-{:.2} s into \
         the step (turns of all systems counted), the worst {} ms{transport}",
        target.name(),
        stalled.requests,
        driver::STALLED.as_millis(),
        stalled.first_due.as_secs_f64(),
        stalled.last_due.as_secs_f64(),
        stalled.worst.as_millis(),
    ))
}

/// Starts a node with its data (and dev certificates) in `out/data_dir` and connects the
/// floodgate target of every gateway worker to it.
async fn start_floodgate_node(
    args: &LoadArgs,
    gateway: &Gateway,
    data_dir: &str,
) -> anyhow::Result<(Server, Targets)> {
    let data_dir = args.out.join(data_dir);
    let server = process::start_node(&args.node_binary(), &data_dir, args.node_threads, None)?;
    let (addr, ca) = (server.addr, data_dir.join("ca.pem"));
    let target = gateway
        .connect(|| {
            let ca = ca.clone();
            async move { Target::floodgate(addr, &ca, bench_limit()).await }
        })
        .await?;
    Ok((server, target))
}

/// Writes the RLS configuration (the workloads' limit on each descriptor key), starts a node
/// serving it on a free port, and connects the RLS target.
async fn start_rls_node(args: &LoadArgs, gateway: &Gateway) -> anyhow::Result<(Server, Targets)> {
    let binary = args.node_binary();
    let config = args.out.join("rls.yaml");
    std::fs::write(&config, rls::config_yaml(&bench_limit())?)
        .with_context(|| format!("writing {}", config.display()))?;
    let listen = process::free_tcp_addr()?;
    let data_dir = args.out.join("rls-node-data");
    let server = process::start_node(
        &binary,
        &data_dir,
        args.node_threads,
        Some((&config, listen)),
    )?;
    let channels = args.rls_channels;
    let target = gateway.connect(|| Target::rls(listen, channels)).await?;
    Ok((server, target))
}

/// Starts a Gubernator cluster and connects the target of every gateway worker to all its
/// nodes, as many HTTP/2 channels to each as `--rls-channels` gives the RLS listener.
async fn start_gubernator(args: &LoadArgs, gateway: &Gateway) -> anyhow::Result<(Server, Targets)> {
    let (server, nodes) = peers::start_gubernator(
        &args.gubernator_binary(),
        &args.out.join("gubernator"),
        peers::GUBERNATOR_NODES,
        args.keys,
    )
    .await?;
    let per_node = args.rls_channels.div_ceil(nodes.len()).max(1);
    let target = gateway
        .connect(|| {
            let nodes = nodes.clone();
            async move { Target::gubernator(&nodes, per_node, bench_limit()).await }
        })
        .await?;
    Ok((server, target))
}

/// Starts envoyproxy/ratelimit over its own redis-server and connects its RLS target.
async fn start_envoy_ratelimit(
    args: &LoadArgs,
    gateway: &Gateway,
) -> anyhow::Result<(Server, Targets)> {
    let (server, listen) = peers::start_envoy_ratelimit(
        &args.envoy_ratelimit_binary(),
        &args.out.join("envoy-ratelimit"),
        &bench_limit(),
    )?;
    let channels = args.rls_channels;
    let target = gateway
        .connect(|| Target::envoy_ratelimit(listen, channels))
        .await?;
    Ok((server, target))
}

/// Starts redis-server (with the redis-cell module if given) and connects the target of every
/// gateway worker to it, `connections` each.
async fn start_redis_baseline(
    gateway: &Gateway,
    module: Option<&std::path::Path>,
    connections: usize,
) -> anyhow::Result<(Server, Targets)> {
    let server = start_redis(module)?;
    let addr = server.addr;
    let cell = module.is_some();
    let target = gateway
        .connect(|| async move {
            if cell {
                Target::redis_cell(addr, connections, bench_limit()).await
            } else {
                Target::redis(addr, connections, bench_limit()).await
            }
        })
        .await?;
    Ok((server, target))
}

/// The peers' system names: their memory is measured on `--peer-keys` keys.
const PEERS: [&str; 2] = ["gubernator", "envoy-ratelimit"];

async fn run_system(
    args: &LoadArgs,
    server: Option<&Server>,
    target: Targets,
    workloads: &[Workload],
    progress: &ProgressBar,
    records: &mut Vec<Record>,
    notes: &mut Vec<String>,
) -> anyhow::Result<()> {
    let name = target.name();
    let seconds = args.duration;
    let loaded = if PEERS.contains(&name) {
        args.keys.min(args.peer_keys)
    } else {
        args.keys
    };
    progress.set_message(format!("{name}: loading {loaded} keys"));
    let bytes_per_key = load_keys(&target, server, loaded).await?;
    progress.inc(1);
    for (w, workload) in workloads.iter().enumerate() {
        if workload.spread.leased() && !target.leases() {
            progress.inc(1 + args.rates.len() as u64);
            continue;
        }
        let keys = Arc::new(workload::KeyGen::new(*workload, args.keys));
        let first = records.len();
        let started = std::time::Instant::now();
        progress.set_message(format!("{name} {workload}: closed loop"));
        let cpu_before = Cpu::now(server);
        let run =
            driver::closed_loop(&target, keys.clone(), args.callers, seconds, 7 + w as u64).await;
        records.push(Record::new(
            name,
            &workload.to_string(),
            0,
            &run,
            Cpu::now(server).since(cpu_before),
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
            let cpu_before = Cpu::now(server);
            let run = driver::open_loop(&target, keys.clone(), rate, seconds, 11 + w as u64).await;
            saturated = run.saturated || run.requests_per_second() < 0.9 * rate as f64;
            records.push(Record::new(
                name,
                &workload.to_string(),
                rate,
                &run,
                Cpu::now(server).since(cpu_before),
                bytes_per_key,
            ));
            progress.inc(1);
        }
        if workload.spread.leased() {
            let admitted = records[first..].iter().map(|r| r.allowed).sum();
            let note = lease_accounting(&target, *workload, admitted, started.elapsed(), records)?;
            notes.push(note);
        }
    }
    Ok(())
}

/// Holds a leased workload to its limit: every request checks one key of its own, so what the
/// generator counted as admitted over all its steps is what that key admitted, and the limit
/// allows at most `burst + rate × elapsed` from a fresh bucket. Over it, the run fails. Also
/// says how its throughput compares with the same key checked at the owner (`hot-key`).
fn lease_accounting(
    target: &Targets,
    workload: Workload,
    admitted: u64,
    elapsed: Duration,
    records: &[Record],
) -> anyhow::Result<String> {
    let limit = bench_limit();
    let refilled = u128::from(limit.rate()) * elapsed.as_nanos() / u128::from(limit.period_ns());
    let allowed = u128::from(limit.burst()) + refilled + 1;
    let name = target.name();
    let stats = target.lease_stats().unwrap_or_default();
    anyhow::ensure!(
        u128::from(admitted) <= allowed,
        "{name} {workload}: the generator counted {admitted} admitted checks on its one key, \
         over the {allowed} that {limit} allows in {:.1} s: token leases let more through \
         than the limit",
        elapsed.as_secs_f64()
    );
    let closed = |w: &str| {
        records
            .iter()
            .find(|r| r.system == name && r.workload == w && r.offered_rate == 0)
            .map(|r| r.achieved_rate)
    };
    let hot = Workload {
        spread: KeySpread::Hot,
        checks_per_request: 1,
    };
    let ratio = match (closed(&workload.to_string()), closed(&hot.to_string())) {
        (Some(leased), Some(plain)) if plain > 0.0 => {
            format!(", {:.1}x the throughput of {hot}", leased / plain)
        }
        _ => String::new(),
    };
    Ok(format!(
        "{name} {workload}: admitted {admitted} on its key, at most {allowed} allowed by {limit} \
         over {:.1} s (within the limit){ratio}; leases: {} decided locally ({} admitted, {} \
         denied), {} tokens granted, {} returned",
        elapsed.as_secs_f64(),
        stats.local_allowed + stats.local_denied,
        stats.local_allowed,
        stats.local_denied,
        stats.granted,
        stats.returned,
    ))
}

/// CPU seconds used so far by the server under test (0 when it is not ours to read) and by
/// this process (the load generator and the client under test).
#[derive(Debug, Clone, Copy)]
struct Cpu {
    server: f64,
    client: f64,
}

impl Cpu {
    fn now(server: Option<&Server>) -> Self {
        Cpu {
            server: server.and_then(|s| s.cpu_seconds().ok()).unwrap_or(0.0),
            client: process::own_cpu_seconds(),
        }
    }

    fn since(self, before: Cpu) -> report::CpuSeconds {
        report::CpuSeconds {
            server: self.server - before.server,
            client: self.client - before.client,
        }
    }
}

/// The load generator alone, against a target that answers at once: its CPU per million
/// checks, closed loop and at the first offered rate, is what the client CPU figures of the
/// real systems include and can be reduced by.
async fn run_generator(
    args: &LoadArgs,
    gateway: &Gateway,
    workloads: &[Workload],
    progress: &ProgressBar,
    records: &mut Vec<Record>,
) {
    let target = gateway.noop();
    for (w, workload) in workloads.iter().enumerate() {
        let keys = Arc::new(workload::KeyGen::new(*workload, args.keys));
        progress.set_message(format!("generator alone {workload}"));
        let before = Cpu::now(None);
        let run = driver::closed_loop(
            &target,
            keys.clone(),
            args.callers,
            args.duration,
            7 + w as u64,
        )
        .await;
        let name = target.name();
        let workload_name = workload.to_string();
        records.push(Record::new(
            name,
            &workload_name,
            0,
            &run,
            Cpu::now(None).since(before),
            0.0,
        ));
        if let Some(&rate) = args.rates.first() {
            let before = Cpu::now(None);
            let run = driver::open_loop(&target, keys, rate, args.duration, 11 + w as u64).await;
            records.push(Record::new(
                name,
                &workload_name,
                rate,
                &run,
                Cpu::now(None).since(before),
                0.0,
            ));
        }
        progress.inc(1);
    }
}

/// Touches every key once (the same key names the workloads use) and returns the server's
/// resident bytes gained per key.
async fn load_keys(target: &Targets, server: Option<&Server>, keys: u64) -> anyhow::Result<f64> {
    let before = server.map(|s| s.rss_bytes()).transpose()?.unwrap_or(0);
    const LOADERS: u64 = 256;
    const LOAD_TRIES: u32 = 3;
    let mut tasks = tokio::task::JoinSet::new();
    for loader in 0..LOADERS {
        let (worker, target) = target.on(loader as usize);
        let target = target.clone();
        tasks.spawn_on(
            async move {
                let mut key = Vec::with_capacity(1);
                for index in (loader..keys).step_by(LOADERS as usize) {
                    key.clear();
                    key.push(format!("user:{index}"));
                    // A peer can time out a call under this burst (Gubernator forwarding to
                    // the key's owner): a few tries, then the run fails.
                    let mut tries = 0;
                    while let Err(e) = target.check(&key).await {
                        tries += 1;
                        if tries == LOAD_TRIES {
                            return Err(
                                e.context(format!("loading {} failed {tries} times", key[0]))
                            );
                        }
                    }
                }
                anyhow::Ok(())
            },
            worker,
        );
    }
    while let Some(result) = tasks.join_next().await {
        result??;
    }
    let after = server.map(|s| s.rss_bytes()).transpose()?.unwrap_or(0);
    Ok(after.saturating_sub(before) as f64 / keys as f64)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        load: LoadArgs,
    }

    fn parse(args: &[&str]) -> Result<LoadArgs, clap::Error> {
        Cli::try_parse_from(["load"].iter().chain(args)).map(|c| c.load)
    }

    #[test]
    fn durations_and_rates_use_the_core_syntax() {
        let args = parse(&["--duration", "500ms", "--rates", "10/s,600/min,50/10s"]).unwrap();
        assert_eq!(args.duration, Duration::from_millis(500));
        assert_eq!(args.rates, [10, 10, 5]);
        let defaults = parse(&[]).unwrap();
        assert_eq!(defaults.duration, Duration::from_secs(4));
        assert_eq!(defaults.rates[0], 10_000);
    }

    #[test]
    fn bare_numbers_and_rates_under_one_per_second_are_refused() {
        for bad in [
            &["--duration", "4"][..],
            &["--seconds", "4"],
            &["--rates", "500"],
            &["--rates", "1/min"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} parsed");
        }
        let err = parse(&["--rates", "1/min"]).unwrap_err().to_string();
        assert!(err.contains("between 1/s"), "{err}");
    }

    #[test]
    fn list_flags_take_repeated_or_comma_separated_values_alike() {
        let ca = ["--ca", "ca.pem"];
        let joined =
            parse(&[&ca[..], &["--seeds", "127.0.0.1:7100,127.0.0.1:7101"]].concat()).unwrap();
        let repeated = parse(
            &[
                &ca[..],
                &["--seeds", "127.0.0.1:7100", "--seeds", "127.0.0.1:7101"],
            ]
            .concat(),
        )
        .unwrap();
        assert_eq!(joined.seeds, repeated.seeds);
        assert_eq!(joined.seeds.len(), 2);
        let rates = parse(&["--rates", "1/s", "--rates", "2/s,3/s"]).unwrap();
        assert_eq!(rates.rates, [1, 2, 3]);
        let spreads = parse(&["--spreads", "uniform", "--spreads", "zipf,hot"]).unwrap();
        assert_eq!(spreads.spreads.len(), 3);
        let defaults = parse(&[]).unwrap();
        assert!(defaults.spreads.contains(&KeySpread::HotLeased));
        // The old name is gone.
        assert!(parse(&[&ca[..], &["--nodes", "127.0.0.1:7100"]].concat()).is_err());
    }

    #[test]
    fn seeds_may_be_host_names_and_need_a_port() {
        let ca = ["--ca", "ca.pem"];
        let named =
            parse(&[&ca[..], &["--seeds", "localhost:7100,fg-1.fg:7100"]].concat()).unwrap();
        let seeds: Vec<String> = named.seeds.iter().map(ToString::to_string).collect();
        assert_eq!(seeds, ["localhost:7100", "fg-1.fg:7100"]);
        let err = parse(&[&ca[..], &["--seeds", "localhost"]].concat())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--seeds") && err.contains("has no port"),
            "{err}"
        );
    }
}
