//! The Redis protocol front: `--resp-listen` serves RESP2 (RESP3 after `HELLO 3`) over TCP, or
//! TLS with the node's certificate (`--resp-tls`, optionally requiring client certificates),
//! with pipelining, `CL.THROTTLE` decided through the cluster like any check.
//!
//! Any Redis client calls floodgate with redis-cell's command, unchanged: each key is decided by
//! its owner (forwarded, batched, when another node owns it), with redis-cell 0.2.2's reply.
//!
//! - `throttle`: `CL.THROTTLE`'s arguments onto a floodgate limit, the decision into its reply.
//! - `decide`: a run of pipelined throttles as check batches through `front_batch`.
//! - `commands`: the session (protocol, `AUTH`, name) and every command's reply.
//! - `connection`: one connection's loop: read, parse (the core's `floodgate::resp`), serve,
//!   write, within the node's buffer budget.
//!
//! The parser's caps, the connection allowance and the buffer budget bound what a client can
//! make the node hold; bad input is an error reply (a protocol error also closes the
//! connection, as Redis does), never a panic.

mod commands;
mod connection;
mod decide;
mod throttle;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

pub use crate::config::{RespFailureMode, RespSettings};
use crate::front_batch::FrontContext;

/// Where the environment may give the password (`AUTH`) instead of `--resp-password-file`.
pub const PASSWORD_ENV: &str = "FLOODGATE_RESP_PASSWORD";

/// What every connection of the front shares.
#[derive(Debug)]
pub(crate) struct Front {
    pub(crate) shared: Arc<FrontContext>,
    pub(crate) settings: RespSettings,
    /// `floodgate_resp_throttles_total` by result (`commands::RESULTS`), resolved once: a
    /// labelled counter looked up per call cost a registry lookup each.
    pub(crate) throttles: [metrics::Counter; 5],
}

/// Binds the listener and spawns the accept loop; returns the bound address.
pub(crate) async fn start(
    shared: Arc<FrontContext>,
    settings: RespSettings,
    shutdown: watch::Receiver<bool>,
    tasks: &mut JoinSet<()>,
) -> anyhow::Result<SocketAddr> {
    anyhow::ensure!(
        settings.tls || !settings.client_auth,
        "--resp-client-auth needs --resp-tls"
    );
    let tls = if settings.tls {
        let config = crate::tls::tcp_server_config(
            &shared.config.tls,
            settings.client_auth,
            "--resp-client-auth",
        )
        .context("the RESP front's TLS")?;
        Some(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
    } else {
        None
    };
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("binding the RESP listener on {}", settings.listen))?;
    let addr = listener.local_addr()?;
    tracing::info!(
        %addr,
        auth = settings.password.is_some(),
        tls = settings.tls,
        client_auth = settings.client_auth,
        failure_mode = ?settings.failure_mode,
        "RESP (Redis protocol, CL.THROTTLE) listening"
    );
    // The same allowance as the QUIC endpoint's clients, counted apart.
    let allowance = Arc::new(Semaphore::new(shared.config.limits.max_connections));
    let throttles = commands::RESULTS
        .map(|result| metrics::counter!("floodgate_resp_throttles_total", "result" => result));
    let front = Arc::new(Front {
        shared,
        settings,
        throttles,
    });
    tasks.spawn(accept_loop(listener, tls, front, allowance, shutdown));
    Ok(addr)
}

/// How long a TLS handshake may take: a caller that stalls it holds a place of the allowance.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

async fn accept_loop(
    listener: tokio::net::TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    front: Arc<Front>,
    allowance: Arc<Semaphore>,
    mut shutdown: watch::Receiver<bool>,
) {
    let ids = AtomicU64::new(1);
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.wait_for(|stopping| *stopping) => break,
        };
        // Reap finished connections so the set holds only open ones.
        while connections.try_join_next().is_some() {}
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::debug!(error = %e, "RESP accept failed");
                continue;
            }
        };
        let id = ids.fetch_add(1, Ordering::Relaxed);
        match allowance.clone().try_acquire_owned() {
            Ok(permit) => {
                let front = front.clone();
                let shutdown = shutdown.clone();
                let tls = tls.clone();
                connections.spawn(async move {
                    let _ = stream.set_nodelay(true);
                    match tls {
                        None => connection::serve(&front, stream, id, shutdown).await,
                        Some(tls) => {
                            match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(stream)).await
                            {
                                Ok(Ok(stream)) => {
                                    connection::serve(&front, stream, id, shutdown).await;
                                }
                                Ok(Err(e)) => {
                                    metrics::counter!("floodgate_resp_tls_handshakes_failed_total")
                                        .increment(1);
                                    tracing::debug!(%peer, error = %e, "RESP TLS handshake failed");
                                }
                                Err(_) => {
                                    metrics::counter!("floodgate_resp_tls_handshakes_failed_total")
                                        .increment(1);
                                    tracing::debug!(%peer, "RESP TLS handshake timed out");
                                }
                            }
                        }
                    }
                    drop(permit);
                });
            }
            // As Redis does past `maxclients`: say so and close (in plain text only: a TLS
            // caller would read it as garbage, so it is just closed).
            Err(_) => {
                tracing::debug!(%peer, "RESP connection refused: the allowance is full");
                if tls.is_none() {
                    connection::refuse(stream);
                }
            }
        }
    }
    connections.shutdown().await;
}
