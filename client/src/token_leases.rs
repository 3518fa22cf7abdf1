//! Token leases at the gateway: hot keys decided here against tokens leased from their owner.
//!
//! A single-check call on a key this gateway checks above `hot_above_per_sec` is answered from
//! the key's [`Allowance`] (the core's `token_lease`): admitted while leased tokens remain,
//! denied while the owner has said its next token is not yet due. Everything else (a cold key,
//! an empty lease, tokens that lapsed) goes to the owner as usual, so the hot path never waits
//! for a lease. Refills run in the background once a lease is half used, on their own stream of
//! the owner's connection (kind 18), returning lapsed tokens with them; a sweep returns the
//! tokens of keys that cooled. Keys are metered and leased in a bounded map.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use floodgate::check::{Check, Source, Verdict};
use floodgate::region::Scope;
use floodgate::token_lease::{Allowance, Grant, LeaseSizing, LocalDecision, RateMeter};
use floodgate::wire::{
    ErrorCode, FrameKind, TokenLeaseBatch, TokenLeaseRequest, decode_token_lease_answers,
};
use floodgate::{Decision, Limit};
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::config::TokenLeaseConfig;
use crate::request::request;
use crate::routing::Routing;

/// Shards of the key map: concurrent checks on different keys rarely share a lock.
const SHARDS: usize = 16;
/// Longest a refill waits for the owner's answer; then nothing is known to be granted.
const REFILL_TIMEOUT: Duration = Duration::from_millis(250);
/// Largest answer a refill reads (one answer per request; a few dozen bytes each).
const MAX_ANSWER_BYTES: usize = 64 * 1024;
/// The meter's window: a key turning hot is seen within this long.
const METER_WINDOW_NS: u64 = 100_000_000;

/// One metered key: its limit, its demand here, and its lease.
#[derive(Debug)]
struct Entry {
    limit: Limit,
    meter: RateMeter,
    allowance: Allowance,
    /// After a refill failed (owner unreachable, not the owner), none before this instant.
    quiet_until_ns: u64,
    /// Checks a second from which the key is leased (the rule's, else the config's).
    hot_above_per_sec: u64,
}

impl Entry {
    fn new(limit: Limit, hot_above_per_sec: u64) -> Self {
        Entry {
            limit,
            meter: RateMeter::new(METER_WINDOW_NS),
            allowance: Allowance::default(),
            quiet_until_ns: 0,
            hot_above_per_sec,
        }
    }

    fn is_hot(&mut self, now_ns: u64) -> bool {
        self.meter.per_sec(now_ns) >= self.hot_above_per_sec
    }

    /// Holds nothing worth keeping: no tokens, nothing on its way.
    fn is_idle(&self) -> bool {
        self.allowance.tokens() == 0 && !self.allowance.is_refilling()
    }
}

/// One shard of the key map.
type KeyShard = Mutex<HashMap<Vec<u8>, Entry>>;

/// A request for tokens (and the return of lapsed ones) to send to a key's owner.
#[derive(Debug)]
struct Refill {
    key: Vec<u8>,
    limit: Limit,
    want: u64,
    returning: u64,
    sent_at_ns: u64,
}

/// What a client's token leases did so far, and hold now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TokenLeaseStats {
    /// Checks admitted here against leased tokens.
    pub local_allowed: u64,
    /// Checks denied here because the owner said no token was due yet.
    pub local_denied: u64,
    /// Tokens owners granted.
    pub granted: u64,
    /// Tokens given back to owners (lapsed, cooled, limit changed, or granted too late).
    pub returned: u64,
    /// Tokens held now, over all keys.
    pub held: u64,
    /// Refills on their way now.
    pub refilling: u64,
    /// Keys metered now.
    pub keys: u64,
}

#[derive(Debug, Default)]
struct Counters {
    local_allowed: AtomicU64,
    local_denied: AtomicU64,
    granted: AtomicU64,
    returned: AtomicU64,
}

/// The gateway's token leases: shared by every clone of a `Client`.
#[derive(Debug)]
pub(crate) struct TokenLeases {
    config: TokenLeaseConfig,
    sizing: LeaseSizing,
    routing: Arc<Routing>,
    started: Instant,
    hasher: RandomState,
    shards: Box<[KeyShard]>,
    keys_per_shard: usize,
    counters: Counters,
}

impl TokenLeases {
    /// The leases of a client routing by `routing`: for every key when the config enables
    /// them, else only for checks whose rule asks (`lease_above`).
    pub(crate) fn new(config: TokenLeaseConfig, routing: Arc<Routing>) -> Arc<Self> {
        Arc::new(TokenLeases {
            sizing: LeaseSizing {
                period_ns: duration_ns(config.lease_period),
                ttl_ns: duration_ns(config.ttl),
                ..LeaseSizing::default()
            },
            config,
            routing,
            started: Instant::now(),
            hasher: RandomState::new(),
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            keys_per_shard: config.max_keys.div_ceil(SHARDS),
            counters: Counters::default(),
        })
    }

    /// Nanoseconds on this cache's own timeline (tokio's clock, so paused time moves it).
    fn now_ns(&self) -> u64 {
        duration_ns(self.started.elapsed())
    }

    fn shard(&self, key: &[u8]) -> &KeyShard {
        &self.shards[self.hasher.hash_one(key) as usize % SHARDS]
    }

    /// The hot path: a verdict decided here for a single check on a leased key, or `None` to
    /// ask its owner as usual. Starts a refill in the background when the lease runs low.
    pub(crate) fn decide(self: &Arc<Self>, check: &Check) -> Option<Verdict> {
        // Only what an owner decides within this region and consumes can be leased.
        if check.scope != Scope::Region || check.cost == 0 {
            return None;
        }
        let hot_above_per_sec = match check.lease_above_per_sec {
            Some(per_sec) => per_sec,
            None if self.config.enabled => self.config.hot_above_per_sec,
            None => return None,
        };
        let now_ns = self.now_ns();
        let (local, refill, stale) = {
            let mut shard = self.shard(&check.key).lock();
            let entry = match shard.get_mut(check.key.as_slice()) {
                Some(entry) => entry,
                None => {
                    if shard.len() >= self.keys_per_shard && !self.make_room(&mut shard, now_ns) {
                        return None;
                    }
                    shard
                        .entry(check.key.clone())
                        .or_insert_with(|| Entry::new(check.limit, hot_above_per_sec))
                }
            };
            entry.hot_above_per_sec = hot_above_per_sec;
            // Another limit for the key (a rules edit): its tokens go back under the old one.
            let stale = (entry.limit != check.limit).then(|| {
                let returned = entry.allowance.take_all();
                let old = entry.limit;
                *entry = Entry::new(check.limit, hot_above_per_sec);
                (old, returned)
            });
            entry.meter.record(check.cost, now_ns);
            let local = entry.allowance.decide(check.cost, now_ns);
            let refill = self.refill_due(&check.key, entry, now_ns);
            (local, refill, stale)
        };
        if let Some((old, returned)) = stale.filter(|(_, n)| *n > 0) {
            self.spawn_return(check.key.clone(), old, returned);
        }
        if let Some(refill) = refill {
            let leases = self.clone();
            tokio::spawn(async move { leases.refill(refill).await });
        }
        match local {
            LocalDecision::Allowed { remaining } => {
                self.counters.local_allowed.fetch_add(1, Ordering::Relaxed);
                Some(Verdict {
                    decision: Decision::Allowed {
                        remaining,
                        reset_after_ns: 0,
                    },
                    source: Source::Node,
                })
            }
            LocalDecision::Denied { retry_after_ns } => {
                self.counters.local_denied.fetch_add(1, Ordering::Relaxed);
                Some(Verdict {
                    decision: Decision::Denied {
                        remaining: 0,
                        retry_after_ns,
                        reset_after_ns: retry_after_ns,
                    },
                    source: Source::Node,
                })
            }
            LocalDecision::Ask => None,
        }
    }

    /// A refill to send now, if the key is hot and its lease is low (marked as on its way).
    fn refill_due(&self, key: &[u8], entry: &mut Entry, now_ns: u64) -> Option<Refill> {
        let per_sec = entry.meter.per_sec(now_ns);
        if per_sec < entry.hot_above_per_sec
            || now_ns < entry.quiet_until_ns
            || !entry.allowance.wants_refill(now_ns)
        {
            return None;
        }
        let returning = entry.allowance.start_refill(now_ns);
        Some(Refill {
            key: key.to_vec(),
            limit: entry.limit,
            want: self.sizing.want(&entry.limit, per_sec),
            returning,
            sent_at_ns: now_ns,
        })
    }

    /// Drops idle keys that are not hot from a full shard; true if there is room now.
    fn make_room(&self, shard: &mut HashMap<Vec<u8>, Entry>, now_ns: u64) -> bool {
        // Kept: keys holding tokens or a refill, and hot keys.
        shard.retain(|_, e| !e.is_idle() || e.is_hot(now_ns));
        shard.len() < self.keys_per_shard
    }

    /// Asks the owner for tokens (returning lapsed ones) and applies its answer.
    async fn refill(self: Arc<Self>, refill: Refill) {
        let asked = self
            .ask(&refill.key, &refill.limit, refill.want, refill.returning)
            .await;
        let unclaimed = self.take_grant(&refill, asked);
        if unclaimed > 0 {
            self.spawn_return(refill.key, refill.limit, unclaimed);
        }
    }

    /// Applies the owner's answer to `refill`; returns the tokens granted and not kept, to
    /// give back.
    fn take_grant(&self, refill: &Refill, asked: Result<Grant, String>) -> u64 {
        {
            let mut shard = self.shard(&refill.key).lock();
            match (shard.get_mut(refill.key.as_slice()), asked) {
                (Some(entry), Ok(grant)) if entry.limit == refill.limit => {
                    // A node grants at most what was asked for; more is not spent here but
                    // given back, so a faulty owner cannot hand this gateway a limit's worth.
                    let kept = grant.granted.min(refill.want);
                    self.counters.granted.fetch_add(kept, Ordering::Relaxed);
                    entry.allowance.granted(
                        kept,
                        grant.retry_after_ns,
                        refill.sent_at_ns,
                        self.sizing.ttl_ns,
                    );
                    grant.granted - kept
                }
                (Some(entry), Err(_)) => {
                    entry.allowance.refill_failed();
                    entry.quiet_until_ns = self.now_ns().saturating_add(self.sizing.period_ns);
                    0
                }
                // The key left the map or changed its limit meanwhile: give the grant back.
                (_, Ok(grant)) => {
                    self.counters
                        .granted
                        .fetch_add(grant.granted, Ordering::Relaxed);
                    grant.granted
                }
                (None, Err(_)) => 0,
            }
        }
    }

    fn spawn_return(self: &Arc<Self>, key: Vec<u8>, limit: Limit, tokens: u64) {
        self.counters.returned.fetch_add(tokens, Ordering::Relaxed);
        let leases = self.clone();
        tokio::spawn(async move {
            // Best effort: tokens that cannot be returned come back as the bucket refills.
            let _ = leases.send(&key, &limit, 0, tokens).await;
        });
    }

    /// One kind 18 request to the key's owner: `want` tokens, `returning` given back first.
    async fn ask(
        &self,
        key: &[u8],
        limit: &Limit,
        want: u64,
        returning: u64,
    ) -> Result<Grant, String> {
        if returning > 0 {
            // Counted when handed over: this gateway no longer holds them, answered or not.
            self.counters
                .returned
                .fetch_add(returning, Ordering::Relaxed);
        }
        self.send(key, limit, want, returning).await
    }

    async fn send(
        &self,
        key: &[u8],
        limit: &Limit,
        want: u64,
        returning: u64,
    ) -> Result<Grant, String> {
        let routes = self.routing.routes();
        let link = &routes.links[routes.route(key)];
        let connection = link
            .connection()
            .ok_or_else(|| format!("no connection to {}", link.addr))?;
        let batch = TokenLeaseBatch {
            requests: vec![TokenLeaseRequest::new(key, limit, want, returning)],
        };
        let payload = rkyv::to_bytes::<rkyv::rancor::Error>(&batch).map_err(|e| e.to_string())?;
        let answer = tokio::time::timeout(
            REFILL_TIMEOUT,
            request(
                &connection,
                FrameKind::TokenLeaseBatch,
                &payload,
                FrameKind::TokenLeaseAnswers,
                MAX_ANSWER_BYTES,
            ),
        )
        .await
        .map_err(|_| format!("no token lease answer within {REFILL_TIMEOUT:?}"))??;
        let (answers, _) = decode_token_lease_answers(&answer).map_err(|(_, why)| why)?;
        match answers.as_slice() {
            [one] => one.to_grant().map_err(|code: ErrorCode| code.to_string()),
            other => Err(format!(
                "{} token lease answers for one request",
                other.len()
            )),
        }
    }

    /// Returns the tokens that lapsed and forgets keys that cooled: run every TTL.
    fn sweep(self: &Arc<Self>) {
        let now_ns = self.now_ns();
        let mut returns = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            shard.retain(|key, entry| {
                if !entry.allowance.is_refilling() {
                    let lapsed = entry.allowance.take_lapsed(now_ns);
                    if lapsed > 0 {
                        returns.push((key.clone(), entry.limit, lapsed));
                    }
                }
                !(entry.is_idle() && entry.meter.per_sec(now_ns) == 0)
            });
        }
        for (key, limit, tokens) in returns {
            self.spawn_return(key, limit, tokens);
        }
    }

    /// Sweeps every TTL until shutdown, then returns what is still held (best effort: the
    /// connections may be closing too; `Client::close` returns them before that).
    pub(crate) async fn run_sweeper(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut every = tokio::time::interval(self.config.ttl);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = every.tick() => self.sweep(),
                _ = shutdown.wait_for(|&stop| stop) => break,
            }
        }
        self.return_all().await;
    }

    /// Gives every unused token back to its owner, all requests at once, waiting at most
    /// `REFILL_TIMEOUT` for their answers.
    pub(crate) async fn return_all(self: &Arc<Self>) {
        let mut returns = tokio::task::JoinSet::new();
        for shard in self.shards.iter() {
            for (key, entry) in shard.lock().iter_mut() {
                let tokens = entry.allowance.take_all();
                if tokens > 0 {
                    let (leases, key, limit) = (self.clone(), key.clone(), entry.limit);
                    returns.spawn(async move { leases.ask(&key, &limit, 0, tokens).await });
                }
            }
        }
        let _ = tokio::time::timeout(REFILL_TIMEOUT, async {
            while returns.join_next().await.is_some() {}
        })
        .await;
    }

    pub(crate) fn stats(&self) -> TokenLeaseStats {
        let mut stats = TokenLeaseStats {
            local_allowed: self.counters.local_allowed.load(Ordering::Relaxed),
            local_denied: self.counters.local_denied.load(Ordering::Relaxed),
            granted: self.counters.granted.load(Ordering::Relaxed),
            returned: self.counters.returned.load(Ordering::Relaxed),
            ..TokenLeaseStats::default()
        };
        for shard in self.shards.iter() {
            for entry in shard.lock().values() {
                stats.held = stats.held.saturating_add(entry.allowance.tokens());
                stats.refilling += u64::from(entry.allowance.is_refilling());
                stats.keys += 1;
            }
        }
        stats
    }

    /// Tokens held for `key` right now (tests and diagnostics).
    #[cfg(test)]
    fn tokens(&self, key: &[u8]) -> u64 {
        self.shard(key)
            .lock()
            .get(key)
            .map_or(0, |e| e.allowance.tokens())
    }
}

fn duration_ns(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ClientConfig;
    use crate::link::NodeLink;

    const MS: u64 = 1_000_000;

    /// A cache whose one link never connects: refills and returns fail at once, so what is
    /// tested is the cache's own bookkeeping, on tokio's paused clock.
    fn offline() -> Arc<TokenLeases> {
        let config = ClientConfig::with_ca_file("unused.pem");
        let link = Arc::new(NodeLink::new(([127, 0, 0, 1], 7100).into(), &config));
        let leases = TokenLeaseConfig {
            enabled: true,
            hot_above_per_sec: 50,
            max_keys: 32,
            ..TokenLeaseConfig::default()
        };
        TokenLeases::new(leases, Arc::new(Routing::new(vec![link])))
    }

    fn limit() -> Limit {
        Limit::gcra(1_000, 1_000_000_000, 1_000).unwrap()
    }

    /// Gives `key` a lease of `tokens`, as an owner's answer would.
    fn grant(leases: &TokenLeases, key: &[u8], tokens: u64) {
        let now = leases.now_ns();
        let mut shard = leases.shard(key).lock();
        let entry = shard
            .entry(key.to_vec())
            .or_insert_with(|| Entry::new(limit(), 50));
        entry.allowance.start_refill(now);
        entry
            .allowance
            .granted(tokens, 0, now, leases.sizing.ttl_ns);
    }

    /// A faulty owner's grant of more than was asked for: the ask is kept, the rest is to be
    /// given back, and only the ask is spent here.
    #[tokio::test(start_paused = true)]
    async fn a_grant_past_the_ask_keeps_the_ask_and_gives_the_rest_back() {
        let leases = offline();
        let check = Check::new("k", limit());
        assert_eq!(leases.decide(&check), None, "nothing leased yet");
        let now = leases.now_ns();
        let refill = {
            let mut shard = leases.shard(b"k").lock();
            let entry = shard.get_mut(b"k".as_slice()).expect("the key is metered");
            entry.allowance.start_refill(now);
            Refill {
                key: b"k".to_vec(),
                limit: limit(),
                want: 5,
                returning: 0,
                sent_at_ns: now,
            }
        };
        let lying = Grant {
            granted: 1_000_000,
            remaining: 0,
            retry_after_ns: 0,
        };
        assert_eq!(leases.take_grant(&refill, Ok(lying)), 1_000_000 - 5);
        assert_eq!(leases.stats().held, 5);
        assert_eq!(leases.stats().granted, 5);
        for _ in 0..5 {
            assert!(leases.decide(&check).unwrap().is_allowed());
        }
        assert_eq!(leases.decide(&check), None, "the ask is used up");
    }

    #[tokio::test(start_paused = true)]
    async fn a_cold_key_is_asked_and_a_leased_one_is_decided_here() {
        let leases = offline();
        let check = Check::new("k", limit());
        assert_eq!(leases.decide(&check), None, "nothing leased yet");
        grant(&leases, b"k", 2);
        assert!(leases.decide(&check).unwrap().is_allowed());
        assert!(leases.decide(&check).unwrap().is_allowed());
        assert_eq!(leases.decide(&check), None, "the lease is used up");
        assert_eq!(leases.stats().local_allowed, 2);
        // Peeks and other scopes are never decided against a lease.
        grant(&leases, b"k", 5);
        assert_eq!(leases.decide(&check.clone().cost(0)), None);
        let global = check.clone().scope(Scope::Global);
        assert_eq!(leases.decide(&global), None);
    }

    #[tokio::test(start_paused = true)]
    async fn lapsed_tokens_are_taken_back_at_the_ttl_and_cold_keys_forgotten() {
        let leases = offline();
        grant(&leases, b"k", 7);
        tokio::time::advance(Duration::from_nanos(999 * MS)).await;
        leases.sweep();
        assert_eq!(leases.tokens(b"k"), 7, "not lapsed before the TTL");
        tokio::time::advance(Duration::from_nanos(MS)).await;
        let check = Check::new("k", limit());
        assert_eq!(leases.decide(&check), None, "lapsed tokens are not used");
        leases.sweep();
        assert_eq!(leases.tokens(b"k"), 0);
        assert_eq!(leases.stats().returned, 7, "sent back to the owner");
        tokio::time::advance(Duration::from_millis(300)).await;
        leases.sweep();
        assert_eq!(leases.stats().keys, 0, "a key nobody checks is forgotten");
    }

    #[tokio::test(start_paused = true)]
    async fn with_leases_off_only_a_rule_that_asks_is_leased() {
        let config = ClientConfig::with_ca_file("unused.pem");
        let link = Arc::new(NodeLink::new(([127, 0, 0, 1], 7100).into(), &config));
        let leases = TokenLeases::new(
            TokenLeaseConfig::default(),
            Arc::new(Routing::new(vec![link])),
        );
        assert_eq!(leases.decide(&Check::new("plain", limit())), None);
        assert_eq!(leases.stats().keys, 0, "not even metered");
        leases.decide(&Check::new("asked", limit()).lease_above(10));
        assert_eq!(leases.stats().keys, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_key_map_is_bounded() {
        let leases = offline();
        for i in 0..200 {
            leases.decide(&Check::new(format!("key-{i}"), limit()));
        }
        let keys = leases.stats().keys;
        assert!(keys <= 32, "{keys} keys metered, more than max_keys");
        // Keys holding tokens are never dropped to make room.
        let busy: Vec<String> = (0..100).map(|i| format!("busy-{i}")).collect();
        for key in &busy {
            grant(&leases, key.as_bytes(), 1);
        }
        for i in 0..200 {
            leases.decide(&Check::new(format!("cold-{i}"), limit()));
        }
        let held: u64 = busy.iter().map(|k| leases.tokens(k.as_bytes())).sum();
        assert_eq!(held, 100);
    }
}
