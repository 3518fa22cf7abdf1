//! Rules from the nodes: [`PolicyFetcher`] asks them over a connection of its own;
//! [`fetch_policy`] asks one node once.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use floodgate::wire::{FrameKind, PolicyMessage, PolicyRequest, decode_policy_message};

use super::LimiterError;
use crate::address::HostPort;
use crate::config::ClientConfig;
use crate::error::ClientError;
use crate::request::request;
use crate::{dial, tls};

/// Fetches rules over its own small QUIC connection, so rule traffic never queues behind checks
/// (and the check path's streams stay as they are). Tries the nodes in turn; a node given by
/// name is resolved again for each new connection.
#[derive(Debug)]
pub(super) struct PolicyFetcher {
    nodes: Vec<HostPort>,
    endpoint: quinn::Endpoint,
    /// An address of the family the endpoint's socket is bound for.
    family: SocketAddr,
    /// The address the current connection was made to.
    connected_to: Option<SocketAddr>,
    server_name: Option<String>,
    timeout: Duration,
    conn: Option<quinn::Connection>,
    next: usize,
}

impl PolicyFetcher {
    pub(super) fn new(nodes: Vec<HostPort>, config: &ClientConfig) -> Result<Self, ClientError> {
        let quic = tls::quinn_config(config)?;
        // A name is dialed IPv4 first: an IPv4 socket unless the first node is an IPv6 address.
        let family = nodes
            .first()
            .and_then(HostPort::socket_addr)
            .unwrap_or((Ipv4Addr::LOCALHOST, 0).into());
        let endpoint = dial::endpoint_for(family, quic)?;
        Ok(PolicyFetcher {
            nodes,
            endpoint,
            family,
            connected_to: None,
            server_name: config.server_name.clone(),
            timeout: config.connect_timeout.max(Duration::from_millis(500)),
            conn: None,
            next: 0,
        })
    }

    /// The node's answer to "I have `version`", and which node answered.
    pub(super) async fn fetch(
        &mut self,
        version: &str,
    ) -> Result<(PolicyMessage, SocketAddr), String> {
        let node = self.nodes.get(self.next).cloned();
        let attempt = tokio::time::timeout(self.timeout, self.try_fetch(version)).await;
        let result = attempt.unwrap_or_else(|_| match node {
            Some(node) => Err(format!("{node}: no answer within {:?}", self.timeout)),
            None => Err("no nodes".to_owned()),
        });
        let result = result.and_then(|message| Ok((message, self.connected_to.ok_or("no nodes")?)));
        if result.is_err() {
            // Next time, a fresh connection to the next node.
            if let Some(conn) = self.conn.take() {
                conn.close(0u32.into(), b"policy fetch failed");
            }
            self.next = (self.next + 1) % self.nodes.len().max(1);
        }
        result
    }

    async fn try_fetch(&mut self, version: &str) -> Result<PolicyMessage, String> {
        if self
            .conn
            .as_ref()
            .is_none_or(|c| c.close_reason().is_some())
        {
            let node = self.nodes.get(self.next).ok_or("no nodes")?;
            let addr = crate::address::resolve_like(node, self.family, self.timeout).await?;
            let server_name = self
                .server_name
                .clone()
                .unwrap_or_else(|| node.host().to_owned());
            let connecting = self
                .endpoint
                .connect(addr, &server_name)
                .map_err(|e| format!("{node}: {e}"))?;
            self.conn = Some(connecting.await.map_err(|e| format!("{node}: {e}"))?);
            self.connected_to = Some(addr);
        }
        let conn = self.conn.as_ref().ok_or("no connection")?;
        let asked = PolicyRequest {
            version: version.to_owned(),
        };
        let payload = rkyv::to_bytes::<rkyv::rancor::Error>(&asked)
            .map_err(|e| format!("cannot encode a policy request: {e}"))?;
        let max = floodgate::wire::MAX_POLICY_TEXT_BYTES + 4_096;
        let answer = request(
            conn,
            FrameKind::PolicyRequest,
            &payload,
            FrameKind::Policy,
            max,
        )
        .await?;
        decode_policy_message(&answer).map_err(|(_, why)| why)
    }

    pub(super) async fn close(&mut self) {
        if let Some(conn) = self.conn.take() {
            conn.close(0u32.into(), b"client closed");
        }
        self.endpoint.close(0u32.into(), b"client closed");
        let _ = tokio::time::timeout(Duration::from_millis(200), self.endpoint.wait_idle()).await;
    }
}

/// Asks one node for the rules it serves (`version` empty when it runs without `--rules`): for
/// `floodgate status` and health checks.
pub async fn fetch_policy(
    node: impl Into<HostPort>,
    config: &ClientConfig,
) -> Result<PolicyMessage, LimiterError> {
    let mut fetcher = PolicyFetcher::new(vec![node.into()], config)?;
    let fetched = fetcher.fetch("").await;
    fetcher.close().await;
    fetched
        .map(|(message, _)| message)
        .map_err(LimiterError::NoPolicy)
}
