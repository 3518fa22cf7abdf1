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
//! Deterministic: every choice comes from one [`SplitMix64`] seeded by [`SimConfig::seed`], so a
//! failure names its seed and replays exactly (the tests read `FLOODGATE_SIM_SEED`). Drive one
//! run with [`run`]; it returns a [`SimReport`] or a [`SimFailure`] carrying the seed and the
//! last events.

mod network;
mod oracle;
mod traffic;

use std::collections::VecDeque;
use std::fmt;

pub use self::network::{NetworkConfig, Partition};
pub use self::oracle::{Admission, Bounds, Violation, Worst, judge};
pub use self::traffic::TrafficConfig;

use self::network::{InTransit, Network};
use self::traffic::Traffic;
use super::admission::over_admission_bound;
use super::config::ExchangeConfig;
use super::delta::{Outgoing, Peer};
use super::exchange::Exchange;
use super::scope::RegionName;
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
        }
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
    let algorithm = config.limit.algorithm();
    let fail = |what: String, trace: &Trace| SimFailure {
        seed: config.seed,
        algorithm,
        what,
        trace: trace.events.iter().cloned().collect(),
    };
    let mut trace = Trace::default();
    let mut rng = SplitMix64::new(config.seed);
    let peers: Vec<Peer> = (0..config.regions)
        .map(|i| {
            let region = RegionName::new(&format!("r{i}"))
                .unwrap_or_else(|_| unreachable!("r0, r1, ... are valid region names"));
            Peer::new(region, &format!("node-{i}"))
        })
        .collect();
    let mut regions: Vec<Region> = peers
        .iter()
        .map(|me| Region {
            store: BucketStore::new(StoreConfig {
                max_keys: 1_024,
                shards: 4,
            })
            .unwrap_or_else(|_| unreachable!("a valid store size")),
            exchange: Exchange::new(config.exchange, me.clone(), 1),
            others: peers.iter().filter(|p| *p != me).cloned().collect(),
            admitted: 0,
        })
        .collect();
    let mut network = Network::new(config.network);
    let mut traffic = Traffic::new(config.traffic, config.regions, config.traffic_ns, &mut rng);
    let key = BucketKey::for_key(b"sim\x1fglobal");
    let mut admissions: Vec<Admission> = Vec::new();
    let mut asked = 0u64;
    let cut_at = config.bounds().partition_start_ns.min(config.traffic_ns);
    let mut asked_before_cut: Vec<(u64, u64)> = Vec::new();
    let end_ns = config.traffic_ns + config.drain_ns;
    let mut now = 0u64;
    let mut events = 0u64;
    loop {
        events += 1;
        if events > MAX_EVENTS {
            return Err(fail(format!("more than {MAX_EVENTS} events"), &trace));
        }
        let next = [
            traffic.next_arrival(),
            network.next_arrival(),
            regions
                .iter()
                .filter_map(|r| r.exchange.poll_timeout())
                .min(),
        ]
        .into_iter()
        .flatten()
        .min();
        let Some(next) = next else { break };
        if next > end_ns {
            break;
        }
        now = now.max(next);

        while let Some(m) = network.receive(now) {
            let to = &mut regions[m.to];
            match &m.message {
                Outgoing::Deltas(batch) => {
                    to.exchange.handle_deltas(now, batch, &to.store);
                    trace.push(|| {
                        let units: u64 = batch.deltas.iter().map(|d| d.units).sum();
                        format!(
                            "{} r{} <- r{}: deltas seq {} ({units} units)",
                            ms(now),
                            m.to,
                            m.from,
                            batch.seq
                        )
                    });
                    let applied = regions[m.to].exchange.applied_from(&peers[m.from]);
                    let admitted = regions[m.from].admitted;
                    if applied > admitted {
                        return Err(fail(
                            format!(
                                "r{} applied {applied} units from r{}, which admitted only {admitted}",
                                m.to, m.from
                            ),
                            &trace,
                        ));
                    }
                }
                Outgoing::Ack(ack) => {
                    to.exchange.handle_ack(now, ack);
                    trace.push(|| {
                        format!(
                            "{} r{} <- r{}: ack below {} also {:?}",
                            ms(now),
                            m.to,
                            m.from,
                            ack.below,
                            ack.also
                        )
                    });
                }
            }
        }

        while let Some(arrival) = traffic.take_due(now) {
            asked += arrival.cost;
            if now < cut_at {
                asked_before_cut.push((now, arrival.cost));
            }
            let region = &mut regions[arrival.region];
            let decision = region
                .exchange
                .check_global(
                    now,
                    &region.store,
                    key,
                    &config.limit,
                    arrival.cost,
                    &region.others,
                )
                .map_err(|e| fail(format!("store error: {e}"), &trace))?;
            if decision.is_allowed() {
                region.admitted += arrival.cost;
                admissions.push(Admission {
                    at_ns: now,
                    region: arrival.region,
                    cost: arrival.cost,
                });
                trace.push(|| format!("{} r{} admits {}", ms(now), arrival.region, arrival.cost));
            }
        }

        for (from, region) in regions.iter_mut().enumerate() {
            while let Some(transmit) = region.exchange.poll_transmit(now) {
                let Some(to) = peers.iter().position(|p| *p == transmit.to) else {
                    continue;
                };
                let what = match &transmit.message {
                    Outgoing::Deltas(b) => format!("deltas seq {}", b.seq),
                    Outgoing::Ack(a) => format!("ack below {}", a.below),
                };
                let fate = network.send(
                    &mut rng,
                    now,
                    InTransit {
                        from,
                        to,
                        message: transmit.message,
                    },
                );
                trace.push(|| format!("{} r{from} -> r{to}: {what} {fate:?}", ms(now)));
            }
        }
    }

    let bounds = config.bounds();
    let worst = judge(&config.limit, &admissions, &bounds).map_err(|v| {
        fail(
            format!(
                "over-admission of {:.2} units at {} exceeds the {} bound of {} ({} admitted)",
                v.over,
                ms(v.at_ns),
                v.regime,
                v.bound,
                admissions.len()
            ),
            &trace,
        )
    })?;
    let (admitted_before_cut, exact_before_cut) =
        check_liveness(config, &admissions, &asked_before_cut)
            .map_err(|what| fail(what, &trace))?;
    for (i, region) in regions.iter().enumerate() {
        if !region.exchange.is_idle() {
            return Err(fail(
                format!(
                    "r{i} still has unconfirmed deltas {} after the traffic stopped",
                    ms(config.drain_ns)
                ),
                &trace,
            ));
        }
        let stats = region.exchange.stats();
        if stats.units_lost_store_full > 0 {
            return Err(fail(
                format!(
                    "r{i} lost {} units to a full store",
                    stats.units_lost_store_full
                ),
                &trace,
            ));
        }
        for (j, sender) in regions.iter().enumerate() {
            let applied = region.exchange.applied_from(&peers[j]);
            if j != i && applied != sender.admitted {
                return Err(fail(
                    format!(
                        "r{i} applied {applied} units from r{j}, which admitted {}: not exactly once",
                        sender.admitted
                    ),
                    &trace,
                ));
            }
        }
    }
    let stats: Vec<_> = regions.iter().map(|r| r.exchange.stats()).collect();
    Ok(SimReport {
        seed: config.seed,
        algorithm,
        bounds,
        worst,
        admitted: admissions.iter().map(|a| a.cost).sum(),
        asked,
        messages: network.sent,
        lost: network.lost,
        duplicated: network.duplicated,
        retransmissions: stats.iter().map(|s| s.retransmissions).sum(),
        denied_by_share: stats.iter().map(|s| s.denied_by_share).sum(),
        admitted_before_cut,
        exact_before_cut,
        digest: trace.digest.value(),
    })
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
