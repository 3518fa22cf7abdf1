//! The hostile gateway at a small scale, against the node binary: a flood of expensive limits
//! of every algorithm and both kinds of lease over many keys keeps the process's peak resident
//! memory (VmHWM) under `--max-store-bytes` plus the documented overhead, another caller's key
//! is decided as before, and a new key afterwards is decided. (A memory bound, not a timing one.)

#[path = "../../client/examples/hostile_gateway/flood.rs"]
mod flood;

use std::path::Path;

use flood::{NodeProcess, Plan};

const BUDGET: usize = 8 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_gateway_keeps_the_node_under_its_store_budget() {
    let node = NodeProcess::start(Path::new(env!("CARGO_BIN_EXE_floodgate-node")), BUDGET).unwrap();
    // Every kind twice over the budget; leases (one call each) fewer, so a debug build's node
    // decides it all in seconds.
    let plan = Plan {
        leases: 4_000,
        hot_keys: 64,
        ..Plan::overfilling(BUDGET)
    };
    let report = flood::run(&node, &plan).await.unwrap();
    let failures = flood::judge(&plan, &report);
    assert!(
        failures.is_empty(),
        "{failures:#?}\n{report:#?}\nnode log:\n{}",
        node.log.lock().unwrap()
    );
}
