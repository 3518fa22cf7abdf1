//! floodgate's targets against its peers, judged from one run's records: at least 3x a
//! Gubernator cluster's checks per second at one check per request with a p99 no worse at the
//! lowest offered rate, and the RLS front at least 2x envoyproxy/ratelimit's checks per second.

use super::report::{Record, find};
use super::verdict::{Bound, Verdict, verdict_table};

const WORKLOAD: &str = "uniform/1-check";

/// `subject`'s closed-loop checks/s over `peer`'s, at least `at_least`.
fn throughput(records: &[Record], subject: &str, peer: &str, at_least: f64) -> Verdict {
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

/// floodgate's p99 at the lowest offered rate no worse than Gubernator's: side by side when that
/// step ran (the stalls shared out), one at a time beside it.
fn low_load_p99(records: &[Record], side: &[Record], peer: &str) -> Verdict {
    let rate = records
        .iter()
        .chain(side)
        .filter(|r| r.system == peer && r.workload == WORKLOAD && r.offered_rate > 0)
        .map(|r| r.offered_rate)
        .min();
    let Some(rate) = rate else {
        return Verdict::unmeasured(format!("p99, {WORKLOAD}: at most {peer}'s"), "not run");
    };
    let target = format!("p99 at {rate} req/s, {WORKLOAD}: floodgate at most {peer}'s");
    let pair = |records: &[Record]| {
        Some((
            find(records, "floodgate", WORKLOAD, rate)?.p99_us,
            find(records, peer, WORKLOAD, rate)?.p99_us,
        ))
    };
    let (together, alone) = (pair(side), pair(records));
    let Some((f, p)) = together.or(alone) else {
        return Verdict::unmeasured(target, "not run");
    };
    let figures: Vec<String> = [("side by side", together), ("one at a time", alone)]
        .into_iter()
        .filter_map(|(how, pair)| {
            pair.map(|(f, p)| format!("{how} {:.2}x ({f} / {p} µs)", f as f64 / p.max(1) as f64))
        })
        .collect();
    let ratio = f as f64 / p.max(1) as f64;
    Verdict::judged(target, figures.join("; "), ratio, Bound::AtMost(1.0))
}

/// The targets against the peers that ran.
pub(super) fn verdicts(records: &[Record], side: &[Record]) -> Vec<Verdict> {
    let ran = |s: &str| records.iter().chain(side).any(|r| r.system == s);
    let mut verdicts = Vec::new();
    if ran("gubernator") {
        verdicts.push(throughput(records, "floodgate", "gubernator", 3.0));
        verdicts.push(low_load_p99(records, side, "gubernator"));
    }
    if ran("envoy-ratelimit") {
        verdicts.push(throughput(records, "floodgate+rls", "envoy-ratelimit", 2.0));
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
}
