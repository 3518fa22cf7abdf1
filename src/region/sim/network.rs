//! The simulated network between regions: per-message delays, loss, duplication (so reordering)
//! and a partition that cuts one region off for a while.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::super::delta::{Outgoing, Peer};
use super::super::exchange::Exchange;
use crate::simulation::SplitMix64;

/// One region cut off from every other between `start_ns` and `end_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    pub start_ns: u64,
    pub end_ns: u64,
    pub isolated: usize,
}

impl Partition {
    /// True when a message between `a` and `b` is cut at `now_ns`.
    pub fn cuts(&self, a: usize, b: usize, now_ns: u64) -> bool {
        (self.start_ns..self.end_ns).contains(&now_ns)
            && a != b
            && (a == self.isolated || b == self.isolated)
    }
}

/// What the network does to messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetworkConfig {
    pub min_delay_ns: u64,
    pub max_delay_ns: u64,
    pub loss_per_million: u64,
    pub duplicate_per_million: u64,
    pub partition: Option<Partition>,
}

/// A message on its way.
#[derive(Debug, Clone)]
pub struct InTransit {
    pub from: usize,
    pub to: usize,
    pub message: Outgoing,
}

/// What became of a sent message (for the trace and the counts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    Lost,
    Cut,
    Delayed { copies: u8 },
}

#[derive(Debug)]
pub struct Network {
    config: NetworkConfig,
    queue: BinaryHeap<Reverse<(u64, u64)>>,
    messages: HashMap<u64, InTransit>,
    next_id: u64,
    pub sent: u64,
    pub lost: u64,
    pub cut: u64,
    pub duplicated: u64,
}

impl Network {
    pub fn new(config: NetworkConfig) -> Self {
        Network {
            config,
            queue: BinaryHeap::new(),
            messages: HashMap::new(),
            next_id: 0,
            sent: 0,
            lost: 0,
            cut: 0,
            duplicated: 0,
        }
    }

    pub fn send(&mut self, rng: &mut SplitMix64, now_ns: u64, message: InTransit) -> Fate {
        self.sent += 1;
        if self.is_cut(message.from, message.to, now_ns) {
            self.cut += 1;
            return Fate::Cut;
        }
        if rng.chance(self.config.loss_per_million) {
            self.lost += 1;
            return Fate::Lost;
        }
        let copies = if rng.chance(self.config.duplicate_per_million) {
            self.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let delay = rng.range(self.config.min_delay_ns, self.config.max_delay_ns);
            let id = self.next_id;
            self.next_id += 1;
            self.queue.push(Reverse((now_ns + delay, id)));
            self.messages.insert(id, message.clone());
        }
        Fate::Delayed { copies }
    }

    fn is_cut(&self, a: usize, b: usize, now_ns: u64) -> bool {
        self.config.partition.is_some_and(|p| p.cuts(a, b, now_ns))
    }

    /// When the next message arrives.
    pub fn next_arrival(&self) -> Option<u64> {
        self.queue.peek().map(|Reverse((at, _))| *at)
    }

    /// The next message due by `now_ns` that the partition lets through (messages arriving
    /// across the cut are lost).
    pub fn receive(&mut self, now_ns: u64) -> Option<InTransit> {
        while let Some(&Reverse((at, id))) = self.queue.peek() {
            if at > now_ns {
                return None;
            }
            self.queue.pop();
            let message = self.messages.remove(&id)?;
            if self.is_cut(message.from, message.to, at) {
                self.cut += 1;
                continue;
            }
            return Some(message);
        }
        None
    }
}

/// What every node has due at `now_ns`, onto `network` (at most 64 messages a node: each has
/// little to send per millisecond); `index_of` names each destination's node. Returns how many
/// were sent, or the first destination no node is.
pub fn send_all(
    network: &mut Network,
    rng: &mut SplitMix64,
    now_ns: u64,
    exchanges: &mut [Exchange],
    index_of: &dyn Fn(&Peer) -> Option<usize>,
) -> Result<u64, String> {
    let mut sent = 0;
    for (from, exchange) in exchanges.iter_mut().enumerate() {
        for _ in 0..64 {
            let Some(transmit) = exchange.poll_transmit(now_ns) else {
                break;
            };
            let Some(to) = index_of(&transmit.to) else {
                return Err(format!("a message to an unknown node {}", transmit.to));
            };
            let message = InTransit {
                from,
                to,
                message: transmit.message,
            };
            network.send(rng, now_ns, message);
            sent += 1;
        }
    }
    Ok(sent)
}
