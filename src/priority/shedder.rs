//! The worker utilization shedder: one per upstream at a gateway.
//!
//! Two adaptive limits learn from the same answers. The **whole limit** (target: `tolerance`
//! times the no-load latency) bounds the top class, `critical`, counted alone: a lower class
//! never takes critical's room. The **lower limit** (target: `lower_tolerance` times the
//! no-load latency, less than the whole limit's) bounds every lower class, counted with every
//! request in flight: it lets them fill the upstream's places but backs them off as soon as a
//! queue forms, so what queues at the upstream is critical's, and critical never waits behind
//! a lower class for long. A request past its limit is refused (`ShedReason::Limit`).
//!
//! The **level** is how many of the lowest classes are shed outright (0 none, 1 `sheddable`,
//! 2 `default` too; `critical` never). A momentary lack of room is no reason to shed a class:
//! the limits already turn away the excess. The level rises one class only when the upstream is
//! really overloaded over the last `escalate_windows` windows: either the class just above the
//! lowest one admitted asked in each of them and saw at least `escalate_refused_bp` of its
//! requests refused over them (the lowest class is crowding it out), or every one of those windows was over the latency target while
//! busy (queueing the limits do not hold). `restore_windows` calm windows in a row lower it one
//! class; the class let back in goes under the lower limit, brought down first to one place
//! past what is in flight, so it comes back slowly and critical keeps its room while the level
//! probes. The fleet's level (read from the cluster) can only raise
//! the level in force, never lower a gateway's own.

use super::adaptive::{AdaptiveConfig, AdaptiveLimit};
use super::brownout::MAX_LEVEL;
use super::class::Priority;

/// Most windows the escalation looks back over (the counts are kept in a fixed ring).
pub const MAX_ESCALATE_WINDOWS: u32 = 32;
/// Fewest requests of a class over the escalation span before its refusals say anything.
const MIN_SAMPLES: u64 = 10;
const CLASSES: usize = Priority::ALL.len();

/// The shedder's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShedderConfig {
    /// The whole limit (the top class's).
    pub adaptive: AdaptiveConfig,
    /// The lower limit's target latency, as a multiple of the no-load latency (at least 1, at
    /// most the whole limit's tolerance).
    pub lower_tolerance: f64,
    /// Calm windows in a row before the level comes down one class.
    pub restore_windows: u32,
    /// The windows overload is judged over (1 to [`MAX_ESCALATE_WINDOWS`]).
    pub escalate_windows: u32,
    /// The share (basis points) of the next class up's requests refused over
    /// `escalate_windows` that sheds the lowest admitted class outright.
    pub escalate_refused_bp: u32,
}

impl Default for ShedderConfig {
    fn default() -> Self {
        ShedderConfig {
            adaptive: AdaptiveConfig::default(),
            // Under the whole limit's 1.5: the lower classes stop where a queue begins,
            // leaving what queues to critical.
            lower_tolerance: 1.1,
            restore_windows: 30,
            // Half a second of 100 ms windows: a burst is not overload.
            escalate_windows: 5,
            // A class losing a fifth of its requests to the ones below it.
            escalate_refused_bp: 2_000,
        }
    }
}

impl ShedderConfig {
    /// The same settings made consistent (see [`AdaptiveConfig::sanitized`]).
    pub fn sanitized(self) -> Self {
        let adaptive = self.adaptive.sanitized();
        let lower = if self.lower_tolerance.is_finite() {
            self.lower_tolerance
        } else {
            ShedderConfig::default().lower_tolerance
        };
        ShedderConfig {
            adaptive,
            lower_tolerance: lower.clamp(1.0, adaptive.tolerance),
            restore_windows: self.restore_windows,
            escalate_windows: self.escalate_windows.clamp(1, MAX_ESCALATE_WINDOWS),
            escalate_refused_bp: self.escalate_refused_bp.min(10_000),
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

/// One window's requests per class that reached a limit, and those it refused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct WindowCounts {
    reached: [u64; CLASSES],
    refused: [u64; CLASSES],
}

/// One upstream's shedder (see the module docs).
#[derive(Debug, Clone)]
pub struct Shedder {
    config: ShedderConfig,
    whole: AdaptiveLimit,
    lower: AdaptiveLimit,
    /// Requests in flight per class.
    in_flight: [u64; CLASSES],
    level: u8,
    fleet_level: u8,
    calm_windows: u32,
    /// Closed windows over the latency target in a row.
    over_target_windows: u32,
    current: WindowCounts,
    /// The last closed windows' counts (a ring of `escalate_windows`).
    span: [WindowCounts; MAX_ESCALATE_WINDOWS as usize],
    span_next: usize,
}

impl Shedder {
    pub fn new(config: ShedderConfig, now_ns: u64) -> Self {
        let config = config.sanitized();
        let lower = AdaptiveConfig {
            tolerance: config.lower_tolerance,
            ..config.adaptive
        };
        Shedder {
            whole: AdaptiveLimit::new(config.adaptive, now_ns),
            lower: AdaptiveLimit::new(lower, now_ns),
            config,
            in_flight: [0; CLASSES],
            level: 0,
            fleet_level: 0,
            calm_windows: 0,
            over_target_windows: 0,
            current: WindowCounts::default(),
            span: [WindowCounts::default(); MAX_ESCALATE_WINDOWS as usize],
            span_next: 0,
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
        self.current.reached[class.rank()] += 1;
        let room = if class == Priority::Critical {
            // Counted alone: the lower classes never take the top class's room.
            self.in_flight[class.rank()] < self.whole.limit()
        } else {
            self.in_flight() < self.lower_limit()
        };
        if !room {
            self.current.refused[class.rank()] += 1;
            return Admission::Shed {
                reason: ShedReason::Limit,
                retry_after_ns: self.whole.config().window_ns,
            };
        }
        self.in_flight[class.rank()] += 1;
        Admission::Admitted {
            in_flight: self.in_flight(),
        }
    }

    /// Counts a request of `class` in flight without asking: for a shedder that only watches
    /// (a baseline beside shedding); the limits and level are learnt all the same. Returns the
    /// in-flight count with it, for [`Shedder::complete`].
    pub fn admit_unchecked(&mut self, now_ns: u64, class: Priority) -> u64 {
        self.tick(now_ns);
        self.in_flight[class.rank()] += 1;
        self.in_flight()
    }

    /// An admitted request of `class` was answered after `latency_ns`; `in_flight` is what
    /// its [`Admission::Admitted`] said.
    pub fn complete(&mut self, now_ns: u64, class: Priority, latency_ns: u64, in_flight: u64) {
        self.abandon(class);
        let closed = self.whole.record(now_ns, latency_ns, in_flight);
        self.lower.record(now_ns, latency_ns, in_flight);
        if closed {
            self.window_closed();
        }
    }

    /// An admitted request of `class` was dropped before its answer: its place is free, its
    /// latency says nothing.
    pub fn abandon(&mut self, class: Priority) {
        let n = &mut self.in_flight[class.rank()];
        *n = n.saturating_sub(1);
    }

    /// Closes windows that `now_ns` has passed.
    pub fn tick(&mut self, now_ns: u64) {
        let closed = self.whole.tick(now_ns);
        self.lower.tick(now_ns);
        if closed {
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

    /// Requests in flight, every class together.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.iter().sum()
    }

    /// The whole adaptive limit (the top class's), as a whole number of requests.
    pub fn limit(&self) -> u64 {
        self.whole.limit()
    }

    /// The limit every lower class is held to (never above the whole limit).
    pub fn lower_limit(&self) -> u64 {
        self.lower.limit().min(self.whole.limit())
    }

    pub fn adaptive(&self) -> &AdaptiveLimit {
        &self.whole
    }

    /// How long a class shed by the level should wait: until the level can come down.
    fn restore_after_ns(&self) -> u64 {
        self.whole
            .config()
            .window_ns
            .saturating_mul(u64::from(self.config.restore_windows.max(1)))
    }

    /// Whether the last `escalate_windows` windows say the upstream is overloaded for the
    /// classes admitted now.
    fn overloaded(&self) -> bool {
        if self.over_target_windows >= self.config.escalate_windows {
            return true;
        }
        // The class just above the lowest one admitted: is it losing requests?
        let above = usize::from(self.level) + 1;
        if above >= CLASSES {
            return false;
        }
        let windows = self.config.escalate_windows as usize;
        let (mut reached, mut refused) = (0u64, 0u64);
        for w in 0..windows {
            let i = (self.span_next + MAX_ESCALATE_WINDOWS as usize - 1 - w)
                % MAX_ESCALATE_WINDOWS as usize;
            if self.span[i].reached[above] == 0 {
                // Not there throughout the span: no sustained loss.
                return false;
            }
            reached = reached.saturating_add(self.span[i].reached[above]);
            refused = refused.saturating_add(self.span[i].refused[above]);
        }
        reached >= MIN_SAMPLES
            && u128::from(refused) * 10_000
                >= u128::from(reached) * u128::from(self.config.escalate_refused_bp)
    }

    fn window_closed(&mut self) {
        self.span[self.span_next] = std::mem::take(&mut self.current);
        self.span_next = (self.span_next + 1) % MAX_ESCALATE_WINDOWS as usize;
        if self.whole.last_over_target() {
            self.over_target_windows = self.over_target_windows.saturating_add(1);
        } else {
            self.over_target_windows = 0;
        }
        if self.overloaded() {
            if self.level < MAX_LEVEL {
                self.level += 1;
                // The next class is judged on windows of its own.
                self.span = [WindowCounts::default(); MAX_ESCALATE_WINDOWS as usize];
                self.over_target_windows = 0;
            }
            self.calm_windows = 0;
            return;
        }
        self.calm_windows += 1;
        if self.calm_windows >= self.config.restore_windows && self.level > 0 {
            self.level -= 1;
            self.calm_windows = 0;
            // The class let back in starts from one place past what is in use and earns more
            // only as the latency allows: it cannot fill the upstream's queue at once.
            self.lower.cap(self.in_flight() + 1);
            self.span = [WindowCounts::default(); MAX_ESCALATE_WINDOWS as usize];
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

    fn admitted(a: Admission) -> bool {
        matches!(a, Admission::Admitted { .. })
    }

    /// The lower classes share the lower limit (initially 8) counted with everything in
    /// flight; critical counts only itself against the whole limit (8), so the lower classes
    /// never take its room.
    #[test]
    fn lower_classes_never_take_criticals_room() {
        let mut s = shedder();
        for _ in 0..5 {
            assert!(admitted(s.admit(0, Sheddable)));
        }
        for _ in 0..3 {
            assert!(admitted(s.admit(0, Default)));
        }
        assert!(matches!(
            s.admit(0, Sheddable),
            Admission::Shed {
                reason: ShedReason::Limit,
                ..
            }
        ));
        assert!(!admitted(s.admit(0, Default)));
        for _ in 0..8 {
            assert!(admitted(s.admit(0, Critical)));
        }
        assert!(!admitted(s.admit(0, Critical)));
        assert_eq!(s.in_flight(), 16);
        s.abandon(Critical);
        assert!(matches!(
            s.admit(0, Critical),
            Admission::Admitted { in_flight: 16 }
        ));
        // A lower class's place given back is not critical's to take, nor the reverse.
        s.abandon(Sheddable);
        assert!(!admitted(s.admit(0, Default)), "16 in flight, over 8");
    }

    /// Drives `windows` windows of 100 ms in which every class sends `per_window` requests
    /// and none is answered, so each finds no room once the places are taken.
    fn crowd(s: &mut Shedder, now: &mut u64, windows: u32, classes: &[Priority]) {
        for _ in 0..windows {
            for _ in 0..20 {
                for &class in classes {
                    let _ = s.admit(*now, class);
                }
            }
            *now += 100 * MS;
            s.tick(*now);
        }
    }

    /// A class is shed outright only when the class above it keeps losing requests over the
    /// escalation span (5 windows), not at the first window without a free place; then one
    /// class at a time, and critical never.
    #[test]
    fn the_level_rises_only_on_sustained_overload_class_by_class() {
        let mut s = shedder();
        let mut now = 0;
        // Sheddable alone past the limit: nobody above it suffers, nothing is shed outright.
        crowd(&mut s, &mut now, 20, &[Sheddable]);
        assert_eq!(s.local_level(), 0);
        // Default crowded out as well: after the span, sheddable goes, not before.
        crowd(&mut s, &mut now, 4, &[Sheddable, Default]);
        assert_eq!(s.local_level(), 0, "four windows are not sustained");
        crowd(&mut s, &mut now, 1, &[Sheddable, Default]);
        assert_eq!(s.local_level(), 1);
        assert!(matches!(
            s.admit(now, Sheddable),
            Admission::Shed {
                reason: ShedReason::Level,
                retry_after_ns
            } if retry_after_ns == 3_000 * MS
        ));
        // Default refused but critical has its own room: default is not shed outright.
        crowd(&mut s, &mut now, 20, &[Default]);
        assert_eq!(s.local_level(), 1);
    }

    /// Calm windows bring the level down one class after `restore_windows` (30).
    #[test]
    fn the_level_restores_slowly() {
        let mut s = shedder();
        let mut now = 0;
        crowd(&mut s, &mut now, 5, &[Sheddable, Default]);
        assert_eq!(s.local_level(), 1);
        for class in Priority::ALL {
            while s.in_flight[class.rank()] > 0 {
                s.abandon(class);
            }
        }
        let mut calm = 0;
        while s.local_level() == 1 {
            if let Admission::Admitted { in_flight } = s.admit(now, Critical) {
                s.complete(now, Critical, 20 * MS, in_flight);
            }
            now += 100 * MS;
            s.tick(now);
            calm += 1;
        }
        assert_eq!(calm, 30);
        assert_eq!(s.local_level(), 0);
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

    /// Nonsense settings are made consistent.
    #[test]
    fn settings_are_sanitized() {
        let config = ShedderConfig {
            lower_tolerance: 9.0,
            escalate_windows: 0,
            escalate_refused_bp: 50_000,
            ..ShedderConfig::default()
        }
        .sanitized();
        assert_eq!(config.lower_tolerance, config.adaptive.tolerance);
        assert_eq!(config.escalate_windows, 1);
        assert_eq!(config.escalate_refused_bp, 10_000);
        let config = ShedderConfig {
            lower_tolerance: f64::NAN,
            escalate_windows: 1_000,
            ..ShedderConfig::default()
        }
        .sanitized();
        assert_eq!(config.lower_tolerance, 1.1);
        assert_eq!(config.escalate_windows, MAX_ESCALATE_WINDOWS);
    }
}
