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
    let mut shedder = Shedder::new(config, 0);
    let mut out = Run::default();
    let interval = SEC / rate.max(1);
    let total = seconds * SEC / interval;
    let recorded_from = SEC;
    let mut free_at: BinaryHeap<Reverse<u64>> = (0..upstream.places).map(|_| Reverse(0)).collect();
    let mut answers: BinaryHeap<Reverse<Pending>> = BinaryHeap::new();
    // Admitted requests by arrival at the upstream: (arrival, start of service, class).
    let mut upstream_log: VecDeque<(u64, u64, Priority)> = VecDeque::new();
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut jitter = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % upstream.jitter_ns.max(1)
    };
    let mut served = 0u64;
    for i in 0..total {
        let now = i * interval;
        while let Some(Reverse(p)) = answers.peek() {
            if p.done_ns > now {
                break;
            }
            let Some(Reverse(p)) = answers.pop() else {
                break;
            };
            shedder.complete(p.done_ns, p.class, p.done_ns - p.sent_ns, p.in_flight);
            out.top_level = out.top_level.max(shedder.local_level());
        }
        shedder.tick(now);
        let class = MIX[(i % MIX.len() as u64) as usize];
        let recorded = now >= recorded_from;
        let in_flight = if enforce {
            match shedder.admit(now, class) {
                Admission::Admitted { in_flight } => Some(in_flight),
                Admission::Shed { .. } => None,
            }
        } else {
            Some(shedder.admit_unchecked(now, class))
        };
        out.top_level = out.top_level.max(shedder.local_level());
        let c = &mut out.classes[class.rank()];
        if recorded {
            c.sent += 1;
        }
        let Some(in_flight) = in_flight else { continue };
        let at_upstream = now + upstream.overhead_ns + jitter();
        let Some(Reverse(free)) = free_at.pop() else {
            continue;
        };
        let start = free.max(at_upstream);
        let finish = start + upstream.service_ns;
        free_at.push(Reverse(finish));
        while upstream_log
            .front()
            .is_some_and(|&(_, s, _)| s <= at_upstream)
        {
            upstream_log.pop_front();
        }
        if class == Priority::Critical && recorded {
            let ahead = upstream_log
                .iter()
                .filter(|&&(a, s, c)| a <= at_upstream && s > at_upstream && c < class)
                .count() as u64;
            out.critical_behind_lower += u64::from(ahead > 0);
            out.most_lower_ahead = out.most_lower_ahead.max(ahead);
        }
        upstream_log.push_back((at_upstream, start, class));
        let done = finish + upstream.overhead_ns + jitter();
        if recorded {
            c.admitted += 1;
            c.latencies_ns.push(done - now);
        }
        if (recorded_from..seconds * SEC).contains(&finish) {
            served += 1;
        }
        answers.push(Reverse(Pending {
            done_ns: done,
            seq: i,
            class,
            sent_ns: now,
            in_flight,
        }));
    }
    out.served_per_s = served as f64 / (seconds - 1) as f64;
    out
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
