//! A few seconds of `floodgate-bench load` against a real node it starts, through its QUIC client
//! and through Envoy's rate limit service (`floodgate+rls`), and the Redis baselines when
//! redis-server, and the redis-cell module, are there: the report is well formed — every record
//! has its fields, both modes appear for each floodgate front, the markdown tables are printed,
//! and the load generator's own cost (against a no-op target) is reported apart.
//! It never judges speed.

use std::path::Path;
use std::process::Command;

fn bench() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_floodgate-bench"))
}

/// Runs `floodgate-bench load` with `args` into a fresh folder and fails the test unless it
/// succeeds; returns its stdout, its stderr and the folder.
fn run_load(args: &[&str]) -> (String, String, tempfile::TempDir) {
    let out = tempfile::tempdir().unwrap();
    let output = Command::new(bench())
        .arg("load")
        .args(args)
        .arg("--out")
        .arg(out.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{args:?}: {stdout}\n{stderr}");
    (stdout, stderr, out)
}

fn read_report(out: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap()
}

#[test]
fn a_short_load_run_writes_a_well_formed_report() {
    let node = bench().with_file_name("floodgate-node");
    assert!(
        node.exists(),
        "{} is missing: run through `make test` (cargo test --workspace --bins builds it)",
        node.display()
    );
    let (stdout, stderr, out) = run_load(&[
        "--duration",
        // Longer than one 250 ms window, so each closed loop reports one.
        "300ms",
        "--keys",
        "2000",
        "--rates",
        "500/s,1000/s",
        "--callers",
        "8",
        "--quiet",
        "--spreads",
        "uniform",
        "--three-checks",
        "true",
        // The peers' binaries where none is: the test never builds or runs a peer, and sees
        // each skipped with the reason.
        "--gubernator-bin",
        "/nonexistent/gubernator",
        "--envoy-ratelimit-bin",
        "/nonexistent/service_cmd",
    ]);
    assert!(stdout.contains("### Throughput (closed loop)"), "{stdout}");
    for peer in ["gubernator", "envoy-ratelimit"] {
        assert!(
            stderr.contains(&format!("skipping {peer}: "))
                && stderr.contains(&format!("bash bench/go-peer.sh {peer}")),
            "{stderr}"
        );
    }
    let report = read_report(out.path());
    let all_records = report.as_array().unwrap();
    // The load generator alone (a no-op target): per workload, the closed loop and the first rate.
    let generator = all_records
        .iter()
        .filter(|r| r["system"] == "generator")
        .count();
    assert_eq!(generator, 4, "{all_records:?}");
    assert!(stdout.contains("### The load generator alone"), "{stdout}");
    // The two regions' systems: the uniform 1-check workload only, its closed loop and the
    // first rate, each on two nodes with region a's node's own figure beside the sum.
    const REGIONS: [&str; 2] = [
        "floodgate-regions-region-scope",
        "floodgate-regions-global-scope",
    ];
    let in_regions = |r: &serde_json::Value| REGIONS.iter().any(|s| r["system"] == *s);
    let regions: Vec<&serde_json::Value> = all_records.iter().filter(|r| in_regions(r)).collect();
    assert_eq!(regions.len(), 4, "{all_records:?}");
    for record in &regions {
        assert_eq!(record["workload"], "uniform/1-check", "{record}");
        assert_eq!(record["nodes"].as_u64(), Some(2), "{record}");
        assert!(record["first_node_cpu_s_per_million"].is_f64(), "{record}");
        assert_ne!(record["offered_rate"].as_u64(), Some(1000), "{record}");
    }
    assert!(
        stdout.contains(
            "met in this run (floodgate-regions-global-scope against \
             floodgate-regions-region-scope: two regions of one node each)"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("Server CPU s/M of region a's node alone, closed loop:"),
        "{stdout}"
    );
    let records: Vec<&serde_json::Value> = all_records
        .iter()
        .filter(|r| r["system"] != "generator" && !in_regions(r))
        .collect();
    let baselines_ran: Vec<&str> = ["redis+lua", "redis+cell"]
        .into_iter()
        .filter(|name| !stderr.contains(&format!("skipping the {name} baseline")))
        .collect();
    // Per system (the node, the 3-node cluster, the RLS front, the cluster's RLS fronts, the
    // baselines): 2 workloads x (1 closed + 2 open steps), unless a step saturates.
    let systems = 4 + baselines_ran.len();
    assert!(
        records.len() >= systems * 2 && records.len() <= systems * 6,
        "{records:?}"
    );
    for record in all_records {
        for field in [
            "system",
            "workload",
            "mode",
            "offered_rate",
            "achieved_rate",
            "p50_us",
            "p99_us",
            "p999_us",
            "cpu_s_per_million",
            "client_cpu_s_per_million",
            "bytes_per_key",
        ] {
            assert!(record.get(field).is_some(), "{field} missing in {record}");
        }
        let mode = record["mode"].as_str().unwrap();
        assert_eq!(
            mode == "closed",
            record["offered_rate"].as_u64() == Some(0),
            "{record}"
        );
        assert!(
            record["p50_us"].as_u64() <= record["p99_us"].as_u64(),
            "{record}"
        );
        let slowest = record["slowest_window_rate"].as_f64().unwrap();
        let fastest = record["fastest_window_rate"].as_f64().unwrap();
        let windows: Vec<f64> = record["window_rates"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w.as_f64().unwrap())
            .collect();
        if mode == "closed" {
            assert!(slowest > 0.0 && slowest <= fastest, "{record}");
            // The extremes are the windows' own.
            let extreme = |pick: fn(f64, f64) -> f64| windows.iter().copied().reduce(pick).unwrap();
            assert!((extreme(f64::min) - slowest).abs() <= 0.5, "{record}");
            assert!((extreme(f64::max) - fastest).abs() <= 0.5, "{record}");
        } else {
            assert_eq!((slowest, fastest), (0.0, 0.0), "{record}");
            assert!(windows.is_empty(), "{record}");
        }
        assert_eq!(record["errors"].as_u64(), Some(0), "{record}");
    }
    // The cluster's records say so (through the client or the RLS fronts); every other system
    // here is one server.
    for record in &records {
        let clusters = ["floodgate-cluster", "floodgate-cluster+rls"];
        let nodes = if clusters.iter().any(|c| record["system"] == *c) {
            3
        } else {
            1
        };
        assert_eq!(record["nodes"].as_u64(), Some(nodes), "{record}");
    }
    assert!(
        stdout
            .contains("met in this run (floodgate-cluster of 3 nodes against one floodgate node)"),
        "{stdout}"
    );
    let systems = [
        "floodgate",
        "floodgate-cluster",
        "floodgate+rls",
        "floodgate-cluster+rls",
    ];
    for system in systems {
        for mode in ["closed", "open"] {
            assert!(
                records
                    .iter()
                    .any(|r| r["system"] == system && r["mode"] == mode),
                "no {mode}-loop record of {system}: {records:?}"
            );
        }
    }
    // The RLS front is compared with floodgate's own path (and redis+lua when it ran).
    assert!(
        stdout.contains("### floodgate+rls: Envoy's rate limit service"),
        "{stdout}"
    );
    // The cluster behind its RLS fronts beside one node's front and the cluster's own client.
    assert!(
        stdout.contains("### floodgate-cluster+rls: 3 nodes on this machine behind their RLS"),
        "{stdout}"
    );
    assert!(stdout.contains("ratio to floodgate+rls |"), "{stdout}");
    assert!(stdout.contains("ratio to floodgate |"), "{stdout}");
    for name in &baselines_ran {
        assert!(
            records
                .iter()
                .any(|r| r["system"] == *name && r["mode"] == "closed"),
            "{name} ran but has no closed-loop record: {records:?}"
        );
        assert!(stdout.contains(&format!("ratio to {name}")), "{stdout}");
    }
    // With a baseline, the first rate runs again with the systems taking turns: a record per
    // system and workload, each at the offered rate over its own turns (not that rate shared
    // out among the systems), and a table of their ratios.
    let side = out.path().join("side-by-side.json");
    if baselines_ran.is_empty() {
        assert!(!side.exists());
    } else {
        let side: Vec<serde_json::Value> =
            serde_json::from_str(&std::fs::read_to_string(&side).unwrap()).unwrap();
        // floodgate, the 3-node cluster and each baseline, on both workloads.
        assert_eq!(side.len(), 2 * (2 + baselines_ran.len()), "{side:?}");
        for system in ["floodgate", "floodgate-cluster"] {
            assert!(side.iter().any(|r| r["system"] == system), "{side:?}");
        }
        for record in &side {
            assert_eq!(record["mode"], "side-by-side", "{record}");
            assert_eq!(record["offered_rate"].as_u64(), Some(500), "{record}");
            assert_eq!(record["errors"].as_u64(), Some(0), "{record}");
            let rate = record["requests_per_second"].as_f64().unwrap();
            assert!((250.0..=525.0).contains(&rate), "{record}");
        }
        // The targets are judged against redis+lua when it ran.
        assert_eq!(
            stdout.contains("met in this run (floodgate against redis+lua)"),
            baselines_ran.contains(&"redis+lua"),
            "{stdout}"
        );
        assert!(
            stdout.contains("### Side by side at 500 req/s each"),
            "{stdout}"
        );
    }
    let svg = std::fs::read_to_string(out.path().join("latency.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("</svg>"));
}

/// `--runs 2` makes two whole runs, each with its own report, and judges the targets (here the
/// cluster's against the node) on their medians.
#[test]
fn several_runs_are_judged_on_their_medians() {
    let (stdout, _, out) = run_load(&[
        "--runs",
        "2",
        "--duration",
        "300ms",
        "--keys",
        "2000",
        "--rates",
        "500/s",
        "--callers",
        "8",
        "--quiet",
        "--spreads",
        "uniform",
        "--three-checks",
        "false",
        "--no-redis",
        "--no-rls",
        "--no-peers",
    ]);
    for k in 1..=2 {
        assert!(stdout.contains(&format!("## Run {k} of 2")), "{stdout}");
        let records = read_report(&out.path().join(format!("run-{k}")));
        assert!(
            records
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["system"] == "floodgate-cluster"),
            "{records}"
        );
    }
    let medians = stdout
        .split("### Targets judged on the medians of 2 runs: ")
        .nth(1)
        .unwrap_or_else(|| panic!("no medians table in {stdout}"));
    // Both cluster targets, each with both runs' figures.
    let rows: Vec<&str> = medians
        .lines()
        .filter(|l| l.starts_with("| closed loop") || l.starts_with("| node CPU"))
        .collect();
    assert_eq!(rows.len(), 2, "{medians}");
    for row in rows {
        assert_eq!(
            row.split(" | ").nth(1).unwrap().matches(" / ").count(),
            1,
            "{row}"
        );
    }
}

/// Both gateway shapes drive a node, token leases included: with a client per thread, the
/// leased key's admissions are still held to the limit over all of them.
#[test]
fn both_gateway_shapes_run_and_hold_the_leased_key_to_its_limit() {
    for (shape, threads) in [("thread-per-core", "3"), ("multi-thread", "2")] {
        let (stdout, _, out) = run_load(&[
            "--duration",
            "300ms",
            "--keys",
            "2000",
            "--rates",
            "500/s",
            "--callers",
            "8",
            "--quiet",
            "--spreads",
            "uniform,hot-leased",
            "--three-checks",
            "false",
            "--no-redis",
            "--no-rls",
            "--no-peers",
            "--gateway",
            shape,
            "--client-threads",
            threads,
        ]);
        assert!(stdout.contains("(within the limit)"), "{shape}: {stdout}");
        let report = read_report(out.path());
        for workload in ["uniform/1-check", "hot-key-leased/1-check"] {
            let closed = report
                .as_array()
                .unwrap()
                .iter()
                .find(|r| {
                    r["system"] == "floodgate" && r["workload"] == workload && r["mode"] == "closed"
                })
                .unwrap_or_else(|| panic!("{shape}: no closed loop of {workload}: {report}"));
            assert!(
                closed["requests_per_second"].as_f64().unwrap() > 0.0,
                "{closed}"
            );
            assert_eq!(closed["errors"].as_u64(), Some(0), "{closed}");
        }
    }
}

#[test]
fn only_the_side_by_side_step_without_redis_is_refused_with_a_reason() {
    let out = tempfile::tempdir().unwrap();
    let output = Command::new(bench())
        .args([
            "load",
            "--only-side-by-side",
            "--no-redis",
            "--quiet",
            "--out",
        ])
        .arg(out.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("--only-side-by-side sets floodgate beside Redis"),
        "{stderr}"
    );
}
