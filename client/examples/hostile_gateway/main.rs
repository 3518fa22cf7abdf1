//! A hostile gateway, written against the public client crate as any new user's program would
//! be: it starts a `floodgate-node` with a small `--max-store-bytes`, fills it with the most
//! expensive limits a caller may choose (every algorithm, concurrency leases, token leases)
//! over many keys, and shows from `/proc` that the node's resident memory stays under the
//! budget plus the node's fixed overhead, that another caller's key is decided as before, and
//! that a new key afterwards is decided, not refused. Exits 1 if any of that fails.
//!
//! `cargo run --release -p floodgate-client --example hostile_gateway -- [--node PATH]
//! [--max-store-bytes BYTES]` (`make hostile-gateway`).

mod flood;

use std::path::PathBuf;

use flood::{NodeProcess, Plan, Report};

const MIB: usize = 1 << 20;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut node = PathBuf::from("target/release/floodgate-node");
    let mut budget = 64 * MIB;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args.next().ok_or(format!("{arg} needs a value"))?;
        match arg.as_str() {
            "--node" => node = PathBuf::from(value),
            "--max-store-bytes" => budget = value.parse()?,
            _ => return Err(format!("unknown argument {arg}").into()),
        }
    }
    let plan = Plan::overfilling(budget);
    let process = NodeProcess::start(&node, budget)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let report = runtime.block_on(flood::run(&process, &plan))?;
    print(&plan, &report);
    let failures = flood::judge(&plan, &report);
    for failure in &failures {
        println!("FAILED: {failure}");
    }
    if !failures.is_empty() {
        println!(
            "node log:\n{}",
            process.log.lock().unwrap_or_else(|e| e.into_inner())
        );
        // `exit` runs no destructors: stop the node first, or it outlives the run.
        drop(runtime);
        drop(process);
        std::process::exit(1);
    }
    Ok(())
}

fn print(plan: &Plan, report: &Report) {
    let mib = |b: usize| b as f64 / MIB as f64;
    println!(
        "node: --max-store-bytes {:.1} MiB; resident may grow by that plus {:.1} MiB",
        mib(plan.budget),
        mib(flood::overhead_bytes(plan.budget))
    );
    println!(
        "{:<26} {:>9} {:>9} {:>12} {:>8}",
        "flood", "keys", "decided", "not decided", "took"
    );
    for o in &report.outcomes {
        println!(
            "{:<26} {:>9} {:>9} {:>12} {:>7.1}s",
            o.name,
            o.keys,
            o.decided,
            o.not_decided,
            o.took.as_secs_f64()
        );
        if let Some(why) = &o.first_failure {
            println!("    first not decided: {why}");
        }
    }
    println!(
        "resident: {:.1} MiB before the flood, {:.1} MiB after, {:.1} MiB at most (VmHWM)",
        mib(report.before.rss),
        mib(report.after.rss),
        mib(report.after.hwm)
    );
    println!(
        "witness remaining before the flood and after each kind: {:?}; a new key afterwards \
         decided: {}",
        report.witness, report.new_key_decided
    );
    println!("token leases at the gateway: {:?}", report.token_leases);
}
