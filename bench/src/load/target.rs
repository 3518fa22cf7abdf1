//! The systems behind one interface: floodgate through its client (QUIC) and through Envoy's
//! rate limit service (gRPC), two Redis setups through the same pipelining client (the classic
//! token-bucket Lua script, and redis-cell's native GCRA command), and the peers: Gubernator
//! (gRPC) and envoyproxy/ratelimit (the same RLS calls). All enforce the same count per period.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use floodgate::region::Scope;
use floodgate::{Limit, NANOS_PER_SEC};
use floodgate_client::{Check, Client, ClientConfig, Source, Verdict};

use super::outcome::Outcome;

/// The classic token bucket, extended from one key to all of `KEYS` all-or-nothing (so a
/// 3-check request means the same as floodgate's group): HMGET tokens/ts, refill, and only if
/// every key has the tokens, HSET and PEXPIRE each. ARGV: rate per ms, burst, now (ms), cost.
pub const TOKEN_BUCKET_LUA: &str = r#"
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local ttl = math.ceil(burst / rate)
local tokens = {}
for i, key in ipairs(KEYS) do
  local v = redis.call('HMGET', key, 'tokens', 'ts')
  local t = tonumber(v[1])
  local ts = tonumber(v[2])
  if t == nil then t = burst; ts = now end
  t = math.min(burst, t + math.max(0, now - ts) * rate)
  if t < cost then return 0 end
  tokens[i] = t
end
for i, key in ipairs(KEYS) do
  redis.call('HSET', key, 'tokens', tokens[i] - cost, 'ts', now)
  redis.call('PEXPIRE', key, ttl)
end
return 1
"#;

pub enum Target {
    Floodgate {
        client: Client,
        /// A second client to the same node with token leases on (the `hot-leased` spread).
        leasing: Client,
        limit: Limit,
        /// Nodes of the cluster behind the clients: 1, or [`CLUSTER`]'s when the keys are
        /// spread over several owners (or the two regions' nodes of [`REGIONS_GLOBAL`]).
        nodes: usize,
        /// The scope every check is sent with (`region`, the default, but for
        /// [`REGIONS_GLOBAL`]).
        scope: Scope,
        /// The system's name in the records.
        name: &'static str,
    },
    Redis {
        pool: RedisPool,
        script: redis::Script,
        limit: Limit,
    },
    /// redis-cell: `CL.THROTTLE key max_burst count period quantity` per key. A request of
    /// several keys sends one command per key in one pipeline (one round trip); the module has
    /// no multi-key form, so unlike the other two it is not all-or-nothing: when one key denies,
    /// the keys that passed keep their charge.
    RedisCell {
        pool: RedisPool,
        throttle: CellThrottle,
    },
    /// The node's RLS listener: one `ShouldRateLimit` call per request, one descriptor per key
    /// (all-or-nothing, as the node refunds the others when one is over its limit); with
    /// `nodes` above 1, the listeners of a cluster's nodes, the calls spread over them.
    Rls {
        channels: super::rls::RlsChannels,
        nodes: usize,
    },
    /// envoyproxy/ratelimit over Redis, fed the same RLS calls as the node's RLS listener.
    EnvoyRatelimit(super::rls::RlsChannels),
    /// A Gubernator cluster: one `GetRateLimits` call per request, one token-bucket request
    /// per key, the calls spread over every node.
    Gubernator(super::gubernator::GubernatorChannels),
    /// Nothing behind it: allows every request after one yield to the runtime (the one wake-up
    /// a real answer costs), so a run against it measures the load generator's own CPU.
    Noop,
}

/// Multiplexed connections, each pipelining every concurrent call on it; calls take turns.
pub struct RedisPool {
    connections: Vec<redis::aio::MultiplexedConnection>,
    next: AtomicUsize,
}

impl std::fmt::Debug for RedisPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RedisPool({} connections)", self.connections.len())
    }
}

impl RedisPool {
    async fn connect(addr: std::net::SocketAddr, connections: usize) -> anyhow::Result<Self> {
        let client = redis::Client::open(format!("redis://{addr}/"))?;
        let mut pool = Vec::with_capacity(connections);
        for _ in 0..connections.max(1) {
            pool.push(
                client
                    .get_multiplexed_async_connection()
                    .await
                    .context("connecting to redis")?,
            );
        }
        Ok(RedisPool {
            connections: pool,
            next: AtomicUsize::new(0),
        })
    }

    fn pick(&self) -> redis::aio::MultiplexedConnection {
        let turn = self.next.fetch_add(1, Ordering::Relaxed);
        self.connections[turn % self.connections.len()].clone()
    }
}

/// The name of the no-op target's records: the load generator alone (its own cost per check).
pub const GENERATOR: &str = "generator";
/// floodgate as a cluster of several nodes on this machine, each check sent to its key's owner.
pub const CLUSTER: &str = "floodgate-cluster";
/// The same node through Envoy's rate limit service (RLS v3 gRPC) instead of its QUIC client.
pub const RLS: &str = "floodgate+rls";
/// A cluster's nodes through their RLS fronts, the calls spread over every node as an Envoy
/// spreads them over its cluster's hosts: each descriptor decided by its key's owner, most of
/// them forwarded there by the node that was called.
pub const CLUSTER_RLS: &str = "floodgate-cluster+rls";
/// Two regions of one node each on this machine, the gateway in region `a`: every check of
/// scope `global` (decided in `a`, its units merged in `b` as deltas) ...
pub const REGIONS_GLOBAL: &str = "floodgate-regions-global-scope";
/// ... and the same two regions with every check of scope `region` (decided in `a` alone):
/// what a global check is compared with.
pub const REGIONS_REGION: &str = "floodgate-regions-region-scope";
/// Longest wait for a cluster's members to own their slots and a client to reach each.
const FORMING: Duration = Duration::from_secs(60);

/// Most buffer pairs kept per thread: one per request in flight up to this many; beyond, they
/// are freed.
const POOLED_BUFFERS: usize = 4_096;

type Buffers = (Vec<Check>, Vec<Verdict>);

thread_local! {
    /// Per worker thread, so requests on different threads share no lock and no cache line (a
    /// shared pool's lock moved between the two cores on every request).
    static POOL: std::cell::RefCell<Vec<Buffers>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A finished request's check and verdict buffers from this thread's pool, or new ones: the
/// harness's own glue then allocates nothing per request either (`Client::check_into`), so the
/// client CPU column is the client's and the generator's, not the glue's.
fn take_buffers() -> Buffers {
    POOL.with_borrow_mut(|pool| pool.pop().unwrap_or_default())
}

fn give_back_buffers(checks: Vec<Check>, verdicts: Vec<Verdict>) {
    POOL.with_borrow_mut(|pool| {
        if pool.len() < POOLED_BUFFERS {
            pool.push((checks, verdicts));
        }
    });
}

/// One check per key with `limit` and `scope`, written over `checks` (their key buffers
/// reused).
fn fill_checks(checks: &mut Vec<Check>, keys: &[String], limit: &Limit, scope: &Scope) {
    checks.truncate(keys.len());
    for (i, key) in keys.iter().enumerate() {
        match checks.get_mut(i) {
            Some(check) => {
                check.key.clear();
                check.key.extend_from_slice(key.as_bytes());
                check.limit = *limit;
                check.scope.clone_from(scope);
            }
            None => {
                let mut check = Check::new(key.as_bytes(), *limit);
                check.scope = scope.clone();
                checks.push(check);
            }
        }
    }
}

/// A [`Limit`] in CL.THROTTLE's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CellThrottle {
    /// redis-cell admits `max_burst + 1` at once, so this is the limit's burst minus one.
    pub max_burst: u64,
    pub count: u64,
    /// Whole seconds: the command takes no finer period.
    pub period_s: u64,
}

impl CellThrottle {
    pub fn new(limit: &Limit) -> anyhow::Result<Self> {
        let period_ns = limit.period_ns();
        anyhow::ensure!(
            period_ns.is_multiple_of(NANOS_PER_SEC) && limit.burst() >= 1,
            "redis-cell takes whole-second periods and a burst of at least 1, not {limit}"
        );
        Ok(CellThrottle {
            max_burst: limit.burst() - 1,
            count: limit.rate(),
            period_s: period_ns / NANOS_PER_SEC,
        })
    }

    fn command(&self, key: &str) -> redis::Cmd {
        let mut command = redis::cmd("CL.THROTTLE");
        command
            .arg(key)
            .arg(self.max_burst)
            .arg(self.count)
            .arg(self.period_s)
            .arg(1);
        command
    }
}

/// CL.THROTTLE's reply: `[limited, limit, remaining, retry_after_s, reset_after_s]`.
fn cell_allowed(reply: &[i64]) -> anyhow::Result<bool> {
    match reply.first() {
        Some(0) => Ok(true),
        Some(1) => Ok(false),
        _ => anyhow::bail!("unexpected CL.THROTTLE reply {reply:?}"),
    }
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Target {
    pub async fn floodgate(
        node: impl Into<floodgate_client::HostPort>,
        ca: &std::path::Path,
        limit: Limit,
    ) -> anyhow::Result<Self> {
        Self::floodgate_cluster(node, ca, limit, 1).await
    }

    /// Clients seeded at `node` that wait to know all `nodes` members of its cluster (and to
    /// be connected to each), so every check goes straight to its key's owner.
    pub async fn floodgate_cluster(
        node: impl Into<floodgate_client::HostPort>,
        ca: &std::path::Path,
        limit: Limit,
        nodes: usize,
    ) -> anyhow::Result<Self> {
        let mut config = ClientConfig::with_ca_file(ca);
        // A benchmark measures the node, so a slow answer must count as slow, not turn into a
        // fallback decision: a generous timeout, and degraded answers are counted separately.
        config.timeout = Duration::from_secs(2);
        let node = node.into();
        let client = Client::connect(std::slice::from_ref(&node), config.clone())
            .await
            .context("connecting to the node")?;
        await_members(&client, nodes).await?;
        config.token_leases.enabled = true;
        let leasing = Client::connect(&[node], config)
            .await
            .context("connecting the leasing client to the node")?;
        await_members(&leasing, nodes).await?;
        Ok(Target::Floodgate {
            client,
            leasing,
            limit,
            nodes,
            scope: Scope::Region,
            name: if nodes == 1 { "floodgate" } else { CLUSTER },
        })
    }

    /// A client of region `a`'s node, seeded at `node`, that waits until that node's table
    /// names both regions' nodes (so the node knows its keys' owners in region `b`), every
    /// check of `scope`: [`REGIONS_GLOBAL`] for `global`, else [`REGIONS_REGION`]. No token
    /// leases: the leased workload does not run on this system.
    pub async fn floodgate_regions(
        node: std::net::SocketAddr,
        ca: &std::path::Path,
        limit: Limit,
        scope: Scope,
    ) -> anyhow::Result<Self> {
        let mut config = ClientConfig::with_ca_file(ca);
        config.timeout = Duration::from_secs(2);
        config.region = Some("a".to_owned());
        let client = Client::connect(&[floodgate_client::HostPort::from(node)], config)
            .await
            .context("connecting to region a's node")?;
        await_regions(&client).await?;
        let name = match scope {
            Scope::Global => REGIONS_GLOBAL,
            _ => REGIONS_REGION,
        };
        Ok(Target::Floodgate {
            leasing: client.clone(),
            client,
            limit,
            nodes: 2,
            scope,
            name,
        })
    }

    /// Redis + the token-bucket Lua script, over `connections` multiplexed connections.
    pub async fn redis(
        addr: std::net::SocketAddr,
        connections: usize,
        limit: Limit,
    ) -> anyhow::Result<Self> {
        let pool = RedisPool::connect(addr, connections).await?;
        let script = redis::Script::new(TOKEN_BUCKET_LUA);
        // Load once so every call is an EVALSHA (the script object falls back to EVAL otherwise).
        script.prepare_invoke().load_async(&mut pool.pick()).await?;
        Ok(Target::Redis {
            pool,
            script,
            limit,
        })
    }

    /// Redis with the redis-cell module loaded, over `connections` multiplexed connections.
    pub async fn redis_cell(
        addr: std::net::SocketAddr,
        connections: usize,
        limit: Limit,
    ) -> anyhow::Result<Self> {
        let pool = RedisPool::connect(addr, connections).await?;
        let throttle = CellThrottle::new(&limit)?;
        // One call on a scratch key: a server without the module fails here, in words, and not
        // with a million errors in the run.
        let probe = "floodgate-bench:probe";
        let reply: Vec<i64> = throttle
            .command(probe)
            .query_async(&mut pool.pick())
            .await
            .context("CL.THROTTLE failed: is the redis-cell module loaded?")?;
        cell_allowed(&reply)?;
        let _: i64 = redis::cmd("DEL")
            .arg(probe)
            .query_async(&mut pool.pick())
            .await?;
        Ok(Target::RedisCell { pool, throttle })
    }

    /// The RLS listeners of a node or a cluster's nodes, over `channels` HTTP/2 connections
    /// spread over them; the nodes enforce the limit their `--rls-config` (written by
    /// [`super::args::LoadArgs::rls_config_yaml`]) gives.
    pub async fn rls(addrs: Vec<std::net::SocketAddr>, channels: usize) -> anyhow::Result<Self> {
        Ok(Target::Rls {
            channels: super::rls::RlsChannels::connect(&addrs, channels).await?,
            nodes: addrs.len(),
        })
    }

    /// envoyproxy/ratelimit's gRPC listener, over `channels` HTTP/2 connections.
    pub async fn envoy_ratelimit(
        addr: std::net::SocketAddr,
        channels: usize,
    ) -> anyhow::Result<Self> {
        Ok(Target::EnvoyRatelimit(
            super::rls::RlsChannels::connect(&[addr], channels).await?,
        ))
    }

    /// A Gubernator cluster's nodes, `per_node` HTTP/2 connections to each.
    pub async fn gubernator(
        nodes: &[std::net::SocketAddr],
        per_node: usize,
        limit: Limit,
    ) -> anyhow::Result<Self> {
        Ok(Target::Gubernator(
            super::gubernator::GubernatorChannels::connect(nodes, per_node, limit, 0).await?,
        ))
    }

    pub fn name(&self) -> &'static str {
        match self {
            Target::Floodgate { name, .. } => name,
            Target::Rls { nodes: 1, .. } => RLS,
            Target::Rls { .. } => CLUSTER_RLS,
            Target::EnvoyRatelimit(_) => "envoy-ratelimit",
            Target::Gubernator(_) => "gubernator",
            Target::Redis { .. } => "redis+lua",
            Target::RedisCell { .. } => "redis+cell",
            Target::Noop => GENERATOR,
        }
    }

    /// The server processes that decide (the cluster's nodes; 1 for a single server).
    pub fn nodes(&self) -> usize {
        match self {
            Target::Floodgate { nodes, .. } | Target::Rls { nodes, .. } => *nodes,
            Target::Gubernator(channels) => channels.nodes(),
            _ => 1,
        }
    }

    /// True when this system can run a workload through token leases (floodgate's client,
    /// but for the two regions' systems, whose clients lease nothing).
    pub fn leases(&self) -> bool {
        matches!(self, Target::Floodgate { name, .. } if ![REGIONS_GLOBAL, REGIONS_REGION].contains(name))
    }

    /// What this system's leasing client did (`None`: no leases here).
    pub fn lease_stats(&self) -> Option<floodgate_client::TokenLeaseStats> {
        match self {
            Target::Floodgate { leasing, .. } => leasing.token_lease_stats(),
            _ => None,
        }
    }

    /// Packets sent and lost so far on this system's QUIC connections (`None`: not QUIC).
    pub fn transport(&self) -> Option<(u64, u64)> {
        match self {
            Target::Floodgate { client, .. } => Some(
                client
                    .nodes()
                    .iter()
                    .filter_map(|node| node.transport)
                    .fold((0, 0), |(sent, lost), t| {
                        (sent + t.sent_packets, lost + t.lost_packets)
                    }),
            ),
            _ => None,
        }
    }

    /// Checks one request's keys all-or-nothing, through the leasing client when `leased`.
    pub async fn check_leased(&self, keys: &[String], leased: bool) -> anyhow::Result<Outcome> {
        match self {
            Target::Floodgate {
                leasing,
                limit,
                scope,
                ..
            } if leased => floodgate_outcome(leasing, keys, limit, scope).await,
            _ => self.check(keys).await,
        }
    }

    /// Checks one request's keys all-or-nothing.
    pub async fn check(&self, keys: &[String]) -> anyhow::Result<Outcome> {
        match self {
            Target::Rls { channels, .. } | Target::EnvoyRatelimit(channels) => {
                channels.check(keys).await
            }
            Target::Gubernator(cluster) => cluster.check(keys).await,
            Target::Noop => {
                tokio::task::yield_now().await;
                Ok(Outcome::Allowed)
            }
            Target::Floodgate {
                client,
                limit,
                scope,
                ..
            } => floodgate_outcome(client, keys, limit, scope).await,
            Target::Redis {
                pool,
                script,
                limit,
            } => {
                let mut connection = pool.pick();
                let now_ms = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_millis() as u64;
                let rate_per_ms = limit.rate() as f64 / (limit.period_ns() as f64 / 1e6);
                let mut invocation = script.prepare_invoke();
                for key in keys {
                    invocation.key(key);
                }
                invocation
                    .arg(rate_per_ms)
                    .arg(limit.burst())
                    .arg(now_ms)
                    .arg(1);
                let allowed: i64 = invocation.invoke_async(&mut connection).await?;
                Ok(if allowed == 1 {
                    Outcome::Allowed
                } else {
                    Outcome::Denied
                })
            }
            Target::RedisCell { pool, throttle } => {
                let mut connection = pool.pick();
                let mut all_allowed = true;
                if let [key] = keys {
                    let reply: Vec<i64> =
                        throttle.command(key).query_async(&mut connection).await?;
                    all_allowed = cell_allowed(&reply)?;
                } else {
                    let mut pipeline = redis::pipe();
                    for key in keys {
                        pipeline.add_command(throttle.command(key));
                    }
                    let replies: Vec<Vec<i64>> = pipeline.query_async(&mut connection).await?;
                    for reply in &replies {
                        all_allowed &= cell_allowed(reply)?;
                    }
                }
                Ok(if all_allowed {
                    Outcome::Allowed
                } else {
                    Outcome::Denied
                })
            }
        }
    }
}

/// Waits until `client`'s slot table names `nodes` members that each own slots, then until it
/// is connected to every one: before that, checks would be forwarded or decided by a node
/// about to hand its slots over, and the run would measure the cluster forming.
async fn await_members(client: &Client, nodes: usize) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + FORMING;
    loop {
        let formed = client.slot_table().is_some_and(|table| {
            table.members().len() == nodes
                && table.members().iter().all(|m| table.slots_owned(&m.id) > 0)
        });
        if formed && client.nodes().len() >= nodes {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the cluster's {nodes} nodes did not all own slots within {FORMING:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::timeout_at(deadline, client.wait_connected())
        .await
        .context("connecting to every member")
}

/// Waits until the cluster seeded at `node` has `nodes` members that all own slots, through a
/// client that is then dropped (for the systems called through another front).
pub async fn await_cluster(
    node: std::net::SocketAddr,
    ca: &std::path::Path,
    nodes: usize,
) -> anyhow::Result<()> {
    let client = Client::connect(
        &[floodgate_client::HostPort::from(node)],
        ClientConfig::with_ca_file(ca),
    )
    .await
    .context("connecting to the cluster's first node")?;
    await_members(&client, nodes).await
}

/// Waits until `client`'s table (from region `a`'s node) names a member of region `b` too,
/// and members of `a` that own slots, then until it is connected: before that, a global check
/// would find no owner in `b` and cost what a region check does.
async fn await_regions(client: &Client) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + FORMING;
    loop {
        let formed = client.slot_table().is_some_and(|table| {
            let members = table.members();
            members.iter().any(|m| m.region == "b")
                && members
                    .iter()
                    .filter(|m| m.region == "a")
                    .all(|m| table.slots_owned(&m.id) > 0)
        });
        if formed && !client.nodes().is_empty() {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "region a's node did not learn of region b's within {FORMING:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::timeout_at(deadline, client.wait_connected())
        .await
        .context("connecting to region a's node")
}

/// One request through a floodgate client: its keys as one all-or-nothing group.
async fn floodgate_outcome(
    client: &Client,
    keys: &[String],
    limit: &Limit,
    scope: &Scope,
) -> anyhow::Result<Outcome> {
    let (mut checks, mut verdicts) = take_buffers();
    fill_checks(&mut checks, keys, limit, scope);
    let answered = client.check_into(&checks, &mut verdicts).await;
    let outcome = if verdicts.iter().any(|v| v.source != Source::Node) {
        Outcome::Degraded
    } else if verdicts.iter().all(|v| v.is_allowed()) {
        Outcome::Allowed
    } else {
        Outcome::Denied
    };
    give_back_buffers(checks, verdicts);
    answered?;
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reused_check_buffers_hold_the_same_checks_as_fresh_ones() {
        let limit = Limit::gcra(1_000, 3_600 * NANOS_PER_SEC, 1_000).unwrap();
        let keys = |names: &[&str]| names.iter().map(|k| k.to_string()).collect::<Vec<_>>();
        let mut checks = Vec::new();
        for request in [keys(&["user:1", "ip:1", "key:1"]), keys(&["user:22"])] {
            fill_checks(&mut checks, &request, &limit, &Scope::Region);
            let fresh: Vec<Check> = request
                .iter()
                .map(|k| Check::new(k.as_bytes(), limit))
                .collect();
            assert_eq!(checks, fresh);
        }
    }

    #[test]
    fn reused_check_buffers_take_the_scope_given() {
        let limit = Limit::gcra(1_000, 3_600 * NANOS_PER_SEC, 1_000).unwrap();
        let keys = ["user:1".to_owned()];
        let mut checks = Vec::new();
        fill_checks(&mut checks, &keys, &limit, &Scope::Global);
        assert_eq!(checks[0].scope, Scope::Global);
        fill_checks(&mut checks, &keys, &limit, &Scope::Region);
        assert_eq!(checks[0].scope, Scope::Region);
    }

    #[test]
    fn a_limit_maps_to_cl_throttle_arguments() {
        let limit = Limit::gcra(1_000, 3_600 * NANOS_PER_SEC, 1_000).unwrap();
        assert_eq!(
            CellThrottle::new(&limit).unwrap(),
            CellThrottle {
                max_burst: 999,
                count: 1_000,
                period_s: 3_600
            }
        );
        let args = CellThrottle::new(&Limit::gcra(5, 60 * NANOS_PER_SEC, 2).unwrap())
            .unwrap()
            .command("user:1")
            .args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                other => format!("{other:?}"),
            })
            .collect::<Vec<_>>();
        assert_eq!(args, ["CL.THROTTLE", "user:1", "1", "5", "60", "1"]);
    }

    #[test]
    fn sub_second_periods_are_refused_in_words() {
        let limit = Limit::gcra(10, NANOS_PER_SEC / 2, 10).unwrap();
        let err = CellThrottle::new(&limit).unwrap_err().to_string();
        assert!(err.contains("whole-second periods"), "{err}");
    }

    #[test]
    fn cl_throttle_replies_read_as_decisions() {
        assert!(cell_allowed(&[0, 1000, 999, -1, 4]).unwrap());
        assert!(!cell_allowed(&[1, 1000, 0, 3, 3600]).unwrap());
        assert!(cell_allowed(&[]).is_err());
        assert!(cell_allowed(&[7]).is_err());
    }
}
