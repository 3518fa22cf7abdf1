//! A seeded simulation of region deltas while ownership moves inside a region: region `a` has
//! two nodes between which one global key's slot moves again and again, region `b` one node
//! that admits the key's traffic and sends its units to the owner in `a` as its (lagging) view
//! of `a`'s ring names it. Each node of `a` also switches to a move a little late, as a node
//! does while gossip spreads, and waits briefly for the slot's hand-off after gaining it. The
//! network delays, loses and duplicates.
//!
//! Each node of `a` routes every delta it receives by its own view ([`Route`]): into its
//! bucket when it decides the key, held through a hand-off wait, passed on otherwise; after
//! each switch its held and passed-on units follow the key ([`Exchange::follow_ownership`]).
//! The checker asserts, at every step, that units land only in the bucket of a node that
//! decides the key by its own view (the bucket a table switch hands over), and at the end, the
//! network drained, that every unit `b` admitted landed in `a` exactly once: in a bucket, or
//! held for the key's next check. [`MovesConfig::route_everything_here`] is the control (every
//! delta applied where it arrives, as before routing), which the checker must catch.

use super::network::{Network, NetworkConfig, send_all};
use crate::region::{Exchange, ExchangeConfig, Outgoing, Peer, RegionName, Route};
use crate::simulation::SplitMix64;
use crate::{Algorithm, BucketKey, BucketStore, Limit, NANOS_PER_SEC, StoreConfig};

const MS: u64 = 1_000_000;
/// Nodes 0 and 1 are region `a`'s, node 2 is region `b`'s.
const NODES: usize = 3;
const B: usize = 2;

/// What one run depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MovesConfig {
    pub seed: u64,
    /// Traffic at `b` for this long, then the network drains for `drain_ns`.
    pub traffic_ns: u64,
    pub drain_ns: u64,
    /// The key's slot moves every this many ns (on average; uniform in half to one and a half).
    pub move_every_ns: u64,
    /// The control: every delta is applied by the node it reaches.
    pub route_everything_here: bool,
}

impl MovesConfig {
    pub fn from_seed(seed: u64) -> Self {
        MovesConfig {
            seed,
            traffic_ns: 10 * NANOS_PER_SEC,
            drain_ns: 20 * NANOS_PER_SEC,
            move_every_ns: 600 * MS,
            route_everything_here: false,
        }
    }
}

/// What a passing run saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MovesReport {
    pub moves: u64,
    pub admitted_units: u64,
    /// Units that landed in a bucket of region `a`, and those still held at the end.
    pub landed_units: u64,
    pub held_units: u64,
    /// Units region `a`'s nodes passed on to the other one.
    pub passed_on_units: u64,
    pub messages: u64,
}

/// A node of region `a`: its view of who decides the key, and until when it waits for the
/// hand-off of a slot it gained.
#[derive(Debug, Clone, Copy)]
struct View {
    owner: usize,
    handoff_until_ns: u64,
}

fn peer(index: usize) -> Peer {
    let (region, node) = match index {
        0 => ("a", "a1"),
        1 => ("a", "a2"),
        _ => ("b", "b1"),
    };
    Peer::new(
        RegionName::new(region).unwrap_or_else(|_| unreachable!("a valid region name")),
        node,
    )
}

fn index_of(peer: &Peer) -> Option<usize> {
    (0..NODES).find(|&i| self::peer(i) == *peer)
}

fn store() -> BucketStore {
    BucketStore::new(StoreConfig {
        max_keys: 16,
        shards: 1,
    })
    .unwrap_or_else(|_| unreachable!("a valid store configuration"))
}

/// Units consumed in `store`'s bucket of `key`: the limit is never reached and its window
/// outlasts the run, so this only grows.
fn consumed(store: &BucketStore, key: BucketKey, limit: &Limit, now_ns: u64) -> u64 {
    let left = store
        .check(key, limit, 0, now_ns)
        .map_or(0, |d| d.remaining());
    limit.burst() - left
}

/// Runs one simulation; `Err` names the seed and what failed.
pub fn run_moves(config: &MovesConfig) -> Result<MovesReport, String> {
    let mut world = World::new(config);
    let end_ns = config.traffic_ns + config.drain_ns;
    while world.now < end_ns {
        world.now += MS;
        world
            .step()
            .map_err(|e| format!("seed {}: {e}", config.seed))?;
    }
    world
        .settled()
        .map_err(|e| format!("seed {}: {e}", config.seed))
}

/// Everything one run holds: nodes 0 and 1 of region `a`, node 2 of `b`, the network, who
/// decides the key (the truth and each node's view), and what the checker has counted.
struct World<'c> {
    config: &'c MovesConfig,
    rng: SplitMix64,
    key: BucketKey,
    limit: Limit,
    exchanges: Vec<Exchange>,
    stores: Vec<BucketStore>,
    network: Network,
    owner: usize,
    views: [View; 2],
    b_view: usize,
    /// View changes on their way: (when, node of `a` or `B`, new owner).
    news: Vec<(u64, usize, usize)>,
    next_move_ns: u64,
    landed: [u64; 2],
    report: MovesReport,
    now: u64,
}

impl<'c> World<'c> {
    fn new(config: &'c MovesConfig) -> Self {
        let exchange_config = ExchangeConfig::for_regions(2);
        World {
            config,
            rng: SplitMix64::new(config.seed),
            key: BucketKey::for_key(b"moves\x1fglobal"),
            limit: Limit::window(Algorithm::FixedWindow, 1_000_000_000, 3_600 * NANOS_PER_SEC)
                .unwrap_or_else(|_| unreachable!("a valid limit")),
            exchanges: (0..NODES)
                .map(|i| Exchange::new(exchange_config, peer(i), 1))
                .collect(),
            stores: (0..NODES).map(|_| store()).collect(),
            network: Network::new(NetworkConfig {
                min_delay_ns: 5 * MS,
                max_delay_ns: 60 * MS,
                loss_per_million: 50_000,
                duplicate_per_million: 50_000,
                partition: None,
            }),
            owner: 0,
            views: [View {
                owner: 0,
                handoff_until_ns: 0,
            }; 2],
            b_view: 0,
            news: Vec::new(),
            next_move_ns: config.move_every_ns,
            landed: [0; 2],
            report: MovesReport::default(),
            now: 0,
        }
    }

    /// One millisecond: a move, the news of moves, traffic at `b`, held units taken in,
    /// deliveries and sends; then the running check that nothing landed twice.
    fn step(&mut self) -> Result<(), String> {
        self.move_slot();
        self.hear_news()?;
        self.admit_in_b()?;
        self.take_in_held()?;
        self.deliver()?;
        self.send_due()?;
        let total: u64 = self.landed.iter().sum();
        if total > self.report.admitted_units {
            return Err(format!(
                "region a took {total} units in, more than the {} b admitted",
                self.report.admitted_units
            ));
        }
        Ok(())
    }

    /// The slot moves: each node of `a` hears of it a little later, `b` later still.
    fn move_slot(&mut self) {
        let now = self.now;
        if now < self.next_move_ns || now >= self.config.traffic_ns {
            return;
        }
        self.owner = 1 - self.owner;
        self.report.moves += 1;
        for node in 0..2 {
            let at = now + self.rng.range(0, 50) * MS;
            self.news.push((at, node, self.owner));
        }
        let at = now + self.rng.range(0, 400) * MS;
        self.news.push((at, B, self.owner));
        let half = self.config.move_every_ns / 2;
        self.next_move_ns = now + self.rng.range(half, half + self.config.move_every_ns);
    }

    /// Views change as their news arrives; a node of `a` that switched lets held and passed-on
    /// units follow the key, and waits a little for a slot it gained.
    fn hear_news(&mut self) -> Result<(), String> {
        let now = self.now;
        let due: Vec<(u64, usize, usize)> =
            self.news.iter().copied().filter(|n| n.0 <= now).collect();
        self.news.retain(|n| n.0 > now);
        for (_, node, new_owner) in due {
            if node == B {
                self.b_view = new_owner;
                continue;
            }
            let gained = self.views[node].owner != node && new_owner == node;
            self.views[node].owner = new_owner;
            if gained {
                self.views[node].handoff_until_ns = now + self.rng.range(5, 30) * MS;
            }
            self.act(node, |exchange, store, route| {
                exchange.follow_ownership(now, store, route, &|_| true);
                Ok(())
            })?;
        }
        Ok(())
    }

    /// Traffic at `b`, to the owner its view names.
    fn admit_in_b(&mut self) -> Result<(), String> {
        if self.now >= self.config.traffic_ns || !self.rng.chance(300_000) {
            return Ok(());
        }
        let cost = self.rng.range(1, 3);
        let decision = self.exchanges[B]
            .check_global(
                self.now,
                &self.stores[B],
                self.key,
                &self.limit,
                cost,
                &[peer(self.b_view)],
            )
            .map_err(|e| format!("store error {e}"))?;
        if decision.is_allowed() {
            self.report.admitted_units += cost;
        }
        Ok(())
    }

    /// The owner by its own view takes what it holds into its bucket now and then, as the
    /// key's next check would.
    fn take_in_held(&mut self) -> Result<(), String> {
        let now = self.now;
        if !now.is_multiple_of(50 * MS) {
            return Ok(());
        }
        for node in 0..2 {
            let view = self.views[node];
            if view.owner != node || now < view.handoff_until_ns {
                continue;
            }
            let (key, limit) = (self.key, self.limit);
            self.act(node, |exchange, store, _| {
                exchange
                    .check_global(now, store, key, &limit, 0, &[peer(B)])
                    .map(drop)
                    .map_err(|e| format!("store error {e}"))
            })?;
        }
        Ok(())
    }

    /// Messages due now, each handled by its receiver (region `a` routing its deltas).
    fn deliver(&mut self) -> Result<(), String> {
        let now = self.now;
        while let Some(message) = self.network.receive(now) {
            let to = message.to;
            match &message.message {
                Outgoing::Deltas(batch) if to < B => {
                    self.act(to, |exchange, store, route| {
                        exchange.handle_routed_deltas(now, batch, store, route);
                        Ok(())
                    })?;
                }
                Outgoing::Deltas(batch) => {
                    self.exchanges[to].handle_deltas(now, batch, &self.stores[to]);
                }
                Outgoing::Ack(ack) => self.exchanges[to].handle_ack(now, ack),
            }
        }
        Ok(())
    }

    /// What every node has due, onto the network.
    fn send_due(&mut self) -> Result<(), String> {
        let sent = send_all(
            &mut self.network,
            &mut self.rng,
            self.now,
            &mut self.exchanges,
            &index_of,
        )?;
        self.report.messages += sent;
        Ok(())
    }

    /// The end, the network drained: every exchange idle, and every unit `b` admitted landed
    /// in `a` once (in a bucket, or held for the key's next check).
    fn settled(mut self) -> Result<MovesReport, String> {
        if !self.exchanges.iter().all(Exchange::is_idle) {
            return Err("the exchanges did not settle in the drain time".into());
        }
        let report = &mut self.report;
        report.landed_units = self.landed.iter().sum();
        report.held_units = (0..2)
            .map(|i| self.exchanges[i].backlog_units(self.key))
            .sum();
        report.passed_on_units = (0..2)
            .map(|i| self.exchanges[i].stats().passed_on_units)
            .sum();
        if report.landed_units + report.held_units != report.admitted_units {
            return Err(format!(
                "b admitted {} units; region a took in {} and holds {}: not exactly once",
                report.admitted_units, report.landed_units, report.held_units
            ));
        }
        Ok(self.report)
    }

    /// Runs `act` on node `node` of region `a` (its exchange, its bucket store, the route
    /// its view gives now), then counts what landed in its bucket; fails when units landed
    /// there while the node did not decide the key by its own view (that bucket goes nowhere).
    fn act(
        &mut self,
        node: usize,
        act: impl FnOnce(&mut Exchange, &BucketStore, &dyn Fn(BucketKey) -> Route) -> Result<(), String>,
    ) -> Result<(), String> {
        let (now, view, config) = (self.now, self.views[node], self.config);
        let store = &self.stores[node];
        let before = consumed(store, self.key, &self.limit, now);
        act(&mut self.exchanges[node], store, &|_| {
            route_of(config, node, view, now)
        })?;
        let units = consumed(store, self.key, &self.limit, now).saturating_sub(before);
        if units == 0 {
            return Ok(());
        }
        if view.owner != node {
            return Err(format!(
                "{units} units landed in {}'s bucket at {} ms while it sees {} decide the key",
                peer(node),
                now / MS,
                peer(view.owner)
            ));
        }
        self.landed[node] += units;
        Ok(())
    }
}

/// Where node `node` of region `a` sends a delta's units, by its own view at `now_ns`.
fn route_of(config: &MovesConfig, node: usize, view: View, now_ns: u64) -> Route {
    if config.route_everything_here {
        Route::Here
    } else if view.owner != node {
        Route::PassOn(peer(view.owner))
    } else if now_ns < view.handoff_until_ns {
        Route::Hold
    } else {
        Route::Here
    }
}
