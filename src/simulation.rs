//! What the seeded simulations (ownership, regions) share: [`SplitMix64`], their generator (same
//! seed, same run, on any build), and [`TraceDigest`], a fingerprint of every event a run saw, so
//! two runs of one seed can be compared in one number.

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

/// FNV-1a over every event line of a run, in order: equal digests mean (with overwhelming
/// likelihood) the same events in the same order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceDigest(u64);

impl Default for TraceDigest {
    fn default() -> Self {
        TraceDigest(0xcbf2_9ce4_8422_2325)
    }
}

impl TraceDigest {
    pub fn add(&mut self, line: &str) {
        for byte in line.bytes().chain(std::iter::once(b'\n')) {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    pub fn value(self) -> u64 {
        self.0
    }
}

/// The seeds a simulation test runs: `FLOODGATE_SIM_SEED=S` replays that one seed,
/// `FLOODGATE_SIM_SEEDS=N` runs seeds `0..N`, and otherwise `0..default`.
pub fn seeds_from_env(default: u64) -> Vec<u64> {
    let read = |name: &str| std::env::var(name).ok().and_then(|s| s.parse::<u64>().ok());
    if let Some(seed) = read("FLOODGATE_SIM_SEED") {
        return vec![seed];
    }
    (0..read("FLOODGATE_SIM_SEEDS").unwrap_or(default)).collect()
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
    fn a_digest_tells_order_and_content_apart() {
        let digest = |lines: &[&str]| {
            let mut d = TraceDigest::default();
            lines.iter().for_each(|l| d.add(l));
            d.value()
        };
        assert_eq!(digest(&["a", "b"]), digest(&["a", "b"]));
        assert_ne!(digest(&["a", "b"]), digest(&["b", "a"]));
        assert_ne!(digest(&["ab"]), digest(&["a", "b"]));
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
