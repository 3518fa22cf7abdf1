//! The expiry sweeper: forgets expired buckets and reclaims expired leases a few shards at a time and publishes the store's
//! counters and the buffered bytes.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use floodgate::Clock;
use tokio::sync::watch;

use crate::state::Shared;

/// How often idle buckets are swept (a fraction of the shards each time).
pub(super) const SWEEP_INTERVAL: Duration = Duration::from_millis(250);

/// Forgets expired buckets a few shards at a time and publishes the store's counters.
pub(super) async fn sweep_loop(shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    let mut ticker = tokio::time::interval(SWEEP_INTERVAL);
    let stats = shared.store.stats();
    let (mut evicted, mut expired, mut refused) = (0, 0, 0);
    let mut lease_metrics = crate::lease::LeaseMetrics::default();
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => return,
        }
        shared.store.sweep_expired(shared.clock.now_ns(), 8);
        // Leases are also reclaimed when their key is next touched; the sweep frees the room
        // of keys nobody touches again (a gateway that crashed holding them).
        shared.cluster.leases.sweep(shared.clock.now_ns(), 8);
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
