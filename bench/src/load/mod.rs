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
//!
//! Beside them, two regions of one node each (`regions`): global checks against region checks
//! on the same pair of nodes.
//!
//! This module runs the steps in order and prints the tables. The flags are in `args`; starting
//! each system in `systems`; one system's measurement in `measure`; the side-by-side step in
//! `side_by_side`.

pub mod accuracy;
mod args;
mod driver;
mod gateway;
mod grpc;
mod gubernator;
mod machine;
mod measure;
mod outcome;
mod peer_targets;
mod peers;
pub(crate) mod process;
mod regions;
mod report;
mod rls;
mod side_by_side;
mod systems;
mod target;
mod targets;
mod verdict;
mod workload;

use anyhow::Context;
use floodgate::Algorithm;
use indicatif::{ProgressBar, ProgressStyle};

use args::{MAX_RUNS, MAX_STEP};
use measure::{run_generator, run_system};
use side_by_side::{keeps_up, side_by_side};
use systems::{
    start_envoy_ratelimit, start_floodgate_cluster, start_floodgate_node, start_gubernator,
    start_redis_baseline, start_rls_cluster, start_rls_node,
};

pub(crate) use args::parse_duration;
pub use args::{LoadArgs, parse_rate_per_second};
pub use gateway::{Gateway, GatewayShape, Targets};
pub use outcome::Outcome;
pub use process::{Server, default_redis_cell_module, start_redis};
pub use report::Record;
pub use target::Target;
pub use workload::{KeySpread, Workload};

/// Runs the bench `--runs` times (each run's reports in `out/run-K` when there are several),
/// then judges the targets on their medians. Returns the last run's records.
pub async fn run(args: LoadArgs) -> anyhow::Result<Vec<Record>> {
    anyhow::ensure!(
        (1..=MAX_RUNS).contains(&args.runs),
        "--runs must be 1 to {MAX_RUNS}"
    );
    args.validate()?;
    if args.runs == 1 {
        return Ok(run_once(&args).await?.0);
    }
    let mut every_run = Vec::with_capacity(args.runs);
    let mut last = Vec::new();
    for k in 1..=args.runs {
        println!("## Run {k} of {}\n", args.runs);
        let mut this = args.clone();
        this.out = args.out.join(format!("run-{k}"));
        let (records, verdicts) = run_once(&this).await?;
        every_run.push(verdicts);
        last = records;
    }
    print!("{}", verdict::medians_table(&every_run));
    Ok(last)
}

/// One run: every system, the side-by-side step, the tables; returns the records and the
/// targets' verdicts.
async fn run_once(args: &LoadArgs) -> anyhow::Result<(Vec<Record>, Vec<verdict::Verdict>)> {
    anyhow::ensure!(args.keys >= 1, "--keys must be at least 1");
    anyhow::ensure!(args.callers >= 1, "--callers must be at least 1");
    anyhow::ensure!(
        !args.duration.is_zero() && args.duration <= MAX_STEP,
        "--duration must be more than 0 and at most 10min"
    );
    // The step compares floodgate with Redis in turns (Gubernator joins only after its own steps
    // kept up): without Redis, or with seeds, it would print nothing.
    anyhow::ensure!(
        !args.only_side_by_side || (!args.no_redis && args.seeds.is_empty()),
        "--only-side-by-side sets floodgate beside Redis: it cannot run with --no-redis or --seeds"
    );
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let workloads = args.workloads();
    let mut notes = Vec::new();
    if args.algorithm != Algorithm::Gcra {
        notes.push(format!(
            "floodgate's checks (and the RLS front's rules) are {} (the baselines and peers were \
             not run)",
            args.floodgate_limit()
        ));
    }
    let progress = progress_bar(args, workloads.len());
    let threads = match args.client_threads {
        Some(threads) => threads,
        None => std::thread::available_parallelism().map_or(1, usize::from),
    };
    let run_start = machine::CpuTimes::now();
    let gateway = Gateway::start(args.gateway, threads)?;
    let mut records = Vec::new();

    if !args.only_side_by_side {
        run_one_system_at_a_time(
            args,
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
        let side = side_by_side(args, &gateway, &workloads, &progress, with_gubernator).await?;
        (side, machine::CpuTimes::shares_since(before))
    };
    progress.finish_and_clear();
    print!("{}", targets::targets_markdown(&records, &side));
    print!("{}", targets::cluster_markdown(&records));
    print!("{}", targets::regions_markdown(&records));
    print!("{}", targets::rls_markdown(&records));
    print!("{}", peer_targets::markdown(&records, &side));
    let mut verdicts = targets::baseline_verdicts(&records, &side);
    verdicts.extend(targets::cluster_verdicts(&records));
    verdicts.extend(targets::regions_verdicts(&records));
    verdicts.extend(targets::rls_verdicts(&records));
    verdicts.extend(peer_targets::verdicts(&records, &side));
    let whole_run = machine::CpuTimes::shares_since(run_start);
    print!("{}", machine_markdown(whole_run, side_machine));
    write_reports(args, &records, &side, &notes)?;
    Ok((records, verdicts))
}

/// The run's progress bar (hidden with `--quiet`), as long as the steps the run will take.
fn progress_bar(args: &LoadArgs, workloads: usize) -> ProgressBar {
    let systems = 1
        + usize::from(args.with_cluster())
        + usize::from(args.with_rls())
        + usize::from(args.with_rls() && args.with_cluster())
        + if args.no_redis { 0 } else { 2 }
        + if args.with_peers() {
            1 + usize::from(args.with_rls())
        } else {
            0
        };
    let steps = if args.only_side_by_side {
        workloads
    } else {
        let regions = if args.with_regions() {
            regions::steps(args)
        } else {
            0
        };
        systems * workloads * (1 + args.rates.len()) + systems + 2 * workloads + regions
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
    progress
}

/// Writes the run's records (`report.json`, `latency.svg`) and the side-by-side step's
/// (`side-by-side.json`) into `--out`, and prints their tables and the run's notes.
fn write_reports(
    args: &LoadArgs,
    records: &[Record],
    side: &[Record],
    notes: &[String],
) -> anyhow::Result<()> {
    if !records.is_empty() {
        report::write_json(records, &args.out.join("report.json"))?;
        report::write_svg(records, &args.out.join("latency.svg"))?;
        println!("{}", report::markdown(records));
    }
    if !side.is_empty() {
        report::write_json(side, &args.out.join("side-by-side.json"))?;
    }
    print!("{}", report::side_by_side_markdown(side));
    for note in notes {
        println!("{note}");
    }
    if !records.is_empty() {
        println!(
            "(report: {}, plot: {})",
            args.out.join("report.json").display(),
            args.out.join("latency.svg").display()
        );
    }
    Ok(())
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

/// The main run: the generator alone, then each system in turn (floodgate, floodgate-cluster,
/// floodgate+rls, the peers, the Redis baselines, the two regions), each through the closed
/// loop and the open-loop rates.
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
    // One system through every workload, its records and notes added to the run's.
    let mut measure = async |server: Option<&Server>, target: Targets| {
        run_system(args, server, target, workloads, progress, records, notes).await
    };

    // floodgate
    let (server, target) = if args.seeds.is_empty() {
        let (server, target) = start_floodgate_node(args, gateway, "node-data").await?;
        (Some(server), target)
    } else {
        let ca = args.ca.clone().context("--seeds needs --ca")?;
        let (seed, limit) = (args.seeds[0].clone(), args.floodgate_limit());
        let target = gateway
            .connect(|| {
                let (seed, ca) = (seed.clone(), ca.clone());
                async move { Target::floodgate(seed, &ca, limit).await }
            })
            .await?;
        (None, target)
    };
    measure(server.as_ref(), target).await?;
    drop(server);

    // A cluster of nodes on this machine, each check sent to its key's owner.
    if args.with_cluster() {
        let (server, target) = start_floodgate_cluster(args, gateway, "cluster-data").await?;
        measure(Some(&server), target).await?;
    }

    // The same node behind its gRPC front (a fresh one, so its memory and buckets are its own).
    if args.with_rls() {
        let (server, target) = start_rls_node(args, gateway).await?;
        measure(Some(&server), target).await?;
    }

    // A cluster behind its nodes' gRPC fronts, the calls spread over every node.
    if args.with_rls() && args.with_cluster() {
        let (server, target) = start_rls_cluster(args, gateway).await?;
        measure(Some(&server), target).await?;
    }

    // The peers: envoyproxy/ratelimit beside floodgate+rls, and a Gubernator cluster.
    if args.with_peers() {
        if args.with_rls() {
            match start_envoy_ratelimit(args, gateway).await {
                Ok((server, target)) => measure(Some(&server), target).await?,
                Err(e) => progress.suspend(|| eprintln!("skipping envoy-ratelimit: {e:#}")),
            }
        }
        match start_gubernator(args, gateway).await {
            Ok((server, target)) => measure(Some(&server), target).await?,
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
            Ok((server, target)) => measure(Some(&server), target).await?,
            Err(e) => progress.suspend(|| eprintln!("skipping the {name} baseline: {e:#}")),
        }
    }

    // Two regions on this machine: global checks beside region checks.
    if args.with_regions() {
        regions::run_regions(args, gateway, progress, records, notes).await?;
    }
    Ok(())
}
