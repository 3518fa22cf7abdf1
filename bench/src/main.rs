//! `floodgate-bench`: command-line entry to the measuring tools.

use std::io;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use floodgate::{Algorithm, Limit, parse_duration_ns};
use floodgate_bench::{load, replay};

#[derive(Debug, Parser)]
#[command(name = "floodgate-bench", version, about = "Measure floodgate")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Replay arrival times from stdin (`SECONDS [KEY]` per line) through one limit and print
    /// `allowed A of T` as the last line.
    Replay {
        /// gcra, fixed-window, sliding-window or sliding-log.
        #[arg(long, default_value = "gcra")]
        algorithm: Algorithm,
        /// Units allowed per period.
        #[arg(long)]
        limit: u64,
        /// Length of the period, e.g. 1s, 500ms, 1min.
        #[arg(long, default_value = "1s", value_parser = parse_duration_ns)]
        period: u64,
        /// Most units at once (gcra only); defaults to the limit.
        #[arg(long)]
        burst: Option<u64>,
        /// Cost of each arrival.
        #[arg(long, default_value_t = 1)]
        cost: u64,
    },
    /// Drive floodgate and Redis + Lua with the same workloads in one run and compare them:
    /// markdown on stdout, report.json and latency.svg in --out.
    Load(load::LoadArgs),
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("floodgate-bench: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Replay {
            algorithm,
            limit,
            period,
            burst,
            cost,
        } => {
            let limit = Limit::new(algorithm, limit, period, burst.unwrap_or(limit))
                .context("invalid limit")?;
            let summary = replay::replay(io::stdin().lock(), &limit, cost)?;
            println!("{limit}, cost {cost}");
            println!("allowed {} of {}", summary.allowed, summary.total);
            Ok(())
        }
        Command::Load(args) => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            runtime.block_on(load::run(args))?;
            Ok(())
        }
    }
}
