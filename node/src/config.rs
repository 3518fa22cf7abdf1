//! Node configuration: where to listen, which certificates, the cluster and RLS settings, and the
//! limits on everything that comes from outside. The binary fills it from flags; tests build it directly.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use floodgate::cluster::MembershipConfig;
use floodgate::wire::WireLimits;
use floodgate::{HostPort, StoreConfig};

use crate::certs::DevCerts;

#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// UDP address of the QUIC endpoint.
    pub listen: SocketAddr,
    /// TCP address of the admin HTTP server (`/metrics`, `/healthz`, `/readyz`); `None`: off.
    pub admin: Option<SocketAddr>,
    pub tls: TlsConfig,
    pub limits: NodeLimits,
    pub store: StoreConfig,
    pub cluster: ClusterConfig,
    /// The rules file (`--rules`): loaded at start, hot-reloaded, served to clients; `None`: the
    /// node serves no rules (clients then bring their own).
    pub rules: Option<PathBuf>,
    /// `--state-dir`: where long-period buckets are snapshotted and loaded from; `None`: nowhere.
    pub state_dir: Option<PathBuf>,
    /// `--rls-listen` / `--rls-config`: Envoy's rate limit service; `None`: off.
    pub rls: Option<RlsSettings>,
    /// `--rlqs-listen`: Envoy's rate limit quota service, on `rls`'s configuration; `None`: off.
    pub rlqs: Option<RlqsSettings>,
    /// `--rlqs-global-domain`: the RLQS domains whose buckets' limits are shared across regions
    /// (with or without `--rlqs-listen`: a bucket's owner needs them).
    pub rlqs_global_domains: std::collections::BTreeSet<String>,
    /// `--resp-listen`: the Redis protocol front (`CL.THROTTLE`); `None`: off.
    pub resp: Option<RespSettings>,
    /// TEST ONLY (`--test-only-clock-skew-ms`): how far this node's clock reads ahead of the
    /// system clock (negative: behind), so the chaos harness can skew one node. 0 in production.
    pub test_only_clock_skew_ns: i64,
}

#[derive(Debug, Clone)]
pub struct TlsConfig {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// When set, clients must present a certificate signed by this CA (mutual TLS).
    pub client_ca: Option<PathBuf>,
    /// The CA that signs the other nodes' certificates: peers are verified against it and this
    /// node presents its own certificate to them. Without it the node cannot join a cluster.
    pub peer_ca: Option<PathBuf>,
}

/// Bounds on what peers can make the node hold or do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeLimits {
    /// Largest frame payload accepted; a larger length prefix closes the stream.
    pub max_frame_bytes: usize,
    /// Most checks in one frame.
    pub max_batch: usize,
    /// Longest key, in bytes.
    pub max_key_bytes: usize,
    /// Most concurrent client connections; more are closed with `overloaded` after the
    /// handshake (only then does the node know a client from a peer).
    pub max_connections: usize,
    /// Most concurrent peer connections (a certificate from the cluster CA), counted apart
    /// from clients so a flood of clients cannot cut the node off from gossip.
    pub max_peer_connections: usize,
    /// Most bytes buffered for all streams of all connections together (partial frames, peer
    /// messages, answers not yet written); a stream whose frames would go over is closed with
    /// `overloaded`, a frame whose answers would is answered `overloaded`, undecided.
    pub max_buffered_bytes: usize,
    /// Most concurrent streams per connection (QUIC flow control enforces it).
    pub max_streams_per_connection: u32,
    /// Most concurrency leases held on this node at once, all keys together, replicas
    /// included; an acquire past it is answered `store_full`.
    pub max_leases: usize,
    /// Most bytes the node's state may take: buckets (sliding logs by the room they keep) get
    /// 7/8 and evict past it, concurrency leases 1/8 (see [`NodeLimits::lease_cap`]).
    pub max_store_bytes: usize,
    /// Longest period a caller's limit may have; longer is refused as `invalid_limit`.
    pub max_limit_period: Duration,
    /// Largest sliding-log limit a caller may ask for; larger is refused as `invalid_limit`.
    pub max_log_limit: u64,
    /// Longest the node waits for a caller to take an answer (QUIC flow control: a caller
    /// that stops reading blocks the node's writes); past it the stream is reset.
    pub write_timeout: std::time::Duration,
}

impl Default for NodeLimits {
    fn default() -> Self {
        NodeLimits {
            max_frame_bytes: 1 << 20,
            max_batch: 4_096,
            max_key_bytes: 256,
            max_connections: 1_024,
            max_peer_connections: 256,
            max_buffered_bytes: 256 << 20,
            max_streams_per_connection: 16,
            max_leases: 1_000_000,
            max_store_bytes: floodgate::DEFAULT_MAX_STORE_BYTES,
            // Monthly quotas (30 days) pass; a yearly one needs the flag raised.
            max_limit_period: Duration::from_secs(31 * 86_400),
            max_log_limit: floodgate::SLIDING_LOG_MAX_LIMIT,
            write_timeout: std::time::Duration::from_secs(5),
        }
    }
}

/// How many bytes QUIC may hold for the node outside its own budget
/// (`--max-buffered-bytes`): a caller may send at most `stream_receive` unread bytes on one
/// stream (one frame of the largest size) and a client `connection_receive` on one connection
/// (one frame, or the connection's share of the budget if that is more; a peer is bounded by
/// its streams instead), and the node buffers at most `send` bytes of answers per connection. quinn's defaults (1.25 MB a stream, no
/// connection limit, 10 MB to send) bound none of it by what the node was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuicWindows {
    pub stream_receive: u64,
    pub connection_receive: u64,
    pub send: u64,
}

/// HTTP/2's largest flow-control window, 2^31 - 1 bytes (h2 asserts it).
pub const MAX_HTTP2_WINDOW: u32 = i32::MAX as u32;

/// The HTTP/2 listeners' keepalive (the RLS and RLQS fronts): a PING this often (the RLQS
/// listener's, hyper's, once nothing arrived for this long), which the caller must answer
/// within [`HTTP2_KEEPALIVE_TIMEOUT`] or lose its connection. Without it, a
/// caller that vanished (its machine gone, a NAT that dropped the flow) while holding a health
/// `Watch` or an RLQS stream would keep its connection, and a place of `--max-connections`,
/// until TCP noticed, which can take hours. Envoy answers PINGs in its codec.
pub const HTTP2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(60);
/// How long a caller has to answer a keepalive PING.
pub const HTTP2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// How long the HTTP/2 listeners (the RLS and RLQS fronts) give a caller for its TLS handshake,
/// and then as long for its HTTP/2 connection preface: a caller that stalls them holds a place
/// of `--max-connections`. Envoy takes milliseconds.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The windows of an HTTP/2 listener (the RLS and RLQS fronts): the QUIC ones, each at most
/// [`MAX_HTTP2_WINDOW`] (a large `--max-buffered-bytes` share would pass it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Http2Windows {
    pub stream: u32,
    pub connection: u32,
}

impl NodeLimits {
    /// The HTTP/2 flow-control windows, from these limits (see [`Http2Windows`]).
    pub fn http2_windows(&self) -> Http2Windows {
        let windows = self.quic_windows();
        let clamp = |bytes: u64| {
            u32::try_from(bytes.min(u64::from(MAX_HTTP2_WINDOW))).unwrap_or(MAX_HTTP2_WINDOW)
        };
        Http2Windows {
            stream: clamp(windows.stream_receive),
            connection: clamp(windows.connection_receive),
        }
    }

    /// The QUIC flow-control windows, from these limits (see [`QuicWindows`]).
    pub fn quic_windows(&self) -> QuicWindows {
        let one_frame = (self.max_frame_bytes + floodgate::wire::HEADER_BYTES) as u64;
        let connections = (self.max_connections + self.max_peer_connections).max(1) as u64;
        let share = self.max_buffered_bytes as u64 / connections;
        QuicWindows {
            stream_receive: one_frame,
            connection_receive: one_frame.max(share),
            send: 2 * one_frame,
        }
    }

    pub fn wire(&self) -> WireLimits {
        WireLimits {
            max_batch: self.max_batch,
            max_key_bytes: self.max_key_bytes,
            max_period_ns: u64::try_from(self.max_limit_period.as_nanos()).unwrap_or(u64::MAX),
            max_log_limit: self.max_log_limit,
        }
    }

    /// The bytes the bucket store may hold: 7/8 of `max_store_bytes`.
    pub fn bucket_bytes(&self) -> usize {
        self.max_store_bytes / 8 * 7
    }

    /// Most leases held at once: `max_leases`, or fewer if that many would cost more than the
    /// leases' 1/8 of `max_store_bytes` ([`floodgate::lease::LEASE_BYTES`] each).
    pub fn lease_cap(&self) -> usize {
        let by_bytes = self.max_store_bytes / 8 / floodgate::lease::LEASE_BYTES;
        self.max_leases.min(by_bytes).max(1)
    }

    /// Checks the cross-field rules once, at start.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.max_frame_bytes >= 1024,
            "max frame bytes must be at least 1024"
        );
        anyhow::ensure!(
            self.max_frame_bytes <= 64 << 20,
            "max frame bytes must be at most 64 MiB"
        );
        anyhow::ensure!(self.max_batch >= 1, "max batch must be at least 1");
        anyhow::ensure!(
            (1..=65_535).contains(&self.max_key_bytes),
            "max key bytes must be in 1..=65535"
        );
        anyhow::ensure!(
            self.max_connections >= 1,
            "max connections must be at least 1"
        );
        anyhow::ensure!(
            self.max_peer_connections >= 1,
            "max peer connections must be at least 1"
        );
        let one_frame = self.max_frame_bytes + crate::budget::READ_BYTES;
        anyhow::ensure!(
            self.max_buffered_bytes >= 2 * one_frame,
            "max buffered bytes must be at least {} (twice max frame bytes plus one read of \
             {} bytes), so a frame of the largest size can always be buffered",
            2 * one_frame,
            crate::budget::READ_BYTES
        );
        anyhow::ensure!(
            (1..=100_000_000).contains(&self.max_leases),
            "max leases must be in 1..=100000000"
        );
        let least = floodgate::MIN_SHARD_BYTES * StoreConfig::default().shards / 7 * 8;
        anyhow::ensure!(
            self.max_store_bytes >= least,
            "max store bytes must be at least {least} ({} KiB for each of the store's {} shards, \
             as 7/8 of it)",
            floodgate::MIN_SHARD_BYTES >> 10,
            StoreConfig::default().shards
        );
        let period_ns = self.max_limit_period.as_nanos();
        anyhow::ensure!(
            (u128::from(floodgate::MIN_PERIOD_NS)..=u128::from(floodgate::MAX_PERIOD_NS))
                .contains(&period_ns),
            "max limit period must be 1ms to 366d"
        );
        anyhow::ensure!(
            (1..=floodgate::SLIDING_LOG_MAX_LIMIT).contains(&self.max_log_limit),
            "max log limit must be in 1..={}",
            floodgate::SLIDING_LOG_MAX_LIMIT
        );
        anyhow::ensure!(
            self.max_streams_per_connection >= 1,
            "max streams per connection must be at least 1"
        );
        Ok(())
    }
}

impl NodeConfig {
    /// A node on 127.0.0.1 with an OS-chosen port, no admin server, default limits, and the
    /// development certificates: what in-process tests start.
    pub fn for_tests(dev: &DevCerts) -> Self {
        NodeConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin: None,
            tls: TlsConfig {
                cert: dev.node_cert.clone(),
                key: dev.node_key.clone(),
                client_ca: None,
                peer_ca: Some(dev.ca.clone()),
            },
            limits: NodeLimits::default(),
            store: StoreConfig {
                max_keys: 1 << 20,
                shards: 64,
            },
            cluster: ClusterConfig::default(),
            rules: None,
            state_dir: None,
            rls: None,
            rlqs: None,
            rlqs_global_domains: Default::default(),
            resp: None,
            test_only_clock_skew_ns: 0,
        }
    }
}

/// How this node takes part in a cluster.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// Stable id of this node (default: its advertised address).
    pub node_id: Option<String>,
    pub region: String,
    /// Address peers and clients reach this node at (default: the listen address).
    pub advertise: Option<SocketAddr>,
    /// Any members to join through: IP addresses or DNS names, a name resolved again each time
    /// the seed is dialed (its address may change, as a restarted pod's does).
    pub seeds: Vec<HostPort>,
    pub membership: MembershipConfig,
    /// How often changed buckets go to each slot's successor.
    pub sync_interval: Duration,
    /// Ready (`/readyz`) even while no seed has answered (`--allow-alone`).
    pub allow_alone: bool,
    /// How often the owner of a global key sends what it admitted to the key's owner in every
    /// other region (`--region-sync-interval`).
    pub region_sync_interval: Duration,
    /// How long a destination may confirm nothing before it stops holding local admissions back,
    /// and how long unconfirmed units a hand-off brought count (no flag: the exchange's
    /// default of 2 s; a test lengthens it where a loaded host could outlast it).
    pub region_unreachable_after: Duration,
    /// How long a takeover forwarded to an owner held alive waits for its answer before it is
    /// answered `try_again` (`--takeover-forward-timeout`).
    pub takeover_forward_timeout: Duration,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            node_id: None,
            region: "local".to_owned(),
            advertise: None,
            seeds: Vec::new(),
            membership: MembershipConfig::default(),
            sync_interval: Duration::from_millis(100),
            allow_alone: false,
            region_sync_interval: Duration::from_millis(100),
            region_unreachable_after: Duration::from_nanos(
                floodgate::region::ExchangeConfig::default().unreachable_after_ns,
            ),
            takeover_forward_timeout: Duration::from_millis(3),
        }
    }
}

/// `--rls-listen`, `--rls-config`, `--rls-rate-limit-headers`, `--rls-tls`,
/// `--rls-client-auth`, `--rls-allow-negative-hits`.
#[derive(Debug, Clone)]
pub struct RlsSettings {
    pub listen: SocketAddr,
    /// A file, or a directory of YAML files, in envoyproxy/ratelimit's format.
    pub config: PathBuf,
    /// Add the draft-10 `RateLimit-Policy` and `RateLimit` fields to `response_headers_to_add`.
    pub rate_limit_headers: bool,
    /// Serve over TLS with the node's certificate and key (otherwise plaintext HTTP/2).
    pub tls: bool,
    /// With `tls`: require a client certificate signed by the node's client CA
    /// (`TlsConfig::client_ca`); a caller without one is refused in the handshake.
    pub client_auth: bool,
    /// Honour descriptors' `is_negative_hits` (units given back). Off: such a descriptor is
    /// refused (`INVALID_ARGUMENT`) and the request decides nothing.
    pub allow_negative_hits: bool,
}

impl RlsSettings {
    /// The cross-field rules, checked at start: client certificates need TLS and a client CA.
    pub fn validate(&self, tls: &TlsConfig) -> anyhow::Result<()> {
        if self.client_auth {
            anyhow::ensure!(
                self.tls,
                "--rls-client-auth needs --rls-tls: client certificates are asked for in the TLS handshake"
            );
            anyhow::ensure!(
                tls.client_ca.is_some(),
                "--rls-client-auth needs --client-ca PEM: the CA whose client certificates the RLS listener accepts"
            );
        }
        Ok(())
    }
}

/// `--rlqs-listen`, `--rlqs-assignment-ttl`, `--rlqs-idle-reports`: Envoy's rate limit quota
/// service (RLQS), its limits from the RLS configuration (`--rls-config`).
#[derive(Debug, Clone)]
pub struct RlqsSettings {
    pub listen: SocketAddr,
    /// How long an assignment binds an Envoy, in whole seconds (Envoy ignores fractions); more
    /// than Envoy's report period (5 s), as each report renews it.
    pub assignment_ttl_s: u32,
    /// A bucket reported this many times in a row with no requests is abandoned (the Envoy
    /// forgets it, and its share returns to the others); 0: never.
    pub idle_reports_before_abandon: u32,
    /// Most Envoys sharing one bucket; more get no assignment.
    pub max_envoys_per_bucket: usize,
    /// Most buckets one stream reports; more get no assignment.
    pub max_buckets_per_stream: usize,
    /// Most buckets the node holds; more get no assignment.
    pub max_buckets: usize,
    /// Most bytes of keys and values in one `BucketId`; a larger one is ignored.
    pub max_bucket_id_bytes: usize,
    /// Serve over TLS with the node's certificate and key (otherwise plaintext HTTP/2).
    pub tls: bool,
    /// With `tls`: require a client certificate signed by the node's client CA.
    pub client_auth: bool,
    /// The domains whose buckets' limits are split among regions (`scope: global`).
    pub global_domains: std::collections::BTreeSet<String>,
}

impl RlqsSettings {
    /// The defaults on `listen`.
    pub fn new(listen: SocketAddr) -> RlqsSettings {
        RlqsSettings {
            listen,
            assignment_ttl_s: 15,
            idle_reports_before_abandon: 120,
            max_envoys_per_bucket: 256,
            max_buckets_per_stream: 10_000,
            max_buckets: 100_000,
            max_bucket_id_bytes: 1_024,
            tls: false,
            client_auth: false,
            global_domains: Default::default(),
        }
    }

    /// The rules checked at start: a time to live Envoy can use, bounds of at least one, and
    /// client certificates only with TLS and a client CA.
    pub fn validate(&self, tls: &TlsConfig) -> anyhow::Result<()> {
        if self.client_auth {
            anyhow::ensure!(
                self.tls,
                "--rlqs-client-auth needs --rlqs-tls: client certificates are asked for in the TLS handshake"
            );
            anyhow::ensure!(
                tls.client_ca.is_some(),
                "--rlqs-client-auth needs --client-ca PEM: the CA whose client certificates the RLQS listener accepts"
            );
        }
        anyhow::ensure!(
            (1..=86_400).contains(&self.assignment_ttl_s),
            "--rlqs-assignment-ttl must be 1 to 86400 seconds (Envoy expires a shorter one at once)"
        );
        anyhow::ensure!(
            self.max_envoys_per_bucket > 0
                && self.max_buckets_per_stream > 0
                && self.max_buckets > 0,
            "the RLQS bounds must be at least 1"
        );
        Ok(())
    }
}

/// `--resp-listen`, `--resp-password-file` (or `FLOODGATE_RESP_PASSWORD`),
/// `--resp-failure-mode`.
#[derive(Clone)]
pub struct RespSettings {
    pub listen: std::net::SocketAddr,
    /// What `AUTH` must give before any other command is served; `None`: no password.
    pub password: Option<String>,
    /// What a `CL.THROTTLE` the cluster could not decide is answered.
    pub failure_mode: RespFailureMode,
    /// Caps on one command's arguments and bytes.
    pub limits: floodgate::resp::RespLimits,
    /// Serve over TLS with the node's certificate (`--resp-tls`).
    pub tls: bool,
    /// With `tls`: require a client certificate signed by the client CA (`--resp-client-auth`).
    pub client_auth: bool,
}

impl std::fmt::Debug for RespSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password itself: configurations end up in logs.
        f.debug_struct("RespSettings")
            .field("listen", &self.listen)
            .field("password", &self.password.as_ref().map(|_| "<set>"))
            .field("failure_mode", &self.failure_mode)
            .field("limits", &self.limits)
            .field("tls", &self.tls)
            .field("client_auth", &self.client_auth)
            .finish()
    }
}

impl RespSettings {
    /// Plain settings on `listen`: no password, failing closed, the default caps.
    pub fn on(listen: std::net::SocketAddr) -> Self {
        RespSettings {
            listen,
            password: None,
            failure_mode: RespFailureMode::Closed,
            limits: floodgate::resp::RespLimits::default(),
            tls: false,
            client_auth: false,
        }
    }
}

/// How `CL.THROTTLE` answers when its key's owner could not decide it (unreachable, shutting
/// down, the store full).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RespFailureMode {
    /// An error reply, which the client sees (the default).
    #[default]
    Closed,
    /// Allowed, as if the bucket were full.
    Open,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http2_windows_are_the_quic_ones_within_http2s_largest() {
        let limits = NodeLimits {
            max_buffered_bytes: 16 << 30,
            max_connections: 1,
            max_peer_connections: 1,
            ..NodeLimits::default()
        };
        let (quic, http2) = (limits.quic_windows(), limits.http2_windows());
        assert!(quic.connection_receive > u64::from(MAX_HTTP2_WINDOW));
        assert_eq!(http2.connection, MAX_HTTP2_WINDOW);
        assert_eq!(u64::from(http2.stream), quic.stream_receive);
    }

    #[test]
    fn quic_windows_follow_the_frame_size_and_the_budget() {
        let limits = NodeLimits::default();
        let one_frame = (1 << 20) + 16;
        assert_eq!(
            limits.quic_windows(),
            QuicWindows {
                stream_receive: one_frame,
                // 256 MiB over 1,280 connections is less than a frame: one frame each.
                connection_receive: one_frame,
                send: 2 * one_frame,
            }
        );
        let few = NodeLimits {
            max_connections: 8,
            max_peer_connections: 8,
            ..limits
        };
        assert_eq!(few.quic_windows().connection_receive, (256 << 20) / 16);
        // Whatever the limits, every window holds one frame of the largest size.
        let tight = NodeLimits {
            max_frame_bytes: 1024,
            max_buffered_bytes: 2 * (1024 + crate::budget::READ_BYTES),
            ..limits
        };
        let windows = tight.quic_windows();
        assert!(windows.stream_receive >= 1024 + 16 && windows.connection_receive >= 1024 + 16);
    }

    #[test]
    fn the_buffer_budget_must_hold_two_largest_frames_and_peers_need_a_place() {
        assert!(NodeLimits::default().validate().is_ok());
        let limits = NodeLimits {
            max_frame_bytes: 1 << 20,
            max_buffered_bytes: 2 << 20,
            ..NodeLimits::default()
        };
        let error = limits.validate().unwrap_err().to_string();
        assert!(
            error.contains("max buffered bytes must be at least 2228224"),
            "{error}"
        );
        let enough = NodeLimits {
            max_buffered_bytes: 2 * ((1 << 20) + crate::budget::READ_BYTES),
            ..limits
        };
        assert!(enough.validate().is_ok());
        let no_peers = NodeLimits {
            max_peer_connections: 0,
            ..NodeLimits::default()
        };
        assert!(no_peers.validate().is_err());
    }
}
