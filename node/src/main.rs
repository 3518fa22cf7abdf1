//! `floodgate-node`: parses flags, starts a node, reloads its certificates on SIGHUP, and stops it
//! gracefully on SIGINT or SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Parser;
use floodgate::StoreConfig;
use std::time::Duration;

use floodgate::cluster::MembershipConfig;
use floodgate_node::{
    ClusterConfig, HostPort, Node, NodeConfig, NodeLimits, TlsConfig, ensure_dev_certs,
};

mod logging;
mod scheduling;
use logging::LogFormat;
use scheduling::Scheduling;

/// jemalloc instead of glibc's allocator. A call through the RLS front allocates its decision's
/// future (several KB, past glibc's per-thread cache) beside many small buffers, and glibc
/// spent about a fifth of a cluster front's samples consolidating and searching its bins;
/// jemalloc's size classes serve both from per-thread caches.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read once as it starts. Blocks over 64 KiB (the store's shard tables,
/// whole frames) come from its arena for large blocks, which gives pages back as soon as they
/// are freed: jemalloc otherwise keeps freed pages for about ten seconds, and a table given up
/// as the store resizes or evicts would count in the node's resident memory meanwhile, past
/// what `--max-store-bytes` promises.
#[cfg(not(target_env = "msvc"))]
#[allow(unsafe_code, non_upper_case_globals)]
// SAFETY: the symbol jemalloc reads its options from (`malloc_conf`, prefixed as
// tikv-jemalloc-sys builds it): a pointer to a NUL-terminated string that lives as long as the
// process and is never written.
#[unsafe(export_name = "_rjem_malloc_conf")]
static malloc_conf: Option<&'static std::ffi::c_char> =
    Some(unsafe { &*c"oversize_threshold:65536".as_ptr() });

/// A floodgate limiter node: answers batched rate-limit checks over QUIC (TLS 1.3, ALPN
/// floodgate/1).
/// `--version`: the release and the protocol versions it speaks (what an upgrade must share
/// with the build that runs now).
static VERSION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "{} (protocol versions {})",
        env!("CARGO_PKG_VERSION"),
        floodgate::protocol::SUPPORTED
    )
});

#[derive(Debug, Parser)]
#[command(name = "floodgate-node", version = VERSION.as_str())]
struct Flags {
    /// UDP address for the QUIC endpoint, HOST:PORT (a name is resolved once, at start).
    #[arg(long, default_value = "127.0.0.1:7100")]
    listen: HostPort,
    /// TCP address of the admin HTTP server (/metrics, /healthz, /readyz), HOST:PORT or `off`.
    /// Loopback unless you give another address.
    #[arg(long, default_value = "127.0.0.1:9100")]
    admin: String,
    /// Development mode: create (once) and use certificates in DIR: a peer CA (ca.pem) signing
    /// node certificates (node-ID.pem per --node-id, else node.pem), and a separate client CA
    /// (client-ca.pem) signing client.pem. Nodes may share one DIR.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// The node's certificate chain (PEM); overrides the one in --data-dir.
    #[arg(long, requires = "key")]
    cert: Option<PathBuf>,
    /// The node's private key (PEM).
    #[arg(long, requires = "cert")]
    key: Option<PathBuf>,
    /// Require client certificates signed by this CA (mutual TLS). They never make a client a
    /// peer: only node certificates from --peer-ca do.
    #[arg(long, value_name = "PEM")]
    client_ca: Option<PathBuf>,
    /// Largest frame payload accepted, in bytes.
    #[arg(long, default_value_t = NodeLimits::default().max_frame_bytes)]
    max_frame_bytes: usize,
    /// Most checks in one frame.
    #[arg(long, default_value_t = NodeLimits::default().max_batch)]
    max_batch: usize,
    /// Longest key accepted, in bytes.
    #[arg(long, default_value_t = NodeLimits::default().max_key_bytes)]
    max_key_bytes: usize,
    /// Most concurrent client connections.
    #[arg(long, default_value_t = NodeLimits::default().max_connections)]
    max_connections: usize,
    /// Most concurrent peer connections, counted apart from clients.
    #[arg(long, default_value_t = NodeLimits::default().max_peer_connections)]
    max_peer_connections: usize,
    /// Most bytes buffered for all streams together (partial frames, peer messages, answers
    /// not yet written).
    #[arg(long, default_value_t = NodeLimits::default().max_buffered_bytes)]
    max_buffered_bytes: usize,
    /// Most concurrency leases held at once (all keys, replicas included); beyond it an
    /// acquire is answered `store_full`.
    #[arg(long, default_value_t = NodeLimits::default().max_leases)]
    max_leases: usize,
    /// Most buckets held at once; beyond it, buckets are evicted (unused, then least consumed,
    /// denying ones last).
    #[arg(long, default_value_t = StoreConfig::default().max_keys)]
    max_keys: usize,
    /// Most bytes of state (a number, or with KiB, MiB or GiB): buckets get 7/8 and evict past
    /// it (a sliding log costs 8 bytes per unit of its limit), concurrency leases 1/8 (fewer
    /// than --max-leases if those would cost more). A fixed default, not a share of the
    /// machine: a container's memory limit is not what the machine reports.
    #[arg(long, default_value = "1GiB", value_parser = parse_bytes)]
    max_store_bytes: usize,
    /// Longest period a caller's limit may have (up to 366d); longer is refused as
    /// `invalid_limit`. The default lets monthly (30-day) quotas through.
    #[arg(long, default_value = "31d", value_parser = parse_duration)]
    max_limit_period: Duration,
    /// Largest sliding-log limit a caller may ask for (1 to 1000): each unit keeps 8 bytes
    /// while in its period; larger is refused as `invalid_limit`.
    #[arg(long, default_value_t = NodeLimits::default().max_log_limit)]
    max_log_limit: u64,
    /// This node's id in the cluster: a DNS name its certificate carries (peers dial and verify
    /// it by this name). Default: its advertised address, verified by its IP.
    #[arg(long)]
    node_id: Option<String>,
    /// This node's region.
    #[arg(long, default_value = "local")]
    region: String,
    /// Members to join through, HOST:PORT (any subset of the cluster); repeat the flag or
    /// separate with commas. A name (say a headless service's) is resolved again each time the
    /// seed is dialed. With seeds, /readyz stays 503 until one of them answers.
    #[arg(long, value_delimiter = ',')]
    seeds: Vec<HostPort>,
    /// With --seeds: be ready (/readyz) even while no seed answers, serving alone. For a first
    /// node started from the same seed list as the rest, or when the others may come up later.
    #[arg(long)]
    allow_alone: bool,
    /// Address peers and clients reach this node at (default: --listen, which then must be a
    /// specific address, not 0.0.0.0 or ::). A name is resolved once, at start: the node is
    /// advertised by the address it resolves to.
    #[arg(long)]
    advertise: Option<HostPort>,
    /// CA of the other nodes' certificates (default with --data-dir: its ca.pem).
    #[arg(long, value_name = "PEM")]
    peer_ca: Option<PathBuf>,
    /// A member silent this long is suspect.
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    suspect_after: Duration,
    /// A member silent this long is dead and its slots move.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    dead_after: Duration,
    /// How often changed buckets are sent to each slot's successor.
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    sync_interval: Duration,
    /// How long a slot's successor waits for the owner's answer to a takeover it forwards (a
    /// gateway lost the owner, which this node still hears from) before answering `try_again`.
    /// Keep it below the gateways' check timeout less a round trip (default 3ms for 5ms).
    #[arg(long, default_value = "3ms", value_parser = parse_duration)]
    takeover_forward_timeout: Duration,
    /// How often the owner of a global key sends what it admitted to the key's owner in every
    /// other region (1ms to 10s).
    #[arg(long, default_value = "100ms", value_parser = parse_region_sync_interval)]
    region_sync_interval: Duration,
    /// Runtime worker threads (default: half the cores, at least one). Fewer workers than
    /// cores keep a request's hops (endpoint, connection, stream task) on one thread instead of
    /// waking another per hop: on 2 cores, one worker took 15-25% less CPU per check than two
    /// and served more checks per second (bench/RESULTS.md).
    #[arg(long)]
    worker_threads: Option<usize>,
    /// How the kernel schedules the node's threads: `batch` (Linux's SCHED_BATCH: a node woken
    /// by a datagram runs at once on an idle core but does not preempt a busy one, and then
    /// finds more frames per wake-up; kept only when started under the default policy) or
    /// `inherit` (the policy it was started with). With three nodes and their gateway on 2
    /// cores, batch served about 15% more checks per second at a fifth less node CPU per check
    /// (bench/RESULTS.md).
    #[arg(long, value_enum, default_value_t = Scheduling::Batch)]
    scheduling: Scheduling,
    /// The rules file: validated at start (errors name line and column), hot-reloaded when it
    /// changes (a bad edit is rejected and the old rules stay), and served to clients.
    #[arg(long, value_name = "FILE")]
    rules: Option<PathBuf>,
    /// Keep buckets of limits of an hour or more (daily quotas) across restarts: snapshotted to
    /// DIR every second when changed and on SIGTERM, loaded at start.
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Serve Envoy's rate limit service (RLS v3, gRPC over plaintext HTTP/2) and gRPC health on
    /// ADDR (default 127.0.0.1:8081 when --rls-config is given).
    #[arg(long, value_name = "ADDR")]
    rls_listen: Option<SocketAddr>,
    /// envoyproxy/ratelimit's configuration, unchanged: a YAML file or a directory of them;
    /// validated at start and hot-reloaded like --rules.
    #[arg(long, value_name = "PATH")]
    rls_config: Option<PathBuf>,
    /// Add the draft-10 `RateLimit-Policy` and `RateLimit` header fields to RLS answers.
    #[arg(long)]
    rls_rate_limit_headers: bool,
    /// Serve the RLS over TLS (1.3, or 1.2: the most a stock Envoy offers an upstream) with the
    /// node's certificate (--cert/--key, or --data-dir's).
    #[arg(long)]
    rls_tls: bool,
    /// With --rls-tls: require a client certificate signed by --client-ca from every RLS caller
    /// (Envoy's cluster then needs a TLS transport socket with that certificate).
    #[arg(long)]
    rls_client_auth: bool,
    /// Honour `is_negative_hits` in RLS descriptors (the hits are given back to the bucket).
    /// Off by default: anyone who can reach the listener could refill any key with them; a
    /// descriptor asking for them is refused with INVALID_ARGUMENT and nothing is counted.
    #[arg(long)]
    rls_allow_negative_hits: bool,
    /// Serve Envoy's rate limit quota service (RLQS, gRPC over plaintext HTTP/2) on ADDR: each
    /// Envoy streams its usage and gets a token bucket per bucket, a fair share of the limit
    /// --rls-config gives it (needs --rls-config).
    #[arg(long, value_name = "ADDR")]
    rlqs_listen: Option<SocketAddr>,
    /// How long an RLQS assignment binds an Envoy, in whole seconds; more than Envoy's 5 s
    /// report period (each report renews it). A vanished Envoy's share returns after it.
    #[arg(long, value_name = "SECONDS", default_value_t = 15)]
    rlqs_assignment_ttl: u32,
    /// Serve RLQS over TLS (1.3, or 1.2: the most a stock Envoy offers an upstream) with the
    /// node's certificate (--cert/--key, or --data-dir's).
    #[arg(long)]
    rlqs_tls: bool,
    /// With --rlqs-tls: require a client certificate signed by --client-ca from every Envoy.
    #[arg(long)]
    rlqs_client_auth: bool,
    /// An RLQS bucket reported this many times in a row with no requests is abandoned (the
    /// Envoy forgets it, its share returns to the others); 0: never.
    #[arg(long, value_name = "N", default_value_t = 120)]
    rlqs_idle_reports: u32,
    /// Share the limits of this RLQS domain's buckets across regions (`scope: global`): each
    /// region's Envoys get a part of the limit, by demand, instead of the whole. Repeat for
    /// more domains; give every node of every region the same list (an owner needs it whether
    /// or not it serves --rlqs-listen).
    #[arg(long, value_name = "DOMAIN")]
    rlqs_global_domain: Vec<String>,
    /// Serve the Redis protocol (RESP2, RESP3 after HELLO 3) on ADDR: redis-cell's
    /// `CL.THROTTLE key max_burst count period [quantity]` for any Redis client, decided by
    /// each key's owner in the cluster.
    #[arg(long, value_name = "ADDR")]
    resp_listen: Option<SocketAddr>,
    /// The password `AUTH` must give on --resp-listen (its first line; also
    /// FLOODGATE_RESP_PASSWORD in the environment). Never on the command line: argv is
    /// world-readable.
    #[arg(long, value_name = "FILE")]
    resp_password_file: Option<PathBuf>,
    /// What CL.THROTTLE answers when the key's owner cannot decide it: `closed` (an error
    /// reply) or `open` (allowed).
    #[arg(long, value_enum, default_value_t = RespFailure::Closed)]
    resp_failure_mode: RespFailure,
    /// Serve --resp-listen over TLS (1.3) with the node's certificate (--cert/--key, or
    /// --data-dir's); clients connect as to a Redis with TLS (`rediss://`).
    #[arg(long)]
    resp_tls: bool,
    /// With --resp-tls: require a client certificate signed by --client-ca from every caller.
    #[arg(long)]
    resp_client_auth: bool,
    /// Log lines as `text` or `json` (one object per line), on stderr; `RUST_LOG` filters them
    /// (default `info`).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// TEST ONLY, for the chaos harness: run this node's clock this many milliseconds ahead
    /// (negative: behind) of the system clock. Hidden from --help, and only in a binary built
    /// with the `test-hooks` feature (`make chaos` builds one): a release build refuses it.
    #[cfg(feature = "test-hooks")]
    #[arg(long, hide = true, default_value_t = 0, allow_hyphen_values = true)]
    test_only_clock_skew_ms: i64,
}

impl Flags {
    /// `--test-only-clock-skew-ms`, in a build that has it; 0 otherwise.
    fn clock_skew_ms(&self) -> i64 {
        #[cfg(feature = "test-hooks")]
        return self.test_only_clock_skew_ms;
        #[cfg(not(feature = "test-hooks"))]
        0
    }
}

/// Half the cores, at least one (see `--worker-threads`).
fn default_worker_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    (cores / 2).max(1)
}

fn main() -> ExitCode {
    let flags = Flags::parse();
    // Before any thread is started, so that every thread inherits it.
    let scheduling = scheduling::apply(flags.scheduling);
    logging::init(flags.log_format);
    tracing::info!("{scheduling}");
    let result = (|| {
        let mut runtime = tokio::runtime::Builder::new_multi_thread();
        if let Some(n) = flags.worker_threads {
            anyhow::ensure!(n >= 1, "--worker-threads must be at least 1");
        }
        runtime.worker_threads(flags.worker_threads.unwrap_or_else(default_worker_threads));
        runtime.enable_all().build()?.block_on(run(flags))
    })();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("floodgate-node: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn run(flags: Flags) -> anyhow::Result<()> {
    let addresses = Addresses::resolve(&flags).await?;
    let config = config_from(&flags, addresses)?;
    if flags.clock_skew_ms() != 0 {
        tracing::warn!(
            "TEST ONLY: this node's clock runs {} ms off the system clock",
            flags.clock_skew_ms()
        );
    }
    // Before anything says "serving": a signal from then on must find its handler.
    let signals = Signals::install()?;
    let node = Node::start(config).await?;
    let mut refusal = node.watch_refusal();
    if let Some(dir) = &flags.data_dir {
        eprintln!(
            "floodgate-node: serving on {} (CA for clients: {})",
            node.local_addr(),
            dir.join("ca.pem").display()
        );
    }
    tokio::select! {
        () = signals.wait(&node) => {}
        refused = refusal.wait_for(Option::is_some) => {
            // The id is another node's: leave nothing behind (no leave, no hand-off, no
            // snapshot), and exit 2 like any other setup mistake.
            let reason = refused.ok().and_then(|r| r.clone()).unwrap_or_default();
            node.crash();
            bail!("refused by the cluster: {reason}");
        }
    }
    tracing::info!("signal received: draining and stopping");
    node.shutdown().await;
    Ok(())
}

/// Refuses an address peers and clients could not reach: the unspecified address (0.0.0.0 or
/// ::) binds every interface but names none, and port 0 is not a port. `--listen` may use
/// port 0 (the bound port is advertised), not an unspecified address unless `--advertise` says
/// where the node is reached.
fn check_advertised(listen: SocketAddr, advertise: Option<SocketAddr>) -> anyhow::Result<()> {
    match advertise {
        Some(addr) => {
            anyhow::ensure!(
                !addr.ip().is_unspecified() && addr.port() != 0,
                "--advertise {addr}: give the address peers and clients reach this node at \
                 (a specific IP and a port, not 0.0.0.0, :: or port 0)"
            );
        }
        None => {
            anyhow::ensure!(
                !listen.ip().is_unspecified(),
                "--listen {listen} binds every interface, so it cannot be the address other \
                 nodes and clients use: add --advertise HOST:PORT (this node's reachable address)"
            );
        }
    }
    Ok(())
}

/// Longest a flag's host name may take to resolve at start.
const RESOLVE_AT_START: Duration = Duration::from_secs(5);

/// The address flags, names resolved once at start (IPv4 first). Seeds are not here: a seed's
/// name is resolved each time it is dialed.
struct Addresses {
    listen: SocketAddr,
    admin: Option<SocketAddr>,
    advertise: Option<SocketAddr>,
}

impl Addresses {
    async fn resolve(flags: &Flags) -> anyhow::Result<Self> {
        let resolve = |flag: &'static str, value: HostPort| async move {
            floodgate_node::address::resolve_first(&value, RESOLVE_AT_START)
                .await
                .map_err(|e| anyhow::anyhow!("--{flag} {value}: {e}"))
        };
        let admin = match flags.admin.as_str() {
            "off" => None,
            text => {
                let value = text
                    .parse::<HostPort>()
                    .map_err(|e| anyhow::anyhow!("--admin {text}: {e}, or off"))?;
                Some(resolve("admin", value).await?)
            }
        };
        let advertise = match &flags.advertise {
            Some(value) => Some(resolve("advertise", value.clone()).await?),
            None => None,
        };
        Ok(Addresses {
            listen: resolve("listen", flags.listen.clone()).await?,
            admin,
            advertise,
        })
    }
}

fn config_from(flags: &Flags, addresses: Addresses) -> anyhow::Result<NodeConfig> {
    let Addresses {
        listen,
        admin,
        advertise,
    } = addresses;
    let tls = tls_config(flags)?;
    let limits = NodeLimits {
        max_frame_bytes: flags.max_frame_bytes,
        max_batch: flags.max_batch,
        max_key_bytes: flags.max_key_bytes,
        max_connections: flags.max_connections,
        max_peer_connections: flags.max_peer_connections,
        max_buffered_bytes: flags.max_buffered_bytes,
        max_leases: flags.max_leases,
        max_store_bytes: flags.max_store_bytes,
        max_limit_period: flags.max_limit_period,
        max_log_limit: flags.max_log_limit,
        ..NodeLimits::default()
    };
    limits.validate()?;
    let store = StoreConfig {
        max_keys: flags.max_keys,
        ..StoreConfig::default()
    };
    let cluster = cluster_config(flags, &tls, listen, advertise)?;
    anyhow::ensure!(
        flags.clock_skew_ms().unsigned_abs() <= 3_600_000,
        "--test-only-clock-skew-ms must be within one hour (3600000)"
    );
    let rls = rls_settings(flags)?;
    if let Some(rls) = &rls {
        rls.validate(&tls)?;
    }
    let rlqs = rlqs_settings(flags, rls.is_some(), &tls)?;
    Ok(NodeConfig {
        listen,
        admin,
        tls,
        limits,
        store,
        cluster,
        rules: flags.rules.clone(),
        state_dir: flags.state_dir.clone(),
        rls,
        rlqs,
        rlqs_global_domains: rlqs_global_domains(flags)?,
        resp: resp_settings(flags)?,
        test_only_clock_skew_ns: flags.clock_skew_ms() * 1_000_000,
    })
}

/// `--cert` and `--key`, or development certificates in `--data-dir` (for `--node-id` when
/// given).
fn tls_config(flags: &Flags) -> anyhow::Result<TlsConfig> {
    Ok(match (&flags.cert, &flags.key, &flags.data_dir) {
        (Some(cert), Some(key), _) => TlsConfig {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: flags.client_ca.clone(),
            peer_ca: flags.peer_ca.clone(),
        },
        (_, _, Some(dir)) => {
            let dev = ensure_dev_certs(dir)?;
            let (cert, key) = match &flags.node_id {
                Some(id) => dev.node_cert_for(id).context("--node-id")?,
                None => (dev.node_cert.clone(), dev.node_key.clone()),
            };
            TlsConfig {
                cert,
                key,
                client_ca: flags.client_ca.clone(),
                peer_ca: Some(flags.peer_ca.clone().unwrap_or(dev.ca)),
            }
        }
        _ => bail!("give --data-dir DIR (development certificates) or --cert and --key"),
    })
}

/// The cluster flags: seeds, the advertised address, the failure detector's times.
fn cluster_config(
    flags: &Flags,
    tls: &TlsConfig,
    listen: SocketAddr,
    advertise: Option<SocketAddr>,
) -> anyhow::Result<ClusterConfig> {
    anyhow::ensure!(
        flags.seeds.is_empty() || tls.peer_ca.is_some(),
        "--seeds needs --peer-ca (or --data-dir) to verify the other nodes"
    );
    check_advertised(listen, advertise)?;
    anyhow::ensure!(
        flags.dead_after > flags.suspect_after,
        "--dead-after must be longer than --suspect-after"
    );
    anyhow::ensure!(
        !flags.takeover_forward_timeout.is_zero()
            && flags.takeover_forward_timeout < flags.suspect_after,
        "--takeover-forward-timeout must be more than zero and shorter than --suspect-after"
    );
    let membership = MembershipConfig {
        suspect_after_ns: nanos(flags.suspect_after),
        dead_after_ns: nanos(flags.dead_after),
        ..MembershipConfig::default()
    };
    Ok(ClusterConfig {
        node_id: flags.node_id.clone(),
        region: flags.region.clone(),
        advertise,
        seeds: flags.seeds.clone(),
        membership,
        sync_interval: flags.sync_interval,
        region_sync_interval: flags.region_sync_interval,
        takeover_forward_timeout: flags.takeover_forward_timeout,
        allow_alone: flags.allow_alone,
        ..ClusterConfig::default()
    })
}

/// `--rlqs-global-domain`: each a domain name as RLQS streams carry them (1 to 256 bytes).
fn rlqs_global_domains(flags: &Flags) -> anyhow::Result<std::collections::BTreeSet<String>> {
    for domain in &flags.rlqs_global_domain {
        anyhow::ensure!(
            (1..=256).contains(&domain.len()),
            "--rlqs-global-domain needs a domain of 1 to 256 bytes, not {} bytes",
            domain.len()
        );
    }
    Ok(flags.rlqs_global_domain.iter().cloned().collect())
}

/// `--rlqs-*`: RLQS needs the RLS configuration (its limits), and its TLS flags need it on.
fn rlqs_settings(
    flags: &Flags,
    with_rls_config: bool,
    tls: &floodgate_node::TlsConfig,
) -> anyhow::Result<Option<floodgate_node::RlqsSettings>> {
    let Some(listen) = flags.rlqs_listen else {
        anyhow::ensure!(
            !flags.rlqs_tls && !flags.rlqs_client_auth,
            "--rlqs-tls and --rlqs-client-auth need --rlqs-listen ADDR"
        );
        return Ok(None);
    };
    anyhow::ensure!(
        with_rls_config,
        "--rlqs-listen needs --rls-config PATH (the limits the Envoys share)"
    );
    let settings = floodgate_node::RlqsSettings {
        assignment_ttl_s: flags.rlqs_assignment_ttl,
        idle_reports_before_abandon: flags.rlqs_idle_reports,
        tls: flags.rlqs_tls,
        client_auth: flags.rlqs_client_auth,
        ..floodgate_node::RlqsSettings::new(listen)
    };
    settings.validate(tls)?;
    Ok(Some(settings))
}

fn rls_settings(flags: &Flags) -> anyhow::Result<Option<floodgate_node::rls::RlsSettings>> {
    let Some(config) = flags.rls_config.clone() else {
        anyhow::ensure!(
            flags.rls_listen.is_none()
                && !flags.rls_rate_limit_headers
                && !flags.rls_tls
                && !flags.rls_client_auth
                && !flags.rls_allow_negative_hits,
            "--rls-listen, --rls-rate-limit-headers, --rls-tls, --rls-client-auth and \
             --rls-allow-negative-hits need --rls-config PATH (the rate limit configuration)"
        );
        return Ok(None);
    };
    Ok(Some(floodgate_node::rls::RlsSettings {
        listen: flags
            .rls_listen
            .unwrap_or(floodgate_node::rls::DEFAULT_RLS_LISTEN),
        config,
        rate_limit_headers: flags.rls_rate_limit_headers,
        tls: flags.rls_tls,
        client_auth: flags.rls_client_auth,
        allow_negative_hits: flags.rls_allow_negative_hits,
    }))
}

/// `--resp-failure-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum RespFailure {
    Closed,
    Open,
}

fn resp_settings(flags: &Flags) -> anyhow::Result<Option<floodgate_node::RespSettings>> {
    let from_env = std::env::var(floodgate_node::resp::PASSWORD_ENV).ok();
    let Some(listen) = flags.resp_listen else {
        anyhow::ensure!(
            flags.resp_password_file.is_none()
                && flags.resp_failure_mode == RespFailure::Closed
                && !flags.resp_tls
                && !flags.resp_client_auth,
            "--resp-password-file, --resp-failure-mode, --resp-tls and --resp-client-auth need \
             --resp-listen ADDR"
        );
        return Ok(None);
    };
    let password = match (&flags.resp_password_file, from_env) {
        (Some(_), Some(_)) => anyhow::bail!(
            "the RESP password is given twice: --resp-password-file and {}",
            floodgate_node::resp::PASSWORD_ENV
        ),
        (Some(file), None) => {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("reading the RESP password file {}", file.display()))?;
            let line = text.lines().next().unwrap_or("").to_owned();
            anyhow::ensure!(
                !line.is_empty(),
                "the RESP password file {} is empty",
                file.display()
            );
            Some(line)
        }
        (None, Some(env)) => {
            anyhow::ensure!(
                !env.is_empty(),
                "{} is set but empty",
                floodgate_node::resp::PASSWORD_ENV
            );
            Some(env)
        }
        (None, None) => None,
    };
    anyhow::ensure!(
        flags.resp_tls || !flags.resp_client_auth,
        "--resp-client-auth needs --resp-tls"
    );
    let mut settings = floodgate_node::RespSettings::on(listen);
    settings.password = password;
    settings.tls = flags.resp_tls;
    settings.client_auth = flags.resp_client_auth;
    settings.failure_mode = match flags.resp_failure_mode {
        RespFailure::Closed => floodgate_node::RespFailureMode::Closed,
        RespFailure::Open => floodgate_node::RespFailureMode::Open,
    };
    Ok(Some(settings))
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A size in bytes: a number, or with a binary suffix (`64KiB`, `512MiB`, `1GiB`).
fn parse_bytes(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let scale: usize = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => {
            return Err(format!(
                "{text}: give bytes, or a number with KiB, MiB or GiB"
            ));
        }
    };
    number
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .ok_or_else(|| format!("{text}: not a size in bytes"))
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    floodgate::parse_duration_ns(text)
        .map(Duration::from_nanos)
        .map_err(|e| e.to_string())
}

/// A region sync interval: from 1ms (each round sends every key's units; shorter only costs
/// frames) to 10s (longer holds each region to its share of a burst for longer).
fn parse_region_sync_interval(text: &str) -> Result<Duration, String> {
    let interval = parse_duration(text)?;
    if interval < Duration::from_millis(1) || interval > Duration::from_secs(10) {
        return Err(format!(
            "{text} is out of range: give 1ms to 10s (default 100ms)"
        ));
    }
    Ok(interval)
}

/// SIGINT, SIGTERM and SIGHUP handlers, installed at once (a signal before the first wait is
/// kept).
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> anyhow::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    /// Waits for SIGINT or SIGTERM; on each SIGHUP reloads the certificates (a failed reload
    /// keeps the ones in use).
    async fn wait(mut self, node: &Node) {
        loop {
            tokio::select! {
                _ = self.interrupt.recv() => return,
                _ = self.terminate.recv() => return,
                _ = self.hangup.recv() => {
                    if let Err(e) = node.reload_tls() {
                        tracing::error!("SIGHUP: certificates not reloaded, the old ones stay: {e:#}");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    #[test]
    fn rlqs_flag_mistakes_are_refused_naming_the_flag() {
        let tls = floodgate_node::TlsConfig {
            cert: "cert.pem".into(),
            key: "key.pem".into(),
            client_ca: None,
            peer_ca: None,
        };
        let settings = |args: &[&str], with_rls_config: bool| {
            let flags = Flags::try_parse_from(["floodgate-node"].iter().chain(args)).unwrap();
            rlqs_settings(&flags, with_rls_config, &tls).map_err(|e| e.to_string())
        };
        let listen = ["--rlqs-listen", "127.0.0.1:8082"];
        assert!(
            settings(&listen, false)
                .unwrap_err()
                .contains("needs --rls-config")
        );
        assert!(
            settings(&["--rlqs-tls"], true)
                .unwrap_err()
                .contains("need --rlqs-listen")
        );
        let ttl = [&listen[..], &["--rlqs-assignment-ttl", "0"]].concat();
        assert!(
            settings(&ttl, true)
                .unwrap_err()
                .contains("--rlqs-assignment-ttl")
        );
        let auth = [&listen[..], &["--rlqs-client-auth"]].concat();
        assert!(
            settings(&auth, true)
                .unwrap_err()
                .contains("needs --rlqs-tls")
        );
        let domains = |args: &[&str]| {
            let flags = Flags::try_parse_from(["floodgate-node"].iter().chain(args)).unwrap();
            rlqs_global_domains(&flags).map_err(|e| e.to_string())
        };
        assert!(
            domains(&["--rlqs-global-domain", ""])
                .unwrap_err()
                .contains("--rlqs-global-domain")
        );
        let two = [
            "--rlqs-global-domain",
            "edge",
            "--rlqs-global-domain",
            "api",
        ];
        assert_eq!(domains(&two).unwrap().len(), 2);
        let good = settings(&listen, true).unwrap().unwrap();
        assert_eq!(
            (good.assignment_ttl_s, good.idle_reports_before_abandon),
            (15, 120)
        );
        assert_eq!(settings(&[], true).unwrap().map(|s| s.listen), None);
    }

    #[test]
    fn sizes_parse_with_binary_suffixes_only() {
        assert_eq!(parse_bytes("1GiB"), Ok(1 << 30));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert!(parse_bytes("1GB").is_err());
        assert!(parse_bytes("GiB").is_err());
        assert!(parse_bytes("99999999999999999999GiB").is_err());
    }

    #[test]
    fn an_unreachable_advertised_address_is_refused_naming_the_flag() {
        let err = check_advertised(addr("0.0.0.0:7103"), None).unwrap_err();
        assert!(err.to_string().contains("--advertise"), "{err}");
        let err = check_advertised(addr("[::]:7103"), None).unwrap_err();
        assert!(err.to_string().contains("--advertise"), "{err}");
        for bad in ["0.0.0.0:7103", "10.0.0.1:0", "[::]:1"] {
            let err = check_advertised(addr("0.0.0.0:7103"), Some(addr(bad))).unwrap_err();
            assert!(err.to_string().contains("--advertise"), "{bad}: {err}");
        }
    }

    #[test]
    fn specific_addresses_and_a_bound_port_zero_are_accepted() {
        check_advertised(addr("127.0.0.1:7100"), None).unwrap();
        check_advertised(addr("127.0.0.1:0"), None).unwrap();
        check_advertised(addr("0.0.0.0:7103"), Some(addr("10.0.0.3:7103"))).unwrap();
    }

    #[test]
    fn seeds_repeated_or_comma_separated_are_the_same_list() {
        let parse = |args: &[&str]| {
            Flags::try_parse_from(["floodgate-node"].iter().chain(args))
                .unwrap()
                .seeds
        };
        let expected: Vec<HostPort> =
            vec![addr("127.0.0.1:7100").into(), addr("127.0.0.1:7101").into()];
        assert_eq!(
            parse(&["--seeds", "127.0.0.1:7100,127.0.0.1:7101"]),
            expected
        );
        assert_eq!(
            parse(&["--seeds", "127.0.0.1:7100", "--seeds", "127.0.0.1:7101"]),
            expected
        );
    }

    #[test]
    fn seeds_may_be_names_and_a_value_without_port_is_refused_naming_the_flag() {
        let flags =
            Flags::try_parse_from(["floodgate-node", "--seeds", "localhost:7100,fg-1.fg:7100"])
                .unwrap();
        let seeds: Vec<String> = flags.seeds.iter().map(ToString::to_string).collect();
        assert_eq!(seeds, ["localhost:7100", "fg-1.fg:7100"]);
        let err = Flags::try_parse_from(["floodgate-node", "--seeds", "localhost"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--seeds") && err.contains("has no port"),
            "{err}"
        );
    }

    #[test]
    fn the_region_sync_interval_defaults_to_100ms_and_out_of_range_is_refused_naming_it() {
        let parse = |args: &[&str]| Flags::try_parse_from(["floodgate-node"].iter().chain(args));
        assert_eq!(
            parse(&[]).unwrap().region_sync_interval,
            Duration::from_millis(100)
        );
        assert_eq!(
            parse(&["--region-sync-interval", "20ms"])
                .unwrap()
                .region_sync_interval,
            Duration::from_millis(20)
        );
        for bad in ["0ms", "11s", "soon"] {
            let err = parse(&["--region-sync-interval", bad])
                .unwrap_err()
                .to_string();
            assert!(err.contains("--region-sync-interval"), "{bad}: {err}");
        }
    }

    #[cfg(not(feature = "test-hooks"))]
    #[test]
    fn a_build_without_test_hooks_refuses_the_clock_skew_flag() {
        let refused = Flags::try_parse_from(["floodgate-node", "--test-only-clock-skew-ms", "250"])
            .unwrap_err()
            .to_string();
        assert!(refused.contains("--test-only-clock-skew-ms"), "{refused}");
    }

    #[cfg(feature = "test-hooks")]
    #[test]
    fn the_test_only_clock_skew_flag_parses_either_sign_and_is_hidden_from_help() {
        let parse = |value: &str| {
            Flags::try_parse_from(["floodgate-node", "--test-only-clock-skew-ms", value])
                .unwrap()
                .test_only_clock_skew_ms
        };
        assert_eq!(parse("250"), 250);
        assert_eq!(parse("-250"), -250);
        let help = <Flags as clap::CommandFactory>::command()
            .render_long_help()
            .to_string();
        assert!(!help.contains("clock-skew"), "{help}");
        assert!(help.contains("--listen"), "{help}");
    }

    #[tokio::test]
    async fn listen_admin_and_advertise_names_resolve_at_start() {
        let flags = Flags::try_parse_from([
            "floodgate-node",
            "--listen",
            "localhost:7100",
            "--admin",
            "localhost:9100",
            "--advertise",
            "localhost:7100",
        ])
        .unwrap();
        let addresses = Addresses::resolve(&flags).await.unwrap();
        assert_eq!(addresses.listen, addr("127.0.0.1:7100"));
        assert_eq!(addresses.admin, Some(addr("127.0.0.1:9100")));
        assert_eq!(addresses.advertise, Some(addr("127.0.0.1:7100")));
        let flags = Flags::try_parse_from(["floodgate-node", "--admin", "localhost"]).unwrap();
        let err = Addresses::resolve(&flags).await.err().unwrap().to_string();
        assert!(err.contains("--admin"), "{err}");
    }
}
