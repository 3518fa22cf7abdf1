//! Criterion micro-benchmarks of the bucket store beside governor's keyed limiter, same workload
//! in the same run: one hot key, 1M keys uniform, 1M keys Zipf, 2 threads on one key, and
//! three keys decided together; and floodgate alone, a frame of 256 checks with caches emptied
//! between frames, in two prefetch orders.
//!
//! Both sides use a fake clock advanced 1 µs per check, keys are u64 (floodgate hashes their
//! bytes into a `BucketKey`, governor hashes them in its DashMap), the limit is 1,000/s with a
//! burst of 50, and every key is inserted before timing starts.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use floodgate::{BucketCheck, BucketKey, BucketStore, Limit, NANOS_PER_SEC, StoreConfig};
use governor::clock::FakeRelativeClock;
use governor::{Quota, RateLimiter};
use rand::{Rng, SeedableRng, rngs::StdRng};
use rand_distr::{Distribution, Zipf};

const KEYS: u64 = 1_000_000;
const SEQUENCE: usize = 1 << 20;
const STEP_NS: u64 = 1_000;

type Governor = RateLimiter<
    u64,
    governor::state::keyed::DefaultKeyedStateStore<u64>,
    FakeRelativeClock,
    governor::middleware::NoOpMiddleware<governor::nanos::Nanos>,
>;

fn floodgate_limit() -> Limit {
    Limit::gcra(1_000, NANOS_PER_SEC, 50).unwrap()
}

fn governor_limiter(clock: &FakeRelativeClock) -> Governor {
    let quota = Quota::per_second(NonZeroU32::new(1_000).unwrap())
        .allow_burst(NonZeroU32::new(50).unwrap());
    RateLimiter::dashmap_with_clock(quota, clock.clone())
}

fn floodgate_store() -> BucketStore {
    BucketStore::new(StoreConfig {
        max_keys: 4 << 20,
        shards: 64,
    })
    .unwrap()
}

fn bucket(k: u64) -> BucketKey {
    BucketKey::new(b"bench", &k.to_le_bytes())
}

/// Key sequences replayed by both systems: uniform over 1M, or Zipf (s = 1.0) over 1M.
fn sequence(zipf: bool) -> Vec<u64> {
    let mut rng = StdRng::seed_from_u64(7);
    let dist = Zipf::new(KEYS as f64, 1.0).unwrap();
    (0..SEQUENCE)
        .map(|_| {
            if zipf {
                dist.sample(&mut rng) as u64 - 1
            } else {
                rng.random_range(0..KEYS)
            }
        })
        .collect()
}

fn keyed_workload(c: &mut Criterion, name: &str, keys: &[u64]) {
    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Elements(1));

    let store = floodgate_store();
    let limit = floodgate_limit();
    for k in 0..KEYS {
        store.check(bucket(k), &limit, 1, 0).unwrap();
    }
    let mut now = NANOS_PER_SEC;
    let mut i = 0;
    group.bench_function("floodgate", |b| {
        b.iter(|| {
            now += STEP_NS;
            i = (i + 1) & (SEQUENCE - 1);
            black_box(store.check(bucket(keys[i]), &limit, 1, now).unwrap())
        })
    });

    let clock = FakeRelativeClock::default();
    let governor = governor_limiter(&clock);
    for k in 0..KEYS {
        let _ = governor.check_key(&k);
    }
    let mut i = 0;
    group.bench_function("governor", |b| {
        b.iter(|| {
            clock.advance(Duration::from_nanos(STEP_NS));
            i = (i + 1) & (SEQUENCE - 1);
            black_box(governor.check_key(&keys[i]).is_ok())
        })
    });
    group.finish();

    // The node decides a frame's checks together, so it can prefetch a few keys ahead: the same
    // keys, 64 per iteration, with and without the prefetch; governor has no batch API, so its
    // batch is the same loop of single checks.
    let mut group = c.benchmark_group(format!("{name}_batch64"));
    group.throughput(Throughput::Elements(BATCH as u64));
    let mut i = 0;
    let mut buckets = [bucket(0); BATCH];
    group.bench_function("floodgate_prefetch", |b| {
        b.iter(|| {
            now += STEP_NS;
            for (j, slot) in buckets.iter_mut().enumerate() {
                *slot = bucket(keys[(i + j) & (SEQUENCE - 1)]);
            }
            i = (i + BATCH) & (SEQUENCE - 1);
            for j in 0..BATCH {
                if let Some(ahead) = buckets.get(j + PREFETCH_AHEAD) {
                    store.prefetch(*ahead, limit.algorithm());
                }
                black_box(store.check(buckets[j], &limit, 1, now).unwrap());
            }
        })
    });
    group.bench_function("floodgate", |b| {
        b.iter(|| {
            now += STEP_NS;
            for (j, slot) in buckets.iter_mut().enumerate() {
                *slot = bucket(keys[(i + j) & (SEQUENCE - 1)]);
            }
            i = (i + BATCH) & (SEQUENCE - 1);
            for key in &buckets {
                black_box(store.check(*key, &limit, 1, now).unwrap());
            }
        })
    });
    group.bench_function("governor", |b| {
        b.iter(|| {
            clock.advance(Duration::from_nanos(STEP_NS));
            for j in 0..BATCH {
                black_box(governor.check_key(&keys[(i + j) & (SEQUENCE - 1)]).is_ok());
            }
            i = (i + BATCH) & (SEQUENCE - 1);
        })
    });
    group.finish();
}

const BATCH: usize = 64;
const PREFETCH_AHEAD: usize = 8;

fn hot_key(c: &mut Criterion) {
    let keys = vec![42; SEQUENCE];
    let mut group = c.benchmark_group("hot_key");
    group.throughput(Throughput::Elements(1));
    let store = floodgate_store();
    let limit = floodgate_limit();
    let mut now = NANOS_PER_SEC;
    group.bench_function("floodgate", |b| {
        b.iter(|| {
            now += STEP_NS;
            black_box(store.check(bucket(keys[0]), &limit, 1, now).unwrap())
        })
    });
    let clock = FakeRelativeClock::default();
    let governor = governor_limiter(&clock);
    group.bench_function("governor", |b| {
        b.iter(|| {
            clock.advance(Duration::from_nanos(STEP_NS));
            black_box(governor.check_key(&keys[0]).is_ok())
        })
    });
    group.finish();
}

fn uniform(c: &mut Criterion) {
    keyed_workload(c, "uniform_1m", &sequence(false));
}

fn zipf(c: &mut Criterion) {
    keyed_workload(c, "zipf_1m", &sequence(true));
}

/// A gateway request with three rules (user, IP, API key) is one group decided all-or-nothing
/// (`BucketStore::check_all`: every shard involved locked, undone if one denies). Over 1,000
/// keys, so the buckets stay cached and the group's own bookkeeping is what is measured.
/// governor has no all-or-nothing check; its side is the same three keys checked one by one.
fn three_keys(c: &mut Criterion) {
    const HOT: u64 = 1_000;
    let mut group = c.benchmark_group("three_keys_1k");
    group.throughput(Throughput::Elements(3));
    let store = floodgate_store();
    let limit = floodgate_limit();
    let keys: Vec<u64> = sequence(false).iter().map(|k| k % HOT).collect();
    let mut now = NANOS_PER_SEC;
    let mut i = 0;
    let mut checks = Vec::with_capacity(3);
    let mut decisions = Vec::with_capacity(3);
    group.bench_function("floodgate_check_all", |b| {
        b.iter(|| {
            now += STEP_NS;
            checks.clear();
            for j in 0..3 {
                checks.push(BucketCheck {
                    key: bucket(keys[(i + j) & (SEQUENCE - 1)]),
                    limit,
                    cost: 1,
                    peek: false,
                });
            }
            i = (i + 3) & (SEQUENCE - 1);
            black_box(store.check_all(&checks, now, &mut decisions).unwrap())
        })
    });
    let clock = FakeRelativeClock::default();
    let governor = governor_limiter(&clock);
    let mut i = 0;
    group.bench_function("governor", |b| {
        b.iter(|| {
            clock.advance(Duration::from_nanos(STEP_NS));
            for j in 0..3 {
                black_box(governor.check_key(&keys[(i + j) & (SEQUENCE - 1)]).is_ok());
            }
            i = (i + 3) & (SEQUENCE - 1);
        })
    });
    group.finish();
}

/// Two threads checking one hot key at once; one iteration is one check on each thread, so the
/// time reported is per pair of concurrent checks. The clock is frozen mid-way through a period
/// for both, so both spend the run on the same mix of allows and denials.
fn contention(c: &mut Criterion) {
    let mut group = c.benchmark_group("contention_2_threads");
    group.throughput(Throughput::Elements(2));
    let store = Arc::new(floodgate_store());
    group.bench_function("floodgate", |b| {
        b.iter_custom(|iters| {
            let now = NANOS_PER_SEC;
            run_pair(iters, {
                let store = store.clone();
                move || {
                    black_box(store.check(bucket(7), &floodgate_limit(), 1, now).unwrap());
                }
            })
        })
    });
    let clock = FakeRelativeClock::default();
    let governor = Arc::new(governor_limiter(&clock));
    group.bench_function("governor", |b| {
        b.iter_custom(|iters| {
            run_pair(iters, {
                let governor = governor.clone();
                move || {
                    black_box(governor.check_key(&7).is_ok());
                }
            })
        })
    });
    group.finish();
}

/// Runs `op` `iters` times on each of two threads started together; returns the wall time.
fn run_pair(iters: u64, op: impl Fn() + Send + Clone + 'static) -> Duration {
    let barrier = Arc::new(Barrier::new(3));
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let (barrier, op) = (barrier.clone(), op.clone());
            thread::spawn(move || {
                barrier.wait();
                for _ in 0..iters {
                    op();
                }
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    workers.into_iter().for_each(|w| w.join().unwrap());
    start.elapsed()
}

/// A frame of 256 checks over 1M keys decided with caches emptied in between, as the node's are
/// when the gateway's threads run on its vCPU between two frames: the keys' page translations
/// are no longer cached, and a prefetch that misses them waits for its page walk before later
/// instructions retire. The node's order (prefetches in bursts of 8, one burst ahead) beside
/// the earlier one (one group's prefetch 8 ahead, between two decisions).
fn cold_frame(c: &mut Criterion) {
    const FRAME: usize = 256;
    const BURST: usize = 8;
    const EVICT_BYTES: usize = 32 << 20;
    let keys = sequence(false);
    let store = floodgate_store();
    let limit = floodgate_limit();
    let mut now = 0;
    for key in &keys {
        store.check(bucket(*key), &limit, 1, now).unwrap();
    }
    let mut evict = vec![0u8; EVICT_BYTES];
    let mut group = c.benchmark_group("cold_frame_256");
    group.throughput(Throughput::Elements(FRAME as u64));
    // Each iteration's eviction takes far longer than the frame: few samples keep it short.
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(1));
    let mut next = 0;
    let mut next_frame = || {
        for line in evict.iter_mut().step_by(64) {
            *line = line.wrapping_add(1);
        }
        let frame: Vec<BucketKey> = (0..FRAME)
            .map(|j| bucket(keys[(next + j) & (SEQUENCE - 1)]))
            .collect();
        next = (next + FRAME) & (SEQUENCE - 1);
        frame
    };
    group.bench_function("bursts_of_8", |b| {
        b.iter_batched(
            &mut next_frame,
            |frame| {
                now += STEP_NS;
                for i in 0..FRAME {
                    if i % BURST == 0 {
                        let from = if i == 0 { 0 } else { i + BURST };
                        for key in frame.iter().take(i + 2 * BURST).skip(from) {
                            store.prefetch(*key, limit.algorithm());
                        }
                    }
                    black_box(store.check(frame[i], &limit, 1, now).unwrap());
                }
            },
            BatchSize::PerIteration,
        )
    });
    group.bench_function("one_8_ahead", |b| {
        b.iter_batched(
            &mut next_frame,
            |frame| {
                now += STEP_NS;
                for i in 0..FRAME {
                    if let Some(ahead) = frame.get(i + PREFETCH_AHEAD) {
                        store.prefetch(*ahead, limit.algorithm());
                    }
                    black_box(store.check(frame[i], &limit, 1, now).unwrap());
                }
            },
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = hot_key, uniform, zipf, contention, three_keys, cold_frame
}
criterion_main!(benches);
