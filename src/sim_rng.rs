//! `SplitMix64`: the tiny deterministic PRNG of the seeded simulations (ownership, regions): same
//! seed, same run, on any build.

/// Steele, Lea and Flood's SplitMix64: 64 bits of state, good enough statistics for picking
/// delays and losses, and trivially reproducible from a printed seed.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `low..=high` (`low` when `high < low`).
    pub fn range(&mut self, low: u64, high: u64) -> u64 {
        if high <= low {
            return low;
        }
        let span = high - low + 1;
        // Multiply-shift: unbiased enough for a simulation, and no loop.
        low + ((u128::from(self.next_u64()) * u128::from(span)) >> 64) as u64
    }

    /// True with probability `per_million / 1_000_000`.
    pub fn chance(&mut self, per_million: u64) -> bool {
        self.range(0, 999_999) < per_million
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference sequence for seed 1234567 (from the published C implementation), so a
    /// printed seed replays the same run on any build.
    #[test]
    fn matches_the_reference_sequence() {
        let mut rng = SplitMix64::new(1_234_567);
        assert_eq!(rng.next_u64(), 6_457_827_717_110_365_317);
        assert_eq!(rng.next_u64(), 3_203_168_211_198_807_973);
    }

    #[test]
    fn ranges_stay_in_bounds() {
        let mut rng = SplitMix64::new(9);
        for _ in 0..10_000 {
            let v = rng.range(20, 150);
            assert!((20..=150).contains(&v));
        }
        assert_eq!(rng.range(5, 5), 5);
        assert_eq!(rng.range(6, 5), 6);
    }
}
