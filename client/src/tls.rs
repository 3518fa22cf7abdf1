//! Builds the QUIC + TLS 1.3 client configuration (ring provider, ALPN, optional client cert).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use floodgate::wire::{ACK_ELICITING_THRESHOLD, MAX_ACK_DELAY, MAX_DATAGRAM_BYTES};
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::{CaSource, ClientConfig};
use crate::error::ConfigError;

/// The name a seed's certificate must carry: the configured server name, else the IP address
/// it is dialed at.
pub(crate) fn seed_server_name(configured: Option<&str>, addr: SocketAddr) -> String {
    configured.map_or_else(|| addr.ip().to_string(), str::to_owned)
}

/// The name a member from the slot table is verified by: its node id, a DNS name; a node
/// started without `--node-id` has its address as id, and is verified by that IP address.
pub(crate) fn member_server_name(id: &str, addr: SocketAddr) -> String {
    match rustls::pki_types::ServerName::try_from(id) {
        Ok(rustls::pki_types::ServerName::DnsName(_)) => id.to_owned(),
        _ => addr.ip().to_string(),
    }
}

/// Keep-alive interval: a dead node is noticed within the idle timeout even when no checks flow.
const KEEP_ALIVE: Duration = Duration::from_secs(1);

/// The quinn client configuration for `config` (already validated).
pub(crate) fn quinn_config(config: &ClientConfig) -> Result<quinn::ClientConfig, ConfigError> {
    // The provider is passed explicitly: relying on the process default panics when ring and
    // aws-lc-rs both end up in a build with none installed (rustls then cannot pick one).
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| ConfigError::Tls(e.to_string()))?
        .with_root_certificates(load_roots(&config.ca)?);
    let mut tls = match &config.client_auth {
        Some(auth) => {
            let chain = load_certs(&auth.cert, "client certificate")?;
            let key = PrivateKeyDer::from_pem_file(&auth.key).map_err(|e| ConfigError::File {
                what: "client key",
                path: auth.key.clone(),
                problem: e.to_string(),
            })?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| ConfigError::Tls(format!("client certificate and key: {e}")))?
        }
        None => builder.with_no_client_auth(),
    };
    // Every version this build speaks, highest first: the node picks the highest it shares.
    tls.alpn_protocols = floodgate::protocol::SUPPORTED.alpn_ids();
    // Never 0-RTT: early data can be replayed, and a replayed check consumes tokens twice.
    tls.enable_early_data = false;
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls)
        .map_err(|e| ConfigError::Tls(e.to_string()))?;
    let mut client = quinn::ClientConfig::new(Arc::new(quic));
    client.transport_config(Arc::new(transport(config)?));
    Ok(client)
}

fn transport(config: &ClientConfig) -> Result<quinn::TransportConfig, ConfigError> {
    let mut transport = quinn::TransportConfig::default();
    transport.keep_alive_interval(Some(KEEP_ALIVE));
    let idle =
        quinn::IdleTimeout::try_from(config.idle_timeout).map_err(|_| ConfigError::Invalid {
            field: "idle_timeout",
            problem: "too large".to_owned(),
        })?;
    transport.max_idle_timeout(Some(idle));
    let mut path_mtu = quinn::MtuDiscoveryConfig::default();
    path_mtu.upper_bound(MAX_DATAGRAM_BYTES);
    transport.mtu_discovery_config(Some(path_mtu));
    let mut acks = quinn::AckFrequencyConfig::default();
    acks.ack_eliciting_threshold(ACK_ELICITING_THRESHOLD.into())
        .max_ack_delay(Some(MAX_ACK_DELAY));
    transport.ack_frequency_config(Some(acks));
    // Nodes never open streams towards a client.
    transport.max_concurrent_bidi_streams(0u32.into());
    transport.max_concurrent_uni_streams(0u32.into());
    Ok(transport)
}

fn load_roots(ca: &CaSource) -> Result<RootCertStore, ConfigError> {
    let (certs, path) = match ca {
        CaSource::File(path) => (load_certs(path, "CA certificates")?, path.clone()),
        CaSource::Pem(pem) => {
            let certs = CertificateDer::pem_slice_iter(pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| ConfigError::Tls(format!("CA certificates (in memory): {e}")))?;
            (certs, "<in memory>".into())
        }
    };
    if certs.is_empty() {
        return Err(ConfigError::File {
            what: "CA certificates",
            path,
            problem: "no PEM certificate found".to_owned(),
        });
    }
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots.add(cert).map_err(|e| ConfigError::File {
            what: "CA certificates",
            path: path.clone(),
            problem: e.to_string(),
        })?;
    }
    Ok(roots)
}

fn load_certs(
    path: &Path,
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let file_error = |problem: String| ConfigError::File {
        what,
        path: path.to_owned(),
        problem,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(e.to_string()))?;
    if certs.is_empty() {
        return Err(file_error("no PEM certificate found".to_owned()));
    }
    Ok(certs)
}
