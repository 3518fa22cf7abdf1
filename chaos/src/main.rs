//! `floodgate-chaos`: `run` scenarios against real nodes behind fault proxies, `list` them with
//! their bounds.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use floodgate_chaos::run::{RunSettings, ScenarioReport, run_scenario};
use floodgate_chaos::{procs, report, scenario};
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
    let scenarios = if args.scenario == "all" {
        scenario::catalogue()
    } else {
        let names: Vec<&str> = args.scenario.split(',').collect();
        names
            .iter()
            .map(|n| {
                scenario::find(n).with_context(|| {
                    format!("no scenario `{n}`: `floodgate-chaos list` names them")
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?
    };
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let settings = RunSettings {
        seed: args.seed,
        duration: args.duration,
        regions: args.regions,
        nodes_per_region: args.nodes_per_region,
        gateways_per_region: args.gateways_per_region,
        out: args.out.clone(),
        node_bin: procs::node_binary(args.node_bin.as_deref())?,
    };
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
    for scenario in &scenarios {
        progress.set_message(scenario.name);
        // An interrupt drops the scenario's world, which kills its nodes (kill_on_drop).
        let outcome = tokio::select! {
            outcome = run_scenario(scenario, &settings) => outcome,
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
    report::write_json(&reports, &args.out.join("report.json"))?;
    println!("{}", report::table(&reports));
    println!(
        "(report: {}, plots: {}/SCENARIO/SCENARIO.svg, node logs: {}/SCENARIO/logs)",
        args.out.join("report.json").display(),
        args.out.display(),
        args.out.display()
    );
    Ok(reports.iter().all(|r| r.passed))
}
