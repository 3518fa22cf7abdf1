//! Drives a target: closed loop (N callers as fast as they can) and open loop (a fixed arrival
//! rate, latency measured from each request's *scheduled* time, so a stalled server cannot hide
//! its queueing: no coordinated omission). Both record into an HDR histogram.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;

use super::gateway::Targets;
use super::outcome::Outcome;
use super::workload::KeyGen;

/// Up to this many requests a second (over all lanes), the pacing thread wakes up for each
/// one on time; above, its wake-ups are left to coalesce (see `pace`).
const PRECISE_PACING_RATE: u64 = 40_000;

/// How long each system's turn lasts when several take turns (`open_loop_taking_turns`): 500
/// requests at 10,000 req/s.
const TURN: Duration = Duration::from_millis(50);

/// Most requests in flight in an open-loop step; beyond it the target is saturated and the step
/// ends early (its achieved rate then says so).
const MAX_IN_FLIGHT: u64 = 200_000;

/// An open-loop request this late is counted as stalled ([`Stalled`]): a hundred times the
/// usual latency at low rates, so whatever held it up was not queueing behind its neighbours.
pub const STALLED: Duration = Duration::from_millis(50);

/// What one run measured.
#[derive(Debug)]
pub struct RunResult {
    pub requests: u64,
    pub checks: u64,
    pub allowed: u64,
    pub degraded: u64,
    pub errors: u64,
    pub elapsed: Duration,
    /// Latency in microseconds.
    pub latency_us: Histogram<u64>,
    /// The open loop stopped early because too many requests were in flight.
    pub saturated: bool,
    /// Requests per second in each whole [`WINDOW`] of a closed loop (empty for an open loop):
    /// shows whether the rate held or changed mid-run.
    pub window_rates: Vec<f64>,
    /// The open loop's requests that took [`STALLED`] or more, if any: when they were due tells
    /// one long stall (due within a turn or two) from many short ones.
    pub stalled: Option<Stalled>,
}

/// Open-loop requests that took [`STALLED`] or more.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stalled {
    pub requests: u64,
    /// When the first and the last of them were due, from the start of the run.
    pub first_due: Duration,
    pub last_due: Duration,
    /// The longest of their latencies.
    pub worst: Duration,
}

impl Stalled {
    /// Adds `other` to what `seen` holds so far.
    fn add(seen: &mut Option<Stalled>, other: Stalled) {
        *seen = Some(match *seen {
            None => other,
            Some(seen) => Stalled {
                requests: seen.requests + other.requests,
                first_due: seen.first_due.min(other.first_due),
                last_due: seen.last_due.max(other.last_due),
                worst: seen.worst.max(other.worst),
            },
        });
    }
}

/// The closed loop's rate is sampled over windows this long.
pub const WINDOW: Duration = Duration::from_millis(250);

impl RunResult {
    pub fn checks_per_second(&self) -> f64 {
        self.checks as f64 / self.elapsed.as_secs_f64()
    }

    pub fn requests_per_second(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }
}

#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    checks: AtomicU64,
    allowed: AtomicU64,
    degraded: AtomicU64,
    errors: AtomicU64,
    stalled: Mutex<Option<Stalled>>,
}

impl Counters {
    fn record(&self, keys: usize, outcome: &anyhow::Result<Outcome>) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.checks.fetch_add(keys as u64, Ordering::Relaxed);
        match outcome {
            Ok(Outcome::Allowed) => self.allowed.fetch_add(1, Ordering::Relaxed),
            Ok(Outcome::Denied) => 0,
            Ok(Outcome::Degraded) => self.degraded.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.errors.fetch_add(1, Ordering::Relaxed),
        };
    }

    fn absorb(&self, other: Counters) {
        self.requests
            .fetch_add(other.requests.into_inner(), Ordering::Relaxed);
        self.checks
            .fetch_add(other.checks.into_inner(), Ordering::Relaxed);
        self.allowed
            .fetch_add(other.allowed.into_inner(), Ordering::Relaxed);
        self.degraded
            .fetch_add(other.degraded.into_inner(), Ordering::Relaxed);
        self.errors
            .fetch_add(other.errors.into_inner(), Ordering::Relaxed);
        if let Some(other) = other.stalled.into_inner() {
            Stalled::add(&mut self.stalled.lock(), other);
        }
    }

    /// Counts a request due `due` into the run that took `latency`, if that is a stall.
    fn note_latency(&self, due: Duration, latency: Duration) {
        if latency >= STALLED {
            let one = Stalled {
                requests: 1,
                first_due: due,
                last_due: due,
                worst: latency,
            };
            Stalled::add(&mut self.stalled.lock(), one);
        }
    }

    fn finish(self, elapsed: Duration, latency_us: Histogram<u64>, saturated: bool) -> RunResult {
        RunResult {
            requests: self.requests.into_inner(),
            checks: self.checks.into_inner(),
            allowed: self.allowed.into_inner(),
            degraded: self.degraded.into_inner(),
            errors: self.errors.into_inner(),
            elapsed,
            latency_us,
            saturated,
            window_rates: Vec::new(),
            stalled: self.stalled.into_inner(),
        }
    }
}

fn histogram() -> Histogram<u64> {
    // 1 µs to 100 s at 3 significant digits: bounds are valid constants.
    Histogram::new_with_bounds(1, 100_000_000, 3).unwrap_or_else(|_| unreachable!("valid bounds"))
}

fn record_between(histogram: &Mutex<Histogram<u64>>, since: Instant, until: Instant) {
    let us = until
        .saturating_duration_since(since)
        .as_micros()
        .clamp(1, 100_000_000) as u64;
    histogram.lock().saturating_record(us);
}

/// Latency histograms striped by worker thread: a thread records into its own stripe, so the
/// lock it takes is never contended and its cache lines stay on its core (stripes by caller
/// had both cores writing the same histograms on every request). A histogram per caller would
/// cost megabytes of cold counters.
struct ThreadStripes(Vec<CachePadded<Mutex<Histogram<u64>>>>);

impl ThreadStripes {
    /// More than any runtime here has worker threads; threads beyond share stripes.
    const STRIPES: usize = 16;

    fn new() -> Self {
        ThreadStripes(
            (0..Self::STRIPES)
                .map(|_| CachePadded::new(Mutex::new(histogram())))
                .collect(),
        )
    }

    /// This thread's stripe.
    fn mine(&self) -> &Mutex<Histogram<u64>> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        thread_local! {
            static STRIPE: usize = NEXT.fetch_add(1, Ordering::Relaxed);
        }
        &self.0[STRIPE.with(|i| *i) % Self::STRIPES]
    }

    /// Requests recorded so far, over all stripes (each locked in turn, briefly).
    fn recorded(&self) -> u64 {
        self.0.iter().map(|stripe| stripe.lock().len()).sum()
    }

    fn merged(&self) -> Histogram<u64> {
        let mut all = histogram();
        for stripe in &self.0 {
            let _ = all.add(&*stripe.lock());
        }
        all
    }
}

/// `callers` tasks each sending one request, awaiting it, and sending the next, for `duration`,
/// dealt round the gateway's workers, each through its worker's target. Each task counts into
/// its own counters and records latency into its thread's histogram, so the generator adds
/// little shared state. A request's latency runs from the end of the
/// caller's previous one (so it includes building the request, well under a microsecond): one
/// clock read per request instead of two, the same for every system.
pub async fn closed_loop(
    targets: &Targets,
    keys: Arc<KeyGen>,
    callers: usize,
    duration: Duration,
    seed: u64,
) -> RunResult {
    let stripes = Arc::new(ThreadStripes::new());
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for caller in 0..callers {
        let (worker, target) = targets.on(caller);
        let (target, keys, stop, stripes) =
            (target.clone(), keys.clone(), stop.clone(), stripes.clone());
        tasks.spawn_on(
            async move {
                let counters = Counters::default();
                let mut rng = SmallRng::seed_from_u64(seed ^ caller as u64);
                let mut request = Vec::new();
                let mut since = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    keys.request(&mut rng, &mut request);
                    let outcome = target.check_leased(&request, keys.leased()).await;
                    let done = Instant::now();
                    record_between(stripes.mine(), since, done);
                    since = done;
                    counters.record(request.len(), &outcome);
                }
                counters
            },
            worker,
        );
    }
    let window_rates = sample_windows(&stripes, start, duration).await;
    stop.store(true, Ordering::Relaxed);
    let total = Counters::default();
    while let Some(joined) = tasks.join_next().await {
        if let Ok(counters) = joined {
            total.absorb(counters);
        }
    }
    let mut run = total.finish(start.elapsed(), stripes.merged(), false);
    run.window_rates = window_rates;
    run
}

/// Waits until `duration` after `start`, sampling the requests recorded at every whole
/// [`WINDOW`]; returns each window's rate (requests per second).
async fn sample_windows(stripes: &ThreadStripes, start: Instant, duration: Duration) -> Vec<f64> {
    let end = start + duration;
    let mut rates = Vec::new();
    let mut seen = stripes.recorded();
    let mut window_end = start + WINDOW;
    while window_end <= end {
        tokio::time::sleep_until(window_end.into()).await;
        let now = stripes.recorded();
        rates.push(now.saturating_sub(seen) as f64 / WINDOW.as_secs_f64());
        seen = now;
        window_end += WINDOW;
    }
    tokio::time::sleep_until(end.into()).await;
    rates
}

/// Requests at `rate` per second for `duration`, each timed from when it was due.
///
/// A dedicated pacing thread issues the requests (tokio's timers tick per millisecond, which
/// would release requests in 1 ms bursts and charge both systems up to 1 ms of generator delay);
/// it sleeps until the next request is due, or issues every due one at once when it is late.
pub async fn open_loop(
    targets: &Targets,
    keys: Arc<KeyGen>,
    rate: u64,
    duration: Duration,
    seed: u64,
) -> RunResult {
    let mut runs = open_loop_taking_turns(vec![targets.clone()], keys, rate, duration, seed).await;
    runs.pop()
        .unwrap_or_else(|| Counters::default().finish(Duration::ZERO, histogram(), true))
}

/// The open loop at `rate` per second for each of `targets`, the targets taking turns of
/// [`TURN`] until each has had `duration`: the machine carries one system's load at a time,
/// at the stated rate, and a stall of the machine lands in whichever turn it falls in, so over
/// some eighty turns each the stalls are shared out among the systems instead of falling on
/// whichever system's step they hit. On this shared machine, stalls of a few milliseconds
/// about once a second decided most of a low-rate step's p99. (Interleaving the systems'
/// requests instead put all their load on the machine at once: at 10,000 req/s each, on a
/// host where a wake-up costs tens of microseconds of CPU, that saturated both cores.)
pub async fn open_loop_taking_turns(
    targets: Vec<Targets>,
    keys: Arc<KeyGen>,
    rate: u64,
    duration: Duration,
    seed: u64,
) -> Vec<RunResult> {
    let lanes: Vec<Lane> = targets
        .into_iter()
        .map(|targets| Lane {
            targets,
            counters: Arc::new(Counters::default()),
            latency: Arc::new(Mutex::new(histogram())),
        })
        .collect();
    let tallies: Vec<_> = lanes
        .iter()
        .map(|lane| (lane.counters.clone(), lane.latency.clone()))
        .collect();
    let in_flight = Arc::new(InFlight::default());
    let pacer = {
        let in_flight = in_flight.clone();
        std::thread::spawn(move || pace(lanes, keys, rate, duration, seed, in_flight))
    };
    let (start, saturated) = tokio::task::spawn_blocking(move || pacer.join())
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_else(|| (Instant::now(), true));
    in_flight.all_done().await;
    // Each target had its turns, a share of the whole run.
    let elapsed = start.elapsed() / tallies.len().max(1) as u32;
    tallies
        .into_iter()
        .map(|(counters, latency)| {
            let counters = Arc::try_unwrap(counters).unwrap_or_default();
            let latency = Arc::try_unwrap(latency)
                .map(Mutex::into_inner)
                .unwrap_or_else(|_| histogram());
            counters.finish(elapsed, latency, saturated)
        })
        .collect()
}

/// One target's share of an open loop: where its requests go and what they count into.
struct Lane {
    targets: Targets,
    counters: Arc<Counters>,
    latency: Arc<Mutex<Histogram<u64>>>,
}

/// Requests issued and not yet done. Counted instead of keeping each request's task handle:
/// pruning a list of handles every few thousand requests held up the pacing thread, and so
/// every request due meanwhile, by about a millisecond every 4,096 requests, in every system's
/// tail alike.
#[derive(Default)]
struct InFlight {
    count: AtomicU64,
    emptied: tokio::sync::Notify,
}

impl InFlight {
    fn start(&self) {
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    fn load(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    fn done(&self) {
        if self.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.emptied.notify_one();
        }
    }

    /// Waits for every request issued to be done (once no more are issued).
    async fn all_done(&self) {
        loop {
            let emptied = self.emptied.notified();
            let mut emptied = std::pin::pin!(emptied);
            emptied.as_mut().enable();
            if self.count.load(Ordering::Acquire) == 0 {
                return;
            }
            emptied.await;
        }
    }
}

/// Held by a request's task: the request is done when it is dropped.
struct Done(Arc<InFlight>);

impl Drop for Done {
    fn drop(&mut self) {
        self.0.done();
    }
}

/// Which lane has each turn: every round of turns (one each) in an order of its own, shuffled
/// (seeded), so that each lane comes after each other one equally often. In one fixed order,
/// the lane after a system whose server lags behind its turns (Gubernator near its limit at
/// 10,000/s) took that server's leftover work into every one of its own turns: floodgate's
/// p99 read 3-8x redis+lua's in every run with Gubernator in the step, and about 1x without.
struct TurnOrder {
    order: Vec<usize>,
    rng: SmallRng,
    /// The round `order` is for.
    round: Option<u64>,
}

impl TurnOrder {
    fn new(lanes: usize, seed: u64) -> TurnOrder {
        TurnOrder {
            order: (0..lanes.max(1)).collect(),
            // Apart from the keys' generator, so the keys drawn stay those of the seed.
            rng: SmallRng::seed_from_u64(seed ^ 0x7475_726e_735f_6f72),
            round: None,
        }
    }

    /// The lane of turn `turn` (turns are asked for in order).
    fn lane(&mut self, turn: u64) -> usize {
        let lanes = self.order.len() as u64;
        let round = turn / lanes;
        if self.round != Some(round) {
            self.order.shuffle(&mut self.rng);
            self.round = Some(round);
        }
        self.order[(turn % lanes) as usize]
    }
}

/// Issues `rate` requests per second for `duration` to each lane, the lanes taking turns of
/// [`TURN`] in [`TurnOrder`].
fn pace(
    lanes: Vec<Lane>,
    keys: Arc<KeyGen>,
    rate: u64,
    duration: Duration,
    seed: u64,
    in_flight: Arc<InFlight>,
) -> (Instant, bool) {
    let mut rng = SmallRng::seed_from_u64(seed);
    // Linux lets a sleeping thread wake up to its timer slack late, 50 µs by default: at low
    // rates that added about 50 µs to every request's latency, of every system alike (the
    // generator alone had a p50 of 80 µs at 10,000 req/s; 28 µs with a slack of 1 ns). At high
    // rates the slack lets one wake-up issue several due requests; a wake-up per request there
    // took CPU from the systems under test on this 2-core machine (floodgate's p99 at
    // 100,000 req/s rose from 0.4-0.9 ms to 1.2-2.0 ms), so the default stays. Best effort.
    if rate <= PRECISE_PACING_RATE {
        let _ = rustix::thread::set_current_timer_slack(std::num::NonZeroU64::new(1));
    }
    let lane_count = lanes.len() as u64;
    let mut order = TurnOrder::new(lanes.len(), seed);
    let per_turn = ((rate as f64 * TURN.as_secs_f64()) as u64).max(1);
    let total = (rate as f64 * duration.as_secs_f64()) as u64 * lane_count;
    let interval = Duration::from_secs_f64(1.0 / rate.max(1) as f64);
    let start = Instant::now();
    let mut issued = 0u64;
    while issued < total {
        let scheduled = start + interval.mul_f64(issued as f64);
        let now = Instant::now();
        if scheduled > now {
            std::thread::sleep(scheduled - now);
        }
        if in_flight.load() >= MAX_IN_FLIGHT {
            return (start, true);
        }
        let mut request = Vec::with_capacity(3);
        keys.request(&mut rng, &mut request);
        let lane = &lanes[order.lane(issued / per_turn)];
        let (worker, target) = lane.targets.on(issued as usize);
        let (target, counters, latency, in_flight) = (
            target.clone(),
            lane.counters.clone(),
            lane.latency.clone(),
            in_flight.clone(),
        );
        in_flight.start();
        let leased = keys.leased();
        // Detached: `InFlight` says when all are done.
        drop(worker.spawn(async move {
            // Declared first, so dropped last, even when the check panics.
            let _done = Done(in_flight);
            let outcome = target.check_leased(&request, leased).await;
            let done = Instant::now();
            record_between(&latency, scheduled, done);
            counters.record(request.len(), &outcome);
            counters.note_latency(scheduled - start, done - scheduled);
            // The run takes its counters and histogram back once the last task is done.
            drop((target, counters, latency));
        }));
        issued += 1;
    }
    (start, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_round_gives_each_lane_one_turn_and_each_lane_follows_the_last_alike() {
        let lanes = 5;
        let rounds = 2_000u64;
        let mut order = TurnOrder::new(lanes, 101);
        let mut after_last = vec![0u64; lanes];
        let mut previous = None;
        for round in 0..rounds {
            let mut seen = vec![false; lanes];
            for position in 0..lanes as u64 {
                let lane = order.lane(round * lanes as u64 + position);
                assert!(!seen[lane], "lane {lane} twice in round {round}");
                seen[lane] = true;
                if previous == Some(lanes - 1) {
                    after_last[lane] += 1;
                }
                previous = Some(lane);
            }
        }
        // The fixed order gave lane 0 every turn after the last lane; now each of the other
        // four gets about a quarter of them (the last lane itself only across a round's end).
        let total: u64 = after_last.iter().sum();
        for (lane, &count) in after_last.iter().enumerate().take(lanes - 1) {
            assert!(
                count * 5 > total && count * 3 < total,
                "lane {lane} followed the last {count} of {total} times: {after_last:?}"
            );
        }
        // The same seed, the same order.
        let mut again = TurnOrder::new(lanes, 101);
        let mut first = TurnOrder::new(lanes, 101);
        assert!((0..50).all(|t| again.lane(t) == first.lane(t)));
    }

    #[test]
    fn only_requests_of_50_ms_or_more_count_as_stalled_and_runs_merge_them() {
        let ms = Duration::from_millis;
        let counters = Counters::default();
        counters.note_latency(ms(10), ms(49));
        assert_eq!(counters.stalled.lock().map(|s| s.requests), None);
        counters.note_latency(ms(300), ms(50));
        counters.note_latency(ms(200), ms(380));
        let other = Counters::default();
        other.note_latency(ms(900), ms(60));
        counters.absorb(other);
        let run = counters.finish(ms(1_000), histogram(), false);
        assert_eq!(
            run.stalled,
            Some(Stalled {
                requests: 3,
                first_due: ms(200),
                last_due: ms(900),
                worst: ms(380),
            })
        );
    }
}
