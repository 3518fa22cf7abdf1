//! `floodgate-chaos`: `run` scenarios against real nodes behind fault proxies, `list` them with
//! their bounds, `sim` the core's seeded simulations.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use floodgate_chaos::run::{RunSettings, ScenarioReport, UpgradeBins, run_scenario};
use floodgate_chaos::scenario::{self, Scenario};
use floodgate_chaos::{gateway_procs, procs, report, sim};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Debug, Parser)]
#[command(
    name = "floodgate-chaos",
    version,
    about = "Fault injection against a real floodgate cluster"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start nodes behind UDP fault proxies, drive load through the real client while a
    /// scenario injects faults, and check every key against the documented bound. Exits 0 only
    /// when every invariant held.
    Run(RunArgs),
    /// Print every scenario with its over-admission bound.
    List,
    /// Run the core's seeded simulations (ownership and regions) in virtual time: `--seed S`
    /// prints one seed's summary, `--seeds A-B` sweeps a range and prints each failing seed with
    /// its trace. Stdout depends only on the seeds; timing goes to stderr. Exits 0 only when
    /// every seed passed.
    Sim(SimArgs),
}

#[derive(Debug, Args)]
struct SimArgs {
    /// One seed, summarised in full.
    #[arg(long, conflicts_with = "seeds")]
    seed: Option<u64>,
    /// A range of seeds, `A-B` (at most a million).
    #[arg(long)]
    seeds: Option<String>,
    /// Threads to run seeds on (default: the machine's cores).
    #[arg(long)]
    threads: Option<usize>,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// A scenario name (see `list`), or `all`.
    #[arg(long, default_value = "all")]
    scenario: String,
    /// Seeds faults, key choice and pacing.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Load time of each scenario (faults happen at fixed shares of it), e.g. `12s`.
    #[arg(long, default_value = "12s", value_parser = parse_duration)]
    duration: Duration,
    #[arg(long, default_value_t = 2)]
    regions: usize,
    #[arg(long, default_value_t = 2)]
    nodes_per_region: usize,
    /// Gateways (each one `Client`) per region.
    #[arg(long, default_value_t = 2)]
    gateways_per_region: usize,
    /// Where report.json, the SVGs and the node logs go.
    #[arg(long, default_value = "target/chaos")]
    out: PathBuf,
    /// The floodgate-node binary (default: beside this one, else built with cargo).
    #[arg(long)]
    node_bin: Option<PathBuf>,
    /// Judge availability against this share (0 to 1) instead of each scenario's own floor;
    /// 0 judges safety only (what a test on a loaded machine does). Availability is reported
    /// either way.
    #[arg(long)]
    availability_floor: Option<f64>,
    /// The gateways' call timeout instead of the client's default (5 ms), e.g. `50ms`. Every
    /// scenario is meant to run at the default; this is for a test of the harness itself on
    /// debug builds.
    #[arg(long, value_parser = parse_duration)]
    client_timeout: Option<Duration>,
    /// `rolling-upgrade` only: the OLD build's floodgate-node, which the cluster starts on and
    /// is upgraded from (to --node-bin).
    #[arg(long, requires = "old_gateway_bin")]
    old_node_bin: Option<PathBuf>,
    /// `rolling-upgrade` only: the OLD build's example gateway (`examples/gateway`), run as
    /// processes beside this build's in-process gateways, then replaced by --gateway-bin.
    #[arg(long, requires = "old_node_bin")]
    old_gateway_bin: Option<PathBuf>,
    /// `rolling-upgrade` only: this build's example gateway (default: `examples/gateway` beside
    /// this binary).
    #[arg(long)]
    gateway_bin: Option<PathBuf>,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    floodgate::parse_duration_ns(text)
        .map(Duration::from_nanos)
        .map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::List => {
            print!("{}", report::list(&scenario::catalogue()));
            Ok(true)
        }
        Command::Sim(args) => simulate(&args),
        Command::Run(args) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(run(args))),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("floodgate-chaos: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn simulate(args: &SimArgs) -> anyhow::Result<bool> {
    let started = std::time::Instant::now();
    let threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    anyhow::ensure!((1..=64).contains(&threads), "--threads must be 1 to 64");
    let (passed, count) = match (&args.seeds, args.seed) {
        (Some(range), _) => {
            let seeds = sim::parse_seed_range(range, 1_000_000).map_err(anyhow::Error::msg)?;
            let outcomes = sim::run_seeds(seeds.clone(), threads);
            print!("{}", sim::summarize(&seeds, &outcomes));
            (
                outcomes.iter().all(sim::SeedOutcome::passed),
                outcomes.len(),
            )
        }
        (None, seed) => {
            let outcome = sim::run_seed(seed.unwrap_or(1));
            print!("{}", sim::describe(&outcome));
            (outcome.passed(), 1)
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    eprintln!(
        "{count} seed(s) in {seconds:.1} s on {threads} thread(s): {:.0} seeds per minute",
        count as f64 * 60.0 / seconds.max(1e-9)
    );
    Ok(passed)
}

async fn run(args: RunArgs) -> anyhow::Result<bool> {
    anyhow::ensure!((1..=5).contains(&args.regions), "--regions must be 1 to 5");
    anyhow::ensure!(
        (1..=4).contains(&args.nodes_per_region) && args.regions * args.nodes_per_region >= 2,
        "--nodes-per-region must be 1 to 4, with at least 2 nodes in all"
    );
    anyhow::ensure!(
        (1..=4).contains(&args.gateways_per_region),
        "--gateways-per-region must be 1 to 4"
    );
    anyhow::ensure!(
        args.duration >= Duration::from_secs(2) && args.duration <= Duration::from_secs(600),
        "--duration must be 2s to 10min"
    );
    let old_builds = args.old_node_bin.is_some() && args.old_gateway_bin.is_some();
    let scenarios = scenario::select(&args.scenario, old_builds).map_err(anyhow::Error::msg)?;
    let settings = run_settings(&args, &scenarios)?;
    log_clients_to(&args.out.join("clients.log"))?;
    let reports = run_each(&scenarios, &settings).await?;
    report::write_json(&reports, &args.out.join("report.json"))?;
    println!("{}", report::table(&reports));
    for line in report::upgrade_lines(&reports) {
        println!("{line}");
    }
    println!(
        "(report: {}, plots: {}/SCENARIO/SCENARIO.svg, node logs: {}/SCENARIO/logs, client logs: {})",
        args.out.join("report.json").display(),
        args.out.display(),
        args.out.display(),
        args.out.join("clients.log").display()
    );
    Ok(reports.iter().all(|r| r.passed))
}

/// Sends the log lines of the in-process gateways' clients (links going down, reconnects, tables
/// taken) to `path`, filtered by `RUST_LOG` (default: the client's info lines), so a scenario's
/// failure can be read against the node logs' timestamps.
fn log_clients_to(path: &std::path::Path) -> anyhow::Result<()> {
    let file =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("floodgate_client=info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(std::sync::Mutex::new(file))
        .try_init()
        .map_err(|e| anyhow::anyhow!("installing the client log: {e}"))
}

/// The settings every scenario runs with; creates the output directory.
fn run_settings(args: &RunArgs, scenarios: &[Scenario]) -> anyhow::Result<RunSettings> {
    let upgrade = match (&args.old_node_bin, &args.old_gateway_bin) {
        (Some(node), Some(gateway)) if scenarios.iter().any(|s| s.needs_old_builds) => {
            // Absolute, so the report names the binaries wherever it is read from.
            let absolute = |flag: &str, path: &PathBuf| {
                std::fs::canonicalize(path)
                    .with_context(|| format!("{flag} {}: no such file", path.display()))
            };
            Some(UpgradeBins {
                old_node: absolute("--old-node-bin", node)?,
                old_gateway: absolute("--old-gateway-bin", gateway)?,
                new_gateway: gateway_procs::gateway_binary(args.gateway_bin.as_deref())?,
            })
        }
        _ => None,
    };
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    if let Some(floor) = args.availability_floor {
        anyhow::ensure!(
            (0.0..=1.0).contains(&floor),
            "--availability-floor must be between 0 and 1"
        );
    }
    Ok(RunSettings {
        seed: args.seed,
        duration: args.duration,
        regions: args.regions,
        nodes_per_region: args.nodes_per_region,
        gateways_per_region: args.gateways_per_region,
        out: args.out.clone(),
        node_bin: procs::node_binary(args.node_bin.as_deref())?,
        availability_floor: args.availability_floor,
        client_timeout: args.client_timeout,
        upgrade,
    })
}

/// Runs the scenarios one after the other, with a progress bar on a terminal; an interrupt or
/// SIGTERM stops the run.
async fn run_each(
    scenarios: &[Scenario],
    settings: &RunSettings,
) -> anyhow::Result<Vec<ScenarioReport>> {
    let progress = if std::io::stderr().is_terminal() {
        ProgressBar::new(scenarios.len() as u64)
    } else {
        ProgressBar::hidden()
    };
    progress.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {elapsed} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut reports: Vec<ScenarioReport> = Vec::new();
    // SIGTERM too (a CI cancel, `timeout`): without a handler the process would die without
    // dropping the world, and leave its nodes running.
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    for scenario in scenarios {
        progress.set_message(scenario.name);
        // An interrupt drops the scenario's world, which kills its nodes (kill_on_drop).
        let outcome = tokio::select! {
            outcome = run_scenario(scenario, settings) => outcome,
            _ = tokio::signal::ctrl_c() => {
                progress.finish_and_clear();
                anyhow::bail!("interrupted: every node of the run was killed");
            }
            _ = terminate.recv() => {
                progress.finish_and_clear();
                anyhow::bail!("terminated: every node of the run was killed");
            }
        };
        let report = outcome.with_context(|| format!("scenario {}", scenario.name))?;
        if !report.passed {
            progress.suspend(|| {
                eprintln!("{} FAILED:", scenario.name);
                for v in &report.violations {
                    eprintln!("  {v}");
                }
            });
        }
        reports.push(report);
        progress.inc(1);
    }
    progress.finish_and_clear();
    Ok(reports)
}
