//! The benchmark's outputs: one record per (system, workload, mode, offered rate), a markdown
//! table with ratios on stdout, `report.json`, and `latency.svg` (p99 against offered load).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;
use serde::Serialize;

use super::driver::RunResult;

#[derive(Debug, Clone, Serialize)]
pub struct Record {
    pub system: String,
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
    /// Server CPU seconds per million checks during this run.
    pub cpu_s_per_million: f64,
    /// Server resident bytes per active key, measured once per system after loading the keys.
    pub bytes_per_key: f64,
    pub allowed: u64,
    /// Requests decided by the client's failure mode instead of the server (should be 0).
    pub degraded: u64,
    pub errors: u64,
    /// The open loop could not keep up: too many requests in flight.
    pub saturated: bool,
}

impl Record {
    pub fn new(
        system: &str,
        workload: &str,
        offered_rate: u64,
        run: &RunResult,
        cpu_seconds: f64,
        bytes_per_key: f64,
    ) -> Self {
        Record {
            system: system.to_owned(),
            workload: workload.to_owned(),
            mode: if offered_rate == 0 { "closed" } else { "open" }.to_owned(),
            offered_rate,
            achieved_rate: run.checks_per_second(),
            requests_per_second: run.requests_per_second(),
            p50_us: run.latency_us.value_at_quantile(0.5),
            p99_us: run.latency_us.value_at_quantile(0.99),
            p999_us: run.latency_us.value_at_quantile(0.999),
            cpu_s_per_million: if run.checks > 0 {
                cpu_seconds / run.checks as f64 * 1e6
            } else {
                0.0
            },
            bytes_per_key,
            allowed: run.allowed,
            degraded: run.degraded,
            errors: run.errors,
            saturated: run.saturated,
        }
    }
}

const FLOODGATE: &str = "floodgate";
const REDIS: &str = "redis+lua";

fn find<'a>(
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

/// The markdown comparison: closed-loop throughput and open-loop latency, side by side.
pub fn markdown(records: &[Record]) -> String {
    let mut out = String::new();
    let mut workloads: Vec<&str> = Vec::new();
    for record in records {
        if !workloads.contains(&record.workload.as_str()) {
            workloads.push(&record.workload);
        }
    }
    let _ = writeln!(out, "### Throughput (closed loop)\n");
    let _ = writeln!(
        out,
        "| workload | floodgate checks/s | redis+lua checks/s | ratio | floodgate CPU s/M | redis CPU s/M | floodgate p50/p99 µs | redis p50/p99 µs |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
    for w in &workloads {
        let (f, r) = (find(records, FLOODGATE, w, 0), find(records, REDIS, w, 0));
        let cell = |x: Option<&Record>, g: fn(&Record) -> String| {
            x.map(g).unwrap_or_else(|| "-".to_owned())
        };
        let _ = writeln!(
            out,
            "| {w} | {} | {} | {} | {} | {} | {} | {} |",
            cell(f, |x| format!("{:.0}", x.achieved_rate)),
            cell(r, |x| format!("{:.0}", x.achieved_rate)),
            match (f, r) {
                (Some(f), Some(r)) => ratio(f.achieved_rate, r.achieved_rate),
                _ => "-".into(),
            },
            cell(f, |x| format!("{:.2}", x.cpu_s_per_million)),
            cell(r, |x| format!("{:.2}", x.cpu_s_per_million)),
            cell(f, |x| format!("{}/{}", x.p50_us, x.p99_us)),
            cell(r, |x| format!("{}/{}", x.p50_us, x.p99_us)),
        );
    }
    let _ = writeln!(
        out,
        "\n### Latency at a fixed arrival rate (open loop, from the scheduled time)\n"
    );
    let _ = writeln!(
        out,
        "| workload | offered req/s | floodgate achieved | floodgate p50/p99/p99.9 µs | redis achieved | redis p50/p99/p99.9 µs | p50 ratio | p99 ratio |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
    for w in &workloads {
        let mut rates: Vec<u64> = records
            .iter()
            .filter(|r| r.workload == *w && r.offered_rate > 0)
            .map(|r| r.offered_rate)
            .collect();
        rates.sort_unstable();
        rates.dedup();
        for rate in rates {
            let (f, r) = (
                find(records, FLOODGATE, w, rate),
                find(records, REDIS, w, rate),
            );
            let lat = |x: Option<&Record>| {
                x.map(|x| {
                    format!(
                        "{}/{}/{}{}",
                        x.p50_us,
                        x.p99_us,
                        x.p999_us,
                        if x.saturated { " (saturated)" } else { "" }
                    )
                })
                .unwrap_or_else(|| "-".into())
            };
            let ach = |x: Option<&Record>| {
                x.map(|x| format!("{:.0}", x.requests_per_second))
                    .unwrap_or_else(|| "-".into())
            };
            let (p50, p99) = match (f, r) {
                (Some(f), Some(r)) => (
                    ratio(f.p50_us as f64, r.p50_us as f64),
                    ratio(f.p99_us as f64, r.p99_us as f64),
                ),
                _ => ("-".into(), "-".into()),
            };
            let _ = writeln!(
                out,
                "| {w} | {rate} | {} | {} | {} | {} | {p50} | {p99} |",
                ach(f),
                lat(f),
                ach(r),
                lat(r)
            );
        }
    }
    let memory: Vec<String> = [FLOODGATE, REDIS]
        .iter()
        .filter_map(|s| {
            records
                .iter()
                .find(|r| r.system == *s)
                .map(|r| format!("{s}: {:.0} bytes/key", r.bytes_per_key))
        })
        .collect();
    let _ = writeln!(out, "\n### Memory\n\n{}", memory.join(", "));
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
