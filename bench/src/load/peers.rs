//! The peers floodgate is measured beside, as their users run them, started on free loopback
//! ports (127.0.0.0/8) from the binaries `bench/go-peer.sh` builds into `target/`: a 3-node
//! Gubernator cluster (member-list discovery), and envoyproxy/ratelimit over a redis-server of
//! its own.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use floodgate::Limit;

use super::process::{Server, free_port, free_port_both, start_redis};

/// Gubernator's nodes in the bench: as many as floodgate's `make run` cluster has.
pub const GUBERNATOR_NODES: usize = 3;
/// Longest wait for a peer to serve (the nodes of a cluster to see each other).
const START_UP: Duration = Duration::from_secs(30);

/// `target/PEER/bin/BINARY`, where `bench/go-peer.sh PEER` installs it: beside the
/// `target/release/` folder holding this binary.
pub fn default_binary(peer: &str, binary: &str) -> PathBuf {
    let me = std::env::current_exe().unwrap_or_default();
    let target = me
        .parent()
        .and_then(Path::parent)
        .unwrap_or(Path::new("target"));
    target.join(peer).join("bin").join(binary)
}

fn ensure_built(binary: &Path, peer: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        binary.is_file(),
        "{} is missing: build it with `bash bench/go-peer.sh {peer}` (`make bench-load` does)",
        binary.display()
    );
    Ok(())
}

/// A peer's log, so a peer that will not start says why.
fn log_file(path: &Path) -> anyhow::Result<std::fs::File> {
    std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))
}

/// Starts `nodes` Gubernator nodes that find each other by member-list gossip, each with a
/// cache large enough for `keys` (its default of 50,000 would evict the bench's key space);
/// returns their gRPC addresses once every node sees all the others. The first node's
/// `Server` holds the others, so CPU and memory are the cluster's.
///
/// Gubernator tells member-list peers apart by IP address and gossips under the host's name, as
/// on one node per host: here node `i` listens on 127.0.0.`i+1` and runs in a UTS namespace of
/// its own (`unshare --uts`, as root) named `bench-i`.
///
/// Nodes that do not all see each other within [`START_UP`], or of which one exits while
/// starting, are stopped and started once more on fresh ports (that try's logs in
/// `dir/second-try`): what is measured is a converged cluster's service, and sets of runs on a
/// slower host lost a run's Gubernator rows to a start-up that never converged and to a node
/// whose port, found free, was taken before it bound it.
pub async fn start_gubernator(
    binary: &Path,
    dir: &Path,
    nodes: usize,
    keys: u64,
) -> anyhow::Result<(Server, Vec<SocketAddr>)> {
    ensure_built(binary, "gubernator")?;
    match start_gubernator_once(binary, dir, nodes, keys).await {
        Ok(Started::Converged(server, addrs)) => return Ok((server, addrs)),
        Ok(Started::NotConverged(why)) => {
            eprintln!("{why}; starting Gubernator's nodes again on fresh ports");
        }
        Err(e) => return Err(e),
    }
    match start_gubernator_once(binary, &dir.join("second-try"), nodes, keys).await? {
        Started::Converged(server, addrs) => Ok((server, addrs)),
        Started::NotConverged(why) => bail!("{why}, twice"),
    }
}

/// What one start of Gubernator's nodes came to.
enum Started {
    Converged(Server, Vec<SocketAddr>),
    /// A node exited, or they serve but not all see each other: why (the nodes are stopped).
    NotConverged(String),
}

async fn start_gubernator_once(
    binary: &Path,
    dir: &Path,
    nodes: usize,
    keys: u64,
) -> anyhow::Result<Started> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let ip = |i: usize| std::net::Ipv4Addr::new(127, 0, 0, 1 + i as u8);
    let gossip_port = free_port_both()?;
    let known = format!("{}:{gossip_port}", ip(0));
    let mut servers = Vec::with_capacity(nodes);
    let mut addrs = Vec::with_capacity(nodes);
    for i in 0..nodes {
        let grpc = SocketAddr::from((ip(i), free_port(false)?));
        let http = SocketAddr::from((ip(i), free_port(false)?));
        let gossip = format!("{}:{gossip_port}", ip(i));
        let log = dir.join(format!("node-{i}.log"));
        let child = Command::new("unshare")
            .args(["--uts", "sh", "-c", "hostname \"$1\" && exec \"$2\"", "sh"])
            .arg(format!("bench-{i}"))
            .arg(binary)
            .env("GUBER_GRPC_ADDRESS", grpc.to_string())
            .env("GUBER_HTTP_ADDRESS", http.to_string())
            .env("GUBER_ADVERTISE_ADDRESS", grpc.to_string())
            .env("GUBER_INSTANCE_ID", format!("bench-{i}"))
            .env("GUBER_PEER_DISCOVERY_TYPE", "member-list")
            .env("GUBER_MEMBERLIST_ADDRESS", &gossip)
            .env("GUBER_MEMBERLIST_BIND_ADDRESS", &gossip)
            .env("GUBER_MEMBERLIST_KNOWN_NODES", &known)
            .env("GUBER_CACHE_SIZE", (keys * 2).max(100_000).to_string())
            .env("GUBER_LOG_LEVEL", "warn")
            // No trace exporter: nothing listens for traces here.
            .env("OTEL_TRACES_EXPORTER", "none")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file(&log)?)
            .spawn()
            .context("starting Gubernator under `unshare --uts` (util-linux, as root)")?;
        servers.push(Server::new(grpc, child));
        addrs.push(grpc);
    }
    let deadline = Instant::now() + START_UP;
    for (i, &addr) in addrs.iter().enumerate() {
        loop {
            if let Some(status) = servers[i].exited()? {
                // Tried once more on fresh ports, as for nodes that do not converge: a port
                // found free can be taken before the node binds it.
                return Ok(Started::NotConverged(format!(
                    "Gubernator node {i} exited during start-up ({status}; log: {}; \
                     `unshare --uts` needs root)",
                    dir.join(format!("node-{i}.log")).display()
                )));
            }
            match super::gubernator::peer_count(addr).await {
                Ok(count) if count as usize >= nodes => break,
                _ if Instant::now() > deadline => {
                    // Dropping the servers stops the nodes.
                    return Ok(Started::NotConverged(format!(
                        "Gubernator node {i} on {addr} did not see {nodes} peers within {START_UP:?}"
                    )));
                }
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
    let mut servers = servers.into_iter();
    let first = servers.next().context("no Gubernator node")?;
    Ok(Started::Converged(first.with(servers.collect()), addrs))
}

/// envoyproxy/ratelimit's configuration: the domain and descriptor keys of floodgate's RLS
/// configuration with `limit`'s count per unit. Its only algorithm is a fixed window per unit
/// (a Redis INCRBY and EXPIRE per descriptor), and it refuses keys it does not know, so the
/// GCRA burst of floodgate's configuration is left out.
pub fn envoy_ratelimit_yaml(limit: &Limit) -> anyhow::Result<String> {
    let unit = super::rls::unit(limit)?;
    let mut yaml = format!("domain: {}\ndescriptors:\n", super::rls::DOMAIN);
    for key in super::rls::DESCRIPTOR_KEYS {
        yaml.push_str(&format!(
            "  - key: {key}\n    rate_limit:\n      unit: {unit}\n      requests_per_unit: {}\n",
            limit.rate()
        ));
    }
    Ok(yaml)
}

/// Starts a redis-server and envoyproxy/ratelimit over it (its defaults, stats off), serving
/// `envoy_ratelimit_yaml(limit)` from `dir`; returns its gRPC address once it accepts
/// connections. The service's `Server` holds the redis-server.
pub fn start_envoy_ratelimit(
    binary: &Path,
    dir: &Path,
    limit: &Limit,
) -> anyhow::Result<(Server, SocketAddr)> {
    ensure_built(binary, "envoy-ratelimit")?;
    let config_dir = dir.join("ratelimit").join("config");
    std::fs::create_dir_all(&config_dir)
        .with_context(|| format!("creating {}", config_dir.display()))?;
    std::fs::write(config_dir.join("bench.yaml"), envoy_ratelimit_yaml(limit)?)
        .with_context(|| format!("writing the configuration in {}", config_dir.display()))?;
    let redis = start_redis(None)?;
    let grpc = SocketAddr::from(([127, 0, 0, 1], free_port(false)?));
    let child = Command::new(binary)
        // No stats sink: with statsd off and stats on, it logs every timing to stderr.
        .env("DISABLE_STATS", "true")
        .env("LOG_LEVEL", "warn")
        .env("REDIS_SOCKET_TYPE", "tcp")
        .env("REDIS_URL", redis.addr.to_string())
        .env("RUNTIME_ROOT", dir)
        .env("RUNTIME_SUBDIRECTORY", "ratelimit")
        .env("RUNTIME_WATCH_ROOT", "false")
        .env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", grpc.port().to_string())
        .env("HOST", "127.0.0.1")
        .env("PORT", free_port(false)?.to_string())
        .env("DEBUG_HOST", "127.0.0.1")
        .env("DEBUG_PORT", free_port(false)?.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file(&dir.join("service.log"))?)
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    let mut server = Server::new(grpc, child).with(vec![redis]);
    let deadline = Instant::now() + START_UP;
    while std::net::TcpStream::connect_timeout(&grpc, Duration::from_millis(100)).is_err() {
        if let Some(status) = server.exited()? {
            bail!(
                "envoyproxy/ratelimit exited during start-up ({status}; log: {})",
                dir.join("service.log").display()
            );
        }
        if Instant::now() > deadline {
            bail!("envoyproxy/ratelimit did not listen on {grpc} within {START_UP:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok((server, grpc))
}

#[cfg(test)]
mod tests {
    use floodgate::NANOS_PER_SEC;

    use super::*;

    #[test]
    fn envoy_ratelimit_gets_each_descriptor_key_with_the_count_per_unit_only() {
        let limit = Limit::gcra(1_000, 3_600 * NANOS_PER_SEC, 1_000).unwrap();
        let yaml = envoy_ratelimit_yaml(&limit).unwrap();
        assert!(yaml.starts_with("domain: bench\ndescriptors:\n"), "{yaml}");
        for key in ["user", "ip", "key"] {
            assert!(
                yaml.contains(&format!(
                    "  - key: {key}\n    rate_limit:\n      unit: hour\n      requests_per_unit: 1000\n"
                )),
                "{yaml}"
            );
        }
        assert!(
            !yaml.contains("burst") && !yaml.contains("algorithm"),
            "{yaml}"
        );
    }
}
