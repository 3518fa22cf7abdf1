//! A deterministic model of the demo upstream behind a gateway's shedder, for tests: a FIFO
//! queue in front of a fixed number of places, each request a fixed service time plus a
//! gateway's own overhead (with a little pseudo-random jitter), fed an open loop of the bench's
//! class mix. Nothing here reads a clock: the shedder sees the model's time.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use super::class::Priority;
use super::shedder::{Admission, Shedder, ShedderConfig};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000 * MS;

/// The bench's mix of ten consecutive requests: 10% critical, 30% default, 60% sheddable.
const MIX: [Priority; 10] = {
    use Priority::*;
    [
        Critical, Sheddable, Default, Sheddable, Sheddable, Default, Sheddable, Sheddable, Default,
        Sheddable,
    ]
};

/// The upstream and the way to it.
#[derive(Debug, Clone, Copy)]
pub struct Upstream {
    pub places: usize,
    pub service_ns: u64,
    /// The gateway's own time each way, before the jitter.
    pub overhead_ns: u64,
    /// Up to this much more, each way.
    pub jitter_ns: u64,
}

impl Upstream {
    /// The demo's: 4 places of 20 ms (21 ms as a timer wheel of 1 ms rounds them: about 190 a
    /// second), 1 to 5 ms of gateway each way (about the spread the demo's
    /// unloaded latencies show).
    pub const DEMO: Upstream = Upstream {
        places: 4,
        service_ns: 21 * MS,
        overhead_ns: MS,
        jitter_ns: 4 * MS,
    };
}

/// What one class saw over the recorded part.
#[derive(Debug, Clone, Default)]
pub struct ClassRun {
    pub sent: u64,
    pub admitted: u64,
    /// Latencies of the admitted, from arrival at the gateway to the answer back.
    pub latencies_ns: Vec<u64>,
}

impl ClassRun {
    pub fn admitted_share(&self) -> f64 {
        self.admitted as f64 / self.sent.max(1) as f64
    }

    pub fn quantile_ns(&self, q: f64) -> u64 {
        let mut sorted = self.latencies_ns.clone();
        sorted.sort_unstable();
        let i = ((sorted.len() as f64 * q).ceil() as usize).saturating_sub(1);
        sorted.get(i).copied().unwrap_or(0)
    }
}

/// One run's outcome.
#[derive(Debug, Clone, Default)]
pub struct Run {
    /// Indexed by [`Priority::rank`].
    pub classes: [ClassRun; 3],
    /// Answers the upstream gave a second over the recorded part.
    pub served_per_s: f64,
    /// Critical requests that found a lower-class request queued ahead of them at the
    /// upstream (not in service: waiting in the same FIFO), and the most found at once.
    pub critical_behind_lower: u64,
    pub most_lower_ahead: u64,
    /// The highest level the shedder was at when a window closed.
    pub top_level: u8,
}

/// A request admitted and not yet answered at the gateway.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Pending {
    done_ns: u64,
    seq: u64,
    class: Priority,
    sent_ns: u64,
    in_flight: u64,
}

/// `rate` requests a second for `seconds` (the first one not recorded), through a shedder
/// with `config` that sheds (`enforce`) or only watches.
pub fn run(
    upstream: Upstream,
    config: ShedderConfig,
    enforce: bool,
    rate: u64,
    seconds: u64,
) -> Run {
    let interval = SEC / rate.max(1);
    let total = seconds * SEC / interval;
    let mut model = Model::new(upstream, config, seconds);
    for i in 0..total {
        let now = i * interval;
        model.answer_due(now);
        model.shedder.tick(now);
        let class = MIX[(i % MIX.len() as u64) as usize];
        let recorded = now >= RECORDED_FROM;
        if let Some(in_flight) = model.admit(now, class, enforce, recorded) {
            model.serve(i, now, class, in_flight, recorded);
        }
    }
    model.out.served_per_s = model.served as f64 / (seconds - 1) as f64;
    model.out
}

/// The first second is not recorded: the shedder and the queue settle.
const RECORDED_FROM: u64 = SEC;

/// The shedder, the upstream's places and queue, and the answers on their way back.
struct Model {
    upstream: Upstream,
    shedder: Shedder,
    out: Run,
    seconds: u64,
    /// When each place is free next.
    free_at: BinaryHeap<Reverse<u64>>,
    answers: BinaryHeap<Reverse<Pending>>,
    /// Admitted requests by arrival at the upstream: (arrival, start of service, class).
    upstream_log: VecDeque<(u64, u64, Priority)>,
    /// The jitter's xorshift state.
    seed: u64,
    served: u64,
}

impl Model {
    fn new(upstream: Upstream, config: ShedderConfig, seconds: u64) -> Self {
        Model {
            upstream,
            shedder: Shedder::new(config, 0),
            out: Run::default(),
            seconds,
            free_at: (0..upstream.places).map(|_| Reverse(0)).collect(),
            answers: BinaryHeap::new(),
            upstream_log: VecDeque::new(),
            seed: 0x9e37_79b9_7f4a_7c15,
            served: 0,
        }
    }

    fn jitter(&mut self) -> u64 {
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        self.seed % self.upstream.jitter_ns.max(1)
    }

    /// Every answer back at the gateway by `now`, completed in the shedder.
    fn answer_due(&mut self, now: u64) {
        while let Some(Reverse(p)) = self.answers.peek() {
            if p.done_ns > now {
                break;
            }
            let Some(Reverse(p)) = self.answers.pop() else {
                break;
            };
            self.shedder
                .complete(p.done_ns, p.class, p.done_ns - p.sent_ns, p.in_flight);
            self.out.top_level = self.out.top_level.max(self.shedder.local_level());
        }
    }

    /// The shedder's decision on a request of `class` (its requests in flight if admitted).
    fn admit(&mut self, now: u64, class: Priority, enforce: bool, recorded: bool) -> Option<u64> {
        let in_flight = if enforce {
            match self.shedder.admit(now, class) {
                Admission::Admitted { in_flight } => Some(in_flight),
                Admission::Shed { .. } => None,
            }
        } else {
            Some(self.shedder.admit_unchecked(now, class))
        };
        self.out.top_level = self.out.top_level.max(self.shedder.local_level());
        if recorded {
            self.out.classes[class.rank()].sent += 1;
        }
        in_flight
    }

    /// An admitted request through the upstream's queue and a place, its answer on its way
    /// back.
    fn serve(&mut self, seq: u64, now: u64, class: Priority, in_flight: u64, recorded: bool) {
        let at_upstream = now + self.upstream.overhead_ns + self.jitter();
        let Some(Reverse(free)) = self.free_at.pop() else {
            return;
        };
        let start = free.max(at_upstream);
        let finish = start + self.upstream.service_ns;
        self.free_at.push(Reverse(finish));
        self.forget_started(at_upstream);
        if class == Priority::Critical && recorded {
            self.count_lower_ahead(at_upstream, class);
        }
        self.upstream_log.push_back((at_upstream, start, class));
        let done = finish + self.upstream.overhead_ns + self.jitter();
        if recorded {
            let c = &mut self.out.classes[class.rank()];
            c.admitted += 1;
            c.latencies_ns.push(done - now);
        }
        if (RECORDED_FROM..self.seconds * SEC).contains(&finish) {
            self.served += 1;
        }
        self.answers.push(Reverse(Pending {
            done_ns: done,
            seq,
            class,
            sent_ns: now,
            in_flight,
        }));
    }

    /// Drops the requests whose service started by `at_upstream`: only those still waiting
    /// can be ahead of a newcomer.
    fn forget_started(&mut self, at_upstream: u64) {
        while self
            .upstream_log
            .front()
            .is_some_and(|&(_, s, _)| s <= at_upstream)
        {
            self.upstream_log.pop_front();
        }
    }

    /// A request of `class` arriving at `at_upstream`: the lower-class requests waiting ahead.
    fn count_lower_ahead(&mut self, at_upstream: u64, class: Priority) {
        let ahead = self
            .upstream_log
            .iter()
            .filter(|&&(a, s, c)| a <= at_upstream && s > at_upstream && c < class)
            .count() as u64;
        self.out.critical_behind_lower += u64::from(ahead > 0);
        self.out.most_lower_ahead = self.out.most_lower_ahead.max(ahead);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Priority::*;

    fn config() -> ShedderConfig {
        ShedderConfig::default()
    }

    /// Critical's p99 with the upstream at a quarter of its capacity.
    fn unloaded_p99() -> u64 {
        let r = run(Upstream::DEMO, config(), true, 50, 11);
        r.classes[Critical.rank()].quantile_ns(0.99)
    }

    /// At the upstream's capacity nothing is shed outright: the limits turn away only what the
    /// upstream cannot take, the upstream stays busy and sheddable requests get in.
    #[test]
    fn at_capacity_the_upstream_stays_busy_and_sheddable_gets_in() {
        let r = run(Upstream::DEMO, config(), true, 200, 11);
        assert_eq!(r.top_level, 0, "{r:?}");
        assert!(r.served_per_s >= 180.0, "served {}/s", r.served_per_s);
        for class in Priority::ALL {
            let share = r.classes[class.rank()].admitted_share();
            assert!(share >= 0.9, "{class}: {share}");
        }
    }

    /// At four times its capacity, critical keeps at least 99% success with a p99 under twice
    /// its unloaded one, the lower classes take what is left (the upstream stays busy), and
    /// without shedding everyone's latency collapses.
    #[test]
    fn at_four_times_capacity_critical_keeps_its_latency() {
        let unloaded = unloaded_p99();
        let r = run(Upstream::DEMO, config(), true, 800, 11);
        let critical = &r.classes[Critical.rank()];
        assert!(
            critical.admitted_share() >= 0.99,
            "{}",
            critical.admitted_share()
        );
        let p99 = critical.quantile_ns(0.99);
        assert!(p99 < 2 * unloaded, "p99 {p99} against {unloaded} unloaded");
        assert!(r.served_per_s >= 180.0, "served {}/s", r.served_per_s);
        assert!(r.classes[Default.rank()].admitted > 0);
        let baseline = run(Upstream::DEMO, config(), false, 800, 11);
        assert!(baseline.classes[Critical.rank()].quantile_ns(0.99) > 10 * unloaded);
    }

    /// At twice the capacity the level sheds sheddable and probes it back every 3 s: critical
    /// has its own room (never refused for what lower classes hold), and a class let back in
    /// goes under the lower limit, which did not grow while it was shed, so it cannot flood the
    /// upstream's queue ahead of critical requests.
    #[test]
    fn a_class_let_back_in_does_not_queue_ahead_of_critical() {
        let unloaded = unloaded_p99();
        let r = run(Upstream::DEMO, config(), true, 400, 21);
        let critical = &r.classes[Critical.rank()];
        assert_eq!(critical.admitted, critical.sent);
        assert!(
            r.most_lower_ahead <= 2,
            "{} lower ahead",
            r.most_lower_ahead
        );
        let p99 = critical.quantile_ns(0.99);
        assert!(
            p99 * 2 < 3 * unloaded,
            "p99 {p99} against {unloaded} unloaded"
        );
        // Default is not shed outright: critical did not need it.
        assert_eq!(r.top_level, 1);
    }
}
