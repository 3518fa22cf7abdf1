//! The simulation's judge: every admission of every region merged in time order, checked
//! against the documented bound of the key's algorithm, in every window.

use crate::{Algorithm, Limit};

/// One admission anywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    pub at_ns: u64,
    pub region: usize,
    pub cost: u64,
}

/// When the normal bound applies, and the larger one that applies otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Over-admission allowed while every region hears the others (units).
    pub normal: u64,
    /// Over-admission allowed in windows that overlap a partition or its settling (units).
    pub partition: u64,
    /// The partition starts here ...
    pub partition_start_ns: u64,
    /// ... and the normal bound is back for windows starting here (heal plus settling).
    pub settled_ns: u64,
}

/// The worst over-admission seen, in units above the limit, per regime.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Worst {
    pub normal: f64,
    pub partition: f64,
}

/// A bound exceeded: when, by how much, and which bound.
#[derive(Debug, Clone, PartialEq)]
pub struct Violation {
    pub at_ns: u64,
    pub over: f64,
    pub bound: u64,
    pub regime: &'static str,
}

/// Checks `admissions` (in time order) against `bounds` for `limit`; returns the worst seen.
pub fn judge(limit: &Limit, admissions: &[Admission], bounds: &Bounds) -> Result<Worst, Violation> {
    match limit.algorithm() {
        Algorithm::Gcra => gcra(limit, admissions, bounds),
        Algorithm::FixedWindow => fixed_window(limit, admissions, bounds),
        Algorithm::SlidingWindow => sliding_window(limit, admissions, bounds),
        Algorithm::SlidingLog => sliding_log(limit, admissions, bounds),
    }
}

struct Tally {
    worst: Worst,
}

impl Tally {
    fn see(&mut self, at_ns: u64, over: f64, bound: u64, normal: bool) -> Result<(), Violation> {
        let (slot, regime) = if normal {
            (&mut self.worst.normal, "normal")
        } else {
            (&mut self.worst.partition, "partition")
        };
        *slot = slot.max(over);
        // A hair of slack for the division only: bounds are whole units.
        if over > bound as f64 + 1e-9 {
            return Err(Violation {
                at_ns,
                over,
                bound,
                regime,
            });
        }
        Ok(())
    }
}

/// GCRA: in every interval the regions together admit at most `burst + rate * length + bound`.
/// An unlimited GCRA started at `t0` tracks, after each admission, the worst interval starting
/// at or after `t0` and ending then: its debt over the burst. Three trackers cover every
/// interval: from the start (normal bound before the partition, partition bound during it), from
/// the partition's start (partition bound until settled), from settling (normal bound).
fn gcra(limit: &Limit, admissions: &[Admission], bounds: &Bounds) -> Result<Worst, Violation> {
    let interval = limit.interval_ns();
    let capacity = limit.capacity_ns();
    let mut tally = Tally {
        worst: Worst::default(),
    };
    let over =
        |tat: u64, at: u64| (tat - at) as f64 / interval as f64 - (capacity / interval) as f64;
    let (mut from_start, mut from_cut, mut from_settled) = (0u64, 0u64, 0u64);
    for a in admissions {
        let add = a.cost * interval;
        from_start = from_start.max(a.at_ns) + add;
        if a.at_ns < bounds.partition_start_ns {
            tally.see(a.at_ns, over(from_start, a.at_ns), bounds.normal, true)?;
        } else if a.at_ns < bounds.settled_ns {
            tally.see(a.at_ns, over(from_start, a.at_ns), bounds.partition, false)?;
            from_cut = from_cut.max(a.at_ns) + add;
            tally.see(a.at_ns, over(from_cut, a.at_ns), bounds.partition, false)?;
        } else {
            from_settled = from_settled.max(a.at_ns) + add;
            tally.see(a.at_ns, over(from_settled, a.at_ns), bounds.normal, true)?;
        }
    }
    Ok(tally.worst)
}

/// Whether a span of time `[from, to)` lies wholly outside the partition and its settling.
fn is_normal(from_ns: u64, to_ns: u64, bounds: &Bounds) -> bool {
    to_ns <= bounds.partition_start_ns || from_ns >= bounds.settled_ns
}

/// Fixed window: at most `limit + bound` per window.
fn fixed_window(
    limit: &Limit,
    admissions: &[Admission],
    bounds: &Bounds,
) -> Result<Worst, Violation> {
    let period = limit.period_ns();
    let cap = limit.burst();
    let mut tally = Tally {
        worst: Worst::default(),
    };
    let (mut window, mut count) = (u64::MAX, 0u64);
    for a in admissions {
        let w = a.at_ns / period;
        if w != window {
            (window, count) = (w, 0);
        }
        count += a.cost;
        let normal = is_normal(w * period, (w + 1) * period, bounds);
        let bound = if normal {
            bounds.normal
        } else {
            bounds.partition
        };
        tally.see(a.at_ns, count as f64 - cap as f64, bound, normal)?;
    }
    Ok(tally.worst)
}

/// Sliding window: the estimate over every region's counts (the previous window weighted by
/// its overlap with the trailing period, plus the current one) stays within `limit + bound`.
fn sliding_window(
    limit: &Limit,
    admissions: &[Admission],
    bounds: &Bounds,
) -> Result<Worst, Violation> {
    let period = limit.period_ns();
    let cap = limit.burst();
    let mut tally = Tally {
        worst: Worst::default(),
    };
    let (mut window, mut count, mut previous) = (0u64, 0u64, 0u64);
    for a in admissions {
        let w = a.at_ns / period;
        if w != window {
            previous = if w == window + 1 { count } else { 0 };
            (window, count) = (w, 0);
        }
        count += a.cost;
        let elapsed = a.at_ns - w * period;
        let weighted =
            (u128::from(previous) * u128::from(period - elapsed) / u128::from(period)) as u64;
        let estimate = weighted + count;
        let normal = is_normal(w.saturating_sub(1) * period, (w + 1) * period, bounds);
        let bound = if normal {
            bounds.normal
        } else {
            bounds.partition
        };
        tally.see(a.at_ns, estimate as f64 - cap as f64, bound, normal)?;
    }
    Ok(tally.worst)
}

/// Sliding log: at most `limit + bound` admissions in any trailing period `(t - period, t]`.
fn sliding_log(
    limit: &Limit,
    admissions: &[Admission],
    bounds: &Bounds,
) -> Result<Worst, Violation> {
    let period = limit.period_ns();
    let cap = limit.burst();
    let mut tally = Tally {
        worst: Worst::default(),
    };
    let mut oldest = 0usize;
    let mut in_period = 0u64;
    for (i, a) in admissions.iter().enumerate() {
        in_period += a.cost;
        while admissions[oldest].at_ns + period <= a.at_ns {
            in_period -= admissions[oldest].cost;
            oldest += 1;
        }
        debug_assert!(oldest <= i);
        let normal = is_normal(a.at_ns.saturating_sub(period), a.at_ns + 1, bounds);
        let bound = if normal {
            bounds.normal
        } else {
            bounds.partition
        };
        tally.see(a.at_ns, in_period as f64 - cap as f64, bound, normal)?;
    }
    Ok(tally.worst)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NANOS_PER_SEC as S;

    fn at(at_ns: u64, cost: u64) -> Admission {
        Admission {
            at_ns,
            region: 0,
            cost,
        }
    }

    const BOUNDS: Bounds = Bounds {
        normal: 2,
        partition: 10,
        partition_start_ns: 100 * S,
        settled_ns: 200 * S,
    };

    /// The judge fails what it should: a burst two over the bound is caught for every
    /// algorithm, and one within it passes.
    #[test]
    fn the_judge_catches_an_over_admission_for_every_algorithm() {
        for algorithm in Algorithm::ALL {
            let limit = Limit::new(algorithm, 10, S, 10).unwrap();
            let within: Vec<Admission> = (0..12).map(|i| at(S + i, 1)).collect();
            let worst = judge(&limit, &within, &BOUNDS).unwrap();
            assert!((worst.normal - 2.0).abs() < 1e-6, "{algorithm}: {worst:?}");
            let over: Vec<Admission> = (0..13).map(|i| at(S + i, 1)).collect();
            let violation = judge(&limit, &over, &BOUNDS).unwrap_err();
            assert_eq!(
                (violation.bound, violation.regime),
                (2, "normal"),
                "{algorithm}"
            );
            // The same burst during the partition is within its bound.
            let cut: Vec<Admission> = (0..13).map(|i| at(150 * S + i, 1)).collect();
            assert!(judge(&limit, &cut, &BOUNDS).is_ok(), "{algorithm}");
        }
    }

    /// What one exact limiter admits is never over: requests every 30 ms decided by one
    /// store, judged.
    #[test]
    fn what_one_exact_limiter_admits_is_not_over() {
        for algorithm in Algorithm::ALL {
            let limit = Limit::new(algorithm, 10, S, 10).unwrap();
            let store = crate::BucketStore::new(crate::StoreConfig {
                max_keys: 16,
                shards: 1,
            })
            .unwrap();
            let key = crate::BucketKey::for_key(b"k");
            let admitted: Vec<Admission> = (0..300)
                .map(|i| S + i * 30_000_000)
                .filter(|&t| store.check(key, &limit, 1, t).unwrap().is_allowed())
                .map(|t| at(t, 1))
                .collect();
            assert!(admitted.len() > 50, "{algorithm}");
            let worst = judge(&limit, &admitted, &BOUNDS).unwrap();
            assert!(worst.normal <= 0.0, "{algorithm}: {worst:?}");
        }
    }
}
