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

use super::network::{InTransit, Network, NetworkConfig};
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
    let seed = config.seed;
    let fail = |what: String| Err(format!("seed {seed}: {what}"));
    let mut rng = SplitMix64::new(seed);
    let key = BucketKey::for_key(b"moves\x1fglobal");
    let limit = Limit::window(Algorithm::FixedWindow, 1_000_000_000, 3_600 * NANOS_PER_SEC)
        .unwrap_or_else(|_| unreachable!("a valid limit"));
    let exchange_config = ExchangeConfig::for_regions(2);
    let mut exchanges: Vec<Exchange> = (0..NODES)
        .map(|i| Exchange::new(exchange_config, peer(i), 1))
        .collect();
    let stores: Vec<BucketStore> = (0..NODES).map(|_| store()).collect();
    let mut network = Network::new(NetworkConfig {
        min_delay_ns: 5 * MS,
        max_delay_ns: 60 * MS,
        loss_per_million: 50_000,
        duplicate_per_million: 50_000,
        partition: None,
    });
    // The truth, each node of `a`'s view, and `b`'s view of `a`'s ring.
    let mut owner = 0usize;
    let mut views = [View {
        owner: 0,
        handoff_until_ns: 0,
    }; 2];
    let mut b_view = 0usize;
    // Pending view changes: (when, node of `a` or `B`, new owner).
    let mut news: Vec<(u64, usize, usize)> = Vec::new();
    let mut next_move = config.move_every_ns;
    let mut landed = [0u64; 2];
    let mut report = MovesReport::default();
    let end_ns = config.traffic_ns + config.drain_ns;
    let mut now = 0u64;
    while now < end_ns {
        now += MS;
        // The slot moves: each node hears of it a little later, `b` later still.
        if now >= next_move && now < config.traffic_ns {
            owner = 1 - owner;
            report.moves += 1;
            for node in 0..2 {
                news.push((now + rng.range(0, 50) * MS, node, owner));
            }
            news.push((now + rng.range(0, 400) * MS, B, owner));
            let half = config.move_every_ns / 2;
            next_move = now + rng.range(half, half + config.move_every_ns);
        }
        let due: Vec<(u64, usize, usize)> = news.iter().copied().filter(|n| n.0 <= now).collect();
        news.retain(|n| n.0 > now);
        for (_, node, new_owner) in due {
            if node == B {
                b_view = new_owner;
                continue;
            }
            let gained = views[node].owner != node && new_owner == node;
            views[node].owner = new_owner;
            if gained {
                views[node].handoff_until_ns = now + rng.range(5, 30) * MS;
            }
            let a = Region {
                stores: &stores,
                key,
                limit: &limit,
            };
            a.act(
                node,
                views[node],
                now,
                config,
                &mut landed,
                |store, route| {
                    exchanges[node].follow_ownership(now, store, route, &|_| true);
                    Ok(())
                },
            )
            .map_err(|e| format!("seed {seed}: {e}"))?;
        }
        // Traffic at `b`, to the owner its view names.
        if now < config.traffic_ns && rng.chance(300_000) {
            let cost = rng.range(1, 3);
            let decision = exchanges[B]
                .check_global(now, &stores[B], key, &limit, cost, &[peer(b_view)])
                .map_err(|e| format!("seed {seed}: store error {e}"))?;
            if decision.is_allowed() {
                report.admitted_units += cost;
            }
        }
        // The owner by its own view takes what it holds into its bucket now and then, as the
        // key's next check would.
        for (node, view) in views.iter().enumerate() {
            if view.owner == node && now >= view.handoff_until_ns && now.is_multiple_of(50 * MS) {
                let a = Region {
                    stores: &stores,
                    key,
                    limit: &limit,
                };
                a.act(node, *view, now, config, &mut landed, |store, _| {
                    exchanges[node]
                        .check_global(now, store, key, &limit, 0, &[peer(B)])
                        .map(drop)
                        .map_err(|e| format!("store error {e}"))
                })
                .map_err(|e| format!("seed {seed}: {e}"))?;
            }
        }
        // Deliveries, then what is due to send.
        while let Some(message) = network.receive(now) {
            let to = message.to;
            match &message.message {
                Outgoing::Deltas(batch) if to < B => {
                    let a = Region {
                        stores: &stores,
                        key,
                        limit: &limit,
                    };
                    a.act(to, views[to], now, config, &mut landed, |store, route| {
                        exchanges[to].handle_routed_deltas(now, batch, store, route);
                        Ok(())
                    })
                    .map_err(|e| format!("seed {seed}: {e}"))?;
                }
                Outgoing::Deltas(batch) => exchanges[to].handle_deltas(now, batch, &stores[to]),
                Outgoing::Ack(ack) => exchanges[to].handle_ack(now, ack),
            }
        }
        for (from, exchange) in exchanges.iter_mut().enumerate() {
            // Bounded: each node has little to send per millisecond.
            for _ in 0..64 {
                let Some(transmit) = exchange.poll_transmit(now) else {
                    break;
                };
                let Some(to) = index_of(&transmit.to) else {
                    return fail(format!("a message to an unknown node {}", transmit.to));
                };
                report.messages += 1;
                network.send(
                    &mut rng,
                    now,
                    InTransit {
                        from,
                        to,
                        message: transmit.message,
                    },
                );
            }
        }
        let total: u64 = landed.iter().sum();
        if total > report.admitted_units {
            return fail(format!(
                "region a took {total} units in, more than the {} b admitted",
                report.admitted_units
            ));
        }
    }
    if !exchanges.iter().all(Exchange::is_idle) {
        return fail("the exchanges did not settle in the drain time".into());
    }
    report.landed_units = landed.iter().sum();
    report.held_units = (0..2).map(|i| exchanges[i].backlog_units(key)).sum();
    report.passed_on_units = (0..2).map(|i| exchanges[i].stats().passed_on_units).sum();
    if report.landed_units + report.held_units != report.admitted_units {
        return fail(format!(
            "b admitted {} units; region a took in {} and holds {}: not exactly once",
            report.admitted_units, report.landed_units, report.held_units
        ));
    }
    Ok(report)
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

/// Region `a`'s buckets, as the checker reads them.
struct Region<'a> {
    stores: &'a [BucketStore],
    key: BucketKey,
    limit: &'a Limit,
}

impl Region<'_> {
    /// Runs `act` on node `node`'s bucket with the route its `view` gives at `now_ns`, then
    /// counts what landed in the bucket; fails when units landed there while the node did not
    /// decide the key by its own view (that bucket goes nowhere).
    fn act(
        &self,
        node: usize,
        view: View,
        now_ns: u64,
        config: &MovesConfig,
        landed: &mut [u64; 2],
        act: impl FnOnce(&BucketStore, &dyn Fn(BucketKey) -> Route) -> Result<(), String>,
    ) -> Result<(), String> {
        let store = &self.stores[node];
        let before = consumed(store, self.key, self.limit, now_ns);
        act(store, &|_| route_of(config, node, view, now_ns))?;
        let units = consumed(store, self.key, self.limit, now_ns).saturating_sub(before);
        if units == 0 {
            return Ok(());
        }
        if view.owner != node {
            return Err(format!(
                "{units} units landed in {}'s bucket at {} ms while it sees {} decide the key",
                peer(node),
                now_ns / MS,
                peer(view.owner)
            ));
        }
        landed[node] += units;
        Ok(())
    }
}
