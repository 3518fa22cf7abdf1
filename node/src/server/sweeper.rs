//! The expiry sweeper: forgets expired buckets and reclaims expired leases one shard at a time,
//! off the runtime's workers, and publishes the store's counters and the buffered bytes.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use floodgate::Clock;
use tokio::sync::watch;

use crate::state::Shared;

/// How often one shard of the bucket store and one of the lease store are swept: every shard
/// of either within 2 s (64 shards). One shard at a time keeps each pause of a shard's checks
/// short.
pub(super) const SWEEP_INTERVAL: Duration = Duration::from_micros(31_250);
/// Counters are published every this many sweeps (every 250 ms).
const PUBLISH_EVERY: u32 = 8;

/// Forgets expired buckets a few shards at a time and publishes the store's counters.
pub(super) async fn sweep_loop(shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    let mut ticker = tokio::time::interval(SWEEP_INTERVAL);
    // A late sweep is not made up for in a burst: the next one simply comes an interval later.
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stats = shared.store.stats();
    let (mut evicted, mut expired, mut refused) = (0, 0, 0);
    let mut lease_metrics = crate::lease::LeaseMetrics::default();
    let mut sweeps: u32 = 0;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => return,
        }
        // A shard's scan holds its lock for a whole table walk: on a blocking-pool thread it
        // does not stall the runtime's workers (one, by default, on small machines), so the
        // requests they serve meanwhile do not wait for it.
        let sweeping = shared.clone();
        let swept = tokio::task::spawn_blocking(move || {
            sweeping.store.sweep_expired(sweeping.clock.now_ns(), 1);
            // Leases are also reclaimed when their key is next touched; the sweep frees the
            // room of keys nobody touches again (a gateway that crashed holding them).
            sweeping.cluster.leases.sweep(sweeping.clock.now_ns(), 1);
        })
        .await;
        if swept.is_err() {
            tracing::error!("the expiry sweep panicked; sweeping stops");
            return;
        }
        sweeps = sweeps.wrapping_add(1);
        if !sweeps.is_multiple_of(PUBLISH_EVERY) {
            continue;
        }
        lease_metrics.publish(&shared.cluster.leases);
        shared.metrics.live_buckets.set(shared.store.len() as f64);
        shared
            .metrics
            .buffered_bytes
            .set(shared.budget.used() as f64);
        let publish =
            |counter: &metrics::Counter, total: &std::sync::atomic::AtomicU64, seen: &mut u64| {
                let now = total.load(Ordering::Relaxed);
                counter.increment(now - *seen);
                *seen = now;
            };
        publish(&shared.metrics.evicted, &stats.evicted, &mut evicted);
        publish(&shared.metrics.expired, &stats.expired, &mut expired);
        publish(&shared.metrics.refused_keys, &stats.refused, &mut refused);
    }
}
