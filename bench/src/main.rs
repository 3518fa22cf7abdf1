//! `floodgate-bench`: command-line entry to the measuring tools.

use std::io;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use floodgate::{Algorithm, Limit, parse_rate};
use floodgate_bench::{load, replay};

#[derive(Debug, Parser)]
#[command(name = "floodgate-bench", version, about = "Measure floodgate")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per run: the size of the `load` flags' variant costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Command {
    /// Replay arrival times from stdin (`SECONDS [KEY]` per line) through one limit and print
    /// `allowed A of T` as the last line.
    Replay {
        /// gcra, fixed-window, sliding-window or sliding-log.
        #[arg(long, default_value = "gcra")]
        algorithm: Algorithm,
        /// The rate: N/s, N/min, N/h, N/d, or N per a duration (5/10s), as `floodgate check
        /// --limit` takes it.
        #[arg(long, value_parser = parse_rate_arg)]
        limit: (u64, u64),
        /// Most units at once (gcra only); defaults to the rate's count.
        #[arg(long)]
        burst: Option<u64>,
        /// Cost of each arrival.
        #[arg(long, default_value_t = 1)]
        cost: u64,
    },
    /// Drive floodgate, Redis + Lua, Redis + redis-cell, Gubernator and envoyproxy/ratelimit
    /// with the same workloads in one run and compare them: markdown on stdout, report.json and
    /// latency.svg in --out.
    Load(load::LoadArgs),
    /// The example gateway's load shedding: open-loop HTTP at 1x, 2x and 4x its demo
    /// upstream's capacity, with and without shedding: table on stdout, table.md,
    /// report.json and shed.svg in --out.
    Shed(floodgate_bench::shed::ShedArgs),
    /// One key's limit hit through all three nodes of a cluster at once: Gubernator (default
    /// and GLOBAL) beside floodgate (region and global scope); admitted against the limit.
    Accuracy(load::accuracy::AccuracyArgs),
}

fn parse_rate_arg(text: &str) -> Result<(u64, u64), String> {
    parse_rate(text).map_err(|e| e.to_string())
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
            limit: (rate, period_ns),
            burst,
            cost,
        } => {
            let limit = Limit::new(algorithm, rate, period_ns, burst.unwrap_or(rate))
                .context("invalid --limit/--burst")?;
            let summary = replay::replay(io::stdin().lock(), &limit, cost)?;
            println!("{limit}, cost {cost}");
            println!("allowed {} of {}", summary.allowed, summary.total);
            Ok(())
        }
        Command::Accuracy(args) => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            runtime.block_on(load::accuracy::run(args))?;
            Ok(())
        }
        Command::Load(args) => {
            // Only the run's control (timing, sampling, joining); the load runs on the
            // gateway's own threads (`load::Gateway`).
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(load::run(args))?;
            Ok(())
        }
        Command::Shed(args) => floodgate_bench::shed::run(args),
    }
}
