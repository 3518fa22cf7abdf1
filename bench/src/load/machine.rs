//! How the whole machine's CPUs spent a span of the run, from `/proc/stat`. On a shared host the
//! time the hypervisor gives to other guests (stolen) and other work on the machine are what
//! make a run noisy: printed beside the results, they let a reader tell a slow spell of the
//! machine from a slow system.

use std::fmt;

/// Cumulative CPU time of all CPUs, in the kernel's ticks, at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTimes {
    /// User, nice, system, interrupt and soft-interrupt time: running something.
    busy: u64,
    /// Idle and waiting on I/O.
    idle: u64,
    /// Wanted to run while the hypervisor ran something else.
    stolen: u64,
}

/// How a span's CPU time divided up, as fractions of it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuShares {
    pub busy: f64,
    pub idle: f64,
    pub stolen: f64,
}

impl CpuTimes {
    /// Now, or `None` where `/proc/stat` cannot be read (not Linux).
    pub fn now() -> Option<Self> {
        Self::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// From the text of `/proc/stat`: its first line, `cpu` and the columns user, nice, system,
    /// idle, iowait, irq, softirq and steal (guest time is already inside user time).
    fn parse(stat: &str) -> Option<Self> {
        let mut fields = stat.lines().next()?.split_whitespace();
        if fields.next()? != "cpu" {
            return None;
        }
        let ticks: Vec<u64> = fields
            .take(8)
            .map(|f| f.parse().ok())
            .collect::<Option<_>>()?;
        let &[user, nice, system, idle, iowait, irq, softirq, steal] = ticks.as_slice() else {
            return None;
        };
        Some(CpuTimes {
            busy: user + nice + system + irq + softirq,
            idle: idle + iowait,
            stolen: steal,
        })
    }

    /// The shares of the span from `before` (if it was read) to now.
    pub fn shares_since(before: Option<CpuTimes>) -> Option<CpuShares> {
        Self::now()?.since(before?)
    }

    /// The shares of the span from `before` to `self`; `None` if no time passed (or the
    /// counters went backwards).
    pub fn since(self, before: CpuTimes) -> Option<CpuShares> {
        let busy = self.busy.checked_sub(before.busy)?;
        let idle = self.idle.checked_sub(before.idle)?;
        let stolen = self.stolen.checked_sub(before.stolen)?;
        let total = (busy + idle + stolen) as f64;
        (total > 0.0).then(|| CpuShares {
            busy: busy as f64 / total,
            idle: idle as f64 / total,
            stolen: stolen as f64 / total,
        })
    }
}

impl fmt::Display for CpuShares {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:.0}% busy, {:.0}% idle, {:.1}% stolen by the host",
            100.0 * self.busy,
            100.0 * self.idle,
            100.0 * self.stolen
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "cpu  6483527 40406 1370379 6065794 319309 0 264231 72183 0 0\n\
                          cpu0 3100836 18645 665476 3259490 73689 0 129782 35602 0 0\n";
    const AFTER: &str = "cpu  6530178 40406 1385895 6096279 319354 0 268455 77563 0 0\n";

    #[test]
    fn shares_of_a_span_add_up_and_name_the_stolen_time() {
        let before = CpuTimes::parse(BEFORE).unwrap();
        let after = CpuTimes::parse(AFTER).unwrap();
        let shares = after.since(before).unwrap();
        // user 46651 + system 15516 + softirq 4224 busy; idle 30485 + iowait 45; steal 5380.
        let total = 102_301.0;
        assert!((shares.busy - 66_391.0 / total).abs() < 1e-9);
        assert!((shares.idle - 30_530.0 / total).abs() < 1e-9);
        assert!((shares.stolen - 5_380.0 / total).abs() < 1e-9);
        assert_eq!(
            shares.to_string(),
            "65% busy, 30% idle, 5.3% stolen by the host"
        );
    }

    #[test]
    fn an_unreadable_or_empty_span_gives_nothing() {
        assert_eq!(CpuTimes::parse("intr 1 2 3\n"), None);
        assert_eq!(CpuTimes::parse("cpu 1 2 3\n"), None);
        assert_eq!(CpuTimes::parse("cpu 1 2 x 4 5 6 7 8\n"), None);
        let at = CpuTimes::parse(AFTER).unwrap();
        assert_eq!(at.since(at), None);
        let before = CpuTimes::parse(BEFORE).unwrap();
        assert_eq!(before.since(at), None);
    }
}
