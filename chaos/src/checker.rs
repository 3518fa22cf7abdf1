//! The invariants of a run: per key, what was admitted in every window of its limit against what
//! the limit allows plus the scenario's bound; availability; errors; fail-closed checks that
//! admitted; panics and errors in the node logs.

use std::collections::HashSet;
use std::path::Path;

use floodgate::region::Scope;
use floodgate_client::FailureMode;

use crate::bounds;
use crate::keys::KeySpec;
use crate::load::{Record, Via};
use crate::scenario::Bound;

/// A stretch of the run where a fault was in force (nanoseconds since the origin).
#[derive(Debug, Clone, serde::Serialize)]
pub struct FaultSpan {
    pub label: String,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// Over-admission after a fault ends still counts as the fault's: merges, refetched tables and
/// reconnecting links settle within this (the longest documented bounded wait is 1 s).
pub const SETTLE_NS: u64 = 2_000_000_000;

/// What the checker needs besides the records.
#[derive(Debug)]
pub struct CheckInput<'a> {
    pub keys: &'a [KeySpec],
    pub bound: &'a Bound,
    pub faults: &'a [FaultSpan],
    pub min_availability: f64,
    pub run_ns: u64,
    /// Regions in the run (`R` of the global bound).
    pub regions: usize,
    /// Sides the scenario's faults split the regions into (1: they split none).
    pub fault_sides: usize,
    /// Unix time (ns) at the run's origin: where the keys' aligned windows fall in the run.
    pub origin_unix_ns: u64,
}

/// One key's worst window.
#[derive(Debug, Clone, serde::Serialize)]
pub struct KeyFinding {
    pub key: String,
    pub allowed_per_window: u64,
    /// Most admissions seen in one window, and where it started.
    pub worst_admitted: u64,
    pub worst_window_start_ns: u64,
    /// What that window was allowed: the limit, the scenario's bound if a fault touched it,
    /// and a full limit per gateway whose fallback bucket admitted in it.
    pub worst_window_bound: u64,
    pub ratio: f64,
    pub admitted: u64,
    pub fallback_admitted: u64,
    /// A `scope: global` key, held to the documented global bound.
    pub global: bool,
    /// The window closest to its bound: admitted, its bound (limit, global and fault bounds,
    /// fallback), and where it started.
    pub tightest_admitted: u64,
    pub tightest_bound: u64,
    pub tightest_window_start_ns: u64,
}

/// The checker's verdict on one run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CheckResult {
    pub checks: u64,
    pub admitted: u64,
    pub allowed: u64,
    pub bound: u64,
    pub availability: f64,
    pub p99_latency_ms: f64,
    pub worst_ratio: f64,
    pub worst_key: String,
    pub by_source: Vec<(Via, u64)>,
    pub keys: Vec<KeyFinding>,
    pub violations: Vec<String>,
}

/// Most violations listed per run (the count is always exact in the table).
const MAX_LISTED: usize = 40;

impl CheckInput<'_> {
    /// The longest fault a window starting at `start_ns` of length `window_ns` touches (with
    /// the settling time `settle_ns` after it), as its length; `None` if it touches none.
    fn fault_touched(&self, start_ns: u64, window_ns: u64, settle_ns: u64) -> Option<u64> {
        self.faults
            .iter()
            .filter(|f| {
                start_ns < f.end_ns.saturating_add(settle_ns) && start_ns + window_ns > f.start_ns
            })
            .map(|f| f.end_ns.saturating_sub(f.start_ns))
            .max()
    }

    /// What a window of `key` may admit beyond its limit (fallback apart): for a global key the
    /// documented normal global bound always, for a leased key the tokens its gateways may
    /// hold (taken before they are used), and in a window touching a fault the partition
    /// bound for a fault that splits regions (else the scenario's); for other keys the
    /// scenario's bound in a window touching a fault. Returns (normal, fault) extras.
    fn extra(&self, key: &KeySpec, start_ns: u64, window_ns: u64) -> (u64, u64) {
        let global = key.scope == Scope::Global;
        let settle = if global {
            SETTLE_NS.max(bounds::REGION_SETTLE_NS)
        } else {
            SETTLE_NS
        };
        let normal = if global {
            key.limits
                .iter()
                .map(|l| bounds::normal_extra(l, self.regions))
                .max()
                .unwrap_or(0)
        } else {
            0
        } + key.lease_extra;
        let fault = match self.fault_touched(start_ns, window_ns, settle) {
            None => 0,
            Some(length) if global && self.fault_sides > 1 => key
                .limits
                .iter()
                .map(|l| bounds::partition_extra(l, self.fault_sides, length))
                .max()
                .unwrap_or(0),
            Some(_) => self.bound.extra_per_window(key),
        };
        (normal, fault)
    }
}

pub fn check(records: &[Record], input: &CheckInput<'_>) -> CheckResult {
    let mut violations = Vec::new();
    let mut findings = Vec::new();
    let (mut allowed_total, mut bound_total) = (0u64, 0u64);
    for (index, key) in input.keys.iter().enumerate() {
        let mine: Vec<&Record> = records
            .iter()
            .filter(|r| r.key as usize == index && r.admitted)
            .collect();
        let finding = check_key(key, &mine, input, &mut violations);
        let (allowed, bound) = run_allowance(key, &mine, input);
        allowed_total += allowed;
        bound_total += bound;
        for r in &mine {
            let closed = key.failure_mode == FailureMode::Closed;
            if r.via == Via::FailClosed || (closed && r.via == Via::Fallback) {
                violations.push(format!(
                    "{}: fail-closed check admitted without a node at {:.3}s",
                    key.name,
                    r.done_ns as f64 / 1e9
                ));
            }
        }
        findings.push(finding);
    }
    let checks = records.len() as u64;
    let admitted = records.iter().filter(|r| r.admitted).count() as u64;
    let decided = records.iter().filter(|r| r.via.by_a_node()).count() as u64;
    let availability = if checks == 0 {
        0.0
    } else {
        decided as f64 / checks as f64
    };
    if checks == 0 {
        violations.push("no check was made".to_owned());
    }
    if availability < input.min_availability {
        violations.push(format!(
            "availability {:.4} below the scenario's {:.4}",
            availability, input.min_availability
        ));
    }
    let errors = records.iter().filter(|r| r.via == Via::Error).count();
    if errors > 0 {
        violations.push(format!("{errors} checks failed with an error"));
    }
    let mut by_source = Vec::new();
    for via in [
        Via::Node,
        Via::Takeover,
        Via::Fallback,
        Via::FailClosed,
        Via::Error,
    ] {
        by_source.push((via, records.iter().filter(|r| r.via == via).count() as u64));
    }
    let (worst_ratio, worst_key) = findings
        .iter()
        .map(|f| (f.ratio, f.key.clone()))
        .fold((0.0, String::new()), |a, b| if b.0 > a.0 { b } else { a });
    let total_violations = violations.len();
    violations.truncate(MAX_LISTED);
    if total_violations > MAX_LISTED {
        violations.push(format!("... {} more", total_violations - MAX_LISTED));
    }
    CheckResult {
        checks,
        admitted,
        allowed: allowed_total,
        bound: bound_total,
        availability,
        p99_latency_ms: p99_ms(records),
        worst_ratio,
        worst_key,
        by_source,
        keys: findings,
        violations,
    }
}

/// A stretch of the run under one of the keys' limits (`rules-reload`: between two edits).
#[derive(Debug, Clone, Copy)]
pub struct Phase {
    pub start_ns: u64,
    pub end_ns: u64,
    /// Which of each key's `limits` is in force.
    pub limit: usize,
}

/// Holds each phase's windows (starting `settle_ns` after the phase begins, ending by its end)
/// to that phase's limit alone, exactly: proves each edit took effect, since a window under
/// the new limit admitting what the old one allowed is a violation. Returns the violations and
/// each phase's worst ratio.
pub fn check_phases(
    records: &[Record],
    keys: &[KeySpec],
    phases: &[Phase],
    settle_ns: u64,
    origin_unix_ns: u64,
) -> (Vec<String>, Vec<f64>) {
    let exact = Bound::exact();
    let mut violations = Vec::new();
    let mut worst = Vec::new();
    for (n, phase) in phases.iter().enumerate() {
        let mut phase_worst = 0f64;
        let from = phase.start_ns.saturating_add(settle_ns);
        for (index, key) in keys.iter().enumerate() {
            let Some(limit) = key.limits.get(phase.limit) else {
                continue;
            };
            let under = KeySpec {
                limits: vec![*limit],
                ..key.clone()
            };
            let admitted: Vec<&Record> = records
                .iter()
                .filter(|r| {
                    r.key as usize == index
                        && r.admitted
                        && r.sent_ns >= from
                        && r.done_ns < phase.end_ns
                })
                .collect();
            let input = CheckInput {
                keys: std::slice::from_ref(&under),
                bound: &exact,
                faults: &[],
                min_availability: 0.0,
                run_ns: phase.end_ns,
                regions: 1,
                fault_sides: 1,
                origin_unix_ns,
            };
            let mut found = Vec::new();
            let finding = check_key(&under, &admitted, &input, &mut found);
            phase_worst = phase_worst.max(finding.ratio);
            violations.extend(found.into_iter().map(|v| format!("phase {n}: {v}")));
        }
        worst.push(phase_worst);
    }
    (violations, worst)
}

/// How far inside one of its aligned windows an admission must be sent and answered to count
/// as certainly decided in it: the nodes and the harness read the same system clock, each from
/// its own start, so their readings of Unix time may differ by a little.
pub const ALIGNED_MARGIN_NS: u64 = 2_000_000;

/// One window a key is judged in: its start (ns since the origin), the admissions certainly
/// decided in it, and the gateways whose fallback bucket admitted in it.
struct Window<'a> {
    start_ns: u64,
    end_ns: u64,
    count: u64,
    fallback_gateways: usize,
    /// The admissions sent from the window's start on, for `routes_in`.
    from: &'a [&'a Record],
}

/// For each admission's send time as a window start, the admissions certainly decided inside
/// that window (sent at or after its start, answered before its end): a lower bound on the
/// real count whatever the latency, so a violation found is real.
fn sliding_windows<'a>(admitted: &'a [&'a Record], window: u64) -> Vec<Window<'a>> {
    let mut windows = Vec::with_capacity(admitted.len());
    for (i, first) in admitted.iter().enumerate() {
        let start = first.sent_ns;
        let end = start + window;
        let mut count = 0u64;
        let mut fallback_gateways = HashSet::new();
        for r in admitted[i..].iter().take_while(|r| r.sent_ns < end) {
            if r.done_ns < end {
                count += 1;
                if r.via == Via::Fallback {
                    fallback_gateways.insert(r.gateway);
                }
            }
        }
        windows.push(Window {
            start_ns: start,
            end_ns: end,
            count,
            fallback_gateways: fallback_gateways.len(),
            from: &admitted[i..],
        });
    }
    windows
}

/// The key's own aligned windows `[k x period, (k + 1) x period)` of Unix time (the node's
/// clock, `origin_unix_ns` at the run's origin) holding an admission, each with the admissions
/// certainly decided in it (sent and answered inside it, `ALIGNED_MARGIN_NS` from its edges):
/// again a lower bound, so a violation found is real.
fn aligned_windows<'a>(
    admitted: &'a [&'a Record],
    period: u64,
    origin_unix_ns: u64,
) -> Vec<Window<'a>> {
    let period = period.max(1);
    let mut windows: Vec<Window<'a>> = Vec::new();
    let mut gateways = HashSet::new();
    for (i, r) in admitted.iter().enumerate() {
        let sent = origin_unix_ns.saturating_add(r.sent_ns);
        let done = origin_unix_ns.saturating_add(r.done_ns);
        let index = sent / period;
        let (start, end) = (index * period, (index + 1) * period);
        let run_start = start.saturating_sub(origin_unix_ns);
        if windows.last().is_none_or(|w| w.start_ns != run_start) {
            gateways.clear();
            windows.push(Window {
                start_ns: run_start,
                end_ns: end - origin_unix_ns,
                count: 0,
                fallback_gateways: 0,
                from: &admitted[i..],
            });
        }
        let certain = sent >= start + ALIGNED_MARGIN_NS && done + ALIGNED_MARGIN_NS < end;
        if let Some(window) = windows.last_mut()
            && certain
        {
            window.count += 1;
            if r.via == Via::Fallback {
                gateways.insert(r.gateway);
                window.fallback_gateways = gateways.len();
            }
        }
    }
    windows
}

/// Judges every window of `key` (its own aligned windows for a fixed or sliding window key,
/// else every window of its period starting at an admission) against the limit, the scenario's
/// and the global bounds and a limit per gateway whose fallback bucket admitted in it.
fn check_key(
    key: &KeySpec,
    admitted: &[&Record],
    input: &CheckInput<'_>,
    violations: &mut Vec<String>,
) -> KeyFinding {
    let window = key.window_ns();
    let allowed = key.allowed_per_window();
    let windows = match key.aligned_period_ns() {
        Some(period) => aligned_windows(admitted, period, input.origin_unix_ns),
        None => sliding_windows(admitted, window),
    };
    let mut worst = (0u64, 0u64, allowed, 0.0f64);
    let mut reported = false;
    // (bound - admitted, admitted, bound, start): the smallest margin seen.
    let mut tightest: Option<(i64, u64, u64, u64)> = None;
    for w in &windows {
        let (count, start) = (w.count, w.start_ns);
        let (normal, extra) = input.extra(key, start, w.end_ns - start);
        let bound = allowed + normal + extra + w.fallback_gateways as u64 * allowed;
        let ratio = count as f64 / allowed.max(1) as f64;
        let margin = bound as i64 - count as i64;
        if tightest.is_none_or(|t| margin < t.0) {
            tightest = Some((margin, count, bound, start));
        }
        if ratio > worst.3 {
            worst = (count, start, bound, ratio);
        }
        if count > bound && !reported {
            reported = true;
            violations.push(format!(
                "{}: {} admitted in the {}window from {:.3}s, bound {} (limit allows {}, global bound {}, fault bound {}, {} fallback gateways; admitted by route: {})",
                key.describe(),
                count,
                if key.aligned_period_ns().is_some() {
                    "aligned "
                } else {
                    ""
                },
                start as f64 / 1e9,
                bound,
                allowed,
                normal,
                extra,
                w.fallback_gateways,
                routes_in(w.from, w.end_ns)
            ));
        }
    }
    KeyFinding {
        key: key.name.clone(),
        allowed_per_window: allowed,
        worst_admitted: worst.0,
        worst_window_start_ns: worst.1,
        worst_window_bound: worst.2,
        ratio: worst.3,
        admitted: admitted.len() as u64,
        fallback_admitted: admitted.iter().filter(|r| r.via == Via::Fallback).count() as u64,
        global: key.scope == Scope::Global,
        tightest_admitted: tightest.map_or(0, |t| t.1),
        tightest_bound: tightest.map_or(allowed, |t| t.2),
        tightest_window_start_ns: tightest.map_or(0, |t| t.3),
    }
}

/// Who the admissions of a window were routed to, e.g. `node 1 (owner): 30, node 2 (takeover): 4`.
fn routes_in(admitted: &[&Record], end: u64) -> String {
    let mut counts: Vec<((u16, Via), u64)> = Vec::new();
    for r in admitted.iter().take_while(|r| r.sent_ns < end) {
        if r.done_ns >= end {
            continue;
        }
        match counts.iter_mut().find(|(k, _)| *k == (r.routed_to, r.via)) {
            Some((_, n)) => *n += 1,
            None => counts.push(((r.routed_to, r.via), 1)),
        }
    }
    counts.sort();
    counts
        .iter()
        .map(|((node, via), n)| format!("node {node} {via:?}: {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What the key may admit over the whole run, tiled into windows: the limit in each, plus the
/// bound in windows a fault touched and a limit per gateway that fell back in it.
fn run_allowance(key: &KeySpec, admitted: &[&Record], input: &CheckInput<'_>) -> (u64, u64) {
    let window = key.window_ns();
    let allowed = key.allowed_per_window();
    let tiles = input.run_ns.div_ceil(window).max(1);
    let mut bound = 0u64;
    for tile in 0..tiles {
        let start = tile * window;
        let (normal, extra) = input.extra(key, start, window);
        bound += normal + extra;
        let fallback: HashSet<u16> = admitted
            .iter()
            .filter(|r| r.via == Via::Fallback && r.done_ns >= start && r.done_ns < start + window)
            .map(|r| r.gateway)
            .collect();
        bound += fallback.len() as u64 * allowed;
    }
    (allowed * tiles, bound)
}

fn p99_ms(records: &[Record]) -> f64 {
    let mut latencies: Vec<u64> = records
        .iter()
        .map(|r| r.done_ns.saturating_sub(r.sent_ns))
        .collect();
    if latencies.is_empty() {
        return 0.0;
    }
    latencies.sort_unstable();
    let at = (latencies.len() * 99).div_ceil(100).saturating_sub(1);
    latencies[at] as f64 / 1e6
}

/// Most checks per check outside every restart window that may miss the gateway's deadline:
/// with no fault at all, a two-core host running three nodes, six gateways and this harness
/// misses the client's default 5 ms deadline about once in 1,000 to 10,000 checks (a thread
/// not scheduled in time). A version fault that drops one kind of frame misses it on every
/// check of that kind, far above this.
pub const DEADLINE_MISSES_ALLOWED: f64 = 0.002;

/// Checks no node decided (fail-closed, fallback, an error or no answer) outside every restart
/// window: one line saying how many and the first few, or none. A check counts as inside when
/// any of its time (sent to answered) meets a window. Checks that failed only by missing the
/// gateway's `deadline` (the client said so, or an unexplained failure took at least that
/// long) are allowed up to [`DEADLINE_MISSES_ALLOWED`] of all checks; any other failure is not.
pub fn failed_outside(
    records: &[Record],
    windows: &[FaultSpan],
    deadline: std::time::Duration,
) -> Option<String> {
    let outside: Vec<&Record> = records
        .iter()
        .filter(|r| !r.via.by_a_node())
        .filter(|r| {
            !windows
                .iter()
                .any(|w| r.sent_ns <= w.end_ns && r.done_ns >= w.start_ns)
        })
        .collect();
    let missed_deadline = |r: &Record| {
        matches!(r.via, Via::FailClosed | Via::Fallback)
            && match r.reason {
                Some(reason) => reason == floodgate_client::DegradedReason::Timeout,
                None => r.done_ns.saturating_sub(r.sent_ns) >= deadline.as_nanos() as u64,
            }
    };
    let (late, other): (Vec<&Record>, Vec<&Record>) =
        outside.iter().partition(|r| missed_deadline(r));
    let allowed = (records.len() as f64 * DEADLINE_MISSES_ALLOWED).floor() as usize;
    if other.is_empty() && late.len() <= allowed {
        return None;
    }
    let first: Vec<String> = outside
        .iter()
        .take(5)
        .map(|r| {
            format!(
                "gateway {} {:?} at {:.3}s after {:.1} ms",
                r.gateway,
                r.via,
                r.sent_ns as f64 / 1e9,
                r.done_ns.saturating_sub(r.sent_ns) as f64 / 1e6
            )
        })
        .collect();
    Some(format!(
        "{} checks not decided by a node outside every restart window, {} of them past the \
         {} ms deadline (allowed: {allowed} such of {} checks; first: {})",
        outside.len(),
        late.len(),
        deadline.as_millis(),
        records.len(),
        first.join(", ")
    ))
}

/// Lines in the node logs that show a panic or an error; `allowed` patterns (errors a
/// scenario provokes on purpose) are left out.
pub fn scan_logs(dir: &Path, allowed: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    let mut paths: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    paths.sort();
    for path in paths {
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        for line in text.lines() {
            let panic = line.contains("panicked");
            let error = line.contains(" ERROR ") || line.starts_with("ERROR");
            if (panic || error) && !allowed.iter().any(|a| line.contains(a)) {
                found.push(format!("{name}: {}", line.trim()));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use floodgate::Limit;

    const S: u64 = 1_000_000_000;

    fn key() -> KeySpec {
        KeySpec {
            name: "k".into(),
            limits: vec![Limit::gcra(10, S, 10).unwrap()],
            failure_mode: FailureMode::Open,
            offered_per_second: 30.0,
            region: None,
            scope: Scope::Region,
            lease_extra: 0,
            pulse: None,
        }
    }

    fn admitted_at(ms: &[u64], via: Via) -> Vec<Record> {
        ms.iter()
            .map(|&t| Record {
                key: 0,
                gateway: 0,
                sent_ns: t * 1_000_000,
                done_ns: t * 1_000_000 + 500_000,
                admitted: true,
                via,
                routed_to: 0,
                reason: None,
            })
            .collect()
    }

    fn run(records: &[Record], bound: Bound, faults: &[FaultSpan]) -> CheckResult {
        let keys = [key()];
        check(
            records,
            &CheckInput {
                keys: &keys,
                bound: &bound,
                faults,
                min_availability: 0.0,
                run_ns: 3 * S,
                regions: 1,
                fault_sides: 1,
                origin_unix_ns: 0,
            },
        )
    }

    #[test]
    fn twenty_in_one_second_is_the_limit_and_twenty_one_is_a_violation() {
        // GCRA 10/s burst 10 allows 20 in any second.
        let at: Vec<u64> = (0..20).map(|i| i * 40).collect();
        let result = run(&admitted_at(&at, Via::Node), Bound::exact(), &[]);
        assert!(result.violations.is_empty(), "{:?}", result.violations);
        assert_eq!(result.keys[0].worst_admitted, 20);
        let at: Vec<u64> = (0..21).map(|i| i * 40).collect();
        let result = run(&admitted_at(&at, Via::Node), Bound::exact(), &[]);
        assert_eq!(result.violations.len(), 1, "{:?}", result.violations);
    }

    #[test]
    fn a_fault_window_gets_the_scenario_bound_and_fallback_gateways_a_limit_each() {
        let at: Vec<u64> = (0..30).map(|i| i * 30).collect();
        let records = admitted_at(&at, Via::Node);
        let fault = FaultSpan {
            label: "kill".into(),
            start_ns: 0,
            end_ns: S,
        };
        let crash = Bound::crash();
        assert!(!run(&records, Bound::exact(), &[]).violations.is_empty());
        let result = run(&records, crash.clone(), &[fault]);
        // One burst (10) plus 100 ms of rate (1) on top of 20.
        assert!(result.violations.is_empty(), "{:?}", result.violations);
        let mut fallback = admitted_at(&at, Via::Fallback);
        fallback.truncate(20);
        let mut both = admitted_at(&at[..20], Via::Node);
        both.extend(fallback);
        both.sort_by_key(|r| r.sent_ns);
        assert!(run(&both, Bound::exact(), &[]).violations.is_empty());
    }

    #[test]
    fn an_answer_after_the_window_end_is_not_counted_in_it() {
        let mut records = admitted_at(&(0..20).map(|i| i * 40).collect::<Vec<_>>(), Via::Node);
        records.push(Record {
            key: 0,
            gateway: 0,
            sent_ns: 900_000_000,
            done_ns: 1_200_000_000,
            admitted: true,
            via: Via::Node,
            routed_to: 0,
            reason: None,
        });
        records.sort_by_key(|r| r.sent_ns);
        assert!(run(&records, Bound::exact(), &[]).violations.is_empty());
    }

    #[test]
    fn a_phase_is_held_to_its_own_limit_after_it_settles() {
        let mut key = key();
        key.limits.push(Limit::gcra(5, S, 5).unwrap());
        // 20 admissions a second throughout: fine under 10/s burst 10, four times 5/s burst 5.
        let at: Vec<u64> = (0..60).map(|i| i * 50).collect();
        let records = admitted_at(&at, Via::Node);
        let phases = [
            Phase {
                start_ns: 0,
                end_ns: S + S / 2,
                limit: 0,
            },
            Phase {
                start_ns: S + S / 2,
                end_ns: 3 * S,
                limit: 1,
            },
        ];
        let (violations, worst) = check_phases(&records, &[key], &phases, S / 10, 0);
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(violations[0].starts_with("phase 1:"), "{violations:?}");
        assert!(worst[0] <= 1.0 && worst[1] > 1.0, "{worst:?}");
    }

    #[test]
    fn a_global_key_gets_the_global_bound_and_the_partition_bound_in_a_region_fault() {
        let mut global = key();
        global.scope = Scope::Global;
        // GCRA 10/s burst 10 allows 20 a second; two regions add (2-1) x max(10/2, 1) = 5.
        let judge = |n: u64, faults: &[FaultSpan], sides: usize| {
            let at: Vec<u64> = (0..n).map(|i| i * 900 / n).collect();
            check(
                &admitted_at(&at, Via::Node),
                &CheckInput {
                    keys: std::slice::from_ref(&global),
                    bound: &Bound::exact(),
                    faults,
                    min_availability: 0.0,
                    run_ns: 3 * S,
                    regions: 2,
                    fault_sides: sides,
                    origin_unix_ns: 0,
                },
            )
        };
        assert!(judge(25, &[], 1).violations.is_empty());
        assert_eq!(judge(26, &[], 1).violations.len(), 1);
        let cut = [FaultSpan {
            label: "region 0 partitioned".into(),
            start_ns: 0,
            end_ns: S,
        }];
        // A 1 s cut into two sides adds a burst and (1 + 2.5) s of rate: 10 + 35 = 45.
        let result = judge(70, &cut, 2);
        assert!(result.violations.is_empty(), "{:?}", result.violations);
        assert_eq!(result.keys[0].tightest_bound, 20 + 5 + 45);
        assert_eq!(judge(71, &cut, 2).violations.len(), 1);
        // A fault that splits no region gives a global key the scenario's bound only.
        assert_eq!(judge(26, &cut, 1).violations.len(), 1);
    }

    fn fixed_key(algorithm: floodgate::Algorithm) -> KeySpec {
        KeySpec {
            limits: vec![Limit::new(algorithm, 25, S, 25).unwrap()],
            ..key()
        }
    }

    /// Judges `key` on admissions at `ms` (answered 0.5 ms later) with the origin at Unix time
    /// `origin_ns`.
    fn judge_at(key: &KeySpec, ms: &[u64], origin_ns: u64, bound: Bound) -> CheckResult {
        check(
            &admitted_at(ms, Via::Node),
            &CheckInput {
                keys: std::slice::from_ref(key),
                bound: &bound,
                faults: &[],
                min_availability: 0.0,
                run_ns: 4 * S,
                regions: 1,
                fault_sides: 1,
                origin_unix_ns: origin_ns,
            },
        )
    }

    #[test]
    fn a_window_key_is_judged_on_its_own_aligned_windows() {
        for algorithm in [
            floodgate::Algorithm::FixedWindow,
            floodgate::Algorithm::SlidingWindow,
        ] {
            let key = fixed_key(algorithm);
            // The origin 0.4 s into an aligned window: windows end at 0.6 s, 1.6 s, ...
            let origin = 10 * S + 400_000_000;
            // 25 in the last 0.3 s of one window and 25 in the first 0.3 s of the next: 50 in
            // a second, each aligned window at its limit.
            let mut at: Vec<u64> = (0..25).map(|i| 300 + i * 10).collect();
            at.extend((0..25).map(|i| 610 + i * 10));
            let result = judge_at(&key, &at, origin, Bound::exact());
            assert!(result.violations.is_empty(), "{:?}", result.violations);
            assert_eq!(result.keys[0].worst_admitted, 25);
            // One more in the first aligned window: 26 of 25. Judged over every window of one
            // second (2 x 25 allowed), this was not caught.
            at.push(590);
            at.sort_unstable();
            let result = judge_at(&key, &at, origin, Bound::exact());
            assert_eq!(result.violations.len(), 1, "{:?}", result.violations);
            assert!(
                result.violations[0].contains("26 admitted in the aligned window from 0.000s"),
                "{:?}",
                result.violations
            );
            // An admission answered across the window's end (or within the margin of it)
            // belongs to no window for certain: not counted.
            let mut late = admitted_at(&at, Via::Node);
            late.iter_mut()
                .filter(|r| r.sent_ns == 590_000_000)
                .for_each(|r| r.done_ns = 601_000_000);
            let input = CheckInput {
                keys: std::slice::from_ref(&key),
                bound: &Bound::exact(),
                faults: &[],
                min_availability: 0.0,
                run_ns: 4 * S,
                regions: 1,
                fault_sides: 1,
                origin_unix_ns: origin,
            };
            assert!(check(&late, &input).violations.is_empty());
        }
    }

    #[test]
    fn a_region_key_in_a_region_partition_is_held_to_its_limit() {
        // 21 in one second of a GCRA 10/s burst 10 key, inside the cut: one over.
        let at: Vec<u64> = (0..21).map(|i| i * 40).collect();
        let records = admitted_at(&at, Via::Node);
        let cut = [FaultSpan {
            label: "region 0 partitioned".into(),
            start_ns: 0,
            end_ns: S,
        }];
        let bound = crate::scenario::find("region-partition").unwrap().bound;
        let result = run(&records, bound, &cut);
        assert_eq!(result.violations.len(), 1, "{:?}", result.violations);
        // The slack region keys had before: a whole limit more.
        let loose = Bound::partition("shared ring");
        assert!(run(&records, loose, &cut).violations.is_empty());
    }

    #[test]
    fn a_fail_closed_admission_is_a_violation() {
        let records = admitted_at(&[10], Via::FailClosed);
        let result = run(&records, Bound::exact(), &[]);
        assert!(
            result.violations.iter().any(|v| v.contains("fail-closed")),
            "{:?}",
            result.violations
        );
    }

    #[test]
    fn a_failed_check_is_a_violation_only_outside_the_restart_windows() {
        let deadline = std::time::Duration::from_millis(5);
        let at = |ms: u64, via: Via| Record {
            key: 0,
            gateway: 3,
            sent_ns: ms * 1_000_000,
            done_ns: ms * 1_000_000 + 1_000_000,
            admitted: false,
            via,
            routed_to: 0,
            reason: None,
        };
        let windows = [FaultSpan {
            label: "node 0 upgraded".into(),
            start_ns: S,
            end_ns: 2 * S,
        }];
        // Inside the window, or answered after it began, or sent just before it ended.
        let inside = [
            at(1_500, Via::FailClosed),
            at(999, Via::Error),
            at(2_000, Via::Fallback),
        ];
        assert_eq!(failed_outside(&inside, &windows, deadline), None);
        // Decided by a node anywhere: never a failure.
        let decided = [at(100, Via::Node), at(2_500, Via::Takeover)];
        assert_eq!(failed_outside(&decided, &windows, deadline), None);
        let outside = [at(100, Via::FailClosed), at(2_100, Via::Error)];
        let found = failed_outside(&outside, &windows, deadline).unwrap();
        assert!(
            found.starts_with("2 checks not decided by a node"),
            "{found}"
        );
        assert!(
            found.contains("gateway 3 FailClosed at 0.100s after 1.0 ms"),
            "{found}"
        );
        assert!(failed_outside(&outside, &[], deadline).is_some());
    }

    #[test]
    fn a_few_missed_deadlines_outside_the_windows_are_allowed_and_no_more() {
        let deadline = std::time::Duration::from_millis(5);
        let check = |i: u64, via: Via, took_ms: u64, reason| Record {
            key: 0,
            gateway: 1,
            sent_ns: i * 1_000_000,
            done_ns: i * 1_000_000 + took_ms * 1_000_000,
            admitted: false,
            via,
            routed_to: 0,
            reason,
        };
        let timeout = Some(floodgate_client::DegradedReason::Timeout);
        // 1,000 checks allow two deadline misses.
        let mut records: Vec<Record> = (0..998).map(|i| check(i, Via::Node, 1, None)).collect();
        records.push(check(998, Via::FailClosed, 6, timeout));
        // An HTTP gateway's 503 carries no reason: late enough, it is a missed deadline.
        records.push(check(999, Via::FailClosed, 7, None));
        assert_eq!(failed_outside(&records, &[], deadline), None);
        // A third is one too many.
        records[0] = check(0, Via::FailClosed, 6, timeout);
        let found = failed_outside(&records, &[], deadline).unwrap();
        assert!(
            found.contains("3 of them past the 5 ms deadline"),
            "{found}"
        );
        // A failure for any other reason, or a quick unexplained one, is never allowed.
        records[0] = check(0, Via::Node, 1, None);
        records[1] = check(
            1,
            Via::FailClosed,
            0,
            Some(floodgate_client::DegradedReason::Unreachable),
        );
        assert!(failed_outside(&records, &[], deadline).is_some());
        records[1] = check(1, Via::FailClosed, 1, None);
        assert!(failed_outside(&records, &[], deadline).is_some());
        records[1] = check(1, Via::Node, 1, None);
        assert_eq!(failed_outside(&records, &[], deadline), None);
    }

    #[test]
    fn log_scan_finds_panics_and_errors_but_not_allowed_ones() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("node-0.log"),
            "2026 INFO fine\nthread 'main' panicked at x\n2026 ERROR floodgate_node: expected\n",
        )
        .unwrap();
        assert_eq!(scan_logs(dir.path(), &[]).len(), 2);
        assert_eq!(scan_logs(dir.path(), &["expected"]).len(), 1);
    }
}
