//! Property tests of the algorithms against plain reference models.
//! Failing cases are kept in `proptest-regressions/`.

use floodgate::algorithm::{SlidingLog, WindowState, fixed_window, gcra, sliding_window};
use floodgate::{Algorithm, Decision, Limit};
use proptest::prelude::*;

/// A plain token bucket, the textbook model GCRA must equal: `level` is the refill time of the
/// tokens available (one token = one interval), starting full, refilled continuously, capped.
struct TokenBucket {
    level_ns: u64,
    last_ns: u64,
    capacity_ns: u64,
    interval_ns: u64,
}

impl TokenBucket {
    fn new(limit: &Limit) -> Self {
        TokenBucket {
            level_ns: limit.capacity_ns(),
            last_ns: 0,
            capacity_ns: limit.capacity_ns(),
            interval_ns: limit.interval_ns(),
        }
    }

    fn take(&mut self, now_ns: u64, cost: u64) -> bool {
        self.level_ns = (self.level_ns + (now_ns - self.last_ns)).min(self.capacity_ns);
        self.last_ns = now_ns;
        let need = cost * self.interval_ns;
        if self.level_ns >= need {
            self.level_ns -= need;
            true
        } else {
            false
        }
    }
}

fn gcra_limit() -> impl Strategy<Value = Limit> {
    (1u64..50, 1_000_000u64..5_000_000_000, 1u64..40)
        .prop_map(|(rate, period, burst)| Limit::gcra(rate, period, burst).unwrap())
}

/// Arrivals as (gap before it, cost); gaps scale with the limit's period so both idle and busy
/// stretches occur.
fn arrivals(max_cost: u64) -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec((0u64..1_000, 0..=max_cost), 1..200)
}

fn gap_ns(limit: &Limit, permille: u64) -> u64 {
    // Mostly short gaps (busy), sometimes up to two periods (idle).
    if permille < 900 {
        limit.interval_ns() * permille / 900
    } else {
        limit.period_ns() * 2 * (permille - 900) / 100
    }
}

proptest! {
    /// GCRA decides exactly as the plain token bucket on any arrival sequence.
    #[test]
    fn gcra_equals_a_token_bucket(limit in gcra_limit(), arrivals in arrivals(45)) {
        let mut model = TokenBucket::new(&limit);
        let (mut tat, mut now) = (0u64, 1_000_000_000u64);
        model.last_ns = now;
        for (gap, cost) in arrivals {
            now += gap_ns(&limit, gap);
            let (decision, new_tat) = gcra::decide(&limit, tat, now, cost);
            let expected = if cost > limit.burst() { false } else { model.take(now, cost) };
            prop_assert_eq!(decision.is_allowed(), expected, "cost {} at {}", cost, now);
            if cost > limit.burst() {
                prop_assert_eq!(decision, Decision::CostExceedsBurst { burst: limit.burst() });
            }
            tat = new_tat.unwrap_or(tat);
        }
    }

    /// In any interval of length `period`, GCRA admits at most `burst + rate` units.
    #[test]
    fn gcra_never_admits_more_than_burst_plus_rate_per_period(limit in gcra_limit(), arrivals in arrivals(3)) {
        let (mut tat, mut now) = (0u64, 0u64);
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for (gap, cost) in arrivals {
            now += gap_ns(&limit, gap) / 4;
            let (d, new_tat) = gcra::decide(&limit, tat, now, cost);
            if d.is_allowed() && cost > 0 {
                admitted.push((now, cost));
            }
            tat = new_tat.unwrap_or(tat);
        }
        for (i, &(start, _)) in admitted.iter().enumerate() {
            let in_window: u64 = admitted[i..].iter().take_while(|(t, _)| *t <= start + limit.period_ns()).map(|(_, c)| c).sum();
            prop_assert!(in_window <= limit.burst() + limit.rate(), "{} units in one period from {}", in_window, start);
        }
    }

    /// However long a bucket stays idle, it never holds more than `burst`.
    #[test]
    fn an_idle_bucket_never_refills_past_burst(limit in gcra_limit(), used in 0u64..40, idle in 0u64..u32::MAX as u64 * 1000) {
        let now = 10_000_000_000;
        let used = used.min(limit.burst());
        let (_, tat) = gcra::decide(&limit, 0, now, used);
        let (d, _) = gcra::decide(&limit, tat.unwrap_or(0), now + idle, 0);
        prop_assert!(d.remaining() <= limit.burst());
        prop_assert!(!gcra::decide(&limit, tat.unwrap_or(0), now + idle, limit.burst() + 1).0.is_allowed());
    }

    /// A full bucket admits exactly `burst` single units at one instant, then denies.
    #[test]
    fn a_full_bucket_admits_exactly_burst_at_once(limit in gcra_limit()) {
        let (mut tat, now) = (0u64, 7_000_000_000u64);
        let mut allowed = 0;
        for _ in 0..limit.burst() + 5 {
            let (d, new_tat) = gcra::decide(&limit, tat, now, 1);
            allowed += u64::from(d.is_allowed());
            tat = new_tat.unwrap_or(tat);
        }
        prop_assert_eq!(allowed, limit.burst());
    }

    /// For every algorithm, `retry_after` is exact: with no other traffic, the same check passes at
    /// `now + retry_after` and not one nanosecond earlier.
    #[test]
    fn retry_after_is_exact(
        algorithm in prop::sample::select(Algorithm::ALL.to_vec()),
        rate in 1u64..30,
        period in 1_000_000u64..3_000_000_000,
        arrivals in arrivals(30),
    ) {
        let limit = Limit::new(algorithm, rate, period, rate).unwrap();
        let mut bucket = Bucket::new(limit);
        let mut now = 5 * period;
        for (gap, cost) in arrivals {
            now += gap_ns(&limit, gap);
            let decision = bucket.peek_cost(now, cost);
            if let Decision::Denied { retry_after_ns, .. } = decision {
                prop_assert!(retry_after_ns > 0);
                prop_assert!(bucket.peek_cost(now + retry_after_ns, cost).is_allowed(), "{:?} retry at +{}", decision, retry_after_ns);
                prop_assert!(!bucket.peek_cost(now + retry_after_ns - 1, cost).is_allowed(), "{:?} passes 1 ns early", decision);
            }
            bucket.take(now, cost);
        }
    }
}

/// One bucket of any algorithm, driven through the pure functions.
enum Bucket {
    Gcra(Limit, u64),
    Window(Limit, WindowState),
    Log(Limit, SlidingLog),
}

impl Bucket {
    fn new(limit: Limit) -> Self {
        match limit.algorithm() {
            Algorithm::Gcra => Bucket::Gcra(limit, 0),
            Algorithm::SlidingLog => Bucket::Log(limit, SlidingLog::default()),
            _ => Bucket::Window(limit, WindowState::default()),
        }
    }

    fn window_decide(
        limit: &Limit,
        state: &WindowState,
        now: u64,
        cost: u64,
    ) -> (Decision, Option<WindowState>) {
        match limit.algorithm() {
            Algorithm::FixedWindow => fixed_window::decide(limit, state, now, cost),
            _ => sliding_window::decide(limit, state, now, cost),
        }
    }

    /// What `cost` would get at `now`, without recording it.
    fn peek_cost(&self, now: u64, cost: u64) -> Decision {
        match self {
            Bucket::Gcra(l, tat) => gcra::decide(l, *tat, now, cost).0,
            Bucket::Window(l, s) => Self::window_decide(l, s, now, cost).0,
            Bucket::Log(l, log) => log.clone().decide(l, now, cost),
        }
    }

    fn take(&mut self, now: u64, cost: u64) {
        match self {
            Bucket::Gcra(l, tat) => *tat = gcra::decide(l, *tat, now, cost).1.unwrap_or(*tat),
            Bucket::Window(l, s) => *s = Self::window_decide(l, s, now, cost).1.unwrap_or(*s),
            Bucket::Log(l, log) => {
                log.decide(l, now, cost);
            }
        }
    }
}

proptest! {
    /// A merged sliding log is at least as strict as each copy at every later moment (as many
    /// entries in the period as the fuller copy then), and merging a copy with itself changes
    /// nothing.
    #[test]
    fn a_merged_sliding_log_is_as_strict_as_either_copy_from_then_on(
        a in proptest::collection::vec((0u64..2_000, 1u64..3), 0..12),
        b in proptest::collection::vec((0u64..2_000, 1u64..3), 0..12),
        probes in proptest::collection::vec(0u64..3_000, 1..8),
    ) {
        const MS: u64 = 1_000_000;
        let limit = Limit::new(Algorithm::SlidingLog, 8, 1_000 * MS, 8).unwrap();
        let fill = |arrivals: &[(u64, u64)]| {
            let mut arrivals = arrivals.to_vec();
            arrivals.sort_unstable();
            let mut log = SlidingLog::default();
            for (at, cost) in arrivals {
                log.decide(&limit, at * MS, cost);
            }
            log
        };
        let (mine, theirs) = (fill(&a), fill(&b));
        let merge_at = 2_000 * MS;
        let mut merged = mine.clone();
        merged.merge(&limit, theirs.clone(), merge_at);
        let mut itself = mine.clone();
        itself.merge(&limit, mine.clone(), merge_at);
        let mut expected_itself = mine.clone();
        expected_itself.forget_expired(&limit, merge_at);
        prop_assert_eq!(itself, expected_itself);
        for probe in probes {
            let now = merge_at + probe * MS;
            let remaining = |log: &SlidingLog| log.clone().decide(&limit, now, 0).remaining();
            let merged_left = remaining(&merged);
            prop_assert!(merged_left <= remaining(&mine), "{} > mine at +{}ms", merged_left, probe);
            prop_assert!(merged_left <= remaining(&theirs), "{} > theirs at +{}ms", merged_left, probe);
        }
    }
}
