//! Sliding-window log: exact. Keeps one timestamp per admitted unit of cost and admits when the
//! units in the trailing period `(now - period, now]` plus the cost fit the limit.
//!
//! Memory per key is at most `limit` timestamps, which is why [`crate::SLIDING_LOG_MAX_LIMIT`]
//! caps the limit. A log starts with room for a few and doubles its room as it fills: most keys
//! stay far below their limit, and room for the whole limit from the first check (8 KiB for a
//! limit of 1,000) made a million such keys cost 8 GiB. The first few are kept in the log itself
//! (`log_times.rs`).

use super::log_times::{INLINE, Times};
use crate::{Decision, Limit};

/// Room a new log starts with (unless its first cost needs more): the times it keeps in place.
pub const FIRST_ROOM: usize = INLINE;

/// The times a new log has room for when made by an admission of `cost` under `limit`.
pub fn first_room(limit: &Limit, cost: u64) -> usize {
    // At most SLIDING_LOG_MAX_LIMIT for any valid log limit, so the cast cannot truncate.
    cost.max(FIRST_ROOM as u64).min(limit.burst()) as usize
}

/// The admission times of one key, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlidingLog {
    times_ns: Times,
}

impl SlidingLog {
    /// Decides `cost` and, when allowed, records it. Forgetting expired entries first changes no
    /// decision. Undo an admitted cost with [`SlidingLog::undo`].
    pub fn decide(&mut self, limit: &Limit, now_ns: u64, cost: u64) -> Decision {
        self.forget_expired(limit, now_ns);
        let decision = self.peek(limit, now_ns, cost);
        if decision.is_allowed() {
            self.times_ns.push_n(now_ns, cost as usize);
        }
        decision
    }

    /// What [`SlidingLog::decide`] would answer, recording nothing.
    pub fn peek(&self, limit: &Limit, now_ns: u64, cost: u64) -> Decision {
        let cap = limit.burst();
        if cost > cap {
            return Decision::CostExceedsBurst { burst: cap };
        }
        let period = limit.period_ns();
        let horizon = now_ns.saturating_sub(period);
        // The entries `forget_expired` would drop.
        let expired = self.times_ns.iter().take_while(|&&t| t <= horizon).count();
        // Times are absolute, so a log kept under another limit reads right under this one:
        // only its entries within this period count. There can be more than `cap` of them
        // after the limit was lowered or a metered charge: that only denies.
        let used = (self.times_ns.len() - expired) as u64;
        if used + cost <= cap {
            Decision::Allowed {
                remaining: cap - used - cost,
                // An admission of `cost > 0` is recorded at `now`.
                reset_after_ns: if cost > 0 {
                    period
                } else {
                    self.reset_after(period, now_ns)
                },
            }
        } else {
            // The oldest `used + cost - cap` units must leave the window first.
            let must_leave = (used + cost - cap) as usize;
            // Within the log: `must_leave <= used`, as `cost <= cap`.
            let oldest_to_leave = self.times_ns.get(expired + must_leave - 1).unwrap_or(0);
            let leaves_at = oldest_to_leave.saturating_add(period);
            Decision::Denied {
                remaining: cap.saturating_sub(used),
                retry_after_ns: leaves_at.saturating_sub(now_ns),
                reset_after_ns: self.reset_after(period, now_ns),
            }
        }
    }

    /// Takes `cost` units after the fact (a metered charge) at `now`, never refused: the log may
    /// hold up to twice the limit (one limit owed), which denies until enough entries leave the
    /// period; units beyond that are forgiven. Returns the units forgiven.
    pub fn charge(&mut self, limit: &Limit, now_ns: u64, cost: u64) -> u64 {
        self.forget_expired(limit, now_ns);
        let most = limit.burst().saturating_mul(2);
        let taken = cost.min(most.saturating_sub(self.times_ns.len() as u64));
        self.times_ns.push_n(now_ns, taken as usize);
        cost - taken
    }

    /// Records `units` admitted elsewhere (another region) at `at_ns`, kept in time order, and
    /// keeps at most `max_entries` of the newest. Unlike [`SlidingLog::decide`] it never
    /// refuses: the units were already admitted, so the log may hold more than the limit (which
    /// only denies until enough of them leave the period).
    pub fn record_elsewhere(
        &mut self,
        limit: &Limit,
        at_ns: u64,
        units: u64,
        max_entries: usize,
        now_ns: u64,
    ) {
        self.forget_expired(limit, now_ns);
        if at_ns.saturating_add(limit.period_ns()) <= now_ns {
            return;
        }
        let units = units.min(max_entries as u64) as usize;
        // One pass, whatever `units` is: the old times, the new ones spliced in order, and the
        // oldest dropped beyond the cap.
        let mut times: Vec<u64> = self.times_ns.iter().copied().collect();
        let at = times.partition_point(|&t| t <= at_ns);
        times.splice(at..at, std::iter::repeat_n(at_ns, units));
        let excess = times.len().saturating_sub(max_entries);
        self.times_ns = times.into_iter().skip(excess).collect();
    }

    /// Removes the last `cost` admitted units (rolls back an admission of a multi-check).
    pub fn undo(&mut self, cost: u64) {
        let keep = self.times_ns.len().saturating_sub(cost as usize);
        self.times_ns.truncate(keep);
    }

    /// Drops the entries that have left the trailing period.
    pub fn forget_expired(&mut self, limit: &Limit, now_ns: u64) {
        let horizon = now_ns.saturating_sub(limit.period_ns());
        let expired = self.times_ns.iter().take_while(|&&t| t <= horizon).count();
        self.times_ns.drop_oldest(expired);
    }

    /// True when no entry is within the period any more.
    pub fn is_expired(&self, limit: &Limit, now_ns: u64) -> bool {
        self.times_ns
            .back()
            .is_none_or(|t| t.saturating_add(limit.period_ns()) <= now_ns)
    }

    /// Most entries a log under `limit` holds where it is replicated, handed off or written
    /// to a snapshot: twice its limit, one limit owed (a metered charge's debt).
    pub fn most_entries(limit: &Limit) -> usize {
        // burst <= SLIDING_LOG_MAX_LIMIT for any log limit: small.
        2 * limit.burst() as usize
    }

    /// A log holding these admission times (replicated from a peer); at most
    /// [`SlidingLog::most_entries`] of the newest, oldest first.
    pub fn from_times(limit: &Limit, times_ns: &[u64]) -> Self {
        let mut times: Vec<u64> = times_ns.to_vec();
        times.sort_unstable();
        let keep = times.len().saturating_sub(Self::most_entries(limit));
        SlidingLog {
            times_ns: times.split_off(keep).into(),
        }
    }

    /// The admission times, oldest first.
    pub fn times(&self) -> impl Iterator<Item = u64> + '_ {
        self.times_ns.iter().copied()
    }

    /// Merges a peer's copy of this log into the strictest view of both: its i-th newest entry
    /// is the later of the two copies' i-th newest, so at every later moment it holds as many
    /// entries in the period as the fuller of the two copies then, and denies whatever either
    /// would. Keeping the copy with more admissions now is not enough: its entries may be the
    /// older ones, and once they leave the period it admits beside the other copy's newer
    /// entries. Merging a copy with itself changes nothing (replicas do not double count).
    pub fn merge(&mut self, limit: &Limit, other: SlidingLog, now_ns: u64) {
        let mut other = other;
        self.forget_expired(limit, now_ns);
        other.forget_expired(limit, now_ns);
        let (mut mine, mut theirs) = (self.times_ns.iter().rev(), other.times_ns.iter().rev());
        let mut newest_first = Vec::with_capacity(self.len().max(other.len()));
        // Both sides newest first, so the later of each pair keeps the result in order.
        while let Some(&newest) = mine.next().max(theirs.next()) {
            newest_first.push(newest);
        }
        self.times_ns = newest_first.into_iter().rev().collect();
    }

    /// An empty log with room for `entries` times, so it need not grow while it fills.
    pub fn with_room(entries: usize) -> Self {
        SlidingLog {
            times_ns: Times::with_room(entries),
        }
    }

    /// An empty log made for a first admission of `cost` under `limit`: room for
    /// [`FIRST_ROOM`] times or the cost, whichever is more, and never more than the limit.
    pub fn first_for(limit: &Limit, cost: u64) -> Self {
        SlidingLog::with_room(first_room(limit, cost))
    }

    /// How many times the log has room for without growing.
    pub fn room(&self) -> usize {
        self.times_ns.room()
    }

    /// How many times it has room for on the heap, beyond the few kept in place (what its
    /// memory is beside its own size).
    pub fn heap_room(&self) -> usize {
        self.times_ns.heap_room()
    }

    /// The heap room a log made by [`SlidingLog::first_for`] has.
    pub fn first_heap_room(limit: &Limit, cost: u64) -> usize {
        Times::heap_room_for(first_room(limit, cost))
    }

    /// How much more room an admission of `cost` now would need: none when it fits or would be
    /// denied, else twice the room it has (at least what the cost needs, at most the limit), so
    /// a log filling one unit at a time grows about log2(limit / FIRST_ROOM) times.
    pub fn growth_for(&mut self, limit: &Limit, now_ns: u64, cost: u64) -> usize {
        self.forget_expired(limit, now_ns);
        let (len, cap, room) = (
            self.times_ns.len() as u64,
            limit.burst(),
            self.room() as u64,
        );
        if cost > cap || len + cost > cap || len + cost <= room {
            return 0;
        }
        // `room < len + cost <= cap`, so the target lies in (room, cap].
        let target = (len + cost).max(room.saturating_mul(2)).min(cap);
        (target - room) as usize
    }

    /// Makes room for `additional` more times.
    pub fn grow(&mut self, additional: usize) {
        self.times_ns
            .reserve_exact(self.room() - self.times_ns.len() + additional);
    }

    /// How much more heap room [`SlidingLog::grow`] by `additional` takes.
    pub fn heap_growth(&self, additional: usize) -> usize {
        Times::heap_room_for(self.room() + additional) - self.heap_room()
    }

    /// Number of recorded units (for memory accounting and tests).
    pub fn len(&self) -> usize {
        self.times_ns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.times_ns.is_empty()
    }

    fn reset_after(&self, period: u64, now_ns: u64) -> u64 {
        self.times_ns
            .back()
            .map_or(0, |t| t.saturating_add(period).saturating_sub(now_ns))
    }
}
