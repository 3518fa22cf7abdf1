//! Connections to nodes: an endpoint per node, the handshake bounded, a seed's first address,
//! and connection errors in words a person can act on.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use floodgate::wire::{ErrorCode, MAX_DATAGRAM_BYTES};

use crate::address::HostPort;
use crate::error::ConfigError;

/// The address a seed is first known by: itself, or what its name resolves to now (IPv4
/// first). A name that does not resolve yet gives the unspecified IPv4 address: the link keeps
/// trying, resolving again each time, and says why it cannot connect meanwhile.
pub(crate) async fn first_address(seed: &HostPort, timeout: Duration) -> SocketAddr {
    if let Some(addr) = seed.socket_addr() {
        return addr;
    }
    match crate::address::resolve(seed, timeout).await {
        Ok(addrs) => addrs[0],
        Err(why) => {
            tracing::warn!(node = %seed, "{why}; retrying in the background");
            (Ipv4Addr::UNSPECIFIED, seed.port()).into()
        }
    }
}

/// A client endpoint (one UDP socket and its driver task) for one node, so nodes do not share a
/// socket's single driver (quinn drives one endpoint from one task: about one core of work).
pub(crate) fn endpoint_for(
    node: SocketAddr,
    config: quinn::ClientConfig,
) -> Result<quinn::Endpoint, ConfigError> {
    let bind: SocketAddr = if node.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    };
    // As `Endpoint::client` (a dual-stack socket for IPv6), but accepting the larger datagrams
    // the node is asked to send.
    let socket = bound_socket(bind).map_err(|e| ConfigError::Socket(e.to_string()))?;
    let mut endpoint_config = quinn::EndpointConfig::default();
    endpoint_config
        .max_udp_payload_size(MAX_DATAGRAM_BYTES)
        .map_err(|e| ConfigError::Socket(e.to_string()))?;
    let mut endpoint = quinn::Endpoint::new(
        endpoint_config,
        None,
        socket,
        std::sync::Arc::new(floodgate_udp_runtime::ReadInterestRuntime),
    )
    .map_err(|e| ConfigError::Socket(e.to_string()))?;
    endpoint.set_default_client_config(config);
    Ok(endpoint)
}

/// A UDP socket bound to `addr`; an IPv6 one also reaches IPv4 nodes where the system allows,
/// as a seed's name may resolve to either.
fn bound_socket(addr: SocketAddr) -> std::io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        // Best effort: a v6-only system still reaches IPv6 nodes.
        let _ = socket.set_only_v6(false);
    }
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// Connects to a node, the handshake bounded by `timeout`; the error says why in words.
pub(crate) async fn connect(
    endpoint: &quinn::Endpoint,
    addr: SocketAddr,
    server_name: &str,
    timeout: Duration,
) -> Result<quinn::Connection, String> {
    let connecting = endpoint
        .connect(addr, server_name)
        .map_err(|e| format!("cannot start a connection: {e}"))?;
    // Awaited in full, never `into_0rtt`: checks must not travel as replayable early data.
    match tokio::time::timeout(timeout, connecting).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(describe_connection_error(&e)),
        Err(_) => Err(format!(
            "no handshake within {timeout:?} (is a node listening at {addr}?)"
        )),
    }
}

pub(crate) fn describe_connection_error(e: &quinn::ConnectionError) -> String {
    match e {
        quinn::ConnectionError::ApplicationClosed(close) => {
            let code = node_code(close.error_code);
            let reason = String::from_utf8_lossy(&close.reason);
            match code {
                Some(code) => format!("closed by the node: {code}: {reason}"),
                None => format!("closed by the node: {close}"),
            }
        }
        quinn::ConnectionError::ConnectionClosed(close) => {
            // TLS alerts arrive as CRYPTO_ERROR (0x100 + alert, RFC 9001 §4.8); name the two a
            // misconfigured gateway meets.
            let hint = match u64::from(close.error_code) {
                0x174 => " (the node requires a client certificate: set client_auth)",
                0x130 => " (the node does not trust our client certificate's CA)",
                0x178 => {
                    return format!(
                        "connection refused by the node: it speaks none of this client's \
                         protocol versions {} (upgrade the older side: release N works with N-1)",
                        floodgate::protocol::SUPPORTED
                    );
                }
                _ => "",
            };
            format!("connection refused by the node: {close}{hint}")
        }
        other => format!("connection failed: {other}"),
    }
}

/// The node's error code a QUIC application code carries, if it is one.
pub(crate) fn node_code(code: quinn::VarInt) -> Option<ErrorCode> {
    u16::try_from(code.into_inner())
        .ok()
        .and_then(ErrorCode::from_u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_sharing_no_protocol_version_is_named_with_this_clients_versions() {
        let refused = quinn::ConnectionError::ConnectionClosed(quinn::ConnectionClose {
            error_code: quinn::TransportErrorCode::crypto(0x78),
            frame_type: None,
            reason: Default::default(),
        });
        let said = describe_connection_error(&refused);
        let versions = floodgate::protocol::SUPPORTED;
        assert!(
            said.contains(&format!(
                "speaks none of this client's protocol versions {versions}"
            )),
            "{said}"
        );
    }
}
