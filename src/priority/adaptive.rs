//! The adaptive limit: how many requests the upstream may have in flight before its latency
//! passes a target, learnt from the latencies it answers with (Gradient2's update, Vegas's
//! no-load latency).
//!
//! Time is cut into windows of `window_ns`. Each window's mean latency is compared with the
//! target, `tolerance` times the no-load latency (the least window minimum of the last
//! [`BASE_WINDOWS`] windows, so a slower upstream becomes the new normal only after that many
//! windows without a faster answer). At the end of a window with samples:
//! `limit ← (1 − smoothing) · limit + smoothing · (limit · gradient + headroom)`, where
//! `gradient = clamp(target / latency, 0.5, 1)` and `headroom` is 1 when the window used at
//! least half the limit (an idle upstream says nothing about more load), 0 otherwise. So the
//! limit shrinks while latency is over target and creeps up by about one request a window
//! while it is under it.

/// Windows whose minimum latencies make up the no-load latency.
pub const BASE_WINDOWS: usize = 50;

/// The adaptive limit's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdaptiveConfig {
    /// The limit before any sample.
    pub initial_limit: f64,
    /// Never below this (at least 1: the highest class always gets through one at a time).
    pub min_limit: f64,
    pub max_limit: f64,
    /// How long a window is (its samples make one update).
    pub window_ns: u64,
    /// The target latency as a multiple of the no-load latency.
    pub tolerance: f64,
    /// How far one window moves the limit towards its new estimate (0..=1).
    pub smoothing: f64,
}

impl Default for AdaptiveConfig {
    fn default() -> Self {
        AdaptiveConfig {
            initial_limit: 8.0,
            min_limit: 1.0,
            max_limit: 1_000.0,
            window_ns: 100_000_000,
            tolerance: 1.5,
            smoothing: 0.5,
        }
    }
}

impl AdaptiveConfig {
    /// The same settings with the bounds made consistent (min ≥ 1, max ≥ min, initial within,
    /// window ≥ 1 ns, tolerance ≥ 1, smoothing in 0..=1; NaNs replaced by the defaults).
    pub fn sanitized(self) -> Self {
        let d = AdaptiveConfig::default();
        let or = |v: f64, default: f64| if v.is_finite() { v } else { default };
        let min_limit = or(self.min_limit, d.min_limit).max(1.0);
        let max_limit = or(self.max_limit, d.max_limit).max(min_limit);
        AdaptiveConfig {
            initial_limit: or(self.initial_limit, d.initial_limit).clamp(min_limit, max_limit),
            min_limit,
            max_limit,
            window_ns: self.window_ns.max(1),
            tolerance: or(self.tolerance, d.tolerance).max(1.0),
            smoothing: or(self.smoothing, d.smoothing).clamp(0.0, 1.0),
        }
    }
}

/// One window's samples.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WindowStats {
    pub samples: u64,
    pub latency_sum_ns: u64,
    pub latency_min_ns: u64,
    /// Most requests in flight when one of them started.
    pub max_in_flight: u64,
}

impl WindowStats {
    fn mean_ns(&self) -> Option<u64> {
        (self.samples > 0).then(|| self.latency_sum_ns / self.samples)
    }
}

/// The limit and the state it is learnt from.
#[derive(Debug, Clone, PartialEq)]
pub struct AdaptiveLimit {
    config: AdaptiveConfig,
    limit: f64,
    window_start_ns: u64,
    current: WindowStats,
    /// The minimum latency of each of the last windows with samples (a ring).
    minimums_ns: [u64; BASE_WINDOWS],
    minimums_len: usize,
    minimums_next: usize,
    /// The last closed window's mean latency and whether it was over target.
    last_mean_ns: Option<u64>,
    last_over_target: bool,
}

impl AdaptiveLimit {
    pub fn new(config: AdaptiveConfig, now_ns: u64) -> Self {
        let config = config.sanitized();
        AdaptiveLimit {
            limit: config.initial_limit,
            config,
            window_start_ns: now_ns,
            current: WindowStats::default(),
            minimums_ns: [0; BASE_WINDOWS],
            minimums_len: 0,
            minimums_next: 0,
            last_mean_ns: None,
            last_over_target: false,
        }
    }

    pub fn config(&self) -> &AdaptiveConfig {
        &self.config
    }

    /// Requests that may be in flight at once (whole, at least `min_limit`).
    pub fn limit(&self) -> u64 {
        self.limit.floor() as u64
    }

    /// The no-load latency learnt so far.
    pub fn base_latency_ns(&self) -> Option<u64> {
        self.minimums_ns[..self.minimums_len].iter().copied().min()
    }

    /// The latency the limit aims under.
    pub fn target_ns(&self) -> Option<u64> {
        self.base_latency_ns()
            .map(|b| (b as f64 * self.config.tolerance) as u64)
    }

    /// The last closed window's mean latency, if it had samples.
    pub fn last_mean_ns(&self) -> Option<u64> {
        self.last_mean_ns
    }

    /// Whether the last closed window's mean latency was over the target while at least half
    /// the limit was in use: a slow answer to a nearly idle upstream is not overload (one slow
    /// request among a few would otherwise read as it).
    pub fn last_over_target(&self) -> bool {
        self.last_over_target
    }

    /// Brings the limit down to `at` if it is above (never below `min_limit`): for a caller
    /// about to let in more demand than the limit was learnt on.
    pub fn cap(&mut self, at: u64) {
        self.limit = self.limit.min(at as f64).max(self.config.min_limit);
    }

    /// Records one answered request: it took `latency_ns` and started with `in_flight`
    /// requests in flight (itself included). Returns true when a window closed first.
    pub fn record(&mut self, now_ns: u64, latency_ns: u64, in_flight: u64) -> bool {
        let closed = self.tick(now_ns);
        let w = &mut self.current;
        w.latency_min_ns = if w.samples == 0 {
            latency_ns
        } else {
            w.latency_min_ns.min(latency_ns)
        };
        w.samples += 1;
        w.latency_sum_ns = w.latency_sum_ns.saturating_add(latency_ns);
        w.max_in_flight = w.max_in_flight.max(in_flight);
        closed
    }

    /// Closes the window if `now_ns` is past it; true when one closed. A window without
    /// samples changes nothing but starts the next.
    pub fn tick(&mut self, now_ns: u64) -> bool {
        if now_ns < self.window_start_ns.saturating_add(self.config.window_ns) {
            return false;
        }
        let window = std::mem::take(&mut self.current);
        // Windows are aligned to the first; a gap of several counts as one.
        let elapsed = now_ns - self.window_start_ns;
        self.window_start_ns = now_ns - elapsed % self.config.window_ns;
        self.close(&window);
        true
    }

    fn close(&mut self, window: &WindowStats) {
        let Some(mean) = window.mean_ns() else {
            self.last_mean_ns = None;
            self.last_over_target = false;
            return;
        };
        self.minimums_ns[self.minimums_next] = window.latency_min_ns;
        self.minimums_next = (self.minimums_next + 1) % BASE_WINDOWS;
        self.minimums_len = (self.minimums_len + 1).min(BASE_WINDOWS);
        // Set just above: there is a minimum.
        let target = self.target_ns().unwrap_or(mean).max(1);
        let gradient = (target as f64 / mean.max(1) as f64).clamp(0.5, 1.0);
        let busy = window.max_in_flight as f64 * 2.0 >= self.limit;
        // Only demand that reached the limit says more would be taken: a limit grown past
        // what was used lets a burst in all at once.
        let pressed = window.max_in_flight as f64 + 1.0 >= self.limit;
        let headroom = if pressed { 1.0 } else { 0.0 };
        let estimate = self.limit * gradient + headroom;
        let s = self.config.smoothing;
        self.limit = ((1.0 - s) * self.limit + s * estimate)
            .clamp(self.config.min_limit, self.config.max_limit);
        self.last_mean_ns = Some(mean);
        self.last_over_target = busy && mean > target;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// A fake upstream of `servers` places, each request `service_ns`: a request started with
    /// `in_flight` in flight waits for the ones ahead of it beyond the places.
    fn latency(servers: u64, service_ns: u64, in_flight: u64) -> u64 {
        service_ns * in_flight.div_ceil(servers).max(1)
    }

    /// Drives `windows` windows in which `in_flight` requests are kept in flight at once
    /// (the limit, capped by `demand`) against an upstream of 4 places and 20 ms each.
    fn drive(limit: &mut AdaptiveLimit, now: &mut u64, windows: u64, demand: u64) {
        for _ in 0..windows {
            let in_flight = limit.limit().min(demand).max(1);
            for _ in 0..10 {
                *now += 10 * MS;
                limit.record(*now, latency(4, 20 * MS, in_flight), in_flight);
            }
        }
    }

    /// Under more demand than the upstream takes, the limit settles near the in-flight count
    /// where latency meets the target (4 places, tolerance 1.5: 6), not at the demand.
    #[test]
    fn the_limit_settles_where_latency_meets_the_target() {
        let mut now = 0;
        let mut limit = AdaptiveLimit::new(AdaptiveConfig::default(), now);
        // Unloaded first, so the no-load latency is known.
        drive(&mut limit, &mut now, 5, 2);
        assert_eq!(limit.base_latency_ns(), Some(20 * MS));
        drive(&mut limit, &mut now, 200, 1_000);
        let settled = limit.limit();
        assert!((4..=8).contains(&settled), "settled at {settled}");
        assert_eq!(limit.target_ns(), Some(30 * MS));
    }

    /// An idle upstream does not grow the limit: the headroom needs half the limit in use.
    #[test]
    fn an_idle_upstream_does_not_raise_the_limit() {
        let mut now = 0;
        let mut limit = AdaptiveLimit::new(AdaptiveConfig::default(), now);
        drive(&mut limit, &mut now, 100, 1);
        assert_eq!(limit.limit(), 8);
    }

    /// Latency far over target shrinks the limit at once, to where the headroom holds it,
    /// never below the minimum.
    #[test]
    fn latency_far_over_target_shrinks_the_limit_at_once() {
        let mut now = 0;
        let mut limit = AdaptiveLimit::new(AdaptiveConfig::default(), now);
        now += 10 * MS;
        limit.record(now, 10 * MS, 1);
        // Fewer windows than BASE_WINDOWS: the fast one still sets the no-load latency.
        for _ in 0..40 {
            now += 100 * MS;
            limit.record(now, 1_000 * MS, 8);
            assert!(limit.limit() >= 1);
        }
        assert!(limit.last_over_target());
        // Halved each window, plus the one request of headroom a busy window earns: 2.
        assert_eq!(limit.limit(), 2);
    }

    /// A slow answer while the upstream is nearly idle is not overload.
    #[test]
    fn a_slow_answer_to_an_idle_upstream_is_not_over_target() {
        let mut limit = AdaptiveLimit::new(AdaptiveConfig::default(), 0);
        limit.record(10 * MS, 20 * MS, 1);
        limit.record(100 * MS, 200 * MS, 1);
        limit.tick(200 * MS);
        assert_eq!(limit.last_mean_ns(), Some(200 * MS));
        assert!(!limit.last_over_target());
    }

    /// Windows close on the injected clock only; a window without samples changes nothing.
    #[test]
    fn windows_close_on_the_injected_clock() {
        let mut limit = AdaptiveLimit::new(AdaptiveConfig::default(), 0);
        assert!(!limit.record(50 * MS, 20 * MS, 1));
        assert!(limit.record(100 * MS, 20 * MS, 1));
        assert!(!limit.tick(150 * MS));
        assert!(limit.tick(10_000 * MS));
        assert_eq!(limit.last_mean_ns(), Some(20 * MS));
        assert!(limit.tick(10_100 * MS));
        assert_eq!(limit.last_mean_ns(), None);
        assert_eq!(limit.limit(), 8);
    }

    /// Nonsense settings are made consistent rather than trusted.
    #[test]
    fn settings_are_sanitized() {
        let config = AdaptiveConfig {
            initial_limit: f64::NAN,
            min_limit: 0.0,
            max_limit: -5.0,
            window_ns: 0,
            tolerance: 0.1,
            smoothing: 7.0,
        }
        .sanitized();
        assert_eq!(config.min_limit, 1.0);
        assert_eq!(config.max_limit, 1.0);
        assert_eq!(config.initial_limit, 1.0);
        assert_eq!(config.window_ns, 1);
        assert_eq!(config.tolerance, 1.0);
        assert_eq!(config.smoothing, 1.0);
    }
}
