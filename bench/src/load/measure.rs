//! One system measured: its key space loaded (resident bytes per key), then each workload's
//! closed loop and open-loop steps, with server and client CPU; the generator alone first.

use std::sync::Arc;
use std::time::Duration;

use floodgate::{Algorithm, Limit};
use indicatif::ProgressBar;

use super::side_by_side::stall_note;
use super::{Gateway, KeySpread, LoadArgs, Record, Server, Targets, Workload};
use super::{driver, process, report, workload};

/// The peers' system names: their memory is measured on `--peer-keys` keys.
const PEERS: [&str; 2] = ["gubernator", "envoy-ratelimit"];

/// One system through every workload: its key space loaded (resident bytes per key), then
/// each workload's closed loop, then each workload's open-loop rates (a leased workload only on
/// a system that leases, its admitted checks then held to the limit); records and notes added
/// to the run's.
pub(super) async fn run_system(
    args: &LoadArgs,
    server: Option<&Server>,
    target: Targets,
    workloads: &[Workload],
    progress: &ProgressBar,
    records: &mut Vec<Record>,
    notes: &mut Vec<String>,
) -> anyhow::Result<()> {
    let name = target.name();
    let loaded = if PEERS.contains(&name) {
        args.keys.min(args.peer_keys)
    } else {
        args.keys
    };
    progress.set_message(format!("{name}: loading {loaded} keys"));
    let bytes_per_key = load_keys(&target, server, loaded).await?;
    progress.inc(1);
    let system = Measured {
        args,
        server,
        target: &target,
        progress,
        bytes_per_key,
    };
    // Every workload's closed loop before any open loop: an open loop past what the system
    // keeps up with leaves up to `driver::MAX_IN_FLIGHT` requests' tasks and buffers allocated
    // and freed on the gateway's threads, and the closed loops after it ran slower on the
    // gateway's side (uniform/3-check: 2.2-2.4M checks/s at 0.32-0.36 s of client CPU per
    // million, against 3.0-3.2M at 0.24 before any overload, and again 3.1M on fresh gateway
    // threads after one). The generator's leftovers would then be measured, not the system.
    let mut measured = Vec::with_capacity(workloads.len());
    for (w, workload) in workloads.iter().enumerate() {
        if workload.spread.leased() && !target.leases() {
            progress.inc(1 + args.rates.len() as u64);
            continue;
        }
        let keys = Arc::new(workload::KeyGen::new(*workload, args.keys));
        let started = std::time::Instant::now();
        records.push(system.closed_loop(w, workload, keys.clone()).await);
        measured.push((w, workload, keys, started));
    }
    for (w, workload, keys, started) in measured {
        system.open_loops(w, workload, &keys, records, notes).await;
        if workload.spread.leased() {
            // Its key refilled over the whole span, the other workloads' steps in it included.
            let this = workload.to_string();
            let admitted = records
                .iter()
                .filter(|r| r.system == name && r.workload == this)
                .map(|r| r.allowed)
                .sum();
            let limit = args.floodgate_limit();
            let span = started.elapsed();
            let note = lease_accounting(&target, *workload, &limit, admitted, span, records)?;
            notes.push(note);
        }
    }
    Ok(())
}

/// A system being measured: what each of its steps runs against and records.
struct Measured<'a> {
    args: &'a LoadArgs,
    server: Option<&'a Server>,
    target: &'a Targets,
    progress: &'a ProgressBar,
    bytes_per_key: f64,
}

impl Measured<'_> {
    /// The closed loop of the `w`th workload: `--callers` callers, each checking again as soon
    /// as it is answered, for `--duration`.
    async fn closed_loop(
        &self,
        w: usize,
        workload: &Workload,
        keys: Arc<workload::KeyGen>,
    ) -> Record {
        let name = self.target.name();
        self.progress
            .set_message(format!("{name} {workload}: closed loop"));
        let cpu_before = Cpu::now(self.server);
        let run = driver::closed_loop(
            self.target,
            keys,
            self.args.callers,
            self.args.duration,
            7 + w as u64,
        )
        .await;
        let record = Record::new(
            name,
            &workload.to_string(),
            0,
            &run,
            Cpu::now(self.server).since(cpu_before),
            self.bytes_per_key,
        )
        .on_nodes(self.target.nodes());
        self.progress.inc(1);
        record
    }

    /// The open loop of the `w`th workload at each of `--rates` in turn, until the system falls
    /// behind one (the later rates are skipped); a stall of the machine on a rate it kept up
    /// with is noted.
    async fn open_loops(
        &self,
        w: usize,
        workload: &Workload,
        keys: &Arc<workload::KeyGen>,
        records: &mut Vec<Record>,
        notes: &mut Vec<String>,
    ) {
        let (name, target) = (self.target.name(), self.target);
        let mut saturated = false;
        for &rate in &self.args.rates {
            if saturated {
                self.progress.inc(1);
                continue;
            }
            self.progress
                .set_message(format!("{name} {workload}: open loop at {rate}/s"));
            let cpu_before = Cpu::now(self.server);
            let transport_before = target.transport();
            let seconds = self.args.duration;
            let run = driver::open_loop(target, keys.clone(), rate, seconds, 11 + w as u64).await;
            saturated = run.saturated || run.requests_per_second() < 0.9 * rate as f64;
            // A stall of the machine decides a low rate's p99 (a 4 s step at 1,000 req/s has 40
            // requests past it): the note tells it from a system's own slowness.
            let step = format!("alone at {rate}/s");
            if let Some(note) = stall_note(&step, target, workload, &run, transport_before)
                && !saturated
            {
                notes.push(note);
            }
            records.push(
                Record::new(
                    name,
                    &workload.to_string(),
                    rate,
                    &run,
                    Cpu::now(self.server).since(cpu_before),
                    self.bytes_per_key,
                )
                .on_nodes(target.nodes()),
            );
            self.progress.inc(1);
        }
    }
}

/// Holds a leased workload to its limit: every request checks one key of its own, so what the
/// generator counted as admitted over all its steps is what that key admitted, and the limit
/// allows at most `burst + rate × elapsed` from a fresh bucket (a window limit: `rate` in each
/// window the span touches). Over it, the run fails. Also says how its throughput compares with
/// the same key checked at the owner (`hot-key`).
fn lease_accounting(
    target: &Targets,
    workload: Workload,
    limit: &Limit,
    admitted: u64,
    elapsed: Duration,
    records: &[Record],
) -> anyhow::Result<String> {
    let periods = elapsed.as_nanos() / u128::from(limit.period_ns());
    let allowed = match limit.algorithm() {
        Algorithm::Gcra => {
            let refilled =
                u128::from(limit.rate()) * elapsed.as_nanos() / u128::from(limit.period_ns());
            u128::from(limit.burst()) + refilled + 1
        }
        // A span touches at most `periods + 2` aligned windows (whole periods, and a part at
        // each end), each admitting `rate`; a sliding window or log admits no more than its
        // fixed windows would.
        _ => u128::from(limit.rate()) * (periods + 2),
    };
    let name = target.name();
    let stats = target.lease_stats().unwrap_or_default();
    anyhow::ensure!(
        u128::from(admitted) <= allowed,
        "{name} {workload}: the generator counted {admitted} admitted checks on its one key, \
         over the {allowed} that {limit} allows in {:.1} s: token leases let more through \
         than the limit",
        elapsed.as_secs_f64()
    );
    let closed = |w: &str| {
        records
            .iter()
            .find(|r| r.system == name && r.workload == w && r.offered_rate == 0)
            .map(|r| r.achieved_rate)
    };
    let hot = Workload {
        spread: KeySpread::Hot,
        checks_per_request: 1,
    };
    let ratio = match (closed(&workload.to_string()), closed(&hot.to_string())) {
        (Some(leased), Some(plain)) if plain > 0.0 => {
            format!(", {:.1}x the throughput of {hot}", leased / plain)
        }
        _ => String::new(),
    };
    Ok(format!(
        "{name} {workload}: admitted {admitted} on its key, at most {allowed} allowed by {limit} \
         over {:.1} s (within the limit){ratio}; leases: {} decided locally ({} admitted, {} \
         denied), {} tokens granted, {} returned",
        elapsed.as_secs_f64(),
        stats.local_allowed + stats.local_denied,
        stats.local_allowed,
        stats.local_denied,
        stats.granted,
        stats.returned,
    ))
}

/// CPU seconds used so far by the server under test (0 when it is not ours to read), by its
/// first process alone when others serve beside it, and by this process (the load generator
/// and the client under test).
#[derive(Debug, Clone, Copy)]
struct Cpu {
    server: f64,
    first_server: Option<f64>,
    client: f64,
}

impl Cpu {
    fn now(server: Option<&Server>) -> Self {
        Cpu {
            server: server.and_then(|s| s.cpu_seconds().ok()).unwrap_or(0.0),
            first_server: server
                .filter(|s| s.has_companions())
                .and_then(|s| s.own_cpu_seconds().ok()),
            client: process::own_cpu_seconds(),
        }
    }

    fn since(self, before: Cpu) -> report::CpuSeconds {
        report::CpuSeconds {
            server: self.server - before.server,
            first_server: self
                .first_server
                .zip(before.first_server)
                .map(|(now, then)| now - then),
            client: self.client - before.client,
        }
    }
}

/// The load generator alone, against a target that answers at once: its CPU per million
/// checks, closed loop and at the first offered rate, is what the client CPU figures of the
/// real systems include and can be reduced by.
pub(super) async fn run_generator(
    args: &LoadArgs,
    gateway: &Gateway,
    workloads: &[Workload],
    progress: &ProgressBar,
    records: &mut Vec<Record>,
) {
    let target = gateway.noop();
    for (w, workload) in workloads.iter().enumerate() {
        let keys = Arc::new(workload::KeyGen::new(*workload, args.keys));
        progress.set_message(format!("generator alone {workload}"));
        let before = Cpu::now(None);
        let run = driver::closed_loop(
            &target,
            keys.clone(),
            args.callers,
            args.duration,
            7 + w as u64,
        )
        .await;
        let name = target.name();
        let workload_name = workload.to_string();
        records.push(Record::new(
            name,
            &workload_name,
            0,
            &run,
            Cpu::now(None).since(before),
            0.0,
        ));
        if let Some(&rate) = args.rates.first() {
            let before = Cpu::now(None);
            let run = driver::open_loop(&target, keys, rate, args.duration, 11 + w as u64).await;
            records.push(Record::new(
                name,
                &workload_name,
                rate,
                &run,
                Cpu::now(None).since(before),
                0.0,
            ));
        }
        progress.inc(1);
    }
}

/// Touches every key once (the same key names the workloads use) and returns the server's
/// resident bytes gained per key.
async fn load_keys(target: &Targets, server: Option<&Server>, keys: u64) -> anyhow::Result<f64> {
    let before = server.map(|s| s.rss_bytes()).transpose()?.unwrap_or(0);
    const LOADERS: u64 = 256;
    const LOAD_TRIES: u32 = 3;
    let mut tasks = tokio::task::JoinSet::new();
    for loader in 0..LOADERS {
        let (worker, target) = target.on(loader as usize);
        let target = target.clone();
        tasks.spawn_on(
            async move {
                let mut key = Vec::with_capacity(1);
                for index in (loader..keys).step_by(LOADERS as usize) {
                    key.clear();
                    key.push(format!("user:{index}"));
                    // A peer can time out a call under this burst (Gubernator forwarding to
                    // the key's owner): a few tries, then the run fails.
                    let mut tries = 0;
                    while let Err(e) = target.check(&key).await {
                        tries += 1;
                        if tries == LOAD_TRIES {
                            return Err(
                                e.context(format!("loading {} failed {tries} times", key[0]))
                            );
                        }
                    }
                }
                anyhow::Ok(())
            },
            worker,
        );
    }
    while let Some(result) = tasks.join_next().await {
        result??;
    }
    let after = server.map(|s| s.rss_bytes()).transpose()?.unwrap_or(0);
    Ok(after.saturating_sub(before) as f64 / keys as f64)
}
