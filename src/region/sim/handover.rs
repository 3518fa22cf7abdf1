//! A seeded simulation of the admission rule while a key's slot moves inside a region: region
//! `a` has three nodes among which one global key's slot moves again and again (so units
//! inherited with one move are handed over again with the next), and whichever decides it
//! admits a steady load; region `b` has one node that receives `a`'s units and
//! confirms them over a network that delays, loses and duplicates.
//!
//! A move is carried out as the node driver does: each node of `a` hears of it a little late;
//! the one that gave the slot away stops deciding at once and sends the slot's hand-off, with
//! the units `b` has not confirmed ([`Exchange::hand_over_unconfirmed`]), to the new owner; that
//! one decides only once its view names it and the hand-off arrived ([`Exchange::inherit`]).
//!
//! The checker asserts, after every millisecond, that the units region `a` admitted and `b`
//! has not confirmed, over its three nodes, stay within one share of the key's burst: the bound
//! the admission rule gives one region. `b` never counts as unreachable (a long
//! `unreachable_after`), so inherited units never expire within a run. At the end, the network drained, `b` applied every unit
//! `a` admitted exactly once. [`HandoverConfig::hand_over_nothing`] is the control (hand-offs
//! without the unconfirmed units, as before they were handed over), which the checker must
//! catch.

use super::network::{Network, NetworkConfig, send_all};
use crate::region::{Exchange, ExchangeConfig, Outgoing, Peer, RegionName, UnconfirmedUnits};
use crate::simulation::SplitMix64;
use crate::{Algorithm, BucketKey, BucketStore, Limit, StoreConfig};

const MS: u64 = 1_000_000;
/// Nodes 0 to 2 are region `a`'s, node 3 is region `b`'s.
const A_NODES: usize = 3;
const NODES: usize = A_NODES + 1;
const B: usize = A_NODES;
/// The key's limit: 40 units per 100 ms window, so one region's share is 20.
const BURST: u64 = 40;
const WINDOW_NS: u64 = 100 * MS;

/// What one run depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandoverConfig {
    pub seed: u64,
    /// Load in `a` for this long, then the network drains for `drain_ns`.
    pub traffic_ns: u64,
    pub drain_ns: u64,
    /// The key's slot moves every this many ns (on average; uniform in half to one and a half).
    pub move_every_ns: u64,
    /// The control: a hand-off carries no unconfirmed units.
    pub hand_over_nothing: bool,
}

impl HandoverConfig {
    pub fn from_seed(seed: u64) -> Self {
        HandoverConfig {
            seed,
            traffic_ns: 10_000 * MS,
            drain_ns: 20_000 * MS,
            move_every_ns: 500 * MS,
            hand_over_nothing: false,
        }
    }
}

/// What a passing run saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HandoverReport {
    pub moves: u64,
    pub admitted_units: u64,
    /// Units inherited with hand-offs, over the nodes of `a`.
    pub inherited_units: u64,
    /// Checks the admission rule held back.
    pub denied_by_share: u64,
    /// The most units of `a` unconfirmed by `b` at once, and the bound they were held to.
    pub most_unconfirmed: u64,
    pub bound: u64,
}

/// A node of region `a`: who it thinks decides the key (and since which move), and the latest
/// move whose hand-off reached it.
#[derive(Debug, Clone, Copy, Default)]
struct View {
    owner: usize,
    move_seen: u64,
    handoff_of_move: u64,
}

/// A hand-off on its way: the move it belongs to, when it arrives, to whom, what it carries.
#[derive(Debug, Clone)]
struct Handoff {
    of_move: u64,
    arrives_ns: u64,
    to: usize,
    units: Vec<UnconfirmedUnits>,
}

fn peer(index: usize) -> Peer {
    let (region, node) = match index {
        0 => ("a", "a1"),
        1 => ("a", "a2"),
        2 => ("a", "a3"),
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

/// Runs one simulation; `Err` names the seed and what failed.
pub fn run_handover(config: &HandoverConfig) -> Result<HandoverReport, String> {
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

struct World<'c> {
    config: &'c HandoverConfig,
    rng: SplitMix64,
    key: BucketKey,
    limit: Limit,
    exchanges: Vec<Exchange>,
    stores: Vec<BucketStore>,
    network: Network,
    /// The latest move and who it names.
    moves: u64,
    owner: usize,
    views: [View; A_NODES],
    /// View changes on their way: (when, node of `a`, move, new owner).
    news: Vec<(u64, usize, u64, usize)>,
    handoffs: Vec<Handoff>,
    next_move_ns: u64,
    report: HandoverReport,
    now: u64,
}

impl<'c> World<'c> {
    fn new(config: &'c HandoverConfig) -> Self {
        // `b` never counts as unreachable here (the rule would then let go of it, which is
        // the partition case the main simulation covers), so every excess is a move's.
        let exchange_config = ExchangeConfig {
            unreachable_after_ns: 60_000 * MS,
            ..ExchangeConfig::for_regions(2)
        };
        let store = || {
            BucketStore::new(StoreConfig {
                max_keys: 16,
                shards: 1,
            })
            .unwrap_or_else(|_| unreachable!("a valid store configuration"))
        };
        let share = exchange_config.share(BURST);
        World {
            config,
            rng: SplitMix64::new(config.seed),
            key: BucketKey::for_key(b"handover\x1fglobal"),
            limit: Limit::window(Algorithm::FixedWindow, BURST, WINDOW_NS)
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
            moves: 0,
            owner: 0,
            views: [View::default(); A_NODES],
            news: Vec::new(),
            handoffs: Vec::new(),
            next_move_ns: config.move_every_ns,
            report: HandoverReport {
                // The rule admits while unconfirmed units plus the cost (1) fit the share.
                bound: share,
                ..HandoverReport::default()
            },
            now: 0,
        }
    }

    /// One millisecond: a move, the news of moves, hand-offs arriving, load at the decider,
    /// deliveries and sends; then the bound.
    fn step(&mut self) -> Result<(), String> {
        self.move_slot();
        self.hear_news();
        self.receive_handoffs();
        self.admit_in_a()?;
        self.deliver();
        self.send_due()?;
        self.check_bound()
    }

    /// The node of `a` that decides the key now, if any: its view names it and the move's
    /// hand-off reached it.
    fn decider(&self) -> Option<usize> {
        (0..A_NODES).find(|&node| {
            let view = self.views[node];
            view.owner == node && view.handoff_of_move >= view.move_seen
        })
    }

    fn move_slot(&mut self) {
        let now = self.now;
        if now < self.next_move_ns || now >= self.config.traffic_ns {
            return;
        }
        self.moves += 1;
        self.owner = (self.owner + self.rng.range(1, A_NODES as u64 - 1) as usize) % A_NODES;
        self.report.moves += 1;
        for node in 0..A_NODES {
            let at = now + self.rng.range(0, 50) * MS;
            self.news.push((at, node, self.moves, self.owner));
        }
        let half = self.config.move_every_ns / 2;
        self.next_move_ns = now + self.rng.range(half, half + self.config.move_every_ns);
    }

    /// Views change as their news arrives; a node that gave the slot away sends its hand-off.
    fn hear_news(&mut self) {
        let now = self.now;
        let due: Vec<(u64, usize, u64, usize)> =
            self.news.iter().copied().filter(|n| n.0 <= now).collect();
        self.news.retain(|n| n.0 > now);
        for (_, node, of_move, new_owner) in due {
            let gave_away = self.views[node].owner == node && new_owner != node;
            self.views[node].owner = new_owner;
            self.views[node].move_seen = of_move;
            if !gave_away {
                continue;
            }
            let key = self.key;
            let units = if self.config.hand_over_nothing {
                Vec::new()
            } else {
                self.exchanges[node].hand_over_unconfirmed(now, &|k| k == key)
            };
            self.handoffs.push(Handoff {
                of_move,
                arrives_ns: now + self.rng.range(1, 20) * MS,
                to: new_owner,
                units,
            });
        }
    }

    fn receive_handoffs(&mut self) {
        let now = self.now;
        let (due, later): (Vec<Handoff>, Vec<Handoff>) =
            self.handoffs.drain(..).partition(|h| h.arrives_ns <= now);
        self.handoffs = later;
        for handoff in due {
            self.exchanges[handoff.to].inherit(now, &handoff.units);
            let view = &mut self.views[handoff.to];
            view.handoff_of_move = view.handoff_of_move.max(handoff.of_move);
        }
    }

    /// Load at whichever node decides the key: a check of one unit half the milliseconds.
    fn admit_in_a(&mut self) -> Result<(), String> {
        if self.now >= self.config.traffic_ns || !self.rng.chance(500_000) {
            return Ok(());
        }
        let Some(node) = self.decider() else {
            return Ok(());
        };
        let decision = self.exchanges[node]
            .check_global(
                self.now,
                &self.stores[node],
                self.key,
                &self.limit,
                1,
                &[peer(B)],
            )
            .map_err(|e| format!("store error {e}"))?;
        if decision.is_allowed() {
            self.report.admitted_units += 1;
        }
        Ok(())
    }

    fn deliver(&mut self) {
        let now = self.now;
        while let Some(message) = self.network.receive(now) {
            let to = message.to;
            match &message.message {
                Outgoing::Deltas(batch) => {
                    self.exchanges[to].handle_deltas(now, batch, &self.stores[to]);
                }
                Outgoing::Ack(ack) => self.exchanges[to].handle_ack(now, ack),
            }
        }
    }

    fn send_due(&mut self) -> Result<(), String> {
        send_all(
            &mut self.network,
            &mut self.rng,
            self.now,
            &mut self.exchanges,
            &index_of,
        )
        .map(drop)
    }

    /// Region `a`'s units unconfirmed by `b`, over its nodes, within the bound.
    fn check_bound(&mut self) -> Result<(), String> {
        let per_node: Vec<u64> = (0..A_NODES)
            .map(|node| self.exchanges[node].unconfirmed(&peer(B), self.key))
            .collect();
        let total: u64 = per_node.iter().sum();
        self.report.most_unconfirmed = self.report.most_unconfirmed.max(total);
        if total > self.report.bound {
            return Err(format!(
                "at {} ms region a has {total} units unconfirmed by b, over the bound of {} \
                 ({per_node:?} per node, move {})",
                self.now / MS,
                self.report.bound,
                self.moves
            ));
        }
        Ok(())
    }

    /// The end, the network drained: every exchange idle, and `b` applied exactly what `a`
    /// admitted.
    fn settled(mut self) -> Result<HandoverReport, String> {
        if !self.exchanges.iter().all(Exchange::is_idle) {
            return Err("the exchanges did not settle in the drain time".into());
        }
        let applied: u64 = (0..A_NODES)
            .map(|node| self.exchanges[B].applied_from(&peer(node)))
            .sum();
        if applied != self.report.admitted_units {
            return Err(format!(
                "a admitted {} units; b applied {applied}: not exactly once",
                self.report.admitted_units
            ));
        }
        let report = &mut self.report;
        for node in 0..A_NODES {
            let stats = self.exchanges[node].stats();
            report.inherited_units += stats.inherited_units;
            report.denied_by_share += stats.denied_by_share;
        }
        Ok(self.report)
    }
}
