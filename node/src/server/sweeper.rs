//! The expiry sweeper: forgets expired buckets in bounded steps (a slice of a shard at a time)
//! and reclaims expired leases one shard at a time, off the runtime's workers, and publishes
//! the store's counters and the buffered bytes.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use floodgate::Clock;
use floodgate::lease::LeaseStore;
use floodgate::{BucketStore, EpochClock};
use tokio::sync::watch;

use crate::budget::BufferBudget;
use crate::metrics::NodeMetrics;

/// What the sweeper sweeps and publishes: the bucket and lease stores, and the buffered bytes.
#[derive(Debug)]
pub(super) struct Swept {
    pub(super) store: Arc<BucketStore>,
    pub(super) leases: Arc<LeaseStore>,
    pub(super) clock: EpochClock,
    pub(super) metrics: Arc<NodeMetrics>,
    pub(super) budget: Arc<BufferBudget>,
}

/// How long one pass of the sweeper over the whole bucket store should take. Expired buckets
/// only hold memory (a full shard forgets its own when a new key needs room), so the sweeper
/// walks slowly and wakes the node seldom. A step every 10 ms, whatever the store's size, woke
/// an idle node about 440 times a second (the step runs on a blocking thread), and on 2 cores
/// at 10,000 req/s it put floodgate's p50 further behind Redis's (bench/RESULTS.md).
const SWEEP_PASS: Duration = Duration::from_secs(30);
/// Steps come at least this far apart, so a store too large to walk in [`SWEEP_PASS`] takes
/// longer passes instead of more of the node's time.
const MIN_STEP_INTERVAL: Duration = Duration::from_millis(10);
/// Steps come at most this far apart, so leases (a shard of their store each step) and the
/// published counters stay current on a nearly empty node.
const MAX_STEP_INTERVAL: Duration = Duration::from_secs(1);
/// GCRA slots walked per step (about 100 KiB, tens of µs): each step holds one shard's lock
/// about that long for its GCRA buckets, whatever the store's size. A store of a million keys
/// (about 2M slots) takes about 512 steps, one every 58 ms.
const SWEEP_SLOTS: usize = 4_096;
/// Least time between two warnings that checks or lease acquires were answered `store_full`.
const WARN_EVERY: Duration = Duration::from_secs(10);
/// How often the store's counters and gauges are published.
const PUBLISH_EVERY: Duration = Duration::from_millis(250);

/// Loud but bounded: one warning per [`WARN_EVERY`], counting every refusal since the last.
#[derive(Debug, Default)]
struct Refusals {
    warned_at: Option<tokio::time::Instant>,
    warned: u64,
}

impl Refusals {
    /// The refusals since the last warning when one is due now (`total`: since start).
    fn due(&mut self, total: u64) -> Option<u64> {
        if total <= self.warned || self.warned_at.is_some_and(|at| at.elapsed() < WARN_EVERY) {
            return None;
        }
        self.warned_at = Some(tokio::time::Instant::now());
        let since = total - self.warned;
        self.warned = total;
        Some(since)
    }
}

/// The pause before the next step, so that a pass over the store as it is sized now takes
/// about [`SWEEP_PASS`].
fn step_interval(steps_per_pass: usize) -> Duration {
    let steps = u32::try_from(steps_per_pass.max(1)).unwrap_or(u32::MAX);
    (SWEEP_PASS / steps).clamp(MIN_STEP_INTERVAL, MAX_STEP_INTERVAL)
}

/// Until shutdown, a step at a time: expired buckets forgotten a slice of a shard at a time,
/// expired leases a shard at a time; the stores' counters published every [`PUBLISH_EVERY`].
pub(super) async fn sweep_loop(swept: Arc<Swept>, mut shutdown: watch::Receiver<bool>) {
    swept
        .metrics
        .store_max_bytes
        .set(swept.store.max_bytes() as f64);
    let mut published = Published::default();
    let mut published_at = tokio::time::Instant::now();
    let mut cursor = floodgate::SweepCursor::default();
    loop {
        // Paced from the end of the last step: a late step is not made up for in a burst.
        let pause = step_interval(swept.store.sweep_steps_per_pass(SWEEP_SLOTS));
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = shutdown.changed() => return,
        }
        match sweep_step(&swept, cursor).await {
            Some(next) => cursor = next,
            None => {
                tracing::error!("the expiry sweep panicked; sweeping stops");
                return;
            }
        }
        if published_at.elapsed() < PUBLISH_EVERY {
            continue;
        }
        published_at = tokio::time::Instant::now();
        published.publish(&swept);
    }
}

/// One step from `cursor`: a slice of expired buckets forgotten and one shard of leases
/// reclaimed. Returns where the next step starts; `None` if the step panicked.
async fn sweep_step(
    swept: &Arc<Swept>,
    mut cursor: floodgate::SweepCursor,
) -> Option<floodgate::SweepCursor> {
    // On a blocking-pool thread, not a runtime worker (one, by default, on small machines):
    // a step's GCRA slice is bounded, but the step that ends a shard also filters its
    // window and log maps whole, and a store of mostly window keys makes that a long walk.
    let sweeping = swept.clone();
    tokio::task::spawn_blocking(move || {
        let now_ns = sweeping.clock.now_ns();
        sweeping.store.sweep_step(now_ns, &mut cursor, SWEEP_SLOTS);
        // Leases are also reclaimed when their key is next touched; the sweep frees the
        // room of keys nobody touches again (a gateway that crashed holding them).
        sweeping.leases.sweep(now_ns, 1);
        cursor
    })
    .await
    .ok()
}

/// What the sweeper published last: each store counter's total then (metrics counters take
/// the difference), the lease store's, and when each store-full warning was last given.
#[derive(Debug, Default)]
struct Published {
    evicted: u64,
    expired: u64,
    refused: u64,
    new: u64,
    used: u64,
    denying: u64,
    keys_refused: Refusals,
    leases_refused: Refusals,
    leases: crate::lease::LeaseMetrics,
}

impl Published {
    /// Publishes the lease and bucket stores' gauges and counters and the buffered bytes, and
    /// warns (at most once per [`WARN_EVERY`] each) when either store refused for being full.
    fn publish(&mut self, swept: &Swept) {
        let stats = swept.store.stats();
        self.leases.publish(&swept.leases);
        swept.metrics.live_buckets.set(swept.store.len() as f64);
        swept.metrics.buffered_bytes.set(swept.budget.used() as f64);
        let publish =
            |counter: &metrics::Counter, total: &std::sync::atomic::AtomicU64, seen: &mut u64| {
                let now = total.load(Ordering::Relaxed);
                counter.increment(now - *seen);
                *seen = now;
            };
        swept
            .metrics
            .store_bytes
            .set(swept.store.bytes_used() as f64);
        publish(&swept.metrics.evicted, &stats.evicted, &mut self.evicted);
        publish(
            &swept.metrics.evictions[0],
            &stats.evicted_new,
            &mut self.new,
        );
        publish(
            &swept.metrics.evictions[1],
            &stats.evicted_used,
            &mut self.used,
        );
        publish(
            &swept.metrics.evictions[2],
            &stats.evicted_denying,
            &mut self.denying,
        );
        publish(&swept.metrics.expired, &stats.expired, &mut self.expired);
        publish(
            &swept.metrics.refused_keys,
            &stats.refused,
            &mut self.refused,
        );
        if let Some(since) = self.keys_refused.due(self.refused) {
            tracing::warn!(
                refused = since,
                bytes = swept.store.bytes_used(),
                max_bytes = swept.store.max_bytes(),
                "the bucket store had nothing left to evict: checks answered store_full"
            );
        }
        let leases = &swept.leases;
        if let Some(since) = self
            .leases_refused
            .due(leases.stats().full.load(Ordering::Relaxed))
        {
            tracing::warn!(
                refused = since,
                held = leases.held(),
                max_leases = leases.config().max_leases,
                "the lease store is full of live leases: acquires answered store_full"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pass takes about `SWEEP_PASS` whatever the store's size, within the step bounds.
    #[test]
    fn steps_are_paced_to_one_pass_per_sweep_pass() {
        // An empty store of 64 shards: a step per shard, about every half second.
        assert_eq!(step_interval(64), Duration::from_micros(468_750));
        // A million keys (64 tables of 32,768 slots, 8 steps each): about every 58 ms.
        assert_eq!(step_interval(512), Duration::from_nanos(58_593_750));
        // Larger stores take longer passes, never steps closer than 10 ms.
        assert_eq!(step_interval(1 << 20), MIN_STEP_INTERVAL);
        // A single shard still steps every second.
        assert_eq!(step_interval(0), MAX_STEP_INTERVAL);
        assert_eq!(step_interval(1), MAX_STEP_INTERVAL);
    }
}
