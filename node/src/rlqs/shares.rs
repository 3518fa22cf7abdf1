//! The fair-share allocator: for every bucket, the Envoys reporting it and the token bucket each
//! is assigned, so that what all of them can admit stays within the bucket's limit. Pure state:
//! the time comes in as nanoseconds, nothing here sleeps, sends or reads a clock.
//!
//! The arithmetic, for a limit of `N` requests per period `P` (whole seconds):
//!
//! - every Envoy holding an assignment (`k` of them) gets a token bucket of `max_tokens = 1`
//!   refilled at `tokens_per_fill = t_i` per `fill_interval = P`. In any window of length `P`,
//!   Envoy `i` admits at most `1 + t_i`.
//! - the shares are chosen so that `sum(1 + t_i) <= N`: `N - k` tokens per period are split.
//!   Half of them are split evenly (the floor: a new Envoy is never starved), the other half in
//!   proportion to each Envoy's recent demand (allowed + denied per period, from its reports).
//! - an Envoy whose stream closed, or that stopped reporting, may still enforce its last
//!   assignment until that expires: its `t_i` stays reserved (frozen) until then, and only
//!   then is it split among the others. So the sum holds at every instant.
//! - `t_i >= 1` always (Envoy needs a positive fill): with more than `N / 2` Envoys on one bucket
//!   the sum can exceed `N`; [`Shares::committed`] says by how much.

use std::collections::{BTreeMap, HashMap, HashSet};

use floodgate::NANOS_PER_SEC;

/// One Envoy's stream, numbered by the node.
pub type StreamId = u64;

/// Past an assignment's time to live, the node waits this long more before the share is given to
/// others: the Envoy received the assignment a little after it was sent.
pub const EXPIRY_MARGIN_NS: u64 = NANOS_PER_SEC;

/// A share within 1/SLACK (10 %, at least one token) of its new target is left as it is: two
/// Envoys reporting about the same load, one after the other, otherwise move a token or two
/// back and forth on every report.
const SLACK: u32 = 10;

/// A bucket: the stream's domain and its `BucketId` entries, sorted by key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BucketKey {
    pub domain: String,
    pub entries: Vec<(String, String)>,
}

/// `requests` per `period_s` seconds (at least one second).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    pub requests: u64,
    pub period_s: u64,
}

/// What one Envoy is told about one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Assignment {
    /// A token bucket of `max_tokens`, refilled by `tokens_per_fill` every `fill_interval_s`.
    TokenBucket {
        max_tokens: u32,
        tokens_per_fill: u32,
        fill_interval_s: u64,
    },
    /// Forget the bucket: it was idle for long enough.
    Abandon,
    /// Deny everything until it expires: the bucket was refused past a bound (never made by
    /// the allocator, only by the service around it).
    Deny,
}

/// An assignment for one stream and bucket, to be sent now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Push {
    pub stream: StreamId,
    pub bucket: BucketKey,
    pub assignment: Assignment,
}

/// What one report says about one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub allowed: u64,
    pub denied: u64,
    /// Since the Envoy's previous report of the bucket (0 in its first).
    pub elapsed_ns: u64,
    /// The `tokens_per_fill` the Envoy holds now by its node's record (0: none): what another
    /// owner gave it before the bucket moved here.
    pub held: u32,
}

/// The allocator's settings and bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharesConfig {
    /// The assignments' time to live.
    pub ttl_ns: u64,
    /// A bucket reported this many times in a row with no requests is abandoned (0: never).
    pub idle_reports_before_abandon: u32,
    pub max_envoys_per_bucket: usize,
    pub max_buckets_per_stream: usize,
    pub max_buckets: usize,
}

/// A report the allocator did not take; the bucket gets no assignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("the bucket already has the most Envoys sharing it ({0})")]
    TooManyEnvoys(usize),
    #[error("the stream already reports the most buckets ({0})")]
    TooManyStreamBuckets(usize),
    #[error("the node already holds the most buckets ({0})")]
    TooManyBuckets(usize),
}

impl Refused {
    /// The metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Refused::TooManyEnvoys(_) => "envoys_per_bucket",
            Refused::TooManyStreamBuckets(_) => "buckets_per_stream",
            Refused::TooManyBuckets(_) => "buckets",
        }
    }
}

#[derive(Debug, Clone)]
struct Participant {
    open: bool,
    last_report_ns: u64,
    /// When the last assignment sent stops binding the Envoy (with [`EXPIRY_MARGIN_NS`]).
    expires_ns: u64,
    /// Requests per period, smoothed over reports.
    demand: u64,
    /// The `tokens_per_fill` last sent.
    tokens: u32,
    idle_reports: u32,
}

#[derive(Debug)]
struct Bucket {
    limit: Limit,
    /// Until then no share grows and a new Envoy gets the least (1): an Envoy arrived holding
    /// an assignment this allocator did not give (the bucket moved here, from another owner or
    /// an earlier life of this one), so others may hold ones it has not heard of yet, and all
    /// of those have expired or been reported by then.
    settling_until_ns: u64,
    /// By stream id: ordered, so every split is deterministic.
    participants: BTreeMap<StreamId, Participant>,
}

/// Every bucket's Envoys and shares.
#[derive(Debug)]
pub struct Shares {
    config: SharesConfig,
    buckets: HashMap<BucketKey, Bucket>,
    per_stream: HashMap<StreamId, HashSet<BucketKey>>,
}

impl Shares {
    pub fn new(config: SharesConfig) -> Shares {
        Shares {
            config,
            buckets: HashMap::new(),
            per_stream: HashMap::new(),
        }
    }

    /// Takes `stream`'s report of `bucket` (limited by `limit`) at `now_ns` and rebalances the
    /// bucket. The pushes always hold the reporter's own assignment (renewed), and every other
    /// open Envoy's whose share changed, smaller shares first.
    pub fn report(
        &mut self,
        now_ns: u64,
        stream: StreamId,
        bucket: &BucketKey,
        limit: Limit,
        usage: Usage,
    ) -> Result<Vec<Push>, Refused> {
        self.expire_bucket(now_ns, bucket);
        let limit = Limit {
            requests: limit.requests,
            period_s: limit.period_s.max(1),
        };
        let known = self
            .buckets
            .get(bucket)
            .is_some_and(|b| b.participants.contains_key(&stream));
        if !known {
            self.admit(stream, bucket, limit)?;
        }
        let config = self.config;
        let Some(state) = self.buckets.get_mut(bucket) else {
            return Ok(Vec::new());
        };
        let settle_for = config.ttl_ns.saturating_add(EXPIRY_MARGIN_NS);
        if !known
            && usage.held > 0
            && let Some(me) = state.participants.get_mut(&stream)
        {
            // Counted as given until its next assignment replaces it.
            me.tokens = usage.held;
            me.expires_ns = now_ns.saturating_add(settle_for);
            state.settling_until_ns = now_ns.saturating_add(settle_for);
        }
        // A reloaded configuration may have changed the limit.
        state.limit = limit;
        let Some(me) = state.participants.get_mut(&stream) else {
            return Ok(Vec::new());
        };
        let count = usage.allowed.saturating_add(usage.denied);
        let period_ns = u128::from(limit.period_s) * u128::from(NANOS_PER_SEC);
        let rate = u128::from(count) * period_ns / u128::from(usage.elapsed_ns.max(NANOS_PER_SEC));
        let rate = u64::try_from(rate).unwrap_or(u64::MAX);
        me.demand = if known {
            me.demand / 2 + rate / 2
        } else {
            rate
        };
        me.idle_reports = if count == 0 {
            me.idle_reports.saturating_add(1)
        } else {
            0
        };
        me.last_report_ns = now_ns;
        me.open = true;
        let idle = config.idle_reports_before_abandon;
        if idle > 0 && me.idle_reports >= idle {
            // The Envoy forgets the bucket on this answer, so nothing of it is reserved.
            self.remove(stream, bucket);
            let mut pushes = vec![Push {
                stream,
                bucket: bucket.clone(),
                assignment: Assignment::Abandon,
            }];
            pushes.extend(self.rebalance(now_ns, bucket, None));
            return Ok(pushes);
        }
        Ok(self.rebalance(now_ns, bucket, Some(stream)))
    }

    /// `stream` closed: its shares stay reserved until its assignments expire.
    pub fn close(&mut self, stream: StreamId) {
        let Some(keys) = self.per_stream.get(&stream) else {
            return;
        };
        for key in keys {
            if let Some(p) = self
                .buckets
                .get_mut(key)
                .and_then(|b| b.participants.get_mut(&stream))
            {
                p.open = false;
            }
        }
    }

    /// Drops every share whose assignment has expired, and the buckets left with none.
    pub fn expire(&mut self, now_ns: u64) {
        let keys: Vec<BucketKey> = self.buckets.keys().cloned().collect();
        for key in keys {
            self.expire_bucket(now_ns, &key);
        }
    }

    /// True while `stream` holds (or is reserved) a share of some bucket.
    pub fn holds_stream(&self, stream: StreamId) -> bool {
        self.per_stream.contains_key(&stream)
    }

    /// Buckets held.
    pub fn bucket_count(&self) -> usize {
        self.buckets.len()
    }

    /// Envoys holding (or reserved) a share of `bucket`.
    pub fn envoys(&self, bucket: &BucketKey) -> usize {
        self.buckets.get(bucket).map_or(0, |b| b.participants.len())
    }

    /// The `tokens_per_fill` last sent to `stream` for `bucket`.
    pub fn tokens(&self, stream: StreamId, bucket: &BucketKey) -> Option<u32> {
        self.buckets
            .get(bucket)?
            .participants
            .get(&stream)
            .map(|p| p.tokens)
    }

    /// The most all of `bucket`'s Envoys can admit in one period by their assignments:
    /// `sum(max_tokens + tokens_per_fill)`.
    pub fn committed(&self, bucket: &BucketKey) -> u64 {
        self.buckets.get(bucket).map_or(0, |b| {
            b.participants
                .values()
                .map(|p| 1 + u64::from(p.tokens))
                .sum()
        })
    }

    /// The sum of `bucket`'s open Envoys' demand, requests per period.
    pub fn demand(&self, bucket: &BucketKey) -> u64 {
        self.buckets.get(bucket).map_or(0, |b| {
            b.participants
                .values()
                .filter(|p| p.open)
                .fold(0, |sum, p| sum.saturating_add(p.demand))
        })
    }

    /// `bucket`'s limit changed outside a report (its region's part of a global limit): the
    /// shares are rebalanced at once, so a shrink reaches the Envoys now, not at their next
    /// reports.
    pub fn set_limit(&mut self, now_ns: u64, bucket: &BucketKey, limit: Limit) -> Vec<Push> {
        let Some(state) = self.buckets.get_mut(bucket) else {
            return Vec::new();
        };
        if state.limit == limit {
            return Vec::new();
        }
        state.limit = limit;
        self.rebalance(now_ns, bucket, None)
    }

    fn admit(&mut self, stream: StreamId, bucket: &BucketKey, limit: Limit) -> Result<(), Refused> {
        let c = self.config;
        let stream_buckets = self.per_stream.get(&stream).map_or(0, HashSet::len);
        if stream_buckets >= c.max_buckets_per_stream {
            return Err(Refused::TooManyStreamBuckets(c.max_buckets_per_stream));
        }
        match self.buckets.get(bucket) {
            Some(b) if b.participants.len() >= c.max_envoys_per_bucket => {
                return Err(Refused::TooManyEnvoys(c.max_envoys_per_bucket));
            }
            None if self.buckets.len() >= c.max_buckets => {
                return Err(Refused::TooManyBuckets(c.max_buckets));
            }
            _ => {}
        }
        let state = self.buckets.entry(bucket.clone()).or_insert(Bucket {
            limit,
            settling_until_ns: 0,
            participants: BTreeMap::new(),
        });
        state.participants.insert(
            stream,
            Participant {
                open: true,
                last_report_ns: 0,
                expires_ns: 0,
                demand: 0,
                tokens: 0,
                idle_reports: 0,
            },
        );
        self.per_stream
            .entry(stream)
            .or_default()
            .insert(bucket.clone());
        Ok(())
    }

    fn remove(&mut self, stream: StreamId, bucket: &BucketKey) {
        if let Some(b) = self.buckets.get_mut(bucket) {
            b.participants.remove(&stream);
            if b.participants.is_empty() {
                self.buckets.remove(bucket);
            }
        }
        if let Some(keys) = self.per_stream.get_mut(&stream) {
            keys.remove(bucket);
            if keys.is_empty() {
                self.per_stream.remove(&stream);
            }
        }
    }

    fn expire_bucket(&mut self, now_ns: u64, bucket: &BucketKey) {
        let Some(b) = self.buckets.get(bucket) else {
            return;
        };
        let expired: Vec<StreamId> = b
            .participants
            .iter()
            .filter(|(_, p)| p.tokens > 0 && p.expires_ns <= now_ns)
            .map(|(s, _)| *s)
            .collect();
        for stream in expired {
            self.remove(stream, bucket);
        }
    }

    /// Splits the bucket's tokens among its live Envoys (open, reported within the time to
    /// live), the frozen ones keeping theirs; returns the changed assignments (and `reporter`'s).
    fn rebalance(
        &mut self,
        now_ns: u64,
        bucket: &BucketKey,
        reporter: Option<StreamId>,
    ) -> Vec<Push> {
        let ttl_ns = self.config.ttl_ns;
        let Some(state) = self.buckets.get_mut(bucket) else {
            return Vec::new();
        };
        let Some((available, targets)) = targets(state, now_ns, ttl_ns) else {
            return Vec::new();
        };
        let mut pushes = Vec::new();
        for (stream, old, tokens) in steadied(available, targets) {
            if tokens == old && Some(stream) != reporter {
                continue;
            }
            let Some(p) = state.participants.get_mut(&stream) else {
                continue;
            };
            p.tokens = tokens;
            p.expires_ns = now_ns
                .saturating_add(ttl_ns)
                .saturating_add(EXPIRY_MARGIN_NS);
            pushes.push((
                tokens >= old,
                Push {
                    stream,
                    bucket: bucket.clone(),
                    assignment: Assignment::TokenBucket {
                        max_tokens: 1,
                        tokens_per_fill: tokens,
                        fill_interval_s: state.limit.period_s,
                    },
                },
            ));
        }
        // Shrinks go out before grows, so the sum is never exceeded in between.
        pushes.sort_by_key(|(grows, _)| *grows);
        pushes.into_iter().map(|(_, p)| p).collect()
    }
}

/// A live Envoy in a rebalance: its stream, the tokens it holds, the tokens it is to hold.
type Target = (StreamId, u32, u32);

/// The tokens the bucket's live Envoys may share (its limit, less a token of burst for every
/// Envoy and what the frozen ones hold), and each live Envoy's (stream, tokens held, target)
/// by the formula: half split evenly, the other half by demand; while the bucket settles, no
/// target above what its Envoy holds, and 1 for a newcomer. `None`: no live Envoy.
fn targets(state: &Bucket, now_ns: u64, ttl_ns: u64) -> Option<(u128, Vec<Target>)> {
    let live = |p: &Participant| p.open && now_ns < p.last_report_ns.saturating_add(ttl_ns);
    let k_all = state.participants.len() as u64;
    // Every Envoy holds one token of burst; the rest is refill.
    let capacity = state.limit.requests.saturating_sub(k_all);
    let frozen: u64 = state
        .participants
        .values()
        .filter(|p| !live(p))
        .map(|p| u64::from(p.tokens))
        .sum();
    let available = u128::from(capacity.saturating_sub(frozen));
    let live_count = state.participants.values().filter(|p| live(p)).count() as u128;
    if live_count == 0 {
        return None;
    }
    let floor = available / (2 * live_count);
    let rest = available - floor * live_count;
    let demand: u128 = state
        .participants
        .values()
        .filter(|p| live(p))
        .map(|p| u128::from(p.demand))
        .sum();
    let targets: Vec<Target> = state
        .participants
        .iter()
        .filter(|(_, p)| live(p))
        .map(|(stream, p)| {
            // No demand reported yet: the rest is split evenly too.
            let extra = (rest * u128::from(p.demand))
                .checked_div(demand)
                .unwrap_or(rest / live_count);
            let target = u32::try_from(floor + extra).unwrap_or(u32::MAX).max(1);
            (*stream, p.tokens, target)
        })
        .collect();
    // While the bucket settles, shares only shrink and newcomers get the least.
    let settling = now_ns < state.settling_until_ns;
    let targets = if settling {
        targets
            .into_iter()
            .map(|(s, old, target)| (s, old, if old > 0 { target.min(old) } else { 1 }))
            .collect()
    } else {
        targets
    };
    Some((available, targets))
}

/// Each (stream, tokens held, target) as (stream, tokens held, tokens to give): the split by
/// the formula, then each share kept where it is within the slack of it (when the kept ones
/// still fit): Envoy resets a running bucket's fractional tokens on every change, so a share
/// that wobbles by a token each report would cost a token each time.
fn steadied(available: u128, targets: Vec<Target>) -> Vec<Target> {
    let steady = |old: u32, target: u32| old > 0 && old.abs_diff(target) <= (old / SLACK).max(1);
    let budget = available.max(targets.iter().map(|t| u128::from(t.2)).sum());
    let kept: u128 = targets
        .iter()
        .map(|&(_, old, target)| u128::from(if steady(old, target) { old } else { target }))
        .sum();
    let keep = kept <= budget;
    targets
        .into_iter()
        .map(|(stream, old, target)| {
            let tokens = if keep && steady(old, target) {
                old
            } else {
                target
            };
            (stream, old, tokens)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = NANOS_PER_SEC;
    const TTL: u64 = 15 * S;

    fn config() -> SharesConfig {
        SharesConfig {
            ttl_ns: TTL,
            idle_reports_before_abandon: 0,
            max_envoys_per_bucket: 64,
            max_buckets_per_stream: 100,
            max_buckets: 1_000,
        }
    }

    fn key(value: &str) -> BucketKey {
        BucketKey {
            domain: "edge".to_owned(),
            entries: vec![("name".to_owned(), value.to_owned())],
        }
    }

    const PER_MINUTE: Limit = Limit {
        requests: 600,
        period_s: 60,
    };

    fn usage(allowed: u64, denied: u64, elapsed_s: u64) -> Usage {
        Usage {
            allowed,
            denied,
            elapsed_ns: elapsed_s * S,
            held: 0,
        }
    }

    fn tokens_of(pushes: &[Push], stream: StreamId) -> Option<u32> {
        pushes.iter().find_map(|p| match p.assignment {
            Assignment::TokenBucket {
                tokens_per_fill, ..
            } if p.stream == stream => Some(tokens_per_fill),
            _ => None,
        })
    }

    #[test]
    fn a_lone_envoy_gets_the_whole_limit_less_its_burst() {
        let mut shares = Shares::new(config());
        let b = key("a");
        let pushes = shares.report(0, 1, &b, PER_MINUTE, usage(1, 0, 0)).unwrap();
        assert_eq!(
            pushes,
            vec![Push {
                stream: 1,
                bucket: b.clone(),
                assignment: Assignment::TokenBucket {
                    max_tokens: 1,
                    tokens_per_fill: 599,
                    fill_interval_s: 60,
                },
            }]
        );
        assert_eq!(shares.committed(&b), 600);
    }

    #[test]
    fn a_new_envoy_gets_at_least_the_floor_and_the_incumbent_shrinks_first() {
        let mut shares = Shares::new(config());
        let b = key("a");
        shares.report(0, 1, &b, PER_MINUTE, usage(1, 0, 0)).unwrap();
        // The incumbent reports heavy demand.
        shares
            .report(5 * S, 1, &b, PER_MINUTE, usage(500, 2_000, 5))
            .unwrap();
        let pushes = shares
            .report(6 * S, 2, &b, PER_MINUTE, usage(1, 0, 0))
            .unwrap();
        // 600 - 2 bursts = 598 tokens: 149 each as floor, 300 by demand.
        let incumbent = tokens_of(&pushes, 1).unwrap();
        let newcomer = tokens_of(&pushes, 2).unwrap();
        assert!(newcomer >= 149, "{newcomer}");
        assert!(incumbent > newcomer);
        assert_eq!(pushes[0].stream, 1, "the shrink goes first: {pushes:?}");
        assert!(shares.committed(&b) <= 600);
    }

    #[test]
    fn a_closed_stream_keeps_its_share_until_it_expires_then_others_get_it() {
        let mut shares = Shares::new(config());
        let b = key("a");
        shares.report(0, 1, &b, PER_MINUTE, usage(1, 0, 0)).unwrap();
        shares.report(0, 2, &b, PER_MINUTE, usage(1, 0, 0)).unwrap();
        let before = shares.tokens(2, &b).unwrap();
        shares.close(1);
        let pushes = shares
            .report(5 * S, 2, &b, PER_MINUTE, usage(10, 0, 5))
            .unwrap();
        assert_eq!(tokens_of(&pushes, 2), Some(before), "still reserved");
        assert_eq!(shares.envoys(&b), 2);
        // Past the time to live and the margin, the share returns.
        let later = TTL + EXPIRY_MARGIN_NS;
        let pushes = shares
            .report(later, 2, &b, PER_MINUTE, usage(10, 0, 5))
            .unwrap();
        assert_eq!(shares.envoys(&b), 1);
        assert_eq!(tokens_of(&pushes, 2), Some(599));
    }

    #[test]
    fn an_envoy_that_stops_reporting_is_frozen_then_dropped() {
        let mut shares = Shares::new(config());
        let b = key("a");
        shares.report(0, 1, &b, PER_MINUTE, usage(1, 0, 0)).unwrap();
        shares.report(0, 2, &b, PER_MINUTE, usage(1, 0, 0)).unwrap();
        let one = shares.tokens(1, &b).unwrap();
        // Envoy 1 is silent; Envoy 2 keeps reporting. Envoy 1 is never pushed to after its
        // time to live, so its assignment runs out, and then its tokens move.
        let mut t = 0;
        for _ in 0..4 {
            t += 5 * S;
            let pushes = shares
                .report(t, 2, &b, PER_MINUTE, usage(50, 0, 5))
                .unwrap();
            assert!(
                pushes.iter().all(|p| p.stream == 2 || t < TTL),
                "{pushes:?}"
            );
        }
        assert!(shares.committed(&b) <= 600);
        assert_eq!(shares.tokens(1, &b).map(|t| t <= one), Some(true));
        shares.expire(t + TTL + EXPIRY_MARGIN_NS);
        assert_eq!(shares.envoys(&b), 0, "every assignment ran out");
        assert_eq!(shares.bucket_count(), 0);
    }

    #[test]
    fn shares_follow_demand_on_every_report() {
        let mut shares = Shares::new(config());
        let b = key("a");
        shares.report(0, 1, &b, PER_MINUTE, usage(1, 0, 0)).unwrap();
        shares.report(0, 2, &b, PER_MINUTE, usage(1, 0, 0)).unwrap();
        let mut t = 0;
        for _ in 0..6 {
            t += 5 * S;
            shares
                .report(t, 1, &b, PER_MINUTE, usage(40, 400, 5))
                .unwrap();
            shares.report(t, 2, &b, PER_MINUTE, usage(2, 0, 5)).unwrap();
        }
        let (one, two) = (shares.tokens(1, &b).unwrap(), shares.tokens(2, &b).unwrap());
        // The floor is half an even split, so the most one Envoy gets is 3 floors.
        assert!(one > 2 * two, "{one} {two}");
        assert!(two >= 149, "the floor: {two}");
        assert!(shares.committed(&b) <= 600);
    }

    #[test]
    fn a_share_that_would_wobble_by_a_token_is_left_as_it_is() {
        let mut shares = Shares::new(config());
        let b = key("a");
        shares.report(0, 1, &b, PER_MINUTE, usage(1, 0, 0)).unwrap();
        shares.report(0, 2, &b, PER_MINUTE, usage(1, 0, 0)).unwrap();
        let mut t = 0;
        let mut settled = None;
        for round in 0..12u64 {
            t += 5 * S;
            // About the same load each, counts off by a request or two.
            let one = shares
                .report(t, 1, &b, PER_MINUTE, usage(25 + round % 2, 0, 5))
                .unwrap();
            shares
                .report(t, 2, &b, PER_MINUTE, usage(25 - round % 3, 0, 5))
                .unwrap();
            let now = (shares.tokens(1, &b), shares.tokens(2, &b));
            if round >= 4 {
                assert_eq!(Some(now), settled, "round {round}");
                assert_eq!(one.len(), 1, "only the reporter's renewal: {one:?}");
            }
            settled = Some(now);
        }
        assert!(shares.committed(&b) <= 600);
    }

    #[test]
    fn an_idle_bucket_is_abandoned_and_its_share_returns() {
        let mut shares = Shares::new(SharesConfig {
            idle_reports_before_abandon: 2,
            ..config()
        });
        let b = key("a");
        shares.report(0, 1, &b, PER_MINUTE, usage(1, 0, 0)).unwrap();
        shares.report(0, 2, &b, PER_MINUTE, usage(1, 0, 0)).unwrap();
        shares
            .report(5 * S, 1, &b, PER_MINUTE, usage(0, 0, 5))
            .unwrap();
        let pushes = shares
            .report(10 * S, 1, &b, PER_MINUTE, usage(0, 0, 5))
            .unwrap();
        assert_eq!(pushes[0].assignment, Assignment::Abandon);
        assert_eq!(pushes[0].stream, 1);
        assert_eq!(tokens_of(&pushes, 2), Some(599));
        assert_eq!(shares.envoys(&b), 1);
    }

    #[test]
    fn bounds_refuse_more_envoys_and_buckets_than_allowed() {
        let mut shares = Shares::new(SharesConfig {
            max_envoys_per_bucket: 2,
            max_buckets_per_stream: 2,
            max_buckets: 3,
            ..config()
        });
        let u = usage(1, 0, 0);
        shares.report(0, 1, &key("a"), PER_MINUTE, u).unwrap();
        shares.report(0, 2, &key("a"), PER_MINUTE, u).unwrap();
        let e = shares.report(0, 3, &key("a"), PER_MINUTE, u).unwrap_err();
        assert_eq!(e, Refused::TooManyEnvoys(2));
        shares.report(0, 1, &key("b"), PER_MINUTE, u).unwrap();
        let e = shares.report(0, 1, &key("c"), PER_MINUTE, u).unwrap_err();
        assert_eq!(e, Refused::TooManyStreamBuckets(2));
        shares.report(0, 3, &key("c"), PER_MINUTE, u).unwrap();
        let e = shares.report(0, 3, &key("d"), PER_MINUTE, u).unwrap_err();
        assert_eq!(e, Refused::TooManyBuckets(3));
        // A refused report leaves the others as they were.
        assert_eq!(shares.bucket_count(), 3);
        assert_eq!(shares.envoys(&key("a")), 2);
    }

    #[test]
    fn an_envoy_holding_another_owners_share_settles_the_bucket_until_old_shares_expire() {
        let mut shares = Shares::new(config());
        let b = key("a");
        // The bucket moved here: the first Envoy to report holds 299 from the old owner, and
        // another Envoy (not yet reported) may hold the rest.
        let held = Usage {
            held: 299,
            ..usage(20, 0, 5)
        };
        let pushes = shares.report(0, 1, &b, PER_MINUTE, held).unwrap();
        assert_eq!(tokens_of(&pushes, 1), Some(299), "kept, not grown to 599");
        // A newcomer while settling gets the least.
        let pushes = shares.report(S, 2, &b, PER_MINUTE, usage(1, 0, 0)).unwrap();
        assert_eq!(tokens_of(&pushes, 2), Some(1));
        // The Envoy that held the rest reports it: still nothing grows.
        let other = Usage {
            held: 299,
            ..usage(20, 0, 5)
        };
        shares.report(2 * S, 3, &b, PER_MINUTE, other).unwrap();
        assert!(shares.committed(&b) <= 600 + 2, "{}", shares.committed(&b));
        // Once every old assignment has expired or been reported, the split is the usual one.
        let later = 2 * S + TTL + EXPIRY_MARGIN_NS;
        for s in 1..=3 {
            shares
                .report(later, s, &b, PER_MINUTE, usage(20, 0, 5))
                .unwrap();
        }
        assert!(shares.tokens(2, &b).unwrap() > 1);
        assert!(shares.committed(&b) <= 600);
    }

    /// Envoys of `bucket` whose share cannot change now (closed, or silent past the TTL).
    fn frozen(shares: &Shares, bucket: &BucketKey, now: u64) -> usize {
        shares.buckets.get(bucket).map_or(0, |b| {
            b.participants
                .values()
                .filter(|p| !(p.open && now < p.last_report_ns + TTL))
                .count()
        })
    }

    /// xorshift64*: seeded, so every run draws the same sequence.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
        }
    }

    /// Random reports, joins, closes and clock steps (seeded): after every step, what the Envoys
    /// can admit stays within the limit (or the stated bound, while shares are frozen), and in
    /// the end nothing is kept past its expiry.
    #[test]
    fn random_runs_keep_the_sum_within_the_bound_and_expire_everything() {
        for seed in 1..=200u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let mut shares = Shares::new(SharesConfig {
                idle_reports_before_abandon: 3,
                ..config()
            });
            let limit = Limit {
                requests: 20 + rng.below(2_000),
                period_s: 1 + rng.below(120),
            };
            let b = key("a");
            let mut now = 0u64;
            let mut open: Vec<StreamId> = Vec::new();
            let mut next_stream = 1;
            for _ in 0..300 {
                now += rng.below(4 * S);
                match rng.below(10) {
                    0 if open.len() < 8 => {
                        open.push(next_stream);
                        next_stream += 1;
                    }
                    1 if !open.is_empty() => {
                        let gone = open.swap_remove(rng.below(open.len() as u64) as usize);
                        shares.close(gone);
                    }
                    2 => shares.expire(now),
                    _ if !open.is_empty() => {
                        let s = open[rng.below(open.len() as u64) as usize];
                        let quiet = rng.below(4) == 0;
                        let (allowed, denied) = if quiet {
                            (0, 0)
                        } else {
                            (rng.below(1_000), rng.below(1_000))
                        };
                        let pushes = shares
                            .report(now, s, &b, limit, usage(allowed, denied, 5))
                            .unwrap();
                        let k = shares.envoys(&b) as u64;
                        if let Some(t) = tokens_of(&pushes, s) {
                            assert!(t >= 1 && u64::from(t) <= limit.requests, "seed {seed}");
                        }
                        let committed = shares.committed(&b);
                        // With no frozen share and at least 3 tokens per Envoy (each holds 1 of
                        // burst and at least 1 of refill), the sum is within the limit; with
                        // frozen ones, each Envoy can add at most its minimum of 2.
                        if frozen(&shares, &b, now) == 0 && 3 * k <= limit.requests {
                            assert!(
                                committed <= limit.requests,
                                "seed {seed}: {committed} > {}",
                                limit.requests
                            );
                        }
                        assert!(committed <= limit.requests + 2 * k, "seed {seed}");
                    }
                    _ => {}
                }
            }
            shares.expire(now + TTL + EXPIRY_MARGIN_NS + 4 * S);
            assert_eq!(shares.bucket_count(), 0, "seed {seed}: all expired");
        }
    }

    #[test]
    fn the_floor_holds_for_every_live_envoy_when_none_is_frozen() {
        for seed in 1..=100u64 {
            let mut rng = Rng(seed.wrapping_mul(0xD1B5_4A32_D192_ED03));
            let mut shares = Shares::new(config());
            let limit = Limit {
                requests: 100 + rng.below(10_000),
                period_s: 60,
            };
            let b = key("a");
            let envoys = 1 + rng.below(10);
            for s in 1..=envoys {
                shares.report(0, s, &b, limit, usage(1, 0, 0)).unwrap();
            }
            let mut now = 0;
            for _ in 0..10 {
                now += 5 * S;
                for s in 1..=envoys {
                    let demand = if s == 1 { 100_000 } else { rng.below(10) };
                    shares
                        .report(now, s, &b, limit, usage(demand, 0, 5))
                        .unwrap();
                }
            }
            let floor = (limit.requests - envoys) / (2 * envoys);
            for s in 1..=envoys {
                let t = u64::from(shares.tokens(s, &b).unwrap());
                assert!(t >= floor, "seed {seed}: Envoy {s} has {t} < {floor}");
            }
            assert!(shares.committed(&b) <= limit.requests, "seed {seed}");
        }
    }
}
