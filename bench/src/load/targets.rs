//! floodgate's performance targets, judged from one run's records against redis+lua: a table of
//! target, the run's figure, and whether it was met, printed before the full tables so a run
//! says at once where it stands.

use std::fmt::Write as _;

use super::report::{Record, find};
use super::target::{CLUSTER, REGIONS_GLOBAL, REGIONS_REGION, RLS};
use super::verdict::{Bound, Verdict, verdict_table};

const SUBJECT: &str = "floodgate";
const BASELINE: &str = "redis+lua";
const THREE_CHECKS: &str = "uniform/3-check";
/// The spreads the latency targets are judged on, in table order.
const LATENCY_WORKLOADS: [&str; 4] = [
    "uniform/1-check",
    "zipf/1-check",
    "hot-key/1-check",
    THREE_CHECKS,
];
/// A baseline keeps up with an offered rate when it completes at least this share of it.
const KEEPS_UP: f64 = 0.99;

/// floodgate's and redis+lua's records of one workload at one offered rate.
fn pair<'a>(records: &'a [Record], workload: &str, rate: u64) -> Option<(&'a Record, &'a Record)> {
    Some((
        find(records, SUBJECT, workload, rate)?,
        find(records, BASELINE, workload, rate)?,
    ))
}

/// The closed loop's throughput over redis+lua's, at least `at_least`.
fn throughput(records: &[Record], workload: &str, at_least: f64) -> Verdict {
    let target = format!("closed loop, {workload}: at least {at_least:.0}x redis+lua's checks/s");
    match pair(records, workload, 0) {
        Some((f, b)) if b.achieved_rate > 0.0 => {
            let ratio = f.achieved_rate / b.achieved_rate;
            let figure = format!(
                "{ratio:.2}x ({:.0} / {:.0})",
                f.achieved_rate, b.achieved_rate
            );
            Verdict::judged(target, figure, ratio, Bound::AtLeast(at_least))
        }
        _ => Verdict::unmeasured(target, "not run"),
    }
}

/// p99 at the lowest offered rate no worse than redis+lua's. Judged on the side-by-side step
/// when it ran: there the systems take turns of 50 ms, so the machine's stalls are shared out
/// among them, where in the steps run one system at a time they land on whichever step they
/// fall in. The one-at-a-time figure is shown beside it.
fn low_load_p99(records: &[Record], side: &[Record], workload: &str) -> Option<Verdict> {
    let rate = records
        .iter()
        .chain(side)
        .filter(|r| r.workload == workload && r.offered_rate > 0)
        .map(|r| r.offered_rate)
        .min()?;
    let target = format!("p99 at {rate} req/s, {workload}: at most redis+lua's");
    let describe = |(f, b): (&Record, &Record)| {
        format!(
            "{:.2}x ({} / {} µs)",
            f.p99_us as f64 / b.p99_us.max(1) as f64,
            f.p99_us,
            b.p99_us
        )
    };
    let together = pair(side, workload, rate);
    let alone = pair(records, workload, rate);
    let Some((f, b)) = together.or(alone) else {
        return Some(Verdict::unmeasured(target, "not run"));
    };
    let figures: Vec<String> = [("side by side", together), ("one at a time", alone)]
        .into_iter()
        .filter_map(|(how, pair)| pair.map(|pair| format!("{how} {}", describe(pair))))
        .collect();
    Some(Verdict::judged(
        target,
        figures.join("; "),
        f.p99_us as f64 / b.p99_us.max(1) as f64,
        Bound::AtMost(1.0),
    ))
}

/// p99 at the highest offered rate redis+lua kept up with, at most half of redis+lua's.
fn loaded_p99(records: &[Record], workload: &str) -> Option<Verdict> {
    let kept_up = records
        .iter()
        .filter(|r| r.system == BASELINE && r.workload == workload && r.offered_rate > 0)
        .filter(|r| !r.saturated && r.requests_per_second >= KEEPS_UP * r.offered_rate as f64)
        .max_by_key(|r| r.offered_rate)?;
    let rate = kept_up.offered_rate;
    let target =
        format!("p99 at the highest rate redis+lua keeps up with, {workload}: at most 0.5x");
    Some(match find(records, SUBJECT, workload, rate) {
        Some(f) => {
            let ratio = f.p99_us as f64 / kept_up.p99_us.max(1) as f64;
            let figure = format!(
                "{ratio:.2}x ({} / {} µs at {rate} req/s)",
                f.p99_us, kept_up.p99_us
            );
            Verdict::judged(target, figure, ratio, Bound::AtMost(0.5))
        }
        None => Verdict::unmeasured(target, "floodgate did not run at that rate"),
    })
}

/// The node's CPU per million checks in the uniform 1-check closed loop, at most `at_most`
/// seconds; the bench process's (client and load generator) is shown beside it.
fn node_cpu(records: &[Record], at_most: f64) -> Verdict {
    let workload = LATENCY_WORKLOADS[0];
    let target =
        format!("node CPU per million checks, closed loop, {workload}: at most {at_most} s");
    match find(records, SUBJECT, workload, 0) {
        Some(f) if f.cpu_s_per_million > 0.0 => {
            let figure = format!(
                "{:.2} s (client and generator: {:.2} s)",
                f.cpu_s_per_million, f.client_cpu_s_per_million
            );
            Verdict::judged(target, figure, f.cpu_s_per_million, Bound::AtMost(at_most))
        }
        _ => Verdict::unmeasured(target, "not measured"),
    }
}

fn bytes_per_key(records: &[Record], at_most: f64) -> Verdict {
    let target = format!("bytes per active key: at most {at_most:.0}");
    match records
        .iter()
        .find(|r| r.system == SUBJECT && r.bytes_per_key > 0.0)
    {
        Some(f) => Verdict::judged(
            target,
            format!("{:.0}", f.bytes_per_key),
            f.bytes_per_key,
            Bound::AtMost(at_most),
        ),
        None => Verdict::unmeasured(target, "not measured"),
    }
}

/// The targets against redis+lua: `records` from the steps run one system at a time, `side`
/// from the side-by-side step. None when redis+lua did not run (nothing to judge against).
pub(super) fn baseline_verdicts(records: &[Record], side: &[Record]) -> Vec<Verdict> {
    if !records.iter().chain(side).any(|r| r.system == BASELINE) {
        return Vec::new();
    }
    let mut verdicts = vec![
        throughput(records, LATENCY_WORKLOADS[0], 10.0),
        throughput(records, THREE_CHECKS, 15.0),
    ];
    verdicts.extend(
        LATENCY_WORKLOADS
            .iter()
            .filter_map(|w| low_load_p99(records, side, w)),
    );
    verdicts.extend(
        LATENCY_WORKLOADS
            .iter()
            .filter_map(|w| loaded_p99(records, w)),
    );
    verdicts.push(node_cpu(records, 0.3));
    verdicts.push(bytes_per_key(records, 64.0));
    verdicts
}

/// The targets table against redis+lua; empty when redis+lua did not run.
pub fn targets_markdown(records: &[Record], side: &[Record]) -> String {
    let mut out = String::new();
    let verdicts = baseline_verdicts(records, side);
    if verdicts.is_empty() {
        return out;
    }
    verdict_table(
        &mut out,
        &format!("floodgate against {BASELINE}"),
        &verdicts,
    );
    let _ = writeln!(
        out,
        "\n\"Keeps up\": completed at least {:.0}% of the offered rate without saturating.\n",
        KEEPS_UP * 100.0
    );
    out
}

/// The cluster's targets against the single node, on the uniform 1-check closed loop: its
/// checks per second at least 0.8x the node's (the same cores serve all its nodes), and node
/// CPU per million checks, summed over its nodes, at most 1.3x. None when no cluster ran.
pub(super) fn cluster_verdicts(records: &[Record]) -> Vec<Verdict> {
    let workload = LATENCY_WORKLOADS[0];
    let Some(cluster) = find(records, CLUSTER, workload, 0) else {
        return Vec::new();
    };
    let single = find(records, SUBJECT, workload, 0);
    let nodes = cluster.nodes;
    let mut verdicts = Vec::new();
    let target = format!("closed loop, {workload}: at least 0.8x the single node's checks/s");
    verdicts.push(match single {
        Some(f) if f.achieved_rate > 0.0 => {
            let ratio = cluster.achieved_rate / f.achieved_rate;
            let figure = format!(
                "{ratio:.2}x ({:.0} / {:.0})",
                cluster.achieved_rate, f.achieved_rate
            );
            Verdict::judged(target, figure, ratio, Bound::AtLeast(0.8))
        }
        _ => Verdict::unmeasured(target, "the single node did not run"),
    });
    let target = format!(
        "node CPU per million checks, closed loop, {workload}, summed over {nodes} nodes: at \
         most 1.3x the single node's"
    );
    verdicts.push(match single {
        Some(f) if f.cpu_s_per_million > 0.0 && cluster.cpu_s_per_million > 0.0 => {
            let ratio = cluster.cpu_s_per_million / f.cpu_s_per_million;
            let figure = format!(
                "{ratio:.2}x ({:.2} / {:.2} s)",
                cluster.cpu_s_per_million, f.cpu_s_per_million
            );
            Verdict::judged(target, figure, ratio, Bound::AtMost(1.3))
        }
        _ => Verdict::unmeasured(target, "not measured"),
    });
    verdicts
}

/// The cluster's targets table; empty when no cluster ran.
pub fn cluster_markdown(records: &[Record]) -> String {
    let mut out = String::new();
    let verdicts = cluster_verdicts(records);
    let nodes = records
        .iter()
        .find(|r| r.system == CLUSTER)
        .map_or(0, |r| r.nodes);
    if !verdicts.is_empty() {
        verdict_table(
            &mut out,
            &format!("{CLUSTER} of {nodes} nodes against one {SUBJECT} node"),
            &verdicts,
        );
        out.push('\n');
    }
    out
}

/// Most node CPU per descriptor through the RLS front, in µs (the same as seconds per million).
const RLS_US_PER_DESCRIPTOR: f64 = 5.0;

/// The RLS front's targets (an Envoy's calls, one descriptor per key): node CPU per descriptor
/// at most [`RLS_US_PER_DESCRIPTOR`] in both closed loops (one descriptor a call, and three,
/// as an Envoy with several rate limit actions sends), and its checks per second in the 1-check
/// closed loop at least redis+lua's. None when the front did not run.
pub(super) fn rls_verdicts(records: &[Record]) -> Vec<Verdict> {
    if !records.iter().any(|r| r.system == RLS) {
        return Vec::new();
    }
    let mut verdicts: Vec<Verdict> = [LATENCY_WORKLOADS[0], THREE_CHECKS]
        .into_iter()
        .map(|workload| {
            let target = format!(
                "node CPU per descriptor through the RLS front, closed loop, {workload}: at \
                 most {RLS_US_PER_DESCRIPTOR} µs"
            );
            match find(records, RLS, workload, 0) {
                Some(f) if f.cpu_s_per_million > 0.0 => Verdict::judged(
                    target,
                    format!("{:.1} µs", f.cpu_s_per_million),
                    f.cpu_s_per_million,
                    Bound::AtMost(RLS_US_PER_DESCRIPTOR),
                ),
                _ => Verdict::unmeasured(target, "not measured"),
            }
        })
        .collect();
    verdicts.push(super::peer_targets::throughput(records, RLS, BASELINE, 1.0));
    verdicts
}

/// The RLS front's targets table; empty when the front did not run.
pub fn rls_markdown(records: &[Record]) -> String {
    let mut out = String::new();
    let verdicts = rls_verdicts(records);
    if !verdicts.is_empty() {
        verdict_table(&mut out, &format!("{RLS}: the RLS front"), &verdicts);
        out.push('\n');
    }
    out
}

/// Most a global check's node CPU may be, as a multiple of a region check's.
const GLOBAL_OVER_REGION: f64 = 1.5;

/// The workloads the two regions' systems run (`regions.rs`): uniform keys always, zipf when
/// the run has them.
const GLOBAL_WORKLOADS: [&str; 2] = ["uniform/1-check", "zipf/1-check"];

/// One row of the global scope's target: `global` over `region` (CPU s/M, as `figure` reads it
/// from a record), judged at most [`GLOBAL_OVER_REGION`]; unmeasured when either is missing.
fn global_over_region(
    target: String,
    global: Option<&Record>,
    region: Option<&Record>,
    figure: fn(&Record) -> Option<f64>,
) -> Verdict {
    match (global.and_then(figure), region.and_then(figure)) {
        (Some(g), Some(r)) if g > 0.0 && r > 0.0 => {
            let ratio = g / r;
            let shown = format!("{ratio:.2}x ({g:.2} / {r:.2} s)");
            Verdict::judged(target, shown, ratio, Bound::AtMost(GLOBAL_OVER_REGION))
        }
        _ => Verdict::unmeasured(target, "not measured"),
    }
}

/// The global scope's target on the two regions' systems (1-check closed loops, the gateway in
/// region a): node CPU per million global checks at most 1.5x region checks', judged on both
/// regions' nodes summed (a global check costs region b a merge of its delta, part of its
/// cost), and on region a's node alone beside it: on uniform keys, and on zipf keys when the
/// run had them. None when neither scope ran.
pub(super) fn regions_verdicts(records: &[Record]) -> Vec<Verdict> {
    let mut verdicts = Vec::new();
    for workload in GLOBAL_WORKLOADS {
        let global = find(records, REGIONS_GLOBAL, workload, 0);
        let region = find(records, REGIONS_REGION, workload, 0);
        if global.is_none() && region.is_none() {
            continue;
        }
        let target = |whose: &str| {
            format!(
                "global check node CPU at most {GLOBAL_OVER_REGION}x a region check's (CPU s/M, \
                 closed loop, {workload}, {whose})"
            )
        };
        verdicts.push(global_over_region(
            target("both regions' nodes summed"),
            global,
            region,
            |r| Some(r.cpu_s_per_million),
        ));
        verdicts.push(global_over_region(
            target("region a's node alone"),
            global,
            region,
            |r| r.first_node_cpu_s_per_million,
        ));
    }
    verdicts
}

/// The global scope's targets table; empty when the two regions' systems did not run.
pub fn regions_markdown(records: &[Record]) -> String {
    let mut out = String::new();
    let verdicts = regions_verdicts(records);
    if !verdicts.is_empty() {
        verdict_table(
            &mut out,
            &format!("{REGIONS_GLOBAL} against {REGIONS_REGION}: two regions of one node each"),
            &verdicts,
        );
        out.push('\n');
    }
    out
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::load) fn record(
        system: &str,
        workload: &str,
        rate: u64,
        achieved: f64,
        p99_us: u64,
    ) -> Record {
        Record {
            system: system.to_owned(),
            nodes: 1,
            workload: workload.to_owned(),
            mode: if rate == 0 { "closed" } else { "open" }.to_owned(),
            offered_rate: rate,
            achieved_rate: achieved,
            requests_per_second: achieved,
            p50_us: p99_us / 2,
            p99_us,
            p999_us: p99_us * 2,
            cpu_s_per_million: 0.25,
            first_node_cpu_s_per_million: None,
            client_cpu_s_per_million: 0.5,
            bytes_per_key: 55.0,
            allowed: 1,
            degraded: 0,
            errors: 0,
            saturated: false,
            slowest_window_rate: achieved,
            fastest_window_rate: achieved,
            window_rates: Vec::new(),
        }
    }

    fn line<'a>(table: &'a str, starts: &str) -> &'a str {
        table
            .lines()
            .find(|l| l.starts_with(starts))
            .unwrap_or_else(|| panic!("no line starting {starts:?} in\n{table}"))
    }

    #[test]
    fn throughput_is_judged_on_the_ratio_to_redis_lua() {
        let records = [
            record(SUBJECT, "uniform/1-check", 0, 1_100_000.0, 500),
            record(BASELINE, "uniform/1-check", 0, 100_000.0, 5_000),
            record(SUBJECT, THREE_CHECKS, 0, 1_400_000.0, 500),
            record(BASELINE, THREE_CHECKS, 0, 100_000.0, 5_000),
        ];
        let table = targets_markdown(&records, &[]);
        let one = line(&table, "| closed loop, uniform/1-check");
        assert!(
            one.ends_with("| 11.00x (1100000 / 100000) | yes |"),
            "{one}"
        );
        let three = line(&table, "| closed loop, uniform/3-check");
        assert!(
            three.ends_with("| 14.00x (1400000 / 100000) | **no** |"),
            "{three}"
        );
        assert!(
            table.contains("| bytes per active key: at most 64 | 55 | yes |"),
            "{table}"
        );
        assert!(
            table.contains("| 0.25 s (client and generator: 0.50 s) | yes |"),
            "{table}"
        );
    }

    #[test]
    fn low_load_p99_is_judged_side_by_side_when_that_ran() {
        let w = "uniform/1-check";
        let alone = [
            record(SUBJECT, w, 10_000, 10_000.0, 300),
            record(BASELINE, w, 10_000, 10_000.0, 200),
        ];
        let side = [
            record(SUBJECT, w, 10_000, 10_000.0, 150),
            record(BASELINE, w, 10_000, 10_000.0, 180),
        ];
        let table = targets_markdown(&alone, &side);
        let judged = line(&table, "| p99 at 10000 req/s, uniform/1-check");
        assert!(
            judged.ends_with(
                "| side by side 0.83x (150 / 180 µs); one at a time 1.50x (300 / 200 µs) | yes |"
            ),
            "{judged}"
        );
        // Without the side-by-side step, the steps run one at a time decide.
        let table = targets_markdown(&alone, &[]);
        let judged = line(&table, "| p99 at 10000 req/s, uniform/1-check");
        assert!(
            judged.ends_with("| one at a time 1.50x (300 / 200 µs) | **no** |"),
            "{judged}"
        );
    }

    #[test]
    fn loaded_p99_is_taken_at_the_highest_rate_the_baseline_kept_up_with() {
        let w = "zipf/1-check";
        let mut saturated = record(BASELINE, w, 200_000, 199_000.0, 900_000);
        saturated.saturated = true;
        let records = [
            record(SUBJECT, w, 50_000, 50_000.0, 400),
            record(BASELINE, w, 50_000, 49_990.0, 2_000),
            record(SUBJECT, w, 100_000, 100_000.0, 900),
            // 95% of the offered rate: fell behind.
            record(BASELINE, w, 100_000, 95_000.0, 400_000),
            record(SUBJECT, w, 200_000, 200_000.0, 1_000),
            saturated,
        ];
        let table = targets_markdown(&records, &[]);
        let judged = line(&table, "| p99 at the highest rate redis+lua keeps up with");
        assert!(
            judged.ends_with("| 0.20x (400 / 2000 µs at 50000 req/s) | yes |"),
            "{judged}"
        );
        // The low-load row (50,000 req/s is the lowest here), this one and bytes per key.
        assert!(table.starts_with("### Targets: 3 of 3 met"), "{table}");
    }

    #[test]
    fn the_cluster_is_judged_against_the_single_node() {
        let w = "uniform/1-check";
        let mut cluster = record(CLUSTER, w, 0, 900_000.0, 700).on_nodes(3);
        cluster.cpu_s_per_million = 0.4;
        let records = [record(SUBJECT, w, 0, 1_000_000.0, 500), cluster];
        let table = cluster_markdown(&records);
        assert!(
            table.contains("(floodgate-cluster of 3 nodes against one floodgate node)"),
            "{table}"
        );
        let rate = line(&table, "| closed loop, uniform/1-check");
        assert!(
            rate.ends_with("| 0.90x (900000 / 1000000) | yes |"),
            "{rate}"
        );
        let cpu = line(&table, "| node CPU per million checks");
        assert!(cpu.ends_with("| 1.60x (0.40 / 0.25 s) | **no** |"), "{cpu}");
        assert!(table.starts_with("### Targets: 1 of 2 met"), "{table}");
        // Without a cluster run there is nothing to judge.
        assert_eq!(cluster_markdown(&records[..1]), "");
    }

    #[test]
    fn the_rls_front_is_judged_per_descriptor_and_against_redis_lua() {
        let w = "uniform/1-check";
        let mut one = record(RLS, w, 0, 60_000.0, 900);
        one.cpu_s_per_million = 14.5;
        let mut three = record(RLS, THREE_CHECKS, 0, 90_000.0, 900);
        three.cpu_s_per_million = 4.2;
        let lua = record(BASELINE, w, 0, 120_000.0, 500);
        let records = [one, three, lua];
        let table = rls_markdown(&records);
        assert!(table.contains("(floodgate+rls: the RLS front)"), "{table}");
        let cpu = line(
            &table,
            "| node CPU per descriptor through the RLS front, closed loop, uniform/1-check",
        );
        assert!(cpu.ends_with("| 14.5 µs | **no** |"), "{cpu}");
        let cpu = line(
            &table,
            "| node CPU per descriptor through the RLS front, closed loop, uniform/3-check",
        );
        assert!(cpu.ends_with("| 4.2 µs | yes |"), "{cpu}");
        let rate = line(&table, "| closed loop, uniform/1-check: floodgate+rls");
        assert!(
            rate.ends_with("| 0.50x (60000 / 120000) | **no** |"),
            "{rate}"
        );
        assert!(table.starts_with("### Targets: 1 of 3 met"), "{table}");
        // Without redis+lua the rate is unmeasured; without the front nothing is judged.
        assert!(rls_markdown(&records[..2]).contains("| not run |"));
        assert_eq!(rls_markdown(&records[2..]), "");
    }

    #[test]
    fn a_global_check_is_judged_against_a_region_check_summed_and_alone() {
        let w = "uniform/1-check";
        let mut region = record(REGIONS_REGION, w, 0, 200_000.0, 500).on_nodes(2);
        region.cpu_s_per_million = 2.0;
        region.first_node_cpu_s_per_million = Some(1.9);
        let mut global = record(REGIONS_GLOBAL, w, 0, 100_000.0, 900).on_nodes(2);
        global.cpu_s_per_million = 4.0;
        global.first_node_cpu_s_per_million = Some(2.5);
        let records = [record(SUBJECT, w, 0, 1_000_000.0, 500), region, global];
        let table = regions_markdown(&records);
        assert!(
            table.contains(&format!("({REGIONS_GLOBAL} against {REGIONS_REGION}")),
            "{table}"
        );
        let summed = line(&table, "| global check node CPU at most 1.5x");
        assert!(summed.contains("both regions' nodes summed"), "{summed}");
        assert!(
            summed.ends_with("| 2.00x (4.00 / 2.00 s) | **no** |"),
            "{summed}"
        );
        let alone = line(
            &table,
            "| global check node CPU at most 1.5x a region check's (CPU s/M, closed loop, uniform/1-check, region a's",
        );
        assert!(
            alone.ends_with("| 1.32x (2.50 / 1.90 s) | yes |"),
            "{alone}"
        );
        assert!(table.starts_with("### Targets: 1 of 2 met"), "{table}");
        // The bound itself is met.
        let mut at_bound = records.clone();
        at_bound[2].cpu_s_per_million = 3.0;
        let summed = line(
            &regions_markdown(&at_bound),
            "| global check node CPU at most 1.5x",
        )
        .to_owned();
        assert!(
            summed.ends_with("| 1.50x (3.00 / 2.00 s) | yes |"),
            "{summed}"
        );
    }

    #[test]
    fn zipf_keys_are_judged_beside_uniform_ones_when_the_run_had_them() {
        let mut records = Vec::new();
        for (w, global_cpu) in [("uniform/1-check", 4.0), ("zipf/1-check", 2.8)] {
            let mut region = record(REGIONS_REGION, w, 0, 200_000.0, 500).on_nodes(2);
            region.cpu_s_per_million = 2.0;
            region.first_node_cpu_s_per_million = Some(1.9);
            let mut global = record(REGIONS_GLOBAL, w, 0, 100_000.0, 900).on_nodes(2);
            global.cpu_s_per_million = global_cpu;
            global.first_node_cpu_s_per_million = Some(2.5);
            records.extend([region, global]);
        }
        let verdicts = regions_verdicts(&records);
        assert_eq!(verdicts.len(), 4);
        let table = regions_markdown(&records);
        let zipf = line(
            &table,
            "| global check node CPU at most 1.5x a region check's (CPU s/M, closed loop, zipf/1-check, both",
        );
        assert!(zipf.ends_with("| 1.40x (2.80 / 2.00 s) | yes |"), "{zipf}");
        assert!(table.starts_with("### Targets: 3 of 4 met"), "{table}");
        // A run without zipf keys judges uniform ones alone.
        assert_eq!(regions_verdicts(&records[..2]).len(), 2);
    }

    #[test]
    fn the_global_scope_is_unmeasured_without_both_scopes_and_absent_without_either() {
        let w = "uniform/1-check";
        let mut global = record(REGIONS_GLOBAL, w, 0, 100_000.0, 900).on_nodes(2);
        global.first_node_cpu_s_per_million = Some(0.3);
        let verdicts = regions_verdicts(&[global]);
        assert_eq!(verdicts.len(), 2);
        assert!(verdicts.iter().all(|v| v.met().is_none()));
        // A record without the first node's figure (a system of one node) is not judged alone.
        let region = record(REGIONS_REGION, w, 0, 200_000.0, 500);
        let mut global = record(REGIONS_GLOBAL, w, 0, 100_000.0, 900);
        global.first_node_cpu_s_per_million = Some(0.3);
        let verdicts = regions_verdicts(&[region, global]);
        assert_eq!(verdicts[0].met(), Some(true));
        assert_eq!(verdicts[1].met(), None);
        assert!(regions_verdicts(&[record(SUBJECT, w, 0, 1.0, 1)]).is_empty());
        assert_eq!(regions_markdown(&[]), "");
    }

    #[test]
    fn nothing_is_judged_without_the_baseline() {
        let records = [record(SUBJECT, "uniform/1-check", 0, 1_000_000.0, 500)];
        assert_eq!(targets_markdown(&records, &[]), "");
    }
}
