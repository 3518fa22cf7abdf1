//! Starting each system under test (a node, a node behind its RLS front, the Redis baselines,
//! the peers) and connecting every gateway worker's target to it, all with the same limit.

use anyhow::Context;
use floodgate::region::Scope;

use super::args::bench_limit;
use super::{Gateway, LoadArgs, Server, Target, Targets, peers, process, start_redis};

/// Starts a node with its data (and dev certificates) in `out/data_dir` and connects the
/// floodgate target of every gateway worker to it.
pub(super) async fn start_floodgate_node(
    args: &LoadArgs,
    gateway: &Gateway,
    data_dir: &str,
) -> anyhow::Result<(Server, Targets)> {
    let data_dir = args.out.join(data_dir);
    let server = process::start_node(&args.node_binary(), &data_dir, args.node_threads, None)?;
    let (addr, ca, limit) = (server.addr, data_dir.join("ca.pem"), args.floodgate_limit());
    let target = gateway
        .connect(|| {
            let ca = ca.clone();
            async move { Target::floodgate(addr, &ca, limit).await }
        })
        .await?;
    Ok((server, target))
}

/// Starts a cluster of `args.cluster_nodes` nodes (one runtime thread each, data in
/// `out/data_dir`), every one seeded at the first, and connects the `floodgate-cluster`
/// target of every gateway worker to it once every node owns slots. The returned server's CPU
/// and memory are the nodes' summed.
pub(super) async fn start_floodgate_cluster(
    args: &LoadArgs,
    gateway: &Gateway,
    data_dir: &str,
) -> anyhow::Result<(Server, Targets)> {
    let data_dir = args.out.join(data_dir);
    let (server, _) = start_cluster_nodes(args, &data_dir, None)?;
    let (addr, ca, count) = (server.addr, data_dir.join("ca.pem"), args.cluster_nodes);
    let limit = args.floodgate_limit();
    let target = gateway
        .connect(|| {
            let ca = ca.clone();
            async move { Target::floodgate_cluster(addr, &ca, limit, count).await }
        })
        .await?;
    Ok((server, target))
}

/// Starts `args.cluster_nodes` nodes in `data_dir`, one runtime thread each, every one seeded
/// at the first, each serving the RLS configuration `rls` on a listener of its own if given.
/// Returns them as one server (the first, the others its companions) and the RLS listeners.
fn start_cluster_nodes(
    args: &LoadArgs,
    data_dir: &std::path::Path,
    rls: Option<&std::path::Path>,
) -> anyhow::Result<(Server, Vec<std::net::SocketAddr>)> {
    let binary = args.node_binary();
    let mut nodes: Vec<Server> = Vec::with_capacity(args.cluster_nodes);
    let mut listens = Vec::new();
    for _ in 0..args.cluster_nodes {
        let seeds = match nodes.first() {
            Some(first) => vec!["--seeds".to_owned(), first.addr.to_string()],
            None => Vec::new(),
        };
        let front = match rls {
            Some(config) => Some((config, process::free_tcp_addr()?)),
            None => None,
        };
        listens.extend(front.map(|(_, listen)| listen));
        nodes.push(process::start_node_with(
            &binary,
            data_dir,
            Some(args.cluster_node_threads),
            front,
            &seeds,
        )?);
    }
    let mut nodes = nodes.into_iter();
    let first = nodes.next().context("a cluster needs at least one node")?;
    Ok((first.with(nodes.collect()), listens))
}

/// Starts two regions of one node each (`--region a`, then `--region b` seeded at `a`; one
/// runtime thread each, as a cluster's nodes, data in `out/data_dir`) and connects every
/// gateway worker's target to region `a`'s node, every check of `scope`, once that node knows
/// region `b`'s. The returned server is `a`'s node, with `b`'s as its companion: their CPU and
/// memory summed, `a`'s alone beside it.
pub(super) async fn start_floodgate_regions(
    args: &LoadArgs,
    gateway: &Gateway,
    data_dir: &str,
    scope: Scope,
) -> anyhow::Result<(Server, Targets)> {
    let (binary, data_dir) = (args.node_binary(), args.out.join(data_dir));
    let threads = Some(args.cluster_node_threads);
    let region = |name: &str| vec!["--region".to_owned(), name.to_owned()];
    let a = process::start_node_with(&binary, &data_dir, threads, None, &region("a"))?;
    let seeded = [region("b"), vec!["--seeds".to_owned(), a.addr.to_string()]].concat();
    let b = process::start_node_with(&binary, &data_dir, threads, None, &seeded)?;
    let (addr, ca, limit) = (a.addr, data_dir.join("ca.pem"), args.floodgate_limit());
    let server = a.with(vec![b]);
    let target = gateway
        .connect(|| {
            let (ca, scope) = (ca.clone(), scope.clone());
            async move { Target::floodgate_regions(addr, &ca, limit, scope).await }
        })
        .await?;
    Ok((server, target))
}

/// Writes the RLS configuration ([`LoadArgs::rls_config_yaml`]: envoyproxy/ratelimit's own file
/// unless `--algorithm` names another), starts a node serving it on a free port, and connects
/// the RLS target.
pub(super) async fn start_rls_node(
    args: &LoadArgs,
    gateway: &Gateway,
) -> anyhow::Result<(Server, Targets)> {
    let config = write_rls_config(args)?;
    let listen = process::free_tcp_addr()?;
    let data_dir = args.out.join("rls-node-data");
    let server = process::start_node(
        &args.node_binary(),
        &data_dir,
        args.node_threads,
        Some((&config, listen)),
    )?;
    let channels = args.rls_channels;
    let target = gateway
        .connect(|| Target::rls(vec![listen], channels))
        .await?;
    Ok((server, target))
}

/// [`start_rls_node`] on a cluster of `args.cluster_nodes` nodes (as [`start_floodgate_cluster`]
/// starts them), each serving the RLS configuration; the RLS target's connections are spread
/// over every node's listener once every node owns slots.
pub(super) async fn start_rls_cluster(
    args: &LoadArgs,
    gateway: &Gateway,
) -> anyhow::Result<(Server, Targets)> {
    let config = write_rls_config(args)?;
    let data_dir = args.out.join("rls-cluster-data");
    let (server, listens) = start_cluster_nodes(args, &data_dir, Some(&config))?;
    super::target::await_cluster(server.addr, &data_dir.join("ca.pem"), args.cluster_nodes).await?;
    let channels = args.rls_channels;
    let target = gateway
        .connect(|| Target::rls(listens.clone(), channels))
        .await?;
    Ok((server, target))
}

/// Writes the RLS configuration to `out/rls.yaml` and returns its path.
fn write_rls_config(args: &LoadArgs) -> anyhow::Result<std::path::PathBuf> {
    let config = args.out.join("rls.yaml");
    std::fs::write(&config, args.rls_config_yaml()?)
        .with_context(|| format!("writing {}", config.display()))?;
    Ok(config)
}

/// Starts a Gubernator cluster and connects the target of every gateway worker to all its
/// nodes, as many HTTP/2 channels to each as `--rls-channels` gives the RLS listener.
pub(super) async fn start_gubernator(
    args: &LoadArgs,
    gateway: &Gateway,
) -> anyhow::Result<(Server, Targets)> {
    let (server, nodes) = peers::start_gubernator(
        &args.gubernator_binary(),
        &args.out.join("gubernator"),
        peers::GUBERNATOR_NODES,
        args.keys,
    )
    .await?;
    let per_node = args.rls_channels.div_ceil(nodes.len()).max(1);
    let target = gateway
        .connect(|| {
            let nodes = nodes.clone();
            async move { Target::gubernator(&nodes, per_node, bench_limit()).await }
        })
        .await?;
    Ok((server, target))
}

/// Starts envoyproxy/ratelimit over its own redis-server and connects its RLS target.
pub(super) async fn start_envoy_ratelimit(
    args: &LoadArgs,
    gateway: &Gateway,
) -> anyhow::Result<(Server, Targets)> {
    let (server, listen) = peers::start_envoy_ratelimit(
        &args.envoy_ratelimit_binary(),
        &args.out.join("envoy-ratelimit"),
        &bench_limit(),
    )?;
    let channels = args.rls_channels;
    let target = gateway
        .connect(|| Target::envoy_ratelimit(listen, channels))
        .await?;
    Ok((server, target))
}

/// Starts redis-server (with the redis-cell module if given) and connects the target of every
/// gateway worker to it, `connections` each.
pub(super) async fn start_redis_baseline(
    gateway: &Gateway,
    module: Option<&std::path::Path>,
    connections: usize,
) -> anyhow::Result<(Server, Targets)> {
    let server = start_redis(module)?;
    let addr = server.addr;
    let cell = module.is_some();
    let target = gateway
        .connect(|| async move {
            if cell {
                Target::redis_cell(addr, connections, bench_limit()).await
            } else {
                Target::redis(addr, connections, bench_limit()).await
            }
        })
        .await?;
    Ok((server, target))
}
