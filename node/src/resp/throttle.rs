//! `CL.THROTTLE`'s arithmetic: redis-cell 0.2.2's arguments onto a floodgate GCRA limit and cost, and a decision back into its reply of five integers.
//!
//! redis-cell's GCRA: the emission interval `T = period_ns / count` (an `f64` division truncated
//! to whole nanoseconds), the tolerance `tau = T * (max_burst + 1)`, and a quantity `q` passes
//! when the debt (the stored arrival time minus now, at least 0) plus `q * T` is at most `tau`.
//! That is floodgate's GCRA with `burst = max_burst + 1` and `interval = T`, so the limit is built
//! with exactly that interval (`k` units per `k * T`, `k` large enough for floodgate's shortest
//! period): the decisions, the stored arrival time and every duration are the same to the
//! nanosecond. The reply is computed from them as redis-cell computes it: `remaining` from
//! microseconds in `f64`, seconds truncated.
//!
//! Two differences, both outside redis-cell's well-defined use:
//! - a quantity above `max_burst + 1` is refused by redis-cell without touching the bucket; here it
//!   is sent as a peek (cost 0), which reads the same debt;
//! - a key reused with a smaller limit: floodgate reads a debt above the new capacity as a
//!   full-debt bucket of the new limit (so no wait exceeds what the limit allows), where
//!   redis-cell keeps the whole debt. Reused with a limit as large or larger, both agree.
//!
//! Arguments for which redis-cell has no meaningful answer (a negative burst or quantity, a
//! count or period below 1, which give it a zero or negative interval, and periods that crash
//! it) are refused with an error here.

use floodgate::limit::MAX_CAPACITY_NS;
use floodgate::{Decision, Limit, MAX_BURST, MAX_PERIOD_NS, MIN_PERIOD_NS};

/// redis-cell's answer to a wrong number of arguments, word for word.
pub(crate) const USAGE: &str =
    "Cell error: Usage: cl.throttle <key> <max_burst> <count per period> <period> [<quantity>]";

const NANOS_PER_SEC: i64 = 1_000_000_000;

/// One `CL.THROTTLE`, ready to be checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Throttle {
    pub(crate) key: Vec<u8>,
    /// `max_burst + 1` per `tau`, with redis-cell's interval exactly.
    pub(crate) limit: Limit,
    /// What the check takes: the quantity, or 0 for a quantity that can never pass.
    pub(crate) cost: u64,
    /// The quantity is above `max_burst + 1`: limited whatever the bucket holds.
    pub(crate) never: bool,
}

/// redis-cell's parse of an integer argument: Rust's `i64` syntax (an optional sign, digits).
fn integer(arg: &[u8]) -> Result<i64, String> {
    std::str::from_utf8(arg)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or_else(|| {
            format!(
                "Cell error: Couldn't parse as integer: {}",
                String::from_utf8_lossy(arg)
            )
        })
}

/// redis-cell's emission interval in nanoseconds, or `None` where it has none to speak of.
pub(crate) fn emission_interval_ns(count: i64, period_s: i64) -> Option<i64> {
    let period_ns = period_s.checked_mul(NANOS_PER_SEC)?;
    // Exactly redis-cell's expression: float division, truncated (saturating) to an integer.
    let interval = ((period_ns as f64) / (count as f64)) as i64;
    (count >= 1 && period_s >= 1 && interval >= 1).then_some(interval)
}

/// The arguments after the command name, as redis-cell reads them (in order, each error as it
/// words it), or the error reply's text.
pub(crate) fn parse(args: &[Vec<u8>], max_key_bytes: usize) -> Result<Throttle, String> {
    if args.len() != 4 && args.len() != 5 {
        return Err(USAGE.to_owned());
    }
    let max_burst = integer(&args[1])?;
    let count = integer(&args[2])?;
    let period = integer(&args[3])?;
    let quantity = match args.get(4) {
        Some(arg) => integer(arg)?,
        None => 1,
    };
    let key = &args[0];
    if key.len() > max_key_bytes {
        return Err(format!(
            "Cell error: key of {} bytes; floodgate's keys are at most {max_key_bytes}",
            key.len()
        ));
    }
    if max_burst < 0 || quantity < 0 {
        return Err("Cell error: floodgate needs max_burst and quantity of at least 0".to_owned());
    }
    let interval = emission_interval_ns(count, period)
        .and_then(|t| u64::try_from(t).ok())
        .filter(|&t| t <= MAX_PERIOD_NS)
        .ok_or_else(|| {
            "Cell error: floodgate needs count per period and period of at least 1, and \
             period / count per period between 1 ns and 366 days"
                .to_owned()
        })?;
    let burst = max_burst as u64 + 1;
    let limit = limit_of(interval, burst).ok_or_else(|| {
        format!(
            "Cell error: floodgate needs max_burst below {MAX_BURST} and (max_burst + 1) * \
             period / count per period within {} days",
            MAX_CAPACITY_NS / (86_400 * NANOS_PER_SEC as u64)
        )
    })?;
    let quantity = quantity as u64;
    let never = quantity > burst;
    Ok(Throttle {
        key: key.clone(),
        limit,
        cost: if never { 0 } else { quantity },
        never,
    })
}

/// A GCRA limit of `burst` whose interval is exactly `interval_ns`: `k` units per `k *
/// interval_ns`, `k` the least making the period floodgate's shortest or longer (floodgate's
/// interval is the period divided by the rate, rounded up, which is then exact).
fn limit_of(interval_ns: u64, burst: u64) -> Option<Limit> {
    let k = MIN_PERIOD_NS.div_ceil(interval_ns).max(1);
    let limit = Limit::gcra(k, k.checked_mul(interval_ns)?, burst).ok()?;
    (limit.interval_ns() == interval_ns).then_some(limit)
}

/// redis-cell's `remaining`: `tau - ttl` and `T` truncated to microseconds, divided in `f64`
/// and truncated (a `T` under a microsecond divides by zero, as it does there).
fn remaining(tau_ns: i64, ttl_ns: i64, interval_ns: i64) -> i64 {
    let next = tau_ns - ttl_ns;
    if next > -interval_ns {
        ((next / 1_000) as f64 / (interval_ns / 1_000) as f64) as i64
    } else {
        0
    }
}

fn whole_seconds(ns: u64) -> i64 {
    i64::try_from(ns).unwrap_or(i64::MAX) / NANOS_PER_SEC
}

/// The reply to `throttle` given what its check decided: limited (0 or 1), the limit
/// (`max_burst + 1`), remaining, retry after (seconds, or -1), reset after (seconds).
pub(crate) fn reply(throttle: &Throttle, decision: &Decision) -> [i64; 5] {
    let limit = &throttle.limit;
    // All within `MAX_CAPACITY_NS`, so within `i64`.
    let interval = limit.interval_ns() as i64;
    let tau = limit.capacity_ns() as i64;
    let burst = limit.burst() as i64;
    let ttl = decision.reset_after_ns();
    let left = remaining(tau, ttl as i64, interval);
    match (throttle.never, *decision) {
        (false, Decision::Allowed { .. }) => [0, burst, left, -1, whole_seconds(ttl)],
        (false, Decision::Denied { retry_after_ns, .. }) => [
            1,
            burst,
            left,
            whole_seconds(retry_after_ns),
            whole_seconds(ttl),
        ],
        _ => [1, burst, left, -1, whole_seconds(ttl)],
    }
}

/// The reply of a check not decided, failing open: as from a full bucket (allowed, unless the
/// quantity could never pass).
pub(crate) fn open_reply(throttle: &Throttle) -> [i64; 5] {
    let burst = throttle.limit.burst() as i64;
    if throttle.never {
        return [1, burst, burst, -1, 0];
    }
    [0, burst, burst - throttle.cost as i64, -1, 0]
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use floodgate::algorithm::gcra;

    use super::*;

    /// redis-cell 0.2.2's `RateLimiter::rate_limit` and the reply its command builds, on an
    /// injected clock and a map for Redis (a key whose arrival time has passed is gone, as
    /// Redis expires it then).
    #[derive(Default)]
    struct RedisCell {
        tats: HashMap<Vec<u8>, i64>,
    }

    impl RedisCell {
        fn throttle(
            &mut self,
            key: &[u8],
            max_burst: i64,
            count: i64,
            period: i64,
            q: i64,
            now: i64,
        ) -> [i64; 5] {
            let t = (((period * NANOS_PER_SEC) as f64) / (count as f64)) as i64;
            let tau = t * (max_burst + 1);
            let limit = max_burst + 1;
            let increment = t * q;
            let tat = self
                .tats
                .get(key)
                .copied()
                .filter(|&t| t > now)
                .unwrap_or(now);
            let new_tat = if now > tat {
                now + increment
            } else {
                tat + increment
            };
            let allow_at = new_tat - tau;
            let diff = now - allow_at;
            let (limited, retry_after, ttl) = if diff < 0 {
                let retry = if increment <= tau {
                    -diff
                } else {
                    -NANOS_PER_SEC
                };
                (1, retry, tat - now)
            } else {
                self.tats.insert(key.to_vec(), new_tat);
                (0, -NANOS_PER_SEC, new_tat - now)
            };
            let next = tau - ttl;
            let remaining = if next > -t {
                ((next / 1_000) as f64 / (t / 1_000) as f64) as i64
            } else {
                0
            };
            [
                limited,
                limit,
                remaining,
                retry_after / NANOS_PER_SEC,
                ttl / NANOS_PER_SEC,
            ]
        }
    }

    /// floodgate's side: the parsed command decided by the core's GCRA on per-key arrival times,
    /// as the node's store decides it.
    #[derive(Default)]
    struct Floodgate {
        tats: HashMap<Vec<u8>, u64>,
    }

    impl Floodgate {
        fn throttle(&mut self, args: &[&str], now: u64) -> Result<[i64; 5], String> {
            let args: Vec<Vec<u8>> = args.iter().map(|a| a.as_bytes().to_vec()).collect();
            let throttle = parse(&args, 256)?;
            let tat = self.tats.get(&throttle.key).copied().unwrap_or(0);
            let (decision, stored) = gcra::decide(&throttle.limit, tat, now, throttle.cost);
            if let Some(tat) = stored {
                self.tats.insert(throttle.key.clone(), tat);
            }
            Ok(reply(&throttle, &decision))
        }
    }

    fn args(words: &[&str]) -> Vec<Vec<u8>> {
        words.iter().map(|w| w.as_bytes().to_vec()).collect()
    }

    /// redis-cell's own test case list (5 per second... here 1 per second, burst 4), replayed.
    #[test]
    fn redis_cells_own_sequence() {
        let start = 1_700_000_000 * NANOS_PER_SEC as u64;
        let ms = 1_000_000;
        let mut floodgate = Floodgate::default();
        let cases: [(u64, &str, [i64; 5]); 15] = [
            (0, "6", [1, 5, 5, -1, 0]),
            (0, "1", [0, 5, 4, -1, 1]),
            (0, "1", [0, 5, 3, -1, 2]),
            (0, "1", [0, 5, 2, -1, 3]),
            (0, "1", [0, 5, 1, -1, 4]),
            (0, "1", [0, 5, 0, -1, 5]),
            (0, "1", [1, 5, 0, 1, 5]),
            (3_000, "1", [0, 5, 2, -1, 3]),
            (3_100, "1", [0, 5, 1, -1, 3]),
            (4_000, "1", [0, 5, 1, -1, 4]),
            (8_000, "1", [0, 5, 4, -1, 1]),
            (9_500, "1", [0, 5, 4, -1, 1]),
            (9_500, "0", [0, 5, 4, -1, 1]),
            (9_500, "2", [0, 5, 2, -1, 3]),
            (9_500, "5", [1, 5, 2, 3, 3]),
        ];
        for (i, (at_ms, quantity, expected)) in cases.into_iter().enumerate() {
            let got = floodgate
                .throttle(&["foo", "4", "1", "1", quantity], start + at_ms * ms)
                .unwrap();
            assert_eq!(got, expected, "case {i}");
        }
    }

    /// A seeded walk over keys, parameters, quantities and clock steps (each key keeps its
    /// parameters): every reply equals the model's.
    #[test]
    fn replies_equal_redis_cells_arithmetic_over_random_sequences() {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = |bound: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % bound
        };
        // How often each kind of reply came: limited with a wait, limited for good, allowed.
        let mut seen = [0u32; 3];
        for round in 0..200 {
            let mut model = RedisCell::default();
            let mut floodgate = Floodgate::default();
            let params: Vec<(i64, i64, i64)> = (0..3)
                .map(|_| {
                    let burst = next(20) as i64;
                    let wide = next(2) == 0;
                    let count = 1 + next(if wide { 5_000 } else { 10 }) as i64;
                    let long = next(2) == 0;
                    let period = 1 + next(if long { 3_600 } else { 3 }) as i64;
                    (burst, count, period)
                })
                .collect();
            let mut now = 1_700_000_000 * NANOS_PER_SEC + next(NANOS_PER_SEC as u64) as i64;
            for step in 0..300 {
                let k = next(3) as usize;
                let (burst, count, period) = params[k];
                let quantity = match next(10) {
                    0 => 0,
                    1 => burst + 1 + next(3) as i64,
                    _ => 1 + next(3) as i64,
                };
                now += match next(4) {
                    0 => 0,
                    1 => next(1_000) as i64,
                    2 => next(NANOS_PER_SEC as u64) as i64,
                    _ => next(5 * NANOS_PER_SEC as u64) as i64,
                };
                let key = format!("key{k}");
                let words = [
                    key.clone(),
                    burst.to_string(),
                    count.to_string(),
                    period.to_string(),
                    quantity.to_string(),
                ];
                let words: Vec<&str> = words.iter().map(String::as_str).collect();
                let expected = model.throttle(key.as_bytes(), burst, count, period, quantity, now);
                let got = floodgate.throttle(&words, now as u64);
                assert_eq!(got, Ok(expected), "round {round} step {step}: {words:?}");
                seen[match expected {
                    [1, _, _, -1, _] => 1,
                    [1, ..] => 0,
                    _ => 2,
                }] += 1;
            }
        }
        assert!(seen.iter().all(|&n| n > 1_000), "{seen:?}");
    }

    /// A key reused with a limit as large or larger answers as redis-cell does.
    #[test]
    fn a_key_reused_with_a_larger_limit_answers_as_redis_cell() {
        let now = 1_700_000_000 * NANOS_PER_SEC;
        let mut model = RedisCell::default();
        let mut floodgate = Floodgate::default();
        let calls: [(&str, &str, &str, &str, i64); 4] = [
            ("2", "1", "10", "3", 0),
            ("9", "1", "10", "1", 1_000_000),
            ("9", "2", "10", "5", 2_000_000),
            ("2", "1", "100", "1", 3_000_000),
        ];
        for (burst, count, period, quantity, at) in calls {
            let expected = model.throttle(
                b"k",
                burst.parse().unwrap(),
                count.parse().unwrap(),
                period.parse().unwrap(),
                quantity.parse().unwrap(),
                now + at,
            );
            let got = floodgate.throttle(&["k", burst, count, period, quantity], (now + at) as u64);
            assert_eq!(got, Ok(expected), "{burst} {count} {period} {quantity}");
        }
    }

    /// The one difference in well-defined use: a key reused with a limit whose capacity is
    /// below its debt. floodgate reads the debt as at most two of the new limit's capacities
    /// (an empty bucket and one owed: no wait longer than the limit allows); redis-cell keeps
    /// it whole.
    #[test]
    fn a_key_reused_with_a_smaller_capacity_reads_its_debt_clamped() {
        let now = 1_700_000_000 * NANOS_PER_SEC;
        let mut model = RedisCell::default();
        let mut floodgate = Floodgate::default();
        let first = model.throttle(b"k", 4, 1, 3600, 5, now);
        assert_eq!(
            floodgate.throttle(&["k", "4", "1", "3600", "5"], now as u64),
            Ok(first)
        );
        assert_eq!(
            model.throttle(b"k", 0, 1, 3600, 1, now),
            [1, 1, 0, 18000, 18000]
        );
        assert_eq!(
            floodgate.throttle(&["k", "0", "1", "3600", "1"], now as u64),
            Ok([1, 1, 0, 7200, 7200])
        );
    }

    #[test]
    fn errors_as_redis_cell_words_them_and_where_floodgate_refuses() {
        assert_eq!(parse(&args(&["k", "1", "2"]), 256), Err(USAGE.to_owned()));
        assert_eq!(
            parse(&args(&["k", "1", "2", "3", "4", "5"]), 256),
            Err(USAGE.to_owned())
        );
        assert_eq!(
            parse(&args(&["k", "x", "y", "3"]), 256),
            Err("Cell error: Couldn't parse as integer: x".to_owned())
        );
        assert_eq!(
            parse(&args(&["k", "1", "2", "3", "1.5"]), 256),
            Err("Cell error: Couldn't parse as integer: 1.5".to_owned())
        );
        assert!(parse(&args(&["k", "+1", "2", "3", "-0"]), 256).is_ok());
        for bad in [
            ["k", "-1", "1", "1", "1"],
            ["k", "1", "0", "1", "1"],
            ["k", "1", "1", "0", "1"],
            ["k", "1", "1", "1", "-1"],
            ["k", "1", "-1", "1", "1"],
            ["k", "1", "1", "9223372037", "1"],
            ["k", "1", "2000000000", "1", "1"],
            ["k", "1", "1", "40000000", "1"],
            ["k", "1000000000", "1", "1", "1"],
        ] {
            let got = parse(&args(&bad), 256);
            assert!(
                got.as_ref().is_err_and(|e| e.starts_with("Cell error: ")),
                "{bad:?}: {got:?}"
            );
        }
        assert!(parse(&args(&["kk", "1", "1", "1"]), 1).is_err());
    }

    #[test]
    fn intervals_below_floodgates_shortest_period_are_exact() {
        for (count, period) in [
            (1_000_000_000, 1),
            (3, 1),
            (7, 10),
            (999_999, 1),
            (1, 31_622_400),
        ] {
            let t = emission_interval_ns(count, period).unwrap() as u64;
            let throttle = parse(
                &args(&["k", "4", &count.to_string(), &period.to_string()]),
                256,
            )
            .unwrap();
            assert_eq!(throttle.limit.interval_ns(), t, "{count}/{period}");
            assert_eq!(throttle.limit.burst(), 5);
        }
    }

    #[test]
    fn failing_open_answers_as_a_full_bucket() {
        let throttle = parse(&args(&["k", "4", "1", "1", "2"]), 256).unwrap();
        assert_eq!(open_reply(&throttle), [0, 5, 3, -1, 0]);
        let never = parse(&args(&["k", "4", "1", "1", "6"]), 256).unwrap();
        assert_eq!(open_reply(&never), [1, 5, 5, -1, 0]);
    }
}
