//! `Decision`: the answer to one check, as a value (denial is not an error).

/// What a check decided. Durations are nanoseconds from the `now` the check was made at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Decision {
    /// The cost was admitted (or, for cost 0, would be: a peek consumes nothing).
    Allowed {
        /// Whole units that could still pass right now.
        remaining: u64,
        /// Time until the bucket is full again if nothing else arrives.
        reset_after_ns: u64,
    },
    /// The cost was refused and nothing was consumed.
    Denied {
        /// Whole units that could pass right now (fewer than the cost asked).
        remaining: u64,
        /// The earliest wait after which the same check passes if nothing else arrives.
        retry_after_ns: u64,
        /// Time until the bucket is full again if nothing else arrives.
        reset_after_ns: u64,
    },
    /// The cost is larger than the limit's burst: it can never pass, however long one waits.
    CostExceedsBurst {
        /// The largest cost this limit can ever admit at once.
        burst: u64,
    },
}

impl Decision {
    pub fn is_allowed(&self) -> bool {
        matches!(self, Decision::Allowed { .. })
    }

    /// Units that could pass now (0 for a cost that can never pass).
    pub fn remaining(&self) -> u64 {
        match *self {
            Decision::Allowed { remaining, .. } | Decision::Denied { remaining, .. } => remaining,
            Decision::CostExceedsBurst { .. } => 0,
        }
    }

    /// Wait before a retry can pass: 0 when allowed, `None` when it never can.
    pub fn retry_after_ns(&self) -> Option<u64> {
        match *self {
            Decision::Allowed { .. } => Some(0),
            Decision::Denied { retry_after_ns, .. } => Some(retry_after_ns),
            Decision::CostExceedsBurst { .. } => None,
        }
    }

    /// Time until the bucket is full again (0 for a cost that can never pass: nothing was used).
    pub fn reset_after_ns(&self) -> u64 {
        match *self {
            Decision::Allowed { reset_after_ns, .. } | Decision::Denied { reset_after_ns, .. } => {
                reset_after_ns
            }
            Decision::CostExceedsBurst { .. } => 0,
        }
    }
}
