//! The benchmark's outputs: one record per (system, workload, mode, offered rate), a markdown
//! table with ratios on stdout, `report.json`, and `latency.svg` (p99 against offered load).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;
use serde::Serialize;

use super::driver::RunResult;
use super::target::{CLUSTER, CLUSTER_RLS, GENERATOR, REGIONS_GLOBAL, REGIONS_REGION, RLS};

#[derive(Debug, Clone, Serialize)]
pub struct Record {
    pub system: String,
    /// The server processes that decided (a cluster's nodes; 1 for a single server).
    pub nodes: usize,
    pub workload: String,
    /// `closed` (as fast as possible) or `open` (fixed arrival rate).
    pub mode: String,
    /// Requests per second offered (open loop); 0 for closed loop.
    pub offered_rate: u64,
    /// Checks per second completed.
    pub achieved_rate: f64,
    pub requests_per_second: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    /// Server CPU seconds per million checks during this run (every node of a system of
    /// several, summed).
    pub cpu_s_per_million: f64,
    /// The first node's CPU seconds per million checks alone, for a system of several nodes:
    /// the seed node of `floodgate-cluster`, region `a`'s node (the one the gateway talks to)
    /// of the two regions' systems.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_node_cpu_s_per_million: Option<f64>,
    /// The bench process's CPU seconds per million checks during this run: the client under
    /// test and the load generator (whose own cost is the `generator` records').
    pub client_cpu_s_per_million: f64,
    /// Server resident bytes per active key, measured once per system after loading the keys.
    pub bytes_per_key: f64,
    pub allowed: u64,
    /// Requests decided by the client's failure mode instead of the server (should be 0).
    pub degraded: u64,
    pub errors: u64,
    /// The open loop could not keep up: too many requests in flight.
    pub saturated: bool,
    /// Checks per second in the slowest and the fastest 250 ms window of a closed loop (0 for
    /// an open loop): far apart when the rate changed mid-run.
    pub slowest_window_rate: f64,
    pub fastest_window_rate: f64,
    /// Checks per second in each 250 ms window of a closed loop, in order (empty for an open
    /// loop): when a run changed speed, and for how long.
    pub window_rates: Vec<f64>,
}

impl Record {
    pub fn new(
        system: &str,
        workload: &str,
        offered_rate: u64,
        run: &RunResult,
        cpu: CpuSeconds,
        bytes_per_key: f64,
    ) -> Self {
        let per_million = |seconds: f64| {
            if run.checks > 0 {
                seconds / run.checks as f64 * 1e6
            } else {
                0.0
            }
        };
        let checks_per_request = if run.requests > 0 {
            run.checks as f64 / run.requests as f64
        } else {
            0.0
        };
        let window_rates: Vec<f64> = run
            .window_rates
            .iter()
            .map(|r| r * checks_per_request)
            .collect();
        Record {
            system: system.to_owned(),
            nodes: 1,
            workload: workload.to_owned(),
            mode: if offered_rate == 0 { "closed" } else { "open" }.to_owned(),
            offered_rate,
            slowest_window_rate: window_rates.iter().copied().reduce(f64::min).unwrap_or(0.0),
            fastest_window_rate: window_rates.iter().copied().reduce(f64::max).unwrap_or(0.0),
            window_rates,
            achieved_rate: run.checks_per_second(),
            requests_per_second: run.requests_per_second(),
            p50_us: run.latency_us.value_at_quantile(0.5),
            p99_us: run.latency_us.value_at_quantile(0.99),
            p999_us: run.latency_us.value_at_quantile(0.999),
            cpu_s_per_million: per_million(cpu.server),
            first_node_cpu_s_per_million: cpu.first_server.map(per_million),
            client_cpu_s_per_million: per_million(cpu.client),
            bytes_per_key,
            allowed: run.allowed,
            degraded: run.degraded,
            errors: run.errors,
            saturated: run.saturated,
        }
    }
}

impl Record {
    /// The record of a system of `nodes` server processes.
    pub fn on_nodes(mut self, nodes: usize) -> Self {
        self.nodes = nodes;
        self
    }
}

/// CPU seconds one run used: the server's, and the bench process's (client and generator).
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuSeconds {
    pub server: f64,
    /// The first server process alone, when others serve beside it.
    pub first_server: Option<f64>,
    pub client: f64,
}

const FLOODGATE: &str = "floodgate";
/// The Redis setups floodgate is compared with, in table order: the token-bucket Lua script, and
/// redis-cell's native GCRA command (the fastest Redis setup a team would pick).
const BASELINES: [&str; 2] = ["redis+lua", "redis+cell"];
/// The peers: a Gubernator cluster beside floodgate, envoyproxy/ratelimit beside `floodgate+rls`.
const GUBERNATOR: &str = "gubernator";
const ENVOY_RATELIMIT: &str = "envoy-ratelimit";

/// The record of `system` on `workload` at `offered` req/s (0: the closed loop).
pub(super) fn find<'a>(
    records: &'a [Record],
    system: &str,
    workload: &str,
    offered: u64,
) -> Option<&'a Record> {
    records
        .iter()
        .find(|r| r.system == system && r.workload == workload && r.offered_rate == offered)
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}x", a / b)
    } else {
        "-".to_owned()
    }
}

/// A table cell from a record, `-` when that system has no such record.
fn cell(record: Option<&Record>, show: impl Fn(&Record) -> String) -> String {
    record.map(show).unwrap_or_else(|| "-".to_owned())
}

/// The subject's figure over a reference's, `-` when either is missing.
fn ratio_of(
    subject: Option<&Record>,
    reference: Option<&Record>,
    figure: fn(&Record) -> f64,
) -> String {
    match (subject, reference) {
        (Some(f), Some(b)) => ratio(figure(f), figure(b)),
        _ => "-".to_owned(),
    }
}

fn latency(record: &Record) -> String {
    format!(
        "{}/{}/{}{}",
        record.p50_us,
        record.p99_us,
        record.p999_us,
        if record.saturated { " (saturated)" } else { "" }
    )
}

fn row(out: &mut String, cells: &[String]) {
    let _ = writeln!(out, "| {} |", cells.join(" | "));
}

fn header(out: &mut String, titles: &[String]) {
    row(out, titles);
    let _ = writeln!(out, "|{}", "---|".repeat(titles.len()));
}

/// The markdown comparison: closed-loop throughput and open-loop latency, floodgate beside each
/// Redis baseline that ran, with floodgate's ratio to each; then, for those that ran, the
/// cluster beside one node, `floodgate+rls` beside floodgate's own QUIC path and redis+lua
/// (what the gRPC front costs), floodgate beside Gubernator and `floodgate+rls` beside
/// envoyproxy/ratelimit; then memory, the failed calls and the generator's own CPU.
pub fn markdown(records: &[Record]) -> String {
    let mut out = String::new();
    let mut workloads: Vec<&str> = Vec::new();
    for record in records {
        if !workloads.contains(&record.workload.as_str()) {
            workloads.push(&record.workload);
        }
    }
    let ran = |names: &[&'static str]| -> Vec<&'static str> {
        names
            .iter()
            .copied()
            .filter(|s| records.iter().any(|r| r.system == *s))
            .collect()
    };
    comparison(
        &mut out,
        records,
        &workloads,
        FLOODGATE,
        &ran(&BASELINES),
        "###",
    );
    if let Some(cluster) = records.iter().find(|r| r.system == CLUSTER) {
        let _ = writeln!(
            out,
            "\n### {CLUSTER}: {} nodes on this machine, each check sent to its key's owner, \
             beside one node\n",
            cluster.nodes
        );
        comparison(&mut out, records, &workloads, CLUSTER, &[FLOODGATE], "####");
    }
    if !ran(&[REGIONS_GLOBAL]).is_empty() {
        regions_section(&mut out, records, &workloads);
    }
    if !ran(&[RLS]).is_empty() {
        let _ = writeln!(
            out,
            "\n### {RLS}: Envoy's rate limit service (gRPC) in front of the same node\n"
        );
        let references = ran(&[FLOODGATE, BASELINES[0]]);
        comparison(&mut out, records, &workloads, RLS, &references, "####");
    }
    if let Some(cluster) = records.iter().find(|r| r.system == CLUSTER_RLS) {
        let _ = writeln!(
            out,
            "\n### {CLUSTER_RLS}: {} nodes on this machine behind their RLS fronts, the calls \
             spread over every node, beside one node's\n",
            cluster.nodes
        );
        let references = ran(&[RLS, CLUSTER]);
        comparison(
            &mut out,
            records,
            &workloads,
            CLUSTER_RLS,
            &references,
            "####",
        );
    }
    if !ran(&[GUBERNATOR]).is_empty() {
        let _ = writeln!(
            out,
            "\n### {FLOODGATE} beside Gubernator (3 nodes; one GetRateLimits call per request)\n"
        );
        comparison(
            &mut out,
            records,
            &workloads,
            FLOODGATE,
            &[GUBERNATOR],
            "####",
        );
    }
    if !ran(&[RLS]).is_empty() && !ran(&[ENVOY_RATELIMIT]).is_empty() {
        let _ = writeln!(
            out,
            "\n### {RLS} beside envoyproxy/ratelimit over Redis (the same RLS calls)\n"
        );
        comparison(
            &mut out,
            records,
            &workloads,
            RLS,
            &[ENVOY_RATELIMIT],
            "####",
        );
    }
    memory_line(&mut out, records);
    errors_line(&mut out, records);
    generator_line(&mut out, records, &workloads);
    out
}

/// Global checks beside region checks on two regions of one node each: the comparison
/// tables (server CPU there is both nodes summed), then region a's node alone.
fn regions_section(out: &mut String, records: &[Record], workloads: &[&str]) {
    let _ = writeln!(
        out,
        "\n### {REGIONS_GLOBAL}: two regions of one node each on this machine, the gateway in \
         region a, every check `global`, beside every check `region` (server CPU: both nodes \
         summed)\n"
    );
    comparison(
        out,
        records,
        workloads,
        REGIONS_GLOBAL,
        &[REGIONS_REGION],
        "####",
    );
    let alone: Vec<String> = [REGIONS_GLOBAL, REGIONS_REGION]
        .iter()
        .filter_map(|s| {
            let r = records
                .iter()
                .find(|r| r.system == *s && r.offered_rate == 0)?;
            let first = r.first_node_cpu_s_per_million?;
            Some(format!(
                "{s}: {first:.2} of {:.2} ({:.2} in region b)",
                r.cpu_s_per_million,
                r.cpu_s_per_million - first
            ))
        })
        .collect();
    if !alone.is_empty() {
        let _ = writeln!(
            out,
            "\nServer CPU s/M of region a's node alone, closed loop: {}",
            alone.join(", ")
        );
    }
}

/// Each system's bytes per key, in the tables' order.
fn memory_line(out: &mut String, records: &[Record]) {
    let mut every = vec![
        FLOODGATE,
        CLUSTER,
        REGIONS_REGION,
        REGIONS_GLOBAL,
        RLS,
        CLUSTER_RLS,
    ];
    every.extend(BASELINES);
    every.extend([GUBERNATOR, ENVOY_RATELIMIT]);
    let memory: Vec<String> = every
        .iter()
        .filter_map(|s| {
            records
                .iter()
                .find(|r| r.system == *s)
                .map(|r| format!("{s}: {:.0} bytes/key", r.bytes_per_key))
        })
        .collect();
    let _ = writeln!(out, "\n### Memory\n\n{}", memory.join(", "));
}

/// The runs in which calls failed (a timeout, an error answer), so a system's figures are read
/// with them: a failed call is neither admitted nor denied.
fn errors_line(out: &mut String, records: &[Record]) {
    let failed: Vec<String> = records
        .iter()
        .filter(|r| r.errors > 0)
        .map(|r| {
            let mode = match r.offered_rate {
                0 => "closed loop".to_owned(),
                rate => format!("{rate}/s"),
            };
            format!("{} {} {mode}: {}", r.system, r.workload, r.errors)
        })
        .collect();
    if !failed.is_empty() {
        let _ = writeln!(out, "\n### Failed calls\n\n{}", failed.join(", "));
    }
}

/// The generator's own CPU per million checks: client CPU s/M above includes it.
fn generator_line(out: &mut String, records: &[Record], workloads: &[&str]) {
    let figures: Vec<String> = workloads
        .iter()
        .flat_map(|w| {
            records
                .iter()
                .filter(move |r| r.system == GENERATOR && r.workload == *w)
                .map(move |r| {
                    let mode = match r.offered_rate {
                        0 => "closed loop".to_owned(),
                        rate => format!("{rate}/s"),
                    };
                    format!("{w} {mode} {:.2}", r.client_cpu_s_per_million)
                })
        })
        .collect();
    if !figures.is_empty() {
        let _ = writeln!(
            out,
            "\n### The load generator alone\n\nCPU s/M of the bench process against a no-op \
             target (included in every client CPU s/M above; subtract it for the client's own \
             cost): {}",
            figures.join(", ")
        );
    }
}

/// Two tables (closed-loop throughput, open-loop latency) of `subject` beside each of
/// `references`, with `subject`'s ratio to each; `level` is the markdown heading level.
fn comparison(
    out: &mut String,
    records: &[Record],
    workloads: &[&str],
    subject: &str,
    references: &[&str],
    level: &str,
) {
    let all: Vec<&str> = std::iter::once(subject)
        .chain(references.iter().copied())
        .collect();
    let tables = Comparison {
        records,
        workloads,
        subject,
        references,
        all: &all,
        level,
    };
    tables.throughput_table(out);
    tables.latency_table(out);
}

/// What both tables of a comparison are made of.
struct Comparison<'a> {
    records: &'a [Record],
    workloads: &'a [&'a str],
    subject: &'a str,
    references: &'a [&'a str],
    /// The subject, then its references.
    all: &'a [&'a str],
    /// The markdown heading level.
    level: &'a str,
}

impl Comparison<'_> {
    /// The closed-loop table: the subject's throughput and its ratio to each reference's, then
    /// every system's CPU and latency.
    fn throughput_table(&self, out: &mut String) {
        let (records, subject, references) = (self.records, self.subject, self.references);
        let names = self.all.join(" / ");
        let _ = writeln!(out, "{} Throughput (closed loop)\n", self.level);
        let mut titles = vec![
            "workload".to_owned(),
            format!("{subject} checks/s"),
            format!("{subject} slowest-fastest 250 ms"),
        ];
        for b in references {
            titles.push(format!("{b} checks/s"));
            titles.push(format!("ratio to {b}"));
        }
        titles.push(format!("server CPU s/M ({names})"));
        titles.push(format!("client CPU s/M ({names})"));
        titles.push(format!("p50/p99 µs ({names})"));
        header(out, &titles);
        for w in self.workloads {
            let f = find(records, subject, w, 0);
            let mut cells = vec![
                w.to_string(),
                cell(f, |x| format!("{:.0}", x.achieved_rate)),
                cell(f, |x| {
                    format!(
                        "{:.2}M-{:.2}M",
                        x.slowest_window_rate / 1e6,
                        x.fastest_window_rate / 1e6
                    )
                }),
            ];
            for b in references {
                let r = find(records, b, w, 0);
                cells.push(cell(r, |x| format!("{:.0}", x.achieved_rate)));
                cells.push(ratio_of(f, r, |x| x.achieved_rate));
            }
            let each = |show: fn(&Record) -> String| {
                self.all
                    .iter()
                    .map(|s| cell(find(records, s, w, 0), show))
                    .collect::<Vec<_>>()
                    .join(" / ")
            };
            cells.push(each(|x| format!("{:.2}", x.cpu_s_per_million)));
            cells.push(each(|x| format!("{:.2}", x.client_cpu_s_per_million)));
            cells.push(each(|x| format!("{}/{}", x.p50_us, x.p99_us)));
            row(out, &cells);
        }
    }

    /// The open-loop table: each offered rate any of the systems ran at, every system's achieved
    /// rate and latency, and the subject's latency ratio to each reference.
    fn latency_table(&self, out: &mut String) {
        let (records, subject, references) = (self.records, self.subject, self.references);
        let _ = writeln!(
            out,
            "\n{} Latency at a fixed arrival rate (open loop, from the scheduled time)\n",
            self.level
        );
        let mut titles = vec!["workload".to_owned(), "offered req/s".to_owned()];
        for s in self.all {
            titles.push(format!("{s} achieved"));
            titles.push(format!("{s} p50/p99/p99.9 µs"));
        }
        for b in references {
            titles.push(format!("p50/p99 ratio to {b}"));
        }
        header(out, &titles);
        for w in self.workloads {
            let mut rates: Vec<u64> = records
                .iter()
                .filter(|r| {
                    r.workload == *w && r.offered_rate > 0 && self.all.contains(&r.system.as_str())
                })
                .map(|r| r.offered_rate)
                .collect();
            rates.sort_unstable();
            rates.dedup();
            for rate in rates {
                let mut cells = vec![w.to_string(), rate.to_string()];
                for s in self.all {
                    let r = find(records, s, w, rate);
                    cells.push(cell(r, |x| format!("{:.0}", x.requests_per_second)));
                    cells.push(cell(r, latency));
                }
                let f = find(records, subject, w, rate);
                for b in references {
                    let r = find(records, b, w, rate);
                    cells.push(format!(
                        "{}/{}",
                        ratio_of(f, r, |x| x.p50_us as f64),
                        ratio_of(f, r, |x| x.p99_us as f64)
                    ));
                }
                row(out, &cells);
            }
        }
    }
}

/// The side-by-side step: every system at the same rate, the systems taking turns of 50 ms
/// (`driver::open_loop_taking_turns`), with floodgate's ratios to each baseline.
pub fn side_by_side_markdown(records: &[Record]) -> String {
    let mut out = String::new();
    let Some(rate) = records.first().map(|r| r.offered_rate) else {
        return out;
    };
    let _ = writeln!(
        out,
        "\n### Side by side at {rate} req/s each (the systems in turns of 50 ms, so the machine's stalls are shared out)\n"
    );
    let mut systems: Vec<&str> = Vec::new();
    let mut workloads: Vec<&str> = Vec::new();
    for r in records {
        if !systems.contains(&r.system.as_str()) {
            systems.push(&r.system);
        }
        if !workloads.contains(&r.workload.as_str()) {
            workloads.push(&r.workload);
        }
    }
    let baselines: Vec<&str> = systems
        .iter()
        .copied()
        .filter(|s| BASELINES.contains(s) || *s == GUBERNATOR)
        .collect();
    let mut titles = vec!["workload".to_owned()];
    titles.extend(systems.iter().map(|s| format!("{s} p50/p99/p99.9 µs")));
    titles.extend(baselines.iter().map(|b| format!("p50/p99 ratio to {b}")));
    header(&mut out, &titles);
    for w in workloads {
        let mut cells = vec![w.to_owned()];
        for s in &systems {
            cells.push(cell(find(records, s, w, rate), latency));
        }
        let f = find(records, FLOODGATE, w, rate);
        for b in &baselines {
            let r = find(records, b, w, rate);
            cells.push(format!(
                "{}/{}",
                ratio_of(f, r, |x| x.p50_us as f64),
                ratio_of(f, r, |x| x.p99_us as f64)
            ));
        }
        row(&mut out, &cells);
    }
    out
}

pub fn write_json(records: &[Record], path: &Path) -> anyhow::Result<()> {
    let json = serde_json::to_string_pretty(records)?;
    std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))
}

/// p99 latency against offered load, one line per (system, workload).
pub fn write_svg(records: &[Record], path: &Path) -> anyhow::Result<()> {
    let open: Vec<&Record> = records.iter().filter(|r| r.offered_rate > 0).collect();
    let max_rate = open.iter().map(|r| r.offered_rate).max().unwrap_or(1) as f64;
    let max_p99 = open.iter().map(|r| r.p99_us).max().unwrap_or(1).max(1) as f64;
    let root = SVGBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "p99 latency vs offered load (open loop)",
            ("sans-serif", 22),
        )
        .margin(20)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..max_rate * 1.05, (1f64..max_p99 * 1.5).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("offered requests/s")
        .y_desc("p99 latency (µs, log)")
        .draw()?;
    let mut series: Vec<(String, String)> = open
        .iter()
        .map(|r| (r.system.clone(), r.workload.clone()))
        .collect();
    series.sort();
    series.dedup();
    for (i, (system, workload)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let mut points: Vec<(f64, f64)> = open
            .iter()
            .filter(|r| &r.system == system && &r.workload == workload)
            .map(|r| (r.offered_rate as f64, r.p99_us.max(1) as f64))
            .collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(format!("{system} {workload}"))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(
            points
                .into_iter()
                .map(|p| Circle::new(p, 3, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(system: &str, offered_rate: u64, achieved_rate: f64, p99_us: u64) -> Record {
        Record {
            system: system.to_owned(),
            nodes: 1,
            workload: "uniform/1-check".to_owned(),
            mode: if offered_rate == 0 { "closed" } else { "open" }.to_owned(),
            offered_rate,
            achieved_rate,
            requests_per_second: achieved_rate,
            p50_us: p99_us / 2,
            p99_us,
            p999_us: p99_us * 2,
            cpu_s_per_million: 1.0,
            first_node_cpu_s_per_million: None,
            client_cpu_s_per_million: 2.0,
            bytes_per_key: 100.0,
            allowed: 1,
            degraded: 0,
            errors: 0,
            saturated: false,
            slowest_window_rate: achieved_rate * 0.5,
            fastest_window_rate: achieved_rate,
            window_rates: vec![achieved_rate * 0.5, achieved_rate],
        }
    }

    #[test]
    fn each_baseline_gets_its_own_figures_and_ratio() {
        let records = [
            record("floodgate", 0, 400_000.0, 1_000),
            record("redis+lua", 0, 100_000.0, 4_000),
            record("redis+cell", 0, 200_000.0, 2_000),
            record("floodgate", 1_000, 1_000.0, 100),
            record("redis+lua", 1_000, 1_000.0, 400),
            record("redis+cell", 1_000, 1_000.0, 50),
        ];
        let table = markdown(&records);
        let closed = table
            .lines()
            .find(|l| l.starts_with("| uniform/1-check | 400000"))
            .unwrap_or_else(|| panic!("{table}"));
        // The subject's slowest and fastest quarter-second, then each baseline and its ratio.
        assert!(
            closed.starts_with(
                "| uniform/1-check | 400000 | 0.20M-0.40M | 100000 | 4.00x | 200000 | 2.00x |"
            ),
            "{closed}"
        );
        assert!(
            closed.contains("| 500/1000 / 2000/4000 / 1000/2000 |"),
            "{closed}"
        );
        // Server and client CPU are separate columns.
        assert!(
            closed.contains("| 1.00 / 1.00 / 1.00 | 2.00 / 2.00 / 2.00 |"),
            "{closed}"
        );
        let open = table
            .lines()
            .find(|l| l.starts_with("| uniform/1-check | 1000 |"))
            .unwrap_or_else(|| panic!("{table}"));
        assert!(open.ends_with("| 0.25x/0.25x | 2.00x/2.00x |"), "{open}");
        assert!(!table.contains("load generator alone"), "{table}");
        assert!(table.contains("ratio to redis+cell"), "{table}");
        assert!(table.contains("redis+cell: 100 bytes/key"), "{table}");
    }

    #[test]
    fn the_rls_front_is_compared_with_the_quic_path_and_redis_lua() {
        let records = [
            record("floodgate", 0, 400_000.0, 1_000),
            record("floodgate+rls", 0, 100_000.0, 3_000),
            record("redis+lua", 0, 50_000.0, 6_000),
            record("redis+cell", 0, 200_000.0, 2_000),
            record("floodgate", 1_000, 1_000.0, 100),
            record("floodgate+rls", 1_000, 1_000.0, 300),
            record("redis+lua", 1_000, 1_000.0, 600),
        ];
        let table = markdown(&records);
        let (quic, rls) = table
            .split_once("### floodgate+rls: Envoy's rate limit service")
            .unwrap_or_else(|| panic!("{table}"));
        // floodgate's own tables stay as they were: the RLS front is no baseline of theirs.
        assert!(!quic.contains("floodgate+rls"), "{quic}");
        assert!(quic.contains("ratio to redis+cell"), "{quic}");
        let closed = rls
            .lines()
            .find(|l| l.starts_with("| uniform/1-check | 100000"))
            .unwrap_or_else(|| panic!("{rls}"));
        assert!(
            closed.contains("| 400000 | 0.25x | 50000 | 2.00x |"),
            "{closed}"
        );
        assert!(
            closed.contains("| 1500/3000 / 500/1000 / 3000/6000 |"),
            "{closed}"
        );
        let open = rls
            .lines()
            .find(|l| l.starts_with("| uniform/1-check | 1000 |"))
            .unwrap_or_else(|| panic!("{rls}"));
        assert!(open.ends_with("| 3.00x/3.00x | 0.50x/0.50x |"), "{open}");
        assert!(!rls.contains("redis+cell checks/s"), "{rls}");
        assert!(rls.contains("floodgate+rls: 100 bytes/key"), "{rls}");
    }

    #[test]
    fn the_generators_own_cost_is_reported_apart() {
        let mut generator = record(GENERATOR, 0, 2_000_000.0, 10);
        generator.client_cpu_s_per_million = 0.25;
        let records = [record("floodgate", 0, 400_000.0, 1_000), generator];
        let table = markdown(&records);
        assert!(
            table.contains("no-op target") && table.contains("uniform/1-check closed loop 0.25"),
            "{table}"
        );
        // The generator is no system of the comparison.
        assert!(!table.contains("generator checks/s"), "{table}");
    }

    #[test]
    fn a_baseline_that_did_not_run_gets_no_columns() {
        let records = [
            record("floodgate", 0, 400_000.0, 1_000),
            record("redis+lua", 0, 100_000.0, 4_000),
        ];
        let table = markdown(&records);
        assert!(table.contains("ratio to redis+lua"), "{table}");
        assert!(!table.contains("redis+cell"), "{table}");
    }
}
