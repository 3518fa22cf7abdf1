//! Global scope beside region scope: two regions of one node each on this machine, the gateway
//! in region `a`. The same workloads run twice, each time on a fresh pair of nodes: every check
//! of scope `region` (decided by `a`'s node alone), then of scope `global` (decided by `a`'s
//! node through the region exchange, its units merged by `b`'s node). Server CPU is both nodes
//! summed, `a`'s alone beside it (`first_node_cpu_s_per_million`). Uniform keys always: the
//! exchange's worst case (no key is checked twice in a round, so every admission is a delta of
//! its own); zipf keys too when the run has them, a skewed traffic where a busy key's units go
//! as one delta a round. The target is judged on each.

use indicatif::ProgressBar;

use floodgate::region::Scope;

use super::measure::run_system;
use super::systems::start_floodgate_regions;
use super::{Gateway, KeySpread, LoadArgs, Record, Workload};

/// The workload both scopes always run: uniform keys, one check per request.
const WORKLOAD: Workload = Workload {
    spread: KeySpread::Uniform,
    checks_per_request: 1,
};

/// Run beside it when the run's spreads include zipf.
const SKEWED: Workload = Workload {
    spread: KeySpread::Zipf,
    checks_per_request: 1,
};

/// The workloads the two systems run for these flags: uniform, then zipf if asked for.
fn workloads(args: &LoadArgs) -> Vec<Workload> {
    let mut workloads = vec![WORKLOAD];
    if args.spreads.contains(&KeySpread::Zipf) {
        workloads.push(SKEWED);
    }
    workloads
}

/// Steps of the progress bar the two systems take: for each, loading, then per workload its
/// closed loop and the first offered rate.
pub(super) fn steps(args: &LoadArgs) -> usize {
    2 * (1 + 2 * workloads(args).len())
}

/// The flags for the two systems' runs: the run's, with only its first offered rate (the
/// comparison is the closed loop's CPU; one open-loop step shows the latency a global check
/// adds at low load).
fn regions_args(args: &LoadArgs) -> LoadArgs {
    let mut args = args.clone();
    args.rates.truncate(1);
    args
}

/// Runs both scopes, region first, each on its own pair of nodes, their records and notes
/// added to the run's.
pub(super) async fn run_regions(
    args: &LoadArgs,
    gateway: &Gateway,
    progress: &ProgressBar,
    records: &mut Vec<Record>,
    notes: &mut Vec<String>,
) -> anyhow::Result<()> {
    let args = regions_args(args);
    let workloads = workloads(&args);
    for (scope, data_dir) in [
        (Scope::Region, "regions-region-data"),
        (Scope::Global, "regions-global-data"),
    ] {
        let (server, target) = start_floodgate_regions(&args, gateway, data_dir, scope).await?;
        run_system(
            &args,
            Some(&server),
            target,
            &workloads,
            progress,
            records,
            notes,
        )
        .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_runs_zipf_beside_it_when_asked_and_one_rate_runs() {
        // The names the targets judge them by (`targets::GLOBAL_WORKLOADS`).
        assert_eq!(WORKLOAD.to_string(), "uniform/1-check");
        assert_eq!(SKEWED.to_string(), "zipf/1-check");
        use clap::Parser;
        #[derive(Debug, Parser)]
        struct Cli {
            #[command(flatten)]
            load: LoadArgs,
        }
        let args = Cli::try_parse_from(["load", "--rates", "10/s,20/s"])
            .unwrap()
            .load;
        assert_eq!(regions_args(&args).rates, [10]);
        assert_eq!(workloads(&args), [WORKLOAD, SKEWED]);
        assert_eq!(steps(&args), 2 * 5);
        let uniform_only = Cli::try_parse_from(["load", "--spreads", "uniform,hot"])
            .unwrap()
            .load;
        assert_eq!(workloads(&uniform_only), [WORKLOAD]);
        assert_eq!(steps(&uniform_only), 2 * 3);
        assert!(args.with_regions());
        let skipped = Cli::try_parse_from(["load", "--no-regions"]).unwrap().load;
        assert!(!skipped.with_regions());
        let no_uniform = Cli::try_parse_from(["load", "--spreads", "zipf"])
            .unwrap()
            .load;
        assert!(!no_uniform.with_regions());
    }
}
