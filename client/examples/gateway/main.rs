//! `gateway`: a small reverse proxy on 127.0.0.1:8080 in front of a demo upstream, rate limited
//! by the rules the floodgate nodes serve (`floodgate-node --rules rules/example.yaml`).
//!
//! Identity comes from `X-User-Id`, `X-Api-Key`, `X-Tenant-Id` and `X-Plan`, as an auth step in
//! front would set them; the client IP from the peer (and `X-Forwarded-For` through the rules'
//! trusted proxies). `GET /metrics`: verdicts by rule and outcome, fallbacks, limiter latency.
//!
//! ```sh
//! cargo run -p floodgate-client --example gateway -- --node 127.0.0.1:7100 --ca .run/node/ca.pem
//! ```

mod app;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use floodgate_client::core::parse_duration_ns;
use floodgate_client::core::policy::Policy;
use floodgate_client::{ClientConfig, LimiterConfig, RateLimiter};
use tokio::net::TcpListener;
use tokio::sync::watch;

#[derive(Debug, Parser)]
#[command(
    name = "gateway",
    about = "A rate-limited reverse proxy in front of a demo upstream"
)]
struct Flags {
    /// Where the gateway listens.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Where the demo upstream listens (started in this process).
    #[arg(long, default_value = "127.0.0.1:8081")]
    upstream: SocketAddr,
    /// A floodgate node, HOST:PORT (repeat for several).
    #[arg(long, default_value = "127.0.0.1:7100")]
    node: Vec<SocketAddr>,
    /// The CA that signs the node certificates.
    #[arg(long, default_value = ".run/node/ca.pem")]
    ca: PathBuf,
    /// Client certificate (PEM), for nodes started with --client-ca (mutual TLS).
    #[arg(long, requires = "client_key")]
    client_cert: Option<PathBuf>,
    /// Key of the client certificate (PEM).
    #[arg(long, requires = "client_cert")]
    client_key: Option<PathBuf>,
    /// Name the --node certificates must carry (default: the IP address dialed); nodes found
    /// in the slot table are verified by their node id.
    #[arg(long)]
    server_name: Option<String>,
    /// Longest a limiter call waits before each rule's failure mode decides (e.g. 50ms).
    #[arg(long, default_value = "50ms")]
    timeout: String,
    /// Rules to start from if no node serves any (the nodes' rules win once they do).
    #[arg(long, value_name = "FILE")]
    rules: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let flags = Flags::parse();
    let timeout = parse_duration_ns(&flags.timeout)
        .map(Duration::from_nanos)
        .map_err(|e| anyhow::anyhow!("--timeout {}: {e}", flags.timeout))?;
    let mut config = ClientConfig::with_ca_file(&flags.ca);
    config.timeout = timeout;
    config.server_name = flags.server_name.clone();
    if let (Some(cert), Some(key)) = (&flags.client_cert, &flags.client_key) {
        config.client_auth = Some(floodgate_client::ClientAuth {
            cert: cert.clone(),
            key: key.clone(),
        });
    }
    let local = match &flags.rules {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let policy = Policy::from_yaml(&text)
                .map_err(|e| anyhow::anyhow!("{}", e.render(&path.display().to_string(), &text)))?;
            Some(policy)
        }
        None => None,
    };
    let limiter =
        RateLimiter::connect_with(&flags.node, config, LimiterConfig::default(), local).await?;

    let (shutdown, shutdown_rx) = watch::channel(false);
    let upstream = TcpListener::bind(flags.upstream)
        .await
        .with_context(|| format!("binding the demo upstream on {}", flags.upstream))?;
    let upstream_addr = upstream.local_addr()?;
    let upstream_task = tokio::spawn(app::serve(
        upstream,
        app::upstream_app(),
        shutdown_rx.clone(),
    ));
    let listener = TcpListener::bind(flags.listen)
        .await
        .with_context(|| format!("binding the gateway on {}", flags.listen))?;
    eprintln!(
        "gateway: http://{} -> demo upstream http://{upstream_addr}; rules {} from {:?}; metrics at /metrics",
        listener.local_addr()?,
        limiter.policy_version().unwrap_or_default(),
        flags.node,
    );
    let app = app::app(limiter.clone(), upstream_addr, app::GatewayMetrics::new());
    let server = tokio::spawn(app::serve(listener, app, shutdown_rx));
    wait_for_signal().await?;
    shutdown.send_replace(true);
    let _ = server.await;
    let _ = upstream_task.await;
    limiter.close().await;
    Ok(())
}

async fn wait_for_signal() -> anyhow::Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result?,
        _ = terminate.recv() => {}
    }
    Ok(())
}
