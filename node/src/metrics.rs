//! The node's Prometheus metrics: names, handles registered once, and the process recorder.
//!
//! Handles are resolved at start so the hot path only does atomic adds; per-check counts are
//! accumulated per frame and added once.

use std::sync::OnceLock;
use std::time::Duration;

use floodgate::wire::ErrorCode;
use floodgate::{Algorithm, Decision};
use metrics::{Counter, Gauge, Histogram, counter, gauge, histogram};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::sync::watch;

/// Installs the process-wide recorder once and returns its handle (several in-process nodes, as
/// in tests, share it).
pub fn recorder() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(
                metrics_exporter_prometheus::Matcher::Full("floodgate_batch_checks".into()),
                &[
                    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0,
                ],
            )
            .and_then(|b| {
                b.set_buckets_for_metric(
                    metrics_exporter_prometheus::Matcher::Full("floodgate_frame_seconds".into()),
                    &[
                        1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3,
                    ],
                )
            })
            .and_then(|b| {
                // An RLS call includes gRPC decoding and possibly a forward to another node.
                b.set_buckets_for_metric(
                    metrics_exporter_prometheus::Matcher::Full(
                        "floodgate_rls_request_seconds".into(),
                    ),
                    &[
                        5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1,
                    ],
                )
            });
        // The buckets above are valid (non-empty), so the builder is Ok; fall back to a plain one.
        let builder = builder.unwrap_or_else(|_| PrometheusBuilder::new());
        match builder.install_recorder() {
            Ok(handle) => handle,
            // Another recorder is installed (an embedding program's): keep a private one.
            Err(_) => PrometheusBuilder::new().build_recorder().handle(),
        }
    })
}

/// How often the histogram samples recorded since the last scrape are folded into their
/// buckets. The recorder keeps every sample until a scrape or an upkeep: a node nobody scraped
/// (or one started with `--admin off`) kept two samples a frame for ever, and grew by about
/// 0.35 MB a second at 10,000 one-check requests a second (30 GB a day).
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Folds pending histogram samples into their buckets every [`UPKEEP_INTERVAL`], until
/// shutdown.
pub(crate) async fn upkeep_loop(shutdown: watch::Receiver<bool>) {
    run_every(UPKEEP_INTERVAL, shutdown, || recorder().run_upkeep()).await;
}

/// Runs `work` every `period` (the first time one period from now) until `shutdown` changes.
async fn run_every(period: Duration, mut shutdown: watch::Receiver<bool>, mut work: impl FnMut()) {
    let start = tokio::time::Instant::now() + period;
    let mut ticker = tokio::time::interval_at(start, period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => work(),
            _ = shutdown.changed() => return,
        }
    }
}

const OUTCOMES: [&str; 4] = ["allowed", "denied", "cost_exceeds_burst", "error"];

/// Handles of every metric the node writes.
#[derive(Debug)]
pub struct NodeMetrics {
    decisions: [[Counter; 4]; 4],
    /// Units of metered charges taken, and those forgiven past the most a bucket may owe.
    charged_units: Counter,
    forgiven_units: Counter,
    pub batch_checks: Histogram,
    pub frame_seconds: Histogram,
    pub live_buckets: Gauge,
    pub evicted: Counter,
    pub expired: Counter,
    pub refused_keys: Counter,
    /// Bytes the bucket store accounts now, and its budget.
    pub store_bytes: Gauge,
    pub store_max_bytes: Gauge,
    /// Evictions by what the bucket was: `new` (never consumed from again after it was made),
    /// `returning` (consumed from again, not denying), `denying`.
    pub evictions: [Counter; 3],
    /// All connections (clients and peers); peers alone below.
    pub connections: Gauge,
    pub peer_connections: Gauge,
    pub connections_refused: Counter,
    /// Bytes buffered from streams now (published by the sweeper), against the node's budget.
    pub buffered_bytes: Gauge,
    /// Streams closed and peer messages dropped because the buffer budget was full.
    pub over_buffer_budget: Counter,
    /// Streams reset because their caller took no answer within the write timeout.
    pub write_timeouts: Counter,
    frame_errors: Vec<(ErrorCode, Counter)>,
    /// Members by state: alive, suspect, dead, left.
    pub members: [Gauge; 4],
    pub table_epoch: Gauge,
    /// Seconds since the start of the last replication round that every successor acknowledged:
    /// how old their copies can be (grows while a successor is unreachable).
    pub replication_lag: Gauge,
    /// Handshakes with a seed or peer that failed (a certificate not from the peer CA, not
    /// naming the node id dialed, or ours refused).
    pub peer_handshake_failures: Counter,
    /// Id conflicts that would have made this node yield, ignored because nothing at the
    /// holder's address proved the id (a peer claiming what it cannot show).
    pub unproven_conflicts: Counter,
    /// The highest protocol version every member speaks, as gossip told this node (0: none).
    pub cluster_version: Gauge,
    /// The same over the members of this node's region: what stays in the region uses it.
    pub region_version: Gauge,
    /// Peers this node dialed that share no protocol version with it (callers refused for the
    /// same reason are counted by the TLS layer, `direction="inbound"`).
    pub outbound_version_mismatches: Counter,
    /// Checks sent on to their owner.
    pub forwarded: Counter,
    /// Forwarded checks the receiver answered `not_owner` (it had handed the slot off), each
    /// then placed again.
    pub forward_refused: Counter,
    /// Checks decided here as the slot's successor for a client that could not reach the owner.
    pub taken_over: Counter,
    /// Checks answered `try_again` (or `shutting_down` to an older caller) rather than decided
    /// by a second node: their slot's hand-off had not come, or their owner, held alive, did
    /// not answer a forward in time.
    pub try_again: Counter,
    /// Buckets sent to successors / received as replicas.
    pub replicated: Counter,
    pub received_replicas: Counter,
    /// Buckets handed to new owners / received in hand-offs.
    pub handed_off: Counter,
    pub received_handoff: Counter,
    /// `--state-dir`: snapshots written, writes that failed, snapshot files refused at start,
    /// the last written file's size and buckets, and how long since the file last matched the
    /// store (0 after a write or a check that found nothing new; grows while writes fail).
    pub snapshot_writes: Counter,
    pub snapshot_failures: Counter,
    pub snapshot_refused: Counter,
    pub snapshot_bytes: Gauge,
    pub snapshot_buckets: Gauge,
    pub snapshot_age: Gauge,
}

/// The handles the cluster writes (clones of the node's).
#[derive(Debug, Clone)]
pub struct ClusterMetrics {
    pub members: [Gauge; 4],
    pub table_epoch: Gauge,
    pub replication_lag: Gauge,
    pub peer_handshake_failures: Counter,
    pub unproven_conflicts: Counter,
    pub cluster_version: Gauge,
    pub region_version: Gauge,
    pub outbound_version_mismatches: Counter,
    pub replicated: Counter,
    pub handed_off: Counter,
}

impl NodeMetrics {
    /// The handles the cluster writes.
    pub fn cluster(&self) -> ClusterMetrics {
        ClusterMetrics {
            members: self.members.clone(),
            table_epoch: self.table_epoch.clone(),
            replication_lag: self.replication_lag.clone(),
            peer_handshake_failures: self.peer_handshake_failures.clone(),
            unproven_conflicts: self.unproven_conflicts.clone(),
            cluster_version: self.cluster_version.clone(),
            region_version: self.region_version.clone(),
            outbound_version_mismatches: self.outbound_version_mismatches.clone(),
            replicated: self.replicated.clone(),
            handed_off: self.handed_off.clone(),
        }
    }

    pub fn register() -> Self {
        recorder();
        let decisions = Algorithm::ALL.map(|a| {
            OUTCOMES.map(
                |o| counter!("floodgate_decisions_total", "algorithm" => a.name(), "outcome" => o),
            )
        });
        NodeMetrics {
            decisions,
            charged_units: counter!("floodgate_charged_units_total"),
            forgiven_units: counter!("floodgate_charge_forgiven_units_total"),
            batch_checks: histogram!("floodgate_batch_checks"),
            frame_seconds: histogram!("floodgate_frame_seconds"),
            live_buckets: gauge!("floodgate_live_buckets"),
            evicted: counter!("floodgate_evicted_buckets_total"),
            expired: counter!("floodgate_expired_buckets_total"),
            refused_keys: counter!("floodgate_refused_keys_total"),
            store_bytes: gauge!("floodgate_store_bytes"),
            store_max_bytes: gauge!("floodgate_store_max_bytes"),
            evictions: ["new", "returning", "denying"]
                .map(|reason| counter!("floodgate_store_evictions_total", "reason" => reason)),
            connections: gauge!("floodgate_connections"),
            peer_connections: gauge!("floodgate_peer_connections"),
            connections_refused: counter!("floodgate_connections_refused_total"),
            buffered_bytes: gauge!("floodgate_buffered_bytes"),
            over_buffer_budget: counter!("floodgate_buffer_budget_refusals_total"),
            write_timeouts: counter!("floodgate_write_timeouts_total"),
            members: ["alive", "suspect", "dead", "left"]
                .map(|s| gauge!("floodgate_members", "state" => s)),
            table_epoch: gauge!("floodgate_slot_table_epoch"),
            replication_lag: gauge!("floodgate_replication_lag_seconds"),
            peer_handshake_failures: counter!("floodgate_peer_handshake_failures_total"),
            unproven_conflicts: counter!("floodgate_unproven_id_conflicts_total"),
            cluster_version: gauge!("floodgate_cluster_protocol_version"),
            region_version: gauge!("floodgate_region_protocol_version"),
            outbound_version_mismatches: counter!("floodgate_protocol_mismatches_total", "direction" => "outbound"),
            forwarded: counter!("floodgate_forwarded_checks_total"),
            forward_refused: counter!("floodgate_forward_refused_checks_total"),
            taken_over: counter!("floodgate_takeover_checks_total"),
            try_again: counter!("floodgate_try_again_checks_total"),
            replicated: counter!("floodgate_replicated_buckets_total", "direction" => "sent"),
            received_replicas: counter!("floodgate_replicated_buckets_total", "direction" => "received"),
            handed_off: counter!("floodgate_handoff_buckets_total", "direction" => "sent"),
            received_handoff: counter!("floodgate_handoff_buckets_total", "direction" => "received"),
            snapshot_writes: counter!("floodgate_snapshot_writes_total"),
            snapshot_failures: counter!("floodgate_snapshot_failures_total"),
            snapshot_refused: counter!("floodgate_snapshot_refused_total"),
            snapshot_bytes: gauge!("floodgate_snapshot_bytes"),
            snapshot_buckets: gauge!("floodgate_snapshot_buckets"),
            snapshot_age: gauge!("floodgate_snapshot_age_seconds"),
            frame_errors: ErrorCode::ALL
                .iter()
                .map(|&c| {
                    (
                        c,
                        counter!("floodgate_frame_errors_total", "code" => c.name()),
                    )
                })
                .collect(),
        }
    }

    pub fn frame_error(&self, code: ErrorCode) {
        if let Some((_, counter)) = self.frame_errors.iter().find(|(c, _)| *c == code) {
            counter.increment(1);
        }
    }

    pub fn add_decisions(&self, tally: &DecisionTally) {
        for (a, row) in tally.counts.iter().enumerate() {
            for (o, &n) in row.iter().enumerate() {
                if n > 0 {
                    self.decisions[a][o].increment(n);
                }
            }
        }
        if tally.charged > 0 {
            self.charged_units.increment(tally.charged);
        }
        if tally.forgiven > 0 {
            self.forgiven_units.increment(tally.forgiven);
        }
    }
}

/// Decisions of one frame, counted locally before one add per (algorithm, outcome).
#[derive(Debug, Default)]
pub struct DecisionTally {
    counts: [[u64; 4]; 4],
    charged: u64,
    forgiven: u64,
}

impl DecisionTally {
    pub fn record(&mut self, algorithm: Algorithm, decision: Result<&Decision, ErrorCode>) {
        let outcome = match decision {
            Ok(Decision::Allowed { .. }) => 0,
            Ok(Decision::Denied { .. }) => 1,
            Ok(Decision::CostExceedsBurst { .. }) => 2,
            Err(_) => 3,
        };
        self.counts[algorithm as usize][outcome] += 1;
    }

    /// A metered charge of `cost` units, of which `forgiven` were past what its bucket may owe.
    pub fn record_charge(&mut self, cost: u64, forgiven: u64) {
        self.charged = self.charged.saturating_add(cost - forgiven.min(cost));
        self.forgiven = self.forgiven.saturating_add(forgiven);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Upkeep comes once per period, not at once, and stops with the node.
    #[tokio::test(start_paused = true)]
    async fn upkeep_runs_once_a_period_until_shutdown() {
        let (stop, shutdown) = watch::channel(false);
        let runs = Arc::new(AtomicUsize::new(0));
        let period = Duration::from_secs(5);
        let task = tokio::spawn(run_every(period, shutdown, {
            let runs = runs.clone();
            move || {
                runs.fetch_add(1, Ordering::Relaxed);
            }
        }));
        tokio::time::sleep(period - Duration::from_millis(1)).await;
        assert_eq!(
            runs.load(Ordering::Relaxed),
            0,
            "not before a period has passed"
        );
        tokio::time::sleep(period * 2).await;
        assert_eq!(runs.load(Ordering::Relaxed), 2);
        stop.send_replace(true);
        task.await.unwrap();
        tokio::time::sleep(period * 2).await;
        assert_eq!(runs.load(Ordering::Relaxed), 2, "stopped with the node");
    }
}
