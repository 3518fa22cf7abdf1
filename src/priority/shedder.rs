//! The worker utilization shedder: one per upstream at a gateway. It admits a request when
//! the upstream has room for its class (the adaptive limit, less the shares kept for higher
//! classes) and its class is not shed outright by the level.
//!
//! The level is how many of the lowest classes are shed outright: 0 none, 1 `sheddable`, 2
//! `default` too; `critical` is never shed by the level, only by the limit. A window that was
//! over the latency target, or in which at least `escalate_refused_bp` of the requests that
//! reached the limit were refused by it, raises the level one class; `restore_windows` calm
//! windows in a row lower it one class. The fleet's level (read from the cluster) can only
//! raise the level in force, never lower a gateway's own.

use super::adaptive::{AdaptiveConfig, AdaptiveLimit};
use super::brownout::MAX_LEVEL;
use super::class::Priority;
use super::reserve::Reservation;

/// The shedder's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShedderConfig {
    pub adaptive: AdaptiveConfig,
    /// Shares of the adaptive limit kept for higher classes.
    pub reservation: Reservation,
    /// Calm windows in a row before the level comes down one class.
    pub restore_windows: u32,
    /// The share (basis points) of a window's requests refused by the limit that raises the
    /// level.
    pub escalate_refused_bp: u32,
}

impl Default for ShedderConfig {
    fn default() -> Self {
        ShedderConfig {
            adaptive: AdaptiveConfig::default(),
            // Sheddable may fill 40% of the limit, default 60%, critical all of it: at the
            // limit the upstream settles at, some places stay free for critical.
            reservation: Reservation::new(&[
                (Priority::Critical, 4_000),
                (Priority::Default, 2_000),
            ])
            .unwrap_or(Reservation::NONE),
            restore_windows: 30,
            escalate_refused_bp: 1_000,
        }
    }
}

/// Why a request was shed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShedReason {
    /// Its class is shed outright at the level in force.
    Level,
    /// The upstream has no room left for its class.
    Limit,
}

/// The shedder's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Go on; call [`Shedder::complete`] (or [`Shedder::abandon`]) when it is answered.
    Admitted {
        /// Requests in flight with this one.
        in_flight: u64,
    },
    /// Answer 503; the caller may try again after `retry_after_ns`.
    Shed {
        reason: ShedReason,
        retry_after_ns: u64,
    },
}

/// One upstream's shedder (see the module docs).
#[derive(Debug, Clone)]
pub struct Shedder {
    config: ShedderConfig,
    limit: AdaptiveLimit,
    in_flight: u64,
    level: u8,
    fleet_level: u8,
    calm_windows: u32,
    /// This window: requests that reached the limit, and those it refused.
    reached: u64,
    refused: u64,
}

impl Shedder {
    pub fn new(config: ShedderConfig, now_ns: u64) -> Self {
        Shedder {
            limit: AdaptiveLimit::new(config.adaptive, now_ns),
            config,
            in_flight: 0,
            level: 0,
            fleet_level: 0,
            calm_windows: 0,
            reached: 0,
            refused: 0,
        }
    }

    /// Decides a request of `class` arriving at `now_ns`.
    pub fn admit(&mut self, now_ns: u64, class: Priority) -> Admission {
        self.tick(now_ns);
        if class.rank() < usize::from(self.level()) {
            return Admission::Shed {
                reason: ShedReason::Level,
                retry_after_ns: self.restore_after_ns(),
            };
        }
        self.reached += 1;
        let allowance = self.config.reservation.allowance(self.limit.limit(), class);
        if self.in_flight >= allowance {
            self.refused += 1;
            return Admission::Shed {
                reason: ShedReason::Limit,
                retry_after_ns: self.limit.config().window_ns,
            };
        }
        self.in_flight += 1;
        Admission::Admitted {
            in_flight: self.in_flight,
        }
    }

    /// Counts a request in flight without asking: for a shedder that only watches (a baseline
    /// beside shedding); the limit and level are learnt all the same. Returns the in-flight
    /// count with it, for [`Shedder::complete`].
    pub fn admit_unchecked(&mut self, now_ns: u64) -> u64 {
        self.tick(now_ns);
        self.in_flight += 1;
        self.in_flight
    }

    /// An admitted request was answered after `latency_ns`; `in_flight` is what its
    /// [`Admission::Admitted`] said.
    pub fn complete(&mut self, now_ns: u64, latency_ns: u64, in_flight: u64) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if self.limit.record(now_ns, latency_ns, in_flight) {
            self.window_closed();
        }
    }

    /// An admitted request was dropped before its answer: its place is free, its latency
    /// says nothing.
    pub fn abandon(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// Closes windows that `now_ns` has passed.
    pub fn tick(&mut self, now_ns: u64) {
        if self.limit.tick(now_ns) {
            self.window_closed();
        }
    }

    /// Sets the fleet's level, as read from the cluster.
    pub fn set_fleet_level(&mut self, level: u8) {
        self.fleet_level = level.min(MAX_LEVEL);
    }

    /// This gateway's own level: what it reports to the fleet.
    pub fn local_level(&self) -> u8 {
        self.level
    }

    /// The level in force: this gateway's or the fleet's, whichever sheds more.
    pub fn level(&self) -> u8 {
        self.level.max(self.fleet_level)
    }

    pub fn fleet_level(&self) -> u8 {
        self.fleet_level
    }

    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// The adaptive limit, as a whole number of requests.
    pub fn limit(&self) -> u64 {
        self.limit.limit()
    }

    pub fn adaptive(&self) -> &AdaptiveLimit {
        &self.limit
    }

    /// How long a class shed by the level should wait: until the level can come down.
    fn restore_after_ns(&self) -> u64 {
        self.limit
            .config()
            .window_ns
            .saturating_mul(u64::from(self.config.restore_windows.max(1)))
    }

    fn window_closed(&mut self) {
        let (reached, refused) = (self.reached, self.refused);
        self.reached = 0;
        self.refused = 0;
        let refusing = refused > 0
            && u128::from(refused) * 10_000
                >= u128::from(reached) * u128::from(self.config.escalate_refused_bp);
        if refusing || self.limit.last_over_target() {
            self.level = (self.level + 1).min(MAX_LEVEL);
            self.calm_windows = 0;
            return;
        }
        self.calm_windows += 1;
        if self.calm_windows >= self.config.restore_windows && self.level > 0 {
            self.level -= 1;
            self.calm_windows = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Priority::*;

    const MS: u64 = 1_000_000;

    fn shedder() -> Shedder {
        Shedder::new(ShedderConfig::default(), 0)
    }

    /// Of the initial limit of 8, sheddable may fill 3, default 4, critical all 8.
    #[test]
    fn each_class_fills_its_share_of_the_limit() {
        let mut s = shedder();
        for _ in 0..3 {
            assert!(matches!(s.admit(0, Sheddable), Admission::Admitted { .. }));
        }
        assert!(matches!(
            s.admit(0, Sheddable),
            Admission::Shed {
                reason: ShedReason::Limit,
                ..
            }
        ));
        assert!(matches!(s.admit(0, Default), Admission::Admitted { .. }));
        assert!(matches!(s.admit(0, Default), Admission::Shed { .. }));
        for _ in 0..4 {
            assert!(matches!(s.admit(0, Critical), Admission::Admitted { .. }));
        }
        assert!(matches!(s.admit(0, Critical), Admission::Shed { .. }));
        assert_eq!(s.in_flight(), 8);
        s.abandon();
        assert!(matches!(
            s.admit(0, Critical),
            Admission::Admitted { in_flight: 8 }
        ));
    }

    /// Windows that refuse raise the level one class at a time, up to shedding default; the
    /// critical class is never shed by the level. Calm windows bring it down, slowly.
    #[test]
    fn the_level_escalates_class_by_class_and_restores_slowly() {
        let mut s = shedder();
        let mut now = 0;
        // Overload: more sheddable than its share, every window.
        for expected in [1, 2] {
            for _ in 0..10 {
                if let Admission::Admitted { in_flight } = s.admit(now, Sheddable) {
                    s.complete(now, 20 * MS, in_flight);
                }
                let _ = s.admit(now, Default);
                let _ = s.admit(now, Sheddable);
            }
            // Nothing completes (the upstream is stuck): places stay taken.
            now += 100 * MS;
            s.tick(now);
            assert_eq!(s.local_level(), expected);
        }
        assert!(matches!(
            s.admit(now, Default),
            Admission::Shed {
                reason: ShedReason::Level,
                retry_after_ns
            } if retry_after_ns == 3_000 * MS
        ));
        // Free the places; calm windows with critical traffic only.
        while s.in_flight() > 0 {
            s.abandon();
        }
        let mut calm = 0;
        while s.local_level() == 2 {
            if let Admission::Admitted { in_flight } = s.admit(now, Critical) {
                s.complete(now, 20 * MS, in_flight);
            }
            now += 100 * MS;
            s.tick(now);
            calm += 1;
        }
        assert_eq!(
            calm, 30,
            "one class down after restore_windows calm windows"
        );
        assert_eq!(s.local_level(), 1);
    }

    /// The fleet's level raises the level in force but is never what this gateway reports.
    #[test]
    fn the_fleet_level_sheds_here_too_but_is_not_reported_as_ours() {
        let mut s = shedder();
        s.set_fleet_level(9);
        assert_eq!(s.level(), MAX_LEVEL);
        assert_eq!(s.local_level(), 0);
        assert!(matches!(s.admit(0, Sheddable), Admission::Shed { .. }));
        assert!(matches!(s.admit(0, Critical), Admission::Admitted { .. }));
        s.set_fleet_level(0);
        assert!(matches!(s.admit(0, Sheddable), Admission::Admitted { .. }));
    }
}
