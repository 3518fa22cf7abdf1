//! The node's QUIC server configuration: TLS 1.3 only, ALPN `floodgate/1`, optional mutual TLS,
//! keep-alive and idle timeout tuned to notice a dead peer within seconds.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;

use crate::certs::{load_certs, load_key};
use crate::config::{NodeLimits, TlsConfig};

/// The crypto provider, named explicitly so the build never depends on a process-wide default.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

pub fn server_config(tls: &TlsConfig, limits: &NodeLimits) -> anyhow::Result<quinn::ServerConfig> {
    let chain = load_certs(&tls.cert)?;
    let key = load_key(&tls.key)?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?;
    let builder = match (&tls.client_ca, &tls.peer_ca) {
        (Some(ca), _) => {
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider())
                    .build()?;
            builder.with_client_cert_verifier(verifier)
        }
        // Clients may come without a certificate; peers present one signed by the cluster CA.
        (None, Some(peer_ca)) => {
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots(peer_ca)?), provider())
                    .allow_unauthenticated()
                    .build()?;
            builder.with_client_cert_verifier(verifier)
        }
        (None, None) => builder.with_no_client_auth(),
    };
    let mut crypto = builder
        .with_single_cert(chain, key)
        .context("the node certificate and key do not match")?;
    crypto.alpn_protocols = vec![floodgate::wire::ALPN.to_vec()];
    // 0-RTT data can be replayed, and a replayed check consumes tokens: never accept it.
    crypto.max_early_data_size = 0;
    let quic = quinn::crypto::rustls::QuicServerConfig::try_from(crypto)?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(quic));
    config.transport_config(Arc::new(transport_config(limits)));
    Ok(config)
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

/// How this node connects to its peers: trusting the cluster CA and presenting its own
/// certificate. `None` without a peer CA (the node then cannot reach peers).
pub fn peer_client_config(tls: &TlsConfig) -> anyhow::Result<quinn::ClientConfig> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?;
    let ca = tls.peer_ca.as_ref().or(tls.client_ca.as_ref());
    let roots = match ca {
        Some(ca) => roots(ca)?,
        None => RootCertStore::empty(),
    };
    let mut crypto = builder
        .with_root_certificates(roots)
        .with_client_auth_cert(load_certs(&tls.cert)?, load_key(&tls.key)?)?;
    crypto.alpn_protocols = vec![floodgate::wire::ALPN.to_vec()];
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(crypto)?;
    let mut config = quinn::ClientConfig::new(Arc::new(quic));
    let mut transport = quinn::TransportConfig::default();
    transport.keep_alive_interval(Some(Duration::from_secs(1)));
    transport.max_idle_timeout(quinn::IdleTimeout::try_from(Duration::from_secs(5)).ok());
    config.transport_config(Arc::new(transport));
    Ok(config)
}

fn transport_config(limits: &NodeLimits) -> quinn::TransportConfig {
    let mut transport = quinn::TransportConfig::default();
    transport
        .max_concurrent_bidi_streams(quinn::VarInt::from_u32(limits.max_streams_per_connection));
    // Peers send gossip and bucket batches on short unidirectional streams.
    transport.max_concurrent_uni_streams(quinn::VarInt::from_u32(64));
    transport.keep_alive_interval(Some(Duration::from_secs(1)));
    // 5 s fits in a VarInt of milliseconds.
    transport.max_idle_timeout(quinn::IdleTimeout::try_from(Duration::from_secs(5)).ok());
    transport
}
