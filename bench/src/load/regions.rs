//! Global scope beside region scope: two regions of one node each on this machine, the gateway
//! in region `a`. The same uniform 1-check workload runs twice, each time on a fresh pair of
//! nodes: every check of scope `region` (decided by `a`'s node alone), then of scope `global`
//! (decided by `a`'s node through the region exchange, its units merged by `b`'s node). Server
//! CPU is both nodes summed, `a`'s alone beside it (`first_node_cpu_s_per_million`).

use indicatif::ProgressBar;

use floodgate::region::Scope;

use super::measure::run_system;
use super::systems::start_floodgate_regions;
use super::{Gateway, KeySpread, LoadArgs, Record, Workload};

/// The workload both scopes run: uniform keys, one check per request.
const WORKLOAD: Workload = Workload {
    spread: KeySpread::Uniform,
    checks_per_request: 1,
};

/// Steps of the progress bar the two systems take (for each: loading, the closed loop, and the
/// first offered rate).
pub(super) const STEPS: usize = 2 * 3;

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
    for (scope, data_dir) in [
        (Scope::Region, "regions-region-data"),
        (Scope::Global, "regions-global-data"),
    ] {
        let (server, target) = start_floodgate_regions(&args, gateway, data_dir, scope).await?;
        run_system(
            &args,
            Some(&server),
            target,
            &[WORKLOAD],
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
    fn the_workload_is_the_uniform_one_check_one_and_one_rate_runs() {
        assert_eq!(WORKLOAD.to_string(), "uniform/1-check");
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
        assert!(args.with_regions());
        let skipped = Cli::try_parse_from(["load", "--no-regions"]).unwrap().load;
        assert!(!skipped.with_regions());
        let no_uniform = Cli::try_parse_from(["load", "--spreads", "zipf"])
            .unwrap()
            .load;
        assert!(!no_uniform.with_regions());
    }
}
