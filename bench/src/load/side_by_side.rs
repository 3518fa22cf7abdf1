//! The side-by-side step: every system again at the first offered rate, on fresh servers,
//! taking turns, so that the machine's stalls are shared out among them.

use std::sync::Arc;
use std::time::Duration;

use indicatif::ProgressBar;

use super::systems::{
    start_floodgate_cluster, start_floodgate_node, start_gubernator, start_redis_baseline,
};
use super::{Gateway, LoadArgs, Record, Server, Targets, Workload, driver, report, workload};

/// Turns run before the side-by-side step's first spread and not recorded. The servers are
/// fresh and the machine is still settling from the steps before (their servers exiting with
/// a million keys each), which lands on the first turns (floodgate's, when the turns came in
/// one fixed order): in three of ten full runs without it, the first spread's p99 was
/// 29-156 ms for floodgate (and 30-59 ms for both Redis baselines in one of them), where no
/// later spread's passed 3.1 ms.
const SIDE_BY_SIDE_WARM_UP: Duration = Duration::from_secs(1);

/// Every system again at the first offered rate, on fresh servers, the systems taking turns
/// of 50 ms (`driver::open_loop_taking_turns`): the stalls of this machine are then shared out
/// among them, where in the steps above they hit whichever system's step they fall in. Not
/// for leased workloads (floodgate alone runs those).
pub(super) async fn side_by_side(
    args: &LoadArgs,
    gateway: &Gateway,
    workloads: &[Workload],
    progress: &ProgressBar,
    with_gubernator: bool,
) -> anyhow::Result<Vec<Record>> {
    let Some(&rate) = args.rates.first() else {
        return Ok(Vec::new());
    };
    let (servers, targets) = start_servers(args, gateway, progress, with_gubernator).await?;
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
            let step = "side by side (turns of all systems counted)";
            if let Some(note) = stall_note(step, target, workload, run, *before) {
                progress.suspend(|| eprintln!("{note}"));
            }
            let mut record = Record::new(
                target.name(),
                &workload.to_string(),
                rate,
                run,
                report::CpuSeconds::default(),
                0.0,
            )
            .on_nodes(target.nodes());
            record.mode = "side-by-side".to_owned();
            records.push(record);
        }
    }
    drop(servers);
    Ok(records)
}

/// Fresh servers for the side-by-side step, and their targets: a floodgate node, then the
/// cluster, the Redis baselines and Gubernator as they run in this step (one that fails to
/// start is left out, and said so).
async fn start_servers(
    args: &LoadArgs,
    gateway: &Gateway,
    progress: &ProgressBar,
    with_gubernator: bool,
) -> anyhow::Result<(Vec<Server>, Vec<Targets>)> {
    let (node, floodgate) = start_floodgate_node(args, gateway, "side-node-data").await?;
    let mut targets = vec![floodgate];
    let mut servers = vec![node];
    // The cluster beside Gubernator's three nodes, server for server.
    if args.with_cluster() {
        match start_floodgate_cluster(args, gateway, "side-cluster-data").await {
            Ok((server, target)) => {
                servers.push(server);
                targets.push(target);
            }
            Err(e) => progress.suspend(|| eprintln!("side by side without the cluster: {e:#}")),
        }
    }
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
    Ok((servers, targets))
}

/// Whether `system` kept up with the first offered rate on every workload it ran when run
/// alone: a system that cannot would fill the side-by-side step's turns with its backlog, and
/// the other systems' tails with its stalls.
pub(super) fn keeps_up(records: &[Record], system: &str, rates: &[u64]) -> bool {
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

/// A line on a system's stalled requests in an open-loop step (`step`: which), if it had any:
/// how many, when they were due and the worst, with the QUIC packets lost meanwhile (a loss
/// costs a call at least a retransmission timeout), so a stall can be told from a lost datagram.
pub(super) fn stall_note(
    step: &str,
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
        "{step}, {} {workload}: {} requests took {} ms or more, due {:.2}-{:.2} s into \
         the step, the worst {} ms{transport}",
        target.name(),
        stalled.requests,
        driver::STALLED.as_millis(),
        stalled.first_due.as_secs_f64(),
        stalled.last_due.as_secs_f64(),
        stalled.worst.as_millis(),
    ))
}
