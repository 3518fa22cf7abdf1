//! The two systems behind one interface: floodgate through its client, and Redis with the classic
//! token-bucket Lua script through a pipelining client. Both enforce the same limit.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use floodgate::Limit;
use floodgate_client::{Check, Client, ClientConfig, Source};

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

/// Outcome of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Allowed,
    Denied,
    /// Decided by the client's failure mode, not the server: counted, never hidden.
    Degraded,
}

pub enum Target {
    Floodgate {
        client: Client,
        limit: Limit,
    },
    Redis {
        connections: Vec<redis::aio::MultiplexedConnection>,
        next: Arc<AtomicUsize>,
        script: redis::Script,
        limit: Limit,
    },
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
        let mut config = ClientConfig::with_ca_file(ca);
        // A benchmark measures the node, so a slow answer must count as slow, not turn into a
        // fallback decision: a generous timeout, and degraded answers are counted separately.
        config.timeout = Duration::from_secs(2);
        let client = Client::connect(&[node.into()], config)
            .await
            .context("connecting to the node")?;
        client.wait_connected().await;
        Ok(Target::Floodgate { client, limit })
    }

    /// `connections` multiplexed connections, each pipelining every concurrent call on it.
    pub async fn redis(
        addr: std::net::SocketAddr,
        connections: usize,
        limit: Limit,
    ) -> anyhow::Result<Self> {
        let client = redis::Client::open(format!("redis://{addr}/"))?;
        let mut pool = Vec::with_capacity(connections);
        for _ in 0..connections {
            pool.push(
                client
                    .get_multiplexed_async_connection()
                    .await
                    .context("connecting to redis")?,
            );
        }
        let script = redis::Script::new(TOKEN_BUCKET_LUA);
        // Load once so every call is an EVALSHA (the script object falls back to EVAL otherwise).
        script.prepare_invoke().load_async(&mut pool[0]).await?;
        Ok(Target::Redis {
            connections: pool,
            next: Arc::new(AtomicUsize::new(0)),
            script,
            limit,
        })
    }

    pub fn name(&self) -> &'static str {
        match self {
            Target::Floodgate { .. } => "floodgate",
            Target::Redis { .. } => "redis+lua",
        }
    }

    /// Checks one request's keys all-or-nothing.
    pub async fn check(&self, keys: &[String]) -> anyhow::Result<Outcome> {
        match self {
            Target::Floodgate { client, limit } => {
                let checks: Vec<Check> = keys
                    .iter()
                    .map(|k| Check::new(k.as_bytes(), *limit))
                    .collect();
                let verdicts = client.check(&checks).await?;
                if verdicts.iter().any(|v| v.source != Source::Node) {
                    return Ok(Outcome::Degraded);
                }
                Ok(if verdicts.iter().all(|v| v.is_allowed()) {
                    Outcome::Allowed
                } else {
                    Outcome::Denied
                })
            }
            Target::Redis {
                connections,
                next,
                script,
                limit,
            } => {
                let mut connection =
                    connections[next.fetch_add(1, Ordering::Relaxed) % connections.len()].clone();
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
        }
    }
}
