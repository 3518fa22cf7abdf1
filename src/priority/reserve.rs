//! Reservations: shares of a capacity kept for higher classes. `critical: 20%` keeps the top
//! fifth of a limit for critical requests; `default: 10%` below it for default and critical.
//!
//! A class's allowance is the capacity minus what is kept for the classes above it, with the
//! kept part rounded up (a reservation never rounds to nothing) and the allowance at least 1
//! (no class is locked out by rounding). Whoever counts usage compares it with the allowance
//! of the request's class: a lower class is refused once usage reaches its allowance, the
//! highest may use everything. Applied on a node's bucket or lease set, which has one owner,
//! the refusal is exact across gateways.

use super::class::Priority;

/// Basis points in a whole.
const WHOLE_BP: u32 = 10_000;

/// What is wrong with a reservation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReservationError {
    #[error("nothing can be kept for `sheddable`, the lowest class: no class is below it")]
    Lowest,
    #[error("the shares kept add up to {}%; they must leave some of the limit to the lowest class (under 100%)", *.0 as f64 / 100.0)]
    TooMuch(u32),
    #[error("`{0}` is not a share: write a percentage such as `20%`")]
    NotAShare(String),
}

/// Shares kept for each class (basis points of the capacity); the lowest class keeps none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Reservation {
    kept_bp: [u32; 3],
}

impl Reservation {
    /// Nothing kept: every class may use the whole capacity.
    pub const NONE: Reservation = Reservation { kept_bp: [0; 3] };

    /// A reservation keeping `kept` (class, basis points) shares; validated.
    pub fn new(kept: &[(Priority, u32)]) -> Result<Self, ReservationError> {
        let mut kept_bp = [0u32; 3];
        for &(class, bp) in kept {
            if class == Priority::Sheddable && bp > 0 {
                return Err(ReservationError::Lowest);
            }
            kept_bp[class.rank()] = kept_bp[class.rank()].saturating_add(bp);
        }
        let total: u32 = kept_bp.iter().fold(0u32, |a, b| a.saturating_add(*b));
        if total >= WHOLE_BP {
            return Err(ReservationError::TooMuch(total));
        }
        Ok(Reservation { kept_bp })
    }

    /// True when nothing is kept for anyone.
    pub fn is_none(&self) -> bool {
        self.kept_bp == [0; 3]
    }

    /// The share kept for `class` (basis points).
    pub fn kept_bp(&self, class: Priority) -> u32 {
        self.kept_bp[class.rank()]
    }

    /// How much of `capacity` a request of `class` may see used before it is refused: the
    /// capacity less the shares kept for every higher class (rounded up), at least 1.
    pub fn allowance(&self, capacity: u64, class: Priority) -> u64 {
        let above: u32 = self.kept_bp[class.rank() + 1..].iter().sum();
        let kept = (u128::from(capacity) * u128::from(above)).div_ceil(u128::from(WHOLE_BP));
        // kept <= capacity as above < WHOLE_BP.
        capacity.saturating_sub(kept as u64).max(1)
    }

    /// Whether a request of `class` may take `cost` more when `in_use` of `capacity` is used.
    pub fn admits(&self, capacity: u64, class: Priority, in_use: u64, cost: u64) -> bool {
        in_use.saturating_add(cost) <= self.allowance(capacity, class)
    }
}

/// A share written `20%` or `12.5%`, in basis points (at most two decimals).
pub fn parse_share_bp(text: &str) -> Result<u32, ReservationError> {
    let bad = || ReservationError::NotAShare(text.to_owned());
    let number = text.trim().strip_suffix('%').ok_or_else(bad)?.trim();
    let bp = crate::limit::parse_decimal_scaled(number, 100).ok_or_else(bad)?;
    u32::try_from(bp)
        .ok()
        .filter(|&bp| bp <= WHOLE_BP)
        .ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Priority::*;

    fn reservation(kept: &[(Priority, u32)]) -> Reservation {
        Reservation::new(kept).unwrap()
    }

    /// "Critical keeps 20% of backend X's in-flight capacity": of 10 places, default and
    /// sheddable may fill 8, critical all 10.
    #[test]
    fn a_share_kept_for_critical_stops_the_lower_classes_at_the_rest() {
        let r = reservation(&[(Critical, 2_000)]);
        assert_eq!(r.allowance(10, Sheddable), 8);
        assert_eq!(r.allowance(10, Default), 8);
        assert_eq!(r.allowance(10, Critical), 10);
        assert!(r.admits(10, Default, 7, 1));
        assert!(!r.admits(10, Default, 8, 1));
        assert!(r.admits(10, Critical, 9, 1));
        assert!(!r.admits(10, Critical, 10, 1));
    }

    /// Shares stack: what default keeps is open to critical as well, never to sheddable.
    #[test]
    fn shares_stack_from_the_top_class_down() {
        let r = reservation(&[(Critical, 2_000), (Default, 3_000)]);
        assert_eq!(r.allowance(100, Sheddable), 50);
        assert_eq!(r.allowance(100, Default), 80);
        assert_eq!(r.allowance(100, Critical), 100);
    }

    /// The kept part rounds up (a share never rounds to nothing), the allowance never to zero.
    #[test]
    fn rounding_keeps_at_least_one_place_and_leaves_at_least_one() {
        let r = reservation(&[(Critical, 2_000)]);
        assert_eq!(r.allowance(4, Default), 3);
        assert_eq!(r.allowance(1, Default), 1);
        assert_eq!(
            r.allowance(u64::MAX, Default),
            u64::MAX - u64::MAX.div_ceil(5)
        );
        assert_eq!(Reservation::NONE.allowance(7, Sheddable), 7);
    }

    /// Shares are validated: none for the lowest class, less than the whole in total.
    #[test]
    fn shares_are_validated() {
        assert_eq!(
            Reservation::new(&[(Sheddable, 100)]),
            Err(ReservationError::Lowest)
        );
        assert!(matches!(
            Reservation::new(&[(Critical, 6_000), (Default, 4_000)]),
            Err(ReservationError::TooMuch(_))
        ));
        assert_eq!(parse_share_bp("20%"), Ok(2_000));
        assert_eq!(parse_share_bp(" 12.5 %"), Ok(1_250));
        assert!(parse_share_bp("20").is_err());
        assert!(parse_share_bp("101%").is_err());
        assert!(parse_share_bp("-1%").is_err());
    }
}
