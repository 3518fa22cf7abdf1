//! A `home` check whose home region cannot be reached and whose rule fails open is decided in
//! the local region with the local region's share of the limit, so all regions together stay
//! near the limit while the home region is away.

use crate::{Algorithm, Limit};

/// `limit` divided among `regions` regions: rate and burst (a window's limit) over `regions`,
/// each at least 1. The limit itself if the share cannot be built (it always can for limits
/// `Limit::new` accepted; the fallback keeps this total).
pub fn home_fallback_limit(limit: &Limit, regions: usize) -> Limit {
    let regions = regions.max(1) as u64;
    let rate = (limit.rate() / regions).max(1);
    let burst = match limit.algorithm() {
        Algorithm::Gcra => (limit.burst() / regions).max(1),
        _ => rate,
    };
    Limit::new(limit.algorithm(), rate, limit.period_ns(), burst).unwrap_or(*limit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NANOS_PER_SEC as S;

    #[test]
    fn each_region_gets_its_share_and_never_nothing() {
        let gcra = Limit::gcra(100, S, 30).unwrap();
        assert_eq!(
            home_fallback_limit(&gcra, 3),
            Limit::gcra(33, S, 10).unwrap()
        );
        let window = Limit::window(Algorithm::SlidingLog, 10, S).unwrap();
        assert_eq!(
            home_fallback_limit(&window, 4),
            Limit::window(Algorithm::SlidingLog, 2, S).unwrap()
        );
        let tiny = Limit::gcra(1, S, 1).unwrap();
        assert_eq!(home_fallback_limit(&tiny, 5), tiny);
        assert_eq!(home_fallback_limit(&gcra, 0), gcra);
    }
}
