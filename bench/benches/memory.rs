//! Bytes of state per active key, floodgate's bucket store beside governor's keyed limiter,
//! measured in the same run by a counting global allocator: heap bytes live after inserting 1M
//! keys, minus before, divided by the keys. Run with `make bench`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};

use floodgate::{BucketKey, BucketStore, Limit, NANOS_PER_SEC, StoreConfig};
use governor::{Quota, RateLimiter};

/// Counts live heap bytes; the cost (one relaxed add per allocation) is paid only here.
struct Counting;

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged and only counts sizes.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const KEYS: u64 = 1_000_000;

fn live() -> usize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

fn main() {
    // Only run under `cargo bench` (criterion-style `--bench` flag), not as a test.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let before = live();
    let store = BucketStore::new(StoreConfig {
        max_keys: 4 << 20,
        shards: 64,
    })
    .unwrap();
    let limit = Limit::gcra(1_000, NANOS_PER_SEC, 50).unwrap();
    for k in 0..KEYS {
        store
            .check(BucketKey::new(b"bench", &k.to_le_bytes()), &limit, 1, 0)
            .unwrap();
    }
    let floodgate = (live() - before) as f64 / KEYS as f64;
    drop(store);

    let before = live();
    let quota = Quota::per_second(NonZeroU32::new(1_000).unwrap())
        .allow_burst(NonZeroU32::new(50).unwrap());
    let governor = RateLimiter::dashmap(quota);
    for k in 0..KEYS {
        let _ = governor.check_key(&k);
    }
    let governor_bytes = (live() - before) as f64 / KEYS as f64;
    drop(governor);

    println!("bytes per active key (1M gcra keys, heap bytes live after / keys):");
    println!("  floodgate: {floodgate:.1}");
    println!("  governor:  {governor_bytes:.1}");
    println!(
        "  ratio floodgate/governor: {:.2}",
        floodgate / governor_bytes
    );
}
