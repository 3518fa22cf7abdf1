//! The fault table the proxies consult for every packet: who may talk to whom, with what delay,
//! loss, duplication and reordering. The scenario timeline edits it while traffic flows.

use std::time::Duration;

use parking_lot::RwLock;
use rand::Rng;

/// One end of a packet's path, as the proxies tell them apart by source port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// A floodgate node, by index in the cluster.
    Node(usize),
    /// A gateway (one `Client`), by index.
    Gateway(usize),
    /// A socket the harness does not know (the hostile client, a gateway's later link).
    Other,
}

/// A set of endpoints a rule applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Side {
    Nodes(Vec<usize>),
    Gateways(Vec<usize>),
    /// Every gateway and unknown socket: everything that is not a node.
    AnyClient,
    Any,
}

impl Side {
    fn contains(&self, endpoint: Endpoint) -> bool {
        match (self, endpoint) {
            (Side::Any, _) => true,
            (Side::Nodes(set), Endpoint::Node(i)) => set.contains(&i),
            (Side::Gateways(set), Endpoint::Gateway(g)) => set.contains(&g),
            (Side::AnyClient, Endpoint::Gateway(_) | Endpoint::Other) => true,
            _ => false,
        }
    }
}

/// What happens to a packet on a matching path.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Effect {
    /// Probability of dropping the packet (1.0: a blackhole).
    pub drop: f64,
    pub delay: Duration,
    /// Uniform extra delay in `-jitter..=jitter` around `delay`.
    pub jitter: Duration,
    /// Probability of sending the packet twice.
    pub duplicate: f64,
    /// Probability of holding the packet back a few milliseconds, so later ones pass it.
    pub reorder: f64,
}

impl Effect {
    pub fn blackhole() -> Self {
        Effect {
            drop: 1.0,
            ..Effect::default()
        }
    }
}

/// A directed rule: packets from `from` to `to` get `effect`.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub id: u64,
    pub from: Side,
    pub to: Side,
    pub effect: Effect,
}

/// The rules in force; the first matching rule decides a packet (none: delivered at once).
#[derive(Debug, Default)]
pub struct FaultTable {
    rules: RwLock<Vec<Rule>>,
    next_id: RwLock<u64>,
}

/// Extra hold for a reordered packet: enough to let a few later packets pass it on loopback.
const REORDER_HOLD: Duration = Duration::from_millis(8);

impl FaultTable {
    /// Adds a directed rule; returns its id for [`FaultTable::remove`].
    pub fn add(&self, from: Side, to: Side, effect: Effect) -> u64 {
        let mut next = self.next_id.write();
        *next += 1;
        let id = *next;
        self.rules.write().push(Rule {
            id,
            from,
            to,
            effect,
        });
        id
    }

    /// Adds the rule in both directions; returns both ids.
    pub fn add_both(&self, a: Side, b: Side, effect: Effect) -> [u64; 2] {
        [
            self.add(a.clone(), b.clone(), effect),
            self.add(b, a, effect),
        ]
    }

    /// Cuts `a` from `b` both ways.
    pub fn partition(&self, a: Side, b: Side) -> [u64; 2] {
        self.add_both(a, b, Effect::blackhole())
    }

    pub fn remove(&self, ids: &[u64]) {
        self.rules.write().retain(|r| !ids.contains(&r.id));
    }

    pub fn clear(&self) {
        self.rules.write().clear();
    }

    /// Whether packets from `from` to `to` are all dropped now.
    pub fn is_cut(&self, from: Endpoint, to: Endpoint) -> bool {
        self.rules
            .read()
            .iter()
            .find(|r| r.from.contains(from) && r.to.contains(to))
            .is_some_and(|r| r.effect.drop >= 1.0)
    }

    /// The delays to send a packet after: empty drops it, two entries duplicate it.
    pub fn fate(&self, from: Endpoint, to: Endpoint, rng: &mut impl Rng) -> Vec<Duration> {
        let rules = self.rules.read();
        let Some(rule) = rules
            .iter()
            .find(|r| r.from.contains(from) && r.to.contains(to))
        else {
            return vec![Duration::ZERO];
        };
        let effect = rule.effect;
        drop(rules);
        if effect.drop > 0.0 && rng.random_bool(effect.drop.min(1.0)) {
            return Vec::new();
        }
        let mut delay = effect.delay;
        if !effect.jitter.is_zero() {
            let jitter = effect.jitter.as_micros() as i64;
            let offset = rng.random_range(-jitter..=jitter);
            let micros = (delay.as_micros() as i64 + offset).max(0);
            delay = Duration::from_micros(micros as u64);
        }
        if effect.reorder > 0.0 && rng.random_bool(effect.reorder.min(1.0)) {
            delay += REORDER_HOLD;
        }
        if effect.duplicate > 0.0 && rng.random_bool(effect.duplicate.min(1.0)) {
            vec![delay, delay + Duration::from_micros(200)]
        } else {
            vec![delay]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    #[test]
    fn a_partition_cuts_both_ways_and_only_between_its_sides() {
        let table = FaultTable::default();
        let mut rng = SmallRng::seed_from_u64(1);
        let ids = table.partition(Side::Nodes(vec![0]), Side::Nodes(vec![1, 2]));
        assert!(
            table
                .fate(Endpoint::Node(0), Endpoint::Node(1), &mut rng)
                .is_empty()
        );
        assert!(
            table
                .fate(Endpoint::Node(2), Endpoint::Node(0), &mut rng)
                .is_empty()
        );
        assert_eq!(
            table.fate(Endpoint::Node(1), Endpoint::Node(2), &mut rng),
            vec![Duration::ZERO]
        );
        assert_eq!(
            table.fate(Endpoint::Gateway(0), Endpoint::Node(0), &mut rng),
            vec![Duration::ZERO]
        );
        table.remove(&ids);
        assert_eq!(
            table.fate(Endpoint::Node(0), Endpoint::Node(1), &mut rng),
            vec![Duration::ZERO]
        );
    }

    #[test]
    fn duplicated_packets_go_twice_and_reordered_ones_are_held_back() {
        let table = FaultTable::default();
        let mut rng = SmallRng::seed_from_u64(3);
        table.add(
            Side::Nodes(vec![0]),
            Side::Any,
            Effect {
                duplicate: 1.0,
                ..Effect::default()
            },
        );
        table.add(
            Side::Nodes(vec![1]),
            Side::Any,
            Effect {
                reorder: 1.0,
                ..Effect::default()
            },
        );
        let twice = table.fate(Endpoint::Node(0), Endpoint::Node(2), &mut rng);
        assert_eq!(twice.len(), 2, "{twice:?}");
        let held = table.fate(Endpoint::Node(1), Endpoint::Node(2), &mut rng);
        assert_eq!(held, vec![REORDER_HOLD]);
        assert!(!table.is_cut(Endpoint::Node(0), Endpoint::Node(2)));
        table.partition(Side::Gateways(vec![0]), Side::Nodes(vec![2]));
        assert!(table.is_cut(Endpoint::Gateway(0), Endpoint::Node(2)));
        assert!(table.is_cut(Endpoint::Node(2), Endpoint::Gateway(0)));
        assert!(!table.is_cut(Endpoint::Gateway(1), Endpoint::Node(2)));
    }

    #[test]
    fn delay_and_jitter_stay_in_range_and_loss_is_about_its_rate() {
        let table = FaultTable::default();
        let mut rng = SmallRng::seed_from_u64(7);
        table.add(
            Side::Any,
            Side::Any,
            Effect {
                drop: 0.1,
                delay: Duration::from_millis(50),
                jitter: Duration::from_millis(20),
                ..Effect::default()
            },
        );
        let mut dropped = 0;
        for _ in 0..10_000 {
            match table
                .fate(Endpoint::Other, Endpoint::Node(0), &mut rng)
                .as_slice()
            {
                [] => dropped += 1,
                [delay] => assert!(
                    (30..=70).contains(&delay.as_millis()),
                    "{delay:?} outside 50 ms +- 20 ms"
                ),
                more => panic!("no duplication asked, got {more:?}"),
            }
        }
        assert!(
            (800..1_200).contains(&dropped),
            "{dropped} of 10,000 dropped"
        );
    }
}
