//! One run's moving parts, and what happens at each instant, in this order: restarts due,
//! messages delivered, arrivals decided, messages sent.

use super::network::{InTransit, Network};
use super::traffic::Traffic;
use super::{Admission, Ledger, Region, SimConfig, SimFailure, Trace, ms, sim_store};
use crate::BucketKey;
use crate::region::{Exchange, Outgoing, Peer, RegionName};
use crate::simulation::SplitMix64;

/// Everything a run changes as it goes.
pub(super) struct Sim<'a> {
    pub config: &'a SimConfig,
    pub trace: Trace,
    rng: SplitMix64,
    pub peers: Vec<Peer>,
    pub regions: Vec<Region>,
    pub network: Network,
    traffic: Traffic,
    pub key: BucketKey,
    pub admissions: Vec<Admission>,
    pub asked: u64,
    /// Before the partition: each arrival's time and cost (for the liveness check).
    pub asked_before_cut: Vec<(u64, u64)>,
    cut_at: u64,
    pub ledger: Ledger,
    next_restart: usize,
    pub restarts_past_window: u64,
    pub now: u64,
}

impl Trace {
    /// The failure `what`, with the seed and the last events.
    pub(super) fn failure(&self, config: &SimConfig, what: String) -> SimFailure {
        SimFailure {
            seed: config.seed,
            algorithm: config.limit.algorithm(),
            what,
            trace: self.events.iter().cloned().collect(),
        }
    }
}

impl<'a> Sim<'a> {
    pub(super) fn new(config: &'a SimConfig) -> Self {
        let trace = Trace::default();
        let mut rng = SplitMix64::new(config.seed);
        let peers: Vec<Peer> = (0..config.regions)
            .map(|i| {
                let region = RegionName::new(&format!("r{i}"))
                    .unwrap_or_else(|_| unreachable!("r0, r1, ... are valid region names"));
                Peer::new(region, &format!("node-{i}"))
            })
            .collect();
        let regions: Vec<Region> = peers
            .iter()
            .map(|me| Region {
                store: sim_store(),
                exchange: Exchange::new(config.exchange, me.clone(), 1),
                others: peers.iter().filter(|p| *p != me).cloned().collect(),
                admitted: 0,
            })
            .collect();
        let network = Network::new(config.network);
        let traffic = Traffic::new(config.traffic, config.regions, config.traffic_ns, &mut rng);
        Sim {
            config,
            trace,
            rng,
            peers,
            regions,
            network,
            traffic,
            key: BucketKey::for_key(b"sim\x1fglobal"),
            admissions: Vec::new(),
            asked: 0,
            asked_before_cut: Vec::new(),
            cut_at: config.bounds().partition_start_ns.min(config.traffic_ns),
            ledger: Ledger {
                sessions: vec![1; config.regions],
                restarts_of: vec![0; config.regions],
                ..Ledger::default()
            },
            next_restart: 0,
            restarts_past_window: 0,
            now: 0,
        }
    }

    /// When anything happens next: an arrival, a delivery, an exchange's timer or a restart.
    pub(super) fn next_event(&self) -> Option<u64> {
        [
            self.traffic.next_arrival(),
            self.network.next_arrival(),
            self.regions
                .iter()
                .filter_map(|r| r.exchange.poll_timeout())
                .min(),
            self.config.restarts.get(self.next_restart).map(|r| r.at_ns),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Every restart due: the node's exchange starts over in a new session, its store kept or
    /// lost.
    pub(super) fn restart_due(&mut self) {
        let config = self.config;
        let now = self.now;
        while let Some(restart) = config
            .restarts
            .get(self.next_restart)
            .filter(|r| r.at_ns <= now)
        {
            self.next_restart += 1;
            let i = restart.region;
            let regions = &mut self.regions;
            let window = regions[i].exchange.config().dedupe_window;
            if (0..config.regions)
                .any(|j| j != i && regions[j].exchange.sent_to(&self.peers[i]) > window)
            {
                self.restarts_past_window += 1;
            }
            self.ledger
                .restart(i, &regions[i].exchange, &self.peers, self.key, now);
            regions[i].exchange = Exchange::new(
                config.exchange,
                self.peers[i].clone(),
                self.ledger.sessions[i],
            );
            if !restart.keep_store {
                regions[i].store = sim_store();
            }
            let session = self.ledger.sessions[i];
            self.trace.push(|| {
                format!(
                    "{} r{i} restarts, session {session}, store {}",
                    ms(now),
                    if restart.keep_store { "kept" } else { "lost" }
                )
            });
        }
    }

    /// Every message due: deltas applied (never more than their sender admitted), acks handled.
    pub(super) fn deliver_due(&mut self) -> Result<(), SimFailure> {
        let now = self.now;
        while let Some(mut m) = self.network.receive(now) {
            if self.config.strip_resync {
                match &mut m.message {
                    Outgoing::Deltas(batch) => batch.settled_below = None,
                    Outgoing::Ack(ack) => ack.receiver_session = None,
                }
            }
            match &m.message {
                Outgoing::Deltas(batch) => self.apply_deltas(m.from, m.to, batch)?,
                Outgoing::Ack(ack) => {
                    self.regions[m.to].exchange.handle_ack(now, ack);
                    self.trace.push(|| {
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
        Ok(())
    }

    fn apply_deltas(
        &mut self,
        from: usize,
        to: usize,
        batch: &crate::region::DeltaBatch,
    ) -> Result<(), SimFailure> {
        let now = self.now;
        let config = self.config;
        let region = &mut self.regions[to];
        let before = region.exchange.applied_from(&self.peers[from]);
        region.exchange.handle_deltas(now, batch, &region.store);
        let units = region.exchange.applied_from(&self.peers[from]) - before;
        if units > 0 {
            self.ledger
                .applied(to, from, batch, units)
                .map_err(|what| self.trace.failure(config, what))?;
        }
        self.trace.push(|| {
            let units: u64 = batch.deltas.iter().map(|d| d.units).sum();
            format!(
                "{} r{to} <- r{from}: deltas seq {} ({units} units)",
                ms(now),
                batch.seq
            )
        });
        let applied = self.regions[to].exchange.applied_from(&self.peers[from]);
        let admitted = self.regions[from].admitted;
        if applied > admitted {
            return Err(self.trace.failure(
                config,
                format!(
                    "r{to} applied {applied} units from r{from}, which admitted only {admitted}"
                ),
            ));
        }
        Ok(())
    }

    /// Every arrival due, decided by its region's exchange; the admitted ones recorded.
    pub(super) fn admit_due(&mut self) -> Result<(), SimFailure> {
        let now = self.now;
        let config = self.config;
        while let Some(arrival) = self.traffic.take_due(now) {
            self.asked += arrival.cost;
            if now < self.cut_at {
                self.asked_before_cut.push((now, arrival.cost));
            }
            let region = &mut self.regions[arrival.region];
            let decision = region
                .exchange
                .check_global(
                    now,
                    &region.store,
                    self.key,
                    &config.limit,
                    arrival.cost,
                    &region.others,
                )
                .map_err(|e| self.trace.failure(config, format!("store error: {e}")))?;
            if decision.is_allowed() {
                region.admitted += arrival.cost;
                *self
                    .ledger
                    .admitted
                    .entry((arrival.region, self.ledger.sessions[arrival.region]))
                    .or_insert(0) += arrival.cost;
                self.admissions.push(Admission {
                    at_ns: now,
                    region: arrival.region,
                    cost: arrival.cost,
                });
                self.trace
                    .push(|| format!("{} r{} admits {}", ms(now), arrival.region, arrival.cost));
            }
        }
        Ok(())
    }

    /// Everything each exchange has to send, handed to the network.
    pub(super) fn send_due(&mut self) {
        let now = self.now;
        for (from, region) in self.regions.iter_mut().enumerate() {
            while let Some(transmit) = region.exchange.poll_transmit(now) {
                let Some(to) = self.peers.iter().position(|p| *p == transmit.to) else {
                    continue;
                };
                let what = match &transmit.message {
                    Outgoing::Deltas(b) => format!("deltas seq {}", b.seq),
                    Outgoing::Ack(a) => format!("ack below {}", a.below),
                };
                let fate = self.network.send(
                    &mut self.rng,
                    now,
                    InTransit {
                        from,
                        to,
                        message: transmit.message,
                    },
                );
                self.trace
                    .push(|| format!("{} r{from} -> r{to}: {what} {fate:?}", ms(now)));
            }
        }
    }
}
