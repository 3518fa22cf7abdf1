//! The `floodgate+rls` system: the same node behind Envoy's rate limit service (RLS v3 gRPC),
//! driven through tonic's generated client over a few HTTP/2 connections. The configuration it
//! writes holds one domain whose descriptors enforce the same limit as the QUIC workloads.

use anyhow::Context;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use floodgate::{Algorithm, Limit, NANOS_PER_SEC};

use super::grpc::Connections;
use super::outcome::Outcome;

/// The domain of the configuration the harness writes.
pub const DOMAIN: &str = "bench";
/// The descriptor keys: the workloads' key prefixes (`user:7` is the entry `user` = `7`).
pub const DESCRIPTOR_KEYS: [&str; 3] = ["user", "ip", "key"];

/// envoyproxy/ratelimit's configuration (floodgate's `algorithm`/`burst` extension for a GCRA
/// limit) giving each descriptor key `limit`: each value of `user`, `ip` and `key` gets its own
/// bucket, as each QUIC key does.
pub fn config_yaml(limit: &Limit) -> anyhow::Result<String> {
    let unit = unit(limit)?;
    let shape = match limit.algorithm() {
        Algorithm::Gcra => format!(", algorithm: gcra, burst: {}", limit.burst()),
        window => format!(", algorithm: {window}"),
    };
    let mut yaml = format!("domain: {DOMAIN}\ndescriptors:\n");
    for key in DESCRIPTOR_KEYS {
        yaml.push_str(&format!(
            "  - key: {key}\n    rate_limit: {{unit: {unit}, requests_per_unit: {}{shape}}}\n",
            limit.rate()
        ));
    }
    Ok(yaml)
}

/// The RLS unit (`second`, `minute`, `hour`, `day`) of `limit`'s period.
pub fn unit(limit: &Limit) -> anyhow::Result<&'static str> {
    [
        ("second", 1),
        ("minute", 60),
        ("hour", 3_600),
        ("day", 86_400),
    ]
    .into_iter()
    .find(|(_, seconds)| limit.period_ns() == seconds * NANOS_PER_SEC)
    .map(|(unit, _)| unit)
    .with_context(|| format!("{limit}: an RLS limit's period is one second, minute, hour or day"))
}

/// One descriptor per workload key: `user:7` becomes the entry (`user`, `7`).
pub fn request(keys: &[String]) -> RateLimitRequest {
    RateLimitRequest {
        domain: DOMAIN.to_owned(),
        descriptors: keys
            .iter()
            .map(|key| {
                let (name, value) = key.split_once(':').unwrap_or((key, ""));
                RateLimitDescriptor {
                    entries: vec![Entry {
                        key: name.to_owned(),
                        value: value.to_owned(),
                    }],
                    ..Default::default()
                }
            })
            .collect(),
        hits_addend: 0,
    }
}

/// HTTP/2 connections to the RLS listener; calls take turns over them, each multiplexing its
/// calls.
pub struct RlsChannels {
    connections: Connections,
}

impl std::fmt::Debug for RlsChannels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RlsChannels({} connections)", self.connections.len())
    }
}

impl RlsChannels {
    /// `channels` connections spread over the listeners at `addrs` (at least one each), as an
    /// Envoy's cluster of several hosts spreads its calls.
    pub async fn connect(addrs: &[std::net::SocketAddr], channels: usize) -> anyhow::Result<Self> {
        anyhow::ensure!(!addrs.is_empty(), "no RLS listener to connect to");
        let each = channels.div_ceil(addrs.len()).max(1);
        let addrs: Vec<std::net::SocketAddr> =
            (0..each).flat_map(|_| addrs.iter().copied()).collect();
        let connections = Connections::open(&addrs)
            .await
            .context("connecting to the RLS listener")?;
        let rls = RlsChannels { connections };
        // One call on a scratch value: a node without the domain fails here, in words, and not
        // with a million errors in the run.
        let probe = rls.check(&["user:floodgate-bench-probe".to_owned()]).await;
        probe.context("the first ShouldRateLimit call failed")?;
        Ok(rls)
    }

    /// One `ShouldRateLimit` call carrying one descriptor per key.
    pub async fn check(&self, keys: &[String]) -> anyhow::Result<Outcome> {
        let turn = self.connections.turn();
        let connection = turn.connection.clone();
        let origin = connection.origin().clone();
        let mut client = RateLimitServiceClient::with_origin(connection, origin);
        let answer = match client.should_rate_limit(request(keys)).await {
            Ok(answer) => answer.into_inner(),
            Err(status) => {
                self.connections.recover(&turn).await;
                return Err(status.into());
            }
        };
        match Code::try_from(answer.overall_code) {
            Ok(Code::Ok) => Ok(Outcome::Allowed),
            Ok(Code::OverLimit) => Ok(Outcome::Denied),
            _ => anyhow::bail!("ShouldRateLimit answered code {}", answer.overall_code),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_gives_each_descriptor_key_the_workload_limit() {
        let limit = Limit::gcra(1_000, 3_600 * NANOS_PER_SEC, 1_000).unwrap();
        let yaml = config_yaml(&limit).unwrap();
        assert!(yaml.starts_with("domain: bench\ndescriptors:\n"), "{yaml}");
        for key in ["user", "ip", "key"] {
            assert!(
                yaml.contains(&format!(
                    "  - key: {key}\n    rate_limit: {{unit: hour, requests_per_unit: 1000, algorithm: gcra, burst: 1000}}\n"
                )),
                "{yaml}"
            );
        }
        // The node's own parser reads it back as the same limit for every value.
        let config = floodgate::rls::RlsConfig::from_files([("bench.yaml", yaml.as_str())])
            .unwrap_or_else(|e| panic!("{e}\n{yaml}"));
        for (key, value) in [("user", "7"), ("ip", "0"), ("key", "999")] {
            let rule = config.find(DOMAIN, &[(key, value)]).unwrap();
            assert_eq!(rule.counted.as_ref().unwrap().limit, limit, "{key}");
        }
        assert!(config.find(DOMAIN, &[("other", "7")]).is_none());
    }

    #[test]
    fn periods_without_an_rls_unit_are_refused_in_words() {
        let limit = Limit::gcra(10, 7 * NANOS_PER_SEC, 10).unwrap();
        let err = config_yaml(&limit).unwrap_err().to_string();
        assert!(err.contains("second, minute, hour or day"), "{err}");
    }

    #[test]
    fn each_key_becomes_one_descriptor_of_one_entry() {
        let keys = ["user:7", "ip:49", "key:3"].map(str::to_owned);
        let request = request(&keys);
        assert_eq!(request.domain, "bench");
        let entries: Vec<(&str, &str)> = request
            .descriptors
            .iter()
            .map(|d| {
                assert_eq!(d.entries.len(), 1);
                (d.entries[0].key.as_str(), d.entries[0].value.as_str())
            })
            .collect();
        assert_eq!(entries, [("user", "7"), ("ip", "49"), ("key", "3")]);
    }
}
