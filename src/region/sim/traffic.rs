//! The simulation's traffic: requests arriving in every region, quiet and busy by turns, plus
//! bursts that hit every region at the same instant after a quiet spell (when the buckets are
//! full: the case the admission rule is for).

use std::collections::VecDeque;

use crate::NANOS_PER_SEC;
use crate::simulation::SplitMix64;

/// The shape of the traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrafficConfig {
    /// Requests per second per region in quiet and busy slots.
    pub quiet_per_sec: u64,
    pub busy_per_sec: u64,
    pub slot_ns: u64,
    /// Chance that a slot is busy, per region.
    pub busy_per_million: u64,
    /// Bursts hitting every region at once, each of `burst_size` requests per region.
    pub bursts: usize,
    pub burst_size: u64,
    /// Requests cost 1, or `max_cost` with this chance.
    pub max_cost: u64,
    pub max_cost_per_million: u64,
}

impl Default for TrafficConfig {
    fn default() -> Self {
        TrafficConfig {
            quiet_per_sec: 10,
            busy_per_sec: 150,
            slot_ns: NANOS_PER_SEC / 2,
            busy_per_million: 500_000,
            bursts: 4,
            burst_size: 40,
            max_cost: 2,
            max_cost_per_million: 100_000,
        }
    }
}

/// One request: where it arrives and what it costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub region: usize,
    pub cost: u64,
}

#[derive(Debug)]
pub struct Traffic {
    config: TrafficConfig,
    rng: SplitMix64,
    until_ns: u64,
    next_at: Vec<u64>,
    /// `busy[slot][region]`.
    busy: Vec<Vec<bool>>,
    /// Burst times, earliest last.
    bursts: Vec<u64>,
    due: VecDeque<Request>,
}

impl Traffic {
    pub fn new(
        config: TrafficConfig,
        regions: usize,
        until_ns: u64,
        seed_from: &mut SplitMix64,
    ) -> Self {
        let mut rng = SplitMix64::new(seed_from.next_u64());
        let slot_ns = config.slot_ns.max(1);
        let slots = until_ns.div_ceil(slot_ns) as usize;
        let mut busy: Vec<Vec<bool>> = (0..slots)
            .map(|_| {
                (0..regions)
                    .map(|_| rng.chance(config.busy_per_million))
                    .collect()
            })
            .collect();
        let mut bursts: Vec<u64> = (0..config.bursts)
            .map(|_| rng.range(NANOS_PER_SEC, until_ns.saturating_sub(1)))
            .collect();
        // Two quiet slots before each burst, so it meets full buckets.
        for &at in &bursts {
            let slot = (at / slot_ns) as usize;
            for quiet in &mut busy[slot.saturating_sub(2)..slot] {
                quiet.iter_mut().for_each(|b| *b = false);
            }
        }
        bursts.sort_unstable_by(|a, b| b.cmp(a));
        let mut traffic = Traffic {
            config,
            rng,
            until_ns,
            next_at: vec![0; regions],
            busy,
            bursts,
            due: VecDeque::new(),
        };
        for region in 0..regions {
            traffic.next_at[region] = traffic.gap(region, 0);
        }
        traffic
    }

    /// A gap after `now_ns` for `region`, uniform around the mean of the slot's rate.
    fn gap(&mut self, region: usize, now_ns: u64) -> u64 {
        let slot = (now_ns / self.config.slot_ns.max(1)) as usize;
        let busy = self.busy.get(slot).is_some_and(|s| s[region]);
        let per_sec = if busy {
            self.config.busy_per_sec
        } else {
            self.config.quiet_per_sec
        };
        let mean = NANOS_PER_SEC / per_sec.max(1);
        now_ns + self.rng.range(1, 2 * mean)
    }

    fn cost(&mut self) -> u64 {
        if self.rng.chance(self.config.max_cost_per_million) {
            self.config.max_cost
        } else {
            1
        }
    }

    /// When the next request arrives, if before the end.
    pub fn next_arrival(&self) -> Option<u64> {
        if !self.due.is_empty() {
            return Some(0);
        }
        let next = self
            .next_at
            .iter()
            .copied()
            .chain(self.bursts.last().copied())
            .min()?;
        (next < self.until_ns).then_some(next)
    }

    /// The next request due by `now_ns`.
    pub fn take_due(&mut self, now_ns: u64) -> Option<Request> {
        if self.due.is_empty() && now_ns < self.until_ns {
            if self.bursts.last().is_some_and(|&at| at <= now_ns) {
                self.bursts.pop();
                let regions = self.next_at.len();
                for _ in 0..self.config.burst_size {
                    for region in 0..regions {
                        let cost = self.cost();
                        self.due.push_back(Request { region, cost });
                    }
                }
            }
            for region in 0..self.next_at.len() {
                if self.next_at[region] <= now_ns {
                    let cost = self.cost();
                    self.due.push_back(Request { region, cost });
                    self.next_at[region] = self.gap(region, now_ns);
                }
            }
        }
        self.due.pop_front()
    }
}
