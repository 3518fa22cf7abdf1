//! Priorities and load shedding: request classes, the shares of a limit kept for higher
//! classes, the adaptive limit a gateway keeps for its upstream, the shedder that sheds the
//! lowest class first, and the fleet's brownout level. Pure: every function takes `now_ns`.
//!
//! - [`class`]: [`Priority`], the ordered classes (`sheddable` < `default` < `critical`).
//! - [`reserve`]: [`Reservation`], shares of a capacity kept for higher classes, and the
//!   allowance each class gets (used by rules on the nodes' buckets and lease sets, and by the
//!   shedder on its adaptive limit).
//! - [`adaptive`]: [`AdaptiveLimit`], requests in flight the upstream takes before its latency
//!   passes a target (gradient of target and measured latency, per window).
//! - [`shedder`]: [`Shedder`], admission per class against the adaptive limit, and the level:
//!   how many of the lowest classes are shed outright, raised a class at a time, lowered slowly.
//! - [`brownout`]: the fleet's level from what every gateway reports, and the keys it lives in.

pub mod adaptive;
pub mod brownout;
pub mod class;
pub mod reserve;
pub mod shedder;
#[cfg(test)]
pub(crate) mod upstream_sim;

pub use adaptive::{AdaptiveConfig, AdaptiveLimit};
pub use brownout::{BrownoutReading, MAX_LEVEL, fleet_level};
pub use class::Priority;
pub use reserve::{Reservation, ReservationError};
pub use shedder::{Admission, Shedder, ShedderConfig};
