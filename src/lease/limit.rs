//! `LeaseLimit`: a concurrency limit (`max` leases at once, each held at most `ttl`) that cannot
//! be invalid, so the rest of the lease code never checks bounds again.

/// Most leases one key may allow at once: a set is a vector scanned on every acquire, and a
/// client must not be able to make one node hold millions for a single key.
pub const MAX_LEASE_MAX: u64 = 100_000;
/// Shortest TTL: below a millisecond a lease expires before its answer arrives.
pub const MIN_LEASE_TTL_NS: u64 = 1_000_000;
/// Longest TTL (one day): a crashed holder's capacity comes back within a day at worst.
pub const MAX_LEASE_TTL_NS: u64 = 86_400 * crate::NANOS_PER_SEC;

/// Why a concurrency limit was refused, in words an operator can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseLimitError {
    #[error("max must be between 1 and {MAX_LEASE_MAX} leases, not {0}")]
    Max(u64),
    #[error(
        "ttl must be between 1ms and 1 day ({MIN_LEASE_TTL_NS}..={MAX_LEASE_TTL_NS} ns), not {0} ns"
    )]
    Ttl(u64),
}

/// A valid concurrency limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseLimit {
    max: u64,
    ttl_ns: u64,
}

impl LeaseLimit {
    pub fn new(max: u64, ttl_ns: u64) -> Result<Self, LeaseLimitError> {
        if !(1..=MAX_LEASE_MAX).contains(&max) {
            return Err(LeaseLimitError::Max(max));
        }
        Self::check_ttl(ttl_ns)?;
        Ok(LeaseLimit { max, ttl_ns })
    }

    /// Validates a TTL alone (a renewal carries no max).
    pub fn check_ttl(ttl_ns: u64) -> Result<u64, LeaseLimitError> {
        if (MIN_LEASE_TTL_NS..=MAX_LEASE_TTL_NS).contains(&ttl_ns) {
            Ok(ttl_ns)
        } else {
            Err(LeaseLimitError::Ttl(ttl_ns))
        }
    }

    pub fn max(&self) -> u64 {
        self.max
    }

    pub fn ttl_ns(&self) -> u64 {
        self.ttl_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_and_ttl_are_bounded_at_both_ends() {
        assert!(LeaseLimit::new(1, MIN_LEASE_TTL_NS).is_ok());
        assert!(LeaseLimit::new(MAX_LEASE_MAX, MAX_LEASE_TTL_NS).is_ok());
        assert_eq!(
            LeaseLimit::new(0, MIN_LEASE_TTL_NS),
            Err(LeaseLimitError::Max(0))
        );
        assert_eq!(
            LeaseLimit::new(MAX_LEASE_MAX + 1, MIN_LEASE_TTL_NS),
            Err(LeaseLimitError::Max(MAX_LEASE_MAX + 1))
        );
        assert_eq!(
            LeaseLimit::new(1, MIN_LEASE_TTL_NS - 1),
            Err(LeaseLimitError::Ttl(MIN_LEASE_TTL_NS - 1))
        );
        assert_eq!(
            LeaseLimit::new(1, MAX_LEASE_TTL_NS + 1),
            Err(LeaseLimitError::Ttl(MAX_LEASE_TTL_NS + 1))
        );
        let message = LeaseLimit::new(1, 0).unwrap_err().to_string();
        assert!(
            message.contains("ttl must be between 1ms and 1 day"),
            "{message}"
        );
    }
}
