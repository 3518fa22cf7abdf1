//! The gateway's side of a token lease, as pure values on an injected `now`: one key's
//! [`Allowance`] (tokens in hand, when they lapse, a local denial until the owner's next token),
//! the [`RateMeter`] that tells a hot key, and the [`LeaseSizing`] rule.

use crate::{Limit, NANOS_PER_SEC};

/// How big a lease is and how long it may be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseSizing {
    /// A lease is about this much of the gateway's own rate for the key: short, so tokens
    /// sitting at one gateway are few.
    pub period_ns: u64,
    /// Unused tokens lapse this long after they were asked for, and are returned: it bounds
    /// how long a token can wait at a gateway before it is used.
    pub ttl_ns: u64,
    /// A lease is at most `burst / max_burst_divisor`, so several gateways sharing a key each
    /// get some.
    pub max_burst_divisor: u64,
}

impl Default for LeaseSizing {
    fn default() -> Self {
        LeaseSizing {
            period_ns: 100_000_000,
            ttl_ns: NANOS_PER_SEC,
            max_burst_divisor: 4,
        }
    }
}

impl LeaseSizing {
    /// Tokens to ask for: the gateway's rate for the key over `period_ns`, at least 1 and at
    /// most a quarter (by default) of the burst, so other gateways always find some.
    pub fn want(&self, limit: &Limit, gateway_per_sec: u64) -> u64 {
        let share = ceil_div(
            u128::from(gateway_per_sec) * u128::from(self.period_ns),
            u128::from(NANOS_PER_SEC),
        );
        let burst_share = u128::from(limit.burst() / self.max_burst_divisor.max(1));
        let want = share.min(burst_share).max(1);
        u64::try_from(want).unwrap_or(u64::MAX)
    }

    /// Most tokens one gateway holds for a key at once: a refill is asked for once fewer than
    /// half of a grant remain, so half a lease plus a whole one. What a crashed gateway strands.
    pub fn most_held(&self, limit: &Limit) -> u64 {
        let lease = (limit.burst() / self.max_burst_divisor.max(1)).max(1);
        lease + lease.div_ceil(2)
    }
}

fn ceil_div(a: u128, b: u128) -> u128 {
    a.div_ceil(b.max(1))
}

/// Demand for one key, counted in windows: how a client tells a hot key and sizes its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateMeter {
    window_ns: u64,
    window: u64,
    current: u64,
    previous: u64,
}

impl RateMeter {
    pub fn new(window_ns: u64) -> Self {
        RateMeter {
            window_ns: window_ns.max(1),
            window: 0,
            current: 0,
            previous: 0,
        }
    }

    /// Counts `units` asked for at `now_ns`.
    pub fn record(&mut self, units: u64, now_ns: u64) {
        self.roll(now_ns);
        self.current = self.current.saturating_add(units);
    }

    /// Units per second: the larger of the last full window and the current one so far (a key
    /// turning hot shows within one window; one that cools shows within two).
    pub fn per_sec(&mut self, now_ns: u64) -> u64 {
        self.roll(now_ns);
        let count = u128::from(self.previous.max(self.current));
        let per_sec = count * u128::from(NANOS_PER_SEC) / u128::from(self.window_ns);
        u64::try_from(per_sec).unwrap_or(u64::MAX)
    }

    fn roll(&mut self, now_ns: u64) {
        let window = now_ns / self.window_ns;
        if window == self.window {
            return;
        }
        self.previous = if window == self.window + 1 {
            self.current
        } else {
            0
        };
        self.current = 0;
        self.window = window;
    }
}

/// What a gateway can answer on its own for a leased key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalDecision {
    /// Admitted against the lease; `remaining` tokens are left in it.
    Allowed { remaining: u64 },
    /// The owner said no token exists before this wait: denied without asking it again.
    Denied { retry_after_ns: u64 },
    /// No local answer (too few tokens, or they lapsed): ask the owner as usual.
    Ask,
}

/// One key's lease at one gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Allowance {
    tokens: u64,
    /// Tokens are not used at or after this instant; they are returned instead.
    expires_at_ns: u64,
    /// The owner's next token is not due before this instant.
    denied_until_ns: u64,
    /// Size of the last grant: a refill is due once fewer than half of it remain.
    last_grant: u64,
    /// A request for tokens is on its way: never two at once for one key.
    refilling: bool,
}

impl Allowance {
    /// Decides `cost` locally at `now_ns` if the lease can.
    pub fn decide(&mut self, cost: u64, now_ns: u64) -> LocalDecision {
        if cost > 0 && now_ns < self.expires_at_ns && self.tokens >= cost {
            self.tokens -= cost;
            return LocalDecision::Allowed {
                remaining: self.tokens,
            };
        }
        if now_ns < self.denied_until_ns {
            return LocalDecision::Denied {
                retry_after_ns: self.denied_until_ns - now_ns,
            };
        }
        LocalDecision::Ask
    }

    /// True when a refill should be asked for now: none is on its way, the owner may have a
    /// token, and the lease is low (under half its last grant) or has lapsed.
    pub fn wants_refill(&self, now_ns: u64) -> bool {
        !self.refilling
            && now_ns >= self.denied_until_ns
            && (now_ns >= self.expires_at_ns || self.tokens.saturating_mul(2) <= self.last_grant)
    }

    /// Marks a refill as sent; returns the unused tokens that lapsed, which go back to the owner
    /// with it.
    pub fn start_refill(&mut self, now_ns: u64) -> u64 {
        self.refilling = true;
        self.take_lapsed(now_ns)
    }

    /// The owner's answer to a refill sent at `sent_at_ns`. Expiry and any denial count from
    /// when it was sent: the owner decided at or after that, so its next token is not due before
    /// `sent_at_ns + retry_after_ns` either, and a lease never outlives its TTL on the owner's
    /// timeline.
    pub fn granted(&mut self, granted: u64, retry_after_ns: u64, sent_at_ns: u64, ttl_ns: u64) {
        self.refilling = false;
        if granted > 0 {
            self.tokens = self.tokens.saturating_add(granted);
            self.expires_at_ns = sent_at_ns.saturating_add(ttl_ns);
            self.last_grant = granted;
        } else {
            self.denied_until_ns = sent_at_ns.saturating_add(retry_after_ns);
        }
    }

    /// The refill got no answer (the node is unreachable): nothing was granted that we know of.
    pub fn refill_failed(&mut self) {
        self.refilling = false;
    }

    /// Hands over the tokens that lapsed (to return them); none before expiry.
    pub fn take_lapsed(&mut self, now_ns: u64) -> u64 {
        if now_ns >= self.expires_at_ns {
            std::mem::take(&mut self.tokens)
        } else {
            0
        }
    }

    /// Hands over every unused token (the key cooled or the cache is closing).
    pub fn take_all(&mut self) -> u64 {
        std::mem::take(&mut self.tokens)
    }

    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    pub fn is_refilling(&self) -> bool {
        self.refilling
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = NANOS_PER_SEC;
    const MS: u64 = 1_000_000;

    #[test]
    fn a_lease_admits_exactly_its_tokens_then_asks() {
        let mut lease = Allowance::default();
        assert_eq!(
            lease.decide(1, S),
            LocalDecision::Ask,
            "nothing in hand yet"
        );
        assert!(lease.wants_refill(S));
        assert_eq!(lease.start_refill(S), 0);
        assert!(!lease.wants_refill(S), "one refill at a time");
        lease.granted(3, 0, S, S);
        assert_eq!(lease.decide(1, S), LocalDecision::Allowed { remaining: 2 });
        assert!(!lease.wants_refill(S), "2 of 3 left: not low yet");
        assert_eq!(lease.decide(2, S), LocalDecision::Allowed { remaining: 0 });
        assert_eq!(lease.decide(1, S), LocalDecision::Ask);
        assert!(lease.wants_refill(S));
    }

    #[test]
    fn tokens_lapse_at_the_ttl_and_are_handed_back() {
        let mut lease = Allowance::default();
        lease.start_refill(0);
        lease.granted(5, 0, 10 * MS, 100 * MS);
        assert_eq!(lease.take_lapsed(109 * MS), 0, "not yet");
        assert_eq!(
            lease.decide(1, 110 * MS - 1),
            LocalDecision::Allowed { remaining: 4 }
        );
        assert_eq!(lease.decide(1, 110 * MS), LocalDecision::Ask, "lapsed");
        assert!(lease.wants_refill(110 * MS));
        assert_eq!(lease.start_refill(110 * MS), 4, "the unused 4 go back");
        assert_eq!(lease.tokens(), 0);
    }

    #[test]
    fn no_token_means_a_local_denial_until_the_owner_said() {
        let mut lease = Allowance::default();
        lease.start_refill(S);
        lease.granted(0, 250 * MS, S, S);
        assert_eq!(
            lease.decide(1, S + 100 * MS),
            LocalDecision::Denied {
                retry_after_ns: 150 * MS
            }
        );
        assert!(!lease.wants_refill(S + 250 * MS - 1));
        assert_eq!(lease.decide(1, S + 250 * MS), LocalDecision::Ask);
        assert!(lease.wants_refill(S + 250 * MS));
    }

    #[test]
    fn tokens_in_hand_are_used_before_a_denial_is() {
        let mut lease = Allowance::default();
        lease.start_refill(0);
        lease.granted(2, 0, 0, S);
        lease.start_refill(0);
        lease.granted(0, 500 * MS, 0, S);
        assert_eq!(lease.decide(1, MS), LocalDecision::Allowed { remaining: 1 });
        assert_eq!(lease.decide(1, MS), LocalDecision::Allowed { remaining: 0 });
        assert_eq!(
            lease.decide(1, MS),
            LocalDecision::Denied {
                retry_after_ns: 499 * MS
            }
        );
    }

    #[test]
    fn a_failed_refill_can_be_tried_again() {
        let mut lease = Allowance::default();
        lease.start_refill(0);
        lease.refill_failed();
        assert!(lease.wants_refill(0));
        assert!(!lease.is_refilling());
    }

    #[test]
    fn sizing_is_the_gateway_share_capped_by_the_limit() {
        let sizing = LeaseSizing::default();
        let limit = Limit::gcra(1_000, S, 1_000).unwrap();
        assert_eq!(sizing.want(&limit, 0), 1);
        assert_eq!(sizing.want(&limit, 200), 20, "200/s over 100 ms");
        assert_eq!(
            sizing.want(&limit, 1_000_000),
            250,
            "a quarter of the burst"
        );
        let small = Limit::gcra(1_000, S, 40).unwrap();
        assert_eq!(sizing.want(&small, 1_000_000), 10);
        assert_eq!(sizing.most_held(&small), 15);
        let tiny = Limit::gcra(1, S, 1).unwrap();
        assert_eq!(sizing.want(&tiny, 1_000_000), 1);
        assert_eq!(sizing.most_held(&tiny), 2);
    }

    #[test]
    fn the_meter_sees_a_key_turn_hot_and_cool() {
        let mut meter = RateMeter::new(100 * MS);
        for i in 0..50 {
            meter.record(1, S + i * MS);
        }
        assert_eq!(meter.per_sec(S + 50 * MS), 500);
        assert_eq!(meter.per_sec(S + 150 * MS), 500, "last full window");
        assert_eq!(meter.per_sec(S + 250 * MS), 0, "two quiet windows");
    }
}
