//! The open loop: requests sent at a fixed arrival rate whatever the answers do, each class in
//! its place of a repeating pattern, latencies from each request's scheduled time (so a slow
//! answer never delays the next send: no coordinated omission) into an HDR histogram per
//! class.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use floodgate::priority::Priority;
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use tokio::time::Instant;

use super::http;

/// The classes of ten consecutive requests: 10% critical, 30% default, 60% sheddable, spread
/// so no class arrives in bursts.
pub const MIX: [Priority; 10] = [
    Priority::Critical,
    Priority::Sheddable,
    Priority::Default,
    Priority::Sheddable,
    Priority::Sheddable,
    Priority::Default,
    Priority::Sheddable,
    Priority::Sheddable,
    Priority::Default,
    Priority::Sheddable,
];

/// Longest a request may take before it counts as failed.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Most requests in flight from the load at once; an arrival beyond counts as failed (the
/// harness's own bound, so a collapsed gateway cannot take every socket).
pub const MAX_OUTSTANDING: usize = 4_000;

/// What one class saw.
#[derive(Debug, Clone)]
pub struct ClassOutcome {
    pub sent: u64,
    pub ok: u64,
    /// 503 answers (shed).
    pub shed: u64,
    /// 429 answers (refused by a rule).
    pub refused: u64,
    /// Timeouts, errors, other statuses, and arrivals over the harness's bound.
    pub failed: u64,
    /// Latency of the 2xx answers, in microseconds.
    pub latency_us: Histogram<u64>,
}

impl ClassOutcome {
    fn new() -> Self {
        ClassOutcome {
            sent: 0,
            ok: 0,
            shed: 0,
            refused: 0,
            failed: 0,
            latency_us: Histogram::new_with_bounds(1, 60_000_000, 3)
                .unwrap_or_else(|_| unreachable!("valid bounds")),
        }
    }

    fn add(&mut self, status: Option<u16>, latency: Duration) {
        match status {
            Some(200..=299) => {
                self.ok += 1;
                let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
                let _ = self.latency_us.record(us.clamp(1, 60_000_000));
            }
            Some(503) => self.shed += 1,
            Some(429) => self.refused += 1,
            _ => self.failed += 1,
        }
    }
}

/// One phase: `rate` requests a second to `addr`'s `path` for `warmup` (not recorded), then
/// `duration` (recorded); returns one outcome per class (indexed by [`Priority::rank`]) once
/// every recorded request is answered or timed out.
pub async fn run(
    addr: SocketAddr,
    path: &str,
    rate: u64,
    warmup: Duration,
    duration: Duration,
) -> Vec<ClassOutcome> {
    let outcomes: Arc<Mutex<Vec<ClassOutcome>>> = Arc::new(Mutex::new(
        Priority::ALL.iter().map(|_| ClassOutcome::new()).collect(),
    ));
    let interval = Duration::from_nanos(1_000_000_000 / rate.max(1));
    let start = Instant::now();
    let recorded_from = start + warmup;
    let total = (warmup + duration).as_nanos() / interval.as_nanos().max(1);
    let outstanding = Arc::new(tokio::sync::Semaphore::new(MAX_OUTSTANDING));
    let mut tasks = Vec::new();
    for i in 0..u64::try_from(total).unwrap_or(u64::MAX) {
        let due = start + interval * u32::try_from(i).unwrap_or(u32::MAX);
        tokio::time::sleep_until(due).await;
        let class = MIX[(i % MIX.len() as u64) as usize];
        let recorded = due >= recorded_from;
        if recorded {
            outcomes.lock()[class.rank()].sent += 1;
        }
        let Ok(permit) = outstanding.clone().try_acquire_owned() else {
            if recorded {
                outcomes.lock()[class.rank()].failed += 1;
            }
            continue;
        };
        let outcomes = outcomes.clone();
        let path = path.to_owned();
        let task = tokio::spawn(async move {
            let answer = http::get(
                addr,
                &path,
                &[("X-Priority", class.name())],
                REQUEST_TIMEOUT,
            )
            .await;
            let latency = due.elapsed();
            drop(permit);
            if recorded {
                outcomes.lock()[class.rank()].add(answer.map(|a| a.0), latency);
            }
        });
        if recorded {
            tasks.push(task);
        }
    }
    for task in tasks {
        let _ = task.await;
    }
    outcomes.lock().clone()
}
