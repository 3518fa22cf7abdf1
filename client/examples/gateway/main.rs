//! `gateway`: a small reverse proxy on 127.0.0.1:8080 in front of a demo upstream, rate limited
//! by the rules the floodgate nodes serve (`floodgate-node --rules rules/example.yaml`).
//!
//! Identity comes from `X-User-Id`, `X-Api-Key`, `X-Tenant-Id`, `X-Plan` and `X-Home-Region`
//! (for `scope: home` rules), as an auth step in front would set them; the client IP from the peer (and `X-Forwarded-For` through the rules'
//! trusted proxies); the class from `X-Priority` (`critical`, `default`, `sheddable`; as the
//! rules' `priority:` says). The gateway believes these headers: the auth step in front must
//! set them and strip a client's own (docs/GATEWAY.md). `GET /v1/work` (4 at once, 20 ms each, queued beyond) goes through
//! a shedder (`--shed`), which reports its level into the cluster and sheds at the fleet's
//! level too. `GET /metrics`: verdicts by rule and outcome, fallbacks, limiter latency, requests
//! per class, the shedder's level and limit, the demo upstream's queue.
//!
//! When no node answers at start, it starts from `--rules FILE`, else from `--rules-cache FILE`
//! (the rules a node served on an earlier run), and each rule's failure mode applies until a
//! node answers; the nodes' rules replace the local ones as soon as one does.
//!
//! ```sh
//! cargo run -p floodgate-client --example gateway -- --seeds 127.0.0.1:7100 --ca .run/node/ca.pem
//! ```

mod app;
mod rules_source;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use floodgate_client::brownout::BrownoutReporter;
use floodgate_client::core::parse_duration_ns;
use floodgate_client::core::priority::ShedderConfig;
use floodgate_client::logging::{self, LogFormat};
use floodgate_client::shed::ShedGate;
use floodgate_client::{ClientConfig, HostPort, LimiterConfig, LimiterError, RateLimiter};
use tokio::net::TcpListener;
use tokio::sync::watch;

#[derive(Debug, Parser)]
#[command(
    name = "gateway",
    version,
    about = "A rate-limited reverse proxy in front of a demo upstream"
)]
struct Flags {
    /// Where the gateway listens.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Where the demo upstream listens (started in this process).
    #[arg(long, default_value = "127.0.0.1:8081")]
    upstream: SocketAddr,
    /// Floodgate nodes to start from, HOST:PORT (a DNS name is resolved again on each
    /// reconnect); repeat the flag or separate with commas. `--node` is the same flag.
    #[arg(
        long,
        alias = "node",
        default_value = "127.0.0.1:7100",
        value_delimiter = ',',
        value_name = "HOST:PORT"
    )]
    seeds: Vec<HostPort>,
    /// The CA that signs the node certificates.
    #[arg(long, default_value = ".run/node/ca.pem")]
    ca: PathBuf,
    /// Client certificate (PEM), for nodes started with --client-ca (mutual TLS).
    #[arg(long, requires = "client_key")]
    client_cert: Option<PathBuf>,
    /// Key of the client certificate (PEM).
    #[arg(long, requires = "client_cert")]
    client_key: Option<PathBuf>,
    /// Name the --seeds' certificates must carry (default: each seed's HOST, a DNS name or IP
    /// address); nodes found in the slot table are verified by their node id.
    #[arg(long)]
    server_name: Option<String>,
    /// Longest a limiter call waits before each rule's failure mode decides (e.g. 50ms).
    #[arg(long, default_value = "50ms", value_parser = parse_timeout)]
    timeout: Duration,
    /// Rules to start from if no node serves any (the nodes' rules win once they do).
    #[arg(long, value_name = "FILE")]
    rules: Option<PathBuf>,
    /// Keep the rules the nodes serve in FILE, and start from it when no node answers and no
    /// --rules is given.
    #[arg(long, value_name = "FILE")]
    rules_cache: Option<PathBuf>,
    /// Log lines as `text` or `json` (one object per line), on stderr; `RUST_LOG` filters them
    /// (default `info`).
    #[arg(long, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// `on`: shed `/v1/work` by class when the upstream is overloaded; `off`: only watch it
    /// (the baseline the shed demo compares with).
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    shed: String,
    /// How often the gateway reports its shedding level and reads the fleet's.
    #[arg(long, default_value = "100ms", value_parser = parse_timeout)]
    brownout_interval: Duration,
    /// The share of reports at a level or above that brings the fleet to it (e.g. 50%).
    #[arg(long, default_value = "50%", value_parser = parse_share)]
    brownout_quorum: u32,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let flags = Flags::parse();
    logging::init(flags.log_format, "info");
    let local = rules_source::load_local(flags.rules.as_deref(), flags.rules_cache.as_deref())?;
    let (policy, local_source) = local.unzip();
    let limiter = RateLimiter::connect_with(
        &flags.seeds,
        client_config(&flags),
        LimiterConfig::default(),
        policy,
    )
    .await
    .map_err(|e| match e {
        LimiterError::NoPolicy(_) => anyhow::anyhow!(
            "{e}; give the gateway rules to start from with --rules FILE (or --rules-cache \
             FILE once a node has served rules)"
        ),
        other => other.into(),
    })?;

    let (shutdown, shutdown_rx) = watch::channel(false);
    let upstream = TcpListener::bind(flags.upstream)
        .await
        .with_context(|| format!("binding the demo upstream on {}", flags.upstream))?;
    let upstream_addr = upstream.local_addr()?;
    let work = app::Work::demo();
    let upstream_task = tokio::spawn(app::serve(
        upstream,
        app::upstream_app_with_work(app::ExportPace::Takes(app::EXPORT_TAKES), work.clone()),
        shutdown_rx.clone(),
    ));
    let listener = TcpListener::bind(flags.listen)
        .await
        .with_context(|| format!("binding the gateway on {}", flags.listen))?;
    eprintln!(
        "gateway: http://{} -> demo upstream http://{upstream_addr}; {}; metrics at /metrics",
        listener.local_addr()?,
        rules_source::describe(&limiter, local_source.as_ref()),
    );
    let cache_task = flags.rules_cache.clone().map(|path| {
        tokio::spawn(rules_source::keep_cache(
            limiter.clone(),
            path,
            shutdown_rx.clone(),
        ))
    });
    let metrics = app::GatewayMetrics::new();
    metrics.watch_work(work);
    let upkeep_task = tokio::spawn(metrics.clone().upkeep(shutdown_rx.clone()));
    let (gate, brownout_task) = start_shedding(&flags, &limiter, &shutdown_rx)?;
    let app = app::app_with_gate(limiter.clone(), upstream_addr, metrics, gate);
    let server = tokio::spawn(app::serve(listener, app, shutdown_rx));
    wait_for_signal().await?;
    shutdown.send_replace(true);
    let _ = server.await;
    let _ = upkeep_task.await;
    let _ = upstream_task.await;
    if let Some(task) = brownout_task {
        let _ = task.await;
    }
    if let Some(task) = cache_task {
        let _ = task.await;
    }
    limiter.close().await;
    Ok(())
}

/// The client's settings from the flags: timeout, server name, client certificate.
fn client_config(flags: &Flags) -> ClientConfig {
    let mut config = ClientConfig::with_ca_file(&flags.ca);
    config.timeout = flags.timeout;
    config.server_name = flags.server_name.clone();
    if let (Some(cert), Some(key)) = (&flags.client_cert, &flags.client_key) {
        config.client_auth = Some(floodgate_client::ClientAuth {
            cert: cert.clone(),
            key: key.clone(),
        });
    }
    config
}

/// The shedder's gate in front of the demo work and, when it sheds (`--shed on`), the task
/// reporting its level into the cluster.
fn start_shedding(
    flags: &Flags,
    limiter: &RateLimiter,
    shutdown: &watch::Receiver<bool>,
) -> anyhow::Result<(ShedGate, Option<tokio::task::JoinHandle<()>>)> {
    let enforce = flags.shed == "on";
    let gate = ShedGate::new(app::WORK_BACKEND, ShedderConfig::default(), enforce);
    let brownout_task = if enforce {
        let reporter = BrownoutReporter::new(
            limiter.client().clone(),
            app::WORK_BACKEND,
            flags.brownout_interval,
            flags.brownout_quorum,
        )?;
        Some(tokio::spawn(reporter.run(gate.clone(), shutdown.clone())))
    } else {
        None
    };
    Ok((gate, brownout_task))
}

async fn wait_for_signal() -> anyhow::Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result?,
        _ = terminate.recv() => {}
    }
    Ok(())
}

/// A duration such as `50ms` or `2s`, more than zero.
fn parse_timeout(text: &str) -> Result<Duration, String> {
    match parse_duration_ns(text) {
        Ok(0) => Err("the timeout must be more than zero".to_owned()),
        Ok(ns) => Ok(Duration::from_nanos(ns)),
        Err(e) => Err(e.to_string()),
    }
}

/// A share such as `50%`, in basis points.
fn parse_share(text: &str) -> Result<u32, String> {
    floodgate_client::core::priority::reserve::parse_share_bp(text).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seeds(argv: &[&str]) -> Result<Vec<String>, String> {
        let flags =
            Flags::try_parse_from(["gateway"].iter().chain(argv)).map_err(|e| e.to_string())?;
        Ok(flags.seeds.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn seeds_take_names_repeated_or_comma_separated_and_node_is_the_same_flag() {
        assert_eq!(seeds(&[]).unwrap(), ["127.0.0.1:7100"]);
        let expected = ["localhost:7100", "localhost:7101"];
        assert_eq!(
            seeds(&["--seeds", "localhost:7100,localhost:7101"]).unwrap(),
            expected
        );
        assert_eq!(
            seeds(&["--node", "localhost:7100", "--seeds", "localhost:7101"]).unwrap(),
            expected
        );
        let error = seeds(&["--seeds", "localhost"]).unwrap_err();
        assert!(
            error.contains("--seeds") && error.contains("has no port"),
            "{error}"
        );
    }

    #[test]
    fn the_timeout_is_a_duration_checked_by_clap() {
        let timeout =
            |t: &str| Flags::try_parse_from(["gateway", "--timeout", t]).map(|f| f.timeout);
        assert_eq!(timeout("250ms").unwrap(), Duration::from_millis(250));
        let error = timeout("soon").unwrap_err().to_string();
        assert!(error.contains("--timeout"), "{error}");
        assert!(timeout("0s").is_err());
    }
}
