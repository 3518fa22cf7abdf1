//! `floodgate acquire`: take concurrency leases on a key from a shell, hold them, release them
//! (or abandon them, to watch the node reclaim them after their TTL).

use std::io::Write;
use std::time::Duration;

use clap::Args;
use floodgate_client::{Acquire, Client};

use crate::{ConnectionArgs, format_duration, parse_duration_arg};

pub(crate) const ACQUIRE_HELP: &str = "\
Output: one line per attempt:
  granted lease=5f3a9c2e00000001 in_use=1
  refused in_use=3 retry_after=29.2s

retry_after is the time until the earliest held lease expires (a release may free one sooner).

Exit status:
  0  the last attempt was granted
  1  the last attempt was refused: max leases are held
  2  error: bad arguments, or no answer from the node";

#[derive(Debug, Args)]
pub(crate) struct AcquireArgs {
    #[command(flatten)]
    pub(crate) connection: ConnectionArgs,
    /// The key; its bytes are the lease set's identity on the node.
    pub(crate) key: String,
    /// Most leases held at once on this key (1..=100000).
    #[arg(long)]
    pub(crate) max: u64,
    /// How long each lease is held unless released, e.g. 30s (1ms..=1d).
    #[arg(long, value_parser = parse_duration_arg)]
    pub(crate) ttl: Duration,
    /// Number of leases to try to acquire, one after another.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub(crate) count: u64,
    /// How long to hold the granted leases before releasing them, e.g. 3s (default: none).
    #[arg(long, value_parser = parse_duration_arg)]
    pub(crate) hold: Option<Duration>,
    /// Exit without releasing the granted leases: the node reclaims them after --ttl.
    #[arg(long)]
    pub(crate) abandon: bool,
}

/// Acquires, holds and releases; `Ok(granted)` is the last attempt, `Err` a message for stderr.
pub(crate) async fn run_acquire(args: &AcquireArgs, out: &mut impl Write) -> Result<bool, String> {
    let client = Client::connect(args.connection.seeds(), args.connection.client_config())
        .await
        .map_err(|e| e.to_string())?;
    let result = acquire_all(&client, args, out).await;
    client.close().await;
    result
}

async fn acquire_all(
    client: &Client,
    args: &AcquireArgs,
    out: &mut impl Write,
) -> Result<bool, String> {
    let mut held = Vec::new();
    let mut granted = false;
    for _ in 0..args.count {
        let answer = client
            .acquire(args.key.as_bytes(), args.max, args.ttl)
            .await
            .map_err(|e| e.to_string())?;
        let line = match &answer {
            Acquire::Granted(lease) => {
                format!(
                    "granted lease={:016x} in_use={}",
                    lease.id(),
                    lease.in_use()
                )
            }
            Acquire::Refused {
                in_use,
                retry_after,
            } => format!(
                "refused in_use={in_use} retry_after={}",
                format_duration(u64::try_from(retry_after.as_nanos()).unwrap_or(u64::MAX))
            ),
        };
        writeln!(out, "{line}").map_err(|e| e.to_string())?;
        granted = matches!(answer, Acquire::Granted(_));
        if let Acquire::Granted(lease) = answer {
            held.push(lease);
        }
    }
    if let Some(hold) = args.hold {
        tokio::time::sleep(hold).await;
    }
    if !args.abandon {
        for lease in &held {
            client.release(lease).await.map_err(|e| e.to_string())?;
        }
    }
    Ok(granted)
}
