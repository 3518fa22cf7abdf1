//! Closed-loop throughput smoke test: many tasks calling `check` against an in-process node.
//!
//! Each task sends single-check calls back to back for a few seconds; batching turns them into
//! shared frames. Not the benchmark of record (that is open-loop, in `bench/`).
//!
//! `cargo run --release -p floodgate-client --example throughput -- [SECONDS] [TASKS] [KEYS]
//! [CHECKS_PER_CALL]`

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use floodgate::{Limit, NANOS_PER_SEC};
use floodgate_client::{Check, Client, ClientConfig, Source};
use floodgate_node::{DevCerts, Node, NodeConfig, ensure_dev_certs};
use std::thread::JoinHandle;
use tokio::sync::oneshot;

type BoxError = Box<dyn std::error::Error>;

/// What each run drives: for `seconds`, `tasks` callers, each call `per_call` consecutive of
/// `keys` keys.
#[derive(Debug, Clone, Copy)]
struct Load {
    seconds: u64,
    tasks: u64,
    keys: u64,
    per_call: usize,
}

fn main() -> Result<(), BoxError> {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<u64>());
    let seconds = args.next().transpose()?.unwrap_or(3);
    let tasks = args.next().transpose()?.unwrap_or(512);
    let keys = args.next().transpose()?.unwrap_or(100_000);
    let per_call = args.next().transpose()?.unwrap_or(1).clamp(1, keys) as usize;
    let load = Load {
        seconds,
        tasks,
        keys,
        per_call,
    };

    let dir = tempfile::tempdir()?;
    let certs = ensure_dev_certs(dir.path())?;
    let (addr, stop_tx, node_thread) = start_node(certs.clone())?;
    client_runtime()?.block_on(drive(addr, &certs.ca, load))?;
    let _ = stop_tx.send(());
    node_thread.join().map_err(|_| "node thread panicked")?;
    Ok(())
}

/// The node on its own thread and runtime, as a separate process would be: its address, what
/// stops it, and its thread.
fn start_node(
    certs: DevCerts,
) -> Result<(SocketAddr, oneshot::Sender<()>, JoinHandle<()>), BoxError> {
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let node_thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("node runtime");
        runtime.block_on(async move {
            let node = Node::start(NodeConfig::for_tests(&certs))
                .await
                .expect("node starts");
            addr_tx.send(node.local_addr()).expect("main thread waits");
            let _ = stop_rx.await;
            node.shutdown().await;
        });
    });
    Ok((addr_rx.recv()?, stop_tx, node_thread))
}

/// `FG_CLIENT_THREADS=N`: a multi-thread client runtime; default one thread, as quinn's notes
/// found best for batched frames.
fn client_runtime() -> Result<tokio::runtime::Runtime, BoxError> {
    Ok(
        match std::env::var("FG_CLIENT_THREADS").ok().map(|n| n.parse()) {
            Some(threads) => tokio::runtime::Builder::new_multi_thread()
                .worker_threads(threads?)
                .enable_all()
                .build()?,
            None => tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?,
        },
    )
}

/// Runs `load` against the node at `addr` and prints the checks a second.
async fn drive(addr: SocketAddr, ca: &Path, load: Load) -> Result<(), BoxError> {
    let Load {
        seconds,
        tasks,
        keys,
        per_call,
    } = load;
    let mut config = ClientConfig::with_ca_file(ca);
    // Closed-loop load on a shared 2-core machine: a tight timeout would only measure the
    // scheduler's hiccups.
    config.timeout = Duration::from_millis(200);
    let client = Client::connect(&[addr], config).await?;
    let limit = Limit::gcra(1_000_000, NANOS_PER_SEC, 1_000_000)?;
    let checks: Arc<Vec<Check>> = Arc::new(
        (0..keys)
            .map(|k| Check::new(format!("user:{k}"), limit))
            .collect(),
    );
    let done = Arc::new(AtomicBool::new(false));
    let counted = Arc::new(AtomicU64::new(0));
    let degraded = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..tasks)
        .map(|t| {
            let (client, done, checks) = (client.clone(), done.clone(), checks.clone());
            let (counted, degraded) = (counted.clone(), degraded.clone());
            tokio::spawn(async move {
                let mut i = t;
                let (mut n, mut d) = (0, 0);
                while !done.load(Ordering::Relaxed) {
                    // One call: a group of `per_call` consecutive keys.
                    let first = (i % (keys - per_call as u64 + 1)) as usize;
                    i = i.wrapping_add(tasks);
                    let verdicts = client.check(&checks[first..first + per_call]).await;
                    n += per_call as u64;
                    if !matches!(verdicts, Ok(v) if v[0].source == Source::Node) {
                        d += 1;
                    }
                }
                counted.fetch_add(n, Ordering::Relaxed);
                degraded.fetch_add(d, Ordering::Relaxed);
            })
        })
        .collect();
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    done.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.await?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let n = counted.load(Ordering::Relaxed);
    println!(
        "{n} checks in {elapsed:.2} s: {:.0} checks/s ({tasks} tasks, {per_call} per call, \
         {} degraded calls)",
        n as f64 / elapsed,
        degraded.load(Ordering::Relaxed)
    );
    client.close().await;
    Ok(())
}
