//! The client's per-call path allocates nothing once warm: a counting global allocator (this
//! test binary's own; the library imposes none) counts what the calling thread allocates while
//! it makes many checks through a real node on loopback with `Client::check_into`.
//!
//! The calls run in `Runtime::block_on` on the test's thread, while the client's stream tasks,
//! quinn and the node run on the runtime's workers: what the calling thread allocates is exactly
//! what the per-call path (validation, routing, the check group, the queue, the reply slot, the
//! verdicts) costs. Per-frame work on the stream tasks is not counted here.

mod common;

// The counting allocator is the node's unit tests' own, one file for both test binaries.
#[path = "../../node/src/alloc_counter.rs"]
mod alloc_counter;

use alloc_counter::allocations_during;
use common::*;
use floodgate_client::{Check, Client, Source, Verdict};

const CALLS: usize = 2_000;

/// parking_lot sets up a thread's parking data (growing a table it allocates) the first time the
/// thread waits on one of its locks: once per thread, not per call. The calling thread waits on
/// the call queue's lock only when a stream task holds it at that instant, which the warm-up may
/// never hit; the counted calls then saw those two allocations in about one run of twenty.
/// Waiting once here sets that up beforehand.
fn set_up_parking_on_this_thread() {
    let lock = parking_lot::Mutex::new(());
    let mut guard = lock.lock();
    let _ = parking_lot::Condvar::new().wait_for(&mut guard, std::time::Duration::ZERO);
}

#[test]
fn check_into_allocates_nothing_per_call_once_warm() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let certs = certs();
    let (node, client) = runtime.block_on(async {
        let node = start_node(&certs, any_port(), false).await;
        let client = Client::connect(&[node.local_addr()], client_config(&certs))
            .await
            .unwrap();
        (node, client)
    });
    let limit = per_hour(1_000_000);
    // Keys of one length, made before counting: the caller's own checks are not the client's
    // cost. One-check and three-check calls alternate, as a gateway's rules would.
    let calls: Vec<Vec<Check>> = (0..CALLS)
        .map(|i| {
            let checks = if i % 2 == 0 { 1 } else { 3 };
            (0..checks)
                .map(|j| Check::new(format!("user:{:06}", i * 3 + j), limit))
                .collect()
        })
        .collect();
    let mut verdicts: Vec<Verdict> = Vec::with_capacity(3);
    let run = |calls: &[Vec<Check>], verdicts: &mut Vec<Verdict>| {
        runtime.block_on(async {
            let mut from_node = 0;
            for checks in calls {
                client.check_into(checks, verdicts).await.unwrap();
                assert_eq!(verdicts.len(), checks.len());
                from_node += verdicts.iter().all(|v| v.source == Source::Node) as usize;
            }
            from_node
        })
    };
    // Warm-up: fills the pools (check groups, key buffers, reply slots) and the queue.
    let warm = run(&calls[..CALLS / 4], &mut verdicts);
    assert_eq!(warm, CALLS / 4);
    set_up_parking_on_this_thread();
    let (from_node, allocations) = allocations_during(|| run(&calls, &mut verdicts));
    assert_eq!(from_node, CALLS, "every call must be decided by the node");
    assert_eq!(
        allocations, 0,
        "{allocations} allocations over {CALLS} calls on the per-call path"
    );

    // The same counter on `check`, which returns a new vector per call, does see allocations:
    // this test can fail.
    let (_, with_vec) = allocations_during(|| {
        runtime.block_on(async {
            for checks in &calls[..100] {
                client.check(checks).await.unwrap();
            }
        })
    });
    assert!(
        with_vec >= 100,
        "check allocated {with_vec} times in 100 calls"
    );

    runtime.block_on(async {
        client.close().await;
        node.shutdown().await;
    });
}
