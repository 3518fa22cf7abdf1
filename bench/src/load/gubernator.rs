//! Gubernator's gRPC API (`pb.gubernator.V1`, v2.13.0's `gubernator.proto`), the part the bench
//! calls: `GetRateLimits`, one batch of rate limit requests per call, and `HealthCheck`, which
//! says when a node sees its peers. The messages are written out with prost's derive (the fields
//! and tags of the proto; the metadata maps left out, which prost then skips) so the bench needs
//! no protoc and no build script.

use anyhow::Context;
use floodgate::Limit;
use tonic::codegen::http::uri::PathAndQuery;
use tonic_prost::ProstCodec;

use super::grpc::{Connection, Connections};
use super::outcome::Outcome;

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetRateLimitsReq {
    #[prost(message, repeated, tag = "1")]
    pub requests: Vec<RateLimitReq>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetRateLimitsResp {
    #[prost(message, repeated, tag = "1")]
    pub responses: Vec<RateLimitResp>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitReq {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub unique_key: String,
    #[prost(int64, tag = "3")]
    pub hits: i64,
    #[prost(int64, tag = "4")]
    pub limit: i64,
    /// Milliseconds.
    #[prost(int64, tag = "5")]
    pub duration: i64,
    /// 0: TOKEN_BUCKET, 1: LEAKY_BUCKET.
    #[prost(int32, tag = "6")]
    pub algorithm: i32,
    /// Flags: [`GLOBAL`], among others; 0 is the default (batched forwarding to the owner).
    #[prost(int32, tag = "7")]
    pub behavior: i32,
    #[prost(int64, tag = "8")]
    pub burst: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitResp {
    /// 0: UNDER_LIMIT, 1: OVER_LIMIT.
    #[prost(int32, tag = "1")]
    pub status: i32,
    #[prost(int64, tag = "2")]
    pub limit: i64,
    #[prost(int64, tag = "3")]
    pub remaining: i64,
    #[prost(int64, tag = "4")]
    pub reset_time: i64,
    #[prost(string, tag = "5")]
    pub error: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HealthCheckReq {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HealthCheckResp {
    #[prost(string, tag = "1")]
    pub status: String,
    #[prost(string, tag = "2")]
    pub message: String,
    #[prost(int32, tag = "3")]
    pub peer_count: i32,
}

/// The behaviour flag that answers from the receiving node's copy and syncs hits with the
/// key's owner in the background.
pub const GLOBAL: i32 = 2;
const UNDER_LIMIT: i32 = 0;
const OVER_LIMIT: i32 = 1;
/// The rate limit's name; with `unique_key` it names the bucket.
const NAME: &str = "bench";

/// One token-bucket request per key for `limit` (count per period; Gubernator's token bucket
/// has no separate burst: the count is the bucket's size).
pub fn request(keys: &[String], limit: &Limit, behavior: i32) -> GetRateLimitsReq {
    GetRateLimitsReq {
        requests: keys
            .iter()
            .map(|key| RateLimitReq {
                name: NAME.to_owned(),
                unique_key: key.clone(),
                hits: 1,
                limit: limit.rate() as i64,
                duration: (limit.period_ns() / 1_000_000) as i64,
                algorithm: 0,
                behavior,
                burst: 0,
            })
            .collect(),
    }
}

/// Admitted when every key is under its limit. Like redis-cell, a batch is not all-or-nothing:
/// the keys under their limit keep their hit when another is over.
pub fn outcome(answer: &GetRateLimitsResp, keys: usize) -> anyhow::Result<Outcome> {
    anyhow::ensure!(
        answer.responses.len() == keys,
        "GetRateLimits answered {} of {keys} requests",
        answer.responses.len()
    );
    let mut allowed = true;
    for response in &answer.responses {
        anyhow::ensure!(
            response.error.is_empty(),
            "GetRateLimits: {}",
            response.error
        );
        match response.status {
            UNDER_LIMIT => {}
            OVER_LIMIT => allowed = false,
            other => anyhow::bail!("GetRateLimits answered status {other}"),
        }
    }
    Ok(if allowed {
        Outcome::Allowed
    } else {
        Outcome::Denied
    })
}

/// HTTP/2 connections to every node of a cluster; calls take turns over them, so the requests
/// land on every node and each forwards the keys it does not own to their owner, as behind a load
/// balancer.
pub struct GubernatorChannels {
    channels: Connections,
    limit: Limit,
    behavior: i32,
    /// The cluster's nodes the channels go to.
    nodes: usize,
}

impl std::fmt::Debug for GubernatorChannels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GubernatorChannels({} channels)", self.channels.len())
    }
}

async fn connect(addr: std::net::SocketAddr) -> anyhow::Result<Connection> {
    Connection::open(addr)
        .await
        .with_context(|| format!("connecting to Gubernator on {addr}"))
}

async fn unary<Req, Resp>(
    channel: &Connection,
    path: &'static str,
    message: Req,
) -> anyhow::Result<Resp>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    let mut grpc = tonic::client::Grpc::with_origin(channel.clone(), channel.origin().clone());
    grpc.ready().await.context("Gubernator's channel")?;
    let answer = grpc
        .unary(
            tonic::Request::new(message),
            PathAndQuery::from_static(path),
            ProstCodec::<Req, Resp>::default(),
        )
        .await?;
    Ok(answer.into_inner())
}

/// How many peers the node on `addr` sees (itself included).
pub async fn peer_count(addr: std::net::SocketAddr) -> anyhow::Result<i32> {
    let channel = connect(addr).await?;
    let health: HealthCheckResp =
        unary(&channel, "/pb.gubernator.V1/HealthCheck", HealthCheckReq {}).await?;
    Ok(health.peer_count)
}

impl GubernatorChannels {
    /// `per_node` channels to each of `nodes`, every call with `limit` and `behavior`.
    pub async fn connect(
        nodes: &[std::net::SocketAddr],
        per_node: usize,
        limit: Limit,
        behavior: i32,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(!nodes.is_empty(), "no Gubernator node to connect to");
        let addrs: Vec<std::net::SocketAddr> = (0..per_node.max(1))
            .flat_map(|_| nodes.iter().copied())
            .collect();
        let channels = Connections::open(&addrs)
            .await
            .context("connecting to Gubernator")?;
        let cluster = GubernatorChannels {
            channels,
            limit,
            behavior,
            nodes: nodes.len(),
        };
        // One call on a scratch key: a cluster that cannot answer fails here, in words.
        let probe = cluster.check(&["floodgate-bench:probe".to_owned()]).await;
        probe.context("the first GetRateLimits call failed")?;
        Ok(cluster)
    }

    /// The cluster's nodes the calls are spread over.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// One `GetRateLimits` call carrying one request per key.
    pub async fn check(&self, keys: &[String]) -> anyhow::Result<Outcome> {
        let turn = self.channels.turn();
        let answer: anyhow::Result<GetRateLimitsResp> = unary(
            &turn.connection,
            "/pb.gubernator.V1/GetRateLimits",
            request(keys, &self.limit, self.behavior),
        )
        .await;
        if answer.is_err() {
            self.channels.recover(&turn).await;
        }
        outcome(&answer?, keys.len())
    }
}

#[cfg(test)]
mod tests {
    use floodgate::NANOS_PER_SEC;
    use prost::Message;

    use super::*;

    #[test]
    fn a_request_carries_the_limit_as_a_token_bucket_per_key() {
        let limit = Limit::gcra(1_000, 3_600 * NANOS_PER_SEC, 1_000).unwrap();
        let keys = ["user:7", "ip:3"].map(str::to_owned);
        let batch = request(&keys, &limit, GLOBAL);
        assert_eq!(batch.requests.len(), 2);
        let first = &batch.requests[0];
        assert_eq!(
            (
                first.unique_key.as_str(),
                first.hits,
                first.limit,
                first.duration
            ),
            ("user:7", 1, 1_000, 3_600_000)
        );
        assert_eq!((first.algorithm, first.behavior), (0, GLOBAL));
        // Field 2 (unique_key) is a length-delimited string: tag byte 0x12.
        let bytes = first.encode_to_vec();
        assert!(
            bytes
                .windows(8)
                .any(|w| w == b"\x12\x06user:7"[..8].as_ref())
        );
    }

    #[test]
    fn an_answer_is_admitted_only_when_every_key_is_under_its_limit() {
        let resp = |statuses: &[i32]| GetRateLimitsResp {
            responses: statuses
                .iter()
                .map(|&status| RateLimitResp {
                    status,
                    ..Default::default()
                })
                .collect(),
        };
        assert_eq!(outcome(&resp(&[0, 0]), 2).unwrap(), Outcome::Allowed);
        assert_eq!(outcome(&resp(&[0, 1]), 2).unwrap(), Outcome::Denied);
        assert!(outcome(&resp(&[0]), 2).is_err());
        assert!(outcome(&resp(&[5]), 1).is_err());
        let mut failed = resp(&[0]);
        failed.responses[0].error = "no peer".to_owned();
        assert!(outcome(&failed, 1).is_err());
    }
}
