//! floodgate's targets against its peers, judged from one run's records: one node and a cluster
//! of three each at least 3x a Gubernator cluster's checks per second at one check per request,
//! with a p99 no worse at every rate both were offered, and the RLS front at least 2x
//! envoyproxy/ratelimit's checks per second.

use super::report::{Record, find};
use super::target::RLS;
use super::verdict::{Bound, Verdict, verdict_table};

const WORKLOAD: &str = "uniform/1-check";

/// `subject`'s closed-loop checks/s over `peer`'s, at least `at_least`.
pub(super) fn throughput(records: &[Record], subject: &str, peer: &str, at_least: f64) -> Verdict {
    let target =
        format!("closed loop, {WORKLOAD}: {subject} at least {at_least:.0}x {peer}'s checks/s");
    match (
        find(records, subject, WORKLOAD, 0),
        find(records, peer, WORKLOAD, 0),
    ) {
        (Some(f), Some(p)) if p.achieved_rate > 0.0 => {
            let ratio = f.achieved_rate / p.achieved_rate;
            let figure = format!(
                "{ratio:.2}x ({:.0} / {:.0})",
                f.achieved_rate, p.achieved_rate
            );
            Verdict::judged(target, figure, ratio, Bound::AtLeast(at_least))
        }
        _ => Verdict::unmeasured(target, "not run"),
    }
}

/// The floodgate systems judged against Gubernator: one node, and a cluster of as many nodes as
/// Gubernator's (a like-for-like count of servers).
const AGAINST_GUBERNATOR: [&str; 2] = ["floodgate", "floodgate-cluster"];

/// Whether `record`'s system completed the rate it was offered (not saturated, 99% of it).
fn sustained(record: &Record) -> bool {
    !record.saturated && record.requests_per_second >= 0.99 * record.offered_rate as f64
}

/// `subject`'s p99 at `rate` no worse than `peer`'s: side by side when that step ran (the stalls
/// shared out), one at a time beside it. Where the peer did not complete the rate, its p99 is its
/// queue, and the figure says so.
fn p99_at(records: &[Record], side: &[Record], subject: &str, peer: &str, rate: u64) -> Verdict {
    let target = format!("p99 at {rate} req/s, {WORKLOAD}: {subject} at most {peer}'s");
    let pair = |records: &[Record]| {
        Some((
            find(records, subject, WORKLOAD, rate)?.p99_us,
            find(records, peer, WORKLOAD, rate)?.p99_us,
        ))
    };
    let (together, alone) = (pair(side), pair(records));
    let Some((f, p)) = together.or(alone) else {
        return Verdict::unmeasured(target, "not run");
    };
    let mut figures: Vec<String> = [("side by side", together), ("one at a time", alone)]
        .into_iter()
        .filter_map(|(how, pair)| {
            pair.map(|(f, p)| format!("{how} {:.2}x ({f} / {p} µs)", f as f64 / p.max(1) as f64))
        })
        .collect();
    if let Some(peer_run) = find(records, peer, WORKLOAD, rate).filter(|r| !sustained(r)) {
        figures.push(format!(
            "{peer} did not sustain it ({:.0} req/s)",
            peer_run.requests_per_second
        ));
    }
    let ratio = f as f64 / p.max(1) as f64;
    Verdict::judged(target, figures.join("; "), ratio, Bound::AtMost(1.0))
}

/// Every open-loop rate `peer` was offered on the workload, alone or side by side, ascending.
fn offered_rates(records: &[Record], side: &[Record], peer: &str) -> Vec<u64> {
    let mut rates: Vec<u64> = records
        .iter()
        .chain(side)
        .filter(|r| r.system == peer && r.workload == WORKLOAD && r.offered_rate > 0)
        .map(|r| r.offered_rate)
        .collect();
    rates.sort_unstable();
    rates.dedup();
    rates
}

/// The targets against the peers that ran: each floodgate system that ran against Gubernator's
/// checks/s and its p99 at every rate offered to both, and the RLS front against
/// envoyproxy/ratelimit.
pub(super) fn verdicts(records: &[Record], side: &[Record]) -> Vec<Verdict> {
    let ran = |s: &str| records.iter().chain(side).any(|r| r.system == s);
    let mut verdicts = Vec::new();
    if ran("gubernator") {
        for subject in AGAINST_GUBERNATOR.into_iter().filter(|s| ran(s)) {
            verdicts.push(throughput(records, subject, "gubernator", 3.0));
            for rate in offered_rates(records, side, "gubernator") {
                verdicts.push(p99_at(records, side, subject, "gubernator", rate));
            }
        }
    }
    if ran("envoy-ratelimit") {
        verdicts.push(throughput(records, RLS, "envoy-ratelimit", 2.0));
    }
    verdicts
}

/// The peers' targets table; empty when no peer ran.
pub fn markdown(records: &[Record], side: &[Record]) -> String {
    let verdicts = verdicts(records, side);
    let mut out = String::new();
    if !verdicts.is_empty() {
        verdict_table(&mut out, "against the peers", &verdicts);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(system: &str, rate: u64, achieved: f64, p99_us: u64) -> Record {
        super::super::targets::tests::record(system, WORKLOAD, rate, achieved, p99_us)
    }

    #[test]
    fn each_peer_is_judged_on_its_own_ratio() {
        let records = [
            record("floodgate", 0, 900_000.0, 500),
            record("gubernator", 0, 100_000.0, 5_000),
            record("floodgate+rls", 0, 50_000.0, 500),
            record("envoy-ratelimit", 0, 30_000.0, 500),
            record("floodgate", 10_000, 10_000.0, 400),
            record("gubernator", 10_000, 10_000.0, 900),
        ];
        let table = markdown(&records, &[]);
        assert!(table.contains("2 of 3 met"), "{table}");
        assert!(table.contains("9.00x (900000 / 100000) | yes"), "{table}");
        assert!(
            table.contains("one at a time 0.44x (400 / 900 µs) | yes"),
            "{table}"
        );
        assert!(table.contains("1.67x (50000 / 30000) | **no**"), "{table}");
        assert!(markdown(&records[..1], &[]).is_empty());
    }

    #[test]
    fn the_cluster_is_judged_too_at_every_rate_and_a_saturated_peer_is_named() {
        let mut saturated = record("gubernator", 10_000, 4_000.0, 3_000_000);
        saturated.saturated = true;
        let records = [
            record("floodgate", 0, 900_000.0, 500),
            record("floodgate-cluster", 0, 600_000.0, 500),
            record("gubernator", 0, 4_000.0, 5_000),
            record("floodgate", 1_000, 1_000.0, 900),
            record("floodgate-cluster", 1_000, 1_000.0, 800),
            record("gubernator", 1_000, 1_000.0, 600),
            record("floodgate-cluster", 10_000, 10_000.0, 700),
            saturated,
        ];
        let side = [
            record("floodgate-cluster", 1_000, 1_000.0, 300),
            record("gubernator", 1_000, 1_000.0, 600),
        ];
        let table = markdown(&records, &side);
        assert!(
            table.contains("| closed loop, uniform/1-check: floodgate-cluster at least 3x gubernator's checks/s | 150.00x (600000 / 4000) | yes |"),
            "{table}"
        );
        assert!(
            table.contains("| p99 at 1000 req/s, uniform/1-check: floodgate-cluster at most gubernator's | side by side 0.50x (300 / 600 µs); one at a time 1.33x (800 / 600 µs) | yes |"),
            "{table}"
        );
        assert!(
            table.contains("| p99 at 1000 req/s, uniform/1-check: floodgate at most gubernator's | one at a time 1.50x (900 / 600 µs) | **no** |"),
            "{table}"
        );
        assert!(
            table.contains("one at a time 0.00x (700 / 3000000 µs); gubernator did not sustain it (4000 req/s) | yes"),
            "{table}"
        );
        // floodgate alone was not run at 10,000 req/s.
        assert!(
            table.contains("| p99 at 10000 req/s, uniform/1-check: floodgate at most gubernator's | not run | - |"),
            "{table}"
        );
        assert!(table.contains("4 of 5 met"), "{table}");
    }
}
