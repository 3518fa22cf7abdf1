//! The known keys every scenario drives: their algorithms, limits, failure modes and offered
//! rates, and how many admissions each limit allows in one window.

use floodgate::region::Scope;
use floodgate::{Algorithm, Limit};
use floodgate_client::FailureMode;

const SECOND_NS: u64 = 1_000_000_000;

/// One key under load and what the checker holds it to.
#[derive(Debug, Clone)]
pub struct KeySpec {
    pub name: String,
    /// Every limit the key is checked at during the run (more than one only when the rules
    /// change under load); the first is the one in force at the start.
    pub limits: Vec<Limit>,
    pub failure_mode: FailureMode,
    /// Checks per second offered across all gateways that drive it: above the limit, so it
    /// binds.
    pub offered_per_second: f64,
    /// The one region whose gateways drive it (`None`: every gateway).
    pub region: Option<usize>,
    /// How its checks are scoped: `Region` (the default, exact in its region) or `Global` (one
    /// limit shared by every region, held to the documented global bound, see `bounds`).
    pub scope: Scope,
    /// Most tokens the gateways driving it hold in token leases at once (0: not leased). Leased
    /// tokens are taken from the bucket before they are used, so a window may see up to this
    /// many more admissions than the bucket alone allows in it (never more over the run).
    pub lease_extra: u64,
    /// Offered only at times (`None`: all the time).
    pub pulse: Option<Pulse>,
}

/// An on/off load pattern: the key is offered only while its region is on, region `r`'s on
/// time starting `r x region_lag_ns` after region 0's, every `period_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pulse {
    pub period_ns: u64,
    pub on_ns: u64,
    pub region_lag_ns: u64,
}

impl Pulse {
    /// Whether gateways of `region` offer the key `at_ns` into the run.
    pub fn is_on(&self, region: usize, at_ns: u64) -> bool {
        let lag = region as u64 * self.region_lag_ns;
        at_ns >= lag && (at_ns - lag) % self.period_ns.max(1) < self.on_ns
    }
}

impl KeySpec {
    /// The period of the key's own aligned windows when it is judged on them: a key with one
    /// limit of a window algorithm (fixed or sliding window), whose count in each window
    /// `[k x period, (k + 1) x period)` of Unix time is at most the limit. `None`: judged over
    /// every window of its period, whatever its start.
    pub fn aligned_period_ns(&self) -> Option<u64> {
        match self.limits.as_slice() {
            [limit]
                if matches!(
                    limit.algorithm(),
                    Algorithm::FixedWindow | Algorithm::SlidingWindow
                ) =>
            {
                Some(limit.period_ns())
            }
            _ => None,
        }
    }

    /// The window the checker counts in: the longest period of its limits.
    pub fn window_ns(&self) -> u64 {
        self.limits
            .iter()
            .map(Limit::period_ns)
            .max()
            .unwrap_or(SECOND_NS)
    }

    /// Most admissions the limits allow in any window of [`KeySpec::window_ns`]:
    /// GCRA `burst + rate` per period (a bucket refilled while the window runs), sliding log
    /// `rate` (exact). A key judged on its own aligned windows (one fixed or sliding window
    /// limit, [`KeySpec::aligned_period_ns`]): `rate` per aligned window (the sliding window's
    /// estimate is at least the current window's count). Across limit changes, the largest
    /// burst plus the fastest rate over the window, where a window algorithm counts `2 x rate`
    /// (a window of one period, any start, meets two aligned windows).
    pub fn allowed_per_window(&self) -> u64 {
        if let (Some(_), [limit]) = (self.aligned_period_ns(), self.limits.as_slice()) {
            return limit.burst();
        }
        let window = self.window_ns();
        let mut most_burst = 0u64;
        let mut fastest = 0f64;
        for limit in &self.limits {
            let per_window = limit.rate() as f64 * window as f64 / limit.period_ns().max(1) as f64;
            let (burst, rate) = match limit.algorithm() {
                Algorithm::Gcra => (limit.burst(), per_window),
                Algorithm::SlidingLog => (0, per_window),
                Algorithm::FixedWindow | Algorithm::SlidingWindow => (0, 2.0 * per_window),
            };
            most_burst = most_burst.max(burst);
            fastest = fastest.max(rate);
        }
        most_burst + fastest.ceil() as u64
    }

    /// One burst of the key (GCRA's burst, a window's count): the unit of documented
    /// over-admission on a crash.
    pub fn burst(&self) -> u64 {
        self.limits
            .iter()
            .map(|l| match l.algorithm() {
                Algorithm::Gcra => l.burst(),
                _ => l.rate(),
            })
            .max()
            .unwrap_or(0)
    }

    /// Units the key's fastest limit refills in `ns`.
    pub fn rate_over(&self, ns: u64) -> f64 {
        self.limits
            .iter()
            .map(|l| l.rate() as f64 * ns as f64 / l.period_ns().max(1) as f64)
            .fold(0.0, f64::max)
    }

    pub fn describe(&self) -> String {
        let limits: Vec<String> = self.limits.iter().map(ToString::to_string).collect();
        format!("{} {}", self.name, limits.join(" -> "))
    }
}

fn limit(algorithm: Algorithm, rate: u64, period_ns: u64, burst: u64) -> Limit {
    Limit::new(algorithm, rate, period_ns, burst)
        .unwrap_or_else(|e| panic!("the key table's limits are valid: {e}"))
}

/// With several regions, each key once per region, driven by that region's gateways only
/// (`NAME@rR`): a key of the default `region` scope is decided in each region on its own, exact
/// there, so the checker holds each region's copy to the limit. (A global key shared across
/// regions has a looser, documented bound; the core's region simulation and the in-process
/// region tests measure it.)
pub fn per_region(keys: Vec<KeySpec>, regions: usize) -> Vec<KeySpec> {
    if regions <= 1 {
        return keys;
    }
    keys.iter()
        .flat_map(|key| {
            (0..regions).map(move |region| KeySpec {
                name: format!("{}@r{region}", key.name),
                region: Some(region),
                ..key.clone()
            })
        })
        .collect()
}

/// With several regions, a few keys of `scope: global` driven by every gateway of every region
/// (one limit shared by all regions): a GCRA, a fixed window and a sliding log, each offered
/// three times its limit in all. Few, since the host has two cores. None with one region.
pub fn global_keys(regions: usize) -> Vec<KeySpec> {
    if regions <= 1 {
        return Vec::new();
    }
    [
        (
            "chaos:global:gcra",
            limit(Algorithm::Gcra, 20, SECOND_NS, 20),
        ),
        (
            "chaos:global:fixed",
            limit(Algorithm::FixedWindow, 25, SECOND_NS, 25),
        ),
        (
            "chaos:global:log",
            limit(Algorithm::SlidingLog, 25, SECOND_NS, 25),
        ),
    ]
    .into_iter()
    .map(|(name, limit)| KeySpec {
        name: name.to_owned(),
        offered_per_second: 3.0 * limit.rate() as f64 * SECOND_NS as f64 / limit.period_ns() as f64,
        limits: vec![limit],
        failure_mode: FailureMode::Open,
        region: None,
        scope: Scope::Global,
        lease_extra: 0,
        pulse: None,
    })
    .collect()
}

/// Checks a second (per gateway, per key) from which the lease scenario's gateways lease a key:
/// its hot keys pass it, the standard keys (a few dozen a second in all) do not.
pub const LEASE_HOT_ABOVE_PER_SEC: u64 = 100;

/// Hot keys for the token-lease scenario: two GCRA keys of 200/s (burst 200), each offered three
/// times its limit by the `gateways` that drive it (per region), which lease its tokens. Their
/// per-window allowance grows by the tokens those gateways may hold at once.
pub fn lease_keys(gateways: usize) -> Vec<KeySpec> {
    let limit = limit(Algorithm::Gcra, 200, SECOND_NS, 200);
    let most_held = floodgate::token_lease::LeaseSizing::default().most_held(&limit);
    (0..2)
        .map(|i| KeySpec {
            name: format!("chaos:lease:{i}"),
            limits: vec![limit],
            failure_mode: FailureMode::Open,
            offered_per_second: 600.0,
            region: None,
            scope: Scope::Region,
            lease_extra: gateways as u64 * most_held,
            pulse: None,
        })
        .collect()
}

/// The standard key set: GCRA keys failing open and closed, a sliding log (exact) and a fixed
/// window, each offered about three times its limit.
pub fn standard_keys() -> Vec<KeySpec> {
    let mut keys = Vec::new();
    let mut add = |name: &str, limit: Limit, mode: FailureMode| {
        let offered = 3.0 * limit.rate() as f64 * SECOND_NS as f64 / limit.period_ns() as f64;
        keys.push(KeySpec {
            name: name.to_owned(),
            limits: vec![limit],
            failure_mode: mode,
            offered_per_second: offered,
            region: None,
            scope: Scope::Region,
            lease_extra: 0,
            pulse: None,
        });
    };
    for i in 0..4 {
        add(
            &format!("chaos:gcra:{i}"),
            limit(Algorithm::Gcra, 20, SECOND_NS, 20),
            FailureMode::Open,
        );
    }
    for i in 0..2 {
        add(
            &format!("chaos:gcra-small-burst:{i}"),
            limit(Algorithm::Gcra, 40, SECOND_NS, 5),
            FailureMode::Open,
        );
    }
    for i in 0..2 {
        add(
            &format!("chaos:closed:{i}"),
            limit(Algorithm::Gcra, 20, SECOND_NS, 20),
            FailureMode::Closed,
        );
    }
    for i in 0..2 {
        add(
            &format!("chaos:log:{i}"),
            limit(Algorithm::SlidingLog, 25, SECOND_NS, 25),
            FailureMode::Open,
        );
    }
    for i in 0..2 {
        add(
            &format!("chaos:fixed:{i}"),
            limit(Algorithm::FixedWindow, 25, SECOND_NS, 25),
            FailureMode::Open,
        );
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_per_window_follows_each_algorithm() {
        let key = |l: Limit| KeySpec {
            name: "k".into(),
            limits: vec![l],
            failure_mode: FailureMode::Open,
            offered_per_second: 1.0,
            region: None,
            scope: Scope::Region,
            lease_extra: 0,
            pulse: None,
        };
        assert_eq!(
            key(limit(Algorithm::Gcra, 20, SECOND_NS, 5)).allowed_per_window(),
            25
        );
        assert_eq!(
            key(limit(Algorithm::SlidingLog, 25, SECOND_NS, 25)).allowed_per_window(),
            25
        );
        // Judged on their own aligned windows: the limit in each.
        let fixed = key(limit(Algorithm::FixedWindow, 25, SECOND_NS, 25));
        assert_eq!(fixed.aligned_period_ns(), Some(SECOND_NS));
        assert_eq!(fixed.allowed_per_window(), 25);
        let sliding = key(limit(Algorithm::SlidingWindow, 25, SECOND_NS, 25));
        assert_eq!(sliding.allowed_per_window(), 25);
        assert_eq!(
            key(limit(Algorithm::Gcra, 20, SECOND_NS, 5)).aligned_period_ns(),
            None
        );
    }

    #[test]
    fn a_pulse_is_on_for_its_share_of_each_period_later_in_later_regions() {
        let pulse = Pulse {
            period_ns: 10,
            on_ns: 4,
            region_lag_ns: 2,
        };
        let on = |region, at| pulse.is_on(region, at);
        assert!(on(0, 0) && on(0, 3) && !on(0, 4) && !on(0, 9) && on(0, 10));
        assert!(!on(1, 0) && !on(1, 1) && on(1, 2) && on(1, 5) && !on(1, 6) && on(1, 12));
    }

    #[test]
    fn a_period_change_counts_in_the_longest_window_at_the_fastest_rate() {
        let key = KeySpec {
            name: "k".into(),
            limits: vec![
                limit(Algorithm::Gcra, 20, SECOND_NS, 20),
                limit(Algorithm::Gcra, 60, 2 * SECOND_NS, 30),
            ],
            failure_mode: FailureMode::Open,
            offered_per_second: 1.0,
            region: None,
            scope: Scope::Region,
            lease_extra: 0,
            pulse: None,
        };
        assert_eq!(key.window_ns(), 2 * SECOND_NS);
        // Burst 30, and 30/s over 2 s beats 20/s over 2 s.
        assert_eq!(key.allowed_per_window(), 30 + 60);
    }

    #[test]
    fn several_regions_get_one_copy_of_each_key_each() {
        let keys = standard_keys();
        assert_eq!(per_region(keys.clone(), 1).len(), keys.len());
        let split = per_region(keys.clone(), 2);
        assert_eq!(split.len(), 2 * keys.len());
        assert_eq!(split[1].name, format!("{}@r1", keys[0].name));
        assert_eq!(split[1].region, Some(1));
    }

    #[test]
    fn global_keys_come_only_with_several_regions_and_take_every_gateway() {
        assert!(global_keys(1).is_empty());
        let global = global_keys(2);
        assert_eq!(global.len(), 3);
        assert!(
            global
                .iter()
                .all(|k| k.scope == Scope::Global && k.region.is_none())
        );
    }
}
