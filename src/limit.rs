//! `Limit`: a validated rate limit (algorithm, rate per period, burst) that cannot be invalid.

use std::fmt;
use std::str::FromStr;

/// One nanosecond-based second, the unit every duration in the core is counted in.
pub const NANOS_PER_SEC: u64 = 1_000_000_000;
/// Shortest period a limit may have: below a millisecond, timer and network jitter dominate.
pub const MIN_PERIOD_NS: u64 = 1_000_000;
/// Longest period a limit may have (366 days); keeps every `burst * interval` product in range.
pub const MAX_PERIOD_NS: u64 = 366 * 24 * 3600 * NANOS_PER_SEC;
/// Largest burst (and window limit) accepted; a bigger number is almost surely a typo.
pub const MAX_BURST: u64 = 1_000_000_000;
/// Longest time a GCRA bucket may take to refill from empty (`burst * interval`): a quarter of
/// the `u64` range, so adding a capacity to any `now` or to another capacity cannot overflow.
pub const MAX_CAPACITY_NS: u64 = u64::MAX / 4;
/// The sliding-window log stores one timestamp per admitted unit of cost, so its limit is capped
/// to keep a key's memory bounded: at most 1,000 entries of 8 bytes.
pub const SLIDING_LOG_MAX_LIMIT: u64 = 1_000;

/// The algorithm that turns a limit and the bucket's past into a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Algorithm {
    /// Generic cell rate algorithm: a token bucket of `burst` tokens refilled at `rate`/`period`,
    /// stored as one theoretical arrival time. The default.
    #[default]
    Gcra,
    /// `rate` units per window; windows are aligned to multiples of `period`.
    FixedWindow,
    /// The current window's count plus the previous window's count weighted by its overlap with
    /// the trailing period (Cloudflare's sliding-window counter).
    SlidingWindow,
    /// Exact sliding window over a log of admission times; limits above
    /// [`SLIDING_LOG_MAX_LIMIT`] are refused.
    SlidingLog,
}

impl Algorithm {
    /// Every algorithm, in wire order.
    pub const ALL: [Algorithm; 4] = [
        Algorithm::Gcra,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
    ];

    /// The name used on command lines, in rules files and in metrics.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Gcra => "gcra",
            Algorithm::FixedWindow => "fixed-window",
            Algorithm::SlidingWindow => "sliding-window",
            Algorithm::SlidingLog => "sliding-log",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = LimitError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| LimitError::UnknownAlgorithm(s.to_owned()))
    }
}

/// Why a limit could not be built. Each message names the offending value and the allowed range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    #[error("rate must be at least 1 per period")]
    ZeroRate,
    #[error("burst must be at least 1")]
    ZeroBurst,
    #[error(
        "period {period_ns} ns is outside [{MIN_PERIOD_NS}, {MAX_PERIOD_NS}] ns (1 ms to 366 days)"
    )]
    PeriodOutOfRange { period_ns: u64 },
    #[error("rate {rate} per {period_ns} ns is more than one per nanosecond")]
    RateTooHigh { rate: u64, period_ns: u64 },
    #[error("burst {burst} is above the maximum of {MAX_BURST}")]
    BurstTooHigh { burst: u64 },
    #[error("limit {rate} is above the maximum of {MAX_BURST} per window")]
    WindowLimitTooHigh { rate: u64 },
    #[error(
        "burst {burst} differs from the limit {rate}: burst is a gcra setting, window algorithms admit `limit` per window"
    )]
    BurstOnWindow { rate: u64, burst: u64 },
    #[error(
        "sliding-log keeps one entry per admitted unit, so its limit is at most {SLIDING_LOG_MAX_LIMIT}; got {rate} (use sliding-window or gcra for larger limits)"
    )]
    SlidingLogTooLarge { rate: u64 },
    #[error("unknown algorithm `{0}` (expected gcra, fixed-window, sliding-window or sliding-log)")]
    UnknownAlgorithm(String),
}

/// A rate limit: at most `rate` units per `period`, with bursts of up to `burst` units (GCRA) or
/// `rate` units per window (window algorithms). Only [`Limit::new`] builds one, so every `Limit`
/// in the program is valid and its derived values cannot overflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limit {
    algorithm: Algorithm,
    rate: u64,
    period_ns: u64,
    burst: u64,
    /// GCRA emission interval: `period / rate` rounded *up*, so rounding can only make the limit
    /// stricter (by less than one nanosecond per unit), never looser.
    interval_ns: u64,
}

/// A window or log limit as the store keeps it beside a bucket: all such a limit is made of
/// (its burst is its rate, its interval follows), in 16 bytes where a `Limit` takes 40, so a
/// window bucket's slot fits a cache line. Made only from a valid limit of those algorithms
/// ([`Limit::packed`]), so it turns back into one ([`PackedLimit::limit`]) without checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PackedLimit {
    period_ns: u64,
    /// At most [`MAX_BURST`] for a window or log limit: fits.
    rate: u32,
    algorithm: Algorithm,
}

impl PackedLimit {
    /// The limit held by the store's empty window and log slots, never decided against.
    pub(crate) const EMPTY_SLOT: PackedLimit = PackedLimit {
        period_ns: NANOS_PER_SEC,
        rate: 1,
        algorithm: Algorithm::FixedWindow,
    };

    pub(crate) fn period_ns(self) -> u64 {
        self.period_ns
    }

    /// The `Limit` this was made from.
    pub(crate) fn limit(self) -> Limit {
        let rate = u64::from(self.rate);
        Limit {
            algorithm: self.algorithm,
            rate,
            period_ns: self.period_ns,
            burst: rate,
            interval_ns: self.period_ns.div_ceil(rate),
        }
    }
}

impl Limit {
    /// The limit as a window or log bucket keeps it. Only for a limit whose burst is its rate
    /// (every algorithm but GCRA).
    pub(crate) fn packed(&self) -> PackedLimit {
        debug_assert!(self.algorithm != Algorithm::Gcra && self.burst == self.rate);
        PackedLimit {
            period_ns: self.period_ns,
            // At most MAX_BURST for these algorithms (checked by `new`).
            rate: u32::try_from(self.rate).unwrap_or(u32::MAX),
            algorithm: self.algorithm,
        }
    }

    /// Builds a limit, checking every field and the combination.
    pub fn new(
        algorithm: Algorithm,
        rate: u64,
        period_ns: u64,
        burst: u64,
    ) -> Result<Self, LimitError> {
        if rate == 0 {
            return Err(LimitError::ZeroRate);
        }
        if burst == 0 {
            return Err(LimitError::ZeroBurst);
        }
        if !(MIN_PERIOD_NS..=MAX_PERIOD_NS).contains(&period_ns) {
            return Err(LimitError::PeriodOutOfRange { period_ns });
        }
        if rate > period_ns {
            return Err(LimitError::RateTooHigh { rate, period_ns });
        }
        match algorithm {
            Algorithm::Gcra if burst > MAX_BURST => return Err(LimitError::BurstTooHigh { burst }),
            Algorithm::Gcra => {}
            _ if burst != rate => return Err(LimitError::BurstOnWindow { rate, burst }),
            Algorithm::SlidingLog if rate > SLIDING_LOG_MAX_LIMIT => {
                return Err(LimitError::SlidingLogTooLarge { rate });
            }
            _ if rate > MAX_BURST => return Err(LimitError::WindowLimitTooHigh { rate }),
            _ => {}
        }
        let interval_ns = period_ns.div_ceil(rate);
        // Invariant used by the algorithms: burst * interval fits with room to add `now`.
        // interval <= MAX_PERIOD (3.2e16) and burst <= 1e9 could overflow, so check it here.
        if burst
            .checked_mul(interval_ns)
            .is_none_or(|t| t > MAX_CAPACITY_NS)
        {
            return Err(LimitError::BurstTooHigh { burst });
        }
        Ok(Limit {
            algorithm,
            rate,
            period_ns,
            burst,
            interval_ns,
        })
    }

    /// A GCRA limit of `rate` per `period_ns` with the given burst.
    pub fn gcra(rate: u64, period_ns: u64, burst: u64) -> Result<Self, LimitError> {
        Limit::new(Algorithm::Gcra, rate, period_ns, burst)
    }

    /// A window limit (burst equals the rate).
    pub fn window(algorithm: Algorithm, rate: u64, period_ns: u64) -> Result<Self, LimitError> {
        Limit::new(algorithm, rate, period_ns, rate)
    }

    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Units admitted per period.
    pub fn rate(&self) -> u64 {
        self.rate
    }

    pub fn period_ns(&self) -> u64 {
        self.period_ns
    }

    /// The most cost that can pass at once: `burst` for GCRA, `rate` for window algorithms.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// GCRA emission interval: the time one unit of cost takes to refill (rounded up).
    pub fn interval_ns(&self) -> u64 {
        self.interval_ns
    }

    /// Time a full bucket takes to drain: `burst * interval` (GCRA's delay-variation tolerance
    /// plus one interval).
    pub fn capacity_ns(&self) -> u64 {
        // Cannot overflow: checked in `new`.
        self.burst * self.interval_ns
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}/{}",
            self.algorithm,
            self.rate,
            format_period(self.period_ns)
        )?;
        if self.algorithm == Algorithm::Gcra && self.burst != self.rate {
            write!(f, " burst {}", self.burst)?;
        }
        Ok(())
    }
}

/// Formats a period as the largest whole unit that divides it: `1s`, `1min`, `250ms`.
pub fn format_period(period_ns: u64) -> String {
    const UNITS: [(u64, &str); 5] = [
        (86_400 * NANOS_PER_SEC, "d"),
        (3_600 * NANOS_PER_SEC, "h"),
        (60 * NANOS_PER_SEC, "min"),
        (NANOS_PER_SEC, "s"),
        (1_000_000, "ms"),
    ];
    for (unit_ns, name) in UNITS {
        if period_ns.is_multiple_of(unit_ns) {
            return format!("{}{name}", period_ns / unit_ns);
        }
    }
    format!("{period_ns}ns")
}

/// Why a duration or rate text did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error(
        "`{0}` is not a duration: expected a number and a unit (ms, s, min, h, d), e.g. `1s` or `1.5min`"
    )]
    Duration(String),
    #[error(
        "`{0}` is not a rate: expected COUNT/UNIT or COUNT/DURATION, e.g. `10/s`, `100/min`, `5/10s`"
    )]
    Rate(String),
}

/// Parses a duration such as `250ms`, `1s`, `1.5s`, `1min`, `2h`, `1d` into nanoseconds, exactly
/// (no floating point).
pub fn parse_duration_ns(text: &str) -> Result<u64, ParseError> {
    let err = || ParseError::Duration(text.to_owned());
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(err)?;
    let (number, unit) = text.split_at(split);
    let unit_ns = match unit.trim() {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" | "sec" => NANOS_PER_SEC,
        "m" | "min" => 60 * NANOS_PER_SEC,
        "h" => 3_600 * NANOS_PER_SEC,
        "d" => 86_400 * NANOS_PER_SEC,
        _ => return Err(err()),
    };
    parse_decimal_scaled(number, unit_ns).ok_or_else(err)
}

/// Parses a rate such as `10/s`, `100/min`, `5/10s` into `(count, period_ns)`.
pub fn parse_rate(text: &str) -> Result<(u64, u64), ParseError> {
    let err = || ParseError::Rate(text.to_owned());
    let (count, per) = text.trim().split_once('/').ok_or_else(err)?;
    let count: u64 = count.trim().parse().map_err(|_| err())?;
    let per = per.trim();
    // `10/s` means per one second; `5/10s` means per ten seconds.
    let per = if per.starts_with(|c: char| c.is_ascii_digit()) {
        per.to_owned()
    } else {
        format!("1{per}")
    };
    let period_ns = parse_duration_ns(&per).map_err(|_| err())?;
    Ok((count, period_ns))
}

/// `"1.25"` scaled by `scale` exactly, or `None` on bad syntax, too many decimals or overflow.
pub fn parse_decimal_scaled(number: &str, scale: u64) -> Option<u64> {
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    let digits_ok = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if !digits_ok(int) || !digits_ok(frac) {
        return None;
    }
    let int: u64 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let mut total = int.checked_mul(scale)?;
    let mut place = scale;
    for digit in frac.bytes() {
        if !place.is_multiple_of(10) {
            // A digit finer than the unit can hold: only zeros are exact.
            if digit != b'0' {
                return None;
            }
            continue;
        }
        place /= 10;
        total = total.checked_add(u64::from(digit - b'0') * place)?;
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A window or log limit comes back from its packed form as it was, at the extremes of
    /// every field.
    #[test]
    fn packed_limits_come_back_whole() {
        let algorithms = [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::SlidingLog,
        ];
        for algorithm in algorithms {
            for period_ns in [MIN_PERIOD_NS, 7 * NANOS_PER_SEC, MAX_PERIOD_NS] {
                for rate in [1, 3, 1_000, MAX_BURST] {
                    let Ok(limit) = Limit::window(algorithm, rate, period_ns) else {
                        continue;
                    };
                    assert_eq!(limit.packed().limit(), limit, "{limit:?}");
                }
            }
        }
        let packed = Limit::window(Algorithm::FixedWindow, MAX_BURST, MAX_PERIOD_NS).unwrap();
        assert_eq!(packed.packed().limit().rate(), MAX_BURST);
        assert_eq!(
            PackedLimit::EMPTY_SLOT.limit(),
            Limit::window(Algorithm::FixedWindow, 1, NANOS_PER_SEC).unwrap()
        );
    }

    #[test]
    fn invalid_limits_are_refused_with_specific_errors() {
        let s = NANOS_PER_SEC;
        assert_eq!(Limit::gcra(0, s, 1), Err(LimitError::ZeroRate));
        assert_eq!(Limit::gcra(1, s, 0), Err(LimitError::ZeroBurst));
        assert_eq!(
            Limit::gcra(1, 10, 1),
            Err(LimitError::PeriodOutOfRange { period_ns: 10 })
        );
        assert!(matches!(
            Limit::gcra(2_000_000, 1_000_000, 1),
            Err(LimitError::RateTooHigh { .. })
        ));
        assert!(matches!(
            Limit::new(Algorithm::FixedWindow, 5, s, 6),
            Err(LimitError::BurstOnWindow { .. })
        ));
        assert!(matches!(
            Limit::window(Algorithm::SlidingLog, 1_001, s),
            Err(LimitError::SlidingLogTooLarge { .. })
        ));
        assert!(Limit::window(Algorithm::SlidingLog, 1_000, s).is_ok());
        assert!(matches!(
            Limit::gcra(1, MAX_PERIOD_NS, MAX_BURST),
            Err(LimitError::BurstTooHigh { .. })
        ));
    }

    #[test]
    fn interval_rounds_up_so_rounding_never_loosens_the_limit() {
        let limit = Limit::gcra(3, NANOS_PER_SEC, 3).unwrap();
        assert_eq!(limit.interval_ns(), 333_333_334);
        assert!(limit.interval_ns() * 3 >= NANOS_PER_SEC);
    }

    #[test]
    fn durations_and_rates_parse_exactly() {
        assert_eq!(parse_duration_ns("1s"), Ok(NANOS_PER_SEC));
        assert_eq!(parse_duration_ns("1.5min"), Ok(90 * NANOS_PER_SEC));
        assert_eq!(parse_duration_ns("250ms"), Ok(250_000_000));
        assert!(parse_duration_ns("1.5ns").is_err());
        assert!(parse_duration_ns("s").is_err());
        assert!(parse_duration_ns("10").is_err());
        assert_eq!(parse_rate("10/s"), Ok((10, NANOS_PER_SEC)));
        assert_eq!(parse_rate("100/min"), Ok((100, 60 * NANOS_PER_SEC)));
        assert_eq!(parse_rate("5/10s"), Ok((5, 10 * NANOS_PER_SEC)));
        assert_eq!(parse_rate("7/d"), Ok((7, 86_400 * NANOS_PER_SEC)));
        assert!(parse_rate("ten/s").is_err());
        assert!(parse_rate("10").is_err());
        assert_eq!(
            parse_decimal_scaled("0.99", NANOS_PER_SEC),
            Some(990_000_000)
        );
        assert_eq!(parse_decimal_scaled(".5", 10), Some(5));
        assert_eq!(parse_decimal_scaled(".", 10), None);
    }

    #[test]
    fn display_names_the_limit_as_written() {
        assert_eq!(
            Limit::gcra(100, 60 * NANOS_PER_SEC, 100)
                .unwrap()
                .to_string(),
            "gcra 100/1min"
        );
        assert_eq!(
            Limit::gcra(1000, 60 * NANOS_PER_SEC, 200)
                .unwrap()
                .to_string(),
            "gcra 1000/1min burst 200"
        );
        assert_eq!(
            "sliding-log".parse::<Algorithm>(),
            Ok(Algorithm::SlidingLog)
        );
        assert!("leaky".parse::<Algorithm>().is_err());
    }
}
