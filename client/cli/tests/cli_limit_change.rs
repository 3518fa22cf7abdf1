//! `floodgate check` on one key whose limit changes between runs (`3/s`, `3/min`, `3/d`, `3/s`),
//! for every algorithm: each answer's wait stays within the limit it was checked at. A window
//! index stored under one period used to be misread under the next, answering waits of
//! centuries (`retry_after=13730616403.654s`).
//!
//! No sleeps: the runs go back to back, and every bound asserted holds whenever they run.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::process::{Command, Output};

use common::*;
use floodgate::{Algorithm, Limit, NANOS_PER_SEC, parse_duration_ns};

/// Runs the binary off the runtime's thread, so the in-process node keeps serving meanwhile.
async fn floodgate(args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_floodgate"))
            .args(&args)
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

/// The longest wait `limit` may report, as the CLI prints it (rounded up to the millisecond):
/// one period; for GCRA two capacities (`burst * interval`, the interval rounded up to the
/// nanosecond: an empty bucket and one capacity owed, which a larger limit's debt is read as);
/// for the sliding-window counter two periods, for a reset and for a retry alike (its current
/// window's count weighs until the end of the next one, the bound docs/GUARANTEES.md states; a
/// retry of 1.13 s was printed at `3/s` right after `3/d`).
fn longest_printed(limit: &Limit) -> u64 {
    let most = match limit.algorithm() {
        Algorithm::Gcra => 2 * limit.capacity_ns(),
        Algorithm::SlidingWindow => 2 * limit.period_ns(),
        _ => limit.period_ns(),
    };
    most.div_ceil(1_000_000) * 1_000_000
}

/// A printed field's duration (`250ms`, `1s`, `1.5s`), in nanoseconds.
fn field_ns(line: &str, name: &str) -> Option<u64> {
    let value = line
        .split_whitespace()
        .find_map(|field| field.strip_prefix(name)?.strip_prefix('='))?;
    Some(parse_duration_ns(value).unwrap_or_else(|e| panic!("{line}: {e}")))
}

#[tokio::test]
async fn a_key_checked_at_other_periods_always_waits_within_the_current_one() {
    let certs = certs();
    let node = start_node(&certs, any_port(), false).await;
    let steps = [("3/s", 1), ("3/min", 60), ("3/d", 86_400), ("3/s", 1)];
    let mut denials = 0;
    for algorithm in Algorithm::ALL {
        let key = format!("limit-change:{algorithm}");
        for (limit, period_s) in steps {
            let period_ns = period_s * NANOS_PER_SEC;
            let checked = Limit::new(algorithm, 3, period_ns, 3).unwrap();
            let args = [
                "check",
                "--seeds",
                &node.local_addr().to_string(),
                "--ca",
                &certs.dev.ca.display().to_string(),
                &key,
                "--limit",
                limit,
                "--algorithm",
                algorithm.name(),
                "--count",
                "4",
            ];
            let out = floodgate(args.iter().map(|s| s.to_string()).collect()).await;
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            let context = format!(
                "{algorithm} at {limit}:\n{stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(matches!(out.status.code(), Some(0 | 1)), "{context}");
            let lines: Vec<&str> = stdout.lines().collect();
            assert_eq!(lines.len(), 4, "{context}");
            for line in lines {
                assert!(
                    line.starts_with("allow ") || line.starts_with("deny "),
                    "{context}"
                );
                if line.starts_with("deny ") {
                    denials += 1;
                    let retry = field_ns(line, "retry_after").expect(&context);
                    assert!(retry <= longest_printed(&checked), "{context}");
                    if algorithm == Algorithm::Gcra {
                        // A larger limit's debt is read as one capacity owed at most: repaid,
                        // then one unit refills in one interval (a third of the period here).
                        let most = checked.capacity_ns() + checked.interval_ns();
                        assert!(retry <= most.div_ceil(1_000_000) * 1_000_000, "{context}");
                    }
                }
                let reset = field_ns(line, "reset_after").expect(&context);
                assert!(reset <= longest_printed(&checked), "{context}");
            }
        }
    }
    // Three per period and four checks a run: at least the `3/min` and `3/d` runs deny, for
    // every algorithm, however slowly the runs go.
    assert!(denials >= 2 * Algorithm::ALL.len(), "{denials} denials");
    node.shutdown().await;
}
