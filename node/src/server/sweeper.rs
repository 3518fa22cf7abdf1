//! The expiry sweeper: forgets expired buckets in bounded steps (a slice of a shard at a time)
//! and reclaims expired leases one shard at a time, off the runtime's workers, and publishes
//! the store's counters and the buffered bytes.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use floodgate::Clock;
use tokio::sync::watch;

use crate::state::Shared;

/// How often the sweeper takes a step: a slice of the bucket store and one shard of the lease
/// store.
pub(super) const SWEEP_INTERVAL: Duration = Duration::from_millis(10);
/// GCRA slots walked per step (about 100 KiB, tens of µs): each step holds one shard's lock
/// about that long for its GCRA buckets, whatever the store's size. About 400k slots a second: a store of a
/// million keys (1.4M slots) is swept within about 4 s. Full shards also forget expired
/// buckets on their own when a new key needs room, so a slow sweep of a huge store delays
/// only giving memory back.
const SWEEP_SLOTS: usize = 4_096;
/// Counters are published every this many steps (every 250 ms).
const PUBLISH_EVERY: u32 = 25;

/// Forgets expired buckets a slice of a shard at a time and publishes the store's counters.
pub(super) async fn sweep_loop(shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    let mut ticker = tokio::time::interval(SWEEP_INTERVAL);
    // A late sweep is not made up for in a burst: the next one simply comes an interval later.
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stats = shared.store.stats();
    let (mut evicted, mut expired, mut refused) = (0, 0, 0);
    let mut lease_metrics = crate::lease::LeaseMetrics::default();
    let mut sweeps: u32 = 0;
    let mut cursor = floodgate::SweepCursor::default();
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => return,
        }
        // On a blocking-pool thread, not a runtime worker (one, by default, on small machines):
        // a step's GCRA slice is bounded, but the step that ends a shard also filters its
        // window and log maps whole, and a store of mostly window keys makes that a long walk.
        let sweeping = shared.clone();
        let stepped = tokio::task::spawn_blocking(move || {
            let now_ns = sweeping.clock.now_ns();
            sweeping.store.sweep_step(now_ns, &mut cursor, SWEEP_SLOTS);
            // Leases are also reclaimed when their key is next touched; the sweep frees the
            // room of keys nobody touches again (a gateway that crashed holding them).
            sweeping.cluster.leases.sweep(now_ns, 1);
            cursor
        })
        .await;
        match stepped {
            Ok(next) => cursor = next,
            Err(_) => {
                tracing::error!("the expiry sweep panicked; sweeping stops");
                return;
            }
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
