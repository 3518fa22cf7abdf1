//! The gateway the load generator plays, and every system's clients inside it.
//!
//! By default it is shaped like Envoy's workers (or Pingora's, or nginx's): one thread per
//! core, each running its own current-thread runtime with its own client, and so its own
//! connections, to every system. A request then starts, waits and ends on one thread, and no
//! state of the generator or of a client moves between cores. The other shape,
//! `multi-thread`, is the common tokio service: one work-stealing runtime over all threads and
//! one client shared by all of them. Both are offered so a run can say what the shape costs;
//! every system in a run is driven through the same one.

use std::future::Future;
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::Context;
use tokio::runtime::{Builder, Handle};

use super::target::Target;

/// How the gateway's threads run its requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GatewayShape {
    /// A current-thread runtime per thread, each with its own clients.
    ThreadPerCore,
    /// One multi-thread (work-stealing) runtime, one client per system shared by its threads.
    MultiThread,
}

/// The gateway's worker threads; stopped (their runtimes and the tasks left on them dropped)
/// when it is dropped.
#[derive(Debug)]
pub struct Gateway {
    workers: Vec<Worker>,
}

#[derive(Debug)]
struct Worker {
    handle: Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Gateway {
    /// Starts `threads` threads (at least 1) in `shape`.
    pub fn start(shape: GatewayShape, threads: usize) -> anyhow::Result<Self> {
        anyhow::ensure!(threads >= 1, "--client-threads must be at least 1");
        let workers = match shape {
            GatewayShape::ThreadPerCore => (0..threads)
                .map(|i| Worker::start(format!("gateway-{i}"), Builder::new_current_thread()))
                .collect::<anyhow::Result<_>>()?,
            GatewayShape::MultiThread => {
                let mut builder = Builder::new_multi_thread();
                builder.worker_threads(threads);
                vec![Worker::start("gateway".to_owned(), builder)?]
            }
        };
        Ok(Gateway { workers })
    }

    /// One target per worker, each made by `connect` on that worker's runtime, so its
    /// connections and background tasks live there.
    pub async fn connect<F, Fut>(&self, connect: F) -> anyhow::Result<Targets>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = anyhow::Result<Target>> + Send + 'static,
    {
        let mut per_worker = Vec::with_capacity(self.workers.len());
        for worker in &self.workers {
            let target = worker
                .handle
                .spawn(connect())
                .await
                .context("a gateway worker stopped while connecting")??;
            per_worker.push((worker.handle.clone(), Arc::new(target)));
        }
        Ok(Targets(per_worker.into()))
    }

    /// The no-op target on every worker: runs against it measure the generator alone.
    pub fn noop(&self) -> Targets {
        Targets(
            self.workers
                .iter()
                .map(|worker| (worker.handle.clone(), Arc::new(Target::Noop)))
                .collect(),
        )
    }
}

impl Worker {
    fn start(name: String, mut builder: Builder) -> anyhow::Result<Self> {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready, handle) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || match builder.enable_all().build() {
                Ok(runtime) => {
                    let _ = ready.send(Ok(runtime.handle().clone()));
                    // Runs the worker's tasks until the gateway stops it.
                    runtime.block_on(async {
                        let _ = stopped.await;
                    });
                }
                Err(e) => {
                    let _ = ready.send(Err(e));
                }
            })
            .context("starting a gateway thread")?;
        let handle = handle
            .recv()
            .context("a gateway thread died starting")?
            .context("building a gateway runtime")?;
        Ok(Worker {
            handle,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One system's target on each gateway worker, with the runtime to run its requests on.
#[derive(Debug, Clone)]
pub struct Targets(Arc<[(Handle, Arc<Target>)]>);

impl Targets {
    pub fn name(&self) -> &'static str {
        self.0.first().map_or("none", |(_, target)| target.name())
    }

    /// The server processes behind the targets.
    pub fn nodes(&self) -> usize {
        self.0.first().map_or(1, |(_, target)| target.nodes())
    }

    /// Worker `i`'s runtime and target (`i` wraps around).
    pub fn on(&self, i: usize) -> (&Handle, &Arc<Target>) {
        let (handle, target) = &self.0[i % self.0.len()];
        (handle, target)
    }

    /// True when this system can run a workload through token leases (floodgate's client).
    pub fn leases(&self) -> bool {
        self.0.iter().all(|(_, target)| target.leases())
    }

    /// Packets sent and lost so far on all workers' QUIC connections (`None`: not QUIC).
    pub fn transport(&self) -> Option<(u64, u64)> {
        self.0
            .iter()
            .map(|(_, target)| target.transport())
            .try_fold((0, 0), |(sent, lost), one| {
                let (s, l) = one?;
                Some((sent + s, lost + l))
            })
    }

    /// What the leasing clients of all workers did together (`None`: no leases here).
    pub fn lease_stats(&self) -> Option<floodgate_client::TokenLeaseStats> {
        self.0
            .iter()
            .map(|(_, target)| target.lease_stats())
            .try_fold(floodgate_client::TokenLeaseStats::default(), |sum, one| {
                let one = one?;
                Some(floodgate_client::TokenLeaseStats {
                    local_allowed: sum.local_allowed + one.local_allowed,
                    local_denied: sum.local_denied + one.local_denied,
                    granted: sum.granted + one.granted,
                    returned: sum.returned + one.returned,
                    held: sum.held + one.held,
                    refilling: sum.refilling + one.refilling,
                    keys: sum.keys + one.keys,
                })
            })
    }
}
