//! The per-node circuit breaker: a pure state machine and its shared, lock-light wrapper.
//!
//! The state machine takes explicit `Instant`s (tests drive it without waiting); the wrapper's
//! healthy path is one atomic load.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::config::BreakerConfig;

/// Whether a call may go to the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Send it.
    Pass,
    /// Send it as the half-open probe: its outcome decides whether the circuit closes.
    Probe,
    /// Do not send it; the circuit may let a probe through after `retry_after`.
    Reject { retry_after: Duration },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed {
        failures: u32,
    },
    Open {
        until: Instant,
    },
    /// One probe is out; until `probe_deadline` no other call passes. A probe whose caller gave
    /// up without reporting would otherwise hold the circuit half-open forever.
    HalfOpen {
        probe_deadline: Instant,
    },
}

/// The state machine: closed → (N consecutive failures) → open → (cooldown) → half-open, where
/// one probe passes; its success closes the circuit, its failure opens it again.
#[derive(Debug, Clone)]
pub(crate) struct Breaker {
    config: BreakerConfig,
    /// How long a probe may be out before another is let through (the call timeout).
    probe_timeout: Duration,
    state: State,
}

impl Breaker {
    pub(crate) fn new(config: BreakerConfig, probe_timeout: Duration) -> Self {
        Breaker {
            config,
            probe_timeout,
            state: State::Closed { failures: 0 },
        }
    }

    pub(crate) fn admit(&mut self, now: Instant) -> Admit {
        match self.state {
            State::Closed { .. } => Admit::Pass,
            State::Open { until }
            | State::HalfOpen {
                probe_deadline: until,
            } if now < until => Admit::Reject {
                retry_after: until - now,
            },
            State::Open { .. } | State::HalfOpen { .. } => {
                self.state = State::HalfOpen {
                    probe_deadline: now + self.probe_timeout,
                };
                Admit::Probe
            }
        }
    }

    /// A call got its answer in time.
    pub(crate) fn on_success(&mut self) {
        self.state = State::Closed { failures: 0 };
    }

    /// A call that was sent got no usable answer.
    pub(crate) fn on_failure(&mut self, now: Instant) {
        let open = State::Open {
            until: now + self.config.cooldown,
        };
        self.state = match self.state {
            State::Closed { failures } if failures + 1 >= self.config.failure_threshold => open,
            State::Closed { failures } => State::Closed {
                failures: failures + 1,
            },
            State::HalfOpen { .. } => open,
            // Late failures of calls sent before the circuit opened do not extend the cooldown.
            state @ State::Open { .. } => state,
        };
    }

    /// A fresh connection: forget failures of the old one.
    pub(crate) fn reset(&mut self) {
        self.state = State::Closed { failures: 0 };
    }

    /// True in the state every call starts from when all is well.
    fn is_pristine(&self) -> bool {
        self.state == State::Closed { failures: 0 }
    }
}

/// A breaker shared by every caller of one node. While the node is healthy, admitting and
/// reporting success cost one relaxed atomic load each (no lock, no clock read); the mutex is
/// taken only once something failed.
#[derive(Debug)]
pub(crate) struct SharedBreaker {
    pristine: AtomicBool,
    breaker: Mutex<Breaker>,
}

impl SharedBreaker {
    pub(crate) fn new(config: BreakerConfig, probe_timeout: Duration) -> Self {
        SharedBreaker {
            pristine: AtomicBool::new(true),
            breaker: Mutex::new(Breaker::new(config, probe_timeout)),
        }
    }

    pub(crate) fn admit(&self) -> Admit {
        if self.pristine.load(Ordering::Relaxed) {
            return Admit::Pass;
        }
        self.breaker.lock().admit(Instant::now())
    }

    /// True while no call has failed since the last success (or reset).
    pub(crate) fn is_pristine(&self) -> bool {
        self.pristine.load(Ordering::Relaxed)
    }

    pub(crate) fn on_success(&self) {
        if !self.pristine.load(Ordering::Relaxed) {
            self.update(Breaker::on_success);
        }
    }

    pub(crate) fn on_failure(&self) {
        let now = Instant::now();
        self.update(|b| b.on_failure(now));
    }

    pub(crate) fn reset(&self) {
        self.update(Breaker::reset);
    }

    fn update(&self, f: impl FnOnce(&mut Breaker)) {
        let mut breaker = self.breaker.lock();
        f(&mut breaker);
        // Written under the lock, so the flag never disagrees with the state for long: a racing
        // reader may see a stale `true` and pass one extra call, which is harmless.
        self.pristine
            .store(breaker.is_pristine(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COOLDOWN: Duration = Duration::from_secs(1);
    const PROBE: Duration = Duration::from_millis(5);

    fn breaker() -> Breaker {
        Breaker::new(
            BreakerConfig {
                failure_threshold: 3,
                cooldown: COOLDOWN,
            },
            PROBE,
        )
    }

    /// A breaker opened at `t0` by three failures.
    fn opened(t0: Instant) -> Breaker {
        let mut b = breaker();
        for _ in 0..3 {
            b.on_failure(t0);
        }
        b
    }

    #[test]
    fn opens_after_threshold_consecutive_failures_only() {
        let t0 = Instant::now();
        let mut b = breaker();
        b.on_failure(t0);
        b.on_failure(t0);
        b.on_success(); // a success in between resets the count
        b.on_failure(t0);
        b.on_failure(t0);
        assert_eq!(b.admit(t0), Admit::Pass);
        b.on_failure(t0);
        assert_eq!(
            b.admit(t0),
            Admit::Reject {
                retry_after: COOLDOWN
            }
        );
        let half = t0 + COOLDOWN / 2;
        assert_eq!(
            b.admit(half),
            Admit::Reject {
                retry_after: COOLDOWN / 2
            }
        );
    }

    #[test]
    fn after_cooldown_one_probe_passes_and_its_success_closes() {
        let t0 = Instant::now();
        let mut b = opened(t0);
        let t1 = t0 + COOLDOWN;
        assert_eq!(b.admit(t1), Admit::Probe);
        // Only one probe at a time.
        assert_eq!(b.admit(t1), Admit::Reject { retry_after: PROBE });
        b.on_success();
        assert_eq!(b.admit(t1), Admit::Pass);
        assert!(b.is_pristine());
    }

    #[test]
    fn a_failed_probe_reopens_for_a_full_cooldown() {
        let t0 = Instant::now();
        let mut b = opened(t0);
        let t1 = t0 + COOLDOWN;
        assert_eq!(b.admit(t1), Admit::Probe);
        b.on_failure(t1);
        assert_eq!(
            b.admit(t1),
            Admit::Reject {
                retry_after: COOLDOWN
            }
        );
        assert_eq!(b.admit(t1 + COOLDOWN), Admit::Probe);
    }

    #[test]
    fn a_lost_probe_lets_another_through_after_the_probe_timeout() {
        let t0 = Instant::now();
        let mut b = opened(t0);
        let t1 = t0 + COOLDOWN;
        assert_eq!(b.admit(t1), Admit::Probe);
        assert!(matches!(b.admit(t1 + PROBE / 2), Admit::Reject { .. }));
        assert_eq!(b.admit(t1 + PROBE), Admit::Probe);
    }

    #[test]
    fn late_failures_do_not_extend_an_open_circuit() {
        let t0 = Instant::now();
        let mut b = opened(t0);
        b.on_failure(t0 + COOLDOWN / 2);
        assert_eq!(b.admit(t0 + COOLDOWN), Admit::Probe);
    }

    #[test]
    fn reset_closes_the_circuit() {
        let t0 = Instant::now();
        let mut b = opened(t0);
        b.reset();
        assert_eq!(b.admit(t0), Admit::Pass);
    }

    #[test]
    fn shared_breaker_takes_the_fast_path_only_when_pristine() {
        let shared = SharedBreaker::new(
            BreakerConfig {
                failure_threshold: 1,
                cooldown: COOLDOWN,
            },
            PROBE,
        );
        assert!(shared.pristine.load(Ordering::Relaxed));
        shared.on_failure();
        assert!(!shared.pristine.load(Ordering::Relaxed));
        assert!(matches!(shared.admit(), Admit::Reject { .. }));
        shared.reset();
        assert!(shared.pristine.load(Ordering::Relaxed));
        assert_eq!(shared.admit(), Admit::Pass);
    }
}
