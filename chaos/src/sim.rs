//! `floodgate-chaos sim`: the core's seeded simulations, many seeds at once. For each seed it
//! runs the ownership simulation (membership and the ownership machines of a cluster under
//! message loss, delay, duplication, crashes, joins and leaves: at most one decider per slot
//! outside the named windows) and the region simulation for every algorithm (the inter-region
//! delta exchange under delay, loss, duplication and a partition: over-admission within the
//! documented bound, convergence after heal). Everything printed to stdout is a function of the
//! seeds alone, so two runs can be compared byte for byte; timing goes to stderr.

use std::fmt::Write as _;
use std::ops::RangeInclusive;

use floodgate::cluster::ownership::sim as ownership;
use floodgate::region::sim as region;
use floodgate::simulation::TraceDigest;

/// What one seed came to.
#[derive(Debug)]
pub struct SeedOutcome {
    pub seed: u64,
    pub ownership: Result<ownership::SimReport, ownership::SimFailure>,
    pub regions: Result<Vec<region::SimReport>, region::SimFailure>,
}

impl SeedOutcome {
    pub fn passed(&self) -> bool {
        self.ownership.is_ok() && self.regions.is_ok()
    }

    /// The seed's events in one number: both simulations' digests (0 for a failed one, whose
    /// trace is printed instead).
    pub fn digest(&self) -> u64 {
        let mut digest = TraceDigest::default();
        let ownership = self.ownership.as_ref().map_or(0, |r| r.digest);
        digest.add(&format!("{} {ownership:016x}", self.seed));
        for report in self.regions.iter().flatten() {
            digest.add(&format!("{} {:016x}", report.algorithm, report.digest));
        }
        digest.value()
    }
}

/// Runs both simulations for one seed.
pub fn run_seed(seed: u64) -> SeedOutcome {
    SeedOutcome {
        seed,
        ownership: ownership::run_seed(seed),
        regions: region::run_seed(seed),
    }
}

/// Runs every seed of `seeds` on `threads` threads; outcomes in seed order.
pub fn run_seeds(seeds: RangeInclusive<u64>, threads: usize) -> Vec<SeedOutcome> {
    let seeds: Vec<u64> = seeds.collect();
    let threads = threads.clamp(1, 64);
    let chunk = seeds.len().div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        let workers: Vec<_> = seeds
            .chunks(chunk)
            .map(|part| scope.spawn(move || part.iter().map(|&s| run_seed(s)).collect::<Vec<_>>()))
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a simulation thread panicked"))
            .collect()
    })
}

/// The detailed summary of one seed.
pub fn describe(outcome: &SeedOutcome) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "seed {}", outcome.seed);
    match &outcome.ownership {
        Ok(r) => {
            let _ = writeln!(
                out,
                "  ownership       pass  checks={} windows={} switches={} handoffs={} restart-releases={} messages={} digest={:016x}",
                r.checks,
                r.windows_seen,
                r.table_switches,
                r.handoffs_completed,
                r.restart_releases,
                r.messages,
                r.digest
            );
        }
        Err(failure) => {
            let _ = write!(out, "  ownership       FAIL  {failure}");
        }
    }
    match &outcome.regions {
        Ok(reports) => {
            for r in reports {
                let _ = writeln!(
                    out,
                    "  region {:<15} pass  admitted={}/{} worst={:.2} (bound {}) partition={:.2} (bound {}) messages={} lost={} duplicated={} retransmissions={} digest={:016x}",
                    r.algorithm.to_string(),
                    r.admitted,
                    r.asked,
                    r.worst.normal,
                    r.bounds.normal,
                    r.worst.partition,
                    r.bounds.partition,
                    r.messages,
                    r.lost,
                    r.duplicated,
                    r.retransmissions,
                    r.digest
                );
            }
        }
        Err(failure) => {
            let _ = write!(out, "  region          FAIL  {failure}");
        }
    }
    let _ = writeln!(out, "  digest {:016x}", outcome.digest());
    out
}

/// The summary of a sweep: every failing seed with its trace, then one line for all.
pub fn summarize(seeds: &RangeInclusive<u64>, outcomes: &[SeedOutcome]) -> String {
    let mut out = String::new();
    let mut digest = TraceDigest::default();
    let mut failed = 0;
    let mut releasing = 0;
    for outcome in outcomes {
        digest.add(&format!("{:016x}", outcome.digest()));
        if outcome
            .ownership
            .as_ref()
            .is_ok_and(|r| r.restart_releases > 0)
        {
            releasing += 1;
        }
        if !outcome.passed() {
            failed += 1;
            out.push_str(&describe(outcome));
        }
    }
    let _ = writeln!(
        out,
        "seeds {}-{}: {} run, {} passed, {} failed, digest {:016x} ({releasing} released to an owner restarted unseen)",
        seeds.start(),
        seeds.end(),
        outcomes.len(),
        outcomes.len() - failed,
        failed,
        digest.value()
    );
    out
}

/// Parses `A-B` (or a single `A`) into a range of at most `max` seeds.
pub fn parse_seed_range(text: &str, max: u64) -> Result<RangeInclusive<u64>, String> {
    let number = |s: &str| {
        s.trim()
            .parse::<u64>()
            .map_err(|_| format!("`{s}` is not a seed (a whole number)"))
    };
    let (low, high) = match text.split_once('-') {
        Some((a, b)) => (number(a)?, number(b)?),
        None => {
            let n = number(text)?;
            (n, n)
        }
    };
    if high < low {
        return Err(format!("seed range {low}-{high} is empty: write LOW-HIGH"));
    }
    if high - low >= max {
        return Err(format!(
            "seed range {low}-{high} has {} seeds; at most {max} at once",
            high - low + 1
        ));
    }
    Ok(low..=high)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_ranges_parse_and_refuse_what_they_should() {
        assert_eq!(parse_seed_range("3-7", 100), Ok(3..=7));
        assert_eq!(parse_seed_range("5", 100), Ok(5..=5));
        assert!(parse_seed_range("7-3", 100).unwrap_err().contains("empty"));
        assert!(
            parse_seed_range("1-1000", 100)
                .unwrap_err()
                .contains("at most 100")
        );
        assert!(
            parse_seed_range("x-2", 100)
                .unwrap_err()
                .contains("not a seed")
        );
    }

    /// The same seeds give the same stdout, however many threads ran them.
    #[test]
    fn a_sweep_replays_byte_for_byte() {
        let seeds = 1..=3;
        let first = summarize(&seeds, &run_seeds(seeds.clone(), 2));
        let again = summarize(&seeds, &run_seeds(seeds.clone(), 1));
        assert_eq!(first, again);
        assert!(first.contains("3 run, 3 passed, 0 failed"), "{first}");
        assert_eq!(describe(&run_seed(2)), describe(&run_seed(2)));
        assert_ne!(run_seed(2).digest(), run_seed(3).digest());
    }
}
