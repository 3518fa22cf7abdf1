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

/// What a metered key sees: checks that take, peeks that take nothing, and charges after the
/// fact that may leave it owing.
#[derive(Debug, Clone, Copy)]
enum Metered {
    Take(u64),
    Peek(u64),
    Charge(u64),
}

fn metered_ops() -> impl Strategy<Value = Vec<(u64, Metered)>> {
    let op = prop_oneof![
        (0u64..=45).prop_map(Metered::Take),
        (0u64..=45).prop_map(Metered::Peek),
        (0u64..=120).prop_map(Metered::Charge),
    ];
    prop::collection::vec((0u64..1_000, op), 1..200)
}

/// A token bucket that may owe: the plain model of GCRA with metered charges. `level` is the
/// refill time of the tokens available, between one capacity owed (`-capacity`) and full; a
/// charge takes whole tokens down to that floor and forgives the rest.
struct OwingBucket {
    level_ns: i128,
    last_ns: u64,
    capacity_ns: i128,
    interval_ns: i128,
}

impl OwingBucket {
    fn refill(&mut self, now_ns: u64) {
        self.level_ns = (self.level_ns + i128::from(now_ns - self.last_ns)).min(self.capacity_ns);
        self.last_ns = now_ns;
    }

    fn passes(&self, cost: u64) -> bool {
        self.level_ns >= i128::from(cost) * self.interval_ns
    }

    /// Takes up to `cost` whole tokens, never below one capacity owed; returns those forgiven.
    fn charge(&mut self, cost: u64) -> u64 {
        let room = ((self.level_ns + self.capacity_ns) / self.interval_ns).max(0) as u64;
        let taken = cost.min(room);
        self.level_ns -= i128::from(taken) * self.interval_ns;
        cost - taken
    }
}

/// A fixed window that may owe: the plain model, a count per window, up to twice the limit.
struct OwingWindow {
    window: u64,
    count: u64,
    limit: u64,
    period_ns: u64,
}

impl OwingWindow {
    fn roll(&mut self, now_ns: u64) {
        if now_ns / self.period_ns != self.window {
            self.window = now_ns / self.period_ns;
            self.count = 0;
        }
    }
}

proptest! {
    /// GCRA with checks, peeks and charges decides exactly as a token bucket that may owe one
    /// capacity, forgives exactly what that bucket cannot owe, and every denial's wait is exact.
    #[test]
    fn gcra_with_charges_equals_a_token_bucket_that_may_owe(limit in gcra_limit(), ops in metered_ops()) {
        let mut model = OwingBucket {
            level_ns: i128::from(limit.capacity_ns()),
            last_ns: 1_000_000_000,
            capacity_ns: i128::from(limit.capacity_ns()),
            interval_ns: i128::from(limit.interval_ns()),
        };
        let (mut tat, mut now) = (0u64, model.last_ns);
        for (gap, op) in ops {
            now += gap_ns(&limit, gap);
            model.refill(now);
            match op {
                Metered::Take(cost) | Metered::Peek(cost) => {
                    let (decision, new_tat) = gcra::decide(&limit, tat, now, cost);
                    let expected = cost <= limit.burst() && model.passes(cost);
                    prop_assert_eq!(decision.is_allowed(), expected, "{:?} at {}", op, now);
                    if let (false, Some(wait)) = (decision.is_allowed(), decision.retry_after_ns()) {
                        prop_assert!(gcra::decide(&limit, tat, now + wait, cost).0.is_allowed());
                        prop_assert!(!gcra::decide(&limit, tat, now + wait - 1, cost).0.is_allowed());
                        prop_assert!(wait <= gcra::most_ahead_ns(&limit));
                    }
                    if expected && matches!(op, Metered::Take(_)) {
                        model.level_ns -= i128::from(cost) * model.interval_ns;
                        tat = new_tat.unwrap_or(tat);
                    }
                }
                Metered::Charge(cost) => {
                    let (new_tat, forgiven) = gcra::charge(&limit, tat, now, cost);
                    prop_assert_eq!(forgiven, model.charge(cost), "{:?} at {}", op, now);
                    tat = new_tat;
                }
            }
        }
    }

    /// A fixed window with checks, peeks and charges decides exactly as a count per window that
    /// may reach twice the limit, and a denial waits exactly for the window's end.
    #[test]
    fn fixed_window_with_charges_equals_a_count_that_may_owe(rate in 1u64..40, ops in metered_ops()) {
        let limit = Limit::window(Algorithm::FixedWindow, rate, 1_000_000_000).unwrap();
        let mut model = OwingWindow { window: 0, count: 0, limit: rate, period_ns: limit.period_ns() };
        let (mut state, mut now) = (WindowState::default(), 1_000_000_000u64);
        for (gap, op) in ops {
            now += gap * 2_000_000;
            model.roll(now);
            match op {
                Metered::Take(cost) | Metered::Peek(cost) => {
                    let (decision, new_state) = fixed_window::decide(&limit, &state, now, cost);
                    let expected = cost <= rate && model.count + cost <= rate;
                    prop_assert_eq!(decision.is_allowed(), expected, "{:?} at {}", op, now);
                    if let (false, Some(wait)) = (decision.is_allowed(), decision.retry_after_ns()) {
                        prop_assert_eq!(now + wait, (model.window + 1) * model.period_ns);
                    }
                    if expected && matches!(op, Metered::Take(_)) {
                        model.count += cost;
                        state = new_state.unwrap_or(state);
                    }
                }
                Metered::Charge(cost) => {
                    let (new_state, forgiven) = state.charge(&limit, now, cost);
                    let taken = cost.min(2 * model.limit - model.count);
                    model.count += taken;
                    prop_assert_eq!(forgiven, cost - taken);
                    state = new_state;
                }
            }
        }
    }

    /// A sliding log's peek answers what its check would, and after charges the log holds at
    /// most twice its limit: every unit charged within the period, up to that bound.
    #[test]
    fn a_sliding_log_with_charges_owes_at_most_its_limit(rate in 1u64..40, ops in metered_ops()) {
        let limit = Limit::window(Algorithm::SlidingLog, rate, 1_000_000_000).unwrap();
        let mut log = SlidingLog::default();
        let mut now = 1_000_000_000u64;
        let mut recent: Vec<u64> = Vec::new();
        for (gap, op) in ops {
            now += gap * 2_000_000;
            recent.retain(|&t| t + limit.period_ns() > now);
            match op {
                Metered::Take(cost) | Metered::Peek(cost) => {
                    let peeked = log.peek(&limit, now, cost);
                    let expected = cost <= rate && recent.len() as u64 + cost <= rate;
                    prop_assert_eq!(peeked.is_allowed(), expected);
                    if matches!(op, Metered::Take(_)) {
                        prop_assert_eq!(log.decide(&limit, now, cost), peeked);
                        if expected {
                            recent.extend(std::iter::repeat_n(now, cost as usize));
                        }
                    }
                }
                Metered::Charge(cost) => {
                    let forgiven = log.charge(&limit, now, cost);
                    let taken = cost.min((2 * rate).saturating_sub(recent.len() as u64));
                    prop_assert_eq!(forgiven, cost - taken);
                    recent.extend(std::iter::repeat_n(now, taken as usize));
                }
            }
            let live = log.times().filter(|&t| t + limit.period_ns() > now).count();
            prop_assert_eq!(live, recent.len());
        }
    }
}
