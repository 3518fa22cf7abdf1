//! A seeded simulation of the delta exchange: three regions (one owner each, with its own
//! [`BucketStore`] and [`Exchange`]) checking one global key while traffic arrives everywhere,
//! over a network that delays (20-150 ms), loses, duplicates and so reorders messages, and cuts
//! one region off for a while before healing. It asserts, for the key's algorithm:
//!
//! - the documented bound on over-admission (`super::admission`) in every window: the normal
//!   bound outside the partition, the partition bound in windows overlapping it or its settling;
//! - liveness: before the partition, the regions together admit at least 40% of what one
//!   exact limiter would admit of the same requests (the admission rule costs throughput, it
//!   must not starve a key);
//! - exactly-once and convergence: after the traffic stops and the network drains, every
//!   region has confirmed all it admitted, and each region applied from each other region
//!   exactly the units that region admitted (never more, at any time).
//!
//! With restarts ([`SimConfig::with_restarts`]): a node starts again with a new session and no
//! exchange state, its bucket store kept (a snapshot) or lost, as the seed chooses, while the
//! others keep their sessions past the (small) sequence window. Then exactly-once is judged per
//! sender session: no unit it had confirmed is missing at a destination, no incarnation of a
//! destination applies one message twice, and the messages applied again by a restarted
//! destination (applied before it restarted, not yet acknowledged) stay within `max_in_flight`
//! per restart. [`SimConfig::strip_resync`] is the control: messages lose their settled point
//! and receiver session on the way (as version 2's layout), and the checker must catch it.
//!
//! [`run_moves`] is a second, smaller simulation: deltas while a key's slot moves between the
//! two nodes of one region (see its module). [`run_handover`] is a third: the admission rule
//! while the slot moves, its unconfirmed units handed over with it.
//!
//! Deterministic: every choice comes from one [`SplitMix64`] seeded by [`SimConfig::seed`], so a
//! failure names its seed and replays exactly (the tests read `FLOODGATE_SIM_SEED`). Drive one
//! run with [`run`]; it returns a [`SimReport`] or a [`SimFailure`] carrying the seed and the
//! last events.

mod engine;
mod handover;
mod moves;
mod network;
mod oracle;
mod traffic;

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;

pub use self::handover::{HandoverConfig, HandoverReport, run_handover};
pub use self::moves::{MovesConfig, MovesReport, run_moves};
pub use self::network::{NetworkConfig, Partition};
pub use self::oracle::{Admission, Bounds, Violation, Worst, judge};
pub use self::traffic::TrafficConfig;

use self::engine::Sim;
use super::admission::over_admission_bound;
use super::config::ExchangeConfig;
use super::delta::Peer;
use super::exchange::Exchange;
use crate::simulation::{SplitMix64, TraceDigest};
use crate::{Algorithm, BucketKey, BucketStore, Limit, NANOS_PER_SEC, StoreConfig};

const MS: u64 = 1_000_000;

/// Events kept for a failure's trace.
const TRACE_EVENTS: usize = 40;

/// Most events one run may process: a bound on the loop whatever the configuration.
const MAX_EVENTS: u64 = 10_000_000;

/// Everything one run depends on.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    pub seed: u64,
    pub limit: Limit,
    pub regions: usize,
    /// Traffic arrives in `[0, traffic_ns)`; the run goes on for `drain_ns` more (long enough
    /// for the last message to get through a lossy network: 12 s is about ten rounds of the
    /// longest retransmission wait, each lost with about 10% chance).
    pub traffic_ns: u64,
    pub drain_ns: u64,
    pub traffic: TrafficConfig,
    pub network: NetworkConfig,
    pub exchange: ExchangeConfig,
    /// The regions the bound is computed for (normally `regions`; a test sets the exchange's
    /// own `regions` lower to show the judge catches a weaker admission rule).
    pub bound_regions: usize,
    /// Before the partition, the regions must admit at least this share (in percent) of what
    /// one exact limiter admits of the same requests.
    pub min_throughput_percent: u64,
    /// Node restarts, in time order (inside the partition's span, so the bound of that regime
    /// covers what a lost bucket or lost unconfirmed units let through).
    pub restarts: Vec<Restart>,
    /// Mutation control: messages lose their settled point and receiver session in transit.
    pub strip_resync: bool,
}

/// A node starting again at `at_ns`: a new session, no exchange state; its bucket store kept
/// (restored from a snapshot) or lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restart {
    pub at_ns: u64,
    pub region: usize,
    pub keep_store: bool,
}

impl SimConfig {
    /// The standard run for `seed` and `algorithm`: 3 regions, 100 units/s (GCRA: burst 50),
    /// 10 s of traffic and 12 s to drain, 5% loss, 3% duplicates, 20-150 ms delays, and one
    /// region cut off for 1.5-3 s starting between 2.5 and 3.5 s (which region, when and how
    /// long from the seed); the exchange as by default but for 1 s to call a region
    /// unreachable and a longest retransmission wait of 1 s.
    pub fn for_seed(seed: u64, algorithm: Algorithm) -> Self {
        let regions = 3;
        let limit = match algorithm {
            Algorithm::Gcra => Limit::gcra(100, NANOS_PER_SEC, 50),
            other => Limit::window(other, 100, NANOS_PER_SEC),
        }
        .unwrap_or_else(|_| unreachable!("the simulation's limits are valid"));
        let mut rng = SplitMix64::new(seed ^ 0x5eed_0fc0_de00);
        let start_ns = rng.range(2_500, 3_500) * MS;
        let partition = Partition {
            start_ns,
            end_ns: start_ns + rng.range(1_500, 3_000) * MS,
            isolated: rng.range(0, regions as u64 - 1) as usize,
        };
        SimConfig {
            seed,
            limit,
            regions,
            traffic_ns: 10 * NANOS_PER_SEC,
            drain_ns: 12 * NANOS_PER_SEC,
            traffic: TrafficConfig::default(),
            network: NetworkConfig {
                min_delay_ns: 20 * MS,
                max_delay_ns: 150 * MS,
                loss_per_million: 50_000,
                duplicate_per_million: 30_000,
                partition: Some(partition),
            },
            exchange: ExchangeConfig {
                unreachable_after_ns: NANOS_PER_SEC,
                max_retransmit_ns: NANOS_PER_SEC,
                ..ExchangeConfig::for_regions(regions)
            },
            bound_regions: regions,
            min_throughput_percent: 40,
            restarts: Vec::new(),
            strip_resync: false,
        }
    }

    /// The standard run with one or two node restarts during the partition's span (which
    /// region, when, and whether its store survives from the seed; at most one store lost), and
    /// a sequence window of 16 messages, so the other nodes are past it when one restarts.
    pub fn with_restarts(seed: u64, algorithm: Algorithm) -> Self {
        let mut config = SimConfig::for_seed(seed, algorithm);
        config.exchange.dedupe_window = config.exchange.max_in_flight as u64;
        let Some(partition) = config.network.partition else {
            return config;
        };
        let mut rng = SplitMix64::new(seed ^ 0x7e57_a27e_d000);
        let count = rng.range(1, 2);
        let mut lost = false;
        let mut restarts: Vec<Restart> = (0..count)
            .map(|_| {
                let keep_store = lost || rng.chance(500_000);
                lost |= !keep_store;
                Restart {
                    at_ns: rng.range(partition.start_ns, partition.end_ns - 1),
                    region: rng.range(0, config.regions as u64 - 1) as usize,
                    keep_store,
                }
            })
            .collect();
        restarts.sort_by_key(|r| r.at_ns);
        config.restarts = restarts;
        config
    }

    /// The bounds this run is judged by. Normal: `(R - 1) * max(share, largest cost)`.
    /// Partition (one region cut off, so one extra side): that plus one burst (window: one
    /// limit) plus, for GCRA, what the rate refills from the cut to settling. Settling after
    /// the heal: the longest retransmission wait, two sync intervals and a round trip, after
    /// which every region hears every other again.
    pub fn bounds(&self) -> Bounds {
        let share = (self.limit.burst() / self.bound_regions.max(1) as u64).max(1);
        let normal = over_admission_bound(self.bound_regions, share, self.traffic.max_cost);
        let (start_ns, settled_ns) = match self.network.partition {
            Some(p) => {
                let settle = self.exchange.max_retransmit_ns
                    + 2 * self.exchange.sync_interval_ns
                    + 2 * self.network.max_delay_ns;
                (p.start_ns, p.end_ns + settle)
            }
            None => (u64::MAX, u64::MAX),
        };
        let refill = match self.limit.algorithm() {
            Algorithm::Gcra => {
                let span = u128::from(settled_ns.saturating_sub(start_ns));
                let units =
                    span * u128::from(self.limit.rate()) / u128::from(self.limit.period_ns());
                u64::try_from(units).unwrap_or(u64::MAX)
            }
            _ => 0,
        };
        Bounds {
            normal,
            partition: normal
                .saturating_add(self.limit.burst())
                .saturating_add(refill),
            partition_start_ns: start_ns,
            settled_ns,
        }
    }
}

/// What one run saw.
#[derive(Debug, Clone, PartialEq)]
pub struct SimReport {
    pub seed: u64,
    pub algorithm: Algorithm,
    pub bounds: Bounds,
    pub worst: Worst,
    /// Units admitted by all regions, and units asked for.
    pub admitted: u64,
    pub asked: u64,
    pub messages: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub retransmissions: u64,
    pub denied_by_share: u64,
    /// Restarts at which some other node had sent the restarted one more messages than the
    /// sequence window holds.
    pub restarts_past_window: u64,
    /// Before the partition: units admitted, and what one exact limiter would have admitted
    /// of the same requests (the throughput the admission rule costs).
    pub admitted_before_cut: u64,
    pub exact_before_cut: u64,
    /// Every event of the run, in order, in one number (see [`TraceDigest`]).
    pub digest: u64,
}

/// A run that broke an assertion: its seed, what broke, and the last events before it.
#[derive(Debug, Clone, PartialEq)]
pub struct SimFailure {
    pub seed: u64,
    pub algorithm: Algorithm,
    pub what: String,
    pub trace: Vec<String>,
}

impl fmt::Display for SimFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "simulation seed {} ({}) failed: {}",
            self.seed, self.algorithm, self.what
        )?;
        writeln!(
            f,
            "replay it with FLOODGATE_SIM_SEED={} (last {} events):",
            self.seed,
            self.trace.len()
        )?;
        for line in &self.trace {
            writeln!(f, "  {line}")?;
        }
        Ok(())
    }
}

/// The run's memory of its last events.
#[derive(Debug, Default)]
struct Trace {
    events: VecDeque<String>,
    digest: TraceDigest,
}

impl Trace {
    fn push(&mut self, line: impl FnOnce() -> String) {
        if self.events.len() == TRACE_EVENTS {
            self.events.pop_front();
        }
        let line = line();
        self.digest.add(&line);
        self.events.push_back(line);
    }
}

fn ms(ns: u64) -> String {
    format!("{}.{:03}s", ns / NANOS_PER_SEC, ns % NANOS_PER_SEC / MS)
}

/// One region of the simulation: its owner's store and exchange.
struct Region {
    store: BucketStore,
    exchange: Exchange,
    others: Vec<Peer>,
    admitted: u64,
}

/// Runs the standard simulation of `seed` for every algorithm (what `floodgate-chaos sim
/// --seed S` is to run): every report, or the first failure.
pub fn run_seed(seed: u64) -> Result<Vec<SimReport>, SimFailure> {
    Algorithm::ALL
        .into_iter()
        .map(|algorithm| run(&SimConfig::for_seed(seed, algorithm)))
        .collect()
}

/// Runs one simulation.
pub fn run(config: &SimConfig) -> Result<SimReport, SimFailure> {
    let mut sim = Sim::new(config);
    let end_ns = config.traffic_ns + config.drain_ns;
    let mut events = 0u64;
    loop {
        events += 1;
        if events > MAX_EVENTS {
            let what = format!("more than {MAX_EVENTS} events");
            return Err(sim.trace.failure(config, what));
        }
        let Some(next) = sim.next_event() else { break };
        if next > end_ns {
            break;
        }
        sim.now = sim.now.max(next);
        sim.restart_due();
        sim.deliver_due()?;
        sim.admit_due()?;
        sim.send_due();
    }
    judge_run(sim)
}

/// After the run: the bound in every window, liveness before the cut, every region drained,
/// and every unit applied exactly once.
fn judge_run(sim: Sim<'_>) -> Result<SimReport, SimFailure> {
    let config = sim.config;
    let fail = |what: String| sim.trace.failure(config, what);
    let bounds = config.bounds();
    let admissions = &sim.admissions;
    let worst = judge(&config.limit, admissions, &bounds).map_err(|v| {
        fail(format!(
            "over-admission of {:.2} units at {} exceeds the {} bound of {} ({} admitted)",
            v.over,
            ms(v.at_ns),
            v.regime,
            v.bound,
            admissions.len()
        ))
    })?;
    let (admitted_before_cut, exact_before_cut) =
        check_liveness(config, admissions, &sim.asked_before_cut).map_err(fail)?;
    check_drained(config, &sim.regions, &sim.peers).map_err(fail)?;
    let max_in_flight = config.exchange.max_in_flight as u64;
    sim.ledger
        .judge(&sim.regions, &sim.peers, sim.key, max_in_flight)
        .map_err(fail)?;
    let stats: Vec<_> = sim.regions.iter().map(|r| r.exchange.stats()).collect();
    Ok(SimReport {
        seed: config.seed,
        algorithm: config.limit.algorithm(),
        bounds,
        worst,
        admitted: admissions.iter().map(|a| a.cost).sum(),
        asked: sim.asked,
        messages: sim.network.sent,
        lost: sim.network.lost,
        duplicated: sim.network.duplicated,
        retransmissions: stats.iter().map(|s| s.retransmissions).sum(),
        denied_by_share: stats.iter().map(|s| s.denied_by_share).sum(),
        restarts_past_window: sim.restarts_past_window,
        admitted_before_cut,
        exact_before_cut,
        digest: sim.trace.digest.value(),
    })
}

/// After the traffic stopped and the network drained: every region has confirmed all it
/// admitted, lost nothing to a full store and (without restarts) applied from each other region
/// exactly what that region admitted.
fn check_drained(config: &SimConfig, regions: &[Region], peers: &[Peer]) -> Result<(), String> {
    for (i, region) in regions.iter().enumerate() {
        if !region.exchange.is_idle() {
            return Err(format!(
                "r{i} still has unconfirmed deltas {} after the traffic stopped",
                ms(config.drain_ns)
            ));
        }
        let stats = region.exchange.stats();
        if stats.units_lost_store_full > 0 {
            return Err(format!(
                "r{i} lost {} units to a full store",
                stats.units_lost_store_full
            ));
        }
        for (j, sender) in regions.iter().enumerate() {
            let applied = region.exchange.applied_from(&peers[j]);
            if config.restarts.is_empty() && j != i && applied != sender.admitted {
                return Err(format!(
                    "r{i} applied {applied} units from r{j}, which admitted {}: not exactly once",
                    sender.admitted
                ));
            }
        }
    }
    Ok(())
}

fn sim_store() -> BucketStore {
    BucketStore::new(StoreConfig {
        max_keys: 1_024,
        shards: 4,
    })
    .unwrap_or_else(|_| unreachable!("a valid store size"))
}

/// Exactly-once across restarts, per sender session: what each session admitted and had
/// confirmed, and what each destination applied of it (in all its incarnations, and in the
/// current one).
#[derive(Debug, Default)]
struct Ledger {
    /// Each region's current session.
    sessions: Vec<u64>,
    restarts_of: Vec<u64>,
    /// (region, session) -> units admitted.
    admitted: HashMap<(usize, u64), u64>,
    /// (sender, session, destination) -> units confirmed, for sessions that ended.
    confirmed: HashMap<(usize, u64, usize), u64>,
    /// (destination, sender, session) -> units applied, in every incarnation / in this one.
    applied: HashMap<(usize, usize, u64), u64>,
    applied_now: HashMap<(usize, usize, u64), u64>,
    /// (destination, sender, session, seq) applied by the destination's current incarnation,
    /// and by how many incarnations in all.
    this_life: HashSet<(usize, usize, u64, u64)>,
    lives: HashMap<(usize, usize, u64, u64), u64>,
    /// (destination, sender, session) -> messages applied by more than one incarnation.
    reapplied: HashMap<(usize, usize, u64), u64>,
}

impl Ledger {
    /// Region `i` restarts: its session's confirmations are final, its next session begins,
    /// and its current incarnation's applications are forgotten.
    fn restart(&mut self, i: usize, old: &Exchange, peers: &[Peer], key: BucketKey, now: u64) {
        let session = self.sessions[i];
        let admitted = self.admitted.get(&(i, session)).copied().unwrap_or(0);
        for (j, peer) in peers.iter().enumerate().filter(|(j, _)| *j != i) {
            let confirmed = admitted.saturating_sub(old.unconfirmed(peer, key));
            self.confirmed.insert((i, session, j), confirmed);
        }
        self.sessions[i] = now.max(session + 1);
        self.restarts_of[i] += 1;
        self.applied_now.retain(|k, _| k.0 != i);
        self.this_life.retain(|k| k.0 != i);
    }

    /// `to` applied `units` of `batch` from `from`.
    fn applied(
        &mut self,
        to: usize,
        from: usize,
        batch: &super::delta::DeltaBatch,
        units: u64,
    ) -> Result<(), String> {
        let session = (to, from, batch.session);
        *self.applied.entry(session).or_insert(0) += units;
        let now = self.applied_now.entry(session).or_insert(0);
        *now += units;
        let admitted = self
            .admitted
            .get(&(from, batch.session))
            .copied()
            .unwrap_or(0);
        if *now > admitted {
            return Err(format!(
                "r{to} applied {now} units of r{from}'s session {}, which admitted only {admitted}",
                batch.session
            ));
        }
        let message = (to, from, batch.session, batch.seq);
        if !self.this_life.insert(message) {
            return Err(format!(
                "r{to} applied message {} of r{from}'s session {} twice",
                batch.seq, batch.session
            ));
        }
        let lives = self.lives.entry(message).or_insert(0);
        *lives += 1;
        if *lives > 1 {
            *self.reapplied.entry(session).or_insert(0) += 1;
        }
        Ok(())
    }

    /// After the run: no destination lacks a unit a sender session had confirmed, and what a
    /// restarted destination applied again stays within `max_in_flight` messages per restart.
    fn judge(
        &self,
        regions: &[Region],
        peers: &[Peer],
        key: BucketKey,
        max_in_flight: u64,
    ) -> Result<(), String> {
        for (&(from, session), &admitted) in &self.admitted {
            for to in (0..peers.len()).filter(|&to| to != from) {
                let confirmed = if session == self.sessions[from] {
                    admitted.saturating_sub(regions[from].exchange.unconfirmed(&peers[to], key))
                } else {
                    self.confirmed
                        .get(&(from, session, to))
                        .copied()
                        .unwrap_or(0)
                };
                let applied = self.applied.get(&(to, from, session)).copied().unwrap_or(0);
                if applied < confirmed {
                    return Err(format!(
                        "r{to} applied {applied} units of r{from}'s session {session}, which had {confirmed} of them confirmed: not exactly once"
                    ));
                }
                let again = self
                    .reapplied
                    .get(&(to, from, session))
                    .copied()
                    .unwrap_or(0);
                if again > max_in_flight * self.restarts_of[to] {
                    return Err(format!(
                        "r{to} applied {again} messages of r{from}'s session {session} again over {} restarts",
                        self.restarts_of[to]
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Before the partition, the regions together admit at least `min_throughput_percent` of what
/// one exact limiter would have admitted of the same requests (every region's arrivals merged,
/// decided by one bucket): the admission rule may cost throughput, not starve the key. Returns
/// both.
fn check_liveness(
    config: &SimConfig,
    admissions: &[Admission],
    asked: &[(u64, u64)],
) -> Result<(u64, u64), String> {
    let until = config.bounds().partition_start_ns.min(config.traffic_ns);
    let admitted: u64 = admissions
        .iter()
        .filter(|a| a.at_ns < until)
        .map(|a| a.cost)
        .sum();
    let exact = BucketStore::new(StoreConfig {
        max_keys: 16,
        shards: 1,
    })
    .map_err(|e| e.to_string())?;
    let key = BucketKey::for_key(b"exact");
    let mut ideal = 0;
    for &(at_ns, cost) in asked {
        if exact
            .check(key, &config.limit, cost, at_ns)
            .map_err(|e| e.to_string())?
            .is_allowed()
        {
            ideal += cost;
        }
    }
    if admitted * 100 < ideal * config.min_throughput_percent {
        return Err(format!(
            "only {admitted} units admitted before {}, where one exact limiter admits {ideal} of the same requests: the admission rule starves the key",
            ms(until)
        ));
    }
    Ok((admitted, ideal))
}
