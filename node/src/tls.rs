//! The node's TLS: the QUIC server configuration (TLS 1.3 only, one ALPN id per protocol
//! version, optional mutual TLS), the client configurations it dials peers with, and who counts
//! as a peer.
//!
//! Versions: a node offers and accepts the ALPN ids of every protocol version it speaks,
//! highest first, so a connection speaks the highest version both ends share
//! ([`agreed_version`]); a caller that shares none is refused in the handshake, and logged at
//! ERROR with both ranges ([`VersionCheck`]).
//!
//! Trust: a peer is a connection whose certificate chains to the peer CA (`--peer-ca`) and is a
//! node certificate (valid for server authentication too, see [`PeerTrust`]). A client
//! certificate, from `--client-ca` or any other CA, never grants peer rights. Peers are dialed
//! with their node id as the server name ([`server_name_of`]); a seed, whose id is not known
//! yet, with any node certificate from the peer CA.

use std::any::Any;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use floodgate::protocol::{self, SUPPORTED, VersionRange};
use floodgate::wire::{ACK_ELICITING_THRESHOLD, MAX_ACK_DELAY, MAX_DATAGRAM_BYTES};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::certs::{load_certs, load_key};
use crate::config::{NodeLimits, TlsConfig};
use crate::endpoint_keys::LifeKeys;
use crate::node_id::validate_node_id;

/// The crypto provider, named explicitly so the build never depends on a process-wide default.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

pub fn server_config(tls: &TlsConfig, limits: &NodeLimits) -> anyhow::Result<quinn::ServerConfig> {
    let chain = load_certs(&tls.cert)?;
    let key = load_key(&tls.key)?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?;
    // The handshake accepts clients (from the client CA) and peers (from the peer CA) alike;
    // which of them may act as a peer is decided afterwards, by `PeerTrust`.
    let builder = match (&tls.client_ca, &tls.peer_ca) {
        (Some(client_ca), peer_ca) => {
            let mut roots = roots(client_ca)?;
            if let Some(peer_ca) = peer_ca {
                roots.roots.extend(self::roots(peer_ca)?.roots);
            }
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider()).build()?;
            builder.with_client_cert_verifier(verifier)
        }
        // Clients may come without a certificate; peers present one signed by the peer CA.
        (None, Some(peer_ca)) => {
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots(peer_ca)?), provider())
                    .allow_unauthenticated()
                    .build()?;
            builder.with_client_cert_verifier(verifier)
        }
        (None, None) => builder.with_no_client_auth(),
    };
    let certified = rustls::sign::CertifiedKey::from_der(chain, key, &provider())
        .context("the node certificate and key do not match")?;
    // The recorder first: a counter taken before it is installed counts nowhere, and the
    // endpoint's configuration is built before the node's other metrics.
    crate::metrics::recorder();
    let mut crypto = builder.with_cert_resolver(Arc::new(VersionCheck {
        certified: Arc::new(certified),
        logged: parking_lot::Mutex::new(std::collections::HashMap::new()),
        mismatches: metrics::counter!("floodgate_protocol_mismatches_total", "direction" => "inbound"),
    }));
    crypto.alpn_protocols = SUPPORTED.alpn_ids();
    // 0-RTT data can be replayed, and a replayed check consumes tokens: never accept it.
    crypto.max_early_data_size = 0;
    let quic = quinn::crypto::rustls::QuicServerConfig::try_from(crypto)?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(quic));
    config.transport_config(Arc::new(transport_config(limits)));
    Ok(config)
}

/// TLS over TCP for the Redis protocol front: the node's own certificate and key, TLS 1.3
/// only; with `client_auth`, a client certificate signed by the client CA is required (none,
/// or another CA's, fails the handshake and nothing is served).
pub(crate) fn tcp_server_config(
    tls: &TlsConfig,
    client_auth: bool,
    flag: &str,
) -> anyhow::Result<rustls::ServerConfig> {
    server_config_for(tls, client_auth, flag, &[&rustls::version::TLS13])
}

/// The same for the HTTP/2 fronts Envoy calls (RLS and RLQS), with ALPN `h2`, and TLS 1.2 as
/// well as 1.3: Envoy offers an upstream at most TLS 1.2 unless its cluster says otherwise, so
/// a stock configuration could not connect to a TLS 1.3 listener. rustls's TLS 1.2 has only
/// forward-secret AEAD suites.
pub(crate) fn http2_server_config(
    tls: &TlsConfig,
    client_auth: bool,
    flag: &str,
) -> anyhow::Result<rustls::ServerConfig> {
    let versions = [&rustls::version::TLS13, &rustls::version::TLS12];
    let mut config = server_config_for(tls, client_auth, flag, &versions)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

fn server_config_for(
    tls: &TlsConfig,
    client_auth: bool,
    flag: &str,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> anyhow::Result<rustls::ServerConfig> {
    let chain = load_certs(&tls.cert)?;
    let key = load_key(&tls.key)?;
    let builder =
        rustls::ServerConfig::builder_with_provider(provider()).with_protocol_versions(versions)?;
    let builder = if client_auth {
        let Some(client_ca) = &tls.client_ca else {
            anyhow::bail!("{flag} needs --client-ca PEM");
        };
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots(client_ca)?), provider())
                .build()?;
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .context("the node certificate and key do not match")?;
    // Replayable early data would replay checks, which consume tokens.
    config.max_early_data_size = 0;
    Ok(config)
}

/// The server certificate resolver, which also looks at what a caller offered before the
/// handshake picks a version: one that offers none of this node's versions is refused by the
/// handshake (TLS `no_application_protocol`), and here is where the node says so, with both
/// ranges, at ERROR (once a minute per offered range) and in
/// `floodgate_protocol_mismatches_total{direction="inbound"}`.
#[derive(Debug)]
struct VersionCheck {
    certified: Arc<rustls::sign::CertifiedKey>,
    /// When each offered range was last logged (a fleet of gateways of one build all offer
    /// the same; bounded by the number of distinct ranges, at most 256 × 256).
    logged: parking_lot::Mutex<std::collections::HashMap<Option<VersionRange>, std::time::Instant>>,
    mismatches: metrics::Counter,
}

/// How often one offered range is logged again.
const MISMATCH_LOG_INTERVAL: Duration = Duration::from_secs(60);

impl rustls::server::ResolvesServerCert for VersionCheck {
    fn resolve(
        &self,
        hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        let offered = hello.alpn().map(VersionRange::of_alpn_ids);
        let shared = match offered {
            Some(Some(range)) => range.highest_shared(SUPPORTED).is_some(),
            // No floodgate id at all, or no ALPN: the handshake refuses it too.
            _ => false,
        };
        if !shared {
            self.mismatches.increment(1);
            let offered = offered.flatten();
            let now = std::time::Instant::now();
            let mut logged = self.logged.lock();
            let due = logged
                .get(&offered)
                .is_none_or(|at| now.duration_since(*at) >= MISMATCH_LOG_INTERVAL);
            if due {
                logged.insert(offered, now);
                match offered {
                    Some(range) => tracing::error!(
                        "refused a caller that speaks protocol versions {range}: this node speaks {SUPPORTED} \
                         (release N works with N-1: upgrade the older side first)"
                    ),
                    None => tracing::error!(
                        "refused a caller that offered no floodgate protocol version (ALPN): this node speaks {SUPPORTED}"
                    ),
                }
            }
        }
        Some(self.certified.clone())
    }
}

/// The protocol version a connection agreed on in its handshake (the ALPN id both ends chose).
pub fn agreed_version(connection: &quinn::Connection) -> u8 {
    connection
        .handshake_data()
        .and_then(|data| data.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
        .and_then(|data| data.protocol)
        .and_then(|id| protocol::version_of_alpn(&id))
        // A connection is up only with an agreed id; the oldest version is the safe reading.
        .unwrap_or(protocol::OLDEST)
}

/// True when a handshake failed because the other end speaks none of this node's versions
/// (it answered TLS alert 120, `no_application_protocol`).
pub fn no_shared_version(error: &quinn::ConnectionError) -> bool {
    const NO_APPLICATION_PROTOCOL: u8 = 0x78;
    matches!(error, quinn::ConnectionError::ConnectionClosed(close)
        if close.error_code == quinn::TransportErrorCode::crypto(NO_APPLICATION_PROTOCOL))
}

fn roots(ca: &std::path::Path) -> anyhow::Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(ca)? {
        roots
            .add(cert)
            .with_context(|| format!("adding {} as a CA", ca.display()))?;
    }
    Ok(roots)
}

/// Decides whether a connection's certificate makes it a peer: it must chain to the peer CA
/// for client authentication, and be a node certificate: valid for server authentication
/// under the peer CA as well. Client certificates carry only the client-auth usage, so even
/// when one CA signs both (`--client-ca` equal to `--peer-ca`) a client is never a peer.
#[derive(Debug, Clone)]
pub struct PeerTrust {
    verifiers: Option<(Arc<dyn ClientCertVerifier>, Arc<WebPkiServerVerifier>)>,
}

impl PeerTrust {
    /// Trust for `tls.peer_ca`; without one nobody is a peer.
    pub fn new(tls: &TlsConfig) -> anyhow::Result<Self> {
        let Some(ca) = &tls.peer_ca else {
            return Ok(PeerTrust { verifiers: None });
        };
        let roots = Arc::new(roots(ca)?);
        let as_client = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
            .build()
            .context("building the peer verifier")?;
        let as_server = WebPkiServerVerifier::builder_with_provider(roots, provider())
            .build()
            .context("building the peer verifier")?;
        Ok(PeerTrust {
            verifiers: Some((as_client, as_server)),
        })
    }

    /// True when `identity` (quinn's `peer_identity`: the presented chain) is a peer's.
    pub fn is_peer(&self, identity: Option<Box<dyn Any>>) -> bool {
        let Some((as_client, as_server)) = &self.verifiers else {
            return false;
        };
        let Some(chain) = presented_chain(identity) else {
            return false;
        };
        let Some((end_entity, intermediates)) = chain.split_first() else {
            return false;
        };
        let now = UnixTime::now();
        if as_client
            .verify_client_cert(end_entity, intermediates, now)
            .is_err()
        {
            return false;
        }
        // Any name: this checks the chain and the server-auth usage; the name a node is known
        // by is checked when it is dialed.
        let any = ServerName::try_from("peer.floodgate.invalid").expect("a valid DNS name");
        accepts_any_name(&as_server.verify_server_cert(end_entity, intermediates, &any, &[], now))
    }
}

/// The chain a connection presented (quinn's `peer_identity` with rustls), if any.
fn presented_chain(identity: Option<Box<dyn Any>>) -> Option<Vec<CertificateDer<'static>>> {
    identity
        .and_then(|i| i.downcast::<Vec<CertificateDer<'static>>>().ok())
        .map(|chain| *chain)
}

impl PeerTrust {
    /// True when `identity` is a node certificate of the peer CA for node `id` (it carries the
    /// name [`server_name_of`] gives).
    pub fn names(&self, identity: Option<Box<dyn Any>>, id: &str) -> bool {
        let Some((_, as_server)) = &self.verifiers else {
            return false;
        };
        let Some(chain) = presented_chain(identity) else {
            return false;
        };
        let Some((end_entity, intermediates)) = chain.split_first() else {
            return false;
        };
        let Some(name) = server_name_of(id)
            .ok()
            .and_then(|n| ServerName::try_from(n).ok())
        else {
            return false;
        };
        as_server
            .verify_server_cert(end_entity, intermediates, &name, &[], UnixTime::now())
            .is_ok()
    }
}

/// The names a peer's certificate carries, for telling which members' digests are its own
/// word: checked by name alone, the chain having been verified when the connection was taken
/// as a peer's ([`PeerTrust::is_peer`]).
pub struct NodeNames(Option<CertificateDer<'static>>);

impl NodeNames {
    /// The end-entity certificate of `identity` (quinn's `peer_identity`), if any.
    pub fn of(identity: Option<Box<dyn Any>>) -> Self {
        NodeNames(presented_chain(identity).and_then(|chain| chain.into_iter().next()))
    }

    /// A checker of node ids: true for each id the certificate is valid for, as it would be
    /// when dialed by that id ([`server_name_of`]).
    pub fn checker(&self) -> impl Fn(&str) -> bool + '_ {
        let parsed = self
            .0
            .as_ref()
            .and_then(|der| rustls::server::ParsedCertificate::try_from(der).ok());
        move |id| {
            let (Some(parsed), Ok(name)) = (&parsed, server_name_of(id)) else {
                return false;
            };
            ServerName::try_from(name)
                .is_ok_and(|name| rustls::client::verify_server_name(parsed, &name).is_ok())
        }
    }
}

/// True when a server verification failed, if at all, only on the name.
fn accepts_any_name(verified: &Result<ServerCertVerified, rustls::Error>) -> bool {
    matches!(
        verified,
        Ok(_)
            | Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. }
            ))
    )
}

/// The name a node's certificate must carry for the node id `id`: the id itself, a DNS name;
/// or, for a node without `--node-id` (its id is its address, `IP:port`), that IP address.
pub fn server_name_of(id: &str) -> anyhow::Result<String> {
    if let Ok(addr) = id.parse::<SocketAddr>() {
        return Ok(addr.ip().to_string());
    }
    validate_node_id(id)?;
    Ok(id.to_owned())
}

/// Checks at start that this node's certificate is one its peers accept for node `id`: signed
/// by the peer CA, valid for server authentication, and naming the id.
pub fn check_own_certificate(tls: &TlsConfig, id: &str) -> anyhow::Result<()> {
    let Some(ca) = &tls.peer_ca else {
        return Ok(());
    };
    let chain = load_certs(&tls.cert)?;
    let Some((end_entity, intermediates)) = chain.split_first() else {
        anyhow::bail!("no certificate in {}", tls.cert.display());
    };
    let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots(ca)?), provider())
        .build()
        .context("building the peer verifier")?;
    let name = ServerName::try_from(server_name_of(id)?)?;
    verifier
        .verify_server_cert(end_entity, intermediates, &name, &[], UnixTime::now())
        .map_err(|e| {
            anyhow::anyhow!(
                "{} is not a node certificate for node id `{id}` under the peer CA {}: {e} \
                 (peers verify a node by its id, which its certificate must carry)",
                tls.cert.display(),
                ca.display()
            )
        })?;
    Ok(())
}

/// How this node connects to its peers: trusting the peer CA, presenting its own certificate.
/// `members` verifies a member by its node id (the server name dialed); `seeds` accepts any
/// node certificate from the peer CA, since a seed address does not say which node is there.
#[derive(Debug)]
pub struct PeerClientConfigs {
    pub members: quinn::ClientConfig,
    pub seeds: quinn::ClientConfig,
}

pub fn peer_client_configs(
    tls: &TlsConfig,
    limits: &NodeLimits,
) -> anyhow::Result<PeerClientConfigs> {
    let roots = match &tls.peer_ca {
        Some(ca) => roots(ca)?,
        None => RootCertStore::empty(),
    };
    let members = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider()).build();
    // Without a peer CA there are no roots: every dial fails, which is what we want.
    let members: Arc<dyn ServerCertVerifier> = match members {
        Ok(verifier) => verifier,
        Err(_) => Arc::new(NoPeers),
    };
    let seeds = Arc::new(AnyNodeName(members.clone()));
    Ok(PeerClientConfigs {
        members: peer_client_config(tls, members, limits)?,
        seeds: peer_client_config(tls, seeds, limits)?,
    })
}

fn peer_client_config(
    tls: &TlsConfig,
    verifier: Arc<dyn ServerCertVerifier>,
    limits: &NodeLimits,
) -> anyhow::Result<quinn::ClientConfig> {
    let mut crypto = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_auth_cert(load_certs(&tls.cert)?, load_key(&tls.key)?)?;
    crypto.alpn_protocols = SUPPORTED.alpn_ids();
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(crypto)?;
    let mut config = quinn::ClientConfig::new(Arc::new(quic));
    let mut transport = quinn::TransportConfig::default();
    transport.keep_alive_interval(Some(Duration::from_secs(1)));
    transport.max_idle_timeout(quinn::IdleTimeout::try_from(Duration::from_secs(5)).ok());
    transport.mtu_discovery_config(Some(path_mtu_discovery()));
    // The peer dialed writes back on this connection too (answers, and streams of its own):
    // bounded as an accepted peer's connection is, by its streams (as many at once, each one
    // frame's window), not by quinn's defaults (100 of each kind at 1.25 MB).
    peer_stream_windows(&mut transport, limits);
    config.transport_config(Arc::new(transport));
    Ok(config)
}

/// Verifies a seed: the full WebPKI check against the peer CA, except the name.
#[derive(Debug)]
struct AnyNodeName(Arc<dyn ServerCertVerifier>);

impl ServerCertVerifier for AnyNodeName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verified =
            self.0
                .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now);
        if accepts_any_name(&verified) {
            Ok(ServerCertVerified::assertion())
        } else {
            verified
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// A node without a peer CA trusts no peer.
#[derive(Debug)]
struct NoPeers;

impl ServerCertVerifier for NoPeers {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Err(rustls::Error::General(
            "this node has no --peer-ca: it trusts no peer".to_owned(),
        ))
    }

    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::General("no peer CA".to_owned()))
    }

    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::General("no peer CA".to_owned()))
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Unidirectional streams another node may have open at once on one connection.
const PEER_UNI_STREAMS: u32 = 64;

fn transport_config(limits: &NodeLimits) -> quinn::TransportConfig {
    let mut transport = quinn::TransportConfig::default();
    transport
        .max_concurrent_bidi_streams(quinn::VarInt::from_u32(limits.max_streams_per_connection));
    // Peers send gossip and bucket batches on short unidirectional streams.
    transport.max_concurrent_uni_streams(quinn::VarInt::from_u32(PEER_UNI_STREAMS));
    transport.keep_alive_interval(Some(Duration::from_secs(1)));
    // 5 s fits in a VarInt of milliseconds.
    transport.max_idle_timeout(quinn::IdleTimeout::try_from(Duration::from_secs(5)).ok());
    transport.mtu_discovery_config(Some(path_mtu_discovery()));
    transport.ack_frequency_config(Some(ack_frequency()));
    let windows = limits.quic_windows();
    transport.stream_receive_window(varint(windows.stream_receive));
    transport.receive_window(varint(windows.connection_receive));
    transport.send_window(windows.send);
    transport
}

/// A window in bytes as a VarInt: each fits (a frame is at most 64 MiB, the budget's share no
/// more than the budget).
fn varint(bytes: u64) -> quinn::VarInt {
    quinn::VarInt::from_u64(bytes).unwrap_or(quinn::VarInt::MAX)
}

/// What a connection this node dialed to a peer receives: the streams the peer may open as on
/// an accepted connection, each with one frame's window, and no connection-wide window beyond
/// them (as the node gives an accepted peer's connection once it knows it is one).
fn peer_stream_windows(transport: &mut quinn::TransportConfig, limits: &NodeLimits) {
    transport
        .max_concurrent_bidi_streams(quinn::VarInt::from_u32(limits.max_streams_per_connection));
    transport.max_concurrent_uni_streams(quinn::VarInt::from_u32(PEER_UNI_STREAMS));
    transport.stream_receive_window(varint(limits.quic_windows().stream_receive));
    transport.receive_window(quinn::VarInt::MAX);
}

/// Asks whoever connects to acknowledge the node's packets less often (see
/// [`ACK_ELICITING_THRESHOLD`]).
fn ack_frequency() -> quinn::AckFrequencyConfig {
    let mut acks = quinn::AckFrequencyConfig::default();
    acks.ack_eliciting_threshold(ACK_ELICITING_THRESHOLD.into())
        .max_ack_delay(Some(MAX_ACK_DELAY));
    acks
}

/// Probes the path for datagrams up to [`MAX_DATAGRAM_BYTES`], on client and peer connections.
fn path_mtu_discovery() -> quinn::MtuDiscoveryConfig {
    let mut discovery = quinn::MtuDiscoveryConfig::default();
    discovery.upper_bound(MAX_DATAGRAM_BYTES);
    discovery
}

/// The node's endpoint settings: it accepts datagrams up to [`MAX_DATAGRAM_BYTES`], and with
/// `stable_as` (the node's id) signs its stateless resets and makes its connection ids with
/// keys every life of the node shares ([`LifeKeys`]), so a life started after a crash ends the
/// connections its predecessor left open at their next packet. `None` (an ephemeral port,
/// where no later life is reached at the same address) keeps quinn's random keys.
pub(crate) fn endpoint_config(
    tls: &TlsConfig,
    stable_as: Option<&str>,
) -> anyhow::Result<quinn::EndpointConfig> {
    let mut config = match stable_as {
        Some(id) => {
            let LifeKeys {
                reset,
                connection_ids,
            } = LifeKeys::derive(&load_key(&tls.key)?, id)?;
            let mut config = quinn::EndpointConfig::new(Arc::new(reset));
            config.cid_generator(move || Box::new(connection_ids.clone()));
            config
        }
        None => quinn::EndpointConfig::default(),
    };
    // Unreachable error: the bound is above QUIC's minimum of 1,200 bytes.
    let _ = config.max_udp_payload_size(MAX_DATAGRAM_BYTES);
    // quinn's default, one reset per 20 ms for the whole endpoint, would reach fifty of a
    // restarted node's former clients and peers a second. A reset is always smaller than the
    // packet that drew it, so a thousand a second amplify nothing; what they can reflect to a
    // spoofed source is bounded by that rate.
    config.min_reset_interval(Duration::from_millis(1));
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_name_their_ip_and_ids_themselves() {
        assert_eq!(server_name_of("127.0.0.1:7100").unwrap(), "127.0.0.1");
        assert_eq!(server_name_of("[::1]:7100").unwrap(), "::1");
        assert_eq!(server_name_of("fg-a.internal").unwrap(), "fg-a.internal");
        assert!(server_name_of("bad name").is_err());
    }
}
