//! The load benchmark compares like with like: for one trace on a few keys, floodgate's GCRA
//! (the core store on a fixed clock), Redis + the token-bucket Lua script and Redis + redis-cell's
//! CL.THROTTLE, each driven through the benchmark's own targets with the benchmark's mapping of
//! the limit, allow the same count on every key.
//!
//! A second test pins the one way they differ by design: a denied multi-key request.
//!
//! Both Redis setups read Redis's (or the client's) wall clock, so the trace cannot rely on
//! time standing still: every key gets its requests back to back, and the limit refills one
//! unit per 12 minutes, so no refill can land while the test runs and each key admits exactly
//! its burst. Needs redis-server on PATH, and builds the module with `bench/redis-cell.sh`
//! (seconds, once); without either, the part that needs it is skipped with the reason printed.

use std::path::{Path, PathBuf};
use std::process::Command;

use floodgate::{BucketCheck, BucketKey, BucketStore, Limit, NANOS_PER_SEC, StoreConfig};
use floodgate_bench::load::{Outcome, Target, start_redis};

/// 5 at once, then one per 12 minutes.
fn limit() -> Limit {
    Limit::gcra(5, 3_600 * NANOS_PER_SEC, 5).unwrap()
}

/// Keys and how many requests each sends: below, at, and past the burst.
const TRACE: [(&str, u64); 4] = [
    ("agree:below", 2),
    ("agree:at", 5),
    ("agree:past", 6),
    ("agree:far-past", 11),
];

/// The trace's requests in order: round-robin over the keys that still have requests to send.
fn arrivals() -> Vec<&'static str> {
    let most = TRACE.iter().map(|&(_, n)| n).max().unwrap_or(0);
    (0..most)
        .flat_map(|round| {
            TRACE
                .iter()
                .filter(move |&&(_, n)| round < n)
                .map(|&(key, _)| key)
        })
        .collect()
}

/// Allowed requests per key, in `TRACE` order.
type Counts = Vec<(&'static str, u64)>;

fn count(allowed: impl IntoIterator<Item = (&'static str, bool)>) -> Counts {
    let mut counts: Counts = TRACE.iter().map(|&(key, _)| (key, 0)).collect();
    for (key, passed) in allowed {
        if let Some(slot) = counts.iter_mut().find(|(k, _)| *k == key) {
            slot.1 += u64::from(passed);
        }
    }
    counts
}

fn floodgate_counts() -> Counts {
    let store = BucketStore::new(StoreConfig {
        max_keys: 64,
        shards: 4,
    })
    .unwrap();
    let now_ns = 1_000 * NANOS_PER_SEC;
    count(arrivals().into_iter().map(|key| {
        let decision = store
            .check(
                BucketKey::new(b"agree", key.as_bytes()),
                &limit(),
                1,
                now_ns,
            )
            .unwrap();
        (key, decision.is_allowed())
    }))
}

async fn redis_counts(target: &Target) -> Counts {
    let mut allowed = Vec::new();
    for key in arrivals() {
        let outcome = target.check(&[key.to_owned()]).await.unwrap();
        assert_ne!(outcome, Outcome::Degraded, "{target:?} on {key}");
        allowed.push((key, outcome == Outcome::Allowed));
    }
    count(allowed)
}

/// Builds (or finds) the redis-cell module; the reason in words when it cannot.
fn redis_cell_module() -> Result<PathBuf, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("redis-cell.sh");
    let output = Command::new("bash")
        .arg(&script)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).trim().to_owned());
    }
    Ok(PathBuf::from(
        String::from_utf8_lossy(&output.stdout).trim(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floodgate_and_both_redis_baselines_allow_the_same_counts() {
    let expected: Counts = TRACE.iter().map(|&(key, n)| (key, n.min(5))).collect();
    let floodgate = floodgate_counts();
    assert_eq!(floodgate, expected, "floodgate's GCRA");

    let redis = match start_redis(None) {
        Ok(server) => server,
        Err(e) => {
            eprintln!("skipping the Redis baselines: {e:#}");
            return;
        }
    };
    let lua = Target::redis(redis.addr, 1, limit()).await.unwrap();
    assert_eq!(
        redis_counts(&lua).await,
        floodgate,
        "redis+lua against floodgate"
    );

    let module = match redis_cell_module() {
        Ok(module) => module,
        Err(reason) => {
            eprintln!("skipping the redis+cell baseline: {reason}");
            return;
        }
    };
    let redis = start_redis(Some(&module)).unwrap();
    let cell = Target::redis_cell(redis.addr, 1, limit()).await.unwrap();
    assert_eq!(
        redis_counts(&cell).await,
        floodgate,
        "redis+cell against floodgate"
    );
}

/// A 3-key request whose first key is spent, then single requests on one of the other keys
/// until it denies: returns whether the group passed and how many singles passed after it.
async fn group_then_singles(target: &Target) -> (bool, u64) {
    let check = |keys: &[&str]| {
        let keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
        async move { target.check(&keys).await.unwrap() == Outcome::Allowed }
    };
    for _ in 0..5 {
        assert!(check(&["group:spent"]).await, "{target:?}");
    }
    let group = check(&["group:spent", "group:a", "group:b"]).await;
    let mut singles = 0;
    while singles < 10 && check(&["group:a"]).await {
        singles += 1;
    }
    (group, singles)
}

/// The one documented difference: floodgate and the Lua script decide a request's keys
/// all-or-nothing, while redis-cell has no multi-key form, so the benchmark sends one command
/// per key and a denied request still charges the keys that passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_redis_cell_charges_the_other_keys_of_a_denied_request() {
    let store = BucketStore::new(StoreConfig {
        max_keys: 64,
        shards: 4,
    })
    .unwrap();
    let now_ns = 1_000 * NANOS_PER_SEC;
    let checks = |keys: &[&str]| -> Vec<BucketCheck> {
        keys.iter()
            .map(|k| BucketCheck {
                key: BucketKey::new(b"agree", k.as_bytes()),
                limit: limit(),
                cost: 1,
                peek: false,
            })
            .collect()
    };
    let mut decisions = Vec::new();
    for _ in 0..5 {
        assert!(
            store
                .check_all(&checks(&["group:spent"]), now_ns, &mut decisions)
                .unwrap()
        );
    }
    let group = store
        .check_all(
            &checks(&["group:spent", "group:a", "group:b"]),
            now_ns,
            &mut decisions,
        )
        .unwrap();
    let mut singles = 0;
    while singles < 10
        && store
            .check_all(&checks(&["group:a"]), now_ns, &mut decisions)
            .unwrap()
    {
        singles += 1;
    }
    assert_eq!((group, singles), (false, 5), "floodgate's GCRA");

    let redis = match start_redis(None) {
        Ok(server) => server,
        Err(e) => {
            eprintln!("skipping the Redis baselines: {e:#}");
            return;
        }
    };
    let lua = Target::redis(redis.addr, 1, limit()).await.unwrap();
    assert_eq!(group_then_singles(&lua).await, (false, 5), "redis+lua");

    let module = match redis_cell_module() {
        Ok(module) => module,
        Err(reason) => {
            eprintln!("skipping the redis+cell baseline: {reason}");
            return;
        }
    };
    let redis = start_redis(Some(&module)).unwrap();
    let cell = Target::redis_cell(redis.addr, 1, limit()).await.unwrap();
    assert_eq!(group_then_singles(&cell).await, (false, 4), "redis+cell");
}

#[test]
fn the_trace_has_keys_on_both_sides_of_the_burst() {
    let arrivals = arrivals();
    assert_eq!(arrivals.len(), 2 + 5 + 6 + 11);
    // Interleaved, not key by key: the first round touches every key once.
    assert_eq!(&arrivals[..4], TRACE.map(|(key, _)| key));
}
