//! The run's outputs: the table on stdout and `report.json`.

use std::fmt::Write as _;
use std::path::Path;

use crate::bounds;
use crate::run::ScenarioReport;
use crate::scenario::{Plan, Scenario};

/// The markdown table of a run, one row per scenario.
pub fn table(reports: &[ScenarioReport]) -> String {
    let mut out = String::new();
    out.push_str("| scenario | checks | admitted | allowed | bound | worst key's ratio | availability | p99 decision | verdict |\n");
    out.push_str("|---|---:|---:|---:|---|---:|---:|---:|---|\n");
    for r in reports {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} (+{}) | {:.2} | {:.4} | {:.1} ms | {} |",
            r.scenario,
            r.checks,
            r.admitted,
            r.allowed,
            r.bound_rule,
            r.bound,
            r.worst_ratio,
            r.availability,
            r.p99_latency_ms,
            if r.passed {
                "pass".to_owned()
            } else {
                format!("FAIL ({})", r.violations.len())
            }
        );
    }
    out
}

/// For each upgrade scenario, one line per gateway build: its checks, and those a node decided
/// before the node upgrade (every node old), during it (builds mixed) and after it (every node
/// new).
pub fn upgrade_lines(reports: &[ScenarioReport]) -> Vec<String> {
    let mut lines = Vec::new();
    for r in reports {
        let Some(builds) = r
            .extra
            .get("upgrade")
            .and_then(|u| u.get("by_gateway_build"))
        else {
            continue;
        };
        for build in ["old", "new"] {
            let Some(b) = builds.get(build) else {
                continue;
            };
            let n = |field: &str| {
                b.get(field)
                    .and_then(serde_json::Value::as_u64)
                    .unwrap_or(0)
            };
            lines.push(format!(
                "{}: {build}-build gateways: {} checks, {} admitted, {} not decided by a node; decided by a node before the node upgrade {}, during it {}, after it {}",
                r.scenario,
                n("checks"),
                n("admitted"),
                n("not_decided_by_a_node"),
                n("decided_before_node_upgrade"),
                n("decided_during_node_upgrade"),
                n("decided_after_node_upgrade"),
            ));
        }
    }
    lines
}

/// The scenarios and their bounds, for `list`.
pub fn list(scenarios: &[Scenario]) -> String {
    let mut out = String::new();
    let defaults = floodgate_client::ClientConfig::with_ca_file("ca.pem");
    let _ = writeln!(
        out,
        "every scenario's gateways run the client's defaults: timeout {} ms, breaker open after {} failed calls for {} ms",
        defaults.timeout.as_millis(),
        defaults.breaker.failure_threshold,
        defaults.breaker.cooldown.as_millis()
    );
    for s in scenarios {
        let _ = writeln!(out, "{:<17} {}", s.name, s.about);
        let _ = writeln!(
            out,
            "{:<17} bound: {} ({}); availability >= {}",
            "",
            s.bound.short(),
            s.bound.why,
            s.min_availability,
        );
        if matches!(
            s.plan,
            Plan::RegionPartition | Plan::WanDelay | Plan::RegionRestart | Plan::RegionUpgrade
        ) {
            let _ = writeln!(out, "{:<17} {}", "", bounds::describe());
        }
        if s.needs_old_builds {
            let _ = writeln!(
                out,
                "{:<17} runs only with --old-node-bin and --old-gateway-bin (`make upgrade-test`); left out of `all` without them",
                ""
            );
        }
    }
    out
}

pub fn write_json(reports: &[ScenarioReport], path: &Path) -> anyhow::Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(reports)?)?;
    Ok(())
}
