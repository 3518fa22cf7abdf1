//! A hostile client: raw garbage datagrams at every node, and QUIC connections that send
//! garbage, oversized, truncated and peer-only frames. It must never disturb anyone else.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use floodgate::wire::{FrameKind, encode_frame};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tokio::sync::watch;

/// What the hostile client managed to send.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct HostileStats {
    pub datagrams: u64,
    pub connections: u64,
    pub frames: u64,
}

fn client_config(ca: &Path) -> anyhow::Result<quinn::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).context("reading the CA")? {
        roots.add(cert?)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = floodgate::protocol::SUPPORTED.alpn_ids();
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls)?;
    Ok(quinn::ClientConfig::new(Arc::new(quic)))
}

/// One hostile frame (or fragment) of a random sort.
fn hostile_bytes(rng: &mut SmallRng) -> Vec<u8> {
    let mut out = Vec::new();
    match rng.random_range(0..6) {
        // Random bytes: bad magic.
        0 => out.extend((0..rng.random_range(1..512)).map(|_| rng.random::<u8>())),
        // A check batch whose payload is garbage (fails validation).
        1 => {
            let payload: Vec<u8> = (0..rng.random_range(0..256))
                .map(|_| rng.random())
                .collect();
            encode_frame(&mut out, FrameKind::CheckBatch, rng.random(), &payload);
        }
        // A header announcing 64 MiB (over --max-frame-bytes), then a little of it.
        2 => {
            encode_frame(&mut out, FrameKind::CheckBatch, 1, &[]);
            out[4..8].copy_from_slice(&(64u32 << 20).to_le_bytes());
            out.extend_from_slice(&[0xAB; 1024]);
        }
        // A peer-only kind from a client (forbidden).
        3 => encode_frame(&mut out, FrameKind::Gossip, 7, &[1, 2, 3, 4]),
        // A truncated header.
        4 => out.extend_from_slice(b"FG\x01"),
        // A wrong protocol version.
        _ => {
            encode_frame(&mut out, FrameKind::CheckBatch, 9, &[0; 32]);
            out[2] = 99;
        }
    }
    out
}

/// Runs until stop or deadline: garbage datagrams at `rate` per second spread over the nodes,
/// and a hostile QUIC connection per node at a time, each stream one hostile frame.
pub async fn run(
    nodes: Vec<SocketAddr>,
    ca: &Path,
    seed: u64,
    mut stop: watch::Receiver<bool>,
    deadline: Instant,
) -> anyhow::Result<HostileStats> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut stats = HostileStats::default();
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await?;
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse()?)?;
    endpoint.set_default_client_config(client_config(ca)?);
    let mut connections: Vec<Option<quinn::Connection>> = vec![None; nodes.len()];
    let mut ticker = tokio::time::interval(Duration::from_millis(10));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = stop.wait_for(|&s| s) => break,
            _ = tokio::time::sleep_until(deadline.into()) => break,
            _ = ticker.tick() => {}
        }
        let node = rng.random_range(0..nodes.len());
        let garbage: Vec<u8> = (0..rng.random_range(1..1400))
            .map(|_| rng.random())
            .collect();
        if socket.send_to(&garbage, nodes[node]).await.is_ok() {
            stats.datagrams += 1;
        }
        let live = connections[node]
            .as_ref()
            .filter(|c| c.close_reason().is_none())
            .cloned();
        let connection = match live {
            Some(c) => c,
            None => {
                let Ok(connecting) = endpoint.connect(nodes[node], "127.0.0.1") else {
                    continue;
                };
                match tokio::time::timeout(Duration::from_millis(500), connecting).await {
                    Ok(Ok(c)) => {
                        stats.connections += 1;
                        connections[node] = Some(c.clone());
                        c
                    }
                    _ => continue,
                }
            }
        };
        let bytes = hostile_bytes(&mut rng);
        let sent = tokio::time::timeout(Duration::from_millis(200), async {
            let (mut send, _recv) = connection.open_bi().await?;
            send.write_all(&bytes).await?;
            let _ = send.finish();
            anyhow::Ok(())
        })
        .await;
        if matches!(sent, Ok(Ok(()))) {
            stats.frames += 1;
        }
    }
    endpoint.close(0u32.into(), b"done");
    Ok(stats)
}
