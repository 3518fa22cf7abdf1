//! The hostile gateway's flood: a `floodgate-node` process started with a small
//! `--max-store-bytes`, filled through the public client with the most expensive limits a
//! caller may choose, every algorithm and both kinds of lease, over many keys; the node's
//! resident memory read from `/proc` throughout.
//!
//! Shared by the example (full scale) and the node's test suite (small scale).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use floodgate::{Algorithm, Limit, NANOS_PER_SEC};
use floodgate_client::{Acquire, Check, Client, ClientConfig, Source};
use tokio::task::JoinSet;

const DAY: u64 = 86_400 * NANOS_PER_SEC;
/// The longest period a node takes by default (`--max-limit-period`).
const MONTH: u64 = 31 * DAY;
/// Calls in flight at once: enough to keep a node busy, few enough for a shared machine.
const IN_FLIGHT: usize = 8;
/// Checks in one call (one all-or-nothing group of new keys: every one is allowed).
const PER_CALL: usize = 64;
/// Longest the node may take to say it serves.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How many keys of each kind the flood asks for.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// `--max-store-bytes` of the node.
    pub budget: usize,
    /// Sliding logs of 1,000 per month, each filled at once (cost 1,000).
    pub logs: usize,
    /// Fixed windows and sliding windows, this many of each in each round.
    pub windows: usize,
    /// GCRA buckets in each round.
    pub gcra: usize,
    /// Concurrency leases of 100,000 held for a day, one per key.
    pub leases: usize,
    /// Keys checked hot enough to be decided on token leases.
    pub hot_keys: usize,
}

impl Plan {
    /// A flood where each kind alone asks for about twice what the budget holds.
    pub fn overfilling(budget: usize) -> Plan {
        Plan {
            budget,
            // About 8 KiB each.
            logs: budget / 4_096,
            // About 100-200 bytes each.
            windows: budget / 96,
            // About 64 bytes each.
            gcra: budget / 32,
            // About 160 bytes each; their share is an eighth.
            leases: budget / 512,
            hot_keys: 256,
        }
    }
}

/// The node's memory as the kernel sees it, in bytes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Memory {
    pub rss: usize,
    /// The highest resident size the process ever had.
    pub hwm: usize,
}

/// Reads `VmRSS` and `VmHWM` from `/proc/PID/status`.
pub fn memory_of(pid: u32) -> std::io::Result<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<usize>()
                    .ok()
            })
            .map(|kib| kib * 1024)
            .ok_or_else(|| std::io::Error::other(format!("no {name} in /proc/{pid}/status")))
    };
    Ok(Memory {
        rss: field("VmRSS:")?,
        hwm: field("VmHWM:")?,
    })
}

/// A `floodgate-node` process on 127.0.0.1, killed when dropped.
pub struct NodeProcess {
    child: Child,
    pub addr: SocketAddr,
    pub ca: PathBuf,
    pub log: Arc<std::sync::Mutex<String>>,
    _dir: tempfile::TempDir,
}

impl NodeProcess {
    /// Starts `binary` with `--max-store-bytes budget` and waits until it serves.
    pub fn start(binary: &Path, budget: usize) -> Result<NodeProcess, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?;
        let mut child = Command::new(binary)
            .args(["--listen", "127.0.0.1:0", "--admin", "off", "--data-dir"])
            .arg(dir.path().join("data"))
            .arg("--max-store-bytes")
            .arg(budget.to_string())
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{}: {e}", binary.display()))?;
        let stderr = child.stderr.take().expect("stderr is piped");
        let log = Arc::new(std::sync::Mutex::new(String::new()));
        let (serving, serving_rx) = mpsc::channel();
        let collected = log.clone();
        // Drains stderr for the process's life (a full pipe would block the node).
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.split("serving on ").nth(1) {
                    let mut words = rest.split_whitespace();
                    let addr = words.next().and_then(|a| a.parse::<SocketAddr>().ok());
                    let ca = rest.split("CA for clients: ").nth(1);
                    if let (Some(addr), Some(ca)) = (addr, ca) {
                        let _ = serving.send((addr, PathBuf::from(ca.trim_end_matches(')'))));
                    }
                }
                let mut log = collected.lock().unwrap_or_else(|e| e.into_inner());
                // Bounded: the last lines are the ones that explain a failure.
                if log.len() > 64 * 1024 {
                    log.clear();
                }
                log.push_str(&line);
                log.push('\n');
            }
        });
        match serving_rx.recv_timeout(START_TIMEOUT) {
            Ok((addr, ca)) => Ok(NodeProcess {
                child,
                addr,
                ca,
                log,
                _dir: dir,
            }),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(format!(
                    "the node did not start: {}",
                    log.lock().unwrap_or_else(|e| e.into_inner())
                ))
            }
        }
    }

    pub fn memory(&self) -> std::io::Result<Memory> {
        memory_of(self.child.id())
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What one kind of flood got.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub name: String,
    pub keys: usize,
    /// Allowed by the node.
    pub decided: usize,
    /// Denied by the node, decided elsewhere (a fallback), or failed.
    pub not_decided: usize,
    /// The first reason something was not decided.
    pub first_failure: Option<String>,
    pub took: Duration,
}

/// Everything the flood saw.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub before: Memory,
    pub after: Memory,
    pub outcomes: Vec<Outcome>,
    /// What the witness's checks answered (remaining, `None`: not decided by the node): one
    /// before the flood and one after each kind, as a live caller's key is checked.
    pub witness: Vec<Option<u64>>,
    /// A key first checked after the flood: allowed by the node.
    pub new_key_decided: bool,
    /// What the client's token leases did (hot keys decided at the gateway).
    pub token_leases: Option<floodgate_client::TokenLeaseStats>,
}

fn failure(outcome: &mut Outcome, why: String) {
    outcome.not_decided += 1;
    outcome.first_failure.get_or_insert(why);
}

/// Checks keys `name:0..keys` under `limit` at `cost`, in calls of [`PER_CALL`].
async fn flood_checks(
    client: &Client,
    name: String,
    limit: Limit,
    cost: u64,
    keys: usize,
) -> Outcome {
    let started = Instant::now();
    let mut calls = JoinSet::new();
    let mut next = 0;
    let mut outcome = Outcome {
        keys,
        ..Outcome::default()
    };
    while next < keys || !calls.is_empty() {
        while next < keys && calls.len() < IN_FLIGHT {
            let end = (next + PER_CALL).min(keys);
            let checks: Vec<Check> = (next..end)
                .map(|i| Check::new(format!("{name}:{i}"), limit).cost(cost))
                .collect();
            let client = client.clone();
            calls.spawn(async move { (checks.len(), client.check(&checks).await) });
            next = end;
        }
        let Some(joined) = calls.join_next().await else {
            break;
        };
        match joined {
            Ok((_, Ok(verdicts))) => {
                for verdict in verdicts {
                    if verdict.source == Source::Node && verdict.is_allowed() {
                        outcome.decided += 1;
                    } else {
                        failure(&mut outcome, format!("{verdict:?}"));
                    }
                }
            }
            Ok((n, Err(e))) => {
                for _ in 0..n {
                    failure(&mut outcome, e.to_string());
                }
            }
            Err(e) => failure(&mut outcome, e.to_string()),
        }
    }
    outcome.name = name;
    outcome.took = started.elapsed();
    outcome
}

/// Acquires one concurrency lease on each of `seat:0..keys`, held for a day.
async fn flood_leases(client: &Client, keys: usize) -> Outcome {
    let started = Instant::now();
    let mut outcome = Outcome {
        name: "concurrency leases".to_owned(),
        keys,
        ..Outcome::default()
    };
    let mut calls = JoinSet::new();
    let mut next = 0;
    while next < keys || !calls.is_empty() {
        while next < keys && calls.len() < IN_FLIGHT * 4 {
            let client = client.clone();
            let key = format!("seat:{next}");
            calls.spawn(async move {
                client
                    .acquire(key, 100_000, Duration::from_secs(86_400))
                    .await
            });
            next += 1;
        }
        let Some(joined) = calls.join_next().await else {
            break;
        };
        match joined {
            Ok(Ok(Acquire::Granted(_))) => outcome.decided += 1,
            Ok(Ok(refused)) => failure(&mut outcome, format!("{refused:?}")),
            Ok(Err(e)) => failure(&mut outcome, e.to_string()),
            Err(e) => failure(&mut outcome, e.to_string()),
        }
    }
    outcome.took = started.elapsed();
    outcome
}

/// Checks each of `hot:0..keys` often enough, one check per call, that the client leases its
/// tokens from the node and decides it itself.
async fn flood_hot_keys(client: &Client, keys: usize) -> Outcome {
    let started = Instant::now();
    let limit = Limit::gcra(1_000_000_000, MONTH, 1_000_000_000).expect("a valid limit");
    let mut outcome = Outcome {
        name: "token leases (hot keys)".to_owned(),
        keys,
        ..Outcome::default()
    };
    for i in 0..keys {
        let check = [Check::new(format!("hot:{i}"), limit).lease_above(1)];
        let mut allowed = 0;
        for _ in 0..16 {
            match client.check(&check).await {
                Ok(v) if v[0].is_allowed() => allowed += 1,
                Ok(v) => failure(&mut outcome, format!("{:?}", v[0])),
                Err(e) => failure(&mut outcome, e.to_string()),
            }
        }
        // A key counts as decided when all of its checks were.
        outcome.decided += usize::from(allowed == 16);
    }
    outcome.took = started.elapsed();
    outcome
}

/// Runs the whole flood against `node` with `plan`.
pub async fn run(node: &NodeProcess, plan: &Plan) -> Result<Report, String> {
    let mut config = ClientConfig::with_ca_file(&node.ca);
    config.token_leases.enabled = true;
    config.token_leases.max_keys = plan.hot_keys.max(1);
    // Calls on a loaded shared machine: the verdicts must come from the node, not a timeout.
    config.timeout = Duration::from_secs(10);
    let client = Client::connect(&[node.addr], config)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    // A live caller's key, checked before the flood and after each kind; slow enough to
    // refill nothing while the flood runs: a reset would show.
    let witness = [Check::new(
        "witness",
        Limit::gcra(20, DAY, 20).expect("valid"),
    )];
    let check_witness = || async {
        match client.check(&witness).await {
            Ok(v) if v[0].source == Source::Node => Some(v[0].decision.remaining()),
            _ => None,
        }
    };
    let mut witnessed = vec![check_witness().await];
    let before = node.memory().map_err(|e| e.to_string())?;
    // Each kind fills the budget and the next evicts it: the tables of the kinds gone must
    // not keep their room. Twice: limits of a billion a month taken one at a time, then every
    // bucket emptied at once for a month (held, and denying, as long as the node allows).
    let mut outcomes = Vec::new();
    for (round, burst, cost) in [("", 1_000_000_000, 1), ("emptied ", 1_000, 1_000)] {
        let limit = |algorithm| Limit::new(algorithm, burst, MONTH, burst).expect("valid");
        for (name, algorithm, keys) in [
            ("gcra", Algorithm::Gcra, plan.gcra),
            ("fixed", Algorithm::FixedWindow, plan.windows),
            ("sliding", Algorithm::SlidingWindow, plan.windows),
        ] {
            let name = format!("{round}{name}");
            outcomes.push(flood_checks(&client, name, limit(algorithm), cost, keys).await);
            witnessed.push(check_witness().await);
        }
    }
    let log = Limit::new(Algorithm::SlidingLog, 1_000, MONTH, 1_000).expect("valid");
    outcomes.push(flood_checks(&client, "log".to_owned(), log, 1_000, plan.logs).await);
    witnessed.push(check_witness().await);
    outcomes.push(flood_leases(&client, plan.leases).await);
    witnessed.push(check_witness().await);
    outcomes.push(flood_hot_keys(&client, plan.hot_keys).await);
    witnessed.push(check_witness().await);
    let token_leases = client.token_lease_stats();
    let fresh = [Check::new(
        "after-the-flood",
        Limit::gcra(10, DAY, 10).expect("valid"),
    )];
    let new_key_decided = matches!(
        client.check(&fresh).await,
        Ok(v) if v[0].source == Source::Node && v[0].is_allowed()
    );
    let after = node.memory().map_err(|e| e.to_string())?;
    client.close().await;
    Ok(Report {
        before,
        after,
        outcomes,
        witness: witnessed,
        new_key_decided,
        token_leases,
    })
}

/// How far the node's resident memory may grow past what it was before the flood (one client
/// connected, no keys) besides the store budget: a quarter of it (the lists of changed keys
/// take up to about a ninth, the rest is tables' slack and the allocator's) and 1 MiB
/// (measured: see docs/OPERATIONS.md, sizing).
pub fn overhead_bytes(budget: usize) -> usize {
    budget / 4 + (1 << 20)
}

/// What the flood must show; one line per thing that did not hold.
pub fn judge(plan: &Plan, report: &Report) -> Vec<String> {
    let mut failures = Vec::new();
    let overhead = overhead_bytes(plan.budget);
    let most = report.before.rss + plan.budget + overhead;
    if report.after.hwm > most {
        failures.push(format!(
            "the node's resident memory reached {} bytes, past {most} (before the flood {} + \
             budget {} + overhead {overhead})",
            report.after.hwm, report.before.rss, plan.budget
        ));
    }
    // Each check of the witness takes one of its 20: a reset (eviction) would show.
    let expected: Vec<Option<u64>> = (0..report.witness.len() as u64)
        .map(|i| Some(19 - i))
        .collect();
    if report.witness != expected {
        failures.push(format!(
            "the witness key was not decided as before: remaining {:?}, {expected:?} expected",
            report.witness
        ));
    }
    if report.token_leases.is_none_or(|s| s.granted == 0) {
        failures.push("no token was leased: the hot keys never reached the node's leases".into());
    }
    if !report.new_key_decided {
        failures.push("a new key after the flood was not decided".to_owned());
    }
    for o in &report.outcomes {
        // Concurrency leases past their share are refused, not evicted; every check is decided.
        if o.name != "concurrency leases" && o.not_decided > 0 {
            failures.push(format!(
                "{}: {} of {} not decided ({})",
                o.name,
                o.not_decided,
                o.keys,
                o.first_failure.as_deref().unwrap_or("")
            ));
        }
    }
    failures
}
