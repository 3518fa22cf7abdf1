//! `floodgate-bench shed`: the example gateway's load shedding under open-loop HTTP load.
//!
//! Each phase starts a fresh node (serving `rules/example.yaml`) and a fresh example gateway
//! (its demo upstream's `GET /v1/work`: 4 places, 20 ms each, a queue beyond: 200 a second),
//! sends the class mix at a fixed arrival rate, and records per class: 2xx, 503 (shed), 429,
//! failures and the latency of the 2xx answers, plus the upstream's own load from the
//! gateway's metrics. Phases: a quarter of capacity with shedding (the unloaded latency), then
//! 1x, 2x and 4x without shedding (the gateway's shedder only watches; the rules' fleet-wide
//! reserve still applies) and with it, in the same run; `--runs` repeats it all and the table
//! shows medians.
//!
//! - `open_loop`: the fixed-rate sender and the per-class outcomes.
//! - `http`: a minimal, bounded HTTP/1.1 GET.
//! - `report`: medians, the markdown table, `report.json` and `shed.svg`.

mod http;
pub mod open_loop;
pub mod report;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use floodgate::priority::Priority;

use crate::load::parse_duration;
use crate::load::process::{self, Server};
use report::Row;

/// The demo upstream's capacity: 4 places of 20 ms.
pub const CAPACITY_PER_SEC: u64 = 200;

/// `shed`'s flags.
#[derive(Debug, clap::Args)]
pub struct ShedArgs {
    /// Recorded time per phase.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    duration: Duration,
    /// Load before recording starts, per phase.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    warmup: Duration,
    /// Repetitions of every phase (the table shows medians).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Loads, as multiples of the upstream's capacity (200/s).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    loads: Vec<f64>,
    /// The rules the node serves.
    #[arg(long, default_value = "rules/example.yaml")]
    rules: PathBuf,
    /// Where report.json and shed.svg go.
    #[arg(long, default_value = "target/shed")]
    out: PathBuf,
    #[arg(long)]
    node_bin: Option<PathBuf>,
    #[arg(long)]
    gateway_bin: Option<PathBuf>,
}

/// Longest phase part and most runs and loads: every loop of the demo stays bounded.
const MAX_PART: Duration = Duration::from_secs(600);
const MAX_RUNS: usize = 100;
const MAX_LOAD: f64 = 20.0;

/// Runs every phase `runs` times, prints the table, writes the files.
pub fn run(args: ShedArgs) -> anyhow::Result<()> {
    if args.duration > MAX_PART || args.warmup > MAX_PART || args.duration.is_zero() {
        bail!("--duration must be more than 0 and, like --warmup, at most 600s");
    }
    if !(1..=MAX_RUNS).contains(&args.runs) {
        bail!("--runs must be 1 to {MAX_RUNS}");
    }
    if args.loads.iter().any(|&l| !(l > 0.0 && l <= MAX_LOAD)) {
        bail!("each of --loads must be more than 0 and at most {MAX_LOAD}");
    }
    let me = std::env::current_exe()?;
    let node_bin = args
        .node_bin
        .clone()
        .unwrap_or_else(process::default_node_binary);
    let gateway_bin = args
        .gateway_bin
        .clone()
        .unwrap_or_else(|| me.with_file_name("examples").join("gateway"));
    if !gateway_bin.is_file() {
        bail!(
            "no gateway at {} (build it: cargo build --release -p floodgate-client --example gateway --features tower,logging)",
            gateway_bin.display()
        );
    }
    std::fs::create_dir_all(&args.out)?;
    let data = tempfile_dir(&args.out)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut phases = vec![("unloaded", 0.25, true)];
    for (mode, shed) in [("baseline", false), ("shedding", true)] {
        for &load in &args.loads {
            phases.push((mode, load, shed));
        }
    }
    let mut rows = Vec::new();
    for run in 1..=args.runs {
        for &(mode, load, shed) in &phases {
            eprintln!("run {run}/{}: {mode} at {load}x", args.runs);
            let rules = ["--rules".to_owned(), args.rules.display().to_string()];
            let node = process::start_node_with(&node_bin, &data, None, None, &rules)?;
            let gateway = start_gateway(&gateway_bin, &node, &data, shed)?;
            let rate = (CAPACITY_PER_SEC as f64 * load).round() as u64;
            rows.extend(runtime.block_on(phase(
                gateway.addr,
                rate,
                args.warmup,
                args.duration,
                mode,
                load,
            ))?);
            drop(gateway);
            drop(node);
        }
    }
    let medians = report::medians(&rows);
    let table = report::markdown(&medians, args.runs);
    println!("{table}");
    report::write_json(&rows, &args.out.join("report.json"))?;
    report::write_svg(&medians, &args.out.join("shed.svg"))?;
    std::fs::write(args.out.join("table.md"), &table)?;
    eprintln!(
        "wrote {}, {} and {}",
        args.out.join("table.md").display(),
        args.out.join("report.json").display(),
        args.out.join("shed.svg").display()
    );
    Ok(())
}

/// A data folder for the node's development certificates, kept across phases.
fn tempfile_dir(out: &Path) -> anyhow::Result<PathBuf> {
    let dir = out.join("node");
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Starts the example gateway against `node`; returns once it answers `/metrics`.
fn start_gateway(binary: &Path, node: &Server, data: &Path, shed: bool) -> anyhow::Result<Server> {
    let listen = process::free_tcp_addr()?;
    let upstream = process::free_tcp_addr()?;
    let child = Command::new(binary)
        .args(["--listen", &listen.to_string()])
        .args(["--upstream", &upstream.to_string()])
        .args(["--seeds", &node.addr.to_string()])
        .arg("--ca")
        .arg(data.join("ca.pem"))
        .args(["--shed", if shed { "on" } else { "off" }])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    let server = process::Server::new(listen, child);
    // Bounded: 200 tries, 50 ms apart.
    for _ in 0..200 {
        if std::net::TcpStream::connect(listen).is_ok() {
            return Ok(server);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("the gateway did not listen on {listen} within 10 s");
}

/// The upstream's counters from the gateway's metrics.
#[derive(Debug, Clone, Copy, Default)]
struct Upstream {
    served: f64,
    queue_wait_s: f64,
    queued_max: f64,
}

async fn scrape(gateway: SocketAddr) -> Upstream {
    let Some((_, body)) = http::get(gateway, "/metrics", &[], Duration::from_secs(5)).await else {
        return Upstream::default();
    };
    let value = |name: &str| {
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or(0.0)
    };
    Upstream {
        served: value("floodgate_demo_work_served"),
        queue_wait_s: value("floodgate_demo_work_queue_wait_seconds_sum"),
        queued_max: value("floodgate_demo_work_queued_max"),
    }
}

/// One phase at `rate`: the open loop, with the upstream's counters read as recording starts
/// and as arrivals end.
async fn phase(
    gateway: SocketAddr,
    rate: u64,
    warmup: Duration,
    duration: Duration,
    mode: &str,
    load: f64,
) -> anyhow::Result<Vec<Row>> {
    let counters = tokio::spawn(async move {
        tokio::time::sleep(warmup).await;
        let first = scrape(gateway).await;
        tokio::time::sleep(duration).await;
        (first, scrape(gateway).await)
    });
    let outcomes = open_loop::run(gateway, "/v1/work", rate, warmup, duration).await;
    let (first, last) = counters.await?;
    let seconds = duration.as_secs_f64();
    let mut rows = Vec::new();
    for class in Priority::ALL.into_iter().rev() {
        let o = &outcomes[class.rank()];
        let share = |n: u64| n as f64 / o.sent.max(1) as f64;
        let ms = |q: f64| o.latency_us.value_at_quantile(q) as f64 / 1_000.0;
        rows.push(Row {
            mode: mode.to_owned(),
            load,
            class: class.name().to_owned(),
            sent: o.sent,
            success: share(o.ok),
            shed: share(o.shed),
            refused: share(o.refused),
            failed: share(o.failed),
            p50_ms: ms(0.5),
            p99_ms: ms(0.99),
            upstream_per_s: (last.served - first.served) / seconds,
            upstream_queue_mean: (last.queue_wait_s - first.queue_wait_s) / seconds,
            upstream_queue_max: last.queued_max,
        });
    }
    Ok(rows)
}
