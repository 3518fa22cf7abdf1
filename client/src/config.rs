//! `ClientConfig`: every knob of the client, its defaults, and validation done once at connect.

use std::path::PathBuf;
use std::time::Duration;

use floodgate::StoreConfig;

use crate::address::HostPort;
use crate::error::ConfigError;

/// Longest key a node accepts (the protocol's default `max_key_bytes`, the core's bound on the
/// policy's keys); longer keys are refused client-side so one bad call can never get a shared
/// frame refused.
pub use floodgate::policy::MAX_KEY_BYTES;

/// Most checks one frame may carry: the node's default `max_batch` (a node refuses larger
/// frames, and a refused shared frame is resent call by call).
pub const MAX_CHECKS_PER_FRAME: usize = 4_096;

/// Most streams per connection: the node's default stream limit per connection. Streams past a
/// node's limit would wait for credit forever (holding no calls, but useless), and more streams
/// buy little anyway: one quinn connection's state sits behind one lock, about one core of
/// work, so throughput comes from more connections, not more streams.
pub const MAX_STREAMS_PER_CONNECTION: usize = 16;

/// The longest any of the client's durations may be: timeouts, the breaker's cooldown, reconnect
/// pauses and token leases' periods. Longer is never meant (a call waits a day at most), and
/// deadlines are sums with `Instant`s that must not overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3_600);

/// Where the certificate authorities that sign node certificates come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaSource {
    /// A PEM file with one or more CA certificates.
    File(PathBuf),
    /// The same, already in memory.
    Pem(Vec<u8>),
}

/// A client certificate chain and its key (PEM files), for nodes that require mutual TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientAuth {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// When a node's circuit opens and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive failed calls (timeouts, lost answers) that open the circuit.
    pub failure_threshold: u32,
    /// How long an open circuit sends calls straight to their failure mode before letting one
    /// probe through. Also the `retry_after` of fail-closed denials.
    pub cooldown: Duration,
}

impl Default for BreakerConfig {
    /// Five failures, then 250 ms. A node that is gone is found by its link (the connection
    /// closes, or its idle timeout passes) and its calls go to its successor; the breaker only
    /// spares callers the wait for a node that answers nothing. At a 5 ms deadline, one probe
    /// every 250 ms costs little, while a longer cooldown turned every 10 ms hiccup of a busy
    /// host (five calls timing out together) into a second of failure modes.
    fn default() -> Self {
        BreakerConfig {
            failure_threshold: 5,
            cooldown: Duration::from_millis(250),
        }
    }
}

/// Reconnect delays: exponential from `initial` to `max`, each randomised ("equal jitter") so
/// gateways that lost a node together do not return in lockstep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffConfig {
    pub initial: Duration,
    pub max: Duration,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        BackoffConfig {
            initial: Duration::from_millis(20),
            max: Duration::from_secs(2),
        }
    }
}

/// Token leases for hot keys: a key checked at this gateway above `hot_above_per_sec` is
/// decided here against tokens leased from its owner (see docs/LEASES.md, "Hot keys: token
/// leases"). Off by default: every check then goes to its owner, except those of a rule with
/// `lease_above` (which uses its own threshold and these other settings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenLeaseConfig {
    pub enabled: bool,
    /// Units per second (of single-check calls on one key, at this gateway) from which the key
    /// is leased.
    pub hot_above_per_sec: u64,
    /// A lease is about this long a share of the gateway's rate for the key.
    pub lease_period: Duration,
    /// Unused tokens lapse this long after they were asked for and are returned to the owner.
    pub ttl: Duration,
    /// Most keys the gateway meters and leases at once (memory bound).
    pub max_keys: usize,
}

impl Default for TokenLeaseConfig {
    fn default() -> Self {
        TokenLeaseConfig {
            enabled: false,
            hot_above_per_sec: 500,
            lease_period: Duration::from_millis(100),
            ttl: Duration::from_secs(1),
            max_keys: 1_024,
        }
    }
}

/// Everything [`crate::Client::connect`] needs besides the node addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientConfig {
    /// CAs that sign the nodes' certificates.
    pub ca: CaSource,
    /// Our certificate, for nodes that require mutual TLS.
    pub client_auth: Option<ClientAuth>,
    /// Name the seed nodes' certificates (the nodes given to `connect`) must carry: a DNS name
    /// or an IP address. `None`: each seed's host as given (its DNS name, or its IP address). Members discovered from
    /// the slot table are always verified by their node id (see docs/PROTOCOL.md, Trust).
    pub server_name: Option<String>,
    /// Longest a `check` call waits for a node before its failure mode decides.
    pub timeout: Duration,
    /// Longest one connection attempt (QUIC + TLS handshake) may take; `connect` waits at most
    /// this long for the first attempts.
    pub connect_timeout: Duration,
    /// Long-lived streams per connection, each carrying one frame at a time. Under load, one
    /// frame is in flight while few calls wait; the others carry frames only once half of
    /// `max_checks_per_frame` is waiting, or the frame in flight has been out over 1 ms. At
    /// light load (the frame sent last had under 8 checks) every free stream sends at once.
    pub streams_per_connection: usize,
    /// Most checks coalesced into one frame (and so the most one `check` call may carry).
    pub max_checks_per_frame: usize,
    /// Most checks waiting for a free stream per node; beyond, calls fail over at once
    /// ([`crate::DegradedReason::Backlog`]) instead of waiting out their timeout.
    pub max_queued_checks: usize,
    /// A connection with no traffic (keep-alives included) for this long is dead.
    pub idle_timeout: Duration,
    pub breaker: BreakerConfig,
    pub reconnect: BackoffConfig,
    /// Size of the local store that decides `FailureMode::Open` checks while a node is away.
    pub fallback_store: StoreConfig,
    /// The region of the nodes this client talks to (a gateway talks to its own region's nodes
    /// only): a slot table from a node of another region is ignored. `None`: the region of the
    /// first table the client takes, kept from then on (seeds of several regions never make it
    /// route by two regions' tables at once).
    pub region: Option<String>,
    /// Token leases for hot keys (off by default).
    pub token_leases: TokenLeaseConfig,
}

impl ClientConfig {
    /// Defaults for a gateway beside its nodes: a 5 ms call timeout, 4 streams, frames of up to
    /// 1,024 checks.
    pub fn new(ca: CaSource) -> Self {
        ClientConfig {
            ca,
            client_auth: None,
            server_name: None,
            timeout: Duration::from_millis(5),
            connect_timeout: Duration::from_secs(1),
            streams_per_connection: 4,
            max_checks_per_frame: 1_024,
            max_queued_checks: 64 * 1_024,
            idle_timeout: Duration::from_secs(3),
            breaker: BreakerConfig::default(),
            reconnect: BackoffConfig::default(),
            fallback_store: StoreConfig {
                max_keys: 64 * 1_024,
                shards: 16,
            },
            region: None,
            token_leases: TokenLeaseConfig::default(),
        }
    }

    /// The same with a CA file.
    pub fn with_ca_file(path: impl Into<PathBuf>) -> Self {
        ClientConfig::new(CaSource::File(path.into()))
    }

    /// Checks every field and their combinations; file contents are checked when the TLS
    /// configuration is built.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_names()?;
        self.validate_calls()?;
        self.validate_recovery()?;
        self.validate_token_leases()
    }

    /// The name nodes are verified by, and the region.
    fn validate_names(&self) -> Result<(), ConfigError> {
        if let Some(name) = &self.server_name
            && rustls::pki_types::ServerName::try_from(name.as_str()).is_err()
        {
            return invalid(
                "server_name",
                &format!("`{name}` is not a DNS name or IP address"),
            );
        }
        if let Some(region) = &self.region
            && let Err(e) = floodgate::region::RegionName::new(region)
        {
            return invalid("region", &e.to_string());
        }
        Ok(())
    }

    /// Timeouts, streams and frames, the queue, and idle connections.
    fn validate_calls(&self) -> Result<(), ConfigError> {
        positive_within_a_day("timeout", self.timeout)?;
        positive_within_a_day("connect_timeout", self.connect_timeout)?;
        if !(1..=MAX_STREAMS_PER_CONNECTION).contains(&self.streams_per_connection) {
            return invalid(
                "streams_per_connection",
                &format!(
                    "{} is outside 1..={MAX_STREAMS_PER_CONNECTION}",
                    self.streams_per_connection
                ),
            );
        }
        if !(1..=MAX_CHECKS_PER_FRAME).contains(&self.max_checks_per_frame) {
            return invalid(
                "max_checks_per_frame",
                &format!(
                    "{} is outside 1..={MAX_CHECKS_PER_FRAME} (a node refuses larger frames)",
                    self.max_checks_per_frame
                ),
            );
        }
        if self.max_queued_checks < self.max_checks_per_frame {
            return invalid(
                "max_queued_checks",
                &format!(
                    "{} is below max_checks_per_frame ({}): a full call could never queue",
                    self.max_queued_checks, self.max_checks_per_frame
                ),
            );
        }
        // quinn needs an idle timeout it can encode (below 2^62 ms) and at least one keep-alive
        // interval (1 s) inside it, or idle connections would die between keep-alives.
        if self.idle_timeout < Duration::from_secs(2)
            || quinn::IdleTimeout::try_from(self.idle_timeout).is_err()
        {
            return invalid(
                "idle_timeout",
                "must be at least 2 s (keep-alives go every 1 s)",
            );
        }
        Ok(())
    }

    /// The breaker, reconnecting, and the local fallback bucket store.
    fn validate_recovery(&self) -> Result<(), ConfigError> {
        if self.breaker.failure_threshold == 0 {
            return invalid("breaker.failure_threshold", "must be at least 1");
        }
        positive_within_a_day("breaker.cooldown", self.breaker.cooldown)?;
        positive_within_a_day("reconnect.initial", self.reconnect.initial)?;
        positive_within_a_day("reconnect.max", self.reconnect.max)?;
        if self.reconnect.max < self.reconnect.initial {
            return invalid(
                "reconnect.max",
                &format!(
                    "{:?} is below reconnect.initial ({:?})",
                    self.reconnect.max, self.reconnect.initial
                ),
            );
        }
        if let Err(e) = floodgate::BucketStore::new(self.fallback_store) {
            return invalid("fallback_store", &e.to_string());
        }
        Ok(())
    }

    /// Checked even when off: a rule's `lease_above` uses these settings too.
    fn validate_token_leases(&self) -> Result<(), ConfigError> {
        let leases = &self.token_leases;
        if leases.hot_above_per_sec == 0 {
            return invalid("token_leases.hot_above_per_sec", "must be at least 1");
        }
        positive_within_a_day("token_leases.lease_period", leases.lease_period)?;
        positive_within_a_day("token_leases.ttl", leases.ttl)?;
        if leases.ttl < leases.lease_period {
            return invalid("token_leases.ttl", "must be at least lease_period");
        }
        if !(1..=1 << 20).contains(&leases.max_keys) {
            return invalid("token_leases.max_keys", "must be between 1 and 1048576");
        }
        Ok(())
    }
}

/// More than zero and at most [`MAX_DURATION`].
fn positive_within_a_day(field: &'static str, value: Duration) -> Result<(), ConfigError> {
    if value.is_zero() || value > MAX_DURATION {
        return invalid(
            field,
            &format!("{value:?} is outside 0 (exclusive) to {MAX_DURATION:?}"),
        );
    }
    Ok(())
}

fn invalid(field: &'static str, problem: &str) -> Result<(), ConfigError> {
    Err(ConfigError::Invalid {
        field,
        problem: problem.to_owned(),
    })
}

/// Checks the node list: at least one, none twice.
pub(crate) fn validate_nodes(nodes: &[HostPort]) -> Result<(), ConfigError> {
    if nodes.is_empty() {
        return Err(ConfigError::NoNodes);
    }
    for (i, node) in nodes.iter().enumerate() {
        if nodes[..i].contains(node) {
            return Err(ConfigError::DuplicateNode(node.clone()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ClientConfig {
        ClientConfig::with_ca_file("/nonexistent/ca.pem")
    }

    fn field_of(config: &ClientConfig) -> &'static str {
        match config.validate() {
            Err(ConfigError::Invalid { field, .. }) => field,
            other => panic!("expected an invalid field, got {other:?}"),
        }
    }

    #[test]
    fn defaults_are_valid() {
        assert_eq!(config().validate(), Ok(()));
    }

    #[test]
    fn each_bad_field_is_named() {
        type Edit = Box<dyn Fn(&mut ClientConfig)>;
        let cases: Vec<(&str, Edit)> = vec![
            (
                "server_name",
                Box::new(|c| c.server_name = Some("no spaces".into())),
            ),
            ("timeout", Box::new(|c| c.timeout = Duration::ZERO)),
            ("timeout", Box::new(|c| c.timeout = Duration::MAX)),
            (
                "connect_timeout",
                Box::new(|c| c.connect_timeout = MAX_DURATION + Duration::from_nanos(1)),
            ),
            (
                "breaker.cooldown",
                Box::new(|c| c.breaker.cooldown = Duration::MAX),
            ),
            (
                "token_leases.lease_period",
                Box::new(|c| c.token_leases.lease_period = Duration::ZERO),
            ),
            (
                "token_leases.ttl",
                Box::new(|c| c.token_leases.ttl = Duration::MAX),
            ),
            (
                "connect_timeout",
                Box::new(|c| c.connect_timeout = Duration::ZERO),
            ),
            (
                "streams_per_connection",
                Box::new(|c| c.streams_per_connection = 0),
            ),
            (
                "streams_per_connection",
                Box::new(|c| c.streams_per_connection = 17),
            ),
            (
                "max_checks_per_frame",
                Box::new(|c| c.max_checks_per_frame = 0),
            ),
            (
                "max_checks_per_frame",
                Box::new(|c| c.max_checks_per_frame = 4_097),
            ),
            ("max_queued_checks", Box::new(|c| c.max_queued_checks = 10)),
            (
                "token_leases.hot_above_per_sec",
                Box::new(|c| c.token_leases.hot_above_per_sec = 0),
            ),
            (
                "token_leases.ttl",
                Box::new(|c| c.token_leases.ttl = Duration::from_millis(10)),
            ),
            (
                "token_leases.max_keys",
                Box::new(|c| c.token_leases.max_keys = 0),
            ),
            (
                "idle_timeout",
                Box::new(|c| c.idle_timeout = Duration::from_millis(500)),
            ),
            (
                "breaker.failure_threshold",
                Box::new(|c| c.breaker.failure_threshold = 0),
            ),
            (
                "breaker.cooldown",
                Box::new(|c| c.breaker.cooldown = Duration::ZERO),
            ),
            (
                "reconnect.initial",
                Box::new(|c| c.reconnect.initial = Duration::ZERO),
            ),
            (
                "reconnect.max",
                Box::new(|c| c.reconnect.max = Duration::from_millis(1)),
            ),
            (
                "reconnect.max",
                Box::new(|c| c.reconnect.max = Duration::MAX),
            ),
            ("fallback_store", Box::new(|c| c.fallback_store.shards = 3)),
        ];
        for (field, edit) in cases {
            let mut c = config();
            edit(&mut c);
            assert_eq!(field_of(&c), field);
        }
    }

    #[test]
    fn protocol_bounds_match_the_node_defaults() {
        let node = floodgate::wire::WireLimits::default();
        assert_eq!(MAX_CHECKS_PER_FRAME, node.max_batch);
        assert_eq!(MAX_KEY_BYTES, node.max_key_bytes);
    }

    #[test]
    fn an_ip_address_is_a_valid_server_name() {
        let mut c = config();
        c.server_name = Some("127.0.0.1".into());
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn node_lists_must_be_non_empty_and_distinct() {
        let a: HostPort = "127.0.0.1:7100".parse().unwrap();
        let b: HostPort = "localhost:7100".parse().unwrap();
        assert_eq!(validate_nodes(&[]), Err(ConfigError::NoNodes));
        assert_eq!(
            validate_nodes(&[a.clone(), b.clone(), a.clone()]),
            Err(ConfigError::DuplicateNode(a.clone()))
        );
        assert_eq!(validate_nodes(&[a, b]), Ok(()));
    }
}
