//! The flags of `floodgate-bench load`, and the duration and rate syntax they take.

use std::path::PathBuf;
use std::time::Duration;

use floodgate::{Algorithm, Limit, NANOS_PER_SEC};

use super::gateway::GatewayShape;
use super::workload::{KeySpread, Workload};
use super::{default_redis_cell_module, peers, process};

#[derive(Debug, Clone, clap::Args)]
pub struct LoadArgs {
    /// How long each closed-loop run and each open-loop step lasts (e.g. 500ms, 4s; at most
    /// 10min).
    #[arg(long, default_value = "4s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Open-loop arrival rates, in increasing order (e.g. 10000/s, 600000/min; at least 1/s);
    /// repeat the flag or separate with commas. A system stops climbing once it saturates.
    #[arg(
        long,
        value_delimiter = ',',
        value_parser = parse_rate_per_second,
        default_value = "10000/s,50000/s,100000/s,200000/s,400000/s,800000/s"
    )]
    pub rates: Vec<u64>,
    /// Concurrent callers in the closed loop.
    #[arg(long, default_value_t = 512)]
    pub callers: usize,
    /// Size of the key space (and keys loaded for the memory measurement).
    #[arg(long, default_value_t = 1_000_000)]
    pub keys: u64,
    /// Key spreads to run, each with 1 check per request (repeat the flag or separate with
    /// commas); `--three-checks` adds uniform/3-check. `hot-leased` runs only on floodgate: one
    /// key through a client with token leases on.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "uniform,zipf,hot,hot-leased"
    )]
    pub spreads: Vec<KeySpread>,
    /// Also run requests of 3 checks (user + IP + API key) over the uniform spread.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub three_checks: bool,
    /// The algorithm of floodgate's limit (1,000 an hour): `gcra` (a burst of 1,000),
    /// `fixed-window` (the RLS front's default), `sliding-window` or `sliding-log`, for the node,
    /// the cluster and the regions; any but `gcra` also for the RLS front's rules, which by
    /// default are envoyproxy/ratelimit's own file (fixed windows of 1,000 an hour). Redis's
    /// script, redis-cell and Gubernator enforce a token bucket, so any but `gcra` needs
    /// `--no-redis --no-peers`: floodgate is then measured beside itself.
    #[arg(long, default_value = "gcra")]
    pub algorithm: Algorithm,
    /// Skip both Redis baselines.
    #[arg(long)]
    pub no_redis: bool,
    /// Skip `floodgate+rls` (a node started with `--rls-config`, driven through Envoy's RLS v3
    /// gRPC API); it is also skipped with `--seeds`.
    #[arg(long)]
    pub no_rls: bool,
    /// Skip the peers (Gubernator and envoyproxy/ratelimit).
    #[arg(long)]
    pub no_peers: bool,
    /// Keys loaded into each peer to measure its bytes per key (at most `--keys`): the peers
    /// take a few thousand checks a second here, so a million would take minutes.
    #[arg(long, default_value_t = 100_000)]
    pub peer_keys: u64,
    /// The gubernator binary (default: target/gubernator/bin/, where `bench/go-peer.sh
    /// gubernator` installs it); when missing, that peer is skipped.
    #[arg(long)]
    pub gubernator_bin: Option<PathBuf>,
    /// envoyproxy/ratelimit's binary (default: target/envoy-ratelimit/bin/service_cmd, where
    /// `bench/go-peer.sh envoy-ratelimit` installs it); when missing, that peer is skipped. It
    /// runs only where `floodgate+rls` does, which it is compared with.
    #[arg(long)]
    pub envoy_ratelimit_bin: Option<PathBuf>,
    /// HTTP/2 channels to the RLS listener per gateway thread; its calls are spread over them.
    #[arg(long, default_value_t = 4)]
    pub rls_channels: usize,
    /// The redis-cell module for the `redis+cell` baseline (default: target/redis-cell/, where
    /// `bench/redis-cell.sh` builds it); when missing, that baseline is skipped.
    #[arg(long)]
    pub redis_cell: Option<PathBuf>,
    /// Multiplexed (pipelining) Redis connections per gateway thread; its calls are spread over
    /// them. One measured best here (bench/RESULTS.md: of 1-16 in one shared runtime, of 1 and
    /// 2 per thread): redis-server is one thread, and few pipelined connections hand it the
    /// largest batches.
    #[arg(long, default_value_t = 1)]
    pub redis_connections: usize,
    /// The floodgate-node binary to start (default: beside this binary).
    #[arg(long)]
    pub node_bin: Option<PathBuf>,
    /// Measure a running cluster instead of starting a node: the nodes to start from, HOST:PORT
    /// with an IP address or a DNS name (repeat the flag or separate with commas; the first is
    /// used). Server CPU and memory are then not measured.
    #[arg(long, value_delimiter = ',', requires = "ca")]
    pub seeds: Vec<floodgate_client::HostPort>,
    /// CA certificate of the `--seeds`.
    #[arg(long)]
    pub ca: Option<PathBuf>,
    /// Runtime threads of the node started (default: its own, half the cores).
    #[arg(long)]
    pub node_threads: Option<usize>,
    /// Nodes of the `floodgate-cluster` system, a cluster started on this machine whose keys
    /// are spread over all its owners (0 or 1: skip it; it is also skipped with `--seeds`).
    #[arg(long, default_value_t = 3)]
    pub cluster_nodes: usize,
    /// Runtime threads of each node of `floodgate-cluster` and of the two regions' systems
    /// (the same cores serve them all).
    #[arg(long, default_value_t = 1)]
    pub cluster_node_threads: usize,
    /// Skip the two regions' systems (`floodgate-regions-region-scope` and
    /// `floodgate-regions-global-scope`: a node per region on this machine, the uniform
    /// 1-check workload sent to region a's node with every check of scope `region`, then
    /// `global`); they are also skipped with `--seeds`, and when `--spreads` has no `uniform`.
    #[arg(long)]
    pub no_regions: bool,
    /// Threads of the gateway this process plays, which run the load generator and every
    /// system's clients (default: one per core).
    #[arg(long)]
    pub client_threads: Option<usize>,
    /// How the gateway runs: `thread-per-core` (a runtime and clients of its own per thread,
    /// like Envoy's workers) or `multi-thread` (one work-stealing runtime, one shared client
    /// per system). Every system is driven through the same shape.
    #[arg(long, value_enum, default_value = "thread-per-core")]
    pub gateway: GatewayShape,
    /// Whole runs, one after another (each run's reports in `out/run-K` when more than one):
    /// the targets are then judged on each figure's median over the runs, with its spread.
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
    /// Where report.json and latency.svg go.
    #[arg(long, default_value = "target/bench")]
    pub out: PathBuf,
    /// Run only the side-by-side step (every system at the first rate, in turns of 50 ms):
    /// the quick way to compare tails at low load, repeated, on a noisy machine. Floodgate is set
    /// beside Redis there, so not with `--no-redis` or `--seeds`.
    #[arg(long)]
    pub only_side_by_side: bool,
    /// No progress bar (for logs and CI).
    #[arg(long)]
    pub quiet: bool,
}

/// The limit every check uses on every system (floodgate's under `--algorithm`,
/// [`LoadArgs::floodgate_limit`]): 1,000 per hour with a burst of 1,000, so keys stay live (and
/// in memory) for the whole run on every side.
pub(super) fn bench_limit() -> Limit {
    // Valid by construction: rate, period and burst are in range.
    Limit::gcra(1_000, 3_600 * NANOS_PER_SEC, 1_000).unwrap_or_else(|_| unreachable!("valid limit"))
}

impl LoadArgs {
    /// The flags that cannot go together, refused before anything starts.
    pub(super) fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.algorithm == Algorithm::Gcra || (self.no_redis && !self.with_peers()),
            "--algorithm {} is floodgate's alone (the baselines and peers enforce a token \
             bucket): add --no-redis --no-peers",
            self.algorithm
        );
        Ok(())
    }

    /// The limit of every floodgate check (the node, the cluster, the regions): the
    /// baselines' 1,000 an hour, under `--algorithm`.
    pub(super) fn floodgate_limit(&self) -> Limit {
        match self.algorithm {
            Algorithm::Gcra => bench_limit(),
            // Valid by construction: 1,000 is within every window's and the log's range.
            window => Limit::window(window, 1_000, 3_600 * NANOS_PER_SEC)
                .unwrap_or_else(|_| unreachable!("valid limit")),
        }
    }

    /// The RLS front's configuration. By default envoyproxy/ratelimit's own file, which counts
    /// each descriptor in a fixed window per unit (its only algorithm, and the front's default):
    /// `floodgate+rls` and `envoy-ratelimit` then enforce the same limit read from the same
    /// text, as an Envoy user moving between them would run them. Under `--algorithm` (a window
    /// or the log), floodgate's limit with that algorithm.
    pub(super) fn rls_config_yaml(&self) -> anyhow::Result<String> {
        match self.algorithm {
            Algorithm::Gcra => super::peers::envoy_ratelimit_yaml(&bench_limit()),
            _ => super::rls::config_yaml(&self.floodgate_limit()),
        }
    }

    /// Whether `floodgate-cluster` runs.
    pub(super) fn with_cluster(&self) -> bool {
        self.cluster_nodes >= 2 && self.seeds.is_empty()
    }

    /// Whether the two regions' systems run.
    pub(super) fn with_regions(&self) -> bool {
        !self.no_regions && self.seeds.is_empty() && self.spreads.contains(&KeySpread::Uniform)
    }

    /// The floodgate-node binary to start.
    pub(super) fn node_binary(&self) -> PathBuf {
        self.node_bin
            .clone()
            .unwrap_or_else(process::default_node_binary)
    }

    /// Whether `floodgate+rls` runs: not with `--no-rls`, nor against a running cluster.
    pub(super) fn with_rls(&self) -> bool {
        !self.no_rls && self.seeds.is_empty()
    }

    /// Whether the peers run: not with `--no-peers`, nor against a running cluster.
    pub(super) fn with_peers(&self) -> bool {
        !self.no_peers && self.seeds.is_empty()
    }

    pub(super) fn gubernator_binary(&self) -> PathBuf {
        self.gubernator_bin
            .clone()
            .unwrap_or_else(|| peers::default_binary("gubernator", "gubernator"))
    }

    pub(super) fn envoy_ratelimit_binary(&self) -> PathBuf {
        self.envoy_ratelimit_bin
            .clone()
            .unwrap_or_else(|| peers::default_binary("envoy-ratelimit", "service_cmd"))
    }

    /// The redis-cell module for the `redis+cell` baseline.
    pub(super) fn redis_cell_module(&self) -> PathBuf {
        self.redis_cell
            .clone()
            .unwrap_or_else(default_redis_cell_module)
    }

    pub(super) fn workloads(&self) -> Vec<Workload> {
        let mut list: Vec<Workload> = self
            .spreads
            .iter()
            .map(|&spread| Workload {
                spread,
                checks_per_request: 1,
            })
            .collect();
        if self.three_checks {
            list.push(Workload {
                spread: KeySpread::Uniform,
                checks_per_request: 3,
            });
        }
        list
    }
}

/// Longest `--duration`: every loop of a run stays bounded in time.
pub(super) const MAX_STEP: Duration = Duration::from_secs(600);
/// Most whole runs one command makes (each takes many minutes).
pub(super) const MAX_RUNS: usize = 9;

/// `--duration`: the core's duration syntax (`500ms`, `4s`, `1.5min`); a bare number is refused.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    floodgate::parse_duration_ns(text)
        .map(Duration::from_nanos)
        .map_err(|e| e.to_string())
}

/// `--rates`: the core's rate syntax (`10000/s`, `5/10s`), as whole requests per second.
pub fn parse_rate_per_second(text: &str) -> Result<u64, String> {
    let (count, period_ns) = floodgate::parse_rate(text).map_err(|e| e.to_string())?;
    let per_second = u128::from(count) * u128::from(NANOS_PER_SEC) / u128::from(period_ns.max(1));
    match u64::try_from(per_second) {
        Ok(rate) if rate >= 1 => Ok(rate),
        _ => Err(format!(
            "`{text}`: an arrival rate must be between 1/s and {}/s",
            u64::MAX
        )),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        load: LoadArgs,
    }

    fn parse(args: &[&str]) -> Result<LoadArgs, clap::Error> {
        Cli::try_parse_from(["load"].iter().chain(args)).map(|c| c.load)
    }

    #[test]
    fn durations_and_rates_use_the_core_syntax() {
        let args = parse(&["--duration", "500ms", "--rates", "10/s,600/min,50/10s"]).unwrap();
        assert_eq!(args.duration, Duration::from_millis(500));
        assert_eq!(args.rates, [10, 10, 5]);
        let defaults = parse(&[]).unwrap();
        assert_eq!(defaults.duration, Duration::from_secs(4));
        assert_eq!(defaults.rates[0], 10_000);
    }

    #[test]
    fn bare_numbers_and_rates_under_one_per_second_are_refused() {
        for bad in [
            &["--duration", "4"][..],
            &["--seconds", "4"],
            &["--rates", "500"],
            &["--rates", "1/min"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} parsed");
        }
        let err = parse(&["--rates", "1/min"]).unwrap_err().to_string();
        assert!(err.contains("between 1/s"), "{err}");
    }

    #[test]
    fn list_flags_take_repeated_or_comma_separated_values_alike() {
        let ca = ["--ca", "ca.pem"];
        let joined =
            parse(&[&ca[..], &["--seeds", "127.0.0.1:7100,127.0.0.1:7101"]].concat()).unwrap();
        let repeated = parse(
            &[
                &ca[..],
                &["--seeds", "127.0.0.1:7100", "--seeds", "127.0.0.1:7101"],
            ]
            .concat(),
        )
        .unwrap();
        assert_eq!(joined.seeds, repeated.seeds);
        assert_eq!(joined.seeds.len(), 2);
        let rates = parse(&["--rates", "1/s", "--rates", "2/s,3/s"]).unwrap();
        assert_eq!(rates.rates, [1, 2, 3]);
        let spreads = parse(&["--spreads", "uniform", "--spreads", "zipf,hot"]).unwrap();
        assert_eq!(spreads.spreads.len(), 3);
        let defaults = parse(&[]).unwrap();
        assert!(defaults.spreads.contains(&KeySpread::HotLeased));
        // The old name is gone.
        assert!(parse(&[&ca[..], &["--nodes", "127.0.0.1:7100"]].concat()).is_err());
    }

    #[test]
    fn seeds_may_be_host_names_and_need_a_port() {
        let ca = ["--ca", "ca.pem"];
        let named =
            parse(&[&ca[..], &["--seeds", "localhost:7100,fg-1.fg:7100"]].concat()).unwrap();
        let seeds: Vec<String> = named.seeds.iter().map(ToString::to_string).collect();
        assert_eq!(seeds, ["localhost:7100", "fg-1.fg:7100"]);
        let err = parse(&[&ca[..], &["--seeds", "localhost"]].concat())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--seeds") && err.contains("has no port"),
            "{err}"
        );
    }

    /// By default the RLS front reads envoyproxy/ratelimit's own file, as fixed windows of
    /// 1,000 an hour per descriptor value; `--algorithm` gives it floodgate's algorithm.
    #[test]
    fn the_rls_front_reads_envoy_ratelimits_file_unless_an_algorithm_is_named() {
        use floodgate::rls::RlsConfig;
        let defaults = parse(&[]).unwrap();
        let yaml = defaults.rls_config_yaml().unwrap();
        assert_eq!(
            yaml,
            super::super::peers::envoy_ratelimit_yaml(&bench_limit()).unwrap()
        );
        let window = Limit::window(Algorithm::FixedWindow, 1_000, 3_600 * NANOS_PER_SEC).unwrap();
        let config = RlsConfig::from_files([("bench.yaml", yaml.as_str())]).unwrap();
        for key in super::super::rls::DESCRIPTOR_KEYS {
            let rule = config
                .find(super::super::rls::DOMAIN, &[(key, "7")])
                .unwrap();
            assert_eq!(rule.counted.as_ref().unwrap().limit, window, "{key}");
        }
        let log = parse(&["--algorithm", "sliding-log"]).unwrap();
        let config =
            RlsConfig::from_files([("bench.yaml", log.rls_config_yaml().unwrap().as_str())])
                .unwrap();
        let rule = config
            .find(super::super::rls::DOMAIN, &[("user", "7")])
            .unwrap();
        assert_eq!(rule.counted.as_ref().unwrap().limit, log.floodgate_limit());
    }
}
